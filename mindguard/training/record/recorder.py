"""The run's record (:class:`Recorder`): the fields it assembles, the first failure it keeps, and the writing, through
a :class:`~mindguard.training.record.record_writer.RecordWriter`, to every path a Guard/FailureLocator asked for (the
hunt's path overrides them).

The record is the JSON file ``mindguard hunt`` and ``mindguard record`` read (:class:`~mindguard.protocol.record.
FailureRecord`): ``running`` while a step is under way, ``failed`` with the first failure of the process (a later one
never replaces it), ``finished`` when the training ended healthy. What an exception that ended a training call means
is decided by :mod:`mindguard.training.record.classify` (a pure function) and recorded here. Steps are 1-based,
process-wide global steps; dump iterations MindSpore's, 0-based. Imports nothing of MindSpore at import time.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ..state import dataset_skip as _dataset_skip
from . import provenance as _provenance
from ..._util.dist import per_rank_path, rank_info
from ..._version import __version__
from ...errors import MindguardWarning
from ...protocol import folder as layout
from ...protocol.record import FailureRecord
from ...protocol.request import record_override
from .classify import ExceptionDecision
from .hunt_line import HuntLine, callback_note, hunt_from_line
from .record_writer import RecordWriter, now_text, place_record
# what this module offered before the record writer moved to record_writer.py (other modules, other branches)
from .record_writer import _lock, check_replaceable, claim, held_by_a_live_run  # noqa: F401
from ..seed import current_seed
from ..step.events import StepListener
from ..step.steps import StepInfo

if TYPE_CHECKING:  # pragma: no cover
    from ..checks.checked import ParamChecks
    from ..child.window_dump import DumpPruner
    from ..run import Run
    from ..state.run_state import RunState


class Recorder(StepListener):
    """The record of ``run`` (its request, id and current step are read from it): assembled from the fields constant
    over the run (:attr:`base`, set at the first training call), the step's fields and the failure's, with what the
    run's Parameter ``checks``, kept ``state`` and dump ``pruner`` know of a failure. A listener of the run's events:
    ``call_begun``, ``step_begun`` (the "running" record), ``training_ended`` (the "finished" one)."""

    def __init__(self, run: "Run", cannot_write: Callable[..., None], *, checks: "ParamChecks", state: "RunState",
                 pruner: Optional["DumpPruner"] = None) -> None:
        self.run = run
        self.checks, self.state, self.pruner = checks, state, pruner
        self.cannot_write = cannot_write
        self.run_id: Optional[str] = run.run_id
        self.writer = RecordWriter(under_hunt=run.request is not None, cannot_write=cannot_write, run_id=run.run_id)
        self.base: Optional[Dict[str, Any]] = None   # the fields constant over the run, from the first call on
        self.failure: Optional[FailureRecord] = None
        self.params_count: Optional[int] = None   # Parameters a step's check covers (0: the loss only)
        self.checks_lost: List[Dict[str, Any]] = []   # checks mindguard's own errors disabled (lose_check)
        self.unrestorable: List[str] = []   # random sources no kept state can hold (rng.unrestorable_sources)
        self.finished_at: Optional[int] = None   # the global step the last "finished" record was written at
        self.sources: Optional[Dict[str, str]] = None   # {path: sha256} of the project's files at the first call
        self.data_sources: Optional[Dict[str, Dict[str, Any]]] = None   # {path: fingerprint} of the pipeline's data
        self.hunt_line = HuntLine()
        self._placed: Dict[Path, Path] = {}   # record paths asked for -> where they are written (placed)
        self.callback_told = False   # the note on a callback's own error was printed (say_callback_error)

    # -- paths ---------------------------------------------------------------------------------------------
    def add_path(self, path: "os.PathLike[str] | str") -> Path:
        """Ask for the record at ``path`` too (per rank when distributed); the hunt's path, or else
        ``MINDGUARD_RECORD`` from the environment, replaces every other. Returns the path actually written."""
        request, override = self.run.request, record_override()
        if request is not None:
            target = per_rank_path(Path(request.record).absolute(), *rank_info())
        elif override is not None:  # set by the user (e.g. for every rank of an msrun job): overrides record=
            target = per_rank_path(override.absolute(), *rank_info())
        else:
            target = per_rank_path(Path(path).expanduser().absolute(), *rank_info())
        if request is None:   # (the hunt's own run folder is the hunt's to make writable)
            target = self.placed(target)
        if rank_info()[1] > 1:   # per-rank records (<name>.rankN.json): no run-named copies beside them
            self.writer.run_id = None
        added = self.writer.add(target)
        if added is not None and (self.run.step is not None or self.failure is not None):
            self.writer.write(self.current())
        return self.writer.actual(target)

    def placed(self, asked: Path) -> Path:
        """Where the record asked for at ``asked`` is written outside the hunt, so that Guard never refuses a training
        the script alone would run (issue 50): ``asked`` itself; in a folder of its own under the temp directory
        when ``asked``'s folder cannot be written (:func:`mindguard.training.record.record_writer.place_record`); under
        a shorter name when its name is too long for the file system (:func:`mindguard.protocol.folder.fitted_record`;
        the files derived from it get the shorter stem too). Each said once."""
        placed = self._placed.get(asked)
        if placed is None:
            placed = self._placed[asked] = place_record(asked)
        return placed

    def own_path(self) -> Optional[Path]:
        """Where this run's failure is kept under its run id (:func:`mindguard.protocol.folder.run_record`), beside
        the first record asked for; ``None`` under the hunt or with no record."""
        if self.run_id is None or self.writer.run_id is None or not self.writer.paths:
            return None
        return layout.run_record(next(iter(self.writer.asked())), self.run_id)

    # -- the fields ----------------------------------------------------------------------------------------
    def start(self) -> None:
        """At the first training call: the fields constant over the run (and, outside the hunt, its identity)."""
        self.base = constant_fields()
        if self.run_id is not None:
            self._note_identity()
        self.note_base()

    def _note_identity(self) -> None:
        """Outside the hunt: the run's id (and its state folder) in the record, and the hashes of the project's files
        (:mod:`mindguard.training.record.provenance`) in ``run.json`` in its state folder (the failure record carries
        them too). Never ends the training: a file that cannot be written is left out."""
        base = self.base if self.base is not None else {}
        state = self.state
        base["run_id"] = self.run_id
        if state.keeper is not None and state.keeper.on_disk:
            base["states"] = str(state.keeper.directory)
        try:
            self.sources = _provenance.source_hashes(base.get("cwd") or os.getcwd())
        except Exception:  # noqa: BLE001 - any module mindguard cannot hash: the record goes without the hashes
            self.sources = None
        try:
            self.data_sources = _provenance.data_fingerprints(
                _dataset_skip.live_dataset_paths(), base.get("cwd") or os.getcwd()) or None
        except Exception:  # noqa: BLE001 - a pipeline mindguard cannot read: the record goes without its data
            self.data_sources = None
        state.write_run_info({"run_id": self.run_id, "cwd": base.get("cwd"), "argv": base.get("argv"),
                              "started": now_text(), "sources": self.sources or {}, "data": self.data_sources or {}})

    def note_base(self) -> None:
        """Put what the run learned of its checks into the record fields constant from now on (a new dict: the
        per-step record's template is cut again from it)."""
        if self.base is None:
            return
        extra: Dict[str, Any] = {}
        if self.params_count is not None:
            extra["params_checked"] = self.params_count
        if self.checks_lost:
            extra["checks_lost"] = [dict(lost) for lost in self.checks_lost]
        if self.unrestorable:
            extra["unrestorable_random"] = list(self.unrestorable)
        if any(self.base.get(key) != value for key, value in extra.items()):
            self.base = {**self.base, **extra}

    def note_params_count(self, count: int) -> None:
        """A step's Parameter check covers ``count`` Parameters (0: the loss only): said in every record."""
        self.params_count = count
        self.note_base()

    def note_unrestorable(self, sources: List[str]) -> None:
        """The keeper found random sources no kept state can hold: the record says so from now on, before any
        failure (``unrestorable_random``)."""
        self.unrestorable = sorted(set(self.unrestorable) | set(sources))
        self.note_base()

    def lose_check(self, check: str, error: BaseException, step: Optional[int], *, still: str) -> None:
        """mindguard's own error disabled ``check`` (e.g. ``"Parameter"``) from 1-based global step ``step`` on: one
        warning naming it, why, and what still runs (``still``); the record lists it under ``checks_lost``. The
        training goes on."""
        if any(lost["check"] == check for lost in self.checks_lost):
            return
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"
        self.checks_lost.append({"check": check, "from_step": step, "reason": reason})
        self.note_base()
        where = f"from global step {step} on" if step is not None else "from now on"
        warnings.warn(f"mindguard disabled its {check} check {where}: mindguard's own error ({reason}), not your "
                      f"training's. The training goes on; {still} still runs, and the record lists the lost check "
                      f"under checks_lost. Please report it with this message.", MindguardWarning, stacklevel=2)
        if self.failure is not None:
            self.failure.checks_lost = list(self.checks_lost)
            self.writer.write(self.failure)
            self._keep_failure_record()

    def record(self, status: str, *, info: Optional[StepInfo] = None, **fields: Any) -> FailureRecord:
        """A record of ``status`` at ``info`` (default: the run's current step) with ``fields``."""
        values = dict(self.base or {})
        if self.params_count is not None:
            values["params_checked"] = self.params_count
        if self.checks_lost:
            values["checks_lost"] = list(self.checks_lost)
        where = info if info is not None else self.run.step
        if where is not None:
            values.update(where.fields())
        values.update(fields)
        return FailureRecord(status=status, time=now_text(), **values)

    def current(self) -> FailureRecord:
        return self.failure if self.failure is not None else self.record("running")

    # -- the run's events -----------------------------------------------------------------------------------
    def call_begun(self, call: Any, network: Any, next_step: int) -> None:
        if self.base is None:
            self.start()
        self.write_running()

    def step_begun(self, info: StepInfo, failed: bool) -> None:
        self.write_running(info)

    def training_ended(self, last: Optional[StepInfo]) -> None:
        if last is not None:
            budget = self.checks.budget
            self.finish(last, {"param_checks": budget.describe()} if budget is not None else {})
        self.writer.close()

    # -- writing ------------------------------------------------------------------------------------------
    def write_running(self, info: Optional[StepInfo] = None) -> None:
        """The run is healthy so far (a call began: the full record; a step began: ``info``, its per-step update)."""
        if self.failure is not None:
            return
        if info is None or not self.writer.write_progress(info, self.base):
            self.writer.write(self.record("running"))  # first write, or a slot is gone: the full path

    def finish(self, step: StepInfo, fields: Dict[str, Any]) -> None:
        """No step is running and none failed: the record says the run was healthy to ``step`` (once per step)."""
        if self.failure is None and self.finished_at != step.global_step:
            self.writer.write(self.record("finished", **fields))
            self.finished_at = step.global_step

    # -- failures ------------------------------------------------------------------------------------------
    def fail(self, kind: str, *, loss: Optional[float] = None, nonfinite: Optional[List[str]] = None,
             message: Optional[str] = None, info: Optional[StepInfo] = None, **extra: Any) -> FailureRecord:
        """Record a failure at ``info`` (default: the current step). The first failure of the process is kept:
        a later call returns it unchanged. The record goes to disk first; then the state kept before it, the run's
        own copy of the record, and the printed hunt line."""
        if self.failure is not None:
            return self.failure
        run = self.run
        where = info if info is not None else run.step

        fields = {**self.checks.window_fields(where, kind), **_divergence_fields(self.state, where), **extra}
        self.failure = self.record("failed", info=info, kind=kind, loss=loss, nonfinite=list(nonfinite or []),
                                   message=_window_message(message, kind, fields.get("failure_window")), **fields)
        try:   # what a new process of the run costs: `hunt --from` weighs one pass against two by it (issue 51)
            self.failure.costs = self.state.costs(where)
        except Exception:  # noqa: BLE001 - a fact to note when it can be had, never a reason to fail
            self.failure.costs = None
        # mindguard's own error writing what follows never leaves the failure unstopped (issue 50): the caller still
        # stops or raises at it; what could not be written is said
        try:
            self._write_failure(where)
        except Exception as error:  # noqa: BLE001 - (HuntCannotContinue, under the hunt, is no Exception: it ends the pass)
            _say_not_all_written(self.failure, error)
        if self.worth_a_hunt() and self.writer.paths:
            try:
                self.hunt_line.say(self.failure, self.hunt_record(), under_hunt=run.request is not None)
            except Exception as error:  # noqa: BLE001 - as above
                _say_not_all_written(self.failure, error)
        return self.failure

    def _write_failure(self, where: Optional[StepInfo]) -> None:
        """The failure's record to disk first (whatever happens next, it is there); then the state kept before it,
        the record again with the state and the sources, and the run's own copy of it."""
        run, failure, pruner = self.run, self.failure, self.pruner
        assert failure is not None
        self.writer.write(failure, fsync=True)
        kept = None
        if where is not None and self.worth_a_hunt():
            window = failure.failure_window
            dumped = where.global_step if pruner is not None and pruner.holds_files_since(where.start_us) else None
            kept = self.state.write_at_failure(window[0] if window else where.global_step, dumped)
        if kept:
            failure.kept_state = kept
        # the training's own checkpoint files written up to now, judged by the checks (read back at the call's end)
        checkpoints = self.state.user_checkpoints.at_failure(run, failure, where) if run.request is None else None
        failure.checkpoints = checkpoints
        if checkpoints is not None or (self.run_id is not None and (self.sources or kept is not None)):
            failure.sources = self.sources
            failure.data_sources = self.data_sources
            self.writer.write(failure, fsync=True)
        self._keep_failure_record()

    def update_failure(self, **fields: Any) -> None:
        """Set ``fields`` of the recorded failure and write it again (every record path and the run's own copy): what
        is learned after it (:mod:`mindguard.training.state.user_checkpoints`, at the failing call's end)."""
        if self.failure is None:
            return
        for name, value in fields.items():
            setattr(self.failure, name, value)
        self.writer.write(self.failure, fsync=True)
        self._keep_failure_record()

    def worth_a_hunt(self) -> bool:
        """The run's failure is one ``mindguard hunt --from`` examines, so its line is printed and its record and
        states are kept: every failure of the training or the script (issue 39: a watch loop whose own data code
        raised, an exception after the last step), not an interrupt, not mindguard's own error, not a callback's own
        error (``raised_by``, issue 50)."""
        failure = self.failure
        return failure is not None and failure.phase != "mindguard" and failure.kind != "interrupted" \
            and failure.raised_by is None

    def _keep_failure_record(self) -> None:
        """Outside the hunt, at a failure worth a hunt: the record is written under the run's id too, so a later
        run in the folder (which replaces the usual record) never loses it; the printed line names that file."""
        own, failure = self.own_path(), self.failure
        if own is None or failure is None or not self.worth_a_hunt() or own in self.writer.paths:
            return
        try:
            failure.save(own, fsync=True)
        except (OSError, ValueError) as exc:
            self.cannot_write("the failure record", own, exc,
                              alternative="give Guard(record=...) a path on another disk")

    def hunt_record(self) -> Path:
        """The record the hunt line names: the run's own copy when it was written, else the first record."""
        own = self.own_path()
        return own if own is not None and os.path.exists(own) else self.writer.paths[0]

    def hunt_from_line(self) -> str:
        """What Guard prints at a failure (:func:`mindguard.training.record.hunt_line.hunt_from_line`); "" before
        one."""
        return hunt_from_line(self.failure, self.hunt_record()) if self.failure is not None else ""

    def fail_raised(self, decision: ExceptionDecision, exc: BaseException, info: Optional[StepInfo],
                    fields: Dict[str, Any]) -> FailureRecord:
        """Record the exception ``exc`` that ended a training call, as
        :func:`mindguard.training.record.classify.classify_exception` decided (``decision``, one to record), at
        ``info`` with ``fields`` (the dump iterations it may have run as); a callback's own error is said."""
        if decision.raised_by is not None:
            fields["raised_by"] = decision.raised_by
        before, failure = self.failure, self.fail(decision.kind or "exception", message=decision.message, info=info,
                                                  phase=decision.phase, **fields)
        if before is None and failure.raised_by is not None:
            self.say_callback_error(exc)
        return failure

    def say_callback_error(self, exc: Optional[BaseException] = None) -> None:
        """Print :func:`~mindguard.training.record.hunt_line.callback_note` (outside the hunt: under it, the hunt
        reports the script's error itself)."""
        if self.run.request is None and self.failure is not None and self.failure.raised_by:
            self.callback_told = True
            print(callback_note(self.failure, exc), file=sys.stderr, flush=True)


def constant_fields() -> Dict[str, Any]:
    """The record fields that stay the same over the run (rank, versions, seed, mode)."""
    import mindspore as ms   # here, not at import time: `mindguard hunt` imports the run

    rank, group_size = rank_info()
    try:
        cwd: Optional[str] = os.getcwd()
    except OSError:   # the working folder was deleted under the process
        cwd = None
    return {"rank": rank, "group_size": group_size, "device_target": ms.get_context("device_target"),
            "mindspore_version": ms.__version__, "mindguard_version": __version__, "seed": current_seed(),
            "mode": "graph" if ms.get_context("mode") == ms.GRAPH_MODE else "pynative",
            "examine": "dump" if ms.get_context("mode") == ms.GRAPH_MODE else "replay",
            "argv": list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv]), "cwd": cwd}


def _divergence_fields(state: "RunState", where: Optional[StepInfo]) -> Dict[str, Any]:
    """The record's ``loss_history``, ``learning_rate`` and ``divergence`` at a failure at ``where`` (issue 52:
    :mod:`mindguard.training.record.rate_notes`); empty when they cannot be read -- never keeps the failure
    unrecorded."""
    try:
        params = where.call.state_params() if where is not None else []
        return state.notes.fields(where.global_step if where is not None else None, params)
    except Exception:  # noqa: BLE001 - mindguard's own error here must not lose the failure
        return {}


def _say_not_all_written(failure: Optional[FailureRecord], error: BaseException) -> None:
    """mindguard's own error kept part of the failure's record or state from being written: said on stderr."""
    where = failure.position() if failure is not None else "the failing step"
    print(f"mindguard: the failure at {where} is recorded, but not all of it could be written (mindguard's own "
          f"error: {type(error).__name__}: {str(error)[:300]}); Guard acts on it all the same (stops or raises, "
          f"as its action says)", file=sys.stderr, flush=True)


def _window_message(message: Optional[str], kind: str, window: Optional[List[int]]) -> Optional[str]:
    """A failure's message, with the window of steps it lies in when the Parameters were checked on a budget."""
    if not window:
        return message
    return (f"{message or kind} [the Parameters were last checked finite after global step "
            f"{window[0] - 1}, so the step that made them non-finite is one of global steps "
            f"{window[0]}-{window[1]}: `mindguard hunt --from` finds which]")
