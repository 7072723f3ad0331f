"""A kept training state as the dump analysis reads it: the Parameters as the dumped step began (the ``state/`` of
a ``mindguard hunt`` pass), for an outputs-only dump's Parameter inputs (``analyze_dump(state=...)``)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

from ..errors import ArgumentError
from ..protocol import folder as layout
from .evidence import parameters_written_by
from .files import TensorFile, sanitize
from .origin import StepState
from .trace import GraphTrace


def kept_state(directory: Path) -> "KeptState":
    """The Parameters of a kept training state (``state.json`` names, arrays ``p<i>`` of ``state.npz`` or their
    statistics) as tensor files by sanitized name; refused when ``directory`` holds none."""
    from ..protocol.kept_state import read_state_meta

    meta = read_state_meta(directory)
    if meta is None or not layout.state_arrays(directory).is_file():
        raise ArgumentError(f"state={str(directory)!r}: no kept training state there (state.json and state.npz, "
                            f"as a mindguard hunt pass writes them in its state/ folder); pass that folder or None")
    names, shapes = meta.get("names"), meta.get("shapes")
    if not isinstance(names, list) or not isinstance(shapes, list) or len(names) != len(shapes):
        raise ArgumentError(f"state={str(directory)!r}: its state.json has no matching names/shapes lists (a damaged "
                            f"or foreign file); pass the state/ folder a mindguard hunt pass wrote, or None")
    summarized = meta.get("summarized")
    stats: Dict[str, Any] = summarized if isinstance(summarized, dict) else {}
    listed = meta.get("files")
    own_files: Dict[str, Any] = listed if isinstance(listed, dict) else {}
    files = {sanitize(name): _kept_array(directory, i, name, stats.get(str(i)), str(i) in own_files)
             for i, name in enumerate(names)}
    return KeptState(files, {str(n): [int(d) for d in sh] for n, sh in zip(names, shapes)}, meta.get("step"),
                     directory)


def _kept_array(directory: Path, index: int, name: str, stats: Any, own_file: bool) -> TensorFile:
    """Parameter ``name``: array ``p<index>`` of the state's ``state.npz``, or its file of its own ``p<index>.npy``
    (``own_file``: a big array, read memory-mapped), or -- a big array of a state written for its dumped step's
    analysis (``state.json``'s ``summarized``) -- its statistics, as a statistic dump gives them."""
    if isinstance(stats, dict):
        return TensorFile("Parameter", name, "0", "0", 0, "input", 0, "DefaultFormat", stats.get("dtype"), None,
                          stats=stats)
    if own_file:
        return TensorFile("Parameter", name, "0", "0", 0, "input", 0, "DefaultFormat", None,
                          layout.state_array_file(directory, index))
    return TensorFile("Parameter", name, "0", "0", 0, "input", 0, "DefaultFormat", None,
                      layout.state_arrays(directory), member=f"p{index}")


@dataclass
class KeptState:
    files: Dict[str, TensorFile]
    shapes: Dict[str, List[int]]
    step: Any
    directory: Path

    def check_against(self, traces: Dict[int, GraphTrace]) -> None:
        """Refuse a state whose Parameters have other shapes than the dumped graphs', or none of their names
        (another model or run)."""
        declared = {name for trace in traces.values() for name in trace.params if name not in trace.graph_inputs}
        absent = sorted(declared - set(self.shapes))
        # a step's graph may read Parameters the kept state does not hold (an accumulator's buffers beside the
        # network's and optimizer's) and not read some it holds (the optimizer's moments, in a micro-step that does
        # not update): a state of another training shares none of its names (shared names must agree in shape)
        if declared and not declared & set(self.shapes):
            raise ArgumentError(f"state={str(self.directory)!r} lacks {len(absent)} of the dumped graph's "
                                f"{len(declared)} Parameters (e.g. {absent[0]!r}): it is not of this training; pass "
                                f"the state kept at the dumped step (the state/ folder beside the pass's dump), "
                                f"or None")
        for trace in traces.values():
            for name, declared_type in trace.params.items():
                kept = self.shapes.get(name)
                if kept is not None and declared_type.shape and list(declared_type.shape) != kept:
                    raise ArgumentError(
                        f"state={str(self.directory)!r}: Parameter {name!r} has shape {kept} there but "
                        f"{list(declared_type.shape)} in the dumped graph: the state is not of this training; pass the "
                        f"state kept at the dumped step (the state/ folder beside the pass's dump), or None")


def step_state(kept: "KeptState", orders: Dict[int, List[str]], traces: Dict[int, GraphTrace],
               notes: List[str]) -> StepState:
    """The kept Parameters with where, in each graph's execution order, a kernel first writes each in place."""
    kept.check_against(traces)
    notes.append(f"Parameter inputs read as the step began, from the training state kept at global step {kept.step} "
                 f"({kept.directory})")
    state = StepState(kept.files)
    for graph, names in orders.items():
        state.positions[graph] = {name: i for i, name in enumerate(names)}
        trace = traces.get(graph)
        for i, name in enumerate(names):
            node = trace.nodes.get(name) if trace is not None else None
            for param in (parameters_written_by(node) if node is not None else ()):
                seen = state.first_write.setdefault(param, (graph, i, name))
                if seen[0] != graph:
                    state.first_write[param] = (None, -1, seen[2])
    return state
