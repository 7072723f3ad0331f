"""Small file helpers shared by every writer and reader in mindguard.

Rules they enforce: writes are atomic (temp file in the same directory + ``os.replace``, or one in-place
``pwrite`` of a fixed-size slot for per-step state), and ``.npy`` files are never unpickled.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Tuple, Union

from ..errors import ArgumentError, ArgumentTypeError, NotRegularFileError

if TYPE_CHECKING:
    import numpy as np

PathLike = Union[str, "os.PathLike[str]"]


def _current_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def _atomic_file(path: PathLike, *, fsync: bool = False) -> Iterator[Any]:
    """Yield a binary file that replaces ``path`` when the block ends, or vanishes if it raises."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), suffix=".tmp", dir=str(path.parent))
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)   # mkstemp makes 0600; the file gets the mode open() would give it
        with os.fdopen(fd, "wb") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _temp_prefix(path: Path) -> str:
    """The prefix of the temporary file that replaces ``path``: ``.<name>.``, or -- when that, the 8 random characters
    ``mkstemp`` adds and ``.tmp`` would pass the file system's longest name (a record name of 245 characters) -- the
    name's first bytes and 8 hex digits of its sha256, so that a name the file system takes can be written."""
    prefix = f".{path.name}."
    try:
        limit = int(os.pathconf(path.parent, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):
        limit = 255
    room = limit - 8 - len(".tmp")
    if len(os.fsencode(prefix)) <= room:
        return prefix
    import hashlib

    digest = hashlib.sha256(os.fsencode(path.name)).hexdigest()[:8]
    head = path.name
    while head and len(os.fsencode(f".{head}-{digest}.")) > room:
        head = head[:-1]
    return f".{head}-{digest}."


def atomic_write_bytes(path: PathLike, data: bytes, *, fsync: bool = False) -> Path:
    """Write ``data`` to ``path`` so that readers see either the old file or the new one, never half.

    ``fsync=True`` also survives a power loss; without it the write survives the process being killed
    (SIGKILL, OOM-killer).
    """
    with _atomic_file(path, fsync=fsync) as f:
        f.write(data)
    return Path(path)


def atomic_write_text(path: PathLike, text: str, *, fsync: bool = False) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"), fsync=fsync)


def atomic_write_json(path: PathLike, obj: Any, *, fsync: bool = False) -> Path:
    """Atomically write ``obj`` as indented JSON (keys in insertion order) plus a trailing newline."""
    return atomic_write_text(path, json.dumps(obj, indent=2, default=_json_default) + "\n", fsync=fsync)


def _json_default(value: Any) -> Any:
    import numpy as np   # imported when needed: `mindguard iteration` and the console helpers start without it

    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise ArgumentTypeError(f"Object of type {type(value).__name__} is not JSON serializable")


JSON_LIMIT = 1 << 28   # bytes: no JSON file mindguard reads (records, summaries, captures) comes near it


def tree_size(path: PathLike) -> Tuple[int, int]:
    """``(bytes, files)`` of every file under ``path`` (links not followed; a file removed meanwhile is skipped)."""
    total = files = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                continue
            files += 1
    return total, files


def read_json(path: PathLike, *, limit: int = JSON_LIMIT) -> Any:
    """The JSON document in ``path``, read as :func:`read_regular_text` reads (a FIFO or device raises
    ``OSError`` instead of blocking). Every failure to parse -- not UTF-8, not JSON, nested too deeply, an
    integer of more than 4300 digits -- is a ``ValueError``."""
    text = read_regular_text(path, limit=limit)
    try:
        return json.loads(text)
    except RecursionError:
        raise ArgumentError(f"{os.fspath(path)!r}: JSON nested too deeply") from None


def read_regular_bytes(path: PathLike, *, limit: int) -> bytes:
    """The bytes of ``path``, opened only if it is a regular file of at most ``limit`` bytes.

    A FIFO, a device or a directory raises ``OSError`` at once (never blocks: the file is opened with
    ``O_NONBLOCK`` and checked with ``fstat`` before any read); a larger file (or one that grows past
    ``limit`` while read) raises ``ValueError``; a missing file ``FileNotFoundError``.
    """
    fd = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file (a FIFO, device or directory)", os.fspath(path))
        if info.st_size > limit:
            raise ArgumentError(f"{os.fspath(path)!r} is {info.st_size} bytes, more than the {limit} expected")
        chunks, total = [], 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            total += len(chunk)
            if total > limit:
                raise ArgumentError(f"{os.fspath(path)!r} grew past the {limit} bytes expected while being read")
            chunks.append(chunk)
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_regular_text(path: PathLike, *, limit: int) -> str:
    """The UTF-8 text of ``path``, read as :func:`read_regular_bytes` reads it (regular files only, at most
    ``limit`` bytes, never blocking); text that is not UTF-8 raises ``UnicodeDecodeError``."""
    return read_regular_bytes(path, limit=limit).decode("utf-8")


def file_sha256(path: PathLike) -> str:
    """The sha256 of the file at ``path`` (hex), read in 1 MiB blocks."""
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save_npy(path: PathLike, array: "np.ndarray") -> Path:
    """Atomically save one array as ``.npy`` (never as a pickled object array)."""
    import numpy as np

    array = np.asarray(array)
    if array.dtype == object:
        raise ArgumentTypeError(f"refusing to save an object array to {path}: it could only be read back by unpickling")
    with _atomic_file(path) as f:
        np.save(f, array, allow_pickle=False)
    return Path(path)


def load_npy(path: PathLike, *, mmap: bool = False) -> "np.ndarray":
    """Load a ``.npy`` file without ever unpickling (``allow_pickle=False``). Only a regular file is opened:
    a FIFO or device raises ``OSError`` instead of blocking."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotRegularFileError(errno.EINVAL, "not a regular file (a FIFO, device or directory)", os.fspath(path))
    import numpy as np

    return np.load(path, allow_pickle=False, mmap_mode="r" if mmap else None)


def regular_file(path: PathLike) -> Path:
    """``path``, after checking it is a regular file (a FIFO or device raises ``OSError`` instead of blocking)."""
    if not stat.S_ISREG(os.stat(path).st_mode):
        raise NotRegularFileError(errno.EINVAL, "not a regular file (a FIFO, device or directory)", os.fspath(path))
    return Path(path)


def check_writable_dir(directory: PathLike, *, what: str = "directory") -> Path:
    """Create ``directory`` if needed and prove it is writable, or raise a ``PermissionError`` that says so."""
    directory = Path(directory).expanduser().resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".mindguard-probe-", dir=str(directory))
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ArgumentError(
            f"{what} {str(directory)!r} is not writable ({exc.strerror or exc}); "
            f"choose a directory you can write to"
        ) from None
    return directory


class _PaddedSlot:
    """What :class:`JsonSlot` and :class:`MappedSlot` share: a file of ``size`` bytes at ``path`` holding one JSON
    document padded with spaces, and whether it is still the file they opened (checked at most once a second)."""

    path: Path
    size: int
    _identity: Optional[tuple]   # (st_ino, st_dev, st_size) of the file when it was opened
    _checked: float              # time.monotonic() of the last identity check
    _dirty: int                  # the bytes from the start that may hold something other than the padding's spaces
    recheck_seconds: float

    def _still_the_file(self) -> bool:
        """False when the file at ``path`` is gone, replaced or resized; other ``OSError``s of ``stat`` raise."""
        now = time.monotonic()
        if now - self._checked < self.recheck_seconds:
            return True
        try:
            current = os.stat(self.path)
        except FileNotFoundError:
            return False
        if (current.st_ino, current.st_dev, current.st_size) != self._identity or current.st_size != self.size:
            return False
        self._checked = now
        return True

    def _over_last(self, data: bytes) -> bytes:
        """``data`` with spaces only over what the last write held beyond it: the rest of the slot is spaces
        already (a 4 KiB padding a step cost ~12 µs to build on 2 busy cores)."""
        short = self._dirty - len(data)
        return data + b" " * short if short > 0 else data


class JsonSlot(_PaddedSlot):
    """A small JSON file rewritten in place, for state that changes every training step.

    ``atomic_write_json`` (temp file + rename) costs ~0.4 ms on ext4, where replacing a file by rename
    forces its block allocation: too much for every step of a fast training loop. A slot instead keeps
    the file open and overwrites it with one ``pwrite`` of the JSON padded with spaces to a fixed size
    (JSON ignores trailing whitespace). The content length never changes, so nothing is ever truncated; a
    process killed at any instant (SIGKILL, OOM-killer) leaves either the previous or the new document, since a
    signal cannot interrupt a write to a regular file half-way. Inside a training step's callbacks, where
    MindSpore's CPU worker threads occupy every core, each system call costs its thread a scheduling round
    (measured on 2 cores: ``pwrite`` 8 µs median, 68 µs p90; ``stat`` 13/127 µs), so whether the file at ``path``
    is still the one opened (not replaced or removed) is checked at most once a second, not at every write. (A
    memory map would save the ``pwrite``, but a file truncated under it kills the process with SIGBUS.)

    ``write`` returns False when the document does not fit in the slot; the caller then writes it with
    :func:`atomic_write_json` and calls :meth:`reopen`.
    """

    def __init__(self, path: PathLike, size: int = 4096):
        self.path = Path(path)
        self.size = size
        self._fd: Optional[int] = None
        self._identity: Optional[tuple] = None
        self.recheck_seconds = 1.0   # how often the file at ``path`` is checked to still be the one opened
        self._checked = 0.0   # time.monotonic() of the last identity check
        self._dirty = size    # the bytes from the start that may hold something other than the padding's spaces

    def padded(self, obj: Any) -> Optional[bytes]:
        """``obj`` as UTF-8 JSON padded with spaces to the slot size, or ``None`` when it is too large."""
        return self._pad(json.dumps(obj, separators=(", ", ": "), default=_json_default) + "\n")

    def _pad(self, text: str) -> Optional[bytes]:
        data = text.encode("utf-8")
        return None if len(data) > self.size else data + b" " * (self.size - len(data))

    def reopen(self) -> None:
        """(Re)open the file at ``path`` -- call after it was (re)created with :meth:`padded` content."""
        self.close()
        self._fd = os.open(self.path, os.O_WRONLY)
        opened = os.fstat(self._fd)
        self._identity = (opened.st_ino, opened.st_dev, opened.st_size)
        self._checked = time.monotonic()
        self._dirty = self.size

    def write(self, obj: Any) -> bool:
        """Overwrite the slot with ``obj``; False (nothing written) when it does not fit, or the file at
        ``path`` is no longer the one this slot opened (replaced by a rename, removed, resized)."""
        return self.write_text(json.dumps(obj, separators=(", ", ": "), default=_json_default) + "\n")

    def write_text(self, text: str) -> bool:
        """:meth:`write` of an already-encoded JSON document ``text`` (ending in a newline)."""
        data = text.encode("utf-8")
        if len(data) > self.size or self._fd is None or not self._still_the_file():
            return False
        payload = self._over_last(data)
        self._dirty = max(self._dirty, len(data))   # (a write that fails half-way may leave that much)
        os.pwrite(self._fd, payload, 0)
        self._dirty = len(data)
        return True

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None


class MappedSlot(_PaddedSlot):
    """A file of ``size`` bytes holding one JSON document padded with spaces, rewritten through a memory map: a
    store, no system call. Measured while MindSpore trains on 2 cores, a ``pwrite`` of it takes 25 µs at the
    median and 50-150 µs on average (a long tail), the store 2 µs (docs/mindspore-facts.md).

    For mindguard's own files only (the per-step progress beside a record, :func:`protocol.folder.progress_beside`):
    a file truncated under a map kills the process with SIGBUS, which no one editing the user's record must risk.
    Whether the file at ``path`` is still the one mapped is checked at most once a second (``os.stat``), as
    :class:`JsonSlot` does.
    """

    def __init__(self, path: PathLike, text: str, size: int = 4096):
        """Create (atomically) the file at ``path`` holding ``text`` and map it; ``ValueError`` when ``text`` does
        not fit in ``size`` bytes (:class:`ArgumentError`, a ``ValueError``), ``OSError`` when the file cannot be
        written or mapped."""
        import mmap

        self.path, self.size = Path(path), size
        data = text.encode("utf-8")
        if len(data) > size:
            raise ArgumentError(f"{len(data)} bytes do not fit in a slot of {size}")
        atomic_write_bytes(self.path, data + b" " * (size - len(data)))
        fd = os.open(self.path, os.O_RDWR)
        try:
            opened = os.fstat(fd)
            self._map: Optional[mmap.mmap] = mmap.mmap(fd, size)
        finally:
            os.close(fd)   # the map keeps the file
        self._identity = (opened.st_ino, opened.st_dev, opened.st_size)
        self._checked = time.monotonic()
        self._dirty = len(data)
        self.recheck_seconds = 1.0

    def write_text(self, text: str) -> bool:
        """Store the JSON document ``text``; False (nothing written) when it does not fit, or the file at ``path``
        is no longer the one mapped (removed, replaced, resized): then :meth:`close` it and make a new one."""
        data = text.encode("utf-8")
        if len(data) > self.size or self._map is None:
            return False
        try:
            if not self._still_the_file():
                return False
        except OSError:   # (in a step's hook: never raised into the training)
            return False
        payload = self._over_last(data)
        self._map[0:len(payload)] = payload
        self._dirty = len(data)
        return True

    def close(self, *, remove: bool = False) -> None:
        """Unmap; ``remove``: delete the file too (the record it stood for is written whole)."""
        if self._map is not None:
            with contextlib.suppress(OSError, ValueError):
                self._map.close()
            self._map = None
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


# -- the console and the disk: what mindguard's own I/O does when they fail ------------------------------------
def console_write(text: str, stream: Any) -> bool:
    """Write ``text`` to a console stream (``sys.stdout``/``sys.stderr``) and flush; never raises.

    A character the stream's encoding cannot show (``PYTHONIOENCODING=ascii``) is written escaped
    (``backslashreplace``); a stream that fails (its reader left: ``| head``; a full disk behind it) is pointed at
    ``/dev/null`` so that nothing written later -- nor the interpreter's last flush -- fails again. Returns
    whether the text was written.
    """
    if stream is None:
        return False
    try:
        try:
            stream.write(text)
        except UnicodeEncodeError:
            encoding = getattr(stream, "encoding", None) or "ascii"
            stream.write(text.encode(encoding, "backslashreplace").decode(encoding, "replace"))
        stream.flush()
        return True
    except (OSError, ValueError):
        silence_stream(stream)
        return False


def silence_stream(stream: Any) -> None:
    """Point ``stream``'s file descriptor at ``/dev/null`` (Python's recipe for a closed pipe: what is still
    buffered, and what is written later, then goes nowhere instead of raising at exit)."""
    try:
        fd = stream.fileno()
    except (OSError, ValueError, AttributeError):
        return
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        os.dup2(null, fd)
    except OSError:
        pass
    finally:
        os.close(null)


def finish_console() -> None:
    """Flush stdout and stderr at the end of a command; a stream that cannot take it is silenced (never raises,
    so a closed pipe or a full disk behind the console never changes the exit code)."""
    import sys

    for stream in (sys.stdout, sys.stderr):
        if stream is None:
            continue
        try:
            stream.flush()
        except (OSError, ValueError):
            silence_stream(stream)
            try:
                stream.flush()
            except (OSError, ValueError):
                pass


_NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def io_fix(exc: BaseException, alternative: str) -> str:
    """What to do about ``exc`` (an ``OSError`` writing a file): free space, make it writable, ..., or
    ``alternative`` (e.g. ``"give Guard(record=...) a path on another disk"``)."""
    number = getattr(exc, "errno", None)
    if number in _NO_SPACE:
        return f"free space on that disk (or raise the quota), or {alternative}"
    if number in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"make that folder writable, or {alternative}"
    if number == errno.ENOENT:
        return f"the folder was removed while training ran: {alternative}"
    return alternative


def os_reason(exc: BaseException) -> str:
    """``"No space left on device"`` (the OS's words for ``exc``), never empty."""
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def free_bytes(path: Union[str, Path]) -> Optional[int]:
    """Bytes an unprivileged process may still write on the file system of ``path`` (``None`` when it cannot be
    told: the path is gone, the call refused)."""
    try:
        info = os.statvfs(path)
    except OSError:
        return None
    return info.f_bavail * info.f_frsize
