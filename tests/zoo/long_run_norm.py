"""A long training with the field report's failure late in it, and an always-on Guard (no hunt): the shape of
`mindguard hunt --from`'s workflow. Bag-of-tokens model (embedding -> nn.Norm -> dense); the batch of
``--poison`` (1-based global step) has padded sentences, so nn.Norm's sqrt(0) makes the embedding's gradient NaN
at that step: the padding row turns NaN at ``--poison``, and the loss only when a later batch reads it.

    python long_run_norm.py --poison 1500 --epochs 20 --steps-per-epoch 100       # Model.train, Guard()
    python long_run_norm.py --loop watch --mode pynative --poison 40                # functional loop, watch()
    python long_run_norm.py --safe ...                                              # the fix: trains finite
    python long_run_norm.py --wrap-embedding ...     # a refactor: the embedding's Parameter is renamed
    python long_run_norm.py --lr 5e-4 ...            # another learning rate (Adam's, held in a Parameter)

``--padded-again K``: the batch of global step ``poison + K`` is padded too: it reads the embedding's padding row,
NaN since ``--poison``, so the loss turns NaN only then (the failure shows K steps after the step that made it).

``--data array``: the same sentences, drawn up front, served by index (a random-access source: a resumed pass
resets the dataset to the kept step instead of iterating it); ``--jitter``: a map adds noise to the labels from its own
generator (a fast reset skips the map, so the noise differs and the hunt iterates the dataset instead).
"""
import argparse
import sys

import numpy as np

VOCAB, DIM, LEN, BATCH = 50, 16, 6, 8


class Source:
    """Random sentences; the batch of global step ``poison`` is padded (tokens 0 at the tail)."""

    def __init__(self, steps_per_epoch, poison, again=0):
        self.steps_per_epoch, self.poison, self.epoch = steps_per_epoch, poison, 0
        self.padded = {poison, poison + again} if again else {poison}
        self.rng = np.random.default_rng(0)

    def __len__(self):
        return self.steps_per_epoch * BATCH

    def __iter__(self):
        self.epoch += 1
        for step in range(1, self.steps_per_epoch + 1):
            global_step = (self.epoch - 1) * self.steps_per_epoch + step
            for _ in range(BATCH):
                tokens = self.rng.integers(1, VOCAB, size=(LEN,)).astype(np.int32)
                if global_step in self.padded:
                    tokens[2:] = 0
                yield tokens, np.array([float((tokens > 0).sum()) / LEN], np.float32)


class Rows:
    """Every row :class:`Source` yields over ``epochs`` epochs, drawn up front, by index."""

    def __init__(self, steps_per_epoch, poison, epochs, again=0):
        source = Source(steps_per_epoch, poison, again)
        self.rows = [row for _ in range(epochs) for row in source]

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


class Jitter:
    """Adds small noise to each label from its own generator: row n gets the n-th draw."""

    def __init__(self):
        self.rng = np.random.default_rng(1)

    def __call__(self, label):
        return label + self.rng.uniform(-1e-3, 1e-3, label.shape).astype(np.float32)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--poison", type=int, required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--loop", choices=("model", "watch"), default="model")
    parser.add_argument("--check-budget", type=float, default=0.01)
    parser.add_argument("--safe", action="store_true")
    parser.add_argument("--data", choices=("iterable", "array"), default="iterable")
    parser.add_argument("--jitter", action="store_true")
    parser.add_argument("--wrap-embedding", action="store_true")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--padded-again", type=int, default=0)
    args = parser.parse_args()

    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import LossMonitor, Model

    import mindguard

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(0)

    class BagOfTokens(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=0)
            if args.wrap_embedding:   # embedding.embedding_table -> embedding.0.embedding_table
                self.embedding = nn.SequentialCell([self.embedding])
            self.norm = nn.Norm(axis=-1)  # FIX: mindguard.SafeNorm
            self.head = nn.Dense(LEN, 1)

        def construct(self, tokens):
            return self.head(self.norm(self.embedding(tokens)))  # CULPRIT

    net = BagOfTokens()
    if args.safe:
        mindguard.make_safe(net)   # the fix the hunt proposes: nn.Norm -> mindguard.SafeNorm
    loss_fn = nn.MSELoss()
    optimizer = nn.Adam(net.trainable_params(), learning_rate=args.lr)
    epochs = args.epochs
    if args.data == "array":   # one epoch of every epoch's rows (the rows differ from epoch to epoch)
        source, epochs = Rows(args.steps_per_epoch, args.poison, args.epochs, args.padded_again), 1
    else:
        source = Source(args.steps_per_epoch, args.poison, args.padded_again)
    data = ds.GeneratorDataset(source, ["tokens", "label"], shuffle=False)
    if args.jitter:
        data = data.map(Jitter(), input_columns=["label"], num_parallel_workers=1)
    data = data.batch(BATCH, drop_remainder=True)
    if args.loop == "model":
        guard = mindguard.Guard(check_budget=args.check_budget)
        Model(net, loss_fn, optimizer).train(epochs, data, callbacks=[guard, LossMonitor(100)],
                                             dataset_sink_mode=False)
        failure = guard.failure
    else:
        grad_fn = ms.value_and_grad(lambda x, y: loss_fn(net(x), y), None, optimizer.parameters)

        def train_step(tokens, label):
            loss, grads = grad_fn(tokens, label)
            optimizer(grads)
            return loss

        step = mindguard.watch(train_step, net, optimizer, check_budget=args.check_budget, action="continue")
        for _ in range(epochs):
            for tokens, label in data.create_tuple_iterator():
                step(tokens, label)
                if step.failure is not None:
                    break
            if step.failure is not None:
                break
        failure = step.failure
    finite = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    print(f"failure: {failure}" if failure is not None else f"trained; all parameters finite: {finite}")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
