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
