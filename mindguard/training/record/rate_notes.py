"""What the training did on its way to a failure, for the record's divergence fields
(:mod:`mindguard.protocol.divergence` reads them): the loss of every step
(:class:`~mindguard.protocol.divergence.LossHistory`) and the learning rate -- a scalar rate's value whenever it
changed (a callback's schedule), or the per-step schedule array the optimizer indexes, read once at the failure.

Cost: one float appended per step; a scalar learning-rate Parameter read per step (``item()``, ~1 µs); the schedule
array read once, at the failure. Imports MindSpore only through the Parameters it is given.
"""
from __future__ import annotations

import math
import re
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from ...protocol.divergence import LossHistory, summarize

#: A Parameter holding a learning rate (the optimizer's ``learning_rate``; a script's own ``lr``).
LEARNING_RATE = re.compile(r"(^|[._])(learning_rate|lr)$", re.I)


def rate_parameter(params: Sequence[Any]) -> Optional[Any]:
    """The learning-rate Parameter among ``params`` (the first by name), or ``None``."""
    return next((p for p in params if LEARNING_RATE.search(str(getattr(p, "name", "")))), None)


class DivergenceNotes:
    """The losses and learning rate of a run's steps (see the module docstring)."""

    def __init__(self) -> None:
        self.history = LossHistory()
        self.changes: List[List[float]] = []   # [[step, value], ...] of a scalar learning rate, when it changed
        self._rate: Any = None
        self._rate_key: Any = None

    def note(self, step: int, loss: Optional[float], params: Sequence[Any], key: Any) -> None:
        """Step ``step`` ended with ``loss``; ``params``: its call's state Parameters (``key`` names the call)."""
        self.history.note(step, loss)
        try:
            if key != self._rate_key:
                self._rate_key, self._rate = key, rate_parameter(params)
            rate = self._rate
            if rate is not None and int(rate.size) == 1:
                value = float(rate.item())
                if not self.changes or self.changes[-1][1] != value:
                    self.changes.append([step, value])
        except Exception:  # noqa: BLE001 - a Parameter mindguard cannot read: the losses still tell
            self._rate = None

    def fields(self, failed_step: Optional[int], params: Sequence[Any]) -> Dict[str, Any]:
        """The record's ``loss_history``, ``learning_rate`` and ``divergence`` entries at a failure at
        ``failed_step`` (``params``: the failing call's state Parameters); empty before any step."""
        if not self.history.steps:
            return {}
        rate: Optional[Dict[str, Any]] = None
        try:
            param = rate_parameter(params)
            if param is not None and int(param.size) > 1:
                values = np.asarray(param.asnumpy(), dtype=np.float64).reshape(-1)
                step_param = next((p for p in params if str(getattr(p, "name", "")) == "global_step"), None)
                offset = 0
                if step_param is not None and failed_step is not None and int(step_param.size) == 1:
                    offset = int(step_param.item()) - failed_step   # the optimizer's count after the failing step
                rate = {"name": param.name, "schedule": [float(v) for v in values], "offset": offset}
            elif param is not None and self.changes:
                rate = {"name": param.name, "changes": [list(c) for c in self.changes]}
        except Exception:  # noqa: BLE001 - as above
            rate = None
        out: Dict[str, Any] = {"loss_history": self.history.to_dict()}
        if rate is not None:
            out["learning_rate"] = rate
        try:
            out["divergence"] = summarize(self.history.as_losses(), rate)
        except (ValueError, ArithmeticError):   # never keeps the failure from being recorded
            pass
        return out


def finite(value: Optional[float]) -> bool:
    return value is not None and math.isfinite(value)
