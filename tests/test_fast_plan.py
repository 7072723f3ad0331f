"""The hunt's decisions (mindguard.hunt.plan): the route `mindguard hunt --from RECORD` takes, and the plain hunt's
choices (how a step is examined, what is dumped and how it widens, which iterations, whether to resume); every
decision, without MindSpore.

The records are shaped as an always-on Guard writes them (tests/test_from_run.py writes real ones)."""
from __future__ import annotations

import pytest

from mindguard.hunt.plan import (LOCATE_DUMP_BYTES, FromRecordPlan, choose_resume, dump_while_locating, examination,
                                 first_scope, iterations_to_dump, locate_dump_iterations, locate_dump_refusal,
                                 locate_dumped_steps, located_failure, not_worth_loading, plan_from_record,
                                 resumed_dump_iterations, resumed_iteration, wider_scope)
from mindguard.protocol.kept_state import StateMeta
from mindguard.training.state.warm_up import WARM_UP_STEPS, WarmUp, warm_up_kept, warm_up_steps

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
    ({"kept_state": None}, None, "kept no training state"),
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


# -- the plain hunt's decisions ---------------------------------------------------------------------------------
@pytest.mark.parametrize("fields, how", [
    ({"phase": "between_steps", "message": "Exception thrown from dataset pipeline"}, "dataset"),
    ({"phase": "between_steps", "message": "RuntimeError: MindData error"}, "dataset"),
    # the phase decides (the training process records "between_steps" only for the dataset pipeline), not the text
    ({"phase": "step", "message": "Exception thrown from dataset pipeline", "mode": "graph"}, "dump"),
    ({"examine": "replay", "mode": "graph"}, "replay"),          # the record says how (a GuardedTrainStep's refusal)
    ({"mode": "pynative"}, "replay"),
    ({"mode": "graph"}, "dump"),
])
def test_the_examination_follows_where_and_how_the_step_failed(fields, how):
    assert examination(record(**fields)) == how


def test_the_first_dump_is_narrow_unless_the_step_raised_or_nothing_is_kept_to_widen_from():
    assert first_scope(record()) == "outputs"
    assert first_scope(record(kind="exception")) == "full"              # read where it stopped: every input
    assert first_scope(record(group_size=2)) == "full"                  # several ranks
    assert first_scope(record(), requested="all_outputs") == "all_outputs"
    assert first_scope(record(), resume="never") == "full"              # no state kept at the step to widen from
    chain, scope = [], "outputs"
    while scope is not None:
        chain.append(scope)
        scope = wider_scope(scope)
    assert chain == ["outputs", "all_outputs", "full"]


@pytest.mark.parametrize("fields, iterations", [
    ({"dump_candidates": [7, 5, 7]}, [5, 7]),                            # a step that raised: each graph's guess
    ({"iteration_observed": True, "dump_graphs": {"0": 9, "1": 4}}, [4, 9]),
    ({"iteration_observed": True, "dump_iteration": 12}, [12]),
    ({"dump_iteration": 12}, [11, 12, 13]),                              # estimated: the step's neighbours too
    ({"global_step": 1}, [0, 1]),                                        # nothing known: from the step, 0-based
])
def test_the_iterations_dumped_are_the_observed_ones_else_the_estimate_and_its_neighbours(fields, iterations):
    assert iterations_to_dump(record(**fields)) == iterations


def test_the_resumed_dump_iteration_is_predicted_only_when_it_can_be_told():
    """One graph ran the kept and the failing step in one call, once per step in between: the failing step is
    iteration ``failing - kept`` of a process whose first graph run is the kept step; anything else: unknown."""
    failure = {"global_step": 10, "iteration_observed": True, "dump_graphs": {"0": 9}, "call": {"index": 3}}
    state = {"step": 7, "dump_graphs": {"0": 6}, "call": 3}
    assert resumed_iteration(failure, state) == 3
    assert resumed_iteration({**failure, "iteration_observed": False}, state) is None        # estimated, not seen
    assert resumed_iteration(failure, {**state, "call": 2}) is None                          # another training call
    assert resumed_iteration(failure, {**state, "dump_graphs": {"0": 4}}) is None            # other runs in between
    assert resumed_iteration({**failure, "dump_graphs": {"0": 9, "1": 3}}, state) is None    # two graphs
    assert resumed_iteration(failure, {**state, "dump_graphs": {}}) is None                  # not observed at kept


def test_a_resumed_pass_s_warm_up_numbers_the_kept_step_and_costs_its_steps():
    """A state kept 9 steps into its training call is resumed after those 9 steps ran for real (MindSpore's kernels
    launched as often as in the failing run: training/state/warm_up.py); one kept WARM_UP_STEPS steps in or later,
    after none (the kernels split by their timing by then); those launches come first in the dump's numbering, and in
    the time a resume costs."""
    assert [warm_up_steps(*args) for args in ((50, 41), (41, 41), (15, 1), (16, 1), (500, 1), (5, None))] == \
        [9, 0, 14, 0, 0, 0] and WARM_UP_STEPS == 15
    assert [StateMeta.from_json(m).warm_up for m in ({"warm_up": 9}, {}, {"warm_up": True}, {"warm_up": -2})] == \
        [9, 0, 0, 0]
    # a state whose step draws from a random source no state holds replays approximately: no warm-up is worth it
    assert (warm_up_kept(9, []), warm_up_kept(9, ["nn.Dropout in `net.drop`"])) == (9, 0)
    assert StateMeta.from_json({"step": 50, "warm_up": 9}).warm_up == 9
    warm = WarmUp(kept=50, count=9)
    ran = []
    for step in range(1, 51):
        warm.note_step(step)
        ran += [step] if warm.now else []
    assert ran == list(range(41, 50)), ran
    # the kept step is iteration 9 of the resumed process, the failing step 52 iteration 11 (open-ended)
    assert resumed_dump_iterations(50, 50, 9).startswith("9-") and resumed_dump_iterations(52, 50, 9).startswith("11-")
    assert resumed_dump_iterations(50, 50) == "all"
    plan = plan_from_record(record(global_step=52, kept_state={"path": "/r/s", "step": 50}),
                            {"step": 50, "warm_up": 9}, COMMAND, "dump")
    assert (plan.state_step, plan.state_warm_up, locate_dump_iterations(plan).split("-")[0]) == (50, 9, "10")
    failure = {"global_step": 10, "iteration_observed": True, "dump_graphs": {"0": 9}, "call": {"index": 3}}
    assert resumed_iteration(failure, {"step": 7, "dump_graphs": {"0": 6}, "call": 3, "warm_up": 6}) == 9
    # the warm-up's steps are not saved: 90 MB (~0.18 s to load) skip nothing at step 10, 0.5 s at step 60; a state
    # loaded in under a millisecond costs what the pass from step 1 does, and is loaded
    big = {"step": 10, "warm_up": 9, "step_seconds": 0.01, "bytes": 90_000_000}
    assert "skips ~0.00s of training (a resumed pass runs the 9 steps before it" in (not_worth_loading(big) or "")
    assert not_worth_loading(dict(big, step=60)) is None
    assert not_worth_loading(dict(big, bytes=300)) is None


def test_pass_2_resumes_only_when_pass_1_says_it_is_quicker():
    """--resume auto weighs launches x (start-up to the end of step 1) + the steps from the kept one against pass 1's
    own time to the failure; always resumes whenever a state was kept; never keeps nothing."""
    def choice(mode, first_step_end, step_seconds, failure_end, kept=500):
        state = {"schema": 1, "step": kept, "names": [], "first_step_end": first_step_end,
                 "step_seconds": step_seconds, "dump_graphs": {"0": kept - 1}, "call": 1}
        failure = {"global_step": 600, "iteration_observed": True, "dump_graphs": {"0": 599}, "call": {"index": 1},
                   "step_window_us": [0, int(failure_end * 1e6)]}
        return choose_resume(failure, state, 1000.0, "dump", mode)

    # 5 s to start and compile, 0.1 s a step, failing at 65 s: resumed ~5 + 101 x 0.1 = 15.1 s < 65 s
    quick = choice("auto", 1005.0, 0.1, 1065.0)
    assert (quick.resume, quick.kept_step, quick.from_step_1_s) == (True, 500, 65.0)
    assert quick.resumed_s == pytest.approx(15.1)
    slow = choice("auto", 1005.0, 0.1, 1012.0)                           # failing at 12 s: from step 1 is quicker
    assert not slow.resume and "re-running from step 1 is quicker (~12.0s vs ~15.1s resumed)" in slow.why
    assert choice("always", 1005.0, 0.1, 1012.0).resume
    assert choice("never", 1005.0, 0.1, 1065.0) is None
    assert choice("auto", 1005.0, 0.1, 1065.0, kept=1) is None          # a state of step 1 is what the script builds
    assert choice("auto", 1005.0, 0.1, 1065.0, kept=601) is None        # kept after the failing step
    unknown = choose_resume({"global_step": 600}, {"step": 500}, 1000.0, "dump", "auto")
    assert not unknown.resume and "no time for the failing step" in unknown.why


# -- one process for locate + examine: the locate pass dumps each step when that costs less than a second pass --
def _window_plan(**fields):
    return plan_from_record(record(failure_window=[1460, 1500], kind="nonfinite_params", **fields),
                            dict(STATE, bytes=5_000_000), COMMAND, "dump")


def _state(state_bytes, startup=None):
    """A kept state of ``state_bytes`` whose run took ``startup`` seconds from its start to its first step's end."""
    timed = {"process_started": 1000.0, "first_step_end": 1000.0 + startup} if startup is not None else {}
    return {"step": 1400, "bytes": state_bytes, **timed}


def test_a_small_model_s_locate_pass_dumps_each_step():
    plan = _window_plan()   # 101 steps from the kept state through the window's end
    assert dump_while_locating(plan, _state(5_000_000), "dump", "outputs") is None   # 0.3 GB
    assert dump_while_locating(plan, _state(15_000_000, startup=2.0), "dump", "outputs") is None   # 0.9 GB: 1.8 s


@pytest.mark.parametrize("state, free, code, facts", [
    (_state(15_000_000, startup=1.0), None, "writes_cost_more", {"steps": 101}),   # 1.8 s of writes against 1.1 s
    (_state(1_000_000_000, startup=10.0), None, "writes_cost_more", {"steps": 101, "total_bytes": 60.6e9}),
    (_state(LOCATE_DUMP_BYTES // 50), None, "bytes_cost_more", {"steps": 101}),   # no start time: 1.3 GiB is over
    (_state(0), None, "size_unknown", {}),
    (_state(5_000_000, startup=10.0), 1 << 30, "disk_space", {"free_bytes": 1 << 30}),
])
def test_a_locate_pass_does_not_dump_what_costs_more_than_a_second_pass(state, free, code, facts):
    refusal = locate_dump_refusal(_window_plan(), state, "dump", "outputs", free_bytes=free)
    assert refusal is not None and refusal.code == code, refusal
    for name, value in facts.items():
        assert getattr(refusal, name) == pytest.approx(value), (name, refusal)
    if code == "writes_cost_more":
        assert refusal.writes_s > refusal.second_pass_s, refusal
    # the one line said and kept in the summary is the code's sentence
    assert dump_while_locating(_window_plan(), state, "dump", "outputs", free_bytes=free)


def test_a_typed_kept_state_and_its_json_decide_alike():
    for state in (_state(15_000_000, startup=1.0), _state(5_000_000), _state(0)):
        assert locate_dump_refusal(_window_plan(), StateMeta.from_json(state), "dump", "outputs") == \
            locate_dump_refusal(_window_plan(), state, "dump", "outputs")


def test_a_big_state_over_few_steps_is_dumped_while_locating():
    """The 1 GB embedding table failing 5 steps after its checkpoint: ~3.7 GB of dump writes (~7 s) against a
    second process that builds the model again (~6 s to its first step) and is handed the 1 GB state (~10 s)."""
    plan = plan_from_record(record(global_step=36, failure_window=[31, 36], kind="nonfinite_params",
                                   kept_state={"path": "/r/s", "step": 31}), {"step": 31, "bytes": 1_024_000_000},
                            COMMAND, "dump")
    assert dump_while_locating(plan, dict(_state(1_024_000_000, startup=6.0), step=31), "dump", "outputs",
                               free_bytes=100 << 30) is None


def test_a_loss_failure_s_locate_pass_dumps_from_the_step_before_the_record_s_on():
    """Resumed at global step 1400 (the train graph's iteration 0), the loss non-finite at 1500 (iteration 100):
    iterations 99 on, open-ended (a graph run between the steps numbers them higher): two steps when numbered as
    expected. A failure a sparse Parameter check found dumps every step (its exact step is anywhere in the window)."""
    loss = plan_from_record(record(failure_window=[1460, 1500]), dict(STATE, bytes=5_000_000), COMMAND, "dump")
    assert (loss.state_step, loss.window) == (1400, (1460, 1500))
    first, last = locate_dump_iterations(loss).split("-")
    assert int(first) == 99 and int(last) >= 99 + 100_000, locate_dump_iterations(loss)
    assert locate_dumped_steps(loss) == 2
    assert (locate_dump_iterations(_window_plan()), locate_dumped_steps(_window_plan())) == ("all", 101)
    near = plan_from_record(record(global_step=1401, failure_window=[1400, 1401]), dict(STATE, bytes=1000),
                            COMMAND, "dump")
    assert (near.state_step, locate_dump_iterations(near), locate_dumped_steps(near)) == (1400, "all", 2)
    big = plan_from_record(record(global_step=36, failure_window=[31, 36], kept_state={"path": "/r/s", "step": 31}),
                           {"step": 31, "bytes": 1_024_000_000}, COMMAND, "dump")
    assert locate_dump_iterations(big).startswith("4-")
    # two steps of the 1 GB table's dump (~1.2 GB, ~2.5 s) against a second process (~6 s + the state's hand-over)
    assert dump_while_locating(big, dict(_state(1_024_000_000, startup=6.0), step=31), "dump", "outputs",
                               free_bytes=100 << 30) is None


@pytest.mark.parametrize("how, scope, ranks, fields, code", [
    ("replay", "outputs", 1, {}, "not_a_dump"),
    ("dump", "outputs", 2, {}, "several_ranks"),
    ("dump", "outputs", 1, {"dataset_sink_mode": True}, "sink_mode"),
])
def test_the_locate_pass_dumps_only_one_process_s_narrow_compiled_look(how, scope, ranks, fields, code):
    plan = _window_plan(**fields)
    refusal = locate_dump_refusal(plan, _state(1000), how, scope, ranks)
    assert refusal is not None and refusal.code == code, refusal


def test_a_killed_run_s_locate_pass_does_not_dump():
    plan = plan_from_record(record(status="running", kind=None, failure_window=None), dict(STATE, bytes=1000),
                            COMMAND, "dump")
    assert plan.killed and plan.locate, plan
    refusal = locate_dump_refusal(plan, _state(1000), "dump", "outputs")
    assert refusal is not None and refusal.code == "killed", refusal


def test_a_dump_from_the_kept_step_on_is_known_to_hold_that_step():
    from mindguard.hunt.plan import dumps_every_iteration_from, resumed_dump_iterations

    assert dumps_every_iteration_from("all") and dumps_every_iteration_from(resumed_dump_iterations(5, 5, 4))
    assert resumed_dump_iterations(5, 5, 4) == "4-1000004"
    assert not dumps_every_iteration_from("3|4|5") and not dumps_every_iteration_from("4-9")
    assert not dumps_every_iteration_from(None)
