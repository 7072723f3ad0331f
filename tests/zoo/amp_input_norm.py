"""A small conv-BN classifier trained with AMP O2 and a fixed loss scale, standardising its input itself.

    python tests/zoo/amp_input_norm.py [--mode graph|pynative] [--amp_level O0|O2] [--bad_step K]

``InputStandardize`` divides by each channel's standard deviation over the batch, without an epsilon. Batch
``--bad_step`` (1-based) has a channel that is constant (an all-black channel of every image): its std is 0, the
division is 0/0 (line ``# CULPRIT``) and the loss goes NaN. Under O2, MindSpore's CPU backend computes several
float16-typed ops (the square before the variance among them) in float32 and its dump labels their files float16:
their bytes are not their values, and must not be read as an Inf/NaN of their own.
Expected: kind nonfinite_loss at global step K, Div (forward) at ``# CULPRIT``.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import FixedLossScaleManager, LossMonitor, Model

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="conv-BN net, AMP, hand-written input standardisation")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--amp_level", choices=("O0", "O2"), default="O2")
    parser.add_argument("--bad_step", type=int, default=5, help="the batch with a constant channel (0: none)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=8)
    return parser.parse_args()


class InputStandardize(nn.Cell):
    def construct(self, x):
        mean = x.mean(axis=(0, 2, 3), keep_dims=True)
        std = ops.sqrt(((x - mean) ** 2).mean(axis=(0, 2, 3), keep_dims=True))
        return (x - mean) / std  # CULPRIT


def conv_bn_relu(in_channels, out_channels):
    return nn.SequentialCell([nn.Conv2d(in_channels, out_channels, 3, pad_mode="same", has_bias=False),
                              nn.BatchNorm2d(out_channels), nn.ReLU()])


class SmallConvNet(nn.Cell):
    def __init__(self, num_classes=4):
        super().__init__()
        self.standardize = InputStandardize()
        self.features = conv_bn_relu(3, 8)
        self.head = nn.SequentialCell([nn.AvgPool2d(8, 8), nn.Flatten(), nn.Dense(8, num_classes)])

    def construct(self, x):
        return self.head(self.features(self.standardize(x)))


def create_dataset(cfg):
    rng = np.random.RandomState(0)
    images = rng.uniform(0, 1, (cfg.steps * cfg.batch_size, 3, 8, 8)).astype(np.float32)
    if cfg.bad_step:
        first = (cfg.bad_step - 1) * cfg.batch_size
        images[first:first + cfg.batch_size, 2] = 0.0   # the blue channel is black in every image of that batch
    labels = rng.randint(0, 4, cfg.steps * cfg.batch_size).astype(np.int32)
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(cfg.batch_size)


def main():
    args = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(3)
    net = SmallConvNet()
    loss = nn.CrossEntropyLoss(label_smoothing=0.1)
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9)
    model = Model(net, loss, optimizer, amp_level=args.amp_level,
                  loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=False))
    model.train(1, create_dataset(args), callbacks=[LossMonitor(), mindguard.Guard()], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
