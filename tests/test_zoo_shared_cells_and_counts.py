"""Hints that rest on the facts the failure carries (a count divisor, an index past its table, a kernel's own
message, the fp16 range only in half precision) and the call site of a shared cell from the data flow (shared
embeddings, twin networks). Added for issue 43.

The hunts (marked ``slow``) run ``mindguard hunt`` on the scripts of ``tests/zoo/`` in real subprocesses and check
exit code, global step, op, line and hint; the script's ``--fix`` applies the printed fix and is hunted again to show
it trains finite. The fast tests pin the rules behind them on statistics and .ir structures alone.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from hunting import check_outcome as check, explain, hunt_zoo as hunt, line_of, run_hunt, summary_of
from mindguard.analysis.callsite import shared_call_sites
from mindguard.analysis.counts import count_origin
from mindguard.analysis.hints import hint_for, stop_hint
from mindguard.analysis.stats import tensor_stats
from mindguard.analysis.trace import Frame, GraphTrace, NodeTrace, TensorType

ZOO = REPO / "tests" / "zoo"


def _slot(slot, array, **extra):
    return {"slot": slot, **tensor_stats(np.asarray(array)), **extra}


# -- rules (fast) ---------------------------------------------------------------------------------------------

def _count_graph():
    """``Div(loss, ReduceSum(Cast(num_matched_boxes: int32)))`` as the .ir reader builds it."""
    cast = NodeTrace("Default/Cast-op2", "Cast", input_params={0: "args3"},
                     input_types={0: TensorType("int32", [2])})
    total = NodeTrace("Default/ReduceSum-op3", "ReduceSum", input_nodes={0: cast},
                      input_types={0: TensorType("float32", [2])})
    div = NodeTrace("Default/Div-op0", "Div", input_nodes={1: total},
                    input_types={0: TensorType("float32", [2]), 1: TensorType("float32", [])})
    return div, {"args3": TensorType("int32", [2])}


@pytest.mark.fast
def test_a_count_is_recognised_from_the_data_flow_and_a_float_is_not():
    div, params = _count_graph()
    assert count_origin(div, 1, params) == "ReduceSum of Cast of int32 values"
    norm = NodeTrace("Default/Sqrt-op1", "Sqrt", input_types={0: TensorType("float32", [2])})
    ratio = NodeTrace("Default/Div-op4", "Div", input_nodes={1: norm})
    assert count_origin(ratio, 1, params) is None
    mask = NodeTrace("Default/Less-op5", "Less")
    valid = NodeTrace("Default/ReduceSum-op6", "ReduceSum", input_nodes={0: NodeTrace("c", "Cast",
                                                                                          input_nodes={0: mask})})
    assert "Less" in count_origin(NodeTrace("d", "RealDiv", input_nodes={1: valid}), 1, params)
    copied = NodeTrace("Default/TensorMove-op7", "TensorMove", input_nodes={0: div.input_nodes[1]})
    assert count_origin(NodeTrace("e", "Div", input_nodes={1: copied}), 1, params) == \
        "ReduceSum of Cast of int32 values"   # a copy passes the count through


@pytest.mark.fast
def test_a_count_divisor_gets_clamp_to_one_never_an_epsilon():
    code = "return ops.reduce_sum((loss_cls + loss_loc) / num_matched_boxes)"
    inputs = [_slot(0, np.array([6.19, 6.2], np.float32)),
              _slot(1, np.array(0.0, np.float32), count="ReduceSum of Cast of int32 values")]
    out = [tensor_stats(np.array([np.inf, np.inf], np.float32))]
    hint = hint_for("Div", inputs, out, direction="forward", source_code=code)
    assert "divides by a count that is 0" in hint and "ReduceSum of Cast of int32 values" in hint, hint
    assert "fix:    return ops.reduce_sum((loss_cls + loss_loc) / ops.maximum(num_matched_boxes, 1))" in hint, hint
    assert "(b + 1e-6)" not in hint and "An epsilon is wrong for a count" in hint and "6e+06" in hint, hint
    # no data flow (the eager replay): the line names a count and the values are whole numbers
    plain = [_slot(0, np.array([6.19, 6.2], np.float32)), _slot(1, np.array(0.0, np.float32))]
    named = hint_for("RealDiv", plain, out, direction="forward", source_code="loss = total / n_valid")
    assert "ops.maximum(n_valid, 1)" in named and "(b + 1e-6)" not in named, named
    torch = hint_for("RealDiv", plain, out, direction="forward", source_code="loss = F.l1_loss(a, b) / num_pos")
    assert "torch.clamp(num_pos, min=1)" in torch, torch
    # a float divisor that is not a count still gets the epsilon
    std = hint_for("RealDiv", plain, out, direction="forward", source_code="z = (x - mean) / std")
    assert "(b + 1e-6)" in std and "count" not in std, std


@pytest.mark.fast
def test_an_index_hint_takes_the_numbers_of_the_kernels_own_message():
    message = ("RuntimeError: For 'Gather', the 'input_indices' should be in the range [0, 10000), but got 10007, "
               "error_code[58]")
    inputs = [{"slot": 0, "shape": [10000, 1], "dtype": "float32", "parameter": "wide_w"},
              {"slot": 1, "shape": [8, 6], "dtype": "int32", "not_dumped": True}]
    hint = stop_hint("Gather", inputs, direction="forward", message=message,
                     source_code="wide_id_weight = self.wide_gatherv2(self.wide_w, id_hldr, 0)")
    assert "index 10007" in hint and "10000 rows of `wide_w`" in hint, hint
    assert "ops.clip_by_value(indices, 0, 9999)" in hint and "check their shapes" not in hint, hint
    generic = stop_hint("Gather", inputs, direction="forward")
    assert "check their shapes" in generic, generic   # without the message nothing more is known
    other = stop_hint("Gather", inputs, direction="forward",
                      message="For 'OneHot', depth should be in range [0, 5), but got 9")
    assert "10007" not in other and "check their shapes" in other, other


@pytest.mark.fast
def test_a_shared_cells_call_site_comes_from_the_graph_input_that_feeds_the_kernel(tmp_path):
    source = tmp_path / "model.py"
    source.write_text("class M:\n"
                      "    def construct(self, source_ids, target_ids):\n"
                      "        src, table = self.lookup(source_ids)\n"
                      "        enc = self.encoder(src)\n"
                      "        tgt, _ = self.lookup(target_ids)\n"
                      "        return enc, tgt\n")
    trace = GraphTrace(graph_inputs={"source_ids", "target_ids"})
    scope = "Default/net-M/lookup-EmbeddingLookup"
    src = NodeTrace(f"{scope}/Gather-op1", "Gather", unique_id="7",
                    input_nodes={1: NodeTrace(f"{scope}/Reshape-op2", "Reshape", input_params={0: "source_ids"})})
    tgt = NodeTrace(f"{scope}/Gather-op0", "Gather", unique_id="7",
                    input_nodes={1: NodeTrace(f"{scope}/Reshape-op0", "Reshape", input_params={0: "target_ids"})})
    trace.nodes = {n.full_name: n for n in (src, tgt)}
    stack = [Frame(str(source), 2, "def construct(self, source_ids, target_ids):"),
             Frame(str(source), 5, "tgt, _ = self.lookup(target_ids)")]   # the .ir gives both the target call
    sites = shared_call_sites(src, trace, stack, inputs=[{"slot": 1, "dtype": "int32", "min": 3, "max": 100}])
    assert sites is not None and sites.chosen is not None and sites.chosen.line == 3, sites
    assert "reads source_ids (values [3, 100])" in sites.why and [c["line"] for c in sites.calls] == [3, 5], sites
    # the target kernel keeps line 5
    assert shared_call_sites(tgt, trace, stack).chosen.line == 5
    # both calls fed by one input: no line is guessed, every call is listed with its evidence
    both = NodeTrace(f"{scope}/Gather-op1", "Gather", unique_id="7", input_params={1: "ids"})
    other = NodeTrace(f"{scope}/Gather-op0", "Gather", unique_id="7", input_params={1: "ids"})
    trace2 = GraphTrace(nodes={both.full_name: both, other.full_name: other}, graph_inputs={"ids"})
    source.write_text(source.read_text().replace("source_ids)\n", "ids)\n", 1).replace("target_ids)\n", "ids)\n", 1))
    import linecache
    linecache.checkcache(str(source))
    unknown = shared_call_sites(both, trace2, stack)
    assert unknown is not None and unknown.chosen is None and len(unknown.calls) == 2, unknown
    assert "does not tell" in unknown.why and all(c["evidence"] for c in unknown.calls), unknown


@pytest.mark.fast
def test_the_fp16_range_note_is_printed_only_for_a_run_that_computes_in_half():
    from mindguard.report.model import DumpReport
    from mindguard.report.render import render_report
    from mindguard.analysis.report import computes_in_half

    fp32 = {0: GraphTrace(nodes={"a": NodeTrace("a", "MatMul", input_types={0: TensorType("float32", [2, 2])},
                                                kernel_output_dtypes={0: "float32"})})}
    half = {0: GraphTrace(nodes={"a": NodeTrace("a", "MatMul", input_types={0: TensorType("float16", [2, 2])},
                                                kernel_output_dtypes={0: "float16"})})}
    assert computes_in_half(fp32, []) is False and computes_in_half(half, []) is True
    risk = [{"name": "inputs0", "underflow": 3, "overflow": 0}]
    for flag, shown in [(False, False), (True, True), (None, True)]:
        report = DumpReport(dump="d", rank=0, graph=0, iteration=1, fp16_risk=risk, computes_in_half=flag)
        assert ("would under/overflow in fp16" in render_report(report)) is shown, (flag, render_report(report))
        assert report.to_dict()["fp16_risk"] == risk   # the JSON keeps the prediction either way


@pytest.mark.fast
def test_the_graph_inputs_an_argument_carries_are_followed_through_star_args_and_calls():
    from mindguard.analysis.callsite import flow_names

    stack = [Frame("ms.py", 423, "def construct(self, *inputs):"),
             Frame("ms.py", 442, "loss = self.network(*inputs)"),
             Frame("m.py", 32, "def construct(self, anchor, positive, target):"),
             Frame("m.py", 33, "a, p = self.net(anchor, positive)"),
             Frame("m.py", 21, "def construct(self, anchor, positive):"),
             Frame("m.py", 22, "a = self.normalize(self.encoder(anchor))")]
    env = flow_names(stack, stack[-1], {"inputs0", "inputs1", "inputs2"})
    assert env == {"anchor": {"inputs0"}, "positive": {"inputs1"}}, env
    named = [Frame("m.py", 5, "def construct(self, source_ids, target_ids, labels):"),
             Frame("m.py", 6, "out = self.transformer(target_ids=target_ids, source_ids=source_ids)"),
             Frame("m.py", 9, "def construct(self, source_ids, target_ids):"),
             Frame("m.py", 10, "x = self.lookup(source_ids)")]
    env = flow_names(named, named[-1], {"source_ids", "target_ids", "labels"})
    assert env == {"source_ids": {"source_ids"}, "target_ids": {"target_ids"}}, env
    assert flow_names([Frame("m.py", 3, "x = f(")], Frame("m.py", 4, "y"), {"a"}) is None


def _origin_of(summary: dict) -> dict:
    found = (summary.get("origin") or {}).get("traced_to") or (summary.get("stopped_at") or {}).get("traced_to")
    assert found, json.dumps({k: summary.get(k) for k in ("origin", "stopped_at")}, default=str)[:3000]
    return found[0]


# -- the hunts (slow) -----------------------------------------------------------------------------------------

# (wide_deep_ids.py, a recommender id past its table: the range hint and the clip that trains finite are checked on
# both hunts of tests/test_zoo_origin.py's
# test_an_id_past_a_table_raising_in_a_cpu_gather_is_found_and_traced_every_run)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_detector_dividing_by_zero_matched_boxes_is_told_to_clamp_the_count_and_the_clamp_trains_finite(tmp_path,
                                                                                                          mode):
    """ssd_matched.py: no matched box in the batch of global step 8; the forward Div by the count is named, and the
    hint clamps the count (never an epsilon, which would give a ~1e6 loss): in GRAPH the dump's data flow shows the
    divisor is a sum of int32 values, in PyNative (the replay: no data flow) the line names it a count and its value
    is a whole number. --fix applies it: healthy."""
    proc, run, summary = hunt(tmp_path, "ssd_matched.py", "--mode", mode)
    check(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("nonfinite_loss", 8), \
        summary["failure"]
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) in {("Div", "forward"), ("RealDiv", "forward")}, origin
    assert origin["source"]["line"] == line_of(ZOO / "ssd_matched.py", "# CULPRIT"), origin["source"]
    hint = origin["hint"]
    assert "divides by a count that is 0" in hint and "ops.maximum(num_matched_boxes, 1)" in hint, hint
    assert "(b + 1e-6)" not in hint and "div_no_nan" not in hint, hint
    assert ("ReduceSum of Cast of int32 values" if mode == "graph" else "named `num_matched_boxes`") in hint, hint
    if mode == "graph":
        fixed, _, summary = hunt(tmp_path, "ssd_matched.py", "--fix", name="fixed")
        check(fixed, summary, 0, "healthy")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_shared_embeddings_source_call_is_named_from_the_data_flow_after_skipped_overflow_steps(tmp_path, mode):
    """transformer_shared.py: two overflow steps (3, 4) the loss-scale cell skips are not the failure; the source
    id 100 raises in the forward Gather at step 10. In GRAPH the .ir gives both calls of the shared lookup the target
    call's site; the answer names the source call (its graph input feeds the kernel) and never the target line. In
    PyNative the replay records the call that raised. --fix clips the ids: healthy."""
    proc, run, summary = hunt(tmp_path, "transformer_shared.py", "--mode", mode)
    check(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("exception", 10), summary["failure"]
    culprit = line_of(ZOO / "transformer_shared.py", "# CULPRIT")
    target = line_of(ZOO / "transformer_shared.py", "self.tfm_embedding_lookup(target_ids)")
    if mode == "graph":
        op, hint = summary["stopped_at"]["op"], summary["stopped_at"]["hint"]
        assert op["call_sites"]["line"] == culprit and "source_ids" in op["call_sites"]["why"], op.get("call_sites")
        assert f"call site: line {culprit}" in proc.stdout + proc.stderr, explain(proc)
        # only source_ids holds the id 100 (row 2 of the batch of global step 10): the origin, traced through the data
        # flow to the source column, its row and value (formerly tests/test_zoo_origin.py's
        # test_a_shared_embeddings_bad_source_id_is_traced_to_the_source_column_row_and_value: the same hunt)
        assert op["call_sites"]["line"] == line_of(ZOO / "transformer_shared.py", "# CULPRIT"), op.get("call_sites")
        traced = _origin_of(summary)
        assert (traced["kind"], traced["name"], traced["rule"]) == ("batch", "source_ids", "index_out_of_range"), \
            traced
        assert traced["rows"] == [2] and traced["values"] == [100] and traced["table_rows"] == 100, traced
        assert "target_ids" not in traced["text"], traced
        assert hint.startswith("Fix the data first: `source_ids` row 2 holds 100"), hint
        assert "= origin: batch column `source_ids`: row 2 of 4 holds 100" in proc.stdout, explain(proc)
    else:
        op, hint = summary["origin"], summary["origin"]["hint"]
        assert op.get("stopped"), op
    assert (op["op_type"], op["direction"]) == ("Gather", "forward"), op
    lines = [f["line"] for f in op["stack"] if f["file"].endswith("transformer_shared.py")]
    assert culprit in lines and target not in lines, op["stack"]
    assert "max index 100 >= 100 rows of `tfm_embedding_lookup.embedding_table`" in hint, hint
    if mode == "graph":
        fixed, _, summary = hunt(tmp_path, "transformer_shared.py", "--fix", name="fixed")
        check(fixed, summary, 0, "healthy")


def _guarded_run(cwd: Path, script: str, *args: str):
    """The script run as its user runs it (its Guard writes ``mindguard_failure.json`` in ``cwd``)."""
    env = dict(os.environ, GLOG_v="3")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    return subprocess.run([sys.executable, str(ZOO / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.mark.slow
def test_hunt_from_a_record_that_does_not_come_back_says_so(tmp_path):
    """ssd_matched.py reads its bad step from a file (a data order that changes between runs). The record says step
    5; when the hunt's runs fail at step 8 the answer says it disagrees with the record; when they do not fail at all
    the hunt is NOT REPRODUCIBLE, exit 3 -- never "healthy", exit 0."""
    bad = tmp_path / "bad_step.txt"
    bad.write_text("5")
    first = _guarded_run(tmp_path, "ssd_matched.py", "--bad_step_file", str(bad))
    record = tmp_path / "mindguard_failure.json"
    assert first.returncode != 0 and record.exists(), explain(first)
    assert json.loads(record.read_text())["global_step"] == 5, record.read_text()[:800]

    bad.write_text("8")
    proc = run_hunt(tmp_path / "moved", sys.executable, str(ZOO / "ssd_matched.py"), "--bad_step_file", str(bad),
                    cwd=tmp_path, options=("--from", str(record)))
    summary = summary_of(tmp_path / "moved")
    check(proc, summary, 1, "failure_found")
    assert summary["failure"]["global_step"] == 8, summary["failure"]
    assert summary["from_record"]["disagrees"] == {"record_step": 5, "found_step": 8}, summary["from_record"]
    # the record names step 5 and, when its Parameter checks ran on a time budget, the window of steps it lies in
    assert re.search(r"failed at global step 8, but the record \S+ says the run failed at global steps? (\d+-)?5:",
                     proc.stderr), explain(proc)
    assert proc.stderr.index("but the record") < proc.stderr.rindex("pass 2"), explain(proc)   # said before the answer

    bad.write_text("0")
    proc = run_hunt(tmp_path / "gone", sys.executable, str(ZOO / "ssd_matched.py"), "--bad_step_file", str(bad),
                    cwd=tmp_path, options=("--from", str(record)))
    summary = summary_of(tmp_path / "gone")
    check(proc, summary, 3, "not_reproducible")
    assert "NOT REPRODUCIBLE" in proc.stderr and "failed at global step 5" in proc.stderr, explain(proc)
    assert summary["from_record"]["disagrees"] == {"record_step": 5, "found_step": None}, summary["from_record"]




@pytest.mark.slow
def test_a_corrupt_jpeg_keeps_the_users_dataset_error_and_no_debug_flood(tmp_path):
    """image_folder_corrupt.py: Decode raises on dog/2.JPEG at global step 6. The hunt runs the pipeline in
    MindSpore's debug mode to stop at the right step; the training's own output keeps MindSpore's "The
    corresponding data file is: ...JPEG" line and gets no "[Dataset debugger]" lines (measured: the default debug hook
    prints 71 of them here and drops the file name)."""
    data = tmp_path / "data"
    proc, run, summary = hunt(tmp_path, "image_folder_corrupt.py", "--data_dir", str(data))
    check(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("exception", 6), summary["failure"]
    examined = [p for p in sorted(run.iterdir()) if p.name.startswith("pass2")]
    assert examined, sorted(p.name for p in run.iterdir())
    for folder in examined:
        log = (folder / "output.log").read_text(errors="replace")
        assert f"The corresponding data file is: {data}/dog/2.JPEG" in log, log[-3000:]
        assert "[Dataset debugger]" not in log, log[:2000]
    assert "[Dataset debugger]" not in proc.stdout + proc.stderr, explain(proc)


@pytest.mark.slow
def test_a_twin_networks_shared_normaliser_is_named_at_the_call_the_zero_vector_went_through(tmp_path):
    """siamese_shared.py: nn.TrainOneStepCell (construct(*inputs)) over a twin network whose L2Normalize cell is
    called for the anchor and the positive; an all-zero positive makes SqrtGrad NaN at global step 5. The .ir gives
    both calls the anchor call's line; the graph input the backward kernel's forward Sqrt reads (inputs1, bound
    through *inputs to `positive`) names the positive call. --fix (the epsilon under the root) is healthy."""
    proc, run, summary = hunt(tmp_path, "siamese_shared.py")
    check(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("nonfinite_params", 5), \
        summary["failure"]
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("SqrtGrad", "backward"), origin
    culprit = line_of(ZOO / "siamese_shared.py", "# CULPRIT")
    anchor = line_of(ZOO / "siamese_shared.py", "a = self.normalize(self.encoder(anchor))")
    assert origin["call_sites"]["line"] == culprit, origin.get("call_sites")
    lines = [f["line"] for f in origin["stack"] if f["file"].endswith("siamese_shared.py")]
    assert culprit in lines and anchor not in lines, origin["stack"]
    assert "+ 1e-6)" in origin["hint"], origin["hint"]
    fixed, _, summary = hunt(tmp_path, "siamese_shared.py", "--fix", name="fixed")
    check(fixed, summary, 0, "healthy")
