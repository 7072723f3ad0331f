"""``mindguard iteration`` and ``mindguard record``: dump-iteration arithmetic and failure records, printed.

Neither imports MindSpore, so both answer instantly.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import List, Tuple

from .._util.dist import rank_paths
from ..dump.config import ITERATION_MAX
from ..errors import MindguardError, RecordError
from ..protocol.record import FailureRecord, dump_iteration
from ..protocol.record_json import printable as _printable


def cli_iteration(args) -> int:
    """``mindguard iteration --epoch E --step S --steps-per-epoch N [--initial-iteration K]``."""
    try:
        iteration = dump_iteration(args.epoch, args.step, args.steps_per_epoch,
                                   initial_iteration=args.initial_iteration)
    except MindguardError as exc:
        print(f"mindguard iteration: error: {exc}", file=sys.stderr)
        return 2
    if iteration > ITERATION_MAX:
        print(f"mindguard iteration: error: dump iteration {iteration} is above {ITERATION_MAX} (2**32 - 1): "
              f"MindSpore counts dump iterations in 32 bits, so no dump has that iteration; check --epoch, --step "
              f"and --steps-per-epoch", file=sys.stderr)
        return 2
    n, e, s, k = args.steps_per_epoch, args.epoch, args.step, args.initial_iteration
    global_step = n * (e - 1) + s
    print(f"dump iteration {iteration}")
    print(f"  = steps_per_epoch * (epoch - 1) + step - 1 + initial_iteration = {n} * ({e} - 1) + {s} - 1 + {k}")
    print(f"  (global step {global_step} is 1-based; dump iterations are 0-based: put \"{iteration}\" in the dump "
          f"config's \"iteration\")")
    return 0


def cli_record(args) -> int:
    """``mindguard record PATH [--json]``: print a failure record (every rank's, when distributed)."""
    try:
        paths = rank_paths(args.path) or [Path(args.path)]
    except OSError as exc:   # a name over 255 bytes, a parent that is a file, ...
        print(f"mindguard record: error: cannot read failure record {_printable(repr(args.path))}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 2
    records: List[Tuple[Path, FailureRecord]] = []
    for path in paths:
        try:
            records.append((path, FailureRecord.load(path)))
        except RecordError as exc:
            print(f"mindguard record: error: {_printable(str(exc))}", file=sys.stderr)
            return 2
    if getattr(args, "json", False):
        payload = [r.to_dict() for _, r in records]
        print(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
        return 0
    for index, (path, record) in enumerate(records):
        if index:
            print()
        print(f"{_printable(str(path))}: {record.format()}")
        for key, value in record.to_dict().items():
            print(f"  {key:<18} {_printable(json.dumps(value))}")
        if record.status != "finished" and not record.kept_state and record.states and record.global_step:
            print(f"  {'last state on disk':<18} {_printable(_last_state(record))}")
    return 0


def _last_state(record: FailureRecord) -> str:
    """The state ``mindguard hunt --from`` resumes a record that names none from (a killed run's): its last complete
    one on disk (:func:`mindguard.protocol.kept_state.last_complete_state`)."""
    from ..protocol.kept_state import last_complete_state

    folder, meta = last_complete_state(Path(record.states or ""), int(record.global_step or 0), run_id=record.run_id)
    if folder is None or meta is None:
        return "none complete (mindguard hunt --from runs from step 1)"
    return f"global step {meta['step']} ({folder}): mindguard hunt --from resumes from it"
