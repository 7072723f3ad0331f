"""How a training's script can end other than by a numerical failure, and what mindguard makes of it.

A script that ends itself (``sys.exit`` in a callback), a watch loop that ends without an end hook, an error of
the script's own code between two watched steps, a kill from outside, bad arguments found before training:
none of them is a failure of the training's numbers, so the hunt reports it and runs no second pass.
Real MindSpore (CPU), real trainings in subprocesses.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from hunting import explain, run_hunt, summary_of

MODEL_TRAIN = """
import os, signal, sys
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

how = sys.argv[1]

class EndAtStep3(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().get("cur_step_num") == 3:
            if how == "kill":
                os.kill(os.getpid(), signal.SIGTERM)   # as `kill <pid>` or a scheduler's preemption would
            sys.exit(0 if how == "exit0" else 5)

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(1, make_dataset(8, clean_epochs=10), callbacks=[mindguard.Guard(), EndAtStep3()], dataset_sink_mode=False)
"""


def hunt_script(tmp_path: Path, source: str, *args: str):
    script = tmp_path / "train.py"
    script.write_text(source)
    run = tmp_path / "run"
    return run_hunt(run, sys.executable, str(script), *args, cwd=tmp_path), run


@pytest.mark.parametrize("how,code,outcome", [("exit0", 0, "healthy"), ("exit5", 4, "command_failed"),
                                              ("kill", 4, "command_failed")])
def test_a_script_that_ends_itself_or_is_killed_is_not_hunted(tmp_path, how, code, outcome):
    proc, run = hunt_script(tmp_path, MODEL_TRAIN, how)
    assert proc.returncode == code, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == outcome, summary
    assert summary.get("command_returncode") == {"exit5": 5, "kill": 128 + 15}.get(how), summary   # kept, not exited
    assert not (run / "pass2").exists(), explain(proc)
    records = summary["pass1"]["records"]
    if how == "kill":
        assert "stopped by signal 15 (SIGTERM) from outside" in proc.stderr, explain(proc)
        assert records[0]["status"] == "running" and records[0]["global_step"] == 3, records
    else:
        assert records[0]["status"] == "finished" and records[0]["global_step"] == 3, records


WATCH_LOOP = """
import sys
import numpy as np
import mindspore as ms
from mindspore import nn
import mindguard

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = nn.Dense(4, 1)
optimizer = nn.SGD(net.trainable_params(), 0.01)
loss_fn = nn.MSELoss()
grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)

def train_step(x, y):
    loss, grads = grad_fn(x, y)
    optimizer(grads)
    return loss

train_step = mindguard.watch(train_step, net, optimizer)
config = {"lr": 0.01}
for step in range(1, 6):
    if sys.argv[1] == "between" and step == 4:
        print(config["warmup_steps"])   # the script's own bug, between two steps
    train_step(ms.Tensor(np.ones((2, 4), np.float32)), ms.Tensor(np.zeros((2, 1), np.float32)))
"""


def test_a_healthy_watch_loop_is_recorded_finished(tmp_path):
    proc, run = hunt_script(tmp_path, WATCH_LOOP, "healthy")
    assert proc.returncode == 0, explain(proc)
    record = summary_of(run)["pass1"]["records"][0]
    assert (record["status"], record["global_step"]) == ("finished", 5), record


def test_an_error_between_watched_steps_is_not_blamed_on_the_last_step(tmp_path):
    proc, run = hunt_script(tmp_path, WATCH_LOOP, "between")
    assert proc.returncode == 4, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "command_failed", summary
    assert not (run / "pass2").exists(), explain(proc)
    assert "KeyError: 'warmup_steps'" in proc.stderr, explain(proc)


NOT_COMPILING = """
import mindspore as ms
from mindspore import nn, ops
from mindspore.train import Model
import mindguard
from mindguard.demos.norm_nan import make_dataset

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 1)

    def construct(self, x):
        return self.dense(x) * ops.reduce_sum(x * x, -1, keep_dims=True)   # BUG: no such argument

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = Net()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(1, make_dataset(8, clean_epochs=10), callbacks=[mindguard.Guard()], dataset_sink_mode=False)
"""


def test_a_network_that_does_not_compile_is_the_scripts_error_not_a_failure_to_dump(tmp_path):
    """MindSpore's graph compiler raising at step 1 (the step never ran): recorded as the script's error, with
    MindSpore's message (which names the line); the hunt says so after pass 1 and exits 4, dumping nothing."""
    proc, run = hunt_script(tmp_path, NOT_COMPILING)
    assert proc.returncode == 4, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "command_failed", summary
    record = summary["pass1"]["records"][0]
    assert (record["kind"], record["phase"], record["global_step"]) == ("exception", "script", 1), record
    assert "[raised compiling the network: an error of the script's code, before the step ran" in record["message"]
    assert "train.py:14" in record["message"], record["message"]   # MindSpore's own trace of the construct line
    assert "not of the training's numbers: nothing to dump" in proc.stderr, explain(proc)
    assert not any(run.glob("pass2*")), sorted(p.name for p in run.iterdir())


def test_watch_with_update_flag_refuses_a_step_that_returns_no_flag(run_py):
    proc = run_py("""
        import numpy as np
        import mindspore as ms
        from mindspore import nn
        import mindguard
        ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
        net = nn.Dense(2, 1)
        step = mindguard.watch(lambda x: net(x).sum(), net, update_flag="applied")
        try:
            step(ms.Tensor(np.ones((1, 2), np.float32)))
        except mindguard.errors.ArgumentTypeError as exc:
            print("refused:", exc)
        """)
    assert "refused: mindguard.watch(update_flag='applied'): train_step must return (loss, flag)" in proc.stdout, \
        proc.stdout + proc.stderr
    assert "it returned a Tensor" in proc.stdout


def test_a_record_path_under_a_file_is_refused_at_construction(tmp_path, monkeypatch):
    import mindguard
    from mindguard.errors import ArgumentError

    monkeypatch.delenv("MINDGUARD_RECORD", raising=False)
    monkeypatch.delenv("MINDGUARD_HUNT_PASS", raising=False)
    (tmp_path / "afile").write_text("not a folder")
    with pytest.raises(ArgumentError, match="is a file, so the record cannot be written under it"):
        mindguard.Guard(record=str(tmp_path / "afile" / "record.json"))


def test_init_params_dir_with_foreign_npy_files_is_refused_before_training(tmp_path, run_py):
    import numpy as np

    folder = tmp_path / "weights"
    folder.mkdir()
    np.save(folder / "weight.npy", np.full((1, 4), 7.0, np.float32))
    proc = run_py(f"""
        import mindspore as ms
        from mindspore import nn
        from mindspore.train import Model
        import mindguard
        from mindguard.demos.norm_nan import build_network, make_dataset
        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        mindguard.fix_randomness(1)
        net = build_network()
        model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
        try:
            model.train(1, make_dataset(8), callbacks=[mindguard.Guard(init_params_dir={str(folder)!r})],
                        dataset_sink_mode=False)
        except mindguard.errors.ParamsMismatchError as exc:
            print("refused:", exc)
        """)
    assert "holds .npy files (weight.npy) but no manifest.json" in proc.stdout, proc.stdout + proc.stderr
    assert sorted(p.name for p in folder.iterdir()) == ["weight.npy"]   # nothing saved beside it


def test_files_mindguard_writes_get_the_umask_mode(tmp_path):
    from mindguard._util.io import atomic_write_json

    previous = os.umask(0o022)
    try:
        atomic_write_json(tmp_path / "record.json", {"a": 1})
    finally:
        os.umask(previous)
    mode = stat.S_IMODE((tmp_path / "record.json").stat().st_mode)
    assert mode == 0o666 & ~previous, oct(mode)
    assert json.loads((tmp_path / "record.json").read_text()) == {"a": 1}


def test_replay_refuses_a_wrong_capture_folder_before_running_the_users_module(tmp_path):
    module = tmp_path / "netmod.py"
    module.write_text("print('USER MODULE RAN')\ndef net():\n    print('FACTORY CALLED')\n")
    proc = subprocess.run([sys.executable, "-m", "mindguard", "replay", str(tmp_path / "missing"), "--net",
                           f"{module}:net"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, explain(proc)
    assert "is not a mindguard step capture" in proc.stderr, explain(proc)
    assert "USER MODULE RAN" not in proc.stdout and "FACTORY CALLED" not in proc.stdout, explain(proc)


def test_only_an_error_raised_compiling_the_network_is_taken_for_the_scripts():
    """On real MindSpore exceptions: a graph that does not compile (innermost frame: MindSpore's ``compile``) is the
    script's error once a step began -- on a device only before any step ended, since a kernel's error may surface at
    a later call --; a kernel that fails as it runs (``_exec_pip``) stays the step's; before any step, the rule for
    that applies."""
    ms = pytest.importorskip("mindspore")
    import numpy as np
    from mindspore import nn, ops

    from mindguard.training.record.classify import RunFacts, classify_exception, compiling_the_network

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

    class NotCompiling(nn.Cell):
        def construct(self, x):
            return ops.reduce_sum(x * x, -1, keep_dims=True)

    class OutOfRange(nn.Cell):
        def construct(self, table, index):
            return ops.gather(table, index, 0)

    def raised(call):
        with pytest.raises(Exception) as info:
            call()
        return info.value

    compile_error = raised(lambda: NotCompiling()(ms.Tensor(np.ones((2, 4), np.float32))))
    kernel_error = raised(lambda: OutOfRange()(ms.Tensor(np.ones((3, 2), np.float32)),
                                              ms.Tensor(np.array([5], np.int32))))
    assert compiling_the_network(compile_error) and not compiling_the_network(kernel_error)

    def phase(exc, **facts):
        return classify_exception(type(exc), exc, RunFacts(any_call=True, **facts)).phase

    assert phase(compile_error, any_step=True, step_under_way=True) == "script"
    assert phase(compile_error, any_step=True, step_under_way=True, step_ended=True) == "script"   # CPU
    assert phase(compile_error, any_step=True, step_under_way=True, on_cpu=False) == "script"     # step 1
    assert phase(compile_error, any_step=True, step_under_way=True, step_ended=True, on_cpu=False) == "step"
    assert phase(kernel_error, any_step=True, step_under_way=True) == "step"
    assert phase(compile_error) is None   # before the first step: "failed before training"
