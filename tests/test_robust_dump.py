"""DumpConfig against MindSpore's own parser: what MindSpore does with odd iteration strings, names and kernels
(measured in real child processes on CPU), and a property test of mindguard's iteration parsing against an
independent reference written from those measurements."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import mindguard as mg
from mindguard.dump import normalize_iteration
from mindguard.errors import DumpConfigError


U32, U64 = 2 ** 32 - 1, 2 ** 64 - 1


# --------------------------------------------------------------------------- MindSpore's parser, as measured
def mindspore_ranges(text: str) -> Optional[List[Tuple[int, int]]]:
    """What MindSpore 2.10 (CPU) does with a dump config's "iteration" string: ``None`` when it refuses the
    config at the first compile, else the inclusive ranges it dumps (merged, sorted; ``[]``: nothing ever).

    Measured (tests below pin each): anything but ASCII 0-9, '-', '|' -> RuntimeError ("iteration only
    supports digits..."; "", "ALL", "1,2", "²", "３", " 1"); parts split on '|', empty parts skipped
    ("|1||3|"); a part is N or N-M with leading zeros read as decimal ("010" is 10); "5-", "-5", "1-2-3",
    "1--3", "3-1" match nothing; a number above 2**64-1 logs "Out of Range error: stoul" and its part matches
    nothing. ("all" is handled before this function.)
    """
    if not text or set(text) - set("0123456789|-"):
        return None
    found = []
    for part in text.split("|"):
        if not part:
            continue
        if "-" in part:
            low, _, high = part.partition("-")
            if not low or not high or "-" in high:
                continue
            lo, hi = int(low), int(high)
            if lo <= U64 and hi <= U64 and lo <= hi:
                found.append((lo, hi))
        elif int(part) <= U64:
            found.append((int(part), int(part)))
    return merge(found)


def merge(ranges: List[Tuple[int, int]]) -> List[Tuple[int, int]]:
    out: List[Tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(hi, out[-1][1]))
        else:
            out.append((lo, hi))
    return out


def mindguard_should_accept(text: str) -> bool:
    """mindguard's rule on top of MindSpore's: accept only when MindSpore accepts the string, it selects
    something, and every non-empty part selects what it says within the 32-bit iteration counter (MindSpore's
    counter wraps at 2**32: initial_iteration 4294967295 is followed by iteration 0, measured below)."""
    if text == "all":
        return True
    if mindspore_ranges(text) is None:
        return False
    parts = [p for p in text.split("|") if p]
    if not parts:
        return False
    for part in parts:
        bounds = part.split("-")
        if len(bounds) > 2 or not all(bounds) or any(int(b) > U32 for b in bounds) or int(bounds[0]) > int(bounds[-1]):
            return False
    return True


numbers = st.one_of(st.integers(0, 20), st.sampled_from([U32 - 1, U32, U32 + 1, U64, U64 + 1, 10 ** 25]))
zeros = st.text(alphabet="0", max_size=3)
number_text = st.builds(lambda z, n: z + str(n), zeros, numbers)
part = st.one_of(number_text, st.builds(lambda a, b: f"{a}-{b}", number_text, number_text), st.just(""),
                 st.sampled_from(["-", "5-", "-5", "1-2-3", "1--3"]))
structured = st.builds("|".join, st.lists(part, min_size=1, max_size=5))
raw = st.text(alphabet="0123456789|-", max_size=24)
odd = st.builds(lambda a, c, b: a + c + b, raw, st.sampled_from(["a", " ", ",", "²", "３", "٣", "+", "\n", "ALL"]), raw)


@settings(max_examples=600, deadline=None)
@given(st.one_of(structured, raw, odd, st.sampled_from(["all", "ALL", " all", "All", ""])))
def test_iteration_strings_are_read_as_mindspore_reads_them(text):
    try:
        normalized = normalize_iteration(text)
    except DumpConfigError as exc:
        assert not mindguard_should_accept(text), f"{text!r} refused: {exc}"
        assert exc.field == "iteration" and "Fix:" in str(exc)
        return
    assert mindguard_should_accept(text), f"{text!r} accepted as {normalized!r}"
    if text == "all":
        assert normalized == "all"
        return
    # the normalised string selects exactly what MindSpore would have dumped for the original
    assert mindspore_ranges(normalized) == mindspore_ranges(text), (text, normalized)
    assert normalize_iteration(normalized) == normalized, "normalising twice changes it"
    assert all(p and (p == "0" or not p.startswith("0")) for seg in normalized.split("|") for p in seg.split("-"))


@settings(max_examples=200, deadline=None)
@given(st.one_of(st.integers(-5, 30), st.sampled_from([U32, U32 + 1, U64 + 1]),
                 st.lists(st.integers(0, 40), max_size=6)))
def test_int_and_list_iterations_agree_with_the_string_rule(value):
    values = value if isinstance(value, list) else [value]
    ok = bool(values) and all(0 <= v <= U32 for v in values)
    try:
        normalized = normalize_iteration(value)
    except DumpConfigError:
        assert not ok, value
        return
    assert ok, value
    assert mindspore_ranges(normalized) == merge([(v, v) for v in values])


@pytest.mark.parametrize("text,expected", [("1||2", "1-2"), ("|1", "1"), ("1|", "1"), ("007", "7"), ("3-3", "3"),
                                           ("2-4|3-5", "2-5"), ("0|5-8|100", "0|5-8|100"), (str(U32), str(U32))])
def test_forms_mindspore_accepts_are_normalised(text, expected):
    assert normalize_iteration(text) == expected


@pytest.mark.parametrize("text,rule", [
    ("18446744073709551616", "above 2**64 - 1"), ("1|99999999999999999999999", "above 2**64 - 1"),
    ("4294967296", "32 bits"), ("1-4294967296", "32 bits"), ("9" * 5000, "above 2**64 - 1"),
    ("²", "ASCII digits"), ("３", "ASCII digits"), ("", "must not be empty"), ("|", "names no iteration"),
    ("||", "names no iteration"), ("1-2-3", "neither N nor N-M"), ("-5", "neither N nor N-M")])
def test_forms_mindspore_ignores_or_refuses_are_refused_with_the_reason(text, rule):
    with pytest.raises(DumpConfigError, match="Fix:") as info:
        normalize_iteration(text)
    assert rule in str(info.value) and info.value.field == "iteration", str(info.value)[:300]


# --------------------------------------------------------------------------- other fields, in-process
def test_names_mindspore_cannot_create_are_refused(tmp_path):
    long = "a" * 256
    cases = [
        (dict(path=tmp_path / long), "path", "at most 255"),
        (dict(path=tmp_path / "/".join(["p" * 250] * 16)), "path", "path limit"),
        (dict(net_name="N" * 256), "net_name", "File name too long"),
        (dict(initial_iteration=2 ** 32), "initial_iteration", "32 bits"),
    ]
    (tmp_path / "plain").write_text("x")
    cases.append((dict(path=tmp_path / "plain" / "dump"), "path", "is a file, not a directory"))
    for kwargs, field, rule in cases:
        kwargs = dict(kwargs)
        path = kwargs.pop("path", tmp_path / "dump")
        with pytest.raises(DumpConfigError) as info:
            mg.dump.DumpConfig(path, device_target="CPU", **kwargs)
        assert info.value.field == field and rule in str(info.value), (kwargs.keys(), str(info.value)[-300:])
    assert mg.dump.DumpConfig(tmp_path / "ok", "N" * 255, device_target="CPU").net_name == "N" * 255
    assert mg.dump.DumpConfig(tmp_path / "ok", initial_iteration=U32, device_target="CPU").initial_iteration == U32


@pytest.mark.parametrize("entry,rule,fix", [
    ("Dense", "runs as MatMul and BiasAdd on CPU", "['MatMul', 'BiasAdd']"),
    ("dense", "runs as MatMul and BiasAdd on CPU", "name-regex(.*-Dense/.*)"),
    ("Norm", "names the cell mindspore.nn.Norm, not an operator type", "name-regex(.*-Norm/.*)"),
    ("Embedding", "names the cell mindspore.nn.Embedding", "name-regex(.*-Embedding/.*)"),
])
def test_kernel_entries_naming_a_cell_are_refused(tmp_path, entry, rule, fix):
    with pytest.raises(DumpConfigError) as info:
        mg.dump.DumpConfig(tmp_path / "d", kernels=[entry], device_target="CPU")
    assert info.value.field == "kernels" and rule in str(info.value) and fix in str(info.value), str(info.value)


@pytest.mark.parametrize("entry", ["MatMul", "matmul", "Mat", "LayerNorm", "Conv2d", "Softmax", "SqrtGrad",
                                   "name-regex(.*-Norm/.*)", "Default/net/fc-Dense/MatMul-op0"])
def test_operator_types_and_names_are_kept(tmp_path, entry):
    assert mg.dump.DumpConfig(tmp_path / "d", kernels=[entry], device_target="CPU").kernels == [entry]


def test_dense_is_kept_where_it_was_not_measured(tmp_path):
    """Only CPU was measured: on GPU/Ascend a Dense kernel may exist, so the entry is left to MindSpore."""
    assert mg.dump.DumpConfig(tmp_path / "d", kernels=["Dense"], device_target="GPU").kernels == ["Dense"]


# --------------------------------------------------------------------------- real MindSpore, child processes
CHILD = r'''
import json, os, sys
import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.train import Model
from mindguard.demos.norm_nan import build_network, make_dataset

spec = json.loads(sys.argv[1])
if spec.get("mindguard"):          # the config mindguard writes for these arguments
    import mindguard as mg
    config = mg.dump.DumpConfig("dump", device_target="CPU", **spec["mindguard"])
    common = config.to_dict()["common_dump_settings"]
    document = config.to_dict()
else:                              # a raw config, past mindguard's checks: what MindSpore itself does
    common = {"dump_mode": 0, "path": os.path.abspath("dump"), "net_name": "Net", "iteration": "all",
              "saved_data": "tensor", "input_output": 0, "kernels": [], "support_device": [0], "op_debug_mode": 0}
    common.update(spec["raw"])
    document = {"common_dump_settings": common, "e2e_dump_settings": {"enable": True, "trans_flag": True}}
with open("cfg.json", "w") as f:
    json.dump(document, f)
os.environ["MINDSPORE_DUMP_CONFIG"] = os.path.abspath("cfg.json")
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
ms.set_seed(1); np.random.seed(1)
net = build_network()
model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
error = None
try:
    model.train(1, make_dataset(spec.get("steps", 6)), dataset_sink_mode=False)
except RuntimeError as exc:
    error = str(exc).splitlines()[0]
found = {}
base = os.path.join(common["path"], "rank_0")
for root, dirs, files in os.walk(base):
    rel = os.path.relpath(root, base).split(os.sep)
    if len(rel) == 3 and rel[0] == common["net_name"] and any(f.endswith(".npy") for f in files):
        found[rel[2]] = sorted({f.split(".")[0] for f in files if f.endswith(".npy")})
print("RESULT " + json.dumps({"iterations": sorted(map(int, found)),
                              "ops": sorted({o for v in found.values() for o in v}), "error": error}))
'''

MEASURED: Dict[str, Tuple[dict, dict]] = {
    # name: (spec, expected {"iterations": [...], optional "log": fragment, "error": fragment, "ops_subset": [...]})
    # one child per config (MindSpore reads the config once, at the first compile); a config combines forms whose
    # effects stay apart in what it dumps: a leading, a doubled and a trailing bar; parts that match nothing around
    # a number above 2**64-1 (its part matches nothing, the parts after it still count)
    "empty_parts": ({"raw": {"iteration": "|1||3|"}}, {"iterations": [1, 3]}),
    "dead_parts_and_above_uint64": ({"raw": {"iteration": "5-|-5|1-2-3|3-1|1-|1|18446744073709551616|4"}},
                                    {"iterations": [1, 4], "log": "Out of Range error: stoul"}),
    "leading_zeros_decimal": ({"raw": {"iteration": "010|02"}, "steps": 12}, {"iterations": [2, 10]}),
    "not_ascii": ({"raw": {"iteration": "\u00b2"}}, {"iterations": [], "error": "iteration only supports digits"}),
    "net_name_256": ({"raw": {"iteration": "1", "net_name": "N" * 256}},
                     {"iterations": [], "log": "File name too long"}),
    "net_name_255": ({"raw": {"iteration": "1", "net_name": "N" * 255}}, {"iterations": [1]}),
    "kernels_dense_and_norm": ({"raw": {"iteration": "1", "dump_mode": 1, "kernels": ["Dense", "Norm"]}},
                               {"iterations": [], "log": ["Unused Kernel in json: Dense",
                                                          "Unused Kernel in json: Norm"]}),
    "initial_iteration_32_bits": ({"raw": {"iteration": "all", "initial_iteration": 4294967295}, "steps": 3},
                                  {"iterations": [0, 1, 4294967295]}),
    # what mindguard writes instead: the normalised string dumps the same iterations; the suggested fixes dump
    "mindguard_normalised": ({"mindguard": {"iteration": "|1||3-3|"}}, {"iterations": [1, 3]}),
    "fix_for_norm": ({"mindguard": {"iteration": 1, "kernels": ["name-regex(.*-Norm/.*)"]}},
                     {"iterations": [1], "ops_include": ["Sqrt", "SqrtGrad"]}),
    "fix_for_dense": ({"mindguard": {"iteration": 1, "kernels": ["MatMul", "BiasAdd"]}},
                      {"iterations": [1], "ops_subset": ["BiasAdd", "BiasAddGrad", "MatMul"]}),
}


def _run_children(specs: Dict[str, dict], parallel: int = 2) -> Dict[str, Tuple[dict, str]]:
    """Run one child per spec (at most ``parallel`` at once); {name: (RESULT dict, stderr)}."""
    env = dict(os.environ, GLOG_v="2")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    results: Dict[str, Tuple[dict, str]] = {}
    with tempfile.TemporaryDirectory(prefix="mindguard_robust_") as scratch:
        script = Path(scratch) / "child.py"
        script.write_text(CHILD)
        pending = list(specs.items())
        running: List[Tuple[str, subprocess.Popen]] = []
        while pending or running:
            while pending and len(running) < parallel:
                name, spec = pending.pop(0)
                cwd = Path(scratch) / name
                cwd.mkdir()
                running.append((name, subprocess.Popen([sys.executable, str(script), json.dumps(spec)], cwd=cwd,
                                                       env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                                       text=True)))
            name, proc = running.pop(0)
            out, err = proc.communicate(timeout=300)
            lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
            assert lines, f"{name}: child exited {proc.returncode} without RESULT\n{out[-2000:]}\n{err[-3000:]}"
            results[name] = (json.loads(lines[-1][len("RESULT "):]), err)
    return results


@pytest.mark.slow
def test_mindspore_parser_behaviour_and_mindguard_configs_on_cpu():
    """The measurements the rules above stand on, re-run against the installed MindSpore."""
    results = _run_children({name: spec for name, (spec, _) in MEASURED.items()})
    failures = []
    for name, (_, expect) in MEASURED.items():
        got, err = results[name]
        if got["iterations"] != expect["iterations"]:
            failures.append(f"{name}: dumped {got['iterations']}, expected {expect['iterations']}")
        logs = [expect["log"]] if isinstance(expect.get("log"), str) else expect.get("log", [])
        for fragment in logs:
            if fragment not in err:
                failures.append(f"{name}: MindSpore did not log {fragment!r}")
        if "error" in expect and expect["error"] not in (got["error"] or ""):
            failures.append(f"{name}: error {got['error']!r}, expected {expect['error']!r}")
        if "error" not in expect and got["error"]:
            failures.append(f"{name}: unexpected error {got['error']!r}")
        if "ops_subset" in expect and not set(got["ops"]) <= set(expect["ops_subset"]):
            failures.append(f"{name}: ops {got['ops']} not within {expect['ops_subset']}")
        if not all(op in got["ops"] for op in expect.get("ops_include", [])):
            failures.append(f"{name}: ops {got['ops']} lack {expect['ops_include']}")
    assert not failures, "\n".join(failures)
    # and the reference agrees with every raw iteration string measured here (configs changing only it)
    for name, (spec, expect) in MEASURED.items():
        text = spec.get("raw", {}).get("iteration")
        if text and text != "all" and set(spec["raw"]) == {"iteration"}:
            ranges = mindspore_ranges(text)
            selected = [] if ranges is None else [i for lo, hi in ranges for i in range(lo, min(hi, 20) + 1)]
            assert selected == expect["iterations"], (name, text, selected)
