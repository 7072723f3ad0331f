"""A hunt's later passes start near the failure instead of at step 1.

The record pass keeps, from time to time, a host copy of the training's *state* -- every Parameter of the
train network: weights, buffers (BatchNorm statistics), the optimizer's moments, ``global_step`` and
learning rate, a loss scale -- taken at the beginning of a step, before it runs (:class:`StateKeeper`). When
the run fails, the latest copy taken at or before the first step that can be the failing one is written to
the hunt's run folder. A later pass of the same script resumes from it (:class:`Resumer`): the training calls
of the steps before it are *skipped* -- the dataset still delivers every batch, in order, and every callback
runs, but the train network is not called (it returns zeros shaped like its real output) -- and at its step
the state is assigned and training goes on for real. Its cost is the data pipeline's for the skipped steps
(nearly nothing when a ``Model.train`` call's dataset can be reset there instead: :mod:`mindguard.training.dataset_skip`),
one compile, and the steps from the kept one on.

The random state is kept with it and restored at the kept step (:mod:`mindguard.training.rng`: numpy's, Python's and
MindSpore's default generator). What a resumed pass cannot restore: random state inside the step's kernels
(``nn.Dropout``'s masks, random ops seeded once -- the kept state names such cells, and the hunt then runs from
step 1), Python state the script changes per step outside Parameters. And in the skipped steps the
script's callbacks see a zero loss and the untrained weights (a checkpoint callback saves those). The hunt checks that the resumed
pass fails at the same step in the same way, and otherwise re-runs from step 1.

An always-on Guard copies the state only when the copy is at most :data:`MAX_EXTRA_MEMORY` of the process's
resident memory, and writes it to disk in a thread of its own; its other resume points are the training's own
``ModelCheckpoint`` files (:class:`CheckpointPoint`: a ``state.json`` naming the file, the random state in
``state.npz``).

Steps are 1-based, process-wide global steps (:mod:`mindguard.training.run`). Files: ``<dir>/state.json`` (the step,
names, shapes, dtypes, the output structure, timing) and ``<dir>/state.npz`` (one array per Parameter, read
with ``allow_pickle=False``), written atomically.
"""
from __future__ import annotations

import errno
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from . import dataset_skip as _dataset_skip, rng as _rng
from .._util.io import _atomic_file, atomic_write_json, file_sha256, read_json
from ..errors import HuntProtocolError
from ..protocol import folder as layout

STATE_SCHEMA = 1

#: the share of the training process's resident memory an always-on Guard's host copy of the state may take
MAX_EXTRA_MEMORY = 0.10


def state_parameters(*cells: Any) -> List[Any]:
    """Every Parameter of ``cells`` (a train network; or a network and its optimizer), each once, in their
    ``get_parameters()`` order: the state a training step reads and writes."""
    from .params import unique_parameters

    seen, params = set(), []
    for cell in cells:
        for param in unique_parameters(cell) if cell is not None else ():
            if id(param) not in seen:
                seen.add(id(param))
                params.append(param)
    return params


def fingerprint(value: Optional[float]) -> Optional[str]:
    """A float as exact text (``float.hex``; ``"nan"``/``"inf"`` as such), ``None`` as ``None``."""
    if value is None:
        return None
    value = float(value)
    return value.hex() if math.isfinite(value) else repr(value)


def small_parameters(params: Sequence[Any], limit: int = 16) -> List[Any]:
    """The Parameters of at most ``limit`` values (learning rate, ``global_step``, loss scale, Adam's beta powers),
    the first 64 of them: read at every step of a hunt's pass to tell whether a resumed run follows the run it
    resumes."""
    return [p for p in params if p.size <= limit][:64]


def small_state(params: Sequence[Any]) -> List[str]:
    """The values of ``params`` as exact text (one-element ones by ``item()``: ~1 µs instead of ~4-30 µs)."""
    out = []
    for p in params:
        if p.size == 1:
            out.append(fingerprint(float(p.item())))
        else:
            out.append(",".join(fingerprint(v) for v in np.asarray(_as_numpy(p), dtype=np.float64).reshape(-1)))
    return out


def _as_numpy(param: Any) -> np.ndarray:
    """``param``'s values as a numpy array numpy can compute with: bfloat16, which numpy lacks (``asnumpy()`` gives
    raw 2-byte voids), as float32 (exact; assigned back as bfloat16)."""
    import mindspore as ms

    if param.dtype == ms.bfloat16:
        return ms.ops.cast(param, ms.float32).asnumpy()
    return param.asnumpy()


def _host_copy(param: Any, into: Optional[np.ndarray] = None) -> np.ndarray:
    """``param``'s values in host memory of their own: into ``into`` when it has their shape and dtype (measured,
    25.6 MB: 1.5-2 ms into buffers of an earlier copy, 3-48 ms into new ones, which the OS must first map)."""
    array = _as_numpy(param)
    if into is not None and into.shape == array.shape and into.dtype == array.dtype and into is not array:
        np.copyto(into, array)
        return into
    return array.copy() if not array.flags.owndata else array   # on CPU asnumpy() is a view of the parameter


def output_spec(outputs: Any) -> Any:
    """The structure of a train network's output, as JSON: tensors as shape and dtype, tuples as lists."""
    import mindspore as ms

    from .params import numpy_dtype

    if isinstance(outputs, ms.Tensor):
        try:
            dtype = numpy_dtype(outputs.dtype).name
        except (TypeError, ValueError, KeyError):
            dtype = "float32"   # bfloat16 and other types numpy lacks: a float32 zero stands in
        return {"tensor": list(outputs.shape), "dtype": dtype}
    if isinstance(outputs, (tuple, list)):
        return {"tuple": [output_spec(item) for item in outputs]}
    if isinstance(outputs, (bool, int, float)):
        return {"number": 0}
    return {"none": True}


def placeholder(spec: Any) -> Any:
    """Zeros (False for bool) shaped like the output ``spec`` describes: what a skipped step returns."""
    import mindspore as ms

    if not isinstance(spec, dict):
        return ms.Tensor(np.float32(0))
    if "tensor" in spec:
        return ms.Tensor(np.zeros(spec["tensor"], np.dtype(spec.get("dtype") or "float32")))
    if "tuple" in spec:
        return tuple(placeholder(item) for item in spec["tuple"])
    if "number" in spec:
        return 0
    return None


def _free_bytes(directory: Path) -> Optional[int]:
    try:
        info = os.statvfs(directory)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def capture_random_state(unrestorable: Sequence[str] = ()) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The random state to keep with a training state (:func:`mindguard.training.rng.capture`), its JSON part naming the
    sources it cannot hold (``unrestorable``) and the MindSpore version that says so."""
    arrays, meta = _rng.capture()
    if unrestorable:
        meta["unrestorable"] = list(unrestorable)
        meta["mindspore"] = _mindspore_version()
    return arrays, meta


def restore_random_state(meta: Dict[str, Any], stored: Dict[str, np.ndarray]) -> List[str]:
    """Restore the random state a kept state holds (``meta``: its ``state.json``; ``stored``: its ``state.npz``
    members). Returns what was restored, by name (none for a state without one)."""
    rng = meta.get("rng")
    if not isinstance(rng, dict):
        return []
    arrays = _rng.split_arrays(stored)
    if _dataset_skip.python_pipeline_live() is not None:
        # a Python source or map of a live pipeline may draw from numpy's / Python's RNG in its own thread, ahead
        # of the training: the pipeline was iterated as in the failing run, so its draws are as they were there;
        # setting the state now would hand the next rows draws of another position
        arrays = {k: v for k, v in arrays.items() if not k.startswith(("numpy", "python"))}
    return _rng.restore(arrays, rng)


def unrestorable_note(meta: Optional[Dict[str, Any]]) -> Optional[str]:
    """Why a resume from the kept state ``meta`` (its ``state.json``) cannot compute what the failing run did,
    with the fix; ``None`` when its random state is all restorable."""
    rng = (meta or {}).get("rng")
    if not isinstance(rng, dict):
        return None
    return _rng.describe_unrestorable(rng.get("unrestorable"), rng.get("mindspore"))


def _mindspore_version() -> Optional[str]:
    try:
        import mindspore

        return str(mindspore.__version__)
    except Exception:  # noqa: BLE001 - only words in a message
        return None


class CheckpointPoint:
    """A checkpoint the training wrote itself (``ModelCheckpoint``), as the state at the beginning of global step
    ``step``: its Parameters are in the file, the random state was captured at that step's beginning."""

    def __init__(self, step: int, path: str, names: List[str], unrestorable: Sequence[str] = ()):
        self.step, self.path, self.names = step, path, names
        self.rng_arrays, self.rng_meta = capture_random_state(unrestorable)

    def write(self, directory: Path, *, outputs: Any, timing: Dict[str, Any],
              trace: Optional[Dict[int, List[Optional[str]]]] = None) -> Optional[Path]:
        """Write ``directory/state.npz`` (the random state only) and ``state.json`` naming the checkpoint, its
        size and modification time (a file replaced since is refused on load). ``None`` when the file is gone."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        with _atomic_file(layout.state_arrays(directory)) as f:
            np.savez(f, **{_rng.ARRAY_PREFIX + k: a for k, a in self.rng_arrays.items()})
        atomic_write_json(layout.state_meta(directory), {
            "schema": STATE_SCHEMA, "step": self.step, "names": self.names,
            "sha256": file_sha256(layout.state_arrays(directory)),
            "checkpoint": {"path": self.path, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns},
            "outputs": outputs, "bytes": stat.st_size, "rng": self.rng_meta,
            "trace": {str(k): v for k, v in sorted((trace or {}).items()) if k >= self.step}, **timing})
        return directory


def checkpoint_callbacks(call_key: Any) -> List[Any]:
    """The ``ModelCheckpoint`` callbacks of a ``Model.train`` call (``call_key``: its callback parameters)."""
    callbacks = call_key.get("list_callback") if isinstance(call_key, dict) else None
    return [cb for cb in callbacks or () if hasattr(cb, "_latest_ckpt_file_name")
            and hasattr(cb, "_last_triggered_step")]


def hold_checkpoints(call_key: Any, cur_step_num: int) -> None:
    """A skipped step of a resumed pass (the weights are not the training's): its ``ModelCheckpoint`` callbacks
    save nothing at its end (a file of untrained weights beside the user's own). Each counts the step as the one
    it last saved at (MindSpore's ``_save_ckpt`` returns early at that step; the next save is its period later)."""
    for callback in checkpoint_callbacks(call_key):
        callback._last_triggered_step = int(cur_step_num)


class KeptState:
    """A host copy of the training state at the beginning of global step ``step``."""

    def __init__(self, step: int, params: Sequence[Any], call: int = 1, *, reuse: Optional["KeptState"] = None,
                 unrestorable: Sequence[str] = ()):
        """``reuse``: an earlier copy no longer needed, whose buffers this copy overwrites where they fit;
        ``unrestorable``: the random sources of the step that no kept state can hold (:mod:`mindguard.training.rng`)."""
        start = time.perf_counter()
        self.rng_arrays, self.rng_meta = capture_random_state(unrestorable)
        self.step = step
        self.call = call                        # the 1-based training call the step belongs to
        self.dump_graphs: Dict[int, int] = {}   # the step's observed {graph: dump iteration}, when observed
        self.names = [p.name for p in params]
        buffers = reuse.arrays if reuse is not None and reuse.names == self.names else [None] * len(params)
        self.arrays = [_host_copy(p, into) for p, into in zip(params, buffers)]
        self.seconds = time.perf_counter() - start
        self.nbytes = sum(a.nbytes for a in self.arrays)

    def write(self, directory: Path, *, outputs: Any, timing: Dict[str, Any],
              trace: Optional[Dict[int, List[Optional[str]]]] = None, arrays: bool = True) -> Path:
        """Write this state to ``directory`` (``state.npz`` first, then ``state.json``: a folder with a json has
        both; ``arrays=False``: the folder holds them already, only the json is written again, with the trace).
        Returns ``directory``."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if arrays:
            free = _free_bytes(directory)
            if free is not None and free < self.nbytes + (1 << 20):   # refused before numpy's zip half-writes it
                no_space = OSError(errno.ENOSPC, f"No space left on device ({free} bytes free, {self.nbytes} needed)",
                                   str(directory))
                raise no_space   # the OS's own error, early: the caller handles it as the write's (run.Run.fail)
            with _atomic_file(layout.state_arrays(directory)) as f:
                np.savez(f, **{f"p{i}": a for i, a in enumerate(self.arrays)},
                         **{_rng.ARRAY_PREFIX + k: a for k, a in self.rng_arrays.items()})
        atomic_write_json(layout.state_meta(directory), {
            "schema": STATE_SCHEMA, "step": self.step, "names": self.names,
            "sha256": file_sha256(layout.state_arrays(directory)),   # a state.npz of another step or run is refused on load
            "shapes": [list(a.shape) for a in self.arrays], "dtypes": [str(a.dtype) for a in self.arrays],
            "call": self.call, "dump_graphs": {str(g): it for g, it in self.dump_graphs.items()},
            "outputs": outputs, "copy_seconds": round(self.seconds, 6), "bytes": self.nbytes, "rng": self.rng_meta,
            "trace": {str(k): v for k, v in sorted((trace or {}).items()) if k >= self.step}, **timing})
        return directory


class StateKeeper:
    """Copies of the training state (see the module docstring), kept on a time budget.

    A host copy is taken at the beginning of a step when ``every_steps`` steps passed since the last one, or --
    without ``every_steps`` -- when ``max(min_seconds, copy cost / budget)`` seconds did, so that copying costs at
    most ``budget`` of the training time. ``steps``: keep exactly at these steps instead (a locate pass keeps each
    step of a failure's window). Only the latest copy is held in memory, and written at the failure.

    ``on_disk`` (an always-on :class:`~mindguard.Guard` outside the hunt, beside its record): the caller keeps only
    states whose Parameters were just checked finite (:meth:`mindguard.training.run.Run.begin_step`), the first as early as
    it can; copies and disk writes then share ``budget`` half and half. From ``disk_seconds`` after the keeper
    starts, and then at least ``disk_seconds`` apart, the copy is also written to ``<directory>/step-<N>/``
    (``state.npz`` then ``state.json``, each atomic; only the last ``keep_last`` folders stay), so a run killed at
    any later moment (SIGKILL, the OOM killer) still leaves a usable state; one killed sooner has none, and its hunt
    re-trains those few seconds from step 1. At a failure the latest copy is written there too: the examination
    then starts at most a copy interval before the window.
    """

    run_id: Optional[str] = None   # the run whose states these are (written into each state.json; on_disk)

    def __init__(self, directory: Path, *, every_steps: Optional[int] = None, steps: Iterable[int] = (),
                 min_seconds: float = 10.0, budget: float = 0.005, on_disk: bool = False, keep_last: int = 2,
                 disk_seconds: float = 30.0):
        self.directory = Path(directory)
        self.every_steps = every_steps
        self.steps = set(steps)
        self.min_seconds, self.budget = min_seconds, budget
        self.on_disk, self.keep_last, self.disk_seconds = on_disk, keep_last, disk_seconds
        self.kept: Dict[int, KeptState] = {}       # the latest copy, in memory
        self.on_disk_states: Dict[int, Path] = {}  # step -> folder, on disk (on_disk)
        self.trace: Dict[int, List[Optional[str]]] = {}   # per step since the kept state: loss, sums, scalars
        self.outputs: Any = None
        self._last_step = 1
        self._paused_at: Optional[float] = None   # time.monotonic() when training stopped being timed (pause)
        self._paused_for = 0.0                      # seconds paused in all
        self._last_time = self._clock()
        self._copy_seconds = 0.0
        self._disk_time = self._clock()             # of the last write to disk (the first: disk_seconds from now)
        self._copy_budget = budget / 2 if on_disk else budget   # the share of the training time copies may take
        self._write_seconds = 0.0
        self.written: Optional[Path] = None
        self.initial: Dict[str, str] = {}   # the small Parameters' values before the run's first step (note_initial)
        self.refused_for_memory = False
        self.first_step_end: Optional[float] = None   # time.time() when step 1 ended (startup + compile + 1 step)
        self._first = 1                                 # the step first_step_end was taken at
        self.step_seconds: Optional[float] = None      # mean seconds per step since then
        self.seconds = 0.0                             # spent keeping (copies and writes), in all
        self.problem: Optional[str] = None             # why nothing more is written to disk (said once)
        self._random_sources: Dict[Tuple[int, ...], List[str]] = {}   # cells -> their unrestorable random sources
        self.on_unrestorable: Optional[Callable[[List[str]], None]] = None   # told each newly found list (the record)
        self._writer: Optional[threading.Thread] = None   # the thread writing a copy to disk (on_disk)
        self.checkpoints: Dict[int, CheckpointPoint] = {}   # step -> the training's own checkpoint it begins from
        self._checkpoints_broken = False
        self._checkpoint_cbs: Optional[Tuple[Any, List[Any]]] = None   # (a call's key, its ModelCheckpoints)
        self._nbytes: Optional[Tuple[Sequence[Any], int]] = None   # (the Parameters kept, the bytes of their copy)

    def due(self, step: int) -> bool:
        if self.steps:
            return step in self.steps
        if step <= 1:
            return False   # step 1 starts from what the script builds: nothing to keep
        if self.on_disk and self.refused_for_memory:
            return False   # said once; the training's own checkpoints are its resume points (note_checkpoints)
        if self._writer is not None and self._writer.is_alive():
            return False   # the copy in memory is being written: its buffers are not reused until then
        if self.on_disk and not self.kept:
            return True    # the first state as early as it can be checked: a failure at any later step can resume
        if self.every_steps is not None:
            return step - self._last_step >= self.every_steps
        interval = max(self.min_seconds, self._copy_seconds / self._copy_budget)
        return self._clock() - self._last_time >= interval

    def keep(self, step: int, params: Sequence[Any], call: int = 1, cells: Sequence[Any] = ()) -> None:
        """Copy the state at the beginning of ``step`` (``params``; ``cells``: the cells they belong to, searched
        once for random sources no kept state can hold -- named on stderr once when on disk, before any failure),
        unless the copy does not fit (:meth:`_fits`: then nothing is kept; said once). On disk, the copy is
        written in a thread of its own (:meth:`_write_async`): the step does not wait for the disk."""
        if self._nbytes is None or self._nbytes[0] is not params:   # once per list of Parameters (a call's)
            self._nbytes = (params, sum(int(p.size) * np.dtype(np.float32).itemsize
                                        * (2 if str(p.dtype) == "Float64" else 1) for p in params))
        nbytes = self._nbytes[1]
        too_big = self._fits(nbytes)
        if too_big is not None:
            if not self.refused_for_memory:
                then = ("`mindguard hunt --from` resumes from the training's own checkpoints (ModelCheckpoint) when "
                        "it writes them, else runs from step 1" if self.on_disk else "pass 2 will run from step 1")
                print(f"mindguard: not keeping the training state ({nbytes / 1e9:.2f} GB) in memory: {too_big}; "
                      f"{then}", file=sys.stderr, flush=True)
            self.refused_for_memory = True
            self._last_step, self._last_time = step, self._clock()
            return
        previous = next(iter(self.kept.values()), None)
        state = KeptState(step, params, call, reuse=previous, unrestorable=self._unrestorable(cells))
        self.kept = {step: state}
        self.trace = {k: v for k, v in self.trace.items() if k >= step}
        self._last_step, self._last_time = step, self._clock()
        self._copy_seconds = state.seconds
        self.seconds += state.seconds
        if self.on_disk and self.problem is None and self._clock() - self._disk_time >= max(
                self.disk_seconds, self._write_seconds / (self.budget - self._copy_budget)):
            self._write_async(state)

    def _fits(self, nbytes: int) -> Optional[str]:
        """Why a host copy of ``nbytes`` does not fit, or ``None``. Always: more than a third of the memory
        available. On disk (an always-on Guard, in every run): more than :data:`MAX_EXTRA_MEMORY` of the
        training process's resident memory now -- the copy would raise the training's peak by more than that."""
        if nbytes > _available_memory() / 3:
            return "more than a third of the memory available"
        if self.on_disk:
            rss = _resident_memory()
            if rss is not None and nbytes > MAX_EXTRA_MEMORY * rss:
                return (f"more than {MAX_EXTRA_MEMORY:.0%} of the training process's {rss / 1e9:.2f} GB, which it "
                        f"would add to its peak")
        return None

    def _write_async(self, state: "KeptState") -> None:
        """Write ``state`` to disk in a thread; no other copy is taken until it is done (:meth:`due`), so its
        buffers stay as they were copied."""
        self._writer = threading.Thread(target=self._to_disk, args=(state,), name="mindguard-state-writer")
        self._writer.start()

    def _join_writer(self) -> None:
        """Wait for a write in flight (at a failure: the state on disk is then complete)."""
        if self._writer is not None:
            self._writer.join()
            self._writer = None

    def _to_disk(self, state: "KeptState", *, trace: Optional[Dict[int, List[Optional[str]]]] = None,
                 timing: Optional[Dict[str, Any]] = None) -> Optional[Path]:
        """Write ``state`` to ``<directory>/step-<N>/`` and keep only the last ``keep_last`` folders there."""
        start = time.perf_counter()
        existing = self.directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = _free_bytes(existing)
        if free is not None and state.nbytes * 3 > free:
            self._give_up(f"{state.nbytes / 1e6:.1f} MB per state, {free / 1e6:.0f} MB free on that disk")
            return None
        try:
            folder = state.write(layout.kept_step(self.directory, state.step), outputs=self.outputs, timing={
                "verified": f"every Parameter checked finite after global step {state.step - 1}",
                "run_id": self.run_id, "initial": self.initial, **(timing or {})},
                trace=trace or {}, arrays=state.step not in self.on_disk_states)
        except (OSError, ValueError) as exc:
            self._give_up(f"{type(exc).__name__}: {exc}")
            return None
        self.on_disk_states[state.step] = folder
        for old in sorted(self.on_disk_states)[:-self.keep_last]:
            shutil.rmtree(self.on_disk_states.pop(old), ignore_errors=True)
        self._disk_time = self._clock()
        self._write_seconds = time.perf_counter() - start
        self.seconds += self._write_seconds
        return folder

    def _clock(self) -> float:
        """Seconds of training: ``time.monotonic()`` less the time :meth:`pause` left out (the clock runs again here,
        at the next step). Intervals between copies and writes are of training, so that other work in the process
        (an evaluation, another model's training) neither spends nor counts in the budget."""
        now = time.monotonic()
        if self._paused_at is not None:
            self._paused_for += now - self._paused_at
            self._paused_at = None
        return now - self._paused_for

    def pause(self) -> None:
        """Training stopped being timed (an epoch or a training call ended) until the next step."""
        if self._paused_at is None:
            self._paused_at = time.monotonic()

    def _unrestorable(self, cells: Sequence[Any]) -> List[str]:
        """:func:`mindguard.training.rng.unrestorable_sources` of ``cells``, found once per set of cells."""
        key = tuple(id(c) for c in cells)
        if key not in self._random_sources:
            try:
                found = _rng.unrestorable_sources(cells)
            except Exception:  # noqa: BLE001 - a cell tree mindguard cannot walk: nothing named, the trace still tells
                found = []
            self._random_sources[key] = found
            note = _rng.describe_unrestorable(found, _mindspore_version()) if found else None
            if note and self.on_disk:
                print(f"mindguard: `mindguard hunt --from` cannot resume this run from a kept state: {note}",
                      file=sys.stderr, flush=True)
            if found and self.on_unrestorable is not None:
                self.on_unrestorable(found)
        return self._random_sources[key]

    def _give_up(self, why: str) -> None:
        self.problem = why
        print(f"mindguard: not writing the training state to {self.directory} ({why}); `mindguard hunt --from` "
              f"will use an earlier one or run from step 1. Free some disk, or pass Guard(keep_state=False) to stop "
              f"trying", file=sys.stderr, flush=True)

    def note_step_end(self, step: int, outputs: Any) -> None:
        """After a step: the output's structure (once) and the pace, for the hunt's choice of route."""
        if self.outputs is None and outputs is not None:
            self.outputs = output_spec(outputs)
        now = time.time()
        if step == 1 or self.first_step_end is None:
            self.first_step_end, self._first = now, step
        elif step > self._first:
            self.step_seconds = (now - self.first_step_end) / (step - self._first)

    def note_trace(self, step: int, trace: List[Optional[str]]) -> None:
        """What a step computed (its loss, the sum of squares of the Parameters after it when it was checked, the
        small Parameters before it), kept for the steps since the kept state or checkpoint: a resumed pass must
        compute the same."""
        starts = list(self.kept) + list(self.checkpoints)
        if starts and step >= min(starts):
            self.trace[step] = trace

    def finite_checkpoint_after(self, after: int, step: int) -> Optional[int]:
        """At a non-finite failure at global step ``step`` whose Parameters were last checked finite after step
        ``after``: the latest checkpoint point between them (``after + 1 < point <= step``) whose file holds
        finite values only, or ``None``. Its file is read once here (at the failure, not during training): the
        Parameters were finite after its step - 1 too, and the failure's window starts at it."""
        for point in sorted(self.checkpoints, reverse=True):
            if not after + 1 < point <= step:
                continue
            try:
                import mindspore as ms

                values = ms.load_checkpoint(self.checkpoints[point].path)
                names = set(self.checkpoints[point].names)
                if all(np.isfinite(_as_numpy(v)).all() for name, v in values.items() if name in names
                       and np.issubdtype(_as_numpy(v).dtype, np.floating)):
                    return point
            except Exception:  # noqa: BLE001 - an unreadable checkpoint is no resume point; the window stays
                continue
        return None

    def note_checkpoints(self, step: int, call_key: Any, first_step: int, cells: Sequence[Any],
                         params: Sequence[Any]) -> None:
        """At the beginning of global step ``step`` of a ``Model.train`` call (``call_key``; its first step was
        global step ``first_step``): a checkpoint its ``ModelCheckpoint`` wrote at the end of the step before is
        a resume point for ``step`` (the random state is captured now). The last ``keep_last`` are held."""
        if self._checkpoints_broken:
            return
        try:
            if self._checkpoint_cbs is None or self._checkpoint_cbs[0] is not call_key:   # once per training call
                self._checkpoint_cbs = (call_key, checkpoint_callbacks(call_key))
            for callback in self._checkpoint_cbs[1]:
                path, saved_at = callback._latest_ckpt_file_name, int(callback._last_triggered_step or 0)
                if not path or first_step + saved_at != step or step in self.checkpoints:
                    continue   # (saved_at: the call's 1-based cur_step_num, the step the file holds the end of)
                self.checkpoints[step] = CheckpointPoint(step, str(Path(path).resolve()), [p.name for p in params],
                                                         self._unrestorable(cells))
                for old in sorted(self.checkpoints)[:-self.keep_last]:
                    del self.checkpoints[old]
                self.trace = {k: v for k, v in self.trace.items()
                              if k >= min(list(self.kept) + list(self.checkpoints))}
        except Exception as bug:  # noqa: BLE001 - mindguard's own failure never ends the training
            self._checkpoints_broken = True
            print(f"mindguard: the training's checkpoints are not used as resume points ({type(bug).__name__}: "
                  f"{bug}; a mindguard bug): the kept states still are", file=sys.stderr, flush=True)

    def write(self, upto_step: int) -> Optional[Path]:
        """Write the latest copy taken at or before ``upto_step`` (once), with the trace since it; ``None`` when
        there is none. On disk: into ``<directory>/step-<N>/`` (or the latest folder written before, when the copy
        in memory is past ``upto_step`` or cannot be written)."""
        if self.written is not None:
            return self.written
        self._join_writer()
        timing = {"first_step_end": self.first_step_end, "step_seconds": self.step_seconds}
        candidates = [s for s in self.kept if s <= upto_step]
        checkpoints = [s for s in self.checkpoints if s <= upto_step]
        latest = max(candidates + list(self.on_disk_states if self.on_disk else []), default=0)
        if checkpoints and max(checkpoints) > latest and self.on_disk:
            point = self.checkpoints[max(checkpoints)]
            self.written = point.write(layout.kept_step(self.directory, point.step), outputs=self.outputs,
                                       timing={"run_id": self.run_id, **timing}, trace=self.trace)
            if self.written is not None:
                return self.written
        if candidates:
            state = self.kept[max(candidates)]
            if self.on_disk:
                self.problem = None   # one more try: this is the write that matters
                self.written = self._to_disk(state, trace=self.trace, timing=timing)
            else:
                self.written = state.write(self.directory, outputs=self.outputs, timing=timing, trace=self.trace)
        if self.written is None and self.on_disk:
            earlier = [s for s in self.on_disk_states if s <= upto_step]
            self.written = self.on_disk_states[max(earlier)] if earlier else None
        return self.written


def _resident_memory() -> Optional[float]:
    """This process's resident memory (bytes), or ``None`` when it cannot be read."""
    try:
        import psutil

        return float(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - no psutil reading: do not limit
        return None


def _available_memory() -> float:
    try:
        import psutil

        return float(psutil.virtual_memory().available)
    except Exception:  # noqa: BLE001 - no psutil reading: do not limit
        return float("inf")


def read_state_meta(directory: Path) -> Optional[Dict[str, Any]]:
    """The ``state.json`` of a kept state, or ``None`` when ``directory`` holds none (``ValueError`` when it is
    not JSON: :func:`check_state` says why in one line)."""
    path = layout.state_meta(directory)
    if not path.is_file():
        return None
    meta = read_json(path)
    return meta if isinstance(meta, dict) and meta.get("schema") == STATE_SCHEMA else None


class Resumer:
    """A resumed pass: skip the training calls of the steps before the kept state's, then assign it.

    ``step`` is the 1-based global step the state was kept at (the first step that runs for real).
    """

    def __init__(self, directory: Path, *, fast_forward: bool = True):
        self.directory = Path(directory)
        self.fast_forward = fast_forward   # a Model.train call's dataset may be reset to the kept step (Run.fast_forward)
        self.fast_forwarded: Optional[int] = None   # steps it was reset past
        meta = read_state_meta(self.directory)
        if meta is None:
            raise HuntProtocolError(f"no kept training state in {str(self.directory)!r} (state.json missing or "
                                    f"of another schema): the hunt's resume request is stale")
        self.meta = meta
        self.step = int(meta["step"])
        self.loaded = False
        self.started: Optional[float] = None   # time.monotonic() of the first step (skipped or not)
        self.trace: Dict[str, List[Optional[str]]] = meta.get("trace") or {}
        self._outputs = placeholder(meta.get("outputs"))
        self._swapped: List[Tuple[Any, type]] = []
        self.random_restored: List[str] = []   # the random sources load() restored (mindguard.training.rng)

    def diverges(self, step: int, trace: List[Optional[str]]) -> Optional[str]:
        """Why step ``step`` of this run differs from the run that kept the state, or ``None`` (same, or unknown);
        with the random sources the kept state could not hold, and their fix, when it names any."""
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

        def skipped_call(self, *args, **kwargs):
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
        expected = self.meta.get("sha256")
        if expected is not None and file_sha256(layout.state_arrays(self.directory)) != expected:
            arrays = layout.state_arrays(self.directory)
            raise HuntProtocolError(f"{str(arrays)!r} is not the file state.json (global step "
                                    f"{self.step}) was written with (its checksum differs: replaced by another "
                                    f"state, or damaged); run the hunt again, or with --resume never")
        with np.load(layout.state_arrays(self.directory), allow_pickle=False) as arrays:
            stored_rng = {name: arrays[name] for name in arrays.files if name.startswith(_rng.ARRAY_PREFIX)}
            values = (_checkpoint_values(self.meta, names) if self.meta.get("checkpoint")
                      else [arrays[f"p{i}"] for i in range(len(names))])
        shapes = shapes if shapes is not None else [list(v.shape) for v in values]
        for param, value, shape in zip(params, values, shapes):
            if list(param.shape) != list(shape):
                raise HuntProtocolError(f"the kept training state does not fit this run: {param.name} has shape "
                                        f"{list(param.shape)} here, {shape} when it was kept")
        for param, value in zip(params, values):
            if param.dtype == ms.bfloat16:   # no bfloat16 Assign kernel on CPU; nothing is compiled yet here
                param.set_data(ms.Tensor(value, dtype=param.dtype))
            else:
                ms.ops.assign(param, ms.Tensor(value, dtype=param.dtype))
        self.random_restored = restore_random_state(self.meta, stored_rng)
        self.loaded = True


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


def describe_state(meta: Dict[str, Any]) -> str:
    checkpoint = meta.get("checkpoint") or {}
    source = f", the training's checkpoint {Path(checkpoint['path']).name}" if checkpoint.get("path") else ""
    return (f"global step {meta.get('step')} ({len(meta.get('names') or [])} Parameters, "
            f"{(meta.get('bytes') or 0) / 1e6:.1f} MB{source})")



# -- a kept state's place, identity and validation (an always-on Guard's states, `mindguard hunt --from`) ----------
def claim_run_states(folder: Path) -> Optional[int]:
    """Create run ``folder`` (:func:`mindguard.protocol.folder.run_states`) and hold its lock for the process's
    life (the kernel lets go of it however the process ends); then clean the states folder of what dead runs
    left that nothing names (:func:`clean_stale_states`). Returns the lock's descriptor (``None``: no lock could
    be taken; the run keeps its states all the same)."""
    from .recorder import _lock

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    fd, _ = _lock(layout.run_lock(folder))   # held before anything else: another starting run sees this one live
    try:
        clean_stale_states(folder.parent, keep=folder.name)
    except OSError:
        pass
    return fd


def release_run_states(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def drop_run_states(folder: Path) -> None:
    """Remove a run's own state folder (it left nothing to hunt)."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.parent.rmdir()   # the states folder, when no other run keeps anything there
    except OSError:
        pass


def _names_of_kept_runs(states_root: Path) -> set:
    """The run ids (state-folder names) that a record beside ``states_root`` names: the usual record and every
    record kept under a run id (its ``run_id``, ``states`` and ``kept_state``)."""
    from ..protocol.record import _record_document

    usual = states_root.with_name(states_root.name[:-len(layout.KEPT_STATES_SUFFIX)] + ".json")
    named: set = set()
    for path in [usual, *states_root.parent.glob(layout.run_records_pattern(usual))]:
        try:
            data = _record_document(path)
        except Exception:  # noqa: BLE001 - an unreadable record names nothing
            continue
        if not isinstance(data, dict):
            continue
        for value in (data.get("run_id"), data.get("states"), (data.get("kept_state") or {}).get("path")):
            if isinstance(value, str) and value:
                named.add(value)
                try:
                    named.add(Path(value).relative_to(states_root).parts[0])
                except (ValueError, IndexError):
                    pass
    return named


def clean_stale_states(states_root: Path, *, keep: str = "") -> List[Path]:
    """The documented rule (docs/reference/run-folder.md): in ``<record>.state/``, a run's folder is removed when
    its run is dead (its lock is free) and no record beside names it (the run finished and its states were not
    removed, or its record was deleted: the user is done with it); in the folders of dead runs that records still
    name, the ``.tmp`` files a write cut short left are removed. ``keep``: the starting run's own folder. Returns
    what was removed."""
    from .recorder import held_by_a_live_run

    states_root = Path(states_root)
    if not states_root.is_dir():
        return []
    named = _names_of_kept_runs(states_root)
    removed: List[Path] = []
    for entry in sorted(states_root.iterdir()):
        if entry.name == keep or not entry.is_dir() or held_by_a_live_run(layout.run_lock(entry)) \
                or _process_alive(entry.name):
            continue
        if entry.name not in named and str(entry) not in named:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
            continue
        for leftover in entry.rglob("*.tmp"):
            try:
                leftover.unlink()
                removed.append(leftover)
            except OSError:
                pass
        for step in entry.glob(layout.kept_step_pattern()):   # a state whose write was cut short: never complete
            if step.is_dir() and not layout.state_meta(step).exists():
                shutil.rmtree(step, ignore_errors=True)
                removed.append(step)
    return removed


def _process_alive(run_id: str) -> bool:
    """True when the process a run id names (``<date>-<time>-<pid>``) exists: a run that made its folder and has
    not locked it yet is not a dead one (a reused pid only keeps a stale folder one start longer)."""
    tail = run_id.rsplit("-", 1)[-1]
    if not tail.isdigit() or run_id.count("-") != 2:
        return False
    try:
        os.kill(int(tail), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True


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
    return meta, None


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


def choose_kept_state(record: Dict[str, Any], upto: int) -> Tuple[Optional[Path], Optional[Dict[str, Any]], Optional[str]]:
    """The state ``mindguard hunt --from`` resumes ``record``'s failure from: ``(folder, state.json, note)``.

    The state the record names when it is complete, undamaged and the record's own (its run id and checksum);
    otherwise -- or when the record names none (the run was killed, or killed while writing it at the failure) --
    the last complete state of the run on disk (its ``states`` folder) kept at or before ``upto`` (the failure's
    first possible global step), and ``note`` says why; ``(None, None, why)`` when there is none."""
    kept = record.get("kept_state") if isinstance(record.get("kept_state"), dict) else {}
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
        if folder is not None:
            how = (f"{why}; resuming from the run's earlier state" if why else
                   "the record names no kept state (the run was killed, or killed while writing it); resuming from "
                   "the last complete state on disk")
            return folder, meta, f"{how}, kept at global step {meta['step']} ({folder})"
    if why is None and named is None:
        why = ("the run kept no training state (Guard keeps one about every second of training once its Parameters "
               "were checked finite, on one rank, with keep_state=True)")
    return None, None, why


def note_initial(keeper: "StateKeeper", params: Sequence[Any]) -> None:
    """Before a training call's first step: the values the script gave its small Parameters (learning rate, loss
    scale, ...), by name, kept with each state (``state.json``'s ``initial``) so a resumed run can name an edit of
    the script that the kept state overrides (:func:`overridden_edits`). First values win."""
    small = small_parameters(params)
    for param, value in zip(small, small_state(small)):
        keeper.initial.setdefault(param.name, value)


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
