"""Where a step stopped when MindSpore dumped nothing of it (issue 52): its first launched kernel raised.

MindSpore's e2e dump writes a kernel's files once the kernel has run; a step whose first launched kernel raises
leaves no file at all (docs/mindspore-facts.md, "hints": Wide&Deep ids fed straight from the batch into ``Gather``).
:func:`find_stop` (:mod:`.stop`) then has nothing to read, but the facts are still there:

* the exception the step raised (the pass's record): the op it names (``For 'Gather', ...``) and, for a kernel that
  states it, the range and the value (``range [0, 10000), but got 10007``);
* the kernel graph the dump config wrote at compile time (``graphs/ms_output_trace_code_graph_<g>.ir`` and its
  execution order): the kernels of that op type whose inputs are all graph inputs, Parameters or constants -- the
  ones the step can launch before any other kernel completes --, each with its source line and its table's declared
  shape;
* the batch of the step, kept by the examine pass when the step raised (:mod:`mindguard.protocol.step_batch`): the
  values a graph input held.

A kernel is a candidate when its type is the message's, no kernel of the graph produces one of its inputs, and --
for an index op whose message states the range -- its table has the message's row count. A candidate whose index
input reads a batch column holding the message's value is confirmed by the data. The first confirmed candidate in
execution order is named (else the first candidate), the others in a note: the CPU runtime launches the kernels
that are ready in that order (measured on 2.10, tests/zoo/wide_deep_ids.py ``--raw_ids``: both lookups read the
same ids; giving one table another row count shows in the message which raised -- the first in execution order).
Nothing is named when the candidates lie in several graphs. Execution-order indexes are 0-based.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np

from ..protocol import folder as layout
from ..protocol.step_batch import read_step_batch
from .files import rank_of, read_regular_text
from .hint_text import base_kind
from .order import read_execution_order
from .origin import TensorReader
from .provenance import INDEX_OPS, fits_declared, reach
from .stop import StopPoint, _inputs_of, _producer_kernels, _SCALAR
from .stop_hints import range_in_message
from .trace import GraphTrace, NodeTrace, deepest_user_frame, read_graph_trace

_MESSAGE_OP = re.compile(r"For '(\w+)'")
_IR = re.compile(r"^ms_output_trace_code_graph_(\d+)\.ir$")


@dataclass
class Unlaunched:
    """The stop point found without a dump of the step, and the graph it lies in (its execution order and .ir
    trace)."""

    stop: StopPoint
    orders: Dict[int, List[str]]
    traces: Dict[int, GraphTrace]


@dataclass
class _Candidate:
    graph: int
    index: int
    node: NodeTrace
    rows: Optional[int]
    held: Optional[bool]      # the batch column its index reads holds the message's value (None: not known)


def kept_batch(rank_dir: Path, notes: List[str]) -> Dict[str, np.ndarray]:
    """The batch the examine pass kept when its step raised (hunt layout: beside the pass's record,
    ``<pass>/dump/rank_<r>`` -> ``<pass>/step_batch.npz``), by the train network's ``construct`` argument names
    (the .ir's graph-input names); {} when there is none, or it is another step's (a note says so)."""
    found = _raised_record(rank_dir)
    if found is None:
        return {}
    _, step, record_path = found
    kept = read_step_batch(layout.step_batch_beside(record_path))
    if kept is None:
        return {}
    if kept.global_step is not None and step is not None and kept.global_step != step:
        notes.append(f"the batch kept at {layout.step_batch_beside(record_path)} is of global step "
                     f"{kept.global_step}, not of the step that raised ({step}): not used")
        return {}
    return kept.arrays


def raised_before_dump(rank_dir: Path, reader: TensorReader, notes: List[str],
                       kept: Dict[str, np.ndarray]) -> Optional[Unlaunched]:
    """The kernel a step that raised stopped in when nothing of the step was dumped (module docstring), from the
    hunt's run-folder layout (``<pass>/dump/rank_<r>``, the record beside ``dump/``) and ``kept``, the step's batch
    (:func:`kept_batch`); None when the facts name none."""
    found = _raised_record(rank_dir)
    if found is None:
        return None
    message = found[0]
    named = _MESSAGE_OP.search(message)
    if named is None:
        return None
    op = named.group(1)
    stated = range_in_message(op, message)
    scratch: List[str] = []   # the files of graphs that are not the step's say nothing worth a warning
    candidates: List[_Candidate] = []
    graphs: Dict[int, Tuple[List[str], GraphTrace]] = {}
    for graph, ir in _graph_files(rank_dir):
        order = read_execution_order(rank_dir, graph, scratch)
        if not order:
            continue
        trace = read_graph_trace(ir, scratch)
        graphs[graph] = (order, trace)
        kernels = set(order)
        for index, name in enumerate(order):
            node = trace.nodes.get(name)
            if node is None or base_kind(node.primitive) != base_kind(op) or _producer_kernels(node, kernels):
                continue
            rows = _table_rows(node)
            if stated is not None and rows is not None and stated[0] == 0 and rows != stated[1]:
                continue
            held = _holds(node, trace, kept, stated[2]) if stated is not None else None
            if held is False:
                continue
            candidates.append(_Candidate(graph, index, node, rows, held))
    pool = [c for c in candidates if c.held] or candidates
    if not pool:
        return None
    if len({c.graph for c in pool}) > 1:
        notes.append(f"nothing of the step was dumped; {op} kernels the step could launch first lie in graphs "
                     f"{sorted({c.graph for c in pool})}: which graph the step ran is not known, so none is named")
        return None
    chosen = pool[0]
    order, trace = graphs[chosen.graph]
    point = StopPoint(chosen.graph, chosen.index, order[chosen.index], chosen.node.primitive, chosen.node, [], None,
                      False, len(order) - chosen.index - 1, ready=[c.index for c in pool])
    point.inputs = _inputs_of(point, {}, [], [], trace, set(order), reader, kept)
    point.why = _why(chosen, pool, op, stated, bool(kept))
    notes.append(point.why)
    return Unlaunched(point, {chosen.graph: order}, {chosen.graph: trace})


def names_the_stop_undumped(rank_dir: Path) -> bool:
    """Whether the pass whose dump is ``rank_dir`` recorded a step that raised, kept that step's batch
    (:func:`kept_batch`), and its graphs and that batch name the kernel the step stopped in
    (:func:`raised_before_dump`): then a dump holding nothing of the step is all a pass of its own would add."""
    kept = kept_batch(rank_dir, [])
    return bool(kept) and raised_before_dump(rank_dir, TensorReader(0, progress=False), [], kept) is not None


def _raised_record(rank_dir: Path) -> Optional[Tuple[str, Optional[int], Path]]:
    """``(message, 1-based global step, record path)`` of the pass's record of an exception (the rank's own, when
    the record names its rank), or None."""
    pass_dir = rank_dir.parent.parent
    rank = rank_of(rank_dir)
    for record_path in sorted(pass_dir.glob(layout.RECORD_GLOB)):
        try:
            record = json.loads(read_regular_text(record_path))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("rank") not in (None, rank):
            continue
        if record.get("kind") == "exception" and record.get("message"):
            step = record.get("global_step")
            return (str(record["message"]).strip().splitlines()[0],
                    int(step) if isinstance(step, int) and not isinstance(step, bool) else None, record_path)
    return None


def _graph_files(rank_dir: Path) -> List[Tuple[int, Path]]:
    """``(graph id, .ir path)`` of every kernel graph the dump config wrote, by graph id."""
    found = []
    try:
        entries = list((rank_dir / "graphs").iterdir())
    except OSError:
        return []
    for path in entries:
        match = _IR.match(path.name)
        if match:
            found.append((int(match.group(1)), path))
    return sorted(found)


def _table_rows(node: NodeTrace) -> Optional[int]:
    """Rows an index op's table has on its axis (the .ir's declared shape; the axis a constant), else None."""
    if node.primitive not in INDEX_OPS:
        return None
    table_slot = INDEX_OPS[node.primitive][0]
    declared = node.input_types.get(table_slot)
    if declared is None or not declared.shape:
        return None
    axis = 0
    if node.primitive in ("Gather", "GatherV2") and len(node.args) > 2:
        scalar = _SCALAR.match(node.args[2])
        if scalar is None:
            return None
        axis = int(float(scalar.group(2)))
    return int(declared.shape[axis % len(declared.shape)])


def _holds(node: NodeTrace, trace: GraphTrace, batch: Dict[str, np.ndarray], value: int) -> Optional[bool]:
    """Whether the batch column an index op's index reads (through ops that keep values) holds ``value``; None when
    the op is no index op or no such column's values are known (kept, and of the shape and dtype the .ir
    declares)."""
    if node.primitive not in INDEX_OPS or not batch:
        return None
    known = [r for r in reach(node, trace, [INDEX_OPS[node.primitive][1]])
             if r.kind == "batch" and r.selecting and r.name in batch
             and fits_declared(batch[r.name], trace.params.get(r.name))]
    if not known:
        return None
    return any(bool((batch[r.name] == value).any()) for r in known)


def _why(chosen: _Candidate, pool: List[_Candidate], op: str, stated: Optional[Tuple[int, int, int, bool]],
         have_batch: bool) -> str:
    """The note that says how the kernel was told: nothing dumped, the candidates, the evidence."""
    table = f" of a {chosen.rows}-row table" if chosen.rows is not None else ""
    held = (f" whose ids, read from the step's batch, hold {stated[2]}" if chosen.held and stated is not None
            else "" if have_batch else " (the step's batch was not kept: its values are not known)")
    text = (f"nothing of the step was dumped (MindSpore writes a kernel's files once it has run): the step raised in "
            f"a kernel it launches first, one whose inputs are all graph inputs, Parameters or constants; "
            f"{op}{table}{held}")
    others = [c for c in pool if c is not chosen]
    if not others:
        return text + f" is the one such kernel ({chosen.node.full_name})"
    lines = ", ".join(c.node.full_name + (f" (line {frame.line})" if frame is not None else "")
                      for c in others[:3] for frame in [deepest_user_frame([c.node.stack])[0]])
    return (text + f": {len(pool)} kernels are such, {chosen.node.full_name} is named as the first in execution "
            f"order (the runtime launches ready kernels in that order); {lines} "
            + ("would raise on the same values" if chosen.held else "could have raised instead"))
