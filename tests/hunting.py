"""Helpers for the tests that run ``mindguard hunt`` on real training scripts in subprocesses."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def run_hunt(run_dir: Path, *command: str, timeout: float = 400, cwd=None,
             options: Sequence[str] = (), check_fix: bool = False) -> subprocess.CompletedProcess:
    """``python -m mindguard hunt --run-dir RUN_DIR [options] -- COMMAND`` with MindSpore's logging quiet; without
    the check of the hint's fix (one more training run) unless ``check_fix`` (tests/test_fix_check.py): CI time."""
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    skip = () if check_fix else ("--no-check-fix",)
    return subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(run_dir), *skip, *options,
                           "--", *command],
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd)


def clean_env() -> dict:
    """The test process's environment for a script run as a user runs it: no hunt request (``MINDGUARD_*``), no
    dump config, MindSpore's logging at errors only."""
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    for key in [k for k in env if k.startswith("MINDGUARD_")]:
        env.pop(key)
    return env


def summary_of(run: Path) -> dict:
    path = run / "summary.json"
    assert path.exists(), \
        f"no summary.json in {run}: {sorted(p.name for p in run.iterdir()) if run.exists() else 'no run folder'}"
    return json.loads(path.read_text())


def explain(proc: subprocess.CompletedProcess) -> str:
    return (f"exit {proc.returncode}\n--- stdout ---\n{(proc.stdout or '')[-5000:]}\n--- stderr ---\n"
            f"{(proc.stderr or '')[-5000:]}")


ZOO = Path(__file__).resolve().parent / "zoo"


def hunt_zoo(tmp_path: Path, script: str, *args: str, name: str = "run", check_fix: bool = False):
    """``mindguard hunt -- python tests/zoo/<script> ARGS`` from ``tmp_path``: ``(proc, run folder, summary)``."""
    run = tmp_path / name
    proc = run_hunt(run, sys.executable, str(ZOO / script), *args, cwd=tmp_path, check_fix=check_fix)
    return proc, run, summary_of(run) if (run / "summary.json").exists() else {}


def check_outcome(proc: subprocess.CompletedProcess, summary: dict, code: int, outcome: str) -> None:
    """The hunt's exit code and summary outcome, with the output when they differ."""
    assert proc.returncode == code, f"expected exit {code}\n{explain(proc)}"
    assert summary.get("outcome") == outcome, f"outcome {summary.get('outcome')!r}: {sorted(summary)}"


def line_of(path: Path, text: str) -> int:
    """The first line of code (outside docstrings) that contains ``text`` -- or, for a marker comment (``"# CULPRIT"``),
    that ends with it (so ``# CULPRIT`` does not match ``# CULPRIT-RESNET``)."""
    in_docstring = False
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        quotes = line.count('"""') + line.count("'''")
        if in_docstring or (quotes and line.strip().startswith(('"""', "'''", 'r"""'))):
            if quotes % 2 == 1:
                in_docstring = not in_docstring
            continue
        if (line.rstrip().endswith(text) and line.rstrip()[: -len(text)].strip()) if text.startswith("#") \
                else text in line:
            return number
    raise AssertionError(f"no line of code contains {text!r} in {path}")


#: A Model.train script whose GuardedTrainStep refuses the norm demo's bad update at global step 11 (the weights stay
#: intact), with Guard recording it.
GUARDED_STEP = """
import mindspore as ms
from mindspore import nn
from mindspore.train import Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = mindguard.guard_model(Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05)))
model.train(3, make_dataset(8), callbacks=[mindguard.Guard()], dataset_sink_mode=False)
"""
