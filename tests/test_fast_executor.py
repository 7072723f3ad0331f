"""The hunt's route through its passes (mindguard.hunt.executor) on typed pass results, without MindSpore or
processes: a fake runner hands each pass the records and ``pass_status.json`` facts a training process would have
left (the shapes the real ones have: tests/test_hunt.py, test_faults.py run them), and the executor's next pass
and outcome are checked -- what it asked the next pass to do, what it printed, what the summary says.

Steps are 1-based global steps.
"""
from __future__ import annotations

import signal
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

from mindguard.hunt.context import CannotGoOn, HuntContext, Options
from mindguard.hunt.executor import Executor
from mindguard.hunt.result import PassResult, PassSpec
from mindguard.protocol.folder import RunFolder
from mindguard.protocol.pass_status import DatasetError, Diverged, MindguardFailure, PassStatus
from mindguard.protocol.summary import Outcome

pytestmark = pytest.mark.fast

COMMAND = ["python", "train.py"]
Script = Dict[str, Tuple[int, List[dict], List[PassStatus]]]


def record(status: str = "failed", step: Optional[int] = 5, kind: Optional[str] = "nonfinite_loss",
           phase: Optional[str] = "step", mode: str = "graph", **fields) -> dict:
    """A pass's record as the training process writes it (the fields the hunt reads)."""
    base = {"schema": 2, "status": status, "kind": kind if status == "failed" else None, "global_step": step,
            "phase": phase if status == "failed" else None, "mode": mode, "examine": "dump" if mode == "graph"
            else "replay", "rank": 0, "group_size": 1, "seed": 1, "iteration_observed": True,
            "dump_iteration": (step - 1) if step else None, "epoch": 1, "step_in_epoch": step, "steps_per_epoch": 8,
            "message": "the loss is NaN" if status == "failed" else None}
    base.update(fields)
    return base


class FakeRunner:
    """Hands each pass (by folder name) the result its training process would have left; notes what was asked."""

    def __init__(self, run: Path, script: Script):
        self.folder, self.script = RunFolder(run), script
        self.asked: List[PassSpec] = []

    def run(self, spec: PassSpec) -> PassResult:
        self.asked.append(spec)
        returncode, records, statuses = self.script[spec.name.folder]
        folder = self.folder.pass_folder(spec.name)
        return PassResult(name=spec.name, label=spec.label, folder=folder, returncode=returncode,
                          records=records, statuses=statuses, log_path=folder.output_log,
                          tail="Traceback (most recent call last):\n  ...\nImportError: the user's own line\n")


def hunt(tmp_path: Path, script: Script, **options) -> Tuple[Outcome, HuntContext, FakeRunner]:
    run = tmp_path / "run"
    run.mkdir()
    runner = FakeRunner(run, script)
    ctx = HuntContext(COMMAND, run, runner, Options(resume="never", **options))
    return Executor(ctx).hunt(), ctx, runner


def asked(runner: FakeRunner) -> List[str]:
    return [spec.name.folder for spec in runner.asked]


def test_a_healthy_pass_1_ends_the_hunt_healthy(tmp_path, capsys):
    outcome, _, runner = hunt(tmp_path, {"pass1": (0, [record("finished", step=16)], [PassStatus(ended="finished")])})
    assert outcome is Outcome.HEALTHY and asked(runner) == ["pass1"]
    assert "all losses and parameters stayed finite" in capsys.readouterr().err


def test_a_failure_is_examined_at_its_step_and_one_elsewhere_is_not_reproducible(tmp_path, capsys):
    outcome, ctx, runner = hunt(tmp_path, {
        "pass1": (1, [record(step=5)], [PassStatus(ended="failed", failure_kind="nonfinite_loss")]),
        "pass2": (1, [record(step=7)], [PassStatus(ended="failed", failure_kind="nonfinite_loss")])})
    assert outcome is Outcome.NOT_REPRODUCIBLE and asked(runner) == ["pass1", "pass2"]
    request = runner.asked[1].request
    assert (request.pass_name, request.examine_step, request.examine) == ("examine", 5, "dump")
    dump = runner.asked[1].dump
    assert dump is not None and dump.to_dict()["common_dump_settings"]["iteration"] == "4"
    assert "NOT REPRODUCIBLE: pass 1 failed at global step 5" in capsys.readouterr().err
    assert ctx.summary.failure["global_step"] == 5


def test_a_kill_from_outside_the_step_is_said_so_from_the_exit_status_not_from_text(tmp_path, capsys):
    """Pass 1 died by SIGKILL in step 5 (its record still "running"); pass 2 ran that step without failing: the
    kill came from outside the computation. Decided on the exit status, whatever the messages say."""
    outcome, ctx, runner = hunt(tmp_path, {
        "pass1": (-signal.SIGKILL, [record("running", step=5)], []),
        "pass2": (0, [record("finished", step=16)], [PassStatus(ended="finished")])})
    assert outcome is Outcome.COMMAND_FAILED and asked(runner) == ["pass1", "pass2"]
    assert ctx.summary.command_returncode == 128 + signal.SIGKILL
    assert "pass 1 was killed by signal 9 (SIGKILL: often the OOM-killer) at global step 5" in capsys.readouterr().err


def test_a_pass_that_broke_inside_mindguard_is_no_evidence_either_way(tmp_path, capsys):
    broke = MindguardFailure(error="KeyError: 'x'", traceback='Traceback ...\n  File "mindguard/run.py"...')
    outcome, ctx, _ = hunt(tmp_path, {
        "pass1": (1, [record(step=5)], [PassStatus(ended="failed", failure_kind="nonfinite_loss")]),
        "pass2": (1, [record("running", step=3)], [PassStatus(ended="raised", mindguard_error=broke)])})
    assert outcome is Outcome.EXAMINE_FAILED
    assert ctx.summary.passes["pass2"].not_examined == "broke inside mindguard at global step 3: KeyError: 'x'"
    assert "That says nothing about whether the failure repeats" in capsys.readouterr().err


def test_a_pass_that_cannot_continue_ends_the_hunt_with_what_the_process_said(tmp_path):
    said = "cannot write the failure record '/r/pass1/failure.json' (No space left on device); free space"
    with pytest.raises(CannotGoOn) as caught:
        hunt(tmp_path, {"pass1": (2, [], [PassStatus(ended="cannot_continue", cannot_continue=said)])})
    assert caught.value.outcome is Outcome.RECORD_FAILED
    assert caught.value.message.startswith(f"pass 1 could not record the failing step: {said} (its output is in ")


def test_an_examine_pass_that_ran_while_the_disk_was_full_is_named_never_a_verdict(tmp_path):
    with pytest.raises(CannotGoOn) as caught:
        hunt(tmp_path, {
            "pass1": (1, [record(step=5)], [PassStatus(ended="failed", failure_kind="nonfinite_loss")]),
            "pass2": (1, [record(step=5)], [PassStatus(ended="failed", no_space="0 bytes free on the file system")])})
    assert caught.value.outcome is Outcome.EXAMINE_FAILED
    assert "pass 2 could not examine the failing step: the run folder's disk is full (while it ran: 0 bytes free" \
        in caught.value.message


def test_a_dataset_error_in_sink_mode_is_refused_as_mindspore_refused_it(tmp_path, capsys):
    dataset = record(step=4, kind="exception", phase="between_steps", message="RuntimeError: in the pipeline")
    outcome, _, runner = hunt(tmp_path, {
        "pass1": (1, [dataset], [PassStatus(ended="failed", failure_kind="exception")]),
        "pass2": (1, [], [PassStatus(ended="raised", sink_refused=True)])})
    assert outcome is Outcome.EXAMINE_FAILED and runner.asked[1].request.examine == "dataset"
    assert "MindSpore cannot run the pipeline synchronously (its debug mode) in sink mode" in capsys.readouterr().err


def test_a_dataset_error_is_explained_from_the_facts_the_process_wrote(tmp_path):
    dataset = record(step=4, kind="exception", phase="between_steps", message="RuntimeError: in the pipeline")
    error = DatasetError(error="ValueError: corrupt image 17", file="/w/train.py", line=42, function="__getitem__",
                         code="raise ValueError(f'corrupt image {index}')")
    outcome, ctx, _ = hunt(tmp_path, {
        "pass1": (1, [dataset], [PassStatus(ended="failed", failure_kind="exception")]),
        "pass2": (1, [dict(dataset, global_step=6)], [PassStatus(ended="failed", dataset_error=error)])})
    assert outcome is Outcome.FOUND
    assert ctx.summary.origin["source"] == {"file": "/w/train.py", "line": 42, "function": "__getitem__",
                                            "code": "raise ValueError(f'corrupt image {index}')"}
    assert ctx.summary.origin["error"] == "ValueError: corrupt image 17"
    text = ctx.folder.report_text.read_text()
    assert "  --> /w/train.py:42 (in __getitem__)" in text and "   = ValueError: corrupt image 17" in text


def test_a_replay_that_failed_is_mindguards_failure(tmp_path, capsys):
    eager = record(step=3, mode="pynative")
    outcome, ctx, _ = hunt(tmp_path, {
        "pass1": (1, [eager], [PassStatus(ended="failed", failure_kind="nonfinite_loss")]),
        "pass2": (1, [eager], [PassStatus(ended="failed", replay_failed="ReplayError: no optimizer")])})
    assert outcome is Outcome.MINDGUARD_FAILED and ctx.summary.mindguard_error == "ReplayError: no optimizer"
    assert "mindguard itself failed" in capsys.readouterr().err


def test_a_stop_from_outside_is_the_commands_end_not_a_failure(tmp_path):
    outcome, ctx, runner = hunt(tmp_path, {"pass1": (-signal.SIGTERM, [record("running", step=2)], [])})
    assert outcome is Outcome.COMMAND_FAILED and asked(runner) == ["pass1"]
    assert ctx.summary.command_returncode == 128 + signal.SIGTERM


def test_a_process_gone_without_its_record_saying_so_ended_early(tmp_path):
    outcome, ctx, _ = hunt(tmp_path, {"pass1": (3, [record("running", step=6)], [])})
    assert outcome is Outcome.ENDED_EARLY and ctx.summary.ended_early_at == 6


def test_a_scripts_own_error_is_not_hunted(tmp_path):
    outcome, _, runner = hunt(tmp_path, {"pass1": (1, [record(step=2, kind="exception", phase="script")], [])})
    assert outcome is Outcome.COMMAND_FAILED and asked(runner) == ["pass1"]


def test_a_command_that_never_ran_mindguard_shows_its_last_lines_and_the_interpreter_hint(tmp_path, capsys):
    outcome, _, _ = hunt(tmp_path, {"pass1": (1, [], [])})
    err = capsys.readouterr().err
    assert outcome is Outcome.FAILED_BEFORE_TRAINING
    assert "ImportError: the user's own line" in err and "mindguard never ran in the command" in err


def test_a_command_whose_mindguard_ran_gets_no_interpreter_hint(tmp_path, capsys):
    outcome, _, _ = hunt(tmp_path, {"pass1": (1, [], [PassStatus(ended="raised")])})
    assert outcome is Outcome.FAILED_BEFORE_TRAINING and "mindguard never ran" not in capsys.readouterr().err


def test_no_record_and_exit_0_is_a_script_without_guard(tmp_path):
    outcome, _, _ = hunt(tmp_path, {"pass1": (0, [], [PassStatus(ended="finished")])})
    assert outcome is Outcome.NO_GUARD


def test_a_resumed_pass_that_diverged_after_a_dataset_reset_runs_again_iterating(tmp_path):
    """The context's rule for a resumed pass: diverged with the dataset reset -> the same pass again, the reset off
    for it and every later pass; the first attempt kept aside."""
    run = tmp_path / "run"
    run.mkdir()
    results = iter([(1, [], [PassStatus(ended="diverged", diverged=Diverged(step=9, why="loss", fast_forwarded=40))]),
                    (1, [record(step=12)], [PassStatus(ended="failed", failure_kind="nonfinite_loss")])])

    class Twice(FakeRunner):
        def run(self, spec: PassSpec) -> PassResult:
            self.script = {spec.name.folder: next(results)}
            return super().run(spec)

    from mindguard.protocol import folder as layout

    runner = Twice(run, {})
    ctx = HuntContext(COMMAND, run, runner, Options())
    request = ctx.request(layout.RESUMED, "examine", resume_dir=tmp_path / "state", examine_step=12, examine="dump")
    result = ctx.run_pass(PassSpec(layout.RESUMED, "pass 2 (resumed)", request))
    assert [spec.request.fast_forward for spec in runner.asked] == [True, False] and not ctx.fast_forward
    assert result.first_failure() is not None and (run / "resumed.fast-forward").is_dir()


def test_an_approximate_hunt_asks_only_its_resumed_passes_not_to_compare_their_trace(tmp_path):
    """``hunt --from`` a kept state that cannot hold dropout's masks: its resumed passes draw other masks, so they
    are asked not to compare what they compute with the failing run (HuntRequest.approximate); a pass from step 1
    compares as always, and so does every pass once the hunt has fallen back to step 1."""
    from mindguard.protocol import folder as layout

    run = tmp_path / "run"
    run.mkdir()
    ctx = HuntContext(COMMAND, run, FakeRunner(run, {}), Options())
    ctx.approximate = True
    resumed = ctx.request(layout.LOCATE, "record", resume_dir=tmp_path / "state", keep_steps=(4, 6))
    assert resumed.approximate and resumed.to_environ()["MINDGUARD_APPROXIMATE"] == "1"
    from_start = ctx.request(layout.PASS1, "record")
    assert not from_start.approximate and "MINDGUARD_APPROXIMATE" not in from_start.to_environ()
