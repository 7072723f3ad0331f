"""When an always-on Guard checks the Parameters: a measured time budget, not every step.

The loss is checked at every step (MindSpore already brought it to the host for the callbacks). A check of every
Parameter costs more than its own time: on CPU the reduction moves the Parameters' memory between cores and the
*next* step runs slower (docs/mindspore-facts.md). :class:`CheckBudget` measures that whole cost and spends at
most ``fraction`` of the training time on it, so the check interval adapts to the model and the machine:

* a *period* is the wall time from one step's end hook to the next one's (the step, the data, every callback);
* the cost of a check is the mean period that contains one minus the mean period that does not (so it includes
  the check and what it does to the next step), and never less than the check's own measured time;
* credit accrues at ``fraction`` of every period; a check is due when the credit covers its cost, or when
  ``max_interval`` steps passed without one (the bound on how wide a window of steps the record can leave).

Forced checks (the training's end, an exception, a non-finite loss) are charged too; an epoch's end checks only
while the credit is not in debt. The time between an epoch's (or a training call's) last step and the next step
is no period (:meth:`CheckBudget.pause`): evaluation and checkpoints there say nothing of a step. Pure Python, no MindSpore: the decisions are tested without it.
Steps are 1-based global steps (:mod:`mindguard.run`).
"""
from __future__ import annotations

from typing import Optional

#: The share of training time the Parameter checks may take (the check and its effect on the next step).
CHECK_FRACTION = 0.01
#: At most this many steps between two checks, whatever the budget says.
MAX_INTERVAL = 1000
#: Steps checked at the start (after the compiling first step) to measure what a check costs.
_PROBE_CHECKS = 3
#: Weight of a new sample in the running means of the periods.
_SMOOTHING = 0.1


class CheckBudget:
    """Decide, step by step, whether to check the Parameters (see the module docstring).

    Use: at each step's end call :meth:`end_period` (the time is taken here), then :meth:`due`; after a check,
    :meth:`charge` with its measured seconds. ``clock`` is injectable for tests (``time.perf_counter``).
    """

    def __init__(self, fraction: float = CHECK_FRACTION, max_interval: int = MAX_INTERVAL, clock=None):
        import time

        from .errors import ArgumentError

        if not 0 < fraction <= 1:
            raise ArgumentError(f"CheckBudget(fraction={fraction!r}): the share of the training time must be in (0, 1], "
                                f"e.g. 0.01 for 1 %")
        if max_interval < 1:
            raise ArgumentError(f"CheckBudget(max_interval={max_interval!r}): must be at least 1 step")

        self.fraction = fraction
        self.max_interval = max_interval
        self._clock = clock or time.perf_counter
        self.credit = 0.0                    # seconds of checking the budget still allows
        self.checks = 0                      # checks charged so far
        self.steps = 0                       # periods seen
        self.last_checked: Optional[int] = None   # the global step of the last check
        self.plain: Optional[float] = None   # mean period without a check (s)
        self.checked: Optional[float] = None  # mean period that holds a check (s)
        self.own: Optional[float] = None     # mean time of the check itself (s)
        self._mark: Optional[float] = None   # clock at the last end_period
        self._period_checked = False         # the period now running holds a check
        self._closed_checked = False         # the period end_period closed last held one

    # -- measurements ----------------------------------------------------------------------------------
    def end_period(self) -> None:
        """A step's end hook began: close the period since the previous one."""
        now = self._clock()
        if self._mark is not None:
            period = now - self._mark
            self.steps += 1
            if self._period_checked:
                self.checked = _mean(self.checked, period)
            else:
                self.plain = _mean(self.plain, period)
            self.credit += self.fraction * period
        self._mark = now
        self._closed_checked, self._period_checked = self._period_checked, False

    def pause(self) -> None:
        """Training stops being timed until the next step's end (an epoch or a training call ended: what runs until
        the next step -- evaluation, a checkpoint, another call -- is not a step's period)."""
        self._mark = None
        self._period_checked = False

    def charge(self, step: int, seconds: float) -> None:
        """A check of global step ``step`` took ``seconds`` (its own time; the effect on the next step is measured
        by the period it falls in)."""
        self.checks += 1
        self.last_checked = step
        if self.checks > 1:   # the first check may compile its graph: its time says nothing of the next ones
            self.own = _mean(self.own, max(seconds, 0.0))
        self._period_checked = True
        self.credit -= self.cost()

    # -- decisions -------------------------------------------------------------------------------------
    def cost(self) -> float:
        """The estimated seconds one check costs the training (its own time, and what it adds to the period)."""
        own = self.own or 0.0
        if self.checked is None or self.plain is None:
            return own
        return max(self.checked - self.plain, own)

    def due(self, step: int) -> bool:
        """Whether to check the Parameters at the end of global step ``step``."""
        if self.checks < _PROBE_CHECKS or self.plain is None:
            # step 1 compiles: its period says nothing; then every other step, so that periods with a check and
            # periods without one are both measured
            return step > 1 and not self._closed_checked
        if self.last_checked is not None and step - self.last_checked >= self.max_interval:
            return True
        if self.checked is None:
            return True
        return self.credit >= self.cost()

    def epoch_end_due(self) -> bool:
        """Whether an epoch's end checks too: only while the budget is not in debt."""
        return self.credit >= 0

    def interval(self) -> Optional[float]:
        """The steps between two budgeted checks at the current estimates (``None`` before they exist)."""
        if self.plain is None or self.plain <= 0:
            return None
        return max(1.0, min(float(self.max_interval), self.cost() / (self.fraction * self.plain)))

    def describe(self) -> dict:
        """The budget's state for the record (milliseconds, steps)."""
        interval = self.interval()
        return {"fraction": self.fraction, "checks": self.checks,
                "check_ms": None if self.own is None else round(self.cost() * 1e3, 3),
                "step_ms": None if self.plain is None else round(self.plain * 1e3, 3),
                "every_steps": None if interval is None else round(interval, 1)}


def _mean(current: Optional[float], sample: float) -> float:
    """A running mean; one sample counts at most 4x the mean (a compile or a pause moves it, not throws it)."""
    if current is None:
        return sample
    return current + _SMOOTHING * (min(sample, 4 * current) - current)
