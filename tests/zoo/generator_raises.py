"""Image classifier whose data pipeline raises while producing batch 6 (shape 13 of the hunt's suite).

    python tests/zoo/generator_raises.py [--mode graph|pynative]

A zoo-style random-access ``GeneratorDataset`` source decodes "records"; record 21 is corrupt and its
decoder raises ``ValueError("corrupt record 21: ...")``. 24 records, batch 4, no shuffle: 6 steps per
epoch, and record 21 is in batch 6 (records 20..23), i.e. global step 6 (call 1, epoch 1 step 6/6).
MindSpore prefetches batches, so the exception reaches Python right after step 1 (plain run: "step 1
begins", step 1's loss, then the ValueError, no "step 2 begins"); the failing step is still the one whose
batch raised: global step 6.
Expected: kind exception, global step 6, call 1, epoch 1 step 6, message mentions "corrupt record 21".
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mindguard

CORRUPT_RECORD = 21


def parse_args():
    parser = argparse.ArgumentParser(description="classifier with a corrupt record")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=4)
    parser.add_argument("--num_records", type=int, default=24)
    parser.add_argument("--no_guard", action="store_true", help="train without mindguard (verification)")
    parser.add_argument("--sink", action="store_true", help="dataset_sink_mode=True (the hunt then refuses)")
    return parser.parse_args()


class RecordSource:
    """Random-access source: __getitem__ decodes one record."""

    def __init__(self, num_records):
        rng = np.random.RandomState(0)
        self.raw = rng.randint(0, 256, (num_records, 3 * 8 * 8)).astype(np.uint8)
        self.labels = rng.randint(0, 4, num_records).astype(np.int32)

    def __len__(self):
        return len(self.raw)

    def __getitem__(self, index):
        if index == CORRUPT_RECORD:
            raise ValueError(f"corrupt record {index}: truncated image bytes")  # BUG: the corrupt record
        image = self.raw[index].reshape(3, 8, 8).astype(np.float32) / 255.0
        return image, self.labels[index]


def create_dataset(cfg):
    dataset = ds.GeneratorDataset(RecordSource(cfg.num_records), ["image", "label"], shuffle=False)
    return dataset.batch(cfg.batch_size, drop_remainder=True)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.flatten = nn.Flatten()
        self.fc1 = nn.Dense(3 * 8 * 8, 16)
        self.relu = nn.ReLU()
        self.fc2 = nn.Dense(16, 4)

    def construct(self, x):
        return self.fc2(self.relu(self.fc1(self.flatten(x))))


class StepPrinter(LossMonitor):
    """LossMonitor that also says when a step begins (to see where the exception arrives)."""

    def on_train_step_begin(self, run_context):
        print(f"step {run_context.original_args().cur_step_num} begins", flush=True)


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    mindguard.fix_randomness(0)
    net = Net()
    model = Model(net, loss_fn=nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
                  optimizer=nn.Momentum(net.trainable_params(), learning_rate=0.01, momentum=0.9))
    callbacks = ([] if cfg.no_guard else [mindguard.Guard()]) + [StepPrinter()]
    model.train(cfg.epochs, create_dataset(cfg), callbacks=callbacks, dataset_sink_mode=cfg.sink)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
