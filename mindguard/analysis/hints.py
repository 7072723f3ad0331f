"""A fix hint for the operator (or cell) that first produced Inf/NaN, fitted to the user's source line.

:func:`hint_for` is shared by the dump analyzer and the single-step replay (contract 5 in the design):
``kind`` is an op type as MindSpore names kernels (``"SqrtGrad"``, ``"Log"``, ``"Exp"``, ...) or a cell
class name (``"Norm"``, ``"Dense"``, ...); ``inputs``/``outputs`` are :func:`~mindguard.analysis.stats.tensor_stats`
dicts (missing keys are tolerated). The hint names the change that fits the user's code: an ``nn.Norm``
cell -> ``mindguard.SafeNorm`` / ``mindguard.make_safe(net)``; a functional 2-norm ``ops.norm(...)`` /
``mint.norm(...)`` -> ``mindguard.safe_norm(...)`` on that very line, shown as it is and as it would be (other
orders -- L1, inf, nuclear, the matrix spectral norm, a variable -- get the epsilon hint instead).
"""
from __future__ import annotations

import ast
import math
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

EPS = "1e-6"   # survives fp16 (1e-6 -> 1.013e-6); 1e-8 would round to 0 in fp16
FP16_MAX = 65504.0
FP32_MAX = 3.4028234663852886e38

_SQRT_KINDS = {"sqrt", "rsqrt", "sqrtgrad", "rsqrtgrad", "norm", "lpnorm", "normalize", "l2normalize",
               "l2normalizegrad", "lpnormgrad"}
_DIV_KINDS = {"realdiv", "div", "divnonan", "floordiv", "reciprocal", "reciprocalgrad", "truediv"}
_LOG_KINDS = {"log", "loggrad", "log1p", "log2", "log10", "xlogy"}
_POW_KINDS = {"pow", "powgrad"}
_EXP_KINDS = {"exp", "expm1", "softplus", "sigmoidcrossentropywithlogits", "cosh", "sinh"}
_OVERFLOW_KINDS = {"matmul", "batchmatmul", "dense", "conv2d", "conv2dbackpropinput", "conv2dbackpropfilter",
                   "mul", "square", "addn", "add", "reducesum", "biasadd", "cumsum", "reducemean"}
_NORM_LAYER_KINDS = {"layernorm", "layernormgrad", "batchnorm", "batchnormgrad", "groupnorm", "instancenorm",
                     "rmsnorm", "rmsnormgrad"}

_FUNCTIONAL_NORM = re.compile(r"\b(?P<mod>ops|mint|F|P|mindspore\.ops|ms\.ops|mindspore\.mint|ms\.mint)\.norm\(")
_SELF_CALL = re.compile(r"\bself\.(?P<attr>\w+)\(")
_LITERAL_NORM = re.compile(r"(?<![\w.])(?:(?:mindspore|ms)\.nn\.|nn\.)?Norm\(")
_MODULE = r"(?:mindspore\.ops|ms\.ops|mindspore\.mint|ms\.mint|mint\.nn\.functional|nn\.functional|ops|mint|F|P)"
_LOG_SOFTMAX = re.compile(rf"(?<![\w.])(?P<log>{_MODULE}\.log)\(\s*(?P<mod>{_MODULE})\.softmax\(")
_CELL_LOG_SOFTMAX = re.compile(r"\bself\.(?P<log>\w*log\w*)\(\s*self\.(?P<sm>\w*softmax\w*)\(", re.I)
_MAX_SOURCE_BYTES = 4_000_000


def hint_for(kind: str, inputs: Sequence[Dict[str, Any]], outputs: Sequence[Dict[str, Any]], *,
             direction: str, source_code: Optional[str] = None, source_file: Optional[str] = None,
             source_line: Optional[int] = None) -> str:
    """A one- or few-line hint naming the fix for the op/cell ``kind`` that produced the first Inf/NaN.

    ``direction`` is ``"forward"`` or ``"backward"``; ``source_code`` is the user's source line
    (innermost frame outside MindSpore) when known; ``source_file``/``source_line`` (1-based) locate it, so
    a cell's fix can be shown where the cell is created (``self.norm = nn.Norm(...)`` in ``__init__``). The
    file is only read, and a missing or edited file just gives a less specific hint.
    A custom cell class name that names a known op (``"LogCell"``, ``"MySqrt"``) gets that op's hint.
    """
    base = _canonical_kind(kind)
    code = (source_code or "").strip()
    site = (source_file, source_line) if source_file else None
    zeros = sum(int(s.get("zeros") or 0) for s in inputs if _is_float(s))
    negatives = sum(1 for s in inputs if _is_float(s) and s.get("min") is not None and s["min"] < 0)
    fp16 = any(str(s.get("dtype", "")).lower() in ("float16", "fp16") for s in [*inputs, *outputs])
    pos_inf_out = sum(int(s.get("pos_inf") or 0) for s in outputs)
    neg_inf_out = sum(int(s.get("neg_inf") or 0) for s in outputs)
    nan_out = sum(int(s.get("nan") or 0) for s in outputs)
    big_input = _largest(inputs)

    if base in _SQRT_KINDS or (base in _DIV_KINDS | _LOG_KINDS | _POW_KINDS and _mentions_norm(code)):
        return _sqrt_hint(kind, base, direction, code, zeros, fp16, site)
    if base in _LOG_KINDS | _DIV_KINDS and _log_of_softmax(code):
        return _log_softmax_hint(kind, direction, code, zeros, negatives)
    if base in _LOG_KINDS:
        return _log_hint(kind, direction, code, zeros, negatives, fp16)
    if base in _DIV_KINDS or base in _POW_KINDS:
        return _div_hint(kind, base, direction, code, zeros, negatives, fp16)
    if base in _NORM_LAYER_KINDS and (pos_inf_out or neg_inf_out or nan_out) \
            and big_input > math.sqrt(FP16_MAX if fp16 else FP32_MAX):
        return _norm_overflow_hint(kind, direction, _largest(inputs[:1]) or big_input, fp16)
    if base in _NORM_LAYER_KINDS:
        return (f"{kind} ({direction}) divides by sqrt(variance + epsilon): a constant input row has variance 0"
                f"{' and in fp16 a small epsilon rounds to 0' if fp16 else ''}. Keep the normalization layer in fp32 "
                f"(`cell.to_float(mindspore.float32)`) and use epsilon >= {EPS}.")
    if base in _EXP_KINDS or (pos_inf_out or neg_inf_out) and (base in _OVERFLOW_KINDS or fp16):
        return _overflow_hint(kind, base, direction, code, fp16, pos_inf_out + neg_inf_out, big_input)
    if fp16 and zeros:
        return _underflow_hint(kind, direction)
    what = f"{nan_out} NaN" if nan_out else f"{pos_inf_out + neg_inf_out} Inf"
    return (f"{kind} ({direction}) produced {what} from finite inputs. Look at its inputs' range above: "
            f"values near 0 in a denominator/log/sqrt need an epsilon ({EPS}); values beyond "
            f"{'65504 (fp16)' if fp16 else '3.4e38 (fp32)'} overflow -- clamp them"
            f"{', keep this op in fp32 (`cell.to_float(mindspore.float32)`) or use loss scaling' if fp16 else ''}.")


def _largest(stats: Sequence[Dict[str, Any]]) -> float:
    """Largest finite magnitude over the ``min``/``max`` of ``stats`` (0.0 when none is known)."""
    return max((abs(v) for s in stats for v in (s.get("min"), s.get("max"))
                if isinstance(v, (int, float)) and not isinstance(v, bool)), default=0.0)


def _base_kind(kind: str) -> str:
    """``"SqrtGrad"`` -> ``"sqrtgrad"``; scope-ish names (``"norm-Norm"``) keep their last word."""
    k = (kind or "").strip().split("/")[-1].split("-")[-1]
    return re.sub(r"\W", "", k).lower()


_KIND_WORDS = {"log": "log", "logarithm": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "div": "div", "divide": "div",
               "division": "div", "exp": "exp", "pow": "pow", "power": "pow", "norm": "norm",
               "reciprocal": "reciprocal"}
_KIND_SUFFIXES = ("", "cell", "layer", "op", "fn", "func", "module", "block", "grad")


def _canonical_kind(kind: str) -> str:
    """:func:`_base_kind`, and a custom cell class name that names a known op mapped to it.

    ``"LogCell"``/``"MyLog"``/``"SafeLog"`` -> ``"log"``, ``"RSqrtCell"`` -> ``"sqrt"``, ``"MyLayerNorm"`` ->
    ``"layernorm"``; ``"LogitsHead"`` stays itself (words are matched whole: CamelCase/underscore parts,
    optionally followed by a suffix such as "Cell" or "Layer").
    """
    base = _base_kind(kind)
    known = (_SQRT_KINDS | _DIV_KINDS | _LOG_KINDS | _POW_KINDS | _EXP_KINDS | _OVERFLOW_KINDS | _NORM_LAYER_KINDS)
    if base in known:
        return base
    for layer in sorted(_NORM_LAYER_KINDS, key=len, reverse=True):
        if layer in base and not layer.endswith("grad"):
            return layer
    name = (kind or "").strip().split("/")[-1].split("-")[-1]
    words = [w.lower() for w in re.findall(r"[A-Z]+(?![a-z])|[A-Z]?[a-z]+|\d+", name)]
    for word in words:
        for stem, mapped in _KIND_WORDS.items():
            if any(word == stem + suffix for suffix in _KIND_SUFFIXES):
                return mapped
    return base


def _is_float(stats: Dict[str, Any]) -> bool:
    dtype = str(stats.get("dtype", "float")).lower()
    return "float" in dtype or dtype.startswith("fp") or dtype in ("", "none")


def _mentions_norm(code: str) -> bool:
    return bool(_FUNCTIONAL_NORM.search(code)) or bool(re.search(r"self\.\w*norm\w*\(", code, re.I))


def _sqrt_hint(kind: str, base: str, direction: str, code: str, zeros: int, fp16: bool, site) -> str:
    if base in ("sqrtgrad", "rsqrtgrad"):
        what = (f"{kind} divides by its forward output sqrt(x), which is 0 in {zeros} element(s) here: the gradient "
                f"of sqrt at 0 is infinite (typically the norm of an all-zero vector, such as a padding embedding)")
    elif zeros:
        what = f"{kind} ({direction}) got {zeros} zero input(s): sqrt/norm at 0 has an infinite derivative or divides by 0"
    else:
        what = f"{kind} ({direction}) produced Inf/NaN from finite inputs (a negative or zero value under a sqrt/norm)"
    fix = _norm_fix(code, base, site)
    fp16_note = (f" In fp16 keep the epsilon >= 6e-8 (use {EPS}; 1e-8 rounds to 0) or keep the norm in fp32."
                 if fp16 else "")
    return f"{what}.\n{fix}{fp16_note}"


def _norm_fix(code: str, base: str, site) -> str:
    functional = _FUNCTIONAL_NORM.search(code)
    if functional:
        return _functional_norm_fix(code, functional)
    norm_attrs = [m.group("attr") for m in _SELF_CALL.finditer(code) if "norm" in m.group("attr").lower()]
    if base == "norm" or norm_attrs:
        attr = norm_attrs[0] if norm_attrs else "norm"
        found = _cell_assignment(site, attr, code) if site else None
        if found is not None:
            where, statement = found
            literal = _LITERAL_NORM.search(statement)
            if literal:
                new = statement[:literal.start()] + "mindguard.SafeNorm(" + statement[literal.end():]
                return (f"Fix: create `self.{attr}` as a mindguard.SafeNorm (drop-in for nn.Norm, same arguments, "
                        f"computes sqrt(sum(x**2) + {EPS})):\n"
                        f"    now:    {statement}    ({where})\n    fix:    {new}\n"
                        f"or call `mindguard.make_safe(net)` once after building the network (swaps every nn.Norm).")
            return (f"Fix: `self.{attr}` is not created by a literal nn.Norm(...) call, so swap it after building the "
                    f"network: call `mindguard.make_safe(net)` once, before training (replaces every nn.Norm by "
                    f"mindguard.SafeNorm, which computes sqrt(sum(x**2) + {EPS})):\n"
                    f"    line:   {statement}    ({where})")
        line = f"\n    line:   {code}" if code else ""
        return (f"Fix: make `self.{attr}` a mindguard.SafeNorm (drop-in for nn.Norm, same arguments, computes "
                f"sqrt(sum(x**2) + {EPS})): in __init__ `self.{attr} = mindguard.SafeNorm(axis=...)`, "
                f"or call `mindguard.make_safe(net)` once after building the network.{line}")
    if code and re.search(r"\bsqrt\(", code):
        new = _wrap_first_call_arg(code, re.compile(r"\bsqrt\("), lambda a: f"{a} + {EPS}")
        return f"Fix: add an epsilon under the square root:\n    now:    {code}\n    fix:    {new}"
    return (f"Fix: add an epsilon under the square root (sqrt(x + {EPS})); for norms use mindguard.SafeNorm / "
            f"mindguard.safe_norm, or mindguard.make_safe(net) to swap every nn.Norm."
            + (f"\n    line:   {code}" if code else ""))


_MINT_MODULES = ("mint", "mindspore.mint", "ms.mint")
_L2_ORDERS = (None, 2, 2.0, "fro")   # orders mindguard.safe_norm computes (2-norm / Frobenius over the dims)
_UNSET = object()


def _functional_norm_fix(code: str, match: "re.Match[str]") -> str:
    """The fix for a line calling ``ops.norm(...)``/``mint.norm(...)``: a ``safe_norm`` rewrite when it is a 2-norm."""
    new, reason = _rewrite_functional_norm(code, match)
    if new is not None:
        return ("Fix: use mindguard.safe_norm (sqrt(sum(x**2) + epsilon)) on that line:\n"
                f"    now:    {code}\n    fix:    {new}" + (f"\n({reason})" if reason else ""))
    return (f"Fix: {reason}, so mindguard.safe_norm (the 2-norm sqrt(sum(x**2) + epsilon)) does not replace it; "
            f"add an epsilon where the norm goes to 0 (under a sqrt: sqrt(x + {EPS}); before dividing by the norm: "
            f"norm + {EPS}).\n    line:   {code}")


def _rewrite_functional_norm(code: str, match: "re.Match[str]") -> Tuple[Optional[str], str]:
    """``(rewritten line, note)`` replacing the norm call by ``mindguard.safe_norm``; ``(None, why not)`` otherwise.

    Signatures (MindSpore 2.10): ``ops.norm(A, ord=None, dim=None, keepdim=False, *, dtype=None)`` (``ord=2``
    over two dims is the matrix spectral norm) and ``mint.norm(input, p='fro', dim=None, keepdim=False, *,
    dtype=None)`` (an int/float ``p`` is always a vector norm over ``dim``); ``safe_norm(x, axis=(),
    keep_dims=False, epsilon=1e-6)``. ``dim`` -> ``axis``, ``keepdim`` -> ``keep_dims``, the order is dropped.
    """
    module = match.group("mod")
    name = f"{module}.norm(...)"
    close = _matching_paren(code, match.end() - 1)
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
    params = ("input" if mint else "A", "p" if mint else "ord", "dim", "keepdim")
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
        return None, (f"`{text}` takes the norm of order {params[1]}={ast.get_source_segment(text, order_node)}, "
                      f"not a 2-norm")
    dim_node = given.get("dim", (None, False))[0]
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
    keywords = [(params[0], "x"), ("dim", "axis"), ("keepdim", "keep_dims")]
    positional = True
    for param, new_name in keywords:
        if param not in given:
            positional = False
            continue
        node, by_keyword = given[param]
        if param == "dim" and dim is None:   # dim=None: every axis, which is safe_norm's default axis=()
            positional = False
            continue
        source = ast.get_source_segment(text, node)
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


def _log_hint(kind: str, direction: str, code: str, zeros: int, negatives: int, fp16: bool) -> str:
    cause = []
    if zeros:
        cause.append(f"{zeros} zero input(s) (log(0) = -inf, and its gradient 1/x = inf)")
    if negatives:
        cause.append("negative input(s) (log(x<0) = NaN)")
    what = f"{kind} ({direction}) got " + (" and ".join(cause) if cause else "an input at or below 0")
    eps_note = f" (in fp16 the epsilon must be >= 6e-8; use {EPS})" if fp16 else ""
    pattern = re.compile(r"\b(?:ops|mint|np|F|P|mindspore\.ops|ms\.ops)\.log\(|\bself\.\w*log\w*\(|\blog\(")
    if code and pattern.search(code):
        new = _wrap_first_call_arg(code, pattern, lambda a: f"{a} + {EPS}")
        clamp = _wrap_first_call_arg(code, pattern, lambda a: f"ops.clamp({a}, min={EPS})")
        return (f"{what}. Fix: add an epsilon inside the log{eps_note}, or clamp the argument if it can go negative:\n"
                f"    now:    {code}\n    fix:    {new}\n    or:     {clamp}")
    return (f"{what}. Fix: `ops.log(x + {EPS})` or `ops.log(ops.clamp(x, min={EPS}))`{eps_note}."
            + (f"\n    line:   {code}" if code else ""))


def _log_of_softmax(code: str) -> bool:
    return bool(code) and bool(_LOG_SOFTMAX.search(code) or _CELL_LOG_SOFTMAX.search(code))


def _log_softmax_hint(kind: str, direction: str, code: str, zeros: int, negatives: int) -> str:
    """``log(softmax(x))``: softmax underflows to exactly 0 for unlikely classes; log_softmax never does."""
    got = f"{zeros} zero input(s)" if zeros else ("negative input(s)" if negatives else "an input at 0")
    what = (f"{kind} ({direction}) got {got}: softmax underflows to exactly 0 for classes far below the largest "
            f"logit, and log(0) = -inf (its gradient 1/x = inf)")
    why = ("log_softmax computes x - max(x) - log(sum(exp(x - max(x)))) and never takes log(0); for a "
           "cross-entropy, nn.SoftmaxCrossEntropyWithLogits / ops.cross_entropy take the logits directly")
    new = _rewrite_log_softmax(code)
    if new is not None:
        return (f"{what}.\nFix: compute log(softmax(x)) in one numerically stable op:\n"
                f"    now:    {code}\n    fix:    {new}\n({why}.)")
    return (f"{what}.\nFix: replace the log/softmax pair by one nn.LogSoftmax(axis) cell or ops.log_softmax(x, axis) "
            f"({why}).\n    line:   {code}")


def _rewrite_log_softmax(code: str) -> Optional[str]:
    """``ops.log(ops.softmax(x, axis=-1))`` -> ``ops.log_softmax(x, axis=-1)``; None when not that exact nesting."""
    match = _LOG_SOFTMAX.search(code)
    if not match:
        return None
    log_open = match.end("log")
    softmax_open = match.end() - 1
    softmax_close = _matching_paren(code, softmax_open)
    log_close = _matching_paren(code, log_open)
    if softmax_close is None or log_close is None or code[softmax_close + 1:log_close].strip():
        return None
    module = match.group("mod")
    function = (f"{module}.nn.functional.log_softmax" if module in ("mint", "mindspore.mint", "ms.mint")
                else f"{module}.log_softmax")
    return code[:match.start()] + f"{function}({code[softmax_open + 1:softmax_close]})" + code[log_close + 1:]


def _cell_assignment(site, attr: str, code: str) -> Optional[Tuple[str, str]]:
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


def _div_hint(kind: str, base: str, direction: str, code: str, zeros: int, negatives: int, fp16: bool) -> str:
    if base in _POW_KINDS:
        what = (f"{kind} ({direction}): a fractional or negative power of 0 or of a negative number "
                f"({zeros} zero input(s){', negative inputs' if negatives else ''})")
        fix = f"raise `x + {EPS}` (or `ops.clamp(x, min={EPS})`) instead of `x`"
    else:
        what = f"{kind} ({direction}) divides by zero ({zeros} zero input(s))"
        fix = f"add an epsilon to the denominator (`a / (b + {EPS})`) or use ops.div_no_nan where 0 is the right answer"
    if fp16:
        fix += f"; in fp16 the epsilon must be >= 6e-8 (use {EPS}) or keep the op in fp32"
    return f"{what}. Fix: {fix}." + (f"\n    line:   {code}" if code else "")


def _overflow_hint(kind: str, base: str, direction: str, code: str, fp16: bool, infs: int, big: float) -> str:
    limit = "65504 (the fp16 maximum)" if fp16 else "3.4e38 (the fp32 maximum)"
    if base in _EXP_KINDS:
        what = (f"{kind} ({direction}) overflowed to Inf in {infs} element(s): exp(x) exceeds {limit} for "
                f"x > {'11.09' if fp16 else '88.7'} (largest input magnitude here: {big:.4g})")
        fix = ("subtract the maximum before exponentiating (log-sum-exp; ops.softmax/ops.logsumexp do it), "
               "or clamp x")
    else:
        what = (f"{kind} ({direction}) overflowed to Inf in {infs} element(s): results exceed {limit} "
                f"(largest input magnitude here: {big:.4g})")
        fix = "scale the inputs down (normalize activations, lower the learning rate, clip gradients)"
    if fp16:
        fix += (", keep this op in fp32 (`cell.to_float(mindspore.float32)` on the cell, or an amp black list), "
                "or use loss scaling (mindspore.amp.DynamicLossScaleManager)")
    return f"{what}. Fix: {fix}." + (f"\n    line:   {code}" if code else "")


def _norm_overflow_hint(kind: str, direction: str, big: float, fp16: bool) -> str:
    """A normalization layer fed values so large that the square in its variance overflows (not a variance of 0)."""
    limit = "65504 (the fp16 maximum)" if fp16 else "3.4e38 (the fp32 maximum)"
    return (f"{kind} ({direction}) overflowed: its input reaches {big:.4g}, whose square (in the variance, "
            f"mean((x - mean)^2)) exceeds {limit}, so the variance and what follows become Inf/NaN. The problem is "
            f"the huge values, not a variance of 0: the training diverged before this layer (typically a learning "
            f"rate too high). Fix: lower the learning rate, clip gradients (e.g. `grads = ops.clip_by_global_norm("
            f"grads, 1.0)` in the train step), and normalise the inputs (features and targets to about unit range)"
            + (", or keep the layer in fp32 (`cell.to_float(mindspore.float32)`)" if fp16 else "") + ".")


def _underflow_hint(kind: str, direction: str) -> str:
    return (f"{kind} ({direction}) in fp16: values below 6e-8 underflow to 0 in fp16 and then divide or log to "
            f"Inf/NaN. Keep this op in fp32 (`cell.to_float(mindspore.float32)` or an amp black list) and use an "
            f"epsilon that survives fp16 ({EPS}, not 1e-8).")


def _matching_paren(text: str, open_index: int) -> Optional[int]:
    depth = 0
    for i in range(open_index, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return i
    return None


def _wrap_first_call_arg(code: str, call: "re.Pattern[str]", transform) -> str:
    """Apply ``transform`` to the first argument of the first call matching ``call`` (ending in ``(``)."""
    match = call.search(code)
    if not match:
        return code
    close = _matching_paren(code, match.end() - 1)
    if close is None:
        return code
    args = code[match.end():close]
    first, rest = _split_first_arg(args)
    return code[:match.end()] + transform(first.strip()) + rest + code[close:]


def _split_first_arg(args: str):
    depth = 0
    for i, ch in enumerate(args):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            return args[:i], args[i:]
    return args, ""


__all__: List[str] = ["hint_for"]


_INDEX_KINDS = {  # kind -> (table slot, index slot, where the row count comes from: ("axis", slot) / ("count", slot))
    "gather": (0, 1, ("axis", 2)), "gatherv2": (0, 1, ("axis", 2)), "sparsegatherv2": (0, 1, ("axis", 2)),
    "embeddinglookup": (0, 1, ("axis", None)), "gatherd": (0, 2, ("axis", 1)),
    "unsortedsegmentsum": (0, 1, ("count", 2)), "unsortedsegmentmax": (0, 1, ("count", 2)),
    "unsortedsegmentmin": (0, 1, ("count", 2)), "unsortedsegmentprod": (0, 1, ("count", 2)),
}


def stop_hint(kind: str, inputs: Sequence[Dict[str, Any]], *, direction: str, source_code: Optional[str] = None,
              log: Optional[str] = None) -> str:
    """A hint for the operator where a step that raised stopped (it did not complete), fitted to its inputs.

    ``inputs`` are the op's input statistics by slot (``slot``, ``shape``, ``min``, ``max``, optional ``parameter``
    / ``from``); ``log`` the file holding the training's exception message, when known. Index ops (Gather,
    EmbeddingLookup, UnsortedSegmentSum, ...) whose indices fall outside the table get an out-of-range hint.
    """
    base = _base_kind(kind)
    by_slot = {int(s["slot"]): s for s in inputs if "slot" in s}
    where = log or "the training's output (with `mindguard hunt`: the run folder's passN/output.log)"
    if base in _INDEX_KINDS:
        found = _index_out_of_range(kind, base, by_slot, source_code or "")
        if found:
            return found
    bad = [s for s in inputs if any(int(s.get(k) or 0) for k in ("nan", "pos_inf", "neg_inf"))]
    if bad:
        return (f"{kind} ({direction}) did not finish and its input(s) {[s['slot'] for s in bad]} hold Inf/NaN: "
                f"a device kernel can abort on them (Ascend `run task error`). Fix where they came from; "
                f"the exception message is in {where}.")
    return (f"{kind} ({direction}) did not finish: its inputs are shown above (check their shapes, dtypes and "
            f"value ranges against what {kind} accepts). The exception the training raised is in {where}.")


def _index_out_of_range(kind: str, base: str, by_slot: Dict[int, Dict[str, Any]], code: str) -> Optional[str]:
    table_slot, index_slot, (rule, slot) = _INDEX_KINDS[base]
    table, index = by_slot.get(table_slot), by_slot.get(index_slot)
    if not index or not isinstance(index.get("max"), (int, float)) or not isinstance(index.get("min"), (int, float)):
        return None
    if rule == "count":
        count = by_slot.get(slot, {}).get("max") if slot is not None else None
        if not isinstance(count, (int, float)):
            return None
        rows, what = int(count), f"{int(count)} segments (num_segments)"
        label, labels = "segment id", "segment ids"
    else:
        axis = by_slot.get(slot, {}).get("max", 0) if slot is not None else 0
        shape = (table or {}).get("shape")
        if not isinstance(axis, (int, float)) or not shape:
            return None
        axis = int(axis) % len(shape) if shape else 0
        rows = int(shape[axis])
        name = (table or {}).get("parameter") or _short_source((table or {}).get("from", "")) or "the table"
        what = f"{rows} rows of `{name}`" + (f" (axis {axis})" if axis else "")
        label, labels = "index", "indices"
    high, low = index["max"], index["min"]
    if high < rows and low >= 0:
        return None
    embedding = "embedding" in code.lower() or base == "embeddinglookup"
    if high >= rows:
        head = f"index out of range: max {label} {_num(high)} >= {what}"
        if rule == "count":
            fix = f"pass num_segments > {_num(high)} or drop/clip those ids"
        elif embedding:
            fix = (f"check the tokenizer/vocab size: the embedding has {rows} rows, so every id must be < {rows} "
                   f"(create it with vocab_size > {_num(high)}, or map unknown ids to an <unk> id); or clip the ids, "
                   f"`ops.clip_by_value(ids, 0, {rows - 1})`")
        else:
            fix = (f"indices must be in [0, {rows}): check how they are computed, or clip them, "
                   f"`ops.clip_by_value(indices, 0, {rows - 1})`")
    else:
        head = f"index out of range: min {label} {_num(low)} < 0 ({kind} needs {labels} in [0, {rows}))"
        fix = ("negative ids are often padding/ignore markers (-1, -100): map them to a valid id (e.g. the padding "
               "id) before the lookup, or mask them out")
        if low in (-2 ** 31, -2 ** 63):
            fix = (f"{_num(low)} is what Inf/NaN becomes when cast to an integer: the {labels} were computed from "
                   f"non-finite floats -- fix where those went non-finite")
    return (f"{head}; {fix}.\n(CPU kernels raise on out-of-range {labels}; device kernels may abort the step or "
            f"silently read wrong rows.)")


def _short_source(text: str) -> str:
    return text.split(" (", 1)[0].rsplit("/", 1)[-1]


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, (int, float)) and float(value).is_integer() else str(value)
