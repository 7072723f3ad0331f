"""Argument checks shared by every public entry point: one wording for "must be an integer >= 0" and friends.

Each check raises :class:`~mindguard.errors.ArgumentTypeError` (wrong type) or
:class:`~mindguard.errors.ArgumentError` (wrong value) with ``what`` (e.g. ``"FailureLocator(action=...)"``),
the value given, the rule and, where one helps, an example fix.
"""
from __future__ import annotations

import math
import numbers
from typing import Any, Iterable, Optional

from ..errors import ArgumentError, ArgumentTypeError


def is_int(value: Any) -> bool:
    """True for a Python or numpy integer that is not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def require_int(what: str, value: Any, *, minimum: Optional[int] = 0, example: str = "") -> int:
    """``value`` as an ``int`` ``>= minimum`` (``minimum=None``: any integer)."""
    hint = f"; e.g. {example}" if example else ""
    if not is_int(value):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise ArgumentTypeError(f"{what} must be an integer{bound}, got {value!r} ({type(value).__name__}){hint}")
    if minimum is not None and value < minimum:
        raise ArgumentError(f"{what} must be an integer >= {minimum}, got {value}{hint}")
    return int(value)


def require_real(what: str, value: Any, *, minimum: Optional[float] = None, finite: bool = True,
                 nonzero: bool = False, example: str = "") -> float:
    """``value`` as a ``float`` (a real number, not a bool), finite and ``>= minimum`` as asked."""
    hint = f"; e.g. {example}" if example else ""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentTypeError(f"{what} must be a number, got {value!r} ({type(value).__name__}){hint}")
    value = float(value)
    if finite and not math.isfinite(value):
        raise ArgumentError(f"{what} must be a finite number, got {value}{hint}")
    if minimum is not None and value < minimum:
        raise ArgumentError(f"{what} must be >= {minimum:g}, got {value:g}{hint}")
    if nonzero and value == 0:
        raise ArgumentError(f"{what} must not be 0{hint}")
    return value


def require_bool(what: str, value: Any) -> bool:
    """``value`` when it is ``True`` or ``False`` (not 0/1, not a string)."""
    if not isinstance(value, bool):
        raise ArgumentTypeError(f"{what} must be True or False, got {value!r} ({type(value).__name__})")
    return value


def require_choice(what: str, value: Any, choices: Iterable[str], *, explain: str = "") -> str:
    """``value`` when it is one of ``choices``."""
    options = list(choices)
    if not isinstance(value, str) or value not in options:
        more = f": {explain}" if explain else ""
        raise ArgumentError(f"{what} must be one of {options}, got {value!r}{more}")
    return value
