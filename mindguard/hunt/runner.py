"""Runs a pass of the hunt as a process tree (:class:`ProcessRunner`) and collects what it left as a typed
:class:`~mindguard.hunt.result.PassResult`: every rank's record and ``pass_status.json``, how the tree ended.

Decides nothing: the executor does, on the result. Never imports MindSpore.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .._util import dist as _dist
from .._util.io import atomic_write_json
from ..dump.config import ENV_VAR as DUMP_ENV_VAR
from ..protocol import attach, pass_status
from ..protocol.folder import RunFolder
from ..protocol.request import HuntRequest
from .passes import _Pass, _read_records, disk_full
from .result import PassResult, PassSpec


class ProcessRunner:
    """Runs the user's ``command`` for each pass, in the run folder ``run`` (``timeout``: seconds per pass)."""

    def __init__(self, command: Sequence[str], run: Path, timeout: Optional[float], *, cwd: Optional[Path] = None,
                 env: Optional[Dict[str, str]] = None, quiet: bool = False):
        self.command, self.run_dir, self.timeout = list(command), run, timeout
        self.folder = RunFolder(run)
        # the fix check (hunt/fix_check.py): a scratch copy's folder, its PYTHONPATH, nothing on the console
        self.cwd, self.extra_env, self.quiet = cwd, dict(env or {}), quiet

    def environment(self, request: HuntRequest, dump_config: Optional[Path]) -> Dict[str, str]:
        """The user's environment with the hunt's request (and no request or dump config of another hunt)."""
        env = dict(os.environ)
        HuntRequest.clear(env)
        env.pop(DUMP_ENV_VAR, None)
        env.update(request.to_environ())
        env.update(self.extra_env)   # (before attaching: its PYTHONPATH keeps the scratch copy's, after its own)
        env.update(attach.environment(env, self.command))   # an unmodified script gets Guard (issue 53)
        env.setdefault("PYTHONUNBUFFERED", "1")
        if dump_config is not None:
            env[DUMP_ENV_VAR] = str(dump_config)
        return env

    def run(self, spec: PassSpec) -> PassResult:
        folder = self.folder.pass_folder(spec.name)
        pass_status.reserve(spec.request.record)   # its room, while the disk has some: the process writes it
        config = None
        if spec.dump is not None:
            config = folder.dump_config
            atomic_write_json(config, spec.dump.to_dict())
        this_pass = _Pass(spec.label, self.command, self.environment(spec.request, config), folder.output_log,
                          spec.request.record, self.timeout, cwd=self.cwd, quiet=self.quiet)
        returncode = this_pass.run()
        records = _read_records(spec.request.record)
        rank_records: List[Path] = _dist.rank_paths(spec.request.record) or [Path(spec.request.record)]
        return PassResult(name=spec.name, label=spec.label, folder=folder, returncode=returncode, records=records,
                          statuses=pass_status.read_all(rank_records), log_path=this_pass.log_path,
                          log_error=this_pass.log_error, stopped=this_pass.stopped, signal=this_pass.signal,
                          disk_full=disk_full(self.run_dir), tail=this_pass.tail())


__all__ = ["ProcessRunner"]
