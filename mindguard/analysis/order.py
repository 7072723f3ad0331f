"""Group dumped tensors into operator launches, put them in execution order, and recover full scope names.

Execution order is the dump timestamps (µs, the order kernels actually ran and were dumped), merged over
the kernel graphs of the iteration. Full scope names come from ``execution_order/ms_execution_order_graph_<g>.csv``:
file names are sanitized and their ``-opN`` suffix can differ from the csv, so names are matched modulo
``-opN``, then the k-th launch (by timestamp) of a name gets the k-th csv entry of that name.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

from .files import TensorFile, sanitize, strip_op_suffix


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


def read_execution_order(rank_dir: Path, graph: int, warnings: List[str]) -> Optional[List[str]]:
    path = rank_dir / "execution_order" / f"ms_execution_order_graph_{graph}.csv"
    if not path.is_file():
        return None
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as exc:
        warnings.append(f"could not read {path}: {exc}")
        return None
    names = [ln.strip().strip('"') for ln in lines if ln.strip()]
    if names and ("/" not in names[0] and "-op" not in names[0]):
        names = names[1:]          # header "NodeExecutionOrder-FullNameWithScope"
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


def assign_full_names(launches: List[OpLaunch], orders: Dict[int, List[str]]) -> int:
    """Fill ``full_name`` from the execution-order csv of each graph; return how many launches matched."""
    matched = 0
    for graph, names in orders.items():
        by_base: Dict[str, List[str]] = {}
        exact = {}
        for name in names:
            by_base.setdefault(strip_op_suffix(sanitize(name)), []).append(name)
            exact[sanitize(name)] = name
        seen: Dict[str, int] = {}
        for op in launches:
            if op.graph != graph:
                continue
            base = strip_op_suffix(op.file_name)
            candidates = by_base.get(base)
            if candidates:
                k = seen.get(base, 0)
                seen[base] = k + 1
                op.full_name = candidates[k] if k < len(candidates) else exact.get(op.file_name, candidates[-1])
                matched += 1
    return matched
