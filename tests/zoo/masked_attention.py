"""A tiny Transformer-style classifier trained by a functional loop, with a padding mask of -inf.

    python tests/zoo/masked_attention.py [--mode graph|pynative] [--jit] [--mask fill|additive] [--bad_step K]

The attention masks padded keys with -inf (``masked_fill(scores, pad, -inf)``, or an additive 0/-inf mask built
on the host with ``--mask additive``), then a hand-written softmax subtracts each row's max. The masks' -inf
are intended and harmless -- until batch ``--bad_step`` (1-based) holds a sequence that is padding only: its
rows are -inf everywhere, ``-inf - -inf`` is NaN (line ``# CULPRIT``), and the loss goes NaN.
Expected: kind nonfinite_loss at global step K, Sub (forward) at ``# CULPRIT``, the masking hint.
"""
import argparse

import numpy as np

import mindspore as ms
from mindspore import nn, ops

import mindguard

SEQ, VOCAB, DIM, CLASSES, BATCH = 6, 20, 8, 3, 4


def parse_args():
    parser = argparse.ArgumentParser(description="masked self-attention, functional loop")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="pynative")
    parser.add_argument("--jit", action="store_true", help="decorate the train step with @mindspore.jit")
    parser.add_argument("--mask", choices=("fill", "additive"), default="fill")
    parser.add_argument("--bad_step", type=int, default=4, help="the batch with an all-padding sequence (0: none)")
    parser.add_argument("--steps", type=int, default=6)
    return parser.parse_args()


class SelfAttentionClassifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.query = nn.Dense(DIM, DIM)
        self.key = nn.Dense(DIM, DIM)
        self.value = nn.Dense(DIM, DIM)
        self.head = nn.Dense(DIM, CLASSES)
        self.scale = 1.0 / np.sqrt(DIM)

    def attend(self, scores):
        e = ops.exp(scores - scores.max(axis=-1, keepdims=True))  # CULPRIT
        return e / e.sum(axis=-1, keepdims=True)

    def construct(self, tokens, pad, additive):
        x = self.embed(tokens)
        scores = ops.matmul(self.query(x), self.key(x).swapaxes(1, 2)) * self.scale
        scores = ops.masked_fill(scores, pad.expand_dims(1), float("-inf")) + additive.expand_dims(1)
        context = ops.matmul(self.attend(scores), self.value(x))
        return self.head(context.mean(axis=1))


def batches(steps, bad_step, mask):
    rng = np.random.RandomState(0)
    for step in range(1, steps + 1):
        lengths = rng.randint(2, SEQ + 1, BATCH)
        if step == bad_step:
            lengths[1] = 0   # a sequence that is padding only
        pad = np.arange(SEQ)[None, :] >= lengths[:, None]
        tokens = np.where(pad, 0, rng.randint(1, VOCAB, (BATCH, SEQ))).astype(np.int32)
        additive = np.where(pad, -np.inf, 0.0).astype(np.float32) if mask == "additive" else np.zeros(
            (BATCH, SEQ), np.float32)
        fill = pad if mask == "fill" else np.zeros_like(pad)
        labels = rng.randint(0, CLASSES, BATCH).astype(np.int32)
        yield ms.Tensor(tokens), ms.Tensor(fill), ms.Tensor(additive), ms.Tensor(labels)


def main():
    args = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(7)
    net = SelfAttentionClassifier()
    loss_fn = nn.CrossEntropyLoss()
    optimizer = nn.Adam(net.trainable_params(), 1e-3)

    def forward_fn(tokens, pad, additive, labels):
        logits = net(tokens, pad, additive)
        return loss_fn(logits, labels), logits

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)

    def train_step(tokens, pad, additive, labels):
        (loss, _), grads = grad_fn(tokens, pad, additive, labels)
        optimizer(grads)
        return loss

    if args.jit:
        train_step = ms.jit(train_step)
    train_step = mindguard.watch(train_step, net, optimizer)
    for step, batch in enumerate(batches(args.steps, args.bad_step, args.mask), start=1):
        loss = train_step(*batch)
        print(f"step {step}, loss {float(loss.asnumpy()):.4f}", flush=True)


if __name__ == "__main__":
    main()
