"""Make a failing run repeat at the same step: seeds, dataset shuffle, initial weights, dropout.

Three tools, usable alone or together:

- :func:`fix_randomness` seeds every random source MindSpore training draws from (call it first);
- :func:`save_params` / :func:`load_params` store a network's parameters as one ``.npy`` per parameter
  plus a ``manifest.json`` with checksums, so two runs can start from bit-identical weights;
- :class:`Reproducible`, a callback that checks the run is reproducible when training starts (seed
  fixed? dataset shuffled?), pins the initial weights, and can switch dropout off.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import random
import re
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Union

import numpy as np
import mindspore
import mindspore.dataset as ds
from mindspore import nn
from mindspore.train import Callback

from .._util import io as _io
from .._util.names import compare_by_name
from .params import numpy_dtype
from .seed import current_seed, note_fixed_seed, note_numpy_seed  # noqa: F401 - current_seed: reproduce's API
from ..nn.cells import dropout_classes, put_back_cells, replace_cells
from ..errors import ArgumentError, ArgumentTypeError, ParamsMismatchError, ReproducibilityError, ReproducibilityWarning
from .run import current_run

_DETERMINISTIC_SET_HERE = False
_THREADS_SET_HERE = False

logger = logging.getLogger("mindguard")

MANIFEST = "manifest.json"
MANIFEST_FORMAT = "mindguard-params"
MANIFEST_SCHEMA = 1
_CHECK_CHOICES = ("warn", "raise", "ignore")


note_numpy_seed()   # a seed the script passes to numpy.random.seed from now on is known (current_seed)


# --------------------------------------------------------------------------------------------- seeds

def fix_randomness(seed: int = 0, *, deterministic: bool = True, cpu_single_thread: bool = False) -> Dict[str, Any]:
    """Seed every random source of a MindSpore training run. Call it first: **before the network is built**.

    Parameter initialisers draw from numpy's global RNG when a layer is constructed, and ``nn.Dropout``
    bakes its seed into its primitive in ``__init__``: seeding after the network exists (e.g. from a
    callback) is too late for both.

    Side effects (all process-wide):

    - ``random.seed(seed)`` (Python's ``random`` module);
    - ``numpy.random.seed(seed)`` (numpy's global RNG);
    - ``mindspore.set_seed(seed)``: MindSpore's global seed (initialisers, random ops' seeds, whose op-seed
      counter it resets) and the dataset pipeline's seed (``mindspore.dataset.config.set_seed``: shuffle
      order, random samplers, random augmentations); verified and set directly if a version does not;
    - ``os.environ["PYTHONHASHSEED"] = str(seed)``: affects **child** processes only (dataset workers
      started later, subprocesses); this process's ``hash()`` was randomised at start-up. It is not restored;
    - ``deterministic=True``: ``mindspore.set_deterministic(True)`` (``set_context(deterministic="ON")`` on
      versions without it), which MindSpore allows once per process: if it was already configured it is
      left as is and the returned dict says so. MindSpore also sets ``HCCL_DETERMINISTIC=true`` and
      ``TE_PARALLEL_COMPILER=1`` in ``os.environ`` then. It matters on Ascend (deterministic reductions
      and collectives); on CPU it has no visible effect;
    - ``cpu_single_thread=True``: ``mindspore.device_context.cpu.op_tuning.threads_num(1)`` (also once per
      process), so CPU kernels run on one thread. On CPU this is what makes ``nn.Dropout`` repeat: its
      kernel fills the mask from several threads, and with more than one thread runs diverge even with
      every seed fixed. It slows CPU training down.

    Calling it again (same or another seed) re-seeds; the once-per-process settings are skipped.

    Args:
        seed: integer in ``[0, 2**32)``.
        deterministic: turn on MindSpore's deterministic computing.
        cpu_single_thread: run CPU kernels on one thread (needed for reproducible dropout on CPU).

    Returns:
        dict: what was set, e.g. ``{"seed": 0, "random": 0, "numpy": 0, "mindspore": 0, "dataset": 0,
        "PYTHONHASHSEED": "0", "deterministic": True, "cpu_threads": 1}``; ``"deterministic"`` is
        ``"already configured: ON"`` (or similar) and ``"cpu_threads"`` ``"already configured"`` when another
        call set them first, and ``None`` when not requested. Also logged at INFO on the ``"mindguard"`` logger.

    Raises:
        TypeError: ``seed`` is not an ``int`` (``bool`` is refused too), or a flag is not a ``bool``.
        ValueError: ``seed`` is outside ``[0, 2**32)``.
    """
    _check_seed(seed)
    for flag, value in (("deterministic", deterministic), ("cpu_single_thread", cpu_single_thread)):
        if not isinstance(value, bool):
            raise ArgumentTypeError(f"fix_randomness({flag}=...) must be True or False, got {value!r}")

    random.seed(seed)
    np.random.seed(seed)
    mindspore.set_seed(seed)
    if ds.config.get_seed() != seed:  # set_seed does this in 2.x; be sure on other versions
        ds.config.set_seed(seed)
    os.environ["PYTHONHASHSEED"] = str(seed)
    done: Dict[str, Any] = {"seed": seed, "random": seed, "numpy": seed, "mindspore": mindspore.get_seed(),
                            "dataset": ds.config.get_seed(), "PYTHONHASHSEED": str(seed),
                            "deterministic": _set_deterministic() if deterministic else None,
                            "cpu_threads": _set_single_thread() if cpu_single_thread else None}
    note_fixed_seed(seed)
    logger.info("fix_randomness: %s", done)
    return done


def _check_seed(seed: Any) -> None:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ArgumentTypeError(f"fix_randomness(seed={seed!r}): the seed must be an int in [0, 2**32), "
                        f"got {type(seed).__name__}; pass e.g. fix_randomness(0)")
    if not 0 <= int(seed) < 2 ** 32:
        raise ArgumentError(f"fix_randomness(seed={seed}): the seed must be in [0, 2**32) "
                         f"(numpy and MindSpore's dataset seed are 32-bit unsigned); pass e.g. seed % 2**32")


def _set_deterministic() -> Union[bool, str]:
    global _DETERMINISTIC_SET_HERE

    if _DETERMINISTIC_SET_HERE:
        return True
    if hasattr(mindspore, "set_deterministic"):
        try:
            from mindspore.device_manager import DeviceManagerConf

            configured = DeviceManagerConf.get_instance().is_deterministic_configured()
        except (ImportError, AttributeError):
            configured = False
        if configured:
            state = _deterministic_state()
            if state != "ON":
                logger.warning("fix_randomness: MindSpore's deterministic mode was already configured (%s) "
                               "and can be set only once per process; left as is", state)
            return f"already configured: {state}"
        mindspore.set_deterministic(True)
    else:  # MindSpore < 2.5
        mindspore.set_context(deterministic="ON")
    _DETERMINISTIC_SET_HERE = True
    return True


def _deterministic_state() -> str:
    try:
        return str(mindspore.get_context("deterministic"))
    except (ValueError, KeyError):
        return "unknown"


def _set_single_thread() -> Union[int, str]:
    global _THREADS_SET_HERE
    if _THREADS_SET_HERE:
        return 1
    try:
        from mindspore.device_context.cpu import op_tuning
    except ImportError:  # older MindSpore: the context option
        mindspore.set_context(runtime_num_threads=1)
        _THREADS_SET_HERE = True
        return 1
    try:
        from mindspore._c_expression import RuntimeConf  # pylint: disable=no-name-in-module

        configured = RuntimeConf.get_instance().is_op_threads_num_configured()
    except (ImportError, AttributeError):
        configured = False
    if configured:
        logger.warning("fix_randomness(cpu_single_thread=True): the CPU kernel thread count was already set "
                       "(mindspore.device_context.cpu.op_tuning.threads_num can be set once per process); left "
                       "as is. If it is not 1, dropout on CPU will not repeat.")
        return "already configured"
    op_tuning.threads_num(1)
    _THREADS_SET_HERE = True
    return 1


# ------------------------------------------------------------------------------------ saved params

def _refuse_unmanaged_npy(directory: Path) -> None:
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


# -------------------------------------------------------------------------------------- callback

def shuffling_ops(dataset) -> List[str]:
    """Describe every operation of a dataset pipeline that shuffles, walking from ``dataset`` to its sources.

    A ``.shuffle(buffer_size)`` op, or a source whose sampler shuffles (``shuffle=True`` or the default
    for most sources, ``RandomSampler``, ``DistributedSampler(shuffle=True)``, ...). An iterable
    ``GeneratorDataset`` source (no ``__getitem__``) cannot shuffle and is not reported.
    """
    found, stack, seen = [], [dataset], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        kind = type(node).__name__
        children = list(getattr(node, "children", None) or [])
        if kind == "ShuffleDataset":
            found.append(f"ShuffleDataset (.shuffle(buffer_size={getattr(node, 'buffer_size', '?')}))")
        elif not children and _source_shuffles(node):
            sampler = getattr(node, "sampler", None)
            how = (f"sampler={type(sampler).__name__}" if sampler is not None
                   else f"shuffle={getattr(node, 'shuffle_flag', '?')}")
            found.append(f"{kind} ({how}; pass shuffle=False to keep the order)")
        stack.extend(children)
    return found


def _source_shuffles(node) -> bool:
    if type(node).__name__ == "GeneratorDataset" and not hasattr(getattr(node, "source", None), "__getitem__"):
        return False
    sampler = getattr(node, "sampler", None)
    try:
        if sampler is not None:
            return bool(sampler.is_shuffled())
        return bool(node.is_shuffled())
    except (NotImplementedError, AttributeError, TypeError):
        return False


def _repeats_dropout(version: str) -> bool:
    """False for MindSpore 2.7.x (and older): seeded runs with dropout are not bit-identical there."""
    numbers = re.match(r"(\d+)\.(\d+)", str(version))
    return numbers is None or (int(numbers.group(1)), int(numbers.group(2))) >= (2, 8)


def _dataset_seed_fixed() -> bool:
    return current_seed() is not None or mindspore.get_seed() is not None or ds.config.get_seed() != 5489


class Reproducible(Callback):
    """Callback that makes a run repeat: checks seeds and shuffling, pins initial weights, removes dropout.

    Everything happens in ``on_train_begin``, before the graph compiles at step 1:

    1. If :func:`fix_randomness` was not called in this process: ``check_seed`` decides (``"warn"``
       a :class:`ReproducibilityWarning`, ``"raise"`` a :class:`ReproducibilityError`, ``"ignore"``).
    2. If the training dataset pipeline shuffles (a ``.shuffle()`` op, or a source with a shuffling
       sampler) while the dataset seed is not fixed, ``check_shuffle`` decides the same way; the message
       names each shuffling op. With a fixed seed the order repeats, and it is only logged at INFO.
    3. ``disable_dropout=True``: every ``nn.Dropout``/``Dropout1d/2d/3d`` (and ``mint.nn`` dropouts) in
       the train network is replaced by ``nn.Identity`` (via :func:`mindguard.replace_cells`).
    4. ``init_params_dir``: on the first run (no ``manifest.json`` there) the network's initial
       parameters are saved (:func:`save_params`); on every later run they are loaded (:func:`load_params`)
       so runs start from identical weights even with different or no seeds.
    5. On MindSpore 2.7.x, which does not repeat dropout bit for bit even fully seeded, a train network
       with dropout (and ``disable_dropout=False``) is reported, naming the version and the fix (upgrade to
       >= 2.8, or ``disable_dropout=True``): a :class:`ReproducibilityError` if ``check_seed`` or
       ``check_shuffle`` is ``"raise"``, else a warning unless both are ``"ignore"``.

    After ``on_train_begin``: ``replaced_dropout`` (names), ``params_action`` (``"saved"``/``"loaded"``/None),
    ``shuffling`` (op descriptions).
    """

    def __init__(self, init_params_dir: Optional[_io.PathLike] = None, *, disable_dropout: bool = False,
                 check_shuffle: str = "warn", check_seed: str = "warn"):
        super().__init__()
        if init_params_dir is not None and (not isinstance(init_params_dir, (str, os.PathLike))
                                            or not str(init_params_dir)):
            raise ArgumentTypeError(f"Reproducible(init_params_dir=...) must be None or a path, "
                                    f"got {init_params_dir!r}")
        if not isinstance(disable_dropout, bool):
            raise ArgumentTypeError(f"Reproducible(disable_dropout=...) must be True or False, got {disable_dropout!r}")
        for arg, value in (("check_shuffle", check_shuffle), ("check_seed", check_seed)):
            if value not in _CHECK_CHOICES:
                raise ArgumentError(f"Reproducible({arg}={value!r}): must be one of {list(_CHECK_CHOICES)}")
        self.init_params_dir = Path(init_params_dir).expanduser() if init_params_dir is not None else None
        self.disable_dropout = disable_dropout
        self.check_shuffle = check_shuffle
        self.check_seed = check_seed
        self.replaced_dropout: List[str] = []
        self._swapped: Dict[int, nn.Cell] = {}   # id(nn.Identity put in) -> the dropout cell it stands for
        self._network: Optional[nn.Cell] = None
        self.params_action: Optional[str] = None
        self.shuffling: List[str] = []

    def on_train_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        first_call = current_run().global_step == 0  # nothing trained yet in this process
        if current_seed() is None and first_call:
            self._report(self.check_seed, "check_seed",
                         "mindguard.fix_randomness(seed) was not called before training, nor mindspore.set_seed "
                         "or numpy.random.seed: initial weights, dropout masks and the shuffle order change from run "
                         "to run. Call it first thing in the script, before building the network.")
        dataset = cb_params.get("train_dataset")
        self.shuffling = shuffling_ops(dataset) if dataset is not None else []
        if self.shuffling:
            if _dataset_seed_fixed():
                logger.info("Reproducible: the dataset shuffles (%s) with a fixed seed; its order repeats",
                            "; ".join(self.shuffling))
            else:
                self._report(self.check_shuffle, "check_shuffle",
                             f"the training dataset shuffles with an unfixed seed: {'; '.join(self.shuffling)}. "
                             f"Its order changes from run to run: call mindguard.fix_randomness(seed) before "
                             f"model.train, or turn shuffling off.")
        train_network = cb_params.get("train_network")
        if not self.disable_dropout and train_network is not None:
            self._check_version_repeats(train_network)
        if self.disable_dropout and train_network is not None:
            classes = dropout_classes()

            def identity(old: nn.Cell) -> nn.Cell:
                new = nn.Identity()
                self._swapped[id(new)] = old
                return new

            self._network = train_network
            self.replaced_dropout = replace_cells(train_network, lambda cell: isinstance(cell, classes), identity)
            if self.replaced_dropout:   # the user asked for it: said once, undone when the training call ends
                print(f"mindguard: disable_dropout=True: dropout off for this training call in "
                      f"{', '.join(self.replaced_dropout[:5])}"
                      f"{f' and {len(self.replaced_dropout) - 5} more' if len(self.replaced_dropout) > 5 else ''} "
                      f"(nn.Identity in their place until the call ends)", file=sys.stderr, flush=True)
        if self.init_params_dir is not None and not first_call:
            logger.info("Reproducible: initial parameters were pinned before the first step of this process; a "
                        "later training call keeps the weights it starts from")
        elif self.init_params_dir is not None:
            network = cb_params.get("network") or train_network
            if (self.init_params_dir / MANIFEST).exists():
                load_params(network, self.init_params_dir)
                self.params_action = "loaded"
            else:
                _refuse_unmanaged_npy(self.init_params_dir)
                save_params(network, self.init_params_dir)
                self.params_action = "saved"
            logger.info("Reproducible: initial parameters %s (%s)", self.params_action, self.init_params_dir)

    def on_train_end(self, run_context) -> None:
        """The dropout cells ``disable_dropout`` replaced go back in place: after training the network holds the
        user's cells (and a later compile uses them)."""
        self._put_back()

    def __exit__(self, *exc_info: Any) -> None:
        self._put_back()   # also when the training raised (on_train_end does not run then)

    def _put_back(self) -> None:
        if self._swapped and self._network is not None:
            put_back_cells(self._network, self._swapped)
        self._swapped, self._network = {}, None

    def _check_version_repeats(self, train_network) -> None:
        """MindSpore 2.7 does not repeat dropout bit for bit, even fully seeded on one CPU thread."""
        if _repeats_dropout(mindspore.__version__):
            return
        classes = dropout_classes()
        dropout = [name for name, cell in train_network.cells_and_names() if isinstance(cell, classes)]
        if dropout:
            checks = (self.check_seed, self.check_shuffle)
            action = "raise" if "raise" in checks else "warn" if "warn" in checks else "ignore"
            self._report(action, "check_seed/check_shuffle",
                         f"the installed MindSpore {mindspore.__version__} does not repeat dropout "
                         f"({', '.join(dropout[:3])}) bit for bit: with every seed fixed "
                         f"(fix_randomness(seed, cpu_single_thread=True)), reruns diverge after a few steps, "
                         f"with or without a shuffling dataset (measured on CPU with 2.7.0 and 2.7.2; 2.8+ repeats). "
                         f"Fix: upgrade to MindSpore >= 2.8 (pip install 'mindspore>=2.8'), or pass "
                         f"Reproducible(disable_dropout=True).")

    @staticmethod
    def _report(action: str, option: str, message: str) -> None:
        if action == "raise":
            raise ReproducibilityError(message + f" (raised because {option}='raise'; 'warn' only warns)")
        if action == "warn":   # one warning (shown once by Python's filter); a logger line too would repeat it
            warnings.warn(message, ReproducibilityWarning, stacklevel=3)
