"""A small Transformer encoder classifier with dropout everywhere model-zoo encoders put it (issue 39).

    python tests/zoo/transformer_dropout.py [--mode graph|pynative] [--loop model|watch] [--functional]
                                            [--poison 14]

Shaped like the model-zoo BERT/Transformer text classifiers: token + position embeddings, encoder layers of
multi-head self-attention and a feed-forward block with residual connections and LayerNorm, dropout on the
embeddings (``nn.Dropout(p=0.1)``), on the attention probabilities (``nn.Dropout(keep_prob=0.9)``, the older
spelling zoo code still uses) and on each residual branch; a ``[CLS]``-style head. The train cell is the zoo's
dynamic-loss-scale cell with a ``DynamicLossScaleUpdateCell``, as zoo scripts wrap BERT (``random_sources.py``'s,
written for CPU: ``nn.TrainOneStepWithLossScaleCell`` needs the NPU float status, which has no CPU kernel).

``--loop model``: ``Model(train_cell).train`` with ``Guard()`` and ``LossMonitor``; ``--loop watch``: the same train
cell stepped by hand over the dataset's iterator, wrapped with ``mindguard.watch``. ``--functional``: the
feed-forward block's dropout is ``ops.dropout(x, p=0.1, training=self.training)`` called in ``construct`` (as ported
PyTorch code does) instead of a cell. ``--poison N``: global step N's embeddings are corrupt (times 1e30, from a
step counter Parameter in the graph), so that step's loss is inf: a failure at exactly step N. Seeded with
``mindspore.set_seed`` and ``numpy.random.seed``; the data is in order.
"""
import argparse

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model
from random_sources import TrainOneStepWithDynamicLossScaleCell  # the zoo's loss-scale cell, written for CPU

import mindguard

VOCAB, SEQ, HIDDEN, HEADS, LAYERS, CLASSES, ROWS = 64, 8, 32, 2, 2, 3, 64


def parse_args():
    parser = argparse.ArgumentParser(description="Transformer encoder classifier with dropout")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--loop", choices=("model", "watch"), default="model")
    parser.add_argument("--functional", action="store_true")
    parser.add_argument("--poison", type=int, default=14, help="1-based global step whose embeddings are corrupt")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch_size", type=int, default=8)
    return parser.parse_args()


class SelfAttention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.query, self.key, self.value = nn.Dense(HIDDEN, HIDDEN), nn.Dense(HIDDEN, HIDDEN), nn.Dense(HIDDEN, HIDDEN)
        self.out = nn.Dense(HIDDEN, HIDDEN)
        self.attn_dropout = nn.Dropout(keep_prob=0.9)
        self.scale = 1.0 / np.sqrt(HIDDEN // HEADS)

    def _heads(self, x):
        return x.reshape(x.shape[0], SEQ, HEADS, HIDDEN // HEADS).transpose(0, 2, 1, 3)

    def construct(self, x):
        q, k, v = self._heads(self.query(x)), self._heads(self.key(x)), self._heads(self.value(x))
        probs = ops.softmax(ops.matmul(q, k.transpose(0, 1, 3, 2)) * self.scale, axis=-1)
        context = ops.matmul(self.attn_dropout(probs), v).transpose(0, 2, 1, 3).reshape(x.shape[0], SEQ, HIDDEN)
        return self.out(context)


class EncoderLayer(nn.Cell):
    def __init__(self, functional):
        super().__init__()
        self.attention = SelfAttention()
        self.attn_norm, self.ffn_norm = nn.LayerNorm((HIDDEN,)), nn.LayerNorm((HIDDEN,))
        self.hidden_dropout = nn.Dropout(p=0.1)
        self.ffn = nn.SequentialCell([nn.Dense(HIDDEN, 4 * HIDDEN), nn.GELU(), nn.Dense(4 * HIDDEN, HIDDEN)])
        self.functional = functional
        self.ffn_dropout = None if functional else nn.Dropout(p=0.1)

    def construct(self, x):
        x = self.attn_norm(x + self.hidden_dropout(self.attention(x)))
        if self.functional:
            ffn = ops.dropout(self.ffn(x), p=0.1, training=self.training)
        else:
            ffn = self.ffn_dropout(self.ffn(x))
        return self.ffn_norm(x + ffn)


class Encoder(nn.Cell):
    def __init__(self, functional, poison):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.position = nn.Embedding(SEQ, HIDDEN)
        self.embed_dropout = nn.Dropout(p=0.1)
        self.layers = nn.CellList([EncoderLayer(functional) for _ in range(LAYERS)])
        self.head = nn.Dense(HIDDEN, CLASSES)
        self.positions = ms.Tensor(np.arange(SEQ, dtype=np.int32))
        self.poison = poison
        self.seen = ms.Parameter(ms.Tensor(0, ms.int32), name="seen", requires_grad=False)

    def construct(self, tokens):
        x = self.embedding(tokens) + self.position(self.positions)
        if self.training:   # BUG stand-in: step `poison`'s embeddings are corrupt
            step = ops.assign_add(self.seen, ops.ones((), ms.int32))
            x = x * ops.select(step == self.poison, ms.Tensor(1e30, ms.float32), ms.Tensor(1.0, ms.float32))
        x = self.embed_dropout(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x[:, 0])


def create_dataset(batch_size):
    rng = np.random.RandomState(5)
    tokens = rng.randint(0, VOCAB, (ROWS, SEQ)).astype(np.int32)
    labels = (tokens[:, 0] % CLASSES).astype(np.int32)
    data = ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False)
    return data.batch(batch_size, drop_remainder=True)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    np.random.seed(1)
    net = Encoder(cfg.functional, cfg.poison)
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    optimizer = nn.Adam(net.trainable_params(), learning_rate=1e-3)
    scale = nn.DynamicLossScaleUpdateCell(2.0 ** 12, 2, 1000)
    train_cell = TrainOneStepWithDynamicLossScaleCell(loss, optimizer, scale)
    data = create_dataset(cfg.batch_size)
    if cfg.loop == "model":
        Model(train_cell).train(cfg.epochs, data, dataset_sink_mode=False,
                                callbacks=[mindguard.Guard(), LossMonitor(1)])
    else:
        train_cell.set_train()

        def train_step(tokens, label):
            loss_value, overflow, _ = train_cell(tokens, label)
            return loss_value, overflow

        step = mindguard.watch(train_step, train_cell, optimizer, update_flag="refused")
        global_step = 0
        for _ in range(cfg.epochs):
            for tokens, label in data.create_tuple_iterator(num_epochs=1):
                global_step += 1
                loss_value, overflow = step(tokens, label)
                print(f"step {global_step} loss {loss_value.asnumpy():.6f} overflow {bool(overflow.asnumpy())}",
                      flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
