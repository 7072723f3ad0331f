"""The kept training state: what the run does with it (``run_state.RunState``); keeping it (``keeper``, its pure
rules ``keep_schedule``, ``state_writer``, ``checkpoint_points``, ``random_sources``, ``agreed_keeps`` across ranks);
its files (``state_files``, ``state_folder``); resuming from it (``resumer``, ``resume``, ``dataset_skip``); the
random state (``rng``); the training's own checkpoints at a failure (``user_checkpoints``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..._util.lazy import lazy_names

_NAMES = {
    "RunState": "run_state", "FAST_FORWARD_MIN_STEPS": "run_state", "StateKeeper": "keeper",
    "KeepSchedule": "keep_schedule", "Resumer": "resumer", "KeptState": "state_writer",
    "CheckpointPoint": "checkpoint_points", "AgreedKeeps": "agreed_keeps",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:  # pragma: no cover
    from .agreed_keeps import AgreedKeeps
    from .checkpoint_points import CheckpointPoint
    from .keep_schedule import KeepSchedule
    from .keeper import StateKeeper
    from .resumer import Resumer
    from .run_state import FAST_FORWARD_MIN_STEPS, RunState
    from .state_writer import KeptState
