"""The training's own checkpoints as resume points (mindguard.training.state.keeper): a failure whose window starts
before the latest checkpoints still finds the one it can resume from (a failing run of the 1 GB embedding model kept no
state when its window began before the last two checkpoints, which were all that was held)."""
from __future__ import annotations

import time

import pytest

from mindguard.training.state.keeper import MAX_CHECKPOINT_POINTS, StateKeeper

pytestmark = pytest.mark.fast


def points(tmp_path, steps, verified_after):
    keeper = StateKeeper(tmp_path, on_disk=True)
    for step in steps:   # as note_checkpoints adds them, one at a time
        keeper.checkpoints[step] = object()
        keeper.points.drop_old(verified_after)
    return sorted(keeper.checkpoints)


def test_the_checkpoint_a_window_starts_from_is_held_behind_later_ones(tmp_path):
    # checkpoints every 10 steps, the Parameters last checked finite after step 15: a failure's window starts at 16,
    # so step 11 (written at the end of step 10) is where it resumes
    assert points(tmp_path, [11, 21, 31], verified_after=15) == [11, 21, 31]


def test_only_the_latest_points_and_the_window_s_are_held(tmp_path):
    steps = list(range(2, 2 + 3 * MAX_CHECKPOINT_POINTS))   # a checkpoint every step
    held = points(tmp_path, steps, verified_after=5)
    assert held == [6] + steps[-MAX_CHECKPOINT_POINTS:], held


def test_without_a_passing_check_only_the_latest_points_are_held(tmp_path):
    # no check passed: a window starts at step 1, which no checkpoint precedes
    held = points(tmp_path, list(range(2, 40)), verified_after=None)
    assert held == list(range(40 - MAX_CHECKPOINT_POINTS, 40)), held


def test_a_parameter_check_follows_each_new_checkpoint_once(tmp_path):
    """A checkpoint written at the end of step 10 is the resume point of step 11: the Parameters are checked at the
    end of step 11 (once), so a later failure's window starts after it without the file being read back; ParamChecks
    asks that besides its budget."""
    from mindguard.training.checks.checked import ParamChecks
    from mindguard.training.step.steps import StepInfo, TrainingCall

    keeper = StateKeeper(tmp_path, on_disk=True)
    assert not keeper.checkpoint_to_check(5)            # no checkpoint yet
    keeper.checkpoints[11] = object()
    assert not keeper.checkpoint_to_check(10)           # (not before its step)
    assert keeper.checkpoint_to_check(11) and not keeper.checkpoint_to_check(12), "once per checkpoint"
    keeper.checkpoints[21] = object()
    assert keeper.checkpoint_to_check(23) and not keeper.checkpoint_to_check(24)

    checks = ParamChecks()
    checks.use_budget()
    checks.keeper = keeper
    assert checks.budget is not None
    checks.budget.due = lambda step: False   # (the budget's own choice is tested in test_fast_budget.py)
    keeper.schedule.refused_for_memory = True   # a state too big to copy: its checkpoints are its only resume points
    call = TrainingCall(index=1, network="Net", kind="train")
    keeper.checkpoints[31] = object()
    asked = [s for s in range(30, 40) if checks.due(StepInfo(global_step=s, call=call))]
    assert asked == [31], asked


def test_a_state_written_from_the_parameters_waits_for_long_enough_steps_its_budget_and_the_last_checkpoint(
        tmp_path, capsys):
    """A state too big to copy is written straight from the Parameters (the step it begins waits for it): only when
    its estimated write (size / the last write's rate, 1 GB/s until one was timed) delays a step by at most 2 typical
    (median) steps -- said once when it would not --, when the budget allows it (0.5 % of the training time) and no
    sooner after the training's own checkpoint became a resume point."""
    keeper = StateKeeper(tmp_path, on_disk=True)
    schedule = keeper.schedule
    schedule.streaming = True
    keeper._nbytes = ([], 10 ** 9)   # 1 GB: ~1 s at the assumed rate
    keeper.pace.recent.extend([0.15] * 9 + [5.0] * 3)   # (the median: checkpoint steps' stalls do not count)
    schedule.disk_time = schedule.training_time(time.monotonic()) - 1e6
    assert not keeper.due(5) and not keeper.due(6)
    said = capsys.readouterr().err
    assert said.count("not writing the training state (1.00 GB) from the Parameters for now: ~1.00 s would delay a "
                      "0.150 s step more than 2x") == 1, said
    keeper.pace.recent.extend([0.6] * 15)   # 1 s <= 2 x 0.6 s
    schedule.disk_time = schedule.training_time(time.monotonic()) - 100   # 1 s at 0.5 %: a write per 200 s
    assert keeper.due(7)   # the run's first resume point: at once, when the stall rule allows it (issue 51)
    keeper.on_disk_states[4] = tmp_path / "step-4"   # one written: the next ones wait for the budget
    assert not keeper.due(7)
    schedule.disk_time = schedule.training_time(time.monotonic()) - 201
    assert keeper.due(7)
    schedule.point_time = schedule.training_time(time.monotonic()) - 10   # a checkpoint became a resume point 10 s ago
    assert not keeper.due(7)
    schedule.write_rate = 4e9   # the last write took 0.25 s: one per 50 s
    schedule.point_time = schedule.training_time(time.monotonic()) - 51
    assert keeper.due(8)
