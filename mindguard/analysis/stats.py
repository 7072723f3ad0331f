"""Statistics of one tensor, the unit every report (dump analysis, replay) is made of."""
from __future__ import annotations

from typing import Any, Dict

import numpy as np

FP16_TINY = 2.0 ** -24      # smallest positive fp16 subnormal; non-zero |x| below it becomes 0 in fp16
FP16_MAX = 65504.0          # largest finite fp16; |x| above it becomes Inf in fp16


def tensor_stats(array: Any) -> Dict[str, Any]:
    """Shape, dtype, finite min/max and counts of zeros, NaN, +Inf, -Inf of ``array``.

    ``min``/``max`` are over the finite elements only (``None`` when there are none), so a single Inf
    does not hide the range of the rest. Non-float arrays (int tokens, bool flags) report counts of 0.
    """
    a = np.asarray(array)
    out: Dict[str, Any] = {"shape": list(a.shape), "dtype": str(a.dtype)}
    if a.dtype.kind in "fc":
        nan = np.isnan(a)
        pos_inf = np.isposinf(a)
        neg_inf = np.isneginf(a)
        finite = a[~(nan | pos_inf | neg_inf)]
        out.update(
            min=float(finite.min()) if finite.size else None,
            max=float(finite.max()) if finite.size else None,
            zeros=int(np.count_nonzero(a == 0)),
            nan=int(nan.sum()), pos_inf=int(pos_inf.sum()), neg_inf=int(neg_inf.sum()),
        )
    elif a.dtype.kind in "biu":
        out.update(min=a.min().item() if a.size else None, max=a.max().item() if a.size else None,
                   zeros=int(np.count_nonzero(a == 0)), nan=0, pos_inf=0, neg_inf=0)
    else:
        out.update(min=None, max=None, zeros=0, nan=0, pos_inf=0, neg_inf=0)
    return out


def is_nonfinite(stats: Dict[str, Any]) -> bool:
    """True when the stats count any NaN or Inf."""
    return bool(stats.get("nan") or stats.get("pos_inf") or stats.get("neg_inf"))


def nonfinite_counts(array: Any) -> Dict[str, int]:
    """Only the NaN/+Inf/-Inf counts of ``array`` (cheaper than :func:`tensor_stats`; all 0 for non-floats)."""
    a = np.asarray(array)
    if a.dtype.kind not in "fc" or a.size == 0:
        return {"nan": 0, "pos_inf": 0, "neg_inf": 0}
    if np.isfinite(a).all():
        return {"nan": 0, "pos_inf": 0, "neg_inf": 0}
    return {"nan": int(np.isnan(a).sum()), "pos_inf": int(np.isposinf(a).sum()), "neg_inf": int(np.isneginf(a).sum())}


def fp16_risk_counts(array: Any) -> Dict[str, int]:
    """For float32/float64 ``array``: how many finite values would underflow to 0 in fp16 (non-zero
    ``|x| < 2**-24``) or overflow to Inf (``|x| > 65504``). Zeros for other dtypes."""
    a = np.asarray(array)
    if a.dtype.kind != "f" or a.dtype.itemsize <= 2 or a.size == 0:
        return {"underflow": 0, "overflow": 0}
    mag = np.abs(a)
    finite = np.isfinite(mag)
    return {"underflow": int(np.count_nonzero((mag < FP16_TINY) & (mag > 0))),
            "overflow": int(np.count_nonzero((mag > FP16_MAX) & finite))}


def light_scan(array: Any) -> Dict[str, Any]:
    """What the analyzer needs of a tensor after the origin, in few passes: dtype, NaN/+Inf/-Inf counts,
    fp16 under/overflow counts (float32/64 only) and the largest finite magnitude (``absmax``, None if none)."""
    a = np.asarray(array)
    out: Dict[str, Any] = {"dtype": str(a.dtype), "nan": 0, "pos_inf": 0, "neg_inf": 0,
                           "underflow": 0, "overflow": 0, "absmax": None}
    if a.dtype.kind not in "fc" or a.size == 0:
        return out
    mag = np.abs(a)
    finite = np.isfinite(mag)
    all_finite = bool(finite.all())
    if not all_finite:
        out.update(nonfinite_counts(a))
    fin = mag if all_finite else mag[finite]
    out["absmax"] = float(fin.max()) if fin.size else None
    if a.dtype.kind == "f" and a.dtype.itemsize > 2:
        out["underflow"] = int(np.count_nonzero((fin < FP16_TINY) & (fin > 0)))
        out["overflow"] = int(np.count_nonzero(fin > FP16_MAX))
    return out
