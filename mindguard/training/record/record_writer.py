"""The run's record files: one :class:`RecordWriter` per :class:`mindguard.training.run.Run` writes its record (the JSON
file ``mindguard hunt`` and ``mindguard record`` read) to every path asked for.

The per-step "running" record is the hot path (:meth:`RecordWriter.write_progress`): the record's JSON text is cut
once per training call into a template where the step's fields go, and a step stores the joined text into the
memory-mapped progress file beside each record (:class:`mindguard._util.io.MappedSlot`,
:func:`mindguard.protocol.folder.progress_beside`; readers take it with a running record:
:func:`mindguard.protocol.record.read_record_data`) -- under the hunt, one ``pwrite`` into the record's own slot
(:class:`mindguard._util.io.JsonSlot`). Every other record (the first of a call, a
failure, ``finished``) is written whole (:meth:`RecordWriter.write`), atomically. A path that cannot be written
never ends the training (:meth:`RecordWriter.write`).

Imports nothing of MindSpore, nor :mod:`mindguard.training.run` (which passes in what it needs).
"""
from __future__ import annotations

import datetime as _dt
import errno
import json
import os
import re
import sys
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

from ..._util.io import JsonSlot, MappedSlot, atomic_write_bytes, atomic_write_json
from ...errors import ArgumentError, MindguardWarning, RecordError
from ...protocol import folder as layout
from ...protocol.record import FailureRecord

if TYPE_CHECKING:  # pragma: no cover
    from ..step.steps import StepInfo

_RETRY_SECONDS = 10.0  # a record path that could not be written is retried at most this often for per-step updates


class RecordWriter:
    """Writes a run's record to :attr:`paths` (absolute, in the order they were asked for).

    ``under_hunt``: the process is a pass of ``mindguard hunt`` (a removed pass folder is never recreated).
    ``cannot_write(what, path, exc, alternative=...)``: says a path cannot be written (warns, or under the hunt
    ends the pass): :func:`mindguard.training.run.cannot_write`. ``run_id``: the run's id (outside the hunt): a record
    path
    is claimed for the run (:func:`claim`), so that an earlier run's failure there is kept aside and a second live
    training in the folder writes a record of its own."""

    def __init__(self, *, under_hunt: bool, cannot_write: Callable[..., None], run_id: Optional[str] = None) -> None:
        self.under_hunt = under_hunt
        self.run_id = run_id
        self.paths: List[Path] = []
        self._asked: Dict[Path, Path] = {}   # the path asked for -> the path written (claim)
        self._locks: List[int] = []          # descriptors of the record locks this run holds
        self._cannot_write = cannot_write
        self._slots: Dict[Path, JsonSlot] = {}
        self._unwritable: Dict[Path, float] = {}   # record paths whose last write failed: when
        self._progress_base: Optional[tuple] = None  # (the base and the call it was made for, its template)
        # Outside the hunt the per-step record goes into a memory-mapped file of mindguard's own beside each record
        # (protocol.folder.progress_beside): a store instead of a pwrite. Under the hunt, into the record itself.
        self._maps: Dict[Path, MappedSlot] = {}
        self._unmappable: set = set()   # record paths whose progress file could not be made: their slot instead

    def add(self, path: Path) -> Optional[Path]:
        """Write the record to ``path`` too (refused when it is not a mindguard record:
        :func:`check_replaceable`); outside the hunt the path is claimed first (:func:`claim`: the run's own
        :func:`~mindguard.protocol.folder.run_record` instead while another live training holds it). Returns the
        path written, ``None`` when it was asked for already."""
        if path in self._asked or path in self.paths:
            return None
        target = path
        if not self.under_hunt and self.run_id is not None:
            target, lock = claim(path, self.run_id)
            if lock is not None:
                self._locks.append(lock)
        else:
            check_replaceable(path, stacklevel=4)   # (the frame that asked Recorder.add_path)
        self._asked[path] = target
        self.paths.append(target)
        return target

    def asked(self) -> List[Path]:
        """The paths asked for, in order (the usual ones, before any claim put a record of the run's own instead)."""
        return list(self._asked) or list(self.paths)

    def actual(self, path: Path) -> Path:
        """The path written for the asked-for ``path`` (itself when not claimed aside)."""
        return self._asked.get(path, path)

    def release(self) -> None:
        """Let go of the record locks (a new run in this process: :func:`mindguard.training.run.reset_run`)."""
        for fd in self._locks:
            try:
                os.close(fd)
            except OSError:
                pass
        self._locks.clear()

    def write_progress(self, info: "StepInfo", base: Optional[Dict[str, Any]]) -> bool:
        """Write the per-step "running" record of ``info``: the document ``write(Recorder.record("running"))`` would
        write (same keys, order and values), from a template made once per training call -- the JSON text of the
        record cut where the step's fields go -- so a step costs a few string joins instead of a record object
        and a ``json.dumps`` (~40 µs inside a step's callbacks on 2 busy cores), and one copy into each record
        file's mapping (:class:`mindguard._util.io.JsonSlot`). ``base``: the record fields constant over the run.
        False when a path has no mapping yet (its first write) or lost it: the caller writes the full record."""
        template = self._progress_base
        if template is None or template[0] is not base or template[1] is not info.call:
            template = self._progress_base = (base, info.call, _progress_template(info, base))
        parts = template[2]
        fields = info.step_fields()
        fields["time"] = now_text()
        out = [parts[0]]
        for i in range(1, len(parts), 2):
            value = fields[parts[i]]   # (most are ints or None: spelled here, without the call)
            out.append("null" if value is None else str(value) if type(value) is int else _json_value(value))
            out.append(parts[i + 1])
        text = "".join(out)
        for path in self.paths:
            if not self.under_hunt and path not in self._unmappable:
                mapped = self._maps.get(path)
                if mapped is None or not mapped.write_text(text):
                    return False   # the full record (and a new progress file with it) is written instead
                continue
            slot = self._slots.get(path)
            try:
                written = slot is not None and slot.write_text(text)
            except OSError as exc:
                self._slots.pop(path, None)
                if slot is not None:
                    slot.close()
                self._write_failed(path, exc, retry=True)
                continue
            if not written:
                return False
        return True

    def write(self, record: FailureRecord, *, fsync: bool = False) -> None:
        """Write ``record`` to every record path: in place when it is a per-step update (~20 µs), else atomically.

        A path that cannot be written (a full disk, a removed folder) never ends the training: a record that
        cannot be replaced atomically goes into the file's slot in place when it fits there (a full disk still
        takes it: the slot's bytes are allocated); otherwise :func:`mindguard.training.run.cannot_write` warns -- or,
        under
        the hunt, ends the pass with mindguard's own message."""
        data = record.to_dict()
        for path in self.paths:
            last = self._unwritable.get(path)
            if last is not None and record.status == "running" and time.monotonic() - last < _RETRY_SECONDS:
                continue   # a per-step update of a path that just failed: retried now and then, not every step
            if not self.under_hunt:
                self._progress_before(path, record, data)
            try:
                self._write_one(path, record, data, fsync)
            except OSError as exc:
                slot = self._slots.get(path)
                try:
                    if slot is not None and slot.write(data):
                        continue   # in place, into the bytes the record already holds
                except OSError:
                    pass
                self._write_failed(path, exc, retry=record.status == "running")
                continue
            self._unwritable.pop(path, None)
            if not self.under_hunt and record.status != "running":
                mapped = self._maps.pop(path, None)
                if mapped is not None:   # after the record: a reader sees it is no longer running
                    mapped.close(remove=True)

    def _progress_before(self, path: Path, record: FailureRecord, data: Dict[str, Any]) -> None:
        """Before a "running" record is written whole: its progress file, made anew with the same document (so a
        reader never pairs the record with an older run's progress). One that cannot be made leaves that path's
        per-step records to its slot in the record itself (pwrite), as under the hunt."""
        if record.status != "running" or path in self._unmappable:
            return
        old = self._maps.pop(path, None)
        if old is not None:
            old.close()
        try:
            self._maps[path] = MappedSlot(layout.progress_beside(path),
                                          json.dumps(data, separators=(", ", ": "), default=str) + "\n")
        except (OSError, ValueError):
            self._unmappable.add(path)

    def _write_one(self, path: Path, record: FailureRecord, data: Dict[str, Any], fsync: bool) -> None:
        if record.status == "running":
            slot = self._slots.get(path)
            if slot is not None and slot.write(data):
                return
            slot = self._slots.get(path) or JsonSlot(path)
            padded = slot.padded(data)
            if padded is not None:
                gone = self._folder_gone(path)
                if gone is not None:
                    raise gone
                atomic_write_bytes(path, padded)
                slot.reopen()
                self._slots[path] = slot
                return
        gone = self._folder_gone(path)
        if gone is not None:
            raise gone
        atomic_write_json(path, data, fsync=fsync)
        slot = self._slots.pop(path, None)
        if slot is not None:
            slot.close()

    def _folder_gone(self, path: Path) -> Optional[OSError]:
        """Under the hunt, the error writing into a pass folder that was removed (never recreated: the hunt's run
        folder is the hunt's), else ``None``."""
        if not self.under_hunt or path.parent.is_dir():
            return None
        return FileNotFoundError(errno.ENOENT, "its folder was removed while training ran", str(path.parent))

    def _write_failed(self, path: Path, exc: OSError, *, retry: bool) -> None:
        self._unwritable[path] = time.monotonic() if retry else float("-inf")
        self._cannot_write("the failure record", path, exc, alternative="give Guard(record=...) (or FailureLocator, "
                     "watch) a path on another disk")

    def close(self) -> None:
        """Close every record file's slot and progress map (the files stay as written)."""
        for slot in self._slots.values():
            slot.close()
        self._slots.clear()
        for mapped in self._maps.values():
            mapped.close()
        self._maps.clear()


def _progress_template(info: "StepInfo", base: Optional[Dict[str, Any]]) -> List[str]:
    """``[text, field, text, field, ..., text]``: the running record of ``info``'s call as JSON, split where
    the per-step fields (and ``time``) go."""
    constant = dict(base or {})
    if info.call.examine:
        constant["examine"] = info.call.examine
    data = FailureRecord(status="running", **constant).to_dict()
    fields = info.fields()
    fields.pop("examine", None)
    data.update(fields)
    for name in _STEP_FIELDS:
        data[name] = f"@@mindguard:{name}@@"
    text = json.dumps(data, separators=(", ", ": "), default=str) + "\n"
    return re.split(r'"@@mindguard:(\w+)@@"', text)


def place_record(asked: Path) -> Path:
    """Where a record asked for at ``asked`` (absolute; outside the hunt) is written, so that Guard never refuses a
    training the script alone would run, nor loses the record at the failure (issue 50), each said once on stderr:

    * ``asked``'s folder cannot be written (a read-only mount, no permission): the record -- and with it the kept
      states, its per-run copy, everything beside it -- goes to a folder of its own in the temp directory
      (:func:`mindguard.protocol.folder.fallback_folders`), and the ``hunt --from`` line names it. When no fallback
      can be written either, ``asked`` stays: the training goes on, its writes warned about
      (:func:`mindguard.training.run.cannot_write`).
    * its name leaves no room on the file system for the names derived from it (the per-run copy inserts the run
      id): those get a shorter stem (:func:`mindguard.protocol.folder.fitted_stem`); a name the file system refuses
      outright is shortened itself (:func:`mindguard.protocol.folder.fitted_record`)."""
    placed = asked
    problem = _unwritable(asked.parent)
    if problem is not None:
        fallback = next((folder for folder in layout.fallback_folders(asked.parent) if _unwritable(folder) is None),
                        None)
        if fallback is None:
            print(f"mindguard: cannot write in {str(asked.parent)!r} ({problem}), nor in the temp directory or "
                  f"~/.cache: the training runs without a failure record; give Guard(record=...) a path you can "
                  f"write", file=sys.stderr, flush=True)
            return asked
        _make_private(fallback)
        placed = layout.fitted_record(fallback / asked.name)
        print(f"mindguard: cannot write in {str(asked.parent)!r} ({problem}); the failure record and the kept "
              f"training states go to {str(placed)!r} instead (choose with Guard(record=...)); the training runs "
              f"as it would", file=sys.stderr, flush=True)
    fitted = layout.fitted_record(placed)
    stem = layout.fitted_stem(fitted)
    if fitted != placed or stem != placed.stem:
        short = f"{stem[:24]}...{stem[-9:]}" if len(stem) > 40 else stem
        said = f"the record is written as {short}{fitted.suffix}, and " if fitted != placed else ""
        print(f"mindguard: the record name {placed.name[:24] + '...'!r} ({len(os.fsencode(placed.name))} bytes) "
              f"leaves no room for the names mindguard derives from it (the file system takes "
              f"{layout.name_max(placed.parent)}): {said}its per-run copy and kept states are named {short}.<run id>"
              f"{fitted.suffix} and {short}{layout.KEPT_STATES_SUFFIX}/ in {str(placed.parent)!r}", file=sys.stderr,
              flush=True)
    return fitted


def _unwritable(folder: Path) -> Optional[str]:
    """Why nothing can be written in ``folder`` (its nearest existing ancestor, where it would be created), or
    ``None``."""
    existing = Path(os.path.abspath(folder))
    while not os.path.isdir(existing) and existing != existing.parent:
        if os.path.lexists(existing):
            return None   # a file on the way: the record path's own error (refused as an argument, or warned)
        existing = existing.parent
    if os.access(existing, os.W_OK | os.X_OK):
        return None
    try:
        read_only = bool(os.statvfs(existing).f_flag & getattr(os, "ST_RDONLY", 1))
    except OSError:
        read_only = False
    return os.strerror(errno.EROFS if read_only else errno.EACCES)


def _make_private(folder: Path) -> None:
    """Create ``folder``, its ``mindguard-<uid>`` parent (in the shared temp directory) readable by its owner only."""
    try:
        folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        folder.mkdir(exist_ok=True)
    except OSError:
        pass   # (the record's writes say it)


def _lock(path: Path) -> Tuple[Optional[int], bool]:
    """``(descriptor, held_elsewhere)``: an exclusive ``flock`` on ``path`` (created), taken without waiting. The
    kernel lets go of it when the process ends, however it ends (SIGKILL too), so a lock that is free is a dead
    run's. ``(None, False)`` when no lock can be taken (no ``fcntl``, a folder that cannot be written): unlocked."""
    try:
        import fcntl
    except ImportError:   # pragma: no cover - not on Linux
        return None, False
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None, False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None, True
    except OSError:
        os.close(fd)
        return None, False
    return fd, False


def held_by_a_live_run(lock: Path) -> bool:
    """True while a live process holds ``lock`` (:func:`_lock`); a missing file is held by nobody."""
    if not lock.exists():
        return False
    fd, elsewhere = _lock(lock)
    if fd is not None:
        os.close(fd)
    return elsewhere


def claim(path: Path, run_id: str, *, stacklevel: int = 5) -> Tuple[Path, Optional[int]]:
    """The record path run ``run_id`` writes for the asked-for ``path``, and the lock descriptor it holds for it.

    * Another live training holds ``path`` (its lock, :func:`mindguard.protocol.folder.record_lock`): this run
      writes its own record, :func:`~mindguard.protocol.folder.run_record`, and says so.
    * ``path`` holds the record of an earlier run's failure or of a run that never finished (killed): it is kept,
      under that run's id, before this run's record replaces it (a failed run wrote that copy itself; a killed run's
      record and progress file are renamed to it), and the warning names where.
    * A file that is not a mindguard record is never replaced (:class:`ArgumentError`)."""
    if path.is_dir():
        raise ArgumentError(f"record={str(path)!r} is a directory; pass a file path inside it, e.g. "
                            f"{str(path / layout.DEFAULT_RECORD)!r}")
    try:   # the lock needs the folder; the record would create it at its first write anyway
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
        pass
    fd, elsewhere = _lock(layout.record_lock(path)) if path.parent.is_dir() else (None, False)
    if elsewhere:
        own = layout.run_record(path, run_id)
        print(f"mindguard: another training is writing {str(path)!r} now (it holds {layout.record_lock(path)}); "
              f"this run's record is {str(own)!r}", file=sys.stderr, flush=True)
        check_replaceable(own, stacklevel=stacklevel)
        return own, None
    try:
        previous = _previous_record(path)
        if previous is not None and previous.status in ("failed", "running"):
            _keep_aside(path, previous, stacklevel=stacklevel)
    except BaseException:
        if fd is not None:
            os.close(fd)
        raise
    return path, fd


def _previous_record(path: Path) -> Optional[FailureRecord]:
    if not path.exists() and not path.is_symlink():
        return None
    try:
        return FailureRecord.load(path)
    except RecordError as exc:
        raise ArgumentError(f"mindguard will not overwrite {str(path)!r}: the file exists and is not a mindguard "
                            f"failure record ({exc}); pass another record= path or move the file") from None


def _keep_aside(path: Path, previous: FailureRecord, *, stacklevel: int) -> None:
    """Keep the earlier run's record at ``path`` under its run id before it is replaced (see :func:`claim`)."""
    what = "failure" if previous.status == "failed" else "run that never finished (killed?)"
    run_id = previous.run_id or "earlier-" + time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    aside = layout.run_record(path, run_id)
    worth = previous.status == "running" or (previous.kind != "interrupted" and previous.phase != "mindguard"
                                             and previous.raised_by is None)   # (a callback's own error: issue 50)
    if not worth:
        kept = "it is replaced by this run's record (it has nothing to hunt)"
    elif aside.exists() and _same_failure(aside, previous):
        kept = f"it stays as {str(aside)!r}"
    else:
        n = 1
        while aside.exists():   # never over another kept record
            n += 1
            aside = layout.run_record(path, f"{run_id}-{n}")
        os.rename(path, aside)
        progress = layout.progress_beside(path)
        if progress.exists():
            os.rename(progress, layout.progress_beside(aside))
        kept = f"it is kept as {str(aside)!r}"
    warnings.warn(f"mindguard: {str(path)!r} holds the record of an earlier {what}: {previous.format()}; {kept}",
                  MindguardWarning, stacklevel=stacklevel)


def _same_failure(copy: Path, record: FailureRecord) -> bool:
    try:
        other = FailureRecord.load(copy)
    except RecordError:
        return False
    return (other.run_id, other.status, other.global_step, other.kind) == \
        (record.run_id, record.status, record.global_step, record.kind)


def check_replaceable(path: Path, *, stacklevel: int = 4) -> None:
    """Refuse to replace a file that is not a mindguard record; warn before replacing an earlier run's failure
    (``stacklevel``: of the warning, counted from here)."""
    if path.is_dir():
        raise ArgumentError(f"record={str(path)!r} is a directory; pass a file path inside it, e.g. "
                            f"{str(path / layout.DEFAULT_RECORD)!r}")
    if not path.exists() and not path.is_symlink():
        return
    try:
        previous = FailureRecord.load(path)
    except RecordError as exc:
        raise ArgumentError(f"mindguard will not overwrite {str(path)!r}: the file exists and is not a mindguard "
                            f"failure record ({exc}); pass another record= path or move the file") from None
    if previous.status in ("failed", "running"):
        what = "failure" if previous.status == "failed" else "run that never finished (killed?)"
        warnings.warn(f"mindguard: {str(path)!r} holds the record of an earlier {what}: {previous.format()}; it is "
                      f"replaced by this run's record (pass another record= path to keep it)", MindguardWarning,
                      stacklevel=stacklevel)


_STEP_FIELDS = ("global_step", "epoch", "step_in_epoch", "steps_per_epoch", "iteration_range", "dump_iteration",
                "graph", "dump_graphs", "iteration_observed", "step_window_us", "time")


def _json_value(value: Any) -> str:
    """``json.dumps(value)`` (the record's separators) for a step field, without the encoder for the common
    types (int, None, bool, a list of ints)."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    kind = type(value)
    if kind is int:
        return str(value)
    if kind is str and value.isascii() and value.isprintable() and '"' not in value and "\\" not in value:
        return '"' + value + '"'

    if kind is list and all(type(v) is int for v in value):
        return "[" + ", ".join(map(str, value)) + "]"
    return json.dumps(value, separators=(", ", ": "), default=str)


_NOW_TEXT: List[Any] = [0, ""]  # (whole second, its text): the record's "time" is to the second; format once per second


def now_text() -> str:
    second = int(time.time())
    if second != _NOW_TEXT[0]:
        _NOW_TEXT[1] = _dt.datetime.fromtimestamp(second, _dt.timezone.utc).astimezone().isoformat(timespec="seconds")
        _NOW_TEXT[0] = second
    return str(_NOW_TEXT[1])
