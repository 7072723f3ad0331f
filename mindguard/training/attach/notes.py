"""The attach hook's notes: one line each on stderr, prefixed so a user (and a reader of a pass's log) tells them
from the training's own output. Imports nothing heavy."""
from __future__ import annotations

import sys


def say(text: str) -> None:
    """One note on stderr (never raises: a closed stderr never changes the command)."""
    from ...protocol.attach import NOTE_PREFIX

    try:
        sys.stderr.write(NOTE_PREFIX + text + "\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
