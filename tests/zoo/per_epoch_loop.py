"""Text classifier trained one epoch per ``model.train`` call (a model-zoo per-epoch loop).

Shapes 1, 2, 3 and 5 of the hunt's real-script suite:

    python tests/zoo/per_epoch_loop.py [--mode graph|pynative] [--guard shared|fresh|guard_model] [--bug norm|oov]

The loop is ``for epoch in range(E): model.train(1, ds, callbacks=[guard, LossMonitor(), ModelCheckpoint(...)])``
with a zoo-style ``TrainOneStepCellWithGradClip`` inside ``Model(train_cell)`` (``--guard shared``: one
``Guard`` for every call; ``fresh``: a new ``Guard()`` per call; ``guard_model``: ``Model(net, loss, opt)``
wrapped by ``mindguard.guard_model`` with one shared Guard).

4 steps per epoch (16 sentences, batch 4), 4 epochs, so call c step s is global step 4*(c-1)+s.
MindSpore prints "epoch: 1" in every call (each call trains 1 epoch).

Planted bugs (from the data logic below):
* ``--bug norm`` (default): the curriculum lets short, zero-padded sentences in from epoch 3 on; the
  first is sentence 5 = batch 2 of epoch 3. The padding row of the embedding is the zero vector, so
  ``nn.Norm`` takes sqrt(0) and its backward (SqrtGrad) makes NaN gradients: every parameter is NaN
  after global step 10 (call 3, epoch 1 step 2 as printed), while that step's loss is still finite.
  Expected: kind nonfinite_params (nonfinite_grads with guard_model), SqrtGrad backward, line ``# CULPRIT``,
  hint SafeNorm.
* ``--bug oov``: from epoch 2 on, word dropout replaces one word of sentence 9 (= batch 3) with UNK,
  whose id is ``vocab_size`` (one past the embedding table): the CPU Gather raises RuntimeError at
  global step 7 (call 2, epoch 1 step 3 as printed). Expected: kind exception, stopped_at Gather,
  line ``# GATHER``.
Verified plainly with ``--watch`` (see tests/test_zoo_hunt.py for the hunt's expectations).
"""
import argparse
import os

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import CheckpointConfig, LossMonitor, Model, ModelCheckpoint, TimeMonitor

import mindguard


def parse_args():
    parser = argparse.ArgumentParser(description="per-epoch text classification")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--guard", choices=("shared", "fresh", "guard_model"), default="shared")
    parser.add_argument("--bug", choices=("norm", "oov"), default="norm")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--vocab_size", type=int, default=16)
    parser.add_argument("--seq_len", type=int, default=6)
    parser.add_argument("--embed_dim", type=int, default=8)
    parser.add_argument("--num_classes", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--output_dir", default="./per_epoch_output")
    parser.add_argument("--watch", action="store_true", help="print the first non-finite step (verification)")
    return parser.parse_args()


class SentenceSource:
    """Iterable source: each pass is one epoch (the pipeline re-iterates it in every train call)."""

    def __init__(self, cfg, num_sentences=16):
        self.cfg = cfg
        rng = np.random.RandomState(7)
        self.tokens = rng.randint(1, cfg.vocab_size, size=(num_sentences, cfg.seq_len)).astype(np.int32)
        self.labels = rng.randint(0, cfg.num_classes, size=(num_sentences,)).astype(np.int32)
        self.lengths = np.full((num_sentences,), cfg.seq_len)
        self.lengths[5] = 2       # the one short sentence of the corpus (batch 2)
        self.epoch = 0

    def __len__(self):
        return len(self.tokens)

    def __iter__(self):
        self.epoch += 1
        unk_id = self.cfg.vocab_size          # BUG (oov): UNK appended after the vocabulary, table not grown
        for i, (tokens, label) in enumerate(zip(self.tokens, self.labels)):
            tokens = tokens.copy()
            if self.cfg.bug == "norm" and self.epoch >= 3 and self.lengths[i] < self.cfg.seq_len:
                tokens[self.lengths[i]:] = 0  # curriculum: short sentences (zero-padded) from epoch 3 on
            if self.cfg.bug == "oov" and self.epoch >= 2 and i == 9:
                tokens[2] = unk_id            # word dropout -> UNK
            yield tokens, label


def create_dataset(cfg):
    dataset = ds.GeneratorDataset(SentenceSource(cfg), column_names=["tokens", "label"], shuffle=False)
    return dataset.batch(cfg.batch_size, drop_remainder=True)


class BagOfNorms(nn.Cell):
    """Embedding -> per-token L2 norm -> Dense over positions."""

    def __init__(self, vocab_size, embed_dim, seq_len, num_classes):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, embed_dim, padding_idx=0)
        self.norm = nn.Norm(axis=-1)
        self.fc = nn.Dense(seq_len, num_classes)

    def construct(self, tokens):
        emb = self.embedding(tokens)  # GATHER
        feats = self.norm(emb)  # CULPRIT
        return self.fc(feats)


class NetWithLoss(nn.Cell):
    def __init__(self, backbone, loss_fn):
        super().__init__(auto_prefix=False)
        self._backbone = backbone
        self._loss_fn = loss_fn

    def construct(self, tokens, label):
        return self._loss_fn(self._backbone(tokens), label)


class TrainOneStepCellWithGradClip(nn.Cell):
    """Zoo-style train cell: grads, global-norm clip, optimizer."""

    def __init__(self, network, optimizer, clip_norm=5.0):
        super().__init__(auto_prefix=False)
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)
        self.clip_norm = clip_norm

    def construct(self, tokens, label):
        loss = self.network(tokens, label)
        grads = self.grad(self.network, self.weights)(tokens, label)
        grads = ops.clip_by_global_norm(grads, self.clip_norm)
        return ops.depend(loss, self.optimizer(grads))


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(1)
    os.makedirs(cfg.output_dir, exist_ok=True)

    dataset = create_dataset(cfg)
    steps_per_epoch = dataset.get_dataset_size()
    net = BagOfNorms(cfg.vocab_size, cfg.embed_dim, cfg.seq_len, cfg.num_classes)
    loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    opt = nn.Momentum(net.trainable_params(), learning_rate=cfg.lr, momentum=0.9)
    if cfg.guard == "guard_model":
        model = mindguard.guard_model(Model(net, loss_fn=loss_fn, optimizer=opt, metrics={"acc"}))
    else:
        model = Model(TrainOneStepCellWithGradClip(NetWithLoss(net, loss_fn), opt))

    guard = mindguard.Guard()
    ckpt_config = CheckpointConfig(save_checkpoint_steps=steps_per_epoch, keep_checkpoint_max=2)
    for epoch in range(cfg.epochs):
        print(f"=== epoch {epoch + 1}/{cfg.epochs} ===", flush=True)
        callbacks = [guard if cfg.guard != "fresh" else mindguard.Guard(),
                     LossMonitor(), TimeMonitor(data_size=steps_per_epoch),
                     ModelCheckpoint(prefix=f"textclf_e{epoch + 1}", directory=cfg.output_dir, config=ckpt_config)]
        if cfg.watch:
            from nan_watch import NanWatch
            callbacks.append(NanWatch())
        model.train(1, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
