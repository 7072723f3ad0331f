"""``mindguard hunt -- <command>`` from the outside: the arguments checked, the run folder created, the hunt run
to its end whatever ends it (:func:`hunt`), its summary written before anything else is said.

The route through the passes is :class:`~mindguard.hunt.executor.Executor`'s. The wrapper process never imports
MindSpore. Every artefact stays in one run folder; the exit code is the :class:`Outcome`'s.
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Tuple

from ..protocol import provenance as _provenance
from .._util.io import atomic_write_json, io_fix, os_reason, read_json
from ..report.pagedata import write_run_page
from ..dump.config import DumpConfig
from ..errors import DumpConfigError, HuntError, MindguardError, RecordError
from ..protocol import folder as layout
from ..protocol.folder import RunFolder
from ..protocol.summary import Outcome
from ..protocol.record import FailureRecord, progress_problem, read_record_data
from . import messages as say_
from .cluster import cluster_for
from .console import console, say
from .context import CannotGoOn, HuntContext, Options
from .executor import Executor
from .scopes import DUMP_SCOPES
from .verify_plan import verify_line

if TYPE_CHECKING:   # the process tree's module (psutil) is imported when a hunt runs, not with the package
    from .passes import HuntInterrupted, Supervisor


def dump_path_problem(path: "os.PathLike[str]") -> Optional[str]:
    """Why MindSpore's dump would refuse ``path`` (a character outside ``[A-Za-z0-9_/-]``), or ``None``."""
    bad = sorted(set(re.sub(r"[A-Za-z0-9_/-]", "", str(path))))
    return None if not bad else f"{str(path)!r} contains {''.join(bad)!r}"


def _refuse_undumpable(run: Path) -> None:
    problem = dump_path_problem(run)
    if problem:
        raise HuntError(f"run folder {problem}: MindSpore's dump accepts only letters, digits, '_', '-' and '/' "
                        f"in its path, and pass 2 dumps into the run folder. Give --run-dir a path without them, "
                        f"e.g. {re.sub(r'[^A-Za-z0-9_/-]', '_', str(run))}")


def new_run_dir(parent: Optional["os.PathLike[str]"] = None) -> Path:
    """A fresh, uniquely named run folder (never reuses an existing one).

    Default parent: ``./mindguard_runs``; when the working directory's path has a character MindSpore's
    dump refuses (``~/src/mindguard-0.1.0``), or it cannot be written (code on a read-only mount: the line Guard
    printed runs there too, issue 50), ``<temp dir>/mindguard_runs`` instead, and it says so.
    """
    if parent is None:
        parent = Path("mindguard_runs").resolve()
        fallback = Path(tempfile.gettempdir()).resolve() / "mindguard_runs"
        if dump_path_problem(parent):
            say(say_.default_folder_moved(str(dump_path_problem(parent)), fallback))
            parent = fallback
        elif not os.access(parent if parent.is_dir() else parent.parent, os.W_OK | os.X_OK):
            say(say_.default_folder_unwritable(parent, fallback))
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


def _from_elsewhere(path: Path, record: Dict[str, Any], cwd: str) -> List[str]:
    """What differs between the failing run and the hunt about to run (``cwd``: the hunt's folder): one note per
    edited or missing project file (:func:`mindguard.protocol.provenance.source_changes`). Another folder whose files
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
                        f"the command would run another program: run it from {ran_in} (cd {shlex.quote(str(ran_in))} "
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




class HuntSession:
    """One hunt as the face runs it: its context and route (:class:`~mindguard.hunt.executor.Executor`); it ends
    by writing the summary, then printing the answer (:meth:`finish`)."""

    def __init__(self, ctx: HuntContext, executor: Optional[Executor] = None):
        self.ctx = ctx
        self.executor = executor if executor is not None else Executor(ctx)

    @property
    def summary(self) -> Any:
        return self.ctx.summary

    @property
    def run(self) -> Path:
        return self.ctx.run

    def hunt(self) -> Outcome:
        outcome = self.executor.hunt()
        if outcome is Outcome.FOUND and self.ctx.options.check_fix and self.ctx.options.analyze:
            from .fix_check import check_fix   # the hint's edit run on a scratch copy (issue 52); never changes
            check_fix(self.ctx)                # the outcome
        return outcome

    def interrupted(self, exc: "HuntInterrupted") -> Outcome:
        """A signal arrived outside a pass's wait (between passes, during the analysis): stop any command still
        running, say where the hunt was."""
        from .passes import HuntInterrupted, stop_running_passes

        during = "during the analysis" if _in_analysis(exc) else "between the passes"
        say(say_.interrupted(exc.name, during))
        try:
            stop_running_passes(signal.SIGTERM)
        except HuntInterrupted:
            stop_running_passes(signal.SIGKILL)
        self.ctx.summary.signal = exc.name
        return Outcome.INTERRUPTED

    def write_summary(self) -> bool:
        """Write summary.json (the hunt's result, before anything else is said); never raises. A run folder that
        was removed is not recreated."""
        ctx = self.ctx
        lost = ctx.run_folder_lost()
        if lost is not None:
            say(say_.summary_not_written(lost, layout.SUMMARY))
            return False
        try:
            atomic_write_json(ctx.folder.summary, ctx.summary.to_dict())
        except (OSError, ValueError) as exc:
            say(say_.summary_unwritable(ctx.folder.summary, os_reason(exc),
                                        io_fix(exc, "give --run-dir a folder on another disk")))
            return False
        return True

    def finish(self, outcome: Outcome) -> int:
        ctx = self.ctx
        code = outcome.exit_code
        if ctx.cluster is not None:   # leave (node 0 keeps the meeting point until all have left); mindguard verify
            ctx.cluster.close()       # does not span nodes yet: no verify line, a note instead
            if outcome is Outcome.FOUND:
                ctx.answer.append(ctx.cluster.VERIFY_NOTE)
        if outcome in (Outcome.FOUND, Outcome.UNEXPLAINED):   # where the divergence began (issue 52)
            ctx.answer.extend(say_.divergence_lines(_divergence_of(ctx)))
        if outcome is Outcome.FOUND and ctx.cluster is None:   # the command that checks the fix (mindguard verify)
            record = ctx.origin[0] if ctx.origin is not None else ctx.at(layout.PASS1).record
            if record.is_file():   # (several ranks write one record per rank: each rank verifies from its own)
                from_record = ctx.summary.from_record
                trusted = ctx.origin is not None and not getattr(from_record, "fallback", None)
                line = verify_line(str(record), ctx.command, from_start=not trusted)
                ctx.summary.verify_command = line
                ctx.answer.append(say_.verify_next(line))
        ctx.summary.end(outcome, finished=_dt.datetime.now().isoformat(timespec="seconds"))
        written = self.write_summary()
        if written:
            say(write_run_page(ctx.run))   # report.html: the answer as a page
        for text in ctx.answer:   # the answer after the result is on disk: never instead
            console(text)
        say(say_.outcome_line(outcome.label, ctx.run, written, code))
        return code if code is not None else 2


def _divergence_of(ctx: HuntContext) -> Optional[Dict[str, Any]]:
    """The divergence the failing run's record shows (``--from``: its record; else pass 1's), set in the summary;
    ``None`` when the record holds no losses (:mod:`mindguard.protocol.divergence`)."""
    from ..protocol.divergence import divergence

    record: Optional[Dict[str, Any]] = ctx.origin[1] if ctx.origin is not None else None
    if record is None:
        try:
            data = read_json(ctx.at(layout.PASS1).record)
        except (OSError, ValueError):
            return None
        record = data if isinstance(data, dict) else None
    found = divergence(record) if record is not None else None
    if found is not None:
        ctx.summary.divergence = found
    return found


def _in_analysis(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_name in ("_analyse", "analyze_dump", "print_replays", "explain"):
            return True
        tb = tb.tb_next
    return False


def hunt(command: Sequence[str], *, run_dir: Optional["os.PathLike[str]"] = None, timeout: Optional[float] = None,
         net_name: str = "Net", analyze: bool = True, resume: str = "auto", keep_every: Optional[int] = None,
         dump_scope: Optional[str] = None, from_record: Optional["os.PathLike[str]"] = None,
         join_timeout: Optional[float] = None, cluster_port: Optional[int] = None, check_fix: bool = True) -> int:
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

    ``check_fix``: once the failure is explained, run the first hint's mechanical edit on a scratch copy of the
    project, as ``mindguard verify`` would, and say under the hint whether it trains finite
    (:mod:`mindguard.hunt.fix_check`); never changes the exit code. ``False``: ``--no-check-fix``.
    """
    command = list(command)
    try:
        cwd = os.getcwd()
    except FileNotFoundError:
        raise HuntError(f"the working directory {os.environ.get('PWD') or ''} no longer exists (removed while the "
                        f"shell was in it); cd to an existing folder and run the hunt again") from None
    origin, origin_problem, notes = _origin(from_record, resume, cwd)
    _check_options(command, resume, dump_scope, keep_every, join_timeout)
    try:
        cluster = cluster_for(command, join_timeout, cluster_port)   # several msrun nodes: their hunts meet
    except MindguardError as exc:
        raise HuntError(str(exc)) from None
    _check_program(command, timeout)
    _check_run_dir(run_dir, net_name)
    from .passes import Supervisor
    from .runner import ProcessRunner

    supervisor = Supervisor().install()   # every signal the hunt handles, in every phase, stops it cleanly
    try:
        run = _create_run_folder(run_dir, command, cwd)
        say(say_.run_folder(run))
        ctx = HuntContext(command, run, ProcessRunner(command, run, timeout),
                          Options(net_name=net_name, analyze=analyze, resume=resume, keep_every=keep_every,
                                  first_scope=dump_scope, check_fix=check_fix), origin=origin)
        info = os.stat(run)
        ctx.identity = (info.st_dev, info.st_ino)
        ctx.cluster = cluster
        this = HuntSession(ctx, Executor(ctx, origin_problem=origin_problem, notes=tuple(notes)))
        return _run_to_the_end(this, supervisor)
    finally:
        supervisor.restore()


def _origin(from_record: Optional["os.PathLike[str]"], resume: str, cwd: str
            ) -> Tuple[Optional[Tuple[Path, Dict[str, Any]]], Optional[Tuple[str, str]], List[str]]:
    """``--from``: the record to start from (``(path, record)``), or why it cannot be used (``(path, why)``: the
    plain hunt runs, saying so), and the notes on what differs from the failing run (another folder, edited files)."""
    origin: Optional[Tuple[Path, Dict[str, Any]]] = None
    origin_problem: Optional[Tuple[str, str]] = None
    notes: List[str] = []
    if from_record is None:
        return origin, origin_problem, notes
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
    return origin, origin_problem, notes


def _check_options(command: List[str], resume: str, dump_scope: Optional[str], keep_every: Optional[int],
                   join_timeout: Optional[float]) -> None:
    """:class:`HuntError` naming the first option that cannot be used (``join_timeout``: seconds)."""
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


def _check_program(command: List[str], timeout: Optional[float]) -> None:
    """:class:`HuntError` when ``timeout`` (seconds per pass) is no positive finite number, or the command's program
    cannot be run."""
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


def _check_run_dir(run_dir: Optional["os.PathLike[str]"], net_name: str) -> None:
    """:class:`HuntError` when the run folder or the network's name cannot hold the dump pass 2 will make: checked
    before anything is created."""
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


def _create_run_folder(run_dir: Optional["os.PathLike[str]"], command: List[str], cwd: str) -> Path:
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


def _run_to_the_end(this: HuntSession, supervisor: "Supervisor") -> int:
    """Run the hunt; whatever ends it -- an answer, a signal, a pass that could not work, an error -- its summary
    is written before anything else is said, and the exit code is the outcome's."""
    from .passes import HuntInterrupted, stop_running_passes

    error: Optional[BaseException] = None
    try:
        outcome = this.hunt()
    except HuntInterrupted as exc:
        with supervisor.deferred():
            outcome = this.interrupted(exc)
    except CannotGoOn as exc:
        with supervisor.deferred():
            say(exc.message)
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
