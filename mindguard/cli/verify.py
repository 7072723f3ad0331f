"""``mindguard verify --from RECORD [--steps K] [--from-start] -- COMMAND...``: does the fix hold? Runs the edited
command from the failing run's kept training state through the failing steps (:mod:`mindguard.hunt.verify`).

Exit codes: 0 the fix holds, 1 still failing, 2 cannot verify (or bad arguments), 130 interrupted."""
from __future__ import annotations

import argparse
import sys

from .._util.io import console_write
from ..errors import HuntError
from .hunt import command_of


def cli_verify(args: argparse.Namespace) -> int:
    from ..hunt.verify import verify

    command = command_of(args)
    try:
        return verify(command, record=args.from_record, steps=args.steps, from_start=args.from_start,
                      run_dir=args.run_dir, timeout=args.timeout)
    except HuntError as exc:
        console_write(f"mindguard verify: error: {exc}\n", sys.stderr)
        return 2
