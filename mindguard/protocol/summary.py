"""The hunt's result, ``summary.json``: how it ended (:class:`Outcome`, the exit code) and what each pass found
(:class:`HuntSummary`), written in one place (:meth:`HuntSummary.to_dict`).

A key appears only once the hunt sets it: a field left :data:`UNSET` is not written, a field set to ``None`` is
written as ``null``. Steps are 1-based global steps; times are seconds. Never imports MindSpore.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
from typing import Any, Dict, List, Literal, Optional

#: summary.json's format version.
SCHEMA = 2

#: How the examine pass looks at the failing step (``MINDGUARD_EXAMINE``, :mod:`mindguard.protocol.request`).
Examination = Literal["dump", "replay", "dataset"]

#: Where a ``hunt --from`` starts (:func:`mindguard.hunt.plan.plan_from_record`).
FromRecordRoute = Literal["done", "resume", "from_step_1"]

#: summary["resume"]["route"]: resumed from the kept state, or why the hunt ran from step 1 instead.
ROUTE_RESUMED = "resumed"
ROUTE_DID_NOT_REPEAT = "from step 1 (the failure did not repeat from the kept state)"


class Outcome(enum.Enum):
    """How a hunt ended, and its exit code. ``1`` means only "found and explained"; a command that failed without a
    training failure gets ``4`` (its own exit code is in the summary's ``command_returncode``)."""

    HEALTHY = ("healthy", 0)
    FOUND = ("failure_found", 1)
    COMMAND_FAILED = ("command_failed", 4)
    MINDGUARD_FAILED = ("mindguard_failed", 2)
    NO_GUARD = ("no_guard", 2)
    FAILED_BEFORE_TRAINING = ("failed_before_training", 2)
    EXAMINE_FAILED = ("examine_failed", 2)
    TIMED_OUT = ("timed_out", 2)
    ENDED_EARLY = ("ended_early", 2)      # the command ended without its record saying so (os._exit, ...)
    RECORD_FAILED = ("record_failed", 2)  # pass 1 could not record (the run folder's disk full or removed, ...)
    ERROR = ("error", 2)                  # the hunt itself could not go on (the message says why)
    NOT_REPRODUCIBLE = ("not_reproducible", 3)
    ANALYSIS_FAILED = ("analysis_failed", 3)
    UNEXPLAINED = ("unexplained", 3)
    INTERRUPTED = ("interrupted", 130)

    @property
    def label(self) -> str:
        return self.value[0]

    @property
    def exit_code(self) -> Optional[int]:
        return self.value[1]


class _Unset:
    """A field the hunt has not set (not written), as opposed to one set to ``None`` (written as ``null``)."""

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


def _written(obj: Any) -> Dict[str, Any]:
    """The fields of a summary dataclass that are set, in field order, nested dataclasses as dicts."""
    out = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if value is UNSET:
            continue
        out[f.name] = value.to_dict() if hasattr(value, "to_dict") else value
    return out


@dataclass
class PassSummary:
    """One pass: its command's ``returncode`` and the failure ``records`` it wrote (one per rank, as written); an
    examine pass adds ``examine`` (how it looked), ``diverged`` (why a resumed pass did not compute what pass 1
    did) or ``not_examined`` (why it could not run the step)."""

    returncode: int
    records: List[Dict[str, Any]]
    examine: Any = UNSET
    diverged: Any = UNSET
    not_examined: Any = UNSET

    def to_dict(self) -> Dict[str, Any]:
        return _written(self)


@dataclass
class ResumeSummary:
    """The training state pass 1 kept: ``kept_step`` (1-based global step), ``estimate_s`` (seconds from step 1
    and resumed), ``route`` (:data:`ROUTE_RESUMED` or why not) and ``predicted_iteration_missed`` (0-based dump
    iteration that did not hold the step)."""

    kept_step: Any = UNSET
    estimate_s: Any = UNSET
    route: Any = UNSET
    predicted_iteration_missed: Any = UNSET

    def to_dict(self) -> Dict[str, Any]:
        return _written(self)


@dataclass
class FromRecordSummary:
    """``hunt --from``: the failing run's ``record`` path, the plan's ``route`` and ``why``, the ``window`` of
    1-based global steps the failing one lies in, the ``kept_step``, ``fallback`` (why the hunt ran from step
    1 instead), ``edits`` (what differs from the failing run: edited project files, another folder) and
    ``approximate`` (the random sources -- dropout kernels -- the kept state cannot hold: the resumed passes drew
    other masks than the failing run, so the answer is that of an approximate replay)."""

    record: str
    route: str
    why: str
    window: Optional[List[int]]
    kept_step: Optional[int]
    fallback: Any = UNSET
    edits: Any = UNSET   # what differs from the failing run: edited project files, another folder
    disagrees: Any = UNSET    # {"record_step", "found_step" (None: no failure)} when the answer is not the record's
    locate_dump: Any = UNSET  # "dumped": the locate pass dumped each step (no second pass); else why it did not
    approximate: Any = UNSET  # the random sources the kept state cannot hold: the resumed passes drew other masks

    def to_dict(self) -> Dict[str, Any]:
        return _written(self)


#: How the fix a hint prints fared when the hunt ran it (:mod:`mindguard.hunt.fix_check`): ``trains_finite`` -- the
#: edited copy trained finite through the steps checked; ``guard_only`` -- it did, but the origin (a data column, a
#: learning rate) is still what it was, so the edit is a guard, not a fix; ``still_fails`` -- the failure came back;
#: ``unchecked`` -- the check could not run (``why``).
FixVerdict = Literal["trains_finite", "guard_only", "still_fails", "unchecked"]


@dataclass
class FixCheck:
    """The check of the first hint whose edit applies mechanically (``hunt``, ``hunt --from``; not with
    ``--no-check-fix``): the edit applied to a scratch copy of the project and run as ``mindguard verify`` runs a
    fix. ``verdict`` (:data:`FixVerdict`), ``printed`` (the line printed under the hint), ``through_step`` (the
    last 1-based global step it trained finite), ``failed_step`` (still failing: the step that did), ``why``
    (unchecked: why; still failing: the verdict), ``hint`` (whose hint: ``"origin"`` | ``"stopped_at"``), ``edit``
    (``{"file", "line", "now", "fix", "import_added"}``), ``route`` (``"resume"``: from the kept state |
    ``"from_start"``: from step 1), ``folder`` (the check's run folder: its pass, its output, ``verify.json``),
    ``seconds`` (what it took) and ``limit_s`` (its time limit)."""

    verdict: FixVerdict
    printed: str
    through_step: Any = UNSET
    failed_step: Any = UNSET
    why: Any = UNSET
    hint: Any = UNSET
    edit: Any = UNSET
    route: Any = UNSET
    folder: Any = UNSET
    seconds: Any = UNSET
    limit_s: Any = UNSET

    def to_dict(self) -> Dict[str, Any]:
        return _written(self)


@dataclass
class HuntSummary:
    """What ``summary.json`` holds (docs/gen_schema.py describes every field; ``passes`` are written as keys of
    their own, one per pass folder: ``pass1``, ``locate``, ``pass2``, ``resumed``, ...)."""

    command: List[str]
    run_dir: str
    schema: int = SCHEMA
    from_record: Any = UNSET          # FromRecordSummary
    command_returncode: Any = UNSET   # the command's exit code (a signal n as 128 + n)
    failure: Any = UNSET              # the failing step's record, as written
    resume: Any = UNSET               # ResumeSummary
    passes: Dict[str, PassSummary] = field(default_factory=dict)   # by folder name, in the order they ran
    origin: Any = UNSET
    stopped_at: Any = UNSET
    nonfinite_inputs: Any = UNSET
    warnings: Any = UNSET
    dump_bytes: Any = UNSET
    dump_scopes: Any = UNSET          # [{"scope", "pass", "bytes"}] of the narrower dumps that explained nothing
    origin_rank: Any = UNSET
    rank_roles: Any = UNSET
    replay: Any = UNSET
    verify_command: Any = UNSET       # the `mindguard verify` line that checks a fix of the failure found
    fix_check: Any = UNSET            # FixCheck: the hint's edit run on a scratch copy (hunt/fix_check.py)
    divergence: Any = UNSET           # where the loss began to grow before the failure (protocol/divergence.py)
    known: Any = UNSET                # no operator isolated: {"pass", "facts", "tried", "next"} (hunt/known.py)
    ended_early_at: Any = UNSET
    mindguard_error: Any = UNSET
    signal: Any = UNSET
    error: Any = UNSET
    outcome: Any = UNSET              # Outcome.label
    exit_code: Any = UNSET            # Outcome.exit_code
    finished: Any = UNSET             # local time, ISO 8601 to the second

    def set_pass(self, folder: str, entry: PassSummary) -> PassSummary:
        """Record the pass whose folder is ``folder`` (again: replaced, keeping its place)."""
        self.passes[folder] = entry
        return entry

    def end(self, outcome: Outcome, finished: str) -> None:
        self.outcome, self.exit_code, self.finished = outcome.label, outcome.exit_code, finished

    def to_dict(self) -> Dict[str, Any]:
        """summary.json's object: ``schema``, ``command``, ``run_dir`` first, every set field, each pass under its
        folder's name."""
        fields = _written(self)
        passes = {name: entry.to_dict() for name, entry in fields.pop("passes").items()}
        head = {key: fields.pop(key) for key in ("schema", "command", "run_dir")}
        return {**head, **passes, **fields}

    @classmethod
    def keys(cls) -> List[str]:
        """The keys of summary.json other than the pass folders', in the order :meth:`to_dict` writes them."""
        names = [f.name for f in dataclasses.fields(cls) if f.name != "passes"]
        head = ["schema", "command", "run_dir"]
        return head + [n for n in names if n not in head]
