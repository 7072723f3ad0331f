"""Where the run is: one training call of the process (:class:`TrainingCall`) and one step of it (:class:`StepInfo`).

Steps are counted by :class:`mindguard.training.run.Run`: ``global_step`` is 1-based over the whole process (every
training call, every train network, every ``mindguard.watch`` step); ``epoch`` and ``step_in_epoch`` are 1-based as
MindSpore printed them in their call; dump iterations are MindSpore's, 0-based. Imports nothing of MindSpore.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..state.state_files import small_parameters, state_parameters


@dataclass
class TrainingCall:
    """One training call of the process: a ``Model.train``/``fit`` call, or a ``mindguard.watch`` loop.

    ``index`` is 1-based over the process; ``network`` the train network's class name; ``kind`` ``"train"``
    or ``"watch"``; ``first_step`` the global step of its first step (None before it). ``key`` identifies
    the call (MindSpore's callback-parameter object of that call, or the watch wrapper).
    """

    index: int
    network: str
    kind: str
    key: Any = field(repr=False, default=None)
    network_id: int = 0
    first_step: Optional[int] = None
    last_cur_step: int = 0
    steps: int = 0
    examine: Optional[str] = None
    sink: Optional[bool] = None   # Model.train's dataset_sink_mode (None: a watch loop)
    train_graph: Optional[int] = None          # the kernel graph its steps run in, as first observed
    last_observed: Optional[Tuple[int, int]] = None   # (global step, dump iteration) last observed in it
    state_cells: Tuple[Any, ...] = field(repr=False, default=())   # whose Parameters are the training's state
    fast_forwarded: Optional[int] = None   # a resumed pass reset its dataset past this many steps (0: tried, no)
    data_steps: Optional[int] = None       # batches its dataset holds (epochs x steps per epoch), once fast-forwarded
    _state_params: Optional[List[Any]] = field(repr=False, default=None)
    _small_params: Optional[List[Any]] = field(repr=False, default=None)


    def describe(self) -> Dict[str, Any]:
        return {"index": self.index, "network": self.network, "kind": self.kind}

    def state_params(self) -> List[Any]:
        """The training's state: every Parameter of :attr:`state_cells` (found once per call)."""
        if self._state_params is None:
            self._state_params = state_parameters(*self.state_cells)
        return self._state_params

    def small_params(self) -> List[Any]:
        """Those of :meth:`state_params` small enough to trace at every step
        (:func:`mindguard.training.state.state_files.small_parameters`)."""
        if self._small_params is None:
            self._small_params = small_parameters(self.state_params())
        return self._small_params


@dataclass
class StepInfo:
    """Where the current (or last) step is. ``global_step`` 1-based over the process; ``epoch`` and
    ``step_in_epoch`` 1-based as MindSpore printed them in its call; ``dump_iteration`` 0-based;
    ``start_us``/``end_us`` wall-clock microseconds (the clock of the dump's file names)."""

    global_step: int
    call: TrainingCall
    epoch: Optional[int] = None
    step_in_epoch: Optional[int] = None
    steps_per_epoch: Optional[int] = None
    iteration_range: Optional[List[int]] = None
    dump_iteration: Optional[int] = None
    graph: Optional[int] = None
    dump_graphs: Dict[int, int] = field(default_factory=dict)
    iteration_observed: bool = False
    start_us: int = 0
    end_us: Optional[int] = None
    skipped: bool = False   # a resumed pass skipped this step's training call (mindguard.training.state.resume)
    scalars: List[str] = field(default_factory=list, repr=False)   # the small Parameters before the step (hunt)

    def fields(self) -> Dict[str, Any]:
        """The record fields of this position."""
        examine: Dict[str, Any] = {"examine": self.call.examine} if self.call.examine else {}
        if self.call.sink is not None:
            examine["dataset_sink_mode"] = self.call.sink
        step = self.step_fields()
        return {**examine, "global_step": step.pop("global_step"), "call": self.call.describe(), **step}

    def step_fields(self) -> Dict[str, Any]:
        """The record fields that change from step to step (those of :meth:`fields` but the call's)."""
        return {"global_step": self.global_step, "epoch": self.epoch,
                "step_in_epoch": self.step_in_epoch, "steps_per_epoch": self.steps_per_epoch,
                "iteration_range": self.iteration_range, "dump_iteration": self.dump_iteration,
                "graph": self.graph, "dump_graphs": {str(g): it for g, it in self.dump_graphs.items()} or None,
                "iteration_observed": self.iteration_observed,
                "step_window_us": [self.start_us, self.end_us if self.end_us is not None else now_us()]}


def following_step(last: Optional[StepInfo], calls: List[TrainingCall]) -> StepInfo:
    """The step after ``last``, the last one begun (the one whose batch a dataset pipeline raised on): 1-based
    ``global_step`` one more, ``epoch``/``step_in_epoch`` moved on by one step; before any step, step 1 of the last
    of ``calls``."""
    if last is None:  # the pipeline raised before the first step of the process
        return StepInfo(global_step=1, call=calls[-1], epoch=1, step_in_epoch=1, start_us=now_us())
    batch = last.steps_per_epoch
    step_in_epoch, epoch = last.step_in_epoch, last.epoch
    if step_in_epoch is not None and batch and step_in_epoch < batch:
        step_in_epoch += 1
    elif step_in_epoch is not None:
        step_in_epoch, epoch = 1, (epoch + 1 if epoch is not None else None)
    following = StepInfo(global_step=last.global_step + 1, call=last.call, epoch=epoch,
                         step_in_epoch=step_in_epoch, steps_per_epoch=batch, start_us=last.end_us or now_us())
    if last.dump_iteration is not None and not last.iteration_observed:
        following.dump_iteration = last.dump_iteration + 1
    return following


def now_us() -> int:
    """Wall-clock microseconds (the clock of the dump's file names)."""
    return time.time_ns() // 1000
