"""The functional training loop of MindSpore 2.x (value_and_grad), guarded by mindguard.watch.

    python functional_loop.py                # PyNative, eager step
    python functional_loop.py --jit          # the step compiled with @mindspore.jit
    mindguard hunt -- python functional_loop.py --lr 1e4

Used by docs/how-to/functional-loop.md; tests/test_docs.py runs it.
"""
import argparse

import numpy as np

import mindspore
import mindspore.dataset as ds
from mindspore import nn

import mindguard

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("graph", "pynative"), default="pynative")
parser.add_argument("--jit", action="store_true", help="compile train_step with @mindspore.jit")
parser.add_argument("--lr", type=float, default=0.01)
args = parser.parse_args()
mindspore.set_context(mode=mindspore.GRAPH_MODE if args.mode == "graph" else mindspore.PYNATIVE_MODE,
                      device_target="CPU")
mindguard.fix_randomness(seed=1)

rng = np.random.default_rng(0)
x = rng.standard_normal((32, 8)).astype(np.float32)
dataset = ds.NumpySlicesDataset({"data": x, "label": x.sum(axis=1, keepdims=True)}, shuffle=False).batch(4)
net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
loss_fn = nn.MSELoss()
optimizer = nn.SGD(net.trainable_params(), learning_rate=args.lr)


def forward_fn(data, label):
    logits = net(data)
    return loss_fn(logits, label), logits


# [start:watch]
grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


def train_step(data, label):
    (loss, _), grads = grad_fn(data, label)
    optimizer(grads)
    return loss


if args.jit:
    train_step = mindspore.jit(train_step)   # optional: a compiled step gets operator-level dumps

train_step = mindguard.watch(train_step, net, optimizer)   # raises mindguard.NonFiniteError at the first failure
# [end:watch]

# [start:loop]
for epoch in range(2):
    for data, label in dataset.create_tuple_iterator():
        loss = train_step(data, label)
    print(f"epoch {epoch + 1}: loss {float(loss.asnumpy()):.4f}")
# [end:loop]
