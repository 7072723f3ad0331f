"""The examine pass: run the command asking for exactly the failing step -- dumped (compiled), captured and replayed
(eager), or with the dataset pipeline synchronous -- and judge, on the pass's typed result, whether the failure
repeated there (:class:`Examined`).

Steps are 1-based global steps; dump iterations MindSpore's, 0-based. Never imports MindSpore.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

from ..analysis.files import check_step_dump
from ..protocol.folder import PassName
from ..protocol.summary import Outcome, PassSummary
from . import messages as say_
from .console import say
from .context import HuntContext
from . import ranks as _ranks
from .plan import FromRecordPlan, first_scope, iterations_to_dump, located_failure
from ..protocol.signals import stopped_from_outside
from .result import Failure, PassResult, PassSpec
from .scopes import scope_words


@dataclass(frozen=True)
class Examined:
    """What an examine pass came to: the failure ``repeated`` at the step (and the pass's ``result``), or the
    ``outcome`` that ends this look at it (not reproducible, could not examine, stopped, mindguard's own error)."""

    how: str
    repeated: Optional[Failure] = None
    result: Optional[PassResult] = None
    outcome: Optional[Outcome] = None


class Examiner:
    """Runs examine passes for one hunt (:class:`~mindguard.hunt.context.HuntContext`)."""

    def __init__(self, ctx: HuntContext):
        self.ctx = ctx

    def examine(self, name: PassName, label: str, failure: Failure, how: str, resume_dir: Optional[Path] = None,
                iterations: Union[None, str, Sequence[int]] = None, scope: Optional[str] = None,
                second_look: bool = False, within: Optional[FromRecordPlan] = None) -> Examined:
        """Examine global step ``failure.step`` by ``how`` in the pass ``name`` (from ``resume_dir``, a kept state,
        else from step 1). ``iterations``: the dump iterations to dump (``"all"``: every one); ``scope``: what the
        dump holds (:data:`~mindguard.hunt.scopes.DUMP_SCOPES`); ``second_look``: a second examiner, whose run
        computing otherwise is no evidence against the first one's. ``within``: a multi-rank ``--from`` plan: a failure
        at any step of its window, checked every step from the kept state, is the failing run's
        (:func:`~mindguard.hunt.plan.located_failure`)."""
        ctx = self.ctx
        step = failure.step
        fields: Dict[str, Any] = {"examine_step": step, "examine": how, "resume_dir": resume_dir}
        dump = None
        if how == "dump":
            if iterations is None:
                iterations = "all" if resume_dir is not None else iterations_to_dump(failure.record)
            scope = scope or first_scope(failure.record, ctx.options.first_scope, ctx.options.resume)
            fields["dump_path"] = ctx.at(name).dump
            if scope != "full" and ctx.options.resume != "never":   # a narrower dump may need a wider one
                fields.update(keep_dir=ctx.at(name).state, keep_steps=(step, step))
            what = (f"dump {scope_words(scope)} of global step {step}, the first step this run trains"
                    if iterations == "all" else
                    f"dump {scope_words(scope)} of global step {step} (dump iterations {iterations.split('-')[0]} on)"
                    if isinstance(iterations, str) else
                    f"dump {scope_words(scope)} of iteration {'|'.join(map(str, iterations))}, global step {step}")
        elif how == "replay":
            what = f"capture global step {step} and replay it eagerly"
        else:
            what = "run the dataset pipeline synchronously to find the batch that raised"
        if resume_dir is not None:
            what += f"; from the training state kept at global step {(_ranks.kept_meta(resume_dir) or {})['step']}"
        say(say_.examine_pass(label, what, ctx.command))
        request = ctx.request(name, "examine", **fields)
        if how == "dump" and scope is not None and iterations is not None:
            dump = ctx.dump_config(name, scope, iterations)
            ctx.dump_scope = scope
        result = ctx.run_pass(PassSpec(name, label, request, dump))
        return self.judge(result, failure, how, resume_dir is not None, second_look, within)

    def judge(self, result: PassResult, failure: Failure, how: str, resumed: bool, second_look: bool,
              within: Optional[FromRecordPlan] = None) -> Examined:
        """Whether the examine pass ``result`` repeated ``failure`` at its step (the module docstring)."""
        ctx = self.ctx
        if result.stopped:
            return Examined(how, outcome=ctx.stopped(result))
        step, label, log = failure.step, result.label, result.log_path
        repeated = result.first_failure()
        diverged = result.diverged
        if resumed and diverged is not None:
            if not diverged.unfit:
                say(say_.diverged_stop(label, diverged.why))
            ctx.summary.set_pass(result.name.folder, PassSummary(result.returncode, result.records,
                                                                 diverged=diverged.why))
            return Examined(how, result=result, outcome=Outcome.NOT_REPRODUCIBLE)
        ctx.examined = result.name
        ctx.summary.set_pass(result.name.folder, PassSummary(result.returncode, result.records, examine=how))
        if how == "dataset" and repeated is None and result.sink_refused:
            say(say_.sink_refused(f" (see {log})"))
            return Examined(how, result=result, outcome=Outcome.EXAMINE_FAILED)
        if repeated is not None and repeated.typed.phase == "mindguard":
            return Examined(how, result=result, outcome=ctx.mindguard_failed(label, repeated.typed.message, log))
        if repeated is not None and not repeated.step:
            say(say_.failed_before_its_first_step(label, step, repeated.typed.message, log))
            return Examined(how, result=result, outcome=Outcome.EXAMINE_FAILED)
        located = within is not None and repeated is not None and \
            located_failure(repeated.record, within)[0] is not None
        same_step = repeated is not None and (how == "dataset" or repeated.step == step or located)
        if repeated is not None and same_step and (repeated.kind == failure.kind or located):
            say(say_.repeated(label, repeated.typed.global_step))
            return Examined(how, repeated=repeated, result=result)
        broken = why_not_examined(result)
        if broken is not None:   # no evidence either way: the pass did not get to run the step
            say(say_.not_examined(step, label, broken, log))
            ctx.summary.passes[result.name.folder].not_examined = broken
            return Examined(how, result=result, outcome=Outcome.EXAMINE_FAILED)
        where = say_.where_it_failed(repeated is not None, repeated.typed.global_step if repeated else None,
                                     repeated.kind if repeated else None,
                                     repeated.typed.message if repeated else None)
        if second_look:   # a second examiner that computes otherwise is no evidence; the first one's answer stands
            say(say_.computes_otherwise(label, where, step, failure.kind))
        elif resumed:
            say(say_.not_repeated_from_kept_state(label, where, step, failure.kind))
        elif failure.killed_by is not None and repeated is None:   # pass 1 died by a kill; this pass ran the step
            say(say_.killed_then_repeated_without_failing(failure.killed_by, step, label))
            ctx.summary.command_returncode = 128 + failure.killed_by
            return Examined(how, result=result, outcome=Outcome.COMMAND_FAILED)
        else:
            say(say_.not_reproducible(step, failure.kind, label, where))
        return Examined(how, result=result, outcome=Outcome.NOT_REPRODUCIBLE)

    def dump_holds_step(self, repeated: Failure, name: Optional[PassName] = None) -> bool:
        """Whether the dump of the pass ``name`` (default: the examined one) has files written during the repeated
        step."""
        ctx = self.ctx
        name = name or ctx.examined
        result = ctx.results.get(name.folder)
        window = result.step_window(repeated.typed.global_step) if result is not None else None
        if not window:
            return False
        dirs, _ = check_step_dump(ctx.at(name).dump, repeated.typed.rank or 0, ctx.options.net_name, window, [])
        return bool(dirs)


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


__all__: List[str] = ["Examined", "Examiner", "why_not_examined"]
