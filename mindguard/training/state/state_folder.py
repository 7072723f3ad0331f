"""The always-on Guard's state folders: a run's own folder claimed and locked for the process's life, dropped when
the run leaves nothing to hunt, and what dead runs left cleaned by the documented rule
(docs/reference/run-folder.md).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List, Optional

from ...protocol import folder as layout

def claim_run_states(folder: Path, record: Optional[Path] = None) -> Optional[int]:
    """Create run ``folder`` (:func:`mindguard.protocol.folder.run_states`) and hold its lock for the process's
    life (the kernel lets go of it however the process ends); then clean the states folder of what dead runs
    left that nothing names (:func:`clean_stale_states`; ``record``: the record the folder is beside). Returns the
    lock's descriptor (``None``: no lock could be taken; the run keeps its states all the same)."""
    from ..record.record_writer import _lock

    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    fd, _ = _lock(layout.run_lock(folder))   # held before anything else: another starting run sees this one live
    try:
        clean_stale_states(folder.parent, keep=folder.name, record=record)
    except OSError:
        pass
    return fd


def release_run_states(fd: Optional[int]) -> None:
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def drop_run_states(folder: Path) -> None:
    """Remove a run's own state folder (it left nothing to hunt)."""
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.parent.rmdir()   # the states folder, when no other run keeps anything there
    except OSError:
        pass


def _names_of_kept_runs(states_root: Path, record: Optional[Path] = None) -> set:
    """The run ids (state-folder names) that a record beside ``states_root`` names: the usual record (``record``,
    else the one whose name ``states_root``'s is made from) and every record kept under a run id (its ``run_id``,
    ``states`` and ``kept_state``)."""
    from ...protocol.record import _record_document

    usual = record if record is not None else \
        states_root.with_name(states_root.name[:-len(layout.KEPT_STATES_SUFFIX)] + ".json")
    named: set = set()
    for path in [usual, *states_root.parent.glob(layout.run_records_pattern(usual))]:
        try:
            data = _record_document(path)
        except Exception:  # noqa: BLE001 - an unreadable record names nothing
            continue
        if not isinstance(data, dict):
            continue
        for value in (data.get("run_id"), data.get("states"), (data.get("kept_state") or {}).get("path")):
            if isinstance(value, str) and value:
                named.add(value)
                try:
                    named.add(Path(value).relative_to(states_root).parts[0])
                except (ValueError, IndexError):
                    pass
    return named


def clean_stale_states(states_root: Path, *, keep: str = "", record: Optional[Path] = None) -> List[Path]:
    """The documented rule (docs/reference/run-folder.md): in ``<record>.state/``, a run's folder is removed when
    its run is dead (its lock is free) and no record beside names it (the run finished and its states were not
    removed, or its record was deleted: the user is done with it); in the folders of dead runs that records still
    name, the ``.tmp`` files a write cut short left are removed. ``keep``: the starting run's own folder; ``record``:
    the usual record beside it (a name too long for its derived names: :func:`mindguard.protocol.folder.fitted_stem`).
    Returns what was removed."""
    from ..record.record_writer import held_by_a_live_run

    states_root = Path(states_root)
    if not states_root.is_dir():
        return []
    named = _names_of_kept_runs(states_root, record)
    removed: List[Path] = []
    for entry in sorted(states_root.iterdir()):
        if entry.name == keep or not entry.is_dir() or held_by_a_live_run(layout.run_lock(entry)) \
                or _process_alive(entry.name):
            continue
        if entry.name not in named and str(entry) not in named:
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
            continue
        for leftover in entry.rglob("*.tmp"):
            try:
                leftover.unlink()
                removed.append(leftover)
            except OSError:
                pass
        for step in entry.glob(layout.kept_step_pattern()):   # a state whose write was cut short: never complete
            if step.is_dir() and not layout.state_meta(step).exists():
                shutil.rmtree(step, ignore_errors=True)
                removed.append(step)
    return removed


def _process_alive(run_id: str) -> bool:
    """True when the process a run id names (``<date>-<time>-<pid>``) exists: a run that made its folder and has
    not locked it yet is not a dead one (a reused pid only keeps a stale folder one start longer)."""
    tail = run_id.rsplit("-", 1)[-1]
    if not tail.isdigit() or run_id.count("-") != 2:
        return False
    try:
        os.kill(int(tail), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True
    return True

