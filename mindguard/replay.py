"""Replay one captured training step eagerly and name the first cell that turned finite values into Inf/NaN.

:func:`replay` loads a capture (:mod:`mindguard.capture`) into the user's network, runs that step's forward
and backward in PyNative mode with hooks on every cell, and returns a :class:`ReplayReport` naming the first
cell whose inputs were finite and whose output (forward) or input gradient (backward) was not, with its
source line, tensor statistics and a fix hint. Given the optimizer it also applies the update and lists the
parameters it made non-finite. Everything it changes (mode, hooks, values) is restored afterwards.

Index bases: ``iteration`` is ``global step - 1`` of the captured step (1-based, process-wide global step).
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np
import mindspore as ms
from mindspore import nn

from ._params import ROLE_NETWORK, ROLE_OPTIMIZER, unique_parameters
from .analysis.stats import is_nonfinite, tensor_stats
from .capture import Capture, _check_names, load_capture
from .errors import ArgumentTypeError

PathLike = Union[str, "os.PathLike[str]"]
logger = logging.getLogger("mindguard")
REPORT_SCHEMA = 1
__all__ = ["replay", "ReplayReport"]


@dataclass
class ReplayReport:
    """What :func:`replay` found. ``first`` is ``None`` when every value of the step stayed finite."""

    iteration: Optional[int]
    first: Optional[Dict[str, Any]] = None
    parameters_nonfinite_after_update: List[str] = field(default_factory=list)
    loss: Optional[float] = None
    capture: Optional[str] = None
    warnings: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        """Schema 1 (design "Report schemas"), plus ``loss``, ``capture`` and ``warnings``."""
        return {"schema": REPORT_SCHEMA, "iteration": self.iteration, "first": self.first,
                "parameters_nonfinite_after_update": list(self.parameters_nonfinite_after_update),
                "loss": self.loss, "capture": self.capture, "warnings": list(self.warnings)}

    @property
    def healthy(self) -> bool:
        """True when nothing in the replayed step (loss, cells, gradients, update) was non-finite."""
        loss_finite = self.loss is None or bool(np.isfinite(self.loss))
        return self.first is None and not self.parameters_nonfinite_after_update and loss_finite

    def __str__(self) -> str:
        step = "" if self.iteration is None else f" at iteration {self.iteration} (global step {self.iteration + 1})"
        lines: List[str] = []
        first = self.first
        if first is None:
            lines.append(f"replay{step}: no cell turned finite values into Inf/NaN (loss {self.loss})")
        else:
            src = first.get("source") or {}
            where = f"{src.get('file')}:{src.get('line')}: " if src.get("file") else ""
            call = f" (call {first['call']} of {first['calls']})" if first.get("calls", 1) > 1 else ""
            what = "output" if first["direction"] == "forward" else (
                f"gradient of parameter {first['parameter']!r}" if first.get("parameter") else "input gradient")
            lines.append(f"{where}error: {first['direction']} of cell {first['cell']!r} ({first['cell_type']}){call} "
                         f"made a non-finite {what} from finite inputs{step}")
            if src.get("code"):
                lines.append(f"    {src['code'].strip()}")
            for label, group in (("in ", first.get("inputs") or []), ("out", first.get("outputs") or [])):
                for s in group:
                    lines.append(f"  {label} {_format_stats(s)}")
            if first.get("hint"):
                lines.append("  hint: " + first["hint"].replace("\n", "\n        "))
        if self.parameters_nonfinite_after_update:
            lines.append(f"parameters non-finite after the update: {', '.join(self.parameters_nonfinite_after_update)}")
        lines.extend(f"warning: {w}" for w in self.warnings)
        return "\n".join(lines)



def replay(network_with_loss: nn.Cell, capture: Union[PathLike, Capture], *,
           optimizer: Optional[nn.Optimizer] = None, keep_loaded: bool = False) -> ReplayReport:
    """Re-run one captured training step eagerly and name the cell that first produced Inf/NaN.

    Loads the capture's parameters into ``network_with_loss`` (strict: every parameter of the network
    must be in the capture with the same shape, and vice versa, or :class:`CaptureMismatchError` names
    the mismatching ones), switches to PyNative mode, and runs the step's forward and backward with
    forward/backward hooks on every cell. The culprit is the first cell call, in the order MindSpore
    completes them, whose inputs are finite and whose output (forward) or gradient with respect to its
    inputs (backward; order = order the gradients are computed) is not. When no cell's input gradient
    turns non-finite but a parameter gradient does, the cell owning that parameter is reported.

    With ``optimizer`` (built over ``network_with_loss``'s parameters, same type as in training) the
    captured optimizer state is loaded too, the update is applied, and the parameters it made non-finite
    are listed in ``parameters_nonfinite_after_update``.

    Everything replay changes is restored on exit, even on error: the execution mode, the cells'
    training flags, the hooks, and -- unless ``keep_loaded=True`` -- the parameter (and optimizer state)
    values the network had before. The input batch is replayed as captured; a ``Dropout`` draws a new
    mask (a warning says so).
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
            p.set_data(ms.Tensor(cap.values[p.name], dtype=p.dtype))
        nonfinite_before = [p.name for p in to_load if not _finite(p.asnumpy())]
        if nonfinite_before:
            warnings.append(f"the captured parameters are already non-finite: {nonfinite_before[:10]} -- capture an "
                            f"earlier step (the failure record's dump_iteration, or StepCapture(on_refusal=True))")
        weights = list(optimizer.parameters) if optimizer is not None else network_with_loss.trainable_params()
        inputs = [ms.Tensor(x) for x in cap.inputs]
        with _Recorder(network_with_loss) as rec:
            loss, grads = ms.value_and_grad(_first_output(network_with_loss), None, weights)(*inputs)
        first = rec.culprit()
        if first is None:
            first = _parameter_gradient_culprit(network_with_loss, weights, grads, rec)
        after: List[str] = []
        if optimizer is not None:
            optimizer(tuple(grads))
            after = [p.name for p in to_load if not _finite(p.asnumpy()) and p.name not in nonfinite_before]
        loss_value = float(np.asarray(loss.asnumpy()).reshape(-1)[0])
    if first is not None:
        first["hint"] = _hint(first)
    return ReplayReport(iteration=cap.meta.get("iteration"), first=first, parameters_nonfinite_after_update=after,
                        loss=loss_value, capture=str(cap.directory), warnings=warnings)


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
    from .analysis.hints import hint_for

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
    try:
        import inspect

        construct = type(cell).construct
        filename = os.path.abspath(inspect.getsourcefile(construct))
        lines, start = inspect.getsourcelines(construct)
        return {"file": filename, "line": start, "code": lines[0].strip()}, []
    except (TypeError, OSError):
        return None, []


def _format_stats(s: Dict[str, Any]) -> str:
    shape = "x".join(str(d) for d in s.get("shape", [])) or "scalar"
    role = s.get("role", "")
    return (f"{role:<14} #{s.get('slot', 0)} {s.get('dtype')}[{shape}] min {_num(s.get('min'))} "
            f"max {_num(s.get('max'))} zeros {s.get('zeros')} nan {s.get('nan')} +inf {s.get('pos_inf')} "
            f"-inf {s.get('neg_inf')}")


def _num(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _dropout_warnings(network: nn.Cell) -> List[str]:
    names = [name for name, cell in network.cells_and_names() if isinstance(cell, nn.Dropout)]
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
                param.set_data(ms.Tensor(saved[id(param)], dtype=param.dtype))
