"""The call site of a cell called more than once in one ``construct``, from the data flow.

MindSpore's .ir keeps one debug info for the calls of one cell (measured on 2.10: both kernels of a shared
``EmbeddingLookup`` called for ``source_ids`` and ``target_ids`` carry the *same* stack, the one of the target call).
The stack is then one input among several: which graph inputs feed the failing kernel (its producers, walked back)
tells the calls apart, and the kernel's own input values are quoted with it (the hunt's dump holds no file of the
batch itself). When nothing tells, every call site is listed with the evidence for each -- never one guessed line.
"""
from __future__ import annotations

import ast
import linecache
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set

from .trace import Frame, GraphTrace, NodeTrace


@dataclass
class CallSites:
    """``shown``: the stack frame the .ir gives (a call of the shared cell); ``chosen``: the call the data flow
    names (None: it cannot tell); ``calls``: every call of that cell in the caller's function, each with the
    evidence for it (``{"line", "code", "evidence"}``, lines 1-based)."""

    shown: Frame
    chosen: Optional[Frame]
    calls: List[Dict[str, object]] = field(default_factory=list)
    why: str = ""

    def to_dict(self) -> Dict[str, object]:
        out: Dict[str, object] = {"shown_line": self.shown.line, "calls": self.calls, "why": self.why}
        if self.chosen is not None:
            out.update(line=self.chosen.line, code=self.chosen.code)
        return out


def graph_inputs_feeding(node: NodeTrace, trace: GraphTrace, depth: int = 12) -> Set[str]:
    """The graph inputs (the batch, not Parameters) ``node`` reads, directly or through its producers."""
    found: Set[str] = set()
    todo, seen = [(node, 0)], set()
    while todo:
        current, level = todo.pop()
        if id(current) in seen or level > depth:
            continue
        seen.add(id(current))
        found.update(name for name in current.input_params.values() if name in trace.graph_inputs)
        todo.extend((producer, level + 1) for producer in current.input_nodes.values())
    return found


def shared_call_sites(node: Optional[NodeTrace], trace: Optional[GraphTrace], stack: Sequence[Frame],
                      inputs: Sequence[Dict[str, object]] = ()) -> Optional[CallSites]:
    """The call sites of the shared cell holding ``node`` when another kernel of it carries the same debug info;
    None when it is not shared or the caller's source cannot be read.

    ``stack``: the user frames of ``node`` as the .ir gives them, outermost first; ``inputs``: the kernel's input
    statistics (with ``slot``), whose integer range the answer quotes.
    """
    if node is None or trace is None or not node.unique_id or not stack:
        return None
    twins = [n for n in trace.nodes.values() if n is not node and n.unique_id == node.unique_id
             and n.primitive == node.primitive and not n.is_backward]
    if not twins:
        return None
    scope_cells = [part.split("-", 1)[0] for part in node.full_name.split("/")[1:-1] if "-" in part]
    shown, callee = None, None
    for frame in reversed(list(stack)):        # the innermost frame calling a cell of the node's scope
        for cell in reversed(scope_cells):
            if f"self.{cell}(" in frame.code:
                shown, callee = frame, f"self.{cell}"
                break
        if shown is not None:
            break
    if shown is None or callee is None:
        return None
    calls = _calls_in_function(shown, callee)
    if len(calls) < 2:
        return None
    own = graph_inputs_feeding(node, trace)
    others = set().union(*(graph_inputs_feeding(t, trace) for t in twins))
    distinct = own - others
    chosen, rows = None, []
    for line, code, names in calls:
        matched = sorted(names & distinct)
        other = sorted(names & (others - own))
        if matched:
            evidence = f"its argument {', '.join(matched)} is the graph input that feeds this kernel"
        elif other:
            evidence = f"its argument {', '.join(other)} feeds the other kernel(s) of this cell, not this one"
        else:
            evidence = "no graph input of its arguments is known to feed this kernel"
        rows.append({"line": line, "code": code, "evidence": evidence, "matches": bool(matched)})
    matching = [r for r in rows if r["matches"]]
    values = _int_range(inputs)
    if len(matching) == 1:
        chosen = Frame(shown.file, int(matching[0]["line"]), str(matching[0]["code"]))
        why = (f"the .ir gives the {len(twins) + 1} kernels of `{callee}` one call site (line {shown.line}); this "
               f"kernel reads {', '.join(sorted(distinct))}{f' (values {values})' if values else ''}, which only the "
               f"call on line {chosen.line} passes")
    else:
        why = (f"the .ir gives the {len(twins) + 1} kernels of `{callee}` one call site (line {shown.line}) and the "
               f"data flow does not tell which call this kernel is: every call is listed with its evidence")
    for row in rows:
        row.pop("matches")
    return CallSites(shown=shown, chosen=chosen, calls=rows, why=why)


def _int_range(inputs: Sequence[Dict[str, object]]) -> str:
    """``"[3, 100]"``: the range of the kernel's integer inputs (ids, indices), or ``""`` when none is known."""
    ints = [s for s in inputs if "int" in str(s.get("dtype", "")) and isinstance(s.get("max"), (int, float))
            and isinstance(s.get("min"), (int, float)) and not s.get("constant")]
    if not ints:
        return ""
    return f"[{min(s['min'] for s in ints)}, {max(s['max'] for s in ints)}]"   # type: ignore[type-var]


def _calls_in_function(shown: Frame, callee: str) -> List[tuple]:
    """``[(line, code, argument names)]`` of every call of ``callee`` in the function holding ``shown``."""
    text = "".join(linecache.getlines(shown.file))
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return []
    function = None
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.lineno <= shown.line <= (fn.end_lineno or 0):
            if function is None or fn.lineno > function.lineno:
                function = fn
    if function is None:
        return []
    lines = text.splitlines()
    out = []
    for call in ast.walk(function):
        if isinstance(call, ast.Call) and ast.unparse(call.func) == callee:
            names = {n.id for arg in [*call.args, *(k.value for k in call.keywords)] for n in ast.walk(arg)
                     if isinstance(n, ast.Name)}
            out.append((call.lineno, lines[call.lineno - 1].strip(), names))
    return sorted(out, key=lambda c: c[0])
