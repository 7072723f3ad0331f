"""Every error and warning mindguard raises on purpose, under one base: ``except mindguard.MindguardError``.

Each class also derives from the built-in exception it stands for (``ValueError`` for a bad value,
``TypeError`` for a value of the wrong type, ``RuntimeError`` for a state the run cannot go on from), so
code written against the built-in keeps working. Every message names the value, the rule it broke and
the fix. Warnings derive from :class:`MindguardWarning` (a ``UserWarning``).

An exception that is *not* a ``MindguardError`` and comes out of a mindguard call is either the
training's own (propagated unchanged, never wrapped) or a bug in mindguard.
"""
from __future__ import annotations

from typing import Any, Optional


class MindguardError(Exception):
    """Base class of every exception mindguard raises on purpose."""


class MindguardWarning(UserWarning):
    """Base class of every warning mindguard issues."""


# -- bad arguments ---------------------------------------------------------------------------------------
class ArgumentError(MindguardError, ValueError):
    """An argument has a value mindguard cannot use (the message says which, the rule and the fix)."""


class ArgumentTypeError(MindguardError, TypeError):
    """An argument has the wrong type (the message says which, what was given and what is expected)."""


# -- the failing step ------------------------------------------------------------------------------------
class NonFiniteError(MindguardError, RuntimeError):
    """The training went non-finite (``action="raise"``, or a ``mindguard.watch`` step); ``.record`` is the
    :class:`mindguard.protocol.record.FailureRecord` written to disk."""

    def __init__(self, message: str, record: Any = None):
        super().__init__(message)
        self.record = record


class RecordError(MindguardError, ValueError):
    """A failure-record file is missing, unreadable, not JSON, or does not follow the record schema."""


class HuntProtocolError(MindguardError, RuntimeError):
    """The ``MINDGUARD_*`` variables ``mindguard hunt`` sets for the training process are inconsistent."""


class HuntError(MindguardError, RuntimeError):
    """``mindguard hunt`` cannot go on (bad arguments, or the command does not give it what it needs)."""


# -- dump ------------------------------------------------------------------------------------------------
class DumpConfigError(MindguardError, ValueError):
    """A dump setting MindSpore would reject, ignore or rewrite. ``field``, ``value``, ``rule``, ``fix`` say
    which and why."""

    def __init__(self, field: str, value: Any, rule: str, fix: str):
        self.field, self.value, self.rule, self.fix = field, value, rule, fix
        super().__init__(f"dump config {field}={value!r}: {rule}. Fix: {fix}")


class DumpNotFoundError(MindguardError, FileNotFoundError):
    """No MindSpore dump (or not the rank / iteration asked for) where ``analyze_dump`` was pointed."""


class DumpInProgressError(DumpNotFoundError):
    """The dump iteration asked for is still being written (a training is dumping it now): not analysed."""


class NotRegularFileError(MindguardError, OSError):
    """A path that should be a regular file is a FIFO, socket, device or directory (never opened, so no hang)."""


class DumpNotWrittenError(MindguardError, RuntimeError):
    """The dump armed for a step did not produce that step's files."""


class DumpArmedTooLate(MindguardWarning):
    """The dump was armed after a graph had already compiled in this process: MindSpore will write nothing."""


# -- reproducibility and cells ---------------------------------------------------------------------------
class ReproducibilityError(MindguardError, RuntimeError):
    """The run cannot be made to repeat as asked (an unseeded shuffle with ``check_shuffle="raise"``, ...)."""


class ReproducibilityWarning(MindguardWarning):
    """Something in the run will make a rerun differ (an unseeded shuffle, no fixed seed, ...)."""


class ParamsMismatchError(MindguardError, ValueError):
    """Saved parameters do not match the network they are loaded into (names, shapes, dtypes, checksums)."""


class CellSurgeryError(MindguardError, RuntimeError):
    """A cell cannot be swapped safely (the graph already compiled, or an optimizer holds its parameters)."""


# -- capture, replay, protection -------------------------------------------------------------------------
class CaptureError(MindguardError, RuntimeError):
    """A capture that cannot be written or read (missing, incomplete, already present, no batch)."""


class CaptureMismatchError(MindguardError, ValueError):
    """The capture's parameters do not match the network (or optimizer) it is being loaded into."""


class ReplayError(MindguardError, RuntimeError):
    """mindguard's own recording or analysis of a replayed step failed (not an error of the training)."""


class RefusedStepsError(MindguardError, RuntimeError):
    """A ``GuardedTrainStep`` refused more consecutive updates than its ``max_skips`` allows."""


def describe_type(value: Optional[Any]) -> str:
    """``"'abc' (str)"``: a value and its type, for messages."""
    return f"{value!r} ({type(value).__name__})"
