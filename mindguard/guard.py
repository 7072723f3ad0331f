"""``Guard``: the one callback a user adds; ``mindguard hunt`` drives it through the environment.

On its own it records the failing step (FailureLocator) and checks reproducibility (Reproducible).
Under ``mindguard hunt`` it reads the environment the hunt sets, so the script needs no change
between passes:

============================  =======================================================================
``MINDGUARD_HUNT_PASS``       ``record`` (pass 1: find the failing step) or ``dump`` (pass 2: dump it)
``MINDGUARD_RECORD``          where the failure record goes (per rank: ``failure.rank1.json``)
``MINDGUARD_DUMP_ITERATION``  pass 2: the 0-based dump iteration to dump
``MINDGUARD_DUMP_PATH``       pass 2: the dump directory
``MINDGUARD_NET_NAME``        pass 2: the dump's ``net_name``
============================  =======================================================================
"""
from __future__ import annotations

import os
from typing import List, Optional

from mindspore.train import Callback

from ._hunt_env import ENV_DUMP_ITERATION, ENV_DUMP_PATH, ENV_NET_NAME, ENV_PASS, ENV_RECORD

_HOOKS = ("on_train_begin", "on_train_epoch_begin", "on_train_step_begin",
          "on_train_step_end", "on_train_epoch_end", "on_train_end")


class Guard(Callback):
    """Record the failing step of a training, and dump it when ``mindguard hunt`` asks.

    Args:
        record: failure record path (default ``mindguard_failure.json``; under ``mindguard hunt`` the
            hunt's run folder). One file per rank when distributed.
        check_params: also check that every trainable parameter is finite after each step, which finds
            the step whose update went bad (the loss often shows it steps later).
        action: ``"stop"`` | ``"raise"`` | ``"continue"`` on the first failure (see FailureLocator).
        check_shuffle: ``"warn"`` | ``"raise"`` | ``"ignore"`` when the dataset shuffles (see Reproducible).
        init_params_dir, disable_dropout: passed to :class:`mindguard.Reproducible`.
        dump_iteration, dump_path: dump this 0-based iteration into ``dump_path`` (what pass 2 of
            ``mindguard hunt`` sets through the environment); ``None`` = no dump.

    Hooks: every ``on_train_*`` hook is forwarded to the bundled callbacks in order (Reproducible,
    FailureLocator, DumpOnDemand); ``__exit__`` too, so an exception raised by the training is recorded
    and then propagates unchanged.
    """

    def __init__(self, record: Optional[str] = None, *, check_params: bool = True, action: str = "stop",
                 check_shuffle: str = "warn", init_params_dir: Optional[str] = None,
                 disable_dropout: bool = False, dump_iteration: Optional[int] = None,
                 dump_path: Optional[str] = None, net_name: Optional[str] = None):
        from .locate import FailureLocator
        from .reproduce import Reproducible

        env = os.environ
        self.hunt_pass = env.get(ENV_PASS)
        if self.hunt_pass not in (None, "", "record", "dump"):
            raise ValueError(f"{ENV_PASS}={self.hunt_pass!r}: expected 'record' or 'dump' (set by `mindguard hunt`)")
        record = env.get(ENV_RECORD) or record or "mindguard_failure.json"
        if self.hunt_pass == "dump":
            raw = env.get(ENV_DUMP_ITERATION, "")
            if not raw.isdigit():
                raise ValueError(f"{ENV_DUMP_ITERATION}={raw!r}: expected a 0-based iteration number (set by `mindguard hunt`)")
            dump_iteration = int(raw)
            dump_path = env.get(ENV_DUMP_PATH) or dump_path
        net_name = env.get(ENV_NET_NAME) or net_name or "Net"

        self.reproducible = Reproducible(init_params_dir, disable_dropout=disable_dropout, check_shuffle=check_shuffle)
        self.locator = FailureLocator(record, check_params=check_params, action=action)
        self.dump = None
        if dump_iteration is not None:
            from .dump import DumpOnDemand

            self.dump = DumpOnDemand(dump_iteration, path=dump_path or "mindguard_dump", net_name=net_name,
                                     stop_after=True)
        self.callbacks: List[Callback] = [c for c in (self.reproducible, self.locator, self.dump) if c is not None]

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
            cb.__exit__(exc_type, exc, tb)
        return None  # never swallow the training's exception


def _forward(hook: str):
    def method(self, run_context):
        for cb in self.callbacks:
            getattr(cb, hook)(run_context)
    method.__name__ = hook
    method.__doc__ = f"Forward ``{hook}`` to the bundled callbacks."
    return method


for _hook in _HOOKS:
    setattr(Guard, _hook, _forward(_hook))
