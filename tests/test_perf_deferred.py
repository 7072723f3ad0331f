"""The deferred check (FailureLocator(defer_check=True), opt-in): step n is checked while step n+1 runs, the record
still names step n, and a check that finished after step n+1 began updating is detected (``late``).

Real MindSpore on CPU; no timing assertions.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import mindguard
from mindguard.record import FailureRecord
from mindguard.run import reset_run


def _norm_nan_training(tmp_path, *, defer_check, check_params=True, action="stop"):
    """The Embedding(padding_idx=0) -> nn.Norm demo: weights NaN at global step 11, loss finite until 12."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Callback, Model
    from mindguard.demos import norm_nan

    class StepsRun(Callback):
        def __init__(self):
            super().__init__()
            self.steps = []

        def on_train_step_end(self, run_context):
            self.steps.append(run_context.original_args().get("cur_step_num"))

    reset_run()
    ms.set_seed(1)
    np.random.seed(1)
    net = norm_nan.build_network()
    locator = mindguard.locator.FailureLocator(tmp_path / f"rec_{defer_check}_{check_params}.json",
                                               check_params=check_params, action=action, defer_check=defer_check)
    steps = StepsRun()
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
        3, norm_nan.make_dataset(8), callbacks=[locator, steps], dataset_sink_mode=False)
    return locator, steps.steps


def test_deferred_check_of_the_last_step_is_collected_at_the_end(graph_mode, tmp_path):
    """A failure at the very last step has no next step to be checked under: on_train_end collects it."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    reset_run()
    ms.set_seed(0)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 3)).astype(np.float32)
    x[-2:, 1] = np.inf  # the last batch (global step 4 of 4) holds Inf
    y = x[:, :1].copy()
    y[~np.isfinite(y)] = 0
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)
    net = nn.Dense(3, 1)
    locator = mindguard.locator.FailureLocator(tmp_path / "last.json")
    locator._WARMUP_STEPS = 0  # defer from the first step, whatever the step time (a late check turns it off)
    locator._DEFER_FRACTION = float("inf")
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, callbacks=[locator],
                                                                           dataset_sink_mode=False)
    failure = locator.failure
    assert failure is not None and failure.global_step == 4 and failure.kind == "nonfinite_loss", failure
    assert failure.stopped_after_step is None  # no step after it: collected at the epoch's end
    assert FailureRecord.load(locator.record_path).status == "failed"


def test_buffers_written_outside_the_optimizer_are_checked_at_once(graph_mode, tmp_path):
    """BatchNorm statistics can change in the next step's forward, so they are never deferred: the locator splits
    the written Parameters into the optimizer's (deferred) and the rest (checked at step end)."""
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    class Net(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(3, 4)
            self.bn = nn.BatchNorm1d(4)

        def construct(self, x):
            return self.bn(self.fc(x)).sum(axis=1, keepdims=True)

    reset_run()
    ms.set_seed(0)
    x = np.random.default_rng(0).uniform(-1, 1, (8, 3)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": x[:, :1].copy()}, shuffle=False).batch(4)
    net = Net()
    locator = mindguard.locator.FailureLocator(tmp_path / "bn.json")
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(1, data, callbacks=[locator],
                                                                           dataset_sink_mode=False)
    assert locator.failure is None
    buffers = {p.name for p in locator._buffer_checker.params}
    deferred = {p.name for p in locator._deferred_checker.params}
    assert {"bn.moving_mean", "bn.moving_variance"} <= buffers, buffers
    assert {"fc.weight", "fc.bias", "bn.gamma", "bn.beta"} <= deferred, deferred
    assert not buffers & deferred


def test_late_check_is_detected_by_the_optimizer_step_count(graph_mode):
    """When the optimizer's global_step moved between submit and the worker's check (step n+1 began updating),
    the verdict says ``late``; the device path (compiled reduction, exercised on CPU) is never late."""
    import mindspore as ms
    from mindspore import nn
    from mindguard.finite import DeferredStepCheck, ParamChecker

    net = nn.Dense(3, 2)
    opt = nn.SGD(net.trainable_params(), 0.01)
    loss = ms.Tensor(np.float32(1.5))
    check = DeferredStepCheck(ParamChecker(net.trainable_params(), on_host=True), opt.global_step)
    check.submit(loss)
    verdict, names, late = check.collect()
    assert (verdict.kind, names, late) == (None, [], False)

    check.submit(loss)
    opt.global_step.asnumpy()[...] += 1  # what AssignAdd(global_step) of the next step does, before its updates
    net.weight.asnumpy()[0, 0] = np.nan
    verdict, names, late = check.collect()
    assert (verdict.kind, names, late) == (None, ["weight"], True)
    check.close()

    device = DeferredStepCheck(ParamChecker(net.trainable_params(), on_host=False))
    device.submit(ms.Tensor(np.float32(np.nan)))
    verdict, names, late = device.collect()
    assert (verdict.kind, names, late) == ("nonfinite_loss", ["weight"], False)
    assert not math.isfinite(verdict.loss)
