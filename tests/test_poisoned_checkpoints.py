"""The training's own checkpoints at a failure (issue 50): Guard names the ``ModelCheckpoint`` files written at or after
the failing step -- they hold NaN/Inf weights -- and the last one before it, in its printed lines and in the record's
``checkpoints`` field (mindguard.training.state.user_checkpoints).

Real MindSpore on CPU, trained in this process: a Dense regression whose weights go non-finite at a known step (an Inf
in the batch of step ``POISON``, or an infinite learning rate at step ``INF_LR``), ``ModelCheckpoint`` every few
steps before or after Guard in the callback list. Every file the record names is loaded back with
``mindspore.load_checkpoint`` and its weights checked, so the answer is the files' own.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

import mindguard  # noqa: E402
from mindguard.training.state import user_checkpoints  # noqa: E402

STEPS = 20
EVERY = 3      # ModelCheckpoint(save_checkpoint_steps=EVERY)
POISON = 9     # an Inf in this step's batch: its loss is Inf, its update makes the weights NaN (a save step)
INF_LR = 14    # the learning rate is Inf at this step: the weights go Inf after it, its loss is still finite (late
#                enough that the Parameter checks a tiny budget allows, the first few steps', are well before it)
WEIGHTS = ("weight", "bias")


def _train(tmp_path: Path, *, guard: Optional[Dict[str, Any]] = None, order: str = "after", poison: int = 0,
           inf_lr: int = 0, every: int = EVERY, at_failure: Optional[List[Any]] = None) -> Path:
    """Train the regression for ``STEPS`` steps (one epoch) with ``ModelCheckpoint`` into ``tmp_path/ckpt``, and --
    ``guard``: its arguments -- a Guard after (``order="before"``: ModelCheckpoint runs first) or before it in the
    callback list. ``at_failure``: gets the record's ``checkpoints`` as written at the failing step's end. Returns the
    checkpoint folder."""
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint

    from mindguard.training.run import current_run

    class RecordAtFailure(Callback):
        def on_train_step_end(self, run_context):
            if at_failure is not None and not at_failure and current_run().failure is not None:
                at_failure.append(json.loads((tmp_path / "record.json").read_text()).get("checkpoints"))

    ms.set_seed(1)
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (STEPS * 4, 3)).astype(np.float32)
    y = rng.uniform(0, 1, (STEPS * 4, 1)).astype(np.float32)
    if poison:
        x[(poison - 1) * 4, 0] = np.inf
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
    net = nn.Dense(3, 1)
    # (a per-step learning rate: 1-based step k uses entry k - 1, measured)
    lr = ms.Tensor(np.where(np.arange(STEPS) == inf_lr - 1, np.inf, 0.01).astype(np.float32)) if inf_lr else 0.01
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), lr))
    folder = tmp_path / "ckpt"
    checkpoints = ModelCheckpoint(prefix="net", directory=str(folder),
                                  config=CheckpointConfig(save_checkpoint_steps=every, keep_checkpoint_max=100))
    callbacks: List[Any] = [checkpoints]
    if guard is not None:
        made = mindguard.Guard(record=str(tmp_path / "record.json"), **guard)
        callbacks.insert(len(callbacks) if order == "before" else 0, made)
    model.train(1, data, callbacks=callbacks + [RecordAtFailure()], dataset_sink_mode=False)
    return folder


def _files(folder: Path) -> Dict[int, Path]:
    """The checkpoint files of ``folder`` by the 1-based step whose end they hold (``net-1_<step>.ckpt``)."""
    return {int(p.stem.split("_")[-1]): p for p in folder.glob("net-*.ckpt")}


def _weights_finite(path: Path) -> bool:
    loaded = ms.load_checkpoint(str(path))
    return all(np.isfinite(loaded[name].asnumpy()).all() for name in WEIGHTS)


def _record(tmp_path: Path) -> Dict[str, Any]:
    return json.loads((tmp_path / "record.json").read_text())


def _assert_named(record: Dict[str, Any], folder: Path, bad_from: int, err: str) -> None:
    """The record and the printed lines name exactly the files of steps >= ``bad_from`` -- which load non-finite --
    and the last one before (which loads finite)."""
    files = _files(folder)
    bad = sorted(s for s in files if s >= bad_from)
    good = max(s for s in files if s < bad_from)
    named = record["checkpoints"]
    assert [(e["step"], Path(e["path"])) for e in named["poisoned"]] == [(s, files[s]) for s in bad], named
    assert all(e["finite"] is False for e in named["poisoned"]), named
    assert all(not _weights_finite(files[s]) for s in bad), "a file named poisoned holds finite weights"
    assert (named["last_good"]["step"], Path(named["last_good"]["path"])) == (good, files[good]), named
    assert _weights_finite(files[good]) and all(_weights_finite(files[s]) for s in files if s < bad_from)
    line = next(line for line in err.splitlines() if "checkpoints written" in line)
    assert line.endswith(": " + ", ".join(f"ckpt/net-1_{s}.ckpt" for s in bad)) or len(bad) > 4, line
    assert "(NaN/Inf weights" in line, line
    assert f"    last one before it: ckpt/net-1_{good}.ckpt (end of global step {good}, finite)" in err, err


@pytest.mark.parametrize("order", ["before", "after"])
def test_stop_names_the_failing_step_s_file_and_the_last_one_before(tmp_path, graph_mode, capsys, monkeypatch,
                                                                      order):
    """GRAPH, action="stop", the failing step a save step: its file holds NaN weights whichever of ModelCheckpoint and
    Guard runs first at the step's end -- before Guard, it is written before the failure is seen (and the record
    written at the failure names it already, by the Parameter check); after, once Guard has asked to stop. The line
    comes after the training call ended, with every file read back."""
    monkeypatch.chdir(tmp_path)
    at_failure: List[Any] = []
    folder = _train(tmp_path, guard={}, order=order, poison=POISON, at_failure=at_failure)
    record = _record(tmp_path)
    assert record["status"] == "failed" and record["global_step"] == POISON, record
    assert sorted(_files(folder)) == [3, 6, 9], sorted(_files(folder))   # stopped at 9: nothing after it
    err = capsys.readouterr().err
    _assert_named(record, folder, POISON, err)
    assert record["checkpoints"]["poisoned"][0]["how"] == "read", record["checkpoints"]
    assert record["checkpoints"]["poisoned"][0]["nonfinite"] == list(WEIGHTS), record["checkpoints"]
    assert err.index("hunt --from") < err.index("mindguard: checkpoints written "), err
    written = [(e["step"], e["finite"], e["how"]) for e in at_failure[0]["poisoned"]]
    assert written == ([(POISON, False, "checked")] if order == "before" else []), at_failure   # not read yet
    assert at_failure[0]["last_good"]["step"] == POISON - EVERY, at_failure


def test_continue_names_every_file_written_after_the_failure(tmp_path, graph_mode, capsys, monkeypatch):
    """action="continue": the training goes on after the failure and ModelCheckpoint keeps writing NaN weights; the
    line at the call's end names them all and the last one before the failure."""
    monkeypatch.chdir(tmp_path)
    folder = _train(tmp_path, guard={"action": "continue"}, poison=POISON - 1)
    record = _record(tmp_path)
    assert record["status"] == "failed" and record["global_step"] == POISON - 1, record
    assert sorted(_files(folder)) == [3, 6, 9, 12, 15, 18, 20], sorted(_files(folder))   # (20: at the call's end)
    err = capsys.readouterr().err
    _assert_named(record, folder, POISON - 1, err)
    # the first is read back (confirming the check), the later ones follow from it and the check: Inf/NaN stays
    assert [e["how"] for e in record["checkpoints"]["poisoned"]] == ["read"] + ["checked"] * 4, record["checkpoints"]
    assert "(NaN/Inf weights, read back or by mindguard's check): " in err, err
    assert "ckpt/net-1_9.ckpt, ckpt/net-1_12.ckpt, ckpt/net-1_15.ckpt, ... (1 more), ckpt/net-1_20.ckpt" in err, err


def test_a_window_s_files_are_read_back_to_find_the_last_good_one(tmp_path, graph_mode, capsys, monkeypatch):
    """The Parameters checked on a budget (no kept state: no check follows each checkpoint): an infinite learning
    rate at step INF_LR makes the weights Inf while its loss is finite, the loss of the next step shows it, and the
    record names a window of steps. The files inside the window are read back: the one of the step before INF_LR is
    the last good one (read, not assumed), the ones from INF_LR on hold Inf. The schedule's own Inf (the learning
    rate is a Parameter in every file) does not count: only the Parameters a step writes do."""
    monkeypatch.chdir(tmp_path)
    folder = _train(tmp_path, guard={"keep_state": False, "check_budget": 1e-6}, inf_lr=INF_LR, every=2)
    record = _record(tmp_path)
    window = record["failure_window"]
    assert record["status"] == "failed" and record["global_step"] == INF_LR + 1, record
    assert window[0] < INF_LR - 1 and window[1] == INF_LR + 1, record   # (so the files of INF_LR - 2.. are in it)
    assert "learning_rate" in ms.load_checkpoint(str(_files(folder)[2])) and not np.isfinite(
        ms.load_checkpoint(str(_files(folder)[2]))["learning_rate"].asnumpy()).all()
    err = capsys.readouterr().err
    _assert_named(record, folder, INF_LR, err)
    named = record["checkpoints"]
    assert named["from_step"] == window[0] and named["last_good"]["how"] == "read", named
    assert f"checkpoints written in or after global steps {window[0]}-{window[1]} (NaN/Inf weights, read back)" \
        in err, err


def test_files_not_read_back_are_named_as_possibly_poisoned(tmp_path, graph_mode, capsys, monkeypatch):
    """With no time left to read files back (a model too big for the budget), a file inside the window is possibly
    poisoned and the last good one is the newest the Parameter check vouches for; a file the check condemns stays
    named poisoned, by the check."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(user_checkpoints, "READ_SECONDS", 0.0)
    folder = _train(tmp_path, guard={"keep_state": False, "check_budget": 1e-6}, inf_lr=INF_LR, every=2)
    record = _record(tmp_path)
    first = record["failure_window"][0]
    named = record["checkpoints"]
    files = _files(folder)
    assert [(e["step"], e["finite"], e["how"]) for e in named["poisoned"]] == \
        [(s, False if s == INF_LR + 1 else None, "checked" if s == INF_LR + 1 else "not_read")
         for s in sorted(files) if s >= first], named
    good = max(s for s in files if s < first)
    assert (named["last_good"]["step"], named["last_good"]["how"]) == (good, "checked"), named
    err = capsys.readouterr().err
    assert "possibly also (not read back): " in err and f"last one before it: ckpt/net-1_{good}.ckpt" in err, err


def test_pynative_raise_names_the_files_before_the_exception_goes_on(tmp_path, capsys, monkeypatch):
    """PyNative, action="raise", ModelCheckpoint before Guard: the failing step's file is written before Guard raises
    NonFiniteError at that step's end, so it is named as the exception leaves the training call; no later file."""
    monkeypatch.chdir(tmp_path)
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    try:
        with pytest.raises(mindguard.NonFiniteError):
            _train(tmp_path, guard={"action": "raise"}, order="before", poison=POISON)
    finally:
        ms.set_context(mode=previous)
    record = _record(tmp_path)
    assert record["status"] == "failed" and record["global_step"] == POISON, record
    folder = tmp_path / "ckpt"
    assert sorted(_files(folder)) == [3, 6, 9], sorted(_files(folder))
    _assert_named(record, folder, POISON, capsys.readouterr().err)


def test_a_healthy_run_names_nothing_and_its_checkpoints_are_a_bare_run_s(tmp_path, graph_mode, capsys, monkeypatch):
    """Guard in a healthy run says nothing of the checkpoints, writes no ``checkpoints`` field, and the files
    ModelCheckpoint writes are those of the same training without Guard: same names, same values."""
    monkeypatch.chdir(tmp_path)
    guarded = _train(tmp_path / "guarded", guard={})
    bare = _train(tmp_path / "bare")
    record = _record(tmp_path / "guarded")
    assert record["status"] == "finished" and "checkpoints" not in record, record
    assert "checkpoints written" not in capsys.readouterr().err
    assert sorted(p.name for p in guarded.iterdir()) == sorted(p.name for p in bare.iterdir())
    for name in sorted(p.name for p in bare.glob("*.ckpt")):
        ours, theirs = ms.load_checkpoint(str(guarded / name)), ms.load_checkpoint(str(bare / name))
        assert sorted(ours) == sorted(theirs), name
        for key in theirs:
            assert np.array_equal(ours[key].asnumpy(), theirs[key].asnumpy()), (name, key)


def test_the_judgement_of_the_files(tmp_path):
    """What is known of each file (mindguard.training.state.user_checkpoints.judge), without MindSpore's training: a
    check vouches for the steps up to the last passing one and condemns those from a failing one on; a file read back
    finite vouches for the earlier ones, one read back non-finite condemns the later ones."""
    files = {f"f{s}": s for s in (2, 4, 6, 8, 10, 12)}
    judged = user_checkpoints.judge(files, finite_after=3, bad=10, scans={"f8": ["w"], "f6": []})
    assert [(e["step"], e["finite"], e["how"]) for e in judged] == [
        (2, True, "checked"), (4, True, "inferred"), (6, True, "read"), (8, False, "read"), (10, False, "checked"),
        (12, False, "checked")]
    field = user_checkpoints.field(judged, finite_after=3)
    assert field["from_step"] == 4 and [e["step"] for e in field["poisoned"]] == [8, 10, 12]
    assert field["last_good"]["step"] == 6 and field["poisoned"][0]["nonfinite"] == ["w"]
    unread = user_checkpoints.judge(files, finite_after=None, bad=None, scans={})
    assert all(e["finite"] is None and e["how"] == "not_read" for e in unread)


def test_a_file_is_read_back_in_the_formats_mindspore_saves(tmp_path):
    """A checkpoint is read back by MindSpore's own reader: plain, with ``append_dict`` values, with a ``crc_check``
    trailer, with float16, float64 and bfloat16 Parameters and integers (never non-finite); a ``safetensors`` file; an
    encrypted one cannot be read without its key (None: not read back). ``names`` limits the verdict to those
    tensors."""
    values = np.random.default_rng(0).uniform(size=(50, 40)).astype(np.float32)
    values[3, 4] = np.nan
    params = [ms.Parameter(ms.Tensor(values), name="f32"),
              ms.Parameter(ms.Tensor(np.full((7,), np.inf, np.float16)), name="f16"),
              ms.Parameter(ms.Tensor(np.ones((5, 3), np.float32), ms.bfloat16), name="bf16_ok"),
              ms.Parameter(ms.Tensor(np.array([-np.inf, 1], np.float32), ms.bfloat16), name="bf16_inf"),
              ms.Parameter(ms.Tensor(np.array([1, 2], np.int32)), name="ints"),
              ms.Parameter(ms.Tensor(np.ones((3,), np.float64)), name="f64_ok")]
    bad = ["f32", "f16", "bf16_inf"]
    saves = {"plain.ckpt": {"append_dict": {"epoch_num": 3, "note": "text", "lr": 0.5}},
             "crc.ckpt": {"crc_check": True}, "model.safetensors": {"format": "safetensors"},
             "secret.ckpt": {"enc_key": b"0123456789abcdef"}}
    for name, kwargs in saves.items():
        ms.save_checkpoint(params, str(tmp_path / name), **kwargs)
    for name in ("plain.ckpt", "crc.ckpt"):
        assert user_checkpoints.scan_checkpoint(str(tmp_path / name), None) == bad, name
        assert user_checkpoints.scan_checkpoint(str(tmp_path / name), {"f32", "bf16_ok", "ints"}) == ["f32"], name
        loaded = ms.load_checkpoint(str(tmp_path / name))
        assert [k for k in bad if not np.isfinite(loaded[k].astype(ms.float32).asnumpy()).all()] == bad
    assert sorted(user_checkpoints.scan_checkpoint(str(tmp_path / "model.safetensors")) or []) == sorted(bad)
    assert user_checkpoints.scan_checkpoint(str(tmp_path / "secret.ckpt")) is None
