"""`mindguard verify --from RECORD -- COMMAND` (issue 41): a fix checked from the failing run's kept state, through
the failing steps, without re-training from step 1.

Real MindSpore, real subprocesses: tests/zoo/long_run_norm.py makes the embedding NaN at ``--poison`` (nn.Norm's
sqrt(0) backward over a padding row); ``--safe`` is the fix the hunt proposes (nn.Norm -> mindguard.SafeNorm), and
``--wrap-embedding`` a refactor that renames the embedding's Parameter. One failing run (an always-on Guard, a
failure at global step 1500 of 1600) is verified three ways: fixed (exit 0), unfixed (exit 1, step 1500 and the
culprit), renamed (exit 2, the reason).
"""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mindguard.hunt.verify_plan import DEFAULT_MORE_STEPS, parse_losses
from mindguard.training.run import FAST_FORWARD_MIN_STEPS

from hunting import clean_env, explain, line_of

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "zoo" / "long_run_norm.py"
FAILING = ["--poison", "1500", "--epochs", "32", "--check-budget", "1e-6", "--data", "array"]


def _timed(command, cwd):
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=900)
    return proc, time.perf_counter() - start


def verify(cwd: Path, run: str, *args: str, options=()):
    """``mindguard verify --from mindguard_failure.json [options] -- python long_run_norm.py ARGS``; (proc, run
    folder, seconds)."""
    proc, seconds = _timed([sys.executable, "-m", "mindguard", "verify", "--from", "mindguard_failure.json",
                            "--run-dir", str(cwd / run), *options, "--", sys.executable, str(SCRIPT), *args], cwd)
    return proc, cwd / run, seconds


@pytest.fixture(scope="module")
def failed(tmp_path_factory):
    """The failing run: Guard left in, the failure at global step 1500 (seen at 1600: only a Parameter check at the
    training's end shows it), its record and kept state in the folder; with its wall time."""
    cwd = tmp_path_factory.mktemp("verify")
    proc, seconds = _timed([sys.executable, str(SCRIPT), *FAILING], cwd)
    assert proc.returncode == 1, explain(proc)
    record = json.loads((cwd / "mindguard_failure.json").read_text())
    first, last = record["failure_window"]
    assert first <= 1500 <= last and record["kept_state"]["step"] <= first, record
    return cwd, record, seconds


def test_the_fix_holds_from_the_kept_state(failed):
    cwd, record, failing_seconds = failed
    proc, run, seconds = verify(cwd, "fixed", *FAILING, "--safe")
    assert proc.returncode == 0, explain(proc)
    verdict = json.loads((run / "verify.json").read_text())
    kept, last = record["kept_state"]["step"], record["failure_window"][1]
    assert verdict["outcome"] == "holds" and verdict["kept_step"] == kept, verdict
    losses = parse_losses(verdict["losses"])
    assert min(losses) == kept > 1   # nothing trained from step 1: the first step trained is the kept one
    assert max(losses) == min(last + DEFAULT_MORE_STEPS, 1600)   # through the window and 5 more (or the end)
    assert all(np.isfinite(losses[s]) for s in range(kept, last + 1)), verdict["losses"]
    assert f"global steps {kept}-{max(losses)} trained finite with the change" in proc.stdout, proc.stdout
    assert "loss of the failing run" in proc.stdout, proc.stdout   # the losses side by side
    assert not verdict["far"], verdict   # SafeNorm changes the loss by ~1e-6 at most: nothing far
    # the issue asks for <= 0.5x the failing run's wall time; reported, not asserted (noisy machines)
    print(f"verify {seconds:.2f}s / failing run {failing_seconds:.2f}s = {seconds / failing_seconds:.2f}x")


def test_the_unfixed_command_still_fails_at_step_1500_with_its_culprit(failed):
    cwd, record, _ = failed
    proc, run, _ = verify(cwd, "unfixed", *FAILING)
    assert proc.returncode == 1, explain(proc)
    verdict = json.loads((run / "verify.json").read_text())
    assert (verdict["outcome"], verdict["failed_step"]) == ("fails", 1500), verdict
    assert "global step 1500 still fails with the change" in proc.stdout, proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    origin = summary["origin"]   # the examination a hunt would print, from the state kept at step 1500
    assert origin["op_type"] == "SqrtGrad" and origin["source"]["line"] == line_of(SCRIPT, "# CULPRIT"), origin
    assert "SqrtGrad" in proc.stdout and (run / "report.html").is_file()


def test_a_renamed_layer_cannot_be_verified_from_the_kept_state(failed):
    cwd, _, _ = failed
    proc, run, _ = verify(cwd, "renamed", *FAILING, "--safe", "--wrap-embedding")
    assert proc.returncode == 2, explain(proc)
    assert "does not load into the edited script" in proc.stdout, proc.stdout
    assert "embedding.embedding_table" in proc.stdout and "embedding.0.embedding_table" in proc.stdout
    assert "--from-start" in proc.stdout   # what to do instead
    verdict = json.loads((run / "verify.json").read_text())
    assert verdict["outcome"] == "cannot" and not verdict.get("losses"), verdict   # nothing trained from it


def test_an_edited_learning_rate_is_verified_from_step_1(failed):
    """Issue 52: a learning rate the edit changed acted from step 1, before the kept state (which the old rate
    made): the pass from the kept state names it and stops before training; the verdict comes from step 1."""
    cwd, record, _ = failed
    proc, run, _ = verify(cwd, "lower-lr", *FAILING, "--safe", "--lr", "5e-4")
    assert proc.returncode == 0, explain(proc)
    assert "note: verified from step 1: the edit changes the training from global step 1 on (learning rate " \
           "learning_rate differs from global step 1 on)" in proc.stdout, explain(proc)
    refused = json.loads((run / "verify" / "verify_steps.json").read_text())
    assert [(o["name"], o["used"], o["from_step"]) for o in refused["loaded"]["overrides"]] == \
        [("learning_rate", "script", 1)], refused
    assert refused["earlier"]["from_step"] == 1 and not refused["losses"], refused   # nothing trained from the state
    verdict = json.loads((run / "verify.json").read_text())
    assert verdict["route"] == "from_start" and verdict["outcome"] == "holds", verdict
    losses = parse_losses(verdict["losses"])
    assert min(losses) == 1 and max(losses) == min(record["failure_window"][1] + DEFAULT_MORE_STEPS, 1600)


def test_a_watch_loop_in_pynative_is_verified_and_the_unfixed_one_replayed(tmp_path):
    args = ["--loop", "watch", "--mode", "pynative", "--poison", "40", "--epochs", "1", "--steps-per-epoch", "60",
            "--check-budget", "1e-6"]
    first = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=clean_env(), capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 1, explain(first)   # (the loop's own record may be written only at exit)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["status"] == "failed" and record["failure_window"][0] <= 40 <= record["failure_window"][1], record
    fixed, run, _ = verify(tmp_path, "fixed", *args, "--safe")
    assert fixed.returncode == 0, explain(fixed)
    losses = parse_losses(json.loads((run / "verify.json").read_text())["losses"])
    assert max(losses) >= 40 and min(losses) > 1 and all(np.isfinite(v) for v in losses.values()), losses
    unfixed, run, _ = verify(tmp_path, "unfixed", *args)
    assert unfixed.returncode == 1, explain(unfixed)
    assert "global step 40 still fails" in unfixed.stdout, unfixed.stdout
    assert json.loads((run / "summary.json").read_text())["origin"]["op_type"] == "SqrtGrad"


def test_a_renamed_layer_is_verified_from_step_1_with_from_start(failed):
    cwd, record, _ = failed
    proc, run, _ = verify(cwd, "from-start", *FAILING, "--safe", "--wrap-embedding", options=["--from-start"])
    assert proc.returncode == 0, explain(proc)
    verdict = json.loads((run / "verify.json").read_text())
    assert verdict["route"] == "from_start" and verdict["outcome"] == "holds", verdict
    losses = parse_losses(verdict["losses"])
    assert max(losses) == min(record["failure_window"][1] + DEFAULT_MORE_STEPS, 1600)
    assert all(np.isfinite(v) for v in losses.values())
    assert "steps 1-" not in proc.stderr   # nothing skipped: trained from step 1


def test_the_edits_learning_rate_wins_and_the_kept_loss_scale_is_used(tmp_path):
    """In process: the state a failing run kept (learning rate 0.1, loss scale 1024 after training) assigned by name
    into an edited script's Parameters (learning rate 0.01, loss scale 65536 as built, in another order)."""
    import mindspore as ms
    from mindspore import nn

    from mindguard.training.child.hunt_stop import HuntCannotContinue
    from mindguard.training.state.resume import KeptState, Resumer, state_parameters
    from mindguard.training.child.verify_run import VerifyPass

    def build(lr: float, scale: float, weight: float):
        net = nn.Dense(3, 1)
        net.weight.set_data(ms.Tensor(np.full((1, 3), weight, np.float32)))
        optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
        return state_parameters(net, optimizer) + [ms.Parameter(ms.Tensor(scale, ms.float32), name="scale_sense")]

    kept = KeptState(5, build(lr=0.1, scale=1024.0, weight=0.5))
    kept.write(tmp_path / "state", outputs=None, timing={})
    edited = list(reversed(build(lr=0.01, scale=65536.0, weight=0.0)))
    passed = VerifyPass(tmp_path / "failure.json", 5, 10)
    with pytest.raises(HuntCannotContinue):
        passed.load(Resumer(tmp_path / "state"), edited)   # issue 52: a fixed rate's edit acts from step 1
    values = {p.name: p.asnumpy() for p in edited}
    assert np.allclose(values["weight"], 0.5)                       # the state wins for what training writes
    assert np.isclose(values["learning_rate"], 0.01)                 # the edit's learning rate wins
    assert np.isclose(values["scale_sense"], 1024.0)                 # the run's loss scale at that step
    steps = json.loads((tmp_path / "verify_steps.json").read_text())
    used = {o["name"]: (o["used"], o["kept"], o["script"]) for o in steps["loaded"]["overrides"]}
    assert used["learning_rate"][0] == "script" and np.isclose(used["learning_rate"][1][0], 0.1)
    assert used["scale_sense"] == ("kept", [1024.0], [65536.0])
    assert steps["earlier"]["from_step"] == 1, steps   # the wrapper then verifies from step 1


def test_a_dataset_with_a_python_map_is_iterated_to_the_kept_state_not_reset(tmp_path):
    """A reset skips the maps of the steps before it: a map drawing from its own generator (``--jitter``) would give
    other labels, which the verify pass cannot notice (the edit changes the losses), so it iterates instead."""
    args = FAILING + ["--jitter"]
    first = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=tmp_path, env=clean_env(), capture_output=True,
                           text=True, timeout=600)
    assert first.returncode == 1, explain(first)
    kept = json.loads((tmp_path / "mindguard_failure.json").read_text())["kept_state"]["step"]
    assert kept - 1 >= FAST_FORWARD_MIN_STEPS   # far enough that a reset would be tried
    proc, run, _ = verify(tmp_path, "fixed", *args, "--safe")
    assert proc.returncode == 0, explain(proc)
    assert "the dataset is iterated to the kept step (its map runs Jitter" in proc.stderr, explain(proc)
