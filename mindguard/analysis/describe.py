"""The search's findings as the report says them: the culprit and the first non-finite op as
:class:`~mindguard.report.model.Finding` (source line, stack, hint) and the op a raising step stopped in
(``stopped_at``); :mod:`.traced` traces them to where their operands came from (``traced_to``)."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..report.model import Finding
from .callsite import forward_instance
from .counts import annotate_counts
from .evidence import COLLECTIVE_TYPES
from .flow import _consumers
from .hints import hint_for, stop_hint
from .order import OpLaunch
from .origin import OpFinding, is_backward
from .provenance import SELECTING
from .repeated_calls import repeated_call
from .stop import as_finding, run_folder_evidence
from .trace import GraphTrace, NodeTrace, deepest_user_frame, reads_from


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
