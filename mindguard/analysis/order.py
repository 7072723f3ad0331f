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
from typing import Dict, List, Optional

from .files import TensorFile, read_regular_bytes, sanitize, strip_op_suffix


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

    Names are matched modulo ``-opN``: the k-th launch by timestamp gets the k-th csv entry of its name. When a
    name's files carry exactly the csv's suffixes, the files' own suffixes are the other candidate, and with the
    graph's .ir (``traces``, by graph) the one whose data flow keeps time is taken: a kernel runs after the kernels
    it reads and before those that read it. Measured on 2.10 CPU, either can be the right one: files ``Sub-op0``/
    ``Sub-op1`` were the .ir's own ``Sub-op0``/``Sub-op1`` though ``Sub-op1`` ran first, and files
    ``Expand__Muls_Mul-op0``/``op1`` held the .ir's ``Mul-op1``/``Mul-op0`` (by shape). Ties keep time order."""
    matched = 0
    traces = traces or {}
    for graph, names in orders.items():
        by_base: Dict[str, List[str]] = {}
        for name in names:
            by_base.setdefault(strip_op_suffix(sanitize(name)), []).append(name)
        groups: Dict[str, List[OpLaunch]] = {}
        for op in launches:
            if op.graph == graph:
                groups.setdefault(strip_op_suffix(op.file_name), []).append(op)
        by_suffix: Dict[str, Dict[str, str]] = {}   # base -> file name -> csv name, when the suffixes are the csv's
        for base, ops in groups.items():
            candidates = by_base.get(base)
            if not candidates:
                continue
            for k, op in enumerate(ops):
                op.full_name = candidates[k] if k < len(candidates) else candidates[-1]
                matched += 1
            exact = {sanitize(c): c for c in candidates}
            if len(candidates) > 1 and {op.file_name for op in ops} == set(exact):
                by_suffix[base] = exact
        trace = traces.get(graph)
        if trace is not None and by_suffix:
            _prefer_consistent(groups, by_suffix, trace)
    return matched


def _prefer_consistent(groups: Dict[str, List[OpLaunch]], by_suffix: Dict[str, Dict[str, str]], trace) -> None:
    """For each name in ``by_suffix``, use the files' own suffixes instead of time order when that puts fewer
    kernels before what they read (or after what reads them), per the .ir's data flow."""
    readers: Dict[str, List[str]] = {}
    for node in trace.nodes.values():
        for producer in node.input_nodes.values():
            readers.setdefault(producer.full_name, []).append(node.full_name)
    when = {op.full_name: op.timestamp for ops in groups.values() for op in ops if op.full_name}

    def violations(assignment: Dict[int, str], ops: List[OpLaunch]) -> int:
        times = dict(when)
        for op in ops:
            times.pop(op.full_name, None)
        for op in ops:
            times[assignment[id(op)]] = op.timestamp
        count = 0
        for op in ops:
            name, t = assignment[id(op)], op.timestamp
            node = trace.nodes.get(name)
            if node is not None:
                count += sum(1 for p in node.input_nodes.values() if times.get(p.full_name, -1) > t)
            count += sum(1 for r in readers.get(name, ()) if r in times and times[r] < t)
        return count

    for base, exact in by_suffix.items():
        ops = groups[base]
        by_time = {id(op): op.full_name for op in ops}
        own = {id(op): exact[op.file_name] for op in ops}
        if own != by_time and violations(own, ops) < violations(by_time, ops):
            for op in ops:
                op.full_name = own[id(op)]
