"""Keeping the training state (:class:`StateKeeper`): host copies taken at the beginning of a step on a time
budget, written to disk off the step's critical path (a thread of its own), and the training's own checkpoints
(:class:`CheckpointPoint`) as resume points.

The record pass of a hunt keeps a copy from time to time; an always-on :class:`~mindguard.Guard` keeps one on disk
beside its record when it is at most :data:`MAX_EXTRA_MEMORY` of the process's resident memory. At a failure the
latest copy at or before the first possibly failing step is written (:meth:`StateKeeper.write`). :class:`StateKeeper`
coordinates: the rules of when, and of memory and disk, are :mod:`mindguard.training.state.keep_schedule` (pure); the
writing :mod:`mindguard.training.state.state_writer`; the checkpoint points
:mod:`mindguard.training.state.checkpoint_points`; the random sources no state holds
:mod:`mindguard.training.state.random_sources`. The resuming side is
:mod:`mindguard.training.state.resumer`; the file format :mod:`mindguard.training.state.state_files`. Steps are 1-based,
process-wide global steps; times are seconds, sizes bytes.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from .agreed_keeps import AgreedKeeps
from ...protocol import folder as layout
from .checkpoint_points import CheckpointPoint, CheckpointPoints
from .keep_schedule import (
    ASSUMED_WRITE_BYTES_PER_S,
    FIRST_POINT_SECONDS,
    FIRST_POINT_SHARE,
    MAX_CHECKPOINT_POINTS,
    MAX_EXTRA_MEMORY,
    MAX_STALL_STEPS,
    REUSED_COPY_BYTES_PER_S,
    YOUNG_RUN_SHARE,
    KeepSchedule,
    StepPace,
    describe_memory,
    failure_sources,
    memory_refusal,
    resume_points,
)
from .random_sources import RandomSources
from .state_files import output_spec, small_parameters, small_state
from .state_writer import (
    RAW_ARRAY_BYTES,
    SUMMARIZE_OVER_BYTES,
    KeptState,
    StateWriter,
    host_views,
    state_nbytes,
    summarized_arrays,
)

__all__ = ["ASSUMED_WRITE_BYTES_PER_S", "FIRST_POINT_SECONDS", "FIRST_POINT_SHARE", "MAX_CHECKPOINT_POINTS",
           "MAX_EXTRA_MEMORY", "MAX_STALL_STEPS", "RAW_ARRAY_BYTES", "REUSED_COPY_BYTES_PER_S", "SUMMARIZE_OVER_BYTES",
           "YOUNG_RUN_SHARE", "CheckpointPoint", "KeptState", "StateKeeper", "host_views", "note_initial",
           "process_started", "state_nbytes", "summarized_arrays"]


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

    A state too big to copy (:func:`_fits`) is, on CPU, written to disk straight from the Parameters' own memory
    instead (:meth:`stream`, ``schedule.streaming``): no copy at all, but the step it begins waits for
    ``state.npz``, so it is written only when that takes at most :data:`MAX_STALL_STEPS` typical steps, on ``budget``
    of the training time and at least ``disk_seconds`` after the last resume point (its own, or the training's own
    checkpoint). The rules are :class:`~mindguard.training.state.keep_schedule.KeepSchedule`'s (``schedule``: its
    options and times), the writes :class:`~mindguard.training.state.state_writer.StateWriter`'s (``writer``).
    """

    run_id: Optional[str] = None   # the run whose states these are (written into each state.json; on_disk)
    agreed: Optional[AgreedKeeps] = None   # several ranks: the steps every rank keeps at (on_disk; agreed_keeps.py)

    def __init__(self, directory: Path, *, every_steps: Optional[int] = None, steps: Iterable[int] = (),
                 min_seconds: float = 10.0, budget: float = 0.005, on_disk: bool = False, keep_last: int = 2,
                 disk_seconds: float = 30.0) -> None:
        self.directory, self.on_disk = Path(directory), on_disk
        self.schedule = KeepSchedule(monotonic=time.monotonic(), every_steps=every_steps, steps=steps,
                                     min_seconds=min_seconds, budget=budget, on_disk=on_disk,
                                     disk_seconds=disk_seconds)
        self.writer = StateWriter(self.directory, keep_last, fields=self._checked_fields, outputs=lambda: self.outputs,
                                  on_written=self._written)
        self.points = CheckpointPoints()         # the training's own checkpoints as resume points
        self.pace = StepPace()
        self.random = RandomSources()
        self.kept: Dict[int, KeptState] = {}       # the latest copy, in memory
        self.trace: Dict[int, List[Optional[str]]] = {}   # per step since the kept state: loss, sums, scalars
        self.outputs: Any = None
        self.written: Optional[Path] = None
        self.initial: Dict[str, str] = {}   # the small Parameters' values before the run's first step (note_initial)
        self.seconds = 0.0                             # spent keeping (copies and writes), in all
        self.on_unrestorable: Optional[Callable[[List[str]], None]] = None   # told each newly found list (the record)
        self._nbytes: Optional[Tuple[Sequence[Any], int]] = None   # (the Parameters kept, the bytes of their copy)
        self._streamed: Optional[KeptState] = None   # the last state streamed: views, for its state.json only
        self._stall_said = False

    @property
    def checkpoints(self) -> Dict[int, CheckpointPoint]:
        """Global step -> the training's own checkpoint it begins from (:class:`CheckpointPoints`)."""
        return self.points.points

    @property
    def on_disk_states(self) -> Dict[int, Path]:
        """Global step -> its folder on disk (on_disk)."""
        return self.writer.on_disk_states

    # -- when -------------------------------------------------------------------------------------------
    def due(self, step: int) -> bool:
        """Whether a copy is due at the beginning of global step ``step`` (:meth:`KeepSchedule.copy_refusal`; a
        streaming keeper: :meth:`_stream_due`)."""
        schedule = self.schedule
        if schedule.steps or step <= 1 or not schedule.streaming:
            young = (time.time() - self.pace.first_step_end if self.on_disk and self.pace.first_step_end is not None
                     else None)
            return schedule.copy_refusal(step, monotonic=time.monotonic(), writing=self.writer.busy(),
                                         kept=bool(self.kept), young_seconds=young) is None
        return self._stream_due()

    def disk_due(self) -> bool:
        """Whether a copy taken now would also be written to disk (the time rule of :meth:`keep`)."""
        return self.schedule.disk_refusal(monotonic=time.monotonic(), gave_up=self.writer.problem is not None) is None

    def ready(self) -> bool:
        """A copy can be taken now: none is being written and memory never refused one (several ranks keep only when
        every rank is ready: :mod:`mindguard.training.state.agreed_keeps`)."""
        return not self.schedule.refused_for_memory and not self.writer.busy()

    def _stream_due(self) -> bool:
        """Whether a state written from the Parameters now (:meth:`stream`) keeps to the rules in the class docstring
        (:meth:`KeepSchedule.stream_refusal`); a write that would stall a step too long is said once."""
        nbytes = self._nbytes[1] if self._nbytes is not None else None
        first_point = not self.on_disk_states and self._streamed is None and not self.checkpoints
        typical, before = self.pace.typical(), None
        if first_point and typical is None:
            started = process_started()
            before = (self.pace.first_step_end - started if self.pace.first_step_end is not None and started is not None
                      else None)
        why = self.schedule.stream_refusal(monotonic=time.monotonic(), nbytes=nbytes,
                                           gave_up=self.writer.problem is not None, writing=self.writer.busy(),
                                           typical_step=typical, first_point=first_point, before_first_step=before)
        if why == "stall" and not self._stall_said and nbytes is not None and typical is not None:
            self._stall_said = True
            print(f"mindguard: not writing the training state ({nbytes / 1e9:.2f} GB) from the Parameters for now: "
                  f"~{self.schedule.write_estimate(nbytes):.2f} s would delay a {typical:.3f} s step more than "
                  f"{self.schedule.max_stall_steps:g}x; `mindguard hunt --from` resumes from the training's own "
                  f"checkpoints when it writes them", file=sys.stderr, flush=True)
        return why is None

    # -- keeping ----------------------------------------------------------------------------------------
    def keep(self, step: int, params: Sequence[Any], call: int = 1, cells: Sequence[Any] = (),
             to_disk: Optional[bool] = None, loaded: Optional[Sequence[np.ndarray]] = None, warm_up: int = 0) -> None:
        """Copy the state at the beginning of ``step`` (``params``; ``cells``: the cells they belong to, searched
        once for random sources no kept state can hold -- named on stderr once when on disk, before any failure),
        unless the copy does not fit (:func:`_fits`: then nothing is kept; said once). On disk, the copy is
        written in a thread of its own (:meth:`StateWriter.write_async`): the step does not wait for the disk.
        ``to_disk``: as every rank agreed (several ranks), instead of this process's own time rule
        (:meth:`disk_due`). ``loaded``: the Parameters' values as a resumed pass loaded them at this step, held
        instead of a copy; ``warm_up``: the steps a pass resumed from it runs first (:class:`KeptState`)."""
        if self._nbytes is None or self._nbytes[0] is not params:   # once per list of Parameters (a call's)
            self._nbytes = (params, state_nbytes(params))
        nbytes, schedule = self._nbytes[1], self.schedule
        if schedule.streaming:
            self.stream(step, params, call, cells, warm_up)
            return
        too_big = _fits(nbytes, self.on_disk)
        if too_big is not None and self.on_disk and self.agreed is None and not schedule.refused_for_memory \
                and host_views(params) is not None:
            self._start_streaming(nbytes, too_big)
            if self._stream_due():   # the first point: now, when the check before this step passed (the caller's rule)
                self.stream(step, params, call, cells, warm_up)
            return
        if too_big is not None:
            if not schedule.refused_for_memory:
                then = ("`mindguard hunt --from` resumes from the training's own checkpoints (ModelCheckpoint) when "
                        "it writes them, else runs from step 1" if self.on_disk else "pass 2 will run from step 1")
                print(f"mindguard: not keeping the training state ({nbytes / 1e9:.2f} GB) in memory: {too_big}; "
                      f"{then}", file=sys.stderr, flush=True)
            schedule.note_refused(step, monotonic=time.monotonic())
            return
        previous = next(iter(self.kept.values()), None)
        state = KeptState(step, params, call, reuse=previous, unrestorable=self._unrestorable(cells), loaded=loaded,
                          warm_up=warm_up)
        self.kept = {step: state}
        self.trace = {k: v for k, v in self.trace.items() if k >= step}
        schedule.note_copy(step, monotonic=time.monotonic(), seconds=state.seconds, nbytes=nbytes,
                           reused=previous is not None)
        self.seconds += state.seconds
        if (self.disk_due() if to_disk is None else to_disk and self.on_disk and self.writer.problem is None):
            self.writer.write_async(state)

    def _start_streaming(self, nbytes: int, too_big: str) -> None:
        """A state of ``nbytes`` does not fit in memory (``too_big``): from now on it is written from the
        Parameters (:meth:`stream`); an earlier copy (a smaller call's state, more memory then) is dropped, being
        older than what follows."""
        self.schedule.streaming = True
        self.writer.join()
        self.kept = {}
        print(f"mindguard: not keeping the training state ({nbytes / 1e9:.2f} GB) in memory: {too_big}; writing "
              f"it to disk straight from the Parameters instead, when that delays a step by at most "
              f"{self.schedule.max_stall_steps:g} typical steps and at least {self.schedule.disk_seconds:g} s of "
              f"training after the last resume point (the training's own checkpoints are resume points too)",
              file=sys.stderr, flush=True)

    def stream(self, step: int, params: Sequence[Any], call: int = 1, cells: Sequence[Any] = (),
               warm_up: int = 0) -> None:
        """Write the state at the beginning of ``step`` to ``<directory>/step-<N>/`` straight from the Parameters'
        memory (:func:`host_views`; no copy): ``state.npz`` now -- the step waits for it --, its checksum and
        ``state.json`` in a thread of their own (the file no longer changes), then only the last ``keep_last``
        folders stay. A failure later joins that thread and writes the json again with the trace since."""
        views = host_views(params)
        if views is None:
            self.writer.give_up("the Parameters are no longer host memory it can write from")
            return
        # the oldest folder goes first (the newest stays whole): its pages in the OS's cache are then what the new
        # files are written into, where new memory for them was 10-20x slower beside a training (round 11 facts)
        self.writer.drop_states(keep=max(self.writer.keep_last - 1, 1))
        start = time.perf_counter()
        state = KeptState(step, params, call, unrestorable=self._unrestorable(cells), loaded=views, warm_up=warm_up)
        if not self.writer.write_streamed(state):
            return
        seconds = time.perf_counter() - start
        self.seconds += seconds
        self.schedule.note_streamed(step, monotonic=time.monotonic(), seconds=seconds, nbytes=state.nbytes)
        self.trace = {k: v for k, v in self.trace.items() if k >= step}
        self._streamed = state
        self.writer.finish_async(state, self.outputs, {**self._checked_fields(state.step),
                                                       "written_from": "parameters"})

    def _written(self, seconds: float) -> None:
        """A copy went to disk in ``seconds`` (:meth:`StateWriter.to_disk`, maybe in its thread)."""
        self.schedule.note_written(monotonic=time.monotonic(), seconds=seconds)
        self.seconds += seconds

    def _checked_fields(self, step: int) -> Dict[str, Any]:
        """What every ``state.json`` of this on-disk keeper says besides the state: that its Parameters were checked
        finite before global step ``step``, the run's id and the script's first small values."""
        return {"verified": f"every Parameter checked finite after global step {step - 1}", "run_id": self.run_id,
                "initial": dict(self.initial)}

    def pause(self) -> None:
        """Training stopped being timed (an epoch or a training call ended) until the next step."""
        self.schedule.clock.pause(time.monotonic())

    def _unrestorable(self, cells: Sequence[Any]) -> List[str]:
        """:meth:`RandomSources.of` ``cells``: said on stderr when on disk, told to ``on_unrestorable``."""
        return self.random.of(cells, say=self.on_disk, tell=self.on_unrestorable)

    # -- the pace, the trace, the checkpoints ------------------------------------------------------------
    def note_step_end(self, step: int, outputs: Any) -> None:
        """After a step: the output's structure (once) and the pace, for the hunt's choice of route."""
        if self.outputs is None and outputs is not None:
            self.outputs = output_spec(outputs)
        self.pace.note_end(step, time.time())

    def costs(self, params: Sequence[Any] = ()) -> Dict[str, Any]:
        """What a new process of this run costs before its first step ends, and the state's size (the failure
        record's ``costs``: ``mindguard hunt --from`` weighs one pass against two by it). ``params``: the Parameters
        kept, for their size when no state was taken yet."""
        nbytes = self._nbytes[1] if self._nbytes is not None else (state_nbytes(params) if params else None)
        return {"process_started": process_started(), "first_step_end": self.pace.first_step_end,
                "step_seconds": self.pace.step_seconds, "state_bytes": nbytes}

    def note_trace(self, step: int, trace: List[Optional[str]]) -> None:
        """What a step computed (its loss, the sum of squares of the Parameters after it when it was checked, the
        small Parameters before it), kept for the steps since the kept state or checkpoint: a resumed pass must
        compute the same."""
        starts = self._resume_points()
        if starts and step >= min(starts):
            self.trace[step] = trace

    def _resume_points(self) -> List[int]:
        """:func:`~mindguard.training.state.keep_schedule.resume_points` of this keeper."""
        return resume_points(self.kept, self.checkpoints, self._streamed.step if self._streamed else None)

    def checkpoint_to_check(self, step: int) -> bool:
        """Whether the Parameters are to be checked at the end of 1-based global step ``step`` because the training's
        own checkpoint became a resume point at this step (:meth:`note_checkpoints`) and no check followed it yet.
        Checked finite after its step, the state it holds was finite too (Inf/NaN stays): a failure's window starts
        after that check and resumes from the file, which is never read back (a dying process does not load a
        checkpoint of the model's size; a time-triggered ``ModelCheckpoint`` is covered as well). Once per
        checkpoint."""
        return self.points.to_check(step)

    def note_checkpoints(self, step: int, saved: Sequence[str], cells: Sequence[Any], params: Sequence[Any],
                         verified_after: Optional[int] = None, warm_up: int = 0) -> None:
        """At the beginning of global step ``step``: ``saved``, the files the training's ``ModelCheckpoint`` wrote at
        the end of the step before (as the run's :class:`~mindguard.training.state.user_checkpoints.CheckpointLog` saw
        them), are a resume point for ``step`` (the random state is captured now). Held
        (:meth:`CheckpointPoints.drop_old`): the latest point at or before ``verified_after + 1`` (the Parameters
        were last checked finite after global step ``verified_after``: a failure's window starts after it and resumes
        from that point; a Parameter check follows each new point, :meth:`checkpoint_to_check`) and the
        :data:`MAX_CHECKPOINT_POINTS` latest."""
        if self.points.note(step, saved, lambda: [p.name for p in params], lambda: self._unrestorable(cells),
                            verified_after, warm_up):
            self.schedule.note_point(monotonic=time.monotonic())
            self.trace = {k: v for k, v in self.trace.items() if k >= min(self._resume_points())}

    # -- at a failure -----------------------------------------------------------------------------------
    def write(self, upto_step: int, dumped_step: Optional[int] = None) -> Optional[Path]:
        """Write the latest copy taken at or before ``upto_step`` (once), with the trace since it; ``None`` when
        there is none. On disk: into ``<directory>/step-<N>/`` (or the latest folder written before, when the copy
        in memory is past ``upto_step`` or cannot be written). ``dumped_step``: a global step whose dump is on disk
        already; a copy of exactly that step (a hunt pass's, not on disk) keeps its big arrays as statistics
        (:data:`SUMMARIZE_OVER_BYTES`): it serves that dump's analysis only."""
        if self.written is not None:
            return self.written
        self.writer.join()
        timing = {"first_step_end": self.pace.first_step_end, "step_seconds": self.pace.step_seconds,
                  "process_started": process_started()}
        point, copy = failure_sources(upto_step, kept=self.kept, checkpoints=self.checkpoints,
                                      on_disk_states=self.on_disk_states, on_disk=self.on_disk)
        if point is not None:
            self.written = self.checkpoints[point].write(layout.kept_step(self.directory, point), outputs=self.outputs,
                                                         timing={"run_id": self.run_id, **timing}, trace=self.trace)
            if self.written is not None:
                return self.written
        if copy is not None:
            state = self.kept[copy]
            if self.on_disk:
                self.writer.problem = None   # one more try: this is the write that matters
                self.written = self.writer.to_disk(state, trace=self.trace, timing=timing)
            else:
                self.written = state.write(self.directory, outputs=self.outputs, timing=timing, trace=self.trace,
                                           summarize_over=SUMMARIZE_OVER_BYTES if state.step == dumped_step
                                           else None)
        if self.written is None and self.on_disk:
            self._written_before(upto_step, timing)
        return self.written

    def _written_before(self, upto_step: int, timing: Dict[str, Any]) -> None:
        """The failure's write fell back to the latest folder written at or before ``upto_step``; one streamed gets
        its json again, with the trace since (its arrays are on disk; the views changed since)."""
        earlier = [s for s in self.on_disk_states if s <= upto_step]
        self.written = self.on_disk_states[max(earlier)] if earlier else None
        streamed = self._streamed
        if self.written is not None and streamed is not None and streamed.step == max(earlier):
            try:
                streamed.write(self.written, outputs=self.outputs, arrays=False, trace=self.trace, timing={
                    **self._checked_fields(streamed.step), "written_from": "parameters", **timing})
            except (OSError, ValueError):
                pass   # the json written with it stands: a resumed pass then compares no trace


def _fits(nbytes: int, on_disk: bool) -> Optional[str]:
    """Why a host copy of ``nbytes`` does not fit, or ``None`` (:func:`~mindguard.training.state.keep_schedule.
    memory_refusal` for an ``on_disk`` keeper or not, at this module's :data:`MAX_EXTRA_MEMORY`)."""
    resident = _resident_memory() if on_disk else None
    why = memory_refusal(nbytes, available=_available_memory(), resident=resident, on_disk=on_disk,
                         max_extra=MAX_EXTRA_MEMORY)
    return None if why is None else describe_memory(why, resident=resident, max_extra=MAX_EXTRA_MEMORY)


def _resident_memory() -> Optional[float]:
    """This process's resident memory (bytes), or ``None`` when it cannot be read."""
    try:
        import psutil

        return float(psutil.Process().memory_info().rss)
    except Exception:  # noqa: BLE001 - no psutil reading: do not limit
        return None


def _available_memory() -> float:
    """The memory available to the process (bytes; ``inf`` when it cannot be read)."""
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
