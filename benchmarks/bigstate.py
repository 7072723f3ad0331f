"""Guard on a big-state model vs bare, side by side (issue 38): what keeping state costs at scale.

    python benchmarks/bigstate.py [--vocab 4000000] [--dim 32] [--steps 40] [--ckpt-every 10] [--out FILE]

The workload is tests/zoo/embedding_checkpoints.py (an embedding table + Momentum's moment of its size,
``Model.train``, ``ModelCheckpoint`` every ``--ckpt-every`` steps; 4,000,000 x 32 float32 = 0.51 GB of table, 1.02 GB
of state). Each run is a fresh process; in order:

1. healthy, bare and with ``Guard()`` (``--rounds`` times, alternating): the peak resident memory (``ru_maxrss``)
   and each step's wall time (begin to next begin, the callbacks included); reported: the peak ratio (<= 1.10),
   the slowest step against the median one (<= 3x), outside step 1 (the graph's first run) and the steps
   ``ModelCheckpoint`` writes a file in (seconds each for 1 GB, in the bare run as much), which are shown apart;
2. with ``Guard()``, failing at 90% of the run (``--poison``): the step its record's kept state begins (the resume
   point: within the last 10% of the run is the goal) and the wall time of that failing run;
3. the line that run printed (``mindguard hunt --from``), right after it: its wall time against the failing run's
   (<= 0.6x). Steps 2-3 run ``--hunts`` times (default 3); the median ratio is reported too.

Prints one JSON document (and writes it to ``--out``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Set

SCRIPT = Path(__file__).resolve().parents[1] / "tests" / "zoo" / "embedding_checkpoints.py"


def _env() -> Dict[str, str]:
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    return env


def _train(folder: Path, args: List[str], guard: bool, ckpt_every: int = 0) -> Dict[str, Any]:
    folder.mkdir(parents=True, exist_ok=True)
    stats = folder / "stats.json"
    command = [sys.executable, str(SCRIPT), *args, "--stats", str(stats)] + ([] if guard else ["--no_guard"])
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, env=_env(), capture_output=True, text=True, timeout=3600)
    seconds = time.perf_counter() - start
    data = json.loads(stats.read_text())
    steps = data["step_seconds"]   # [i]: from step i+1's begin to step i+2's (1-based steps)
    saving = {i for i in range(len(steps)) if ckpt_every and (i + 1) % ckpt_every == 0}   # ModelCheckpoint wrote
    others = [v for i, v in enumerate(steps) if i not in saving and i > 0]   # (step 1: the graph's first run)
    return {"seconds": round(seconds, 2), "returncode": proc.returncode,
            "peak_rss_gb": round(data["peak_rss"] / 1e9, 3),
            "median_step_s": round(statistics.median(steps), 4), "slowest_step_s": round(max(steps), 4),
            "first_step_s": round(steps[0], 3), "checkpoint_steps_s": [round(steps[i], 2) for i in sorted(saving)],
            "slowest_other_step_s": round(max(others), 4) if others else None,
            "steps": len(steps) + 1, "stderr": proc.stderr, "command": command}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=4_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--ckpt-every", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--hunts", type=int, default=3, help="failing runs, each followed by its hunt --from")
    parser.add_argument("--out", default=None)
    cfg = parser.parse_args()
    base = ["--vocab", str(cfg.vocab), "--dim", str(cfg.dim), "--steps", str(cfg.steps),
            "--ckpt-every", str(cfg.ckpt_every)]
    poison = max(2, round(cfg.steps * 0.9))
    root = Path(tempfile.mkdtemp(prefix="mindguard-bigstate-"))
    keep: Set[Path] = set()   # the folders of failing runs that kept no state
    result: Dict[str, Any] = {"state_gb": round(2 * cfg.vocab * cfg.dim * 4 / 1e9, 3), "steps": cfg.steps,
                              "ckpt_every": cfg.ckpt_every, "healthy": []}
    try:
        for round_ in range(cfg.rounds):
            pair = {}
            for guard in ((False, True) if round_ % 2 == 0 else (True, False)):
                run = _train(root / f"healthy-{round_}-{'guard' if guard else 'bare'}", base + ["--poison", "0"], guard,
                             cfg.ckpt_every)
                pair["guard" if guard else "bare"] = {k: v for k, v in run.items() if k not in ("stderr", "command")}
            pair["peak_ratio"] = round(pair["guard"]["peak_rss_gb"] / pair["bare"]["peak_rss_gb"], 3)
            pair["slowest_over_median"] = {  # outside the steps ModelCheckpoint writes in (bare's too) and step 1
                name: round(pair[name]["slowest_other_step_s"] / pair[name]["median_step_s"], 2)
                for name in ("guard", "bare")}
            result["healthy"].append(pair)
        result["failing"], result["hunt_from"] = [], []
        for attempt in range(cfg.hunts):   # the failing run, then the line it printed, at once (as a user would)
            folder = root / f"failing-{attempt}"
            failing = _train(folder, base + ["--poison", str(poison)], True)
            record = json.loads((folder / "mindguard_failure.json").read_text())
            kept = (record.get("kept_state") or {}).get("step")
            result["failing"].append({
                "poison": poison, "record_step": record.get("global_step"), "kept_step": kept,
                "kept_within_last_10pct": kept is not None and poison - kept <= cfg.steps // 10,
                "seconds": failing["seconds"],
                "said": [ln[:300] for ln in failing["stderr"].splitlines() if "mindguard" in ln][:6],
                "record": {k: record.get(k) for k in ("failure_window", "params_finite_after", "param_checks",
                                                      "kind")}})
            line = next(line.strip() for line in failing["stderr"].splitlines() if " hunt --from " in line)
            start = time.perf_counter()
            hunt = subprocess.run(shlex.split(line), cwd=folder, env=_env(), capture_output=True, text=True,
                                  timeout=3600)
            seconds = time.perf_counter() - start
            result["hunt_from"].append({
                "seconds": round(seconds, 2), "returncode": hunt.returncode,
                "over_failing_run": round(seconds / failing["seconds"], 2),
                "route": [ln[:300] for ln in hunt.stderr.splitlines() if "training state kept" in ln
                          or "plain hunt" in ln or "dumped global step" in ln or "holds no dump file" in ln]})
            if kept is None:   # kept for a look: why no resume point
                print(f"the failing run kept no state: its folder is left in {folder}", file=sys.stderr)
                keep.add(folder)
        result["hunt_over_failing_median"] = statistics.median(h["over_failing_run"] for h in result["hunt_from"])
    finally:
        for name in list(root.iterdir()):
            if name not in keep:
                shutil.rmtree(name, ignore_errors=True)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    text = json.dumps(result, indent=1)
    print(text)
    if cfg.out:
        Path(cfg.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
