"""Which run wrote a record, and what it ran: the run id, and the hashes of the script and the project files it
imported, so that ``mindguard hunt --from`` can tell a state of another run, another folder or an edited script
from the failing run's own.

Pure functions over paths and dicts; nothing here imports MindSpore.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from .._util.io import file_sha256

#: At most this many project files are hashed, each of at most this many bytes (a script's own modules; larger
#: files are data, not code).
MAX_SOURCES = 200
MAX_SOURCE_BYTES = 4 << 20


def new_run_id() -> str:
    """A run's id: its start time and process id, ``20261203-130512-4242`` (sortable by start time)."""
    return time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"


def _library_roots() -> List[str]:
    """Folders whose files are installed libraries, not the project's (site-packages, the standard library,
    mindguard itself)."""
    roots = {os.path.realpath(p) for key in ("stdlib", "platstdlib", "purelib", "platlib")
             for p in [sysconfig.get_paths().get(key)] if p}
    roots.update(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    roots.add(os.path.realpath(str(Path(__file__).resolve().parents[1])))
    return sorted(roots)


def project_files(main_file: Optional[str], module_files: Iterable[Optional[str]], cwd: str) -> List[Path]:
    """The script (``main_file``) and the imported files (``module_files``) that are the project's: ``.py``
    files under the working folder ``cwd`` or the script's folder, outside every installed library; at most
    :data:`MAX_SOURCES`, the script first."""
    roots = {os.path.abspath(cwd), os.path.realpath(cwd)}
    if main_file:
        folder = os.path.dirname(os.path.abspath(os.path.join(cwd, main_file)))
        roots.update((folder, os.path.realpath(folder)))
    under = tuple(root + os.sep for root in roots)
    libraries = _library_roots()
    libraries_under = tuple(lib + os.sep for lib in libraries) + tuple(
        os.path.abspath(lib) + os.sep for lib in (sys.prefix, sys.base_prefix, sys.exec_prefix))
    found: List[Path] = []
    seen = set()
    for name in [main_file, *module_files]:
        if not name or not name.endswith(".py"):
            continue
        path = name if os.path.isabs(name) else os.path.join(cwd, name)
        if not path.startswith(under) or path.startswith(libraries_under) or "site-packages" in path:
            continue   # (string tests first: ~2,000 modules are imported, nearly all of them libraries)
        real = os.path.realpath(path)
        if real in seen or not real.startswith(under) or real.startswith(libraries_under):
            continue
        seen.add(real)
        found.append(Path(real))
        if len(found) >= MAX_SOURCES:
            break
    return found


def source_hashes(cwd: str, main_file: Optional[str] = None, module_files: Optional[Iterable[Optional[str]]] = None
                  ) -> Dict[str, str]:
    """``{path: sha256}`` of the project's files (:func:`project_files`; by default the ``__main__`` script and
    every module imported so far), paths relative to ``cwd`` when under it. Unreadable or too large files are
    left out. Measured: ~1 ms for a script and ten modules."""
    if main_file is None:
        main_file = getattr(sys.modules.get("__main__"), "__file__", None)
    if module_files is None:
        module_files = [getattr(m, "__file__", None) for m in list(sys.modules.values())]
    out: Dict[str, str] = {}
    for path in project_files(main_file, module_files, cwd):
        try:
            if path.stat().st_size > MAX_SOURCE_BYTES:
                continue
            digest = file_sha256(path)
        except OSError:
            continue
        out[_shown(path, cwd)] = digest
    return out


def _shown(path: Path, cwd: str) -> str:
    try:
        return str(path.relative_to(os.path.realpath(cwd)))
    except ValueError:
        return str(path)


def source_changes(recorded: Dict[str, str], recorded_cwd: Optional[str], cwd: str) -> List[str]:
    """What differs between the project files a run recorded (``recorded``: :func:`source_hashes`, relative
    paths meant under ``recorded_cwd``) and those the hunt would run now from ``cwd``: one phrase per file,
    ``"train.py changed since the failure"``, ``"model/net.py is missing"``. Empty when all are the same."""
    changes = []
    for name, digest in recorded.items():
        path = Path(name) if os.path.isabs(name) else Path(cwd) / name
        try:
            now = file_sha256(path)
        except FileNotFoundError:
            changes.append(f"{name} is missing" + (f" here (the failing run had it in {recorded_cwd})"
                                                    if recorded_cwd and os.path.realpath(recorded_cwd) !=
                                                    os.path.realpath(cwd) else ""))
            continue
        except OSError as exc:
            changes.append(f"{name} cannot be read ({exc.strerror or exc})")
            continue
        if now != digest:
            changes.append(f"{name} changed since the failure")
    return changes

