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
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional

from .._util.args import require_int
from .._util.io import atomic_write_json
from ..errors import ArgumentError, MindguardWarning, RecordError
from .record_checks import check_record_data
from .record_json import PathLike as PathLike, loss_to_json, one_line, printable
from .record_json import progress_problem as progress_problem, read_record_data as read_record_data
from .record_json import record_document
# the record's vocabularies, defined in record_vocab.py: record.py stays the module that names them
from .record_vocab import (CALL_KINDS as CALL_KINDS, EXAMINERS as EXAMINERS, KINDS as KINDS, PHASES as PHASES,
                           READABLE_SCHEMAS as READABLE_SCHEMAS, SCHEMA as SCHEMA, STATUSES as STATUSES,
                           Examiner as Examiner, Kind as Kind, Phase as Phase, Status as Status)


_record_document = record_document   # training/state_folder.py reads a record's document through this name


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
    fetched; ``"loader"``: the script's own data loader (a generator or iterator its loop iterates) raised making
    the batch of ``global_step``, exactly that step (it reads nothing ahead); ``"script"``: an exception of the
    script's own code -- raised after the checks of step ``global_step`` passed (a callback, the code between
    steps), or by a callback of the script's own during it -- not of the training's numbers, which ``mindguard
    hunt`` does not dump; ``"mindguard"``: mindguard's own code failed, not the training), ``step_window_us``
    (``[start, end]`` wall-clock microseconds of the failing step, as the dump's file names count time).

    Distributed runs (one record per rank; these two keys are written only when ``group_size > 1``):
    ``stopped_by_rank`` is the rank whose failure made this rank stop at the same step (``None`` on that rank
    itself, and when no single rank can be named), ``origin_kind`` that rank's ``kind``; ``message`` says what
    this rank saw (e.g. finite inputs and loss, parameters non-finite after the gradient AllReduce).

    ``seen_at_step`` (written only when set): the global step at whose end the failure was seen, one after
    ``global_step`` when the verdict was read one step late (``FailureLocator(defer_check=...)``, the default
    on GPU/Ascend); that step's update ran too.

    What an always-on Guard knows (it checks the loss every step and the Parameters on a time budget,
    :mod:`mindguard.training.checks.budget`; written only when set): ``params_finite_after`` -- the last global step
    after which every Parameter was checked finite; ``failure_window`` -- ``[first, last]`` global steps, when the step
    that made the Parameters non-finite lies somewhere between them (``global_step`` is ``last``, where it was seen;
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
    file count and newest modification time, not the bytes: ``mindguard.training.record.provenance.data_fingerprint``),
    so a data file changed since the failure is named too.
    ``params_checked`` (written when set): how many Parameters a step's check covers (0: the loss only).
    ``checks_lost`` (written when set): the checks mindguard's own errors disabled during the run, each
    ``{"check": name, "from_step": 1-based global step, "reason": the error}``; the training went on without them.
    ``unrestorable_random`` (written when set): the random sources of the step that no kept state can hold
    (``"nn.Dropout in `net.drop`"``), known when the first state is kept: ``mindguard hunt --from`` then runs from step
    1.
    ``checkpoints`` (written only at a failure of the training's numbers, when its ``ModelCheckpoint`` wrote files;
    ``mindguard.training.state.user_checkpoints``): ``from_step`` -- the first global step whose end may hold non-finite
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
        data["loss"] = loss_to_json(self.loss)
        if not (self.group_size or 1) > 1 and self.stopped_by_rank is None and self.origin_kind is None:
            del data["stopped_by_rank"], data["origin_kind"]  # distributed-only keys
        for name in _WRITTEN_WHEN_SET:   # (params_checked: by watch, how many Parameters a step checks, 0: the loss
            if data[name] is None:       # only; dump_candidates: a step MindSpore listed no iteration for)
                del data[name]
        return data

    @classmethod
    def from_dict(cls, data: Any, *, source: str = "record") -> "FailureRecord":
        """Build a record from a decoded JSON object, or raise :class:`RecordError` naming ``source`` and the field."""
        loss, nonfinite = check_record_data(data, source)
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}  # unknown keys: written by a newer minor version
        values.update(loss=loss, nonfinite=nonfinite, schema=SCHEMA)
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
            return printable(f"running: {self.position()} in progress")
        if self.status == "finished":
            checked = " (the loss only: no Parameter was checked)" if self.params_checked == 0 else ""
            return printable(f"finished without failure{checked}; last step: {self.position()}")
        return printable(f"{self.position()}: {one_line(self.message) if self.message else self.kind}")

    def __str__(self) -> str:
        return self.format()


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


