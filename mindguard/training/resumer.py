"""Resuming a hunt pass from a kept state (:class:`Resumer`), and choosing and checking the state to resume from
(:func:`choose_kept_state`, :func:`check_state`).

A resumed pass skips the training calls of the steps before the kept state's -- the dataset still delivers every
batch and every callback runs, but the train network returns zeros shaped like its real output -- and at its step
assigns the state (Parameters and random state) and trains for real. The keeping side is
:mod:`mindguard.training.keeper`. Steps are 1-based, process-wide global steps.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import rng as _rng
from .._util.io import file_sha256, read_json
from ..errors import HuntProtocolError
from ..protocol import folder as layout
from .state_files import (STATE_SCHEMA, _as_numpy, checkpoint_callbacks, placeholder, read_state_meta,
                          restore_random_state, small_parameters, small_state, unrestorable_note)


def hold_checkpoints(call_key: Any, cur_step_num: int) -> None:
    """A skipped step of a resumed pass (the weights are not the training's): its ``ModelCheckpoint`` callbacks
    save nothing at its end (a file of untrained weights beside the user's own). Each counts the step as the one
    it last saved at (MindSpore's ``_save_ckpt`` returns early at that step; the next save is its period later)."""
    for callback in checkpoint_callbacks(call_key):
        callback._last_triggered_step = int(cur_step_num)


class Resumer:
    """A resumed pass: skip the training calls of the steps before the kept state's, then assign it.

    ``step`` is the 1-based global step the state was kept at (the first step that runs for real).
    """

    def __init__(self, directory: Path, *, fast_forward: bool = True) -> None:
        self.directory = Path(directory)
        # a Model.train call's dataset may be reset to the kept step (Run.fast_forward)
        self.fast_forward = fast_forward
        self.fast_forwarded: Optional[int] = None   # steps it was reset past
        meta = read_state_meta(self.directory)
        if meta is None:
            raise HuntProtocolError(f"no kept training state in {str(self.directory)!r} (state.json missing or "
                                    f"of another schema): the hunt's resume request is stale")
        self.meta = meta
        self.step = int(meta["step"])
        self.loaded = False
        self._values: Optional[List[np.ndarray]] = None   # the state's arrays as loaded (take_values)
        self.started: Optional[float] = None   # time.monotonic() of the first step (skipped or not)
        self.trace: Dict[str, List[Optional[str]]] = meta.get("trace") or {}
        self._outputs = placeholder(meta.get("outputs"))
        self._swapped: List[Tuple[Any, type]] = []
        self.random_restored: List[str] = []   # the random sources load() restored (mindguard.training.rng)

    def diverges(self, step: int, trace: List[Optional[str]]) -> Optional[str]:
        """Why step ``step`` (1-based, global) of this run differs from the run that kept the state, or ``None``
        (same, or unknown); with the random sources the kept state could not hold, and their fix, when it names
        any."""
        why = self._differs(step, trace)
        note = unrestorable_note(self.meta) if why is not None else None
        return f"{why}; {note}" if note else why

    def _differs(self, step: int, trace: List[Optional[str]]) -> Optional[str]:
        expected = self.trace.get(str(step))
        if expected is None or expected == trace:
            return None
        what = ["loss", "sum of squares of the Parameters after it"] + ["a small Parameter"] * max(len(expected) - 2, 0)
        for name, want, got in zip(what, expected, trace):
            if want is not None and got is not None and want != got:   # None: not computed in one of the runs
                return f"global step {step}: {name} is {got}, was {want} when the state was kept"
        if len(trace) == len(expected) or len(expected) <= 2:   # an always-on Guard kept the loss (and sum) only
            return None
        return f"global step {step}: {len(trace)} traced values, {len(expected)} when the state was kept"

    def skips(self, global_step: int) -> bool:
        """True while ``global_step`` comes before the kept state's step."""
        if self.started is None:
            self.started = time.monotonic()
        return global_step < self.step

    def placeholder(self) -> Any:
        return self._outputs

    def skip_calls(self, network: Any) -> None:
        """Make calling ``network`` (a ``Model``'s train network) return the placeholder until :meth:`load`.
        Its class is swapped for a subclass whose ``__call__`` does nothing; :meth:`load` swaps it back."""
        if network is None or any(net is network for net, _ in self._swapped):
            return
        original = type(network)
        outputs = self._outputs

        def skipped_call(self: Any, *args: Any, **kwargs: Any) -> Any:
            return outputs

        network.__class__ = type(original.__name__, (original,), {"__call__": skipped_call,
                                                                  "__module__": original.__module__})
        self._swapped.append((network, original))

    def restore_calls(self) -> None:
        for network, original in self._swapped:
            network.__class__ = original
        self._swapped.clear()

    def load(self, params: Sequence[Any]) -> None:
        """Assign the kept state to ``params`` (the same script's Parameters, same names and shapes) in place,
        and stop skipping. :class:`HuntProtocolError` names the first Parameter that differs."""
        import mindspore as ms

        self.restore_calls()
        names, shapes = self.meta["names"], self.meta.get("shapes")
        if [p.name for p in params] != names:
            theirs = [p.name for p in params]
            diff = next((i for i, (a, b) in enumerate(zip(names, theirs)) if a != b), min(len(names), len(theirs)))
            raise HuntProtocolError(f"the kept training state does not fit this run: Parameter {diff} is "
                                    f"{theirs[diff] if diff < len(theirs) else '(none)'!r} here, "
                                    f"{names[diff] if diff < len(names) else '(none)'!r} when it was kept "
                                    f"({len(theirs)} vs {len(names)} Parameters)")
        if self.meta.get("summarized"):
            raise HuntProtocolError(f"the kept training state in {str(self.directory)!r} holds "
                                    f"{len(self.meta['summarized'])} Parameter(s) as statistics only (written for its "
                                    f"dumped step's analysis): it is not a state to resume from")
        expected = self.meta.get("sha256")
        if expected is not None and file_sha256(layout.state_arrays(self.directory)) != expected:
            arrays = layout.state_arrays(self.directory)
            raise HuntProtocolError(f"{str(arrays)!r} is not the file state.json (global step "
                                    f"{self.step}) was written with (its checksum differs: replaced by another "
                                    f"state, or damaged); run the hunt again, or with --resume never")
        bad = _damaged_file(self.directory, self.meta)
        if bad is not None:
            raise HuntProtocolError(f"{bad}; run the hunt again, or with --resume never")
        files = self.meta.get("files") or {}
        with np.load(layout.state_arrays(self.directory), allow_pickle=False) as arrays:
            stored_rng = {name: arrays[name] for name in arrays.files if name.startswith(_rng.ARRAY_PREFIX)}
            # a big array's own file is mapped copy-on-write: read from the page cache as it is copied into the
            # Parameter, and writable as the keeper's copy of this step (take_values)
            values = (_checkpoint_values(self.meta, names) if self.meta.get("checkpoint")
                      else [np.load(layout.state_array_file(self.directory, i), mmap_mode="c", allow_pickle=False)
                            if str(i) in files else arrays[f"p{i}"] for i in range(len(names))])
        shapes = shapes if shapes is not None else [list(v.shape) for v in values]
        for param, _value, shape in zip(params, values, shapes):
            if list(param.shape) != list(shape):
                raise HuntProtocolError(f"the kept training state does not fit this run: {param.name} has shape "
                                        f"{list(param.shape)} here, {shape} when it was kept")
        on_cpu = ms.get_context("device_target") == "CPU"
        for param, value in zip(params, values):
            if on_cpu and _copy_into(param, value):
                continue
            # nothing is compiled yet here (the skipped steps never called the network): the data is replaced as
            # MindSpore's load_param_into_net does -- 2.5x quicker than an eager Assign (0.24 s against 0.62 s for
            # 0.5 GB), which also has no bfloat16 kernel on CPU
            param.set_data(ms.Tensor(value, dtype=param.dtype))   # (a copy: ``value`` stays the state as loaded)
        self.random_restored = restore_random_state(self.meta, stored_rng)
        self.loaded = True
        self._values = list(values)

    def take_values(self) -> Optional[List[np.ndarray]]:
        """The host arrays the state was loaded from (in the Parameters' order; ``None`` when taken before, or
        never loaded): a keeper due at the kept step holds them as its copy of that step's state instead of copying
        the Parameters again (:meth:`mindguard.training.keeper.StateKeeper.keep`'s ``loaded``). Handed over once."""
        values, self._values = self._values, None
        return values


def _copy_into(param: Any, value: np.ndarray) -> bool:
    """Copy ``value`` into ``param``'s own memory, which ``asnumpy()`` views on CPU (the caller's check): no new memory
    for the Parameter (measured, 0.5 GB: 0.05 s, against 0.24 s for ``set_data`` of a new tensor, and seconds while
    a fresh allocation's pages fault in slowly). ``False`` (nothing done) when it is no such view: a copy of its own,
    read-only, or another shape or dtype (bfloat16, which numpy lacks)."""
    view = param.asnumpy()
    if view.flags.owndata or not view.flags.writeable or view.shape != value.shape or view.dtype != value.dtype:
        return False
    np.copyto(view, value)
    return True


def _checkpoint_values(meta: Dict[str, Any], names: Sequence[str]) -> List[np.ndarray]:
    """The values of the Parameters ``names`` in the training's own checkpoint a kept state names (``meta``), in
    that order. :class:`HuntProtocolError` when the file is gone, was replaced since, or lacks one of them."""
    import mindspore as ms

    checkpoint = meta["checkpoint"]
    path = checkpoint["path"]
    try:
        stat = os.stat(path)
    except OSError as exc:
        raise HuntProtocolError(f"the training's checkpoint {path!r} the kept state of global step {meta['step']} "
                                f"resumes from is gone ({exc.strerror}); run the hunt with --resume never") from None
    if stat.st_size != checkpoint.get("bytes") or stat.st_mtime_ns != checkpoint.get("mtime_ns"):
        raise HuntProtocolError(f"the training's checkpoint {path!r} was written again since the failure (its size or "
                                f"time differs): it no longer holds global step {meta['step']}'s state; run the "
                                f"hunt with --resume never")
    loaded = ms.load_checkpoint(path)
    missing = [name for name in names if name not in loaded]
    if missing:
        raise HuntProtocolError(f"the training's checkpoint {path!r} lacks {len(missing)} Parameter(s) of the "
                                f"training state ({missing[0]!r} first): it is not the train network's")
    return [_as_numpy(loaded[name]) for name in names]


def check_state(directory: Path, *, run_id: Optional[str] = None, sha256: Optional[str] = None
                ) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(state.json, None)`` when ``directory`` holds a complete state of run ``run_id`` whose ``state.npz`` is
    the one its ``state.json`` (and the record: ``sha256``) was written with; else ``(None, why)``, one line."""
    directory = Path(directory)
    meta_path, arrays = layout.state_meta(directory), layout.state_arrays(directory)
    if not directory.is_dir():
        return None, f"the kept training state {directory} is gone or unreadable (its folder is missing)"
    try:
        meta = read_json(meta_path)
    except FileNotFoundError:
        return None, f"{meta_path} is missing (the write of the state was cut short?)"
    except (OSError, ValueError) as exc:
        return None, f"{meta_path} is damaged ({_short(exc)})"
    if not isinstance(meta, dict) or meta.get("schema") != STATE_SCHEMA or not isinstance(meta.get("step"), int) \
            or not isinstance(meta.get("names"), list) or not _arrays_described(meta):
        return None, f"{meta_path} is not a kept state of this mindguard (schema {STATE_SCHEMA}) or is damaged"
    if meta.get("summarized"):
        return None, (f"the kept state in {directory} holds {len(meta['summarized'])} Parameter(s) as statistics only "
                      f"(written for its dumped step's analysis): not a state to resume from")
    if run_id is not None and meta.get("run_id") not in (None, run_id):
        return None, (f"the kept state in {directory} was kept by run {meta.get('run_id')}, not by run {run_id} whose "
                      f"record this is (copied from another run?)")
    if sha256 is not None and meta.get("sha256") not in (None, sha256):
        return None, (f"the kept state in {directory} is not the one the record names (its checksum differs: "
                      f"replaced by another run's state?)")
    if not arrays.is_file():
        return None, f"{arrays} is missing (the write of the state was cut short?)"
    if meta.get("sha256") is not None and file_sha256(arrays) != meta["sha256"]:
        return None, f"{arrays} is damaged or replaced (its checksum is not the one {meta_path} was written with)"
    bad = _damaged_file(directory, meta)
    if bad is not None:
        return None, bad
    return meta, None


def _damaged_file(directory: Path, meta: Dict[str, Any]) -> Optional[str]:
    """Why one of the big arrays' own files ``state.json`` lists (``files``: ``p<i>.npy`` and its checksum) is not
    the one it was written with -- missing, damaged or replaced --, or ``None``."""
    files = meta.get("files") or {}
    if not isinstance(files, dict):
        return f"{layout.state_meta(directory)} is damaged (its `files` is not an object)"
    for index, entry in sorted(files.items()):
        path = layout.state_array_file(directory, int(index)) if str(index).isdigit() else None
        if path is None or not isinstance(entry, dict):
            return f"{layout.state_meta(directory)} is damaged (its `files` names {index!r})"
        if not path.is_file():
            return f"{path} is missing (the write of the state was cut short?)"
        if file_sha256(path) != entry.get("sha256"):
            return f"{path} is damaged or replaced (its checksum is not the one {layout.state_meta(directory)} names)"
    return None


def _arrays_described(meta: Dict[str, Any]) -> bool:
    """Whether ``meta`` says where its Parameters' values are: ``shapes`` of the arrays in ``state.npz``, or the
    training's own ``checkpoint`` file (:class:`CheckpointPoint`)."""
    if "checkpoint" in meta:
        return isinstance(meta["checkpoint"], dict) and isinstance(meta["checkpoint"].get("path"), str)
    return isinstance(meta.get("shapes"), list)


def _short(exc: BaseException) -> str:
    if isinstance(exc, ValueError) and type(exc).__name__ == "JSONDecodeError":
        return f"not valid JSON: {getattr(exc, 'msg', exc)} at line {getattr(exc, 'lineno', '?')}: truncated?"
    return getattr(exc, "strerror", None) or str(exc)


def last_complete_state(states: Path, upto: int, *, run_id: Optional[str] = None, skip: Optional[Path] = None
                        ) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
    """The latest complete, undamaged state (:func:`check_state`) of run ``run_id`` in its folder ``states``
    kept at a global step in ``2..upto``, other than ``skip``; ``(None, None)`` when there is none."""
    found = []
    for folder in Path(states).glob(layout.kept_step_pattern()):
        tail = folder.name[len(layout.KEPT_STEP_PREFIX):]
        if tail.isdigit() and 1 < int(tail) <= upto and folder != skip:
            found.append((int(tail), folder))
    for _, folder in sorted(found, reverse=True):
        meta, _ = check_state(folder, run_id=run_id)
        if meta is not None and 1 < int(meta["step"]) <= upto:
            return folder, meta
    return None, None


def choose_kept_state(record: Dict[str, Any], upto: int) -> Tuple[Optional[Path], Optional[Dict[str, Any]],
                                                                  Optional[str]]:
    """The state ``mindguard hunt --from`` resumes ``record``'s failure from: ``(folder, state.json, note)``.

    The state the record names when it is complete, undamaged and the record's own (its run id and checksum);
    otherwise -- or when the record names none (the run was killed, or killed while writing it at the failure) --
    the last complete state of the run on disk (its ``states`` folder) kept at or before ``upto`` (the failure's
    first possible global step), and ``note`` says why; ``(None, None, why)`` when there is none."""
    kept: Dict[str, Any] = record["kept_state"] if isinstance(record.get("kept_state"), dict) else {}
    run_id = record.get("run_id") if isinstance(record.get("run_id"), str) else None
    named = Path(kept["path"]) if isinstance(kept.get("path"), str) else None
    why: Optional[str] = None
    if named is not None:
        meta, why = check_state(named, run_id=run_id or kept.get("run_id"), sha256=kept.get("sha256"))
        if meta is not None:
            return named, meta, None
    states = record.get("states")
    if not isinstance(states, str) and named is not None and run_id is not None and named.parent.name == run_id:
        states = str(named.parent)
    if isinstance(states, str) and run_id is not None:
        folder, meta = last_complete_state(Path(states), upto, run_id=run_id, skip=named)
        if folder is not None and meta is not None:
            how = (f"{why}; resuming from the run's earlier state" if why else
                   "the record names no kept state (the run was killed, or killed while writing it); resuming from "
                   "the last complete state on disk")
            return folder, meta, f"{how}, kept at global step {meta['step']} ({folder})"
    if why is None and named is None:
        why = ("the run kept no training state (Guard keeps one about every second of training once its Parameters "
               "were checked finite, with keep_state=True)")
    return None, None, why

def overridden_edits(meta: Dict[str, Any], params: Sequence[Any]) -> List[str]:
    """The small Parameters of ``params`` (this run's, before the kept state is assigned) whose value the script now
    gives differs from the one the failing run's script gave (``meta["initial"]``): edits the kept state undoes, one
    phrase each (``"learning_rate: 0.001 in the script now, 0.01 in the failing run"``)."""
    initial = meta.get("initial") or {}
    if not isinstance(initial, dict):
        return []
    small = small_parameters(params)
    out = []
    for param, now in zip(small, small_state(small)):
        then = initial.get(param.name)
        if then is not None and then != now:
            out.append(f"{param.name}: {_readable(now)} in the script now, {_readable(then)} in the failing run")
    return out


def _readable(text: Optional[str]) -> str:
    """A fingerprint (:func:`fingerprint`, comma-joined for several values) as plain numbers."""
    def one(word: str) -> str:
        try:
            return f"{float.fromhex(word):.6g}"
        except ValueError:
            return word
    return ",".join(one(w) for w in (text or "").split(","))
