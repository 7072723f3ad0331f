"""What pass 2 dumps of a compiled step: the outputs of every op but the optimizer's first (op inputs read through
the .ir data flow), the step in full -- from the state kept at it -- only when that explains nothing."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO
from hunting import explain, line_of, run_hunt, summary_of

pytestmark = pytest.mark.slow
FAILING = REPO / "benchmarks" / "failing_train.py"
WORKLOADS = REPO / "benchmarks" / "workloads.py"


def _files(run, name):
    return [p.name for p in (run / name / "dump").rglob("*.npy")]


def test_the_narrow_dump_gives_the_full_dumps_answer_from_a_fraction_of_the_bytes(tmp_path):
    command = (sys.executable, str(FAILING), "--guard", "--steps", "6", "--poison", "4", "--hidden", "256")
    narrow = run_hunt(tmp_path / "narrow", *command, cwd=tmp_path)
    full = run_hunt(tmp_path / "full", *command, cwd=tmp_path, options=("--resume", "never"))
    assert narrow.returncode == 1 and full.returncode == 1, explain(narrow) + explain(full)
    n, f = summary_of(tmp_path / "narrow"), summary_of(tmp_path / "full")
    assert "dump_scopes" not in n, n.get("dump_scopes")    # explained by the first, narrow dump
    for key in ("op_type", "direction", "source"):
        assert n["origin"][key] == f["origin"][key], (key, n["origin"][key], f["origin"][key])
    assert n["origin"]["source"]["line"] == line_of(WORKLOADS, "x = x / self.norm(x)")
    # the inputs of the culprit, read where they were produced: the batch, and the norm's output with its zero
    assert [(i["slot"], i["zeros"] > 0) for i in n["origin"]["inputs"]] == [(0, True), (1, True)], n["origin"]["inputs"]
    assert "SafeNorm" in n["origin"]["hint"], n["origin"]["hint"]
    assert n["dump_bytes"] * 2 < f["dump_bytes"], (n["dump_bytes"], f["dump_bytes"])
    names = _files(tmp_path / "narrow", "pass2")
    assert not any("ApplyMomentum" in x or "optimizer" in x or "Parameter.moments" in x for x in names), names
    assert not any(".input." in x for x in names) and any(x.startswith("Parameter.inputs0.") for x in names), names
    # no trained weight's file (read from the state kept at the step when an op reads one): only undotted names
    kept = {x.split(".")[1] for x in names if x.startswith("Parameter.")}
    assert kept <= {"inputs0", "inputs1", "learning_rate", "momentum", "global_step"}, kept
    assert any("ApplyMomentum" in x for x in _files(tmp_path / "full", "pass2"))
    # the same analysis by hand: mindguard analyze with the state pass 2 kept at the step; a folder without one is
    # refused, naming it
    pass2 = tmp_path / "narrow" / "pass2"
    cli = subprocess.run([sys.executable, "-m", "mindguard", "analyze", str(pass2 / "dump"), "--state",
                          str(pass2 / "state"), "--json"], capture_output=True, text=True, cwd=tmp_path)
    assert cli.returncode == 1, cli.stderr[-2000:]
    assert json.loads(cli.stdout)["origin"]["op_type"] == n["origin"]["op_type"], cli.stdout[-2000:]
    bad = subprocess.run([sys.executable, "-m", "mindguard", "analyze", str(pass2 / "dump"), "--state",
                          str(tmp_path)], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and str(tmp_path) in bad.stderr and "state.json" in bad.stderr, bad.stderr[-2000:]


# (momentum/ApplyMomentum: the same widening as SGD's; the infinite learning rate ApplyMomentum read, the hint and the
# help are checked on the all_outputs dump of test_dump_scope_option_starts_wider_and_refuses_an_unknown_scope)
@pytest.mark.parametrize("optimizer, kernel", [("sgd", "SGD")])
def test_an_optimizer_culprit_widens_to_every_output_of_the_kept_step(tmp_path, optimizer, kernel):
    """warmup_lr.py's schedule sets an infinite learning rate: forward and backward are finite, so the narrow dump
    explains nothing, and the step is dumped again, every op's outputs (the optimizer's too) but no trained weights'
    files, from the state pass 2 kept at it (one step, resumed), which explains it without the full dump: the
    learning rate the optimizer kernel reads (not one it writes) was Inf before the step, and the help says where
    to look."""
    script = REPO / "tests" / "zoo" / "warmup_lr.py"
    proc = run_hunt(tmp_path / "run", sys.executable, str(script), "--optimizer", optimizer, cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(tmp_path / "run")
    assert summary["failure"]["global_step"] == 6 and summary["failure"]["kind"] == "nonfinite_params"
    assert [s["scope"] for s in summary["dump_scopes"]] == ["outputs"], summary.get("dump_scopes")
    origin = summary["origin"]   # the infinite learning rate fed ApplyMomentum: it was so before the step ran
    assert (origin["direction"], origin["name"]) == ("input", "learning_rate"), origin
    assert origin["inputs"][0]["pos_inf"] == 1 and f"/{kernel}-op" in origin["inputs"][0]["op"], origin["inputs"]
    assert "learning rate" in origin["hint"] and "schedule" in origin["hint"], origin["hint"]
    assert "help: the learning rate (learning_rate) was already Inf/NaN" in proc.stdout, explain(proc)
    log = (tmp_path / "run" / "pass2-all_outputs" / "output.log").read_text(errors="replace")
    assert "steps 1-5 skipped" in log and "training state of global step 6 loaded" in log, log[-2000:]


def test_a_widened_dump_of_a_step_with_dropout_holds_its_answer_resumed_or_from_step_1(tmp_path):
    """With dropout the state kept at the failing step cannot hold the dropout kernel's generator. The step is the
    6th of its call, so the wider look resumed from it first runs steps 1-5 for real (the warm-up), which often
    draws the failing run's masks again and repeats step 6; when it draws others, the trace stops it (diverged) and
    the step is dumped in full from step 1. Either way the answer holds."""
    script = REPO / "tests" / "zoo" / "warmup_lr.py"
    proc = run_hunt(tmp_path / "run", sys.executable, str(script), "--dropout", cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(tmp_path / "run")
    wider = summary["pass2-all_outputs"]
    if "diverged" in wider:
        assert summary["pass2-all_outputs-from-step-1"]["records"][0]["global_step"] == 6, summary
    else:
        assert wider["records"][0]["global_step"] == 6 and "pass2-all_outputs-from-step-1" not in summary, wider
    assert (summary["origin"]["direction"], summary["origin"]["name"]) == ("input", "learning_rate"), summary["origin"]


def test_a_weight_gradient_culprit_widens_to_every_output(tmp_path):
    """saturated_frame.py: only the stem's weight gradient overflows (Conv2DBackpropFilter, finite inputs). The
    narrow dump leaves weight gradients out, so it explains nothing -- and names no op that merely read the
    left-out value -- and the step is dumped again with every op's outputs from the state kept at it, where the
    kernel is named (its inputs read through the data flow: the full dump is not needed)."""
    script = REPO / "tests" / "zoo" / "saturated_frame.py"
    proc = run_hunt(tmp_path / "run", sys.executable, str(script), cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(tmp_path / "run")
    assert summary["failure"]["global_step"] == 1 and summary["failure"]["kind"] == "nonfinite_params"
    assert [s["scope"] for s in summary["dump_scopes"]] == ["outputs"], summary.get("dump_scopes")
    assert not any("BackpropFilter" in x for x in _files(tmp_path / "run", "pass2"))
    assert any("BackpropFilter" in x for x in _files(tmp_path / "run", "pass2-all_outputs"))
    assert not (tmp_path / "run" / "pass2-full").exists()
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("Conv2DBackpropFilter", "backward"), origin
    assert origin["source"]["line"] == line_of(script, "# CULPRIT"), origin["source"]
    assert origin["outputs"][0]["pos_inf"] > 0 and all(i["pos_inf"] == i["nan"] == 0 for i in origin["inputs"]), origin


def test_a_narrow_dump_never_names_an_op_that_read_what_it_left_out(tmp_path):
    """saturated_frame.py --clip: clip_by_global_norm squares every gradient before Momentum. The stem's weight
    gradient (left out of the narrow dump) overflowed, and its Square reads it: that Square is never named -- what
    it read is not in the dump. The head's gradient is huge but finite and its own Square overflows: an op whose
    inputs the dump holds, all finite, which the full dump names too (it runs first here)."""
    script = REPO / "tests" / "zoo" / "saturated_frame.py"
    proc = run_hunt(tmp_path / "run", sys.executable, str(script), "--clip", cwd=tmp_path)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(tmp_path / "run")
    origin = summary["origin"]
    assert origin["op_type"] in ("Conv2DBackpropFilter", "Square"), origin
    assert origin["inputs"] and all(i["pos_inf"] == i["nan"] == i["neg_inf"] == 0 for i in origin["inputs"]), origin
    assert origin["outputs"][0]["pos_inf"] > 0, origin["outputs"]
    assert origin["inputs"][0]["shape"] != [4, 1, 5, 5] or origin["op_type"] != "Square", origin  # not the stem's
    if "dump_scopes" not in summary:   # named from the narrow dump: the op's inputs were read there
        assert origin["op_type"] == "Square" and origin["source"]["line"] == line_of(script, "clip_by_global_norm")


def test_dump_scope_option_starts_wider_and_refuses_an_unknown_scope(tmp_path):
    """``--dump-scope all_outputs``: pass 2 dumps every op's outputs at once, so warmup_lr.py's optimizer culprit is
    named from pass 2 itself (no widening), with the optimizer kernel's files in it and no trained weight's."""
    script = REPO / "tests" / "zoo" / "warmup_lr.py"
    proc = run_hunt(tmp_path / "run", sys.executable, str(script), cwd=tmp_path,
                    options=("--dump-scope", "all_outputs"))
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(tmp_path / "run")
    assert "dump_scopes" not in summary and not (tmp_path / "run" / "pass2-all_outputs").exists(), summary
    origin = summary["origin"]   # the infinite learning rate fed ApplyMomentum: it was so before the step ran
    assert (origin["direction"], origin["name"]) == ("input", "learning_rate"), origin
    assert origin["inputs"][0]["pos_inf"] == 1 and "/ApplyMomentum-op" in origin["inputs"][0]["op"], origin["inputs"]
    assert "learning rate" in origin["hint"] and "schedule" in origin["hint"], origin["hint"]
    assert "help: the learning rate (learning_rate) was already Inf/NaN" in proc.stdout, explain(proc)
    files = _files(tmp_path / "run", "pass2")
    assert any("ApplyMomentum" in f for f in files), files[:20]
    params = sorted(f.split(".")[1] for f in files if f.startswith("Parameter."))
    assert "learning_rate" in params and not any(p.startswith(("moments", "dense", "fc")) for p in params), params
    bad = subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--dump-scope", "everything", "--", sys.executable,
                          str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert bad.returncode == 2 and "--dump-scope" in bad.stderr and "everything" in bad.stderr, bad.stderr[-2000:]
