"""The tensor files of one dumped step: every kernel graph's files of the iteration (within the step's time
window), without the helper graphs that are not part of the train step."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .files import IterationFiles, TensorFile, in_time_window, is_batch_input, list_iteration


def collect(rank_dir: Path, rank: int, iteration: Optional[int], dirs, warnings: List[str],
            notes: Optional[List[str]] = None, time_window: Optional[Tuple[int, int]] = None,
            excluded: Optional[List[Dict[str, Any]]] = None, writer_ended: bool = False) -> IterationFiles:
    """Files of all kernel graphs of the iteration (within ``time_window``, when given); drops helper graphs
    that are not part of the train step (each one dropped is said in ``notes``: mindguard's own parameter check
    is such a graph on every hunt)."""
    notes = warnings if notes is None else notes
    per_graph: Dict[int, Tuple[str, List[TensorFile]]] = {}
    overflow = []
    outside = 0
    for net, graph, directory in dirs:
        tensors, records = list_iteration([(net, graph, directory)], warnings, writer_ended=writer_ended)
        tensors, dropped = in_time_window(tensors, time_window)
        outside += dropped
        if tensors or not dropped:
            previous = per_graph.get(graph, (net, []))[1]
            per_graph[graph] = (net, previous + tensors)
        overflow.extend(records)
    if outside:
        notes.append(f"ignored {outside} tensor file(s) of iteration {iteration} dumped outside time_window="
                     f"{time_window} (µs): two steps of different graphs can be dumped into one iteration directory")
        if excluded is not None:
            excluded.append({"rule": "outside the step's time window", "what": f"{outside} file(s) of iteration "
                             f"{iteration}", "reason": "written before or after the examined step (another step or "
                             "graph dumped into the same iteration directory)"})
        if not per_graph:
            warnings.append(f"every tensor file of iteration {iteration} is outside time_window={time_window}: "
                            f"nothing analysed (is the window the step's, in epoch microseconds?)")
    training = [g for g, (_, ts) in per_graph.items()
                if any(t.is_parameter and is_batch_input(t.op_name) for t in ts)]
    keep = sorted(per_graph)
    if training and len(per_graph) > 1:
        scopes = {_top_scope(t.op_name) for g in training for t in per_graph[g][1] if not t.is_parameter}
        keep = []
        for g in sorted(per_graph):
            own = {_top_scope(t.op_name) for t in per_graph[g][1] if not t.is_parameter}
            step_part = any(t.op_name.startswith("Gradients") or "optimizer-" in t.op_name
                            for t in per_graph[g][1] if not t.is_parameter)
            if g in training or step_part or (own and own <= scopes):
                keep.append(g)
            else:
                notes.append(f"graph {g} not analysed: a helper graph with no batch inputs (e.g. mindguard's "
                             f"parameter check; scopes {sorted(own)[:3]} are not in the training graph)")
                if excluded is not None:
                    excluded.append({"rule": "helper graph", "what": f"graph {g} ({len(per_graph[g][1])} file(s))",
                                     "reason": f"no batch inputs, and its scopes {sorted(own)[:3]} are not the "
                                               f"training graph's"})
    tensors = [t for g in keep for t in per_graph[g][1]]
    net = per_graph[keep[0]][0] if keep else ""
    return IterationFiles(rank_dir, rank, net, iteration, keep, tensors, overflow)


def _top_scope(op_name: str) -> str:
    """``Gradients_Default_network-WithLossCell__backbone...`` -> ``network-WithLossCell``-ish first cell scope."""
    parts = [p for p in re.split(r"_(?=[A-Za-z]+-)", op_name) if p]
    for p in parts:
        if "-" in p and not p.startswith(("Gradients", "Default")):
            return p.split("_")[0]
    return parts[0].split("_")[0] if parts else op_name
