"""Reading a dump's tensor files for the origin search: one file at a time (memory bounded by the largest tensor),
full statistics or only the NaN/Inf counts, a statistic dump's csv rows, and the files a rule distrusts."""
from __future__ import annotations

import math
import sys
import time
import zipfile
from pathlib import Path
from typing import List, Optional, Set, Tuple

import numpy as np

from .evidence import mislabelled_float16
from .files import TensorFile, is_regular_file, npy_dtype_problem
from .order import OpLaunch
from .stats import full_scan, is_nonfinite, light_scan
from .trace import NodeTrace


class TensorReader:
    """Reads dumped tensors one at a time (memory bounded by the largest tensor) and reports progress."""

    def __init__(self, total_files: int, *, progress: bool = True):
        self.total = total_files
        self.done = 0
        self.read = 0            # tensor files read and used
        self.skipped = 0         # tensor files that could not be used (unreadable, not regular, wrong dtype)
        self.warnings: List[str] = []
        self.unreliable: Set[Path] = set()   # files that are not the values of their kernel: not read
        self.half_float32: Set[Path] = set()  # of those, the files labelled float16 holding float32 bytes
        self.excluded: List[dict] = []        # {"rule", "what", "reason"} for each file a rule left out
        self._start = time.monotonic()
        self._last = self._start
        self._progress = progress

    def _load(self, tensor: TensorFile):
        self.done += 1
        if self._progress:
            now = time.monotonic()
            if now - self._start > 3.0 and now - self._last > 2.0:
                self._last = now
                print(f"mindguard analyze: read {self.done}/{self.total} tensor files "
                      f"({now - self._start:.0f} s)", file=sys.stderr, flush=True)
        path = tensor.path
        if path is None:   # statistics only (a statistic dump's csv row): no file to read
            return None
        if not is_regular_file(path):
            self.skipped += 1
            self.warnings.append(f"skipped {path.name}: not a regular file (FIFO, socket, device or broken link); "
                                 f"never opened")
            return None
        try:
            if tensor.member is not None:       # one array of a kept state's .npz (read whole: no memory map)
                with np.load(path, allow_pickle=False) as arrays:
                    array = arrays[tensor.member]
            else:
                array = np.load(path, allow_pickle=False, mmap_mode="r")   # chunked scans: never a whole copy
        except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as exc:   # truncated, empty, foreign,
            # pickled (ValueError with allow_pickle=False), a member missing from a kept state: warn and go on
            self.skipped += 1
            self.warnings.append(f"unreadable tensor file {path.name}: {type(exc).__name__}: {exc}")
            return None
        problem = npy_dtype_problem(array.dtype, tensor.dtype)
        if problem is not None:
            self.skipped += 1
            self.warnings.append(f"tensor file {path.name} not used: {problem}")
            return None
        self.read += 1
        return array

    def full(self, tensor: TensorFile) -> Tuple[Optional[dict], Optional[dict]]:
        """``(tensor_stats, fp16_risk_counts)`` or ``(None, None)`` when unreadable."""
        if tensor.path in self.unreliable:
            return self._float32_half(tensor, full_scan)
        return self._scan(tensor, full_scan)

    def _float32_half(self, tensor: TensorFile, scan) -> Tuple[Optional[dict], Optional[dict]]:
        """A mislabelled float16 file holds the first half of the float32 values its kernel wrote: read so, an
        Inf/NaN there is the kernel's (``partial`` says only half was seen); finite, it proves nothing (None)."""
        if tensor.path not in self.half_float32:
            return None, None
        array = self._load(tensor)
        if array is None or array.dtype != np.float16 or array.size % 2:
            return None, None
        stats, fp16 = scan(np.ascontiguousarray(array).reshape(-1).view(np.float32))
        if not is_nonfinite(stats):
            return None, None
        return dict(stats, partial="the first half of the float32 values, from a file labelled float16"), fp16

    def distrust_mislabelled(self, op: OpLaunch, node: Optional[NodeTrace]) -> None:
        """Mark ``op``'s output files whose dtype differs from the one its kernel computes (.ir kernel types).
        Measured on 2.10 CPU with AMP O2: a Conv2D/Pow the graph types as float16 runs in float32, and the dump
        writes a ``...Float16.npy`` holding the first half of the float32 buffer, read as float16 (NaN/Inf for
        ~1.6% of bit patterns, |x| up to 6e4): such a file says nothing about the values."""
        for slot, tensor, exclusion in mislabelled_float16(op, node):
            if tensor.path is None or tensor.path in self.unreliable:
                continue
            self.unreliable.add(tensor.path)
            self.half_float32.add(tensor.path)
            self.excluded.append(exclusion.as_dict())
            if len(self.half_float32) == 1:
                kernel = node.kernel_output_dtypes[slot] if node is not None else "float32"
                self.warnings.append(
                    f"{op.op_type} ({op.name}) output {slot} is dumped as {(tensor.dtype or '?').lower()} but its "
                    f"kernel "
                    f"computed {kernel} (MindSpore's CPU runs such ops in {kernel} and the dump keeps the graph's "
                    f"dtype): the bytes of such files are not the values, so they are not read (this and any later "
                    f"such file)")

    def counts(self, tensor: TensorFile) -> Tuple[Optional[dict], Optional[dict]]:
        """Only NaN/Inf counts, largest magnitude and fp16 risk (the cheap path, used after the origin)."""
        if tensor.path in self.unreliable:
            return self._float32_half(tensor, _light_pair)
        return self._scan(tensor, _light_pair)

    def _scan(self, tensor: TensorFile, scan) -> Tuple[Optional[dict], Optional[dict]]:
        """``scan(array)`` of the tensor's file, or its statistic.csv row; ``(None, None)`` when unreadable."""
        if tensor.stats is not None:
            self.read += 1
            return _stats_from_csv(tensor.stats), None
        array = self._load(tensor)
        if array is None:
            return None, None
        return scan(array)


def _light_pair(array) -> Tuple[dict, dict]:
    """``light_scan`` as ``(counts, fp16_risk_counts)``, the shape :meth:`TensorReader.full` returns."""
    scan = light_scan(array)
    return scan, {"underflow": scan["underflow"], "overflow": scan["overflow"]}


def _stats_from_csv(stats: dict) -> dict:
    """statistic.csv rows may lack count columns; infer NaN/Inf from non-finite min/max then."""
    out = dict(stats)
    for key in ("min", "max"):
        value = out.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            if math.isnan(value) and not out.get("nan"):
                out["nan"] = 1
            elif value > 0 and not out.get("pos_inf"):
                out["pos_inf"] = 1
            elif value < 0 and not out.get("neg_inf"):
                out["neg_inf"] = 1
            out[key] = None
    return out
