"""A hint's edit as data, and applied to a copy of the user's file (issue 52: every printed fix is checked): the
``now:``/``fix:`` pair a hint prints (:mod:`.hints`, :mod:`.rewrite` write them) read back as an :class:`Edit`
(:func:`edit_of`), and the copied line changed (:func:`apply_edit`). The user's own files are never written
(:mod:`mindguard.hunt.scratch` makes the copy). Never imports MindSpore.

Line numbers are 1-based (as a trace gives them).
"""
from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any, Dict, Optional

from ..errors import MindguardError

_NOW = re.compile(r"^(?P<indent>\s*)now:\s+(?P<code>.*?)(?:\s{4}\((?P<file>[^()\s]+):(?P<line>\d+)\))?\s*$")
_FIX = re.compile(r"^\s*fix:\s+(?P<new>.*\S)\s*$")
_IMPORTS_MINDGUARD = re.compile(r"^import\s+(?:[\w.]+\s*,\s*)*mindguard\s*(?:,|#|$)", re.M)
_FIRST_IMPORT = re.compile(r"^(?:import\s|from\s+(?!__future__\b)\S+\s+import\s)", re.M)


class Unchecked(MindguardError):
    """The edit cannot be checked; the message says why, in the words printed after ``unchecked``."""


@dataclasses.dataclass(frozen=True)
class Edit:
    """A hint's mechanical edit: in ``file`` (absolute), line ``line`` holds ``now``; the fix writes ``fix``."""

    file: str
    line: int
    now: str
    fix: str

    @property
    def where(self) -> str:
        return f"{os.path.basename(self.file)}:{self.line}"


def edit_of(hint: Optional[str], source: Any) -> Optional[Edit]:
    """The first ``now:``/``fix:`` pair of ``hint``, at the line the ``now:`` line names (``(file.py:37)``: a line
    of the same file as the culprit's) or at the culprit's own line (``source``: ``{"file", "line", "code"}``);
    ``None`` when the hint has no such pair or the culprit has no source file."""
    if not hint or not isinstance(source, dict) or not source.get("file"):
        return None
    lines = hint.splitlines()
    for i, text in enumerate(lines[:-1]):
        now, fix = _NOW.match(text), _FIX.match(lines[i + 1])
        if now is None or fix is None or not now.group("code"):
            continue
        file = str(source["file"])
        line = int(now.group("line")) if now.group("line") else source.get("line")
        if now.group("file") and os.path.basename(file) != now.group("file"):
            continue   # another file than the culprit's: where it is is not known
        if not isinstance(line, int) or line < 1:
            continue
        return Edit(file, line, now.group("code"), fix.group("new"))
    return None


def apply_edit(edit: Edit, copy: Path) -> Dict[str, Any]:
    """Change the copied file ``copy``: the line ``edit.line`` (or, the file edited since, the nearest line holding
    exactly ``edit.now``) becomes ``edit.fix`` at the same indentation; ``import mindguard`` is added before the
    first import when the fix uses ``mindguard.`` and the file does not import it. Returns what was done
    (``line``, ``import_added``); raises :class:`Unchecked` when the line is not there as the hint shows it."""
    try:
        text = copy.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise Unchecked(f"cannot read the copy of {edit.file}: {exc}") from None
    lines = text.split("\n")
    hits = [i for i, line in enumerate(lines) if line.strip() == edit.now.strip()]
    if not hits:
        raise Unchecked(f"{edit.where} does not hold `{edit.now}` as one line (a statement over several lines, or "
                        f"the file was edited since)")
    index = min(hits, key=lambda i: abs(i + 1 - edit.line))
    indent = lines[index][:len(lines[index]) - len(lines[index].lstrip())]
    lines[index] = indent + edit.fix.strip()
    added = False
    if "mindguard." in edit.fix and not _IMPORTS_MINDGUARD.search(text):
        first = _FIRST_IMPORT.search(text)
        at = text[:first.start()].count("\n") if first is not None else 0
        lines.insert(at, "import mindguard")
        added = True
    try:
        copy.write_text("\n".join(lines), encoding="utf-8")
    except OSError as exc:
        raise Unchecked(f"cannot write the copy of {edit.file}: {exc}") from None
    return {"line": index + 1, "import_added": added}
