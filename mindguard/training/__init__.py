"""The training process: Guard, FailureLocator and watch; the run (step counting: ``run``, ``steps``), dump
iterations (``observe``), the record (``recorder``, ``record_writer``), the kept state (``keeper``, ``resumer``,
``run_state``; RNG, data position), the budget and the Parameter checks (``checks``, ``checked``, ``verdicts``),
the consensus across ranks, the failure classifier, dataset skipping, reproducibility; ``examine/``: step capture
and replay.

Its modules load on first use: ``mindguard.training.locator.FailureLocator`` works after ``import mindguard``."""
from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType


def __getattr__(name: str) -> ModuleType:
    if not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
