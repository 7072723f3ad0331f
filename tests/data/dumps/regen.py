"""Regenerate the small real dumps the fast evidence tests read (tests/test_fast_evidence.py).

    PYTHONPATH=<checkout> python tests/data/dumps/regen.py [CASE ...] [--keep-runs DIR | --from-runs DIR]

Each case runs ``mindguard hunt`` on a tiny training (a script of tests/zoo, the norm demo, or one of the
:data:`SCRIPTS` below; MindSpore 2.10, CPU, GRAPH mode) and keeps, from the examine pass named in :data:`CASES`,
what ``analyze_dump`` reads of the step:

    <case>/dump/rank_0/execution_order/*.csv   the kernels' execution order
    <case>/dump/rank_0/.dump_metadata/         the dump's settings (a kernel filter makes left-out inputs missing)
    <case>/dump/rank_0/graphs/*.ir              the .ir (kernel types, data flow, source lines); no .pb
    <case>/dump/rank_0/Net/<graph>/<iteration>/ the tensor files of the dumped iteration(s)
    <case>/state/state.json, state.npz          the Parameters as the step began (the pass's kept state)
    <case>/case.json                            the pass's step window (epoch us), iteration, dump scope, and
                                                what the hunt concluded (op type, direction), for reference

Everything else of the run (logs, records, the other passes) is dropped. The dumps differ from run to run only in
timestamps, in memory a kernel leaves unwritten and in how the dump joins files to kernels of one scope, so a case
whose rule shows only in some runs is run again until it shows (``wanted``, ``tries``); the tests assert what the
rules make of the files, not byte contents. Takes a few minutes; run it on a quiet machine and commit the result
(``du -sh --apparent-size tests/data/dumps``: about 1.2 MB, some 160 KB compressed; keep it so).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
ZOO = REPO / "tests" / "zoo"


# A weight gradient that overflows while nothing else does: the conv's weights are zeros, so its forward is 0 for a
# frame of 1e37, and its weight gradient sums 1e37 x dL/dy over 64 positions (-Inf). The narrow dump leaves
# Conv2DBackpropFilter out; clip_by_global_norm's Square reads it: an Inf/NaN from an input the dump does not hold.
NARROW_SCRIPT = """
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model
import mindguard


class Stem(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 1, 3, pad_mode="same", has_bias=False, weight_init="zeros")

    def construct(self, x):
        return self.conv(x).sum(axis=(1, 2, 3))   # CONV


class ClipStep(nn.TrainOneStepCell):
    def construct(self, x, y):
        loss = self.network(x, y)
        grads = self.grad(self.network, self.weights)(x, y, ops.ones_like(loss))
        grads = ops.clip_by_global_norm(grads, clip_norm=1.0)   # CLIP
        return ops.depend(loss, self.optimizer(grads))


ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
frames = np.full((2, 1, 1, 8, 8), 1e37, np.float32)
data = ds.NumpySlicesDataset({"x": frames.reshape(2, 1, 8, 8), "y": np.ones((2,), np.float32)},
                             shuffle=False).batch(2)
net = Stem()
step = ClipStep(nn.WithLossCell(net, nn.MSELoss()), nn.Momentum(net.trainable_params(), 0.01, 0.9))
Model(step).train(1, data, callbacks=[mindguard.Guard()], dataset_sink_mode=False)
"""

# The CPU BatchNorm leaves outputs 1 and 2 unwritten: from the second step on its output 1 holds what a freed tensor
# of the same size held, here the -inf of a masked_fill (measured: [-inf, 1, -inf, 1, ...]). The failure comes after
# it: the third batch's target is 1e38, so the loss's Square overflows from finite inputs.
BATCHNORM_SCRIPT = """
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model
import mindguard

C = 8


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, C, 3, pad_mode="same")
        self.bn = nn.BatchNorm2d(C)
        self.fc = nn.Dense(C, 1)
        self.mask = ms.Tensor(np.array([True, False] * (C // 2)))

    def construct(self, x):
        h = self.conv(x)
        m = ops.masked_fill(ops.ones((C,), ms.float32), self.mask, float("-inf"))
        h = h + ops.exp(m).reshape(1, C, 1, 1)
        h = self.bn(h)   # BATCHNORM
        return self.fc(h.mean(axis=(2, 3)))


ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
x = np.random.RandomState(0).normal(size=(12, 1, 6, 6)).astype(np.float32)
y = np.ones((12, 1), np.float32)
y[8:] = 1e38
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
net = Net()
Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
    1, data, callbacks=[mindguard.Guard()], dataset_sink_mode=False)
"""
# AMP O2 on CPU: float16-typed ops (the Pow of the variance) run in float32 and their files are labelled float16. The
# second batch has a constant feature: its std is 0 and the standardisation divides 0 by 0.
AMP_SCRIPT = """
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import FixedLossScaleManager, Model
import mindguard


class Standardized(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 1)

    def construct(self, x):
        mean = x.mean(axis=0, keep_dims=True)
        std = ops.sqrt(((x - mean) ** 2).mean(axis=0, keep_dims=True))
        return self.fc((x - mean) / std)   # CULPRIT


ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(3)
x = np.random.RandomState(0).uniform(0, 1, (8, 4)).astype(np.float32)
x[4:, 2] = 0.0   # the second batch: feature 2 is constant
data = ds.NumpySlicesDataset({"x": x, "y": np.ones((8, 1), np.float32)}, shuffle=False).batch(4)
net = Standardized()
model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9), amp_level="O2",
              loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=False))
model.train(1, data, callbacks=[mindguard.Guard()], dataset_sink_mode=False)
"""
SCRIPTS = {"{amp}": AMP_SCRIPT, "{narrow}": NARROW_SCRIPT, "{batchnorm}": BATCHNORM_SCRIPT}


def _has_exclusion(rule: str) -> Callable[[Path], Optional[str]]:
    def check(out: Path) -> Optional[str]:
        report = _analyze(out)
        return None if any(e["rule"] == rule for e in report.excluded) else f"no {rule!r} exclusion this run"
    return check


def _not_named_for_left_out_inputs(out: Path) -> Optional[str]:
    report = _analyze(out)
    return None if any("is not named the origin" in w for w in report.warnings) else "no op left unnamed"


def _analyze(out: Path):
    sys.path.insert(0, str(REPO))
    from mindguard.analysis.report import analyze_dump

    case = json.loads((out / "case.json").read_text())
    return analyze_dump(out / "dump", time_window=tuple(case["step_window_us"]),
                        state=out / "state" if (out / "state").is_dir() else None, progress=False)


class Case(NamedTuple):
    command: List[str]   # the training, after ``python`` ("{narrow}": a script of SCRIPTS, written to a file)
    take: str            # the examine pass folder whose dump is kept (pass2: the narrow dump)
    about: str
    wanted: Optional[Callable[[Path], Optional[str]]] = None   # why the kept dump does not show the rule, or None
    tries: int = 1       # runs until ``wanted`` is satisfied (what a kernel leaves unwritten differs between runs)


CASES: Dict[str, Case] = {
    "intended_mask": Case(
        [str(ZOO / "masked_attention.py"), "--mode", "graph", "--jit", "--bad_step", "2", "--steps", "3"], "pass2",
        "masked_fill(-inf) padding mask (intended infinities), then a padding-only row: -inf - -inf = NaN in Sub; "
        "Tensor.sum's ReduceSums in one scope, one joined to another's file (files of another kernel)",
        _has_exclusion("files of another kernel"), tries=3),
    "norm_sqrt": Case(
        ["-m", "mindguard.demos.norm_nan", "--epochs", "3"], "pass2",
        "the field report: nn.Norm of a zero padding embedding, SqrtGrad divides by sqrt(0)"),
    "batchnorm_unwritten": Case(
        ["{batchnorm}"], "pass2",
        "a CPU BatchNorm's unwritten output 1 holding a freed masked_fill's -inf; then the loss's Square overflows",
        _has_exclusion("outputs the kernel leaves unwritten"), tries=3),
    "amp_mislabelled": Case(
        ["{amp}"], "pass2",
        "AMP O2 on CPU: files labelled float16 holding float32 bytes; the culprit is a 0/0 Div",
        _has_exclusion("float16 label on float32 bytes")),
    "optimizer_inplace": Case(
        [str(ZOO / "warmup_lr.py")], "pass2-all_outputs",
        "an infinite learning rate: ApplyMomentum writes Inf/NaN into its inputs in place"),
    "narrow_missing": Case(
        ["{narrow}"], "pass2",
        "a kernel-filtered (narrow) dump: the clip's Square reads a weight gradient the dump left out (-Inf)",
        _not_named_for_left_out_inputs),
}


def hunt(run: Path, case: Case) -> subprocess.CompletedProcess:
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=str(REPO))
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    script = run.parent / f"{run.name}_train.py"
    command = []
    for arg in case.command:
        if arg in SCRIPTS:
            script.write_text(SCRIPTS[arg])
            arg = str(script)
        command.append(arg)
    return subprocess.run([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(run), "--",
                           sys.executable, *command], capture_output=True, text=True, timeout=900, env=env,
                          cwd=str(run.parent))


def keep(run: Path, case: Case, out: Path) -> None:
    """Copy what the analysis of ``case.take`` reads into ``out`` (replaced)."""
    taken = run / case.take
    if not (taken / "dump").is_dir():
        raise SystemExit(f"{run}: no {case.take}/dump (passes: {sorted(p.name for p in run.iterdir())})")
    if out.exists():
        shutil.rmtree(out)
    for rank_dir in sorted((taken / "dump").glob("rank_*")):
        target = out / "dump" / rank_dir.name
        shutil.copytree(rank_dir / "execution_order", target / "execution_order")
        shutil.copytree(rank_dir / ".dump_metadata", target / ".dump_metadata")   # the dump's settings (its filter)
        (target / "graphs").mkdir(parents=True)
        for ir in (rank_dir / "graphs").glob("*.ir"):
            shutil.copy2(ir, target / "graphs" / ir.name)
        for net in rank_dir.iterdir():
            if net.is_dir() and net.name not in ("execution_order", "graphs", ".dump_metadata"):
                shutil.copytree(net, target / net.name)
    if (taken / "state").is_dir():
        shutil.copytree(taken / "state", out / "state")
    record = json.loads((taken / "failure.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    origin = summary.get("origin") or {}
    (out / "case.json").write_text(json.dumps({
        "about": case.about, "command": ["python", *[_shown(a) for a in case.command]], "pass": case.take,
        "step_window_us": record.get("step_window_us"), "dump_iteration": record.get("dump_iteration"),
        "global_step": record.get("global_step"), "hunt_origin": {k: origin.get(k) for k in ("op_type", "direction")},
        "dump_scopes": [s.get("scope") for s in summary.get("dump_scopes") or []]}, indent=1) + "\n")
    for path in out.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)   # MindSpore writes 0400


def _shown(arg: str) -> str:
    return os.path.relpath(arg, REPO) if arg.startswith(str(REPO)) else arg


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", metavar="CASE", help=f"some of {', '.join(CASES)} (default: all)")
    parser.add_argument("--keep-runs", type=Path, help="keep the hunts' run folders here")
    parser.add_argument("--from-runs", type=Path, help="take the cases from the run folders kept there, no hunt")
    args = parser.parse_args()
    unknown = [name for name in args.cases if name not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; the cases are {list(CASES)}")
    base = Path(tempfile.mkdtemp(prefix="mindguard_fixtures_", dir="/tmp"))   # MindSpore refuses '.' in dump paths
    try:
        for name in args.cases or list(CASES):
            case = CASES[name]
            if args.from_runs is not None:
                keep(args.from_runs / name, case, HERE / name)
                continue
            for attempt in range(1, case.tries + 1):
                run = (args.keep_runs or base) / f"{name}-{attempt}"
                run.parent.mkdir(parents=True, exist_ok=True)
                proc = hunt(run, case)
                print(f"{name}: hunt exited {proc.returncode}", flush=True)
                if proc.returncode not in (0, 1):
                    print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
                    break
                keep(run, case, HERE / name)
                why = case.wanted(HERE / name) if case.wanted is not None else None
                print(f"{name}: kept{'' if why is None else f', but {why}'}", flush=True)
                if why is None:
                    break
    finally:
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
