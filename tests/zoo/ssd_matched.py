"""SSD-style detector whose loss is normalised by the number of matched boxes, in the model zoo's shape (round 4).

    python tests/zoo/ssd_matched.py [--mode graph|pynative] [--bad_step 8] [--bad_step_file F] [--fix] [--no_guard]

Written here after reading mindspore-ai/models official/cv/SSD (no code copied): a small conv backbone with a
location head ``[N, A, 4]`` and a class head ``[N, A, C]``; ``SSDWithLossCell.construct(x, gt_loc, gt_label,
num_matched_boxes)`` masks a smooth-L1 location loss by the matched anchors, adds a sigmoid focal classification loss
and divides both by ``reduce_sum(cast(num_matched_boxes, float32))``; ``TrainingWrapper`` (``GradOperation`` with a
sens, Momentum) and ``Model(train_net).train``.

The planted bug: the box matcher drops every ground-truth box of the batch of global step ``--bad_step`` (default 8:
epoch 2, step 2 of 6; an IoU threshold above what these boxes reach), so ``num_matched_boxes`` is 0 and the loss is
+inf. Expected: kind nonfinite_loss, global step 8, ``RealDiv`` (forward) on line ``# CULPRIT``, a hint that says
the denominator is a count and to clamp it to >= 1 (``ops.maximum(n, 1)``), never an epsilon (``n + 1e-6`` turns
+inf into ~1e8 and wrecks the training); ``--fix`` clamps it and trains finite.

``--bad_step_file F``: read the bad step from file F when the batch is made (an empty file or 0: no bad batch) -- a
data pipeline whose order changes between runs, for ``hunt --from`` on a record that does not come back as it was.
"""
import argparse
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

NUM_ANCHORS = 24
NUM_CLASSES = 4
BATCH = 2
STEPS_PER_EPOCH = 6


def parse_args():
    parser = argparse.ArgumentParser(description="SSD-style detector")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--bad_step", type=int, default=8)
    parser.add_argument("--bad_step_file", default="")
    parser.add_argument("--fix", action="store_true", help="clamp the count as the hint says (verification)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class BoxSource:
    """(image, gt_loc, gt_label, num_matched_boxes) per image; the batch of the bad step has no matched anchor."""

    def __init__(self, bad_step, bad_step_file):
        rng = np.random.RandomState(3)
        n = BATCH * STEPS_PER_EPOCH
        self.images = rng.uniform(0, 1, (n, 3, 16, 16)).astype(np.float32)
        self.locs = rng.normal(0, 0.5, (n, NUM_ANCHORS, 4)).astype(np.float32)
        self.labels = (rng.randint(0, NUM_CLASSES, (n, NUM_ANCHORS)) * (rng.uniform(0, 1, (n, NUM_ANCHORS)) < 0.3)) \
            .astype(np.int32)
        self.labels[:, 0] = 1   # every image has at least one matched anchor ...
        self.bad_step, self.bad_step_file = bad_step, bad_step_file
        self.reads = 0

    def _bad_step(self):
        if not self.bad_step_file:
            return self.bad_step
        if not os.path.exists(self.bad_step_file):
            return self.bad_step
        with open(self.bad_step_file) as f:
            text = f.read().strip()
        return int(text) if text else 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        step = self.reads // BATCH + 1   # the 1-based global step this sample's batch feeds
        self.reads += 1
        label = self.labels[index].copy()
        if step == self._bad_step():
            label[:] = 0   # BUG: the matcher's IoU threshold is above what this batch's boxes reach
        return self.images[index], self.locs[index], label, np.array(int((label > 0).sum()), np.int32)


class TinySSD(nn.Cell):
    def __init__(self):
        super().__init__()
        self.features = nn.SequentialCell([nn.Conv2d(3, 8, 3, stride=2, pad_mode="same"), nn.ReLU(),
                                           nn.Conv2d(8, 8, 3, stride=2, pad_mode="same"), nn.ReLU()])
        self.loc_head = nn.Conv2d(8, 6 * 4, 1)            # 6 anchors per cell of the 2x2 map below
        self.cls_head = nn.Conv2d(8, 6 * NUM_CLASSES, 1)
        self.pool = nn.AvgPool2d(2, 2)

    def construct(self, x):
        f = self.pool(self.features(x))                    # [N, 8, 2, 2]
        loc = ops.transpose(self.loc_head(f), (0, 2, 3, 1))
        cls = ops.transpose(self.cls_head(f), (0, 2, 3, 1))
        return ops.reshape(loc, (-1, NUM_ANCHORS, 4)), ops.reshape(cls, (-1, NUM_ANCHORS, NUM_CLASSES))


class SigmoidFocalClassificationLoss(nn.Cell):
    def __init__(self, gamma=2.0, alpha=0.75):
        super().__init__()
        self.sigmoid_cross_entropy = ops.SigmoidCrossEntropyWithLogits()
        self.gamma, self.alpha = gamma, alpha

    def construct(self, logits, label):
        label = ops.one_hot(label, NUM_CLASSES, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
        sigmiod_cross_entropy = self.sigmoid_cross_entropy(logits, label)
        sigmoid = ops.sigmoid(logits)
        p_t = label * sigmoid + (1 - label) * (1 - sigmoid)
        modulating_factor = ops.pow(1 - p_t, self.gamma)
        alpha_weight_factor = label * self.alpha + (1 - label) * (1 - self.alpha)
        return modulating_factor * alpha_weight_factor * sigmiod_cross_entropy


class SSDWithLossCell(nn.Cell):
    def __init__(self, network, fix=False):
        super().__init__()
        self.network = network
        self.class_loss = SigmoidFocalClassificationLoss()
        self.loc_loss = nn.SmoothL1Loss()
        self.less = ops.Less()
        self.fix = fix

    def construct(self, x, gt_loc, gt_label, num_matched_boxes):
        pred_loc, pred_label = self.network(x)
        mask = ops.cast(self.less(ms.Tensor(0, ms.int32), gt_label), ms.float32)
        num_matched_boxes = ops.reduce_sum(ops.cast(num_matched_boxes, ms.float32))
        if self.fix:
            num_matched_boxes = ops.maximum(num_matched_boxes, 1)
        mask_loc = ops.tile(ops.expand_dims(mask, -1), (1, 1, 4))
        smooth_l1 = self.loc_loss(pred_loc, gt_loc) * mask_loc
        loss_loc = ops.reduce_sum(ops.reduce_sum(smooth_l1, -1), -1)
        loss_cls = ops.reduce_sum(self.class_loss(pred_label, gt_label), (1, 2))
        return ops.reduce_sum((loss_cls + loss_loc) / num_matched_boxes)  # CULPRIT


class TrainingWrapper(nn.Cell):
    def __init__(self, network, optimizer, sens=1.0):
        super().__init__(auto_prefix=False)
        self.network = network
        self.network.set_grad()
        self.weights = ms.ParameterTuple(network.trainable_params())
        self.optimizer = optimizer
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = sens

    def construct(self, *args):
        loss = self.network(*args)
        sens = ops.fill(ops.dtype(loss), ops.shape(loss), self.sens)
        grads = self.grad(self.network, self.weights)(*args, sens)
        self.optimizer(grads)
        return loss


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    source = BoxSource(cfg.bad_step, cfg.bad_step_file)
    dataset = ds.GeneratorDataset(source, ["image", "box", "label", "num_match"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = TinySSD()
    loss_net = SSDWithLossCell(net, fix=cfg.fix)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9, weight_decay=1e-4)
    model = Model(TrainingWrapper(loss_net, opt))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
