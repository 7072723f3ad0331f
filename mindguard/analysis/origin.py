"""The origin search: walk the kernel launches of one iteration in execution order and find the first one
whose inputs are all finite and some output is not.

Each tensor file is read at most once. Before the origin every input and output gets full statistics;
after it only outputs are read, and only for their NaN/Inf counts (to count how far the values reached)
and fp16 range. Kernels that update some inputs in place are dumped after they ran, so those input files
hold post-update values (measured on CPU, MindSpore 2.10): every parameter input of an optimizer kernel, and
BatchNorm's moving mean/variance (inputs 3 and 4, the momentum-updated values). Those inputs are never taken
as the step's starting state: not as "non-finite from the start", and not as a reason to skip the kernel as
the origin (see :func:`.evidence.post_update_slots`).
"""
from __future__ import annotations

import math
import sys
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import AbstractSet, Dict, List, Optional, Set, Tuple

import numpy as np

from ..protocol.kernels import COPY_KERNELS
from .evidence import (IntendedInfinities, LeftOutInputs, misjoined_files, mislabelled_float16, post_update_slots,
                       unwritten_output_slots, unwritten_outputs)
from .files import TensorFile, is_batch_input, is_regular_file, npy_dtype_problem, sanitize
from .order import OpLaunch
from .stats import full_scan, is_nonfinite, light_scan
from .trace import GraphTrace, NodeTrace, reads_from


@dataclass
class OpFinding:
    """What the report says about one kernel launch."""

    index: int
    op: OpLaunch
    inputs: List[dict]
    outputs: List[dict]
    trace: Optional[NodeTrace] = None
    via_backend_cast: Optional[str] = None   # the inserted Cast where the producer's result became Inf/NaN


@dataclass
class SearchResult:
    origin: Optional[OpFinding] = None
    first_nonfinite: Optional[OpFinding] = None
    reached: int = 0
    nonfinite_inputs: List[dict] = field(default_factory=list)
    fp16_risk: List[dict] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)
    ops_total: int = 0
    profile: List[dict] = field(default_factory=list)   # per launch: index, name, absmax, nonfinite (outputs)
    # per launch, by (graph, name): what the search saw of it (index, op_type, inputs and outputs as read: full
    # statistics before the origin, counts after it), for the data flow around the culprit (:mod:`.flow`)
    launched: Dict[Tuple[int, str], dict] = field(default_factory=dict)
    excluded: List[dict] = field(default_factory=list)  # evidence a rule left out: {"rule", "what", "reason"}


class TensorReader:
    """Reads dumped tensors one at a time (memory bounded by the largest tensor) and reports progress."""

    def __init__(self, total_files: int, *, progress: bool = True):
        self.total = total_files
        self.done = 0
        self.read = 0            # tensor files read and used
        self.skipped = 0         # tensor files that could not be used (unreadable, not regular, wrong dtype)
        self.warnings: List[str] = []
        self.unreliable: Set[Path] = set()   # files that are not the values of their kernel: not read
        self.half_float32: Set[Path] = set()  # of those, the files labelled float16 holding float32 bytes
        self.excluded: List[dict] = []        # {"rule", "what", "reason"} for each file a rule left out
        self._start = time.monotonic()
        self._last = self._start
        self._progress = progress

    def _load(self, tensor: TensorFile):
        self.done += 1
        if self._progress:
            now = time.monotonic()
            if now - self._start > 3.0 and now - self._last > 2.0:
                self._last = now
                print(f"mindguard analyze: read {self.done}/{self.total} tensor files "
                      f"({now - self._start:.0f} s)", file=sys.stderr, flush=True)
        path = tensor.path
        if path is None:   # statistics only (a statistic dump's csv row): no file to read
            return None
        if not is_regular_file(path):
            self.skipped += 1
            self.warnings.append(f"skipped {path.name}: not a regular file (FIFO, socket, device or broken link); "
                                 f"never opened")
            return None
        try:
            if tensor.member is not None:       # one array of a kept state's .npz (read whole: no memory map)
                with np.load(path, allow_pickle=False) as arrays:
                    array = arrays[tensor.member]
            else:
                array = np.load(path, allow_pickle=False, mmap_mode="r")   # chunked scans: never a whole copy
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:   # truncated, empty, foreign,
            # pickled (ValueError with allow_pickle=False), a member missing from a kept state: warn and go on
            self.skipped += 1
            self.warnings.append(f"unreadable tensor file {path.name}: {type(exc).__name__}: {exc}")
            return None
        problem = npy_dtype_problem(array.dtype, tensor.dtype)
        if problem is not None:
            self.skipped += 1
            self.warnings.append(f"tensor file {path.name} not used: {problem}")
            return None
        self.read += 1
        return array

    def full(self, tensor: TensorFile) -> Tuple[Optional[dict], Optional[dict]]:
        """``(tensor_stats, fp16_risk_counts)`` or ``(None, None)`` when unreadable."""
        if tensor.path in self.unreliable:
            return self._float32_half(tensor, full_scan)
        return self._scan(tensor, full_scan)

    def _float32_half(self, tensor: TensorFile, scan) -> Tuple[Optional[dict], Optional[dict]]:
        """A mislabelled float16 file holds the first half of the float32 values its kernel wrote: read so, an
        Inf/NaN there is the kernel's (``partial`` says only half was seen); finite, it proves nothing (None)."""
        if tensor.path not in self.half_float32:
            return None, None
        array = self._load(tensor)
        if array is None or array.dtype != np.float16 or array.size % 2:
            return None, None
        stats, fp16 = scan(np.ascontiguousarray(array).reshape(-1).view(np.float32))
        if not is_nonfinite(stats):
            return None, None
        return dict(stats, partial="the first half of the float32 values, from a file labelled float16"), fp16

    def distrust_mislabelled(self, op: OpLaunch, node: Optional[NodeTrace]) -> None:
        """Mark ``op``'s output files whose dtype differs from the one its kernel computes (.ir kernel types).
        Measured on 2.10 CPU with AMP O2: a Conv2D/Pow the graph types as float16 runs in float32, and the dump
        writes a ``...Float16.npy`` holding the first half of the float32 buffer, read as float16 (NaN/Inf for
        ~1.6% of bit patterns, |x| up to 6e4): such a file says nothing about the values."""
        for slot, tensor, exclusion in mislabelled_float16(op, node):
            if tensor.path is None or tensor.path in self.unreliable:
                continue
            self.unreliable.add(tensor.path)
            self.half_float32.add(tensor.path)
            self.excluded.append(exclusion.as_dict())
            if len(self.half_float32) == 1:
                kernel = node.kernel_output_dtypes[slot] if node is not None else "float32"
                self.warnings.append(
                    f"{op.op_type} ({op.name}) output {slot} is dumped as {(tensor.dtype or '?').lower()} but its "
                    f"kernel "
                    f"computed {kernel} (MindSpore's CPU runs such ops in {kernel} and the dump keeps the graph's "
                    f"dtype): the bytes of such files are not the values, so they are not read (this and any later "
                    f"such file)")

    def counts(self, tensor: TensorFile) -> Tuple[Optional[dict], Optional[dict]]:
        """Only NaN/Inf counts, largest magnitude and fp16 risk (the cheap path, used after the origin)."""
        if tensor.path in self.unreliable:
            return self._float32_half(tensor, _light_pair)
        return self._scan(tensor, _light_pair)

    def _scan(self, tensor: TensorFile, scan) -> Tuple[Optional[dict], Optional[dict]]:
        """``scan(array)`` of the tensor's file, or its statistic.csv row; ``(None, None)`` when unreadable."""
        if tensor.stats is not None:
            self.read += 1
            return _stats_from_csv(tensor.stats), None
        array = self._load(tensor)
        if array is None:
            return None, None
        return scan(array)


def _light_pair(array) -> Tuple[dict, dict]:
    """``light_scan`` as ``(counts, fp16_risk_counts)``, the shape :meth:`TensorReader.full` returns."""
    scan = light_scan(array)
    return scan, {"underflow": scan["underflow"], "overflow": scan["overflow"]}


def _stats_from_csv(stats: dict) -> dict:
    """statistic.csv rows may lack count columns; infer NaN/Inf from non-finite min/max then."""
    out = dict(stats)
    for key in ("min", "max"):
        value = out.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            if math.isnan(value) and not out.get("nan"):
                out["nan"] = 1
            elif value > 0 and not out.get("pos_inf"):
                out["pos_inf"] = 1
            elif value < 0 and not out.get("neg_inf"):
                out["neg_inf"] = 1
            out[key] = None
    return out


def shown_inputs(node: Optional[NodeTrace], inputs: Dict[int, Optional[dict]], stale: Set[int]) -> List[dict]:
    """The input rows of an op as the op itself sees them: a value read from its producer's file gets the shape the
    op's .ir declares for that input when the element counts agree (a CPU Reshape that is not launched leaves its
    input's shape in the file: ``[16, 37]`` for the ``[8, 2, 37]`` CTCLoss reads), and a constant tensor argument of
    the .ir call (``Tensor(shape=[2], dtype=Int32, value=[8 8])``) is a row of its own, values included."""
    from .trace import constant_tensor

    rows = {}
    for slot, stats in inputs.items():
        declared = node.input_types.get(slot) if node is not None else None
        if stats is not None and declared is not None and declared.shape and stats.get("shape") is not None \
                and list(stats["shape"]) != list(declared.shape) \
                and int(np.prod(stats["shape"])) == int(np.prod(declared.shape)):
            stats = dict(stats, shape=list(declared.shape), file_shape=list(stats["shape"]))
        rows[slot] = _with_slot(slot, stats, post_update=slot in stale)
    for slot, arg in enumerate(node.args if node is not None else ()):
        if slot not in rows:
            constant = constant_tensor(arg)
            if constant is not None:
                rows[slot] = {"slot": slot, **constant}
    return [rows[slot] for slot in sorted(rows)]


def _with_slot(slot: int, stats: Optional[dict], *, post_update: bool = False) -> dict:
    """``{"slot": slot, **stats}``; ``post_update`` marks an input the kernel itself overwrote before the dump."""
    extra = {"post_update": True} if post_update else {}
    if stats is None:
        return {"slot": slot, "unreadable": True, **extra}
    return {"slot": slot, **stats, **extra}


#: .ir nodes that are never launched: their value is another node's (``TupleGetItem``: one output of it).
_VIRTUAL = {"TupleGetItem", "Depend", "MakeTuple", "UpdateState", "Load", "Return"}


def _value_source(producer: NodeTrace) -> Tuple[Optional[NodeTrace], int, Optional[str]]:
    """Where a .ir value comes from, through one ``TupleGetItem``, any ``Depend`` and copy kernels
    (:data:`~mindguard.protocol.kernels.COPY_KERNELS`): ``(kernel, 0-based output slot, None)``, ``(None, 0,
    parameter name)`` for a copy of a Parameter, or ``(None, 0, None)`` when it is not one kernel's output."""
    slot, picked = 0, False
    for _ in range(32):
        if producer.primitive == "TupleGetItem" and not picked and 0 in producer.input_nodes:
            index = producer.args[1] if len(producer.args) > 1 else ""
            if not (index.startswith("I64(") and index[4:-1].isdigit()):
                return None, 0, None
            slot, picked, producer = int(index[4:-1]), True, producer.input_nodes[0]
        elif producer.primitive == "Depend" and 0 in producer.input_nodes:
            producer = producer.input_nodes[0]
        elif producer.primitive in COPY_KERNELS and slot == 0:
            copied = COPY_KERNELS[producer.primitive]
            if copied in producer.input_params:
                return None, 0, producer.input_params[copied]
            if copied not in producer.input_nodes:
                return None, 0, None
            producer = producer.input_nodes[copied]
        elif producer.primitive in _VIRTUAL:
            return None, 0, None
        else:
            return producer, slot, None
    return None, 0, None


@dataclass
class StepState:
    """The Parameters as they were when the step began (a state the hunt kept at it): ``files`` by sanitized
    name; ``first_write`` -- for each Parameter some kernel of the step may write in place, ``(graph, position in
    its execution order, full name)`` of the first such kernel (``graph`` None: written in several graphs);
    ``positions`` -- each graph's kernel full names -> position. A kept value is what an op read unless a kernel
    before it wrote the Parameter."""

    files: Dict[str, TensorFile]
    first_write: Dict[str, Tuple[Optional[int], int, str]] = field(default_factory=dict)
    positions: Dict[int, Dict[str, int]] = field(default_factory=dict)

    def read_by(self, name: str, op: OpLaunch) -> Tuple[Optional[TensorFile], Optional[Tuple[Optional[int], str]]]:
        """``(kept value, None)`` if ``op`` read Parameter ``name`` unchanged since the step began; ``(None,
        (graph, full name) of the kernel that may have written it before)`` if not; ``(None, None)`` if not kept."""
        kept = self.files.get(sanitize(name))
        if kept is None:
            return None, None
        if name not in self.first_write:
            return kept, None
        graph, first, writer = self.first_write[name]
        here = self.positions.get(op.graph, {}).get(op.full_name or "")
        if graph == op.graph and here is not None and here <= first:
            return kept, None
        return None, (graph, writer)


@dataclass
class _FlowInputs:
    files: Dict[int, TensorFile] = field(default_factory=dict)
    after_step: Set[int] = field(default_factory=set)   # read from Parameter files holding the value after the step
    kept: Set[int] = field(default_factory=set)         # read from the state kept at the step's beginning
    missing: Set[int] = field(default_factory=set)      # what the op read is not in the dump (nor the state)


@dataclass
class _Dumped:
    """What a filtered dump holds of the step: the kernels that ran (``executed``, from the execution order) and
    those with files (``launched``), both as ``(graph, full name)``."""

    executed: Set[Tuple[int, str]] = field(default_factory=set)
    launched: Set[Tuple[int, str]] = field(default_factory=set)

    def left_out(self, graph: Optional[int], name: str) -> bool:
        if graph is None:   # written in several graphs: left out if any of them ran it without a file
            return any(n == name and (g, n) not in self.launched for g, n in self.executed)
        return (graph, name) in self.executed and (graph, name) not in self.launched


def _inputs_from_data_flow(node: Optional[NodeTrace], op: OpLaunch,
                           produced: Dict[Tuple[int, str, int], TensorFile], params: Dict[str, TensorFile],
                           graph_inputs: AbstractSet[str] = frozenset(), state: Optional[StepState] = None,
                           dumped: Optional[_Dumped] = None) -> _FlowInputs:
    """An outputs-only dump (``input_output`` 2) has no input files: read each input where the .ir says it comes
    from -- the output of the op that produced it (earlier in the step, so as it was), the state kept when the step
    began, or a ``Parameter`` file (the value after the step). With ``dumped`` (a filtered dump), an input is
    ``missing`` when its producer ran but was left out, when it cannot be traced to one kernel output (a tensor
    input through nested tuples), or when it is a Parameter that a left-out kernel may have written before."""
    flow = _FlowInputs()
    if node is None:
        return flow
    params_read = dict(node.input_params)
    for slot, producer in node.input_nodes.items():
        source, index, param = _value_source(producer)
        if param is not None:       # a copy of a Parameter: read as the Parameter
            params_read[slot] = param
            continue
        if source is None:
            if dumped is not None and slot in node.input_types:
                flow.missing.add(slot)
            continue
        tensor = produced.get((op.graph, source.full_name, index))
        if tensor is not None:
            flow.files[slot] = tensor
        elif dumped is not None and (op.graph, source.full_name) in dumped.executed:
            flow.missing.add(slot)
    for slot, name in params_read.items():
        if slot in flow.files:
            continue
        kept, writer = state.read_by(name, op) if state is not None else (None, None)
        tensor = params.get(sanitize(name))
        if kept is not None:
            flow.files[slot] = kept
            flow.kept.add(slot)
        elif writer is not None and dumped is not None and dumped.left_out(*writer):
            flow.missing.add(slot)
        elif tensor is not None:
            flow.files[slot] = tensor
            if name not in graph_inputs and not is_batch_input(tensor.op_name):  # a Parameter: after the step
                flow.after_step.add(slot)
        elif name not in graph_inputs and not is_batch_input(sanitize(name)):
            flow.missing.add(slot)
    return flow


def search(launches: List[OpLaunch], traces: Dict[int, GraphTrace], reader: TensorReader,
           batch: List[TensorFile], *, expect_outputs: bool = True,
           params: Optional[Dict[str, TensorFile]] = None, state: Optional[StepState] = None,
           orders: Optional[Dict[int, List[str]]] = None) -> SearchResult:
    """Find origin, first non-finite op, reach, non-finite graph inputs and fp16 risk for one iteration.

    ``expect_outputs``: the dump was configured to write output files (``input_output`` 0 or 2), so a launch
    with input files and no output file ran but lost its outputs (deleted, or not written). ``params``: the
    ``Parameter`` files by (sanitized) name; with them an outputs-only dump's op inputs are read through the .ir
    data flow (:func:`_inputs_from_data_flow`), Parameters preferably from ``state`` (as the step began). An op
    that made Inf/NaN while some input of it is not in the dump is not named the origin: what it read is unknown.
    ``orders``: each graph's kernels in execution order, for a dump that leaves kernels out (a kernel filter). Once
    an op made Inf/NaN from inputs the dump does not hold ("blind": a left-out kernel may have made them), no later
    op is named the origin either: the first Inf/NaN may be the left-out kernel's.

    What is not taken as evidence is decided by the rules of :mod:`.evidence`; this function composes them.
    """
    dumped = None
    if orders is not None:
        dumped = _Dumped({(g, name) for g, names in orders.items() for name in names},
                         {(op.graph, op.full_name) for op in launches if op.full_name})
    walk = _Walk(traces, reader, params or {}, state, dumped, SearchResult(ops_total=len(launches)))
    walk.read_batch(batch)
    for index, op in enumerate(launches):
        node = _node_for(op, traces)
        reader.distrust_mislabelled(op, node)
        if walk.result.origin is not None:
            walk.after_origin(index, op, node)
        else:
            walk.before_origin(index, op, node, expect_outputs)
    return walk.finish()


@dataclass
class _Walk:
    """What the search keeps while it walks the launches in execution order (one iteration)."""

    traces: Dict[int, GraphTrace]
    reader: TensorReader
    params: Dict[str, TensorFile]
    state: Optional[StepState]
    dumped: Optional[_Dumped]
    result: SearchResult
    produced: Dict[Tuple[int, str, int], TensorFile] = field(default_factory=dict)  # (graph, name, slot) -> file
    intended: IntendedInfinities = field(default_factory=IntendedInfinities)
    left_out: LeftOutInputs = field(default_factory=LeftOutInputs)
    unchecked: List[Tuple[OpLaunch, str]] = field(default_factory=list)  # before the origin, outputs not checked
    risk: Dict[str, dict] = field(default_factory=dict)
    seen_from_start: Set[str] = field(default_factory=set)   # graph inputs already reported non-finite
    before: Dict[str, OpFinding] = field(default_factory=dict)   # findings of the launches before the origin
    misjoined: List[str] = field(default_factory=list)   # launches whose files are another kernel's
    preferred: bool = False   # a forward origin was preferred to the backward one found first (after_origin)
    memo: Dict[int, bool] = field(default_factory=dict)   # _after_backward, by node

    def read_batch(self, batch: List[TensorFile]) -> None:
        """The batch (Parameter.inputs*) is not changed by the step: exact."""
        for tensor in batch:
            stats, fp16 = self.reader.full(tensor)
            if stats is None:
                continue
            if not self.intended.note_batch(tensor.op_name, stats) and is_nonfinite(stats):
                self.result.nonfinite_inputs.append({"name": tensor.op_name, "source": "batch", **stats})
                self.seen_from_start.add(tensor.op_name)
            _note_risk(self.risk, tensor.op_name, stats, fp16)

    def flow_of(self, op: OpLaunch, node: Optional[NodeTrace]) -> "_FlowInputs":
        """Where ``op``'s inputs are read: its own input files, else through the .ir data flow."""
        flow = _FlowInputs(dict(op.inputs))
        if not flow.files and (self.params or self.produced or self.state is not None):
            trace = self.traces.get(op.graph)
            flow = _inputs_from_data_flow(node, op, self.produced, self.params,
                                          trace.graph_inputs if trace is not None else set(), self.state, self.dumped)
            if node is None and self.dumped is not None:   # no .ir node: what it read cannot be told
                flow.missing.add(-1)
        return flow

    def after_origin(self, index: int, op: OpLaunch, node: Optional[NodeTrace]) -> None:
        """Count how far the Inf/NaN reached (outputs only, counts only); prefer a forward origin to a backward one
        that ran first."""
        result = self.result
        bad = False
        scans = []
        ignored = unwritten_output_slots(op.op_type)
        for slot in sorted(op.outputs):
            counts, fp16 = self.reader.counts(op.outputs[slot])
            bad = bad or (counts is not None and is_nonfinite(counts) and slot not in ignored)
            _note_risk(self.risk, f"{op.name} output {slot}", counts, fp16)
            scans.append(counts)
        forward = None
        origin = result.origin
        if bad and origin is not None and not self.preferred and not self.left_out \
                and is_backward(origin.op, origin.trace) \
                and node is not None and not is_backward(op, node) and not _after_backward(node, self.memo):
            forward = _independent_origin(index, op, node, self.flow_of(op, node), self.reader)
        if forward is not None and origin is not None:
            # CPU runs independent kernels out of program order: a backward kernel that reads the same
            # inputs (Grad_Log's 1/x beside log(x)) can run first; the forward op is the program's origin
            result.warnings.append(
                f"{origin.op.op_type} ({origin.op.name}, backward) made Inf/NaN first in time, "
                f"but {op.op_type} ({op.name}), an op of the forward pass, made it too, from finite inputs: "
                f"the forward pass comes first in the program, so it is named the origin (MindSpore ran "
                f"the two independently, the backward one first)")
            result.origin, result.reached, self.preferred = forward, 0, True
        elif bad:
            result.reached += 1
        result.profile.append(_profile(index, op, scans, bad))
        result.launched[(op.graph, op.name)] = _seen(index, op, [], [_with_slot(k, s) for k, s in
                                                                    zip(sorted(op.outputs), scans)], bad)
        _remember(self.produced, op)

    def before_origin(self, index: int, op: OpLaunch, node: Optional[NodeTrace], expect_outputs: bool) -> None:
        """Read ``op``'s inputs and outputs in full and decide, by the evidence rules, whether it is the origin."""
        result, reader = self.result, self.reader
        flow = self.flow_of(op, node)
        after_step = flow.after_step
        _remember(self.produced, op)
        inputs = {slot: reader.full(t) for slot, t in sorted(flow.files.items())}
        outputs = {slot: reader.full(t) for slot, t in sorted(op.outputs.items())}
        # an input read from a file that is not its values is unknown, not finite: this op is not named on it
        flow.missing.update(slot for slot, t in flow.files.items() if t.path in reader.unreliable)
        misjoined = misjoined_files(op, node, inputs, outputs)
        if misjoined is not None:
            reader.unreliable.update(t.path for t in list(op.inputs.values()) + list(op.outputs.values())
                                     if t.path is not None)
            self.misjoined.append(f"{op.op_type} ({op.name})")
            result.excluded.append(misjoined.as_dict())
            inputs = {slot: (None, None) for slot in inputs}
            outputs = {slot: (None, None) for slot in outputs}
        if expect_outputs and op.inputs and not op.outputs:
            self.unchecked.append((op, "its output file is missing (deleted, or not written)"))
        elif outputs and all(stats is None for stats, _ in outputs.values()):
            self.unchecked.append((op, "its output file(s) could not be used"))
        for slot, (stats, fp16) in outputs.items():
            _note_risk(self.risk, f"{op.name} output {slot}", stats, fp16)
        param_slots = node.input_params if node is not None else {}
        stale = (post_update_slots(op, node) - flow.kept) | after_step   # dumped after this kernel (or step) wrote them
        bad_in = [slot for slot, (s, _) in inputs.items() if s is not None and is_nonfinite(s)]
        ignored = unwritten_output_slots(op.op_type)
        bad_out = [slot for slot, (s, _) in outputs.items()
                   if s is not None and is_nonfinite(s) and slot not in ignored]
        unwritten = unwritten_outputs(op, outputs)
        if unwritten is not None:
            result.excluded.append(unwritten.as_dict())
        real_bad_in = [s for s in bad_in if s not in stale]
        result.profile.append(_profile(index, op, [s for s, _ in outputs.values()], bool(bad_out)))
        finding = OpFinding(index, op, shown_inputs(node, {k: s for k, (s, _) in inputs.items()}, stale),
                            [_with_slot(k, s) for k, (s, _) in outputs.items()], node)
        result.launched[(op.graph, op.name)] = _seen(index, op, finding.inputs, finding.outputs, bool(bad_out))
        for slot in real_bad_in:
            name = param_slots.get(slot)
            if name and name not in self.seen_from_start and self.intended.note_parameter(name, inputs[slot][0]):
                self.seen_from_start.add(name)
        nan_out = [slot for slot in bad_out if _has_nan(outputs[slot][0])]
        infinite_in = bool(real_bad_in) and not any(_has_nan(inputs[slot][0]) for slot in real_bad_in)
        if self.intended.writes_mask(op, bad_out, nan_out, real_bad_in) \
                or self.intended.passed_on(nan_out, infinite_in):
            self.before[op.name] = finding
            return
        if self.intended.made_nan(nan_out, infinite_in, not self.left_out.keeps_from_origin(flow.missing)):
            result.origin = finding   # NaN from infinite values: -inf - -inf in a fully masked row, 0 * inf
            result.first_nonfinite = result.first_nonfinite or finding
            result.warnings.append(self.intended.warning(op))
            self.before[op.name] = finding
            return
        if result.first_nonfinite is None and ([k for k in bad_in if k not in after_step] or bad_out):
            result.first_nonfinite = finding
        for slot in real_bad_in:
            name = param_slots.get(slot)
            if name and name not in self.seen_from_start:
                self.seen_from_start.add(name)
                result.nonfinite_inputs.append({"name": name, "source": "parameter" if not
                                                name.startswith("inputs") else "batch",
                                                "op": op.name, "slot": slot, **(inputs[slot][0] or {})})
        if bad_out and not real_bad_in and self.left_out.keeps_from_origin(flow.missing):
            self.left_out.note(op, flow.missing)
        elif bad_out and not real_bad_in:
            result.origin = _through_backend_cast(finding, self.before, result.warnings)
            stale_bad = [s for s in bad_in if s in stale]
            if stale_bad:
                result.warnings.append(
                    f"origin {op.name} updates its input(s) {stale_bad} in place and they are dumped after the "
                    f"update: their Inf/NaN is what this kernel wrote (or carried over), not its starting state")
        elif real_bad_in and not any(slot in param_slots for slot in real_bad_in) and not result.nonfinite_inputs \
                and result.first_nonfinite is finding and not _fed_by(node, self.unchecked):
            result.nonfinite_inputs.append({"name": f"{op.name} input {real_bad_in[0]}", "source": "unknown",
                                            "op": op.name, "slot": real_bad_in[0], **(inputs[real_bad_in[0]][0] or {})})
        self.before[op.name] = finding

    def finish(self) -> SearchResult:
        """The warnings of what the walk could not tell, and the rules' exclusions; the result."""
        result = self.result
        if not (result.nonfinite_inputs and result.origin is None):   # else the inputs explain them
            result.warnings.extend(self.left_out.warnings())
        if self.misjoined:
            result.warnings.append(f"{len(self.misjoined)} kernel(s) whose dump files hold other sizes than their .ir "
                                   f"kernel declares (the files of another kernel of the same name) were not read: "
                                   f"{', '.join(self.misjoined[:3])}{' ...' if len(self.misjoined) > 3 else ''}")
        culprit = result.origin or result.first_nonfinite
        if self.unchecked and culprit is not None:
            result.warnings.extend(_unchecked_warnings(self.unchecked, culprit))
        result.fp16_risk = sorted(self.risk.values(), key=lambda r: -(r["underflow"] + r["overflow"]))
        result.warnings.extend(self.reader.warnings)
        result.excluded.extend(self.reader.excluded)
        return result


def _has_nan(stats: Optional[dict]) -> bool:
    return bool(stats and stats.get("nan"))


def _remember(produced: Dict[Tuple[int, str, int], TensorFile], op: OpLaunch) -> None:
    """Note ``op``'s output files, where later ops' inputs are read in an outputs-only dump."""
    if op.full_name:
        for slot, tensor in op.outputs.items():
            produced[(op.graph, op.full_name, slot)] = tensor


def is_backward(op: OpLaunch, node: Optional[NodeTrace]) -> bool:
    """Whether a launch is of the backward pass: by its scope name, or by its .ir node."""
    return op.name.startswith("Gradients") or (node is not None and node.is_backward)


def _after_backward(node: NodeTrace, memo: Dict[int, bool]) -> bool:
    """Whether ``node`` is backward or reads, through the .ir data flow, anything a backward node computed (a
    gradient clip, the optimizer, a loss-scale unscale): then it is not of the forward pass. ``memo``: by node."""
    stack = [(node, False)]
    while stack:
        current, expanded = stack.pop()
        key = id(current)
        if expanded:
            memo[key] = current.is_backward or any(memo.get(id(n), False) for n in current.input_nodes.values())
        elif key not in memo:
            memo[key] = False   # in progress (a cycle through Depend/UpdateState reads it as not backward)
            stack.append((current, True))
            stack.extend((n, False) for n in current.input_nodes.values() if id(n) not in memo)
    return memo[id(node)]


def _independent_origin(index: int, op: OpLaunch, node: Optional[NodeTrace], flow: "_FlowInputs",
                        reader: "TensorReader") -> Optional[OpFinding]:
    """``op`` as an origin when every input it read is in the dump (or the kept state) and finite while an output
    is not -- else ``None``. Inputs the step wrote before they were dumped (``after_step``, in-place slots) do not
    count: what the op read is then unknown."""
    if flow.missing or flow.after_step or post_update_slots(op, node):
        return None
    inputs = {slot: reader.full(t)[0] for slot, t in sorted(flow.files.items())}
    outputs = {slot: reader.full(t)[0] for slot, t in sorted(op.outputs.items())}
    if not inputs or any(s is None or is_nonfinite(s) for s in inputs.values()):
        return None
    if not any(s is not None and is_nonfinite(s) for s in outputs.values()):
        return None
    return OpFinding(index, op, shown_inputs(node, inputs, set()),
                     [_with_slot(k, s) for k, s in outputs.items()], node)


def _fed_by(node: Optional[NodeTrace], unchecked: List[Tuple[OpLaunch, str]]) -> bool:
    """Whether ``node`` reads (through the .ir data flow) the output of a launch that could not be checked."""
    return any(reads_from(node, op.full_name) for op, _ in unchecked if op.full_name)


def _unchecked_warnings(unchecked: List[Tuple[OpLaunch, str]], culprit: OpFinding) -> List[str]:
    """Say which earlier ops could not be checked; first those whose output the culprit reads."""
    feeding = [(op, why) for op, why in unchecked if op.full_name and reads_from(culprit.trace, op.full_name)]
    if feeding and culprit.inputs and not any(i.get("unreadable") or is_nonfinite(i) for i in culprit.inputs):
        # the culprit's inputs were read, finite: what a feeding op gave it is known, so it made no Inf/NaN there
        unchecked = [(op, why) for op, why in unchecked if all(op is not f for f, _ in feeding)]
        feeding = []
    out = [f"{op.op_type} ({op.name}) ran before {culprit.op.op_type} and feeds it, but {why}: if it made the "
           f"Inf/NaN, {op.op_type} is the origin, not {culprit.op.op_type}" for op, why in feeding]
    others = [op for op, _ in unchecked if all(op is not f for f, _ in feeding)]
    if others:
        shown = ", ".join(f"{op.op_type} ({op.name})" for op in others[:5])
        out.append(f"{len(others)} op(s) before {culprit.op.op_type} could not be checked (output file missing or "
                   f"unusable): {shown}{' ...' if len(others) > 5 else ''}; any of them may be the real origin")
    return out


def _through_backend_cast(finding: OpFinding, before: Dict[str, OpFinding], warnings: List[str]) -> OpFinding:
    """A Cast MindSpore inserted (CPU runs e.g. an fp16 Exp in fp32, then casts back) is not the user's op:
    the origin is its producer, with the producer's inputs and the cast's (non-finite) outputs."""
    node = finding.trace
    if node is None or not node.backend_cast or 0 not in node.input_nodes:
        return finding
    producer = before.get(node.input_nodes[0].full_name)
    if producer is None:
        return finding
    warnings.append(
        f"{producer.op.op_type} was computed in {_dtype(producer.inputs)} by the backend and its result became "
        f"non-finite in the Cast MindSpore inserted after it ({finding.op.name}) to {_dtype(finding.outputs)}; "
        f"outputs shown are that cast's (the producer's own output file may be mislabelled)")
    return OpFinding(producer.index, producer.op, producer.inputs, finding.outputs, producer.trace,
                     via_backend_cast=finding.op.name)


def _dtype(stats: List[dict]) -> str:
    return str(next((s.get("dtype") for s in stats if s.get("dtype")), "?"))


def _profile(index: int, op: OpLaunch, scans: List[Optional[dict]], bad: bool) -> dict:
    """Largest finite output magnitude of one launch (for the --plot profile)."""
    values = []
    for s in scans:
        if not s:
            continue
        if s.get("absmax") is not None:
            values.append(s["absmax"])
        else:
            values.extend(abs(v) for v in (s.get("min"), s.get("max")) if isinstance(v, (int, float)))
    return {"index": index, "name": op.name, "op_type": op.op_type, "absmax": max(values) if values else None,
            "nonfinite": bad}


def _seen(index: int, op: OpLaunch, inputs: List[dict], outputs: List[dict], nonfinite: bool) -> dict:
    """One entry of :attr:`SearchResult.launched`."""
    return {"index": index, "op_type": op.op_type, "name": op.name, "inputs": inputs, "outputs": outputs,
            "nonfinite": nonfinite}


def _note_risk(risk: Dict[str, dict], name: str, stats: Optional[dict], fp16: Optional[dict]) -> None:
    if not fp16 or not (fp16["underflow"] or fp16["overflow"]):
        return
    if stats is not None and str(stats.get("dtype", "float32")) not in ("float32", "float64"):
        return
    risk[name] = {"name": name, "underflow": fp16["underflow"], "overflow": fp16["overflow"]}


def _node_for(op: OpLaunch, traces: Dict[int, GraphTrace]) -> Optional[NodeTrace]:
    trace = traces.get(op.graph)
    if trace is None or op.full_name is None:
        return None
    return trace.nodes.get(op.full_name)
