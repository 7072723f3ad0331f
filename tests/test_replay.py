"""StepCapture / capture_step / replay on real MindSpore (CPU): capture during GRAPH-mode training, replay
eagerly in PyNative, name the cell that first produced Inf/NaN."""
from __future__ import annotations

import json
import textwrap

import numpy as np
import pytest

import mindspore as ms
from mindspore import nn, ops
from mindspore.train import Callback, Model

import mindguard
from mindguard._util.io import atomic_write_json, load_npy, read_json
from mindguard.demos.norm_nan import build_network, make_dataset
from mindguard.cli import build_parser
from mindguard.training.examine.capture import StepCapture, capture_step, load_capture
from mindguard.cli.replay import cli_replay
from page_checks import check_page_file
from mindguard.errors import CaptureError, CaptureMismatchError
from mindguard.training.examine.replay import ReplayReport, replay

FAILING_ITERATION = 10   # contract 7: seed 1, SGD lr 0.05 -> parameters go NaN at global step 11


class BatchLog(Callback):
    """Remembers the batch each step trained on, as seen at the step's end."""

    def __init__(self):
        self.batches = {}

    def on_train_step_end(self, run_context):
        p = run_context.original_args()
        self.batches[p.get("cur_step_num")] = [t.asnumpy() for t in p.get("train_dataset_element")]


class StepCounter(Callback):
    def __init__(self):
        self.steps = 0

    def on_train_step_begin(self, run_context):
        self.steps += 1


def hooks_left(net):
    return {name or "<root>": (len(cell._forward_hook), len(cell._backward_hook))
            for name, cell in net.cells_and_names() if cell._forward_hook or cell._backward_hook}


def norm_net_with_loss():
    return nn.WithLossCell(build_network(), nn.MSELoss())


@pytest.fixture(scope="module")
def demo_captures(tmp_path_factory):
    """Train the demo in GRAPH mode (seed 1, SGD lr 0.05) for 11 steps, capturing iteration 9 (healthy)
    explicitly and iteration 10 (the failing one) from a failure record."""
    base = tmp_path_factory.mktemp("demo")
    record = base / "failure.json"
    atomic_write_json(record, {"schema": 1, "status": "failed", "kind": "nonfinite_params", "epoch": 2,
                               "step_in_epoch": 3, "global_step": FAILING_ITERATION + 1,
                               "dump_iteration": FAILING_ITERATION, "rank": 0, "group_size": 1})
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
    try:
        ms.set_seed(1)
        np.random.seed(1)
        net = build_network()
        model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
        failing = StepCapture(record=record, directory=base / "cap_failing", stop_after=True)
        healthy = StepCapture(FAILING_ITERATION - 1, directory=base / "cap_healthy")
        log, counter = BatchLog(), StepCounter()
        model.train(2, make_dataset(8), callbacks=[healthy, failing, log, counter], dataset_sink_mode=False)
        params_after = {p.name: p.asnumpy() for p in net.trainable_params()}
    finally:
        ms.set_context(mode=previous)
    return {"failing": failing.captured, "healthy": healthy.captured, "batches": log.batches,
            "steps": counter.steps, "params_after": params_after}


def test_capture_holds_the_step_before_its_update(demo_captures):
    assert demo_captures["steps"] == FAILING_ITERATION + 1, \
        f"stop_after should end training at step 11, ran {demo_captures['steps']}"
    cap = load_capture(demo_captures["failing"])
    meta = cap.meta
    assert (meta["iteration"], meta["global_step"], meta["epoch"], meta["step_in_epoch"]) == (10, 11, 2, 3), meta
    assert meta["mode"] == "graph" and meta["reason"] == "step" and meta["rank"] == 0, meta
    roles = {p["name"]: p["role"] for p in meta["parameters"]}
    assert {n for n, r in roles.items() if r == "network"} == \
        {"embedding.embedding_table", "head.weight", "head.bias"}, roles
    assert {"learning_rate", "global_step", "accum.head.weight", "stat.head.weight"} <= {
        n for n, r in roles.items() if r == "optimizer"}, roles
    # parameters before the update are finite; after training they are NaN (the update of this step did it)
    assert np.isfinite(cap.values["embedding.embedding_table"]).all(), cap.values["embedding.embedding_table"]
    assert not np.isfinite(demo_captures["params_after"]["embedding.embedding_table"]).all()
    # train_dataset_element in on_train_step_begin is already this step's batch (same as at its end)
    step_end_batch = demo_captures["batches"][FAILING_ITERATION + 1]
    assert len(cap.inputs) == 2 and all(np.array_equal(a, b) for a, b in zip(cap.inputs, step_end_batch)), (
        cap.inputs, step_end_batch)
    assert (cap.inputs[0] == 0).any(), f"the failing batch should contain padding tokens: {cap.inputs[0]}"
    assert cap.inputs[0].dtype == np.int32 and cap.inputs[1].dtype == np.float32
    assert load_npy(demo_captures["failing"] / "inputs" / "0.npy").shape == (4, 3)


def test_replay_names_norm_in_backward_from_a_graph_mode_capture(demo_captures):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        net_with_loss = norm_net_with_loss()
        before = {p.name: p.asnumpy().copy() for p in net_with_loss.trainable_params()}
        optimizer = nn.SGD(net_with_loss.trainable_params(), learning_rate=0.05)
        report = replay(net_with_loss, demo_captures["failing"], optimizer=optimizer)
        mode_after = ms.get_context("mode")
    finally:
        ms.set_context(mode=previous)
    first = report.first
    assert first is not None, str(report)
    assert (first["op_type"], first["cell"], first["cell_type"], first["direction"]) == (
        "SqrtGrad", "norm", "Norm", "backward"), first
    forward_input = [s for s in first["inputs"] if s["role"] == "input"][0]
    assert forward_input["zeros"] > 0 and forward_input["nan"] == 0, forward_input
    assert all(s["nan"] == 0 and s["pos_inf"] == 0 for s in first["inputs"]), first["inputs"]
    assert first["outputs"][0]["pos_inf"] > 0, first["outputs"]   # SqrtGrad gives +Inf, as in the dump
    assert first["source"]["file"].endswith("norm_nan.py") and "self.norm(" in first["source"]["code"], first["source"]
    assert "SafeNorm" in first["hint"], first["hint"]
    assert report.parameters_nonfinite_after_update == ["embedding.embedding_table"], report.to_dict()
    assert report.iteration == FAILING_ITERATION and np.isfinite(report.loss), report.to_dict()
    # restored: mode, hooks, parameter values
    assert mode_after == ms.GRAPH_MODE, mode_after
    assert hooks_left(net_with_loss) == {}, hooks_left(net_with_loss)
    after = {p.name: p.asnumpy() for p in net_with_loss.trainable_params()}
    assert all(np.array_equal(before[n], after[n]) for n in before), "replay must restore the network's parameters"
    # schema 1 and a compiler-style message
    d = json.loads(json.dumps(report.to_dict()))
    assert d["schema"] == 1 and d["iteration"] == 10 and d["first"]["cell"] == "norm", d
    assert d["first"]["op_type"] == "SqrtGrad" and d["first"]["source"]["line"] == first["source"]["line"], d
    text = str(report)
    assert "error: SqrtGrad (backward of Sqrt) turned finite inputs into Inf/NaN" in text, text
    assert f"norm_nan.py:{first['source']['line']}" in text and "help: SqrtGrad divides" in text, text
    print(text)


def test_replay_of_a_healthy_step_reports_nothing(demo_captures):
    net_with_loss = norm_net_with_loss()
    report = replay(net_with_loss, demo_captures["healthy"],
                    optimizer=nn.SGD(net_with_loss.trainable_params(), learning_rate=0.05))
    assert report.first is None and report.parameters_nonfinite_after_update == [], report.to_dict()
    assert report.healthy and np.isfinite(report.loss) and report.iteration == 9, report.to_dict()
    assert report.to_dict()["first"] is None
    assert "ok: no operator turned finite values into Inf/NaN" in str(report), str(report)
    again = replay(net_with_loss, demo_captures["healthy"])
    assert isinstance(again, ReplayReport) and again.first is None and again.loss == report.loss, again.to_dict()


def test_capture_not_matching_the_network_is_refused_with_names(demo_captures):
    class OtherNet(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(6, 4, padding_idx=0)
            self.norm = nn.Norm(axis=-1)
            self.proj = nn.Dense(3, 1)

        def construct(self, tokens):
            return self.proj(self.norm(self.embedding(tokens)))

    mode = ms.get_context("mode")
    with pytest.raises(CaptureMismatchError) as err:
        replay(nn.WithLossCell(OtherNet(), nn.MSELoss()), demo_captures["failing"])
    message = str(err.value)
    for name in ("proj.weight", "proj.bias", "head.weight", "head.bias"):
        assert name in message, message
    assert "embedding.embedding_table" not in message, message

    class WiderEmbedding(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(7, 4, padding_idx=0)
            self.norm = nn.Norm(axis=-1)
            self.head = nn.Dense(3, 1)

        def construct(self, tokens):
            return self.head(self.norm(self.embedding(tokens)))

    with pytest.raises(CaptureMismatchError, match=r"embedding\.embedding_table: capture \[6, 4\] vs network \[7, 4\]"):
        replay(nn.WithLossCell(WiderEmbedding(), nn.MSELoss()), demo_captures["failing"])

    net_with_loss = norm_net_with_loss()
    with pytest.raises(CaptureMismatchError, match=r"moment1\.head\.weight"):
        replay(net_with_loss, demo_captures["failing"], optimizer=nn.Adam(net_with_loss.trainable_params(), 1e-3))
    assert ms.get_context("mode") == mode


def test_error_inside_replay_restores_mode_hooks_and_parameters(demo_captures):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        backbone = build_network()          # same parameters, but no loss: the captured batch has 2 inputs
        before = {p.name: p.asnumpy().copy() for p in backbone.trainable_params()}
        with pytest.raises(Exception) as err:
            replay(backbone, demo_captures["failing"])
        assert not isinstance(err.value, (CaptureError, CaptureMismatchError)), err.value
        assert ms.get_context("mode") == ms.GRAPH_MODE
        assert hooks_left(backbone) == {}, hooks_left(backbone)
        assert all(np.array_equal(before[p.name], p.asnumpy()) for p in backbone.trainable_params())
    finally:
        ms.set_context(mode=previous)


class LogCell(nn.Cell):
    def construct(self, x):
        return ops.log(x)


class LogNet(nn.Cell):
    """Dense -> ReLU -> log: ReLU outputs 0 for half the batch (inputs come in +v/-v pairs, zero bias)."""

    def __init__(self):
        super().__init__()
        self.dense = nn.Dense(4, 4)
        self.relu = nn.ReLU()
        self.log = LogCell()

    def construct(self, x):
        return self.log(self.relu(self.dense(x))).mean()


class PassLoss(nn.Cell):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def construct(self, x):
        return self.net(x)


def test_replay_names_a_forward_culprit_cell(tmp_path):
    v = np.random.RandomState(0).uniform(0.5, 1.5, size=(2, 4)).astype(np.float32)
    batch = [ms.Tensor(np.concatenate([v, -v]))]
    net = PassLoss(LogNet())
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    train = nn.TrainOneStepCell(net, optimizer)
    path = capture_step(tmp_path / "cap", train, batch, 0, epoch=1, step_in_epoch=1)
    with pytest.raises(CaptureError, match="already exists"):
        capture_step(tmp_path / "cap", train, batch, 0)
    assert capture_step(tmp_path / "cap", train, batch, 0, overwrite=True) == path
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cap"], list(tmp_path.iterdir())

    fresh = PassLoss(LogNet())
    report = replay(fresh, path)
    first = report.first
    assert (first["op_type"], first["cell"], first["cell_type"], first["direction"]) == (
        "Log", "net.log", "LogCell", "forward"), first
    assert first["inputs"][0]["zeros"] > 0 and first["inputs"][0]["nan"] == 0, first["inputs"]
    assert first["outputs"][0]["neg_inf"] > 0, first["outputs"]
    # the op's own line (inside LogCell.construct), as a dump's trace gives it; the caller is in the stack
    assert first["source"]["code"] == "return ops.log(x)", first["source"]
    assert any("self.log(self.relu(" in f["code"] for f in first["stack"]), first["stack"]
    assert "fix:    return ops.log(x + 1e-6)" in first["hint"], first["hint"]
    assert first["hint"], first
    assert not np.isfinite(report.loss), report.loss
    assert hooks_left(fresh) == {}


def test_on_refusal_captures_the_refused_step_from_intact_weights(tmp_path, graph_mode):
    from mindguard.nn.protect import GuardedTrainStep

    ms.set_seed(1)
    np.random.seed(1)
    net = build_network()
    step = GuardedTrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), learning_rate=0.05))
    capture = StepCapture(on_refusal=True, directory=tmp_path / "cap", stop_after=True)
    counter = StepCounter()
    Model(step).train(1, make_dataset(8, clean_epochs=0, poison_step=3), callbacks=[capture, counter],
                      dataset_sink_mode=False)
    assert counter.steps == 3, counter.steps
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    cap = load_capture(capture.captured)
    assert (cap.meta["iteration"], cap.meta["reason"], cap.meta["train_network"]) == (2, "refused_update",
                                                                                     "GuardedTrainStep"), cap.meta
    assert all(np.isfinite(v).all() for v in cap.values.values())
    loss_net = norm_net_with_loss()
    report = replay(loss_net, capture.captured, optimizer=nn.SGD(loss_net.trainable_params(), learning_rate=0.05))
    assert (report.first["cell"], report.first["direction"]) == ("norm", "backward"), report.to_dict()
    assert report.parameters_nonfinite_after_update == ["embedding.embedding_table"], report.to_dict()
    assert ms.get_context("mode") == ms.GRAPH_MODE


def test_bad_configuration_is_refused_before_training(tmp_path, graph_mode):
    with pytest.raises(ValueError, match=r"iteration=.*got -1"):
        StepCapture(-1)
    with pytest.raises(ValueError, match="choose one"):
        StepCapture(3, on_refusal=True)

    counter = StepCounter()

    def train_with(callback):
        ms.set_seed(1)
        net = build_network()
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
            1, make_dataset(2), callbacks=[callback, counter], dataset_sink_mode=False)

    missing = tmp_path / "no_record.json"
    with pytest.raises(mindguard.errors.ArgumentError, match="no_record.json"):
        train_with(StepCapture(record=missing, directory=tmp_path / "cap"))
    finished = tmp_path / "finished.json"
    atomic_write_json(finished, {"schema": 1, "status": "finished", "kind": None, "dump_iteration": 1})
    with pytest.raises(ValueError, match="finished without a failure"):
        train_with(StepCapture(record=finished, directory=tmp_path / "cap"))
    (tmp_path / "existing").mkdir()
    with pytest.raises(CaptureError, match="already exists"):
        train_with(StepCapture(0, directory=tmp_path / "existing"))
    assert counter.steps == 0
    assert not (tmp_path / "cap").exists()


def test_one_capture_per_rank_when_distributed(tmp_path, graph_mode, monkeypatch):
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    ms.set_seed(1)
    net = build_network()
    capture = StepCapture(0, directory=tmp_path / "cap")
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
        1, make_dataset(2), callbacks=[capture], dataset_sink_mode=False)
    assert capture.captured == (tmp_path / "cap.rank1").resolve(), capture.captured
    assert read_json(capture.captured / "capture.json")["rank"] == 1
    assert not (tmp_path / "cap").exists()


def test_cli_replay(demo_captures, tmp_path, capsys):
    factory = tmp_path / "user_factories.py"
    factory.write_text(textwrap.dedent("""
        from mindspore import nn
        from mindguard.demos.norm_nan import build_network

        def net_with_loss():
            return nn.WithLossCell(build_network(), nn.MSELoss())

        def optimizer(network):
            return nn.SGD(network.trainable_params(), learning_rate=0.05)
    """))
    parser = build_parser()
    page = tmp_path / "report.html"
    args = parser.parse_args(["replay", str(demo_captures["failing"]), "--net", f"{factory}:net_with_loss",
                              "--optimizer", f"{factory}:optimizer", "--json", "--html", str(page)])
    assert cli_replay(args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["first"]["cell"] == "norm", out
    assert out["parameters_nonfinite_after_update"] == ["embedding.embedding_table"], out
    # --html: the page of the answer, with the recorded ops around the culprit; never over an existing file
    assert {n["op_type"] for n in out["data_flow"]["nodes"]} >= {"SqrtGrad", "ReduceSum", "Square"}, out["data_flow"]
    assert "SqrtGrad" in check_page_file(tmp_path)
    assert cli_replay(args) == 2 and "already exists" in capsys.readouterr().err

    args = parser.parse_args(["replay", str(demo_captures["failing"]), "--net", f"{factory}:missing"])
    assert cli_replay(args) == 2
    assert "has no callable 'missing'" in capsys.readouterr().err


def test_report_str_and_dict_of_an_empty_report():
    report = ReplayReport(iteration=None)
    assert report.to_dict() == {"schema": 1, "iteration": None, "first": None, "parameters_nonfinite_after_update": [],
                                "loss": None, "capture": None, "warnings": [], "nonfinite_inputs": [],
                                "ops_recorded": 0}
    assert str(report).startswith("ok: no operator turned finite values into Inf/NaN"), str(report)


def test_capture_that_never_happens_is_reported(tmp_path, graph_mode, caplog):
    ms.set_seed(1)
    net = build_network()
    capture = StepCapture(100, directory=tmp_path / "cap")
    with caplog.at_level("WARNING", logger="mindguard"):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
            1, make_dataset(2), callbacks=[capture], dataset_sink_mode=False)
    assert capture.captured is None and not (tmp_path / "cap").exists()
    assert "training ended before global step 101" in caplog.text, caplog.text


class TwoCalls(nn.Cell):
    """One Norm cell called twice (like TransE's pos/neg scores); only the call given zero rows fails."""

    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(6, 4, padding_idx=0)
        self.norm = nn.Norm(axis=-1)

    def construct(self, first, second):
        a = self.norm(self.embedding(first))
        b = self.norm(self.embedding(second))
        return (a - b).mean()


@pytest.mark.parametrize("padded_call", [1, 2])
def test_replay_tells_two_calls_of_one_cell_apart(tmp_path, padded_call):
    full, padded = np.array([[1, 2, 3]], np.int32), np.array([[1, 0, 3]], np.int32)
    batch = [full, padded] if padded_call == 2 else [padded, full]
    path = capture_step(tmp_path / "cap", TwoCalls(), batch, 0)
    report = replay(TwoCalls(), path)
    first = report.first
    assert (first["op_type"], first["cell"], first["direction"], first["call"]) == (
        "SqrtGrad", "norm", "backward", padded_call), first
    expected = "a = self.norm(" if padded_call == 1 else "b = self.norm("
    assert first["source"]["code"].startswith(expected), first["source"]
