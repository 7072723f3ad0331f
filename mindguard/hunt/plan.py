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
* ``"from_step_1"`` -- the kept state cannot be used (``why`` says why): the two passes of a plain hunt.

Steps are 1-based global steps (:mod:`mindguard.run`). Nothing here imports MindSpore or starts a process.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: The kinds of failure whose step is known only within a window (Parameters are checked now and then).
NONFINITE_KINDS = ("nonfinite_loss", "nonfinite_grads", "nonfinite_params", "loss_scale_collapse")


@dataclasses.dataclass(frozen=True)
class FromRecordPlan:
    """The hunt's route from a failing run's record (see the module docstring)."""

    route: str                                   # "done" | "resume" | "from_step_1"
    why: str                                     # one sentence for the user
    outcome: Optional[str] = None                # with "done": "healthy" | "command_failed" | "failed_before_training"
    returncode: Optional[int] = None             # with "command_failed": the exit code to report
    failure: Optional[Dict[str, Any]] = None     # the failure to examine (a record that died mid-step made one)
    window: Optional[Tuple[int, int]] = None     # the steps the failing one lies in (first == last: exact)
    state_step: Optional[int] = None             # the global step the kept state begins
    locate: bool = False                         # a locate pass runs before the examination
    warnings: Tuple[str, ...] = ()


def plan_from_record(record: Dict[str, Any], state_meta: Optional[Dict[str, Any]], command: Sequence[str],
                     examination: str) -> FromRecordPlan:
    """Decide the route. ``record``: the failing run's record (a dict as written); ``state_meta``: the
    ``state.json`` of its ``kept_state`` (``None`` when missing or unreadable); ``command``: what the hunt will run;
    ``examination``: how the failing step is examined (``"dump"`` | ``"replay"`` | ``"dataset"``)."""
    status, step = record.get("status"), record.get("global_step")
    warnings: List[str] = []
    if status == "finished":
        return FromRecordPlan("done", f"the run finished without a failure at global step {step}: nothing to hunt",
                              outcome="healthy")
    failure = dict(record)
    if status == "running":
        if not step:
            return FromRecordPlan("done", "the run ended before its first step without its record saying why: "
                                          "nothing to examine; run the command to see its error",
                                  outcome="failed_before_training")
        failure.update(status="failed", kind="exception",
                       message="the process ended during this step without its record saying why (killed -- by the "
                               "OOM killer, SIGKILL, os._exit -- or a crash of the interpreter)")
    if failure.get("kind") == "interrupted":
        return FromRecordPlan("done", f"the run was interrupted (Ctrl-C) at global step {step}: nothing to hunt",
                              outcome="command_failed", returncode=130)
    if failure.get("phase") == "script":
        return FromRecordPlan("done", f"at global step {step} the script raised {failure.get('message')}: an error "
                                      "of the script's own code, not of the training's numbers; nothing to dump",
                              outcome="command_failed", returncode=1)
    if not step:
        return FromRecordPlan("done", f"the run failed before its first training step "
                                      f"({failure.get('message') or 'no message'}); fix that first",
                              outcome="failed_before_training")
    argv = record.get("argv")
    if argv and list(argv) != list(command):
        warnings.append(f"the record was written by `{' '.join(argv)}`, the hunt runs `{' '.join(command)}`: the "
                        f"kept state is used only if the run computes the same from it")
    window = failure.get("failure_window") if failure.get("kind") in NONFINITE_KINDS else None
    first, last = (int(window[0]), int(window[1])) if window else (int(step), int(step))
    kept = record.get("kept_state")
    if not kept:
        why = ("the run kept no training state (Guard keeps one about every second of training once its Parameters "
               "were checked finite, on one rank, with keep_state=True)")
        return FromRecordPlan("from_step_1", why, failure=failure, window=(first, last), warnings=tuple(warnings))
    if state_meta is None:
        return FromRecordPlan("from_step_1", f"the kept training state {kept.get('path')} is gone or unreadable",
                              failure=failure, window=(first, last), warnings=tuple(warnings))
    state_step = int(state_meta.get("step") or 0)
    if not 1 < state_step <= first:
        return FromRecordPlan("from_step_1", f"the kept training state begins global step {state_step}, not before "
                                             f"the failure's first possible step {first}",
                              failure=failure, window=(first, last), warnings=tuple(warnings))
    locate = examination != "dataset" and not (first == last == state_step)
    how = (f"locate the exact step among global steps {first}-{last}, then examine it" if locate and first < last
           else f"run to global step {last} and keep the state there, then examine it" if locate
           else f"examine global step {last}")
    return FromRecordPlan("resume", f"from the training state kept at global step {state_step}: {how}",
                          failure=failure, window=(first, last), state_step=state_step, locate=locate,
                          warnings=tuple(warnings))


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
    if kind != wanted and not (wanted in NONFINITE_KINDS and kind in NONFINITE_KINDS):
        return None, where
    return located, where
