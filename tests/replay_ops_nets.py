"""Networks shared by tests/test_replay_ops.py: each plants one Inf/NaN the GRAPH dump analysis names exactly.

``build(kind)`` returns ``(network_with_loss, optimizer, batch)`` (batch: numpy arrays, the order the network
with loss takes them), freshly seeded, so a GRAPH child process and a PyNative test build the same step.
Marker comments name the lines the answers must point at.
"""
import numpy as np

import mindspore as ms
from mindspore import nn, ops


class Mlp(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(8, 6)
        self.fc2 = nn.Dense(6, 2)

    def construct(self, x):
        return self.fc2(ops.relu(self.fc1(x)))


class HandWrittenCrossEntropy(nn.Cell):
    def construct(self, logits, labels):
        logp = ops.log(ops.softmax(logits, axis=-1))  # LOG-SOFTMAX
        return -(logp * labels).sum(axis=-1).mean()


class Classifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(4, 3)
        self.loss = HandWrittenCrossEntropy()

    def construct(self, x, labels):
        return self.loss(self.fc(x) * 100.0, labels)


class Encoder(nn.Cell):
    def __init__(self):
        super().__init__()
        self.proj = nn.Dense(4, 3)

    def construct(self, x):
        return self.proj(x)


class SqrtNet(nn.Cell):
    """The length of the encoding of ``x`` masked by ``mask``: an all-zero mask row is sqrt(0)."""

    def __init__(self):
        super().__init__()
        self.enc = Encoder()

    def construct(self, x, mask):
        h = self.enc(x) * mask
        length = ops.sqrt((h * h).sum(axis=-1))  # SQRT
        return length.mean()


class NormNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(6, 4, padding_idx=0)
        self.norm = nn.Norm(axis=-1)
        self.head = nn.Dense(3, 1)

    def construct(self, tokens):
        return self.head(self.norm(self.embedding(tokens)))  # NORM


def build(kind):
    ms.set_seed(0)
    rng = np.random.RandomState(0)
    if kind == "batch_inf":
        net, loss = Mlp(), nn.MSELoss()
        x = rng.randn(4, 8).astype(np.float32)
        x[2, 3] = np.inf
        batch = [x, rng.randn(4, 2).astype(np.float32)]
        with_loss = nn.WithLossCell(net, loss)
    elif kind == "log_softmax":
        with_loss = Classifier()
        batch = [rng.randn(4, 4).astype(np.float32), np.eye(3, dtype=np.float32)[[0, 1, 2, 0]]]
    elif kind == "sqrt":
        with_loss = SqrtNet()
        mask = np.ones((4, 3), np.float32)
        mask[1] = 0
        batch = [rng.randn(4, 4).astype(np.float32), mask]
    elif kind == "norm":
        with_loss = nn.WithLossCell(NormNet(), nn.MSELoss())
        batch = [np.array([[1, 2, 3], [0, 0, 0], [4, 5, 1], [2, 0, 3]], np.int32), np.ones((4, 1), np.float32)]
    else:
        raise ValueError(kind)
    optimizer = nn.SGD(with_loss.trainable_params(), learning_rate=0.05)
    return with_loss, optimizer, batch


KINDS = ("batch_inf", "log_softmax", "sqrt", "norm")
