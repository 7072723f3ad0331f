"""mindguard: from "my MindSpore training went NaN somewhere" to "this operator, on this line, at this
step, on this input -- and here is the fix".

The root namespace holds the workflow (below); everything else lives in documented submodules:
:mod:`mindguard.reproduce` (``Reproducible``, ``save_params``/``load_params``), :mod:`mindguard.locator`
(``FailureLocator``), :mod:`mindguard.record` (``FailureRecord``, ``dump_iteration``), :mod:`mindguard.run`
(the process's run, ``reset_run``), :mod:`mindguard.dump` (``DumpConfig``, ``enable_dump``, ``DumpOnDemand``),
:mod:`mindguard.capture` (``StepCapture``, ``capture_step``), :mod:`mindguard.replay` (``replay``),
:mod:`mindguard.protect` (``SkipPolicy``), :mod:`mindguard.cells` (``replace_cells``),
:mod:`mindguard.analysis` (``DumpReport``), :mod:`mindguard.errors` (every error and warning class).

Names are imported lazily so that ``import mindguard`` (and the CLI commands that only do arithmetic or
read JSON) do not pay for ``import mindspore``.
"""
from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from ._version import __version__

_PUBLIC = {
    "fix_randomness": "reproduce",
    "Guard": "guard",
    "watch": "_watch",
    "guard_model": "protect",
    "GuardedTrainStep": "protect",
    "SafeNorm": "safe",
    "safe_norm": "safe",
    "make_safe": "safe",
    "analyze_dump": "analysis",
    "MindguardError": "errors",
    "NonFiniteError": "errors",
}

# names of earlier releases, still reachable from the root (with a DeprecationWarning naming their home)
_MOVED = {
    "Reproducible": "reproduce", "save_params": "reproduce", "load_params": "reproduce",
    "replace_cells": "cells", "FailureLocator": "locator", "FailureRecord": "record",
    "dump_iteration": "record", "DumpConfig": "dump", "enable_dump": "dump", "DumpOnDemand": "dump",
    "DumpReport": "analysis", "StepCapture": "capture", "capture_step": "capture", "replay": "replay",
    "ReplayReport": "replay", "SkipPolicy": "protect",
    "ParamsMismatchError": "errors", "ReproducibilityError": "errors", "ReproducibilityWarning": "errors",
    "CellSurgeryError": "errors", "RecordError": "errors", "DumpConfigError": "errors",
    "DumpNotWrittenError": "errors", "DumpArmedTooLate": "errors", "CaptureError": "errors",
    "CaptureMismatchError": "errors", "RefusedStepsError": "errors", "MindguardWarning": "errors",
}

__all__ = ["__version__", *_PUBLIC]


_SUBMODULES = ("analysis", "capture", "cells", "dump", "errors", "finite", "guard", "hunt", "locator", "protect",
               "record", "replay", "reproduce", "run", "safe")


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    module = _PUBLIC.get(name)
    if module is None and name in _MOVED:
        module = _MOVED[name]
        warnings.warn(f"mindguard.{name} moved to mindguard.{module}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    if module is None:
        raise AttributeError(f"module 'mindguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .analysis import analyze_dump
    from .errors import MindguardError, NonFiniteError
    from .guard import Guard
    from .protect import GuardedTrainStep, guard_model
    from .reproduce import fix_randomness
    from .safe import SafeNorm, make_safe, safe_norm
    from ._watch import watch
