"""A pytest plugin that makes MindSpore unimportable, to prove the fast tier needs none of it.

Enable it with ``-p tests.without_mindspore`` from the repository's root (``.ci/run`` does, for the fast run)::

    python -m pytest -p tests.without_mindspore -m fast tests

A meta-path finder placed first on ``sys.meta_path`` refuses ``mindspore`` and every ``mindspore.*`` module with
``ModuleNotFoundError`` -- what a machine without the wheel gives -- so a fast test (or a module it imports at
collection) that reaches MindSpore fails to collect or fails, instead of passing quietly on a machine that has it.
A test module that marks nothing ``fast`` (no ``mark.fast`` in its text) is not collected at all under the plugin:
it holds no test of the fast tier, and importing it would only fail on its module-level ``import mindspore``.
The plugin is imported by ``-p`` before any conftest or test module; if MindSpore was imported already (another
plugin), it stops the session rather than pretend.
"""
from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from pathlib import Path
from types import ModuleType
from typing import Optional, Sequence

import pytest

BLOCKED = "mindspore"


class MindSporeBlocker(importlib.abc.MetaPathFinder):
    """Refuses to find ``mindspore`` and its submodules; every other import goes on to the next finder."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname == BLOCKED or fullname.startswith(BLOCKED + "."):
            raise ModuleNotFoundError(
                f"No module named {fullname!r} (blocked by tests/without_mindspore.py: a fast test must not "
                f"import MindSpore; move the import into the test that needs it or drop the fast mark)",
                name=fullname)
        return None


_BLOCKER = MindSporeBlocker()


def pytest_configure(config: pytest.Config) -> None:
    """Install the blocker (first on the meta path) for the whole session."""
    already = sorted(name for name in sys.modules if name == BLOCKED or name.startswith(BLOCKED + "."))
    if already:
        raise pytest.UsageError(f"tests/without_mindspore.py: MindSpore was imported before the plugin loaded "
                                f"({already[0]}); run without the plugin that imports it")
    sys.meta_path.insert(0, _BLOCKER)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> Optional[bool]:
    """Skip a ``test_*.py`` module that marks no test ``fast``; decide nothing about any other path."""
    name = collection_path.name
    if collection_path.suffix == ".py" and name.startswith("test_") and collection_path.is_file():
        if "mark.fast" not in collection_path.read_text(encoding="utf-8", errors="replace"):
            return True
    return None


def pytest_unconfigure(config: pytest.Config) -> None:
    """Take the blocker off again (an in-process pytest run, e.g. pytester, leaves the interpreter clean)."""
    if _BLOCKER in sys.meta_path:
        sys.meta_path.remove(_BLOCKER)


def pytest_report_header(config: pytest.Config) -> str:
    return "mindspore: blocked (tests/without_mindspore.py)"
