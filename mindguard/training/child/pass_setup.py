"""What a hunt pass asks of the process where its training starts (nothing outside the hunt): the dump config the
hunt armed left in place (:func:`check_dump_config`), and -- for the hunt's ``"dataset"`` examination -- MindSpore's
dataset pipeline run synchronously (:func:`dataset_debug_mode`). Imports nothing of MindSpore at import time."""
from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any, Optional

from ...protocol.request import ENV_PASS, HuntRequest
from . import pass_end as _pass_end
from ..step.events import StepListener
from .hunt_stop import CANNOT_CONTINUE, HuntCannotContinue

if TYPE_CHECKING:  # pragma: no cover
    from ..step.steps import TrainingCall


def initial_environ(name: str) -> Optional[str]:
    """``name`` as the process was started with it (``/proc/self/environ``: what ``os.environ`` changes leave)."""
    try:
        with open("/proc/self/environ", "rb") as f:
            entries = f.read().split(b"\0")
    except OSError:
        return None
    prefix = name.encode() + b"="
    for entry in entries:
        if entry.startswith(prefix):
            return entry[len(prefix):].decode("utf-8", "surrogateescape")
    return None


def check_dump_config(request: Optional[HuntRequest]) -> None:
    """Under the hunt, before the first training call compiles: a script that set its own
    ``MINDSPORE_DUMP_CONFIG`` (or removed it) replaced the dump the hunt armed -- MindSpore reads the variable at
    the first compile -- so the pass could observe or dump nothing: say so, naming it, and end the pass."""
    if request is None:
        return
    armed = initial_environ("MINDSPORE_DUMP_CONFIG")
    current = os.environ.get("MINDSPORE_DUMP_CONFIG")
    if not armed or current == armed:
        return
    what = "observe which dump iteration each step runs as" if request.pass_name == "record" else "dump the step"
    done = f"sets MINDSPORE_DUMP_CONFIG={current}" if current else "removes MINDSPORE_DUMP_CONFIG"
    message = (CANNOT_CONTINUE + f"the script {done} itself, replacing the dump config the hunt armed ({armed}), so "
               f"MindSpore would not {what} for the hunt. Set it only outside the hunt, e.g. `if not "
               f"os.environ.get('{ENV_PASS}'): os.environ['MINDSPORE_DUMP_CONFIG'] = ...`")
    print(message, file=sys.stderr, flush=True)
    _pass_end.note(request, ended="cannot_continue", cannot_continue=message[len(CANNOT_CONTINUE):])
    raise HuntCannotContinue(message)


def dataset_debug_mode() -> None:
    """Run MindSpore's dataset pipeline synchronously (its debug mode), so that an exception raised by the
    dataset arrives at the step whose batch raised instead of steps earlier (the pipeline reads ahead). With no
    debug hooks: MindSpore's default hook prints every map operation's input and output and makes the pipeline's
    error lose its "The corresponding data file is: ..." line (measured on 2.10); the user's output stays theirs.
    MindSpore reads the mode when a dataset is built and when its iterator is made (``Model.train`` makes it before
    the callbacks' ``on_train_begin``), so this runs where the training is set up: :meth:`Run.prepare_training`."""
    import mindspore.dataset as ds   # here, not at import time: `mindguard hunt` imports the run

    ds.config.set_debug_mode(True, [])


class HuntSetup(StepListener):
    """What the hunt's ``request`` asks of the process where its training is set up (nothing outside the hunt), a
    listener of the run's events: at the first training call, the dump config checked (:func:`check_dump_config`)
    and the training prepared (:meth:`prepare`)."""

    def __init__(self, request: Optional[HuntRequest]) -> None:
        self.request = request
        self._prepared = False
        self._called = False

    def prepare(self) -> None:
        """Where a training is set up, before its datasets and their iterators are built: for the ``"dataset"``
        examination, MindSpore's dataset pipeline run synchronously (:func:`dataset_debug_mode`). Idempotent."""
        if self._prepared:
            return
        self._prepared = True
        if self.request is not None and self.request.examine == "dataset":
            dataset_debug_mode()

    def call_begun(self, call: "TrainingCall", network: Any, next_step: int) -> None:
        if self._called:
            return
        self._called = True
        check_dump_config(self.request)
        self.prepare()   # (a training set up without Guard, FailureLocator or watch)
