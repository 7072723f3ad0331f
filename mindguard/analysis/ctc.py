"""What a CTC loss's inputs say about alignment: per sample, the label's length, its pairs of equal neighbours, the
time steps it needs and the ones its input gives. A CTC loss is +Inf for a sample whose label needs more time steps
than its input gives (:func:`mindguard.analysis.hints.hint_for` says so, and how to fix it).

Inputs are :func:`~mindguard.analysis.stats.tensor_stats` dicts by input slot (0-based), with ``values`` when the
tensor was small enough to keep.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional


def _values_of(stats: Optional[Dict[str, Any]]) -> Optional[List[Any]]:
    return list(stats["values"]) if stats and isinstance(stats.get("values"), list) else None


def ctc_samples(base: str, by_slot: Dict[int, Dict[str, Any]]) -> Optional[List[Dict[str, Any]]]:
    """Per sample: label length, pairs of equal neighbours, the time steps it needs and the ones its input gives --
    from the values of CTCLoss's inputs (``x [T, N, C]``, ``labels_indices [n, 2]``, ``labels_values [n]``,
    ``sequence_length [N]``) or CTCLossV2's (``log_probs [T, N, C]``, ``targets [N, S]``, ``input_lengths [N]``,
    ``target_lengths [N]``); None when the values are not known. ``sample`` is 0-based; ``has`` is ``None`` when
    neither the sequence lengths nor the input's time axis is known."""
    x = by_slot.get(0) or {}
    x_shape = x.get("shape")
    steps = x_shape[0] if isinstance(x_shape, list) and x_shape else None
    if base.startswith("ctclossv2"):
        targets, lengths, given = _values_of(by_slot.get(1)), _values_of(by_slot.get(3)), _values_of(by_slot.get(2))
        shape = (by_slot.get(1) or {}).get("shape") or []
        if targets is None or lengths is None:
            return None
        labels, start = [], 0
        for b, length in enumerate(lengths):
            if len(shape) == 2:
                labels.append(targets[b * shape[1]: b * shape[1] + int(length)])
            else:
                labels.append(targets[start:start + int(length)])
                start += int(length)
    else:
        values, given = _values_of(by_slot.get(2)), _values_of(by_slot.get(3))
        indices = by_slot.get(1) or {}
        pairs = _values_of(indices)
        if values is None or given is None:
            return None
        if pairs is None and indices.get("elided") and indices.get("shape") and len(given):
            # the .ir elides a large constant: a dense layout [[0, 0], [0, 1], ..., [N-1, L-1]] is read as one
            shown, rows = indices.get("values_shown") or [], int(indices["shape"][0])
            per = rows // len(given)
            if per * len(given) == rows and shown[:2] == [0, 0] and shown[-2:] == [len(given) - 1, per - 1]:
                pairs = [v for b in range(len(given)) for j in range(per) for v in (b, j)]
        if pairs is None or len(pairs) != 2 * len(values):
            return None
        labels = [[] for _ in given]
        for (b, _), value in zip(zip(pairs[0::2], pairs[1::2]), values):
            if 0 <= int(b) < len(labels):
                labels[int(b)].append(value)
    out = []
    for b, label in enumerate(labels):
        have = int(given[b]) if given is not None and b < len(given) else steps
        repeats = sum(1 for i in range(1, len(label)) if label[i] == label[i - 1])
        out.append({"sample": b, "length": len(label), "repeats": repeats, "needs": len(label) + repeats,
                    "has": have})
    return out
