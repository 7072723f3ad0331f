"""The package stays readable by size (issue 54): no module over 600 lines, no class over 300,
at most 3 functions over 80 lines; and training/ keeps its layout by job -- its top level holds the public faces
only, everything else lives in a subpackage (step/, checks/, record/, state/, child/, examine/, attach/).

Pure Python (no MindSpore): the files are parsed, not imported.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[1] / "mindguard"
TRAINING = PACKAGE / "training"
MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300
LONG_FUNCTION_LINES = 80
MAX_LONG_FUNCTIONS = 3   # measured (issue 54): tape_flow, replay, capture_step -- all in training/examine/
TRAINING_FACES = {"__init__.py", "guard.py", "watch.py", "locator.py", "run.py", "reproduce.py", "seed.py",
                  "saved_params.py"}
TRAINING_SUBPACKAGES = {"step", "checks", "record", "state", "child", "examine", "attach"}


def _modules(root: Path) -> List[Path]:
    return [path for path in sorted(root.rglob("*.py")) if "_vendor" not in path.parts]


def _sized(root: Path, kinds: Tuple[type, ...]) -> Iterator[Tuple[int, str]]:
    """``(lines, "file:name")`` of every definition of ``kinds`` under ``root``, nested ones included."""
    for path in _modules(root):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, kinds):
                yield node.end_lineno - node.lineno + 1, f"{path.relative_to(PACKAGE.parent)}:{node.name}"


def test_no_module_is_over_600_lines():
    long = [(len(path.read_text(encoding="utf-8").splitlines()), str(path.relative_to(PACKAGE.parent)))
            for path in _modules(PACKAGE)]
    assert not [m for m in long if m[0] > MAX_MODULE_LINES], sorted(m for m in long if m[0] > MAX_MODULE_LINES)


def test_no_class_is_over_300_lines():
    big = [c for c in _sized(PACKAGE, (ast.ClassDef,)) if c[0] > MAX_CLASS_LINES]
    assert not big, big


def test_few_functions_are_over_80_lines():
    long = sorted(f for f in _sized(PACKAGE, (ast.FunctionDef, ast.AsyncFunctionDef)) if f[0] > LONG_FUNCTION_LINES)
    assert len(long) <= MAX_LONG_FUNCTIONS, long


def test_training_is_laid_out_by_job():
    top = {path.name for path in TRAINING.iterdir() if path.suffix == ".py"}
    assert top == TRAINING_FACES, f"a module at training/'s top level that is no public face: {top - TRAINING_FACES}"
    folders = {path.name for path in TRAINING.iterdir() if path.is_dir() and (path / "__init__.py").exists()}
    assert folders == TRAINING_SUBPACKAGES, folders
