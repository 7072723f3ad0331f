"""``FailureLocator``: the callback that names the step where training went non-finite (or crashed).

Kept apart from :mod:`mindguard.locate` because it needs ``import mindspore``; import it as
``mindguard.FailureLocator`` or ``mindguard.locate.FailureLocator``.
"""
from __future__ import annotations

import datetime
import math
import time
import numbers
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import mindspore as ms
from mindspore import nn
from mindspore.train import Callback

from ._dist import collective_ready, exchange_codes, per_rank_path, rank_info
from ._io import JsonSlot, atomic_write_bytes, atomic_write_json
from ._version import __version__
from .locate import KINDS, FailureRecord, NonFiniteError, RecordError, step_position
from .step import AllFinite, refused_flag

ACTIONS = ("stop", "raise", "continue")
_MESSAGE_LIMIT = 4000  # characters of an exception's text kept in the record (MindSpore appends long C++ traces)


class _CompiledAllFinite(nn.Cell):
    """One compiled graph over every parameter: :class:`mindguard.step.AllFinite`'s fused, overflow-safe
    reduction (the one GuardedTrainStep applies to gradients), so only a bool leaves the device."""

    def __init__(self, params: Sequence[ms.Parameter]):
        super().__init__(auto_prefix=False)
        self.params = ms.ParameterTuple(params)
        self.all_finite = AllFinite(params)
        self.zero = ms.Tensor(0.0, ms.float32)

    @ms.jit
    def construct(self):
        return self.all_finite(self.zero, self.params)


class _ParamChecker:
    """A cheap alarm on the hot path; an exact per-parameter check only when it rings.

    The alarm is one reduction over every parameter: on CPU, where ``Parameter.asnumpy()`` is a
    zero-copy view of the parameter's memory, the sum of squares ``x @ x`` by BLAS over those views (no
    copy, no graph launch: ~0.15 ms for 1.9M fp32 parameters, against ~0.6 ms to launch the compiled
    reduction), NaN/Inf whenever any element is, and also on finite values whose squares overflow
    float32 (``false_alarms`` counts alarms the exact check cleared); on GPU/Ascend, the compiled
    :class:`_CompiledAllFinite`, so that nothing but one bool leaves the device.
    """

    def __init__(self, params: Sequence[ms.Parameter], *, on_host: Optional[bool] = None):
        self.params = [p for p in params if p.size > 0]
        if on_host is None:
            on_host = ms.get_context("device_target") == "CPU"
        self.on_host = on_host
        self.compiled = _CompiledAllFinite(self.params) if self.params and not on_host else None
        self.false_alarms = 0

    def checks(self, params: Sequence[ms.Parameter]) -> bool:
        """True if this checker covers exactly ``params`` (the same Parameter objects, in order)."""
        return [id(p) for p in params if p.size > 0] == [id(p) for p in self.params]

    def _alarm(self) -> bool:
        if self.on_host:
            total = 0.0
            for p in self.params:
                flat = p.asnumpy().reshape(-1)
                if flat.dtype != np.float32 and flat.dtype != np.float64:
                    flat = flat.astype(np.float32)  # fp16/bf16: BLAS has no half-precision dot
                total += float(np.dot(flat, flat))
            return not math.isfinite(total)
        if self.compiled is None:
            return False
        return not bool(self.compiled().asnumpy())

    def nonfinite_names(self) -> List[str]:
        if not self.params or not self._alarm():
            return []
        names = [p.name for p in self.params if not np.isfinite(p.asnumpy()).all()]
        if not names:
            self.false_alarms += 1  # a finite sum beyond float32 range
        return names


def _trained_parameters(cb_params) -> List[ms.Parameter]:
    """The floating-point parameters the optimizer updates (not its own state: moments, learning rate, step).

    ``train_network.trainable_params()`` alone would include the optimizer's state, which MindSpore marks
    ``requires_grad=True``. Without an optimizer cell (a custom step), every trainable float parameter.
    """
    network = cb_params.get("train_network") or cb_params.get("network")
    optimizers = []
    if cb_params.get("optimizer") is not None:
        optimizers.append(cb_params.get("optimizer"))
    if network is not None:
        optimizers += [cell for _, cell in network.cells_and_names() if isinstance(cell, nn.Optimizer)]
    if optimizers:
        candidates = [p for opt in optimizers for p in opt.parameters]
    elif network is not None:
        candidates = network.trainable_params()
    else:
        candidates = []
    seen, params = set(), []
    for p in candidates:
        if id(p) not in seen and p.dtype in (ms.float16, ms.float32, ms.float64, ms.bfloat16):
            seen.add(id(p))
            params.append(p)
    return params


def _is_bool_tensor(value: Any) -> bool:
    return isinstance(value, ms.Tensor) and value.dtype == ms.bool_


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


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).astimezone().isoformat(timespec="seconds")


def _check_record_arg(record: Any) -> Path:
    if isinstance(record, bytes) or not isinstance(record, (str, os.PathLike)):
        raise TypeError(f"FailureLocator(record=...) must be a file path (str or os.PathLike), got {record!r} "
                        f"({type(record).__name__}); e.g. record=\"mindguard_failure.json\"")
    path = Path(record).expanduser()
    if str(record) == "":
        raise ValueError("FailureLocator(record=...) is empty; pass a file path such as \"mindguard_failure.json\"")
    if path.is_dir():
        raise ValueError(f"FailureLocator(record={str(record)!r}) is a directory; pass a file path inside it, e.g. "
                         f"{str(path / 'mindguard_failure.json')!r}")
    return path


class FailureLocator(Callback):
    """Record the first step where training goes non-finite or crashes, and keep the record current.

    Args:
        record: JSON file of the failure record (one per rank: ``name.rank<N>.json`` when distributed).
            The file is the record of *this* run: ``on_train_begin`` starts a new one. If the file holds the
            record of an earlier failed or killed run, a warning says so before it is replaced; a file at that
            path that is not a mindguard record is never overwritten (``ValueError`` before training).
        check_params: after each step, check that every trainable parameter is finite, so the record names
            the step whose *update* produced Inf/NaN rather than the later step where the loss shows it.
            Costs one small compiled reduction and one scalar copy per step.
        action: what to do at the first failure: ``"stop"`` (``run_context.request_stop()``: the step ends,
            then ``on_train_epoch_end``/``on_train_end`` run), ``"raise"`` (:class:`NonFiniteError` from
            ``on_train_step_end``) or ``"continue"`` (keep training; the record keeps the first failure and no
            further checks run).
        max_overflow_steps: with loss-scale outputs ``(loss, overflow, scale)``, an overflow is normal (the step
            is skipped and the scale drops); this many consecutive overflows is a ``"loss_scale_collapse"``.
        min_loss_scale: an overflow while the loss scale is already ``<= min_loss_scale`` is a collapse too.
        initial_iteration: the dump config's ``initial_iteration`` (added to every ``dump_iteration``).

    Step outputs understood (``net_outputs``): a loss Tensor; ``(loss, refused)`` from
    ``mindguard.GuardedTrainStep`` (refused True -> ``"nonfinite_grads"``); ``(loss, overflow, scale)`` from
    loss-scale cells; any other tuple -> its first element is the loss.

    Exceptions raised while training (``RuntimeError: run task error`` ...) are recorded as ``"exception"``
    (``KeyboardInterrupt`` as ``"interrupted"``) with the step in progress, and propagate unchanged.

    After training: ``failure`` is the first failure's :class:`FailureRecord` (or ``None``), ``record_path`` the
    file written, ``false_alarms`` how often the fast parameter check alarmed on finite values.

    Distributed (``msrun``, communication initialised, more than one rank): after its local checks each rank
    joins one small collective per step (an AllReduce of one number per rank; ``sync_seconds``/``sync_steps``
    measure it), so every rank learns which ranks failed and all of them fail -- and with ``action="stop"`` stop --
    at the same step instead of the healthy ones hanging in the next gradient AllReduce. The origin is the rank
    with the most local evidence: a non-finite batch, then a non-finite loss (the forward pass of data-parallel
    training has no collective), then non-finite gradients/parameters (which the gradient AllReduce spreads to
    every rank). The other ranks' records carry ``stopped_by_rank`` and ``origin_kind`` and say what they saw.

    Dump iterations assume MindSpore's numbering with one training graph per process and one ``Model.train``
    call (``cur_step_num - 1 + initial_iteration``); the locator's own helper graph runs after the training
    graph and does not shift it.
    """

    def __init__(self, record: "os.PathLike[str] | str" = "mindguard_failure.json", *, check_params: bool = True,
                 action: str = "stop", max_overflow_steps: int = 20, min_loss_scale: float = 1.0,
                 initial_iteration: int = 0):
        super().__init__()
        self._record_arg = _check_record_arg(record)
        if not isinstance(check_params, bool):
            raise TypeError(f"FailureLocator(check_params=...) must be True or False, got {check_params!r}")
        if action not in ACTIONS:
            raise ValueError(f"FailureLocator(action=...) must be one of {list(ACTIONS)}, got {action!r}: "
                             f"\"stop\" ends training after the failing step, \"raise\" raises NonFiniteError, "
                             f"\"continue\" only records the first failure")
        if isinstance(max_overflow_steps, bool) or not isinstance(max_overflow_steps, numbers.Integral) \
                or max_overflow_steps < 1:
            raise ValueError(f"FailureLocator(max_overflow_steps=...) must be an integer >= 1, got "
                             f"{max_overflow_steps!r}")
        if isinstance(min_loss_scale, bool) or not isinstance(min_loss_scale, numbers.Real) or min_loss_scale < 0:
            raise ValueError(f"FailureLocator(min_loss_scale=...) must be a number >= 0, got {min_loss_scale!r}")
        if isinstance(initial_iteration, bool) or not isinstance(initial_iteration, numbers.Integral) \
                or initial_iteration < 0:
            raise ValueError(f"FailureLocator(initial_iteration=...) must be an integer >= 0 (the dump config's "
                             f"initial_iteration), got {initial_iteration!r}")
        self.check_params = check_params
        self.action = action
        self.max_overflow_steps = int(max_overflow_steps)
        self.min_loss_scale = float(min_loss_scale)
        self.initial_iteration = int(initial_iteration)
        self.failure: Optional[FailureRecord] = None
        self.false_alarms = 0
        self.record_path: Path = self._resolve_path()
        self._checker: Optional[_ParamChecker] = None  # kept across model.train calls: its graph compiles once
        self._reset()

    # -- state --------------------------------------------------------------------------------------------
    def _reset(self) -> None:
        self._slot: Optional[JsonSlot] = None  # the record file, open for in-place step updates
        self._base: Optional[Dict[str, Any]] = None
        self._position: Dict[str, Any] = {}
        self._previous_step_num = 0
        self._overflows = 0
        self._checker_ready = False  # the checker is (re)matched to this train call's parameters at its first step
        self._collective = False  # one verdict exchange per step (set in _start when distributed)
        self.sync_seconds = 0.0
        self.sync_steps = 0
        self._owns_record = False  # True once on_train_begin checked that the file may be replaced

    def _resolve_path(self) -> Path:
        rank, group_size = rank_info()
        return per_rank_path(self._record_arg.absolute(), rank, group_size)

    def _start(self, cb_params: Any) -> None:
        """Fix the run's constant fields and the record path (rank is known once communication is initialised)."""
        rank, group_size = rank_info()
        self.record_path = per_rank_path(self._record_arg.absolute(), rank, group_size)
        self._collective = group_size > 1 and collective_ready()
        try:
            from .reproduce import current_seed

            seed = current_seed()
        except ImportError:
            seed = None
        get = cb_params.get if cb_params is not None else (lambda key: None)
        sink = get("dataset_sink_mode")
        self._base = {
            "steps_per_epoch": get("batch_num"),
            "dataset_sink_mode": bool(sink) if sink is not None else None,
            "sink_size": get("sink_size") if sink else None,
            "rank": rank,
            "group_size": group_size,
            "device_target": ms.get_context("device_target"),
            "mindspore_version": ms.__version__,
            "mindguard_version": __version__,
            "seed": seed,
        }

    def _record(self, status: str, **fields: Any) -> FailureRecord:
        values = dict(self._base or {})
        values.update(self._position)
        values.update(fields)
        return FailureRecord(status=status, time=_now(), **values)

    def _warn_about_previous_record(self) -> None:
        path = self.record_path
        if not path.exists():
            return
        try:
            previous = FailureRecord.load(path)
        except RecordError as exc:
            raise ValueError(f"FailureLocator will not overwrite {str(path)!r}: the file exists and is not a "
                             f"mindguard failure record ({exc}); pass another record= path or move the file") from None
        if previous.status in ("failed", "running"):
            what = "failure" if previous.status == "failed" else "run that never finished (killed?)"
            warnings.warn(f"mindguard: {str(path)!r} holds the record of an earlier {what}: {previous.format()}; "
                          f"it is replaced by this run's record (pass another record= path to keep it)",
                          stacklevel=3)

    # -- hooks --------------------------------------------------------------------------------------------
    def on_train_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        self.failure = None
        self._reset()
        self._start(cb_params)
        self._warn_about_previous_record()
        self._owns_record = True
        self._previous_step_num = int(cb_params.get("cur_step_num") or 0)
        self._slot = JsonSlot(self.record_path)
        self._write_running()

    def on_train_step_begin(self, run_context) -> None:
        cb_params = run_context.original_args()
        cur = int(cb_params.get("cur_step_num"))
        self._position = step_position(cur, cb_params.get("batch_num"), cb_params.get("cur_epoch_num"),
                                       previous_step_num=self._previous_step_num,
                                       initial_iteration=self.initial_iteration)
        self._previous_step_num = cur
        if self.failure is None:
            self._write_running()

    def _close_slot(self) -> None:
        if self._slot is not None:
            self._slot.close()
            self._slot = None

    def _write_running(self) -> None:
        """Say which step is in progress: ~1 µs in place (JsonSlot), an atomic rename when it can't be."""
        data = self._record("running").to_dict()
        if self._slot.write(data):
            return
        padded = self._slot.padded(data)
        if padded is None:  # too long for the slot (a huge message): a plain atomic write
            atomic_write_json(self.record_path, data)
            return
        atomic_write_bytes(self.record_path, padded)
        self._slot.reopen()

    def on_train_step_end(self, run_context) -> None:
        if self.failure is not None:
            return
        cb_params = run_context.original_args()
        kind, loss, nonfinite, message = self._check_outputs(cb_params.get("net_outputs"),
                                                             cb_params.get("train_network"))
        if self.check_params:
            bad_params = self._nonfinite_params(cb_params)
            if bad_params:
                nonfinite = nonfinite + bad_params
                params_text = f"parameters became non-finite: {', '.join(bad_params)}"
                if kind is None:
                    kind, message = "nonfinite_params", params_text
                else:
                    message = f"{message}; {params_text}"
        if self._collective:
            self._decide_across_ranks(run_context, cb_params, kind, loss, nonfinite, message)
        elif kind is not None:
            self._fail(run_context, kind, loss=loss, nonfinite=nonfinite, message=message)

    def on_train_end(self, run_context) -> None:
        self._close_slot()
        if self.failure is None:
            self._record("finished").save(self.record_path)

    def __exit__(self, exc_type, exc, traceback) -> None:
        self._close_slot()
        if exc_type is None or self.failure is not None:
            return None
        try:
            if self._base is None:
                self._start(None)
            if not self._owns_record and self.record_path.exists():
                try:
                    FailureRecord.load(self.record_path)
                except RecordError:
                    return None  # not ours (on_train_begin refused it, or never ran): leave it alone
            kind = "interrupted" if issubclass(exc_type, KeyboardInterrupt) else "exception"
            text = f"{exc_type.__name__}: {exc}".strip()
            if len(text) > _MESSAGE_LIMIT:
                text = text[:_MESSAGE_LIMIT] + " [...]"
            self.failure = self._record("failed", kind=kind, message=text)
            self.failure.save(self.record_path, fsync=True)
        except Exception as write_error:  # noqa: BLE001 - never replace the training's own exception
            warnings.warn(f"mindguard: could not write the failure record {str(self.record_path)!r}: {write_error}")
        return None

    # -- checks -------------------------------------------------------------------------------------------
    def _check_outputs(self, outputs: Any, train_network: Any = None
                       ) -> Tuple[Optional[str], Optional[float], List[str], Optional[str]]:
        """``(kind or None, loss, nonfinite names, message)`` from the step's ``net_outputs``.

        A refusal by a ``GuardedTrainStep`` still within its ``max_skips`` (its ``should_stop`` is False)
        is not a failure: the step logged it and the weights are intact.
        """
        refused = refused_flag(outputs)
        if refused is not None:
            loss_array = _to_numpy(outputs[0])
            loss = _loss_float(loss_array)
            if refused:
                if not getattr(train_network, "should_stop", True):
                    return None, loss, [], None
                acknowledge = getattr(train_network, "acknowledge_stop", None)
                if callable(acknowledge):
                    acknowledge()  # the stop is handled here: the step must not raise RefusedStepsError next call
                names = (["loss"] if loss is not None and not math.isfinite(loss) else []) + ["gradients"]
                return ("nonfinite_grads", loss, names,
                        f"gradients were non-finite and the update was refused (loss={loss})")
            return self._loss_verdict(loss_array, loss)
        if isinstance(outputs, (tuple, list)) and len(outputs) == 3 and _is_bool_tensor(outputs[1]):
            loss_array = _to_numpy(outputs[0])
            loss = _loss_float(loss_array)
            overflow = bool(np.asarray(outputs[1].asnumpy()).any())
            scale = _loss_float(_to_numpy(outputs[2]))
            if not overflow:
                self._overflows = 0
                return self._loss_verdict(loss_array, loss)
            self._overflows += 1
            if scale is not None and scale <= self.min_loss_scale:
                return ("loss_scale_collapse", loss, ["gradients"],
                        f"loss-scale overflow with the loss scale already at {scale:g} (<= min_loss_scale "
                        f"{self.min_loss_scale:g}): the gradients are non-finite even unscaled")
            if self._overflows >= self.max_overflow_steps:
                return ("loss_scale_collapse", loss, ["gradients"],
                        f"{self._overflows} consecutive loss-scale overflows (max_overflow_steps="
                        f"{self.max_overflow_steps}); loss scale now {scale}")
            return None, loss, [], None
        if isinstance(outputs, (tuple, list)):
            outputs = outputs[0] if outputs else None
        loss_array = _to_numpy(outputs)
        return self._loss_verdict(loss_array, _loss_float(loss_array))

    @staticmethod
    def _loss_verdict(loss_array: Optional[np.ndarray], loss: Optional[float]):
        if loss_array is None or not np.issubdtype(loss_array.dtype, np.number) or np.isfinite(loss_array).all():
            return None, loss, [], None
        return "nonfinite_loss", loss, ["loss"], f"loss became non-finite (loss={loss})"

    def _nonfinite_params(self, cb_params) -> List[str]:
        if not self._checker_ready:
            params = _trained_parameters(cb_params)
            if self._checker is None or not self._checker.checks(params):
                self._checker = _ParamChecker(params)
            self._checker_ready = True
        before = self._checker.false_alarms
        names = self._checker.nonfinite_names()
        self.false_alarms += self._checker.false_alarms - before
        return names

    # -- distributed ------------------------------------------------------------------------------------
    def _decide_across_ranks(self, run_context, cb_params, kind: Optional[str], loss: Optional[float],
                             nonfinite: List[str], message: Optional[str]) -> None:
        """Exchange every rank's verdict (one collective, every step); fail on every rank if any rank failed."""
        bad_inputs = _nonfinite_inputs(cb_params) if kind is not None else []
        severity = 0 if kind is None else (_INPUTS if bad_inputs else _LOSS if "loss" in nonfinite else _SPREAD)
        start = time.perf_counter()
        codes = exchange_codes(_encode(severity, kind))
        self.sync_seconds += time.perf_counter() - start
        self.sync_steps += 1
        failed = {r: _decode(c) for r, c in enumerate(codes) if c}
        if not failed:
            return
        rank = int((self._base or {}).get("rank") or 0)
        top = max(sev for sev, _ in failed.values())
        leaders = sorted(r for r, (sev, _) in failed.items() if sev == top)
        if rank in leaders:
            text = message or kind
            if bad_inputs:
                text += f"; this rank's batch holds non-finite values ({', '.join(bad_inputs)})"
            others = sorted(set(range(len(codes))) - {rank})
            if top == _SPREAD and len(leaders) > 1:
                text += (f"; ranks {leaders} all went non-finite at this step with finite batches and losses: the "
                         "gradient AllReduce gives every rank the same (non-finite) gradients, so this callback cannot "
                         "tell which rank produced them -- the dump of this iteration can (mindguard hunt)")
            elif others:
                text += f"; ranks {others} stopped at the same step because of it"
            self._fail(run_context, kind, loss=loss, nonfinite=nonfinite + bad_inputs, message=text)
            return
        origin = leaders[0]
        origin_kind = failed[origin][1]
        why = {_INPUTS: "its batch holds non-finite values", _LOSS: "its loss went non-finite",
               _SPREAD: "its gradients or parameters went non-finite"}[top]
        seen = (["inputs"] if cb_params.get("train_dataset_element") is not None else []) \
            + (["loss"] if loss is not None and math.isfinite(loss) else [])
        text = f"stopped because rank {origin} failed at this step ({origin_kind}: {why})"
        if seen:
            text += f"; this rank's {' and '.join(seen)} were finite"
        bad_params = [n for n in nonfinite if n not in ("loss", "gradients")]
        if bad_params:
            text += (f", but its parameters became non-finite in the update ({', '.join(bad_params)}): the non-finite "
                     f"gradients of rank {origin} reached it through the gradient AllReduce")
        self._fail(run_context, kind or origin_kind, loss=loss, nonfinite=nonfinite, message=text,
                   stopped_by_rank=origin, origin_kind=origin_kind)

    def _fail(self, run_context, kind: str, *, loss: Optional[float], nonfinite: List[str], message: str,
              **extra: Any) -> None:
        self.failure = self._record("failed", kind=kind, loss=loss, nonfinite=nonfinite, message=message, **extra)
        self.failure.save(self.record_path, fsync=True)
        if self.action == "stop":
            run_context.request_stop()
        elif self.action == "raise":
            raise NonFiniteError(f"mindguard: training went non-finite at {self.failure.format()} "
                                 f"(record: {self.record_path})", self.failure)


# severities a rank reports in the per-step exchange (higher = more local evidence that the failure started there)
_SPREAD, _LOSS, _INPUTS = 1, 2, 3


def _encode(severity: int, kind: Optional[str]) -> int:
    """0 = healthy, else ``severity * 8 + kind index + 1`` (one small integer per rank)."""
    return 0 if kind is None else severity * 8 + KINDS.index(kind) + 1


def _decode(code: int) -> Tuple[int, str]:
    return code // 8, KINDS[code % 8 - 1]


def _nonfinite_inputs(cb_params) -> List[str]:
    """``input<i>`` for each floating-point input Tensor of this step's batch holding NaN/Inf (0-based ``i``)."""
    element = cb_params.get("train_dataset_element")
    if not isinstance(element, (list, tuple)):
        return []
    names = []
    for i, value in enumerate(element):
        array = _to_numpy(value)
        if array is not None and np.issubdtype(array.dtype, np.floating) and not np.isfinite(array).all():
            names.append(f"input{i}")
    return names
