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


def forward_instance(node: NodeTrace, trace: GraphTrace) -> Optional[NodeTrace]:
    """The forward kernel a backward ``node`` differentiates. The .ir names it by unique id, which every call of a
    shared cell shares; the instance is the one among them ``node`` reads (``SqrtGrad(sqrt(x), dy)`` reads its
    ``Sqrt``). None when the data flow does not single one out."""
    forward = trace.forward_of(node)
    if forward is None:
        return None
    twins = [n for n in trace.nodes.values() if n.unique_id == forward.unique_id and n.primitive == forward.primitive
             and not n.is_backward]
    if len(twins) < 2:
        return forward
    read = [t for t in twins if _reads(node, t)]
    return read[0] if len(read) == 1 else None


def _reads(node: NodeTrace, target: NodeTrace, depth: int = 6) -> bool:
    """Whether ``node`` reads ``target``'s output, directly or through up to ``depth`` producers."""
    todo, seen = [(node, 0)], set()
    while todo:
        current, level = todo.pop()
        if current is target:
            return True
        if id(current) in seen or level >= depth:
            continue
        seen.add(id(current))
        todo.extend((producer, level + 1) for producer in current.input_nodes.values())
    return False


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
    """The call sites of the shared cell holding ``node`` (for a backward kernel: its forward node) when another
    kernel of it carries the same debug info; None when it is not shared or the caller's source cannot be read.

    ``stack``: the user frames of ``node`` as the .ir gives them, outermost first; ``inputs``: the kernel's input
    statistics (with ``slot``), whose integer range the answer quotes.
    """
    if node is not None and trace is not None and node.is_backward:   # a backward kernel: its forward node's call
        node = forward_instance(node, trace)
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
    env = flow_names(stack, shown, trace.graph_inputs)
    chosen, rows = None, []
    for line, code, names in calls:
        if env is not None:   # the graph inputs each argument carries, through the calls that led here
            names = set().union(*(env.get(n, set()) for n in names)) if names else set()
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


def flow_names(stack: Sequence[Frame], upto: Frame, graph_inputs: Set[str]) -> Optional[Dict[str, Set[str]]]:
    """In the function holding ``upto``: each local name -> the graph inputs it carries, followed from the step's
    outermost ``construct`` (whose parameters are the graph inputs, by name or -- ``*inputs`` -- by position:
    ``inputs0``, ``inputs1``, ...) through each call line of ``stack`` into the next ``def`` line, arguments bound to
    parameters by position and keyword. None when a line of the chain cannot be read that way."""
    env: Optional[Dict[str, Set[str]]] = None
    stars: Dict[str, List[Set[str]]] = {}
    call: Optional[ast.Call] = None
    for frame in stack:
        if (frame.file, frame.line) == (upto.file, upto.line):
            return env
        code = frame.code.strip()
        if code.startswith(("def ", "async def ")):
            header = _parameters(code)
            if header is None:
                return None
            params, star = header
            if env is None:
                env = {p: ({p} if p in graph_inputs else set()) for p in params}
                if star:
                    count = sum(1 for g in graph_inputs if g.startswith(star) and g[len(star):].isdigit())
                    stars = {star: [{f"{star}{i}"} for i in range(count)]}
            elif call is not None:
                env, stars = _bind(call, params, star, env, stars)
            else:
                return None
            call = None
        elif env is not None:
            call = _outer_call(code)
    return None


def _parameters(code: str) -> Optional[tuple]:
    """``(parameter names without self, *-parameter name or None)`` of a ``def`` line."""
    try:
        tree = ast.parse(code.rstrip(":") + ": pass") if code.endswith(":") else ast.parse(code + "\n    pass")
    except SyntaxError:
        return None
    fn = tree.body[0] if tree.body else None
    if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return None
    names = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if names and names[0] in ("self", "cls"):
        names = names[1:]
    return names + [a.arg for a in fn.args.kwonlyargs], (fn.args.vararg.arg if fn.args.vararg else None)


def _outer_call(code: str) -> Optional[ast.Call]:
    """The outermost call on a one-line statement (``a, p = self.net(anchor, positive)``), or None."""
    text = code.split("#", 1)[0].strip()
    for candidate in (text, text[len("return "):] if text.startswith("return ") else None):
        if not candidate:
            continue
        try:
            tree = ast.parse(candidate)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                return node
    return None


def _bind(call: ast.Call, params: List[str], star: Optional[str], env: Dict[str, Set[str]],
          stars: Dict[str, List[Set[str]]]) -> tuple:
    """The callee's ``(env, stars)``: ``call``'s arguments (the graph inputs each carries in ``env``) bound to
    ``params`` by position (a ``*name`` argument expands ``stars[name]``) and by keyword; the rest to ``*star``."""
    def carried(expr: ast.AST) -> Set[str]:
        return set().union(*(env.get(n.id, set()) for n in ast.walk(expr) if isinstance(n, ast.Name))) \
            if any(isinstance(n, ast.Name) for n in ast.walk(expr)) else set()

    positional: List[Set[str]] = []
    for arg in call.args:
        if isinstance(arg, ast.Starred) and isinstance(arg.value, ast.Name) and arg.value.id in stars:
            positional.extend(stars[arg.value.id])
        else:
            positional.append(carried(arg))
    new_env = {p: positional[i] if i < len(positional) else set() for i, p in enumerate(params)}
    for keyword in call.keywords:
        if keyword.arg in new_env:
            new_env[keyword.arg] = carried(keyword.value)
    new_stars = {star: positional[len(params):]} if star else {}
    return new_env, new_stars


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
