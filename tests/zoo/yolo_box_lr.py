"""A YOLO-style box head whose learning-rate schedule jumps 30x after the warm-up, in the model zoo's shape (issue 52).

    python tests/zoo/yolo_box_lr.py [--mode graph|pynative] [--fix] [--no_guard]

Written here after reading mindspore-ai/models official/cv/YOLOv5 (no code copied): the head predicts, per anchor,
``(tx, ty, tw, th)``; the box decode is ``xy = sigmoid(txy)``, ``wh = exp(twh) * anchors``; the loss compares the
decoded box with the target; the optimizer (``nn.Momentum``) takes a per-step learning-rate list from a warm-up +
constant schedule, under ``Model(net_with_loss, optimizer=...).train``.

The planted bug: the schedule's constant stage uses ``lr_max`` from a config written for a 30x larger batch:
after 4 warm-up steps (up to 0.01) the learning rate is 0.3. The weights of the head grow step by step until
``exp(twh)`` overflows float32 in the forward ``Exp`` of the box decode (line ``# CULPRIT``) and the loss is Inf/NaN.
The step moves with MindSpore's numerics (about global step 7-10).
Expected: an ``Exp`` (forward) at ``# CULPRIT``, traced to the learning rate (0.3 at that step, 30x the schedule's
median before); the hint fixes the schedule first, offers a clamp of x only as a guard, and no log-sum-exp (the
exps are not summed). ``--fix`` (``lr_max`` 0.01): healthy.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

ANCHORS, BATCH, STEPS_PER_EPOCH, WARMUP = 3, 4, 8, 4
BASE_LR = 0.05


def parse_args():
    parser = argparse.ArgumentParser(description="YOLO-style box head, warm-up + constant lr")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fix", action="store_true", help="lr_max for this batch size (verification)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


def warmup_constant_lr(lr_max, warmup, total):
    """Linear warm-up to the config's lr_max over ``warmup`` steps, then lr_max."""
    warm = [BASE_LR * (i + 1) / warmup for i in range(warmup)]   # warm-up written for the base lr
    return warm + [lr_max] * (total - warmup)


class BoxSource:
    def __init__(self):
        rng = np.random.RandomState(4)
        n = BATCH * STEPS_PER_EPOCH
        self.images = rng.normal(0, 1, (n, 3, 8, 8)).astype(np.float32)
        self.boxes = np.concatenate([rng.uniform(0.2, 0.8, (n, ANCHORS, 2)),
                                     rng.uniform(8.0, 40.0, (n, ANCHORS, 2))], axis=-1).astype(np.float32)

    def __len__(self):
        return len(self.images)

    def __getitem__(self, index):
        return self.images[index], self.boxes[index]


class YoloHead(nn.Cell):
    def __init__(self):
        super().__init__()
        self.backbone = nn.SequentialCell([nn.Conv2d(3, 8, 3, pad_mode="same"), nn.AvgPool2d(4, 4),
                                           nn.Flatten()])
        self.pred = nn.Dense(32, ANCHORS * 4)
        self.anchors = ms.Tensor(np.array([[10.0, 13.0], [16.0, 30.0], [33.0, 23.0]], np.float32))

    def construct(self, images):
        out = ops.reshape(self.pred(self.backbone(images)), (-1, ANCHORS, 4))
        xy = ops.sigmoid(out[:, :, :2])
        wh = ops.exp(out[:, :, 2:]) * self.anchors  # CULPRIT
        return ops.concat((xy, wh), -1)


class YoloWithLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.head = YoloHead()

    def construct(self, images, boxes):
        decoded = self.head(images)
        xy_loss = ops.reduce_mean(ops.square(decoded[:, :, :2] - boxes[:, :, :2]))
        wh_loss = ops.reduce_mean(ops.square(decoded[:, :, 2:] / boxes[:, :, 2:] - 1.0))   # relative size error
        return xy_loss + wh_loss


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(1)
    dataset = ds.GeneratorDataset(BoxSource(), ["images", "boxes"], shuffle=False).batch(BATCH, drop_remainder=True)
    net = YoloWithLoss()
    lr_max = BASE_LR if cfg.fix else 30 * BASE_LR   # BUG: lr_max of a config written for a 30x larger batch
    lr = warmup_constant_lr(lr_max, WARMUP, cfg.epochs * STEPS_PER_EPOCH)
    model = Model(net, optimizer=nn.Momentum(net.trainable_params(), learning_rate=lr, momentum=0.9))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
