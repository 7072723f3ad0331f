"""A network's parameters on disk, so that two runs start from bit-identical weights: :func:`save_params` writes one
``.npy`` per parameter plus a ``manifest.json`` with checksums, :func:`load_params` reads them back, refusing a file
that does not match its checksum. :mod:`.reproduce` re-exports both (``Reproducible(init_params_dir=...)`` uses them).
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import re
from pathlib import Path
from typing import Any, Dict, List, Set, Union

import numpy as np
import mindspore
from mindspore import nn

from .._util import io as _io
from .._util.names import compare_by_name
from .checks.params import numpy_dtype
from ..errors import ArgumentError, ArgumentTypeError, ParamsMismatchError

logger = logging.getLogger("mindguard")


MANIFEST = "manifest.json"


MANIFEST_FORMAT = "mindguard-params"


MANIFEST_SCHEMA = 1


def refuse_unmanaged_npy(directory: Path) -> None:
    """``init_params_dir`` without ``manifest.json`` is where the first run saves the weights; ``.npy`` files already
    there are not mindguard's (or are an interrupted save): saving beside them would silently ignore them."""
    found = sorted(p.name for p in directory.glob("*.npy")) if directory.is_dir() else []
    if found:
        shown = ", ".join(found[:4]) + (f", ... ({len(found)} files)" if len(found) > 4 else "")
        raise ParamsMismatchError(
            f"init_params_dir {str(directory)!r} holds .npy files ({shown}) but no {MANIFEST}: mindguard loads only "
            f"weights that mindguard.save_params wrote (with their names, shapes and checksums), and would save "
            f"beside yours without reading them. To start from your own .npy files, load them into the network "
            f"before training (e.g. param.set_data(Tensor(np.load(path, allow_pickle=False)))) and pass a new, "
            f"empty init_params_dir; if they are left from an interrupted save, delete them")


def save_params(net, directory: _io.PathLike, *, overwrite: bool = False) -> Path:
    """Save every parameter of ``net`` as one ``.npy`` file, plus ``manifest.json`` describing them.

    The manifest lists, in ``net.parameters_dict()`` order, each parameter's name, file, shape, numpy
    dtype and the sha256 of its ``.npy`` file. File names are derived from the parameter name made
    file-system safe plus a hash of the full name, so any parameter name works. Each file is written
    atomically and the manifest last: a directory without ``manifest.json`` holds no usable save.

    Saving the same parameters again is a no-op. A directory whose manifest describes *different*
    parameters is refused unless ``overwrite=True`` (then files only the old manifest listed are removed).

    Returns:
        the path of ``manifest.json``.

    Raises:
        TypeError: ``net`` is not a ``mindspore.nn.Cell`` or ``directory`` is not a path.
        PermissionError: ``directory`` cannot be created or written (nothing is written then).
        FileExistsError: ``directory`` holds a different save and ``overwrite`` is False.
    """
    params = _parameters(net, "save_params")
    directory = _as_dir(directory, "save_params")
    arrays = {name: _to_numpy(param) for name, param in params.items()}  # read everything before writing
    directory = _io.check_writable_dir(directory, what="save_params directory")

    blobs: Dict[str, bytes] = {}
    entries: List[Dict[str, Any]] = []
    used: Set[str] = set()
    for name, array in arrays.items():
        buf = io.BytesIO()
        np.save(buf, array, allow_pickle=False)
        data = buf.getvalue()
        file = _file_name(name, used)
        blobs[file] = data
        entries.append({"name": name, "file": file, "shape": list(array.shape), "dtype": str(array.dtype),
                        "sha256": hashlib.sha256(data).hexdigest()})
    manifest = {"format": MANIFEST_FORMAT, "schema": MANIFEST_SCHEMA, "parameters": entries}

    manifest_path = directory / MANIFEST
    old = _read_manifest(manifest_path) if manifest_path.exists() else None
    if old is not None and old.get("parameters") == entries:
        return manifest_path
    if old is not None and not overwrite:
        raise ArgumentError(
            f"save_params: {str(directory)!r} already holds different parameters "
            f"({_describe_difference(old.get('parameters', []), entries)}); refusing to overwrite them. "
            f"Pass overwrite=True to replace them, or choose another directory.")
    for file, data in blobs.items():
        _io.atomic_write_bytes(directory / file, data)
    _io.atomic_write_json(manifest_path, manifest)
    if old is not None:
        stale = {e.get("file") for e in old.get("parameters", [])} - set(blobs)
        for file in stale:
            if isinstance(file, str) and _is_own_file(file):
                (directory / file).unlink(missing_ok=True)
    logger.info("save_params: %d parameters -> %s", len(entries), directory)
    return manifest_path


def load_params(net, directory: _io.PathLike) -> List[str]:
    """Load parameters saved by :func:`save_params` into ``net``, strictly; return the names loaded.

    Every parameter of ``net`` must be in the directory with the same shape and dtype, and the directory
    must hold no parameter ``net`` lacks; every file must match its sha256. All files are read and checked
    before any parameter is assigned, so on an error ``net`` is untouched. Files are read with
    ``allow_pickle=False``.

    Raises:
        TypeError: ``net`` is not a ``mindspore.nn.Cell`` or ``directory`` is not a path.
        FileNotFoundError: no ``manifest.json`` in ``directory``.
        ParamsMismatchError: missing, extra, mis-shaped or mis-typed parameters (each one named), a
            checksum mismatch, or a file whose content differs from the manifest.
    """

    params = _parameters(net, "load_params")
    directory = Path(_as_dir(directory, "load_params")).expanduser()
    manifest_path = directory / MANIFEST
    if not os.path.lexists(manifest_path):
        raise ParamsMismatchError(f"load_params: no {MANIFEST} in {str(directory)!r}; save parameters there first "
                                f"with mindguard.save_params(net, {str(directory)!r})")
    entries = _read_manifest(manifest_path)["parameters"]
    saved = {e["name"]: e for e in entries}
    problems = []
    missing = [n for n in params if n not in saved]
    extra = [n for n in saved if n not in params]
    if missing:
        problems.append(f"missing from the directory: {missing}")
    if extra:
        problems.append(f"in the directory but not in the network: {extra}")
    for name, param in params.items():
        entry = saved.get(name)
        if entry is None:
            continue
        shape = list(param.shape)
        dtype = str(numpy_dtype(param.dtype))
        if list(entry["shape"]) != shape or entry["dtype"] != dtype:
            problems.append(f"{name!r}: saved {entry['dtype']}{list(entry['shape'])}, network has {dtype}{shape}")
    if problems:
        raise ParamsMismatchError(f"load_params: {str(directory)!r} does not match the network: "
                                  + "; ".join(problems)
                                  + ". Save this network's parameters to a new directory, or build the network "
                                    "that was saved.")

    arrays = {}
    for name in params:
        entry = saved[name]
        path = directory / entry["file"]
        expected = int(np.prod(entry["shape"], dtype=np.int64)) * np.dtype(entry["dtype"]).itemsize
        try:   # a regular file only (a FIFO would block), no larger than the array plus its header
            data = _io.read_regular_bytes(path, limit=expected + _NPY_HEADER_LIMIT)
        except (OSError, ValueError) as exc:
            reason = f"{exc.strerror}" if isinstance(exc, OSError) and exc.strerror else f"{exc}"
            raise ParamsMismatchError(f"load_params: cannot read {str(path)!r} for parameter {name!r}: {reason}; "
                                      f"save the parameters again") from None
        digest = hashlib.sha256(data).hexdigest()
        if digest != entry["sha256"]:
            raise ParamsMismatchError(
                f"load_params: checksum mismatch for parameter {name!r} in {str(path)!r} (sha256 {digest[:12]}..., "
                f"manifest says {entry['sha256'][:12]}...): the file was modified or truncated; save the "
                f"parameters again")
        try:   # the bytes just checksummed, not a second read of the file
            array = np.load(io.BytesIO(data), allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise ParamsMismatchError(
                f"load_params: {str(path)!r} (parameter {name!r}) is not a plain .npy array: {exc}. mindguard never "
                f"unpickles; save the parameters again with mindguard.save_params") from None
        if list(array.shape) != list(entry["shape"]) or str(array.dtype) != entry["dtype"]:
            raise ParamsMismatchError(f"load_params: {str(path)!r} holds {array.dtype}{list(array.shape)}, "
                                      f"the manifest says {entry['dtype']}{entry['shape']}")
        arrays[name] = array
    for name, param in params.items():
        param.set_data(mindspore.Tensor(arrays[name], dtype=param.dtype))
    logger.info("load_params: %d parameters <- %s", len(arrays), directory)
    return list(arrays)


def _parameters(net, caller: str) -> Dict[str, Any]:
    if not isinstance(net, nn.Cell):
        raise ArgumentTypeError(f"{caller}(net=...) needs a mindspore.nn.Cell, got {type(net).__name__}")
    return dict(net.parameters_dict())


def _as_dir(directory: Any, caller: str) -> Union[str, os.PathLike]:
    if not isinstance(directory, (str, os.PathLike)) or not str(directory):
        raise ArgumentTypeError(f"{caller}(directory=...) must be a non-empty path (str or pathlib.Path), got "
                                f"{directory!r}")
    return directory


def _to_numpy(param) -> np.ndarray:
    array = param.asnumpy()
    if array.dtype == object:
        raise ArgumentTypeError(f"parameter {param.name!r} has dtype {param.dtype}, which numpy cannot store without "
                                f"pickling")
    return np.ascontiguousarray(array)


_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


_OWN_FILE = re.compile(r"^[A-Za-z0-9_.-]+\.[0-9a-f]{10}\.npy$")


def _file_name(name: str, used: set) -> str:
    """``layer.0.weight`` -> ``layer.0.weight.<10 hex of sha1(name)>.npy``: safe, short, unique per name."""
    stem = _UNSAFE.sub("_", name).strip("._")[:80] or "param"
    file = f"{stem}.{hashlib.sha1(name.encode('utf-8')).hexdigest()[:10]}.npy"
    if file in used:  # only if two names share a sha1 prefix *and* a sanitised stem
        raise ArgumentError(f"save_params: two parameter names map to the file {file!r}; rename one of them")
    used.add(file)
    return file


def _is_own_file(file: str) -> bool:
    return bool(_OWN_FILE.match(file)) and "/" not in file


_NPY_HEADER_LIMIT = 1 << 16      # bytes: a .npy header save_params writes is < 200 bytes


_MANIFEST_LIMIT = 64 << 20       # bytes: ~200 bytes per parameter


def _read_manifest(path: Path) -> Dict[str, Any]:
    """The manifest at ``path``, checked: format, schema, one entry per name and per file, file names
    save_params writes, shapes of ints >= 0. Regular files only (never blocks). ParamsMismatchError otherwise."""
    try:
        manifest = json.loads(_io.read_regular_text(path, limit=_MANIFEST_LIMIT))
    except (OSError, ValueError, RecursionError) as exc:   # FIFO, too big, not UTF-8, not JSON, too deep
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
        raise ParamsMismatchError(f"cannot read {str(path)!r} as a mindguard parameter manifest ({reason}); "
                                  f"save the parameters again with mindguard.save_params") from None
    entries = manifest.get("parameters") if isinstance(manifest, dict) else None
    ok = (isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT and isinstance(entries, list)
          and all(isinstance(e, dict) and {"name", "file", "shape", "dtype", "sha256"} <= set(e)
                  and isinstance(e["name"], str) and isinstance(e["dtype"], str) and isinstance(e["sha256"], str)
                  and isinstance(e["shape"], list)
                  and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in e["shape"])
                  for e in entries))
    if not ok or not isinstance(entries, list):
        raise ParamsMismatchError(f"{str(path)!r} is not a mindguard parameter manifest (written by save_params)")
    if manifest.get("schema") != MANIFEST_SCHEMA:
        raise ParamsMismatchError(f"{str(path)!r} is a parameter manifest of schema {manifest.get('schema')!r}; this "
                                  f"mindguard reads schema {MANIFEST_SCHEMA} (was it written by a newer mindguard?)")
    for key in ("name", "file"):
        seen: Set[str] = set()
        twice = None
        for value in (str(e[key]) for e in entries):
            if value in seen:
                twice = value
                break
            seen.add(value)
        if twice is not None:
            raise ParamsMismatchError(f"{str(path)!r} lists the {key} {twice!r} more than once; save_params writes "
                                      f"each parameter once: the manifest was edited or damaged, save again")
    for e in entries:
        if not isinstance(e["file"], str) or not _is_own_file(e["file"]):
            raise ParamsMismatchError(f"{str(path)!r} names the file {e['file']!r}, which save_params never writes")
    return manifest


def _describe_difference(old: List[dict], new: List[dict]) -> str:
    old_by, new_by = {e.get("name"): e for e in old}, {e["name"]: e for e in new}
    differ = compare_by_name(old_by, new_by)
    parts = [f"{label}: {items[:5]}" for label, items in (
        ("only in the saved", differ.only_before), ("only in the network", differ.only_after),
        ("different values/shapes", differ.changed)) if items]
    return "; ".join(parts) or "different manifest"
