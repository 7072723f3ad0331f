"""What Guard's restorable dropout costs a dropout-heavy training step, against nn.Dropout, in one process.

    python benchmarks/dropout_cost.py [--mode graph|pynative] [--batch 16] [--rounds 8] [--steps 10]

A 4-layer Transformer encoder (hidden 128, sequence 32, 12 dropouts: attention probabilities, attention output,
feed-forward output) trained by ``nn.TrainOneStepCell`` + Adam, built twice from the same seed: once as written
(``nn.Dropout``), once after :func:`mindguard.training.dropout.make_restorable`. Each round trains ``--steps`` steps
of one, then of the other (the order alternates by round), after 3 warm-up steps each; a round's value is its mean
step time, and the ratio is paired within a round, so the shared machine's drift cancels. Prints the median step of
each and the median and range of the per-round ratios.
"""
import argparse
import time

import mindspore as ms
import numpy as np
from mindspore import nn, ops

from mindguard.training.dropout import make_restorable

SEQ, HIDDEN, LAYERS = 32, 128, 4


class Layer(nn.Cell):
    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Dense(HIDDEN, 3 * HIDDEN), nn.Dense(HIDDEN, HIDDEN)
        self.attn_drop, self.out_drop, self.ffn_drop = nn.Dropout(p=0.1), nn.Dropout(p=0.1), nn.Dropout(p=0.1)
        self.ffn1, self.ffn2, self.act = nn.Dense(HIDDEN, 4 * HIDDEN), nn.Dense(4 * HIDDEN, HIDDEN), nn.GELU()
        self.norm1, self.norm2 = nn.LayerNorm((HIDDEN,)), nn.LayerNorm((HIDDEN,))

    def construct(self, x):
        q, k, v = ops.split(self.qkv(x), HIDDEN, axis=-1)
        probs = self.attn_drop(ops.softmax(ops.bmm(q, k.transpose(0, 2, 1)) / np.sqrt(HIDDEN), -1))
        x = self.norm1(x + self.out_drop(self.out(ops.bmm(probs, v))))
        return self.norm2(x + self.ffn_drop(self.ffn2(self.act(self.ffn1(x)))))


class Encoder(nn.Cell):
    def __init__(self):
        super().__init__()
        self.layers = nn.CellList([Layer() for _ in range(LAYERS)])
        self.head = nn.Dense(HIDDEN, 2)

    def construct(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x[:, 0])


def build(restorable: bool) -> nn.Cell:
    ms.set_seed(1)
    net = Encoder()
    if restorable:
        assert len(make_restorable(net)) == 3 * LAYERS
    loss = nn.WithLossCell(net, nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"))
    cell = nn.TrainOneStepCell(loss, nn.Adam(net.trainable_params(), 1e-3))
    cell.set_train()
    return cell


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("graph", "pynative"), default="graph")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    ms.set_context(mode=ms.GRAPH_MODE if args.mode == "graph" else ms.PYNATIVE_MODE, device_target="CPU")
    rng = np.random.RandomState(0)
    x = ms.Tensor(rng.randn(args.batch, SEQ, HIDDEN).astype(np.float32))
    y = ms.Tensor(rng.randint(0, 2, args.batch).astype(np.int32))
    cells = {"nn.Dropout": build(False), "KeptStateDropout": build(True)}
    for cell in cells.values():
        for _ in range(3):
            cell(x, y).asnumpy()
    times = {name: [] for name in cells}
    for round_ in range(args.rounds):
        for name in (list(cells) if round_ % 2 == 0 else list(cells)[::-1]):
            start = time.perf_counter()
            for _ in range(args.steps):
                cells[name](x, y).asnumpy()
            times[name].append((time.perf_counter() - start) / args.steps * 1e3)
    ratios = np.array(times["KeptStateDropout"]) / np.array(times["nn.Dropout"])
    for name, values in times.items():
        print(f"{args.mode} batch {args.batch}: {name}: median {np.median(values):.2f} ms/step "
              f"(rounds: {', '.join(f'{v:.1f}' for v in values)})")
    print(f"{args.mode} batch {args.batch}: KeptStateDropout / nn.Dropout per round: median {np.median(ratios):.3f}, "
          f"range {ratios.min():.3f}-{ratios.max():.3f} ({args.rounds} rounds of {args.steps} steps)")


if __name__ == "__main__":
    main()
