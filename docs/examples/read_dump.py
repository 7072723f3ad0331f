"""Dump one iteration yourself and analyse it: DumpConfig, enable_dump, analyze_dump.

    python read_dump.py

A batch holding an exact 0 reaches ops.log at global step 3 (dump iteration 2). The dump of that iteration is
armed before the first compile; analyze_dump names the Log operator and this file's line.
Used by docs/how-to/read-a-dump.md; tests/test_docs.py runs it.
"""
import tempfile

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import Model

import mindguard
from mindguard.dump import DumpConfig, enable_dump

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(1)


class LogFeatures(nn.Cell):
    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(8, 1)

    def construct(self, x):
        return self.dense(ops.log(ops.abs(x)))   # log(0) = -inf


x = np.random.default_rng(0).standard_normal((16, 8)).astype(np.float32) + 3
x[9, 2] = 0.0                                    # batch 3 (rows 8-11) holds a zero
dataset = ds.NumpySlicesDataset({"data": x, "label": x[:, :1]}, shuffle=False).batch(4)
net = LogFeatures()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01))

# [start:dump]
dump_dir = tempfile.mkdtemp(prefix="dump_") + "/dump"      # letters, digits, '_', '-' and '/' only
config = DumpConfig(dump_dir, iteration=2)                 # 0-based: global step 3
with enable_dump(config):                                  # armed before the first compile
    model.train(1, dataset, dataset_sink_mode=False)
report = mindguard.analyze_dump(dump_dir, iteration=2)
print(report)
# [end:dump]
assert report.origin is not None and report.origin.op_type == "Log", report
