"""``mindguard demo``: the field report's day of work, in one command, on a CPU, in under a minute.

It trains :mod:`mindguard.demos.norm_nan` (a training that silently goes NaN) with ``Guard()`` left in, runs the
``mindguard hunt --from`` command Guard printed, then checks the fix with ``mindguard verify`` (the fixed script
from the kept state through the failing steps, not a training from step 1), and exits 0 when the culprit was found
and the fix holds.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from .. import hunt as _hunt
from .._util.io import read_json
from ..dump.config import ENV_VAR as DUMP_ENV_VAR
from ..errors import HuntError
from ..protocol import folder as layout
from ..protocol.folder import RunFolder
from ..protocol.request import HuntRequest


_INTRO = """\
mindguard demo: a small embedding model (Embedding(padding_idx=0) -> nn.Norm -> Dense) trains fine for
an epoch; in epoch 2 the first padded sentence arrives, and its weights silently turn NaN.

  1. The training runs with mindguard.Guard() left in, as every run can: it stops at the failure, writes
     its record and the training state it kept, and prints the one command that examines it.
  2. That command, `mindguard hunt --from RECORD -- COMMAND`, starts from the kept state (no re-training
     from step 1), finds the exact step, dumps it, and names the operator, the source line, the zero
     input and the fix -- which it runs on a scratch copy of the code before printing it.
  3. `mindguard verify --from RECORD -- COMMAND` runs the fixed script (nn.Norm swapped for
     mindguard.SafeNorm) from the same kept state through the failing steps, every step checked, and
     says whether the fix holds -- again without re-training from step 1."""


def cli_demo(args) -> int:
    try:
        return _demo(args)
    except HuntError as exc:
        print(f"mindguard demo: error: {exc}", file=sys.stderr)
        return 2


def _train(script: list, folder: Path) -> subprocess.CompletedProcess:
    """Run the demo's training in ``folder`` (its record is written there), its output passed through."""
    folder.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    HuntRequest.clear(env)
    env.pop(DUMP_ENV_VAR, None)
    return subprocess.run(script, cwd=folder, env=env)


def _demo(args) -> int:
    run = Path(args.run_dir).resolve() if args.run_dir else _hunt.new_run_dir()
    script = [sys.executable, "-m", "mindguard.demos.norm_nan", "--mode", args.mode]
    print(_INTRO, flush=True)
    print(f"\n$ python -m mindguard.demos.norm_nan --mode {args.mode}        # with mindguard.Guard()\n", flush=True)
    _train(script, run / "train")
    record_path = run / "train" / layout.DEFAULT_RECORD
    record = read_json(record_path) if record_path.is_file() else {}
    if record.get("status") != "failed":
        print(f"\nmindguard demo: expected the training to fail and Guard to record it, but its record is "
              f"{record.get('status')!r}; see {run / 'train'}", file=sys.stderr)
        return 1
    print(f"\n$ mindguard hunt --from {record_path} -- python -m mindguard.demos.norm_nan --mode {args.mode}\n",
          flush=True)
    _hunt.hunt(script, run_dir=run / "hunt", from_record=record_path)
    summary = read_json(RunFolder(run / "hunt").summary)
    if summary.get("outcome") != "failure_found":
        print(f"\nmindguard demo: expected the hunt to find and explain the failure, but its outcome is "
              f"{summary.get('outcome')!r}; see {run / 'hunt'}", file=sys.stderr)
        return 1
    print(f"\n$ mindguard verify --from {record_path} -- python -m mindguard.demos.norm_nan --mode {args.mode} --safe"
          f"    # nn.Norm -> mindguard.SafeNorm\n", flush=True)
    from ..hunt.verify import verify

    code = verify(script + ["--safe"], record=record_path, run_dir=run / "verify")
    if code != 0:
        print(f"\nmindguard demo: the fix should hold from the kept state, but `mindguard verify` exited {code}; see "
              f"{run / 'verify'}", file=sys.stderr)
        return 1
    print(f"\nmindguard demo: found the culprit from the failing run, and checked that the fix holds -- neither "
          f"trained from step 1. Everything is in {run}", flush=True)
    return 0
