"""The right files of the right step: the dump layout queries of ``analysis.files`` and ``time_window``, on a
real CPU dump where two Models (two kernel graphs) trained one after the other share iteration directories
(docs/mindspore-facts.md: graph 0 is dumped as iterations 0.., graph 1 as 1..).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import mindguard
from mindguard.analysis.files import dumped_iterations, find_iteration_dirs, parse_tensor_name
from test_analysis_support import DUMP_PRELUDE, LOG_NET, train_dumps

SCRIPT = DUMP_PRELUDE + LOG_NET + '''
import time


class SqrtNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        return ops.sqrt(self.fc(x))  # SQRT LINE


class Windows(Callback):
    """Each step's wall-clock window in epoch microseconds, as the dump's file names count time."""

    def __init__(self, name):
        self.name, self.steps = name, []

    def on_train_step_begin(self, run_context):
        self.start = time.time_ns() // 1000

    def on_train_step_end(self, run_context):
        self.steps.append((self.start, time.time_ns() // 1000))


def data(rows):
    x = np.array(rows, np.float32)
    return ds.NumpySlicesDataset((x, np.ones((len(rows), 1), np.float32)), column_names=["x", "y"],
                                 shuffle=False).batch(1)


a, b = Windows("a"), Windows("b")
log_net, sqrt_net = LogNet(), SqrtNet()
Model(log_net, nn.MSELoss(), nn.SGD(log_net.trainable_params(), 0.0)).train(                # graph 0
    1, data([[1, 1, 1], [0, 0, 0], [2, 2, 2]]), callbacks=[a], dataset_sink_mode=False)      # step 2: log(0)
Model(sqrt_net, nn.MSELoss(), nn.SGD(sqrt_net.trainable_params(), 0.0)).train(              # graph 1
    1, data([[1, 1, 1], [-1, -1, -1], [2, 2, 2]]), callbacks=[b], dataset_sink_mode=False)   # step 2: sqrt(-3)
print(json.dumps({"a": a.steps, "b": b.steps}))
'''


@pytest.fixture(scope="module")
def two_models():
    for dumps in train_dumps("mindguard_window_", {"two": (SCRIPT, ["all"])}):
        dump, _, stdout, _ = dumps["two"]
        yield dump, json.loads(stdout.strip().splitlines()[-1])


def _iteration_of(dump: Path, graph: int, window) -> int:
    """The iteration directory of ``graph`` whose files were written during ``window`` (the step)."""
    base = dump / "rank_0" / "Net" / str(graph)
    hits = [int(d.name) for d in base.iterdir()
            if any(window[0] <= parse_tensor_name(f.name)[4] <= window[1] for f in d.iterdir()
                   if parse_tensor_name(f.name))]
    assert len(hits) == 1, (graph, window, hits)
    return hits[0]


def test_layout_queries(two_models):
    dump, _ = two_models
    assert dumped_iterations(dump, 0, "Net") == [0, 1, 2, 3], sorted(p.name for p in dump.rglob("*") if p.is_dir())
    net = dump / "rank_0" / "Net"
    assert find_iteration_dirs(dump, 2) == [net / "0" / "2", net / "1" / "2"]       # both hold batch files
    assert find_iteration_dirs(dump, 3) == [net / "1" / "3"]
    assert find_iteration_dirs(dump, 9) == [] and find_iteration_dirs(dump, 2, rank=1) == []
    assert dumped_iterations(dump, 0, "Other") == [] and find_iteration_dirs(dump, 2, net_name="Other") == []


def test_time_window_keeps_only_the_failing_steps_files(two_models):
    dump, windows = two_models
    a_step2, b_step2 = windows["a"][1], windows["b"][1]
    iteration = _iteration_of(dump, 0, a_step2)
    # MindSpore numbers graph 1's steps 3, 1, 2: its step 2 shares an iteration directory with graph 0's step 2
    assert _iteration_of(dump, 1, b_step2) == iteration, (iteration, windows)
    merged = mindguard.analyze_dump(dump, iteration=iteration, progress=False)
    assert merged.graphs == [0, 1] and merged.origin["op_type"] == "Log", (merged.graphs, str(merged))

    b_only = mindguard.analyze_dump(dump, iteration=iteration, time_window=tuple(b_step2), progress=False)
    assert b_only.graphs == [1] and b_only.origin["op_type"] == "Sqrt", (b_only.graphs, str(b_only))
    note = next(n for n in b_only.notes if n.startswith("ignored "))
    a_files = [p for p in (dump / "rank_0" / "Net" / "0" / str(iteration)).iterdir() if p.suffix == ".npy"]
    assert int(note.split()[1]) == len(a_files) > 0, (note, len(a_files))
    assert "two steps of different graphs can be dumped into one iteration directory" in note, note
    assert f"note: {note}" in str(b_only), str(b_only)

    a_only = mindguard.analyze_dump(dump, iteration=iteration, time_window=a_step2, progress=False)
    assert a_only.graphs == [0] and a_only.origin["op_type"] == "Log", (a_only.graphs, str(a_only))
    nowhere = mindguard.analyze_dump(dump, iteration=iteration, time_window=(0, 1), progress=False)
    assert nowhere.graphs == [] and nowhere.origin is None, str(nowhere)
    assert any("outside time_window" in w for w in nowhere.warnings), nowhere.warnings


@pytest.mark.parametrize("window", [(5, 1), (1,), "0-9", (True, 3), (-1, 4), (0, float("nan"))])
def test_bad_time_windows_are_refused(window, tmp_path):
    with pytest.raises(ValueError, match=r"time_window=.*must be \(start_us, end_us\)"):
        mindguard.analyze_dump(tmp_path, time_window=window)
