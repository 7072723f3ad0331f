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
from ..protocol.record_vocab import Kind
from ..protocol.summary import Outcome, PassSummary
from . import messages as say_
from .console import say
from .context import HuntContext
from . import ranks as _ranks
from .plan import FromRecordPlan, first_scope, iterations_to_dump, resumed_dump_iterations
from .result import Failure, PassResult, PassSpec
from .rules import EXAMINE_OUTCOMES, judge_examined, why_not_examined
from .scopes import scope_words
from .verdicts import ExamineVerdict


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
        self._named_undumped: Dict[Path, bool] = {}   # rank dump folder -> :meth:`stop_named_undumped`'s answer

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
        kept = _ranks.kept_meta(resume_dir) if resume_dir is not None else None
        assert resume_dir is None or kept is not None, resume_dir   # (a state the hunt chose, or a pass kept)
        if how == "dump":
            if iterations is None:   # from a state kept at the step: the first it trains, after the state's warm-up
                iterations = resumed_dump_iterations(kept.step, kept.step, kept.warm_up) if kept is not None \
                    else iterations_to_dump(failure.record)
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
        if kept is not None:
            what += f"; from the training state kept at global step {kept.step}"
        say(say_.examine_pass(label, what, ctx.command))
        request = ctx.request(name, "examine", **fields)
        if how == "dump" and scope is not None and iterations is not None:
            dump = ctx.dump_config(name, scope, iterations)
            ctx.dump_scope = scope
        result = ctx.run_pass(PassSpec(name, label, request, dump))
        return self.judge(result, failure, how, resume_dir is not None, second_look, within)

    def judge(self, result: PassResult, failure: Failure, how: str, resumed: bool, second_look: bool,
              within: Optional[FromRecordPlan] = None) -> Examined:
        """Whether the examine pass ``result`` repeated ``failure`` at its step: the verdict
        (:func:`~mindguard.hunt.rules.judge_examined`), said and kept in the summary here."""
        ctx = self.ctx
        verdict = judge_examined(result, failure, how, resumed, second_look, within)
        code, found = verdict.code, verdict.found
        if code == "stopped":
            return Examined(how, outcome=ctx.stopped(result))
        if code == "diverged":
            if not verdict.unfit:
                say(say_.diverged_stop(result.label, verdict.diverged or ""))
            ctx.summary.set_pass(result.name.folder, PassSummary(result.returncode, result.records,
                                                                 diverged=verdict.diverged))
            return Examined(how, result=result, outcome=Outcome.NOT_REPRODUCIBLE)
        ctx.examined = result.name
        ctx.summary.set_pass(result.name.folder, PassSummary(result.returncode, result.records, examine=how))
        if code == "repeated":
            assert found is not None
            say(say_.repeated(result.label, found.typed.global_step))
            return Examined(how, repeated=found, result=result)
        if code == "mindguard_failed":
            assert found is not None
            return Examined(how, result=result,
                            outcome=ctx.mindguard_failed(result.label, found.typed.message, result.log_path))
        if code == "killed_then_ran_clean":
            assert failure.killed_by is not None
            ctx.summary.command_returncode = 128 + failure.killed_by
        if code == "not_examined":
            ctx.summary.passes[result.name.folder].not_examined = verdict.not_examined
        say(_said(verdict, result, failure))
        return Examined(how, result=result, outcome=EXAMINE_OUTCOMES[code])

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

    def stop_named_undumped(self, repeated: Failure, name: Optional[PassName] = None) -> bool:
        """The repeated step raised, and the pass ``name`` (default: the examined one) kept its batch, with which
        the pass's graphs name the kernel the step stopped in (:func:`mindguard.analysis.unlaunched.
        names_the_stop_undumped`): MindSpore writes nothing of a step whose first kernel raises, so another pass
        dumping the step (or every iteration) would hold no more."""
        from ..analysis.unlaunched import names_the_stop_undumped

        if repeated.kind != Kind.EXCEPTION:
            return False
        rank_dir = self.ctx.at(name or self.ctx.examined).dump / f"rank_{repeated.typed.rank or 0}"
        if rank_dir not in self._named_undumped:   # (a pass's files do not change once it ended)
            self._named_undumped[rank_dir] = names_the_stop_undumped(rank_dir)
        return self._named_undumped[rank_dir]


def _said(verdict: ExamineVerdict, result: PassResult, failure: Failure) -> str:
    """What the hunt says of an examine pass that did not repeat the failure (``verdict``), in words."""
    code, found, step, label, log = verdict.code, verdict.found, failure.step, result.label, result.log_path
    if code == "sink_refused":
        return say_.sink_refused(f" (see {log})")
    if code == "failed_before_its_first_step":
        assert found is not None
        return say_.failed_before_its_first_step(label, step, found.typed.message, log)
    if code == "not_examined":
        return say_.not_examined(step, label, verdict.not_examined or "", log)
    if code == "killed_then_ran_clean":
        assert failure.killed_by is not None
        return say_.killed_then_repeated_without_failing(failure.killed_by, step, label)
    where = say_.where_it_failed(found is not None, found.typed.global_step if found else None,
                                 found.kind if found else None, found.typed.message if found else None)
    if code == "computes_otherwise":
        return say_.computes_otherwise(label, where, step, failure.kind)
    if code == "not_repeated_from_kept_state":
        return say_.not_repeated_from_kept_state(label, where, step, failure.kind)
    return say_.not_reproducible(step, failure.kind, label, where)


__all__: List[str] = ["Examined", "Examiner", "why_not_examined"]
