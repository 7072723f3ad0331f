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

import math
import re
from typing import Any, Dict, List, Optional, Sequence

from .counts import divisor_text, named_as_count
from .hint_text import (EPS, FP16_MAX, FP32_MAX, base_kind, is_float_stats, largest_magnitude, near_zero,
                        op_namespace)
from .origin_hints import origin_hint
# the hints split out of this module, imported from here by other modules and the tests
from .stop_hints import input_violation, stop_hint  # noqa: F401
from .ctc import ctc_samples
from .rewrite import (FUNCTIONAL_NORM, LOG_SOFTMAX, cell_assignment, rewrite_functional_norm,
                      rewrite_log_sigmoid, rewrite_log_softmax, rewrite_norm_cell, wrap_first_call_arg)


_SQRT_KINDS = {"sqrt", "rsqrt", "sqrtgrad", "rsqrtgrad", "norm", "lpnorm", "normalize", "l2normalize",
               "l2normalizegrad", "lpnormgrad"}
_DIV_KINDS = {"realdiv", "div", "divnonan", "floordiv", "reciprocal", "reciprocalgrad", "truediv"}
_LOG_KINDS = {"log", "loggrad", "log1p", "log2", "log10", "xlogy"}
_POW_KINDS = {"pow", "powgrad"}
_EXP_KINDS = {"exp", "expm1", "softplus", "sigmoidcrossentropywithlogits", "cosh", "sinh"}
_OVERFLOW_KINDS = {"matmul", "batchmatmul", "dense", "conv2d", "conv2dbackpropinput", "conv2dbackpropfilter",
                   "mul", "square", "addn", "add", "reducesum", "biasadd", "cumsum", "reducemean"}
_CONTRACTION_KINDS = {"matmul", "batchmatmul", "dense", "conv2d", "conv2dbackpropinput", "conv2dbackpropfilter",
                      "conv3d", "conv3dbackpropfilter", "reducesum", "reducemean", "cumsum", "addn"}
_NORM_LAYER_KINDS = {"layernorm", "layernormgrad", "batchnorm", "batchnormgrad", "groupnorm", "instancenorm",
                     "rmsnorm", "rmsnormgrad"}
_CTC_KINDS = {"ctcloss", "ctclossv2", "ctclossgrad", "ctclossv2grad"}
_ARC_KINDS = {"acos", "asin", "acosgrad", "asingrad", "atanh", "acosh", "arccos", "arcsin"}

_SELF_CALL = re.compile(r"\bself\.(?P<attr>\w+)\(")
_CELL_LOG_SOFTMAX = re.compile(r"\bself\.(?P<log>\w*log\w*)\(\s*self\.(?P<sm>\w*softmax\w*)\(", re.I)


def nonfinite_input_hint(name: str, source: str) -> Optional[str]:
    """The fix for a step whose graph input ``name`` (``source``: ``"batch"``/``"parameter"``) was already non-finite
    when it began; ``None`` when there is nothing more specific to say than the note listing it."""
    if source == "parameter" and name.split(".")[-1] in ("learning_rate", "lr"):
        return (f"the learning rate ({name}) was already Inf/NaN when the step began: the schedule that sets it (a "
                f"callback's assign, a warm-up or decay formula, a per-step list) produced it for this step -- look "
                f"for a division by zero or an overflow there")
    return None


def hint_for(kind: str, inputs: Sequence[Dict[str, Any]], outputs: Sequence[Dict[str, Any]], *,
             direction: str, source_code: Optional[str] = None, source_file: Optional[str] = None,
             source_line: Optional[int] = None, exp_summed: Optional[bool] = None) -> str:
    """A one- or few-line hint naming the fix for the op/cell ``kind`` that produced the first Inf/NaN.

    ``direction`` is ``"forward"`` or ``"backward"``; ``source_code`` is the user's source line
    (innermost frame outside MindSpore) when known; ``source_file``/``source_line`` (1-based) locate it, so
    a cell's fix can be shown where the cell is created (``self.norm = nn.Norm(...)`` in ``__init__``). The
    file is only read, and a missing or edited file just gives a less specific hint.
    A custom cell class name that names a known op (``"LogCell"``, ``"MySqrt"``) gets that op's hint.
    ``exp_summed``: whether the data flow shows the exp's values summed (a softmax, a log-sum-exp); False drops the
    log-sum-exp fix, which does not apply to an exp of its own (a box decode's ``exp(wh)``); None: not known.
    """
    base = _canonical_kind(kind)
    code = (source_code or "").strip()
    site = (source_file, source_line) if source_file else None
    if any(s.get("pos_inf") or s.get("neg_inf") for s in inputs) and not any(s.get("nan") for s in inputs) \
            and any(s.get("nan") for s in outputs):
        return _infinite_arithmetic_hint(kind, direction, code)
    zeros = sum(int(s.get("zeros") or 0) for s in inputs if is_float_stats(s))
    divisor = _divisor_slot(kind, base)
    if divisor is not None and len(inputs) > divisor and is_float_stats(inputs[divisor]):
        zeros = int(inputs[divisor].get("zeros") or 0)   # the zeros that divide, not the numerator's
    negatives = sum(1 for s in inputs if is_float_stats(s) and s.get("min") is not None and s["min"] < 0)
    fp16 = any(str(s.get("dtype", "")).lower() in ("float16", "fp16") for s in [*inputs, *outputs])
    pos_inf_out = sum(int(s.get("pos_inf") or 0) for s in outputs)
    neg_inf_out = sum(int(s.get("neg_inf") or 0) for s in outputs)
    nan_out = sum(int(s.get("nan") or 0) for s in outputs)
    big_input = largest_magnitude(inputs)

    if base in _CTC_KINDS:
        return _ctc_hint(kind, base, direction, code, inputs, outputs)
    if base in _ARC_KINDS:
        return _arc_hint(kind, base, direction, code, inputs)
    if base in _SQRT_KINDS or (base in _DIV_KINDS | _LOG_KINDS | _POW_KINDS and _mentions_norm(code)):
        return _sqrt_hint(kind, base, direction, code, zeros, fp16, site)
    if base in _LOG_KINDS | _DIV_KINDS and _log_of_softmax(code):
        return _log_softmax_hint(kind, direction, code, zeros, negatives)
    if base in _LOG_KINDS and rewrite_log_sigmoid(code):
        return _log_sigmoid_hint(kind, direction, code, zeros)
    if base in _LOG_KINDS:
        return _log_hint(kind, direction, code, zeros, negatives, fp16)
    if base in _DIV_KINDS and divisor is not None and len(inputs) > divisor \
            and int(inputs[divisor].get("zeros") or 0):
        count = _count_evidence(inputs[divisor], code)
        if count is not None:   # checked against the evidence: never an epsilon for a count
            return _count_hint(kind, direction, code, inputs, divisor, count, nan_out=bool(nan_out))
    if base in _DIV_KINDS and divisor is not None and len(inputs) > divisor and not near_zero(inputs[divisor]) \
            and not fp16 and big_input < math.sqrt(FP32_MAX):
        return _evidence_hint(kind, direction, code, inputs, outputs, fp16)   # no divisor near 0: do not say one
    if base in _DIV_KINDS or base in _POW_KINDS:
        return _div_hint(kind, base, direction, code, zeros, negatives, fp16, nan_out=bool(nan_out))
    if base in _NORM_LAYER_KINDS and (pos_inf_out or neg_inf_out or nan_out) \
            and big_input > math.sqrt(FP16_MAX if fp16 else FP32_MAX):
        return _norm_overflow_hint(kind, direction, largest_magnitude(inputs[:1]) or big_input, fp16)
    if base in _NORM_LAYER_KINDS:
        return (f"{kind} ({direction}) divides by sqrt(variance + epsilon): a constant input row has variance 0"
                f"{' and in fp16 a small epsilon rounds to 0' if fp16 else ''}. Keep the normalization layer in fp32 "
                f"(`cell.to_float(mindspore.float32)`) and use epsilon >= {EPS}.")
    if base in _EXP_KINDS or (pos_inf_out or neg_inf_out) and (base in _OVERFLOW_KINDS or fp16):
        return _overflow_hint(kind, base, direction, code, fp16, pos_inf_out + neg_inf_out, big_input,
                              summed=exp_summed)
    if nan_out and base in _CONTRACTION_KINDS and big_input >= math.sqrt(FP16_MAX if fp16 else FP32_MAX):
        # a sum of products of huge finite values: +Inf and -Inf partial sums
        return _overflow_hint(kind, base, direction, code, fp16, nan_out, big_input, as_nan=True)
    if fp16 and zeros:
        return _underflow_hint(kind, direction)
    return _evidence_hint(kind, direction, code, inputs, outputs, fp16)


def _evidence_hint(kind: str, direction: str, code: str, inputs: Sequence[Dict[str, Any]],
                   outputs: Sequence[Dict[str, Any]], fp16: bool) -> str:
    """An op outside the catalogue: what its input statistics show, and only the fixes they leave open -- an
    epsilon only when an input holds zeros, a clamp or scaling only when an input is huge; when neither, that both
    were ruled out."""
    nan_out = sum(int(s.get("nan") or 0) for s in outputs)
    infs = sum(int(s.get("pos_inf") or 0) + int(s.get("neg_inf") or 0) for s in outputs)
    what = f"{nan_out} NaN" if nan_out else f"{infs} Inf"
    floats = [s for s in inputs if is_float_stats(s) and not s.get("constant")]
    zeros = sum(int(s.get("zeros") or 0) for s in floats)
    limit = FP16_MAX if fp16 else FP32_MAX
    big = largest_magnitude(floats)
    head = f"{kind} ({direction}) produced {what} from finite inputs"
    open_fixes = []
    if zeros:
        open_fixes.append(f"{zeros} input value(s) are exactly 0: if {kind} divides by, takes the log or a root of "
                          f"an input, add an epsilon ({EPS}) there")
    if big >= math.sqrt(limit):
        open_fixes.append(f"an input reaches {big:.4g}, whose square or product with another exceeds "
                          f"{'65504 (fp16)' if fp16 else '3.4e38 (fp32)'}: scale it down or clamp it"
                          + (", or keep this op in fp32 (`cell.to_float(mindspore.float32)`) or use loss scaling"
                             if fp16 else ""))
    if open_fixes:
        return f"{head}. Its inputs: " + "; ".join(open_fixes) + "." + (f"\n    line:   {code}" if code else "")
    lo = min((s["min"] for s in floats if isinstance(s.get("min"), (int, float))), default=None)
    hi = max((s["max"] for s in floats if isinstance(s.get("max"), (int, float))), default=None)
    where = f" and lie in [{lo:.4g}, {hi:.4g}]" if lo is not None and hi is not None else ""
    return (f"{head}. Checked and ruled out: its float inputs hold no zero{where}, far from where a square or a "
            f"product overflows -- so no epsilon or clamp on them fixes it. The cause is what {kind} computes from "
            f"these values: check its other (integer or constant) inputs and its attributes against what {kind} "
            f"accepts, and the documentation of the case where it returns Inf/NaN."
            + (f"\n    line:   {code}" if code else ""))


def _count_evidence(stats: Dict[str, Any], code: str) -> Optional[str]:
    """Why the divisor ``stats`` is a count (a number of things, 0 when a batch has none), or None: the data flow
    shows it computed from integer/boolean values (``stats["count"]``, set by the dump analysis), or the line names it
    as a count and every value the statistics show is a whole number >= 0."""
    if stats.get("count"):
        return f"the divisor is {stats['count']}"
    lo, hi = stats.get("min"), stats.get("max")
    whole = isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo >= 0 \
        and float(lo).is_integer() and float(hi).is_integer()
    if whole and named_as_count(code):
        return f"the divisor is named `{divisor_text(code)}` on the line and holds whole numbers in [{lo:g}, {hi:g}]"
    return None


def _count_hint(kind: str, direction: str, code: str, inputs: Sequence[Dict[str, Any]], divisor: int, why: str, *,
                nan_out: bool) -> str:
    """A division by a count that is 0 in this batch: clamp the count to >= 1 (an empty selection then gives its
    sum, 0 when masked); an epsilon would turn the Inf into ~numerator/1e-6 and wreck the training."""
    api = op_namespace(code)
    zeros = int(inputs[divisor].get("zeros") or 0)
    numerator = largest_magnitude([s for i, s in enumerate(inputs) if i != divisor])
    name = divisor_text(code) or "count"
    clamp = f"torch.clamp({name}, min=1)" if api == "torch" else f"{api}.maximum({name}, 1)"
    what = (f"{kind} ({direction}) divides by a count that is 0 here: {why} ({zeros} zero) -- a batch with nothing "
            f"to count (no matched box, an empty mask, no valid token) gives {'0/0 = NaN' if nan_out else 'x/0 = Inf'}")
    harm = (f"An epsilon is wrong for a count: `/ ({name} + {EPS})` turns this into about "
            f"{numerator / float(EPS):.1g}, a loss that wrecks the training" if numerator else
            f"An epsilon is wrong for a count: `+ {EPS}` turns the Inf into a huge finite loss that wrecks the "
            f"training")
    fix = f"Fix: clamp the count to >= 1 (`{clamp}`), so a batch with none gives the plain (masked) sum"
    new = _replace_divisor(code, name, clamp) if code else None
    if new:
        return f"{what}. {harm}. {fix}:\n    now:    {code}\n    fix:    {new}"
    return f"{what}. {harm}. {fix}." + (f"\n    line:   {code}" if code else "")


def _replace_divisor(code: str, name: str, clamp: str) -> Optional[str]:
    """``code`` with its first ``/ name`` divided by ``clamp`` instead; None when the line has no such division."""
    pattern = re.compile(rf"(?<![/])/(?![/=])(\s*){re.escape(name)}(?![\w.(])")
    if not pattern.search(code):
        return None
    return pattern.sub(lambda m: f"/{m.group(1)}{clamp}", code, count=1)


def _ctc_hint(kind: str, base: str, direction: str, code: str, inputs: Sequence[Dict[str, Any]],
              outputs: Sequence[Dict[str, Any]]) -> str:
    """CTC loss is +Inf for a sample whose label cannot be aligned to its input: the label needs one time step per
    character plus one blank between every pair of equal neighbours, and the input gives fewer."""
    by_slot = {int(s["slot"]): s for s in inputs if "slot" in s} or dict(enumerate(inputs))
    samples = ctc_samples(base, by_slot)
    logits = by_slot.get(0) or {}
    finite = ""
    if isinstance(logits.get("min"), (int, float)) and isinstance(logits.get("max"), (int, float)):
        finite = (f" Its logits are finite (in [{logits['min']:.4g}, {logits['max']:.4g}]): not an overflow, and no "
                  f"epsilon or clamp of them changes it.")
    short = [s for s in samples or [] if s["has"] is not None and s["needs"] > s["has"]]
    if short:
        first = short[0]
        why = (f"{kind} ({direction}) is +Inf: no alignment exists for {len(short)} sample(s) -- sample "
               f"{first['sample']}'s label has {first['length']} character(s)"
               + (f" with {first['repeats']} pair(s) of equal neighbours, which need a blank between them, so it "
                  f"needs {first['needs']} time steps" if first["repeats"] else f", so it needs {first['needs']} "
                  f"time steps") + f", and its input gives {first['has']}.")
    elif samples is not None:
        return _evidence_hint(kind, direction, code, inputs, outputs, False)
    else:
        why = (f"{kind} ({direction}) made +Inf from finite inputs: CTC loss is +Inf for a sample whose label needs "
               f"more time steps than its input gives (one per character, plus one blank between every pair of "
               f"equal neighbours). Compare this batch's label lengths with its sequence lengths.")
    api = op_namespace(code)
    target = re.match(r"\s*([A-Za-z_]\w*)\s*(?:,[^=]*)?=", code or "")
    name = target.group(1) if target else "loss"
    mask = (f"{name} = torch.where(torch.isinf({name}), torch.zeros_like({name}), {name})" if api == "torch" else
            f"{name} = {api}.where({api}.isinf({name}), {api}.zeros_like({name}), {name})" if api == "mint" else
            f"{name} = ops.select(ops.isinf({name}), ops.zeros_like({name}), {name})")
    return (f"{why}{finite}\nFix: give such samples more time steps (wider images, less downsampling along the "
            f"sequence) or drop them from the dataset (keep a sample only if its label length plus its equal "
            f"neighbours fits the time steps); to train on meanwhile, zero the loss of the samples that cannot be "
            f"aligned, after the line:\n    now:    {code or '<the CTC loss call>'}\n    add:    {mask}\n"
            f"(measured on MindSpore 2.10 CPU: ignore_longer_outputs_than_inputs=True and zero_infinity=True still "
            f"return +Inf for such a sample.)")


def _arc_hint(kind: str, base: str, direction: str, code: str, inputs: Sequence[Dict[str, Any]]) -> str:
    """acos/asin are NaN outside [-1, 1] and their gradients infinite at +-1 (a cosine similarity that rounds to
    1.0000001)."""
    floats = [s for s in inputs if is_float_stats(s)]
    lo = min((s["min"] for s in floats if isinstance(s.get("min"), (int, float))), default=None)
    hi = max((s["max"] for s in floats if isinstance(s.get("max"), (int, float))), default=None)
    outside = lo is not None and hi is not None and (lo < -1 or hi > 1)
    what = (f"{kind} ({direction}) got input(s) in [{lo:.8g}, {hi:.8g}], outside [-1, 1] where it is defined (NaN)"
            if outside else f"{kind} ({direction}): at +-1 the derivative of acos/asin is infinite"
            + (f" (inputs in [{lo:.8g}, {hi:.8g}])" if lo is not None else ""))
    api = op_namespace(code)
    pattern = re.compile(r"\b(?:ops|mint|torch|np)\.(?:arccos|arcsin|acos|asin)\(|\.(?:acos|asin|arccos|arcsin)\(")
    if code and pattern.search(code) and not re.search(r"\.(?:acos|asin|arccos|arcsin)\(\s*\)", code):
        new = wrap_first_call_arg(code, pattern, lambda a: f"{api}.clamp({a}, -1 + {EPS}, 1 - {EPS})")
        return (f"{what}: a cosine or a normalised dot product rounds past 1. Fix: clamp the argument just inside "
                f"[-1, 1]:\n    now:    {code}\n    fix:    {new}")
    return (f"{what}: a cosine or a normalised dot product rounds past 1. Fix: clamp the argument just inside [-1, 1] "
            f"(`{api}.clamp(x, -1 + {EPS}, 1 - {EPS})`) before {kind}." + (f"\n    line:   {code}" if code else ""))


_KIND_WORDS = {"log": "log", "logarithm": "log", "sqrt": "sqrt", "rsqrt": "rsqrt", "div": "div", "divide": "div",
               "division": "div", "exp": "exp", "pow": "pow", "power": "pow", "norm": "norm",
               "reciprocal": "reciprocal"}
_KIND_SUFFIXES = ("", "cell", "layer", "op", "fn", "func", "module", "block", "grad")


def _canonical_kind(kind: str) -> str:
    """:func:`base_kind`, and a custom cell class name that names a known op mapped to it.

    ``"LogCell"``/``"MyLog"``/``"SafeLog"`` -> ``"log"``, ``"RSqrtCell"`` -> ``"sqrt"``, ``"MyLayerNorm"`` ->
    ``"layernorm"``; ``"LogitsHead"`` stays itself (words are matched whole: CamelCase/underscore parts,
    optionally followed by a suffix such as "Cell" or "Layer").
    """
    base = base_kind(kind)
    known = (_SQRT_KINDS | _DIV_KINDS | _LOG_KINDS | _POW_KINDS | _EXP_KINDS | _OVERFLOW_KINDS | _NORM_LAYER_KINDS
             | _CTC_KINDS | _ARC_KINDS)
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


def _infinite_arithmetic_hint(kind: str, direction: str, code: str) -> str:
    return (f"{kind} ({direction}) made NaN from infinite inputs (inf - inf, 0 * inf, inf / inf): typically an "
            f"attention row whose every score is masked with -inf, where softmax subtracts the row's max (-inf - -inf)."
            f" Fix: mask with a large finite negative instead of -inf (`masked_fill(scores, mask, -1e9)`, or "
            f"the dtype's minimum: -65504 in float16), or skip rows with nothing to attend to."
            + (f"\n    line:   {code}" if code else ""))


def _divisor_slot(kind: str, base: str) -> Optional[int]:
    """The input slot a division-like kernel divides by: 1 for ``Div``/``RealDiv`` (``a / b``), 0 for ``SqrtGrad``
    / ``RsqrtGrad`` (``dy / (2 * y)``, ``y = sqrt(x)`` its input 0); None when it is not one of those."""
    name = (kind or "").lower()
    if name in ("sqrtgrad", "rsqrtgrad"):
        return 0
    if name in ("div", "realdiv", "divnonan", "floordiv", "truediv"):
        return 1
    return None


def _mentions_norm(code: str) -> bool:
    return bool(FUNCTIONAL_NORM.search(code)) or bool(re.search(r"self\.\w*norm\w*\(", code, re.I))


def _sqrt_hint(kind: str, base: str, direction: str, code: str, zeros: int, fp16: bool, site) -> str:
    if base in ("sqrtgrad", "rsqrtgrad"):
        what = (f"{kind} divides by its forward output sqrt(x), which is 0 in {zeros} element(s) here: the gradient "
                f"of sqrt at 0 is infinite (typically the norm of an all-zero vector, such as a padding embedding)")
    elif zeros:
        what = (f"{kind} ({direction}) got {zeros} zero input(s): sqrt/norm at 0 has an infinite derivative or "
                f"divides by 0")
    else:
        what = f"{kind} ({direction}) produced Inf/NaN from finite inputs (a negative or zero value under a sqrt/norm)"
    fix = _norm_fix(code, base, site)
    fp16_note = (f" In fp16 keep the epsilon >= 6e-8 (use {EPS}; 1e-8 rounds to 0) or keep the norm in fp32."
                 if fp16 else "")
    return f"{what}.\n{fix}{fp16_note}"


def _norm_fix(code: str, base: str, site) -> str:
    functional = FUNCTIONAL_NORM.search(code)
    if functional:
        return _functional_norm_fix(code, functional)
    norm_attrs = [m.group("attr") for m in _SELF_CALL.finditer(code) if "norm" in m.group("attr").lower()]
    if base == "norm" or norm_attrs:
        attr = norm_attrs[0] if norm_attrs else "norm"
        found = cell_assignment(site, attr, code) if site else None
        if found is not None:
            where, statement = found
            new = rewrite_norm_cell(statement)
            if new is not None:
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
        new = wrap_first_call_arg(code, re.compile(r"\bsqrt\("), lambda a: f"{a} + {EPS}")
        return f"Fix: add an epsilon under the square root:\n    now:    {code}\n    fix:    {new}"
    return (f"Fix: add an epsilon under the square root (sqrt(x + {EPS})); for norms use mindguard.SafeNorm / "
            f"mindguard.safe_norm, or mindguard.make_safe(net) to swap every nn.Norm."
            + (f"\n    line:   {code}" if code else ""))


def _functional_norm_fix(code: str, match: "re.Match[str]") -> str:
    """The fix for a line calling ``ops.norm(...)``/``mint.norm(...)``: a ``safe_norm`` rewrite when it is a 2-norm."""
    new, reason = rewrite_functional_norm(code, match)
    if new is not None:
        return ("Fix: use mindguard.safe_norm (sqrt(sum(x**2) + epsilon)) on that line:\n"
                f"    now:    {code}\n    fix:    {new}" + (f"\n({reason})" if reason else ""))
    return (f"Fix: {reason}, so mindguard.safe_norm (the 2-norm sqrt(sum(x**2) + epsilon)) does not replace it; "
            f"add an epsilon where the norm goes to 0 (under a sqrt: sqrt(x + {EPS}); before dividing by the norm: "
            f"norm + {EPS}).\n    line:   {code}")


def _log_hint(kind: str, direction: str, code: str, zeros: int, negatives: int, fp16: bool) -> str:
    cause = []
    if zeros:
        cause.append(f"{zeros} zero input(s) (log(0) = -inf, and its gradient 1/x = inf)")
    if negatives:
        cause.append("negative input(s) (log(x<0) = NaN)")
    what = f"{kind} ({direction}) got " + (" and ".join(cause) if cause else "an input at or below 0")
    eps_note = f" (in fp16 the epsilon must be >= 6e-8; use {EPS})" if fp16 else ""
    pattern = re.compile(r"\b(?:ops|mint|np|F|P|torch|mindspore\.ops|ms\.ops)\.log\(|\bself\.\w*log\w*\(|\blog\(")
    api = op_namespace(code)
    if code and pattern.search(code):
        new = wrap_first_call_arg(code, pattern, lambda a: f"{a} + {EPS}")
        clamp = wrap_first_call_arg(code, pattern, lambda a: f"{api}.clamp({a}, min={EPS})")
        return (f"{what}. Fix: add an epsilon inside the log{eps_note}, or clamp the argument if it can go negative:\n"
                f"    now:    {code}\n    fix:    {new}\n    or:     {clamp}")
    return (f"{what}. Fix: `ops.log(x + {EPS})` or `ops.log(ops.clamp(x, min={EPS}))`{eps_note}."
            + (f"\n    line:   {code}" if code else ""))


def _log_sigmoid_hint(kind: str, direction: str, code: str, zeros: int) -> str:
    """``log(sigmoid(x))``: sigmoid of a logit below about -88 is exactly 0 in float32, and log(0) = -inf."""
    return (f"{kind} ({direction}) got {zeros or 'an'} input(s) of exactly 0: the sigmoid of a logit below about -88 "
            f"(float32) is 0, and log(0) = -inf (its gradient 1/x = inf).\nFix: compute log(sigmoid(x)) from the "
            f"logit, log(sigmoid(x)) = -softplus(-x) and log(1 - sigmoid(x)) = -softplus(x), which never take log(0):\n"
            f"    now:    {code}\n    fix:    {rewrite_log_sigmoid(code)}\n(or nn.BCEWithLogitsLoss on the logits; "
            f"measured on MindSpore 2.10 CPU: ops.logsigmoid and nn.LogSigmoid also return -inf at x = -200.)")


def _log_of_softmax(code: str) -> bool:
    return bool(code) and bool(LOG_SOFTMAX.search(code) or _CELL_LOG_SOFTMAX.search(code))


def _log_softmax_hint(kind: str, direction: str, code: str, zeros: int, negatives: int) -> str:
    """``log(softmax(x))``: softmax underflows to exactly 0 for unlikely classes; log_softmax never does."""
    got = f"{zeros} zero input(s)" if zeros else ("negative input(s)" if negatives else "an input at 0")
    what = (f"{kind} ({direction}) got {got}: softmax underflows to exactly 0 for classes far below the largest "
            f"logit, and log(0) = -inf (its gradient 1/x = inf)")
    why = ("log_softmax computes x - max(x) - log(sum(exp(x - max(x)))) and never takes log(0); for a "
           "cross-entropy, nn.SoftmaxCrossEntropyWithLogits / ops.cross_entropy take the logits directly")
    new = rewrite_log_softmax(code)
    if new is not None:
        return (f"{what}.\nFix: compute log(softmax(x)) in one numerically stable op:\n"
                f"    now:    {code}\n    fix:    {new}\n({why}.)")
    return (f"{what}.\nFix: replace the log/softmax pair by one nn.LogSoftmax(axis) cell or ops.log_softmax(x, axis) "
            f"({why}).\n    line:   {code}")


def _div_hint(kind: str, base: str, direction: str, code: str, zeros: int, negatives: int, fp16: bool,
              nan_out: bool = False) -> str:
    api = op_namespace(code)
    if base in _POW_KINDS:
        what = (f"{kind} ({direction}): a fractional or negative power of 0 or of a negative number "
                f"({zeros} zero input(s){', negative inputs' if negatives else ''})")
        fix = f"raise `x + {EPS}` (or `{api}.clamp(x, min={EPS})`) instead of `x`"
    elif nan_out and zeros:
        what = (f"{kind} ({direction}) divides 0 by 0 ({zeros} zero divisor(s), NaN out): typically a sum divided by "
                f"a count that is 0 here -- a mean over an empty mask, an empty class or a batch with no valid item")
        fix = (f"divide by `{api}.maximum(count, 1)` (or `{api}.clamp(count, min=1)`) so an empty selection gives 0, "
               f"or skip the term when the count is 0" + ("; ops.div_no_nan(a, b) returns 0 where b is 0"
                                                            if api == "ops" else ""))
    else:
        what = f"{kind} ({direction}) divides by zero ({zeros} zero input(s))"
        fix = f"add an epsilon to the denominator (`a / (b + {EPS})`) or use ops.div_no_nan where 0 is the right answer"
    if fp16:
        fix += f"; in fp16 the epsilon must be >= 6e-8 (use {EPS}) or keep the op in fp32"
    return f"{what}. Fix: {fix}." + (f"\n    line:   {code}" if code else "")


#: an exp call on a line of code (the one a clamp goes into)
_EXP_CALL = re.compile(r"\b(?:ops|mint|np|F|P|torch|mindspore\.ops|ms\.ops)\.exp\(|(?<![\w.])exp\(")


def _overflow_hint(kind: str, base: str, direction: str, code: str, fp16: bool, infs: int, big: float, *,
                   as_nan: bool = False, summed: Optional[bool] = None) -> str:
    limit = "65504 (the fp16 maximum)" if fp16 else "3.4e38 (the fp32 maximum)"
    edit = None   # the clamp as a now/fix edit, when the line holds the exp call
    if as_nan:
        what = (f"{kind} ({direction}) made NaN in {infs} element(s) from finite inputs: it sums products, and "
                f"partial sums beyond {limit} became +Inf and -Inf, whose sum is NaN (largest input magnitude here: "
                f"{big:.4g})")
        fix = ("scale the inputs down (normalize the features and activations, lower the learning rate, clip "
               "gradients)" + ("; in a backward op a loss scale multiplies every gradient: lower it"
                               if direction == "backward" else ""))
        return f"{what}. Fix: {fix}." + (f"\n    line:   {code}" if code else "")
    if base in _EXP_KINDS:
        what = (f"{kind} ({direction}) overflowed to Inf in {infs} element(s): exp(x) exceeds {limit} for "
                f"x > {'11.09' if fp16 else '88.7'} (largest input magnitude here: {big:.4g})")
        if summed is False:   # the data flow shows no sum of these exps: log-sum-exp does not apply
            top = '11.0' if fp16 else '80.0'
            fix = (f"clamp x before the exp (`{op_namespace(code)}.clamp(x, max={top})`) -- a guard that keeps exp "
                   f"finite; the values of x that large are the problem to fix")
            clamped = wrap_first_call_arg(code, _EXP_CALL, lambda a: f"{op_namespace(code)}.clamp({a}, max={top})") \
                if code and _EXP_CALL.search(code) else None
            if clamped is not None and clamped != code:
                edit = f"\n    now:    {code}\n    fix:    {clamped}"
        else:
            fix = ("subtract the maximum before exponentiating (log-sum-exp; ops.softmax/ops.logsumexp do it), "
                   "or clamp x")
    else:
        what = (f"{kind} ({direction}) overflowed to Inf in {infs} element(s): results exceed {limit} "
                f"(largest input magnitude here: {big:.4g})")
        fix = "scale the inputs down (normalize activations, lower the learning rate, clip gradients)"
    if fp16 and direction == "backward":
        # a backward op's values are gradients, multiplied by the loss scale: fp16 overflow there is the scale's
        what += "; in the backward pass these are gradients, multiplied by the loss scale"
        fix = ("lower the loss scale (FixedLossScaleManager(...) with a smaller value) or let "
               "DynamicLossScaleManager lower it on overflow (it skips the overflowing step), keep this op in fp32 "
               "(`cell.to_float(mindspore.float32)`, an amp black list), or " + fix)
    elif fp16:
        fix += (", keep this op in fp32 (`cell.to_float(mindspore.float32)` on the cell, or an amp black list), "
                "or use loss scaling (mindspore.amp.DynamicLossScaleManager)")
    if edit is not None:
        return f"{what}. Fix: {fix}:{edit}"
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


__all__: List[str] = ["hint_for", "origin_hint"]


