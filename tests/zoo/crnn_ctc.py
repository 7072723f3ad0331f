"""CRNN-style text recognizer trained with CTC loss, the way the model zoo's CRNN is written (round 3).

    python tests/zoo/crnn_ctc.py [--mode graph|pynative] [--bad_step 5] [--fix] [--no_guard]

A small conv stack turns an 8x32 text-line image into T = 8 time steps of 37-class logits; the zoo's ``CTCLoss``
cell feeds ``ops.CTCLoss`` the logits ``[T, N, C]``, constant ``labels_indices`` for labels of 7 characters,
the labels flattened to ``[N * 7]`` and a constant ``sequence_length`` of T per sample. ``Model(net, loss).train``.

The planted bug: the word of one sample in the batch of global step ``--bad_step`` (default 5: epoch 2, step 1)
is "aabbccd". CTC puts a blank between two equal neighbours, so that label needs 7 + 3 = 10 time steps and the
image gives 8: no alignment exists and the loss of that sample is +Inf, while the logits are fine. Expected:
kind nonfinite_loss, global step 5, the forward ``CTCLoss`` on line ``# CULPRIT``, and a hint that says the label
needs more time steps than the input gives -- not an epsilon or a clamp. ``--fix`` applies the hint's fix
(the infeasible sample's loss is zeroed; MindSpore 2.10's CPU kernels return +Inf for it even with
``ignore_longer_outputs_than_inputs=True``), and the run trains finite.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

NUM_CLASS = 37          # blank (36) + 26 letters + 10 digits
MAX_LABEL_LENGTH = 7
TIME_STEPS = 8
BATCH = 2
STEPS_PER_EPOCH = 4


def parse_args():
    parser = argparse.ArgumentParser(description="CRNN + CTC on synthetic text lines")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bad_step", type=int, default=5)
    parser.add_argument("--fix", action="store_true", help="zero the loss of samples CTC cannot align (the hint)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class TextLines:
    """Random-access (image, label) source: 8x32 grey images, labels of 7 class ids."""

    def __init__(self, bad_step):
        rng = np.random.RandomState(3)
        n = BATCH * STEPS_PER_EPOCH
        self.images = rng.rand(n, 1, 8, 32).astype(np.float32)
        words = [rng.choice(26, MAX_LABEL_LENGTH, replace=False) for _ in range(n)]
        self.labels = np.stack(words).astype(np.int32)
        self.bad_index = ((bad_step - 1) % STEPS_PER_EPOCH) * BATCH + 1
        self.bad_epoch = (bad_step - 1) // STEPS_PER_EPOCH
        self.reads = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        epoch = self.reads // len(self.labels)
        self.reads += 1
        label = self.labels[index]
        if index == self.bad_index and epoch == self.bad_epoch:
            label = np.array([0, 0, 1, 1, 2, 2, 3], np.int32)   # BUG: "aabbccd" needs 10 time steps, 8 exist
        return self.images[index], label


class CRNN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, pad_mode="same", has_bias=True)
        self.pool1 = nn.MaxPool2d(kernel_size=2, stride=2)
        self.conv2 = nn.Conv2d(16, 16, 3, pad_mode="same", has_bias=True)
        self.pool2 = nn.MaxPool2d(kernel_size=(4, 2), stride=(4, 2))
        self.relu = nn.ReLU()
        self.fc = nn.Dense(16, NUM_CLASS)

    def construct(self, x):
        x = self.pool1(self.relu(self.conv1(x)))
        x = self.pool2(self.relu(self.conv2(x)))          # [N, 16, 1, T]
        x = ops.squeeze(x, 2).transpose(2, 0, 1)           # [T, N, 16]
        logits = self.fc(x.reshape(-1, 16))                # [T * N, C]
        return logits.reshape(TIME_STEPS, -1, NUM_CLASS)   # [T, N, C]


class CTCLoss(nn.Cell):
    """The zoo's CTC loss cell: constant label indices and sequence lengths for a fixed batch."""

    def __init__(self, max_sequence_length, max_label_length, batch_size, fix=False):
        super().__init__()
        self.sequence_length = Tensor(np.array([max_sequence_length] * batch_size), ms.int32)
        indices = [[i, j] for i in range(batch_size) for j in range(max_label_length)]
        self.labels_indices = Tensor(np.array(indices), ms.int64)
        self.reshape = ops.Reshape()
        self.ctc_loss = ops.CTCLoss(ctc_merge_repeated=True)
        self.fix = fix

    def construct(self, logit, label):
        labels_values = self.reshape(label, (-1,))
        loss, _ = self.ctc_loss(logit, self.labels_indices, labels_values, self.sequence_length)  # CULPRIT
        if self.fix:
            loss = ops.select(ops.isinf(loss), ops.zeros_like(loss), loss)
        return loss.mean()


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    dataset = ds.GeneratorDataset(TextLines(cfg.bad_step), ["image", "label"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = CRNN()
    loss = CTCLoss(TIME_STEPS, MAX_LABEL_LENGTH, BATCH, fix=cfg.fix)
    model = Model(net, loss, nn.SGD(net.trainable_params(), learning_rate=0.01, momentum=0.9))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
