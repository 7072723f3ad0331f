"""Whether a value is a count, from the data flow of the .ir: the facts behind "clamp it to >= 1, not an epsilon".

A divisor computed from integer or boolean values by count-preserving ops (``Cast``, ``ReduceSum``, reshapes) is a
number of things -- matched boxes, valid tokens, positive samples. When it is 0 the batch had none; adding an
epsilon turns the resulting Inf into a huge finite loss, while clamping the count to >= 1 gives the masked sum.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

from ..protocol.kernels import COPY_KERNELS
from .trace import NodeTrace

#: ops whose output counts what their input counts (a sum of counts, the same values reshaped or cast)
_THROUGH = {"ReduceSum", "Cast", "Reshape", "ExpandDims", "Squeeze", "Flatten", "Depend", "Load", "Identity",
            "Maximum", "Abs"}
#: ops whose output is 0/1 per element: a sum of them is a number of elements
_INDICATORS = {"Less", "Greater", "Equal", "NotEqual", "LessEqual", "GreaterEqual", "LogicalAnd", "LogicalOr",
               "LogicalNot", "IsFinite", "IsNan", "IsInf", "OnesLike"}
_INTEGER = re.compile(r"^(u?int\d*|bool)$")

#: names users give counts (``num_matched_boxes``, ``n_valid``, ``token_count``)
_COUNT_NAME = re.compile(r"(^|_)(num|n|count|cnt|counts|matched|valid|pos|positive|positives|len|length|"
                         r"tokens|nonzero)(_|$)|^num|count$", re.I)


def count_origin(node: Optional[NodeTrace], slot: int, params: Optional[Dict[str, Any]] = None) -> Optional[str]:
    """How input ``slot`` of ``node`` is a count (``"ReduceSum of Cast of int32 args3"``), or ``None`` when the
    .ir does not show it computed from integer/boolean values by count-preserving ops. ``params``: the graph's
    parameter / graph-input name -> TensorType (their dtypes)."""
    if node is None:
        return None
    path: List[str] = []
    current, at = node, slot
    for _ in range(16):
        declared = current.input_types.get(at)
        if declared is not None and _INTEGER.match(declared.dtype or "") and current is not node:
            return " of ".join([*path, f"{declared.dtype} values"])
        producer = current.input_nodes.get(at)
        if producer is None:
            name = current.input_params.get(at)
            kind = getattr((params or {}).get(name), "dtype", "") if name else ""
            if name and _INTEGER.match(kind or ""):
                return " of ".join([*path, f"{kind} input {name}"])
            return None
        if producer.primitive in _INDICATORS:
            return " of ".join([*path, f"{producer.primitive} (0/1 per element)"])
        if producer.primitive in COPY_KERNELS:   # a copy: the value it copies
            current, at = producer, COPY_KERNELS[producer.primitive]
            continue
        if producer.primitive not in _THROUGH:
            return None
        if producer.primitive not in ("Depend", "Load", "Identity"):
            path.append(producer.primitive)
        current, at = producer, 0
    return None


def annotate_counts(node: Optional[NodeTrace], inputs: Sequence[Dict[str, Any]],
                    params: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """``inputs`` (stats dicts with ``slot``) with ``"count"`` set on each one :func:`count_origin` shows is a
    count; the dicts given are not changed."""
    out = []
    for stats in inputs:
        origin = count_origin(node, int(stats["slot"]), params) if "slot" in stats else None
        out.append(dict(stats, count=origin) if origin else stats)
    return out


def divisor_text(code: str) -> Optional[str]:
    """The divisor as written on ``code`` when it is one name or attribute (``num_matched_boxes``,
    ``self.n_valid``, ``mask.sum()``): the first ``/ NAME`` that is not ``//``; None otherwise."""
    match = re.search(r"(?<![/])/(?![/=])\s*([A-Za-z_][\w.]*(?:\(\))?)", code.split("#", 1)[0] if code else "")
    return match.group(1) if match else None


def named_as_count(code: str) -> bool:
    """Whether the divisor on ``code`` is named like a count (``num_matched_boxes``, ``valid_count``,
    ``mask.sum()``)."""
    name = divisor_text(code)
    if not name:
        return False
    last = name.rsplit(".", 1)[-1].rstrip("()")
    if last == "sum" and "." in name:   # mask.sum(): a sum of a mask, counted
        return bool(re.search(r"mask|valid|match|pos|label", name, re.I))
    return bool(_COUNT_NAME.search(last))
