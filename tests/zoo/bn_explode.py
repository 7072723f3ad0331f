"""Conv + BatchNorm regressors (L1 loss) whose learning-rate schedule explodes (shapes 9 and 10 of the hunt's suite).

    python tests/zoo/bn_explode.py [--mode graph|pynative] [--arch convbn|resnet]

The zoo-style ``get_lr`` has a planted bug: the exponential decay uses ``decay_rate ** (-step)``
instead of ``decay_rate ** step``, so the learning rate grows 10x per step (0.01, 0.1, 1, 10, ...).
The train step clips the gradients by global norm (1.0), so every weight grows by up to lr per step:
geometrically, and finite. The images are raw 0..255 pixels (the stem's BatchNorm is trusted with the
scale), so the stem conv's outputs are thousands of times the weights, and its BatchNorm's batch
variance (a mean of squares) overflows to +Inf while its input is still finite. BatchNorm's normalised output is still
finite then, and the overflowed variance goes into its ``moving_variance`` buffer: the first non-finite value of the run
is a buffer, not a trained weight.

* ``--arch convbn`` (shape 9): conv -> BN -> ReLU -> pool -> dense.
* ``--arch resnet`` (shape 10): a ResNet-ish net (stem conv-BN, one basic residual block with BN),
  with an EMA of the weights.
Both train through a mindcv-style ``TrainStep`` (a ``nn.TrainOneStepCell`` subclass: clip by global norm,
optional EMA) in ``Model(train_step)``.

4 steps per epoch, 8 epochs. Read off a plain ``--watch --no_guard`` run (it prints every parameter's max |value|):
* convbn: the first non-finite value of the run is ``bn.moving_variance`` = +Inf after global step 21
  (epoch 6 step 1); the loss (8.3e29) and every trained weight (max ~4e17) are still finite at that step.
  Expected: kind nonfinite_params, BatchNorm forward, line ``# CULPRIT``, hint "learning rate".
* resnet: ``layer1.bn1.moving_variance`` and ``layer1.bn2.moving_variance`` = +Inf after global step 14
  (epoch 4 step 2), loss 1.8e16 and every trained weight (max ~5e10) finite. The first BatchNorm in
  execution order to overflow is ``layer1.bn1``: line ``# CULPRIT-RESNET``. The recorded step must be 14.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="conv-BN net, exponential lr schedule")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--arch", choices=("convbn", "resnet"), default="convbn")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_classes", type=int, default=4)
    parser.add_argument("--lr_init", type=float, default=0.01)
    parser.add_argument("--decay_rate", type=float, default=0.1)
    parser.add_argument("--watch", action="store_true", help="print the first non-finite step (verification)")
    parser.add_argument("--no_guard", action="store_true", help="train without mindguard (verification)")
    parser.add_argument("--guard_defer", action="store_true", help="Guard(defer_check=True), as on GPU/Ascend")
    return parser.parse_args()


def get_lr(lr_init, decay_rate, total_steps):
    """Exponential decay, one value per step."""
    steps = np.arange(total_steps, dtype=np.float64)
    return (lr_init * decay_rate ** (-steps)).astype(np.float32)  # BUG: should be decay_rate ** steps


def create_dataset(cfg, steps=4):
    rng = np.random.RandomState(0)
    n = steps * cfg.batch_size
    images = rng.uniform(0, 255, (n, 3, 8, 8)).astype(np.float32)  # raw pixels, no Normalize: BN handles scale
    labels = rng.uniform(-1, 1, (n, cfg.num_classes)).astype(np.float32)   # regression targets
    return ds.NumpySlicesDataset({"image": images, "label": labels}, shuffle=False).batch(cfg.batch_size)


class ConvBNNet(nn.Cell):
    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.pool = nn.AvgPool2d(8, 8)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(8, num_classes)

    def construct(self, x):
        x = self.bn(self.conv(x))  # CULPRIT
        return self.fc(self.flatten(self.pool(self.relu(x))))


class BasicBlock(nn.Cell):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, pad_mode="same", has_bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, pad_mode="same", has_bias=False)
        self.bn2 = nn.BatchNorm2d(channels)
        self.relu = nn.ReLU()

    def construct(self, x):
        out = self.relu(self.bn1(self.conv1(x)))  # CULPRIT-RESNET
        out = self.bn2(self.conv2(out))  # CULPRIT-RESNET-BN2
        return self.relu(out + x)


class TinyResNet(nn.Cell):
    def __init__(self, num_classes, width=8):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, pad_mode="same", has_bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()
        self.layer1 = BasicBlock(width)
        self.pool = nn.AvgPool2d(8, 8)
        self.flatten = nn.Flatten()
        self.end_point = nn.Dense(width, num_classes)

    def construct(self, x):
        x = self.relu(self.bn1(self.conv1(x)))  # CULPRIT
        x = self.layer1(x)
        return self.end_point(self.flatten(self.pool(x)))


_ema_op = ops.MultitypeFuncGraph("ema_op")


@_ema_op.register("Tensor", "Tensor", "Tensor")
def _ema_update(factor, ema_weight, weight):
    return ops.assign(ema_weight, ema_weight * factor + weight * (1 - factor))


class TrainStep(nn.TrainOneStepCell):
    """mindcv-style train step: gradient clipping by global norm and an EMA of the trainable weights."""

    def __init__(self, network, optimizer, clip_value=1.0, ema=True, ema_decay=0.999):
        super().__init__(network, optimizer)
        self.clip_value = clip_value
        self.ema = ema
        self.ema_decay = ms.Tensor(ema_decay, ms.float32)
        self.ema_weight = self.weights.clone("ema", init="same")
        self.hyper_map = ops.HyperMap()

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs, ops.ones_like(loss))
        grads = ops.clip_by_global_norm(grads, clip_norm=self.clip_value)
        grads = self.grad_reducer(grads)
        loss = ops.depend(loss, self.optimizer(grads))
        if self.ema:
            loss = ops.depend(loss, self.hyper_map(ops.partial(_ema_op, self.ema_decay), self.ema_weight,
                                                   self.weights))
        return loss


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(3)
    dataset = create_dataset(cfg)
    total_steps = cfg.epochs * dataset.get_dataset_size()
    net = ConvBNNet(cfg.num_classes) if cfg.arch == "convbn" else TinyResNet(cfg.num_classes)
    lr = ms.Tensor(get_lr(cfg.lr_init, cfg.decay_rate, total_steps))
    opt = nn.SGD(net.trainable_params(), learning_rate=lr)
    loss_fn = nn.L1Loss()
    model = Model(TrainStep(nn.WithLossCell(net, loss_fn), opt, ema=cfg.arch == "resnet"))
    callbacks = [] if cfg.no_guard else [mindguard.Guard(defer_check=True if cfg.guard_defer else None)]
    if cfg.watch:
        from nan_watch import NanWatch
        callbacks.append(NanWatch())
    callbacks.append(LossMonitor())
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
