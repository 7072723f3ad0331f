"""What differs between what a failing run recorded of its project and data and what ``mindguard hunt --from`` would
run now: the comparisons both sides share (the training side records: :mod:`mindguard.training.record.provenance`; the
hunt compares: :mod:`mindguard.hunt.entry`).

Pure functions over paths and dicts; imports nothing of MindSpore. Sizes are bytes, times ``st_mtime_ns``
(nanoseconds since the epoch).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Dict, List, Optional

from .._util.io import file_sha256


def source_changes(recorded: Dict[str, str], recorded_cwd: Optional[str], cwd: str) -> List[str]:
    """What differs between the project files a run recorded (``recorded``:
    :func:`mindguard.training.record.provenance.source_hashes`, relative
    paths meant under ``recorded_cwd``) and those the hunt would run now from ``cwd``: one phrase per file,
    ``"train.py changed since the failure"``, ``"model/net.py is missing"``. Empty when all are the same."""
    changes = []
    for name, digest in recorded.items():
        path = Path(name) if os.path.isabs(name) else Path(cwd) / name
        try:
            now = file_sha256(path)
        except FileNotFoundError:
            changes.append(f"{name} is missing" + (f" here (the failing run had it in {recorded_cwd})"
                                                    if recorded_cwd and os.path.realpath(recorded_cwd) !=
                                                    os.path.realpath(cwd) else ""))
            continue
        except OSError as exc:
            changes.append(f"{name} cannot be read ({exc.strerror or exc})")
            continue
        if now != digest:
            changes.append(f"{name} changed since the failure")
    return changes


#: A folder's fingerprint reads at most this many entries (a 1.28M-image folder is summarised, not walked).
MAX_DIR_ENTRIES = 5000


def data_fingerprint(path: str, max_entries: Optional[int] = None) -> Dict[str, object]:
    """What a data file or folder looks like now, without reading its bytes: ``{"kind": "file", "bytes": size,
    "mtime_ns": ...}`` or ``{"kind": "dir", "files": n, "bytes": total, "mtime_ns": newest, "complete": bool}``
    (``complete`` False when the folder held more than ``max_entries`` (default :data:`MAX_DIR_ENTRIES`) entries:
    the first ones, in ``os.scandir`` order, were summarised); ``{"kind": "missing"}`` when it does not exist.
    Measured: ~5 ms for 5,000 files on local disk."""
    limit = MAX_DIR_ENTRIES if max_entries is None else max_entries
    try:
        info = os.stat(path)
    except OSError:
        return {"kind": "missing"}
    if not os.path.isdir(path):
        return {"kind": "file", "bytes": info.st_size, "mtime_ns": info.st_mtime_ns}
    files = total = 0
    newest = info.st_mtime_ns
    seen = 0
    stack = [path]
    while stack and seen < limit:
        try:
            entries = os.scandir(stack.pop())
        except OSError:
            continue
        with entries:
            for entry in entries:
                seen += 1
                if seen > limit:
                    break
                try:
                    stat = entry.stat(follow_symlinks=True)
                except OSError:
                    continue
                newest = max(newest, stat.st_mtime_ns)
                if entry.is_dir(follow_symlinks=True):
                    stack.append(entry.path)
                else:
                    files += 1
                    total += stat.st_size
    return {"kind": "dir", "files": files, "bytes": total, "mtime_ns": newest,
            "complete": seen <= limit and not stack}


def data_changes(recorded: Dict[str, Dict[str, object]], cwd: str) -> List[str]:
    """What differs between the data a run's pipeline read (``recorded``:
    :func:`mindguard.training.record.provenance.data_fingerprints`) and the same paths now, seen from ``cwd``: one
    phrase per file or folder, naming what changed -- ``"data/train.csv changed since the failure (1,024 -> 2,048
    bytes)"``, ``"data/images/ changed since the failure (1,000 -> 1,003 files)"``, ``"data/train.csv is
    missing"``. Empty when every size, count and modification time is the same (contents are not read: an edit that
    keeps the size and the modification time is not seen)."""
    changes = []
    for name, before in recorded.items():
        if not isinstance(before, dict):
            continue
        path = name if os.path.isabs(name) else os.path.join(cwd, name)
        now = data_fingerprint(path)
        shown = name + ("/" if before.get("kind") == "dir" and not name.endswith("/") else "")
        if now.get("kind") == "missing":
            if before.get("kind") != "missing":
                changes.append(f"{shown} is missing")
            continue
        if before.get("kind") == "missing":
            changes.append(f"{shown} exists now but did not when the run started")
            continue
        what = []
        if before.get("kind") == "dir" and before.get("files") != now.get("files"):
            what.append(f"{before.get('files'):,} -> {now.get('files'):,} files")
        if before.get("bytes") != now.get("bytes"):
            what.append(f"{before.get('bytes'):,} -> {now.get('bytes'):,} bytes")
        if not what and before.get("mtime_ns") != now.get("mtime_ns"):
            what.append("modified since")
        if what:
            changes.append(f"{shown} changed since the failure ({', '.join(what)})")
    return changes


__all__ = ["MAX_DIR_ENTRIES", "data_changes", "data_fingerprint", "source_changes"]
