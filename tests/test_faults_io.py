"""Faults of files, disks and consoles: mindguard never takes a training down for its own I/O, the hunt's result is
written before anything can fail on the way out, a dump still being written is not diagnosed, and inputs that
are not what they claim are refused naming the file.

Real MindSpore (CPU), real processes; the full disks are real small tmpfs mounts (skipped, saying why, where the
machine does not allow mounting one).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from faults import FILL_SNIPPET, failing, fill, hunt_env, small_disk, start_hunt
from hunting import explain, summary_of

pytestmark = pytest.mark.slow


def run(command, *, timeout: float = 240, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("env", hunt_env())
    return subprocess.run(command, capture_output=True, text=True, timeout=timeout, **kwargs)


def hunt(run_dir: Path, *command: str, **kwargs) -> subprocess.CompletedProcess:
    proc = start_hunt(run_dir, *command, **kwargs)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# -- 2. a full disk under the record -------------------------------------------------------------------------------
PLAIN = FILL_SNIPPET + """
import sys
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

record, filler, when = sys.argv[1], sys.argv[2], sys.argv[3]

class FillAt3(Callback):
    def on_train_step_end(self, run_context):
        if when == "step3" and run_context.original_args().get("cur_step_num") == 3:
            fill(filler)

if when == "start":
    fill(filler)
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(2, make_dataset(4, poison_step=int(sys.argv[4])),
            callbacks=[mindguard.Guard(record=record, check_every_step=True), FillAt3()], dataset_sink_mode=False)
print("TRAINING ENDED", flush=True)
"""


def test_a_full_disk_under_the_record_never_ends_a_healthy_training(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    with small_disk("1m") as disk:
        record = disk / "mindguard_failure.json"
        proc = run([sys.executable, str(script), str(record), str(disk / "filler"), "start", "0"])
        assert proc.returncode == 0, explain(proc)
        assert "TRAINING ENDED" in proc.stdout, explain(proc)
        assert "Errno 28" not in proc.stderr and "Traceback" not in proc.stderr, explain(proc)
        warned = [line for line in proc.stderr.splitlines() if "MindguardWarning" in line]
        assert len(warned) == 1, explain(proc)   # once, not at every step
        assert f"cannot write the failure record {str(record)!r} (No space left on device)" in warned[0], warned
        assert "the training goes on without it" in warned[0] and "free space on that disk" in warned[0], warned


def test_a_disk_that_fills_before_the_failing_step_still_gets_the_failure_recorded(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PLAIN)
    with small_disk("1m") as disk:
        record = disk / "mindguard_failure.json"
        proc = run([sys.executable, str(script), str(record), str(disk / "filler"), "step3", "5"])
        assert proc.returncode == 0, explain(proc)
        assert "Traceback" not in proc.stderr, explain(proc)
        saved = json.loads(record.read_text())   # in place, into the bytes the running record already held
        assert (saved["status"], saved["global_step"], saved["kind"]) == ("failed", 5, "nonfinite_params"), saved


HUNTED = FILL_SNIPPET + """
import atexit, os, sys
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

filler, when, after = sys.argv[1], sys.argv[2], sys.argv[3]
if after == "free":   # the space comes back once the training ended (a temporary file, another job's output)
    atexit.register(lambda: os.path.exists(filler) and os.remove(filler))
hunt_pass = os.environ.get("MINDGUARD_HUNT_PASS")

class FillAt3(Callback):
    def on_train_step_end(self, run_context):
        if run_context.original_args().get("cur_step_num") == 3 and when == hunt_pass:
            fill(filler)

if when == "start" and hunt_pass == "record":
    fill(filler)
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(2, make_dataset(4, poison_step=5), callbacks=[mindguard.Guard(), FillAt3()], dataset_sink_mode=False)
"""


def test_under_the_hunt_a_record_that_cannot_be_written_ends_the_pass_with_mindguards_message(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HUNTED)
    with small_disk("4m") as disk:
        run_dir = disk / "run"
        proc = hunt(run_dir, sys.executable, str(script), str(disk / "filler"), "start", "free")
        assert proc.returncode == 2, explain(proc)
        summary = summary_of(run_dir)
        assert summary["outcome"] == "record_failed", summary
        record = run_dir / "pass1" / "failure.json"
        assert f"pass 1 could not record the failing step: cannot write the failure record {str(record)!r} (No space " \
               f"left on device); free space on that disk" in proc.stderr, explain(proc)
        assert "Traceback" not in proc.stderr, explain(proc)   # nothing raised into the user's model.train
        assert not (run_dir / "pass2").exists()


def test_under_the_hunt_a_disk_full_for_a_while_in_pass1_still_gets_the_failure_found(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HUNTED)
    with small_disk("4m") as disk:
        run_dir = disk / "run"
        proc = hunt(run_dir, sys.executable, str(script), str(disk / "filler"), "record", "free")
        assert proc.returncode == 1, explain(proc)   # the failure went into the record in place; nothing raised
        summary = summary_of(run_dir)
        assert summary["outcome"] == "failure_found" and summary["origin"]["op_type"] == "SqrtGrad", summary
        assert "Traceback" not in proc.stderr and "Errno 28" not in proc.stderr, explain(proc)


def test_under_the_hunt_a_disk_that_stays_full_after_pass1_is_named_never_a_verdict(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HUNTED)
    with small_disk("4m") as disk:
        run_dir = disk / "run"
        proc = hunt(run_dir, sys.executable, str(script), str(disk / "filler"), "record", "keep")
        assert proc.returncode == 2, explain(proc)
        assert "pass 1 recorded a failure, but the hunt cannot examine it: the run folder's disk is full (0 bytes " \
               f"free on the file system of {run_dir}): free space there" in proc.stderr, explain(proc)
        # the disk is still full: the summary cannot be written, and the hunt says so instead of failing on it
        assert f"could not write {run_dir / 'summary.json'}: No space left on device; free space on that disk" \
            in proc.stderr, explain(proc)
        assert "examine failed (exit code 2)" in proc.stderr, explain(proc)
        assert not (run_dir / "pass2").exists() and "Traceback" not in proc.stderr, explain(proc)


def test_under_the_hunt_a_disk_that_fills_while_pass2_dumps_is_named_never_a_verdict(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(HUNTED)
    with small_disk("4m") as disk:
        run_dir = disk / "run"
        proc = hunt(run_dir, sys.executable, str(script), str(disk / "filler"), "examine", "free")
        assert proc.returncode == 2, explain(proc)
        summary = summary_of(run_dir)
        assert summary["outcome"] == "examine_failed", summary
        assert "pass 2 could not examine the failing step: the run folder's disk is full" in proc.stderr, explain(proc)
        assert "NOT REPRODUCIBLE" not in proc.stderr and "could not be analysed" not in proc.stderr, explain(proc)
        assert "Traceback" not in proc.stderr, explain(proc)


def test_a_refused_run_on_a_full_disk_leaves_no_folder(tmp_path):
    with small_disk("1m") as disk:
        fill(disk / "filler")
        proc = run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(disk / "run"), "--",
                    sys.executable, "-c", "print('must not run')"], timeout=60)
        assert proc.returncode == 2, explain(proc)
        assert "No space left on device" in proc.stderr and str(disk / "run") in proc.stderr, explain(proc)
        assert "must not run" not in proc.stdout
        assert not (disk / "run").exists(), sorted(p.name for p in disk.iterdir())


# -- 3. the answer survives a console that fails -------------------------------------------------------------------
def test_a_reader_that_leaves_early_changes_neither_the_exit_code_nor_the_summary(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(failing())
    run_dir = tmp_path / "run"
    line = (f"set -o pipefail; {sys.executable} -m mindguard hunt --run-dir {run_dir} -- {sys.executable} {script} "
            f"| head -3")
    proc = run(["bash", "-c", line])
    assert proc.returncode == 1, explain(proc)   # pipefail: the hunt's own exit code, failure found
    assert len(proc.stdout.splitlines()) <= 3
    summary = summary_of(run_dir)
    assert (summary["outcome"], summary["exit_code"]) == ("failure_found", 1), summary
    assert (run_dir / "report.txt").exists()
    assert "BrokenPipe" not in proc.stderr and "Exception ignored" not in proc.stderr, explain(proc)


def test_a_full_disk_behind_stdout_changes_neither_the_exit_code_nor_the_summary(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(failing())
    run_dir = tmp_path / "run"
    with open("/dev/full", "w") as full:
        proc = start_hunt(run_dir, sys.executable, str(script), stdout=full)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err[-4000:]
    summary = summary_of(run_dir)
    assert summary["outcome"] == "failure_found", summary
    assert "Exception ignored" not in err and "No space left" not in err, err[-4000:]


# -- 4. analyze on an iteration still being written ----------------------------------------------------------------
HEALTHY_DUMP = """
import sys
import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from mindguard.demos.norm_nan import build_network, make_dataset
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train(1, make_dataset(2, clean_epochs=10), dataset_sink_mode=False)
"""

SLOW_WRITER = """
import os, shutil, sys, time
from pathlib import Path
src, dst, gap = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
for item in src.iterdir():   # everything but the iteration's tensors is there first
    if item.name != "Net":
        shutil.copytree(item, dst / item.name)
iteration = next(src.glob("Net/*/*"))
target = dst / iteration.relative_to(src)
target.mkdir(parents=True)
from mindguard.analysis.files import file_timestamp_us
files = sorted(iteration.iterdir(), key=lambda p: file_timestamp_us(p.name) or 0)
Path(sys.argv[4]).write_text(str(len(files)))
for i, f in enumerate(files):   # MindSpore writes a step's files kernel by kernel
    shutil.copyfile(f, target / f.name)
    if i == len(files) // 3:
        Path(sys.argv[5]).write_text("a third written")
    time.sleep(gap)
"""


@pytest.fixture(scope="module")
def healthy_dump(tmp_path_factory):
    base = tmp_path_factory.mktemp("dumpsrc")
    script = base / "train.py"
    script.write_text(HEALTHY_DUMP)
    dump = Path("/tmp") / f"mindguard_faults_dump_{os.getpid()}"
    shutil.rmtree(dump, ignore_errors=True)
    config = base / "dump.json"
    made = run([sys.executable, "-m", "mindguard", "dump-config", "--path", str(dump), "--iteration", "0",
                "-o", str(config)])
    assert made.returncode == 0, explain(made)
    proc = run([sys.executable, str(script)], env=hunt_env(MINDSPORE_DUMP_CONFIG=str(config)))
    assert proc.returncode == 0, explain(proc)
    root = dump / "rank_0"
    assert list(root.glob("Net/*/0/*.npy")), sorted(str(p) for p in dump.rglob("*"))[:20]
    yield root
    shutil.rmtree(dump, ignore_errors=True)


def test_analyze_waits_for_an_iteration_still_being_written(tmp_path, healthy_dump):
    whole = run([sys.executable, "-m", "mindguard", "analyze", str(healthy_dump), "--json"])
    assert whole.returncode == 0, explain(whole)
    target = Path("/tmp") / f"mindguard_faults_live_{os.getpid()}" / "rank_0"
    shutil.rmtree(target.parent, ignore_errors=True)
    count, third = tmp_path / "count", tmp_path / "third"
    try:
        writer = subprocess.Popen([sys.executable, "-c", SLOW_WRITER, str(healthy_dump), str(target), "0.04",
                                   str(count), str(third)])
        deadline = time.monotonic() + 60
        while not third.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        proc = run([sys.executable, "-m", "mindguard", "analyze", str(target), "--json"])   # mid-way
        writer.wait(timeout=60)
        assert proc.returncode == 0, explain(proc)   # never "the step stopped in ..., it did not complete"
        report = json.loads(proc.stdout)
        expected = json.loads(whole.stdout)
        assert report["stopped_at"] is None and report["origin"] is None, report
        assert report["ops_analyzed"] == expected["ops_analyzed"] > 0, \
            (report["ops_analyzed"], expected["ops_analyzed"])
    finally:
        shutil.rmtree(target.parent, ignore_errors=True)


def test_analyze_refuses_an_iteration_that_keeps_being_written(tmp_path, healthy_dump):
    from mindguard.analysis.files import wait_until_written
    from mindguard.errors import DumpInProgressError

    iteration = tmp_path / "Net" / "0" / "0"
    iteration.mkdir(parents=True)
    stop = threading.Event()

    def write():   # a training dumping this iteration right now
        i = 0
        while not stop.is_set():
            (iteration / f"f{i}").write_bytes(b"x")
            i += 1
            time.sleep(0.1)

    writer = threading.Thread(target=write)
    writer.start()
    try:
        with pytest.raises(DumpInProgressError, match="is still being written"):
            wait_until_written([("Net", 0, iteration)], settle=0.5, wait=1.5)
        (tmp_path / "Net" / "0" / "1").mkdir()   # the graph ran a later iteration: this one is complete
        wait_until_written([("Net", 0, iteration)], settle=0.5, wait=1.5)
    finally:
        stop.set()
        writer.join()


# -- 5. inputs verified -----------------------------------------------------------------------------------------
CAPTURES = """
import sys
import numpy as np
import mindspore as ms
from mindspore import nn
from mindguard.training.examine.capture import capture_step
sys.path.insert(0, sys.argv[1])
from netmod import net_with_loss

ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
ms.set_seed(0)
network = net_with_loss()
optimizer = nn.SGD(network.trainable_params(), 0.1)
train = nn.TrainOneStepCell(network, optimizer)
for step, scale in ((1, 1.0), (2, 1e30)):   # step 2's batch overflows: its replay names the culprit
    x = ms.Tensor(np.full((2, 4), scale, np.float32))
    y = ms.Tensor(np.zeros((2, 1), np.float32))
    capture_step(f"{sys.argv[1]}/cap{step}", train, [x, y], step - 1, optimizer=optimizer)
    train(x, y)
"""

NETMOD = """
from mindspore import nn, ops

class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 1)

    def construct(self, x):
        return self.dense(x * x)

def net_with_loss():
    return nn.WithLossCell(Net(), nn.MSELoss())
"""


@pytest.fixture
def captures(tmp_path):
    (tmp_path / "netmod.py").write_text(NETMOD)
    script = tmp_path / "make.py"
    script.write_text(CAPTURES)
    proc = run([sys.executable, str(script), str(tmp_path)])
    assert proc.returncode == 0, explain(proc)
    return tmp_path


def replay(folder: Path, capture: Path) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "mindguard", "replay", str(capture), "--net",
                f"{folder / 'netmod.py'}:net_with_loss", "--json"])


def test_replay_refuses_a_batch_swapped_in_from_another_capture(captures):
    good = replay(captures, captures / "cap2")
    assert good.returncode == 0 and json.loads(good.stdout)["first"], explain(good)   # the failing step: a culprit
    shutil.copyfile(captures / "cap1" / "inputs" / "0.npy", captures / "cap2" / "inputs" / "0.npy")
    proc = replay(captures, captures / "cap2")
    assert proc.returncode == 2, explain(proc)
    assert "inputs/0.npy is not the file capture.json (global step 2) was written with" in proc.stderr, explain(proc)
    assert '"healthy": true' not in proc.stdout, explain(proc)


def test_replay_refuses_a_capture_json_copied_from_another_capture(captures):
    shutil.copyfile(captures / "cap1" / "capture.json", captures / "cap2" / "capture.json")
    proc = replay(captures, captures / "cap2")
    assert proc.returncode == 2, explain(proc)
    assert "parameters.ckpt, inputs/0.npy are not the files capture.json (global step 1) was written with" in \
        proc.stderr and "or capture.json itself came from another capture" in proc.stderr, explain(proc)


def test_a_kept_state_swapped_for_another_steps_is_refused_naming_the_file(tmp_path, graph_mode):
    import mindspore as ms
    from mindspore import nn

    from mindguard.training.state.resume import Resumer, StateKeeper, state_parameters
    from mindguard.errors import HuntProtocolError

    net = nn.Dense(3, 2)
    params = state_parameters(net)
    for step, folder in ((3, "at3"), (5, "at5")):
        keeper = StateKeeper(tmp_path / folder, steps=[step])
        keeper.keep(step, params)
        keeper.write(step)
        ms.ops.assign(net.weight, ms.Tensor(np.full((2, 3), float(step), np.float32)))
    shutil.copyfile(tmp_path / "at5" / "state.npz", tmp_path / "at3" / "state.npz")
    with pytest.raises(HuntProtocolError, match=r"state.npz' is not the file state.json \(global step 3\) was "
                                                r"written with"):
        Resumer(tmp_path / "at3").load(params)
    Resumer(tmp_path / "at5").load(params)   # its own file loads
