"""One healthy training in the shapes model-zoo scripts train in, run bare or with mindguard, for the differential
tests of tests/test_guest.py (issue 50: with Guard on, a healthy training computes what it computes without it).

    python tests/zoo/guest.py --out DIR [--guard] [--mode graph|pynative]
                              [--loop model|fit|cell|scale|watch] [--amp O0|O2] [--lr 0.05] [--steps 12]

The network: ``Dense -> BatchNorm1d -> ReLU -> Dropout(p=0.3) -> Dense -> Dropout(keep_prob=0.8) -> Dense``, seeded
with ``mindspore.set_seed``/``numpy.random.seed`` as zoo scripts seed, CPU kernels on one thread (MindSpore's CPU
dropout fills its mask from several threads, so two bare runs can differ; on one thread they agree bit for bit).

``--loop``: ``model`` -- ``Model(net, loss, opt, amp_level).train`` with ``ModelCheckpoint``; ``fit`` -- ``Model.fit``
with a validation set and an accuracy metric; ``cell`` -- the project's own ``nn.TrainOneStepCell`` subclass (with
gradient clipping) under ``Model(train_cell).train``; ``scale`` -- the zoo's CPU dynamic loss-scale cell
(``all_finite`` + ``DynamicLossScaleUpdateCell``) returning ``(loss, overflow, scale)``; ``watch`` -- a functional
``value_and_grad`` loop (``@jit`` in GRAPH mode) with ``save_checkpoint`` every 4 steps. ``--guard`` adds
``mindguard.Guard()`` to the callbacks, or wraps the step with ``mindguard.watch``; nothing else differs.

Writes to ``--out``: ``result.json`` (the per-step losses as float32 bit patterns and floats, the cell types of the
network after training, the checkpoint files written) and ``weights.npz`` (every Parameter after training).
"""
import argparse
import json
import os

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops
from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint

ROWS, FEATURES, CLASSES, BATCH = 96, 12, 3, 8


def parse_args():
    parser = argparse.ArgumentParser(description="a healthy training, bare or with mindguard")
    parser.add_argument("--out", required=True)
    parser.add_argument("--guard", action="store_true")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--loop", choices=("model", "fit", "cell", "scale", "watch"), default="model")
    parser.add_argument("--amp", choices=("O0", "O2"), default="O0")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--steps", type=int, default=12, help="steps per epoch (the data repeats to fill them)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--same-batch", action="store_true", help="every batch is the first one")
    return parser.parse_args()


class Classifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(FEATURES, 32)
        self.bn = nn.BatchNorm1d(32)
        self.relu = nn.ReLU()
        self.drop1 = nn.Dropout(p=0.3)
        self.fc2 = nn.Dense(32, 16)
        self.drop2 = nn.Dropout(keep_prob=0.8)   # the older spelling zoo code still uses
        self.head = nn.Dense(16, CLASSES)

    def construct(self, x):
        x = self.drop1(self.relu(self.bn(self.fc1(x))))
        return self.head(self.drop2(self.relu(self.fc2(x))))


class ClippedTrainStep(nn.TrainOneStepCell):
    """The project's own train cell: gradients clipped by global norm before the update."""

    def construct(self, *inputs):
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = ops.clip_by_global_norm(grads, 1.0)
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.optimizer(grads))


class DynamicScaleStep(nn.TrainOneStepWithLossScaleCell):
    """The zoo's CPU dynamic loss-scale cell: the overflow flag from ``all_finite`` (the stock cell's NPU float status
    has no CPU kernel); returns ``(loss, overflow, scale)``."""

    def construct(self, *inputs):
        weights = self.weights
        loss = self.network(*inputs)
        scaling_sens = self.scale_sense
        sens = ops.fill(loss.dtype, loss.shape, 1.0) * ops.cast(scaling_sens, loss.dtype)
        grads = self.grad(self.network, weights)(*inputs, sens)
        grads = self.hyper_map(ops.partial(_unscale, scaling_sens), grads)
        grads = self.grad_reducer(grads)
        overflow = ops.logical_not(ms.amp.all_finite(grads))
        overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens


def _unscale(scale, grad):
    return grad * ops.cast(ops.reciprocal(scale), grad.dtype)


def create_dataset(same_batch: bool, steps: int):
    rng = np.random.RandomState(0)
    x = rng.randn(ROWS, FEATURES).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int32) + (x[:, 1] > 0.5).astype(np.int32)
    if same_batch:
        x, y = np.tile(x[:BATCH], (ROWS // BATCH, 1)), np.tile(y[:BATCH], ROWS // BATCH)
    rows = steps * BATCH
    x, y = np.resize(x, (rows, FEATURES)), np.resize(y, rows)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH, drop_remainder=True)


class LossLog(Callback):
    """The losses a user's own logging callback sees (``net_outputs``'s first element)."""

    def __init__(self, losses):
        super().__init__()
        self.losses = losses

    def on_train_step_end(self, run_context):
        out = run_context.original_args().get("net_outputs")
        self.losses.append(np.asarray((out[0] if isinstance(out, (tuple, list)) else out).asnumpy(), np.float32))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.device_context.cpu.op_tuning.threads_num(1)
    ms.set_seed(1)
    np.random.seed(1)
    guard = None
    if cfg.guard:
        import mindguard
    net = Classifier()
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    optimizer = nn.Momentum(net.trainable_params(), learning_rate=cfg.lr, momentum=0.9)
    data = create_dataset(cfg.same_batch, cfg.steps)
    ckpt_dir = os.path.join(cfg.out, "ckpt")
    losses = []
    if cfg.loop == "watch":
        forward = lambda x, y: loss_fn(net(x), y)   # noqa: E731 - the loop's loss, as zoo loops write it
        grad_fn = ms.value_and_grad(forward, None, optimizer.parameters)

        def train_step(x, y):
            loss, grads = grad_fn(x, y)
            optimizer(grads)
            return loss

        if cfg.mode == "graph":
            train_step = ms.jit(train_step)
        if cfg.guard:
            train_step = mindguard.watch(train_step, net, optimizer)
        net.set_train()
        os.makedirs(ckpt_dir, exist_ok=True)
        step = 0
        for _ in range(cfg.epochs):
            for x, y in data.create_tuple_iterator(num_epochs=1):
                step += 1
                losses.append(np.asarray(train_step(x, y).asnumpy(), np.float32))
                if step % 4 == 0:
                    ms.save_checkpoint(net, os.path.join(ckpt_dir, f"net-{step}.ckpt"))
    else:
        callbacks = [LossLog(losses), ModelCheckpoint(prefix="net", directory=ckpt_dir,
                                                      config=CheckpointConfig(save_checkpoint_steps=4))]
        if cfg.guard:
            guard = mindguard.Guard()
            callbacks.append(guard)
        if cfg.loop in ("model", "fit"):
            amp = {"amp_level": cfg.amp, "loss_scale_manager": None} if cfg.amp != "O0" else {}   # fp16 on CPU
            model = Model(net, loss_fn, optimizer, metrics={"acc"} if cfg.loop == "fit" else None, **amp)
        else:
            with_loss = nn.WithLossCell(net, loss_fn)
            cell = (ClippedTrainStep(with_loss, optimizer) if cfg.loop == "cell" else
                    DynamicScaleStep(with_loss, optimizer, nn.DynamicLossScaleUpdateCell(2.0 ** 12, 2, 1000)))
            model = Model(cell)
        if cfg.loop == "fit":
            model.fit(cfg.epochs, data, create_dataset(False, 4), callbacks=callbacks, dataset_sink_mode=False)
        else:
            model.train(cfg.epochs, data, callbacks=callbacks, dataset_sink_mode=False)
    weights = {name: p.asnumpy() for name, p in net.parameters_and_names()}
    weights.update({f"optimizer/{p.name}": p.asnumpy() for p in optimizer.parameters})
    np.savez(os.path.join(cfg.out, "weights.npz"), **weights)
    result = {
        "losses": [float(v) for v in losses],
        "loss_bits": [int(np.asarray(v, np.float32).view(np.uint32)) for v in losses],
        "cells": [f"{name}:{type(cell).__module__}.{type(cell).__name__}" for name, cell in net.cells_and_names()],
        "checkpoints": sorted(os.listdir(ckpt_dir)) if os.path.isdir(ckpt_dir) else [],
        "failure": None if guard is None or guard.failure is None else guard.failure.kind,
    }
    with open(os.path.join(cfg.out, "result.json"), "w") as f:
        json.dump(result, f)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
