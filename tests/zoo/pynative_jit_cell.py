"""Siamese metric-learning model in PyNative mode with an ``@ms.jit`` sub-cell (shape 12 of the hunt's suite).

    python tests/zoo/pynative_jit_cell.py

The pair-distance cell's ``construct`` is decorated with ``@ms.jit`` (compiled inside an eager run),
and computes ``sqrt(sum((a - b)**2))``. 4 steps per epoch, 3 epochs. The planted bug: from epoch 2 on the
pair sampler may pick the same item twice ("hard positive mining" without excluding the anchor); the
first such pair is pair 6 = batch 2 of epoch 2, global step 6. Its embeddings are identical, the
distance is sqrt(0), and sqrt's backward divides by 0: the encoder's parameters are NaN after global
step 6 (the loss of that step is finite).
Expected: kind nonfinite_params, global step 6, epoch 2 step 2; SqrtGrad backward (or the PairDistance
cell's backward in a cell-level replay), line ``# CULPRIT`` (or the call ``# CALLS-CULPRIT``).
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="siamese contrastive training, PyNative + jit cell")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="pynative")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--feat_dim", type=int, default=6)
    parser.add_argument("--margin", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--watch", action="store_true", help="print the first non-finite step (verification)")
    return parser.parse_args()


class PairSource:
    def __init__(self, cfg, num_pairs=16):
        rng = np.random.RandomState(11)
        self.items = rng.uniform(-1, 1, (num_pairs * 2, cfg.feat_dim)).astype(np.float32)
        self.same = rng.randint(0, 2, (num_pairs, 1)).astype(np.float32)
        self.num_pairs = num_pairs
        self.epoch = 0

    def __len__(self):
        return self.num_pairs

    def __iter__(self):
        self.epoch += 1
        for i in range(self.num_pairs):
            a, b = 2 * i, 2 * i + 1
            if self.epoch >= 2 and i == 5:
                b = a                 # BUG: hard-positive mining may return the anchor itself
            yield self.items[a], self.items[b], self.same[i]


def create_dataset(cfg):
    dataset = ds.GeneratorDataset(PairSource(cfg), ["anchor", "other", "same"], shuffle=False)
    return dataset.batch(cfg.batch_size, drop_remainder=True)


class PairDistance(nn.Cell):
    @ms.jit
    def construct(self, a, b):
        return ops.sqrt(((a - b) ** 2).sum(axis=-1, keepdims=True))  # CULPRIT


class SiameseNet(nn.Cell):
    def __init__(self, feat_dim):
        super().__init__()
        self.encoder = nn.SequentialCell(nn.Dense(feat_dim, 8), nn.Tanh(), nn.Dense(8, 4))
        self.distance = PairDistance()

    def construct(self, anchor, other):
        return self.distance(self.encoder(anchor), self.encoder(other))  # CALLS-CULPRIT


class ContrastiveLoss(nn.Cell):
    def __init__(self, network, margin):
        super().__init__(auto_prefix=False)
        self.network = network
        self.margin = margin

    def construct(self, anchor, other, same):
        d = self.network(anchor, other)
        loss = same * d ** 2 + (1 - same) * ops.relu(self.margin - d) ** 2
        return loss.mean()


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(4)
    net = SiameseNet(cfg.feat_dim)
    opt = nn.SGD(net.trainable_params(), learning_rate=cfg.lr)
    model = Model(nn.TrainOneStepCell(ContrastiveLoss(net, cfg.margin), opt))
    callbacks = [mindguard.Guard(), LossMonitor()]
    if cfg.watch:
        from nan_watch import NanWatch
        callbacks.insert(1, NanWatch())
    model.train(cfg.epochs, create_dataset(cfg), callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
