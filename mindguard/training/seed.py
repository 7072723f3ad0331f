"""The seed of this process's training, as far as mindguard knows it: the one state :mod:`mindguard.training.reproduce`
(which sets it) and :mod:`mindguard.training.run` (which records it) share, so that neither imports the other for it.

Never imports MindSpore at import time (``mindguard.training.run`` is imported by ``mindguard hunt``):
:func:`current_seed` asks MindSpore when it is called, during a training.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

#: the seed last passed to :func:`mindguard.fix_randomness` (None: never called in this process)
_FIXED_SEED: Optional[int] = None
#: an int the script passed to ``numpy.random.seed`` since :func:`note_numpy_seed` wrapped it
_NUMPY_SEED: List[Optional[int]] = [None]


def note_fixed_seed(seed: int) -> None:
    """:func:`mindguard.fix_randomness` seeded every random source with ``seed``."""
    global _FIXED_SEED
    _FIXED_SEED = seed


def current_seed() -> Optional[int]:
    """The seed of this process's training: the one last passed to :func:`mindguard.fix_randomness`, else the one
    set by ``mindspore.set_seed`` (which seeds numpy, the dataset pipeline and the ops too), else an int passed to
    ``numpy.random.seed`` after :mod:`mindguard.training.reproduce` was imported (the initializers draw from numpy);
    ``None``
    when none was."""
    if _FIXED_SEED is not None:
        return _FIXED_SEED
    import mindspore   # here, not at import time: see the module docstring

    seed = mindspore.get_seed()
    if isinstance(seed, int) and not isinstance(seed, bool):
        return seed
    return _NUMPY_SEED[0]


def note_numpy_seed() -> None:
    """Wrap ``numpy.random.seed`` once so that a seed the script sets there is known (:func:`current_seed`). The
    wrapper calls numpy's own function with the same arguments and returns what it returns."""
    original = np.random.seed
    if getattr(original, "__mindguard_seed__", False):
        return

    def seed(*args, **kwargs):
        value = args[0] if args else kwargs.get("seed")
        result = original(*args, **kwargs)
        _NUMPY_SEED[0] = int(value) if isinstance(value, (int, np.integer)) and not isinstance(value, bool) else None
        return result

    hooked: Any = seed
    hooked.__wrapped__ = original
    hooked.__doc__ = original.__doc__
    hooked.__mindguard_seed__ = True
    np.random.seed = hooked
