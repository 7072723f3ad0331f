"""``DumpConfig``: a MindSpore 2.x dump configuration, validated on construction with MindSpore's own rules.

MindSpore reports a bad dump config only at the first graph compile, as a ``RuntimeError`` from inside
``model.train`` -- or silently ignores or rewrites it. Every field is checked here, before training, with the
rules of MindSpore's parser (``dump_json_parser.cc``) plus the cases MindSpore ignores or rewrites.
:func:`observing_config` is the config ``mindguard hunt`` arms in its record pass: no tensors, only the
iteration id of every step (:mod:`mindguard.run`).

Index bases: a *dump iteration* is 0-based; steps are 1-based.
"""
from __future__ import annotations

import json
import os
import re
import warnings
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Union

from .._dist import rank_info
from .._ranges import format_ranges
from ..errors import DumpConfigError, MindguardWarning

ENV_VAR = "MINDSPORE_DUMP_CONFIG"

_DEVICES = {"cpu": "CPU", "gpu": "GPU", "ascend": "Ascend"}
_PATH_CHARS = re.compile(r"[^A-Za-z0-9_/-]")
_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_ITER_SEGMENT = re.compile(r"^(\d+)(?:-(\d+))?$")
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
        raise DumpConfigError(field, value, "must be a non-negative int (MindSpore reads it as a JSON unsigned int)", fix)
    return int(value)


def _require_bool(field: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise DumpConfigError(field, value, "must be a bool (MindSpore reads a JSON true/false)", f"{field}=True or False")
    return value


def normalize_iteration(iteration: Union[str, int, Iterable[int]]) -> str:
    """Turn ``"all"``, ``"0|5-8"``, ``7`` or ``[0, 5, 6, 7, 8]`` into MindSpore's iteration string.

    Iterations are 0-based dump iteration ids; ranges ``a-b`` are inclusive. Raises :class:`DumpConfigError`.
    """
    fix = 'iteration="all", an int like 5, a list of ints, or a string like "0|5-8" (no spaces)'
    if isinstance(iteration, bool):
        raise DumpConfigError("iteration", iteration, "must be 'all', an int, a list of ints or a range string", fix)
    if isinstance(iteration, int):
        if iteration < 0:
            raise DumpConfigError("iteration", iteration, "dump iterations are 0-based and cannot be negative", fix)
        return str(iteration)
    if isinstance(iteration, str):
        if iteration == "all":
            return iteration
        if not iteration:
            raise DumpConfigError("iteration", iteration, "must not be empty", fix)
        if iteration.strip().lower() == "all":
            raise DumpConfigError("iteration", iteration, 'MindSpore recognizes only the exact lowercase "all"', 'iteration="all"')
        bad = sorted(set(re.sub(r"[0-9|-]", "", iteration)))
        if bad:
            raise DumpConfigError("iteration", iteration,
                                  f"MindSpore accepts only digits, '-', '|' or exactly \"all\"; found {''.join(bad)!r}", fix)
        for segment in iteration.split("|"):
            match = _ITER_SEGMENT.match(segment)
            if not match:
                raise DumpConfigError("iteration", iteration,
                                      f"segment {segment!r} is neither N nor N-M (MindSpore would silently never match it)", fix)
            if match.group(2) is not None and int(match.group(2)) < int(match.group(1)):
                raise DumpConfigError("iteration", iteration,
                                      f"range {segment!r} is empty (ranges are low-high, inclusive)", fix)
        return iteration
    try:
        values = list(iteration)
    except TypeError:
        raise DumpConfigError("iteration", iteration, "must be 'all', an int, a list of ints or a range string", fix) from None
    if not values or not all(_is_uint(v) for v in values):
        raise DumpConfigError("iteration", iteration, "a list must hold at least one non-negative int", fix)
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


def check_dump_dir(path: Path, *, overwrite: bool, rank: int, group_size: int) -> None:
    """Refuse a dump directory that already holds data, unless ``overwrite``.

    Other ranks' ``rank_<k>`` folders of the same distributed run are tolerated when ``group_size > 1``.
    """
    if overwrite or not path.exists():
        return
    if not path.is_dir():
        raise DumpConfigError("path", str(path), "exists and is not a directory", "choose a new directory name")
    foreign = []
    for entry in path.iterdir():
        if group_size > 1 and entry.name.startswith("rank_") and entry.name != f"rank_{rank}":
            continue
        foreign.append(entry.name)
    if foreign:
        shown = ", ".join(sorted(foreign)[:5]) + (", ..." if len(foreign) > 5 else "")
        raise DumpConfigError(
            "path", str(path),
            f"the directory is not empty (holds {shown}); MindSpore would mix a new dump with old files",
            "choose a new directory, delete the old dump, or pass overwrite=True (mindguard then removes "
            f"only this process's rank_{rank} folder before arming)")


# --------------------------------------------------------------------------------------------- config
class DumpConfig:
    """A MindSpore 2.x dump configuration, validated on construction (raises :class:`DumpConfigError`).

    ``path``: dump root; a relative path is resolved against the current directory. Only
    ``[A-Za-z0-9_/-]`` are allowed (no ``.`` anywhere). MindSpore writes
    ``<path>/rank_<r>/<net_name>/<graph_id>/<iteration>/*.npy``.
    ``iteration``: 0-based dump iteration(s): ``"all"``, ``5``, ``[5, 6]`` or ``"0|5-8"`` (inclusive ranges).
    ``kernels``: op types (case-insensitive substring of the op name, e.g. ``"Sqrt"``), full scope
    names, or ``"name-regex(<regex>)"`` (full match); non-empty implies ``dump_mode=1``.
    ``input_output``: 0 inputs and outputs, 1 inputs only, 2 outputs only.
    ``op_debug_mode``: 0 normal; 3 overflow-only dump -- on Ascend the natural choice for hunting
    Inf/NaN (only operators that overflowed are saved); on CPU MindSpore then dumps everything; 1 and 2
    are MindSpore's legacy spellings of 3 and are normalized to 3; 4 exception dump (Ascend only).
    ``saved_data``: ``"tensor"``; ``"statistic"``/``"full"`` only on GPU/Ascend (CPU refuses them).
    ``device_target``: ``"CPU"``/``"GPU"``/``"Ascend"``, default: ``mindspore.get_context("device_target")``.
    ``jit_level``: ``"O0"``/``"O1"``/``"O2"``, default: the context's ``jit_config``; on Ascend, O2 (GE)
    uses the deprecated asynchronous dump path (``file_format`` only applies there).
    ``overwrite``: accept a non-empty dump directory (``enable_dump`` then removes this rank's old folder).
    The remaining fields are passed through after MindSpore's checks; ``None`` = not written (MindSpore's default).
    """

    def __init__(self, path: Union[str, "os.PathLike[str]"], net_name: str = "Net",
                 iteration: Union[str, int, Sequence[int]] = "all", *, saved_data: str = "tensor",
                 input_output: int = 0, kernels: Union[str, Sequence[str]] = (), op_debug_mode: int = 0,
                 dump_mode: Optional[int] = None, support_device: Optional[Sequence[int]] = None,
                 statistic_category: Optional[Sequence[str]] = None, overflow_number: Optional[int] = None,
                 file_format: Optional[str] = None, initial_iteration: Optional[int] = None,
                 trans_flag: bool = True, save_kernel_args: Optional[bool] = None,
                 stat_calc_mode: Optional[str] = None, sample_mode: Optional[int] = None,
                 sample_num: Optional[int] = None, device_target: Optional[str] = None,
                 jit_level: Optional[str] = None, overwrite: bool = False):
        self.device_target = self._check_device(device_target)
        self.jit_level = self._check_jit_level(jit_level)
        self.path = self._check_path(path)
        self.net_name = self._check_net_name(net_name)
        self.iteration = normalize_iteration(iteration)
        self.input_output = _require_uint("input_output", input_output, "input_output=0 (both), 1 (inputs) or 2 (outputs)")
        if self.input_output > 2:
            raise DumpConfigError("input_output", input_output, "must be 0 (inputs and outputs), 1 (inputs) or 2 (outputs)",
                                  "input_output=0, 1 or 2")
        self.kernels = self._check_kernels(kernels)
        self.op_debug_mode = self._check_op_debug_mode(op_debug_mode)
        self.dump_mode = self._check_dump_mode(dump_mode)
        self.support_device = self._check_support_device(support_device)
        self.overflow_number = self._check_overflow_number(overflow_number)
        self.saved_data = self._check_saved_data(saved_data)
        self.file_format = self._check_file_format(file_format)
        self.initial_iteration = None if initial_iteration is None else _require_uint(
            "initial_iteration", initial_iteration, "initial_iteration=0 or another non-negative int")
        self.trans_flag = _require_bool("trans_flag", trans_flag)
        self.save_kernel_args = None if save_kernel_args is None else _require_bool("save_kernel_args", save_kernel_args)
        self.stat_calc_mode = self._check_stat_calc_mode(stat_calc_mode)
        self.statistic_category = self._check_statistic_category(statistic_category)
        self.sample_mode, self.sample_num = self._check_sampling(sample_mode, sample_num)
        self.overwrite = _require_bool("overwrite", overwrite)
        rank, group_size = rank_info()
        check_dump_dir(self.path, overwrite=self.overwrite, rank=rank, group_size=group_size)
        if self.async_path:
            warnings.warn(
                "Ascend with jit_level O2 (GE): MindSpore deprecated data dump through MINDSPORE_DUMP_CONFIG "
                "there (since 2.6); use msprobe (pip install mindstudio-probe) for O2, or train with "
                "jit_level O0/O1 to use this dump.", MindguardWarning, stacklevel=2)

    # -- field checks ------------------------------------------------------------------------------
    @staticmethod
    def _check_device(device_target: Optional[str]) -> str:
        if device_target is None:
            import mindspore

            device_target = mindspore.get_context("device_target")
        if not isinstance(device_target, str) or device_target.lower() not in _DEVICES:
            raise DumpConfigError("device_target", device_target, "must be CPU, GPU or Ascend",
                                  "device_target='CPU' (or leave it None to use mindspore.get_context)")
        return _DEVICES[device_target.lower()]

    def _check_jit_level(self, jit_level: Optional[str]) -> Optional[str]:
        if jit_level is None:
            if self.device_target != "Ascend":
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

    @property
    def async_path(self) -> bool:
        """True on Ascend with jit_level O2 (GE): MindSpore's deprecated asynchronous dump path."""
        return self.device_target == "Ascend" and self.jit_level == "O2"

    @staticmethod
    def _check_path(path: Any) -> Path:
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

    @staticmethod
    def _check_net_name(net_name: Any) -> str:
        if not isinstance(net_name, str) or not net_name:
            raise DumpConfigError("net_name", net_name, "must be a non-empty string", "net_name='Net'")
        bad = sorted(set(_NAME_CHARS.findall(net_name)))
        if bad:
            raise DumpConfigError("net_name", net_name,
                                  f"MindSpore accepts only letters, digits, '_' and '-'; found {''.join(bad)!r}",
                                  f"use e.g. {_NAME_CHARS.sub('_', net_name)!r}")
        return net_name

    @staticmethod
    def _check_kernels(kernels: Any) -> List[str]:
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
            if entry in seen:
                raise DumpConfigError("kernels", entry, "is listed twice", "list each kernel once")
            seen.add(entry)
        return entries

    def _check_op_debug_mode(self, mode: Any) -> int:
        fix = "op_debug_mode=0 (normal dump), 3 (overflow only) or 4 (exception dump, Ascend)"
        if not _is_uint(mode) or mode > 4:
            raise DumpConfigError("op_debug_mode", mode, "must be 0, 3 or 4 (1 and 2 mean 3)", fix)
        mode = 3 if mode in (1, 2) else int(mode)
        if mode == 4 and self.device_target != "Ascend":
            raise DumpConfigError("op_debug_mode", mode,
                                  f"exception dump is Ascend-only; on {self.device_target} MindSpore saves no operator data",
                                  "op_debug_mode=0")
        if mode == 4 and self.iteration != "all":
            raise DumpConfigError("iteration", self.iteration,
                                  "exception dump (op_debug_mode=4) cannot select iterations (MindSpore resets it to all)",
                                  'iteration="all" or op_debug_mode=0')
        if mode == 3 and self.input_output != 0:
            raise DumpConfigError("input_output", self.input_output,
                                  "with op_debug_mode=3 MindSpore forces input_output to 0", "input_output=0")
        if mode != 0 and self.kernels:
            raise DumpConfigError("kernels", self.kernels,
                                  f"with op_debug_mode={mode} MindSpore ignores kernels and dumps every operator",
                                  "kernels=() or op_debug_mode=0")
        return mode

    def _check_dump_mode(self, dump_mode: Any) -> int:
        if dump_mode is None:
            return 1 if self.kernels else 0
        if not _is_uint(dump_mode) or dump_mode > 2:
            raise DumpConfigError("dump_mode", dump_mode, "must be 0 (all), 1 (kernels) or 2 (set_dump marks)",
                                  "leave dump_mode=None (derived from kernels)")
        if dump_mode == 2 and self.device_target != "Ascend":
            raise DumpConfigError("dump_mode", dump_mode,
                                  f"dump_mode 2 (mindspore.tools.set_dump) is Ascend-only; MindSpore rejects it on {self.device_target}",
                                  "dump_mode=1 with kernels=[...] to select operators")
        if dump_mode == 0 and self.kernels:
            raise DumpConfigError("dump_mode", dump_mode, "MindSpore ignores kernels unless dump_mode is 1",
                                  "dump_mode=None (derived: 1 when kernels are given)")
        if dump_mode == 1 and not self.kernels:
            raise DumpConfigError("dump_mode", dump_mode, "dump_mode 1 without kernels dumps every operator anyway",
                                  "dump_mode=0, or give kernels=[...]")
        return int(dump_mode)

    def _check_support_device(self, devices: Any) -> List[int]:
        if devices is None:
            return list(DEFAULT_SUPPORT_DEVICE)
        fix = "support_device=[0, 1, 2, 3, 4, 5, 6, 7] (device ids whose dump is enabled)"
        try:
            values = list(devices)
        except TypeError:
            raise DumpConfigError("support_device", devices, "must be a list of device ids", fix) from None
        if not all(_is_uint(v) for v in values) or len(set(values)) != len(values):
            raise DumpConfigError("support_device", devices, "must be distinct non-negative ints", fix)
        if not values and self.device_target != "CPU":
            raise DumpConfigError("support_device", devices,
                                  f"an empty list disables dump on every {self.device_target} device", fix)
        return [int(v) for v in values]

    def _check_overflow_number(self, number: Any) -> Optional[int]:
        if number is None:
            return None
        if self.op_debug_mode != 3:
            raise DumpConfigError("overflow_number", number, "MindSpore accepts it only with op_debug_mode=3",
                                  "set op_debug_mode=3 or drop overflow_number")
        return _require_uint("overflow_number", number, "overflow_number=0 (all) or a positive count")

    def _check_saved_data(self, saved_data: Any) -> str:
        if saved_data not in ("tensor", "statistic", "full"):
            raise DumpConfigError("saved_data", saved_data, "must be 'tensor', 'statistic' or 'full'", "saved_data='tensor'")
        if saved_data != "tensor" and self.device_target == "CPU":
            raise DumpConfigError(
                "saved_data", saved_data,
                "MindSpore computes dump statistics only on GPU and Ascend; on CPU it accepts only 'tensor' "
                "(it would fail at the first compile)", "saved_data='tensor' (mindguard.analyze_dump computes statistics from the tensors)")
        if saved_data != "tensor" and self.op_debug_mode == 4:
            raise DumpConfigError("saved_data", saved_data, "exception dump saves tensors only", "saved_data='tensor'")
        return saved_data

    def _check_file_format(self, file_format: Any) -> Optional[str]:
        if file_format is None:
            if self.async_path and self.saved_data != "tensor":
                raise DumpConfigError("file_format", None, "statistic dump on Ascend O2 needs file_format 'npy'",
                                      "file_format='npy'")
            return None
        if file_format not in ("npy", "bin"):
            raise DumpConfigError("file_format", file_format, "must be 'npy' or 'bin'", "file_format='npy'")
        if not self.async_path:
            raise DumpConfigError(
                "file_format", file_format,
                f"MindSpore reads file_format only on Ascend with jit_level O2; on {self.device_target}"
                f"{'' if self.device_target != 'Ascend' else ' O0/O1'} dumps are always .npy", "drop file_format")
        if self.saved_data != "tensor" and file_format != "npy":
            raise DumpConfigError("file_format", file_format, "statistic dump on Ascend O2 needs 'npy'", "file_format='npy'")
        return file_format

    def _check_stat_calc_mode(self, mode: Any) -> Optional[str]:
        if mode is None:
            return None
        if mode not in ("host", "device"):
            raise DumpConfigError("stat_calc_mode", mode, "must be 'host' or 'device'", "stat_calc_mode='host'")
        if mode == "device" and self.device_target != "Ascend":
            raise DumpConfigError("stat_calc_mode", mode,
                                  f"'device' works only on Ascend; MindSpore forces 'host' on {self.device_target}",
                                  "stat_calc_mode='host' or None")
        if mode == "device" and self.saved_data != "statistic":
            raise DumpConfigError("stat_calc_mode", mode,
                                  f"with saved_data={self.saved_data!r} MindSpore forces 'host'",
                                  "saved_data='statistic', or stat_calc_mode='host'")
        return mode

    def _check_statistic_category(self, categories: Any) -> Optional[List[str]]:
        if categories is None:
            return None
        if self.saved_data == "tensor":
            raise DumpConfigError("statistic_category", categories,
                                  "MindSpore uses it only with saved_data 'statistic' or 'full'",
                                  "saved_data='statistic' (GPU/Ascend), or drop statistic_category")
        if isinstance(categories, str):
            categories = [categories]
        values = list(categories)
        allowed = DEVICE_STATISTICS if self.stat_calc_mode == "device" else HOST_STATISTICS
        bad = [c for c in values if c not in allowed]
        if bad or not values:
            raise DumpConfigError("statistic_category", categories,
                                  f"unknown or unsupported here: {bad}; allowed: {list(allowed)}",
                                  "e.g. statistic_category=['max', 'min', 'nan count', 'positive inf count', 'negative inf count']")
        return values

    @staticmethod
    def _check_sampling(sample_mode: Any, sample_num: Any):
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

    # -- output ------------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The JSON object MindSpore reads from ``MINDSPORE_DUMP_CONFIG`` (2.x schema)."""
        common: Dict[str, Any] = {
            "dump_mode": self.dump_mode,
            "path": str(self.path),
            "net_name": self.net_name,
            "iteration": self.iteration,
            "saved_data": self.saved_data,
            "input_output": self.input_output,
            "kernels": list(self.kernels),
            "support_device": list(self.support_device),
            "op_debug_mode": self.op_debug_mode,
        }
        optional = {"statistic_category": self.statistic_category, "overflow_number": self.overflow_number,
                    "file_format": self.file_format, "initial_iteration": self.initial_iteration}
        common.update({k: v for k, v in optional.items() if v is not None})
        result: Dict[str, Any] = {"common_dump_settings": common}
        if not self.async_path:
            e2e: Dict[str, Any] = {"enable": True, "trans_flag": self.trans_flag}
            extra = {"save_kernel_args": self.save_kernel_args, "stat_calc_mode": self.stat_calc_mode,
                     "sample_mode": self.sample_mode, "sample_num": self.sample_num}
            e2e.update({k: v for k, v in extra.items() if v is not None})
            result["e2e_dump_settings"] = e2e
        return result

    def iteration_dir(self, iteration: int, *, rank: int = 0, graph: Union[int, str] = "*") -> Path:
        """``<path>/rank_<rank>/<net_name>/<graph>/<iteration>`` (a glob pattern when ``graph="*"``)."""
        return self.path / f"rank_{rank}" / self.net_name / str(graph) / str(iteration)

    def __repr__(self) -> str:
        return f"DumpConfig({json.dumps(self.to_dict()['common_dump_settings'])})"




OBSERVE_KERNEL = "name-regex(mindguard_observes_iterations_only)"


def observing_config(path: Union[str, "os.PathLike[str]"], *, net_name: str = "Net",
                     device_target: Optional[str] = None) -> DumpConfig:
    """A dump that writes no tensor files (``dump_mode`` 1, one kernel regex that matches no kernel), only
    MindSpore's execution-order records: per kernel graph, the iteration id of every run of it, appended by
    the end of each step (measured on 2.10 CPU; per-step cost within noise). ``mindguard hunt`` arms it in
    its record pass to *observe* which graph and dump iteration each step ran as."""
    return DumpConfig(path, net_name, "all", dump_mode=1, kernels=[OBSERVE_KERNEL], device_target=device_target)
