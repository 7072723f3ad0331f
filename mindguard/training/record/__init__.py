"""The run's record: its fields and first failure (``recorder``), its files (``record_writer``), what an
exception that ended a training call means for it (``classify``), which run wrote it (``provenance``), the loss and
learning rate on the way to a failure (``rate_notes``) and the line printed at a failure (``hunt_line``)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from ..._util.lazy import lazy_names

_NAMES = {
    "Recorder": "recorder", "RecordWriter": "record_writer", "check_replaceable": "record_writer",
    "mindguards_own": "classify", "classify_exception": "classify", "HuntLine": "hunt_line",
    "DivergenceNotes": "rate_notes",
}
__all__ = sorted(_NAMES)
__getattr__ = lazy_names(__name__, _NAMES)

if TYPE_CHECKING:  # pragma: no cover
    from .classify import classify_exception, mindguards_own
    from .hunt_line import HuntLine
    from .rate_notes import DivergenceNotes
    from .record_writer import RecordWriter, check_replaceable
    from .recorder import Recorder
