"""What a hunt knows of when the examined run's Parameters were last finite, for the analysis of the examined step
(:class:`~mindguard.analysis.param_origin.ParamHistory`): a Parameter the step began with non-finite is then said
with since when, and the hint sends the user to the step that made it (issue 52).

From the records: the failing run's (``hunt --from``: ``params_finite_after``, the last step an always-on Guard
checked its Parameters finite), the examining pass's (``params_checked``: under the hunt a pass that checks the
Parameters does so after every step and says how many it covers; ``checks_lost``: a check mindguard's own error
turned off), and every pass's (``nonfinite_params`` at an earlier step: the step that made it, exactly).

Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, Optional

from ..analysis.param_origin import ParamHistory
from ..protocol.record import FailureRecord, Kind


def param_history(step: Optional[int], examining: Dict[str, Any], failing_run: Optional[Dict[str, Any]],
                  passes: Iterable[Dict[str, Any]]) -> ParamHistory:
    """The history of global step ``step``'s Parameters: ``examining`` is the record of the pass that ran the step
    (as written), ``failing_run`` the record ``hunt --from`` started from (None for a plain hunt), ``passes`` every
    record of the hunt's passes."""
    read = FailureRecord.as_written
    run = read(failing_run) if failing_run else None
    finite_after = run.params_finite_after if run is not None else None
    if step is None or (finite_after is not None and finite_after >= step):
        finite_after = None
    made = [int(r.global_step) for r in map(read, passes)
            if r.kind == Kind.NONFINITE_PARAMS and r.global_step and step is not None and r.global_step < step]
    return ParamHistory(step=step, made_at=min(made) if made else None, finite_after=finite_after,
                        checked=checked_every_step(read(examining), step))


def checked_every_step(record: FailureRecord, step: Optional[int]) -> Optional[bool]:
    """Whether the pass of ``record`` checked every Parameter its step writes after each step before global step
    ``step``: under the hunt a pass that checks them does so after every step and its record says how many it
    covers (``params_checked``, noted at its first check); none said after a step ran, or a Parameter check lost
    before ``step``: not checked. None: not known (the step is the pass's first)."""
    lost = any(item.get("check") == "Parameter" and (item.get("from_step") or 0) < (step or 0)
               for item in record.checks_lost or [] if isinstance(item, dict))
    if lost:
        return False
    if record.params_checked:
        return True
    return False if step is not None and step > 1 else None
