"""fix_randomness, save_params/load_params and the Reproducible callback, on real MindSpore training."""
from __future__ import annotations

import hashlib
import json
import os
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Parameter, Tensor, nn
from mindspore.train import Callback, Model

import mindguard
import mindguard.training.reproduce
from mindguard.training import seed as _seed, reproduce
from mindguard.errors import ParamsMismatchError
from mindguard.training.reproduce import shuffling_ops

# ------------------------------------------------------------------------------------------ helpers

TRAIN_SCRIPT = r"""
import json, sys, warnings
import numpy as np
import mindspore as ms, mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard.training.reproduce

mode, seed = sys.argv[1], int(sys.argv[2])
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
if mode == "fixed":
    mindguard.fix_randomness(seed, cpu_single_thread=True)

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 32)
        self.drop = nn.Dropout(p=0.5)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(32, 1)
    def construct(self, x):
        return self.fc2(self.drop(self.relu(self.fc1(x))))

rng = np.random.RandomState(123)           # the data itself is the same in every run
x = rng.rand(32, 4).astype(np.float32)
y = (x @ np.array([[1.0], [-2.0], [0.5], [3.0]], np.float32)).astype(np.float32)
data = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).shuffle(32).batch(8)

net = Net()
losses = []
class Record(Callback):
    def on_train_step_end(self, run_context):
        losses.append(float(run_context.original_args().get("net_outputs").asnumpy()).hex())
callbacks = [Record()]
if mode == "fixed":
    callbacks.insert(0, mindguard.training.reproduce.Reproducible())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9)).train(
        2, data, callbacks=callbacks, dataset_sink_mode=False)
print(json.dumps({"losses": losses,
                  "warnings": [str(w.message) for w in caught if w.category.__name__ == "ReproducibilityWarning"]}))
"""


def _train_in_child(run_py, script, mode, seed=0):
    """GRAPH mode compiles a Cell from its source file, so the script runs from a file, not ``-c``."""
    runner = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
    out = run_py(runner, str(script), mode, str(seed)).stdout.strip().splitlines()[-1]
    return json.loads(out)


class Record(Callback):
    def __init__(self):
        super().__init__()
        self.losses = []

    def on_train_step_end(self, run_context):
        self.losses.append(float(run_context.original_args().get("net_outputs").asnumpy()))


class Mlp(nn.Cell):
    def __init__(self, dropout=None):
        super().__init__()
        self.fc1 = nn.Dense(4, 16)
        self.drop = dropout if dropout is not None else nn.Identity()
        self.fc2 = nn.Dense(16, 1)

    def construct(self, x):
        return self.fc2(self.drop(self.fc1(x)))


def _data(shuffle=False):
    rng = np.random.RandomState(5)
    x = rng.rand(16, 4).astype(np.float32)
    return ds.NumpySlicesDataset((x, x.sum(1, keepdims=True)), column_names=["x", "y"], shuffle=shuffle).batch(4)


def _train(net, callbacks=(), epochs=2, data=None):
    record = Record()
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05)).train(
        epochs, data if data is not None else _data(), callbacks=[*callbacks, record], dataset_sink_mode=False)
    return record.losses


@pytest.fixture
def quiet_seed(monkeypatch):
    """fix_randomness in this process without leaking what it sets: PYTHONHASHSEED restored after the test,
    deterministic mode left alone (it can be set once per process and would outlive the test)."""
    monkeypatch.setenv("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED", "0"))
    monkeypatch.setattr(_seed, "_FIXED_SEED", _seed._FIXED_SEED)
    return lambda seed: mindguard.fix_randomness(seed, deterministic=False)


# ------------------------------------------------------------------------ bit-identical runs (2 processes)

def test_two_processes_repeat_bit_for_bit_only_with_fix_randomness_and_reproducible(run_py, tmp_path):
    script = tmp_path / "train.py"
    script.write_text(TRAIN_SCRIPT)
    runs = [("fixed", 7), ("fixed", 7), ("fixed", 8), ("free", 0), ("free", 0)]
    with ThreadPoolExecutor(max_workers=2) as pool:   # independent processes; two at a time saves wall time
        first, second, other_seed, free_1, free_2 = pool.map(lambda r: _train_in_child(run_py, script, *r), runs)
    assert len(first["losses"]) == 8, first          # 2 epochs x 4 batches
    if reproduce._repeats_dropout(ms.__version__):
        assert first["losses"] == second["losses"], (first["losses"], second["losses"])
        assert first["warnings"] == [] and second["warnings"] == [], first["warnings"]
    else:   # MindSpore 2.7: dropout reruns diverge (not every time); Reproducible must say so in every run
        for run in (first, second, other_seed):
            assert len(run["warnings"]) == 1, run["warnings"]
            for expected in (f"installed MindSpore {ms.__version__} does not repeat dropout",
                             "network._backbone.drop", "upgrade to MindSpore >= 2.8"):
                assert expected in run["warnings"][0], run["warnings"][0]
    assert other_seed["losses"] != first["losses"], "another seed must give other losses"
    assert free_1["losses"] != free_2["losses"], ("without mindguard the runs should differ", free_1, free_2)
    assert free_1["losses"] != first["losses"]


# ------------------------------------------------------------------------------- fix_randomness

def test_fix_randomness_sets_everything_and_can_be_called_twice(run_py):
    code = r"""
    import json, logging, os, random
    import numpy as np, mindspore as ms, mindspore.dataset as ds
    import mindguard.training.reproduce
    records = []
    handler = logging.Handler(); handler.emit = records.append
    logging.getLogger("mindguard").addHandler(handler); logging.getLogger("mindguard").setLevel(logging.INFO)
    first = mindguard.fix_randomness(11, cpu_single_thread=True)
    draws = (random.random(), float(np.random.rand()))
    second = mindguard.fix_randomness(11, cpu_single_thread=True)   # once-per-process settings: no crash
    again = (random.random(), float(np.random.rand()))
    third = mindguard.fix_randomness(12)
    print(json.dumps({"first": first, "second": second, "third": third, "same_draws": draws == again,
                      "ds_seed": ds.config.get_seed(), "ms_seed": ms.get_seed(),
                      "hashseed": os.environ.get("PYTHONHASHSEED"), "deterministic": ms.get_context("deterministic"),
                      "current": mindguard.training.reproduce.current_seed(),
                      "logged": [r.getMessage() for r in records if r.levelno == logging.INFO]}))
    """
    result = json.loads(run_py(code).stdout.strip().splitlines()[-1])
    assert result["first"] == {"seed": 11, "random": 11, "numpy": 11, "mindspore": 11, "dataset": 11,
                               "PYTHONHASHSEED": "11", "deterministic": True, "cpu_threads": 1}, result["first"]
    assert result["second"]["deterministic"] is True and result["second"]["cpu_threads"] == 1, result["second"]
    assert result["same_draws"], "re-seeding must repeat the random draws"
    assert (result["ds_seed"], result["ms_seed"], result["hashseed"], result["current"]) == (12, 12, "12", 12), result
    assert result["deterministic"] == "ON", result
    assert result["third"]["cpu_threads"] is None
    assert any("fix_randomness" in m and "'seed': 11" in m for m in result["logged"]), result["logged"]


@pytest.mark.parametrize("seed, error, message", [
    ("0", TypeError, "must be an int"), (1.5, TypeError, "got float"), (True, TypeError, "got bool"),
    (None, TypeError, "got NoneType"), (-1, ValueError, r"\[0, 2\*\*32\)"), (2 ** 32, ValueError, r"seed % 2\*\*32"),
])
def test_fix_randomness_rejects_bad_seeds_before_touching_anything(seed, error, message):
    before = reproduce.current_seed()
    with pytest.raises(error, match=message):
        mindguard.fix_randomness(seed)
    with pytest.raises(TypeError, match="cpu_single_thread"):
        mindguard.fix_randomness(0, cpu_single_thread="yes")
    assert reproduce.current_seed() == before


# -------------------------------------------------------------------------- save_params / load_params

class Odd(nn.Cell):
    """Parameter names that are unsafe as file names."""

    def __init__(self):
        super().__init__()
        self.a = Parameter(Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), name="../../etc/passwd")
        self.b = Parameter(Tensor(np.ones(2, np.float16)), name="a b:c*?<>|\\d")
        self.c = Parameter(Tensor(np.array([3], np.int32)), name="x" * 300)

    def construct(self, x):
        return x


def test_save_load_roundtrip_manifest_and_safe_file_names(tmp_path):
    net = Odd()
    manifest_path = mindguard.training.reproduce.save_params(net, tmp_path / "p")
    manifest = json.loads(manifest_path.read_text())
    names = [e["name"] for e in manifest["parameters"]]
    assert names == ["../../etc/passwd", "a b:c*?<>|\\d", "x" * 300], names
    assert sorted(os.listdir(tmp_path)) == ["p"], os.listdir(tmp_path)   # nothing escaped the directory
    for entry in manifest["parameters"]:
        path = tmp_path / "p" / entry["file"]
        assert path.parent == tmp_path / "p" and len(entry["file"]) < 120, entry["file"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"]
    assert [(e["shape"], e["dtype"]) for e in manifest["parameters"]] == [([2, 3], "float32"), ([2], "float16"),
                                                                           ([1], "int32")]
    original = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    for p in net.get_parameters():
        p.set_data(Tensor(np.zeros(p.shape, p.asnumpy().dtype)))
    assert mindguard.training.reproduce.load_params(net, tmp_path / "p") == names
    for p in net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), original[p.name], err_msg=p.name)
        assert p.asnumpy().dtype == original[p.name].dtype


def test_save_refuses_to_overwrite_a_different_save_unless_asked(tmp_path):
    mindguard.training.reproduce.save_params(Mlp(), tmp_path)
    first = sorted(os.listdir(tmp_path))
    other = Mlp()
    with pytest.raises(mindguard.errors.ArgumentError, match=r"different parameters .*fc1.weight.*overwrite=True"):
        mindguard.training.reproduce.save_params(other, tmp_path)
    assert sorted(os.listdir(tmp_path)) == first
    mindguard.training.reproduce.save_params(other, tmp_path, overwrite=True)
    mindguard.training.reproduce.save_params(other, tmp_path)  # identical content: a no-op, no error
    fresh = Mlp()
    mindguard.training.reproduce.load_params(fresh, tmp_path)
    np.testing.assert_array_equal(fresh.fc1.weight.asnumpy(), other.fc1.weight.asnumpy())
    mindguard.training.reproduce.save_params(Odd(), tmp_path, overwrite=True)
    assert len(os.listdir(tmp_path)) == 4, os.listdir(tmp_path)   # 3 params + manifest; stale files removed


def test_load_strict_names_every_missing_extra_and_mismatched_parameter(tmp_path):
    class Other(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Dense(4, 8)                         # fc1.weight: other shape
            self.head = nn.Dense(8, 1)
            self.fc2 = nn.Dense(16, 1).to_float(ms.float32)
            self.fc2.bias = Parameter(Tensor(np.zeros(1, np.float16)), name="fc2.bias")  # other dtype

        def construct(self, x):
            return x

    mindguard.training.reproduce.save_params(Mlp(), tmp_path)
    net = Other()
    before = {p.name: p.asnumpy().copy() for p in net.get_parameters()}
    with pytest.raises(ParamsMismatchError) as err:
        mindguard.training.reproduce.load_params(net, tmp_path)
    text = str(err.value)
    for expected in ("missing from the directory: ['head.weight', 'head.bias']",
                     "'fc1.weight': saved float32[16, 4], network has float32[8, 4]",
                     "'fc2.bias': saved float32[1], network has float16[1]",
                     "'fc1.bias': saved float32[16], network has float32[8]"):
        assert expected in text, text
    for p in net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), before[p.name], err_msg=f"{p.name} changed by a failed load")

    small = nn.SequentialCell([nn.Dense(4, 16)])
    with pytest.raises(ParamsMismatchError, match=r"in the directory but not in the network: \['fc1.weight', "
                                                  r"'fc1.bias', "
                                                  r"'fc2.weight', 'fc2.bias'\]"):
        mindguard.training.reproduce.load_params(small, tmp_path)


def test_load_rejects_modified_files_and_pickles(tmp_path):
    mindguard.training.reproduce.save_params(Mlp(), tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    entry = manifest["parameters"][0]
    np.save(tmp_path / entry["file"], np.zeros(entry["shape"], np.float32))
    net = Mlp()
    before = net.fc1.weight.asnumpy().copy()
    with pytest.raises(ParamsMismatchError, match=r"checksum mismatch for parameter 'fc1.weight'"):
        mindguard.training.reproduce.load_params(net, tmp_path)
    np.testing.assert_array_equal(net.fc1.weight.asnumpy(), before)

    np.save(tmp_path / entry["file"], np.array([{"evil": 1}] * 2, dtype=object), allow_pickle=True)
    entry["sha256"] = hashlib.sha256((tmp_path / entry["file"]).read_bytes()).hexdigest()
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ValueError, match="allow_pickle=False"):
        mindguard.training.reproduce.load_params(net, tmp_path)

    entry["file"] = "../outside.npy"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ParamsMismatchError, match="which save_params never writes"):
        mindguard.training.reproduce.load_params(net, tmp_path)


def test_bad_paths_and_types(tmp_path):
    blocker = tmp_path / "file.txt"
    blocker.write_text("user data\n")
    with pytest.raises(mindguard.errors.ArgumentError, match=r"file.txt/sub.* is not writable.*choose a directory"):
        mindguard.training.reproduce.save_params(Mlp(), blocker / "sub")
    assert blocker.read_text() == "user data\n" and sorted(os.listdir(tmp_path)) == ["file.txt"]
    with pytest.raises(mindguard.errors.ParamsMismatchError,
                       match=r"no manifest.json in .*save parameters there first"):
        mindguard.training.reproduce.load_params(Mlp(), tmp_path)
    with pytest.raises(TypeError, match="needs a mindspore.nn.Cell, got dict"):
        mindguard.training.reproduce.save_params({}, tmp_path)
    with pytest.raises(TypeError, match="needs a mindspore.nn.Cell, got str"):
        mindguard.training.reproduce.load_params("net", tmp_path)
    with pytest.raises(TypeError, match=r"directory=...\) must be a non-empty path"):
        mindguard.training.reproduce.save_params(Mlp(), 3)
    with pytest.raises(TypeError, match=r"directory=...\) must be a non-empty path"):
        mindguard.training.reproduce.load_params(Mlp(), "")


# ----------------------------------------------------------------------------------- Reproducible

def test_init_params_dir_makes_runs_with_different_seeds_identical(graph_mode, quiet_seed, tmp_path):
    quiet_seed(1)
    first_cb = mindguard.training.reproduce.Reproducible(init_params_dir=tmp_path / "init")
    first = _train(Mlp(), [first_cb])
    quiet_seed(2)
    second_cb = mindguard.training.reproduce.Reproducible(init_params_dir=tmp_path / "init")
    second = _train(Mlp(), [second_cb])
    quiet_seed(2)
    control = _train(Mlp())
    assert (first_cb.params_action, second_cb.params_action) == ("saved", "loaded")
    assert len(first) == 8 and first == second, (first, second)
    assert control != first, "seed 2 without the saved initial params must train differently"


def test_init_params_dir_of_another_network_stops_before_step_one(graph_mode, quiet_seed, tmp_path):
    quiet_seed(0)
    mindguard.training.reproduce.save_params(nn.Dense(4, 1), tmp_path)
    record = Record()
    net = Mlp()
    with pytest.raises(ParamsMismatchError, match=r"missing from the directory: \['fc1.weight'"):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05)).train(
            1, _data(), callbacks=[mindguard.training.reproduce.Reproducible(init_params_dir=tmp_path), record],
            dataset_sink_mode=False)
    assert record.losses == []


def test_disable_dropout_takes_effect_before_compile(ms_mode, quiet_seed):
    quiet_seed(3)
    with_dropout = _train(Mlp(nn.Dropout(p=0.9)))
    quiet_seed(3)
    callback = mindguard.training.reproduce.Reproducible(disable_dropout=True)
    net = Mlp(nn.Dropout(p=0.9))
    user_cell = net.drop
    disabled = _train(net, [callback])
    quiet_seed(3)
    no_dropout = _train(Mlp(nn.Identity()))
    assert callback.replaced_dropout == ["network._backbone.drop"], callback.replaced_dropout
    assert net.drop is user_cell, (ms_mode, "the user's dropout cell must be back after training", net.drop)
    assert disabled == no_dropout, (ms_mode, disabled, no_dropout)
    assert disabled != with_dropout, (ms_mode, "p=0.9 dropout must change the losses")


def test_shuffling_ops_names_each_shuffling_operation():
    def gen():
        yield (np.zeros(1, np.float32),)

    class Indexable:
        def __getitem__(self, i):
            return (np.full(1, i, np.float32),)

        def __len__(self):
            return 4

    arr = np.arange(8, dtype=np.float32)
    assert shuffling_ops(ds.NumpySlicesDataset(arr, shuffle=False).batch(2)) == []
    assert shuffling_ops(ds.GeneratorDataset(gen, ["x"])) == []      # iterable source: order is the generator's
    assert shuffling_ops(ds.GeneratorDataset(Indexable(), ["x"], shuffle=False)) == []
    assert shuffling_ops(ds.NumpySlicesDataset(arr).batch(2)) == [
        "NumpySlicesDataset (sampler=RandomSampler; pass shuffle=False to keep the order)"]
    assert shuffling_ops(ds.GeneratorDataset(Indexable(), ["x"]).shuffle(4).batch(2)) == [
        "ShuffleDataset (.shuffle(buffer_size=4))",
        "GeneratorDataset (sampler=RandomSampler; pass shuffle=False to keep the order)"]
    assert shuffling_ops(ds.GeneratorDataset(Indexable(), ["x"], num_shards=2, shard_id=0, shuffle=True)) == [
        "GeneratorDataset (sampler=DistributedSampler; pass shuffle=False to keep the order)"]


def test_unseeded_shuffle_and_missing_seed_are_reported_before_training(run_py):
    code = r"""
    import json, warnings
    import numpy as np, mindspore as ms, mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, Model
    import mindguard.training.reproduce
    from mindguard.errors import ReproducibilityError
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    steps = []
    class Count(Callback):
        def on_train_step_end(self, run_context):
            steps.append(1)
    x = np.ones((8, 2), np.float32)
    def train(callback, shuffle):
        data = ds.NumpySlicesDataset((x, x), column_names=["x", "y"], shuffle=False)
        data = (data.shuffle(8) if shuffle else data).batch(4)
        net = nn.Dense(2, 2)
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params())).train(1, data, callbacks=[callback, Count()],
                                                                       dataset_sink_mode=False)
    out = {}
    Reproducible = mindguard.training.reproduce.Reproducible
    for name, callback, shuffle in [("shuffle_raise", Reproducible(check_shuffle="raise", check_seed="ignore"), True),
                                    ("seed_raise", Reproducible(check_seed="raise"), False)]:
        try:
            train(callback, shuffle); out[name] = None
        except ReproducibilityError as exc:
            out[name] = str(exc)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(mindguard.training.reproduce.Reproducible(), True)
        out["default_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(mindguard.training.reproduce.Reproducible(check_shuffle="ignore", check_seed="ignore"), True)
        out["ignored"] = [str(w.message) for w in caught if "ReproducibilityWarning" in w.category.__name__]
    mindguard.fix_randomness(0, deterministic=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        train(Reproducible(check_shuffle="raise", check_seed="raise"), True)   # seeded: order repeats
        out["seeded"] = [str(w.message) for w in caught if "ReproducibilityWarning" in w.category.__name__]
    out["steps"] = len(steps)
    print(json.dumps(out))
    """
    out = json.loads(run_py(code).stdout.strip().splitlines()[-1])
    assert "ShuffleDataset (.shuffle(buffer_size=8))" in out["shuffle_raise"], out
    assert "check_shuffle='raise'" in out["shuffle_raise"]
    assert "fix_randomness(seed) was not called" in out["seed_raise"], out
    warned = out["default_warnings"]
    assert len(warned) == 2 and all(w.startswith("ReproducibilityWarning") for w in warned), warned
    assert "fix_randomness(seed) was not called" in warned[0] and "ShuffleDataset" in warned[1], warned
    assert out["ignored"] == [] and out["seeded"] == [], out
    assert out["steps"] == 3 * 2, out      # the two raising runs stopped before step 1; 3 runs x 2 steps trained


def test_dropout_repeats_from_mindspore_2_8():
    assert [reproduce._repeats_dropout(v) for v in ("2.7.0", "2.7.1.post1", "2.7.2", "2.6.0")] == [False] * 4
    assert [reproduce._repeats_dropout(v) for v in ("2.8.0", "2.10.0", "2.10.0rc1", "3.0.0")] == [True] * 4


@pytest.mark.skipif(reproduce._repeats_dropout(ms.__version__),
                    reason=f"MindSpore {ms.__version__} repeats dropout; the refusal is for 2.7 only")
def test_strict_reproducible_refuses_dropout_on_mindspore_2_7(graph_mode, quiet_seed):
    quiet_seed(4)
    record = Record()
    net = Mlp(nn.Dropout(p=0.5))
    with pytest.raises(reproduce.ReproducibilityError, match=rf"MindSpore {ms.__version__} does not repeat dropout "
                                                             rf"\(network._backbone.drop\).*>= 2.8"):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05)).train(
            1, _data(), callbacks=[mindguard.Reproducible(check_seed="raise"), record], dataset_sink_mode=False)
    assert record.losses == []
    with pytest.warns(reproduce.ReproducibilityWarning, match="upgrade to MindSpore >= 2.8"):
        assert len(_train(Mlp(nn.Dropout(p=0.5)), [mindguard.Reproducible()], epochs=1)) == 4
    callback = mindguard.Reproducible(check_seed="raise", disable_dropout=True)   # the other fix: no dropout
    assert len(_train(Mlp(nn.Dropout(p=0.5)), [callback], epochs=1)) == 4


def test_reproducible_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"check_shuffle='maybe'.*\['warn', 'raise', 'ignore'\]"):
        mindguard.training.reproduce.Reproducible(check_shuffle="maybe")
    with pytest.raises(ValueError, match=r"check_seed='no'"):
        mindguard.training.reproduce.Reproducible(check_seed="no")
    with pytest.raises(TypeError, match="disable_dropout=...\\) must be True or False"):
        mindguard.training.reproduce.Reproducible(disable_dropout="yes")
    with pytest.raises(TypeError, match="init_params_dir=...\\) must be None or a path"):
        mindguard.training.reproduce.Reproducible(init_params_dir=5)
