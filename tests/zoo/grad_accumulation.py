"""Gradient accumulation in a functional loop, the way MindSpore's tutorial writes it: an ``Accumulator`` object
(not a Cell) sums each micro-batch's gradients into cloned Parameters and updates every ``--accum`` calls.

    python tests/zoo/grad_accumulation.py [--mode graph|pynative] [--jit] [--accum K] [--bad_step S]

Each token's embedding is reduced to its L2 norm (``ops.norm``). Micro-batch ``--bad_step`` (1-based) holds a
sample that is padding only: its vectors are zero, the forward pass and the loss stay finite, but the norm's
gradient at 0 is not (line ``# CULPRIT``), and on a micro-step that does not update, the NaN gradient sits in the
accumulator's buffers until the next update, ``--accum`` - 1 steps later at most. Expected: kind nonfinite_params at
global step S (the ``accumulate_`` buffers; the weights are still finite), the backward of the norm's Sqrt at
``# CULPRIT``.
"""
import argparse

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="gradient accumulation, functional loop")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="pynative")
    parser.add_argument("--jit", action="store_true")
    parser.add_argument("--accum", type=int, default=3)
    parser.add_argument("--bad_step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=9)
    return parser.parse_args()


class TokenNormRegressor(nn.Cell):
    """Embedding (padding row 0) -> the L2 norm of each token's vector -> Dense."""

    def __init__(self, vocab=12, dim=4, seq=5):
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim, padding_idx=0)
        self.head = nn.Dense(seq, 1)

    def construct(self, tokens):
        lengths = ops.norm(self.embedding(tokens), dim=-1)  # CULPRIT
        return self.head(lengths)


class Accumulator:
    def __init__(self, optimizer, accumulate_step):
        self.optimizer = optimizer
        self.inner_grads = optimizer.parameters.clone(prefix="accumulate_", init="zeros")
        self.zeros = optimizer.parameters.clone(prefix="zeros_", init="zeros")
        self.counter = Parameter(Tensor(1, ms.int32), "counter_")
        self.accumulate_step = accumulate_step
        self.map = ops.HyperMap()

    def __call__(self, grads):
        self.map(ops.partial(ops.assign_add), self.inner_grads, grads)
        if self.counter % self.accumulate_step == 0:
            self.optimizer(self.inner_grads)
            self.map(ops.partial(ops.assign), self.inner_grads, self.zeros)
        ops.assign_add(self.counter, Tensor(1, ms.int32))
        return True


def main():
    args = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(5)
    net = TokenNormRegressor()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    accumulator = Accumulator(optimizer, args.accum)
    loss_fn = nn.MSELoss()

    def forward_fn(x, y):
        return loss_fn(net(x), y) / args.accum

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        accumulator(grads)
        return loss

    if args.jit:
        train_step = ms.jit(train_step)
    train_step = mindguard.watch(train_step, net, optimizer)
    rng = np.random.RandomState(0)
    for step in range(1, args.steps + 1):
        x = rng.randint(1, 12, (4, 5)).astype(np.int32)
        if step == args.bad_step:
            x[2] = 0   # a sample that is padding only: its token vectors are all zero
        y = rng.uniform(-1, 1, (4, 1)).astype(np.float32)
        loss = train_step(Tensor(x), Tensor(y))
        print(f"micro-step {step}, loss {float(loss.asnumpy()):.4f}", flush=True)


if __name__ == "__main__":
    main()
