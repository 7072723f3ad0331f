"""Rewriting the user's source line for a hint: read the user's file (read only, never fails), find where a
cell is assigned in ``__init__``, rewrite ``ops.norm``/``mint.norm`` as ``mindguard.safe_norm``, ``log(softmax)``
as ``log_softmax``, an ``nn.Norm(...)`` construction as ``mindguard.SafeNorm(...)``, wrap a call's argument.

Line numbers are 1-based where they come from traces (``site``), 0-based list indexes inside this module.
"""
from __future__ import annotations

import ast
import os
import re
from typing import Any, Dict, List, Optional, Tuple

_MODULE = r"(?:mindspore\.ops|ms\.ops|mindspore\.mint|ms\.mint|mint\.nn\.functional|nn\.functional|ops|mint|F|P)"
FUNCTIONAL_NORM = re.compile(r"\b(?P<mod>ops|mint|F|P|mindspore\.ops|ms\.ops|mindspore\.mint|ms\.mint|mnp"
                             r"|mindspore\.numpy|ms\.numpy)\.norm\(")
LITERAL_NORM = re.compile(r"(?<![\w.])(?:(?:mindspore|ms)\.nn\.|nn\.)?Norm\(")
LOG_SOFTMAX = re.compile(rf"(?<![\w.])(?P<log>{_MODULE}\.log)\(\s*(?P<mod>{_MODULE})\.softmax\(")
_MAX_SOURCE_BYTES = 4_000_000
_MINT_MODULES = ("mint", "mindspore.mint", "ms.mint")
_NUMPY_MODULES = ("mnp", "mindspore.numpy", "ms.numpy")
_L2_ORDERS = (None, 2, 2.0, "fro")   # orders mindguard.safe_norm computes (2-norm / Frobenius over the dims)
_UNSET = object()


def rewrite_functional_norm(code: str, match: "re.Match[str]") -> Tuple[Optional[str], str]:
    """``(rewritten line, note)`` replacing the norm call by ``mindguard.safe_norm``; ``(None, why not)`` otherwise.

    Signatures (MindSpore 2.10): ``ops.norm(A, ord=None, dim=None, keepdim=False, *, dtype=None)`` (``ord=2``
    over two dims is the matrix spectral norm) and ``mint.norm(input, p='fro', dim=None, keepdim=False, *,
    dtype=None)`` (an int/float ``p`` is always a vector norm over ``dim``), ``mindspore.numpy.norm(x, ord=None,
    axis=None, keepdims=False)`` (``ord=2`` over a 2-D input is the matrix 2-norm); ``safe_norm(x, axis=(),
    keep_dims=False, epsilon=1e-6)``. ``dim`` -> ``axis``, ``keepdim(s)`` -> ``keep_dims``, the order is dropped.
    """
    module = match.group("mod")
    name = f"{module}.norm(...)"
    close = matching_paren(code, match.end() - 1)
    if close is None:
        return None, f"the call `{name}` does not end on this line, so its arguments are unknown"
    text = code[match.start():close + 1]
    try:
        call = ast.parse(text, mode="eval").body
    except SyntaxError:
        return None, f"the call `{text}` could not be parsed"
    if not isinstance(call, ast.Call):
        return None, f"`{text}` is not a plain call"
    mint = module in _MINT_MODULES
    params = ("x", "ord", "axis", "keepdims") if module in _NUMPY_MODULES else \
        ("input" if mint else "A", "p" if mint else "ord", "dim", "keepdim")
    if len(call.args) > len(params) or any(isinstance(a, ast.Starred) for a in call.args) \
            or any(k.arg is None for k in call.keywords):
        return None, f"`{text}` passes arguments this hint cannot map (*args/**kwargs or too many)"
    given: Dict[str, Tuple[ast.expr, bool]] = {}   # parameter -> (node, passed by keyword)
    for param, node in zip(params, call.args):
        given[param] = (node, False)
    for keyword in call.keywords:
        if keyword.arg not in params:
            return None, f"`{text}` passes `{keyword.arg}=`, which mindguard.safe_norm has no counterpart for"
        given[keyword.arg] = (keyword.value, True)
    if params[0] not in given:
        return None, f"`{text}` has no input tensor argument"
    order_node = given.get(params[1], (None, False))[0]
    order = _literal(order_node) if order_node is not None else None
    if order is _UNSET or isinstance(order, bool) or order not in _L2_ORDERS:
        shown = ast.get_source_segment(text, order_node) if order_node is not None else None
        return None, (f"`{text}` takes the norm of order {params[1]}={shown}, "
                      f"not a 2-norm")
    dim_node = given.get(params[2], (None, False))[0]
    dim = _literal(dim_node) if dim_node is not None else None
    note = ""
    if not mint and order in (2, 2.0):
        if dim is None:
            return None, (f"`{text}` (ord=2, no dim) is the matrix spectral norm (largest singular value) for a 2-D "
                          f"input (a 2-norm only for a 1-D input)")
        if isinstance(dim, (tuple, list)) and len(dim) == 2:
            return None, (f"`{text}` (ord=2 over two dims) is the matrix spectral norm (largest singular value), "
                          f"not the 2-norm of the elements")
        if dim is _UNSET:
            note = ("valid when dim is a single axis: ops.norm with ord=2 over two dims is the matrix spectral "
                    "norm, which safe_norm does not compute")
    args: List[str] = []
    keywords = [(params[0], "x"), (params[2], "axis"), (params[3], "keep_dims")]
    positional = True
    for param, new_name in keywords:
        if param not in given:
            positional = False
            continue
        node, by_keyword = given[param]
        if param == params[2] and dim is None:   # dim=None: every axis, which is safe_norm's default axis=()
            positional = False
            continue
        source = ast.get_source_segment(text, node) or ""   # a parsed node always has its position
        if by_keyword or not positional:
            args.append(f"{new_name}={source}")
            positional = False
        else:
            args.append(source)
    new = code[:match.start()] + "mindguard.safe_norm(" + ", ".join(args) + ")" + code[close + 1:]
    return new, note


def _literal(node: ast.expr) -> Any:
    """The value of a literal argument (``2``, ``'fro'``, ``-1``, ``(0, 1)``, ``None``); ``_UNSET`` if not a literal."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _UNSET


def rewrite_log_softmax(code: str) -> Optional[str]:
    """``ops.log(ops.softmax(x, axis=-1))`` -> ``ops.log_softmax(x, axis=-1)``; None when not that exact nesting."""
    match = LOG_SOFTMAX.search(code)
    if not match:
        return None
    log_open = match.end("log")
    softmax_open = match.end() - 1
    softmax_close = matching_paren(code, softmax_open)
    log_close = matching_paren(code, log_open)
    if softmax_close is None or log_close is None or code[softmax_close + 1:log_close].strip():
        return None
    module = match.group("mod")
    function = (f"{module}.nn.functional.log_softmax" if module in ("mint", "mindspore.mint", "ms.mint")
                else f"{module}.log_softmax")
    return code[:match.start()] + f"{function}({code[softmax_open + 1:softmax_close]})" + code[log_close + 1:]


LOG_SIGMOID = re.compile(rf"(?<![\w.])(?P<log>(?:{_MODULE}|torch)\.log)\(")
_SIGMOID = re.compile(rf"^\s*(?P<one>1(?:\.0*)?\s*-\s*)?(?P<mod>{_MODULE}|torch)\.sigmoid\(")


def rewrite_log_sigmoid(code: str) -> Optional[str]:
    """``ops.log(ops.sigmoid(x))`` -> ``-ops.softplus(-(x))`` and ``ops.log(1 - ops.sigmoid(x))`` ->
    ``-ops.softplus(x)``: log(sigmoid) from the logit, which never takes log(0). None when the line has no such
    nesting (an epsilon term after the sigmoid, ``+ 1e-6``, is dropped: it is not needed any more)."""
    for match in LOG_SIGMOID.finditer(code):
        close = matching_paren(code, match.end() - 1)
        if close is None:
            continue
        argument = code[match.end():close]
        inner = _SIGMOID.match(argument)
        if not inner:
            continue
        start = match.end() + inner.end() - 1
        end = matching_paren(code, start)
        if end is None or (code[end + 1:close].strip() and not re.fullmatch(r"\s*\+\s*[\d.e-]+\s*",
                                                                            code[end + 1:close])):
            continue
        x = code[start + 1:end].strip()
        module = inner.group("mod")
        softplus = "torch.nn.functional.softplus" if module == "torch" else \
            "mint.nn.functional.softplus" if module in ("mint", "mindspore.mint", "ms.mint") else f"{module}.softplus"
        value = f"-{softplus}({x})" if inner.group("one") else f"-{softplus}(-({x}))" if not re.fullmatch(
            r"[\w.]+", x) else f"-{softplus}(-{x})"
        prefix = code[:match.start()]
        if prefix.rstrip().endswith("-"):   # -log(sigmoid(x)) -> softplus(-x)
            head = prefix.rstrip()[:-1]
            return head + value[1:] + code[close + 1:]
        return prefix + value + code[close + 1:]
    return None


def cell_assignment(site, attr: str, code: str) -> Optional[Tuple[str, str]]:
    """Where ``self.<attr> = ...`` is written: ``("file.py:36", statement)`` or None.

    ``site`` is ``(file, 1-based line)`` of the call. Prefers the ``__init__`` of the class enclosing the call,
    then that class, then anywhere in the file. Never raises: an unreadable, missing or edited file gives None.
    """
    path, line = site
    try:
        lines = _read_lines(path)
        if not lines:
            return None
        call = _locate(lines, line, code)
        assignment = re.compile(rf"^\s*self\.{re.escape(attr)}\s*(?::[^=]+)?=(?!=)")
        scopes = []
        if call is not None:
            klass = _enclosing(lines, call, "class")
            if klass is not None:
                init = next((i for i in range(*klass) if re.match(r"\s*def\s+__init__\s*\(", lines[i])), None)
                if init is not None:
                    scopes.append((init, _block_end(lines, init)))
                scopes.append(klass)
        scopes.append((0, len(lines)))
        for start, end in scopes:
            for i in range(start, end):
                if assignment.match(lines[i]):
                    return f"{os.path.basename(path)}:{i + 1}", _statement(lines, i)
    except (OSError, ValueError, TypeError, IndexError, re.error):
        return None
    return None


def _read_lines(path: str) -> Optional[List[str]]:
    if not os.path.isfile(path) or os.path.getsize(path) > _MAX_SOURCE_BYTES:
        return None
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read().splitlines()


def _locate(lines: List[str], line: Optional[int], code: str) -> Optional[int]:
    """0-based index of the call: ``line`` if the file still holds ``code`` there, else the nearest line that does."""
    def holds(i: int) -> bool:
        text = lines[i].strip()
        return not code or (bool(text) and (text == code or code.startswith(text) or text.startswith(code)))

    if isinstance(line, int) and 1 <= line <= len(lines) and holds(line - 1):
        return line - 1
    if code:
        hits = [i for i in range(len(lines)) if lines[i].strip() == code]
        if hits:
            return min(hits, key=lambda i: abs(i - (line or 0)))
    return None


def _indent(text: str) -> int:
    return len(text) - len(text.lstrip())


def _enclosing(lines: List[str], index: int, keyword: str) -> Optional[Tuple[int, int]]:
    """0-based ``[start, end)`` of the innermost ``class`` (``keyword``) block holding line ``index``."""
    level = _indent(lines[index])
    for i in range(index - 1, -1, -1):
        text = lines[i]
        if not text.strip() or text.lstrip().startswith("#") or _indent(text) >= level:
            continue
        level = _indent(text)
        if re.match(rf"\s*{keyword}\s+\w+", text):
            return i, _block_end(lines, i)
        if level == 0:
            return None
    return None


def _block_end(lines: List[str], header: int) -> int:
    indent = _indent(lines[header])
    end = header + 1
    while end < len(lines) and (not lines[end].strip() or _indent(lines[end]) > indent):
        end += 1
    return end


def _statement(lines: List[str], index: int) -> str:
    """The statement starting at ``index``, continuation lines joined (up to 10 lines)."""
    parts = [lines[index].strip()]
    i = index
    while _depth(" ".join(parts)) > 0 and i + 1 < len(lines) and i - index < 10:
        i += 1
        parts.append(lines[i].strip())
    text = " ".join(parts)
    return re.sub(r"\s+\)", ")", re.sub(r"([(\[])\s+", r"\1", text))


def _depth(text: str) -> int:
    return sum(text.count(c) for c in "([{") - sum(text.count(c) for c in ")]}")


def matching_paren(text: str, open_index: int) -> Optional[int]:
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def wrap_first_call_arg(code: str, call: "re.Pattern[str]", transform) -> str:
    """Apply ``transform`` to the first argument of the first call matching ``call`` (ending in ``(``)."""
    match = call.search(code)
    if not match:
        return code
    close = matching_paren(code, match.end() - 1)
    if close is None:
        return code
    args = code[match.end():close]
    first, rest = split_first_arg(args)
    return code[:match.end()] + transform(first.strip()) + rest + code[close:]


def split_first_arg(args: str):
    depth = 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i], args[i:]
    return args, ""


def rewrite_norm_cell(statement: str) -> Optional[str]:
    """``self.norm = nn.Norm(axis=-1)`` -> ``self.norm = mindguard.SafeNorm(axis=-1)``; None without a literal Norm."""
    literal = LITERAL_NORM.search(statement)
    if not literal:
        return None
    return statement[:literal.start()] + "mindguard.SafeNorm(" + statement[literal.end():]
