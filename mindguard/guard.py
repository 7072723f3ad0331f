"""``Guard``: the one callback a user adds; ``mindguard hunt`` drives it through the environment.

On its own it records the failing step (FailureLocator) and checks reproducibility (Reproducible).
Under ``mindguard hunt`` it reads the environment the hunt sets (:mod:`mindguard._hunt_env`), so the
script needs no change between pass 1 (record the failing step) and pass 2 (examine that step).
"""
from __future__ import annotations

import os
import warnings
from typing import List, Optional

import mindspore as ms
from mindspore.train import Callback

from ._dist import per_rank_path, rank_info
from ._hunt_env import (ENV_CAPTURE_DIR, ENV_DUMP_ITERATION, ENV_DUMP_PATH, ENV_NET_NAME, ENV_PASS, ENV_RECORD,
                        ENV_REPLAY_REPORT)
from ._io import atomic_write_json, atomic_write_text
from ._locator import FailureLocator
from .dump import DumpOnDemand
from .reproduce import Reproducible
from .step import GuardedTrainStep
from .step_replay import StepCapture, replay


class Guard(Callback):
    """Record the failing step of a training, and examine it when ``mindguard hunt`` asks.

    Args:
        record: failure record path (default ``mindguard_failure.json``; under ``mindguard hunt`` the
            hunt's run folder). One file per rank when distributed.
        check_params: also check that every trainable parameter is finite after each step, which finds
            the step whose update went bad (the loss often shows it steps later).
        action: ``"stop"`` | ``"raise"`` | ``"continue"`` on the first failure (see FailureLocator).
        check_shuffle: ``"warn"`` | ``"raise"`` | ``"ignore"`` when the dataset shuffles (see Reproducible).
        init_params_dir, disable_dropout: passed to :class:`mindguard.Reproducible`.
        examine_iteration: the 0-based dump iteration to examine, then stop (what pass 2 of
            ``mindguard hunt`` sets through the environment); ``None`` = only record.
        dump_path, net_name: where and under which net name a GRAPH-mode examination dumps.
        capture_dir: where a step is captured for replay (a PyNative examination, or the first update
            a ``GuardedTrainStep`` refused); ``None`` = capture only when examining in PyNative
            (into ``mindguard_capture``).
        replay_report: where the replay's JSON report goes (its text goes next to it, ``.txt``);
            default ``<capture_dir>_replay.json``.

    How a step is examined depends on the execution mode, decided at ``on_train_begin``: in GRAPH mode
    MindSpore's dump records every operator (:class:`mindguard.DumpOnDemand`); in PyNative mode it
    dumps only graph-compiled parts, so the step is captured (:class:`mindguard.StepCapture`) and
    replayed eagerly, cell by cell (:func:`mindguard.replay`), right in the training process.
    When the model trains through a :class:`mindguard.GuardedTrainStep` and ``capture_dir`` is set
    (``mindguard hunt`` sets it), no second run is needed: the refused step left the weights intact, so
    it is captured and replayed in the same run.

    Hooks: every ``on_train_*`` hook is forwarded to the bundled callbacks in order (Reproducible,
    FailureLocator, then the examiner); ``__exit__`` too, so an exception raised by the training is
    recorded and then propagates unchanged.
    """

    def __init__(self, record: Optional[str] = None, *, check_params: bool = True, action: str = "stop",
                 check_shuffle: str = "warn", init_params_dir: Optional[str] = None,
                 disable_dropout: bool = False, examine_iteration: Optional[int] = None,
                 dump_path: str = "mindguard_dump", net_name: str = "Net",
                 capture_dir: Optional[str] = None, replay_report: Optional[str] = None):
        env = os.environ
        self.hunt_pass = env.get(ENV_PASS) or None
        if self.hunt_pass not in (None, "record", "dump"):
            raise ValueError(f"{ENV_PASS}={self.hunt_pass!r}: expected 'record' or 'dump' (set by `mindguard hunt`)")
        record = env.get(ENV_RECORD) or record or "mindguard_failure.json"
        if self.hunt_pass == "dump":
            raw = env.get(ENV_DUMP_ITERATION, "")
            if not raw.isdigit():
                raise ValueError(f"{ENV_DUMP_ITERATION}={raw!r}: expected a 0-based iteration number "
                                 f"(set by `mindguard hunt`)")
            examine_iteration = int(raw)
            dump_path = env.get(ENV_DUMP_PATH) or dump_path
        if self.hunt_pass is not None:
            capture_dir = env.get(ENV_CAPTURE_DIR) or capture_dir
            replay_report = env.get(ENV_REPLAY_REPORT) or replay_report
        net_name = env.get(ENV_NET_NAME) or net_name
        if examine_iteration is not None and (isinstance(examine_iteration, bool) or not isinstance(examine_iteration, int)
                                              or examine_iteration < 0):
            raise ValueError(f"Guard(examine_iteration={examine_iteration!r}): must be a 0-based dump iteration "
                             f"(int >= 0), e.g. a failure record's dump_iteration")

        self.reproducible = Reproducible(init_params_dir, disable_dropout=disable_dropout, check_shuffle=check_shuffle)
        self.locator = FailureLocator(record, check_params=check_params, action=action)
        self.callbacks: List[Callback] = [self.reproducible, self.locator]
        self.examine_iteration = examine_iteration
        self.examiner: Optional[Callback] = None   # DumpOnDemand or StepCapture, chosen in on_train_begin
        self.replay_result = None                  # ReplayReport of a PyNative examination
        self._dump_path, self._net_name = dump_path, net_name
        self._capture_dir, self._replay_report = capture_dir, replay_report

    @property
    def failure(self):
        """The FailureRecord of the first failure, or ``None``."""
        return self.locator.failure

    def __enter__(self):
        for cb in self.callbacks:
            cb.__enter__()
        return self

    def __exit__(self, exc_type, exc, tb):
        for cb in reversed(self.callbacks):
            try:
                cb.__exit__(exc_type, exc, tb)
            except Exception as cleanup_error:  # noqa: BLE001 - must not replace the training's own exception
                if exc_type is None:
                    raise
                warnings.warn(f"mindguard: {type(cb).__name__} failed while the training was ending with "
                              f"{exc_type.__name__}: {type(cleanup_error).__name__}: {cleanup_error}")
        return None  # never swallow the training's exception

    def on_train_begin(self, run_context) -> None:
        if self.examiner is None:
            self.examiner = self._make_examiner(run_context.original_args().get("train_network"))
            if self.examiner is not None:
                self.examiner.__enter__()
                self.callbacks.append(self.examiner)
        self._forward("on_train_begin", run_context)

    def on_train_step_end(self, run_context) -> None:
        self._forward("on_train_step_end", run_context)
        if isinstance(self.examiner, StepCapture) and self.examiner.captured and self.replay_result is None:
            self._replay(run_context.original_args())

    def _make_examiner(self, train_network) -> Optional[Callback]:
        if self.examine_iteration is None:
            if self._capture_dir is not None and isinstance(train_network, GuardedTrainStep):
                return StepCapture(on_refusal=True, directory=self._capture_dir)
            return None
        if ms.get_context("mode") == ms.PYNATIVE_MODE:
            return StepCapture(self.examine_iteration, directory=self._capture_dir or "mindguard_capture",
                               stop_after=True)
        return DumpOnDemand(self.examine_iteration, path=self._dump_path, net_name=self._net_name, stop_after=True)

    def _replay(self, params) -> None:
        train_network = params.get("train_network")
        network_with_loss = getattr(train_network, "network", None)
        if network_with_loss is None:
            raise RuntimeError(f"Guard: cannot replay: the train network {type(train_network).__name__} has no "
                               f"`.network` (the network with loss); use nn.TrainOneStepCell, "
                               f"mindguard.GuardedTrainStep, or Model(net, loss_fn, optimizer)")
        self.replay_result = replay(network_with_loss, self.examiner.path, optimizer=params.get("optimizer"))
        rank, size = rank_info()
        report = self._replay_report or f"{self._capture_dir or 'mindguard_capture'}_replay.json"
        target = per_rank_path(report, rank, size)
        atomic_write_json(target, self.replay_result.to_dict())
        atomic_write_text(target.with_suffix(".txt"), str(self.replay_result) + "\n")

    def _forward(self, hook: str, run_context) -> None:
        for cb in self.callbacks:
            getattr(cb, hook)(run_context)


def _forwarding(hook: str):
    def method(self, run_context):
        self._forward(hook, run_context)
    method.__name__ = hook
    method.__doc__ = f"Forward ``{hook}`` to the bundled callbacks."
    return method


for _hook in ("on_train_epoch_begin", "on_train_step_begin", "on_train_epoch_end", "on_train_end"):
    setattr(Guard, _hook, _forwarding(_hook))
