"""Loss scaling judged by facts (issue 50): a loss scaler's healthy warm-up is never stopped as a collapse.

The model zoo's CPU dynamic loss-scale train cell (``mindspore.amp.all_finite`` for the overflow flag,
``nn.DynamicLossScaleUpdateCell(loss_scale_value=2**40, scale_factor=2, scale_window=1000)``; MindSpore's stock
``TrainOneStepWithLossScaleCell`` does not compile on CPU) skips its first 20-odd steps while the scale comes down,
then trains. Before, Guard stopped it at step 20 ("20 consecutive loss-scale overflows"). Now
(:class:`mindguard.training.checks.loss_scale.LossScaleRule`):

* real MindSpore (GRAPH and PyNative, ``Model.train``): the warm-up trains to the end under Guard, its losses bit for
  bit those of the same script without mindguard; gradients non-finite at every scale are a collapse at the step
  whose scale was the floor -- whether the cell reports the scale after its update (the zoo cell, measured) or
  before it (one step later then); a fixed scale is a collapse after ``max_overflow_steps``; ``min_loss_scale``
  above the scaler's floor stops at the first overflow *at* that scale;
* the rule's edge cases on plain numbers (``fast``: no MindSpore).
"""
from __future__ import annotations

import json
from typing import List, Optional, Tuple

import numpy as np
import pytest

from mindguard.training.checks.loss_scale import LossScaleRule

WARMUP_SCALE = 2.0 ** 40
BATCH, IN_DIM = 4, 8


# -- the rule on plain numbers (fast) -----------------------------------------------------------------------------

def feed(rule: LossScaleRule, steps: List[Tuple[bool, Optional[float]]]) -> Tuple[Optional[int], Optional[str]]:
    """Feed ``(overflow, scale)`` steps; the 1-based step of the first collapse and its message, or ``(None, None)``."""
    for number, (overflow, scale) in enumerate(steps, 1):
        why = rule.step(overflow, scale)
        if why is not None:
            return number, why
    return None, None


def halving(start: float, overflows: int, *, report: str = "after", floor: float = 1.0):
    """``overflows`` overflow steps of a DynamicLossScaleUpdateCell (x1/2 an overflow, never below ``floor``), as a
    cell reports them: the scale ``"after"`` the step's update (the zoo cell) or ``"before"`` it."""
    steps, scale = [], start
    for _ in range(overflows):
        after = max(scale / 2, floor)
        steps.append((True, after if report == "after" else scale))
        scale = after
    return steps, scale


@pytest.mark.fast
@pytest.mark.parametrize("report", ["after", "before"])
def test_a_streak_of_40_overflows_while_the_scale_comes_down_is_healthy(report):
    rule = LossScaleRule()
    warmup, scale = halving(2.0 ** 45, 40, report=report)     # 2**45 -> 2**5: 40 overflows, twice the old limit
    healthy = [(False, scale)] * 10
    assert feed(rule, warmup + healthy) == (None, None)
    assert rule.overflows == 0 and rule.last_scale == scale
    # a later streak starts afresh from the scale before it (here a scale set back to 2**45 by the script)
    assert feed(rule, halving(2.0 ** 45, 40, report=report)[0]) == (None, None)
    assert rule.overflows == 40 and rule.start_scale == 2.0 ** (45 if report == "before" else 44)


@pytest.mark.fast
def test_the_scale_at_its_floor_is_a_collapse_when_the_step_used_the_floor_scale():
    # reported after the update (the zoo cell): 2**3 -> overflows report 4, 2, 1 (the step that used 2), then 1
    # again: that step used the floor scale 1
    steps = [(False, 8.0)] + halving(8.0, 10)[0]
    assert [s for _, s in steps[:6]] == [8.0, 4.0, 2.0, 1.0, 1.0, 1.0]
    number, why = feed(LossScaleRule(), steps)
    assert number == 5 and "at its floor" in why, why
    # reported before the update: 8, 4, 2, 1 (the step that used 1) ... one step later (the rule cannot tell a
    # report of 1 that follows a 2 from the step that used 2)
    number, why = feed(LossScaleRule(), [(False, 8.0)] + halving(8.0, 10, report="before")[0])
    assert number == 6 and "at its floor" in why, why
    # healthy at the floor, then one overflow there: at once (4 overflows in a row would not stop a scale coming down)
    assert feed(LossScaleRule(), [(False, 1.0)] * 3 + [(True, 1.0)]) [0] == 4
    # the first step of all: no scale before it -- the next overflow says it
    assert feed(LossScaleRule(), [(True, 1.0), (True, 1.0)])[0] == 2
    # a user's min_loss_scale above the scaler's floor: the first overflow that used it
    number, why = feed(LossScaleRule(min_loss_scale=2.0 ** 18), [(False, 2.0 ** 20)] + halving(2.0 ** 20, 30)[0])
    assert number == 4 and "min_loss_scale 262144" in why, why   # used 2**20, 2**19, then 2**18


@pytest.mark.fast
def test_a_scale_that_does_not_come_down_is_a_collapse_at_max_overflow_steps():
    number, why = feed(LossScaleRule(), [(False, 1024.0)] + [(True, 1024.0)] * 30)
    assert number == 1 + 20 and "does not come down (max_overflow_steps=20)" in why, why
    assert feed(LossScaleRule(max_overflow_steps=5), [(True, 1024.0)] * 30)[0] == 5
    # a scale that is not read (or not a number): the same limit
    assert feed(LossScaleRule(), [(True, None)] * 30)[0] == 20
    assert feed(LossScaleRule(), [(True, float("nan"))] * 30)[0] == 20
    # a scale that rises during the streak does not come down either
    rising = [(True, 2.0 ** k) for k in range(10, 40)]
    assert feed(LossScaleRule(), rising)[0] == 20
    # a healthy step ends the streak: 19 overflows, one good step, 19 more are no collapse
    assert feed(LossScaleRule(), ([(True, 1024.0)] * 19 + [(False, 1024.0)]) * 3) == (None, None)


@pytest.mark.fast
def test_a_streak_too_long_for_a_scale_coming_down_is_a_collapse():
    # the scale comes down by 10 % an overflow from 2**10: allowed 20 + 2 * 10 = 40 overflows in a row
    steps = [(False, 1024.0)] + [(True, 1024.0 * 0.9 ** k) for k in range(1, 60)]
    number, why = feed(LossScaleRule(), steps)
    assert number == 1 + 41 and "not coming down fast enough" in why and "allow (40)" in why, why
    rule = LossScaleRule()
    rule.step(False, 2.0 ** 40)
    rule.step(True, 2.0 ** 39)
    assert rule.allowance() == 20 + 2 * 40
    # the zoo's scaler (x1/2) from 2**40 meets the floor (step 42 here) long before that allowance (101 overflows)
    number, why = feed(LossScaleRule(), [(False, WARMUP_SCALE)] + halving(WARMUP_SCALE, 120)[0])
    assert number == 1 + 41 and "at its floor" in why, why


# -- real MindSpore: the zoo's CPU loss-scale cell under Model.train ------------------------------------------------

def build(kind: str, *, scale: float = WARMUP_SCALE, report: str = "after"):
    """A small Dense network in float16 and the model zoo's CPU loss-scale train cell over it, with weights from a
    fixed numpy seed (the same network in every build). ``kind``: ``"warmup"`` (trains once the scale is low enough),
    ``"broken"`` (a gate ``sqrt(g)`` at ``g = 0``: the loss is finite, its gradient Inf at any scale), ``"fixed"``
    (broken, at a fixed scale). ``report``: the cell returns the scale ``"after"`` its update (the zoo's
    ``scaling_sens``: measured, the updated value) or ``"before"`` it (a copy taken before the update)."""
    import mindspore as ms
    from mindspore import nn, ops
    from mindspore.amp import all_finite

    grad_scale = ops.MultitypeFuncGraph("grad_scale")

    @grad_scale.register("Tensor", "Tensor")
    def _tensor_grad_scale(scale_value, grad):
        return grad * ops.cast(ops.reciprocal(scale_value), ops.dtype(grad))

    class Regressor(nn.Cell):
        def __init__(self, gated: bool):
            super().__init__()
            self.body = nn.SequentialCell(nn.Dense(IN_DIM, 16), nn.ReLU(), nn.Dense(16, 1)).to_float(ms.float16)
            self.gated = gated
            self.gate = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="gate")

        def construct(self, x):
            out = ops.cast(self.body(x), ms.float32)
            if self.gated:
                out = out * (1 + ops.sqrt(self.gate))
            return out

    class TrainOneStepWithDynamicLossScaleCell(nn.TrainOneStepCell):
        """The model zoo's CPU shape: scaled grads, all_finite, the update cell, the optimizer skipped on overflow."""

        def __init__(self, network, optimizer, scale_update_cell):
            super().__init__(network, optimizer)
            self.loss_scaling_manager = scale_update_cell
            self.scale_sense = ms.Parameter(ms.Tensor(scale_update_cell.get_loss_scale(), ms.float32),
                                            name="scale_sense")
            self.hyper_map = ops.HyperMap()
            self.report_before = report == "before"

        def construct(self, data, label):
            loss = self.network(data, label)
            scaling_sens = self.scale_sense
            before = scaling_sens * 1.0
            sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
            grads = self.grad(self.network, self.weights)(data, label, sens)
            grads = self.hyper_map(ops.partial(grad_scale, scaling_sens), grads)
            grads = self.grad_reducer(grads)
            overflow = ops.logical_not(all_finite(grads))
            overflow = self.loss_scaling_manager(self.scale_sense, overflow)
            if not overflow:
                loss = ops.depend(loss, self.optimizer(grads))
            if self.report_before:
                return loss, overflow, before
            return loss, overflow, scaling_sens

    ms.set_seed(0)   # the weights come from numpy below; a seed set keeps Guard's reproducibility warning quiet
    net = Regressor(gated=kind != "warmup")
    rng = np.random.RandomState(7)
    for param in net.trainable_params():
        if param.name != "gate":
            param.set_data(ms.Tensor(rng.uniform(-0.3, 0.3, param.shape).astype(np.float32)))
    if kind == "fixed":
        manager = nn.FixedLossScaleUpdateCell(loss_scale_value=scale)
    else:
        manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=scale, scale_factor=2, scale_window=1000)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    return net, TrainOneStepWithDynamicLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), optimizer, manager)


def dataset(steps: int):
    import mindspore.dataset as ds

    rng = np.random.RandomState(3)
    x = rng.uniform(-1, 1, (steps * BATCH, IN_DIM)).astype(np.float32)
    y = (x.sum(axis=1, keepdims=True) * 0.25).astype(np.float32)
    return ds.NumpySlicesDataset((x, y), ["data", "label"], shuffle=False).batch(BATCH)


def step_log():
    from mindspore.train import Callback

    class StepLog(Callback):
        """Every step's global step, loss, overflow flag and reported scale (read at the step's end)."""

        def __init__(self):
            super().__init__()
            self.steps: List[int] = []
            self.losses: List[float] = []
            self.overflows: List[bool] = []
            self.scales: List[float] = []

        def on_train_step_end(self, run_context):
            cb = run_context.original_args()
            loss, overflow, scale = cb.net_outputs
            self.steps.append(cb.cur_step_num)
            self.losses.append(np.float32(loss.asnumpy()))
            self.overflows.append(bool(overflow.asnumpy()))
            self.scales.append(float(scale.asnumpy()))

    return StepLog()


def train(kind: str, callbacks, *, steps_per_epoch: int, epochs: int, **build_kwargs):
    from mindspore.train import Model

    net, cell = build(kind, **build_kwargs)
    log = step_log()
    Model(cell).train(epochs, dataset(steps_per_epoch), callbacks=[*callbacks, log], dataset_sink_mode=False)
    return net, log


def longest_streak(flags: List[bool]) -> int:
    best = run = 0
    for flag in flags:
        run = run + 1 if flag else 0
        best = max(best, run)
    return best


def test_the_zoo_warmup_from_2_40_trains_to_the_end_bit_for_bit_as_without_mindguard(ms_mode, tmp_path):
    """The 24 steps skipped in a row while the scale comes down from 2**40 are no collapse: Guard lets the training
    run every step, and its losses, flags, scales and final weights are those of the same script without mindguard."""
    import mindguard

    steps_per_epoch, epochs = 20, 2   # steps 1-24 overflow, 25 trains, 29 overflows once more
    bare_net, bare = train("warmup", [], steps_per_epoch=steps_per_epoch, epochs=epochs)
    guard = mindguard.Guard(record=str(tmp_path / "guarded" / "failure.json"))
    net, guarded = train("warmup", [guard], steps_per_epoch=steps_per_epoch, epochs=epochs)

    assert guarded.steps == list(range(1, steps_per_epoch * epochs + 1)), guarded.steps
    assert guard.failure is None, guard.failure
    record = json.loads((tmp_path / "guarded" / "failure.json").read_text())
    assert record["status"] == "finished", record
    # the warm-up: a streak longer than the old limit of 20, the scale halving, then training
    assert longest_streak(guarded.overflows) > 20 and guarded.overflows[:21] == [True] * 21, guarded.overflows
    assert guarded.scales[0] == WARMUP_SCALE / 2, guarded.scales   # the scale after the first step's update
    assert not any(guarded.overflows[-10:]) and all(np.isfinite(guarded.losses)), guarded.overflows
    # the differential: the bare script trained exactly the same
    assert bare.steps == guarded.steps
    assert np.array_equal(np.array(bare.losses), np.array(guarded.losses)), (bare.losses, guarded.losses)
    assert (bare.overflows, bare.scales) == (guarded.overflows, guarded.scales)
    for mine, theirs in zip(net.trainable_params(), bare_net.trainable_params()):
        assert np.array_equal(mine.asnumpy(), theirs.asnumpy()), mine.name


@pytest.mark.parametrize("report, collapse_step", [
    ("after", 41),    # steps 1-40 use 2**40 ... 2; step 40 reports 1 (after its update), step 41 used 1
    ("before", 42),   # step 41 used 1 and reports it; only step 42's report of 1 after a 1 proves the floor
])
def test_gradients_nonfinite_at_every_scale_collapse_at_the_floor(ms_mode, tmp_path, report, collapse_step):
    """A gradient Inf at any scale (``sqrt`` of a zero gate: the loss stays finite): the scaler halves the scale to
    its floor, and Guard records ``loss_scale_collapse`` at the step that overflowed with the floor scale (no
    earlier: it cannot tell it apart from a warm-up before)."""
    import mindguard

    guard = mindguard.Guard(record=str(tmp_path / "failure.json"))
    net, log = train("broken", [guard], steps_per_epoch=20, epochs=3, report=report)
    failure = guard.failure
    assert failure is not None and (failure.kind, failure.global_step) == ("loss_scale_collapse", collapse_step), \
        failure
    assert "at its floor" in failure.message, failure.message
    assert log.steps[-1] == collapse_step and all(log.overflows), log.overflows   # stopped at that step
    assert log.scales[0] == (WARMUP_SCALE / 2 if report == "after" else WARMUP_SCALE), log.scales
    assert log.scales[collapse_step - 3:collapse_step] == [2.0, 1.0, 1.0], log.scales
    assert json.loads((tmp_path / "failure.json").read_text())["kind"] == "loss_scale_collapse"
    assert np.array_equal(net.gate.asnumpy(), np.zeros(1, np.float32)), "every update was skipped"


def test_a_fixed_scale_overflowing_every_step_is_a_collapse_after_the_streak_limit(ms_mode, tmp_path):
    import mindguard

    guard = mindguard.Guard(record=str(tmp_path / "failure.json"))
    _, log = train("fixed", [guard], steps_per_epoch=15, epochs=2, scale=1024.0)
    failure = guard.failure
    assert failure is not None and (failure.kind, failure.global_step) == ("loss_scale_collapse", 20), failure
    assert "does not come down (max_overflow_steps=20)" in failure.message, failure.message
    assert set(log.scales) == {1024.0} and all(log.overflows) and log.steps[-1] == 20


def test_max_overflow_steps_is_the_limit_for_a_fixed_scale(graph_mode, tmp_path):
    import mindguard

    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", max_overflow_steps=5)
    _, log = train("fixed", [locator], steps_per_epoch=15, epochs=1, scale=1024.0)
    assert (locator.failure.kind, locator.failure.global_step) == ("loss_scale_collapse", 5), locator.failure
    assert log.steps[-1] == 5


def test_min_loss_scale_above_the_scalers_floor_stops_at_the_first_overflow_at_that_scale(graph_mode, tmp_path):
    """``min_loss_scale=2**18`` with a scaler from 2**20: steps 1 and 2 used 2**20 and 2**19 (reporting 2**19 and
    2**18); step 3 used 2**18: the collapse."""
    import mindguard

    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", min_loss_scale=2.0 ** 18)
    _, log = train("broken", [locator], steps_per_epoch=10, epochs=1, scale=2.0 ** 20)
    assert (locator.failure.kind, locator.failure.global_step) == ("loss_scale_collapse", 3), locator.failure
    assert log.scales == [2.0 ** 19, 2.0 ** 18, 2.0 ** 17], log.scales
