"""``Guard``: the one callback a user adds to ``Model.train``/``Model.fit``; ``mindguard hunt`` drives it.

On its own it makes the run repeatable (:class:`~mindguard.training.reproduce.Reproducible`) and records the first
failing step of the process (:class:`~mindguard.training.locator.FailureLocator`). Under ``mindguard hunt`` it adds
the examiner the hunt's request (:class:`~mindguard.protocol.request.HuntRequest`, parsed once by the run) asks for,
so the script needs no change between the passes:

* examine by ``"dump"`` (the step ran compiled; the hunt armed MindSpore's dump before the process
  started): :class:`~mindguard.dump.callback.StepDumpCheck` checks the dump holds that step, then stops;
* examine by ``"replay"`` (PyNative): the step is captured
  (:class:`~mindguard.training.examine.capture.StepCapture`) and replayed eagerly in the training process
  (:func:`mindguard.training.examine.replay.replay`);
* record pass with a :class:`~mindguard.nn.protect.GuardedTrainStep`: the first refused step left the weights
  intact, so it is captured and replayed in the same run (no second pass);
* a locate pass that dumps as it goes (``hunt --from``): the batch of a step of its window that raises is kept
  (:class:`~mindguard.dump.callback.StepBatchKeeper`), as the examine pass keeps it.

Any number of Guards may exist (one shared by every training call, a new one per call): they share the
process's run, so steps are counted once and the first failure is kept.
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any, List, Optional

from mindspore.train import Callback

from .._util.dist import per_rank_path, rank_info
from .._util.io import atomic_write_json, atomic_write_text
from .examine.capture import StepCapture
from .child.pass_end import note as note_pass
from ..dump.callback import StepBatchKeeper, StepDumpCheck
from .checks.budget import CHECK_FRACTION
from ..errors import MindguardWarning
from .locator import FailureLocator
from ..nn.protect import GuardedTrainStep
from ..protocol import folder as layout
from .reproduce import Reproducible
from .run import cannot_write, current_run, step_of
from .state import rng as _rng


class Guard(Callback):
    """Record the failing step of a training, and examine it when ``mindguard hunt`` asks.

    Args:
        record: failure record path (default ``mindguard_failure.json``; under ``mindguard hunt`` the hunt's run
            folder). One file per rank when distributed.
        check_params: also check every Parameter the step writes (weights, BatchNorm statistics, buffers), which
            finds the step whose update went bad (the loss often shows it steps later). Outside ``mindguard hunt``
            on a time budget of about 0.5 % of the training time (and always after a non-finite loss, at the end of
            the training and before an exception is recorded), so Guard can stay in every run; the record then
            names the window of steps the failing one lies in, and ``mindguard hunt --from`` finds it exactly.
        check_every_step, check_budget: check the Parameters after every step outside the hunt too, or the share of
            the training time the checks may take (see FailureLocator).
        keep_state: keep the training state on disk beside the record (``<record>.state/``: the last two states,
            on a budget of 0.5 % of the training time), so that ``mindguard hunt --from RECORD -- COMMAND`` starts
            near the failure instead of training again from step 1. At a failure Guard prints that command.
        action: ``"stop"`` | ``"raise"`` | ``"continue"`` on the first failure (see FailureLocator).
        check_shuffle: ``"warn"`` | ``"raise"`` | ``"ignore"`` when the dataset shuffles (see Reproducible).
        init_params_dir, disable_dropout: passed to :class:`mindguard.training.reproduce.Reproducible`.
        defer_check: read each step's verdict at the end of the next step, so the host never waits for the step it
            launched (default: on GPU/Ascend; see FailureLocator).

    Hooks: every ``on_train_*`` hook is forwarded to the bundled callbacks in order (Reproducible,
    FailureLocator, then the examiner); ``__enter__``/``__exit__`` too, so an exception raised by the training
    is recorded and then propagates unchanged. ``failure`` is the run's first failure (or ``None``).
    """

    def __init__(self, record: Optional[str] = None, *, check_params: bool = True, action: str = "stop",
                 check_shuffle: str = "warn", init_params_dir: Optional[str] = None,
                 disable_dropout: bool = False, defer_check: Optional[bool] = None, check_every_step: bool = False,
                 keep_state: bool = True, check_budget: float = CHECK_FRACTION):
        self.run = current_run()
        self.reproducible = Reproducible(init_params_dir, disable_dropout=disable_dropout, check_shuffle=check_shuffle)
        self.locator = FailureLocator(layout.DEFAULT_RECORD if record is None else record,
                                      check_params=check_params, action=action,
                                      defer_check=defer_check, check_every_step=check_every_step,
                                      keep_state=keep_state, check_budget=check_budget)
        self.callbacks: List[Callback] = [self.reproducible, self.locator]
        self.examiner: Any = None       # a Callback, chosen at the first on_train_begin
        self.replay_result: Any = None  # ReplayReport of a replayed step (False: it could not be replayed)
        self._dropped: set = set()                 # ids of callbacks whose hooks mindguard's own error turned off

    @property
    def failure(self):
        """The run's first failure (:class:`~mindguard.protocol.record.FailureRecord`), or ``None``."""
        return self.run.failure

    def __enter__(self):
        for cb in self.callbacks:
            cb.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None and isinstance(self.examiner, StepCapture) and self.examiner.captured \
                and self.replay_result is None and self.locator.step_context is not None:
            # a callback before this one raised at the examined step's end (MindSpore's LossMonitor raises on a
            # NaN loss): the step was captured at its start, so it is replayed now, before the exception goes on
            try:
                self._replay(self.locator.step_context)
            except Exception as replay_error:  # noqa: BLE001 - must not replace the training's own exception
                warnings.warn(f"mindguard: cannot replay the captured step: {type(replay_error).__name__}: "
                              f"{replay_error}", MindguardWarning, stacklevel=2)
                note_pass(self.run.request, replay_failed=f"{type(replay_error).__name__}: {replay_error}")
        for cb in reversed(self.callbacks):
            try:
                cb.__exit__(exc_type, exc, tb)
            except Exception as cleanup_error:  # noqa: BLE001 - must not replace the training's own exception
                if exc_type is None:
                    raise
                warnings.warn(f"mindguard: {type(cb).__name__} failed while the training was ending with "
                              f"{exc_type.__name__}: {type(cleanup_error).__name__}: {cleanup_error}",
                              MindguardWarning, stacklevel=2)
        return None  # never swallow the training's exception

    def on_train_begin(self, run_context) -> None:
        _rng.note_training_starts()   # before the first compile: random functions compiled from now on are this call's
        if self.examiner is None:
            self.examiner = self._make_examiner(run_context.original_args().get("train_network"))
            if self.examiner is not None:
                self.examiner.__enter__()
                self.callbacks.append(self.examiner)
        self._forward("on_train_begin", run_context)

    def on_train_epoch_begin(self, run_context) -> None:
        self._forward("on_train_epoch_begin", run_context)

    def on_train_step_begin(self, run_context) -> None:
        self._forward("on_train_step_begin", run_context)

    def on_train_epoch_end(self, run_context) -> None:
        self._forward("on_train_epoch_end", run_context)

    def on_train_end(self, run_context) -> None:
        self._forward("on_train_end", run_context)

    def on_train_step_end(self, run_context) -> None:
        self._forward("on_train_step_end", run_context)
        if isinstance(self.examiner, StepCapture) and self.examiner.captured and self.replay_result is None:
            self._replay(run_context)
        elif isinstance(self.examiner, _RecordedStep) and self.examiner.report is not None \
                and self.replay_result is None:
            self.replay_result = self.examiner.report
            self._write_report()

    def _make_examiner(self, train_network) -> Optional[Callback]:
        request = self.run.request
        if request is None:
            return None
        capture_dir = request.capture_dir or Path(layout.DEFAULT_CAPTURE)
        batch_path = per_rank_path(layout.step_batch_beside(request.record), *rank_info())
        if request.pass_name == "record":
            if request.capture_dir is not None and isinstance(train_network, GuardedTrainStep):
                return StepCapture(on_refusal=True, directory=capture_dir, record=None)
            if request.dump_path is not None and request.keep_steps is not None:   # a locate pass that dumps
                return StepBatchKeeper(*request.keep_steps, batch_path=batch_path)
            return None
        step = request.examine_step   # set for every examine pass (HuntRequest.from_env refuses one without it)
        if step is None:
            return None
        if request.examine == "replay":
            if getattr(train_network, "network", None) is None:  # a train cell of its own: record it in place
                return _RecordedStep(step, train_network)
            return StepCapture(step=step, directory=capture_dir, stop_after=True, record=None)
        if request.examine == "dump":
            return StepDumpCheck(step, request.dump_path or Path(layout.DEFAULT_DUMP), net_name=request.net_name,
                                 batch_path=batch_path)
        return None  # "dataset": the run set the pipeline's debug mode; the locator records the step

    def _replay(self, run_context) -> None:
        from .examine.replay import replay

        params = run_context.original_args()
        train_network = params.get("train_network")
        network_with_loss = getattr(train_network, "network", None)
        if network_with_loss is None:
            warnings.warn(f"mindguard: cannot replay the captured step: the train network "
                          f"{type(train_network).__name__} has no `.network` (the network with loss); use "
                          f"nn.TrainOneStepCell, mindguard.GuardedTrainStep, or Model(net, loss_fn, optimizer)",
                          MindguardWarning, stacklevel=2)
            note_pass(self.run.request,
                      replay_failed=f"the train network {type(train_network).__name__} has no `.network`")
            self.replay_result = False
            return
        from .checks.params import find_optimizer

        from ..errors import MindguardError

        optimizer = params.get("optimizer") or find_optimizer(train_network)
        try:
            self.replay_result = replay(network_with_loss, self.examiner.path, optimizer=optimizer)
        except MindguardError as exc:   # mindguard could not replay: say so, never end the training with it
            warnings.warn(f"mindguard: cannot replay the captured step {self.examiner.path}: {exc}", MindguardWarning,
                          stacklevel=2)
            note_pass(self.run.request, replay_failed=f"{type(exc).__name__}: {exc}")
            self.replay_result = False
            return
        self._write_report()

    def _write_report(self) -> None:
        if self.run.request is not None:
            self.run.examined = True
        report = (self.run.request.replay_report if self.run.request and self.run.request.replay_report
                  else layout.replay_beside_capture(getattr(self.examiner, 'path', layout.DEFAULT_CAPTURE)))
        target = per_rank_path(report, *rank_info())
        try:
            atomic_write_json(target, self.replay_result.to_dict())
            atomic_write_text(layout.replay_text(target), str(self.replay_result) + "\n")
        except OSError as exc:   # mindguard's own I/O never ends the training (under the hunt: the pass says so)
            cannot_write("the replay report", target, exc, alternative="free space where the capture is written")

    def _forward(self, hook: str, run_context) -> None:
        for cb in self.callbacks:
            if id(cb) in self._dropped:
                continue
            try:
                getattr(cb, hook)(run_context)
            except Exception as error:  # noqa: BLE001 - sorted below: only mindguard's own bugs are contained
                if not self._own_error(error):
                    raise
                self._contain(cb, hook, error)

    def _own_error(self, error: Exception) -> bool:
        """Whether ``error``, raised by a bundled callback's hook, is mindguard's own bug (contained: the training goes
        on) rather than something to propagate (:func:`mindguard.training.locator.own_error`)."""
        from .locator import own_error

        return own_error(self.run, error)

    def _contain(self, cb: Callback, hook: str, error: Exception) -> None:
        """mindguard's own error in ``cb``'s ``hook``: the part it breaks is turned off (one warning, the record's
        ``checks_lost``) and the training goes on. The locator first loses its Parameter check (the loss check goes
        on); if it fails again it is dropped too."""
        run = self.run
        if run.step_begun() is not None or hook != "on_train_step_begin":
            step = run.step.global_step if run.step is not None else None
        else:   # the step about to begin (the locator, after this callback, counts it)
            step = run.step.global_step + 1 if run.step is not None else 1
        if cb is self.locator and not self.locator.verdicts.params_lost:
            self.locator.verdicts.params_lost = True
            run.recorder.lose_check("Parameter", error, step, still="the loss check")
            return
        what = {id(self.locator): "loss", id(self.reproducible): "reproducibility"}.get(id(cb), "examination")
        self._dropped.add(id(cb))   # its hooks are skipped from now on; its __exit__ still restores what it set
        run.recorder.lose_check(what, error, step,
                                still="the training, unchecked," if what == "loss" else "the loss check")


class _RecordedStep(Callback):
    """The hunt's examination of an eager step of a train cell that holds no ``.network`` to replay: the step
    itself runs with every operator recorded (:class:`mindguard.training.examine.replay.InPlaceRecording`), then
    training stops. ``report`` is the :class:`~mindguard.training.examine.replay.ReplayReport` once the step ran."""

    def __init__(self, step: int, train_network):
        self.step = step
        self.train_network = train_network
        self.recording: Any = None   # InPlaceRecording while the step runs
        self.report: Any = None      # its ReplayReport

    def on_train_step_begin(self, run_context) -> None:
        from .examine.replay import InPlaceRecording

        if self.recording is None and step_of(run_context).global_step == self.step:
            self.recording = InPlaceRecording(self.train_network)
            self.recording.start()

    def on_train_step_end(self, run_context) -> None:
        from .checks.params import written_parameters

        if self.recording is None or self.report is not None:
            return
        params = run_context.original_args()
        self.report = self.recording.finish(params.get("train_dataset_element") or [],
                                            written_parameters(self.train_network, params.get("optimizer")),
                                            step_of(run_context).global_step - 1)
        run_context.request_stop()

    def __exit__(self, exc_type, exc, tb) -> None:
        if self.recording is not None:
            self.recording.close(exc_type, exc, tb)
        return None

