"""A WGAN-GP trained the way model-zoo WGAN-GP ports are (round 4): a critic's loss cell that computes its own
gradient penalty with ``GradOperation`` (a double backward inside the train step), two ``nn.TrainOneStepCell``
stepped by hand in GRAPH mode, ``Diters`` critic steps per generator step.

    python tests/zoo/wgan_gp.py [--mode graph|pynative] [--wiring watch|jit|model] [--fix] [--no_guard]

Wirings: ``watch`` -- ``mindguard.watch(netD_train, netD)`` around the critic's ``TrainOneStepCell`` (the most common
zoo pattern); ``jit`` -- the critic step is an ``@ms.jit`` function calling the cell; ``model`` -- the critic's train
cell in ``Model(netD_train).train`` with ``mindguard.Guard()``, the generator stepped from a callback.

The planted bug: the critic's output layer is initialised to zero ("start from a neutral critic"). Its gradient
with respect to the input is then exactly 0 for every sample, the penalty's 2-norm ``mnp.norm(gradients, 2, axis=1)``
is the norm of a zero vector, and the backward of its square root (``Pow(x, 0.5)``) is +inf: the critic's weights are
NaN after global step 1 while its loss is a finite ``LAMBDA`` (10.0). Expected: nonfinite_params at global step 1,
the backward of the norm's Pow/Sqrt on line ``# CULPRIT``, a safe-norm hint. ``--fix`` computes the norm as
``mindguard.safe_norm`` (``sqrt(sum(x**2) + epsilon)``), which trains finite.

``--clip_warmup N`` (``--wiring model`` only) adds the original WGAN's weight clipping on top, in a callback
listed before Guard (as ports that clip in ``on_train_step_end`` do), its bound warming up linearly over N steps:
with N = 0 the bound of the first step is ``0/0`` = NaN and the clipping writes NaN into every critic weight after
the step's graph ran. With ``--fix`` the penalty is healthy, so that is the only failure: global step 1, Parameters
NaN, the step's own dump finite -- nothing in the graph made it (expected: exit 3, unexplained, made outside).
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
import mindspore.numpy as mnp
from mindspore import Tensor, nn, ops
from mindspore.common import initializer as init
from mindspore.train import Callback, Model

import mindguard

NZ = 8
IMAGE = 8
BATCH = 8
IMAGES = 64
LAMBDA = 10


def parse_args():
    parser = argparse.ArgumentParser(description="WGAN-GP with a zero-initialised critic head")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--wiring", choices=("watch", "jit", "model"), default="watch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--diters", type=int, default=2, help="critic steps per generator step")
    parser.add_argument("--fix", action="store_true", help="the penalty's norm as mindguard.safe_norm")
    parser.add_argument("--clip_warmup", type=int, default=-1,
                        help="model wiring: clip the critic's weights in a callback, the bound warming up over N steps")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class Generator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(NZ, 32)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(32, IMAGE * IMAGE)
        self.tanh = nn.Tanh()

    def construct(self, noise):
        return self.tanh(self.fc2(self.relu(self.fc1(noise)))).reshape(-1, 1, IMAGE, IMAGE)


class Critic(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=2, pad_mode="same", has_bias=True)
        self.act = nn.LeakyReLU(0.2)
        self.flatten = nn.Flatten()
        self.fc = nn.Dense(4 * (IMAGE // 2) * (IMAGE // 2), 1)

    def construct(self, x):
        return self.fc(self.flatten(self.act(self.conv(x))))


def init_weight(net, zero_head):
    """DCGAN-style init: N(0, 0.02) everywhere; the critic's output layer zero (the bug)."""
    for _name, cell in net.cells_and_names():
        if isinstance(cell, (nn.Conv2d, nn.Dense)):
            cell.weight.set_data(init.initializer(init.Normal(0.02), cell.weight.shape))
    if zero_head:
        net.fc.weight.set_data(init.initializer("zeros", net.fc.weight.shape))   # BUG: a zero critic head
        net.fc.bias.set_data(init.initializer("zeros", net.fc.bias.shape))


class GenWithLossCell(nn.Cell):
    def __init__(self, net_g, net_d):
        super().__init__()
        self.net_g, self.net_d = net_g, net_d

    def construct(self, noise):
        return -self.net_d(self.net_g(noise)).mean()


class DisWithLossCell(nn.Cell):
    """The critic's Wasserstein loss plus LAMBDA times the gradient penalty on interpolated samples."""

    def __init__(self, net_g, net_d, fix=False):
        super().__init__()
        self.net_g, self.net_d = net_g, net_d
        self.gradop = ops.GradOperation()
        self.fix = fix

    def gradient_penalty(self, real, fake):
        alpha = Tensor(np.linspace(0.1, 0.9, BATCH).reshape(BATCH, 1, 1, 1).astype(np.float32))
        interpolates = alpha * real + (1 - alpha) * fake
        gradients = self.gradop(self.net_d)(interpolates)
        gradients = gradients.view(gradients.shape[0], -1)
        if self.fix:
            norms = mindguard.safe_norm(gradients, axis=1)
        else:
            norms = mnp.norm(gradients, 2, axis=1)  # CULPRIT
        return ops.reduce_mean((norms - 1) ** 2)

    def construct(self, real, noise):
        err_real = self.net_d(real).mean()
        fake = ops.stop_gradient(self.net_g(noise))
        err_fake = self.net_d(fake).mean()
        return err_fake - err_real + self.gradient_penalty(real, fake) * LAMBDA


class Images:
    """Random-access source of "decoded" images in [-1, 1] and the noise of each critic step."""

    def __init__(self):
        rng = np.random.RandomState(0)
        self.images = rng.uniform(-1, 1, (IMAGES, 1, IMAGE, IMAGE)).astype(np.float32)
        self.noise = rng.randn(IMAGES, NZ).astype(np.float32)

    def __len__(self):
        return IMAGES

    def __getitem__(self, index):
        return self.images[index], self.noise[index]


class GeneratorStep(Callback):
    """Model.train wiring: one generator step after every ``diters`` critic steps."""

    def __init__(self, net_g_train, diters):
        self.net_g_train, self.diters = net_g_train, diters
        self.rng = np.random.RandomState(2)

    def on_train_step_end(self, run_context):
        cb = run_context.original_args()
        if cb.cur_step_num % self.diters == 0:
            loss_g = self.net_g_train(Tensor(self.rng.randn(BATCH, NZ).astype(np.float32)))
            print(f"step {cb.cur_step_num}: loss_D {float(cb.net_outputs.asnumpy()):.4f} "
                  f"loss_G {float(loss_g.asnumpy()):.4f}", flush=True)


class WeightClip(Callback):
    """The original WGAN's weight clipping after each critic step, its bound warming up over ``warmup`` steps."""

    def __init__(self, net_d, warmup):
        self.net_d, self.warmup = net_d, warmup

    def on_train_step_end(self, run_context):
        step = run_context.original_args().cur_step_num
        with np.errstate(invalid="ignore", divide="ignore"):
            bound = 0.01 * np.minimum(1.0, np.float32(step - 1) / np.float32(self.warmup))   # BUG: 0/0 with warmup 0
        for param in self.net_d.trainable_params():
            param.set_data(Tensor(np.clip(param.asnumpy(), -bound, bound)))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    net_g, net_d = Generator(), Critic()
    init_weight(net_g, zero_head=False)
    init_weight(net_d, zero_head=True)
    opt_d = nn.Adam(net_d.trainable_params(), learning_rate=1e-4, beta1=0.5, beta2=0.9)
    opt_g = nn.Adam(net_g.trainable_params(), learning_rate=1e-4, beta1=0.5, beta2=0.9)
    net_g_train = nn.TrainOneStepCell(GenWithLossCell(net_g, net_d), opt_g)
    net_d_train = nn.TrainOneStepCell(DisWithLossCell(net_g, net_d, cfg.fix), opt_d)
    net_g_train.set_train()
    net_d_train.set_train()
    dataset = ds.GeneratorDataset(Images(), ["image", "noise"], shuffle=False).batch(BATCH, drop_remainder=True)

    if cfg.wiring == "model":
        callbacks = [GeneratorStep(net_g_train, cfg.diters)]
        if cfg.clip_warmup >= 0:
            callbacks.insert(0, WeightClip(net_d, cfg.clip_warmup))
        if not cfg.no_guard:
            callbacks.insert(1 if cfg.clip_warmup >= 0 else 0, mindguard.Guard())
        Model(net_d_train).train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
        print("training finished", flush=True)
        return

    if cfg.wiring == "jit":
        @ms.jit
        def critic_step(real, noise):
            return net_d_train(real, noise)
    else:
        critic_step = net_d_train
    step = critic_step if cfg.no_guard else mindguard.watch(critic_step, net_d, opt_d)
    rng = np.random.RandomState(2)
    for epoch in range(cfg.epochs):
        for i, (real, noise) in enumerate(dataset.create_tuple_iterator()):
            loss_d = step(real, noise)
            if (i + 1) % cfg.diters == 0:
                loss_g = net_g_train(Tensor(rng.randn(BATCH, NZ).astype(np.float32)))
                print(f"[{epoch}][{i + 1}] Loss_D: {float(loss_d.asnumpy()):.4f} "
                      f"Loss_G: {float(loss_g.asnumpy()):.4f}", flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
