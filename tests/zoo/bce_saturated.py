"""A click-through-rate model with a hand-written binary cross-entropy (the way many ports of TF/PyTorch code
write it): ``-(y * log(p) + (1 - y) * log(1 - p))`` with ``p = sigmoid(z)``. One corrupted record (every
feature 400) saturates the sigmoid to exactly 1.0 in float32, so ``log(1 - p)`` is ``log(0)`` and the loss NaN.

    python tests/zoo/bce_saturated.py [--mode graph|pynative]

The culprit is the forward ``Log`` of ``1 - p`` (the ``# CULPRIT`` line). Its backward (``1 / (1 - p)``) reads the
same zero and does not wait for the forward ``Log``: MindSpore's CPU runtime may run it first.
"""
import argparse

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="CTR model, hand-written BCE")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--steps_per_epoch", type=int, default=5)
    parser.add_argument("--bad_step", type=int, default=4, help="1-based step of the corrupted record (epoch 1)")
    parser.add_argument("--lr", type=float, default=1e-3)
    return parser.parse_args()


class ClickLog:
    """Random features and clicks; the record at ``bad_row`` is corrupted (every feature 400, clicked)."""

    def __init__(self, rows, dim, bad_row):
        rng = np.random.RandomState(0)
        self.features = rng.randn(rows, dim).astype(np.float32)
        self.clicks = (rng.rand(rows) > 0.5).astype(np.float32)
        self.features[bad_row] = 400.0
        self.clicks[bad_row] = 0.0

    def __getitem__(self, index):
        return self.features[index], self.clicks[index]

    def __len__(self):
        return len(self.clicks)


class CTRNet(nn.Cell):
    def __init__(self, dim):
        super().__init__()
        self.hidden = nn.Dense(dim, 16, activation="relu")
        self.logit = nn.Dense(16, 1)

    def construct(self, x):
        return self.logit(self.hidden(x)).squeeze(-1)


class BinaryCrossEntropy(nn.Cell):
    def __init__(self):
        super().__init__()
        self.sigmoid = nn.Sigmoid()

    def construct(self, logits, labels):
        p = self.sigmoid(logits)
        clicked = labels * ops.log(p)
        skipped = (1.0 - labels) * ops.log(1.0 - p)  # CULPRIT
        return -(clicked + skipped).mean()


def main():
    cfg = parse_args()
    mindguard.fix_randomness(1)
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    rows = cfg.steps_per_epoch * cfg.batch_size
    source = ClickLog(rows, 12, (cfg.bad_step - 1) * cfg.batch_size)
    dataset = ds.GeneratorDataset(source, ["features", "click"], shuffle=False).batch(cfg.batch_size)
    net = CTRNet(12)
    model = Model(net, BinaryCrossEntropy(), nn.Adam(net.trainable_params(), learning_rate=cfg.lr))
    model.train(cfg.epochs, dataset, callbacks=[mindguard.Guard(), LossMonitor()], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
