"""Callbacks that dump one step: :class:`DumpOnDemand` (arms the dump itself) and :class:`StepDumpCheck`
(what ``mindguard hunt``'s examine pass uses: the hunt armed the dump before the process started).

Index bases: dump iterations are 0-based; steps are 1-based and process-wide (:mod:`mindguard.training.run`).
"""
from __future__ import annotations

import os
import time
import warnings
from pathlib import Path
from typing import Any, List, Optional, Union

import numpy as np
from mindspore.train import Callback

from .._util.dist import per_rank_path, rank_info
from .._util.names import argument_names
from ..errors import DumpConfigError, DumpNotWrittenError, MindguardWarning, RecordError
from ..protocol import folder as layout
from ..protocol.record import failing_iteration
from ..protocol.step_batch import write_step_batch
from ..training.run import current_run, step_of
from .arm import ArmedDump, enable_dump
from .config import DumpConfig
from ..analysis.files import check_step_dump, dumped_iterations as _dumped_iterations_of, find_iteration_dirs


class DumpOnDemand(Callback):
    """Dump exactly one training iteration: the failing one.

    ``iteration``: the 0-based dump iteration (``FailureRecord.dump_iteration``; ``global_step - 1`` for a
    training with one graph and one call).
    When ``None`` it is read from ``record`` (a FailureLocator record of a previous run; the per-rank
    file ``name.rank<r>.json`` when distributed). Neither available -> :class:`DumpConfigError` at construction.

    The dump is armed in the first ``on_train_begin`` of the process's run -- before the first compile when
    this ``model.train`` is the process's first graph -- and ``MINDSPORE_DUMP_CONFIG`` is restored at train
    end (or on an exception); a later training call neither re-arms nor fails. After the target step it checks
    ``<path>/rank_<r>/<net_name>/<graph>/<iteration>`` exists and raises :class:`DumpNotWrittenError` explaining why if
    not. ``stop_after`` requests a stop at the end of that step. ``dump_dir`` is then the iteration directory (the
    training graph's); ``dump_dirs`` all graphs' directories of that iteration.

    PyNative mode: MindSpore dumps only what is graph-compiled (the optimizer update), not the forward
    or backward operators; a warning says so.

    ``mindguard hunt`` does not use this callback: it arms the dump itself, before the process starts, with
    the iteration it observed (:mod:`mindguard.training.run`), and :class:`StepDumpCheck` checks the step's files.
    """

    def __init__(self, iteration: Optional[int] = None, *,
                 record: Union[str, "os.PathLike[str]"] = layout.DEFAULT_RECORD,
                 path: Union[str, "os.PathLike[str]"] = layout.DEFAULT_DUMP, net_name: Optional[str] = "Net",
                 stop_after: bool = True, overwrite: bool = False):
        self.rank, self.group_size = rank_info()
        self.record = per_rank_path(record, self.rank, self.group_size) if record is not None else None
        self.iteration = self._resolve_iteration(iteration)
        self.config = DumpConfig(path, net_name or "Net", self.iteration, overwrite=overwrite)
        self.stop_after = bool(stop_after)
        self.armed: Optional[ArmedDump] = None
        self.dump_dir: Optional[Path] = None
        self.dump_dirs: List[Path] = []
        self._checked = False
        self._sink = False

    @property
    def path(self) -> Path:
        return self.config.path

    def _resolve_iteration(self, iteration: Optional[int]) -> int:
        if iteration is not None:
            if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
                raise DumpConfigError("iteration", iteration, "must be one non-negative int (0-based dump iteration)",
                                      "DumpOnDemand(iteration=FailureRecord.dump_iteration)")
            return int(iteration)
        if self.record is None or not Path(self.record).is_file():
            raise DumpConfigError(
                "iteration", None,
                f"no iteration given and no failure record at {str(self.record)!r}",
                "pass iteration=<0-based dump iteration>, or run once with mindguard.FailureLocator(record=...) "
                "and point record= at its file")
        try:
            return failing_iteration(self.record)
        except RecordError as exc:
            raise DumpConfigError("record", str(self.record), f"names no failing step to dump: {exc}",
                                  "pass iteration= explicitly, or use the record of a run that failed") from None

    # -- hooks ---------------------------------------------------------------------------------------
    def on_train_begin(self, run_context) -> None:
        import mindspore

        params = run_context.original_args()
        self.rank = rank_info()[0]
        self._sink = bool(params.get("dataset_sink_mode")) and self.config.device_target != "CPU"
        if mindspore.get_context("mode") == mindspore.PYNATIVE_MODE:
            warnings.warn("DumpOnDemand in PyNative mode: MindSpore dumps only graph-compiled parts (the optimizer "
                          "update), not the forward/backward operators; train in GRAPH mode to dump them, or use "
                          "mindguard.training.examine.capture.StepCapture + mindguard.training.examine.replay.",
                          MindguardWarning, stacklevel=2)
        if self.armed is None:  # once per process: a later training call neither re-arms nor fails
            self.armed = enable_dump(self.config, too_late="warn")

    def on_train_step_end(self, run_context) -> None:
        if self._checked:
            return
        step = step_of(run_context).global_step
        if step - 1 < self.iteration:
            return
        self._checked = True
        self.dump_dirs = find_iteration_dirs(self.path, self.iteration, rank=self.rank, net_name=self.config.net_name)
        if not self.dump_dirs:
            self._restore()
            raise DumpNotWrittenError(self._why_missing(int(step)))
        self.dump_dir = self.dump_dirs[0]
        if self.stop_after:
            run_context.request_stop()

    def on_train_end(self, run_context) -> None:
        self._restore()
        if not self._checked:
            step = current_run().global_step
            warnings.warn(f"DumpOnDemand: training call ended at global step {step} before dump iteration "
                          f"{self.iteration} ran; nothing was dumped for it yet.", MindguardWarning, stacklevel=2)

    def __exit__(self, exc_type, exc, tb) -> None:
        self._restore()
        return None

    # -- helpers -------------------------------------------------------------------------------------
    def _restore(self) -> None:
        if self.armed is not None:
            self.armed.restore()

    def _why_missing(self, step: int) -> str:
        where = self.config.iteration_dir(self.iteration, rank=self.rank)
        found = _dumped_iterations_of(self.path, self.rank, self.config.net_name)
        lines = [f"DumpOnDemand: no dump directory {where} after global step {step} "
                 f"(dump iteration {self.iteration} should have run)."]
        if self.armed is not None and self.armed.too_late:
            lines.append(f"Armed too late: {len(self.armed.too_late)} graph(s) had already compiled in this process "
                         f"(e.g. {self.armed.too_late[0]}), so MindSpore never read the config. Run the training in a "
                         "fresh process with DumpOnDemand in its first model.train (no model.eval / GRAPH-mode call "
                         "before).")
        if found:
            lines.append(f"Wrong iteration? The dump holds iterations {found}: another graph that ran earlier "
                         "in the process shifts the counter, or initial_iteration differs.")
        if self._sink:
            lines.append("Dataset sink mode: step callbacks fire once per sink; use dataset_sink_mode=False "
                         "(or sink_size=1) for the dump run.")
        if len(lines) == 1:
            lines.append(f"MindSpore wrote nothing under {self.path}: check MINDSPORE_DUMP_CONFIG was not "
                         "overridden, and that this model.train is the process's first graph.")
        return "\n  ".join(lines)



class StepBatchKeeper(Callback):
    """Keeps the batch of the step that raises among global steps ``first``-``last`` (1-based, process-wide) at
    ``batch_path`` (``mindguard.protocol.step_batch``, named by the train network's ``construct`` arguments):
    MindSpore dumps nothing of a step whose first launched kernel raises, and then the batch is the one record of
    the values the step got. A step of the range holds its batch's tensors (no copy) until it ends; only a step that
    raises copies them to host memory and writes them. Used by the hunt's passes that dump a step: the locate pass
    that dumps as it goes and the examine pass (:class:`StepDumpCheck`).
    """

    def __init__(self, first: int, last: int, batch_path: Optional[Path]):
        self.first, self.last = int(first), int(last)
        self.batch_path = batch_path
        self.checked = False             # (StepDumpCheck: its step was checked, the training is stopping)
        self._step: Optional[int] = None
        self._batch: Optional[List[Any]] = None   # the step's inputs (Tensors, or host copies: StepDumpCheck)
        self._names: List[str] = []

    def on_train_step_begin(self, run_context) -> None:
        step = step_of(run_context).global_step
        self._step, self._batch = None, None
        if self.first <= step <= self.last and not self.checked:
            params = run_context.original_args()
            self._step, self._batch = step, list(params.get("train_dataset_element") or [])
            self._names = argument_names(params.get("train_network"), len(self._batch))

    def on_train_step_end(self, run_context) -> None:
        self._batch = None   # the step ended: it did not raise

    def __exit__(self, exc_type, exc, tb) -> None:
        """A step of the range raised (it began and did not end): keep its batch at ``batch_path``. Never raises: a
        batch that cannot be written is said in a warning (the analysis then has the dump alone)."""
        if exc_type is None or self.checked or self._batch is None or self._step is None or self.batch_path is None:
            return None
        try:
            write_step_batch(self.batch_path, [_on_host(t) for t in self._batch], self._names, self._step)
        except Exception as error:  # noqa: BLE001 - the training is ending with its own exception: said, never hidden
            warnings.warn(f"mindguard: cannot keep the batch of global step {self._step} at {self.batch_path} "
                          f"({type(error).__name__}: {error}); the analysis reads the dump alone",
                          MindguardWarning, stacklevel=1)
        return None


def _on_host(value: Any) -> np.ndarray:
    return np.asarray(value.asnumpy()) if hasattr(value, "asnumpy") else np.asarray(value)


class StepDumpCheck(StepBatchKeeper):
    """Under ``mindguard hunt``'s examine pass: after global step ``step`` (1-based, process-wide), check that
    the dump the hunt armed holds that step -- files of the dumped iterations written during the step, and
    its batch files (``Parameter.inputs*``) equal to the batch the step got -- then stop the training.

    The outcome is in ``dirs`` (the iteration directories holding the step's files) and ``problems``
    (why the dump does not hold the step; empty when it does); the failure record carries the step's
    time window (``step_window_us``) so the analysis reads only that step's files. When the step raises, its
    batch is kept at ``batch_path`` (:class:`StepBatchKeeper`).
    """

    def __init__(self, step: int, root: Union[str, "os.PathLike[str]"], *, net_name: str = "Net",
                 batch_path: Optional[Path] = None):
        super().__init__(step, step, batch_path)
        self.step = int(step)
        self.root = Path(root)
        self.net_name = net_name
        self.dirs: List[Path] = []
        self.problems: List[str] = []

    def on_train_step_begin(self, run_context) -> None:
        super().on_train_step_begin(run_context)
        if self._batch is not None:   # copied now: the dump's batch files are compared with what the step got
            self._batch = [_on_host(t) for t in self._batch]

    def on_train_step_end(self, run_context) -> None:
        info = step_of(run_context)
        if info.global_step != self.step or self.checked:
            return
        self.checked = True
        run = current_run()
        run.end_step(info)
        run.examined = True
        self.dirs, self.problems = check_step_dump(self.root, rank_info()[0], self.net_name,
                                                   (info.start_us, info.end_us if info.end_us is not None
                                                    else time.time_ns() // 1000), self._batch or [])
        for problem in self.problems:
            warnings.warn(f"mindguard: the dump of global step {self.step}: {problem}", MindguardWarning, stacklevel=1)
        run_context.request_stop()
