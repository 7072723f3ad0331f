"""Two more functional-loop shapes of the model zoo, with no mindguard in them (issue 53):

* ``--shape epoch``: mindcv's ``train_with_func.py`` -- ``train_epoch(...)`` defines ``forward_fn``, ``grad_fn`` and a
  ``jit``-compiled ``train_step`` anew at every epoch and iterates the dataset's tuple iterator;
* ``--shape trainer``: a trainer object whose ``fit`` calls its own ``train_step`` method (eager).

    python unmodified_functional_shapes.py --shape epoch|trainer [--bad_step 25] [--epochs 2] [--bad_epoch 1]

40 rows a batch of one, PyNative. Row ``--bad_step`` (1-based; 0: none) is scaled by 1000 in the data of epoch
``--bad_epoch`` (1-based) and later (the epochs before it iterate the clean rows), so ``log(softmax)`` on the marked
line underflows to ``log(0) = -inf`` at global step ``40 * (bad_epoch - 1) + bad_step``. Each step prints
``loss <loss>``.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 4)

    def construct(self, x):
        return ops.log(ops.softmax(self.fc(x), axis=-1))  # CULPRIT


def make_dataset(bad_step):
    x = np.random.RandomState(0).randn(40, 8).astype(np.float32)
    if bad_step:
        x[bad_step - 1] *= 1000
    y = np.random.RandomState(1).randint(0, 4, (40,)).astype(np.int32)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(1)


def train_epoch(network, dataset, loss_fn, optimizer):
    def forward_fn(data, label):
        logits = network(data)
        return loss_fn(logits, label), logits

    grad_fn = ops.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    @ms.jit
    def train_step(data, label):
        (loss, _), grads = grad_fn(data, label)
        return ops.depend(loss, optimizer(grads))

    network.set_train()
    for data, label in dataset.create_tuple_iterator():
        loss = train_step(data, label)
        print(f"loss {loss.asnumpy().item()!r}", flush=True)


class Trainer:
    def __init__(self, network, loss_fn, optimizer):
        self.network, self.loss_fn, self.optimizer = network, loss_fn, optimizer
        self.grad_fn = ms.value_and_grad(self.forward, None, optimizer.parameters)

    def forward(self, data, label):
        return self.loss_fn(self.network(data), label)

    def train_step(self, data, label):
        loss, grads = self.grad_fn(data, label)
        self.optimizer(grads)
        return loss

    def fit(self, dataset, epochs):
        for _ in range(epochs):
            for data, label in dataset.create_tuple_iterator():
                print(f"loss {self.train_step(data, label).asnumpy().item()!r}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["epoch", "trainer"], required=True)
    parser.add_argument("--bad_step", type=int, default=25)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--bad_epoch", type=int, default=1)
    args = parser.parse_args()

    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    network = Net()
    optimizer = nn.Momentum(network.trainable_params(), learning_rate=0.01, momentum=0.9)
    dataset = make_dataset(args.bad_step)
    if args.shape == "trainer":
        Trainer(network, nn.NLLLoss(), optimizer).fit(dataset, args.epochs)
        return
    clean = make_dataset(0) if args.bad_epoch > 1 else dataset
    for epoch in range(1, args.epochs + 1):
        train_epoch(network, dataset if epoch >= args.bad_epoch else clean, nn.NLLLoss(), optimizer)


if __name__ == "__main__":
    main()
