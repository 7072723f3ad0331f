"""The hunt's passes as processes: run the user's command once, copy its output through (and into a log: all of
it; on the console its stdout and, of its stderr, mindguard's own lines -- the training's own traceback, the
failure the pass expected, stays in the log, and one line says where), show progress from its record, and stop
it -- with every process it started -- when asked.

The hunt supervises a process *tree*, not one child:

* the command starts in a session (and process group) of its own, so a signal reaches every process it started
  -- dataset workers of ``python_multiprocessing`` included, even once orphaned -- and the tree is also noted
  while it runs (msrun starts its workers in sessions of their own);
* every signal the hunt handles (SIGINT, SIGTERM, SIGHUP, SIGQUIT: :class:`Supervisor`, installed once for the
  whole hunt) becomes :class:`HuntInterrupted` in the hunt's main thread, in every phase: a pass stops its tree
  with escalation (the signal, SIGTERM, SIGKILL; a second signal kills at once), the hunt writes its summary;
* the output is copied by threads that own their pipe ends and poll them, so nothing ever blocks on a pipe a
  grandchild still holds (a TensorBoard server, a log shipper): once the command has exited, the copiers drain
  for :data:`DRAIN_SECONDS`, then the pass detaches -- it says which process holds the output, and keeps reading
  it into the log (never to the console) so that process is neither blocked nor broken;
* the console is written by :func:`_say` / :func:`console`, which never raise: a closed pipe (``| head``), a full
  disk behind stdout or an encoding that cannot show a character never change the hunt's result.

Steps are 1-based global steps (:mod:`mindguard.training.run`); this module never imports MindSpore.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence

import psutil

from .._util import dist as _dist
from .._util.io import read_json
from ..errors import HuntError
from ..dump.config import OBSERVE_KERNEL_NAME
from .console import say as _say
from ..protocol.signals import STOP_SIGNALS, signal_name
from .result import Stop, progress

#: Seconds the copiers may take, after the command exited, to read what is left in its pipes; a pipe still open
#: then is held by a process the command started, and the pass stops waiting for it.
DRAIN_SECONDS = 2.0
#: Bytes of the command's output kept in memory (the log may be on a full disk).
TAIL_BYTES = 1 << 16
#: Signals the hunt turns into a controlled stop (SIGKILL and SIGSTOP cannot be handled): those that stop a
#: process from outside.
HANDLED_SIGNALS = STOP_SIGNALS


class HuntInterrupted(KeyboardInterrupt):
    """A signal the hunt handles arrived (raised in the main thread by :class:`Supervisor`)."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum

    @property
    def name(self) -> str:
        return signal_name(self.signum)


class Supervisor:
    """The hunt's signal handlers, installed once for the whole hunt (main thread only; a signal the hunt was
    started with ignored -- ``nohup`` -- stays ignored). Each handled signal raises :class:`HuntInterrupted`, unless
    the hunt is writing its result (:meth:`deferred`): then it is only noted (:attr:`pending`)."""

    def __init__(self) -> None:
        self.previous: Dict[int, Any] = {}
        self.pending: Optional[int] = None
        self._deferring = 0

    def install(self) -> "Supervisor":
        if threading.current_thread() is not threading.main_thread():
            return self
        for sig in HANDLED_SIGNALS:
            current = signal.getsignal(sig)
            if current == signal.SIG_IGN:
                continue
            self.previous[sig] = current
            signal.signal(sig, self._handle)
        return self

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self.previous.clear()

    def _handle(self, signum: int, frame: Any) -> None:
        if self._deferring:
            self.pending = self.pending or signum
            return
        raise HuntInterrupted(signum)

    @contextlib.contextmanager
    def deferred(self) -> Iterator[None]:
        self._deferring += 1
        try:
            yield
        finally:
            self._deferring -= 1


#: Passes whose command may still be running (the hunt stops them when interrupted outside their wait loop).
_RUNNING: List["_Pass"] = []


def stop_running_passes(first: int = signal.SIGTERM) -> None:
    for this in list(_RUNNING):
        this.stop(first)


def _command_fix(program: str, exc: OSError) -> str:
    if isinstance(exc, FileNotFoundError):
        return f"; is it installed and on PATH? e.g. `mindguard hunt -- {sys.executable} train.py`"
    if isinstance(exc, PermissionError):
        kind = "a directory" if os.path.isdir(program) else "not executable"
        return f" ({program} is {kind}); run a script through its interpreter: `mindguard hunt -- python {program}`"
    return ""


class _Output:
    """What the command wrote: the pass log (while it can be written), the last :data:`TAIL_BYTES` in memory."""

    def __init__(self, log_path: Path):
        self.lock = threading.Lock()
        self.tail = bytearray()
        self.log_error: Optional[OSError] = None
        try:
            self.log: Optional[Any] = open(log_path, "wb")
        except OSError as exc:
            self.log, self.log_error = None, exc

    def add(self, chunk: bytes) -> None:
        with self.lock:
            self.tail += chunk
            if len(self.tail) > TAIL_BYTES:
                del self.tail[:-TAIL_BYTES]
            if self.log is not None:
                try:
                    self.log.write(chunk)
                    self.log.flush()
                except (OSError, ValueError) as exc:   # a full disk: the tail in memory still has the end
                    self.log_error = exc if isinstance(exc, OSError) else self.log_error
                    self._close_log()

    def _close_log(self) -> None:
        log, self.log = self.log, None
        if log is not None:
            with contextlib.suppress(OSError, ValueError):
                log.close()

    def close(self) -> None:
        with self.lock:
            self._close_log()


class _Copier(threading.Thread):
    """Copy one pipe of the command to the console and the pass's output until end of file -- or, once
    :meth:`detach` was called, into the output only, for as long as the hunt runs. The thread owns the pipe's
    read end and polls it, so stopping never waits for a process that holds the write end."""

    def __init__(self, fd: int, sink: Any, output: _Output, shown: Optional["_Shown"] = None):
        super().__init__(daemon=True)
        self.fd, self.sink, self.output, self.shown = fd, sink, output, shown
        self.detached = threading.Event()
        self.pipe_inode = os.fstat(fd).st_ino
        self.ended = threading.Event()

    def detach(self) -> None:
        self.detached.set()

    def run(self) -> None:
        out = getattr(self.sink, "buffer", self.sink)
        poller = select.poll()
        poller.register(self.fd, select.POLLIN | select.POLLHUP | select.POLLERR)
        try:
            while True:
                if not poller.poll(200):
                    continue
                try:
                    chunk = os.read(self.fd, 65536)
                except InterruptedError:
                    continue
                except OSError:
                    break
                if not chunk:
                    break
                if b"Unused Kernel" in chunk:   # mindguard's own observing dump's warning: not the user's to read
                    chunk = _OWN_NOISE.sub(b"", chunk)
                self.output.add(chunk)
                out = self._show(out, chunk if self.shown is None else self.shown.add(chunk))
            if self.shown is not None:
                out = self._show(out, self.shown.end())
        finally:
            self.ended.set()
            with contextlib.suppress(OSError):
                os.close(self.fd)


    def _show(self, out: Any, chunk: bytes) -> Any:
        """Write ``chunk`` to the console (unless detached); the console, or ``None`` once it is gone."""
        if out is not None and chunk and not self.detached.is_set():
            try:
                out.write(chunk)
                out.flush()
            except (OSError, ValueError):   # the console is gone (`| head`) or full: the log still has it
                return None
        return out


#: mindguard's own lines on a command's stderr: ``mindguard: ...``, ``mindguard attach: ...``, ``[mindguard hunt]``
#: -- not ``mindguard.errors.NonFiniteError: ...``, the last line of the training's traceback.
_OWN_LINE = re.compile(rb"\[?mindguard[ :\]]")


class _Shown:
    """Which lines of the command's stderr reach the console while a pass runs (issue 52): mindguard's own (Guard's
    lines, the pass's, a ``MindguardWarning``, and their indented continuation lines); the rest -- the training's
    own traceback (the failure the pass expected), MindSpore's warnings -- goes to the pass's ``output.log`` only,
    and the pass says where in one line (:attr:`held`, :attr:`traceback`). ``quiet``: no line at all (the fix
    check's pass)."""

    #: A line without its end this long is judged as it is (a progress bar redrawn with ``\r``).
    LONGEST = 1 << 16

    def __init__(self, quiet: bool = False):
        self.quiet = quiet
        self.partial = b""
        self.held = 0            # lines kept from the console
        self.traceback = False   # one of them began a Python traceback
        self._continues = False  # the last line shown was mindguard's: an indented line after it is its own

    def add(self, chunk: bytes) -> bytes:
        """What of ``chunk`` to show: the complete lines that are mindguard's."""
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        if len(self.partial) > self.LONGEST:
            lines.append(self.partial)
            self.partial = b""
        return b"".join(line + b"\n" for line in lines if self._shown(line))

    def end(self) -> bytes:
        """What is left at the end of the output (a last line without its end)."""
        rest, self.partial = self.partial, b""
        return rest if rest and self._shown(rest) else b""

    def _shown(self, line: bytes) -> bool:
        text = line.lstrip(b"\r")
        if not self.quiet and (_OWN_LINE.match(text) or b": MindguardWarning: " in text):
            self._continues = True
            return True
        if not self.quiet and self._continues and text[:1] in (b" ", b"\t") and text.strip():
            return True
        self._continues = False
        if text.strip():
            self.held += 1
            self.traceback = self.traceback or b"Traceback (most recent call last)" in text
        return False


#: MindSpore's warning about the observing dump's kernel entry, which matches no kernel on purpose (it makes the
#: dump write no tensors, only the iteration ids): mindguard's doing, not the user's, so not shown.
_OWN_NOISE = re.compile(rb"[^\n]*Unused Kernel in json: name-regex\(" + re.escape(OBSERVE_KERNEL_NAME.encode())
                        + rb"\)[^\n]*\n?")


class _Tree:
    """The command's process and every process it started, as far as they can be found: its process group and
    session (the command starts a session of its own), and its descendants noted while it runs (msrun starts
    workers in sessions of their own; a worker orphaned later is still found by its session)."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.proc = proc
        self.known: Dict[int, psutil.Process] = {}
        self.note()

    def note(self) -> None:
        try:
            for child in psutil.Process(self.proc.pid).children(recursive=True):
                self.known.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def members(self) -> List[psutil.Process]:
        """Every live process of the tree but the command itself (zombies are not running)."""
        found: Dict[int, psutil.Process] = {}
        root = self.proc.pid
        for p in list(self.known.values()):
            if _alive(p):
                found[p.pid] = p
        for p in psutil.process_iter():
            if p.pid in found or p.pid == root or p.pid == os.getpid():
                continue
            try:
                if os.getpgid(p.pid) == root or os.getsid(p.pid) == root:
                    if _alive(p):
                        found[p.pid] = p
            except (OSError, psutil.Error):
                continue
        return list(found.values())

    def signal_all(self, sig: int) -> None:
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(OSError):
                self.proc.send_signal(sig)
        for p in self.members():
            with contextlib.suppress(psutil.Error, OSError):
                p.send_signal(sig)

    def stop(self, first: int = signal.SIGTERM) -> None:
        """Stop the command and every process of the tree: ``first``, then SIGTERM, then SIGKILL, each given a few
        seconds; what outlives the command gets SIGTERM then SIGKILL. A process's creation time is checked before
        it is signalled (psutil), so a reused pid is never hit."""
        self.note()
        for sig, wait in ((first, 10.0), (signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
            if self.proc.poll() is not None:
                break
            self.signal_all(sig)
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        for sig in (signal.SIGTERM, signal.SIGKILL):
            alive = self.members()
            if not alive:
                break
            for p in alive:
                with contextlib.suppress(psutil.Error, OSError):
                    p.send_signal(sig)
            deadline = time.monotonic() + 5.0
            while time.monotonic() < deadline and any(_alive(p) for p in alive):
                time.sleep(0.05)
        if self.proc.poll() is None:
            with contextlib.suppress(OSError):
                self.proc.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=5)

    def holders(self, inodes: Sequence[int]) -> List[psutil.Process]:
        """The live processes that hold one of the pipes ``inodes`` open: the tree first, else any process."""
        wanted = {f"pipe:[{ino}]" for ino in inodes}

        def holds(pid: int) -> bool:
            try:
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}") in wanted:
                            return True
            except OSError:
                pass
            return False

        found = [p for p in self.members() if holds(p.pid)]
        if not found:
            found = [p for p in psutil.process_iter() if p.pid != os.getpid() and _alive(p) and holds(p.pid)]
        return found


def _alive(p: psutil.Process) -> bool:
    try:
        return bool(p.is_running() and p.status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def _describe_process(p: psutil.Process) -> str:
    try:
        cmd = " ".join(p.cmdline()) or p.name()
    except psutil.Error:
        cmd = "?"
    return f"pid {p.pid}: {cmd[:80]}"


def _forwarded(signum: int) -> int:
    """The signal a pass passes on for the one the hunt received (SIGQUIT would dump cores: SIGTERM instead)."""
    return signal.SIGTERM if signum == signal.SIGQUIT else signum


class _Pass:
    """Run the user's command once, pass its output through (and into a log), show progress."""

    def __init__(self, name: str, command: Sequence[str], env: Dict[str, str], log_path: Path,
                 record_path: Path, timeout: Optional[float], *, cwd: Optional[Path] = None, quiet: bool = False):
        self.name, self.command, self.env = name, list(command), env
        self.cwd, self.quiet = cwd, quiet   # quiet: nothing on the console, no progress (the fix check's pass)
        self.log_path, self.record_path, self.timeout = log_path, record_path, timeout
        self.returncode: Optional[int] = None
        self.interrupted = False   # Ctrl-C, `kill <hunt>`, a closed terminal: the user stopped it
        self.signal: Optional[int] = None   # the signal that interrupted it
        self.timed_out = False     # --timeout
        self.detached: List[str] = []   # processes that held the output when the pass stopped waiting
        self.output: Optional[_Output] = None
        self._tree: Optional[_Tree] = None

    @property
    def stopped(self) -> Optional[Stop]:
        """``"interrupted"`` or ``"timed_out"`` when the pass was stopped rather than ended by itself."""
        return "interrupted" if self.interrupted else "timed_out" if self.timed_out else None

    @property
    def log_error(self) -> Optional[OSError]:
        """Why the pass's log could not be written (all of it), or ``None``."""
        return self.output.log_error if self.output is not None else None

    def tail(self, size: int = TAIL_BYTES) -> str:
        """The last ``size`` bytes the command wrote (stdout and stderr as they arrived), from memory."""
        if self.output is None:
            return ""
        with self.output.lock:
            return bytes(self.output.tail[-size:]).decode("utf-8", "replace")

    def stop(self, first: int = signal.SIGTERM) -> None:
        """Stop the command and its tree (when it still runs)."""
        if self._tree is not None:
            try:
                self._tree.stop(first)
            except HuntInterrupted:
                self._tree.stop(signal.SIGKILL)

    def run(self) -> int:
        start = time.monotonic()
        self.output = _Output(self.log_path)
        pipes = [os.pipe(), os.pipe()]
        try:
            proc = subprocess.Popen(self.command, env=self.env, stdout=pipes[0][1], stderr=pipes[1][1],
                                    start_new_session=True, cwd=self.cwd)
        except OSError as exc:
            for r, w in pipes:
                os.close(r)
                os.close(w)
            self.output.close()
            raise HuntError(f"cannot run {self.command[0]!r}: {exc.strerror or exc}"
                            f"{_command_fix(self.command[0], exc)}") from None
        finally:
            for _, w in pipes:
                with contextlib.suppress(OSError):
                    os.close(w)
        _RUNNING.append(self)
        shown = _Shown(quiet=self.quiet)   # stderr: mindguard's lines only; the training's traceback in the log
        copiers = [_Copier(pipes[0][0], sys.stdout, self.output, _Shown(quiet=True) if self.quiet else None),
                   _Copier(pipes[1][0], sys.stderr, self.output, shown)]
        try:
            self._tree = tree = _Tree(proc)
            for t in copiers:
                t.start()
            self._wait(proc, tree, start)
            self._drain(proc, tree, copiers)
        except HuntInterrupted as exc:   # while stopping or draining: no more waiting for the command
            self.interrupted, self.signal = True, self.signal or exc.signum
            _say(f"{self.name}: {exc.name} again; killing the command and every process it started")
            self.stop(signal.SIGKILL)
            for t in copiers:
                t.detach()
        finally:
            with contextlib.suppress(ValueError):
                _RUNNING.remove(self)
            if self.returncode is None:
                self.returncode = proc.poll()
            if not any(t.is_alive() for t in copiers):
                self.output.close()
        if shown.held and not self.quiet:
            what = "its traceback, " if shown.traceback else ""
            _say(f"{self.name}'s own output ({what}{shown.held} line{'s' if shown.held > 1 else ''} of stderr "
                 f"not shown): {self.log_path}")
        return self.returncode if self.returncode is not None else -1

    def _wait(self, proc: "subprocess.Popen[bytes]", tree: _Tree, start: float) -> None:
        last_shown = ""
        last_time = 0.0
        try:
            while True:
                try:
                    self.returncode = proc.wait(timeout=1.0)
                    return
                except subprocess.TimeoutExpired:
                    pass
                tree.note()
                elapsed = time.monotonic() - start
                if self.timeout and elapsed > self.timeout:
                    _say(f"{self.name}: timed out after {self.timeout:.0f}s; stopping the command and every process "
                         f"it started")
                    self.timed_out = True
                    tree.stop()
                    self.returncode = proc.returncode
                    return
                status = None if self.quiet else _progress(self.record_path)
                if status and (status != last_shown and time.monotonic() - last_time > 2.0
                               or time.monotonic() - last_time > 15.0):
                    _say(f"{self.name}: {status} ({elapsed:.0f}s)")
                    last_shown, last_time = status, time.monotonic()
        except HuntInterrupted as exc:
            self.interrupted, self.signal = True, exc.signum
            _say(f"{self.name}: interrupted ({exc.name}); stopping the command and every process it started")
            tree.stop(first=_forwarded(exc.signum))
            self.returncode = proc.returncode

    def _drain(self, proc: "subprocess.Popen[bytes]", tree: _Tree, copiers: List[_Copier]) -> None:
        """Let the copiers read what is left for :data:`DRAIN_SECONDS`; a pipe still open then is held by a
        process the command started: say which, and stop waiting for it."""
        deadline = time.monotonic() + DRAIN_SECONDS
        for t in copiers:
            t.ended.wait(max(0.0, deadline - time.monotonic()))
        open_pipes = [t for t in copiers if not t.ended.is_set()]
        if not open_pipes:
            for t in copiers:
                t.join(timeout=1.0)
            return
        for t in open_pipes:
            t.detach()
        holders = tree.holders([t.pipe_inode for t in open_pipes])
        self.detached = [_describe_process(p) for p in holders]
        who = "; ".join(self.detached) or "a process that could not be identified"
        _say(f"{self.name}: the command exited (code {proc.returncode}), but a process it started still holds its "
             f"output ({who}); not waiting for it (what it writes goes to {self.log_path} only)")


def _stop(proc: "subprocess.Popen[bytes]", first: int = signal.SIGTERM) -> None:
    """Stop ``proc`` (``first``, then SIGTERM, then SIGKILL) and every process it started (:class:`_Tree`)."""
    _Tree(proc).stop(first)


def disk_full(path: Path, *, slack: int = 1 << 16) -> Optional[str]:
    """``"<free> bytes free on <mount>"`` when the file system holding ``path`` has less than ``slack`` bytes free
    (or no inode left), else ``None``."""
    probe = Path(path)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        info = os.statvfs(probe)
    except OSError:
        return None
    free = info.f_bavail * info.f_frsize
    if free < slack:
        return f"{free} bytes free on the file system of {probe}"
    if info.f_files and info.f_favail == 0:
        return f"no inode left on the file system of {probe}"
    return None


NO_SPACE = (errno.ENOSPC, errno.EDQUOT)


def _progress(record_path: Path) -> Optional[str]:
    """Where the pass's latest record is (:func:`mindguard.hunt.result.progress`)."""
    return progress(_read_records(record_path))


def _read_records(record_path: Path) -> List[Dict[str, Any]]:
    out = []
    for path in _dist.rank_paths(record_path):
        try:
            out.append(read_json(path))
        except (OSError, ValueError):
            continue
    return out
