"""The keep schedule's rules (mindguard.training.state.keep_schedule), pure: when a copy of the training state is due,
when it (or a state written from the Parameters) goes to disk, the memory and disk rules, what is dropped and what a
failure writes. Each rule that says no says why; times are passed in (``monotonic``: training seconds here), steps
are 1-based global steps."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from mindguard.training.state import keep_schedule as ks
from mindguard.training.state.keep_schedule import (
    KeepSchedule,
    StepPace,
    TrainingClock,
    checkpoint_to_check,
    describe_memory,
    disk_refusal,
    failure_sources,
    memory_refusal,
    resume_points,
    stale_checkpoints,
    stale_states,
)

pytestmark = pytest.mark.fast

T0 = 1000.0   # time.monotonic() when the schedule starts


def schedule(**options) -> KeepSchedule:
    return KeepSchedule(monotonic=T0, **options)


def copy_why(s: KeepSchedule, step: int, at: float = T0, *, writing: bool = False, kept: bool = True,
             young_seconds=None):
    return s.copy_refusal(step, monotonic=at, writing=writing, kept=kept, young_seconds=young_seconds)


def test_the_module_imports_neither_mindspore_nor_numpy_nor_other_mindguard_modules():
    tree = ast.parse(Path(ks.__file__).read_text())
    imported = {alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import)
                for alias in node.names}
    imported |= {node.module.split(".")[0] for node in ast.walk(tree)
                 if isinstance(node, ast.ImportFrom) and node.module and not node.level}
    assert not any(isinstance(node, ast.ImportFrom) and node.level for node in ast.walk(tree)), "relative imports"
    assert imported <= {"__future__", "statistics", "collections", "typing"}, imported


# -- the training clock and the pace -------------------------------------------------------------------------
def test_the_training_clock_leaves_out_the_paused_time_and_a_second_pause_changes_nothing():
    clock = TrainingClock()
    assert clock.read(10.0) == 10.0
    clock.pause(12.0)
    clock.pause(15.0)   # the epoch's end, then the call's
    assert clock.read(112.0) == 12.0, "100 s paused from the first pause"
    assert clock.read(113.0) == 13.0, "running again after a read"


def test_the_pace_times_the_steps_from_the_first_end():
    pace = StepPace()
    assert pace.typical() is None
    pace.note_end(1, 100.0)
    assert (pace.first_step_end, pace.step_seconds) == (100.0, None)
    pace.note_end(2, 100.5)
    pace.note_end(3, 101.5)
    assert pace.step_seconds == pytest.approx(0.75) and list(pace.recent) == [0.5, 1.0]
    assert pace.typical() == pytest.approx(0.75)
    pace.note_end(5, 102.0)   # (a step not seen: no step time)
    assert list(pace.recent) == [0.5, 1.0] and pace.step_seconds == pytest.approx(0.5)
    resumed = StepPace()
    resumed.note_end(31, 50.0)   # a resumed process: its first step's end
    assert resumed.first_step_end == 50.0 and resumed.first == 31


# -- a copy in memory ---------------------------------------------------------------------------------------
def test_exact_steps_keep_there_only():
    s = schedule(steps=[1, 4])
    assert copy_why(s, 4) is None and copy_why(s, 1) is None
    assert copy_why(s, 3) == "not_listed"


def test_step_one_is_never_kept_and_memory_refusal_stops_an_on_disk_keeper():
    assert copy_why(schedule(every_steps=1), 1) == "first_step"
    s = schedule(on_disk=True)
    s.note_refused(2, monotonic=T0)
    assert s.refused_for_memory and copy_why(s, 3, T0 + 1e6) == "refused_for_memory"
    s = schedule(every_steps=1)
    s.note_refused(2, monotonic=T0)
    assert copy_why(s, 3) is None, "(a hunt pass's keeper asks again: memory is measured at each keep)"


def test_no_copy_while_one_is_being_written():
    assert copy_why(schedule(every_steps=1), 5, writing=True) == "writing"


def test_an_on_disk_keepers_first_copy_is_due_at_once():
    s = schedule(on_disk=True)
    assert copy_why(s, 2, kept=False) is None
    assert copy_why(s, 2, kept=True) == "too_soon"


def test_every_steps_counts_from_the_last_copy():
    s = schedule(every_steps=3)
    assert copy_why(s, 3) == "too_soon" and copy_why(s, 4) is None   # (the first counts from step 1)
    s.note_copy(4, monotonic=T0, seconds=0.01, nbytes=10, reused=False)
    assert copy_why(s, 6) == "too_soon" and copy_why(s, 7) is None


def test_the_time_rule_is_min_seconds_or_the_copy_budget():
    s = schedule(min_seconds=10.0, budget=0.01)
    assert copy_why(s, 2, T0 + 9.9) == "too_soon" and copy_why(s, 2, T0 + 10.0) is None
    s.note_copy(2, monotonic=T0, seconds=0.5, nbytes=10, reused=True)   # 0.5 s at 1 %: every 50 s
    assert s.copy_seconds == 0.5
    assert copy_why(s, 3, T0 + 49.0) == "too_soon" and copy_why(s, 3, T0 + 50.0) is None


def test_the_time_rule_runs_on_training_time():
    s = schedule(min_seconds=10.0)
    s.clock.pause(T0 + 6.0)
    assert copy_why(s, 2, T0 + 306.0) == "too_soon", "300 s of evaluation are not training"
    assert copy_why(s, 3, T0 + 310.5) is None


def test_a_young_on_disk_run_keeps_every_young_run_share_of_its_training():
    s = schedule(on_disk=True, min_seconds=10.0, budget=1.0)
    # 40 s since the first step ended: a copy every 5 % of it, 2 s
    assert copy_why(s, 3, T0 + 1.9, young_seconds=40.0) == "too_soon"
    assert copy_why(s, 3, T0 + 2.0, young_seconds=40.0) is None
    assert copy_why(s, 3, T0 + 2.0, young_seconds=None) == "too_soon", "the first step's end not known"
    assert copy_why(s, 3, T0 + 2.0, young_seconds=1e6) == "too_soon", "past min_seconds"
    assert copy_why(schedule(min_seconds=10.0, budget=1.0), 3, T0 + 2.0, young_seconds=40.0) == "too_soon", \
        "a hunt pass's keeper has no young-run rule"
    s.note_copy(2, monotonic=T0, seconds=0.05, nbytes=10, reused=True)   # 0.05 s on half of 100 %: 0.1 s
    assert copy_why(s, 3, T0 + 0.05, young_seconds=0.0) == "too_soon"
    assert copy_why(s, 3, T0 + 0.1, young_seconds=0.0) is None, "the copies' budget is the floor"


def test_the_first_copy_is_priced_at_most_at_the_reused_buffers_rate():
    s = schedule(on_disk=True)
    s.note_copy(2, monotonic=T0 + 5, seconds=0.048, nbytes=25_600_000, reused=False)   # it allocated its buffers
    assert s.copy_seconds == pytest.approx(25_600_000 / ks.REUSED_COPY_BYTES_PER_S)
    assert (s.last_step, s.last_time) == (2, T0 + 5)
    s = schedule(on_disk=True)
    s.note_copy(3, monotonic=T0 + 6, seconds=0.002, nbytes=25_600_000, reused=False)
    assert s.copy_seconds == 0.002, "a faster first copy is priced at its own time"


def test_one_slow_copy_does_not_price_the_next():
    """A copy the OS preempted (5 ms among 0.45 ms ones) priced alone put the next copy 2 s of training later."""
    s = schedule(on_disk=True, min_seconds=10.0, budget=0.005)
    for step, seconds in ((2, 0.00045), (3, 0.0005), (4, 0.005)):
        s.note_copy(step, monotonic=T0, seconds=seconds, nbytes=10_000, reused=True)
    assert s.copy_seconds == 0.0005, list(s.copy_prices)
    assert copy_why(s, 5, T0 + 0.2, young_seconds=1.0) is None, "0.5 ms on a quarter-percent budget: 0.2 s"
    for step in range(5, 5 + ks.RECENT_COPIES):   # the copies stay slow: they are priced so
        s.note_copy(step, monotonic=T0, seconds=0.9, nbytes=10_000, reused=True)
    assert s.copy_seconds == 0.9


# -- a copy to disk -------------------------------------------------------------------------------------------
def test_disk_writes_wait_disk_seconds_and_their_half_of_the_budget():
    assert schedule().disk_refusal(monotonic=T0 + 1e6, gave_up=False) == "not_on_disk"
    s = schedule(on_disk=True, disk_seconds=30.0, budget=0.01)
    assert s.copy_budget == 0.005
    assert s.disk_refusal(monotonic=T0 + 1e6, gave_up=True) == "gave_up"
    assert s.disk_refusal(monotonic=T0 + 29.0, gave_up=False) == "too_soon"
    assert s.disk_refusal(monotonic=T0 + 30.0, gave_up=False) is None
    s.note_written(monotonic=T0 + 30.0, seconds=1.0)   # 1 s on 0.5 %: every 200 s
    assert s.disk_refusal(monotonic=T0 + 229.0, gave_up=False) == "too_soon"
    assert s.disk_refusal(monotonic=T0 + 230.0, gave_up=False) is None


# -- a state written from the Parameters -------------------------------------------------------------------
def stream_why(s: KeepSchedule, at: float = T0, *, nbytes=10 ** 9, gave_up=False, writing=False, typical=None,
               first_point=False, before=None):
    return s.stream_refusal(monotonic=at, nbytes=nbytes, gave_up=gave_up, writing=writing, typical_step=typical,
                            first_point=first_point, before_first_step=before)


def test_no_state_is_streamed_after_a_problem_before_its_size_or_while_one_is_written():
    s = schedule(on_disk=True)
    assert stream_why(s, T0 + 1e6, gave_up=True) == "gave_up"
    assert stream_why(s, T0 + 1e6, nbytes=None) == "size_unknown"
    assert stream_why(s, T0 + 1e6, writing=True) == "writing"
    assert stream_why(s, T0 + 1e6) is None


def test_the_runs_first_point_is_streamed_at_once_when_small_beside_the_start_or_the_step():
    s = schedule(on_disk=True)   # 1 GB: ~1 s at the assumed rate
    assert s.write_estimate(10 ** 9) == pytest.approx(1.0)
    assert stream_why(s, nbytes=4 * 10 ** 8, first_point=True, before=4.0) is None   # 0.4 s <= 0.5 s and 10 % of 4 s
    assert stream_why(s, nbytes=4 * 10 ** 8, first_point=True, before=3.0) == "too_soon"   # > 10 % of 3 s
    assert stream_why(s, nbytes=6 * 10 ** 8, first_point=True, before=60.0) == "too_soon"   # > 0.5 s
    assert stream_why(s, nbytes=4 * 10 ** 8, first_point=True, before=None) == "too_soon"   # the start not known
    assert stream_why(s, typical=0.5, first_point=True) is None   # 1 s <= 2 x 0.5 s
    assert stream_why(s, typical=0.5) == "too_soon", "not the first point: disk_seconds"


def test_a_stream_that_would_stall_a_step_too_long_waits():
    s = schedule(on_disk=True)
    assert stream_why(s, T0 + 1e6, typical=0.15) == "stall"
    assert stream_why(s, T0 + 1e6, typical=0.15, first_point=True) == "stall"
    s.max_stall_steps = 1e9
    assert stream_why(s, T0 + 1e6, typical=0.15) is None


def test_streams_wait_disk_seconds_and_the_budget_after_the_last_write_or_checkpoint_point():
    s = schedule(on_disk=True, disk_seconds=30.0, budget=0.005)   # 1 s at 0.5 %: every 200 s
    assert stream_why(s, T0 + 199.0) == "too_soon" and stream_why(s, T0 + 200.0) is None
    s.note_point(monotonic=T0 + 190.0)   # the training's checkpoint became a resume point
    assert stream_why(s, T0 + 200.0) == "too_soon" and stream_why(s, T0 + 390.0) is None
    s.note_streamed(5, monotonic=T0 + 400.0, seconds=0.25, nbytes=10 ** 9)   # 4 GB/s: 0.25 s, every 50 s
    assert s.write_rate == pytest.approx(4e9) and s.write_seconds == 0.25 and s.last_step == 5
    assert stream_why(s, T0 + 449.0) == "too_soon" and stream_why(s, T0 + 450.0) is None
    s.note_streamed(6, monotonic=T0 + 500.0, seconds=0.0, nbytes=10)
    assert s.write_rate == pytest.approx(1e7), "a write timed at 0 s is priced at 1 us"


# -- memory and disk ----------------------------------------------------------------------------------------
def test_a_copy_takes_at_most_a_third_of_the_available_memory():
    assert memory_refusal(100, available=300.0, resident=None, on_disk=False) is None
    assert memory_refusal(101, available=300.0, resident=None, on_disk=False) == "over_available"
    assert memory_refusal(101, available=float("inf"), resident=None, on_disk=False) is None


def test_an_on_disk_copy_takes_at_most_max_extra_memory_of_the_resident():
    assert memory_refusal(100, available=1e9, resident=1000.0, on_disk=True) is None
    assert memory_refusal(101, available=1e9, resident=1000.0, on_disk=True) == "over_extra_memory"
    assert memory_refusal(101, available=1e9, resident=1000.0, on_disk=False) is None, "a hunt pass's copy"
    assert memory_refusal(101, available=1e9, resident=None, on_disk=True) is None, "no reading: no limit"
    assert memory_refusal(101, available=1e9, resident=1000.0, on_disk=True, max_extra=0.2) is None


def test_the_memory_refusals_are_said():
    assert describe_memory("over_available", resident=None) == "more than a third of the memory available"
    assert describe_memory("over_extra_memory", resident=2.5e9) == ("more than 10% of the training process's "
                                                                     "2.50 GB, which it would add to its peak")


def test_a_state_is_written_where_three_times_it_is_free():
    assert disk_refusal(100, 300) is None and disk_refusal(101, 300) == "no_room"
    assert disk_refusal(10 ** 12, None) is None, "free space not known: no limit"


# -- what is dropped, what a failure resumes from --------------------------------------------------------
def test_only_the_newest_states_stay_on_disk():
    assert stale_states([7, 3, 5], keep=2) == [3]
    assert stale_states([3], keep=1) == [] and stale_states([], keep=2) == []


def test_the_checkpoint_point_a_window_starts_from_is_held_behind_the_latest():
    steps = list(range(2, 2 + 3 * ks.MAX_CHECKPOINT_POINTS))
    held = sorted(set(steps) - set(stale_checkpoints(steps, verified_after=5)))
    assert held == [6] + steps[-ks.MAX_CHECKPOINT_POINTS:], held
    assert stale_checkpoints([11, 21, 31], verified_after=15, max_points=2) == []   # 11 starts the window
    assert stale_checkpoints([11, 21, 31], verified_after=None, max_points=2) == [11]   # no check passed


def test_a_check_follows_the_newest_checkpoint_point_once():
    assert checkpoint_to_check([], 5, ()) is None
    assert checkpoint_to_check([11], 10, ()) is None, "not before its step"
    assert checkpoint_to_check([3, 11], 12, ()) == 11
    assert checkpoint_to_check([3, 11], 12, {11}) is None


def test_resume_points_are_the_copy_the_checkpoints_and_the_streamed_state():
    assert resume_points([4], [2, 9], 7) == [4, 2, 9, 7]
    assert resume_points([], [], None) == []


def test_a_failure_writes_the_newest_source_at_or_before_its_window():
    # the copy in memory when it is the latest; else an on-disk keeper's later checkpoint point
    assert failure_sources(10, kept=[8], checkpoints=[6], on_disk_states=[], on_disk=True) == (None, 8)
    assert failure_sources(10, kept=[4], checkpoints=[6], on_disk_states=[], on_disk=True) == (6, 4)
    assert failure_sources(10, kept=[4], checkpoints=[6], on_disk_states=[], on_disk=False) == (None, 4)
    assert failure_sources(10, kept=[12], checkpoints=[6, 11], on_disk_states=[], on_disk=True) == (6, None)
    assert failure_sources(10, kept=[], checkpoints=[6], on_disk_states=[8], on_disk=True) == (None, None)
    # (every state on disk counts as later, even one past the window: the fallback then finds none before it)
    assert failure_sources(10, kept=[], checkpoints=[6], on_disk_states=[12], on_disk=True) == (None, None)
