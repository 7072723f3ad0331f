"""The origin search's evidence rules (mindguard.analysis.evidence) and the search itself, on small real dumps.

The dumps are under tests/data/dumps/<case>/ (recorded once by tests/data/dumps/regen.py from tiny trainings run by
``mindguard hunt``; see its docstring): each holds the examine pass's dump of the failing step and the state kept at
it. No MindSpore here: the analysis reads files only.
"""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest

from mindguard.analysis import evidence
from mindguard.analysis.files import iteration_dirs, is_batch_input
from mindguard.analysis.order import OpLaunch, assign_full_names, group_launches, read_execution_order
from mindguard.analysis.origin import SearchResult, TensorReader, search
from mindguard.analysis.report import _collect, _kept_state, _step_state, analyze_dump
from mindguard.analysis.stats import is_nonfinite
from mindguard.analysis.trace import GraphTrace, NodeTrace, read_graph_trace

pytestmark = pytest.mark.fast

DUMPS = Path(__file__).resolve().parent / "data" / "dumps"
REPO = Path(__file__).resolve().parents[1]


def _case(name: str) -> dict:
    return json.loads((DUMPS / name / "case.json").read_text())


def _state(name: str) -> Optional[Path]:
    state = DUMPS / name / "state"
    return state if state.is_dir() else None


def _report(name: str):
    return analyze_dump(DUMPS / name / "dump", time_window=tuple(_case(name)["step_window_us"]), state=_state(name),
                        progress=False)


class Step:
    """One fixture's step as the search sees it: launches in time order, .ir traces, Parameter and batch files."""

    def __init__(self, name: str):
        self.rank_dir = DUMPS / name / "dump" / "rank_0"
        warnings: List[str] = []
        available = iteration_dirs(self.rank_dir, warnings)
        assert len(available) == 1, f"{name}: one dumped iteration expected, got {sorted(available)}"
        (self.iteration, dirs), = available.items()
        files = _collect(self.rank_dir, 0, self.iteration, dirs, warnings, [], tuple(_case(name)["step_window_us"]))
        self.orders: Dict[int, List[str]] = {g: read_execution_order(self.rank_dir, g, warnings) for g in files.graphs}
        self.traces: Dict[int, GraphTrace] = {
            g: read_graph_trace(self.rank_dir / "graphs" / f"ms_output_trace_code_graph_{g}.ir", warnings)
            for g in files.graphs}
        self.launches: List[OpLaunch] = group_launches(files.tensors)
        assign_full_names(self.launches, self.orders, self.traces)
        self.params = {t.op_name: t for t in files.tensors if t.is_parameter}
        self.batch = sorted((t for t in files.tensors if t.is_parameter and is_batch_input(t.op_name)),
                            key=lambda t: t.op_name)
        kept = _kept_state(_state(name)) if _state(name) is not None else None
        self.state = _step_state(kept, self.orders, self.traces, []) if kept is not None else None
        self.reader = TensorReader(len(files.tensors), progress=False)

    def launch(self, op_type: str, which: Callable[[OpLaunch, Optional[NodeTrace]], bool] = lambda op, node: True
               ) -> Tuple[OpLaunch, Optional[NodeTrace]]:
        """The first launch of ``op_type`` (in time order) that ``which`` accepts, with its .ir node."""
        found = [(op, self.traces[op.graph].nodes.get(op.full_name)) for op in self.launches if op.op_type == op_type]
        found = [(op, node) for op, node in found if which(op, node)]
        assert found, f"no such {op_type} among {[op.name for op in self.launches if op.op_type == op_type]}"
        return found[0]

    def outputs(self, op: OpLaunch) -> Dict[int, tuple]:
        return {slot: self.reader.full(t) for slot, t in sorted(op.outputs.items())}

    def search(self, *, filtered: bool) -> SearchResult:
        """The search as analyze_dump runs it on an outputs-only dump; ``filtered``: told the dump's kernel filter."""
        return search(self.launches, self.traces, TensorReader(0, progress=False), self.batch, params=self.params,
                      state=self.state, orders=self.orders if filtered else None)


def test_every_fixture_is_small_and_names_its_pass():
    total = sum(p.stat().st_size for p in DUMPS.rglob("*") if p.is_file())
    assert total < 1_500_000, f"tests/data/dumps holds {total} bytes; keep the fixtures small"
    for case in ("intended_mask", "norm_sqrt", "batchnorm_unwritten", "amp_mislabelled", "optimizer_inplace",
                 "narrow_missing"):
        info = _case(case)
        assert info["pass"].startswith("pass2") and info["step_window_us"], (case, info)


# -- intended infinities ---------------------------------------------------------------------------------------

def test_a_masked_fill_of_minus_inf_is_intended_and_the_nan_it_became_is_the_origin():
    step = Step("intended_mask")
    mask, node = step.launch("MaskedFill", lambda op, node: step.outputs(op)[0][0]["neg_inf"] > 0)
    outputs = step.outputs(mask)
    stats = outputs[0][0]
    assert stats["neg_inf"] > 0 and stats["nan"] == 0 and stats["pos_inf"] == 0, stats
    intended = evidence.IntendedInfinities()
    assert intended.writes_mask(mask, bad_out=[0], nan_out=[], real_bad_in=[]), intended
    assert intended.sources == [f"MaskedFill ({mask.name})"], intended.sources
    # -inf passed on is not the failure; NaN made from -inf (all inputs known) is
    assert intended.passed_on(nan_out=[], infinite_in=True) and not intended.passed_on(nan_out=[0], infinite_in=True)
    assert intended.made_nan(nan_out=[0], infinite_in=True, inputs_known=True)
    assert not intended.made_nan(nan_out=[0], infinite_in=True, inputs_known=False)

    report = _report("intended_mask")
    origin = report.origin
    assert (origin.op_type, origin.direction) == ("Sub", "forward"), origin
    assert origin.source["line"] == _marked_line(REPO / "tests" / "zoo" / "masked_attention.py", "# CULPRIT"), \
        origin.source
    said = f"the step holds intended infinities (MaskedFill ({mask.name}))"
    assert any(w.startswith(said) for w in report.warnings), report.warnings


def test_an_additive_mask_is_zeros_and_minus_inf_only():
    assert evidence.additive_mask({"shape": [2, 3], "zeros": 4, "neg_inf": 2, "nan": 0, "pos_inf": 0})
    assert not evidence.additive_mask({"shape": [2, 3], "zeros": 3, "neg_inf": 2, "nan": 0, "pos_inf": 0})
    assert not evidence.additive_mask({"shape": [2, 3], "zeros": 4, "neg_inf": 1, "nan": 1, "pos_inf": 0})


# -- files of another kernel -----------------------------------------------------------------------------------

def test_dump_files_are_tied_to_the_kernels_whose_sizes_they_hold_and_a_contradiction_is_said_with_the_sizes():
    """The compiler-expanded ReduceSums of one scope: their files' -opN suffixes are not the .ir's (file
    ReduceSum-op3 holds 1 element where the .ir's ReduceSum-op3 declares 4), so the launches are tied by the sizes
    their files hold (issue 43: never by launch order alone, never dropped). The rule that says files are another
    kernel's still names the sizes, for files given a kernel they contradict."""
    from mindguard.analysis.files import element_count
    from mindguard.analysis.order import files_fit

    step = Step("intended_mask")
    reduces = [(op, step.traces[op.graph].nodes.get(op.full_name)) for op in step.launches if op.op_type == "ReduceSum"]
    assert len(reduces) >= 4, [op.name for op, _ in reduces]
    assert any(op.full_name.rsplit("-op", 1)[1] != op.file_name.rsplit("-op", 1)[1] for op, _ in reduces), \
        "the fixture no longer holds files whose suffixes differ from the .ir's"
    assert all(files_fit(op, node) is True for op, node in reduces), \
        [(op.file_name, op.full_name, element_count(op.outputs[0]), node and node.kernel_output_sizes)
         for op, node in reduces]
    assert len({op.full_name for op, _ in reduces}) == len(reduces)
    report = _report("intended_mask")
    assert not [e for e in report.excluded if e["rule"] == evidence.MISJOINED_RULE], report.excluded

    summed, node = reduces[0]
    outputs = step.outputs(summed)
    held = element_count(summed.outputs[0])
    other = next(n for _, n in reduces if n.kernel_output_sizes[0] != held)
    exclusion = evidence.misjoined_files(summed, other, {}, outputs)
    assert exclusion is not None and exclusion.rule == evidence.MISJOINED_RULE == "files of another kernel", exclusion
    assert exclusion.reason == (f"its output 0 file holds {held} element(s) where the .ir kernel declares "
                                f"{other.kernel_output_sizes[0]}"), exclusion


# -- float16 labels on float32 bytes (AMP O2 on CPU) -----------------------------------------------------------

def test_files_labelled_float16_that_hold_float32_bytes_count_only_by_their_float32_half():
    step = Step("amp_mislabelled")
    power, node = step.launch("Pow")
    mislabelled = evidence.mislabelled_float16(power, node)
    assert [(slot, tensor.dtype) for slot, tensor, _ in mislabelled] == [(0, "Float16")], mislabelled
    assert node.kernel_output_dtypes[0] == "float32", node.kernel_output_dtypes
    exclusion = mislabelled[0][2]
    assert (exclusion.rule, exclusion.what) == (evidence.MISLABELLED_RULE, f"Pow ({power.name}) output 0"), exclusion
    # read as labelled, the bytes are not the values; the reader marks them and reads the float32 half instead
    step.reader.distrust_mislabelled(power, node)
    assert mislabelled[0][1].path in step.reader.half_float32, step.reader.excluded
    assert step.reader.excluded[0] == exclusion.as_dict(), step.reader.excluded

    report = _report("amp_mislabelled")
    origin = report.origin
    assert (origin.op_type, origin.direction) == ("Div", "forward"), origin   # 0/0 of a constant feature's std
    assert origin.source["line"] == _marked_line_in(_regen().AMP_SCRIPT, "# CULPRIT"), origin.source
    assert exclusion.as_dict() in report.excluded, report.excluded
    assert {e["rule"] for e in report.excluded} == {evidence.MISLABELLED_RULE}, report.excluded


# -- the field report: sqrt backward of 0 --------------------------------------------------------------------

def test_the_norm_of_a_zero_embedding_is_sqrtgrad_with_nothing_excluded():
    report = _report("norm_sqrt")
    origin = report.origin
    assert (origin.op_type, origin.direction) == ("SqrtGrad", "backward"), origin
    assert origin.source["file"].endswith("norm_nan.py"), origin.source
    assert report.excluded == [], report.excluded
    # SqrtGrad's inputs (sqrt(0) = 0 and a finite gradient) are all finite, its output is not
    assert all(not is_nonfinite(i) for i in origin.inputs) and any(i["zeros"] for i in origin.inputs), origin.inputs
    assert origin.outputs[0]["pos_inf"] + origin.outputs[0]["neg_inf"] + origin.outputs[0]["nan"] > 0, origin.outputs


# -- BatchNorm: moving statistics written in place, outputs left unwritten -------------------------------------

def test_batchnorm_writes_its_moving_statistics_and_its_unwritten_output_is_not_evidence():
    step = Step("batchnorm_unwritten")
    norm, node = step.launch("BatchNorm")
    assert evidence.post_update_slots(norm, node) == {3, 4}, evidence.post_update_slots(norm, node)
    assert evidence.parameters_written_by(node) == {node.input_params[3], node.input_params[4]}, node.input_params
    assert "moving_variance" in node.input_params[4], node.input_params
    assert evidence.unwritten_output_slots("BatchNorm") == (1, 2)
    # output 1 holds what the freed masked_fill output held (-inf and 1): stale memory, not the kernel's
    outputs = step.outputs(norm)
    held = outputs[1][0]
    assert held["neg_inf"] > 0 and held["nan"] == 0 and not is_nonfinite(outputs[0][0]), (held, outputs[0][0])
    exclusion = evidence.unwritten_outputs(norm, outputs)
    assert exclusion == evidence.Exclusion(
        evidence.UNWRITTEN_RULE, f"BatchNorm ({norm.name}) output(s) [1]",
        "they hold whatever that memory held (measured on CPU); their Inf/NaN is not the kernel's"), exclusion

    report = _report("batchnorm_unwritten")
    origin = report.origin
    assert (origin.op_type, origin.direction) == ("Square", "forward"), origin   # the loss's (pred - 1e38)^2
    assert all(not is_nonfinite(i) for i in origin.inputs) and origin.outputs[0]["pos_inf"] > 0, origin
    assert report.excluded == [exclusion.as_dict()], report.excluded
    assert report.nonfinite_inputs == [], report.nonfinite_inputs


# -- an optimizer writing in place -----------------------------------------------------------------------------

def test_an_optimizer_writes_its_variable_and_accumulation_and_only_reads_the_learning_rate():
    step = Step("optimizer_inplace")
    momentum, node = step.launch("ApplyMomentum")
    assert evidence.written_slots("ApplyMomentum", momentum.name) == (0, 1)
    assert evidence.post_update_slots(momentum, node) == {0, 1}, node.input_params
    written = evidence.parameters_written_by(node)
    assert written == {node.input_params[0], node.input_params[1]} and "learning_rate" not in written, written

    report = _report("optimizer_inplace")
    assert report.origin is None, report.origin
    assert report.first_nonfinite.op_type == "ApplyMomentum", report.first_nonfinite
    first = report.nonfinite_inputs[0]
    assert (first["name"], first["source"], first["slot"], first["pos_inf"]) == \
        ("learning_rate", "parameter", 2, 1), report.nonfinite_inputs


# -- a kernel-filtered dump with an input it left out -----------------------------------------------------------

def test_an_op_that_read_a_left_out_kernels_output_is_not_named():
    step = Step("narrow_missing")
    square, node = step.launch("Square", lambda op, node: node.input_nodes[0].primitive == "Conv2DBackpropFilter")
    assert not any(op.op_type.endswith("BackpropFilter") for op in step.launches), "the narrow dump left it out"

    filtered = step.search(filtered=True)
    assert filtered.origin is None, filtered.origin
    assert any(w.startswith(f"Square ({square.name}) output Inf/NaN, but its input(s) [0] are not in this dump")
               for w in filtered.warnings), filtered.warnings
    # told nothing of the filter, the same files would name the Square: the rule is what keeps it from being named
    unfiltered = step.search(filtered=False)
    assert unfiltered.origin is not None and unfiltered.origin.op.op_type == "Square", unfiltered.origin

    left_out = evidence.LeftOutInputs()
    assert not left_out.keeps_from_origin(set()) and left_out.keeps_from_origin({0})
    left_out.note(square, {0})
    assert left_out.keeps_from_origin(set()), "no op after one that read a left-out input is named"
    assert left_out.warnings() == [w for w in filtered.warnings if "is not named the origin" in w][:1], \
        (left_out.warnings(), filtered.warnings)


# -- the module stays MindSpore-free ---------------------------------------------------------------------------

def test_the_analysis_of_a_fixture_imports_no_mindspore():
    code = ("import sys; from mindguard.analysis.report import analyze_dump; import mindguard.analysis.evidence; "
            f"analyze_dump({str(DUMPS / 'norm_sqrt' / 'dump')!r}, progress=False); "
            "print([m for m in sys.modules if m.split('.')[0] == 'mindspore'])")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]", proc.stdout


def _marked_line(path: Path, marker: str) -> int:
    return _marked_line_in(path.read_text(), marker)


def _marked_line_in(text: str, marker: str) -> int:
    """1-based line of ``text`` ending with ``marker``."""
    for number, line in enumerate(text.splitlines(), start=1):
        if line.rstrip().endswith(marker):
            return number
    raise AssertionError(f"{marker!r} not in the text")


def _regen():
    """tests/data/dumps/regen.py as a module (the inline training scripts the fixtures were recorded from)."""
    spec = importlib.util.spec_from_file_location("regen_dumps", DUMPS / "regen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
