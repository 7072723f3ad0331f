"""The random sources of a training step that no kept state can hold (:func:`mindguard.training.state.rng.
unrestorable_sources`), found once per set of cells and as graphs compile them: a resumed pass cannot draw them
again, so the keeper names them (stderr, on disk) and tells the record (:class:`RandomSources`).
"""
from __future__ import annotations

import sys
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from . import rng as _rng
from .state_files import _mindspore_version


class RandomSources:
    """The unrestorable random sources found so far, per set of cells (by identity)."""

    def __init__(self) -> None:
        self.found: Dict[Tuple[int, ...], List[str]] = {}

    def of(self, cells: Sequence[Any], *, say: bool,
           tell: Optional[Callable[[List[str]], None]] = None) -> List[str]:
        """:func:`mindguard.training.state.rng.unrestorable_sources` of ``cells`` (found once), with the random
        functions compiled into a graph since the last look (the first step compiles). Each newly found list is said on
        stderr (``say``) and told to ``tell``."""
        key = tuple(id(c) for c in cells)
        if key not in self.found:
            try:
                found = _rng.unrestorable_sources(cells)
            except Exception:  # noqa: BLE001 - a cell tree mindguard cannot walk: nothing named, the trace still tells
                found = []
            self.found[key] = found
            note = _rng.describe_unrestorable(found, _mindspore_version()) if found else None
            if note and say:
                print(f"mindguard: {note}", file=sys.stderr, flush=True)
            if found and tell is not None:
                tell(found)
        compiled = [s for s in _rng.compiled_random_functions() if s not in self.found[key]]
        if compiled:
            self.found[key] = self.found[key] + compiled
            note = _rng.describe_unrestorable(compiled, _mindspore_version())
            if say:
                print(f"mindguard: {note}", file=sys.stderr, flush=True)
            if tell is not None:
                tell(compiled)
        return self.found[key]
