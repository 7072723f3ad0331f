"""Every printed fix is checked before it is printed (issue 52): once a hunt has its answer, the first hint whose
edit applies mechanically (a ``now:``/``fix:`` pair, :mod:`mindguard.hunt.scratch`) is applied to a scratch copy
of the project and run as ``mindguard verify`` runs a fix (:mod:`mindguard.hunt.verify`: from the kept state
through the failing step or window and a few more, every step checked; from step 1 when the edit acts before the
kept state), within :func:`time_limit`. The line printed under the hint's ``fix:`` line:

* ``checked: trains finite through global step N`` -- the edited copy trained finite through step N;
* ``guard only: trains finite through global step N, but the data still holds ...`` -- it did, but the culprit was
  traced to its origin (a data column, a learning rate) and that is unchanged: the edit is a guard, not a fix;
* ``checked: does not hold -- ...`` -- the failure came back (or the loss still grows);
* ``unchecked (why)`` -- the check could not run, or the hint carries no edit of a line (its fix is to the data, a
  data file or the schedule: said with the origin that is still there).

``summary.json``'s ``fix_check`` (:class:`~mindguard.protocol.summary.FixCheck`) records it; the check's own run
folder is ``fix_check/`` in the hunt's. It never changes the hunt's outcome or exit code, and never touches the
user's files. Never imports MindSpore.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from .._util.io import atomic_write_json, atomic_write_text, read_json
from ..errors import MindguardError
from ..protocol import folder as layout
from ..protocol.summary import FixCheck, Outcome
from . import console as console_
from .console import say
from .context import HuntContext, Options
from .passes import HuntInterrupted, stop_running_passes
from .runner import ProcessRunner
from ..analysis.constant_origin import DECISIVE
from ..analysis.fix_edit import Edit, Unchecked, apply_edit, edit_of
from .scratch import copy_project, moved, project_of, scratch_command
from .verify_pass import VerifyPass
from .verify_plan import DEFAULT_MORE_STEPS, Verdict, from_start_seconds

#: Said under an ``or:`` alternative of a checked fix: only the ``fix:`` line is run.
ALTERNATIVE_UNCHECKED = "unchecked (an alternative: the check ran the fix: line above)"
#: The check's folder in the hunt's run folder.
FOLDER = "fix_check"
#: The check may take this many times the hunt's longest pass (its failing run's pace) ...
TIME_FACTOR = 2.0
#: ... and at least this many seconds (MindSpore's start and compile).
TIME_FLOOR_S = 60.0


def first_edit(summary: Any) -> Optional[Tuple[Edit, str, Dict[str, Any]]]:
    """The first hint of the answer whose edit applies mechanically: ``(edit, "origin" | "stopped_at", the
    finding)``; ``None`` when no hint has one."""
    for which in ("origin", "stopped_at"):
        finding = getattr(summary, which, None)
        if not isinstance(finding, dict):
            continue
        source = finding.get("source") or (finding.get("op") or {}).get("source")
        edit = edit_of(finding.get("hint"), source)
        if edit is not None:
            return edit, which, finding
    return None


def time_limit(ctx: HuntContext, record: Dict[str, Any], from_start: bool) -> float:
    """Seconds the check may take: :data:`TIME_FACTOR` x the hunt's longest pass (or, from step 1, x the failing
    run's pace through the failing step and :data:`DEFAULT_MORE_STEPS` more), at least :data:`TIME_FLOOR_S`."""
    longest = max(ctx.pass_seconds.values(), default=0.0)
    step = record.get("global_step")
    pace = from_start_seconds(record, int(step) + DEFAULT_MORE_STEPS) if from_start and isinstance(step, int) \
        else None
    return max(TIME_FLOOR_S, TIME_FACTOR * longest, TIME_FACTOR * (pace or 0.0))


def check_fix(ctx: HuntContext) -> None:
    """Check the first mechanical edit the answer's hints print; record it in the summary and put its line under
    the hint's ``fix:`` line. Never raises (an interrupt stops the check, not the hunt)."""
    found = first_edit(ctx.summary)
    if found is None:
        _no_edit(ctx)
        return
    edit, which, finding = found
    began = time.monotonic()
    try:
        check = _check(ctx, edit, finding)
    except Unchecked as exc:
        check = FixCheck("unchecked", f"unchecked ({exc})", why=str(exc))
    except MindguardError as exc:   # the command could not be run (a HuntError), ...
        check = FixCheck("unchecked", f"unchecked ({exc})", why=str(exc))
    except OSError as exc:   # the scratch folder or the check's run folder could not be written
        why = f"{exc.filename or 'a file'}: {exc.strerror or exc}"
        check = FixCheck("unchecked", f"unchecked (cannot write {why})", why=why)
    except HuntInterrupted:
        try:
            stop_running_passes()
        except HuntInterrupted:
            pass
        check = FixCheck("unchecked", "unchecked (interrupted)", why="interrupted")
    except Exception as exc:  # noqa: BLE001 - the check never changes the hunt's answer or exit code
        check = FixCheck("unchecked", f"unchecked (mindguard's own error in the check: {type(exc).__name__}: {exc})",
                         why=f"{type(exc).__name__}: {exc}")
    check.hint = which
    check.edit = check.edit or {"file": edit.file, "line": edit.line, "now": edit.now, "fix": edit.fix}
    check.seconds = round(time.monotonic() - began, 1)
    ctx.summary.fix_check = check
    say(f"the hint's fix ({edit.where}): {check.printed}")
    annotate(ctx, edit, check.printed)


def _no_edit(ctx: HuntContext) -> None:
    """The answer's hints carry no edit of a line (the fix is to the data, a data file, the schedule): said as
    unchecked, with the origin the user fixes instead, and recorded -- never silently left unchecked."""
    for which in ("origin", "stopped_at"):
        finding = getattr(ctx.summary, which, None)
        if isinstance(finding, dict) and finding.get("hint"):
            break
    else:
        return   # no hint printed: nothing to check
    still = origin_still_there(finding)
    why = (f"no line of the script to edit: {still}" if still is not None
           else "the hint names no edit of a line to apply")
    check = FixCheck("unchecked", f"unchecked ({why})", why=why)
    check.hint = which
    ctx.summary.fix_check = check
    say(f"the hint's fix: {check.printed}")
    ctx.answer.append(f"the hint's fix: {check.printed}")


def _check(ctx: HuntContext, edit: Edit, finding: Dict[str, Any]) -> FixCheck:
    if ctx.cluster is not None:
        raise Unchecked("a hunt over several nodes: check it with the `mindguard verify` line below")
    record_path, record = _failing_record(ctx)
    if int(record.get("group_size") or 1) > 1:
        raise Unchecked("several ranks: check it with the `mindguard verify` line below")
    from_record = ctx.summary.from_record
    from_start = not (ctx.origin is not None and not getattr(from_record, "fallback", None))
    cwd = Path(os.getcwd())
    project = project_of(ctx.command, cwd, Path(edit.file))
    limit = time_limit(ctx, record, from_start)
    folder = ctx.run / FOLDER
    folder.mkdir()
    scratch = Path(tempfile.mkdtemp(prefix="mindguard_fix_"))
    try:
        mapping = copy_project(project, scratch, avoid=[ctx.run])
        copy = moved(Path(edit.file), mapping)
        if copy is None:
            raise Unchecked(f"the file to edit, {edit.file}, is not in the copy")
        done = apply_edit(edit, copy)
        command, run_cwd = scratch_command(ctx.command, cwd, mapping)
        env = {"PYTHONPATH": os.pathsep.join([str(scratch), *filter(None, [os.environ.get("PYTHONPATH")])])} \
            if project.python_path else {}
        say(f"checking the hint's fix ({edit.where}: `{edit.fix.strip()}`) on a scratch copy of "
            f"{project.roots[0]}, as `mindguard verify` runs a fix (at most {limit:.0f} s; its run: {folder})")
        sub = HuntContext(command, folder, ProcessRunner(command, folder, limit, cwd=run_cwd, env=env, quiet=True),
                          Options(net_name=ctx.options.net_name, check_fix=False), origin=(record_path, record))
        checker = VerifyPass(sub, None, from_start, examine=False)   # the hunt has its answer: no examination
        with console_.muted():
            outcome = checker.hunt()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    verdict = checker.verdict
    try:
        atomic_write_json(folder / "verify.json", {**checker.report, **(verdict.to_dict() if verdict else {}),
                                                   "command": command, "cwd": str(run_cwd)})
    except (OSError, ValueError):
        pass
    check = _judged(verdict, outcome, limit, finding, sub.summary.error, checker.report.get("window"))
    check.edit = {"file": edit.file, "line": edit.line, "now": edit.now, "fix": edit.fix, **done}
    check.route = checker.report.get("route")
    check.folder, check.limit_s = str(folder), round(limit)
    return check


def _failing_record(ctx: HuntContext) -> Tuple[Path, Dict[str, Any]]:
    """The record the check verifies from: ``--from``'s, else pass 1's."""
    if ctx.origin is not None:
        return ctx.origin
    path = ctx.at(layout.PASS1).record
    try:
        data = read_json(path)
    except (OSError, ValueError):
        raise Unchecked(f"pass 1's record {path} cannot be read") from None
    if not isinstance(data, dict):
        raise Unchecked(f"pass 1's record {path} is not a record")
    return path, data


def _judged(verdict: Optional[Verdict], outcome: Outcome, limit: float, finding: Dict[str, Any],
            error: Any = None, window: Optional[List[int]] = None) -> FixCheck:
    """The check's words from ``mindguard verify``'s verdict; ``window``: the failing steps (a loss far above the
    failing run's there is the bad batch's own, not the fix's doing)."""
    if outcome is Outcome.TIMED_OUT:
        why = f"the check did not end within {limit:.0f} s, {TIME_FACTOR:g}x the hunt's longest pass"
        return FixCheck("unchecked", f"unchecked ({why})", why=why)
    if outcome is Outcome.INTERRUPTED:
        return FixCheck("unchecked", "unchecked (interrupted)", why="interrupted")
    if verdict is None:
        why = str(error or f"the check ended: {outcome.label}")
        return FixCheck("unchecked", f"unchecked ({why})", why=why)
    if verdict.outcome == "fails":
        failed = FixCheck("still_fails", f"checked: does not hold -- {verdict.headline}", why=verdict.headline)
        if verdict.failed_step is not None:   # (the loss still growing fails at no step)
            failed.failed_step = verdict.failed_step
        return failed
    if verdict.outcome != "holds":
        why = verdict.why or verdict.headline
        return FixCheck("unchecked", f"unchecked ({why})", why=why)
    through = verdict.through
    still = origin_still_there(finding)
    if still is not None:
        return FixCheck("guard_only", f"guard only: trains finite through global step {through}, but {still}",
                        through_step=through, why=still)
    steps = [s for s in verdict.far if not (window and window[0] <= s <= window[-1])]
    far = (f", but the loss at global step{'s' if len(steps) > 1 else ''} {', '.join(map(str, steps[:5]))} is far "
           f"above the failing run's: check what it learns" if steps else "")
    return FixCheck("trains_finite", f"checked: trains finite through global step {through}{far}",
                    through_step=through)


def origin_still_there(finding: Dict[str, Any]) -> Optional[str]:
    """When the culprit was traced to its origin (``traced_to``: a data column, a learning rate, a data file, a
    Parameter non-finite when the step began, a constant), what an op's edit leaves as it was, in words; ``None``
    when it was not traced (or only to a constant that contributed)."""
    traced = finding.get("traced_to") or []
    first = traced[0] if traced and isinstance(traced[0], dict) else None
    if first is None:
        return None
    kind = first.get("kind")
    if kind == "batch":
        values = ", ".join(_number(v) for v in (first.get("values") or [])[:4]) or "the values named above"
        rows: List[Any] = list(first.get("rows") or [])
        name = first.get("argument") or first.get("name")
        where = f"`{name}` row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows[:5]))}" if rows else f"`{name}`"
        return f"the data still holds {values} ({where}): fix the data, as the hint says first"
    if kind == "hyper_parameter":
        if first.get("rule") != "learning_rate_jump":
            return None   # the learning rate the weights trained with, named beside the op: no schedule fault found
        return (f"the learning rate is still {_number(first.get('value'))} at global step {first.get('step')}: fix "
                f"the schedule, as the hint says first")
    if kind == "file":
        return f"the data file {first.get('path') or first.get('name')} is still as it was: fix it first"
    if kind == "constant" and first.get("rule") not in DECISIVE:
        return None   # a constant that only contributed (the 1.0 of log(x - 1.0)): the op's edit is the fix
    return f"its origin is still there ({first.get('text') or kind}): fix that first"


def _number(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def annotate(ctx: HuntContext, edit: Edit, printed: str) -> None:
    """Put ``printed`` under the hint's ``fix:`` line in the answer (and in ``report.txt``), and
    :data:`ALTERNATIVE_UNCHECKED` under each ``or:`` alternative that follows it; after the answer when no text
    shows that line."""
    fix_line = f"fix:    {edit.fix.strip()}"

    def under(text: str) -> Optional[str]:
        lines = text.split("\n")
        for i, line in enumerate(lines):
            if line.strip() == fix_line:
                indent = line[:len(line) - len(line.lstrip())]
                lines.insert(i + 1, f"{indent}{printed}")
                at = i + 2
                while at < len(lines) and lines[at].strip().startswith("or:"):
                    lines.insert(at + 1, f"{indent}{ALTERNATIVE_UNCHECKED}")
                    at += 2
                return "\n".join(lines)
        return None

    for i, text in enumerate(ctx.answer):
        new = under(text)
        if new is None:
            continue
        ctx.answer[i] = new
        try:
            report = ctx.folder.report_text.read_text(encoding="utf-8")
            changed = under(report)
            if changed is not None:
                atomic_write_text(ctx.folder.report_text, changed)
        except (OSError, UnicodeDecodeError):
            pass
        return
    ctx.answer.append(f"the hint's fix ({edit.where}): {printed}")
