"""A Model.train training on a CSV file read by MindSpore's own CSVDataset, with an always-on Guard: the data a run
read is part of its evidence (tests/test_evidence.py).

    python csv_train.py data/train.csv        # fails where the file's huge row is (written by --write)
    python csv_train.py data/train.csv --write 9   # writes the file: 16 batches of 4 rows, batch 9 holding 3e38

Model: four features -> Dense(4, 8) -> ReLU -> Dense(8, 1), MSE. A feature of 3e38 overflows float32 in the first
Dense: the loss of that step is Inf.
"""
import sys
from pathlib import Path

import numpy as np

BATCH, STEPS, FEATURES = 4, 16, 4


def write(path: Path, poison: int) -> None:
    rng = np.random.default_rng(0)
    rows = rng.normal(size=(BATCH * STEPS, FEATURES + 1)).astype(np.float32)
    rows[(poison - 1) * BATCH, 0] = 3e38
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(",".join(f"{v:.6g}" for v in row) + "\n" for row in rows))


def main() -> int:
    path = Path(sys.argv[1])
    if "--write" in sys.argv:
        write(path, int(sys.argv[sys.argv.index("--write") + 1]))
        return 0
    import mindspore as ms
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Model

    import mindguard

    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    mindguard.fix_randomness(0)

    class Regressor(nn.Cell):
        def __init__(self):
            super().__init__()
            self.body = nn.SequentialCell([nn.Dense(FEATURES, 8), nn.ReLU(), nn.Dense(8, 1)])
            self.loss = nn.MSELoss()

        def construct(self, x0, x1, x2, x3, label):
            features = ms.ops.stack([x0, x1, x2, x3], axis=1)
            return self.loss(self.body(features).squeeze(-1), label)

    names = [f"x{i}" for i in range(FEATURES)] + ["label"]
    data = ds.CSVDataset([str(path)], column_defaults=[0.0] * (FEATURES + 1), column_names=names, shuffle=False)
    net = Regressor()
    model = Model(net, optimizer=nn.SGD(net.trainable_params(), learning_rate=0.01))
    guard = mindguard.Guard()
    model.train(1, data.batch(BATCH), callbacks=[guard], dataset_sink_mode=False)
    return 1 if guard.failure is not None else 0


if __name__ == "__main__":
    sys.exit(main())
