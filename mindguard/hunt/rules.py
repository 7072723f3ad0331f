"""The hunt's judgements of a pass, as pure functions: each takes the pass's typed result and the plan, and returns a
verdict with a reason code (:mod:`mindguard.hunt.verdicts`) -- no printing, no summary update, no process. The
executor and the examiner act on the code and say it through :mod:`mindguard.hunt.messages`.

* :func:`judge_examined` -- whether an examine pass repeated the failure at its step (the verdict ladder);
* :func:`judge_located` -- what a ``hunt --from`` locate pass from the kept state came to: the exact step, a kill
  from outside, or a fallback to the plain hunt;
* :func:`resumed_fallback` -- whether a resumed examine pass sends ``hunt --from`` back to the plain hunt.

Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ..protocol.pass_status import Diverged
from ..protocol.signals import stopped_from_outside
from ..protocol.summary import Outcome
from . import messages as say_
from .plan import FromRecordPlan, located_failure
from .result import Failure, PassResult
from .verdicts import ExamineVerdict, Fallback, LocateVerdict


def why_not_examined(result: PassResult) -> Optional[str]:
    """Why an examine pass that did not repeat the failure is no evidence that it does not repeat: it broke inside
    mindguard, was killed (the OOM-killer's SIGKILL, a crash) or stopped from outside, or ended without its record
    saying so. ``None`` when it ran and its record says what happened."""
    reached, rc = result.reached, result.returncode
    broke = result.mindguard_error
    if broke is not None:
        return say_.why_not_examined("mindguard", reached, rc) + f": {broke.error}"
    if result.any_failed:
        return None   # it recorded a failure of its own: evidence
    if rc < 0:
        return say_.killed_at(stopped_from_outside(rc), -rc, reached)
    if not result.records:
        return say_.why_not_examined("no_record", reached, rc)
    if result.ended_early() is not None:
        return say_.why_not_examined("ended_early", reached, rc)
    return None


def judge_examined(result: PassResult, failure: Failure, how: str, resumed: bool, second_look: bool,
                   within: Optional[FromRecordPlan] = None) -> ExamineVerdict:
    """Whether the examine pass ``result`` repeated ``failure`` at its 1-based global step (``how``: ``"dump"`` |
    ``"replay"`` | ``"dataset"``; ``resumed``: the pass ran from a kept state; ``second_look``: a second examiner,
    whose run computing otherwise is no evidence against the first one's; ``within``: a multi-rank ``--from`` plan,
    any failure in whose window is the failing run's). The first rung that holds decides
    (:data:`~mindguard.hunt.verdicts.ExamineCode` lists them in order)."""
    if result.stopped:
        return ExamineVerdict("stopped")
    found = result.first_failure()
    diverged = result.diverged
    if resumed and diverged is not None:
        return ExamineVerdict("diverged", found, diverged=diverged.why, unfit=diverged.unfit)
    if how == "dataset" and found is None and result.sink_refused:
        return ExamineVerdict("sink_refused")
    if found is not None and found.typed.phase == "mindguard":
        return ExamineVerdict("mindguard_failed", found)
    if found is not None and not found.step:
        return ExamineVerdict("failed_before_its_first_step", found)
    located = within is not None and found is not None and located_failure(found.record, within)[0] is not None
    same_step = found is not None and (how == "dataset" or found.step == failure.step or located)
    if found is not None and same_step and (found.kind == failure.kind or located):
        return ExamineVerdict("repeated", found)
    broken = why_not_examined(result)
    if broken is not None:   # no evidence either way: the pass did not get to run the step
        return ExamineVerdict("not_examined", found, not_examined=broken)
    if second_look:   # a second examiner that computes otherwise is no evidence; the first one's answer stands
        return ExamineVerdict("computes_otherwise", found)
    if resumed:
        return ExamineVerdict("not_repeated_from_kept_state", found)
    if failure.killed_by is not None and found is None:   # pass 1 died by a kill; this pass ran the step
        return ExamineVerdict("killed_then_ran_clean")
    return ExamineVerdict("not_reproducible", found)


#: The outcome each examine verdict ends the look at the step with (``repeated``: none, the answer is explained;
#: ``stopped`` and ``mindguard_failed``: the context's own, with what it says).
EXAMINE_OUTCOMES: Dict[str, Outcome] = {
    "diverged": Outcome.NOT_REPRODUCIBLE, "sink_refused": Outcome.EXAMINE_FAILED,
    "failed_before_its_first_step": Outcome.EXAMINE_FAILED, "not_examined": Outcome.EXAMINE_FAILED,
    "computes_otherwise": Outcome.NOT_REPRODUCIBLE, "not_repeated_from_kept_state": Outcome.NOT_REPRODUCIBLE,
    "killed_then_ran_clean": Outcome.COMMAND_FAILED, "not_reproducible": Outcome.NOT_REPRODUCIBLE}


def judge_located(plan: FromRecordPlan, record_status: Any, found: Optional[Failure], diverged: Optional[Diverged],
                  returncode: int, kept_at_step: bool) -> LocateVerdict:
    """What the ``hunt --from`` locate pass from the kept state came to. ``plan``: the route (its window of 1-based
    global steps, whether the record is a killed run's); ``record_status``: the failing run's record's ``status``;
    ``found``: the locate pass's first failure (``None``: none); ``diverged``: why it computes something else
    (``None``: it does not); ``returncode``: its exit status; ``kept_at_step``: it kept a state at the step it
    stopped at (every rank's, for several)."""
    exact, where = located_failure(found.record if found else None, plan)
    other_masks = plan.approximate is not None
    if diverged is not None:
        where = f"computes something else ({diverged.why})"
        return LocateVerdict("unfit" if diverged.unfit else "diverged", where=where, diverged=diverged.why,
                             other_masks=other_masks)
    if exact is None and record_status == "running" and found is None and returncode == 0:
        return LocateVerdict("killed_from_outside", where=where)
    if exact is None:
        return LocateVerdict("missed", where=where, other_masks=other_masks)
    if not kept_at_step:
        return LocateVerdict("no_state_at_step", exact=exact, where=where, other_masks=other_masks)
    return LocateVerdict("located", exact=exact, where=where)


def resumed_fallback(outcome: Optional[Outcome], diverged: Optional[Diverged]) -> Optional[Fallback]:
    """Whether ``hunt --from``'s examine pass from the kept state sends the hunt back to its plain two passes: its
    ``outcome`` is not reproducible -- the kept state does not fit this run (``diverged.unfit``), or the failure did
    not repeat from it. ``None``: it does not."""
    if outcome is not Outcome.NOT_REPRODUCIBLE:
        return None
    if diverged is not None and diverged.unfit:
        return Fallback("unfit", diverged.why)
    return Fallback("did_not_repeat")


__all__ = ["EXAMINE_OUTCOMES", "judge_examined", "judge_located", "resumed_fallback", "why_not_examined"]
