"""The hint for the op a step that raised stopped in (it did not complete): an index op reading outside its
table, a range the kernel's own message states, Inf/NaN inputs a device kernel aborts on; and
:func:`input_violation`, the evidence that tells that op from the others the runtime stopped with it."""
from __future__ import annotations

import re
from typing import Any, Dict, Optional, Sequence, Tuple

from .hint_text import base_kind, number_text, short_source


INDEX_KINDS = {  # kind -> (table slot, index slot, where the row count comes from: ("axis", slot) / ("count", slot))
    "gather": (0, 1, ("axis", 2)), "gatherv2": (0, 1, ("axis", 2)), "sparsegatherv2": (0, 1, ("axis", 2)),
    "embeddinglookup": (0, 1, ("axis", None)), "gatherd": (0, 2, ("axis", 1)),
    "unsortedsegmentsum": (0, 1, ("count", 2)), "unsortedsegmentmax": (0, 1, ("count", 2)),
    "unsortedsegmentmin": (0, 1, ("count", 2)), "unsortedsegmentprod": (0, 1, ("count", 2)),
}


def stop_hint(kind: str, inputs: Sequence[Dict[str, Any]], *, direction: str, source_code: Optional[str] = None,
              log: Optional[str] = None, message: Optional[str] = None) -> str:
    """A hint for the operator where a step that raised stopped (it did not complete), fitted to its inputs.

    ``inputs`` are the op's input statistics by slot (``slot``, ``shape``, ``min``, ``max``, optional ``parameter``
    / ``from``); ``log`` the file holding the training's exception message, when known. Index ops (Gather,
    EmbeddingLookup, UnsortedSegmentSum, ...) whose indices fall outside the table get an out-of-range hint; when
    the indices were not dumped (a graph input), the numbers of the kernel's own ``message`` (``"range [0, 10000),
    but got 10007"``) give it.
    """
    base = base_kind(kind)
    by_slot = {int(s["slot"]): s for s in inputs if "slot" in s}
    where = log or "the training's output (with `mindguard hunt`: the run folder's passN/output.log)"
    if base in INDEX_KINDS:
        found = _index_out_of_range(kind, base, by_slot, source_code or "")
        if found:
            return found
    stated = range_in_message(kind, message or "")
    if stated is not None and (base in INDEX_KINDS or stated[3]):
        low, high, got, _ = stated
        table = by_slot.get(INDEX_KINDS[base][0]) if base in INDEX_KINDS else None
        index_stats = {"min": got, "max": got}
        rows_from = {"shape": [high - low], "dtype": "float32",
                     "parameter": (table or {}).get("parameter"), "from": (table or {}).get("from", "")}
        if base in INDEX_KINDS and INDEX_KINDS[base][2][0] == "axis" and low == 0:
            table_slot, index_slot, (_, axis_slot) = INDEX_KINDS[base]
            found = _index_out_of_range(kind, base, {table_slot: rows_from, index_slot: index_stats},
                                        source_code or "")
            if found:
                return (found.replace(f"max index {number_text(got)}", f"index {number_text(got)} (from the kernel's "
                                      f"message: \"range [{low}, {high}), but got {got}\")", 1))
        return (f"{kind} ({direction}) raised: its own message says a value {got} is outside the range "
                f"[{low}, {high}) it accepts. Find where that input is computed (or read from the data) and keep it in "
                f"[{low}, {high}) -- clip it (`ops.clip_by_value(x, {low}, {high - 1})`) or fix its source."
                + (f"\n    line:   {source_code.strip()}" if source_code else ""))
    bad = [s for s in inputs if any(int(s.get(k) or 0) for k in ("nan", "pos_inf", "neg_inf"))]
    if bad:
        return (f"{kind} ({direction}) did not finish and its input(s) {[s['slot'] for s in bad]} hold Inf/NaN: "
                f"a device kernel can abort on them (Ascend `run task error`). Fix where they came from; "
                f"the exception message is in {where}.")
    return (f"{kind} ({direction}) did not finish: its inputs are shown above (check their shapes, dtypes and "
            f"value ranges against what {kind} accepts). The exception the training raised is in {where}.")


_MESSAGE_RANGE = re.compile(r"(?:For '(?P<op>\w+)'.*?)?range \[(?P<low>-?\d+), (?P<high>-?\d+)\), but got "
                            r"(?P<got>-?\d+)", re.S)


def range_in_message(kind: str, message: str) -> Optional[Tuple[int, int, int, bool]]:
    """``(low, high, got, names_kind)`` from a kernel error message ``"For 'Gather', the 'input_indices' should be
    in the range [0, 10000), but got 10007"``; ``names_kind``: the message names ``kind``. None when absent or the
    message names another op."""
    match = _MESSAGE_RANGE.search(message)
    if match is None:
        return None
    named = match.group("op")
    if named and base_kind(named) != base_kind(kind):
        return None
    return int(match.group("low")), int(match.group("high")), int(match.group("got")), bool(named)


def input_violation(kind: str, inputs: Sequence[Dict[str, Any]]) -> Optional[str]:
    """What about ``kind``'s inputs makes it raise (``"index 50 >= 50 rows"``), or ``None`` when nothing known does:
    the evidence that tells the kernel a step stopped in from the others the runtime stopped with it."""
    base = base_kind(kind)
    if base not in INDEX_KINDS:
        return None
    found = _index_out_of_range(kind, base, {int(s["slot"]): s for s in inputs if "slot" in s}, "")
    return found.split(";", 1)[0] if found else None


def _index_out_of_range(kind: str, base: str, by_slot: Dict[int, Dict[str, Any]], code: str) -> Optional[str]:
    table_slot, index_slot, (rule, slot) = INDEX_KINDS[base]
    table, index = by_slot.get(table_slot), by_slot.get(index_slot)
    if not index or not isinstance(index.get("max"), (int, float)) or not isinstance(index.get("min"), (int, float)):
        return None
    if rule == "count":
        count = by_slot.get(slot, {}).get("max") if slot is not None else None
        if not isinstance(count, (int, float)):
            return None
        rows, what = int(count), f"{int(count)} segments (num_segments)"
        label, labels = "segment id", "segment ids"
    else:
        axis = by_slot.get(slot, {}).get("max", 0) if slot is not None else 0
        shape = (table or {}).get("shape")
        if not isinstance(axis, (int, float)) or not shape:
            return None
        axis = int(axis) % len(shape) if shape else 0
        rows = int(shape[axis])
        name = (table or {}).get("parameter") or short_source((table or {}).get("from", "")) or "the table"
        what = f"{rows} rows of `{name}`" + (f" (axis {axis})" if axis else "")
        label, labels = "index", "indices"
    high, low = index["max"], index["min"]
    if high < rows and low >= 0:
        return None
    embedding = "embedding" in code.lower() or base == "embeddinglookup" or \
        "embedding" in str((table or {}).get("parameter") or "").lower()
    if high >= rows:
        head = f"index out of range: max {label} {number_text(high)} >= {what}"
        if rule == "count":
            fix = f"pass num_segments > {number_text(high)} or drop/clip those ids"
        elif embedding:
            fix = (f"check the tokenizer/vocab size: the embedding has {rows} rows, so every id must be < {rows} "
                   f"(create it with vocab_size > {number_text(high)}, or map unknown ids to an <unk> id); only as a "
                   f"guard, "
                   f"once the data is fixed, clip the ids, `ops.clip_by_value(ids, 0, {rows - 1})` -- alone it "
                   f"silently reads another row for a bad id")
        else:
            fix = (f"indices must be in [0, {rows}): check how they are computed; only as a guard, clip them, "
                   f"`ops.clip_by_value(indices, 0, {rows - 1})` -- alone it silently reads another row")
    else:
        head = f"index out of range: min {label} {number_text(low)} < 0 ({kind} needs {labels} in [0, {rows}))"
        fix = ("negative ids are often padding/ignore markers (-1, -100): map them to a valid id (e.g. the padding "
               "id) before the lookup, or mask them out")
        if low in (-2 ** 31, -2 ** 63):
            fix = (f"{number_text(low)} is what Inf/NaN becomes when cast to an integer: the {labels} were computed "
                   f"from non-finite floats -- fix where those went non-finite")
    return (f"{head}; {fix}.\n(CPU kernels raise on out-of-range {labels}; device kernels may abort the step or "
            f"silently read wrong rows.)")
