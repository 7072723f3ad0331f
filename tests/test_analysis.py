"""mindguard.analyze_dump on real MindSpore CPU dumps (each generated once per session, in its own process:
the dump config is read at the first graph compile of a process)."""
from __future__ import annotations

import csv
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mindguard
from mindguard.analysis.files import parse_tensor_name

PRELUDE = '''
import json, os, sys
dump_dir, iteration = sys.argv[1], sys.argv[2]
cfg = {"common_dump_settings": {"dump_mode": 0, "path": dump_dir, "net_name": "Net", "iteration": iteration,
       "saved_data": "tensor", "input_output": 0, "kernels": [], "support_device": [0], "op_debug_mode": 0},
       "e2e_dump_settings": {"enable": True, "trans_flag": True}}
cfg_path = dump_dir + "_config.json"
with open(cfg_path, "w") as f:
    json.dump(cfg, f)
os.environ["MINDSPORE_DUMP_CONFIG"] = cfg_path
import numpy as np
import mindspore as ms
from mindspore import nn, ops
from mindspore.train import Callback, Model
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
'''

NORM_SCRIPT = PRELUDE + '''
from mindguard.demos.norm_nan import EMBED_DIM, SEQ_LEN, VOCAB, make_dataset
ms.set_seed(1)
np.random.seed(1)


class EmbedNormNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, EMBED_DIM, padding_idx=0)
        self.norm = nn.Norm(axis=-1)
        self.head = nn.Dense(SEQ_LEN, 1)

    def construct(self, tokens):
        return self.head(self.norm(self.embedding(tokens)))  # USER LINE


net = EmbedNormNet()


class FirstNonFiniteStep(Callback):
    step = None

    def on_train_step_end(self, run_context):
        step = run_context.original_args().get("cur_step_num")
        if self.step is None and not all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params()):
            self.step = step
        if self.step is not None and step > self.step:      # one more step: the one after the failure
            run_context.request_stop()


watch = FirstNonFiniteStep()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
model.train(2, make_dataset(8), callbacks=[watch], dataset_sink_mode=False)
print(json.dumps({"first_nonfinite_step": watch.step}))
'''

SMALL_SCRIPT = PRELUDE + '''
import mindspore.dataset as ds
kind = sys.argv[3]


class LogNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        return ops.log(self.fc(x))  # USER LINE log


class ExpNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        h = ops.cast(self.fc(x), ms.float16)
        return ops.cast(ops.exp(h), ms.float32)  # USER LINE exp


class PlainNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1, weight_init="ones", bias_init="zeros")

    def construct(self, x):
        return self.fc(x)  # USER LINE plain


net, x = {
    "log": (LogNet, [[1, 1, 1], [0, 0, 0], [1e-9, 0, 0]]),
    "exp16": (ExpNet, [[4, 4, 4], [1, 1, 1], [0, 0, 0]]),
    "nanbatch": (PlainNet, [[1, float("nan"), 1], [1, 1, 1], [0, 0, 0]]),
}[kind]
net = net()
x = np.array(x, np.float32)
y = np.ones((3, 1), np.float32)
data = ds.NumpySlicesDataset((x, y), column_names=["x", "y"], shuffle=False).batch(3)
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01))
model.train(1, data, dataset_sink_mode=False)
'''

CONTROL_FLOW_SCRIPT = PRELUDE + '''
from mindguard.demos.norm_nan import build_network, make_dataset
ms.set_seed(1)
np.random.seed(1)
net = build_network()
opt = nn.SGD(net.trainable_params(), learning_rate=0.05)


class GuardedStep(nn.Cell):
    """A tensor `if` in the step: MindSpore splits it into several kernel graphs."""

    def __init__(self, network, optimizer):
        super().__init__()
        self.network, self.optimizer, self.weights = network, optimizer, optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True)

    def construct(self, *inputs):
        loss = self.network(*inputs)
        grads = self.grad(self.network, self.weights)(*inputs)
        if ops.isfinite(ops.addn([g.sum() for g in grads])).all():
            loss = ops.depend(loss, self.optimizer(grads))
        return loss


@ms.jit
def params_finite(a, b, c):
    return ops.isfinite(a.sum() + b.sum() + c.sum()).all()


class HelperGraph(Callback):
    """A small compiled helper graph each step: dumped too, as another graph."""

    def on_train_step_end(self, run_context):
        params_finite(*net.trainable_params())


model = Model(GuardedStep(nn.WithLossCell(net, nn.MSELoss()), opt))
model.train(2, make_dataset(8), callbacks=[HelperGraph()], dataset_sink_mode=False)
'''


def _user_line(script: str, marker: str) -> int:
    for number, line in enumerate(script.splitlines(), start=1):
        if line.rstrip().endswith(marker):
            return number
    raise AssertionError(f"marker {marker!r} not in script")


@pytest.fixture(scope="session")
def dumps():
    """Four real dumps, generated concurrently in fresh processes: {kind: (dump_dir, script_path, stdout)}.

    Not under pytest's tmp_path: concurrent pytest sessions of the same user rotate those away, and
    MindSpore rejects a dump path with a '.' anywhere.
    """
    base = Path(tempfile.mkdtemp(prefix="mindguard_analysis_", dir="/tmp"))
    assert "." not in str(base), base
    try:
        yield _generate(base)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _generate(base: Path) -> dict:
    jobs = {
        "norm": (NORM_SCRIPT, ["10-11"]),
        "log": (SMALL_SCRIPT, ["0", "log"]),
        "exp16": (SMALL_SCRIPT, ["0", "exp16"]),
        "nanbatch": (SMALL_SCRIPT, ["0", "nanbatch"]),
        "controlflow": (CONTROL_FLOW_SCRIPT, ["8-10"]),
    }
    env = dict(os.environ)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    env.setdefault("GLOG_v", "3")
    procs = {}
    for kind, (script, args) in jobs.items():
        script_path = base / f"train_{kind}.py"
        script_path.write_text(textwrap.dedent(script))
        dump_dir = base / f"dump_{kind}"
        procs[kind] = (subprocess.Popen([sys.executable, str(script_path), str(dump_dir), *args], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True),
                       dump_dir, script_path)
    out = {}
    for kind, (proc, dump_dir, script_path) in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{kind} child exited {proc.returncode}\n{stdout[-3000:]}\n{stderr[-3000:]}"
        out[kind] = (dump_dir, script_path, stdout)
    return out


@pytest.fixture(scope="session")
def norm_report(dumps):
    return mindguard.analyze_dump(dumps["norm"][0], iteration=10, progress=False)


def test_norm_dump_is_the_failing_iteration(dumps):
    dump_dir, _, stdout = dumps["norm"]
    first = json.loads(stdout.strip().splitlines()[-1])["first_nonfinite_step"]
    assert first == 11, f"parameters first went NaN at global step {first}, expected 11 (dump iteration 10)"
    assert (dump_dir / "rank_0" / "Net" / "0" / "10").is_dir(), sorted(p.name for p in dump_dir.rglob("*"))[:20]


def test_norm_origin_is_sqrtgrad_of_the_users_norm_call(dumps, norm_report):
    _, script_path, _ = dumps["norm"]
    origin = norm_report.origin
    assert origin is not None, str(norm_report)
    assert (origin["op_type"], origin["direction"]) == ("SqrtGrad", "backward"), origin["name"]
    assert "norm-Norm" in origin["name"] and origin["name"].startswith("Gradients/"), origin["name"]
    assert origin["forward_op"] and "norm-Norm/Sqrt" in origin["forward_op"], origin["forward_op"]
    line = _user_line(NORM_SCRIPT, "# USER LINE")
    assert origin["source"]["file"] == str(script_path) and origin["source"]["line"] == line, origin["source"]
    assert "self.norm(self.embedding(tokens))" in origin["source"]["code"], origin["source"]
    assert origin["stack"][-1]["file"].endswith("basic.py"), origin["stack"][-1]   # outermost first
    assert any(i.get("zeros", 0) > 0 for i in origin["inputs"]), origin["inputs"]
    assert all(not (i["nan"] or i["pos_inf"] or i["neg_inf"]) for i in origin["inputs"]), origin["inputs"]
    assert any(o["nan"] or o["pos_inf"] or o["neg_inf"] for o in origin["outputs"]), origin["outputs"]
    assert origin["reached"] >= 1, origin["reached"]
    assert "SafeNorm" in origin["hint"] and "make_safe" in origin["hint"], origin["hint"]
    # the fix is shown where the cell is created (the script's __init__), not on the call line
    created = _user_line(NORM_SCRIPT, "self.norm = nn.Norm(axis=-1)")
    assert f"now:    self.norm = nn.Norm(axis=-1)    ({script_path.name}:{created})" in origin["hint"], origin["hint"]
    assert "fix:    self.norm = mindguard.SafeNorm(axis=-1)\n" in origin["hint"], origin["hint"]
    assert norm_report.iteration == 10 and norm_report.rank == 0, (norm_report.iteration, norm_report.rank)
    assert norm_report.first_nonfinite["name"] == origin["name"], norm_report.first_nonfinite["name"]
    assert norm_report.nonfinite_inputs == [], norm_report.nonfinite_inputs


def test_norm_report_text_and_json(dumps, norm_report):
    _, script_path, _ = dumps["norm"]
    text = str(norm_report)
    line = _user_line(NORM_SCRIPT, "# USER LINE")
    assert f"{script_path}:{line}" in text and "return self.head(self.norm(" in text, text
    assert "SqrtGrad" in text and "SafeNorm" in text and "zeros" in text, text
    # only the user's frames in the text; MindSpore's are counted (the JSON keeps the full stack)
    stack_text = text.split("note: stack, outermost first:\n", 1)[1]
    assert "basic.py" not in text and "cell_wrapper.py" not in text, text
    assert f"   {script_path}:{line}: return self.head(self.norm(" in stack_text, stack_text
    internal = {(f["file"], f["line"]) for f in norm_report.origin["stack"] if "site-packages/mindspore" in f["file"]}
    assert internal and f"(+{len(internal)} MindSpore frames; `mindguard analyze --json` shows the full stack)" \
        in stack_text, (internal, stack_text)
    data = json.loads(json.dumps(norm_report.to_dict()))
    assert data["schema"] == 1 and data["iteration"] == 10 and data["graph"] == 0, data
    for key in ("dump", "rank", "origin", "first_nonfinite", "nonfinite_inputs", "fp16_risk", "warnings", "notes"):
        assert key in data, (key, sorted(data))
    for key in ("op_type", "name", "direction", "forward_op", "source", "stack", "inputs", "outputs",
                "reached", "hint"):
        assert key in data["origin"], (key, sorted(data["origin"]))
    for key in ("slot", "shape", "dtype", "min", "max", "zeros", "nan", "pos_inf", "neg_inf"):
        assert key in data["origin"]["inputs"][0], (key, data["origin"]["inputs"][0])


def test_any_dump_path_form_and_bad_selections(dumps, norm_report):
    dump_dir = dumps["norm"][0]
    for path, iteration in ((dump_dir / "rank_0", 10), (dump_dir / "rank_0" / "Net" / "0" / "10", None)):
        report = mindguard.analyze_dump(path, iteration=iteration, progress=False)
        assert report.origin["name"] == norm_report.origin["name"], (path, report.origin and report.origin["name"])
    with pytest.raises(FileNotFoundError, match=r"iteration=3.*dumped iterations: 10-11"):
        mindguard.analyze_dump(dump_dir, iteration=3)
    with pytest.raises(FileNotFoundError, match=r"rank=5.*\[0\]"):
        mindguard.analyze_dump(dump_dir, rank=5)
    with pytest.raises(FileNotFoundError, match="not a directory"):
        mindguard.analyze_dump(dump_dir / "missing")


def test_step_after_the_failure_names_the_nan_parameter(dumps):
    report = mindguard.analyze_dump(dumps["norm"][0], progress=False)          # last dumped: 11
    assert report.iteration == 11 and any("analysed the last, 11" in w for w in report.warnings), report.warnings
    assert report.origin is None, report.origin
    table = [i for i in report.nonfinite_inputs if i["name"] == "embedding.embedding_table"]
    assert table and table[0]["source"] == "parameter" and table[0]["nan"] > 0, report.nonfinite_inputs
    assert "Gather" in table[0]["op"], table[0]


def test_log_of_zero_in_forward(dumps):
    dump_dir, script_path, _ = dumps["log"]
    report = mindguard.analyze_dump(dump_dir, progress=False)
    origin = report.origin
    assert origin is not None, str(report)
    assert (origin["op_type"], origin["direction"]) == ("Log", "forward"), (origin["op_type"], origin["name"])
    assert origin["source"]["line"] == _user_line(SMALL_SCRIPT, "# USER LINE log"), origin["source"]
    assert origin["inputs"][0]["zeros"] >= 1 and origin["outputs"][0]["neg_inf"] >= 1, origin
    assert "ops.log(self.fc(x) + 1e-6)" in origin["hint"], origin["hint"]
    # 1e-9 in the batch is below fp16's smallest subnormal: the Ascend fp16 failure, predicted on CPU
    assert any(r["name"] == "inputs0" and r["underflow"] >= 1 for r in report.fp16_risk), report.fp16_risk


def test_exp_overflow_in_fp16(dumps):
    report = mindguard.analyze_dump(dumps["exp16"][0], progress=False)
    origin = report.origin
    assert origin is not None, str(report)
    assert (origin["op_type"], origin["direction"]) == ("Exp", "forward"), (origin["op_type"], origin["name"])
    assert origin["outputs"][0]["dtype"] == "float16" and origin["outputs"][0]["pos_inf"] >= 1, origin["outputs"]
    assert origin["source"]["line"] == _user_line(SMALL_SCRIPT, "# USER LINE exp"), origin["source"]
    assert "fp32" in origin["hint"] and "to_float" in origin["hint"], origin["hint"]
    # CPU has no fp16 Exp: MindSpore runs it in fp32 and inserts a Cast back to fp16, where the Inf appears
    assert origin["via_backend_cast"] and "Cast" in origin["via_backend_cast"], origin["via_backend_cast"]


def test_nan_already_in_the_batch(dumps):
    report = mindguard.analyze_dump(dumps["nanbatch"][0], progress=False)
    assert report.origin is None, report.origin
    names = [(i["name"], i["nan"]) for i in report.nonfinite_inputs]
    assert ("inputs0", 1) in names, report.nonfinite_inputs
    assert report.first_nonfinite is not None, str(report)
    assert "already in the step's inputs" in str(report), str(report)


def test_control_flow_graphs_are_merged_and_helper_graphs_skipped(dumps):
    dump_dir = dumps["controlflow"][0]
    failing = mindguard.analyze_dump(dump_dir, progress=False)          # last dumped: iteration 10
    assert failing.iteration == 10 and failing.iterations == [8, 9, 10], (failing.iteration, failing.iterations)
    assert any("analysed the last, 10" in w for w in failing.warnings), failing.warnings
    assert failing.origin is not None and failing.origin["op_type"] == "SqrtGrad", str(failing)
    helper = [n for n in failing.notes if "helper graph" in n]
    assert helper and not any("helper graph" in w for w in failing.warnings), (failing.notes, failing.warnings)
    text = str(failing)
    assert f"note: {helper[0]}" in text and "warning: graph" not in text, text
    assert failing.to_dict()["notes"] == failing.notes, failing.to_dict()["notes"]
    healthy = mindguard.analyze_dump(dump_dir, iteration=9, progress=False)
    # iteration 9 was healthy: the optimizer branch ran as its own kernel graph and is merged in
    assert len(healthy.graphs) >= 2 and healthy.graphs[0] == 0, healthy.graphs
    assert healthy.origin is None and healthy.first_nonfinite is None, str(healthy)
    assert any("optimizer-SGD/SGD" in p["name"] for p in healthy.profile), [p["name"] for p in healthy.profile]
    skipped = {int(n.split()[1]) for n in healthy.notes if n.startswith("graph ") and "not analysed" in n}
    assert skipped and not skipped & set(healthy.graphs), (skipped, healthy.graphs)


def _writable_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IRUSR)
    return dst


def test_malformed_dump_gives_warnings_and_a_best_effort_report(dumps, norm_report, tmp_path):
    dump = _writable_copy(dumps["norm"][0], tmp_path / "broken")
    rank = dump / "rank_0"
    shutil.rmtree(rank / "execution_order")
    shutil.rmtree(rank / "graphs")
    it = rank / "Net" / "0" / "10"
    victim = next(p for p in sorted(it.iterdir()) if p.name.startswith("MatMul.Default") and ".output.0." in p.name)
    victim.write_bytes(victim.read_bytes()[:40])                        # truncated header
    (it / "notes.txt").write_text("not a tensor")
    (it / "junk.npy").write_bytes(os.urandom(64))
    pickled = it / "Add.Default_evil-op0.0.0.1.input.0.DefaultFormat.Float32.npy"
    np.save(pickled, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    overflow = it / "Opdebug.Node_OpDebug.3.2.1795951488999999.output.0.json"
    overflow.write_text("{}")

    report = mindguard.analyze_dump(dump, iteration=10, progress=False)
    text = str(report)
    assert report.origin is not None and report.origin["op_type"] == "SqrtGrad", text
    assert report.origin["source"] is None and report.origin["direction"] == "backward", report.origin
    warnings = "\n".join(report.warnings)
    assert "ms_execution_order_graph_0.csv missing" in warnings and ".ir missing" in warnings, warnings
    assert f"unreadable tensor file {victim.name}" in warnings, warnings
    assert f"unreadable tensor file {pickled.name}" in warnings, warnings      # never unpickled
    assert "notes.txt" in warnings and "junk.npy" in warnings, warnings
    assert "source line unknown" in text, text
    assert report.overflow_records == [str(overflow)] and "overflow record" in warnings, report.overflow_records


STAT_HEADER = ["Op Type", "Op Name", "Task ID", "Stream ID", "Timestamp", "IO", "Slot", "Data Size", "Data Type",
               "Shape", "Max Value", "Min Value", "L2Norm Value", "NaN Count", "Negative Inf Count",
               "Positive Inf Count", "Zero Count"]


def _stat_row(op_type, name, ts, io, slot, max_v, min_v, nan=0, ninf=0, pinf=0, zeros=0):
    return [op_type, name, 0, 0, ts, io, slot, 16, "float32", "(2,2)", max_v, min_v, 1.0, nan, ninf, pinf, zeros]


def _write_statistic_dump(root: Path, rank: int, rows) -> None:
    directory = root / f"rank_{rank}" / "Net" / "0" / "3"
    directory.mkdir(parents=True)
    with open(directory / "statistic.csv", "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(STAT_HEADER)
        writer.writerows(rows)


def test_statistic_csv_dump_is_analysed_without_tensors(tmp_path):
    net = "Default_network-WithLossCell__backbone-Net"
    _write_statistic_dump(tmp_path, 0, [
        _stat_row("Sqrt", f"{net}_Sqrt-op0", 100, "input", 0, 4.0, 0.0, zeros=1),
        _stat_row("Sqrt", f"{net}_Sqrt-op0", 101, "output", 0, 2.0, 0.0, zeros=1),
        _stat_row("Log", f"{net}_Log-op0", 102, "input", 0, 2.0, 0.0, zeros=1),
        _stat_row("Log", f"{net}_Log-op0", 103, "output", 0, 0.69, "-inf", ninf=1),
        _stat_row("Mul", f"{net}_Mul-op0", 104, "input", 0, 0.69, "-inf", ninf=1),
        _stat_row("Mul", f"{net}_Mul-op0", 105, "output", 0, "nan", "nan", nan=4),
    ])
    report = mindguard.analyze_dump(tmp_path, progress=False)
    assert report.origin is not None and report.origin["op_type"] == "Log", str(report)
    assert report.origin["inputs"][0]["zeros"] == 1 and report.origin["outputs"][0]["neg_inf"] == 1, report.origin
    assert report.origin["reached"] == 1 and report.iteration == 3, (report.origin["reached"], report.iteration)
    assert any("statistic dump" in w for w in report.warnings), report.warnings


def test_two_ranks_tell_local_origin_from_received_allreduce(tmp_path):
    net = "Default_network-WithLossCell__backbone-Net"
    reducer = "Default_grad_reducer-DistributedGradReducer_AllReduce-op0"
    _write_statistic_dump(tmp_path, 0, [
        _stat_row("Log", f"{net}_Log-op0", 100, "input", 0, 2.0, 0.0, zeros=1),
        _stat_row("Log", f"{net}_Log-op0", 101, "output", 0, 0.69, "-inf", ninf=1),
        _stat_row("AllReduce", reducer, 102, "input", 0, 1.0, "-inf", ninf=1),
        _stat_row("AllReduce", reducer, 103, "output", 0, "nan", "nan", nan=4),
    ])
    _write_statistic_dump(tmp_path, 1, [
        _stat_row("Log", f"{net}_Log-op0", 100, "input", 0, 2.0, 0.5),
        _stat_row("Log", f"{net}_Log-op0", 101, "output", 0, 0.69, -0.69),
        _stat_row("AllReduce", reducer, 102, "input", 0, 1.0, -1.0),
        _stat_row("AllReduce", reducer, 103, "output", 0, "nan", "nan", nan=4),
    ])
    report = mindguard.analyze_dump(tmp_path, progress=False)
    assert report.origin_rank == 0 and report.origin["op_type"] == "Log", (report.origin_rank, report.origin)
    per_rank = {r.rank: r.origin for r in report.ranks}
    assert per_rank[1]["op_type"] == "AllReduce" and per_rank[1]["received"], per_rank[1]
    assert not per_rank[0]["received"], per_rank[0]
    assert [r["rank"] for r in report.to_dict()["ranks"]] == [0, 1], report.to_dict()["ranks"]
    only_one = mindguard.analyze_dump(tmp_path, rank=1, progress=False)
    assert only_one.rank == 1 and only_one.origin["received"], only_one.origin


def test_cli_analyze_json_and_exit_status(dumps, capsys, tmp_path):
    from mindguard.cli import main

    code = main(["analyze", str(dumps["norm"][0]), "--iteration", "10", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1 and data["origin"]["op_type"] == "SqrtGrad", (code, data["origin"])
    code = main(["analyze", str(dumps["norm"][0]), "--iteration", "2"])
    assert code == 2 and "dumped iterations: 10-11" in capsys.readouterr().err, code
    png = tmp_path / "profile.png"
    code = main(["analyze", str(dumps["log"][0]), "--plot", str(png)])
    out, err = capsys.readouterr()
    assert code == 1 and "Log (forward)" in out, (code, out)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "--plot needs matplotlib" in err and not png.exists(), err
    else:
        assert png.stat().st_size > 0 and "plot written" in err, err


def test_cli_analyze_reports_an_unwritable_plot_path_without_a_traceback(dumps, capsys, tmp_path):
    from mindguard.cli import main

    regular_file = tmp_path / "notes.txt"
    regular_file.write_text("user data\n")
    under_a_file = regular_file / "profile.png"
    code = main(["analyze", str(dumps["log"][0]), "--plot", str(under_a_file)])
    out, err = capsys.readouterr()
    assert code == 2 and f"mindguard analyze: cannot write plot {under_a_file}: Not a directory ({regular_file})" \
        in err, (code, err)
    assert "Traceback" not in err and out == "", (out, err)
    assert regular_file.read_text() == "user data\n", regular_file.read_text()
    code = main(["analyze", str(dumps["log"][0]), "--plot", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and f"cannot write plot {tmp_path}: is a directory" in err, (code, err)


def test_bad_iteration_or_rank_types_are_refused_before_reading(tmp_path):
    for kwargs in ({"iteration": True}, {"iteration": -1}, {"iteration": "3"}, {"rank": False}, {"rank": -2},
                   {"rank": 1.0}):
        name = next(iter(kwargs))
        with pytest.raises(ValueError, match=rf"{name}={kwargs[name]!r}: must be .*int >= 0, not a bool"):
            mindguard.analyze_dump(tmp_path / "not-even-there", **kwargs)


def test_ranges_are_written_as_runs():
    from mindguard._util.ranges import format_ranges
    from mindguard.dump import normalize_iteration

    assert format_ranges([8, 0, 5, 6, 7, 5]) == "0|5-8", format_ranges([8, 0, 5, 6, 7, 5])
    assert format_ranges([10, 11, 13], ", ") == "10-11, 13", format_ranges([10, 11, 13], ", ")
    assert format_ranges([]) == "" and format_ranges([4]) == "4", (format_ranges([]), format_ranges([4]))
    assert normalize_iteration([3, 1, 2, 9]) == "1-3|9", normalize_iteration([3, 1, 2, 9])


def test_file_name_parsing_with_and_without_dtype():
    with_dtype = "MatMul.Default_net_fc1-Dense_MatMul-op0.0.0.1795945496143779.output.0.DefaultFormat.Float32.npy"
    without = "MatMul.Default_net_fc1-Dense_MatMul-op0.0.0.1795945496143779.input.1.DefaultFormat.npy"
    assert parse_tensor_name(with_dtype)[:8] == ("MatMul", "Default_net_fc1-Dense_MatMul-op0", "0", "0",
                                                 1795945496143779, "output", 0, "DefaultFormat")
    assert parse_tensor_name(with_dtype)[8] == "Float32" and parse_tensor_name(without)[8] is None
    assert parse_tensor_name("Parameter.head_bias.0.0.17.output.0.DefaultFormat.Float32.npy")[1] == "head_bias"
    assert parse_tensor_name("junk.npy") is None and parse_tensor_name("notes.txt") is None
