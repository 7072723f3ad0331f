"""The hint once the culprit's operands are traced to their origin (:mod:`.provenance`): the fix of the data or
the schedule first, the op's own fix after it as a guard."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from .hint_text import base_kind, quoted_number
from .stop_hints import INDEX_KINDS


def origin_hint(traced: Sequence[Dict[str, Any]], op_hint: Optional[str], kind: str) -> Optional[str]:
    """The hint once the culprit's operands are traced to their origin (:mod:`.provenance`): fix the origin first
    (the data, its converter, the vocabulary, the schedule); the op's own fix follows only as a guard, and a guard
    that would hide a bad value silently is never offered alone. None when ``traced`` holds nothing to fix."""
    if not traced:
        return None
    first = traced[0]
    rule = first.get("rule")
    op_text = (op_hint or "").strip()
    what = op_text.split(". Fix:", 1)[0].split("; ", 1)[0].splitlines()[0] if op_text else ""
    if first.get("kind") == "batch":
        name = first.get("argument") or first.get("name")
        rows = ", ".join(str(r) for r in first.get("rows") or [])
        values = ", ".join(quoted_number(v) for v in (first.get("values") or [])[:4])
        where = f"`{name}` row{'s' if len(first.get('rows') or []) > 1 else ''} {rows}"
        if rule == "mask_not_0_1":
            fix = (f"Fix the data first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} {values} where "
                   f"a 0/1 mask is expected -- the converter that wrote this column put other values (token ids?) "
                   f"there; fix it and rewrite those records. As a guard, check the column where the data is read "
                   f"and raise naming the row (`assert ((mask == 0) | (mask == 1)).all()`); a clamp or a cast to bool "
                   f"would hide a wrong row silently.")
        elif rule == "index_out_of_range":
            fix = (f"Fix the data first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} {values}, "
                   f"outside {first.get('expected')} ({first.get('why')}): the tokenizer, vocabulary or id mapping "
                   f"that wrote this column does not match the table -- use the table's vocabulary (or build the "
                   f"table with enough rows). As a guard, check the ids where the data is read and raise naming the "
                   f"row.")
        elif rule == "nonfinite":
            fix = (f"Fix the data first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} {values}: the "
                   f"sample, its decoding or its normalisation made them -- fix that record or its preprocessing. As "
                   f"a guard, check the column where the data is read and raise naming the row; replacing NaN by 0 "
                   f"would hide the broken sample.")
        elif rule == "zero_size_box":
            fix = (f"Fix the annotations first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} boxes "
                   f"of zero width or height ({first.get('why')}): drop or repair them in the data pipeline (a "
                   f"filter that says how many it dropped). An epsilon in the division would hide them.")
        else:
            fix = f"Fix the data first: {first.get('text')}."
        if base_kind(kind) in INDEX_KINDS and op_text:
            return f"{fix}\nThe op: {op_text}"
        return fix + (f"\nThe op: {what}." if what else "")
    if first.get("kind") == "hyper_parameter":
        if rule == "learning_rate_jump":
            fix = (f"Fix the schedule first: the learning rate is {quoted_number(first.get('value'))} at global step "
                   f"{first.get('step')}, {first.get('ratio'):.3g}x the {quoted_number(first.get('before'))} it was "
                   f"before it "
                   f"jumped at global step {first.get('since_step')}: the weights it trained grew until {kind} "
                   f"overflowed. Check the schedule's formula or list (its peak value, a warm-up end, a unit, a "
                   f"multiplier).")
        else:
            fix = (f"Check the learning rate first: it is {quoted_number(first.get('value'))} at this step, and {kind} "
                   f"overflowed on values computed from the weights it trained, with no batch value outside its "
                   f"domain -- lower it (or warm it up), and clip gradients.")
        return fix + (f"\nThe op, as a guard only: {op_text}" if op_text else "")
    return None
