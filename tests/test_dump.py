"""DumpConfig / enable_dump / DumpOnDemand against real MindSpore (CPU).

MindSpore reads MINDSPORE_DUMP_CONFIG once per process at the first graph compile, so every test that
needs MindSpore to actually dump runs a fresh child process (``run_py``); validation tests run in-process.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

import mindguard as mg
from mindguard.dump import (DumpArmedTooLate, DumpNotWrittenError, compiled_graphs, enable_dump,
                            normalize_iteration)

# Shared child prelude: the norm-NaN demo net, a callback recording the batch fed at each 1-based
# global step, and a helper that lists the dump as {iteration: [file names]}.
PRELUDE = r'''
import json, os, sys, warnings
import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.train import Model, Callback
import mindguard as mg
from mindguard._util.io import load_npy
from mindguard.demos.norm_nan import build_network, make_dataset

ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

class Batches(Callback):
    def __init__(self):
        self.batches = {}
    def on_train_step_begin(self, run_context):
        p = run_context.original_args()
        self.batches[int(p.get("cur_step_num"))] = [t.asnumpy() for t in p.get("train_dataset_element")]

def train(callbacks, epochs=1, steps=2, poison_step=None):
    ms.set_seed(1); np.random.seed(1)
    net = build_network()
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
    rec = Batches()
    model.train(epochs, make_dataset(steps, poison_step=poison_step), callbacks=[rec, *callbacks],
                dataset_sink_mode=False)
    return rec

def dumped(root, net_name="Net"):
    """{"<graph>/<iteration>": sorted file names} under root/rank_0/<net_name>."""
    base = os.path.join(root, "rank_0", net_name)
    out = {}
    if os.path.isdir(base):
        for graph in sorted(os.listdir(base)):
            for it in sorted(os.listdir(os.path.join(base, graph))):
                out[graph + "/" + it] = sorted(os.listdir(os.path.join(base, graph, it)))
    return out

def top_level(path="."):
    return sorted(os.listdir(path))

def batch_file(directory):
    return [f for f in os.listdir(directory) if f.startswith("Parameter.inputs0.")][0]
'''


def _result(proc) -> dict:
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"child printed no RESULT line\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1][len("RESULT "):])


# ------------------------------------------------------------------------------ DumpOnDemand, real dumps
def test_dump_on_demand_dumps_exactly_the_requested_iteration(run_py, tmp_path):
    """2 epochs x 4 steps; dump iteration 5 = global step 6 (epoch 2, step 2); stop right after it."""
    code = PRELUDE + r'''
before = top_level()
env_before = os.environ.get("MINDSPORE_DUMP_CONFIG")
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cb = mg.dump.DumpOnDemand(5, path="dump")
    rec = train([cb], epochs=2, steps=4)
dumped_batch = load_npy(os.path.join(cb.dump_dir, batch_file(cb.dump_dir)))
print("RESULT " + json.dumps({
    "dirs": sorted(dumped("dump")), "dump_dir": str(cb.dump_dir), "steps": sorted(rec.batches),
    "matches": {s: bool(np.array_equal(dumped_batch, b[0])) for s, b in rec.batches.items()},
    "env_before": env_before, "env_after": os.environ.get("MINDSPORE_DUMP_CONFIG"),
    "new_entries": sorted(set(top_level()) - set(before)), "removed": sorted(set(before) - set(top_level())),
    "warnings": [f"{w.category.__name__}: {w.message}" for w in caught
                 if w.category is mg.dump.DumpArmedTooLate or "dump" in str(w.message).lower()],
}))
'''
    (tmp_path / "keep.txt").write_text("user file")
    res = _result(run_py(code, cwd=tmp_path))
    assert res["dirs"] == ["0/5"], res["dirs"]
    assert res["dump_dir"] == str(tmp_path / "dump" / "rank_0" / "Net" / "0" / "5"), res["dump_dir"]
    assert res["steps"] == [1, 2, 3, 4, 5, 6], f"stop_after should stop after global step 6: {res['steps']}"
    # the dumped batch is the one fed at global step 6, and only that one (so the check discriminates)
    assert [s for s, same in res["matches"].items() if same] == ["6"], res["matches"]
    assert res["env_before"] is None and res["env_after"] is None, (res["env_before"], res["env_after"])
    assert res["new_entries"] == ["dump", "dump.json"] and res["removed"] == [], res
    assert res["warnings"] == [], res["warnings"]
    assert (tmp_path / "keep.txt").read_text() == "user file"


def _write_record(path: Path, *, global_step: int, steps_per_epoch: int) -> None:
    """A FailureLocator record in the shared contract format (locate.py writes the same keys)."""
    record = {
        "schema": 1, "status": "failed", "kind": "nonfinite_params",
        "epoch": (global_step - 1) // steps_per_epoch + 1, "step_in_epoch": (global_step - 1) % steps_per_epoch + 1,
        "global_step": global_step, "dump_iteration": global_step - 1, "iteration_range": None,
        "steps_per_epoch": steps_per_epoch, "dataset_sink_mode": False, "sink_size": -1, "rank": 0,
        "group_size": 1, "device_target": "CPU", "mindspore_version": "2.10.0", "mindguard_version": mg.__version__,
        "seed": 1, "loss": 0.5, "nonfinite": ["embedding.embedding_table"], "message": "parameters became NaN",
        "time": "2026-01-01T00:00:00",
    }
    path.write_text(json.dumps(record))


def test_dump_on_demand_from_failure_record_dumps_the_failing_iteration(run_py, tmp_path):
    """The previous run's record says global step 3 failed (dump iteration 2); the poisoned batch is step 3's."""
    _write_record(tmp_path / "failure.json", global_step=3, steps_per_epoch=4)
    code = PRELUDE + r'''
cb = mg.dump.DumpOnDemand(record="failure.json", path="dump", stop_after=False)
rec = train([cb], epochs=1, steps=4, poison_step=3)
batch = load_npy(os.path.join(cb.dump_dir, batch_file(cb.dump_dir)))
nan_files = [f for f in os.listdir(cb.dump_dir)
             if np.issubdtype(load_npy(os.path.join(cb.dump_dir, f)).dtype, np.floating)
             and not np.isfinite(load_npy(os.path.join(cb.dump_dir, f))).all()]
print("RESULT " + json.dumps({"iteration": cb.iteration, "dirs": sorted(dumped("dump")), "steps": sorted(rec.batches),
                              "padded": bool((batch == 0).any()),
                              "same_as_step3": bool(np.array_equal(batch, rec.batches[3][0])),
                              "nonfinite_ops": sorted({f.split(".")[0] for f in nan_files})}))
'''
    res = _result(run_py(code, cwd=tmp_path))
    assert res["iteration"] == 2 and res["dirs"] == ["0/2"], res
    assert res["steps"] == [1, 2, 3, 4], f"stop_after=False must let training finish: {res['steps']}"
    assert res["padded"] and res["same_as_step3"], res
    assert "SqrtGrad" in res["nonfinite_ops"], \
        f"the failing step's dump should show the Inf/NaN gradient: {res['nonfinite_ops']}"


def test_arming_after_a_compile_is_reported_not_silently_ignored(run_py, tmp_path):
    """A GRAPH-mode forward call compiles a graph first: the dump is ignored by MindSpore, and we say so."""
    code = PRELUDE + r'''
from mindspore import Tensor
ms.set_seed(1); np.random.seed(1)
build_network()(Tensor(np.ones((4, 3), np.int32)))
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cb = mg.dump.DumpOnDemand(1, path="dump")
    try:
        train([cb], epochs=1, steps=3)
        error = None
    except mg.dump.DumpNotWrittenError as exc:
        error = str(exc)
print("RESULT " + json.dumps({"warned": [str(w.message) for w in caught if w.category is mg.dump.DumpArmedTooLate],
                              "error": error, "dirs": sorted(dumped("dump")),
                              "env_after": os.environ.get("MINDSPORE_DUMP_CONFIG")}))
'''
    res = _result(run_py(code, cwd=tmp_path))
    assert res["dirs"] == [], f"MindSpore dumped after all? {res['dirs']} (then the premise changed)"
    assert len(res["warned"]) == 1 and "will write nothing" in res["warned"][0], res["warned"]
    assert res["error"] and "Armed too late" in res["error"] and "dump iteration 1" in res["error"], res["error"]
    assert res["env_after"] is None, res["env_after"]


def test_dump_on_demand_in_pynative_dumps_only_the_compiled_optimizer_and_says_so(run_py, tmp_path):
    code = PRELUDE + r"""
ms.set_context(mode=ms.PYNATIVE_MODE)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cb = mg.dump.DumpOnDemand(1, path="dump")
    train([cb], epochs=1, steps=3)
print("RESULT " + json.dumps({"dirs": sorted(dumped("dump")), "dump_dir": str(cb.dump_dir),
                              "ops": sorted({f.split(".")[0] for f in os.listdir(cb.dump_dir)}),
                              "warned": [str(w.message) for w in caught if "PyNative" in str(w.message)]}))
"""
    res = _result(run_py(code, cwd=tmp_path))
    assert res["dirs"] == ["0/1"], res["dirs"]
    assert "SGD" in res["ops"] and "SqrtGrad" not in res["ops"], res["ops"]
    assert len(res["warned"]) == 1 and "optimizer" in res["warned"][0], res["warned"]


def test_compiled_graphs_sees_a_jit_function_and_enable_dump_warns(tmp_path):
    import mindspore as ms
    import numpy as np

    @ms.jit
    def double(x):
        return x * 2

    double(ms.Tensor(np.ones(2, np.float32)))
    assert compiled_graphs(), "a @jit call compiled a graph but compiled_graphs() saw none"
    config = mg.dump.DumpConfig(tmp_path / "d", iteration=0, device_target="CPU")
    with pytest.warns(DumpArmedTooLate, match="will write nothing"):
        armed = enable_dump(config)
    armed.restore()
    with pytest.raises(DumpNotWrittenError, match="first graph compile"):
        enable_dump(config, too_late="raise")


# ------------------------------------------------------------------------------ MindSpore accepts what we emit
VALID_CASES = {
    "op_types_inputs": (dict(kernels=["Sqrt", "MatMul"], input_output=1, iteration="0|1"),
                        {"iterations": ["0", "1"], "io": ["input"], "ops_subset": ["MatMul", "Sqrt", "SqrtGrad"],
                         "ops_include": ["MatMul", "Sqrt"]}),
    "regex_outputs": (dict(kernels=["name-regex(.*norm-Norm.*)"], input_output=2, iteration=[1]),
                      {"iterations": ["1"], "io": ["output"], "name_contains": "norm-Norm"}),
    "overflow_mode_cpu": (dict(op_debug_mode=3, iteration=0, net_name="My-Net_1"),
                          {"iterations": ["0"], "io": ["input", "output"], "ops_include": ["Parameter", "SqrtGrad"]}),
    "initial_iteration": (dict(initial_iteration=5, iteration="6-7", trans_flag=False, save_kernel_args=False,
                               sample_mode=0), {"iterations": ["6"], "io": ["input", "output"]}),
}


@pytest.mark.parametrize("case", sorted(VALID_CASES))
def test_valid_configs_are_accepted_and_honoured_by_mindspore(run_py, tmp_path, case):
    kwargs, expect = VALID_CASES[case]
    code = PRELUDE + r'''
kwargs = json.loads(sys.argv[1])
config = mg.dump.DumpConfig("dump", **kwargs)
with mg.dump.enable_dump(config, "cfg.json"):
    train([], epochs=1, steps=2)
files = dumped("dump", config.net_name)
names = [f for fs in files.values() for f in fs if f.endswith(".npy")]
print("RESULT " + json.dumps({"iterations": sorted({k.split("/")[1] for k in files}), "names": names,
                              "env_after": os.environ.get("MINDSPORE_DUMP_CONFIG")}))
'''
    res = _result(run_py(code, json.dumps(kwargs), cwd=tmp_path))
    names = res["names"]
    assert names, f"{case}: MindSpore wrote no files"
    assert res["iterations"] == expect["iterations"], (case, res["iterations"])
    non_param = [n for n in names if not n.startswith("Parameter.")]
    io = sorted({kind for n in non_param for kind in ("input", "output") if f".{kind}." in n})
    assert io == expect["io"], (case, io)
    ops = sorted({n.split(".")[0] for n in names})
    if "ops_subset" in expect:
        assert set(ops) <= set(expect["ops_subset"]), (case, ops)
    for op in expect.get("ops_include", []):
        assert op in ops, (case, op, ops)
    if "name_contains" in expect:
        assert all(expect["name_contains"] in n for n in names), \
            (case, [n for n in names if expect["name_contains"] not in n])
    assert res["env_after"] is None, res["env_after"]


# ------------------------------------------------------------------------------ validation (in-process)
INVALID = [
    # (kwargs, field, fragment of the rule)
    (dict(path="/tmp/with.dot"), "path", "found '.'"),
    (dict(path="/tmp/sp ace"), "path", "found ' '"),
    (dict(net_name="my net"), "net_name", "letters, digits"),
    (dict(net_name=""), "net_name", "non-empty"),
    (dict(iteration="1,2"), "iteration", "found ','"),
    (dict(iteration="5-"), "iteration", "neither N nor N-M"),
    (dict(iteration="8-5"), "iteration", "is empty"),
    (dict(iteration=-1), "iteration", "cannot be negative"),
    (dict(iteration=[]), "iteration", "at least one"),
    (dict(iteration="ALL"), "iteration", 'exact lowercase "all"'),
    (dict(input_output=3), "input_output", "must be 0"),
    (dict(kernels=["Sqrt", "Sqrt"]), "kernels", "listed twice"),
    (dict(kernels=["name-regex(.*[)"]), "kernels", "does not compile"),
    (dict(kernels=["name-regex(.*Sqrt"]), "kernels", "name-regex(<regex>)"),
    (dict(kernels=["name-regex(.*\\d)"]), "kernels", "backslash doubled"),
    (dict(kernels=["Sq rt"]), "kernels", "strips spaces"),
    (dict(kernels=[""]), "kernels", "non-empty string"),
    (dict(kernels=["Sqrt"], dump_mode=0), "dump_mode", "ignores kernels"),
    (dict(dump_mode=1), "dump_mode", "without kernels"),
    (dict(dump_mode=2), "dump_mode", "Ascend-only"),
    (dict(dump_mode=3), "dump_mode", "must be 0"),
    (dict(op_debug_mode=5), "op_debug_mode", "must be 0, 3 or 4"),
    (dict(op_debug_mode=4), "op_debug_mode", "Ascend-only"),
    (dict(op_debug_mode=3, kernels=["Sqrt"]), "kernels", "ignores kernels"),
    (dict(op_debug_mode=3, input_output=1), "input_output", "forces input_output to 0"),
    (dict(overflow_number=3), "overflow_number", "only with op_debug_mode=3"),
    (dict(op_debug_mode=3, overflow_number=-1), "overflow_number", "non-negative int"),
    (dict(saved_data="statistic"), "saved_data", "on CPU it accepts only 'tensor'"),
    (dict(saved_data="full"), "saved_data", "on CPU it accepts only 'tensor'"),
    (dict(saved_data="stats", device_target="GPU"), "saved_data", "must be 'tensor'"),
    (dict(file_format="npy"), "file_format", "only on Ascend with jit_level O2"),
    (dict(file_format="npy", device_target="Ascend", jit_level="O0"), "file_format",
     "only on Ascend with jit_level O2"),
    (dict(file_format="txt", device_target="Ascend", jit_level="O2"), "file_format", "'npy' or 'bin'"),
    (dict(initial_iteration=-2), "initial_iteration", "non-negative int"),
    (dict(trans_flag="yes"), "trans_flag", "must be a bool"),
    (dict(statistic_category=["max"]), "statistic_category", "only with saved_data"),
    (dict(saved_data="statistic", statistic_category=["maximum"], device_target="GPU"), "statistic_category",
     "maximum"),
    (dict(saved_data="statistic", stat_calc_mode="device", statistic_category=["nan count"], device_target="Ascend",
          jit_level="O0"), "statistic_category", "nan count"),
    (dict(stat_calc_mode="device"), "stat_calc_mode", "only on Ascend"),
    (dict(stat_calc_mode="gpu"), "stat_calc_mode", "'host' or 'device'"),
    (dict(sample_mode=2), "sample_mode", "0 (whole tensor) or 1"),
    (dict(sample_num=10), "sample_num", "only with sample_mode=1"),
    (dict(sample_mode=1, sample_num=0), "sample_num", "positive int"),
    (dict(support_device=[0, 0]), "support_device", "distinct"),
    (dict(support_device=[], device_target="GPU"), "support_device", "disables dump"),
    (dict(device_target="TPU"), "device_target", "CPU, GPU or Ascend"),
]


@pytest.mark.parametrize("kwargs,field,rule", INVALID, ids=[f"{f}-{i}" for i, (_, f, _) in enumerate(INVALID)])
def test_invalid_settings_are_refused_naming_value_rule_and_fix(tmp_path, kwargs, field, rule):
    kwargs = dict(kwargs)
    path = kwargs.pop("path", str(tmp_path / "dump"))
    kwargs.setdefault("device_target", "CPU")
    with pytest.raises(mg.errors.DumpConfigError) as info:
        mg.dump.DumpConfig(path, **kwargs)
    err = info.value
    text = str(err)
    assert err.field == field, (err.field, text)
    assert rule in text, f"rule fragment {rule!r} missing from: {text}"
    assert repr(err.value) in text and "Fix:" in text and f"{field}=" in text, text
    assert isinstance(err, ValueError)


def test_relative_path_is_resolved_and_bad_path_gets_a_suggestion(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert mg.dump.DumpConfig("sub/dump", device_target="CPU").path == tmp_path / "sub" / "dump"
    with pytest.raises(mg.errors.DumpConfigError, match=r"use e\.g\. '.*/run_1_dump'"):
        mg.dump.DumpConfig("run.1 dump", device_target="CPU")


@pytest.mark.parametrize("given,expected", [("all", "all"), (7, "7"), ([8, 0, 5, 6, 7, 5], "0|5-8"),
                                            ("0|5-8|100", "0|5-8|100"), ((3,), "3")])
def test_iteration_forms_normalize_to_mindspore_strings(given, expected):
    assert normalize_iteration(given) == expected


def test_to_dict_is_the_exact_mindspore_json(tmp_path):
    cpu = mg.dump.DumpConfig(tmp_path / "d", "Net", 5, device_target="CPU")
    assert cpu.to_dict() == {
        "common_dump_settings": {"dump_mode": 0, "path": str(tmp_path / "d"), "net_name": "Net", "iteration": "5",
                                 "saved_data": "tensor", "input_output": 0, "kernels": [],
                                 "support_device": [0, 1, 2, 3, 4, 5, 6, 7], "op_debug_mode": 0},
        "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    ascend = mg.dump.DumpConfig(tmp_path / "d", op_debug_mode=2, overflow_number=1, saved_data="statistic",
                           statistic_category=["max", "nan count"], device_target="ascend", jit_level="O1")
    common = ascend.to_dict()["common_dump_settings"]
    assert (common["op_debug_mode"], common["overflow_number"], common["statistic_category"]) == \
        (3, 1, ["max", "nan count"])
    assert ascend.to_dict()["e2e_dump_settings"]["enable"] is True
    kernels = mg.dump.DumpConfig(tmp_path / "d", kernels="Sqrt", device_target="CPU").to_dict()["common_dump_settings"]
    assert (kernels["dump_mode"], kernels["kernels"]) == (1, ["Sqrt"])


def test_ascend_o2_warns_and_points_at_msprobe(tmp_path):
    with pytest.warns(UserWarning, match="msprobe"):
        cfg = mg.dump.DumpConfig(tmp_path / "d", device_target="Ascend", jit_level="O2", file_format="npy")
    assert "e2e_dump_settings" not in cfg.to_dict() and cfg.to_dict()["common_dump_settings"]["file_format"] == "npy"


def test_non_empty_dump_dir_is_refused_unless_overwrite(tmp_path):
    old = tmp_path / "dump" / "rank_0" / "Net" / "0" / "3"
    old.mkdir(parents=True)
    (old / "x.npy").write_bytes(b"old")
    (tmp_path / "dump" / "notes.txt").write_text("mine")
    with pytest.raises(mg.errors.DumpConfigError, match="not empty.*notes.txt, rank_0"):
        mg.dump.DumpConfig(tmp_path / "dump", device_target="CPU")
    config = mg.dump.DumpConfig(tmp_path / "dump", device_target="CPU", overwrite=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DumpArmedTooLate)  # this pytest process may have compiled graphs
        with enable_dump(config):
            pass
    assert not (tmp_path / "dump" / "rank_0").exists(), "overwrite=True should clear this rank's old dump"
    assert (tmp_path / "dump" / "notes.txt").read_text() == "mine", "overwrite must not touch other files"


def test_enable_dump_writes_json_restores_env_and_refuses_bad_json_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("MINDSPORE_DUMP_CONFIG", "/previous/dump.json")
    config = mg.dump.DumpConfig(tmp_path / "dump", iteration=[2, 3], device_target="CPU")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DumpArmedTooLate)
        with enable_dump(config) as armed:
            assert isinstance(armed, Path) and armed == tmp_path / "dump.json", armed
            assert os.environ["MINDSPORE_DUMP_CONFIG"] == str(armed)
            assert json.loads(armed.read_text()) == config.to_dict()
        assert os.environ["MINDSPORE_DUMP_CONFIG"] == "/previous/dump.json"
        with pytest.raises(mg.errors.DumpConfigError, match="inside the dump directory"):
            enable_dump(config, tmp_path / "dump" / "cfg.json")
        (tmp_path / "other.json").write_text('{"mine": 1}')
        with pytest.raises(mg.errors.DumpConfigError, match="already exists with other content"):
            enable_dump(config, tmp_path / "other.json")
    assert json.loads((tmp_path / "other.json").read_text()) == {"mine": 1}
    assert os.environ["MINDSPORE_DUMP_CONFIG"] == "/previous/dump.json"


def test_dump_on_demand_needs_an_iteration_or_a_record(tmp_path):
    with pytest.raises(mg.errors.DumpConfigError, match="no iteration given and no failure record"):
        mg.dump.DumpOnDemand(record=tmp_path / "missing.json", path=tmp_path / "d")
    (tmp_path / "running.json").write_text(json.dumps({"schema": 1, "status": "running", "dump_iteration": None}))
    with pytest.raises(mg.errors.DumpConfigError, match="names no step .status .running."):
        mg.dump.DumpOnDemand(record=tmp_path / "running.json", path=tmp_path / "d")
    with pytest.raises(mg.errors.DumpConfigError, match="non-negative int"):
        mg.dump.DumpOnDemand(-1, path=tmp_path / "d")
    _write_record(tmp_path / "failure.json", global_step=11, steps_per_epoch=8)
    assert mg.dump.DumpOnDemand(record=tmp_path / "failure.json", path=tmp_path / "d").iteration == 10


def test_cli_dump_config_writes_validated_json(tmp_path, capsys):
    from mindguard.cli import build_parser

    out = tmp_path / "dump.json"
    args = build_parser().parse_args(["dump-config", "--path", str(tmp_path / "d"), "--iteration", "0|5-8",
                                      "--kernels", "Sqrt", "name-regex(.*Norm.*)", "--input-output", "2",
                                      "--device-target", "CPU", "-o", str(out)])
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert f"export MINDSPORE_DUMP_CONFIG={out}" in printed, printed
    common = json.loads(out.read_text())["common_dump_settings"]
    assert (common["iteration"], common["dump_mode"], common["kernels"], common["input_output"]) == \
        ("0|5-8", 1, ["Sqrt", "name-regex(.*Norm.*)"], 2)
    bad = build_parser().parse_args(["dump-config", "--path", str(tmp_path / "d"), "--iteration", "5",
                                     "--saved-data", "statistic", "--device-target", "CPU",
                                     "-o", str(tmp_path / "b.json")])
    assert bad.func(bad) == 2
    assert "saved_data='statistic'" in capsys.readouterr().err
    assert not (tmp_path / "b.json").exists()


def test_a_record_of_a_run_that_did_not_fail_names_no_step_to_dump(tmp_path):
    """A "finished" record's dump_iteration is only the last step: DumpOnDemand and StepCapture refuse it."""
    from mindguard.protocol.record import FailureRecord

    finished = FailureRecord(status="finished", epoch=3, step_in_epoch=8, global_step=24, dump_iteration=23,
                             steps_per_epoch=8).save(tmp_path / "failure.json")
    with pytest.raises(mg.errors.DumpConfigError, match="finished without a failure"):
        mg.dump.DumpOnDemand(record=str(finished), path=str(tmp_path / "dump"))
    capture = mg.capture.StepCapture(record=str(finished), directory=str(tmp_path / "capture"))
    with pytest.raises(ValueError, match="finished without a failure"):
        capture._step_from_record(0, 1)  # pylint: disable=protected-access
