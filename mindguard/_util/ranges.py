"""Run-length formatting of integer sets: ``[0, 5, 6, 7, 8]`` -> ``"0|5-8"`` (pure Python, no MindSpore)."""
from __future__ import annotations

from typing import Iterable, List


def format_ranges(values: Iterable[int], separator: str = "|") -> str:
    """The distinct ``values``, ascending, with each run of consecutive ints written ``low-high`` (inclusive).

    ``format_ranges([8, 0, 5, 6, 7])`` -> ``"0|5-8"`` (MindSpore's dump ``iteration`` syntax);
    ``format_ranges([1, 3, 4], ", ")`` -> ``"1, 3-4"``; no values -> ``""``.
    """
    ordered = sorted(set(int(v) for v in values))
    if not ordered:
        return ""
    runs: List[str] = []
    start = prev = ordered[0]
    for v in ordered[1:]:
        if v == prev + 1:
            prev = v
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = v
    runs.append(str(start) if start == prev else f"{start}-{prev}")
    return separator.join(runs)
