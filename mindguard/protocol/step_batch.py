"""The batch of an examined step that raised (``step_batch.npz`` beside the pass's record,
:func:`mindguard.protocol.folder.step_batch_beside`): what the step got, as the training process handed it to the
train network, kept for the analysis when MindSpore's dump holds nothing of the step (a step whose first launched
kernel raises is not dumped at all: docs/mindspore-facts.md, "hints").

One ``.npz`` (no pickled objects): ``names`` (a string array: the train network's ``construct`` argument each batch
position binds to, ``<varargs><k>`` for ``construct(self, *inputs)`` -- ``inputs0``, ``inputs1``, ... as MindSpore
names those graph inputs), ``global_step`` (the 1-based, process-wide global step of the batch) and ``a<i>`` for
each position ``i`` (0-based) small enough to keep (:data:`MAX_BYTES`). Written atomically by the training side
(:func:`write_step_batch`), read by the analysis (:func:`read_step_batch`). Never imports MindSpore.
"""
from __future__ import annotations

import io
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy as np

from .._util.io import atomic_write_bytes

PathLike = Union[str, Path]

#: A batch position larger than this (bytes) is not kept: the ids and masks whose values an answer names are small;
#: an image batch of a large model is not worth the disk.
MAX_BYTES = 64 << 20


@dataclass
class StepBatch:
    """A kept step batch: ``global_step`` (1-based), ``names`` by batch position (0-based) and the arrays kept, by
    name (a position over :data:`MAX_BYTES` has a name and no array)."""

    global_step: Optional[int]
    names: List[str]
    arrays: Dict[str, "np.ndarray[Any, Any]"] = field(default_factory=dict)


def write_step_batch(path: PathLike, arrays: Sequence["np.ndarray[Any, Any]"], names: Sequence[str],
                     global_step: Optional[int]) -> Path:
    """Write the batch ``arrays`` (by position) named ``names`` of 1-based ``global_step`` to ``path``, atomically.
    Raises ``OSError`` when it cannot be written."""
    members: Dict[str, "np.ndarray[Any, Any]"] = {"names": np.array([str(n) for n in names], dtype=np.str_),
                                      "global_step": np.array(-1 if global_step is None else int(global_step),
                                                              dtype=np.int64)}
    for i, array in enumerate(arrays):
        array = np.asarray(array)
        if array.dtype.kind in "biufc" and array.nbytes <= MAX_BYTES:
            members[f"a{i}"] = array
    buffer = io.BytesIO()
    np.savez(buffer, **members)
    return atomic_write_bytes(path, buffer.getvalue())


def read_step_batch(path: PathLike) -> Optional[StepBatch]:
    """The batch kept at ``path``, or None when there is none or it cannot be read as one."""
    try:
        with np.load(Path(path), allow_pickle=False) as data:
            names = [str(n) for n in np.asarray(data["names"]).reshape(-1)]
            step = int(np.asarray(data["global_step"]).reshape(-1)[0])
            arrays = {name: np.asarray(data[f"a{i}"]) for i, name in enumerate(names) if f"a{i}" in data.files}
    except (OSError, ValueError, EOFError, KeyError, IndexError, zipfile.BadZipFile):
        return None
    return StepBatch(step if step > 0 else None, names, arrays)


__all__ = ["MAX_BYTES", "StepBatch", "read_step_batch", "write_step_batch"]
