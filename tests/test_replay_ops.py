"""PyNative replay at operator level (real MindSpore, CPU, no mocks): the same op, direction, source line and hint
as the GRAPH dump analysis of the same step; the batch named when it brought the Inf/NaN in; the after-update list
equal to a real step's; an ``@ms.jit`` sub-cell seen from the inside; every patch undone."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops

from conftest import REPO
from replay_ops_nets import KINDS, build
from test_analysis_support import DUMP_PRELUDE, train_dumps

from mindguard.training.examine import api_hooks as _api_hooks
from mindguard.analysis import analyze_dump
from mindguard.training.examine.capture import capture_step
from mindguard.training.examine.replay import replay

TESTS = Path(__file__).resolve().parent
ZOO = TESTS / "zoo"
NETS = TESTS / "replay_ops_nets.py"

GRAPH_CHILD = DUMP_PRELUDE + f'''
sys.path.insert(0, {str(TESTS)!r})
from replay_ops_nets import build
with_loss, optimizer, batch = build(sys.argv[3])
step = nn.TrainOneStepCell(with_loss, optimizer)
step.set_train()
step(*[ms.Tensor(x) for x in batch])
'''


def line_of(path: Path, marker: str) -> int:
    """1-based line of ``path`` ending with the marker comment ``marker``."""
    return next(n for n, text in enumerate(path.read_text().splitlines(), 1) if text.rstrip().endswith(marker))


def replay_kind(kind, tmp_path):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        with_loss, optimizer, batch = build(kind)
        path = capture_step(tmp_path / kind, nn.TrainOneStepCell(with_loss, optimizer), batch, 0)
        return replay(with_loss, path, optimizer=optimizer)
    finally:
        ms.set_context(mode=previous)


@pytest.fixture(scope="module")
def graph_answers():
    """The GRAPH dump analysis of each kind's step (one child process each, run concurrently)."""
    jobs = {kind: (GRAPH_CHILD, ["0", kind]) for kind in KINDS}
    for out in train_dumps("mg_replay_ops_", jobs):
        yield {kind: analyze_dump(dump_dir, iteration=0) for kind, (dump_dir, _, _, _) in out.items()}


def _first_line(text):
    return (text or "").splitlines()[0] if text else ""


@pytest.mark.parametrize("kind,op_type,direction,marker,hint_words", [
    ("log_softmax", "Log", "forward", "# LOG-SOFTMAX", ["ops.log_softmax(logits, axis=-1)"]),
    ("sqrt", "SqrtGrad", "backward", "# SQRT", ["+ 1e-6)"]),
    ("norm", "SqrtGrad", "backward", "# NORM", ["mindguard.SafeNorm(axis=-1)"]),
])
def test_pynative_op_line_and_hint_match_graph(graph_answers, tmp_path, kind, op_type, direction, marker,
                                               hint_words):
    graph = graph_answers[kind].origin
    assert graph is not None, str(graph_answers[kind])
    report = replay_kind(kind, tmp_path)
    first = report.first
    assert first is not None, str(report)
    line = line_of(NETS, marker)
    assert (graph["op_type"], graph["direction"], graph["source"]["line"]) == (op_type, direction, line), graph
    assert (first["op_type"], first["direction"], first["source"]["line"]) == (op_type, direction, line), (
        f"replay:\n{report}\n\nGRAPH:\n{graph_answers[kind]}")
    assert Path(first["source"]["file"]).resolve() == NETS.resolve(), first["source"]
    assert _first_line(first["hint"]) == _first_line(graph["hint"]), (first["hint"], graph["hint"])
    for word in hint_words:
        assert word in first["hint"] and word in graph["hint"], (word, first["hint"], graph["hint"])
    if direction == "backward":
        assert first["forward_op"] and first["forward_op"].split("/")[-1].startswith(op_type[:-4]), first
    text = str(report)
    assert f"error: {op_type} (" in text and f"{NETS}:{line}" in text and "help: " in text, text


def test_inf_in_the_batch_is_the_origin_not_a_cell(graph_answers, tmp_path):
    graph = graph_answers["batch_inf"]
    assert graph.origin is None and [i["name"] for i in graph.bad_batch()] == ["inputs0"], str(graph)
    report = replay_kind("batch_inf", tmp_path)
    first = report.first
    assert first["direction"] == "input" and first["name"] == "inputs0" and first["op_type"] is None, first
    assert [(i["name"], i["source"], i["pos_inf"]) for i in report.nonfinite_inputs] == [("inputs0", "batch", 1)]
    d = report.to_dict()
    assert d["first"]["direction"] == "input" and d["nonfinite_inputs"][0]["name"] == "inputs0", d
    text = str(report)
    assert "error: Inf/NaN was already in the step's inputs, no operator produced it" in text, text
    assert "inputs0 (batch, shape [4, 8]): nan=0, pos_inf=1" in text and "fc1" not in text.split("note:")[0], text


class ConvBN(nn.Cell):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Dense(4 * 8 * 8, 2)

    def construct(self, x):
        return self.fc(ops.relu(self.bn(self.conv(x))).reshape(x.shape[0], -1))


@pytest.fixture
def pynative():
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    yield
    ms.set_context(mode=previous)


def convbn_step(lr):
    """``(network with loss, Momentum optimizer, TrainOneStepCell in training mode)``, seeded."""
    ms.set_seed(1)
    with_loss = nn.WithLossCell(ConvBN(), nn.MSELoss())
    optimizer = nn.Momentum(with_loss.trainable_params(), lr, 0.9)
    step = nn.TrainOneStepCell(with_loss, optimizer)
    step.set_train()
    return with_loss, optimizer, step


def siamese_step():
    """The zoo's PyNative siamese net (an ``@ms.jit`` pair-distance cell) and a batch whose pair 1 is the anchor
    twice: ``(network, network with loss, optimizer, step, (a, b, same))``."""
    sys.path.insert(0, str(ZOO))
    try:
        import pynative_jit_cell as zoo
    finally:
        sys.path.remove(str(ZOO))
    ms.set_seed(4)
    net = zoo.SiameseNet(6)
    with_loss = zoo.ContrastiveLoss(net, 1.0)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    step = nn.TrainOneStepCell(with_loss, optimizer)
    step.set_train()
    a, b = np.random.RandomState(0).uniform(-1, 1, (2, 4, 6)).astype(np.float32)
    return net, with_loss, optimizer, step, (a, b, np.ones((4, 1), np.float32))


def _all_params(with_loss, optimizer):
    return {p.name: p for p in list(with_loss.get_parameters()) + list(optimizer.get_parameters())}


@pytest.mark.parametrize("bad", ["nan_pixel", "huge_pixel"])
def test_after_update_list_equals_a_real_step(tmp_path, pynative, bad):
    """As in a hunt: a real (compiled-optimizer) PyNative step runs first, then the failing step is captured,
    run for real, and replayed on the same objects. Weights must not be missed (they were, when values were
    loaded by set_data: the compiled optimizer kept updating the old tensors)."""
    with_loss, optimizer, step = convbn_step(0.1)
    x = np.random.RandomState(0).randn(2, 3, 8, 8).astype(np.float32)
    y = np.zeros((2, 2), np.float32)
    step(ms.Tensor(x), ms.Tensor(y))
    x[0, 0, 0, 0] = np.nan if bad == "nan_pixel" else 1e30
    path = capture_step(tmp_path / "cap", step, [x, y], 1)
    step(ms.Tensor(x), ms.Tensor(y))
    real = sorted(n for n, p in _all_params(with_loss, optimizer).items() if not np.isfinite(p.asnumpy()).all())
    report = replay(with_loss, path, optimizer=optimizer)
    assert real, "the planted value should make the real step non-finite"
    assert sorted(report.parameters_nonfinite_after_update) == real, (real, str(report))
    if bad == "nan_pixel":
        assert report.first["direction"] == "input", str(report)
    else:
        assert (report.first["op_type"], report.first["direction"]) == ("BatchNorm", "forward"), str(report)


def test_jit_subcell_backward_of_its_sqrt_not_its_forward(tmp_path, pynative):
    jit_env = os.environ.get("MS_JIT")
    net, with_loss, optimizer, step, (a, b, same) = siamese_step()
    step(ms.Tensor(a), ms.Tensor(b), ms.Tensor(same))     # the jit cell and the optimizer compile here
    b[1] = a[1]                                           # the anchor paired with itself: sqrt(0)
    path = capture_step(tmp_path / "cap", step, [a, b, same], 5)
    step(ms.Tensor(a), ms.Tensor(b), ms.Tensor(same))
    real = sorted({p.name for p in net.trainable_params() if not np.isfinite(p.asnumpy()).all()})
    report = replay(with_loss, path, optimizer=optimizer)
    after = ms.Tensor(a) - ms.Tensor(b)   # patched entry points are gone: plain ops still work
    first = report.first
    assert (first["op_type"], first["direction"], first["cell_type"]) == ("SqrtGrad", "backward", "PairDistance"), \
        str(report)
    assert first["source"]["line"] == line_of(ZOO / "pynative_jit_cell.py", "# CULPRIT"), first["source"]
    assert "+ 1e-6)" in first["hint"], first["hint"]
    assert sorted(report.parameters_nonfinite_after_update) == real and real, (real, str(report))
    assert os.environ.get("MS_JIT") == jit_env and after.shape == (4, 6)


def _entry_points():
    from mindspore.ops.auto_generate.gen_ops_prim import Log
    from mindspore.ops.primitive import Primitive

    return {"Tensor.__sub__": ms.Tensor.__dict__.get("__sub__"), "Tensor.sum": ms.Tensor.__dict__.get("sum"),
            "Log.__call__": Log.__dict__["__call__"], "Primitive.__call__": Primitive.__dict__["__call__"]}


def test_every_patch_is_undone_even_when_the_step_raises(tmp_path):
    before, env = _entry_points(), os.environ.get("MS_JIT")

    class Raises(nn.Cell):
        def __init__(self):
            super().__init__()
            self.fc = nn.Dense(2, 2)

        def construct(self, x):
            ops.log(self.fc(x))
            raise KeyError("the training's own error")

    net = Raises()
    path = capture_step(tmp_path / "cap", net, [np.ones((1, 2), np.float32)], 0)
    with pytest.raises(KeyError, match="the training's own error"):
        replay(net, path)
    assert _entry_points() == before and os.environ.get("MS_JIT") == env
    with _api_hooks.OpTape(net) as tape:
        assert ms.Tensor.__dict__.get("__sub__") is not None and os.environ["MS_JIT"] == "0"
        ops.log(ms.Tensor(np.ones(2, np.float32)) - 0.5)
    assert [r.op_type for r in tape.records] == ["Sub", "Log"], [r.op_type for r in tape.records]
    assert _entry_points() == before and os.environ.get("MS_JIT") == env


CLI_FACTORIES = f'''
import sys
sys.path.insert(0, {str(ZOO)!r})
from mindspore import nn
import pynative_jit_cell as zoo


def net_with_loss():
    return zoo.ContrastiveLoss(zoo.SiameseNet(6), 1.0)


def optimizer(network):
    return nn.SGD(network.network.trainable_params(), learning_rate=0.05)
'''


@pytest.fixture(scope="module")
def jit_capture(tmp_path_factory):
    base = tmp_path_factory.mktemp("jitcap")
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE)
    try:
        _, _, _, step, (a, b, same) = siamese_step()
        b[1] = a[1]
        return capture_step(base / "cap", step, [a, b, same], 5)
    finally:
        ms.set_context(mode=previous)


@pytest.mark.parametrize("form", ["file", "module"])
def test_cli_replay_of_a_jit_capture_in_both_factory_forms(jit_capture, tmp_path, form):
    factories = tmp_path / "factories"
    factories.mkdir()
    (factories / "jit_factories.py").write_text(CLI_FACTORIES)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    spec = str(factories / "jit_factories.py") if form == "file" else "jit_factories"
    env = dict(os.environ, GLOG_v="3", PYTHONPATH=os.pathsep.join([str(factories), str(REPO)]))
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    proc = subprocess.run([sys.executable, "-m", "mindguard", "replay", str(jit_capture), "--net",
                           f"{spec}:net_with_loss", "--optimizer", f"{spec}:optimizer", "--json"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    import json
    out = json.loads(proc.stdout)
    first = out["first"]
    assert (first["op_type"], first["direction"], first["source"]["line"]) == (
        "SqrtGrad", "backward", line_of(ZOO / "pynative_jit_cell.py", "# CULPRIT")), first
    assert sorted(out["parameters_nonfinite_after_update"]) == [
        "encoder.0.bias", "encoder.0.weight", "encoder.2.bias", "encoder.2.weight"], out
    assert sorted(p.name for p in cwd.iterdir()) == [], "mindguard replay left files in the working directory"


def test_replay_cost_is_a_few_plain_steps(tmp_path, pynative):
    """Measured, printed (the route's cost in the module docstring): a recorded replay vs a plain eager step."""
    with_loss, optimizer, step = convbn_step(0.01)
    x, y = ms.Tensor(np.ones((8, 3, 8, 8), np.float32)), ms.Tensor(np.zeros((8, 2), np.float32))
    step(x, y)
    start = time.perf_counter()
    for _ in range(5):
        step(x, y)
    plain = (time.perf_counter() - start) / 5
    path = capture_step(tmp_path / "cap", step, [x, y], 6)
    start = time.perf_counter()
    report = replay(with_loss, path, optimizer=optimizer)
    replayed = time.perf_counter() - start
    print(f"plain step {plain * 1e3:.1f} ms, replay {replayed * 1e3:.1f} ms ({replayed / plain:.1f}x), "
          f"{report.ops_recorded} ops recorded")
    assert report.healthy and report.ops_recorded > 5, str(report)
    assert replayed < 30.0, replayed


class SharedInput(nn.Cell):
    """``s`` feeds both the sqrt and a product: its total gradient does not say which op made it non-finite."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)

    def construct(self, x, mask):
        s = (self.fc(x) * mask) ** 2
        return (ops.sqrt(s) + s * 0.5).mean()  # SHARED


def test_a_tensor_read_by_two_ops_is_resolved_by_each_ops_own_gradient(tmp_path, pynative):
    mask = np.ones((2, 3), np.float32)
    mask[0] = 0
    net = SharedInput()
    path = capture_step(tmp_path / "cap", net, [np.ones((2, 3), np.float32), mask], 0)
    first = replay(net, path).first
    assert (first["op_type"], first["direction"]) == ("SqrtGrad", "backward"), first
    assert first["source"]["line"] == line_of(Path(__file__), "# SHARED"), first["source"]
    assert first["outputs"][0]["pos_inf"] + first["outputs"][0]["nan"] > 0, first["outputs"]
