"""A small attention classifier whose graph holds a constant that makes Inf/NaN (issue 52).

    python tests/zoo/attention_constants.py [--bug fill|temperature] [--fix]

One self-attention layer over 6 tokens of 8 features, then a mean and a Dense classifier; GRAPH mode, the attention
computed in float16 (``--bug fill``) as a port of fp32 code to fp16 does. The planted bugs, both constants the graph
folds in:

* ``fill`` (default): the padding mask is applied the fp32 way, ``scores + (1 - mask) * -1e9`` (line ``# FILL``);
  -1e9 does not fit float16 (largest 65504), so the graph holds ``-inf`` there, and ``0 * -inf`` is NaN at every
  position the mask keeps. Expected: nonfinite_loss at global step 1; no operator made it -- the origin the constant
  -inf of the Mul on the ``# FILL`` line, the literal -1e9 named; the hint: a value that fits float16.
* ``temperature``: the scores are divided by a temperature read from the configuration, 0 here (line ``# SCALE``),
  a Python float the graph folds in. Expected: the Div on that line at global step 1, traced to the constant 0, its
  divisor; the hint: set the value, no epsilon.

``--fix``: -1e4 (the line after ``if self.fixed:``) and a temperature of 1.0: healthy.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model

import mindguard

TOKENS, FEATURES, CLASSES, BATCH, STEPS = 6, 8, 3, 4, 4


class Attention(nn.Cell):
    def __init__(self, fixed, temperature, half):
        super().__init__()
        self.query, self.key = nn.Dense(FEATURES, FEATURES), nn.Dense(FEATURES, FEATURES)
        self.fixed, self.temperature, self.half = fixed, temperature, half
        self.head = nn.Dense(FEATURES, CLASSES)

    def construct(self, x, mask):
        q, k = self.query(x), self.key(x)
        scores = ops.bmm(q, k.transpose(0, 2, 1)) / self.temperature  # SCALE
        if self.half:
            scores = scores.astype(ms.float16)
            keep = mask.astype(ms.float16)[:, None, :]
            if self.fixed:
                scores = scores + (1 - keep) * -1e4
            else:
                scores = scores + (1 - keep) * -1e9  # FILL
        weights = ops.softmax(scores.astype(ms.float32), -1)
        return self.head(ops.matmul(weights, x).mean(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bug", choices=("fill", "temperature"), default="fill")
    parser.add_argument("--fix", action="store_true")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(2)
    rng = np.random.RandomState(2)
    x = rng.randn(BATCH * STEPS, TOKENS, FEATURES).astype(np.float32)
    mask = (np.arange(TOKENS)[None, :] < rng.randint(3, TOKENS + 1, (BATCH * STEPS, 1))).astype(np.int32)
    label = rng.randint(0, CLASSES, BATCH * STEPS).astype(np.int32)
    data = ds.NumpySlicesDataset({"x": x, "mask": mask, "label": label}, shuffle=False).batch(BATCH)
    temperature = 0.0 if args.bug == "temperature" and not args.fix else 1.0
    net = Attention(args.fix, temperature, half=args.bug == "fill")
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

    class WithLoss(nn.Cell):
        def __init__(self):
            super().__init__(auto_prefix=False)
            self.net = net

        def construct(self, x, mask, label):
            return loss(self.net(x, mask), label)

    model = Model(nn.TrainOneStepCell(WithLoss(), nn.SGD(net.trainable_params(), 0.05)))
    model.train(1, data, callbacks=[mindguard.Guard()], dataset_sink_mode=False)


if __name__ == "__main__":
    main()
