"""What a kept training state holds and what keeping it costs (mindguard.training.state.resume, issues 38 and 39), on
real MindSpore Parameters: the random state restored with the Parameters, the write to disk in a thread of its own
(the failure's write waits for it), and no host copy beyond the memory rule."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest

ms = pytest.importorskip("mindspore")

from mindguard.training.state import keeper as keeper_module, resume as _resume, state_writer  # noqa: E402
from mindguard.protocol import folder as layout  # noqa: E402
from mindguard._util.io import file_sha256  # noqa: E402


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
    writer = keeper.writer.thread
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
    """On CPU such a state is written from the Parameters' own memory instead, on its rules (the first write no sooner
    than 30 s of training: none in this test); Parameters numpy cannot view (bfloat16) are not written at all."""
    monkeypatch.setattr(keeper_module, "MAX_EXTRA_MEMORY", 1e-9)   # any state is then more than the rule allows
    keeper = _resume.StateKeeper(tmp_path, on_disk=True)
    assert keeper.due(2)
    keeper.keep(2, _params())
    schedule = keeper.schedule
    assert not keeper.kept and schedule.streaming and not schedule.refused_for_memory and not keeper.due(3)
    err = capsys.readouterr().err
    assert "not keeping the training state (0.00 GB) in memory: more than 0% of the training process's" in err
    assert "writing it to disk straight from the Parameters instead" in err
    assert keeper.write(5) is None and not list(tmp_path.iterdir())

    keeper = _resume.StateKeeper(tmp_path / "bf16", on_disk=True)
    bf16 = ms.Parameter(ms.Tensor(np.zeros((4, 4), np.float32), ms.bfloat16), name="bf16")
    keeper.keep(2, _params() + [bf16])
    schedule = keeper.schedule
    assert not keeper.kept and not schedule.streaming and schedule.refused_for_memory and not keeper.due(3)
    err = capsys.readouterr().err
    assert "resumes from the training's own checkpoints (ModelCheckpoint)" in err, err
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
    state as the iterated pipeline left it (mindguard.training.state.dataset_skip.python_pipeline_live)."""
    import mindspore.dataset as ds

    from mindguard.training.state.dataset_skip import _python_stage

    slices = ds.NumpySlicesDataset({"x": np.ones((4, 2), np.float32)}, shuffle=True)
    assert _python_stage(slices.batch(2)) is None                                  # MindSpore's own source
    assert _python_stage(slices.map(ds.transforms.TypeCast(ms.float32)).batch(2)) is None
    assert _python_stage(slices.map(_jitter).batch(2)) == "map(_jitter)"
    assert _python_stage(slices.map(ds.transforms.RandomApply([_jitter])).batch(2)) == "map(RandomApply)"
    assert _python_stage(ds.GeneratorDataset(_Rows(), ["x"]).batch(2)) == "GeneratorDataset(_Rows)"


def test_a_state_written_from_the_parameters_holds_their_values_at_its_step(tmp_path, monkeypatch):
    """The file holds the values as the step began (written before the step may change them), its json follows from
    the thread with the state's checksum, and at a failure the json is written again with the trace since."""
    monkeypatch.setattr(keeper_module, "MAX_EXTRA_MEMORY", 1e-9)
    params = _params()
    keeper = _resume.StateKeeper(tmp_path, on_disk=True, disk_seconds=0.0, budget=1.0)
    keeper.keep(2, params)   # the first: found too big, written from the Parameters from now on -- this one too, as
    # the run's first resume point (issue 51)
    assert keeper.schedule.streaming and layout.state_arrays(layout.kept_step(tmp_path, 2)).is_file()
    keeper.writer.join()
    time.sleep(2 * keeper.schedule.write_seconds + 0.01)   # a step's time: the write's own (budget 1.0) passed
    assert keeper.due(3)
    keeper.keep(3, params)
    np.copyto(params[0].asnumpy(), 7.0)   # the step changes the table (in place, as an optimizer does on CPU)
    keeper.note_trace(3, ["loss 3"])
    keeper.note_trace(4, ["loss 4"])
    written = keeper.write(4)
    assert written == layout.kept_step(tmp_path, 3), written
    meta = json.loads(layout.state_meta(written).read_text())
    assert meta["step"] == 3 and meta["written_from"] == "parameters" and meta["trace"] == {"3": ["loss 3"],
                                                                                           "4": ["loss 4"]}, meta
    assert meta["sha256"] == file_sha256(layout.state_arrays(written))
    with np.load(layout.state_arrays(written), allow_pickle=False) as arrays:
        assert np.array_equal(arrays["p0"], np.full((128, 64), 0.5, np.float32))
        assert float(arrays["p2"]) == np.float32(0.1)


def test_big_arrays_get_files_of_their_own_that_are_checked_and_resumed_from(tmp_path, monkeypatch):
    """Arrays of RAW_ARRAY_BYTES or more (16 MB; 1 KB here) are written as ``p<i>.npy`` of their own, raw (no zip
    checksum of every byte), each with its checksum in ``state.json``: a damaged or missing one is refused naming the
    file, and a resumed pass loads them (memory-mapped) into the Parameters, holding them as its first copy."""
    from mindguard.errors import HuntProtocolError
    from mindguard.training.state.resumer import Resumer, check_state

    monkeypatch.setattr(state_writer, "RAW_ARRAY_BYTES", 1024)
    params = _params()
    keeper = _resume.StateKeeper(tmp_path, every_steps=1)
    keeper.keep(2, params)
    written = keeper.write(2)
    assert written == tmp_path
    meta = json.loads(layout.state_meta(written).read_text())
    assert sorted(meta["files"]) == ["0", "1"], meta.get("files")   # the table and the moment; not the learning rate
    assert meta["files"]["0"]["sha256"] == file_sha256(layout.state_array_file(written, 0))
    with np.load(layout.state_arrays(written), allow_pickle=False) as arrays:
        assert "p0" not in arrays.files and "p2" in arrays.files, arrays.files
    assert np.array_equal(np.load(layout.state_array_file(written, 0)), np.full((128, 64), 0.5, np.float32))
    assert check_state(written) == (meta, None)

    np.copyto(params[0].asnumpy(), 3.0)   # the training moved on
    resumer = Resumer(written)
    resumer.load(params)
    assert np.array_equal(params[0].asnumpy(), np.full((128, 64), 0.5, np.float32))
    held = resumer.take_values()
    assert held is not None and held[0].flags.writeable and isinstance(held[0], np.memmap), type(held[0])
    keeper.keep(3, params, loaded=held)   # the keeper's first copy of the resumed step: the mapped arrays
    assert keeper.kept[3].arrays[0] is held[0]

    table = layout.state_array_file(written, 0)
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 0xFF
    table.write_bytes(bytes(data))
    found, why = check_state(written)
    assert found is None and why == (f"{table} is damaged or replaced (its checksum is not the one "
                                     f"{layout.state_meta(written)} names)"), why
    with pytest.raises(HuntProtocolError, match="p0.npy is damaged or replaced"):
        Resumer(written).load(params)
    table.unlink()
    assert check_state(written)[1] == f"{table} is missing (the write of the state was cut short?)"


def test_states_written_from_the_parameters_keep_the_last_two_and_free_the_oldest_first(tmp_path, monkeypatch):
    """The oldest folder is removed before a new state is written (the newest stays whole during the write), so the
    OS's cache pages it held take the new files; two complete states remain after each write."""
    monkeypatch.setattr(keeper_module, "MAX_EXTRA_MEMORY", 1e-9)
    params = _params()
    keeper = _resume.StateKeeper(tmp_path, on_disk=True, disk_seconds=0.0, budget=1.0)
    keeper.keep(2, params)
    keeper.writer.join()   # (a write in progress refuses the next state: the steps below would depend on timing)
    for step in (3, 5, 7):
        keeper.keep(step, params)
        assert layout.kept_step(tmp_path, step).is_dir() and len(list(tmp_path.glob("step-*"))) <= 2
        keeper.writer.join()
    assert sorted(p.name for p in tmp_path.glob("step-*")) == ["step-5", "step-7"]
    assert all(layout.state_meta(layout.kept_step(tmp_path, s)).is_file() for s in (5, 7))


def test_a_copy_kept_before_the_state_outgrew_memory_is_not_what_a_later_failure_resumes_from(tmp_path, monkeypatch):
    """A copy taken while it fitted (a smaller call's state, more memory then) is dropped when the state is written
    from the Parameters instead: at the failure the newest state written wins, complete on disk."""
    params = _params()
    keeper = _resume.StateKeeper(tmp_path, on_disk=True, disk_seconds=0.0, budget=1.0)
    keeper.keep(2, params)   # fits: a host copy, written by its thread
    assert list(keeper.kept) == [2]
    monkeypatch.setattr(keeper_module, "MAX_EXTRA_MEMORY", 1e-9)   # now it does not
    keeper.keep(5, params)
    assert keeper.schedule.streaming and not keeper.kept
    keeper.keep(6, params)
    written = keeper.write(7)
    assert written == layout.kept_step(tmp_path, 6), written
    assert json.loads(layout.state_meta(written).read_text())["written_from"] == "parameters"
