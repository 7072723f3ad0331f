"""The evident domain of a batch column, and the rows of one batch that fall outside it (issue 52).

A column's domain is never configured: it is what the column's own values, or the operator that reads it, make
evident in the failing batch. Each rule is general and says why it fires:

* :func:`outside_01` -- a mask: in a batch of 4+ rows, every value of at least 3 in 4 rows is 0 or 1 (and those
  rows hold both), while some rows hold values outside [0, 1]. A column of ids, of counts or of labels is not a mask
  (its rows are not 0/1 at all, or a row is one value: labels of a multi-class batch may well be mostly 0 and 1); a
  small batch of float features that happen to be 0/1 is no evidence either.
* :func:`outside_index_range` -- ids an index operator reads (a ``Gather`` with a table of ``rows`` rows, a segment
  sum with ``rows`` segments): a value ``>= rows`` or ``< 0`` is outside the range the operator accepts.
* :func:`nonfinite_rows` -- a float column holding NaN/Inf.
* :func:`degenerate_boxes` -- boxes (last axis 4, ``x1, y1, x2, y2`` or ``x, y, w, h``) whose width or height is 0
  in some rows while most rows' boxes have a positive size: a zero-size box divides by 0 in an IoU or a log(w).

Each returns a :class:`Violation` (``None``: the column holds nothing outside its evident domain). Rows are batch
rows: the first axis of the column. Only numpy; no MindSpore.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

MAX_VALUES = 8     # distinct offending values quoted
MAX_ROWS = 8       # rows quoted


@dataclass
class Violation:
    """``rule``: which rule; ``rows``: the batch rows holding values outside the domain (first axis, ascending,
    at most :data:`MAX_ROWS`), ``row_count`` all of them, ``rows_total`` the batch's rows; ``values``: distinct
    offending values (the most extreme first, at most :data:`MAX_VALUES`), ``count`` how many elements;
    ``expected``: the domain, as people write it; ``why``: what makes that domain evident."""

    rule: str
    rows: List[int]
    row_count: int
    rows_total: int
    values: List[Any]
    count: int
    expected: str
    why: str
    extra: Dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> Dict[str, Any]:
        out = {"rule": self.rule, "rows": self.rows, "row_count": self.row_count, "rows_total": self.rows_total,
               "values": self.values, "count": self.count, "expected": self.expected, "why": self.why}
        out.update(self.extra)
        return out

    def describe(self) -> str:
        """``"row 2 of 4 holds 199, 198 (outside {0, 1})"``."""
        rows = ", ".join(str(r) for r in self.rows) + (f" (+{self.row_count - len(self.rows)} more)"
                                                      if self.row_count > len(self.rows) else "")
        values = ", ".join(_num(v) for v in self.values)
        if self.count > len(self.values):
            values += f" ({self.count} value(s) in all)"
        word = "row" if self.row_count == 1 else "rows"
        verb = "holds" if self.row_count == 1 else "hold"
        return f"{word} {rows} of {self.rows_total} {verb} {values} (outside {self.expected})"


def _num(value: Any) -> str:
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "+Inf" if value > 0 else "-Inf"
        return f"{value:.6g}"
    return str(value)


def _rows_of(bad: np.ndarray) -> np.ndarray:
    """The first-axis indices where the boolean array ``bad`` (the column's shape) is true anywhere."""
    if bad.ndim == 0:
        return np.array([0]) if bool(bad) else np.array([], dtype=np.int64)
    return np.nonzero(bad.reshape(bad.shape[0], -1).any(axis=1))[0]


def _values(array: np.ndarray, bad: np.ndarray, *, largest_first: bool = True) -> List[Any]:
    picked = np.unique(array[bad])
    if picked.dtype.kind == "f":
        picked = picked[np.argsort(-np.abs(np.nan_to_num(picked, nan=np.inf)))] if largest_first else picked
    else:
        picked = picked[np.argsort(-np.abs(picked.astype(np.float64)))] if largest_first else picked
    return [v.item() for v in picked[:MAX_VALUES]]


def _violation(rule: str, array: np.ndarray, bad: np.ndarray, expected: str, why: str,
               **extra: Any) -> Optional[Violation]:
    rows = _rows_of(bad)
    if not rows.size:
        return None
    total = int(array.shape[0]) if array.ndim else 1
    return Violation(rule, [int(r) for r in rows[:MAX_ROWS]], int(rows.size), total, _values(array, bad),
                     int(bad.sum()), expected, why, dict(extra))


MIN_MASK_ROWS = 4          # rows a batch needs before its 0/1 rows make a mask evident


def outside_01(array: np.ndarray) -> Optional[Violation]:
    """A mask column with rows that are not 0/1 (module docstring). Needs at least :data:`MIN_MASK_ROWS` rows of at
    least 2 values; at least 3 in 4 rows must be all 0/1, those rows must hold both values, and the other rows must
    hold a value outside [0, 1] (an id, a count, a negative number: a soft 0.5 or a 1e-9 is no evidence)."""
    array = np.asarray(array)
    if array.ndim < 2 or array.shape[0] < MIN_MASK_ROWS or array[0].size < 2 or array.dtype.kind not in "biuf":
        return None
    if array.dtype.kind == "f" and not np.isfinite(array).all():
        return None   # a float column with NaN/Inf: nonfinite_rows says it
    flat = array.reshape(array.shape[0], -1)
    in01 = (flat == 0) | (flat == 1)
    good_rows = in01.all(axis=1)
    good = int(good_rows.sum())
    if good == flat.shape[0] or good * 4 < flat.shape[0] * 3:
        return None
    kept = flat[good_rows]
    if not ((kept == 0).any() and (kept == 1).any()):
        return None   # the 0/1 rows are all 0 (or all 1): no evidence it is a mask
    if not ((flat < 0) | (flat > 1)).any():
        return None   # only values within [0, 1] besides 0 and 1: a soft mask, not a wrong one
    return _violation("mask_not_0_1", array, ~in01.reshape(array.shape), "{0, 1}",
                      f"{good} of {flat.shape[0]} rows hold only 0 and 1: a 0/1 mask")


def outside_index_range(array: np.ndarray, rows: int, *, reader: str = "the table") -> Optional[Violation]:
    """Ids read by an index operator whose table has ``rows`` rows: values ``>= rows`` or ``< 0``."""
    array = np.asarray(array)
    if array.dtype.kind not in "iuf" or rows <= 0 or array.size == 0:
        return None
    bad = (array >= rows) | (array < 0)
    if array.dtype.kind == "f":
        bad |= ~np.isfinite(array)
    if array.ndim == 0:
        array, bad = array.reshape(1), bad.reshape(1)
    return _violation("index_out_of_range", array, bad, f"[0, {rows})",
                      f"{reader} has {rows} rows", table_rows=int(rows))


def nonfinite_rows(array: np.ndarray) -> Optional[Violation]:
    """A float column's rows holding NaN/Inf."""
    array = np.asarray(array)
    if array.dtype.kind != "f" or array.size == 0:
        return None
    if array.ndim == 0:
        array = array.reshape(1)
    return _violation("nonfinite", array, ~np.isfinite(array), "the finite numbers", "a float column")


def degenerate_boxes(array: np.ndarray) -> Optional[Violation]:
    """Boxes of zero width or height (last axis 4) in some rows, while most boxes have a positive size. Boxes whose
    every one has ``x1 <= x2`` and ``y1 <= y2`` are corners (size ``x2 - x1``), else centre form (``x, y, w, h``); an
    all-zero box is padding."""
    array = np.asarray(array)
    if array.ndim < 2 or array.shape[-1] != 4 or array.dtype.kind not in "iuf" or array.shape[0] < 2:
        return None
    boxes = array.reshape(-1, 4).astype(np.float64)
    if not np.isfinite(boxes).all():
        return None
    padding = (boxes == 0).all(axis=1)          # an all-zero box is padding, not a box
    corner_w, corner_h = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
    if ((corner_w >= 0) & (corner_h >= 0))[~padding].all():   # every box ordered x1 <= x2, y1 <= y2: corners
        form, w, h = "x1, y1, x2, y2", corner_w, corner_h
    else:
        form, w, h = "x, y, w, h", boxes[:, 2], boxes[:, 3]
    positive = (w > 0) & (h > 0)
    zero = ((w == 0) | (h == 0)) & ~padding
    real = int((~padding).sum())
    if not zero.any() or int(positive.sum()) * 2 < real:
        return None
    bad = np.repeat(zero.reshape(array.shape[:-1])[..., None], 4, axis=-1)
    found = _violation("zero_size_box", array, bad, "boxes of positive width and height",
                       f"{int(positive.sum())} of {real} boxes ({form}) have a positive size", box_form=form)
    if found is not None:
        found.values = [[float(v) for v in box] for box in boxes[zero][:MAX_VALUES // 2]]
        found.count = int(zero.sum())
    return found


def column_violations(array: np.ndarray, *, index_rows: Optional[int] = None,
                      reader: str = "the table") -> List[Violation]:
    """Every rule that fires on one column: the index range when an index operator with ``index_rows`` rows reads
    it, else NaN/Inf, a 0/1 mask, zero-size boxes."""
    array = np.asarray(array)
    out: List[Violation] = []
    if index_rows is not None:
        found = outside_index_range(array, index_rows, reader=reader)
        return [found] if found is not None else []
    for rule in (nonfinite_rows, outside_01, degenerate_boxes):
        found = rule(array)
        if found is not None:
            out.append(found)
    return out
