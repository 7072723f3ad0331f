"""When an always-on Guard checks the Parameters: a measured time budget, not every step.

The loss is checked at every step (MindSpore already brought it to the host for the callbacks). A check of every
Parameter costs more than its own time: on CPU the reduction moves the Parameters' memory between cores and the
*next* step runs slower (docs/mindspore-facts.md). :class:`CheckBudget` measures that whole cost and spends at
most ``fraction`` of the training time on it, so the check interval adapts to the model and the machine:

* a *period* is the wall time from one step's end hook to the next one's (the step, the data, every callback);
* the cost of a check is the median recent period that contains one minus the median recent period that does
  not (so it includes the check and what it does to the next step), and never less than the check's own measured
  time; a period in which the training state was kept is no sample;
* credit accrues at ``fraction`` of every period; a check is due when the credit covers its cost, or when
  ``max_interval`` steps passed without one (the bound on how wide a window of steps the record can leave).

A check's one-time setup (compiling its graphs: seconds at 500 Parameters, more at 5,000) is a debt when it happens
(:meth:`CheckBudget.charge` ``setup=``): after the probe checks, no check is due (but every ``max_interval`` steps)
until the training has paid it at ``fraction``; it is no sample of what a check costs.

Forced checks (the training's end, an exception, a non-finite loss) are charged too; an epoch's end checks only
while the credit is not in debt. The time between an epoch's (or a training call's) last step and the next step
is no period (:meth:`CheckBudget.pause`): evaluation and checkpoints there say nothing of a step. Pure Python, no
MindSpore: the decisions are tested without it. Steps are 1-based global steps (:mod:`mindguard.training.run`).
"""
from __future__ import annotations

from typing import Optional

#: The share of training time the Parameter checks may take (the check and its effect on the next step).
CHECK_FRACTION = 0.005
#: At most this many steps between two checks, whatever the budget says.
MAX_INTERVAL = 1000
#: Steps checked at the start (after the compiling first step) to measure what a check costs.
_PROBE_CHECKS = 3
#: How many recent samples the estimates are the median of (robust to a compile, a pause, a checkpoint).
_WINDOW = 15


class CheckBudget:
    """Decide, step by step, whether to check the Parameters (see the module docstring).

    Use: at each step's end call :meth:`end_period` (the time is taken here), then :meth:`due`; after a check,
    :meth:`charge` with its measured seconds. ``clock`` is injectable for tests (``time.perf_counter``).
    """

    def __init__(self, fraction: float = CHECK_FRACTION, max_interval: int = MAX_INTERVAL, clock=None):
        import time

        from ...errors import ArgumentError

        if not 0 < fraction <= 1:
            raise ArgumentError(f"CheckBudget(fraction={fraction!r}): the share of the training time must be in (0, "
                                f"1], "
                                f"e.g. 0.01 for 1 %")
        if max_interval < 1:
            raise ArgumentError(f"CheckBudget(max_interval={max_interval!r}): must be at least 1 step")

        self.fraction = fraction
        self.max_interval = max_interval
        self._clock = clock or time.perf_counter
        self.credit = 0.0                    # seconds of checking the budget still allows
        self.checks = 0                      # checks charged so far
        self.spent = 0.0                     # their own seconds, in all
        self.setup = 0.0                     # seconds spent compiling checks, in all
        self.setup_debt = 0.0                # of which the training has not paid yet (the credit pays it first)
        self.steps = 0                       # periods seen
        self.last_checked: Optional[int] = None   # the global step of the last check
        self._plain = _Recent()              # periods without a check (s)
        self._checked = _Recent()            # periods that hold a check (s)
        self._own = _Recent()                # the checks' own times (s)
        self._mark: Optional[float] = None   # clock at the last end_period
        self._period_checked = False         # the period now running holds a check
        self._period_discarded = False       # the period now running is no sample (the training state was kept)
        self._closed_checked = False         # the period end_period closed last held one

    @property
    def plain(self) -> Optional[float]:
        """The median recent period without a check (s)."""
        return self._plain.median()

    @property
    def checked(self) -> Optional[float]:
        """The median recent period that holds a check (s)."""
        return self._checked.median()

    @property
    def own(self) -> Optional[float]:
        """The median recent time of a check itself (s)."""
        return self._own.median()

    # -- measurements ----------------------------------------------------------------------------------
    def end_period(self) -> None:
        """A step's end hook began: close the period since the previous one."""
        now = self._clock()
        if self._mark is not None:
            period = now - self._mark
            self.steps += 1
            if not self._period_discarded:
                (self._checked if self._period_checked else self._plain).add(period)
            self.credit += self.fraction * period
            if self.setup_debt > 0 and self.credit > 0:
                paid = min(self.credit, self.setup_debt)
                self.credit -= paid
                self.setup_debt -= paid
        self._mark = now
        self._closed_checked, self._period_checked, self._period_discarded = self._period_checked, False, False

    def discard_period(self) -> None:
        """The period now running holds other work (the training state being kept, on its own budget): it is no
        sample of a step with or without a check."""
        self._period_discarded = True

    def pause(self) -> None:
        """Training stops being timed until the next step's end (an epoch or a training call ended: what runs until
        the next step -- evaluation, a checkpoint, another call -- is not a step's period)."""
        self._mark = None
        self._period_checked = False

    def charge(self, step: int, seconds: float, setup: float = 0.0) -> None:
        """A check of global step ``step`` took ``seconds`` (its own time; the effect on the next step is measured
        by the period it falls in), of which ``setup`` seconds compiled it (a one-time cost: owed to the credit,
        no sample of a check's time)."""
        setup = min(max(setup, 0.0), max(seconds, 0.0))
        seconds -= setup
        self.setup += setup
        self.setup_debt += setup
        self.checks += 1
        self.spent += max(seconds, 0.0)
        self.last_checked = step
        if self.checks > 1 or setup:   # a first check that compiled without saying so says nothing of the next ones
            self._own.add(max(seconds, 0.0))
        self._period_checked = True
        if self.checks > _PROBE_CHECKS:   # the probe measures what a check costs: it is a fixed start-up cost
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
        if self.setup_debt > 0 and self.checks >= _PROBE_CHECKS:   # a compile not yet paid for at ``fraction``
            return self.last_checked is not None and step - self.last_checked >= self.max_interval
        if self.checks < _PROBE_CHECKS or self.plain is None:
            # step 1 compiles: its period says nothing; then every other step, so that periods with a check and
            # periods without one are both measured
            return step > 1 and not self._closed_checked
        if self.last_checked is not None and step - self.last_checked >= self.max_interval:
            return True
        if self.checked is None:
            return True
        cost = self.cost()
        self.credit = max(self.credit, -2 * cost)   # a debt run up while the estimate was off is not owed forever
        return self.credit >= cost

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
        return {"fraction": self.fraction, "checks": self.checks, "setup_ms": round(self.setup * 1e3, 3),
                "setup_debt_ms": round(self.setup_debt * 1e3, 3),
                "check_ms": None if self.own is None else round(self.cost() * 1e3, 3),
                "step_ms": None if self.plain is None else round(self.plain * 1e3, 3),
                "every_steps": None if interval is None else round(interval, 1)}


class _Recent:
    """The last :data:`_WINDOW` samples; their median (kept up to date on :meth:`add`: it is read several times a
    step, a sample is added once)."""

    __slots__ = ("samples", "_median")

    def __init__(self):
        self.samples: list = []
        self._median: Optional[float] = None

    def add(self, value: float) -> None:
        self.samples.append(value)
        if len(self.samples) > _WINDOW:
            del self.samples[0]
        ordered = sorted(self.samples)
        middle = len(ordered) // 2
        self._median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2

    def median(self) -> Optional[float]:
        return self._median
