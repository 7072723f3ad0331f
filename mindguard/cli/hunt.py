"""``mindguard hunt [options] -- COMMAND...``: record -> examine -> explain (:mod:`mindguard.hunt`).

Signals (SIGINT, SIGTERM, SIGHUP, SIGQUIT) are handled by the hunt itself for its whole run
(:class:`mindguard.hunt.passes.Supervisor`): each stops the command's process tree and ends the hunt with its
summary written, exit 130."""
from __future__ import annotations

import argparse
import sys
from typing import List

from .._util.io import console_write
from ..errors import HuntError


def command_of(args: argparse.Namespace) -> List[str]:
    """The command after ``--`` on mindguard's command line (``hunt``, ``verify``), without the ``--``."""
    command = list(args.command)
    return command[1:] if command and command[0] == "--" else command


def cli_hunt(args: argparse.Namespace) -> int:
    from ..hunt import hunt

    command = command_of(args)
    try:
        return hunt(command, run_dir=args.run_dir, timeout=args.timeout, net_name=args.net_name,
                    resume=getattr(args, "resume", "auto"), keep_every=getattr(args, "keep_every", None),
                    dump_scope=getattr(args, "dump_scope", None), from_record=getattr(args, "from_record", None),
                    join_timeout=getattr(args, "join_timeout", None), cluster_port=getattr(args, "cluster_port", None),
                    check_fix=not getattr(args, "no_check_fix", False))
    except HuntError as exc:
        console_write(f"mindguard hunt: error: {exc}\n", sys.stderr)   # never raises: a closed stderr keeps exit 2
        return 2
