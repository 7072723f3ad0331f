"""What the run does with the training *state* (:class:`RunState`): keep it (:class:`~mindguard.training.state.keeper.
StateKeeper`: a hunt pass's, or an always-on Guard's on disk), resume a hunt pass from it (:class:`~mindguard.
training.resumer.Resumer`, with the dataset fast-forwarded when it can be:
:mod:`mindguard.training.state.dataset_skip`), trace what each step computed so a resumed pass can tell it follows the
run that kept the state, and run `mindguard verify`'s pass (:mod:`mindguard.training.child.verify_run`).

The run (:class:`mindguard.training.run.Run`) counts the steps and calls these hooks; steps are 1-based,
process-wide global steps. Imports nothing of MindSpore at import time.
"""
from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

from ..child import pass_end as _pass_end, verify_run as _verify_run
from ..record import provenance as _provenance
from ..._util.dist import rank_info
from ..._util.io import atomic_write_json, os_reason
from ...errors import HuntProtocolError
from ...protocol import folder as layout
from ...protocol.pass_status import Diverged, Overridden
from ...protocol.request import HuntRequest
from .agreed_keeps import AgreedKeeps
from ..checks.checked import ParamChecks
from ..child.hunt_stop import HuntStop
from .keeper import StateKeeper, state_nbytes, note_initial, process_started
from .resumer import Resumer, hold_checkpoints
from .state_files import fingerprint, read_state_meta, small_state
from .state_folder import claim_run_states, drop_run_states, release_run_states
from ..step.events import StepListener
from ..step.steps import StepInfo, TrainingCall
from .user_checkpoints import CheckpointLog
from .warm_up import warm_up_steps
from ..record.rate_notes import DivergenceNotes

FAST_FORWARD_MIN_STEPS = 32   # a dataset reset costs about what iterating this many batches of a small pipeline does


def _exact_keep_steps() -> range:
    """Outside the hunt, ``MINDGUARD_KEEP_STEPS=first-last`` (the hunt's own variable) makes the always-on Guard keep
    its state at exactly those 1-based global steps instead of by time (those whose Parameters were just checked
    finite): a test that must know the kept step (tests/test_divergence.py). Empty (the time rule) when unset or
    malformed."""
    import os

    from ...protocol.request import ENV_KEEP_STEPS

    first, _, last = (os.environ.get(ENV_KEEP_STEPS) or "").partition("-")
    if first.isascii() and first.isdigit() and last.isascii() and last.isdigit() and 1 <= int(first) <= int(last):
        return range(int(first), int(last) + 1)
    return range(0)


class RunState(StepListener):
    """The keeper, resumer and verify pass of a run, as the hunt's ``request`` asks for them (``None``: none yet; an
    always-on Guard asks for an on-disk keeper: :meth:`keep_on_disk`), following the run's Parameter ``checks``. A
    listener of the run's events (``call_begun`` ... ``timing_paused``: the methods below them)."""

    def __init__(self, request: Optional[HuntRequest], checks: Optional[ParamChecks] = None) -> None:
        self.request = request
        self.checks = checks if checks is not None else ParamChecks()
        self.keeper: Optional[StateKeeper] = None
        self.resumer: Optional[Resumer] = None
        self.verify: Optional[_verify_run.VerifyPass] = None   # `mindguard verify`'s pass
        self.lock: Optional[int] = None                       # the lock held on the run's state folder
        self.agreement_lost = False   # several ranks: mindguard's own error ended this rank's part in the agreement
        self.first_step_end: Optional[float] = None   # time.time() when the process's first step ended
        # the files the training's ModelCheckpoint writes (outside the hunt): resume points, named at a failure
        self.user_checkpoints = CheckpointLog()
        self.notes = DivergenceNotes()   # each step's loss and the learning rate: where a divergence began (issue 52)
        if request is None:
            return
        rank, size = rank_info()
        if request.keep_dir is not None and (size == 1 or request.keep_steps):
            # several ranks keep only at exact steps (the same on every rank), each in its own rank's folder
            self.keeper = StateKeeper(layout.rank_state(request.keep_dir, rank, size), every_steps=request.keep_every,
                                      steps=range(request.keep_steps[0], request.keep_steps[1] + 1)
                                      if request.keep_steps else ())
        if request.resume_dir is not None:   # several ranks: each its own rank's state (protocol.folder.rank_state)
            self.resumer = Resumer(layout.rank_state(request.resume_dir, rank, size),
                                   fast_forward=request.fast_forward, warm_up=request.verify_steps is None)
        if request.verify_steps is not None:
            self.verify = _verify_run.VerifyPass(request.record, *request.verify_steps)

    @property
    def on_disk(self) -> bool:
        """An always-on Guard's keeper, writing beside its record."""
        return self.keeper is not None and self.keeper.on_disk

    def keep_on_disk(self, asked: Path, run_id: Optional[str], on_unrestorable: Callable[[List[str]], None]) -> None:
        """Outside the hunt: keep the training state on disk in the run's own folder beside the record ``asked``
        (``<record>.state/<run id>/``; several ranks: beside each rank's own record, ``<stem>.rank<r>.state/``),
        claimed and locked for the process's life; several ranks keep at the steps they all agree on
        (:mod:`mindguard.training.state.agreed_keeps`). Idempotent."""
        if self.keeper is not None:
            return
        rank, size = rank_info()
        folder = layout.run_states(asked, run_id or _provenance.new_run_id())   # (``asked``: the rank's own record)
        self.lock = claim_run_states(folder, asked)   # and an earlier dead run's leftovers cleaned
        self.keeper = StateKeeper(folder, on_disk=True, min_seconds=1.0, steps=_exact_keep_steps())
        self.keeper.run_id = run_id
        self.keeper.on_unrestorable = on_unrestorable
        if size > 1:
            self.keeper.agreed = AgreedKeeps(rank)

    # -- several ranks: the keep agreement rides on the per-step verdict exchange ----------------------------
    def keep_flags(self, concluded: int, checks: ParamChecks) -> int:
        """This rank's flags for the exchange at the end of 1-based global step ``concluded`` (0 without an agreed
        keeper)."""
        keeper = self.keeper
        if keeper is None or keeper.agreed is None or self.agreement_lost:
            return 0   # (a rank that never says READY: no rank keeps)
        try:
            wants_keep = keeper.agreed.rank == 0 and keeper.due(concluded + 2)
            return keeper.agreed.flags(concluded, wants_check=checks.wish, wants_keep=wants_keep,
                                       to_disk=wants_keep and keeper.disk_due(),
                                       ready=checks.finite_after == concluded and keeper.ready())
        except Exception as bug:  # noqa: BLE001 - never skip the exchange: the other ranks wait in it
            self._lose_agreement(bug)
            return 0

    def agree_keeps(self, flags: List[int], concluded: int, next_step: int) -> None:
        """Every rank's flags from that exchange (:meth:`AgreedKeeps.agree`)."""
        if self.keeper is None or self.keeper.agreed is None or self.agreement_lost:
            return
        try:
            self.keeper.agreed.agree(flags, concluded, next_step)
        except Exception as bug:  # noqa: BLE001 - the step's verdict must still be acted on, as on every rank
            self._lose_agreement(bug)

    def _lose_agreement(self, bug: BaseException) -> None:
        """mindguard's own error in the keep agreement: this rank says READY no more, so no rank keeps again."""
        self.agreement_lost = True
        print(f"mindguard: the ranks keep no more training states ({type(bug).__name__}: {bug}; a mindguard bug): "
              f"`mindguard hunt --from` resumes from a state kept before, or runs from step 1", file=sys.stderr,
              flush=True)

    def write_run_info(self, info: Dict[str, Any]) -> None:
        """``run.json`` in the on-disk keeper's folder (the run's id, command, sources); never ends the training."""
        keeper = self.keeper
        if keeper is None or not keeper.on_disk:
            return
        try:
            atomic_write_json(layout.run_info(keeper.directory), info)
        except (OSError, ValueError):
            pass

    # -- the run's events ---------------------------------------------------------------------------------
    def call_begun(self, call: TrainingCall, network: Any, next_step: int) -> None:
        self.at_call(network, call.kind, next_step)

    def step_starting(self, next_step: int, failed: bool) -> None:
        if self.verify is not None and not failed:
            self.verify.stop_before(next_step)   # the steps to verify are done: HuntStop

    def step_begun(self, info: StepInfo, failed: bool) -> None:
        self.at_step(info, failed=failed, checks=self.checks)

    def step_outputs(self, info: StepInfo, outputs: Any) -> None:
        self.note_outputs(info, outputs)

    def iteration_observed(self, info: StepInfo) -> None:
        self.note_dump_graphs(info)

    def step_traced(self, info: StepInfo, loss: Optional[float], param_sum: Optional[float]) -> None:
        self.trace(info, loss, param_sum, budgeted=self.checks.budget is not None)

    def timing_paused(self) -> None:
        if self.keeper is not None:
            self.keeper.pause()

    # -- at a training call and a step -----------------------------------------------------------------
    def at_call(self, network: Any, kind: str, next_step: int) -> None:
        """A training call begins, its first step global step ``next_step``: a resumed pass skips ``network``'s
        calls until the kept state's step."""
        resumer = self.resumer
        if resumer is not None and not resumer.loaded and kind == "train" and next_step < resumer.step:
            resumer.skip_calls(network)

    def at_step(self, info: StepInfo, *, failed: bool, checks: ParamChecks) -> None:
        """Step ``info`` begins (counted, before it runs): resume at the kept step, note the script's small values
        and the training's own checkpoints, keep a state when due."""
        call, keeper = info.call, self.keeper
        loaded = None   # the state's arrays as the resumer loaded them at this step (held by the keeper, or freed)
        if self.resumer is not None and not self.resumer.loaded:
            self._resume(info)
            loaded = self.resumer.take_values()
        if keeper is not None and keeper.on_disk and call.first_step == info.global_step:
            note_initial(keeper, call.state_params())   # once per call: edits a resume overrides
        if (keeper is not None or self.resumer is not None) and not info.skipped and checks.budget is None:
            info.scalars = small_state(call.small_params())   # (an always-on Guard traces the loss only)
        agreed = keeper.agreed.keep_due(info.global_step) if keeper is not None and keeper.agreed is not None \
            and not self.agreement_lost else None
        saved = self.user_checkpoints.note(call) if self.request is None and not info.skipped else []
        if keeper is None or failed or info.skipped:
            return
        warm = warm_up_steps(info.global_step, call.first_step)   # the steps a pass resumed here runs first
        if keeper.on_disk:   # resume points: the files written at the end of the step before
            keeper.note_checkpoints(info.global_step, [path for path, held in saved if held == info.global_step - 1],
                                    call.state_cells, call.state_params(), checks.finite_after, warm)
        if keeper.agreed is not None:   # several ranks: at the steps all agreed on (their Parameters checked finite)
            if agreed is not None and not info.iteration_range and checks.finite_after == info.global_step - 1:
                keeper.keep(info.global_step, call.state_params(), call.index, call.state_cells, to_disk=agreed,
                            warm_up=warm)
                if checks.budget is not None:
                    checks.budget.discard_period()
            return
        if not info.iteration_range and keeper.due(info.global_step) \
                and (not keeper.on_disk or checks.finite_after == info.global_step - 1):
            # (sink mode: one hook for several steps, not resumable; on disk: only a state just checked finite)
            keeper.keep(info.global_step, call.state_params(), call.index, call.state_cells, loaded=loaded,
                        warm_up=warm)
            if checks.budget is not None:
                checks.budget.discard_period()

    def _resume(self, info: StepInfo) -> None:
        """A resumed pass: ``info``'s training call is skipped before the kept state's step; at that step the
        state is assigned (before the step runs)."""
        resumer = self.resumer
        if resumer is None:
            return
        if resumer.skips(info.global_step, info.call.state_params):
            info.skipped = True
            hold_checkpoints(info.call.key, info.call.last_cur_step)
            return
        if info.global_step > resumer.step or info.iteration_range:
            raise HuntProtocolError(f"the kept training state is for global step {resumer.step}, but this run "
                                    f"reached step {info.global_step} without stopping there (dataset sink mode "
                                    f"runs several steps per callback); run the hunt without resuming")
        skipped_for = time.monotonic() - (resumer.started if resumer.started is not None else time.monotonic())
        if self.verify is not None:   # the script as edited: by name, the edit's learning rate wins
            self.verify.load(resumer, info.call.state_params())
        else:
            self._load_kept_state(resumer, info)
        how = (f"the dataset was reset past {resumer.fast_forwarded} of them, the callbacks ran for the others"
               if resumer.fast_forwarded else "the data pipeline and the callbacks ran")
        skipped = (f"steps 1-{resumer.step - 1} skipped ({skipped_for:.2f}s: {how}, the training did not"
                   f"{resumer.warm_up.said()}); " if resumer.step > 1 else "")
        print(f"mindguard hunt: {skipped}training state of global step {resumer.step} loaded", file=sys.stderr,
              flush=True)

    def _load_kept_state(self, resumer: Resumer, info: StepInfo) -> None:
        """Assign the kept state in a resumed hunt pass, after noting the script edits it overrides; a state that
        does not fit this run is said in ``diverged`` and stops the pass (the hunt then runs from step 1)."""
        edits = resumer.edits(info.call.state_params())
        if edits:
            _pass_end.note(self.request, overridden=Overridden(step=resumer.step, edits=list(edits)))
        try:
            resumer.load(info.call.state_params())
        except HuntProtocolError as exc:   # the kept state does not fit this run: said, and the hunt runs from step 1
            _pass_end.note(self.request, ended="diverged",
                           diverged=Diverged(step=info.global_step, why=str(exc), unfit=True))
            message = f"mindguard hunt: {exc}; stopping"
            print(message, file=sys.stderr, flush=True)
            raise HuntStop(message) from None

    def fast_forward(self, call: TrainingCall, cb_params: Any, info: StepInfo,
                     count_steps: Callable[[TrainingCall, int, int], int]) -> None:
        """A resumed pass at a skipped step ``info`` of a ``Model.train`` call: reset the call's dataset to the kept
        step when it can (:func:`fast_forward`)."""
        fast_forward(self.resumer, self.verify, call, cb_params, info, count_steps)

    # -- after a step ------------------------------------------------------------------------------------
    def note_outputs(self, info: StepInfo, outputs: Any) -> None:
        """After a step ran: its outputs' structure and the pace, for a later resumed pass."""
        if self.first_step_end is None and not info.skipped:
            self.first_step_end = time.time()   # (the record's costs, with or without a keeper)
        if self.keeper is not None and not info.skipped:
            self.keeper.note_step_end(info.global_step, outputs)

    def note_dump_graphs(self, info: StepInfo) -> None:
        """Step ``info``'s observed dump iterations go with the state kept at its beginning."""
        kept = self.keeper.kept.get(info.global_step) if self.keeper is not None else None
        if kept is not None:
            kept.dump_graphs = dict(info.dump_graphs)

    def trace(self, info: StepInfo, loss: Optional[float], param_sum: Optional[float], *, budgeted: bool) -> None:
        """What step ``info`` computed: kept by a record pass for the steps since its kept state; compared by a
        resumed pass, which stops (:class:`HuntStop`, after saying ``diverged`` in its ``pass_status.json``) at the
        first step that differs. ``budgeted``: an always-on Guard, whose Parameter sum is not traced."""
        if self.verify is not None and not info.skipped:
            self.verify.note(info.global_step, loss)
        if not info.skipped:
            self.notes.note(info.global_step, loss, info.call.state_params(), info.call.key)
        if info.skipped or (self.keeper is None and (self.resumer is None or not self.resumer.loaded)):
            return
        if budgeted:   # an always-on Guard checks the Parameters only now and then, and not always by the host sum
            param_sum = None   # a hunt's pass computes: the trace holds the loss and scalars
        trace = [fingerprint(loss), fingerprint(param_sum), *info.scalars]
        if self.keeper is not None:
            self.keeper.note_trace(info.global_step, trace)
        if self.resumer is not None and self.resumer.loaded and self.verify is None \
                and not (self.request is not None and self.request.approximate):   # verify: the edit differs; an
            # approximate replay (random kernels the kept state could not hold) draws other masks: not compared
            why = self.resumer.diverges(info.global_step, trace)
            if why is not None:
                _pass_end.note(self.request, ended="diverged", diverged=Diverged(
                    step=info.global_step, why=why, fast_forwarded=self.resumer.fast_forwarded))
                message = (f"mindguard hunt: the run resumed from the kept training state differs from the run that "
                           f"kept it ({why}): state outside the Parameters (Python-side schedules, random state) "
                           f"changed what it computes; stopping")
                print(message, file=sys.stderr, flush=True)
                raise HuntStop(message)

    # -- at a failure and at exit --------------------------------------------------------------------------
    def costs(self, info: Optional[StepInfo]) -> Optional[Dict[str, Any]]:
        """The failure record's ``costs`` (:meth:`~mindguard.training.state.keeper.StateKeeper.costs`) of an always-on
        Guard's run (``None`` under the hunt, or without a keeper); ``info``: the failing step."""
        if self.request is not None:
            return None
        params = info.call.state_params() if info is not None else ()
        if self.keeper is not None:
            costs = self.keeper.costs(params)
        else:   # Guard(keep_state=False): no keeper, the same facts
            costs = {"process_started": process_started(), "first_step_end": self.first_step_end,
                     "step_seconds": None, "state_bytes": state_nbytes(params) if params else None}
        return costs if any(v is not None for v in costs.values()) else None

    def write_at_failure(self, upto_step: int, dumped_step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """Write the state kept at or before 1-based global step ``upto_step`` (``dumped_step``: a step whose dump
        is on disk, :meth:`~mindguard.training.state.keeper.StateKeeper.write`). ``None`` when nothing was written
        (then the hunt re-runs from step 1; said here when the write failed); else the record's ``kept_state`` field,
        empty unless the state went to disk beside an always-on Guard's record and its ``state.json`` reads back."""
        keeper = self.keeper
        if keeper is None:
            return None
        try:
            written = keeper.write(upto_step, dumped_step)
        except (OSError, ValueError) as exc:   # the hunt then re-runs from step 1
            print(f"mindguard: could not write the kept training state to {keeper.directory} "
                  f"({os_reason(exc)}); a later pass starts from step 1 instead", file=sys.stderr, flush=True)
            return None
        if written is None or not keeper.on_disk:
            return {} if written is not None else None
        try:
            meta = read_state_meta(written)
        except (OSError, ValueError):
            meta = None
        if meta is None:
            return {}
        return {"path": str(written), "step": int(meta["step"]), "run_id": meta.get("run_id"),
                "sha256": meta.get("sha256")}

    def drop(self) -> None:
        """Remove the on-disk keeper's states (the run leaves nothing to hunt)."""
        if self.keeper is not None and self.keeper.on_disk:
            drop_run_states(self.keeper.directory)

    def release(self) -> None:
        """Let go of the run's state-folder lock (a new run in this process)."""
        self.user_checkpoints.retired = True
        release_run_states(self.lock)


def fast_forward(resumer: Optional[Resumer], verify: Optional["_verify_run.VerifyPass"], call: TrainingCall,
                 cb_params: Any, info: StepInfo, count_steps: Callable[[TrainingCall, int, int], int]) -> None:
    """A resumed pass at a skipped step ``info`` of a ``Model.train`` call: reset the call's dataset so that
    its next batch is the kept step's warm-up's first (:mod:`mindguard.training.state.warm_up`; the kept step's when
    it has none: :mod:`mindguard.training.state.dataset_skip`), and count the steps it passes
    over as run (``count_steps(call, cur_step_num, steps)``) -- ``cb_params.cur_step_num`` too, so the call's
    callbacks see the step numbers they would have. Only once per call, in dataset (not sink) mode, when the
    kept step is in this call and at least :data:`FAST_FORWARD_MIN_STEPS` ahead; otherwise the steps are
    iterated as before."""
    from . import dataset_skip as _dataset_skip

    if resumer is None or not resumer.fast_forward or call.fast_forwarded is not None or call.kind != "train" \
            or call.sink:
        return
    call.fast_forwarded = 0
    # the steps between this one and the kept one's warm-up (mindguard.training.state.warm_up), which must run
    jump = resumer.step - resumer.warm_up.count - 1 - info.global_step
    per_epoch, epochs = cb_params.get("batch_num"), cb_params.get("epoch_num")
    if jump < FAST_FORWARD_MIN_STEPS or not per_epoch or not epochs:
        return
    completed, total = call.last_cur_step + jump, int(per_epoch) * int(epochs)
    if completed >= total:
        return
    why = verify.reset_problem(cb_params.get("train_dataset")) if verify is not None else None
    why = why or _dataset_skip.fast_forward(cb_params.get("train_dataset"), completed, int(per_epoch))
    if why is not None:
        print(f"mindguard hunt: the dataset is iterated to the kept step ({why})", file=sys.stderr, flush=True)
        return
    cb_params.cur_step_num = completed
    count_steps(call, completed, jump)
    call.data_steps = total
    call.fast_forwarded = resumer.fast_forwarded = jump
