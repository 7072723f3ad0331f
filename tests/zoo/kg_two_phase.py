"""TransE-style knowledge-graph embedding trained in two phases in one process: head-batch, then tail-batch.

Shapes 4 and 11 of the hunt's real-script suite:

    python tests/zoo/kg_two_phase.py [--mode graph|pynative] [--guard shared|per_phase|per_phase_record]
                                     [--bad_phase head|tail] [--bad_step K]

Two zoo-style train cells (``KGTrainOneStepCell``, one per negative-sampling mode) share one TransE
network and one Adam optimizer: ``Model(head_cell).train(2, head_ds)`` then ``Model(tail_cell).train(2, tail_ds)``.
Each phase has 12 triples, batch 4: 3 steps per epoch, 2 epochs = 6 steps per phase.

The planted bug: the triple reader emits the padding line ``(h, <pad>, h)`` (relation 0, whose
embedding is the zero vector, padding_idx=0) at phase step ``--bad_step`` of phase ``--bad_phase``. Its
positive candidate is ``h + 0 - h = 0`` exactly, ``ops.norm(x, dim=2)`` of a zero vector has a NaN
gradient, and the entity embedding turns NaN in that very step (the loss is still finite).
The norm is in a plain helper ``_l2_distance`` that the loss cell's ``construct`` reaches through
``score_head``/``score_tail`` and ``_transe_score``.

Expected (1-based global step counted over both phases):
* default ``--bad_phase head --bad_step 5``: global step 5, call 1 (KGTrainOneStepCell), epoch 2 step 2;
  phase 2 never trains (under the hunt it must be stopped before its first step).
* ``--bad_phase tail --bad_step 4``: global step 6 + 4 = 10, call 2 (KGTrainOneStepCell), epoch 2 step 1.
Both: kind nonfinite_params, SqrtGrad backward, line ``# CULPRIT``, hint ``mindguard.safe_norm(x, axis=2)``.
"""
import argparse
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import CheckpointConfig, LossMonitor, Model, ModelCheckpoint

import mindguard

NUM_TRIPLES = 12


def parse_args():
    parser = argparse.ArgumentParser(description="TransE head-batch / tail-batch training")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--guard", choices=("shared", "per_phase", "per_phase_record"), default="shared")
    parser.add_argument("--bad_phase", choices=("head", "tail", "none"), default="head")
    parser.add_argument("--bad_step", type=int, default=5, help="1-based step within the bad phase")
    parser.add_argument("--epochs_per_phase", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--num_entity", type=int, default=10)
    parser.add_argument("--num_relation", type=int, default=4)
    parser.add_argument("--hidden_dim", type=int, default=8)
    parser.add_argument("--negative_sample_size", type=int, default=3)
    parser.add_argument("--gamma", type=float, default=6.0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--output_path", default="./kge_output")
    parser.add_argument("--watch", action="store_true", help="print the first non-finite step (verification)")
    return parser.parse_args()


class TripleSampler:
    """Iterable source of (positive triple, negative entities); one pass per epoch."""

    def __init__(self, cfg, mode):
        rng = np.random.RandomState(3 if mode == "head" else 4)
        self.triples = np.stack([rng.randint(1, cfg.num_entity, NUM_TRIPLES),
                                 rng.randint(1, cfg.num_relation, NUM_TRIPLES),
                                 rng.randint(1, cfg.num_entity, NUM_TRIPLES)], axis=1).astype(np.int32)
        self.negatives = rng.randint(1, cfg.num_entity,
                                     (NUM_TRIPLES, cfg.negative_sample_size)).astype(np.int32)
        self.bad_step = cfg.bad_step if cfg.bad_phase == mode else None
        self.batch_size = cfg.batch_size
        self.epoch = 0

    def __len__(self):
        return NUM_TRIPLES

    def __iter__(self):
        self.epoch += 1
        steps_per_epoch = NUM_TRIPLES // self.batch_size
        for i in range(NUM_TRIPLES):
            triple = self.triples[i].copy()
            phase_step = (self.epoch - 1) * steps_per_epoch + i // self.batch_size + 1
            if phase_step == self.bad_step and i % self.batch_size == 0:
                triple[1], triple[2] = 0, triple[0]   # BUG: the padding line (h, <pad>, h)
            yield triple, self.negatives[i]


def create_dataset(cfg, mode):
    dataset = ds.GeneratorDataset(TripleSampler(cfg, mode), column_names=["positive", "negative"], shuffle=False)
    return dataset.batch(cfg.batch_size, drop_remainder=True)


class TransE(nn.Cell):
    def __init__(self, num_entity, num_relation, hidden_dim, gamma):
        super().__init__()
        self.entity_embedding = nn.Embedding(num_entity, hidden_dim)
        self.relation_embedding = nn.Embedding(num_relation, hidden_dim, padding_idx=0)
        self.gamma = gamma

    def _l2_distance(self, x):
        return ops.norm(x, dim=2)  # CULPRIT

    def _transe_score(self, head, relation, tail):
        return self.gamma - self._l2_distance(head + relation - tail)

    def score_head(self, positive, negative):
        """candidates replace the head: (batch, 1 + negatives)."""
        heads = ops.concat((positive[:, 0:1], negative), axis=1)
        head = self.entity_embedding(heads)
        relation = self.entity_dims(self.relation_embedding(positive[:, 1]))
        tail = self.entity_dims(self.entity_embedding(positive[:, 2]))
        return self._transe_score(head, relation, tail)  # CALLER

    def score_tail(self, positive, negative):
        """candidates replace the tail: (batch, 1 + negatives)."""
        tails = ops.concat((positive[:, 2:3], negative), axis=1)
        head = self.entity_dims(self.entity_embedding(positive[:, 0]))
        relation = self.entity_dims(self.relation_embedding(positive[:, 1]))
        tail = self.entity_embedding(tails)
        return self._transe_score(head, relation, tail)  # CALLER

    @staticmethod
    def entity_dims(x):
        return ops.expand_dims(x, 1)


class NetWithLoss(nn.Cell):
    """Negative-sampling loss: -log sigmoid(pos) - mean log sigmoid(-neg)."""

    def __init__(self, network, mode):
        super().__init__(auto_prefix=False)
        self.network = network
        self.mode = mode
        self.logsigmoid = nn.LogSigmoid()

    def construct(self, positive, negative):
        if self.mode == "head":
            scores = self.network.score_head(positive, negative)
        else:
            scores = self.network.score_tail(positive, negative)
        positive_loss = -self.logsigmoid(scores[:, 0]).mean()
        negative_loss = -self.logsigmoid(-scores[:, 1:]).mean()
        return (positive_loss + negative_loss) / 2


class KGTrainOneStepCell(nn.TrainOneStepCell):
    """Zoo-style subclass: its own construct (grads + optimizer)."""

    def construct(self, positive, negative):
        loss = self.network(positive, negative)
        grads = self.grad(self.network, self.weights)(positive, negative, ops.ones_like(loss))
        grads = self.grad_reducer(grads)
        return ops.depend(loss, self.optimizer(grads))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(1)
    os.makedirs(cfg.output_path, exist_ok=True)

    kge = TransE(cfg.num_entity, cfg.num_relation, cfg.hidden_dim, cfg.gamma)
    optimizer = nn.Adam(kge.trainable_params(), learning_rate=cfg.lr)
    head_cell = KGTrainOneStepCell(NetWithLoss(kge, "head"), optimizer)
    tail_cell = KGTrainOneStepCell(NetWithLoss(kge, "tail"), optimizer)

    shared_guard = mindguard.Guard()

    def guard_for(phase):
        if cfg.guard == "shared":
            return shared_guard
        if cfg.guard == "per_phase":
            return mindguard.Guard()
        return mindguard.Guard(record=os.path.join(os.path.abspath(cfg.output_path), f"{phase}_failure.json"))

    for phase, cell in (("head", head_cell), ("tail", tail_cell)):
        print(f"=== phase {phase}-batch ===", flush=True)
        dataset = create_dataset(cfg, phase)
        ckpt = ModelCheckpoint(prefix=f"transe_{phase}", directory=cfg.output_path,
                               config=CheckpointConfig(save_checkpoint_steps=dataset.get_dataset_size(),
                                                       keep_checkpoint_max=1))
        callbacks = [guard_for(phase), LossMonitor(), ckpt]
        if cfg.watch:
            from nan_watch import NanWatch
            callbacks.append(NanWatch(phase))
        Model(cell).train(cfg.epochs_per_phase, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
