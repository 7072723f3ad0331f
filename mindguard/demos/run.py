"""``mindguard demo``: the field report's day of work, in one command, on a CPU, in under a minute.

It runs ``mindguard hunt`` on :mod:`mindguard.demos.norm_nan` (a training that silently goes NaN),
then the same hunt on the fixed model, and exits 0 when the culprit was found and the fix holds.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import hunt as _hunt


_INTRO = """\
mindguard demo: a small embedding model (Embedding(padding_idx=0) -> nn.Norm -> Dense) trains fine for
an epoch; in epoch 2 the first padded sentence arrives, and its weights silently turn NaN.

  1. `mindguard hunt` runs the training: pass 1 names the step whose update went bad, pass 2 dumps
     exactly that iteration, and the analyzer names the operator, the source line, the zero input
     and the fix.
  2. The same hunt on the fixed model (nn.Norm swapped for mindguard.SafeNorm): no failure."""


def cli_demo(args) -> int:
    run = Path(args.run_dir).resolve() if args.run_dir else _hunt.new_run_dir()
    script = [sys.executable, "-m", "mindguard.demos.norm_nan", "--mode", args.mode]
    print(_INTRO, flush=True)
    print(f"\n$ mindguard hunt -- python -m mindguard.demos.norm_nan --mode {args.mode}\n", flush=True)
    code = _hunt.hunt(script, run_dir=run / "hunt")
    if code != 1:
        print(f"\nmindguard demo: expected the hunt to find the failure, but it ended with exit code {code}; "
              f"see {run / 'hunt'}", file=sys.stderr)
        return 1
    print(f"\n$ mindguard hunt -- python -m mindguard.demos.norm_nan --mode {args.mode} --safe"
          "    # nn.Norm -> mindguard.SafeNorm\n", flush=True)
    fixed = _hunt.hunt(script + ["--safe"], run_dir=run / "fixed")
    if fixed != 0:
        print(f"\nmindguard demo: the fixed model still failed (exit code {fixed}); see {run / 'fixed'}",
              file=sys.stderr)
        return 1
    print(f"\nmindguard demo: found the culprit, and the fix trains clean. Everything is in {run}", flush=True)
    return 0
