"""Which call a kernel belongs to when the .ir gives it another call's source line: MindSpore keeps one debug info
for the calls of one cell or function in a ``construct``, so every call's kernels carry the first call's line. By
data flow (the call that computes the kernel's input) or by program order (the k-th twin is the k-th call)."""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Tuple

from .origin import OpFinding, is_backward
from .trace import GraphTrace, deepest_user_frame


def same_debug_info(finding: OpFinding, traces: Dict[int, GraphTrace]) -> List[str]:
    """Other kernels of ``finding``'s graph with its primitive and ``unique_id`` (one primal node inlined twice:
    they share its source lines)."""
    node = finding.trace
    trace = traces.get(finding.op.graph)
    if node is None or trace is None or not node.unique_id:
        return []
    return [other.full_name for other in trace.nodes.values() if other is not node and other.unique_id ==
            node.unique_id and other.primitive == node.primitive and other.forward_unique_id is None]


def input_lines(finding: OpFinding, shown: int) -> str:
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


def call_site_of_input(finding: OpFinding, shown: Any, traces: Dict[int, GraphTrace]):
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
                or (node.code_candidate and applies_operator(frame.code, op_type)):
            return frame
    return None


#: the Python operator that computes an op type, for a kernel the .ir places only by a code candidate
_OPERATORS = {"mul": re.compile(r"(?<![*])\*(?![*=])"), "muls": re.compile(r"(?<![*])\*(?![*=])"),
              "add": re.compile(r"\+(?!=)"), "adds": re.compile(r"\+(?!=)"),
              "sub": re.compile(r"(?<![eE(,=\s])\s*-\s(?!=)|\w\s*-\s*[\w(]"),
              "realdiv": re.compile(r"(?<!/)/(?![/=])"), "div": re.compile(r"(?<!/)/(?![/=])"),
              "pow": re.compile(r"\*\*")}


def applies_operator(code: str, op_type: str) -> bool:
    """Whether the source line ``code`` applies ``op_type`` as a Python operator (``a * b`` for Mul)."""
    pattern = _OPERATORS.get(op_type)
    return bool(pattern and pattern.search(code.split("#", 1)[0]))


def repeated_call(finding: OpFinding, traces: Dict[int, GraphTrace], *, by_order: bool = True):
    """``(frame, why)`` for a kernel the .ir gives another call's line: MindSpore keeps one debug info for the
    calls of one cell or function in a ``construct`` (measured on 2.10: both ``self.entity_embedding(...)`` calls of
    one construct, and every ``positive[:, k]`` of it, carry the first call's line, with distinct unique ids). By data
    flow first (:func:`call_site_of_input`); else by order: the forward kernels of this op type and scope shown on
    the same line are the calls of that callee from the shown line on, in program order, so the k-th of them is the
    k-th call of the callee in the function's source from that line. ``None`` when neither tells."""
    shown = shown_frame(finding, traces)
    node, trace = finding.trace, traces.get(finding.op.graph)
    if shown is None or node is None or trace is None:
        return None
    call = call_site_of_input(finding, shown, traces)
    if call is not None:
        if node.code_candidate and applies_operator(call.code, finding.op.op_type.lower()):
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
    """Whether ``finding``'s kernel is a shared cell's whose call :func:`place_shared_call` names from the data flow
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


def shown_frame(finding: OpFinding, traces: Dict[int, GraphTrace]):
    """The user frame :func:`describe` shows for ``finding`` (from the .ir), or None."""
    node = finding.trace
    if node is None:
        return None
    fwd = traces[finding.op.graph].forward_of(node) if finding.op.graph in traces else None
    backward = is_backward(finding.op, node)
    stacks = [node.forward_stack, node.stack] if backward else [node.stack, node.forward_stack]
    if fwd is not None:
        stacks.append(fwd.stack)
    return deepest_user_frame(stacks)[0]
