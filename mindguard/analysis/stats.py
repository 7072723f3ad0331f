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
