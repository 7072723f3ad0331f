"""The samples no other test runs do what their docstrings promise, run as a user runs them (``python samples/X.py``,
MindSpore on CPU, in a fresh folder)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np

from conftest import REPO

SAMPLES = REPO / "samples"


def run_sample(name: str, cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    for key in [k for k in env if k.startswith("MINDGUARD_")]:
        env.pop(key)
    proc = subprocess.run([sys.executable, str(SAMPLES / name)],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "moved to mindguard." not in proc.stderr, proc.stderr[-3000:]   # a sample uses no deprecated name
    return proc


def test_custom_loop_refuses_the_padded_batchs_step_and_keeps_training(tmp_path):
    out = run_sample("custom_loop.py", tmp_path).stdout
    refused = re.findall(r"^step (\d+): update refused \(loss (\S+)\); weights kept$", out, re.M)
    trained = [(int(s), float(v)) for s, v in re.findall(r"^step (\d+): loss (\S+)$", out, re.M)]
    assert [int(s) for s, _ in refused] == [5], out
    assert [s for s, _ in trained] == [1, 2, 3, 4, 6, 7, 8], out
    losses = [v for _, v in trained]
    # the steps around the refused one trained (their losses change) and stayed finite
    assert np.isfinite(losses).all() and len(set(losses)) == len(losses), out
    assert "all parameters finite: True" in out, out


def test_reproducible_training_repeats_its_losses_bit_for_bit(tmp_path):
    first = run_sample("reproducible_training.py", tmp_path).stdout
    saved = sorted(p.name for p in (tmp_path / "init_params").glob("*.npy"))
    assert saved, sorted(p.name for p in tmp_path.rglob("*"))
    second = run_sample("reproducible_training.py", tmp_path).stdout
    losses = re.findall(r"^step (\d+): (\S+)$", first, re.M)
    assert [int(s) for s, _ in losses] == list(range(1, 9)), first
    assert re.findall(r"^step (\d+): (\S+)$", second, re.M) == losses, (first, second)
    # the second run loaded the weights the first saved (none written again, none missing)
    assert sorted(p.name for p in (tmp_path / "init_params").glob("*.npy")) == saved
