"""A GAN trained by a functional loop over the script's own image loader, wrapped with ``mindguard.watch`` (issue 39).

    python tests/zoo/gan_loader_watch.py [--corrupt 158] [--after] [--no_guard]

The MindSpore 2.x GAN tutorial's shape (written anew, small): ``value_and_grad`` of the discriminator's and the
generator's losses, a ``@ms.jit`` step for each, one ``train_step`` that runs both, wrapped once with
``mindguard.watch(train_step, net)`` over a cell holding both networks. The images come from the script's own
loader (a Python generator that "decodes" files and yields batches of 4, as many GAN repositories write it), not
MindSpore's dataset pipeline: 160 files, 40 steps an epoch.

The planted failure: the file of index ``--corrupt`` (default 158, in the batch of global step 40) is truncated and
the loader's decoder raises ``ValueError`` between two steps, in the script's own code. ``--after``: the loop ends
healthy and the script's code raises after the last step instead (writing the samples out). Either way the run
failed, so Guard's line ``mindguard hunt --from ...`` must be printed and the record say where.
"""
import argparse

import numpy as np

import mindspore as ms
from mindspore import nn, ops

import mindguard

FILES = 160
BATCH = 4
LATENT = 8


def parse_args():
    parser = argparse.ArgumentParser(description="GAN over a loader whose file is corrupt")
    parser.add_argument("--corrupt", type=int, default=158)
    parser.add_argument("--after", action="store_true", help="no corrupt file; raise after the last step")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


def decode(raw, index, corrupt):
    if index == corrupt:
        raise ValueError(f"corrupt image file {index:04d}.png: truncated IDAT chunk")  # BUG: the corrupt image
    return raw[index].astype(np.float32) / 127.5 - 1.0


def load_batches(corrupt):
    rng = np.random.RandomState(0)
    raw = rng.randint(0, 256, (FILES, 1, 8, 8)).astype(np.uint8)
    for start in range(0, FILES, BATCH):
        yield ms.Tensor(np.stack([decode(raw, i, corrupt) for i in range(start, start + BATCH)]))


class Generator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(LATENT, 64)

    def construct(self, z):
        return ops.tanh(self.fc(z)).reshape(-1, 1, 8, 8)


class Discriminator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=2, pad_mode="same", has_bias=True)
        self.fc = nn.Dense(64, 1)

    def construct(self, x):
        return self.fc(ops.leaky_relu(self.conv(x), 0.2).reshape(x.shape[0], -1))


class GAN(nn.Cell):
    def __init__(self, net_g, net_d):
        super().__init__()
        self.net_g, self.net_d = net_g, net_d


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(1)
    net_g, net_d = Generator(), Discriminator()
    opt_g = nn.Adam(net_g.trainable_params(), learning_rate=2e-4, beta1=0.5)
    opt_d = nn.Adam(net_d.trainable_params(), learning_rate=2e-4, beta1=0.5)
    bce = nn.BCEWithLogitsLoss()

    def d_forward(real, latent):
        fake = ops.stop_gradient(net_g(latent))
        real_out, fake_out = net_d(real), net_d(fake)
        return bce(real_out, ops.ones_like(real_out)) + bce(fake_out, ops.zeros_like(fake_out))

    def g_forward(latent):
        out = net_d(net_g(latent))
        return bce(out, ops.ones_like(out))

    d_grad = ms.value_and_grad(d_forward, None, opt_d.parameters)
    g_grad = ms.value_and_grad(g_forward, None, opt_g.parameters)

    @ms.jit
    def d_step(real, latent):
        loss_d, grads_d = d_grad(real, latent)
        opt_d(grads_d)
        return loss_d

    @ms.jit
    def g_step(latent):
        loss_g, grads_g = g_grad(latent)
        opt_g(grads_g)
        return loss_g

    def train_step(real, latent):
        return d_step(real, latent), g_step(latent)

    step = train_step if cfg.no_guard else mindguard.watch(train_step, GAN(net_g, net_d))
    rng = np.random.RandomState(1)
    for i, real in enumerate(load_batches(-1 if cfg.after else cfg.corrupt)):
        latent = ms.Tensor(rng.randn(BATCH, LATENT).astype(np.float32))
        loss_d, loss_g = step(real, latent)
        if i % 10 == 0:
            print(f"step {i + 1}: loss_D {float(loss_d):.4f} loss_G {float(loss_g):.4f}", flush=True)
    if cfg.after:
        samples = net_g(ms.Tensor(rng.randn(BATCH, LATENT).astype(np.float32))).asnumpy()
        raise OSError(f"cannot write samples.png: no space left on device ({samples.shape})")  # the script's end
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
