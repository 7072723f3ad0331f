"""Your own train cell (a TrainOneStepCell subclass with gradient clipping) inside Model, guarded by Guard.

    python own_train_cell.py
    mindguard hunt -- python own_train_cell.py --lr 1e4

Used by docs/how-to/own-train-cell.md; tests/test_docs.py runs it.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard


# [start:cell]
class TrainOneStepCellWithGradClip(nn.TrainOneStepCell):
    """A model-zoo style train cell: clip the gradients' global norm, then update."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = ops.clip_by_global_norm(grads, 1.0)
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.optimizer(grads))
# [end:cell]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 8)).astype(np.float32)
    dataset = ds.NumpySlicesDataset({"data": x, "label": x.sum(axis=1, keepdims=True)}, shuffle=False).batch(4)

    # [start:model]
    mindguard.fix_randomness(seed=1)
    net = nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))
    optimizer = nn.Momentum(net.trainable_params(), args.lr, 0.9)
    train_cell = TrainOneStepCellWithGradClip(nn.WithLossCell(net, nn.MSELoss()), optimizer)
    model = Model(train_cell)                  # no loss_fn: the train cell is the whole step
    model.train(2, dataset, callbacks=[mindguard.Guard(), LossMonitor()])
    # [end:model]
    finite = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    print(f"training ended; all parameters finite: {finite}")


if __name__ == "__main__":
    main()
