"""Where a divergence began (mindguard.protocol.divergence) and what `mindguard verify` may judge from a kept state
(mindguard.hunt.verify_plan, mindguard.training.child.verify_run.edit_begins), on synthetic loss series, without
MindSpore. tests/test_divergence.py runs the real thing."""
from __future__ import annotations

import math
import random

import pytest

from mindguard.protocol.divergence import (LossHistory, describe_rate, find_onset, history_losses, resume_blind,
                                           summarize)
from mindguard.hunt.verify_plan import VerifyPlan, from_step_1, judge, plan_verify, still_growing
from mindguard.training.child.verify_run import edit_begins

pytestmark = pytest.mark.fast


def series(values, start=1):
    return {start + i: v for i, v in enumerate(values)}


def noisy(rng, level, n, spread=0.05):
    return [level * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


def test_a_steady_growth_over_many_steps_names_its_onset():
    rng = random.Random(0)
    flat = noisy(rng, 0.69, 20)
    climb = [0.69 * 1.12 ** k * (1 + rng.uniform(-0.1, 0.1)) for k in range(1, 30)]
    onset = find_onset(series(flat + climb + [math.inf]))
    assert onset.kind == "growth" and 15 <= onset.onset <= 21, onset
    assert (onset.end, onset.failed) == (49, 50) and onset.factor > 10
    assert onset.words().startswith("the loss grew from ") and "then +inf at global step 50" in onset.words()


def test_a_noisy_growth_with_dips_is_still_a_growth():
    """The measured LSTM series: the loss dips back (1.46 after 3.69) while it climbs."""
    text = ("0.676 0.668 0.696 0.708 0.651 0.675 0.68 0.703 0.775 0.873 0.9 0.857 1.09 0.852 1.34 1.61 2.76 3.07 "
            "3.69 1.46 7.09 5.86 7.51 6.93 8.85 10.1 11.4 15.7 14.5 16.3 18.2 22.6 25.3 19.7 28.1 24.3 30.8 51.2 "
            "52.1 36.8 inf")
    onset = find_onset(series([float(v) for v in text.split()]))
    assert (onset.kind, onset.onset, onset.end, onset.failed) == ("growth", 5, 40, 41), onset


def test_one_bad_batch_on_a_flat_loss_is_a_spike_not_a_divergence():
    rng = random.Random(1)
    onset = find_onset(series(noisy(rng, 0.7, 40) + [80.0, math.nan]))
    assert (onset.kind, onset.onset, onset.failed) == ("spike", 41, 42), onset
    assert "not a divergence" in onset.words()


def test_a_flat_loss_then_inf_is_sudden():
    rng = random.Random(2)
    onset = find_onset(series(noisy(rng, 2.3, 60) + [math.inf]))
    assert onset.kind == "sudden" and onset.failed == 61 and "no divergence" in onset.words()


def test_heavy_noise_on_a_flat_loss_is_no_growth():
    rng = random.Random(3)
    for _ in range(20):   # log-normal noise of sigma 0.5: single steps 3x up and down, no trend
        values = [2.0 * math.exp(rng.gauss(0, 0.5)) for _ in range(80)] + [math.nan]
        assert find_onset(series(values)).kind in ("sudden", "spike")


def test_a_few_high_steps_on_a_flat_loss_are_no_sustained_climb():
    rng = random.Random(4)
    values = noisy(rng, 1.0, 40)
    for i in (30, 33, 36, 39):
        values[i] = 8.0
    assert find_onset(series(values + [math.inf])).kind != "growth"


def test_a_loss_that_went_down_then_grew_starts_at_the_foot_of_the_climb():
    values = [2.0 * 0.97 ** i for i in range(50)]
    values += [values[-1] * 1.15 ** k for k in range(1, 40)]
    onset = find_onset(series(values + [math.inf]))
    assert onset.kind == "growth" and onset.onset == 50, onset


def test_too_few_steps_cannot_tell():
    assert find_onset(series([0.7, 0.8, math.inf])).kind == "unknown"


def test_a_warm_up_schedule_that_peaked_before_the_climb_is_named_the_origin():
    rng = random.Random(5)
    losses = series(noisy(rng, 0.69, 5) + [0.69 * 1.2 ** k for k in range(1, 30)] + [math.inf])
    rate = {"name": "learning_rate", "schedule": [0.5 * min(1.0, (i + 1) / 4) for i in range(100)], "offset": 0}
    described = describe_rate(rate, find_onset(losses))
    assert described["origin"] and described["peak_step"] == 4 and described["at_start"] == 0.125
    assert "rising to 0.5 at global step 4" in described["words"] and "lower it" in described["words"]
    entry = summarize(losses, rate)
    assert entry["kind"] == "growth" and entry["rate"]["origin"]


def test_a_rate_set_by_a_callback_is_read_from_its_changes():
    losses = series([1.0] * 10 + [1.0 * 1.3 ** k for k in range(1, 20)] + [math.nan])
    rate = {"name": "learning_rate", "changes": [[1, 0.01], [8, 0.04], [9, 0.16]]}
    described = describe_rate(rate, find_onset(losses))
    assert described["kind"] == "set by the script" and described["peak"] == 0.16 and described["origin"]


def test_a_rate_that_rose_only_after_the_climb_began_is_not_the_origin():
    losses = series([1.0] * 10 + [1.0 * 1.3 ** k for k in range(1, 20)] + [math.nan])
    rate = {"name": "lr", "changes": [[1, 0.01], [25, 0.1]]}
    assert describe_rate(rate, find_onset(losses))["origin"] is False


def test_the_history_keeps_the_last_steps_exactly_and_thins_older_ones():
    history = LossHistory(exact=8)
    for step in range(1, 101):
        history.note(step, float(step))
    assert history.steps[-8:] == list(range(93, 101)) and len(history.steps) <= 16 and history.steps[0] == 1
    history.note(99, 5.0)   # a step noted again replaces the later ones
    assert history.steps[-1] == 99 and history.losses[-1] == 5.0
    assert history_losses({"steps": [1, 2], "loss": [0.5, "inf"]}) == {1: 0.5, 2: math.inf}


RECORD = {"schema": 2, "status": "failed", "kind": "nonfinite_loss", "global_step": 50, "phase": "step",
          "kept_state": {"path": "/r/s/step-47", "step": 47}, "param_checks": {"step_ms": 10.0},
          "divergence": {"kind": "growth", "onset": 4, "end": 49, "failed": 50}}


@pytest.mark.parametrize("kept", [10, 47])
def test_a_state_kept_inside_the_climb_is_verified_from_step_1(kept):
    plan = plan_verify(RECORD, {"schema": 1, "step": kept})
    assert (plan.route, plan.first, plan.through, plan.state_step) == ("from_start", 1, 55, kept), plan
    assert "already growing" in plan.note and "since global step 4" in plan.note


def test_a_state_kept_before_the_climb_resumes_and_a_slow_run_is_not_started():
    assert plan_verify(RECORD, {"schema": 1, "step": 3}).route == "resume"
    assert resume_blind(RECORD["divergence"], 3) is None and resume_blind(RECORD["divergence"], 5) == 4
    slow = dict(RECORD, param_checks={"step_ms": 60_000.0})   # a minute a step: 55 minutes from step 1
    plan = plan_verify(slow, {"schema": 1, "step": 47}, retry="RETRY-LINE")
    assert plan.route == "cannot" and "over 900 s" in plan.why and "RETRY-LINE" in plan.why, plan.why


def test_a_sudden_failure_resumes_from_the_kept_state_as_before():
    record = dict(RECORD, divergence={"kind": "sudden", "end": 49, "failed": 50})
    assert plan_verify(record, {"schema": 1, "step": 47}).route == "resume"


def test_an_edit_that_acts_before_the_kept_state_is_never_judged_from_it():
    plan = VerifyPlan("resume", "", (50, 50), 50, 47, 47, 55)
    earlier = {"from_step": 1, "what": "learning rate learning_rate differs from global step 1 on"}
    verdict = judge(plan, None, {"earlier": earlier, "losses": {}}, {}, returncode=2, retry="RETRY")
    assert verdict.outcome == "cannot" and verdict.earlier == earlier and "RETRY" in verdict.headline
    again = from_step_1(plan, RECORD, "the edit changes the training from global step 1 on", "RETRY")
    assert (again.route, again.first, again.through) == ("from_start", 1, 55)


@pytest.mark.parametrize("kept, script, step, counter, begins", [
    ([0.001], [0.0005], 47, None, 1),                              # a fixed rate: from step 1
    ([0.1, 0.2, 0.3, 0.3, 0.3], [0.1, 0.2, 0.3, 0.3, 0.3], 4, 3, 4),  # the same schedule: not before the state
    ([0.1, 0.2, 0.3, 0.3, 0.3], [0.1, 0.2, 0.3, 0.25, 0.25], 3, 2, 4),  # differs from index 3: step 4, after it
    ([0.1, 0.2, 0.3, 0.3, 0.3], [0.05, 0.1, 0.15, 0.15, 0.15], 5, 4, 1),
    ([0.1, 0.2, 0.3, 0.3, 0.3], [0.1, 0.2, 0.3, 0.25, 0.25], 5, 9, 1),  # a second call: the counter runs ahead
])
def test_where_a_learning_rate_edit_begins(kept, script, step, counter, begins):
    assert edit_begins(kept, script, step, counter) == begins


def test_a_fix_that_keeps_the_loss_finite_while_it_still_grows_is_not_a_fix():
    plan = VerifyPlan("from_start", "", (50, 50), 50, 47, 1, 55)
    failing = {s: 0.69 * (1.1 ** max(0, s - 4)) for s in range(1, 50)} | {50: math.inf}
    clamped = {s: min(0.69 * (1.08 ** max(0, s - 4)), 13.8) for s in range(1, 56)}   # log(p + 1e-6): <= 13.8
    growing = {s: 0.69 * (1.08 ** max(0, s - 4)) for s in range(1, 56)}
    assert still_growing(growing, failing, plan) is not None
    verdict = judge(plan, None, {"losses": {str(s): v.hex() for s, v in growing.items()}}, failing, returncode=0)
    assert verdict.outcome == "fails" and "still grows" in verdict.headline and verdict.failed_step is None
    settled = {s: 0.69 for s in range(1, 56)}
    assert judge(plan, None, {"losses": {str(s): v.hex() for s, v in settled.items()}}, failing,
                 returncode=0).outcome == "holds"
    assert still_growing(clamped, failing, plan) is not None   # a clamp that caps the climbing loss hides it


def test_a_converged_loss_wobbling_near_zero_is_no_divergence():
    """Measured (tests/zoo/long_run_norm.py): 0.3 at the start, then 1e-14 .. 5e-5 near the end -- orders of
    magnitude up from the lowest, still far below where the training began."""
    rng = random.Random(6)
    values = [0.3 * 0.8 ** i for i in range(60)] + [10 ** rng.uniform(-14, -5) for _ in range(60)]
    values += [1e-12 * 3 ** k for k in range(1, 14)]   # a climb from 1e-12 to ~1.6e-6
    assert find_onset(series(values + [math.nan])).kind != "growth"
