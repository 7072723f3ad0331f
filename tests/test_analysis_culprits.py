"""The culprit and its line on real CPU dumps: kernels that update their inputs in place (BatchNorm's moving
statistics are dumped after the update) and backward culprits whose own trace stops at a caller.

Each dump comes from a real training in a fresh process (the dump config is read at the first compile).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import mindguard
from mindguard.analysis.hints import hint_for
from mindguard.analysis.stats import tensor_stats
from test_analysis_support import DUMP_PRELUDE, line_of, train_dumps

BN_SCRIPT = DUMP_PRELUDE + '''

class ConvBN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, pad_mode="same", has_bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.relu = nn.ReLU()
        self.conv2 = nn.Conv2d(8, 8, 3, pad_mode="same", has_bias=False)
        self.flat = nn.Flatten()
        self.head = nn.Dense(8 * 8 * 8, 1)

    def construct(self, x):
        h = self.relu(self.bn(self.conv(x)))  # BN LINE
        return self.head(self.flat(self.conv2(h)))


net = ConvBN()
x = np.random.randn(32, 3, 8, 8).astype(np.float32)
y = (np.random.randn(32, 1) * 100).astype(np.float32)
data = ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)


class FirstNonFinite(Callback):
    """Stops at the first step that leaves a non-finite parameter; records the largest conv output."""
    step = None

    def on_train_step_end(self, run_context):
        step = run_context.original_args().get("cur_step_num")
        if not all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params()):
            self.step = step
            run_context.request_stop()


watch = FirstNonFinite()
model = Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 1e3, 0.9))   # a learning rate far too high
model.train(1, data, callbacks=[watch], dataset_sink_mode=False)
print(json.dumps({"first_nonfinite_step": watch.step}))
'''

DEEP_NORM_SCRIPT = DUMP_PRELUDE + '''

class DeepNormNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(6, 4, padding_idx=0)
        self.w = ms.Parameter(ms.Tensor(np.ones((1, 3), np.float32)), name="w")
        self.head = nn.Dense(3, 1)

    def construct(self, tokens):
        return self.head(self.features(tokens))

    def features(self, tokens):
        return self.encode(self.embedding(tokens))

    def encode(self, x):
        return self.score(x)  # CALLER LINE

    def score(self, x):
        r = ops.norm(x, dim=2) * self.w  # NORM LINE
        return r


net = DeepNormNet()
tokens = np.array([[1, 2, 3], [0, 0, 0], [4, 5, 1], [2, 3, 4]], np.int32)     # row 1: all padding -> zero vectors
data = ds.NumpySlicesDataset({"x": tokens, "y": np.ones((4, 1), np.float32)}, shuffle=False).batch(4)
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.1))
model.train(1, data, dataset_sink_mode=False)
'''


@pytest.fixture(scope="module")
def dumps():
    """{kind: (dump_dir, script_path, stdout, stderr)}, trained concurrently in fresh processes."""
    yield from train_dumps("mindguard_culprits_", {"bn": (BN_SCRIPT, ["0-7"]), "deepnorm": (DEEP_NORM_SCRIPT, ["0"])})


def _bn_iteration(stdout: str) -> int:
    step = json.loads(stdout.strip().splitlines()[-1])["first_nonfinite_step"]
    assert step is not None, "the huge learning rate did not make any parameter non-finite"
    return step - 1                     # dump iterations are 0-based, steps 1-based


def test_batchnorm_overflow_is_the_origin_not_its_post_update_moving_variance(dumps):
    dump_dir, script, stdout, _ = dumps["bn"]
    iteration = _bn_iteration(stdout)
    report = mindguard.analyze_dump(dump_dir, iteration=iteration, progress=False)
    origin = report.origin
    assert origin is not None, str(report)
    assert (origin["op_type"], origin["direction"]) == ("BatchNorm", "forward"), (origin["op_type"], str(report))
    assert origin["source"]["file"] == str(script) and origin["source"]["line"] == line_of(BN_SCRIPT, "# BN LINE")
    by_slot = {i["slot"]: i for i in origin["inputs"]}
    # the premise MindSpore sets up: its input 4 (moving variance) file already holds the Inf it wrote
    assert by_slot[4]["post_update"] and by_slot[4]["pos_inf"] > 0, by_slot[4]
    assert by_slot[0]["max"] > 1e19 and not by_slot[0]["pos_inf"], by_slot[0]     # huge conv output, finite
    assert not any(i["name"].startswith("bn.moving") for i in report.nonfinite_inputs), report.nonfinite_inputs
    hint = origin["hint"]
    assert "learning rate" in hint and "clip gradients" in hint and "normalise the inputs" in hint, hint
    assert "a constant input row has variance 0" not in hint and "not a variance of 0" in hint, hint
    assert any("dumped after the update" in w for w in report.warnings), report.warnings
    assert "input 4 (after update)" in str(report), str(report)


def _truncate_forward_candidate(ir: Path, op_type: str, after: str) -> None:
    """In ``op_type``'s "Corresponding forward node candidate" stack, drop the frames after the one whose code
    contains ``after``: MindSpore writes such shortened backward traces for some call structures
    (docs/mindspore-facts.md, "Backward nodes' traces can be shorter than their forward node's")."""
    lines = ir.read_text().splitlines(keepends=True)
    out, in_node, in_forward, cut = [], False, False, False
    for line in lines:
        if re.match(r"^  %\d+\(", line):
            in_node = f"= PrimFunc_{op_type}(" in line or f"= {op_type}(" in line
            in_forward = cut = False
        elif in_node and "# Corresponding forward node candidate" in line:
            in_forward = True
        elif in_node and "# Corresponding code candidate" in line:
            in_forward = False
        elif in_node and in_forward and "# In file " in line:
            if cut:
                continue
            cut = after in line
        out.append(line)
    ir.chmod(0o644)
    ir.write_text("".join(out))


def test_backward_culprit_gets_the_deepest_user_line_of_its_forward_node(dumps, tmp_path):
    dump_dir, script, _, _ = dumps["deepnorm"]
    norm_line = line_of(DEEP_NORM_SCRIPT, "# NORM LINE")
    report = mindguard.analyze_dump(dump_dir, progress=False)
    origin = report.origin
    assert (origin["op_type"], origin["direction"]) == ("SqrtGrad", "backward"), str(report)
    assert origin["source"]["line"] == norm_line, origin["source"]

    copy = tmp_path / "short_trace"
    shutil.copytree(dump_dir, copy)
    _truncate_forward_candidate(copy / "rank_0" / "graphs" / "ms_output_trace_code_graph_0.ir", "SqrtGrad",
                                "return self.score(x)")
    shortened = mindguard.analyze_dump(copy, progress=False).origin
    assert shortened["op_type"] == "SqrtGrad", shortened["name"]
    # the forward Sqrt node (found through forward_unique_id / forward_node_name) still reaches ops.norm
    assert shortened["source"] == {"file": str(script), "line": norm_line,
                                   "code": "r = ops.norm(x, dim=2) * self.w  # NORM LINE"}, shortened["source"]
    assert "fix:    r = mindguard.safe_norm(x, axis=2) * self.w" in shortened["hint"], shortened["hint"]
    assert shortened["forward_op"] and shortened["forward_op"].endswith(("Sqrt-op0", "Sqrt")), shortened["forward_op"]


@pytest.mark.parametrize("line,fixed", [
    ("r = ops.norm(x, dim=2) * w", "r = mindguard.safe_norm(x, axis=2) * w"),
    ("r = mint.norm(x, 2, 2) * w", "r = mindguard.safe_norm(x, 2) * w"),
    ("r = ops.norm(x, 2, 2) * w", "r = mindguard.safe_norm(x, 2) * w"),
])
def test_norm_forms_on_a_deep_line_are_rewritten(line, fixed):
    # mint.norm has no CPU kernel and ops.norm(x, 2, dim) compiles to LpNorm (epsilon inside) on CPU, so
    # those two forms cannot fail in a CPU dump: the rewrite of the line the trace gives is checked here
    zero = [tensor_stats(np.array([0.0, 1.0], np.float32))]
    inf = [tensor_stats(np.array([np.inf, 1.0], np.float32))]
    hint = hint_for("SqrtGrad", zero, inf, direction="backward", source_code=line, source_file="/nonexistent.py",
                    source_line=3)
    assert f"now:    {line}\n    fix:    {fixed}" in hint, hint
