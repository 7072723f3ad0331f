"""When the training state is kept (:class:`KeepSchedule`), which memory and disk it may take, which kept states and
checkpoint points are dropped: the rules of :class:`~mindguard.training.state.keeper.StateKeeper`, pure.

Pure Python in the style of :class:`~mindguard.training.checks.budget.CheckBudget`: no MindSpore, no numpy, no files and
no clock read here -- the caller passes the time (``monotonic``: ``time.monotonic()`` seconds; ``wall``: ``time.time()``
seconds), the bytes and the memory in, so each rule is tested without a training (tests/test_fast_keep_schedule.py).
Each rule that says no says why, as a small code (:data:`NotDue`, :data:`MemoryRefusal`, :data:`DiskRefusal`).
Steps are 1-based, process-wide global steps; times are seconds, sizes bytes.
"""
from __future__ import annotations

import statistics
from collections import deque
from typing import Deque, Iterable, List, Literal, Optional, Tuple

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
#: how many recent steps' wall times the typical step is the median of
RECENT_STEPS = 15
#: how many recent copies' prices the next copy is priced at the median of: one copy the OS preempted (5 ms among
#: 0.45 ms ones, measured with six trainings on 2 cores) priced alone put the next copy 2 s of training later, past
#: the run's last checks, and a late failure resumed 1,000 steps early
RECENT_COPIES = 5

#: why no state is kept (or written from the Parameters) at a step: not among the exact ``steps`` asked; step 1 (it
#: starts from what the script builds); memory refused a copy once; a state is being written; too soon for the step
#: count, the time interval or the budget; writes stopped (a disk problem); the state's size not known yet; the
#: write would stall a step too long; not an on-disk keeper
NotDue = Literal["not_listed", "first_step", "refused_for_memory", "writing", "too_soon", "gave_up", "size_unknown",
                 "stall", "not_on_disk"]
#: why a host copy does not fit: more than a third of the memory available; more than MAX_EXTRA_MEMORY of the
#: process's resident memory (an on-disk keeper)
MemoryRefusal = Literal["over_available", "over_extra_memory"]
#: why a state is not written to disk: less than three times its size free there
DiskRefusal = Literal["no_room"]


class TrainingClock:
    """Seconds of training: ``monotonic`` less the time :meth:`pause` left out (the clock runs again at its next
    :meth:`read`, at the next step). Intervals between copies and writes are of training, so that other work in the
    process (an evaluation, another model's training) neither spends nor counts in the budget."""

    def __init__(self) -> None:
        self.paused_at: Optional[float] = None   # ``monotonic`` when training stopped being timed
        self.paused_for = 0.0                     # seconds paused in all

    def read(self, monotonic: float) -> float:
        """The training time at ``monotonic`` (a paused clock runs again from here)."""
        if self.paused_at is not None:
            self.paused_for += monotonic - self.paused_at
            self.paused_at = None
        return monotonic - self.paused_for

    def pause(self, monotonic: float) -> None:
        """Training stopped being timed at ``monotonic`` (an epoch or a training call ended); a second pause changes
        nothing."""
        if self.paused_at is None:
            self.paused_at = monotonic


class StepPace:
    """The training's pace from its steps' ends (``time.time()`` seconds): when the first step ended, the mean step
    since, the median of the recent steps."""

    def __init__(self) -> None:
        self.first_step_end: Optional[float] = None   # time.time() when step 1 ended (startup + compile + 1 step)
        self.first = 1                                 # the 1-based global step first_step_end was taken at
        self.step_seconds: Optional[float] = None      # mean seconds per step since then
        self.recent: Deque[float] = deque(maxlen=RECENT_STEPS)   # the last steps' wall times (s)
        self.last_end: Optional[Tuple[int, float]] = None        # (step, wall) of the last step's end

    def note_end(self, step: int, wall: float) -> None:
        """Global step ``step`` ended at ``wall``."""
        if self.last_end is not None and step == self.last_end[0] + 1:
            self.recent.append(wall - self.last_end[1])
        self.last_end = (step, wall)
        if step == 1 or self.first_step_end is None:
            self.first_step_end, self.first = wall, step
        elif step > self.first:
            self.step_seconds = (wall - self.first_step_end) / (step - self.first)

    def typical(self) -> Optional[float]:
        """The median of the recent steps' wall times (s, end to end, callbacks included), ``None`` before two
        steps ended: what a step takes when the training's own checkpoint or evaluation does not stall it."""
        return statistics.median(self.recent) if self.recent else None


class KeepSchedule:
    """When a copy of the state is due, and when it (or a state written from the Parameters) goes to disk: the
    rules of :class:`~mindguard.training.state.keeper.StateKeeper`'s docstring. It holds the times of the last copy,
    write and resume point (training time, :class:`TrainingClock`), what they cost, and the modes the memory rule put
    the keeper in (``streaming``, ``refused_for_memory``)."""

    def __init__(self, *, monotonic: float, every_steps: Optional[int] = None, steps: Iterable[int] = (),
                 min_seconds: float = 10.0, budget: float = 0.005, on_disk: bool = False,
                 disk_seconds: float = 30.0) -> None:
        self.every_steps, self.steps = every_steps, set(steps)
        self.min_seconds, self.budget = min_seconds, budget
        self.on_disk, self.disk_seconds = on_disk, disk_seconds
        self.copy_budget = budget / 2 if on_disk else budget   # the share of the training time copies may take
        self.max_stall_steps = MAX_STALL_STEPS
        self.clock = TrainingClock()
        self.last_step = 1                                  # the global step of the last copy (or refusal)
        self.last_time = self.clock.read(monotonic)         # training time of the last copy
        self.disk_time = self.clock.read(monotonic)         # of the last write (the first: disk_seconds from now)
        self.point_time = -float("inf")   # when the training's own checkpoint last became a resume point
        self.copy_prices: Deque[float] = deque(maxlen=RECENT_COPIES)   # the recent copies' prices (s)
        self.write_seconds = 0.0                            # what the last write to disk took (s)
        self.write_rate = ASSUMED_WRITE_BYTES_PER_S         # bytes/s of the last state streamed (assumed until then)
        self.streaming = False   # the state is written from the Parameters' memory, never copied
        self.refused_for_memory = False   # memory refused a copy and nothing is written instead

    def training_time(self, monotonic: float) -> float:
        """:meth:`TrainingClock.read`."""
        return self.clock.read(monotonic)

    @property
    def copy_seconds(self) -> float:
        """What the next copy is priced at (s): the median of the last :data:`RECENT_COPIES` copies' prices (0 before
        the first)."""
        return statistics.median(self.copy_prices) if self.copy_prices else 0.0

    # -- the rules ---------------------------------------------------------------------------------------
    def copy_refusal(self, step: int, *, monotonic: float, writing: bool, kept: bool,
                     young_seconds: Optional[float] = None) -> Optional[NotDue]:
        """Why no copy is taken at the beginning of global step ``step`` (``None``: it is due; a streaming keeper
        asks :meth:`stream_refusal` instead). ``writing``: a copy is being written (its buffers are not reused until
        then); ``kept``: a copy is held; ``young_seconds``: the wall seconds since the first step ended (an on-disk
        keeper's copies come at least every :data:`YOUNG_RUN_SHARE` of them, issue 51)."""
        if self.steps:
            return None if step in self.steps else "not_listed"
        if step <= 1:
            return "first_step"   # step 1 starts from what the script builds: nothing to keep
        if self.on_disk and self.refused_for_memory:
            return "refused_for_memory"   # the training's own checkpoints are its resume points
        if writing:
            return "writing"
        if self.on_disk and not kept:
            return None   # the first state as early as it can be checked: a failure at any later step can resume
        if self.every_steps is not None:
            return None if step - self.last_step >= self.every_steps else "too_soon"
        floor = self.min_seconds
        if self.on_disk and young_seconds is not None:
            floor = min(floor, YOUNG_RUN_SHARE * max(young_seconds, 0.0))
        interval = max(floor, self.copy_seconds / self.copy_budget)
        return None if self.training_time(monotonic) - self.last_time >= interval else "too_soon"

    def disk_refusal(self, *, monotonic: float, gave_up: bool) -> Optional[NotDue]:
        """Why a copy taken now is not also written to disk: not an on-disk keeper, writes stopped (``gave_up``), or
        less than ``max(disk_seconds, last write's seconds / its half of the budget)`` of training since the last
        write."""
        if not self.on_disk:
            return "not_on_disk"
        if gave_up:
            return "gave_up"
        interval = max(self.disk_seconds, self.write_seconds / (self.budget - self.copy_budget))
        return None if self.training_time(monotonic) - self.disk_time >= interval else "too_soon"

    def write_estimate(self, nbytes: int) -> float:
        """The seconds a state of ``nbytes`` written from the Parameters is expected to take (the last rate)."""
        return nbytes / self.write_rate

    def stream_refusal(self, *, monotonic: float, nbytes: Optional[int], gave_up: bool, writing: bool,
                       typical_step: Optional[float], first_point: bool,
                       before_first_step: Optional[float]) -> Optional[NotDue]:
        """Why no state is written from the Parameters now: writes stopped, the size not known, one being written,
        the estimate (:meth:`write_estimate`) delays the step by more than ``max_stall_steps`` typical steps
        (``"stall"``), or ``max(disk_seconds, estimate / budget)`` of training did not pass since the last write or
        resume point. ``first_point`` (no resume point yet, issue 51): due as soon as the stall rule allows it, or --
        ``typical_step`` unknown -- when the estimate is at most :data:`FIRST_POINT_SECONDS` and
        :data:`FIRST_POINT_SHARE` of ``before_first_step`` (the process's seconds to its first step's end)."""
        if gave_up:
            return "gave_up"
        if nbytes is None:
            return "size_unknown"
        if writing:
            return "writing"
        estimate = self.write_estimate(nbytes)
        if first_point:
            if typical_step is None:
                if before_first_step is not None and estimate <= min(FIRST_POINT_SECONDS,
                                                                     FIRST_POINT_SHARE * before_first_step):
                    return None
            elif estimate <= self.max_stall_steps * typical_step:
                return None
        if typical_step is not None and estimate > self.max_stall_steps * typical_step:
            return "stall"
        since = self.training_time(monotonic) - max(self.disk_time, self.point_time)
        return None if since >= max(self.disk_seconds, estimate / self.budget) else "too_soon"

    # -- what happened -----------------------------------------------------------------------------------
    def note_copy(self, step: int, *, monotonic: float, seconds: float, nbytes: int, reused: bool) -> None:
        """A copy of ``nbytes`` at the beginning of global step ``step`` took ``seconds``. Its price is its time, or --
        one that allocated its buffers (3-48 ms for 25.6 MB, 1.5-2 ms into reused ones) -- at most
        :data:`REUSED_COPY_BYTES_PER_S`: priced at the allocation, the next copy of a fast small model was due only
        seconds later, past the rare check it must follow, and a late failure resumed early. The next copy is
        priced at the recent prices' median (:attr:`copy_seconds`)."""
        self.last_step, self.last_time = step, self.training_time(monotonic)
        self.copy_prices.append(seconds if reused else min(seconds, nbytes / REUSED_COPY_BYTES_PER_S))

    def note_refused(self, step: int, *, monotonic: float) -> None:
        """Memory refused the copy at global step ``step``."""
        self.refused_for_memory = True
        self.last_step, self.last_time = step, self.training_time(monotonic)

    def note_written(self, *, monotonic: float, seconds: float) -> None:
        """A copy went to disk in ``seconds``, done at ``monotonic``."""
        self.disk_time = self.training_time(monotonic)
        self.write_seconds = seconds

    def note_streamed(self, step: int, *, monotonic: float, seconds: float, nbytes: int) -> None:
        """The state of ``nbytes`` at the beginning of global step ``step`` was written from the Parameters in
        ``seconds`` (its rate prices the next)."""
        self.write_rate = nbytes / max(seconds, 1e-6)
        self.write_seconds = seconds
        self.disk_time = self.training_time(monotonic)
        self.last_step, self.last_time = step, self.training_time(monotonic)

    def note_point(self, *, monotonic: float) -> None:
        """The training's own checkpoint became a resume point."""
        self.point_time = self.training_time(monotonic)


# -- memory, disk, and what is dropped ------------------------------------------------------------------------
def memory_refusal(nbytes: int, *, available: float, resident: Optional[float], on_disk: bool,
                   max_extra: float = MAX_EXTRA_MEMORY) -> Optional[MemoryRefusal]:
    """Why a host copy of ``nbytes`` does not fit (``None``: it does). Always: more than a third of the ``available``
    memory (bytes). On disk (an always-on Guard, in every run): more than ``max_extra`` of the training process's
    ``resident`` memory (bytes; ``None``: not known, no limit) -- the copy would raise its peak by more than that."""
    if nbytes > available / 3:
        return "over_available"
    if on_disk and resident is not None and nbytes > max_extra * resident:
        return "over_extra_memory"
    return None


def describe_memory(refusal: MemoryRefusal, *, resident: Optional[float], max_extra: float = MAX_EXTRA_MEMORY) -> str:
    """What :func:`memory_refusal`'s code says, for stderr."""
    if refusal == "over_available":
        return "more than a third of the memory available"
    return (f"more than {max_extra:.0%} of the training process's {(resident or 0.0) / 1e9:.2f} GB, which it would "
            f"add to its peak")


def disk_refusal(nbytes: int, free: Optional[int]) -> Optional[DiskRefusal]:
    """Why a state of ``nbytes`` is not written to disk: less than three times that ``free`` (bytes; ``None``: not
    known, no limit)."""
    return "no_room" if free is not None and nbytes * 3 > free else None


def stale_states(steps: Iterable[int], keep: int) -> List[int]:
    """The global steps of the on-disk states to remove: all but the ``keep`` newest."""
    return sorted(steps)[:-keep]


def stale_checkpoints(steps: Iterable[int], verified_after: Optional[int],
                      max_points: int = MAX_CHECKPOINT_POINTS) -> List[int]:
    """The checkpoint points no failure can resume from: all but the latest one at or before the step after the last
    passing Parameter check (global step ``verified_after``; ``None``: none passed) and the ``max_points`` latest."""
    ordered = sorted(steps)
    held = set(ordered[-max_points:])
    verified = [s for s in ordered if s <= (verified_after or 0) + 1]
    if verified:
        held.add(verified[-1])
    return [s for s in ordered if s not in held]


def checkpoint_to_check(points: Iterable[int], step: int, asked: Iterable[int]) -> Optional[int]:
    """The newest checkpoint point (a global step) a Parameter check is to follow at the end of global step ``step``:
    at or before ``step`` and not ``asked`` already; ``None``: no check for a checkpoint."""
    newest = max(points, default=None)
    if newest is None or newest > step or newest in set(asked):
        return None
    return newest


def resume_points(kept: Iterable[int], checkpoints: Iterable[int], streamed: Optional[int]) -> List[int]:
    """The global steps a failure may resume from: the copy in memory, the training's checkpoints, the state last
    written from the Parameters."""
    return list(kept) + list(checkpoints) + ([streamed] if streamed is not None else [])


def failure_sources(upto_step: int, *, kept: Iterable[int], checkpoints: Iterable[int], on_disk_states: Iterable[int],
                    on_disk: bool) -> Tuple[Optional[int], Optional[int]]:
    """What a failure writes first, as global steps: (the checkpoint point, else ``None``; the copy in memory, else
    ``None``). The checkpoint point is the latest at or before ``upto_step`` when an on-disk keeper has it later than
    every copy at or before ``upto_step`` and every state on disk; the copy, the latest at or before ``upto_step``
    (written when the checkpoint is not)."""
    candidates = [s for s in kept if s <= upto_step]
    points = [s for s in checkpoints if s <= upto_step]
    latest = max(candidates + (list(on_disk_states) if on_disk else []), default=0)
    point = max(points) if points and max(points) > latest and on_disk else None
    return point, max(candidates, default=None)
