"""The training's own checkpoints as resume points (mindguard.training.keeper): a failure whose window starts before
the latest checkpoints still finds the one it can resume from (a failing run of the 1 GB embedding model kept no
state when its window began before the last two checkpoints, which were all that was held)."""
from __future__ import annotations

import pytest

from mindguard.training.keeper import MAX_CHECKPOINT_POINTS, StateKeeper

pytestmark = pytest.mark.fast


def points(tmp_path, steps, verified_after):
    keeper = StateKeeper(tmp_path, on_disk=True)
    for step in steps:   # as note_checkpoints adds them, one at a time
        keeper.checkpoints[step] = object()
        keeper._drop_old_checkpoints(verified_after)
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
    from mindguard.training.checked import ParamChecks
    from mindguard.training.steps import StepInfo, TrainingCall

    keeper = StateKeeper(tmp_path, on_disk=True)
    assert not keeper.checkpoint_to_check(5)            # no checkpoint yet
    keeper.checkpoints[11] = object()
    assert not keeper.checkpoint_to_check(10)           # (not before its step)
    assert keeper.checkpoint_to_check(11) and not keeper.checkpoint_to_check(12), "once per checkpoint"
    keeper.checkpoints[21] = object()
    assert keeper.checkpoint_to_check(23) and not keeper.checkpoint_to_check(24)

    checks = ParamChecks()
    checks.use_budget()
    assert checks.budget is not None
    checks.budget.due = lambda step: False   # (the budget's own choice is tested in test_fast_budget.py)
    keeper.refused_for_memory = True   # a state too big to copy: its checkpoints are its only resume points
    call = TrainingCall(index=1, network="Net", kind="train")
    keeper.checkpoints[31] = object()
    asked = [s for s in range(30, 40) if checks.due(StepInfo(global_step=s, call=call), keeper)]
    assert asked == [31], asked
