"""The small words and numbers the fix hints share: the epsilon and float ranges they quote, an op type's base
name, the namespace a user's line calls ops through, and numbers as a hint writes them."""
from __future__ import annotations

import re
from typing import Any, Dict, Sequence


EPS = "1e-6"   # survives fp16 (1e-6 -> 1.013e-6); 1e-8 would round to 0 in fp16


FP16_MAX = 65504.0


FP32_MAX = 3.4028234663852886e38


def near_zero(stats: Dict[str, Any], tiny: float = 1e-30) -> bool:
    """Whether a tensor may hold values at or near 0: zeros counted, its range crosses 0, or an end is tiny
    (unknown statistics count as near 0)."""
    lo, hi = stats.get("min"), stats.get("max")
    if stats.get("zeros") or not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return True
    return lo <= tiny and hi >= -tiny


def op_namespace(code: str) -> str:
    """The namespace the user's line calls ops through, for a fix written in the same terms: ``"torch"`` for a
    torch-style line (``torch.``, ``F.``: mindnlp/mindtorch code), ``"mint"``, else ``"ops"``."""
    if re.search(r"\btorch\.|\bF\.\w+\(", code or ""):
        return "torch"
    if re.search(r"\bmint\.", code or ""):
        return "mint"
    return "ops"


def largest_magnitude(stats: Sequence[Dict[str, Any]]) -> float:
    """Largest finite magnitude over the ``min``/``max`` of ``stats`` (0.0 when none is known)."""
    return max((abs(v) for s in stats for v in (s.get("min"), s.get("max"))
                if isinstance(v, (int, float)) and not isinstance(v, bool)), default=0.0)


def base_kind(kind: str) -> str:
    """``"SqrtGrad"`` -> ``"sqrtgrad"``; scope-ish names (``"norm-Norm"``) keep their last word."""
    k = (kind or "").strip().split("/")[-1].split("-")[-1]
    return re.sub(r"\W", "", k).lower()


def is_float_stats(stats: Dict[str, Any]) -> bool:
    dtype = str(stats.get("dtype", "float")).lower()
    return "float" in dtype or dtype.startswith("fp") or dtype in ("", "none")


def short_source(text: str) -> str:
    return text.split(" (", 1)[0].rsplit("/", 1)[-1]


def quoted_number(value: Any) -> str:
    """A number as the answer quotes it: whole numbers as ints, others to 4 significant digits."""
    if isinstance(value, float) and not float(value).is_integer():
        return f"{value:.4g}"
    return number_text(value)


def number_text(value: Any) -> str:
    return str(int(value)) if isinstance(value, (int, float)) and float(value).is_integer() else str(value)
