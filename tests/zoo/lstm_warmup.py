"""Sentiment classifier in the LSTM shape (token ids -> embedding -> LSTM -> last hidden state -> dense logits) with a
warm-up learning-rate schedule given to the optimizer as a per-step list -- the way zoo configs carry ``lr_max``,
``warmup_steps`` and ``weight_decay`` -- that diverges slowly into an infinite loss.

    python tests/zoo/lstm_warmup.py [--lr-max 0.5] [--warmup 4] [--weight-decay 4.2] [--steps 120] [--keep-at S]

``nn.Momentum(momentum=0)`` with ``weight_decay`` multiplies every weight by ``1 - lr * weight_decay`` each step
(plus the gradient's step): once the warm-up brings ``lr * weight_decay`` above 2 (0.5 x 4.2 = 2.1, from step 4),
every weight flips its sign and grows ~10 % a step. The LSTM's gates saturate; the dense head keeps growing, so the
logits' margin grows and the loss with it (0.7 at step ~7, ~40 at step 40) until the cross entropy -- written by
hand, ``-log(softmax(logits)[label])`` -- takes the log of a probability that underflowed to 0: +inf at step 41
(measured on CPU, MindSpore 2.10). ``--lr-max 0.49`` (still above 2 / 4.2) fails too, later (step 54 from step 1);
``--lr-max 0.05`` trains finite. Nothing here depends on a random source but the seeded initialisation.

``--keep-at S``: the always-on Guard keeps its training state at the beginning of global step S (its Parameters
checked after every step, ``check_budget=1.0``, and ``MINDGUARD_KEEP_STEPS=S-S`` set for the process: the steps it
keeps at instead of by time): the state the failure record names is then the one of step S (tests/test_divergence.py
verifies from an early and a late one).
"""
import argparse
import os

import numpy as np

VOCAB, DIM, HIDDEN, LEN, BATCH = 100, 16, 16, 12, 16


def schedule(lr_max, warmup, steps):
    """The per-step learning rates: linear warm-up to ``lr_max`` over ``warmup`` steps, then constant."""
    return [lr_max * min(1.0, (i + 1) / warmup) for i in range(steps)]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr-max", type=float, default=0.5)
    parser.add_argument("--warmup", type=int, default=4)
    parser.add_argument("--weight-decay", type=float, default=4.2)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--keep-at", type=int, default=None)
    args = parser.parse_args()

    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn, ops
    from mindspore.train import Model

    import mindguard

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(1)
    rng = np.random.default_rng(0)
    rows = args.steps * BATCH
    tokens = rng.integers(1, VOCAB, size=(rows, LEN)).astype(np.int32)
    labels = (tokens[:, :LEN // 2].mean(axis=1) > VOCAB / 2).astype(np.int32)   # positive: high ids up front

    class Sentiment(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(VOCAB, DIM)
            self.encoder = nn.LSTM(DIM, HIDDEN, batch_first=True)
            self.head = nn.Dense(HIDDEN, 2)

        def construct(self, x):
            out, _ = self.encoder(self.embedding(x))
            return self.head(out[:, -1, :])

    class CrossEntropy(nn.Cell):
        def construct(self, logits, label):
            probs = ops.softmax(logits, axis=-1)
            picked = ops.gather_elements(probs, 1, label.reshape(-1, 1))
            return -ops.log(picked).mean()

    net = Sentiment()
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=schedule(args.lr_max, args.warmup, args.steps),
                            momentum=0.0, weight_decay=args.weight_decay)
    if args.keep_at is not None:   # before the Guard: its keeper reads it when the training begins
        os.environ["MINDGUARD_KEEP_STEPS"] = f"{args.keep_at}-{args.keep_at}"
    guard = mindguard.Guard(check_budget=1.0) if args.keep_at is not None else mindguard.Guard()
    data = ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False).batch(BATCH)
    Model(net, CrossEntropy(), optimizer).train(1, data, callbacks=[guard], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
