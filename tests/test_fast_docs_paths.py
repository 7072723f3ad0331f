"""The docs name only what exists: every repository path (``mindguard/...``, ``tests/...``, ``benchmarks/...``),
every backticked ``*.py`` file name and every backticked dotted ``mindguard.*`` name in README.md and docs/ resolves
to a file, a module, or a name defined in one (issue 54: the docs drifted from the tree). No MindSpore needed.

docs/mindspore-facts.md is a log of measurements: there only repository paths are checked (its bare file names are
often MindSpore's own), and a path a later change removed is allowed when the line says so ("removed").
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parent.parent
PATH = re.compile(r"(?<![\w./-])((?:mindguard|tests|benchmarks|samples|docs)/[\w./-]*\w)")
PY_NAME = re.compile(r"`([\w/.-]*?(\w+\.py))`")
DOTTED = re.compile(r"`(mindguard(?:\.\w+)+)")
FACTS = ROOT / "docs" / "mindspore-facts.md"


def _docs() -> List[Path]:
    return [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)]


def _lines() -> Iterator[Tuple[Path, int, str]]:
    for doc in _docs():
        for number, line in enumerate(doc.read_text().splitlines(), 1):
            yield doc, number, line


def _defines(source: Path, name: str) -> bool:
    """``name`` is defined, imported or listed (a lazy table's ``"name": ...``) in ``source``."""
    text = source.read_text()
    return re.search(rf"^\s*(?:async\s+)?(?:def|class)\s+{name}\b|^\s*{name}\s*[:=]|\bimport\b.*\b{name}\b|"
                     rf"[\"']{name}[\"']", text, re.M) is not None


def resolves(dotted: str) -> bool:
    """``mindguard.a.b.C``: a module ``mindguard/a/b.py`` (or package) defining ``C``, or shorter prefixes so."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        source = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if source.exists():
            return i == len(parts) or _defines(source, parts[i])
    return False


def test_every_repository_path_the_docs_name_exists():
    missing = [f"{doc.relative_to(ROOT)}:{n}: {path}" for doc, n, line in _lines()
               for path in (m.group(1).rstrip(".") for m in PATH.finditer(line))
               if not any(c in path for c in "*<") and not path.endswith("_")
               and not (ROOT / path).exists() and not (doc == FACTS and "removed" in line)]
    assert not missing, "the docs name paths that do not exist:\n" + "\n".join(missing)


def test_every_python_file_and_mindguard_name_the_docs_cite_exists():
    files = {p.name for top in ("mindguard", "tests", "benchmarks", "docs", "samples")
             for p in (ROOT / top).rglob("*.py")}
    files.add("setup.py")
    missing = []
    for doc, n, line in _lines():
        if doc == FACTS:
            continue
        missing += [f"{doc.relative_to(ROOT)}:{n}: {m.group(1)}" for m in PY_NAME.finditer(line)
                    if m.group(2) not in files and not m.group(1).startswith("mindspore/")]
        missing += [f"{doc.relative_to(ROOT)}:{n}: {m.group(1)}" for m in DOTTED.finditer(line)
                    if not resolves(m.group(1))]
    assert not missing, "the docs cite names that do not exist:\n" + "\n".join(missing)
