"""``DumpConfig``: a MindSpore 2.x dump configuration, validated on construction with MindSpore's own rules.

MindSpore reports a bad dump config only at the first graph compile, as a ``RuntimeError`` from inside
``model.train`` -- or silently ignores or rewrites it. Every field is checked here, before training, with the
rules of MindSpore's parser (``dump_json_parser.cc``) plus the cases MindSpore ignores or rewrites
(:mod:`mindguard.dump.config_rules`, one check per field).
:func:`observing_config` is the config ``mindguard hunt`` arms in its record pass: no tensors, only the
iteration id of every step (:mod:`mindguard.training.run`).

Index bases: a *dump iteration* is 0-based; steps are 1-based.
"""
from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from typing import Any, Dict, Optional, Sequence, Union

from .._util.dist import rank_info
from ..errors import DumpConfigError, MindguardWarning
from . import config_rules as _rules
from .config_rules import (DEFAULT_SUPPORT_DEVICE, DEVICE_STATISTICS, HOST_STATISTICS, ITERATION_MAX, NAME_MAX,
                           PATH_MAX, STOUL_MAX, format_iteration_ranges, normalize_iteration, parse_iteration_ranges)

__all__ = ["DEFAULT_SUPPORT_DEVICE", "DEVICE_STATISTICS", "ENV_VAR", "HOST_STATISTICS", "ITERATION_MAX", "NAME_MAX",
           "OBSERVE_KERNEL", "OBSERVE_KERNEL_NAME", "PATH_MAX", "STOUL_MAX", "DumpConfig", "check_dump_dir",
           "format_iteration_ranges", "normalize_iteration", "observing_config", "parse_iteration_ranges"]

ENV_VAR = "MINDSPORE_DUMP_CONFIG"


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
                 jit_level: Optional[str] = None, overwrite: bool = False) -> None:
        # each field is checked once the fields its rule depends on are (:mod:`mindguard.dump.config_rules`)
        self.device_target = _rules.check_device(device_target)
        self.jit_level = _rules.check_jit_level(jit_level, self.device_target)
        self.path = _rules.check_path(path)
        self.net_name = _rules.check_net_name(net_name)
        _rules.check_path_lengths("path", str(self.path), reserve=len(f"/rank_{rank_info()[0]}/{self.net_name}")
                                   + _rules.LAYOUT_RESERVE, net_name=self.net_name)
        self.iteration = normalize_iteration(iteration)
        self.input_output = _rules.check_input_output(input_output)
        self.kernels = _rules.check_kernels(kernels, self.device_target)
        self.op_debug_mode = _rules.check_op_debug_mode(op_debug_mode, device_target=self.device_target,
                                                        iteration=self.iteration, input_output=self.input_output,
                                                        kernels=self.kernels)
        self.dump_mode = _rules.check_dump_mode(dump_mode, device_target=self.device_target, kernels=self.kernels)
        self.support_device = _rules.check_support_device(support_device, self.device_target)
        self.overflow_number = _rules.check_overflow_number(overflow_number, self.op_debug_mode)
        self.saved_data = _rules.check_saved_data(saved_data, device_target=self.device_target,
                                                  op_debug_mode=self.op_debug_mode)
        self.file_format = _rules.check_file_format(file_format, async_path=self.async_path,
                                                    saved_data=self.saved_data, device_target=self.device_target)
        self.initial_iteration = _rules.check_initial_iteration(initial_iteration)
        self.trans_flag = _rules.require_bool("trans_flag", trans_flag)
        self.save_kernel_args = (None if save_kernel_args is None
                                 else _rules.require_bool("save_kernel_args", save_kernel_args))
        self.stat_calc_mode = _rules.check_stat_calc_mode(stat_calc_mode, device_target=self.device_target,
                                                          saved_data=self.saved_data)
        self.statistic_category = _rules.check_statistic_category(statistic_category, saved_data=self.saved_data,
                                                                  stat_calc_mode=self.stat_calc_mode)
        self.sample_mode, self.sample_num = _rules.check_sampling(sample_mode, sample_num)
        self.overwrite = _rules.require_bool("overwrite", overwrite)
        rank, group_size = rank_info()
        try:
            check_dump_dir(self.path, overwrite=self.overwrite, rank=rank, group_size=group_size)
        except OSError as exc:   # unreadable directory, I/O error: say which, never a traceback
            raise DumpConfigError("path", str(self.path), f"cannot be inspected ({exc.strerror or exc})",
                                  "choose a directory you can read and write") from None
        if self.async_path:
            warnings.warn(
                "Ascend with jit_level O2 (GE): MindSpore deprecated data dump through MINDSPORE_DUMP_CONFIG "
                "there (since 2.6); use msprobe (pip install mindstudio-probe) for O2, or train with "
                "jit_level O0/O1 to use this dump.", MindguardWarning, stacklevel=2)

    @property
    def async_path(self) -> bool:
        """True on Ascend with jit_level O2 (GE): MindSpore's deprecated asynchronous dump path."""
        return self.device_target == "Ascend" and self.jit_level == "O2"

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




OBSERVE_KERNEL_NAME = "mindguard_observes_iterations_only"
#: Matches no kernel, so the observing dump writes no tensor. MindSpore warns about such an entry ("Unused Kernel in
#: json: ...") at the first compile; ``mindguard hunt`` leaves that line out of the output it passes through.
OBSERVE_KERNEL = f"name-regex({OBSERVE_KERNEL_NAME})"


def observing_config(path: Union[str, "os.PathLike[str]"], *, net_name: str = "Net",
                     device_target: Optional[str] = None) -> DumpConfig:
    """A dump that writes no tensor files (``dump_mode`` 1, one kernel regex that matches no kernel), only
    MindSpore's execution-order records: per kernel graph, the iteration id of every run of it, appended by
    the end of each step (measured on 2.10 CPU; per-step cost within noise). ``mindguard hunt`` arms it in
    its record pass to *observe* which graph and dump iteration each step ran as."""
    return DumpConfig(path, net_name, "all", dump_mode=1, kernels=[OBSERVE_KERNEL], device_target=device_target)
