"""The protocol between the hunt and the training process has one home (issue 29), checked on the source text.

Pure Python (no MindSpore): the package's files are parsed, not imported."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

PACKAGE = Path(__file__).resolve().parents[1] / "mindguard"


def _string_constants(tree: ast.AST):
    """String literals that are not docstrings (a docstring may name a variable; code may not read one)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            yield node


def test_only_the_protocol_package_names_the_hunts_environment_variables():
    found = []
    for path in PACKAGE.rglob("*.py"):
        if "protocol" in path.relative_to(PACKAGE).parts:
            continue
        for node in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if "MINDGUARD_" in node.value:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value[:60]!r}")
    assert not found, "read or write MINDGUARD_* through mindguard.protocol.request:\n" + "\n".join(found)


def test_the_protocol_package_never_imports_mindspore():
    for path in (PACKAGE / "protocol").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            assert not any(n.split(".")[0] == "mindspore" for n in names), f"{path}:{node.lineno} imports {names}"


# the kernel catalogues of mindguard.protocol.kernels (issue 29: one list each)
_CATALOGUES = ("OPTIMIZER_KERNELS", "OPTIMIZER_WRITTEN_SLOTS", "IN_PLACE_WRITERS", "IN_PLACE_INPUT_SLOTS",
               "COPY_KERNELS", "WEIGHT_GRADIENT_KERNELS", "INTENDED_INFINITY_KERNELS", "UNWRITTEN_OUTPUT_SLOTS",
               "COLLECTIVE_KERNELS")
# lower-case forms that are also ordinary words (a dump scope "full", an "assign" in a message): only their
# kernel spelling counts
_WORDS = {"full", "fill", "select", "broadcast", "receive", "assign"}
# hints.py knows op types by the numerical trouble they can make (overflowing contractions, norm layers): a
# catalogue of another question, not a copy of a kernel role
_HINT_KINDS = {("analysis/hints.py", name) for name in ("conv2dbackpropfilter", "conv3dbackpropfilter", "batchnorm")}


def _catalogued_kernel_names():
    from mindguard.protocol import kernels

    names = set()
    for catalogue in _CATALOGUES:
        names.update(getattr(kernels, catalogue))
    return names


def test_kernel_types_are_catalogued_only_in_protocol_kernels():
    names = _catalogued_kernel_names()
    spellings = {name: name for name in names}
    spellings.update({name.lower(): name for name in names if name.lower() not in _WORDS})
    found = []
    for path in PACKAGE.rglob("*.py"):
        where = path.relative_to(PACKAGE).as_posix()
        if where == "protocol/kernels.py":
            continue
        for node in _string_constants(ast.parse(path.read_text(encoding="utf-8"))):
            if node.value in spellings and (where, node.value) not in _HINT_KINDS:
                found.append(f"{where}:{node.lineno}: {node.value!r} (catalogued as {spellings[node.value]!r})")
    assert {"ApplyAdam", "FusedAdam", "TensorMove", "BatchNorm", "MaskedFill", "AllReduce"} <= names, sorted(names)
    assert not found, "name kernel types through mindguard.protocol.kernels:\n" + "\n".join(found)
