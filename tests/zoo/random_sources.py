"""A classifier whose steps draw from every random source a zoo training uses (issue 39: a resume must restore them).

    python tests/zoo/random_sources.py [--mode graph|pynative] [--loop model|manual] [--data sampler|augment]
                                       [--dropout 0.2] [--disable-dropout] [--numpy-noise] [--poison 14]

Shaped like the model-zoo text/tabular classifiers: an MLP head with ``nn.Dropout``, a zoo-style dynamic-loss-scale
train cell written for CPU (``all_finite`` instead of the NPU float status), ``Model.train`` with ``Guard()`` and
``LossMonitor`` -- or (``--loop manual``) two train cells over one network and optimizer, stepped by hand in
turns (a "clean" and a "noisy" cell, as KGE scripts alternate head and tail batches), wrapped with
``mindguard.watch``. The data:

* ``--data sampler``: a ``GeneratorDataset`` over a random-access source whose sampler draws each epoch's order
  from numpy's global RNG (``np.random.permutation``, in the pipeline's thread);
* ``--data augment``: ``NumpySlicesDataset(shuffle=True)`` and a ``map`` that applies, at random
  (``transforms.RandomApply``, the pipeline's RNG), a jitter drawn from numpy's global RNG, in one worker;
* ``--data plain``: ``NumpySlicesDataset`` in order (for ``--numpy-noise``: one thread draws from numpy).

``--numpy-noise`` (manual loop): the step function draws input noise from numpy's and Python's global RNG (in
the main thread, as torch-style loops do). ``--poison N``: global step N's batch is corrupt (its features times
1e30: from a step counter Parameter in the graph, by hand in the manual loop), so the unscaled loss of step N is
inf: a failure at exactly step N. Everything is seeded (``mindspore.set_seed``, ``numpy.random.seed``).
"""
import argparse
import random

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.amp import all_finite
from mindspore.train import LossMonitor, Model

import mindguard

ROWS, FEATURES, CLASSES = 64, 8, 3


def parse_args():
    parser = argparse.ArgumentParser(description="classifier over every random source")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--loop", choices=("model", "manual"), default="model")
    parser.add_argument("--data", choices=("sampler", "augment", "plain"), default="sampler")
    parser.add_argument("--dropout", type=float, default=0.0)
    parser.add_argument("--disable-dropout", action="store_true")
    parser.add_argument("--numpy-noise", action="store_true")
    parser.add_argument("--poison", type=int, default=14, help="1-based global step whose batch has a NaN row")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class NumpyOrderSampler(ds.Sampler):
    """Each epoch's order from numpy's global RNG (as samplers of imbalanced-data zoo scripts do)."""

    def __iter__(self):
        return iter(np.random.permutation(ROWS).tolist())


class Rows:
    """Random-access source: the features and labels of ROWS samples."""

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __getitem__(self, index):
        return self.x[index], self.y[index]

    def __len__(self):
        return ROWS


def jitter(x):
    return (x + np.random.normal(0.0, 0.01, x.shape)).astype(np.float32)


def create_dataset(cfg):
    rng = np.random.RandomState(3)
    x = rng.uniform(-1, 1, (ROWS, FEATURES)).astype(np.float32)
    y = (np.argmax(x[:, :CLASSES], axis=1)).astype(np.int32)
    if cfg.data == "sampler":
        data = ds.GeneratorDataset(Rows(x, y), ["x", "y"], sampler=NumpyOrderSampler())
    elif cfg.data == "augment":
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True)
        augment = ds.transforms.RandomApply([jitter], prob=0.5)   # MindSpore's RNG picks, numpy's jitters
        data = data.map(augment, input_columns=["x"], num_parallel_workers=1)
    else:
        data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False)
    return data.batch(cfg.batch_size, drop_remainder=True)


class Classifier(nn.Cell):
    def __init__(self, dropout):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, 32)
        self.relu = nn.ReLU()
        self.drop = nn.Dropout(p=dropout)
        self.fc2 = nn.Dense(32, CLASSES)

    def construct(self, x):
        return self.fc2(self.drop(self.relu(self.fc1(x))))


class WithLoss(nn.Cell):
    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    def construct(self, x, y):
        return self.loss(self.net(x), y)


_grad_scale = ops.MultitypeFuncGraph("grad_scale")


@_grad_scale.register("Tensor", "Tensor")
def _tensor_grad_scale(scale, grad):
    return grad * ops.cast(ops.reciprocal(scale), ops.dtype(grad))


class TrainOneStepWithDynamicLossScaleCell(nn.TrainOneStepCell):
    """Zoo-style loss-scale cell that runs on CPU: all_finite instead of NPU float status."""

    def __init__(self, network, optimizer, scale_update_cell, name="scale_sense"):
        super().__init__(network, optimizer)
        self.loss_scaling_manager = scale_update_cell
        self.scale_sense = ms.Parameter(ms.Tensor(scale_update_cell.get_loss_scale(), ms.float32), name=name)
        self.hyper_map = ops.HyperMap()

    def construct(self, x, y):
        loss = self.network(x, y)
        scaling_sens = self.scale_sense
        sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(x, y, sens)
        grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        overflow = ops.logical_not(all_finite(grads))
        overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens


def train_model(cfg, train_cell, data):
    callbacks = [LossMonitor(1)]
    if not cfg.no_guard:
        callbacks.insert(0, mindguard.Guard(disable_dropout=cfg.disable_dropout))
    Model(train_cell).train(cfg.epochs, data, callbacks=callbacks, dataset_sink_mode=False)


def train_manual(cfg, net, optimizer, data):
    """Two train cells (each with its own loss scale) over one network and optimizer, stepped by hand in turns."""
    clean = TrainOneStepWithDynamicLossScaleCell(WithLoss(net), optimizer, nn.DynamicLossScaleUpdateCell(
        2.0 ** 12, 2, 1000), name="clean_scale")
    noisy = TrainOneStepWithDynamicLossScaleCell(WithLoss(net), optimizer, nn.DynamicLossScaleUpdateCell(
        2.0 ** 10, 2, 1000), name="noisy_scale")
    cells = nn.CellList([clean, noisy])
    cells.set_train()
    if cfg.disable_dropout:
        net.drop = nn.Identity()   # what Reproducible(disable_dropout=True) does for a Model.train

    def train_step(which, x, y):
        if cfg.numpy_noise:   # input noise drawn in the step (numpy's and Python's global RNG, main thread)
            noise = np.random.normal(0.0, 0.01, x.shape) * random.uniform(0.5, 1.5)
            x = x + ms.Tensor(noise.astype(np.float32))
        loss, overflow, _ = cells[which](x, y)
        return loss, overflow

    step = train_step if cfg.no_guard else mindguard.watch(train_step, cells, optimizer, update_flag="refused")
    global_step = 0
    for _ in range(cfg.epochs):
        for x, y in data.create_tuple_iterator(num_epochs=1):
            global_step += 1
            x = poison_batch(cfg, x, global_step)
            loss, overflow = step(global_step % 2, x, y)
            print(f"step {global_step} loss {loss.asnumpy():.6f} overflow {bool(overflow.asnumpy())}", flush=True)


def poison_batch(cfg, x, global_step):
    if global_step == cfg.poison:
        x = x.asnumpy().copy()
        x = x * 1e30   # BUG: a corrupt batch (sensor values in the wrong unit)
        return ms.Tensor(x)
    return x


class PoisonStep(nn.Cell):
    """The batch of global step ``--poison`` is corrupt: its features times 1e30."""

    def __init__(self, cell, cfg):
        super().__init__(auto_prefix=False)
        self.cell, self.poison = cell, cfg.poison
        self.seen = ms.Parameter(ms.Tensor(0, ms.int32), name="seen")

    def construct(self, x, y):
        step = ops.assign_add(self.seen, ops.ones((), ms.int32))
        x = x * ops.cast(ops.select(step == self.poison, ms.Tensor(1e30, ms.float32), ms.Tensor(1.0, ms.float32)),
                         x.dtype)
        return self.cell(x, y)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    np.random.seed(1)
    random.seed(1)
    net = Classifier(cfg.dropout)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    data = create_dataset(cfg)
    if cfg.loop == "manual":
        train_manual(cfg, net, optimizer, data)
    else:
        train_cell = TrainOneStepWithDynamicLossScaleCell(WithLoss(net), optimizer,
                                                          nn.DynamicLossScaleUpdateCell(2.0 ** 12, 2, 1000))
        train_cell = PoisonStep(train_cell, cfg)
        train_model(cfg, train_cell, data)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
