"""The data flow around the culprit, as the report page draws it (``DumpReport.data_flow``, the report's
``"data_flow"`` key).

From the .ir data flow (:mod:`.trace`, through ``TupleGetItem``/``Depend`` and copies to the producing kernel's
output slot, as the origin search reads inputs) and what the search saw of each launch
(:attr:`~.origin.SearchResult.launched`): the culprit's producers a few levels up (kernels and the Parameters or
batch inputs they read) and the ops its non-finite outputs reached a few levels down, each with its statistics,
every edge marked finite or not. Computed once in the analysis; the page only draws it.

Schema (``FLOW_SCHEMA`` 1)::

    {"schema": 1, "center": <node id>, "center_role": "origin" | "stop" | "first_nonfinite",
     "up": <levels of producers>, "down": <levels of consumers>, "reached": <ops the values reached in the step>,
     "omitted": {"producers": n, "consumers": n},      # left out past the size limits
     "nodes": [{"id", "kind": "op" | "parameter" | "batch", "op_type", "name", "scope", "role":
                "culprit" | "received" | "stop" | "first_nonfinite" | "producer" | "reached" | "consumer" | "input"
                (an input that held Inf/NaN from the start is the "culprit" when no op made it),
                "depth" (< 0 producers, > 0 consumers), "index" (launch position, or None), "direction",
                "source": {"file", "line", "code"} | None, "outputs": [stats] | "value": stats | None,
                "nonfinite": bool, "dumped": bool, "more_inputs": bool,
                "origin": <text> (a batch input the culprit was traced to, outside its domain: issue 52)}],
     "edges": [{"from", "to", "slot" (input slot of "to"), "out_slot", "nonfinite": bool | None,
                "elided": bool}]}

``nonfinite`` None: the value on that edge was not read (not dumped). An ``elided`` edge stands for a path of ops
not drawn (the culprit to where the step stopped).
"""
from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from .files import is_batch_input
from .evidence import COLLECTIVE_TYPES
from .flow_inputs import VIRTUAL, value_source
from .origin import OpFinding
from .stats import is_nonfinite
from .trace import GraphTrace, NodeTrace, deepest_user_frame

FLOW_SCHEMA = 1
UP, DOWN = 4, 3                  # levels of producers and of consumers drawn
MAX_PRODUCERS, MAX_CONSUMERS = 24, 16

_STAT_KEYS = ("slot", "shape", "dtype", "min", "max", "zeros", "nan", "pos_inf", "neg_inf", "absmax", "unreadable",
              "post_update", "partial", "role", "parameter")


def compact(stats: Optional[Dict[str, Any]]) -> Optional[Dict[str, Any]]:
    """The keys of a tensor's statistics the page shows."""
    if stats is None:
        return None
    return {k: stats[k] for k in _STAT_KEYS if k in stats}


def _scope(name: str) -> str:
    return name.rsplit("/", 1)[0] if "/" in name else ""


def kernel_inputs(node: NodeTrace) -> List[Tuple[int, str, Any, int]]:
    """``(input slot, "op" | "parameter", producing NodeTrace | Parameter name, its output slot)`` of a kernel,
    through the virtual nodes and copies the origin search reads through; inputs that are not one kernel's output
    nor a Parameter (constants, nested tuples) are left out."""
    out: List[Tuple[int, str, Any, int]] = []
    for slot, producer in node.input_nodes.items():
        source, index, param = value_source(producer)
        if param is not None:
            out.append((slot, "parameter", param, 0))
        elif source is not None:
            out.append((slot, "op", source, index))
    out.extend((slot, "parameter", name, 0) for slot, name in node.input_params.items())
    return sorted(out, key=lambda item: item[0])


def _consumers(trace: GraphTrace) -> Dict[str, List[Tuple[NodeTrace, int, int]]]:
    """Kernel full name -> ``(consuming kernel, its input slot, the producer's output slot)``."""
    out: Dict[str, List[Tuple[NodeTrace, int, int]]] = {}
    for node in trace.nodes.values():
        if node.primitive in VIRTUAL or not node.full_name:
            continue
        for slot, kind, what, out_slot in kernel_inputs(node):
            if kind == "op":
                out.setdefault(what.full_name, []).append((node, slot, out_slot))
    return out


def user_source(node: Optional[NodeTrace], trace: Optional[GraphTrace]) -> Optional[Dict[str, Any]]:
    """``{"file", "line", "code"}`` of ``node``'s user line, from the .ir (a backward kernel: its forward's)."""
    if node is None:
        return None
    stacks = [node.forward_stack, node.stack] if node.is_backward else [node.stack, node.forward_stack]
    forward = trace.forward_of(node) if trace is not None and node.is_backward else None
    if forward is not None:
        stacks.append(forward.stack)
    frame, _ = deepest_user_frame(stacks)
    return frame.to_dict() if frame is not None else None


def _slot_stats(items: Iterable[Dict[str, Any]], slot: int) -> Optional[Dict[str, Any]]:
    return next((item for item in items if item.get("slot") == slot), None)


def _bad(stats: Optional[Dict[str, Any]]) -> Optional[bool]:
    if stats is None or stats.get("unreadable"):
        return None
    return is_nonfinite(stats)


class _Flow:
    def __init__(self, graph: int, trace: Optional[GraphTrace], launched: Dict[Tuple[int, str], dict],
                 inputs_by_name: Dict[str, Dict[str, Any]]):
        self.graph, self.trace, self.launched = graph, trace, launched
        self.inputs_by_name = inputs_by_name
        self.nodes: Dict[str, Dict[str, Any]] = {}
        self.edges: List[Dict[str, Any]] = []
        self._edge_keys: Set[Tuple[str, str, int]] = set()
        self.omitted = {"producers": 0, "consumers": 0}

    def seen(self, name: str) -> Optional[dict]:
        return self.launched.get((self.graph, name))

    def op_node(self, name: str, op_type: str, node: Optional[NodeTrace], role: str, depth: int,
                outputs: Optional[List[dict]] = None, source: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        seen = self.seen(name)
        if outputs is None:
            outputs = seen["outputs"] if seen else []
        backward = name.startswith("Gradients") or (node is not None and node.is_backward)
        entry = {"id": name, "kind": "op", "op_type": op_type, "name": name, "scope": _scope(name), "role": role,
                 "depth": depth, "index": seen["index"] if seen else None,
                 "direction": "backward" if backward else "forward",
                 "source": source if source is not None else user_source(node, self.trace),
                 "outputs": [compact(o) for o in outputs],
                 "nonfinite": any(_bad(o) for o in outputs), "dumped": seen is not None, "more_inputs": False}
        self.nodes[name] = entry
        return entry

    def input_node(self, name: str, stats: Optional[Dict[str, Any]], depth: int) -> Dict[str, Any]:
        key = f"input:{name}"
        if key in self.nodes:
            if stats is not None and self.nodes[key]["value"] is None:
                self.nodes[key]["value"] = compact(stats)
                self.nodes[key]["nonfinite"] = bool(_bad(stats))
            return self.nodes[key]
        graph_inputs = self.trace.graph_inputs if self.trace is not None else set()
        batch = name in graph_inputs or is_batch_input(name)
        stats = stats if stats is not None else self.inputs_by_name.get(name)
        entry = {"id": key, "kind": "batch" if batch else "parameter", "op_type": None, "name": name, "scope": "",
                 "role": "input", "depth": depth, "index": None, "direction": None, "source": None,
                 "value": compact(stats), "nonfinite": bool(_bad(stats)), "dumped": stats is not None,
                 "more_inputs": False}
        self.nodes[key] = entry
        return entry

    def edge(self, source: str, target: str, slot: Optional[int], out_slot: Optional[int],
             nonfinite: Optional[bool], elided: bool = False) -> None:
        key = (source, target, -1 if slot is None else slot)
        if key not in self._edge_keys:
            self._edge_keys.add(key)
            self.edges.append({"from": source, "to": target, "slot": slot, "out_slot": out_slot,
                               "nonfinite": nonfinite, "elided": elided})

    def producers(self, center: NodeTrace, center_inputs: List[dict], up: int) -> None:
        frontier: List[Tuple[NodeTrace, List[dict]]] = [(center, center_inputs)]
        for level in range(1, up + 1):
            following: List[Tuple[NodeTrace, List[dict]]] = []
            for node, inputs in frontier:
                for slot, kind, what, out_slot in kernel_inputs(node):
                    read = _slot_stats(inputs, slot)
                    if kind == "parameter":
                        if f"input:{what}" not in self.nodes and self._full("producers"):
                            continue
                        self.input_node(what, read, -level)
                        self.edge(f"input:{what}", node.full_name, slot, 0, _bad(read))
                        continue
                    seen = self.seen(what.full_name)
                    produced = _slot_stats(seen["outputs"], out_slot) if seen else None
                    bad = _bad(produced) if produced is not None else _bad(read)
                    if what.full_name not in self.nodes:
                        if self._full("producers"):
                            continue
                        self.op_node(what.full_name, seen["op_type"] if seen else what.primitive, what,
                                     "producer", -level)
                        if level < up:
                            following.append((what, seen["inputs"] if seen else []))
                        else:
                            self.nodes[what.full_name]["more_inputs"] = bool(kernel_inputs(what))
                    self.edge(what.full_name, node.full_name, slot, out_slot, bad)
            frontier = following

    def consumers(self, center: NodeTrace, down: int) -> None:
        if self.trace is None:
            return
        by_producer = _consumers(self.trace)
        frontier = [center]
        for level in range(1, down + 1):
            following = []
            for node in frontier:
                seen = self.seen(node.full_name)
                outputs = self.nodes[node.full_name]["outputs"] if node.full_name in self.nodes else \
                    (seen["outputs"] if seen else [])
                for consumer, slot, out_slot in by_producer.get(node.full_name, []):
                    stats = _slot_stats(outputs, out_slot)
                    consumed = self.seen(consumer.full_name)
                    if not _bad(stats) or consumed is None:
                        continue   # only where the non-finite values went, among the ops that ran
                    if consumer.full_name not in self.nodes:
                        if self._full("consumers"):
                            continue
                        self.op_node(consumer.full_name, consumed["op_type"], consumer,
                                     "reached" if consumed["nonfinite"] else "consumer", level)
                        if consumed["nonfinite"]:
                            following.append(consumer)
                    self.edge(node.full_name, consumer.full_name, slot, out_slot, True)
            frontier = following

    def _full(self, side: str) -> bool:
        limit = MAX_PRODUCERS if side == "producers" else MAX_CONSUMERS
        count = sum(1 for n in self.nodes.values() if (n["depth"] < 0) == (side == "producers") and n["depth"] != 0)
        if count >= limit:
            self.omitted[side] += 1
            return True
        return False


def data_flow(traces: Dict[int, GraphTrace], launched: Dict[Tuple[int, str], dict], *,
              origin: Optional[OpFinding] = None, origin_source: Optional[Dict[str, Any]] = None,
              stop: Any = None, stop_source: Optional[Dict[str, Any]] = None,
              first: Optional[OpFinding] = None, reached: Optional[int] = None,
              nonfinite_inputs: Iterable[Dict[str, Any]] = (), up: int = UP, down: int = DOWN) -> Optional[dict]:
    """The neighbourhood of the culprit (module docstring): around ``origin``, else the op a step that raised
    stopped in (``stop``, a :class:`~.stop.StopPoint`), else the first op that touched a non-finite value
    (``first``); ``None`` when there is none. ``stop`` beside an origin is drawn too (the first crash point)."""
    inputs_by_name = {str(item.get("name")): item for item in nonfinite_inputs if item.get("name")}
    if origin is not None:
        center_role, graph, name, op_type = "origin", origin.op.graph, origin.op.name, origin.op.op_type
        node, inputs, outputs, source = origin.trace, origin.inputs, origin.outputs, origin_source
    elif stop is not None:
        center_role, graph, name, op_type = "stop", stop.graph, stop.name, stop.op_type
        node, inputs, outputs, source = stop.node, stop.inputs, [], stop_source
    elif first is not None:
        center_role, graph, name, op_type = "first_nonfinite", first.op.graph, first.op.name, first.op.op_type
        node, inputs, outputs, source = first.trace, first.inputs, first.outputs, None
    else:
        return None
    trace = traces.get(graph)
    flow = _Flow(graph, trace, launched, inputs_by_name)
    role = {"origin": "culprit", "stop": "stop", "first_nonfinite": "first_nonfinite"}[center_role]
    if center_role == "origin" and op_type.lower() in COLLECTIVE_TYPES:
        role = "received"   # its inputs are finite here: the values came from another rank
    center = flow.op_node(name, op_type, node, role, 0, outputs=outputs, source=source)
    if center_role == "stop":
        center["outputs"], center["nonfinite"], center["inputs"] = [], False, [compact(i) for i in inputs]
    if node is not None:
        flow.producers(node, inputs, up)
        if center_role != "stop":
            flow.consumers(node, down)
    if origin is not None and stop is not None:
        _add_stop(flow, stop, stop_source, name)
    if center_role == "first_nonfinite":   # no op made the Inf/NaN: the culprit is the input that held it
        for entry in flow.nodes.values():
            if entry["kind"] == "batch" and entry["nonfinite"] or entry["kind"] == "parameter" and entry["nonfinite"] \
                    and entry["name"] in inputs_by_name:
                entry["role"] = "culprit"
    return {"schema": FLOW_SCHEMA, "center": name, "center_role": center_role, "up": up, "down": down,
            "reached": reached, "omitted": flow.omitted, "nodes": list(flow.nodes.values()), "edges": flow.edges}


def _add_stop(flow: _Flow, stop: Any, source: Optional[Dict[str, Any]], center: str) -> None:
    """The op a step stopped in, after the origin: marked where it is drawn already, else added with its
    producers that are drawn (or an elided edge from the culprit)."""
    if stop.graph == flow.graph and stop.name in flow.nodes:
        flow.nodes[stop.name]["role"] = "stop"
        return
    entry = flow.op_node(stop.name, stop.op_type, stop.node, "stop", max([n["depth"] for n in flow.nodes.values()]
                                                                          + [0]) + 1, outputs=[], source=source)
    entry["inputs"] = [compact(i) for i in stop.inputs]
    linked = False
    if stop.node is not None and stop.graph == flow.graph:
        for slot, kind, what, out_slot in kernel_inputs(stop.node):
            producer = f"input:{what}" if kind == "parameter" else what.full_name
            if producer in flow.nodes and producer != stop.name:
                flow.edge(producer, stop.name, slot, out_slot, _bad(_slot_stats(stop.inputs, slot)))
                linked = True
    if not linked:
        flow.edge(center, stop.name, None, None, None, elided=True)
