"""What the run knows of its Parameter checks (:class:`ParamChecks`): an always-on Guard's time budget for them
(:class:`mindguard.training.checks.budget.CheckBudget`), the last step they passed, and so the window of steps a failure
seen at a check lies in.

Steps are 1-based, process-wide global steps. Imports nothing of MindSpore.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, Optional

from .budget import CHECK_FRACTION, CheckBudget
from ..step.events import StepListener
from ..step.steps import StepInfo

if TYPE_CHECKING:  # pragma: no cover
    from ..state.keeper import StateKeeper

#: the failure kinds whose cause can precede the step they were seen at (a Parameter check's window)
NONFINITE_KINDS = ("nonfinite_params", "nonfinite_loss", "nonfinite_grads", "loss_scale_collapse")


class ParamChecks(StepListener):
    """The Parameter checks of the run: every step (``budget`` None: under the hunt, or ``check_every_step``), or
    on an always-on Guard's budget (:meth:`use_budget`), with the on-disk ``keeper`` that may want a checked step.
    A listener of the run's events: ``params_checked``, ``timing_paused``."""

    def __init__(self) -> None:
        self.budget: Optional[CheckBudget] = None
        self.finite_after: Optional[int] = None    # the last global step whose Parameter check passed
        self._checked_step: Optional[int] = None   # the global step whose Parameters were checked last
        self._period_step: Optional[int] = None    # the step the budget's period was closed at
        self.wish = False   # several ranks: this rank's budget wanted a check at the step's end (rank 0's decides)
        self.keeper: Optional["StateKeeper"] = None   # an always-on Guard's on-disk keeper (Run.watch_on_budget)

    def use_budget(self, fraction: Optional[float] = None) -> None:
        """Check on a time budget of ``fraction`` of the step time (default :data:`CHECK_FRACTION`). Idempotent."""
        if self.budget is None:
            self.budget = CheckBudget(CHECK_FRACTION if fraction is None else fraction)

    def pause(self) -> None:
        """Until the next step, time is not a step's period for the budget."""
        if self.budget is not None:
            self.budget.pause()

    def due(self, info: StepInfo) -> bool:
        """Whether the Parameters are checked at the end of step ``info`` (always, but on a budget; and when the
        on-disk ``keeper`` wants a checked step to keep the next one from; several ranks: at the steps every rank
        agreed on, :mod:`mindguard.training.state.agreed_keeps`; and once after each of the training's own checkpoints,
        :meth:`~mindguard.training.state.keeper.StateKeeper.checkpoint_to_check`). Called once a step, at its end."""
        budget, keeper = self.budget, self.keeper
        if budget is None:
            return True
        if self._period_step != info.global_step:
            budget.end_period()
            self._period_step = info.global_step
        if keeper is not None and keeper.agreed is not None:   # several ranks check at the steps rank 0 asked for
            self.wish = budget.due(info.global_step)
            return keeper.agreed.check_due(info.global_step)
        wants_keep = keeper is not None and keeper.on_disk and keeper.due(info.global_step + 1)
        follows_checkpoint = keeper is not None and keeper.on_disk and keeper.checkpoint_to_check(info.global_step)
        return wants_keep or follows_checkpoint or budget.due(info.global_step)

    def note_checked(self, info: StepInfo, finite: bool, seconds: float, setup: float = 0.0) -> None:
        """The Parameters were checked after step ``info`` (``finite`` or not), in ``seconds``, of which ``setup``
        compiled the check (charged to the budget as a one-time cost)."""
        if self.budget is not None and self._checked_step != info.global_step:
            self.budget.charge(info.global_step, seconds, setup)
        self._checked_step = info.global_step
        if finite and (self.finite_after is None or info.global_step > self.finite_after):
            self.finite_after = info.global_step

    # -- the run's events -------------------------------------------------------------------------------------
    def params_checked(self, info: StepInfo, finite: bool, seconds: float, setup: float) -> None:
        self.note_checked(info, finite, seconds, setup)

    def timing_paused(self) -> None:
        self.pause()

    def checked_at(self, info: Optional[StepInfo]) -> bool:
        """True when the Parameters were checked after step ``info``."""
        return info is not None and self._checked_step == info.global_step

    def window_fields(self, info: Optional[StepInfo], kind: str) -> Dict[str, Any]:
        """What an always-on Guard knows of a failure at ``info``: where the Parameters were last seen finite, the
        window of steps the failing one lies in (when wider than one)."""
        if self.budget is None or info is None:
            return {}
        out: Dict[str, Any] = {"params_finite_after": self.finite_after, "param_checks": self.budget.describe()}
        step = info.global_step
        # non-finite Parameters are seen only at a check: the step that made them so is any since the last passing
        # check (a finite check at the failing step itself makes the step exact: Inf/NaN stays)
        first = (self.finite_after or 0) + 1
        if kind in NONFINITE_KINDS and first < step and self.finite_after != step:
            out["failure_window"] = [first, step]
        return out
