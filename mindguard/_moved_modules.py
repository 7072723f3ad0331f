"""Old module paths of earlier releases (``mindguard.guard``, ``mindguard.record``, ...) kept importable after the
package was laid out by process (``mindguard.training.guard``, ``mindguard.protocol.record``, ...).

``import mindguard.guard`` gives the very module object at its new home (one module, so patching either name patches
both) and a :class:`DeprecationWarning` naming that home. Nothing else is done: no copy, no wrapper.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings
from typing import Dict, Optional, Sequence


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, new_name: str):
        self.new_name = new_name

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        warnings.warn(f"{spec.name} moved to {self.new_name}; import it from there", DeprecationWarning, stacklevel=3)
        return importlib.import_module(self.new_name)

    def exec_module(self, module: types.ModuleType) -> None:
        """The module ran at its new home already."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    def __init__(self, package: str, moved: Dict[str, str]):
        self.moved = {f"{package}.{old}": f"{package}.{new}" for old, new in moved.items()}

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[types.ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        new_name = self.moved.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(fullname, _AliasLoader(new_name))


def install(package: str, moved: Dict[str, str]) -> None:
    """Make ``package.<old>`` import ``package.<new>`` for every ``old: new`` of ``moved`` (once per process)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder(package, moved))
