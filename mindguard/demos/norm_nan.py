"""The failure this project grew from, small enough to run on a CPU in seconds.

A bag-of-tokens model: ``nn.Embedding(padding_idx=0)`` -> ``nn.Norm(axis=-1)`` -> ``nn.Dense``. The
data pipeline is a curriculum: for the first ``clean_epochs`` epochs every sentence is full length; from
then on some are shorter and padded with token 0. The padding row of the embedding is the zero vector,
so ``nn.Norm`` takes ``sqrt(0)``; its backward divides by it, the embedding gets NaN gradients, and the
weights silently turn NaN. The loss stays finite for a few more steps, until the next padded batch.

Run ``python -m mindguard.demos.norm_nan --help``. Use it as a library too: tests and benchmarks build
the same network and data with :func:`build_network` and :func:`make_dataset`.
"""
from __future__ import annotations

import argparse
import sys
from typing import Optional, Sequence

import numpy as np

VOCAB = 6
EMBED_DIM = 4
SEQ_LEN = 3
BATCH = 4


def build_network(norm_cls=None):
    """``EmbedNormNet``: int32 tokens ``(batch, SEQ_LEN)`` -> float32 ``(batch, 1)``.

    ``norm_cls`` (e.g. ``mindguard.SafeNorm``) replaces ``nn.Norm`` as ``norm_cls(axis=-1)``.
    """
    from mindspore import nn

    class EmbedNormNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(VOCAB, EMBED_DIM, padding_idx=0)
            self.norm = nn.Norm(axis=-1)
            self.head = nn.Dense(SEQ_LEN, 1)

        def construct(self, tokens):
            return self.head(self.norm(self.embedding(tokens)))

    net = EmbedNormNet()
    if norm_cls is not None:
        net.norm = norm_cls(axis=-1)
    return net


class CurriculumSource:
    """Iterable dataset source; each pass over it is one epoch (MindSpore re-iterates it every epoch).

    Epochs ``1..clean_epochs`` hold only full-length sentences (tokens 1..5). From epoch
    ``clean_epochs + 1`` on, each sentence is short (its tail padded with token 0) with probability
    ``pad_prob``. Randomness comes from numpy's global RNG, so ``mindguard.fix_randomness`` (or
    ``np.random.seed``) makes the failing step repeat; without a seed it moves from run to run.
    """

    def __init__(self, steps_per_epoch: int = 8, clean_epochs: int = 1, pad_prob: float = 0.1,
                 poison_step: Optional[int] = None):
        self.steps_per_epoch = steps_per_epoch
        self.clean_epochs = clean_epochs
        self.pad_prob = pad_prob
        self.poison_step = poison_step
        self._epoch = 0
        self._targets = np.random.uniform(0.5, 1.5, size=(SEQ_LEN,)).astype(np.float32)

    def __len__(self) -> int:
        return self.steps_per_epoch * BATCH

    def __iter__(self):
        self._epoch += 1
        for step in range(1, self.steps_per_epoch + 1):
            global_step = (self._epoch - 1) * self.steps_per_epoch + step
            for _ in range(BATCH):
                tokens = np.random.randint(1, VOCAB, size=(SEQ_LEN,)).astype(np.int32)
                padded = (self._epoch > self.clean_epochs and np.random.rand() < self.pad_prob)
                if self.poison_step is not None:
                    padded = global_step == self.poison_step
                if padded:
                    tokens[np.random.randint(1, SEQ_LEN):] = 0
                label = np.array([float((tokens > 0).sum()) * 0.5], np.float32)
                yield tokens, label


def make_dataset(steps_per_epoch: int = 8, clean_epochs: int = 1, pad_prob: float = 0.1,
                 poison_step: Optional[int] = None, shuffle: bool = False):
    """A ``GeneratorDataset`` of ``steps_per_epoch`` batches of ``BATCH`` (tokens int32, label float32).

    ``poison_step`` (1-based global step) forces exactly that step's batch to be padded and no other.
    """
    import mindspore.dataset as ds

    source = CurriculumSource(steps_per_epoch, clean_epochs, pad_prob, poison_step)
    data = ds.GeneratorDataset(source, column_names=["tokens", "label"], shuffle=False,
                               num_parallel_workers=1)
    if shuffle:
        data = data.shuffle(buffer_size=BATCH * steps_per_epoch)
    return data.batch(BATCH, drop_remainder=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mindguard.demos.norm_nan", description=__doc__.split("\n\n")[0])
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-seed", action="store_true", help="do not fix randomness (the failing step moves)")
    parser.add_argument("--safe", action="store_true", help="swap nn.Norm for mindguard.SafeNorm (the fix)")
    parser.add_argument("--no-guard", action="store_true", help="train without mindguard's callback")
    args = parser.parse_args(argv)

    import mindspore as ms
    from mindspore import nn
    from mindspore.train import LossMonitor, Model

    import mindguard

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    if not args.no_seed:
        mindguard.fix_randomness(args.seed)
    net = build_network()
    if args.safe:
        mindguard.make_safe(net)
    data = make_dataset(args.steps_per_epoch)
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
    guard = None if args.no_guard else mindguard.Guard()
    callbacks = [LossMonitor(1)] if guard is None else [guard, LossMonitor(1)]
    model.train(args.epochs, data, callbacks=callbacks, dataset_sink_mode=False)
    finite = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    if guard is not None and guard.failure is not None:
        print(f"mindguard stopped the training at {guard.failure}")
    else:
        print(f"training finished; all parameters finite: {finite}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
