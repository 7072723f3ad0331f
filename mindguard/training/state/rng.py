"""The random state a training step draws from, kept with the training state and restored on resume.

A kept state (:mod:`mindguard.training.state.resume`) holds the Parameters; a resumed step computes what the failing
run's step computed only if it also draws the same random numbers. These sources are restored exactly (measured on
MindSpore 2.10 CPU: docs/mindspore-facts.md, sections ``rngscale`` and ``dropout``):

- numpy's global RNG (``numpy.random.get_state``): samplers, Python dataset sources, negative sampling;
- Python's ``random`` module (``random.getstate``);
- MindSpore's default generator (``mindspore.get_rng_state``: its seed and offset; the ``mint``/``*Ext`` random
  ops draw from it where they have kernels -- not on CPU in 2.10);
- MindSpore's kernel seed table (``mindspore.common.seed._KERNEL_SEED``): a random *function* called eagerly
  (PyNative ``ops.dropout(x)``) builds a fresh primitive per call seeded from it.

One kind is *not* restorable: a random primitive that keeps its generator inside its kernel (``nn.Dropout``'s
``ops.Dropout``, ``nn.Dropout2d``, ``ops.StandardNormal``, ``ops.UniformReal``, a random function compiled into a
GRAPH-mode ``construct``, ...). Its kernel starts again from its seeds in every process, and MindSpore exposes no way
to read or set where it is; a resumed step draws the masks of the first step instead of those of the kept one.
mindguard never rewrites the user's cells to get around it (a guest computes what the bare script computes):
:func:`unrestorable_sources` names such cells, and :func:`compiled_random_functions` such functions, when a state is
kept, so the user learns it before a failure; ``mindguard hunt --from`` then resumes *approximately* (the trace is
not compared) and says so with its answer, or runs from step 1 -- where the kernels start as they did -- when the
failure does not repeat with other masks.

The dataset pipeline's own RNG (shuffle order, random augmentations) is not here: the resumed pass either
iterates the pipeline as the failing run did, or resets it to the kept step
(:mod:`mindguard.training.state.dataset_skip`).

Never imports MindSpore at import time. The sentence naming what a state cannot hold
(``describe_unrestorable``) is :mod:`mindguard.protocol.kept_state`'s, which the hunt reads.
"""
from __future__ import annotations

import random
from typing import Any, Dict, Iterable, List, Optional, Tuple

import numpy as np

from ...protocol.kept_state import FIX, describe_unrestorable  # noqa: F401 - re-exported (the keeper's words)

#: arrays of a captured state are stored in ``state.npz`` under ``ARRAY_PREFIX + name``
ARRAY_PREFIX = "rng_"

#: primitives whose generator state is held by their kernel (the seed attributes name it)
_SEED_ATTRS = (("Seed0", "Seed1"), ("seed", "seed2"))

def capture_host() -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """numpy's and Python's global random state now: arrays (for ``state.npz``) and the scalars beside them (for
    ``state.json``)."""
    arrays: Dict[str, np.ndarray] = {}
    meta: Dict[str, Any] = {}
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    arrays["numpy_keys"] = np.asarray(keys, dtype=np.uint32).copy()
    meta["numpy"] = {"kind": str(kind), "pos": int(pos), "has_gauss": int(has_gauss),
                     "cached_gaussian": float(cached).hex()}
    version, internal, gauss_next = random.getstate()
    arrays["python_state"] = np.asarray(internal, dtype=np.uint64)   # 624 words < 2**32 and the index (624)
    meta["python"] = {"version": int(version), "gauss_next": None if gauss_next is None else float(gauss_next).hex()}
    return arrays, meta


def _kernel_seed_table() -> Optional[Dict[Any, Any]]:
    """MindSpore's per-kernel op-seed table (``mindspore.common.seed._KERNEL_SEED``: ``(kernel name, op seed) ->
    the next Seed1``), or ``None`` on a MindSpore without it. A random *function* called eagerly (PyNative
    ``ops.dropout``, ``ops.uniform``, ...) builds a new primitive per call, seeded from this table, and its fresh
    kernel draws from those seeds alone: the table is its whole random state (docs/mindspore-facts.md,
    section ``dropout``)."""
    try:
        import importlib

        table = getattr(importlib.import_module("mindspore.common.seed"), "_KERNEL_SEED", None)
    except Exception:  # noqa: BLE001 - an older or newer MindSpore: the other sources still count
        return None
    return table if isinstance(table, dict) else None


_BASELINE: Dict[Any, Any] = {}   # the kernel seed table when the current training call started
_COMPILED: List[str] = []         # random functions seen compiled into a graph since (named once each)
_NOTED: List[bool] = []           # non-empty once a training call started (nothing to compare with before)


def note_training_starts() -> None:
    """Remember the kernel seed table before a training call's first step (before anything of it compiles), and
    forget the random functions an earlier call saw compiled (another network, maybe another mode: what a run
    found stays in its record)."""
    table = _kernel_seed_table()
    _COMPILED.clear()
    _BASELINE.clear()
    _BASELINE.update(table or {})
    _NOTED[:] = [True]


def compiled_random_functions() -> List[str]:
    """Random functions (``ops.dropout(x)``, ``ops.uniform(...)``, ...) called in a ``construct`` that compiled in
    GRAPH mode since :func:`note_training_starts`: each compile draws its primitive's seeds from the kernel seed
    table, and the primitive's kernel then holds its generator -- not restorable. Eager calls (PyNative) also
    advance the table, but build a fresh kernel per call and are restored with it: not named. Found by the table's
    change, so nothing is seen when no seed is set (MindSpore then seeds such kernels at random)."""
    table = _kernel_seed_table()
    if table is None or not _NOTED:
        return list(_COMPILED)
    try:
        import mindspore

        graph = mindspore.get_context("mode") == mindspore.GRAPH_MODE
    except Exception:  # noqa: BLE001 - no verdict without the mode
        return list(_COMPILED)
    if graph:
        for key, value in table.items():
            name = f"ops.{key[0]} (a random function in a `construct` compiled in GRAPH mode)"
            if _BASELINE.get(key) != value and name not in _COMPILED:
                _COMPILED.append(name)
    _BASELINE.update(table)
    return list(_COMPILED)


def capture_kernel_seeds() -> Optional[List[List[Any]]]:
    """:func:`_kernel_seed_table` as JSON: ``[[kernel name, op seed, next seed], ...]`` (``None`` without one)."""
    table = _kernel_seed_table()
    if table is None:
        return None
    return [[str(key[0]), key[1], int(value)] for key, value in table.items()
            if isinstance(key, tuple) and len(key) == 2 and isinstance(value, int)]


def capture() -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The process's restorable random state now (:func:`capture_host`, MindSpore's default generator and its
    per-kernel seed table). A source that cannot be read is left out, and named in ``meta["unreadable"]``."""
    arrays, meta = capture_host()
    try:
        import mindspore

        arrays["mindspore_default"] = np.asarray(mindspore.get_rng_state().asnumpy()).copy()
    except (AttributeError, RuntimeError) as exc:   # a MindSpore without the generator: the others still count
        meta["unreadable"] = [f"mindspore.get_rng_state ({type(exc).__name__})"]
    seeds = capture_kernel_seeds()
    if seeds is not None:
        meta["kernel_seeds"] = seeds
    return arrays, meta


def restore(arrays: Dict[str, np.ndarray], meta: Dict[str, Any]) -> List[str]:
    """Set the process's random state to what :func:`capture` returned (``arrays`` without their prefix). Returns
    the sources restored, by name; one missing from ``arrays``/``meta`` (a state kept by an older mindguard) is
    left as it is."""
    done = []
    numpy_meta = meta.get("numpy")
    if "numpy_keys" in arrays and isinstance(numpy_meta, dict):
        np.random.set_state((numpy_meta["kind"], np.asarray(arrays["numpy_keys"], dtype=np.uint32),
                             int(numpy_meta["pos"]), int(numpy_meta["has_gauss"]),
                             float.fromhex(numpy_meta["cached_gaussian"])))
        done.append("numpy")
    python_meta = meta.get("python")
    if "python_state" in arrays and isinstance(python_meta, dict):
        gauss = python_meta.get("gauss_next")
        random.setstate((int(python_meta["version"]), tuple(int(v) for v in arrays["python_state"]),
                         None if gauss is None else float.fromhex(gauss)))
        done.append("python")
    if "mindspore_default" in arrays:
        import mindspore

        mindspore.set_rng_state(mindspore.Tensor(np.asarray(arrays["mindspore_default"])))
        done.append("mindspore")
    seeds = meta.get("kernel_seeds")
    table = _kernel_seed_table() if isinstance(seeds, list) else None
    if table is not None and isinstance(seeds, list):
        table.update({(str(name), op_seed): int(value) for name, op_seed, value in seeds})
        done.append("mindspore kernel seeds")
    return done


def split_arrays(stored: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """The random-state arrays of a ``state.npz`` (its ``rng_*`` members), without their prefix."""
    return {name[len(ARRAY_PREFIX):]: value for name, value in stored.items() if name.startswith(ARRAY_PREFIX)}


def _draws(primitive: Any) -> bool:
    """Whether ``primitive`` keeps a random generator in its kernel (it has a pair of seed attributes)."""
    attrs = getattr(primitive, "attrs", None)
    return isinstance(attrs, dict) and any(a in attrs and b in attrs for a, b in _SEED_ATTRS)


def _cell_draws(cell: Any) -> bool:
    """Whether ``cell`` itself (not its sub-cells) calls a random primitive with a kernel-held generator when it
    trains: a dropout that drops nothing (``p == 0``, ``keep_prob == 1``) or a cell not training draws nothing."""
    if getattr(cell, "training", True) is False:
        return False
    if getattr(cell, "p", None) == 0 or getattr(cell, "keep_prob", None) == 1:
        return False
    from mindspore.ops import Primitive

    primitives = vars(cell).get("_primitives")   # where Cell.__setattr__ puts a Primitive attribute
    values = list(primitives.values()) if isinstance(primitives, dict) else []
    return any(isinstance(value, Primitive) and _draws(value) for value in values + list(vars(cell).values()))


def unrestorable_sources(cells: Iterable[Any], limit: int = 8) -> List[str]:
    """The cells under ``cells`` (a train network, its optimizer) that draw from a random kernel whose state is not
    restorable, as ``"nn.Dropout in `net.encoder.drop`"`` (at most ``limit``; each cell once). Random ops called
    as functions in ``construct`` (``ops.dropout(x)``) are not seen here: a resumed run that draws from them
    computes something else, which the hunt tells after its first resumed step."""
    found: List[str] = []
    seen = set()
    for root in cells:
        if root is None or not hasattr(root, "cells_and_names"):
            continue
        for name, cell in root.cells_and_names():
            if id(cell) in seen:
                continue
            seen.add(id(cell))
            if _cell_draws(cell):
                module = type(cell).__module__.split(".")
                prefix = "nn." if module[:2] == ["mindspore", "nn"] else ""
                found.append(f"{prefix}{type(cell).__name__} in `{name or type(root).__name__}`")
                if len(found) >= limit:
                    return found
    return found

