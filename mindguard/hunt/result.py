"""What one pass of the hunt left, typed: :class:`PassResult` (its records, its processes' statuses, its folder, how
its process tree ended) and the failure it found (:class:`Failure`).

Everything the executor decides on is here, read from files the training process wrote through
:mod:`mindguard.protocol` (records, ``pass_status.json``) or observed by the hunt itself (the exit status, a stop
it made) -- never from the pass's output, which is kept for the user to read (:attr:`PassResult.log_path`).

Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Optional, Protocol, Tuple

from ..dump.config import DumpConfig
from ..protocol import folder as layout
from ..protocol.pass_status import DatasetError, Diverged, MindguardFailure, Overridden, PassStatus
from ..protocol.request import HuntRequest
from ..protocol.signals import kill_cause, stopped_from_outside
from ..errors import RecordError
from ..protocol.record import FailureRecord

Record = Dict[str, Any]

#: How the hunt stopped a pass (it did not end by itself): the user stopped the hunt (Ctrl-C, ``kill <hunt>``, a
#: closed terminal), or the pass ran past ``--timeout``.
Stop = Literal["interrupted", "timed_out"]


def read(record: Record) -> FailureRecord:
    """A pass's record (the JSON object the summary keeps) read through its fields, as written
    (:meth:`FailureRecord.as_written`: a record a failing process left is read, not refused)."""
    return FailureRecord.as_written(record)


@dataclass(frozen=True)
class Failure:
    """The failure a pass found: its record (as the summary keeps it) and, when the hunt made the failure from a
    process that died in a step, the signal that killed it (``killed_by``) or the exit code it died with."""

    record: Record
    killed_by: Optional[int] = None
    died_with: Optional[int] = None

    @property
    def typed(self) -> FailureRecord:
        return read(self.record)

    @property
    def step(self) -> int:
        """The 1-based global step (0: before the first)."""
        return int(self.typed.global_step or 0)

    @property
    def kind(self) -> Optional[str]:
        return self.typed.kind


@dataclass(frozen=True)
class PassSpec:
    """A pass to run: its folder's name, the label it is said with, what the training process is asked
    (``request``), and the dump config to arm (``None``: none)."""

    name: layout.PassName
    label: str
    request: HuntRequest
    dump: Optional[DumpConfig] = None


class PassRunner(Protocol):
    """Runs a pass and says what it left (:class:`mindguard.hunt.runner.ProcessRunner` runs the user's command; a
    test's fake returns prepared results)."""

    def run(self, spec: PassSpec) -> "PassResult": ...


@dataclass
class PassResult:
    """One pass: where it ran (``folder``), how its process tree ended (``returncode``; ``stopped``:
    ``"interrupted"`` | ``"timed_out"`` when the hunt stopped it, with ``signal``), every rank's record and status."""

    name: layout.PassName
    label: str
    folder: layout.PassFolder
    returncode: int
    records: List[Record] = field(default_factory=list)
    statuses: List[PassStatus] = field(default_factory=list)
    log_path: Path = Path()
    log_error: Optional[OSError] = None
    stopped: Optional[Stop] = None
    signal: Optional[int] = None
    disk_full: Optional[str] = None   # the run folder's disk was full when the pass ended (the hunt looked)
    tail: str = ""                    # the end of the pass's output: shown to the user, never decided on

    # -- the facts, over every rank ------------------------------------------------------------------------
    @property
    def typed(self) -> List[FailureRecord]:
        return [read(r) for r in self.records]

    @property
    def any_failed(self) -> bool:
        return any(r.status == "failed" for r in self.typed)

    @property
    def diverged(self) -> Optional[Diverged]:
        """Why a resumed pass computes something else than the recorded run (its first rank that said so)."""
        return next((s.diverged for s in self.statuses if s.diverged is not None), None)

    @property
    def cannot_continue(self) -> Optional[str]:
        return next((s.cannot_continue for s in self.statuses if s.cannot_continue), None)

    @property
    def mindguard_error(self) -> Optional[MindguardFailure]:
        return next((s.mindguard_error for s in self.statuses if s.mindguard_error is not None), None)

    @property
    def replay_failed(self) -> Optional[str]:
        return next((s.replay_failed for s in self.statuses if s.replay_failed), None)

    @property
    def sink_refused(self) -> bool:
        return any(s.sink_refused for s in self.statuses)

    @property
    def dataset_error(self) -> Optional[DatasetError]:
        return next((s.dataset_error for s in self.statuses if s.dataset_error is not None), None)

    @property
    def overridden(self) -> Optional[Overridden]:
        """Script edits the kept state overrode in a resumed pass (its first rank that said so)."""
        return next((s.overridden for s in self.statuses if s.overridden is not None), None)

    @property
    def no_space(self) -> Optional[str]:
        return next((s.no_space for s in self.statuses if s.no_space), None)

    @property
    def not_attached(self) -> Optional[str]:
        """What the attach hook could not attach Guard to, and the line to add (issue 53), as a process said it."""
        return next((s.not_attached for s in self.statuses if s.not_attached), None)

    @property
    def said_anything(self) -> bool:
        """Whether any process of the pass wrote a status (mindguard ran in it under the hunt)."""
        return bool(self.statuses)

    @property
    def reached(self) -> int:
        """The last global step any rank's record reached (0: none)."""
        return max((int(r.global_step or 0) for r in self.typed), default=0)

    def ended_early(self) -> Optional[int]:
        """The global step (0: before the first) of a run whose process ended while its record still says
        ``running`` and recorded no failure, else ``None``: the process went away without Python unwinding. Read
        from both sources of how a pass ended: the records (where it was), and each process's own word
        (:attr:`PassStatus.ended <mindguard.protocol.pass_status.PassStatus.ended>`): when every process of the pass
        said how it ended, it unwound, and did not end early."""
        typed = self.typed
        if not typed or any(r.status == "failed" for r in typed):
            return None
        if len(self.statuses) >= len(typed) and all(s.ended is not None for s in self.statuses):
            return None
        running = [r for r in typed if r.status == "running"]
        if not running:
            return None
        return max(int(r.global_step or 0) for r in running)

    def step_window(self, step: Optional[int]) -> Optional[List[int]]:
        """The wall-clock window (epoch µs) of global step ``step`` over every rank's record: ranks run the step
        at nearly, not exactly, the same time."""
        windows = [r.step_window_us for r in self.typed if r.global_step == step and r.step_window_us]
        if not windows:
            return None
        return [min(w[0] for w in windows), max(w[1] for w in windows)]

    def first_failure(self) -> Optional[Failure]:
        """The failure of this pass: a "failed" record, else a "running" one if the process died mid-step (killed
        by a signal other than a stop from outside; under a launcher, any exit code stands for a worker's death).
        A record of kind ``interrupted`` (the user stopped the training) is not a failure to hunt."""
        typed = list(zip(self.records, self.typed))
        failed = [Failure(raw) for raw, r in typed if r.status == "failed" and r.kind != "interrupted"]
        rc = self.returncode
        died = rc < 0 or any((r.group_size or 1) > 1 for _, r in typed)
        if not failed and rc != 0 and died and not stopped_from_outside(rc):
            message = (f"the process was killed by signal {-rc} ({kill_cause(-rc)}) during this step" if rc < 0
                       else f"the process exited with code {rc} during this step")
            failed = [Failure(dict(raw, kind="exception", message=message), killed_by=-rc if rc < 0 else None,
                              died_with=rc if rc > 0 else None)
                      for raw, r in typed if r.status == "running" and r.global_step]
        if not failed:
            return None

        def first(f: Failure) -> Tuple[int, bool, int]:
            """The rank that went bad first; on a tie, the one that saw the cause (not merely stopped for it)."""
            r = f.typed
            return r.global_step or 0, r.stopped_by_rank is not None, r.rank or 0

        return min(failed, key=first)


def progress(records: List[Record]) -> Optional[str]:
    """Where the latest of a pass's records is (``"epoch 1, step 3/8 (global step 3)"``; ``"starting"`` before
    the first step), or ``None`` (no record, or one of another mindguard version: progress is only informative)."""
    if not records:
        return None
    latest = max(records, key=lambda rec: rec.get("global_step") or 0)
    if not latest.get("global_step"):
        return "starting"
    try:
        return FailureRecord.from_dict(latest, source="failure record").position()
    except RecordError:
        return None
