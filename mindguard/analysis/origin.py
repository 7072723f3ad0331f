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

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import numpy as np

from .evidence import (IntendedInfinities, LeftOutInputs, misjoined_files, post_update_slots,
                       unwritten_output_slots, unwritten_outputs)
from .files import TensorFile
from .flow_inputs import Dumped, FlowInputs, StepState, inputs_from_data_flow
from .order import OpLaunch
from .stats import is_nonfinite
from .tensor_reader import TensorReader
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


def search(launches: List[OpLaunch], traces: Dict[int, GraphTrace], reader: TensorReader,
           batch: List[TensorFile], *, expect_outputs: bool = True,
           params: Optional[Dict[str, TensorFile]] = None, state: Optional[StepState] = None,
           orders: Optional[Dict[int, List[str]]] = None) -> SearchResult:
    """Find origin, first non-finite op, reach, non-finite graph inputs and fp16 risk for one iteration.

    ``expect_outputs``: the dump was configured to write output files (``input_output`` 0 or 2), so a launch
    with input files and no output file ran but lost its outputs (deleted, or not written). ``params``: the
    ``Parameter`` files by (sanitized) name; with them an outputs-only dump's op inputs are read through the .ir
    data flow (:func:`inputs_from_data_flow`), Parameters preferably from ``state`` (as the step began). An op
    that made Inf/NaN while some input of it is not in the dump is not named the origin: what it read is unknown.
    ``orders``: each graph's kernels in execution order, for a dump that leaves kernels out (a kernel filter). Once
    an op made Inf/NaN from inputs the dump does not hold ("blind": a left-out kernel may have made them), no later
    op is named the origin either: the first Inf/NaN may be the left-out kernel's.

    What is not taken as evidence is decided by the rules of :mod:`.evidence`; this function composes them.
    """
    dumped = None
    if orders is not None:
        dumped = Dumped({(g, name) for g, names in orders.items() for name in names},
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
    dumped: Optional[Dumped]
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

    def flow_of(self, op: OpLaunch, node: Optional[NodeTrace]) -> "FlowInputs":
        """Where ``op``'s inputs are read: its own input files, else through the .ir data flow."""
        flow = FlowInputs(dict(op.inputs))
        if not flow.files and (self.params or self.produced or self.state is not None):
            trace = self.traces.get(op.graph)
            flow = inputs_from_data_flow(node, op, self.produced, self.params,
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


def _independent_origin(index: int, op: OpLaunch, node: Optional[NodeTrace], flow: "FlowInputs",
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
