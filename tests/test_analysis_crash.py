"""analyze_dump on real CPU dumps of a step that raised: where the step stopped (``stopped_at``).

Each child trains a tiny embedding model in GRAPH mode with a dump of iterations 2-3; the batch of global
step 4 (dump iteration 3) makes CPU Gather raise, so iteration 2 is complete and iteration 3's dump ends
right before the Gather kernel. The children fail by design (check=False).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

import mindguard
from mindguard.cli.analyze import cli_analyze
from test_analysis_support import DUMP_PRELUDE

SCRIPT = DUMP_PRELUDE + '''
kind = sys.argv[3]


class TokenNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Dense(4, 1)

    def construct(self, tokens):
        return self.head(self.embedding(tokens).mean(axis=1))  # TOKEN LINE


class LogIndexNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(10, 4)
        self.head = nn.Dense(4, 1)

    def construct(self, x):
        ids = ops.cast(ops.log(x), ms.int32)  # LOG LINE
        return self.head(self.embedding(ids).mean(axis=1))  # LOOKUP LINE


if kind == "token":
    net, x = TokenNet(), np.random.randint(0, 10, size=(8, 3)).astype(np.int32)
    x[6, 1] = BAD_TOKEN              # batch 4 (global step 4, dump iteration 3): an id past the vocabulary
else:
    net, x = LogIndexNet(), np.random.uniform(1.0, 2.0, size=(8, 3)).astype(np.float32)
    x[6, 1] = 0.0                    # log(0) = -inf; cast to int32 it is a negative index
y = np.random.rand(8, 1).astype(np.float32)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(2)
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))
model.train(1, data, dataset_sink_mode=False)
'''
BAD_TOKEN = 12
VOCAB = 10


def _line(marker: str) -> int:
    for number, line in enumerate(textwrap.dedent(SCRIPT).splitlines(), start=1):
        if line.rstrip().endswith(marker):
            return number
    raise AssertionError(marker)


@pytest.fixture(scope="module")
def crashes():
    """{kind: (dump_dir, script_path, child stderr)}; generated concurrently, outside pytest's tmp_path (a '.'
    anywhere in the dump path is refused by MindSpore)."""
    base = Path(tempfile.mkdtemp(prefix="mindguard_crash_", dir="/tmp"))
    assert "." not in str(base), base
    env = dict(os.environ)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    env.setdefault("GLOG_v", "3")
    script = base / "train_crash.py"
    script.write_text(textwrap.dedent(SCRIPT).replace("BAD_TOKEN", str(BAD_TOKEN)))
    procs = {kind: subprocess.Popen([sys.executable, str(script), str(base / f"dump_{kind}"), "2-3", kind],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for kind in ("token", "log")}
    out = {}
    try:
        for kind, proc in procs.items():
            _, stderr = proc.communicate(timeout=300)
            assert proc.returncode != 0 and "Gather" in stderr, (kind, proc.returncode, stderr[-3000:])
            out[kind] = (base / f"dump_{kind}", script, stderr)
        yield out
    finally:
        shutil.rmtree(base, ignore_errors=True)


def test_out_of_range_token_stops_in_gather_at_the_embedding_line(crashes):
    dump_dir, script, stderr = crashes["token"]
    assert f"but got {BAD_TOKEN}" in stderr, stderr[-2000:]
    report = mindguard.analyze_dump(dump_dir, iteration=3, progress=False)
    stop = report.stopped_at
    assert stop is not None, str(report)
    assert report.origin is None and report.first_nonfinite is None, report.origin
    op = stop["op"]
    assert op["op_type"] == "Gather" and op["direction"] == "forward", (op["op_type"], op["name"])
    assert op["name"].endswith("embedding-Embedding/Gather-op0"), op["name"]
    assert op["source"] == {"file": str(script), "line": _line("# TOKEN LINE"),
                            "code": "return self.head(self.embedding(tokens).mean(axis=1))  # TOKEN LINE"}, op["source"]
    indices = [i for i in op["inputs"] if i.get("max") == BAD_TOKEN]
    assert indices and indices[0]["slot"] == 1 and indices[0]["dtype"] == "int32", op["inputs"]
    table = [i for i in op["inputs"] if i["slot"] == 0]
    assert table and table[0]["shape"] == [VOCAB, 4] and table[0].get("parameter") == "embedding.embedding_table", \
        op["inputs"]
    assert stop["last_completed"]["op_type"] == "Reshape", stop["last_completed"]
    assert stop["index"] == 1 and stop["ops_not_run"] > 10, (stop["index"], stop["ops_not_run"])
    assert f"max index {BAD_TOKEN} >= {VOCAB} rows of `embedding.embedding_table`" in stop["hint"], stop["hint"]
    assert "vocab" in stop["hint"] and f"clip_by_value(ids, 0, {VOCAB - 1})" in stop["hint"], stop["hint"]

    text = str(report)
    first = text.splitlines()[0]
    assert first == ("error: the step stopped in Gather (forward) -- it did not complete (dump iteration 3, "
                     "rank 0)"), text
    assert f"  --> {script}:{_line('# TOKEN LINE')}" in text and "index out of range" in text, text
    assert "ok: no Inf/NaN" not in text and "is this the failing iteration" not in text, text
    data = json.loads(json.dumps(report.to_dict()))
    assert data["schema"] == 1 and data["stopped_at"]["op"]["op_type"] == "Gather", data["stopped_at"]


def test_complete_iteration_has_no_stop_point(crashes):
    report = mindguard.analyze_dump(crashes["token"][0], iteration=2, progress=False)
    assert report.stopped_at is None, report.stopped_at
    assert report.to_dict()["stopped_at"] is None
    assert str(report).startswith("ok: no Inf/NaN found (dump iteration 2"), str(report)


def test_nan_origin_first_then_the_stop_it_caused(crashes):
    dump_dir, script, _ = crashes["log"]
    report = mindguard.analyze_dump(dump_dir, iteration=3, progress=False)
    assert report.origin is not None and report.origin["op_type"] == "Log", str(report)
    stop = report.stopped_at
    assert stop is not None and stop["op"]["op_type"] == "Gather", str(report)
    assert stop["op"]["source"]["line"] == _line("# LOOKUP LINE"), stop["op"]["source"]
    assert stop["downstream_of_origin"] is True and stop["ops_after_origin"] > 0, stop
    negative = [i for i in stop["op"]["inputs"] if isinstance(i.get("min"), int) and i["min"] < 0]
    assert negative and negative[0]["slot"] == 1, stop["op"]["inputs"]
    assert "index out of range: min index" in stop["hint"] and "non-finite" in stop["hint"], stop["hint"]
    text = str(report)
    assert text.startswith("error: Log (forward) turned finite inputs into Inf/NaN"), text
    note = "note: the step then stopped in Gather (forward), "
    assert note in text and "which the non-finite values reached" in text, text
    assert text.index("error: Log") < text.index(note), text


def test_cli_exit_status_is_1_for_a_stopped_step_and_0_for_a_complete_one(crashes, capsys):
    dump_dir = str(crashes["token"][0])
    codes = {it: cli_analyze(argparse.Namespace(dump_dir=dump_dir, iteration=it, rank=None, json=False, plot=None))
             for it in (2, 3)}
    out = capsys.readouterr().out
    assert codes == {2: 0, 3: 1}, (codes, out)
    assert "error: the step stopped in Gather" in out, out
