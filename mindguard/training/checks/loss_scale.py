"""Loss scaling judged by facts: when is a streak of loss-scale overflows a collapse? (pure Python, no MindSpore)

A loss-scale cell returns ``(loss, overflow, scale)`` each step. An overflow step skips its update and a dynamic
scaler lowers the scale; a scaler that starts high (the model zoo's ``2**40`` or ``2**32``) skips its first steps
while the scale comes down -- 23-24 steps in a row from ``2**40`` for a small float16 network
(docs/mindspore-facts.md, "guest (issue 50): loss scaling") -- and then trains. That warm-up is healthy, however
long, while the scale keeps coming down. :class:`LossScaleRule` calls a streak of overflows a collapse only on one
of three facts:

* **the scale at its floor**: an overflow step whose scale, and the scale the step before it reported, are both
  ``<= min_loss_scale`` (``nn.DynamicLossScaleUpdateCell`` never goes below 1, the default). A cell may report the
  scale before its update of the step or after it -- the model zoo's CPU cell reports it after (measured, GRAPH
  and PyNative; ``TrainOneStepWithLossScaleCell`` returns the same ``scaling_sens``): the overflow at 2 reports 1.
  The scale a step *used* is either its own report or the report of the step before, so the larger of the two is
  never below it: the rule never stops a step whose scale was above the floor (and is exact for a cell that
  reports the scale after its update; at most one step late for one that reports it before);
* **a scale that does not come down**: ``max_overflow_steps`` overflows in a row, each at a scale no lower than the
  step before it reported (a fixed scale: ``FixedLossScaleUpdateCell``, a constant ``scale_sense``; or a scale
  that cannot be read);
* **a streak too long for a scale coming down**: more than ``max_overflow_steps + 2 * log2(s0 / floor)``
  overflows in a row, ``s0`` the scale before the streak and ``floor = max(min_loss_scale, 1)``. The scale fell by
  less than a factor of ``sqrt(2)`` an overflow on average: a scaler that halves it (``scale_factor=2``,
  MindSpore's default) meets the floor first.

A scale that is not a finite number counts as not read (not coming down).
"""
from __future__ import annotations

import math
from typing import Optional


class LossScaleRule:
    """Feeds on one step after another (:meth:`step`); says when a streak of overflows is a collapse.

    Its state: ``overflows`` -- overflows in a row, up to the last step; ``stalled`` -- of those, the last ones in a
    row whose scale did not come down; ``start_scale`` -- the scale before the streak (``None``: unknown);
    ``last_scale`` -- the scale the last step reported (``None``: unknown).
    """

    def __init__(self, *, max_overflow_steps: int = 20, min_loss_scale: float = 1.0) -> None:
        self.max_overflow_steps = max_overflow_steps
        self.min_loss_scale = min_loss_scale
        self.overflows = 0
        self.stalled = 0
        self.start_scale: Optional[float] = None
        self.last_scale: Optional[float] = None

    def allowance(self) -> float:
        """How many overflows in a row the current streak may hold while its scale comes down."""
        reference = max(self.min_loss_scale, 1.0)
        if self.start_scale is None or self.start_scale <= reference:
            return self.max_overflow_steps
        return self.max_overflow_steps + 2 * math.log2(self.start_scale / reference)

    def step(self, overflow: bool, scale: Optional[float]) -> Optional[str]:
        """One step's ``overflow`` flag and the ``scale`` it reported (``None``: not read). Returns why the streak is
        a collapse, or ``None`` (healthy: no overflow, or an overflow the scaler is still handling)."""
        if scale is not None and not math.isfinite(scale):
            scale = None
        previous, self.last_scale = self.last_scale, scale
        if not overflow:
            self.overflows = self.stalled = 0
            return None
        self.overflows += 1
        if self.overflows == 1:
            self.start_scale = None
        if self.start_scale is None:   # the scale before the streak, or the first one known in it
            known = [value for value in (previous, scale) if value is not None]
            self.start_scale = max(known) if known else None
        coming_down = scale is not None and previous is not None and scale < previous
        self.stalled = 0 if coming_down else self.stalled + 1
        in_a_row = f"{self.overflows} loss-scale overflow(s) in a row"
        if scale is not None and previous is not None and max(scale, previous) <= self.min_loss_scale:
            return (f"loss-scale overflow with the loss scale at its floor ({scale:g}; the step before: {previous:g}; "
                    f"min_loss_scale {self.min_loss_scale:g}): the gradients are non-finite even unscaled "
                    f"({in_a_row})")
        if self.stalled >= self.max_overflow_steps:
            return (f"{self.stalled} consecutive loss-scale overflows with a loss scale that does not come down "
                    f"(max_overflow_steps={self.max_overflow_steps}); loss scale now {_text(scale)}")
        if self.overflows > self.allowance():
            return (f"{in_a_row} while the loss scale fell from {_text(self.start_scale)} to {_text(scale)}: "
                    f"more than max_overflow_steps "
                    f"({self.max_overflow_steps}) + 2*log2 of its way down to {max(self.min_loss_scale, 1.0):g} "
                    f"allow ({math.floor(self.allowance())}) -- it is not coming down fast enough to end them")
        return None


def _text(scale: Optional[float]) -> str:
    return "unknown" if scale is None else f"{scale:g}"
