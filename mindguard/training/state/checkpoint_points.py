"""The training's own checkpoints (``ModelCheckpoint``) as resume points of an always-on keeper
(:class:`~mindguard.training.state.keeper.StateKeeper`): a file written at the end of a step is the state at the
beginning of the next, with the random state captured then (:class:`CheckpointPoint`); :class:`CheckpointPoints`
holds the points a failure may resume from (:func:`~mindguard.training.state.keep_schedule.stale_checkpoints`). Steps
are 1-based, process-wide global steps.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

import numpy as np

from . import rng as _rng
from .keep_schedule import checkpoint_to_check, stale_checkpoints
from ..._util.io import _atomic_file, atomic_write_json, file_sha256
from ...protocol import folder as layout
from ...protocol.kept_state import STATE_SCHEMA
from .state_files import capture_random_state
from .warm_up import warm_up_kept


class CheckpointPoint:
    """A checkpoint the training wrote itself (``ModelCheckpoint``), as the state at the beginning of global step
    ``step``: its Parameters are in the file, the random state was captured at that step's beginning."""

    def __init__(self, step: int, path: str, names: List[str], unrestorable: Sequence[str] = (),
                 warm_up: int = 0) -> None:
        self.step, self.path, self.names = step, path, names
        self.warm_up = warm_up_kept(warm_up, unrestorable)   # (as KeptState's)
        self.rng_arrays, self.rng_meta = capture_random_state(unrestorable)

    def write(self, directory: Path, *, outputs: Any, timing: Dict[str, Any],
              trace: Optional[Dict[int, List[Optional[str]]]] = None) -> Optional[Path]:
        """Write ``directory/state.npz`` (the random state only) and ``state.json`` naming the checkpoint, its
        size and modification time (a file replaced since is refused on load). ``None`` when the file is gone.

        The file is also held by a hard link in ``directory`` (``held``): a ``ModelCheckpoint`` with
        ``keep_checkpoint_max`` removes its older files as it writes new ones -- at the end of the very call a
        failure stops (its final save), and in the hunt's own run of the script -- and the link keeps the bytes
        (no copy) for the state to resume from. Not held when the file system refuses a link (another device)."""
        try:
            stat = os.stat(self.path)
        except OSError:
            return None
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        link = str(directory / layout.HELD_CHECKPOINT)
        held: Optional[str] = link
        try:
            if os.path.lexists(link):   # (a state written again at this step: the newer file)
                os.unlink(link)
            os.link(self.path, link)
        except OSError:
            held = None
        with _atomic_file(layout.state_arrays(directory)) as f:
            np.savez(f, **{_rng.ARRAY_PREFIX + k: a for k, a in self.rng_arrays.items()})
        atomic_write_json(layout.state_meta(directory), {
            "schema": STATE_SCHEMA, "step": self.step, "names": self.names,
            "sha256": file_sha256(layout.state_arrays(directory)),
            "checkpoint": {"path": self.path, "bytes": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                           **({"held": held} if held else {})},
            "outputs": outputs, "bytes": stat.st_size, "rng": self.rng_meta, "warm_up": self.warm_up,
            "trace": {str(k): v for k, v in sorted((trace or {}).items()) if k >= self.step}, **timing})
        return directory


class CheckpointPoints:
    """The checkpoint points held (``points``: global step -> :class:`CheckpointPoint`), and which of them a
    Parameter check was asked to follow. mindguard's own error while noting one stops their use (said once)."""

    def __init__(self) -> None:
        self.points: Dict[int, CheckpointPoint] = {}
        self.asked: Set[int] = set()   # points a Parameter check was asked to follow (to_check)
        self.broken = False

    def to_check(self, step: int) -> bool:
        """Whether the Parameters are to be checked at the end of global step ``step`` for the newest point (once
        per point; :meth:`mindguard.training.state.keeper.StateKeeper.checkpoint_to_check`)."""
        newest = checkpoint_to_check(self.points, step, self.asked)
        if newest is None:
            return False
        self.asked.add(newest)
        return True

    def note(self, step: int, saved: Sequence[str], names: Callable[[], List[str]],
             unrestorable: Callable[[], Sequence[str]], verified_after: Optional[int], warm_up: int = 0) -> bool:
        """``saved`` (files written at the end of the step before) are the resume point of global step ``step``
        (``names()``: the Parameters' names; ``unrestorable()``: the random sources no state holds; ``warm_up``: as
        :class:`~mindguard.training.state.state_writer.KeptState`'s); then the points
        no failure can resume from are dropped (:meth:`drop_old`). Whether a point was added."""
        if self.broken:
            return False
        added = False
        try:
            for path in saved:
                if step in self.points:
                    continue
                self.points[step] = CheckpointPoint(step, path, names(), unrestorable(), warm_up)
                added = True
                self.drop_old(verified_after)
        except Exception as bug:  # noqa: BLE001 - mindguard's own failure never ends the training
            self.broken = True
            print(f"mindguard: the training's checkpoints are not used as resume points ({type(bug).__name__}: "
                  f"{bug}; a mindguard bug): the kept states still are", file=sys.stderr, flush=True)
            return False
        return added

    def drop_old(self, verified_after: Optional[int]) -> None:
        """Forget the points no failure can resume from
        (:func:`~mindguard.training.state.keep_schedule.stale_checkpoints`:
        each holds only the random state of its step)."""
        for old in stale_checkpoints(self.points, verified_after):
            del self.points[old]
