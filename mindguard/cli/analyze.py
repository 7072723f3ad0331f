"""``mindguard analyze DUMP_DIR``: find the first operator that made Inf/NaN in a dump."""
from __future__ import annotations


def cli_analyze(args) -> int:
    from ..analysis.cli import cli_analyze as run

    return run(args)
