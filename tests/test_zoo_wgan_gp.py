"""The seed's bug inside a gradient penalty (issue 43): tests/zoo/wgan_gp.py, a WGAN-GP whose critic loss takes
``mnp.norm`` of an input-gradient (GradOperation inside the loss cell: a double backward, many Pow kernels of one
scope). Its zero-initialised critic head makes every gradient row 0; the backward of the norm's ``Pow(x, 0.5)`` is
+inf, the critic's weights are NaN after global step 1 while its loss is a finite 10.0.

Each wiring is hunted in a real subprocess (GRAPH mode): exit code, step, op (the backward Pow of the norm), line
(the norm in the penalty), the safe-norm hint, and that the printed fix trains finite.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import REPO
from hunting import explain, line_of, run_hunt, summary_of

pytestmark = pytest.mark.slow

SCRIPT = REPO / "tests" / "zoo" / "wgan_gp.py"


def hunt(tmp_path: Path, *args: str, name: str = "run"):
    run = tmp_path / name
    proc = run_hunt(run, sys.executable, str(SCRIPT), *args, cwd=tmp_path)
    return proc, run, summary_of(run) if (run / "summary.json").exists() else {}


@pytest.mark.parametrize("wiring, network, kind", [("watch", "Critic", "watch"),
                                                   ("model", "TrainOneStepCell", "train")])
def test_a_wgan_gp_whose_penalty_norms_a_zero_gradient_is_found_at_the_norms_backward_and_the_fix_trains_finite(
        tmp_path, wiring, network, kind):
    """watch on the critic's TrainOneStepCell stepped by hand in GRAPH mode is a compiled step, examined by dump (not
    replayed eagerly); Model.train with Guard is dumped too. Both name the backward Pow of the norm on its line,
    the repeated Pow kernels of the double backward each read as their own (not swapped by launch order)."""
    proc, run, summary = hunt(tmp_path, "--wiring", wiring)
    assert proc.returncode == 1 and summary.get("outcome") == "failure_found", explain(proc)
    failure = summary["failure"]
    got = (failure["kind"], failure["global_step"], failure["call"]["network"], failure["call"]["kind"],
           failure["examine"])
    assert got == ("nonfinite_params", 1, network, kind, "dump"), failure
    assert failure["loss"] == pytest.approx(10.0) and "net_d.fc.weight" in failure["nonfinite"], failure
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("Pow", "backward"), origin
    assert Path(origin["source"]["file"]).resolve() == SCRIPT.resolve(), origin["source"]
    assert origin["source"]["line"] == line_of(SCRIPT, "# CULPRIT"), origin["source"]
    fix = "fix:    norms = mindguard.safe_norm(gradients, axis=1)  # CULPRIT"
    assert fix in origin["hint"], origin["hint"]
    assert "norms = mindguard.safe_norm(gradients, axis=1)" in SCRIPT.read_text()   # what --fix runs
    assert "files of another kernel" not in proc.stdout, explain(proc)
    assert "shows no Inf/NaN" not in proc.stderr + proc.stdout, explain(proc)
    if wiring == "watch":
        fixed, _, summary = hunt(tmp_path, "--wiring", wiring, "--fix", name="fixed")
        assert fixed.returncode == 0 and summary.get("outcome") == "healthy", explain(fixed)


def test_a_wgan_gp_the_replay_cannot_isolate_is_examined_compiled_as_a_second_examiner(tmp_path):
    """PyNative: the critic's step is replayed eagerly first, and the replay isolates no operator (its operator calls
    are all finite: the penalty's gradient is taken inside the loss cell). The hunt escalates: the watched Cell's step
    runs once as a GRAPH-mode graph, fully dumped, which names the norm's backward Pow on its line."""
    proc, run, summary = hunt(tmp_path, "--mode", "pynative")
    assert proc.returncode == 1 and summary.get("outcome") == "failure_found", explain(proc)
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"], failure["examine"]) == ("nonfinite_params", 1, "replay"), failure
    assert summary["pass2"]["examine"] == "replay" and summary["pass2-compiled"]["examine"] == "dump", summary
    assert "examining the step compiled instead" in proc.stderr, explain(proc)
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("Pow", "backward"), origin
    assert origin["source"]["line"] == line_of(SCRIPT, "# CULPRIT"), origin["source"]
    assert "mindguard.safe_norm(gradients, axis=1)" in origin["hint"], origin["hint"]
    last = [line for line in proc.stderr.splitlines() if line.startswith("[mindguard hunt]")][-1]
    assert last.startswith("[mindguard hunt] failure found;"), last


def test_weights_made_nan_outside_the_graph_end_unexplained_with_the_escalation_and_what_is_known(tmp_path):
    """--fix --clip_warmup 0: the penalty is healthy; a weight-clipping callback listed before Guard clips to a
    0/0 = NaN bound after step 1's graph ran. The dump is widened twice (outputs, all outputs, full), each finite;
    the hunt ends unexplained (exit 3) and says what is known: the loss finite while the weights are NaN, every
    kernel of the step finite, so made outside the graph, and where to look next -- never "the backward"."""
    proc, run, summary = hunt(tmp_path, "--wiring", "model", "--fix", "--clip_warmup", "0")
    assert proc.returncode == 3 and summary.get("outcome") == "unexplained", explain(proc)
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"]) == ("nonfinite_params", 1), failure
    assert [s["scope"] for s in summary["dump_scopes"]] == ["outputs", "all_outputs"], summary["dump_scopes"]
    found = summary["known"]
    assert found["pass"] == "outside" and len(found["tried"]) == 3 and "pass2-full" in found["tried"][-1], found
    facts = "\n".join(found["facts"])
    assert "the loss was finite" in facts and "outside the dumped graph" in facts, facts
    assert f"first Parameters found non-finite after global step 1: {failure['nonfinite'][0]}" in facts, facts
    assert "between steps" in found["next"] and "mindguard analyze" in found["next"], found["next"]
    assert "shows no Inf/NaN in the files mindguard could read" in proc.stderr, explain(proc)
    last = [line for line in proc.stderr.splitlines() if line.startswith("[mindguard hunt]")][-1]
    assert last.startswith("[mindguard hunt] unexplained;"), last
