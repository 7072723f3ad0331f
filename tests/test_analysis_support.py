"""Shared by the analysis tests: the child-script prelude that arms a CPU dump, and running such children.

No tests here. A child script starts with :data:`DUMP_PRELUDE` and is run as
``python script.py DUMP_DIR ITERATION [more args]``; ITERATION is MindSpore's 0-based dump iteration
selection (``"3"``, ``"2-3"``, ``"all"``).
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Dict, Iterator, Sequence, Tuple

DUMP_PRELUDE = '''
import json, os, sys
dump_dir, iteration = sys.argv[1], sys.argv[2]
cfg = {"common_dump_settings": {"dump_mode": 0, "path": dump_dir, "net_name": "Net", "iteration": iteration,
       "saved_data": "tensor", "input_output": 0, "kernels": [], "support_device": [0], "op_debug_mode": 0},
       "e2e_dump_settings": {"enable": True, "trans_flag": True}}
with open(dump_dir + "_config.json", "w") as f:
    json.dump(cfg, f)
os.environ["MINDSPORE_DUMP_CONFIG"] = dump_dir + "_config.json"
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
ms.set_seed(0)
np.random.seed(0)
'''

# a one-layer net whose forward takes the log of its output: a zero input row makes log(0) = -inf
LOG_NET = '''

class LogNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        return ops.log(self.fc(x))  # LOG LINE
'''


def child_env() -> Dict[str, str]:
    env = dict(os.environ, GLOG_v=os.environ.get("GLOG_v", "3"))
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    return env


def line_of(script: str, marker: str) -> int:
    """1-based line of the (dedented) ``script`` that ends with ``marker``."""
    for number, line in enumerate(textwrap.dedent(script).splitlines(), start=1):
        if line.rstrip().endswith(marker):
            return number
    raise AssertionError(f"marker {marker!r} not in script")


def train_dumps(prefix: str, jobs: Dict[str, Tuple[str, Sequence[str]]], *, expect_ok: bool = True,
                timeout: float = 300) -> Iterator[Dict[str, Tuple[Path, Path, str, str]]]:
    """Run each ``{kind: (script, args)}`` concurrently as ``script DUMP_DIR *args`` in a fresh process; yield
    ``{kind: (dump_dir, script_path, stdout, stderr)}``, then remove everything.

    Not under pytest's tmp_path: concurrent pytest sessions of the same user rotate those away, and MindSpore
    rejects a dump path with a '.' anywhere. ``expect_ok``: assert each child exited 0.
    """
    base = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    assert "." not in str(base), base
    procs = {}
    try:
        for kind, (script, args) in jobs.items():
            path = base / f"train_{kind}.py"
            path.write_text(textwrap.dedent(script))
            dump_dir = base / f"dump_{kind}"
            procs[kind] = (subprocess.Popen([sys.executable, str(path), str(dump_dir), *args], env=child_env(),
                                            text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE), dump_dir, path)
        out = {}
        for kind, (proc, dump_dir, path) in procs.items():
            stdout, stderr = proc.communicate(timeout=timeout)
            if expect_ok:
                assert proc.returncode == 0, f"{kind} exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
            out[kind] = (dump_dir, path, stdout, stderr)
        yield out
    finally:
        for proc, _, _ in procs.values():
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(base, ignore_errors=True)


def writable_copy(src: Path, dst: Path) -> Path:
    """Copy a dump (MindSpore writes its files mode 0400) and make every file writable; symlinks stay links."""
    shutil.copytree(src, dst, symlinks=True)
    for p in dst.rglob("*"):
        p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR)
    return dst


def test_dump_names_follow_the_data_flow_when_suffixes_and_time_order_disagree():
    """Two kernels of one name: the k-th launch by time gets the k-th csv entry, unless the files' own -opN
    suffixes (when they are exactly the csv's) keep the .ir's data flow in time order better. Both cases were
    measured on 2.10 CPU (docs/mindspore-facts.md): Sub-op1 ran before Sub-op0 and its file was the .ir's Sub-op1
    (read by Log-op1 right after); the Expand Muls' files were swapped against the .ir and time order was right."""
    from mindguard.analysis.order import OpLaunch, assign_full_names
    from mindguard.analysis.trace import GraphTrace, NodeTrace

    def graph(edges):
        trace = GraphTrace()
        for name in {n for edge in edges for n in edge}:
            trace.nodes[name] = NodeTrace(name, name.rsplit("/", 1)[-1].split("-")[0])
        for producer, reader in edges:
            node = trace.nodes[reader]
            node.input_nodes[len(node.input_nodes)] = trace.nodes[producer]
        return trace

    def launch(name, t):
        return OpLaunch(name.split("/")[-1].split("-")[0], name.replace("/", "_"), 0, t)

    # the loss: Sub-op0 = 1 - labels (read by Mul-op1), Sub-op1 = 1 - p (read by Log-op1)
    sub = ["L/Sub-op0", "L/Sub-op1", "L/Log-op1", "L/Mul-op1"]
    trace = graph([("L/Sub-op1", "L/Log-op1"), ("L/Sub-op0", "L/Mul-op1"), ("L/Log-op1", "L/Mul-op1")])
    ops = [launch("L/Sub-op1", 689), launch("L/Log-op1", 717), launch("L/Sub-op0", 750), launch("L/Mul-op1", 800)]
    assign_full_names(sorted(ops, key=lambda o: o.timestamp), {0: sub}, {0: trace})
    names = [o.full_name for o in ops]
    assert names == ["L/Sub-op1", "L/Log-op1", "L/Sub-op0", "L/Mul-op1"], names

    # the Expand Muls: file Mul-op1 ran first and is the csv's Mul-op0 (read by Grad-op0 right after)
    csv = ["E/Mul-op0", "E/Grad-op0", "E/Mul-op1", "E/Opt-op0"]
    trace = graph([("E/Mul-op0", "E/Grad-op0"), ("E/Mul-op1", "E/Opt-op0")])
    ops = [launch("E/Mul-op1", 145), launch("E/Grad-op0", 160), launch("E/Mul-op0", 189), launch("E/Opt-op0", 200)]
    assign_full_names(sorted(ops, key=lambda o: o.timestamp), {0: csv}, {0: trace})
    names = [o.full_name for o in ops]
    assert names == ["E/Mul-op0", "E/Grad-op0", "E/Mul-op1", "E/Opt-op0"], names
