"""The training run of this process: one step count, one first failure, one record, one hunt request.

A MindSpore script may train several times in one process -- ``for epoch: model.train(1, ...)``, a
head phase then a tail phase on two train cells, ``model.fit`` with validation, a functional
``value_and_grad`` loop -- with one :class:`mindguard.Guard` shared by every call, a new one per call, or
several. Every piece of mindguard that counts or keeps steps does it through the one :class:`Run` of the
process (:func:`current_run`), so that:

* ``global_step`` is **1-based over the whole process**: every ``Model.train``/``fit`` call, every train
  network and every ``mindguard.watch`` step (MindSpore's ``cur_step_num`` restarts in every call);
* the **first failure is kept**: a later call, or another callback, never replaces it;
* the **record** (the JSON file ``mindguard hunt`` and ``mindguard record`` read) is written by the run
  alone, to every path a Guard/FailureLocator asked for (the hunt's path overrides them), through its record
  writer (``Run.records``, ``mindguard/training/recorder.py``); what an exception that ended a training call
  means is decided by ``mindguard/training/classify.py`` (a pure function) and recorded by the run;
* the **hunt's request** (``MINDGUARD_*`` variables set by ``mindguard hunt``) is parsed once, by the run
  (:class:`~mindguard.protocol.request.HuntRequest`, the only reader of those variables). Under the hunt, once a failure is recorded -- or the step to
  examine is done -- every later training call stops the process before its first step, and says so.

Dump iterations are *observed*, not computed, under ``mindguard hunt``: the hunt arms a dump that writes
no tensors (``dump_mode`` 1 with a kernel list that matches nothing) but makes MindSpore record, per kernel
graph, the iteration id of every step it runs (``execution_order/ms_global_execution_order_graph_<g>.csv``,
one line per run). :class:`IterationObserver` reads what each step added. Without it, the iteration is
estimated from the step count (right for one training graph; ``iteration_observed`` is False).

This module never imports MindSpore at import time (``mindguard hunt`` uses :class:`HuntRequest`).
"""
from __future__ import annotations

import atexit
import os
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import dataset_skip as _dataset_skip, provenance as _provenance, resume as _resume, verify_run as _verify_run
from .._util.dist import per_rank_path, rank_info
from .classify import ExceptionDecision, RunFacts, classify_exception
from .classify import mindguards_own as _mindguards_own  # noqa: F401 - the name tests and docs use
from .hunt_stop import CANNOT_CONTINUE, HuntCannotContinue, HuntStop  # noqa: F401 - mindguard.training.run's API
from .._util.io import atomic_write_json, io_fix, os_reason
from .recorder import RecordWriter, now_text
from .recorder import check_replaceable as _check_replaceable  # noqa: F401 - the name tests use
from .seed import current_seed
from .._version import __version__
from .budget import CHECK_FRACTION, CheckBudget
from ..errors import HuntProtocolError, MindguardWarning
from ..protocol import folder as layout
from ..protocol.request import ENV_PASS, HuntRequest, record_override  # noqa: F401 - HuntRequest: mindguard.training.run's API
from ..protocol.record import FailureRecord


# -- observed dump iterations ----------------------------------------------------------------------------
#: the failure kinds whose cause can precede the step they were seen at (a Parameter check's window)
_NONFINITE_KINDS = ("nonfinite_params", "nonfinite_loss", "nonfinite_grads", "loss_scale_collapse")


class IterationObserver:
    """Which kernel graph and dump iteration each step ran as, read from MindSpore's own record.

    ``root`` is a dump root whose config writes no tensors; MindSpore still appends one line (the
    iteration id) to ``<root>/rank_<r>/execution_order/ms_global_execution_order_graph_<g>.csv`` for every
    run of graph ``g``, by the end of the step (measured on 2.10 CPU: docs/mindspore-facts.md).
    :meth:`mark` notes the files' sizes; :meth:`since_mark` returns ``{graph: [iterations run since]}``.
    Cost: one ``listdir`` and a ``stat`` per graph at each call.
    """

    def __init__(self, root: Path, rank: int):
        self.directory = Path(root) / f"rank_{rank}" / "execution_order"
        self._sizes: Dict[int, int] = {}

    def _files(self) -> Dict[int, Path]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return {}
        prefix, suffix = "ms_global_execution_order_graph_", ".csv"
        found = {}
        for name in names:
            if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix):-len(suffix)].isdigit():
                found[int(name[len(prefix):-len(suffix)])] = self.directory / name
        return found

    def mark(self) -> None:
        sizes = {}
        for graph, path in self._files().items():
            try:
                sizes[graph] = os.stat(path).st_size
            except OSError:
                continue
        self._sizes = sizes

    def since_mark(self) -> Dict[int, List[int]]:
        runs: Dict[int, List[int]] = {}
        for graph, path in self._files().items():
            start = self._sizes.get(graph, 0)
            try:
                if os.stat(path).st_size <= start:
                    continue
                with open(path, "rb") as f:
                    f.seek(start)
                    text = f.read().decode("ascii", "replace")
            except OSError:
                continue
            iterations = [int(word) for word in text.split() if word.isdigit()]
            if iterations:
                runs[graph] = iterations
        return runs


# -- the run ---------------------------------------------------------------------------------------------
FAST_FORWARD_MIN_STEPS = 32   # a dataset reset costs about what iterating this many batches of a small pipeline does


@dataclass
class TrainingCall:
    """One training call of the process: a ``Model.train``/``fit`` call, or a ``mindguard.watch`` loop.

    ``index`` is 1-based over the process; ``network`` the train network's class name; ``kind`` ``"train"``
    or ``"watch"``; ``first_step`` the global step of its first step (None before it). ``key`` identifies
    the call (MindSpore's callback-parameter object of that call, or the watch wrapper).
    """

    index: int
    network: str
    kind: str
    key: Any = field(repr=False, default=None)
    network_id: int = 0
    first_step: Optional[int] = None
    last_cur_step: int = 0
    steps: int = 0
    examine: Optional[str] = None
    sink: Optional[bool] = None   # Model.train's dataset_sink_mode (None: a watch loop)
    train_graph: Optional[int] = None          # the kernel graph its steps run in, as first observed
    last_observed: Optional[Tuple[int, int]] = None   # (global step, dump iteration) last observed in it
    state_cells: Tuple[Any, ...] = field(repr=False, default=())   # whose Parameters are the training's state
    fast_forwarded: Optional[int] = None   # a resumed pass reset its dataset past this many steps (0: tried, no)
    data_steps: Optional[int] = None       # batches its dataset holds (epochs x steps per epoch), once fast-forwarded
    _state_params: Optional[List[Any]] = field(repr=False, default=None)
    _small_params: Optional[List[Any]] = field(repr=False, default=None)


    def describe(self) -> Dict[str, Any]:
        return {"index": self.index, "network": self.network, "kind": self.kind}

    def state_params(self) -> List[Any]:
        """The training's state: every Parameter of :attr:`state_cells` (found once per call)."""
        if self._state_params is None:
            self._state_params = _resume.state_parameters(*self.state_cells)
        return self._state_params

    def small_params(self) -> List[Any]:
        """Those of :meth:`state_params` small enough to trace at every step (:func:`mindguard.training.resume.small_parameters`)."""
        if self._small_params is None:
            self._small_params = _resume.small_parameters(self.state_params())
        return self._small_params


@dataclass
class StepInfo:
    """Where the current (or last) step is. ``global_step`` 1-based over the process; ``epoch`` and
    ``step_in_epoch`` 1-based as MindSpore printed them in its call; ``dump_iteration`` 0-based;
    ``start_us``/``end_us`` wall-clock microseconds (the clock of the dump's file names)."""

    global_step: int
    call: TrainingCall
    epoch: Optional[int] = None
    step_in_epoch: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    iteration_range: Optional[List[int]] = None
    dump_iteration: Optional[int] = None
    graph: Optional[int] = None
    dump_graphs: Dict[int, int] = field(default_factory=dict)
    iteration_observed: bool = False
    start_us: int = 0
    end_us: Optional[int] = None
    skipped: bool = False   # a resumed pass skipped this step's training call (mindguard.training.resume)
    scalars: List[str] = field(default_factory=list, repr=False)   # the small Parameters before the step (hunt)

    def fields(self) -> Dict[str, Any]:
        """The record fields of this position."""
        examine = {"examine": self.call.examine} if self.call.examine else {}
        if self.call.sink is not None:
            examine["dataset_sink_mode"] = self.call.sink
        step = self.step_fields()
        return {**examine, "global_step": step.pop("global_step"), "call": self.call.describe(), **step}

    def step_fields(self) -> Dict[str, Any]:
        """The record fields that change from step to step (those of :meth:`fields` but the call's)."""
        return {"global_step": self.global_step, "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch, "steps_per_epoch": self.steps_per_epoch,
                "iteration_range": self.iteration_range, "dump_iteration": self.dump_iteration,
                "graph": self.graph, "dump_graphs": {str(g): it for g, it in self.dump_graphs.items()} or None,
                "iteration_observed": self.iteration_observed,
                "step_window_us": [self.start_us, self.end_us if self.end_us is not None else _now_us()]}


def cannot_write(what: str, path: "os.PathLike[str] | str", exc: BaseException, *, alternative: str) -> None:
    """mindguard could not write ``what`` at ``path``: never the training's end. On its own, a warning that names
    the path and the fix (once per path), and training goes on; under the hunt, the pass cannot do its work: it
    says so (:data:`CANNOT_CONTINUE`) and ends the process (:class:`HuntCannotContinue`, exit 2)."""
    reason = f"cannot write {what} {str(path)!r} ({os_reason(exc)})"
    if _RUN is not None and _RUN.request is not None:
        message = CANNOT_CONTINUE + f"{reason}; {io_fix(exc, 'give --run-dir a folder on another disk')}"
        print(message, file=sys.stderr, flush=True)
        raise HuntCannotContinue(message)
    key = (str(path), getattr(exc, "errno", None))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"mindguard: {reason}; the training goes on without it. Fix: {io_fix(exc, alternative)}",
                  MindguardWarning, stacklevel=2)


_WARNED: set = set()   # (path, errno) already warned about


def _initial_environ(name: str) -> Optional[str]:
    """``name`` as the process was started with it (``/proc/self/environ``: what ``os.environ`` changes leave)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", "surrogateescape")
    return None


def _check_dump_config(request: Optional[HuntRequest]) -> None:
    """Under the hunt, before the first training call compiles: a script that set its own
    ``MINDSPORE_DUMP_CONFIG`` (or removed it) replaced the dump the hunt armed -- MindSpore reads the variable at
    the first compile -- so the pass could observe or dump nothing: say so, naming it, and end the pass."""
    if request is None:
        return
    armed = _initial_environ("MINDSPORE_DUMP_CONFIG")
    current = os.environ.get("MINDSPORE_DUMP_CONFIG")
    if not armed or current == armed:
        return
    what = "observe which dump iteration each step runs as" if request.pass_name == "record" else "dump the step"
    done = f"sets MINDSPORE_DUMP_CONFIG={current}" if current else "removes MINDSPORE_DUMP_CONFIG"
    message = (CANNOT_CONTINUE + f"the script {done} itself, replacing the dump config the hunt armed ({armed}), so "
               f"MindSpore would not {what} for the hunt. Set it only outside the hunt, e.g. `if not "
               f"os.environ.get('{ENV_PASS}'): os.environ['MINDSPORE_DUMP_CONFIG'] = ...`")
    print(message, file=sys.stderr, flush=True)
    raise HuntCannotContinue(message)


class Run:
    """The training run of this process (use :func:`current_run`). Attribute meanings: module docstring."""

    def __init__(self, request: Optional[HuntRequest] = None):
        self.request = request
        self.calls: List[TrainingCall] = []
        self.global_step = 0
        self.step: Optional[StepInfo] = None
        self.failure: Optional[FailureRecord] = None
        self.examined = False           # the hunt's examine step has run (set by the examiner)
        self._network_steps: Dict[int, int] = {}
        self._networks_seen: List[int] = []
        self._base: Optional[Dict[str, Any]] = None
        # outside the hunt: the run's id, which names its kept states and its kept failure record
        self.run_id: Optional[str] = _provenance.new_run_id() if request is None else None
        self._sources: Optional[Dict[str, str]] = None   # {path: sha256} of the project's files at the first call
        self._data_sources: Optional[Dict[str, Dict[str, Any]]] = None   # {path: fingerprint} of the pipeline's data
        self._run_lock: Optional[int] = None            # the lock held on the run's state folder
        self.records = RecordWriter(under_hunt=request is not None, cannot_write=cannot_write, run_id=self.run_id)
        self._depth = 0                 # nesting of training calls (fit's validation, eval from a callback)
        self._finished_at: Optional[int] = None   # the global step the last "finished" record was written at
        self.observer: Optional[IterationObserver] = None
        # what the observer saw of each kernel graph: graph -> (its last listed iteration, the global step that
        # listed it, self._blind_steps then); steps that listed no graph (a graph whose record stopped listing it)
        self._listed: Dict[int, Tuple[int, int, int]] = {}
        self._blind_steps = 0
        self.params_checked: Optional[int] = None   # Parameters a step's check covers (0: the loss only)
        self.checks_lost: List[Dict[str, Any]] = []   # checks mindguard's own errors disabled (lose_check)
        self.unrestorable: List[str] = []   # random sources no kept state can hold (_rng.unrestorable_sources)
        self.end_checks: Dict[int, Callable[[], None]] = {}   # id(watched step) -> its check after the last step
        self.keeper = None    # mindguard.training.resume.StateKeeper: the hunt pass's, or an always-on Guard's (on disk)
        self.resumer = None   # mindguard.training.resume.Resumer of a resumed pass
        self.verify: Optional[_verify_run.VerifyPass] = None   # `mindguard verify`'s pass
        self.budget = None    # mindguard.training.budget.CheckBudget of an always-on Guard (None: check every step)
        self.params_finite_after: Optional[int] = None   # the last global step whose Parameter check passed
        self._checked_step: Optional[int] = None         # the global step whose Parameters were checked last
        self._period_step: Optional[int] = None          # the step the budget's period was closed at
        self._told_hunt = False
        if request is not None:
            self.add_record_path(request.record)
            if request.keep_dir is not None and rank_info()[1] == 1:   # distributed hunts run from step 1
                self.keeper = _resume.StateKeeper(request.keep_dir, every_steps=request.keep_every,
                                          steps=range(request.keep_steps[0], request.keep_steps[1] + 1)
                                          if request.keep_steps else ())
            if request.resume_dir is not None:
                self.resumer = _resume.Resumer(request.resume_dir, fast_forward=request.fast_forward)
            if request.verify_steps is not None:   # `mindguard verify`'s pass (mindguard.training.verify_run)
                self.verify = _verify_run.VerifyPass(request.record, *request.verify_steps)
            if request.pass_name == "record" and request.observe_path is not None:
                self.observer = IterationObserver(request.observe_path, rank_info()[0])
            if request.examine == "dataset":
                _dataset_debug_mode()

    # -- record files ----------------------------------------------------------------------------------
    def add_record_path(self, path: "os.PathLike[str] | str") -> Path:
        """Ask for the record at ``path`` too (per rank when distributed); the hunt's path, or else
        ``MINDGUARD_RECORD`` from the environment, replaces every other. Returns the path actually written."""
        if self.request is not None:
            target = per_rank_path(Path(self.request.record).absolute(), *rank_info())
        elif record_override() is not None:  # set by the user (e.g. for every rank of an msrun job): overrides record=
            target = per_rank_path(record_override().absolute(), *rank_info())
        else:
            target = per_rank_path(Path(path).expanduser().absolute(), *rank_info())
        if rank_info()[1] > 1:   # per-rank records (<name>.rankN.json): no run-named copies beside them
            self.records.run_id = None
        added = self.records.add(target)
        if added is not None and (self.step is not None or self.failure is not None):
            self.records.write(self._current_record())
        return self.records.actual(target)

    @property
    def record_paths(self) -> List[Path]:
        return list(self.records.paths)

    # -- an always-on Guard: Parameters on a budget, the state kept on disk -------------------------------
    def watch_on_budget(self, keep_state: bool = True, fraction: Optional[float] = None) -> None:
        """Outside ``mindguard hunt``: check the Parameters on a time budget (:mod:`mindguard.training.budget`) instead of
        every step, and -- ``keep_state`` -- keep the training state on disk beside the first record
        (``<record>.state/``) for ``mindguard hunt --from``. Under the hunt every step is checked (its passes
        need the exact step) and the hunt decides what is kept. Several ranks keep nothing (their hunt runs from
        step 1). Idempotent."""
        if self.request is not None:
            return
        if self.budget is None:
            self.budget = CheckBudget(CHECK_FRACTION if fraction is None else fraction)
        if keep_state and self.keeper is None and self.records.paths and rank_info()[1] == 1:
            asked = next(iter(self.records.asked()))
            folder = layout.run_states(asked, self.run_id or _provenance.new_run_id())
            self._run_lock = _resume.claim_run_states(folder)   # and an earlier dead run's leftovers cleaned
            self.keeper = _resume.StateKeeper(folder, on_disk=True, min_seconds=1.0)
            self.keeper.run_id = self.run_id
            self.keeper.on_unrestorable = self._note_unrestorable

    def pause_timing(self) -> None:
        """An epoch or a training call ended: until the next step, time is neither a step's period for the check
        budget nor training time for the state keeper (an evaluation, a checkpoint, another model's training)."""
        if self.budget is not None:
            self.budget.pause()
        if self.keeper is not None:
            self.keeper.pause()

    def param_check_due(self, info: "StepInfo") -> bool:
        """Whether the Parameters are checked at the end of step ``info`` (always, but for an always-on Guard's
        budget; and when the state keeper wants a checked step to keep the next one from). Called once a step,
        at its end, before the check."""
        budget = self.budget
        if budget is None:
            return True
        if self._period_step != info.global_step:
            budget.end_period()
            self._period_step = info.global_step
        keeper = self.keeper
        wants_keep = keeper is not None and keeper.on_disk and keeper.due(info.global_step + 1)
        return wants_keep or budget.due(info.global_step)

    def note_params_checked(self, info: "StepInfo", finite: bool, seconds: float, setup: float = 0.0) -> None:
        """The Parameters were checked after step ``info`` (``finite`` or not), in ``seconds``, of which ``setup``
        compiled the check (charged to the budget as a one-time cost)."""
        if self.budget is not None and self._checked_step != info.global_step:
            self.budget.charge(info.global_step, seconds, setup)
        self._checked_step = info.global_step
        if finite and (self.params_finite_after is None or info.global_step > self.params_finite_after):
            self.params_finite_after = info.global_step

    def lose_check(self, check: str, error: BaseException, step: Optional[int], *, still: str) -> None:
        """mindguard's own error disabled ``check`` (e.g. ``"Parameter"``) from 1-based global step ``step`` on: one
        warning naming it, why, and what still runs (``still``); the record lists it under ``checks_lost``. The
        training goes on."""
        if any(lost["check"] == check for lost in self.checks_lost):
            return
        import warnings

        from ..errors import MindguardWarning

        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300] if str(error).strip() else ''}"
        self.checks_lost.append({"check": check, "from_step": step, "reason": reason})
        self._note_base()
        where = f"from global step {step} on" if step is not None else "from now on"
        warnings.warn(f"mindguard disabled its {check} check {where}: mindguard's own error ({reason}), not your "
                      f"training's. The training goes on; {still} still runs, and the record lists the lost check "
                      f"under checks_lost. Please report it with this message.", MindguardWarning, stacklevel=2)
        if self.failure is not None:
            self.failure.checks_lost = list(self.checks_lost)
            self.records.write(self.failure)
            self._keep_failure_record()

    def note_params_count(self, count: int) -> None:
        """A step's Parameter check covers ``count`` Parameters (0: the loss only): said in every record."""
        self.params_checked = count
        self._note_base()

    def _note_unrestorable(self, sources: List[str]) -> None:
        """The keeper found random sources no kept state can hold: the record says so from now on, before any
        failure (``unrestorable_random``)."""
        self.unrestorable = sorted(set(self.unrestorable) | set(sources))
        self._note_base()

    def _note_base(self) -> None:
        """Put what the run learned of its checks into the record fields constant from now on (a new dict: the
        per-step record's template is cut again from it)."""
        if self._base is None:
            return
        extra: Dict[str, Any] = {}
        if self.params_checked is not None:
            extra["params_checked"] = self.params_checked
        if self.checks_lost:
            extra["checks_lost"] = [dict(lost) for lost in self.checks_lost]
        if self.unrestorable:
            extra["unrestorable_random"] = list(self.unrestorable)
        if any(self._base.get(key) != value for key, value in extra.items()):
            self._base = {**self._base, **extra}

    def params_checked_at(self, info: Optional["StepInfo"]) -> bool:
        """True when the Parameters were checked after step ``info``."""
        return info is not None and self._checked_step == info.global_step

    def _window_fields(self, info: Optional["StepInfo"], kind: str) -> Dict[str, Any]:
        """What an always-on Guard knows of a failure at ``info``: where the Parameters were last seen finite, the
        window of steps the failing one lies in (when wider than one), the state kept before it."""
        if self.budget is None or info is None:
            return {}
        out: Dict[str, Any] = {"params_finite_after": self.params_finite_after,
                               "param_checks": self.budget.describe()}
        step = info.global_step
        # non-finite Parameters are seen only at a check: the step that made them so is any since the last passing
        # check (a finite check at the failing step itself makes the step exact: Inf/NaN stays)
        nonfinite = kind in _NONFINITE_KINDS
        first = (self.params_finite_after or 0) + 1
        if nonfinite and first < step and self.params_finite_after != step:
            out["failure_window"] = [first, step]
        return out

    def _narrowed_by_checkpoint(self, info: Optional["StepInfo"], kind: str) -> bool:
        """At a non-finite failure at ``info``: when the training's own checkpoint saved after the last passing check
        holds finite values, the Parameters were finite later than that check (the window narrows). Reads whole
        checkpoint files, so it runs after the record is on disk. True when it narrowed."""
        if kind not in _NONFINITE_KINDS or info is None or self.budget is None or self.keeper is None \
                or not self.keeper.on_disk:
            return False
        later = self.keeper.finite_checkpoint_after(self.params_finite_after or 0, info.global_step)
        if later is None:
            return False
        self.params_finite_after = later - 1
        return True

    def _say_hunt_from(self) -> None:
        """Outside the hunt, at the first failure worth examining: the one command that examines it."""
        if self._told_hunt or self.request is not None or not self._worth_a_hunt() or not self.records.paths \
                or rank_info()[0] != 0:
            return
        self._told_hunt = True
        print(self.hunt_from_line(), file=sys.stderr, flush=True)

    def hunt_from_line(self) -> str:
        """What Guard prints at a failure: where, and the command that examines it from the kept state."""
        import shlex
        import shutil as _shutil

        failure = self.failure
        front = "mindguard" if _shutil.which("mindguard") else f"{shlex.quote(sys.executable)} -m mindguard"
        command = shlex.join(failure.argv or [sys.executable, *sys.argv])
        own = self._own_record()
        record = own if own is not None and own.exists() else self.records.paths[0]
        return (f"mindguard: training failed at {failure.position()} ({failure.kind}). To find the operator and the "
                f"line that made it, run:\n    {front} hunt --from {shlex.quote(str(record))} -- "
                f"{command}")

    # -- training calls --------------------------------------------------------------------------------
    def begin_call(self, key: Any, network: Any, kind: str = "train", examine: Optional[str] = None,
                   state_cells: Optional[Sequence[Any]] = None, sink: Optional[bool] = None) -> TrainingCall:
        """The call ``key`` belongs to: the current one when another callback already began it, else a new
        one. Under the hunt, a new call after the hunt has what it needs ends the process (:class:`HuntStop`).
        ``state_cells``: the cells whose Parameters are the training's state (default: ``network``); a resumed
        pass skips ``network``'s calls until the kept state's step (``kind="train"``). ``sink``: the call's
        ``dataset_sink_mode`` (recorded)."""
        current = self.calls[-1] if self.calls else None
        if current is not None and current.key is key:
            return current
        name = type(network).__name__ if network is not None else "unknown"
        call = TrainingCall(index=len(self.calls) + 1, network=name, kind=kind, key=key, network_id=id(network),
                            examine=examine, sink=sink,
                            state_cells=tuple(state_cells) if state_cells is not None else (network,))
        if self.request is not None and (self.failure is not None or self.examined):
            why = (f"the failure at {self.failure.position()} is recorded" if self.failure is not None
                   else f"global step {self.request.examine_step} is examined")
            message = (f"mindguard hunt: training call {call.index} ({name}) stopped before its first step: {why}; "
                       f"the rest of the script is not run")
            print(message, file=sys.stderr, flush=True)
            raise HuntStop(message)
        if self.failure is not None:
            print(f"mindguard: training call {call.index} ({name}) starts after the failure at "
                  f"{self.failure.position()}; the record keeps that first failure and this call's steps are not "
                  f"checked", file=sys.stderr, flush=True)
        self.calls.append(call)
        if self.resumer is not None and not self.resumer.loaded and kind == "train" \
                and self.global_step + 1 < self.resumer.step:
            self.resumer.skip_calls(network)
        if self._base is None:
            _check_dump_config(self.request)
            self._base = _constant_fields()
            if self.run_id is not None:
                self._note_identity()
            self._note_base()
        if id(network) not in self._networks_seen:
            self._networks_seen.append(id(network))
        if self.failure is None:
            self.records.write(self._record("running"))
        return call

    def _note_identity(self) -> None:
        """Outside the hunt, at the first training call: the run's id (and its state folder) in the record, and the
        hashes of the project's files (:mod:`mindguard.training.provenance`) in ``run.json`` in its state folder (the failure
        record carries them too). Never ends the training: a file that cannot be written is left out."""
        base = self._base if self._base is not None else {}
        base["run_id"] = self.run_id
        if self.keeper is not None and self.keeper.on_disk:
            base["states"] = str(self.keeper.directory)
        try:
            self._sources = _provenance.source_hashes(base.get("cwd") or os.getcwd())
        except Exception:  # noqa: BLE001 - any module mindguard cannot hash: the record goes without the hashes
            self._sources = None
        try:
            self._data_sources = _provenance.data_fingerprints(
                _dataset_skip.live_dataset_paths(), base.get("cwd") or os.getcwd()) or None
        except Exception:  # noqa: BLE001 - a pipeline mindguard cannot read: the record goes without its data
            self._data_sources = None
        if self.keeper is not None and self.keeper.on_disk:
            try:
                atomic_write_json(layout.run_info(self.keeper.directory), {
                    "run_id": self.run_id, "cwd": base.get("cwd"), "argv": base.get("argv"),
                    "started": now_text(), "sources": self._sources or {}, "data": self._data_sources or {}})
            except (OSError, ValueError):
                pass

    def begin_step(self, call: TrainingCall, cur_step_num: int, *, batch_num: Optional[int] = None,
                   epoch: Optional[int] = None) -> StepInfo:
        """Count the step that MindSpore numbers ``cur_step_num`` (1-based, restarting per call) in ``call``.

        Idempotent: a second callback beginning the same step gets the same :class:`StepInfo`. In dataset
        sink mode one hook call covers ``cur_step_num - previous`` steps (``iteration_range`` then spans them).
        """
        cur_step_num = int(cur_step_num)
        if self.step is not None and self.step.call is call and call.last_cur_step == cur_step_num:
            return self.step
        window = max(cur_step_num - call.last_cur_step, 1)
        if self.verify is not None and self.failure is None:
            self.verify.stop_before(self.global_step + 1)   # the steps to verify are done: HuntStop
        if call.first_step is None:
            call.first_step = self.global_step + 1
        steps_on_network = self._count_steps(call, cur_step_num, window)
        batch = max(int(batch_num or 1), 1)
        info = StepInfo(global_step=self.global_step, call=call, epoch=int(epoch) if epoch is not None else None,
                        step_in_epoch=(cur_step_num - 1) % batch + 1 if batch_num else None,
                        steps_per_epoch=int(batch_num) if batch_num else None, start_us=_now_us())
        if window > 1:
            info.iteration_range = [steps_on_network - window, steps_on_network - 1]
        if len(self._networks_seen) == 1 and self.resumer is None:  # one train network: steps 0, 1, 2, ...
            info.dump_iteration = steps_on_network - 1
        self.step = info
        if self.resumer is not None and not self.resumer.loaded:
            self._resume(info)
        if self.keeper is not None and self.keeper.on_disk and call.first_step == info.global_step:
            _resume.note_initial(self.keeper, call.state_params())   # once per call: edits a resume overrides
        if (self.keeper is not None or self.resumer is not None) and not info.skipped and self.budget is None:
            info.scalars = _resume.small_state(call.small_params())   # (an always-on Guard traces the loss only)
        if self.keeper is not None and self.keeper.on_disk and self.failure is None and not info.skipped:
            self.keeper.note_checkpoints(info.global_step, call.key, call.first_step or 1, call.state_cells,
                                         call.state_params())   # the training's own checkpoints: resume points
        if self.keeper is not None and self.failure is None and not info.skipped and not info.iteration_range \
                and self.keeper.due(info.global_step) \
                and (not self.keeper.on_disk or self.params_finite_after == info.global_step - 1):
            # (sink mode: one hook for several steps, not resumable; on disk: only a state just checked finite)
            self.keeper.keep(info.global_step, call.state_params(), call.index, call.state_cells)
            if self.budget is not None:
                self.budget.discard_period()
        if self.observer is not None:
            self.observer.mark()
        if self.failure is None and not self.records.write_progress(info, self._base):
            self.records.write(self._record("running"))  # first write, or a slot is gone: the full path
        return info

    def _resume(self, info: StepInfo) -> None:
        """A resumed pass: ``info``'s training call is skipped before the kept state's step; at that step the
        state is assigned (before the step runs)."""
        resumer = self.resumer
        if resumer.skips(info.global_step):
            info.skipped = True
            _resume.hold_checkpoints(info.call.key, info.call.last_cur_step)
            return
        if info.global_step > resumer.step or info.iteration_range:
            raise HuntProtocolError(f"the kept training state is for global step {resumer.step}, but this run "
                                    f"reached step {info.global_step} without stopping there (dataset sink mode "
                                    f"runs several steps per callback); run the hunt without resuming")
        skipped_for = time.monotonic() - resumer.started
        if self.verify is not None:   # the script as edited: by name, the edit's learning rate wins
            self.verify.load(resumer, info.call.state_params())
        else:
            self._load_kept_state(resumer, info)
        how = (f"the dataset was reset past {resumer.fast_forwarded} of them, the callbacks ran for the others"
               if resumer.fast_forwarded else "the data pipeline and the callbacks ran")
        skipped = (f"steps 1-{resumer.step - 1} skipped ({skipped_for:.2f}s: {how}, the training did not); "
                   if resumer.step > 1 else "")
        print(f"mindguard hunt: {skipped}training state of global step {resumer.step} loaded", file=sys.stderr,
              flush=True)

    def _load_kept_state(self, resumer: "_resume.Resumer", info: StepInfo) -> None:
        """Assign the kept state in a resumed hunt pass, after noting the script edits it overrides; a state that
        does not fit this run is said in ``diverged`` and stops the pass (the hunt then runs from step 1)."""
        edits = _resume.overridden_edits(resumer.meta, info.call.state_params())
        if edits:
            atomic_write_json(layout.overridden_beside(self.request.record), {"step": resumer.step, "edits": edits})
        try:
            resumer.load(info.call.state_params())
        except HuntProtocolError as exc:   # the kept state does not fit this run: said, and the hunt runs from step 1
            atomic_write_json(layout.diverged_beside(self.request.record),
                              {"step": info.global_step, "why": str(exc), "unfit": True, "fast_forwarded": None})
            message = f"mindguard hunt: {exc}; stopping"
            print(message, file=sys.stderr, flush=True)
            raise HuntStop(message) from None

    def _count_steps(self, call: TrainingCall, cur_step_num: int, steps: int) -> int:
        """Count ``steps`` more steps of ``call``, the last numbered ``cur_step_num`` by MindSpore, in the process,
        the call and its network; returns the network's count."""
        call.last_cur_step = cur_step_num
        self.global_step += steps
        call.steps += steps
        self._network_steps[call.network_id] = self._network_steps.get(call.network_id, 0) + steps
        return self._network_steps[call.network_id]

    def fast_forward(self, call: TrainingCall, cb_params: Any, info: StepInfo) -> None:
        """A resumed pass at a skipped step ``info`` of a ``Model.train`` call: reset the call's dataset so that
        its next batch is the kept step's (:mod:`mindguard.training.dataset_skip`), and count the steps it passes over as
        run -- ``cb_params.cur_step_num`` too, so the call's callbacks see the step numbers they would have. Only
        once per call, in dataset (not sink) mode, when the kept step is in this call and at least
        :data:`FAST_FORWARD_MIN_STEPS` ahead; otherwise the steps are iterated as before."""
        resumer = self.resumer
        if not resumer.fast_forward or call.fast_forwarded is not None or call.kind != "train" or call.sink:
            return
        call.fast_forwarded = 0
        jump = resumer.step - 1 - info.global_step   # the steps between this one and the kept one
        per_epoch, epochs = cb_params.get("batch_num"), cb_params.get("epoch_num")
        if jump < FAST_FORWARD_MIN_STEPS or not per_epoch or not epochs:
            return
        completed, total = call.last_cur_step + jump, int(per_epoch) * int(epochs)
        if completed >= total:
            return
        why = self.verify.reset_problem(cb_params.get("train_dataset")) if self.verify is not None else None
        why = why or _dataset_skip.fast_forward(cb_params.get("train_dataset"), completed, int(per_epoch))
        if why is not None:
            print(f"mindguard hunt: the dataset is iterated to the kept step ({why})", file=sys.stderr, flush=True)
            return
        cb_params.cur_step_num = completed
        self._count_steps(call, completed, jump)
        call.data_steps = total
        call.fast_forwarded = resumer.fast_forwarded = jump

    def note_outputs(self, info: StepInfo, outputs: Any) -> None:
        """After a step ran: its outputs' structure and the pace, for a later resumed pass."""
        if self.keeper is not None and not info.skipped:
            self.keeper.note_step_end(info.global_step, outputs)

    def trace_step(self, info: StepInfo, loss: Optional[float], param_sum: Optional[float]) -> None:
        """What step ``info`` computed, under the hunt: kept by a record pass for the steps since its kept state;
        compared by a resumed pass, which stops (:class:`HuntStop`, after writing ``diverged.json`` beside its
        record) at the first step that differs -- its answer would not be about the run that failed."""
        if self.verify is not None and not info.skipped:
            self.verify.note(info.global_step, loss)
        if info.skipped or (self.keeper is None and (self.resumer is None or not self.resumer.loaded)):
            return
        if self.budget is not None:   # an always-on Guard checks the Parameters only now and then, and not always
            param_sum = None          # by the host sum a hunt's pass computes: the trace holds the loss and scalars
        trace = [_resume.fingerprint(loss), _resume.fingerprint(param_sum), *info.scalars]
        if self.keeper is not None:
            self.keeper.note_trace(info.global_step, trace)
        if self.resumer is not None and self.resumer.loaded and self.verify is None:   # verify: the edit differs
            why = self.resumer.diverges(info.global_step, trace)
            if why is not None:
                atomic_write_json(layout.diverged_beside(self.request.record),
                                  {"step": info.global_step, "why": why,
                                   "fast_forwarded": self.resumer.fast_forwarded})
                message = (f"mindguard hunt: the run resumed from the kept training state differs from the run that "
                           f"kept it ({why}): state outside the Parameters (Python-side schedules, random state) "
                           f"changed what it computes; stopping")
                print(message, file=sys.stderr, flush=True)
                raise HuntStop(message)

    def step_begun(self) -> Optional[StepInfo]:
        """The current step, or ``None`` between steps."""
        return self.step if self.step is not None and self.step.end_us is None else None

    def end_step(self, info: StepInfo) -> None:
        """Close ``info`` (called once the step's outputs are on the host) and read its observed iteration."""
        if info.end_us is not None:
            return
        info.end_us = _now_us()
        if self.observer is not None:
            runs = self.observer.since_mark()
            self._note_listed(info, runs)
            call = info.call
            if runs and call.train_graph is None:
                # the training graph runs first in a step; a callback's graph run after it (mindcv's
                # StateMonitor reads the learning rate by a small graph) gets the next iteration
                call.train_graph = min(runs, key=lambda graph: (runs[graph][-1], graph))
            if runs and call.train_graph in runs:
                info.dump_graphs = {graph: its[-1] for graph, its in sorted(runs.items())}
                info.graph, info.dump_iteration = call.train_graph, runs[call.train_graph][-1]
                info.iteration_observed = True
                call.last_observed = (info.global_step, info.dump_iteration)
                kept = self.keeper.kept.get(info.global_step) if self.keeper is not None else None
                if kept is not None:
                    kept.dump_graphs = dict(info.dump_graphs)
            elif runs and call.last_observed is not None and not info.iteration_range:
                # measured on 2.10 CPU: once another graph runs every step, the execution-order record of the
                # training graph stops listing its runs (docs/mindspore-facts.md); its iteration goes on by one
                # a step from the last one observed
                step, iteration = call.last_observed
                info.graph, info.dump_iteration = call.train_graph, iteration + info.global_step - step
                info.dump_graphs = {call.train_graph: info.dump_iteration}

    def _note_listed(self, info: StepInfo, runs: Dict[int, List[int]]) -> None:
        """Remember the last iteration each graph was listed with (:meth:`iteration_candidates` reads it)."""
        if not runs:
            self._blind_steps += 1
        for graph, iterations in runs.items():
            self._listed[graph] = (iterations[-1], info.global_step, self._blind_steps)

    def iteration_candidates(self, info: StepInfo) -> List[int]:
        """The dump iterations step ``info`` may have run as when MindSpore listed none for it (it raised: a graph
        run is listed only once it completes). Every kernel graph counts its own runs (measured on 2.10 CPU: two train
        cells stepped alternately ran as iterations 0..16 and 1..16), and a graph's record may stop listing it once
        another graph runs (docs/mindspore-facts.md), so for each graph seen: its next iteration after the last one
        listed, that plus the steps since that listed no graph (its unlisted runs), and that plus every step since.
        The examine pass dumps them all and keeps the files written during the step (its time window)."""
        found = set()
        runs = self.observer.since_mark() if self.observer is not None else {}
        for iterations in runs.values():   # graphs of the step that did complete (a grad graph before the one that raised)
            found.update(iterations)
        for iteration, step, blind in self._listed.values():
            following = iteration + 1
            found.update((following, following + self._blind_steps - blind,
                          following + max(info.global_step - 1 - step, 0)))
        return sorted(found)

    def end_call(self, call: TrainingCall) -> None:
        """The call ended normally: the record says the run is healthy so far."""
        self.end_exit()

    def end_exit(self) -> None:
        """No step is running and none failed (a call ended, the script called ``sys.exit``, the process exits):
        the record says the run was healthy to its last step. A ``mindguard.watch`` loop has no end hook, so
        :func:`current_run` also calls this at interpreter exit; a step still in progress stays ``running``
        (the process died in it)."""
        if (self.failure is None and self.step is not None and self.step_begun() is None
                and self._finished_at != self.step.global_step):
            fields: Dict[str, Any] = {"param_checks": self.budget.describe()} if self.budget is not None else {}
            self.records.write(self._record("finished", **fields))
            self._finished_at = self.step.global_step
        self.records.close()

    # -- failures --------------------------------------------------------------------------------------
    def fail(self, kind: str, *, loss: Optional[float] = None, nonfinite: Optional[List[str]] = None,
             message: Optional[str] = None, info: Optional[StepInfo] = None, **extra: Any) -> FailureRecord:
        """Record a failure at ``info`` (default: the current step). The first failure of the process is kept:
        a later call returns it unchanged."""
        if self.failure is not None:
            return self.failure
        where = info if info is not None else self.step

        def failed() -> FailureRecord:
            fields = {**self._window_fields(where, kind), **extra}
            window = fields.get("failure_window")
            text = message
            if window:
                text = (f"{message or kind} [the Parameters were last checked finite after global step "
                        f"{window[0] - 1}, so the step that made them non-finite is one of global steps "
                        f"{window[0]}-{window[1]}: `mindguard hunt --from` finds which]")
            return self._record("failed", info=info, kind=kind, loss=loss, nonfinite=list(nonfinite or []),
                                message=text, **fields)

        self.failure = failed()
        self.records.write(self.failure, fsync=True)   # the record first: whatever happens next, it is on disk
        if self._narrowed_by_checkpoint(where, kind):
            self.failure = failed()
            self.records.write(self.failure, fsync=True)
        window = self.failure.failure_window
        written = None
        if self.keeper is not None and where is not None and self._worth_a_hunt():
            try:
                written = self.keeper.write(window[0] if window else where.global_step)
            except (OSError, ValueError) as exc:   # the hunt then re-runs from step 1
                print(f"mindguard: could not write the kept training state to {self.keeper.directory} "
                      f"({os_reason(exc)}); a later pass starts from step 1 instead", file=sys.stderr, flush=True)
        if written is not None and self.keeper.on_disk:
            try:
                meta = _resume.read_state_meta(written)
            except (OSError, ValueError):
                meta = None
            if meta is not None:
                self.failure.kept_state = {"path": str(written), "step": int(meta["step"]),
                                           "run_id": meta.get("run_id"), "sha256": meta.get("sha256")}
        if self.run_id is not None and (self._sources or written is not None):
            self.failure.sources = self._sources
            self.failure.data_sources = self._data_sources
            self.records.write(self.failure, fsync=True)
        self._keep_failure_record()
        self._say_hunt_from()
        return self.failure

    def _worth_a_hunt(self) -> bool:
        """The run's failure is one ``mindguard hunt --from`` examines, so its line is printed and its record and
        states are kept: every failure of the training or the script (issue 39: a watch loop whose own data code
        raised, an exception after the last step), not an interrupt, not mindguard's own error."""
        failure = self.failure
        return failure is not None and failure.phase != "mindguard" and failure.kind != "interrupted"

    def _own_record(self) -> Optional[Path]:
        """Where this run's failure is kept under its run id (:func:`mindguard.protocol.folder.run_record`), beside
        the first record asked for; ``None`` under the hunt or with no record."""
        if self.run_id is None or self.records.run_id is None or not self.records.paths:
            return None
        return layout.run_record(next(iter(self.records.asked())), self.run_id)

    def _keep_failure_record(self) -> None:
        """Outside the hunt, at a failure worth a hunt: the record is written under the run's id too, so a later
        run in the folder (which replaces the usual record) never loses it; the printed line names that file."""
        own = self._own_record()
        if own is None or not self._worth_a_hunt() or own in self.records.paths:
            return
        try:
            self.failure.save(own, fsync=True)
        except (OSError, ValueError) as exc:
            cannot_write("the failure record", own, exc, alternative="give Guard(record=...) a path on another disk")

    def fail_with_exception(self, exc_type: type, exc: BaseException, *,
                            training_ended: bool = False) -> Optional[FailureRecord]:
        """Record the exception that ended a training call (``KeyboardInterrupt`` as ``"interrupted"``), as
        :func:`mindguard.training.classify.classify_exception` decides. Raised between steps by the dataset pipeline,
        it is put at the next step with ``phase="between_steps"``. A :class:`HuntStop` is mindguard's own ending,
        not a failure; a ``SystemExit`` ends the run (``"finished"``). ``training_ended``: at interpreter exit, the
        training calls had ended normally before the exception."""
        decision = classify_exception(exc_type, exc, self._facts(training_ended))
        if decision.finished:
            self.end_exit()
            return None
        if not decision.record:
            return self.failure
        candidates = self._dump_candidates(decision)
        info = self._following_step() if decision.next_step else self.step
        return self.fail(decision.kind, message=decision.message, info=info, phase=decision.phase, **candidates)

    def _facts(self, training_ended: bool) -> RunFacts:
        return RunFacts(failed=self.failure is not None, step_under_way=self.step_begun() is not None,
                        any_step=self.step is not None, any_call=bool(self.calls), reads_ahead=self._reads_ahead(),
                        training_ended=training_ended)

    def _dump_candidates(self, decision: ExceptionDecision) -> Dict[str, Any]:
        """For an exception of the step under way: the dump iterations it may have run as (MindSpore lists no
        iteration for a step that raised), as record fields when the step is the failure's."""
        info = self.step_begun()
        if decision.phase == "mindguard" or info is None or info.iteration_observed or self.observer is None:
            return {}
        found = self.iteration_candidates(info)
        if not found:
            return {}
        info.dump_iteration = found[0] if len(found) == 1 else None
        return {"dump_candidates": found} if decision.phase == "step" else {}

    def _following_step(self) -> StepInfo:
        """The step after the last one begun (its batch is the one the dataset pipeline raised on): 1-based
        ``global_step`` one more, ``epoch``/``step_in_epoch`` moved on by one step."""
        last = self.step
        if last is None:  # the pipeline raised before the first step of the process
            return StepInfo(global_step=1, call=self.calls[-1], epoch=1, step_in_epoch=1, start_us=_now_us())
        batch = last.steps_per_epoch
        step_in_epoch, epoch = last.step_in_epoch, last.epoch
        if step_in_epoch is not None and batch and step_in_epoch < batch:
            step_in_epoch += 1
        elif step_in_epoch is not None:
            step_in_epoch, epoch = 1, (epoch + 1 if epoch is not None else None)
        following = StepInfo(global_step=last.global_step + 1, call=last.call, epoch=epoch,
                             step_in_epoch=step_in_epoch, steps_per_epoch=batch, start_us=last.end_us or _now_us())
        if last.dump_iteration is not None and not last.iteration_observed:
            following.dump_iteration = last.dump_iteration + 1
        return following

    def _reads_ahead(self) -> bool:
        """True unless the hunt made the dataset pipeline synchronous (its ``"dataset"`` examination)."""
        return self.request is None or self.request.examine != "dataset"

    # -- record assembly -------------------------------------------------------------------------------
    def _record(self, status: str, *, info: Optional[StepInfo] = None, **fields: Any) -> FailureRecord:
        values = dict(self._base or {})
        if self.params_checked is not None:
            values["params_checked"] = self.params_checked
        if self.checks_lost:
            values["checks_lost"] = list(self.checks_lost)
        where = info if info is not None else self.step
        if where is not None:
            values.update(where.fields())
        values.update(fields)
        return FailureRecord(status=status, time=now_text(), **values)

    def _current_record(self) -> FailureRecord:
        return self.failure if self.failure is not None else self._record("running")

    def drop_states_at_exit(self) -> None:
        """At interpreter exit: a run that leaves nothing to hunt (it finished, was interrupted, or stopped on
        mindguard's own error: :meth:`_worth_a_hunt`) removes its kept states -- they resume nothing
        (docs/reference/run-folder.md)."""
        keeper = self.keeper
        if keeper is None or not keeper.on_disk or self.run_id is None or self.step_begun() is not None:
            return
        if self.failure is None or not self._worth_a_hunt():
            _resume.drop_run_states(keeper.directory)

    def _close_slots(self) -> None:
        """Close the record files' mappings (the files stay as written)."""
        self.records.close()

    # -- nesting (model.fit's validation and model.eval enter the same callbacks again) -----------------
    def enter(self) -> int:
        self._depth += 1
        return self._depth

    def exit(self) -> int:
        self._depth = max(self._depth - 1, 0)
        return self._depth


def _constant_fields() -> Dict[str, Any]:
    """The record fields that stay the same over the run (rank, versions, seed, mode)."""
    import mindspore as ms   # here, not at import time: `mindguard hunt` imports this module

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


def _dataset_debug_mode() -> None:
    """Run MindSpore's dataset pipeline synchronously (its debug mode), so that an exception raised by the
    dataset arrives at the step whose batch raised instead of steps earlier (the pipeline reads ahead). With no
    debug hooks: MindSpore's default hook prints every map operation's input and output and makes the pipeline's
    error lose its "The corresponding data file is: ..." line (measured on 2.10); the user's output stays theirs."""
    import mindspore.dataset as ds   # here, not at import time (above)

    ds.config.set_debug_mode(True, [])


def _now_us() -> int:
    return time.time_ns() // 1000


_RUN: Optional[Run] = None


def current_run() -> Run:
    """The process's :class:`Run`, created (and the hunt's request parsed) on first use."""
    global _RUN
    if _RUN is None:
        _RUN = Run(HuntRequest.from_environ())
        _register_exit()
    return _RUN


_EXIT_HOOK = [False]


def _register_exit() -> None:
    if not _EXIT_HOOK[0]:
        atexit.register(_end_at_exit)
        _EXIT_HOOK[0] = True


def _end_at_exit() -> None:
    """At interpreter exit, a run with no step in progress and no failure is recorded as finished (a
    ``mindguard.watch`` loop has no end hook). Never raises: the process is ending for its own reasons."""
    if _RUN is None:
        return
    try:
        told_before = _RUN._told_hunt
        # an exception nothing caught ended the script (the interpreter keeps it as sys.last_value before it runs
        # the exit hooks): a watch loop's dataset that raised between steps, the script's own error -- the run
        # failed, it did not finish
        uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if uncaught is not None and _RUN.failure is None and _RUN.step is not None:
            ended = _RUN._finished_at == _RUN.step.global_step   # the training calls had ended normally
            _RUN.fail_with_exception(type(uncaught), uncaught, training_ended=ended)
        if told_before and getattr(sys, "last_type", None) is not None:
            # the process ends with a traceback (LossMonitor raising on the NaN loss, watch's NonFiniteError) that
            # buried the line printed at the failure: print it again, last
            print(_RUN.hunt_from_line(), file=sys.stderr, flush=True)
        if _RUN.failure is None and _RUN.step_begun() is None:
            for check in list(_RUN.end_checks.values()):   # a watch loop's last steps may be unchecked (budget)
                check()
        _RUN.end_exit()
        _RUN.drop_states_at_exit()
    except Exception as exc:  # noqa: BLE001
        print(f"mindguard: could not mark the run finished at exit: {type(exc).__name__}: {exc}", file=sys.stderr)


def reset_run(request: Optional[HuntRequest] = None) -> Run:
    """Start a new run in this process (for tests and notebooks: one process, several independent trainings).
    Returns the new run. Any record the old run was writing is closed as it is."""
    global _RUN
    if _RUN is not None:
        _RUN.records.close()
        _RUN.records.release()
        _resume.release_run_states(_RUN._run_lock)
    _RUN = Run(request if request is not None else HuntRequest.from_environ())
    _register_exit()
    return _RUN


def step_of(run_context: Any) -> StepInfo:
    """The process-wide :class:`StepInfo` of the step a ``Model.train`` step hook is called for (counted once,
    whichever callback asks first)."""
    cb_params = run_context.original_args()
    run = current_run()
    call = run.begin_call(cb_params, cb_params.get("train_network") or cb_params.get("network"),
                          sink=bool(cb_params.get("dataset_sink_mode")))
    cur_step_num, epoch = int(cb_params.get("cur_step_num") or 0), cb_params.get("cur_epoch_num")
    if call.fast_forwarded:   # Model counts its epochs from the reset on; the data's epoch is the step's
        epoch = cb_params.cur_epoch_num = (cur_step_num - 1) // int(cb_params.get("batch_num")) + 1
        if cur_step_num >= call.data_steps:   # the last batch: Model's loop would ask for epochs the data lacks
            run_context.request_stop()
    info = run.begin_step(call, cur_step_num, batch_num=cb_params.get("batch_num"), epoch=epoch)
    if info.skipped:
        run.fast_forward(call, cb_params, info)
    return info
