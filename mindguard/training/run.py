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
  alone, to every path a Guard/FailureLocator asked for (the hunt's path overrides them);
* the **hunt's request** (``MINDGUARD_*`` variables set by ``mindguard hunt``) is parsed once, by the run
  (:class:`~mindguard.protocol.request.HuntRequest`, the only reader of those variables). Under the hunt, once a
  failure is recorded -- or the step to examine is done -- every later training call stops the process before its
  first step, and says so.

``Run`` counts calls and steps and keeps the first failure; the parts that do the rest, one job each, follow the
steps through the run's per-step events (``mindguard.training.step.events.RunEvents``, in the style of Keras's
``CallbackList``: ``call_begun``, ``step_starting``, ``step_begun``, ``step_outputs``, ``step_ended``,
``iteration_observed``, ``params_checked``, ``step_traced``, ``timing_paused``, ``training_ended``), in this order:

* ``run.checks`` (``checks/checked.py``, ``ParamChecks``) -- the Parameter checks' budget and the window a failure
  lies in;
* ``run.pruner`` (``child/window_dump.py``, ``DumpPruner``) -- a ``hunt --from`` locate pass's dump, pruned as it
  goes;
* ``run.state`` (``state/run_state.py``, ``RunState``) -- keeping the training state, resuming from it, tracing what
  each step computed (``state/keeper.py``, ``state/resumer.py``);
* ``run.setup`` (``child/pass_setup.py``, ``HuntSetup``) -- what a hunt pass asks of the process at its first call;
* ``run.iterations`` (``step/observe.py``, ``Iterations``) -- which dump iteration each step ran as, observed from
  MindSpore's own record under the hunt;
* ``run.recorder`` (``record/recorder.py``, ``Recorder``) -- the record's fields, the first failure, the writing
  (``record/record_writer.py``) and the printed hunt line (``record/hunt_line.py``).

Guard, FailureLocator and ``mindguard.watch`` count steps through the run (``begin_call``, ``begin_step``,
``end_step``, ``fail``) and tell it what they saw through ``run.events`` (``params_checked``, ``step_outputs``,
``step_traced``, ``timing_paused``); what they ask of a part they ask of it (``run.checks.due``,
``run.recorder.lose_check``).

Creating the run changes nothing in MindSpore: what a hunt pass asks of the process (its dataset pipeline run
synchronously) is done by ``Run.prepare_training()``, which Guard, FailureLocator and ``mindguard.watch`` call
where the training is set up.

This module never imports MindSpore at import time (``mindguard hunt`` uses :class:`HuntRequest`).
"""
from __future__ import annotations

import atexit
import os
import sys
import warnings
from typing import Any, Callable, Dict, List, Optional, Sequence

from .child import pass_end as _pass_end
from .record import provenance as _provenance
from .._util.dist import rank_info
from .._util.io import io_fix, os_reason
from ..errors import MindguardWarning
from ..protocol.record import FailureRecord
from ..protocol.request import HuntRequest
from .checks.checked import ParamChecks
from .child.hunt_stop import CANNOT_CONTINUE, HuntCannotContinue, HuntStop
from .step.observe import IterationObserver, Iterations
from .child.pass_setup import HuntSetup
from .record.recorder import Recorder
from .state.run_state import RunState
from .record.classify import RunFacts, classify_exception
from .record.hunt_line import callback_note
from .step.events import RunEvents
from .step.steps import StepInfo, TrainingCall, following_step, now_us
from .child.window_dump import DumpPruner

# names this module has always offered (tests, docs, the hunt), re-exported from their homes
from .record.classify import mindguards_own as _mindguards_own  # noqa: F401
from .record.record_writer import check_replaceable as _check_replaceable  # noqa: F401
from .state.run_state import FAST_FORWARD_MIN_STEPS

__all__ = ["CANNOT_CONTINUE", "FAST_FORWARD_MIN_STEPS", "HuntCannotContinue", "HuntRequest", "HuntStop",
           "IterationObserver", "Run", "StepInfo", "TrainingCall", "cannot_write", "current_run", "reset_run",
           "step_of"]


def cannot_write(what: str, path: "os.PathLike[str] | str", exc: BaseException, *, alternative: str) -> None:
    """mindguard could not write ``what`` at ``path``: never the training's end. On its own, a warning that names
    the path and the fix (once per path), and training goes on; under the hunt, the pass cannot do its work: it
    says so (:data:`CANNOT_CONTINUE`) and ends the process (:class:`HuntCannotContinue`, exit 2)."""
    reason = f"cannot write {what} {str(path)!r} ({os_reason(exc)})"
    if _RUN is not None and _RUN.request is not None:
        message = CANNOT_CONTINUE + f"{reason}; {io_fix(exc, 'give --run-dir a folder on another disk')}"
        print(message, file=sys.stderr, flush=True)
        _pass_end.note(_RUN.request, ended="cannot_continue", cannot_continue=message[len(CANNOT_CONTINUE):])
        raise HuntCannotContinue(message)
    key = (str(path), getattr(exc, "errno", None))
    if key in _WARNED:
        return
    _WARNED.add(key)
    warnings.warn(f"mindguard: {reason}; the training goes on without it. Fix: {io_fix(exc, alternative)}",
                  MindguardWarning, stacklevel=2)


_WARNED: set = set()   # (path, errno) already warned about


class Run:
    """The training run of this process (use :func:`current_run`): its calls and 1-based global steps, its first
    failure, and the parts that follow its steps through its events (``events``, module docstring). Creating it
    changes nothing in MindSpore."""

    def __init__(self, request: Optional[HuntRequest] = None) -> None:
        self.request = request
        self.calls: List[TrainingCall] = []
        self.global_step = 0
        self.step: Optional[StepInfo] = None
        self.examined = False           # the hunt's examine step has run (set by the examiner)
        self._network_steps: Dict[int, int] = {}
        self._networks_seen: List[int] = []
        self._depth = 0                 # nesting of training calls (fit's validation, eval from a callback)
        # outside the hunt: the run's id, which names its kept states and its kept failure record
        self.run_id: Optional[str] = _provenance.new_run_id() if request is None else None
        self.end_checks: Dict[int, Callable[[], None]] = {}   # id(watched step) -> its check after the last step
        self.checks = ParamChecks()
        self.state = RunState(request, self.checks)
        self.setup = HuntSetup(request)
        observer = None
        if request is not None and request.pass_name == "record" and request.observe_path is not None:
            observer = IterationObserver(request.observe_path, rank_info()[0])
        self.iterations = Iterations(observer)
        # a locate pass with a dump armed (`hunt --from`): the steps checked clean lose their dump as it goes
        self.pruner = (DumpPruner(request.dump_path, rank_info()[0], request.net_name)
                       if request is not None and request.pass_name == "record" and request.dump_path is not None
                       else None)
        self.recorder = Recorder(self, cannot_write, checks=self.checks, state=self.state, pruner=self.pruner)
        # the parts that follow the steps, in the order each event reaches them
        self.events = RunEvents([self.checks, self.pruner, self.state, self.setup, self.iterations, self.recorder])
        if request is not None:
            _pass_end.reserve(request)
            self.recorder.add_path(request.record)

    def prepare_training(self) -> None:
        """Where a training is set up (Guard and FailureLocator when constructed, ``mindguard.watch`` when it wraps a
        step), before its datasets and their iterators are built: do what the hunt's request asks of the process
        (:meth:`mindguard.training.child.pass_setup.HuntSetup.prepare`). Nothing outside the hunt. Idempotent."""
        self.setup.prepare()

    @property
    def failure(self) -> Optional[FailureRecord]:
        """The first failure of the process (``None`` while everything is finite)."""
        return self.recorder.failure

    def watch_on_budget(self, keep_state: bool = True, fraction: Optional[float] = None) -> None:
        """Outside ``mindguard hunt``: check the Parameters on a time budget (:mod:`mindguard.training.checks.budget`)
        instead of every step, and -- ``keep_state`` -- keep the training state on disk beside the first record
        (``<record>.state/``) for ``mindguard hunt --from``. Under the hunt every step is checked (its passes need the
        exact step) and the hunt decides what is kept. Several ranks keep at the steps they all agree on
        (:mod:`mindguard.training.state.agreed_keeps`), each in its own folder. Idempotent."""
        if self.request is not None:
            return
        self.checks.use_budget(fraction)
        writer = self.recorder.writer
        if keep_state and writer.paths:
            self.state.keep_on_disk(next(iter(writer.asked())), self.run_id, self.recorder.note_unrestorable)
            self.checks.keeper = self.state.keeper   # (it may want a checked step to keep the next one from)

    # -- training calls and steps --------------------------------------------------------------------------
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
        failure = self.failure
        if self.request is not None and (failure is not None or self.examined):
            why = (f"the failure at {failure.position()} is recorded" if failure is not None
                   else f"global step {self.request.examine_step} is examined")
            message = (f"mindguard hunt: training call {call.index} ({name}) stopped before its first step: {why}; "
                       f"the rest of the script is not run")
            print(message, file=sys.stderr, flush=True)
            _pass_end.note(self.request, ended="stopped", stopped=message)
            raise HuntStop(message)
        if failure is not None:
            print(f"mindguard: training call {call.index} ({name}) starts after the failure at "
                  f"{failure.position()}; the record keeps that first failure and this call's steps are not "
                  f"checked", file=sys.stderr, flush=True)
        self.calls.append(call)
        if id(network) not in self._networks_seen:
            self._networks_seen.append(id(network))
        self.events.call_begun(call, network, self.global_step + 1)
        return call

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
        self.events.step_starting(self.global_step + 1, self.failure is not None)
        if call.first_step is None:
            call.first_step = self.global_step + 1
        steps_on_network = self._count_steps(call, cur_step_num, window)
        batch = max(int(batch_num or 1), 1)
        info = StepInfo(global_step=self.global_step, call=call, epoch=int(epoch) if epoch is not None else None,
                        step_in_epoch=(cur_step_num - 1) % batch + 1 if batch_num else None,
                        steps_per_epoch=int(batch_num) if batch_num else None, start_us=now_us())
        if window > 1:
            info.iteration_range = [steps_on_network - window, steps_on_network - 1]
        if len(self._networks_seen) == 1 and self.state.resumer is None:  # one train network: steps 0, 1, 2, ...
            info.dump_iteration = steps_on_network - 1
        self.step = info
        self.events.step_begun(info, self.failure is not None)
        return info

    def _count_steps(self, call: TrainingCall, cur_step_num: int, steps: int) -> int:
        """Count ``steps`` more steps of ``call``, the last numbered ``cur_step_num`` by MindSpore, in the process,
        the call and its network; returns the network's count."""
        call.last_cur_step = cur_step_num
        self.global_step += steps
        call.steps += steps
        self._network_steps[call.network_id] = self._network_steps.get(call.network_id, 0) + steps
        return self._network_steps[call.network_id]

    def fast_forward(self, call: TrainingCall, cb_params: Any, info: StepInfo) -> None:
        """A resumed pass at a skipped step: reset the call's dataset to the kept step when it can
        (:meth:`mindguard.training.state.run_state.RunState.fast_forward`), counting the steps it passes over."""
        self.state.fast_forward(call, cb_params, info, self._count_steps)

    def step_begun(self) -> Optional[StepInfo]:
        """The current step, or ``None`` between steps."""
        return self.step if self.step is not None and self.step.end_us is None else None

    def end_step(self, info: StepInfo) -> None:
        """Close ``info`` (called once the step's outputs are on the host) and read its observed iteration."""
        if info.end_us is not None:
            return
        info.end_us = now_us()
        self.events.step_ended(info)
        if info.iteration_observed:
            self.events.iteration_observed(info)

    def end_exit(self) -> None:
        """No step is running and none failed (a call ended, the script called ``sys.exit``, the process exits):
        the record says the run was healthy to its last step. A ``mindguard.watch`` loop has no end hook, so
        :func:`current_run` also calls this at interpreter exit; a step still in progress stays ``running``
        (the process died in it)."""
        self.events.training_ended(self.step if self.step is not None and self.step_begun() is None else None)

    # -- failures --------------------------------------------------------------------------------------
    def fail(self, kind: str, *, loss: Optional[float] = None, nonfinite: Optional[List[str]] = None,
             message: Optional[str] = None, info: Optional[StepInfo] = None, **extra: Any) -> FailureRecord:
        """Record a failure at ``info`` (default: the current step); the first failure of the process is kept
        (:meth:`mindguard.training.record.recorder.Recorder.fail`)."""
        return self.recorder.fail(kind, loss=loss, nonfinite=nonfinite, message=message, info=info, **extra)

    def fail_with_exception(self, exc_type: type, exc: BaseException, *,
                            training_ended: bool = False) -> Optional[FailureRecord]:
        """Record the exception that ended a training call (``KeyboardInterrupt`` as ``"interrupted"``), as
        :func:`mindguard.training.record.classify.classify_exception` decides. Raised between steps by the dataset
        pipeline, it is put at the next step with ``phase="between_steps"``. A :class:`HuntStop` is mindguard's own
        ending, not a failure; a ``SystemExit`` ends the run (``"finished"``). ``training_ended``: at interpreter exit,
        the training calls had ended normally before the exception."""
        decision = classify_exception(exc_type, exc, self._facts(training_ended))
        if decision.finished:
            self.end_exit()
            return None
        if not decision.record or decision.kind is None:
            return self.failure
        fields = self.iterations.for_exception(self.step_begun(), decision.phase)
        info = following_step(self.step, self.calls) if decision.next_step else self.step
        return self.recorder.fail_raised(decision, exc, info, fields)

    def _facts(self, training_ended: bool) -> RunFacts:
        reads_ahead = self.request is None or self.request.examine != "dataset"   # else the pipeline is synchronous
        mindspore = sys.modules.get("mindspore")
        try:
            on_cpu = mindspore is None or mindspore.get_context("device_target") == "CPU"
        except Exception:  # noqa: BLE001 - a context that cannot be read: as on a device (the cautious rule)
            on_cpu = False
        step = self.step
        return RunFacts(failed=self.failure is not None, step_under_way=self.step_begun() is not None,
                        any_step=step is not None, any_call=bool(self.calls), reads_ahead=reads_ahead,
                        training_ended=training_ended, on_cpu=on_cpu,
                        step_ended=step is not None and (step.end_us is not None or self.global_step > 1))

    def drop_states_at_exit(self) -> None:
        """At interpreter exit: a run that leaves nothing to hunt (it finished, was interrupted, or stopped on
        mindguard's own error) removes its kept states -- they resume nothing (docs/reference/run-folder.md)."""
        if self.run_id is None or self.step_begun() is not None:
            return
        if self.failure is None or not self.recorder.worth_a_hunt():
            self.state.drop()

    # -- nesting (model.fit's validation and model.eval enter the same callbacks again) -----------------
    def enter(self) -> int:
        self._depth += 1
        return self._depth

    def exit(self) -> int:
        self._depth = max(self._depth - 1, 0)
        return self._depth


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
    run = _RUN
    if run is None:
        return
    try:
        told_before = run.recorder.hunt_line.told
        callback_told = run.recorder.callback_told
        # an exception nothing caught ended the script (the interpreter keeps it as sys.last_value before it runs
        # the exit hooks): a watch loop's dataset that raised between steps, the script's own error -- the run
        # failed, it did not finish
        uncaught = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
        if uncaught is not None and run.failure is None and run.step is not None:
            ended = run.recorder.finished_at == run.step.global_step   # the training calls had ended normally
            run.fail_with_exception(type(uncaught), uncaught, training_ended=ended)
        if told_before and getattr(sys, "last_type", None) is not None:
            # the process ends with a traceback (LossMonitor raising on the NaN loss, watch's NonFiniteError) that
            # buried the line printed at the failure: print it again, last
            print(run.recorder.hunt_from_line(), file=sys.stderr, flush=True)
        elif callback_told and getattr(sys, "last_type", None) is not None:
            # (a callback's own error: the traceback printed last is the user's; say again whose it is)
            print(callback_note(run.failure), file=sys.stderr, flush=True)
        if run.failure is None and run.step_begun() is None:
            for check in list(run.end_checks.values()):   # a watch loop's last steps may be unchecked (budget)
                check()
        run.end_exit()
        run.drop_states_at_exit()
        _pass_end.at_exit(run, _pass_end.uncaught_exception())
    except Exception as exc:  # noqa: BLE001
        print(f"mindguard: could not mark the run finished at exit: {type(exc).__name__}: {exc}", file=sys.stderr)


def reset_run(request: Optional[HuntRequest] = None) -> Run:
    """Start a new run in this process (for tests and notebooks: one process, several independent trainings).
    Returns the new run. Any record the old run was writing is closed as it is."""
    global _RUN
    if _RUN is not None:
        _RUN.recorder.writer.close()
        _RUN.recorder.writer.release()
        _RUN.state.release()
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
        # the last batch: Model's loop would ask for epochs the data lacks
        if call.data_steps is not None and cur_step_num >= call.data_steps:
            run_context.request_stop()
    info = run.begin_step(call, cur_step_num, batch_num=cb_params.get("batch_num"), epoch=epoch)
    if info.skipped:
        run.fast_forward(call, cb_params, info)
    return info
