"""A :class:`~mindguard.training.locator.FailureLocator`'s verdicts on its steps (:class:`StepVerdicts`): what a step
left (its outputs, the Parameter check started on the weights it wrote), the verdict drawn from them -- at the step's
end, or one step late when deferred -- and the failure recorded on the run (with the ranks' consensus when
distributed). mindguard's own error in a check turns that check off (:func:`own_error`); the training's never is.

Steps are 1-based, process-wide global steps (:mod:`mindguard.training.run`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from . import consensus as _consensus
from ..._util.dist import rank_info
from ...errors import NonFiniteError
from .finite import (OutputChecker, ParamChecker, StartedCheck, host_check_by_default, nonfinite_batch, on_device)
from .params import written_parameters
from ..run import Run, current_run
from ..step.steps import StepInfo, TrainingCall

#: a step's verdict: (failure kind or None, loss, non-finite names, message)
Verdict = Tuple[Optional[str], Optional[float], List[str], Optional[str]]


class Observed:
    """A step whose verdict is not drawn yet: its :class:`StepInfo`, outputs, train network, the started parameter
    check and the checker that reads it, the batch (distributed consensus); ``unchecked`` after mindguard's own
    error."""

    __slots__ = ("step", "outputs", "train_network", "started", "checker", "batch", "unchecked", "check_seconds")

    def __init__(self, step: StepInfo, outputs: Any, train_network: Any, started: Optional[StartedCheck],
                 checker: Optional[ParamChecker], batch: Any, *, unchecked: bool = False,
                 check_seconds: float = 0.0) -> None:
        self.step, self.outputs, self.train_network = step, outputs, train_network
        self.started, self.checker, self.batch, self.unchecked = started, checker, batch, unchecked
        self.check_seconds = check_seconds


class StepVerdicts:
    """The checks of one locator and the verdicts they give. ``action``, ``initial_iteration``: as the locator was
    given them; :attr:`call`, :attr:`defer` and :attr:`collective` are set by the locator at each training call."""

    def __init__(self, *, check_params: bool, action: str, initial_iteration: int, max_overflow_steps: int,
                 min_loss_scale: float) -> None:
        self.check_params = check_params
        self.action = action
        self.initial_iteration = initial_iteration
        self.outputs = OutputChecker(max_overflow_steps=max_overflow_steps, min_loss_scale=min_loss_scale)
        self.checker: Optional[ParamChecker] = None   # kept across calls: its graph compiles once
        self._checker_call: Optional[TrainingCall] = None
        self.call: Optional[TrainingCall] = None
        self.defer = False               # verdicts read one step late (FailureLocator's defer_check)
        self.collective = False          # several ranks decide each step together (consensus)
        self.params_lost = False         # mindguard's own error disabled the Parameter check (run.recorder.checks_lost)
        self.pending: Optional[Observed] = None   # the step whose deferred verdict is not read yet
        self.false_alarms = 0
        self.sync_seconds = 0.0
        self.sync_steps = 0

    @property
    def run(self) -> Run:
        return current_run()

    def checks_params(self) -> bool:
        return self.check_params and not self.params_lost

    # -- what a step left --------------------------------------------------------------------------------------
    def observe(self, step: StepInfo, cb_params: Any) -> Observed:
        """What step ``step`` left, kept until its verdict is due: its outputs, and the parameter check started
        on the Parameters as the step left them."""
        started, seconds = None, 0.0
        if self.checks_params() and self.run.checks.due(step):
            begin = time.perf_counter()
            started = self.start_param_check(cb_params)
            seconds = time.perf_counter() - begin
        return Observed(step, cb_params.get("net_outputs"), cb_params.get("train_network"), started,
                        self.checker if started is not None else None, cb_params.get("train_dataset_element"),
                        check_seconds=seconds)

    def unchecked(self, step: StepInfo, cb_params: Any) -> Observed:
        """Step ``step`` as observed when observing it failed (mindguard's own error): its outputs only."""
        return Observed(step, cb_params.get("net_outputs"), cb_params.get("train_network"), None, None,
                        cb_params.get("train_dataset_element"))

    def start_param_check(self, cb_params: Any) -> StartedCheck:
        checker = self.checker
        if checker is None or self._checker_call is not self.call:  # (re)match the checker to this call's network
            params = written_parameters(cb_params.get("train_network") or cb_params.get("network"),
                                        cb_params.get("optimizer"))
            on_host = False if self.defer else host_check_by_default(params)
            if checker is None or not checker.checks(params) or checker.on_host != on_host:
                checker = self.checker = ParamChecker(params, on_host=on_host)
            self._checker_call = self.call
            self.run.recorder.note_params_count(len(checker.params))
        return checker.start()

    def lose_param_check(self, step: StepInfo, bug: Exception) -> None:
        """mindguard's own error in the Parameter check: it is off from ``step`` on (one warning, the record's
        ``checks_lost``); the loss check goes on. Under ``mindguard hunt`` the error propagates: a pass must not
        answer without the check it was asked for."""
        if self.run.request is not None:
            raise bug
        self.params_lost = True
        self.run.recorder.lose_check("Parameter", bug, step.global_step, still="the loss check")

    # -- the verdict -------------------------------------------------------------------------------------------
    def verdict_of(self, observed: Observed, step_context: Any) -> Verdict:
        """``(kind or None, loss, nonfinite names, message)`` of ``observed``'s step. An error MindSpore raises while
        its results are read (an asynchronous device's kernel failure surfaces at the first read) is the
        training's and propagates; any other error is mindguard's own: warned about, the step left unchecked.
        ``step_context``: the run context of the step begun last (its Parameters, for an unscheduled check)."""
        if observed.unchecked:
            return None, None, [], None
        try:
            return self._local_verdict(observed, step_context)
        except Exception as error:  # noqa: BLE001 - mindguard's own failure must not end, or be blamed on, the training
            if trainings_error(error):
                raise
            self.lose_param_check(observed.step, error)
            observed.started = None
        try:   # what still works: the loss
            verdict = self.outputs.check(observed.outputs, observed.train_network)
            return verdict.kind, verdict.loss, verdict.nonfinite, verdict.message
        except Exception as error:  # noqa: BLE001
            if trainings_error(error):
                raise
            self.run.recorder.lose_check("loss", error, observed.step.global_step,
                                         still="the record of the steps and exceptions")
            return None, None, [], None

    def _local_verdict(self, observed: Observed, step_context: Any) -> Verdict:
        """``(kind or None, loss, nonfinite names, message)`` of this rank's step: its outputs, then its Parameters."""
        verdict = self.outputs.check(observed.outputs, observed.train_network)
        started, checker, seconds = observed.started, observed.checker, observed.check_seconds
        if started is None and verdict.kind is not None and self.checks_params() and not self.defer \
                and self.run.checks.budget is not None and step_context is not None:
            # an always-on Guard that skipped this step's check: the Parameters now say how wide the window is
            begin = time.perf_counter()
            started = self.start_param_check(step_context.original_args())
            checker, seconds = self.checker, time.perf_counter() - begin
        if started is not None and checker is not None:
            begin = time.perf_counter()
            names = checker.finish(started)
            self.run.events.params_checked(observed.step, not names, seconds + time.perf_counter() - begin,
                                           checker.take_setup_seconds())
            verdict.add_nonfinite_params(names)
            self.false_alarms += started.false_alarm
        return verdict.kind, verdict.loss, verdict.nonfinite, verdict.message

    def conclude(self, run_context: Any, observed: Observed, step_context: Any, seen_at: Optional[StepInfo] = None,
                 verdict: Optional[Verdict] = None) -> None:
        """The verdict on ``observed``'s step (``verdict``, else read now): record it (and stop, raise or go on) when
        it failed. ``seen_at`` is the later step at whose end a deferred verdict is read."""
        run = self.run
        step = observed.step
        if run.failure is not None:
            return
        kind, loss, nonfinite, message = verdict if verdict is not None else self.verdict_of(observed, step_context)
        started = observed.started
        run.events.step_traced(step, loss, started.param_sum if started is not None else None)
        extra: Dict[str, Any] = {}
        if seen_at is not None:
            extra["seen_at_step"] = seen_at.global_step
            if message is not None:
                message += (f" [seen at the end of global step {seen_at.global_step}: the verdict was read one step "
                            f"late so that the host does not wait for each step; that step ran on these weights too]")
        if self.collective:
            batch = observed.batch
            start = time.perf_counter()
            state = run.state   # the keep agreement rides on this exchange (training/agreed_keeps.py)
            decision, flags = _consensus.exchange(rank_info()[0], kind, loss, nonfinite, message,
                                                  nonfinite_batch(batch) if kind is not None else [],
                                                  batch is not None, state.keep_flags(step.global_step, run.checks))
            state.agree_keeps(flags, step.global_step, run.global_step + 1)
            self.sync_seconds += time.perf_counter() - start
            self.sync_steps += 1
            if decision is not None:
                self.fail(run_context, step, **decision, **extra)
        elif kind is not None:
            self.fail(run_context, step, kind=kind, loss=loss, nonfinite=nonfinite, message=message, **extra)

    def flush(self, run_context: Any, step_context: Any) -> None:
        """Conclude the step whose deferred verdict is still pending (an epoch or the training ended)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            self.conclude(run_context, pending, step_context)

    def conclude_interrupted(self, step: StepInfo, step_context: Any, outputs_before: Any) -> None:
        """A callback before the locator raised at the end of ``step``, whose outputs are in (MindSpore's
        ``LossMonitor`` raises on a NaN loss), so the locator's step-end hook never ran: check that step now. A
        non-finite step is then recorded as such; a healthy one's exception as the script's (``phase="script"``).
        ``outputs_before``: ``cb_params.net_outputs`` when the step began (the same object: no outputs came)."""
        run = self.run
        if run.failure is not None or step.skipped or run.step_begun() is not step:
            return
        cb_params = step_context.original_args()
        outputs = cb_params.get("net_outputs")
        if outputs is None or outputs is outputs_before:   # the step itself raised: no outputs came
            return
        observed = self.observe(step, cb_params)
        verdict = self.verdict_of(observed, step_context)
        run.end_step(step)
        try:
            self.conclude(None, observed, step_context, verdict=verdict)
        except NonFiniteError:   # action="raise": the training's own exception is already on its way
            pass

    def params_now(self, step: StepInfo, step_context: Any) -> Optional[List[str]]:
        """A check outside the budget's schedule of the Parameters as step ``step`` left them: the non-finite ones'
        names, ``None`` when mindguard's own error lost the check."""
        start = time.perf_counter()
        try:
            started = self.start_param_check(step_context.original_args())
            checker = self.checker
            names = checker.finish(started) if checker is not None else []
        except Exception as error:  # noqa: BLE001 - mindguard's own failure must not end, or be blamed on, the training
            if trainings_error(error):
                raise
            self.lose_param_check(step, error)
            return None
        self.run.events.params_checked(step, not names, time.perf_counter() - start,
                                       checker.take_setup_seconds() if checker is not None else 0.0)
        return names

    def fail(self, run_context: Any, step: StepInfo, *, kind: str, loss: Optional[float], nonfinite: List[str],
             message: Optional[str], **extra: Any) -> None:
        """Record the failure of ``step`` on the run, then stop, raise or go on as ``action`` says."""
        if not step.iteration_observed and step.dump_iteration is not None and self.initial_iteration:
            step.dump_iteration += self.initial_iteration
        run = self.run
        try:
            failure = run.fail(kind, loss=loss, nonfinite=nonfinite, message=message, info=step, phase="step",
                               **extra)
        finally:   # mindguard's own error recording it never leaves the failure unstopped (issue 50)
            if self.action == "stop" and run_context is not None:
                run_context.request_stop()
        if self.action == "raise":
            paths = run.recorder.writer.paths
            raise NonFiniteError(f"mindguard: training went non-finite at {failure.format()} "
                                 f"(record: {paths[0] if paths else None})", failure)


def own_error(run: Run, error: BaseException) -> bool:
    """Whether ``error``, raised inside a hook of mindguard's, is mindguard's own bug (contained: the training goes
    on) rather than something to propagate: a deliberate :class:`~mindguard.errors.MindguardError` (a refused
    argument, ``NonFiniteError`` with ``action="raise"``), the training's own error surfacing on a device
    (:func:`trainings_error`), anything that is no ``Exception`` (an interrupt, the hunt's stop), or any error under
    ``mindguard hunt`` (a pass must not answer without what it was asked to check)."""
    from ...errors import MindguardError

    return (isinstance(error, Exception) and run.request is None and not isinstance(error, MindguardError)
            and not trainings_error(error))


def trainings_error(error: BaseException) -> bool:
    """Whether an error raised inside mindguard's hook is the training's, to propagate: on GPU/Ascend a kernel
    failure of the training surfaces at the first read of a result (:func:`raised_by_mindspore`). On CPU the
    kernels finish before the step returns, so an error in mindguard's hook is mindguard's own (its check's graph
    failing to compile, e.g. MindSpore's call-depth limit)."""
    return on_device() and raised_by_mindspore(error)


def raised_by_mindspore(error: BaseException) -> bool:
    """True for a ``RuntimeError`` whose innermost Python frame is MindSpore's own code (a kernel or device error
    surfacing when a result is read), not mindguard's."""
    if not isinstance(error, RuntimeError):
        return False
    frame, innermost = error.__traceback__, None
    while frame is not None:
        innermost, frame = frame, frame.tb_next
    if innermost is None:
        return False
    filename = Path(innermost.tb_frame.f_code.co_filename).parts
    return "mindspore" in filename and "mindguard" not in filename
