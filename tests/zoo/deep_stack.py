"""Fine-tuning a stack of residual blocks that holds 5,000 small Parameters (issue 38).

    python tests/zoo/deep_stack.py [--mode graph|pynative] [--blocks 10] [--heads 498] [--train_heads] [--no_guard]

Large models hold thousands of small Parameters, and are mostly fine-tuned with most of them frozen (adapters,
norm-only tuning): here ``--blocks`` pre-norm residual blocks, each a trained ``LayerNorm(8)`` and ``--heads``
frozen tiny heads, one ``(8,)`` Parameter each, that the block stacks into one projection (10 x 500 = 5,000
Parameters, a few dozen operators a step: on 2.10 CPU a stack of 1,250 ``Dense`` blocks takes ~7 s a PyNative step,
training 5,000 Parameters takes minutes to compile, measured), on a regression target, ``Momentum``,
``Model(net, loss, opt).train(..., callbacks=[LossMonitor, Guard])``. Guard's Parameter check covers every
Parameter of the network (frozen ones too): with no warning and little cost.

The training is healthy. It prints ``parameters: N`` and, at its end, ``training finished``.
"""
import argparse

import numpy as np

import mindspore as ms
import mindspore.dataset as ds
from mindspore import nn, ops
from mindspore.train import LossMonitor, Model

import mindguard

WIDTH = 8
BATCH = 4


def parse_args():
    parser = argparse.ArgumentParser(description="a deep stack of small blocks")
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--blocks", type=int, default=10)
    parser.add_argument("--heads", type=int, default=498, help="(8,) Parameters per block")
    parser.add_argument("--steps", type=int, default=4, help="batches per epoch")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--train_heads", action="store_true", help="train the heads too (slow: 5,000 updates a step)")
    parser.add_argument("--no_guard", action="store_true")
    return parser.parse_args()


class Block(nn.Cell):
    def __init__(self, index, heads, trained):
        super().__init__()
        self.norm = nn.LayerNorm((WIDTH,))
        rng = np.random.RandomState(index)
        self.heads = ms.ParameterTuple([ms.Parameter(ms.Tensor(rng.normal(0, 0.3, WIDTH).astype(np.float32)),
                                                     name=f"block{index}.head{h}", requires_grad=trained)
                                        for h in range(heads)])

    def construct(self, x):
        proj = ops.stack(self.heads)                       # (heads, WIDTH)
        mixed = ops.matmul(ops.tanh(ops.matmul(self.norm(x), proj.T)), proj)
        return x + mixed / proj.shape[0]


class DeepStack(nn.Cell):
    def __init__(self, blocks, heads, trained):
        super().__init__()
        self.blocks = nn.CellList([Block(i, heads, trained) for i in range(blocks)])

    def construct(self, x):
        for block in self.blocks:
            x = block(x)
        return x


def main():
    cfg = parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if cfg.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(1)
    net = DeepStack(cfg.blocks, cfg.heads, cfg.train_heads)
    print(f"parameters: {len(list(net.get_parameters()))}", flush=True)
    rng = np.random.RandomState(0)
    x = rng.normal(0, 1, (cfg.steps * BATCH, WIDTH)).astype(np.float32)
    y = np.tanh(x[:, ::-1]).astype(np.float32)
    dataset = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(BATCH)
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9)
    callbacks = [LossMonitor()]
    if not cfg.no_guard:
        callbacks.append(mindguard.Guard())
    Model(net, nn.MSELoss(), opt).train(cfg.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    print("training finished", flush=True)


if __name__ == "__main__":
    main()
