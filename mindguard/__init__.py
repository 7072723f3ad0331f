"""mindguard: from "my MindSpore training went NaN somewhere" to "this operator, on this line, at this
step, on this input -- and here is the fix".

The public API is the list below. Names are imported lazily so that ``import mindguard`` (and the
CLI commands that only do arithmetic or read JSON) do not pay for ``import mindspore``.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from ._version import __version__

_PUBLIC = {
    # reproducibility
    "fix_randomness": "reproduce",
    "Reproducible": "reproduce",
    "save_params": "reproduce",
    "load_params": "reproduce",
    "ParamsMismatchError": "reproduce",
    "ReproducibilityError": "reproduce",
    "ReproducibilityWarning": "reproduce",
    # cell surgery
    "replace_cells": "cells",
    "CellSurgeryError": "cells",
    # failing step
    "FailureLocator": "locate",
    "FailureRecord": "locate",
    "NonFiniteError": "locate",
    "dump_iteration": "locate",
    "RecordError": "locate",
    # dump on demand
    "DumpConfig": "dump",
    "DumpConfigError": "dump",
    "enable_dump": "dump",
    "DumpOnDemand": "dump",
    "DumpNotWrittenError": "dump",
    "DumpArmedTooLate": "dump",
    # numerically safe cells
    "SafeNorm": "nn",
    "safe_norm": "nn",
    "make_safe": "nn",
    # analysis
    "analyze_dump": "analysis",
    "DumpReport": "analysis",
    # single-step replay
    "StepCapture": "step_replay",
    "replay": "step_replay",
    "ReplayReport": "step_replay",
    "capture_step": "step_replay",
    "CaptureError": "step_replay",
    "CaptureMismatchError": "step_replay",
    # weight protection
    "GuardedTrainStep": "step",
    "guard_model": "step",
    "SkipPolicy": "step",
    "RefusedStepsError": "step",
    # one-stop
    "Guard": "guard",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'mindguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .analysis import DumpReport, analyze_dump
    from .cells import CellSurgeryError, replace_cells
    from .dump import DumpArmedTooLate, DumpConfig, DumpConfigError, DumpNotWrittenError, DumpOnDemand, enable_dump
    from .guard import Guard
    from .locate import FailureLocator, FailureRecord, NonFiniteError, RecordError, dump_iteration
    from .nn import SafeNorm, make_safe, safe_norm
    from .reproduce import (ParamsMismatchError, ReproducibilityError, ReproducibilityWarning, Reproducible,
                            fix_randomness, load_params, save_params)
    from .step import GuardedTrainStep, RefusedStepsError, SkipPolicy, guard_model
    from .step_replay import (CaptureError, CaptureMismatchError, ReplayReport, StepCapture, capture_step,
                              replay)
