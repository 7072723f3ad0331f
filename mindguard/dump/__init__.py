"""MindSpore's data dump, made safe to use: a validated config (:mod:`.config`), arming it before the first
compile (:mod:`.arm`), and callbacks that dump one step (:mod:`.callback`).

The dump's on-disk layout (``rank_<r>/<net_name>/<graph>/<iteration>/*.npy``, execution order, ``.ir``
traces) is read by :mod:`mindguard.analysis.files`. Names load lazily: ``mindguard.dump.config`` (what
``mindguard hunt`` uses) never imports MindSpore.
"""
from __future__ import annotations

import importlib
from typing import Any

_NAMES = {
    "DumpConfig": "config", "normalize_iteration": "config", "observing_config": "config",
    "ArmedDump": "arm", "compiled_graphs": "arm", "enable_dump": "arm",
    "DumpOnDemand": "callback", "StepDumpCheck": "callback", "find_iteration_dirs": "callback",
}
__all__ = ["DumpConfig", "DumpConfigError", "DumpArmedTooLate", "DumpNotWrittenError", *_NAMES]


def __getattr__(name: str) -> Any:
    if name in ("DumpConfigError", "DumpArmedTooLate", "DumpNotWrittenError"):
        from .. import errors

        return getattr(errors, name)
    module = _NAMES.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)
