"""DCGAN-style training stepped by hand, the way MindSpore's GAN tutorial and model-zoo GANs are written (round 3).

    python tests/zoo/gan_watch.py [--mode graph|pynative] [--corrupt 39] [--no_guard]

One ``DCGAN`` cell holds the discriminator's and the generator's train cells (``nn.TrainOneStepCell`` each, with
an ``nn.Adam`` each); the loop calls it once per batch and the whole cell is wrapped with
``mindguard.watch(dcgan, dcgan)``: no ``Model.train``, no callbacks. Images are "files" decoded by a random-access
``GeneratorDataset`` source, batch 4, 24 files per epoch: 6 steps an epoch.

The planted bug: the file of index ``--corrupt`` (default 39 in the stream: epoch 7, file 15) is truncated and its
decoder raises ``ValueError("corrupt image ...")``. It is in the batch of global step 40 (file 15 // 4 + 1 = step
4 of epoch 7 = 6 * 6 + 4). MindSpore's pipeline reads ahead, so without the hunt the exception reaches the loop
steps earlier. Expected: kind exception, global step 40, the decoder's raising line (``# BUG: the corrupt image``).
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import Tensor, nn, ops

import mindguard

FILES = 24
BATCH = 4
LATENT = 8


def parse_args():
    parser = argparse.ArgumentParser(description="DCGAN with a corrupt image file")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--corrupt", type=int, default=FILES * 6 + 15,
                        help="index in the stream of files read (epoch * 24 + file) of the corrupt one")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class ImageFiles:
    """Random-access source: ``__getitem__`` "decodes" one image file."""

    def __init__(self, corrupt):
        rng = np.random.RandomState(0)
        self.raw = rng.randint(0, 256, (FILES, 1, 8, 8)).astype(np.uint8)
        self.corrupt = corrupt
        self.reads = 0

    def __len__(self):
        return FILES

    def __getitem__(self, index):
        stream = self.reads
        self.reads += 1
        if stream == self.corrupt:
            raise ValueError(f"corrupt image file {index:04d}.png: truncated PNG chunk")  # BUG: the corrupt image
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
    def __init__(self, net_d, net_g, loss_fn):
        super().__init__(auto_prefix=True)
        self.net_d, self.net_g, self.loss_fn = net_d, net_g, loss_fn

    def construct(self, real, latent):
        out_real = self.net_d(real)
        loss_real = self.loss_fn(out_real, ops.ones_like(out_real))
        fake = ops.stop_gradient(self.net_g(latent))
        out_fake = self.net_d(fake)
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
    train_d = nn.TrainOneStepCell(WithLossCellD(net_d, net_g, loss), opt_d)
    train_g = nn.TrainOneStepCell(WithLossCellG(net_d, net_g, loss), opt_g)
    dcgan = DCGAN(train_d, train_g)
    dcgan.set_train()
    step = dcgan if cfg.no_guard else mindguard.watch(dcgan, dcgan)

    dataset = ds.GeneratorDataset(ImageFiles(cfg.corrupt), ["image"], shuffle=False).batch(BATCH, drop_remainder=True)
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
