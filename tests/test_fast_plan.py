"""The route `mindguard hunt --from RECORD` takes (mindguard.hunt.plan): every decision, without MindSpore.

The records are shaped as an always-on Guard writes them (tests/test_from_run.py writes real ones)."""
from __future__ import annotations

import pytest

from mindguard.hunt.plan import FromRecordPlan, located_failure, plan_from_record

pytestmark = pytest.mark.fast

COMMAND = ["python", "train.py", "--lr", "0.1"]


def record(**fields):
    base = {"schema": 2, "status": "failed", "kind": "nonfinite_loss", "global_step": 1500, "phase": "step",
            "argv": list(COMMAND), "kept_state": {"path": "/r/mindguard_failure.state/step-1400", "step": 1400}}
    base.update(fields)
    return base


STATE = {"schema": 1, "step": 1400}


def test_an_exact_failure_resumes_and_locates_the_step_to_keep_its_state():
    plan = plan_from_record(record(), STATE, COMMAND, "dump")
    assert (plan.route, plan.window, plan.state_step, plan.locate) == ("resume", (1500, 1500), 1400, True)
    assert plan.warnings == ()


def test_a_window_is_narrowed_by_the_locate_pass():
    plan = plan_from_record(record(failure_window=[1460, 1500], kind="nonfinite_params"), STATE, COMMAND, "dump")
    assert (plan.route, plan.window, plan.locate) == ("resume", (1460, 1500), True)
    assert "1460-1500" in plan.why


def test_a_state_kept_at_the_failing_step_needs_no_locate_pass():
    plan = plan_from_record(record(global_step=1400), STATE, COMMAND, "replay")
    assert (plan.route, plan.locate) == ("resume", False)


def test_a_dataset_error_is_examined_straight_from_the_kept_state():
    plan = plan_from_record(record(kind="exception", phase="between_steps"), STATE, COMMAND, "dataset")
    assert (plan.route, plan.locate) == ("resume", False)


def test_a_window_only_for_nonfinite_kinds():
    plan = plan_from_record(record(kind="exception", failure_window=[1460, 1500]), STATE, COMMAND, "dump")
    assert plan.window == (1500, 1500)


@pytest.mark.parametrize("fields, state, why", [
    ({"kept_state": None}, STATE, "kept no training state"),
    ({}, None, "gone or unreadable"),
    ({"failure_window": [1300, 1500], "kind": "nonfinite_params"}, STATE, "not before the failure's first"),
    ({}, {"schema": 1, "step": 1}, "not before"),
])
def test_an_unusable_state_falls_back_to_the_two_passes_and_says_why(fields, state, why):
    plan = plan_from_record(record(**fields), state, COMMAND, "dump")
    assert plan.route == "from_step_1" and why in plan.why, plan


@pytest.mark.parametrize("fields, outcome, code", [
    ({"status": "finished", "kind": None}, "healthy", None),
    ({"kind": "interrupted"}, "command_failed", 130),
    ({"kind": "exception", "phase": "script", "message": "ValueError: bad"}, "command_failed", 1),
    ({"global_step": None}, "failed_before_training", None),
    ({"status": "running", "kind": None, "global_step": None}, "failed_before_training", None),
])
def test_nothing_to_examine(fields, outcome, code):
    plan = plan_from_record(record(**fields), STATE, COMMAND, "dump")
    assert (plan.route, plan.outcome, plan.returncode) == ("done", outcome, code), plan


def test_a_run_that_died_mid_step_is_examined_as_an_exception_at_that_step():
    plan = plan_from_record(record(status="running", kind=None), STATE, COMMAND, "dump")
    assert plan.route == "resume" and plan.failure["kind"] == "exception" and plan.failure["status"] == "failed"
    assert "without its record saying why" in plan.failure["message"]


def test_another_command_is_tried_with_a_warning():
    plan = plan_from_record(record(), STATE, ["python", "train.py"], "dump")
    assert plan.route == "resume" and "the kept state is used only if" in plan.warnings[0]


@pytest.mark.parametrize("located, ok", [
    (None, False),
    ({"global_step": 1470, "kind": "nonfinite_params"}, True),     # the Parameters, before the loss showed it
    ({"global_step": 1459, "kind": "nonfinite_params"}, False),    # before the window: another failure
    ({"global_step": 1480, "kind": "exception"}, False),
])
def test_the_located_failure_must_be_the_recorded_one(located, ok):
    plan = FromRecordPlan("resume", "", failure={"kind": "nonfinite_loss"}, window=(1460, 1500), state_step=1400,
                          locate=True)
    found, where = located_failure(located, plan)
    assert (found is not None) == ok, where


def test_an_exception_must_repeat_at_its_step():
    plan = FromRecordPlan("resume", "", failure={"kind": "exception"}, window=(33, 33), state_step=20, locate=True)
    assert located_failure({"global_step": 33, "kind": "exception"}, plan)[0] is not None
    assert located_failure({"global_step": 33, "kind": "nonfinite_loss"}, plan)[0] is None
