"""What the hunt knows about a failure its examination did not isolate to one operator (issue 43: never an empty
answer). Pure functions of the failure record and the examination's report, no MindSpore imports.

The facts, each only when the evidence carries it:

- the pass: weights non-finite after a step whose loss is finite means the forward pass computed finite values, so
  the backward pass (the gradients) or the optimizer's update made the Inf/NaN -- unless the step's complete dump
  holds none, then it was made outside the dumped graph (a callback writing the weights); a non-finite loss is the
  forward pass (or weights already bad);
- the first Parameters found non-finite (the record's order);
- the first operators with non-finite values, in execution order (the dump), and where Inf/NaN first appears;
- what the examination could see (the replay's operator calls);
- the next command to run.

Steps are 1-based global steps.
"""
from __future__ import annotations

import math
import shlex
from typing import Any, Dict, List, Optional, Sequence

#: how many Parameters / operators a fact lists
SHOWN = 5


def _finite_loss(loss: Any) -> Optional[float]:
    """The record's loss as a finite float, or None (absent, or written "nan"/"inf")."""
    if isinstance(loss, bool) or not isinstance(loss, (int, float)):
        return None
    return float(loss) if math.isfinite(loss) else None


def failing_pass(failure: Dict[str, Any]) -> Optional[str]:
    """``"backward"`` when the record shows the weights or gradients non-finite after a step whose loss is finite
    (the forward pass computed finite values, so the gradients or the update made the Inf/NaN), ``"forward"`` when
    the loss itself is non-finite and no Parameter was non-finite before the step; else None (not known)."""
    kind = failure.get("kind")
    loss = _finite_loss(failure.get("loss"))
    if kind in ("nonfinite_params", "nonfinite_grads") and loss is not None:
        return "backward"
    if kind == "nonfinite_loss":
        return "forward"
    return None


def _listed(names: Sequence[str]) -> str:
    shown = ", ".join(names[:SHOWN])
    return shown + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN else "")


def record_facts(failure: Dict[str, Any]) -> List[str]:
    """The facts the failure record alone establishes."""
    facts: List[str] = []
    step = failure.get("global_step")
    names = [str(n) for n in failure.get("nonfinite") or [] if n not in ("loss", "gradients")]
    loss = _finite_loss(failure.get("loss"))
    which = failing_pass(failure)
    if which == "backward":
        what = "the gradients were non-finite" if failure.get("kind") == "nonfinite_grads" else \
            "Parameters went non-finite"
        facts.append(f"at global step {step} the loss was finite ({loss:g}) while {what}: the forward pass computed "
                     f"finite values, so the Inf/NaN was made after it -- in the backward pass (the gradients), the "
                     f"optimizer's update, or outside the step")
    elif which == "forward":
        facts.append(f"at global step {step} the loss itself was non-finite ({failure.get('loss')}): the forward "
                     f"pass made it (or read Inf/NaN already in the weights or the batch)")
    if names:
        facts.append(f"first Parameters found non-finite after global step {step}: {_listed(names)}")
    return facts


def dump_facts(report: Dict[str, Any]) -> List[str]:
    """The facts a dump's analysis establishes without an origin (``report.json``'s object with the report's
    ``profile`` added): where Inf/NaN first appears, the first operators with non-finite outputs in execution order
    (``index`` 0-based, shown 1-based), Parameters or batch tensors non-finite as read."""
    facts: List[str] = []
    first = report.get("first_nonfinite")
    if first:
        facts.append(f"Inf/NaN first appears at {first.get('op_type')} ({first.get('name')}, "
                     f"{first.get('direction') or 'pass unknown'}): its inputs already held it, or not all of its "
                     f"files could be read, so it is not named the origin")
    bad = [p for p in report.get("profile") or [] if p.get("nonfinite")]
    if bad:
        total = len(report.get("profile") or [])
        ops = [f"{p.get('op_type')} ({p.get('name')}, #{int(p.get('index', 0)) + 1} of {total})" for p in bad]
        facts.append(f"operators with non-finite outputs, in execution order: {_listed(ops)}")
    inputs = [str(i.get("name")) for i in report.get("nonfinite_inputs") or []]
    if inputs:
        facts.append(f"non-finite as the step read them: {_listed(inputs)}")
    if not first and not bad and not inputs:
        facts.append("the dump of the step holds no Inf/NaN in any file mindguard could read: the kernels it holds "
                     "computed finite values, so what made the values non-finite ran outside the dumped graph (code "
                     "between steps such as a callback writing the weights, or another graph)")
    return facts


def dump_is_clean(report: Dict[str, Any]) -> bool:
    """Whether a dump's analysis found no Inf/NaN at all (no origin, first non-finite op, bad op or input)."""
    return not (report.get("origin") or report.get("first_nonfinite") or report.get("nonfinite_inputs")
                or any(p.get("nonfinite") for p in report.get("profile") or []))


def replay_facts(replay: Dict[str, Any]) -> List[str]:
    """The facts an eager replay (``replay.json``) establishes without a culprit."""
    recorded = replay.get("ops_recorded")
    after = [str(n) for n in replay.get("parameters_nonfinite_after_update") or []]
    facts: List[str] = []
    if recorded is not None and not replay.get("first"):
        facts.append(f"the replay recorded {recorded} operator call(s) of the step and none made Inf/NaN: the operator "
                     f"that did is not among the calls it records (a gradient taken inside the step's own loss "
                     f"cell, for one, runs as a single call)")
    if after:
        facts.append(f"non-finite after the replayed update: {_listed(after)}")
    return facts


def next_command(how: str, command: Sequence[str], dump: str, *, widest: bool = False,
                 outside: bool = False) -> str:
    """The next command to run after an examination (``how``: ``"dump"`` or ``"replay"``) that isolated nothing;
    ``widest``: the dump already held every op's inputs and outputs; ``outside``: it held no Inf/NaN at all."""
    shown = shlex.join(command) if command else "<your training command>"
    if how == "replay":
        return (f"make the step a compiled one, which the hunt examines by dumping every kernel: run it in GRAPH mode "
                f"(ms.set_context(mode=ms.GRAPH_MODE); a Cell such as a TrainOneStepCell then runs as one graph) or "
                f"decorate the step function with @mindspore.jit, then run again:\n    mindguard hunt -- {shown}")
    if outside:
        return (f"look at the code that runs between steps and writes Parameters (a callback's set_data/assign, a "
                f"checkpoint loaded mid-run); the step's own kernels, as dumped, are in:\n"
                f"    mindguard analyze {dump} --json")
    if not widest:
        return f"run the hunt again with the widest dump (every op's inputs and outputs):\n" \
               f"    mindguard hunt --dump-scope full -- {shown}"
    return (f"follow the Inf/NaN back from the first op that holds it (its inputs and the data flow to it):\n"
            f"    mindguard analyze {dump} --json")


def known(failure: Dict[str, Any], how: str, command: Sequence[str], dump: str, *,
          report: Optional[Dict[str, Any]] = None, replay: Optional[Dict[str, Any]] = None,
          tried: Sequence[str] = (), widest: bool = False) -> Dict[str, Any]:
    """summary.json's ``known``: ``pass`` (``"forward"``/``"backward"``, ``"outside"`` when the step's dump holds
    no Inf/NaN, None when not known), ``facts`` (sentences), ``tried`` (the examinations run), ``next`` (the
    command to run)."""
    facts = record_facts(failure)
    which = failing_pass(failure)
    if report is not None and dump_is_clean(report):
        which = "outside"
    if report is not None:
        facts += dump_facts(report)
    if replay is not None:
        facts += replay_facts(replay)
    return {"pass": which, "facts": facts, "tried": list(tried),
            "next": next_command(how, command, dump, widest=widest, outside=which == "outside")}


def render(found: Dict[str, Any]) -> str:
    """The block the hunt prints for :func:`known`'s answer."""
    lines = ["what is known (no single operator was isolated):"]
    lines += [f"  - {fact}" for fact in found["facts"]]
    if found.get("tried"):
        lines.append(f"  examined by: {'; '.join(found['tried'])}")
    lines.append(f"  next: {found['next']}")
    return "\n".join(lines)
