"""Cross-rank agreement on a step's verdict (distributed training under ``msrun``).

After its local checks each rank contributes one small integer to one AllReduce per step
(:func:`mindguard._util.dist.exchange_codes`), so every rank learns which ranks failed and all of them fail at the
same step, instead of the healthy ones hanging in the next gradient AllReduce. The origin is the rank with
the most local evidence: a non-finite batch, then a non-finite loss (the forward pass of data-parallel
training has no collective), then non-finite gradients/parameters (which the gradient AllReduce spreads).
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional, Tuple

from ..._util.dist import exchange_codes
from ..._util.names import summarized
from ...protocol.record import KINDS

# severities a rank reports (higher = more local evidence that the failure started there)
_SPREAD, _LOSS, _INPUTS = 1, 2, 3
#: the bits of a verdict code (severity <= 3, 8 kinds: < 64); flags of the keep agreement ride above them
#: (:mod:`mindguard.training.state.agreed_keeps`), so the agreement costs no collective of its own
VERDICT_BITS = 6


def _encode(severity: int, kind: Optional[str]) -> int:
    """0 = healthy, else ``severity * 8 + kind index + 1`` (one small integer per rank)."""
    return 0 if kind is None else severity * 8 + KINDS.index(kind) + 1


def _decode(code: int) -> Tuple[int, str]:
    return code // 8, KINDS[code % 8 - 1]


def decide(rank: int, kind: Optional[str], loss: Optional[float], nonfinite: List[str], message: Optional[str],
           bad_inputs: List[str], saw_inputs: bool) -> Optional[Dict[str, Any]]:
    """:func:`exchange` without flags: the failure to record on this rank, or ``None``."""
    return exchange(rank, kind, loss, nonfinite, message, bad_inputs, saw_inputs)[0]


def exchange(rank: int, kind: Optional[str], loss: Optional[float], nonfinite: List[str], message: Optional[str],
             bad_inputs: List[str], saw_inputs: bool, flags: int = 0) -> Tuple[Optional[Dict[str, Any]], List[int]]:
    """Exchange this rank's verdict with every rank (a collective: every rank must call it each step), and with it
    this rank's ``flags`` (:mod:`mindguard.training.state.agreed_keeps`, < 16). Returns ``(failure, every rank's
    flags)``.

    ``bad_inputs``: this rank's non-finite batch tensors (``input<i>``); ``saw_inputs``: the batch was visible.
    The failure is ``None`` when every rank is healthy, else the failure to record on this rank: ``kind``, ``loss``,
    ``nonfinite``, ``message`` and, on a rank that only stopped because of another, ``stopped_by_rank`` and
    ``origin_kind``.
    """
    severity = 0 if kind is None else (_INPUTS if bad_inputs else _LOSS if "loss" in nonfinite else _SPREAD)
    exchanged = exchange_codes(_encode(severity, kind) | (int(flags) << VERDICT_BITS))
    codes = [c & ((1 << VERDICT_BITS) - 1) for c in exchanged]
    all_flags = [c >> VERDICT_BITS for c in exchanged]
    return _verdict(rank, codes, kind, loss, nonfinite, message, bad_inputs, saw_inputs), all_flags


def _verdict(rank: int, codes: List[int], kind: Optional[str], loss: Optional[float], nonfinite: List[str],
             message: Optional[str], bad_inputs: List[str], saw_inputs: bool) -> Optional[Dict[str, Any]]:
    """The failure to record on this rank from every rank's verdict ``codes``, or ``None``."""
    failed = {r: _decode(c) for r, c in enumerate(codes) if c}
    if not failed:
        return None
    top = max(sev for sev, _ in failed.values())
    leaders = sorted(r for r, (sev, _) in failed.items() if sev == top)
    if rank in leaders:
        text = message or kind or ""
        if bad_inputs:
            text += f"; this rank's batch holds non-finite values ({', '.join(bad_inputs)})"
        others = sorted(set(range(len(codes))) - {rank})
        if top == _SPREAD and len(leaders) > 1:
            text += (f"; ranks {leaders} all went non-finite at this step with finite batches and losses: the "
                     "gradient AllReduce gives every rank the same (non-finite) gradients, so this callback cannot "
                     "tell which rank produced them -- the dump of this iteration can (mindguard hunt)")
        elif others:
            text += f"; ranks {others} stopped at the same step because of it"
        return {"kind": kind, "loss": loss, "nonfinite": nonfinite + bad_inputs, "message": text}
    origin = leaders[0]
    origin_kind = failed[origin][1]
    why = {_INPUTS: "its batch holds non-finite values", _LOSS: "its loss went non-finite",
           _SPREAD: "its gradients or parameters went non-finite"}[top]
    seen = (["inputs"] if saw_inputs else []) + (["loss"] if loss is not None and math.isfinite(loss) else [])
    text = f"stopped because rank {origin} failed at this step ({origin_kind}: {why})"
    if seen:
        text += f"; this rank's {' and '.join(seen)} were finite"
    bad_params = [n for n in nonfinite if n not in ("loss", "gradients")]
    if bad_params:
        text += (f", but its parameters became non-finite in the update ({summarized(bad_params)}): the non-finite "
                 f"gradients of rank {origin} reached it through the gradient AllReduce")
    return {"kind": kind or origin_kind, "loss": loss, "nonfinite": nonfinite, "message": text,
            "stopped_by_rank": origin, "origin_kind": origin_kind}
