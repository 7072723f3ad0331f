"""What a kept training state holds and what keeping it costs (mindguard.training.resume, issues 38 and 39), on real
MindSpore Parameters: the random state restored with the Parameters, the write to disk in a thread of its own
(the failure's write waits for it), and no host copy beyond the memory rule."""
from __future__ import annotations

import json

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from mindguard.training import keeper as keeper_module, resume as _resume  # noqa: E402
from mindguard.protocol import folder as layout  # noqa: E402


def _params():
    return [ms.Parameter(ms.Tensor(np.full((128, 64), 0.5, np.float32)), name="table"),
            ms.Parameter(ms.Tensor(np.zeros((128, 64), np.float32)), name="moment"),
            ms.Parameter(ms.Tensor(np.array(0.1, np.float32)), name="learning_rate")]


def test_a_resumed_state_draws_again_what_the_run_drew_after_it(tmp_path, run_py):
    """In a fresh process (a test session's earlier datasets may leave a Python pipeline alive, and while one is, the
    numpy and Python generators are deliberately not restored): the state kept at step 2 holds the three generators,
    and a resumed process draws again exactly what the run drew after it."""
    proc = run_py(f"""
        import json, random
        import numpy as np
        import mindspore as ms
        from mindguard.training import resume as _resume
        from mindguard.protocol import folder as layout

        params = [ms.Parameter(ms.Tensor(np.full((128, 64), 0.5, np.float32)), name="table"),
                  ms.Parameter(ms.Tensor(np.array(0.1, np.float32)), name="learning_rate")]
        np.random.seed(5)
        random.seed(5)
        keeper = _resume.StateKeeper({str(tmp_path)!r}, steps=[2])
        keeper.keep(2, params)
        drawn = (np.random.normal(size=4).tolist(), random.random())   # what step 2 and later drew
        written = keeper.write(2)
        meta = json.loads(layout.state_meta(written).read_text())
        np.random.seed(123)   # the resumed process: other draws before the kept step
        random.seed(123)
        for param in params:
            ms.ops.assign(param, ms.ops.zeros_like(param))
        resumer = _resume.Resumer(written)
        resumer.load(params)
        print(json.dumps({{"rng": meta["rng"], "restored": resumer.random_restored,
                          "same": (np.random.normal(size=4).tolist(), random.random()) == drawn,
                          "table": float(params[0].asnumpy()[0, 0])}}))
        """)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["rng"]["numpy"]["kind"] == "MT19937" and "unrestorable" not in out["rng"], out
    assert out["restored"] == ["numpy", "python", "mindspore", "mindspore kernel seeds"], out
    assert out["same"] and out["table"] == 0.5, out


def test_an_on_disk_copy_is_written_by_a_thread_and_the_failure_waits_for_it(tmp_path):
    params = _params()
    keeper = _resume.StateKeeper(tmp_path, on_disk=True, disk_seconds=0.0)
    keeper.keep(2, params)   # the first state: copied now, written by the thread
    writer = keeper._writer
    assert writer is not None and writer.name == "mindguard-state-writer"
    if writer.is_alive():
        assert not keeper.due(3)   # no other copy over the buffers being written
    written = keeper.write(2)      # the failure: the thread's folder, complete
    assert written == layout.kept_step(tmp_path, 2) and not writer.is_alive()
    meta = json.loads(layout.state_meta(written).read_text())
    assert meta["step"] == 2 and meta["names"] == ["table", "moment", "learning_rate"]
    with np.load(layout.state_arrays(written), allow_pickle=False) as arrays:
        assert np.array_equal(arrays["p0"], np.full((128, 64), 0.5, np.float32))
        assert "rng_numpy_keys" in arrays.files


def test_a_state_beyond_the_memory_rule_is_not_copied_and_said_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(keeper_module, "MAX_EXTRA_MEMORY", 1e-9)   # any state is then more than the rule allows
    keeper = _resume.StateKeeper(tmp_path, on_disk=True)
    assert keeper.due(2)
    keeper.keep(2, _params())
    assert not keeper.kept and keeper.refused_for_memory and not keeper.due(3)
    err = capsys.readouterr().err
    assert "not keeping the training state (0.00 GB) in memory: more than 0% of the training process's" in err
    assert "resumes from the training's own checkpoints (ModelCheckpoint)" in err
    assert keeper.write(5) is None


def _jitter(x):
    return x + np.random.normal(0.0, 0.01, x.shape).astype(np.float32)


class _Rows:
    def __getitem__(self, index):
        return (np.full(2, index, np.float32),)

    def __len__(self):
        return 4


def test_the_python_stages_of_a_pipeline_are_found_where_they_draw():
    """A Python stage may draw from numpy's RNG in the pipeline's threads: the resumed pass then leaves numpy's
    state as the iterated pipeline left it (mindguard.training.dataset_skip.python_pipeline_live)."""
    import mindspore.dataset as ds

    from mindguard.training.dataset_skip import _python_stage

    slices = ds.NumpySlicesDataset({"x": np.ones((4, 2), np.float32)}, shuffle=True)
    assert _python_stage(slices.batch(2)) is None                                  # MindSpore's own source
    assert _python_stage(slices.map(ds.transforms.TypeCast(ms.float32)).batch(2)) is None
    assert _python_stage(slices.map(_jitter).batch(2)) == "map(_jitter)"
    assert _python_stage(slices.map(ds.transforms.RandomApply([_jitter])).batch(2)) == "map(RandomApply)"
    assert _python_stage(ds.GeneratorDataset(_Rows(), ["x"]).batch(2)) == "GeneratorDataset(_Rows)"
