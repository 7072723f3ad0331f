"""The hunt's route through its passes: record -> (locate) -> examine -> explain, on typed pass results.

:class:`Executor` decides which pass runs next from what the last one left (:class:`~mindguard.hunt.result.
PassResult`), and ends with an :class:`~mindguard.protocol.summary.Outcome`:

* the plain hunt (:meth:`Executor.from_start`): pass 1 records the failing step (keeping the training state from
  time to time); pass 2 examines it, from that state when quicker (:func:`~mindguard.hunt.plan.choose_resume`);
* ``--from RECORD`` (:meth:`Executor.from_record`): the route :func:`~mindguard.hunt.plan.plan_from_record` plans
  -- resume from the failing run's kept state, *locate* the exact step in the window, examine it there; the plain
  hunt when the state cannot be used, saying why.

The passes are run by a :class:`~mindguard.hunt.result.PassRunner` (processes, or a test's fake). Steps are 1-based
global steps. Never imports MindSpore.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from .._util.io import read_json
from ..training.resume import choose_kept_state, describe_state, read_state_meta
from ..dump.config import observing_config
from ..errors import DumpConfigError, HuntError, RecordError
from ..protocol import folder as layout
from ..protocol.folder import PassName
from ..protocol.record import FailureRecord
from ..protocol.summary import (ROUTE_DID_NOT_REPEAT, ROUTE_RESUMED, FromRecordSummary, Outcome, PassSummary,
                                ResumeSummary)
from . import messages as say_
from .console import say
from .context import HuntContext
from .examine import Examined, Examiner
from .explain import Explainer
from .plan import choose_resume, examination, first_possible_step, located_failure, plan_from_record
from .plan import resumed_iteration
from .result import Failure, PassResult, PassSpec, kill_name, progress, read, stopped_from_outside

_OUTCOMES = {"healthy": Outcome.HEALTHY, "command_failed": Outcome.COMMAND_FAILED}


@dataclass(frozen=True)
class Recorded:
    """What pass 1 came to: the ``failure`` to examine, or the ``outcome`` that ends the hunt."""

    failure: Optional[Failure] = None
    outcome: Optional[Outcome] = None


class Executor:
    """One hunt's route (module docstring)."""

    def __init__(self, ctx: HuntContext, origin_problem: Optional[Tuple[str, str]] = None,
                 notes: Tuple[str, ...] = ()):
        self.ctx = ctx
        self.origin_problem = origin_problem   # (path, why) of a `--from` record that cannot be used
        self.notes = list(notes)               # what differs from the failing run (another folder, edited files)
        self.examiner = Examiner(ctx)
        self.explainer = Explainer(ctx, self.examiner)
        self.pass1_started = 0.0

    def hunt(self) -> Outcome:
        ctx = self.ctx
        if ctx.origin is not None:
            return self._against_record(ctx.origin[0], ctx.origin[1], self.from_record(*ctx.origin))
        if self.origin_problem is not None:   # a record that cannot be read: the plain hunt, and why
            path, why = self.origin_problem
            say(say_.falls_back(why))
            ctx.summary.from_record = FromRecordSummary(record=path, route="from_step_1", why=why, window=None,
                                                        kept_step=None, fallback=why)
        return self.from_start()

    # -- --from RECORD -------------------------------------------------------------------------------------
    def _against_record(self, path: Path, record: Dict[str, Any], outcome: Outcome) -> Outcome:
        """The answer judged against the record it started from: a run that trained to the end although the record
        says it failed is NOT REPRODUCIBLE (exit 3), never "healthy"."""
        said = read(record).global_step if record.get("status") == "failed" else None
        from_record = self.ctx.summary.from_record
        if not said or not isinstance(from_record, FromRecordSummary) or from_record.route == "done":
            return outcome
        if outcome is Outcome.HEALTHY:
            say(say_.not_reproducible_from_record(path, said, read(record).kind))
            from_record.disagrees = {"record_step": said, "found_step": None}
            return Outcome.NOT_REPRODUCIBLE
        return outcome

    def _check_against_record(self, failure: Failure) -> None:
        """``--from`` run from step 1: say, before the answer, when its pass 1 failed at a global step outside what
        the record says (its step, or the window of steps it says the failure lies in)."""
        from_record = self.ctx.summary.from_record
        if self.ctx.origin is None or not isinstance(from_record, FromRecordSummary):
            return
        path, record = self.ctx.origin
        said = read(record).global_step if record.get("status") == "failed" else None
        found = failure.typed.global_step
        window = from_record.window
        first, last = (window[0], window[-1]) if isinstance(window, list) and window else (said, said)
        if not said or found is None or first is None or last is None or first <= found <= last:
            return
        where = f"global step {said}" if first == last else f"global steps {first}-{last}"
        say(say_.elsewhere_than_record(found, path, where))
        from_record.disagrees = {"record_step": said, "found_step": found}

    def from_record(self, path: Path, record: Dict[str, Any]) -> Outcome:
        """Examine the failure a run with an always-on Guard recorded, from the training state it kept."""
        ctx = self.ctx
        state_dir, meta, state_note = (choose_kept_state(record, first_possible_step(record))
                                       if record.get("status") != "finished" else (None, None, None))
        how = examination(record)
        plan = plan_from_record(record, meta, ctx.command, how, state_note)
        summary = FromRecordSummary(record=str(path), route=plan.route, why=plan.why,
                                    window=list(plan.window) if plan.window else None, kept_step=plan.state_step)
        ctx.summary.from_record = summary
        if self.notes:
            summary.edits = list(self.notes)
        for note in [*self.notes, *plan.warnings]:
            say(f"note: {note}")
        if plan.route == "done":
            say(f"{path}: {plan.why}")
            if plan.returncode is not None:
                ctx.summary.command_returncode = plan.returncode
            return _OUTCOMES.get(plan.outcome or "", Outcome.FAILED_BEFORE_TRAINING)
        assert plan.failure is not None and plan.window is not None
        failure = Failure(plan.failure)
        ctx.summary.failure = failure.record
        say(f"from the failing run's record {path}: {_describe(failure.record)}")
        if plan.route == "from_step_1":
            return self._fall_back(plan.why)
        say(plan.why)
        if how == "dataset" and failure.typed.dataset_sink_mode:
            say(say_.sink_refused(""))
            return Outcome.EXAMINE_FAILED
        assert state_dir is not None
        if plan.locate:
            first, last = plan.window
            span = f"global steps {first}-{last}" if first < last else f"global step {last}"
            say(say_.locate_pass(plan.state_step, span, ctx.command))
            located = self._locate("pass 1 (locate)", state_dir, plan.window)
            self._say_overridden(layout.LOCATE)
            if located.stopped:
                return ctx.stopped(located)
            ctx.summary.set_pass(layout.LOCATE.folder, PassSummary(located.returncode, located.records))
            if ctx.print_replays(ctx.at(layout.LOCATE)):
                say(say_.REFUSAL_REPLAYED_IN_LOCATE)
                return Outcome.FOUND
            found = located.first_failure()
            exact, where = located_failure(found.record if found else None, plan)
            diverged = located.diverged
            unfit = diverged.why if diverged is not None and diverged.unfit else None
            if diverged is not None:
                where, exact = f"computes something else ({diverged.why})", None
            if exact is None and diverged is None and record.get("status") == "running" and found is None \
                    and located.returncode == 0:
                say(say_.killed_from_outside_after_resume(plan.state_step, last))
                return Outcome.COMMAND_FAILED
            if exact is None or read_state_meta(ctx.at(layout.LOCATE).state) is None:
                return self._fall_back(unfit or f"from the kept state the run {where}, not a failure within {span} "
                                                f"({failure.kind})")
            say(f"pass 1 (locate) found the exact step: {_describe(exact)}")
            failure, state_dir = Failure(exact), ctx.at(layout.LOCATE).state
            ctx.summary.failure = exact
        examined = self.examiner.examine(layout.EXAMINE, "pass 2", failure, how, resume_dir=state_dir)
        if not plan.locate:
            self._say_overridden(layout.EXAMINE)
        if examined.outcome is Outcome.NOT_REPRODUCIBLE:
            diverged = examined.result.diverged if examined.result is not None else None
            return self._fall_back(diverged.why if diverged is not None and diverged.unfit
                                   else "the failure did not repeat from the kept state")
        return self._explained(failure, examined)

    def _fall_back(self, why: str) -> Outcome:
        """``--from``: the kept state cannot be used (``why``): the two passes of a plain hunt."""
        say(say_.falls_back(why))
        from_record = self.ctx.summary.from_record
        if isinstance(from_record, FromRecordSummary):
            from_record.fallback = why
        return self.from_start()

    def _locate(self, label: str, resume_dir: Path, steps: Tuple[int, int]) -> PassResult:
        """The locate pass: from the kept state at ``resume_dir``, check every step through ``steps`` (first, last:
        1-based global steps) and keep the state at each of them (the failing one's is what the examine pass
        resumes from)."""
        ctx = self.ctx
        request = ctx.request(layout.LOCATE, "record", resume_dir=resume_dir, keep_dir=ctx.at(layout.LOCATE).state,
                              keep_steps=steps)
        return ctx.run_pass(PassSpec(layout.LOCATE, label, request))

    def _say_overridden(self, name: PassName) -> None:
        """A resumed pass found edits of the script that the kept state overrides (a learning rate held in a
        Parameter): named, once, and in the summary's ``from_record.edits``."""
        ctx = self.ctx
        path = layout.overridden_beside(ctx.at(name).record)
        from_record = ctx.summary.from_record
        if not path.exists() or not isinstance(from_record, FromRecordSummary):
            return
        try:
            said = read_json(path)
        except (OSError, ValueError):
            return
        edits = [say_.overridden_edit(edit, said.get("step"), ctx.command) for edit in said.get("edits") or []]
        for edit in edits:
            say(f"note: {edit}")
        known = from_record.edits
        from_record.edits = (list(known) if isinstance(known, list) else []) + edits

    # -- the plain hunt ------------------------------------------------------------------------------------
    def from_start(self) -> Outcome:
        """Pass 1 from step 1 finds the failing step; pass 2 examines it; the answer is explained."""
        recorded = self.record()
        if recorded.failure is None:
            return recorded.outcome or Outcome.ERROR
        self._check_against_record(recorded.failure)
        return self._explained(recorded.failure, self.examine(recorded.failure))

    def _explained(self, failure: Failure, examined: Examined) -> Outcome:
        if examined.repeated is None:
            return examined.outcome or Outcome.EXAMINE_FAILED
        return self.explainer.explain(failure, examined)

    def record(self) -> Recorded:
        """Pass 1: run the command from step 1, recording the first failing step."""
        ctx = self.ctx
        say(say_.record_pass(ctx.command))
        pass1 = ctx.at(layout.PASS1)
        request = ctx.request(layout.PASS1, "record", observe_path=pass1.observe,
                              keep_dir=pass1.state if ctx.options.resume != "never" else None,
                              keep_every=ctx.options.keep_every)
        try:
            observe = observing_config(pass1.observe, net_name=ctx.options.net_name, device_target="CPU")
        except DumpConfigError as exc:
            raise HuntError(f"cannot observe dump iterations: {exc}") from None
        self.pass1_started = time.time()
        result = ctx.run_pass(PassSpec(layout.PASS1, "pass 1", request, observe.to_dict()))
        if result.stopped:
            return Recorded(outcome=ctx.stopped(result))
        ctx.summary.set_pass(layout.PASS1.folder, PassSummary(result.returncode, result.records))
        return Recorded(*self._judge_record(result))

    def _judge_record(self, result: PassResult) -> Tuple[Optional[Failure], Optional[Outcome]]:
        """Pass 1's result: the failure to examine, or the outcome that ends the hunt."""
        ctx, rc, log = self.ctx, result.returncode, result.log_path
        if not result.records and rc != 0:
            hint = say_.interpreter_hint(sys.executable) if not result.said_anything else ""
            say(say_.failed_before_guard(rc, say_.last_lines(result.tail), log, hint))
            ctx.summary.command_returncode = rc
            return None, Outcome.FAILED_BEFORE_TRAINING
        if not result.records:
            say(say_.no_guard(rc, log))
            return None, Outcome.NO_GUARD
        failure = result.first_failure()
        if failure is None and stopped_from_outside(rc):
            say(say_.stopped_from_outside(-rc, progress(result.records) or "before its first step", log))
            ctx.summary.command_returncode = 128 - rc
            return None, Outcome.COMMAND_FAILED
        if failure is not None and failure.typed.phase == "script":
            say(say_.script_raised(failure.typed.global_step, failure.typed.message, log))
            ctx.summary.failure = failure.record
            ctx.summary.command_returncode = rc or 1
            return None, Outcome.COMMAND_FAILED
        if failure is not None and failure.typed.phase == "mindguard":
            return None, ctx.mindguard_failed("pass 1", failure.typed.message, log)
        if failure is None and result.ended_early() is not None:
            return None, self._ended_early(result)
        if failure is None:
            if rc != 0:
                say(say_.command_failed_without_failure(rc, log))
                ctx.summary.command_returncode = rc
                return None, Outcome.COMMAND_FAILED
            checked = [r.params_checked for r in result.typed if r.params_checked is not None]
            say(say_.healthy(loss_only=bool(checked) and not any(checked)))
            return None, Outcome.HEALTHY
        ctx.summary.failure = failure.record
        if not failure.step:
            say(say_.failed_before_first_step(failure.typed.message, log))
            return None, Outcome.FAILED_BEFORE_TRAINING
        say(f"pass 1 failed: {_describe(failure.record)}")
        if failure.typed.seed is None:
            say(say_.NO_SEED)
        if ctx.print_replays(ctx.at(layout.PASS1)):
            say(say_.REFUSAL_REPLAYED)
            return None, Outcome.FOUND
        return failure, None

    def _ended_early(self, result: PassResult) -> Outcome:
        """Pass 1 ended with no failure recorded and a record still ``running``: the process went away without
        Python unwinding (``os._exit``, an exit from native code). Not healthy, not a failure to hunt."""
        step, rc = result.ended_early(), result.returncode
        where = f"at global step {step}" if step else "before its first step"
        how = f"exit code {rc}" if rc >= 0 else f"signal {-rc} ({kill_name(-rc)})"
        say(say_.ended_early(where, how, result.log_path))
        self.ctx.summary.ended_early_at = step
        self.ctx.summary.command_returncode = rc
        return Outcome.ENDED_EARLY

    def examine(self, failure: Failure) -> Examined:
        """Pass 2: from the training state kept near the failure when that is quicker (and the failure repeats
        from there), else from step 1."""
        how = examination(failure.record)
        if how == "dataset" and failure.typed.dataset_sink_mode:
            say(say_.sink_refused(""))
            return Examined(how, outcome=Outcome.EXAMINE_FAILED)
        state = self._resume_route(failure, how)
        if state is not None:
            examined = self._examine_resumed(failure, how, state)
            if examined.outcome is not Outcome.NOT_REPRODUCIBLE:
                return examined
            say(say_.PASS2_FROM_STEP_1)
        return self.examiner.examine(layout.PASS2, "pass 2", failure, how)

    def _resume_route(self, failure: Failure, how: str) -> Optional[Dict[str, Any]]:
        """The kept state to resume from (its ``state.json``), when resuming is allowed and (``--resume auto``)
        quicker than running from step 1, else ``None``."""
        ctx = self.ctx
        meta = read_state_meta(ctx.at(layout.PASS1).state) if ctx.options.resume != "never" else None
        choice = choose_resume(failure.record, meta, self.pass1_started, how, ctx.options.resume)
        if choice is None or meta is None:
            return None
        ctx.summary.resume = ResumeSummary(kept_step=choice.kept_step, estimate_s={
            "from_step_1": round(choice.from_step_1_s, 3) if choice.from_step_1_s is not None else None,
            "resumed": round(choice.resumed_s, 3)})
        if choice.resume:
            return meta
        say(say_.kept_but_not_resumed(describe_state(meta), choice.why or "", always=choice.from_step_1_s is None))
        return None

    def _examine_resumed(self, failure: Failure, how: str, state: Dict[str, Any]) -> Examined:
        """Pass 2 from the kept state. A compiled step is dumped at the iteration it has in a run that starts at
        the kept step when that can be told (the dump is checked to hold the step), else by a run that starts *at*
        the failing step, from a state kept there (by that first run, or by a locate pass from the kept state).
        ``NOT_REPRODUCIBLE``: the failure did not repeat from the kept state; the caller runs from step 1."""
        ctx = self.ctx
        step, kept = failure.step, int(state["step"])
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
        if predicted is not None and read_state_meta(at_step) is not None:
            resume_dir, label = at_step, "pass 3 (resumed)"
        elif how == "dump" and kept < step:
            say(say_.locate_to_step(kept, step, ctx.command))
            located = self._locate("pass 2 (locate)", resume_dir, (step, step))
            if located.stopped:
                return Examined(how, outcome=ctx.stopped(located))
            again = located.first_failure() if located.diverged is None else None
            ctx.summary.set_pass(layout.LOCATE.folder, PassSummary(located.returncode, located.records))
            if again is None or again.step != step or again.kind != failure.kind \
                    or read_state_meta(ctx.at(layout.LOCATE).state) is None:
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


def _describe(record: Dict[str, Any]) -> str:
    """``"epoch 2, step 3/8 (global step 11), dump iteration 10: <what went wrong>"``."""
    try:
        return FailureRecord.from_dict(record, source="failure record").format()
    except RecordError as exc:
        return f"global step {record.get('global_step')}: {record.get('message') or record.get('kind')} ({exc})"


__all__ = ["Executor", "Recorded"]
