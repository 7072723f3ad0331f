"""End-to-end: `mindguard hunt` on real training scripts, in real subprocesses, on CPU."""
from __future__ import annotations

import json
import re
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Sequence, Tuple

import pytest

from conftest import REPO
from hunting import explain, line_of, run_hunt, summary_of
from page_checks import check_in_browser

pytestmark = pytest.mark.slow

NORM_DEMO = REPO / "mindguard" / "demos" / "norm_nan.py"
LENET = REPO / "samples" / "lenet_guard.py"
CRASH = REPO / "samples" / "crash_out_of_range.py"




def hunt_source(tmp_path: Path, source: str, *args: str,
                options: Sequence[str] = ()) -> Tuple[subprocess.CompletedProcess, Path]:
    """Write ``source`` as a training script, hunt it (``options`` are the hunt's, ``args`` the script's);
    returns the hunt's process and its run folder."""
    script = tmp_path / "train.py"
    script.write_text(source)
    run = tmp_path / "run"
    return run_hunt(run, sys.executable, str(script), *args, options=options), run








def test_hunt_finds_sqrt_backward_of_norm_and_its_line(tmp_path):
    run = tmp_path / "run"
    proc = run_hunt(run, sys.executable, "-m", "mindguard.demos.norm_nan", "--epochs", "3")
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "failure_found", summary
    failure = summary["pass1"]["records"][0]
    # seed 1: parameters first go NaN at epoch 2, step 3 of 8 -> global step 11 -> dump iteration 10
    assert (failure["epoch"], failure["step_in_epoch"], failure["global_step"], failure["dump_iteration"]) == \
        (2, 3, 11, 10), failure
    assert failure["kind"] == "nonfinite_params", failure
    report = json.loads((run / "report.json").read_text())
    origin = report["origin"]
    assert origin is not None, report
    assert origin["op_type"] == "SqrtGrad" and origin["direction"] == "backward", origin
    # the demo module that ran: this checkout's, or -- where mindguard is installed and a hunt's pass imports it at
    # start-up (the attach hook) -- the installed copy of the same file
    ran = Path(origin["source"]["file"]).resolve()
    assert ran == NORM_DEMO.resolve() or (ran.parts[-3:] == NORM_DEMO.resolve().parts[-3:]
                                          and ran.read_text() == NORM_DEMO.read_text()), origin["source"]
    assert origin["source"]["line"] == line_of(NORM_DEMO, "return self.head(self.norm(self.embedding(tokens)))"), \
        origin["source"]
    assert any(s["zeros"] > 0 for s in origin["inputs"]), origin["inputs"]
    assert "SafeNorm" in origin["hint"], origin["hint"]
    # every artefact is in the run folder, and the culprit is printed for the user
    for name in ("command.json", "pass1/output.log", "pass1/failure.json", "pass2/output.log",
                 "pass2/failure.json", "report.json", "report.txt"):
        assert (run / name).exists(), \
            f"{name} missing from {sorted(str(p.relative_to(run)) for p in run.rglob('*'))[:40]}"
    assert list((run / "pass2" / "dump").rglob("*.npy")), "pass 2 dumped nothing"
    assert "SqrtGrad" in proc.stdout and "SafeNorm" in proc.stdout, explain(proc)
    # the narrow dump leaves the optimizer out on purpose, and the embedding table's file holds its value after
    # the step: neither may read as a problem or as an earlier non-finite op
    assert "cannot tell whether the step stopped early" not in proc.stdout, explain(proc)
    assert "first op touching a non-finite value" not in proc.stdout, explain(proc)
    # report.html: the page of the answer, its path printed; last, as it skips where no Chromium is installed
    assert f"report page: {run / 'report.html'}" in proc.stderr, explain(proc)
    check_in_browser(run, culprit_texts=["SqrtGrad", "+Inf 2", "zeros 0"],
                     source_line=f"norm_nan.py:{origin['source']['line']}")


def test_hunt_in_pynative_replays_the_step_and_names_the_norm_cell(tmp_path):
    """PyNative: MindSpore's dump holds only the jit-compiled optimizer, so pass 2 captures the failing
    step and replays it eagerly, cell by cell, inside the training process."""
    run = tmp_path / "run"
    proc = run_hunt(run, sys.executable, "-m", "mindguard.demos.norm_nan", "--mode", "pynative", "--epochs", "3")
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "failure_found", summary
    assert summary["pass1"]["records"][0]["dump_iteration"] == 10, summary["pass1"]
    first = json.loads((run / "pass2" / "replay.json").read_text())["first"]
    assert (first["cell"], first["cell_type"], first["direction"]) == ("norm", "Norm", "backward"), first
    assert first["source"]["line"] == line_of(NORM_DEMO, "return self.head(self.norm(self.embedding(tokens)))"), first
    assert any(s["zeros"] > 0 for s in first["inputs"]), first["inputs"]
    assert "SafeNorm" in first["hint"] and "SafeNorm" in proc.stdout, explain(proc)
    assert (run / "pass2" / "capture").is_dir()
    # the replay's page: the culprit drawn at its forward op's place, with the producers of the zero it read
    check_in_browser(run, culprit_texts=["SqrtGrad", "+Inf 2"], source_line=f"norm_nan.py:{first['source']['line']}")


def test_hunt_finds_log_of_zero_in_forward(tmp_path):
    run = tmp_path / "run"
    proc = run_hunt(run, sys.executable, str(LENET), "--epochs", "2")
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    failure = summary["pass1"]["records"][0]
    # the mis-scaled batch is global step 9 (epoch 2, step 3 of 6) -> dump iteration 8
    assert (failure["epoch"], failure["step_in_epoch"], failure["dump_iteration"]) == (2, 3, 8), failure
    origin = json.loads((run / "report.json").read_text())["origin"]
    assert origin["op_type"] == "Log" and origin["direction"] == "forward", origin
    assert origin["source"]["line"] == line_of(LENET, "log_probs = ops.log(ops.softmax(logits, axis=-1))"), \
        origin["source"]
    assert any(s["zeros"] > 0 for s in origin["inputs"]), origin["inputs"]


# a healthy hunt (exit 0, outcome healthy, no pass 2, the user's output passed through): tests/test_zoo_hunt.py's
# test_fit_healthy_exits_zero; the demo's SafeNorm fix holds in test_mindguard_demo_finds_the_culprit_and_...




# a GuardedTrainStep's refusal replayed in pass 1, no second pass: tests/test_zoo_hunt.py's
# test_per_epoch_loop_guard_model (and from a record: tests/test_from_run.py's locate-pass replay)


NON_REPRODUCIBLE = """
import os, sys
from pathlib import Path
import numpy as np, mindspore as ms
from mindspore import nn
from mindspore.train import Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

# Stands in for an unseeded shuffle, deterministically for the test: the batch that carries the
# padding moves between runs of the same command.
counter = Path(sys.argv[1])
runs = int(counter.read_text()) if counter.exists() else 0
counter.write_text(str(runs + 1))
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(2, make_dataset(4, poison_step=3 + 2 * runs), callbacks=[mindguard.Guard()], dataset_sink_mode=False)
"""


def test_non_reproducible_run_is_diagnosed_not_analysed(tmp_path):
    proc, run = hunt_source(tmp_path, NON_REPRODUCIBLE, str(tmp_path / "counter"))
    assert proc.returncode == 3, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "not_reproducible", summary
    assert "NOT REPRODUCIBLE" in proc.stderr and "fix_randomness" in proc.stderr, explain(proc)
    assert not (run / "report.json").exists()


def test_script_without_guard_is_told_what_hunt_needs(tmp_path):
    proc, run = hunt_source(tmp_path, "print('training without mindguard')\n")
    assert proc.returncode == 2, explain(proc)
    assert "mindguard.Guard()" in proc.stderr, explain(proc)
    assert "training without mindguard" in proc.stdout


def test_script_failing_before_training_keeps_its_exit_code_and_output(tmp_path):
    proc, run = hunt_source(tmp_path, "import sys\nprint('loading config')\nsys.exit('config.yaml: no such file')\n")
    assert proc.returncode == 2, explain(proc)
    assert "config.yaml: no such file" in proc.stderr and "exited with code 1" in proc.stderr, explain(proc)


def test_hunt_refuses_a_used_run_folder_and_an_empty_command(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "keep.txt").write_text("user data")
    proc = run_hunt(run, sys.executable, "-c", "pass")
    assert proc.returncode == 2 and "not empty" in proc.stderr, explain(proc)
    assert (run / "keep.txt").read_text() == "user data"
    proc = subprocess.run([sys.executable, "-m", "mindguard", "hunt"], capture_output=True, text=True)
    assert proc.returncode == 2 and "after `--`" in proc.stderr, explain(proc)


def test_ctrl_c_stops_the_child_and_exits_130(tmp_path):
    script = tmp_path / "slow.py"
    marker = tmp_path / "started"
    script.write_text(textwrap.dedent(f"""
        import time
        from pathlib import Path
        Path({str(marker)!r}).write_text("x")
        time.sleep(120)
    """))
    env = dict(os.environ, GLOG_v="3")
    hunt = subprocess.Popen([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(tmp_path / "run"), "--",
                             sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True,
                            # a suite started with Ctrl-C ignored (nohup, `cmd &`) must not pass SIG_IGN on:
                            # Python installs its KeyboardInterrupt handler only when SIGINT is not ignored
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert marker.exists(), "the child never started"
    os.killpg(hunt.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
    out, err = hunt.communicate(timeout=60)
    assert hunt.returncode == 130, f"exit {hunt.returncode}\n{err}"
    assert "interrupted" in err


def test_mindguard_demo_finds_the_culprit_and_verifies_the_fix(tmp_path):
    """The README's first command: the training fails with Guard in, the command Guard printed (hunt --from) finds
    SqrtGrad in the Norm at the exact step (11) without training again from step 1, prints the verify line, and
    `mindguard verify` runs the SafeNorm model from the same kept state through the failing steps: it holds."""
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "mindguard", "demo", "--run-dir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, explain(proc)
    hunted = summary_of(tmp_path / "demo" / "hunt")
    verdict = json.loads((tmp_path / "demo" / "verify" / "verify.json").read_text())
    assert hunted["outcome"] == "failure_found" and hunted["origin"]["op_type"] == "SqrtGrad", hunted
    assert hunted["from_record"]["route"] == "resume" and hunted["failure"]["global_step"] == 11, hunted
    assert not (tmp_path / "demo" / "hunt" / "pass1").exists()   # nothing trained again from step 1
    assert re.search(r"mindguard hunt --from \S+ -- ", proc.stderr), explain(proc)   # the line Guard printed
    assert "fix:    self.norm = mindguard.SafeNorm(axis=-1)" in proc.stdout, explain(proc)
    assert re.search(r"mindguard verify --from \S+mindguard_failure.json -- ", hunted["verify_command"]), \
        hunted["verify_command"]
    assert verdict["outcome"] == "holds" and verdict["kept_step"] > 1, verdict   # from the kept state
    assert min(int(s) for s in verdict["losses"]) == verdict["kept_step"]
    assert max(int(s) for s in verdict["losses"]) > hunted["failure"]["global_step"]   # through the failure
    assert "checked that the fix holds" in proc.stdout, explain(proc)


SLOW_TRAINING = """
import time
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

class Slow(Callback):
    def on_train_step_end(self, run_context):
        time.sleep(0.5)

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(100, make_dataset(8, clean_epochs=1000), callbacks=[mindguard.Guard(), Slow()], dataset_sink_mode=False)
"""


def test_a_pass_that_times_out_or_whose_hunt_is_killed_starts_no_second_pass(tmp_path):
    """Two hunts of the same slow training, run side by side (both mostly wait): one with ``--timeout 8`` is not
    hunted as a failure (timed_out, exit 2); the other's wrapper gets SIGTERM once the training reached step 2
    (interrupted, exit 130). Neither starts pass 2."""
    script = tmp_path / "slow_train.py"
    script.write_text(SLOW_TRAINING)
    env = dict(os.environ, GLOG_v="3")
    timed, killed = tmp_path / "timed", tmp_path / "killed"
    timing = subprocess.Popen([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(timed), "--timeout", "8",
                               "--", sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
    hunt = subprocess.Popen([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(killed), "--",
                             sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        record = killed / "pass1" / "failure.json"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if record.exists() and '"global_step": 2' in record.read_text():
                break
            time.sleep(0.2)
        else:
            hunt.kill()
            raise AssertionError(f"training never reached step 2: {hunt.communicate()[1][-3000:]}")
        hunt.send_signal(signal.SIGTERM)  # `kill <pid of hunt>`: only the wrapper gets the signal
        out, err = hunt.communicate(timeout=120)
        assert hunt.returncode == 130, f"exit {hunt.returncode}\n{err[-3000:]}"
        assert summary_of(killed)["outcome"] == "interrupted"
        assert not (killed / "pass2").exists()

        out, err = timing.communicate(timeout=300)
        proc = subprocess.CompletedProcess(timing.args, timing.returncode, out, err)
        assert proc.returncode == 2, explain(proc)
        summary = summary_of(timed)
        assert summary["outcome"] == "timed_out", summary
        assert not (timed / "pass2").exists(), "a timed-out pass 1 must not start pass 2"
    finally:
        for started in (timing, hunt):
            if started.poll() is None:
                started.kill()
                started.communicate()


def test_a_run_folder_mindspore_cannot_dump_into_is_refused_before_training(tmp_path):
    run = tmp_path / "my.runs" / "r1"
    proc = run_hunt(run, sys.executable, "-c", "print('must not run')")
    assert proc.returncode == 2, explain(proc)
    assert "contains '.'" in proc.stderr and "--run-dir" in proc.stderr, explain(proc)
    assert "must not run" not in proc.stdout and not run.exists()


def test_default_run_folder_moves_out_of_a_dotted_working_directory(tmp_path):
    cwd = tmp_path / "mindguard-0.1.0"
    cwd.mkdir()
    (tmp_path / "tmp").mkdir()
    proc = subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--", sys.executable, "-c", "print('hi')"],
                          capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=dict(os.environ, TMPDIR=str(tmp_path / "tmp")))
    assert "which MindSpore's dump refuses; using" in proc.stderr, explain(proc)
    assert not (cwd / "mindguard_runs").exists()
    assert list((tmp_path / "tmp" / "mindguard_runs").iterdir()), "no run folder in the temp directory"


CALLBACK_RAISES = """
import sys
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, LossMonitor, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

class BrokenLogger(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().get("cur_step_num") == 5:
            raise ConnectionError("metrics server unreachable")

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
order = sys.argv[1]
callbacks = {"guard_first": [mindguard.Guard(), BrokenLogger()], "guard_last": [BrokenLogger(), mindguard.Guard()],
             "lossmonitor_first": [LossMonitor(), mindguard.Guard(check_params=False)]}[order]   # NaN loss at 12
clean = 10 if order != "lossmonitor_first" else 1   # norm_nan: NaN loss from the second epoch's step 4 on
model.train(2, make_dataset(8, clean_epochs=clean), callbacks=callbacks, dataset_sink_mode=False)
"""


@pytest.mark.parametrize("order", ["guard_first", "guard_last"])
def test_a_callbacks_own_error_is_the_scripts_not_dumped(tmp_path, order):
    """A callback of the script's raises at step 5 on healthy numbers: the hunt says so, keeps the command's exit
    code in the summary, exits 4 (the command failed, not its training) and runs no second pass (before or after
    Guard in the callback list)."""
    proc, run = hunt_source(tmp_path, CALLBACK_RAISES, order)
    assert proc.returncode == 4, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "command_failed", summary
    record = summary["pass1"]["records"][0]
    assert (record["kind"], record["phase"], record["global_step"]) == ("exception", "script", 5), record
    assert "BrokenLogger.on_train_step_end" in record["message"] and "train.py:12" in record["message"], record
    assert "error of the script" in proc.stderr and "metrics server unreachable" in proc.stderr, explain(proc)
    assert not (run / "pass2").exists()


def test_a_nan_loss_that_lossmonitor_raises_on_first_is_recorded_as_nonfinite(tmp_path):
    """MindSpore's LossMonitor placed before Guard raises ValueError on the NaN loss before Guard's step end: the
    step is still checked, recorded as the non-finite step it is, and hunted."""
    proc, run = hunt_source(tmp_path, CALLBACK_RAISES, "lossmonitor_first")
    assert proc.returncode == 1, explain(proc)
    record = summary_of(run)["pass1"]["records"][0]
    assert (record["kind"], record["phase"], record["global_step"]) == ("nonfinite_loss", "step", 12), record
    # LossMonitor's ValueError, the training's own traceback: in pass 1's output.log, one line on the console (issue 52)
    log = (run / "pass1" / "output.log").read_text()
    assert "Invalid loss" in log or "NAN or INF" in log, log[-3000:]
    assert "NAN or INF" not in proc.stderr and "pass 1's own output (its traceback, " in proc.stderr, explain(proc)
    # with check_params=False the weights' NaN of step 11 is seen at step 12, in the step's inputs
    assert "already in the step's inputs" in proc.stdout and "embedding.embedding_table" in proc.stdout, explain(proc)


PARAMETER_CORRUPTED = """
import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

class Corrupt(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().get("cur_step_num") == 5:
            weight = net.trainable_params()[0]
            weight.set_data(ms.Tensor(np.full(weight.shape, np.nan, np.float32)))

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(2, make_dataset(8, clean_epochs=10), callbacks=[Corrupt(), mindguard.Guard()], dataset_sink_mode=False)
"""


def test_a_failure_the_dump_cannot_explain_is_reported_as_unexplained(tmp_path):
    """A Parameter overwritten with NaN outside the graph, after step 5 ran: the failure repeats in pass 2, but the
    step's dump is complete and finite -- the hunt must not claim it found the culprit."""
    proc, run = hunt_source(tmp_path, PARAMETER_CORRUPTED, options=["--resume", "never"])
    assert proc.returncode == 3, explain(proc)
    summary = summary_of(run)
    assert summary["outcome"] == "unexplained", summary
    record = summary["pass1"]["records"][0]
    assert (record["kind"], record["global_step"]) == ("nonfinite_params", 5), record
    assert "does not explain this failure" in proc.stderr, explain(proc)


def test_hunt_names_the_operator_a_crashed_step_stopped_in(tmp_path):
    """An exception inside the graph (CPU Gather on an out-of-range id, like Ascend's `run task error`):
    the dump of that step ends before the failing kernel, and the hunt names it, its line and the index."""
    run = tmp_path / "run"
    proc = run_hunt(run, sys.executable, str(CRASH))
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    failure = summary["pass1"]["records"][0]
    assert (failure["kind"], failure["global_step"], failure["dump_iteration"]) == ("exception", 6, 5), failure
    stopped = json.loads((run / "report.json").read_text())["stopped_at"]
    assert stopped["op"]["op_type"] == "Gather", stopped
    assert stopped["op"]["source"]["line"] == line_of(CRASH, "return self.head(self.embedding(tokens).mean(axis=1))")
    assert max(i["max"] for i in stopped["op"]["inputs"] if i.get("dtype") == "int32") == 12, stopped["op"]["inputs"]
    assert "out of range" in stopped["hint"] and "12" in stopped["hint"], stopped["hint"]
    assert "error: the step stopped in Gather" in proc.stdout, explain(proc)
    # the page highlights the crash point, with the index input whose max is 12
    check_in_browser(run, stop_texts=["Gather", "STEP STOPPED HERE", "max 12"],
                     source_line=f"crash_out_of_range.py:{stopped['op']['source']['line']}")


DETACHED_GRANDCHILD = """
import subprocess, sys, time
from pathlib import Path
# like msrun: a worker in a session of its own, out of reach of a signal to this process's group
# (its output goes elsewhere, as msrun's workers write to their own log files)
worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True,
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
Path(sys.argv[1]).write_text(str(worker.pid))
time.sleep(300)
"""


def test_a_stopped_pass_also_stops_workers_in_their_own_sessions(tmp_path):
    """msrun starts its workers in their own sessions; stopping the pass must not leave them running."""
    import psutil

    pid_file = tmp_path / "worker.pid"
    proc, run = hunt_source(tmp_path, DETACHED_GRANDCHILD, str(pid_file), options=["--timeout", "5"])
    assert pid_file.exists(), explain(proc)
    worker = int(pid_file.read_text())
    try:
        gone = not psutil.pid_exists(worker) or psutil.Process(worker).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        gone = True
    assert gone, f"worker {worker} still running after the pass was stopped\n{explain(proc)}"
    assert summary_of(run)["outcome"] == "timed_out", summary_of(run)


LR_MONITOR = """
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

class LearningRateMonitor(Callback):
    def __init__(self, optimizer):
        self.optimizer, self.seen = optimizer, []

    def on_train_step_end(self, run_context):   # as mindcv's StateMonitor: a small graph reads the step's lr
        self.seen.append(float(self.optimizer.get_lr().asnumpy()))

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
optimizer = nn.SGD(net.trainable_params(), learning_rate=[0.05] * 8 + [0.04] * 8)
model = Model(net, nn.MSELoss(), optimizer)
model.train(2, make_dataset(8), callbacks=[LearningRateMonitor(optimizer), mindguard.Guard()],
            dataset_sink_mode=False)
"""


def test_a_callback_graph_run_each_step_does_not_shift_the_dump_iteration(tmp_path):
    """A callback before Guard runs a graph of its own at every step's end (the learning rate read by a Gather):
    MindSpore's execution-order record then stops listing the training graph's runs and lists the callback
    graph's, one iteration ahead. The failing step (global 11) must still be dump iteration 10, dumped and named
    by the first examine pass."""
    proc, run = hunt_source(tmp_path, LR_MONITOR)
    assert proc.returncode == 1, explain(proc)
    summary = summary_of(run)
    failure = summary["failure"]
    assert (failure["global_step"], failure["dump_iteration"]) == (11, 10), failure
    assert summary["origin"]["op_type"] == "SqrtGrad", summary["origin"]
    assert "dump_scopes" not in summary and not list(run.glob("pass2-*")), sorted(p.name for p in run.iterdir())
