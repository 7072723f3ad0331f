"""Guard's printed line resumes runs whose steps draw random numbers (issue 39): the kept state holds numpy's,
Python's and MindSpore's generator state and kernel seed table, Guard/watch make nn.Dropout's masks part of it, and
it names -- before any failure -- the random kernels it cannot hold (nn.Dropout's: the hunt then replays
approximately, and says so).

Real MindSpore, real subprocesses: tests/zoo/random_sources.py (a classifier with a zoo-style dynamic loss-scale
cell; a numpy-drawn sampler, shuffled data with a numpy augmentation, or two train cells stepped by hand with noise
drawn in the step) fails at global step ``--poison``. The printed ``mindguard hunt --from`` line must resume from
the kept state (no fallback, nothing re-trained from step 1) and find that exact step: a resumed step that drew
other random numbers computes another loss, which the hunt would see and fall back on. tests/zoo/
transformer_dropout.py (a Transformer encoder with dropout on embeddings, attention and residuals) fails from its
data: the line resumes approximately (other dropout masks) and finds the step, in GRAPH and PyNative, under
Model.train and watch.
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


def _assert_resumed_to_the_step(cwd: Path, first: subprocess.CompletedProcess, last_kept: int = POISON) -> None:
    """The printed line of the failed run ``first`` resumes from its kept state (at most at ``last_kept``: a young
    run is copied at least every tenth of its training -- issue 51 -- so it may be the failing step's own) and finds
    the step."""
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


@pytest.mark.parametrize("args, named", [
    (("--mode", "graph"), "nn.Dropout in `network._backbone.embed_dropout`"),   # Model.train + a loss-scale cell
    (("--mode", "pynative", "--functional"), "nn.Dropout in `network._backbone.embed_dropout`"),   # + ops.dropout
    (("--mode", "graph", "--loop", "watch"), "nn.Dropout in `network._backbone.embed_dropout`"),   # by hand, watch
    (("--mode", "graph", "--functional"), "ops.dropout (a random function in a `construct` compiled in GRAPH mode)"),
], ids=["graph-model", "pynative-model-ops-dropout", "graph-watch", "ops-dropout-compiled"])
def test_the_printed_line_replays_a_transformer_with_dropout_approximately(tmp_path, args, named):
    """Guard keeps the user's nn.Dropout cells (their kernels' masks cannot be kept: said once, before the failure,
    and in the record). The failure comes from the data (step 14's embeddings are corrupt), so it repeats whatever
    masks are drawn: the printed line resumes from the kept state without comparing the trace, finds the exact step
    and answers with a note that the replay drew other dropout masks than the failing run."""
    first = _train(tmp_path, *args, script=TRANSFORMER)
    said = first.stderr.find(named)
    assert 0 <= said < first.stderr.find("training failed at"), first.stderr   # said before the failure
    assert first.stderr.count("is not restorable") <= 2, first.stderr   # once for cells, once for functions
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert named in (record.get("unrestorable_random") or []), record
    kept = record["kept_state"]
    assert 1 < kept["step"] <= POISON, kept
    hunt, run = _hunt_printed(tmp_path, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    assert summary["from_record"]["route"] == "resume" and "fallback" not in summary["from_record"], summary
    assert "nn.Dropout in `network._backbone.embed_dropout`" in summary["from_record"]["approximate"], summary
    assert f"from the training state kept at global step {kept['step']}" in hunt.stderr, hunt.stderr
    assert "the resumed passes replay approximately" in hunt.stderr, hunt.stderr
    # other masks whatever the kernels' thread split: no warm-up steps run before the kept one (PyNative: 13 steps)
    assert "ran first, to launch MindSpore's kernels" not in hunt.stderr, hunt.stderr
    assert json.loads((Path(kept["path"]) / "state.json").read_text())["warm_up"] == 0
    assert f"note: the failure repeated at global step {POISON} from the kept state with other dropout" \
        in hunt.stderr, hunt.stderr
    assert summary["failure"]["global_step"] == POISON, summary["failure"]
    assert summary.get("origin"), summary   # the operator named
    assert not (run / "pass1").exists()   # nothing re-trained from step 1


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
    held = Path(meta["checkpoint"]["held"])   # a hard link: the file's bytes stay if ModelCheckpoint rotates it out
    assert held.parent == Path(record["kept_state"]["path"]) and held.stat().st_ino == checkpoint.stat().st_ino, meta
    before = sorted(p.name for p in (tmp_path / "ckpt").iterdir())

    hunt, run = _hunt_printed(tmp_path, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    assert summary["from_record"]["route"] == "resume" and "fallback" not in summary["from_record"], summary
    assert f"global step 16 (the training's own checkpoint {checkpoint})" in hunt.stderr, hunt.stderr
    assert summary["failure"]["global_step"] == 17, summary["failure"]
    after = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert after == before, (before, after)   # nothing saved in the hunt's passes before the failing step
    # the locate pass dumped step 17 as it ran, so its state there serves that dump's analysis alone: the 51 MB
    # table and its moment are kept as statistics (not written whole at the pass's end), and the answer reads them
    assert summary["from_record"]["locate_dump"] == "dumped", summary["from_record"]
    locate_state = run / "locate" / "state"
    meta = json.loads((locate_state / "state.json").read_text())
    assert meta["step"] == 17 and sorted(meta["summarized"]) == ["0", "8"], meta.get("summarized")
    assert meta["summarized"]["0"]["shape"] == [400000, 32] and meta["summarized"]["0"]["nan"] == 0, meta
    with np.load(locate_state / "state.npz") as arrays:
        assert "p0" not in arrays.files and "p8" not in arrays.files and "p1" in arrays.files, arrays.files
    assert ("Parameter inputs read as the step began, from the training state kept at global step 17"
            in hunt.stdout + hunt.stderr), explain(hunt)


def test_a_state_too_big_to_copy_with_no_checkpoints_is_written_from_the_parameters_and_resumed_from(tmp_path):
    """The same 51 MB table with no ModelCheckpoint: Guard writes the state to disk straight from the Parameters'
    memory (no host copy; here at every step its write time allows, ``--keep-often`` lifting the time rules a run
    this short would otherwise never meet), and the printed line resumes from the last one before the failure
    instead of re-training from step 1."""
    args = ["--vocab", "400000", "--steps", "20", "--poison", "17", "--ckpt-every", "0", "--keep-often"]
    first = subprocess.run([sys.executable, str(CHECKPOINTS), *args], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    assert "writing it to disk straight from the Parameters instead" in first.stderr, explain(first)
    assert not (tmp_path / "ckpt").exists()
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["status"] == "failed" and record["global_step"] == 17, (record, explain(first))
    kept = record["kept_state"]
    # (17: written as the failing step began, checked finite before it; 2: the first point, after the first passing
    # check, when a loaded machine made each write take longer than the steps until the failure)
    assert 2 <= kept["step"] <= 17, record
    states = sorted(Path(kept["path"]).parent.glob("step-*"))
    assert 1 <= len(states) <= 2 and Path(kept["path"]) in states, states   # the last two stay
    meta = json.loads((Path(kept["path"]) / "state.json").read_text())
    assert meta["written_from"] == "parameters" and "checkpoint" not in meta, meta
    assert meta["shapes"][0] == [400000, 32] and meta["sha256"] == kept["sha256"], meta
    assert all(int(k) >= kept["step"] for k in meta["trace"]), sorted(meta["trace"])   # the steps since it
    assert kept["step"] == 17 or {str(kept["step"]), "16"} <= set(meta["trace"]), sorted(meta["trace"])
    table = np.load(Path(kept["path"]) / "p0.npy", allow_pickle=False)   # (a big array: a file of its own)
    assert table.shape == (400000, 32) and np.isfinite(table).all() and "0" in meta["files"], meta.get("files")
    with np.load(Path(kept["path"]) / "state.npz") as arrays:
        assert "p0" not in arrays.files and "p1" in arrays.files, arrays.files

    hunt, run = _hunt_printed(tmp_path, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    assert summary["failure"]["global_step"] == 17, summary["failure"]
    if meta.get("warm_up", 0) >= kept["step"] - 1:   # every step before it is the warm-up's: nothing saved by it
        assert summary["from_record"]["route"] == "from_step_1", summary["from_record"]
        return
    assert summary["from_record"]["route"] == "resume" and "fallback" not in summary["from_record"], summary
    assert f"from the training state kept at global step {kept['step']}:" in hunt.stderr, explain(hunt)


def test_a_wider_look_at_a_step_kept_as_statistics_runs_from_the_checkpoint_before_it(tmp_path):
    """The locate pass dumped the failing step narrowly and kept the 51 MB table there as statistics; the culprit is
    the optimizer's (an infinite learning rate at step 17), which the narrow dump leaves out. The wider look cannot
    run from statistics: it runs from the step-16 checkpoint the locate pass ran from, dumping from step 17's
    iteration on, and names the learning rate."""
    args = ["--vocab", "400000", "--steps", "20", "--poison", "0", "--inf-lr-at", "17", "--ckpt-every", "5"]
    first = subprocess.run([sys.executable, str(CHECKPOINTS), *args], cwd=tmp_path, env=clean_env(),
                           capture_output=True, text=True, timeout=300)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert record["status"] == "failed" and record["kept_state"]["step"] == 16, (record, explain(first))

    hunt, run = _hunt_printed(tmp_path, first)
    assert hunt.returncode == 1, explain(hunt)
    summary = summary_of(run)
    assert summary["failure"]["global_step"] == 17, summary["failure"]
    assert json.loads((run / "locate" / "state" / "state.json").read_text())["summarized"], explain(hunt)
    assert ("of the same step, from the state kept at global step 16 (the one at the step holds statistics only)"
            in hunt.stderr), explain(hunt)
    assert "(dump iterations 1 on); from the training state kept at global step 16" in hunt.stderr, explain(hunt)
    assert [p.name for p in (run / "locate-all_outputs" / "dump" / "rank_0" / "Net" / "0").iterdir()] == ["1"]
    assert "the learning rate (learning_rate) was already Inf/NaN when the step began" in hunt.stdout, explain(hunt)
