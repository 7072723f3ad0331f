"""Regression MLP with a hand-written warm-up schedule in a callback -- the kind zoo scripts carry -- that divides
by zero when the step reaches the warm-up length.

    python tests/zoo/warmup_lr.py [--dropout] [--watch] [--optimizer momentum|sgd|rmsprop]

``PolyWarmup`` sets the optimizer's learning rate before every step to ``base_lr * warmup / (warmup - step)``
(meant: ``base_lr * step / warmup``); at step ``warmup`` (= 6) the rate is +Inf. The forward and backward of that
step are finite; the optimizer's ApplyMomentum turns the finite weights into Inf/NaN (kind ``nonfinite_params``
at global step 6). A dump that leaves the optimizer out explains nothing; the full dump names ApplyMomentum and
its infinite learning-rate input. ``--dropout``: a Dropout after the hidden layer (MindSpore's kernel; seeded: runs
from step 1 repeat, a run resumed from a kept state draws other masks). ``--optimizer``: the kernel that applies the
rate -- ApplyMomentum (default), SGD (``nn.SGD`` with momentum) or ApplyRMSProp (``nn.RMSProp``).
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model

import mindguard


class PolyWarmup(Callback):
    def __init__(self, optimizer, base_lr=0.01, warmup=6):
        super().__init__()
        self.optimizer, self.base_lr, self.warmup = optimizer, base_lr, warmup

    def on_train_step_begin(self, run_context):
        step = run_context.original_args().cur_step_num
        with np.errstate(divide="ignore"):
            lr = np.float32(self.base_lr * self.warmup) / np.float32(self.warmup - step)   # BUG: inverted ratio
        ops.assign(self.optimizer.learning_rate, ms.Tensor(abs(lr), ms.float32))


class Regressor(nn.Cell):
    def __init__(self, dropout=False):
        super().__init__()
        self.fc1 = nn.Dense(8, 16)
        self.fc2 = nn.Dense(16, 1)
        self.relu = nn.ReLU()
        self.dropout = nn.Dropout(p=0.2) if dropout else nn.Identity()

    def construct(self, x):
        return self.fc2(self.dropout(self.relu(self.fc1(x))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dropout", action="store_true")
    parser.add_argument("--watch", action="store_true")
    parser.add_argument("--optimizer", choices=("momentum", "sgd", "rmsprop"), default="momentum")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(5)
    rng = np.random.RandomState(0)
    x = rng.randn(40, 8).astype(np.float32)
    y = x[:, :1].copy()
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)
    net = Regressor(args.dropout)
    lr = ms.Parameter(ms.Tensor(0.01, ms.float32), name="learning_rate")
    if args.optimizer == "sgd":
        optimizer = nn.SGD(net.trainable_params(), learning_rate=lr, momentum=0.9)
    elif args.optimizer == "rmsprop":
        optimizer = nn.RMSProp(net.trainable_params(), learning_rate=lr)
    else:
        optimizer = nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9)
    callbacks = [PolyWarmup(optimizer), mindguard.Guard()]
    if args.watch:
        from nan_watch import NanWatch
        callbacks.append(NanWatch())
    Model(net, nn.MSELoss(), optimizer).train(2, data, callbacks=callbacks, dataset_sink_mode=False)


if __name__ == "__main__":
    main()
