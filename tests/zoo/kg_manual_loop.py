"""RotatE-style knowledge-graph training in a hand-written loop over two loss-scale train cells (round 3).

    python tests/zoo/kg_manual_loop.py [--bad_step 33] [--steps 40] [--no_guard]

Model-zoo KGE scripts (RotatE, TransE ports) build one network with loss per negative-sampling mode and one
``nn.TrainOneStepWithLossScaleCell`` each, sharing one Adam optimizer and a fixed loss scale, then step them by
hand, alternating head-batch and tail-batch, and call their callbacks themselves through a ``RunContext``:
here ``mindguard.Guard`` and ``LossMonitor``. Global step k trains the head cell when k is odd, the tail cell
when k is even; each cell runs as a kernel graph of its own.

The planted bug: the entity ids of the data were renumbered with a gap, so the batch of global step
``--bad_step`` (default 33: the head cell's 17th run) names entity 50 of a 50-row table: the CPU ``Gather`` of
the entity embedding raises. Expected: kind exception, global step 33, the ``Gather`` of line ``# GATHER``
and the index-range hint.
"""
import argparse

import numpy as np

import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.amp import all_finite
from mindspore.train import LossMonitor, RunContext
from mindspore.train.callback import _InternalCallbackParam

import mindguard

NUM_ENTITY = 50
NUM_RELATION = 6


def parse_args():
    parser = argparse.ArgumentParser(description="RotatE-style head/tail training, hand-written loop")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--bad_step", type=int, default=33, help="1-based global step whose batch has id 50")
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--negatives", type=int, default=3)
    parser.add_argument("--hidden_dim", type=int, default=8)
    parser.add_argument("--gamma", type=float, default=6.0)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--loss_scale", type=float, default=1024.0)
    parser.add_argument("--no_guard", action="store_true", help="train without mindguard (verification)")
    return parser.parse_args()


class BidirectionalIterator:
    """Yields (mode, positive, negative) batches, head-batch first, then alternating (the zoo's one-shot iterator)."""

    def __init__(self, cfg):
        self.rng = np.random.RandomState(7)
        self.cfg = cfg
        self.step = 0

    def __next__(self):
        self.step += 1
        cfg = self.cfg
        positive = np.stack([self.rng.randint(0, NUM_ENTITY, cfg.batch_size),
                             self.rng.randint(0, NUM_RELATION, cfg.batch_size),
                             self.rng.randint(0, NUM_ENTITY, cfg.batch_size)], axis=1).astype(np.int32)
        negative = self.rng.randint(0, NUM_ENTITY, (cfg.batch_size, cfg.negatives)).astype(np.int32)
        if self.step == cfg.bad_step:
            positive[1, 2] = NUM_ENTITY   # BUG: ids renumbered with a gap: entity 50 of a 50-row table
        return ("head" if self.step % 2 == 1 else "tail"), Tensor(positive), Tensor(negative)


class KGEModel(nn.Cell):
    def __init__(self, hidden_dim, gamma):
        super().__init__()
        self.entity_embedding = nn.Embedding(NUM_ENTITY, hidden_dim)
        self.relation_embedding = nn.Embedding(NUM_RELATION, hidden_dim)
        self.gamma = gamma

    def score(self, head, relation, tail):
        return self.gamma - ops.abs(head + relation - tail).sum(axis=2)

    def construct(self, positive, negative, head_batch):
        relation = ops.expand_dims(self.relation_embedding(positive[:, 1]), 1)
        if head_batch:
            candidates = ops.concat((positive[:, 0:1], negative), axis=1)
            head = self.entity_embedding(candidates)
            tail = ops.expand_dims(self.entity_embedding(positive[:, 2]), 1)  # GATHER
        else:
            candidates = ops.concat((positive[:, 2:3], negative), axis=1)
            head = ops.expand_dims(self.entity_embedding(positive[:, 0]), 1)
            tail = self.entity_embedding(candidates)
        return self.score(head, relation, tail)


class NetWithLoss(nn.Cell):
    def __init__(self, network, mode):
        super().__init__(auto_prefix=False)
        self.network = network
        self.head_batch = mode == "head"
        self.logsigmoid = nn.LogSigmoid()

    def construct(self, positive, negative):
        scores = self.network(positive, negative, self.head_batch)
        positive_loss = -self.logsigmoid(scores[:, 0]).mean()
        negative_loss = -self.logsigmoid(-scores[:, 1:]).mean()
        return (positive_loss + negative_loss) / 2


class KGTrainOneStepWithLossScaleCell(nn.TrainOneStepWithLossScaleCell):
    """The zoo's loss-scale cell made to run on CPU: ``all_finite`` of the unscaled gradients instead of the NPU
    float-status ops of the stock ``construct``; the update is skipped on overflow."""

    def construct(self, positive, negative):
        loss = self.network(positive, negative)
        scaling_sens = self.scale_sense
        scaling_sens_filled = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
        grads = self.grad(self.network, self.weights)(positive, negative, scaling_sens_filled)
        grads = self.hyper_map(ops.partial(_grad_scale, scaling_sens), grads)
        grads = self.grad_reducer(grads)
        overflow = ops.logical_not(all_finite(grads))
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss, overflow, scaling_sens


_grad_scale_op = ops.MultitypeFuncGraph("grad_scale")


@_grad_scale_op.register("Tensor", "Tensor")
def _tensor_grad_scale(scale, grad):
    return grad * ops.cast(ops.Reciprocal()(scale), ops.dtype(grad))


def _grad_scale(scale, grad):
    return _grad_scale_op(scale, grad)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    ms.set_seed(1)

    kge = KGEModel(cfg.hidden_dim, cfg.gamma)
    optimizer = nn.Adam(kge.trainable_params(), learning_rate=cfg.lr)
    scale = Tensor(cfg.loss_scale, ms.float32)
    cells = {mode: KGTrainOneStepWithLossScaleCell(NetWithLoss(kge, mode), optimizer, scale_sense=scale)
             for mode in ("head", "tail")}
    for cell in cells.values():
        cell.set_train()

    callbacks = [LossMonitor(1)] if cfg.no_guard else [mindguard.Guard(), LossMonitor(1)]
    cb_params = _InternalCallbackParam()
    cb_params.train_network = cells["head"]
    cb_params.epoch_num = 1
    cb_params.batch_num = cfg.steps
    cb_params.cur_epoch_num = 1
    cb_params.cur_step_num = 0
    cb_params.dataset_sink_mode = False
    run_context = RunContext(cb_params)
    for cb in callbacks:
        cb.__enter__()
    try:
        for cb in callbacks:
            cb.on_train_begin(run_context)
        data = BidirectionalIterator(cfg)
        for _ in range(cfg.steps):
            mode, positive, negative = next(data)
            cb_params.cur_step_num += 1
            cb_params.train_dataset_element = [positive, negative]
            for cb in callbacks:
                cb.on_train_step_begin(run_context)
            loss, overflow, _ = cells[mode](positive, negative)
            cb_params.net_outputs = (loss, overflow, scale)
            for cb in callbacks:
                cb.on_train_step_end(run_context)
            if run_context.get_stop_requested():
                break
        for cb in callbacks:
            cb.on_train_end(run_context)
    except BaseException as exc:
        for cb in reversed(callbacks):
            cb.__exit__(type(exc), exc, exc.__traceback__)
        raise
    for cb in reversed(callbacks):
        cb.__exit__(None, None, None)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
