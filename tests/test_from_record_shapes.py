"""The line a failing guarded run prints, run as printed, on the shapes of issue 51's real clients (your own scripts in
their shapes): it exits 1 with the exact global step, resumed from the run's kept state, in one process wherever the
evidence allows it -- the ResNet-18 shapes are in tests/test_from_record_speed.py, the GAN whose own loader raises in
tests/test_checks_scale.py. Times are the benchmark's (benchmarks/fromrecord.py, docs/benchmarks.md), never asserted.

Each shape's failing step is planted by the script (its docstring says where), so the expected step is a fact of the
data, not of mindguard: a knowledge-graph model trained in two ``Model.train`` phases (the tail phase's third step,
global step 9); the same TransE model in PyNative (the head phase's fifth); a CTC text recognizer (step 5); a RotatE-
style manual loop over two loss-scale train cells whose data iterator draws from its own numpy RandomState (an id past
the table at step 33); a BERT-style fp16 fine-tune whose mask row holds token ids at step 25.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hunting import ZOO, clean_env, explain, summary_of

pytestmark = pytest.mark.slow

#: one process: the locate pass that dumped the step as it ran, or the examine pass alone when the state was kept at
#: the failing step itself
ONE = [["locate"], ["examine"]]
#: id -> (script and arguments, the planted global step, the pass folders the printed line may make)
SHAPES = {
    "kg-two-phases": (["kg_two_phase.py", "--bad_phase", "tail", "--bad_step", "3"], 9, ONE),
    # PyNative: the step is examined by an eager replay of its captured ops, which the locate pass does not do
    "transe-pynative": (["kg_two_phase.py", "--mode", "pynative"], 5, [["examine", "locate"], ["examine"]]),
    "ocr-ctc": (["crnn_ctc.py", "--bad_step", "5"], 5, ONE),
    "rotate-two-loss-scale-cells": (["kg_manual_loop.py"], 33, ONE),
    "bert-fp16-step25": (["bert_mask_fp16.py", "--steps_per_epoch", "30", "--bad_step", "25"], 25, ONE),
}


def passes(run: Path):
    return sorted(p.name for p in run.iterdir() if p.is_dir() and (p / "output.log").is_file())


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_the_printed_line_exits_1_with_the_exact_step(tmp_path, shape):
    args, step, allowed = SHAPES[shape]
    first = subprocess.run([sys.executable, str(ZOO / args[0]), *args[1:]], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    match = re.search(r"^    (.* hunt --from .*)$", first.stderr, re.M)
    assert match, explain(first)   # (its exit: the script's -- Guard stops a failing Model.train, which returns)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["kept_state"] and record["kept_state"]["step"] <= step, record.get("kept_state")
    state = json.loads((Path(record["kept_state"]["path"]) / "state.json").read_text())
    if "checkpoint" in state:   # the script's own ModelCheckpoint file (keep_checkpoint_max=1 rotates it out at the
        # call's end, before the hunt): held by a hard link beside the state
        assert Path(state["checkpoint"]["held"]).is_file(), state["checkpoint"]
    proc = subprocess.run(shlex.split(match.group(1)), cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, explain(proc)
    run, = (tmp_path / "mindguard_runs").iterdir()
    summary = summary_of(run)
    assert summary["failure"]["global_step"] == step, (summary["failure"], explain(proc))
    assert summary["from_record"]["route"] == "resume" and not summary["from_record"].get("fallback"), \
        (summary["from_record"], explain(proc))
    # a fresh process may round a loss a few float32 ulps apart from the failing run's: still the same run
    assert "computes something else" not in proc.stderr, explain(proc)
    assert passes(run) in allowed, (passes(run), explain(proc))
    if len(passes(run)) > 1:   # a second process only when the evidence demands it, and said why
        assert "a second process examines it" in proc.stderr, explain(proc)


def test_a_resumed_run_that_computes_something_else_falls_back_to_one_pass_from_step_1(tmp_path):
    """plateau_lr.py raises its learning rate from a loss history kept in Python: resumed from the kept state, the
    skipped steps' history differs and so does the loss (by far more than rounding). The record still names the
    step, so one locate pass from step 1 finds and dumps it: two processes in all, not the plain hunt's three. The
    state is kept at step 9 (``MINDGUARD_KEEP_STEPS``), as tests/test_resume.py's: Guard's own cadence keeps it by
    time, and a state kept at step 11 on a slower machine resumed to the same decisions and the same failure."""
    first = subprocess.run([sys.executable, str(ZOO / "plateau_lr.py")], cwd=tmp_path,
                           env=dict(clean_env(), MINDGUARD_KEEP_STEPS="9-9"), capture_output=True, text=True,
                           timeout=300)
    match = re.search(r"^    (.* hunt --from .*)$", first.stderr, re.M)
    assert match, explain(first)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["kept_state"]["step"] == 9, record
    proc = subprocess.run(shlex.split(match.group(1)), cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, explain(proc)
    run, = (tmp_path / "mindguard_runs").iterdir()
    summary = summary_of(run)
    assert "computes something else" in summary["from_record"]["fallback"], summary["from_record"]
    assert passes(run) == ["locate", "locate-from-step-1"], (passes(run), explain(proc))
    assert summary["failure"]["global_step"] == record["global_step"], (summary["failure"], record)
    assert "pass 2 (locate) dumped global step" in proc.stderr, explain(proc)


def test_a_dataset_error_the_record_leaves_uncertain_is_named_by_one_synchronous_pass(tmp_path):
    """gan_watch.py: a GeneratorDataset source raises on the corrupt file in the batch of global step 40; MindSpore's
    pipeline reads ahead, so the failing run can only say "step 2 or later" (and keeps no state). The printed line
    runs one pass from step 1 with the pipeline synchronous -- no pass to find the step first -- and names step 40;
    its headline holds the message on one line (the Python error, not MindSpore's call stacks)."""
    first = subprocess.run([sys.executable, str(ZOO / "gan_watch.py")], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    match = re.search(r"^    (.* hunt --from .*)$", first.stderr, re.M)
    assert match, explain(first)
    proc = subprocess.run(shlex.split(match.group(1)), cwd=tmp_path, env=clean_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 1, explain(proc)
    run, = (tmp_path / "mindguard_runs").iterdir()
    summary = summary_of(run)
    assert summary["failure"]["global_step"] == 40 and passes(run) == ["examine"], (summary["failure"], passes(run))
    headline = next(line for line in proc.stderr.splitlines() if "from the failing run's record" in line)
    assert "ValueError: corrupt image file 0158.png: truncated PNG chunk [" in headline, headline
    assert "C++ Call Stack" not in headline, headline
