"""How a pass's training process ended, as the process itself saw it: ``pass_status.json`` beside its record.

The training process under ``mindguard hunt`` writes it (:func:`note`, the one writer); the hunt reads it
(:func:`read`, the one reader) and decides on these facts alone -- never on the pass's output, an exception's text
or a warning (a script that silences warnings, or a message reworded, must not change a verdict). Facts the process
cannot write itself -- a kill by a signal, a pass stopped by the hunt -- the hunt observes directly (the exit status).

Written at the moments a pass's process ends or learns something the hunt needs: the hunt stops it (it has what it
came for, or the resumed run diverged), it cannot continue (a record it cannot write, a dump config of the script's
own), a replay failed, and at interpreter exit (finished, a failure recorded, an uncaught exception: mindguard's own
error with its traceback as data, the dataset pipeline's error with the frame and the line that raised, MindSpore's
refusal of dataset sink mode in the pipeline's debug mode). Each :func:`note` keeps the facts written before it.

A disk that is full cannot take the file: the process reserves it when the pass begins (:func:`reserve`), and a
write that finds no space overwrites the reservation in place instead.

Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Literal, Mapping, Optional

from .._util.io import atomic_write_text
from .folder import PathLike, pass_status_beside

#: pass_status.json's format version: a reader refuses (reads as absent) any other.
SCHEMA = 1

#: How the process ended, as it saw it. ``finished``: it ran to its end with no failure recorded; ``failed``: a
#: failure of the training is recorded (the record says which); ``stopped``: the hunt's request ended it (it had
#: what it came for); ``diverged``: a resumed run computes something else than the recorded one (:class:`Diverged`);
#: ``cannot_continue``: the pass cannot do its work (:attr:`PassStatus.cannot_continue` says why); ``raised``: an
#: exception that is not a training failure ended it (mindguard's own: :attr:`PassStatus.mindguard_error`).
Ending = Literal["finished", "failed", "stopped", "diverged", "cannot_continue", "raised"]
ENDINGS = ("finished", "failed", "stopped", "diverged", "cannot_continue", "raised")


@dataclass(frozen=True)
class Diverged:
    """A resumed pass computes something else than the run that kept the state (it stopped at ``step``).
    ``unfit``: the kept state does not fit this run at all (another network, shapes); ``fast_forwarded``: the number
    of steps the dataset was reset past (``None``: it was iterated), when that reset is the suspect."""

    step: Optional[int]
    why: str
    unfit: bool = False
    fast_forwarded: Optional[int] = None


@dataclass(frozen=True)
class Overridden:
    """Edits of the script that the kept state overrode in a resumed pass (a learning rate held in a Parameter: the
    kept value is used), with the global step the state was kept at."""

    step: Optional[int]
    edits: List[str] = field(default_factory=list)


@dataclass(frozen=True)
class MindguardFailure:
    """mindguard's own code raised in the training process: the error line and the whole traceback, as data to
    show and report, never to parse."""

    error: str
    traceback: str = ""


@dataclass(frozen=True)
class DatasetError:
    """The dataset pipeline raised: the error (``"ValueError: ..."``, the innermost cause) and the frame of the
    user's code that raised it (``file``, 1-based ``line``, ``function``, ``code``), when known."""

    error: Optional[str] = None
    file: Optional[str] = None
    line: Optional[int] = None
    function: Optional[str] = None
    code: Optional[str] = None

    def source(self) -> Optional[Dict[str, Any]]:
        """The frame as a report's ``source`` (``file``, ``line``, ``function``, ``code``), or ``None``."""
        if self.file is None or self.line is None:
            return None
        return {"file": self.file, "line": self.line, "function": self.function, "code": self.code}


@dataclass(frozen=True)
class PassStatus:
    """How one training process of a pass ended (one per rank). Every field is a fact the process observed."""

    schema: int = SCHEMA
    # None: the process never got to say (killed, os._exit, still running). Read by the process itself (an earlier
    # note is not overwritten at exit: mindguard.training.child.pass_end) and by the hunt: a process that said how it
    # ended unwound, so it did not end early, whatever its record says (mindguard.hunt.result.PassResult.ended_early)
    ended: Optional[Ending] = None
    failure_kind: Optional[str] = None      # the recorded failure's kind (the record's ``kind``), when ``failed``
    stopped: Optional[str] = None           # what the hunt's request had when it stopped the process (display)
    cannot_continue: Optional[str] = None   # why the pass cannot do its work (said to the user as it is)
    mindguard_error: Optional[MindguardFailure] = None
    replay_failed: Optional[str] = None     # a captured step could not be replayed: the error
    sink_refused: bool = False              # MindSpore refused dataset sink mode with the pipeline synchronous
    dataset_error: Optional[DatasetError] = None
    diverged: Optional[Diverged] = None
    no_space: Optional[str] = None          # the run folder's disk was full when the process ended: how full
    overridden: Optional[Overridden] = None  # script edits the kept state overrode (a resumed pass)
    not_attached: Optional[str] = None      # the attach hook found a training it cannot attach to: what, and the
    #                                         line to add (mindguard.training.attach; shown as it is)

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Optional["PassStatus"]:
        """The status ``data`` holds, or ``None`` when it is not one of this version (another schema, wrong types)."""
        if data.get("schema") != SCHEMA or data.get("ended") not in (None, *ENDINGS):
            return None
        try:
            nested = {"mindguard_error": MindguardFailure, "dataset_error": DatasetError, "diverged": Diverged,
                      "overridden": Overridden}
            values: Dict[str, Any] = {}
            for f in dataclasses.fields(cls):
                value = data.get(f.name, f.default)
                if f.name in nested and isinstance(value, Mapping):
                    value = nested[f.name](**value)
                values[f.name] = value
            return cls(**values)
        except TypeError:
            return None


#: Bytes the process reserves for its status when the pass begins (:func:`reserve`); a status is far smaller.
RESERVED = 1 << 16


def reserve(record: PathLike) -> None:
    """At the pass's start: claim the status file's room on disk (blank), so that a status can be written even if
    the disk fills later. Never raises (the pass goes on without it)."""
    path = pass_status_beside(record)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError:
        return
    try:
        os.write(fd, b" " * RESERVED)
    except OSError:
        pass
    finally:
        os.close(fd)


def note(record: PathLike, **facts: Any) -> Optional[PassStatus]:
    """The one writer: the status beside ``record`` (a pass's record path, per rank) with ``facts`` set (the facts
    noted before are kept), written atomically -- on a full disk, into the room :func:`reserve` claimed. Returns
    the status written, or ``None`` when it could not be written (never raises: the training's end stays its own)."""
    path = pass_status_beside(record)
    status = dataclasses.replace(read(record) or PassStatus(), **facts)
    text = json.dumps(status.to_dict(), indent=2) + "\n"
    try:
        atomic_write_text(path, text)
        return status
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            return None
    return status if _into_reservation(path, text.encode()) else None


def _into_reservation(path: Path, data: bytes) -> bool:
    """Overwrite the blank room :func:`reserve` claimed with ``data`` (padded with blanks: no new block needed)."""
    try:
        size = os.path.getsize(path)
        if len(data) > size:
            return False
        fd = os.open(path, os.O_WRONLY)
    except OSError:
        return False
    try:
        os.write(fd, data + b" " * (size - len(data)))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read(record: PathLike) -> Optional[PassStatus]:
    """The one reader: the status beside ``record``, or ``None`` (never written, only reserved, or unreadable)."""
    try:
        with open(pass_status_beside(record), "rb") as f:
            text = f.read(RESERVED + 1).decode("utf-8").strip()
        data = json.loads(text) if text else None
    except (OSError, ValueError):
        return None
    return PassStatus.from_dict(data) if isinstance(data, dict) else None


def read_all(records: List[Path]) -> List[PassStatus]:
    """The statuses beside each of ``records`` (every rank's record of a pass) that were written."""
    found = [read(path) for path in records]
    return [status for status in found if status is not None]


__all__ = ["SCHEMA", "Ending", "Diverged", "Overridden", "MindguardFailure", "DatasetError", "PassStatus", "reserve",
           "note", "read", "read_all", "RESERVED"]
