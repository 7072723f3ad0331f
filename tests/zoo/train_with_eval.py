"""Small CNN classifier with validation during training: ``model.fit`` or a zoo-style EvalCallBack.

Shapes 6 and 7 of the hunt's real-script suite:

    python tests/zoo/train_with_eval.py [--mode graph|pynative] [--style fit|eval_callback] [--healthy]

``--style fit``: ``model.fit(3, train_ds, valid_ds, callbacks=[mindguard.Guard(), LossMonitor()])``.
``--style eval_callback``: ``model.train(3, train_ds, callbacks=[Guard(), LossMonitor(), EvalCallBack(...)])``
where ``EvalCallBack.on_train_epoch_end`` calls ``model.eval(valid_ds)`` (and saves the best checkpoint).
Either way an evaluation runs after epochs 1 and 2 before the failure.

The loss is a hand-written cross-entropy, ``-(onehot * log(softmax(logits)))``. 4 steps per epoch. The
planted bug: the preprocessing of train batch ``BAD_STEP = 10`` (epoch 3, step 2) multiplies the raw 0..255
pixels by 255 instead of dividing; the logits become huge, softmax underflows to exactly 0, log(0) = -inf
and 0 * -inf = NaN: the loss of global step 10 is NaN (call 1, epoch 3 step 2).
Expected: kind nonfinite_loss, Log forward, line ``# CULPRIT``, hint log_softmax.
``--healthy``: no mis-scaled batch; every loss and parameter stays finite (the hunt must exit 0).
"""
import argparse
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Callback, LossMonitor, Model

import mindguard

BAD_STEP = 10


def parse_args():
    parser = argparse.ArgumentParser(description="CNN with validation while training")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--style", choices=("fit", "eval_callback"), default="fit")
    parser.add_argument("--healthy", action="store_true", help="no mis-scaled batch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--num_classes", type=int, default=4)
    parser.add_argument("--lr", type=float, default=0.002)
    parser.add_argument("--ckpt_path", default="./eval_output")
    parser.add_argument("--watch", action="store_true", help="print the first non-finite step (verification)")
    parser.add_argument("--no_guard", action="store_true", help="train without mindguard (verification)")
    return parser.parse_args()


class ImageSource:
    def __init__(self, cfg, steps, seed, bad_step=None):
        rng = np.random.RandomState(seed)
        n = steps * cfg.batch_size
        self.raw = rng.randint(0, 256, size=(n, 1, 12, 12)).astype(np.float32)
        self.onehot = np.eye(cfg.num_classes, dtype=np.float32)[rng.randint(0, cfg.num_classes, n)]
        self.steps, self.batch, self.bad_step = steps, cfg.batch_size, bad_step
        self.epoch = 0

    def __len__(self):
        return self.steps * self.batch

    def __iter__(self):
        self.epoch += 1
        for i in range(len(self)):
            global_step = (self.epoch - 1) * self.steps + i // self.batch + 1
            scale = 255.0 if global_step == self.bad_step else 1.0 / 255.0  # BUG: * 255 instead of / 255
            yield self.raw[i] * scale, self.onehot[i]


def create_dataset(cfg, do_train):
    source = ImageSource(cfg, steps=4 if do_train else 2, seed=0 if do_train else 1,
                         bad_step=None if (cfg.healthy or not do_train) else BAD_STEP)
    dataset = ds.GeneratorDataset(source, column_names=["image", "label"], shuffle=False)
    return dataset.batch(cfg.batch_size, drop_remainder=True)


class SmallCNN(nn.Cell):
    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, pad_mode="valid")
        self.relu = nn.ReLU()
        self.pool = nn.MaxPool2d(2, 2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * 5 * 5, num_classes)

    def construct(self, x):
        return self.fc(self.flatten(self.pool(self.relu(self.conv1(x)))))


class CrossEntropyLoss(nn.Cell):
    def construct(self, logits, onehot):
        log_probs = ops.log(ops.softmax(logits, axis=-1))  # CULPRIT
        return -(onehot * log_probs).sum(axis=-1).mean()


class EvalCallBack(Callback):
    """Zoo-style evaluation callback: eval every ``interval`` epochs, keep the best checkpoint."""

    def __init__(self, model, eval_dataset, interval=1, ckpt_directory="./", best_ckpt_name="best.ckpt"):
        super().__init__()
        self.model = model
        self.eval_dataset = eval_dataset
        self.interval = interval
        self.best_acc = -1.0
        os.makedirs(ckpt_directory, exist_ok=True)
        self.best_ckpt_path = os.path.join(ckpt_directory, best_ckpt_name)

    def on_train_epoch_end(self, run_context):
        cb_params = run_context.original_args()
        epoch = cb_params.cur_epoch_num
        if epoch % self.interval:
            return
        result = self.model.eval(self.eval_dataset, dataset_sink_mode=False)
        print(f"epoch {epoch} eval result: {result}", flush=True)
        if result["acc"] > self.best_acc:
            self.best_acc = result["acc"]
            ms.save_checkpoint(cb_params.train_network, self.best_ckpt_path)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(0)
    train_ds, valid_ds = create_dataset(cfg, True), create_dataset(cfg, False)
    net = SmallCNN(cfg.num_classes)
    opt = nn.Momentum(net.trainable_params(), learning_rate=cfg.lr, momentum=0.9)
    model = Model(net, loss_fn=CrossEntropyLoss(), optimizer=opt, metrics={"acc"})
    callbacks = ([] if cfg.no_guard else [mindguard.Guard()]) + [LossMonitor()]
    if cfg.watch:
        from nan_watch import NanWatch
        callbacks.append(NanWatch())
    if cfg.style == "fit":
        model.fit(cfg.epochs, train_ds, valid_ds, callbacks=callbacks, dataset_sink_mode=False)
    else:
        callbacks.append(EvalCallBack(model, valid_ds, ckpt_directory=cfg.ckpt_path))
        model.train(cfg.epochs, train_ds, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished; all parameters finite:",
          all(bool(np.isfinite(p.asnumpy()).all()) for p in net.get_parameters()), flush=True)


if __name__ == "__main__":
    main()
