"""A recommender-style regression over a large embedding table, trained with ``Model.train``, ``ModelCheckpoint``
and ``Guard()`` (issue 38: state at scale).

    python tests/zoo/embedding_checkpoints.py [--vocab 400000] [--dim 32] [--steps 40] [--poison 36]
                                              [--ckpt-every 10] [--keep-often] [--no_guard] [--stats stats.json]

Shaped like the model-zoo CTR/recommendation scripts (Wide&Deep, DeepFM): an ``nn.Embedding`` table looked up by
the batch's ids, averaged and fed to a small MLP; ``nn.Momentum`` keeps a moment of the table's size;
``ModelCheckpoint(CheckpointConfig(save_checkpoint_steps=N))`` saves the train network every N steps into
``./ckpt``. Its state (table + moment) is large next to the process's memory, so an always-on Guard keeps no host
copy of it and resumes from the script's own checkpoints.

The planted bug: the label of one sample of global step ``--poison`` (1-based; one epoch, no shuffle) is NaN (a
broken record): the loss of that step is NaN -- a failure at exactly that step.

``--stats FILE``: write the peak resident memory (bytes) and every step's wall time (seconds) as JSON, for the
benchmark (benchmarks/bigstate.py).
"""
import argparse
import json
import os
import resource
import time

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, LossMonitor, Model, ModelCheckpoint

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="embedding-table regression with checkpoints")
    parser.add_argument("--vocab", type=int, default=400_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--fields", type=int, default=8)
    parser.add_argument("--poison", type=int, default=36, help="0: no broken record")
    parser.add_argument("--ckpt-every", type=int, default=10, help="0: no ModelCheckpoint")
    parser.add_argument("--keep-often", action="store_true",
                        help="(tests) Guard writes its own state at every step it can, whatever the cost")
    parser.add_argument("--inf-lr-at", type=int, default=0,
                        help="a second planted bug: the learning rate schedule is inf at this global step")
    parser.add_argument("--no_guard", action="store_true")
    parser.add_argument("--stats", default=None)
    return parser.parse_args()


class Recommender(nn.Cell):
    def __init__(self, vocab, dim):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.fc1 = nn.Dense(dim, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 1)

    def construct(self, ids):
        return self.fc2(self.relu(self.fc1(self.embedding(ids).mean(axis=1))))


def create_dataset(cfg):
    rng = np.random.RandomState(0)
    rows = cfg.steps * cfg.batch_size
    ids = rng.randint(0, cfg.vocab, (rows, cfg.fields)).astype(np.int32)
    labels = rng.uniform(0, 1, (rows, 1)).astype(np.float32)
    if cfg.poison > 0:   # (0: a healthy run)
        labels[(cfg.poison - 1) * cfg.batch_size + 3, 0] = np.nan   # BUG: a broken record
    return ds.NumpySlicesDataset({"ids": ids, "label": labels}, shuffle=False).batch(cfg.batch_size)


class KeepOften(Callback):
    """(tests) Guard's time rules for writing a state too big to copy, lifted: a run this short gets states of its
    own to resume from at all (at most every step)."""

    def on_train_step_end(self, run_context):
        from mindguard.training.run import current_run

        keeper = current_run().state.keeper
        if keeper is not None and keeper.on_disk:
            keeper.schedule.disk_seconds, keeper.schedule.budget, keeper.schedule.max_stall_steps = 0.0, 1.0, 1e9


class StepTimes(Callback):
    """Each step's wall time, from one step's begin to the next one's (the callbacks between included)."""

    def __init__(self):
        super().__init__()
        self.begins = []

    def on_train_step_begin(self, run_context):
        self.begins.append(time.perf_counter())


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(1)
    np.random.seed(1)
    net = Recommender(cfg.vocab, cfg.dim)
    loss = nn.MSELoss()
    learning_rate = 0.01
    if cfg.inf_lr_at:   # BUG: a per-step schedule with an infinite entry (the optimizer's update makes the weights inf)
        learning_rate = ms.Tensor(np.where(np.arange(cfg.steps) == cfg.inf_lr_at - 1, np.inf, 0.01).astype(np.float32))
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=learning_rate, momentum=0.9)
    model = Model(net, loss, optimizer)
    timer = StepTimes()
    callbacks = [timer, LossMonitor(1)]
    if cfg.ckpt_every:
        config = CheckpointConfig(save_checkpoint_steps=cfg.ckpt_every, keep_checkpoint_max=3)
        callbacks.insert(1, ModelCheckpoint(prefix="recommender", directory="ckpt", config=config))
    if cfg.keep_often:
        callbacks.append(KeepOften())
    if not cfg.no_guard:
        callbacks.insert(1, mindguard.Guard())
    try:
        model.train(1, create_dataset(cfg), callbacks=callbacks, dataset_sink_mode=False)
    finally:
        if cfg.stats:
            peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
            steps = np.diff(timer.begins).tolist()
            with open(cfg.stats + ".tmp", "w") as f:
                json.dump({"peak_rss": peak, "step_seconds": steps}, f)
            os.replace(cfg.stats + ".tmp", cfg.stats)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
