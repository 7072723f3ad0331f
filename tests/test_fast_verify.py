"""`mindguard verify`'s decisions (mindguard.hunt.verify_plan, mindguard.training.child.verify_run.mismatch), without
MindSpore: which steps it trains, and what it says about what they did. The records are shaped as an always-on Guard
writes
them (tests/test_verify.py verifies real ones)."""
from __future__ import annotations

import math

import pytest

from mindguard.training.child.verify_run import mismatch
from mindguard.hunt.verify_plan import (DEFAULT_MORE_STEPS, FAR_FACTOR, VerifyPlan, far_losses, judge, parse_losses,
                                        plan_verify)

pytestmark = pytest.mark.fast

RETRY = "mindguard verify --from-start --from /r/mindguard_failure.json -- python train.py"


def record(**fields):
    base = {"schema": 2, "status": "failed", "kind": "nonfinite_loss", "global_step": 1500, "phase": "step",
            "kept_state": {"path": "/r/mindguard_failure.state/step-1493", "step": 1493}}
    base.update(fields)
    return base


STATE = {"schema": 1, "step": 1493}


def test_an_exact_failure_is_verified_from_the_kept_state_through_a_few_more_steps():
    plan = plan_verify(record(), STATE)
    assert (plan.route, plan.window, plan.first, plan.through) == ("resume", (1500, 1500), 1493,
                                                                     1500 + DEFAULT_MORE_STEPS)
    assert plan.failure_words() == "the failure at global step 1500"
    assert plan_verify(record(), STATE, steps=10).through == 1510


def test_a_window_is_trained_through_its_end():
    plan = plan_verify(record(kind="nonfinite_params", failure_window=[1494, 1600], global_step=1600), STATE, steps=0)
    assert (plan.window, plan.through) == ((1494, 1600), 1600)
    assert "1494-1600" in plan.failure_words() and "1600" in plan.failure_words()


@pytest.mark.parametrize("kept, meta, why", [
    (None, None, "kept no training state"),
    ({"path": "/gone", "step": 1493}, None, "is gone or unreadable"),
    ({"path": "/r/s", "step": 1501}, {"schema": 1, "step": 1501}, "not before the failure's first possible step"),
])
def test_no_usable_state_cannot_verify_and_says_to_train_from_step_1(kept, meta, why):
    plan = plan_verify(record(kept_state=kept), meta, retry=RETRY)
    assert plan.route == "cannot" and why in plan.why and RETRY in plan.why, plan.why


def test_from_start_needs_no_kept_state_and_notes_losses_from_the_window():
    plan = plan_verify(record(kept_state=None), None, from_start=True)
    assert (plan.route, plan.first, plan.through) == ("from_start", 1500, 1505)


@pytest.mark.parametrize("fields, why", [
    ({"status": "finished"}, "finished without a failure"),
    ({"kind": "interrupted", "status": "failed"}, "interrupted"),
    ({"kind": "exception", "phase": "script", "message": "KeyError: 'x'"}, "the script's own code"),
    ({"global_step": 0}, "before its first training step"),
])
def test_a_run_that_did_not_fail_in_its_numbers_has_nothing_to_verify(fields, why):
    plan = plan_verify(record(**fields), STATE)
    assert plan.route == "cannot" and why in plan.why, plan.why


def losses(values):
    return {str(step): (None if v is None else float(v).hex()) for step, v in values.items()}


PLAN = VerifyPlan("resume", "", (1500, 1500), 1500, 1493, 1493, 1505)
FAILING = {s: 0.5 - 0.001 * (s - 1493) for s in range(1493, 1500)} | {1500: math.nan}


def test_finite_steps_through_the_failing_one_hold_with_the_losses_side_by_side():
    done = losses({s: 0.5 - 0.001 * (s - 1493) for s in range(1493, 1506)})
    verdict = judge(PLAN, None, {"losses": done}, FAILING, returncode=0)
    assert (verdict.outcome, verdict.exit_code) == ("holds", 0)
    assert verdict.headline == ("global steps 1493-1505 trained finite with the change (the failure at global step "
                                "1500 is gone)")
    table = "\n".join(verdict.lines)
    assert "1500" in table and "nan" in table and "<- failing step" in table and not verdict.far


def test_a_fix_that_wrecks_the_loss_is_flagged_though_finite():
    done = losses({s: (0.5 if s < 1500 else 4e5) for s in range(1493, 1506)})   # an epsilon on a count: huge
    verdict = judge(PLAN, None, {"losses": done}, FAILING, returncode=0)
    assert verdict.exit_code == 0 and verdict.far == list(range(1500, 1506))
    assert any(line.startswith("warning:") and "1500" in line for line in verdict.lines), verdict.lines


def test_the_far_rule_looks_up_only_and_spares_a_batch_the_failing_run_also_found_hard():
    failing = {1493: 1e-13, 1494: 2e-14, 1495: 0.13, 1496: 3e-14}
    verified = {1493: 5e-12, 1494: 1e-12, 1495: 0.14, 1496: 1e-15}
    assert far_losses(verified, failing, 1496) == ([], 0.13)   # much smaller is not "far"; 1495's batch was hard
    far, high = far_losses({1497: 0.13 * FAR_FACTOR * 2}, failing, 1496)
    assert far == [1497] and high == 0.13


def test_a_step_that_still_fails_names_it():
    failure = record(global_step=1500, kind="nonfinite_params", message="parameters became non-finite: emb")
    verdict = judge(PLAN, failure, {"losses": losses({1499: 0.4, 1500: 0.4})}, FAILING, returncode=0)
    assert (verdict.outcome, verdict.exit_code, verdict.failed_step) == ("fails", 1, 1500)
    assert verdict.headline.startswith("global step 1500 still fails with the change (nonfinite_params")


def test_a_state_that_does_not_load_cannot_verify_and_says_what_to_do():
    verdict = judge(PLAN, None, {"cannot_load": "Parameters renamed (kept but not in the edited script: a.w)"},
                    FAILING, returncode=2, retry=RETRY)
    assert verdict.exit_code == 2 and "a.w" in verdict.headline and RETRY in verdict.headline


def test_a_command_that_ends_before_the_failing_step_cannot_verify():
    verdict = judge(PLAN, None, {"losses": losses({1493: 0.5, 1494: 0.5})}, FAILING, returncode=1,
                    ended="NameError: name 'SafeNorm' is not defined")
    assert verdict.exit_code == 2 and "after global step 1494" in verdict.headline
    assert "NameError" in verdict.headline and "1500" in verdict.headline
    own = record(kind="exception", phase="script", message="KeyError: 'x'", global_step=1497)
    assert judge(PLAN, own, {}, FAILING, returncode=1).exit_code == 2


def test_losses_are_read_back_exactly():
    assert parse_losses({"3": (0.1).hex(), "4": "nan", "5": None, "6": "inf"})[3] == 0.1
    parsed = parse_losses({"4": "nan", "5": None, "6": "inf"})
    assert math.isnan(parsed[4]) and parsed[5] is None and parsed[6] == math.inf


def test_a_state_loads_by_name_and_a_rename_or_reshape_is_named():
    kept = ["embedding.table", "norm.x", "head.weight"]
    shapes = [[50, 16], [1], [1, 6]]
    assert mismatch(kept, shapes, list(reversed(kept)), list(reversed(shapes))) is None   # another order: loads
    renamed = mismatch(kept, shapes, ["embedding.0.table", "norm.x", "head.weight"], shapes)
    assert renamed.startswith("Parameters renamed") and "embedding.table" in renamed and "embedding.0.table" in renamed
    reshaped = mismatch(kept, shapes, kept, [[60, 16], [1], [1, 6]])
    assert reshaped.startswith("Parameters reshaped") and "[50, 16] -> [60, 16]" in reshaped


def test_the_report_page_shows_the_verify_line_the_hunt_printed_escaped():
    import copy
    import json
    from pathlib import Path

    from mindguard.report.page import render_page

    data = copy.deepcopy(json.loads((Path(__file__).parent / "data" / "page_demo.json").read_text()))
    assert "Check the fix without re-training" not in render_page(data)   # a hunt that printed none: no section
    data["run"]["verify"] = "mindguard verify --from /r/f.json -- python train.py --tag '<b>'"
    page = render_page(data)
    section = page[page.index('id="verify"'):page.index('id="graph"')]
    assert "mindguard verify --from /r/f.json -- python train.py --tag &#x27;&lt;b&gt;&#x27;" in section \
        or "--tag '&lt;b&gt;'" in section, section
    assert page.index('id="verdict"') < page.index('id="verify"') < page.index('id="graph"')
