"""Make a training repeat bit for bit: seeds, fixed initial weights, dropout that repeats, a checked pipeline.

Run it twice; the printed per-step losses are identical, down to the last bit:

    python samples/reproducible_training.py > a.txt
    python samples/reproducible_training.py > b.txt
    cmp a.txt b.txt && echo identical

The network has dropout and the dataset shuffles: ``fix_randomness(cpu_single_thread=True)`` makes
CPU dropout repeat (its kernel fills the mask from several threads otherwise), ``fix_randomness`` also
seeds the shuffle, and ``Reproducible(init_params_dir=...)`` saves the initial weights on the first
run and loads them on every later one (the field report's "initial weights from .npy").
"""
import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback, Model

import mindguard
from mindguard.training.reproduce import Reproducible

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
mindguard.fix_randomness(seed=7, cpu_single_thread=True)     # before the network is built


class PrintLoss(Callback):
    def on_train_step_end(self, run_context):
        loss = run_context.original_args().get("net_outputs")
        print(f"step {run_context.original_args().get('cur_step_num')}: {float(loss.asnumpy()).hex()}")


net = nn.SequentialCell([nn.Dense(8, 16), nn.ReLU(), nn.Dropout(p=0.3), nn.Dense(16, 1)])
x = np.random.rand(64, 8).astype(np.float32)
y = x.sum(axis=1, keepdims=True)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=True).batch(16)
model = Model(net, nn.MSELoss(), nn.Adam(net.trainable_params(), 0.01))
model.train(2, data, callbacks=[Reproducible(init_params_dir="init_params", check_shuffle="ignore"),
                                PrintLoss()], dataset_sink_mode=False)
