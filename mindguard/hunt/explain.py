"""The answer: the examined step's dump analysed (widened when a narrow dump explains nothing), its replay printed
(with a compiled second look when the replay isolated nothing), or the dataset's error named -- written to the run
folder (``report.json``, ``report.txt``) and the summary, and kept for the face to print.

Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

import dataclasses

from typing import Any, Dict, List, Optional

from .._util import dist as _dist
from .._util.io import atomic_write_json, atomic_write_text, read_json, tree_size
from ..protocol.kept_state import read_state
from ..analysis.files import check_step_dump
from ..analysis.hints import nonfinite_input_hint
from ..errors import MindguardError
from ..protocol import folder as layout
from ..protocol.summary import Outcome
from . import messages as say_
from .console import say
from .context import HuntContext
from .examine import Examined, Examiner
from .known import known, render as render_known
from .param_history import param_history
from .plan import dumps_every_iteration_from, iterations_to_dump, resumed_dump_iterations, wider_scope
from .result import Failure, PassResult
from .scopes import COMPILED_LOOK, COMPILED_LOOK_STEPS, DUMP_SCOPES, scope_words


class Explainer:
    """Explains the step an :class:`~mindguard.hunt.examine.Examined` repeated."""

    def __init__(self, ctx: HuntContext, examiner: Examiner):
        self.ctx, self.examiner = ctx, examiner

    def explain(self, failure: Failure, examined: Examined) -> Outcome:
        assert examined.repeated is not None and examined.result is not None
        if not self.ctx.options.analyze:
            return Outcome.FOUND
        if examined.how == "replay":
            return self._replayed(failure, examined.repeated, examined.result)
        if examined.how == "dataset":
            return self._dataset(examined.repeated, examined.result)
        return self._dump(failure, examined.repeated, examined.result)

    # -- a replay ----------------------------------------------------------------------------------------
    def _replayed(self, failure: Failure, repeated: Failure, result: PassResult) -> Outcome:
        ctx = self.ctx
        replay_report = ctx.at(ctx.examined).replay_report
        errors = [r.get("error") for r in (read_json(p) for p in _dist.rank_paths(replay_report)) if r.get("error")]
        if errors or result.replay_failed:
            return ctx.mindguard_failed("pass 2", str(errors[0]) if errors else result.replay_failed, result.log_path)
        if not ctx.print_replays(ctx.at(ctx.examined)):
            say(say_.nothing_replayed(result.log_path))
            return Outcome.UNEXPLAINED
        if ctx.summary.origin:
            return Outcome.FOUND
        step = repeated.typed.global_step
        replays = [read_json(p) for p in _dist.rank_paths(ctx.at(ctx.examined).replay_report)]
        tried = [f"replay of global step {step}"]
        second_look = self._compiled_look(failure, tried)
        if second_look is not None:
            return second_look
        found = known(failure.record, "replay", ctx.command, str(ctx.at(ctx.examined).path),
                      replay=replays[0] if replays else None, tried=tried)
        ctx.summary.known = found
        say(say_.replay_unexplained(step, failure.kind, failure.typed.message, render_known(found), result.log_path))
        return Outcome.UNEXPLAINED

    def _compiled_look(self, failure: Failure, tried: List[str]) -> Optional[Outcome]:
        """The second examiner of a ``watch`` Cell step that trains eagerly (PyNative) and whose replay isolated no
        operator: run that step as one GRAPH-mode graph and analyse its full dump. ``FOUND`` when that found the
        answer; the outcome of a pass that was stopped or in which mindguard itself failed; else None, the
        replay's pass restored as the one examined (``tried`` says what was looked at). Only within
        :data:`COMPILED_LOOK_STEPS` steps of a kept state or of step 1: every iteration is dumped from there."""
        ctx = self.ctx
        record = failure.typed
        step = failure.step
        if (record.call or {}).get("kind") != "watch" or record.mode != "pynative" or not step or \
                record.kind not in ("nonfinite_loss", "nonfinite_params", "nonfinite_grads"):
            return None
        resume_dir = ctx.kept_by_pass1(step)
        kept = read_state(resume_dir) if resume_dir is not None else None
        start = (kept.step if kept is not None else 0) or 1
        if step - start >= COMPILED_LOOK_STEPS:
            return None
        replayed, scope = ctx.examined, ctx.dump_scope
        say(say_.compiled_look(step))
        examined = self.examiner.examine(COMPILED_LOOK, "examine (compiled)", failure, "dump", resume_dir=resume_dir,
                                         iterations="all", scope="full", second_look=True)
        tried.append(f"the step compiled (GRAPH mode) and dumped ({COMPILED_LOOK.folder})")
        if examined.repeated is not None and examined.result is not None \
                and self.examiner.dump_holds_step(examined.repeated):
            if self._analyse(failure, examined.repeated, examined.result, final=False) is Outcome.FOUND:
                say(say_.compiled_look_found(step))
                return Outcome.FOUND
        elif examined.repeated is not None:
            tried[-1] += ": it did not compile, or its dump holds no file of the step"
        elif examined.outcome in (Outcome.NOT_REPRODUCIBLE, Outcome.EXAMINE_FAILED):
            tried[-1] += ": run so, the step computed otherwise or did not run"
        else:
            return examined.outcome
        ctx.examined, ctx.dump_scope = replayed, scope
        return None

    # -- the dataset ---------------------------------------------------------------------------------------
    def _dataset(self, repeated: Failure, result: PassResult) -> Outcome:
        ctx = self.ctx
        ctx.summary.failure = repeated.record
        error = result.dataset_error
        from ..analysis.datafile import data_file_origin_of_pass   # issue 52: the file MindSpore's lines name (shown)
        origin = data_file_origin_of_pass(repeated.typed.message, result.log_path)
        text = say_.dataset_error(repeated.typed.position(), error, origin)
        atomic_write_text(ctx.folder.report_text, text + "\n")
        ctx.answer.append(text)
        ctx.summary.origin = {"op_type": "dataset", "direction": "input",
                              "source": error.source() if error is not None else None, "name": None, "hint": None,
                              "error": error.error if error is not None else None}
        if origin is not None:
            ctx.summary.origin.update(traced_to=[origin], hint=text.rsplit("help: ", 1)[-1])
        return Outcome.FOUND

    # -- a dump --------------------------------------------------------------------------------------------
    def _dumped_every_iteration(self) -> bool:
        """The examine pass dumped every iteration (resumed from a kept state): its dump holds the step by
        construction, and dumping every iteration again would show nothing more. Decided alike on every node (the
        file-time check of :meth:`~mindguard.hunt.examine.Examiner.dump_holds_step` reads this node's files only)."""
        config = self.ctx.at(self.ctx.examined).dump_config
        try:
            iteration = read_json(config)["common_dump_settings"]["iteration"] if config.exists() else None
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return dumps_every_iteration_from(iteration)   # (from the kept step on, after its warm-up)

    def _dump(self, failure: Failure, repeated: Failure, result: PassResult) -> Outcome:
        """Analyse the dump of the step; when a narrow dump (:data:`DUMP_SCOPES`) explains nothing, dump the same
        step wider -- from the state kept at it, so each widening costs one compile and one step."""
        ctx = self.ctx
        if not failure.typed.iteration_observed and not self._dumped_every_iteration() \
                and not self.examiner.dump_holds_step(repeated):
            if self.examiner.stop_named_undumped(repeated):   # its first kernel raised: no iteration holds more
                say(say_.raised_before_any_dump_file(repeated.step, result.label))
            else:
                # the iteration(s) dumped were estimated and hold no file of the step: dump every iteration (from
                # the state pass 1 kept, when there is one) and keep what the step's time window holds
                step = failure.step
                say(say_.every_iteration(iterations_to_dump(failure.record), step))
                examined = self.examiner.examine(layout.EVERY_ITERATION, "pass 2 (every iteration)", failure,
                                                 "dump", resume_dir=ctx.kept_by_pass1(step), iterations="all",
                                                 scope=ctx.dump_scope)
                if examined.repeated is None or examined.result is None:
                    return examined.outcome or Outcome.EXAMINE_FAILED
                repeated, result = examined.repeated, examined.result
        while True:
            wider = wider_scope(ctx.dump_scope)
            state = ctx.resume_point_for(failure.step)
            outcome = self._analyse(failure, repeated, result, final=wider is None)
            if outcome is not Outcome.UNEXPLAINED or wider is None:
                return outcome
            narrow = (ctx.examined, ctx.dump_scope, repeated, result)
            if not isinstance(ctx.summary.dump_scopes, list):
                ctx.summary.dump_scopes = []
            ctx.summary.dump_scopes.append({"scope": ctx.dump_scope, "pass": ctx.examined.folder,
                                            "bytes": tree_size(ctx.at(ctx.examined).dump)[0]})
            kept = read_state(state) if state is not None else None
            from_step = kept.step or None if kept is not None else None
            warm_up = kept.warm_up if kept is not None else 0
            say(say_.widening(scope_words(ctx.dump_scope), scope_words(wider), from_step, failure.step))
            examined = Examined("dump", outcome=Outcome.NOT_REPRODUCIBLE)
            if state is not None:
                examined = self.examiner.examine(ctx.examined.wider(wider), f"examine ({wider})", failure, "dump",
                                                 resume_dir=state, scope=wider,
                                                 iterations=resumed_dump_iterations(failure.step, from_step or 0,
                                                                                    warm_up)
                                                 if failure.step is not None and from_step else None)
            if examined.outcome is Outcome.NOT_REPRODUCIBLE and not ctx.at(layout.from_step_1(wider)).path.exists():
                if state is not None:
                    say(say_.widening_from_step_1(scope_words(wider), failure.typed.global_step))
                examined = self.examiner.examine(layout.from_step_1(wider), f"examine ({wider}, from step 1)",
                                                 failure, "dump", scope=wider)
            if examined.repeated is None or examined.result is None:   # the wider look failed: the narrow one's
                ctx.examined, ctx.dump_scope, repeated, result = narrow
                return self._analyse(failure, repeated, result, final=True)
            repeated, result = examined.repeated, examined.result

    def _analyse(self, failure: Failure, repeated: Failure, result: PassResult, *, final: bool) -> Outcome:
        """Analyse the examined pass's dump; print and record the answer unless it explains nothing and is not
        ``final`` (a wider dump follows)."""
        from ..analysis import analyze_dump

        ctx = self.ctx
        dump_path = ctx.at(ctx.examined).dump
        rank = repeated.typed.rank or 0
        window = result.step_window(repeated.typed.global_step)
        if window:  # the files of the step, whatever iteration directories they are in
            problems = check_step_dump(dump_path, rank, ctx.options.net_name, window, [])[1]
            if problems and not self.examiner.stop_named_undumped(repeated):   # (said when the hunt chose to read it)
                for problem in problems:
                    say(say_.warning(problem))
        history = param_history(repeated.typed.global_step, repeated.record, ctx.origin[1] if ctx.origin else None,
                                [r for result in ctx.results.values() for r in result.records])
        try:
            report = analyze_dump(dump_path, iteration=None if window else repeated.typed.dump_iteration,
                                  time_window=(window[0], window[1]) if window else None,
                                  state=ctx.state_at(repeated.typed.global_step), writer_ended=True, history=history)
        except (MindguardError, OSError, ValueError) as exc:
            say(say_.not_analysed(dump_path, exc))
            return Outcome.ANALYSIS_FAILED
        if ctx.cluster is not None:   # several msrun nodes: one answer from every node's report
            report = ctx.cluster.one_report(f"{ctx.examined.folder}/{ctx.dump_scope}", report)
        if not report.explains_failure and not final:
            return Outcome.UNEXPLAINED
        recorded = failure.typed.dump_iteration
        if report.iteration is not None and recorded is not None and report.iteration != recorded:
            report.notes.insert(0, say_.iteration_renumbered(report.iteration, ctx.examined.folder,
                                                              repeated.typed.global_step, recorded))
        report.step = failing_run_position(failure, repeated)   # the headline in the failing run's terms (issue 52)
        ctx.summary.dump_bytes = tree_size(dump_path)[0]
        found = report.to_dict()
        atomic_write_json(ctx.folder.report, found)
        text = str(report)
        atomic_write_text(ctx.folder.report_text, text + "\n")
        ctx.answer.append(text)
        for key in ("origin", "stopped_at", "nonfinite_inputs", "warnings"):
            setattr(ctx.summary, key, found.get(key))
        if not found.get("origin") and found.get("nonfinite_inputs"):
            ctx.summary.origin = input_origin(found["nonfinite_inputs"], found.get("first_nonfinite"))
        if report.ranks:  # distributed: which rank brought the Inf/NaN in, which only received it
            ctx.summary.origin_rank = report.origin_rank
            ctx.summary.rank_roles = found.get("rank_roles")
        if report.explains_failure:
            return Outcome.FOUND
        scopes = ctx.summary.dump_scopes if isinstance(ctx.summary.dump_scopes, list) else []
        tried = [f"dump of {scope_words(d['scope'])} ({d['pass']})" for d in scopes if d.get("scope") in DUMP_SCOPES]
        tried.append(f"dump of {scope_words(ctx.dump_scope)} ({ctx.examined.folder})"
                     if ctx.dump_scope in DUMP_SCOPES else f"dump ({ctx.examined.folder})")
        facts = known(failure.record, "dump", ctx.command, str(dump_path), report=dict(found, profile=report.profile),
                      tried=tried, widest=ctx.dump_scope == "full")
        ctx.summary.known = facts
        say(say_.dump_unexplained(repeated.typed.global_step, report.holds_nonfinite, failure.kind,
                                  failure.typed.message, render_known(facts), result.log_path))
        return Outcome.UNEXPLAINED


def failing_run_position(failure: Failure, repeated: Failure) -> str:
    """The examined step as the failing run counts it: the record's position (its dump iteration) when the pass
    repeated the record's step; else the step found, without the examining pass's own dump iteration (a pass
    resumed from a kept state numbers its iterations from there)."""
    if failure.typed.global_step == repeated.typed.global_step:
        return failure.typed.position()
    return dataclasses.replace(repeated.typed, dump_iteration=None, iteration_range=None).position()


def input_origin(inputs: List[Dict[str, Any]], first_op: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The culprit when no operator made the Inf/NaN: the step's own inputs (the batch first), direction "input";
    with ``traced_to`` and its hint when the first op that read them (``first_op``, the report's ``first_nonfinite``)
    was traced to their origin (a Parameter, with since when; a constant)."""
    batch = [i for i in inputs if str(i.get("name", "")).startswith("inputs")]
    first = (batch or inputs)[0]
    if batch:
        hint = ("the step's batch already held Inf/NaN: check the data pipeline (the sample, its decoding and "
                "normalisation) for the batch of this step")
    else:
        hint = (nonfinite_input_hint(str(first.get("name") or ""), str(first.get("source") or "parameter"))
                or "a parameter was already non-finite when the step began: examine the step before it")
    traced = (first_op or {}).get("traced_to")
    out = {"op_type": None, "name": first.get("name"), "direction": "input", "forward_op": None, "source": None,
           "stack": [], "inputs": list(batch or inputs), "outputs": [], "reached": None, "hint": hint}
    if traced and not batch:
        out.update(traced_to=traced, hint=(first_op or {}).get("hint") or hint)
    return out
