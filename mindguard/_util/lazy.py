"""A package's face whose names load on first use: ``__getattr__ = lazy_names(__name__, {"Name": "module"})``.

Importing the face imports none of its modules (so a face adds no import edge: tests/test_fast_imports.py), and a
name's module runs on the first ``from package import Name``.
"""
from __future__ import annotations

import importlib
import sys
from typing import Any, Callable, Dict


def lazy_names(package: str, names: Dict[str, str]) -> Callable[[str], Any]:
    """The module ``__getattr__`` of ``package``: ``names`` maps each exported name to its submodule."""
    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(sys.modules[package], name, value)
        return value
    return __getattr__
