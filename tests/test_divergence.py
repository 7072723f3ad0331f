"""Issue 52 (part B): where a divergence began, and a `mindguard verify` that judges only what it can.

Real MindSpore, real subprocesses: tests/zoo/lstm_warmup.py (embedding -> LSTM -> dense, a warm-up learning-rate
schedule given to the optimizer as a per-step list) lets its loss grow from about step 5 until the cross entropy
returns +inf at global step 41. ``--lr-max 0.49`` is a wrong fix (it still fails, at step 54, when trained from step
1); ``--lr-max 0.05`` the right one. Whatever step the failing run happened to keep its state at -- before the
climb (the always-on Guard's first copy, step 2), early in it (~12) or just before the failure (~38) -- the wrong fix
still fails and the right one holds: from a state kept inside the climb, or for an edit of the schedule (which
acts from step 1), verify trains from step 1 and says why.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from hunting import clean_env, explain, run_hunt, summary_of

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "zoo" / "lstm_warmup.py"
WRONG, RIGHT = "0.49", "0.05"
MORE = "15"   # the wrong fix fails at step 54 from step 1: verify through 41 + 15 = 56


@pytest.fixture(scope="module", params=[3, 12, 38], ids=["kept-before-the-climb", "kept-early", "kept-late"])
def failed(request, tmp_path_factory):
    """The failing run (always-on Guard), its state kept at exactly ``--keep-at`` (``MINDGUARD_KEEP_STEPS``); its
    folder and record."""
    cwd = tmp_path_factory.mktemp("diverging")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--keep-at", str(request.param)], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, explain(proc)   # Guard stopped the training at the failure: the script ends
    record = json.loads((cwd / "mindguard_failure.json").read_text())
    assert record["kept_state"]["step"] == request.param, record["kept_state"]
    assert record["global_step"] == 41 and record["loss"] == "inf", record["message"]
    return cwd, record


def verify(cwd: Path, name: str, lr: str):
    proc = subprocess.run([sys.executable, "-m", "mindguard", "verify", "--from", "mindguard_failure.json",
                           "--steps", MORE, "--run-dir", str(cwd / name), "--", sys.executable, str(SCRIPT),
                           "--lr-max", lr], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=300)
    return proc, json.loads((cwd / name / "verify.json").read_text())


def test_the_record_says_where_the_loss_began_to_grow_and_the_schedule(failed):
    _, record = failed
    div = record["divergence"]
    assert div["kind"] == "growth" and 3 <= div["onset"] <= 9 and div["end"] == 40 and div["failed"] == 41, div
    assert div["factor"] > 10, div
    rate = div["rate"]
    assert rate["kind"] == "schedule" and rate["peak"] == pytest.approx(0.5) and rate["peak_step"] == 4, rate
    assert rate["origin"] is True and "lower it" in rate["words"], rate
    assert record["learning_rate"]["name"] == "learning_rate" and len(record["learning_rate"]["schedule"]) == 120
    assert len(record["loss_history"]["steps"]) == 41 and record["loss_history"]["loss"][-1] == "inf"


def test_the_wrong_learning_rate_still_fails_whatever_state_was_kept(failed):
    cwd, record = failed
    proc, verdict = verify(cwd, "wrong", WRONG)
    assert proc.returncode == 1, explain(proc)
    assert verdict["outcome"] == "fails" and verdict["failed_step"] == 54, verdict
    assert verdict["route"] == "from_start", verdict   # never judged from a state the edit did not make
    assert "verified from step 1" in proc.stdout, proc.stdout


def test_the_right_learning_rate_holds_whatever_state_was_kept(failed):
    cwd, record = failed
    proc, verdict = verify(cwd, "right", RIGHT)
    assert proc.returncode == 0, explain(proc)
    assert verdict["outcome"] == "holds" and verdict["route"] == "from_start", verdict
    assert min(int(s) for s in verdict["losses"]) == 1 and max(int(s) for s in verdict["losses"]) == 56
    kept = record["kept_state"]["step"]
    why = verdict["not_from_kept_state"]
    # kept inside the climb: the divergence is why; kept before it: the schedule edit (from step 1) is why
    assert ("already growing" in why) if kept > record["divergence"]["onset"] else ("learning rate" in why), why


def test_the_hunt_names_the_onset_and_the_schedule(tmp_path):
    failing = subprocess.run([sys.executable, str(SCRIPT)], cwd=tmp_path, env=clean_env(), capture_output=True,
                             text=True, timeout=300)
    assert failing.returncode == 0, explain(failing)
    proc = run_hunt(tmp_path / "hunt", sys.executable, str(SCRIPT), cwd=tmp_path,
                    options=("--from", str(tmp_path / "mindguard_failure.json")), check_fix=True)
    assert proc.returncode == 1, explain(proc)   # the check of the hint's fix never changes the exit code
    assert "divergence: the loss grew from" in proc.stdout and "then +inf at global step 41" in proc.stdout, \
        proc.stdout
    assert "learning rate learning_rate (schedule)" in proc.stdout and "rising to 0.5 at global step 4" in proc.stdout
    summary = summary_of(tmp_path / "hunt")
    assert summary["divergence"]["kind"] == "growth" and summary["divergence"]["rate"]["origin"], summary
    # the hint's epsilon in the log keeps the loss finite a few steps longer, but the loss still grows: not a fix
    check = summary["fix_check"]
    assert check["verdict"] == "still_fails" and "the loss still grows with the change" in check["why"], check
    assert "fix:    return -ops.log(picked + 1e-6).mean()\n          checked: does not hold -- the loss still " \
        "grows with the change" in proc.stdout, proc.stdout
