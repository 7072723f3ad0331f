"""Names in messages: two collections keyed by name, compared -- what only one has, and what both have with
different values (why a kept state, a capture or saved parameters do not fit the network at hand) -- a long list
of names shortened for one line (:func:`summarized`), and the names a cell's ``construct`` gives the values it is
called with (:func:`argument_names`)."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Generic, Hashable, List, Mapping, Sequence, TypeVar

K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class NameDifferences(Generic[K]):
    """``only_before``: names only the first collection has (in its order); ``only_after``: only the second has (in
    its order); ``changed``: in both with values that differ (in the first's order). False when all are empty."""

    only_before: List[K]
    only_after: List[K]
    changed: List[K]

    def __bool__(self) -> bool:
        return bool(self.only_before or self.only_after or self.changed)


def compare_by_name(before: Mapping[K, Any], after: Mapping[K, Any]) -> NameDifferences[K]:
    """How ``after`` differs from ``before``, name by name (values compared with ``==``)."""
    return NameDifferences(only_before=[n for n in before if n not in after],
                           only_after=[n for n in after if n not in before],
                           changed=[n for n in before if n in after and before[n] != after[n]])


#: names a message shows of a longer list (the record keeps every one)
SHOWN_NAMES = 5


def summarized(names: Sequence[str], shown: int = SHOWN_NAMES) -> str:
    """``names`` for a one-line message: all of them when they are few, else the first ``shown`` and a count
    (``"a, b, c, d, e and 296 more"``); the whole list stays where the caller keeps it (the failure record)."""
    if len(names) <= shown + 1:
        return ", ".join(names)
    return f"{', '.join(names[:shown])} and {len(names) - shown} more"


def argument_names(cell: Any, count: int) -> List[str]:
    """The names ``cell.construct`` binds ``count`` positional values to (0-based positions): its positional
    parameters after ``self`` in order, then ``<varargs><k>`` for ``*varargs`` (``inputs0``, ``inputs1``, ... as
    MindSpore names the graph inputs of ``construct(self, *inputs)``); ``input<k>`` where neither names one (no
    ``construct``, a signature that cannot be read)."""
    names: List[str] = []
    varargs = None
    try:
        signature = inspect.signature(type(cell).construct)
    except (AttributeError, TypeError, ValueError):
        signature = None
    if signature is not None:
        for param in list(signature.parameters.values())[1:]:
            if param.kind in (param.POSITIONAL_ONLY, param.POSITIONAL_OR_KEYWORD):
                names.append(param.name)
            elif param.kind == param.VAR_POSITIONAL:
                varargs = param.name
                break
    out = names[:count]
    for k in range(count - len(out)):
        out.append(f"{varargs}{k}" if varargs else f"input{len(out)}")
    return out
