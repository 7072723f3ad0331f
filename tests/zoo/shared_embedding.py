"""DistMult-style scorer whose one entity embedding cell is called twice in ``construct`` (round 3).

    python tests/zoo/shared_embedding.py [--mode graph|pynative] [--bad_step 6] [--no_guard]

``Model(net, loss_fn, optimizer).train`` over (triple, label) batches; ``construct`` looks up the head and the
tail in the same ``nn.Embedding`` (``h = self.ent(t[:, 0])`` ... ``t = self.ent(t[:, 2])``). MindSpore's .ir
keeps one debug info for both calls, so both ``Gather`` kernels carry the first call's line.

The planted bug: the triple file was written with 1-based entity ids, so the batch of global step ``--bad_step``
(default 6: epoch 2, step 2 of 4) has a tail id of 50 in a 50-row table. The second lookup raises on CPU.
Expected: kind exception, global step 6, ``Gather`` on line ``# CULPRIT`` (the second call, not the first), and
the index-range hint naming the 50 rows.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

NUM_ENTITY = 50
NUM_RELATION = 5
BATCH = 4
STEPS_PER_EPOCH = 4


def parse_args():
    parser = argparse.ArgumentParser(description="DistMult with a shared entity embedding")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bad_step", type=int, default=6)
    parser.add_argument("--fix", action="store_true", help="clip the ids as the hint says (verification)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class TripleSource:
    """Random-access (triple, label) source; one record of batch ``bad_step`` has the out-of-range tail id."""

    def __init__(self, bad_step):
        rng = np.random.RandomState(5)
        n = BATCH * STEPS_PER_EPOCH
        self.triples = np.stack([rng.randint(0, NUM_ENTITY, n), rng.randint(0, NUM_RELATION, n),
                                 rng.randint(0, NUM_ENTITY, n)], axis=1).astype(np.int32)
        self.labels = rng.randint(0, 2, n).astype(np.float32)
        self.bad_index = ((bad_step - 1) % STEPS_PER_EPOCH) * BATCH + 2
        self.bad_epoch = (bad_step - 1) // STEPS_PER_EPOCH
        self.reads = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        epoch = self.reads // len(self.labels)
        self.reads += 1
        triple = self.triples[index].copy()
        if index == self.bad_index and epoch == self.bad_epoch:
            triple[2] = NUM_ENTITY   # BUG: a 1-based id written by the export script
        return triple, self.labels[index]


class DistMult(nn.Cell):
    def __init__(self, dim=8, fix=False):
        super().__init__()
        self.ent = nn.Embedding(NUM_ENTITY, dim)
        self.rel = nn.Embedding(NUM_RELATION, dim)
        self.fix = fix

    def construct(self, t):
        if self.fix:
            t = ops.clip_by_value(t, 0, NUM_ENTITY - 1)
        h = self.ent(t[:, 0])
        r = self.rel(t[:, 1])
        t = self.ent(t[:, 2])  # CULPRIT
        return (h * r * t).sum(-1)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    dataset = ds.GeneratorDataset(TripleSource(cfg.bad_step), ["triple", "label"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = DistMult(fix=cfg.fix)
    model = Model(net, nn.BCEWithLogitsLoss(), nn.Adam(net.trainable_params(), 0.01))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
