"""A zoo-shaped client for `mindguard hunt --from`'s speed (issue 51): a ResNet-18 (CIFAR layout: 3x3 stem,
BatchNorm after every conv, 11.2M parameters, a ~90 MB training state with Momentum) or a small CNN, trained by
``Model.train`` with an always-on ``mindguard.Guard()``; one pixel of the first image of the batch of ``--poison``
(1-based global step) is 3e37, so the stem convolution overflows to Inf there. GRAPH mode, CPU, fixed seed.

    python resnet_bad_batch.py --poison 3                          # ResNet-18, 8x8 images, batch 8: fails at step 3
    python resnet_bad_batch.py --model cnn --steps 60 --poison 50  # a smaller model failing late
    python resnet_bad_batch.py --no-keep-state ...                 # Guard(keep_state=False): no state to resume from
    python resnet_bad_batch.py --poison 0 --lr 1e6                 # no bad pixel: the learning rate blows up
"""
import argparse
import sys
import time

import numpy as np


def resnet18(num_classes=10):
    from mindspore import nn, ops

    def conv_bn(cin, cout, stride):
        return nn.SequentialCell(nn.Conv2d(cin, cout, 3, stride, pad_mode="pad", padding=1, has_bias=False),
                                 nn.BatchNorm2d(cout))

    class Block(nn.Cell):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.a = conv_bn(cin, cout, stride)
            self.b = conv_bn(cout, cout, 1)
            self.relu = nn.ReLU()
            self.down = (nn.SequentialCell(nn.Conv2d(cin, cout, 1, stride, has_bias=False), nn.BatchNorm2d(cout))
                         if stride != 1 or cin != cout else None)

        def construct(self, x):
            out = self.b(self.relu(self.a(x)))
            return self.relu(out + (self.down(x) if self.down is not None else x))

    class ResNet18(nn.Cell):
        def __init__(self):
            super().__init__()
            self.stem = conv_bn(3, 64, 1)   # CULPRIT: the stem convolution overflows on the poisoned pixel
            self.relu = nn.ReLU()
            layers, cin = [], 64
            for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
                layers += [Block(cin, cout, stride), Block(cout, cout, 1)]
                cin = cout
            self.layers = nn.SequentialCell(layers)
            self.pool = ops.ReduceMean(keep_dims=False)
            self.fc = nn.Dense(512, num_classes)

        def construct(self, x):
            return self.fc(self.pool(self.layers(self.relu(self.stem(x))), (2, 3)))

    return ResNet18()


def cnn(num_classes=10):
    from mindspore import nn, ops

    class SmallCNN(nn.Cell):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, pad_mode="same")
            self.conv = nn.Conv2d(16, 32, 3, pad_mode="same")
            self.relu = nn.ReLU()
            self.pool = ops.ReduceMean(keep_dims=False)
            self.fc = nn.Dense(32, num_classes)

        def construct(self, x):
            return self.fc(self.pool(self.relu(self.conv(self.relu(self.stem(x)))), (2, 3)))

    return SmallCNN()


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=("resnet18", "cnn"), default="resnet18")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--poison", type=int, default=3, help="1-based global step of the bad pixel (0: none)")
    parser.add_argument("--lr", type=float, default=0.01, help="Momentum's learning rate (1e6: weights NaN early)")
    parser.add_argument("--image", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--no-keep-state", action="store_true")
    parser.add_argument("--check-budget", type=float, default=None, help="Guard(check_budget=...)")
    args = parser.parse_args(argv)

    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    import mindguard

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_device("CPU")
    mindguard.fix_randomness(0)
    net = resnet18() if args.model == "resnet18" else cnn()
    rng = np.random.default_rng(0)
    n = args.steps * args.batch
    x = rng.standard_normal((n, 3, args.image, args.image), dtype=np.float32)
    y = rng.integers(0, 10, n).astype(np.int32)
    if args.poison:
        x[(args.poison - 1) * args.batch, 0, args.image // 2, args.image // 2] = 3e37
    data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(args.batch, drop_remainder=True)
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(net, loss, nn.Momentum(net.trainable_params(), args.lr, 0.9))
    start = time.perf_counter()
    guard = mindguard.Guard(keep_state=not args.no_keep_state,
                            **({"check_budget": args.check_budget} if args.check_budget else {}))
    model.train(1, data, callbacks=[guard], dataset_sink_mode=False)
    print(f"trained in {time.perf_counter() - start:.2f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
