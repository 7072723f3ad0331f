"""The answer of an eager examination of one step (:class:`ReplayReport`): a replay of a captured step
(:func:`mindguard.training.examine.replay.replay`) or the step recorded in place
(:class:`mindguard.training.examine.in_place.InPlaceRecording`)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import numpy as np

from ...report.model import Finding
from ...report.render import render_replay

REPORT_SCHEMA = 1


@dataclass
class ReplayReport:
    """What :func:`replay` found. ``first`` is ``None`` when every value of the step stayed finite.

    ``first``: the origin as a :class:`~mindguard.report.model.Finding` (a dict is converted).
    ``nonfinite_inputs``: batch inputs (``"inputs<i>"``, 0-based) and parameters already non-finite at the start
    of the step, like the dump analysis's (``name``, ``source`` = ``"batch"`` | ``"parameter"``, statistics).
    ``parameters_nonfinite_after_update``: the parameters (network and optimizer state) the update made non-finite.
    """

    iteration: Optional[int]
    first: Optional[Finding] = None
    parameters_nonfinite_after_update: List[str] = field(default_factory=list)
    loss: Optional[float] = None
    capture: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    nonfinite_inputs: List[Dict[str, Any]] = field(default_factory=list)
    ops_recorded: int = 0
    data_flow: Optional[Dict[str, Any]] = None   # the recorded ops around ``first`` (schema: analysis/flow.py)
    error: Optional[str] = None   # mindguard's own failure while recording or analysing: the report is not an answer

    def __post_init__(self) -> None:
        if isinstance(self.first, dict):
            self.first = Finding.from_dict(self.first)

    def to_dict(self) -> Dict[str, Any]:
        """Schema 1 (design "Report schemas"): ``first`` is the Finding's dict; plus ``loss``, ``capture``,
        ``warnings`` and the additive ``nonfinite_inputs``, ``ops_recorded`` and ``data_flow`` (when drawn)."""
        return {"schema": REPORT_SCHEMA, "iteration": self.iteration,
                "first": self.first.to_dict() if self.first is not None else None,
                "parameters_nonfinite_after_update": list(self.parameters_nonfinite_after_update),
                "loss": self.loss, "capture": self.capture, "warnings": list(self.warnings),
                "nonfinite_inputs": list(self.nonfinite_inputs), "ops_recorded": self.ops_recorded,
                **({"data_flow": self.data_flow} if self.data_flow is not None else {}),
                **({"error": self.error} if self.error else {})}

    @property
    def healthy(self) -> bool:
        """True when nothing in the replayed step (loss, ops, gradients, update) was non-finite."""
        loss_finite = self.loss is None or bool(np.isfinite(self.loss))
        return self.first is None and not self.parameters_nonfinite_after_update and loss_finite

    def __str__(self) -> str:
        return render_replay(self)
