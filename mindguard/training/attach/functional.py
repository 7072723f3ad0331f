"""A functional training loop attached as it is: ``mindspore.value_and_grad`` + a ``train_step`` + a loop.

No call of such a loop says "one training step" by itself, so the step function is found from facts MindSpore's own
calls give, and wrapped as ``train_step = mindguard.watch(train_step, net, optimizer)`` would wrap it:

* **eager** (PyNative, no ``jit``): ``value_and_grad`` returns its gradient function wrapped
  (``functools.wraps``: a graph that calls it compiles MindSpore's own, measured in docs/mindspore-facts.md,
  section ``attach``). Its first call outside any training step comes from the step function: the caller's frame.
  That function is rebound, in the scope its loop calls it from (the loop's local or global name), to the watched
  step, so every later call is one watched step at no cost but ``watch``'s. The call in progress is the run's first
  step: it is begun there and ended when the step function returns (a trace on that one frame, for that one step).
  A step function the loop reaches some other way (an attribute, a container) is watched the same way at each call;
* **compiled** (``jit(train_step)`` or ``@jit`` in the script; MindSpore's own uses are left as they are):
  ``mindspore.jit`` returns the compiled function wrapped; at its
  first call outside a training step, a function whose code reaches a gradient function ``value_and_grad`` made is
  the step function and is watched from then on.

The network is the Cell the forward function (``value_and_grad``'s first argument) reaches with the most trainable
Parameters; the optimizer is the one the step function reaches (or the process's only one). The loss is the value
the gradient function returned in the step (eager), else the step's return value (its first element).

No cell and no Parameter is added; the loop calls MindSpore's functions with the same arguments and gets what they
return. What cannot be found (a step reached in a way no frame shows) is said at its first step, with the line to add.
"""
from __future__ import annotations

import ctypes
import functools
import inspect
import os
import sys
import types
from typing import Any, Callable, Dict, List, Optional, Tuple

from .notes import say
from .state import MARK

GRAD_MARK = "__mindguard_grad_function__"


class GradFunction:
    """What one ``value_and_grad`` call made: its forward function and the values its calls returned in a step."""

    def __init__(self, forward: Any, has_aux: bool, made_at: Tuple[str, int]) -> None:
        self.forward = forward
        self.has_aux = has_aux
        self.made_at = made_at   # (file, line) of the value_and_grad call
        self.values: List[Any] = []   # the losses of the step in progress (eager calls only)

    def take_loss(self) -> Any:
        """The loss of the step that just ended (the first non-finite one when several calls ran; None: no eager
        call ran, as in a compiled step). Clears it for the next step."""
        values, self.values = self.values, []
        for value in values:
            if _nonfinite(value):
                return value
        return values[0] if values else None


def _nonfinite(value: Any) -> bool:
    try:
        import numpy as np

        return not bool(np.isfinite(value.asnumpy()).all())
    except Exception:  # noqa: BLE001 - not a Tensor: the check reads it as it is
        return False


def _loss_part(value: Any, has_aux: bool) -> Any:
    """The loss in a forward function's value: its first element when it returns several (``has_aux`` or not)."""
    return value[0] if isinstance(value, (tuple, list)) and value else value


# -- value_and_grad ----------------------------------------------------------------------------------------
def value_and_grad(original: Callable) -> Callable:
    """``mindspore.value_and_grad`` whose gradient function is wrapped (same arguments, same result)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **kwargs)
        if _library_frame(sys._getframe(1)):
            return made   # MindSpore's own use (or mindguard's): as it is
        try:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            caller = sys._getframe(1)
            grad = GradFunction(bound.arguments.get("fn"), bool(bound.arguments.get("has_aux")),
                                (caller.f_code.co_filename, caller.f_lineno))
            return _grad_function(made, grad)
        except Exception:  # noqa: BLE001 - MindSpore's own function, unwrapped, as the script would get it
            return made

    setattr(patched, MARK, True)
    return patched


def _grad_function(made: Callable, grad: GradFunction) -> Callable:
    @functools.wraps(made)
    def grad_function(*args: Any, **kwargs: Any) -> Any:
        if _outside_training():
            try:
                _attach_caller(sys._getframe(1), grad)
            except Exception as exc:  # noqa: BLE001 - the loop trains as it would, unwatched, and says so
                _cannot(f"could not attach to the functional step ({type(exc).__name__}: {exc})", None, grad)
        out = made(*args, **kwargs)
        if isinstance(out, tuple) and len(out) == 2:
            grad.values.append(_loss_part(out[0], grad.has_aux))
        return out

    setattr(grad_function, GRAD_MARK, grad)
    return grad_function


# -- jit -----------------------------------------------------------------------------------------------------
def jit(original: Callable) -> Callable:
    """``mindspore.jit`` whose compiled plain functions are wrapped: the step function among them is watched."""

    @functools.wraps(original)
    def patched(*args: Any, **kwargs: Any) -> Any:
        made = original(*args, **kwargs)
        if _library_frame(sys._getframe(1)):
            return made   # MindSpore's own use (or mindguard's): as it is
        function = args[0] if args else kwargs.get("function")
        if function is None and callable(made):   # @jit(...): a decorator
            decorator = made

            @functools.wraps(decorator)
            def decorate(fn: Any) -> Any:
                return _maybe_step(decorator(fn))
            return decorate
        return _maybe_step(made)

    setattr(patched, MARK, True)
    return patched


def _maybe_step(jitted: Any) -> Any:
    """``jitted`` wrapped when it may be a step function: a plain compiled function that is not a method."""
    if not isinstance(jitted, types.FunctionType) or not getattr(jitted, "__wrapped_by_jit__", False):
        return jitted
    inner = inspect.unwrap(jitted)
    params = list(inspect.signature(inner).parameters)
    if params and params[0] in ("self", "cls"):
        return jitted
    decided: List[Any] = []   # [watched step] or [None]: not a step function

    @functools.wraps(jitted)
    def compiled_function(*args: Any, **kwargs: Any) -> Any:
        if not decided:
            if not _outside_training():
                return jitted(*args, **kwargs)
            decided.append(_watch_compiled(jitted))
        watched = decided[0]
        if watched is None or not _outside_training():
            return jitted(*args, **kwargs)
        return watched(*args, **kwargs)

    setattr(compiled_function, MARK, True)
    return compiled_function


def _watch_compiled(jitted: Any) -> Any:
    grads = [obj for obj in _reached(jitted) if getattr(obj, GRAD_MARK, None) is not None]
    if not grads:
        return None
    grad: GradFunction = getattr(grads[0], GRAD_MARK)
    return _watched(jitted, grad, f"{getattr(inspect.unwrap(jitted), '__name__', 'train_step')} (compiled)")


# -- the step function of an eager loop ----------------------------------------------------------------------
#: (id of a method's object, id of the function) -> (the function, its watched step)
_WATCHED: Dict[Tuple[int, int], Tuple[Any, Any]] = {}


def _attach_caller(frame: Any, grad: GradFunction) -> None:
    """The gradient function was called outside any training step from ``frame``: that frame runs the step
    function. Watch it (once per function object: a loop that makes its step anew each epoch gets one each), bind the
    watched step where the loop finds it, and begin this call as a watched step."""
    if _library_frame(frame):
        return
    code, loop = frame.f_code, frame.f_back
    function = _function_of(code, loop) or _method_of(code, frame)
    if function is None:
        _cannot(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} calls a value_and_grad gradient function "
                f"from `{code.co_name}`, which mindguard could not find as a function its loop calls", code, grad)
        return
    key = (id(getattr(function, "__self__", None)), id(getattr(function, "__func__", function)))
    known = _WATCHED.get(key)
    watched = known[1] if known is not None and known[0] is getattr(function, "__func__", function) else None
    if watched is None:
        watched = _watched(function, grad, code.co_name)
        if watched is None:
            return
        _WATCHED[key] = (getattr(function, "__func__", function), watched)
    _rebind(code, loop, frame, watched)
    _finish_when_returns(frame, watched)


def _watched(function: Any, grad: GradFunction, name: str) -> Any:
    from .state import attached
    from ..watch import watch

    network = _network(grad.forward)
    optimizer = _optimizer(function)
    try:
        step = watch(function, network if network is not None else optimizer, optimizer)
    except Exception as exc:  # noqa: BLE001 - the loop trains as it would, unwatched, and says so
        _cannot(f"cannot watch the functional step `{name}` ({type(exc).__name__}: {exc})", None, grad)
        return None
    step._loss_of = functools.partial(_loss_of, grad)   # type: ignore[attr-defined]
    step._drop_loss = grad.take_loss   # type: ignore[attr-defined]
    attached(f"watching the functional step `{name}` ({_where(function)}): each call is one training step; at the "
             f"first failure it raises mindguard.NonFiniteError")
    return step


def _loss_of(grad: GradFunction, out: Any) -> Any:
    """The loss of the step that returned ``out``: the gradient function's value (eager), else ``out``'s first
    element when it is a Tensor (compiled), else None (no loss to read: the Parameters are still checked)."""
    loss = grad.take_loss()
    if loss is not None:
        return loss
    first = out[0] if isinstance(out, (tuple, list)) and out else out
    import mindspore as ms

    return first if isinstance(first, ms.Tensor) else None


def _finish_when_returns(frame: Any, watched: Any) -> None:
    """Begin a step of ``watched`` now, inside the step function's ``frame``, and end it when that frame returns
    (its return value is the step's output; an exception leaving it is the step's). Only this frame is traced."""
    opened = watched._open()
    skipped = opened.info.skipped
    if skipped:   # a resumed pass's step before the kept one, already running: it leaves the Parameters as it found
        saved = _saved_parameters(watched)   # them, as a skipped call does (the kept state loads at its step)
    else:
        from ..run import current_run

        current_run().enter()
    previous_global = sys.gettrace()
    previous_local = frame.f_trace
    raised: List[BaseException] = []

    def local(traced: Any, event: str, arg: Any) -> Any:
        if previous_local is not None:
            previous_local(traced, event, arg)
        if traced is not frame:
            return local
        if event == "exception":
            raised[:] = [arg[1]]
        elif event == "return":
            frame.f_trace = previous_local
            if previous_global is None:
                sys.settrace(None)
            if skipped:
                _put_back(saved)
                if watched._drop_loss is not None:   # (its loss is no later step's)
                    watched._drop_loss()
            elif arg is None and raised:
                watched._raised(raised[0])
            else:
                watched._close(opened, arg, ())
        return local

    frame.f_trace_lines = False
    frame.f_trace = local
    if previous_global is None:
        sys.settrace(_untraced)   # (tracing on, so that this frame's return is seen; no other frame is traced)


def _untraced(frame: Any, event: str, arg: Any) -> None:
    return None


def _saved_parameters(watched: Any) -> List[Tuple[Any, Any]]:
    """Copies of the Parameters of the watched step's kept state (its network's and optimizer's), to put back when
    the step returns."""
    from ..state.state_files import state_parameters

    return [(param, param.value().copy()) for param in state_parameters(watched._net, watched._optimizer)]


def _put_back(saved: List[Tuple[Any, Any]]) -> None:
    """Put the copies :func:`_saved_parameters` took back, into each Parameter's own memory where ``asnumpy()`` views
    it (CPU): after a graph ran on a Parameter, ``set_data`` gives it new memory the optimizer's graph of an eager step
    does not follow (measured: the step after the kept one then computes otherwise, docs/mindspore-facts.md)."""
    from ..state.resumer import copy_into

    for param, value in saved:
        if not copy_into(param, value.asnumpy()):
            param.set_data(value)


# -- finding things --------------------------------------------------------------------------------------------
def _outside_training() -> bool:
    """Outside Model.train/fit, an attached train cell's step, and any step Guard or watch counts."""
    from .state import STATE, outside_steps

    return not (STATE.model_depth or STATE.inside_cell) and outside_steps()


def _library_frame(frame: Any) -> bool:
    name = frame.f_globals.get("__name__", "") or ""
    return name == "mindspore" or name.startswith(("mindspore.", "mindguard."))


def _code_of(value: Any) -> Any:
    fn = getattr(value, "__func__", value)
    return getattr(fn, "__code__", None)


def _function_of(code: Any, loop: Any) -> Any:
    """The function object of ``code`` in the scope of the frame ``loop`` that called it (its locals, then its
    globals); None when the loop reaches it some other way."""
    if loop is None:
        return None
    for scope in (loop.f_locals, loop.f_globals):
        for value in list(scope.values()):
            if _code_of(value) is code:
                return value
    return None


def _method_of(code: Any, frame: Any) -> Any:
    """The bound method ``self.<name>`` whose code ``frame`` runs (a trainer's step method), or None."""
    owner = frame.f_locals.get("self")
    method = getattr(owner, code.co_name, None) if owner is not None else None
    return method if _code_of(method) is code else None


def _rebind(code: Any, loop: Any, frame: Any, watched: Any) -> Optional[str]:
    """Bind ``watched`` to the names the loop's frame finds the step function by (its local or global name; a
    trainer object's attribute for a step method). Returns the name, or None when the loop reaches it some other way
    (each call is then watched as it begins, :func:`_finish_when_returns`)."""
    local_names = [name for name, value in loop.f_locals.items() if _code_of(value) is code] if loop else []
    if local_names:
        if loop.f_locals is loop.f_globals:
            for name in local_names:
                loop.f_globals[name] = watched
            return local_names[0]
        values = loop.f_locals
        for name in local_names:
            values[name] = watched
        ctypes.pythonapi.PyFrame_LocalsToFast(ctypes.py_object(loop), ctypes.c_int(0))
        return local_names[0]
    global_names = [name for name, value in loop.f_globals.items() if _code_of(value) is code] if loop else []
    for name in global_names:
        loop.f_globals[name] = watched
    if global_names:
        return global_names[0]
    from mindspore import nn

    owner = frame.f_locals.get("self")
    if owner is not None and not isinstance(owner, nn.Cell) and hasattr(owner, "__dict__") \
            and not code.co_name.startswith("__"):
        owner.__dict__[code.co_name] = watched   # (the instance's attribute, before its class's method)
        return code.co_name
    return None


def _reached(function: Any) -> List[Any]:
    """The objects a function's code reaches by name (:func:`~mindguard.training.checks.params.named_objects`, nested
    functions' code included) and, for a method, what its object holds under the names the code uses."""
    from ..checks.params import named_objects

    objects, names = named_objects(function, nested=True)
    owner = getattr(function, "__self__", None)   # a method: what its object holds (self.network, self.optimizer)
    if owner is not None:
        from mindspore import nn

        if isinstance(owner, nn.Cell):
            objects.append(owner)
        elif hasattr(owner, "__dict__"):
            objects.extend(value for name, value in vars(owner).items() if name in names)
    return objects


def _network(forward: Any) -> Any:
    """The Cell the forward function trains: itself when it is a Cell, else the Cell it reaches with the most
    trainable Parameters (None: none)."""
    from mindspore import nn

    if isinstance(forward, nn.Cell):
        return forward
    cells: List[Tuple[int, Any]] = []
    for obj in _reached(forward) if forward is not None else []:
        if isinstance(obj, nn.Cell) and not isinstance(obj, nn.Optimizer):
            cells.append((len(obj.trainable_params()), obj))
    cells = [item for item in cells if item[0]]
    return max(cells, key=lambda item: item[0])[1] if cells else None


def _optimizer(function: Any) -> Any:
    from mindspore import nn

    from .state import STATE

    for obj in _reached(function):
        if isinstance(obj, nn.Optimizer):
            return obj
    built = [ref() for ref in STATE.optimizers]
    built = [opt for opt in built if opt is not None]
    return built[0] if len(built) == 1 else None


def _where(function: Any) -> str:
    code = _code_of(inspect.unwrap(function))
    if code is None:
        return "?"
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def _cannot(text: str, code: Any, grad: GradFunction) -> None:
    """Said once per step function (``code``; None: once per process for mindguard's own trouble), with the line to
    add where the script builds its step (:mod:`.advice`)."""
    from .advice import functional_advice
    from .state import STATE, tell_hunt

    key = code if code is not None else "own"
    if key in STATE.refused:
        return
    STATE.refused.add(key)
    path, lineno = grad.made_at
    try:
        with open(path, encoding="utf-8") as handle:
            advice = functional_advice(handle.read(), lineno)
    except (OSError, ValueError, SyntaxError):
        advice = functional_advice("", lineno)
    full = (f"{text}; the loop trains unwatched. Add this line to {os.path.basename(path)} {advice.where}, and "
            f"`import mindguard` at its top:\n    {advice.line}")
    STATE.functional = full
    say(full)
    tell_hunt(full)
