"""``FailureLocator``: the ``Model.train``/``Model.fit`` callback that names the step where training went
non-finite (or crashed), over the process's :class:`~mindguard.training.run.Run`.

It hooks into MindSpore's callbacks and draws each step's verdict through its
:class:`~mindguard.training.checks.verdicts. StepVerdicts`; the run counts and records. So any number of locators (one
shared by every call, a new one per call, one per phase with its own ``record=``) agree on one process-wide step count
and one first failure.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Optional, Tuple

from mindspore.train import Callback

from .._util.args import require_bool, require_choice, require_int, require_real
from .._util.dist import collective_ready, rank_info
from .checks.budget import CHECK_FRACTION
from ..errors import ArgumentError, ArgumentTypeError, MindguardWarning
from .checks.finite import compiled_check_unsafe, on_device
from ..protocol import folder as layout
from ..protocol.request import record_override, under_hunt
from ..protocol.record import FailureRecord
from .run import Run, StepInfo, TrainingCall, current_run, step_of
from .checks.verdicts import StepVerdicts, own_error, trainings_error

__all__ = ["ACTIONS", "FailureLocator", "choose_defer", "own_error"]

ACTIONS = ("stop", "raise", "continue")


def _check_record_arg(record: Any) -> Path:
    if isinstance(record, bytes) or not isinstance(record, (str, os.PathLike)):
        raise ArgumentTypeError(f"FailureLocator(record=...) must be a file path (str or os.PathLike), got {record!r} "
                                f"({type(record).__name__}); e.g. record=\"mindguard_failure.json\"")
    if str(record) == "":
        raise ArgumentError("FailureLocator(record=...) is empty; pass a file path such as \"mindguard_failure.json\"")
    path = Path(record).expanduser()
    if os.path.isdir(path):   # (a name too long for the file system is no folder: it is shortened, issue 50)
        raise ArgumentError(f"FailureLocator(record={str(record)!r}) is a directory; pass a file path inside it, e.g. "
                            f"{str(path / layout.DEFAULT_RECORD)!r}")
    if record_override() is None and not under_hunt():  # else another path is used
        _check_record_dir(record, path.absolute().parent)
    return path


def _check_budget_arg(owner: str, value: Any) -> float:
    value = require_real(f"{owner}(check_budget=...)", value, minimum=0)
    if not 0 < value <= 1:
        raise ArgumentError(f"{owner}(check_budget={value!r}): the share of the training time the Parameter checks "
                            f"may take must be in (0, 1], e.g. 0.01 for 1 %; for a check after every step pass "
                            f"check_every_step=True")
    return value


def _check_record_dir(record: Any, parent: Path) -> None:
    """The record's folder must be a folder (it is created if missing). One this process cannot write in is no
    reason to refuse the training: the record goes to a folder in the temp directory instead, and Guard says so
    (:func:`mindguard.training.record.record_writer.place_record`)."""
    existing = parent
    while not os.path.exists(existing) and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ArgumentError(f"FailureLocator(record={str(record)!r}): {str(existing)!r} is a file, so the record "
                            "cannot be written under it; pass a path in a folder, e.g. record='mindguard_failure.json'")


class FailureLocator(Callback):
    """Record the first step where training goes non-finite or crashes, and keep the record current.

    Args:
        record: JSON file of the failure record (one per rank: ``name.rank<N>.json`` when distributed). It is
            the record of the process's whole run (every training call; see :mod:`mindguard.training.run`); under
            ``mindguard hunt`` the hunt's path is used instead. If the file holds the record of an earlier
            failed or killed run, a warning says so before it is replaced; a file at that path that is not a
            mindguard record is never overwritten (``ArgumentError`` before training).
        check_params: check that every Parameter the step writes is finite -- the trained weights, BatchNorm
            statistics and other buffers, a train cell's own state (loss scale, EMA copies), not the optimizer's moments
            -- so the record names the step whose *update* produced Inf/NaN rather than the later step where the loss
            shows it. Outside ``mindguard hunt`` on a time budget (:mod:`mindguard.training.checks.budget`: about 0.5 %
            of the training time, the check's effect on the next step included; always after a non-finite loss, at the
            end of the training, and before an exception is recorded; at an epoch's end while the budget allows), so the
            record may name a window of steps (``failure_window``) that ``mindguard hunt --from`` narrows to the exact
            step; under the hunt, or with ``check_every_step``, after every step. A check costs, on CPU, one BLAS
            reduction over zero-copy views (~0.01 ms per 0.3 MB) for Parameters of at most 3 MiB in all or more than 64
            of them, else -- a host read of more slows the next step (docs/mindspore-facts.md) -- one compiled reduction
            returning one float per Parameter (~0.3-0.4 ms; its compile time is charged to the budget); on GPU/Ascend
            the compiled reduction -- or, under ``mindguard hunt`` and whenever a dump is armed, the host reduction over
            a copy of every Parameter (see :func:`mindguard.training.checks.finite.host_check_by_default`).
        action: at the first failure: ``"stop"`` (``run_context.request_stop()``: the step ends, then
            ``on_train_epoch_end``/``on_train_end`` run), ``"raise"`` (:class:`~mindguard.NonFiniteError` from
            ``on_train_step_end``, or -- for a deferred verdict read there -- ``on_train_epoch_end``/``on_train_end``)
            or ``"continue"`` (keep training; the record keeps the first failure and no further checks run).
        max_overflow_steps: with loss-scale outputs ``(loss, overflow, scale)``, an overflow with a finite loss is
            normal, and so is any streak of them while the scale comes down (a scaler's warm-up from ``2**40``);
            this many overflows in a row at a scale that does not come down is a ``"loss_scale_collapse"``, and so
            is a streak longer than ``max_overflow_steps + 2 * log2(scale before it / max(min_loss_scale, 1))``
            (:class:`mindguard.training.checks.loss_scale.LossScaleRule`).
        min_loss_scale: an overflow with the loss scale ``<= min_loss_scale`` at its step and the step before (the
            scale at its floor, whether the cell reports it before or after its update) is a collapse too.
        initial_iteration: the dump config's ``initial_iteration``, added to an *estimated* ``dump_iteration``.
        check_every_step: check the Parameters after every step outside the hunt too (an exact record, at the cost
            measured in the README's benchmarks), instead of on the budget.
        check_budget: the share of the training time the Parameter checks may take outside the hunt (0.005: 0.5 %;
            the interval between checks adapts to it, and is at most 1000 steps).
        keep_state: outside the hunt, keep the training state on disk beside the record (``<record>.state/``, the
            last two states, on a budget of 0.5 % of the training time) so that ``mindguard hunt --from RECORD``
            starts near the failure instead of at step 1. Needs ``check_params`` (only states whose Parameters were
            just checked finite are kept); not with several ranks.
        defer_check: read each step's verdict (its loss, its parameter check) at the end of the *next* step, so the
            host never waits for the step it just launched and the device always has one queued (GPU/Ascend run
            kernels asynchronously; reading a step's result at its own end drains that queue every step). The
            record still names the failing step; ``seen_at_step`` says the step at whose end it was seen, and the
            stop comes after that step (whose update also ran). Pending verdicts are read at each epoch's end, the
            training's end, and before an exception is recorded. ``None`` (default): on GPU/Ascend in one process,
            except for a :class:`~mindguard.GuardedTrainStep` (which must hear of a refusal before its next step);
            off with several ranks (the per-step AllReduce that makes every rank stop at the same step reads its
            result each step, which waits for the step anyway); on CPU off,
            because CPU kernels finish before the step returns (measured): ``True`` there runs the device path
            (a compiled check) and gains nothing. Never under ``mindguard hunt`` or while a dump is armed
            (``MINDSPORE_DUMP_CONFIG``): the compiled check would be dumped beside the training's graph, and the
            hunt's passes must all check on the host (a resumed pass compares what they compute).

    Step outputs understood (``net_outputs``): see :class:`mindguard.training.checks.finite.OutputChecker`. A non-finite
    loss is a failure even on a loss-scale overflow step.

    Exceptions raised while training (``RuntimeError: run task error`` ...) are recorded as ``"exception"``
    (``KeyboardInterrupt`` as ``"interrupted"``) with the step in progress -- or, raised between steps by the
    dataset pipeline, at the step whose batch was being fetched -- and propagate unchanged.

    Hooks: ``on_train_begin`` (joins the run's current training call), ``on_train_step_begin`` (counts the
    step, writes "running" in place), ``on_train_step_end`` (checks), ``on_train_end``; ``__enter__``/``__exit__``
    count nesting, because ``Model.fit`` runs validation inside the same callbacks' context, so only the
    outermost exit ends a call.

    After training: ``failure`` is the run's first failure (:class:`~mindguard.protocol.record.FailureRecord` or
    ``None``),
    ``record_path`` the file written, ``false_alarms`` how often the fast parameter check alarmed on finite values.

    Distributed (``msrun``, communication initialised, more than one rank): every step each rank joins one small
    collective (:mod:`mindguard.training.checks.consensus`; ``sync_seconds``/``sync_steps`` measure it), so all ranks
    fail -- and with ``action="stop"`` stop -- at the same step. The other ranks' records carry ``stopped_by_rank``.
    """

    def __init__(self, record: "os.PathLike[str] | str" = layout.DEFAULT_RECORD, *, check_params: bool = True,
                 action: str = "stop", max_overflow_steps: int = 20, min_loss_scale: float = 1.0,
                 initial_iteration: int = 0, defer_check: Optional[bool] = None, check_every_step: bool = False,
                 keep_state: bool = True, check_budget: float = CHECK_FRACTION) -> None:
        super().__init__()
        self._record_arg = _check_record_arg(record)
        self.check_params = require_bool("FailureLocator(check_params=...)", check_params)
        self.action = require_choice("FailureLocator(action=...)", action, ACTIONS,
                                     explain='"stop" ends training after the failing step, "raise" raises '
                                             'NonFiniteError, "continue" only records the first failure')
        self.max_overflow_steps = require_int("FailureLocator(max_overflow_steps=...)", max_overflow_steps, minimum=1)
        self.min_loss_scale = require_real("FailureLocator(min_loss_scale=...)", min_loss_scale, minimum=0)
        self.initial_iteration = require_int("FailureLocator(initial_iteration=...) (the dump config's "
                                             "initial_iteration)", initial_iteration, minimum=0)
        if defer_check is not None:
            require_bool("FailureLocator(defer_check=...)", defer_check)
        self.defer_check = defer_check
        self.check_every_step = require_bool("FailureLocator(check_every_step=...)", check_every_step)
        self.keep_state = require_bool("FailureLocator(keep_state=...)", keep_state)
        self.check_budget = _check_budget_arg("FailureLocator", check_budget)
        self.verdicts = StepVerdicts(check_params=self.check_params, action=self.action,
                                     initial_iteration=self.initial_iteration,
                                     max_overflow_steps=self.max_overflow_steps, min_loss_scale=self.min_loss_scale)
        self._broken = False             # mindguard's own error disabled this locator's hooks (Recorder.checks_lost)
        self._said_host = False
        self._refused: Optional[ArgumentError] = None
        self._call: Optional[TrainingCall] = None
        self._step: Optional[StepInfo] = None
        self.step_context = None         # the run context of the step begun last (Guard replays from it)
        self._outputs_before = None      # that step's cb_params.net_outputs before it ran
        current_run().prepare_training()   # where the training is set up: what the hunt's request asks of it

    # -- the run and the checks' state ------------------------------------------------------------------------
    @property
    def run(self) -> Run:
        return current_run()

    @property
    def failure(self) -> Optional[FailureRecord]:
        """The first failure of the process's run (``None`` while everything is finite)."""
        return self.run.failure

    @property
    def record_path(self) -> Path:
        """The record file this locator's run writes (the hunt's path under ``mindguard hunt``)."""
        return self.run.recorder.add_path(self._record_arg)

    @property
    def false_alarms(self) -> int:
        """How often the fast parameter check alarmed on finite values."""
        return self.verdicts.false_alarms

    @property
    def sync_seconds(self) -> float:
        return self.verdicts.sync_seconds

    @property
    def sync_steps(self) -> int:
        return self.verdicts.sync_steps

    # -- hooks ---------------------------------------------------------------------------------------------
    def __enter__(self) -> "FailureLocator":
        self.run.enter()
        return self

    def on_train_begin(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        run = self.run
        train_network = cb_params.get("train_network") or cb_params.get("network")
        try:
            self.verdicts.defer, on_host_instead = choose_defer(self.defer_check, train_network)
        except ArgumentError as refused:   # the user's argument, not the training's failure: __exit__ records nothing
            self._refused = refused
            raise
        if on_host_instead and not self._said_host:
            self._said_host = True
            print("mindguard: defer_check=True is not applied under mindguard hunt or while MindSpore's dump is "
                  "armed (MINDSPORE_DUMP_CONFIG): its compiled check would be dumped beside the training's graph, "
                  "and every pass of a hunt must check the same way; each step is checked on the host at its end",
                  file=sys.stderr, flush=True)
        run.recorder.add_path(self._record_arg)
        if self.check_params and not self.check_every_step:
            run.watch_on_budget(keep_state=self.keep_state, fraction=self.check_budget)
        self._call = self.verdicts.call = run.begin_call(cb_params, train_network,
                                                         sink=bool(cb_params.get("dataset_sink_mode")))
        self.verdicts.collective = rank_info()[1] > 1 and collective_ready()

    def on_train_step_begin(self, run_context: Any) -> None:
        self._contained(self._step_begin, run_context)

    def on_train_step_end(self, run_context: Any) -> None:
        self._contained(self._step_end, run_context)

    def on_train_epoch_end(self, run_context: Any) -> None:
        self._contained(self._epoch_end, run_context)

    def on_train_end(self, run_context: Any) -> None:
        self._contained(self._train_end, run_context)

    def _contained(self, hook: Callable[[Any], None], run_context: Any) -> None:
        """Run ``hook``; mindguard's own error in it (:func:`own_error`) turns this locator off (one warning, the
        record's ``checks_lost``) instead of ending the training."""
        if self._broken:   # no check any more; the record still counts the steps and says how the training ended
            try:
                if hook == self._step_begin:
                    self._step = step_of(run_context)
                elif hook == self._step_end and self._step is not None:
                    self.run.end_step(self._step)
                elif hook == self._train_end and self._call is not None:
                    self.run.end_exit()
            except Exception:  # noqa: BLE001 - the locator is off: nothing of it may end the training
                pass
            return
        try:
            hook(run_context)
        except Exception as error:  # noqa: BLE001 - sorted by own_error: only mindguard's own bugs are contained
            if not own_error(self.run, error):
                raise
            self._broken = True
            step = self.run.step
            self.run.recorder.lose_check("loss", error, step.global_step if step is not None else None,
                                         still="the training, unchecked,")

    def _step_begin(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        if self._call is None:  # a callback list entered without on_train_begin (defensive)
            self.on_train_begin(run_context)
        self._step = step_of(run_context)
        self.step_context, self._outputs_before = run_context, cb_params.get("net_outputs")

    def _step_end(self, run_context: Any) -> None:
        run, verdicts = self.run, self.verdicts
        step = self._step
        if step is None:
            return
        if run.failure is not None or step.skipped:
            run.end_step(step)
            return
        cb_params = run_context.original_args()
        run.events.step_outputs(step, cb_params.get("net_outputs"))
        try:
            observed = verdicts.observe(step, cb_params)
        except Exception as bug:  # noqa: BLE001 - mindguard's own failure must not end, or be blamed on, the training
            if trainings_error(bug):
                raise
            verdicts.lose_param_check(step, bug)
            observed = verdicts.unchecked(step, cb_params)
        if not verdicts.defer:   # the verdict's reads wait for the step: then the step's end time is taken
            verdict = verdicts.verdict_of(observed, self.step_context)
            run.end_step(step)
            verdicts.conclude(run_context, observed, self.step_context, verdict=verdict)
            return
        run.end_step(step)
        previous, verdicts.pending = verdicts.pending, observed
        if previous is not None:
            verdicts.conclude(run_context, previous, self.step_context, seen_at=step)

    def _epoch_end(self, run_context: Any) -> None:
        self.verdicts.flush(run_context, self.step_context)
        budget = self.run.checks.budget
        # several ranks check only at the steps they agreed on (training/agreed_keeps.py): a check of one rank alone
        # would stop it outside the verdict exchange, leaving the others waiting in the next gradient AllReduce
        if budget is not None and budget.epoch_end_due() and not self.verdicts.collective:
            self._check_now(run_context, "at the epoch's end")
        self.run.events.timing_paused()

    def _train_end(self, run_context: Any) -> None:
        self.verdicts.flush(run_context, self.step_context)
        self._check_now(run_context, "at the end of the training")
        self.run.events.timing_paused()
        if self._call is not None:
            self.run.end_exit()

    def _check_now(self, run_context: Any, when: str, *, then: str = "") -> bool:
        """A check outside the budget's schedule (an always-on Guard) of the Parameters as the last step left them:
        a failure is recorded at that step, with the window since the last passing check. True when it failed."""
        run, step, verdicts = self.run, self._step, self.verdicts
        if run.checks.budget is None or not verdicts.checks_params() or run.failure is not None or step is None \
                or step.skipped or verdicts.defer or run.checks.checked_at(step) or self.step_context is None:
            return False
        names = verdicts.params_now(step, self.step_context)
        if not names:
            return False
        verdicts.fail(run_context, step, kind="nonfinite_params", loss=None, nonfinite=names,
                      message=f"parameters non-finite {when}: {', '.join(names[:5])}"
                              f"{' ...' if len(names) > 5 else ''}{then}")
        return True

    def __exit__(self, exc_type: Optional[type], exc: Optional[BaseException], traceback: Any) -> None:
        run = self.run
        depth = run.exit()
        # fit's validation re-enters the callbacks
        if exc_type is None or exc is None or depth > 0 or exc is self._refused:
            if depth == 0:   # the training's own checkpoint files at a failure, read back and named (issue 50)
                run.state.user_checkpoints.at_call_end(run)
            return None
        try:
            self.verdicts.flush(None, self.step_context)   # a step before the one that raised may have failed first
        except Exception:  # noqa: BLE001 - a device that raised may not give the pending verdict back
            self.verdicts.pending = None
        try:   # a callback before this one raised at the step's end (LossMonitor on a NaN loss): check that step now
            if self._step is not None and self.step_context is not None:
                self.verdicts.conclude_interrupted(self._step, self.step_context, self._outputs_before)
        except Exception:  # noqa: BLE001 - the training's exception goes on; the record says what it can
            pass
        if not issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            try:   # an always-on Guard: Parameters that went non-finite before the crash are the failure to examine
                self._check_now(None, "when the training raised",
                                then=f"; then the training raised {exc_type.__name__}: {str(exc)[:300]}")
            except Exception:  # noqa: BLE001 - a device that raised may not give its Parameters back
                pass
        try:
            run.fail_with_exception(exc_type, exc)
        except Exception as write_error:  # noqa: BLE001 - never replace the training's own exception
            warnings.warn(f"mindguard: could not write the failure record: {type(write_error).__name__}: "
                          f"{write_error}", MindguardWarning, stacklevel=2)
        finally:
            if not issubclass(exc_type, KeyboardInterrupt):   # (an interrupt waits for no file read back)
                run.state.user_checkpoints.at_call_end(run)
            run.recorder.writer.close()
        return None


def choose_defer(defer_check: Optional[bool], train_network: Any) -> Tuple[bool, bool]:
    """Whether a locator given ``defer_check`` reads each step's verdict one step late for ``train_network``, and
    whether ``defer_check=True`` was asked for but the step is checked on the host instead (a hunt, an armed dump).
    :class:`ArgumentError` for ``defer_check=True`` with a :class:`~mindguard.GuardedTrainStep`."""
    from ..nn.protect import GuardedTrainStep

    guarded = isinstance(train_network, GuardedTrainStep)
    if defer_check is None:   # several ranks: the per-step verdict AllReduce is read each step anyway
        return not guarded and on_device() and not compiled_check_unsafe() and rank_info()[1] == 1, False
    if defer_check and guarded:
        raise ArgumentError("FailureLocator(defer_check=True) cannot read a GuardedTrainStep's verdict one step "
                            "late: it refuses the update in the graph and must hear of the refusal before its "
                            "next step; leave defer_check=None (the default) or pass False")
    if defer_check and compiled_check_unsafe():   # the deferred check is compiled
        return False, True
    return defer_check, False
