"""Make a failing run repeat at the same step: seeds, dataset shuffle, initial weights, dropout.

(Stub: ``current_seed`` is the contract other modules use; the rest is being written.)
"""
from __future__ import annotations

from typing import Optional

_FIXED_SEED: Optional[int] = None


def current_seed() -> Optional[int]:
    """The seed last passed to :func:`fix_randomness` in this process, or ``None`` if it was never called."""
    return _FIXED_SEED
