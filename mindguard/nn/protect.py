"""Weight protection: a training step that refuses to apply non-finite gradients.

:class:`GuardedTrainStep` is a drop-in for ``mindspore.nn.TrainOneStepCell``. Inside the compiled step it
checks the loss and every gradient with one fused all-finite reduction and runs the optimizer only when
all of them are finite, so one bad batch cannot turn the weights (or the optimizer's moments) into NaN.
It returns ``(loss, refused)``; ``refused`` has the meaning of ``TrainOneStepWithLossScaleCell``'s
``out[1]`` (True = the update was not applied) and works on every device (no NPU float-status ops).

:class:`SkipPolicy` is the callback that ends ``Model.train`` gracefully once more than ``max_skips``
consecutive steps were refused; :func:`guard_model` turns a ``Model(net, loss_fn, optimizer)`` into one
that trains through a GuardedTrainStep, without touching the rest of the training script.

The finiteness check (one fused, overflow-safe reduction) is :class:`mindguard.training.checks.finite.AllFinite`.
"""
from __future__ import annotations

import logging
import math
import numbers
from typing import Any, Optional

from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype
from mindspore.context import ParallelMode
from mindspore.nn.wrap.grad_reducer import DistributedGradReducer
from mindspore.parallel._utils import _get_device_num, _get_gradients_mean, _get_parallel_mode
from mindspore.train import Callback, Model

from ..errors import ArgumentError, ArgumentTypeError, RefusedStepsError
from ..training.checks.finite import AllFinite, refused_flag

logger = logging.getLogger("mindguard")

__all__ = ["GuardedTrainStep", "SkipPolicy", "RefusedStepsError", "guard_model"]

_MATMUL_CHECKED = (mstype.float32, mstype.float16, mstype.bfloat16)


class GuardedTrainStep(nn.Cell):
    """Drop-in for ``nn.TrainOneStepCell`` that applies the optimizer only when the loss and every gradient
    are finite.

    Args:
        network_with_loss: a Cell returning the (scalar) loss, e.g. ``nn.WithLossCell(net, loss_fn)``.
        optimizer: a MindSpore optimizer over the parameters to train.
        sens: the value backpropagation starts from (``TrainOneStepCell``'s ``sens``; a fixed loss scale
            goes here, the optimizer's ``loss_scale`` undoes it). A finite non-zero number.
        max_skips: how many *consecutive* refused steps are tolerated. ``0`` (default): the first refused
            step ends training; ``k``: up to ``k`` in a row are skipped, the ``k+1``-th ends training; a
            step whose update is applied resets the count.

    Outputs:
        ``(loss, refused)``: the step's loss as computed (finite or not) and a bool scalar Tensor, True when
        the update was not applied. On a refused step the parameters and the optimizer's state (moments,
        beta powers, ``global_step``, hence the learning-rate schedule) stay bit-identical.

    Stopping. The cell cannot end ``Model.train`` itself. It counts refusals on the host after each call
    (``steps``, ``consecutive_refusals``, ``total_refusals``, ``should_stop``) and logs every refusal on
    the ``"mindguard"`` logger. A callback ends training gracefully when ``should_stop`` turns True:
    :class:`SkipPolicy`, or ``FailureLocator``/``Guard``. If nothing does and the step is called again,
    that call raises :class:`RefusedStepsError` instead of training on. In a custom loop, check
    ``step.should_stop`` (or the returned ``refused``) after each call; call :meth:`reset` to go on anyway.

    Host-side attributes (plain Python, updated after each call): ``steps`` -- calls so far, so the
    1-based index of the last step (equal to ``cur_step_num`` in a fresh ``Model.train``);
    ``last_refused_step`` -- 1-based index of the last refused call or None; ``consecutive_refusals``;
    ``total_refusals``; ``max_skips``; ``should_stop`` -- ``consecutive_refusals > max_skips``.

    Distributed: in data/hybrid-parallel mode gradients go through ``DistributedGradReducer`` exactly as
    in ``TrainOneStepCell``, and whenever the parallel mode is not stand-alone the refusal flag is
    all-reduced, so every rank refuses the same steps and the replicas never diverge.
    """

    # host-side bookkeeping (set in __init__; never enters the graph)
    max_skips: int
    steps: int
    consecutive_refusals: int
    total_refusals: int
    _stop_handled: bool

    def __init__(self, network_with_loss: nn.Cell, optimizer: nn.Cell, *, sens: float = 1.0, max_skips: int = 0):
        if not isinstance(network_with_loss, nn.Cell):
            raise ArgumentTypeError(f"GuardedTrainStep: network_with_loss must be a mindspore.nn.Cell returning the "
                                    f"loss, "
                            f"got {type(network_with_loss).__name__}; wrap your network as "
                            f"nn.WithLossCell(net, loss_fn)")
        if not isinstance(optimizer, nn.Cell) or not hasattr(optimizer, "parameters"):
            raise ArgumentTypeError(f"GuardedTrainStep: optimizer must be a MindSpore optimizer (nn.Optimizer), got "
                            f"{type(optimizer).__name__}; e.g. nn.SGD(net.trainable_params(), learning_rate=0.01)")
        if isinstance(sens, bool) or not isinstance(sens, numbers.Real) or not math.isfinite(sens) or sens == 0:
            raise ArgumentError(f"GuardedTrainStep: sens={sens!r} must be a finite non-zero number "
                             f"(the backpropagation start value; 1.0 unless you use a fixed loss scale)")
        if isinstance(max_skips, bool) or not isinstance(max_skips, numbers.Integral) or max_skips < 0:
            raise ArgumentError(f"GuardedTrainStep: max_skips={max_skips!r} must be an int >= 0 (0 stops at the first "
                             f"refused step, k tolerates k consecutive refused steps)")
        super().__init__(auto_prefix=False)
        self.network = network_with_loss
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = self.optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = float(sens)
        self.max_skips = int(max_skips)

        # Parallel set-up mirrors nn.TrainOneStepCell (MindSpore 2.10 cell_wrapper.py).
        self.grad_reducer = nn.Identity()
        self.parallel_mode = _get_parallel_mode()
        self.reducer_flag = self.parallel_mode in (ParallelMode.DATA_PARALLEL, ParallelMode.HYBRID_PARALLEL)
        if self.reducer_flag:
            self.grad_reducer = self._build_grad_reducer()
        self.is_distributed = self.parallel_mode != ParallelMode.STAND_ALONE
        self.allreduce = ops.AllReduce() if self.is_distributed else None
        self._get_attr_from_cell(network_with_loss)

        self.all_finite = AllFinite(self.weights)

        # Host-side bookkeeping (never enters the graph).
        self.steps = 0
        self.consecutive_refusals = 0
        self.total_refusals = 0
        self.last_refused_step: Optional[int] = None
        self._stop_handled = False

    def _build_grad_reducer(self):
        mean = _get_gradients_mean()
        degree = _get_device_num()
        from mindspore.communication.management import GlobalComm

        group = GlobalComm.WORLD_COMM_GROUP
        if isinstance(self.optimizer, (nn.AdaSumByGradWrapCell, nn.AdaSumByDeltaWeightWrapCell)):
            from mindspore.communication.management import create_group, get_group_size, get_rank

            group_number = get_group_size() // 8
            degree = int(degree / group_number)
            group_list = [list(range(x * degree, (x + 1) * degree)) for x in range(group_number)]
            current_index = get_rank() // 8
            group = "allreduce_" + str(current_index)
            create_group(group, group_list[current_index])
        return DistributedGradReducer(self.weights, mean, degree, group=group)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.grad_reducer(grads)
        refused = ops.logical_not(self.all_finite(loss, grads))
        if self.is_distributed:
            votes = self.allreduce(ops.reshape(ops.cast(refused, mstype.float32), (1,)))
            refused = ops.reshape(votes > 0, ())
        if not refused:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, refused

    # ----- host side -------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        if self.should_stop:
            if not self._stop_handled:
                raise RefusedStepsError(
                    f"GuardedTrainStep refused {self.consecutive_refusals} consecutive step(s) (last: step "
                    f"{self.last_refused_step}), more than max_skips={self.max_skips}, and training went on. "
                    f"Parameters are unchanged since the last applied step. To stop gracefully add "
                    f"mindguard.SkipPolicy() (or mindguard.Guard()) to Model.train's callbacks, or check "
                    f"step.should_stop in your loop; raise max_skips to tolerate more; call step.reset() to "
                    f"go on anyway.")
            self.reset()
        out = super().__call__(*args, **kwargs)
        self.observe(out[1])
        return out

    def observe(self, refused: Any) -> bool:
        """Count one step's outcome (called by ``__call__``; call it yourself only if the step runs inside
        another graph). Returns the refusal as a Python bool and logs it."""
        refused = bool(refused.asnumpy()) if isinstance(refused, Tensor) else bool(refused)
        self.steps += 1
        if refused:
            self.consecutive_refusals += 1
            self.total_refusals += 1
            self.last_refused_step = self.steps
            logger.warning("mindguard: step %d refused: the loss or a gradient is not finite; parameters and "
                           "optimizer state left unchanged (%d consecutive refusal(s), max_skips=%d)",
                           self.steps, self.consecutive_refusals, self.max_skips)
        else:
            self.consecutive_refusals = 0
        return refused

    @property
    def should_stop(self) -> bool:
        """True once more than ``max_skips`` consecutive steps were refused."""
        return self.consecutive_refusals > self.max_skips

    def acknowledge_stop(self) -> None:
        """Called by the callback that ended training because of :attr:`should_stop`: the next call (a new
        training) starts a fresh count instead of raising :class:`RefusedStepsError`."""
        self._stop_handled = True

    def reset(self) -> None:
        """Forget consecutive refusals (``steps`` and ``total_refusals`` keep counting)."""
        self.consecutive_refusals = 0
        self._stop_handled = False


class SkipPolicy(Callback):
    """Ends ``Model.train`` after the step that makes a :class:`GuardedTrainStep` exceed its ``max_skips``
    consecutive refusals (``run_context.request_stop()``; ``on_train_epoch_end``/``on_train_end`` still run).

    Use with ``Model(GuardedTrainStep(...))`` or :func:`guard_model`. ``FailureLocator`` and ``Guard``
    honour the same rule, so this callback is only needed when neither of them is used.
    """

    def __init__(self):
        self.stopped_at: Optional[int] = None  # 1-based global step (cur_step_num) at which training was stopped

    def on_train_begin(self, run_context):
        step = run_context.original_args().get("train_network")
        if not isinstance(step, GuardedTrainStep):
            raise ArgumentTypeError(f"SkipPolicy needs a Model that trains through mindguard.GuardedTrainStep, but its "
                                    f"train "
                            f"network is {type(step).__name__}; build Model(GuardedTrainStep(loss_net, optimizer)) "
                            f"or use model = mindguard.guard_model(model)")
        self._observed = step.steps
        self.stopped_at = None

    def on_train_step_end(self, run_context):
        cb_params = run_context.original_args()
        step = cb_params.get("train_network")
        if step.steps == self._observed:
            # The step ran inside another graph (dataset sink mode): count the window's last outcome.
            outputs = cb_params.get("net_outputs")
            if refused_flag(outputs) is not None:
                step.observe(outputs[1])
        self._observed = step.steps
        if step.should_stop:
            self.stopped_at = cb_params.get("cur_step_num")
            logger.error("mindguard: stopping training at global step %s: %d consecutive refused step(s) > "
                         "max_skips=%d", self.stopped_at, step.consecutive_refusals, step.max_skips)
            step.acknowledge_stop()
            run_context.request_stop()


def guard_model(model: Model, *, max_skips: int = 0) -> Model:
    """Return a new ``Model`` that trains the same network, loss and optimizer through :class:`GuardedTrainStep`.

    For a model built as ``Model(net, loss_fn, optimizer, metrics=..., eval_network=...)``: the loss network
    and ``sens`` are taken from the ``TrainOneStepCell`` MindSpore built (so an ``amp_level`` cast network and
    a ``FixedLossScaleManager(drop_overflow_update=False)`` scale carry over), and the metrics, evaluation
    and prediction networks are kept. Models whose training cell is anything else (a loss-scale cell with
    a dynamic manager, boost, gradient accumulation, or a ready-made train cell) are refused with the reason
    and the fix. The original model is left as it was; use the returned one.
    """
    if not isinstance(model, Model):
        raise ArgumentTypeError(f"guard_model expects a mindspore.train.Model, got {type(model).__name__}")
    train = getattr(model, "_train_network", None)
    if isinstance(train, GuardedTrainStep):
        return model
    if getattr(model, "_optimizer", None) is None:
        raise ArgumentError(
            f"guard_model: this Model was given a ready train cell ({type(train).__name__}) instead of "
            f"Model(net, loss_fn, optimizer), so there is no loss network and optimizer to re-wrap. "
            f"Fix: build Model(mindguard.GuardedTrainStep(nn.WithLossCell(net, loss_fn), optimizer)) yourself.")
    if train is None or type(train) is not nn.TrainOneStepCell:  # pylint: disable=unidiomatic-typecheck
        reason = _why_not_carried(model, train)
        raise ArgumentError(f"guard_model: cannot guard this Model: MindSpore built a {type(train).__name__} for it, "
                         f"not a plain nn.TrainOneStepCell, so its training behaviour can't be carried into "
                         f"GuardedTrainStep. Cause: {reason}.")
    sens = float(train.sens) if getattr(train, "sense_flag", False) else 1.0
    step = GuardedTrainStep(train.network, train.optimizer, sens=sens, max_skips=max_skips)
    inputs = train.get_inputs()
    if inputs:
        step.set_inputs(*inputs)
    metrics = model._metrics if getattr(model, "_metric_fns", None) else None  # pylint: disable=protected-access
    eval_indexes = getattr(model, "_eval_indexes", None) if metrics else None
    guarded = Model(step, metrics=metrics, eval_network=model._eval_network,  # pylint: disable=protected-access
                    eval_indexes=eval_indexes)
    # Model(step) would predict with the train step itself; predict with the user's network instead.
    guarded._predict_network = model._predict_network  # pylint: disable=protected-access
    return guarded


def _why_not_carried(model: Model, train) -> str:
    if getattr(model, "_loss_scale_manager", None) is not None:
        return (f"loss_scale_manager={type(model._loss_scale_manager).__name__}: its dynamic loss scaling already "  # pylint: disable=protected-access
                f"skips overflowing steps (out[1] is the same refused flag, and FailureLocator reads it); keep that "
                f"Model as is, or drop the manager / use FixedLossScaleManager(drop_overflow_update=False) to guard it")
    if getattr(model, "_boost_level", "O0") != "O0":
        return (f"boost_level={model._boost_level!r}: build the Model with boost_level='O0' to guard it")  # pylint: disable=protected-access
    return ("pipeline stages or gradient accumulation: wrap your own loss network as "
            "Model(mindguard.GuardedTrainStep(loss_net, optimizer)) if accumulation is not needed")
