"""``mindguard demo``: the field report's day of work, in one command, on a CPU, in under a minute.

It runs ``mindguard hunt`` on :mod:`mindguard.demos.norm_nan` (a training that silently goes NaN),
then the same hunt on the fixed model, and exits 0 when the culprit was found and the fix holds.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import hunt as _hunt
from ..errors import HuntError
from .._io import read_json


_INTRO = """\
mindguard demo: a small embedding model (Embedding(padding_idx=0) -> nn.Norm -> Dense) trains fine for
an epoch; in epoch 2 the first padded sentence arrives, and its weights silently turn NaN.

  1. `mindguard hunt` runs the training: pass 1 names the step whose update went bad, pass 2 dumps
     exactly that iteration, and the analyzer names the operator, the source line, the zero input
     and the fix.
  2. The same hunt on the fixed model (nn.Norm swapped for mindguard.SafeNorm): no failure."""


def cli_demo(args) -> int:
    try:
        return _demo(args)
    except HuntError as exc:
        print(f"mindguard demo: error: {exc}", file=sys.stderr)
        return 2


def _demo(args) -> int:
    run = Path(args.run_dir).resolve() if args.run_dir else _hunt.new_run_dir()
    script = [sys.executable, "-m", "mindguard.demos.norm_nan", "--mode", args.mode]
    print(_INTRO, flush=True)
    print(f"\n$ mindguard hunt -- python -m mindguard.demos.norm_nan --mode {args.mode}\n", flush=True)
    _hunt.hunt(script, run_dir=run / "hunt")
    outcome = read_json(run / "hunt" / "summary.json").get("outcome")
    if outcome != "failure_found":
        print(f"\nmindguard demo: expected the hunt to find and explain the failure, but its outcome is "
              f"{outcome!r}; see {run / 'hunt'}", file=sys.stderr)
        return 1
    print(f"\n$ mindguard hunt -- python -m mindguard.demos.norm_nan --mode {args.mode} --safe"
          "    # nn.Norm -> mindguard.SafeNorm\n", flush=True)
    _hunt.hunt(script + ["--safe"], run_dir=run / "fixed")
    outcome = read_json(run / "fixed" / "summary.json").get("outcome")
    if outcome != "healthy":
        print(f"\nmindguard demo: the fixed model should train clean, but the hunt's outcome is {outcome!r}; "
              f"see {run / 'fixed'}", file=sys.stderr)
        return 1
    print(f"\nmindguard demo: found the culprit, and the fix trains clean. Everything is in {run}", flush=True)
    return 0
