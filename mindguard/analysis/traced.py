"""The findings traced to where their operands came from (``traced_to``, issue 52): the culprit, the op a raising
step stopped in, and -- when no operator made the Inf/NaN -- the first op that read a value already non-finite.

Each entry (the format of :mod:`.provenance`) is one origin: a batch column outside its domain
(:mod:`.provenance`), an index past its table, the learning rate, a Parameter already non-finite when the step
began (:mod:`.param_origin`), a constant of the graph (:mod:`.constant_origin`). The origin comes first and the
finding's hint is put to it (:func:`.origin_hints.origin_hint`).

Steps are 1-based global steps; dump iterations are MindSpore's 0-based ones.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from ..report.model import DumpReport
from .constant_origin import DECISIVE, constant_of_input, trace_constants
from .domain import nonfinite_rows
from .files import TensorFile, strip_op_suffix
from .hints import origin_hint
from .kept_state import KeptState
from .param_origin import ParamHistory, parameter_entry
from .provenance import (INDEX_OPS, BatchValues, is_overflow, learning_rate, load, lr_entry, reach, trace_batch,
                         trained_weights)
from .trace import GraphTrace, NodeTrace


def trace_to_origin(report: DumpReport, result, stop, traces: Dict[int, GraphTrace], values: BatchValues,
                    params: Dict[str, TensorFile], kept: Optional[KeptState],
                    history: Optional[ParamHistory] = None) -> None:
    """``traced_to`` (:mod:`.provenance`) on the origin, on the op a raising step stopped in and -- no operator
    having made the Inf/NaN -- on the first op that read it; each finding's hint put to its origin first; the rows
    of a batch input that held Inf/NaN from the start. ``history``: what the run knows of when its Parameters were
    last finite (the step analysed filled in from the kept state or the dump when it does not say)."""
    _batch_rows(report, params, values)
    history = _with_step(history or ParamHistory(), params, kept)
    bad = {str(i["name"]): i for i in report.nonfinite_inputs if i.get("source") == "parameter"}
    origin = result.origin
    if origin is not None and report.origin is not None and not report.origin.received and origin.trace is not None \
            and origin.op.graph in traces:
        trace, node = traces[origin.op.graph], origin.trace
        slots = _slots(node)
        overflowed = is_overflow(origin.inputs, origin.outputs)
        constants = trace_constants(node, trace, origin.op.op_type, slots, origin.inputs, overflowed,
                                    report.origin.source)
        traced = [c for c in constants if c["rule"] in DECISIVE] \
            + _operands(node, trace, origin.op.graph, origin.op.op_type, origin.inputs, values, bad, history)
        if not traced and overflowed:
            weights = trained_weights(node, trace, slots)
            lr = learning_rate(params, kept.files if kept is not None else None) if weights else None
            if lr is not None:
                traced = [lr_entry(lr, origin.op.op_type, weights)]
        traced += [c for c in constants if c["rule"] not in DECISIVE]
        if traced:
            report.origin.extra["traced_to"] = traced
            report.origin.hint = origin_hint(traced, report.origin.hint, origin.op.op_type) or report.origin.hint
    if stop is not None and report.stopped_at is not None and stop.node is not None and stop.graph in traces:
        traced = _operands(stop.node, traces[stop.graph], stop.graph, stop.op_type, stop.inputs, values, bad,
                           history)
        if traced:
            report.stopped_at["traced_to"] = traced
            report.stopped_at["hint"] = origin_hint(traced, report.stopped_at.get("hint"), stop.op_type) \
                or report.stopped_at.get("hint")
    first = report.first_nonfinite
    if report.origin is None and first is not None and report.nonfinite_inputs:
        traced = _inputs(report.nonfinite_inputs, traces, history)
        if traced:
            first.extra["traced_to"] = traced
            first.hint = origin_hint(traced, None, _op_type(str(traced[0].get("reader") or first.op_type)))


def _slots(node: NodeTrace) -> List[int]:
    """``node``'s input slots that read another kernel or a Parameter."""
    return sorted(set(node.input_nodes) | set(node.input_params))


def _operands(node: NodeTrace, trace: GraphTrace, graph: int, op_type: str, inputs: List[Dict[str, Any]],
              values: BatchValues, bad: Dict[str, Dict[str, Any]], history: ParamHistory) -> List[Dict[str, Any]]:
    """What ``node``'s operands are computed from, as ``traced_to`` entries: the Parameters non-finite when the step
    began (:func:`_parameters`), then the batch columns (an index op's against its table's rows)."""
    slots = _slots(node)
    return _parameters(node, trace, slots, bad, history, op_type) \
        + (_traced_by_index(node, trace, graph, op_type, inputs, values)
           or trace_batch(node, trace, graph, op_type, slots, values))


def _batch_rows(report: DumpReport, params: Dict[str, TensorFile], values: BatchValues) -> None:
    """The rows of each batch input that held Inf/NaN from the start, on its ``nonfinite_inputs`` item."""
    for item in report.nonfinite_inputs:
        if item.get("source") != "batch":
            continue
        tensor = params.get(str(item.get("name")))
        array = load(tensor, values.unreliable) if tensor is not None else None
        found = nonfinite_rows(array) if array is not None else None
        if found is not None:
            item.update(rows=found.rows, row_count=found.row_count, rows_total=found.rows_total,
                        text=f"batch column `{item['name']}`: {found.describe()}")


def _with_step(history: ParamHistory, params: Dict[str, TensorFile], kept: Optional[KeptState]) -> ParamHistory:
    """``history`` with the analysed step (1-based global step) when it does not say: the kept state's step (the
    state the step began with), else the dump's ``global_step`` Parameter (its value after the step: the step)."""
    if history.step is not None:
        return history
    step = kept.step if kept is not None and isinstance(kept.step, int) else None
    if step is None:
        name = next((n for n in sorted(params) if n.rsplit(".", 1)[-1] == "global_step"), None)
        counter = load(params[name]) if name is not None else None
        if counter is not None and counter.size == 1 and counter.dtype.kind in "iu" and int(counter.reshape(-1)[0]) > 0:
            step = int(counter.reshape(-1)[0])
    return dataclasses.replace(history, step=step)


def _op_type(name: str) -> str:
    """``Default/net/fc1-Dense/MatMul-op0`` -> ``MatMul``."""
    return strip_op_suffix(name.rsplit("/", 1)[-1])


def _parameters(node: NodeTrace, trace: GraphTrace, slots: List[int], bad: Dict[str, Dict[str, Any]],
                history: ParamHistory, culprit: str) -> List[Dict[str, Any]]:
    """The Parameters ``node``'s ``slots`` are computed from that were non-finite when the step began (``bad``: the
    report's ``nonfinite_inputs`` Parameters, by name), as ``traced_to`` entries."""
    out = []
    for reached in reach(node, trace, slots):
        item = bad.get(reached.name)
        if reached.kind == "parameter" and item is not None:
            out.append(parameter_entry(reached.name, item, history, slot=reached.slot,
                                       path=list(reversed(reached.path)), reader=f"{culprit} input {reached.slot}",
                                       read_from=f"input {item.get('slot')} of {item.get('op')}"))
    return out


def _inputs(items: List[Dict[str, Any]], traces: Dict[int, GraphTrace], history: ParamHistory) \
        -> List[Dict[str, Any]]:
    """No operator made the Inf/NaN: each Parameter of the report's ``nonfinite_inputs`` as a ``traced_to`` entry,
    and each input no Parameter or batch column held that is a constant of its kernel's call."""
    out: List[Dict[str, Any]] = []
    for item in items:
        op, slot = str(item.get("op") or ""), item.get("slot")
        if item.get("source") == "parameter":
            reader = f"{_op_type(op)} input {slot}" if op else "the step"
            entry = parameter_entry(str(item["name"]), item, history, slot=slot, path=[], reader=reader,
                                    read_from=f"input {slot} of {op}" if op else "the step's inputs")
            out.append(dict(entry, reader=op or None))
        elif item.get("source") == "unknown" and op and isinstance(slot, int):
            for trace in traces.values():
                node = trace.nodes.get(op)
                constant = constant_of_input(node, trace, slot) if node is not None else None
                if constant is not None:
                    out.append(dict(constant, reader=op))
                    break
    return out


def mark_origin_nodes(report: DumpReport) -> None:
    """The data-flow graph's batch and Parameter nodes a finding was traced to get ``origin`` (the text), as the
    page shows it."""
    if report.data_flow is None:
        return
    traced = [item for finding in (report.origin, report.first_nonfinite) if finding is not None
              for item in finding.get("traced_to") or []] + list((report.stopped_at or {}).get("traced_to") or [])
    nodes = {n["id"]: n for n in report.data_flow.get("nodes") or []}
    for item in traced:
        node = nodes.get(f"input:{item.get('name')}")
        if node is not None and item.get("kind") in ("batch", "parameter") and "origin" not in node:
            node["origin"] = item.get("text")


def _traced_by_index(node: NodeTrace, trace: GraphTrace, graph: int, op_type: str, inputs: List[Dict[str, Any]],
                     values: BatchValues) -> List[Dict[str, Any]]:
    """For an index op (a Gather of a table): the batch columns its index is read from, against the table's rows."""
    if op_type not in INDEX_OPS:
        return []
    table_slot, index_slot = INDEX_OPS[op_type]
    by_slot = {int(i["slot"]): i for i in inputs if "slot" in i}
    shape = (by_slot.get(table_slot) or {}).get("shape")
    declared = node.input_types.get(table_slot)
    if not shape and declared is not None:
        shape = declared.shape
    if not shape:
        return []
    axis_stats = by_slot.get(2) if op_type in ("Gather", "GatherV2") else None
    axis = int(axis_stats.get("max") or 0) if axis_stats and isinstance(axis_stats.get("max"), (int, float)) else 0
    rows = int(shape[axis % len(shape)])
    table = (by_slot.get(table_slot) or {}).get("parameter") or node.input_params.get(table_slot) or "the table"
    return trace_batch(node, trace, graph, op_type, [index_slot], values, index_rows=rows, index_slot=index_slot,
                       reader=f"`{table}`")


