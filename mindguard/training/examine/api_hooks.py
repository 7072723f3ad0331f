"""Operator-level recording of one eager (PyNative) step: every primitive call, its source line and its gradients.

Why this route (measured on CPU, MindSpore 2.10; see ``mindguard/training/examine/replay.py`` for the numbers):
MindSpore has no per-operator hook in the PyNative executor (``_pynative_executor`` exposes none), and a GRAPH-mode dump
of the replayed step needs the network rebuilt in a fresh process (the dump config is read once per process) and a
network that compiles. Intercepting the Python entry points every eager operator goes through works in the training
process itself, for any network, compiled sub-cells included (``MS_JIT=0`` runs them eagerly):

* ``__call__`` of every Python ``Primitive`` subclass (``ops.log`` -> ``Log.__call__``, ``nn.Dense``'s
  ``MatMul``) and of the ``_Pyboost*Prim`` classes (``ops.softmax`` -> ``softmax_impl``);
* the C++-bound functional overloads (``mint.add``, ``ops.div`` -> ``functional_overload._add_instance``);
* ``mindspore.Tensor``'s arithmetic and math methods (``a - b``, ``x ** 2``, ``x.sum()``, ``x.sqrt()``), which
  are C++ methods in 2.10 and never reach a Python primitive.

Only the outermost intercepted call is recorded (a Primitive calling ``super().__call__`` is one op). Each
record keeps the op's input and output Tensors (their finiteness checked before and after the call, so an
in-place kernel such as BatchNorm's statistics update is seen as it was called), the Python stack (outermost
first) and the cell whose ``construct`` called it. Every recorded tensor gets a ``Tensor.register_hook``, so
the backward pass reports the gradient reaching each one (recording stops at the first gradient: the ops
called from then on belong to the backward pass or the update); :meth:`OpTape.vjp` re-derives one op's own input
gradients with ``mindspore.vjp`` when several ops share an input. Everything patched is restored when the context exits,
even on error.

Index bases: ``OpRecord.index`` is the 0-based position among the step's recorded forward calls; slots are
0-based; source lines are 1-based.
"""
from __future__ import annotations

import inspect
import linecache
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn

from ...analysis.evidence import unwritten_output_slots

_MS_DIR = os.path.dirname(os.path.abspath(ms.__file__)) + os.sep
_TRAINING_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_THIS_FILE = os.path.abspath(__file__)
# mindguard frames that end the user's stack (the replay / watch machinery calling the step)
_STOP_FILES = {os.path.join(_TRAINING_DIR, name) for name in ("examine/replay.py", "watch.py", "guard.py")}

# Tensor methods recorded, and the op type each is reported as (MindSpore's kernel names where one exists)
TENSOR_METHODS: Dict[str, str] = {
    "__add__": "Add", "__radd__": "Add", "add": "Add", "__iadd__": "Add",
    "__sub__": "Sub", "__rsub__": "Sub", "sub": "Sub", "subtract": "Sub", "__isub__": "Sub",
    "__mul__": "Mul", "__rmul__": "Mul", "mul": "Mul", "__imul__": "Mul",
    "__truediv__": "Div", "__rtruediv__": "Div", "div": "Div", "divide": "Div", "true_divide": "Div",
    "__itruediv__": "Div", "__floordiv__": "FloorDiv", "__rfloordiv__": "FloorDiv", "floor_divide": "FloorDiv",
    "__mod__": "Mod", "__rmod__": "Mod", "remainder": "Mod", "fmod": "Mod",
    "__pow__": "Pow", "__rpow__": "Pow", "pow": "Pow",
    "__matmul__": "MatMul", "__rmatmul__": "MatMul", "matmul": "MatMul", "mm": "MatMul", "dot": "Dot",
    "outer": "Outer", "addmm": "Addmm", "baddbmm": "Baddbmm", "addbmm": "Addbmm", "addmv": "Addmv",
    "__neg__": "Neg", "neg": "Neg", "negative": "Neg", "__abs__": "Abs", "abs": "Abs", "absolute": "Abs",
    "sqrt": "Sqrt", "rsqrt": "Rsqrt", "square": "Square", "reciprocal": "Reciprocal",
    "log": "Log", "log1p": "Log1p", "log2": "Log2", "log10": "Log10", "logit": "Logit", "xlogy": "Xlogy",
    "exp": "Exp", "expm1": "Expm1", "logsumexp": "LogSumExp", "logaddexp": "LogAddExp",
    "sigmoid": "Sigmoid", "tanh": "Tanh", "sinh": "Sinh", "cosh": "Cosh", "tan": "Tan", "sin": "Sin",
    "cos": "Cos", "asin": "Asin", "acos": "ACos", "atan": "Atan", "atan2": "Atan2", "acosh": "Acosh",
    "asinh": "Asinh", "atanh": "Atanh", "arcsin": "Asin", "arccos": "ACos", "arctan": "Atan",
    "erf": "Erf", "erfc": "Erfc", "sum": "ReduceSum", "nansum": "NanSum", "mean": "ReduceMean",
    "prod": "ReduceProd", "std": "Std", "var": "Var", "norm": "Norm", "renorm": "Renorm",
    "cumsum": "CumSum", "max": "ReduceMax", "min": "ReduceMin", "clamp": "Clamp", "clip": "Clamp",
    "lerp": "Lerp", "addcdiv": "Addcdiv", "addcmul": "Addcmul", "inverse": "MatrixInverse",
}


@dataclass
class OpRecord:
    """One recorded forward operator call.

    ``op_type``: the primitive's name (``"Log"``, ``"MatMul"``) or the op a Tensor method / functional overload
    stands for. ``api``: how it was called (``"Log.__call__"``, ``"Tensor.__sub__"``, ``"_add_instance"``).
    ``inputs``/``outputs``: ``(slot, Tensor)`` of the float/complex tensors among the flattened arguments and
    results (0-based slots over all tensors). ``inputs_finite`` was checked before the call, ``outputs_finite``
    after. ``input_stats`` are taken before the call for Parameters (an in-place kernel may change them).
    ``stack``: ``{"file", "line" (1-based), "code"}`` frames, outermost first, MindSpore's included;
    ``cell``/``cell_type``: the innermost cell whose ``construct`` made the call, ``cell_call`` which call of that
    cell in the step (1-based).
    """

    index: int
    op_type: str
    api: str
    call: Callable[..., Any]
    args: Tuple[Any, ...]
    kwargs: Dict[str, Any]
    inputs: List[Tuple[int, Any]]
    outputs: List[Tuple[int, Any]] = field(default_factory=list)
    inputs_finite: bool = True
    outputs_finite: bool = True
    input_stats: Dict[int, Dict[str, Any]] = field(default_factory=dict)
    stack: List[Dict[str, Any]] = field(default_factory=list)
    cell: Optional[str] = None
    cell_type: Optional[str] = None
    cell_call: int = 1
    output_struct: Any = None

    @property
    def source(self) -> Optional[Dict[str, Any]]:
        """The innermost frame outside MindSpore (the user's line calling the op, or the cell call reaching it)."""
        for frame in reversed(self.stack):
            if not frame["file"].startswith(_MS_DIR):
                return frame
        return None


class OpTape:
    """Context manager: record every eager operator call made while it is active (see the module docstring).

    ``network``: the cell whose sub-cells name the ops' ``cell`` (dotted names as ``cells_and_names`` gives
    them, passed through ``display``). ``eager_jit``: run ``@ms.jit`` functions and cells eagerly meanwhile
    (``MS_JIT=0``, MindSpore's own switch), so the ops inside them are recorded too.
    """

    def __init__(self, network: Optional[nn.Cell] = None, *, display: Callable[[str], str] = lambda n: n or "<root>",
                 eager_jit: bool = True):
        self.records: List[OpRecord] = []
        self.cells: Dict[int, Tuple[str, nn.Cell]] = {}
        if network is not None:
            self.cells = {id(cell): (display(name), cell) for name, cell in network.cells_and_names()}
        self.eager_jit = eager_jit
        self.grads: Dict[int, Dict[str, Any]] = {}     # id(tensor) -> {"finite", "order", "tensor"}
        self._patches: List[Tuple[Any, str, Any, bool]] = []   # (owner, name, original, owner had it in __dict__)
        self._state = threading.local()
        self._env_jit: Optional[str] = None
        self._hook_handles: List[Any] = []
        self._hooked: set = set()
        self._alive: List[Any] = []
        self._cell_frames: Dict[int, Any] = {}    # id(cell) -> frame of its latest construct call (kept alive)
        self.cell_calls: Dict[int, int] = {}      # id(cell) -> construct calls that ran recorded ops
        self._grad_order = 0
        self.recording = True
        self.error: Optional[str] = None   # mindguard's own failure while recording (then nothing more is recorded)
        self.raised: Optional[Tuple[OpRecord, BaseException]] = None   # the recorded op that raised, and what
        self._producers: Dict[int, OpRecord] = {}   # id(output tensor) -> the record that made it

    def producer_of(self, tensor: Any) -> Optional[OpRecord]:
        """The recorded op whose output ``tensor`` is (float outputs are recorded), or None."""
        return self._producers.get(id(tensor))

    # -- context ---------------------------------------------------------------------------------------------
    def __enter__(self) -> "OpTape":
        try:
            if self.eager_jit:
                self._env_jit = os.environ.get("MS_JIT")
                os.environ["MS_JIT"] = "0"
            for owner, name, api, op_type in _targets():
                self._patch(owner, name, api, op_type)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.restore()

    def restore(self) -> None:
        """Undo every patch, remove every gradient hook, and put ``MS_JIT`` back (idempotent)."""
        while self._patches:
            owner, name, original, owned = self._patches.pop()
            if owned:
                setattr(owner, name, original)
            else:
                try:
                    delattr(owner, name)
                except AttributeError:
                    setattr(owner, name, original)
        self.remove_gradient_hooks()
        self._cell_frames.clear()
        if self.eager_jit:
            if self._env_jit is None:
                os.environ.pop("MS_JIT", None)
            else:
                os.environ["MS_JIT"] = self._env_jit
            self.eager_jit = False

    # -- patching --------------------------------------------------------------------------------------------
    def _patch(self, owner, name: str, api: str, op_type: Optional[str]) -> None:
        owned = name in vars(owner)
        original = vars(owner)[name] if owned else getattr(owner, name)
        tape = self
        if isinstance(owner, type) and name == "__call__" and op_type is None:
            def wrapper(*args, **kwargs):   # a Primitive's __call__: the primitive is argument 0
                prim = args[0]
                return tape._record(lambda *a, **k: original(prim, *a, **k), _prim_name(prim), api, args[1:],
                                    kwargs)
        elif isinstance(owner, type):
            def wrapper(*args, **kwargs):   # an unbound method: self is argument 0
                return tape._record(lambda *a, **k: original(*a, **k), op_type, api, args, kwargs)
        else:
            def wrapper(*args, **kwargs):
                return tape._record(original, op_type, api, args, kwargs)
        hooked: Any = wrapper
        hooked.__wrapped__ = original
        hooked.__mindguard_tape__ = True
        setattr(owner, name, hooked)
        self._patches.append((owner, name, original, owned))

    def _record(self, call, op_type: str, api: str, args, kwargs):
        state = self._state
        if getattr(state, "depth", 0) or not self.recording or op_type.startswith("_"):
            return call(*args, **kwargs)   # nested in a recorded call, backward pass, or MindSpore's plumbing
        state.depth = 1
        try:
            record = OpRecord(len(self.records), op_type, api, call, args, kwargs, _tensors(args, kwargs))
            for slot, tensor in record.inputs:
                if isinstance(tensor, ms.Parameter):
                    from ...analysis.stats import tensor_stats
                    record.input_stats[slot] = tensor_stats(tensor.asnumpy())
            finite = True
            for _, tensor in record.inputs:
                try:
                    finite = _finite(tensor) and finite
                except KernelError as failed:   # an earlier op's kernel failed (PyNative runs them asynchronously)
                    self.raised = self.raised or (self._producers.get(id(tensor), record), failed.original)
                    raise failed.original from None
            record.inputs_finite = finite
            record.stack, record.cell, record.cell_type, record.cell_call = self._where(sys._getframe(2))  # pylint: disable=protected-access
        except KernelError:
            raise
        except (RuntimeError, TypeError, ValueError) as exc:
            if record is not None and self.raised is not None and exc is self.raised[1]:
                raise
            self._fail(f"recording the inputs of {op_type}", exc)
            record = None
        except Exception as exc:  # noqa: BLE001 - mindguard's own failure must not end or change the user's step
            self._fail(f"recording the inputs of {op_type}", exc)
            record = None
        finally:
            state.depth = 0
        state.depth = 1
        try:
            out = call(*args, **kwargs)
        except BaseException as exc:
            if record is not None and self.raised is None:   # the op the step stopped in
                self.raised = (record, exc)
            raise
        finally:
            state.depth = 0
        if record is None:
            return out
        try:
            record.outputs = _tensors((out,), {})
            record.output_struct = out
            for _, tensor in record.outputs:
                self._producers[id(tensor)] = record
            ignored = unwritten_output_slots(record.op_type)
            record.outputs_finite = all(_finite(t) for slot, t in record.outputs if slot not in ignored)
            self.records.append(record)
            for _, tensor in record.inputs + record.outputs:
                self._watch(tensor)
        except KernelError as failed:   # this op's kernel failed: it surfaces when its output is read
            self.raised = self.raised or (record, failed.original)
            raise failed.original from None
        except Exception as exc:  # noqa: BLE001 - mindguard's own failure: recorded, the user's step goes on
            self._fail(f"recording the outputs of {op_type}", exc)
        return out

    def _fail(self, what: str, exc: BaseException) -> None:
        """mindguard's own recording failed: keep the first error (:attr:`error`, with its traceback) and stop
        recording; the user's ops run on unrecorded."""
        if self.error is None:
            import traceback

            self.error = (f"{what}: {type(exc).__name__}: {exc}\n"
                          + "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-6:]))
        self.recording = False

    def _where(self, frame) -> Tuple[List[Dict[str, Any]], Optional[str], Optional[str], int]:
        frames: List[Dict[str, Any]] = []
        cell = cell_type = None
        cell_call = 1
        while frame is not None:
            filename = os.path.abspath(frame.f_code.co_filename)
            if filename in _STOP_FILES:
                break
            if filename != _THIS_FILE and not filename.startswith("<"):
                frames.append({"file": filename, "line": frame.f_lineno,
                               "code": linecache.getline(filename, frame.f_lineno).strip()})
                if cell is None and frame.f_code.co_name in ("construct", "forward"):   # forward: torch-style
                    owner = frame.f_locals.get("self")
                    known = self.cells.get(id(owner))
                    if known is not None:
                        cell, cell_type = known[0], type(owner).__name__
                        if self._cell_frames.get(id(owner)) is not frame:   # a new call of that cell
                            self._cell_frames[id(owner)] = frame
                            self.cell_calls[id(owner)] = self.cell_calls.get(id(owner), 0) + 1
                        cell_call = self.cell_calls[id(owner)]
            frame = frame.f_back
        return frames[::-1], cell, cell_type, cell_call

    # -- gradients -------------------------------------------------------------------------------------------
    def _watch(self, tensor) -> None:
        """A gradient hook on one recorded float tensor (not a Parameter: their gradients are the step's own
        result): it reports the total gradient reaching the tensor in the backward pass."""
        key = id(tensor)
        if key in self._hooked or isinstance(tensor, ms.Parameter):
            return
        self._hooked.add(key)
        self._alive.append(tensor)   # ids stay unique while the tape lives
        try:
            self._hook_handles.append(register_hook(tensor, self._gradient_hook(tensor)))
        except (RuntimeError, TypeError, ValueError):
            pass  # a tensor outside the gradient graph (constant, integer) gets no gradient
        except Exception as exc:  # noqa: BLE001 - mindguard's own failure: recorded, the user's step goes on
            self._fail("a gradient hook on a recorded tensor", exc)

    def _gradient_hook(self, tensor):
        key = id(tensor)

        def hook(grad):
            self.recording = False   # the backward pass began: ops called from here on are not the forward's
            self._grad_order += 1
            try:
                finite = _finite(grad)
            except KernelError as failed:
                raise failed.original from None
            self.grads[key] = {"finite": finite, "order": self._grad_order, "tensor": grad}
            return None
        return hook

    def remove_gradient_hooks(self) -> None:
        while self._hook_handles:
            handle = self._hook_handles.pop()
            try:
                handle.remove()
            except (RuntimeError, AttributeError):
                pass

    def vjp(self, record: OpRecord, out_grads: List[Any], values: Dict[int, Any]) -> Optional[List[Any]]:
        """``record``'s own gradients with respect to its tensor inputs (one per ``record.inputs`` entry, None
        where it has none), re-derived with ``mindspore.vjp`` from ``out_grads`` (one per ``record.outputs``
        entry; None = zero). ``values`` replaces inputs by ``id`` (a Parameter by its value when called).
        None when the op cannot be re-run."""
        slots = [slot for slot, _ in record.inputs]
        originals = [values.get(id(t), t) for _, t in record.inputs]
        if not originals:
            return None

        def rerun(*tensors):
            args, kwargs = _replace_tensors(record.args, record.kwargs, dict(zip(slots, tensors)))
            return record.call(*args, **kwargs)

        was = self.recording
        self.recording = False
        try:
            out, backward = ms.vjp(rerun, *originals)
            flat = [t for _, t in _tensors((out,), {})]
            cotangent = [g if g is not None else ms.ops.zeros_like(t) for g, t in zip(out_grads, flat)]
            sens = _rebuild(out, iter(cotangent))
            grads = backward(sens)
        except (RuntimeError, TypeError, ValueError):
            return None
        finally:
            self.recording = was
        grads = list(grads) if isinstance(grads, (tuple, list)) else [grads]
        return grads


# ------------------------------------------------------------------------------------------------ targets


def _targets() -> Iterator[Tuple[Any, str, str, Optional[str]]]:
    """``(owner, attribute, api label, op type or None = the primitive's name)`` of every entry point patched."""
    from mindspore.ops.primitive import Primitive

    seen = set()
    for klass in [Primitive, *_subclasses(Primitive)]:
        if "__call__" in vars(klass) and klass not in seen:
            seen.add(klass)
            yield klass, "__call__", f"{klass.__name__}.__call__", None
    try:
        from mindspore.ops.auto_generate import pyboost_inner_prim
    except ImportError:  # pragma: no cover - other MindSpore versions
        pyboost_inner_prim = None
    if pyboost_inner_prim is not None:
        for name, klass in vars(pyboost_inner_prim).items():
            if isinstance(klass, type) and name.startswith("_Pyboost") and "__call__" in vars(klass) \
                    and klass not in seen:
                seen.add(klass)
                yield klass, "__call__", f"{name}.__call__", None
    try:
        from mindspore.ops import functional_overload
    except ImportError:  # pragma: no cover
        functional_overload = None
    if functional_overload is not None:
        for name, value in list(vars(functional_overload).items()):
            match = re.fullmatch(r"_(\w+?)_instance", name)
            if match and callable(value):
                yield functional_overload, name, name, _camel(match.group(1))
    tensor = ms.Tensor
    for name, op_type in TENSOR_METHODS.items():
        if callable(getattr(tensor, name, None)):
            yield tensor, name, f"Tensor.{name}", op_type


def _subclasses(klass) -> Iterator[type]:
    stack = [klass]
    seen = set()
    while stack:
        current = stack.pop()
        for sub in current.__subclasses__():
            if sub not in seen:
                seen.add(sub)
                stack.append(sub)
                yield sub


def _camel(stem: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in stem.strip("_").split("_") if part)


def _prim_name(prim) -> str:
    name = getattr(prim, "name", None)
    if isinstance(name, str) and name:
        return name
    return re.sub(r"^_Pyboost|Prim_?$", "", type(prim).__name__) or type(prim).__name__


# ------------------------------------------------------------------------------------------------ tensors


def _is_float_tensor(value) -> bool:
    if not isinstance(value, ms.Tensor):
        return False
    try:
        return value.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16, ms.complex64, ms.complex128)
    except (RuntimeError, TypeError, AttributeError):
        return False


def _walk(value) -> Iterator[Any]:
    if isinstance(value, (tuple, list)):
        for item in value:
            yield from _walk(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _walk(item)
    else:
        yield value


def register_hook(tensor, hook):
    """MindSpore's ``Tensor.register_hook`` called as MindSpore defines it, not through the class attribute: another
    library may replace ``Tensor.register_hook`` with its own (mindnlp does, and its version fails on a plain MindSpore
    tensor). Falls back to the method when MindSpore's internals differ."""
    try:
        from mindspore._c_expression import TensorPy
        from mindspore.common.hook_handle import _TensorHookHandle
        from mindspore.common.tensor import check_hook_fn
    except ImportError:
        return _ORIGINAL_REGISTER_HOOK(tensor, hook)
    check_hook_fn(hook)
    handle = _TensorHookHandle(tensor)
    handle.id = TensorPy.register_hook(tensor, hook)
    return handle


_ORIGINAL_REGISTER_HOOK = vars(ms.Tensor).get("register_hook") or ms.Tensor.register_hook


def _tensors(args, kwargs) -> List[Tuple[int, Any]]:
    """``(slot, tensor)`` of every float tensor among ``args`` then ``kwargs`` (0-based over all Tensors)."""
    out = []
    slot = 0
    for value in _walk((tuple(args), dict(kwargs))):
        if isinstance(value, ms.Tensor):
            if _is_float_tensor(value):
                out.append((slot, value))
            slot += 1
    return out


def all_tensors(args, kwargs) -> List[Tuple[int, Any]]:
    """``(slot, tensor)`` of every Tensor among ``args`` then ``kwargs``, whatever its dtype (indices too)."""
    return [(slot, value) for slot, value in enumerate(v for v in _walk((tuple(args), dict(kwargs)))
                                                       if isinstance(v, ms.Tensor))]


def _replace_tensors(args, kwargs, replacement: Dict[int, Any]):
    counter = iter(range(1 << 30))

    def swap(value):
        if isinstance(value, tuple):
            return tuple(swap(v) for v in value)
        if isinstance(value, list):
            return [swap(v) for v in value]
        if isinstance(value, dict):
            return {k: swap(v) for k, v in value.items()}
        if isinstance(value, ms.Tensor):
            slot = next(counter)
            return replacement.get(slot, value)
        return value

    return swap(tuple(args)), swap(dict(kwargs))


def _rebuild(structure, values: Iterator[Any]):
    if isinstance(structure, tuple):
        return tuple(_rebuild(s, values) for s in structure)
    if isinstance(structure, list):
        return [_rebuild(s, values) for s in structure]
    if _is_float_tensor(structure):
        return next(values)
    return structure


class KernelError(Exception):
    """A MindSpore kernel failed, and its error surfaced when mindguard read a tensor (PyNative launches kernels
    asynchronously: a CPU Gather's out-of-range index is reported at the next read). ``original``: MindSpore's."""

    def __init__(self, original: BaseException):
        super().__init__(str(original))
        self.original = original


def _finite(tensor) -> bool:
    """Whether a recorded tensor holds no Inf/NaN (True for one that cannot be read). A kernel's failure surfacing
    on the read is raised as :class:`KernelError`, never taken for a finite value."""
    try:
        array = tensor.asnumpy()
    except RuntimeError as exc:
        if "C++ Call Stack" in str(exc) or re.search(r"For '\w+'", str(exc)):
            raise KernelError(exc) from None
        return True
    except (TypeError, AttributeError):
        return True
    return array.dtype.kind not in "fc" or bool(np.isfinite(array).all())


def source_of_construct(cell) -> Optional[Dict[str, Any]]:
    """The ``def construct`` line of ``cell``'s class (a last resort when no frame was recorded)."""
    try:
        construct = type(cell).construct
        source = inspect.getsourcefile(construct)
        if source is None:
            return None
        filename = os.path.abspath(source)
        lines, start = inspect.getsourcelines(construct)
        return {"file": filename, "line": start, "code": lines[0].strip()}
    except (TypeError, OSError):
        return None
