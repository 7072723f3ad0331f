"""The run's per-step events (:class:`RunEvents`), in the style of Keras's ``CallbackList``: the run
(:class:`mindguard.training.run.Run`) owns the step count and the first failure, and tells the parts that follow
the training -- the Parameter checks' budget, the dump pruner, the kept state, the hunt's set-up, the dump
iterations, the record -- what happened, each part in the order it subscribed. A part overrides the events it needs
(:class:`StepListener`: every event is a no-op there) and never reaches back into the run for another part.

The events, in the order of a step (steps are 1-based, process-wide global steps):

* ``call_begun(call, network, next_step)`` -- a training call began (``next_step``: its first global step);
* ``step_starting(next_step, failed)`` -- before the step is counted (a verify pass stops once its steps are done);
* ``step_begun(info, failed)`` -- the step is counted (``failed``: a failure is recorded already);
* ``step_outputs(info, outputs)`` -- the step's outputs are known (their structure, the pace);
* ``step_ended(info)`` -- the step's outputs are on the host (``info.end_us`` is set);
* ``iteration_observed(info)`` -- the dump iteration the step ran as was observed (under the hunt's record pass);
* ``params_checked(info, finite, seconds, setup)`` -- the Parameters were checked after ``info``;
* ``step_traced(info, loss, param_sum)`` -- what the step computed (under the hunt);
* ``timing_paused()`` -- an epoch or a call ended: time until the next step is no step's;
* ``training_ended(last)`` -- no step is running and none failed (``last``: the last step, ``None`` before any).

Pure Python: no MindSpore, no I/O of its own.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, List, Optional, Sequence

if TYPE_CHECKING:  # pragma: no cover
    from .steps import StepInfo, TrainingCall


class StepListener:
    """A part of the run that follows its steps: it overrides the events it needs; the others do nothing."""

    def call_begun(self, call: "TrainingCall", network: Any, next_step: int) -> None:
        """A training call began; its first step will be global step ``next_step``."""

    def step_starting(self, next_step: int, failed: bool) -> None:
        """Global step ``next_step`` is about to be counted."""

    def step_begun(self, info: "StepInfo", failed: bool) -> None:
        """Step ``info`` is counted and begins (``failed``: the run's first failure is recorded already)."""

    def step_outputs(self, info: "StepInfo", outputs: Any) -> None:
        """Step ``info`` ran and returned ``outputs``."""

    def step_ended(self, info: "StepInfo") -> None:
        """Step ``info`` is closed: its outputs are on the host."""

    def iteration_observed(self, info: "StepInfo") -> None:
        """The dump iteration step ``info`` ran as was observed."""

    def params_checked(self, info: "StepInfo", finite: bool, seconds: float, setup: float) -> None:
        """The Parameters were checked after step ``info`` (``seconds`` the check took, ``setup`` its compile)."""

    def step_traced(self, info: "StepInfo", loss: Optional[float], param_sum: Optional[float]) -> None:
        """What step ``info`` computed: its loss and the sum of its Parameters (under the hunt)."""

    def timing_paused(self) -> None:
        """Until the next step, time is no step's (an evaluation, a checkpoint, another model's training)."""

    def training_ended(self, last: Optional["StepInfo"]) -> None:
        """No step is running and none failed; ``last`` is the last step (``None``: no step yet)."""


class RunEvents:
    """The run's listeners, in the order they subscribed, and the dispatch of each event to each of them."""

    def __init__(self, listeners: Sequence[Optional[StepListener]] = ()) -> None:
        self.listeners: List[StepListener] = [listener for listener in listeners if listener is not None]

    def subscribe(self, listener: StepListener) -> None:
        self.listeners.append(listener)

    def call_begun(self, call: "TrainingCall", network: Any, next_step: int) -> None:
        for listener in self.listeners:
            listener.call_begun(call, network, next_step)

    def step_starting(self, next_step: int, failed: bool) -> None:
        for listener in self.listeners:
            listener.step_starting(next_step, failed)

    def step_begun(self, info: "StepInfo", failed: bool) -> None:
        for listener in self.listeners:
            listener.step_begun(info, failed)

    def step_outputs(self, info: "StepInfo", outputs: Any) -> None:
        for listener in self.listeners:
            listener.step_outputs(info, outputs)

    def step_ended(self, info: "StepInfo") -> None:
        for listener in self.listeners:
            listener.step_ended(info)

    def iteration_observed(self, info: "StepInfo") -> None:
        for listener in self.listeners:
            listener.iteration_observed(info)

    def params_checked(self, info: "StepInfo", finite: bool, seconds: float, setup: float = 0.0) -> None:
        for listener in self.listeners:
            listener.params_checked(info, finite, seconds, setup)

    def step_traced(self, info: "StepInfo", loss: Optional[float], param_sum: Optional[float]) -> None:
        for listener in self.listeners:
            listener.step_traced(info, loss, param_sum)

    def timing_paused(self) -> None:
        for listener in self.listeners:
            listener.timing_paused()

    def training_ended(self, last: Optional["StepInfo"]) -> None:
        for listener in self.listeners:
            listener.training_ended(last)
