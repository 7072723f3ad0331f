"""The plain hunt's second pass: examine the failing step pass 1 found -- resumed from the training state pass 1 kept
when that is quicker than running from step 1 (:func:`~mindguard.hunt.plan.choose_resume`) and the failure repeats
from there, else from step 1.

Steps are 1-based global steps; dump iterations MindSpore's, 0-based. Never imports MindSpore.
"""
from __future__ import annotations

from typing import Optional

from ..protocol import folder as layout
from ..protocol.summary import ROUTE_DID_NOT_REPEAT, ROUTE_RESUMED, Outcome, PassSummary, ResumeSummary
from ..protocol.kept_state import StateMeta, describe_state, read_state
from . import messages as say_
from .console import say
from .context import HuntContext
from .examine import Examined, Examiner
from .plan import choose_resume, examination, resumed_iteration
from .result import Failure


class SecondPass:
    """Pass 2 of a plain hunt (module docstring)."""

    def __init__(self, ctx: HuntContext, examiner: Examiner):
        self.ctx, self.examiner = ctx, examiner

    def examine(self, failure: Failure, pass1_started: float) -> Examined:
        """Pass 2: from the training state kept near the failure when that is quicker (and the failure repeats
        from there), else from step 1. ``pass1_started``: ``time.time()`` pass 1 started at."""
        how = examination(failure.record)
        if how == "dataset" and failure.typed.dataset_sink_mode:
            say(say_.sink_refused(""))
            return Examined(how, outcome=Outcome.EXAMINE_FAILED)
        state = self._resume_route(failure, how, pass1_started)
        if state is not None:
            examined = self._examine_resumed(failure, how, state)
            if examined.outcome is not Outcome.NOT_REPRODUCIBLE:
                return examined
            say(say_.PASS2_FROM_STEP_1)
        return self.examiner.examine(layout.PASS2, "pass 2", failure, how)

    def _resume_route(self, failure: Failure, how: str, pass1_started: float) -> Optional[StateMeta]:
        """The kept state to resume from (its ``state.json``), when resuming is allowed and (``--resume auto``)
        quicker than running from step 1, else ``None``."""
        ctx = self.ctx
        meta = read_state(ctx.at(layout.PASS1).state) if ctx.options.resume != "never" else None
        choice = choose_resume(failure.record, meta, pass1_started, how, ctx.options.resume)
        if choice is None or meta is None:
            return None
        ctx.summary.resume = ResumeSummary(kept_step=choice.kept_step, estimate_s={
            "from_step_1": round(choice.from_step_1_s, 3) if choice.from_step_1_s is not None else None,
            "resumed": round(choice.resumed_s, 3)})
        if choice.resume:
            return meta
        say(say_.kept_but_not_resumed(describe_state(meta), choice.why or "", always=choice.from_step_1_s is None))
        return None

    def _examine_resumed(self, failure: Failure, how: str, state: StateMeta) -> Examined:
        """Pass 2 from the kept state. A compiled step is dumped at the iteration it has in a run that starts at
        the kept step when that can be told (the dump is checked to hold the step), else by a run that starts *at*
        the failing step, from a state kept there (by that first run, or by a locate pass from the kept state).
        ``NOT_REPRODUCIBLE``: the failure did not repeat from the kept state; the caller runs from step 1."""
        ctx = self.ctx
        step, kept = failure.step, state.step
        resume_dir = ctx.at(layout.PASS1).state
        resume = ctx.summary.resume if isinstance(ctx.summary.resume, ResumeSummary) else ResumeSummary()
        ctx.summary.resume = resume
        resume.route = ROUTE_RESUMED
        predicted = resumed_iteration(failure.record, state) if how == "dump" and kept < step else None
        if predicted is not None:
            examined = self.examiner.examine(layout.RESUMED, "pass 2 (resumed)", failure, how,
                                             resume_dir=resume_dir, iterations=[predicted])
            if examined.repeated is not None and self.examiner.dump_holds_step(examined.repeated):
                return examined
            if examined.outcome is Outcome.NOT_REPRODUCIBLE:
                resume.route = ROUTE_DID_NOT_REPEAT
                return examined
            if examined.outcome is not None:
                return examined
            say(say_.resumed_dump_missed(step))
            resume.predicted_iteration_missed = predicted
        at_step = ctx.at(layout.RESUMED).state
        if predicted is not None and read_state(at_step) is not None:
            resume_dir, label = at_step, "pass 3 (resumed)"
        elif how == "dump" and kept < step:
            say(say_.locate_to_step(kept, step, ctx.command))
            located = ctx.locate("pass 2 (locate)", resume_dir, (step, step))
            if located.stopped:
                return Examined(how, outcome=ctx.stopped(located))
            again = located.first_failure() if located.diverged is None else None
            ctx.summary.set_pass(layout.LOCATE.folder, PassSummary(located.returncode, located.records))
            if again is None or again.step != step or again.kind != failure.kind \
                    or read_state(ctx.at(layout.LOCATE).state) is None:
                where = say_.where_it_failed(again is not None, again.typed.global_step if again else None,
                                             again.kind if again else None, with_message=False)
                say(say_.did_not_repeat_from_kept_state(where, step, failure.kind))
                resume.route = ROUTE_DID_NOT_REPEAT
                return Examined(how, result=located, outcome=Outcome.NOT_REPRODUCIBLE)
            resume_dir, label = ctx.at(layout.LOCATE).state, "pass 3 (resumed)"
        else:
            label = "pass 2 (resumed)"
        name = layout.RESUMED_AT_STEP if predicted is not None else layout.RESUMED
        examined = self.examiner.examine(name, label, failure, how, resume_dir=resume_dir)
        if examined.outcome is Outcome.NOT_REPRODUCIBLE:
            resume.route = ROUTE_DID_NOT_REPEAT
        return examined
