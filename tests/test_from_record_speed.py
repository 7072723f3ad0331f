"""`mindguard hunt --from` answers in about the time of the failing run (issue 51): one process whenever the failing
step is known -- with no kept state (or one not worth loading) a locate pass from step 1 checks every step, dumps the
steps the failure may lie in and stops at the exact one holding its dump -- and a young run's resume points early and
close to its end.

The decisions without MindSpore first (the plan, the executor on a fake runner, the keeper's first point); then real
MindSpore and real subprocesses: tests/zoo/resnet_bad_batch.py, a ResNet-18 (CIFAR layout, 8x8 images, batch 8) whose
stem overflows on one pixel of the batch of step 3, and a small CNN failing at step 50 of 60. The time ratios are the
benchmark's (benchmarks/fromrecord.py), never asserted here.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from mindguard.hunt.context import HuntContext, Options
from mindguard.hunt.executor import Executor
from mindguard.hunt.plan import (BLIND_DUMP_STEPS, WIDE_LOOK_SHARE, dump_from_step_1, dump_while_locating,
                                 first_look, locate_dump_iterations,
                                 locate_dumped_steps, not_worth_loading, plan_from_record, start_dump_from,
                                 start_dump_iterations)
from mindguard.hunt.result import PassResult, PassSpec
from mindguard.protocol.folder import RunFolder
from mindguard.protocol.pass_status import PassStatus
from mindguard.protocol.summary import Outcome

from hunting import ZOO, clean_env, explain, summary_of

SCRIPT = ZOO / "resnet_bad_batch.py"
COMMAND = ["python", "train.py"]


def record(**fields):
    base = {"schema": 2, "status": "failed", "kind": "nonfinite_params", "global_step": 4, "phase": "step",
            "mode": "graph", "examine": "dump", "rank": 0, "group_size": 1, "seed": 0, "argv": list(COMMAND),
            "failure_window": [3, 4], "params_finite_after": 2, "dump_iteration": 3, "iteration_observed": False,
            "epoch": 1, "step_in_epoch": 4, "steps_per_epoch": 6, "message": "parameters became non-finite"}
    base.update(fields)
    return base


# -- the decisions --------------------------------------------------------------------------------------------------
@pytest.mark.fast
def test_a_record_without_a_state_is_located_from_step_1_dumping_the_window():
    plan = plan_from_record(record(), None, COMMAND, "dump")
    assert plan.route == "from_step_1" and plan.window == (3, 4), plan
    assert start_dump_from(plan) == 3 and start_dump_iterations(plan) == "2-1000002"
    assert dump_from_step_1(plan, "dump", "outputs") is None   # two steps, size unknown: dumped
    loss = plan_from_record(record(kind="nonfinite_loss", global_step=60, failure_window=[7, 60]), None, COMMAND,
                            "dump")
    assert start_dump_from(loss) == 59 and start_dump_iterations(loss) == "58-1000058"   # the lead step, not the window
    first = plan_from_record(record(kind="nonfinite_loss", global_step=1, failure_window=None), None, COMMAND, "dump")
    assert start_dump_iterations(first) == "all"


@pytest.mark.fast
def test_the_dump_from_step_1_is_weighed_against_a_pass_of_its_own():
    wide = plan_from_record(record(global_step=70, failure_window=[7, 70]), None, COMMAND, "dump")
    assert "window holds 64 steps" in (dump_from_step_1(wide, "dump", "outputs") or "") and 64 > BLIND_DUMP_STEPS
    costs = {"process_started": 100.0, "first_step_end": 103.0, "state_bytes": 15_000_000}   # 9 MB a step, 3 s start
    cheap = plan_from_record(record(global_step=70, failure_window=[7, 70], costs=costs), None, COMMAND, "dump")
    assert dump_from_step_1(cheap, "dump", "outputs") is None   # ~1.2 s of writes against ~3.2 s
    big = dict(costs, state_bytes=1_000_000_000)
    costly = plan_from_record(record(global_step=70, failure_window=[7, 70], costs=big), None, COMMAND, "dump")
    assert "cost more than a pass of its own" in (dump_from_step_1(costly, "dump", "outputs") or "")
    # a wider scope is weighed at its own size: every op's outputs are ~2.5x the state a step, 2.4 GB over 64 steps
    assert "2.40 GB over 64 steps" in (dump_from_step_1(cheap, "dump", "all_outputs") or "")
    assert "cost more than a pass of its own" in (dump_from_step_1(cheap, "dump", "full") or "")
    assert "replay" in (dump_from_step_1(cheap, "replay", "outputs") or "")


@pytest.mark.fast
def test_the_first_look_is_as_wide_as_a_tenth_of_a_process_start_allows():
    """A look that explains nothing costs another pass (a process start, a compile); a wider first look only its
    bytes: hunt --from widens its first look when those cost at most WIDE_LOOK_SHARE of the run's start."""
    nonfinite = record(kind="nonfinite_loss", global_step=25, failure_window=[13, 25])
    start = dict(started=100.0, first_end=102.5)   # 2.5 s to the first step: 0.125 GB of writes allowed
    assert first_look(nonfinite, 2, 40_000, **start) == "full"   # a BERT-shaped toy: 0.7 MB of full dumps
    assert first_look(nonfinite, 2, 20_000_000, **start) == "all_outputs"   # 0.1 GB of every op's outputs
    assert first_look(nonfinite, 2, 90_000_000, **start) == "outputs"   # a ResNet-18: stays narrow
    assert first_look(nonfinite, 2, 40_000, requested="outputs", **start) == "outputs"   # --dump-scope
    assert first_look(nonfinite, 2, None, **start) == "outputs"   # the size unknown: narrow
    assert first_look(record(kind="exception", global_step=25), 2, 90_000_000, **start) == "full"
    assert WIDE_LOOK_SHARE == 0.1


@pytest.mark.fast
def test_a_state_that_skips_less_than_its_load_costs_is_not_loaded():
    kept = {"schema": 1, "step": 3, "bytes": 90_000_000, "step_seconds": 0.01}   # 0.02 s skipped, ~0.18 s to load
    assert "less than loading its 90 MB" in (not_worth_loading(kept) or "")
    plan = plan_from_record(record(kept_state={"path": "/s/step-3", "step": 3}), kept, COMMAND, "dump")
    assert plan.route == "from_step_1" and "running from step 1" in plan.why, plan
    slow = dict(kept, step_seconds=4.0)   # ResNet steps: 8 s skipped
    assert not_worth_loading(slow) is None
    assert plan_from_record(record(kept_state={"path": "/s/step-3", "step": 3}), slow, COMMAND, "dump").route == \
        "resume"
    assert not_worth_loading({"schema": 1, "step": 3}) is None   # a state that does not say: resumed as before


@pytest.mark.fast
def test_a_step_that_raised_is_dumped_while_located_weighed_at_a_full_dumps_size():
    """A raised step's first look is every kernel's inputs and outputs: the locate pass dumps it as it runs (every
    iteration: a loop of several train cells numbers each graph's runs apart), weighed at a full dump's size."""
    raised = record(kind="exception", global_step=33, failure_window=None, message="RuntimeError: Gather")
    small = {"schema": 1, "step": 3, "bytes": 4_000, "process_started": 100.0, "first_step_end": 101.5}
    plan = plan_from_record(dict(raised, kept_state={"path": "/s/step-3", "step": 3}), small, COMMAND, "dump")
    assert plan.route == "resume" and plan.window == (33, 33), plan
    assert locate_dump_iterations(plan) == "all" and locate_dumped_steps(plan) == 31
    assert dump_while_locating(plan, small, "dump", "full") is None
    big = dict(small, bytes=90_000_000)   # 31 full dumps of a ResNet-18 (~0.77 GB each): a pass of its own
    assert "cost more than a pass of its own" in (dump_while_locating(plan, big, "dump", "full") or "")
    nonfinite = plan_from_record(record(kind="nonfinite_loss", global_step=33, failure_window=[4, 33],
                                        kept_state={"path": "/s/step-3", "step": 3}), small, COMMAND, "dump")
    assert dump_while_locating(nonfinite, small, "dump", "full") is None   # (weighed at its size: a few kB)


@pytest.mark.fast
def test_a_loaders_error_is_answered_from_the_record_without_training_again():
    message = ("ValueError: corrupt image file 0158.png [raised at train.py:40 (in decode), in the loader "
               "load_batches (train.py:48), producing the step's batch]")
    plan = plan_from_record(record(kind="exception", phase="loader", global_step=40, message=message,
                                   failure_window=None, kept_state={"path": "/s/step-13", "step": 13}),
                            {"schema": 1, "step": 13}, COMMAND, "dump")
    assert (plan.route, plan.outcome) == ("done", "found") and plan.failure is not None, plan
    assert plan.why.startswith("global step 40's batch could not be made: ValueError: corrupt image file 0158.png")


@pytest.mark.fast
@pytest.mark.parametrize("want, got, ulps", [
    ("0x1.7286700000000p+1", "0x1.72866c0000000p+1", 2),      # TransE, PyNative, loaded into a fresh process
    ("0x1.67702e0000000p-1", "0x1.6770300000000p-1", 1),      # BERT fp16, a float32 loss
    ("0x1.0000000000000p+0", "0x1.0000800000000p+0", 64),
    ("0x1.0000000000000p+0", "0x1.0001000000000p+0", None),   # 128 ulps: another computation
    ("0x1.0000000000000p+0", "-0x1.0000000000000p+0", None),
    ("nan", "0x1.0000000000000p+0", None),
    ("0x1.0000000000000p+0", "inf", None),
])
def test_a_resumed_value_a_few_float32_ulps_off_is_the_same_computation(want, got, ulps):
    from mindguard.training.state.resumer import ROUNDING_ULPS, rounding_ulps

    assert rounding_ulps(want, got) == ulps and ROUNDING_ULPS == 64


class _Runner:
    def __init__(self, run: Path, script):
        self.folder, self.script, self.asked = RunFolder(run), script, []

    def run(self, spec: PassSpec) -> PassResult:
        self.asked.append(spec)
        returncode, records, statuses = self.script[spec.name.folder]
        folder = self.folder.pass_folder(spec.name)
        return PassResult(name=spec.name, label=spec.label, folder=folder, returncode=returncode, records=records,
                          statuses=statuses, log_path=folder.output_log, tail="")


@pytest.mark.fast
def test_without_a_state_one_locate_pass_from_step_1_runs_and_a_missed_dump_is_examined_from_its_state(tmp_path):
    """The fake locate pass leaves no dump: the step is then examined by a pass of its own, from the state the locate
    pass kept at it (the route's one exception, said); never pass1 + pass2."""
    run = tmp_path / "run"
    run.mkdir()
    located = record(global_step=3, failure_window=None, iteration_observed=False, dump_iteration=2)
    runner = _Runner(run, {"locate": (1, [located], [PassStatus(ended="failed", failure_kind="nonfinite_params")]),
                           "examine": (0, [], [PassStatus(ended="finished")])})
    origin = (tmp_path / "mindguard_failure.json", record())
    ctx = HuntContext(COMMAND, run, runner, Options(), origin=origin)
    Executor(ctx).hunt()
    names = [spec.name.folder for spec in runner.asked]
    assert names[0] == "locate" and "pass1" not in names and "pass2" not in names, names
    locate = runner.asked[0]
    assert locate.request.resume_dir is None and locate.request.keep_steps == (3, 4), locate.request
    assert locate.dump is not None and locate.request.dump_path is not None
    assert ctx.summary.from_record.route == "from_step_1" and ctx.summary.from_record.locate_dump == "dumped"
    assert ctx.summary.failure["global_step"] == 3


@pytest.mark.fast
def test_a_killed_run_or_a_replay_still_gets_the_plain_hunts_two_passes_and_says_why(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    eager = record(mode="pynative", examine="replay", kind="nonfinite_loss", failure_window=None)
    runner = _Runner(run, {"pass1": (0, [dict(eager, status="finished", kind=None)], [PassStatus(ended="finished")])})
    ctx = HuntContext(COMMAND, run, runner, Options(), origin=(tmp_path / "r.json", eager))
    assert Executor(ctx).hunt() is Outcome.NOT_REPRODUCIBLE
    assert [spec.name.folder for spec in runner.asked] == ["pass1"]
    assert "the step is examined by replay, which pass 2 does" in capsys.readouterr().err


@pytest.mark.fast
def test_a_state_too_big_for_memory_gets_its_first_point_at_the_first_passing_check(tmp_path, monkeypatch):
    """Written from the Parameters at once (no 30 s wait) when the write is small beside the process's start."""
    ms = pytest.importorskip("mindspore")
    from mindguard.protocol import folder as layout
    from mindguard.training.state import keeper as keeper_module

    monkeypatch.setattr(keeper_module, "MAX_EXTRA_MEMORY", 1e-9)
    params = [ms.Parameter(ms.Tensor(np.full((64, 64), 0.5, np.float32)), name="w")]
    keeper = keeper_module.StateKeeper(tmp_path, on_disk=True)   # default disk_seconds (30 s) and budget
    keeper.note_step_end(1, None)   # the first step ended (the process started before)
    assert keeper.due(2)
    keeper.keep(2, params)
    assert keeper.schedule.streaming and layout.state_arrays(layout.kept_step(tmp_path, 2)).is_file()
    assert keeper.write(3) == layout.kept_step(tmp_path, 2)


# -- real MindSpore, real processes -----------------------------------------------------------------------------------
def train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=300)


def hunt_printed(cwd: Path, first: subprocess.CompletedProcess):
    match = re.search(r"^    (.* hunt --from .*)$", first.stderr, re.M)
    assert match, explain(first)
    proc = subprocess.run(shlex.split(match.group(1)), cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    runs = sorted((cwd / "mindguard_runs").iterdir())
    assert len(runs) == 1, (runs, explain(proc))
    return proc, runs[0]


def processes(run: Path):
    """The pass folders of the run folder that ran the training (each holds its output)."""
    return sorted(p.name for p in run.iterdir() if p.is_dir() and (p / "output.log").is_file())


@pytest.mark.slow
@pytest.mark.parametrize("keep", [False, True], ids=["no-state", "kept-state"])
def test_a_resnet_failing_at_step_3_is_answered_by_one_process(tmp_path, keep):
    """ResNet-18, 8x8 images, batch 8: the stem overflows at step 3; Guard sees the NaN Parameters at its next check
    (step 4, window 3-4). With no state kept (``keep_state=False``) the hunt runs from step 1; with one, it resumes --
    in both, ONE process finds step 3 and holds its dump."""
    first = train(tmp_path, *([] if keep else ["--no-keep-state"]))
    assert first.returncode == 0 and "hunt --from" in first.stderr, explain(first)
    failing = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert failing["status"] == "failed" and failing["global_step"] >= 3, failing
    assert failing["costs"]["state_bytes"] > 80e6 and failing["costs"]["first_step_end"], failing["costs"]
    proc, run = hunt_printed(tmp_path, first)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    assert summary["failure"]["global_step"] == 3, summary["failure"]
    assert processes(run) == ["locate"], (processes(run), explain(proc))   # no pass1 + pass2, no examine pass
    assert summary["from_record"]["locate_dump"] == "dumped", summary["from_record"]
    assert "pass 1 (locate) dumped global step 3 as it ran" in proc.stderr, explain(proc)
    if not keep:
        assert summary["from_record"]["route"] == "from_step_1", summary["from_record"]
        assert "one pass from step 1 finds the exact step the record points at and dumps it" in proc.stderr


@pytest.mark.slow
def test_a_late_failure_of_a_young_run_resumes_within_its_last_tenth_in_one_process(tmp_path):
    """A small CNN failing at step 50 of 60 after some seconds of training, its Parameters checked every step: the
    state kept is near the end (within a fifth; a tenth when the copies' budget allows), and one resumed process
    finds the step and holds its dump (or examines it at once, from a state kept at the failing step itself)."""
    first = train(tmp_path, "--model", "cnn", "--steps", "60", "--poison", "50", "--image", "16",
                  "--check-budget", "0.05")   # checked every step: a copy follows each passing check
    assert first.returncode == 0, explain(first)
    failing = json.loads((tmp_path / "mindguard_failure.json").read_text())
    # the goal is the last tenth (step 45 on): copies come every 5 % of the training, but never more often than
    # their budget (0.25 % of the training) allows -- a 1-2 ms copy at ~75 ms steps spaces them ~6 steps: 44 was seen
    assert failing["global_step"] == 50 and failing["kept_state"]["step"] >= 40, failing
    proc, run = hunt_printed(tmp_path, first)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    assert summary["failure"]["global_step"] == 50 and summary["from_record"]["route"] == "resume", summary
    # one process: the locate pass that dumped the step, or -- the state kept at step 50 itself -- the examine pass
    assert processes(run) in (["locate"], ["examine"]), (processes(run), explain(proc))
