"""The op a replayed step raised in, traced to the batch (issue 52): an index op (a ``Gather`` of a table) whose
index is one of the step's batch tensors -- itself, or through recorded ops that keep its values (a reshape, a
copy) -- gets the batch column, its rows and values outside the table's range as ``traced_to``
(:mod:`mindguard.analysis.provenance`'s entries), and the hint put to that origin first, as a dump answer does.

The column is named by the argument of the network's ``construct`` the batch position binds to
(:func:`mindguard._util.names.argument_names`). Batch rows are the column's first axis (0-based).
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import mindspore as ms

from ...analysis.domain import outside_index_range
from ...analysis.origin_hints import origin_hint
from ...analysis.provenance import INDEX_OPS, SELECTING, Reached, batch_entry
from ...report.model import Finding
from .api_hooks import OpRecord, all_tensors

#: recorded ops followed back from the index at most
MAX_DEPTH = 8


def trace_stop_to_batch(finding: Finding, record: OpRecord, batch: Sequence[Any], names: Sequence[str],
                        producer_of: Callable[[Any], Optional[OpRecord]]) -> Finding:
    """``finding`` (the op the step raised in, :func:`~.tape_answer.stop_finding`) with ``traced_to`` and the
    origin's hint when its index is read from a batch column holding ids outside its table (module docstring);
    unchanged otherwise. ``batch``: the step's input tensors by position; ``names``: their names; ``producer_of``:
    the recorded op whose output a tensor is (None for a leaf)."""
    if record.op_type not in INDEX_OPS:
        return finding
    table_slot, index_slot = INDEX_OPS[record.op_type]
    tensors = dict(all_tensors(record.args, record.kwargs))
    table, current = tensors.get(table_slot), tensors.get(index_slot)
    if table is None or current is None or not getattr(table, "shape", None):
        return finding
    path: List[str] = []
    position = None
    for _ in range(MAX_DEPTH):
        position = next((i for i, tensor in enumerate(batch) if tensor is current), None)
        producer = producer_of(current) if position is None else None
        if producer is None or producer.op_type not in SELECTING:
            break
        path.append(producer.op_type)
        current = next((t for _, t in all_tensors(producer.args, producer.kwargs)), None)
    if position is None:
        return finding
    axis = record.args[2] if record.op_type in ("Gather", "GatherV2") and len(record.args) > 2 else 0
    if not isinstance(axis, int) or isinstance(axis, bool):
        return finding
    rows = int(table.shape[axis % len(table.shape)])
    reader = f"`{table.name}`" if isinstance(table, ms.Parameter) else "the table"
    violation = outside_index_range(batch[position].asnumpy(), rows, reader=reader)
    if violation is None:
        return finding
    name = names[position] if position < len(names) else f"inputs{position}"
    entry = batch_entry(Reached("batch", name, index_slot, path), None, violation, "the captured batch",
                        record.op_type)
    finding.extra["traced_to"] = [entry]
    finding.hint = origin_hint([entry], finding.hint, record.op_type) or finding.hint
    return finding
