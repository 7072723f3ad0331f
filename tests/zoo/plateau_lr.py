"""Regression MLP whose learning rate a Python callback raises when the loss stops improving (a "warm restart"
schedule of the kind zoo scripts hand-write); the schedule overshoots and the weights blow up.

    python tests/zoo/plateau_lr.py [--watch]

``Model(net, MSELoss, Momentum).train(6, ds, callbacks=[guard, LossMonitor(), PlateauBoost(...)])``, 8 steps
per epoch. ``PlateauBoost`` keeps the loss history in Python and multiplies the optimizer's learning rate
(``ops.assign``) by 4 whenever the loss improved by less than 2 % over the last 3 steps. The history is state
outside every Parameter: a run that skips steps (a hunt resumed from a kept training state) sees different
losses there, so its schedule differs and the failure does not repeat at the same step -- the hunt must notice
and examine the step from step 1 instead.

Expected (plain run, ``--watch``): the loss turns Inf/NaN at a step of epoch 2-4 (kind ``nonfinite_loss`` or
``nonfinite_params``); the culprit is an ordinary forward/backward op of the exploding network, and the hint
names the learning rate.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, LossMonitor, Model

import mindguard


class PlateauBoost(Callback):
    """Raise the learning rate by ``factor`` when the loss improved by less than ``rel`` over ``window`` steps."""

    def __init__(self, optimizer, window=3, rel=0.02, factor=4.0):
        super().__init__()
        self.optimizer, self.window, self.rel, self.factor = optimizer, window, rel, factor
        self.history = []

    def on_train_step_end(self, run_context):
        loss = float(np.asarray(run_context.original_args().net_outputs.asnumpy()).reshape(-1)[0])
        self.history.append(loss)
        if len(self.history) > self.window:
            before = self.history[-1 - self.window]
            if before - loss < self.rel * abs(before):
                lr = self.optimizer.learning_rate
                ops.assign(lr, lr * self.factor)


class Regressor(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(16, 32)
        self.fc2 = nn.Dense(32, 1)
        self.relu = nn.ReLU()

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--watch", action="store_true")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(3)
    rng = np.random.RandomState(0)
    x = rng.randn(64, 16).astype(np.float32)
    y = (x[:, :1] * 2.0 + 0.1 * rng.randn(64, 1)).astype(np.float32)
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(8)
    net = Regressor()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=ms.Parameter(ms.Tensor(0.01, ms.float32),
                                                                               name="learning_rate"), momentum=0.9)
    callbacks = [mindguard.Guard(), LossMonitor(8), PlateauBoost(optimizer)]
    if args.watch:
        from nan_watch import NanWatch
        callbacks.append(NanWatch())
    Model(net, nn.MSELoss(), optimizer).train(args.epochs, data, callbacks=callbacks, dataset_sink_mode=False)


if __name__ == "__main__":
    main()
