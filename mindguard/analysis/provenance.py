"""Where the culprit's operands came from: each traced back through the .ir data flow to its origin (issue 52).

The origin search names the operator; the operator is rarely the bug. From the culprit (the op that made the
Inf/NaN, or the op a step that raised stopped in) each operand is followed up its producers -- through
``TupleGetItem``/``Depend`` and copies, as :func:`.flow.kernel_inputs` reads them -- to what the step started from:

* a **graph input** (the batch: a dataset column). Its values are read from the dump (the ``Parameter.<name>``
  file of the batch, else the input file of a kernel that reads it, else the output of a kernel that only reshapes
  or casts it) and checked against the column's evident domain (:mod:`.domain`): an index operator's range, a 0/1
  mask, NaN/Inf, zero-size boxes. What falls outside is the origin, with its rows and values;
* a **Parameter** that the step trained: when the culprit overflowed from finite values computed from trained
  weights and no batch column is outside its domain, the **learning rate** the optimizer used (a kept state's or
  the dump's ``learning_rate``, a per-step schedule read at the step's ``global_step``) is said with its numbers:
  a schedule that jumps (one step's value >= 10x the step's before) is the origin.

* a Parameter that was already **non-finite when the step began** (:mod:`.param_origin`): the step only read it;
  named with how many of its values are non-finite and since when (the exact step, the window of steps, or set
  outside the steps);
* a **constant** of the graph (:mod:`.constant_origin`): a literal or a Python number folded in -- a divisor that
  is the constant 0, a ``-1e9`` that is ``-inf`` in float16, the ``1.0`` of ``log(x - 1.0)``.

:mod:`.traced` puts them together, the origin first: a decisive constant, a non-finite Parameter, a batch column,
the learning rate, then a constant that only contributed.

``traced_to`` (a list, the origin first) is what the report, ``summary.json`` and the page say; each entry::

    {"kind": "batch" | "hyper_parameter" | "parameter" | "constant", "name": <graph input / Parameter name; a
     constant's value as text>,
     "argument": <the user's construct argument bound to that graph input, or None>,
     "slot": <culprit input slot it feeds>, "path": [<op types from the culprit's input up to the origin>],
     "rule": <domain.Violation.rule | "learning_rate_jump" | "learning_rate" | "nonfinite_parameter" |
              "nonfinite_constant" | "zero_divisor" | "shifted_operand" | "large_constant">,
     "rows", "row_count", "rows_total", "values", "count", "expected", "why" (batch), "value", "step",
     "since_step", "baseline", "ratio" (learning rate),
     "count", "nan", "pos_inf", "neg_inf", "size", "shape", "step" (the 1-based global step that began with it),
     "since" ("exact" | "window" | "outside" | "unknown"), "since_step" (the exact 1-based global step that made it,
     else None), "window" ([first, last] 1-based global steps, else None), "checked" (parameter),
     "value" (one value), "values", "dtype", "shape", "op", "op_name", "op_slot" (the kernel that reads it and
     which input), "source" ({"file", "line", "code"} of that kernel, from the .ir), "literal" (the number written
     on that line that does not fit the dtype), "beyond_range" (a finite number the dtype cannot hold) (constant),
     "read_from", "reader" (the first op that read a value already non-finite, when no operator made it),
     "text": <one line for people>}
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import AbstractSet, Any, Dict, Iterable, List, Optional, Sequence, Set, Tuple

import numpy as np

from ..protocol.kernels import COPY_KERNELS
from .domain import Violation, column_violations
from .files import TensorFile, is_batch_input, npy_dtype_problem, sanitize
from .flow import kernel_inputs
from .order import OpLaunch
from .trace import Frame, GraphTrace, NodeTrace, is_mindspore_frame

#: ops that pass values through unchanged (a subset, reshaped, cast): ids keep their values along them
SELECTING = {"Reshape", "Cast", "ExpandDims", "Squeeze", "Flatten", "Transpose", "StridedSlice", "Slice",
             "Identity", "BroadcastTo", "Tile", "Concat", "Split", "Gather", "GatherV2", "TensorCopySlices",
             "Unsqueeze", "View", "SliceExt", "ReshapeExt", *(k for k, v in COPY_KERNELS.items() if v == 0)}
#: ops whose output holds their input 0's values unchanged (in another shape or dtype)
_KEEPING = ("Reshape", "Cast", "ExpandDims", "Squeeze", "Flatten", "Identity",
            *(k for k, v in COPY_KERNELS.items() if v == 0))
#: index operators: (table slot, index slot)
INDEX_OPS = {"Gather": (0, 1), "GatherV2": (0, 1), "SparseGatherV2": (0, 1), "EmbeddingLookup": (0, 1),
             "GatherD": (0, 2)}
SEGMENT_OPS = {"UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin", "UnsortedSegmentProd"}
MAX_ELEMENTS = 1 << 26         # a batch column larger than this is not read for its rows
LR_JUMP = 10.0                 # a schedule value this many times the median of the steps before is a jump
_LR_NAMES = ("learning_rate", "lr")


@dataclass
class Reached:
    """A graph input or Parameter one of the culprit's operands was computed from."""

    kind: str                     # "batch" | "parameter"
    name: str
    slot: int                     # the culprit's input slot
    path: List[str] = field(default_factory=list)   # op types from the culprit's input to the origin
    selecting: bool = True        # every op on the path passes values through unchanged


def reach(node: NodeTrace, trace: GraphTrace, slots: Iterable[int], depth: int = 12,
          limit: int = 256) -> List[Reached]:
    """The graph inputs and Parameters ``node``'s input ``slots`` are computed from (nearest first, each once)."""
    out: Dict[str, Reached] = {}
    visited = 0
    for slot in slots:
        frontier: List[Tuple[NodeTrace, Optional[int], List[str], bool]] = [(node, slot, [], True)]
        seen: Set[int] = set()
        for _ in range(depth):
            following: List[Tuple[NodeTrace, Optional[int], List[str], bool]] = []
            for current, only, path, selecting in frontier:
                for at, kind, what, _out in kernel_inputs(current):
                    if only is not None and at != only:
                        continue
                    if kind == "parameter":
                        if what not in out:
                            batch = what in trace.graph_inputs or is_batch_input(str(what))
                            out[what] = Reached("batch" if batch else "parameter", what, slot, path, selecting)
                        continue
                    if id(what) in seen or visited >= limit:
                        continue
                    seen.add(id(what))
                    visited += 1
                    keep = selecting and what.primitive in SELECTING
                    if what.primitive in INDEX_OPS and keep:   # ids through a lookup of ids: only the index
                        following.append((what, INDEX_OPS[what.primitive][1], path + [what.primitive], keep))
                    else:
                        following.append((what, None, path + [what.primitive], keep))
            frontier = following
            if not frontier:
                break
    return list(out.values())


class BatchValues:
    """Reads a graph input's values from a dump: its ``Parameter`` file, else the input file of a kernel that reads
    it, else the output of a kernel that only reshapes or casts it (back in the input's declared shape), else the
    step's batch the examine pass kept when the step raised (``kept``, by graph-input name:
    :mod:`mindguard.protocol.step_batch`)."""

    def __init__(self, tensors: Sequence[TensorFile], launches: Sequence[OpLaunch],
                 unreliable: AbstractSet[Any] = frozenset(), kept: Optional[Dict[str, np.ndarray]] = None):
        self.params = {t.op_name: t for t in tensors if t.is_parameter}
        self.launches = {(op.graph, op.full_name): op for op in launches if op.full_name}
        self.unreliable = unreliable
        self.kept = dict(kept or {})   # graph input -> the step's batch as the examine pass kept it (step_batch)

    def values(self, graph: int, trace: GraphTrace, name: str) -> Optional[Tuple[np.ndarray, str]]:
        """``(array, where it was read)`` or None."""
        own = self.params.get(sanitize(name))
        if own is not None:
            array = load(own, self.unreliable)
            if array is not None:
                return array, f"Parameter.{own.op_name}"
        declared = trace.params.get(name)
        for node in trace.nodes.values():
            for slot, param in node.input_params.items():
                if param != name:
                    continue
                op = self.launches.get((graph, node.full_name))
                if op is None:
                    continue
                if slot in op.inputs:
                    array = load(op.inputs[slot], self.unreliable)
                    if array is not None:
                        return _shaped(array, declared), f"input {slot} of {node.full_name}"
                if node.primitive in _KEEPING and slot == 0 and 0 in op.outputs:
                    array = load(op.outputs[0], self.unreliable)
                    if array is not None:
                        return _shaped(array, declared), f"output of {node.full_name}"
        if name in self.kept and name in trace.graph_inputs and fits_declared(self.kept[name], declared):
            return self.kept[name], "the step's batch (kept when the step raised)"
        return None


def fits_declared(array: np.ndarray, declared: Any) -> bool:
    """Whether ``array`` has the shape and dtype the .ir declares (``declared``: a :class:`.trace.TensorType`)."""
    return declared is not None and list(declared.shape) == list(array.shape) and declared.dtype == str(array.dtype)


def _shaped(array: np.ndarray, declared: Any) -> np.ndarray:
    shape = list(getattr(declared, "shape", None) or [])
    if shape and int(np.prod(shape)) == array.size and list(array.shape) != shape:
        return array.reshape(shape)
    return array


def load(tensor: TensorFile, unreliable: AbstractSet[Any] = frozenset()) -> Optional[np.ndarray]:
    """A dumped (or kept) tensor's values, or None when it cannot be read as them (too big, foreign, unreliable)."""
    if tensor.path is None or tensor.path in unreliable:
        return None
    try:
        if tensor.member is not None:
            with np.load(tensor.path, allow_pickle=False) as arrays:
                array = np.asarray(arrays[tensor.member])
        else:
            array = np.load(tensor.path, allow_pickle=False, mmap_mode="r")
    except (OSError, ValueError, EOFError, KeyError):
        return None
    except Exception:  # noqa: BLE001 - a damaged .npz (BadZipFile): not read, the answer goes on
        return None
    if array.size > MAX_ELEMENTS or npy_dtype_problem(array.dtype, tensor.dtype) is not None:
        return None
    return np.asarray(array)


def argument_of(graph_input: str, stack: Sequence[Frame], graph_inputs: Set[str]) -> Optional[str]:
    """The name the user's outermost ``construct`` gives ``graph_input`` (``inputs1`` -> ``input_mask`` through
    ``construct(self, *inputs)`` and ``self.network(*inputs)``), from the culprit's stack; None when not bound."""
    from .callsite import flow_names

    for j, frame in enumerate(stack[:-1]):
        if is_mindspore_frame(frame.file) or not frame.code.strip().startswith(("def ", "async def ")):
            continue
        env = flow_names(stack, stack[j + 1], graph_inputs)
        if env is None:
            continue
        names = [local for local, carried in env.items() if carried == {graph_input}]
        if names:
            return names[0] if names[0] != graph_input else None
        return None
    return None


def _label(reached: Reached, argument: Optional[str]) -> str:
    if argument and argument != reached.name:
        return f"batch column `{argument}` (graph input {reached.name})"
    return f"batch column `{reached.name}`"


def _path_text(reached: Reached, culprit: str) -> str:
    ops = [p for p in reversed(reached.path) if p]
    return " -> ".join([*ops, f"{culprit} input {reached.slot}"])


def trace_batch(node: NodeTrace, trace: GraphTrace, graph: int, culprit_type: str, slots: Sequence[int],
                values: BatchValues, *, index_rows: Optional[int] = None, index_slot: Optional[int] = None,
                reader: str = "the table") -> List[Dict[str, Any]]:
    """Each batch column ``slots`` of ``node`` are computed from, read from the dump and checked against its
    evident domain; one entry (module docstring) per column holding values outside it. ``index_rows``: the
    culprit is an index op whose table has that many rows; a column reaching its ``index_slot`` through ops that
    keep values is checked against ``[0, index_rows)``."""
    stack = _user_stack(node, trace)
    out = []
    for reached in reach(node, trace, slots):
        if reached.kind != "batch":
            continue
        read = values.values(graph, trace, reached.name)
        if read is None:
            continue
        array, where = read
        by_index = index_rows is not None and reached.slot == index_slot and reached.selecting
        found = column_violations(array, index_rows=index_rows if by_index else None, reader=reader)
        argument = argument_of(reached.name, stack, trace.graph_inputs)
        for violation in found:
            out.append(batch_entry(reached, argument, violation, where, culprit_type))
    return out


def batch_entry(reached: Reached, argument: Optional[str], violation: Violation, where: str,
                culprit: str) -> Dict[str, Any]:
    """The ``traced_to`` entry (module docstring) of batch column ``reached`` holding ``violation``, read from
    ``where``; ``argument``: the user's name for it when the graph input has another."""
    label = _label(reached, argument)
    text = f"{label}: {violation.describe()}; {violation.why} -- flows {_path_text(reached, culprit)}"
    return {"kind": "batch", "name": reached.name, "argument": argument, "slot": reached.slot,
            "path": list(reversed(reached.path)), **violation.as_dict(), "read_from": where, "text": text}


def _user_stack(node: NodeTrace, trace: GraphTrace) -> List[Frame]:
    if node.is_backward:
        forward = trace.forward_of(node)
        return list(forward.stack if forward is not None else node.forward_stack)
    return list(node.stack)


# -- the learning rate ------------------------------------------------------------------------------------

def learning_rate(params: Dict[str, TensorFile], kept: Optional[Dict[str, TensorFile]] = None,
                  kept_step: Any = None) -> Optional[Dict[str, Any]]:
    """The learning rate the step used, with the schedule around it when the optimizer holds one (a per-step list
    read at ``global_step``); from the state kept at the step (``kept``, by sanitized name: values as the step
    began) else the dump's Parameter files (``global_step`` after the step: one more). None when neither holds
    it."""
    for source, after in ((kept or {}, False), (params, True)):
        name = next((n for n in sorted(source) if n.rsplit(".", 1)[-1] in _LR_NAMES or n.endswith("learning_rate")),
                    None)
        if name is None:
            continue
        lr = load(source[name])
        if lr is None or lr.dtype.kind != "f" or lr.size == 0:
            continue
        lr = lr.reshape(-1).astype(np.float64)
        step_file = next((source[n] for n in sorted(source) if n.endswith("global_step")), None)
        counter = load(step_file) if step_file is not None else None
        done = int(counter.reshape(-1)[0]) - (1 if after else 0) if counter is not None and counter.size else None
        out: Dict[str, Any] = {"kind": "hyper_parameter", "name": name, "read_from": "kept state" if not after
                               else "dump"}
        if lr.size == 1:
            out.update(value=float(lr[0]), rule="learning_rate", step=done + 1 if done is not None else None)
            return out
        if done is None or not 0 <= done < lr.size:
            return None
        history = lr[:done + 1]
        value = float(lr[done])
        out.update(value=value, step=done + 1, rule="learning_rate")
        # a jump: one step's value >= LR_JUMP x the step's before (a warm-up ramps by <= 2x a step after its first)
        previous, current = history[:-1], history[1:]
        ratios = np.where(previous > 0, current / np.where(previous > 0, previous, 1.0), 0.0)
        jumps = np.nonzero(ratios >= LR_JUMP)[0]
        if jumps.size and value >= LR_JUMP * float(previous[jumps[-1]]):
            at = int(jumps[-1]) + 1
            before = float(history[at - 1])
            out.update(rule="learning_rate_jump", since_step=at + 1, before=before, baseline=before,
                       ratio=value / before)
        return out
    return None


def lr_entry(lr: Dict[str, Any], culprit: str, weights: Sequence[str]) -> Dict[str, Any]:
    """The learning rate as a ``traced_to`` entry, with its text."""
    shown = ", ".join(f"`{w}`" for w in weights[:3]) + (f" (+{len(weights) - 3} more)" if len(weights) > 3 else "")
    value = _g(lr["value"])
    at = f" at global step {lr['step']}" if lr.get("step") else " when the step began"
    if lr["rule"] == "learning_rate_jump":
        text = (f"learning rate `{lr['name']}` = {value}{at}: the schedule jumped {_g(lr['ratio'])}x, from "
                f"{_g(lr['before'])} to {_g(lr['value'])}, at global step {lr['since_step']}; {culprit} reads values "
                f"computed from the weights it trained since ({shown}), all finite")
    else:
        text = (f"learning rate `{lr['name']}` = {value}{at}; {culprit} reads values computed from the weights it "
                f"trained ({shown}), all finite: large weights, not a bad batch value, made the overflow")
    return dict(lr, weights=list(weights[:8]), text=text)


def _g(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def trained_weights(node: NodeTrace, trace: GraphTrace, slots: Sequence[int]) -> List[str]:
    """The trained Parameters (not the batch, not the optimizer's scalars) the ``slots`` of ``node`` read."""
    out = []
    for reached in reach(node, trace, slots):
        last = reached.name.rsplit(".", 1)[-1]
        if reached.kind == "parameter" and last not in _LR_NAMES and "global_step" not in last \
                and not last.endswith("_power") and not last.startswith(("moment", "scale_sense", "loss_scale")):
            out.append(reached.name)
    return out


def is_overflow(inputs: Sequence[Dict[str, Any]], outputs: Sequence[Dict[str, Any]]) -> bool:
    """Finite inputs, an infinite output: an overflow (not a 0/0 or a log(0) -- those are the batch's or the op's)."""
    finite_in = all(not any(int(i.get(k) or 0) for k in ("nan", "pos_inf", "neg_inf")) for i in inputs)
    inf_out = any(int(o.get("pos_inf") or 0) + int(o.get("neg_inf") or 0) for o in outputs)
    zeros_in = any(int(i.get("zeros") or 0) and not i.get("constant") and "float" in str(i.get("dtype", ""))
                   for i in inputs)
    return finite_in and inf_out and not (zeros_in and not _large(inputs))


def _large(inputs: Sequence[Dict[str, Any]]) -> bool:
    values = [abs(float(v)) for i in inputs for v in (i.get("min"), i.get("max")) if isinstance(v, (int, float))
              and math.isfinite(float(v))]
    return bool(values) and max(values) > 10.0
