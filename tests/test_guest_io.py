"""Never in the way (issue 50): Guard never refuses a training the bare script would start, never leaves a failing run
unguarded, and never takes a callback's own error for a failure of the training.

* a read-only working folder (code on a cluster mount): the record and the kept states go to a folder in the temp
  directory, said once, and the ``hunt --from`` line names it (and runs there);
* a record name too long for the names derived from it (the per-run copy inserts the run id): they get a shorter
  name, said once; mindguard's own error at the failure never leaves it unstopped;
* a callback of the script's raising its own error: the exception passes unchanged, named as that callback's, with
  no hunt line and no state kept.

Each trains the same tiny network (Dense(4, 1), 8 steps) bare and with Guard in real processes: with Guard on it
computes exactly the losses the bare script computes. The read-only folder is a real read-only bind mount (root
writes through ``chmod``; skipped, saying why, where mounting is not allowed).
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np
import pytest

from hunting import clean_env, explain
from mindguard.protocol import folder as layout
from mindguard.protocol.record import FailureRecord

pytestmark = pytest.mark.slow

SCRIPT = '''
import json, sys
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard

opts = json.loads(sys.argv[1])
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
ms.set_seed(1)
np.random.seed(1)


class Source:
    def __init__(self):
        rng = np.random.RandomState(0)
        self.x = rng.randn(32, 4).astype(np.float32)
        self.y = rng.randn(32, 1).astype(np.float32)
        if opts.get("poison"):   # an Inf in the batch of 1-based step `poison`
            self.x[(opts["poison"] - 1) * 4] = np.inf

    def __getitem__(self, i):
        if opts.get("source_raises") and i == (opts["source_raises"] - 1) * 4:
            raise OSError("cannot read sample %d" % i)
        return self.x[i], self.y[i]

    def __len__(self):
        return 32


class Losses(Callback):
    def __init__(self):
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(run_context.original_args().net_outputs.asnumpy()))
        with open(opts["out"], "w") as f:   # every step: whatever ends the run, the losses so far
            json.dump(self.losses, f)


class MyCallback(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().cur_step_num == 3:
            raise RuntimeError("my bug")


net = nn.Dense(4, 1)
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))
data = ds.GeneratorDataset(Source(), ["x", "y"], shuffle=False).batch(4)
callbacks = [Losses()]
if opts.get("guard"):
    callbacks.insert(0, mindguard.Guard(**opts.get("guard_args", {})))
if opts.get("my_callback") == "after":
    callbacks.append(MyCallback())
elif opts.get("my_callback") == "before":
    callbacks.insert(0, MyCallback())
model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
print("TRAINING ENDED", flush=True)
'''

HUNT_LINE = re.compile(r"mindguard hunt --from (\S+) -- ")
FELL_BACK = "cannot write in "
SHORTENED = "leaves no room for the names mindguard derives from it"


def train(folder: Path, out: Path, *, env: Dict[str, str], **opts: Any) -> Tuple[subprocess.CompletedProcess,
                                                                                     List[float]]:
    """Run SCRIPT (``folder/train.py``) in ``folder`` with ``opts``; the process and the losses of the steps it ran."""
    proc = subprocess.run([sys.executable, str(folder / "train.py"), json.dumps({"out": str(out), **opts})],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=240)
    losses = json.loads(out.read_text()) if out.exists() else []
    return proc, losses


def same(a: List[float], b: List[float]) -> bool:
    """The same losses, to the bit (NaN equal to NaN)."""
    return len(a) == len(b) and np.array_equal(np.array(a), np.array(b), equal_nan=True)


def hunt_record(proc: subprocess.CompletedProcess) -> Path:
    found = HUNT_LINE.findall(proc.stderr)
    assert found, explain(proc)
    return Path(found[-1])


@contextlib.contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    """``folder`` made read-only by a real read-only bind mount onto itself (root writes through ``chmod``), or the
    test is skipped saying why."""
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True, text=True)
    if bound.returncode != 0:
        pytest.skip(f"cannot bind-mount a folder read-only here ({bound.stderr.strip() or bound.returncode}); run "
                    f"the tests as root on Linux")
    try:
        ro = subprocess.run(["mount", "-o", "remount,bind,ro", str(folder)], capture_output=True, text=True)
        if ro.returncode != 0:
            pytest.skip(f"cannot remount a bind mount read-only here ({ro.stderr.strip()})")
        with pytest.raises(OSError):   # really read-only, for root too
            (folder / "probe").write_text("x")
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)


@pytest.fixture
def code(tmp_path) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "train.py").write_text(SCRIPT)
    return folder


@pytest.fixture
def env(tmp_path) -> Dict[str, str]:
    """The user's environment, with a temp directory of the test's own (where a fallback record goes)."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    return dict(clean_env(), TMPDIR=str(temp))


@pytest.fixture(scope="module")
def bare(tmp_path_factory) -> Dict[int, List[float]]:
    """The bare script's losses (no Guard), healthy (``0``) and with an Inf in step 3's batch (``3``): once (under
    ``-n`` the module goes whole to one worker: tests/conftest.py), what every guarded run is compared with."""
    folder = tmp_path_factory.mktemp("bare")
    (folder / "train.py").write_text(SCRIPT)
    losses = {}
    for poison in (0, 3):
        proc, losses[poison] = train(folder, folder / f"losses{poison}.json", env=clean_env(), poison=poison)
        assert proc.returncode == 0 and len(losses[poison]) == 8, explain(proc)
    assert np.isnan(losses[3][2]) and not np.isnan(losses[3][1]), losses   # bare: on, NaN from step 3 to the end
    return losses


def fallback_of(folder: Path, env: Dict[str, str]) -> Path:
    """Where Guard writes the record asked for in the unwritable ``folder`` (layout.fallback_folders, first choice)."""
    real = os.path.realpath(folder)
    return Path(env["TMPDIR"]) / f"mindguard-{os.getuid()}" / f"{Path(real).name}-{layout.short_digest(real)}"


# -- 1. a read-only working folder ---------------------------------------------------------------------------------
def test_in_a_read_only_folder_guard_trains_as_the_bare_script_with_its_record_in_the_temp_directory(code, env,
                                                                                                        tmp_path):
    with read_only(code):
        bare, bare_losses = train(code, tmp_path / "bare.json", env=env)
        guarded, losses = train(code, tmp_path / "guarded.json", env=env, guard=True)
        assert bare.returncode == 0 and "TRAINING ENDED" in bare.stdout, explain(bare)
        assert guarded.returncode == 0 and "TRAINING ENDED" in guarded.stdout, explain(guarded)
        assert len(bare_losses) == 8 and same(losses, bare_losses), (losses, bare_losses)
        record = fallback_of(code, env) / layout.DEFAULT_RECORD
        said = [line for line in guarded.stderr.splitlines() if FELL_BACK in line]
        assert len(said) == 1 and f"{str(record)!r}" in said[0] and "Read-only file system" in said[0], \
            explain(guarded)
        assert FailureRecord.load(record).status == "finished"
        assert sorted(p.name for p in code.iterdir()) == ["train.py"]   # (nothing could be written there)


def test_in_a_read_only_folder_a_failing_run_is_stopped_at_its_step_and_its_hunt_line_runs_there(code, env,
                                                                                                   tmp_path, bare):
    with read_only(code):
        guarded, losses = train(code, tmp_path / "guarded.json", env=env, guard=True, poison=3)
        assert guarded.returncode == 0, explain(guarded)
        assert same(losses, bare[3][:3]), (losses, bare[3])   # stopped at the failing step 3 (bare goes on)
        fallback = fallback_of(code, env)
        record = FailureRecord.load(fallback / layout.DEFAULT_RECORD)
        assert (record.status, record.global_step) == ("failed", 3), record
        own = hunt_record(guarded)
        assert own == layout.run_record(fallback / layout.DEFAULT_RECORD, record.run_id) and own.exists(), own
        assert record.states and Path(record.states).parent == layout.kept_states(fallback / layout.DEFAULT_RECORD)
        assert Path(record.states).is_dir(), record.states
        assert sum(FELL_BACK in line for line in guarded.stderr.splitlines()) == 1, explain(guarded)
        # the printed line runs in the read-only folder too: its run folder moves to the temp directory
        line = re.search(r"^\s*(\S+ -m mindguard hunt --from .*|mindguard hunt --from .*)$", guarded.stderr, re.M)
        assert line is not None, explain(guarded)
        hunt = subprocess.run(line.group(1), shell=True, cwd=code, env=env, capture_output=True, text=True,
                              timeout=240)
        assert hunt.returncode == 1, explain(hunt)   # found and explained
        assert "cannot be written here; using" in hunt.stderr and "inputs0 (batch" in hunt.stdout + hunt.stderr, \
            explain(hunt)


# -- 2. a record name too long for the names derived from it --------------------------------------------------------
@pytest.mark.parametrize("length", [245, 300], ids=["245 characters", "past the file system's limit"])
def test_a_long_record_name_guards_the_run_as_the_bare_script_trains_it(code, env, tmp_path, bare, length):
    name = "x" * length + ".json"
    guarded, losses = train(code, tmp_path / "guarded.json", env=env, guard=True, guard_args={"record": name})
    assert guarded.returncode == 0 and "TRAINING ENDED" in guarded.stdout, explain(guarded)
    assert same(losses, bare[0]), (losses, bare[0])
    assert "Traceback" not in guarded.stderr and "disabled its" not in guarded.stderr, explain(guarded)
    assert sum(SHORTENED in line for line in guarded.stderr.splitlines()) == 1, explain(guarded)
    record = layout.fitted_record(code / name)
    assert (record == code / name) == (length == 245), record
    assert FailureRecord.load(record).status == "finished"


@pytest.mark.parametrize("action", ["stop", "raise"])
def test_a_failing_run_with_a_long_record_name_is_stopped_at_its_step_with_its_record_written(code, env, tmp_path,
                                                                                               bare, action):
    name = "x" * 245 + ".json"
    guarded, losses = train(code, tmp_path / "guarded.json", env=env, guard=True, poison=3,
                            guard_args={"record": name, "action": action})
    if action == "raise":   # from Guard's step end, before the losses callback saw step 3
        assert same(losses, bare[3][:2]), (losses, bare[3])
        assert guarded.returncode == 1 and "NonFiniteError: mindguard: training went non-finite at epoch 1, step " \
            "3/8 (global step 3)" in guarded.stderr, explain(guarded)
    else:   # stopped after the failing step 3 (the bare script goes on, NaN to the end)
        assert same(losses, bare[3][:3]), (losses, bare[3])
        assert guarded.returncode == 0 and "TRAINING ENDED" in guarded.stdout, explain(guarded)
    assert "File name too long" not in guarded.stderr and "disabled its" not in guarded.stderr, explain(guarded)
    record = FailureRecord.load(code / name)   # the name asked for: the file system takes it
    assert (record.status, record.kind, record.global_step) == ("failed", "nonfinite_loss", 3), record
    own = hunt_record(guarded)
    assert own == layout.run_record(code / name, record.run_id) and own.exists(), own
    assert len(os.fsencode(own.name)) <= layout.name_max(code) and own.name.startswith("x" * 100), own.name
    states = layout.kept_states(code / name)
    assert Path(record.states).parent == states and states.is_dir() and len(states.name) < len(name), states
    assert sum(SHORTENED in line for line in guarded.stderr.splitlines()) == 1, explain(guarded)


def test_mindguards_own_error_writing_the_failure_never_leaves_it_unstopped(graph_mode, tmp_path, capfd,
                                                                              monkeypatch):
    """Whatever of mindguard's own fails after the failure is decided (here the run's own copy of the record), the
    training is still stopped at the failing step, with the record written and the hunt line printed."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, Model

    import mindguard
    from mindguard.training.record.recorder import Recorder

    def broken(self):
        raise OSError(5, "Input/output error (injected)")

    monkeypatch.setattr(Recorder, "_keep_failure_record", broken)
    x = np.random.RandomState(0).randn(32, 4).astype(np.float32)
    x[8] = np.inf   # step 3's batch
    steps: List[int] = []

    class Steps(Callback):
        def on_train_step_end(self, run_context):
            steps.append(run_context.original_args().cur_step_num)

    ms.set_seed(1)
    net = nn.Dense(4, 1)
    data = ds.NumpySlicesDataset({"x": x, "y": np.ones((32, 1), np.float32)}, shuffle=False).batch(4)
    record = tmp_path / "failure.json"
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
        1, data, callbacks=[mindguard.Guard(record=str(record)), Steps()], dataset_sink_mode=False)
    assert steps == [1, 2, 3], steps
    saved = FailureRecord.load(record)
    assert (saved.status, saved.global_step) == ("failed", 3), saved
    err = capfd.readouterr().err
    assert "not all of it could be written" in err and "injected" in err, err
    assert "mindguard hunt --from" in err and "disabled its" not in err, err


# -- 3. a callback's own error ----------------------------------------------------------------------------------
@pytest.mark.parametrize("where", ["after", "before"], ids=["after Guard", "before Guard"])
def test_a_callbacks_own_error_passes_unchanged_named_as_the_callbacks_with_no_hunt_line(code, env, tmp_path,
                                                                                          where):
    proc, losses = train(code, tmp_path / "losses.json", env=env, guard=True, my_callback=where)
    assert proc.returncode == 1 and proc.stderr.rstrip().splitlines()[-2] == "RuntimeError: my bug" or \
        "RuntimeError: my bug" in proc.stderr, explain(proc)
    assert "mindguard hunt" not in proc.stderr and "training failed" not in proc.stderr, explain(proc)
    note = [line for line in proc.stderr.splitlines() if line.startswith("mindguard: the callback MyCallback")]
    assert note and "raised RuntimeError: my bug in on_train_step_end" in note[0], explain(proc)
    assert "not a failure of the training; no hunt needed" in note[0] and "train.py:" in note[0], note
    assert proc.stderr.rstrip().splitlines()[-1] == note[0], explain(proc)   # said again after the traceback
    record = FailureRecord.load(code / layout.DEFAULT_RECORD)
    assert (record.kind, record.phase, record.global_step) == ("exception", "script", 3), record
    assert record.raised_by is not None and (record.raised_by["callback"], record.raised_by["hook"]) == \
        ("MyCallback", "on_train_step_end"), record.raised_by
    assert not layout.run_record(code / layout.DEFAULT_RECORD, str(record.run_id)).exists()   # nothing to hunt:
    assert not layout.kept_states(code / layout.DEFAULT_RECORD).exists()                      # no copy, no states
    # the hunt, given the record anyway, says whose error it was and runs nothing (exit 4: the command's own error)
    hunt = subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--from", str(code / layout.DEFAULT_RECORD),
                           "--", sys.executable, "train.py", "{}"], cwd=code, env=env, capture_output=True,
                          text=True, timeout=120)
    assert hunt.returncode == 4 and "MyCallback.on_train_step_end" in hunt.stderr, explain(hunt)


def test_a_callbacks_exception_is_the_very_object_raised(graph_mode, tmp_path, capsys):
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, Model

    import mindguard

    error = RuntimeError("my bug")

    class MyCallback(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().cur_step_num == 2:
                raise error

    ms.set_seed(1)
    net = nn.Dense(4, 1)
    data = ds.NumpySlicesDataset({"x": np.ones((16, 4), np.float32), "y": np.ones((16, 1), np.float32)},
                                 shuffle=False).batch(4)
    with pytest.raises(RuntimeError) as raised:
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            1, data, callbacks=[mindguard.Guard(record=str(tmp_path / "r.json")), MyCallback()],
            dataset_sink_mode=False)
    assert raised.value is error and raised.value.args == ("my bug",)
    err = capsys.readouterr().err
    assert "the callback MyCallback raised RuntimeError: my bug in on_train_step_end" in err, err
    assert "mindguard hunt" not in err, err


def test_a_dataset_source_that_raises_stays_a_failure_of_the_training(code, env, tmp_path):
    proc, _ = train(code, tmp_path / "losses.json", env=env, guard=True, source_raises=3)
    assert proc.returncode == 1 and "cannot read sample 8" in proc.stderr, explain(proc)
    assert "mindguard: the callback" not in proc.stderr, explain(proc)
    record = FailureRecord.load(hunt_record(proc))
    assert (record.kind, record.phase, record.raised_by) == ("exception", "between_steps", None), record


# -- the names themselves (no MindSpore) ---------------------------------------------------------------------------
def test_derived_names_fit_the_file_system_and_are_unchanged_for_usual_names(tmp_path):
    usual = tmp_path / layout.DEFAULT_RECORD
    assert (layout.run_record(usual, "20261203-130512-4242").name, layout.kept_states(usual).name,
            layout.progress_beside(usual).name, layout.record_lock(usual).name) == (
        "mindguard_failure.20261203-130512-4242.json", "mindguard_failure.state", ".mindguard_failure.json.progress",
        ".mindguard_failure.json.lock")
    limit = layout.name_max(tmp_path)
    a, b = tmp_path / ("x" * 245 + "a.json"), tmp_path / ("x" * 245 + "b.json")
    for record in (a, b, tmp_path / ("é" * 200 + ".json")):   # (bytes, not characters, count: é is 2)
        derived = [layout.run_record(record, "earlier-20261203-130512-99"), layout.kept_states(record),
                   layout.progress_beside(record), layout.record_lock(record), layout.fitted_record(record)]
        assert all(len(os.fsencode(p.name)) <= limit for p in derived), [len(os.fsencode(p.name)) for p in derived]
        assert layout.fitted_stem(record) == layout.fitted_stem(Path(str(record)))   # the same in every process
        assert derived[0].match(layout.run_records_pattern(record))
    assert layout.fitted_stem(a) != layout.fitted_stem(b)


def test_a_fallback_folder_is_per_folder_and_per_user_in_the_temp_directory(tmp_path, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first, *rest = layout.fallback_folders("/srv/code/project")
    assert first.parent == tmp_path / f"mindguard-{os.getuid()}" and first.name.startswith("project-"), first
    assert first == layout.fallback_folders("/srv/code/project")[0] != layout.fallback_folders("/srv/other/project")[0]
    assert rest and rest[0].parts[-4:-1] == (".cache", "mindguard", "records"), rest
