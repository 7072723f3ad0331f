"""DCGAN-style training stepped by hand, the way MindSpore's GAN tutorial and model-zoo GANs are written (round 3).

    python tests/zoo/gan_watch.py [--mode graph|pynative] [--corrupt 158] [--nan_step K [--fix]] [--no_guard]

One ``DCGAN`` cell holds the discriminator's and the generator's train cells (``nn.TrainOneStepCell`` each, with
an ``nn.Adam`` each); the loop calls it once per batch and the whole cell is wrapped with
``mindguard.watch(dcgan, dcgan)``: no ``Model.train``, no callbacks. Images are "files" decoded by a random-access
``GeneratorDataset`` source, batch 4, 160 files per epoch: 40 steps an epoch.

The planted bug: the file of index ``--corrupt`` (default 158) is truncated and its decoder raises
``ValueError("corrupt image ...")``. It is in the batch of global step 40 (158 // 4 + 1). MindSpore's pipeline
reads ahead, so without the hunt the exception reaches the loop steps earlier. Expected: kind exception, global
step 40, the decoder's raising line (``# BUG: the corrupt image``).

``--nan_step K`` plants another bug instead: the discriminator's loss is the hand-written ``-log(sigmoid(d))`` of some
GAN repositories, and the batch of global step K was decoded wrongly (pixels down to -255000): a real image's logit
is so negative that its sigmoid is 0 and the log -inf. Expected: nonfinite_loss at step K, the
forward ``Log`` on line ``# CULPRIT``.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops

import mindguard

FILES = 160
BATCH = 4
LATENT = 8


def parse_args():
    parser = argparse.ArgumentParser(description="DCGAN with a corrupt image file")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--corrupt", type=int, default=158, help="index of the corrupt file")
    parser.add_argument("--nan_step", type=int, default=0,
                        help="instead: the discriminator's hand-written loss takes log(0) at this global step")
    parser.add_argument("--fix", action="store_true", help="--nan_step's loss from the logit (the hint's fix)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class ImageFiles:
    """Random-access source: ``__getitem__`` "decodes" one image file."""

    def __init__(self, corrupt, unscaled=-1):
        rng = np.random.RandomState(0)
        self.raw = rng.randint(0, 256, (FILES, 1, 8, 8)).astype(np.uint8)
        self.corrupt = corrupt
        self.unscaled = unscaled

    def __len__(self):
        return FILES

    def __getitem__(self, index):
        if index == self.corrupt:
            raise ValueError(f"corrupt image file {index:04d}.png: truncated PNG chunk")  # BUG: the corrupt image
        if index // BATCH == self.unscaled:
            return (self.raw[index].astype(np.float32) * -1000.0,)   # BUG (--nan_step): a file decoded wrongly
        return ((self.raw[index].astype(np.float32) / 127.5) - 1.0,)


class Generator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(LATENT, 64)
        self.tanh = nn.Tanh()

    def construct(self, z):
        return self.tanh(self.fc(z)).reshape(-1, 1, 8, 8)


class Discriminator(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, stride=2, pad_mode="same", has_bias=True)
        self.act = nn.LeakyReLU(0.2)
        self.fc = nn.Dense(4 * 4 * 4, 1)

    def construct(self, x):
        return self.fc(self.act(self.conv(x)).reshape(x.shape[0], -1))


class WithLossCellD(nn.Cell):
    def __init__(self, net_d, net_g, loss_fn, fix=False):
        super().__init__(auto_prefix=True)
        self.net_d, self.net_g, self.loss_fn, self.fix = net_d, net_g, loss_fn, fix

    def construct(self, real, latent):
        out_real = self.net_d(real)
        if self.loss_fn is None and self.fix:
            loss_real = ops.softplus(-out_real).mean()
        elif self.loss_fn is None:   # --nan_step: the hand-written loss of some GAN repos
            loss_real = -ops.log(ops.sigmoid(out_real)).mean()  # CULPRIT
        else:
            loss_real = self.loss_fn(out_real, ops.ones_like(out_real))
        fake = ops.stop_gradient(self.net_g(latent))
        out_fake = self.net_d(fake)
        if self.loss_fn is None:
            loss_fake = -ops.log(1.0 - ops.sigmoid(out_fake) + 1e-6).mean()
        else:
            loss_fake = self.loss_fn(out_fake, ops.zeros_like(out_fake))
        return loss_real + loss_fake


class WithLossCellG(nn.Cell):
    def __init__(self, net_d, net_g, loss_fn):
        super().__init__(auto_prefix=True)
        self.net_d, self.net_g, self.loss_fn = net_d, net_g, loss_fn

    def construct(self, latent):
        out = self.net_d(self.net_g(latent))
        return self.loss_fn(out, ops.ones_like(out))


class DCGAN(nn.Cell):
    """The tutorial's container: one call trains D, then G."""

    def __init__(self, train_d, train_g):
        super().__init__(auto_prefix=True)
        self.train_d = train_d
        self.train_g = train_g

    def construct(self, real, latent):
        loss_d = self.train_d(real, latent)
        loss_g = self.train_g(latent)
        return loss_d, loss_g


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    net_g, net_d = Generator(), Discriminator()
    loss = nn.BCEWithLogitsLoss()
    opt_d = nn.Adam(net_d.trainable_params(), learning_rate=2e-4, beta1=0.5)
    opt_g = nn.Adam(net_g.trainable_params(), learning_rate=2e-4, beta1=0.5)
    train_d = nn.TrainOneStepCell(WithLossCellD(net_d, net_g, None if cfg.nan_step else loss, cfg.fix), opt_d)
    train_g = nn.TrainOneStepCell(WithLossCellG(net_d, net_g, loss), opt_g)
    dcgan = DCGAN(train_d, train_g)
    dcgan.set_train()
    step = dcgan if cfg.no_guard else mindguard.watch(dcgan, dcgan)

    source = ImageFiles(-1 if cfg.nan_step else cfg.corrupt, unscaled=cfg.nan_step - 1)
    dataset = ds.GeneratorDataset(source, ["image"], shuffle=False).batch(BATCH, drop_remainder=True)
    rng = np.random.RandomState(1)
    for epoch in range(cfg.epochs):
        for i, (image,) in enumerate(dataset.create_tuple_iterator()):
            latent = Tensor(rng.randn(BATCH, LATENT).astype(np.float32))
            loss_d, loss_g = step(image, latent)
            print(f"epoch {epoch + 1} step {i + 1}: loss_D {float(loss_d):.4f} loss_G {float(loss_g):.4f}",
                  flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
