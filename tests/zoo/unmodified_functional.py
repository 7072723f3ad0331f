"""MindSpore 2.x's functional loop -- ``value_and_grad``, a ``train_step``, a ``for`` loop -- with no mindguard in it
(issue 53): the attach hook finds ``train_step`` and watches it.

    python unmodified_functional.py [--bad_step 4] [--steps 12] [--jit]

PyNative; ``--jit`` compiles ``train_step``. The batch of step ``--bad_step`` is scaled by 1000: ``log(softmax)``
on the marked line underflows to ``log(0) = -inf``. Each step prints ``loss <step> <loss>``.
"""
import argparse

import numpy as np

import mindspore
from mindspore import Tensor, nn, ops


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(8, 4)

    def construct(self, x):
        return ops.log(ops.softmax(self.fc(x), axis=-1))  # CULPRIT


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad_step", type=int, default=4)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--jit", action="store_true")
    args = parser.parse_args()

    mindspore.set_context(mode=mindspore.PYNATIVE_MODE, device_target="CPU")
    mindspore.set_seed(3)
    model = Net()
    loss_fn = nn.NLLLoss()
    optimizer = nn.SGD(model.trainable_params(), learning_rate=0.01)

    def forward_fn(data, label):
        logits = model(data)
        return loss_fn(logits, label), logits

    grad_fn = mindspore.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(data, label):
        (loss, _), grads = grad_fn(data, label)
        optimizer(grads)
        return loss

    if args.jit:
        train_step = mindspore.jit(train_step)

    rng = np.random.RandomState(0)
    for step in range(1, args.steps + 1):
        x = rng.randn(4, 8).astype(np.float32)
        if step == args.bad_step:
            x *= 1000
        label = Tensor(rng.randint(0, 4, (4,)).astype(np.int32))
        loss = train_step(Tensor(x), label).asnumpy().astype(np.float32)
        print(f"loss {step} {loss.item()!r} {loss.tobytes().hex()}", flush=True)


if __name__ == "__main__":
    main()
