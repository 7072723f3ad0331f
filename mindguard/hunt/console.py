"""What the hunt says, and where: its own lines on stderr (:func:`say`), the answer on stdout (:func:`console`).
Neither ever raises: a closed pipe (``| head``), a full disk behind a stream or an encoding that cannot show a
character never change the hunt's result. Never imports MindSpore."""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

from .._util.io import console_write

#: Who speaks in :func:`say`'s lines (``mindguard verify`` runs its passes through the same machinery).
SPEAKER = "mindguard hunt"


#: While set, :func:`say` says nothing: the fix check runs ``mindguard verify``'s machinery, whose lines are not the
#: hunt's (:func:`muted`).
MUTED = False


def say(message: str) -> None:
    """One line of the hunt's own on stderr."""
    if not MUTED:
        console_write(f"[{SPEAKER}] {message}\n", sys.stderr)


@contextlib.contextmanager
def muted() -> Iterator[None]:
    """:func:`say` silent inside."""
    global MUTED
    before, MUTED = MUTED, True
    try:
        yield
    finally:
        MUTED = before


def console(text: str) -> None:
    """The answer on stdout."""
    console_write(text if text.endswith("\n") else text + "\n", sys.stdout)
