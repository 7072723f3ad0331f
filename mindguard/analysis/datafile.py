"""The data file a dataset pipeline raised on, named from its own error lines and looked at (issue 52).

MindSpore's pipeline says which file a map operation failed on (measured on 2.10: ``The corresponding data file is:
/data/dog/2.JPEG.`` in the error text, with ``ds.config.set_debug_mode`` off) -- in its own output, not in the
exception the script sees. :func:`data_file_origin` finds that line in the text it is given (the error and the
pass's output) and reads the file's first bytes to say what it holds: a file named ``.JPEG`` that is an HTML page,
a truncated JPEG, an empty file. The result is a ``traced_to`` entry (:mod:`.provenance`): ``kind`` ``"file"``.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Dict, Optional

_DATA_FILE = re.compile(r"The corresponding data file is:\s*(?P<path>\S.*?)(?:\.\s|\.?\s*$)", re.MULTILINE)

_MAGIC = [(b"\xff\xd8\xff", "a JPEG image"), (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"GIF8", "a GIF image"),
          (b"BM", "a BMP image"), (b"RIFF", "a RIFF (WebP/WAV) file"), (b"%PDF", "a PDF document"),
          (b"PK\x03\x04", "a ZIP archive"), (b"\x1f\x8b", "a gzip archive")]
_EXPECTED = {".jpg": "a JPEG image", ".jpeg": "a JPEG image", ".png": "a PNG image", ".gif": "a GIF image",
             ".bmp": "a BMP image", ".webp": "a RIFF (WebP/WAV) file"}


def named_data_file(text: str) -> Optional[str]:
    """The last data file MindSpore's error lines in ``text`` name, or None."""
    found = [m.group("path").strip().rstrip(".") for m in _DATA_FILE.finditer(text or "")]
    return found[-1] if found else None


def what_file_holds(path: Path) -> Optional[str]:
    """What a file's bytes are (``"an HTML page (it starts with `<!DOCTYPE html>`)"``), None when unreadable."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(512)
            size = os.fstat(handle.fileno()).st_size
            handle.seek(max(0, size - 2))
            tail = handle.read(2)
    except OSError:
        return None
    if size == 0:
        return "an empty file (0 bytes)"
    lowered = head.lstrip().lower()
    if lowered.startswith((b"<!doctype html", b"<html", b"<head", b"<?xml")) or b"<html" in lowered[:200]:
        first = head.lstrip().split(b"\n", 1)[0][:40].decode("utf-8", "replace").strip()
        return f"an HTML page (it starts with `{first}`)"
    for magic, kind in _MAGIC:
        if head.startswith(magic):
            if kind == "a JPEG image" and tail != b"\xff\xd9":
                return f"a truncated JPEG image ({size} bytes, no end-of-image marker)"
            return kind
    if all(32 <= b < 127 or b in (9, 10, 13) for b in head):
        first = head.split(b"\n", 1)[0][:40].decode("ascii", "replace").strip()
        return f"text (it starts with `{first}`)"
    return f"unknown bytes ({size} bytes, starting {head[:4].hex()})"


def data_file_origin_of_pass(message: Optional[str], output: Optional[Path],
                             limit: int = 200_000) -> Optional[Dict[str, Any]]:
    """:func:`data_file_origin` of a pass: its failure's ``message`` and the last ``limit`` bytes of its ``output``
    (``passN/output.log``), where MindSpore printed the line. What it finds is only shown (the answer names the file);
    the hunt decides nothing on it."""
    said = ""
    if output is not None:
        try:
            with open(output, "rb") as handle:
                handle.seek(max(0, os.fstat(handle.fileno()).st_size - limit))
                said = handle.read().decode("utf-8", "replace")
        except OSError:
            said = ""
    return data_file_origin(f"{message or ''}\n{said}")


def data_file_origin(text: str) -> Optional[Dict[str, Any]]:
    """The ``traced_to`` entry of the data file ``text`` (an error and a pass's output) names, or None."""
    name = named_data_file(text)
    if name is None:
        return None
    path = Path(name)
    holds = what_file_holds(path)
    expected = _EXPECTED.get(path.suffix.lower())
    entry: Dict[str, Any] = {"kind": "file", "name": name, "holds": holds, "expected": expected,
                             "rule": "not_its_format" if holds and expected and not holds.startswith(expected)
                             and not holds.startswith("a truncated") else "unreadable_sample"}
    if holds is None:
        entry["text"] = f"data file {name} (named in MindSpore's error; it cannot be read now)"
    elif expected and not holds.endswith(expected) and entry["rule"] == "not_its_format":
        entry["text"] = f"data file {name}: named {path.suffix}, it holds {holds}, not {expected}"
    else:
        entry["text"] = f"data file {name}: it holds {holds}"
    return entry
