"""BERT-style sentence classifier fine-tuned in float16, whose attention mask column is wrong in one row (issue 52).

    python tests/zoo/bert_mask_fp16.py [--mode graph|pynative] [--bad_step 5] [--fix] [--no_guard]

Written here after reading mindspore-ai/models official/nlp/Bert (no code copied): the dataset has the columns
``input_ids``, ``input_mask``, ``token_type_id``, ``label_ids``; the self-attention turns the 0/1 mask into an
additive one, ``(1 - mask) * -10000``, in float16 (the fine-tune runs the encoder in fp16); ``Model(net_with_loss,
optimizer=...).train`` wraps it in MindSpore's ``TrainOneStepCell`` (``construct(*inputs)``: the batch reaches the
graph as ``inputs0``..``inputs3``).

The planted bug: the converter that wrote the data copied the token ids into ``input_mask`` for one sentence: row 2
of the batch of global step ``--bad_step`` (default 5: epoch 1, step 5 of 6) holds ids 0..199 (199 planted) where
every other row holds 0/1. ``(1 - 199) * -10000 = 1.98e6`` overflows float16 (max 65504) in the ``Mul`` on line
``# CULPRIT``; the softmax then makes NaN and the loss is NaN.
Expected: kind nonfinite_loss at global step 5, ``Mul`` (forward) at ``# CULPRIT``, traced to the batch column
``input_mask`` (inputs1), row 2, value 199, outside {0, 1}; the hint fixes the data (the converter) first. ``--fix``
writes the mask right: healthy.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

VOCAB, SEQ, HIDDEN, CLASSES, BATCH, STEPS_PER_EPOCH = 200, 8, 16, 2, 4, 6
BAD_ROW = 2


def parse_args():
    parser = argparse.ArgumentParser(description="BERT-style fp16 fine-tune")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--bad_step", type=int, default=5)
    parser.add_argument("--steps_per_epoch", type=int, default=STEPS_PER_EPOCH)
    parser.add_argument("--fix", action="store_true", help="write the mask right (the converter fixed)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class ClassifierRecords:
    """(input_ids, input_mask, token_type_id, label_ids) rows, as a converter wrote them."""

    def __init__(self, bad_step, fix, steps_per_epoch=STEPS_PER_EPOCH):
        rng = np.random.RandomState(3)
        n = BATCH * steps_per_epoch
        lengths = rng.randint(3, SEQ + 1, n)
        self.mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
        self.ids = np.where(self.mask == 1, rng.randint(1, VOCAB, (n, SEQ)), 0).astype(np.int32)
        self.types = np.zeros((n, SEQ), np.int32)
        self.labels = rng.randint(0, CLASSES, n).astype(np.int32)
        self.bad_index = (bad_step - 1) * BATCH + BAD_ROW
        self.fix = fix

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        mask = self.mask[index]
        if index == self.bad_index and not self.fix:
            ids = self.ids[index].copy()
            ids[0] = VOCAB - 1
            mask = ids              # BUG: the converter wrote the token ids into input_mask
            return ids, mask, self.types[index], self.labels[index]
        return self.ids[index], mask, self.types[index], self.labels[index]


class SelfAttention(nn.Cell):
    def __init__(self):
        super().__init__()
        self.query = nn.Dense(HIDDEN, HIDDEN).to_float(ms.float16)
        self.key = nn.Dense(HIDDEN, HIDDEN).to_float(ms.float16)
        self.value = nn.Dense(HIDDEN, HIDDEN).to_float(ms.float16)
        self.scale = HIDDEN ** -0.5

    def construct(self, x, input_mask):
        scores = ops.bmm(self.query(x), ops.transpose(self.key(x), (0, 2, 1))) * self.scale
        mask = ops.cast(ops.expand_dims(input_mask, 1), ms.float16)
        adder = (1.0 - mask) * -10000.0  # CULPRIT
        probs = ops.softmax(scores + adder, -1)
        return ops.bmm(probs, self.value(x))


class BertClassifier(nn.Cell):
    def __init__(self):
        super().__init__()
        self.word_embeddings = nn.Embedding(VOCAB, HIDDEN)
        self.type_embeddings = nn.Embedding(2, HIDDEN)
        self.attention = SelfAttention()
        self.dense = nn.Dense(HIDDEN, CLASSES)

    def construct(self, input_ids, input_mask, token_type_id):
        x = self.word_embeddings(input_ids) + self.type_embeddings(token_type_id)
        x = self.attention(ops.cast(x, ms.float16), input_mask)
        pooled = ops.cast(x[:, 0], ms.float32)
        return self.dense(pooled)


class BertNetWithLoss(nn.Cell):
    def __init__(self):
        super().__init__()
        self.bert = BertClassifier()
        self.loss = nn.CrossEntropyLoss()

    def construct(self, input_ids, input_mask, token_type_id, label_ids):
        logits = self.bert(input_ids, input_mask, token_type_id)
        return self.loss(logits, label_ids)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(1)
    dataset = ds.GeneratorDataset(ClassifierRecords(cfg.bad_step, cfg.fix, cfg.steps_per_epoch),
                                  ["input_ids", "input_mask", "token_type_id", "label_ids"], shuffle=False)
    dataset = dataset.batch(BATCH, drop_remainder=True)
    net = BertNetWithLoss()
    model = Model(net, optimizer=nn.Adam(net.trainable_params(), 1e-3))
    callbacks = [LossMonitor()] if cfg.no_guard else [mindguard.Guard(), LossMonitor()]
    model.train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
