"""An SSD-style detector with a MobileNetV2 backbone, trained the way model-zoo detection scripts train (issue 38).

    python tests/zoo/ssd_detector.py [--mode graph|pynative] [--epochs 2] [--steps 5] [--no_guard]

The shape of mindspore-ai/models' SSD ``train.py`` (written anew, small): a MobileNetV2 feature extractor of
``ConvBNReLU`` / ``InvertedResidual`` blocks (width 1.0: 3.5 M weights, above the 3 MiB the host check reads on CPU),
extra ``InvertedResidual`` layers for the smaller feature maps, a ``MultiBox`` head of depthwise-separable convolutions
per feature map (boxes and classes), an ``SSDWithLossCell`` (smooth L1 on the matched boxes + sigmoid focal loss,
divided by the matched count), a hand-written ``TrainingWrapper`` train cell, ``Momentum`` with a per-step learning-rate
array, and ``Model(net).train(..., callbacks=[TimeMonitor, LossMonitor, Guard])``. More than 500 Parameters (the weights
and the BatchNorm statistics): Guard's Parameter check must run on them like on a small model, with no warning.

The training is healthy. It prints ``parameters: N`` and, at its end, ``training finished``.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model, TimeMonitor

import mindguard

IMAGE = 64
CLASSES = 4
BATCH = 2
DEFAULTS = (3, 6, 6, 6, 4, 4)   # default boxes per location, per feature map


def parse_args():
    parser = argparse.ArgumentParser(description="SSD-MobileNetV2 style detector")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5, help="batches per epoch")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


def divisible(value, divisor=8):
    return max(divisor, int(value + divisor / 2) // divisor * divisor)


class ConvBNReLU(nn.Cell):
    def __init__(self, cin, cout, kernel=3, stride=1, depthwise=False):
        super().__init__()
        conv = nn.Conv2d(cin, cin if depthwise else cout, kernel, stride, pad_mode="same",
                         group=cin if depthwise else 1)
        self.features = nn.SequentialCell([conv, nn.BatchNorm2d(cout, momentum=0.97), nn.ReLU6()])

    def construct(self, x):
        return self.features(x)


class InvertedResidual(nn.Cell):
    def __init__(self, cin, cout, stride, expand):
        super().__init__()
        hidden = int(round(cin * expand))
        layers = [ConvBNReLU(cin, hidden, kernel=1)] if expand != 1 else []
        layers += [ConvBNReLU(hidden, hidden, stride=stride, depthwise=True),
                   nn.Conv2d(hidden, cout, 1, has_bias=False), nn.BatchNorm2d(cout, momentum=0.97)]
        self.conv = nn.SequentialCell(layers)
        self.residual = stride == 1 and cin == cout

    def construct(self, x):
        out = self.conv(x)
        return x + out if self.residual else out


class MobileNetV2Features(nn.Cell):
    """The backbone: the 13th block's expansion and the last feature map (SSD taps both)."""

    SETTING = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
               (6, 320, 1, 1))

    def __init__(self, width=1.0):
        super().__init__()
        channels = divisible(32 * width)
        features = [ConvBNReLU(3, channels, stride=2)]
        index = 0
        for expand, cout, repeat, stride in self.SETTING:
            cout = divisible(cout * width)
            for i in range(repeat):
                if index == 13:
                    self.expand_13 = ConvBNReLU(channels, channels * expand, kernel=1)
                    self.channels_13 = channels * expand
                features.append(InvertedResidual(channels, cout, stride if i == 0 else 1, expand))
                channels = cout
                index += 1
        self.last_channels = divisible(1280 * width)
        features.append(ConvBNReLU(channels, self.last_channels, kernel=1))
        self.features_1 = nn.SequentialCell(features[:14])
        self.features_2 = nn.SequentialCell(features[14:])

    def construct(self, x):
        out = self.features_1(x)
        return self.expand_13(out), self.features_2(out)


def head_conv(cin, cout):
    """An SSDLite head: a depthwise-separable stage (depthwise 3x3, 1x1, each with BatchNorm + ReLU6), then the
    zoo's ``_last_conv2d`` (depthwise 3x3 + BatchNorm + ReLU6, a 1x1 convolution with bias)."""
    return nn.SequentialCell([ConvBNReLU(cin, cin, depthwise=True), ConvBNReLU(cin, cin, kernel=1),
                              nn.Conv2d(cin, cin, 3, pad_mode="same", group=cin), nn.BatchNorm2d(cin),
                              nn.ReLU6(), nn.Conv2d(cin, cout, 1, has_bias=True)])


class SSD(nn.Cell):
    def __init__(self):
        super().__init__()
        self.backbone = MobileNetV2Features()
        maps = [self.backbone.channels_13, self.backbone.last_channels, 64, 32, 32, 16]
        self.extras = nn.CellList([InvertedResidual(maps[i], maps[i + 1], 2, 0.2) for i in range(1, 5)])
        self.loc = nn.CellList([head_conv(c, 4 * k) for c, k in zip(maps, DEFAULTS)])
        self.cls = nn.CellList([head_conv(c, CLASSES * k) for c, k in zip(maps, DEFAULTS)])

    def construct(self, x):
        first, out = self.backbone(x)
        features = (first, out)
        for extra in self.extras:
            out = extra(out)
            features += (out,)
        batch = x.shape[0]
        locs, labels = (), ()
        for i in range(len(self.loc)):
            locs += (ops.transpose(self.loc[i](features[i]), (0, 2, 3, 1)).reshape(batch, -1),)
            labels += (ops.transpose(self.cls[i](features[i]), (0, 2, 3, 1)).reshape(batch, -1),)
        return ops.concat(locs, 1).reshape(batch, -1, 4), ops.concat(labels, 1).reshape(batch, -1, CLASSES)


class SigmoidFocalLoss(nn.Cell):
    def __init__(self, gamma=2.0, alpha=0.75):
        super().__init__()
        self.gamma, self.alpha = gamma, alpha

    def construct(self, logits, label):
        target = ops.one_hot(label, CLASSES, ms.Tensor(1.0), ms.Tensor(0.0))
        bce = ops.binary_cross_entropy_with_logits(logits, target, ops.ones_like(logits), ops.ones_like(logits),
                                                   reduction="none")
        prob = ops.sigmoid(logits)
        p_t = target * prob + (1 - target) * (1 - prob)
        weight = (target * self.alpha + (1 - target) * (1 - self.alpha)) * ops.pow(1 - p_t, self.gamma)
        return weight * bce


class SSDWithLossCell(nn.Cell):
    def __init__(self, network):
        super().__init__()
        self.network = network
        self.class_loss = SigmoidFocalLoss()
        self.loc_loss = nn.SmoothL1Loss()

    def construct(self, image, gt_loc, gt_label, num_matched):
        pred_loc, pred_label = self.network(image)
        mask = ops.cast(gt_label > 0, ms.float32)
        matched = ops.reduce_sum(ops.cast(num_matched, ms.float32))
        loss_loc = (self.loc_loss(pred_loc, gt_loc) * ops.expand_dims(mask, -1)).sum(-1).sum(-1)
        loss_cls = self.class_loss(pred_label, gt_label).sum((1, 2))
        return ((loss_cls + loss_loc) / matched).sum()


class TrainingWrapper(nn.Cell):
    """The zoo's train cell: gradients with a sensitivity, then the optimizer."""

    def __init__(self, network, optimizer, sens=1.0):
        super().__init__(auto_prefix=False)
        self.network = network
        self.network.set_grad()
        self.weights = optimizer.parameters
        self.optimizer = optimizer
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = sens

    def construct(self, *args):
        loss = self.network(*args)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*args, sens)
        self.optimizer(grads)
        return loss


class Detections:
    """Random-access source of images with their matched default boxes (what the zoo's box encoder yields)."""

    def __init__(self, count, boxes):
        rng = np.random.RandomState(0)
        self.images = rng.uniform(-1, 1, (count, 3, IMAGE, IMAGE)).astype(np.float32)
        self.labels = rng.randint(0, CLASSES, (count, boxes)).astype(np.int32)
        self.locs = rng.normal(0, 0.5, (count, boxes, 4)).astype(np.float32)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        matched = np.array([max(int((self.labels[i] > 0).sum()), 1)], np.int32)
        return self.images[i], self.locs[i], self.labels[i], matched


def count_boxes():
    sizes, size = [], IMAGE
    for _ in range(5):   # the backbone's stride 16 and 32 maps, then four stride-2 extras
        size = (size + 1) // 2
        sizes.append(size)
    maps = [sizes[3], sizes[4]]
    for _ in range(4):
        maps.append((maps[-1] + 1) // 2)
    return sum(m * m * k for m, k in zip(maps, DEFAULTS))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    ssd = SSD()
    print(f"parameters: {len(list(ssd.get_parameters()))}", flush=True)
    net = SSDWithLossCell(ssd)
    total = cfg.epochs * cfg.steps
    lr = np.linspace(0.01, 0.002, total).astype(np.float32)
    opt = nn.Momentum(ssd.trainable_params(), ms.Tensor(lr), 0.9, weight_decay=1.5e-4)
    train_net = TrainingWrapper(net, opt)
    source = Detections(cfg.steps * BATCH, count_boxes())
    dataset = ds.GeneratorDataset(source, ["image", "box", "label", "num_match"], shuffle=False).batch(BATCH)
    callbacks = [TimeMonitor(data_size=cfg.steps), LossMonitor()]
    if not cfg.no_guard:
        callbacks.append(mindguard.Guard())
    Model(train_net).train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
