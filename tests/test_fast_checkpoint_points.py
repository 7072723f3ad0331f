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
    # so step 11 (written at the end of step 10) is where it resumes if no later checkpoint reads back finite
    assert points(tmp_path, [11, 21, 31], verified_after=15) == [11, 21, 31]


def test_only_the_latest_points_and_the_window_s_are_held(tmp_path):
    steps = list(range(2, 2 + 3 * MAX_CHECKPOINT_POINTS))   # a checkpoint every step
    held = points(tmp_path, steps, verified_after=5)
    assert held == [6] + steps[-MAX_CHECKPOINT_POINTS:], held


def test_without_a_passing_check_only_the_latest_points_are_held(tmp_path):
    # no check passed: a window starts at step 1, which no checkpoint precedes
    held = points(tmp_path, list(range(2, 40)), verified_after=None)
    assert held == list(range(40 - MAX_CHECKPOINT_POINTS, 40)), held
