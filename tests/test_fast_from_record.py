"""``mindguard hunt --from RECORD`` (:meth:`mindguard.hunt.executor.Executor.from_record`) through its routes, with the
fake pass runner of tests/test_fast_executor.py: the record and the kept state are files as an always-on Guard
leaves them (a ``state.json`` and its ``state.npz``, checksummed), each pass hands back the records and
``pass_status.json`` facts a training process would leave, and a locate pass keeps its state at the step it stops at
as the real one does. Checked: the passes asked, the outcome, the summary's route and fallback -- and, for the rules,
their reason codes (:mod:`mindguard.hunt.rules`), never their sentences.

Steps are 1-based global steps. No MindSpore, no process.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from test_fast_executor import COMMAND, FakeRunner, Script, asked, record

from mindguard._util.io import file_sha256
from mindguard.hunt.context import HuntContext, Options
from mindguard.hunt.executor import Executor
from mindguard.hunt.plan import plan_from_record
from mindguard.hunt.result import Failure, PassResult, PassSpec
from mindguard.hunt.rules import judge_examined, judge_located, resumed_fallback
from mindguard.protocol import folder as layout
from mindguard.protocol.kept_state import STATE_SCHEMA, StateMeta, choose_state
from mindguard.protocol.pass_status import Diverged, PassStatus
from mindguard.protocol.summary import FromRecordSummary, Outcome

pytestmark = pytest.mark.fast

RUN_ID = "20261206-060000-4242"
FAILED = [PassStatus(ended="failed", failure_kind="nonfinite_loss")]
FINISHED = [PassStatus(ended="finished")]


def write_state(folder: Path, step: int, run_id: Optional[str] = RUN_ID) -> Dict[str, object]:
    """A kept state as the keeper writes it (its arrays' bytes are never read here: only their checksum)."""
    folder.mkdir(parents=True, exist_ok=True)
    layout.state_arrays(folder).write_bytes(b"arrays of global step %d" % step)
    meta = {"schema": STATE_SCHEMA, "step": step, "names": ["dense.weight", "dense.bias"], "shapes": [[4, 4], [4]],
            "sha256": file_sha256(layout.state_arrays(folder)), "run_id": run_id, "call": 1}
    layout.state_meta(folder).write_text(json.dumps(meta))
    return meta


def failing_record(tmp_path: Path, kept_step: Optional[int] = 3, **fields) -> dict:
    """The failing run's record: the loss NaN at global step 5 (``fields`` change it), its state kept at
    ``kept_step`` (``None``: none kept)."""
    base = record(step=5, run_id=RUN_ID, argv=list(COMMAND), **fields)
    if kept_step is not None:
        state = tmp_path / "failing.state" / RUN_ID / f"step-{kept_step}"
        meta = write_state(state, kept_step)
        base["kept_state"] = {"path": str(state), "step": kept_step, "run_id": RUN_ID, "sha256": meta["sha256"]}
    return base


class KeepingRunner(FakeRunner):
    """The fake runner, and a locate pass keeps the state at the step it stopped at (``keeps``: pass folder ->
    global step), as the training process does."""

    def __init__(self, run: Path, script: Script, keeps: Dict[str, int]):
        super().__init__(run, script)
        self.keeps = keeps

    def run(self, spec: PassSpec) -> PassResult:
        result = super().run(spec)
        step = self.keeps.get(spec.name.folder)
        if step is not None:
            write_state(self.folder.pass_folder(spec.name).state, step, run_id=None)
        return result


def hunt_from(tmp_path: Path, failing: dict, script: Script, keeps: Optional[Dict[str, int]] = None,
              resume: str = "auto") -> Tuple[Outcome, HuntContext, KeepingRunner]:
    run = tmp_path / "run"
    run.mkdir()
    path = tmp_path / "mindguard_failure.json"
    path.write_text(json.dumps(failing))
    runner = KeepingRunner(run, script, keeps or {})
    ctx = HuntContext(COMMAND, run, runner, Options(resume=resume, analyze=False), origin=(path, failing))
    return Executor(ctx).hunt(), ctx, runner


def from_record(ctx: HuntContext) -> FromRecordSummary:
    summary = ctx.summary.from_record
    assert isinstance(summary, FromRecordSummary), summary
    return summary


# -- the routes ------------------------------------------------------------------------------------------------
def test_a_finished_run_s_record_is_done_without_a_pass(tmp_path):
    outcome, ctx, runner = hunt_from(tmp_path, record("finished", step=16), {})
    assert outcome is Outcome.HEALTHY and asked(runner) == []
    assert from_record(ctx).route == "done"


def test_the_resume_route_locates_the_step_from_the_kept_state_and_examines_it_there(tmp_path):
    failing = failing_record(tmp_path)
    outcome, ctx, runner = hunt_from(tmp_path, failing, {
        "locate": (1, [record(step=5)], FAILED), "examine": (1, [record(step=5)], FAILED)}, keeps={"locate": 5})
    assert outcome is Outcome.FOUND and asked(runner) == ["locate", "examine"]
    summary = from_record(ctx)
    assert (summary.route, summary.kept_step) == ("resume", 3) and not isinstance(summary.fallback, str)
    locate, examine = (spec.request for spec in runner.asked)
    assert locate.resume_dir == Path(failing["kept_state"]["path"]) and locate.keep_steps == (5, 5)
    assert examine.resume_dir == ctx.at(layout.LOCATE).state and examine.examine_step == 5


def test_a_record_without_a_kept_state_takes_the_from_step_1_route(tmp_path):
    """No state: one locate pass from step 1 through the record's step, then the step examined from the state it
    kept there."""
    outcome, ctx, runner = hunt_from(tmp_path, failing_record(tmp_path, kept_step=None), {
        "locate": (1, [record(step=5)], FAILED), "examine": (1, [record(step=5)], FAILED)}, keeps={"locate": 5})
    assert outcome is Outcome.FOUND and asked(runner) == ["locate", "examine"]
    assert from_record(ctx).route == "from_step_1"
    locate, examine = (spec.request for spec in runner.asked)
    assert locate.resume_dir is None and examine.resume_dir == ctx.at(layout.LOCATE).state


def test_a_failure_that_does_not_repeat_from_the_kept_state_falls_back_to_the_plain_hunt(tmp_path):
    outcome, ctx, runner = hunt_from(tmp_path, failing_record(tmp_path), {
        "locate": (0, [record("finished", step=16)], FINISHED),
        "pass1": (1, [record(step=5)], FAILED), "pass2": (1, [record(step=5)], FAILED)}, resume="never")
    assert outcome is Outcome.FOUND and asked(runner) == ["locate", "pass1", "pass2"]
    summary = from_record(ctx)
    assert summary.route == "resume" and isinstance(summary.fallback, str)   # (its sentence: messages.locate_fallback)


def test_a_resumed_locate_pass_that_computes_something_else_falls_back_to_one_pass_from_step_1(tmp_path):
    """The record still names the step: one locate pass from step 1, in a folder of its own, instead of the plain
    hunt's two (``--resume auto``)."""
    outcome, ctx, runner = hunt_from(tmp_path, failing_record(tmp_path), {
        "locate": (0, [record("finished", step=16)], FINISHED),
        "locate-from-step-1": (1, [record(step=5)], FAILED), "examine": (1, [record(step=5)], FAILED)},
        keeps={"locate-from-step-1": 5})
    assert outcome is Outcome.FOUND and asked(runner)[:2] == ["locate", "locate-from-step-1"], asked(runner)
    assert "pass1" not in asked(runner) and "pass2" not in asked(runner), asked(runner)
    second = runner.asked[1].request
    assert second.resume_dir is None and second.keep_steps == (5, 5), second
    summary = from_record(ctx)
    assert summary.route == "resume" and isinstance(summary.fallback, str) and ctx.summary.failure["global_step"] == 5


def test_an_examine_pass_that_does_not_repeat_falls_back_to_the_plain_hunt(tmp_path):
    outcome, ctx, runner = hunt_from(tmp_path, failing_record(tmp_path), {
        "locate": (1, [record(step=5)], FAILED), "examine": (0, [record("finished", step=16)], FINISHED),
        "pass1": (1, [record(step=5)], FAILED), "pass2": (1, [record(step=5)], FAILED)},
        keeps={"locate": 5}, resume="never")
    assert outcome is Outcome.FOUND and asked(runner) == ["locate", "examine", "pass1", "pass2"]
    assert isinstance(from_record(ctx).fallback, str)


def test_a_killed_run_whose_window_runs_through_was_killed_from_outside(tmp_path):
    killed = failing_record(tmp_path, status="running", kind=None)
    outcome, _, runner = hunt_from(tmp_path, killed, {"locate": (0, [record("finished", step=16)], FINISHED)})
    assert outcome is Outcome.COMMAND_FAILED and asked(runner) == ["locate"]


# -- the rules' codes --------------------------------------------------------------------------------------------
def _plan(tmp_path: Path, **fields) -> object:
    failing = failing_record(tmp_path, **fields)
    _, meta, note = choose_state(failing, 5)
    assert isinstance(meta, StateMeta) and note is None
    return plan_from_record(failing, meta, COMMAND, "dump")


def test_judge_located_codes(tmp_path):
    plan = _plan(tmp_path)
    failed = Failure(record(step=5))
    assert judge_located(plan, "failed", failed, None, 1, kept_at_step=True).code == "located"
    assert judge_located(plan, "failed", failed, None, 1, kept_at_step=False).code == "no_state_at_step"
    assert judge_located(plan, "failed", None, None, 0, kept_at_step=False).code == "missed"
    assert judge_located(plan, "failed", Failure(record(step=7)), None, 1, kept_at_step=True).code == "missed"
    assert judge_located(plan, "failed", Failure(record(step=5, kind="exception")), None, 1, True).code == "missed"
    assert judge_located(plan, "running", None, None, 0, kept_at_step=False).code == "killed_from_outside"
    unfit = judge_located(plan, "failed", None, Diverged(step=4, why="other shapes", unfit=True), 1, False)
    assert (unfit.code, unfit.diverged, unfit.falls_back) == ("unfit", "other shapes", True)
    assert judge_located(plan, "failed", None, Diverged(step=4, why="loss"), 1, False).code == "diverged"


def test_resumed_fallback_codes():
    assert resumed_fallback(Outcome.FOUND, None) is None
    assert resumed_fallback(Outcome.EXAMINE_FAILED, None) is None
    assert resumed_fallback(Outcome.NOT_REPRODUCIBLE, None).code == "did_not_repeat"
    assert resumed_fallback(Outcome.NOT_REPRODUCIBLE, Diverged(step=4, why="loss")).code == "did_not_repeat"
    unfit = resumed_fallback(Outcome.NOT_REPRODUCIBLE, Diverged(step=4, why="other shapes", unfit=True))
    assert (unfit.code, unfit.detail) == ("unfit", "other shapes")


def _result(tmp_path: Path, returncode: int, records: List[dict], statuses: List[PassStatus],
            stopped: Optional[str] = None) -> PassResult:
    runner = FakeRunner(tmp_path, {"examine": (returncode, records, statuses)})
    result = runner.run(PassSpec(layout.EXAMINE, "pass 2", None))  # type: ignore[arg-type]
    if stopped is not None:
        result.stopped = stopped  # type: ignore[assignment]
    return result


@pytest.mark.parametrize("returncode, records, statuses, how, resumed, second_look, killed_by, code", [
    (1, [record(step=5)], FAILED, "dump", False, False, None, "repeated"),
    (1, [record(step=7)], FAILED, "dump", False, False, None, "not_reproducible"),
    (1, [record(step=7)], FAILED, "dump", True, False, None, "not_repeated_from_kept_state"),
    (1, [record(step=7)], FAILED, "dump", False, True, None, "computes_otherwise"),
    (0, [record("finished", step=16)], FINISHED, "dump", False, False, 9, "killed_then_ran_clean"),
    (-9, [record("running", step=3)], [], "dump", False, False, None, "not_examined"),
    (1, [record(step=0)], FAILED, "dump", False, False, None, "failed_before_its_first_step"),
    (1, [record(step=5, phase="mindguard")], FAILED, "dump", False, False, None, "mindguard_failed"),
    (1, [], [PassStatus(ended="raised", sink_refused=True)], "dataset", False, False, None, "sink_refused"),
    (1, [], [PassStatus(ended="diverged", diverged=Diverged(step=4, why="loss"))], "dump", True, False, None,
     "diverged"),
])
def test_judge_examined_codes(tmp_path, returncode, records, statuses, how, resumed, second_look, killed_by, code):
    result = _result(tmp_path, returncode, records, statuses)
    failure = Failure(record(step=5), killed_by=killed_by)
    assert judge_examined(result, failure, how, resumed, second_look).code == code


def test_a_stopped_examine_pass_is_judged_stopped_whatever_it_recorded(tmp_path):
    result = _result(tmp_path, -2, [record(step=5)], FAILED, stopped="interrupted")
    assert judge_examined(result, Failure(record(step=5)), "dump", False, False).code == "stopped"
