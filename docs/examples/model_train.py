"""Model.train (or model.fit) with mindguard.Guard: the one callback to add.

    python model_train.py                    # trains clean: exit 0, the record says "finished"
    python model_train.py --lr 1e4           # the weights overflow: Guard stops at the failing step
    python model_train.py --fit              # model.fit(train, valid) instead of model.train
    mindguard hunt -- python model_train.py --lr 1e4

Used by docs/tutorial/your-script.md and docs/how-to/model-train.md; tests/test_docs.py runs it.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import LossMonitor, Model

import mindguard


def build_network():
    return nn.SequentialCell(nn.Dense(8, 16), nn.ReLU(), nn.Dense(16, 1))


def make_dataset(batches=8, batch_size=4, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batches * batch_size, 8)).astype(np.float32)
    y = x.sum(axis=1, keepdims=True).astype(np.float32)
    return ds.NumpySlicesDataset({"data": x, "label": y}, shuffle=False).batch(batch_size)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--fit", action="store_true", help="model.fit(train, valid) instead of model.train")
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    dataset, lr, epochs = make_dataset(), args.lr, args.epochs

    # [start:train]
    mindguard.fix_randomness(seed=1)          # first thing, before the network is built
    net = build_network()
    model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), lr, 0.9), metrics={"mae": nn.MAE()})
    # [end:train]
    if args.fit:
        # [start:fit]
        model.fit(epochs, dataset, valid_dataset=make_dataset(2, seed=1),
                  callbacks=[mindguard.Guard(), LossMonitor()])
        # [end:fit]
    else:
        # [start:guard]
        model.train(epochs, dataset, callbacks=[mindguard.Guard(), LossMonitor()])
        # [end:guard]
    finite = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    print(f"training ended; all parameters finite: {finite}")


if __name__ == "__main__":
    main()
