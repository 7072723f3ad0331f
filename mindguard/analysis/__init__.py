"""Reading a MindSpore dump: find the first operator that turned finite inputs into Inf/NaN.

One small module per concern: ``files`` (layout and file names), ``order`` (launches, execution order,
full names), ``trace`` (.ir source traces), ``stats`` (tensor statistics), ``origin`` (the search; ``tensor_reader``
reads the files, ``flow_inputs`` an outputs-only dump's inputs), ``evidence`` (its rules), ``stop`` (where a step
that raised stopped), ``flow`` (the data flow around the culprit), ``hints`` (which fix hint for which op;
``stop_hints`` and ``origin_hints`` for the stop point and a traced culprit, ``hint_text`` their shared words;
``ctc``, ``counts`` and ``callsite`` hold the facts some rest on) and ``rewrite`` (rewriting the user's line for
it), ``report`` (``analyze_dump``; ``step_files`` the step's files, ``kept_state`` a kept state's Parameters,
``describe`` the findings as the report says them, ``traced`` where their operands came from -- ``provenance``,
``param_origin``, ``constant_origin`` -- ``repeated_calls`` which call of a cell called twice a kernel belongs
to). The report model
(:class:`Finding`, :class:`DumpReport`) and its renderers live in :mod:`mindguard.report`.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__all__ = ["analyze_dump", "DumpReport", "Finding", "has_culprit"]


def __getattr__(name: str) -> Any:
    if name in __all__:   # lazily, like the root package's names: the report model's renderers use analysis's rules
        return getattr(importlib.import_module(f"{__name__}.report"), name)
    raise AttributeError(f"module 'mindguard.analysis' has no attribute {name!r}")


if TYPE_CHECKING:  # pragma: no cover
    from ..report.model import DumpReport, Finding, has_culprit
    from .report import analyze_dump
