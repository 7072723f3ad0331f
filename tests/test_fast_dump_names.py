"""Dump files are tied to the graph's kernels by the facts in the files (issue 43): the op name in the file name and
the element counts the files hold against the .ir's kernel types; the launch order and the csv's execution order
only fill in and cross-check. Pure data: launches and .ir nodes built here, no MindSpore, no files."""
from __future__ import annotations

from typing import Dict, List, Sequence

import pytest

from mindguard.analysis.files import TensorFile, sanitize
from mindguard.analysis.order import OpLaunch, assign_full_names, files_fit
from mindguard.analysis.trace import GraphTrace, NodeTrace

pytestmark = pytest.mark.fast


def _file(name: str, io: str, slot: int, elements: int, t: int) -> TensorFile:
    return TensorFile(name.rsplit("/", 1)[-1].split("-")[0], sanitize(name), "0", "0", t, io, slot, "DefaultFormat",
                      "Float32", None, stats={"shape": [elements], "dtype": "float32"})


def launch(name: str, t: int, out: int, inp: Sequence[int] = ()) -> OpLaunch:
    """A launch whose files are named ``name`` (a full scope name), written at ``t`` us, holding ``out`` output
    elements and ``inp`` input elements."""
    op = OpLaunch(name.rsplit("/", 1)[-1].split("-")[0], sanitize(name), 0, t)
    op.outputs[0] = _file(name, "output", 0, out, t)
    for slot, elements in enumerate(inp):
        op.inputs[slot] = _file(name, "input", slot, elements, t)
    return op


def graph(sizes: Dict[str, int]) -> GraphTrace:
    """An .ir whose kernels declare ``sizes`` output elements."""
    trace = GraphTrace()
    for name, size in sizes.items():
        trace.nodes[name] = NodeTrace(name, name.rsplit("/", 1)[-1].split("-")[0], kernel_output_sizes={0: size})
    return trace


def names(ops: List[OpLaunch]) -> List[str]:
    return [op.full_name for op in ops]


def test_a_double_backwards_repeated_pow_is_tied_by_its_file_names_not_its_launch_order():
    """Measured on 2.10 CPU (tests/zoo/wgan_gp.py): the gradient penalty's norm puts three Pow kernels in the
    backward scope Grad_Pow; the csv lists Pow-op1 before Pow-op0 while Pow-op0's files were written first. By launch
    order the files were swapped (512 elements read as the 8-element kernel's) and both kernels dropped."""
    scope = "Gradients/Default/Grad_Pow/"
    csv = [f"{scope}Pow-op1", f"{scope}Pow-op0", f"{scope}Pow-op2"]
    trace = graph({f"{scope}Pow-op0": 512, f"{scope}Pow-op1": 8, f"{scope}Pow-op2": 8})
    ops = [launch(f"{scope}Pow-op0", 100, 512), launch(f"{scope}Pow-op1", 120, 8), launch(f"{scope}Pow-op2", 300, 8)]
    assert assign_full_names(ops, {0: csv}, {0: trace}) == 3
    assert names(ops) == [f"{scope}Pow-op0", f"{scope}Pow-op1", f"{scope}Pow-op2"], names(ops)
    assert all(files_fit(op, trace.nodes[op.full_name]) for op in ops)


def test_repeated_blocks_of_one_size_keep_their_own_names_whatever_order_they_ran_in():
    """Three identical layers (the same kernel, the same sizes): nothing but the file names tells them apart, and
    the names are the csv's, so they are kept though the files were written in the reverse order."""
    csv = [f"Default/layers-CellList/{i}-Block/Mul-op{i}" for i in range(3)]
    trace = graph({name: 64 for name in csv})
    ops = [launch(csv[2], 10, 64), launch(csv[1], 20, 64), launch(csv[0], 30, 64)]
    assign_full_names(ops, {0: csv}, {0: trace})
    assert names(ops) == [csv[2], csv[1], csv[0]], names(ops)


def test_file_suffixes_that_are_not_the_graphs_are_tied_by_the_sizes_the_files_hold():
    """Compiler-expanded kernels (``Expand/_SumExt/ReduceSum``) get other -opN suffixes in the files than in the
    .ir (measured on 2.10 CPU): file ReduceSum-op3 holds 1 element, the .ir's ReduceSum-op3 declares 4. Each launch
    takes a kernel whose sizes it holds, in time order among those."""
    scope = "Expand/_SumExt/"
    csv = [f"{scope}ReduceSum-op0", f"{scope}ReduceSum-op1", f"{scope}ReduceSum-op2", f"{scope}ReduceSum-op3"]
    trace = graph({csv[0]: 24, csv[1]: 1, csv[2]: 4, csv[3]: 4})
    ops = [launch(f"{scope}ReduceSum-op3", 10, 1), launch(f"{scope}ReduceSum-op0", 20, 24),
           launch(f"{scope}ReduceSum-op1", 30, 4), launch(f"{scope}ReduceSum-op2", 40, 4)]
    assign_full_names(ops, {0: csv}, {0: trace})
    got = names(ops)
    assert got[0] == csv[1] and got[1] == csv[0] and set(got[2:]) == {csv[2], csv[3]}, got
    assert all(files_fit(op, trace.nodes[op.full_name]) for op in ops), got


def test_files_that_fit_no_kernel_of_their_name_keep_their_values_without_a_borrowed_name():
    """A launch whose files contradict every kernel of its name is not given one of them (its values would then be
    read as another kernel's and dropped): it stays under its file name, its values still evidence."""
    csv = ["Default/Mul-op0", "Default/Mul-op1"]
    trace = graph({csv[0]: 4, csv[1]: 6})
    ops = [launch("Default/Mul-op0", 10, 4), launch("Default/Mul-op1", 20, 5)]
    assert assign_full_names(ops, {0: csv}, {0: trace}) == 1
    assert names(ops) == [csv[0], None], names(ops)
    assert ops[1].name == sanitize("Default/Mul-op1")


def test_without_sizes_the_data_flow_decides_and_a_tie_keeps_the_file_names():
    """No .ir sizes to compare: the file names are kept unless the .ir's data flow says the launch order fits
    better (a kernel runs after what it reads); with no data flow either, the names stand."""
    csv = ["L/Sub-op0", "L/Sub-op1"]
    ops = [launch("L/Sub-op1", 10, 4), launch("L/Sub-op0", 20, 4)]
    trace = GraphTrace()
    for name in csv:
        trace.nodes[name] = NodeTrace(name, "Sub")
    assign_full_names(ops, {0: csv}, {0: trace})
    assert names(ops) == ["L/Sub-op1", "L/Sub-op0"], names(ops)


def test_the_backends_expanded_kernels_break_ties_by_time_not_by_their_file_suffixes():
    """Measured on 2.10 CPU (tests/zoo/wgan_gp.py): the scalar Subs the backend expands ``0.5 - 1`` into
    (``Expand/_SubScalar/Sub``) have files whose -opN is not the .ir's: file Sub-op1, written first, held -0.5, the
    .ir's Sub-op0 (the exponent SqrtGrad's Pow reads). Same sizes, so time order ties them, not the file names."""
    scope = "Expand/_SubScalar/"
    csv = [f"{scope}Sub-op0", f"{scope}Sub-op1"]
    trace = graph({csv[0]: 1, csv[1]: 1})
    ops = [launch(f"{scope}Sub-op1", 10, 1), launch(f"{scope}Sub-op0", 20, 1)]
    assign_full_names(ops, {0: csv}, {0: trace})
    assert names(ops) == [csv[0], csv[1]], names(ops)
    # the same files outside the expanded scope keep their own names
    ops = [launch("Default/Sub-op1", 10, 1), launch("Default/Sub-op0", 20, 1)]
    assign_full_names(ops, {0: ["Default/Sub-op0", "Default/Sub-op1"]},
                      {0: graph({"Default/Sub-op0": 1, "Default/Sub-op1": 1})})
    assert names(ops) == ["Default/Sub-op1", "Default/Sub-op0"], names(ops)
