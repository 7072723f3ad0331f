"""Writing the kept training state: a host copy (:class:`KeptState`) and its files, and :class:`StateWriter`, which
writes an on-disk keeper's states into ``<directory>/step-<N>/`` off the step's critical path (a thread of its own)
and keeps the last few folders. The rules of when are :mod:`mindguard.training.state.keep_schedule`; the coordinator
:class:`~mindguard.training.state.keeper.StateKeeper`; the file format :mod:`mindguard.training.state.state_files`.
Steps are 1-based, process-wide global steps; sizes are bytes, times seconds.
"""
from __future__ import annotations

import errno
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import AbstractSet, Any, Callable, Dict, List, Optional, Sequence, Set

import numpy as np

from . import rng as _rng
from .keep_schedule import disk_refusal, stale_states
from ..._util.io import _atomic_file, atomic_write_json, file_sha256, free_bytes
from ...protocol import folder as layout
from ...protocol.kept_state import STATE_SCHEMA
from .state_files import _host_copy, capture_random_state
from .warm_up import warm_up_kept


class KeptState:
    """A host copy of the training state at the beginning of global step ``step``."""

    def __init__(self, step: int, params: Sequence[Any], call: int = 1, *, reuse: Optional["KeptState"] = None,
                 unrestorable: Sequence[str] = (), loaded: Optional[Sequence[np.ndarray]] = None,
                 warm_up: int = 0) -> None:
        """``reuse``: an earlier copy no longer needed, whose buffers this copy overwrites where they fit;
        ``warm_up``: the steps before ``step`` a pass resumed from it runs for real
        (:mod:`mindguard.training.state.warm_up`);
        ``unrestorable``: the random sources of the step that no kept state can hold
        (:mod:`mindguard.training.state.rng`); ``loaded``: host arrays holding the Parameters' values already, apart
        from them (a resumed pass's state as
        loaded, :meth:`mindguard.training.state.resumer.Resumer.take_values`): held as the copy where they fit."""
        start = time.perf_counter()
        self.rng_arrays, self.rng_meta = capture_random_state(unrestorable)
        self.step = step
        self.call = call                        # the 1-based training call the step belongs to
        self.warm_up = warm_up_kept(warm_up, unrestorable)
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
            "warm_up": self.warm_up, "outputs": outputs, "copy_seconds": round(self.seconds, 6), "bytes": self.nbytes,
            "rng": self.rng_meta,
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

    from ...analysis.stats import full_scan

    big = [i for i, a in enumerate(arrays) if a.nbytes >= over]
    if not big:
        return {}
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="mindguard-summary") as pool:
        scans = list(pool.map(lambda i: full_scan(arrays[i])[0], big))
    return dict(zip(big, scans))


def _holds(value: np.ndarray, param: Any) -> bool:
    """Whether ``value`` can stand as the host copy of ``param`` (its shape and the dtype a copy would have, and a
    buffer a later copy may write into)."""
    from ..checks.params import numpy_dtype

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


def state_nbytes(params: Sequence[Any]) -> int:
    """The bytes of a host copy of ``params`` (float32, float64 kept as is)."""
    return sum(int(p.size) * np.dtype(np.float32).itemsize * (2 if str(p.dtype) == "Float64" else 1) for p in params)


class StateWriter:
    """An on-disk keeper's writes: each state into ``<directory>/step-<N>/`` (only the last ``keep_last`` folders
    stay), a copy's in a thread of its own (:meth:`write_async`), a state written from the Parameters' memory in two
    parts (:meth:`write_streamed` on the step's path, :meth:`finish_async` in the thread). A write that fails stops
    the writes (:meth:`give_up`, said once; ``problem``).

    ``fields(step)``: what every ``state.json`` says besides the state (read when written); ``outputs()``: the train
    network's output structure; ``on_written(seconds)``: told when a copy went to disk, and what it took."""

    def __init__(self, directory: Path, keep_last: int, *, fields: Callable[[int], Dict[str, Any]],
                 outputs: Callable[[], Any], on_written: Callable[[float], None]) -> None:
        self.directory, self.keep_last = Path(directory), keep_last
        self.fields, self.outputs, self.on_written = fields, outputs, on_written
        self.on_disk_states: Dict[int, Path] = {}   # global step -> its folder, on disk
        self.problem: Optional[str] = None          # why nothing more is written to disk (said once)
        self.thread: Optional[threading.Thread] = None   # the thread writing a state to disk

    def busy(self) -> bool:
        """A state is being written (its buffers are not to be reused until then)."""
        return self.thread is not None and self.thread.is_alive()

    def join(self) -> None:
        """Wait for a write in flight (at a failure: the state on disk is then complete)."""
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    def write_async(self, state: KeptState) -> None:
        """Write ``state`` to disk in a thread (:meth:`to_disk`); the keeper takes no other copy until it is done, so
        its buffers stay as they were copied."""
        self.thread = threading.Thread(target=self.to_disk, args=(state,), name="mindguard-state-writer")
        self.thread.start()

    def to_disk(self, state: KeptState, *, trace: Optional[Dict[int, List[Optional[str]]]] = None,
                timing: Optional[Dict[str, Any]] = None) -> Optional[Path]:
        """Write ``state`` to ``<directory>/step-<N>/`` and keep only the last ``keep_last`` folders there (``None``
        when it was not written: said by :meth:`give_up`)."""
        start = time.perf_counter()
        no_room = self.no_room_for(state.nbytes)
        if no_room is not None:
            self.give_up(no_room)
            return None
        try:
            folder = state.write(layout.kept_step(self.directory, state.step), outputs=self.outputs(),
                                 timing={**self.fields(state.step), **(timing or {})},
                                 trace=trace or {}, arrays=state.step not in self.on_disk_states)
        except (OSError, ValueError) as exc:
            self.give_up(f"{type(exc).__name__}: {exc}")
            return None
        self.on_disk_states[state.step] = folder
        self.drop_states(keep=self.keep_last)
        self.on_written(time.perf_counter() - start)
        return folder

    def write_streamed(self, state: KeptState) -> bool:
        """The arrays of ``state`` (views of the Parameters' memory) into ``<directory>/step-<N>/`` now -- the step
        waits for them; ``False`` (said) when they were not written: the folder is then gone."""
        folder = layout.kept_step(self.directory, state.step)
        no_room = self.no_room_for(state.nbytes)
        if no_room is not None:
            self.give_up(no_room)
            return False
        try:
            state.write_arrays(folder)
        except (OSError, ValueError) as exc:
            shutil.rmtree(folder, ignore_errors=True)
            self.give_up(f"{type(exc).__name__}: {exc}")
            return False
        return True

    def finish_async(self, state: KeptState, outputs: Any, timing: Dict[str, Any]) -> None:
        """The rest of a state written from the Parameters (:meth:`write_streamed`), in a thread of its own:
        ``state.json`` (checksum included), the older folders gone."""
        self.thread = threading.Thread(target=self._finish_streamed,
                                       args=(state, layout.kept_step(self.directory, state.step), outputs, timing),
                                       name="mindguard-state-writer")
        self.thread.start()

    def _finish_streamed(self, state: KeptState, folder: Path, outputs: Any, timing: Dict[str, Any]) -> None:
        """:meth:`finish_async`'s thread. Any error leaves no folder and stops the writes (said once)."""
        try:
            state.write(folder, outputs=outputs, arrays=False, timing=timing)
        except Exception as exc:  # noqa: BLE001 - in a thread of its own: said, never the training's end
            shutil.rmtree(folder, ignore_errors=True)
            bug = "" if isinstance(exc, OSError) else "; a mindguard bug"
            self.give_up(f"{type(exc).__name__}: {exc}{bug}")
            return
        self.on_disk_states[state.step] = folder
        self.drop_states(keep=self.keep_last)

    def drop_states(self, keep: int) -> None:
        """Remove the on-disk state folders but the ``keep`` newest."""
        for old in stale_states(self.on_disk_states, keep):
            shutil.rmtree(self.on_disk_states.pop(old), ignore_errors=True)

    def no_room_for(self, nbytes: int) -> Optional[str]:
        """Why a state of ``nbytes`` is not written to disk -- less than three times that free where ``directory``
        is (or will be; :func:`~mindguard.training.state.keep_schedule.disk_refusal`) --, or ``None``."""
        existing = self.directory
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        free = free_bytes(existing)
        if disk_refusal(nbytes, free) is not None:
            return f"{nbytes / 1e6:.1f} MB per state, {(free or 0) / 1e6:.0f} MB free on that disk"
        return None

    def give_up(self, why: str) -> None:
        """Write no more (``problem``), and say why."""
        self.problem = why
        print(f"mindguard: not writing the training state to {self.directory} ({why}); `mindguard hunt --from` "
              f"will use an earlier one or run from step 1. Free some disk, or pass Guard(keep_state=False) to stop "
              f"trying", file=sys.stderr, flush=True)
