"""What ``mindguard hunt --from RECORD`` does with a failing run's record: pure decisions, no processes.

The record of an always-on :class:`~mindguard.Guard` says where training failed (``global_step``), how exactly
(``failure_window``: the step that made the Parameters non-finite is one of ``[first, last]``) and which training
state was kept before it (``kept_state``). :func:`plan_from_record` turns that, and what is on disk of the kept
state, into a :class:`FromRecordPlan`:

* ``"done"`` -- nothing to run: the run finished, was interrupted, or failed in the script's own code; or it
  failed before its first step;
* ``"resume"`` -- start from the kept state: a *locate* pass (every step checked, from the kept state through the
  window) names the exact step and keeps the state at it, then the examine pass starts there (no locate pass when
  the kept state is at the failing step itself, or for a dataset error, which the examine pass finds by itself);
* ``"from_step_1"`` -- the kept state cannot be used, or costs more to load than the steps it skips (``why`` says
  why): the record still names the step, so one locate pass from step 1 finds the exact one and dumps it as it runs
  (``dump_from_step_1``); the two passes of a plain hunt only where that cannot be done.

The plain hunt's decisions are here too: how the failing step is examined (:func:`examination`), what its dump
holds first and how it widens (:func:`first_scope`, :func:`wider_scope`), which dump iterations hold it
(:func:`iterations_to_dump`, :func:`resumed_iteration`), and whether pass 2 resumes from pass 1's kept state
(:func:`choose_resume`).

Steps are 1-based global steps (:mod:`mindguard.training.run`); dump iterations are MindSpore's, 0-based. Nothing here
imports MindSpore or starts a process.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..protocol.kept_state import StateLike, StateMeta, as_state_meta, unrestorable_note
from ..protocol.locate_dump import KEPT_BEHIND
from ..protocol.record import FailureRecord, Kind, Phase, Status
from ..protocol.cluster import parse_launch
from . import messages as say_
from .verdicts import DoneOutcome, DumpRefusal, Route

_read = FailureRecord.as_written   # a record as a failing process wrote it: read through its fields, not refused

#: The kinds of failure whose step is known only within a window (Parameters are checked now and then).
NONFINITE_KINDS = (Kind.NONFINITE_LOSS, Kind.NONFINITE_GRADS, Kind.NONFINITE_PARAMS, Kind.LOSS_SCALE_COLLAPSE)


@dataclasses.dataclass(frozen=True)
class FromRecordPlan:
    """The hunt's route from a failing run's record (see the module docstring)."""

    route: Route                                 # "done" | "resume" | "from_step_1"
    why: str                                     # one sentence for the user
    outcome: Optional[DoneOutcome] = None        # with "done": "healthy" | "command_failed" | "failed_before_training"
    #                                              | "found" (the record holds the answer: a loader's error)
    returncode: Optional[int] = None             # with "command_failed": the exit code to report
    failure: Optional[Dict[str, Any]] = None     # the failure to examine (a record that died mid-step made one)
    window: Optional[Tuple[int, int]] = None     # the steps the failing one lies in (first == last: exact)
    state_step: Optional[int] = None             # the global step the kept state begins
    state_warm_up: int = 0                       # the steps before it a pass resumed from it runs first (StateMeta)
    locate: bool = False                         # a locate pass runs before the examination
    killed: bool = False                         # the record is a killed run's: any failure in the window is its
    warnings: Tuple[str, ...] = ()
    approximate: Optional[str] = None            # the kept state cannot hold these random sources (one sentence): the
    #                                              resumed passes draw other masks, and the answer says so


def plan_from_record(record: Dict[str, Any], state_meta: Optional[StateLike], command: Sequence[str],
                     examination: str, state_note: Optional[str] = None, ranks: int = 1) -> FromRecordPlan:
    """Decide the route. ``record``: the failing run's record (a dict as written); ``state_meta``: the
    ``state.json`` of the state to resume from (``mindguard.protocol.kept_state.choose_kept_state``: the record's
    ``kept_state``, or the run's last complete one on disk; ``None`` when there is none usable); ``state_note``:
    why there is none, or why it is not the one the record names (one line); ``command``: what the hunt will run;
    ``examination``: how the failing step is examined (``"dump"`` | ``"replay"`` | ``"dataset"``); ``ranks``: the
    job's ranks -- several resume only from states every rank kept at one step (:func:`common_kept_step` gives
    ``state_meta``); their locate pass keeps each rank's state at the exact step as one process does."""
    status, step = record.get("status"), record.get("global_step")
    warnings: List[str] = []
    if status == Status.FINISHED:
        return FromRecordPlan("done", f"the run finished without a failure at global step {step}: nothing to hunt",
                              outcome="healthy")
    failure = dict(record)
    if status == Status.RUNNING:
        if not step:
            return FromRecordPlan("done", "the run ended before its first step without its record saying why: "
                                          "nothing to examine; run the command to see its error",
                                  outcome="failed_before_training")
        failure.update(status=Status.FAILED.value, kind=Kind.EXCEPTION.value,
                       message="the process ended during this step without its record saying why (killed -- by the "
                               "OOM killer, SIGKILL, os._exit -- or a crash of the interpreter)")
    if failure.get("kind") == Kind.INTERRUPTED:
        return FromRecordPlan("done", f"the run was interrupted (Ctrl-C) at global step {step}: nothing to hunt",
                              outcome="command_failed", returncode=130)
    if failure.get("phase") == Phase.LOADER:
        return FromRecordPlan("done", f"global step {step}'s batch could not be made: {failure.get('message')}. The "
                                      "loader reads nothing ahead, so this is the step and the line; fix or drop "
                                      "the sample it names (or make the loader skip what it cannot read)",
                              failure=failure, outcome="found")
    if failure.get("phase") == Phase.SCRIPT:
        return FromRecordPlan("done", f"at global step {step} the script raised {failure.get('message')}: an error "
                                      "of the script's own code, not of the training's numbers; nothing to dump",
                              outcome="command_failed", returncode=1)
    if not step:
        return FromRecordPlan("done", f"the run failed before its first training step "
                                      f"({failure.get('message') or 'no message'}); fix that first",
                              outcome="failed_before_training")
    argv = record.get("argv")
    launch = parse_launch(command)   # [nodes hook] under msrun the record holds the worker's argv, the line msrun's
    if argv and list(argv) != list(command) and not (launch is not None and launch.rest == list(argv)[1:]):
        warnings.append(f"the record was written by `{' '.join(argv)}`, the hunt runs `{' '.join(command)}`: the "
                        f"kept state is used only if the run computes the same from it")
    window = failure.get("failure_window") if failure.get("kind") in NONFINITE_KINDS else None
    first, last = (int(window[0]), int(window[1])) if window else (int(step), int(step))
    kept = record.get("kept_state")
    state = as_state_meta(state_meta)
    if state is None:
        why = state_note or ("the run kept no training state (Guard keeps one about every second of training once "
                             "its Parameters were checked finite, with keep_state=True)" if not kept else
                             f"the kept training state {kept.get('path')} is gone or unreadable")
        return FromRecordPlan("from_step_1", why, failure=failure, window=(first, last), warnings=tuple(warnings))
    if state_note:
        warnings.append(state_note)
    state_step = state.step
    killed = status == Status.RUNNING
    if killed and 1 < state_step <= first:   # the numbers may have gone bad at any step from the state to the kill
        first = max(state_step, int(record.get("params_finite_after") or 0) + 1)
    if not 1 < state_step <= first:
        return FromRecordPlan("from_step_1", f"the kept training state begins global step {state_step}, not before "
                                             f"the failure's first possible step {first}",
                              failure=failure, window=(first, last), warnings=tuple(warnings))
    loading = not_worth_loading(state) if examination == "dump" and ranks == 1 and not killed else None
    if loading is not None:   # (one process from step 1 all the same: Executor.from_record)
        return FromRecordPlan("from_step_1", loading, failure=failure, window=(first, last), warnings=tuple(warnings))
    # known when the state was kept: a resumed pass draws other masks; it runs all the same (a failure that comes from
    # the data or the weights repeats), its trace is not compared, and the answer says so
    approximate = unrestorable_note(state)
    locate = _locates_first(examination, first, last, state_step, ranks)
    how = (f"locate the exact step among global steps {first}-{last}, then examine it" if locate and first < last
           else f"run to global step {last} and keep the state there, then examine it" if locate
           else f"examine global step {last}")
    checkpoint = state.checkpoint_path
    source = f" (the training's own checkpoint {checkpoint})" if checkpoint else ""
    source += f", on every rank (0-{ranks - 1}) from its own" if ranks > 1 else ""
    return FromRecordPlan("resume", f"from the training state kept at global step {state_step}{source}: {how}",
                          failure=failure, window=(first, last), state_step=state_step, locate=locate,
                          warnings=tuple(warnings), killed=killed, approximate=approximate,
                          state_warm_up=state.warm_up)


def _locates_first(examination: str, first: int, last: int, state_step: int, ranks: int) -> bool:
    """Whether a pass resumed at ``state_step`` locates the failing step in ``first``-``last`` (1-based global
    steps) before it is examined: not for the dataset pipeline's error, nor a step the state begins; nor for an exact
    step a replay examines -- it captures its step by the global step count wherever the pass starts (a dump's
    iterations count from the pass's first step, so it needs the state kept at the step)."""
    if examination == "dataset" or first == last == state_step:
        return False
    return not (examination == "replay" and first == last and ranks == 1)


#: ``hunt --from``: whether the locate pass also dumps each step (keeping the failing one's) is weighed in seconds:
#: the dump's writes over the steps it runs against a second process's start (what the failing run took from its
#: process's start to its first step's end: imports, the script's setup, the compile). One step's dump is estimated
#: at :data:`DUMP_SHARE_OF_STATE` of the kept state's bytes (measured: 0.60 for the benchmark MLP with Momentum,
#: 0.48 for a 1 GB embedding table with Momentum -- the Parameters' gradients and outputs, about one copy of them)
#: written at :data:`DUMP_WRITE_BYTES_PER_S` (the MLP's 614 MB over 70 steps took 0.7-1.5 s more than without).
DUMP_SHARE_OF_STATE = 0.6
#: The same for a dump of every kernel's inputs and outputs (the first look at a step that raised), measured: the
#: full dump of a ResNet-18 step (767 MB) against its state with Momentum (90 MB).
FULL_DUMP_SHARE_OF_STATE = 8.5
#: A step's dump at each scope, as a share of the kept state's bytes (``all_outputs``: the ResNet-18's 226 MB).
SCOPE_SHARE_OF_STATE = {"outputs": DUMP_SHARE_OF_STATE, "all_outputs": 2.5, "full": FULL_DUMP_SHARE_OF_STATE}
#: ``hunt --from``'s first look is as wide as its writes allow at this share of a process's start (the failing
#: run's, from its start to its first step's end): a look that explains nothing costs another pass -- a process
#: start and a compile -- while a wider first look costs only its bytes (measured on the BERT-shaped fine-tune of
#: tests/zoo/bert_mask_fp16.py: outputs 1.25 MB, every op's inputs and outputs 1.48 MB; docs/benchmarks.md).
WIDE_LOOK_SHARE = 0.1
DUMP_WRITE_BYTES_PER_S = 0.5e9
#: What a second pass adds to its start for each byte of the state handed to it, in bytes a second (measured: ~13 s
#: for a 1.02 GB state -- the copy the locate pass keeps at the step read back, the skipped steps, the examine pass's
#: own copy and write; ~0.5 s for the benchmark MLP's 15 MB).
HANDOVER_BYTES_PER_S = 0.1e9
#: Without the failing run's start time (a state written before the failure): at most this many bytes of dump.
LOCATE_DUMP_BYTES = 1 << 30
#: Dump steps on disk at once while the locate pass prunes (:mod:`mindguard.training.child.window_dump`: the current
#: step and the ones kept behind it, one more for a step's files written across its end), beside 1 GiB left free.
ON_DISK_STEPS = KEPT_BEHIND + 2


#: The steps before the record's failing one a dumping locate pass dumps too, when the record's step is where the
#: failure showed in a check of every step (a loss, a gradient overflow): the exact step is that one, or the one before
#: when only a backward made the Inf/NaN (the loss shows it a step later). An earlier exact step (a Parameter gone
#: non-finite that no later batch read for a while) is then examined by a pass of its own.
LOCATE_DUMP_LEAD = 1


def locate_dump_iterations(plan: FromRecordPlan) -> str:
    """The dump iterations (0-based, MindSpore's ``iteration`` syntax) a dumping locate pass of ``plan`` arms.

    A failure a Parameter check found (``nonfinite_params``: checks are sparse, the exact step is anywhere in the
    window): ``"all"`` (``warm_up`` on, when the pass runs its warm-up first); a step that raised: ``"all"`` (its
    kernel graph is not known: a loop of several train cells numbers each graph's runs apart, so the step's iteration
    may be far below ``step - state_step``). Else from the record's step less :data:`LOCATE_DUMP_LEAD` on,
    open-ended. The pass resumes at ``plan.state_step`` running the network before it only for the state's
    ``plan.state_warm_up`` steps (:mod:`mindguard.training.state.warm_up`), so that step is the train graph's
    iteration ``state_warm_up`` and global step ``s`` its iteration ``s - state_step + state_warm_up``; a graph run
    before or between the steps (an evaluation) only numbers the later steps higher (the first run after a switch
    reuses the other graph's count: docs/mindspore-facts.md), which the open end covers. ``"all"`` when that would
    start at 0."""
    assert plan.window is not None and plan.state_step is not None
    if not _locate_dumps_every_step(plan):
        return resumed_dump_iterations(plan.window[1] - LOCATE_DUMP_LEAD, plan.state_step, plan.state_warm_up)
    if plan.failure is not None and _read(plan.failure).kind == Kind.EXCEPTION:
        return "all"
    return resumed_dump_iterations(plan.state_step, plan.state_step, plan.state_warm_up)


def _locate_dumps_every_step(plan: FromRecordPlan) -> bool:
    """Whether :func:`locate_dump_iterations` arms every step of the locate pass, not only the record's last steps:
    a failure a Parameter check found (or none named), or a step that raised."""
    return plan.failure is None or _read(plan.failure).kind in (Kind.NONFINITE_PARAMS, Kind.EXCEPTION)


#: The width of an open-ended range of dump iterations (MindSpore's ``iteration`` syntax has no open end).
OPEN_END = 1_000_000


def resumed_dump_iterations(step: int, kept_step: int, warm_up: int = 0) -> str:
    """The dump iterations (0-based, MindSpore's ``iteration`` syntax) of 1-based global step ``step`` and after in a
    pass resumed at global step ``kept_step`` after ``warm_up`` steps run for real (the kept state's ``warm_up``):
    that step is the train graph's iteration ``warm_up``, and another graph's runs only number later steps higher
    (:func:`locate_dump_iterations`), so open-ended. ``"all"`` when that starts at iteration 0."""
    start = max(step - kept_step, 0) + warm_up
    return "all" if start <= 0 else f"{start}-{start + OPEN_END}"


def dumps_every_iteration_from(iterations: object) -> bool:
    """Whether a dump config's ``iteration`` (as :func:`resumed_dump_iterations` writes it) dumps every iteration
    from its first on: ``"all"``, or an open-ended range -- the dump of a pass resumed at a kept step then holds
    that step by construction."""
    if iterations == "all":
        return True
    first, _, last = str(iterations).partition("-")
    return first.isdigit() and last.isdigit() and int(last) - int(first) == OPEN_END


def locate_dumped_steps(plan: FromRecordPlan) -> int:
    """How many steps of ``plan``'s locate pass :func:`locate_dump_iterations` dumps (when numbered as expected)."""
    assert plan.window is not None and plan.state_step is not None
    steps = plan.window[1] - plan.state_step + 1
    every = _locate_dumps_every_step(plan) or locate_dump_iterations(plan) == "all"
    return steps if every else LOCATE_DUMP_LEAD + 1


def _no_dump_while_locating(plan: FromRecordPlan, failure: Dict[str, Any], how: str, scope: str
                            ) -> Optional[DumpRefusal]:
    """What rules out dumping while a pass locates, whatever the pass starts from: an examination that is not a
    dump, a killed run, sink mode, a first look at full scope (``None``: none does)."""
    if how != "dump":
        return DumpRefusal("not_a_dump", how=how)
    if plan.killed:
        return DumpRefusal("killed")
    if _read(failure).dataset_sink_mode:
        return DumpRefusal("sink_mode")
    return None   # (a full look is weighed at its size: _weigh_dump)


def locate_dump_refusal(plan: FromRecordPlan, state_meta: Optional[StateLike], how: str, scope: str,
                        ranks: int = 1, free_bytes: Optional[int] = None) -> Optional[DumpRefusal]:
    """Why the locate pass of ``plan`` does NOT also dump the steps :func:`locate_dump_iterations` names (a reason
    code, :class:`~mindguard.hunt.verdicts.DumpRefusal`), or ``None`` when it does (then the exact step, when among
    them, is examined in that same process). ``scope``: the dump scope the examination would start with;
    ``state_meta``: the kept state's ``state.json`` (its ``bytes``, ``process_started`` and ``first_step_end``: module
    constants); ``free_bytes``: free space where the hunt writes, bytes. Only one process of a compiled, non-sink run
    whose record names a failure (not a kill), at the narrow first look."""
    if not plan.locate or plan.window is None or plan.state_step is None or plan.failure is None:
        return DumpRefusal("no_locate_pass")
    if ranks > 1 and how == "dump":
        return DumpRefusal("several_ranks")
    refused = _no_dump_while_locating(plan, plan.failure, how, scope)
    if refused is not None:
        return refused
    meta = as_state_meta(state_meta) or StateMeta()
    if not meta.nbytes:
        return DumpRefusal("size_unknown")
    return _weigh_dump(locate_dumped_steps(plan), meta.nbytes, meta.process_started, meta.first_step_end, free_bytes,
                       scope)


def dump_while_locating(plan: FromRecordPlan, state_meta: Optional[StateLike], how: str, scope: str,
                        ranks: int = 1, free_bytes: Optional[int] = None) -> Optional[str]:
    """:func:`locate_dump_refusal` in words (:func:`mindguard.hunt.messages.dump_refusal`): one line for the user and
    the summary's ``from_record.locate_dump``; ``None`` when the locate pass dumps."""
    refusal = locate_dump_refusal(plan, state_meta, how, scope, ranks, free_bytes)
    return say_.dump_refusal(refusal) if refusal is not None else None


def _weigh_dump(steps: int, state_bytes: int, started: Optional[float], first_end: Optional[float],
                free_bytes: Optional[int], scope: str) -> Optional[DumpRefusal]:
    """Why dumping ``steps`` steps of a training whose state is ``state_bytes`` bytes (a step's dump: about
    :data:`DUMP_SHARE_OF_STATE` of it) costs more than a pass of its own (``started``/``first_end``: when the failing
    run's process started and its first step ended, ``time.time()`` seconds, or ``None``), or ``None`` when it does
    not; ``free_bytes``: free space where the hunt writes, bytes; ``scope``: the dump's (``"full"``: a step's dump
    is its :data:`SCOPE_SHARE_OF_STATE` of the state)."""
    per_step = SCOPE_SHARE_OF_STATE.get(scope, DUMP_SHARE_OF_STATE) * state_bytes
    total = per_step * steps
    if free_bytes is not None and free_bytes < ON_DISK_STEPS * per_step + (1 << 30):
        return DumpRefusal("disk_space", per_step_bytes=per_step, free_bytes=free_bytes)
    writes = total / DUMP_WRITE_BYTES_PER_S
    if isinstance(started, (int, float)) and isinstance(first_end, (int, float)) and first_end > started:
        second = first_end - started + state_bytes / HANDOVER_BYTES_PER_S
        if writes > second:
            return DumpRefusal("writes_cost_more", steps=steps, total_bytes=total, writes_s=writes,
                               second_pass_s=second, startup_s=first_end - started)
    elif total > LOCATE_DUMP_BYTES:
        return DumpRefusal("bytes_cost_more", steps=steps, total_bytes=total, per_step_bytes=per_step)
    return None


# -- hunt --from without a state worth resuming from: one process from step 1 (issue 51) ---------------------------
#: Bytes a second a resumed pass reads a kept state back at (its arrays, their checksum, the assignment): a state whose
#: load costs more than the training it skips is not worth loading, and the hunt runs from step 1.
STATE_LOAD_BYTES_PER_S = 0.5e9
#: Without the failing run's state size (a record of a Guard that kept none): the pass from step 1 dumps at most this
#: many steps as it locates; a wider window is located first, and the exact step examined from the state kept at it.
BLIND_DUMP_STEPS = 8
#: A state loaded in less than this (seconds; half a MB) costs nothing a step's timing resolves: it is loaded even when
#: its warm-up (:mod:`mindguard.training.state.warm_up`) runs every step before it.
NEGLIGIBLE_LOAD_S = 1e-3


def not_worth_loading(state_meta: StateLike) -> Optional[str]:
    """Why resuming from the kept state (its ``state.json``) costs more than running the steps before it again --
    reading its ``bytes`` back at :data:`STATE_LOAD_BYTES_PER_S` against its ``step - 1`` steps at the run's
    ``step_seconds``, less its ``warm_up`` steps (a resumed pass runs them all the same) --, or ``None`` (also when
    the state does not say, and when its load takes under :data:`NEGLIGIBLE_LOAD_S`: both routes then cost the same,
    and the resumed one runs what the record names, its trace held to the failing run's)."""
    meta = as_state_meta(state_meta) or StateMeta()
    step, seconds, size = meta.step, meta.step_seconds, meta.nbytes
    if not step or seconds is None or not size:
        return None
    saved, load = (step - 1 - meta.warm_up) * seconds, size / STATE_LOAD_BYTES_PER_S
    if saved >= load or load < NEGLIGIBLE_LOAD_S:
        return None
    warm = f" (a resumed pass runs the {meta.warm_up} steps before it all the same)" if meta.warm_up else ""
    return (f"the kept training state of global step {step} skips ~{saved:.2f}s of training{warm}, less than loading "
            f"its {size / 1e6:.0f} MB takes (~{load:.2f}s): running from step 1")


def start_dump_from(plan: FromRecordPlan) -> int:
    """The first global step a locate pass from step 1 of ``plan`` dumps: the window's first for a failure a
    Parameter check found (the exact step is anywhere in it), else the record's step less :data:`LOCATE_DUMP_LEAD`
    (a backward-only Inf/NaN shows in the loss a step later), not before the window."""
    assert plan.window is not None
    first, last = plan.window
    if plan.failure is None or _read(plan.failure).kind == Kind.NONFINITE_PARAMS:
        return first
    return max(first, last - LOCATE_DUMP_LEAD)


def start_dump_iterations(plan: FromRecordPlan) -> str:
    """The dump iterations (0-based, MindSpore's ``iteration`` syntax) a locate pass from step 1 of ``plan`` arms:
    from :func:`start_dump_from`'s, open-ended. A process from step 1 runs the train graph at every step, so global
    step ``s`` is its iteration ``s - 1`` or later (another graph's runs number the later steps higher:
    :func:`locate_dump_iterations`); the dump files are told to a step by their time stamps."""
    return resumed_dump_iterations(start_dump_from(plan), 1)


def step_1_dump_refusal(plan: FromRecordPlan, how: str, scope: str, free_bytes: Optional[int] = None
                        ) -> Optional[DumpRefusal]:
    """Why a locate pass from step 1 of ``plan`` does NOT also dump the steps from :func:`start_dump_from` on (a reason
    code; then it locates the exact step and keeps the state there, and an examine pass dumps the step from that
    state), or ``None`` when it does: then one process finds the exact step and holds its dump. Weighed as
    :func:`locate_dump_refusal` weighs a resumed pass, with what the failing run's record says of its cost
    (``costs``: ``state_bytes``, ``process_started``, ``first_step_end``); a record without the state's size dumps
    at most :data:`BLIND_DUMP_STEPS` steps. ``free_bytes``: free space where the hunt writes, bytes."""
    if plan.window is None or plan.failure is None:
        return DumpRefusal("no_failure")
    refused = _no_dump_while_locating(plan, plan.failure, how, scope)
    if refused is not None:
        return refused
    steps = plan.window[1] - start_dump_from(plan) + 1
    said = plan.failure.get("costs")
    costs: Dict[str, Any] = said if isinstance(said, dict) else {}
    state_bytes = costs.get("state_bytes") if isinstance(costs.get("state_bytes"), int) else 0
    if not state_bytes:
        return None if steps <= BLIND_DUMP_STEPS else DumpRefusal("window_too_wide", steps=steps)
    started, first_end = costs.get("process_started"), costs.get("first_step_end")
    return _weigh_dump(steps, state_bytes, started if isinstance(started, (int, float)) else None,
                       first_end if isinstance(first_end, (int, float)) else None, free_bytes, scope)


def dump_from_step_1(plan: FromRecordPlan, how: str, scope: str, free_bytes: Optional[int] = None) -> Optional[str]:
    """:func:`step_1_dump_refusal` in words (:func:`mindguard.hunt.messages.dump_refusal`); ``None`` when the pass
    dumps."""
    refusal = step_1_dump_refusal(plan, how, scope, free_bytes)
    return say_.dump_refusal(refusal) if refusal is not None else None


def common_kept_step(kept: Dict[int, Optional[int]], why: Dict[int, str], group_size: int
                     ) -> Tuple[Optional[int], Optional[str]]:
    """Several ranks: the global step every rank's kept state begins (``(step, None)``), or ``(None, why not)``.
    ``kept``: each rank's usable kept state's step (``None``: the rank has none, ``why[rank]`` says why), for the
    ranks whose records were read (0-based ranks; every rank of ``group_size`` must be there). A state of rank 0 at
    step 7 and one of rank 1 at step 9 resume nothing together: then the plain hunt, saying so."""
    missing = [r for r in range(group_size) if r not in kept]
    if missing:
        return None, (f"the records of rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} were not "
                      f"read (every rank of the {group_size} must resume from its own kept state)")
    lacking = [r for r in range(group_size) if kept[r] is None]
    if lacking:
        r = lacking[0]
        return None, (f"rank {r} has no kept training state to resume from ({why.get(r) or 'none named'}); every "
                      f"rank of the {group_size} must resume from its own")
    steps = sorted({int(s) for s in kept.values() if s is not None})
    if len(steps) > 1:
        return None, ("the ranks kept their training states at different global steps (" + ", ".join(
            f"rank {r}: {kept[r]}" for r in range(group_size)) + "): a job resumes only from one step on every rank")
    return steps[0], None


def first_possible_step(record: Dict[str, Any]) -> int:
    """The first global step the failing one of ``record`` can be (its window's first for a non-finite failure,
    else its step; 0 when it names none): a state kept at or before it can resume the hunt."""
    step = record.get("global_step")
    window = record.get("failure_window")
    if record.get("kind") in NONFINITE_KINDS and isinstance(window, list) and len(window) == 2:
        return int(window[0])
    return int(step) if isinstance(step, int) else 0


def located_failure(located: Optional[Dict[str, Any]], plan: FromRecordPlan) -> Tuple[Optional[Dict[str, Any]], str]:
    """The locate pass's failure when it is the failing run's (in the window, of a matching kind), else ``None``
    and why not. A non-finite failure may be located as another non-finite kind (the Parameters at a step
    before the loss showed it); an exception must be the same kind at the same step."""
    assert plan.failure is not None and plan.window is not None
    if located is None:
        return None, "did not fail"
    step, kind = located.get("global_step"), located.get("kind")
    where = f"failed at global step {step} ({kind})"
    first, last = plan.window
    if step is None or not first <= int(step) <= last:
        return None, where
    wanted = plan.failure.get("kind")
    if plan.killed:   # a killed run's record names no failure: whatever failed before the kill is it
        return located, where
    if kind != wanted and not (wanted in NONFINITE_KINDS and kind in NONFINITE_KINDS):
        return None, where
    return located, where


# -- the plain hunt's decisions -----------------------------------------------------------------------------------
def examination(failure: Dict[str, Any]) -> str:
    """How pass 2 examines the failing step: ``"dataset"``, ``"replay"`` or ``"dump"``. The training process records
    the phase ``between_steps`` only for an exception of the dataset pipeline
    (``mindguard/training/record/classify.py``)."""
    if _read(failure).phase == Phase.BETWEEN_STEPS:
        return "dataset"
    said = _read(failure).examine
    if said in ("dump", "replay"):
        return str(said)
    return "replay" if _read(failure).mode == "pynative" else "dump"


#: A dump scope (``mindguard.hunt.DUMP_SCOPES``) -> the next wider one, when the narrower dump explained nothing.
WIDER_SCOPES = {"outputs": "all_outputs", "all_outputs": "full"}


def wider_scope(scope: str) -> Optional[str]:
    """The dump scope to try after ``scope`` explained nothing; ``None`` after ``"full"``."""
    return WIDER_SCOPES.get(scope)


def first_look(failure: Dict[str, Any], steps: int, state_bytes: Optional[int], started: Optional[float],
               first_end: Optional[float], requested: Optional[str] = None, resume: str = "auto") -> str:
    """The dump scope of ``hunt --from``'s first look at ``steps`` dumped steps: :func:`first_scope`'s, widened when
    nothing was requested to the widest scope (``full``, then ``all_outputs``) whose writes -- ``steps`` x its
    ``SCOPE_SHARE_OF_STATE`` x ``state_bytes`` at ``DUMP_WRITE_BYTES_PER_S`` -- cost at most ``WIDE_LOOK_SHARE``
    (0.1) of the failing run's start (``started``/``first_end``: ``time.time()`` seconds). A
    wider first look then never needs the second pass a narrow one that explains nothing would."""
    scope = first_scope(failure, requested, resume)
    if requested or scope != "outputs" or not state_bytes or not isinstance(started, (int, float)) \
            or not isinstance(first_end, (int, float)) or first_end <= started:
        return scope
    budget = WIDE_LOOK_SHARE * (first_end - started) * DUMP_WRITE_BYTES_PER_S
    for wider in ("full", "all_outputs"):
        if steps * SCOPE_SHARE_OF_STATE[wider] * state_bytes <= budget:
            return wider
    return scope


def first_scope(failure: Dict[str, Any], requested: Optional[str] = None, resume: str = "auto") -> str:
    """A step that raised (or a multi-rank failure) is read where it stopped, from every kernel's files; a
    non-finite step starts where ``--dump-scope`` says, else narrow (full with ``--resume never``: nothing is kept
    to widen from)."""
    if _read(failure).kind == Kind.EXCEPTION or (_read(failure).group_size or 1) > 1:
        return "full"
    return requested or ("full" if resume == "never" else "outputs")


def resumed_iteration(failure: Dict[str, Any], state_meta: StateLike) -> Optional[int]:
    """The dump iteration of the failing step in a run resumed from ``state``, when it can be told: one kernel graph
    ran the kept step and the failing step, in the same training call, and pass 1 observed it run once per step in
    between (so a process whose first graph runs are the kept state's ``warm_up`` steps, then the kept step, numbers
    the failing step ``step - kept + warm_up``). ``None`` otherwise (the hunt then locates the step first)."""
    state = as_state_meta(state_meta) or StateMeta()
    kept_graphs, failed_graphs = state.dump_graphs, _read(failure).dump_graphs or {}
    step, kept = int(_read(failure).global_step or 0), state.step
    if not _read(failure).iteration_observed or len(kept_graphs) != 1 or set(kept_graphs) != set(failed_graphs):
        return None
    if (_read(failure).call or {}).get("index", 1) != state.call:
        return None
    (graph, at_kept), = kept_graphs.items()
    if int(failed_graphs[graph]) - int(at_kept) != step - kept:
        return None
    return step - kept + state.warm_up


def iterations_to_dump(failure: Dict[str, Any]) -> List[int]:
    """The dump iterations that hold the failing step: observed in pass 1, else the estimate and its neighbours
    (the step's own files are then told apart by their time stamps)."""
    iteration = _read(failure).dump_iteration
    candidates, graphs = _read(failure).dump_candidates, _read(failure).dump_graphs
    if candidates:   # a step that raised: what each graph's own count says it may be
        return sorted(set(int(v) for v in candidates))
    if _read(failure).iteration_observed and graphs:
        return sorted(set(int(v) for v in graphs.values()))
    if _read(failure).iteration_observed and iteration is not None:
        return [int(iteration)]
    if iteration is None:
        iteration = int(_read(failure).global_step or 0) - 1
    return [i for i in (iteration - 1, iteration, iteration + 1) if i >= 0]


@dataclasses.dataclass(frozen=True)
class ResumeChoice:
    """Whether pass 2 starts from pass 1's kept state (``resume``), with the estimate it was chosen by
    (``from_step_1_s``: pass 1's time to the failing step; ``resumed_s``: launches x (start-up + compile + first
    step) + the steps from the kept one and its warm-up x time per step; seconds) and, when it does not resume,
    ``why``."""

    resume: bool
    kept_step: int
    from_step_1_s: Optional[float]
    resumed_s: float
    why: Optional[str] = None


def choose_resume(failure: Dict[str, Any], state_meta: Optional[StateLike], pass1_started: float, how: str,
                  mode: str = "auto") -> Optional[ResumeChoice]:
    """Whether pass 2 resumes from the state pass 1 kept (``state_meta``: its ``state.json``; ``pass1_started``:
    ``time.time()`` pass 1 started at; ``how``: :func:`examination`; ``mode``: ``--resume`` auto|always|never).
    ``None`` when no usable state was kept (none, or not between step 1 and the failing step)."""
    state = as_state_meta(state_meta)
    if mode == "never" or state is None:
        return None
    step, kept = int(_read(failure).global_step or 0), state.step
    if not 1 < kept <= step:
        return None
    window = _read(failure).step_window_us or [0, 0]
    from_start = window[1] / 1e6 - pass1_started if window[1] else None
    launch = (state.first_step_end or 0) - pass1_started
    per_step = state.step_seconds or 0.0
    launches = 2 if how == "dump" and kept < step and resumed_iteration(failure, state) is None else 1
    resumed = launches * max(launch, 0.0) + (step - kept + 1 + state.warm_up) * per_step
    unrestorable = unrestorable_note(state)
    if unrestorable is not None and mode != "always":
        return ResumeChoice(False, kept, from_start, resumed, f"the kept state cannot be resumed: {unrestorable}")
    if mode == "always" or (from_start is not None and resumed < from_start):
        return ResumeChoice(True, kept, from_start, resumed)
    why = ("pass 1's record has no time for the failing step to tell which route is quicker" if from_start is None
           else f"re-running from step 1 is quicker (~{from_start:.1f}s vs ~{resumed:.1f}s resumed)")
    return ResumeChoice(False, kept, from_start, resumed, why)
