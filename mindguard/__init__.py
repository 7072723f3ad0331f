"""mindguard: from "my MindSpore training went NaN somewhere" to "this operator, on this line, at this
step, on this input -- and here is the fix".

The root namespace holds the workflow (below); everything else lives in documented submodules:
:mod:`mindguard.training.reproduce` (``Reproducible``, ``save_params``/``load_params``),
:mod:`mindguard.training.locator` (``FailureLocator``), :mod:`mindguard.protocol.record` (``FailureRecord``,
``dump_iteration``),
:mod:`mindguard.training.run` (the process's run, ``reset_run``), :mod:`mindguard.dump` (``DumpConfig``,
``enable_dump``, ``DumpOnDemand``),
:mod:`mindguard.training.examine.capture` (``StepCapture``, ``capture_step``), :mod:`mindguard.training.examine.replay`
(``replay``),
:mod:`mindguard.nn.protect` (``SkipPolicy``), :mod:`mindguard.nn.cells` (``replace_cells``),
:mod:`mindguard.analysis` (``DumpReport``), :mod:`mindguard.errors` (every error and warning class).

Names are imported lazily so that ``import mindguard`` (and the CLI commands that only do arithmetic or
read JSON) do not pay for ``import mindspore``.
"""
from __future__ import annotations

import importlib
import warnings
from typing import TYPE_CHECKING, Any

from . import _moved_modules
from ._version import __version__

_PUBLIC = {
    "fix_randomness": "training.reproduce",
    "Guard": "training.guard",
    "watch": "training.watch",
    "guard_model": "nn.protect",
    "GuardedTrainStep": "nn.protect",
    "SafeNorm": "nn.safe",
    "safe_norm": "nn.safe",
    "make_safe": "nn.safe",
    "analyze_dump": "analysis",
    "MindguardError": "errors",
    "NonFiniteError": "errors",
}

# names of earlier releases, still reachable from the root (with a DeprecationWarning naming their home)
_MOVED = {
    "Reproducible": "training.reproduce", "save_params": "training.reproduce", "load_params": "training.reproduce",
    "replace_cells": "nn.cells", "FailureLocator": "training.locator", "FailureRecord": "protocol.record",
    "dump_iteration": "protocol.record", "DumpConfig": "dump", "enable_dump": "dump", "DumpOnDemand": "dump",
    "DumpReport": "analysis", "StepCapture": "training.examine.capture", "capture_step": "training.examine.capture",
    "replay": "training.examine.replay",
    "ReplayReport": "training.examine.replay", "SkipPolicy": "nn.protect",
    "ParamsMismatchError": "errors", "ReproducibilityError": "errors", "ReproducibilityWarning": "errors",
    "CellSurgeryError": "errors", "RecordError": "errors", "DumpConfigError": "errors",
    "DumpNotWrittenError": "errors", "DumpArmedTooLate": "errors", "CaptureError": "errors",
    "CaptureMismatchError": "errors", "RefusedStepsError": "errors", "MindguardWarning": "errors",
}

__all__ = ["__version__", *_PUBLIC]


_SUBMODULES = ("analysis", "dump", "errors", "hunt", "nn", "protocol", "report", "training")

# Public modules of earlier releases at the package root: importing them still works (the module at its new home,
# with a DeprecationWarning naming it), through a finder installed below.
_MOVED_MODULES = {
    "guard": "training.guard", "locator": "training.locator", "run": "training.run",
    "budget": "training.checks.budget", "reproduce": "training.reproduce", "finite": "training.checks.finite",
    "capture": "training.examine.capture", "replay": "training.examine.replay", "record": "protocol.record",
    "safe": "nn.safe", "cells": "nn.cells", "protect": "nn.protect",
}
# training/'s flat modules of earlier releases, now in its subpackages by job (``mindguard.training.keeper`` is
# ``mindguard.training.state.keeper``); ``mindguard.training.checks`` is the checks' package, whose face gives the
# names of the module that was there (now ``mindguard.training.checks.finite``)
_MOVED_MODULES.update({f"training.{name}": f"training.{package}.{name}" for package, names in (
    ("step", "steps observe"),
    ("checks", "budget checked loss_scale consensus verdicts params"),
    ("record", "recorder record_writer hunt_line rate_notes classify provenance"),
    ("state", "keeper keep_schedule state_writer checkpoint_points random_sources resumer resume state_files "
              "state_folder rng dataset_skip user_checkpoints agreed_keeps run_state"),
    ("child", "pass_setup pass_end hunt_stop window_dump verify_run")) for name in names.split()})


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"{__name__}.{name}")
    if name in _MOVED_MODULES:
        return importlib.import_module(f"{__name__}.{name}")   # through the finder: warns, gives the new module
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


_moved_modules.install(__name__, _MOVED_MODULES)


def __dir__() -> list[str]:
    return sorted(__all__)


if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from .analysis import analyze_dump
    from .errors import MindguardError, NonFiniteError
    from .training.guard import Guard
    from .nn.protect import GuardedTrainStep, guard_model
    from .training.reproduce import fix_randomness
    from .nn.safe import SafeNorm, make_safe, safe_norm
    from .training.watch import watch
