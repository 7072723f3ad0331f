"""``mindguard verify --from RECORD [--steps K] [--from-start] -- COMMAND``: does the fix hold, without re-training?

After a hunt named the culprit, the user edits the script (``SafeNorm`` for ``nn.Norm``, a clamp, a lower learning
rate). This runs the *edited* command from the training state the failing run kept before its failure (the
machinery of ``hunt --from``: :mod:`mindguard.training.state.resume`), through the failing step or window and ``K`` more
steps, every step checked (loss and Parameters), then stops the training (:mod:`mindguard.training.child.verify_run` in
the training process). The decisions are pure (:mod:`mindguard.hunt.verify_plan`); this module runs the pass and
says the verdict:

* exit 0 -- the fix holds: the steps trained finite; their loss next to the failing run's, a far one flagged;
* exit 1 -- still failing: the step, then the same examination a hunt does (the pass kept the state at each step
  it trained, so the examination starts at the failing step: one compile, one step), or the ``hunt`` line to run;
* exit 2 -- cannot verify: no usable kept state (``--from-start`` trains from step 1 instead), the state does not
  load into the edited script (Parameters renamed or reshaped), or the command ended before the failing step;
* exit 130 -- interrupted.

The run folder holds ``verify/`` (the pass: its record, output, ``verify_steps.json``, its kept state),
``verify.json`` (the verdict) and, when it still fails, the examination's folders and answer as a hunt's.
Steps are 1-based global steps (:mod:`mindguard.training.run`). The wrapper process never imports MindSpore.
"""
from __future__ import annotations

import datetime as _dt
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

from .._util import dist as _dist
from .._util.io import atomic_write_json, read_json
from ..protocol.kept_state import choose_state
from . import ranks as _ranks
from ..report.pagedata import write_run_page
from ..errors import HuntError
from ..protocol import folder as layout
from ..protocol import verify as protocol
from ..protocol.summary import FromRecordSummary, Outcome, PassSummary
from . import console as speaker_
from .console import console, say as _say
from .context import CannotGoOn, HuntContext, Options
from .entry import HuntSession, _create_run_folder, _origin_record, _run_to_the_end
from .examine import Examiner
from .explain import Explainer
from .messages import last_lines
from .passes import Supervisor
from .result import Failure, PassSpec
from .runner import ProcessRunner
from .plan import examination, first_possible_step
from .verify_plan import (EXIT_CANNOT, Verdict, VerifyPlan, cannot, failing_losses, from_step_1, front, judge,
                          plan_verify, verify_line)

VERIFY, VERDICT = protocol.VERIFY, protocol.VERDICT
#: The verify pass from step 1 when the kept state could not test the edit (issue 52).
VERIFY_FROM_START = layout.PassName(VERIFY.family, "from-step-1")


class _Verify(HuntSession):
    """One verification: the run folder and summary of a hunt, one verify pass, and -- still failing -- the
    hunt's examination of the failing step."""

    def __init__(self, ctx: HuntContext, steps: Optional[int], from_start: bool):
        super().__init__(ctx)
        self.origin = ctx.origin
        self.command = ctx.command
        self.steps, self.from_start = steps, from_start
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
        """Still failing: examine the failing step as ``hunt --from`` would, from the state this pass kept at it."""
        assert self.verdict is not None
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

    def finish(self, outcome: Outcome) -> int:
        """Write ``summary.json`` and ``verify.json``, say the verdict; the exit code is the verdict's (130 when
        interrupted, 2 when the verification itself could not go on)."""
        if self.verdict is None:
            self.verdict = cannot(self.summary.error or f"the verification ended: {outcome.label}")
        if outcome is Outcome.INTERRUPTED:
            self.verdict = Verdict("cannot", 130, "interrupted")
        self.summary.end(outcome, finished=_dt.datetime.now().isoformat(timespec="seconds"))
        written = self.write_summary()
        if written:
            try:
                atomic_write_json(self.run / VERDICT, {**self.report, **self.verdict.to_dict()})
            except (OSError, ValueError) as exc:
                _say(f"could not write {self.run / VERDICT}: {exc}")
        if written and self.ctx.folder.report.exists():   # the examination's answer as a page, as a hunt writes it
            _say(write_run_page(self.run))
        for text in self.ctx.answer:   # the examination's answer, when it still fails
            console(text)
        console("\n".join([f"mindguard verify: {self.verdict.headline}", *self.verdict.lines]))
        _say(f"{self.verdict.outcome} (exit code {self.verdict.exit_code}); everything is in {self.run}")
        return self.verdict.exit_code


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


def verify(command: Sequence[str], *, record: "os.PathLike[str] | str", steps: Optional[int] = None,
           from_start: bool = False, run_dir: Optional["os.PathLike[str] | str"] = None,
           timeout: Optional[float] = None) -> int:
    """Run the edited ``command`` from the training state the failing run (``record``: the path Guard printed) kept
    before its failure, through the failing step or window and ``steps`` more (default
    :data:`~mindguard.hunt.verify_plan.DEFAULT_MORE_STEPS`), every step checked; ``from_start``: from step 1.
    Returns the exit code: 0 the fix holds, 1 still failing, 2 cannot verify, 130 interrupted (module docstring).
    :class:`~mindguard.errors.HuntError` for bad arguments (the CLI says it, exit 2)."""
    command = list(command)
    if not command:
        raise HuntError("nothing to run: give the edited training command after `--`, e.g. "
                        "`mindguard verify --from mindguard_failure.json -- python train.py`")
    if steps is not None and (isinstance(steps, bool) or not isinstance(steps, int) or steps < 0):
        raise HuntError(f"--steps {steps!r}: must be a number of steps >= 0 to train after the failing one, e.g. 5")
    if timeout is not None and not (isinstance(timeout, (int, float)) and timeout > 0):
        raise HuntError(f"--timeout {timeout!r}: must be a positive number of seconds, e.g. 600")
    program = command[0]
    found = program if os.sep in program else shutil.which(program)
    if found is None or not os.path.isfile(found) or not os.access(found, os.X_OK):
        raise HuntError(f"cannot run {program!r}: no such executable file or command; e.g. "
                        f"`mindguard verify --from RECORD -- {sys.executable} train.py`")
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise HuntError("the working directory no longer exists; cd to an existing folder") from None
    origin = _origin_record(Path(record))
    supervisor = Supervisor().install()
    speaker, speaker_.SPEAKER = speaker_.SPEAKER, "mindguard verify"
    try:
        run = _create_run_folder(Path(run_dir) if run_dir is not None else None, command, cwd)
        _say(f"run folder: {run}")
        ctx = HuntContext(command, run, ProcessRunner(command, run, timeout), Options(), origin=origin)
        info = os.stat(run)
        ctx.identity = (info.st_dev, info.st_ino)
        return _run_to_the_end(_Verify(ctx, steps, from_start), supervisor)
    finally:
        speaker_.SPEAKER = speaker
        supervisor.restore()


__all__ = ["verify", "verify_line", "front", "EXIT_CANNOT"]
