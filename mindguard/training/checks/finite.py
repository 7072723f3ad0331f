"""The finiteness engine: is this step's loss finite, did it refuse its update, are the Parameters it wrote finite?

Shared by :class:`mindguard.training.locator.FailureLocator` (``Model.train``), :func:`mindguard.watch` (functional
loops) and :class:`mindguard.nn.protect.GuardedTrainStep` (in-graph refusal):

* :class:`AllFinite` -- one compiled, fused, overflow-safe reduction over many tensors (inside a graph).
* :class:`ParamChecker` -- after a step, a cheap alarm over every Parameter the step wrote, and the exact
  per-Parameter check only when it rings: host BLAS over zero-copy views on CPU for up to
  :data:`HOST_CHECK_MAX_BYTES` of Parameters; beyond that and on GPU/Ascend the compiled :class:`AllFinite`
  sums, one float per Parameter (exact, no false alarm), launched after the step and read when the verdict
  is due (:meth:`ParamChecker.start`/:meth:`ParamChecker.finish`).
* :class:`OutputChecker` -- reads a step's output: a loss, ``(loss, refused)`` of a GuardedTrainStep,
  ``(loss, overflow, scale)`` of a loss-scale cell, or any tuple whose first element is the loss.

The fused reduction. An exact ``isfinite(g).all()`` per gradient costs as much as a plain step on CPU
(docs/mindspore-facts.md, "Cost of finiteness checks"). Instead each gradient ``g`` (viewed as ``r x c``) is
summed with two matrix products, ``(w_r * ones(1, r)) @ g @ (w_c * ones(c, 1))``: NaN or +-Inf anywhere
makes the result non-finite. The weights ``w = 2**-(ceil(log2 n) + 1)`` are exact powers of two that
keep every partial sum of finite values below half the float range, so a finite gradient can never
overflow into a false alarm (multiplying by them can only underflow, which yields 0, never Inf/NaN). float16/bfloat16
gradients are cast to float32 first (exact); other dtypes (float64) are summed as ``sum(g * 0)``: 0 when finite, NaN
otherwise (exact, cannot overflow).
"""
from __future__ import annotations

import math
import numbers
import os
import time
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import Tensor, nn, ops
from mindspore.common import dtype as mstype

from ..._util.names import summarized
from .loss_scale import LossScaleRule

_MATMUL_CHECKED = (mstype.float32, mstype.float16, mstype.bfloat16)


def refused_flag(outputs: Any) -> Optional[bool]:
    """Read a training step's output as ``GuardedTrainStep``'s ``(loss, refused)``.

    Returns whether the update was refused, or ``None`` when ``outputs`` is not of that form (a 2-tuple
    whose second item is a bool Tensor) -- e.g. a plain loss, or a loss-scale cell's 3-tuple.
    """
    if not isinstance(outputs, (tuple, list)) or len(outputs) != 2:
        return None
    flag = outputs[1]
    if not isinstance(flag, Tensor) or flag.dtype != mstype.bool_:
        return None
    return bool(flag.item()) if flag.size == 1 else bool(np.asarray(flag.asnumpy()).any())


def _split_2d(shape: Tuple[int, ...]) -> Tuple[int, int]:
    """View a contiguous tensor of ``shape`` as ``(rows, cols)``: split its dims where the two sides are
    closest in size (a balanced matrix keeps both matrix products fast)."""
    if len(shape) == 0:
        return 1, 1
    total = int(np.prod(shape))
    best = (1, total)
    for k in range(len(shape) + 1):
        rows = int(np.prod(shape[:k])) if k else 1
        cols = total // rows if rows else 0
        if abs(math.log2(max(rows, 1)) - math.log2(max(cols, 1))) < abs(
                math.log2(max(best[0], 1)) - math.log2(max(best[1], 1))):
            best = (rows, cols)
    return best


def _overflow_safe_weight(n: int) -> float:
    """Power of two ``2**-(ceil(log2 n) + 1)``: a sum of ``n`` finite float values, each multiplied by it,
    stays below half the largest float (no overflow)."""
    return 2.0 ** -(math.ceil(math.log2(max(n, 1))) + 1)


_tensor_sum = ops.MultitypeFuncGraph("mindguard_tensor_sum")


@_tensor_sum.register("Tensor", "Tensor", "Tensor")
def _matmul_sum(row_w, col_w, tensor):
    """A float32/float16/bfloat16 tensor viewed as ``rows x cols`` (the weights' lengths), summed by two matrix
    products with overflow-safe weights; shape ``(1,)``. Column sums first, ``(1, r) @ (r, c)``: measured ~1.5x
    faster on CPU than ``(r, c) @ (c, 1)`` first."""
    matrix = ops.reshape(ops.cast(tensor, mstype.float32), (row_w.shape[1], col_w.shape[0]))
    return ops.reshape(ops.matmul(ops.matmul(row_w, matrix), col_w), (1,))


@_tensor_sum.register("Number", "Number", "Tensor")
def _exact_sum(row_w, col_w, tensor):
    """Any other tensor (float64, empty): ``sum(t * 0)`` -- finite * 0 is 0, Inf * 0 and NaN * 0 are NaN: exact,
    cannot overflow; an empty tensor sums to 0. Shape ``(1,)``."""
    return ops.reshape(ops.cast(ops.reduce_sum(tensor * 0), mstype.float32), (1,))


class AllFinite(nn.Cell):
    """``all_finite(loss, grads) -> bool scalar Tensor``: True when ``loss`` and every tensor of ``grads``
    (one per entry of ``params``, same shapes and dtypes) hold only finite values.

    One fused reduction: float32/float16/bfloat16 gradients are summed by two matrix products with
    overflow-safe power-of-two weights (see the module docstring), the sums and the loss go through a
    single ``isfinite(...).all()``; other dtypes (float64) are summed exactly as ``sum(g * 0)``.

    The per-tensor sums are one ``HyperMap`` over the tensors, not a Python loop: a loop unrolled into a graph
    nests one call per tensor and exceeds MindSpore's call-depth limit (1000) at ~500 tensors, and its compile
    time grows faster than the count (measured, docs/mindspore-facts.md, section "checks").
    """

    def __init__(self, params):
        super().__init__(auto_prefix=False)
        row_ws: List[Any] = []
        col_ws: List[Any] = []
        for param in params:
            if param.size > 0 and param.dtype in _MATMUL_CHECKED:
                rows, cols = _split_2d(tuple(param.shape))
                row_ws.append(Tensor(np.full((1, rows), _overflow_safe_weight(rows), np.float32)))
                col_ws.append(Tensor(np.full((cols, 1), _overflow_safe_weight(cols), np.float32)))
            else:   # a number instead of the weights selects the exact sum
                row_ws.append(0.0)
                col_ws.append(0.0)
        self.row_ws, self.col_ws = tuple(row_ws), tuple(col_ws)
        self.hyper_map = ops.HyperMap()

    def sums(self, loss, grads):
        """A float32 vector: the loss, then one overflow-safe sum per tensor of ``grads`` (``0`` for an empty
        one). Each entry is non-finite exactly when its tensor holds NaN/Inf."""
        loss_sum = ops.reshape(ops.cast(loss, mstype.float32), (1,))
        if not self.row_ws:
            return loss_sum
        return ops.concat((loss_sum, ops.concat(self.hyper_map(_tensor_sum, self.row_ws, self.col_ws, grads), 0)), 0)

    def construct(self, loss, grads):
        return ops.isfinite(self.sums(loss, grads)).all()


class CompiledAllFinite(nn.Cell):
    """One compiled graph over a group of parameters (:class:`ParamChecker` makes one per
    :data:`COMPILED_CHUNK` of them): :class:`AllFinite`'s fused, overflow-safe sums (the reduction
    GuardedTrainStep applies to gradients), one float32 per parameter, so that only that small vector leaves the
    device and a non-finite entry names its parameter exactly."""

    def __init__(self, params: Sequence[ms.Parameter]):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.all_finite = AllFinite(params)
        self.zero = ms.Tensor(0.0, ms.float32)

    @ms.jit
    def construct(self):
        return self.all_finite.sums(self.zero, self.params)[1:]


class StartedCheck:
    """A parameter check begun after a step (:meth:`ParamChecker.start`); :meth:`ParamChecker.finish` reads it.

    On the host it is already done (``names`` is set); on a device ``sums`` is the launched reduction's output,
    which the device computes in stream order -- reading it one step later waits for this check only, not for
    the step launched after it."""

    __slots__ = ("names", "sums", "param_sum", "false_alarm")

    def __init__(self, names: Optional[List[str]] = None, sums: Optional[List[Any]] = None,
                 param_sum: Optional[float] = None,
                 false_alarm: bool = False):
        self.names, self.sums, self.param_sum, self.false_alarm = names, sums, param_sum, false_alarm


def dump_armed() -> bool:
    """True when MindSpore's data dump is armed for this process (``MINDSPORE_DUMP_CONFIG`` is set)."""
    return bool(os.environ.get("MINDSPORE_DUMP_CONFIG"))


def under_hunt() -> bool:
    """True in a process that ``mindguard hunt`` runs (one of its passes)."""
    from ...protocol.request import under_hunt as _under_hunt

    return _under_hunt()


def compiled_check_unsafe() -> bool:
    """Whether a compiled parameter check must not run in this process: while a dump is armed -- it is a kernel
    graph of its own, which the dump would record beside the training's, and whose runs hide the training graph's
    from the execution-order record the hunt reads iterations from (measured) -- and in every pass of ``mindguard
    hunt``, so that all passes compute the same trace (a resumed pass compares its sum of squares of the Parameters
    with the one pass 1 kept, and only the host check computes it)."""
    return dump_armed() or under_hunt()


HOST_CHECK_MAX_BYTES = 3 * 2 ** 20
"""On CPU, Parameters of at most this many bytes in all are checked on the host, more by the compiled check.

Measured (docs/mindspore-facts.md, "A host read of the Parameters slows the next step"): numpy reading the
Parameters between two steps takes ~0.1 ms per 7.4 MB, but with MindSpore's compute threads on distinct cores the
*next step* then runs ~1.5 ms longer (0.6 ms at 3.7 MB, ~0.1 ms at 1.1 MB); reading another buffer of the same size
does not slow it. The compiled check costs a launch of ~0.4 ms at 7.4 MB (~0.3 ms at 1 MB) and no more."""


def on_device() -> bool:
    """True when MindSpore runs on GPU/Ascend (kernels launch asynchronously there)."""
    return ms.get_context("device_target") != "CPU"


COMPILED_MAX_PARAMS = 64
"""On CPU, more Parameters than this are checked on the host whatever their bytes.

Measured (docs/mindspore-facts.md, section "checks"): the compiled check launches a few kernels per Parameter, so
its call costs ~20 us a Parameter (510 Parameters: ~10-14 ms; 5,000: ~150 ms), and compiling it takes ~1.5 s at 510
Parameters and ~46 s at 5,000; the host check of 510 Parameters holding 20 MB takes ~1.2 ms, of 5,000 small ones
~4 ms, and compiles nothing."""

COMPILED_CHUNK = 512
"""Parameters per compiled check graph (GPU/Ascend, or a few large Parameters on CPU): several graphs over a larger
model, each compiling in ~1.5 s (measured on CPU at 510 Parameters), none near MindSpore's call-depth limit."""


def host_check_by_default(params: Optional[Sequence[ms.Parameter]] = None) -> bool:
    """Whether :class:`ParamChecker` checks ``params`` on the host: wherever :func:`compiled_check_unsafe`, and on
    CPU when they hold at most :data:`HOST_CHECK_MAX_BYTES` or are more than :data:`COMPILED_MAX_PARAMS`
    (``params=None``: on CPU)."""
    if compiled_check_unsafe():
        return True
    if on_device():
        return False
    if params is None:
        return True
    counted = [p for p in params if p.size > 0]
    return len(counted) > COMPILED_MAX_PARAMS or sum(_nbytes(p) for p in counted) <= HOST_CHECK_MAX_BYTES


def _nbytes(param: ms.Parameter) -> int:
    itemsize = getattr(param, "itemsize", None)   # Tensor.itemsize; 4 (float32) where a version lacks it
    return int(param.size) * (itemsize if isinstance(itemsize, int) else 4)


class ParamChecker:
    """A cheap alarm on the hot path; an exact per-parameter check only when it rings.

    The alarm is one reduction over every parameter: on CPU, where ``Parameter.asnumpy()`` is a
    zero-copy view of the parameter's memory, the sum of squares ``x @ x`` by BLAS over those views (no
    copy, no graph launch: ~0.01 ms for 0.3 MB, against ~0.3 ms to launch the compiled reduction), NaN/Inf
    whenever any element is, and also on finite values whose squares overflow float32 (``false_alarms``
    counts alarms the exact check cleared); on GPU/Ascend, for more than :data:`HOST_CHECK_MAX_BYTES` on
    CPU, or with ``on_host=False``, the compiled :class:`CompiledAllFinite`: one float per Parameter leaves
    the device, exact, when :meth:`finish` reads it. The default is :func:`host_check_by_default`.
    """

    def __init__(self, params: Sequence[ms.Parameter], *, on_host: Optional[bool] = None):
        self.params = [p for p in params if p.size > 0]
        if on_host is None:
            on_host = host_check_by_default(self.params)
        self.on_host = on_host
        self._has_data_ptr = bool(self.params) and callable(getattr(self.params[0], "data_ptr", None))
        self.compiled: Optional[List[CompiledAllFinite]] = None
        if self.params and not on_host:
            self.compiled = [CompiledAllFinite(self.params[i:i + COMPILED_CHUNK])
                             for i in range(0, len(self.params), COMPILED_CHUNK)]
        self._compiled_at = self._pointers() if self.compiled is not None else None
        self._first_launch = True
        self.setup_seconds = 0.0   # compile time not yet charged to a budget (take_setup_seconds)
        self.fell_back: Optional[str] = None   # why the compiled check was replaced by the host check
        self.false_alarms = 0
        self.last_sum: Optional[float] = None   # the host alarm's sum of squares after the last check
        self._views: List[Optional[tuple]] = [None] * len(self.params)   # (data pointer, flat view or None)
        # only a CPU Parameter's asnumpy() is a view of its memory; on a device it is a copy, taken again every check
        self._keep_views = self._has_data_ptr and not on_device()

    def checks(self, params: Sequence[ms.Parameter]) -> bool:
        """True if this checker covers exactly ``params`` (the same Parameter objects, in order), and -- for the
        compiled check -- in the memory it was compiled with: measured in PyNative, a ``@jit`` check keeps reading a
        Parameter's old memory after ``set_data`` (a checkpoint loaded between two training calls)."""
        same = [id(p) for p in params if p.size > 0] == [id(p) for p in self.params]
        return same and (self._compiled_at is None or self._compiled_at == self._pointers())

    def _pointers(self) -> Optional[List[int]]:
        if not self._has_data_ptr:
            return None
        return [p.data_ptr() for p in self.params]

    def _host_views(self) -> List[np.ndarray]:
        """Flat zero-copy views of the parameters' memory, kept between steps: ``asnumpy()`` costs ~4 µs a
        Parameter (numpy parses the buffer's format in Python), ``data_ptr()`` 0.2 µs, so a view is made again
        only when its Parameter's memory moved (``set_data``, a reload). fp16/bf16 are copied to fp32 each time
        (BLAS has no half-precision dot). On GPU/Ascend (the host path runs there while a dump is armed) every
        check copies every Parameter to the host: a kept copy would not follow the device's writes."""
        out = []
        for i, p in enumerate(self.params):
            pointer = p.data_ptr() if self._keep_views else None
            cached = self._views[i]
            if pointer is None or cached is None or cached[0] != pointer:
                flat = p.asnumpy().reshape(-1)
                cached = self._views[i] = (pointer, flat if flat.dtype in (np.float32, np.float64) else None)
            out.append(cached[1] if cached[1] is not None else p.asnumpy().reshape(-1).astype(np.float32))
        return out

    def _alarm(self) -> bool:
        total = 0.0
        for flat in self._host_views():
            total += float(np.dot(flat, flat))
        self.last_sum = total
        return not math.isfinite(total)

    def exact_nonfinite_names(self) -> List[str]:
        """The names of the Parameters holding NaN/Inf, each checked exactly (the slow path)."""
        return [p.name for p in self.params if not np.isfinite(p.asnumpy()).all()]

    def start(self) -> StartedCheck:
        """Check the Parameters as they are now. On the host the check is done here; on a device it is launched
        and :meth:`finish` reads its result, which may wait until the next step (a deferred verdict)."""
        self.last_sum = None
        if not self.params:
            return StartedCheck(names=[])
        if self.on_host:
            before = self.false_alarms
            names = self._host_names()
            return StartedCheck(names=names, param_sum=self.last_sum, false_alarm=self.false_alarms > before)
        if self._first_launch:
            return self._first_compiled_start()
        return StartedCheck(sums=[graph() for graph in self.compiled or ()])

    def _first_compiled_start(self) -> StartedCheck:
        """The first launch compiles the check's graphs: their time is kept for the budget (:meth:`take_setup_seconds`).
        A graph MindSpore cannot compile here is mindguard's problem, not the training's: the host check replaces it
        (``fell_back`` says why)."""
        begin = time.perf_counter()
        try:
            sums = [graph() for graph in self.compiled or ()]
        except Exception as error:  # noqa: BLE001 - the check's own graph failed to build; the host check works
            self.fell_back = f"{type(error).__name__}: {str(error).splitlines()[0][:300] if str(error) else ''}"
            self.compiled, self._compiled_at, self.on_host = None, None, True
            self.setup_seconds += time.perf_counter() - begin
            return self.start()
        self._first_launch = False
        self.setup_seconds += time.perf_counter() - begin
        return StartedCheck(sums=sums)

    def take_setup_seconds(self) -> float:
        """Seconds spent compiling since the last call (0 when nothing compiled): a cost of checking that the check
        budget counts (:meth:`mindguard.training.checks.budget.CheckBudget.charge`)."""
        seconds, self.setup_seconds = self.setup_seconds, 0.0
        return seconds

    def finish(self, started: StartedCheck) -> List[str]:
        """The names of the Parameters that held NaN/Inf when ``started`` began (``[]``: all finite)."""
        if started.names is None:
            flags = np.concatenate([np.isfinite(np.asarray(sums.asnumpy())) for sums in started.sums or []])
            started.names = [p.name for p, ok in zip(self.params, flags) if not ok]
        return started.names

    def _host_names(self) -> List[str]:
        if not self._alarm():
            return []
        names = self.exact_nonfinite_names()
        if not names:
            self.false_alarms += 1  # a finite sum beyond float32 range
        return names

    def nonfinite_names(self) -> List[str]:
        """The names of the Parameters holding NaN/Inf now (the check started and finished at once)."""
        return self.finish(self.start())


def _is_bool_tensor(value: Any) -> bool:
    return isinstance(value, ms.Tensor) and value.dtype == ms.bool_


_FLOAT_TYPES = (mstype.float32, mstype.float16, mstype.bfloat16, mstype.float64)


def _scalar_float(value: Any) -> Optional[float]:
    """A one-element floating-point Tensor's value by ``item()`` (~1 µs; ``asnumpy()`` costs ~4 µs, and
    5-10x that inside a step's callbacks while MindSpore's threads hold the cores), else ``None``."""
    if isinstance(value, Tensor) and value.dtype in _FLOAT_TYPES and value.size == 1:
        return float(value.item())
    return None


def _to_numpy(value: Any) -> Optional[np.ndarray]:
    if isinstance(value, ms.Tensor):
        return value.asnumpy()
    if isinstance(value, (numbers.Number, np.ndarray, np.generic)):
        return np.asarray(value)
    return None


def _loss_float(array: Optional[np.ndarray]) -> Optional[float]:
    """The loss as one float: the value of a scalar, else the first non-finite element or the mean."""
    if array is None or array.size == 0 or not np.issubdtype(array.dtype, np.number):
        return None
    flat = array.astype(np.float64).reshape(-1)
    if flat.size == 1:
        return float(flat[0])
    bad = flat[~np.isfinite(flat)]
    return float(bad[0]) if bad.size else float(flat.mean())




class StepVerdict:
    """What a step's output says: ``kind`` (``None`` = healthy), ``loss`` (float or None), ``nonfinite``
    (names: ``"loss"``, ``"gradients"``), ``message``, and ``refused`` (the update was not applied)."""

    __slots__ = ("kind", "loss", "nonfinite", "message", "refused")

    def __init__(self, kind: Optional[str] = None, loss: Optional[float] = None, nonfinite: Sequence[str] = (),
                 message: Optional[str] = None, refused: bool = False):
        self.kind, self.loss, self.nonfinite, self.message, self.refused = kind, loss, list(nonfinite), message, refused

    def add_nonfinite_params(self, names: Sequence[str]) -> "StepVerdict":
        """Fold in the Parameters the step made non-finite: kind ``"nonfinite_params"`` unless the outputs already
        failed the step, whose message then says it too. Returns ``self``."""
        if not names:
            return self
        self.nonfinite = self.nonfinite + list(names)
        text = f"parameters became non-finite: {summarized(names)}"
        if self.kind is None:
            self.kind, self.message = "nonfinite_params", text
        else:
            self.message = f"{self.message}; {text}" if self.message else text
        return self


class OutputChecker:
    """Reads training-step outputs, one step after another (it follows the streaks of loss-scale overflows).

    Understood: a loss Tensor or number; ``(loss, refused)`` from ``GuardedTrainStep`` (refused -> kind
    ``"nonfinite_grads"``, unless its ``should_stop`` says the refusal is within ``max_skips``);
    ``(loss, overflow, scale)`` from loss-scale cells; any other tuple -> its first element is the loss.

    A non-finite loss is a failure on every step, an overflow step included: the loss a loss-scale cell
    returns is the unscaled forward loss, so Inf/NaN in it never comes from the scaling. An overflow with a
    finite loss is normal (the update is skipped and the scale drops) -- however many come in a row while the
    scale comes down, as in the warm-up of a scale that starts at ``2**40`` -- and a ``"loss_scale_collapse"`` only
    on one of the facts of :class:`mindguard.training.checks.loss_scale.LossScaleRule`: an overflow with the scale at
    its floor (``<= min_loss_scale``, at this step and the step before), ``max_overflow_steps`` overflows in a row at a
    scale that does not come down (a fixed scale), or a streak longer than a scale coming down would allow
    (``max_overflow_steps + 2 * log2(scale before the streak / max(min_loss_scale, 1))``).
    """

    def __init__(self, *, max_overflow_steps: int = 20, min_loss_scale: float = 1.0):
        self.max_overflow_steps = max_overflow_steps
        self.min_loss_scale = min_loss_scale
        self.scaling = LossScaleRule(max_overflow_steps=max_overflow_steps, min_loss_scale=min_loss_scale)

    @property
    def overflows(self) -> int:
        """Loss-scale overflows in a row, up to the last step read."""
        return self.scaling.overflows

    def check(self, outputs: Any, train_network: Any = None) -> StepVerdict:
        refused = refused_flag(outputs)
        if refused is not None:
            loss = _scalar_float(outputs[0])
            loss_array = np.asarray(loss) if loss is not None else _to_numpy(outputs[0])
            if loss is None:
                loss = _loss_float(loss_array)
            if refused:
                if not getattr(train_network, "should_stop", True):
                    return StepVerdict(loss=loss, refused=True)
                acknowledge = getattr(train_network, "acknowledge_stop", None)
                if callable(acknowledge):
                    acknowledge()  # the stop is handled here: the step must not raise RefusedStepsError next call
                names = (["loss"] if loss is not None and not math.isfinite(loss) else []) + ["gradients"]
                return StepVerdict("nonfinite_grads", loss, names,
                                   f"gradients were non-finite and the update was refused (loss={loss})", refused=True)
            return _loss_verdict(loss_array, loss)
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3 and _is_bool_tensor(outputs[1]):
            loss_array = _to_numpy(outputs[0])
            loss = _loss_float(loss_array)
            overflow = bool(np.asarray(outputs[1].asnumpy()).any())
            scale = _scalar_float(outputs[2])
            if scale is None:
                scale = _loss_float(_to_numpy(outputs[2]))
            verdict = _loss_verdict(loss_array, loss)
            collapse = self.scaling.step(overflow, scale)   # every step: the rule compares a scale with the last one
            if not overflow:
                return verdict
            if verdict.kind is not None:
                verdict.message = (verdict.message or "") + (f" on a loss-scale overflow step (loss scale {scale:g}): "
                                                             f"the loss is computed "
                                    f"before scaling, so this is not an fp16 overflow of the scaled gradients"
                                    if scale is not None else " on a loss-scale overflow step")
                verdict.refused = True
                return verdict
            if collapse is not None:
                return StepVerdict("loss_scale_collapse", loss, ["gradients"], collapse, refused=True)
            return StepVerdict(loss=loss, refused=True)
        if isinstance(outputs, (tuple, list)):
            outputs = outputs[0] if outputs else None
        loss = _scalar_float(outputs)
        if loss is not None:  # the common case, without numpy: a scalar float loss
            return StepVerdict(loss=loss) if math.isfinite(loss) else StepVerdict(
                "nonfinite_loss", loss, ["loss"], f"loss became non-finite (loss={loss})")
        loss_array = _to_numpy(outputs)
        return _loss_verdict(loss_array, _loss_float(loss_array))


def _loss_verdict(loss_array: Optional[np.ndarray], loss: Optional[float]) -> StepVerdict:
    if loss_array is None or not np.issubdtype(loss_array.dtype, np.number) or np.isfinite(loss_array).all():
        return StepVerdict(loss=loss)
    return StepVerdict("nonfinite_loss", loss, ["loss"], f"loss became non-finite (loss={loss})")


def nonfinite_batch(batch: Any) -> List[str]:
    """``input<i>`` for each floating-point Tensor of a step's batch holding NaN/Inf (0-based ``i``)."""
    if not isinstance(batch, (list, tuple)):
        return []
    names = []
    for i, value in enumerate(batch):
        array = _to_numpy(value)
        if array is not None and np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            names.append(f"input{i}")
    return names
