"""A fix hint for the operator (or cell) that first produced Inf/NaN, fitted to the user's source line.

:func:`hint_for` is shared by the dump analyzer and the single-step replay (contract 5 in the design):
``kind`` is an op type as MindSpore names kernels (``"SqrtGrad"``, ``"Log"``, ``"Exp"``, ...) or a cell
class name (``"Norm"``, ``"Dense"``, ...); ``inputs``/``outputs`` are :func:`~mindguard.analysis.stats.tensor_stats`
dicts (missing keys are tolerated). The hint names the change that fits the user's code: an ``nn.Norm``
cell -> ``mindguard.SafeNorm`` / ``mindguard.make_safe(net)``; a functional ``ops.norm(...)`` ->
``mindguard.safe_norm(...)`` on that very line, shown as it is and as it would be.
"""
from __future__ import annotations

import re
from typing import Any, Dict, List, Optional, Sequence

EPS = "1e-6"   # survives fp16 (1e-6 -> 1.013e-6); 1e-8 would round to 0 in fp16
FP16_MAX = 65504.0

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


def hint_for(kind: str, inputs: Sequence[Dict[str, Any]], outputs: Sequence[Dict[str, Any]], *,
             direction: str, source_code: Optional[str] = None) -> str:
    """A one- or few-line hint naming the fix for the op/cell ``kind`` that produced the first Inf/NaN.

    ``direction`` is ``"forward"`` or ``"backward"``; ``source_code`` is the user's source line
    (innermost frame outside MindSpore) when known.
    """
    base = _base_kind(kind)
    code = (source_code or "").strip()
    zeros = sum(int(s.get("zeros") or 0) for s in inputs if _is_float(s))
    negatives = sum(1 for s in inputs if _is_float(s) and s.get("min") is not None and s["min"] < 0)
    fp16 = any(str(s.get("dtype", "")).lower() in ("float16", "fp16") for s in [*inputs, *outputs])
    pos_inf_out = sum(int(s.get("pos_inf") or 0) for s in outputs)
    neg_inf_out = sum(int(s.get("neg_inf") or 0) for s in outputs)
    nan_out = sum(int(s.get("nan") or 0) for s in outputs)
    big_input = max((abs(v) for s in inputs for v in (s.get("min"), s.get("max"))
                     if isinstance(v, (int, float))), default=0.0)

    if base in _SQRT_KINDS or (base in _DIV_KINDS | _LOG_KINDS | _POW_KINDS and _mentions_norm(code)):
        return _sqrt_hint(kind, base, direction, code, zeros, fp16)
    if base in _LOG_KINDS:
        return _log_hint(kind, direction, code, zeros, negatives, fp16)
    if base in _DIV_KINDS or base in _POW_KINDS:
        return _div_hint(kind, base, direction, code, zeros, negatives, fp16)
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


def _base_kind(kind: str) -> str:
    """``"SqrtGrad"`` -> ``"sqrtgrad"``; scope-ish names (``"norm-Norm"``) keep their last word."""
    k = (kind or "").strip().split("/")[-1].split("-")[-1]
    return re.sub(r"\W", "", k).lower()


def _is_float(stats: Dict[str, Any]) -> bool:
    dtype = str(stats.get("dtype", "float")).lower()
    return "float" in dtype or dtype.startswith("fp") or dtype in ("", "none")


def _mentions_norm(code: str) -> bool:
    return bool(_FUNCTIONAL_NORM.search(code)) or bool(re.search(r"self\.\w*norm\w*\(", code, re.I))


def _sqrt_hint(kind: str, base: str, direction: str, code: str, zeros: int, fp16: bool) -> str:
    if base in ("sqrtgrad", "rsqrtgrad"):
        what = (f"{kind} divides by its forward output sqrt(x), which is 0 in {zeros} element(s) here: the gradient "
                f"of sqrt at 0 is infinite (typically the norm of an all-zero vector, such as a padding embedding)")
    elif zeros:
        what = f"{kind} ({direction}) got {zeros} zero input(s): sqrt/norm at 0 has an infinite derivative or divides by 0"
    else:
        what = f"{kind} ({direction}) produced Inf/NaN from finite inputs (a negative or zero value under a sqrt/norm)"
    fix = _norm_fix(code, kind)
    fp16_note = (f" In fp16 keep the epsilon >= 6e-8 (use {EPS}; 1e-8 rounds to 0) or keep the norm in fp32."
                 if fp16 else "")
    return f"{what}.\n{fix}{fp16_note}"


def _norm_fix(code: str, kind: str) -> str:
    functional = _FUNCTIONAL_NORM.search(code)
    if functional:
        new = _rewrite_functional_norm(code, functional)
        return ("Fix: use mindguard.safe_norm (sqrt(sum(x**2) + epsilon)) on that line:\n"
                f"    now:    {code}\n    fix:    {new}")
    norm_attrs = [m.group("attr") for m in _SELF_CALL.finditer(code) if "norm" in m.group("attr").lower()]
    if _base_kind(kind) == "norm" or norm_attrs:
        attr = norm_attrs[0] if norm_attrs else "norm"
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


def _rewrite_functional_norm(code: str, match: "re.Match[str]") -> str:
    start = match.start()
    end = _matching_paren(code, match.end() - 1)
    if end is None:
        return code[:start] + "mindguard.safe_norm(" + code[match.end():]
    args = code[match.end():end]
    args = re.sub(r"\bdim\s*=", "axis=", args)
    args = re.sub(r"\bkeepdim\s*=", "keep_dims=", args)
    return code[:start] + "mindguard.safe_norm(" + args + code[end:]


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
