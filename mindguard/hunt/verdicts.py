"""The hunt's verdicts as data: what a rule decided, as a reason code with the facts it decided on, never a sentence.

The rules that make them are pure functions (:mod:`mindguard.hunt.rules`,
:func:`mindguard.hunt.plan.locate_dump_refusal`): they print nothing and touch no summary; their callers act on the
code and say it through :mod:`mindguard.hunt.messages`, which maps each code to its sentence. Tests assert codes,
not English.

Steps are 1-based global steps. Imports nothing of MindSpore, and nothing of the hunt but :mod:`.result`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional, Tuple

from .result import Failure

#: A ``hunt --from`` route (:class:`mindguard.hunt.plan.FromRecordPlan`): ``done`` -- the record says all there is
#: (nothing to hunt); ``resume`` -- from the failing run's kept state; ``from_step_1`` -- no state worth resuming from.
Route = Literal["done", "resume", "from_step_1"]

#: How a ``done`` route ends (a :class:`mindguard.protocol.summary.Outcome`'s name).
DoneOutcome = Literal["healthy", "command_failed", "failed_before_training", "found"]

#: Why a locate pass does not also dump the steps it runs (:func:`mindguard.hunt.plan.locate_dump_refusal`):
#: ``no_locate_pass``, ``no_failure`` (nothing to locate), ``several_ranks``, ``not_a_dump`` (the step is examined by
#: replay or the dataset pipeline), ``killed`` (the run was killed: its step is dumped whole, by a pass of its own),
#: ``sink_mode`` (one iteration holds several steps), ``size_unknown`` (the kept state does not say its size),
#: ``window_too_wide`` (no size, and more than :data:`mindguard.hunt.plan.BLIND_DUMP_STEPS` steps), ``disk_space``
#: (too little free space), ``writes_cost_more`` (the dump's writes at the look's scope cost more than a pass of its
#: own, timed), ``bytes_cost_more`` (the same, by size alone).
DumpRefusalCode = Literal["no_locate_pass", "no_failure", "several_ranks", "not_a_dump", "killed", "sink_mode",
                          "size_unknown", "window_too_wide", "disk_space", "writes_cost_more",
                          "bytes_cost_more"]


@dataclass(frozen=True)
class DumpRefusal:
    """Why a locate pass does not dump as it goes: ``code`` and the facts its sentence names -- ``how`` (the
    examination), ``steps`` (the steps it would dump), ``per_step_bytes``/``total_bytes`` (the dump's estimated
    size, bytes), ``free_bytes`` (free space where the hunt writes, bytes), ``writes_s``/``second_pass_s``/
    ``startup_s`` (seconds: the dump's writes, a pass of its own, the failing run's start to its first step's end)."""

    code: DumpRefusalCode
    how: str = ""
    steps: int = 0
    per_step_bytes: float = 0.0
    total_bytes: float = 0.0
    free_bytes: int = 0
    writes_s: float = 0.0
    second_pass_s: float = 0.0
    startup_s: float = 0.0


#: What an examine pass came to (:func:`mindguard.hunt.rules.judge_examined`), in the order the ladder tries them:
#: ``stopped`` (the hunt stopped it), ``diverged`` (a resumed pass computes something else), ``sink_refused``
#: (MindSpore refused the synchronous pipeline in sink mode), ``mindguard_failed`` (mindguard's own code failed),
#: ``failed_before_its_first_step``, ``repeated`` (the failure repeated at its step), ``not_examined`` (the pass did
#: not get to run the step: no evidence either way), ``computes_otherwise`` (a second examiner's run computes
#: otherwise: no evidence), ``not_repeated_from_kept_state``, ``killed_then_ran_clean`` (pass 1 died by a kill; this
#: pass ran the step without failing), ``not_reproducible``.
ExamineCode = Literal["stopped", "diverged", "sink_refused", "mindguard_failed", "failed_before_its_first_step",
                      "repeated", "not_examined", "computes_otherwise", "not_repeated_from_kept_state",
                      "killed_then_ran_clean", "not_reproducible"]


@dataclass(frozen=True)
class ExamineVerdict:
    """An examine pass's verdict: ``code``; ``found``: the failure the pass recorded (the repeated one with
    ``repeated``; what failed instead otherwise; ``None``: none); ``not_examined``: why the pass is no evidence (with
    ``not_examined``); ``diverged``: why a resumed pass computes something else, ``unfit`` when the kept state does
    not fit this run at all (with ``diverged``)."""

    code: ExamineCode
    found: Optional[Failure] = None
    not_examined: Optional[str] = None
    diverged: Optional[str] = None
    unfit: bool = False


#: What a ``hunt --from`` locate pass from the kept state came to (:func:`mindguard.hunt.rules.judge_located`):
#: ``located`` (the failing run's failure, at its exact step, with a state kept there), ``killed_from_outside`` (a
#: killed run's window ran through without failing: the kill came from outside), and the fallbacks to the plain
#: hunt: ``unfit`` (the kept state does not fit this run), ``diverged`` (the run computes something else),
#: ``missed`` (no failure within the window, or another one), ``no_state_at_step`` (the pass kept no state at the
#: step it located).
LocateCode = Literal["located", "killed_from_outside", "unfit", "diverged", "missed", "no_state_at_step"]


@dataclass(frozen=True)
class LocateVerdict:
    """A locate pass's verdict: ``code``; ``exact``: the located failure's record (with ``located``); ``where``: what
    the run did instead (:func:`mindguard.hunt.plan.located_failure`'s); ``diverged``: why it computes something else
    (with ``unfit`` and ``diverged``); ``other_masks``: the resumed pass drew other random masks than the failing run
    (the kept state could not hold them)."""

    code: LocateCode
    exact: Optional[Dict[str, Any]] = None
    where: str = ""
    diverged: Optional[str] = None
    other_masks: bool = False

    @property
    def falls_back(self) -> bool:
        """Whether the hunt falls back to its plain two passes."""
        return self.code in ("unfit", "diverged", "missed", "no_state_at_step")


#: Why a resumed examine pass of ``hunt --from`` sends the hunt back to its plain two passes
#: (:func:`mindguard.hunt.rules.resumed_fallback`): ``unfit`` (the kept state does not fit this run; ``detail`` says
#: why), ``did_not_repeat`` (the failure did not repeat from the kept state).
FallbackCode = Literal["unfit", "did_not_repeat"]


@dataclass(frozen=True)
class Fallback:
    """A fallback to the plain hunt: ``code`` and ``detail`` (the divergence's own words, with ``unfit``)."""

    code: FallbackCode
    detail: Optional[str] = None


__all__: Tuple[str, ...] = ("DoneOutcome", "DumpRefusal", "DumpRefusalCode", "ExamineCode", "ExamineVerdict",
                            "Fallback", "FallbackCode", "LocateCode", "LocateVerdict", "Route")
