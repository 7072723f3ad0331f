"""Step counting: where the run is -- one training call (``steps.TrainingCall``) and one step of it
(``steps.StepInfo``), 1-based global steps over the whole process -- which dump iteration each step ran as
(``observe``), and the per-step events the run dispatches to its parts (``events``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..._util.lazy import lazy_names

_NAMES = {
    "StepInfo": "steps", "TrainingCall": "steps", "now_us": "steps",
    "IterationObserver": "observe", "Iterations": "observe",
    "RunEvents": "events", "StepListener": "events",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:  # pragma: no cover
    from .events import RunEvents, StepListener
    from .observe import IterationObserver, Iterations
    from .steps import StepInfo, TrainingCall, now_us
