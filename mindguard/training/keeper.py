"""Keeping the training state (:class:`StateKeeper`): host copies taken at the beginning of a step on a time
budget, written to disk off the step's critical path (a thread of its own), and the training's own checkpoints
(:class:`CheckpointPoint`) as resume points.

The record pass of a hunt keeps a copy from time to time; an always-on :class:`~mindguard.Guard` keeps one on disk
beside its record when it is at most :data:`MAX_EXTRA_MEMORY` of the process's resident memory. At a failure the
latest copy at or before the first possibly failing step is written (:meth:`StateKeeper.write`). The resuming side
is :mod:`mindguard.training.resumer`; the file format :mod:`mindguard.training.state_files`. Steps are 1-based,
process-wide global steps.
"""
from __future__ import annotations

import errno
import os
import shutil
import statistics
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import AbstractSet, Any, Callable, Deque, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from . import rng as _rng
from .agreed_keeps import AgreedKeeps
from .._util.io import _atomic_file, atomic_write_json, file_sha256, free_bytes
from ..protocol import folder as layout
from .state_files import (STATE_SCHEMA, _host_copy, _mindspore_version, capture_random_state, output_spec,
                          small_parameters, small_state)

#: the share of the training process's resident memory an always-on Guard's host copy of the state may take
MAX_EXTRA_MEMORY = 0.10
#: bytes a second a host copy into the buffers of the one before is assumed to take (measured: 12.8 GB/s on an idle
#: 2-core Xeon, 1.5-2 ms for 25.6 MB; ~1.2 GB/s for 15 MB between the steps of a training on a loaded one: the
#: slower, so that the copies keep to their budget)
REUSED_COPY_BYTES_PER_S = 1e9
#: the training's own checkpoints held as resume points besides the one a failure's window can always start from
MAX_CHECKPOINT_POINTS = 16
#: bytes a second a state written straight from the Parameters (:meth:`StateKeeper.stream`) is assumed to take
#: before one was timed (measured on a 2-core VM: 1.3 GB/s to its disk bypassing the page cache, ~4 GB/s into it;
#: ``np.savez``'s checksum makes it ~1 GB/s)
ASSUMED_WRITE_BYTES_PER_S = 1e9
#: a state written straight from the Parameters delays the step it begins by at most this many typical steps (the
#: median of the recent ones: the step takes at most 3x one); a longer write is not made
MAX_STALL_STEPS = 2.0
#: the run's first state written straight from the Parameters, at the first passing Parameter check (issue 51): before
#: a step's time is known (the second step: the first one compiled), a write estimated at most this many seconds and
#: at most FIRST_POINT_SHARE of the process's time to its first step's end (start, imports, compile) is made at once;
#: a longer one waits for the typical step and MAX_STALL_STEPS
FIRST_POINT_SECONDS = 0.5
#: an always-on Guard's copies in memory come at least every this share of the training since its first step ended
#: (below ``min_seconds``, within the copies' budget; each after a passing check): a young run's failure re-trains at
#: most its last tenth when its Parameters are checked that often (measured: a 60-step CNN failing at step 50, checked
#: every step, kept step 44 at 0.1 and step 50 in three runs at 0.05)
YOUNG_RUN_SHARE = 0.05
FIRST_POINT_SHARE = 0.1


class CheckpointPoint:
    """A checkpoint the training wrote itself (``ModelCheckpoint``), as the state at the beginning of global step
    ``step``: its Parameters are in the file, the random state was captured at that step's beginning."""

    def __init__(self, step: int, path: str, names: List[str], unrestorable: Sequence[str] = ()) -> None:
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



class KeptState:
    """A host copy of the training state at the beginning of global step ``step``."""

    def __init__(self, step: int, params: Sequence[Any], call: int = 1, *, reuse: Optional["KeptState"] = None,
                 unrestorable: Sequence[str] = (), loaded: Optional[Sequence[np.ndarray]] = None) -> None:
        """``reuse``: an earlier copy no longer needed, whose buffers this copy overwrites where they fit;
        ``unrestorable``: the random sources of the step that no kept state can hold (:mod:`mindguard.training.rng`);
        ``loaded``: host arrays holding the Parameters' values already, apart from them (a resumed pass's state as
        loaded, :meth:`mindguard.training.resumer.Resumer.take_values`): held as the copy where they fit."""
        start = time.perf_counter()
        self.rng_arrays, self.rng_meta = capture_random_state(unrestorable)
        self.step = step
        self.call = call                        # the 1-based training call the step belongs to
        self.dump_graphs: Dict[int, int] = {}   # the step's observed {graph: dump iteration}, when observed
        self.names = [p.name for p in params]
        buffers: Sequence[Optional[np.ndarray]] = (reuse.arrays if reuse is not None and reuse.names == self.names
                                                    else [None] * len(params))
        held: Sequence[Optional[np.ndarray]] = (loaded if loaded is not None and len(loaded) == len(params)
                                                 else [None] * len(params))
        self.arrays: List[np.ndarray] = [value if value is not None and _holds(value, p) else _host_copy(p, into)
                                         for p, value, into in zip(params, held, buffers)]
        self.seconds = time.perf_counter() - start
        self.nbytes = sum(a.nbytes for a in self.arrays)

    def write(self, directory: Path, *, outputs: Any, timing: Dict[str, Any],
              trace: Optional[Dict[int, List[Optional[str]]]] = None, arrays: bool = True,
              summarize_over: Optional[int] = None) -> Path:
        """Write this state to ``directory`` (``state.npz`` first, then ``state.json``: a folder with a json has
        both; ``arrays=False``: the folder holds them already, only the json is written again, with the trace).
        ``summarize_over``: arrays of at least this many bytes are written as their statistics only
        (:func:`summarized_arrays`; ``state.json``'s ``summarized``): the state then serves its step's analysis,
        never a resume. Returns ``directory``."""
        directory = Path(directory)
        summarized = summarized_arrays(self.arrays, summarize_over) if summarize_over is not None else {}
        if arrays:
            self.write_arrays(directory, leave_out=set(summarized))
        files = {str(i): {"sha256": file_sha256(layout.state_array_file(directory, i)), "bytes": self.arrays[i].nbytes}
                 for i in sorted(self.raw_files - set(summarized))}
        atomic_write_json(layout.state_meta(directory), {
            "schema": STATE_SCHEMA, "step": self.step, "names": self.names,
            # a state.npz (or p<i>.npy) of another step or run is refused on load
            "sha256": file_sha256(layout.state_arrays(directory)), **({"files": files} if files else {}),
            "shapes": [list(a.shape) for a in self.arrays], "dtypes": [str(a.dtype) for a in self.arrays],
            "call": self.call, "dump_graphs": {str(g): it for g, it in self.dump_graphs.items()},
            "outputs": outputs, "copy_seconds": round(self.seconds, 6), "bytes": self.nbytes, "rng": self.rng_meta,
            **({"summarized": {str(i): stats for i, stats in sorted(summarized.items())}} if summarized else {}),
            "trace": {str(k): v for k, v in sorted((trace or {}).items()) if k >= self.step}, **timing})
        return directory


    def write_arrays(self, directory: Path, leave_out: AbstractSet[int] = frozenset()) -> None:
        """Write the arrays but those at ``leave_out``: each of :data:`RAW_ARRAY_BYTES` or more to ``p<i>.npy`` of its
        own (raw bytes after numpy's header), the others and the random state to ``state.npz``; every file atomic,
        ``state.npz`` last. ``OSError`` (``ENOSPC``) before anything is written when the disk cannot hold them."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        stored = [(i, a) for i, a in enumerate(self.arrays) if i not in leave_out]
        nbytes = sum(a.nbytes for _, a in stored)
        free = free_bytes(directory)
        if free is not None and free < nbytes + (1 << 20):   # refused before numpy's zip half-writes it
            no_space = OSError(errno.ENOSPC, f"No space left on device ({free} bytes free, {nbytes} needed)",
                               str(directory))
            # the OS's own error, early: the caller handles it as the write's (run_state.RunState.write_at_failure)
            raise no_space
        raw = self.raw_files
        for i, array in stored:
            if i in raw:
                with _atomic_file(layout.state_array_file(directory, i)) as f:
                    np.lib.format.write_array(f, np.ascontiguousarray(array), allow_pickle=False)
        with _atomic_file(layout.state_arrays(directory)) as f:
            np.savez(f, **{f"p{i}": a for i, a in stored if i not in raw},
                     **{_rng.ARRAY_PREFIX + k: a for k, a in self.rng_arrays.items()})

    @property
    def raw_files(self) -> Set[int]:
        """The indexes of the arrays written to files of their own (:data:`RAW_ARRAY_BYTES` or more)."""
        return {i for i, a in enumerate(self.arrays) if a.nbytes >= RAW_ARRAY_BYTES}


#: arrays of this many bytes or more are written to files of their own (``p<i>.npy``: numpy's header, then the raw
#: bytes) rather than into ``state.npz``, whose zip checksums every byte: 1 GB took 0.29 s raw against 0.85-2.3 s as
#: a zip member here, and a raw file is read memory-mapped (docs/mindspore-facts.md, round 11)
RAW_ARRAY_BYTES = 16 << 20

#: a state written for its own step's analysis (a dumped failing step) keeps arrays of this many bytes or more as
#: their statistics: the analysis reads nothing else of them, and a 1 GB state's write took 1.6-4.9 s at the end of a
#: hunt's pass against 0.3-0.7 s for the statistics (docs/benchmarks.md, issue 38)
SUMMARIZE_OVER_BYTES = 16 << 20


def summarized_arrays(arrays: Sequence[np.ndarray], over: int) -> Dict[int, Dict[str, Any]]:
    """``{index: statistics}`` of the arrays of at least ``over`` bytes, as a dump's statistic file gives them
    (:func:`mindguard.analysis.stats.full_scan`: shape, dtype, finite min/max, zero/NaN/Inf counts), computed two at
    a time (numpy's scans release the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from ..analysis.stats import full_scan

    big = [i for i, a in enumerate(arrays) if a.nbytes >= over]
    if not big:
        return {}
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="mindguard-summary") as pool:
        scans = list(pool.map(lambda i: full_scan(arrays[i])[0], big))
    return dict(zip(big, scans))


def _holds(value: np.ndarray, param: Any) -> bool:
    """Whether ``value`` can stand as the host copy of ``param`` (its shape and the dtype a copy would have, and a
    buffer a later copy may write into)."""
    from .params import numpy_dtype

    try:
        dtype = np.dtype(np.float32) if str(param.dtype) == "BFloat16" else numpy_dtype(param.dtype)
    except (TypeError, ValueError, KeyError):
        return False
    return (isinstance(value, np.ndarray) and tuple(value.shape) == tuple(param.shape) and value.dtype == dtype
            and value.flags.writeable and value.flags.c_contiguous)


def host_views(params: Sequence[Any]) -> Optional[List[np.ndarray]]:
    """Every Parameter's values as a numpy view of its own memory (CPU: ``asnumpy()`` shares it), each able to stand
    as its host copy (:func:`_holds`); ``None`` on another device or when any is not (bfloat16): then only a copy
    could be written."""
    mindspore = sys.modules.get("mindspore")
    try:
        on_cpu = mindspore is not None and mindspore.get_context("device_target") == "CPU"
    except Exception:  # noqa: BLE001 - a context mindguard cannot read: no view assumed
        on_cpu = False
    if not on_cpu:   # (a device's asnumpy() fills a host buffer of the tensor's own: a copy, whatever its flags)
        return None
    views = []
    for param in params:
        try:
            view = param.asnumpy()
        except Exception:  # noqa: BLE001 - a Parameter numpy cannot view: no view to write from
            return None
        if view.flags.owndata or not _holds(view, param):
            return None
        views.append(view)
    return views


def process_started() -> Optional[float]:
    """When this process started (``time.time()`` seconds; ``None`` when the system does not say): with
    ``first_step_end`` it tells what a new process costs before its first step -- start, imports, the script's setup,
    the compile (:func:`mindguard.hunt.plan.dump_while_locating` weighs a second pass by it)."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:  # noqa: BLE001 - a fact to note when it can be had, never a reason to fail
        return None


class StateKeeper:
    """Copies of the training state (see the module docstring), kept on a time budget.

    A host copy is taken at the beginning of a step when ``every_steps`` steps passed since the last one, or --
    without ``every_steps`` -- when ``max(min_seconds, copy cost / budget)`` seconds did, so that copying costs at
    most ``budget`` of the training time. ``steps``: keep exactly at these steps instead (a locate pass keeps each
    step of a failure's window). Only the latest copy is held in memory, and written at the failure.

    ``on_disk`` (an always-on :class:`~mindguard.Guard` outside the hunt, beside its record): the caller keeps only
    states whose Parameters were just checked finite (:meth:`mindguard.training.run.Run.begin_step`), the first as
    early as
    it can; copies and disk writes then share ``budget`` half and half. From ``disk_seconds`` after the keeper
    starts, and then at least ``disk_seconds`` apart, the copy is also written to ``<directory>/step-<N>/``
    (``state.npz`` then ``state.json``, each atomic; only the last ``keep_last`` folders stay), so a run killed at
    any later moment (SIGKILL, the OOM killer) still leaves a usable state; one killed sooner has none, and its hunt
    re-trains those few seconds from step 1. At a failure the latest copy is written there too: the examination
    then starts at most a copy interval before the window.

    A state too big to copy (:meth:`_fits`) is, on CPU, written to disk straight from the Parameters' own memory
    instead (:meth:`stream`, ``streaming``): no copy at all, but the step it begins waits for ``state.npz``, so it is
    written only when that takes at most :data:`MAX_STALL_STEPS` typical steps, on ``budget`` of the training time and
    at least ``disk_seconds`` after the last resume point (its own, or the training's own checkpoint).
    """

    run_id: Optional[str] = None   # the run whose states these are (written into each state.json; on_disk)
    agreed: Optional[AgreedKeeps] = None   # several ranks: the steps every rank keeps at (on_disk; agreed_keeps.py)

    def __init__(self, directory: Path, *, every_steps: Optional[int] = None, steps: Iterable[int] = (),
                 min_seconds: float = 10.0, budget: float = 0.005, on_disk: bool = False, keep_last: int = 2,
                 disk_seconds: float = 30.0) -> None:
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
        self._checked_points: Set[int] = set()   # checkpoint points a Parameter check was asked to follow
        self._nbytes: Optional[Tuple[Sequence[Any], int]] = None   # (the Parameters kept, the bytes of their copy)
        self.streaming = False   # the state is written from the Parameters' memory, never copied (stream)
        self.max_stall_steps = MAX_STALL_STEPS
        self._write_rate = ASSUMED_WRITE_BYTES_PER_S   # bytes/s of the last state streamed (assumed until then)
        self._streamed: Optional[KeptState] = None   # the last state streamed: views, for its state.json only
        self._stall_said = False
        self._point_time = -float("inf")   # _clock() when the training's own checkpoint last became a resume point
        self._recent_steps: Deque[float] = deque(maxlen=15)   # the last steps' wall times (s): typical_step
        self._last_end: Optional[Tuple[int, float]] = None    # (step, time.time()) of the last step's end

    def due(self, step: int) -> bool:
        if self.steps:
            return step in self.steps
        if step <= 1:
            return False   # step 1 starts from what the script builds: nothing to keep
        if self.streaming:
            return self._stream_due()
        if self.on_disk and self.refused_for_memory:
            return False   # said once; the training's own checkpoints are its resume points (note_checkpoints)
        if self._writer is not None and self._writer.is_alive():
            return False   # the copy in memory is being written: its buffers are not reused until then
        if self.on_disk and not self.kept:
            return True    # the first state as early as it can be checked: a failure at any later step can resume
        if self.every_steps is not None:
            return step - self._last_step >= self.every_steps
        floor = self.min_seconds
        if self.on_disk and self.first_step_end is not None:   # a young run: a copy at least every YOUNG_RUN_SHARE of
            # its training so far (issue 51), so a failure re-trains at most that share -- on the copies' budget
            floor = min(floor, YOUNG_RUN_SHARE * max(time.time() - self.first_step_end, 0.0))
        interval = max(floor, self._copy_seconds / self._copy_budget)
        return self._clock() - self._last_time >= interval

    def disk_due(self) -> bool:
        """Whether a copy taken now would also be written to disk (the time rule of :meth:`keep`)."""
        return self.on_disk and self.problem is None and self._clock() - self._disk_time >= max(
            self.disk_seconds, self._write_seconds / (self.budget - self._copy_budget))

    def ready(self) -> bool:
        """A copy can be taken now: none is being written and memory never refused one (several ranks keep only when
        every rank is ready: :mod:`mindguard.training.agreed_keeps`)."""
        return not self.refused_for_memory and not (self._writer is not None and self._writer.is_alive())

    def keep(self, step: int, params: Sequence[Any], call: int = 1, cells: Sequence[Any] = (),
             to_disk: Optional[bool] = None, loaded: Optional[Sequence[np.ndarray]] = None) -> None:
        """Copy the state at the beginning of ``step`` (``params``; ``cells``: the cells they belong to, searched
        once for random sources no kept state can hold -- named on stderr once when on disk, before any failure),
        unless the copy does not fit (:meth:`_fits`: then nothing is kept; said once). On disk, the copy is
        written in a thread of its own (:meth:`_write_async`): the step does not wait for the disk. ``to_disk``: as
        every rank agreed (several ranks), instead of this process's own time rule (:meth:`disk_due`). ``loaded``:
        the Parameters' values as a resumed pass loaded them at this step, held instead of a copy
        (:class:`KeptState`)."""
        if self._nbytes is None or self._nbytes[0] is not params:   # once per list of Parameters (a call's)
            self._nbytes = (params, state_nbytes(params))
        nbytes = self._nbytes[1]
        if self.streaming:
            self.stream(step, params, call, cells)
            return
        too_big = self._fits(nbytes)
        if too_big is not None and self.on_disk and self.agreed is None and not self.refused_for_memory \
                and host_views(params) is not None:
            self.streaming = True
            self._join_writer()
            self.kept = {}   # an earlier copy (a smaller call's state, more memory then) is older than what follows
            print(f"mindguard: not keeping the training state ({nbytes / 1e9:.2f} GB) in memory: {too_big}; writing "
                  f"it to disk straight from the Parameters instead, when that delays a step by at most "
                  f"{self.max_stall_steps:g} typical steps and at least {self.disk_seconds:g} s of training after the "
                  f"last resume point (the training's own checkpoints are resume points too)", file=sys.stderr,
                  flush=True)
            if self._stream_due():   # the first point: now, when the check before this step passed (the caller's rule)
                self.stream(step, params, call, cells)
            return
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
        state = KeptState(step, params, call, reuse=previous, unrestorable=self._unrestorable(cells), loaded=loaded)
        self.kept = {step: state}
        self.trace = {k: v for k, v in self.trace.items() if k >= step}
        self._last_step, self._last_time = step, self._clock()
        # what the next copy costs: this one's, or -- the first, which allocated its buffers (3-48 ms for 25.6 MB,
        # 1.5-2 ms into reused ones) -- at most the reused rate's; priced at the allocation, the next copy of a fast
        # small model was due only seconds later, past the rare check it must follow, and a late failure resumed early
        self._copy_seconds = state.seconds if previous is not None else min(state.seconds,
                                                                            nbytes / REUSED_COPY_BYTES_PER_S)
        self.seconds += state.seconds
        if (self.disk_due() if to_disk is None else to_disk and self.on_disk and self.problem is None):
            self._write_async(state)

    def _stream_due(self) -> bool:
        """Whether a state written from the Parameters now (:meth:`stream`) keeps to the rules in the class docstring:
        none is being written, the write's estimate (its size at the last write's rate) delays the step by at most
        ``max_stall_steps`` typical steps (:meth:`typical_step`; said once when it would not), and the budget and
        ``disk_seconds`` passed."""
        if self.problem is not None or self._nbytes is None or (self._writer is not None and self._writer.is_alive()):
            return False
        estimate = self._nbytes[1] / self._write_rate
        step = self.typical_step()
        if not self.on_disk_states and self._streamed is None and not self.checkpoints:
            # the run's first resume point, as early as a check passed (issue 51): no wait for disk_seconds or the
            # budget -- only the stall rule, and before a step's time is known, a write of at most FIRST_POINT_SECONDS
            # and FIRST_POINT_SHARE of what the process took to its first step's end
            if step is None:
                started = process_started()
                before = (self.first_step_end - started if self.first_step_end is not None and started is not None
                          else None)
                if before is not None and estimate <= min(FIRST_POINT_SECONDS, FIRST_POINT_SHARE * before):
                    return True
            elif estimate <= self.max_stall_steps * step:
                return True
        if step is not None and estimate > self.max_stall_steps * step:
            if not self._stall_said:
                self._stall_said = True
                print(f"mindguard: not writing the training state ({self._nbytes[1] / 1e9:.2f} GB) from the "
                      f"Parameters for now: ~{estimate:.2f} s would delay a {step:.3f} s step more than "
                      f"{self.max_stall_steps:g}x; `mindguard hunt --from` resumes from the training's own checkpoints "
                      f"when it writes them", file=sys.stderr, flush=True)
            return False
        since = self._clock() - max(self._disk_time, self._point_time)
        return since >= max(self.disk_seconds, estimate / self.budget)

    def stream(self, step: int, params: Sequence[Any], call: int = 1, cells: Sequence[Any] = ()) -> None:
        """Write the state at the beginning of ``step`` to ``<directory>/step-<N>/`` straight from the Parameters'
        memory (:func:`host_views`; no copy): ``state.npz`` now -- the step waits for it --, its checksum and
        ``state.json`` in a thread of their own (the file no longer changes), then only the last ``keep_last``
        folders stay. A failure later joins that thread and writes the json again with the trace since."""
        views = host_views(params)
        if views is None:
            self._give_up("the Parameters are no longer host memory it can write from")
            return
        # the oldest folder goes first (the newest stays whole): its pages in the OS's cache are then what the new
        # files are written into, where new memory for them was 10-20x slower beside a training (round 11 facts)
        self._drop_states(keep=max(self.keep_last - 1, 1))
        start = time.perf_counter()
        state = KeptState(step, params, call, unrestorable=self._unrestorable(cells), loaded=views)
        folder = layout.kept_step(self.directory, step)
        no_room = self._no_room_for(state.nbytes)
        if no_room is not None:
            self._give_up(no_room)
            return
        try:
            state.write_arrays(folder)
        except (OSError, ValueError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self._give_up(f"{type(exc).__name__}: {exc}")
            return
        seconds = time.perf_counter() - start
        self._write_rate = state.nbytes / max(seconds, 1e-6)
        self.seconds += seconds
        self._write_seconds = seconds
        self._disk_time = self._clock()
        self._last_step, self._last_time = step, self._clock()
        self.trace = {k: v for k, v in self.trace.items() if k >= step}
        self._streamed = state
        timing = {**self._checked_fields(state.step), "written_from": "parameters"}
        self._writer = threading.Thread(target=self._finish_streamed, args=(state, folder, self.outputs, timing),
                                        name="mindguard-state-writer")
        self._writer.start()

    def _finish_streamed(self, state: "KeptState", folder: Path, outputs: Any, timing: Dict[str, Any]) -> None:
        """The rest of :meth:`stream`, in its thread: ``state.json`` (checksum included), the older folders gone.
        Any error leaves no folder and stops the writes (said once)."""
        try:
            state.write(folder, outputs=outputs, arrays=False, timing=timing)
        except Exception as exc:  # noqa: BLE001 - in a thread of its own: said, never the training's end
            shutil.rmtree(folder, ignore_errors=True)
            bug = "" if isinstance(exc, OSError) else "; a mindguard bug"
            self._give_up(f"{type(exc).__name__}: {exc}{bug}")
            return
        self.on_disk_states[state.step] = folder
        self._drop_states(keep=self.keep_last)

    def _drop_states(self, keep: int) -> None:
        """Remove the on-disk state folders but the ``keep`` newest."""
        for old in sorted(self.on_disk_states)[:-keep]:
            shutil.rmtree(self.on_disk_states.pop(old), ignore_errors=True)

    def _no_room_for(self, nbytes: int) -> Optional[str]:
        """Why a state of ``nbytes`` is not written to disk -- less than three times that free where ``directory``
        is (or will be) --, or ``None``."""
        existing = self.directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = free_bytes(existing)
        if free is not None and nbytes * 3 > free:
            return f"{nbytes / 1e6:.1f} MB per state, {free / 1e6:.0f} MB free on that disk"
        return None

    def _checked_fields(self, step: int) -> Dict[str, Any]:
        """What every ``state.json`` of this on-disk keeper says besides the state: that its Parameters were checked
        finite before global step ``step``, the run's id and the script's first small values."""
        return {"verified": f"every Parameter checked finite after global step {step - 1}", "run_id": self.run_id,
                "initial": dict(self.initial)}

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
        no_room = self._no_room_for(state.nbytes)
        if no_room is not None:
            self._give_up(no_room)
            return None
        try:
            folder = state.write(layout.kept_step(self.directory, state.step), outputs=self.outputs,
                                 timing={**self._checked_fields(state.step), **(timing or {})},
                                 trace=trace or {}, arrays=state.step not in self.on_disk_states)
        except (OSError, ValueError) as exc:
            self._give_up(f"{type(exc).__name__}: {exc}")
            return None
        self.on_disk_states[state.step] = folder
        self._drop_states(keep=self.keep_last)
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
                print(f"mindguard: {note}",
                      file=sys.stderr, flush=True)
            if found and self.on_unrestorable is not None:
                self.on_unrestorable(found)
        compiled = [s for s in _rng.compiled_random_functions() if s not in self._random_sources[key]]
        if compiled:   # random functions compiled into a graph since the last look (the first step compiles)
            self._random_sources[key] = self._random_sources[key] + compiled
            note = _rng.describe_unrestorable(compiled, _mindspore_version())
            if self.on_disk:
                print(f"mindguard: {note}",
                      file=sys.stderr, flush=True)
            if self.on_unrestorable is not None:
                self.on_unrestorable(compiled)
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
        if self._last_end is not None and step == self._last_end[0] + 1:
            self._recent_steps.append(now - self._last_end[1])
        self._last_end = (step, now)
        if step == 1 or self.first_step_end is None:
            self.first_step_end, self._first = now, step
        elif step > self._first:
            self.step_seconds = (now - self.first_step_end) / (step - self._first)

    def costs(self, params: Sequence[Any] = ()) -> Dict[str, Any]:
        """What a new process of this run costs before its first step ends, and the state's size (the failure
        record's ``costs``: ``mindguard hunt --from`` weighs one pass against two by it). ``params``: the Parameters
        kept, for their size when no state was taken yet."""
        nbytes = self._nbytes[1] if self._nbytes is not None else (state_nbytes(params) if params else None)
        return {"process_started": process_started(), "first_step_end": self.first_step_end,
                "step_seconds": self.step_seconds, "state_bytes": nbytes}

    def typical_step(self) -> Optional[float]:
        """The median of the recent steps' wall times (s, end to end, callbacks included), ``None`` before two
        steps ended: what a step takes when the training's own checkpoint or evaluation does not stall it."""
        return statistics.median(self._recent_steps) if self._recent_steps else None

    def note_trace(self, step: int, trace: List[Optional[str]]) -> None:
        """What a step computed (its loss, the sum of squares of the Parameters after it when it was checked, the
        small Parameters before it), kept for the steps since the kept state or checkpoint: a resumed pass must
        compute the same."""
        starts = self._resume_points()
        if starts and step >= min(starts):
            self.trace[step] = trace

    def _resume_points(self) -> List[int]:
        """The steps a failure may resume from: the copy in memory, the training's checkpoints, the state last
        written from the Parameters."""
        return list(self.kept) + list(self.checkpoints) + ([self._streamed.step] if self._streamed else [])

    def checkpoint_to_check(self, step: int) -> bool:
        """Whether the Parameters are to be checked at the end of 1-based global step ``step`` because the training's
        own checkpoint became a resume point at this step (:meth:`note_checkpoints`) and no check followed it yet.
        Checked finite after its step, the state it holds was finite too (Inf/NaN stays): a failure's window starts
        after that check and resumes from the file, which is never read back (a dying process does not load a
        checkpoint of the model's size; a time-triggered ``ModelCheckpoint`` is covered as well). Once per
        checkpoint."""
        newest = max(self.checkpoints, default=None)
        if newest is None or newest > step or newest in self._checked_points:
            return False
        self._checked_points.add(newest)
        return True

    def note_checkpoints(self, step: int, saved: Sequence[str], cells: Sequence[Any], params: Sequence[Any],
                         verified_after: Optional[int] = None) -> None:
        """At the beginning of global step ``step``: ``saved``, the files the training's ``ModelCheckpoint`` wrote at
        the end of the step before (as the run's :class:`~mindguard.training.user_checkpoints.CheckpointLog` saw
        them), are a resume point for ``step`` (the random state is captured now). Held
        (:meth:`_drop_old_checkpoints`): the latest point at or before ``verified_after + 1`` (the Parameters were last
        checked finite after global step ``verified_after``: a failure's window starts after it and resumes from that
        point; a Parameter check follows each new point, :meth:`checkpoint_to_check`) and the
        :data:`MAX_CHECKPOINT_POINTS` latest."""
        if self._checkpoints_broken:
            return
        try:
            for path in saved:
                if step in self.checkpoints:
                    continue
                self.checkpoints[step] = CheckpointPoint(step, path, [p.name for p in params],
                                                         self._unrestorable(cells))
                self._point_time = self._clock()
                self._drop_old_checkpoints(verified_after)
                self.trace = {k: v for k, v in self.trace.items() if k >= min(self._resume_points())}
        except Exception as bug:  # noqa: BLE001 - mindguard's own failure never ends the training
            self._checkpoints_broken = True
            print(f"mindguard: the training's checkpoints are not used as resume points ({type(bug).__name__}: "
                  f"{bug}; a mindguard bug): the kept states still are", file=sys.stderr, flush=True)

    def _drop_old_checkpoints(self, verified_after: Optional[int]) -> None:
        """Forget the checkpoint points no failure can resume from: all but the latest one at or before the step
        after the last passing Parameter check and the :data:`MAX_CHECKPOINT_POINTS` latest (each holds only the
        random state of its step)."""
        steps = sorted(self.checkpoints)
        held = set(steps[-MAX_CHECKPOINT_POINTS:])
        verified = [s for s in steps if s <= (verified_after or 0) + 1]
        if verified:
            held.add(verified[-1])
        for old in steps:
            if old not in held:
                del self.checkpoints[old]

    def write(self, upto_step: int, dumped_step: Optional[int] = None) -> Optional[Path]:
        """Write the latest copy taken at or before ``upto_step`` (once), with the trace since it; ``None`` when
        there is none. On disk: into ``<directory>/step-<N>/`` (or the latest folder written before, when the copy
        in memory is past ``upto_step`` or cannot be written). ``dumped_step``: a global step whose dump is on disk
        already; a copy of exactly that step (a hunt pass's, not on disk) keeps its big arrays as statistics
        (:data:`SUMMARIZE_OVER_BYTES`): it serves that dump's analysis only."""
        if self.written is not None:
            return self.written
        self._join_writer()
        timing = {"first_step_end": self.first_step_end, "step_seconds": self.step_seconds,
                  "process_started": process_started()}
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
                self.written = state.write(self.directory, outputs=self.outputs, timing=timing, trace=self.trace,
                                           summarize_over=SUMMARIZE_OVER_BYTES if state.step == dumped_step
                                           else None)
        if self.written is None and self.on_disk:
            earlier = [s for s in self.on_disk_states if s <= upto_step]
            self.written = self.on_disk_states[max(earlier)] if earlier else None
            streamed = self._streamed
            if self.written is not None and streamed is not None and streamed.step == max(earlier):
                try:   # its json again, with the trace since (its arrays are on disk; the views changed since)
                    streamed.write(self.written, outputs=self.outputs, arrays=False, trace=self.trace, timing={
                        **self._checked_fields(streamed.step), "written_from": "parameters", **timing})
                except (OSError, ValueError):
                    pass   # the json written with it stands: a resumed pass then compares no trace
        return self.written


def state_nbytes(params: Sequence[Any]) -> int:
    """The bytes of a host copy of ``params`` (float32, float64 kept as is)."""
    return sum(int(p.size) * np.dtype(np.float32).itemsize * (2 if str(p.dtype) == "Float64" else 1) for p in params)


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

def note_initial(keeper: "StateKeeper", params: Sequence[Any]) -> None:
    """Before a training call's first step: the values the script gave its small Parameters (learning rate, loss
    scale, ...), by name, kept with each state (``state.json``'s ``initial``) so a resumed run can name an edit of
    the script that the kept state overrides (:func:`overridden_edits`). First values win."""
    small = small_parameters(params)
    for param, value in zip(small, small_state(small)):
        keeper.initial.setdefault(param.name, value)

