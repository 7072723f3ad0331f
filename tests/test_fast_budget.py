"""The Parameter-check budget of an always-on Guard (mindguard.training.checks.budget): its decisions, on a simulated
clock.

Pure Python (no MindSpore): the periods are what a training step would take; a check adds its cost to the period
it falls in (its own time and what it does to the next step), as measured on CPU (docs/mindspore-facts.md).
"""
from __future__ import annotations

import pytest

from mindguard.training.checks.budget import CheckBudget

pytestmark = pytest.mark.fast


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def simulate(steps: int, step_s: float, check_s: float, *, own_s: float = None, fraction: float = 0.01,
             max_interval: int = 1000):
    """Train ``steps`` steps of ``step_s`` seconds; a check adds ``check_s`` to its period. Returns the budget and the
    global steps checked."""
    clock = Clock()
    budget = CheckBudget(fraction=fraction, max_interval=max_interval, clock=clock)
    checked = []
    for step in range(1, steps + 1):
        clock.now += step_s
        budget.end_period()
        if budget.due(step):
            checked.append(step)
            clock.now += check_s
            budget.charge(step, check_s if own_s is None else own_s)
    return budget, checked


def test_checks_spend_about_the_fraction_of_the_training_time():
    budget, checked = simulate(5000, step_s=0.015, check_s=0.0125, own_s=0.0025)   # the MLP of issue 28
    spent = len(checked) * 0.0125
    total = 5000 * 0.015
    assert 0.005 < spent / total <= 0.0125, (len(checked), spent / total)
    # the next step's slowdown is counted: the cost is the period's growth, not only the check's own 2.5 ms
    assert budget.cost() == pytest.approx(0.0125, rel=0.05), budget.describe()
    assert budget.interval() == pytest.approx(0.0125 / (0.01 * 0.015), rel=0.1), budget.describe()


def test_a_cheap_check_runs_every_step_or_nearly():
    budget, checked = simulate(400, step_s=1.0, check_s=0.001)
    assert len(checked) >= 390, len(checked)
    assert budget.interval() == 1.0


def test_the_first_step_is_never_checked_and_the_probe_alternates():
    _, checked = simulate(8, step_s=0.01, check_s=0.01)
    assert checked[:3] == [2, 4, 6], checked


def test_max_interval_bounds_the_window_whatever_the_cost():
    _, checked = simulate(3000, step_s=0.001, check_s=1.0, max_interval=100)
    gaps = [b - a for a, b in zip(checked, checked[1:])]
    assert gaps and max(gaps) <= 100, gaps[-5:]


def test_one_long_pause_does_not_stop_the_checks():
    clock = Clock()
    budget = CheckBudget(clock=clock)
    checked = []
    for step in range(1, 3001):
        clock.now += 60.0 if step == 500 else 0.01   # an evaluation or a checkpoint between two steps
        budget.end_period()
        if budget.due(step):
            checked.append(step)
            clock.now += 0.002
            budget.charge(step, 0.002)
    after = [s for s in checked if s > 500]
    assert after and after[0] < 600 and len(after) > 20, after[:5]


def test_epoch_end_checks_only_while_not_in_debt():
    clock = Clock()
    budget = CheckBudget(clock=clock)
    for step in range(1, 12):
        clock.now += 0.01
        budget.end_period()
        if budget.due(step):
            clock.now += 0.05
            budget.charge(step, 0.05)
    budget.charge(11, 0.05)   # a forced check (a non-finite loss, the training's end) is charged too
    assert budget.credit < 0 and not budget.epoch_end_due(), budget.credit


@pytest.mark.parametrize("fraction, interval", [(0, 10), (1.5, 10), (0.01, 0)])
def test_bad_settings_are_refused(fraction, interval):
    with pytest.raises(ValueError):
        CheckBudget(fraction=fraction, max_interval=interval)


def test_the_time_between_epochs_is_no_period():
    """A checkpoint or an evaluation between two epochs (here 30 s, after a check at the epoch's end) must not be
    taken for the cost of a check."""
    clock = Clock()
    budget = CheckBudget(clock=clock)
    for epoch in range(3):
        for step in range(epoch * 100 + 1, epoch * 100 + 101):
            clock.now += 0.01
            budget.end_period()
            if budget.due(step):
                clock.now += 0.0005
                budget.charge(step, 0.0005)
        budget.charge(step, 0.0005)   # the epoch's end check
        budget.pause()
        clock.now += 30.0
    assert budget.cost() < 0.002 and budget.plain == pytest.approx(0.01, rel=0.2), budget.describe()


def test_one_slow_checked_period_does_not_stop_the_checks():
    """The first checked period held other work (a disk write, a compile): 100x a step. The median of recent
    samples forgets it, so the checks go on at the interval the real cost gives."""
    clock = Clock()
    budget = CheckBudget(clock=clock)
    checked = []
    for step in range(1, 2001):
        clock.now += 0.01
        budget.end_period()
        if budget.due(step):
            checked.append(step)
            clock.now += 1.0 if len(checked) == 1 else 0.001
            budget.charge(step, 0.001)
    assert budget.cost() == pytest.approx(0.001, rel=0.3), budget.describe()
    assert len([s for s in checked if s > 1000]) >= 50, checked[-10:]


def test_a_discarded_period_is_no_sample():
    clock = Clock()
    budget = CheckBudget(clock=clock)
    for step in range(1, 50):
        clock.now += 0.01
        budget.end_period()
        if step == 20:
            budget.discard_period()
            clock.now += 5.0   # the training state kept: its own budget
    assert budget.plain == pytest.approx(0.01)


def test_the_state_keepers_interval_is_of_training_time(monkeypatch, tmp_path):
    """The state keeper's clock stops at an epoch's or a call's end (``pause``) and runs again at the next step: an
    evaluation (or another model's training in the process) between two epochs is not training time."""
    from mindguard.training.state import keeper as _keeper, resume as _resume

    clock = Clock()
    clock.now = 1000.0
    monkeypatch.setattr(_keeper.time, "monotonic", clock)
    keeper = _resume.StateKeeper(tmp_path, min_seconds=10.0, budget=0.005)
    clock.now += 6.0
    assert not keeper.due(2), "6 s of training: the 10 s interval has not passed"
    keeper.pause()
    clock.now += 300.0   # an evaluation
    assert not keeper.due(3), "the 300 s of evaluation counted as training time"
    clock.now += 4.5
    assert keeper.due(4), "10.5 s of training since the keeper started"
    keeper.pause()
    keeper.pause()       # a second pause (the epoch's end, then the call's) changes nothing
    clock.now += 50.0
    assert keeper.due(5)


# -- the window a failure lies in (mindguard.training.checks.checked) ------------------------------------------------
def test_a_failures_window_runs_from_the_step_after_the_last_passing_check():
    from mindguard.training.checks.checked import ParamChecks
    from mindguard.training.step.steps import StepInfo, TrainingCall

    call = TrainingCall(index=1, network="Net", kind="train")
    checks = ParamChecks()
    assert checks.window_fields(StepInfo(global_step=9, call=call), "nonfinite_loss") == {}, "every step is checked"
    checks.use_budget(0.01)
    checks.note_checked(StepInfo(global_step=5, call=call), finite=True, seconds=0.001)
    checks.note_checked(StepInfo(global_step=7, call=call), finite=False, seconds=0.001)
    fields = checks.window_fields(StepInfo(global_step=9, call=call), "nonfinite_params")
    assert fields["params_finite_after"] == 5 and fields["failure_window"] == [6, 9], fields
    assert checks.checked_at(StepInfo(global_step=7, call=call)) and not checks.checked_at(StepInfo(global_step=9,
                                                                                                 call=call))
    assert "failure_window" not in checks.window_fields(StepInfo(global_step=9, call=call), "exception")
    checks.note_checked(StepInfo(global_step=9, call=call), finite=True, seconds=0.001)
    assert "failure_window" not in checks.window_fields(StepInfo(global_step=9, call=call), "nonfinite_loss"), \
        "checked finite after the failing step itself: the step is exact"
