"""Statistics of one tensor, the unit every report (dump analysis, replay) is made of.

Every scan walks the tensor in chunks of :data:`CHUNK` elements, so a memory-mapped dump file
(``np.load(mmap_mode="r")``) is never copied whole: peak extra memory is a small multiple of one chunk
(~4 MB of float32), whatever the tensor's size. Complex tensors are described by their magnitude ``|x|``:
``min``/``max`` are of ``|x|`` and every infinite element counts in ``pos_inf``.
"""
from __future__ import annotations

from typing import Any, Dict, Iterator

import numpy as np

FP16_TINY = 2.0 ** -24      # smallest positive fp16 subnormal; non-zero |x| below it becomes 0 in fp16
FP16_MAX = 65504.0          # largest finite fp16; |x| above it becomes Inf in fp16
CHUNK = 1 << 20             # elements per scan step
SMALL_INT_VALUES = 4096     # integer tensors up to this many elements keep their values (``values``, flattened)
#: The non-finite counts of the statistics: ``(key, label)``, in the order they are said (the report's own copy,
#: ``mindguard.report.render.NONFINITE_COUNTS``, keeps the report free of the analysis at import).
NONFINITE_COUNTS = (("nan", "NaN"), ("pos_inf", "+Inf"), ("neg_inf", "-Inf"))


def _chunks(a: np.ndarray) -> Iterator[np.ndarray]:
    """Consecutive 1-D pieces of ``a`` (views when ``a`` is contiguous in C or Fortran order)."""
    flat = np.ravel(a, order="K")
    for start in range(0, flat.size, CHUNK):
        yield flat[start:start + CHUNK]


def _scan(a: np.ndarray, *, full: bool) -> Dict[str, Any]:
    """One pass: NaN/+Inf/-Inf/zero counts, finite min/max (``full``) or largest finite magnitude, fp16 risk."""
    kind = a.dtype.kind
    out: Dict[str, Any] = {"nan": 0, "pos_inf": 0, "neg_inf": 0, "zeros": 0, "min": None, "max": None,
                           "absmax": None, "underflow": 0, "overflow": 0}
    risk = kind == "f" and a.dtype.itemsize > 2
    for chunk in _chunks(a):
        if kind == "c":
            chunk = np.abs(chunk)
        nan = np.isnan(chunk)
        n_nan = int(np.count_nonzero(nan))
        pos = chunk == np.inf
        neg = chunk == -np.inf
        n_pos, n_neg = int(np.count_nonzero(pos)), int(np.count_nonzero(neg))
        out["nan"] += n_nan
        out["pos_inf"] += n_pos
        out["neg_inf"] += n_neg
        finite = chunk if not (n_nan or n_pos or n_neg) else chunk[~(nan | pos | neg)]
        del nan, pos, neg
        if full:
            out["zeros"] += int(np.count_nonzero(finite == 0))
        if finite.size:
            lo, hi = float(finite.min()), float(finite.max())
            out["min"] = lo if out["min"] is None else min(out["min"], lo)
            out["max"] = hi if out["max"] is None else max(out["max"], hi)
            if risk:
                mag = np.abs(finite)
                out["underflow"] += int(np.count_nonzero((mag < FP16_TINY) & (mag > 0)))
                out["overflow"] += int(np.count_nonzero(mag > FP16_MAX))
    if out["min"] is not None:
        out["absmax"] = max(abs(out["min"]), abs(out["max"]))
    return out


def _int_range(a: np.ndarray) -> Dict[str, Any]:
    lo = hi = None
    zeros = 0
    for chunk in _chunks(a):
        if chunk.size:
            c_lo, c_hi = chunk.min().item(), chunk.max().item()
            lo = c_lo if lo is None else min(lo, c_lo)
            hi = c_hi if hi is None else max(hi, c_hi)
            zeros += int(np.count_nonzero(chunk == 0))
    return {"min": lo, "max": hi, "zeros": zeros}


def tensor_stats(array: Any) -> Dict[str, Any]:
    """Shape, dtype, finite min/max and counts of zeros, NaN, +Inf, -Inf of ``array``.

    ``min``/``max`` are over the finite elements only (``None`` when there are none), so a single Inf
    does not hide the range of the rest. Non-float arrays (int tokens, bool flags) report counts of 0.
    """
    a = np.asarray(array)
    out: Dict[str, Any] = {"shape": list(a.shape), "dtype": str(a.dtype)}
    if a.dtype.kind in "fc":
        scan = _scan(a, full=True)
        out.update(min=scan["min"], max=scan["max"], zeros=scan["zeros"], nan=scan["nan"],
                   pos_inf=scan["pos_inf"], neg_inf=scan["neg_inf"])
        if a.dtype.kind == "c":
            out["of"] = "abs"
    elif a.dtype.kind in "biu":
        out.update(_int_range(a), nan=0, pos_inf=0, neg_inf=0)
        if 0 < a.size <= SMALL_INT_VALUES:   # labels, lengths, counts: what a hint checks element by element
            out["values"] = np.asarray(a).reshape(-1).tolist()
    else:
        out.update(min=None, max=None, zeros=0, nan=0, pos_inf=0, neg_inf=0)
    return out


def is_nonfinite(stats: Dict[str, Any]) -> bool:
    """True when the stats count any NaN or Inf."""
    return bool(stats.get("nan") or stats.get("pos_inf") or stats.get("neg_inf"))


def nonfinite_counts(array: Any) -> Dict[str, int]:
    """Only the NaN/+Inf/-Inf counts of ``array`` (all 0 for non-floats)."""
    a = np.asarray(array)
    if a.dtype.kind not in "fc" or a.size == 0:
        return {"nan": 0, "pos_inf": 0, "neg_inf": 0}
    scan = _scan(a, full=False)
    return {"nan": scan["nan"], "pos_inf": scan["pos_inf"], "neg_inf": scan["neg_inf"]}


def fp16_risk_counts(array: Any) -> Dict[str, int]:
    """For float32/float64 ``array``: how many finite values would underflow to 0 in fp16 (non-zero
    ``|x| < 2**-24``) or overflow to Inf (``|x| > 65504``). Zeros for other dtypes."""
    a = np.asarray(array)
    if a.dtype.kind != "f" or a.dtype.itemsize <= 2 or a.size == 0:
        return {"underflow": 0, "overflow": 0}
    scan = _scan(a, full=False)
    return {"underflow": scan["underflow"], "overflow": scan["overflow"]}


def full_scan(array: Any) -> "tuple[Dict[str, Any], Dict[str, int]]":
    """``(tensor_stats(array), fp16_risk_counts(array))`` in one pass over the data."""
    a = np.asarray(array)
    if a.dtype.kind not in "fc":
        return tensor_stats(a), {"underflow": 0, "overflow": 0}
    scan = _scan(a, full=True)
    stats = {"shape": list(a.shape), "dtype": str(a.dtype), "min": scan["min"], "max": scan["max"],
             "zeros": scan["zeros"], "nan": scan["nan"], "pos_inf": scan["pos_inf"], "neg_inf": scan["neg_inf"]}
    if a.dtype.kind == "c":
        stats["of"] = "abs"
    return stats, {"underflow": scan["underflow"], "overflow": scan["overflow"]}


def light_scan(array: Any) -> Dict[str, Any]:
    """What the analyzer needs of a tensor after the origin, in one pass: shape, dtype, NaN/+Inf/-Inf counts,
    fp16 under/overflow counts (float32/64 only) and the largest finite magnitude (``absmax``, None if none)."""
    a = np.asarray(array)
    out: Dict[str, Any] = {"shape": list(a.shape), "dtype": str(a.dtype), "nan": 0, "pos_inf": 0, "neg_inf": 0,
                           "underflow": 0, "overflow": 0, "absmax": None}
    if a.dtype.kind not in "fc" or a.size == 0:
        return out
    scan = _scan(a, full=False)
    out.update({k: scan[k] for k in ("nan", "pos_inf", "neg_inf", "underflow", "overflow", "absmax")})
    return out
