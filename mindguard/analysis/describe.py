"""The search's findings as the report says them: the culprit and the first non-finite op as
:class:`~mindguard.report.model.Finding` (source line, stack, hint), the op a raising step stopped in
(``stopped_at``), and both traced to where their operands came from (``traced_to``)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..report.model import DumpReport, Finding
from .callsite import forward_instance
from .counts import annotate_counts
from .domain import nonfinite_rows
from .evidence import COLLECTIVE_TYPES
from .files import TensorFile
from .flow import _consumers
from .hints import hint_for, origin_hint, stop_hint
from .order import OpLaunch
from .origin import OpFinding, is_backward
from .kept_state import KeptState
from .provenance import (INDEX_OPS, SELECTING, BatchValues, is_overflow, learning_rate, load, lr_entry, trace_batch,
                         trained_weights)
from .repeated_calls import repeated_call
from .stop import as_finding, run_folder_evidence
from .trace import GraphTrace, NodeTrace, deepest_user_frame, reads_from


def trace_to_origin(report: DumpReport, result, stop, traces: Dict[int, GraphTrace], values: BatchValues,
                    params: Dict[str, TensorFile], kept: Optional["KeptState"]) -> None:
    """``traced_to`` (:mod:`.provenance`) on the origin and on the op a raising step stopped in, the hint put to the
    origin first; the rows of a batch input that held Inf/NaN from the start."""
    for item in report.nonfinite_inputs:
        if item.get("source") != "batch":
            continue
        tensor = params.get(str(item.get("name")))
        array = load(tensor, values.unreliable) if tensor is not None else None
        found = nonfinite_rows(array) if array is not None else None
        if found is not None:
            item.update(rows=found.rows, row_count=found.row_count, rows_total=found.rows_total,
                        text=f"batch column `{item['name']}`: {found.describe()}")
    origin = result.origin
    if origin is not None and report.origin is not None and not report.origin.received and origin.trace is not None \
            and origin.op.graph in traces:
        trace, node = traces[origin.op.graph], origin.trace
        slots = sorted(set(node.input_nodes) | set(node.input_params))
        traced = _traced_by_index(node, trace, origin.op.graph, origin.op.op_type, origin.inputs, values) \
            or trace_batch(node, trace, origin.op.graph, origin.op.op_type, slots, values)
        if not traced and is_overflow(origin.inputs, origin.outputs):
            weights = trained_weights(node, trace, slots)
            lr = learning_rate(params, kept.files if kept is not None else None) if weights else None
            if lr is not None:
                traced = [lr_entry(lr, origin.op.op_type, weights)]
        if traced:
            report.origin.extra["traced_to"] = traced
            report.origin.hint = origin_hint(traced, report.origin.hint, origin.op.op_type) or report.origin.hint
    if stop is not None and report.stopped_at is not None and stop.node is not None and stop.graph in traces:
        trace, node = traces[stop.graph], stop.node
        traced = _traced_by_index(node, trace, stop.graph, stop.op_type, stop.inputs, values)
        if not traced:
            slots = sorted(set(node.input_nodes) | set(node.input_params))
            traced = trace_batch(node, trace, stop.graph, stop.op_type, slots, values)
        if traced:
            report.stopped_at["traced_to"] = traced
            report.stopped_at["hint"] = origin_hint(traced, report.stopped_at.get("hint"), stop.op_type) \
                or report.stopped_at.get("hint")


def mark_origin_nodes(report: DumpReport) -> None:
    """The data-flow graph's batch nodes the culprit was traced to get ``origin`` (the text), as the page shows it."""
    if report.data_flow is None:
        return
    traced = list((report.origin.get("traced_to") if report.origin is not None else None) or []) \
        + list((report.stopped_at or {}).get("traced_to") or [])
    nodes = {n["id"]: n for n in report.data_flow.get("nodes") or []}
    for item in traced:
        node = nodes.get(f"input:{item.get('name')}")
        if node is not None and item.get("kind") == "batch":
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


def _exp_summed(node: Optional[NodeTrace], trace: Optional[GraphTrace]) -> Optional[bool]:
    """Whether an exp's values are summed (a softmax, a log-sum-exp: log-sum-exp applies), by the ops that read
    them, through ops that only reshape or select; None when the data flow is not known."""
    if node is None or trace is None:
        return None
    consumers = _consumers(trace)
    summing = {"ReduceSum", "ReduceMean", "CumSum", "ReduceLogSumExp", "Softmax", "LogSoftmax", "SumExt", "MeanExt",
               "LogSumExp"}
    frontier, seen = [node], set()
    for _ in range(3):
        following = []
        for current in frontier:
            for consumer, _slot, _out in consumers.get(current.full_name, []):
                if id(consumer) in seen:
                    continue
                seen.add(id(consumer))
                if consumer.primitive in summing:
                    return True
                if consumer.primitive in SELECTING:
                    following.append(consumer)
        frontier = following
    return False


def describe(finding: OpFinding, traces: Dict[int, GraphTrace], *, with_hint: bool, frame=None) -> Finding:
    op: OpLaunch = finding.op
    node = finding.trace
    backward = is_backward(op, node)
    forward_op = None
    stacks: List[list] = []
    if node is not None:
        fwd = (forward_instance(node, traces[op.graph]) or traces[op.graph].forward_of(node)) \
            if op.graph in traces else None   # a shared cell's kernels share the unique id: the one it reads
        forward_op = fwd.full_name if fwd is not None else None
        # backward: the forward candidate first (a weight-gradient MatMul can sit under the wrong layer's scope)
        stacks = [node.forward_stack, node.stack] if backward else [node.stack, node.forward_stack]
        if fwd is not None:
            stacks.append(fwd.stack)
    if backward and forward_op is None:
        forward_op = _forward_from_scope(op.name)
    found, stack = deepest_user_frame(stacks)
    if frame is not None and found is not None and found in stack:   # the call site instead of the .ir's frame
        stack = stack[:stack.index(found)] + [frame]
    frame = frame or found
    source = frame.to_dict() if frame else None
    out = Finding(op_type=op.op_type, name=op.name, direction="backward" if backward else "forward",
                  forward_op=forward_op, source=source, stack=[f.to_dict() for f in stack],
                  inputs=finding.inputs, outputs=finding.outputs, index=finding.index,
                  received=op.op_type.lower() in COLLECTIVE_TYPES, via_backend_cast=finding.via_backend_cast)
    if with_hint:
        if out.received:
            out.hint = (f"{op.op_type} received Inf/NaN from another rank: its inputs are finite on this rank. "
                        f"Look at the rank where the origin is not a collective (origin_rank).")
        else:
            readable = [i for i in finding.inputs if not i.get("unreadable")]
            if not backward and op.graph in traces:   # which inputs the data flow shows to be counts
                readable = annotate_counts(node, readable, traces[op.graph].params)
            out.hint = hint_for(op.op_type, readable,
                                [o for o in finding.outputs if not o.get("unreadable")],
                                direction=out.direction, source_code=source["code"] if source else None,
                                source_file=source["file"] if source else None,
                                source_line=source["line"] if source else None,
                                exp_summed=_exp_summed(node, traces.get(op.graph)) if not backward else None)
    return out


def describe_stop(stop, traces: Dict[int, GraphTrace], rank_dir: Path, iteration: Optional[int],
                  origin: Optional[Finding], orders: Dict[int, List[str]]) -> Dict[str, Any]:
    """``stopped_at``: the op that did not complete (``op``), the last that did, its execution-order ``index``
    (0-based, in ``graph``'s csv), the hint, and the run folder's exception message/log when present (the record's
    of dump iteration ``iteration``, 0-based; None: whichever iteration it names)."""
    finding = as_finding(stop)
    site = repeated_call(finding, traces)
    op = describe(finding, traces, with_hint=False, frame=site[0] if site else None).to_dict()
    if site is not None:
        op["call_site"] = (f"the .ir gives this kernel another call's line (MindSpore keeps one debug info for a "
                           f"cell or function called more than once); {site[1]}")
    for key in ("outputs", "received", "via_backend_cast", "index", "hint", "reached"):
        op.pop(key, None)
    if site is None:
        place_shared_call(op, finding, traces)
    evidence = run_folder_evidence(rank_dir, iteration)
    source = op.get("source")
    hint = stop_hint(stop.op_type, [i for i in stop.inputs if not i.get("unreadable")], direction=op["direction"],
                     source_code=source["code"] if source else None, log=evidence["log"],
                     message=evidence["message"])
    last = None
    if stop.last_completed is not None:
        last = describe(stop.last_completed, traces, with_hint=False).to_dict()
        for key in ("received", "via_backend_cast", "hint", "reached"):
            last.pop(key, None)
    missing_inputs = [i["slot"] for i in stop.inputs if i.get("not_dumped")]
    out: Dict[str, Any] = {
        "last_completed": last, "op": op, "index": stop.index, "graph": stop.graph, "hint": hint,
        "partial": stop.partial, "ops_not_run": stop.missing_after, "message": evidence["message"],
        "log": evidence["log"], "inputs_not_dumped": missing_inputs,
    }
    if origin is not None:
        order = orders.get(stop.graph) or []
        out["ops_after_origin"] = (stop.index - order.index(origin["name"])
                                   if origin["name"] in order else None)
        out["inputs_nonfinite"] = any(int(i.get(k) or 0) for i in stop.inputs for k in ("nan", "pos_inf", "neg_inf"))
        out["downstream_of_origin"] = reads_from(stop.node, origin["name"])
    return out


def place_shared_call(op: Dict[str, Any], finding: OpFinding, traces: Dict[int, GraphTrace]) \
        -> Optional[Dict[str, Any]]:
    """For a kernel of a cell called more than once (one call site in the .ir for all its kernels): put the call the
    data flow names into ``op["stack"]`` in place of the .ir's, and ``op["call_sites"]`` (every call with its
    evidence; ``line`` when one is named). Returns ``op`` when it changed it, else None."""
    from .callsite import shared_call_sites
    from .trace import Frame

    frames = [Frame(f["file"], int(f["line"]), f.get("code") or "") for f in op.get("stack") or []
              if f.get("file") and f.get("line")]
    sites = shared_call_sites(finding.trace, traces.get(finding.op.graph), frames, inputs=finding.inputs)
    if sites is None:
        return None
    op["call_sites"] = sites.to_dict()
    if sites.chosen is not None:
        op["stack"] = [sites.chosen.to_dict() if (f.get("file"), f.get("line")) == (sites.shown.file, sites.shown.line)
                       else f for f in op.get("stack") or []]
    return op


def _forward_from_scope(name: str) -> Optional[str]:
    """``Gradients/Default/.../norm-Norm/Grad_Sqrt/SqrtGrad-op0`` -> ``Default/.../norm-Norm/Sqrt`` (best guess)."""
    match = re.match(r"Gradients/(.*)/Grad_(\w+)/[^/]+$", name)
    if not match:
        match = re.match(r"Gradients_(.*)_Grad_([A-Za-z0-9]+)_[^_]+$", name)
        if not match:
            return None
        return f"{match.group(1)}_{match.group(2)}"
    return f"{match.group(1)}/{match.group(2)}"
