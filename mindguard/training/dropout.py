"""Dropout whose masks a kept state can restore: what Guard puts in place of ``nn.Dropout`` when training starts.

On MindSpore 2.10 CPU ``nn.Dropout`` draws its masks from a generator inside its ``ops.Dropout`` kernel: it starts
again from its seeds in every process and no API reads or sets where it is (docs/mindspore-facts.md, sections
``rngscale`` and ``dropout``). A resumed step would draw the first step's masks, not the failing one's.

:class:`KeptStateDropout` computes the same thing -- keep each element with probability ``keep_prob``, scale the
kept ones by ``1 / keep_prob``, in training mode only -- from a *counter-based* draw: the mask of a call is a hash of
(the cell's seed, the cell's call count, the element's index). The call count is a ``Parameter`` of the cell
(``<cell name>.draws``, int32, not trainable), so it is part of every kept state and of the user's checkpoints, and a
resumed step draws exactly the failing run's masks. The draw is deterministic across processes and threads (the
CPU kernel's multi-threaded draws are not: docs/mindspore-facts.md, "Determinism").

The hash is lowbias32 (C. Wellons' integer hash: xor-shift, multiply, three times) of ``index xor key``, where the
key mixes the seed and the call count; the top 24 bits give a uniform number in [0, 1) compared with ``keep_prob``.
Its cost, measured against ``nn.Dropout`` in one run: docs/mindspore-facts.md, section ``dropout``.
"""
from __future__ import annotations

import os
import zlib
from functools import lru_cache
from typing import Any, List, Tuple

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops
from mindspore.ops.primitive import constexpr

#: lowbias32's multipliers (https://nullprogram.com/blog/2018/07/31/)
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B
#: the golden-ratio increment that spreads consecutive call counts over the 32-bit keys; a salt for the second key
_GOLDEN, _SALT = 0x9E3779B9, 0x27D4EB2F


def _int32(value: int) -> Any:
    """``value``'s low 32 bits as a (two's complement) int32."""
    return np.array(value & 0xFFFFFFFF, dtype=np.uint32).astype(np.int32)


def _mix_int(value: int) -> int:
    """lowbias32 on a Python int (for the per-cell seed, computed once)."""
    value &= 0xFFFFFFFF
    value ^= value >> 16
    value = (value * _MUL1) & 0xFFFFFFFF
    value ^= value >> 15
    value = (value * _MUL2) & 0xFFFFFFFF
    return value ^ (value >> 16)


def cell_seed(seed0: int, seed1: int, name: str) -> int:
    """The 32-bit seed of one dropout cell: its primitive's two seeds (from the global seed, as MindSpore gave them)
    and its dotted name (so two cells never share masks, even with no seed set)."""
    return _mix_int(_mix_int(seed0) ^ _mix_int(seed1 + _GOLDEN) ^ zlib.crc32(name.encode()))


#: tensors of up to this many elements get their ``index * _MUL1`` as a constant (4 MB at most each, 16 shapes
#: cached); bigger ones compute it per call (an ``arange`` more), so no constant grows with the activations
CONSTANT_ELEMENTS = 1 << 20


def _weyl_array(shape: Tuple[int, ...]) -> np.ndarray:
    """``index * _MUL1`` (mod 2**32, uint32) for every element index of ``shape`` (row-major, 0-based): the
    per-element half of the hash (cached when small)."""
    if int(np.prod(shape, dtype=np.int64)) <= CONSTANT_ELEMENTS:
        return _weyl_cached(shape)
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint32).reshape(shape) * np.uint32(_MUL1)


@lru_cache(maxsize=16)
def _weyl_cached(shape: Tuple[int, ...]) -> np.ndarray:
    return np.arange(int(np.prod(shape, dtype=np.int64)), dtype=np.uint32).reshape(shape) * np.uint32(_MUL1)


@lru_cache(maxsize=16)
def _weyl_tensor(shape: Tuple[int, ...]) -> Tensor:
    """:func:`_weyl_array` as an int32 Tensor (the graph's constant)."""
    return Tensor(_weyl_array(shape).astype(np.int32))


def host_keep(count: int, seed: int, keep_prob: float, shape: Tuple[int, ...], dtype: Any) -> np.ndarray:
    """The scaled keep mask (``0`` or ``1 / keep_prob`` per element, of ``dtype``) of a cell's ``count``-th call
    (1-based), computed with numpy: bit for bit what :meth:`KeptStateDropout.construct` computes in a graph."""
    with np.errstate(over="ignore"):
        u32 = np.uint32
        key1 = ((u32(count & 0xFFFFFFFF) * u32(_GOLDEN)) ^ u32(seed & 0xFFFFFFFF)) * u32(_MUL1)
        key2 = (key1 ^ u32(_SALT)) * u32(_MUL2)
        h = ((((_weyl_array(shape) ^ key1) * u32(_MUL2)) ^ key2) * u32(_MUL1)).view(np.int32)
    keep = h < np.int32(_threshold(keep_prob))
    return keep.astype(dtype) * np.asarray(1.0 / keep_prob, dtype=dtype)


def _threshold(keep_prob: float) -> int:
    """An element is kept when its hash, read as an int32 uniform over [-2**31, 2**31), is below this."""
    return int(_int32(min(round(keep_prob * 2.0 ** 32), 2 ** 32 - 1) - 2 ** 31))


#: the float dtypes an eager call computes its mask for with numpy
_NUMPY_FLOATS = {ms.float16: np.float16, ms.float32: np.float32, ms.float64: np.float64}


def _eager() -> bool:
    """Whether a cell's ``construct`` runs as Python now (PyNative, or GRAPH with ``MS_JIT=0``), not compiled."""
    return ms.get_context("mode") == ms.PYNATIVE_MODE or os.getenv("MS_JIT") == "0"


@constexpr
def _weyl(shape: Any) -> Tensor:
    """:func:`_weyl_tensor` as a graph constant (GRAPH: computed when the graph compiles)."""
    return _weyl_tensor(tuple(int(d) for d in shape))


class KeptStateDropout(nn.Cell):
    """``nn.Dropout`` with its random position in a Parameter (the masks a resumed step draws are the failing run's).

    Args:
        keep_prob: the probability of keeping an element, in (0, 1]; kept elements are scaled by ``1 / keep_prob``.
        seed: the cell's 32-bit seed (:func:`cell_seed`).
        p: the drop probability as the replaced cell showed it (``None`` when it was built with ``keep_prob``), for
            ``extend_repr`` and for code that reads ``cell.p``.

    ``draws`` (int32) counts the training-mode calls; the ``n``-th call (1-based) uses the key of count ``n``. In eval
    mode (``set_train(False)``) the cell returns its input and counts nothing, as ``nn.Dropout`` does.
    """

    def __init__(self, keep_prob: float, seed: int, p: Any = None):
        super().__init__()
        self.keep_prob = float(keep_prob)
        self.p = p
        self.scale = 1.0 / self.keep_prob
        self.threshold = Tensor(_threshold(self.keep_prob), ms.int32)
        self.seed_value = seed & 0xFFFFFFFF
        self.seed = Tensor(_int32(seed), ms.int32)
        self.golden, self.salt = Tensor(_int32(_GOLDEN), ms.int32), Tensor(_int32(_SALT), ms.int32)
        self.mul1, self.mul2 = Tensor(_int32(_MUL1), ms.int32), Tensor(_int32(_MUL2), ms.int32)
        self.one = Tensor(1, ms.int32)
        self.draws = Parameter(Tensor(0, ms.int32), name="draws", requires_grad=False)
        object.__setattr__(self, "_host_keep", None)   # the mask of the eager call under way (None in a graph)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """An eager call (PyNative) computes its mask with numpy (:func:`host_keep`: the graph's int32 ops run one
        by one there, ~40x the cost of ``nn.Dropout``'s kernel); a graph parses :meth:`construct` and never gets
        here."""
        x = args[0] if args else None
        if not (self.training and self.keep_prob < 1.0 and isinstance(x, Tensor) and _eager()):
            return super().__call__(*args, **kwargs)
        dtype = _NUMPY_FLOATS.get(x.dtype)
        if dtype is None:   # bfloat16, or not a float: the graph's ops compute it
            return super().__call__(*args, **kwargs)
        count = int(ops.assign_add(self.draws, self.one).asnumpy())
        keep = host_keep(count, self.seed_value, self.keep_prob, tuple(x.shape), dtype)
        object.__setattr__(self, "_host_keep", Tensor(keep))
        try:
            return super().__call__(*args, **kwargs)
        finally:
            object.__setattr__(self, "_host_keep", None)

    def construct(self, x):
        if not self.training or self.keep_prob == 1.0:
            return x
        if self._host_keep is not None:
            return x * self._host_keep
        count = ops.assign_add(self.draws, self.one)
        key1 = ops.bitwise_xor(count * self.golden, self.seed) * self.mul1
        key2 = ops.bitwise_xor(key1, self.salt) * self.mul2
        if x.size <= CONSTANT_ELEMENTS:
            index = _weyl(x.shape)
        else:
            index = ops.arange(0, x.size, 1, dtype=ms.int32).reshape(x.shape) * self.mul1
        h = ops.bitwise_xor(index, ops.broadcast_to(key1, x.shape)) * self.mul2
        h = ops.bitwise_xor(h, ops.broadcast_to(key2, x.shape)) * self.mul1
        keep = ops.cast(h < self.threshold, x.dtype) * ops.cast(self.scale, x.dtype)
        return x * keep

    def extend_repr(self) -> str:
        return f"p={self.p}" if self.p is not None else f"keep_prob={self.keep_prob}"


def _replacement(old: Any, name: str) -> KeptStateDropout:
    seed0 = int(old.dropout.attrs.get("Seed0", 0))
    seed1 = int(old.dropout.attrs.get("Seed1", 0))
    keep_prob = float(old.keep_prob) if old.p is None else 1.0 - float(old.p)
    return KeptStateDropout(keep_prob, cell_seed(seed0, seed1, name), p=old.p)


def restorable(cell: Any) -> bool:
    """Whether ``cell`` is an ``nn.Dropout`` that :func:`make_restorable` replaces (exactly that class: a subclass may
    change what it computes)."""
    return type(cell) is nn.Dropout and isinstance(getattr(cell, "dropout", None), ops.Dropout)


def make_restorable(network: Any) -> List[str]:
    """Replace every ``nn.Dropout`` in ``network`` by a :class:`KeptStateDropout` of the same keep probability, in
    place, before the network compiles; returns the dotted names replaced (``[]`` when none).

    Raises:
        CellSurgeryError: ``network`` was already compiled in GRAPH mode (:func:`mindguard.replace_cells`)."""
    from ..nn.cells import replace_cells

    names = {id(cell): name for name, cell in network.cells_and_names()}
    return replace_cells(network, restorable, lambda old: _replacement(old, names.get(id(old), "")))


def install(network: Any, replace: bool = True) -> List[str]:
    """What Guard and ``watch`` do when a training call starts, before its first step: note MindSpore's kernel seed
    table (:func:`mindguard.training.rng.note_training_starts`: random functions compiled from now on are named as not
    restorable) and, with ``replace``, :func:`make_restorable`. Never raises: a network already compiled in GRAPH
    mode (or any error of mindguard's own) keeps its ``nn.Dropout`` cells, with a warning; the kept state then names
    them as not restorable, as before."""
    from . import rng as _rng

    _rng.note_training_starts()
    if not replace or network is None or not isinstance(network, nn.Cell):
        return []
    try:
        return make_restorable(network)
    except Exception as exc:  # noqa: BLE001 - mindguard's own failure must not stop the training
        import warnings

        from ..errors import MindguardWarning

        warnings.warn(f"mindguard: keeping nn.Dropout's own random kernels ({type(exc).__name__}: {exc}); a hunt of "
                      f"this run cannot resume from a kept state", MindguardWarning, stacklevel=3)
        return []
