"""``analyze_dump``: read one iteration of a dump and return the :class:`~.model.DumpReport` (``str(report)``
for people, ``to_dict()`` for tools).

Iteration ids are MindSpore's 0-based dump iteration ids (``FailureRecord.dump_iteration``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from .._util.ranges import format_ranges
from .callsite import forward_instance
from .counts import annotate_counts
from .files import (IterationFiles, TensorFile, in_time_window, is_batch_input, iteration_dirs, list_iteration,
                    rank_of, resolve_dump_path, sanitize)
from .flow import _consumers, data_flow
from .hints import hint_for, origin_hint, stop_hint
from .provenance import (INDEX_OPS, SELECTING, BatchValues, is_overflow, learning_rate, load, lr_entry, trace_batch,
                         trained_weights)
from .domain import nonfinite_rows
from ..report.model import SCHEMA, DumpReport, Finding, has_culprit
from .order import OpLaunch, assign_full_names, group_launches, read_execution_order
from .evidence import COLLECTIVE_TYPES, parameters_written_by
from .origin import OpFinding, StepState, TensorReader, is_backward, search
from .stop import as_finding, dump_settings, find_stop, run_folder_evidence
from .trace import GraphTrace, NodeTrace, deepest_user_frame, read_graph_trace, reads_from
from ..errors import ArgumentError, DumpNotFoundError
from ..protocol import folder as layout

__all__ = ["analyze_dump", "DumpReport", "Finding", "has_culprit", "SCHEMA"]


def analyze_dump(path: Union[str, Path], *, iteration: Optional[int] = None, rank: Optional[int] = None,
                 time_window: Optional[Tuple[int, int]] = None, progress: bool = True,
                 state: Union[str, Path, None] = None, writer_ended: bool = False) -> DumpReport:
    """Find the first operator that turned finite inputs into Inf/NaN in a MindSpore dump.

    ``path``: the dump root (holding ``rank_*``), a rank directory or an iteration directory.
    ``iteration``: 0-based dump iteration id; None analyses the only (or last) one dumped.
    ``rank``: analyse one rank; None analyses all and says which rank went non-finite first.
    ``time_window``: ``(start_us, end_us)``, inclusive, in epoch microseconds (``time.time_ns() // 1000``
    around the step): tensor files of the iteration dumped outside it are ignored, and a note says how many
    (two steps of different graphs can be dumped into one iteration directory). The kernel graphs of the
    iteration that fall in the window are still merged.
    ``progress``: print progress to stderr on long analyses.
    ``state``: a folder holding the training state kept at the beginning of the dumped step (the ``state/`` of a
    ``mindguard hunt`` pass: ``state.json`` + ``state.npz``); an outputs-only dump's Parameter inputs are then read
    as the step began instead of from the ``Parameter`` files (the values after the step), or at all when the dump
    left those files out.
    ``writer_ended``: the process that wrote the dump has ended (``mindguard hunt`` analysing its own pass), so the
    last iteration is not waited on to stop changing (``mindguard analyze`` on a live training waits).
    """
    if iteration is not None and (isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0):
        raise ArgumentError(f"iteration={iteration!r}: must be a 0-based dump iteration id (int >= 0, not a bool) or "
                         f"None for the only/last one dumped, e.g. iteration=3")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ArgumentError(f"rank={rank!r}: must be a rank id (int >= 0, not a bool, as in the rank_<id> directory "
                         f"names) or None for all ranks, e.g. rank=0")
    time_window = _check_time_window(time_window)
    rank_dirs, pinned = resolve_dump_path(Path(path))
    if pinned is not None and iteration is None:
        iteration = pinned[2]
    if rank is not None:
        chosen = [d for d in rank_dirs if rank_of(d) == rank]
        if not chosen:
            raise DumpNotFoundError(f"rank={rank}: no rank_{rank} in {str(path)!r}; ranks present: "
                                    f"{[rank_of(d) for d in rank_dirs]}")
        rank_dirs = chosen
    kept = _kept_state(Path(state)) if state is not None else None
    if kept is not None and len(rank_dirs) > 1:
        raise ArgumentError(f"state={str(state)!r} is one process's training state, but {str(path)!r} holds "
                            f"{len(rank_dirs)} ranks; pass rank=N (--rank N) for the rank that kept it")
    reports = [_analyze_rank(d, iteration, progress, time_window, kept, writer_ended) for d in rank_dirs]
    shown = str(Path(path).expanduser().resolve())
    if len(reports) == 1:
        reports[0].dump = shown
        return reports[0]
    return _combine(shown, reports)


def _check_time_window(window: Any) -> Optional[Tuple[int, int]]:
    """``(start_us, end_us)`` as ints, or None; anything else is refused naming the rule."""
    if window is None:
        return None
    ok = isinstance(window, (tuple, list)) and len(window) == 2 and all(
        isinstance(v, (int, float)) and not isinstance(v, bool) and v >= 0 for v in window)
    if not ok or window[0] > window[1]:
        raise ArgumentError(f"time_window={window!r}: must be (start_us, end_us) with 0 <= start_us <= end_us, in "
                            f"epoch "
                         f"microseconds like the dump file names' timestamps, e.g. (t0, t1) from "
                         f"time.time_ns() // 1000 before and after the step; or None for every file")
    return int(window[0]), int(window[1])


def _kept_state(directory: Path) -> "_KeptState":
    """The Parameters of a kept training state (``state.json`` names, arrays ``p<i>`` of ``state.npz`` or their
    statistics) as tensor files by sanitized name; refused when ``directory`` holds none."""
    from ..training.resume import read_state_meta

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
    return _KeptState(files, {str(n): [int(d) for d in sh] for n, sh in zip(names, shapes)}, meta.get("step"),
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
class _KeptState:
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


def _step_state(kept: "_KeptState", orders: Dict[int, List[str]], traces: Dict[int, GraphTrace],
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


def _analyze_rank(rank_dir: Path, iteration: Optional[int], progress: bool,
                  time_window: Optional[Tuple[int, int]] = None,
                  kept: Optional["_KeptState"] = None, writer_ended: bool = False) -> DumpReport:
    warnings: List[str] = []
    rank = rank_of(rank_dir)
    available = iteration_dirs(rank_dir, warnings)
    report = DumpReport(dump=str(rank_dir), rank=rank, graph=None, iteration=iteration,
                        iterations=sorted(available), warnings=warnings)
    if not available:
        warnings.append(f"rank {rank}: no <net>/<graph>/<iteration> directories under {rank_dir} (did MindSpore "
                        f"fail to write the dump, or did training stop before the dumped iteration?)")
        report.analysed = False
        return report
    if iteration is None and time_window is not None:
        # one step's graphs can carry different iteration ids (a grad graph and an optimizer graph run as 3 and 4):
        # the step is every file written during its window, whatever directory it is in
        within = {it: ds for it, ds in available.items() if _any_in_window(ds, time_window)}
        if within:
            report.iteration = min(within)
            dirs = [d for it in sorted(within) for d in within[it]]
            return _analyze_files(report, rank_dir, rank, min(within), dirs, warnings, progress, time_window, kept,
                                  writer_ended)
    if iteration is None:
        iteration = max(available)
        if len(available) > 1:
            warnings.append(f"rank {rank}: iterations {_ranges(sorted(available))} were dumped; analysed the last, "
                            f"{iteration} (pass iteration=N / --iteration N for another)")
    elif iteration not in available:
        raise DumpNotFoundError(f"iteration={iteration}: not dumped for rank {rank} in {rank_dir}; dumped iterations: "
                                f"{_ranges(sorted(available))}")
    report.iteration = iteration
    return _analyze_files(report, rank_dir, rank, iteration, available[iteration], warnings, progress, time_window,
                          kept, writer_ended)


def _any_in_window(dirs, time_window: Tuple[int, int]) -> bool:
    from .files import file_timestamp_us

    start, end = time_window
    for _, _, directory in dirs:
        try:
            names = os.listdir(directory)
        except OSError:
            continue
        if any(start <= (file_timestamp_us(name) or -1) <= end for name in names):
            return True
    return False


def _analyze_files(report: DumpReport, rank_dir: Path, rank: int, iteration: int, dirs, warnings: List[str],
                   progress: bool, time_window: Optional[Tuple[int, int]],
                   kept: Optional["_KeptState"] = None, writer_ended: bool = False) -> DumpReport:
    files = _collect(rank_dir, rank, iteration, dirs, warnings, report.notes, time_window, report.excluded,
                     writer_ended)
    report.graphs = files.graphs
    report.graph = files.graphs[0] if files.graphs else None
    report.overflow_records = [str(p) for p in files.overflow_records]
    if files.overflow_records:
        warnings.append(f"{len(files.overflow_records)} Ascend overflow record(s) (Opdebug.Node_OpDebug.*) present: "
                        f"the device flagged an overflow in this iteration; see overflow_records")

    orders: Dict[int, List[str]] = {}
    traces: Dict[int, GraphTrace] = {}
    for g in files.graphs:
        names = read_execution_order(rank_dir, g, warnings)
        if names is None:
            if not (rank_dir / "execution_order" / f"ms_execution_order_graph_{g}.csv").exists():
                warnings.append(f"execution_order/ms_execution_order_graph_{g}.csv missing: op names are the "
                                f"sanitized file names (/ replaced by _)")
        else:
            orders[g] = names
        ir = rank_dir / "graphs" / f"ms_output_trace_code_graph_{g}.ir"
        if ir.exists():
            traces[g] = read_graph_trace(ir, warnings)
        else:
            warnings.append(f"graphs/ms_output_trace_code_graph_{g}.ir missing: no source lines for graph {g}")

    launches = group_launches(files.tensors)
    assign_full_names(launches, orders, traces)
    if not any(t.stats is None for t in files.tensors) and files.tensors:
        warnings.append("statistic dump: analysed from statistic.csv without reading tensors")
    batch = sorted((t for t in files.tensors if t.is_parameter and is_batch_input(t.op_name)),
                   key=lambda t: t.op_name)
    reader = TensorReader(sum(1 for t in files.tensors if t.stats is None), progress=progress)
    settings = dump_settings(rank_dir)
    params = {t.op_name: t for t in files.tensors if t.is_parameter}
    outputs_only = str(settings.get("input_output", 0)) == "2"
    result = search(launches, traces, reader, batch,
                    expect_outputs=str(settings.get("input_output", 0)) in ("0", "2"),
                    params=params if outputs_only else None,
                    state=_step_state(kept, orders, traces, report.notes) if kept is not None and outputs_only
                    else None,
                    orders=orders if outputs_only and settings.get("kernels") else None)
    warnings.extend(result.warnings)
    report.excluded.extend(result.excluded)
    report.ops_analyzed = result.ops_total
    report.nonfinite_inputs = result.nonfinite_inputs
    report.fp16_risk = result.fp16_risk
    report.computes_in_half = computes_in_half(traces, files.tensors)
    report.profile = result.profile
    if result.origin is not None:
        report.origin = _describe(result.origin, traces, with_hint=True)
        twins = _same_debug_info(result.origin, traces)
        call = site = None
        if twins and report.origin.source:
            line = report.origin.source["line"]
            call = _call_site_of_input(result.origin, _shown_frame(result.origin, traces), traces)
            if call is not None:   # the line that computes its argument also calls this op: that call is it
                report.origin = _describe(result.origin, traces, with_hint=True, frame=call)
            inputs = _input_lines(result.origin, line)
            report.notes.append(
                f"the .ir gives {len(twins) + 1} kernels of this op the same source line "
                f"({', '.join(n.rsplit('/', 1)[-1] for n in [result.origin.op.name, *twins][:4])}, line {line}): "
                f"MindSpore keeps the first call's debug info when a function or cell is called more than once"
                + (f"; this kernel's input comes from {inputs}" if inputs else "")
                + (f", which calls {result.origin.op.op_type} too, so line {call.line} is shown"
                   if call is not None else f", so line {line} may be another call's")
                + ". In PyNative mode the hunt replays the step eagerly and names the exact call")
        elif report.origin.source:
            site = _repeated_call(result.origin, traces)
            if site is not None:
                report.origin = _describe(result.origin, traces, with_hint=True, frame=site[0])
                report.notes.append(f"the .ir gives this kernel another call's line (MindSpore keeps one debug info "
                                    f"for a cell or function called more than once); {site[1]}")
        report.origin.reached = result.reached
        placed = (twins and call is not None) or (not twins and site is not None)
        shared = None if placed else _place_shared_call(report.origin.to_dict(), result.origin, traces)
        if shared is not None:
            report.origin.stack, report.origin.extra["call_sites"] = shared["stack"], shared["call_sites"]
    if result.first_nonfinite is not None:
        report.first_nonfinite = _describe(result.first_nonfinite, traces, with_hint=False)
    stop = find_stop(launches, files.tensors, orders, traces, settings, reader, warnings, report.notes,
                     message=run_folder_evidence(rank_dir, iteration)["message"])
    if stop is not None:
        report.stopped_at = _describe_stop(stop, traces, rank_dir, iteration, report.origin, orders)
        warnings.extend(stop.warnings)
    _trace_to_origin(report, result, stop, traces, BatchValues(files.tensors, launches, reader.unreliable), params,
                     kept)
    report.data_flow = data_flow(traces, result.launched, origin=result.origin,
                                 origin_source=report.origin.source if report.origin is not None else None,
                                 stop=stop,
                                 stop_source=report.stopped_at["op"].get("source") if stop and report.stopped_at
                                 else None,
                                 first=result.first_nonfinite, reached=result.reached if result.origin else None,
                                 nonfinite_inputs=report.nonfinite_inputs)
    _mark_origin_nodes(report)
    report.unusable_files = reader.skipped
    report.analysed = reader.read > 0
    if not report.analysed:
        warnings.append(f"rank {rank}, iteration {iteration}: no tensor file could be used "
                        f"({len(files.tensors)} listed, {reader.skipped} unusable): nothing was analysed")
    elif not report.holds_nonfinite:
        warnings.append(f"no NaN/Inf in iteration {iteration} of rank {rank}: is this the failing iteration? "
                        f"(dumped: {_ranges(report.iterations)})")
    return report


def _trace_to_origin(report: DumpReport, result, stop, traces: Dict[int, GraphTrace], values: BatchValues,
                     params: Dict[str, TensorFile], kept: Optional["_KeptState"]) -> None:
    """``traced_to`` (:mod:`.provenance`) on the origin and on the op a raising step stopped in, the hint put to the
    origin first; the rows of a batch input that held Inf/NaN from the start."""
    for item in report.nonfinite_inputs:
        if item.get("source") != "batch":
            continue
        tensor = params.get(str(item.get("name")))
        array = load(tensor, values.unreliable) if tensor is not None else None
        found = nonfinite_rows(array) if array is not None else None
        if found is not None:
            item.update(rows=found.rows, row_count=found.row_count, rows_total=found.rows_total,
                        text=f"batch column `{item['name']}`: {found.describe()}")
    origin = result.origin
    if origin is not None and report.origin is not None and not report.origin.received and origin.trace is not None \
            and origin.op.graph in traces:
        trace, node = traces[origin.op.graph], origin.trace
        slots = sorted(set(node.input_nodes) | set(node.input_params))
        traced = _traced_by_index(node, trace, origin.op.graph, origin.op.op_type, origin.inputs, values) \
            or trace_batch(node, trace, origin.op.graph, origin.op.op_type, slots, values)
        if not traced and is_overflow(origin.inputs, origin.outputs):
            weights = trained_weights(node, trace, slots)
            lr = learning_rate(params, kept.files if kept is not None else None) if weights else None
            if lr is not None:
                traced = [lr_entry(lr, origin.op.op_type, weights)]
        if traced:
            report.origin.extra["traced_to"] = traced
            report.origin.hint = origin_hint(traced, report.origin.hint, origin.op.op_type) or report.origin.hint
    if stop is not None and report.stopped_at is not None and stop.node is not None and stop.graph in traces:
        trace, node = traces[stop.graph], stop.node
        traced = _traced_by_index(node, trace, stop.graph, stop.op_type, stop.inputs, values)
        if not traced:
            slots = sorted(set(node.input_nodes) | set(node.input_params))
            traced = trace_batch(node, trace, stop.graph, stop.op_type, slots, values)
        if traced:
            report.stopped_at["traced_to"] = traced
            report.stopped_at["hint"] = origin_hint(traced, report.stopped_at.get("hint"), stop.op_type) \
                or report.stopped_at.get("hint")


def _mark_origin_nodes(report: DumpReport) -> None:
    """The data-flow graph's batch nodes the culprit was traced to get ``origin`` (the text), as the page shows it."""
    if report.data_flow is None:
        return
    traced = list((report.origin.get("traced_to") if report.origin is not None else None) or []) \
        + list((report.stopped_at or {}).get("traced_to") or [])
    nodes = {n["id"]: n for n in report.data_flow.get("nodes") or []}
    for item in traced:
        node = nodes.get(f"input:{item.get('name')}")
        if node is not None and item.get("kind") == "batch":
            node["origin"] = item.get("text")


def _traced_by_index(node: NodeTrace, trace: GraphTrace, graph: int, op_type: str, inputs: List[Dict[str, Any]],
                     values: BatchValues) -> List[Dict[str, Any]]:
    """For an index op (a Gather of a table): the batch columns its index is read from, against the table's rows."""
    if op_type not in INDEX_OPS:
        return []
    table_slot, index_slot = INDEX_OPS[op_type]
    by_slot = {int(i["slot"]): i for i in inputs if "slot" in i}
    shape = (by_slot.get(table_slot) or {}).get("shape")
    declared = node.input_types.get(table_slot)
    if not shape and declared is not None:
        shape = declared.shape
    if not shape:
        return []
    axis_stats = by_slot.get(2) if op_type in ("Gather", "GatherV2") else None
    axis = int(axis_stats.get("max") or 0) if axis_stats and isinstance(axis_stats.get("max"), (int, float)) else 0
    rows = int(shape[axis % len(shape)])
    table = (by_slot.get(table_slot) or {}).get("parameter") or node.input_params.get(table_slot) or "the table"
    return trace_batch(node, trace, graph, op_type, [index_slot], values, index_rows=rows, index_slot=index_slot,
                       reader=f"`{table}`")


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


def _collect(rank_dir: Path, rank: int, iteration: int, dirs, warnings: List[str],
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


def computes_in_half(traces: Dict[int, GraphTrace], tensors: List[TensorFile]) -> bool:
    """Whether the step computes anything in float16/bfloat16: a kernel's output dtype or an input type in the .ir
    (the dtypes it computes in), else -- without a readable .ir -- a dumped file's dtype. An fp32 run gets no fp16
    range note printed: its values under 2^-24 or over 65504 are no risk there (the JSON keeps them)."""
    half = ("float16", "bfloat16")
    if traces:
        return any(d in half for t in traces.values() for n in t.nodes.values()
                   for d in [*n.kernel_output_dtypes.values(), *(x.dtype for x in n.input_types.values())])
    return any(str(t.dtype).lower() in half for t in tensors)


def _top_scope(op_name: str) -> str:
    """``Gradients_Default_network-WithLossCell__backbone...`` -> ``network-WithLossCell``-ish first cell scope."""
    parts = [p for p in re.split(r"_(?=[A-Za-z]+-)", op_name) if p]
    for p in parts:
        if "-" in p and not p.startswith(("Gradients", "Default")):
            return p.split("_")[0]
    return parts[0].split("_")[0] if parts else op_name


def _same_debug_info(finding: OpFinding, traces: Dict[int, GraphTrace]) -> List[str]:
    """Other kernels of ``finding``'s graph with its primitive and ``unique_id`` (one primal node inlined twice:
    they share its source lines)."""
    node = finding.trace
    trace = traces.get(finding.op.graph)
    if node is None or trace is None or not node.unique_id:
        return []
    return [other.full_name for other in trace.nodes.values() if other is not node and other.unique_id ==
            node.unique_id and other.primitive == node.primitive and other.forward_unique_id is None]


def _input_lines(finding: OpFinding, shown: int) -> str:
    """Where ``finding``'s inputs were computed, by their producers' own user frames (``"Sub-op1 on line 67
    (`...`)"``), leaving out producers on line ``shown``; ``""`` when none is known."""
    node = finding.trace
    out = []
    for producer in (node.input_nodes.values() if node is not None else ()):
        frame, _ = deepest_user_frame([producer.stack])
        if frame is not None and frame.line != shown:
            out.append(f"{producer.full_name.rsplit('/', 1)[-1]} on line {frame.line} (`{frame.code.strip()}`)")
    return ", ".join(out[:2])


_CALLEE = re.compile(r"([A-Za-z_][\w.]*)\s*\(")


def _call_site_of_input(finding: OpFinding, shown: Any, traces: Dict[int, GraphTrace]):
    """For a kernel that is not the first in the .ir with its ``unique_id`` (a later call of a function or cell
    called more than once, shown with the first call's frame ``shown``): the line of the call that fed it, by data
    flow -- the nearest producer of its inputs (looking through producers on the shown line, the shared code inside
    the called cell) whose line calls what the shown line calls (``self.ent(t[:, 2])`` after ``self.ent(t[:, 0])``,
    ``ops.log(1.0 - p)`` after ``ops.log(p)``) or the op itself. ``None`` when no such producer is found."""
    node = finding.trace
    trace = traces.get(finding.op.graph)
    if node is None or trace is None or shown is None or (
            node.unique_id is not None and trace.by_unique_id.get(node.unique_id) is node):
        return None
    callees = set(_CALLEE.findall(shown.code))
    op_type = finding.op.op_type.lower()
    todo, seen = [(n, 0) for _, n in sorted(node.input_nodes.items())], set()
    while todo:
        producer, depth = todo.pop(0)
        if id(producer) in seen or depth > 8:
            continue
        seen.add(id(producer))
        frame, _ = deepest_user_frame([producer.stack])
        if frame is None or (frame.file, frame.line) == (shown.file, shown.line):
            todo.extend((n, depth + 1) for _, n in sorted(producer.input_nodes.items()))
            continue
        called = set(_CALLEE.findall(frame.code))
        if callees & called or any(c.rsplit(".", 1)[-1].lower() == op_type for c in called) \
                or (node.code_candidate and _applies_operator(frame.code, op_type)):
            return frame
    return None


#: the Python operator that computes an op type, for a kernel the .ir places only by a code candidate
_OPERATORS = {"mul": re.compile(r"(?<![*])\*(?![*=])"), "muls": re.compile(r"(?<![*])\*(?![*=])"),
              "add": re.compile(r"\+(?!=)"), "adds": re.compile(r"\+(?!=)"),
              "sub": re.compile(r"(?<![eE(,=\s])\s*-\s(?!=)|\w\s*-\s*[\w(]"),
              "realdiv": re.compile(r"(?<!/)/(?![/=])"), "div": re.compile(r"(?<!/)/(?![/=])"),
              "pow": re.compile(r"\*\*")}


def _applies_operator(code: str, op_type: str) -> bool:
    """Whether the source line ``code`` applies ``op_type`` as a Python operator (``a * b`` for Mul)."""
    pattern = _OPERATORS.get(op_type)
    return bool(pattern and pattern.search(code.split("#", 1)[0]))


def _repeated_call(finding: OpFinding, traces: Dict[int, GraphTrace], *, by_order: bool = True):
    """``(frame, why)`` for a kernel the .ir gives another call's line: MindSpore keeps one debug info for the
    calls of one cell or function in a ``construct`` (measured on 2.10: both ``self.entity_embedding(...)`` calls of
    one construct, and every ``positive[:, k]`` of it, carry the first call's line, with distinct unique ids). By data
    flow first (:func:`_call_site_of_input`); else by order: the forward kernels of this op type and scope shown on
    the same line are the calls of that callee from the shown line on, in program order, so the k-th of them is the
    k-th call of the callee in the function's source from that line. ``None`` when neither tells."""
    shown = _shown_frame(finding, traces)
    node, trace = finding.trace, traces.get(finding.op.graph)
    if shown is None or node is None or trace is None:
        return None
    call = _call_site_of_input(finding, shown, traces)
    if call is not None:
        if node.code_candidate and _applies_operator(call.code, finding.op.op_type.lower()):
            return call, (f"line {call.line}, which computes its input and applies the op's operator too (the .ir "
                          f"places this expanded kernel only by a code candidate, line {shown.line})")
        return call, f"line {call.line}, which computes its input and calls it too"
    if not by_order:
        return None
    if _shared_by_data_flow(finding, traces):   # a shared cell whose calls the data flow tells apart (or lists)
        return None
    forward = trace.forward_of(node) if is_backward(finding.op, node) else node
    if forward is None:
        return None
    scope = forward.full_name.rsplit("/", 1)[0]
    twins = [n for n in trace.nodes.values() if n.primitive == forward.primitive and not n.is_backward
             and n.full_name.rsplit("/", 1)[0] == scope and _same_frame(deepest_user_frame([n.stack])[0], shown)]
    if len(twins) < 2 or forward not in twins:
        return None
    calls = _calls_from(shown, _callee(shown.code, scope, forward.primitive))
    k = twins.index(forward)
    if not 0 < k < len(calls):
        return None
    line, code = calls[k]
    from .trace import Frame

    return Frame(shown.file, line, code), (
        f"{len(twins)} {forward.primitive} kernels of {scope.rsplit('/', 1)[-1]} carry line {shown.line}; this is "
        f"the call {k + 1} of {len(twins)} in program order, the {_ordinal(k + 1)} call of the same callee from line "
        f"{shown.line} on: line {line}")


def _shared_by_data_flow(finding: OpFinding, traces: Dict[int, GraphTrace]) -> bool:
    """Whether ``finding``'s kernel is a shared cell's whose call :func:`_place_shared_call` names from the data flow
    (the graph input that feeds it): then no call is picked by program order before it."""
    from .callsite import shared_call_sites

    node, trace = finding.trace, traces.get(finding.op.graph)
    if node is None or trace is None:
        return False
    forward = trace.forward_of(node)
    stacks = [node.forward_stack, node.stack] if is_backward(finding.op, node) else [node.stack, node.forward_stack]
    if forward is not None:
        stacks.append(forward.stack)
    stack = deepest_user_frame(stacks)[1]
    sites = shared_call_sites(node, trace, stack, inputs=finding.inputs)
    return sites is not None and sites.chosen is not None


def _same_frame(a, b) -> bool:
    return a is not None and b is not None and (a.file, a.line) == (b.file, b.line)


def _ordinal(n: int) -> str:
    return {1: "1st", 2: "2nd", 3: "3rd"}.get(n, f"{n}th")


def _callee(code: str, scope: str, primitive: str) -> Optional[str]:
    """The call on ``code`` that leads to a kernel in ``scope``: the one naming the scope's cell attribute
    (``self.entity_embedding(`` for ``.../entity_embedding-Embedding``), else one naming the op (``ops.log(`` for
    Log), else the only call of the line."""
    names = _CALLEE.findall(code)
    cell = scope.rsplit("/", 1)[-1].split("-", 1)[0]
    for name in names:
        if name.rsplit(".", 1)[-1] == cell:
            return name
    for name in names:
        if name.rsplit(".", 1)[-1].lower() == primitive.lower():
            return name
    return names[0] if len(set(names)) == 1 else None


def _calls_from(shown, callee: Optional[str]) -> List[Tuple[int, str]]:
    """``[(line, code)]``, one per call of ``callee`` in the source of the function holding ``shown``, from its
    line to the function's end, in order."""
    import ast
    import linecache

    if not callee:
        return []
    lines = linecache.getlines(shown.file)
    try:
        tree = ast.parse("".join(lines))
    except (SyntaxError, ValueError):
        return []
    end: Optional[int] = None
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.lineno <= shown.line <= (fn.end_lineno or 0):
            last = fn.end_lineno or 0
            end = last if end is None else min(end, last)
    if end is None:
        return []
    pattern = re.compile(rf"(?<![\w.]){re.escape(callee)}\s*\(")
    out: List[Tuple[int, str]] = []
    for number in range(shown.line, end + 1):
        text = lines[number - 1].split("#", 1)[0]
        out.extend((number, lines[number - 1].strip()) for _ in pattern.finditer(text))
    return out


def _shown_frame(finding: OpFinding, traces: Dict[int, GraphTrace]):
    """The user frame :func:`_describe` shows for ``finding`` (from the .ir), or None."""
    node = finding.trace
    if node is None:
        return None
    fwd = traces[finding.op.graph].forward_of(node) if finding.op.graph in traces else None
    backward = is_backward(finding.op, node)
    stacks = [node.forward_stack, node.stack] if backward else [node.stack, node.forward_stack]
    if fwd is not None:
        stacks.append(fwd.stack)
    return deepest_user_frame(stacks)[0]


def _describe(finding: OpFinding, traces: Dict[int, GraphTrace], *, with_hint: bool, frame=None) -> Finding:
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


def _describe_stop(stop, traces: Dict[int, GraphTrace], rank_dir: Path, iteration: int,
                   origin: Optional[Finding], orders: Dict[int, List[str]]) -> Dict[str, Any]:
    """``stopped_at``: the op that did not complete (``op``), the last that did, its execution-order ``index``
    (0-based, in ``graph``'s csv), the hint, and the run folder's exception message/log when present."""
    finding = as_finding(stop)
    site = _repeated_call(finding, traces)
    op = _describe(finding, traces, with_hint=False, frame=site[0] if site else None).to_dict()
    if site is not None:
        op["call_site"] = (f"the .ir gives this kernel another call's line (MindSpore keeps one debug info for a "
                           f"cell or function called more than once); {site[1]}")
    for key in ("outputs", "received", "via_backend_cast", "index", "hint", "reached"):
        op.pop(key, None)
    if site is None:
        _place_shared_call(op, finding, traces)
    evidence = run_folder_evidence(rank_dir, iteration)
    source = op.get("source")
    hint = stop_hint(stop.op_type, [i for i in stop.inputs if not i.get("unreadable")], direction=op["direction"],
                     source_code=source["code"] if source else None, log=evidence["log"],
                     message=evidence["message"])
    last = None
    if stop.last_completed is not None:
        last = _describe(stop.last_completed, traces, with_hint=False).to_dict()
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


def _place_shared_call(op: Dict[str, Any], finding: OpFinding, traces: Dict[int, GraphTrace]) \
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


def _combine(dump: str, reports: List[DumpReport]) -> DumpReport:
    """Several ranks: the top level is the rank where the values went non-finite first (locally originated).

    A rank whose batch already holds Inf/NaN is the origin (its data, not an operator, brought it in); else the
    rank whose first non-finite value came from a non-collective operator, earliest in the step; a rank whose
    first non-finite value arrived through a collective (AllReduce of the gradients) only received it.
    ``rank_roles`` (one entry per rank) says which is which.
    """
    with_batch = [r for r in reports if r.bad_batch()]
    local = [r for r in reports if r.origin and not r.origin.get("received")]
    if with_batch:
        chosen = with_batch[0]
    elif local:
        chosen = min(local, key=lambda r: r.origin["index"] if r.origin is not None else 0)
    else:
        chosen = next((r for r in reports if r.origin), next((r for r in reports if r.stopped_at), reports[0]))
    originated = bool(with_batch or local)
    combined = DumpReport(dump=dump, rank=chosen.rank, graph=chosen.graph, iteration=chosen.iteration,
                          origin=chosen.origin, first_nonfinite=chosen.first_nonfinite,
                          nonfinite_inputs=chosen.nonfinite_inputs, fp16_risk=chosen.fp16_risk,
                          computes_in_half=chosen.computes_in_half,
                          warnings=[f"rank {r.rank}: {w}" for r in reports for w in r.warnings],
                          notes=[f"rank {r.rank}: {n}" for r in reports for n in r.notes],
                          graphs=chosen.graphs, iterations=chosen.iterations,
                          overflow_records=[p for r in reports for p in r.overflow_records],
                          ops_analyzed=sum(r.ops_analyzed for r in reports), ranks=reports,
                          origin_rank=chosen.rank if originated else None, profile=chosen.profile,
                          stopped_at=chosen.stopped_at, data_flow=chosen.data_flow,
                          analysed=all(r.analysed for r in reports),
                          unusable_files=sum(r.unusable_files for r in reports),
                          excluded=[dict(item, what=f"rank {r.rank}: {item.get('what')}") for r in reports
                                    for item in r.excluded])
    starters = with_batch or local
    if len(starters) > 1:
        combined.warnings.append(f"Inf/NaN originated locally on ranks {[r.rank for r in starters]}; rank {chosen.rank}"
                                 f" is the one " + ("with the lowest rank id" if with_batch else
                                                    "where it happened earliest in the step"))
    if not originated and chosen.origin:
        combined.warnings.append("every rank received its first Inf/NaN through a collective: the rank that produced "
                                 "it was not dumped (dump all ranks) or produced it in another iteration")
    return combined


def _ranges(values: List[int]) -> str:
    return format_ranges(values, ", ") or "none"
