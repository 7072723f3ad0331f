"""``mindguard hunt [options] -- COMMAND...``: record -> examine -> explain (:mod:`mindguard.hunt`)."""
from __future__ import annotations

import sys

from ..errors import HuntError


def cli_hunt(args) -> int:
    from ..hunt import hunt

    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        return hunt(command, run_dir=args.run_dir, timeout=args.timeout, net_name=args.net_name,
                    resume=getattr(args, "resume", "auto"), keep_every=getattr(args, "keep_every", None),
                    dump_scope=getattr(args, "dump_scope", None), from_record=getattr(args, "from_record", None))
    except HuntError as exc:
        print(f"mindguard hunt: error: {exc}", file=sys.stderr)
        return 2
