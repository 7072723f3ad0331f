"""The rules of MindSpore's dump-config parser (``dump_json_parser.cc``), one check per field of a
:class:`~mindguard.dump.config.DumpConfig`, plus the cases MindSpore ignores or rewrites silently. Each check raises
:class:`~mindguard.errors.DumpConfigError` naming the field, the value, the rule and the fix.

Index bases: a *dump iteration* is 0-based.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple, Union

from .._util.ranges import format_ranges
from ..errors import DumpConfigError

_DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_PATH_CHARS = re.compile(r"[^A-Za-z0-9_/-]")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_REGEX_PREFIX = "name-regex("
# statistic categories MindSpore computes on the host / on the device (Ascend, stat_calc_mode="device")
HOST_STATISTICS = ("max", "min", "avg", "count", "negative zero count", "positive zero count", "nan count",
                   "negative inf count", "positive inf count", "zero count", "md5", "l2norm", "hash",
                   "hash:sha1", "hash:md5")
DEVICE_STATISTICS = ("max", "min", "avg", "l2norm")
DEFAULT_SUPPORT_DEVICE = tuple(range(8))


# --------------------------------------------------------------------------------------------- checks
def _is_uint(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _require_uint(field: str, value: Any, fix: str) -> int:
    if not _is_uint(value):
        raise DumpConfigError(field, value, "must be a non-negative int (MindSpore reads it as a JSON unsigned int)",
                              fix)
    return int(value)


def require_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DumpConfigError(field, value, "must be a bool (MindSpore reads a JSON true/false)",
                              f"{field}=True or False")
    return value


# MindSpore's limits on iteration ids (measured on 2.10 CPU, pinned by tests/test_robust_dump.py):
# its parser reads each number with ``std::stoul`` (64 bits): a larger one logs "Out of Range error: stoul"
# and is never dumped; the dump's iteration counter is 32 bits (``initial_iteration`` 4294967295 is
# followed by iteration 0), so an id above 2**32 - 1 is never reached either.
ITERATION_MAX = 2 ** 32 - 1
STOUL_MAX = 2 ** 64 - 1
_ITERATION_CHARS = frozenset("0123456789|-")
_ASCII_DIGITS = frozenset("0123456789")
_ITERATION_FIX = 'iteration="all", an int like 5, a list of ints, or a string like "0|5-8" (ASCII digits, no spaces)'


def parse_iteration_ranges(iteration: str) -> List[Tuple[int, int]]:
    """The inclusive ``(low, high)`` ranges of 0-based dump iterations a dump-config string selects, as
    MindSpore reads it, sorted and merged; raises :class:`DumpConfigError` where MindSpore would dump
    nothing for a part of it (or refuse it).

    MindSpore's rules (2.10, measured): anything but ASCII digits, ``-`` and ``|`` (or exactly ``"all"``,
    which this function does not take) fails the first compile; empty parts between ``|`` are skipped
    (``"1||2"`` is 1 and 2, ``"|1"`` and ``"1|"`` are 1); a part is ``N`` or ``N-M`` (inclusive, leading
    zeros allowed: ``"007"`` is 7); a part of any other shape (``"5-"``, ``"-5"``, ``"1-2-3"``), a range
    with ``N > M``, or a number above ``2**64 - 1`` matches nothing, silently or with an error logged.
    mindguard refuses those parts, and numbers above ``2**32 - 1``, which the 32-bit counter never reaches.
    """
    if not iteration:
        raise DumpConfigError("iteration", iteration, "must not be empty (MindSpore refuses it at the first "
                              "compile)", _ITERATION_FIX)
    bad = sorted(set(iteration) - _ITERATION_CHARS)
    if bad:
        raise DumpConfigError("iteration", iteration,
                              f"MindSpore accepts only the ASCII digits 0-9, '-', '|' or exactly \"all\"; found "
                              f"{''.join(bad)!r} (it would refuse the config at the first compile)", _ITERATION_FIX)
    ranges: List[Tuple[int, int]] = []
    for part in iteration.split("|"):
        if not part:
            continue  # MindSpore skips empty parts: "1||2" selects 1 and 2
        bounds = part.split("-")
        if len(bounds) > 2 or not all(bounds):
            raise DumpConfigError("iteration", iteration,
                                  f"part {part!r} is neither N nor N-M (MindSpore would silently never match it)",
                                  _ITERATION_FIX)
        for text in bounds:
            digits = text.lstrip("0") or "0"
            shown = digits if len(digits) <= 30 else f"{digits[:12]}...({len(digits)} digits)"
            # at most 20 digits before int(): Python refuses to read numbers of more than 4300 digits
            if len(digits) > 20 or int(digits) > STOUL_MAX:
                raise DumpConfigError("iteration", iteration,
                                      f"{shown} is above 2**64 - 1: MindSpore cannot read it (it logs 'Out of Range "
                                      f"error: stoul') and dumps nothing for that part", _ITERATION_FIX)
            if int(digits) > ITERATION_MAX:
                raise DumpConfigError("iteration", iteration,
                                      f"{shown} is above {ITERATION_MAX} (2**32 - 1): MindSpore counts dump "
                                      f"iterations in 32 bits, so it never reaches it", _ITERATION_FIX)
        low, high = int(bounds[0]), int(bounds[-1])   # ASCII digits within 32 bits: read exactly
        if high < low:
            raise DumpConfigError("iteration", iteration,
                                  f"range {part!r} is empty (ranges are low-high, inclusive)", _ITERATION_FIX)
        ranges.append((low, high))
    if not ranges:
        raise DumpConfigError("iteration", iteration, "names no iteration (MindSpore would dump nothing)",
                              _ITERATION_FIX)
    ranges.sort()
    merged = [ranges[0]]
    for low, high in ranges[1:]:
        if low <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], high))
        else:
            merged.append((low, high))
    return merged


def format_iteration_ranges(ranges: Iterable[Tuple[int, int]]) -> str:
    """``[(0, 0), (5, 8)]`` -> ``"0|5-8"``: sorted, merged inclusive ranges in MindSpore's syntax."""
    return "|".join(str(low) if low == high else f"{low}-{high}" for low, high in ranges)


def normalize_iteration(iteration: Union[str, int, Iterable[int]]) -> str:
    """Turn ``"all"``, ``"0|5-8"``, ``7`` or ``[0, 5, 6, 7, 8]`` into MindSpore's iteration string.

    Iterations are 0-based dump iteration ids, at most ``2**32 - 1``; ranges ``a-b`` are inclusive. A
    string is read as MindSpore reads it (:func:`parse_iteration_ranges`) and returned normalised: sorted,
    merged, no leading zeros or empty parts (``"|3-3||01"`` -> ``"1|3"``), so the result selects exactly
    the iterations MindSpore would dump. Raises :class:`DumpConfigError`.
    """
    fix = _ITERATION_FIX
    if isinstance(iteration, bool):
        raise DumpConfigError("iteration", iteration, "must be 'all', an int, a list of ints or a range string", fix)
    if isinstance(iteration, int):
        if iteration < 0:
            raise DumpConfigError("iteration", iteration, "dump iterations are 0-based and cannot be negative", fix)
        if iteration > ITERATION_MAX:
            raise DumpConfigError("iteration", iteration, f"is above {ITERATION_MAX} (2**32 - 1): MindSpore counts "
                                  "dump iterations in 32 bits, so it never reaches it", fix)
        return str(iteration)
    if isinstance(iteration, str):
        if iteration == "all":
            return iteration
        if iteration.strip().lower() == "all":
            raise DumpConfigError("iteration", iteration, 'MindSpore recognizes only the exact lowercase "all"',
                                  'iteration="all"')
        return format_iteration_ranges(parse_iteration_ranges(iteration))
    try:
        values = list(iteration)
    except TypeError:
        raise DumpConfigError("iteration", iteration, "must be 'all', an int, a list of ints or a range string",
                              fix) from None
    if not values or not all(_is_uint(v) for v in values):
        raise DumpConfigError("iteration", iteration, "a list must hold at least one non-negative int", fix)
    too_big = [v for v in values if v > ITERATION_MAX]
    if too_big:
        raise DumpConfigError("iteration", iteration, f"{too_big[0]} is above {ITERATION_MAX} (2**32 - 1): MindSpore "
                              "counts dump iterations in 32 bits, so it never reaches it", fix)
    return format_ranges(values)   # sorted, distinct, runs as "low-high": "0|5-8"


def _check_kernel(entry: Any) -> str:
    fix = ("use an op type ('Sqrt'), a full scope name ('Default/.../Sqrt-op0') or "
           "'name-regex(<regex>)' without spaces, quotes or backslashes (write [0-9] for \\d, [.] for \\.)")
    if not isinstance(entry, str) or not entry:
        raise DumpConfigError("kernels", entry, "each entry must be a non-empty string", fix)
    bad = sorted({c for c in entry if c in ' "\\' or c.isspace()})
    if bad:
        raise DumpConfigError(
            "kernels", entry,
            f"contains {''.join(bad)!r}: MindSpore strips spaces and quotes from kernel entries and reads a "
            "backslash doubled (a regex \\d never matches), so the entry would not mean what it says", fix)
    if entry.startswith(_REGEX_PREFIX) or entry.startswith("name-regex"):
        if not (entry.startswith(_REGEX_PREFIX) and entry.endswith(")")):
            raise DumpConfigError("kernels", entry, "a regex entry must be written name-regex(<regex>) "
                                  "(otherwise MindSpore treats it as an op type and matches nothing)", fix)
        pattern = entry[len(_REGEX_PREFIX):-1]
        if not pattern:
            raise DumpConfigError("kernels", entry, "the regex is empty", fix)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise DumpConfigError("kernels", entry, f"the regex does not compile ({exc})", fix) from None
    return entry


def _suggest_path(path: str) -> str:
    return _PATH_CHARS.sub("_", path)


# Linux limits (bytes; the dump path is ASCII): a path component and a whole path. MindSpore writes
# <path>/rank_<r>/<net_name>/<graph>/<iteration>/<file of up to NAME_MAX> (longer op names become numbers
# with a mapping.csv): measured on 2.10 CPU, a 3784-character path dumps, 3950 fails ("Open file ... failed").
NAME_MAX = 255
PATH_MAX = 4096
LAYOUT_RESERVE = len("/4294967295/4294967295/") + NAME_MAX


def check_path_lengths(field: str, absolute: str, *, reserve: int, net_name: Optional[str] = None) -> None:
    """Refuse a dump path with a component longer than NAME_MAX, a parent that is not a directory, or no room
    under PATH_MAX for the ``reserve`` characters MindSpore appends (rank, net_name, graph, iteration, file)."""
    fix = "choose a shorter dump path, e.g. '/tmp/mindguard_dump'"
    for part in absolute.split("/"):
        if len(part) > NAME_MAX:
            raise DumpConfigError(field, absolute, f"has a component of {len(part)} characters ({part[:20]}...); "
                                  f"a file name can have at most {NAME_MAX} ('File name too long')", fix)
    if len(absolute) + reserve >= PATH_MAX:
        what = f" plus '/rank_N/{net_name}/<graph>/<iteration>/<file>'" if net_name else ""
        raise DumpConfigError(field, absolute, f"is {len(absolute)} characters{what}: MindSpore's files under it "
                              f"would exceed the {PATH_MAX - 1}-character path limit (nothing is dumped)", fix)
    parent = Path(absolute)
    for ancestor in (parent, *parent.parents):
        try:
            if ancestor.exists():
                if not ancestor.is_dir():
                    raise DumpConfigError(field, absolute, f"{str(ancestor)!r} is a file, not a directory: MindSpore "
                                          f"cannot create the dump under it", "choose a path under a directory")
                return
        except OSError as exc:
            raise DumpConfigError(field, absolute, f"cannot be inspected ({exc.strerror or exc})", fix) from None


# mindspore.nn cell classes whose name is also a primitive, but whose kernels on CPU have other types
# (measured on 2.10: nn.Dense and ops.dense run as MatMul + BiasAdd; kernels=["Dense"] dumps nothing and
# MindSpore logs "Unused Kernel in json: Dense").
_CELL_KERNELS_CPU = {"dense": "MatMul and BiasAdd"}
_CELL_NAMES: Optional[Dict[str, str]] = None
_PRIMITIVE_NAMES: Optional[set] = None


def _nn_names() -> Tuple[Dict[str, str], Set[str]]:
    """({lowercase cell class name: name} of mindspore.nn, {lowercase primitive name} of ops.operations), cached."""
    global _CELL_NAMES, _PRIMITIVE_NAMES
    if _CELL_NAMES is None or _PRIMITIVE_NAMES is None:
        import inspect

        from mindspore import nn
        from mindspore.ops import Primitive
        from mindspore.ops import operations as P

        _CELL_NAMES = {n.lower(): n for n, c in vars(nn).items() if inspect.isclass(c) and issubclass(c, nn.Cell)}
        _PRIMITIVE_NAMES = {n.lower() for n in dir(P)
                            if inspect.isclass(getattr(P, n, None)) and issubclass(getattr(P, n), Primitive)}
    return _CELL_NAMES, _PRIMITIVE_NAMES


def _check_not_a_cell(entry: str, device_target: str = "CPU") -> None:
    """Refuse a kernel entry that names a ``mindspore.nn`` cell rather than an operator type.

    MindSpore matches a plain entry against operator types (case-insensitively), never against cell names:
    ``kernels=["Norm"]`` dumps nothing in a network of ``nn.Norm`` cells ("Unused Kernel in json: Norm").
    A name that is both a cell and a primitive (``LayerNorm``, ``Softmax``) is an operator type and is kept,
    except where the cell is measured to run as other kernels (``Dense`` on CPU).
    """
    if entry.startswith(_REGEX_PREFIX) or "/" in entry or "-op" in entry or not entry.isidentifier():
        return
    cells, primitives = _nn_names()
    name = cells.get(entry.lower())
    if name is None:
        return
    scope = f"name-regex(.*-{name}/.*)"
    if entry.lower() in primitives:
        kernels = _CELL_KERNELS_CPU.get(entry.lower())
        if kernels is None or device_target != "CPU":
            return
        raise DumpConfigError(
            "kernels", entry,
            f"names the cell mindspore.nn.{name}, which runs as {kernels} on CPU: no kernel has type {entry!r}, "
            f"so MindSpore dumps nothing ('Unused Kernel in json: {entry}')",
            f"kernels={kernels.split(' and ')!r} (operator types), or {scope!r} for every operator inside "
            f"{name} cells")
    raise DumpConfigError(
        "kernels", entry,
        f"names the cell mindspore.nn.{name}, not an operator type; MindSpore matches plain entries against "
        f"operator types only and dumps nothing for it ('Unused Kernel in json: {entry}')",
        f"{scope!r} for every operator inside {name} cells, or the operator types it runs "
        f"(the first field of a dump file name, e.g. 'Sqrt')")


# --------------------------------------------------------------------------------------------- fields
# One check per DumpConfig field, given the fields it depends on (checked before it, in DumpConfig's order).
def check_device(device_target: Optional[str]) -> str:
    if device_target is None:
        import mindspore

        device_target = mindspore.get_context("device_target")
    if not isinstance(device_target, str) or device_target.lower() not in _DEVICES:
        raise DumpConfigError("device_target", device_target, "must be CPU, GPU or Ascend",
                              "device_target='CPU' (or leave it None to use mindspore.get_context)")
    return _DEVICES[device_target.lower()]


def check_jit_level(jit_level: Optional[str], device_target: str) -> Optional[str]:
    if jit_level is None:
        if device_target != "Ascend":
            return None
        try:
            import mindspore

            jit_level = (mindspore.get_context("jit_config") or {}).get("jit_level") or None
        except Exception:  # noqa: BLE001 - an older/newer context without jit_config: assume the default
            jit_level = None
        return jit_level
    if jit_level not in ("O0", "O1", "O2"):
        raise DumpConfigError("jit_level", jit_level, "must be 'O0', 'O1' or 'O2'", "jit_level='O0' (or None)")
    return jit_level


def check_path(path: Any) -> Path:
    if not isinstance(path, (str, os.PathLike)) or not str(path):
        raise DumpConfigError("path", path, "must be a non-empty directory path", "path='/abs/dir/mindguard_dump'")
    absolute = os.path.abspath(os.path.expanduser(os.fspath(path)))
    bad = sorted(set(_PATH_CHARS.findall(absolute)))
    if bad:
        raise DumpConfigError(
            "path", absolute,
            f"MindSpore accepts only letters, digits, '_', '-' and '/' in the dump path; found {''.join(bad)!r}",
            f"use e.g. {_suggest_path(absolute)!r}")
    return Path(absolute)


def check_net_name(net_name: Any) -> str:
    if not isinstance(net_name, str) or not net_name:
        raise DumpConfigError("net_name", net_name, "must be a non-empty string", "net_name='Net'")
    bad = sorted(set(_NAME_CHARS.findall(net_name)))
    if bad:
        raise DumpConfigError("net_name", net_name,
                              f"MindSpore accepts only letters, digits, '_' and '-'; found {''.join(bad)!r}",
                              f"use e.g. {_NAME_CHARS.sub('_', net_name)!r}")
    if len(net_name) > NAME_MAX:
        raise DumpConfigError("net_name", net_name,
                              f"is {len(net_name)} characters; MindSpore makes it a directory name, and a name "
                              f"of more than {NAME_MAX} fails with 'File name too long' (nothing is dumped)",
                              f"use e.g. {net_name[:32]!r}")
    return net_name


def check_input_output(input_output: Any) -> int:
    value = _require_uint("input_output", input_output, "input_output=0 (both), 1 (inputs) or 2 (outputs)")
    if value > 2:
        raise DumpConfigError("input_output", input_output, "must be 0 (inputs and outputs), 1 (inputs) or 2 (outputs)",
                              "input_output=0, 1 or 2")
    return value


def check_kernels(kernels: Any, device_target: str) -> List[str]:
    if isinstance(kernels, str):
        kernels = [kernels]
    try:
        entries = list(kernels)
    except TypeError:
        raise DumpConfigError("kernels", kernels, "must be a list of strings",
                              "kernels=['Sqrt', 'name-regex(.*Norm.*)']") from None
    seen = set()
    for entry in entries:
        _check_kernel(entry)
        _check_not_a_cell(entry, device_target)
        if entry in seen:
            raise DumpConfigError("kernels", entry, "is listed twice", "list each kernel once")
        seen.add(entry)
    return entries


def check_op_debug_mode(mode: Any, *, device_target: str, iteration: str, input_output: int,
                        kernels: List[str]) -> int:
    fix = "op_debug_mode=0 (normal dump), 3 (overflow only) or 4 (exception dump, Ascend)"
    if not _is_uint(mode) or mode > 4:
        raise DumpConfigError("op_debug_mode", mode, "must be 0, 3 or 4 (1 and 2 mean 3)", fix)
    mode = 3 if mode in (1, 2) else int(mode)
    if mode == 4 and device_target != "Ascend":
        raise DumpConfigError("op_debug_mode", mode,
                              f"exception dump is Ascend-only; on {device_target} MindSpore saves no operator data",
                              "op_debug_mode=0")
    if mode == 4 and iteration != "all":
        raise DumpConfigError("iteration", iteration,
                              "exception dump (op_debug_mode=4) cannot select iterations (MindSpore resets it to all)",
                              'iteration="all" or op_debug_mode=0')
    if mode == 3 and input_output != 0:
        raise DumpConfigError("input_output", input_output,
                              "with op_debug_mode=3 MindSpore forces input_output to 0", "input_output=0")
    if mode != 0 and kernels:
        raise DumpConfigError("kernels", kernels,
                              f"with op_debug_mode={mode} MindSpore ignores kernels and dumps every operator",
                              "kernels=() or op_debug_mode=0")
    return mode


def check_dump_mode(dump_mode: Any, *, device_target: str, kernels: List[str]) -> int:
    if dump_mode is None:
        return 1 if kernels else 0
    if not _is_uint(dump_mode) or dump_mode > 2:
        raise DumpConfigError("dump_mode", dump_mode, "must be 0 (all), 1 (kernels) or 2 (set_dump marks)",
                              "leave dump_mode=None (derived from kernels)")
    if dump_mode == 2 and device_target != "Ascend":
        raise DumpConfigError("dump_mode", dump_mode,
                              f"dump_mode 2 (mindspore.tools.set_dump) is Ascend-only; MindSpore rejects it on "
                              f"{device_target}",
                              "dump_mode=1 with kernels=[...] to select operators")
    if dump_mode == 0 and kernels:
        raise DumpConfigError("dump_mode", dump_mode, "MindSpore ignores kernels unless dump_mode is 1",
                              "dump_mode=None (derived: 1 when kernels are given)")
    if dump_mode == 1 and not kernels:
        raise DumpConfigError("dump_mode", dump_mode, "dump_mode 1 without kernels dumps every operator anyway",
                              "dump_mode=0, or give kernels=[...]")
    return int(dump_mode)


def check_support_device(devices: Any, device_target: str) -> List[int]:
    if devices is None:
        return list(DEFAULT_SUPPORT_DEVICE)
    fix = "support_device=[0, 1, 2, 3, 4, 5, 6, 7] (device ids whose dump is enabled)"
    try:
        values = list(devices)
    except TypeError:
        raise DumpConfigError("support_device", devices, "must be a list of device ids", fix) from None
    if not all(_is_uint(v) for v in values) or len(set(values)) != len(values):
        raise DumpConfigError("support_device", devices, "must be distinct non-negative ints", fix)
    if not values and device_target != "CPU":
        raise DumpConfigError("support_device", devices,
                              f"an empty list disables dump on every {device_target} device", fix)
    return [int(v) for v in values]


def check_overflow_number(number: Any, op_debug_mode: int) -> Optional[int]:
    if number is None:
        return None
    if op_debug_mode != 3:
        raise DumpConfigError("overflow_number", number, "MindSpore accepts it only with op_debug_mode=3",
                              "set op_debug_mode=3 or drop overflow_number")
    return _require_uint("overflow_number", number, "overflow_number=0 (all) or a positive count")


def check_saved_data(saved_data: Any, *, device_target: str, op_debug_mode: int) -> str:
    if saved_data not in ("tensor", "statistic", "full"):
        raise DumpConfigError("saved_data", saved_data, "must be 'tensor', 'statistic' or 'full'",
                              "saved_data='tensor'")
    if saved_data != "tensor" and device_target == "CPU":
        raise DumpConfigError(
            "saved_data", saved_data,
            "MindSpore computes dump statistics only on GPU and Ascend; on CPU it accepts only 'tensor' "
            "(it would fail at the first compile)",
            "saved_data='tensor' (mindguard.analyze_dump computes statistics from the tensors)")
    if saved_data != "tensor" and op_debug_mode == 4:
        raise DumpConfigError("saved_data", saved_data, "exception dump saves tensors only", "saved_data='tensor'")
    return saved_data


def check_file_format(file_format: Any, *, async_path: bool, saved_data: str, device_target: str) -> Optional[str]:
    if file_format is None:
        if async_path and saved_data != "tensor":
            raise DumpConfigError("file_format", None, "statistic dump on Ascend O2 needs file_format 'npy'",
                                  "file_format='npy'")
        return None
    if file_format not in ("npy", "bin"):
        raise DumpConfigError("file_format", file_format, "must be 'npy' or 'bin'", "file_format='npy'")
    if not async_path:
        raise DumpConfigError(
            "file_format", file_format,
            f"MindSpore reads file_format only on Ascend with jit_level O2; on {device_target}"
            f"{'' if device_target != 'Ascend' else ' O0/O1'} dumps are always .npy", "drop file_format")
    if saved_data != "tensor" and file_format != "npy":
        raise DumpConfigError("file_format", file_format, "statistic dump on Ascend O2 needs 'npy'",
                              "file_format='npy'")
    return file_format


def check_initial_iteration(initial_iteration: Any) -> Optional[int]:
    if initial_iteration is None:
        return None
    value = _require_uint("initial_iteration", initial_iteration, "initial_iteration=0 or another non-negative int")
    if value > ITERATION_MAX:
        raise DumpConfigError("initial_iteration", initial_iteration,
                              f"is above {ITERATION_MAX} (2**32 - 1): MindSpore stores it in 32 bits and "
                              f"silently drops the higher bits (4294967296 acts as 0)",
                              f"initial_iteration between 0 and {ITERATION_MAX}")
    return value


def check_stat_calc_mode(mode: Any, *, device_target: str, saved_data: str) -> Optional[str]:
    if mode is None:
        return None
    if mode not in ("host", "device"):
        raise DumpConfigError("stat_calc_mode", mode, "must be 'host' or 'device'", "stat_calc_mode='host'")
    if mode == "device" and device_target != "Ascend":
        raise DumpConfigError("stat_calc_mode", mode,
                              f"'device' works only on Ascend; MindSpore forces 'host' on {device_target}",
                              "stat_calc_mode='host' or None")
    if mode == "device" and saved_data != "statistic":
        raise DumpConfigError("stat_calc_mode", mode,
                              f"with saved_data={saved_data!r} MindSpore forces 'host'",
                              "saved_data='statistic', or stat_calc_mode='host'")
    return mode


def check_statistic_category(categories: Any, *, saved_data: str, stat_calc_mode: Optional[str]
                             ) -> Optional[List[str]]:
    if categories is None:
        return None
    if saved_data == "tensor":
        raise DumpConfigError("statistic_category", categories,
                              "MindSpore uses it only with saved_data 'statistic' or 'full'",
                              "saved_data='statistic' (GPU/Ascend), or drop statistic_category")
    if isinstance(categories, str):
        categories = [categories]
    values = list(categories)
    allowed = DEVICE_STATISTICS if stat_calc_mode == "device" else HOST_STATISTICS
    bad = [c for c in values if c not in allowed]
    if bad or not values:
        raise DumpConfigError("statistic_category", categories,
                              f"unknown or unsupported here: {bad}; allowed: {list(allowed)}",
                              "e.g. statistic_category=['max', 'min', 'nan count', 'positive inf count', "
                              "'negative inf count']")
    return values


def check_sampling(sample_mode: Any, sample_num: Any) -> Tuple[Optional[int], Optional[int]]:
    if sample_mode is not None and (not _is_uint(sample_mode) or sample_mode > 1):
        raise DumpConfigError("sample_mode", sample_mode, "must be 0 (whole tensor) or 1 (head and tail samples)",
                              "sample_mode=0 or 1")
    if sample_num is not None:
        if sample_mode != 1:
            raise DumpConfigError("sample_num", sample_num, "MindSpore reads it only with sample_mode=1",
                                  "set sample_mode=1 or drop sample_num")
        if not _is_uint(sample_num) or sample_num < 1:
            raise DumpConfigError("sample_num", sample_num, "must be a positive int", "sample_num=100")
    return sample_mode, sample_num
