"""The failure record's file as JSON: a non-finite loss written as a string, control characters shown escaped,
and reading the document -- and, for a running record, the progress file of the step in progress beside it.
:mod:`.record` re-exports :func:`read_record_data` and :func:`progress_problem`."""
from __future__ import annotations

import json
import math
import numbers
import re
import os
from pathlib import Path
from typing import Any, Optional, Union, overload

from .._util.io import read_regular_text
from ..errors import ArgumentError, ArgumentTypeError, RecordError
from . import folder as layout

PathLike = Union[str, "os.PathLike[str]"]


def loss_to_json(loss: Optional[float]) -> Union[float, str, None]:
    if loss is None:
        return None
    loss = float(loss)
    if math.isnan(loss):
        return "nan"
    if math.isinf(loss):
        return "inf" if loss > 0 else "-inf"
    return loss


def loss_from_json(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise ArgumentTypeError("bool")
    if isinstance(value, str):
        if value not in ("nan", "inf", "-inf"):
            raise ArgumentError(value)
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise ArgumentTypeError(type(value).__name__)


RECORD_LIMIT = 1 << 20  # bytes: a record is a few KB; anything larger is not one


@overload
def printable(text: str) -> str: ...


@overload
def printable(text: None) -> None: ...


def printable(text: Optional[str]) -> Optional[str]:
    """``text`` with control characters (terminal escapes) shown as ``\\x1b``, so a record cannot drive a terminal."""
    if text is None:
        return None
    return "".join(ch if ch.isprintable() or ch in "\n\t" else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


_RAISED_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b[^:]*:")


def one_line(message: str) -> str:
    """A failure's message on one line: a message of several lines (MindSpore's dataset error with its Python and
    C++ call stacks, a kernel's error with its C++ trace) as its first line and, when that does not say it, the
    Python exception the lines end in (``ValueError: corrupt image file 0158.png``), with how many lines the record
    holds."""
    lines = [line.strip() for line in message.split("\n") if line.strip()]   # (a \r stays: printable shows it)
    if len(lines) <= 1:
        return lines[0] if lines else ""
    raised = [line for line in lines[1:] if _RAISED_LINE.match(line)]
    said = f"{lines[0]} ... {raised[-1]}" if raised and raised[-1] not in lines[0] else lines[0]
    return f"{said} [{len(lines)} lines: the record's message]"


def record_document(path: PathLike) -> Any:
    """The JSON document at ``path``, as written; :class:`RecordError` names the file and the problem."""
    path = Path(path)
    try:
        text = read_regular_text(path, limit=RECORD_LIMIT)
    except FileNotFoundError:
        raise RecordError(f"no failure record at {str(path)!r}: the file does not exist (FailureLocator writes "
                          f"it when training starts; with several ranks it is named <name>.rank<N>.json)") from None
    except UnicodeDecodeError as exc:
        raise RecordError(f"{str(path)!r} is not a mindguard failure record: not UTF-8 text (byte "
                          f"{exc.start})") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read failure record {str(path)!r}: {getattr(exc, 'strerror', None) or exc}"
                          ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                          f"{exc.colno}); is it a mindguard failure record?") from None
    except RecursionError:
        raise RecordError(f"{str(path)!r} is not a mindguard failure record: JSON nested too deeply") from None
    except ValueError as exc:   # an integer of more than 4300 digits: no record field is one
        raise RecordError(f"{str(path)!r} is not a mindguard failure record: {exc}") from None
    return data


def progress_problem(path: PathLike) -> Optional[str]:
    """Why the progress file beside the running record at ``path`` cannot say the step in progress (damaged,
    truncated, another run's), or ``None`` (usable, absent, or the record is not running)."""
    try:
        data = record_document(path)
    except RecordError:
        return None
    progress = layout.progress_beside(path)
    if not isinstance(data, dict) or data.get("status") != "running" or not progress.exists():
        return None
    try:
        found = json.loads(read_regular_text(progress, limit=RECORD_LIMIT))
    except (OSError, ValueError, RecursionError) as exc:
        return (f"the progress file {progress} is damaged ({getattr(exc, 'msg', None) or exc}): the record alone "
                f"does not say the step the run was in")
    if not (isinstance(found, dict) and found.get("argv") == data.get("argv") and found.get("cwd") == data.get("cwd")
            and isinstance(found.get("global_step"), int)):
        return (f"the progress file {progress} is not this run's or is damaged: the record alone does not say the "
                f"step the run was in")
    return None


def read_record_data(path: PathLike) -> Any:
    """The record at ``path`` as a dict -- while it says ``running``, the running record of the step in progress
    that an always-on Guard stores into the progress file beside it (:func:`protocol.folder.progress_beside`), when
    that file holds one of the same run (same command line and folder) at the same step or later.
    :class:`RecordError` when the record itself cannot be read."""
    data = record_document(path)
    if not isinstance(data, dict) or data.get("status") != "running":
        return data
    try:
        progress = json.loads(read_regular_text(layout.progress_beside(path), limit=RECORD_LIMIT))
    except (OSError, ValueError, RecursionError):   # none (a record of the hunt's, an older version's), or unreadable
        return data
    if isinstance(progress, dict) and progress.get("status") == "running" \
            and progress.get("argv") == data.get("argv") and progress.get("cwd") == data.get("cwd") \
            and isinstance(progress.get("global_step"), int) \
            and progress["global_step"] >= (data.get("global_step") if isinstance(data.get("global_step"), int) else 0):
        return progress
    return data
