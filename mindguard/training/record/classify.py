"""What an exception that ended a training call means for the run's record: a pure decision, no MindSpore.

:func:`classify_exception` looks at the exception (its type, its text, the frames of its traceback) and at a few
facts of the run (:class:`RunFacts`), and returns an :class:`ExceptionDecision`: whether it is recorded, as what
``kind`` and ``phase``, with which message, at which step, and why.
:meth:`mindguard.training.run.Run.fail_with_exception` acts on it (writes the record, looks up the step's dump
iterations, puts a between-steps error at the next step).

The phases:

* ``"step"`` -- the training's own failure: raised while a step was under way (a MindSpore kernel), or after a
  step ended by MindSpore's code alone (a device's kernel failure surfaces when a deferred verdict is read);
* ``"script"`` -- the script's own error, not the step's numbers: raised by a callback of the script's own, by
  the script's code between two steps, after the step's checks passed, an interrupt between steps, or after the
  training calls had ended. Raised by a callback of the script's (any ``Callback`` class but MindSpore's and
  mindguard's; :func:`raising_callback`), the decision names it (``raised_by``): not a failure of the training, no
  hunt line, no state kept (issue 50);
* ``"mindguard"`` -- mindguard's own bug (:func:`mindguards_own`), never hunted as the user's;
* ``"between_steps"`` -- the dataset pipeline raised between steps: put at the step after the last one begun;
* ``"loader"`` -- the script's own data loader (a generator, or an iterator's ``__next__``, that the script's loop
  iterates) raised producing the next batch: put at the step after the last one begun, exactly (it reads nothing
  ahead); the record holds the whole answer (the line, the message naming the sample);
* ``None`` -- raised before the first step of the process, not by the dataset.

Not recorded: a second failure (the first is kept), :class:`mindguard.training.run.HuntStop` (mindguard's own ending),
``SystemExit`` (the script ended itself: the run finished).
"""
from __future__ import annotations

import inspect
import os
import re
import sys
from dataclasses import dataclass
from typing import Dict, Optional

from ..child.hunt_stop import HuntStop
from ...errors import MindguardError
from ...protocol.record import Kind, Phase

#: characters of an exception's text kept in the record (MindSpore appends long C++ traces)
MESSAGE_LIMIT = 4000
#: said first in the message of an exception of a dataset pipeline that reads ahead
READ_AHEAD = ("[step not certain: the dataset pipeline raised between steps and reads ahead, so the batch that raised "
              "is this step's or a later one's; mindguard hunt re-runs the pipeline synchronously to name it] ")


@dataclass(frozen=True)
class RunFacts:
    """What the decision needs to know of the run when the exception arrived."""

    failed: bool = False             # a failure is recorded already (the first is kept)
    step_under_way: bool = False     # a step began and has not ended
    any_step: bool = False           # a step has begun in this process
    any_call: bool = False           # a training call has begun in this process
    reads_ahead: bool = True         # the dataset pipeline reads ahead (not the hunt's synchronous "dataset" pass)
    training_ended: bool = False     # at interpreter exit: the training calls had ended normally before it raised
    step_ended: bool = False         # a step has ended in this process
    on_cpu: bool = True              # MindSpore runs on CPU (no kernel error deferred to a later call)


@dataclass(frozen=True)
class ExceptionDecision:
    """What to do with the exception. ``record``: write it as the run's failure (``kind`` ``"exception"`` or
    ``"interrupted"``, ``phase``, ``message``), at the run's current step -- the one under way, else the last one
    begun -- or, ``next_step``, at the step after the last one begun. ``finished``: the run ended normally (write
    ``"finished"``). Neither: nothing to do. ``why`` says which rule decided, in words."""

    record: bool
    why: str
    kind: Optional[str] = None
    phase: Optional[str] = None
    message: Optional[str] = None
    next_step: bool = False
    finished: bool = False
    raised_by: Optional[Dict[str, Optional[str]]] = None   # the script's callback that raised it (raising_callback)


def classify_exception(exc_type: type, exc: BaseException, run: RunFacts) -> ExceptionDecision:
    """Decide what the exception ``exc`` (of ``exc_type``) that ended a training call means (module docstring)."""
    if run.failed:
        return _not_recorded("a failure is recorded already: the first one is kept")
    if issubclass(exc_type, HuntStop):
        return _not_recorded("mindguard hunt ended the process: not a failure")
    if issubclass(exc_type, SystemExit):
        return _not_recorded("the script ended itself (sys.exit): the run finished", finished=True)
    interrupted = issubclass(exc_type, KeyboardInterrupt)
    kind = Kind.INTERRUPTED.value if interrupted else Kind.EXCEPTION.value
    if run.training_ended and not interrupted:
        return _recorded("raised after the training calls had ended normally", kind, Phase.SCRIPT.value,
                         f"{exc_type.__name__}: {exc} [raised after training ended]"[:MESSAGE_LIMIT])
    text = f"{exc_type.__name__}: {exc}".strip()
    if len(text) > MESSAGE_LIMIT:
        text = text[:MESSAGE_LIMIT] + " [...]"
    inside = mindguards_own(exc) if not interrupted else None
    if inside is not None:
        return _recorded(f"raised by mindguard's own code at {inside}", kind, Phase.MINDGUARD.value,
                         f"mindguard's own error at {inside}: {text}")
    callback = raising_callback(exc, on_cpu=run.on_cpu) if not interrupted else None
    if callback is not None:
        name = f"{callback['callback']}.{callback['hook']}"
        when = ("before the step's checks" if run.step_under_way else
                "after the step's checks passed" if run.any_step else "before the first step")
        return _recorded(f"raised by the script's own callback {name}: its error, not the training's", kind,
                         Phase.SCRIPT.value if run.any_step else None, _said_scripts(text, exc, name, kind, when),
                         raised_by=callback)
    dataset = looks_like_dataset_error(text)
    if compiling_the_network(exc) and not interrupted and run.any_step and (run.on_cpu or not run.step_ended):
        # (on a device, a kernel's error of an earlier step may surface at a later call, a compile among them)
        return _recorded("raised by MindSpore's graph compiler: the script's code did not compile", kind,
                         Phase.SCRIPT.value, f"{text} [raised compiling the network: an error of the script's "
                                             f"code, before the step ran; MindSpore's message names its line]")
    if run.step_under_way:
        return _recorded("raised while a step was under way", kind, Phase.STEP.value, text)
    loader = loader_frame(exc) if run.any_step and not dataset and not interrupted else None
    if loader is not None:
        return _recorded(f"raised in the script's data loader {loader}, producing the next step's batch", kind,
                         Phase.LOADER.value, _said_scripts(text, exc, None, kind,
                                                           f"in the loader {loader}, producing the step's batch"),
                         next_step=True)
    if run.any_step and not dataset:
        # after a step ended, an error raised in MindSpore's own code may still be the training's (a device's
        # kernel failure surfaces when a deferred verdict is read at the next step's end): only the script's own
        # code (or a callback of its own: above) makes it the script's
        if not interrupted and raising_line(exc, innermost=True) is None:
            return _recorded("raised between steps inside a library, not the script's code: the last step's", kind,
                             Phase.STEP.value, text)
        return _recorded("raised between steps by the script's own code (or an interrupt)", kind, Phase.SCRIPT.value,
                         _said_scripts(text, exc, None, kind, "after the step's checks passed"))
    if not (dataset and (run.any_step or run.any_call)):
        return _recorded("raised before the first step of the process", kind, None, text)
    return _recorded("the dataset pipeline raised between steps: the next step's batch", kind,
                     Phase.BETWEEN_STEPS.value, READ_AHEAD + text if run.reads_ahead else text, next_step=True)


def _not_recorded(why: str, *, finished: bool = False) -> ExceptionDecision:
    return ExceptionDecision(record=False, why=why, finished=finished)


def _recorded(why: str, kind: str, phase: Optional[str], message: str, *, next_step: bool = False,
              raised_by: Optional[Dict[str, Optional[str]]] = None) -> ExceptionDecision:
    return ExceptionDecision(record=True, why=why, kind=kind, phase=phase, message=message, next_step=next_step,
                             raised_by=raised_by)


def _said_scripts(text: str, exc: BaseException, hook: Optional[str], kind: str, when: str) -> str:
    """``text`` with where the script's own code raised it, and when (an interrupt's text stays as it is)."""
    if kind != Kind.EXCEPTION:
        return text
    where = raising_line(exc)
    said = [f"raised by {hook}" if hook else "raised"] + ([f"at {where}"] if where else [])
    return text + f" [{' '.join(said)}, {when}]"


# -- whose frames ----------------------------------------------------------------------------------------
# mindguard's training side (mindguard/training/), the stdlib's
_LIBRARY_DIRS = tuple(os.path.dirname(path) + os.sep for path in (os.path.dirname(__file__), os.__file__))

_HOOKS = ("on_train_step_begin", "on_train_step_end", "on_train_epoch_begin", "on_train_epoch_end", "on_train_begin",
          "on_train_end", "step_begin", "step_end", "epoch_begin", "epoch_end", "begin", "end")


def users_file(filename: str) -> bool:
    """True for a source file of the script's own: not mindguard's, the standard library's or an installed
    package's (MindSpore's among them), nor generated code (``<string>``)."""
    return not filename.startswith(_LIBRARY_DIRS) and "site-packages" not in filename and not filename.startswith("<")


def user_callback_hook(exc: BaseException) -> Optional[str]:
    """``"MyCallback.on_train_step_end"`` when ``exc`` was raised inside a hook of a callback of the script's own
    (:func:`raising_callback`), else None."""
    callback = raising_callback(exc)
    return f"{callback['callback']}.{callback['hook']}" if callback is not None else None


def raising_callback(exc: BaseException, *, on_cpu: bool = True) -> Optional[Dict[str, Optional[str]]]:
    """``{"callback": "MyCallback", "hook": "on_train_step_end", "line": "train.py:33"}`` when ``exc`` was raised
    inside a hook (``on_*``, ``step_end``, ...) of a callback of the script's -- the innermost such frame of its
    traceback, in an object with callback hooks whose class is neither MindSpore's (its ``LossMonitor`` raises on a
    NaN loss: the training's failure, which the locator checks first) nor mindguard's; ``line``: where in that hook
    (the raise, or the call that raised). Else ``None``; also, off the CPU (``on_cpu=False``), when the innermost
    frame is MindSpore's own: a device's kernel failure of the step surfaces at the first read of a result, which
    may be in a callback (``loss.asnumpy()``)."""
    found: Optional[Dict[str, Optional[str]]] = None
    tb = exc.__traceback__
    innermost = None
    while tb is not None:
        frame = tb.tb_frame
        innermost = frame.f_code.co_filename
        if frame.f_code.co_name in _HOOKS:
            owner = frame.f_locals.get("self")
            if owner is not None and _a_scripts_callback(owner):
                found = {"callback": type(owner).__name__, "hook": frame.f_code.co_name,
                         "line": f"{frame.f_code.co_filename}:{tb.tb_lineno}"}
        tb = tb.tb_next
    if found is not None and not on_cpu and innermost is not None and _mindspores(innermost):
        return None
    return found


def _a_scripts_callback(owner: object) -> bool:
    """True for an object with callback hooks whose class is not MindSpore's nor mindguard's (its demos are the
    user's code)."""
    if not any(hasattr(owner, name) for name in ("on_train_step_end", "step_end")):
        return False
    module = type(owner).__module__ or ""
    top = module.split(".", 1)[0]
    if top == "mindspore" or (top == "mindguard" and not module.startswith("mindguard.demos")):
        return False
    filename = getattr(sys.modules.get(module), "__file__", None) or ""
    return not (_mindspores(filename) or _in_mindguard(os.path.abspath(filename)))


def _mindspores(filename: str) -> bool:
    """True for a source file of MindSpore's Python package (the one imported, or any installed one)."""
    if not filename:
        return False
    mindspore = sys.modules.get("mindspore")
    package = os.path.dirname(getattr(mindspore, "__file__", None) or "")
    return (bool(package) and os.path.abspath(filename).startswith(package + os.sep)) \
        or re.search(r"[/\\](site|dist)-packages[/\\]mindspore[/\\]", filename) is not None


def raising_line(exc: BaseException, *, innermost: bool = False) -> Optional[str]:
    """``"file:line (in function)"`` of the innermost frame of ``exc``'s traceback in the user's code (not in
    mindguard, MindSpore or the standard library), or None. ``innermost``: only when the traceback's innermost
    frame itself is the user's (the user's code raised, not a library it called)."""
    where = None
    tb = exc.__traceback__
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if users_file(filename):
            where = f"{filename}:{tb.tb_lineno} (in {tb.tb_frame.f_code.co_name})"
        elif innermost:
            where = None
        tb = tb.tb_next
    return where


def loader_frame(exc: BaseException) -> Optional[str]:
    """``"load_batches (train.py:48)"`` when ``exc`` was raised inside a generator, or an iterator's ``__next__``,
    that a frame of the script's own code was iterating (``for batch in loader``, ``next(it)``): the script's loop
    asking its own data loader for the next batch. The outermost such generator of the traceback; else ``None``."""
    tb = exc.__traceback__
    caller_is_users = False
    while tb is not None:
        code = tb.tb_frame.f_code
        if caller_is_users and (code.co_flags & inspect.CO_GENERATOR or code.co_name == "__next__"):
            return f"{code.co_name} ({code.co_filename}:{tb.tb_lineno})"
        caller_is_users = users_file(code.co_filename)
        tb = tb.tb_next
    return None


#: mindguard frames that call the user's code or MindSpore on its behalf (the step, an op through the replay's tape,
#: the bundled callbacks): an exception passing through them is not mindguard's own.
_CALL_THROUGH = {("api_hooks.py", "wrapper"), ("api_hooks.py", "_record"), ("api_hooks.py", "_finite"),
                 ("api_hooks.py", "hook"), ("watch.py", "__call__"),
                 ("watch.py", "_recorded_call"), ("guard.py", "_forward"), ("guard.py", "method"),
                 ("guard.py", "__exit__"), ("guard.py", "__enter__"), ("replay.py", "loss_of"),
                 ("resume.py", "__call__"), ("patches.py", "__call__"),
                 ("patches.py", "method"), ("patches.py", "seeded")}
_OWN_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep   # mindguard/
_DEMOS_DIR = os.path.join(_OWN_DIR, "demos") + os.sep


def _in_mindguard(filename: str) -> bool:
    """True for a source file of mindguard's own (its bundled demos are the user's code)."""
    return filename.startswith(_OWN_DIR) and not filename.startswith(_DEMOS_DIR)


def mindguards_own(exc: BaseException) -> Optional[str]:
    """``"file:line (in function)"`` when ``exc`` was raised by mindguard's own code -- the innermost frame outside
    the libraries it called is mindguard's, and not one that only calls the user's code through -- else None. An
    error mindguard raises on purpose for the user (a ``MindguardError``: a bad argument, ``NonFiniteError``) is
    not its failure."""
    if isinstance(exc, MindguardError) and type(exc).__name__ != "ReplayError":
        return None
    if "C++ Call Stack" in str(exc) or re.search(r"For '\w+'", str(exc)):
        return None   # a MindSpore kernel's error surfacing where mindguard read a value: the training's
    innermost = None
    tb = exc.__traceback__
    while tb is not None:
        filename = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if _in_mindguard(filename):
            innermost = (filename, tb.tb_lineno, tb.tb_frame.f_code.co_name)
        elif users_file(filename):
            innermost = None
        tb = tb.tb_next
    if innermost is None or (os.path.basename(innermost[0]), innermost[2]) in _CALL_THROUGH:
        return None
    return f"{os.path.relpath(innermost[0], os.path.dirname(_OWN_DIR))}:{innermost[1]} (in {innermost[2]})"


def compiling_the_network(exc: BaseException) -> bool:
    """True when ``exc`` surfaced in MindSpore's graph compiler: the innermost frame of its traceback is a
    ``compile`` function of MindSpore's own Python package (a ``Cell``'s or a ``jit`` function's; measured on 2.10:
    ``mindspore/graph/api.py`` ``compile``), not a kernel's run (``_exec_pip``), and no frame of mindguard's own code
    (but those that call the script's through) is on the way. The step never ran: nothing of the training's numbers
    to examine."""
    mindspore = sys.modules.get("mindspore")
    package = os.path.dirname(getattr(mindspore, "__file__", None) or "")
    tb = exc.__traceback__
    innermost = None
    while tb is not None:
        innermost = tb.tb_frame.f_code
        filename = os.path.abspath(innermost.co_filename)
        if _in_mindguard(filename) and (os.path.basename(filename), innermost.co_name) not in _CALL_THROUGH:
            return False   # a graph of mindguard's own (its checks) did not compile: not the script's
        tb = tb.tb_next
    return bool(package) and innermost is not None and innermost.co_name == "compile" \
        and os.path.abspath(innermost.co_filename).startswith(package + os.sep)


def looks_like_dataset_error(text: str) -> bool:
    """True when an exception's text says MindSpore's dataset pipeline raised it."""
    lowered = text.lower()
    return "in dataset" in lowered or "dataset pipeline" in lowered or "minddata" in lowered
