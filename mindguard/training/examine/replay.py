"""Replay one captured training step eagerly and name the operator that first turned finite values into Inf/NaN.

:func:`replay` loads a capture (:mod:`mindguard.training.examine.capture`) into the user's network, runs that step's forward
and backward in PyNative mode while :class:`mindguard.training.examine.api_hooks.OpTape` records every operator call (the
primitive, its inputs and outputs, the Python stack, the cell it sits in, and the gradient reaching every
tensor), and returns a :class:`ReplayReport` whose ``first`` is a :class:`~mindguard.report.model.Finding`
like the dump analysis's: the first operator whose inputs were finite and whose output (forward) or own input
gradient (backward, ``op_type`` ``<Primitive>Grad``) was not, the source line of the op, statistics and the
hint of :func:`mindguard.analysis.hints.hint_for`. Inf/NaN already in the captured batch or parameters is
named as the origin (``direction`` ``"input"``) instead: no operator is blamed for values it was given.
Given the optimizer it also applies the update and lists the parameters it made non-finite.

Route (measured on CPU, MindSpore 2.10, the norm demo and a 47-weight ResNet capture): MindSpore's PyNative
executor has no per-operator hook, and dumping the step compiled in GRAPH mode needs the network rebuilt in a
new process (the dump config is read once per process) and a network that compiles -- neither holds for an
in-process replay of a PyNative training. Hooks at the API level (``Primitive.__call__`` of every primitive
class, the functional overloads, ``Tensor`` math methods; ``MS_JIT=0`` so ``@ms.jit`` sub-cells run eagerly
and are recorded too) run in the training process, on any network, and give the primitive and its line; the
backward is read from ``Tensor.register_hook`` gradients and, where a tensor feeds several ops, re-derived
per op with ``mindspore.vjp``. Cost: see ``tests/test_replay_ops.py::test_replay_cost_is_a_few_plain_steps``.

Everything it changes (mode, patched entry points, hooks, ``MS_JIT``, values) is restored afterwards.
Parameters are loaded and restored *in place* (``Parameter.asnumpy()`` views are not used: ``ops.assign``),
because a compiled optimizer keeps the tensors it was compiled with and ignores ``set_data`` replacements.

Index bases: ``iteration`` is ``global step - 1`` of the captured step (1-based, process-wide global step);
``Finding.index`` is the op's 0-based position among the step's recorded forward calls.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import mindspore as ms
from mindspore import nn

from .api_hooks import OpRecord, OpTape, all_tensors, source_of_construct
from ..params import ROLE_NETWORK, ROLE_OPTIMIZER, unique_parameters
from ...report.model import Finding
from ...analysis.hints import nonfinite_input_hint
from ...analysis.evidence import DELIBERATE_INF_TYPES, additive_mask
from ...report.render import render_replay
from ...analysis.stats import is_nonfinite, tensor_stats
from .capture import Capture, _check_names, load_capture
from ...errors import ArgumentTypeError, ReplayError

PathLike = Union[str, "os.PathLike[str]"]
logger = logging.getLogger("mindguard")
REPORT_SCHEMA = 1
__all__ = ["replay", "ReplayReport"]


@dataclass
class ReplayReport:
    """What :func:`replay` found. ``first`` is ``None`` when every value of the step stayed finite.

    ``first``: the origin as a :class:`~mindguard.report.model.Finding` (a dict is converted).
    ``nonfinite_inputs``: batch inputs (``"inputs<i>"``, 0-based) and parameters already non-finite at the start
    of the step, like the dump analysis's (``name``, ``source`` = ``"batch"`` | ``"parameter"``, statistics).
    ``parameters_nonfinite_after_update``: the parameters (network and optimizer state) the update made non-finite.
    """

    iteration: Optional[int]
    first: Optional[Finding] = None
    parameters_nonfinite_after_update: List[str] = field(default_factory=list)
    loss: Optional[float] = None
    capture: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    nonfinite_inputs: List[Dict[str, Any]] = field(default_factory=list)
    ops_recorded: int = 0
    data_flow: Optional[Dict[str, Any]] = None   # the recorded ops around ``first`` (schema: analysis/flow.py)
    error: Optional[str] = None   # mindguard's own failure while recording or analysing: the report is not an answer

    def __post_init__(self) -> None:
        if isinstance(self.first, dict):
            self.first = Finding.from_dict(self.first)

    def to_dict(self) -> Dict[str, Any]:
        """Schema 1 (design "Report schemas"): ``first`` is the Finding's dict; plus ``loss``, ``capture``,
        ``warnings`` and the additive ``nonfinite_inputs``, ``ops_recorded`` and ``data_flow`` (when drawn)."""
        return {"schema": REPORT_SCHEMA, "iteration": self.iteration,
                "first": self.first.to_dict() if self.first is not None else None,
                "parameters_nonfinite_after_update": list(self.parameters_nonfinite_after_update),
                "loss": self.loss, "capture": self.capture, "warnings": list(self.warnings),
                "nonfinite_inputs": list(self.nonfinite_inputs), "ops_recorded": self.ops_recorded,
                **({"data_flow": self.data_flow} if self.data_flow is not None else {}),
                **({"error": self.error} if self.error else {})}

    @property
    def healthy(self) -> bool:
        """True when nothing in the replayed step (loss, ops, gradients, update) was non-finite."""
        loss_finite = self.loss is None or bool(np.isfinite(self.loss))
        return self.first is None and not self.parameters_nonfinite_after_update and loss_finite

    def __str__(self) -> str:
        return render_replay(self)


def replay(network_with_loss: nn.Cell, capture: Union[PathLike, Capture], *,
           optimizer: Optional[nn.Optimizer] = None, keep_loaded: bool = False) -> ReplayReport:
    """Re-run one captured training step eagerly and name the operator that first produced Inf/NaN.

    Loads the capture's parameters into ``network_with_loss`` (strict: every parameter of the network
    must be in the capture with the same shape, and vice versa, or :class:`CaptureMismatchError` names
    the mismatching ones), switches to PyNative mode, and runs the step's forward and backward while every
    operator call is recorded (:class:`mindguard.training.examine.api_hooks.OpTape`). The answer, in this order:

    1. Inf/NaN in the captured batch or parameters: the origin is that input (``direction="input"``);
    2. the first operator, in execution order, with finite inputs and a non-finite output (``"forward"``);
    3. the operator whose backward turned finite output gradients into a non-finite gradient of one of its
       inputs or parameters (``"backward"``; the one nearest the loss when several do).

    With ``optimizer`` (built over ``network_with_loss``'s parameters, same type as in training) the
    captured optimizer state is loaded too, the update is applied, and the parameters it made non-finite
    are listed in ``parameters_nonfinite_after_update``.

    Everything replay changes is restored on exit, even on error: the execution mode, ``MS_JIT``, the
    cells' training flags, the patched operator entry points and gradient hooks, and -- unless
    ``keep_loaded=True`` -- the parameter (and optimizer state) values the network had before. The input
    batch is replayed as captured; a ``Dropout`` draws a new mask (a warning says so).
    """
    if not isinstance(network_with_loss, nn.Cell):
        raise ArgumentTypeError(f"replay(network_with_loss=...) needs a mindspore.nn.Cell, got "
                                f"{type(network_with_loss).__name__}")
    cap = capture if isinstance(capture, Capture) else load_capture(capture)
    net_params = unique_parameters(network_with_loss)
    _check_names("network", {p.name: list(p.shape) for p in net_params}, cap.names(ROLE_NETWORK), cap.directory)
    opt_state: List[ms.Parameter] = []
    warnings: List[str] = []
    if optimizer is not None:
        trained = {id(p) for p in optimizer.parameters}
        opt_state = [p for p in unique_parameters(optimizer) if id(p) not in trained]
        captured_state = cap.names(ROLE_OPTIMIZER)
        if captured_state:
            _check_names(f"optimizer {type(optimizer).__name__}", {p.name: list(p.shape) for p in opt_state},
                         captured_state, cap.directory)
        else:
            warnings.append("the capture holds no optimizer state; the update used the optimizer's current state")
            opt_state = []
    warnings.extend(_dropout_warnings(network_with_loss))

    to_load = net_params + opt_state
    saved = {} if keep_loaded else {id(p): p.asnumpy().copy() for p in to_load}
    with _pynative(), _training(network_with_loss), _restored(to_load, saved):
        for p in to_load:
            _assign(p, cap.values[p.name])
        nonfinite = _nonfinite_at_start(cap, net_params)
        nonfinite, masks = _without_masks(nonfinite)
        nonfinite_before = [item["name"] for item in nonfinite if item["source"] == "parameter"]
        weights = list(optimizer.parameters) if optimizer is not None else network_with_loss.trainable_params()
        inputs = [ms.Tensor(x) for x in cap.inputs]
        taped: List[OpTape] = []
        try:
            try:
                tape, loss, grads = _recorded_step(network_with_loss, weights, inputs, eager_jit=True, taped=taped)
            except Exception:  # noqa: BLE001
                if not taped or taped[0].raised is not None:
                    raise
                # no recorded op raised: the training step raised inside a gradient just before (a step that raised,
                # replayed from Guard's exit) and left PyNative's grad state behind ("Can not find top cell for
                # backward", measured on 2.10); MindSpore clears it itself after a failed compile. Once more, clean
                from mindspore.common.api import _pynative_executor

                _pynative_executor.clear_res()
                for p in to_load:
                    _assign(p, cap.values[p.name])
                taped.clear()
                tape, loss, grads = _recorded_step(network_with_loss, weights, inputs, eager_jit=True, taped=taped)
        except Exception as exc:  # noqa: BLE001 - retried compiled; a failure there propagates unchanged
            if taped and taped[0].raised is not None:   # the step raised in a recorded op: that op is the answer
                return ReplayReport(iteration=cap.meta.get("iteration"), first=stop_finding(*taped[0].raised),
                                    capture=str(cap.directory), warnings=warnings,
                                    ops_recorded=len(taped[0].records))
            if not _jit_cells(network_with_loss):
                raise
            warnings.append(f"the step raised with its @ms.jit cells {_jit_cells(network_with_loss)[:5]} run eagerly "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); replayed them compiled, so "
                            f"the operators inside them are not seen")
            for p in to_load:
                _assign(p, cap.values[p.name])
            tape, loss, grads = _recorded_step(network_with_loss, weights, inputs, eager_jit=False)
        values = {id(p): ms.Tensor(cap.values[p.name], dtype=p.dtype) for p in net_params}
        if tape.error is not None:
            raise ReplayError(f"mindguard could not record the replayed step (its own failure, not the training's): "
                              f"{tape.error}")
        first = input_finding(nonfinite) if nonfinite else culprit(tape, weights, grads, values, masks=masks)
        after: List[str] = []
        if optimizer is not None:
            optimizer(tuple(grads))
            after = [p.name for p in to_load if not _finite(p.asnumpy()) and p.name not in nonfinite_before]
        loss_value = float(np.asarray(loss.asnumpy()).reshape(-1)[0])
        flow = tape_flow(tape, first, inputs)
    return ReplayReport(iteration=cap.meta.get("iteration"), first=first, parameters_nonfinite_after_update=after,
                        loss=loss_value, capture=str(cap.directory), warnings=warnings, nonfinite_inputs=nonfinite,
                        ops_recorded=len(tape.records), data_flow=flow)


def stop_finding(record: OpRecord, exc: BaseException) -> Finding:
    """The recorded op a step raised in, as the answer: its inputs as it got them, the exception, the stop hint
    (an index out of range names the table and the index). ``extra["stopped"]`` marks it."""
    from ...analysis.hints import stop_hint

    inputs = []
    for slot, tensor in all_tensors(record.args, record.kwargs):
        try:
            stats = record.input_stats.get(slot) or _stats(tensor.asnumpy())
        except Exception:  # noqa: BLE001 - an input that cannot be read any more: its dtype and shape
            stats = {"shape": list(tensor.shape), "dtype": str(tensor.dtype).lower(), "unreadable": True}
        extra = {"parameter": tensor.name} if isinstance(tensor, ms.Parameter) else {}
        inputs.append(dict(stats, slot=slot, role="input", **extra))
    source = record.source
    message = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
    scope = record.cell or "<root>"
    hint = stop_hint(record.op_type, inputs, direction="forward", source_code=(source or {}).get("code"),
                     message=message)
    return Finding(op_type=record.op_type, name=f"{scope}/{record.op_type}-op{record.index}", direction="forward",
                   source=source, stack=list(record.stack), inputs=inputs, outputs=[], index=record.index, hint=hint,
                   cell=record.cell, cell_type=record.cell_type,
                   extra={"api": record.api, "call": record.cell_call, "stopped": True, "exception": message})


def _recorded_step(network: nn.Cell, weights, inputs, *, eager_jit: bool, taped: Optional[List[OpTape]] = None):
    """Forward and backward of the step under an :class:`OpTape`: ``(tape, loss, parameter gradients)``. ``taped``
    gets the tape first, so a caller still has it when the step raises."""
    with OpTape(network, display=lambda n: _display_name(network, n), eager_jit=eager_jit) as tape:
        if taped is not None:
            taped.append(tape)
        loss, grads = ms.value_and_grad(_first_output(network), None, weights)(*inputs)
    return tape, loss, grads


def _jit_cells(network: nn.Cell) -> List[str]:
    """Dotted names of the cells whose ``construct`` is ``@ms.jit``-compiled."""
    return [name or "<root>" for name, cell in network.cells_and_names()
            if getattr(type(cell).construct, "__wrapped_by_jit__", False)]


# ------------------------------------------------------------------------------------------- the answer


def _nonfinite_at_start(cap: Capture, net_params: Sequence[ms.Parameter]) -> List[Dict[str, Any]]:
    """The captured batch inputs (``inputs<i>``, 0-based, as the dump names them) and network parameters that
    already hold Inf/NaN before the step runs."""
    out = []
    for i, array in enumerate(cap.inputs):
        if not _finite(array):
            out.append(dict(_stats(array), name=f"inputs{i}", source="batch"))
    for p in net_params:
        array = cap.values[p.name]
        if not _finite(array):
            out.append(dict(_stats(array), name=p.name, source="parameter"))
    return out


def input_finding(nonfinite: List[Dict[str, Any]]) -> Finding:
    """The origin when Inf/NaN is in the step's inputs: no operator made it (``direction="input"``)."""
    batch = [item for item in nonfinite if item["source"] == "batch"]
    params = [item for item in nonfinite if item["source"] == "parameter"]
    stats = [dict({k: v for k, v in item.items() if k not in ("name", "source")}, slot=i, role=item["name"])
             for i, item in enumerate(nonfinite)]
    if batch:
        names = ", ".join(item["name"] for item in batch)
        hint = (f"the step's batch already holds Inf/NaN ({names}): no operator produced it. Fix the data: check "
                f"the samples of this step and the preprocessing (a division by a zero std, a log of 0, a corrupt "
                f"file); `mindspore.dataset` maps can drop or repair such samples.")
    else:
        names = ", ".join(item["name"] for item in params[:10])
        specific = [nonfinite_input_hint(item["name"], "parameter") for item in params]
        hint = specific[0] if specific and all(specific) else (
            f"parameters are already non-finite before this step ({names}): an earlier step's update made them "
            f"so. Examine that earlier step (the first step whose parameters went non-finite: "
            f"mindguard.Guard(check_params=True) records it).")
    return Finding(op_type=None, name=nonfinite[0]["name"], direction="input", inputs=stats, outputs=[], hint=hint,
                   extra={"nonfinite_inputs": [item["name"] for item in nonfinite]})


def culprit(tape: OpTape, weights: Sequence[ms.Parameter], grads: Sequence[Any],
            values: Dict[int, Any], *, masks: bool = False) -> Optional[Finding]:
    """The first recorded op that made Inf/NaN from finite values: forward (execution order) first, then
    backward (the op nearest the loss whose own input gradient went non-finite from finite output gradients).
    ``weights``/``grads``: the differentiated parameters and their gradients; ``values``: ``id(parameter)`` ->
    its value at the start of the step (the VJP re-runs an op on these).

    Intended infinities -- ``masks`` (the batch holds an additive 0/-inf mask), or an op that writes a constant
    (:data:`~mindguard.analysis.evidence.DELIBERATE_INF_TYPES`) making +-Inf and no NaN (``masked_fill(s, m,
    -inf)``) -- are not the failure: from then on the forward culprit is the first op that makes NaN from inputs
    holding no NaN (``-inf - -inf`` in a fully masked softmax row)."""
    deliberate = masks
    for record in tape.records:
        if record.inputs_finite and not record.outputs_finite:
            if record.op_type.lower() in DELIBERATE_INF_TYPES and not _any_nan(record.outputs):
                deliberate = True
                continue
            return _op_finding(record, "forward", _in_stats(record), _out_stats(record, "output"))
        if deliberate and not record.outputs_finite and not _any_nan(record.inputs) and _any_nan(record.outputs):
            return _op_finding(record, "forward", _in_stats(record), _out_stats(record, "output"))
    param_grads = {id(p): g for p, g in zip(weights, grads)}
    consumers: Dict[int, int] = {}
    for record in tape.records:
        for _, tensor in record.inputs:
            consumers[id(tensor)] = consumers.get(id(tensor), 0) + 1
    for record in reversed(tape.records):
        if not (record.inputs_finite and record.outputs_finite):
            continue
        out_grads = [tape.grads.get(id(t)) for _, t in record.outputs]
        if all(g is None for g in out_grads) or any(g is not None and not g["finite"] for g in out_grads):
            continue
        in_grads = [_input_grad(tape, param_grads, t) for _, t in record.inputs]
        bad = [i for i, g in enumerate(in_grads) if g is not None and not _finite(g.asnumpy())]
        if not bad:
            continue
        shared = any(consumers.get(id(record.inputs[i][1]), 0) > 1 for i in bad)
        own = in_grads
        if shared:   # the total gradient of a shared tensor: re-derive this op's own part
            own = tape.vjp(record, [g["tensor"] if g else None for g in out_grads], values)
            if own is None or all(g is None or _finite(g.asnumpy()) for g in own):
                continue
        incoming = [dict(_stats(g["tensor"].asnumpy()), slot=i, role="grad_of_output")
                    for i, g in enumerate(out_grads) if g is not None]
        produced = [dict(_stats(g.asnumpy()), slot=record.inputs[i][0], role="grad_of_input",
                         **({"parameter": record.inputs[i][1].name}
                            if isinstance(record.inputs[i][1], ms.Parameter) else {}))
                    for i, g in enumerate(own) if g is not None and i < len(record.inputs)]
        return _op_finding(record, "backward", _in_stats(record) + incoming, produced)
    return None


def tape_flow(tape: OpTape, first: Optional[Finding], batch: Sequence[Any] = (), *, up: int = 4,
              down: int = 3) -> Optional[Dict[str, Any]]:
    """The recorded ops around ``first`` as :mod:`mindguard.analysis.flow` describes (same schema): its producers
    ``up`` levels up (by tensor identity on the tape; Parameters and batch inputs as leaves) and, for a forward
    culprit, the ops its non-finite outputs reached ``down`` levels on. A backward culprit is drawn at its forward
    op (the values it read); the backward pass is not on the tape, so nothing is drawn after it. For Inf/NaN in
    the step's inputs, around the first op that read it. ``None`` when nothing was recorded."""
    from ...analysis.flow import MAX_CONSUMERS, MAX_PRODUCERS, compact

    records = tape.records
    if first is None or not records:
        return None
    if first.get("direction") == "input":
        center = next((r for r in records if not r.inputs_finite), None)
        role, center_role = "first_nonfinite", "first_nonfinite"
    else:
        center = records[first.index] if isinstance(first.index, int) and 0 <= first.index < len(records) else None
        role, center_role = "culprit", "origin"
    if center is None:
        return None
    batch_names = {id(t): f"inputs{i}" for i, t in enumerate(batch)}
    produced: Dict[int, Tuple[int, int]] = {}
    reads: Dict[int, List[Tuple[int, Any, Optional[Tuple[int, int]]]]] = {}   # record -> (slot, tensor, producer)
    consumers: Dict[int, List[Tuple[int, int, int]]] = {}                     # record -> (consumer, slot, out slot)
    for record in records:
        reads[record.index] = [(slot, t, produced.get(id(t))) for slot, t in record.inputs]
        for slot, t, source in reads[record.index]:
            if source is not None:
                consumers.setdefault(source[0], []).append((record.index, slot, source[1]))
        for slot, t in record.outputs:
            produced[id(t)] = (record.index, slot)
    nodes: Dict[str, Dict[str, Any]] = {}
    edges: List[Dict[str, Any]] = []
    omitted = {"producers": 0, "consumers": 0}

    def stats(tensor) -> Optional[Dict[str, Any]]:
        try:
            return compact(_stats(tensor.asnumpy()))
        except (RuntimeError, TypeError, AttributeError, ValueError):
            return None

    def op_node(record: OpRecord, node_role: str, depth: int) -> Dict[str, Any]:
        scope = record.cell or "<root>"
        outputs = [dict(stats(t) or {}, slot=slot) for slot, t in record.outputs]
        entry = {"id": f"op{record.index}", "kind": "op", "op_type": record.op_type, "name":
                 f"{scope}/{record.op_type}-op{record.index}", "scope": scope, "role": node_role, "depth": depth,
                 "index": record.index, "direction": "forward", "source": record.source, "outputs": outputs,
                 "nonfinite": not record.outputs_finite, "dumped": True, "more_inputs": False}
        nodes[entry["id"]] = entry
        return entry

    def count(producers: bool) -> int:
        return sum(1 for n in nodes.values() if n["depth"] != 0 and (n["depth"] < 0) == producers)

    entry = op_node(center, role, 0)
    if center_role == "origin":
        entry.update(op_type=first["op_type"], name=first["name"], direction=first.get("direction") or "forward",
                     source=first.get("source") or center.source,
                     outputs=[compact(o) for o in first.get("outputs") or []], nonfinite=True)
    frontier = [center]
    for level in range(1, up + 1):
        following = []
        for record in frontier:
            for slot, tensor, source in reads[record.index]:
                value = stats(tensor)
                bad = None if value is None else is_nonfinite(value)
                if source is None:
                    name = tensor.name if isinstance(tensor, ms.Parameter) else batch_names.get(id(tensor))
                    key = f"input:{name or 'tensor%d' % id(tensor)}"
                    if key not in nodes:
                        if count(True) >= MAX_PRODUCERS:
                            omitted["producers"] += 1
                            continue
                        nodes[key] = {"id": key, "kind": "parameter" if isinstance(tensor, ms.Parameter) else
                                      "batch", "op_type": None, "name": name or "a tensor no recorded op made",
                                      "scope": "", "role": "input", "depth": -level, "index": None,
                                      "direction": None, "source": None, "value": value, "nonfinite": bool(bad),
                                      "dumped": value is not None, "more_inputs": False}
                    edges.append({"from": key, "to": f"op{record.index}", "slot": slot, "out_slot": 0,
                                  "nonfinite": bad, "elided": False})
                    continue
                producer = records[source[0]]
                key = f"op{producer.index}"
                if key not in nodes:
                    if count(True) >= MAX_PRODUCERS:
                        omitted["producers"] += 1
                        continue
                    op_node(producer, "producer", -level)
                    if level < up:
                        following.append(producer)
                    else:
                        nodes[key]["more_inputs"] = bool(producer.inputs)
                edges.append({"from": key, "to": f"op{record.index}", "slot": slot, "out_slot": source[1],
                              "nonfinite": bad, "elided": False})
        frontier = following
    downstream = center_role == "first_nonfinite" or first.get("direction") == "forward"
    frontier = [center] if downstream else []
    for level in range(1, down + 1):
        following = []
        for record in frontier:
            bad_out = {slot for slot, t in record.outputs if not _finite_tensor(t)}
            for index, slot, out_slot in consumers.get(record.index, []):
                if out_slot not in bad_out:
                    continue
                consumer = records[index]
                key = f"op{index}"
                if key not in nodes:
                    if count(False) >= MAX_CONSUMERS:
                        omitted["consumers"] += 1
                        continue
                    op_node(consumer, "reached" if not consumer.outputs_finite else "consumer", level)
                    if not consumer.outputs_finite:
                        following.append(consumer)
                edges.append({"from": f"op{record.index}", "to": key, "slot": slot, "out_slot": out_slot,
                              "nonfinite": True, "elided": False})
        frontier = following
    reached = sum(1 for r in records[center.index + 1:] if not r.outputs_finite) if downstream else None
    return {"schema": 1, "center": f"op{center.index}", "center_role": center_role, "up": up,
            "down": down if downstream else 0, "reached": reached, "omitted": omitted,
            "nodes": list(nodes.values()), "edges": edges}


def _finite_tensor(tensor) -> bool:
    try:
        return _finite(tensor.asnumpy())
    except (RuntimeError, TypeError, AttributeError, ValueError):
        return True


def _input_grad(tape: OpTape, param_grads: Dict[int, Any], tensor) -> Any:
    if isinstance(tensor, ms.Parameter):
        return param_grads.get(id(tensor))
    seen = tape.grads.get(id(tensor))
    return seen["tensor"] if seen else None


def _in_stats(record: OpRecord) -> List[Dict[str, Any]]:
    """The op's inputs as statistics, in slot order: the recorded float tensors, and its other tensors (indices,
    labels, lengths: what an op's own hint checks, CTC's among them) read now -- they are never written in place."""
    out = []
    floats = {slot for slot, _ in record.inputs}
    for slot, tensor in record.inputs:
        stats = record.input_stats.get(slot) or _stats(tensor.asnumpy())
        extra = {"parameter": tensor.name} if isinstance(tensor, ms.Parameter) else {}
        out.append(dict(stats, slot=slot, role="input", **extra))
    for slot, tensor in all_tensors(record.args, record.kwargs):
        if slot not in floats:
            try:
                out.append(dict(_stats(tensor.asnumpy()), slot=slot, role="input"))
            except Exception:  # noqa: BLE001 - an input that cannot be read: left out of the table
                continue
    return sorted(out, key=lambda item: item["slot"])


def _out_stats(record: OpRecord, role: str) -> List[Dict[str, Any]]:
    return [dict(_stats(t.asnumpy()), slot=slot, role=role) for slot, t in record.outputs]


def _op_finding(record: OpRecord, direction: str, inputs, outputs) -> Finding:
    from ...analysis.hints import hint_for

    op_type = record.op_type if direction == "forward" else f"{record.op_type}Grad"
    scope = record.cell or "<root>"
    source = record.source
    forward_inputs = [item for item in inputs if item.get("role") == "input"]   # as a dump's kernel inputs count
    hint = hint_for(op_type, forward_inputs, outputs, direction=direction, source_code=(source or {}).get("code"),
                    source_file=(source or {}).get("file"), source_line=(source or {}).get("line"))
    extra = {"api": record.api, "call": record.cell_call}
    return Finding(op_type=op_type, name=f"{scope}/{op_type}-op{record.index}", direction=direction,
                   forward_op=f"{scope}/{record.op_type}-op{record.index}" if direction == "backward" else None,
                   source=source, stack=list(record.stack), inputs=inputs, outputs=outputs, index=record.index,
                   hint=hint, cell=record.cell, cell_type=record.cell_type, extra=extra)


def _without_masks(nonfinite: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], bool]:
    """``nonfinite`` without the batch inputs that are additive 0/-inf masks (intended infinities), and whether
    there were any."""
    kept = [item for item in nonfinite if not (item["source"] == "batch" and additive_mask(item))]
    return kept, len(kept) < len(nonfinite)


def _any_nan(tensors: Sequence[Tuple[int, Any]]) -> bool:
    """True when a float tensor of ``(slot, Tensor)`` pairs holds NaN."""
    for _, tensor in tensors:
        try:
            array = tensor.asnumpy()
        except (RuntimeError, TypeError, AttributeError):
            continue
        if array.dtype.kind in "fc" and bool(np.isnan(array).any()):
            return True
    return False


def _stats(array) -> Dict[str, Any]:
    stats = tensor_stats(array)
    return {k: v for k, v in stats.items() if k not in ("absmax", "underflow", "overflow")}


def _numpy(value) -> Optional[np.ndarray]:
    if isinstance(value, ms.Tensor):
        return value.asnumpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        return None


# -------------------------------------------------------------------------------------------- recorder


class _Recorder:
    """Forward and backward hooks on every cell of a network; remembers the first non-finite producer."""

    def __init__(self, network: nn.Cell):
        self.network = network
        self.cells = [(_display_name(network, name), cell) for name, cell in network.cells_and_names()]
        self.handles: List[Any] = []
        self.calls: Dict[int, int] = {}            # id(cell) -> forward calls so far
        self.pending: Dict[int, List[Dict[str, Any]]] = {}   # id(cell) -> forward records awaiting backward
        self.last_forward: Dict[int, Dict[str, Any]] = {}
        self.forward_culprit: Optional[Dict[str, Any]] = None
        self.backward_culprit: Optional[Dict[str, Any]] = None

    def __enter__(self) -> "_Recorder":
        try:
            for display, cell in self.cells:
                self.handles.append(cell.register_forward_hook(self._forward_hook(display)))
                self.handles.append(cell.register_backward_hook(self._backward_hook(display)))
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.remove()

    def remove(self) -> None:
        while self.handles:
            self.handles.pop().remove()

    def culprit(self) -> Optional[Dict[str, Any]]:
        found = self.forward_culprit or self.backward_culprit
        if found is None:
            return None
        report = {key: value for key, value in found.items() if key != "_cell_id"}
        report["calls"] = self.calls.get(found["_cell_id"], 1)
        return report

    def _forward_hook(self, name: str):
        def hook(cell, args, output):
            key = id(cell)
            self.calls[key] = self.calls.get(key, 0) + 1
            source, stack = _call_site(cell)
            record = {"cell": name, "cell_type": type(cell).__name__, "call": self.calls[key],
                      "inputs": _stats_list(args, "input"), "outputs": _stats_list(output, "output"),
                      "source": source, "stack": stack, "_cell_id": key}
            self.pending.setdefault(key, []).append(record)
            self.last_forward[key] = record
            if self.forward_culprit is None and _all_finite(record["inputs"]) and not _all_finite(record["outputs"]):
                self.forward_culprit = dict(record, direction="forward")
            return None
        return hook

    def _backward_hook(self, name: str):
        def hook(cell, grad_input, grad_output):
            key = id(cell)
            forward = self.pending.get(key, []).pop() if self.pending.get(key) else None
            if self.backward_culprit is not None or forward is None:
                return None
            incoming = _stats_list(grad_output, "grad_of_output")
            produced = _stats_list(grad_input, "grad_of_input")
            if _all_finite(forward["inputs"]) and _all_finite(incoming) and not _all_finite(produced):
                self.backward_culprit = {
                    "cell": name, "cell_type": type(cell).__name__, "direction": "backward",
                    "call": forward["call"], "source": forward["source"], "stack": forward["stack"],
                    "inputs": forward["inputs"] + incoming, "outputs": produced, "_cell_id": key}
            return None
        return hook


def _display_name(network: nn.Cell, name: str) -> str:
    """Dotted cell name as the user knows it: ``nn.WithLossCell``'s ``_backbone.`` prefix is dropped
    (``_backbone.norm`` -> ``norm``, the names parameters carry); the root is ``<root>``."""
    if isinstance(network, nn.WithLossCell):
        if name == "_backbone":
            return "<network>"
        if name.startswith("_backbone."):
            return name[len("_backbone."):]
    return name or "<root>"


def _parameter_gradient_culprit(network: nn.Cell, weights, grads, rec: _Recorder) -> Optional[Dict[str, Any]]:
    """No cell's input gradient went non-finite, but a parameter gradient may have: report its cell."""
    owner: Dict[int, Tuple[str, nn.Cell]] = {}
    for name, cell in network.cells_and_names():
        for param in cell._params.values():  # pylint: disable=protected-access  # the cell's own parameters
            owner.setdefault(id(param), (_display_name(network, name), cell))
    for param, grad in zip(weights, grads):
        stats = tensor_stats(grad.asnumpy())
        if not is_nonfinite(stats):
            continue
        name, cell = owner.get(id(param), ("<root>", network))
        forward = rec.last_forward.get(id(cell), {})
        return {"cell": name, "cell_type": type(cell).__name__, "direction": "backward", "parameter": param.name,
                "call": forward.get("call", 1), "calls": rec.calls.get(id(cell), 1),
                "source": forward.get("source"), "stack": forward.get("stack", []),
                "inputs": forward.get("inputs", []), "outputs": [dict(stats, slot=0, role="grad_of_parameter")]}
    return None


def _hint(first: Dict[str, Any]) -> Optional[str]:
    from ...analysis.hints import hint_for

    source = first.get("source") or {}
    return hint_for(first["cell_type"], first.get("inputs") or [], first.get("outputs") or [],
                    direction=first["direction"], source_code=source.get("code"), source_file=source.get("file"),
                    source_line=source.get("line"))


def _finite(array: np.ndarray) -> bool:
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())


def _flat_tensors(value) -> Iterator[Any]:
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _flat_tensors(item)
    else:
        yield value


def _stats_list(value, role: str) -> List[Dict[str, Any]]:
    out = []
    for slot, item in enumerate(_flat_tensors(value)):
        if isinstance(item, ms.Tensor):
            out.append(dict(tensor_stats(item.asnumpy()), slot=slot, role=role))
    return out


def _all_finite(stats: List[Dict[str, Any]]) -> bool:
    return not any(is_nonfinite(s) for s in stats)


_MS_DIR = os.path.dirname(os.path.abspath(ms.__file__)) + os.sep
_THIS_FILE = os.path.abspath(__file__)


def _call_site(cell: nn.Cell) -> Tuple[Optional[Dict[str, Any]], List[Dict[str, Any]]]:
    """The user frames (outside MindSpore, inside the replayed step) that called ``cell``: innermost
    one as ``source``, all outermost first as ``stack``. Falls back to the cell's ``construct`` definition."""
    import linecache

    frames = []
    frame = sys._getframe(2)  # pylint: disable=protected-access  # skip this function and the hook
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if filename == _THIS_FILE:
            break
        if not filename.startswith(_MS_DIR) and not filename.startswith("<"):
            frames.append({"file": filename, "line": frame.f_lineno,
                           "code": linecache.getline(filename, frame.f_lineno).strip()})
        frame = frame.f_back
    if frames:
        return frames[0], frames[::-1]
    return source_of_construct(cell), []


def _dropout_warnings(network: nn.Cell) -> List[str]:
    from ...nn.cells import dropout_classes

    names = [name for name, cell in network.cells_and_names() if isinstance(cell, dropout_classes())]
    if not names:
        return []
    return [f"the network has dropout cells {names[:5]}: their mask in the replay is not the one training drew "
            f"(disable dropout, e.g. mindguard.Reproducible(disable_dropout=True), for an exact replay)"]


def _first_output(network: nn.Cell):
    def loss_of(*inputs):
        out = network(*inputs)
        return out[0] if isinstance(out, (tuple, list)) else out
    return loss_of


@contextlib.contextmanager
def _pynative() -> Iterator[None]:
    previous = ms.get_context("mode")
    if previous != ms.PYNATIVE_MODE:
        ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        yield
    finally:
        if ms.get_context("mode") != previous:
            ms.set_context(mode=previous)


@contextlib.contextmanager
def _training(network: nn.Cell) -> Iterator[None]:
    flags = [(cell, cell.training) for _, cell in network.cells_and_names()]
    network.set_train(True)
    try:
        yield
    finally:
        for cell, flag in flags:
            cell.training = flag


@contextlib.contextmanager
def _restored(params: List[ms.Parameter], saved: Dict[int, np.ndarray]) -> Iterator[None]:
    try:
        yield
    finally:
        for param in params:
            if id(param) in saved:
                _assign(param, saved[id(param)])


def _assign(param: ms.Parameter, value: np.ndarray) -> None:
    """Write ``value`` into ``param``'s own memory (in place): a compiled optimizer (PyNative ``@jit``) keeps
    the tensors it was compiled with, so a ``set_data`` replacement would be updated by nobody and read by it
    never (MindSpore 2.10, ``tests/test_replay_ops.py::test_after_update_list_equals_a_real_step``)."""
    array = np.array(np.reshape(value, tuple(param.shape)), order="C")   # ascontiguousarray makes 0-d 1-d
    ms.ops.assign(param, ms.Tensor(array, dtype=param.dtype))


# ------------------------------------------------------------------------------------ in place


class InPlaceRecording:
    """Record one real training step as it runs, eagerly, with every operator call on tape -- the examination
    of an eager step when the step itself can run again in the examining process (``mindguard hunt``'s examine
    pass): no capture, no rebuilt network, the user's own train cell or step function, optimizer included.

    ``start(network)`` before the step (saves the Parameters' values the step starts from and opens the tape),
    ``finish(batch, written)`` after it (closes the tape; ``written``: the Parameters to list when the update made
    them non-finite) -> :class:`ReplayReport`; ``close()`` closes the tape if the step raised. The step must run
    in PyNative mode (:func:`_pynative` switches while it is open).
    """

    def __init__(self, network: nn.Cell, optimizer: Optional[nn.Cell] = None):
        self.network = network
        self.optimizer = optimizer
        self.tape: Optional[OpTape] = None
        self._mode = None
        self._values: Dict[int, Any] = {}
        self._optimizer_scalars: Dict[str, np.ndarray] = {}
        self._error: Optional[str] = None
        self._last: Optional[OpTape] = None

    def start(self) -> None:
        try:
            self._start()
        except Exception as exc:  # noqa: BLE001 - mindguard's own failure: the step runs unrecorded, finish says why
            self._error = f"starting the recording: {type(exc).__name__}: {exc}"
            if self.tape is not None:
                self.tape.restore()
                self.tape = None
            if self._mode is not None:
                self._mode.__exit__(None, None, None)
                self._mode = None

    def _start(self) -> None:
        self._values = {id(p): ms.Tensor(p.asnumpy().copy(), dtype=p.dtype) for p in self.network.get_parameters()}
        # the optimizer's own small Parameters (learning rate, step counters) as the step begins: a schedule that
        # made the learning rate Inf/NaN is the cause then, not an operator of the step
        own = {id(p) for p in self.network.get_parameters()}
        self._optimizer_scalars = {p.name: p.asnumpy().copy() for p in (
            self.optimizer.get_parameters() if self.optimizer is not None else ()) if id(p) not in own and p.size <= 64}
        self._mode = _pynative()
        self._mode.__enter__()
        self.tape = OpTape(self.network, display=lambda n: _display_name(self.network, n))
        self.tape.__enter__()

    def close(self, *exc_info) -> None:
        if self.tape is not None and self._mode is not None:
            tape, self.tape = self.tape, None
            try:
                tape.__exit__(*(exc_info or (None, None, None)))
            finally:
                self._mode.__exit__(None, None, None)
            self._last = tape

    def finish(self, batch: Sequence[Any], written: Sequence[ms.Parameter], iteration: int) -> ReplayReport:
        """The report of the recorded step; when mindguard itself failed to record or analyse it, a report whose
        ``error`` says so (never an answer about the user's training)."""
        self.close()
        error = self._error or (self._last.error if self._last is not None else "nothing was recorded")
        if error is None:
            try:
                return self._report(batch, written, iteration)
            except Exception as exc:  # noqa: BLE001 - mindguard's own failure
                import traceback

                error = (f"analysing the recorded step: {type(exc).__name__}: {exc}\n"
                         + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:]))
        return ReplayReport(iteration=iteration, error=error,
                            warnings=["mindguard failed to examine the step (its own error, not the training's)"])

    def stopped(self, iteration: int) -> Optional[ReplayReport]:
        """After the recorded step raised: the report naming the op it raised in (None when no recorded op did, or
        the recording itself failed)."""
        tape = self._last
        if tape is None or tape.raised is None or tape.error is not None or self._error is not None:
            return None
        return ReplayReport(iteration=iteration, first=stop_finding(*tape.raised), ops_recorded=len(tape.records),
                            warnings=["examined in place: the step ran eagerly with every operator recorded"])

    def _report(self, batch: Sequence[Any], written: Sequence[ms.Parameter], iteration: int) -> ReplayReport:
        tape = self._last
        nonfinite = []
        for i, value in enumerate(v for v in batch if hasattr(v, "asnumpy")):
            array = value.asnumpy()
            if np.issubdtype(array.dtype, np.floating) and not _finite(array):
                nonfinite.append(dict(_stats(array), name=f"inputs{i}", source="batch"))
        for p in self.network.get_parameters():
            array = self._values[id(p)].asnumpy()
            if np.issubdtype(array.dtype, np.floating) and not _finite(array):
                nonfinite.append(dict(_stats(array), name=p.name, source="parameter"))
        for name, array in self._optimizer_scalars.items():
            if np.issubdtype(array.dtype, np.floating) and not _finite(array):
                nonfinite.append(dict(_stats(array), name=name, source="parameter"))
        nonfinite, masks = _without_masks(nonfinite)
        first = input_finding(nonfinite) if nonfinite else culprit(tape, [], [], self._values, masks=masks)
        after = [p.name for p in written if not _finite(p.asnumpy())]
        return ReplayReport(iteration=iteration, first=first, parameters_nonfinite_after_update=after,
                            warnings=["examined in place: the step ran eagerly with every operator recorded"],
                            nonfinite_inputs=nonfinite, ops_recorded=len(tape.records),
                            data_flow=tape_flow(tape, first, [v for v in batch if hasattr(v, "asnumpy")]))
