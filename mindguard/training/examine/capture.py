"""Step capture: save everything one training step needs, so :func:`mindguard.training.examine.replay.replay` can re-run
it.

:class:`StepCapture` (a Callback) or :func:`capture_step` (a function, for custom loops and
``mindguard.watch``) writes one directory holding every Parameter of the train network *and* the
optimizer state as they were before the step's update (MindSpore checkpoint), the step's input batch
(``.npy``), the seed, and metadata. It is written into a temporary sibling directory and renamed into
place, so a capture on disk is always complete; an existing capture is never overwritten unless
``overwrite=True``.

Index bases: ``step`` is the 1-based, process-wide global step (:mod:`mindguard.training.run`); ``iteration`` in the
metadata is ``step - 1``.
"""
from __future__ import annotations

import datetime as _dt
import os
import uuid
import platform
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback

from ..._util import io as _io
from ..._util.args import require_int
from ..._util.dist import per_rank_path, rank_info
from ..._util.names import compare_by_name
from ..checks.params import ROLE_NETWORK, ROLE_OPTIMIZER, ROLE_TRAIN_CELL, classify_parameters, find_optimizer
from ..._version import __version__
from ...errors import ArgumentError, ArgumentTypeError, CaptureError, CaptureMismatchError
from ..checks.finite import refused_flag
from ...protocol import folder as layout
from ..reproduce import current_seed
from ..run import cannot_write, step_of

PathLike = Union[str, "os.PathLike[str]"]

CAPTURE_SCHEMA = 1
META_FILE = "capture.json"
PARAMS_FILE = "parameters.ckpt"
INPUTS_DIR = "inputs"
__all__ = ["StepCapture", "capture_step", "load_capture", "Capture", "ROLE_NETWORK", "ROLE_OPTIMIZER",
           "ROLE_TRAIN_CELL"]


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
        raise ArgumentTypeError(f"capture_step(train_network=...) needs a mindspore.nn.Cell, got "
                                f"{type(train_network).__name__}")
    iteration = require_int("capture_step(iteration=...) (0-based: the global step - 1)", iteration, minimum=0)
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
    optimizer = optimizer if optimizer is not None else find_optimizer(train_network)
    params = classify_parameters(train_network, optimizer)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=str(target.parent)))
    os.chmod(tmp, 0o777 & ~_umask())
    try:
        ms.save_checkpoint([{"name": p.name, "data": p} for p, _ in params], str(tmp / PARAMS_FILE))
        inputs: List[Dict[str, Any]] = []
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
            # what each file held when it was written: a file swapped in from another capture (or damaged) is
            # refused by load_capture, naming it
            "files": {rel: _fingerprint(tmp / rel) for rel in [PARAMS_FILE] + [item["file"] for item in inputs]},
        }
        _io.atomic_write_json(tmp / META_FILE, meta)
        _move_into_place(tmp, target, overwrite=overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


class StepCapture(Callback):
    """Callback: capture one training step so that :func:`mindguard.training.examine.replay.replay` can re-run it
    eagerly.

    Which step: ``step`` (the 1-based, process-wide global step of :mod:`mindguard.training.run`, e.g. a failure
    record's ``global_step``); or ``iteration`` (``step - 1``); or the ``global_step`` of the failure record
    at ``record`` (a previous deterministic run's; per-rank file ``name.rankN.json`` when distributed) -- captured
    at the *beginning* of that step, before its update. Or, with ``on_refusal=True``, the first step whose
    update a ``GuardedTrainStep`` refused, captured at that step's end from the weights the refusal left intact.

    One capture per rank: ``directory`` as given for a single process, ``directory.rankN`` when distributed.
    Needs ``dataset_sink_mode=False`` (the batch is only visible to callbacks then). Several training calls
    in one process are counted as one run: the capture happens in whichever call reaches the step.

    Args:
        iteration: ``step - 1`` (the dump iteration of a one-graph training).
        step: the 1-based global step to capture.
        record: failure record JSON to read ``global_step`` from when neither is given.
        directory: where to write the capture.
        on_refusal: capture the first refused update instead of a fixed step.
        overwrite: replace an existing capture (otherwise training is refused before it starts).
        stop_after: ask training to stop at the end of the captured step.
    """

    def __init__(self, iteration: Optional[int] = None, *, step: Optional[int] = None,
                 record: Optional[PathLike] = layout.DEFAULT_RECORD, directory: PathLike = layout.DEFAULT_CAPTURE,
                 on_refusal: bool = False, overwrite: bool = False, stop_after: bool = False):
        super().__init__()
        if step is not None:
            step = require_int("StepCapture(step=...) (the 1-based global step)", step, minimum=1,
                               example="StepCapture(step=record.global_step)")
        if iteration is not None:
            iteration = require_int("StepCapture(iteration=...) (0-based: the global step - 1)", iteration, minimum=0)
            if step is not None and step != iteration + 1:
                raise ArgumentError(f"StepCapture(step={step}, iteration={iteration}): they name different steps; "
                                    f"pass one of them")
            step = iteration + 1
        if on_refusal and step is not None:
            raise ArgumentError(f"StepCapture(step={step}, on_refusal=True): choose one -- a fixed step, or the first "
                                f"refused update")
        self.step = step
        self.record = Path(record) if record is not None else None
        self.directory = Path(directory)
        self.on_refusal = bool(on_refusal)
        self.overwrite = bool(overwrite)
        self.stop_after = bool(stop_after)
        self.captured: Optional[Path] = None
        self.captured_step: Optional[int] = None   # 1-based global step captured
        self._target_step: Optional[int] = self.step
        self._rank = 0
        self._target_dir: Optional[Path] = None

    @property
    def iteration(self) -> Optional[int]:
        """``step - 1`` of the step to capture (``None`` until known)."""
        return None if self._target_step is None else self._target_step - 1

    @property
    def path(self) -> Path:
        """This rank's capture directory (known once training began)."""
        return self._target_dir if self._target_dir is not None else self.directory

    def on_train_begin(self, run_context) -> None:
        if run_context.original_args().get("dataset_sink_mode"):
            raise CaptureError("StepCapture needs Model.train(..., dataset_sink_mode=False): in sink mode the step's "
                               "batch never reaches callbacks and steps run in windows, so no single step can be "
                               "captured")
        if self._target_dir is not None:
            return  # a later training call of the same run: the target and directory stay
        self._rank, size = rank_info()
        self._target_dir = per_rank_path(self.directory, self._rank, size).expanduser().resolve()
        if not self.on_refusal and self._target_step is None:
            self._target_step = self._step_from_record(self._rank, size)
        if self._target_dir.exists() and not self.overwrite:
            raise CaptureError(f"StepCapture: capture directory {str(self._target_dir)!r} already exists; remove it, "
                               f"choose another directory=, or pass overwrite=True")
        _io.check_writable_dir(self._target_dir.parent, what="StepCapture directory's parent")

    def on_train_step_begin(self, run_context) -> None:
        info = step_of(run_context)
        if self.on_refusal or self.captured is not None:
            return
        if info.global_step == self._target_step:
            self._capture(run_context.original_args(), info, reason="step")

    def on_train_step_end(self, run_context) -> None:
        params = run_context.original_args()
        info = step_of(run_context)
        if self.on_refusal and self.captured is None and refused_flag(params.get("net_outputs")):
            self._capture(params, info, reason="refused_update")
        if self.stop_after and self.captured is not None and self.captured_step == info.global_step:
            run_context.request_stop()

    def on_train_end(self, run_context) -> None:
        if self.captured is None:
            import logging

            what = "no update was refused" if self.on_refusal or self._target_step is None else (
                f"training ended before global step {self._target_step} (iteration {self._target_step - 1})")
            logging.getLogger("mindguard").warning("mindguard StepCapture: nothing captured in this training call: "
                                                   "%s", what)

    def _capture(self, params, info, *, reason: str) -> None:
        try:
            self.captured = capture_step(
                self.path, params.get("train_network"), params.get("train_dataset_element"),
                info.global_step - 1, optimizer=params.get("optimizer"), epoch=info.epoch,
                step_in_epoch=info.step_in_epoch, rank=self._rank, overwrite=self.overwrite, reason=reason)
        except OSError as exc:   # mindguard's own I/O never ends the training (under the hunt: the pass says so)
            cannot_write("the step capture", self.path, exc,
                         alternative="give StepCapture(directory=...) a folder on another disk")
            return
        self.captured_step = info.global_step

    def _step_from_record(self, rank: int, size: int) -> int:
        from ...protocol.record import failing_record

        if self.record is None:
            raise ArgumentError("StepCapture needs step= (the 1-based global step), record= (a failure record of a "
                                "previous run), or on_refusal=True")
        path = per_rank_path(self.record, rank, size)
        if not path.is_file():
            raise ArgumentError(
                f"StepCapture: no step= given and no failure record at {str(path)!r} to read global_step from. Run "
                f"the training once with mindguard.Guard(record={str(self.record)!r}) and fixed seeds "
                f"(mindguard.fix_randomness), or pass StepCapture(step=N)")
        step = failing_record(path).global_step   # failing_record refuses a record without a step
        return int(step) if step is not None else 0


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
                           f"mindguard.training.examine.capture.StepCapture(...) or "
                           f"mindguard.training.examine.capture.capture_step(...)")
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
    _verify_files(directory, meta)
    loaded = ms.load_checkpoint(str(directory / PARAMS_FILE))
    values = {name: param.asnumpy() for name, param in loaded.items()}
    missing = [p["name"] for p in meta["parameters"] if p["name"] not in values]
    if missing:
        raise CaptureError(f"capture {str(directory)!r} is incomplete: {PARAMS_FILE} lacks {missing[:10]}")
    inputs = [_io.load_npy(directory / item["file"]) for item in meta["inputs"]]
    return Capture(directory, meta, values, inputs)



def _fingerprint(path: Path) -> Dict[str, Any]:
    """``{"sha256": ..., "bytes": ...}`` of the file at ``path``."""
    import hashlib

    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def _verify_files(directory: Path, meta: Dict[str, Any]) -> None:
    """Refuse a capture whose files are not the ones its ``capture.json`` was written with (a file swapped in from
    another capture, a ``capture.json`` copied from one, a damaged file), naming them. A capture written before
    mindguard kept checksums has none to check."""
    files = meta.get("files")
    if files is None:
        return
    if not isinstance(files, dict):
        raise CaptureError(f"{str(directory / META_FILE)!r}: its 'files' entry is not a mapping of file to checksum; "
                           f"the capture is damaged: take it again with mindguard.training.examine.capture.StepCapture")
    listed = [PARAMS_FILE] + [str(item.get("file")) for item in meta["inputs"] if isinstance(item, dict)]
    unlisted = [rel for rel in listed if rel not in files]
    if unlisted:
        raise CaptureMismatchError(f"capture {str(directory)!r}: {META_FILE} has no checksum for {unlisted}: it does "
                                   f"not describe these files; take the capture again")
    wrong = []
    for rel in listed:
        try:
            actual = _fingerprint(_io.regular_file(directory / rel))
        except OSError as exc:
            raise CaptureError(f"capture {str(directory)!r}: cannot read {rel} ({_io.os_reason(exc)}); the capture is "
                               f"incomplete: take it again") from None
        if actual != files[rel]:
            wrong.append(rel)
    if not wrong:
        return
    step = meta.get("global_step")
    which = (f"{wrong[0]} is not the file" if len(wrong) == 1 else f"{', '.join(wrong)} are not the files")
    whose = (f" (or {META_FILE} itself came from another capture)" if 2 * len(wrong) >= len(listed) else "")
    raise CaptureMismatchError(
        f"capture {str(directory)!r}: {which} {META_FILE} (global step {step}) was written with: the checksum "
        f"differs -- copied from another capture{whose}, or damaged. Replay the capture folder as it was written, "
        f"or take it again")


def _check_names(what: str, actual: Dict[str, List[int]], captured: Dict[str, List[int]], directory: Path) -> None:
    differ = compare_by_name({n: list(s) for n, s in actual.items()}, {n: list(s) for n, s in captured.items()})
    missing, extra = sorted(differ.only_before), sorted(differ.only_after)
    shapes = sorted(f"{n}: capture {captured[n]} vs {what} {actual[n]}" for n in differ.changed)
    if differ:
        parts = [f"{label}: {items}" for label, items in (
            ("not in the capture", missing), (f"in the capture but not in the {what}", extra),
            ("shape differs", shapes)) if items]
        raise CaptureMismatchError(
            f"capture {str(directory)!r} does not match the {what}: {'; '.join(parts)}. Replay needs the same "
            f"network (and optimizer) the capture was taken from, built the same way")


def _to_numpy(item) -> np.ndarray:
    if isinstance(item, ms.Tensor):
        return item.asnumpy()
    return np.asarray(item)


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


