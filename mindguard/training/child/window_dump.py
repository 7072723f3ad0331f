"""The locate pass that dumps as it goes (``mindguard hunt --from``): the hunt armed MindSpore's dump of every
iteration, so the failing step is dumped as it runs and no second process has to run it again. The dump of a step
is needed only if that step is the failing one, so :class:`DumpPruner` removes each step's files once the steps
after it began with no failure recorded: the dump on disk stays a few steps' worth, whatever the window's length.

Which files are a step's is told by the time stamp MindSpore writes into every dump file name (epoch µs) against
the steps' start times, not by iteration numbers (steps and iterations can part: several graphs share a counter).
Steps are 1-based global steps. Imports nothing of MindSpore.
"""
from __future__ import annotations

import os
import sys
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Deque, Iterator, Optional

from ...analysis.files import file_timestamp_us
from ...protocol.locate_dump import KEPT_BEHIND
from ..step.events import StepListener

if TYPE_CHECKING:  # pragma: no cover
    from ..step.steps import StepInfo


class DumpPruner(StepListener):
    """Removes the dump files of the steps a locate pass checked clean (module docstring). ``root``: the dump's
    ``path``; ``rank``, ``net_name``: whose files (``<root>/rank_<rank>/<net_name>/<graph>/<iteration>/``)."""

    def __init__(self, root: Path, rank: int, net_name: str):
        self.base = Path(root) / f"rank_{rank}" / net_name
        self.starts: Deque[int] = deque(maxlen=KEPT_BEHIND + 1)   # start times (epoch µs) of the last steps
        self.removed_files = 0
        self.broken: Optional[str] = None   # why pruning stopped (the dump is then left whole)

    def at_step(self, start_us: int, failed: bool) -> None:
        """A step began at ``start_us`` (``failed``: a failure is recorded already -- then nothing is removed):
        remove the files written before the step :data:`KEPT_BEHIND` steps back began. Never raises: a file
        that cannot be removed stops pruning (the dump grows as it would without it)."""
        self.starts.append(start_us)
        if failed or self.broken is not None or len(self.starts) <= KEPT_BEHIND:
            return
        try:
            self._remove_before(self.starts[0])
        except OSError as exc:
            self.broken = f"{type(exc).__name__}: {exc}"
            print(f"mindguard hunt: cannot remove the dump of steps checked clean under {self.base} ({self.broken}); "
                  f"the rest of the window is dumped whole", file=sys.stderr, flush=True)

    def step_begun(self, info: "StepInfo", failed: bool) -> None:
        self.at_step(info.start_us, failed=failed)

    def holds_files_since(self, start_us: Optional[int]) -> bool:
        """Whether the dump holds a file written at or after ``start_us`` (epoch µs: a step's start): that step
        was dumped as it ran. Never raises (``False`` when the dump cannot be read)."""
        if not start_us:
            return False
        try:
            return any((file_timestamp_us(entry.name) or -1) >= start_us
                       for iteration in self._iterations() for entry in os.scandir(iteration.path))
        except OSError:
            return False

    def _iterations(self) -> Iterator["os.DirEntry[str]"]:
        """The dump's ``<graph>/<iteration>`` folders (none before MindSpore made its base)."""
        if not self.base.is_dir():
            return
        for graph in os.scandir(self.base):
            if graph.is_dir(follow_symlinks=False):
                for iteration in os.scandir(graph.path):
                    if iteration.is_dir(follow_symlinks=False):
                        yield iteration

    def _remove_before(self, cutoff_us: int) -> None:
        for iteration in list(self._iterations()):
            left = 0
            for entry in os.scandir(iteration.path):
                stamp = file_timestamp_us(entry.name)
                if stamp is not None and stamp < cutoff_us:
                    os.unlink(entry.path)
                    self.removed_files += 1
                else:
                    left += 1
            if not left:
                os.rmdir(iteration.path)


__all__ = ["DumpPruner", "KEPT_BEHIND"]
