"""The training's own checkpoint files at a failure (issue 50): which of them hold non-finite weights, and the last one
before them to restart from.

The run follows the files its ``ModelCheckpoint`` callbacks write (:class:`CheckpointLog`: each one's
``_latest_ckpt_file_name`` and ``_last_triggered_step``, read at the beginning of every step of a ``Model.train``
call -- a file written at the end of a step is seen at the next one's beginning -- at the failure and at the end of
the call, after ``ModelCheckpoint.end`` wrote its last one). The same log gives the on-disk keeper its resume points
(:meth:`mindguard.training.state.keeper.StateKeeper.note_checkpoints`): one place reads the callbacks.

At a failure of the training's numbers (:data:`~mindguard.training.checks.checked.NONFINITE_KINDS`) each file still on
disk is judged by the global step whose end it holds (:func:`judge`):

* before the first step that may have made the Parameters non-finite (``params_finite_after``, the last passing
  Parameter check): finite by that check (Inf/NaN stays, so a later finite check covers every earlier step);
* at or after a step whose check found the Parameters non-finite: non-finite by that check;
* in between (a failure's window, or after a loss-only failure): read back when the budget allows
  (:func:`scan_checkpoint`, newest first until one reads finite), else *possibly* non-finite. The first file the
  check condemns is read back too, while the budget lasts, so the record says what such a file holds.

The record's ``checkpoints`` field (:func:`field`) and the line printed at the end of the failing training call
(:func:`describe`) say it. Files a functional loop writes itself (``mindspore.save_checkpoint`` between
``mindguard.watch`` steps) are not seen: nothing hands them to mindguard (a watched step sees its own arguments only),
and patching ``save_checkpoint`` would miss a script's ``from mindspore import save_checkpoint`` made before it.
Outside the hunt only.
Steps are 1-based, process-wide global steps. Imports nothing of MindSpore at import time.
"""
from __future__ import annotations

import atexit
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, AbstractSet, Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ..checks.checked import NONFINITE_KINDS
from .state_files import checkpoint_callbacks

if TYPE_CHECKING:  # pragma: no cover
    from ...protocol.record import FailureRecord
    from ..run import Run
    from ..step.steps import StepInfo, TrainingCall

#: seconds the run may spend reading its checkpoint files back at a failure, in all (they are read after the training
#: call ended, so the time delays the script's next call or its exit, never a step)
READ_SECONDS = 10.0
#: bytes a second a checkpoint is assumed to be read and scanned at before one was timed (docs/mindspore-facts.md,
#: issue 50: a ``.ckpt`` scanned where it lies from the page cache; a cold disk is slower)
ASSUMED_READ_BYTES_PER_S = 300e6
#: a file MindSpore's own reader would read (not a ``.ckpt``, or one the walk refuses) is read only when twice its
#: size is at most this share of the memory available (the reader holds the file and a Parameter of each tensor)
READ_MEMORY_SHARE = 0.5
#: names of non-finite tensors kept per file in the record
MAX_NAMES = 8

#: the tensor types of a ``.ckpt`` file that can hold Inf/NaN, as numpy reads their bytes (bfloat16 as its bits)
_FLOAT_TYPES = {"Float16": np.float16, "Float32": np.float32, "Float64": np.float64, "BFloat16": np.uint16}


class CheckpointLog:
    """The checkpoint files the training's ``ModelCheckpoint`` callbacks wrote (:attr:`written`: absolute path ->
    the global step whose end the file holds, its latest write), and what is known of each at a failure."""

    def __init__(self) -> None:
        self.written: Dict[str, int] = {}
        self._call: Optional[Tuple[Any, List[Any]]] = None   # (the current call's key, its ModelCheckpoints)
        self._seen: Dict[int, Tuple[str, int]] = {}          # id(callback) -> (file, its cur_step_num) last seen
        self._broken = False
        # at a failure: (the last step whose Parameters were checked finite, the step they were checked non-finite
        # after or None)
        self.failure: Optional[Tuple[Optional[int], Optional[int]]] = None
        self._scans: Dict[str, Tuple[Tuple[int, int], Optional[List[str]], Optional[int]]] = {}  # path -> read
        self._read_spent = 0.0   # seconds spent reading files back (READ_SECONDS in all)
        self._rate = ASSUMED_READ_BYTES_PER_S
        self._said: Optional[Tuple[Any, ...]] = None   # what the last printed line said
        self.watched: Optional[frozenset] = None   # the names a file is judged by: the Parameters the step writes
        self._at_exit = False
        self.retired = False   # the run was replaced (RunState.release): nothing more is said at exit

    # -- following the files ----------------------------------------------------------------------------------
    def note(self, call: "TrainingCall") -> List[Tuple[str, int]]:
        """Read ``call``'s ``ModelCheckpoint`` callbacks (a ``Model.train`` call; nothing for a watch loop): the files
        written since the last look, as ``(absolute path, global step whose end it holds)``. Never raises: mindguard's
        own error stops the following (said once)."""
        if self._broken or call.kind != "train" or call.first_step is None:
            return []
        try:
            if self._call is None or self._call[0] is not call.key:   # once per training call
                self._call = (call.key, checkpoint_callbacks(call.key))
            new = []
            for callback in self._call[1]:
                path, saved_at = callback._latest_ckpt_file_name, int(callback._last_triggered_step or 0)
                if not path or self._seen.get(id(callback)) == (path, saved_at):
                    continue
                self._seen[id(callback)] = (path, saved_at)
                held = call.first_step + saved_at - 1   # (saved_at: the call's 1-based cur_step_num)
                resolved = str(Path(path).resolve())
                self.written[resolved] = held
                new.append((resolved, held))
            return new
        except Exception as bug:  # noqa: BLE001 - mindguard's own failure never ends the training
            self._broken = True
            print(f"mindguard: the training's checkpoint files are not followed ({type(bug).__name__}: {bug}; a "
                  f"mindguard bug): neither resumed from nor named at a failure", file=sys.stderr, flush=True)
            return []

    def at_failure(self, run: "Run", failure: "FailureRecord", where: Optional["StepInfo"]) -> Optional[Dict[str, Any]]:
        """The failure ``failure`` at step ``where`` was just recorded: the files written up to now (a
        ``ModelCheckpoint`` before Guard in the callback list wrote the failing step's already), judged without
        reading any (:func:`judge`); the record's ``checkpoints`` field, ``None`` when there is nothing to say."""
        if failure.kind not in NONFINITE_KINDS or where is None or failure.global_step is None:
            return None
        checks = run.checks
        bad = where.global_step if checks.checked_at(where) and checks.finite_after != where.global_step else None
        self.failure = (checks.finite_after, bad)
        self.watched = _watched_names(where.call)
        if run.calls:
            self.note(run.calls[-1])
        return self.field(read=False)

    def field(self, *, read: bool) -> Optional[Dict[str, Any]]:
        """The record's ``checkpoints`` field for the failure (:func:`field`); ``read``: read back the files the
        checks leave open while the budget lasts. ``None`` before a failure, or when no file was written."""
        if self.failure is None or not self.written:
            return None
        finite_after, bad = self.failure
        files = {path: held for path, held in self.written.items() if os.path.isfile(path)}
        scans = self._read(files, finite_after, bad) if read else self._known_scans(files)
        return field(judge(files, finite_after, bad, scans), finite_after)

    # -- reading back ---------------------------------------------------------------------------------------
    def _known_scans(self, files: Dict[str, int]) -> Dict[str, Optional[List[str]]]:
        """The files read back before and unchanged since: path -> their non-finite tensors (None: unreadable)."""
        out = {}
        for path in files:
            known = self._scans.get(path)
            if known is not None and known[0] == _identity(path):
                out[path] = known[1]
        return out

    def _read(self, files: Dict[str, int], finite_after: Optional[int],
              bad: Optional[int]) -> Dict[str, Optional[List[str]]]:
        """Read back the files the checks leave open -- newest first, until one reads finite (the earlier ones are
        then finite too) -- then those a check condemns, oldest first, until one reads non-finite (the later ones
        are so too), while :data:`READ_SECONDS` last."""
        scans = self._known_scans(files)
        first = (finite_after or 0) + 1
        open_ = sorted((p for p, s in files.items() if s >= first and (bad is None or s < bad)),
                       key=lambda p: -files[p])
        condemned = sorted((p for p, s in files.items() if bad is not None and s >= bad), key=lambda p: files[p])
        for path in open_:
            if path not in scans:
                self._scan(path, scans)
            if scans.get(path) == []:
                break
        for path in condemned:
            if path not in scans:
                self._scan(path, scans)
            if scans.get(path):
                break
        return scans

    def _scan(self, path: str, scans: Dict[str, Optional[List[str]]]) -> None:
        """Read ``path`` back into ``scans`` when the budget and the memory allow (else leave it out)."""
        try:
            size = os.path.getsize(path)
        except OSError:
            return
        if size / self._rate > READ_SECONDS - self._read_spent:
            return
        identity = _identity(path)
        start = time.perf_counter()
        names = scan_checkpoint(path, self.watched)
        seconds = time.perf_counter() - start
        self._read_spent += seconds
        if names is not None and size >= (16 << 20):   # (a small file's time is mostly the call's)
            self._rate = size / max(seconds, 1e-6)
        self._scans[path] = (identity, names, size)
        scans[path] = names

    # -- saying it --------------------------------------------------------------------------------------------
    def at_call_end(self, run: "Run") -> None:
        """A training call ended (after every ``on_train_end``: ``ModelCheckpoint.end`` wrote its last file): after a
        failure of the training's numbers, its files read back as the budget allows, the record's ``checkpoints``
        updated, and -- in the call that failed, on the rank that printed the hunt line -- one or two lines said;
        a later change is said at the interpreter's exit. Never raises."""
        if self.failure is None or self._broken:
            return
        try:
            if run.calls:
                self.note(run.calls[-1])
            self._update(run, say=self._said is None)
        except Exception as bug:  # noqa: BLE001 - mindguard's own failure never ends the training
            self._broken = True
            print(f"mindguard: could not name the training's checkpoint files at the failure ({type(bug).__name__}: "
                  f"{bug}; a mindguard bug)", file=sys.stderr, flush=True)

    def _update(self, run: "Run", *, say: bool) -> None:
        value = self.field(read=True)
        failure = run.failure
        if value is None or failure is None:
            return
        if value != failure.checkpoints:
            run.recorder.update_failure(checkpoints=value)
        said = _said_key(value)
        if run.recorder.hunt_line.told and (say or (self._said is not None and said != self._said)):
            self._said = said
            print(describe(value, failure), file=sys.stderr, flush=True)
            if not self._at_exit:
                self._at_exit = True
                atexit.register(self._exit_update, run)

    def _exit_update(self, run: "Run") -> None:
        """At the interpreter's exit: what training calls after the failing one wrote is said when it changes the
        answer (a loop of ``Model.train`` calls with ``action="continue"``)."""
        if self.retired:   # a new run replaced this one (tests, notebooks: reset_run)
            return
        try:
            self._update(run, say=False)
        except Exception:  # noqa: BLE001 - the process is ending for its own reasons
            pass


def _identity(path: str) -> Tuple[int, int]:
    try:
        stat = os.stat(path)
    except OSError:
        return (-1, -1)
    return (stat.st_size, stat.st_mtime_ns)


def _available_memory() -> float:
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no psutil reading: do not limit
        return float("inf")


# ------------------------------------------------------------------------------------------------- the files
def _watched_names(call: "TrainingCall") -> Optional[frozenset]:
    """The names of the Parameters a step of ``call`` writes and mindguard's check watches
    (:func:`mindguard.training.checks.params.written_parameters`: weights, BatchNorm statistics, a loss scale -- not the
    optimizer's learning rate, whose schedule may hold Inf on purpose, nor its moments); ``None`` when they cannot be
    told (a file is then judged by every floating-point tensor)."""
    cb_params = call.key
    if not isinstance(cb_params, dict):
        return None
    try:
        from ..checks.params import written_parameters

        names = frozenset(p.name for p in written_parameters(cb_params.get("train_network") or cb_params.get(
            "network"), cb_params.get("optimizer")))
    except Exception:  # noqa: BLE001 - a network mindguard cannot walk: every tensor counts
        return None
    return names or None


def scan_checkpoint(path: str, names: Optional[AbstractSet[str]] = None) -> Optional[List[str]]:
    """The names of the tensors of checkpoint file ``path`` that hold Inf/NaN (``[]``: all finite), ``None`` when it
    cannot be read (encrypted, damaged, another format, or -- by MindSpore's reader -- too big for the memory
    available); ``names``: only those tensors count (default: every floating-point one). Read by
    ``mindspore.load_checkpoint`` (the format's own reader), after the training call, within the read-back budget."""
    try:
        if 2 * os.path.getsize(path) > READ_MEMORY_SHARE * _available_memory():
            return None   # (MindSpore's reader holds the whole file, and a Parameter of each tensor)
        import mindspore as ms

        loaded = ms.load_checkpoint(path, format="safetensors" if path.endswith(".safetensors") else "ckpt")
        found = []
        for name, param in loaded.items():
            if str(getattr(param, "dtype", "")) not in _FLOAT_TYPES or (names is not None and name not in names):
                continue
            values = param.astype(ms.float32).asnumpy() if str(param.dtype) == "BFloat16" else param.asnumpy()
            if not np.isfinite(values).all():
                found.append(name)
        return found
    except Exception:  # noqa: BLE001 - unreadable here: said as not read
        return None


def judge(files: Dict[str, int], finite_after: Optional[int], bad: Optional[int],
          scans: Dict[str, Optional[List[str]]]) -> List[Dict[str, Any]]:
    """Each of ``files`` (path -> the global step whose end it holds), oldest first, as ``{"path", "step", "finite":
    True | False | None, "how", "nonfinite"?}``; ``how`` is ``"read"`` (read back: ``scans``, path -> the non-finite
    tensors), ``"checked"`` (the Parameters were checked finite after a step at or after it, ``finite_after``, or
    non-finite after a step at or before it, ``bad``), ``"inferred"`` (a file read back finite holds a later step, or
    one read back non-finite an earlier one) or ``"not_read"``. Inf/NaN stays: what holds at one step holds at the
    steps before (finite) or after (non-finite) it."""
    out = []
    for path in sorted(files, key=lambda p: (files[p], p)):
        step = files[path]
        entry: Dict[str, Any] = {"path": path, "step": step, "finite": None, "how": "not_read"}
        names = scans.get(path)
        if path in scans and names is not None:
            entry.update(finite=not names, how="read")
            if names:
                entry["nonfinite"] = names[:MAX_NAMES]
                entry["nonfinite_count"] = len(names)
        elif finite_after is not None and step <= finite_after:
            entry.update(finite=True, how="checked")
        elif bad is not None and step >= bad:
            entry.update(finite=False, how="checked")
        out.append(entry)
    read_finite = [e["step"] for e in out if e["how"] == "read" and e["finite"]]
    read_bad = [e["step"] for e in out if e["how"] == "read" and e["finite"] is False]
    for entry in out:
        if entry["finite"] is None and read_finite and entry["step"] <= max(read_finite):
            entry.update(finite=True, how="inferred")
        elif entry["finite"] is None and read_bad and entry["step"] >= min(read_bad):
            entry.update(finite=False, how="inferred")
    return out


def field(judged: Sequence[Dict[str, Any]], finite_after: Optional[int]) -> Dict[str, Any]:
    """The record's ``checkpoints``: ``from_step`` (the first global step whose end may hold non-finite weights:
    after the last passing Parameter check), ``poisoned`` (the files not known finite, oldest first: ``finite``
    false, or null when not read) and ``last_good`` (the newest file known finite, or null)."""
    good = [e for e in judged if e["finite"] is True]
    return {"from_step": (finite_after or 0) + 1,
            "poisoned": [dict(e) for e in judged if e["finite"] is not True],
            "last_good": dict(good[-1]) if good else None}


# -------------------------------------------------------------------------------------------------- the words
def _shown(path: str) -> str:
    """``path`` relative to the working folder when under it, else as it is."""
    try:
        return os.path.relpath(path) if Path(path).resolve().is_relative_to(Path.cwd().resolve()) else path
    except (OSError, ValueError):
        return path


def _listed(entries: Sequence[Dict[str, Any]], limit: int = 4) -> str:
    names = [_shown(e["path"]) for e in entries]
    if len(names) > limit:
        return f"{', '.join(names[:limit - 1])}, ... ({len(names) - limit} more), {names[-1]}"
    return ", ".join(names)


def _said_key(value: Dict[str, Any]) -> Tuple[Any, ...]:
    last = value.get("last_good") or {}
    return (tuple((e["path"], e["step"], e["finite"]) for e in value.get("poisoned") or ()), last.get("path"))


def describe(value: Dict[str, Any], failure: "FailureRecord") -> str:
    """One or two lines: the checkpoint files written at or after the failing step that hold Inf/NaN (or may: not
    read back), and the last one before it."""
    step = failure.global_step
    first = value.get("from_step") or step
    if failure.failure_window:
        when = f"in or after global steps {failure.failure_window[0]}-{failure.failure_window[1]}"
    elif first is not None and step is not None and first > step:
        when = f"after the failing step (global step {step}, whose Parameters were checked finite)"
    else:
        when = "at or after the failing step"
    poisoned = value.get("poisoned") or []
    bad = [e for e in poisoned if e["finite"] is False]
    maybe = [e for e in poisoned if e["finite"] is None]
    parts = []
    if bad:
        how = ("read back" if all(e["how"] == "read" for e in bad) else
               "by mindguard's check, not read back" if all(e["how"] != "read" for e in bad) else
               "read back or by mindguard's check")
        parts.append(f"checkpoints written {when} (NaN/Inf weights, {how}): {_listed(bad)}")
    if maybe:
        parts.append(f"{'possibly also' if bad else f'checkpoints written {when} possibly hold NaN/Inf'} (not read "
                     f"back): {_listed(maybe)}")
    if not parts:
        later = step is not None and any(e["step"] >= step for e in (value.get("last_good") or {},) if e)
        parts.append(f"the checkpoints written {when} hold no NaN/Inf" if later
                     else f"no checkpoint was written {when}")
    last = value.get("last_good")
    label = "last one before it" if not last or step is None or last["step"] < step else "newest finite one"
    before = (f"{label}: {_shown(last['path'])} (end of global step {last['step']}, finite)" if last
              else f"{label}: none on disk")
    return "mindguard: " + "; ".join(parts) + f"\n    {before}"
