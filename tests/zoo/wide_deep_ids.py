"""Wide&Deep click-through recommender over a large id table, in the model zoo's shape (round 4).

    python tests/zoo/wide_deep_ids.py [--mode graph|pynative] [--bad_step 25] [--raw_ids] [--fix] [--no_guard]

Written here after reading mindspore-ai/models official/recommend/Wide_and_Deep (no code copied): a model whose
``construct(id_hldr, wt_hldr)`` casts the exported int64 ids to int32, looks every field id up in a wide table (1
column) and a deep table (``emb_dim`` columns) of ``vocab_size`` rows, masks them with the field weights, sums the wide
part and runs the deep part through dense layers; ``NetWithLossClass`` (sigmoid cross-entropy + L2 on the deep table), a
hand-written ``TrainStepWrap`` (``GradOperation(get_by_list=True, sens_param=True)``, Adam) and
``Model(train_net).train``.

The planted bug: the feature export hashed one categorical value to ``vocab_size + 7`` (an off-by-bucket hash),
so one id of the batch of global step ``--bad_step`` (default 25: epoch 3, step 5 of 10) is 10007 in the
10,000-row tables. CPU Gather raises ("range [0, 10000), but got 10007") in the wide lookup, the first one.
Expected: kind exception, global step 25, ``Gather`` on line ``# CULPRIT``, an index-range hint naming 10000 rows
and 10007 (from the kernel's own message: the ids are a graph input), and the clip of the ids (``--fix``)
trains finite.

``--raw_ids``: int32 ids go straight from the batch into both lookups, as in the zoo's script. Then the raising
Gather is the first kernel the step launches, and MindSpore dumps nothing of that step (docs/mindspore-facts.md,
"hints"): the exception's own message (``range [0, 10000), but got 10007``), the kernel graph and the batch of the
step are left. Both lookups read the same ids from 10,000-row tables; in GRAPH mode the deep one
(``Gather-op1``, first in the kernel graph's execution order) raises -- line ``# RAISES FIRST: GRAPH, --raw_ids``
(measured: a deep table of 10,001 rows makes the message say ``range [0, 10001)``, a wide one of 10,001 rows leaves
it ``[0, 10000)``) --, in PyNative the wide one, called first (``# CULPRIT``). Either way the origin is
``batch_ids`` row 3 of 8 holding 10007.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

VOCAB_SIZE = 10000
FIELD_SIZE = 6
BATCH = 8
STEPS_PER_EPOCH = 10


def parse_args():
    parser = argparse.ArgumentParser(description="Wide&Deep CTR model")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--emb_dim", type=int, default=8)
    parser.add_argument("--bad_step", type=int, default=25)
    parser.add_argument("--raw_ids", action="store_true",
                        help="int32 ids straight from the batch into the lookups (no Cast kernel before them)")
    parser.add_argument("--fix", action="store_true", help="clip the ids as the hint says (verification)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class CriteoLikeSource:
    """(ids, weights, label) rows; the batch of global step ``bad_step`` carries one hashed id past the table."""

    def __init__(self, bad_step, dtype=np.int64):
        rng = np.random.RandomState(11)
        n = BATCH * STEPS_PER_EPOCH
        self.ids = rng.randint(0, VOCAB_SIZE, (n, FIELD_SIZE)).astype(dtype)   # hashed ids, as exported
        self.wts = rng.uniform(0.5, 1.0, (n, FIELD_SIZE)).astype(np.float32)
        self.labels = rng.randint(0, 2, (n, 1)).astype(np.float32)
        self.bad_row = ((bad_step - 1) % STEPS_PER_EPOCH) * BATCH + 3
        self.bad_epoch = (bad_step - 1) // STEPS_PER_EPOCH
        self.reads = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        epoch = self.reads // len(self.labels)
        self.reads += 1
        ids = self.ids[index].copy()
        if index == self.bad_row and epoch == self.bad_epoch:
            ids[4] = VOCAB_SIZE + 7   # BUG: the hash bucket count of the export is not the table's
        return ids, self.wts[index], self.labels[index]


class DenseLayer(nn.Cell):
    def __init__(self, in_dim, out_dim, activation=True):
        super().__init__()
        self.dense = nn.Dense(in_dim, out_dim, weight_init="normal")
        self.act = nn.ReLU() if activation else None

    def construct(self, x):
        x = self.dense(x)
        return self.act(x) if self.act is not None else x


class WideDeepModel(nn.Cell):
    def __init__(self, emb_dim, fix=False, raw_ids=False):
        super().__init__()
        self.raw_ids = raw_ids
        self.emb_dim = emb_dim
        self.wide_w = ms.Parameter(ms.Tensor(np.random.RandomState(1).normal(0, 0.01, (VOCAB_SIZE, 1))
                                             .astype(np.float32)), name="wide_w")
        self.wide_b = ms.Parameter(ms.Tensor(np.zeros(1, np.float32)), name="wide_b")
        self.embedding_table = ms.Parameter(ms.Tensor(np.random.RandomState(2).normal(0, 0.01, (VOCAB_SIZE, emb_dim))
                                                      .astype(np.float32)), name="deep_embedding")
        self.wide_gatherv2 = ops.Gather()
        self.deep_gatherv2 = ops.Gather()
        self.layers = nn.SequentialCell([DenseLayer(FIELD_SIZE * emb_dim, 32), DenseLayer(32, 16),
                                         DenseLayer(16, 1, activation=False)])
        self.fix = fix

    def construct(self, id_hldr, wt_hldr):
        if not self.raw_ids:
            id_hldr = ops.cast(id_hldr, ms.int32)
        if self.fix:
            id_hldr = ops.clip_by_value(id_hldr, 0, VOCAB_SIZE - 1)
        mask = ops.reshape(wt_hldr, (-1, FIELD_SIZE, 1))
        # Wide layer
        wide_id_weight = self.wide_gatherv2(self.wide_w, id_hldr, 0)  # CULPRIT
        wx = wide_id_weight * mask
        wide_out = ops.reshape(ops.reduce_sum(wx, 1) + self.wide_b, (-1, 1))
        # Deep layer
        deep_id_embs = self.deep_gatherv2(self.embedding_table, id_hldr, 0)  # RAISES FIRST: GRAPH, --raw_ids
        vx = deep_id_embs * mask
        deep_in = ops.reshape(vx, (-1, FIELD_SIZE * self.emb_dim))
        deep_out = self.layers(deep_in)
        return wide_out + deep_out, self.embedding_table


class NetWithLossClass(nn.Cell):
    def __init__(self, network, l2_coef=8e-5):
        super().__init__(auto_prefix=False)
        self.network = network
        self.l2_coef = l2_coef
        self.loss = ops.SigmoidCrossEntropyWithLogits()

    def construct(self, batch_ids, batch_wts, label):
        predict, embedding_table = self.network(batch_ids, batch_wts)
        log_loss = ops.reduce_mean(self.loss(predict, label))
        l2_loss = self.l2_coef * ops.reduce_sum(ops.square(embedding_table)) / 2
        return log_loss + l2_loss


class TrainStepWrap(nn.Cell):
    def __init__(self, network, lr=0.001, sens=1.0):
        super().__init__(auto_prefix=False)
        self.network = network
        self.network.set_train()
        self.weights = ms.ParameterTuple(network.trainable_params())
        self.optimizer = nn.Adam(self.weights, learning_rate=lr, eps=1e-8, loss_scale=sens)
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.sens = sens

    def construct(self, batch_ids, batch_wts, label):
        loss = self.network(batch_ids, batch_wts, label)
        sens = ops.fill(ops.dtype(loss), ops.shape(loss), self.sens)
        grads = self.grad(self.network, self.weights)(batch_ids, batch_wts, label, sens)
        self.optimizer(grads)
        return loss


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    source = CriteoLikeSource(cfg.bad_step, np.int32 if cfg.raw_ids else np.int64)
    dataset = ds.GeneratorDataset(source, ["ids", "wts", "label"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = WideDeepModel(cfg.emb_dim, fix=cfg.fix, raw_ids=cfg.raw_ids)
    train_net = TrainStepWrap(NetWithLossClass(net))
    model = Model(train_net)
    callbacks = [LossMonitor(STEPS_PER_EPOCH)] if cfg.no_guard else [mindguard.Guard(), LossMonitor(STEPS_PER_EPOCH)]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
