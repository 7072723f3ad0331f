"""The signals that end a process from outside, and their names: one table for the hunt (which handles them and
passes them on to a pass's command) and for whoever reads how a pass's process ended (its exit status).

An exit status here is :attr:`subprocess.Popen.returncode`: ``-N`` when signal ``N`` killed the process.
"""
from __future__ import annotations

import signal
from typing import Optional, Tuple

#: Signals that stop a process from outside -- Ctrl-C, ``kill``, a closed terminal, a scheduler's preemption.
#: The hunt turns each into a controlled stop (SIGKILL and SIGSTOP cannot be handled), and a training ended by one
#: did not fail. SIGKILL is not among them: the OOM-killer sends it.
STOP_SIGNALS: Tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def signal_name(number: int) -> str:
    """``"SIGTERM"`` for 15; ``"signal 99"`` for a number this platform has no name for."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def killed_by(returncode: Optional[int]) -> Optional[int]:
    """The number of the signal that ended a process with exit status ``returncode``, or ``None`` (it exited, or
    has not ended)."""
    return -returncode if returncode is not None and returncode < 0 else None


def stopped_from_outside(returncode: Optional[int]) -> bool:
    """Whether exit status ``returncode`` is a kill by one of :data:`STOP_SIGNALS`."""
    return killed_by(returncode) in STOP_SIGNALS


def kill_cause(number: int) -> str:
    """What a kill by signal ``number`` most likely was, for a message: its name, and for SIGKILL that it is often
    the OOM-killer."""
    name = signal_name(number)
    return f"{name}: often the OOM-killer" if number == signal.SIGKILL else name
