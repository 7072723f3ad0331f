"""A scratch copy of the user's project, for the hunt's check of a hint's edit (issue 52: every printed fix is
checked before it is printed; the edit itself: :mod:`mindguard.analysis.fix_edit`). Pure file work, never the user's
files: :func:`project_of` finds the folder the command's script lives in, :func:`copy_project` copies it to a
temporary folder (Python sources and small files copied, big files -- data -- linked), :func:`scratch_command` is
the command run there. Every refusal is a :class:`~mindguard.analysis.fix_edit.Unchecked` with the words to print.
Never imports MindSpore.
"""
from __future__ import annotations

import dataclasses
import os
import re
import shutil
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..analysis.fix_edit import Unchecked

#: Files up to this size are copied; bigger ones (a data set, a checkpoint) are linked, read where they are.
COPY_BYTES = 16 << 20
#: A project folder with more entries than this, or more bytes to copy, is not copied: the check says so.
MAX_ENTRIES = 20000
MAX_COPY_BYTES = 512 << 20
#: A folder holding more files than this and no Python source is data: linked whole, not walked.
DATA_FOLDER_FILES = 1000
#: Folders never copied: version control, environments, caches, mindguard's own run folders.
SKIPPED = {".git", ".hg", ".svn", "__pycache__", ".venv", "venv", ".tox", ".mypy_cache", ".pytest_cache",
           ".ruff_cache", "node_modules", "mindguard_runs", "kernel_meta"}


@dataclasses.dataclass
class Project:
    """The folders the command's code lives in, to copy: ``roots`` (each copied to the same name under the scratch
    folder), whether the working directory is one of them or inside one (then the copy runs there), and the folder
    to put first on ``PYTHONPATH`` (``python -m package.module`` run from outside the package's parent)."""

    roots: List[Path]
    python_path: bool = False


def project_of(command: Sequence[str], cwd: Path, edited: Path) -> Project:
    """The folder to copy for ``command``: the script's (``python train.py``), or for ``python -m pkg.mod`` the
    working directory when the module is there, else the top package holding the edited file. Raises
    :class:`Unchecked` when the command is not a Python script or module, or the edited file is not in it."""
    argv = list(command)
    if not argv or not re.match(r"python[\d.]*$", os.path.basename(argv[0])):
        raise Unchecked(f"the command runs {os.path.basename(argv[0]) if argv else 'nothing'}, not `python "
                        f"SCRIPT` or `python -m MODULE`: the files its training reads are not known")
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-m":
        i += 2 if argv[i] in ("-W", "-X") else 1
    if i >= len(argv):
        raise Unchecked("the command names no script")
    if argv[i] == "-m":
        if i + 1 >= len(argv):
            raise Unchecked("the command names no module")
        parts = argv[i + 1].split(".")
        if (cwd / Path(*parts)).with_suffix(".py").is_file() or (cwd / Path(*parts) / "__main__.py").is_file():
            roots = [cwd]
            python_path = False
        else:
            top = _package_root(edited, parts[0])
            if top is None:
                raise Unchecked(f"the module {argv[i + 1]} is not in the working directory, and the file to edit "
                                f"({edited}) is not in its package")
            roots, python_path = [top], True
    else:
        script = (cwd / argv[i]).resolve()
        if not script.is_file():
            raise Unchecked(f"the script {argv[i]} is not a file")
        roots, python_path = [script.parent], False
    if not any(_under(edited, root) for root in roots):
        raise Unchecked(f"the file to edit, {edited}, is outside the project folder copied ({roots[0]})")
    return Project(roots, python_path)


def _package_root(edited: Path, top: str) -> Optional[Path]:
    """The folder of the package ``top`` that holds ``edited`` (``.../top/sub/file.py`` -> ``.../top``)."""
    for parent in edited.parents:
        if parent.name == top and (parent / "__init__.py").is_file():
            return parent
    return None


def _under(path: Path, root: Path) -> bool:
    try:
        path.resolve().relative_to(root.resolve())
        return True
    except ValueError:
        return False


def copy_project(project: Project, scratch: Path, avoid: Sequence[Path] = ()) -> Dict[Path, Path]:
    """Copy each root of ``project`` to ``scratch/<its name>``: folders made, files up to :data:`COPY_BYTES` copied,
    bigger ones linked (read there: the copy's training writes new files in the copy), symlinks kept as links, a
    folder of over :data:`DATA_FOLDER_FILES` files and no subfolder or Python source linked whole. Skips
    :data:`SKIPPED` folders and ``avoid`` (the hunt's run folder). Returns root -> its copy; raises
    :class:`Unchecked` when the project is too big to copy."""
    mapping: Dict[Path, Path] = {}
    entries = copied = 0
    avoided = [a.resolve() for a in avoid]
    for root in project.roots:
        root = root.resolve()
        target = scratch / (root.name or "root")
        mapping[root] = target
        for folder, dirs, files in os.walk(root):
            here = Path(folder)
            dirs[:] = [d for d in dirs if d not in SKIPPED and not d.startswith(".")
                       and (here / d).resolve() not in avoided and not _under(scratch, here / d)]
            out = target / here.relative_to(root)
            out.mkdir(parents=True, exist_ok=True)
            for name in [d for d in dirs if _is_data(here / d)]:   # a data set's folder: read where it is
                os.symlink(here / name, out / name)
                dirs.remove(name)
            for name in files:
                entries += 1
                if entries > MAX_ENTRIES:
                    raise Unchecked(f"the project folder {root} holds more than {MAX_ENTRIES} files: too many to copy "
                                    f"for a check")
                source, dest = here / name, out / name
                if source.is_symlink():
                    os.symlink(os.readlink(source), dest)
                    continue
                try:
                    size = source.stat().st_size
                except OSError:
                    continue
                if size > COPY_BYTES:
                    os.symlink(source, dest)
                    continue
                copied += size
                if copied > MAX_COPY_BYTES:
                    raise Unchecked(f"the project folder {root} holds more than {MAX_COPY_BYTES >> 20} MB of files "
                                    f"under {COPY_BYTES >> 20} MB each: too much to copy for a check")
                try:
                    shutil.copy2(source, dest)
                except OSError as exc:   # an unreadable file: the copy would not be the project
                    raise Unchecked(f"cannot copy {source}: {exc.strerror or exc}") from None
    return mapping


def _is_data(folder: Path) -> bool:
    """More than :data:`DATA_FOLDER_FILES` entries and no ``.py`` among them (a look at the folder itself only)."""
    count = 0
    try:
        with os.scandir(folder) as entries:
            for entry in entries:
                if Path(entry.name).suffix == ".py" or entry.is_dir(follow_symlinks=False):
                    return False
                count += 1
    except OSError:
        return False
    return count > DATA_FOLDER_FILES


def moved(path: Path, mapping: Dict[Path, Path]) -> Optional[Path]:
    """``path`` in the copy (``None``: not in a copied root)."""
    resolved = path.resolve()
    for root, target in mapping.items():
        try:
            return target / resolved.relative_to(root)
        except ValueError:
            continue
    return None


def scratch_command(command: Sequence[str], cwd: Path, mapping: Dict[Path, Path]) -> Tuple[List[str], Path]:
    """``command`` for the copy and the folder to run it in: every argument naming a file or folder inside a copied
    root names the copy's; the working directory is the copy's when it is inside a root, else stays."""
    out = [command[0]]
    for arg in command[1:]:
        target = moved(cwd / arg, mapping) if arg and not arg.startswith("-") and (cwd / arg).exists() else None
        out.append(str(target) if target is not None else arg)
    return out, moved(cwd, mapping) or cwd
