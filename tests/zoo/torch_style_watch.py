"""A torch-style text classifier trained the HF way, as mindnlp code runs on MindSpore (round 3).

    python tests/zoo/torch_style_watch.py [--bad_step 5] [--fix] [--keep_register_hook] [--no_guard]

mindnlp's models are not ``nn.Cell``s: its ``nn.Module`` (mindtorch) keeps MindSpore Parameters and exposes them the
torch way, ``parameters()`` / ``named_parameters()``, and runs ``forward`` eagerly (PyNative). This script stands in
for it without mindnlp: ``Module`` below is such a class, its layers MindSpore cells inside. The loop is the
functional one a ``Trainer`` runs: ``value_and_grad`` over ``list(model.parameters())``, an ``nn.AdamWeightDecay``,
and ``mindguard.watch(train_step, model, optimizer)``.

Like mindnlp, the script replaces ``mindspore.Tensor.register_hook`` with its own function, which fails on a plain
MindSpore tensor (``AttributeError: ... has no attribute '_data'``); ``--keep_register_hook`` leaves MindSpore's.

The planted bug: masked mean pooling divides the summed token states by the count of real tokens; the batch of
global step ``--bad_step`` (default 5: epoch 2, step 1) holds a sequence of padding only, so its count is 0 and the
pooled vector 0 / 0 = NaN. Expected: kind nonfinite_loss, global step 5, the forward ``RealDiv``/``Div`` on line
``# CULPRIT``, a hint about a count of zero -- and ``--fix`` (its fix: divide by ``ops.maximum(count, 1)``)
trains finite.
"""
import argparse

import numpy as np

import mindspore as ms
from mindspore import Parameter, Tensor, nn, ops

import mindguard

VOCAB, HIDDEN, CLASSES, SEQ, BATCH, STEPS_PER_EPOCH = 30, 16, 3, 6, 4, 4


def parse_args():
    parser = argparse.ArgumentParser(description="torch-style classifier, functional loop, watch")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--bad_step", type=int, default=5)
    parser.add_argument("--fix", action="store_true", help="divide by ops.maximum(count, 1) (the hint's fix)")
    parser.add_argument("--keep_register_hook", action="store_true")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


def _mindnlp_register_hook(self, hook):
    """mindnlp replaces Tensor.register_hook with one that expects its own tensor wrapper."""
    return self._data.register_hook(hook)


class Module:
    """A torch-style module (mindnlp's ``nn.Module`` stands here): not a MindSpore Cell; sub-modules and MindSpore
    cells are attributes, Parameters are reached through ``named_parameters()``."""

    training = True

    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def named_modules(self, prefix=""):
        yield prefix, self
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield from value.named_modules(f"{prefix}{name}.")

    def named_parameters(self):
        seen = set()
        for prefix, module in self.named_modules():
            for name, value in vars(module).items():
                cells = [value] if isinstance(value, nn.Cell) else []
                for cell in cells:
                    for param in cell.get_parameters():
                        if id(param) not in seen:
                            seen.add(id(param))
                            yield f"{prefix}{name}.{param.name.rsplit('.', 1)[-1]}", param
                if isinstance(value, Parameter) and id(value) not in seen:
                    seen.add(id(value))
                    yield f"{prefix}{name}", value

    def parameters(self):
        return (param for _, param in self.named_parameters())

    def post_init(self):
        """Name every Parameter by its path, as mindnlp's modules do (``encoder.dense.weight``)."""
        for name, param in list(self.named_parameters()):
            param.name = name
        return self

    def train(self, mode=True):
        self.training = mode
        return self


class Encoder(Module):
    def __init__(self):
        self.embeddings = nn.Embedding(VOCAB, HIDDEN, padding_idx=0)
        self.dense = nn.Dense(HIDDEN, HIDDEN)
        self.norm = nn.LayerNorm((HIDDEN,))

    def forward(self, input_ids):
        return self.norm(ops.gelu(self.dense(self.embeddings(input_ids))))


class ClassifierModel(Module):
    def __init__(self, fix=False):
        self.encoder = Encoder()
        self.classifier = nn.Dense(HIDDEN, CLASSES)
        self.fix = fix

    def forward(self, input_ids, attention_mask):
        hidden = self.encoder(input_ids)
        mask = attention_mask.astype(hidden.dtype).expand_dims(-1)
        count = mask.sum(axis=1)
        if self.fix:
            count = ops.maximum(count, 1.0)
        pooled = (hidden * mask).sum(axis=1) / count  # CULPRIT
        return self.classifier(pooled)


def batches(epochs, bad_step):
    rng = np.random.RandomState(2)
    data = rng.randint(1, VOCAB, (STEPS_PER_EPOCH, BATCH, SEQ)).astype(np.int32)
    lengths = rng.randint(2, SEQ + 1, (STEPS_PER_EPOCH, BATCH))
    labels = rng.randint(0, CLASSES, (STEPS_PER_EPOCH, BATCH)).astype(np.int32)
    step = 0
    for _ in range(epochs):
        for i in range(STEPS_PER_EPOCH):
            step += 1
            ids, length = data[i].copy(), lengths[i].copy()
            if step == bad_step:
                length[2] = 0          # BUG: an empty line of the corpus, tokenised to padding only
            mask = (np.arange(SEQ)[None, :] < length[:, None]).astype(np.int32)
            yield Tensor(ids * mask), Tensor(mask), Tensor(labels[i])


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    if not cfg.keep_register_hook:
        ms.Tensor.register_hook = _mindnlp_register_hook
    model = ClassifierModel(fix=cfg.fix).post_init()
    optimizer = nn.AdamWeightDecay(list(model.parameters()), learning_rate=1e-3)
    loss_fn = nn.CrossEntropyLoss()

    def forward_fn(input_ids, attention_mask, labels):
        return loss_fn(model(input_ids, attention_mask), labels)

    grad_fn = ms.value_and_grad(forward_fn, None, optimizer.parameters)

    def train_step(input_ids, attention_mask, labels):
        loss, grads = grad_fn(input_ids, attention_mask, labels)
        optimizer(grads)
        return loss

    if not cfg.no_guard:
        train_step = mindguard.watch(train_step, model, optimizer)
    model.train()
    for step, (ids, mask, labels) in enumerate(batches(cfg.epochs, cfg.bad_step), start=1):
        loss = train_step(ids, mask, labels)
        print(f"step {step}: loss {float(loss):.4f}", flush=True)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
