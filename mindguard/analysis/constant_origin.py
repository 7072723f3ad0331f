"""A constant of the graph the culprit's operand is computed from, as a ``traced_to`` entry (issue 52).

MindSpore folds a literal (``ops.log(x - 1.0)``, a ``-1e9`` mask fill) or a Python number a cell holds
(``h / self.temperature``) into the graph: the .ir writes it as an argument of the kernel that reads it,
``Tensor(shape=[], dtype=Float32, value=0)`` (:func:`.trace.constant_tensor`), already in the kernel's dtype -- a
``-1e9`` filled into a float16 mask is ``-inf`` there. From the culprit (or the op that first read a non-finite value
no Parameter or batch column held) its producers are followed a few kernels up; a constant is named when the rule
that makes it part of the failure holds:

* ``nonfinite_constant`` -- the constant holds Inf/NaN in the graph: read by the culprit itself as a number its
  dtype cannot hold (a literal on the line that does not fit it, quoted; a half-precision infinity on a line that
  writes no ``inf``), or read by the first op that held a non-finite value no Parameter or batch column held (an
  infinity a program writes on purpose, ``float('-inf')`` for a mask, is no origin of the culprit's);
* ``zero_divisor`` -- the divisor of a division is the constant 0 (read by the culprit, or reaching its divisor
  through ops that keep values);
* ``shifted_operand`` -- a scalar constant added to, subtracted from or multiplied into the operand of an op with
  a domain (log, sqrt, a division's divisor) one kernel before it: ``x - 1.0`` is 0 where ``x`` holds 1;
* ``large_constant`` -- an op that overflowed reads (one kernel up at most) a constant near its dtype's range
  (float16: ``|c| >= 1e3``; float32: ``|c| >= 1e30``).

The first two are the origin; the last two are said beside another origin (or alone, when there is none). The
source line is the reading kernel's, from the .ir. Only the .ir text and numbers; no MindSpore.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .flow import kernel_inputs, user_source
from .hint_text import FP16_MAX, FP32_MAX, quoted_number
from .provenance import SELECTING
from .trace import GraphTrace, NodeTrace, constant_tensor

#: division kernels: the slot of their divisor
DIVISORS = {"Div": 1, "RealDiv": 1, "FloorDiv": 1, "Reciprocal": 0}
#: ops with a domain: the slot whose value must stay inside it
DOMAIN_SLOTS = {"Log": 0, "Log1p": 0, "Sqrt": 0, "Rsqrt": 0, "Reciprocal": 0, "Div": 1, "RealDiv": 1, "FloorDiv": 1,
                "Acos": 0, "Asin": 0, "Acosh": 0, "Atanh": 0, "Pow": 0}
SHIFTS = {"Sub", "Add", "Mul", "Muls", "Adds", "SubExt", "AddExt", "Maximum", "Minimum"}
DECISIVE = ("nonfinite_constant", "zero_divisor")
LARGE = {"float16": 1e3, "bfloat16": 1e3, "float32": 1e30}
_MAXIMA = {"float16": FP16_MAX, "bfloat16": FP32_MAX, "float32": FP32_MAX}
_LITERAL = re.compile(r"(?<![\w.])[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?(?![\w.])")
DEPTH = 3


def _constants(node: NodeTrace) -> List[Tuple[int, Dict[str, Any]]]:
    """``(slot, statistics)`` of each constant tensor argument of ``node``'s call."""
    out = []
    for slot, arg in enumerate(node.args):
        if slot in node.input_nodes or slot in node.input_params:
            continue
        constant = constant_tensor(arg)
        if constant is not None:
            out.append((slot, constant))
    return out


def _walk(node: NodeTrace, slots: Sequence[int]) -> List[Tuple[NodeTrace, int, List[str], bool]]:
    """``(kernel, the culprit's input slot it feeds, op types from the culprit to it, every op between passes values
    through)`` for ``node`` itself and its producers up to :data:`DEPTH` kernels, nearest first."""
    out: List[Tuple[NodeTrace, int, List[str], bool]] = [(node, -1, [], True)]
    seen = {id(node)}
    frontier: List[Tuple[NodeTrace, Optional[int], List[str], bool]] = [(node, None, [], True)]
    for _ in range(DEPTH):
        following: List[Tuple[NodeTrace, Optional[int], List[str], bool]] = []
        for current, via, path, keeps in frontier:
            for at, kind, what, _out in kernel_inputs(current):
                if kind != "op" or id(what) in seen or (current is node and at not in slots):
                    continue
                seen.add(id(what))
                slot = at if current is node else via
                step = (what, slot, path + [what.primitive], keeps and what.primitive in SELECTING)
                following.append(step)
                out.append((what, int(slot if slot is not None else -1), step[2], step[3]))
        frontier = following
    return out


def _values(stats: Dict[str, Any]) -> List[float]:
    return [float(v) for v in (stats.get("values") or stats.get("values_shown") or [])]


def _value_text(values: List[float], stats: Dict[str, Any]) -> str:
    if not values:
        return f"a constant of shape {stats.get('shape')}"
    shown = ", ".join(quoted_number(v) for v in values[:4])
    return shown if len(values) == 1 else f"[{shown}{', ...' if len(values) > 4 or stats.get('elided') else ''}]"


def _literal(code: str, dtype: str) -> Optional[str]:
    """The number written on the line that does not fit ``dtype`` (``"-1e9"`` for float16), if one does not."""
    limit = _MAXIMA.get(dtype)
    for match in _LITERAL.finditer(code or ""):
        try:
            value = float(match.group(0))
        except ValueError:
            continue
        if limit is not None and abs(value) > limit:
            return match.group(0)
    return None


def beyond_range(stats: Dict[str, Any], code: str) -> bool:
    """Whether a non-finite constant of a kernel on line ``code`` is a finite number its dtype cannot hold (evidence:
    a literal on the line that does not fit, or a half-precision infinity on a line that writes no ``inf``) rather
    than an infinity the program writes on purpose (``float('-inf')`` for a mask)."""
    dtype = str(stats.get("dtype"))
    if _literal(code, dtype) is not None:
        return True
    return dtype in ("float16", "bfloat16") and bool(code) and "inf" not in code.lower()


def _rule(reader: NodeTrace, slot: int, values: List[float], stats: Dict[str, Any], culprit: NodeTrace,
          via: int, path: List[str], keeps: bool, overflowed: bool, code: str) -> Optional[str]:
    """Which rule (module docstring) names constant ``slot`` of ``reader`` (on line ``code``), or None."""
    if any(not math.isfinite(v) for v in values):   # read by the culprit itself, and not an infinity on purpose
        return "nonfinite_constant" if reader is culprit and beyond_range(stats, code) else None
    if not values:
        return None
    divisor = DIVISORS.get(culprit.primitive)
    if reader is culprit and DIVISORS.get(reader.primitive) == slot and all(v == 0 for v in values):
        return "zero_divisor"
    if reader is not culprit and keeps and divisor is not None and via == divisor and all(v == 0 for v in values):
        return "zero_divisor"
    domain = DOMAIN_SLOTS.get(culprit.primitive)
    if len(path) == 1 and domain is not None and via == domain and reader.primitive in SHIFTS and len(values) == 1:
        return "shifted_operand"
    large = LARGE.get(str(stats.get("dtype")))
    if overflowed and len(path) <= 1 and large is not None and max(abs(v) for v in values) >= large:
        return "large_constant"
    return None


def trace_constants(node: NodeTrace, trace: Optional[GraphTrace], culprit_type: str, slots: Sequence[int],
                    inputs: Sequence[Dict[str, Any]] = (), overflowed: bool = False,
                    source: Optional[Dict[str, Any]] = None) -> List[Dict[str, Any]]:
    """The constants (module docstring) ``node``'s input ``slots`` are computed from, as ``traced_to`` entries:
    the decisive ones first. ``inputs``: the culprit's input statistics (by ``slot``: what a shifted operand
    became); ``overflowed``: the culprit turned finite inputs into Inf; ``source``: the culprit's line as the
    report shows it (placed at its call when the .ir gives its kernel another call's line), else the .ir's."""
    found: List[Dict[str, Any]] = []
    for reader, via, path, keeps in _walk(node, slots):
        constants = _constants(reader)   # (the culprit's own constants are none of ``slots``: all are read)
        source_of = (source or user_source(reader, trace)) if reader is node and constants else \
            user_source(reader, trace) if constants else None
        for slot, stats in constants:
            values = _values(stats)
            rule = _rule(reader, slot, values, stats, node, slot if reader is node else via, path, keeps,
                         overflowed, str((source_of or {}).get("code") or ""))
            if rule is not None:
                found.append(constant_entry(rule, reader, slot, stats, values, via if reader is not node else slot,
                                            path, culprit_type, source_of, inputs))
    return sorted(found, key=lambda e: e["rule"] not in DECISIVE)


def constant_entry(rule: str, reader: NodeTrace, slot: int, stats: Dict[str, Any], values: List[float], via: int,
                   path: List[str], culprit: str, source: Optional[Dict[str, Any]],
                   inputs: Sequence[Dict[str, Any]] = ()) -> Dict[str, Any]:
    """The ``traced_to`` entry of constant ``slot`` of ``reader`` (its statistics ``stats``, ``values``) by
    ``rule``; ``via``: the culprit's input slot it reaches, ``path`` the op types from the culprit to ``reader``;
    ``source``: ``reader``'s line."""
    dtype = str(stats.get("dtype"))
    value = _value_text(values, stats)
    where = f" on line {source['line']} (`{source['code'].strip()}`)" if source else ""
    code = str((source or {}).get("code") or "")
    literal = _literal(code, dtype) if rule == "nonfinite_constant" else None
    beyond = rule == "nonfinite_constant" and beyond_range(stats, code)
    chain = " -> ".join(reversed(path))
    reads = f"input {slot} of {chain} -> {culprit} input {via}" if path else f"input {slot} of {reader.primitive}"
    if rule == "nonfinite_constant":
        if literal:
            said = (f": the literal {literal} does not fit {dtype} (largest {quoted_number(_MAXIMA[dtype])}), so the "
                    f"graph holds {value}")
        elif beyond and all(math.isinf(v) for v in values):
            said = (f": the graph holds {value} -- a number beyond {dtype}'s range (largest "
                    f"{quoted_number(_MAXIMA[dtype])}) was folded in there, the value the line reads does not fit")
        else:
            said = f": the graph holds {value}"
    elif rule == "zero_divisor":
        reads = f"the divisor of {culprit}" + (f" (through {chain})" if path else f" (input {slot})")
        said = ""
    elif rule == "shifted_operand":
        seen = next((i for i in inputs if i.get("slot") == via), {})
        zeros, low = int(seen.get("zeros") or 0), seen.get("min")
        became = (f", which holds {zeros} zero(s)" if zeros else
                  f", whose smallest value is {quoted_number(low)}" if isinstance(low, (int, float)) else "")
        said = f": {culprit} reads the result{became}"
    else:
        said = f": large for {dtype} (largest {quoted_number(_MAXIMA.get(dtype, FP32_MAX))}), and {culprit} overflowed"
    text = f"constant {value} ({dtype}), {reads}{where}{said}"
    entry = {"kind": "constant", "name": value, "argument": None, "slot": via, "path": list(reversed(path)),
             "rule": rule, "values": values[:8], "dtype": dtype, "shape": stats.get("shape"), "op": reader.primitive,
             "op_name": reader.full_name, "op_slot": slot, "source": source, "literal": literal,
             "beyond_range": beyond, "text": text}
    if len(values) == 1:
        entry["value"] = values[0]
    return entry


def constant_of_input(node: NodeTrace, trace: Optional[GraphTrace], slot: int) -> Optional[Dict[str, Any]]:
    """The entry of a non-finite input no Parameter or batch column held (the report's ``nonfinite_inputs``
    ``"unknown"`` source: ``node``'s input ``slot``) when that input is a non-finite constant of its call."""
    for at, stats in _constants(node):
        values = _values(stats)
        if at == slot and any(not math.isfinite(v) for v in values):
            return constant_entry("nonfinite_constant", node, at, stats, values, at, [], node.primitive,
                                  user_source(node, trace))
    return None
