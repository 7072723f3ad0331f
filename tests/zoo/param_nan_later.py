"""A weight made NaN by one step whose loss stays finite, read by the loss of the next step (issue 52).

    python tests/zoo/param_nan_later.py [--bad_step 3] [--check_params]

A small MLP normalises each row (``x / ||x||``, as benchmarks/failing_train.py does), then Dense -> ReLU -> Dense;
the loss cell adds an L2 penalty on the first layer's weight. The batch of global step ``--bad_step`` holds one
blank (all-zero) row: its normalised row is 0/0 = NaN, which the ReLU hides from that step's loss (MindSpore's CPU
ReLU maps NaN to 0, measured on 2.10), but the weight gradient ``dy^T x`` multiplies the NaN row by 0 -- NaN -- so
that step's update makes every value of ``fc1.weight`` (16 x 8 = 128) NaN. The next step's L2 penalty reads it: the
loss of global step ``--bad_step + 1`` is NaN.

``Guard(check_params=False)``: the loss only, so the record names the step after the one that made the weight NaN
(``--check_params``: the default Guard, which checks the Parameters and names ``--bad_step`` itself: the Div on the
``# CULPRIT`` line, 0/0).
Expected (hunt): nonfinite_loss at global step 4; Inf/NaN already in the step's inputs; the origin the Parameter
``fc1.weight``, 128 NaN of 128 when global step 4 began, made by one of global steps 1-3 (not checked); the hint
sends the user to the step that made it.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model

import mindguard

FEATURES, HIDDEN, BATCH, STEPS = 8, 16, 4, 6


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.norm = nn.Norm(axis=-1, keep_dims=True)
        self.fc1 = nn.Dense(FEATURES, HIDDEN)
        self.fc2 = nn.Dense(HIDDEN, 1)
        self.relu = nn.ReLU()

    def construct(self, x):
        x = x / self.norm(x)  # CULPRIT
        return self.fc2(self.relu(self.fc1(x)))


class WithL2Loss(nn.Cell):
    """MSE plus ``decay * sum(fc1.weight ** 2)``: weight regularisation written into the loss."""

    def __init__(self, net, decay=1e-3):
        super().__init__(auto_prefix=False)
        self.net, self.decay, self.mse = net, decay, nn.MSELoss()

    def construct(self, x, y):
        penalty = ops.reduce_sum(ops.square(self.net.fc1.weight))  # READS THE WEIGHT
        return self.mse(self.net(x), y) + self.decay * penalty


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bad_step", type=int, default=3)
    parser.add_argument("--check_params", action="store_true", help="the default Guard (checks the Parameters)")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(5)
    rng = np.random.RandomState(5)
    x = rng.randn(BATCH * STEPS, FEATURES).astype(np.float32)
    y = rng.randn(BATCH * STEPS, 1).astype(np.float32)
    x[(args.bad_step - 1) * BATCH + 1] = 0.0      # a blank sample in the batch of --bad_step
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
    net = Net()
    model = Model(nn.TrainOneStepCell(WithL2Loss(net), nn.Momentum(net.trainable_params(), 0.05, 0.9)))
    guard = mindguard.Guard() if args.check_params else mindguard.Guard(check_params=False)
    model.train(1, data, callbacks=[guard], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
