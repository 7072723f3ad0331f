"""A LeNet-style CNN with a hand-written cross-entropy, guarded by mindguard.

The bug, a classic: the loss is ``-(onehot * log(softmax(logits))).sum()``. One batch of the data
pipeline is scaled wrongly (a preprocessing branch multiplies the raw 0..255 pixels by 255 instead of
dividing by it); the logits grow huge, softmax underflows to exactly 0 for the wrong classes, ``log(0)`` is
-inf, and ``0 * -inf`` is NaN. Run it under the hunt to see mindguard name the Log op and its line:

    mindguard hunt -- python samples/lenet_guard.py

``--fixed`` uses ``ops.log_softmax`` instead (what ``nn.SoftmaxCrossEntropyWithLogits`` does).
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard


class LeNet(nn.Cell):
    def __init__(self, num_classes=4):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, pad_mode="valid")
        self.conv2 = nn.Conv2d(4, 8, 3, pad_mode="valid")
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(8 * 2 * 2, 16)
        self.fc2 = nn.Dense(16, num_classes)

    def construct(self, x):
        x = self.pool(self.relu(self.conv1(x)))
        x = self.pool(self.relu(self.conv2(x)))
        return self.fc2(self.relu(self.fc1(self.flatten(x))))


class HandWrittenCrossEntropy(nn.Cell):
    def __init__(self, fixed=False):
        super().__init__()
        self.fixed = fixed

    def construct(self, logits, onehot):
        if self.fixed:
            log_probs = ops.log_softmax(logits, axis=-1)
        else:
            log_probs = ops.log(ops.softmax(logits, axis=-1))
        return -(onehot * log_probs).sum(axis=-1).mean()


def make_dataset(steps_per_epoch=6, batch=8, bad_step=9):
    """Synthetic 14x14 images (raw pixels 0..255, divided by 255); the batch at 1-based global step
    ``bad_step`` is multiplied by 255 instead."""
    rng = np.random.RandomState(0)
    n = steps_per_epoch * batch
    raw = rng.randint(0, 256, size=(n, 1, 14, 14)).astype(np.float32)
    labels = rng.randint(0, 4, size=(n,))
    onehot = np.eye(4, dtype=np.float32)[labels]

    class Source:  # one pass = one epoch; __len__ keeps MindSpore from iterating it to count batches
        epoch = 0

        def __len__(self):
            return steps_per_epoch

        def __iter__(self):
            self.epoch += 1
            for step in range(1, steps_per_epoch + 1):
                global_step = (self.epoch - 1) * steps_per_epoch + step
                sl = slice((step - 1) * batch, step * batch)
                yield (raw[sl] * 255.0 if global_step == bad_step else raw[sl] / 255.0), onehot[sl]

    return ds.GeneratorDataset(Source(), column_names=["image", "label"], shuffle=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--fixed", action="store_true", help="use log_softmax (the fix)")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(0)
    net = LeNet()
    loss_fn = HandWrittenCrossEntropy(fixed=args.fixed)
    model = Model(net, loss_fn, nn.Momentum(net.trainable_params(), learning_rate=0.002, momentum=0.9))
    model.train(args.epochs, make_dataset(), callbacks=[mindguard.Guard(), LossMonitor(1)],
                dataset_sink_mode=False)


if __name__ == "__main__":
    main()
