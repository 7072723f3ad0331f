"""A step that dies with an exception, not a NaN -- the CPU stand-in for Ascend's `run task error`.

A token id past the vocabulary reaches ``nn.Embedding`` at global step 6: the CPU Gather kernel raises
(a device kernel may abort the step, or silently read the wrong row). The hunt records the step, dumps
it, and names the operator the step stopped in, its line, and the offending index:

    mindguard hunt -- python samples/crash_out_of_range.py
"""
import numpy as np
import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Model
import mindguard

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(0)


class Net(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Dense(4, 1)

    def construct(self, tokens):
        return self.head(self.embedding(tokens).mean(axis=1))


tokens = np.random.randint(0, 10, size=(32, 3)).astype(np.int32)
tokens[21, 1] = 12          # a token id past the vocabulary: batch 6 (global step 6)
labels = np.random.rand(32, 1).astype(np.float32)
data = ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False).batch(4)
net = Net()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))
model.train(2, data, callbacks=[mindguard.Guard()], dataset_sink_mode=False)
