"""Guard attached to an unmodified script, once ``import mindspore`` has run (:mod:`mindguard.training.attach.hook`).

What it does to MindSpore, and nothing else:

* **seeds** a script that seeds nothing: when its first ``nn.Cell`` is constructed (before any layer draws its
  initial weights) and the script has called none of ``random.seed``, ``numpy.random.seed``, ``mindspore.set_seed``
  yet, Python's ``random``, numpy and MindSpore (``mindspore.set_seed``: its ops, initialisers and the dataset
  pipeline) get ``MINDGUARD_SEED`` (default 0), so that the hunt's passes repeat the run. A script that seeds
  itself before its network is never seeded by the hook, and one that seeds after the first cell replaces the
  hook's seed: either computes bit for bit what it computes bare. A script that seeds nothing is told so at its first
  training call (its bare runs differ from each other; with the hook they repeat). ``MINDGUARD_SEED=off``: never;
* ``Model.train`` / ``Model.fit``: a :class:`~mindguard.training.guard.Guard` goes first into ``callbacks`` unless
  one (or a ``FailureLocator``) is there -- one Guard for the process, shared by its calls, as in a script;
* ``nn.TrainOneStepCell`` (and its subclasses) called by hand, outside ``Model`` and outside a step that Guard or
  ``watch`` already counts: each call is one step, watched as ``mindguard.watch(cell, cell, cell.optimizer)``
  would (at the first failure it raises :class:`~mindguard.errors.NonFiniteError`, as ``watch`` does);
* a functional loop (``mindspore.value_and_grad``, a step function, a loop; eager or ``jit``): its step function is
  found and watched as ``mindguard.watch(train_step, net, optimizer)`` would (:mod:`.functional`); one that cannot
  be found is said at its first step, with the line to add;
* at exit, a process that built an optimizer or a ``value_and_grad`` step but trained nothing mindguard could
  attach to says so.

No cell and no Parameter is added to the training; every patched function calls MindSpore's own with the same
arguments (plus the Guard) and returns what it returns.
"""
from __future__ import annotations

import atexit
import functools
import inspect
import os
import random
import weakref
import sys
from typing import Any, Callable, List, Optional, Tuple

from .notes import say
from .state import MARK, STATE, attached, outside_steps, tell_hunt

def install(ms: Any) -> None:
    """Attach to the MindSpore package ``ms`` (once per process)."""
    if STATE.installed:
        return
    STATE.installed = True
    _seed(ms)
    from mindspore import nn
    from mindspore.train import Model

    for name in ("train", "fit"):
        original = getattr(Model, name, None)
        if original is not None and not getattr(original, MARK, False):
            setattr(Model, name, _model_method(original, name))
    cell_class = nn.TrainOneStepCell
    if not getattr(cell_class.__call__, MARK, False):
        cell_class.__call__ = _cell_call(cell_class.__call__)
    optimizer_class = nn.Optimizer
    if not getattr(optimizer_class.__init__, MARK, False):
        optimizer_class.__init__ = _optimizer_init(optimizer_class.__init__)
    from . import functional

    for name, patch in (("value_and_grad", functional.value_and_grad), ("jit", functional.jit)):
        _patch_everywhere(ms, name, patch)
    atexit.register(_at_exit)


def _patch_everywhere(ms: Any, name: str, patch: Callable[[Callable], Callable]) -> None:
    """Replace MindSpore's function ``name`` by ``patch(it)`` in every loaded MindSpore module that exports it (a
    script imports it from ``mindspore``, ``mindspore.ops`` or where it is defined)."""
    original = getattr(ms, name, None)
    if original is None or getattr(original, MARK, False):
        return
    patched = patch(original)
    for module_name, module in list(sys.modules.items()):
        if (module_name == "mindspore" or module_name.startswith("mindspore.")) and module is not None \
                and getattr(module, name, None) is original:
            setattr(module, name, patched)


# -- seeds ---------------------------------------------------------------------------------------------------
def _seed(ms: Any) -> None:
    """Seed a script that seeds nothing, before its network is built: at the first ``nn.Cell`` constructed (the
    layers draw their initial weights in their constructors), unless the script seeded something by then."""
    from ...protocol.attach import seed

    _note_seeding(ms)
    try:
        value = seed(os.environ)
    except ValueError as exc:
        say(f"{exc}; the script's random sources are left as it sets them")
        value = None
    if value is None:
        STATE.seed_said = True   # `off`: nothing to seed, nothing to say
        return
    cell = ms.nn.Cell
    original = cell.__init__

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if cell.__init__ is __init__:
            cell.__init__ = original   # once: from now on every cell is built by MindSpore's own constructor
            if not STATE.script_seeded:
                _seed_now(ms, value)
        return original(self, *args, **kwargs)

    setattr(__init__, MARK, True)
    cell.__init__ = __init__


def _seed_now(ms: Any, value: int) -> None:
    import numpy as np

    seeded = STATE.script_seeded
    random.seed(value)
    np.random.seed(value)
    ms.set_seed(value)
    STATE.script_seeded = seeded   # (the calls above went through the flagging wrappers)
    STATE.seed = value


def _note_seeding(ms: Any) -> None:
    """Wrap the seed functions a script calls (same arguments, same result) to know whether it seeds itself (a call
    from MindSpore's own code does not count; ``mindguard.fix_randomness`` does: the script called it)."""
    import numpy as np

    def flagging(original: Callable) -> Callable:
        @functools.wraps(original)
        def seeded(*args: Any, **kwargs: Any) -> Any:
            caller = sys._getframe(1).f_globals.get("__name__", "") or ""
            if not (caller == "mindspore" or caller.startswith("mindspore.")):
                STATE.script_seeded = True
            return original(*args, **kwargs)
        setattr(seeded, MARK, True)
        return seeded

    original = getattr(ms, "set_seed", None)
    if original is not None:
        wrapped = flagging(original)
        modules: List[Any] = [ms, sys.modules.get("mindspore.common"), sys.modules.get("mindspore.common.seed")]
        for module in modules:
            if module is not None and getattr(module, "set_seed", None) is original:
                module.set_seed = wrapped
    np.random.seed = flagging(np.random.seed)
    random.seed = flagging(random.seed)


def _caller() -> str:
    """``file:line`` of the first frame outside MindSpore and mindguard (the script's call)."""
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "") or ""
        if not (name == "mindspore" or name.startswith(("mindspore.", "mindguard."))):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back   # type: ignore[assignment]
    return "?"


# -- Model.train / Model.fit ------------------------------------------------------------------------------------
def _model_method(original: Callable, name: str) -> Callable:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.model_depth == 0:
            args, kwargs = _with_guard(signature, name, self, args, kwargs)
        STATE.model_depth += 1
        try:
            return original(self, *args, **kwargs)
        finally:
            STATE.model_depth -= 1

    setattr(method, MARK, True)
    return method


def _with_guard(signature: inspect.Signature, name: str, model: Any, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
    """``args``/``kwargs`` of the call with the process's Guard first in ``callbacks`` (unchanged when a Guard or a
    FailureLocator is there already, or when they cannot be read: MindSpore then says what is wrong with them)."""
    try:
        bound = signature.bind(model, *args, **kwargs)
    except TypeError:
        return args, kwargs
    callbacks = bound.arguments.get("callbacks")
    items = [] if callbacks is None else list(callbacks) if isinstance(callbacks, (list, tuple)) else [callbacks]
    try:
        from ..guard import Guard
        from ..locator import FailureLocator

        if any(isinstance(cb, (Guard, FailureLocator)) for cb in items):
            return args, kwargs   # the script's own Guard: never a second one
        if STATE.guard is None:
            STATE.guard = Guard()
    except Exception as exc:  # noqa: BLE001 - the training runs as it would, unguarded, and says so
        say(f"could not create a Guard for Model.{name} ({type(exc).__name__}: {exc}); it trains without one")
        return args, kwargs
    bound.arguments["callbacks"] = [STATE.guard, *items]
    attached(f"Guard attached to Model.{name} ({_caller()})")
    return tuple(bound.args[1:]), dict(bound.kwargs)


# -- a train cell stepped by hand --------------------------------------------------------------------------
def _cell_call(original: Callable) -> Callable:
    @functools.wraps(original)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.inside_cell or STATE.model_depth:
            return original(self, *args, **kwargs)
        step = _watched_step(self)
        if step is None:
            return original(self, *args, **kwargs)
        STATE.inside_cell = True
        try:
            return step(*args, **kwargs)
        finally:
            STATE.inside_cell = False

    setattr(__call__, MARK, True)
    return __call__


def _watched_step(cell: Any) -> Optional[Callable]:
    """The watched step of ``cell`` (made at its first call), or None: a step Guard or ``watch`` already counts (the
    script's own wiring), or a cell ``watch`` refuses."""
    known = STATE.watched.get(id(cell))
    if known is not None and known[0] is cell:
        return known[1] if outside_steps() else None
    if id(cell) in STATE.refused or not outside_steps():
        return None
    try:
        from ..watch import watch

        step = watch(cell, cell, getattr(cell, "optimizer", None))
    except Exception as exc:  # noqa: BLE001 - the cell trains as it would, unwatched, and says so
        STATE.refused.add(id(cell))
        say(f"cannot watch {type(cell).__name__} ({type(exc).__name__}: {exc}); it trains unwatched. Wrap its "
            f"step yourself: step = mindguard.watch(train_cell, train_cell, optimizer)")
        return None
    STATE.watched[id(cell)] = (cell, step)
    attached(f"watching {type(cell).__name__} stepped by hand ({_caller()}): each call is one training step; at "
              f"the first failure it raises mindguard.NonFiniteError")
    return step


# -- what cannot be attached -----------------------------------------------------------------------------------
def _optimizer_init(original: Callable) -> Callable:
    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if STATE.optimizer is None:
            STATE.optimizer = f"{type(self).__name__} at {_caller()}"
        STATE.optimizers.append(weakref.ref(self))
        return original(self, *args, **kwargs)

    setattr(__init__, MARK, True)
    return __init__


def _run_has_calls() -> bool:
    run_module = sys.modules.get("mindguard.training.run")
    run = getattr(run_module, "_RUN", None) if run_module is not None else None
    return bool(run is not None and run.calls)


def _at_exit() -> None:
    """A process that meant to train (a value_and_grad step, an optimizer) but had nothing attached says so last."""
    try:
        if STATE.attached or _run_has_calls() or os.environ.get("MS_ROLE") == "MS_SCHED":
            return
        if STATE.functional:
            say("no training was attached in this process: its value_and_grad loop needs the line said above")
        elif STATE.optimizer is not None and STATE.functional is None:
            text = (f"no training was attached in this process, which built an optimizer ({STATE.optimizer}): "
                    f"mindguard attaches to Model.train/fit and to an nn.TrainOneStepCell called by hand. Add "
                    f"callbacks=[mindguard.Guard()] to your training call, or wrap your step function:\n"
                    f"    train_step = mindguard.watch(train_step, net, optimizer)")
            say(text)
            tell_hunt(text)
    except Exception:  # noqa: BLE001 - the process is ending for its own reasons
        pass
