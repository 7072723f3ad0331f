"""``mindguard.watch``: the functional training loop of MindSpore 2.x, guarded like ``Model.train`` is by Guard.

::

    grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    @mindspore.jit                                   # optional
    def train_step(data, label):
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    train_step = mindguard.watch(train_step, net, optimizer)     # the one added line
    for data, label in dataset.create_tuple_iterator():
        loss = train_step(data, label)

Each call of the returned function is one training step, counted in the process's step count
(:mod:`mindguard.training.run`: the same count as Guard's, across nested epoch loops and other training calls). After
the step it checks the loss (the return value, or its first element) and every Parameter the step writes
(``net``'s weights and buffers, not the optimizer's moments); at the first failure it writes the record and
raises :class:`~mindguard.errors.NonFiniteError` (the loop has no stop request to send). An exception raised
by the step is recorded at that step and propagates unchanged.

Under ``mindguard hunt`` the failing call is examined at operator level when it ran compiled (an ``@jit``
``train_step``, or a Cell such as a ``TrainOneStepCell`` stepped in GRAPH mode: the hunt dumps it), else at cell level:
the call is re-run in place with hooks on every cell of ``net`` (PyNative), which names the first cell that turned
finite values into Inf/NaN.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import time
import types
from pathlib import Path
from typing import Any, Callable, List, Optional

import mindspore as ms
import numpy as np
from mindspore import nn

from .._util.args import require_bool, require_choice, require_int
from .._util.dist import per_rank_path, rank_info
from .._util.io import atomic_write_json, atomic_write_text
from .checks.params import as_network, named_objects, written_parameters
from .checks.budget import CHECK_FRACTION
from ..errors import ArgumentError, ArgumentTypeError, NonFiniteError
from .checks.finite import OutputChecker, ParamChecker, StepVerdict, refused_flag
from ..protocol import folder as layout
from .run import current_run
from .state import rng as _rng

UPDATE_FLAGS = ("applied", "refused")


def watch(train_step: Callable, net: nn.Cell, optimizer: Optional[nn.Cell] = None, *,
          record: Optional[str] = None, check_params: bool = True, action: str = "raise",
          update_flag: Optional[str] = None, max_skips: int = 0, check_every_step: bool = False,
          keep_state: bool = True, check_budget: float = CHECK_FRACTION) -> Callable:
    """Return ``train_step`` wrapped so that every call is a checked, counted, recorded training step.

    Args:
        train_step: the step function (eager or ``@mindspore.jit``), called with the loop's arguments.
        net: the network the step trains (its Parameters are checked; its cells get hooks when examined): an
            ``nn.Cell`` -- a container of several train cells and optimizers too (a GAN's) -- or a torch-style model
            (mindnlp) whose ``named_parameters()``/``parameters()`` yield MindSpore Parameters.
        optimizer: the optimizer the step applies (its trained Parameters are checked too).
        record: failure record path (default ``mindguard_failure.json``; the hunt's under ``mindguard hunt``).
        check_params: check every Parameter the step writes (finds the step whose update went bad; the loss often
            shows it steps later): outside ``mindguard hunt`` on a time budget and after a non-finite loss or an
            exception (:class:`~mindguard.FailureLocator`: the record may name a window of steps that
            ``mindguard hunt --from`` narrows), under the hunt or with ``check_every_step`` after every step.
        action: ``"raise"`` (:class:`~mindguard.errors.NonFiniteError` at the first failure) or ``"continue"``
            (record the first failure, keep going, check nothing more).
        update_flag: how to read a ``(loss, flag)`` return value of the functional loss-scaling idiom:
            ``"applied"`` -- ``flag`` is True when the update was applied (``is_finite = amp.all_finite(grads)``);
            ``"refused"`` -- True when it was refused (``GuardedTrainStep``'s convention). ``None``: a tuple's first
            element is the loss and the rest is not read.
        max_skips: consecutive refused updates tolerated (transient loss-scale overflows) before the refusal
            is recorded as ``"nonfinite_grads"`` (the weights are intact: the update was not applied).
        check_every_step, keep_state, check_budget: as for :class:`~mindguard.FailureLocator` (the state kept is
            the net's and the optimizer's Parameters).

    Returns:
        A function with ``train_step``'s signature and return value. ``.failure`` is the run's first failure;
        ``.steps`` the number of calls so far.
    """
    if not callable(train_step):
        raise ArgumentTypeError(f"watch(train_step=...) must be the step function, got {train_step!r}")
    model = as_network(net)
    if model is None:
        raise ArgumentTypeError(f"watch(net=...) must be the model the step trains: a mindspore.nn.Cell, or a "
                                f"torch-style model whose named_parameters() yields MindSpore Parameters (mindnlp); "
                                f"got "
                                f"{type(net).__name__}; e.g. mindguard.watch(train_step, net, optimizer)")
    net = model
    if optimizer is not None and not isinstance(optimizer, nn.Cell):
        raise ArgumentTypeError(f"watch(optimizer=...) must be the optimizer cell (nn.Optimizer) or None, got "
                                f"{type(optimizer).__name__}")
    require_bool("watch(check_params=...)", check_params)
    require_bool("watch(check_every_step=...)", check_every_step)
    require_bool("watch(keep_state=...)", keep_state)
    from .locator import _check_budget_arg

    check_budget = _check_budget_arg("watch", check_budget)
    require_choice("watch(action=...)", action, ("raise", "continue"),
                   explain='a functional loop has no stop request: "raise" ends it with NonFiniteError')
    if update_flag is not None:
        require_choice("watch(update_flag=...)", update_flag, UPDATE_FLAGS,
                       explain='"applied" when the step returns (loss, amp.all_finite(grads))')
    max_skips = require_int("watch(max_skips=...)", max_skips, minimum=0)
    if isinstance(train_step, _Watched):
        raise ArgumentError("watch(train_step=...) is already watched; wrap the step function once")
    current_run().prepare_training()  # before the loop builds its dataset iterator (the hunt may configure it)
    return _Watched(train_step, net, optimizer, record or layout.DEFAULT_RECORD, check_params, action,
                    update_flag, max_skips, check_every_step, keep_state, check_budget)


class _Watched:
    """The wrapper :func:`watch` returns (one training call of the run, for its whole lifetime)."""

    def __init__(self, step, net, optimizer, record, check_params, action, update_flag, max_skips,
                 check_every_step=False, keep_state=True, check_budget=CHECK_FRACTION):
        functools.update_wrapper(self, step)
        self._step, self._net, self._optimizer = step, net, optimizer
        self._record, self._check_params, self._action = record, check_params, action
        self._update_flag, self._max_skips = update_flag, max_skips
        self._compiled = bool(getattr(step, "__wrapped_by_jit__", False))
        self._outputs = OutputChecker()
        self._checker: Optional[ParamChecker] = None
        self._skips = 0
        self._params_lost = False   # mindguard's own error disabled the Parameter check (run.recorder.checks_lost)
        self._call = None
        self._check_every_step, self._keep_state, self._check_budget = check_every_step, keep_state, check_budget
        self.steps = 0
        self._loss_of: Optional[Callable[[Any], Any]] = None   # (attached steps: where the loss is read)
        self._drop_loss: Optional[Callable[[], Any]] = None   # (attached steps: forget a step's loss unread)
        if not check_params:
            current_run().recorder.note_params_count(0)

    @property
    def failure(self):
        return current_run().failure

    def __call__(self, *args, **kwargs):
        opened = self._open(end_skipped=False)
        if opened.info.skipped:
            return self._skipped(opened.info, args, kwargs)
        run = current_run()
        run.enter()
        try:
            if opened.replaying:
                opened.recording, out = self._recorded_call(args, kwargs)
            elif opened.compiling:
                out = self._compiled_call(args, kwargs)
            else:
                out = self._step(*args, **kwargs)
        except BaseException as exc:
            self._raised(exc)
            raise
        return self._close(opened, out, args)

    def _open(self, end_skipped: bool = True) -> "_Opened":
        """Begin one step (the count, the budget, the call): what the step's run is asked to do. A skipped step
        (a resumed hunt pass, before the kept state's step) is ended here already, unless ``end_skipped`` is
        False (:meth:`_skipped` ends it)."""
        run = current_run()
        run.recorder.add_path(self._record)
        if self._check_params and not self._check_every_step:
            run.watch_on_budget(keep_state=self._keep_state, fraction=self._check_budget)
        if self._call is None:   # before the first compile: random functions compiled from now on are this call's
            _rng.note_training_starts()
        if self._call is None or self._call is not (run.calls[-1] if run.calls else None):
            self._call = run.begin_call(self, self._net, kind="watch",
                                        examine="dump" if self._runs_compiled() else "replay",
                                        state_cells=(self._net, self._optimizer))
            if self._check_params:
                run.end_checks[id(self)] = self._check_at_end
        self.steps += 1
        call = self._call
        assert call is not None
        info = run.begin_step(call, call.last_cur_step + 1)
        request = run.request
        examining = request is not None and request.pass_name == "examine" and request.examine_step == info.global_step
        examine = request.examine if examining and request is not None else None
        replaying = examine == "replay"
        compiling = examine == "dump" and not self._runs_compiled() and isinstance(self._step, nn.Cell)
        if info.skipped and end_skipped:   # a resumed hunt pass: a step before the kept state's (training.state.resume)
            run.end_step(info)
        return _Opened(info, examining, replaying, compiling)

    def _skipped(self, info: Any, args: tuple, kwargs: dict) -> Any:
        """A step of a resumed hunt pass before the kept state's: the placeholder output, after running the step for
        real when it is a warm-up step (:mod:`mindguard.training.state.warm_up`; inside the step, so that nothing
        attaches to it). Ends the step."""
        run = current_run()
        resumer = run.state.resumer
        assert resumer is not None   # (only a resumed pass skips a step)
        try:
            if resumer.warm_up.now:
                run.enter()
                try:
                    resumer.warm_up.run(self._step, *args, **kwargs)
                finally:
                    run.exit()
        finally:
            if self._drop_loss is not None:   # (a loss its gradient function saw is no later step's)
                self._drop_loss()
            run.end_step(info)
        return resumer.placeholder()

    def _raised(self, exc: BaseException) -> None:
        """The step raised ``exc`` (the caller re-raises it): recorded at the step."""
        run = current_run()
        run.exit()
        info = run.step
        if isinstance(exc, Exception) and run.checks.budget is not None and self._check_params and info is not None:
            try:   # Parameters that went non-finite before the crash are the failure to examine
                names = self._checked_params(run, info)
                if names:
                    run.fail("nonfinite_params", nonfinite=names, info=info, phase="step",
                             message=f"parameters non-finite when the step raised: {', '.join(names[:5])}; then "
                                     f"the step raised {type(exc).__name__}: {str(exc)[:300]}")
            except Exception:  # noqa: BLE001 - never replace the training's own exception
                pass
        run.fail_with_exception(type(exc), exc)

    def _close(self, opened: "_Opened", out: Any, args: tuple) -> Any:
        """The step returned ``out``: check it and the Parameters; at a failure record it and (``action="raise"``)
        raise :class:`~mindguard.errors.NonFiniteError`. Returns ``out``."""
        run = current_run()
        info = opened.info
        run.exit()
        if run.failure is not None:
            run.end_step(info)
            return out
        if self.steps == 1 and self._loss_of is None:
            problem = self._returned_problem(out)
            if problem is not None:
                run.end_step(info)
                raise ArgumentTypeError(problem)
        run.events.step_outputs(info, out)
        value = out if self._loss_of is None else self._loss_of(out)
        verdict = self._verdict(value) if value is not None else StepVerdict()   # (None: no loss to read)
        if self._check_params and not self._params_lost and (
                run.checks.due(info) or (verdict.kind is not None and run.checks.budget is not None)):
            try:
                verdict.add_nonfinite_params(self._checked_params(run, info))
            except Exception as error:  # noqa: BLE001 - mindguard's own failure must not end the training
                from .locator import own_error

                if not own_error(run, error):
                    raise
                self._params_lost = True
                run.recorder.lose_check("Parameter", error, info.global_step, still="the loss check")
        kind, nonfinite, message = verdict.kind, verdict.nonfinite, verdict.message
        run.end_step(info)
        run.events.step_traced(info, verdict.loss, self._checker.last_sum
                               if self._checker is not None and run.checks.checked_at(info) else None)
        if opened.examining:
            run.examined = True
            if opened.recording is not None:
                self._write_replay(opened.recording, args, info)
        if kind is not None:
            failure = run.fail(kind, loss=verdict.loss, nonfinite=nonfinite, message=message, info=info,
                               phase="step")
            if self._action == "raise":
                raise NonFiniteError(f"mindguard: training went non-finite at {failure.format()}", failure)
        return out

    def _returned_problem(self, out: Any) -> Optional[str]:
        """Why the first call's return value cannot be checked (None: it can): with ``update_flag`` it must be
        ``(loss, flag)`` with a bool flag; without it, the loss (or a tuple whose first element is the loss)."""
        if self._update_flag is not None:
            if isinstance(out, (tuple, list)) and len(out) == 2 and refused_flag((out[0], out[1])) is not None:
                return None
            return (f"mindguard.watch(update_flag={self._update_flag!r}): train_step must return (loss, flag) with "
                    f"flag a bool Tensor (e.g. amp.all_finite(grads)), but it returned {_shape_of(out)}; return "
                    f"`loss, is_finite` from train_step, or drop update_flag")
        first = out[0] if isinstance(out, (tuple, list)) and out else out
        if isinstance(first, (ms.Tensor, float, int, np.generic, np.ndarray)) and not isinstance(first, bool):
            return None
        return (f"mindguard.watch: train_step must return its loss (a Tensor), or a tuple whose first element is the "
                f"loss, so that each step's loss can be checked; it returned {_shape_of(out)}")

    def _runs_compiled(self) -> bool:
        """Whether the step runs as a kernel graph, whose operators MindSpore's dump records: see
        :func:`runs_compiled` (asked at each training call: the mode can change between calls)."""
        return self._compiled or runs_compiled(self._step)

    def _verdict(self, out: Any) -> StepVerdict:
        if self._update_flag is None or not isinstance(out, (tuple, list)) or len(out) != 2:
            first = out[0] if isinstance(out, (tuple, list)) and out else out
            return self._outputs.check(first)
        flag = refused_flag((out[0], out[1]))
        if flag is None:
            return self._outputs.check(out[0])
        refused = flag if self._update_flag == "refused" else not flag
        verdict = self._outputs.check(out[0])
        if not refused:
            self._skips = 0
            return verdict
        self._skips += 1
        if self._skips <= self._max_skips and verdict.kind is None:
            return StepVerdict(loss=verdict.loss, refused=True)
        names = (["loss"] if verdict.kind else []) + ["gradients"]
        return StepVerdict("nonfinite_grads", verdict.loss, names,
                           f"gradients were non-finite and the update was refused ({self._skips} consecutive, "
                           f"max_skips={self._max_skips}; loss={verdict.loss})", refused=True)

    def _checked_params(self, run, info) -> List[str]:
        """Check the Parameters now, after step ``info``: the names of the non-finite ones (the run is told)."""
        start = time.perf_counter()
        names = self._nonfinite_params()
        setup = self._checker.take_setup_seconds() if self._checker is not None else 0.0
        run.events.params_checked(info, not names, time.perf_counter() - start, setup)
        return names

    def _check_at_end(self) -> None:
        """After the loop's last step (at interpreter exit: a loop has no end hook), check the Parameters once more
        when the budget left the last step unchecked, as Guard does at a training's end: non-finite ones are the
        run's failure, in the window since the last passing check. Never raises (the process is ending)."""
        run = current_run()
        info = run.step
        if (self._params_lost or run.checks.budget is None or run.failure is not None or info is None or info.skipped
                or run.checks.checked_at(info)):
            return
        try:
            names = self._checked_params(run, info)
        except Exception as error:  # noqa: BLE001 - mindguard's own failure is said, never blamed on the training
            self._params_lost = True
            run.recorder.lose_check("Parameter", error, info.global_step, still="the loss check")
            return
        if names:
            run.fail("nonfinite_params", nonfinite=names, info=info, phase="step",
                     message=f"parameters non-finite after the loop's last step: {', '.join(names[:5])}"
                             f"{' ...' if len(names) > 5 else ''}")

    def _nonfinite_params(self) -> List[str]:
        if self._checker is None:
            params = written_parameters(self._net, self._optimizer, extra=(self._optimizer,) if self._optimizer else ())
            state = {id(p) for p in self._optimizer.get_parameters()} if self._optimizer is not None else set()
            params += _referenced_parameters(self._step, {id(p) for p in params} | state)   # not its moments again
            self._checker = ParamChecker(params)
            current_run().recorder.note_params_count(len(params))
        return self._checker.nonfinite_names()

    def _compiled_call(self, args, kwargs):
        """Run a Cell step that trains eagerly (PyNative) as one GRAPH-mode graph, for the hunt to dump it: its
        second examiner when the eager replay isolated no operator (a gradient taken inside the loss cell runs as
        one call there). The mode is restored after the call. A step that does not compile runs eagerly instead
        (its dump then holds no file of the step, and the hunt keeps the replay's answer); an error of the compiled
        step's own run propagates (running it again eagerly would apply its updates twice)."""
        mode = ms.get_context("mode")
        ms.set_context(mode=ms.GRAPH_MODE)
        try:
            try:
                self._step.compile(*args, **kwargs)   # the call below runs this compiled graph (cached by phase)
            except Exception:  # noqa: BLE001 - not compilable as a graph: the step as the training runs it
                ms.set_context(mode=mode)
                return self._step(*args, **kwargs)
            return self._step(*args, **kwargs)
        finally:
            ms.set_context(mode=mode)

    def _recorded_call(self, args, kwargs):
        """Run the step eagerly with every operator call recorded (the hunt's examination of an eager step: the
        step runs as it would, in place, so no capture is needed). Returns ``(recording, output)``."""
        from .examine.replay import InPlaceRecording

        recording = InPlaceRecording(self._net, self._optimizer)
        recording.start()
        try:
            out = self._step(*args, **kwargs)
        except BaseException as exc:
            recording.close(type(exc), exc, exc.__traceback__)
            info = current_run().step
            report = recording.stopped(info.global_step - 1) if info is not None else None
            if report is not None:   # the step raised in a recorded op: that op is the examination's answer
                self._save_replay(report)
            raise
        return recording, out

    def _write_replay(self, recording, args, info) -> None:
        """The operator-level answer for the examined step (``replay.json``/``.txt``, as Guard writes them)."""
        self._save_replay(recording.finish(args, written_parameters(self._net, self._optimizer), info.global_step - 1))

    def _save_replay(self, report) -> None:
        request = current_run().request
        target = per_rank_path((request.replay_report if request is not None else None)
                               or Path(layout.DEFAULT_REPLAY), *rank_info())
        atomic_write_json(target, report.to_dict())
        atomic_write_text(layout.replay_text(target), str(report) + "\n")


@dataclasses.dataclass
class _Opened:
    """One begun step of a watched function: its :class:`~mindguard.training.step.steps.StepInfo` and what the hunt asks
    of it (examined by an in-place replay, or compiled for a dump)."""

    info: Any
    examining: bool = False
    replaying: bool = False
    compiling: bool = False
    recording: Any = None


def runs_compiled(step: Callable) -> bool:
    """Whether calling ``step`` runs one compiled kernel graph (examined by dump) rather than eager operators
    (examined by replay): an ``@jit`` function or ``jit(cell)``; a Cell whose ``construct`` is ``@jit``; any Cell
    called in GRAPH mode (``Cell.__call__`` compiles its ``construct`` then, unless ``MS_JIT=0``: a
    ``TrainOneStepCell`` stepped by hand is the most common zoo loop). A plain function is eager even in GRAPH mode
    (measured on 2.10 CPU: the forward and backward of ``value_and_grad`` run op by op; only the optimizer's graph
    runs every step)."""
    if getattr(step, "__wrapped_by_jit__", False):
        return True
    if not isinstance(step, nn.Cell):
        return False
    if getattr(type(step).construct, "__wrapped_by_jit__", False):
        return True
    return ms.get_context("mode") == ms.GRAPH_MODE and os.getenv("MS_JIT") != "0"


def _shape_of(value: Any) -> str:
    """A short description of a return value: ``"a tuple of (Tensor, float)"``, ``"None"``."""
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of ({', '.join(type(v).__name__ for v in value)})"
    return "None" if value is None else f"a {type(value).__name__}"


def _referenced_parameters(step: Callable, known: set) -> List[ms.Parameter]:
    """Floating-point Parameters the step function reaches by name besides the net's and optimizer's: those of the
    cells and plain objects its code names as globals or closes over (MindSpore's gradient-accumulation tutorial
    keeps the summed gradients in an ``Accumulator`` object's cloned Parameters, where a NaN gradient waits for the
    next update). One level deep; modules, classes and functions are skipped."""
    objects, _ = named_objects(step)
    found: List[ms.Parameter] = []
    for obj in objects:
        if isinstance(obj, (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType)):
            continue
        try:
            if isinstance(obj, nn.Cell):
                candidates = list(obj.get_parameters())
            else:
                values = list(vars(obj).values())
                candidates = [v for v in values if isinstance(v, ms.Parameter)]
                candidates += [p for v in values if isinstance(v, ms.ParameterTuple) for p in v]
        except Exception:  # noqa: BLE001 - no __dict__, or an object that cannot be looked into: not checked
            continue
        for param in candidates:
            if id(param) not in known and param.dtype in (ms.float32, ms.float16, ms.bfloat16, ms.float64):
                known.add(id(param))
                found.append(param)
    return found
