"""The one table of stop signals and their names (mindguard.protocol.signals), which the hunt and the readers of a
pass's exit status share. Pure Python: real signal numbers of this platform, real exit statuses of processes."""
from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from mindguard.protocol.signals import STOP_SIGNALS, kill_cause, killed_by, signal_name, stopped_from_outside

pytestmark = pytest.mark.fast


def test_the_stop_signals_are_those_a_process_can_handle_and_not_sigkill() -> None:
    assert set(STOP_SIGNALS) == {signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT}
    assert signal.SIGKILL not in STOP_SIGNALS   # the OOM-killer's: a failure, not a stop from outside
    for sig in STOP_SIGNALS:
        previous = signal.getsignal(sig)
        try:
            signal.signal(sig, signal.SIG_IGN)   # each can be handled (SIGKILL and SIGSTOP cannot)
        finally:
            signal.signal(sig, previous)


def test_names_and_causes() -> None:
    assert signal_name(signal.SIGTERM) == "SIGTERM" and signal_name(int(signal.SIGINT)) == "SIGINT"
    assert signal_name(200) == "signal 200"
    assert kill_cause(signal.SIGKILL) == "SIGKILL: often the OOM-killer"
    assert kill_cause(signal.SIGSEGV) == "SIGSEGV"


@pytest.mark.parametrize("sig, from_outside", [(signal.SIGTERM, True), (signal.SIGINT, True),
                                               (signal.SIGKILL, False), (signal.SIGABRT, False)])
def test_the_exit_status_of_a_real_process_killed_by_a_signal(sig: signal.Signals, from_outside: bool) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import signal, sys, time; signal.signal(signal.SIGINT, "
                             "signal.SIG_DFL); print('up', flush=True); time.sleep(60)"],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "up\n"   # its handlers are set: signal it
        proc.send_signal(sig)
        returncode = proc.wait(timeout=60)
    finally:
        proc.kill()
        proc.wait()
    assert killed_by(returncode) == sig
    assert stopped_from_outside(returncode) is from_outside


def test_an_exit_is_no_kill() -> None:
    assert killed_by(0) is None and killed_by(1) is None and killed_by(None) is None
    assert not stopped_from_outside(0) and not stopped_from_outside(130) and not stopped_from_outside(None)
