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
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .counts import divisor_text, named_as_count
from .ctc import ctc_samples
from .rewrite import (FUNCTIONAL_NORM, LOG_SOFTMAX, cell_assignment, rewrite_functional_norm,
                      rewrite_log_sigmoid, rewrite_log_softmax, rewrite_norm_cell, wrap_first_call_arg)

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
    zeros = sum(int(s.get("zeros") or 0) for s in inputs if _is_float(s))
    divisor = _divisor_slot(kind, base)
    if divisor is not None and len(inputs) > divisor and _is_float(inputs[divisor]):
        zeros = int(inputs[divisor].get("zeros") or 0)   # the zeros that divide, not the numerator's
    negatives = sum(1 for s in inputs if _is_float(s) and s.get("min") is not None and s["min"] < 0)
    fp16 = any(str(s.get("dtype", "")).lower() in ("float16", "fp16") for s in [*inputs, *outputs])
    pos_inf_out = sum(int(s.get("pos_inf") or 0) for s in outputs)
    neg_inf_out = sum(int(s.get("neg_inf") or 0) for s in outputs)
    nan_out = sum(int(s.get("nan") or 0) for s in outputs)
    big_input = _largest(inputs)

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
    if base in _DIV_KINDS and divisor is not None and len(inputs) > divisor and not _near_zero(inputs[divisor]) \
            and not fp16 and big_input < math.sqrt(FP32_MAX):
        return _evidence_hint(kind, direction, code, inputs, outputs, fp16)   # no divisor near 0: do not say one
    if base in _DIV_KINDS or base in _POW_KINDS:
        return _div_hint(kind, base, direction, code, zeros, negatives, fp16, nan_out=bool(nan_out))
    if base in _NORM_LAYER_KINDS and (pos_inf_out or neg_inf_out or nan_out) \
            and big_input > math.sqrt(FP16_MAX if fp16 else FP32_MAX):
        return _norm_overflow_hint(kind, direction, _largest(inputs[:1]) or big_input, fp16)
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
    floats = [s for s in inputs if _is_float(s) and not s.get("constant")]
    zeros = sum(int(s.get("zeros") or 0) for s in floats)
    limit = FP16_MAX if fp16 else FP32_MAX
    big = _largest(floats)
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
    api = _api(code)
    zeros = int(inputs[divisor].get("zeros") or 0)
    numerator = _largest([s for i, s in enumerate(inputs) if i != divisor])
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


def _near_zero(stats: Dict[str, Any], tiny: float = 1e-30) -> bool:
    """Whether a tensor may hold values at or near 0: zeros counted, its range crosses 0, or an end is tiny
    (unknown statistics count as near 0)."""
    lo, hi = stats.get("min"), stats.get("max")
    if stats.get("zeros") or not isinstance(lo, (int, float)) or not isinstance(hi, (int, float)):
        return True
    return lo <= tiny and hi >= -tiny


def _api(code: str) -> str:
    """The namespace the user's line calls ops through, for a fix written in the same terms: ``"torch"`` for a
    torch-style line (``torch.``, ``F.``: mindnlp/mindtorch code), ``"mint"``, else ``"ops"``."""
    if re.search(r"\btorch\.|\bF\.\w+\(", code or ""):
        return "torch"
    if re.search(r"\bmint\.", code or ""):
        return "mint"
    return "ops"


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
    api = _api(code)
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
    floats = [s for s in inputs if _is_float(s)]
    lo = min((s["min"] for s in floats if isinstance(s.get("min"), (int, float))), default=None)
    hi = max((s["max"] for s in floats if isinstance(s.get("max"), (int, float))), default=None)
    outside = lo is not None and hi is not None and (lo < -1 or hi > 1)
    what = (f"{kind} ({direction}) got input(s) in [{lo:.8g}, {hi:.8g}], outside [-1, 1] where it is defined (NaN)"
            if outside else f"{kind} ({direction}): at +-1 the derivative of acos/asin is infinite"
            + (f" (inputs in [{lo:.8g}, {hi:.8g}])" if lo is not None else ""))
    api = _api(code)
    pattern = re.compile(r"\b(?:ops|mint|torch|np)\.(?:arccos|arcsin|acos|asin)\(|\.(?:acos|asin|arccos|arcsin)\(")
    if code and pattern.search(code) and not re.search(r"\.(?:acos|asin|arccos|arcsin)\(\s*\)", code):
        new = wrap_first_call_arg(code, pattern, lambda a: f"{api}.clamp({a}, -1 + {EPS}, 1 - {EPS})")
        return (f"{what}: a cosine or a normalised dot product rounds past 1. Fix: clamp the argument just inside "
                f"[-1, 1]:\n    now:    {code}\n    fix:    {new}")
    return (f"{what}: a cosine or a normalised dot product rounds past 1. Fix: clamp the argument just inside [-1, 1] "
            f"(`{api}.clamp(x, -1 + {EPS}, 1 - {EPS})`) before {kind}." + (f"\n    line:   {code}" if code else ""))


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


def _is_float(stats: Dict[str, Any]) -> bool:
    dtype = str(stats.get("dtype", "float")).lower()
    return "float" in dtype or dtype.startswith("fp") or dtype in ("", "none")


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
    api = _api(code)
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
    api = _api(code)
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


def _overflow_hint(kind: str, base: str, direction: str, code: str, fp16: bool, infs: int, big: float, *,
                   as_nan: bool = False, summed: Optional[bool] = None) -> str:
    limit = "65504 (the fp16 maximum)" if fp16 else "3.4e38 (the fp32 maximum)"
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
            fix = (f"clamp x before the exp (`{_api(code)}.clamp(x, max={'11.0' if fp16 else '80.0'})`) -- a guard "
                   f"that keeps exp finite; the values of x that large are the problem to fix")
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


def origin_hint(traced: Sequence[Dict[str, Any]], op_hint: Optional[str], kind: str) -> Optional[str]:
    """The hint once the culprit's operands are traced to their origin (:mod:`.provenance`): fix the origin first
    (the data, its converter, the vocabulary, the schedule); the op's own fix follows only as a guard, and a guard
    that would hide a bad value silently is never offered alone. None when ``traced`` holds nothing to fix."""
    if not traced:
        return None
    first = traced[0]
    rule = first.get("rule")
    op_text = (op_hint or "").strip()
    what = op_text.split(". Fix:", 1)[0].split("; ", 1)[0].splitlines()[0] if op_text else ""
    if first.get("kind") == "batch":
        name = first.get("argument") or first.get("name")
        rows = ", ".join(str(r) for r in first.get("rows") or [])
        values = ", ".join(_short(v) for v in (first.get("values") or [])[:4])
        where = f"`{name}` row{'s' if len(first.get('rows') or []) > 1 else ''} {rows}"
        if rule == "mask_not_0_1":
            fix = (f"Fix the data first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} {values} where "
                   f"a 0/1 mask is expected -- the converter that wrote this column put other values (token ids?) "
                   f"there; fix it and rewrite those records. As a guard, check the column where the data is read "
                   f"and raise naming the row (`assert ((mask == 0) | (mask == 1)).all()`); a clamp or a cast to bool "
                   f"would hide a wrong row silently.")
        elif rule == "index_out_of_range":
            fix = (f"Fix the data first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} {values}, "
                   f"outside {first.get('expected')} ({first.get('why')}): the tokenizer, vocabulary or id mapping "
                   f"that wrote this column does not match the table -- use the table's vocabulary (or build the "
                   f"table with enough rows). As a guard, check the ids where the data is read and raise naming the "
                   f"row.")
        elif rule == "nonfinite":
            fix = (f"Fix the data first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} {values}: the "
                   f"sample, its decoding or its normalisation made them -- fix that record or its preprocessing. As "
                   f"a guard, check the column where the data is read and raise naming the row; replacing NaN by 0 "
                   f"would hide the broken sample.")
        elif rule == "zero_size_box":
            fix = (f"Fix the annotations first: {where} hold{'' if len(first.get('rows') or []) > 1 else 's'} boxes "
                   f"of zero width or height ({first.get('why')}): drop or repair them in the data pipeline (a "
                   f"filter that says how many it dropped). An epsilon in the division would hide them.")
        else:
            fix = f"Fix the data first: {first.get('text')}."
        if _base_kind(kind) in _INDEX_KINDS and op_text:
            return f"{fix}\nThe op: {op_text}"
        return fix + (f"\nThe op: {what}." if what else "")
    if first.get("kind") == "hyper_parameter":
        if rule == "learning_rate_jump":
            fix = (f"Fix the schedule first: the learning rate is {_short(first.get('value'))} at global step "
                   f"{first.get('step')}, {first.get('ratio'):.3g}x the {_short(first.get('before'))} it was before it "
                   f"jumped at global step {first.get('since_step')}: the weights it trained grew until {kind} "
                   f"overflowed. Check the schedule's formula or list (its peak value, a warm-up end, a unit, a "
                   f"multiplier).")
        else:
            fix = (f"Check the learning rate first: it is {_short(first.get('value'))} at this step, and {kind} "
                   f"overflowed on values computed from the weights it trained, with no batch value outside its "
                   f"domain -- lower it (or warm it up), and clip gradients.")
        return fix + (f"\nThe op, as a guard only: {op_text}" if op_text else "")
    return None


_INDEX_KINDS = {  # kind -> (table slot, index slot, where the row count comes from: ("axis", slot) / ("count", slot))
    "gather": (0, 1, ("axis", 2)), "gatherv2": (0, 1, ("axis", 2)), "sparsegatherv2": (0, 1, ("axis", 2)),
    "embeddinglookup": (0, 1, ("axis", None)), "gatherd": (0, 2, ("axis", 1)),
    "unsortedsegmentsum": (0, 1, ("count", 2)), "unsortedsegmentmax": (0, 1, ("count", 2)),
    "unsortedsegmentmin": (0, 1, ("count", 2)), "unsortedsegmentprod": (0, 1, ("count", 2)),
}


def stop_hint(kind: str, inputs: Sequence[Dict[str, Any]], *, direction: str, source_code: Optional[str] = None,
              log: Optional[str] = None, message: Optional[str] = None) -> str:
    """A hint for the operator where a step that raised stopped (it did not complete), fitted to its inputs.

    ``inputs`` are the op's input statistics by slot (``slot``, ``shape``, ``min``, ``max``, optional ``parameter``
    / ``from``); ``log`` the file holding the training's exception message, when known. Index ops (Gather,
    EmbeddingLookup, UnsortedSegmentSum, ...) whose indices fall outside the table get an out-of-range hint; when
    the indices were not dumped (a graph input), the numbers of the kernel's own ``message`` (``"range [0, 10000),
    but got 10007"``) give it.
    """
    base = _base_kind(kind)
    by_slot = {int(s["slot"]): s for s in inputs if "slot" in s}
    where = log or "the training's output (with `mindguard hunt`: the run folder's passN/output.log)"
    if base in _INDEX_KINDS:
        found = _index_out_of_range(kind, base, by_slot, source_code or "")
        if found:
            return found
    stated = _range_in_message(kind, message or "")
    if stated is not None and (base in _INDEX_KINDS or stated[3]):
        low, high, got, _ = stated
        table = by_slot.get(_INDEX_KINDS[base][0]) if base in _INDEX_KINDS else None
        index_stats = {"min": got, "max": got}
        rows_from = {"shape": [high - low], "dtype": "float32",
                     "parameter": (table or {}).get("parameter"), "from": (table or {}).get("from", "")}
        if base in _INDEX_KINDS and _INDEX_KINDS[base][2][0] == "axis" and low == 0:
            table_slot, index_slot, (_, axis_slot) = _INDEX_KINDS[base]
            found = _index_out_of_range(kind, base, {table_slot: rows_from, index_slot: index_stats},
                                        source_code or "")
            if found:
                return (found.replace(f"max index {_num(got)}", f"index {_num(got)} (from the kernel's message: "
                                      f"\"range [{low}, {high}), but got {got}\")", 1))
        return (f"{kind} ({direction}) raised: its own message says a value {got} is outside the range "
                f"[{low}, {high}) it accepts. Find where that input is computed (or read from the data) and keep it in "
                f"[{low}, {high}) -- clip it (`ops.clip_by_value(x, {low}, {high - 1})`) or fix its source."
                + (f"\n    line:   {source_code.strip()}" if source_code else ""))
    bad = [s for s in inputs if any(int(s.get(k) or 0) for k in ("nan", "pos_inf", "neg_inf"))]
    if bad:
        return (f"{kind} ({direction}) did not finish and its input(s) {[s['slot'] for s in bad]} hold Inf/NaN: "
                f"a device kernel can abort on them (Ascend `run task error`). Fix where they came from; "
                f"the exception message is in {where}.")
    return (f"{kind} ({direction}) did not finish: its inputs are shown above (check their shapes, dtypes and "
            f"value ranges against what {kind} accepts). The exception the training raised is in {where}.")


_MESSAGE_RANGE = re.compile(r"(?:For '(?P<op>\w+)'.*?)?range \[(?P<low>-?\d+), (?P<high>-?\d+)\), but got "
                            r"(?P<got>-?\d+)", re.S)


def _range_in_message(kind: str, message: str) -> Optional[Tuple[int, int, int, bool]]:
    """``(low, high, got, names_kind)`` from a kernel error message ``"For 'Gather', the 'input_indices' should be
    in the range [0, 10000), but got 10007"``; ``names_kind``: the message names ``kind``. None when absent or the
    message names another op."""
    match = _MESSAGE_RANGE.search(message)
    if match is None:
        return None
    named = match.group("op")
    if named and _base_kind(named) != _base_kind(kind):
        return None
    return int(match.group("low")), int(match.group("high")), int(match.group("got")), bool(named)


def input_violation(kind: str, inputs: Sequence[Dict[str, Any]]) -> Optional[str]:
    """What about ``kind``'s inputs makes it raise (``"index 50 >= 50 rows"``), or ``None`` when nothing known does:
    the evidence that tells the kernel a step stopped in from the others the runtime stopped with it."""
    base = _base_kind(kind)
    if base not in _INDEX_KINDS:
        return None
    found = _index_out_of_range(kind, base, {int(s["slot"]): s for s in inputs if "slot" in s}, "")
    return found.split(";", 1)[0] if found else None


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
    embedding = "embedding" in code.lower() or base == "embeddinglookup" or \
        "embedding" in str((table or {}).get("parameter") or "").lower()
    if high >= rows:
        head = f"index out of range: max {label} {_num(high)} >= {what}"
        if rule == "count":
            fix = f"pass num_segments > {_num(high)} or drop/clip those ids"
        elif embedding:
            fix = (f"check the tokenizer/vocab size: the embedding has {rows} rows, so every id must be < {rows} "
                   f"(create it with vocab_size > {_num(high)}, or map unknown ids to an <unk> id); only as a guard, "
                   f"once the data is fixed, clip the ids, `ops.clip_by_value(ids, 0, {rows - 1})` -- alone it "
                   f"silently reads another row for a bad id")
        else:
            fix = (f"indices must be in [0, {rows}): check how they are computed; only as a guard, clip them, "
                   f"`ops.clip_by_value(indices, 0, {rows - 1})` -- alone it silently reads another row")
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


def _short(value: Any) -> str:
    """A number as the answer quotes it: whole numbers as ints, others to 4 significant digits."""
    if isinstance(value, float) and not float(value).is_integer():
        return f"{value:.4g}"
    return _num(value)


def _num(value: Any) -> str:
    return str(int(value)) if isinstance(value, (int, float)) and float(value).is_integer() else str(value)
