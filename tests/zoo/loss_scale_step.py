"""Regression MLP trained with a zoo-style dynamic-loss-scale train cell (shape 8 of the hunt's suite).

    python tests/zoo/loss_scale_step.py [--mode graph|pynative]

``TrainOneStepWithDynamicLossScaleCell`` is written the model-zoo way for CPU (MindSpore's stock
``TrainOneStepWithLossScaleCell`` uses NPU float-status ops): scaled grads, ``mindspore.amp.all_finite``
on them, ``nn.DynamicLossScaleUpdateCell`` to adjust the scale, the optimizer skipped on overflow, and it
returns ``(loss, overflow, scaling_sens)`` with the *unscaled* loss.

4 steps per epoch, 3 epochs. Two planted data faults (from the data logic below):
* global step 3 (epoch 1 step 3): one sample is a sensor glitch of 1e17 (huge but finite). The loss is
  finite (~1e32) but the gradients scaled by 2**24 overflow: overflow=True, the update is skipped and the
  scale halves. That is normal loss-scale behaviour, NOT a failure.
* global step 7 (epoch 2 step 3): one sample's label is NaN. The unscaled loss is NaN on this overflow step:
  a failure, kind nonfinite_loss, its batch holds non-finite values (origin direction "input").
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.amp import all_finite
from mindspore.train import Callback, LossMonitor, Model, TimeMonitor

import mindguard

GLITCH_STEP, NAN_STEP = 3, 7


def parse_args():
    parser = argparse.ArgumentParser(description="MLP regression with dynamic loss scale")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--in_dim", type=int, default=6)
    parser.add_argument("--loss_scale", type=float, default=2.0 ** 24)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--watch", action="store_true", help="print the first non-finite step (verification)")
    parser.add_argument("--no_guard", action="store_true", help="train without mindguard (verification)")
    return parser.parse_args()


class SensorSource:
    def __init__(self, cfg, steps=4):
        rng = np.random.RandomState(5)
        self.x = rng.uniform(-1, 1, (steps * cfg.batch_size, cfg.in_dim)).astype(np.float32)
        self.y = (self.x.sum(axis=1, keepdims=True) * 0.5).astype(np.float32)
        self.steps, self.batch = steps, cfg.batch_size
        self.epoch = 0

    def __len__(self):
        return len(self.x)

    def __iter__(self):
        self.epoch += 1
        for i in range(len(self.x)):
            x = self.x[i].copy()
            global_step = (self.epoch - 1) * self.steps + i // self.batch + 1
            if i % self.batch == 1 and global_step == GLITCH_STEP:
                x[0] = 1e17            # glitch: huge but finite
            y = self.y[i].copy()
            if i % self.batch == 2 and global_step == NAN_STEP:
                y[0] = np.nan          # broken record: its label is NaN
            yield x, y


def create_dataset(cfg):
    return ds.GeneratorDataset(SensorSource(cfg), ["data", "label"], shuffle=False).batch(cfg.batch_size)


class MLP(nn.Cell):
    def __init__(self, in_dim):
        super().__init__()
        self.fc1 = nn.Dense(in_dim, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 1)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(x)))


_grad_scale = ops.MultitypeFuncGraph("grad_scale")


@_grad_scale.register("Tensor", "Tensor")
def _tensor_grad_scale(scale, grad):
    return grad * ops.cast(ops.reciprocal(scale), ops.dtype(grad))


class TrainOneStepWithDynamicLossScaleCell(nn.TrainOneStepCell):
    """Zoo-style loss-scale cell that runs on CPU: all_finite instead of NPU float status."""

    def __init__(self, network, optimizer, scale_update_cell):
        super().__init__(network, optimizer)
        self.loss_scaling_manager = scale_update_cell
        self.scale_sense = ms.Parameter(ms.Tensor(scale_update_cell.get_loss_scale(), ms.float32),
                                        name="scale_sense")
        self.hyper_map = ops.HyperMap()

    def construct(self, data, label):
        loss = self.network(data, label)
        scaling_sens = self.scale_sense
        sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(data, label, sens)
        grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        grads = self.grad_reducer(grads)
        overflow = ops.logical_not(all_finite(grads))
        overflow = self.loss_scaling_manager(self.scale_sense, overflow)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens


class OverflowMonitor(Callback):
    """Zoo-style: print the overflow flag and the loss scale of every step."""

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        loss, overflow, scale = cb.net_outputs
        if bool(overflow.asnumpy()):
            print(f"======== Over Flow ======== step {cb.cur_step_num}: loss={loss.asnumpy()} "
                  f"scale={scale.asnumpy()}", flush=True)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(2)
    dataset = create_dataset(cfg)
    net = MLP(cfg.in_dim)
    opt = nn.Momentum(net.trainable_params(), learning_rate=cfg.lr, momentum=0.9)
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=cfg.loss_scale, scale_factor=2, scale_window=1000)
    train_cell = TrainOneStepWithDynamicLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt, manager)
    model = Model(train_cell)
    callbacks = ([] if cfg.no_guard else [mindguard.Guard()]) + [TimeMonitor(), OverflowMonitor(), LossMonitor()]
    if cfg.watch:
        from nan_watch import NanWatch
        callbacks.append(NanWatch())
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
