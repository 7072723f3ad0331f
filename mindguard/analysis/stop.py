"""Where a step that raised stopped: the first kernel of the iteration's execution order that did not complete.

MindSpore's e2e dump writes each kernel's files when the kernel has run (measured on CPU, MindSpore 2.10:
inputs and outputs after the launch; parameters at the end of the graph's run). When a kernel raises
(``run task error`` on Ascend, a ``RuntimeError`` on CPU) the dump of that iteration ends before it: the
execution-order csv continues, the files do not. A launch whose inputs were dumped but not its outputs
(``input_output`` 0) is the kernel that failed.

A graph counts as stopped only when it clearly ended early: some op after its last dumped op in execution
order has no files, and its parameters (dumped when a graph finishes) are absent. Graphs that did not run in
the iteration (a branch not taken) have no directory and are not considered. Indexes are 0-based positions
in the graph's ``ms_execution_order_graph_<g>.csv``.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .files import TensorFile, read_regular_text, sanitize, strip_op_suffix
from .order import OpLaunch
from .evidence import post_update_slots
from .origin import OpFinding, TensorReader
from .provenance import fits_declared
from .stats import tensor_stats
from .trace import GraphTrace, NodeTrace
from ..protocol import folder as layout

_PASS_THROUGH = {"Depend", "Load", "UpdateState", "MakeTuple"}
_SCALAR = re.compile(r"^(I8|I16|I32|I64|U8|U16|U32|U64|F16|F32|F64|Bool)\((-?[\d.e+-]+)\)$")
_SCALAR_DTYPE = {"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64", "U8": "uint8", "U16": "uint16",
                 "U32": "uint32", "U64": "uint64", "F16": "float16", "F32": "float32", "F64": "float64",
                 "Bool": "bool"}


@dataclass
class StopPoint:
    """The kernel that did not complete, the last one that did, and how sure the finding is."""

    graph: int
    index: int                        # 0-based position in the graph's execution order
    name: str                         # full scope name from the csv
    op_type: str
    node: Optional[NodeTrace]
    inputs: List[dict]
    last_completed: Optional[OpFinding]    # the launch that completed last (latest dump timestamp)
    partial: bool                     # its input files were dumped, its outputs not
    missing_after: int                # ops of the graph after it with no files
    warnings: List[str] = field(default_factory=list)
    ready: List[int] = field(default_factory=list)   # every op whose inputs were all computed and that did not complete
    why: Optional[str] = None         # how it was told from the others of ``ready`` (a note of the report)


def dump_settings(rank_dir: Path) -> Dict[str, Any]:
    """``common_dump_settings`` MindSpore copied to ``.dump_metadata/data_dump.json`` ({} when absent)."""
    path = rank_dir / ".dump_metadata" / "data_dump.json"
    try:
        return dict(json.loads(read_regular_text(path)).get("common_dump_settings") or {})
    except (OSError, ValueError, AttributeError, TypeError):
        return {}


def _selected(name: str, kernels: Any) -> bool:
    """Whether the dump's kernel list selects kernel ``name``: ``True`` unless every entry is a ``name-regex(...)``
    that does not fully match it (those ops were left out on purpose: their missing files say nothing)."""
    entries = kernels if isinstance(kernels, list) else [kernels]
    for entry in entries:
        text = str(entry).replace(" ", "")
        if not (text.startswith("name-regex(") and text.endswith(")")):
            return True
        try:
            if re.fullmatch(text[len("name-regex("):-1], name):
                return True
        except re.error:
            return True
    return False


def find_stop(launches: List[OpLaunch], tensors: List[TensorFile], orders: Dict[int, List[str]],
              traces: Dict[int, GraphTrace], settings: Dict[str, Any], reader: TensorReader,
              warnings: List[str], notes: List[str], message: Optional[str] = None,
              kept: Optional[Dict[str, Any]] = None) -> Optional[StopPoint]:
    """The stop point of an incomplete iteration, or None when every analysed graph ran to its end.

    ``message``: the exception the step raised, when known. The CPU runtime runs independent kernels in parallel,
    so several kernels whose inputs were all computed may not have completed when one raised: the one whose inputs
    break its rule (an index out of range) is named, else one of the op type the message names, else the first
    in execution order. ``kept``: the step's batch by graph-input name, as the examine pass kept it when the step
    raised (:mod:`mindguard.protocol.step_batch`): the values of a graph input no dumped file holds."""
    outputs_expected = int(settings.get("input_output", 0) or 0) in (0, 2)
    filtered = bool(settings.get("kernels"))
    stops: List[Tuple[int, StopPoint]] = []
    for graph, order in sorted(orders.items()):
        mine = [op for op in launches if op.graph == graph]
        if not mine or not order:
            continue
        by_name = {op.full_name: op for op in mine if op.full_name}
        complete = {name for name, op in by_name.items() if op.outputs or not outputs_expected}
        partial = [op for op in mine if outputs_expected and op.inputs and not op.outputs and op.full_name]
        missing = [i for i, name in enumerate(order) if name not in complete]
        if not missing:
            continue
        dumped = [i for i, name in enumerate(order) if name in complete]
        last = max(dumped) if dumped else -1
        tail = [i for i in missing if i > last]
        params_dumped = any(t.is_parameter and t.graph == graph for t in tensors)
        if filtered:
            unexplained = [i for i in missing if _selected(order[i], settings.get("kernels"))]
            if unexplained:
                warnings.append(f"graph {graph}: {len(unexplained)} op(s) of the execution order have no files, but "
                                f"the dump selects kernels (\"kernels\" in dump.json): cannot tell whether the step "
                                f"stopped early")
            continue
        if (not tail and not partial) or params_dumped:
            no_outputs = sorted(op.full_name for op in partial if op.full_name)
            if no_outputs:
                warnings.append(f"graph {graph} ran to its end, but {len(no_outputs)} op(s) have input files and no "
                                f"output file (deleted, or not written), e.g. {no_outputs[0]}")
            if len(missing) > len(no_outputs):
                notes.append(f"graph {graph}: {len(missing) - len(no_outputs)} op(s) of the execution order have no "
                             f"dump files although the graph ran to its end (MindSpore does not dump them), e.g. "
                             f"{next(order[i] for i in missing if order[i] not in no_outputs)}")
            continue
        point = _stop_in_graph(graph, order, by_name, complete, partial, traces.get(graph), missing, tail)
        point.inputs = _inputs_of(point, by_name, mine, tensors, traces.get(graph), set(order), reader, kept)
        if not point.partial and point.ready:
            point = _by_evidence(point, order, by_name, mine, tensors, traces.get(graph), reader, message, kept)
        if point.why:
            notes.append(point.why)
        done = [op for op in mine if op.outputs]
        if done:
            last_op = max(done, key=lambda op: op.timestamp)
            point.last_completed = OpFinding(
                order.index(last_op.full_name) if last_op.full_name in order else -1, last_op,
                [_item(k, "dumped input", reader.full(t)[0]) for k, t in sorted(last_op.inputs.items())],
                [_item(k, "dumped output", reader.full(t)[0]) for k, t in sorted(last_op.outputs.items())],
                traces[graph].nodes.get(last_op.full_name or "") if graph in traces else None)
        latest = max(op.timestamp for op in mine)
        stops.append((latest, point))
    if not stops:
        return None
    stops.sort(key=lambda s: -s[0])
    chosen = stops[0][1]
    if len(stops) > 1:
        chosen.warnings.append(f"graphs {[s[1].graph for s in stops]} all end before their execution order does; "
                               f"graph {chosen.graph} ran last, so its stop point is reported")
    return chosen


def _stop_in_graph(graph: int, order: List[str], by_name: Dict[str, OpLaunch], complete: set,
                   partial: List[OpLaunch], trace: Optional[GraphTrace], missing: List[int],
                   tail: List[int]) -> StopPoint:
    """The op that did not complete: a partially dumped launch, else the first op in execution order whose
    producing kernels all completed (the runtime may run independent kernels out of csv order), else the
    first op after the last dumped one."""
    warnings: List[str] = []
    kernels = set(order)
    if partial:
        op = max(partial, key=lambda o: o.timestamp)
        index = order.index(op.full_name or "")
        is_partial = True
    else:
        ready: List[int] = []
        if trace is not None:
            ready = [i for i in missing if trace.nodes.get(order[i]) is not None
                     and all(p in complete for p in _producer_kernels(trace.nodes[order[i]], kernels))]
        if ready:
            index = ready[0]
        else:
            index = tail[0] if tail else missing[0]
            if trace is None:
                warnings.append(f"no .ir trace for graph {graph}: the stop point is the first op after the last "
                                f"dumped one in execution order; kernels that run in parallel could make it another")
        is_partial = False
    name = order[index]
    node = trace.nodes.get(name) if trace is not None else None
    op_type = node.primitive if node is not None else strip_op_suffix(name.rsplit("/", 1)[-1])
    later_done = [i for i in range(index + 1, len(order)) if order[i] in complete]
    why = None
    if later_done:   # a note, not a warning: it changes nothing the user should do
        why = (f"{len(later_done)} op(s) after {op_type} in execution order did complete (the runtime ran them in "
               f"parallel), e.g. {order[later_done[0]]}; {op_type} is the first op whose inputs were all computed "
               f"that did not complete")
    missing_after = sum(1 for i in missing if i > index)
    return StopPoint(graph, index, name, op_type, node, [], None, is_partial, missing_after, warnings,
                     ready=[] if is_partial else ready, why=why)


_MESSAGE_OP = re.compile(r"For '(\w+)'")   # MindSpore's kernel errors: "For 'Gather', the 'input_indices' ..."


def _by_evidence(point: StopPoint, order: List[str], by_name: Dict[str, OpLaunch], launches: List[OpLaunch],
                 tensors: List[TensorFile], trace: Optional[GraphTrace], reader: TensorReader,
                 message: Optional[str], kept: Optional[Dict[str, Any]] = None) -> StopPoint:
    """Among the kernels that were ready and did not complete (``point.ready``, the first of them is ``point``): the
    one whose inputs break its rule (:func:`mindguard.analysis.hints.input_violation`), else the first of the op type
    the exception names, else ``point``."""
    from .hints import input_violation

    if len(point.ready) < 2 or trace is None:
        return point
    named = _MESSAGE_OP.search(message or "")
    kernels = set(order)
    candidates = []
    for i in point.ready[:32]:
        node = trace.nodes.get(order[i])
        primitive = node.primitive if node is not None else strip_op_suffix(order[i].rsplit("/", 1)[-1])
        other = point if i == point.index else StopPoint(point.graph, i, order[i], primitive, node, [], None,
                                                         False, point.missing_after, [], point.ready)
        if other is not point:
            other.inputs = _inputs_of(other, by_name, launches, tensors, trace, kernels, reader, kept)
        why = input_violation(other.op_type, [x for x in other.inputs if not x.get("unreadable")])
        candidates.append((other, why))
    broken = [(c, why) for c, why in candidates if why]
    typed = [c for c, _ in candidates if named and c.op_type.lower() == named.group(1).lower()]
    chosen, why = broken[0] if broken else ((typed[0], None) if typed else (point, None))
    if chosen is point:
        return point
    chosen.missing_after = sum(1 for i in range(chosen.index + 1, len(order)) if order[i] not in by_name
                               or not by_name[order[i]].outputs)
    chosen.warnings = list(point.warnings)
    reason = (f"its inputs break its rule ({why})" if why else
              f"the exception names {named.group(1)}" if named else "")
    chosen.why = (f"{len(point.ready)} kernels had all their inputs computed and did not complete (the runtime runs "
                  f"independent kernels in parallel, and stops them all when one raises); {chosen.op_type} "
                  f"({chosen.name}) is named: {reason}")
    return chosen


def _producer_kernels(node: NodeTrace, kernels: set, depth: int = 0) -> List[str]:
    """Full names of the kernels (ops in the execution order) whose outputs ``node`` reads."""
    out: List[str] = []
    for producer in node.input_nodes.values():
        if producer.full_name in kernels:
            out.append(producer.full_name)
        elif depth < 8:
            out.extend(_producer_kernels(producer, kernels, depth + 1))
    return out


def _resolve(node: NodeTrace, slot: int, kernels: set) -> Tuple[Optional[NodeTrace], int, Optional[str]]:
    """``(producing kernel, its output slot, parameter name)`` for input ``slot`` of ``node``, looking through
    Load/Depend/TupleGetItem (``TupleGetItem(%4, 1)`` is output 1 of ``%4``)."""
    if slot in node.input_params:
        return None, 0, node.input_params[slot]
    producer = node.input_nodes.get(slot)
    out_slot = 0
    for _ in range(8):
        if producer is None or producer.full_name in kernels:
            break
        if producer.primitive == "TupleGetItem" and len(producer.args) > 1:
            scalar = _SCALAR.match(producer.args[1])
            out_slot = int(float(scalar.group(2))) if scalar else 0
        elif producer.primitive not in _PASS_THROUGH:
            return None, 0, None
        if 0 in producer.input_params:
            return None, 0, producer.input_params[0]
        producer = producer.input_nodes.get(0)
    return (producer, out_slot, None) if producer is not None and producer.full_name in kernels else (None, 0, None)


def _inputs_of(point: StopPoint, by_name: Dict[str, OpLaunch], launches: List[OpLaunch],
               tensors: List[TensorFile], trace: Optional[GraphTrace], kernels: set,
               reader: TensorReader, kept: Optional[Dict[str, Any]] = None) -> List[dict]:
    """Statistics of the stopped op's inputs: its own input files, else the producer's dumped output, else the
    parameter's file or another (not in-place) consumer's input file of that parameter, else -- a graph input --
    the step's batch as kept (``kept``, by graph-input name), else the .ir's dtype/shape; scalar constants of the
    call (``I64(0)``) as themselves. ``from`` says where each came from."""
    own = by_name.get(point.name)
    node = point.node
    slots = set(own.inputs) if own is not None else set()
    if node is not None:
        slots |= set(range(len(node.args)))
    out: List[dict] = []
    for slot in sorted(slots):
        if own is not None and slot in own.inputs:
            stats, _ = reader.full(own.inputs[slot])
            out.append(_item(slot, "dumped input", stats))
            continue
        if node is None:
            continue
        arg = node.args[slot] if slot < len(node.args) else ""
        scalar = _SCALAR.match(arg)
        if scalar:
            value = float(scalar.group(2))
            value = int(value) if value.is_integer() and scalar.group(1) != "F32" else value
            out.append({"slot": slot, "from": f"constant {arg}", "shape": [], "dtype": _SCALAR_DTYPE[scalar.group(1)],
                        "min": value, "max": value, "constant": True})
            continue
        producer, out_slot, param = _resolve(node, slot, kernels)
        declared = node.input_types.get(slot)
        if producer is not None:
            launch = by_name.get(producer.full_name)
            if launch is not None and out_slot in launch.outputs:
                stats, _ = reader.full(launch.outputs[out_slot])
                if stats is not None and declared is not None and declared.shape and stats.get("shape") \
                        and list(stats["shape"]) != list(declared.shape) \
                        and math.prod(stats["shape"]) == math.prod(declared.shape):   # the op's own shape
                    stats = dict(stats, shape=list(declared.shape), file_shape=list(stats["shape"]))
                out.append(_item(slot, f"{producer.full_name} output {out_slot}", stats, producer=producer.full_name))
                continue
            out.append(_declared(slot, f"{producer.full_name} output {out_slot} (not dumped)", declared))
            continue
        if param is not None:
            found = _parameter_file(param, tensors, launches, trace)
            batch = kept.get(param) if kept and trace is not None and param in trace.graph_inputs else None
            if found is not None:
                stats, _ = reader.full(found[0])
                out.append(_item(slot, found[1], stats, parameter=param))
            elif batch is not None and fits_declared(batch, trace.params.get(param) if trace else None):
                out.append(_item(slot, f"{param} (the step's batch, kept when it raised)", tensor_stats(batch)))
            else:
                if declared is None and trace is not None:
                    declared = trace.params.get(param)
                out.append(_declared(slot, f"{param} (not dumped; dtype/shape from the .ir)", declared,
                                     parameter=param))
            continue
        if declared is not None:
            out.append(_declared(slot, f"{arg} (not dumped)", declared))
    return out


def _parameter_file(name: str, tensors: List[TensorFile], launches: List[OpLaunch],
                    trace: Optional[GraphTrace]) -> Optional[Tuple[TensorFile, str]]:
    wanted = sanitize(name)
    for t in tensors:
        if t.is_parameter and t.op_name == wanted:
            return t, f"{name} (Parameter file)"
    if trace is None:
        return None
    for op in sorted(launches, key=lambda o: o.timestamp):
        node = trace.nodes.get(op.full_name or "")
        if node is None:
            continue
        stale = post_update_slots(op, node)        # dumped after the kernel updated them: not the step's start
        for slot, param in node.input_params.items():
            if param == name and slot in op.inputs and slot not in stale:
                return op.inputs[slot], f"{name} (input {slot} of {op.name})"
    return None


def _item(slot: int, source: str, stats: Optional[dict], **extra: Any) -> dict:
    if stats is None:
        return {"slot": slot, "from": source, "unreadable": True, **extra}
    return {"slot": slot, "from": source, **extra, **stats}


def _declared(slot: int, source: str, declared, **extra: Any) -> dict:
    return {"slot": slot, "from": source, "shape": declared.shape if declared else None,
            "dtype": declared.dtype if declared else None, "min": None, "max": None, "not_dumped": True, **extra}


def as_finding(point: StopPoint) -> OpFinding:
    """The stop point as an :class:`OpFinding` (no outputs) so the report describes it like any op."""
    launch = OpLaunch(point.op_type, sanitize(point.name), point.graph, 0, full_name=point.name)
    return OpFinding(point.index, launch, point.inputs, [], point.node)


def run_folder_evidence(rank_dir: Path, iteration: Optional[int]) -> Dict[str, Optional[str]]:
    """``mindguard hunt`` layout (``<run>/passN/dump/rank_<r>``): the pass's ``output.log`` and the exception
    message of its ``failure.json`` when it records an exception in this iteration."""
    pass_dir = rank_dir.parent.parent
    log = pass_dir / layout.OUTPUT_LOG
    message = None
    for record_path in sorted(pass_dir.glob(layout.RECORD_GLOB)):
        try:
            record = json.loads(read_regular_text(record_path))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and record.get("kind") == "exception" and record.get("message") and \
                (iteration is None or record.get("dump_iteration") in (None, iteration)):
            message = str(record["message"]).strip().splitlines()[0]
            break
    return {"log": str(log) if log.is_file() else None, "message": message}
