"""The line Guard prints at a failure: where the training failed, and the one command that examines it
(``mindguard hunt --from <record> -- <the user's command>``). Printed once per run, on rank 0 (under msrun on each
node's first rank, naming that node's launcher command), outside the hunt."""
from __future__ import annotations

import shlex
import shutil
import sys
from pathlib import Path
from typing import Optional

import os

from ..._util.dist import rank_info
from ...protocol.attach import original_command
from ...protocol.cluster import launcher_argv, launcher_line, node_note, says_hunt_line
from ...protocol.record import FailureRecord, Phase


def hunt_from_line(failure: FailureRecord, record: Path) -> str:
    """What Guard prints at ``failure``: where, and the command that examines it from ``record`` (the run's own
    kept record when there is one)."""
    front = "mindguard" if shutil.which("mindguard") else f"{shlex.quote(sys.executable)} -m mindguard"
    command = shlex.join(failure.argv or [sys.executable, *sys.argv])
    launcher = launcher_argv() if rank_info()[1] > 1 else None   # [nodes hook] under msrun: its command
    if launcher is not None:
        command = launcher_line(launcher, shutil.which("msrun"))
    typed = original_command()   # `mindguard run -- COMMAND` (issue 53): the command as the user typed it
    if typed is not None:
        command = shlex.join(typed)
    loader = failure.phase == Phase.LOADER
    what = f"{failure.kind}: its batch could not be made, the script's data loader raised" if loader else failure.kind
    ask = ("For the step, the line and the sample in one report" if loader
           else "To find the operator and the line that made it")
    return (f"mindguard: training failed at {failure.position()} ({what}). {ask}, "
            f"run{node_note(launcher, failure.rank, failure.stopped_by_rank)}:\n    {front} "
            f"hunt --from {shlex.quote(str(record))} -- {command}")


class HuntLine:
    """Whether the run printed its hunt line yet (:meth:`say` prints it at most once)."""

    def __init__(self) -> None:
        self.told = False

    def say(self, failure: FailureRecord, record: Path, *, under_hunt: bool) -> None:
        """At the first failure worth examining, outside the hunt, on rank 0 (under msrun: on each node's first
        rank, each node needs its own launcher's line): print the command that examines it."""
        if self.told or under_hunt or not says_hunt_line(os.environ, rank_info()[0]):   # [nodes hook]
            return
        self.told = True
        print(hunt_from_line(failure, record), file=sys.stderr, flush=True)


def callback_note(failure: Optional[FailureRecord], exc: Optional[BaseException] = None) -> str:
    """What Guard says when a callback of the script's raised its own error (the record's ``raised_by``): whose
    error it is, and that it is not the training's ("" for any other failure)."""
    raised_by = failure.raised_by if failure is not None else None
    if failure is None or not raised_by:
        return ""
    if exc is not None:
        text = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
    else:
        text = (failure.message or "").split(" [raised by ", 1)[0]
    line = raised_by.get("line")
    return (f"mindguard: the callback {raised_by['callback']} raised {text.rstrip(': ')} in {raised_by['hook']}"
            f"{f' ({line})' if line else ''} at {failure.position()} -- not a failure of the training; no hunt "
            f"needed (the exception goes on unchanged)")
