"""The failure record of a training run (one JSON object per rank) and the dump-iteration arithmetic.

Index bases (the record's fields):

* ``global_step`` -- 1-based count of training steps **in this process**: over every ``Model.train`` /
  ``Model.fit`` call, every train network and every ``mindguard.watch`` step (MindSpore's own
  ``cur_step_num`` restarts in every ``Model.train`` call; this does not).
* ``call`` -- which training call the step belongs to: ``{"index": n, "network": "<class>", "kind": k}``
  with ``n`` 1-based over the process and ``k`` one of ``"train"`` (``Model.train``/``fit``) or ``"watch"``.
* ``epoch``, ``step_in_epoch`` -- 1-based, as MindSpore printed them in that call (``epoch: 3 step: 2``).
* ``dump_iteration`` -- the 0-based iteration id MindSpore's data dump gives that step, and ``graph`` the
  kernel graph that ran it; ``dump_graphs`` maps every kernel graph that ran in the step to its iteration id
  (a grad graph and an optimizer graph can run one step as iterations 3 and 4). With several graphs or training calls
  these do not follow from the step (docs/mindspore-facts.md); ``iteration_observed`` says whether they were *observed*
  (read from MindSpore's own execution-order record under ``mindguard hunt``) or estimated from the step count.
  ``dump_candidates`` (written only then): the iterations a step that raised may have run as (MindSpore lists a graph
  run only once it completes), from what was observed of every graph's own count.

Nothing here imports MindSpore: ``mindguard iteration`` and ``mindguard record`` start instantly.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import math
import numbers
import os
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Union, overload

from .._util.args import require_int
from .._util.io import atomic_write_json, read_regular_text
from ..errors import ArgumentError, ArgumentTypeError, MindguardWarning, RecordError
from . import folder as layout

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)


class Status(str, enum.Enum):
    """Where the run is: ``running`` (a step in progress, or killed in one), ``failed``, ``finished``."""

    RUNNING = "running"
    FAILED = "failed"
    FINISHED = "finished"


class Kind(str, enum.Enum):
    """What failed. The members are ``str``: ``Kind.EXCEPTION == "exception"``, as JSON writes them."""

    NONFINITE_LOSS = "nonfinite_loss"
    NONFINITE_GRADS = "nonfinite_grads"
    NONFINITE_PARAMS = "nonfinite_params"
    LOSS_SCALE_COLLAPSE = "loss_scale_collapse"
    EXCEPTION = "exception"
    INTERRUPTED = "interrupted"


class Phase(str, enum.Enum):
    """Where an exception came from: inside a ``step``, ``between_steps`` (the dataset pipeline), the ``script``'s
    own code, or ``mindguard``'s own bug."""

    STEP = "step"
    BETWEEN_STEPS = "between_steps"
    SCRIPT = "script"
    MINDGUARD = "mindguard"


class Examiner(str, enum.Enum):
    """How the failing step is examined: MindSpore's ``dump`` of the compiled step, or an eager ``replay``."""

    DUMP = "dump"
    REPLAY = "replay"


STATUSES = tuple(s.value for s in Status)
KINDS = tuple(k.value for k in Kind)
CALL_KINDS = ("train", "watch")
PHASES = tuple(p.value for p in Phase)
EXAMINERS = tuple(e.value for e in Examiner)

PathLike = Union[str, "os.PathLike[str]"]


# ---------------------------------------------------------------------------------------------------------
# dump iteration arithmetic
# ---------------------------------------------------------------------------------------------------------

def dump_iteration(epoch: int, step: int, steps_per_epoch: int, *, initial_iteration: int = 0) -> int:
    """The iteration id MindSpore's data dump gives to step ``step`` of epoch ``epoch``.

    ``epoch`` and ``step`` are 1-based, as MindSpore prints them (``epoch: 3 step: 50``); ``step`` counts
    inside the epoch (1..``steps_per_epoch``). The dump numbers iterations from 0 and keeps counting across
    epochs, plus the dump config's ``initial_iteration`` offset (default 0)::

        dump_iteration = steps_per_epoch * (epoch - 1) + step - 1 + initial_iteration

    ``steps_per_epoch * (epoch - 1) + step`` alone -- the formula in the field report -- is the 1-based
    *global step* (MindSpore's ``cur_step_num``), one more than the dump iteration. Example: 100 steps per
    epoch, epoch 3, step 50 is global step 250 and dump iteration 249.

    Holds for one training graph that is the first graph of the process, trained by one ``Model.train`` call.
    With several graphs (an earlier ``model.eval`` or forward call, two train networks, ``model.fit``'s
    validation) MindSpore's numbering is not arithmetic: ``mindguard hunt`` observes it instead.
    """
    epoch = require_int("epoch (1-based)", epoch, minimum=1)
    steps_per_epoch = require_int("steps_per_epoch", steps_per_epoch, minimum=1)
    step = require_int("step (1-based, inside the epoch)", step, minimum=1)
    initial_iteration = require_int("initial_iteration", initial_iteration, minimum=0)
    if step > steps_per_epoch:
        raise ArgumentError(
            f"step must be between 1 and steps_per_epoch ({steps_per_epoch}), got {step}: pass the step inside "
            f"the epoch, not the global step (global step {step} is epoch "
            f"{(step - 1) // steps_per_epoch + 1}, step {(step - 1) % steps_per_epoch + 1})"
        )
    return steps_per_epoch * (epoch - 1) + step - 1 + initial_iteration


# ---------------------------------------------------------------------------------------------------------
# the record
# ---------------------------------------------------------------------------------------------------------

_INT_FIELDS = ("epoch", "step_in_epoch", "global_step", "dump_iteration", "graph", "steps_per_epoch", "sink_size",
               "rank", "group_size", "seed", "stopped_by_rank", "seen_at_step", "params_finite_after", "params_checked")
_STR_FIELDS = ("device_target", "mindspore_version", "mindguard_version", "message", "time", "mode", "cwd", "run_id",
               "states")


#: Keys written only when they have a value.
_WRITTEN_WHEN_SET = ("seen_at_step", "params_finite_after", "failure_window", "kept_state", "param_checks", "argv",
                     "cwd", "params_checked", "dump_candidates", "run_id", "states", "sources", "checks_lost",
                     "unrestorable_random", "data_sources", "checkpoints", "raised_by", "loss_history",
                     "learning_rate", "divergence", "costs")


@dataclasses.dataclass
class FailureRecord:
    """The failure record (one JSON object per rank). Field meanings and index bases: see the module docstring.

    ``status`` is ``"running"`` while training (the step fields name the step in progress), ``"failed"`` (``kind``
    says why) or ``"finished"`` (``kind`` is ``None``; the step fields name the last step run). ``loss`` is a float
    in Python; in the JSON file a non-finite loss is written as the string ``"nan"``, ``"inf"`` or ``"-inf"`` so
    that strict JSON readers (``jq``, browsers) can read it. ``nonfinite`` names the non-finite tensors
    (``"loss"``, ``"gradients"``, parameter names).

    Where the step was: ``global_step`` (1-based over the whole process), ``call``, ``epoch``/``step_in_epoch``
    (as MindSpore printed them in that call), ``dump_iteration``/``graph`` (see the module docstring).
    How it can be examined: ``mode`` (``"graph"`` | ``"pynative"``), ``examine`` (``"dump"``: the step ran
    compiled and MindSpore's dump can record its operators; ``"replay"``: it ran eagerly and is captured and
    replayed), ``phase`` (``"step"``: the failure happened inside the step; ``"between_steps"``: an exception
    between two steps, e.g. from the dataset pipeline, then ``global_step`` is the step whose batch was being
    fetched; ``"script"``: an exception of the script's own code -- raised after the checks of step
    ``global_step`` passed (a callback, the code between steps), or by a callback of the script's own during it --
    not of the training's numbers, which ``mindguard hunt`` does not dump; ``"mindguard"``: mindguard's own code failed,
    not the training), ``step_window_us`` (``[start, end]`` wall-clock microseconds of the failing step, as the dump's
    file names count time).

    Distributed runs (one record per rank; these two keys are written only when ``group_size > 1``):
    ``stopped_by_rank`` is the rank whose failure made this rank stop at the same step (``None`` on that rank
    itself, and when no single rank can be named), ``origin_kind`` that rank's ``kind``; ``message`` says what
    this rank saw (e.g. finite inputs and loss, parameters non-finite after the gradient AllReduce).

    ``seen_at_step`` (written only when set): the global step at whose end the failure was seen, one after
    ``global_step`` when the verdict was read one step late (``FailureLocator(defer_check=...)``, the default
    on GPU/Ascend); that step's update ran too.

    What an always-on Guard knows (it checks the loss every step and the Parameters on a time budget,
    :mod:`mindguard.training.budget`; written only when set): ``params_finite_after`` -- the last global step after
    which every Parameter was checked finite; ``failure_window`` -- ``[first, last]`` global steps, when the step that
    made the Parameters non-finite lies somewhere between them (``global_step`` is ``last``, where it was seen;
    ``mindguard hunt --from`` finds the exact one); ``kept_state`` -- ``{"path": folder, "step": s}``, the training
    state kept at the beginning of global step ``s`` (Parameters checked finite after ``s - 1``) that ``mindguard hunt
    --from`` resumes from; ``param_checks`` -- the check budget (checks made, their cost in ms, the step time in ms, the
    interval in steps); ``argv``/``cwd`` -- the command line and folder of the process.

    Which run wrote it (outside the hunt; written only when set): ``run_id`` -- the run's id (start time and process
    id, ``20261203-130512-4242``): a failed run's record is kept as ``<name>.<run_id>.json`` beside the usual one,
    and its states in ``states`` -- the folder ``<name>.state/<run_id>/`` where the run keeps them;
    ``kept_state`` then also holds the state's ``run_id`` and ``sha256`` (of its ``state.npz``), so a state of
    another run is refused; ``sources`` -- ``{path: sha256}`` of the script and the project files it had imported
    when training started (paths relative to ``cwd``), so ``mindguard hunt --from`` names an edit; ``data_sources``
    -- ``{path: fingerprint}`` of the files and folders the dataset pipeline read (its source stages' files; size,
    file count and newest modification time, not the bytes: ``mindguard.training.provenance.data_fingerprint``),
    so a data file changed since the failure is named too.
    ``params_checked`` (written when set): how many Parameters a step's check covers (0: the loss only).
    ``checks_lost`` (written when set): the checks mindguard's own errors disabled during the run, each
    ``{"check": name, "from_step": 1-based global step, "reason": the error}``; the training went on without them.
    ``unrestorable_random`` (written when set): the random sources of the step that no kept state can hold
    (``"nn.Dropout in `net.drop`"``), known when the first state is kept: ``mindguard hunt --from`` then runs from step
    1.
    ``checkpoints`` (written only at a failure of the training's numbers, when its ``ModelCheckpoint`` wrote files;
    ``mindguard.training.user_checkpoints``): ``from_step`` -- the first global step whose end may hold non-finite
    weights (after the last passing Parameter check); ``poisoned`` -- the files on disk holding the end of a step at or
    after it that are not known finite, oldest first, each ``{"path", "step", "finite": false | null, "how"}``
    (``step``: the global step whose end it holds; ``how``: ``"read"`` back, ``"checked"`` by mindguard's Parameter
    check, ``"inferred"`` from another file read back, ``"not_read"``; a file read back non-finite adds
    ``nonfinite``, the first names, and ``nonfinite_count``); ``last_good`` -- the newest file known finite, the same
    keys, or null.
    ``raised_by`` (written when set): the callback of the script's whose own exception ended the run, ``{"callback":
    class name, "hook": "on_train_step_end", "line": "file:line"}`` (``kind`` ``"exception"``, ``phase`` ``"script"``,
    or null before the first step): not a failure of the training -- Guard printed no ``mindguard hunt`` line and kept
    no state for it; ``mindguard hunt --from`` says so and exits 4.
    Where the divergence began (written at a failure once a step ended; issue 52, ``mindguard.protocol.divergence``):
    ``loss_history`` -- ``{"steps": [...], "loss": [...]}``, the loss of each global step (``"nan"``/``"inf"`` as
    strings; the last 1024 steps exactly, older ones thinned); ``learning_rate`` -- the optimizer's learning rate,
    ``{"name", "schedule": [one value per step], "offset"}`` (a dynamic rate: the value of global step ``s`` is
    ``schedule[s - 1 + offset]``) or ``{"name", "changes": [[step, value], ...]}`` (a scalar rate, each time it
    changed); ``divergence`` -- the shape of the losses up to the failure: ``kind`` (``"growth"``: the loss climbed
    from ``onset`` (``onset_loss``) to ``end`` (``end_loss``, ``factor`` times) before it went non-finite at
    ``failed``; ``"spike"``: one batch jumped at ``onset``; ``"sudden"``: steady up to the failure; ``"unknown"``:
    too few steps), ``base`` (the healthy level), ``words``, and ``rate`` (what the learning rate did, ``origin``
    when it is the likely cause).
    ``costs`` (written at a failure when known; issue 51): what a new process of the run costs, for ``mindguard hunt
    --from``'s choice between one pass and two -- ``process_started`` and ``first_step_end`` (``time.time()`` seconds:
    start, imports, the script's setup and the first compile lie between them), ``step_seconds`` (mean seconds a
    step since), ``state_bytes`` (the training state's bytes: a step's dump is about that size).
    """

    schema: int = SCHEMA
    status: str = "running"
    kind: Optional[str] = None
    global_step: Optional[int] = None
    call: Optional[Dict[str, Any]] = None
    epoch: Optional[int] = None
    step_in_epoch: Optional[int] = None
    dump_iteration: Optional[int] = None
    graph: Optional[int] = None
    dump_graphs: Optional[Dict[str, int]] = None
    iteration_observed: bool = False
    dump_candidates: Optional[List[int]] = None
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
    mode: Optional[str] = None
    examine: Optional[str] = None
    phase: Optional[str] = None
    step_window_us: Optional[List[int]] = None
    seen_at_step: Optional[int] = None
    params_finite_after: Optional[int] = None
    failure_window: Optional[List[int]] = None
    kept_state: Optional[Dict[str, Any]] = None
    param_checks: Optional[Dict[str, Any]] = None
    argv: Optional[List[str]] = None
    cwd: Optional[str] = None
    params_checked: Optional[int] = None
    run_id: Optional[str] = None
    states: Optional[str] = None
    sources: Optional[Dict[str, str]] = None
    checks_lost: Optional[List[Dict[str, Any]]] = None
    unrestorable_random: Optional[List[str]] = None
    data_sources: Optional[Dict[str, Dict[str, Any]]] = None
    checkpoints: Optional[Dict[str, Any]] = None
    raised_by: Optional[Dict[str, Any]] = None
    loss_history: Optional[Dict[str, Any]] = None
    learning_rate: Optional[Dict[str, Any]] = None
    divergence: Optional[Dict[str, Any]] = None
    costs: Optional[Dict[str, Any]] = None

    # -- (de)serialisation -------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The JSON-ready dict, keys in the contract's order."""
        # shallow copy (lists copied): dataclasses.asdict deep-copies, ~5x slower on the per-step path
        data = {f.name: (list(v) if isinstance(v, list) else v)
                for f in dataclasses.fields(self) for v in (getattr(self, f.name),)}
        data["loss"] = _loss_to_json(self.loss)
        if not (self.group_size or 1) > 1 and self.stopped_by_rank is None and self.origin_kind is None:
            del data["stopped_by_rank"], data["origin_kind"]  # distributed-only keys
        for name in _WRITTEN_WHEN_SET:   # (params_checked: by watch, how many Parameters a step checks, 0: the loss
            if data[name] is None:       # only; dump_candidates: a step MindSpore listed no iteration for)
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "record") -> "FailureRecord":
        """Build a record from a decoded JSON object, or raise :class:`RecordError` naming ``source`` and the field."""
        if not isinstance(data, dict):
            raise RecordError(f"{source}: expected a JSON object (a mindguard failure record), got "
                              f"{type(data).__name__}")
        if data.get("schema") not in READABLE_SCHEMAS:
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
        for name, allowed in (("mode", ("graph", "pynative")), ("examine", EXAMINERS), ("phase", PHASES)):
            if data.get(name) is not None and data[name] not in allowed:
                raise RecordError(f"{source}: {name} must be null or one of {list(allowed)}, got {data[name]!r}")
        call = data.get("call")
        if call is not None and not (isinstance(call, dict) and isinstance(call.get("index"), int)
                                     and not isinstance(call.get("index"), bool) and call["index"] >= 1
                                     and isinstance(call.get("network"), str) and call.get("kind") in CALL_KINDS):
            raise RecordError(f"{source}: call must be null or {{\"index\": n >= 1, \"network\": name, \"kind\": "
                              f"one of {list(CALL_KINDS)}}}, got {call!r}")
        window = data.get("step_window_us")
        if window is not None and not (isinstance(window, list) and len(window) == 2
                                       and all(isinstance(v, int) and not isinstance(v, bool) for v in window)):
            raise RecordError(f"{source}: step_window_us must be null or [start, end], got {window!r}")
        graphs = data.get("dump_graphs")
        if graphs is not None and not (isinstance(graphs, dict) and all(
                isinstance(k, str) and k.isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0
                for k, v in graphs.items())):
            raise RecordError(f"{source}: dump_graphs must be null or {{\"<graph id>\": <iteration>}}, got {graphs!r}")
        candidates = data.get("dump_candidates")
        if candidates is not None and not (isinstance(candidates, list) and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in candidates)):
            raise RecordError(f"{source}: dump_candidates must be null or a list of iterations >= 0, "
                              f"got {candidates!r}")
        observed = data.get("iteration_observed", False)
        if not isinstance(observed, bool):
            raise RecordError(f"{source}: iteration_observed must be true or false, got {observed!r}")
        for name in _INT_FIELDS:
            value = data.get(name)
            if name == "sink_size":   # MindSpore's sink_size default is -1 (no sink window)
                if value is not None and (value < -1 or value == 0):
                    raise RecordError(f"{source}: sink_size must be -1 (no sink), a positive count or null, "
                                      f"got {value!r}")
            elif value is not None and value < 0:
                raise RecordError(f"{source}: {name} must be >= 0 or null, got {value!r}")
        window = data.get("iteration_range")
        if window is not None and not 0 <= window[0] <= window[1]:
            raise RecordError(f"{source}: iteration_range must be null or [first, last] with 0 <= first <= last, "
                              f"got {window!r}")
        window = data.get("step_window_us")   # wall-clock: end < start only if the clock was set back
        if window is not None and min(window) < 0:
            raise RecordError(f"{source}: step_window_us must be null or [start, end] in microseconds >= 0, "
                              f"got {window!r}")
        window = data.get("failure_window")
        if window is not None and not (isinstance(window, list) and len(window) == 2 and all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in window) and window[0] <= window[1]):
            raise RecordError(f"{source}: failure_window must be null or [first, last] 1-based global steps, "
                              f"got {window!r}")
        kept = data.get("kept_state")
        if kept is not None and not (isinstance(kept, dict) and isinstance(kept.get("path"), str)
                                     and isinstance(kept.get("step"), int) and not isinstance(kept.get("step"), bool)):
            raise RecordError(f"{source}: kept_state must be null or {{\"path\": folder, \"step\": n}}, got {kept!r}")
        sources = data.get("sources")
        if sources is not None and not (isinstance(sources, dict) and all(
                isinstance(k, str) and isinstance(v, str) for k, v in sources.items())):
            raise RecordError(f"{source}: sources must be null or {{\"<path>\": \"<sha256>\"}}, got {sources!r}")
        data_sources = data.get("data_sources")
        if data_sources is not None and not (isinstance(data_sources, dict) and all(
                isinstance(k, str) and isinstance(v, dict) for k, v in data_sources.items())):
            raise RecordError(f"{source}: data_sources must be null or {{\"<path>\": {{fingerprint}}}}, "
                              f"got {data_sources!r}")
        checkpoints = data.get("checkpoints")
        if checkpoints is not None and not (isinstance(checkpoints, dict) and isinstance(
                checkpoints.get("poisoned", []), list) and all(
                isinstance(v, dict) and isinstance(v.get("path"), str) for v in checkpoints.get("poisoned", []))
                and (checkpoints.get("last_good") is None or isinstance(checkpoints.get("last_good"), dict))):
            raise RecordError(f"{source}: checkpoints must be null or {{\"from_step\": n, \"poisoned\": [{{\"path\": "
                              f"file, ...}}], \"last_good\": {{...}} | null}}, got {checkpoints!r}")
        raised_by = data.get("raised_by")
        if raised_by is not None and not (isinstance(raised_by, dict) and isinstance(raised_by.get("callback"), str)
                                          and isinstance(raised_by.get("hook"), str)):
            raise RecordError(f"{source}: raised_by must be null or {{\"callback\": name, \"hook\": name, \"line\": "
                              f"\"file:line\"}}, got {raised_by!r}")
        lost = data.get("checks_lost")
        if lost is not None and not (isinstance(lost, list) and all(
                isinstance(v, dict) and isinstance(v.get("check"), str) and isinstance(v.get("reason"), str)
                for v in lost)):
            raise RecordError(f"{source}: checks_lost must be null or a list of {{\"check\": name, \"from_step\": n, "
                              f"\"reason\": text}}, got {lost!r}")
        for key in ("argv", "unrestorable_random"):
            value = data.get(key)
            if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
                raise RecordError(f"{source}: {key} must be null or a list of strings, got {value!r}")
        for key in ("loss_history", "learning_rate", "divergence"):
            value = data.get(key)
            if value is not None and not isinstance(value, dict):
                raise RecordError(f"{source}: {key} must be null or an object, got {value!r}")
        costs = data.get("costs")
        if costs is not None and not (isinstance(costs, dict) and all(
                v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in costs.values())):
            raise RecordError(f"{source}: costs must be null or an object of numbers, got {costs!r}")
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
        values.update(loss=loss, nonfinite=list(nonfinite), schema=SCHEMA)
        return cls(**values)

    @classmethod
    def as_written(cls, data: Dict[str, Any]) -> "FailureRecord":
        """The record ``data`` (a decoded JSON object) read as it was written, without validation: its known fields
        with their values as they are (``loss`` too), a field it lacks at its default, unknown keys left out. For a
        reader that must not refuse what a failing process left (the hunt reads its passes' records so);
        :meth:`from_dict` validates."""
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})

    def save(self, path: PathLike, *, fsync: bool = False) -> Path:
        """Write the record atomically (readers never see half a file) and return the path."""
        return atomic_write_json(path, self.to_dict(), fsync=fsync)

    @classmethod
    def load(cls, path: PathLike) -> "FailureRecord":
        """Read a record written by :class:`FailureLocator` (a running one with the step in progress:
        ``mindguard.protocol.record.read_record_data``); :class:`RecordError` names the file and the problem."""
        return cls.from_dict(read_record_data(path), source=repr(str(path)))

    # -- human summary -----------------------------------------------------------------------------------
    def position(self) -> str:
        """``"epoch 2, step 3/8 (global step 11), dump iteration 10"`` (or ``"before the first step"``)."""
        if self.global_step is None:
            return "before the first step"
        parts = []
        if self.group_size is not None and self.group_size > 1:
            parts.append(f"rank {self.rank}/{self.group_size}, ")
        if self.call and self.call.get("index", 1) > 1:
            parts.append(f"training call {self.call['index']} ({self.call.get('network')}), ")
        if self.epoch is not None and self.step_in_epoch is not None:
            total = f"/{self.steps_per_epoch}" if self.steps_per_epoch else ""
            parts.append(f"epoch {self.epoch}, step {self.step_in_epoch}{total} (global step {self.global_step})")
        else:
            parts.append(f"global step {self.global_step}")
        if self.dump_iteration is not None:
            parts.append(f", dump iteration {self.dump_iteration}")
        if self.iteration_range:
            parts.append(f" (sink window: dump iterations {self.iteration_range[0]}-{self.iteration_range[1]})")
        return "".join(parts)

    def format(self) -> str:
        """One line: where, and what went wrong (or that the run is in progress / finished). Control characters
        from the file (terminal escapes in ``message`` or a network name) are shown escaped, never sent."""
        if self.status == "running":
            return _printable(f"running: {self.position()} in progress")
        if self.status == "finished":
            checked = " (the loss only: no Parameter was checked)" if self.params_checked == 0 else ""
            return _printable(f"finished without failure{checked}; last step: {self.position()}")
        return _printable(f"{self.position()}: {self.message or self.kind}")

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
        raise ArgumentTypeError("bool")
    if isinstance(value, str):
        if value not in ("nan", "inf", "-inf"):
            raise ArgumentError(value)
        return float(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise ArgumentTypeError(type(value).__name__)


_RECORD_LIMIT = 1 << 20  # bytes: a record is a few KB; anything larger is not one


@overload
def _printable(text: str) -> str: ...
@overload
def _printable(text: None) -> None: ...
def _printable(text: Optional[str]) -> Optional[str]:
    """``text`` with control characters (terminal escapes) shown as ``\\x1b``, so a record cannot drive a terminal."""
    if text is None:
        return None
    return "".join(ch if ch.isprintable() or ch in "\n\t" else ch.encode("unicode_escape").decode("ascii")
                   for ch in text)


def failing_record(path: PathLike) -> "FailureRecord":
    """The record at ``path`` when it names a failing step (or the step a killed run was in), else
    :class:`RecordError`: unreadable, a run that finished without failing, or one that never reached a step."""
    record = FailureRecord.load(path)
    if record.status == "finished":
        raise RecordError(f"{str(path)!r} is the record of a run that finished without a failure; its step "
                          f"(global step {record.global_step}) is only its last one. Pass the step to examine "
                          f"explicitly, or point record= at the record of a failed run")
    if record.global_step is None:
        raise RecordError(f"{str(path)!r} names no step (status {record.status!r}): the training never reached its "
                          f"first step. Pass the step explicitly")
    return record


def failing_iteration(path: PathLike) -> int:
    """The 0-based dump iteration of the step a failure record names, for DumpOnDemand and StepCapture.

    A record of a run that died mid-step (status ``"running"``) names the step in progress: that step is
    the one to examine. Raises :class:`RecordError` (a ``ValueError``) for an unreadable record, a run
    that finished without failing (its ``dump_iteration`` is just its last step), or a run that never
    reached a step. For a sink-mode failure (``iteration_range`` wider than one step) it returns the last
    iteration of the window and says so with a warning.
    """
    record = failing_record(path)
    if record.dump_iteration is None:
        raise RecordError(f"{str(path)!r} names no dump iteration for global step {record.global_step}: several "
                          f"graphs ran, so MindSpore's number for it could not be told. Pass iteration= explicitly, or "
                          f"use mindguard hunt (it observes the number)")
    window = record.iteration_range
    if window and window[0] != window[1]:
        warnings.warn(f"{str(path)!r}: the failure happened inside a sink window covering dump iterations "
                      f"{window[0]}-{window[1]}; examining the last one ({record.dump_iteration}). Train with "
                      f"dataset_sink_mode=False (or sink_size=1) while hunting to know the exact step",
                      MindguardWarning, stacklevel=2)
    return int(record.dump_iteration)


def _record_document(path: PathLike) -> Any:
    """The JSON document at ``path``, as written; :class:`RecordError` names the file and the problem."""
    path = Path(path)
    try:
        text = read_regular_text(path, limit=_RECORD_LIMIT)
    except FileNotFoundError:
        raise RecordError(f"no failure record at {str(path)!r}: the file does not exist (FailureLocator writes "
                          f"it when training starts; with several ranks it is named <name>.rank<N>.json)") from None
    except UnicodeDecodeError as exc:
        raise RecordError(f"{str(path)!r} is not a mindguard failure record: not UTF-8 text (byte "
                          f"{exc.start})") from None
    except (OSError, ValueError) as exc:
        raise RecordError(f"cannot read failure record {str(path)!r}: {getattr(exc, 'strerror', None) or exc}"
                          ) from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise RecordError(f"{str(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                          f"{exc.colno}); is it a mindguard failure record?") from None
    except RecursionError:
        raise RecordError(f"{str(path)!r} is not a mindguard failure record: JSON nested too deeply") from None
    except ValueError as exc:   # an integer of more than 4300 digits: no record field is one
        raise RecordError(f"{str(path)!r} is not a mindguard failure record: {exc}") from None
    return data


def progress_problem(path: PathLike) -> Optional[str]:
    """Why the progress file beside the running record at ``path`` cannot say the step in progress (damaged,
    truncated, another run's), or ``None`` (usable, absent, or the record is not running)."""
    try:
        data = _record_document(path)
    except RecordError:
        return None
    progress = layout.progress_beside(path)
    if not isinstance(data, dict) or data.get("status") != "running" or not progress.exists():
        return None
    try:
        found = json.loads(read_regular_text(progress, limit=_RECORD_LIMIT))
    except (OSError, ValueError, RecursionError) as exc:
        return (f"the progress file {progress} is damaged ({getattr(exc, 'msg', None) or exc}): the record alone "
                f"does not say the step the run was in")
    if not (isinstance(found, dict) and found.get("argv") == data.get("argv") and found.get("cwd") == data.get("cwd")
            and isinstance(found.get("global_step"), int)):
        return (f"the progress file {progress} is not this run's or is damaged: the record alone does not say the "
                f"step the run was in")
    return None


def read_record_data(path: PathLike) -> Any:
    """The record at ``path`` as a dict -- while it says ``running``, the running record of the step in progress
    that an always-on Guard stores into the progress file beside it (:func:`protocol.folder.progress_beside`), when
    that file holds one of the same run (same command line and folder) at the same step or later.
    :class:`RecordError` when the record itself cannot be read."""
    data = _record_document(path)
    if not isinstance(data, dict) or data.get("status") != "running":
        return data
    try:
        progress = json.loads(read_regular_text(layout.progress_beside(path), limit=_RECORD_LIMIT))
    except (OSError, ValueError, RecursionError):   # none (a record of the hunt's, an older version's), or unreadable
        return data
    if isinstance(progress, dict) and progress.get("status") == "running" \
            and progress.get("argv") == data.get("argv") and progress.get("cwd") == data.get("cwd") \
            and isinstance(progress.get("global_step"), int) \
            and progress["global_step"] >= (data.get("global_step") if isinstance(data.get("global_step"), int) else 0):
        return progress
    return data
