"""Where an op's inputs are read from when the dump has no input files (an outputs-only dump): the .ir data flow
to the producing kernel's output file, the training state kept when the step began, or a ``Parameter`` file."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, Optional, Set, Tuple

from ..protocol.kernels import COPY_KERNELS
from .files import TensorFile, is_batch_input, sanitize
from .order import OpLaunch
from .trace import NodeTrace


#: .ir nodes that are never launched: their value is another node's (``TupleGetItem``: one output of it).
VIRTUAL = {"TupleGetItem", "Depend", "MakeTuple", "UpdateState", "Load", "Return"}


def value_source(producer: NodeTrace) -> Tuple[Optional[NodeTrace], int, Optional[str]]:
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
        elif producer.primitive in VIRTUAL:
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
class FlowInputs:
    files: Dict[int, TensorFile] = field(default_factory=dict)
    after_step: Set[int] = field(default_factory=set)   # read from Parameter files holding the value after the step
    kept: Set[int] = field(default_factory=set)         # read from the state kept at the step's beginning
    missing: Set[int] = field(default_factory=set)      # what the op read is not in the dump (nor the state)


@dataclass
class Dumped:
    """What a filtered dump holds of the step: the kernels that ran (``executed``, from the execution order) and
    those with files (``launched``), both as ``(graph, full name)``."""

    executed: Set[Tuple[int, str]] = field(default_factory=set)
    launched: Set[Tuple[int, str]] = field(default_factory=set)

    def left_out(self, graph: Optional[int], name: str) -> bool:
        if graph is None:   # written in several graphs: left out if any of them ran it without a file
            return any(n == name and (g, n) not in self.launched for g, n in self.executed)
        return (graph, name) in self.executed and (graph, name) not in self.launched


def inputs_from_data_flow(node: Optional[NodeTrace], op: OpLaunch,
                          produced: Dict[Tuple[int, str, int], TensorFile], params: Dict[str, TensorFile],
                          graph_inputs: AbstractSet[str] = frozenset(), state: Optional[StepState] = None,
                          dumped: Optional[Dumped] = None) -> FlowInputs:
    """An outputs-only dump (``input_output`` 2) has no input files: read each input where the .ir says it comes
    from -- the output of the op that produced it (earlier in the step, so as it was), the state kept when the step
    began, or a ``Parameter`` file (the value after the step). With ``dumped`` (a filtered dump), an input is
    ``missing`` when its producer ran but was left out, when it cannot be traced to one kernel output (a tensor
    input through nested tuples), or when it is a Parameter that a left-out kernel may have written before."""
    flow = FlowInputs()
    if node is None:
        return flow
    params_read = dict(node.input_params)
    for slot, producer in node.input_nodes.items():
        source, index, param = value_source(producer)
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
