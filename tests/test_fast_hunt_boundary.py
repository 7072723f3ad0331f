"""The hunt is free of the training side (issue 54): no module of ``mindguard/hunt/`` imports ``mindguard.training``
-- not at module level, not inside a function, not through a relative import -- and importing every hunt module
leaves no ``mindguard.training`` module loaded. What both sides read of the run folder (a kept state's
``state.json``, provenance comparisons, the locate dump's window) is :mod:`mindguard.protocol`'s.

Two checks: a source scan (``ast``: every ``import``/``from ... import`` node anywhere in the file) and a clean
interpreter that imports each ``mindguard.hunt.*`` module and lists ``sys.modules``.
"""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

pytestmark = pytest.mark.fast

ROOT = Path(__file__).resolve().parents[1]
HUNT = ROOT / "mindguard" / "hunt"
FORBIDDEN = "mindguard.training"


def _absolute(module: str, node: ast.ImportFrom, package: str) -> str:
    """The absolute module an ``ImportFrom`` names, its relative level resolved against ``package``."""
    if not node.level:
        return module
    base = package.split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([module] if module else []))


def imported_names(path: Path, package: str = "mindguard.hunt") -> Iterator[Tuple[int, str]]:
    """``(line, absolute module)`` of every import in ``path`` (function-level ones too); a ``from X import y``
    yields ``X`` and ``X.y`` (``y`` may be a submodule: ``from .. import training``)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node.module or "", node, package)
            yield node.lineno, module
            for alias in node.names:
                yield node.lineno, f"{module}.{alias.name}"
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
                "import_module", "__import__"):
            for arg in node.args[:1]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    yield node.lineno, arg.value


def _is_training(name: str) -> bool:
    return name == FORBIDDEN or name.startswith(FORBIDDEN + ".")


def test_the_scan_sees_every_way_of_importing_the_training_side(tmp_path):
    """The scan itself: module-level, function-level, relative and absolute, ``from .. import training``."""
    probe = tmp_path / "probe.py"
    probe.write_text("from ..training.resume import x\n"
                     "def f():\n"
                     "    from ..training import provenance\n"
                     "    import mindguard.training.state.rng\n"
                     "    from .. import training\n"
                     "    importlib.import_module('mindguard.training.state.keeper')\n"
                     "from ..protocol import kept_state\n"
                     "from .plan import FromRecordPlan\n")
    found = [(line, name) for line, name in imported_names(probe) if _is_training(name)]
    assert sorted({line for line, _ in found}) == [1, 3, 4, 5, 6], found
    clean = {name for _, name in imported_names(probe) if not _is_training(name)}
    assert "mindguard.protocol.kept_state" in clean and "mindguard.hunt.plan.FromRecordPlan" in clean


def test_no_hunt_module_imports_the_training_side():
    files = sorted(HUNT.glob("*.py"))
    assert len(files) > 10, files
    offending: List[str] = [f"{path.relative_to(ROOT)}:{line}: {name}"
                            for path in files for line, name in imported_names(path) if _is_training(name)]
    assert not offending, "the hunt imports the training side:\n" + "\n".join(offending)


def test_importing_every_hunt_module_loads_nothing_of_the_training_side():
    modules = sorted(f"mindguard.hunt.{path.stem}" for path in HUNT.glob("*.py") if path.stem != "__init__")
    code = ("import importlib, json, sys\n"
            f"for name in {modules!r}:\n"
            "    importlib.import_module(name)\n"
            "print(json.dumps(sorted(n for n in sys.modules if n == 'mindguard.training' "
            "or n.startswith('mindguard.training.') or n == 'mindspore' or n.startswith('mindspore.'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing the hunt loaded {loaded}"
