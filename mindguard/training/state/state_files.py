"""The kept training state's files and values, shared by the keeper (:mod:`mindguard.training.state.keeper`) and the
resumer (:mod:`mindguard.training.state.resumer`).

What a state holds: every Parameter of the training (:func:`state_parameters`), the random state
(:func:`capture_random_state`), the train network's output structure (:func:`output_spec`, so a skipped step can
return :func:`placeholder` zeros), and the exact text of small values (:func:`fingerprint`) a resumed pass compares.
Files: ``<dir>/state.json`` (read by :mod:`mindguard.protocol.kept_state`, which both sides share, and re-exported
here: ``read_state_meta``, ``describe_state``, ``unrestorable_note``; schema ``STATE_SCHEMA``), ``<dir>/state.npz``
and the big arrays' ``<dir>/p<i>.npy`` (read with ``allow_pickle=False``). Steps are 1-based, process-wide global steps
(:mod:`mindguard.training.run`).

Imports nothing of MindSpore at import time.
"""
from __future__ import annotations

import math
import mmap
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import dataset_skip as _dataset_skip, rng as _rng
from ...protocol.kept_state import STATE_SCHEMA, describe_state, read_state_meta, unrestorable_note


def state_parameters(*cells: Any) -> List[Any]:
    """Every Parameter of ``cells`` (a train network; or a network and its optimizer), each once, in their
    ``get_parameters()`` order: the state a training step reads and writes."""
    from ..checks.params import unique_parameters

    seen, params = set(), []
    for cell in cells:
        for param in unique_parameters(cell) if cell is not None else ():
            if id(param) not in seen:
                seen.add(id(param))
                params.append(param)
    return params


def fingerprint(value: Optional[float]) -> Optional[str]:
    """A float as exact text (``float.hex``; ``"nan"``/``"inf"`` as such), ``None`` as ``None``."""
    if value is None:
        return None
    return _exact(float(value))


def _exact(value: float) -> str:
    return value.hex() if math.isfinite(value) else repr(value)


def small_parameters(params: Sequence[Any], limit: int = 16) -> List[Any]:
    """The Parameters of at most ``limit`` values (learning rate, ``global_step``, loss scale, Adam's beta powers),
    the first 64 of them: read at every step of a hunt's pass to tell whether a resumed run follows the run it
    resumes."""
    return [p for p in params if p.size <= limit][:64]


def small_state(params: Sequence[Any]) -> List[str]:
    """The values of ``params`` as exact text (one-element ones by ``item()``: ~1 µs instead of ~4-30 µs)."""
    out = []
    for p in params:
        if p.size == 1:
            out.append(_exact(float(p.item())))
        else:
            out.append(",".join(_exact(float(v)) for v in np.asarray(_as_numpy(p), dtype=np.float64).reshape(-1)))
    return out


def _as_numpy(param: Any) -> np.ndarray:
    """``param``'s values as a numpy array numpy can compute with: bfloat16, which numpy lacks (``asnumpy()`` gives
    raw 2-byte voids), as float32 (exact; assigned back as bfloat16)."""
    import mindspore as ms

    if param.dtype == ms.bfloat16:
        return ms.ops.cast(param, ms.float32).asnumpy()
    return param.asnumpy()


def _host_copy(param: Any, into: Optional[np.ndarray] = None) -> np.ndarray:
    """``param``'s values in host memory of their own: into ``into`` when it has their shape and dtype (measured,
    25.6 MB: 1.5-2 ms into buffers of an earlier copy, 3-48 ms into new ones, which the OS must first map), else
    into a new buffer mapped whole at once (:func:`populated_empty`)."""
    array = _as_numpy(param)
    if into is not None and into.shape == array.shape and into.dtype == array.dtype and into is not array:
        np.copyto(into, array)
        return into
    if array.flags.owndata:   # asnumpy() made a copy of its own (a device's tensor)
        return array
    copy = populated_empty(array.shape, array.dtype)   # on CPU asnumpy() is a view of the parameter
    np.copyto(copy, array)
    return copy


#: buffers from this size on are mapped with ``MAP_POPULATE`` (:func:`populated_empty`)
POPULATE_MIN_BYTES = 1 << 20


def populated_empty(shape: Sequence[int], dtype: Any) -> np.ndarray:
    """An uninitialised array whose memory the OS has already mapped (Linux: an anonymous ``mmap`` with
    ``MAP_POPULATE``; elsewhere, and below :data:`POPULATE_MIN_BYTES`, ``np.empty``). Measured (0.5 GB, 2-core
    VM, in a MindSpore training's first steps): 0.13 s to map and 0.05 s to copy into, against 0.15-1.6 s for
    ``ndarray.copy()``, whose page-by-page faults are slow while MindSpore's threads run; a 1 GB state's first copy
    took 3.8 s that way."""
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    populate = getattr(mmap, "MAP_POPULATE", None)
    if populate is None or nbytes < POPULATE_MIN_BYTES:
        return np.empty(shape, dtype)
    try:
        mapped = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | populate)
    except OSError:   # (an mmap limit): numpy's own allocation
        return np.empty(shape, dtype)
    return np.frombuffer(mapped, dtype=dtype).reshape(shape)


def output_spec(outputs: Any) -> Any:
    """The structure of a train network's output, as JSON: tensors as shape and dtype, tuples as lists."""
    import mindspore as ms

    from ..checks.params import numpy_dtype

    if isinstance(outputs, ms.Tensor):
        try:
            dtype = numpy_dtype(outputs.dtype).name
        except (TypeError, ValueError, KeyError):
            dtype = "float32"   # bfloat16 and other types numpy lacks: a float32 zero stands in
        return {"tensor": list(outputs.shape), "dtype": dtype}
    if isinstance(outputs, (tuple, list)):
        return {"tuple": [output_spec(item) for item in outputs]}
    if isinstance(outputs, (bool, int, float)):
        return {"number": 0}
    return {"none": True}


def placeholder(spec: Any) -> Any:
    """Zeros (False for bool) shaped like the output ``spec`` describes: what a skipped step returns."""
    import mindspore as ms

    if not isinstance(spec, dict):
        return ms.Tensor(np.float32(0))
    if "tensor" in spec:
        return ms.Tensor(np.zeros(spec["tensor"], np.dtype(spec.get("dtype") or "float32")))
    if "tuple" in spec:
        return tuple(placeholder(item) for item in spec["tuple"])
    if "number" in spec:
        return 0
    return None


def capture_random_state(unrestorable: Sequence[str] = ()) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """The random state to keep with a training state (:func:`mindguard.training.state.rng.capture`), its JSON part
    naming the sources it cannot hold (``unrestorable``) and the MindSpore version that says so."""
    arrays, meta = _rng.capture()
    if unrestorable:
        meta["unrestorable"] = list(unrestorable)
        meta["mindspore"] = _mindspore_version()
    return arrays, meta


def restore_random_state(meta: Dict[str, Any], stored: Dict[str, np.ndarray]) -> List[str]:
    """Restore the random state a kept state holds (``meta``: its ``state.json``; ``stored``: its ``state.npz``
    members). Returns what was restored, by name (none for a state without one)."""
    rng = meta.get("rng")
    if not isinstance(rng, dict):
        return []
    arrays = _rng.split_arrays(stored)
    if _dataset_skip.python_pipeline_live() is not None:
        # a Python source or map of a live pipeline may draw from numpy's / Python's RNG in its own thread, ahead
        # of the training: the pipeline was iterated as in the failing run, so its draws are as they were there;
        # setting the state now would hand the next rows draws of another position
        arrays = {k: v for k, v in arrays.items() if not k.startswith(("numpy", "python"))}
    return _rng.restore(arrays, rng)


def _mindspore_version() -> Optional[str]:
    try:
        import mindspore

        return str(mindspore.__version__)
    except Exception:  # noqa: BLE001 - only words in a message
        return None


def checkpoint_callbacks(call_key: Any) -> List[Any]:
    """The ``ModelCheckpoint`` callbacks of a ``Model.train`` call (``call_key``: its callback parameters)."""
    callbacks = call_key.get("list_callback") if isinstance(call_key, dict) else None
    return [cb for cb in callbacks or () if hasattr(cb, "_latest_ckpt_file_name")
            and hasattr(cb, "_last_triggered_step")]


__all__ = ["POPULATE_MIN_BYTES", "STATE_SCHEMA", "capture_random_state", "checkpoint_callbacks", "describe_state",
           "fingerprint", "output_spec", "placeholder", "populated_empty", "read_state_meta", "restore_random_state",
           "small_parameters", "small_state", "state_parameters", "unrestorable_note"]
