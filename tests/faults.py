"""Helpers for the fault tests (tests/test_faults*.py): training scripts that fail on purpose, hunts started as real
processes, the process tree they leave, a small full disk."""
from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

import psutil
import pytest

#: A training that fails at global step 5 of 8 (a padded batch through nn.Norm), in a few seconds. ``HOOK`` (a
#: Callback's ``on_train_step_end`` body, ``step`` and ``hunt_pass`` defined) lets a test add a fault.
FAILING = """
import os, signal, sys, time
from pathlib import Path
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback, Model
import mindguard
from mindguard.demos.norm_nan import build_network, make_dataset

hunt_pass = os.environ.get("MINDGUARD_HUNT_PASS")

class Fault(Callback):
    def on_train_step_end(self, run_context):
        step = run_context.original_args().get("cur_step_num")
{hook}

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.05))
model.train({epochs}, make_dataset(4, poison_step={poison}), callbacks=[mindguard.Guard(), Fault()],
            dataset_sink_mode=False)
"""


def failing(hook: str = "        pass", *, epochs: int = 2, poison: int = 5) -> str:
    """A training script: fails at global step ``poison`` (no failure with ``poison=0``) of ``4 * epochs``."""
    return FAILING.format(hook=hook, epochs=epochs, poison=poison if poison else 10_000)


def hunt_env(**extra: str) -> dict:
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    env.update(extra)
    return env


def start_hunt(run: Path, *command: str, options: Sequence[str] = (), cwd=None, env=None,
               stdout=subprocess.PIPE) -> subprocess.Popen:
    """``mindguard hunt`` as a real process in a session of its own (so the test can always clean up after it)."""
    return subprocess.Popen([sys.executable, "-m", "mindguard", "hunt", "--run-dir", str(run), *options, "--",
                             *command], stdout=stdout, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            env=env or hunt_env(), start_new_session=True, preexec_fn=default_stop_signals)


def default_stop_signals() -> None:
    """In the hunt's process: the stop signals as a terminal gives them, whatever the test run was started with --
    a suite started in the background (`pytest ... &` from a script) ignores SIGINT and SIGQUIT, one under `nohup`
    SIGHUP, and the hunt (as Python for SIGINT) keeps a signal it was started with ignored."""
    for name in ("SIGINT", "SIGQUIT", "SIGHUP", "SIGTERM"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)


def wait_for(condition: Callable[[], bool], timeout: float, what: str, proc: Optional[subprocess.Popen] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    if proc is not None and proc.poll() is None:
        kill_session(proc)
    out, err = proc.communicate() if proc is not None else ("", "")
    raise AssertionError(f"never: {what}\n--- stdout ---\n{(out or '')[-3000:]}\n--- stderr ---\n{(err or '')[-3000:]}")


def tree_of(pid: int) -> List[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def gone(processes: Sequence[psutil.Process], timeout: float = 60) -> List[psutil.Process]:
    """Wait until every one of ``processes`` has ended (or is a zombie); return those still running when
    ``timeout`` seconds passed -- a bound for a test that fails, not a pause: a healthy test returns as soon as the
    last one ends (a process the hunt SIGKILLed may take a moment to be torn down on a loaded machine)."""
    deadline = time.monotonic() + timeout
    while alive(processes) and time.monotonic() < deadline:
        psutil.wait_procs(alive(processes), timeout=min(1.0, max(0.0, deadline - time.monotonic())))
    return alive(processes)


def alive(processes: Sequence[psutil.Process]) -> List[psutil.Process]:
    """Those still running (a zombie has ended: only its exit status waits for a parent that is gone)."""
    out = []
    for p in processes:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.Error:
            continue
    return out


def tagged(tag: str) -> List[psutil.Process]:
    """Every live process whose command line mentions ``tag`` (a test's tmp folder): ps of what a test started."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if p.pid == os.getpid():
            continue
        try:
            if any(tag in part for part in (p.info["cmdline"] or [])):
                found.append(p)
        except psutil.Error:
            continue
    return alive(found)


def kill_session(proc: subprocess.Popen) -> None:
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)


def kill_all(processes: Sequence[psutil.Process]) -> None:
    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.kill()


def describe(processes: Sequence[psutil.Process]) -> str:
    out = []
    for p in processes:
        try:
            out.append(f"{p.pid} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            out.append(str(p.pid))
    return "; ".join(out)


@contextlib.contextmanager
def small_disk(size: str = "2m") -> Iterator[Path]:
    """A real small file system (tmpfs of ``size``) mounted for the test, or the test is skipped saying why."""
    mount = Path(tempfile.mkdtemp(prefix="mindguard_full_"))
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        mount.rmdir()
        pytest.skip(f"cannot mount a small tmpfs for a full disk here ({proc.stderr.strip() or proc.returncode}); "
                    f"run the tests as root on Linux")
    try:
        os.chmod(mount, 0o777)
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
        with contextlib.suppress(OSError):
            mount.rmdir()


def fill(path: Path) -> None:
    """Fill the file system of ``path``: a file ``path`` grows until the disk refuses more (unbuffered writes, so
    closing it flushes nothing that could fail)."""
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\0" * size)
            except OSError:
                continue


FILL_SNIPPET = '''
def fill(path):   # the disk of path fills up (unbuffered: closing flushes nothing that could fail)
    with open(path, "wb", buffering=0) as f:
        for size in (65536, 4096, 512, 1):
            try:
                while True:
                    f.write(b"\\0" * size)
            except OSError:
                continue
'''
