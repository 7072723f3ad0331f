"""``mindguard hunt --from RECORD``: the route :func:`~mindguard.hunt.plan.plan_from_record` plans from a failing
run's record -- resume from its kept state, *locate* the exact step in the window (dumping it as it goes when that
is worth it), examine it there; or one locate pass from step 1 when no state is worth resuming from (or the resumed
one could not be used); the plain hunt's two passes only where no locate pass can do the work, saying why.

:class:`FromRecord` runs it for an :class:`~mindguard.hunt.executor.Executor` (whose passes, examiner and plain
hunt it uses). Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple, Union

from .._util.io import free_bytes
from ..protocol.kept_state import StateMeta, choose_state
from ..protocol import folder as layout
from ..protocol.summary import FromRecordSummary, Outcome, PassSummary
from . import messages as say_
from .console import say
from .examine import Examined
from .pass1 import describe
from . import ranks as _ranks
from .plan import (FromRecordPlan, dump_from_step_1, dump_while_locating, examination,
                   first_look, first_possible_step, locate_dump_iterations, locate_dumped_steps, plan_from_record,
                   resumed_dump_iterations, start_dump_from, start_dump_iterations)
from .result import Failure, PassResult
from .rules import judge_located, resumed_fallback
from .scopes import scope_words

if TYPE_CHECKING:
    from .executor import Executor

_OUTCOMES = {"healthy": Outcome.HEALTHY, "command_failed": Outcome.COMMAND_FAILED, "found": Outcome.FOUND}


class FromRecord:
    """The ``--from`` routes of one hunt (module docstring)."""

    def __init__(self, executor: "Executor"):
        self.executor = executor
        self.ctx = executor.ctx

    def route(self, path: Path, record: Dict[str, Any]) -> Outcome:
        """Examine the failure a run with an always-on Guard recorded, from the training state it kept."""
        ctx = self.ctx
        state_dir, meta, state_note = (choose_state(record, first_possible_step(record))
                                       if record.get("status") != "finished" else (None, None, None))
        ranks = int(record.get("group_size") or 1)
        if ranks > 1 and record.get("status") != "finished":   # a job resumes only from every rank's state at one
            # step (every node asks the others, whatever its own rank kept)
            state_dir, meta, state_note = _ranks.job_states(path, record, ranks, ctx.command, ctx.cluster, ctx.run)
        how = examination(record)
        plan = plan_from_record(record, meta, ctx.command, how, state_note, ranks=ranks)
        summary = FromRecordSummary(record=str(path), route=plan.route, why=plan.why,
                                    window=list(plan.window) if plan.window else None, kept_step=plan.state_step)
        ctx.summary.from_record = summary
        if self.executor.notes:
            summary.edits = list(self.executor.notes)
        for note in [*self.executor.notes, *plan.warnings]:
            say(say_.note(note))
        if plan.route == "done":
            say(say_.record_says(path, plan.why))
            if plan.returncode is not None:
                ctx.summary.command_returncode = plan.returncode
            if plan.failure is not None:
                ctx.summary.failure = Failure(plan.failure).record
            return _OUTCOMES.get(plan.outcome or "", Outcome.FAILED_BEFORE_TRAINING)
        assert plan.failure is not None and plan.window is not None
        failure = Failure(plan.failure)
        ctx.summary.failure = failure.record
        say(say_.from_the_record(path, describe(failure.record)))
        if plan.route == "from_step_1":
            return self._from_step_1(plan, failure, how, ranks)
        assert state_dir is not None
        return self._resumed(plan, failure, how, ranks, state_dir, meta, record)

    def _resumed(self, plan: FromRecordPlan, failure: Failure, how: str, ranks: int, state_dir: Path,
                 meta: Optional[StateMeta], record: Dict[str, Any]) -> Outcome:
        """``--from``, the ``resume`` route: (locate the exact step from the kept state ``state_dir``, then) examine
        it; the plain hunt when the state cannot be used, saying why."""
        ctx = self.ctx
        say(plan.why)
        if plan.approximate is not None:
            summary = ctx.summary.from_record
            if isinstance(summary, FromRecordSummary):
                summary.approximate = plan.approximate
            ctx.approximate = True
            say(say_.note(say_.approximate_resume(plan.approximate)))
        if how == "dataset" and failure.typed.dataset_sink_mode:
            say(say_.sink_refused(""))
            return Outcome.EXAMINE_FAILED
        resume_iterations: Optional[str] = None   # (None: as the examiner decides)
        if plan.locate:
            located = self._locate_from_state(plan, failure, how, ranks, state_dir, meta, record)
            if isinstance(located, Outcome):
                return located
            failure, state_dir, resume_iterations = located
        examined = self.executor.examiner.examine(layout.EXAMINE, "pass 2" if plan.locate else "pass 1", failure,
                                                  how, resume_dir=state_dir, within=plan if ranks > 1 else None,
                                                  iterations=resume_iterations)
        if not plan.locate and examined.result is not None:
            self._say_overridden(examined.result)
        fallback = resumed_fallback(examined.outcome, examined.result.diverged if examined.result else None)
        if fallback is not None:
            return self._fall_back(say_.resumed_fallback(fallback), plan, how, ranks)
        if ranks > 1 and examined.repeated is not None and examined.repeated.step != failure.step:
            failure = examined.repeated   # the window's exact step, found by the examine pass
            say(say_.located(describe(failure.record), by="pass 2"))
            ctx.summary.failure = failure.record
        return self._approximately(plan, failure, self.executor.explained(failure, examined))

    def _locate_from_state(self, plan: FromRecordPlan, failure: Failure, how: str, ranks: int, state_dir: Path,
                           meta: Optional[StateMeta], record: Dict[str, Any]
                           ) -> Union[Outcome, Tuple[Failure, Path, Optional[str]]]:
        """``--from``: the locate pass from the kept state ``state_dir`` through ``plan``'s window, dumping as it goes
        when that is worth it. The hunt's outcome when it ends here (the locate pass's dump examined the step, a
        fallback to the plain hunt, a kill from outside, a stop), else the exact step's failure, the state to
        examine it from and the dump iterations to arm there (``None``: as the examiner decides)."""
        ctx = self.ctx
        assert plan.window is not None and plan.failure is not None
        summary = ctx.summary.from_record
        first, last = plan.window
        span = f"global steps {first}-{last}" if first < last else f"global step {last}"
        state = meta or StateMeta()
        scope = first_look(plan.failure, locate_dumped_steps(plan), state.nbytes, state.process_started,
                           state.first_step_end, ctx.options.first_scope)
        dump_why_not = dump_while_locating(plan, meta, how, scope, ranks, free_bytes=free_bytes(ctx.run))
        dumped = scope if dump_why_not is None else None
        if isinstance(summary, FromRecordSummary):
            summary.locate_dump = dump_why_not or "dumped"
        dump_from = last - locate_dumped_steps(plan) + 1
        say(say_.locate_pass(plan.state_step, span, ctx.command, scope_words(scope) if dumped else "", dump_from))
        if dump_why_not is not None and not (first == last == plan.state_step):
            say(say_.note(say_.second_process(dump_why_not)))
        located = ctx.locate("pass 1 (locate)", state_dir, plan.window, scope=dumped,
                             iterations=locate_dump_iterations(plan))
        self._say_overridden(located)
        if located.stopped:
            return ctx.stopped(located)
        ctx.summary.set_pass(ctx.locate_name.folder, PassSummary(located.returncode, located.records,
                                                               **({"examine": "dump"} if dumped else {})))
        if ctx.print_replays(ctx.at(ctx.locate_name)):
            say(say_.REFUSAL_REPLAYED_IN_LOCATE)
            return Outcome.FOUND
        found = located.first_failure()
        kept_at_step = found is not None and _ranks.kept_meta(ctx.at(ctx.locate_name).state) is not None  # (rank<r>/)
        verdict = judge_located(plan, record.get("status"), found, located.diverged, located.returncode, kept_at_step)
        if verdict.code == "killed_from_outside":
            say(say_.killed_from_outside_after_resume(plan.state_step, last))
            return Outcome.COMMAND_FAILED
        if verdict.falls_back or verdict.exact is None:
            return self._fall_back(say_.locate_fallback(verdict, span, failure.kind), plan, how, ranks)
        say(say_.located(describe(verdict.exact)))
        failure, record_state, state_dir = Failure(verdict.exact), state_dir, ctx.at(ctx.locate_name).state
        ctx.summary.failure = verdict.exact
        resume_iterations: Optional[str] = None
        if dumped is not None:
            examined = self._examined_while_locating(failure, located, dumped, dump_from)
            if examined is not None:
                return self._approximately(plan, failure, self.executor.explained(failure, examined))
            kept = _ranks.kept_meta(state_dir)
            if kept is not None and kept.summarized:
                # kept as statistics for the dump's analysis: the examine pass runs from the run's own state
                state_dir = record_state
                resume_iterations = resumed_dump_iterations(failure.step or 0, plan.state_step or 0,
                                                            plan.state_warm_up)
        return failure, state_dir, resume_iterations

    def _from_step_1(self, plan: FromRecordPlan, failure: Failure, how: str, ranks: int) -> Outcome:
        """``--from`` with no kept state worth resuming from (``plan.why``): the record names the step and the window
        it lies in, so one locate pass from step 1 checks every step through the window, dumps the steps the failure
        may lie in (:func:`~mindguard.hunt.plan.start_dump_iterations`; the files of the steps checked clean go as it
        runs) and stops at the exact one: that one process holds the step's dump, which is analysed. An examine pass
        of its own runs only when the evidence demands it -- the dump does not hold the step, or costs more than a
        pass of its own (:func:`~mindguard.hunt.plan.dump_from_step_1`) -- from the state the locate pass kept at the
        step; and the plain hunt's two passes where no locate pass can do it (several ranks, a killed run, a step
        examined by a replay or the dataset pipeline, ``--resume never``), saying why. A step that raised before
        MindSpore dumped any file of it is answered from the locate pass's graphs and the batch it kept."""
        ctx = self.ctx
        assert plan.failure is not None and plan.window is not None
        if how == "dataset" and ranks == 1 and ctx.cluster is None and not plan.killed:
            return self._dataset_from_step_1(plan)
        two_passes = _two_passes_from_record(plan, how, ranks, ctx.options.resume, ctx.cluster is not None)
        if two_passes is not None:
            return self._fall_back(f"{plan.why} ({two_passes})")
        from_record = ctx.summary.from_record
        if isinstance(from_record, FromRecordSummary):
            from_record.fallback = plan.why
        first, last = plan.window
        span = f"global steps {first}-{last}" if first < last else f"global step {last}"
        said = plan.failure.get("costs")
        costs: Dict[str, Any] = said if isinstance(said, dict) else {}
        scope = first_look(plan.failure, last - start_dump_from(plan) + 1, costs.get("state_bytes"),
                           costs.get("process_started"), costs.get("first_step_end"), ctx.options.first_scope,
                           ctx.options.resume)
        why_not = dump_from_step_1(plan, how, scope, free_bytes=free_bytes(ctx.run))
        dumped = scope if why_not is None else None
        if isinstance(from_record, FromRecordSummary):
            from_record.locate_dump = why_not or "dumped"
        dump_from = start_dump_from(plan)
        which = ctx.locate_pass
        say(say_.one_pass_from_step_1(plan.why, dumped is not None, why_not, second=which == "pass 2"))
        say(say_.locate_from_step_1(span, ctx.command, scope_words(scope) if dumped else "", dump_from, which))
        self.executor.pass1.started = time.time()
        located = ctx.locate(f"{which} (locate)", None, plan.window, scope=dumped,
                             iterations=start_dump_iterations(plan))
        if located.stopped:
            return ctx.stopped(located)
        ctx.summary.set_pass(ctx.locate_name.folder, PassSummary(located.returncode, located.records,
                                                               **({"examine": "dump"} if dumped else {})))
        found, outcome = self.executor.pass1.judge(located, located_pass=True, by=f"{which} (locate)")
        if found is None:
            return outcome or Outcome.ERROR
        self.executor.check_against_record(found)   # (a run that failed elsewhere is examined there, and said)
        if dumped is not None:
            examined = self._examined_while_locating(found, located, dumped, dump_from)
            if examined is not None:
                return self.executor.explained(found, examined)
        at_step = ctx.at(ctx.locate_name).state
        meta = _ranks.kept_meta(at_step)
        resume_dir = at_step if meta is not None and meta.step == found.step and not meta.summarized else None
        examined = self.executor.examiner.examine(layout.EXAMINE, "pass 2", found, how, resume_dir=resume_dir)
        return self.executor.explained(found, examined)

    def _dataset_from_step_1(self, plan: FromRecordPlan) -> Outcome:
        """The record says the dataset pipeline raised between steps (its read-ahead leaves the step uncertain): one
        pass from step 1 runs the pipeline synchronously and names the batch that raised -- the record already says
        what the plain hunt's pass 1 would find."""
        assert plan.failure is not None
        failure = Failure(plan.failure)
        if failure.typed.dataset_sink_mode:
            say(say_.sink_refused(""))
            return Outcome.EXAMINE_FAILED
        say(say_.dataset_from_step_1(plan.why))
        examined = self.executor.examiner.examine(layout.EXAMINE, "pass 1", failure, "dataset")
        return self.executor.explained(failure, examined)

    @staticmethod
    def _approximately(plan: FromRecordPlan, failure: Failure, outcome: Outcome) -> Outcome:
        """The answer of a resumed hunt whose kept state could not hold every random source ends with a note saying
        it came from other masks than the failing run's."""
        if plan.approximate is not None and outcome in (Outcome.FOUND, Outcome.UNEXPLAINED):
            say(say_.approximate_answer(failure.step))
        return outcome

    def _examined_while_locating(self, failure: Failure, located: PassResult, scope: str, dump_from: int
                                 ) -> Optional[Examined]:
        """The locate pass dumped the steps from global step ``dump_from`` on at ``scope``: its dump of the exact
        step is the examination when it holds files written during that step, or when the step raised before any
        file was written and the pass's graphs and the batch it kept name the kernel (else ``None``, and the examine
        pass runs)."""
        ctx = self.ctx
        which = f"{ctx.locate_pass} (locate)"
        if self.executor.examiner.dump_holds_step(failure, ctx.locate_name):
            say(say_.examined_while_locating(failure.step, which))
        elif self.executor.examiner.stop_named_undumped(failure, ctx.locate_name):
            say(say_.raised_before_any_dump_file(failure.step, which))
        else:
            say(say_.locate_dump_missed(failure.step, dump_from, which))
            return None
        ctx.examined, ctx.dump_scope = ctx.locate_name, scope
        return Examined("dump", repeated=failure, result=located)

    def _fall_back(self, why: str, plan: Optional[FromRecordPlan] = None, how: str = "dump", ranks: int = 1
                   ) -> Outcome:
        """``--from``: the kept state cannot be used (``why``). The record names the step: one locate pass from step
        1 (:meth:`_from_step_1`, in a folder of its own) where it can do the work (``plan``: the resume route's);
        else the plain hunt's two passes."""
        ctx = self.ctx
        ctx.approximate = False   # from step 1 every kernel starts as it did: the passes compare again
        from_record = ctx.summary.from_record
        if isinstance(from_record, FromRecordSummary):
            from_record.fallback = why
        if plan is not None and plan.failure is not None and plan.window is not None \
                and ctx.locate_name == layout.LOCATE \
                and _two_passes_from_record(plan, how, ranks, ctx.options.resume, ctx.cluster is not None) is None:
            ctx.locate_name = layout.LOCATE_FROM_STEP_1
            from_step_1 = replace(plan, route="from_step_1", why=why, state_step=None, locate=False, approximate=None)
            return self._from_step_1(from_step_1, Failure(plan.failure), how, ranks)
        say(say_.falls_back(why))
        return self.executor.from_start()

    def _say_overridden(self, result: PassResult) -> None:
        """A resumed pass found edits of the script that the kept state overrides (a learning rate held in a
        Parameter): named, once, and in the summary's ``from_record.edits``."""
        ctx = self.ctx
        said = result.overridden
        from_record = ctx.summary.from_record
        if said is None or not isinstance(from_record, FromRecordSummary):
            return
        edits = [say_.overridden_edit(edit, said.step, ctx.command) for edit in said.edits]
        for edit in edits:
            say(say_.note(edit))
        known = from_record.edits
        from_record.edits = (list(known) if isinstance(known, list) else []) + edits


def _two_passes_from_record(plan: FromRecordPlan, how: str, ranks: int, resume: str, nodes: bool) -> Optional[str]:
    """Why ``hunt --from`` without a state to resume from runs the plain hunt's two passes rather than one locate pass
    from step 1 (:meth:`FromRecord._from_step_1`), or ``None``."""
    assert plan.failure is not None
    if ranks > 1 or nodes:
        return "several ranks: the plain hunt's pass 1 observes where each rank fails"
    if plan.killed or plan.failure.get("status") != "failed":
        return "the run was killed: pass 1 finds what fails"
    if how != "dump":
        return f"the step is examined by {how}, which pass 2 does"
    if resume == "never":
        return "--resume never"
    return None
