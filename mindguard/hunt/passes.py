"""The hunt's passes as processes: run the user's command once, copy its output through (and into a log),
show progress from its record, and stop it -- with every process it started -- when asked.

Steps are 1-based global steps (:mod:`mindguard.run`); this module never imports MindSpore.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import psutil

from .. import _dist
from .._io import read_json
from ..errors import HuntError, RecordError
from ..dump.config import OBSERVE_KERNEL_NAME
from ..record import FailureRecord


def _say(message: str) -> None:
    print(f"[mindguard hunt] {message}", file=sys.stderr, flush=True)


def _command_fix(program: str, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"; is it installed and on PATH? e.g. `mindguard hunt -- {sys.executable} train.py`"
    if isinstance(exc, PermissionError):
        kind = "a directory" if os.path.isdir(program) else "not executable"
        return f" ({program} is {kind}); run a script through its interpreter: `mindguard hunt -- python {program}`"
    return ""


class _Pass:
    """Run the user's command once, pass its output through (and into a log), show progress."""

    def __init__(self, name: str, command: Sequence[str], env: Dict[str, str], log_path: Path,
                 record_path: Path, timeout: Optional[float]):
        self.name, self.command, self.env = name, list(command), env
        self.log_path, self.record_path, self.timeout = log_path, record_path, timeout
        self.returncode: Optional[int] = None
        self.interrupted = False   # Ctrl-C, or `kill <hunt>`: the user stopped it
        self.timed_out = False     # --timeout

    @property
    def stopped(self) -> Optional[str]:
        """``"interrupted"`` or ``"timed_out"`` when the pass was stopped rather than ended by itself."""
        return "interrupted" if self.interrupted else "timed_out" if self.timed_out else None

    def run(self) -> int:
        start = time.monotonic()
        with open(self.log_path, "wb") as log:
            try:
                proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except OSError as exc:
                raise HuntError(f"cannot run {self.command[0]!r}: {exc.strerror or exc}"
                                f"{_command_fix(self.command[0], exc)}") from None
            copiers = [threading.Thread(target=_copy, args=(proc.stdout, sys.stdout, log), daemon=True),
                       threading.Thread(target=_copy, args=(proc.stderr, sys.stderr, log), daemon=True)]
            for t in copiers:
                t.start()
            previous_term = signal.getsignal(signal.SIGTERM)

            def forward_term(signum, frame):  # `kill <hunt>` stops the child too
                self.interrupted = True
                proc.send_signal(signal.SIGTERM)

            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, forward_term)
            last_shown = ""
            last_time = 0.0
            try:
                while True:
                    try:
                        self.returncode = proc.wait(timeout=1.0)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    elapsed = time.monotonic() - start
                    if self.timeout and elapsed > self.timeout:
                        _say(f"{self.name}: timed out after {self.timeout:.0f}s; stopping the command")
                        self.timed_out = True
                        _stop(proc)
                        self.returncode = proc.returncode
                        break
                    status = _progress(self.record_path)
                    if status and (status != last_shown and time.monotonic() - last_time > 2.0
                                   or time.monotonic() - last_time > 15.0):
                        _say(f"{self.name}: {status} ({elapsed:.0f}s)")
                        last_shown, last_time = status, time.monotonic()
            except KeyboardInterrupt:
                self.interrupted = True
                _say(f"{self.name}: interrupted; stopping the command")
                try:
                    _stop(proc, first=signal.SIGINT)
                except KeyboardInterrupt:   # a second Ctrl-C: no more waiting for the command to clean up
                    _say(f"{self.name}: interrupted again; killing the command")
                    _stop(proc, first=signal.SIGKILL)
                self.returncode = proc.returncode
            finally:
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, previous_term)
                for t in copiers:
                    t.join(timeout=5)
                for pipe in (proc.stdout, proc.stderr):
                    pipe.close()
        return self.returncode if self.returncode is not None else -1


#: MindSpore's warning about the observing dump's kernel entry, which matches no kernel on purpose (it makes the
#: dump write no tensors, only the iteration ids): mindguard's doing, not the user's, so not shown.
_OWN_NOISE = re.compile(rb"[^\n]*Unused Kernel in json: name-regex\(" + re.escape(OBSERVE_KERNEL_NAME.encode())
                        + rb"\)[^\n]*\n?")


def _copy(src, dst, log) -> None:
    out = getattr(dst, "buffer", dst)
    try:
        for chunk in iter(lambda: src.read1(65536), b""):
            if b"Unused Kernel" in chunk:
                chunk = _OWN_NOISE.sub(b"", chunk)
            for sink in (log, out):
                try:
                    sink.write(chunk)
                    sink.flush()
                except (OSError, ValueError):  # closed log (a grandchild outlived the pass) or terminal
                    pass
    except (OSError, ValueError):  # the pipe was closed under us
        pass

def _stop(proc: subprocess.Popen, first: int = signal.SIGTERM) -> None:
    """Stop the command (``first``, then SIGTERM, then SIGKILL) and every process it started.

    msrun starts its scheduler and workers in sessions of their own and leaves them running when it is
    terminated, so the process tree is noted first and what is left of it is stopped afterwards (psutil
    checks each process's creation time, so a reused pid is never signalled).
    """
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    for sig, wait in ((first, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            proc.send_signal(sig)
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    alive = [p for p in tree if p.is_running()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for child in alive:
            try:
                child.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=5)
        if not alive:
            break




def _progress(record_path: Path) -> Optional[str]:
    records = _read_records(record_path)
    if not records:
        return None
    latest = max(records, key=lambda rec: rec.get("global_step") or 0)
    if not latest.get("global_step"):
        return "starting"
    try:
        return FailureRecord.from_dict(latest, source="failure record").position()
    except RecordError:  # a record of another mindguard version: progress is only informative
        return None


def _read_records(record_path: Path) -> List[Dict[str, Any]]:
    out = []
    for path in _dist.rank_paths(record_path):
        try:
            out.append(read_json(path))
        except (OSError, ValueError):
            continue
    return out
