"""Move a ``Model.train`` call's dataset forward to a later step without producing the batches in between.

A resumed pass (:mod:`mindguard.training.state.resume`) has to reach the kept step's batch. Iterating the pipeline there
costs what the pipeline costs per batch (measured 1.9 ms a batch for a ``NumpySlicesDataset`` of 32 x 784 floats: 2.8 s
of a 1500-step skip). MindSpore's own failover path resets a dataset iterator to a global step
(``Iterator._reset(step, dataset_size)``); with ``ds.config.get_fast_recovery()`` (the default) the reset skips
the reading and the map operations of the steps before it (measured: 0.05 s to step 1470, and the batches after
it equal those of a full iteration, shuffled with a seed or not: docs/mindspore-facts.md).

It is not exact for every pipeline: MindSpore says random augmentations may differ after a fast reset, and a
Python source that keeps state between rows (an iterable ``GeneratorDataset`` source drawing from its own RNG)
restarts. Such a source is refused here; anything else that differs shows as a trace difference at the kept step
(:meth:`mindguard.training.state.resume.Resumer.diverges`), and the hunt then runs the pass again without skipping this
way (``HuntRequest.fast_forward=False``).
"""
from __future__ import annotations

from typing import Any, Iterator, List, Optional


def pipeline_nodes(dataset: Any) -> Iterator[Any]:
    """Every stage of ``dataset``'s pipeline once (``dataset`` first, then its ``children``, depth first)."""
    stack, seen = [dataset], set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(getattr(node, "children", None) or [])


def _stateful_python_sources(dataset: Any) -> Optional[str]:
    """The class name of the first iterable (not random-access) Python source in ``dataset``'s pipeline, or None."""
    for node in pipeline_nodes(dataset):
        source = getattr(node, "source", None)
        if source is not None and type(node).__name__ == "GeneratorDataset" and not hasattr(source, "__getitem__"):
            return type(source).__name__
    return None


def runs_python(operation: Any) -> bool:
    """Whether a ``map`` operation calls Python code of the user's: a plain callable, or one inside a compound
    transform (``RandomApply([f])``, ``Compose``, ``RandomChoice``)."""
    if callable(operation) and not type(operation).__module__.startswith("mindspore."):
        return True
    wrapped = getattr(operation, "transform", None)   # FuncWrapper: a Python function inside a compound transform
    if wrapped is not None and wrapped is not operation and runs_python(wrapped):
        return True
    inner = getattr(operation, "transforms", None)
    return isinstance(inner, (list, tuple)) and any(runs_python(t) for t in inner)


def _python_stage(dataset: Any) -> Optional[str]:
    """The first stage of ``dataset``'s pipeline that runs the user's Python code in the pipeline's threads (a
    ``GeneratorDataset`` source or sampler of the script's -- not ``NumpySlicesDataset``'s own --, a ``map``
    calling a Python function), as its class name, or None."""
    import mindspore.dataset as ds

    for node in pipeline_nodes(dataset):
        if isinstance(node, ds.GeneratorDataset):   # its source (and sampler) may be the user's Python
            for part in (getattr(node, "source", None), getattr(node, "sampler", None)):
                if part is not None and not type(part).__module__.startswith(("mindspore.", "builtins", "numpy")):
                    return f"{type(node).__name__}({type(part).__name__})"
        for operation in getattr(node, "operations", None) or []:
            if runs_python(operation):
                return f"map({getattr(operation, '__name__', type(operation).__name__)})"
    return None


def python_pipeline_live() -> Optional[str]:
    """A Python stage of a dataset pipeline that is being iterated now (:func:`_python_stage`), or None: such a
    stage may draw from numpy's or Python's global RNG in its own thread, concurrently with the training."""
    try:
        from mindspore.dataset.engine import iterators
    except ImportError:
        return None
    for ref in list(iterators.ITERATORS_LIST):
        iterator = ref()
        dataset = getattr(iterator, "_Iterator__ori_dataset", None) if iterator is not None else None
        stage = _python_stage(dataset) if dataset is not None else None
        if stage is not None:
            return stage
    return None


def live_dataset_paths() -> List[str]:
    """The files and folders read by the source stages of every pipeline being iterated now (``Model.train``'s, a
    loop's ``create_tuple_iterator``): :func:`mindguard.training.record.provenance.dataset_paths` over their stages."""
    try:
        from mindspore.dataset.engine import iterators
    except ImportError:
        return []
    from ..record.provenance import dataset_paths

    out: List[str] = []
    for ref in list(iterators.ITERATORS_LIST):
        iterator = ref()
        dataset = getattr(iterator, "_Iterator__ori_dataset", None) if iterator is not None else None
        if dataset is not None:
            out.extend(p for p in dataset_paths(pipeline_nodes(dataset)) if p not in out)
    return out


def _iterator_of(dataset: Any) -> Any:
    """The one live MindSpore iterator created over ``dataset`` (``Model.train`` makes one per call), or None."""
    from mindspore.dataset.engine import iterators

    found = []
    for ref in list(iterators.ITERATORS_LIST):
        iterator = ref()
        if iterator is not None and getattr(iterator, "_Iterator__ori_dataset", None) is dataset \
                and hasattr(iterator, "_reset"):
            found.append(iterator)
    return found[0] if len(found) == 1 else None


def fast_forward(dataset: Any, completed_steps: int, steps_per_epoch: int) -> Optional[str]:
    """Make the next batch of ``dataset``'s iterator the one after ``completed_steps`` (counted from the
    iterator's first batch, across epochs; ``steps_per_epoch`` batches an epoch). Returns None when done, else
    why it was not (the caller then iterates as before)."""
    import mindspore.dataset as ds

    if not ds.config.get_fast_recovery():
        return "ds.config.set_fast_recovery(False)"
    if ds.config.get_debug_mode():
        return "the dataset runs in debug mode"
    stateful = _stateful_python_sources(dataset)
    if stateful is not None:
        return f"its Python source {stateful} is iterable only (a reset restarts it)"
    iterator = _iterator_of(dataset)
    if iterator is None:
        return "its iterator was not found"
    iterator._reset(int(completed_steps), int(steps_per_epoch))   # MindSpore's failover entry point
    return None
