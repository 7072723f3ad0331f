"""Single-step replay: save everything one training step needs, then re-run that step eagerly and name
the cell that first turned finite values into Inf/NaN.

Two halves:

* **Capture** -- :class:`StepCapture` (a Callback) or :func:`capture_step` (a function other components
  call) writes one directory holding the trainable parameters *and* optimizer state as they were before
  the step's update (MindSpore checkpoint), the step's input batch (``.npy``), the seed, and metadata.
  It is written into a temporary sibling directory and renamed into place, so a capture on disk is
  always complete; an existing capture is never overwritten unless ``overwrite=True``.
* **Replay** -- :func:`replay` loads a capture into the user's network, runs that step's forward and
  backward in PyNative mode with hooks on every cell, and returns a :class:`ReplayReport` naming the
  first cell whose inputs were finite and whose output (forward) or input gradient (backward) was not,
  with its source line, tensor statistics and a fix hint. Given the optimizer it also applies the update
  and lists the parameters it made non-finite.

Index bases: ``iteration`` is the 0-based dump iteration (``FailureRecord.dump_iteration``); the global
step MindSpore's callbacks report (``cur_step_num``) is ``iteration + 1``.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import importlib
import importlib.util
import json
import logging
import os
import platform
import shutil
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback

from . import _io
from ._dist import per_rank_path, rank_info
from ._version import __version__
from .locate import failing_iteration
from .reproduce import current_seed
from .step import refused_flag
from .analysis.stats import is_nonfinite, tensor_stats

PathLike = Union[str, "os.PathLike[str]"]
logger = logging.getLogger("mindguard")

CAPTURE_SCHEMA = 1
REPORT_SCHEMA = 1
META_FILE = "capture.json"
PARAMS_FILE = "parameters.ckpt"
INPUTS_DIR = "inputs"

ROLE_NETWORK = "network"        # a parameter of the network with loss (what `replay` loads strictly)
ROLE_OPTIMIZER = "optimizer"    # optimizer state: learning_rate, global_step, moments.*, accum.*, ...
ROLE_TRAIN_CELL = "train_cell"  # owned by the train-step wrapper itself (e.g. a loss scale)


class CaptureError(RuntimeError):
    """A capture that cannot be written or read (missing, incomplete, already present, no batch)."""


class CaptureMismatchError(ValueError):
    """The capture's parameters do not match the network (or optimizer) it is being loaded into."""


# --------------------------------------------------------------------------------------------- capture


def capture_step(directory: PathLike, train_network: nn.Cell, batch: Sequence[Any], iteration: int, *,
                 optimizer: Optional[nn.Optimizer] = None, epoch: Optional[int] = None,
                 step_in_epoch: Optional[int] = None, rank: Optional[int] = None,
                 overwrite: bool = False, reason: str = "explicit") -> Path:
    """Write a capture of one training step to ``directory`` and return its path.

    Call it when ``train_network``'s parameters and optimizer state are those the step starts from:
    before the step runs, or after a step whose update was refused (``GuardedTrainStep`` leaves weights
    and optimizer state untouched, so the refused step can be captured at its end, in the same run).

    Args:
        directory: the capture directory to create (the caller adds a rank suffix when distributed).
        train_network: the cell that trains (``TrainOneStepCell``, ``GuardedTrainStep``, ...) or just the
            network; every Parameter reachable from it is saved, optimizer state included.
        batch: the step's inputs, in the order the network with loss takes them (``train_dataset_element``).
        iteration: 0-based dump iteration of the step (global step = ``iteration + 1``).
        optimizer: the optimizer, to tell its state apart from the network's parameters; found inside
            ``train_network`` when omitted.
        epoch, step_in_epoch: 1-based, recorded in the metadata only.
        rank: recorded in the metadata (default: this process's rank).
        overwrite: replace an existing capture at ``directory``; otherwise that is an error.
        reason: why the capture was taken (``"iteration"``, ``"refused_update"``, ...), recorded as is.

    Raises:
        CaptureError: ``directory`` exists (and ``overwrite`` is false), or ``batch`` is empty/None.
    """
    if not isinstance(train_network, nn.Cell):
        raise TypeError(f"capture_step(train_network=...) needs a mindspore.nn.Cell, got {type(train_network).__name__}")
    if isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer)) or iteration < 0:
        raise ValueError(f"capture_step(iteration={iteration!r}): must be a 0-based dump iteration (int >= 0)")
    if batch is None or len(batch) == 0:
        raise CaptureError(
            "capture_step got no input batch: MindSpore passes it as cb_params.train_dataset_element only "
            "when training with dataset_sink_mode=False; train with dataset_sink_mode=False to capture a step")
    target = Path(directory).expanduser().resolve()
    if target.exists() and not overwrite:
        raise CaptureError(f"capture directory {str(target)!r} already exists; remove it, choose another "
                           f"directory, or pass overwrite=True")
    if rank is None:
        rank = rank_info()[0]
    optimizer = optimizer if optimizer is not None else _find_optimizer(train_network)
    params = _classify_parameters(train_network, optimizer)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent)))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        ms.save_checkpoint([{"name": p.name, "data": p} for p, _ in params], str(tmp / PARAMS_FILE))
        inputs = []
        for i, item in enumerate(batch):
            array = _to_numpy(item)
            _io.save_npy(tmp / INPUTS_DIR / f"{i}.npy", array)
            inputs.append({"file": f"{INPUTS_DIR}/{i}.npy", "shape": list(array.shape), "dtype": str(array.dtype)})
        meta = {
            "schema": CAPTURE_SCHEMA,
            "iteration": int(iteration),
            "global_step": int(iteration) + 1,
            "epoch": epoch,
            "step_in_epoch": step_in_epoch,
            "rank": rank,
            "reason": reason,
            "mode": "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative",
            "device_target": ms.get_context("device_target"),
            "seed": current_seed(),
            "mindspore_version": ms.__version__,
            "mindguard_version": __version__,
            "python_version": platform.python_version(),
            "numpy_version": np.__version__,
            "train_network": type(train_network).__name__,
            "optimizer": type(optimizer).__name__ if optimizer is not None else None,
            "parameters": [{"name": p.name, "shape": list(p.shape), "dtype": str(p.dtype), "role": role}
                           for p, role in params],
            "inputs": inputs,
            "time": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        }
        _io.atomic_write_json(tmp / META_FILE, meta)
        _move_into_place(tmp, target, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


class StepCapture(Callback):
    """Callback: capture one training step so that :func:`replay` can re-run it eagerly, cell by cell.

    Either at a known step -- ``iteration`` (0-based dump iteration), or the ``dump_iteration`` of the
    failure record a previous deterministic run's ``FailureLocator`` wrote (``record``; per-rank file
    ``name.rankN.json`` when distributed) -- captured at the *beginning* of global step ``iteration + 1``,
    before its update. Or, with ``on_refusal=True``, the first step whose update a ``GuardedTrainStep``
    refused (``net_outputs == (loss, refused)`` with ``refused`` true), captured at that step's end from
    the weights the refusal left intact.

    One capture per rank: ``directory`` as given for a single process, ``directory.rankN`` when
    distributed. Needs ``dataset_sink_mode=False`` (the batch is only visible to callbacks then).

    Args:
        iteration: 0-based dump iteration to capture (global step ``iteration + 1``).
        record: failure record JSON to read ``dump_iteration`` from when ``iteration`` is None.
        directory: where to write the capture.
        on_refusal: capture the first refused update instead of a fixed iteration.
        overwrite: replace an existing capture (otherwise training is refused before it starts).
        stop_after: ask training to stop at the end of the captured step.
    """

    def __init__(self, iteration: Optional[int] = None, *, record: PathLike = "mindguard_failure.json",
                 directory: PathLike = "mindguard_capture", on_refusal: bool = False,
                 overwrite: bool = False, stop_after: bool = False):
        super().__init__()
        if iteration is not None and (isinstance(iteration, bool) or not isinstance(iteration, (int, np.integer))
                                      or iteration < 0):
            raise ValueError(f"StepCapture(iteration={iteration!r}): must be a 0-based dump iteration (int >= 0), "
                             f"e.g. the failure record's dump_iteration, or None to read it from record=")
        if on_refusal and iteration is not None:
            raise ValueError(f"StepCapture(iteration={iteration}, on_refusal=True): choose one -- a fixed iteration, "
                             f"or the first refused update")
        self.iteration = None if iteration is None else int(iteration)
        self.record = Path(record) if record is not None else None
        self.directory = Path(directory)
        self.on_refusal = bool(on_refusal)
        self.overwrite = bool(overwrite)
        self.stop_after = bool(stop_after)
        self.captured: Optional[Path] = None
        self._target_iteration: Optional[int] = self.iteration
        self._rank = 0
        self._target_dir: Optional[Path] = None
        self._captured_step: Optional[int] = None   # 1-based global step captured

    @property
    def path(self) -> Path:
        """This rank's capture directory (known once training began)."""
        return self._target_dir if self._target_dir is not None else self.directory

    def on_train_begin(self, run_context) -> None:
        if run_context.original_args().get("dataset_sink_mode"):
            raise CaptureError("StepCapture needs Model.train(..., dataset_sink_mode=False): in sink mode the step's "
                               "batch never reaches callbacks and steps run in windows, so no single step can be "
                               "captured")
        self._rank, size = rank_info()
        self._target_dir = per_rank_path(self.directory, self._rank, size).expanduser().resolve()
        if not self.on_refusal and self.iteration is None:
            self._target_iteration = self._iteration_from_record(self._rank, size)
        if self._target_dir.exists() and not self.overwrite:
            raise CaptureError(f"StepCapture: capture directory {str(self._target_dir)!r} already exists; remove it, "
                               f"choose another directory=, or pass overwrite=True")
        _io.check_writable_dir(self._target_dir.parent, what="StepCapture directory's parent")

    def on_train_step_begin(self, run_context) -> None:
        if self.on_refusal or self.captured is not None:
            return
        params = run_context.original_args()
        step = params.get("cur_step_num")
        if step == self._target_iteration + 1:
            self._capture(params, reason="iteration")

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        if self.on_refusal and self.captured is None and refused_flag(params.get("net_outputs")):
            self._capture(params, reason="refused_update")
        if self.stop_after and self.captured is not None and self._captured_step == params.get("cur_step_num"):
            run_context.request_stop()

    def on_train_end(self, run_context) -> None:
        if self.captured is None:
            what = "no update was refused" if self.on_refusal else (
                f"training ended before global step {self._target_iteration + 1} (iteration {self._target_iteration})")
            logger.warning("mindguard StepCapture: nothing captured: %s", what)

    def _capture(self, params, *, reason: str) -> None:
        step = int(params.get("cur_step_num"))
        batch_num = params.get("batch_num") or 0
        epoch = params.get("cur_epoch_num")
        self.captured = capture_step(
            self._target_dir, params.get("train_network"), params.get("train_dataset_element"), step - 1,
            optimizer=params.get("optimizer"), epoch=epoch,
            step_in_epoch=(step - 1) % batch_num + 1 if batch_num else None,
            rank=self._rank, overwrite=self.overwrite, reason=reason)
        self._captured_step = step

    def _iteration_from_record(self, rank: int, size: int) -> int:
        if self.record is None:
            raise ValueError("StepCapture needs iteration= (0-based dump iteration), record= (a failure record of a "
                             "previous run), or on_refusal=True")
        path = per_rank_path(self.record, rank, size)
        if not path.is_file():
            raise FileNotFoundError(
                f"StepCapture: no iteration= given and no failure record at {str(path)!r} to read dump_iteration "
                f"from. Run the training once with mindguard.FailureLocator(record={str(self.record)!r}) and fixed "
                f"seeds (mindguard.fix_randomness), or pass StepCapture(iteration=N)")
        try:
            return failing_iteration(path)
        except ValueError as exc:
            raise ValueError(f"StepCapture: {exc}; or pass StepCapture(iteration=N)") from None


# ---------------------------------------------------------------------------------------------- replay


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


@dataclass
class Capture:
    """A capture read back from disk: metadata, parameter values by name, and the input batch."""

    directory: Path
    meta: Dict[str, Any]
    values: Dict[str, np.ndarray]
    inputs: List[np.ndarray]

    def names(self, role: str) -> Dict[str, List[int]]:
        return {p["name"]: list(p["shape"]) for p in self.meta["parameters"] if p["role"] == role}


def load_capture(directory: PathLike) -> Capture:
    """Read a capture written by :class:`StepCapture` / :func:`capture_step` (``.npy`` never unpickled)."""
    directory = Path(directory).expanduser()
    meta_path = directory / META_FILE
    if not meta_path.is_file():
        raise CaptureError(f"{str(directory)!r} is not a mindguard step capture (no {META_FILE}); capture one with "
                           f"mindguard.StepCapture(...) or mindguard.replay.capture_step(...)")
    try:
        meta = _io.read_json(meta_path)
    except (OSError, ValueError) as exc:
        raise CaptureError(f"{str(meta_path)!r} is not readable JSON ({exc}); the capture is damaged: take it "
                           f"again with mindguard.StepCapture") from None
    if not isinstance(meta, dict) or not isinstance(meta.get("parameters"), list) \
            or not isinstance(meta.get("inputs"), list):
        raise CaptureError(f"{str(meta_path)!r} is not a mindguard capture description (it needs 'parameters' and "
                           f"'inputs' lists); take the capture again with mindguard.StepCapture")
    if meta.get("schema") != CAPTURE_SCHEMA:
        raise CaptureError(f"{str(meta_path)!r} has capture schema {meta.get('schema')!r}; this mindguard "
                           f"({__version__}) reads schema {CAPTURE_SCHEMA}")
    loaded = ms.load_checkpoint(str(directory / PARAMS_FILE))
    values = {name: param.asnumpy() for name, param in loaded.items()}
    missing = [p["name"] for p in meta["parameters"] if p["name"] not in values]
    if missing:
        raise CaptureError(f"capture {str(directory)!r} is incomplete: {PARAMS_FILE} lacks {missing[:10]}")
    inputs = [_io.load_npy(directory / item["file"]) for item in meta["inputs"]]
    return Capture(directory, meta, values, inputs)


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
        raise TypeError(f"replay(network_with_loss=...) needs a mindspore.nn.Cell, got {type(network_with_loss).__name__}")
    cap = capture if isinstance(capture, Capture) else load_capture(capture)
    net_params = _unique_parameters(network_with_loss)
    _check_names("network", {p.name: list(p.shape) for p in net_params}, cap.names(ROLE_NETWORK), cap.directory)
    opt_state: List[ms.Parameter] = []
    warnings: List[str] = []
    if optimizer is not None:
        trained = {id(p) for p in optimizer.parameters}
        opt_state = [p for p in _unique_parameters(optimizer) if id(p) not in trained]
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


# ------------------------------------------------------------------------------------------------- CLI


def cli_replay(args) -> int:
    """``mindguard replay CAPTURE_DIR --net MODULE:FACTORY [--optimizer MODULE:FACTORY] [--json]``.

    Prints the report; returns 0 when the replay ran (whatever it found), 2 on bad arguments.
    """
    try:
        network = _load_factory(args.net, "--net")()
        optimizer = None
        if getattr(args, "optimizer", None):
            optimizer = _load_factory(args.optimizer, "--optimizer")(network)
        report = replay(network, args.capture, optimizer=optimizer)
    except (CaptureError, CaptureMismatchError, ValueError, ImportError, AttributeError) as exc:
        print(f"mindguard replay: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report.to_dict(), indent=2, default=_io._json_default) if args.json else str(report))  # pylint: disable=protected-access
    return 0


def _load_factory(spec: str, option: str):
    module_name, sep, attr = (spec or "").rpartition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{option} {spec!r}: expected MODULE:FACTORY, e.g. train.py:build or mypkg.model:build")
    if module_name.endswith(".py") or os.sep in module_name:
        path = Path(module_name).expanduser().resolve()
        if not path.is_file():
            raise ValueError(f"{option} {spec!r}: no such file {str(path)!r}")
        mod_spec = importlib.util.spec_from_file_location(f"_mindguard_user_{path.stem}", path)
        module = importlib.util.module_from_spec(mod_spec)
        sys.path.insert(0, str(path.parent))
        try:
            mod_spec.loader.exec_module(module)
        finally:
            with contextlib.suppress(ValueError):
                sys.path.remove(str(path.parent))
    else:
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())
        module = importlib.import_module(module_name)
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ValueError(f"{option} {spec!r}: {module_name} has no callable {attr!r}")
    return factory


# ------------------------------------------------------------------------------------------- internals


def _find_optimizer(train_network: nn.Cell) -> Optional[nn.Optimizer]:
    for _, cell in train_network.cells_and_names():
        if isinstance(cell, nn.Optimizer):
            return cell
    return None


def _unique_parameters(cell: nn.Cell) -> List[ms.Parameter]:
    seen, out = set(), []
    for param in cell.get_parameters():
        if id(param) not in seen:
            seen.add(id(param))
            out.append(param)
    return out


def _classify_parameters(train_network: nn.Cell, optimizer: Optional[nn.Optimizer]) -> List[Tuple[ms.Parameter, str]]:
    optimizer_state = set()
    if optimizer is not None:
        trained = {id(p) for p in optimizer.parameters}
        optimizer_state = {id(p) for p in _unique_parameters(optimizer) if id(p) not in trained}
        trained_ids = trained
    else:
        trained_ids = set()
    owned_by_network = set(trained_ids)
    for name, cell in train_network.cells_and_names():
        # the root's own parameters are the wrapper's (a loss scale) when it trains with an optimizer
        if (name or optimizer is None) and not isinstance(cell, nn.Optimizer):
            owned_by_network.update(id(p) for p in cell._params.values())  # pylint: disable=protected-access
    out = []
    for param in _unique_parameters(train_network):
        if id(param) in optimizer_state:
            role = ROLE_OPTIMIZER
        elif id(param) in owned_by_network:
            role = ROLE_NETWORK
        else:
            role = ROLE_TRAIN_CELL
        out.append((param, role))
    names = [p.name for p, _ in out]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise CaptureError(f"cannot capture: several parameters share the names {duplicates[:10]}; give them unique "
                           f"names (MindSpore checkpoints are keyed by name)")
    return out


def _check_names(what: str, actual: Dict[str, List[int]], captured: Dict[str, List[int]], directory: Path) -> None:
    missing = sorted(set(actual) - set(captured))
    extra = sorted(set(captured) - set(actual))
    shapes = sorted(f"{n}: capture {captured[n]} vs {what} {actual[n]}"
                    for n in set(actual) & set(captured) if list(captured[n]) != list(actual[n]))
    if missing or extra or shapes:
        parts = []
        if missing:
            parts.append(f"not in the capture: {missing}")
        if extra:
            parts.append(f"in the capture but not in the {what}: {extra}")
        if shapes:
            parts.append(f"shape differs: {shapes}")
        raise CaptureMismatchError(
            f"capture {str(directory)!r} does not match the {what}: {'; '.join(parts)}. Replay needs the same "
            f"network (and optimizer) the capture was taken from, built the same way")


def _to_numpy(item) -> np.ndarray:
    if isinstance(item, ms.Tensor):
        return item.asnumpy()
    return np.asarray(item)


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


def _umask() -> int:
    """The process umask, read without changing it (``os.umask`` would, briefly, for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return 0o022


def _move_into_place(tmp: Path, target: Path, *, overwrite: bool) -> None:
    """Rename the finished temporary directory to ``target``; an old capture is removed only after."""
    if target.exists():
        if not overwrite:
            raise CaptureError(f"capture directory {str(target)!r} already exists; pass overwrite=True to replace it")
        old = target.with_name(f".{target.name}.old-{uuid.uuid4().hex[:8]}")
        os.rename(target, old)
        os.rename(tmp, target)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.rename(tmp, target)


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
