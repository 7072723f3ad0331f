"""Group dumped tensors into operator launches, put them in execution order, and recover full scope names.

Execution order is the dump timestamps (µs, the order kernels actually ran and were dumped), merged over
the kernel graphs of the iteration. Full scope names come from ``execution_order/ms_execution_order_graph_<g>.csv``:
file names are sanitized and their ``-opN`` suffix can differ from the csv, so names are matched modulo ``-opN``
(see :func:`assign_full_names`).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple

from .files import TensorFile, element_count, normalize_dtype, read_regular_bytes, sanitize, strip_op_suffix
from .trace import NodeTrace


@dataclass
class OpLaunch:
    """One kernel launch in the dump; ``inputs``/``outputs`` map slot (0-based) to its tensor."""

    op_type: str
    file_name: str                     # sanitized op name as in the file name
    graph: int
    timestamp: int                     # earliest file timestamp of the launch (µs)
    inputs: Dict[int, TensorFile] = field(default_factory=dict)
    outputs: Dict[int, TensorFile] = field(default_factory=dict)
    full_name: Optional[str] = None    # scope name from the execution-order csv, when matched

    @property
    def name(self) -> str:
        return self.full_name or self.file_name


#: sanitized scope of the kernels the backend expands a composite op into (``Expand/_SumExt/ReduceSum``): their
#: files' ``-opN`` suffixes are not the .ir's (measured on 2.10 CPU: ``Expand__Muls_Mul``, ``Expand__SumExt_ReduceSum``,
#: ``Expand__SubScalar_Sub`` files held other suffixes' kernels), so time order, not the name, breaks their ties
_EXPANDED = "Expand_"
_OP_NAME = re.compile(r"^[\w./\-:\[\]()<>,= ]+$")


def read_execution_order(rank_dir: Path, graph: int, warnings: List[str]) -> Optional[List[str]]:
    """Full op names of graph ``graph`` in execution order (0-based positions), or None when the csv is absent,
    unreadable or not a text list of op names (each problem said in ``warnings``)."""
    path = rank_dir / "execution_order" / f"ms_execution_order_graph_{graph}.csv"
    if not path.exists():
        return None
    try:
        data = read_regular_bytes(path)
    except OSError as exc:
        warnings.append(f"could not read {path}: {exc.strerror or exc}")
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    lines = [ln.strip().strip('"') for ln in (text or "").splitlines() if ln.strip()]
    if lines and ("/" not in lines[0] and "-op" not in lines[0]):
        lines = lines[1:]          # header "NodeExecutionOrder-FullNameWithScope"
    names = [ln for ln in lines if _OP_NAME.match(ln)]
    if text is None or "\x00" in text or len(names) < len(lines):
        bad = "it is not UTF-8 text" if text is None or "\x00" in text else \
            f"{len(lines) - len(names)} of {len(lines)} lines are not op names"
        warnings.append(f"{path} is damaged ({bad}): " + (
            "op names are the sanitized file names (/ replaced by _) and source lines may be missing"
            if text is None or "\x00" in text or not names else "its unreadable lines were skipped"))
        if text is None or "\x00" in text or not names:
            return None
    return names


def group_launches(tensors: List[TensorFile]) -> List[OpLaunch]:
    """Tensors of the same op name form one launch; a repeated (io, slot) starts the next launch."""
    by_name: Dict[tuple, List[TensorFile]] = {}
    for t in tensors:
        if t.is_parameter:
            continue
        by_name.setdefault((t.graph, t.op_type, t.op_name), []).append(t)
    launches: List[OpLaunch] = []
    for (graph, op_type, op_name), files in by_name.items():
        files.sort(key=lambda t: (t.timestamp, t.io != "input", t.slot))
        current: List[OpLaunch] = []
        for t in files:
            slots = None
            for launch in current:
                slots = launch.inputs if t.io == "input" else launch.outputs
                if t.slot not in slots:
                    break
            else:
                launch = OpLaunch(op_type, op_name, graph, t.timestamp)
                current.append(launch)
                slots = launch.inputs if t.io == "input" else launch.outputs
            slots[t.slot] = t
            launch.timestamp = min(launch.timestamp, t.timestamp)
        launches.extend(current)
    launches.sort(key=lambda op: (op.timestamp, op.graph))
    return launches


def assign_full_names(launches: List[OpLaunch], orders: Dict[int, List[str]], traces=None) -> int:
    """Fill ``full_name`` from the execution-order csv of each graph; return how many launches matched.

    A launch is tied to a kernel by the facts in its own files, not by launch order (:func:`match_group`): the op
    name in its file name when that is one of the csv's names, and the element counts of its files against the
    .ir's kernel types; the files' time order fills in where a name is not the csv's (files ``AddN-op0/1``, csv
    ``AddN-op2/3``), and the .ir's data flow (a kernel runs after the kernels it reads and before those that read
    it) decides between the two only when the sizes cannot. Measured on 2.10 CPU: a double backward's files
    ``Grad_Pow/Pow-op0``/``op1`` were the .ir's own kernels by their sizes while the csv lists ``op1`` first; files
    ``Sub-op0``/``Sub-op1`` were the .ir's own though ``Sub-op1`` ran first; files ``Expand__Muls_Mul-op0``/
    ``op1`` held the .ir's ``Mul-op1``/``Mul-op0`` (the backend's expanded kernels: there time order breaks
    ties, see :data:`_EXPANDED`). A launch whose files fit no kernel of its name keeps no full
    name (its values stay evidence, under its file name, without a source line)."""
    matched = 0
    traces = traces or {}
    counts: Dict[int, Optional[int]] = {}     # id(tensor) -> elements, each file's header read once

    def count(tensor: TensorFile) -> Optional[int]:
        if id(tensor) not in counts:
            counts[id(tensor)] = element_count(tensor)
        return counts[id(tensor)]

    for graph, names in orders.items():
        trace = traces.get(graph)
        nodes = trace.nodes if trace is not None else {}
        judged: Dict[Tuple[int, str], Optional[bool]] = {}

        def fits(op: OpLaunch, name: str, judged: Dict[Tuple[int, str], Optional[bool]] = judged,
                 nodes: Dict[str, Any] = nodes) -> Optional[bool]:
            key = (id(op), name)
            if key not in judged:
                judged[key] = files_fit(op, nodes.get(name), count)
            return judged[key]

        by_base: Dict[str, List[str]] = {}
        for name in names:
            by_base.setdefault(strip_op_suffix(sanitize(name)), []).append(name)
        groups: Dict[str, List[OpLaunch]] = {}
        for op in launches:
            if op.graph == graph:
                groups.setdefault(strip_op_suffix(op.file_name), []).append(op)
        undecided: Dict[str, Tuple[Dict[int, Optional[str]], Dict[int, Optional[str]]]] = {}
        for base, ops in groups.items():
            candidates = by_base.get(base)
            if not candidates:
                continue
            chosen, other = match_group(ops, candidates, fits, names_first=not base.startswith(_EXPANDED))
            for op in ops:
                op.full_name = chosen[id(op)]
                matched += op.full_name is not None
            if other is not None:
                undecided[base] = (chosen, other)
        if trace is not None and undecided:
            _prefer_consistent(groups, undecided, trace)
    return matched


def match_group(ops: List[OpLaunch], candidates: List[str], fits: Callable[[OpLaunch, str], Optional[bool]], *,
                names_first: bool = True) -> Tuple[Dict[int, Optional[str]], Optional[Dict[int, Optional[str]]]]:
    """Tie the launches ``ops`` (time order) of one op name modulo ``-opN`` to the kernels ``candidates`` (csv
    order): ``(chosen, other)`` by ``id(op)``, ``other`` an assignment the sizes fit as well (for the data flow to
    decide), else None. ``fits(op, name)``: whether the files' sizes fit that kernel (None: nothing to compare).

    By name: a launch whose file name is a candidate's takes it (launches of one file name are one kernel run
    again); by time: the others take, in time order, the first candidate left whose sizes do not contradict them.
    The assignment with fewer size contradictions wins; on a tie the name one when ``names_first`` (else the
    time one), the other returned for the data flow to judge. A launch that fits no candidate at all gets None."""
    exact = {sanitize(c): c for c in candidates}

    def by_time(use_names: bool) -> Dict[int, Optional[str]]:
        out: Dict[int, Optional[str]] = {}
        if use_names:
            for op in ops:
                own = exact.get(op.file_name)
                if own is not None and fits(op, own) is not False:
                    out[id(op)] = own
        left = [c for c in candidates if c not in set(out.values())]
        for op in ops:
            if id(op) in out:
                continue
            pick = next((c for c in left if fits(op, c) is not False), None)
            if pick is not None:
                left.remove(pick)
            else:   # more launches than kernels left: a kernel launched again, one whose sizes the files hold
                pick = next((c for c in candidates if fits(op, c) is not False), None)
            out[id(op)] = pick
        return out

    def contradictions(assignment: Dict[int, Optional[str]]) -> int:
        return sum(1 for op in ops if assignment[id(op)] is None)

    named, timed = by_time(True), by_time(False)
    if named == timed:
        return named, None
    if contradictions(timed) < contradictions(named):
        return timed, None
    if contradictions(named) < contradictions(timed):
        return named, None
    return (named, timed) if names_first else (timed, named)


def files_fit(op: OpLaunch, node: Optional[NodeTrace],
              count: Callable[[TensorFile], Optional[int]] = element_count) -> Optional[bool]:
    """Whether ``op``'s files hold the element counts the .ir kernel ``node`` declares for their slots (outputs,
    and inputs the graph types as tensors); None when nothing can be compared (no node, no sizes, unreadable
    headers). A slot whose file is labelled with another dtype than the kernel computes is not compared (a float16
    label on float32 bytes holds twice the elements)."""
    if node is None:
        return None
    compared = False
    sides = [(op.outputs, node.kernel_output_sizes, node.kernel_output_dtypes),
             (op.inputs, {slot: size for slot, size in node.kernel_input_sizes.items() if slot in node.input_types},
              {slot: t.dtype for slot, t in node.input_types.items()})]
    for files, declared, dtypes in sides:
        for slot, tensor in files.items():
            size = declared.get(slot)
            if size is None:
                continue
            kernel_dtype = dtypes.get(slot)
            if kernel_dtype and tensor.dtype and normalize_dtype(tensor.dtype) != kernel_dtype.lower():
                continue
            held = count(tensor)
            if held is None:
                continue
            if held != size:
                return False
            compared = True
    return True if compared else None


def _prefer_consistent(groups: Dict[str, List[OpLaunch]],
                       undecided: Dict[str, Tuple[Dict[int, Optional[str]], Dict[int, Optional[str]]]],
                       trace) -> None:
    """For each name in ``undecided`` (``(chosen, other)`` assignments the sizes fit equally well), take the other
    one when it puts fewer kernels before what they read (or after what reads them), per the .ir's data flow."""
    readers: Dict[str, List[str]] = {}
    for node in trace.nodes.values():
        for producer in node.input_nodes.values():
            readers.setdefault(producer.full_name, []).append(node.full_name)
    when = {op.full_name: op.timestamp for ops in groups.values() for op in ops if op.full_name}

    def violations(assignment: Dict[int, Optional[str]], ops: List[OpLaunch]) -> int:
        times = dict(when)
        for op in ops:
            times.pop(op.full_name or "", None)
        for op in ops:
            name = assignment[id(op)]
            if name is not None:
                times[name] = op.timestamp
        count = 0
        for op in ops:
            name, t = assignment[id(op)], op.timestamp
            if name is None:
                continue
            node = trace.nodes.get(name)
            if node is not None:
                count += sum(1 for p in node.input_nodes.values() if times.get(p.full_name, -1) > t)
            count += sum(1 for r in readers.get(name, ()) if r in times and times[r] < t)
        return count

    for base, (chosen, other) in undecided.items():
        ops = groups[base]
        if violations(other, ops) < violations(chosen, ops):
            for op in ops:
                op.full_name = other[id(op)]
