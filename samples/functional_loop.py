"""The functional training loop of MindSpore 2.x's tutorials, guarded by two added lines.

    python samples/functional_loop.py [--mode graph|pynative] [--jit] [--loss-scale] [--fixed]
    mindguard hunt -- python samples/functional_loop.py --jit

A small classifier written the way the quick-start tutorial writes one (``forward_fn``, ``value_and_grad``,
``train_step``, ``train_loop``), with a hand-written cross-entropy: ``log(softmax(logits))``. The third batch
carries a badly scaled sample (x 300); its softmax underflows to exactly 0 for the classes far below the
largest logit and ``log(0) = -inf``: the loss is Inf at global step 3.

The two mindguard lines are marked ``# mindguard``. ``--loss-scale`` uses the tutorial's loss-scaling idiom
(``amp.all_finite`` on the gradients, update only when finite): the refused update is then recorded as
``nonfinite_grads`` with the weights left intact. ``--fixed`` computes ``ops.log_softmax`` instead.
"""
import argparse

import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import amp, nn, ops

import mindguard

parser = argparse.ArgumentParser()
parser.add_argument("--mode", choices=("graph", "pynative"), default="pynative")
parser.add_argument("--jit", action="store_true", help="compile train_step with @mindspore.jit")
parser.add_argument("--loss-scale", action="store_true", help="skip the update when the gradients are not finite")
parser.add_argument("--fixed", action="store_true", help="ops.log_softmax instead of log(softmax)")
parser.add_argument("--epochs", type=int, default=3)
args = parser.parse_args()

mindguard.fix_randomness(1)                                                       # mindguard
ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")


def create_dataset(batch_size=4, batches=8):
    rng = np.random.RandomState(0)
    features = rng.randn(batch_size * batches, 16).astype(np.float32)
    labels = rng.randint(0, 5, batch_size * batches).astype(np.int32)
    features[2 * batch_size + 1] *= 300.0   # a badly scaled sample in the 3rd batch of every epoch
    data = {"features": features, "labels": labels}
    return ds.NumpySlicesDataset(data, shuffle=False).batch(batch_size)


class Network(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense_relu_sequential = nn.SequentialCell(nn.Dense(16, 32), nn.ReLU(), nn.Dense(32, 5))

    def construct(self, x):
        return self.dense_relu_sequential(x)


def cross_entropy(logits, labels):
    if args.fixed:
        log_probs = ops.log_softmax(logits, axis=-1)
    else:
        log_probs = ops.log(ops.softmax(logits, axis=-1))  # the culprit
    return -ops.gather_elements(log_probs, 1, labels.reshape(-1, 1)).mean()


model = Network()
optimizer = nn.SGD(model.trainable_params(), learning_rate=0.02)
loss_scaler = amp.StaticLossScaler(1.0)


def forward_fn(data, label):
    logits = model(data)
    loss = cross_entropy(logits, label)
    return loss, logits


grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters, has_aux=True)


def train_step(data, label):
    (loss, _), grads = grad_fn(data, label)
    if args.loss_scale:
        is_finite = amp.all_finite(grads)
        if is_finite:
            optimizer(loss_scaler.unscale(grads))
        return loss, is_finite
    optimizer(grads)
    return loss


if args.jit:
    train_step = ms.jit(train_step)
train_step = mindguard.watch(train_step, model, optimizer,                        # mindguard
                             update_flag="applied" if args.loss_scale else None)


def train_loop(dataset, epoch):
    for batch, (data, label) in enumerate(dataset.create_tuple_iterator()):
        out = train_step(data, label)
        loss = out[0] if isinstance(out, tuple) else out
        print(f"epoch {epoch + 1} step {batch + 1} loss: {float(loss.asnumpy()):>7f}", flush=True)


train_dataset = create_dataset()
for epoch in range(args.epochs):
    train_loop(train_dataset, epoch)
print("training finished; all parameters finite:",
      all(np.isfinite(p.asnumpy()).all() for p in model.trainable_params()))
