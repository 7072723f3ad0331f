"""Arming MindSpore's dump: write a :class:`~mindguard.dump.config.DumpConfig` and point ``MINDSPORE_DUMP_CONFIG``
at it, before the first graph compile of the process (MindSpore reads it then, once).

:func:`enable_dump` warns (:class:`~mindguard.errors.DumpArmedTooLate`) or refuses when a graph already
compiled in this process (:func:`compiled_graphs`): MindSpore would then write nothing and say nothing.
"""
from __future__ import annotations

import os
import shutil
import sys
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import List, Optional, Union

from .._util.dist import per_rank_path, rank_info
from .._util.io import atomic_write_json, read_json
from ..errors import ArgumentError, ArgumentTypeError, DumpArmedTooLate, DumpConfigError, DumpNotWrittenError
from .config import ENV_VAR, DumpConfig, check_dump_dir


def compiled_graphs() -> List[str]:
    """Names of graphs (cells, ``@jit`` functions) compiled so far in this process; empty if none.

    MindSpore reads the dump config at the first graph compile, so a non-empty answer means a dump
    armed now writes nothing. Measured on 2.10 (CPU): a GRAPH-mode ``net(x)``, ``model.eval``,
    ``model.train`` or ``@jit`` call fills ``mindspore.graph.api.function_phases``; in PyNative a
    ``model.train`` compiles the optimizer through ``@jit`` into ``ms_compile_cache``; eager PyNative
    calls fill neither (and do not disarm the dump).
    """
    if "mindspore" not in sys.modules:
        return []
    try:
        from mindspore.graph import api
    except ImportError:  # older MindSpore layout
        from mindspore.common import api
    names = [str(name) for name in getattr(api, "function_phases", {})]
    names += [str(phase) for phase in getattr(api, "ms_compile_cache", ())]
    return names


@dataclass
class ArmedDump:
    """A dump armed by :func:`enable_dump`: ``json_path`` (the written config), ``config``, ``previous`` (the former
    ``MINDSPORE_DUMP_CONFIG``; ``None`` = unset), ``too_late`` (graphs found compiled when arming; empty = in time).

    A context manager: ``with enable_dump(cfg) as json_path:`` restores ``MINDSPORE_DUMP_CONFIG`` on exit.
    """

    json_path: Path
    config: DumpConfig
    previous: Optional[str]
    too_late: List[str] = field(default_factory=list)
    restored: bool = False

    def restore(self) -> None:
        """Put ``MINDSPORE_DUMP_CONFIG`` back as it was before :func:`enable_dump` (idempotent)."""
        if self.restored:
            return
        self.restored = True
        if self.previous is None:
            os.environ.pop(ENV_VAR, None)
        else:
            os.environ[ENV_VAR] = self.previous

    def __fspath__(self) -> str:
        return str(self.json_path)

    def __enter__(self) -> Path:
        return self.json_path

    def __exit__(self, *exc_info) -> None:
        self.restore()


def _default_json_path(config: DumpConfig) -> Path:
    rank, group_size = rank_info()
    return per_rank_path(config.path.with_name(config.path.name + ".json"), rank, group_size)


def enable_dump(config: DumpConfig, json_path: Union[str, "os.PathLike[str]", None] = None, *,
                too_late: str = "warn") -> ArmedDump:
    """Write ``config`` as JSON (atomically) and point ``MINDSPORE_DUMP_CONFIG`` at it.

    ``json_path``: default ``<dump path>.json`` next to the dump directory (``.rank<r>.json`` per rank when
    distributed); it may not lie inside the dump directory. An existing different file there is refused
    unless ``config.overwrite``. With ``config.overwrite`` this rank's old ``rank_<r>`` folder is removed.

    Returns an :class:`ArmedDump` (a ``pathlib.Path`` of the JSON file). Use it as a context manager
    to restore the previous ``MINDSPORE_DUMP_CONFIG`` on exit, or call ``.restore()``.

    ``too_late``: what to do when a graph already compiled in this process (MindSpore then ignores the
    config and writes nothing): ``"warn"`` (a :class:`DumpArmedTooLate` warning), ``"raise"`` (a
    :class:`DumpNotWrittenError`) or ``"ignore"``.
    """
    if not isinstance(config, DumpConfig):
        raise ArgumentTypeError(f"enable_dump(config=...) expects a mindguard.DumpConfig, got {type(config).__name__}; "
                        f"build one first, e.g. enable_dump(mindguard.DumpConfig('/abs/dump_dir', iteration='10'))")
    if too_late not in ("warn", "raise", "ignore"):
        raise ArgumentError(f"enable_dump(too_late={too_late!r}): expected 'warn', 'raise' or 'ignore'")
    target = _default_json_path(config) if json_path is None else Path(os.path.abspath(os.fspath(json_path)))
    if target == config.path or config.path in target.parents:
        raise DumpConfigError("json_path", str(target), "lies inside the dump directory, which must hold only "
                                                        "MindSpore's dump",
                              f"write it next to the dump, e.g. {_default_json_path(config)}")
    rank, group_size = rank_info()
    check_dump_dir(config.path, overwrite=config.overwrite, rank=rank, group_size=group_size)
    content = config.to_dict()
    if target.exists() and not config.overwrite:
        if not _holds_json(target, content):
            raise DumpConfigError("json_path", str(target), "already exists with other content",
                                  "choose another json_path, delete the file, or pass overwrite=True")
    compiled = compiled_graphs()
    if compiled:
        message = (f"MINDSPORE_DUMP_CONFIG armed after {len(compiled)} graph(s) already compiled in this process "
                   f"(e.g. {compiled[0]}): MindSpore reads the dump config once, at the first graph compile, "
                   "and will write nothing. Arm the dump before any GRAPH-mode call, model.eval/train or @jit "
                   "function -- e.g. in a fresh process, or via DumpOnDemand in the first model.train.")
        if too_late == "raise":
            raise DumpNotWrittenError(message)
        if too_late == "warn":
            warnings.warn(message, DumpArmedTooLate, stacklevel=2)
    if config.overwrite:
        own = config.path / f"rank_{rank}"
        if own.is_dir():
            shutil.rmtree(own)
    atomic_write_json(target, content)
    armed = ArmedDump(target, config, os.environ.get(ENV_VAR), compiled)
    os.environ[ENV_VAR] = str(target)
    return armed




def _holds_json(path: Path, content) -> bool:
    """True when ``path`` already holds exactly ``content`` as JSON (rewriting it would change nothing)."""
    try:
        return read_json(path) == content
    except (OSError, ValueError):
        return False
