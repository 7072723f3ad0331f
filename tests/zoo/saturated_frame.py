"""An edge-detector CNN fed one saturated frame: the weight gradient of its stem overflows, nothing else does.

    python tests/zoo/saturated_frame.py [--clip]

A classifier of 36x36 single-channel frames whose stem is a 5x5 convolution initialised with the integer
Laplacian-of-Gaussian edge kernel (its weights sum to exactly 0, so a flat region gives 0) and pooled by a
global *sum* (the amount of edges matters); the loss sums over the batch. One frame of the first batch is
saturated: every pixel 1e37 (a float32 frame scaled twice). Forward, the zero-sum kernels map the flat frame
to rounding residue (far below the fp32 maximum) and the loss is finite. Backward, the stem's weight gradient sums frame
x upstream gradient over 1024 positions: 1024 x 1e37 x ~0.1 exceeds the fp32 maximum, so ``Conv2DBackpropFilter`` makes
+-Inf from finite inputs and Momentum writes it into ``stem.weight``. (Poisoned at a later step, the trained kernels no
longer sum to 0 and the forward overflows first.)

``--clip``: a mindcv-style train step clips the gradients by global norm (1.0) before the optimizer, so the
overflowed gradient is read by the clipping ops (whose outputs turn Inf/NaN from it) before Momentum.

Expected: kind nonfinite_params at global step 1, origin Conv2DBackpropFilter (the backward of the conv on
the line ``# CULPRIT``), found only in a full dump: the hunt's narrow dump leaves weight gradients out.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="edge-detector CNN, one saturated frame")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--clip", action="store_true", help="clip the gradients by global norm in the train step")
    parser.add_argument("--batch_size", type=int, default=8)
    return parser.parse_args()


LOG_KERNEL = np.array([[0, 0, -1, 0, 0], [0, -1, -2, -1, 0], [-1, -2, 16, -2, -1], [0, -1, -2, -1, 0],
                       [0, 0, -1, 0, 0]], np.float32)   # sums to 0


def create_dataset(cfg):
    rng = np.random.RandomState(0)
    n = cfg.steps * cfg.batch_size
    frames = rng.normal(0, 1, (n, 1, 36, 36)).astype(np.float32)
    frames[0] = 1e37   # the saturated frame
    labels = rng.randint(0, 2, (n,)).astype(np.int32)
    return ds.NumpySlicesDataset({"image": frames, "label": labels}, shuffle=False).batch(cfg.batch_size)


class EdgeNet(nn.Cell):
    def __init__(self, channels=4, num_classes=2):
        super().__init__()
        weight = np.stack([LOG_KERNEL[None] * scale for scale in (1.0, -1.0, 0.5, -0.5)[:channels]])
        self.stem = nn.Conv2d(1, channels, 5, pad_mode="valid", has_bias=False, weight_init=ms.Tensor(weight))
        self.head = nn.Dense(channels, num_classes)

    def construct(self, x):
        edges = self.stem(x)  # CULPRIT
        return self.head(ops.sum(edges, (2, 3)))


class ClipTrainStep(nn.TrainOneStepCell):
    """Train step with gradient clipping by global norm (as mindcv's TrainStep does)."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
        grads = ops.clip_by_global_norm(grads, clip_norm=1.0)
        return ops.depend(loss, self.optimizer(grads))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE)
    mindguard.fix_randomness(1)
    net = EdgeNet()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
    opt = nn.Momentum(net.trainable_params(), learning_rate=1e-4, momentum=0.9)
    if cfg.clip:
        model = Model(ClipTrainStep(nn.WithLossCell(net, loss_fn), opt))
    else:
        model = Model(net, loss_fn, opt)
    model.train(1, create_dataset(cfg), callbacks=[mindguard.Guard()], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
