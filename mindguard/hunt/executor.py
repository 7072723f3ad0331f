"""The hunt's route through its passes: record -> (locate) -> examine -> explain, on typed pass results.

:class:`Executor` decides which pass runs next from what the last one left
(:class:`~mindguard.hunt.result.PassResult`), and ends with an :class:`~mindguard.protocol.summary.Outcome`:

* the plain hunt (:meth:`Executor.from_start`): pass 1 records the failing step (keeping the training state from
  time to time); pass 2 examines it, from that state when quicker (:func:`~mindguard.hunt.plan.choose_resume`);
* ``--from RECORD``: the routes :class:`~mindguard.hunt.from_record.FromRecord` runs -- resume from the failing
  run's kept state, *locate* the exact step in the window, examine it there; one locate pass from step 1 when no
  state can be used; the plain hunt only where no locate pass can do the work, saying why.

The passes are run by a :class:`~mindguard.hunt.result.PassRunner` (processes, or a test's fake). Steps are 1-based
global steps. Never imports MindSpore.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from ..protocol.summary import FromRecordSummary, Outcome
from . import messages as say_
from .console import say
from .context import HuntContext
from .examine import Examined, Examiner
from .from_record import FromRecord
from .explain import Explainer
from .pass1 import FirstPass, Recorded
from .pass2 import SecondPass
from .result import Failure, read

class Executor:
    """One hunt's route (module docstring)."""

    def __init__(self, ctx: HuntContext, origin_problem: Optional[Tuple[str, str]] = None,
                 notes: Tuple[str, ...] = ()):
        self.ctx = ctx
        self.origin_problem = origin_problem   # (path, why) of a `--from` record that cannot be used
        self.notes = list(notes)               # what differs from the failing run (another folder, edited files)
        self.examiner = Examiner(ctx)
        self.explainer = Explainer(ctx, self.examiner)
        self.pass1 = FirstPass(ctx)
        self.pass2 = SecondPass(ctx, self.examiner)
        self.record_routes = FromRecord(self)

    def hunt(self) -> Outcome:
        ctx = self.ctx
        if ctx.cluster is not None:   # several msrun nodes: meet the other nodes' hunts before anything is launched
            ctx.cluster.join()
        if ctx.origin is not None:
            return self._against_record(ctx.origin[0], ctx.origin[1], self.record_routes.route(*ctx.origin))
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

    def check_against_record(self, failure: Failure) -> None:
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


    # -- the plain hunt ------------------------------------------------------------------------------------
    def from_start(self) -> Outcome:
        """Pass 1 from step 1 finds the failing step; pass 2 examines it; the answer is explained."""
        recorded = self.pass1.record()
        if recorded.failure is None:
            return recorded.outcome or Outcome.ERROR
        self.check_against_record(recorded.failure)
        return self.explained(recorded.failure, self.pass2.examine(recorded.failure, self.pass1.started))

    def explained(self, failure: Failure, examined: Examined) -> Outcome:
        """The examined step's answer (the examination's outcome when it did not repeat the failure)."""
        if examined.repeated is None:
            return examined.outcome or Outcome.EXAMINE_FAILED
        return self.explainer.explain(failure, examined)


__all__ = ["Executor", "Recorded"]   # (Recorded: pass 1's, kept importable here)
