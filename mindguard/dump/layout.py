"""Which files of a dump belong to one step: the step's time window against the timestamps in the file names.

Two steps can be dumped into one iteration directory (a graph's first run after another graph reuses that
graph's count: docs/mindspore-facts.md), so a directory is not a step; the files written during the step are.
No MindSpore import (``mindguard hunt`` uses it).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from .._io import load_npy


def check_step_dump(root: Path, rank: int, net_name: str, window: Sequence[int],
                    batch: Sequence[np.ndarray]) -> Tuple[List[Path], List[str]]:
    """The iteration directories under ``root`` holding files written during ``window`` (epoch µs, inclusive),
    and the problems that say the dump does not hold the step whose batch is ``batch``."""
    base = root / f"rank_{rank}" / net_name
    start, end = window
    dirs: List[Path] = []
    batch_files: Dict[int, Path] = {}
    for directory in sorted(base.glob("*/*")):
        if not directory.is_dir() or directory.is_symlink():
            continue
        inside = False
        for entry in os.scandir(directory):
            stamp = _timestamp_us(entry.name)
            if stamp is not None and start <= stamp <= end:
                inside = True
                if entry.name.startswith("Parameter.inputs"):
                    slot = _batch_slot(entry.name)
                    if slot is not None:
                        batch_files[slot] = Path(entry.path)
        if inside:
            dirs.append(directory)
    problems = []
    if not dirs:
        problems.append(f"no file under {base} was written during the step: MindSpore did not dump it (the dump "
                        f"was armed for other iterations, or after the first graph compile)")
    for slot, path in sorted(batch_files.items()):
        if slot < len(batch):
            try:
                dumped = load_npy(path)
            except (OSError, ValueError) as exc:
                problems.append(f"batch file {path.name} is unreadable ({exc})")
                continue
            if dumped.shape != batch[slot].shape or not np.array_equal(dumped, batch[slot], equal_nan=True):
                problems.append(f"batch file {path.name} does not hold input {slot} of the step: the dump is of "
                                f"another step")
    return dirs, problems


def _timestamp_us(file_name: str) -> Optional[int]:
    """The timestamp field of a dump tensor file name (``{op_type}.{op_name}.{task}.{stream}.{timestamp}.{io}...``)."""
    parts = file_name.split(".")
    for index in range(len(parts) - 2):
        if parts[index + 1] in ("input", "output") and parts[index].isdigit() and len(parts[index]) >= 13:
            return int(parts[index])
    return None


def _batch_slot(file_name: str) -> Optional[int]:
    """``Parameter.inputs0.<...>.output.0...`` -> 0 (the 0-based batch position), else ``None``."""
    head = file_name.split(".")[1] if file_name.count(".") >= 1 else ""
    digits = head[len("inputs"):] if head.startswith("inputs") else ""
    return int(digits) if digits.isdigit() else None
