"""The line a functional ``value_and_grad`` loop needs, read from the script's source (pure: ``ast`` only).

MindSpore's functional loop -- ``grad_fn = mindspore.value_and_grad(forward_fn, None, weights)``, a ``train_step``
that calls ``grad_fn`` then ``optimizer(grads)``, a ``for`` loop calling ``train_step`` -- has no callback and no
object whose call is one training step, so the attach hook cannot wrap it by itself. From the ``value_and_grad``
call's line it finds, where it can, the names of the step function, the network and the optimizer, and the loop,
so that the line it prints is the one to add: ``train_step = mindguard.watch(train_step, net, optimizer)``.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import Iterator, List, Optional, Tuple


@dataclass(frozen=True)
class Advice:
    """``line``: the Python line to add; ``after``: the 1-based line of the script it goes after (None: unknown);
    ``where``: where, in words; ``loop``: the 1-based line of the loop that calls the step (None: not found)."""

    line: str
    after: Optional[int]
    where: str
    loop: Optional[int] = None


def already_watched(source: str) -> bool:
    """The script wraps a step with ``mindguard.watch`` itself (its own wiring: nothing to advise)."""
    return "mindguard" in source and "watch(" in source


def functional_advice(source: str, lineno: int) -> Advice:
    """The line to add for the ``value_and_grad`` call on line ``lineno`` of ``source`` (names it cannot find are
    the usual ``train_step``, ``net``, ``optimizer``)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return _generic()
    call, grad_name = _grad_call(tree, lineno)
    if call is None:
        return _generic()
    forward = call.args[0].id if call.args and isinstance(call.args[0], ast.Name) else None
    weights = call.args[2] if len(call.args) > 2 else next((k.value for k in call.keywords if k.arg == "weights"),
                                                           None)
    optimizer = net = None
    if isinstance(weights, ast.Attribute) and weights.attr == "parameters" and isinstance(weights.value, ast.Name):
        optimizer = weights.value.id
    net = _trained_by(weights)
    step = _calling(tree, grad_name) if grad_name else None
    if step is not None and optimizer is None:
        optimizer = _applied_optimizer(step, grad_name)
    if net is None and optimizer is not None:
        net = _optimizer_net(tree, optimizer)
    if net is None and forward is not None:
        net = _first_called(tree, forward)
    step_name = step.name if step is not None else "train_step"
    line = f"{step_name} = mindguard.watch({step_name}, {net or 'net'}, {optimizer or 'optimizer'})"
    if step is None:
        return Advice(line, None, f"after the function that calls `{grad_name or 'grad_fn'}` (your train step)")
    end = getattr(step, "end_lineno", None) or step.lineno
    loop = _loop_calling(tree, step.name)
    if loop is None or loop <= end:
        return Advice(line, end, f"after `def {step.name}` (line {end}), before the loop that calls it")
    # just before the loop: after anything else the script does to the step (``train_step = jit(train_step)``)
    return Advice(line, loop - 1, f"just before the loop on line {loop} (after `def {step.name}`, line {end})", loop)


def _generic() -> Advice:
    return Advice("train_step = mindguard.watch(train_step, net, optimizer)", None,
                  "after your train step function, before the loop")


def _grad_call(tree: ast.AST, lineno: int) -> Tuple[Optional[ast.Call], Optional[str]]:
    """The ``value_and_grad(...)`` call on line ``lineno`` and the name its result is assigned to."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.lineno <= lineno <= (node.end_lineno or node.lineno):
            value = node.value
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(value, ast.Call) and _callee(value) == "value_and_grad":
                return value, target.id if isinstance(target, ast.Name) else None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _callee(node) == "value_and_grad" and node.lineno == lineno:
            return node, None
    return None, None


def _callee(call: ast.Call) -> Optional[str]:
    func = call.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else None


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef]:
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node   # type: ignore[misc]


def _calls_in(node: ast.AST) -> List[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _calling(tree: ast.AST, name: str) -> Optional[ast.FunctionDef]:
    """The innermost function whose body calls ``name(...)``: the train step."""
    found = [f for f in _functions(tree)
             if any(isinstance(c.func, ast.Name) and c.func.id == name for c in _calls_in(f))]
    return min(found, key=lambda f: (f.end_lineno or f.lineno) - f.lineno) if found else None


def _applied_optimizer(step: ast.FunctionDef, grad_name: Optional[str]) -> Optional[str]:
    """In the step: ``X(grads)`` where ``grads`` came from ``grad_fn(...)``: the optimizer ``X``."""
    produced: List[str] = []
    for node in ast.walk(step):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) \
                and isinstance(node.value.func, ast.Name) and node.value.func.id == grad_name:
            produced += [n.id for t in node.targets for n in ast.walk(t) if isinstance(n, ast.Name)]
    for call in _calls_in(step):
        if isinstance(call.func, ast.Name) and call.func.id != grad_name and any(
                isinstance(n, ast.Name) and n.id in produced for a in call.args for n in ast.walk(a)):
            return call.func.id
    return None


def _trained_by(weights: Optional[ast.expr]) -> Optional[str]:
    """``net`` of ``net.trainable_params()`` (or ``net.get_parameters()``)."""
    if isinstance(weights, ast.Call) and isinstance(weights.func, ast.Attribute) \
            and weights.func.attr in ("trainable_params", "get_parameters", "parameters") \
            and isinstance(weights.func.value, ast.Name):
        return weights.func.value.id
    return None


def _optimizer_net(tree: ast.AST, optimizer: str) -> Optional[str]:
    """``net`` of ``optimizer = nn.SGD(net.trainable_params(), ...)``."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == optimizer for t in node.targets) \
                and isinstance(node.value, ast.Call):
            for arg in [*node.value.args, *(k.value for k in node.value.keywords)]:
                net = _trained_by(arg)
                if net is not None:
                    return net
    return None


def _first_called(tree: ast.AST, forward: str) -> Optional[str]:
    """The first name the forward function calls (``logits = net(data)``): the network."""
    function = next((f for f in _functions(tree) if f.name == forward), None)
    if function is None:
        return None
    calls = sorted((c for c in _calls_in(function) if isinstance(c.func, ast.Name)),
                   key=lambda c: (c.lineno, c.col_offset))
    return calls[0].func.id if calls else None   # type: ignore[attr-defined]


def _loop_calling(tree: ast.AST, step: str) -> Optional[int]:
    """The line of the outermost loop that calls ``step(...)``."""
    best: Optional[int] = None
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor)) and any(
                isinstance(c.func, ast.Name) and c.func.id == step for c in _calls_in(node)):
            best = node.lineno if best is None else min(best, node.lineno)
    return best
