"""Replay one captured training step eagerly and name the operator that first turned finite values into Inf/NaN.

:func:`replay` loads a capture (:mod:`mindguard.training.examine.capture`) into the user's network, runs that step's
forward
and backward in PyNative mode while :class:`mindguard.training.examine.api_hooks.OpTape` records every operator call
(the
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
The answer is drawn from the tape by :mod:`mindguard.training.examine.tape_answer`; a step examined where it
ran (no capture) is :mod:`mindguard.training.examine.in_place`.

Index bases: ``iteration`` is ``global step - 1`` of the captured step (1-based, process-wide global step);
``Finding.index`` is the op's 0-based position among the step's recorded forward calls.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import mindspore as ms
from mindspore import nn

from .api_hooks import OpTape
from ..checks.params import ROLE_NETWORK, ROLE_OPTIMIZER, unique_parameters
from .capture import Capture, _check_names, load_capture
from ...errors import ArgumentTypeError, ReplayError
from .in_place import InPlaceRecording
from .replay_report import REPORT_SCHEMA, ReplayReport
from .tape_origin import trace_stop_to_batch
from ..._util.names import argument_names
from .step_context import assign_in_place, display_name, pynative, restored, training_mode
from .tape_answer import (array_stats, culprit, finite_array, input_finding, stop_finding, tape_flow,
                          without_masks)

PathLike = Union[str, "os.PathLike[str]"]
logger = logging.getLogger("mindguard")
__all__ = ["replay", "ReplayReport", "InPlaceRecording", "REPORT_SCHEMA"]


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
    with pynative(), training_mode(network_with_loss), restored(to_load, saved):
        for p in to_load:
            assign_in_place(p, cap.values[p.name])
        nonfinite = _nonfinite_at_start(cap, net_params)
        nonfinite, masks = without_masks(nonfinite)
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
                    assign_in_place(p, cap.values[p.name])
                taped.clear()
                tape, loss, grads = _recorded_step(network_with_loss, weights, inputs, eager_jit=True, taped=taped)
        except Exception as exc:  # noqa: BLE001 - retried compiled; a failure there propagates unchanged
            if taped and taped[0].raised is not None:   # the step raised in a recorded op: that op is the answer
                record, _ = taped[0].raised
                stopped = trace_stop_to_batch(stop_finding(*taped[0].raised), record, inputs,
                                              argument_names(network_with_loss, len(inputs)), taped[0].producer_of)
                return ReplayReport(iteration=cap.meta.get("iteration"), first=stopped,
                                    capture=str(cap.directory), warnings=warnings,
                                    ops_recorded=len(taped[0].records))
            if not _jit_cells(network_with_loss):
                raise
            warnings.append(f"the step raised with its @ms.jit cells {_jit_cells(network_with_loss)[:5]} run eagerly "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); replayed them compiled, so "
                            f"the operators inside them are not seen")
            for p in to_load:
                assign_in_place(p, cap.values[p.name])
            tape, loss, grads = _recorded_step(network_with_loss, weights, inputs, eager_jit=False)
        values = {id(p): ms.Tensor(cap.values[p.name], dtype=p.dtype) for p in net_params}
        if tape.error is not None:
            raise ReplayError(f"mindguard could not record the replayed step (its own failure, not the training's): "
                              f"{tape.error}")
        first = input_finding(nonfinite) if nonfinite else culprit(tape, weights, grads, values, masks=masks)
        after: List[str] = []
        if optimizer is not None:
            optimizer(tuple(grads))
            after = [p.name for p in to_load if not finite_array(p.asnumpy()) and p.name not in nonfinite_before]
        loss_value = float(np.asarray(loss.asnumpy()).reshape(-1)[0])
        flow = tape_flow(tape, first, inputs)
    return ReplayReport(iteration=cap.meta.get("iteration"), first=first, parameters_nonfinite_after_update=after,
                        loss=loss_value, capture=str(cap.directory), warnings=warnings, nonfinite_inputs=nonfinite,
                        ops_recorded=len(tape.records), data_flow=flow)


def _recorded_step(network: nn.Cell, weights: Sequence[ms.Parameter], inputs: Sequence[ms.Tensor], *, eager_jit: bool,
                   taped: Optional[List[OpTape]] = None) -> Tuple[OpTape, Any, Any]:
    """Forward and backward of the step under an :class:`OpTape`: ``(tape, loss, parameter gradients)``. ``taped``
    gets the tape first, so a caller still has it when the step raises."""
    with OpTape(network, display=lambda n: display_name(network, n), eager_jit=eager_jit) as tape:
        if taped is not None:
            taped.append(tape)
        loss, grads = ms.value_and_grad(_first_output(network), None, weights)(*inputs)
    return tape, loss, grads


def _jit_cells(network: nn.Cell) -> List[str]:
    """Dotted names of the cells whose ``construct`` is ``@ms.jit``-compiled."""
    return [name or "<root>" for name, cell in network.cells_and_names()
            if getattr(type(cell).construct, "__wrapped_by_jit__", False)]


def _nonfinite_at_start(cap: Capture, net_params: Sequence[ms.Parameter]) -> List[Dict[str, Any]]:
    """The captured batch inputs (``inputs<i>``, 0-based, as the dump names them) and network parameters that
    already hold Inf/NaN before the step runs."""
    out = []
    for i, array in enumerate(cap.inputs):
        if not finite_array(array):
            out.append(dict(array_stats(array), name=f"inputs{i}", source="batch"))
    for p in net_params:
        array = cap.values[p.name]
        if not finite_array(array):
            out.append(dict(array_stats(array), name=p.name, source="parameter"))
    return out


def _dropout_warnings(network: nn.Cell) -> List[str]:
    from ...nn.cells import dropout_classes

    names = [name for name, cell in network.cells_and_names() if isinstance(cell, dropout_classes())]
    if not names:
        return []
    return [f"the network has dropout cells {names[:5]}: their mask in the replay is not the one training drew "
            f"(disable dropout, e.g. mindguard.Reproducible(disable_dropout=True), for an exact replay)"]


def _first_output(network: nn.Cell) -> Callable[..., Any]:
    def loss_of(*inputs: Any) -> Any:
        out = network(*inputs)
        return out[0] if isinstance(out, (tuple, list)) else out
    return loss_of
