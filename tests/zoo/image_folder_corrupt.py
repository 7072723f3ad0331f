"""Image classifier over an ImageFolder dataset with one corrupt JPEG, in the model zoo's shape (round 4).

    python tests/zoo/image_folder_corrupt.py --data_dir DIR [--mode graph|pynative] [--no_guard]

The shape of mindcv / model-zoo classification scripts: ``ImageFolderDataset(data_dir, shuffle=False)`` mapped through
``Decode``, ``Resize``, ``Normalize``, ``HWC2CHW`` and batched; a small conv net under ``Model(net, loss, opt).train``
with ``LossMonitor``. ``--data_dir`` is filled with 2 classes x 8 generated 8x8 images when it is empty.

The planted bug: ``dog/2.JPEG`` holds bytes that are not a JPEG (a truncated download). ``Decode`` raises in the
pipeline on the batch of global step 6 (images are read in class, then file order: ``dog/2`` is image 11 of 16, batch
size 2). Expected: kind exception at global step 6, and the user's own output -- MindSpore's "The corresponding data
file is: .../dog/2.JPEG" line -- preserved under the hunt, with no ``[Dataset debugger]`` lines.
"""
import argparse
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
import mindspore.dataset.vision as vision
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mindguard

CLASSES = ("cat", "dog")
PER_CLASS = 8
BATCH = 2


def parse_args():
    parser = argparse.ArgumentParser(description="ImageFolder classifier")
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--corrupt", choices=("truncated", "html"), default="truncated",
                        help="html: dog/2.JPEG is an HTML page saved under an image's name (a failed download)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


def write_images(data_dir, corrupt="truncated"):
    """2 classes x PER_CLASS JPEGs; dog/2.JPEG is corrupt."""
    from PIL import Image

    for c, name in enumerate(CLASSES):
        os.makedirs(os.path.join(data_dir, name), exist_ok=True)
        for i in range(PER_CLASS):
            pixels = (np.random.RandomState(10 * c + i).rand(8, 8, 3) * 255).astype(np.uint8)
            Image.fromarray(pixels).save(os.path.join(data_dir, name, f"{i}.JPEG"))
    with open(os.path.join(data_dir, "dog", "2.JPEG"), "wb") as f:
        if corrupt == "html":   # BUG: the image host answered with an error page, saved as the image
            f.write(b"<!DOCTYPE html>\n<html><head><title>404 Not Found</title></head><body>gone</body></html>\n")
        else:
            f.write(b"\xff\xd8\xff\xe0" + b"truncated download" * 4)   # BUG: not a JPEG


def create_dataset(data_dir):
    dataset = ds.ImageFolderDataset(data_dir, shuffle=False, decode=False)
    transforms = [vision.Decode(), vision.Resize((8, 8)),
                  vision.Normalize(mean=[127.5] * 3, std=[127.5] * 3), vision.HWC2CHW()]
    dataset = dataset.map(transforms, input_columns="image", num_parallel_workers=1)
    dataset = dataset.map(lambda y: y.astype(np.int32), input_columns="label")
    return dataset.batch(BATCH, drop_remainder=True)


class SmallNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.features = nn.SequentialCell([nn.Conv2d(3, 4, 3, pad_mode="same"), nn.ReLU(), nn.AvgPool2d(8, 8)])
        self.flatten = nn.Flatten()
        self.head = nn.Dense(4, len(CLASSES))

    def construct(self, x):
        return self.head(self.flatten(self.features(x)))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    if not os.path.isdir(cfg.data_dir) or not os.listdir(cfg.data_dir):
        write_images(cfg.data_dir, cfg.corrupt)
    net = SmallNet()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), 0.01, 0.9))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, create_dataset(cfg.data_dir), callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
