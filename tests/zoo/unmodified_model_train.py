"""A ``Model.train`` script as a user launches it, with no mindguard in it (issue 53: ``mindguard run``,
``MINDGUARD=1``, ``mindguard hunt`` attach Guard from outside).

    python unmodified_model_train.py [--bad_step 6] [--epochs 2] [--mode graph|pynative] [--no_seed] [--distributed]

Four non-negative features -> sqrt -> Dense(4, 8) -> tanh -> Dense(8, 1), MSE; 8 batches of 4 per epoch. The batch
of global step ``--bad_step`` (0: none) holds a negative feature (a sign flipped by a broken preprocessing step):
``sqrt`` on the marked line turns it into NaN and that step's loss is NaN. ``--distributed``: data-parallel under
msrun (``init()``, every rank's shard; the bad batch on rank 1). Each step prints ``loss <global step> <loss>``
with the loss's exact float32 bits, so that a run with Guard attached is compared with a bare one.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, Model

FEATURES, BATCH, STEPS = 4, 4, 8


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, 8)
        self.fc2 = nn.Dense(8, 1)

    def construct(self, x):
        h = ops.sqrt(x)  # CULPRIT
        return self.fc2(ops.tanh(self.fc1(h)))


class PrintLoss(Callback):
    def __init__(self):
        super().__init__()
        self.step = 0

    def on_train_step_end(self, run_context):
        self.step += 1
        loss = run_context.original_args().net_outputs.asnumpy().astype(np.float32)
        print(f"loss {self.step} {loss.item()!r} {loss.tobytes().hex()}", flush=True)


def dataset(bad_step, epochs, rank=0, group_size=1, bad_rank=0):
    def rows():
        rng = np.random.RandomState(0)
        for epoch in range(epochs):
            for step in range(1, STEPS + 1):
                global_step = epoch * STEPS + step
                for r in range(group_size):
                    x = np.abs(rng.randn(BATCH, FEATURES)).astype(np.float32)
                    y = rng.randn(BATCH, 1).astype(np.float32)
                    if global_step == bad_step and r == bad_rank:
                        x[1, 2] = -x[1, 2] - 0.5   # the broken preprocessing step
                    if r == rank:
                        yield x, y
    return ds.GeneratorDataset(list(rows()), ["x", "y"], shuffle=False)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad_step", type=int, default=6)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--no_seed", action="store_true", help="set no seed (the initial weights then vary)")
    parser.add_argument("--distributed", action="store_true", help="data-parallel under msrun")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    rank, group_size = 0, 1
    if args.distributed:
        from mindspore.communication import get_group_size, get_rank, init
        from mindspore.context import ParallelMode

        init()
        ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
        rank, group_size = get_rank(), get_group_size()
    if not args.no_seed:
        ms.set_seed(1)
    net = Net()
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
    data = dataset(args.bad_step, 1, rank, group_size, bad_rank=group_size - 1)
    model.train(args.epochs, data, callbacks=[PrintLoss()], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
