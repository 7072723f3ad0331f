"""The hunt checks the fix its hint prints before printing it (issue 52), with real MindSpore: the hint's edit applied
to a scratch copy of the project and run as `mindguard verify` runs a fix; the pass's own traceback kept in its
output.log. One quick hunt (a PyNative functional loop, ~15 s with its check); the check of an edit that does not
hold is asserted in tests/test_divergence.py (the loss still grows), the words of every verdict in
tests/test_fast_fix_check.py."""
from __future__ import annotations

import pytest

from hunting import ZOO, check_outcome as check, explain, hunt_zoo as hunt, line_of


@pytest.mark.slow
def test_a_hints_edit_that_trains_finite_is_checked_and_the_traceback_stays_in_output_log(tmp_path):
    """unmodified_functional.py: log(softmax) underflows at global step 4; the hint's log_softmax, run on a copy of
    tests/zoo from step 1 (a plain hunt: pass 1 is the failing run) through global step 9, trains finite. The
    user's file is unchanged; pass 1's NonFiniteError traceback is in its output.log, not on the console."""
    script = ZOO / "unmodified_functional.py"
    before = script.read_bytes()
    proc, run, summary = hunt(tmp_path, "unmodified_functional.py", check_fix=True)
    check(proc, summary, 1, "failure_found")
    fix = "          fix:    return ops.log_softmax(self.fc(x), axis=-1)  # CULPRIT"
    assert f"{fix}\n          checked: trains finite through global step 9\n" in proc.stdout, explain(proc)
    found = summary["fix_check"]
    assert (found["verdict"], found["through_step"], found["route"], found["hint"]) == \
        ("trains_finite", 9, "from_start", "origin"), found
    assert found["edit"]["line"] == line_of(script, "# CULPRIT") and found["seconds"] < found["limit_s"], found
    assert (run / "fix_check" / "verify.json").is_file() and (run / "fix_check" / "verify" / "output.log").is_file()
    assert "checked: trains finite through global step 9" in (run / "report.txt").read_text()
    assert "checked: trains finite through global step 9" in (run / "report.html").read_text()
    assert script.read_bytes() == before, "the user's file is never written"
    # the training's own traceback: in the pass's output.log, one line on the console saying where
    log = (run / "pass1" / "output.log").read_text()
    assert "Traceback (most recent call last)" in log and "mindguard.errors.NonFiniteError" in log, log[-2000:]
    assert "Traceback" not in proc.stderr and "errors.NonFiniteError:" not in proc.stderr, explain(proc)
    assert "[mindguard hunt] pass 1's own output (its traceback, " in proc.stderr, explain(proc)
    assert f"lines of stderr not shown): {run / 'pass1' / 'output.log'}\n" in proc.stderr, explain(proc)
    assert "mindguard attach: watching the functional step" in proc.stderr   # mindguard's own lines still shown
    assert "loss 3 " in proc.stdout   # and the training's stdout
