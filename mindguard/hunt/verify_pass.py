"""One ``mindguard verify`` pass and its verdict, without the face (:class:`VerifyPass`): the plan from the failing
run's record and its kept state, the pass of the edited command (from the kept state, or from step 1 when the edit
acts before it), the verdict (:mod:`mindguard.hunt.verify_plan`) and -- still failing -- the hunt's examination of
the failing step. ``mindguard verify`` (:mod:`mindguard.hunt.verify`) says it; the hunt's fix check
(:mod:`mindguard.hunt.fix_check`) runs it on a scratch copy. Never imports MindSpore.
"""
from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any, Dict, Optional

from .._util import dist as _dist
from .._util.io import read_json
from ..protocol.kept_state import choose_state
from . import ranks as _ranks
from ..protocol import folder as layout
from ..protocol import verify as protocol
from ..protocol.summary import FromRecordSummary, Outcome, PassSummary
from .console import say as _say
from .context import CannotGoOn, HuntContext
from .examine import Examiner
from .explain import Explainer
from .messages import last_lines
from .result import Failure, PassSpec
from .plan import examination, first_possible_step
from .verify_plan import (Verdict, VerifyPlan, cannot, failing_losses, from_step_1, front, judge, plan_verify,
                          verify_line)

VERIFY = protocol.VERIFY
#: The verify pass from step 1 when the kept state could not test the edit (issue 52).
VERIFY_FROM_START = layout.PassName(VERIFY.family, "from-step-1")


class VerifyPass:
    """One verification in the run folder of ``ctx``: one verify pass (two when the kept state cannot test the
    edit) and -- still failing, unless ``examine`` is off -- the hunt's examination of the failing step.
    :meth:`hunt` returns the outcome; :attr:`verdict` and :attr:`report` say the rest."""

    def __init__(self, ctx: HuntContext, steps: Optional[int], from_start: bool, examine: bool = True):
        self.ctx = ctx
        self.summary = ctx.summary
        self.run = ctx.run
        self.origin = ctx.origin
        self.command = ctx.command
        self.steps, self.from_start, self.examine = steps, from_start, examine
        self.verdict: Optional[Verdict] = None
        self.report: Dict[str, Any] = {}

    def hunt(self) -> Outcome:
        assert self.origin is not None
        path, record = self.origin
        # the state hunt --from would resume from: the record's own (run id, checksum), else the run's last complete one
        state, meta, note = choose_state(record, first_possible_step(record))
        if int(record.get("group_size") or 1) > 1:   # [ranks hook] every rank from its own state (verify: one node)
            state, meta, note = _ranks.job_states(path, record, int(record["group_size"]), self.command, None, self.run)
        retry = verify_line(str(path), self.command, from_start=True)
        plan = plan_verify(record, meta, steps=self.steps, from_start=self.from_start, retry=retry, state_note=note)
        failing = failing_losses(meta.trace if meta is not None else {}, record)
        self._plan_report(str(path), plan)
        if plan.route == "cannot" or plan.window is None:
            self.verdict = cannot(plan.why)
            return Outcome.ERROR
        _say(f"does the change make {plan.failure_words()} go? {plan.why[0].upper()}{plan.why[1:]}")
        ran = self._pass(VERIFY, plan, state, failing, retry)
        if ran is not None or self.verdict is None or not self.verdict.earlier:
            return ran if ran is not None else Outcome.ERROR
        # the edit acts before the kept state (a learning rate, a schedule): from it, the pass could not test the edit
        earlier = self.verdict.earlier
        again = from_step_1(plan, record, f"the edit changes the training from global step {earlier['from_step']} "
                                          f"on ({earlier['what']}), before the kept state", retry)
        self._plan_report(str(path), again)
        if again.route == "cannot":
            self.verdict = cannot(again.why)
            return Outcome.ERROR
        _say(f"the kept state cannot test this edit; verifying {again.why}")
        ran = self._pass(VERIFY_FROM_START, again, None, failing, retry)
        return ran if ran is not None else Outcome.ERROR

    def _plan_report(self, record: str, plan: VerifyPlan) -> None:
        self.report = {"record": record, "route": plan.route, "why": plan.why,
                       "window": list(plan.window) if plan.window else None, "kept_step": plan.state_step,
                       **({"not_from_kept_state": plan.note} if plan.note else {})}
        self.summary.from_record = FromRecordSummary(
            record=record, route="from_step_1" if plan.route == "from_start" else plan.route
            if plan.route == "resume" else "done", why=plan.why, window=list(plan.window) if plan.window else None,
            kept_step=plan.state_step)

    def _pass(self, name: layout.PassName, plan: VerifyPlan, state: Optional[Path],
              failing: Dict[int, Optional[float]], retry: str) -> Optional[Outcome]:
        """Run one verify pass of ``plan`` (from ``state`` when it resumes) and judge it; ``None`` (with
        :attr:`verdict` set) when the pass could not go on."""
        assert plan.window is not None
        ctx = self.ctx
        folder = ctx.at(name)
        resume = state if plan.route == "resume" else None
        request = ctx.request(name, "record", resume_dir=resume, keep_dir=folder.state,
                              keep_steps=(plan.window[0], plan.through),
                              verify_steps=(plan.first, plan.through))
        _say(f"verify (global steps {plan.first}-{plan.through}, every step checked; the training is stopped after "
             f"global step {plan.through}): {shlex.join(self.command)}")
        try:
            result = ctx.run_pass(PassSpec(name, "verify", request))
        except CannotGoOn as exc:
            steps_doc = _steps_doc(folder.record)
            self.verdict = judge(plan, None, steps_doc, failing, returncode=2, retry=retry) \
                if steps_doc.get("cannot_load") or steps_doc.get("earlier") \
                else cannot(exc.message)
            return None
        if result.stopped:
            return ctx.stopped(result)
        rc = result.returncode
        self.summary.set_pass(name.folder, PassSummary(rc, result.records))
        found = result.first_failure()
        failure = found.record if found is not None else None
        steps_doc = _steps_doc(folder.record)
        self.report.update(losses=steps_doc.get("losses"), loaded=steps_doc.get("loaded"),
                           failing_losses={str(k): v for k, v in failing.items() if k >= plan.first})
        self.verdict = judge(plan, failure, steps_doc, failing, returncode=rc,
                             ended=last_lines(result.tail, 1) or None if rc else None, retry=retry)
        if self.verdict.earlier:   # the pass refused the state (the edit acts before it): the caller runs from step 1
            return None
        if plan.note:
            self.verdict.lines.append(f"note: verified from step 1: {plan.note}, so the training state kept at "
                                      f"global step {plan.state_step} could not judge it")
        self._say_overrides(steps_doc, plan.state_step)
        if self.verdict.outcome != "fails":
            return Outcome.HEALTHY if self.verdict.outcome == "holds" else Outcome.ERROR
        if failure is None and self.verdict.failed_step is None:   # still diverging: no step to examine
            return Outcome.FOUND
        return self._examine(failure, folder)

    def _examine(self, failure: Optional[Dict[str, Any]], folder: layout.PassFolder) -> Outcome:
        """Still failing: examine the failing step as ``hunt --from`` would, from the state this pass kept at it
        (not when :attr:`examine` is off: the fix check only says whether the edit holds)."""
        assert self.verdict is not None
        if not self.examine:
            return Outcome.FOUND
        state = _ranks.kept_meta(folder.state)   # several ranks: each in rank<r>/
        if failure is None or state is None or state.step != Failure(failure).typed.global_step:
            self.verdict.lines.append(f"to find what still fails, run:\n    {self._hunt_line()}")
            return Outcome.FOUND
        self.summary.failure = failure
        how = examination(failure)
        _say(f"global step {Failure(failure).typed.global_step} still fails: examining it from the state kept there")
        examiner = Examiner(self.ctx)
        examined = examiner.examine(layout.EXAMINE, "examine", Failure(failure), how, resume_dir=folder.state)
        if examined.repeated is None:
            ended = examined.outcome or Outcome.EXAMINE_FAILED
            if ended is not Outcome.INTERRUPTED and ended is not Outcome.TIMED_OUT:
                self.verdict.lines.append(f"the examination did not explain it ({ended.label}); run:\n    "
                                          f"{self._hunt_line()}")
                return Outcome.FOUND
            return ended
        return Explainer(self.ctx, examiner).explain(Failure(failure), examined)

    def _hunt_line(self) -> str:
        assert self.origin is not None
        return f"{front()} hunt --from {shlex.quote(str(self.origin[0]))} -- {shlex.join(self.command)}"

    def _say_overrides(self, steps_doc: Dict[str, Any], state_step: Optional[int]) -> None:
        assert self.verdict is not None
        for item in (steps_doc.get("loaded") or {}).get("overrides") or []:
            kept, script = _values(item.get("kept")), _values(item.get("script"))
            if item.get("used") == "script":
                self.verdict.lines.append(
                    f"note: {item['kind']} {item['name']}: the edited script's {script} is used, not the kept state's "
                    f"{kept} (training never writes a fixed {item['kind']}, so the difference is your edit)")
            else:
                self.verdict.lines.append(
                    f"note: {item['kind']} {item['name']}: the kept state's {kept} is used (the training's own at "
                    f"global step {state_step}), not the edited script's {script}; to start from the script's value, "
                    f"run with --from-start")

def _steps_doc(record: Path) -> Dict[str, Any]:
    """The pass's steps file; with several ranks (one file each), the first that says the state does not load,
    else rank 0's."""
    docs = []
    for path in _dist.rank_paths(protocol.steps_beside(record)):
        try:
            doc = read_json(path)
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict):
            docs.append(doc)
    return next((d for d in docs if d.get("cannot_load")), docs[0] if docs else {})


def _values(values: Any) -> str:
    if isinstance(values, list) and len(values) == 1:
        return f"{values[0]:.6g}"
    if isinstance(values, list) and len(values) > 4 and all(isinstance(v, (int, float)) for v in values):
        return (f"schedule of {len(values)} values ({values[0]:.6g}, {values[1]:.6g}, ... {values[-1]:.6g}; at most "
                f"{max(values):.6g})")
    return str(values)
