"""``mindguard hunt -- <command>``: from "it failed somewhere" to the culprit, in one command.

Pass 1 runs the command with :class:`mindguard.Guard` recording; if it fails, pass 2 runs it again with
the dump armed for exactly the failing iteration, checks the failure repeated there, analyses the
dump and prints the culprit. Every artefact stays in one run folder. The wrapper process never
imports MindSpore: it only starts the command, reads the records and the dump.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import psutil

from . import _dist
from ._hunt_env import (ENV_CAPTURE_DIR, ENV_DUMP_ITERATION, ENV_DUMP_PATH, ENV_NET_NAME, ENV_PASS, ENV_RECORD,
                        ENV_REPLAY_REPORT)
from ._io import atomic_write_json, atomic_write_text, read_json
from .locate import FailureRecord



class HuntError(RuntimeError):
    """The hunt cannot go on (bad arguments, or the command does not give it what it needs)."""


def _say(message: str) -> None:
    print(f"[mindguard hunt] {message}", file=sys.stderr, flush=True)




def dump_path_problem(path: os.PathLike) -> Optional[str]:
    """Why MindSpore's dump would refuse ``path`` (a character outside ``[A-Za-z0-9_/-]``), or ``None``."""
    bad = sorted(set(re.sub(r"[A-Za-z0-9_/-]", "", str(path))))
    return None if not bad else f"{str(path)!r} contains {''.join(bad)!r}"


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
    parent.mkdir(parents=True, exist_ok=True)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        candidate = parent / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            candidate.mkdir()
            return candidate
        except FileExistsError:
            continue
    raise HuntError(f"could not create a new run folder under {parent}")


class _Pass:
    """Run the user's command once, pass its output through (and into a log), show progress."""

    def __init__(self, name: str, command: Sequence[str], env: Dict[str, str], log_path: Path,
                 record_path: Path, timeout: Optional[float]):
        self.name, self.command, self.env = name, list(command), env
        self.log_path, self.record_path, self.timeout = log_path, record_path, timeout
        self.returncode: Optional[int] = None
        self.interrupted = False   # Ctrl-C, or `kill <hunt>`: the user stopped it
        self.timed_out = False     # --timeout

    @property
    def stopped(self) -> Optional[str]:
        """``"interrupted"`` or ``"timed_out"`` when the pass was stopped rather than ended by itself."""
        return "interrupted" if self.interrupted else "timed_out" if self.timed_out else None

    def run(self) -> int:
        start = time.monotonic()
        with open(self.log_path, "wb") as log:
            proc = subprocess.Popen(self.command, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            copiers = [threading.Thread(target=_copy, args=(proc.stdout, sys.stdout, log), daemon=True),
                       threading.Thread(target=_copy, args=(proc.stderr, sys.stderr, log), daemon=True)]
            for t in copiers:
                t.start()
            previous_term = signal.getsignal(signal.SIGTERM)

            def forward_term(signum, frame):  # `kill <hunt>` stops the child too
                self.interrupted = True
                proc.send_signal(signal.SIGTERM)

            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, forward_term)
            last_shown = ""
            last_time = 0.0
            try:
                while True:
                    try:
                        self.returncode = proc.wait(timeout=1.0)
                        break
                    except subprocess.TimeoutExpired:
                        pass
                    elapsed = time.monotonic() - start
                    if self.timeout and elapsed > self.timeout:
                        _say(f"{self.name}: timed out after {self.timeout:.0f}s; stopping the command")
                        self.timed_out = True
                        _stop(proc)
                        self.returncode = proc.returncode
                        break
                    status = _progress(self.record_path)
                    if status and (status != last_shown and time.monotonic() - last_time > 2.0
                                   or time.monotonic() - last_time > 15.0):
                        _say(f"{self.name}: {status} ({elapsed:.0f}s)")
                        last_shown, last_time = status, time.monotonic()
            except KeyboardInterrupt:
                self.interrupted = True
                _say(f"{self.name}: interrupted; stopping the command")
                _stop(proc, first=signal.SIGINT)
                self.returncode = proc.returncode
            finally:
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, previous_term)
                for t in copiers:
                    t.join(timeout=5)
                for pipe in (proc.stdout, proc.stderr):
                    pipe.close()
        return self.returncode if self.returncode is not None else -1


def _copy(src, dst, log) -> None:
    out = getattr(dst, "buffer", dst)
    try:
        for chunk in iter(lambda: src.read1(65536), b""):
            for sink in (log, out):
                try:
                    sink.write(chunk)
                    sink.flush()
                except (OSError, ValueError):  # closed log (a grandchild outlived the pass) or terminal
                    pass
    except (OSError, ValueError):  # the pipe was closed under us
        pass

def _stop(proc: subprocess.Popen, first: int = signal.SIGTERM) -> None:
    """Stop the command (``first``, then SIGTERM, then SIGKILL) and every process it started.

    msrun starts its scheduler and workers in sessions of their own and leaves them running when it is
    terminated, so the process tree is noted first and what is left of it is stopped afterwards (psutil
    checks each process's creation time, so a reused pid is never signalled).
    """
    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    for sig, wait in ((first, 10), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if proc.poll() is not None:
            break
        try:
            proc.send_signal(sig)
            proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            continue
        except ProcessLookupError:
            break
    alive = [p for p in tree if p.is_running()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for child in alive:
            try:
                child.send_signal(sig)
            except psutil.Error:
                pass
        _, alive = psutil.wait_procs(alive, timeout=5)
        if not alive:
            break


def _progress(record_path: Path) -> Optional[str]:
    records = _read_records(record_path)
    if not records:
        return None
    latest = max(records, key=lambda rec: rec.get("global_step") or 0)
    if not latest.get("global_step"):
        return "starting"
    try:
        return _as_record(latest).position()
    except ValueError:  # a record of another mindguard version: progress is only informative
        return None


def _as_record(data: Dict[str, Any]) -> FailureRecord:
    return FailureRecord.from_dict(data, source="failure record")


def _read_records(record_path: Path) -> List[Dict[str, Any]]:
    out = []
    for path in _dist.rank_paths(record_path):
        try:
            out.append(read_json(path))
        except (OSError, ValueError):
            continue
    return out


def _first_failure(records: List[Dict[str, Any]], returncode: int) -> Optional[Dict[str, Any]]:
    """The failure of this pass: a "failed" record, else a "running" one if the process died mid-step.

    A record of kind ``interrupted`` (the user stopped the training) is not a failure to hunt.
    """
    failed = [r for r in records if r.get("status") == "failed" and r.get("kind") != "interrupted"]
    if not failed and returncode != 0:
        died = (f"the process was killed by signal {-returncode} ({_signal_name(-returncode)}) during this step"
                if returncode < 0 else f"the process exited with code {returncode} during this step")
        failed = [dict(r, kind="exception", message=died)
                  for r in records if r.get("status") == "running" and r.get("global_step")]
    if not failed:
        return None
    # the rank that went bad first; on a tie, the one that saw the cause (not merely stopped for it)
    return min(failed, key=lambda r: (r.get("global_step") or 0, bool(r.get("stopped_by_rank") is not None),
                                      r.get("rank") or 0))


def _signal_name(number: int) -> str:
    try:
        name = signal.Signals(number).name
    except ValueError:
        return "unknown signal"
    return f"{name}: often the OOM-killer" if number == signal.SIGKILL else name


def hunt(command: Sequence[str], *, run_dir: Optional[os.PathLike] = None, timeout: Optional[float] = None,
         net_name: str = "Net", analyze: bool = True) -> int:
    """Run ``command`` in two passes and print the culprit. Returns the exit code for the CLI.

    Exit codes: 0 no failure (or the command's own non-zero code when it failed without a training
    failure); 1 a failure was found and explained; 2 the hunt could not run (bad arguments, the command
    never started Guard, failed before training, or timed out); 3 a failure was found but not explained
    (it did not repeat in pass 2, or the dump could not be analysed); 130 interrupted.
    """
    command = list(command)
    if not command:
        raise HuntError("nothing to run: give the training command after `--`, e.g. "
                        "`mindguard hunt -- python train.py --epochs 3`")
    if timeout is not None and not timeout > 0:
        raise HuntError(f"--timeout {timeout}: must be a positive number of seconds per pass")
    run = Path(run_dir).resolve() if run_dir else new_run_dir()
    problem = dump_path_problem(run)
    if problem:
        raise HuntError(f"run folder {problem}: MindSpore's dump accepts only letters, digits, '_', '-' and '/' "
                        f"in its path, and pass 2 dumps into the run folder. Give --run-dir a path without them, "
                        f"e.g. {re.sub(r'[^A-Za-z0-9_/-]', '_', str(run))}")
    run.mkdir(parents=True, exist_ok=True)
    if any(run.iterdir()):
        raise HuntError(f"run folder {run} is not empty; give a new --run-dir (hunt never overwrites a run)")
    atomic_write_json(run / "command.json", {"command": command, "cwd": os.getcwd(),
                                             "started": _dt.datetime.now().isoformat(timespec="seconds")})
    _say(f"run folder: {run}")
    summary: Dict[str, Any] = {"schema": 1, "command": command, "run_dir": str(run)}

    # pass 1 ------------------------------------------------------------------------------------
    p1 = run / "pass1"
    _say(f"pass 1 (record): {shlex.join(command)}")
    first, rc1, records1 = _run_pass("pass 1", p1, command, {ENV_PASS: "record", ENV_NET_NAME: net_name}, timeout)
    if first.stopped:
        return _finish(run, summary, first.stopped, _STOPPED_EXIT_CODES[first.stopped])
    summary["pass1"] = {"returncode": rc1, "records": records1}
    if not records1:
        _say("no failure record was written: the command never started a training with mindguard.Guard.\n"
             "  hunt needs the script to pass a Guard to model.train, e.g.\n"
             "      model.train(epochs, data, callbacks=[mindguard.Guard(), ...])\n"
             f"  (the command exited with code {rc1}; its output is in {first.log_path})")
        return _finish(run, summary, "no_guard", 2)
    failure = _first_failure(records1, rc1)
    if failure is None:
        if rc1 != 0:
            _say(f"the command exited with code {rc1} but training reported no failure "
                 f"(see {first.log_path}); nothing to hunt")
            return _finish(run, summary, "command_failed", rc1)
        _say("pass 1 finished with no failure: all losses and parameters stayed finite")
        return _finish(run, summary, "healthy", 0)
    if not failure.get("global_step"):
        _say(f"the command failed before the first training step ({failure.get('message') or 'no message'}); "
             f"fix that first (see {first.log_path})")
        return _finish(run, summary, "failed_before_training", 2)
    iteration = int(failure["dump_iteration"])
    _say(f"pass 1 failed: {_describe(failure)}")
    if failure.get("seed") is None:
        _say("note: the script did not call mindguard.fix_randomness(seed); if pass 2 fails elsewhere, "
             "that is the first thing to fix")
    if _print_replays(p1, summary, analyze):
        _say("a GuardedTrainStep refused the update, so the step was captured and replayed in the same run: "
             "no second pass needed")
        return _finish(run, summary, "failure_found", 1)

    # pass 2 ------------------------------------------------------------------------------------
    p2 = run / "pass2"
    dump_path = p2 / "dump"
    _say(f"pass 2 (examine iteration {iteration}: dump it in GRAPH mode, replay it in PyNative): "
         f"{shlex.join(command)}")
    second, rc2, records2 = _run_pass("pass 2", p2, command, {
        ENV_PASS: "dump", ENV_NET_NAME: net_name, ENV_DUMP_ITERATION: str(iteration), ENV_DUMP_PATH: str(dump_path)},
        timeout)
    if second.stopped:
        return _finish(run, summary, second.stopped, _STOPPED_EXIT_CODES[second.stopped])
    failure2 = _first_failure(records2, rc2)
    summary["pass2"] = {"returncode": rc2, "records": records2}
    if failure2 is not None and not failure2.get("global_step"):
        _say(f"pass 2 failed before its first step, so it could not examine iteration {iteration}: "
             f"{failure2.get('message') or 'no message'} (see {second.log_path})")
        return _finish(run, summary, "pass2_failed", 2)
    if failure2 is None or failure2.get("dump_iteration") != iteration or failure2.get("kind") != failure.get("kind"):
        where = ("did not fail" if failure2 is None else
                 f"failed at dump iteration {failure2.get('dump_iteration')} ({failure2.get('kind')}: "
                 f"{failure2.get('message') or 'no message'})")
        _say(f"NOT REPRODUCIBLE: pass 1 failed at dump iteration {iteration} ({failure.get('kind')}), pass 2 {where}.\n"
             "  A dump of a run that fails somewhere else explains nothing. Make the run repeat first:\n"
             "    - call mindguard.fix_randomness(seed) at the top of the script, before building the network;\n"
             "    - do not shuffle the dataset (shuffle=False) while hunting, or fix its seed;\n"
             "    - remove dropout (mindguard.Guard(disable_dropout=True)) or use fix_randomness(cpu_single_thread=True);\n"
             "    - load fixed initial weights (mindguard.Guard(init_params_dir='init_params')).")
        return _finish(run, summary, "not_reproducible", 3)
    _say(f"pass 2 repeated the failure at dump iteration {iteration}")

    # analysis ----------------------------------------------------------------------------------
    if not analyze:
        return _finish(run, summary, "failure_found", 1)
    if _print_replays(p2, summary, analyze):  # PyNative: Guard replayed the step in the training process
        return _finish(run, summary, "failure_found", 1)
    from .analysis import analyze_dump

    try:
        report = analyze_dump(dump_path, iteration=iteration)
    except Exception as exc:  # noqa: BLE001 - the dump is kept; tell the user where and why
        _say(f"the dump in {dump_path} could not be analysed: {type(exc).__name__}: {exc}")
        return _finish(run, summary, "analysis_failed", 3)
    found = report.to_dict()
    atomic_write_json(run / "report.json", found)
    text = str(report)
    atomic_write_text(run / "report.txt", text + "\n")
    print(text, flush=True)
    summary["origin"] = found.get("origin")
    summary["stopped_at"] = found.get("stopped_at")
    if report.ranks:  # distributed: which rank brought the Inf/NaN in, which only received it
        summary["origin_rank"] = report.origin_rank
        summary["rank_roles"] = found.get("rank_roles")
    if not (found.get("origin") or found.get("stopped_at") or found.get("nonfinite_inputs")):
        _say(f"the dump of iteration {iteration} shows no Inf/NaN and no operator where the step stopped, so it "
             f"does not explain this failure ({failure.get('kind')}: {failure.get('message') or 'no message'}).\n"
             f"  The training's own output is in {second.log_path}.")
        return _finish(run, summary, "unexplained", 3)
    return _finish(run, summary, "failure_found", 1)


_STOPPED_EXIT_CODES = {"interrupted": 130, "timed_out": 2}


def _run_pass(label: str, pass_dir: Path, command: Sequence[str], env: Dict[str, str],
              timeout: Optional[float]) -> Tuple[_Pass, int, List[Dict[str, Any]]]:
    """Run one pass with its files in ``pass_dir``; returns the pass, its exit code and the records written."""
    pass_dir.mkdir()
    record = pass_dir / "failure.json"
    child_env = _child_env({ENV_RECORD: str(record), ENV_CAPTURE_DIR: str(pass_dir / "capture"),
                            ENV_REPLAY_REPORT: str(pass_dir / "replay.json"), **env})
    this_pass = _Pass(label, command, child_env, pass_dir / "output.log", record, timeout)
    returncode = this_pass.run()
    return this_pass, returncode, _read_records(record)


def _print_replays(pass_dir: Path, summary: Dict[str, Any], show: bool) -> bool:
    """Print the replay reports Guard wrote in ``pass_dir`` (one per rank); False when there are none."""
    replays = _dist.rank_paths(pass_dir / "replay.json")
    if not replays:
        return False
    if show:
        for path in replays:
            print(path.with_suffix(".txt").read_text(encoding="utf-8"), end="", flush=True)
    summary["replay"] = [read_json(path) for path in replays]
    return True


def _describe(record: Dict[str, Any]) -> str:
    """``"rank 1/2, epoch 2, step 3/8 (global step 11), dump iteration 10: <what went wrong>"``."""
    try:
        return _as_record(record).format()
    except ValueError as exc:
        return f"dump iteration {record.get('dump_iteration')}: {record.get('message') or record.get('kind')} ({exc})"


def _child_env(extra: Dict[str, str]) -> Dict[str, str]:
    env = dict(os.environ)
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    env.update(extra)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def _finish(run: Path, summary: Dict[str, Any], outcome: str, code: int) -> int:
    summary.update(outcome=outcome, exit_code=code, finished=_dt.datetime.now().isoformat(timespec="seconds"))
    atomic_write_json(run / "summary.json", summary)
    _say(f"{outcome.replace('_', ' ')}; everything is in {run}")
    return code


def cli_hunt(args) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    try:
        return hunt(command, run_dir=args.run_dir, timeout=args.timeout, net_name=args.net_name)
    except HuntError as exc:
        print(f"mindguard hunt: {exc}", file=sys.stderr)
        return 2
