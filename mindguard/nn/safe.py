"""Numerically safe drop-ins for the cells that turn a zero input into NaN gradients.

``mindspore.nn.Norm`` computes ``sqrt(sum(x**2))``. Its gradient, ``x / sqrt(sum(x**2))``, is ``0/0 = NaN``
at a zero vector (a padding embedding, a dead feature): the NaN reaches the weights and training goes on
silently. :class:`SafeNorm` computes ``sqrt(sum(x**2) + eps)`` instead.

The exact price (``s = sum(x**2)`` over the reduced axes, exact arithmetic)::

    0 <= SafeNorm(x) - Norm(x) = sqrt(s + eps) - sqrt(s) = eps / (sqrt(s + eps) + sqrt(s))
                              <= sqrt(eps)          (the maximum, at s = 0)
                              <= eps / (2 sqrt(s))   (for s > 0)
    relative difference (s > 0) <= eps / (2 s)

With the default ``eps = 1e-6``: at most ``1e-3`` absolute (only for an all-zero input), and below fp32
rounding (``~6e-8`` relative) once ``s >= 10``.
"""
from __future__ import annotations

import math
from numbers import Real
from typing import List, Tuple, Union

import numpy as np
from mindspore import nn, ops
from mindspore.common import dtype as mstype

from ..errors import ArgumentTypeError

Axis = Union[int, Tuple[int, ...]]

_LOW_PRECISION = (mstype.float16, mstype.bfloat16)


def _check_args(owner: str, axis, keep_dims, epsilon) -> None:
    """Validate constructor/functional arguments. Raises the built-in ``ValueError``/``TypeError``, not a
    ``MindguardError``: ``safe_norm`` also runs inside compiled ``construct`` code, where MindSpore's graph
    compiler accepts only built-in exception types."""
    if isinstance(axis, list):
        axis = tuple(axis)
    if isinstance(axis, bool) or not (isinstance(axis, int) or (isinstance(axis, tuple) and all(
            isinstance(a, int) and not isinstance(a, bool) for a in axis))):
        raise TypeError(f"{owner}(axis={axis!r}): axis must be an int or a tuple of ints (() = all axes), "
                        f"as for mindspore.nn.Norm")
    if isinstance(axis, tuple) and len(set(axis)) != len(axis):
        raise ValueError(f"{owner}(axis={axis!r}): axis has duplicates; list each axis once")
    if not isinstance(keep_dims, bool):
        raise TypeError(f"{owner}(keep_dims={keep_dims!r}): keep_dims must be True or False")
    if isinstance(epsilon, bool) or not isinstance(epsilon, Real):
        raise TypeError(f"{owner}(epsilon={epsilon!r}): epsilon must be a positive finite float, e.g. 1e-6")
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"{owner}(epsilon={epsilon!r}): epsilon must be positive and finite (it keeps "
                         f"sqrt away from 0; e.g. 1e-6)")
    if np.float32(epsilon) == 0 or not np.isfinite(np.float32(epsilon)):
        raise ValueError(f"{owner}(epsilon={epsilon!r}): epsilon is not representable in float32 (the sum is "
                         f"computed in float32), so it would have no effect; use e.g. 1e-6")


def _as_axis(axis) -> Axis:
    return tuple(axis) if isinstance(axis, list) else axis


class SafeNorm(nn.Cell):
    r"""Drop-in for ``mindspore.nn.Norm`` whose gradient stays finite at a zero input.

    Computes ``sqrt(reduce_sum(square(x), axis) + epsilon)``, with ``nn.Norm``'s arguments and output
    shapes: ``axis`` an int or tuple of ints (negative allowed; ``()`` reduces every axis to a scalar),
    ``keep_dims`` keeps the reduced axes with length 1.

    Compute dtype: for ``float16``/``bfloat16`` inputs the square, the sum, ``+ epsilon`` and the sqrt
    run in ``float32`` and the result is cast back to the input dtype. So ``epsilon`` is never rounded to
    0 (``1e-8`` is 0 in fp16) and small entries do not underflow when squared (``square(1e-4)`` is 0 in
    fp16) -- which also makes the value *more* accurate than ``nn.Norm`` in fp16. ``float32``/``float64``
    inputs are computed in their own dtype. This holds under AMP (``to_float(float16)``) too.

    Difference to ``nn.Norm`` (``s = sum(x**2)``, exact arithmetic): ``0 <= SafeNorm(x) - Norm(x) =
    eps / (sqrt(s + eps) + sqrt(s)) <= sqrt(eps)`` (attained at ``s = 0``), ``<= eps / (2 sqrt(s))`` for
    ``s > 0``; relative difference ``<= eps / (2 s)``. The gradient is ``x / sqrt(s + eps)``: 0 at a zero
    vector instead of NaN, and within a relative ``eps / (2 s)`` of ``nn.Norm``'s elsewhere.

    Args:
        axis: axes to reduce, int or tuple of ints. Default ``()`` (all).
        keep_dims: keep reduced axes as length 1. Default False.
        epsilon: positive finite float added under the square root (must be non-zero in float32).

    Raises:
        TypeError / ValueError: on a bad ``axis`` (not int/tuple of ints, duplicates), ``keep_dims`` (not
            bool) or ``epsilon`` (not a real number, ``<= 0``, NaN/Inf, or 0 in float32).
    """

    def __init__(self, axis: Axis = (), keep_dims: bool = False, epsilon: float = 1e-6):
        super().__init__()
        _check_args("SafeNorm", axis, keep_dims, epsilon)
        self.axis = _as_axis(axis)
        self.keep_dims = keep_dims
        self.epsilon = float(epsilon)
        self.reduce_sum = ops.ReduceSum(keep_dims)

    def construct(self, x):
        return _sqrt_sum_of_squares(x, self.reduce_sum, self.axis, self.epsilon)

    def extend_repr(self) -> str:
        return f"axis={self.axis}, keep_dims={self.keep_dims}, epsilon={self.epsilon}"


def safe_norm(x, axis: Axis = (), keep_dims: bool = False, epsilon: float = 1e-6):
    """Functional :class:`SafeNorm`: ``sqrt(reduce_sum(square(x), axis) + epsilon)``, same dtype rules and bound.

    Replaces the p=2 vector norm: ``ops.norm(x, dim=axis, keepdim=k)`` / ``mint.norm(x, 2, dim, k)`` /
    ``ops.norm(x)`` (all elements, i.e. Frobenius for a matrix) with ``ord=None`` or ``2`` for vectors and
    ``'fro'`` for matrices. Not covered: other orders (``p=1``, ``inf``, ``-inf``, ``0``, fractional), the
    matrix 2-norm / nuclear norm (``ord=2``/``'nuc'`` with a 2-tuple ``dim``; those use an SVD), complex
    inputs, and ``dtype=``/``out=`` arguments.

    Callable from eager code and from a ``construct`` compiled in GRAPH mode. Arguments are validated
    as for :class:`SafeNorm`.
    """
    _check_args("safe_norm", axis, keep_dims, epsilon)
    axis = _as_axis(axis)
    return _sqrt_sum_of_squares(x, ops.ReduceSum(keep_dims), axis, epsilon)


def _sqrt_sum_of_squares(x, reduce_sum, axis, epsilon):
    """``sqrt(reduce_sum(x**2, axis) + epsilon)``; fp16/bf16 inputs are computed in fp32 and cast back."""
    dtype = x.dtype
    if dtype in _LOW_PRECISION:
        x = ops.cast(x, mstype.float32)
    out = ops.sqrt(reduce_sum(ops.square(x), axis) + epsilon)
    if dtype in _LOW_PRECISION:
        out = ops.cast(out, dtype)
    return out


def make_safe(net: nn.Cell, *, epsilon: float = 1e-6) -> List[str]:
    """Replace every ``nn.Norm`` inside ``net`` by :class:`SafeNorm` with the same ``axis``/``keep_dims``, in place.

    Returns the dotted names of the replaced cells (``[]`` when there is none). ``nn.Norm`` owns no
    parameters, so parameter names and checkpoints are unaffected, and it works after the optimizer was
    built. Call it after building the network and before the first ``model.train``/``model.eval``/
    ``net(x)``: after a GRAPH-mode compile MindSpore would ignore the swap, so
    :class:`mindguard.nn.cells.CellSurgeryError` is raised instead.

    Raises:
        ArgumentTypeError (a TypeError): ``net`` is not a ``mindspore.nn.Cell``.
        ValueError: bad ``epsilon`` (see :class:`SafeNorm`).
        CellSurgeryError: ``net`` was already compiled in GRAPH mode.
    """
    from .cells import replace_cells

    if not isinstance(net, nn.Cell):
        raise ArgumentTypeError(f"make_safe(net=...) needs a mindspore.nn.Cell, got {type(net).__name__}")
    _check_args("make_safe", (), False, epsilon)
    return replace_cells(net, nn.Norm, lambda old: SafeNorm(axis=old.axis, keep_dims=old.keep_dims, epsilon=epsilon))
