"""Which run wrote a record, and what it ran: the run id, and the hashes of the script and the project files it
imported, so that ``mindguard hunt --from`` can tell a state of another run, another folder or an edited script
from the failing run's own.

What changed since (:func:`source_changes`, :func:`data_changes`) is compared in
:mod:`mindguard.protocol.provenance`, which the hunt reads; they are re-exported here. Pure functions over paths and
dicts; nothing here imports MindSpore.
"""
from __future__ import annotations

import os
import sys
import sysconfig
import time
from pathlib import Path
from typing import Dict, Iterable, List, Optional

from ..._util.io import file_sha256
from ...protocol import provenance as _shared
from ...protocol.provenance import MAX_DIR_ENTRIES, data_changes, source_changes

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
    roots.add(os.path.realpath(str(Path(__file__).resolve().parents[2])))
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


#: Attributes of MindSpore's dataset source stages that name the files they read (``MindDataset``,
#: ``TFRecordDataset``, ``CSVDataset``: ``dataset_files``; ``ImageFolderDataset``, ``Cifar10Dataset``, ...:
#: ``dataset_dir``; ``CocoDataset``/``VOCDataset``: ``annotation_file`` beside it).
DATA_ATTRIBUTES = ("dataset_files", "dataset_file", "dataset_dir", "annotation_file")


def dataset_paths(nodes: Iterable[object]) -> List[str]:
    """The files and folders the pipeline's source stages read (``nodes``: every stage of a pipeline), each once,
    in pipeline order. Python sources (``GeneratorDataset``) name none: what they read is the script's business."""
    out: List[str] = []
    for node in nodes:
        for attribute in DATA_ATTRIBUTES:
            value = getattr(node, attribute, None)
            for item in value if isinstance(value, (list, tuple)) else [value]:
                if isinstance(item, (str, os.PathLike)) and str(item) and str(item) not in out:
                    out.append(str(item))
    return out


def data_fingerprint(path: str) -> Dict[str, object]:
    """What a data file or folder looks like now (:func:`mindguard.protocol.provenance.data_fingerprint`), reading at
    most this module's :data:`MAX_DIR_ENTRIES` entries of a folder."""
    return _shared.data_fingerprint(path, MAX_DIR_ENTRIES)


def data_fingerprints(paths: Iterable[str], cwd: str) -> Dict[str, Dict[str, object]]:
    """``{path: fingerprint}`` (:func:`data_fingerprint`) of the data the pipeline reads, paths relative to ``cwd``
    when under it (as :func:`source_hashes` names the project's files)."""
    out: Dict[str, Dict[str, object]] = {}
    for path in paths:
        absolute = path if os.path.isabs(path) else os.path.join(cwd, path)
        out[_shown(Path(os.path.realpath(absolute)), cwd)] = data_fingerprint(absolute)
    return out


__all__ = ["DATA_ATTRIBUTES", "MAX_DIR_ENTRIES", "MAX_SOURCES", "MAX_SOURCE_BYTES", "data_changes",
           "data_fingerprint", "data_fingerprints", "dataset_paths", "new_run_id", "project_files", "source_changes",
           "source_hashes"]
