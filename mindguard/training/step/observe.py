"""Which dump iteration each step ran as, *observed* from MindSpore's own record (:class:`IterationObserver`) and
followed across steps, graphs and failures (:class:`Iterations`).

Under ``mindguard hunt`` the record pass arms a dump that writes no tensors (``dump_mode`` 1 with a kernel list that
matches nothing) but makes MindSpore record, per kernel graph, the iteration id of every step it runs
(``execution_order/ms_global_execution_order_graph_<g>.csv``, one line per run). Without it, the iteration is
estimated from the step count (right for one training graph; ``iteration_observed`` is False). Dump iterations are
MindSpore's numbers, 0-based; steps are mindguard's 1-based global steps. Imports nothing of MindSpore.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .events import StepListener
from .steps import StepInfo


class IterationObserver:
    """Which kernel graph and dump iteration each step ran as, read from MindSpore's own record.

    ``root`` is a dump root whose config writes no tensors; MindSpore still appends one line (the
    iteration id) to ``<root>/rank_<r>/execution_order/ms_global_execution_order_graph_<g>.csv`` for every
    run of graph ``g``, by the end of the step (measured on 2.10 CPU: docs/mindspore-facts.md).
    :meth:`mark` notes the files' sizes; :meth:`since_mark` returns ``{graph: [iterations run since]}``.
    Cost: one ``listdir`` and a ``stat`` per graph at each call.
    """

    def __init__(self, root: Path, rank: int) -> None:
        self.directory = Path(root) / f"rank_{rank}" / "execution_order"
        self._sizes: Dict[int, int] = {}

    def _files(self) -> Dict[int, Path]:
        try:
            names = os.listdir(self.directory)
        except OSError:
            return {}
        prefix, suffix = "ms_global_execution_order_graph_", ".csv"
        found = {}
        for name in names:
            if name.startswith(prefix) and name.endswith(suffix) and name[len(prefix):-len(suffix)].isdigit():
                found[int(name[len(prefix):-len(suffix)])] = self.directory / name
        return found

    def mark(self) -> None:
        sizes = {}
        for graph, path in self._files().items():
            try:
                sizes[graph] = os.stat(path).st_size
            except OSError:
                continue
        self._sizes = sizes

    def since_mark(self) -> Dict[int, List[int]]:
        runs: Dict[int, List[int]] = {}
        for graph, path in self._files().items():
            start = self._sizes.get(graph, 0)
            try:
                if os.stat(path).st_size <= start:
                    continue
                with open(path, "rb") as f:
                    f.seek(start)
                    text = f.read().decode("ascii", "replace")
            except OSError:
                continue
            iterations = [int(word) for word in text.split() if word.isdigit()]
            if iterations:
                runs[graph] = iterations
        return runs


class Iterations(StepListener):
    """The run's view of dump iterations: what :class:`IterationObserver` saw each step add (``None``: not
    observed, outside the record pass), and what every kernel graph was last listed with."""

    def __init__(self, observer: Optional[IterationObserver] = None) -> None:
        self.observer = observer
        # what the observer saw of each kernel graph: graph -> (its last listed iteration, the global step that
        # listed it, self._blind_steps then); steps that listed no graph (a graph whose record stopped listing it)
        self._listed: Dict[int, Tuple[int, int, int]] = {}
        self._blind_steps = 0

    def mark(self) -> None:
        """A step begins: what is listed from now on is its own."""
        if self.observer is not None:
            self.observer.mark()

    def step_begun(self, info: StepInfo, failed: bool) -> None:
        self.mark()

    def step_ended(self, info: StepInfo) -> None:
        self.observe(info)

    def observe(self, info: StepInfo) -> None:
        """Step ``info`` ended: set its graph and dump iteration from what MindSpore listed during it."""
        if self.observer is None:
            return
        runs = self.observer.since_mark()
        self.note_listed(info, runs)
        call = info.call
        if runs and call.train_graph is None:
            # the training graph runs first in a step; a callback's graph run after it (mindcv's
            # StateMonitor reads the learning rate by a small graph) gets the next iteration
            call.train_graph = min(runs, key=lambda graph: (runs[graph][-1], graph))
        if runs and call.train_graph in runs:
            info.dump_graphs = {graph: its[-1] for graph, its in sorted(runs.items())}
            info.graph, info.dump_iteration = call.train_graph, runs[call.train_graph][-1]
            info.iteration_observed = True
            call.last_observed = (info.global_step, info.dump_iteration)
        elif runs and call.last_observed is not None and call.train_graph is not None and not info.iteration_range:
            # measured on 2.10 CPU: once another graph runs every step, the execution-order record of the
            # training graph stops listing its runs (docs/mindspore-facts.md); its iteration goes on by one
            # a step from the last one observed
            step, iteration = call.last_observed
            info.graph, info.dump_iteration = call.train_graph, iteration + info.global_step - step
            info.dump_graphs = {call.train_graph: info.dump_iteration}

    def note_listed(self, info: StepInfo, runs: Dict[int, List[int]]) -> None:
        """Remember the last iteration each graph was listed with (:meth:`candidates` reads it)."""
        if not runs:
            self._blind_steps += 1
        for graph, iterations in runs.items():
            self._listed[graph] = (iterations[-1], info.global_step, self._blind_steps)

    def candidates(self, info: StepInfo) -> List[int]:
        """The dump iterations step ``info`` may have run as when MindSpore listed none for it (it raised: a graph
        run is listed only once it completes). Every kernel graph counts its own runs (measured on 2.10 CPU: two train
        cells stepped alternately ran as iterations 0..16 and 1..16), and a graph's record may stop listing it once
        another graph runs (docs/mindspore-facts.md), so for each graph seen: its next iteration after the last one
        listed, that plus the steps since that listed no graph (its unlisted runs), and that plus every step since.
        The examine pass dumps them all and keeps the files written during the step (its time window)."""
        found = set()
        runs = self.observer.since_mark() if self.observer is not None else {}
        # graphs of the step that did complete (a grad graph before the one that raised)
        for iterations in runs.values():
            found.update(iterations)
        for iteration, step, blind in self._listed.values():
            following = iteration + 1
            found.update((following, following + self._blind_steps - blind,
                          following + max(info.global_step - 1 - step, 0)))
        return sorted(found)

    def for_exception(self, info: Optional[StepInfo], phase: Optional[str]) -> Dict[str, Any]:
        """For an exception of the step under way (``info``; ``phase`` as classified): the dump iterations it may
        have run as (MindSpore lists no iteration for a step that raised), as record fields when the step is the
        failure's (``phase == "step"``). Sets ``info.dump_iteration`` when there is one candidate only."""
        if phase == "mindguard" or info is None or info.iteration_observed or self.observer is None:
            return {}
        found = self.candidates(info)
        if not found:
            return {}
        info.dump_iteration = found[0] if len(found) == 1 else None
        return {"dump_candidates": found} if phase == "step" else {}
