"""Guard's printed line resumes runs whose steps draw random numbers (issue 39): the kept state holds numpy's,
Python's and MindSpore's generator state, and names -- before any failure -- the random kernels it cannot hold.

Real MindSpore, real subprocesses: tests/zoo/random_sources.py (a classifier with a zoo-style dynamic loss-scale
cell; a numpy-drawn sampler, shuffled data with a numpy augmentation, or two train cells stepped by hand with noise
drawn in the step) fails at global step ``--poison``. The printed ``mindguard hunt --from`` line must resume from
the kept state (no fallback, nothing re-trained from step 1) and find that exact step: a resumed step that drew
other random numbers computes another loss, which the hunt would see and fall back on.
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


def _train(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--poison", str(POISON), *args], cwd=cwd, env=clean_env(),
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


def _assert_resumed_to_the_step(cwd: Path, *args: str) -> None:
    first = _train(cwd, *args)
    kept = json.loads((cwd / "mindguard_failure.json").read_text())["kept_state"]
    assert 1 < kept["step"] < POISON, kept
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
    _assert_resumed_to_the_step(tmp_path, *args)


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_dropout_is_named_before_the_failure_and_its_fix_resumes(tmp_path, mode):
    """nn.Dropout's kernel holds its generator: the run says so while healthy, the hunt runs from step 1 at once
    (no resumed pass that could not compute the same), and a run trained with the fix it names resumes."""
    plain = tmp_path / "dropout"
    plain.mkdir()
    first = _train(plain, "--mode", mode, "--dropout", "0.2")
    warning = first.stderr.find("cannot resume this run from a kept state: nn.Dropout in `")
    assert 0 <= warning < first.stderr.find("training failed at"), first.stderr   # said before the failure
    assert "Guard(disable_dropout=True)" in first.stderr
    record = json.loads((plain / "mindguard_failure.json").read_text())
    assert any(s.startswith("nn.Dropout in `") for s in record.get("unrestorable_random") or []), record
    hunt, run = _hunt_printed(plain, first)
    assert hunt.returncode in (1, 3), explain(hunt)   # found (GRAPH); PyNative may leave the replay unexplained
    summary = summary_of(run)
    fallback = summary["from_record"]["fallback"]
    assert "nn.Dropout in `" in fallback and "not restorable on MindSpore" in fallback, fallback
    assert not (run / "locate").exists() and (run / "pass1").is_dir()   # no resumed pass was tried
    assert summary["failure"]["global_step"] == POISON, summary["failure"]

    fixed = tmp_path / "fixed"
    fixed.mkdir()
    _assert_resumed_to_the_step(fixed, "--mode", mode, "--dropout", "0.2", "--disable-dropout")


CHECKPOINTS = Path(__file__).resolve().parent / "zoo" / "embedding_checkpoints.py"


def test_a_state_too_big_to_copy_resumes_from_the_trainings_own_checkpoint(tmp_path):
    """A 51 MB table + its Momentum moment (more than 10% of the process's memory): Guard keeps no host copy, says
    so, and the printed line resumes from the script's ModelCheckpoint file nearest before the failure (read
    finite), naming it; the resumed pass's skipped steps write no checkpoint of untrained weights."""
    args = ["--vocab", "400000", "--steps", "20", "--poison", "17", "--ckpt-every", "5"]
    first = subprocess.run([sys.executable, str(CHECKPOINTS), *args], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    assert "not keeping the training state (0.10 GB) in memory: more than 10% of the training process's" \
        in first.stderr, explain(first)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["status"] == "failed" and record["global_step"] == 17, (record, explain(first))
    assert record["kept_state"]["step"] == 16 and record["params_finite_after"] == 15, record
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
