"""Which step of a training run failed: the failure record, the dump-iteration arithmetic, the CLI helpers.

Index bases used throughout (MindSpore's own):

* ``epoch`` -- 1-based (``cur_epoch_num``).
* ``step_in_epoch`` -- 1-based position of the step inside its epoch.
* ``global_step`` -- 1-based count of steps since the start of ``Model.train`` (``cur_step_num``).
* ``dump_iteration`` -- 0-based id MindSpore's data dump gives a step: ``global_step - 1 + initial_iteration``.

The callback :class:`FailureLocator` lives in :mod:`mindguard._locator` (it needs ``import mindspore``,
~2 s) and is loaded on first access as ``mindguard.locate.FailureLocator``; everything else here only
does arithmetic and reads JSON, so ``mindguard iteration`` and ``mindguard record`` start instantly.
"""
from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple, Union

from ._io import atomic_write_json

if TYPE_CHECKING:  # pragma: no cover
    from ._locator import FailureLocator

SCHEMA = 1
STATUSES = ("running", "failed", "finished")
KINDS = ("nonfinite_loss", "nonfinite_grads", "nonfinite_params", "loss_scale_collapse", "exception",
         "interrupted")

PathLike = Union[str, "os.PathLike[str]"]


def __getattr__(name: str) -> Any:
    if name == "FailureLocator":
        from ._locator import FailureLocator

        return FailureLocator
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class NonFiniteError(RuntimeError):
    """Raised by ``FailureLocator(action="raise")``; ``.record`` is the :class:`FailureRecord` written to disk."""

    def __init__(self, message: str, record: "FailureRecord"):
        super().__init__(message)
        self.record = record


class RecordError(ValueError):
    """A failure-record file is missing, is not JSON, or does not follow the record schema."""


# ---------------------------------------------------------------------------------------------------------
# dump iteration arithmetic
# ---------------------------------------------------------------------------------------------------------

def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer >= {minimum}, got {value!r} ({type(value).__name__})")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def dump_iteration(epoch: int, step: int, steps_per_epoch: int, *, initial_iteration: int = 0) -> int:
    """The iteration id MindSpore's data dump gives to step ``step`` of epoch ``epoch``.

    ``epoch`` and ``step`` are 1-based, as MindSpore prints them (``epoch: 3 step: 50``); ``step`` counts
    inside the epoch (1..``steps_per_epoch``). The dump numbers iterations from 0 and keeps counting across
    epochs, plus the dump config's ``initial_iteration`` offset (default 0)::

        dump_iteration = steps_per_epoch * (epoch - 1) + step - 1 + initial_iteration

    ``steps_per_epoch * (epoch - 1) + step`` alone -- the formula in the field report -- is the 1-based
    *global step* (MindSpore's ``cur_step_num``), one more than the dump iteration. Example: 100 steps per
    epoch, epoch 3, step 50 is global step 250 and dump iteration 249.

    Assumes the training graph is the first graph the process runs and ``Model.train`` is called once: the
    dump counter is shared by every graph of the process (an earlier ``model.eval`` or forward call shifts it).
    """
    epoch = _check_int("epoch (1-based)", epoch, 1)
    steps_per_epoch = _check_int("steps_per_epoch", steps_per_epoch, 1)
    step = _check_int("step (1-based, inside the epoch)", step, 1)
    initial_iteration = _check_int("initial_iteration", initial_iteration, 0)
    if step > steps_per_epoch:
        raise ValueError(
            f"step must be between 1 and steps_per_epoch ({steps_per_epoch}), got {step}: pass the step inside "
            f"the epoch, not the global step (global step {step} is epoch "
            f"{(step - 1) // steps_per_epoch + 1}, step {(step - 1) % steps_per_epoch + 1})"
        )
    return steps_per_epoch * (epoch - 1) + step - 1 + initial_iteration


def step_position(cur_step_num: int, batch_num: int, cur_epoch_num: Optional[int], *,
                  previous_step_num: int = 0, initial_iteration: int = 0) -> Dict[str, Any]:
    """Where a step-hook call is, from MindSpore's callback parameters.

    ``cur_step_num`` (1-based, global) and ``batch_num`` (steps per epoch; ``sink_size`` in sink mode) come from
    ``run_context.original_args()``; ``previous_step_num`` is ``cur_step_num`` at the previous
    ``on_train_step_begin`` (or at ``on_train_begin``). In dataset sink mode (Ascend/GPU, GRAPH) one hook call
    covers a whole sink window: ``cur_step_num`` grows by the sink size per call, so the window's steps are
    ``previous_step_num + 1 .. cur_step_num`` and ``iteration_range`` gives their first and last dump
    iterations; it is ``None`` when the call covers one step.

    Returns ``epoch``, ``step_in_epoch``, ``global_step``, ``dump_iteration`` (the last step of a sink window)
    and ``iteration_range``.
    """
    cur_step_num = int(cur_step_num)
    batch_num = max(int(batch_num or 1), 1)
    window = cur_step_num - int(previous_step_num)
    iteration_range = None
    if window > 1:
        iteration_range = [int(previous_step_num) + initial_iteration, cur_step_num - 1 + initial_iteration]
    return {
        "epoch": int(cur_epoch_num) if cur_epoch_num is not None else None,
        "step_in_epoch": (cur_step_num - 1) % batch_num + 1,
        "global_step": cur_step_num,
        "dump_iteration": cur_step_num - 1 + initial_iteration,
        "iteration_range": iteration_range,
    }


# ---------------------------------------------------------------------------------------------------------
# the record
# ---------------------------------------------------------------------------------------------------------

_INT_FIELDS = ("epoch", "step_in_epoch", "global_step", "dump_iteration", "steps_per_epoch", "sink_size", "rank",
               "group_size", "seed", "stopped_by_rank")
_STR_FIELDS = ("device_target", "mindspore_version", "mindguard_version", "message", "time")


@dataclasses.dataclass
class FailureRecord:
    """The failure record (one JSON object per rank). Field meanings and index bases: see the module docstring.

    ``status`` is ``"running"`` while training (the step fields name the step in progress), ``"failed"`` (``kind``
    says why) or ``"finished"`` (``kind`` is ``None``; the step fields name the last step run). ``loss`` is a float
    in Python; in the JSON file a non-finite loss is written as the string ``"nan"``, ``"inf"`` or ``"-inf"`` so
    that strict JSON readers (``jq``, browsers) can read it. ``nonfinite`` names the non-finite tensors
    (``"loss"``, ``"gradients"``, parameter names).

    Distributed runs (one record per rank; these two keys are written only when ``group_size > 1``):
    ``stopped_by_rank`` is the rank whose failure made this rank stop at the same step (``None`` on that rank
    itself, and when no single rank can be named), ``origin_kind`` that rank's ``kind``; ``message`` says what
    this rank saw (e.g. finite inputs and loss, parameters non-finite after the gradient AllReduce).
    """

    schema: int = SCHEMA
    status: str = "running"
    kind: Optional[str] = None
    epoch: Optional[int] = None
    step_in_epoch: Optional[int] = None
    global_step: Optional[int] = None
    dump_iteration: Optional[int] = None
    iteration_range: Optional[List[int]] = None
    steps_per_epoch: Optional[int] = None
    dataset_sink_mode: Optional[bool] = None
    sink_size: Optional[int] = None
    rank: Optional[int] = None
    group_size: Optional[int] = None
    device_target: Optional[str] = None
    mindspore_version: Optional[str] = None
    mindguard_version: Optional[str] = None
    seed: Optional[int] = None
    loss: Optional[float] = None
    nonfinite: List[str] = dataclasses.field(default_factory=list)
    message: Optional[str] = None
    time: Optional[str] = None
    stopped_by_rank: Optional[int] = None
    origin_kind: Optional[str] = None

    # -- (de)serialisation -------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The JSON-ready dict, keys in the contract's order."""
        # shallow copy (lists copied): dataclasses.asdict deep-copies, ~5x slower on the per-step path
        data = {f.name: (list(v) if isinstance(v, list) else v)
                for f in dataclasses.fields(self) for v in (getattr(self, f.name),)}
        data["loss"] = _loss_to_json(self.loss)
        if not (self.group_size or 1) > 1 and self.stopped_by_rank is None and self.origin_kind is None:
            del data["stopped_by_rank"], data["origin_kind"]  # distributed-only keys
        return data

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "record") -> "FailureRecord":
        """Build a record from a decoded JSON object, or raise :class:`RecordError` naming ``source`` and the field."""
        if not isinstance(data, dict):
            raise RecordError(f"{source}: expected a JSON object (a mindguard failure record), got "
                              f"{type(data).__name__}")
        if data.get("schema") != SCHEMA:
            raise RecordError(f"{source}: not a mindguard failure record of schema {SCHEMA} "
                              f"(schema={data.get('schema')!r}); was it written by a newer mindguard?")
        if data.get("status") not in STATUSES:
            raise RecordError(f"{source}: status must be one of {list(STATUSES)}, got {data.get('status')!r}")
        if data.get("kind") is not None and data["kind"] not in KINDS:
            raise RecordError(f"{source}: kind must be null or one of {list(KINDS)}, got {data['kind']!r}")
        if data.get("origin_kind") is not None and data["origin_kind"] not in KINDS:
            raise RecordError(f"{source}: origin_kind must be null or one of {list(KINDS)}, got "
                              f"{data['origin_kind']!r}")
        for name in _INT_FIELDS:
            value = data.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise RecordError(f"{source}: {name} must be an integer or null, got {value!r}")
        for name in _STR_FIELDS:
            value = data.get(name)
            if value is not None and not isinstance(value, str):
                raise RecordError(f"{source}: {name} must be a string or null, got {value!r}")
        sink = data.get("dataset_sink_mode")
        if sink is not None and not isinstance(sink, bool):
            raise RecordError(f"{source}: dataset_sink_mode must be true, false or null, got {sink!r}")
        window = data.get("iteration_range")
        if window is not None and not (isinstance(window, list) and len(window) == 2
                                       and all(isinstance(v, int) and not isinstance(v, bool) for v in window)):
            raise RecordError(f"{source}: iteration_range must be null or [first, last], got {window!r}")
        nonfinite = data.get("nonfinite") or []
        if not (isinstance(nonfinite, list) and all(isinstance(v, str) for v in nonfinite)):
            raise RecordError(f"{source}: nonfinite must be a list of names, got {nonfinite!r}")
        try:
            loss = _loss_from_json(data.get("loss"))
        except (TypeError, ValueError):
            raise RecordError(f"{source}: loss must be a number, \"nan\", \"inf\", \"-inf\" or null, "
                              f"got {data.get('loss')!r}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}  # unknown keys: written by a newer minor version
        values.update(loss=loss, nonfinite=list(nonfinite))
        return cls(**values)

    def save(self, path: PathLike, *, fsync: bool = False) -> Path:
        """Write the record atomically (readers never see half a file) and return the path."""
        return atomic_write_json(path, self.to_dict(), fsync=fsync)

    @classmethod
    def load(cls, path: PathLike) -> "FailureRecord":
        """Read a record written by :class:`FailureLocator`; :class:`RecordError` names the file and the problem."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise RecordError(f"no failure record at {str(path)!r}: the file does not exist (FailureLocator writes "
                              f"it when training starts; with several ranks it is named <name>.rank<N>.json)") from None
        except OSError as exc:
            raise RecordError(f"cannot read failure record {str(path)!r}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise RecordError(f"{str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                              f"{exc.colno}); is it a mindguard failure record?") from None
        return cls.from_dict(data, source=repr(str(path)))

    # -- human summary -----------------------------------------------------------------------------------
    def position(self) -> str:
        """``"epoch 2, step 3/8 (global step 11), dump iteration 10"`` (or ``"before the first step"``)."""
        if self.global_step is None:
            return "before the first step"
        parts = []
        if self.group_size is not None and self.group_size > 1:
            parts.append(f"rank {self.rank}/{self.group_size}, ")
        if self.epoch is not None:
            total = f"/{self.steps_per_epoch}" if self.steps_per_epoch else ""
            parts.append(f"epoch {self.epoch}, step {self.step_in_epoch}{total} (global step {self.global_step})")
        else:
            parts.append(f"global step {self.global_step}")
        parts.append(f", dump iteration {self.dump_iteration}")
        if self.iteration_range:
            parts.append(f" (sink window: dump iterations {self.iteration_range[0]}-{self.iteration_range[1]})")
        return "".join(parts)

    def format(self) -> str:
        """One line: where, and what went wrong (or that the run is in progress / finished)."""
        if self.status == "running":
            return f"running: {self.position()} in progress"
        if self.status == "finished":
            return f"finished without failure; last step: {self.position()}"
        return f"{self.position()}: {self.message or self.kind}"

    def __str__(self) -> str:
        return self.format()


def _loss_to_json(loss: Optional[float]) -> Union[float, str, None]:
    if loss is None:
        return None
    loss = float(loss)
    if math.isnan(loss):
        return "nan"
    if math.isinf(loss):
        return "inf" if loss > 0 else "-inf"
    return loss


def _loss_from_json(value: Any) -> Optional[float]:
    if value is None:
        return None
    if isinstance(value, bool):
        raise TypeError("bool")
    if isinstance(value, str):
        if value not in ("nan", "inf", "-inf"):
            raise ValueError(value)
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(type(value).__name__)


# ---------------------------------------------------------------------------------------------------------
# CLI helpers (wired into mindguard/cli.py)
# ---------------------------------------------------------------------------------------------------------

def failing_iteration(path: PathLike) -> int:
    """The 0-based dump iteration of the step a failure record names, for DumpOnDemand and StepCapture.

    A record of a run that died mid-step (status ``"running"``) names the step in progress: that step is
    the one to examine. Raises :class:`RecordError` (a ``ValueError``) for an unreadable record, a run
    that finished without failing (its ``dump_iteration`` is just its last step), or a run that never
    reached a step. For a sink-mode failure (``iteration_range`` wider than one step) it returns the last
    iteration of the window and says so with a warning.
    """
    record = FailureRecord.load(path)
    if record.status == "finished":
        raise RecordError(f"{str(path)!r} is the record of a run that finished without a failure; its dump_iteration "
                          f"({record.dump_iteration}) is only its last step. Pass iteration= to examine a chosen "
                          f"step, or point record= at the record of a failed run")
    if record.dump_iteration is None:
        raise RecordError(f"{str(path)!r} names no step (status {record.status!r}): the training never reached its "
                          f"first step. Pass iteration= explicitly")
    window = record.iteration_range
    if window and window[0] != window[1]:
        import warnings

        warnings.warn(f"{str(path)!r}: the failure happened inside a sink window covering dump iterations "
                      f"{window[0]}-{window[1]}; examining the last one ({record.dump_iteration}). Train with "
                      f"dataset_sink_mode=False (or sink_size=1) while hunting to know the exact step", stacklevel=2)
    return int(record.dump_iteration)


def cli_iteration(args) -> int:
    """``mindguard iteration --epoch E --step S --steps-per-epoch N [--initial-iteration K]``."""
    try:
        iteration = dump_iteration(args.epoch, args.step, args.steps_per_epoch,
                                   initial_iteration=args.initial_iteration)
    except (TypeError, ValueError) as exc:
        print(f"mindguard iteration: error: {exc}", file=sys.stderr)
        return 2
    n, e, s, k = args.steps_per_epoch, args.epoch, args.step, args.initial_iteration
    global_step = n * (e - 1) + s
    print(f"dump iteration {iteration}")
    print(f"  = steps_per_epoch * (epoch - 1) + step - 1 + initial_iteration = {n} * ({e} - 1) + {s} - 1 + {k}")
    print(f"  (global step {global_step} is 1-based; dump iterations are 0-based: put \"{iteration}\" in the dump "
          f"config's \"iteration\")")
    return 0


def cli_record(args) -> int:
    """``mindguard record PATH [--json]``: print a failure record (every rank's, when distributed)."""
    from ._dist import rank_paths

    paths = rank_paths(args.path) or [Path(args.path)]
    records: List[Tuple[Path, FailureRecord]] = []
    for path in paths:
        try:
            records.append((path, FailureRecord.load(path)))
        except RecordError as exc:
            print(f"mindguard record: error: {exc}", file=sys.stderr)
            return 2
    if getattr(args, "json", False):
        payload = [r.to_dict() for _, r in records]
        print(json.dumps(payload[0] if len(payload) == 1 else payload, indent=2))
        return 0
    for index, (path, record) in enumerate(records):
        if index:
            print()
        print(f"{path}: {record.format()}")
        for key, value in record.to_dict().items():
            print(f"  {key:<18} {json.dumps(value)}")
    return 0
