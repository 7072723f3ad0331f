"""Seq2seq Transformer whose one embedding cell is shared by source and target, trained with a dynamic loss scale,
in the model zoo's shape (round 4).

    python tests/zoo/transformer_shared.py [--mode graph|pynative] [--bad_step 10] [--fix] [--no_guard]

Written here after reading mindspore-ai/models official/nlp/Transformer (no code copied): ``TransformerModel``
holds one ``EmbeddingLookup`` cell (a Parameter table, ``reshape`` to flat ids, ``gather``, reshape back) and calls it
for ``source_ids`` and then for ``target_ids``; the projection reuses its table (tied weights); the loss is the
label-weighted negative log-likelihood; a loss-scale train cell in the zoo's form for CPU (scaled gradients,
``all_finite``, ``DynamicLossScaleUpdateCell``, the update skipped on overflow, ``(loss, overflow, scale)`` returned)
under ``Model(train_net).train``.

Two planted faults, from the data below:
* global steps 3 and 4: a label weight of 1e36 (a corrupt length-normalisation factor): the loss is finite but the
  gradients scaled by 2**16 overflow; the cell skips both updates and halves the scale -- normal loss-scale
  behaviour, NOT a failure.
* global step ``--bad_step`` (default 10: epoch 2, step 4 of 6): one *source* id equals ``VOCAB_SIZE`` (the tokenizer
  appended an <eos> id past the table). The source lookup's Gather raises on CPU in the forward pass.
Expected: kind exception, global step 10, ``Gather`` (forward) at the *source* call, line ``# CULPRIT`` (MindSpore's
.ir gives both calls of the shared cell one call site; the index statistics -- ids up to 100 -- match the source ids
only, the target ids stay below 60), the index-range hint naming the 100 rows; ``--fix`` clips the ids and trains
finite.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.amp import all_finite
from mindspore.train import LossMonitor, Model

import mindguard

VOCAB_SIZE = 100
TARGET_VOCAB_USED = 60
SEQ = 6
BATCH = 4
STEPS_PER_EPOCH = 6
OVERFLOW_STEPS = (3, 4)


def parse_args():
    parser = argparse.ArgumentParser(description="Transformer with a shared embedding and a loss scale")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--bad_step", type=int, default=10)
    parser.add_argument("--fix", action="store_true", help="clip the ids as the hint says (verification)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class ParallelCorpus:
    """(source_ids, target_ids, label_ids, label_weights) per sentence pair, in a fixed order."""

    def __init__(self, bad_step):
        rng = np.random.RandomState(7)
        n = BATCH * STEPS_PER_EPOCH
        self.source = rng.randint(1, VOCAB_SIZE, (n, SEQ)).astype(np.int32)
        self.target = rng.randint(1, TARGET_VOCAB_USED, (n, SEQ)).astype(np.int32)
        self.labels = np.roll(self.target, -1, axis=1)
        self.weights = np.ones((n, SEQ), np.float32)
        self.bad_step = bad_step
        self.reads = 0

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        step = self.reads // BATCH + 1   # the 1-based global step this pair's batch feeds
        self.reads += 1
        source, weights = self.source[index].copy(), self.weights[index].copy()
        if step in OVERFLOW_STEPS and index % BATCH == 1:
            weights[2] = 1e36   # a corrupt normalisation factor: huge, finite
        if step == self.bad_step and index % BATCH == 2:
            source[-1] = VOCAB_SIZE   # BUG: <eos> appended with the id past the table
        return source, self.target[index], self.labels[index], weights


class EmbeddingLookup(nn.Cell):
    def __init__(self, vocab_size, embedding_size):
        super().__init__()
        self.embedding_size = embedding_size
        self.embedding_table = ms.Parameter(ms.Tensor(np.random.RandomState(0).normal(
            0, embedding_size ** -0.5, (vocab_size, embedding_size)).astype(np.float32)), name="embedding_table")

    def construct(self, input_ids):
        shape = ops.shape(input_ids)
        flat_ids = ops.reshape(input_ids, (-1,))
        output = ops.gather(self.embedding_table, flat_ids, 0)
        output = ops.reshape(output, shape + (self.embedding_size,))
        return output * (self.embedding_size ** 0.5), self.embedding_table


class Attention(nn.Cell):
    def __init__(self, hidden):
        super().__init__()
        self.q = nn.Dense(hidden, hidden)
        self.k = nn.Dense(hidden, hidden)
        self.v = nn.Dense(hidden, hidden)
        self.scale = hidden ** -0.5

    def construct(self, x, memory):
        scores = ops.bmm(self.q(x), ops.transpose(self.k(memory), (0, 2, 1))) * self.scale
        return x + ops.bmm(ops.softmax(scores, -1), self.v(memory))


class TransformerModel(nn.Cell):
    def __init__(self, hidden, fix=False):
        super().__init__()
        self.tfm_embedding_lookup = EmbeddingLookup(VOCAB_SIZE, hidden)
        self.encoder = Attention(hidden)
        self.decoder_self = Attention(hidden)
        self.decoder_cross = Attention(hidden)
        self.norm = nn.LayerNorm((hidden,))
        self.fix = fix

    def construct(self, source_ids, target_ids):
        if self.fix:
            source_ids = ops.clip_by_value(source_ids, 0, VOCAB_SIZE - 1)
        src_word_embeddings, embedding_tables = self.tfm_embedding_lookup(source_ids)  # CULPRIT
        encoder_output = self.encoder(src_word_embeddings, src_word_embeddings)
        tgt_word_embeddings, _ = self.tfm_embedding_lookup(target_ids)
        decoder_output = self.decoder_cross(self.decoder_self(tgt_word_embeddings, tgt_word_embeddings),
                                            encoder_output)
        decoder_output = self.norm(decoder_output)
        logits = ops.matmul(decoder_output, embedding_tables.T)
        return ops.log_softmax(logits, -1)


class TransformerNetworkWithLoss(nn.Cell):
    def __init__(self, hidden, fix=False):
        super().__init__(auto_prefix=False)
        self.transformer = TransformerModel(hidden, fix)

    def construct(self, source_ids, target_ids, label_ids, label_weights):
        log_probs = self.transformer(source_ids, target_ids)
        one_hot = ops.one_hot(label_ids, VOCAB_SIZE, ms.Tensor(1.0, ms.float32), ms.Tensor(0.0, ms.float32))
        per_token = -ops.reduce_sum(log_probs * one_hot, -1) * label_weights
        return ops.reduce_sum(per_token) / ops.reduce_sum(ops.ones_like(label_weights))


_grad_scale = ops.MultitypeFuncGraph("grad_scale")


@_grad_scale.register("Tensor", "Tensor")
def _tensor_grad_scale(scale, grad):
    return grad * ops.cast(ops.reciprocal(scale), ops.dtype(grad))


class TransformerTrainOneStepWithLossScaleCell(nn.TrainOneStepCell):
    def __init__(self, network, optimizer, scale_update_cell):
        super().__init__(network, optimizer)
        self.loss_scaling_manager = scale_update_cell
        self.loss_scale = ms.Parameter(ms.Tensor(scale_update_cell.get_loss_scale(), ms.float32), name="loss_scale")
        self.hyper_map = ops.HyperMap()

    def construct(self, source_ids, target_ids, label_ids, label_weights):
        loss = self.network(source_ids, target_ids, label_ids, label_weights)
        scaling_sens = self.loss_scale
        sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(source_ids, target_ids, label_ids, label_weights, sens)
        grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        cond = ops.logical_not(all_finite(grads))
        overflow = self.loss_scaling_manager(self.loss_scale, cond)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, cond, scaling_sens


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    dataset = ds.GeneratorDataset(ParallelCorpus(cfg.bad_step),
                                  ["source_ids", "target_ids", "label_ids", "label_weights"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = TransformerNetworkWithLoss(cfg.hidden, cfg.fix)
    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=2 ** 16, scale_factor=2, scale_window=2000)
    train_net = TransformerTrainOneStepWithLossScaleCell(net, nn.Adam(net.trainable_params(), 1e-3), manager)
    model = Model(train_net)
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
