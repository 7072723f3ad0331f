"""Data-parallel text regression, one msrun launcher per node (the shape of a model-zoo ``train.py`` run by
``msrun --node_rank=K`` on each machine): token ids -> embedding -> ``nn.Norm`` per position -> dense head.

Each rank reads its shard (``num_shards=get_group_size(), shard_id=get_rank()``). ``--pad-rank R --pad-step S``: at
1-based global step ``S`` the batch of rank ``R`` holds a sentence padded to the end (token 0, whose embedding row
is all zeros), so ``nn.Norm``'s backward, ``SqrtGrad``, divides by a zero norm on that rank only; the gradient
AllReduce carries the Inf/NaN to every other rank.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.communication import get_group_size, get_rank, init
from mindspore.context import ParallelMode
from mindspore.train import Callback, Model

import mindguard

VOCAB, DIM, SEQ, BATCH = 6, 4, 3, 4


class TokenNormRegressor(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM, padding_idx=0)
        self.norm = nn.Norm(axis=-1)
        self.head = nn.Dense(SEQ, 1)

    def construct(self, tokens):
        return self.head(self.norm(self.embedding(tokens)))


def shard(rank, group_size, steps_per_epoch, pad_rank, pad_step):
    rows = steps_per_epoch * BATCH * group_size
    rng = np.random.RandomState(7)
    tokens = rng.randint(1, VOCAB, size=(rows, SEQ)).astype(np.int32)
    labels = (tokens > 0).sum(axis=1, keepdims=True).astype(np.float32) * 0.5
    data = ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False, num_shards=group_size,
                                 shard_id=rank)

    def pad_one(batch_tokens, batch_labels, info):
        batch_tokens = np.stack(batch_tokens)
        global_step = info.get_epoch_num() * steps_per_epoch + info.get_batch_num() + 1   # both 0-based
        if rank == pad_rank and global_step == pad_step:
            batch_tokens[0, :] = 0   # a sentence of padding only: its embedding rows are zero
        return batch_tokens, np.stack(batch_labels)

    return data.batch(BATCH, drop_remainder=True, per_batch_map=pad_one, input_columns=["tokens", "label"])


class StepPrinter(Callback):
    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        print(f"rank {get_rank()} step {cb.cur_step_num}: loss {float(cb.net_outputs.asnumpy()):.6f}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps-per-epoch", type=int, default=4)
    parser.add_argument("--pad-rank", type=int, default=None)
    parser.add_argument("--pad-step", type=int, default=5)
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    init()
    ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
    mindguard.fix_randomness(3)
    net = TokenNormRegressor()
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
    data = shard(get_rank(), get_group_size(), args.steps_per_epoch, args.pad_rank, args.pad_step)
    model.train(args.epochs, data, callbacks=[mindguard.Guard(), StepPrinter()], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
