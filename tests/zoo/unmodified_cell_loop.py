"""A hand-written loop over a ``TrainOneStepCell`` subclass, with no mindguard in it (issue 53).

    python unmodified_cell_loop.py [--bad_step 5] [--steps 12] [--mode graph|pynative]

Model-zoo code often clips the gradients in a ``TrainOneStepCell`` subclass of its own and steps it by hand. The
batch of step ``--bad_step`` (0: none) holds a zero where the features are log-scaled: ``log`` on the marked line
gives -inf and that step's loss is Inf. Each step prints ``loss <step> <loss>`` with the loss's exact bits.
"""
import argparse

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops

FEATURES, BATCH = 4, 4


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(FEATURES, 1)

    def construct(self, x):
        return self.fc(ops.log(x))  # CULPRIT


class ClipTrainStep(nn.TrainOneStepCell):
    """The zoo's step: the gradients clipped by global norm before the update."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
        grads = ops.clip_by_global_norm(grads, 1.0)
        self.optimizer(grads)
        return loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bad_step", type=int, default=5)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(2)
    net = Net()
    train_step = ClipTrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.Adam(net.trainable_params(), 0.01))
    train_step.set_train()
    rng = np.random.RandomState(0)
    for step in range(1, args.steps + 1):
        x = rng.uniform(0.5, 2.0, (BATCH, FEATURES)).astype(np.float32)
        y = rng.randn(BATCH, 1).astype(np.float32)
        if step == args.bad_step:
            x[2, 1] = 0.0   # a missing value filled with 0 before the log scaling
        loss = train_step(Tensor(x), Tensor(y)).asnumpy().astype(np.float32)
        print(f"loss {step} {loss.item()!r} {loss.tobytes().hex()}", flush=True)


if __name__ == "__main__":
    main()
