"""What the report page shows, gathered from a hunt's run folder or from one report (``analyze``/``replay
--html``), and the page written (:mod:`.page` renders; this module reads files). No MindSpore import.

The timeline reads only what the run folder already holds: each pass's failure record (the failing step, its loss,
what the checks saw), the per-step trace a kept training state carries (``state/state.json``: the loss of each step
since the kept one), and -- clearly labelled -- MindSpore ``LossMonitor`` lines in pass 1's output. The record
keeps no loss history of its own, so without those the page says the loss per step was not recorded.
"""
from __future__ import annotations

import datetime as _dt
import os
import re
import shlex
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Tuple

from .._util.io import atomic_write_text, read_json
from .._version import __version__
from .page import brief, render_page
from .render import short_op_name
from ..protocol import folder as layout
from ..protocol.folder import RunFolder

_CONTEXT = 3                      # lines shown either side of a source line
_MAX_SOURCE_BYTES = 4 << 20       # a source file larger than this is not read for context
_LOSS_MONITOR = re.compile(r"^epoch: (\d+) step: (\d+), loss is (\S+)", re.MULTILINE)


def write_page(path: os.PathLike, data: Dict[str, Any]) -> Path:
    """Render ``data`` and write it atomically to ``path``."""
    return atomic_write_text(path, render_page(data))


def write_run_page(run: os.PathLike) -> str:
    """Write ``<run>/report.html`` for a hunt's run folder; the line the hunt prints (the page's path, or why it
    could not be written -- a page is never a reason for a hunt to fail)."""
    run = Path(run)
    try:
        path = write_page(RunFolder(run).page, run_page_data(run))
    except Exception as exc:  # noqa: BLE001 - the answer is in report.txt/report.json whatever happens here
        return f"the report page could not be written ({type(exc).__name__}: {exc}); the answer is in report.txt"
    return f"report page: {path}"


def _base(kind: str) -> Dict[str, Any]:
    return {"kind": kind, "report": None, "replays": None, "run": None, "failure": None, "position": None,
            "origin": None, "timeline": None, "ranks": None, "passes": None, "sources": {},
            "generated": _dt.datetime.now().isoformat(timespec="seconds"), "version": __version__}


def report_page_data(report: Dict[str, Any]) -> Dict[str, Any]:
    """The page of one ``mindguard analyze`` answer (``DumpReport.to_dict()``)."""
    data = _base("analyze")
    data["report"] = report
    where = f"dump iteration {report.get('iteration')}"
    if report.get("rank") is not None:
        where += f", rank {report.get('rank')}"
    data["position"] = where
    data["ranks"] = _ranks(report)
    data["sources"] = _sources(data)
    return data


def replay_page_data(replay: Dict[str, Any]) -> Dict[str, Any]:
    """The page of one ``mindguard replay`` answer (``ReplayReport.to_dict()``)."""
    data = _base("replay")
    data["replays"] = [replay]
    iteration = replay.get("iteration")
    data["position"] = "replay" + ("" if iteration is None else f" of iteration {iteration} (global step "
                                                                 f"{iteration + 1})")
    data["sources"] = _sources(data)
    return data


def run_page_data(run: Path) -> Dict[str, Any]:
    """The page of a hunt's run folder: summary.json, report.json, the passes' records, logs and kept states."""
    run = Path(run)
    folder = RunFolder(run)
    data = _base("hunt")
    summary = _read(folder.summary) or {}
    command = summary.get("command") or (_read(folder.command) or {}).get("command") or []
    data["run"] = {"dir": str(run), "command": shlex.join(str(c) for c in command), "outcome": summary.get("outcome"),
                   "exit_code": summary.get("exit_code"), "finished": summary.get("finished"),
                   "verify": summary.get("verify_command"),
                   "fix_check": (summary.get("fix_check") or {}).get("printed")}
    found = _read(folder.report)
    if isinstance(found, dict) and isinstance(found.get("replay"), list):
        data["replays"] = found["replay"]
    elif isinstance(found, dict):
        data["report"] = found
    if not data["report"] and not data["replays"] and summary.get("origin"):
        data["origin"] = summary["origin"]
    failure = summary.get("failure")
    data["failure"] = failure
    data["position"] = _position(failure)
    data["ranks"] = _ranks(data["report"] or {})
    data["passes"] = _passes(run, summary, command)
    data["timeline"] = _timeline(run, summary, failure)
    data["sources"] = _sources(data)
    return data


def _read(path: Path) -> Any:
    try:
        return read_json(path)
    except (OSError, ValueError):
        return None


def _position(failure: Optional[Dict[str, Any]]) -> Optional[str]:
    if not failure:
        return None
    from ..errors import RecordError
    from ..protocol.record import FailureRecord

    try:
        return FailureRecord.from_dict(failure, source="failure record").position()
    except RecordError:   # a record of another version: the step number alone
        return f"global step {failure.get('global_step')}"


def rank_text(role: Dict[str, Any]) -> str:
    """What one rank's report shows, in the words of the text report's "per rank" lines."""
    op = role.get("op")
    short = short_op_name(op)
    return {"batch": f"originated: its batch holds Inf/NaN ({', '.join(role.get('inputs') or [])})",
            "local": f"originated: {short} produced Inf/NaN from finite inputs",
            "received": f"received Inf/NaN through {short}",
            "unexplained": "holds Inf/NaN, no producing operator found",
            "stopped": f"no Inf/NaN; the step stopped in {short}",
            "clean": "no Inf/NaN",
            "not_read": "not read on this node"}.get(str(role.get("role")), str(role.get("role")))


def _ranks(report: Dict[str, Any]) -> Optional[List[Dict[str, Any]]]:
    roles = report.get("rank_roles")
    if not roles:
        return None
    return [dict(role, text=rank_text(role)) for role in roles]


# ------------------------------------------------------------------------------------------- the passes
def _pass_dirs(run: Path) -> List[layout.PassFolder]:
    """The run folder's passes (each wrote an output log), pass 1 first, then in the order they ran."""
    dirs = [layout.PassFolder(p) for p in run.iterdir() if p.is_dir()]
    dirs = [d for d in dirs if d.output_log.exists()]
    return sorted(dirs, key=lambda d: (d.name != layout.PASS1.folder, d.output_log.stat().st_mtime))


def _passes(run: Path, summary: Dict[str, Any], command: List[str]) -> List[Dict[str, Any]]:
    out = []
    for folder in _pass_dirs(run):
        info = summary.get(folder.name) or {}
        dump = _read(folder.dump_config) or {}
        settings = dump.get("common_dump_settings") or {}
        observe = any("observes_iterations_only" in str(k) for k in settings.get("kernels") or [])
        if folder.name == layout.PASS1.folder:
            label = "record: find the failing step"
        elif folder.name in (layout.LOCATE.folder, layout.LOCATE_FROM_STEP_1.folder):
            start = "step 1" if folder.name == layout.LOCATE_FROM_STEP_1.folder else "the kept state"
            label = (f"locate and dump: run from {start} to the failing step, dumping each step"
                     if info.get("examine") == "dump" else f"locate: run from {start} to the failing step")
        else:
            label = "examine: " + {"dump": "dump the step", "replay": "capture and replay the step eagerly",
                                   "dataset": "run the dataset pipeline synchronously"}.get(str(info.get("examine")),
                                                                                           "the failing step")
        out.append({"name": folder.name, "label": label, "command": shlex.join(str(c) for c in command),
                    "returncode": info.get("returncode"), "examine": info.get("examine") or "",
                    "dump": None if observe or not settings else {
                        "iteration": settings.get("iteration"), "input_output": settings.get("input_output"),
                        "kernels": settings.get("kernels") or []},
                    "log": str(folder.output_log)})
    return out


# ------------------------------------------------------------------------------------------- the timeline
def _timeline(run: Path, summary: Dict[str, Any], failure: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    records = (summary.get(layout.PASS1.folder) or {}).get("records") or []
    failing = failure.get("global_step") if failure else None
    last = max([int(r.get("global_step") or 0) for r in records] + [int(failing or 0)])
    losses: Dict[int, Tuple[Any, str]] = {}
    notes: List[str] = []
    monitor = _loss_monitor(RunFolder(run).pass_folder(layout.PASS1).output_log,
                            failure or (records[0] if records else None))
    for step, loss in monitor.items():
        if step <= last:
            losses[step] = (loss, "LossMonitor")
    if monitor:
        notes.append("loss per step: read from the LossMonitor lines of pass 1's output (`epoch: E step: S, loss "
                     "is L`); mindguard's record keeps only the latest step's loss")
    kept_steps = []
    for state in sorted(run.glob(f"*/{layout.STATE}/{layout.STATE_META}")):
        meta = _read(state) or {}
        if isinstance(meta.get("step"), int):
            kept_steps.append(meta["step"])
        for step, trace in (meta.get("trace") or {}).items():
            value = _from_hex(trace[0] if isinstance(trace, list) and trace else None)
            if value is not None and str(step).isdigit() and int(step) not in losses:
                losses[int(step)] = (value, "kept trace")
    for record in records:
        step, loss = record.get("global_step"), record.get("loss")
        if isinstance(step, int) and loss is not None and (record.get("rank") or 0) == ((failure or {}).get("rank")
                                                                                       or 0):
            losses[step] = (loss, "record")
    if not losses:
        notes.append("loss per step: not recorded (mindguard's record keeps only the latest step's loss, and the "
                     "run printed no LossMonitor lines)")
    elif not monitor:
        notes.append("loss per step: only the steps mindguard kept (the failing step's record"
                     + (", the trace of a kept training state" if any(s == "kept trace" for _, s in losses.values())
                        else "") + "); earlier steps' losses were not recorded")
    checks = _checks(records, failure, summary, last)
    if kept_steps:
        notes.append(f"training state kept at the beginning of global step(s) {sorted(set(kept_steps))} (dashed "
                     f"lines): the later passes resumed from there")
    return {"last_step": last, "failing_step": failing,
            "loss": [[step, value, source] for step, (value, source) in sorted(losses.items())],
            "checks": checks, "kept": sorted(set(kept_steps)), "notes": notes}


def _checks(records: List[Dict[str, Any]], failure: Optional[Dict[str, Any]], summary: Dict[str, Any],
            last: int) -> List[str]:
    out = []
    failing = failure.get("global_step") if failure else None
    known: List[int] = [r["global_step"] for r in records
                        if r.get("status") == "failed" and isinstance(r.get("global_step"), int)]
    known += [failing] if isinstance(failing, int) and failing else []
    clean_to = (min(known) - 1) if known else last
    if clean_to >= 1:
        steps = "global step 1" if clean_to == 1 else f"global steps 1–{clean_to}"
        out.append(f"{steps}: the loss and every Parameter the step wrote were finite (pass 1's checks after each "
                   f"step)")
    for record in sorted(records, key=lambda r: r.get("rank") or 0):
        who = f"rank {record.get('rank')}: " if (record.get("group_size") or 1) > 1 else ""
        if record.get("status") == "failed":
            names = record.get("nonfinite") or []
            shown = ", ".join(f"`{n}`" for n in names[:8]) + (f" (+{len(names) - 8})" if len(names) > 8 else "")
            moved = (f" (seen there by pass 1; the examine pass placed it at global step {failing}: the dataset "
                     f"pipeline reads ahead)" if failing and record.get("global_step") != failing else "")
            out.append(f"{who}global step {record.get('global_step')}: {record.get('kind')} -- "
                       f"{brief(record.get('message') or '')}" + (f"; non-finite: {shown}" if shown else "") + moved)
        elif record.get("status") == "finished":
            out.append(f"{who}finished after global step {record.get('global_step')} with every check passed")
    for name in layout.EXAMINE_FOLDERS:
        info = summary.get(name) or {}
        again = [r for r in info.get("records") or [] if r.get("status") == "failed"]
        if again and failing:
            same = any(r.get("global_step") == failing for r in again)
            out.append(f"{name}: " + (f"repeated the failure at global step {failing}" if same else
                                      f"failed at global step {again[0].get('global_step')} instead"))
    return out


def _loss_monitor(log: Path, record: Optional[Dict[str, Any]]) -> Dict[int, float]:
    """``global step -> loss`` from MindSpore LossMonitor lines, when the step arithmetic holds: one training
    call (epoch and step restart in every ``Model.train`` call) with a known number of steps per epoch."""
    if not record or not record.get("steps_per_epoch") or (record.get("call") or {}).get("index", 1) != 1 \
            or (record.get("group_size") or 1) > 1:
        return {}
    try:
        with open(log, "rb") as f:
            text = f.read(8 << 20).decode("utf-8", "replace")
    except OSError:
        return {}
    per_epoch = int(record["steps_per_epoch"])
    out: Dict[int, float] = {}
    for epoch, step, loss in _LOSS_MONITOR.findall(text):
        try:
            value = float(loss.rstrip(","))
        except ValueError:
            continue
        out[(int(epoch) - 1) * per_epoch + int(step)] = value
    return out


def _from_hex(text: Any) -> Optional[float]:
    if not isinstance(text, str):
        return None
    try:
        return float.fromhex(text)
    except ValueError:
        try:
            return float(text)
        except ValueError:
            return None


# ------------------------------------------------------------------------------------------- source lines
def _frames(data: Dict[str, Any]) -> Iterable[Dict[str, Any]]:
    report = data.get("report") or {}
    origin = report.get("origin") or data.get("origin")
    if origin and origin.get("source"):
        yield origin["source"]
    stop = report.get("stopped_at")
    if stop and (stop.get("op") or {}).get("source"):
        yield stop["op"]["source"]
    for replay in data.get("replays") or []:
        if (replay.get("first") or {}).get("source"):
            yield replay["first"]["source"]
    flows = [report.get("data_flow")] + [r.get("data_flow") for r in report.get("ranks") or []] + \
        [r.get("data_flow") for r in data.get("replays") or []]
    for flow in flows:
        for node in (flow or {}).get("nodes") or []:
            if node.get("source"):
                yield node["source"]


def _sources(data: Dict[str, Any]) -> Dict[str, Dict[str, Any]]:
    """``"<file>:<line>"`` -> the line and those around it, read from the file when it is there (else the code
    the trace recorded)."""
    out: Dict[str, Dict[str, Any]] = {}
    cache: Dict[str, Optional[List[str]]] = {}
    for frame in _frames(data):
        path, line = frame.get("file"), frame.get("line")
        key = f"{path}:{line}"
        if key in out or not isinstance(line, int):
            continue
        if str(path) not in cache:
            cache[str(path)] = _lines_of(str(path))
        text = cache[str(path)]
        if text is not None and 1 <= line <= len(text):
            numbers = range(max(1, line - _CONTEXT), min(len(text), line + _CONTEXT) + 1)
            lines = [[n, text[n - 1][:240]] for n in numbers]
        else:
            lines = [[line, frame.get("code") or ""]]
        out[key] = {"file": path, "line": line, "lines": lines}
        if len(out) >= 64:
            break
    return out


def _lines_of(path: str) -> Optional[List[str]]:
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > _MAX_SOURCE_BYTES:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return None
