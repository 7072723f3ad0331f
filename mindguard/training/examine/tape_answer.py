"""The answer drawn from a recorded step's op tape (:class:`~mindguard.training.examine.api_hooks.OpTape`): the
op the step raised in (:func:`stop_finding`), Inf/NaN already in the batch or Parameters (:func:`input_finding`),
the first op that turned finite values into Inf/NaN, forward or backward (:func:`culprit`), and the recorded ops
around it (:func:`tape_flow`). ``Finding.index`` is the op's 0-based position among the step's recorded calls."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms

from .api_hooks import OpRecord, OpTape, all_tensors
from ...analysis.evidence import DELIBERATE_INF_TYPES, additive_mask
from ...analysis.hints import nonfinite_input_hint
from ...analysis.stats import is_nonfinite, tensor_stats
from ...report.model import Finding


def stop_finding(record: OpRecord, exc: BaseException) -> Finding:
    """The recorded op a step raised in, as the answer: its inputs as it got them, the exception, the stop hint
    (an index out of range names the table and the index). ``extra["stopped"]`` marks it."""
    from ...analysis.hints import stop_hint

    inputs = []
    for slot, tensor in all_tensors(record.args, record.kwargs):
        try:
            stats = record.input_stats.get(slot) or array_stats(tensor.asnumpy())
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



def input_finding(nonfinite: List[Dict[str, Any]]) -> Finding:
    """The origin when Inf/NaN is in the step's inputs: no operator made it (``direction="input"``)."""
    batch = [item for item in nonfinite if item["source"] == "batch"]
    params = [item for item in nonfinite if item["source"] == "parameter"]
    stats = [dict({k: v for k, v in item.items() if k not in ("name", "source")}, slot=i, role=item["name"])
             for i, item in enumerate(nonfinite)]
    hint: Optional[str]
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
        bad = [i for i, g in enumerate(in_grads) if g is not None and not finite_array(g.asnumpy())]
        if not bad:
            continue
        shared = any(consumers.get(id(record.inputs[i][1]), 0) > 1 for i in bad)
        own: List[Any] = in_grads
        if shared:   # the total gradient of a shared tensor: re-derive this op's own part
            derived = tape.vjp(record, [g["tensor"] if g else None for g in out_grads], values)
            if derived is None or all(g is None or finite_array(g.asnumpy()) for g in derived):
                continue
            own = list(derived)
        incoming = [dict(array_stats(g["tensor"].asnumpy()), slot=i, role="grad_of_output")
                    for i, g in enumerate(out_grads) if g is not None]
        produced = [dict(array_stats(g.asnumpy()), slot=record.inputs[i][0], role="grad_of_input",
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
        for slot, _t, source in reads[record.index]:
            if source is not None:
                consumers.setdefault(source[0], []).append((record.index, slot, source[1]))
        for slot, t in record.outputs:
            produced[id(t)] = (record.index, slot)
    nodes: Dict[str, Dict[str, Any]] = {}
    edges: List[Dict[str, Any]] = []
    omitted = {"producers": 0, "consumers": 0}

    def stats(tensor) -> Optional[Dict[str, Any]]:
        try:
            return compact(array_stats(tensor.asnumpy()))
        except (RuntimeError, TypeError, AttributeError, ValueError):
            return None

    def op_node(record: OpRecord, node_role: str, depth: int) -> Dict[str, Any]:
        scope = record.cell or "<root>"
        outputs = [dict(stats(t) or {}, slot=slot) for slot, t in record.outputs]
        entry: Dict[str, Any] = {"id": f"op{record.index}", "kind": "op", "op_type": record.op_type, "name":
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
        return finite_array(tensor.asnumpy())
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
        stats = record.input_stats.get(slot) or array_stats(tensor.asnumpy())
        extra = {"parameter": tensor.name} if isinstance(tensor, ms.Parameter) else {}
        out.append(dict(stats, slot=slot, role="input", **extra))
    for slot, tensor in all_tensors(record.args, record.kwargs):
        if slot not in floats:
            try:
                out.append(dict(array_stats(tensor.asnumpy()), slot=slot, role="input"))
            except Exception:  # noqa: BLE001 - an input that cannot be read: left out of the table
                continue
    return sorted(out, key=lambda item: item["slot"])


def _out_stats(record: OpRecord, role: str) -> List[Dict[str, Any]]:
    return [dict(array_stats(t.asnumpy()), slot=slot, role=role) for slot, t in record.outputs]


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


def without_masks(nonfinite: List[Dict[str, Any]]) -> Tuple[List[Dict[str, Any]], bool]:
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


def array_stats(array) -> Dict[str, Any]:
    stats = tensor_stats(array)
    return {k: v for k, v in stats.items() if k not in ("absmax", "underflow", "overflow")}


def _numpy(value) -> Optional[np.ndarray]:
    if isinstance(value, ms.Tensor):
        return value.asnumpy()
    try:
        return np.asarray(value)
    except (TypeError, ValueError):
        return None


def finite_array(array: np.ndarray) -> bool:
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())
