"""A twin (Siamese) embedding network whose one normalising cell is called for the anchor and the positive (round 4).

    python tests/zoo/siamese_shared.py [--mode graph|pynative] [--bad_step 5] [--fix] [--no_guard]

The shape of metric-learning / sentence-embedding training: one encoder (``nn.Dense`` without bias) and one
``L2Normalize`` cell (``x / (sqrt(sum(x*x)) + eps)``, the eps outside the root) applied to both sides in
``construct(anchor, positive)``; a cosine-similarity regression loss; MindSpore's stock ``nn.TrainOneStepCell``
(``construct(*inputs)``) under ``Model(train_net).train``.

The planted bug: one positive of the batch of global step ``--bad_step`` (default 5) is an all-zero feature vector (a
missing record filled with zeros). Its projection is 0, ``sqrt(0)`` is 0 and the backward of the root divides by it:
NaN gradients, NaN weights after the update (the loss of that step is finite). Expected: kind nonfinite_params at
global step 5, ``SqrtGrad`` (backward) on the root's line, and the call site ``# CULPRIT`` -- the *positive* call:
the .ir gives both calls of ``self.normalize`` the anchor call's line, and the graph input the kernel reads
(``inputs1``, bound through ``*inputs`` to ``positive``) names the call. ``--fix`` moves the epsilon under the root.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

DIM = 4
BATCH = 2
STEPS_PER_EPOCH = 6


def parse_args():
    parser = argparse.ArgumentParser(description="Siamese embedding network")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--bad_step", type=int, default=5)
    parser.add_argument("--fix", action="store_true", help="the epsilon under the root (verification)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


def pairs(bad_step):
    """(anchor, positive, target similarity) rows; one positive of batch ``bad_step`` is all zeros."""
    rng = np.random.RandomState(0)
    for i in range(BATCH * STEPS_PER_EPOCH):
        anchor, positive = rng.rand(DIM).astype(np.float32), rng.rand(DIM).astype(np.float32)
        if i == (bad_step - 1) * BATCH + 1:
            positive[:] = 0   # BUG: a missing record filled with zeros
        yield anchor, positive, np.float32(1.0)


class L2Normalize(nn.Cell):
    def __init__(self, fix=False):
        super().__init__()
        self.fix = fix

    def construct(self, x):
        if self.fix:
            return x / ops.sqrt((x * x).sum(-1, keepdims=True) + 1e-6)
        norm = ops.sqrt((x * x).sum(-1, keepdims=True))
        return x / (norm + 1e-6)


class Siamese(nn.Cell):
    def __init__(self, fix=False):
        super().__init__()
        self.encoder = nn.Dense(DIM, DIM, has_bias=False)
        self.normalize = L2Normalize(fix)

    def construct(self, anchor, positive):
        a = self.normalize(self.encoder(anchor))
        p = self.normalize(self.encoder(positive))  # CULPRIT
        return a, p


class CosineLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, anchor, positive, target):
        a, p = self.net(anchor, positive)
        return ((a * p).sum(-1) - target).square().mean()


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    dataset = ds.GeneratorDataset(lambda: pairs(cfg.bad_step), ["anchor", "positive", "target"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = Siamese(cfg.fix)
    train_net = nn.TrainOneStepCell(CosineLoss(net), nn.SGD(net.trainable_params(), 0.1))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    Model(train_net).train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
