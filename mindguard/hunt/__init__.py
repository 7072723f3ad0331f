"""``mindguard hunt -- <command>``: from "it failed somewhere" to the culprit, in one command.

record -> examine -> explain:

1. **record** runs the command with :class:`mindguard.Guard` recording the first failing step of the
   process (1-based, over every training call) while MindSpore's dump, armed to write no tensors, lets the
   run *observe* which kernel graph and dump iteration each step ran as (:mod:`mindguard.training.run`).
2. **examine** runs it again with the same environment, asking for exactly that step: dumped (the hunt arms
   MindSpore's dump of that iteration before the process starts) when it ran compiled, captured and replayed
   when it ran eagerly (PyNative), or -- an exception the dataset pipeline raised between steps -- with the
   pipeline synchronous, so the exception arrives at the step whose batch raised. It checks the failure
   repeated (same step, same kind): otherwise the run is not reproducible and nothing is analysed.
3. **explain** reads the step's files (only those written during the step) and prints the culprit.

The wrapper process never imports MindSpore. Every artefact stays in one run folder; the exit code is the
:class:`Outcome`'s.
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import math
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .._util import dist as _dist
from .._util.io import atomic_write_json, atomic_write_text, io_fix, os_reason, read_json, tree_size
from ..training.resume import choose_kept_state, describe_state, read_state_meta
from ..training import provenance as _provenance
from ..dump.config import ENV_VAR as DUMP_ENV_VAR
from ..dump.config import DumpConfig, observing_config
from ..analysis.files import check_step_dump
from .known import known, render as render_known
from ..analysis.hints import nonfinite_input_hint
from ..analysis.trace import is_mindguard_frame
from ..report.pagedata import write_run_page
from ..errors import DumpConfigError, HuntError, MindguardError, RecordError
from ..protocol.record import FailureRecord, progress_problem, read_record_data
from ..protocol import kernels
from ..protocol import folder as layout
from ..protocol.folder import PassName, RunFolder
from ..protocol.request import HuntRequest
from ..protocol.summary import (ROUTE_DID_NOT_REPEAT, ROUTE_RESUMED, UNSET, FromRecordSummary, HuntSummary,
                                Outcome, PassSummary, ResumeSummary)
from ..training.run import CANNOT_CONTINUE
from .passes import (NO_SPACE, HuntInterrupted, Supervisor, _Pass, _progress, _read_records, _say, console, disk_full,
                     signal_name, stop_running_passes)
from .plan import choose_resume, first_possible_step, located_failure, plan_from_record, wider_scope
from . import ranks as _ranks
from .plan import examination as _examination, first_scope as _first_scope   # noqa: F401 - names tests use
from .plan import iterations_to_dump as _iterations_to_dump, resumed_iteration as _resumed_iteration
from .verify_plan import verify_line
from .cluster import Cluster, cluster_for


def dump_path_problem(path: os.PathLike) -> Optional[str]:
    """Why MindSpore's dump would refuse ``path`` (a character outside ``[A-Za-z0-9_/-]``), or ``None``."""
    bad = sorted(set(re.sub(r"[A-Za-z0-9_/-]", "", str(path))))
    return None if not bad else f"{str(path)!r} contains {''.join(bad)!r}"


def _refuse_undumpable(run: Path) -> None:
    problem = dump_path_problem(run)
    if problem:
        raise HuntError(f"run folder {problem}: MindSpore's dump accepts only letters, digits, '_', '-' and '/' "
                        f"in its path, and pass 2 dumps into the run folder. Give --run-dir a path without them, "
                        f"e.g. {re.sub(r'[^A-Za-z0-9_/-]', '_', str(run))}")


def new_run_dir(parent: Optional[os.PathLike] = None) -> Path:
    """A fresh, uniquely named run folder (never reuses an existing one).

    Default parent: ``./mindguard_runs``; when the working directory's path has a character MindSpore's
    dump refuses (``~/src/mindguard-0.1.0``), ``<temp dir>/mindguard_runs`` instead, and it says so.
    """
    if parent is None:
        parent = Path("mindguard_runs").resolve()
        if dump_path_problem(parent):
            fallback = Path(tempfile.gettempdir()).resolve() / "mindguard_runs"
            _say(f"{dump_path_problem(parent)}, which MindSpore's dump refuses; using {fallback} instead "
                 f"(choose with --run-dir)")
            parent = fallback
    parent = Path(parent).resolve()
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise HuntError(f"cannot create the run folder's parent {str(parent)!r}: {exc.strerror or exc}; choose "
                        f"another with --run-dir") from None
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        candidate = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise HuntError(f"could not create a new run folder under {parent}")


def _first_failure(records: List[Dict[str, Any]], returncode: int) -> Optional[Dict[str, Any]]:
    """The failure of this pass: a "failed" record, else a "running" one if the process died mid-step.

    A record of kind ``interrupted`` (the user stopped the training) is not a failure to hunt.
    """
    typed = [(raw, _read(raw)) for raw in records]
    failed = [raw for raw, r in typed if r.status == "failed" and r.kind != "interrupted"]
    # a process killed by a signal (the OOM-killer, a crash in a kernel) died in the step its record is at; one that
    # exited with a code of its own without Python unwinding (os._exit) only ended early -- except under a launcher
    # (several ranks), whose exit code stands for a worker's death
    died = returncode < 0 or any((r.group_size or 1) > 1 for _, r in typed)
    if not failed and returncode != 0 and died and not _stopped_from_outside(returncode):
        died = (f"the process was killed by signal {-returncode} ({_signal_name(-returncode)}) during this step"
                if returncode < 0 else f"the process exited with code {returncode} during this step")
        failed = [dict(raw, kind="exception", message=died)
                  for raw, r in typed if r.status == "running" and r.global_step]
    if not failed:
        return None

    def first(raw: Dict[str, Any]) -> Tuple[int, bool, int]:
        """The rank that went bad first; on a tie, the one that saw the cause (not merely stopped for it)."""
        r = _read(raw)
        return r.global_step or 0, r.stopped_by_rank is not None, r.rank or 0

    return min(failed, key=first)


def _read(record: Dict[str, Any]) -> FailureRecord:
    """A pass's record (the JSON object the summary keeps) read through its fields, as written
    (:meth:`FailureRecord.as_written`: a record a failing process left is read, not refused)."""
    return FailureRecord.as_written(record)


#: Signals that stop a process from outside (``kill``, Ctrl-C, a closed terminal, a scheduler's preemption): a
#: training ended by one did not fail. SIGKILL is not among them: the OOM-killer sends it.
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT)


def _stopped_from_outside(returncode: int) -> bool:
    return returncode < 0 and -returncode in _STOP_SIGNALS


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return "unknown signal"
    return f"{name}: often the OOM-killer" if number == signal.SIGKILL else name


_SINK_REFUSED = "Dataset sink mode is not supported when dataset pipeline debug mode is on"   # MindSpore's words


def _refuse_sink_mode(where: str) -> "Outcome":
    _say("the dataset pipeline raised, and the script trains with dataset_sink_mode=True: MindSpore cannot run the "
         f"pipeline synchronously (its debug mode) in sink mode, which pass 2 needs to name the batch{where}.\n"
         "  Hunt with Model.train(..., dataset_sink_mode=False) to name the batch and the line that raised")
    return Outcome.EXAMINE_FAILED


def _log_tail(log_path: Path, size: int = 1 << 20) -> str:
    try:
        with open(log_path, "rb") as f:
            f.seek(max(0, os.path.getsize(log_path) - size))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _last_error_line(log_path: Path) -> Optional[str]:
    """The last ``SomethingError: ...`` line of a pass's output (the exception that ended the command)."""
    text = _log_tail(log_path, 65536)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
    return errors[-1] if errors else lines[-1] if lines else None


def _interpreter_hint(log_path: Path) -> str:
    """A hint when the command's Python lacks MindSpore or mindguard (``python`` on PATH is another interpreter)."""
    line = _last_error_line(log_path) or ""
    if re.search(r"No module named '(mindspore|mindguard)", line):
        return (f"\n  the command's Python cannot import them; mindguard runs in {sys.executable}: run the script "
                f"with that interpreter (mindguard hunt -- {sys.executable} train.py ...)")
    return ""


def _describe(record: Dict[str, Any]) -> str:
    """``"epoch 2, step 3/8 (global step 11), dump iteration 10: <what went wrong>"``."""
    try:
        return FailureRecord.from_dict(record, source="failure record").format()
    except RecordError as exc:
        return f"global step {record.get('global_step')}: {record.get('message') or record.get('kind')} ({exc})"


class _Hunt:
    """One hunt: its run folder, its passes, its summary (``summary.json``)."""

    def __init__(self, command: Sequence[str], run: Path, timeout: Optional[float], net_name: str, analyze: bool,
                 resume: str = "auto", keep_every: Optional[int] = None, dump_scope: Optional[str] = None,
                 origin: Optional[Tuple[Path, Dict[str, Any]]] = None, origin_problem: Optional[Tuple[str, str]] = None,
                 notes: Sequence[str] = ()):
        self.command, self.run, self.timeout, self.net_name, self.analyze = list(command), run, timeout, net_name, analyze
        self.origin = origin              # (path, record) of the failing run `--from` starts from
        self.origin_problem = origin_problem   # (path, why) of a `--from` record that cannot be used
        self.notes = list(notes)          # what differs from the failing run (another folder, edited files)
        self.resume, self.keep_every, self.first_scope = resume, keep_every, dump_scope
        self.summary = HuntSummary(command=self.command, run_dir=str(run))
        self.folder = RunFolder(run)
        self.examined: PassName = layout.PASS2   # the pass whose dump or replay is explained
        self.dump_scope = "full"          # what that pass dumped (DUMP_SCOPES)
        self._pass1_started = 0.0
        self.fast_forward = True          # resumed passes may reset a dataset to the kept step (mindguard.training.dataset_skip)
        self.cluster: Optional[Cluster] = None   # several msrun nodes: this node's side of their hunts (cluster.py)

    # -- passes ------------------------------------------------------------------------------------------
    def _pass(self, label: str, name: PassName, request: HuntRequest,
              dump: Optional[DumpConfig]) -> Tuple[_Pass, int, List[Dict[str, Any]]]:
        folder = self.folder.pass_folder(name)
        if not self.fast_forward:
            request = dataclasses.replace(request, fast_forward=False)
        env = dict(os.environ)
        HuntRequest.clear(env)
        env.pop(DUMP_ENV_VAR, None)
        env.update(request.to_environ())
        env.setdefault("PYTHONUNBUFFERED", "1")
        if dump is not None:
            json_path = folder.dump_config
            atomic_write_json(json_path, dump.to_dict())
            env[DUMP_ENV_VAR] = str(json_path)
        this_pass = _Pass(label, self.command, env, folder.output_log, request.record, self.timeout)
        if self.cluster is not None:   # [cluster hook] every node launches the same pass, together
            self.cluster.agree(label, self.cluster.plan_of(name.folder, request, dump))
        returncode = this_pass.run()
        diverged = read_json(folder.diverged) if request.resume_dir is not None and request.fast_forward \
            and not this_pass.stopped and folder.diverged.exists() else {}
        if diverged.get("fast_forwarded"):
            # the dataset reset (mindguard.training.dataset_skip) is not exact for every pipeline: iterate it instead
            why = diverged.get("why")
            aside = folder.fast_forward_attempt
            folder.path.rename(aside)
            folder.path.mkdir()
            _say(f"{label}: with the dataset reset to the kept step the run computes something else ({why}); again, "
                 f"iterating the dataset there (the first attempt is in {aside})")
            self.fast_forward = False   # the later passes iterate too
            return self._pass(label, name, request, dump)
        records = _read_records(request.record)
        if self.cluster is not None:   # [cluster hook] every node decides from every node's records
            records = self.cluster.all_records(name.folder, records)
        self._check_pass(this_pass, name, returncode, records)
        return this_pass, returncode, records

    def _request(self, name: PassName, pass_name: str, **fields: Any) -> HuntRequest:
        folder = self.folder.pass_folder(name)
        folder.path.mkdir()
        return HuntRequest(pass_name=pass_name, record=folder.record, net_name=self.net_name,
                           capture_dir=folder.capture, replay_report=folder.replay_report, **fields)

    # -- the three steps -----------------------------------------------------------------------------------
    def hunt(self) -> Outcome:
        if self.cluster is not None:   # [cluster hook] meet the other nodes' hunts before anything is launched
            self.cluster.join()
        if self.origin is not None:
            return self._against_record(self.origin[0], self.origin[1], self.hunt_from_record(*self.origin))
        if self.origin_problem is not None:   # a record that cannot be read: the plain hunt, and why
            path, why = self.origin_problem
            _say(f"{why}: running the two passes of a plain hunt instead (from step 1)")
            self.summary.from_record = FromRecordSummary(record=path, route="from_step_1", why=why, window=None,
                                                         kept_step=None, fallback=why)
        return self.hunt_from_start()

    def _against_record(self, path: Path, record: Dict[str, Any], outcome: Outcome) -> Outcome:
        """``--from``: the answer judged against the record it started from. A run that trained to the end although
        the record says it failed is NOT REPRODUCIBLE (exit 3), never "healthy"; a failure found at another global
        step than the record's is said so (``from_record.disagrees``)."""
        said = _read(record).global_step if isinstance(record, dict) and record.get("status") == "failed" else None
        if not said or not isinstance(self.summary.from_record, FromRecordSummary) \
                or self.summary.from_record.route == "done":
            return outcome
        if outcome is Outcome.HEALTHY:
            _say(f"NOT REPRODUCIBLE: the record {path} says the run failed at global step {said} "
                 f"({_read(record).kind}), but the hunt's runs of the same command did not fail. Its data order or "
                 f"randomness differ between runs (a shuffled dataset, an unseeded RNG, a file that changed): make "
                 f"the run repeat (mindguard.fix_randomness(seed), shuffle=False) and hunt it again")
            self.summary.from_record.disagrees = {"record_step": said, "found_step": None}
            return Outcome.NOT_REPRODUCIBLE
        return outcome

    def _check_against_record(self, failure: Dict[str, Any]) -> None:
        """``--from`` run from step 1: say, before the answer, when its pass 1 failed at a global step outside what
        the record says (its step, or the window of steps it says the failure lies in)."""
        if self.origin is None or not isinstance(self.summary.from_record, FromRecordSummary):
            return
        path, record = self.origin
        said = _read(record).global_step if record.get("status") == "failed" else None
        found = _read(failure).global_step
        window = self.summary.from_record.window
        first, last = (window[0], window[-1]) if isinstance(window, list) and window else (said, said)
        if not said or found is None or first is None or last is None or first <= found <= last:
            return
        where = f"global step {said}" if first == last else f"global steps {first}-{last}"
        _say(f"note: this run failed at global step {found}, but the record {path} says the run failed at {where}: "
             f"the run did not repeat itself (data order or randomness differ between runs), so the answer below "
             f"explains the hunt's run, which may not be the recorded failure")
        self.summary.from_record.disagrees = {"record_step": said, "found_step": found}

    def hunt_from_record(self, path: Path, record: Dict[str, Any]) -> Outcome:
        """``--from``: examine the failure a run with an always-on Guard recorded, starting from the training state
        it kept (:mod:`mindguard.hunt.plan` decides the route); the two passes of a plain hunt when the state cannot
        be used."""
        state_dir, meta, state_note = (choose_kept_state(record, first_possible_step(record))
                                       if record.get("status") != "finished" else (None, None, None))
        ranks = int(record.get("group_size") or 1)
        if ranks > 1 and record.get("status") != "finished":   # [ranks hook] a job resumes only from every rank's
            # state at one step (every node asks the others, whatever its own rank kept)
            state_dir, meta, state_note = _ranks.job_states(path, record, ranks, self.command, self.cluster,
                                                            self.run)
        how = _examination(record)
        plan = plan_from_record(record, meta, self.command, how, state_note, ranks=ranks)
        self.summary.from_record = FromRecordSummary(record=str(path), route=plan.route, why=plan.why,
                                                     window=list(plan.window) if plan.window else None,
                                                     kept_step=plan.state_step)
        if self.notes:
            self.summary.from_record.edits = list(self.notes)
        for note in [*self.notes, *plan.warnings]:
            _say(f"note: {note}")
        if plan.route == "done":
            _say(f"{path}: {plan.why}")
            if plan.returncode is not None:
                self.summary.command_returncode = plan.returncode
            return {"healthy": Outcome.HEALTHY, "command_failed": Outcome.COMMAND_FAILED}.get(
                plan.outcome, Outcome.FAILED_BEFORE_TRAINING)
        failure = plan.failure
        self.summary.failure = failure
        _say(f"from the failing run's record {path}: {_describe(failure)}")
        if plan.route == "from_step_1":
            _say(f"{plan.why}: running the two passes of a plain hunt instead (from step 1)")
            self.summary.from_record.fallback = plan.why
            return self.hunt_from_start()
        _say(plan.why)
        if how == "dataset" and _read(failure).dataset_sink_mode:
            return _refuse_sink_mode("")
        assert state_dir is not None
        if plan.locate:
            first, last = plan.window
            span = f"global steps {first}-{last}" if first < last else f"global step {last}"
            _say(f"pass 1 (locate: from the training state kept at global step {plan.state_step}, check every step "
                 f"through {span} and keep the state at the failing one): {shlex.join(self.command)}")
            request = self._request(layout.LOCATE, "record", resume_dir=state_dir,
                                    keep_dir=self._at(layout.LOCATE).state,
                                    keep_steps=plan.window)
            located, rc, records = self._pass("pass 1 (locate)", layout.LOCATE, request, None)
            self._say_overridden(layout.LOCATE)
            if located.stopped:
                return self._stopped(located)
            self.summary.set_pass(layout.LOCATE.folder, PassSummary(rc, records))
            if self._print_replays(self._at(layout.LOCATE)):
                _say("a GuardedTrainStep refused the update, so the step was captured and replayed in the same run")
                return Outcome.FOUND
            diverged = self._at(layout.LOCATE).diverged
            exact, where = located_failure(_first_failure(records, rc), plan)
            unfit = None
            if diverged.exists():
                said = read_json(diverged)
                unfit = said.get("why") if said.get("unfit") else None
                where = f"computes something else ({said.get('why')})"
                exact = None
            if exact is None and unfit is None and not diverged.exists() and record.get("status") == "running" \
                    and _first_failure(records, rc) is None and rc == 0:
                _say(f"from the training state kept at global step {plan.state_step} the run went through global step "
                     f"{last}, where the killed run died, without failing: the kill came from outside the step's "
                     f"computation (the OOM-killer when memory ran short, an administrator, a scheduler), so its "
                     f"numbers have nothing to explain. If it was the OOM-killer, give the training more memory or a "
                     f"smaller batch")
                return Outcome.COMMAND_FAILED
            if exact is None or _ranks.kept_meta(self._at(layout.LOCATE).state) is None:   # [ranks hook] per rank
                why = unfit or (f"from the kept state the run {where}, not a failure within {span} "
                                f"({_read(failure).kind})")
                _say(f"{why}: running the two passes of a plain hunt instead (from step 1)")
                self.summary.from_record.fallback = why
                return self.hunt_from_start()
            _say(f"pass 1 (locate) found the exact step: {_describe(exact)}")
            failure, state_dir = exact, self._at(layout.LOCATE).state
            self.summary.failure = failure
        examined = self._examine_pass(layout.EXAMINE, "pass 2", failure, how, resume_dir=state_dir,
                                      within=plan if ranks > 1 else None)
        if not plan.locate:
            self._say_overridden(layout.EXAMINE)
        if examined is Outcome.NOT_REPRODUCIBLE:
            said = read_json(self._at(layout.EXAMINE).diverged) if self._at(layout.EXAMINE).diverged.exists() else {}
            why = said.get("why") if said.get("unfit") else "the failure did not repeat from the kept state"
            _say(f"{why}: running the two passes of a plain hunt instead (from step 1)")
            self.summary.from_record.fallback = why
            return self.hunt_from_start()
        if isinstance(examined, Outcome):
            return examined
        if ranks > 1 and _read(examined[1]).global_step != _read(failure).global_step:   # [ranks hook] the window's
            failure = examined[1]                                                         # exact step, found
            _say(f"pass 2 found the exact step: {_describe(failure)}")
            self.summary.failure = failure
        return self.explain(failure, *examined)

    def _say_overridden(self, name: PassName) -> None:
        """A resumed pass found edits of the script that the kept state overrides (a learning rate held in a
        Parameter): named, once, and in the summary's ``from_record.edits``."""
        path = layout.overridden_beside(self._at(name).record)
        if not path.exists() or self.summary.from_record is UNSET:
            return
        try:
            said = read_json(path)
        except (OSError, ValueError):
            return
        edits = [f"{edit}: the kept state (global step {said.get('step')}) sets the failing run's value, so the "
                 f"answer is the failing run's and this edit is not in effect; to try the edit, hunt from step 1: "
                 f"mindguard hunt -- {shlex.join(self.command)}" for edit in said.get("edits") or []]
        for edit in edits:
            _say(f"note: {edit}")
        known = self.summary.from_record.edits
        self.summary.from_record.edits = (list(known) if known is not UNSET else []) + edits

    def hunt_from_start(self) -> Outcome:
        """Pass 1 from step 1 finds the failing step; pass 2 examines it; the answer is explained."""
        failure = self.record()
        if isinstance(failure, Outcome):
            return failure
        self._check_against_record(failure)
        examined = self.examine(failure)
        if isinstance(examined, Outcome):
            return examined
        return self.explain(failure, *examined)

    def record(self):
        _say(f"pass 1 (record): {shlex.join(self.command)}")
        request = self._request(layout.PASS1, "record", observe_path=self._at(layout.PASS1).observe,
                                keep_dir=self._at(layout.PASS1).state if self.resume != "never" else None,
                                keep_every=self.keep_every)
        try:
            observe = observing_config(request.observe_path, net_name=self.net_name, device_target="CPU")
        except DumpConfigError as exc:
            raise HuntError(f"cannot observe dump iterations: {exc}") from None
        self._pass1_started = time.time()
        first, rc, records = self._pass("pass 1", layout.PASS1, request, observe)
        if first.stopped:
            return self._stopped(first)
        self.summary.set_pass(layout.PASS1.folder, PassSummary(rc, records))
        if not records and rc != 0:
            _say(f"the command exited with code {rc} before it started a training with mindguard.Guard or "
                 f"mindguard.watch:\n  {_last_error_line(first.log_path) or '(it printed no error)'}\n"
                 f"  fix that first; its output is in {first.log_path}{_interpreter_hint(first.log_path)}")
            self.summary.command_returncode = rc
            return Outcome.FAILED_BEFORE_TRAINING
        if not records:
            _say("no failure record was written: the command never started a training with mindguard.Guard or "
                 "mindguard.watch.\n  hunt needs the script to pass a Guard to model.train, e.g.\n"
                 "      model.train(epochs, data, callbacks=[mindguard.Guard(), ...])\n"
                 "  or to wrap its train step: train_step = mindguard.watch(train_step, net, optimizer)\n"
                 f"  (the command exited with code {rc}; its output is in {first.log_path})")
            return Outcome.NO_GUARD
        failure = _first_failure(records, rc)
        if failure is None and _stopped_from_outside(rc):
            where = _progress(request.record) or "before its first step"
            _say(f"the command was stopped by signal {-rc} ({_signal_name(-rc)}) from outside at {where}, not by a "
                 f"failure of its training: nothing to hunt (see {first.log_path})")
            self.summary.command_returncode = 128 - rc
            return Outcome.COMMAND_FAILED
        if failure is not None and _read(failure).phase == "script":
            _say(f"pass 1: at global step {_read(failure).global_step} the script raised {_read(failure).message}.\n"
                 f"  That is an error of the script (a callback of its own, or the code between steps), not of the "
                 f"training's numbers: nothing to dump. Its traceback is in {first.log_path}")
            self.summary.failure = failure
            self.summary.command_returncode = rc or 1
            return Outcome.COMMAND_FAILED
        if failure is not None and _read(failure).phase == "mindguard":
            return self._mindguard_failed("pass 1", failure, first.log_path)
        if failure is None and _ended_early(records) is not None:
            return self._ended_early(first, rc, records)
        if failure is None:
            if rc != 0:
                _say(f"the command exited with code {rc} but training reported no failure "
                     f"(see {first.log_path}); nothing to hunt (exit 4: the command failed, not its training)")
                self.summary.command_returncode = rc
                return Outcome.COMMAND_FAILED
            checked = [r.params_checked for r in map(_read, records) if r.params_checked is not None]
            if checked and not any(checked):
                _say("pass 1 finished with no failure: the loss stayed finite at every step (loss only: no Parameter "
                     "was checked -- pass watch() the model whose MindSpore Parameters the step trains)")
            else:
                _say("pass 1 finished with no failure: all losses and parameters stayed finite")
            return Outcome.HEALTHY
        self.summary.failure = failure
        if not _read(failure).global_step:
            _say(f"the command failed before the first training step ({_read(failure).message or 'no message'}); "
                 f"fix that first (see {first.log_path})")
            return Outcome.FAILED_BEFORE_TRAINING
        _say(f"pass 1 failed: {_describe(failure)}")
        if _read(failure).seed is None:
            _say("note: the script did not call mindguard.fix_randomness(seed); if pass 2 fails elsewhere, "
                 "that is the first thing to fix")
        if self._print_replays(self._at(layout.PASS1)):
            _say("a GuardedTrainStep refused the update, so the step was captured and replayed in the same run: "
                 "no second pass needed")
            return Outcome.FOUND
        return failure

    def examine(self, failure: Dict[str, Any]):
        """Pass 2: from the training state kept near the failure when that is quicker (and the failure repeats
        from there), else from step 1."""
        how = _examination(failure)
        if how == "dataset" and _read(failure).dataset_sink_mode:
            return _refuse_sink_mode("")
        state = self._resume_route(failure, how)
        if state is not None:
            examined = self._examine_resumed(failure, how, state)
            if examined is not None:
                return examined
            _say("running pass 2 from step 1 instead")
        return self._examine_pass(layout.PASS2, "pass 2", failure, how)

    def _resume_route(self, failure: Dict[str, Any], how: str) -> Optional[Dict[str, Any]]:
        """The kept state to resume from (its ``state.json``), when resuming is allowed and (``--resume auto``)
        quicker than running from step 1 (:func:`mindguard.hunt.plan.choose_resume`), else ``None``."""
        meta = read_state_meta(self._at(layout.PASS1).state) if self.resume != "never" else None
        choice = choose_resume(failure, meta, self._pass1_started, how, self.resume)
        if choice is None:
            return None
        self.summary.resume = ResumeSummary(kept_step=choice.kept_step, estimate_s={
            "from_step_1": round(choice.from_step_1_s, 3) if choice.from_step_1_s is not None else None,
            "resumed": round(choice.resumed_s, 3)})
        if choice.resume:
            return meta
        then = (": running pass 2 from step 1 (--resume always resumes)" if choice.from_step_1_s is None else "")
        _say(f"the training state of {describe_state(meta)} was kept, but {choice.why}{then}")
        return None

    def _examine_resumed(self, failure: Dict[str, Any], how: str, state: Dict[str, Any]):
        """Pass 2 from the kept state. A compiled step is dumped at the iteration it has in a run that starts at
        the kept step when that can be told (:func:`_resumed_iteration`; the dump is checked to hold the step),
        else by a run that starts *at* the failing step, from a state kept there (by that first run, or by a
        locate pass from the kept state): its dump holds that one step. ``None``: the failure did not repeat from
        the kept state (state the kept Parameters do not hold); the caller runs from step 1."""
        step, kept = int(_read(failure).global_step), int(state["step"])
        resume_dir = self._at(layout.PASS1).state
        if self.summary.resume is UNSET:
            self.summary.resume = ResumeSummary()
        self.summary.resume.route = ROUTE_RESUMED
        predicted = _resumed_iteration(failure, state) if how == "dump" and kept < step else None
        if predicted is not None:
            examined = self._examine_pass(layout.RESUMED, "pass 2 (resumed)", failure, how, resume_dir=resume_dir,
                                          iterations=[predicted])
            if not (isinstance(examined, tuple) and self._dump_holds_step(examined[1])):
                if isinstance(examined, Outcome) and examined is not Outcome.NOT_REPRODUCIBLE:
                    return examined
                if examined is Outcome.NOT_REPRODUCIBLE:
                    self.summary.resume.route = ROUTE_DID_NOT_REPEAT
                    return None
                _say(f"the dump of the resumed run does not hold global step {step} (its graphs were numbered "
                     f"otherwise); dumping it from the state kept at it instead")
                self.summary.resume.predicted_iteration_missed = predicted
            else:
                return examined
        at_step = self._at(layout.RESUMED).state
        if predicted is not None and read_state_meta(at_step) is not None:
            resume_dir, label = at_step, "pass 3 (resumed)"
        elif how == "dump" and kept < step:
            _say(f"pass 2 (locate: from the training state kept at global step {kept}, run to global step {step} and "
                 f"keep the state there): {shlex.join(self.command)}")
            request = self._request(layout.LOCATE, "record", resume_dir=resume_dir,
                                    keep_dir=self._at(layout.LOCATE).state,
                                    keep_steps=(step, step))
            located, rc, records = self._pass("pass 2 (locate)", layout.LOCATE, request, None)
            if located.stopped:
                return self._stopped(located)
            again = _first_failure(records, rc)
            self.summary.set_pass(layout.LOCATE.folder, PassSummary(rc, records))
            if self._at(layout.LOCATE).diverged.exists():
                again = None
            if again is None or _read(again).global_step != step or _read(again).kind != _read(failure).kind \
                    or read_state_meta(self._at(layout.LOCATE).state) is None:
                where = ("did not fail" if again is None else
                         f"failed at global step {_read(again).global_step} ({_read(again).kind})")
                _say(f"from the kept state the run {where}, not at global step {step} ({_read(failure).kind}): "
                     f"the step depends on random state the kept Parameters do not hold")
                self.summary.resume.route = ROUTE_DID_NOT_REPEAT
                return None
            resume_dir, label = self._at(layout.LOCATE).state, "pass 3 (resumed)"
        else:
            label = "pass 2 (resumed)"
        name = layout.RESUMED_AT_STEP if predicted is not None else layout.RESUMED
        examined = self._examine_pass(name, label, failure, how, resume_dir=resume_dir)
        if examined is Outcome.NOT_REPRODUCIBLE:
            self.summary.resume.route = ROUTE_DID_NOT_REPEAT
            return None
        return examined

    def _dumped_every_iteration(self) -> bool:
        """[ranks hook] The examine pass dumped every iteration (resumed from a kept state): its dump holds the step
        by construction, and dumping every iteration again would show nothing more. Decided alike on every node
        (the file-time check below reads this node's files only)."""
        config = self._at(self.examined).dump_config
        try:
            return bool(config.exists() and read_json(config)["common_dump_settings"]["iteration"] == "all")
        except (OSError, ValueError, KeyError, TypeError):
            return False

    def _dump_holds_step(self, repeated: Dict[str, Any]) -> bool:
        """Whether the examine pass's dump has files written during the repeated step."""
        window = _step_window(self.summary.passes[self.examined.folder].records, _read(repeated).global_step)
        if not window:
            return False
        dirs, _ = check_step_dump(self._at(self.examined).dump, _read(repeated).rank or 0, self.net_name,
                                  window, [])
        return bool(dirs)

    def _examine_pass(self, name: PassName, label: str, failure: Dict[str, Any], how: str,
                      resume_dir: Optional[Path] = None, iterations: Any = None, scope: Optional[str] = None,
                      second_look: bool = False, within: Optional[Any] = None):
        """``within``: [ranks hook] a multi-rank ``--from`` plan (no locate pass): a failure at any step of its
        window, checked every step from the kept state, is the failing run's (:func:`located_failure`)."""
        step = int(_read(failure).global_step)
        fields: Dict[str, Any] = {"examine_step": step, "examine": how, "resume_dir": resume_dir}
        dump = None
        if how == "dump":
            if iterations is None:
                iterations = "all" if resume_dir is not None else _iterations_to_dump(failure)
            scope = scope or _first_scope(failure, self.first_scope, self.resume)
            fields["dump_path"] = self._at(name).dump
            if scope != "full" and self.resume != "never":   # a narrower dump may need a wider one of this step
                fields.update(keep_dir=self._at(name).state, keep_steps=(step, step))
            what = (f"dump {DUMP_SCOPES[scope][0]} of global step {step}, the first step this run trains"
                    if iterations == "all" else
                    f"dump {DUMP_SCOPES[scope][0]} of iteration {'|'.join(map(str, iterations))}, global step {step}")
        elif how == "replay":
            what = f"capture global step {step} and replay it eagerly"
        else:
            what = "run the dataset pipeline synchronously to find the batch that raised"
        if resume_dir is not None:   # [ranks hook] several ranks: their kept-ranks folder
            what += f"; from the training state kept at global step {(_ranks.kept_meta(resume_dir) or {})['step']}"
        _say(f"{label} (examine: {what}): {shlex.join(self.command)}")
        request = self._request(name, "examine", **fields)
        if how == "dump":
            _, kernels, input_output = DUMP_SCOPES[scope]
            dump = DumpConfig(request.dump_path, self.net_name, iterations, device_target="CPU", kernels=kernels,
                              input_output=input_output)
            self.dump_scope = scope
        second, rc, records = self._pass(label, name, request, dump)
        if second.stopped:
            return self._stopped(second)
        repeated = _first_failure(records, rc)
        if resume_dir is not None and self._at(name).diverged.exists():
            said = read_json(self._at(name).diverged)
            why = said.get("why")
            if not said.get("unfit"):
                _say(f"{label} stopped: from the kept state the run computes something else ({why})")
            self.summary.set_pass(name.folder, PassSummary(rc, records, diverged=why))
            return Outcome.NOT_REPRODUCIBLE
        self.examined = name
        self.summary.set_pass(name.folder, PassSummary(rc, records, examine=how))
        if how == "dataset" and repeated is None and _SINK_REFUSED in _log_tail(second.log_path):
            return _refuse_sink_mode(f" (see {second.log_path})")
        if repeated is not None and _read(repeated).phase == "mindguard":
            return self._mindguard_failed(label, repeated, second.log_path)
        if repeated is not None and not _read(repeated).global_step:
            _say(f"{label} failed before its first step, so it could not examine global step {step}: "
                 f"{_read(repeated).message or 'no message'} (see {second.log_path})")
            return Outcome.EXAMINE_FAILED
        located = within is not None and located_failure(repeated, within)[0] is not None
        same_step = repeated is not None and (how == "dataset" or _read(repeated).global_step == step or located)
        if not same_step or (_read(repeated).kind != _read(failure).kind and not located):
            broken = _why_not_examined(second, rc, records, step)
            if broken is not None:   # no evidence either way: the pass did not get to run the step
                _say(f"could not examine global step {step}: {label} {broken}.\n  That says nothing about whether the "
                     f"failure repeats; its output is in {second.log_path}")
                self.summary.passes[name.folder].not_examined = broken
                return Outcome.EXAMINE_FAILED
            where = ("did not fail" if repeated is None else
                     f"failed at global step {_read(repeated).global_step} ({_read(repeated).kind}: "
                     f"{_read(repeated).message or 'no message'})")
            if second_look:   # a second examiner that computes otherwise is no evidence; the first one's answer stands
                _say(f"{label} {where}, not at global step {step} ({_read(failure).kind}): run this way the step "
                     f"computes otherwise, so its dump is no evidence for this failure")
                return Outcome.NOT_REPRODUCIBLE
            if resume_dir is not None:
                _say(f"from the kept state {label} {where}, not at global step {step} ({_read(failure).kind})")
                return Outcome.NOT_REPRODUCIBLE
            killed = re.match(r"the process was killed by signal (\d+) \(([^)]*)\)", _read(failure).message or "")
            if killed and repeated is None:   # pass 1 died by a kill (SIGKILL: the OOM-killer); pass 2 ran the step
                _say(f"pass 1 was killed by signal {killed.group(1)} ({killed.group(2)}) at global step {step}, and "
                     f"{label} ran that step without failing: the kill came from outside the step's computation (the "
                     f"OOM-killer when memory ran short, an administrator, a scheduler), so its numbers have nothing "
                     f"to explain. If it was the OOM-killer, give the training more memory or a smaller batch")
                self.summary.command_returncode = 128 + int(killed.group(1))
                return Outcome.COMMAND_FAILED
            _say(f"NOT REPRODUCIBLE: pass 1 failed at global step {step} ({_read(failure).kind}), {label} {where}.\n"
                 "  A dump of a run that fails somewhere else explains nothing. Make the run repeat first:\n"
                 "    - call mindguard.fix_randomness(seed) at the top of the script, before building the network;\n"
                 "    - do not shuffle the dataset (shuffle=False) while hunting, or fix its seed;\n"
                 "    - remove dropout (mindguard.Guard(disable_dropout=True)) or use fix_randomness(cpu_single_thread=True);\n"
                 "    - load fixed initial weights (mindguard.Guard(init_params_dir='init_params')).")
            return Outcome.NOT_REPRODUCIBLE
        _say(f"{label} repeated the failure at global step {_read(repeated).global_step}")
        return how, repeated, second

    def explain(self, failure: Dict[str, Any], how: str, repeated: Dict[str, Any], second: _Pass) -> Outcome:
        if not self.analyze:
            return Outcome.FOUND
        if how == "replay":
            errors = [r.get("error") for r in (read_json(p) for p in _dist.rank_paths(
                self._at(self.examined).replay_report)) if r.get("error")]
            if errors or "mindguard: cannot replay" in _log_tail(second.log_path):
                return self._mindguard_failed("pass 2", {"message": errors[0] if errors else
                                                         _last_error_line(second.log_path)}, second.log_path)
            if not self._print_replays(self._at(self.examined)):
                _say(f"pass 2 captured no step to replay (see {second.log_path})")
                return Outcome.UNEXPLAINED
            if not self.summary.origin:
                step = _read(repeated).global_step
                replays = [read_json(p) for p in _dist.rank_paths(self._at(self.examined).replay_report)]
                tried = [f"replay of global step {step}"]
                second_look = self._compiled_look(failure, tried)
                if second_look is not None:
                    return second_look
                found = known(failure, "replay", self.command, str(self._at(self.examined).path),
                              replay=replays[0] if replays else None, tried=tried)
                self.summary.known = found
                _say(f"the replay of global step {step} found no operator or cell that turned finite values into "
                     f"Inf/NaN, so it does not explain this failure ({_read(failure).kind}: "
                     f"{_read(failure).message or 'no message'}).\n{render_known(found)}\n  The training's own "
                     f"output is in {second.log_path}.")
                return Outcome.UNEXPLAINED
            return Outcome.FOUND
        if how == "dataset":
            self.summary.failure = repeated
            text = _explain_dataset_error(repeated)
            atomic_write_text(self.folder.report_text, text + "\n")
            self._tell(text)
            self.summary.origin = {"op_type": "dataset", "direction": "input", "source": _user_frame(
                _read(repeated).message or ""), "name": None, "hint": None}
            return Outcome.FOUND
        return self._explain_dump(failure, repeated, second)

    def _compiled_look(self, failure: Dict[str, Any], tried: List[str]) -> Optional[Outcome]:
        """The second examiner of a ``watch`` Cell step that trains eagerly (PyNative) and whose replay isolated no
        operator: run that step as one GRAPH-mode graph (:meth:`mindguard.training.watch._Watched._compiled_call`) and
        analyse its full dump. ``FOUND`` when that found the answer (printed and recorded); the outcome of a pass
        that was stopped or in which mindguard itself failed; else None, the replay's pass restored as the one
        examined (``tried`` says what was looked at). Only within
        :data:`COMPILED_LOOK_STEPS` steps of a kept state or of step 1: every iteration is dumped from there."""
        record = _read(failure)
        step = int(record.global_step or 0)
        if (record.call or {}).get("kind") != "watch" or record.mode != "pynative" or not step or \
                record.kind not in ("nonfinite_loss", "nonfinite_params", "nonfinite_grads"):
            return None
        kept = read_state_meta(self._at(layout.PASS1).state) if self.resume != "never" else None
        resume_dir = self._at(layout.PASS1).state if kept is not None and int(kept["step"]) <= step else None
        start = int(kept["step"]) if resume_dir is not None else 1
        if step - start >= COMPILED_LOOK_STEPS:
            return None
        replayed, scope = self.examined, self.dump_scope
        _say(f"the replay of global step {step} isolated no operator; examining the step compiled instead: the "
             f"watched Cell run as one GRAPH-mode graph, every op's inputs and outputs dumped")
        examined = self._examine_pass(COMPILED_LOOK, "examine (compiled)", failure, "dump", resume_dir=resume_dir,
                                      iterations="all", scope="full", second_look=True)
        tried.append(f"the step compiled (GRAPH mode) and dumped ({COMPILED_LOOK.folder})")
        if isinstance(examined, tuple) and self._dump_holds_step(examined[1]):
            _, repeated, second = examined
            if self._analyse_dump(failure, repeated, second, final=False) is Outcome.FOUND:
                _say(f"the compiled step's dump found what the replay of global step {step} could not see")
                return Outcome.FOUND
        elif isinstance(examined, tuple):
            tried[-1] += ": it did not compile, or its dump holds no file of the step"
        elif examined in (Outcome.NOT_REPRODUCIBLE, Outcome.EXAMINE_FAILED):
            tried[-1] += ": run so, the step computed otherwise or did not run"
        else:
            return examined
        self.examined, self.dump_scope = replayed, scope
        return None

    def _explain_dump(self, failure: Dict[str, Any], repeated: Dict[str, Any], second: _Pass) -> Outcome:
        """Analyse the dump of the step; when a narrow dump (:data:`DUMP_SCOPES`) explains nothing, dump the same
        step wider -- from the state kept at it, so each widening costs one compile and one step."""
        if not _read(failure).iteration_observed and not self._dumped_every_iteration() \
                and not self._dump_holds_step(repeated):
            # the iteration(s) dumped were estimated and hold no file of the step: dump every iteration (from the
            # state pass 1 kept, when there is one) and keep what the step's time window holds
            step = int(_read(failure).global_step)
            kept = read_state_meta(self._at(layout.PASS1).state) if self.resume != "never" else None
            resume_dir = self._at(layout.PASS1).state if kept is not None and int(kept["step"]) <= step else None
            _say(f"the dump of iteration(s) {'|'.join(map(str, _iterations_to_dump(failure)))} holds no file of "
                 f"global step {step} (its iteration was not observed): dumping every iteration instead")
            examined = self._examine_pass(layout.EVERY_ITERATION, "pass 2 (every iteration)", failure, "dump",
                                          resume_dir=resume_dir, iterations="all", scope=self.dump_scope)
            if isinstance(examined, Outcome):
                return examined
            _, repeated, second = examined
        while True:
            wider = wider_scope(self.dump_scope)
            state = self._state_at(int(_read(failure).global_step))
            outcome = self._analyse_dump(failure, repeated, second, final=wider is None)
            if outcome is not Outcome.UNEXPLAINED or wider is None:
                return outcome
            narrow = (self.examined, self.dump_scope, repeated, second)
            if self.summary.dump_scopes is UNSET:
                self.summary.dump_scopes = []
            self.summary.dump_scopes.append(
                {"scope": self.dump_scope, "pass": self.examined.folder,
                 "bytes": tree_size(self._at(self.examined).dump)[0]})
            _say(f"the dump of {DUMP_SCOPES[self.dump_scope][0]} shows no operator that made the Inf/NaN; dumping "
                 f"{DUMP_SCOPES[wider][0]} of the same step, "
                 + ("from the state kept at it" if state is not None else "from step 1 (no state was kept at it)"))
            examined = Outcome.NOT_REPRODUCIBLE
            if state is not None:
                examined = self._examine_pass(self.examined.wider(wider), f"examine ({wider})",
                                              failure, "dump", resume_dir=state, scope=wider)
            if examined is Outcome.NOT_REPRODUCIBLE and not self._at(layout.from_step_1(wider)).path.exists():
                if state is not None:
                    _say(f"dumping {DUMP_SCOPES[wider][0]} of global step {_read(failure).global_step} from step 1 "
                         f"instead")
                examined = self._examine_pass(layout.from_step_1(wider), f"examine ({wider}, from step 1)",
                                              failure, "dump", scope=wider)
            if isinstance(examined, Outcome):   # the wider look failed: say what the narrow one showed
                self.examined, self.dump_scope, repeated, second = narrow
                return self._analyse_dump(failure, repeated, second, final=True)
            _, repeated, second = examined

    def _analyse_dump(self, failure: Dict[str, Any], repeated: Dict[str, Any], second: _Pass, *,
                      final: bool) -> Outcome:
        """Analyse the examine pass's dump; print and record the answer unless it explains nothing and is not
        ``final`` (a wider dump follows)."""
        from ..analysis import analyze_dump

        dump_path = self._at(self.examined).dump
        rank = _read(repeated).rank or 0
        window = _step_window(self.summary.passes[self.examined.folder].records, _read(repeated).global_step)
        if window:  # the files of the step, whatever iteration directories they are in
            for problem in check_step_dump(dump_path, rank, self.net_name, window, [])[1]:
                _say(f"warning: {problem}")
        try:
            report = analyze_dump(dump_path, iteration=None if window else _read(repeated).dump_iteration,
                                  time_window=tuple(window) if window else None,
                                  state=self._state_at(_read(repeated).global_step))
        except (MindguardError, OSError, ValueError) as exc:
            _say(f"the dump in {dump_path} could not be analysed: {type(exc).__name__}: {exc}")
            return Outcome.ANALYSIS_FAILED
        if self.cluster is not None:   # [cluster hook] one answer from every node's report
            report = self.cluster.one_report(f"{self.examined.folder}/{self.dump_scope}", report)
        if not report.explains_failure and not final:
            return Outcome.UNEXPLAINED
        recorded = _read(failure).dump_iteration
        if report.iteration is not None and recorded is not None and report.iteration != recorded:
            report.notes.insert(0, f"dump iteration {report.iteration} of {self.examined.folder} is global step "
                                   f"{_read(repeated).global_step} (dump iteration {recorded} in pass 1's record): a "
                                   f"pass that starts from a kept training state numbers its iterations from there")
        self.summary.dump_bytes = tree_size(dump_path)[0]
        found = report.to_dict()
        atomic_write_json(self.folder.report, found)
        text = str(report)
        atomic_write_text(self.folder.report_text, text + "\n")
        self._tell(text)
        for key in ("origin", "stopped_at", "nonfinite_inputs", "warnings"):
            setattr(self.summary, key, found.get(key))
        if not found.get("origin") and found.get("nonfinite_inputs"):
            self.summary.origin = _input_origin(found["nonfinite_inputs"])
        if report.ranks:  # distributed: which rank brought the Inf/NaN in, which only received it
            self.summary.origin_rank = report.origin_rank
            self.summary.rank_roles = found.get("rank_roles")
        if not report.explains_failure:
            step = _read(repeated).global_step
            shows = ("shows Inf/NaN but no operator that made it from finite values" if report.holds_nonfinite else
                     "shows no Inf/NaN in the files mindguard could read and no operator where the step stopped")
            tried = [f"dump of {DUMP_SCOPES[d['scope']][0]} ({d['pass']})" for d in self.summary.dump_scopes or []
                     if d.get("scope") in DUMP_SCOPES]
            tried.append(f"dump of {DUMP_SCOPES[self.dump_scope][0]} ({self.examined.folder})"
                         if self.dump_scope in DUMP_SCOPES else f"dump ({self.examined.folder})")
            facts = known(failure, "dump", self.command, str(dump_path), report=dict(found, profile=report.profile),
                          tried=tried, widest=self.dump_scope == "full")
            self.summary.known = facts
            _say(f"the dump of global step {step} {shows}, so it does not explain this failure "
                 f"({_read(failure).kind}: {_read(failure).message or 'no message'}).\n{render_known(facts)}\n"
                 f"  The training's own output is in {second.log_path}.")
            return Outcome.UNEXPLAINED
        return Outcome.FOUND

    # -- helpers -------------------------------------------------------------------------------------------
    def _at(self, name: PassName) -> layout.PassFolder:
        """The folder of the pass ``name``."""
        return self.folder.pass_folder(name)

    def _state_at(self, step: Optional[int]) -> Optional[Path]:
        """The state the examine pass kept at the beginning of global step ``step``, if it kept one."""
        state = self._at(self.examined).state
        meta = read_state_meta(state)
        return state if meta is not None and step is not None and meta.get("step") == step else None

    def _mindguard_failed(self, label: str, record: Dict[str, Any], log_path: Path) -> Outcome:
        """mindguard's own code failed in a pass: said as its failure (exit 2), never as the training's."""
        message = str(_read(record).message or "no message").strip()
        _say(f"{label}: mindguard itself failed (its own error, not your training's, and not a sign that the run does "
             f"not repeat):\n  {message.splitlines()[0][:500]}\n  The training's output is in {log_path}; please report "
             f"this to mindguard's maintainers with the run folder {self.run}")
        self.summary.mindguard_error = message
        return Outcome.MINDGUARD_FAILED

    def _stopped(self, this_pass: "_Pass") -> Outcome:
        if this_pass.signal is not None:
            self.summary.signal = signal_name(this_pass.signal)
        return Outcome.INTERRUPTED if this_pass.stopped == "interrupted" else Outcome.TIMED_OUT

    def _print_replays(self, pass_dir: layout.PassFolder) -> bool:
        """Print the replay reports Guard wrote in ``pass_dir`` (one per rank); False when there are none."""
        replays = _dist.rank_paths(pass_dir.replay_report)
        if not replays:
            return False
        texts = [layout.replay_text(path).read_text(encoding="utf-8") for path in replays]
        if self.analyze:
            for text in texts:
                self._tell(text)
        atomic_write_text(self.folder.report_text, "".join(texts))   # the run folder's answer, as for a dump
        self.summary.replay = [read_json(path) for path in replays]
        atomic_write_json(self.folder.report, {"replay": self.summary.replay})
        first = self.summary.replay[0].get("first")
        if first:
            self.summary.origin = first
        return True

    def _tell(self, text: str) -> None:
        """The answer for stdout: printed by :meth:`finish`, once summary.json holds the result."""
        self.__dict__.setdefault("_answer", []).append(text)

    def _ended_early(self, first: _Pass, rc: int, records: List[Dict[str, Any]]) -> Outcome:
        """Pass 1 ended with no failure recorded and a record still ``running``: the process went away without
        Python unwinding (``os._exit``, an exit from native code). Not healthy, not a failure to hunt."""
        step = _ended_early(records)
        where = f"at global step {step}" if step else "before its first step"
        how = f"exit code {rc}" if rc >= 0 else f"signal {-rc} ({_signal_name(-rc)})"
        _say(f"the command ended early {where} ({how}) without its record saying so: it recorded no failure and its "
             f"training did not finish (os._exit, or an exit from native code, skips the end of training).\n"
             f"  Nothing to hunt and no verdict on its numbers: see {first.log_path}")
        self.summary.ended_early_at = step
        self.summary.command_returncode = rc
        return Outcome.ENDED_EARLY

    def _check_pass(self, this_pass: _Pass, name: PassName, rc: int, records: List[Dict[str, Any]]) -> None:
        """Raise :class:`_CannotGoOn` when the pass could not do its work for a reason of its own: the run folder
        was removed or its disk is full, or the training process said it cannot continue (a record it could not
        write, a dump config of the script's own). A stopped pass (interrupted, timed out) is left to the caller."""
        if this_pass.stopped:
            return
        what = "record the failing step" if name == layout.PASS1 else "examine the failing step"
        outcome = Outcome.RECORD_FAILED if name == layout.PASS1 and not any(
            r.status == "failed" for r in map(_read, records)) else Outcome.EXAMINE_FAILED
        cause = self._run_folder_lost()
        if cause is None:
            said = [line[len(CANNOT_CONTINUE):].strip() for line in this_pass.tail().splitlines()
                    if line.startswith(CANNOT_CONTINUE)]
            cause = said[-1] if said else None
        if cause is None:
            error = this_pass.log_error
            full = disk_full(self.run)
            if full is None and error is not None and error.errno in NO_SPACE:
                full = f"its output log: {os_reason(error)}"
            if full is None and name != layout.PASS1:   # the disk may have room again now: what the pass said then
                full = _said_no_space(this_pass.tail())
            if full is not None:
                cause = (f"the run folder's disk is full ({full}): free space there, or give --run-dir a folder on "
                         f"a disk with room (pass 2 dumps the failing step there)")
                cause += _drop_incomplete_dump(self._at(name).dump) if name != layout.PASS1 else ""
        if cause is None:
            return
        self.summary.set_pass(name.folder, PassSummary(rc, records))
        said = (f"{this_pass.name} recorded a failure, but the hunt cannot examine it"
                if name == layout.PASS1 and outcome is Outcome.EXAMINE_FAILED else f"{this_pass.name} could not {what}")
        log = (f"its output is in {this_pass.log_path}" if this_pass.log_error is None else
               f"its output log could not be written ({os_reason(this_pass.log_error)}); its end is above")
        raise _CannotGoOn(outcome, f"{said}: {cause} ({log})")

    def _run_folder_lost(self) -> Optional[str]:
        """Why the run folder is no longer the one the hunt created (removed, or replaced), else ``None``."""
        identity = getattr(self, "_identity", None)
        try:
            info = os.stat(self.run)
        except OSError:
            return f"the run folder {self.run} was removed while the hunt ran"
        if identity is not None and (info.st_dev, info.st_ino) != identity:
            return (f"the run folder {self.run} was removed while the hunt ran (what is there now was recreated by "
                    f"later writes; the hunt does not use it)")
        return None

    def _write_summary(self) -> bool:
        """Write summary.json (the hunt's result, before anything else is said); never raises. A run folder that
        was removed is not recreated."""
        lost = self._run_folder_lost()
        if lost is not None:
            _say(f"{lost}; {layout.SUMMARY} is not written")
            return False
        try:
            atomic_write_json(self.folder.summary, self.summary.to_dict())
        except (OSError, ValueError) as exc:
            _say(f"could not write {self.folder.summary}: {os_reason(exc)}; "
                 f"{io_fix(exc, 'give --run-dir a folder on another disk')}")
            return False
        return True

    def interrupted(self, exc: HuntInterrupted) -> Outcome:
        """A signal arrived outside a pass's wait (between passes, during the analysis): stop any command still
        running, say where the hunt was."""
        during = "during the analysis" if _in_analysis(exc) else "between the passes"
        _say(f"interrupted ({exc.name}) {during}; stopping")
        try:
            stop_running_passes(signal.SIGTERM)
        except HuntInterrupted:
            stop_running_passes(signal.SIGKILL)
        self.summary.signal = exc.name
        return Outcome.INTERRUPTED

    def finish(self, outcome: Outcome) -> int:
        code = outcome.exit_code
        if self.cluster is not None:   # [cluster hook] leave (node 0 keeps the meeting point until all have left);
            self.cluster.close()       # mindguard verify does not span nodes yet: no verify line, a note instead
            if outcome is Outcome.FOUND:
                self._tell(self.cluster.VERIFY_NOTE)
        if outcome is Outcome.FOUND and self.cluster is None:   # the command that checks the fix (mindguard verify)
            record = self.origin[0] if self.origin is not None else self._at(layout.PASS1).record
            if record.is_file():   # (several ranks write one record per rank: each rank verifies from its own)
                trusted = self.origin is not None and not self.summary.from_record.fallback
                line = verify_line(str(record), self.command, from_start=not trusted)
                self.summary.verify_command = line
                self._tell(f"once the script is edited, check the fix without re-training:\n    {line}")
        self.summary.end(outcome, finished=_dt.datetime.now().isoformat(timespec="seconds"))
        written = self._write_summary()
        if written:
            _say(write_run_page(self.run))   # report.html: the answer as a page (analysis/page.py)
        for text in self.__dict__.get("_answer", []):   # the answer after the result is on disk: never instead
            console(text)
        if written:
            _say(f"{outcome.label.replace('_', ' ')}; everything is in {self.run}")
        else:
            _say(f"{outcome.label.replace('_', ' ')} (exit code {code})")
        return code


class _CannotGoOn(Exception):
    """A pass could not do its work for a reason the hunt can name (:meth:`_Hunt._check_pass`)."""

    def __init__(self, outcome: Outcome, message: str):
        super().__init__(message)
        self.outcome, self.message = outcome, message


_NO_SPACE_SAID = re.compile(r"No space left on device|\[Errno 28\]|batch file \S+ is unreadable \(EOFError")


def _said_no_space(tail: str) -> Optional[str]:
    """The last line of a pass's output that says the disk ran full while it ran (a write that failed, a dumped file
    cut short), else ``None``."""
    lines = [line.strip() for line in tail.splitlines() if _NO_SPACE_SAID.search(line)]
    return f"while it ran: {lines[-1][:200]}" if lines else None


def _drop_incomplete_dump(dump: Path) -> str:
    """Remove a dump cut short by a full disk (no analysis can read it), so the summary fits; says so."""
    if not dump.is_dir():
        return ""
    size = tree_size(dump)[0]
    shutil.rmtree(dump, ignore_errors=True)
    return f"; the incomplete dump ({size} bytes) was removed to make room for the summary"


def _ended_early(records: List[Dict[str, Any]]) -> Optional[int]:
    """The global step (0: before the first) of a run whose process ended while its record still says ``running``
    and recorded no failure, else ``None``."""
    typed = [_read(r) for r in records]
    if not typed or any(r.status == "failed" for r in typed):
        return None
    running = [r for r in typed if r.status == "running"]
    if not running:
        return None
    return max(int(r.global_step or 0) for r in running)


def _mindguard_traceback(text: str) -> Optional[str]:
    """The error line of the last Python traceback in ``text`` when its innermost frame is mindguard's own code
    (mindguard refused, or broke) -- not a failure the training's numbers caused (``NonFiniteError``)."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    block = text[start:]
    frames = re.findall(r'^\s*File "([^"]+)", line \d+', block, flags=re.MULTILINE)
    if not frames or not is_mindguard_frame(frames[-1]):
        return None
    errors = [line.strip() for line in block.splitlines()
              if re.match(r"^[\w.]+(Error|Exception|Exit)\b", line.strip())]
    if not errors or "NonFiniteError" in errors[-1]:
        return None
    return errors[-1][:300]


def _why_not_examined(second: _Pass, rc: int, records: List[Dict[str, Any]], step: int) -> Optional[str]:
    """Why an examine pass that did not repeat the failure is no evidence that it does not repeat: it was killed
    (the OOM-killer's SIGKILL, a crash), stopped from outside, broke inside mindguard, or ended without its record
    saying so. ``None`` when it ran and its record says what happened."""
    typed = [_read(r) for r in records]
    reached = max((int(r.global_step or 0) for r in typed), default=0)
    at = f"at global step {reached}" if reached else "before its first step"
    broke = _mindguard_traceback(second.tail())
    if broke is not None:
        return f"broke inside mindguard {at}: {broke}"
    if any(r.status == "failed" for r in typed):
        return None   # it recorded a failure of its own: evidence
    if rc < 0:
        how = "stopped from outside by" if _stopped_from_outside(rc) else "killed by"
        return f"was {how} signal {-rc} ({_signal_name(-rc)}) {at}"
    if not records:
        return f"wrote no record (exit code {rc})"
    if _ended_early(records) is not None:
        return f"ended early {at} (exit code {rc}) without its record saying so"
    return None


def _in_analysis(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("_analyse_dump", "analyze_dump", "_print_replays", "explain"):
            return True
        tb = tb.tb_next
    return False


def _input_origin(inputs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The culprit when no operator made the Inf/NaN: the step's own inputs (the batch first), direction "input"."""
    batch = [i for i in inputs if str(i.get("name", "")).startswith("inputs")]
    first = (batch or inputs)[0]
    if batch:
        hint = ("the step's batch already held Inf/NaN: check the data pipeline (the sample, its decoding and "
                "normalisation) for the batch of this step")
    else:
        hint = (nonfinite_input_hint(str(first.get("name") or ""), str(first.get("source") or "parameter"))
                or "a parameter was already non-finite when the step began: examine the step before it")
    return {"op_type": None, "name": first.get("name"), "direction": "input", "forward_op": None, "source": None,
            "stack": [], "inputs": list(batch or inputs), "outputs": [], "reached": None, "hint": hint}


def _step_window(records: List[Dict[str, Any]], step: Optional[int]) -> Optional[List[int]]:
    """The wall-clock window (epoch µs) of global step ``step`` over every rank's record: ranks run the step at
    nearly, not exactly, the same time."""
    windows = [r.step_window_us for r in map(_read, records) if r.global_step == step and r.step_window_us]
    if not windows:
        return None
    return [min(w[0] for w in windows), max(w[1] for w in windows)]


#: What the examine pass dumps of a compiled step, narrowest first: ``(what, kernels, input_output)``.
#: ``"outputs"``: the outputs of every kernel but the optimizer's (by scope ``optimizer`` and by kernel type) and
#: the convolutions' weight gradients (consumed only by the optimizer, and as large as the weights) and copy kernels
#: (``TensorMove``, ``Assign``: their value is what they copied, read there), and no
#: ``Parameter`` files but those of undotted names (the batch, the learning rate, counters) -- a ``name-regex(...)``
#: kernel entry is matched against kernel scope names (which hold ``/``) and, measured on 2.10 CPU, against
#: Parameter names too. An op's inputs are earlier ops' outputs, or Parameters as the step began (the state the
#: examine pass keeps at the step): the analysis reads them there through the .ir data flow, and does not name an
#: op whose inputs the dump left out. When the culprit was left out (the optimizer's in-place kernels with an
#: infinite learning rate, an overflowing weight gradient), the narrow dump explains nothing and the step is
#: dumped again from the state kept at it, with the outputs of every op (``"all_outputs"``: the optimizer's, the
#: weight gradients and copies too, still no dotted Parameter files), and only if that explains nothing either,
#: ``"full"``. A ResNet-18 step (32x32, batch 8): 767 MB full, 226 MB all outputs, 137 MB narrow (README).
_LEFT_OUT = kernels.alternation(kernels.OPTIMIZER_KERNELS + kernels.WEIGHT_GRADIENT_KERNELS
                                 + tuple(kernels.COPY_KERNELS))   # the catalogues the analysis reads through
#: the folder of the compiled second look at a replayed step (:meth:`_Hunt._compiled_look`)
COMPILED_LOOK = PassName(layout.PASS2.family, "compiled")
#: the compiled look dumps every iteration from its start (a kept state or step 1): only this close to the step
COMPILED_LOOK_STEPS = 50
DUMP_SCOPES = {
    "outputs": ("the outputs of every op but the optimizer's, the weight gradients and copies",
                [f"name-regex(^(?!.*optimizer)"
                 f"(?!.*/({_LEFT_OUT})-op)(?![^/]*[.][^/]*$).*)"], 2),
    "all_outputs": ("the outputs of every op (no trained weights' files)", ["name-regex(^(?![^/]*[.][^/]*$).*)"], 2),
    "full": ("every op's inputs and outputs", [], 0),
}
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)')


def _user_frame(message: str) -> Optional[Dict[str, Any]]:
    """The innermost frame outside MindSpore in a Python traceback embedded in an exception's text."""
    frames = [m for m in _FRAME.finditer(message) if "site-packages" not in m.group(1)
              and "/mindspore/" not in m.group(1)]
    if not frames:
        return None
    last = frames[-1]
    return {"file": last.group(1), "line": int(last.group(2)), "function": last.group(3), "code": last.group(4).strip()}


def _explain_dataset_error(record: Dict[str, Any]) -> str:
    message = _read(record).message or ""
    frame = _user_frame(message)
    cause = [line for line in message.splitlines() if re.match(r"^\w+(Error|Exception): ", line)]
    lines = [f"error: the dataset raised while producing the batch of {FailureRecord.from_dict(record).position()}"]
    if frame:
        lines += [f"  --> {frame['file']}:{frame['line']} (in {frame['function']})", "   |",
                  f"{frame['line']:>3} | {frame['code']}", "   |"]
    if cause:
        lines.append(f"   = {cause[-1]}")
    lines.append("help: the pipeline runs ahead of training, so without mindguard hunt this exception arrives steps "
                 "before the batch that raised; fix the sample (or the source's __getitem__) named above")
    return "\n".join(lines)


def _from_elsewhere(path: Path, record: Dict[str, Any], cwd: str) -> List[str]:
    """What differs between the failing run and the hunt about to run (``cwd``: the hunt's folder): one note per
    edited or missing project file (:func:`mindguard.training.provenance.source_changes`). Another folder whose files
    differ from the failing run's is refused (:class:`HuntError`): the command would run another program."""
    sources = record.get("sources")
    if not isinstance(sources, dict) and isinstance(record.get("states"), str):
        try:
            sources = read_json(layout.run_info(record["states"])).get("sources")
        except (OSError, ValueError, AttributeError):
            sources = None
    ran_in = record.get("cwd")
    changes = _provenance.source_changes(sources, ran_in, cwd) if isinstance(sources, dict) else []
    elsewhere = isinstance(ran_in, str) and os.path.realpath(ran_in) != os.path.realpath(cwd)
    if elsewhere and (changes or not isinstance(sources, dict)):
        what = "; ".join(changes) if changes else "the failing run recorded no file hashes to compare"
        raise HuntError(f"--from {str(path)!r}: the failing run ran in {ran_in}, this hunt runs in {cwd} ({what}), so "
                        f"the command would run another program: run it from {ran_in} (cd {shlex.quote(ran_in)} "
                        f"and paste the line again)")
    notes = [f"the failing run ran in {ran_in}; the project files here are the same"] if elsewhere else []
    notes += [f"{change}: the hunt runs the script as it is now; the kept state is used only if the run computes "
              f"the same from it (checked step by step)" for change in changes]
    data = record.get("data_sources")
    if not isinstance(data, dict) and isinstance(record.get("states"), str):
        try:
            data = read_json(layout.run_info(record["states"])).get("data")
        except (OSError, ValueError, AttributeError):
            data = None
    notes += [f"{change}: the hunt reads the data as it is now, so its answer may not be the failing run's"
              for change in (_provenance.data_changes(data, ran_in or cwd) if isinstance(data, dict) else [])]
    return notes


def _origin_record(path: Path) -> Tuple[Path, Dict[str, Any]]:
    """The failing run's record ``--from`` names, validated (:class:`HuntError` naming the file and the fix)."""
    path = path.expanduser().absolute()
    try:
        FailureRecord.load(path)
        data = read_record_data(path)
    except RecordError as exc:
        raise HuntError(f"--from {str(path)!r}: {exc}; give the record a Guard wrote (the path it printed at the "
                        f"failure, mindguard_failure.json by default)") from None
    except (OSError, ValueError) as exc:
        raise HuntError(f"--from {str(path)!r}: cannot read it ({exc}); give the record a Guard wrote (the path it "
                        f"printed at the failure, mindguard_failure.json by default)") from None
    return path, data


def hunt(command: Sequence[str], *, run_dir: Optional[os.PathLike] = None, timeout: Optional[float] = None,
         net_name: str = "Net", analyze: bool = True, resume: str = "auto", keep_every: Optional[int] = None,
         dump_scope: Optional[str] = None, from_record: Optional[os.PathLike] = None,
         join_timeout: Optional[float] = None, cluster_port: Optional[int] = None) -> int:
    """Run ``command`` record -> examine -> explain and print the culprit. Returns the exit code for the CLI
    (:class:`Outcome`): 0 no failure; 1 a failure was found and explained; 2 the hunt could not run (bad arguments,
    no Guard, failed before training, timed out, mindguard's own error); 3 found but not explained (did not repeat,
    or the dump explains nothing); 4 the command failed without a training failure (its own error, a kill from
    outside: its exit code is the summary's ``command_returncode``); 130 interrupted.

    ``resume``: ``"auto"`` -- pass 1 keeps the training state from time to time (every ``keep_every`` steps, or
    by time at <= 0.5 % of its cost) and pass 2 starts from the state kept before the failure when that is quicker
    than re-running from step 1; ``"always"`` whenever a state was kept; ``"never"`` keeps nothing.

    ``dump_scope``: what pass 2 dumps first (a key of :data:`DUMP_SCOPES`); ``None`` -- ``"outputs"`` (narrow), or
    ``"full"`` with ``resume="never"`` or for a step that raised. A dump that explains nothing is widened.

    ``from_record``: the record of a run that failed with an always-on Guard (the path Guard printed): start from
    it and the training state it kept -- no pass re-trains from step 1 (:mod:`mindguard.hunt.plan`); when the state
    cannot be used, the hunt says why and runs the two passes.

    ``join_timeout`` / ``cluster_port``: a multi-node msrun command (one launcher per node, ``--node_rank``):
    how long, in seconds, this node's hunt waits for the other nodes' hunts at each meeting, and the port on the
    master address where they meet (:mod:`mindguard.hunt.cluster`).
    """
    command = list(command)
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise HuntError(f"the working directory {os.environ.get('PWD') or ''} no longer exists (removed while the "
                        f"shell was in it); cd to an existing folder and run the hunt again") from None
    origin = None
    origin_problem: Optional[Tuple[str, str]] = None
    notes: List[str] = []
    if from_record is not None:
        if resume == "never":
            raise HuntError("--from starts from the training state the failing run kept; drop --resume never (or "
                            "drop --from to hunt from step 1)")
        try:
            origin = _origin_record(Path(from_record))
        except HuntError as exc:   # missing, truncated, damaged: the plain hunt needs no record
            origin_problem = (str(Path(from_record).expanduser().absolute()), str(exc).split("; give the record")[0])
        damaged = progress_problem(origin[0]) if origin is not None else None
        if damaged is not None:   # a killed run's step is unknown: the plain hunt runs the whole training
            origin, origin_problem = None, (str(Path(from_record).expanduser().absolute()), damaged)
        if origin is not None:
            notes = _from_elsewhere(origin[0], origin[1], cwd)
    if resume not in ("auto", "always", "never"):
        raise HuntError(f"--resume {resume!r}: choose auto, always or never")
    if dump_scope is not None and dump_scope not in DUMP_SCOPES:
        raise HuntError(f"--dump-scope {dump_scope!r}: choose one of {', '.join(DUMP_SCOPES)}")
    if keep_every is not None and (isinstance(keep_every, bool) or not isinstance(keep_every, int) or keep_every < 1):
        raise HuntError(f"--keep-every {keep_every!r}: must be a number of steps >= 1, e.g. 200")
    if not command:
        raise HuntError("nothing to run: give the training command after `--`, e.g. "
                        "`mindguard hunt -- python train.py --epochs 3`")
    if join_timeout is not None and not (isinstance(join_timeout, (int, float)) and not isinstance(join_timeout, bool)
                                         and math.isfinite(join_timeout) and join_timeout > 0):
        raise HuntError(f"--join-timeout {join_timeout!r}: must be a positive, finite number of seconds, e.g. 120")
    try:
        cluster = cluster_for(command, join_timeout, cluster_port)   # several msrun nodes: their hunts meet
    except MindguardError as exc:
        raise HuntError(str(exc)) from None
    if timeout is not None and not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool)
                                    and math.isfinite(timeout) and timeout > 0):
        raise HuntError(f"--timeout {timeout!r}: must be a positive, finite number of seconds per pass, e.g. 600")
    program = command[0]
    found = program if os.sep in program else shutil.which(program)
    if not program or found is None or not os.path.lexists(found):
        raise HuntError(f"cannot run {program!r}: no such file or command; is it installed and on PATH? e.g. "
                        f"`mindguard hunt -- {sys.executable} train.py`")
    if not os.path.isfile(found) or not os.access(found, os.X_OK):
        kind = ("a directory" if os.path.isdir(found) else "not a regular file" if not os.path.isfile(found)
                else "not executable")
        raise HuntError(f"cannot run {program!r}: it is {kind}; run a script through its interpreter: "
                        f"`mindguard hunt -- python {program}`")
    if run_dir:
        try:
            is_file = os.path.lexists(run_dir) and not os.path.isdir(run_dir)
        except (OSError, ValueError):
            is_file = False   # a name too long: the dump path check below says so
        if is_file:
            raise HuntError(f"--run-dir {str(run_dir)!r} is a file; give a new folder (hunt never overwrites a run)")
        _refuse_undumpable(Path(run_dir).resolve())
    try:   # net_name and the dump path pass 2 will use, checked before anything is created
        pass2 = RunFolder(Path(run_dir or "mindguard_runs").resolve()).pass_folder(layout.PASS2)
        DumpConfig(pass2.dump, net_name, 0, device_target="CPU")
    except DumpConfigError as exc:
        if exc.field != "path" or run_dir:
            option = "--net-name" if exc.field == "net_name" else "--run-dir" if exc.field == "path" else exc.field
            raise HuntError(f"{option}: {exc}") from None
    supervisor = Supervisor().install()   # every signal the hunt handles, in every phase, stops it cleanly
    try:
        run = _create_run_folder(run_dir, command, cwd)
        _say(f"run folder: {run}")
        this = _Hunt(command, run, timeout, net_name, analyze, resume=resume, keep_every=keep_every,
                     dump_scope=dump_scope, origin=origin, origin_problem=origin_problem, notes=notes)
        info = os.stat(run)
        this._identity = (info.st_dev, info.st_ino)
        this.cluster = cluster
        return _run_to_the_end(this, supervisor)
    finally:
        supervisor.restore()


def _create_run_folder(run_dir: Optional[os.PathLike], command: List[str], cwd: str) -> Path:
    """The run folder, created empty, with command.json; a folder this call created is removed again when the
    hunt is refused before it starts (a refused run leaves nothing behind)."""
    run = Path(run_dir).resolve() if run_dir else new_run_dir()
    created = run_dir is None or not os.path.lexists(run)
    try:
        _refuse_undumpable(run)
        try:
            if run.exists() and not run.is_dir():
                raise HuntError(f"--run-dir {str(run)!r} is a file; give a new folder (hunt never overwrites a run)")
            run.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise HuntError(f"cannot create the run folder {str(run)!r}: {exc.strerror or exc}") from None
        if any(run.iterdir()):
            created = False
            raise HuntError(f"run folder {run} is not empty; give a new --run-dir (hunt never overwrites a run)")
        try:
            atomic_write_json(RunFolder(run).command, {"command": command, "cwd": cwd,
                                                     "started": _dt.datetime.now().isoformat(timespec="seconds")})
        except OSError as exc:
            raise HuntError(f"cannot write {RunFolder(run).command}: {os_reason(exc)}; "
                            f"{io_fix(exc, 'give --run-dir a folder on another disk')}") from None
    except BaseException:
        if created:
            with contextlib.suppress(OSError):
                for leftover in run.glob(f".{layout.COMMAND}.*.tmp"):
                    leftover.unlink()
                run.rmdir()
        raise
    return run


def _run_to_the_end(this: _Hunt, supervisor: Supervisor) -> int:
    """Run the hunt; whatever ends it -- an answer, a signal, a pass that could not work, an error -- its summary
    is written before anything else is said, and the exit code is the outcome's."""
    error: Optional[BaseException] = None
    try:
        outcome = this.hunt()
    except HuntInterrupted as exc:
        with supervisor.deferred():
            outcome = this.interrupted(exc)
    except _CannotGoOn as exc:
        with supervisor.deferred():
            _say(exc.message)
        this.summary.error = exc.message
        outcome = exc.outcome
    except Exception as exc:  # noqa: BLE001 - a HuntError, an OSError, a bug: the summary says so, then it goes on
        try:
            stop_running_passes()
        except HuntInterrupted:
            stop_running_passes(signal.SIGKILL)
        this.summary.error = f"{type(exc).__name__}: {exc}"
        outcome, error = Outcome.ERROR, exc
    with supervisor.deferred():   # the result is written whole, whatever arrives now
        code = this.finish(outcome)
    if error is not None:
        raise error
    return code
