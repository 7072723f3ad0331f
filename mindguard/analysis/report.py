"""``analyze_dump``: read one iteration of a dump and return the :class:`~.model.DumpReport` (``str(report)``
for people, ``to_dict()`` for tools).

Iteration ids are MindSpore's 0-based dump iteration ids (``FailureRecord.dump_iteration``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

from .._util.ranges import format_ranges
from .describe import describe, describe_stop, place_shared_call
from .traced import mark_origin_nodes, trace_to_origin
from .files import TensorFile, is_batch_input, iteration_dirs, rank_of, resolve_dump_path
from .flow import data_flow
from .kept_state import KeptState, kept_state, step_state
from .param_origin import ParamHistory
from .provenance import BatchValues
from ..report.model import SCHEMA, DumpReport, Finding, has_culprit
from .order import assign_full_names, group_launches, read_execution_order
from .origin import OpFinding, TensorReader, search
from .repeated_calls import call_site_of_input, input_lines, repeated_call, same_debug_info, shown_frame
from .step_files import collect
from .stop import dump_settings, find_stop, run_folder_evidence
from .trace import GraphTrace, read_graph_trace
from .unlaunched import kept_batch, raised_before_dump
from ..errors import ArgumentError, DumpNotFoundError

# the names of the modules split out of this one that the tests import from here
from .kept_state import kept_state as _kept_state, step_state as _step_state  # noqa: F401
from .repeated_calls import applies_operator as _applies_operator  # noqa: F401
from .step_files import collect as _collect  # noqa: F401

__all__ = ["analyze_dump", "DumpReport", "Finding", "has_culprit", "SCHEMA"]


def analyze_dump(path: Union[str, Path], *, iteration: Optional[int] = None, rank: Optional[int] = None,
                 time_window: Optional[Tuple[int, int]] = None, progress: bool = True,
                 state: Union[str, Path, None] = None, writer_ended: bool = False,
                 history: Optional[ParamHistory] = None) -> DumpReport:
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
    ``history``: what the run knows of when its Parameters were last finite
    (:class:`~mindguard.analysis.param_origin.ParamHistory`, 1-based global steps: the exact step one went
    non-finite, the last step they were checked finite, whether they were checked at all): a Parameter already
    non-finite when the step began is then said with since when.
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
    kept = kept_state(Path(state)) if state is not None else None
    if kept is not None and len(rank_dirs) > 1:
        raise ArgumentError(f"state={str(state)!r} is one process's training state, but {str(path)!r} holds "
                            f"{len(rank_dirs)} ranks; pass rank=N (--rank N) for the rank that kept it")
    reports = [_analyze_rank(d, iteration, progress, time_window, kept, writer_ended, history) for d in rank_dirs]
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


def _analyze_rank(rank_dir: Path, iteration: Optional[int], progress: bool,
                  time_window: Optional[Tuple[int, int]] = None,
                  kept: Optional["KeptState"] = None, writer_ended: bool = False,
                  history: Optional[ParamHistory] = None) -> DumpReport:
    warnings: List[str] = []
    rank = rank_of(rank_dir)
    available = iteration_dirs(rank_dir, warnings)
    report = DumpReport(dump=str(rank_dir), rank=rank, graph=None, iteration=iteration,
                        iterations=sorted(available), warnings=warnings)
    if not available and kept_batch(rank_dir, []):
        # the pass kept the batch of its step that raised: MindSpore dumped nothing of the step (its first kernel
        # raised), and the graphs and the batch say where it stopped (analysis/unlaunched.py)
        return _analyze_files(report, rank_dir, rank, iteration, [], warnings, progress, time_window, kept,
                              writer_ended, history)
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
                                  writer_ended, history)
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
                          kept, writer_ended, history)


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


def _analyze_files(report: DumpReport, rank_dir: Path, rank: int, iteration: Optional[int], dirs,
                   warnings: List[str], progress: bool, time_window: Optional[Tuple[int, int]],
                   kept: Optional[KeptState] = None, writer_ended: bool = False,
                   history: Optional[ParamHistory] = None) -> DumpReport:
    files = collect(rank_dir, rank, iteration, dirs, warnings, report.notes, time_window, report.excluded,
                    writer_ended)
    report.graphs = files.graphs
    report.graph = files.graphs[0] if files.graphs else None
    report.overflow_records = [str(p) for p in files.overflow_records]
    if files.overflow_records:
        warnings.append(f"{len(files.overflow_records)} Ascend overflow record(s) (Opdebug.Node_OpDebug.*) present: "
                        f"the device flagged an overflow in this iteration; see overflow_records")
    orders, traces = _read_graphs(rank_dir, files.graphs, warnings)

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
                    state=step_state(kept, orders, traces, report.notes) if kept is not None and outputs_only
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
        _describe_origin(report, result.origin, result.reached, traces)
    if result.first_nonfinite is not None:
        report.first_nonfinite = describe(result.first_nonfinite, traces, with_hint=False)
    step_batch = kept_batch(rank_dir, report.notes)   # the step's batch, when the examine pass kept it (it raised)
    stop = find_stop(launches, files.tensors, orders, traces, settings, reader, warnings, report.notes,
                     message=run_folder_evidence(rank_dir, iteration)["message"], kept=step_batch)
    unlaunched = raised_before_dump(rank_dir, reader, report.notes, step_batch) if stop is None and not launches \
        else None
    if unlaunched is not None:   # nothing of the step was dumped: its first kernel raised (analysis/unlaunched.py)
        stop = unlaunched.stop
        orders, traces = {**orders, **unlaunched.orders}, {**traces, **unlaunched.traces}
        report.graphs = sorted(set(report.graphs) | {stop.graph})
        report.graph = report.graph if report.graph is not None else stop.graph
    if stop is not None:
        report.stopped_at = describe_stop(stop, traces, rank_dir, None if unlaunched is not None else iteration,
                                          report.origin, orders)
        warnings.extend(stop.warnings)
    trace_to_origin(report, result, stop, traces,
                    BatchValues(files.tensors, launches, reader.unreliable, kept=step_batch), params, kept, history)
    report.data_flow = data_flow(traces, result.launched, origin=result.origin,
                                 origin_source=report.origin.source if report.origin is not None else None,
                                 stop=stop,
                                 stop_source=report.stopped_at["op"].get("source") if stop and report.stopped_at
                                 else None,
                                 first=result.first_nonfinite, reached=result.reached if result.origin else None,
                                 nonfinite_inputs=report.nonfinite_inputs)
    mark_origin_nodes(report)
    report.unusable_files = reader.skipped
    report.analysed = reader.read > 0
    if not report.analysed and unlaunched is None:
        warnings.append(f"rank {rank}, iteration {iteration}: no tensor file could be used "
                        f"({len(files.tensors)} listed, {reader.skipped} unusable): nothing was analysed")
    elif not report.holds_nonfinite:
        warnings.append(f"no NaN/Inf in iteration {iteration} of rank {rank}: is this the failing iteration? "
                        f"(dumped: {_ranges(report.iterations)})")
    return report


def _read_graphs(rank_dir: Path, graphs: List[int], warnings: List[str]) \
        -> Tuple[Dict[int, List[str]], Dict[int, GraphTrace]]:
    """``(orders, traces)``: each kernel graph's execution order (op full names) and .ir source trace, where the
    dump has them (a missing file is warned about)."""
    orders: Dict[int, List[str]] = {}
    traces: Dict[int, GraphTrace] = {}
    for g in graphs:
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
    return orders, traces


def _describe_origin(report: DumpReport, origin: OpFinding, reached: int, traces: Dict[int, GraphTrace]) -> None:
    """``report.origin``: the culprit with its hint, at the call it belongs to when the .ir gives its kernel
    another call's line (a function or cell called more than once), and a note saying so."""
    report.origin = describe(origin, traces, with_hint=True)
    twins = same_debug_info(origin, traces)
    call = site = None
    if twins and report.origin.source:
        line = report.origin.source["line"]
        call = call_site_of_input(origin, shown_frame(origin, traces), traces)
        if call is not None:   # the line that computes its argument also calls this op: that call is it
            report.origin = describe(origin, traces, with_hint=True, frame=call)
        inputs = input_lines(origin, line)
        report.notes.append(
            f"the .ir gives {len(twins) + 1} kernels of this op the same source line "
            f"({', '.join(n.rsplit('/', 1)[-1] for n in [origin.op.name, *twins][:4])}, line {line}): "
            f"MindSpore keeps the first call's debug info when a function or cell is called more than once"
            + (f"; this kernel's input comes from {inputs}" if inputs else "")
            + (f", which calls {origin.op.op_type} too, so line {call.line} is shown"
               if call is not None else f", so line {line} may be another call's")
            + ". In PyNative mode the hunt replays the step eagerly and names the exact call")
    elif report.origin.source:
        site = repeated_call(origin, traces)
        if site is not None:
            report.origin = describe(origin, traces, with_hint=True, frame=site[0])
            report.notes.append(f"the .ir gives this kernel another call's line (MindSpore keeps one debug info "
                                f"for a cell or function called more than once); {site[1]}")
    report.origin.reached = reached
    placed = (twins and call is not None) or (not twins and site is not None)
    shared = None if placed else place_shared_call(report.origin.to_dict(), origin, traces)
    if shared is not None:
        report.origin.stack, report.origin.extra["call_sites"] = shared["stack"], shared["call_sites"]


def computes_in_half(traces: Dict[int, GraphTrace], tensors: List[TensorFile]) -> bool:
    """Whether the step computes anything in float16/bfloat16: a kernel's output dtype or an input type in the .ir
    (the dtypes it computes in), else -- without a readable .ir -- a dumped file's dtype. An fp32 run gets no fp16
    range note printed: its values under 2^-24 or over 65504 are no risk there (the JSON keeps them)."""
    half = ("float16", "bfloat16")
    if traces:
        return any(d in half for t in traces.values() for n in t.nodes.values()
                   for d in [*n.kernel_output_dtypes.values(), *(x.dtype for x in n.input_types.values())])
    return any(str(t.dtype).lower() in half for t in tensors)


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
