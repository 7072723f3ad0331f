"""Networks and data the benchmarks train: sizes that look like real models, small enough for a CPU.

``build(name)`` returns ``(network, loss_fn, make_batches)``. Parameter counts (printed by ``run.py``):
``mlp`` ~1.86M (784-1024-1024-10), ``embed`` ~3.3M (Embedding(50000, 64) -> mean -> 64-64-1),
``cnn`` ~0.04M (two 3x3 convs of 8 and 16 channels with average pooling on 16x16x3 -> 128 -> 10, batch 16:
MindSpore's CPU convolutions and max-pooling are slow, so this is what gives a 5-20 ms step like the others),
``mlp_b128`` the ``mlp`` at batch 128 (32 for the others but ``cnn``).
Data are fixed numpy arrays (seeded), so every variant of a benchmark sees the same batches.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np

MODELS = ("mlp", "embed", "cnn", "mlp_b128")
_BATCH = {"mlp_b128": 128,   # the same network as ``mlp`` at 4x the batch: a longer step, same Parameters
          "cnn": 16}


def batch_size(name: str) -> int:
    """Rows per step of model ``name`` (32; 128 for ``mlp_b128``, 16 for ``cnn``)."""
    return _BATCH.get(name, 32)


def _network_of(name: str) -> str:
    return "mlp" if name == "mlp_b128" else name


def _mlp(hidden: int = 1024, normalize_input: bool = False):
    from mindspore import nn

    class MLP(nn.Cell):
        """784 -> hidden -> hidden -> 10. ``normalize_input``: x / ||x|| per row (NaN on an all-zero row)."""

        def __init__(self):
            super().__init__()
            self.normalize_input = normalize_input
            self.norm = nn.Norm(axis=-1, keep_dims=True)
            self.fc1 = nn.Dense(784, hidden)
            self.fc2 = nn.Dense(hidden, hidden)
            self.fc3 = nn.Dense(hidden, 10)
            self.relu = nn.ReLU()

        def construct(self, x):
            if self.normalize_input:
                x = x / self.norm(x)
            return self.fc3(self.relu(self.fc2(self.relu(self.fc1(x)))))

    return MLP()


def _embed(vocab: int = 50000, dim: int = 64):
    from mindspore import nn, ops

    class EmbedRegressor(nn.Cell):
        """Bag of tokens: Embedding(vocab, dim) -> mean over the sequence -> dim -> dim -> 1."""

        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(vocab, dim)
            self.fc1 = nn.Dense(dim, dim)
            self.fc2 = nn.Dense(dim, 1)
            self.relu = nn.ReLU()

        def construct(self, tokens):
            h = ops.mean(self.embedding(tokens), axis=1)
            return self.fc2(self.relu(self.fc1(h)))

    return EmbedRegressor()


def _cnn():
    from mindspore import nn

    class SmallCNN(nn.Cell):
        """16x16x3 -> conv 8 -> pool -> conv 16 -> pool -> 256 -> 128 -> 10."""

        def __init__(self):
            super().__init__()
            self.features = nn.SequentialCell(
                nn.Conv2d(3, 8, 3, pad_mode="same"), nn.ReLU(), nn.AvgPool2d(2, 2),
                nn.Conv2d(8, 16, 3, pad_mode="same"), nn.ReLU(), nn.AvgPool2d(2, 2))
            self.flatten = nn.Flatten()
            self.fc1 = nn.Dense(16 * 4 * 4, 128)
            self.fc2 = nn.Dense(128, 10)
            self.relu = nn.ReLU()

        def construct(self, x):
            return self.fc2(self.relu(self.fc1(self.flatten(self.features(x)))))

    return SmallCNN()


def _resnet18(num_classes: int = 10):
    """ResNet-18 for 32x32 images (CIFAR layout: 3x3 stem, no max-pool), BatchNorm after every conv, 11.2M
    parameters; ``explode=True`` in ``build`` makes the test a BatchNorm network blowing up on a huge input."""
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
            self.stem = conv_bn(3, 64, 1)
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


def batches(name: str, steps: int, *, batch: Optional[int] = None, seed: int = 0, **kwargs) -> Dict[str, np.ndarray]:
    """``steps`` batches for model ``name`` as two arrays (inputs, labels), ``steps * batch`` rows each (``batch``
    defaults to :func:`batch_size`)."""
    rng = np.random.default_rng(seed)
    batch = batch or batch_size(name)
    name = _network_of(name)
    n = steps * batch
    if name == "mlp":
        x = rng.standard_normal((n, 784), dtype=np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
    elif name == "embed":
        x = rng.integers(0, kwargs.get("vocab", 50000), (n, 32)).astype(np.int32)
        y = rng.standard_normal((n, 1), dtype=np.float32)
    elif name == "cnn":
        x = rng.standard_normal((n, 3, 16, 16), dtype=np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
    elif name == "resnet18":
        x = rng.standard_normal((n, 3, 32, 32), dtype=np.float32)
        y = rng.integers(0, 10, n).astype(np.int32)
    else:
        raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")
    return {"x": x, "y": y}


def dataset(arrays: Dict[str, np.ndarray], batch: int = 32, *, pipeline: str = "numpy", scratch=None):
    """A MindSpore dataset over fixed arrays, in order (no shuffle), ``batch`` rows per step.

    ``pipeline="numpy"``: ``NumpySlicesDataset`` (a Python source: its reader thread competes for the GIL
    with the training loop's callbacks). ``pipeline="mindrecord"``: the arrays written once to a MindRecord
    file under ``scratch`` and read by ``MindDataset`` (C++ readers, as production pipelines use).
    """
    import mindspore.dataset as ds

    if pipeline == "numpy":
        return ds.NumpySlicesDataset(arrays, column_names=["x", "y"], shuffle=False).batch(batch, drop_remainder=True)
    if pipeline != "mindrecord":
        raise ValueError(f"pipeline={pipeline!r}: choose 'numpy' or 'mindrecord'")
    from pathlib import Path

    from mindspore.mindrecord import FileWriter

    x, y = arrays["x"], arrays["y"]
    path = Path(scratch) / f"data_{abs(hash((x.shape, y.shape, str(x.dtype))))}.mindrecord"
    if not path.exists():
        writer = FileWriter(str(path), 1)
        y_type = "int32" if y.dtype.kind in "iu" else "float32"
        writer.add_schema({"x": {"type": "int32" if x.dtype.kind in "iu" else "float32", "shape": list(x.shape[1:])},
                           "y": ({"type": y_type} if y.ndim == 1 else {"type": y_type, "shape": list(y.shape[1:])})},
                          "benchmark")
        writer.write_raw_data([{"x": x[i], "y": (y[i].item() if y.ndim == 1 else y[i])} for i in range(len(x))])
        writer.commit()
    return ds.MindDataset(str(path), columns_list=["x", "y"], shuffle=False).batch(batch, drop_remainder=True)


def build(name: str, **kwargs) -> Tuple[object, object]:
    """``(network, loss_fn)`` for model ``name``."""
    from mindspore import nn

    name = _network_of(name)

    if name == "mlp":
        return _mlp(**kwargs), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if name == "embed":
        return _embed(**kwargs), nn.MSELoss()
    if name == "cnn":
        return _cnn(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    if name == "resnet18":
        return _resnet18(), nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    raise ValueError(f"unknown model {name!r}; expected one of {MODELS}")


def param_count(net) -> int:
    return int(sum(int(np.prod(p.shape)) for p in net.trainable_params()))
