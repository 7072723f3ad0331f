"""What ``Guard()`` adds to the start of a training: side by side with the bare script, in one run.

    python benchmarks/startup.py [--processes 7] [--rounds 15] [--steps 8]

Two figures (issue 50: start-up <= 0.10 s per training):

* **first training of a process**: fresh processes in pairs, bare and with Guard, alternating; each builds the same
  MLP, then times from just before ``import mindguard`` + ``Guard()`` (nothing, bare) to the end of a
  ``model.train`` of ``--steps`` steps (its compile included, in both). The difference of each pair's times is what
  Guard's import, set-up and first call add (its per-step cost over ``--steps`` steps included: at ~0.1 ms a step,
  under 1 ms).
* **every later training call**: one process, one Model per variant compiled in round 0, then ``--rounds`` rounds in
  which each variant trains ``--steps`` steps (a new ``Guard()`` per call, as a script's loop over epochs makes one);
  the median of the paired differences is Guard's set-up and tear-down per call.

Prints the medians, the ranges and the ratios to bare.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import List

CHILD = r"""
import json, sys, time
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Model
guarded, steps = sys.argv[1] == "guard", int(sys.argv[2])
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
ms.set_seed(1)
net = nn.SequentialCell([nn.Dense(32, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 1)])
model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9))
rng = np.random.RandomState(0)
data = ds.NumpySlicesDataset({"x": rng.randn(16 * steps, 32).astype(np.float32),
                              "y": rng.randn(16 * steps, 1).astype(np.float32)}, shuffle=False).batch(16)
start = time.perf_counter()
callbacks = []
if guarded:
    import mindguard
    callbacks = [mindguard.Guard()]
model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
print(json.dumps({"seconds": time.perf_counter() - start}))
"""


def first_training(processes: int, steps: int) -> List[float]:
    """Guard's extra seconds over bare for the first training of a fresh process, one per pair."""
    extra = []
    with tempfile.TemporaryDirectory() as scratch:
        env = dict(os.environ, GLOG_v="3")
        for key in [k for k in env if k.startswith("MINDGUARD")]:
            env.pop(key)
        for i in range(processes):
            seconds = {}
            for variant in (("bare", "guard") if i % 2 == 0 else ("guard", "bare")):
                out = subprocess.run([sys.executable, "-c", CHILD, variant, str(steps)], cwd=scratch, env=env,
                                     capture_output=True, text=True, check=True).stdout
                seconds[variant] = json.loads(out.strip().splitlines()[-1])["seconds"]
            extra.append(seconds["guard"] - seconds["bare"])
    return extra


def later_calls(rounds: int, steps: int) -> List[float]:
    """Guard's extra seconds over bare for a training call after the first, one per round."""
    import numpy as np
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    import mindguard

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rng = np.random.RandomState(0)
    arrays = {"x": rng.randn(16 * steps, 32).astype(np.float32), "y": rng.randn(16 * steps, 1).astype(np.float32)}

    def build():
        net = nn.SequentialCell([nn.Dense(32, 256), nn.ReLU(), nn.Dense(256, 256), nn.ReLU(), nn.Dense(256, 1)])
        return Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.01, 0.9)), \
            ds.NumpySlicesDataset(arrays, shuffle=False).batch(16)

    variants = {"bare": build(), "guard": build()}
    extra = []
    with tempfile.TemporaryDirectory() as scratch:
        record = os.path.join(scratch, "mindguard_failure.json")
        for r in range(rounds + 1):
            seconds = {}
            for name in (("bare", "guard") if r % 2 == 0 else ("guard", "bare")):
                model, data = variants[name]
                callbacks = [mindguard.Guard(record=record)] if name == "guard" else []
                start = time.perf_counter()
                model.train(1, data, callbacks=callbacks, dataset_sink_mode=False)
                seconds[name] = time.perf_counter() - start
            if r:   # round 0 compiles
                extra.append(seconds["guard"] - seconds["bare"])
    return extra


def _line(label: str, values: List[float]) -> str:
    return (f"{label}: median +{statistics.median(values):.3f} s (range {min(values):+.3f} to {max(values):+.3f}, "
            f"{len(values)} pairs)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=7, help="fresh-process pairs")
    parser.add_argument("--rounds", type=int, default=15, help="paired rounds of later training calls")
    parser.add_argument("--steps", type=int, default=8, help="steps per training call")
    args = parser.parse_args()
    print(_line(f"Guard's start-up, first training of a process ({args.steps} steps)",
                first_training(args.processes, args.steps)), flush=True)
    print(_line(f"Guard's start-up, each later training call ({args.steps} steps)",
                later_calls(args.rounds, args.steps)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
