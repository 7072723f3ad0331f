"""What ``mindguard verify --from RECORD -- COMMAND`` decides: pure functions, no processes, no MindSpore.

:func:`plan_verify` turns the failing run's record, and the ``state.json`` of the training state it kept, into the
steps the verify pass trains (:class:`VerifyPlan`): from the kept state (or from step 1 with ``--from-start``)
through the failing step or window and ``steps`` more. :func:`judge` turns what the pass did -- its first failure,
the losses it noted (``verify_steps.json``, :mod:`mindguard.protocol.verify`) -- into the :class:`Verdict`:

* ``"holds"`` (exit 0): every step through the failing one trained finite with the change; the losses are shown
  next to the failing run's, and a loss far from the failing run's last finite ones is flagged (:func:`far_losses`);
* ``"fails"`` (exit 1): a step still failed with the change (the wrapper then examines it as a hunt would);
* ``"cannot"`` (exit 2): nothing to verify against, the state does not load into the edited script, or the
  command ended before the failing step; ``why`` says so and what to do.

Steps are 1-based global steps (:mod:`mindguard.training.run`).
"""
from __future__ import annotations

import dataclasses
import math
import shlex
import shutil
import sys
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..protocol.kept_state import StateLike, as_state_meta, unrestorable_note
from ..protocol.divergence import Onset, divergence, find_onset, history_losses, resume_blind
from ..errors import ArgumentError
from ..protocol.record import Kind, Phase, Status
from .plan import NONFINITE_KINDS

#: Steps trained after the failing one (or the end of its window) unless ``--steps`` says otherwise.
DEFAULT_MORE_STEPS = 5
#: A loss more than this factor above the largest, or below the smallest, of the failing run's last finite losses
#: is flagged: the numbers stayed finite, but the training learns something else.
FAR_FACTOR = 10.0
#: How many of the failing run's last finite losses make the reference.
REFERENCE_LOSSES = 50
#: When the kept state cannot judge a fix (the training already diverging there, or an edit that acts before it),
#: verify runs the edited command from step 1 itself when that is expected to take at most this long (the failing
#: run's step time x the steps, plus a start-up allowance); else it says so and prints the ``--from-start`` line.
FROM_START_SECONDS = 900.0
#: The start-up allowance of that estimate (importing MindSpore, the first compile), seconds.
START_SECONDS = 30.0

EXIT_HOLDS, EXIT_FAILS, EXIT_CANNOT = 0, 1, 2


def front() -> str:
    """How this machine runs mindguard: ``mindguard`` when on PATH, else ``python -m mindguard``."""
    return "mindguard" if shutil.which("mindguard") else f"{shlex.quote(sys.executable)} -m mindguard"


def verify_line(record: str, command: Sequence[str], *, from_start: bool = False) -> str:
    """The ``mindguard verify`` command that checks a fix of the failure ``record`` names once ``command``'s script is
    edited; ``from_start`` when its kept state cannot be trusted to repeat the failure (a hunt fell back to step 1)."""
    start = "--from-start " if from_start else ""
    return f"{front()} verify {start}--from {shlex.quote(str(record))} -- {shlex.join(command)}"


@dataclasses.dataclass(frozen=True)
class VerifyPlan:
    """The verify pass's steps. ``route``: ``"resume"`` (from the kept state at ``state_step``), ``"from_start"``
    (from step 1) or ``"cannot"`` (``why`` says why; nothing runs). ``window``: the steps the failing run's failure
    was made in (``first == last``: exact); ``failed_at``: the step its record names; ``first``: the first step whose
    loss is noted; ``through``: the last step trained."""

    route: str
    why: str
    window: Optional[Tuple[int, int]] = None
    failed_at: Optional[int] = None
    state_step: Optional[int] = None
    first: int = 1
    through: int = 1
    note: Optional[str] = None   # why the plan trains from step 1 although a state was kept (issue 52)

    def failure_words(self) -> str:
        """The failing run's failure, in words: "the failure at global step 1500"."""
        assert self.window is not None
        first, last = self.window
        if first == last:
            return f"the failure at global step {last}"
        return f"the failure made in one of global steps {first}-{last} and recorded at global step {self.failed_at}"


def _from_start_hint(retry: str) -> str:
    return f"to verify from step 1 instead, run:\n    {retry}"


def plan_verify(record: Dict[str, Any], state_meta: Optional[StateLike], *, steps: Optional[int] = None,
                from_start: bool = False, retry: str = "mindguard verify --from-start --from RECORD -- COMMAND",
                state_note: Optional[str] = None) -> VerifyPlan:
    """The steps to verify. ``record``: the failing run's record (as written); ``state_meta``: its kept state's
    ``state.json`` (``None``: missing or unreadable); ``steps``: steps after the failing one (default
    :data:`DEFAULT_MORE_STEPS`); ``from_start``: train from step 1; ``retry``: the ``--from-start`` command line the
    reason suggests when the kept state cannot be used; ``state_note``: why the record's own state was not the one
    chosen, or why there is none (:func:`mindguard.protocol.kept_state.choose_kept_state`)."""
    more = DEFAULT_MORE_STEPS if steps is None else int(steps)
    if more < 0:
        raise ArgumentError(f"--steps {steps}: must be 0 or more steps after the failing one; pass --steps 0 to "
                            f"check only the failing steps")
    status, step = record.get("status"), record.get("global_step")
    if status == Status.FINISHED:
        return VerifyPlan("cannot", f"the run finished without a failure at global step {step}: nothing to verify a "
                                    f"fix against; give the record of a run that failed")
    kind, phase = record.get("kind"), record.get("phase")
    if status == Status.RUNNING and step:
        kind = Kind.EXCEPTION.value   # killed mid-step: the step it died in is the one to get past
    if kind == Kind.INTERRUPTED:
        return VerifyPlan("cannot", f"the run was interrupted (Ctrl-C) at global step {step}, it did not fail: "
                                    f"nothing to verify a fix against")
    if phase in (Phase.SCRIPT, Phase.MINDGUARD):
        who = "the script's own code" if phase == Phase.SCRIPT else "mindguard's own code"
        return VerifyPlan("cannot", f"at global step {step} {who} raised ({record.get('message') or 'no message'}), "
                                    f"not the training's numbers: run the edited command itself to see that it is gone")
    if not step:
        return VerifyPlan("cannot", "the run failed before its first training step: run the edited command itself "
                                    "to see whether it starts")
    window = record.get("failure_window") if kind in NONFINITE_KINDS else None
    first, last = (int(window[0]), int(window[1])) if window else (int(step), int(step))
    last = max(last, int(step))
    through = last + more
    kept = record.get("kept_state") or {}
    state = as_state_meta(state_meta)
    state_step = state.step if state is not None else None
    if from_start:
        return VerifyPlan("from_start", f"from step 1 (--from-start) through global step {through}", (first, last),
                          int(step), None, state_step if state_step and 1 < state_step <= first else first, through)
    unrestorable = unrestorable_note(state)
    if state is None and state_note:
        why = state_note
    elif not kept and state is None:
        why = "the failing run kept no training state (Guard keeps one once its Parameters were checked finite, on " \
              "one rank, with keep_state=True)"
    elif state is None:
        why = f"the kept training state {kept.get('path')} is gone or unreadable"
    elif not 1 < int(state_step or 0) <= first:
        why = f"the kept training state begins global step {state_step}, not before the failure's first possible " \
              f"step {first}"
    elif unrestorable is not None:   # the unfixed step might not fail again from it: no verdict to trust
        why = f"the kept training state cannot be resumed: {unrestorable}"
    elif state_step is not None:
        plan = VerifyPlan("resume", f"from the training state kept at global step {state_step} through global step "
                                    f"{through}", (first, last), int(step), state_step, state_step, through)
        onset = resume_blind(divergence(record), state_step)
        if onset is not None:   # the kept state is already on the way to the failure: no verdict from it
            return from_step_1(plan, record, f"the loss was already growing at the kept state of global step "
                                             f"{state_step} (since global step {onset}): a fix acts before it",
                               retry)
        return plan
    return VerifyPlan("cannot", f"{why}; {_from_start_hint(retry)}", (first, last), int(step), state_step)


def from_start_seconds(record: Dict[str, Any], through: int) -> Optional[float]:
    """About how long a run of the edited command from step 1 through global step ``through`` takes: the failing
    run's step time (its record's ``param_checks.step_ms``) x the steps, plus :data:`START_SECONDS`; ``None`` when
    the record does not say."""
    checks = record.get("param_checks")
    step_ms = checks.get("step_ms") if isinstance(checks, dict) else None
    if not isinstance(step_ms, (int, float)) or isinstance(step_ms, bool) or step_ms <= 0:
        return None
    return START_SECONDS + float(step_ms) / 1e3 * through


def from_step_1(plan: VerifyPlan, record: Dict[str, Any], reason: str, retry: str,
                limit: float = FROM_START_SECONDS) -> VerifyPlan:
    """The plan when the kept state of ``plan`` cannot judge a fix (``reason``): the edited command from step 1
    through the same steps, every step's loss noted, when that takes at most ``limit`` seconds by the failing run's
    pace; else ``"cannot"``, saying why and the ``--from-start`` line (``retry``)."""
    assert plan.window is not None
    seconds = from_start_seconds(record, plan.through)
    took = (f"about {seconds:.0f} s: the failing run's step time x {plan.through} steps, and {START_SECONDS:.0f} s to "
            f"start" if seconds is not None else "its time unknown: the failing run's record holds no step time")
    if seconds is not None and seconds > limit:
        return VerifyPlan("cannot", f"{reason}, so the kept state cannot judge it; verifying from step 1 through "
                                    f"global step {plan.through} would take {took} (over {limit:.0f} s); "
                                    f"{_from_start_hint(retry)}", plan.window, plan.failed_at, plan.state_step,
                          note=reason)
    return VerifyPlan("from_start", f"from step 1 through global step {plan.through} ({took}): {reason}, so the "
                                    f"training state kept at global step {plan.state_step} cannot judge it",
                      plan.window, plan.failed_at, plan.state_step, 1, plan.through, note=reason)


def parse_losses(losses: Dict[str, Optional[str]]) -> Dict[int, Optional[float]]:
    """``{"1500": "0x1.2p-3", ...}`` (exact text: ``float.hex``, ``"nan"``, ``"inf"``) as ``{1500: 0.14..., ...}``."""
    out: Dict[int, Optional[float]] = {}
    for step, text in losses.items():
        try:
            out[int(step)] = None if text is None else float.fromhex(text) if text.startswith(("0x", "-0x")) \
                else float(text)
        except (TypeError, ValueError):
            out[int(step)] = None
    return out


def failing_losses(trace: Mapping[str, Sequence[Optional[str]]],
                   record: Optional[Dict[str, Any]] = None) -> Dict[int, Optional[float]]:
    """The failing run's loss per step from a kept state's trace (``state.json``'s ``trace``: step -> [loss, ...]),
    and, before it, from the record's ``loss_history`` (the trace's exact values win)."""
    out = history_losses(record.get("loss_history")) if record is not None else {}
    out.update(parse_losses({step: (values[0] if values else None) for step, values in trace.items()}))
    return out


def far_losses(verified: Dict[int, Optional[float]], failing: Dict[int, Optional[float]],
               upto: int) -> Tuple[List[int], Optional[float]]:
    """The steps whose loss with the change is far above the failing run's: more than :data:`FAR_FACTOR` x the
    largest of its last :data:`REFERENCE_LOSSES` finite losses through global step ``upto`` (its failing step).
    Only upwards: a loss that stays finite but jumps (an epsilon on a count divides by ~0, a huge clamp) is the
    sign of a wrecked training, while a smaller one may be the fix working (losses near zero differ by orders of
    magnitude from step to step). Returns the steps and the reference (``None``: no finite loss to compare with)."""
    finite = [v for s, v in sorted(failing.items()) if s <= upto and v is not None and math.isfinite(v)]
    reference = finite[-REFERENCE_LOSSES:]
    if not reference:
        return [], None
    high = max(max(reference), 0.0)
    limit = high * FAR_FACTOR if high > 0 else 1e-12
    far = [s for s, v in sorted(verified.items()) if v is not None and math.isfinite(v) and v > limit
           and not _near(v, failing.get(s))]   # (the failing run's own loss there was as high: that batch's)
    return far, high


def _near(value: float, failing: Optional[float]) -> bool:
    return failing is not None and math.isfinite(failing) and failing > 0 and value <= failing * FAR_FACTOR


@dataclasses.dataclass
class Verdict:
    """What ``mindguard verify`` says: ``outcome`` (``"holds"``/``"fails"``/``"cannot"``), its ``exit_code``, the
    ``headline`` and further ``lines``; ``failed_step`` when it still fails; ``far`` the flagged steps."""

    outcome: str
    exit_code: int
    headline: str
    lines: List[str] = dataclasses.field(default_factory=list)
    failed_step: Optional[int] = None
    far: List[int] = dataclasses.field(default_factory=list)
    earlier: Optional[Dict[str, Any]] = None   # the edit acts before the kept state: {"from_step", "what"}
    diverging: Optional[Dict[str, Any]] = None   # the loss still grows with the change (protocol/divergence.Onset)
    through: Optional[int] = None   # holds: the last global step trained finite with the change
    why: Optional[str] = None       # cannot: why (the headline's words after "cannot verify the fix: ")

    def to_dict(self) -> Dict[str, Any]:
        return dataclasses.asdict(self)


def cannot(why: str) -> Verdict:
    return Verdict("cannot", EXIT_CANNOT, f"cannot verify the fix: {why}", why=why)


def judge(plan: VerifyPlan, failure: Optional[Dict[str, Any]], steps_doc: Dict[str, Any],
          failing: Dict[int, Optional[float]], *, returncode: int, ended: Optional[str] = None,
          retry: str = "mindguard verify --from-start --from RECORD -- COMMAND") -> Verdict:
    """The verdict on the verify pass. ``failure``: its first failure record (``None``: it recorded none);
    ``steps_doc``: its ``verify_steps.json`` (``{}`` when it wrote none); ``failing``: the failing run's loss per
    step; ``returncode``: the command's exit code; ``ended``: its last error line, when it ended with one; ``retry``:
    the ``--from-start`` command line to suggest when the kept state does not load."""
    assert plan.window is not None
    first, last = plan.window
    if steps_doc.get("cannot_load"):
        return cannot(f"the kept training state does not load into the edited script: {steps_doc['cannot_load']}; "
                      f"{_from_start_hint(retry)}")
    earlier = steps_doc.get("earlier")
    if isinstance(earlier, dict):   # never "holds" for an edit the pass could not apply, nor "still fails"
        verdict = cannot(f"the edit changes the training before the kept state of global step {plan.state_step} "
                         f"({earlier.get('what')}): from that state it cannot be tested; {_from_start_hint(retry)}")
        verdict.earlier = dict(earlier)
        return verdict
    verified = parse_losses(steps_doc.get("losses") or {})
    if failure is not None and failure.get("status") == Status.FAILED and failure.get("phase") in (
            Phase.STEP, Phase.BETWEEN_STEPS):
        step = int(failure.get("global_step") or 0)
        return Verdict("fails", EXIT_FAILS,
                       f"global step {step} still fails with the change ({failure.get('kind')}: "
                       f"{failure.get('message') or 'no message'})", failed_step=step,
                       lines=_loss_table(verified, failing, plan, step))
    if failure is not None and failure.get("status") == Status.FAILED:
        where = f"at global step {failure.get('global_step')}" if failure.get("global_step") else "before training"
        return cannot(f"the edited command failed {where} ({failure.get('phase') or 'before its first step'}), not "
                      f"in the training's numbers: {failure.get('message')}")
    trained = max((s for s, v in verified.items()), default=None)
    if trained is None or trained < last:
        where = f"after global step {trained}" if trained else "before the first step to verify"
        how = f" ({ended})" if ended else f" (exit code {returncode})" if returncode else ""
        return cannot(f"the edited command ended {where}{how}, before {plan.failure_words()}: it must train "
                      f"through global step {last}")
    nonfinite = [s for s, v in sorted(verified.items()) if v is not None and not math.isfinite(v)]
    if nonfinite:   # a loss no check flagged (the script's action="continue"): still not finite
        return Verdict("fails", EXIT_FAILS, f"global step {nonfinite[0]} still has a non-finite loss with the change",
                       failed_step=nonfinite[0], lines=_loss_table(verified, failing, plan, nonfinite[0]))
    growing = still_growing(verified, failing, plan)
    if growing is not None:   # finite, but the loss climbs as the failing run's did: postponed, not fixed
        return Verdict("fails", EXIT_FAILS,
                       f"the loss still grows with the change: {growing.words()}; the failure at global step "
                       f"{plan.failed_at} is postponed, not fixed -- the divergence's origin is still there",
                       lines=_loss_table(verified, failing, plan, None), diverging=growing.to_dict())
    shown_first = min(verified)
    end = "" if trained >= plan.through else f"; the training ended at global step {trained}"
    headline = (f"global steps {shown_first}-{trained} trained finite with the change ({plan.failure_words()} is "
                f"gone{end})")
    lines = _loss_table(verified, failing, plan, None)
    far, high = far_losses(verified, failing, plan.failed_at or last)
    if far:
        lines.append(f"warning: the loss at global step{'s' if len(far) > 1 else ''} {_steps_text(far)} is more "
                     f"than {FAR_FACTOR:g}x the failing run's largest of its last finite losses ({high:.6g}): the "
                     f"numbers stay finite, but the training learns something else (an epsilon on a count, a huge "
                     f"clamp); check the fix")
    return Verdict("holds", EXIT_HOLDS, headline, lines, far=far, through=trained)


def still_growing(verified: Dict[int, Optional[float]], failing: Dict[int, Optional[float]],
                  plan: VerifyPlan) -> Optional[Onset]:
    """The climb of the verified losses, when the failing run diverged (its losses climbed before the failure) and
    the verified ones climb too, through their end (:func:`mindguard.protocol.divergence.find_onset`): the change kept
    the numbers finite for now and left the divergence; ``None`` otherwise."""
    before = find_onset({s: v for s, v in failing.items() if plan.failed_at is None or s <= plan.failed_at})
    if before.kind != "growth":
        return None
    after = find_onset(verified)
    if after.kind != "growth" or after.end != max(verified):
        return None
    return after


def _steps_text(steps: Sequence[int]) -> str:
    if len(steps) <= 6:
        return ", ".join(map(str, steps))
    return f"{', '.join(map(str, steps[:5]))} ... {steps[-1]} ({len(steps)} steps)"


def _loss_table(verified: Dict[int, Optional[float]], failing: Dict[int, Optional[float]], plan: VerifyPlan,
                failed: Optional[int], rows: int = 12) -> List[str]:
    """The loss of each verified step next to the failing run's: the first step, then the steps around the failing
    one (or the window's end) -- at most ``rows`` rows."""
    if not verified or plan.window is None:
        return []
    steps = sorted(verified)
    focus = failed if failed is not None else plan.window[1]
    near = [s for s in steps if abs(s - focus) <= rows // 2]
    chosen = sorted(set(steps[:2] + near[-(rows - 2):]))
    out = ["  global step   loss with the change   loss of the failing run"]
    previous = None
    for step in chosen:
        if previous is not None and step != previous + 1:
            out.append("  ...")
        exact = plan.window[0] == plan.window[1]
        mark = "  <- failing step" if step == failed or (failed is None and exact and step == plan.window[1]) else ""
        out.append(f"  {step:>11}   {_num(verified.get(step)):>20}   {_num(failing.get(step), missing='-'):>24}{mark}")
        previous = step
    return out


def _num(value: Optional[float], missing: str = "no loss") -> str:
    if value is None:
        return missing
    return f"{value:.6g}"
