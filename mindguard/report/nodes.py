"""One answer from the reports of several nodes (pure: report dicts in, one report out; no MindSpore, no I/O).

Each node's hunt analyses the dump its own ranks wrote (a node's dump folder holds only its ranks' files, plus the
``rank_0`` metadata folder MindSpore writes on every node) and sends its report's ``to_dict()``; the answer's
text is rendered from the joined report (:func:`mindguard.report.render.render_report` with the job's ranks), never
edited as text. Here the per-rank parts are joined: each rank is judged by the report of the node that runs it,
and the rank where the values went non-finite first is chosen by the same rule as a one-node, several-rank dump
(:func:`mindguard.analysis.report._combine`): a rank whose batch held Inf/NaN, else an operator that made it from
finite inputs (the earliest in the step), else one that only received it.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from .model import DumpReport, role_of
from .render import render_report

def per_rank(report: Dict[str, Any]) -> List[Dict[str, Any]]:
    """The per-rank reports inside one node's report (itself when it covers one rank)."""
    return list(report.get("ranks") or [report])


def merge(nodes: Sequence[Dict[str, Any]], ranks_of: Callable[[int], List[int]], group_size: int) -> Dict[str, Any]:
    """Join the nodes' reports. ``nodes[k]``: node ``k``'s ``{"report": to_dict()}`` (or
    None: that node sent nothing); ``ranks_of(k)``: the global ranks node ``k`` runs. Returns ``{"report": dict,
    "text": str, "origin_rank", "origin_node", "explains": bool, "holds": bool}``."""
    by_rank: Dict[int, Dict[str, Any]] = {}
    node_of: Dict[int, int] = {}
    for node, sent in enumerate(nodes):
        for rank in ranks_of(node):
            node_of[rank] = node
            for item in per_rank((sent or {}).get("report") or {}):
                if item.get("rank") == rank:
                    by_rank[rank] = item
    roles = [dict(role_of(by_rank[rank]) if rank in by_rank else {"rank": rank, "role": "not_read", "op": None},
                  rank=rank, node=node_of.get(rank)) for rank in range(group_size)]
    chosen = _first(roles, by_rank)
    origin_node = node_of.get(chosen) if chosen is not None else None
    base_node = origin_node if origin_node is not None and nodes[origin_node] else \
        next((k for k, sent in enumerate(nodes) if sent), 0)
    base = dict((by_rank.get(chosen) if chosen is not None else None) or (nodes[base_node] or {}).get("report") or {})
    originated = any(r["role"] in ("batch", "local") for r in roles)
    base["origin_rank"] = chosen if originated else None
    base["rank_roles"] = roles
    base["ranks"] = [by_rank[rank] for rank in sorted(by_rank)]
    base["nodes"] = [{"node": k, "ranks": ranks_of(k), "reported": bool(sent)} for k, sent in enumerate(nodes)]
    warnings = list(base.get("warnings") or [])
    for k, sent in enumerate(nodes):
        if k != base_node and sent:
            warnings += [f"node {k}: {w}" for w in (sent.get("report") or {}).get("warnings") or []]
    base["warnings"] = warnings
    text = render_report(DumpReport.from_dict(base), job={"roles": roles, "origin_node": origin_node,
                                                          "nodes": len(nodes)})
    sent_reports = [(sent or {}).get("report") or {} for sent in nodes]
    return {"report": base, "text": text, "origin_rank": base["origin_rank"], "origin_node": origin_node,
            "explains": any(bool(r.get("origin") or r.get("stopped_at") or r.get("nonfinite_inputs"))
                            for r in sent_reports),
            "holds": any(bool(r.get("origin") or r.get("stopped_at") or r.get("nonfinite_inputs")
                              or r.get("first_nonfinite")) for r in sent_reports)}


def _first(roles: List[Dict[str, Any]], by_rank: Dict[int, Dict[str, Any]]) -> Optional[int]:
    """The rank the answer is about (the lowest of equals)."""
    batch = [r["rank"] for r in roles if r["role"] == "batch"]
    if batch:
        return batch[0]
    local = [r["rank"] for r in roles if r["role"] == "local"]
    if local:
        return min(local, key=lambda rank: (by_rank[rank]["origin"].get("index") or 0, rank))
    for wanted in ("received", "unexplained", "stopped", "clean"):
        found = [r["rank"] for r in roles if r["role"] == wanted]
        if found:
            return found[0]
    return None
