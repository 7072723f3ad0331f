"""A Parameter that was already non-finite when the analysed step began, as a ``traced_to`` entry (issue 52).

An operand of the culprit -- or of the first op whose input was already non-finite (the report's
``nonfinite_inputs``) -- computed from a Parameter that held Inf/NaN when the step began: the step only read it;
an earlier step's update (or something outside the steps) made it. The entry names the Parameter, how many of its
values are non-finite, and since when, from what the run knows (:class:`ParamHistory`):

* the exact step (``made_at``): a pass that checked every Parameter after every step saw it go non-finite there;
* a window: the failing run's record says the last step its Parameters were checked finite (``params_finite_after``)
  and the step the analysed one is -- the step that made it is one after the first and before the second;
* not made by a step: every Parameter the step writes was checked finite after every step before it, so this one
  is not among them -- its initial value, a checkpoint loaded, a callback's ``set_data`` set it.

Steps are 1-based global steps. Only numbers and words; no MindSpore.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Dict, Optional, Sequence, Tuple

from .stats import NONFINITE_COUNTS


@dataclass(frozen=True)
class ParamHistory:
    """What the run knows of when its Parameters were last finite (1-based global steps; None: not known).

    ``step``: the analysed step (it began with the values); ``made_at``: the step whose update first left a
    Parameter non-finite, when a pass that checked every step saw it; ``finite_after``: the last step after which
    every Parameter was checked finite; ``checked``: True -- every Parameter the step writes was checked after every
    step before ``step`` (a hunt's pass), False -- they were not (the loss only), None -- not known."""

    step: Optional[int] = None
    made_at: Optional[int] = None
    finite_after: Optional[int] = None
    checked: Optional[bool] = None


def nonfinite_counts(stats: Dict[str, Any]) -> Tuple[int, str]:
    """``(non-finite values, "128 NaN")`` of a tensor's statistics (``nan``, ``pos_inf``, ``neg_inf`` counts)."""
    parts = [(int(stats.get(key) or 0), label) for key, label in NONFINITE_COUNTS]
    shown = ", ".join(f"{n:,} {label}" for n, label in parts if n)
    return sum(n for n, _ in parts), shown or "Inf/NaN"


def _size(stats: Dict[str, Any]) -> Optional[int]:
    shape = stats.get("shape")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and d >= 0 for d in shape):
        return None
    return math.prod(shape)


def since(history: ParamHistory) -> Dict[str, Any]:
    """When the Parameter went non-finite, from ``history``: ``since`` (``"exact"``, ``"window"``, ``"outside"``,
    ``"unknown"``), ``since_step`` (the exact step), ``window`` (``[first, last]``), ``words`` (for the text)."""
    step = history.step
    if history.made_at is not None and (step is None or history.made_at < step):
        made = history.made_at
        return {"since": "exact", "since_step": made, "window": None,
                "words": f"non-finite since global step {made} (its update made it: a check after every step saw it)"}
    if step is None:
        return {"since": "unknown", "since_step": None, "window": None, "words": "made non-finite before the step"}
    first, last = (history.finite_after or 0) + 1, step - 1
    if last < first or history.checked:
        if history.checked and last >= 1:
            words = (f"the Parameter check after every step through global step {last} passed, so no step "
                     f"writes it: set outside the training steps (its initial value, a checkpoint loaded, a "
                     f"callback's set_data or assign)")
        elif step == 1:
            words = "non-finite before the first step: its initial value or a checkpoint loaded"
        else:
            words = f"non-finite though checked finite after global step {history.finite_after}: set between steps"
        return {"since": "outside", "since_step": None, "window": None, "words": words}
    steps = f"global step {first}" if first == last else f"one of global steps {first}-{last}"
    why = [f"finite when last checked, after global step {history.finite_after}"] if history.finite_after else []
    if history.checked is False:
        why.append(f"the Parameters were not checked after each step, only the loss, finite through global step "
                   f"{last}")
    said = f" ({'; '.join(why)})" if why else ""
    return {"since": "window", "since_step": first if first == last else None, "window": [first, last],
            "words": f"made non-finite by {steps}{said}"}


def parameter_entry(name: str, stats: Dict[str, Any], history: ParamHistory, *, slot: Optional[int],
                    path: Sequence[str], reader: str, read_from: str) -> Dict[str, Any]:
    """The ``traced_to`` entry (:mod:`.provenance`) of Parameter ``name``, non-finite when the step began with
    ``stats`` (its statistics: counts and shape); ``reader``: the op that read it (``"MatMul input 1"``),
    ``path``: the op types from there to it; ``read_from``: where its values were read."""
    count, shown = nonfinite_counts(stats)
    size = _size(stats)
    when = since(history)
    of = f" (all {size:,} values)" if size is not None and size == count else \
        f" of {size:,} values" if size is not None else ""
    began = f"when global step {history.step} began" if history.step is not None else "when the step began"
    flows = " -> ".join([*path, reader]) if path else reader
    text = f"Parameter `{name}` held {shown}{of} {began}: {when['words']} -- read by {flows}"
    return {"kind": "parameter", "name": name, "argument": None, "slot": slot, "path": list(path),
            "rule": "nonfinite_parameter", "count": count, "nan": int(stats.get("nan") or 0),
            "pos_inf": int(stats.get("pos_inf") or 0), "neg_inf": int(stats.get("neg_inf") or 0), "size": size,
            "shape": stats.get("shape"), "step": history.step, "since": when["since"],
            "since_step": when["since_step"], "window": when["window"], "checked": history.checked,
            "read_from": read_from, "text": text}


def parameter_hint(first: Dict[str, Any], kind: str) -> str:
    """The hint once the operand is traced to a Parameter that was non-finite when the step began (``first``, its
    entry, :func:`parameter_entry`): it addresses the step that made it, not ``kind``, the op that read it."""
    name, step = first.get("name"), first.get("step")
    at = f"global step {step}" if step else "this step"
    if str(name).split(".")[-1] in ("learning_rate", "lr") and first.get("since") != "exact":
        # (a schedule's value, written by no training step's update: hints.nonfinite_input_hint's words)
        return (f"the learning rate ({name}) was already Inf/NaN when the step began ({at} only read it; {kind} is "
                f"not the cause): the schedule that sets it (a callback's assign, a warm-up or decay formula, a "
                f"per-step list) produced it -- look for a division by zero or an overflow there.")
    if first.get("since") == "exact":
        return (f"Look at global step {first.get('since_step')} first: its update made `{name}` non-finite, and {at} "
                f"only read it -- {kind} is not the cause. Examine that step: `mindguard hunt` stops there when it "
                f"checks the Parameters (Guard's default).")
    if first.get("since") == "outside":
        return (f"`{name}` was non-finite before any training step wrote it ({at} only read it): check where it is "
                f"set outside the steps -- its initialisation, the checkpoint loaded into the network "
                f"(load_checkpoint / load_param_into_net), a callback's set_data or assign. {kind} is not the cause.")
    window = first.get("window")
    steps = (f"global step {window[0]}" if window and window[0] == window[1] else
             f"one of global steps {window[0]}-{window[1]}" if window else "an earlier step")
    if first.get("checked") is False:
        how = ("the Parameters were not checked after each step, so the run stopped only where a loss read it: hunt "
               "again with the Parameter check on (drop `check_params=False` from Guard/watch) -- the hunt then "
               "stops at the step whose update made it and names that op")
    else:
        how = ("`mindguard hunt` with the Parameter check on (Guard's default) stops at the step whose update made "
               "it and names that op")
    return (f"Find the step that made `{name}` non-finite first -- {steps}; {at} only read it, so {kind} is not the "
            f"cause: {how}.")
