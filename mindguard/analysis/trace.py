"""Source traces from ``graphs/ms_output_trace_code_graph_<g>.ir``: each kernel's full name, its Python
stack (outermost frame first), its inputs (which are parameters / graph inputs), and for backward
kernels the forward node and that node's stack (``# Corresponding forward node candidate:``).
"""
from __future__ import annotations

import functools
import importlib.util
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Sequence, Tuple

from .files import read_regular_text

_NODE_START = re.compile(r"^  %(\d+)\([^)]*\) = ([\w.:]+)\(")
_FULLNAME = re.compile(r"# Fullname with scope: \((.*)\)\s*$")
_FRAME = re.compile(r"# In file (.+?):(\d+)(?:~(\d+))?(?:, \d+~\d+)?/(.*)/\s*$")
_FORWARD_NAME = re.compile(r'forward_node_name: "([^"]+)"')
_FORWARD_ID = re.compile(r'forward_unique_id: "(\d+)"')
_UNIQUE_ID = re.compile(r'[{ ]unique_id: "(\d+)"')
_PARAM = re.compile(r"^%para\d+_(.+)$")
_PARAM_DECL = re.compile(r"^%para\d+_(\S+): (<[^<>]*>)")
_TENSOR_TYPE = re.compile(r"^<(?:Ref\[)?Tensor\[(\w+)\]\]?, \(([\d, ]*)\)")


@dataclass
class Frame:
    file: str
    line: int
    code: str

    def to_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "code": self.code}


@dataclass
class TensorType:
    """A tensor's dtype (``"float32"``) and shape as the .ir declares them."""

    dtype: str
    shape: List[int]


@dataclass
class NodeTrace:
    full_name: str
    primitive: str
    stack: List[Frame] = field(default_factory=list)
    forward_stack: List[Frame] = field(default_factory=list)
    forward_node_name: Optional[str] = None
    forward_unique_id: Optional[str] = None
    unique_id: Optional[str] = None
    input_params: Dict[int, str] = field(default_factory=dict)    # input slot -> parameter / graph-input name
    input_nodes: Dict[int, "NodeTrace"] = field(default_factory=dict)  # input slot -> producing node
    args: List[str] = field(default_factory=list)     # the call's arguments as written (``%3``, ``I64(0)``)
    input_types: Dict[int, "TensorType"] = field(default_factory=dict)  # input slot -> dtype/shape (.ir types)
    backend_cast: bool = False        # a Cast MindSpore inserted (e.g. CPU computes an fp16 op in fp32)
    kernel_output_dtypes: Dict[int, str] = field(default_factory=dict)  # output slot -> dtype the kernel wrote
    kernel_input_sizes: Dict[int, int] = field(default_factory=dict)    # input slot -> element count (kernel types)
    kernel_output_sizes: Dict[int, int] = field(default_factory=dict)   # output slot -> element count
    # the .ir gives its stack as a "Corresponding code candidate" (an expanded kernel, ``Expand/_Muls/Mul-op1``:
    # measured on 2.10, every expansion of one function carries the first call's line)
    code_candidate: bool = False

    @property
    def is_backward(self) -> bool:
        return self.full_name.startswith("Gradients/") or self.forward_unique_id is not None


@dataclass
class GraphTrace:
    nodes: Dict[str, NodeTrace] = field(default_factory=dict)       # by full scope name
    by_unique_id: Dict[str, NodeTrace] = field(default_factory=dict)
    params: Dict[str, TensorType] = field(default_factory=dict)     # parameter / graph-input name -> type
    graph_inputs: Set[str] = field(default_factory=set)             # the graph's inputs (the batch), not Parameters

    def forward_of(self, node: NodeTrace) -> Optional[NodeTrace]:
        """The forward node of a backward ``node``: by ``forward_unique_id``, else by ``forward_node_name``
        (``"Sqrt_13813"``: primitive, ``_``, unique id), else None."""
        if node.forward_unique_id and node.forward_unique_id in self.by_unique_id:
            return self.by_unique_id[node.forward_unique_id]
        if node.forward_node_name:
            match = re.search(r"_(\d+)$", node.forward_node_name)
            if match and match.group(1) in self.by_unique_id:
                return self.by_unique_id[match.group(1)]
            return self.nodes.get(node.forward_node_name)
        return None


def read_graph_trace(path: Path, warnings: List[str]) -> GraphTrace:
    """Parse one ``ms_output_trace_code_graph_<g>.ir``; unreadable parts give a warning, not an error."""
    trace = GraphTrace()
    try:
        text = read_regular_text(path)
    except OSError as exc:
        warnings.append(f"could not read {path}: {exc}")
        return trace
    loads: Dict[str, str] = {}          # node id -> parameter name it loads
    by_id: Dict[str, NodeTrace] = {}
    current: Optional[NodeTrace] = None
    header: List[str] = []
    node_id = ""
    section = "stack"
    in_header = False
    for line in text.splitlines():
        param_decl = _PARAM_DECL.match(line)
        if param_decl and "IsWeight: false" in line and "is_parameter" not in param_decl.group(2):
            trace.graph_inputs.add(param_decl.group(1))
        if param_decl:
            declared = parse_tensor_type(param_decl.group(2))
            if declared is not None:
                trace.params.setdefault(param_decl.group(1), declared)
            continue
        start = _NODE_START.match(line)
        if start or line.startswith("  Return(") or line.startswith("}"):
            if current is not None:
                _finish_node(trace, current, node_id, header, by_id, loads)
            current, header, section, in_header = None, [], "stack", False
            if start:
                node_id = start.group(1)
                primitive = start.group(2).replace("PrimFunc_", "")
                current = NodeTrace("", primitive)
                header = [line]
                in_header = True
            continue
        if current is None:
            continue
        stripped = line.strip()
        if in_header and not (stripped.startswith(":") or stripped.startswith("#")):
            header.append(stripped)
            continue
        if in_header and stripped.startswith(": (") and " -> " in stripped:
            current.input_types = _input_types(stripped)
        elif not current.kernel_output_dtypes and stripped.startswith(": (") and " -> " in stripped:
            current.kernel_output_dtypes, current.kernel_input_sizes, current.kernel_output_sizes = \
                _kernel_types(stripped)
        in_header = False
        section = _node_comment(current, stripped, section)
    if current is not None:
        _finish_node(trace, current, node_id, header, by_id, loads)
    return trace


def _finish_node(trace: GraphTrace, current: NodeTrace, node_id: str, header: List[str], by_id: Dict[str, NodeTrace],
                 loads: Dict[str, str]) -> None:
    """A node read to its end: its call's arguments (the Parameters and nodes it reads), its ids, and its entry in
    ``trace``, ``by_id`` and -- a ``Load`` of a Parameter -- ``loads``."""
    head = " ".join(header)
    args = _call_args(head)
    current.args = args
    for slot, arg in enumerate(args):
        param = _PARAM.match(arg)
        if param:
            current.input_params[slot] = param.group(1)
        elif arg.startswith("%") and arg[1:].isdigit() and arg[1:] in loads:
            current.input_params[slot] = loads[arg[1:]]
        elif arg.startswith("%") and arg[1:] in by_id:
            current.input_nodes[slot] = by_id[arg[1:]]
    by_id[node_id] = current
    current.backend_cast = "is_backend_cast: Bool(1)" in head
    param = _PARAM.match(args[0]) if current.primitive == "Load" and args else None
    if param is not None:
        loads[node_id] = param.group(1)
    fwd = _FORWARD_ID.search(head)
    current.forward_unique_id = fwd.group(1) if fwd else None
    fname = _FORWARD_NAME.search(head)
    current.forward_node_name = fname.group(1) if fname else None
    uid = _UNIQUE_ID.search(head)
    current.unique_id = uid.group(1) if uid else None
    if current.full_name:
        trace.nodes.setdefault(current.full_name, current)
    if current.unique_id:
        trace.by_unique_id.setdefault(current.unique_id, current)


def _node_comment(current: NodeTrace, stripped: str, section: str) -> str:
    """One line of a node's body: a ``#`` comment gives its full name, starts its forward or code candidate's
    frames, or is one frame of them (``section`` says whose); returns the section the next frame belongs to."""
    if not stripped.startswith("#"):
        return section
    full = _FULLNAME.search(stripped)
    if full:
        current.full_name = full.group(1)
        return section
    if stripped.startswith("# Corresponding forward node candidate"):
        return "forward"
    if stripped.startswith("# Corresponding code candidate"):
        current.code_candidate = True
        return "stack"
    frame = _FRAME.search(stripped)
    if frame:
        code = frame.group(4).split("/<~~", 1)[0]   # MindSpore's note "<~~This line of code can be shared..."
        f = Frame(frame.group(1), int(frame.group(2)), code.strip())
        (current.forward_stack if section == "forward" else current.stack).append(f)
    return section


def parse_tensor_type(text: str) -> Optional[TensorType]:
    """``<Tensor[Int32], (4, 3)>`` / ``<Ref[Tensor[Float32]], (10, 4), ref_key=...>`` -> TensorType; else None."""
    match = _TENSOR_TYPE.match(text.strip())
    if not match:
        return None
    return TensorType(match.group(1).lower(), [int(d) for d in re.findall(r"\d+", match.group(2))])


def _input_types(line: str) -> Dict[int, TensorType]:
    """The first type line of a node, ``: (<Tensor[Float32], (10, 4)>, <Int64, NoShape>) -> (...)``: slot -> type."""
    inputs = line[line.find("(") + 1:line.rfind(" -> ")]
    out: Dict[int, TensorType] = {}
    for slot, element in enumerate(re.findall(r"<[^<>]*>", inputs)):
        parsed = parse_tensor_type(element)
        if parsed is not None:
            out[slot] = parsed
    return out


_KERNEL_TYPE = re.compile(r"<([A-Za-z]+?\d+|Bool)x[A-Za-z]+(?:\[[^\]]*\])?(?:\{([^}]*)\})?")


def _kernel_types(line: str) -> Tuple[Dict[int, str], Dict[int, int], Dict[int, int]]:
    """The kernel type line of a node (its second, after the abstract types), ``: (<Float32xDefaultFormat[const
    vector]{8, 3}>) -> (<Float16xDefaultFormat[...]{8, 3}>)``: output slot -> the dtype the kernel computes
    (``"float16"``), and the element counts of its inputs and outputs by slot (``{8, 3}`` -> 24, ``{}`` -> 1; none
    for a dynamic dimension, -1)."""
    cut = line.rfind(" -> ")

    def sizes(types) -> Dict[int, int]:
        out = {}
        for slot, (_, dims) in enumerate(types):
            numbers = [int(d) for d in re.findall(r"-?\d+", dims or "")]
            if dims is not None and all(n >= 0 for n in numbers):
                out[slot] = math.prod(numbers) if numbers else 1
        return out

    inputs = [(m.group(1), m.group(2)) for m in _KERNEL_TYPE.finditer(line[:cut])]
    outputs = [(m.group(1), m.group(2)) for m in _KERNEL_TYPE.finditer(line[cut + 4:])]
    return {slot: dtype.lower() for slot, (dtype, _) in enumerate(outputs)}, sizes(inputs), sizes(outputs)


_CONSTANT = re.compile(r"^Tensor\(shape=\[([\d, ]*)\], dtype=(\w+), value=\s*(.*)\)$", re.S)


def constant_tensor(arg: str) -> Optional[dict]:
    """A constant tensor argument of an .ir call (``Tensor(shape=[2], dtype=Int32, value=[8 8])``) as statistics:
    ``shape``, ``dtype``, ``constant``; ``min``/``max``/``values`` when the .ir printed every value (it elides large
    ones with ``...``: then ``values`` is the printed head and tail, ``elided`` True). None for anything else."""
    match = _CONSTANT.match(arg.strip())
    if not match:
        return None
    shape = [int(d) for d in re.findall(r"\d+", match.group(1))]
    dtype = match.group(2).lower()
    text = match.group(3)
    elided = "..." in text
    try:
        numbers = [float(v) for v in re.findall(r"-?(?:\d+\.?\d*(?:e[-+]?\d+)?|inf|nan)", text.replace("...", " "))]
    except ValueError:
        numbers = []
    out: Dict[str, Any] = {"from": "constant", "constant": True, "shape": shape, "dtype": dtype,
                           "nan": 0, "pos_inf": 0, "neg_inf": 0}
    if numbers and not elided and len(numbers) == math.prod(shape):
        values = [int(v) if v.is_integer() and not dtype.startswith("float") else v for v in numbers]
        out.update(min=min(values), max=max(values), zeros=sum(1 for v in values if v == 0), values=values)
    elif numbers:
        out.update(values_shown=[int(v) if v.is_integer() else v for v in numbers], elided=True)
    return out


def _call_args(head: str) -> List[str]:
    """Top-level arguments of the first call after ``=`` in a node header."""
    eq = head.find(" = ")
    open_ = head.find("(", eq)
    if eq < 0 or open_ < 0:
        return []
    depth = 0
    args: List[str] = []
    current: List[str] = []
    for ch in head[open_:]:
        if ch in "([{":
            depth += 1
            if depth == 1:
                continue
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                args.append("".join(current).strip())
                break
        if depth == 1 and ch == ",":
            args.append("".join(current).strip())
            current = []
        else:
            current.append(ch)
    return [a for a in args if a]


@functools.lru_cache(maxsize=1)
def _mindspore_dirs() -> tuple:
    dirs: List[str] = []
    try:
        spec = importlib.util.find_spec("mindspore")
        if spec is not None and spec.submodule_search_locations:
            dirs.extend(os.path.realpath(p) for p in spec.submodule_search_locations)
    except (ImportError, ValueError):
        pass
    return tuple(dirs)


def is_mindspore_frame(file: str) -> bool:
    """True for frames inside MindSpore's own package (not the user's code)."""
    norm = file.replace("\\", "/")
    if re.search(r"/(site|dist)-packages/mindspore/", norm):
        return True
    real = os.path.realpath(file) if os.path.isabs(file) else file
    return any(real.startswith(d + os.sep) for d in _mindspore_dirs())


_MINDGUARD_DIR = os.path.realpath(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def is_mindguard_frame(file: str) -> bool:
    """True for frames in mindguard's own library code (its train-step cells, SafeNorm, ...), in this package or
    in another copy of it (``python -m mindguard`` run from a checkout reads frames of the site-packages copy the
    training imported); the demos under ``mindguard/demos/`` are example user code and count as the user's."""
    if not os.path.isabs(file):
        return False
    real = os.path.realpath(file)
    package = _mindguard_package_of(os.path.dirname(real))
    return package is not None and not real.startswith(os.path.join(package, "demos") + os.sep)


@functools.lru_cache(maxsize=256)
def _mindguard_package_of(directory: str) -> Optional[str]:
    """The mindguard package folder ``directory`` lies in (this one, or a folder ``mindguard`` holding
    ``protocol/request.py``), or None."""
    path = directory
    while True:
        if path == _MINDGUARD_DIR or (os.path.basename(path) == "mindguard"
                                      and os.path.isfile(os.path.join(path, "protocol", "request.py"))):
            return path
        parent = os.path.dirname(path)
        if parent == path:
            return None
        path = parent


def is_user_frame(file: str) -> bool:
    """A frame of the user's code: neither MindSpore's package nor mindguard's library."""
    return not is_mindspore_frame(file) and not is_mindguard_frame(file)


def user_frame(stack: List[Frame]) -> Optional[Frame]:
    """Innermost user frame (:func:`is_user_frame`) of ``stack`` (outermost first), or None."""
    for frame in reversed(stack):
        if is_user_frame(frame.file):
            return frame
    return None


def deepest_user_frame(stacks: Sequence[List[Frame]]) -> Tuple[Optional[Frame], List[Frame]]:
    """``(frame, its stack)``: the innermost user frame that sits deepest among ``stacks`` (each outermost
    first), depth counting the distinct ``file:line`` calls above it (a trace can repeat a line with another
    column range). Backward nodes' traces can stop at a caller while their forward node's trace goes on to the
    line that made the op. Ties go to the earlier stack; ``(None, first non-empty stack)`` when no stack has a
    user frame."""
    best: Tuple[int, Optional[Frame], List[Frame]] = (-1, None, [])
    for stack in stacks:
        innermost = next((i for i in range(len(stack) - 1, -1, -1) if is_user_frame(stack[i].file)), None)
        if innermost is None:
            continue
        depth = sum(1 for i in range(innermost + 1)
                    if i == 0 or (stack[i].file, stack[i].line) != (stack[i - 1].file, stack[i - 1].line))
        if depth > best[0]:
            best = (depth, stack[innermost], stack)
    if best[1] is None:
        return None, next((s for s in stacks if s), [])
    return best[1], best[2]


def reads_from(node: Optional[NodeTrace], name: str) -> Optional[bool]:
    """Whether ``node`` (transitively, through the .ir data flow) reads the output of the op ``name``;
    None when there is no .ir node to tell."""
    if node is None:
        return None
    seen, todo = set(), [node]
    while todo:
        current = todo.pop()
        for producer in current.input_nodes.values():
            if producer.full_name == name:
                return True
            if id(producer) not in seen:
                seen.add(id(producer))
                todo.append(producer)
    return False
