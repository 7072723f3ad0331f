"""The training process. Its top level holds the public faces -- Guard (``guard``), FailureLocator (``locator``),
``watch``, the process's run (``run``: the step count, the first failure, the per-step events), reproducibility
(``reproduce``, ``saved_params``, ``seed``) -- and its subpackages one job each: ``step/`` (where the run is, dump
iterations, the events), ``checks/`` (the finiteness checks, their budget, verdicts, consensus across ranks),
``record/`` (the record, its files, the exception classifier, provenance), ``state/`` (the kept state: keeping,
resuming, RNG, data position, the user's checkpoints), ``child/`` (the hunt's side in the training process),
``examine/`` (step capture and replay), ``attach/`` (Guard attached from outside).

Its modules load on first use: ``mindguard.training.locator.FailureLocator`` works after ``import mindguard``."""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
