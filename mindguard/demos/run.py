"""``mindguard demo``: the field report's day of work, in one command, on a CPU, in under a minute.

1. ``mindguard hunt`` runs the demo training (:mod:`mindguard.demos.norm_nan`): it silently goes NaN
   in epoch 2; pass 1 names the step whose update went bad, pass 2 dumps exactly that iteration, and
   the analyzer names the operator, the source line, the zero input and the fix.
2. The same hunt on the fixed model (``nn.Norm`` swapped for ``mindguard.SafeNorm``): no failure.
"""
from __future__ import annotations

import sys
from pathlib import Path

from .. import hunt as _hunt


def cli_demo(args) -> int:
    run = Path(args.run_dir).resolve() if args.run_dir else _hunt.new_run_dir()
    script = [sys.executable, "-m", "mindguard.demos.norm_nan", "--mode", args.mode]
    print(__doc__.split("\n\n")[1].replace("\n   ", "\n  "), flush=True)
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
