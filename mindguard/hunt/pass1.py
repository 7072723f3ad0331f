"""The hunt's pass 1: run the command from step 1 and judge what it left -- the failure to examine, or the outcome
that ends the hunt (no Guard, failed before training, healthy, stopped or killed from outside, the script's own
error, mindguard's own). The ``hunt --from`` locate pass from step 1 is judged the same way.

Steps are 1-based global steps. Never imports MindSpore.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

from ..dump.config import observing_config
from ..errors import DumpConfigError, HuntError, RecordError
from ..protocol import folder as layout
from ..protocol.record import FailureRecord
from ..protocol.signals import kill_cause as kill_name, stopped_from_outside
from ..protocol.summary import Outcome, PassSummary
from . import messages as say_
from .console import say
from .context import HuntContext
from .result import Failure, PassResult, PassSpec, progress


@dataclass(frozen=True)
class Recorded:
    """What pass 1 came to: the ``failure`` to examine, or the ``outcome`` that ends the hunt."""

    failure: Optional[Failure] = None
    outcome: Optional[Outcome] = None


class FirstPass:
    """Pass 1 of one hunt (``started``: the ``time.time()`` it started at, for pass 2's choice of route)."""

    def __init__(self, ctx: HuntContext):
        self.ctx = ctx
        self.started = 0.0

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
        self.started = time.time()
        result = ctx.run_pass(PassSpec(layout.PASS1, "pass 1", request, observe))
        if result.stopped:
            return Recorded(outcome=ctx.stopped(result))
        ctx.summary.set_pass(layout.PASS1.folder, PassSummary(result.returncode, result.records))
        return Recorded(*self.judge(result))

    def judge(self, result: PassResult, located_pass: bool = False, by: str = "pass 1 (locate)"
                      ) -> Tuple[Optional[Failure], Optional[Outcome]]:
        """Pass 1's result: the failure to examine, or the outcome that ends the hunt (``located_pass``: the locate
        pass from step 1 of ``hunt --from``, which names what it found as the exact step)."""
        ctx, rc, log = self.ctx, result.returncode, result.log_path
        if not result.records and rc != 0:
            hint = say_.interpreter_hint(sys.executable) if not result.said_anything else ""
            say(say_.failed_before_guard(rc, say_.last_lines(result.tail), log, hint))
            ctx.summary.command_returncode = rc
            return None, Outcome.FAILED_BEFORE_TRAINING
        if not result.records:
            say(say_.no_guard(rc, log, result.not_attached))
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
        say(say_.located(describe(failure.record), by) if located_pass else say_.pass1_failed(describe(failure.record)))
        if failure.typed.seed is None:
            say(say_.NO_SEED)
        if ctx.print_replays(ctx.at(result.name)):
            say(say_.REFUSAL_REPLAYED_IN_LOCATE if located_pass else say_.REFUSAL_REPLAYED)
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


def describe(record: Dict[str, Any]) -> str:
    """``"epoch 2, step 3/8 (global step 11), dump iteration 10: <what went wrong>"``."""
    try:
        return FailureRecord.from_dict(record, source="failure record").format()
    except RecordError as exc:
        return f"global step {record.get('global_step')}: {record.get('message') or record.get('kind')} ({exc})"
