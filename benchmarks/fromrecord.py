"""`mindguard hunt --from` against the failing run it starts from (issue 51), side by side per shape.

For each shape: the training with an always-on ``Guard()`` runs until it fails (timed: the whole process), then the
``mindguard hunt --from`` line it printed runs (timed: the whole hunt, analysis included); ``--repeats`` pairs, each
in a fresh folder. Printed per shape: the failing run's seconds, the hunt's, their ratio (median and range over the
pairs), the route the hunt took and the pass folders it made (one process: ``locate`` alone).

    python benchmarks/fromrecord.py                       # every shape, 3 pairs
    python benchmarks/fromrecord.py --only resnet18-step3-nostate --repeats 5 --json out.json

Shapes, one per client of issue 51 (your own scripts in their shapes, tests/zoo/ and benchmarks/failing_train.py):
a ResNet-18 (CIFAR layout, 11.2M parameters, ~90 MB state with Momentum; 8x8 images, batch 8) whose stem overflows at
step 3 (with Guard() and with Guard(keep_state=False)), 4 and 300, or whose learning rate (1e6) blows its weights up;
a small CNN failing at step 50 of 60; the benchmark MLP (1.86M) failing at step 60; a knowledge-graph model trained in
two Model.train phases; the same TransE model in PyNative; a CTC text recognizer; a GAN whose own loader raises at step
40 under ``mindguard.watch``; a RotatE-style loop over two loss-scale cells drawing from its own numpy RandomState; a
BERT-style fp16 fine-tune whose mask row holds token ids at step 25.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Dict, List

HERE = Path(__file__).resolve().parent
ZOO = HERE.parent / "tests" / "zoo"

SHAPES: Dict[str, List[str]] = {
    "resnet18-step3": [str(ZOO / "resnet_bad_batch.py"), "--poison", "3", "--steps", "6"],
    "resnet18-step3-nostate": [str(ZOO / "resnet_bad_batch.py"), "--poison", "3", "--steps", "6", "--no-keep-state"],
    "cnn-step50": [str(ZOO / "resnet_bad_batch.py"), "--model", "cnn", "--steps", "60", "--poison", "50",
                   "--image", "16"],
    "mlp-step60": [str(HERE / "failing_train.py"), "--guard", "--steps", "70", "--poison", "60"],
    "resnet18-step4": [str(ZOO / "resnet_bad_batch.py"), "--poison", "4", "--steps", "8"],
    "resnet18-lr1e6": [str(ZOO / "resnet_bad_batch.py"), "--poison", "0", "--lr", "1e6", "--steps", "8"],
    "resnet18-step300": [str(ZOO / "resnet_bad_batch.py"), "--poison", "300", "--steps", "310"],
    "kg-two-phases": [str(ZOO / "kg_two_phase.py"), "--bad_phase", "tail", "--bad_step", "3"],
    "transe-pynative": [str(ZOO / "kg_two_phase.py"), "--mode", "pynative"],
    "ocr-ctc": [str(ZOO / "crnn_ctc.py"), "--bad_step", "5"],
    "gan-watch-raises": [str(ZOO / "gan_loader_watch.py")],
    "rotate-loss-scale": [str(ZOO / "kg_manual_loop.py")],
    "bert-fp16-step25": [str(ZOO / "bert_mask_fp16.py"), "--steps_per_epoch", "30", "--bad_step", "25"],
}


def _env() -> Dict[str, str]:
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    for key in [k for k in env if k.startswith("MINDGUARD_")]:
        env.pop(key)
    return env


def _timed(command: List[str], cwd: Path) -> "tuple[float, subprocess.CompletedProcess]":
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=1800)
    return time.perf_counter() - start, proc


def pair(shape: str, scratch: Path) -> Dict[str, object]:
    """One failing run and its printed hunt line, timed."""
    work = Path(tempfile.mkdtemp(prefix=f"{shape}_", dir=scratch))
    try:
        run_s, run = _timed([sys.executable, *SHAPES[shape]], work)
        match = re.search(r"^    (.* hunt --from .*)$", run.stderr, re.M)
        if match is None:
            raise RuntimeError(f"{shape}: the run printed no hunt line (exit {run.returncode}):\n{run.stderr[-3000:]}")
        hunt_s, hunt = _timed(shlex.split(match.group(1)), work)
        runs = sorted((work / "mindguard_runs").iterdir())
        summary = json.loads((runs[0] / "summary.json").read_text())
        record = json.loads((work / "mindguard_failure.json").read_text())
        return {"run_s": run_s, "hunt_s": hunt_s, "ratio": hunt_s / run_s, "hunt_exit": hunt.returncode,
                "route": summary["from_record"]["route"], "locate_dump": summary["from_record"].get("locate_dump"),
                "step": (summary.get("failure") or {}).get("global_step"), "record_step": record.get("global_step"),
                "kept_step": (record.get("kept_state") or {}).get("step"),
                "passes": sorted(p.name for p in runs[0].iterdir() if (p / "output.log").is_file())}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=sorted(SHAPES), help="a shape (repeatable)")
    parser.add_argument("--repeats", type=int, default=3, help="pairs per shape")
    parser.add_argument("--json", help="write every pair here")
    args = parser.parse_args(argv)
    shapes = args.only or list(SHAPES)
    scratch = Path(tempfile.mkdtemp(prefix="mindguard_fromrecord_"))
    results: Dict[str, List[Dict[str, object]]] = {s: [] for s in shapes}
    print(f"load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} CPUs)", flush=True)
    for r in range(args.repeats):
        for shape in shapes:
            done = pair(shape, scratch)
            results[shape].append(done)
            print(f"[{r + 1}/{args.repeats}] {shape}: run {done['run_s']:.1f}s, hunt --from {done['hunt_s']:.1f}s "
                  f"({done['ratio']:.2f}x), route {done['route']}, passes {done['passes']}, step "
                  f"{done['step']} (record {done['record_step']}, kept {done['kept_step']}), load "
                  f"{os.getloadavg()[0]:.2f}", flush=True)
    shutil.rmtree(scratch, ignore_errors=True)
    print("\n| shape | failing run | hunt --from | ratio (median [min-max]) | route, passes |")
    print("|---|---|---|---|---|")
    for shape, done in results.items():
        ratios = [float(d["ratio"]) for d in done]  # type: ignore[arg-type]
        print(f"| {shape} | {statistics.median(float(d['run_s']) for d in done):.1f} s "  # type: ignore[arg-type]
              f"| {statistics.median(float(d['hunt_s']) for d in done):.1f} s "  # type: ignore[arg-type]
              f"| **{statistics.median(ratios):.2f}x** [{min(ratios):.2f}-{max(ratios):.2f}] "
              f"| {done[-1]['route']}, {'+'.join(done[-1]['passes'])} |")  # type: ignore[arg-type]
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
