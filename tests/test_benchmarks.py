"""The benchmark script must keep running (no timing is asserted: the numbers depend on the machine)."""
from __future__ import annotations

import os
import subprocess
import sys

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_benchmark_script_runs_and_prints_its_table():
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--only", "dumpsize"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    assert "benchmark" in proc.stdout and "ratio to baseline" in proc.stdout, proc.stdout
    assert "DumpOnDemand: failing iteration only" in proc.stdout, proc.stdout


def test_benchmark_script_refuses_an_unknown_section():
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--only", "nosuch"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "unknown section" in proc.stderr and "nosuch" in proc.stderr, proc.stderr


def test_overhead_benchmark_pins_the_compute_threads_and_prints_every_row():
    """--pin pins MindSpore's compute threads after the compile round (the note names them) and the overhead table
    has the guard, the two checks alone and the control, each against its baseline."""
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    # one timed round of 3 steps after the compile round: every variant still runs, is pinned and gets its row
    proc = subprocess.run([sys.executable, str(REPO / "benchmarks" / "run.py"), "--quick", "--only", "overhead",
                           "--pin", "--repeats", "1", "--steps", "3"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, \
        f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-3000:]}"
    out = proc.stdout
    if len(os.sched_getaffinity(0)) >= 2:
        assert "overhead/mlp: compute threads pinned: ActorThread_0->" in out and "KernelThread_0->" in out, out
    else:   # one core: nothing to pin to distinct cores
        assert "overhead/mlp: compute threads pinned: no (unpinned)" in out, out
    for row in ("mlp + Guard ", "mlp + host check only (numpy reads the Parameters)", "mlp + compiled check only",
                "mlp + control: numpy reads another buffer of that size", "mlp + GuardedTrainStep "):
        assert row in out, (row, out)
    assert "x vs TrainOneStepCell" in out and "x vs bare" in out, out
