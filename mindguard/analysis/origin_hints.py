"""The hint once the culprit's operands are traced to their origin (:mod:`.provenance`): the fix of the data, the
schedule or the constant first, the op's own fix after it as a guard; a Parameter already non-finite when the step
began sends the user to the step that made it (:func:`.param_origin.parameter_hint`)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from .hint_text import base_kind, quoted_number
from .param_origin import parameter_hint
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
    if first.get("kind") == "parameter":
        return parameter_hint(first, kind)
    if first.get("kind") == "constant":
        return _constant_hint(first)
    return None


def _constant_hint(first: Dict[str, Any]) -> Optional[str]:
    """A constant of the graph is the origin (:mod:`.constant_origin`): a number that does not fit its dtype, a
    divisor that is the constant 0. None for a constant that only contributed (the op's own hint stays)."""
    source = first.get("source") or {}
    line = f"line {source.get('line')} (`{str(source.get('code') or '').strip()}`)" if source else "its line"
    if first.get("rule") == "zero_divisor":
        return (f"Fix the constant first: {line} divides by the constant 0 -- what sets it (an attribute, a config "
                f"value, a default argument) gives 0; give it the value it should have. An epsilon in the division "
                f"would hide the wrong setting (x / 1e-6 is huge, not right).")
    if first.get("rule") != "nonfinite_constant":
        return None
    dtype, literal, value = first.get("dtype"), first.get("literal"), first.get("name")
    if not first.get("beyond_range"):
        return None   # an infinity the line writes itself (a mask's float('-inf')): the op's own hint says more
    given = (f"{literal} does not fit {dtype}" if literal else
             f"the number it was given (an attribute, a config value) is beyond {dtype}'s range")
    limit = "; or the dtype's own limit, `float(np.finfo(np.float16).min)`" if dtype == "float16" else ""
    return (f"Fix the constant first: {line} reads a constant that is {value} in {dtype} -- {given}; give it a "
            f"value that fits (-1e4 fills a float16 mask{limit}), or compute that part in float32 and cast after.")
