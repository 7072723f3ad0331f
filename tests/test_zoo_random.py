"""Guard's printed line resumes runs whose steps draw random numbers (issue 39): the kept state holds numpy's,
Python's and MindSpore's generator state and kernel seed table, Guard/watch make nn.Dropout's masks part of it, and
it names -- before any failure -- the random kernels it cannot hold.

Real MindSpore, real subprocesses: tests/zoo/random_sources.py (a classifier with a zoo-style dynamic loss-scale
cell; a numpy-drawn sampler, shuffled data with a numpy augmentation, or two train cells stepped by hand with noise
drawn in the step) fails at global step ``--poison``. The printed ``mindguard hunt --from`` line must resume from
the kept state (no fallback, nothing re-trained from step 1) and find that exact step: a resumed step that drew
other random numbers computes another loss, which the hunt would see and fall back on. tests/zoo/
transformer_dropout.py (a Transformer encoder with dropout on embeddings, attention and residuals) does the same
with dropout, in GRAPH and PyNative, under Model.train and watch.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from hunting import clean_env, explain, summary_of

pytestmark = pytest.mark.slow

SCRIPT = Path(__file__).resolve().parent / "zoo" / "random_sources.py"
POISON = 14


def _train(cwd: Path, *args: str, script: Path = SCRIPT) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(script), "--poison", str(POISON), *args], cwd=cwd, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    record = json.loads((cwd / "mindguard_failure.json").read_text())
    assert record["status"] == "failed" and record["global_step"] == POISON, (record, explain(proc))
    return proc


def _hunt_printed(cwd: Path, proc: subprocess.CompletedProcess) -> tuple:
    match = re.search(r"^    (.* hunt --from .*)$", proc.stderr, re.M)
    assert match, explain(proc)
    hunt = subprocess.run(shlex.split(match.group(1)), cwd=cwd, env=clean_env(), capture_output=True, text=True,
                          timeout=600)
    runs = sorted((cwd / "mindguard_runs").iterdir())
    assert len(runs) == 1, (runs, explain(hunt))
    return hunt, runs[0]


def _assert_resumed_to_the_step(cwd: Path, first: subprocess.CompletedProcess, last_kept: int = POISON - 1) -> None:
    """The printed line of the failed run ``first`` resumes from its kept state (at most at ``last_kept``: PyNative
    keeps a state every second of its slower steps, so it may be the failing step's own) and finds the step."""
    kept = json.loads((cwd / "mindguard_failure.json").read_text())["kept_state"]
    assert 1 < kept["step"] <= last_kept, kept
    meta = json.loads((Path(kept["path"]) / "state.json").read_text())
    assert "unrestorable" not in meta["rng"] and meta["rng"]["numpy"]["kind"] == "MT19937", meta["rng"]
    assert "cannot resume" not in first.stderr, first.stderr
    hunt, run = _hunt_printed(cwd, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    assert summary["from_record"]["route"] == "resume" and "fallback" not in summary["from_record"], summary
    assert f"from the training state kept at global step {kept['step']}" in hunt.stderr, hunt.stderr
    assert "computes something else" not in hunt.stderr, hunt.stderr
    assert summary["failure"]["global_step"] == POISON, summary["failure"]
    assert not (run / "pass1").exists()   # nothing re-trained from step 1


@pytest.mark.parametrize("args", [
    ("--data", "sampler"),                                   # a sampler drawing from numpy's RNG, Model.train
    ("--data", "augment"),                                   # shuffle + a numpy augmentation in the pipeline
    ("--loop", "manual", "--data", "plain", "--numpy-noise"),   # two train cells by hand, numpy/random in the step
], ids=["numpy-sampler", "augment-shuffle", "two-cells-by-hand"])
def test_the_printed_line_resumes_a_run_drawing_random_numbers(tmp_path, args):
    _assert_resumed_to_the_step(tmp_path, _train(tmp_path, *args))


TRANSFORMER = Path(__file__).resolve().parent / "zoo" / "transformer_dropout.py"


@pytest.mark.parametrize("args", [
    ("--mode", "graph"),                                  # Model.train + a loss-scale cell, GRAPH
    ("--mode", "pynative", "--functional"),               # the same in PyNative, + ops.dropout called in construct
    ("--mode", "graph", "--loop", "watch"),               # the train cell stepped by hand under watch
], ids=["graph-model", "pynative-model-ops-dropout", "graph-watch"])
def test_the_printed_line_resumes_a_transformer_with_dropout(tmp_path, args):
    """Guard/watch replaced every nn.Dropout by a dropout whose call count is a Parameter of the kept state (and
    eager random functions draw from MindSpore's kernel seed table, kept too): the resumed steps draw the failing
    run's masks, so the trace matches and the exact step is found (a resumed step that drew other masks computes
    another loss: the hunt would say "computes something else" and fall back)."""
    first = _train(tmp_path, *args, script=TRANSFORMER)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert "unrestorable_random" not in record, record
    meta = json.loads((Path(record["kept_state"]["path"]) / "state.json").read_text())
    draws = [name for name in meta["names"] if name.endswith("_dropout.draws")]
    assert len(draws) == (5 if "--functional" in args else 7), meta["names"]   # every nn.Dropout of the encoder
    if "--functional" in args:
        assert [entry[0] for entry in meta["rng"]["kernel_seeds"]] == ["dropout"], meta["rng"]
    _assert_resumed_to_the_step(tmp_path, first, last_kept=POISON if "pynative" in args else POISON - 1)


@pytest.mark.parametrize("args, named", [
    (("--keep-kernels",), "nn.Dropout in `network._backbone.embed_dropout`"),   # Guard(restorable_dropout=False)
    (("--functional",), "ops.dropout (a random function in a `construct` compiled in GRAPH mode)"),
], ids=["nn-dropout-kernels", "ops-dropout-compiled"])
def test_a_random_kernel_no_state_holds_is_named_before_the_failure(tmp_path, args, named):
    """Random draws whose generator stays in a kernel (nn.Dropout's, with restorable_dropout=False; ops.dropout in a
    construct compiled in GRAPH mode) are named while the run is healthy, in the record too, and the hunt runs from
    step 1 at once (no resumed pass that could not compute the same), naming them and the fix."""
    first = _train(tmp_path, "--mode", "graph", *args, script=TRANSFORMER)
    warning = first.stderr.find(f"cannot resume this run from a kept state: {named}")
    assert 0 <= warning < first.stderr.find("training failed at"), first.stderr   # said before the failure
    assert "Guard(disable_dropout=True)" in first.stderr
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert named in (record.get("unrestorable_random") or []), record
    hunt, run = _hunt_printed(tmp_path, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    fallback = summary["from_record"]["fallback"]
    assert named in fallback and "not restorable on MindSpore" in fallback, fallback
    assert not (run / "locate").exists() and (run / "pass1").is_dir()   # no resumed pass was tried
    assert summary["failure"]["global_step"] == POISON, summary["failure"]


CHECKPOINTS = Path(__file__).resolve().parent / "zoo" / "embedding_checkpoints.py"


def test_a_state_too_big_to_copy_resumes_from_the_trainings_own_checkpoint(tmp_path):
    """A 51 MB table + its Momentum moment (more than 10% of the process's memory): Guard keeps no host copy, says
    so, and the printed line resumes from the script's ModelCheckpoint file nearest before the failure, naming it. A
    Parameter check follows each checkpoint (at the end of the step after it was written: steps 6, 11, 16), so the
    failure at 17 is exact without the file read back; the resumed pass's skipped steps write no checkpoint of
    untrained weights."""
    args = ["--vocab", "400000", "--steps", "20", "--poison", "17", "--ckpt-every", "5"]
    first = subprocess.run([sys.executable, str(CHECKPOINTS), *args], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    assert "not keeping the training state (0.10 GB) in memory: more than 10% of the training process's" \
        in first.stderr, explain(first)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["status"] == "failed" and record["global_step"] == 17, (record, explain(first))
    assert record["kept_state"]["step"] == 16 and record["params_finite_after"] == 16, record
    assert "failure_window" not in record and record["param_checks"]["checks"] >= 3, record
    meta = json.loads((Path(record["kept_state"]["path"]) / "state.json").read_text())
    checkpoint = tmp_path / "ckpt" / "recommender-1_15.ckpt"
    assert meta["checkpoint"]["path"] == str(checkpoint) and "shapes" not in meta, meta
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())

    hunt, run = _hunt_printed(tmp_path, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    assert summary["from_record"]["route"] == "resume" and "fallback" not in summary["from_record"], summary
    assert f"global step 16 (the training's own checkpoint {checkpoint})" in hunt.stderr, hunt.stderr
    assert summary["failure"]["global_step"] == 17, summary["failure"]
    after = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert after == before, (before, after)   # nothing saved in the hunt's passes before the failing step
