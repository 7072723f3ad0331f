"""Where a MindSpore dump keeps what, and what its file names say.

Layout (MindSpore 2.x, CPU/GPU/Ascend O0-O1)::

    <root>/rank_<r>/<net>/<graph>/<iteration>/*.npy        (iteration: 0-based dump iteration id)
    <root>/rank_<r>/execution_order/ms_execution_order_graph_<g>.csv
    <root>/rank_<r>/graphs/ms_output_trace_code_graph_<g>.ir

Tensor file names: ``{op_type}.{op_name}.{task}.{stream}.{timestamp_us}.{input|output}.{slot}.{format}[.{dtype}].npy``
where ``op_name`` is the full scope name with ``/ \\ .`` and space replaced by ``_``.
"""
from __future__ import annotations

import csv
import errno
import io
import os
import re
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple, Union

import numpy as np
from ..errors import DumpInProgressError, DumpNotFoundError, NotRegularFileError

_NON_NET_DIRS = {"execution_order", "graphs", ".dump_metadata"}
_SANITIZE = re.compile(r"[/\\. ]")
_OP_SUFFIX = re.compile(r"-op\d+$")
_BATCH_INPUT = re.compile(r"inputs\d+")


def sanitize(full_name: str) -> str:
    """The op-name part MindSpore writes into file names for the scope name ``full_name``."""
    return _SANITIZE.sub("_", full_name)


def is_batch_input(op_name: str) -> bool:
    """Whether a ``Parameter.<op_name>`` file holds a batch input (``inputs0``, ``inputs1``, ...) of the step."""
    return _BATCH_INPUT.fullmatch(op_name) is not None


def strip_op_suffix(name: str) -> str:
    """``.../Sqrt-op12`` -> ``.../Sqrt`` (the ``-opN`` numbering differs between files, csv and .ir)."""
    return _OP_SUFFIX.sub("", name)


def read_regular_bytes(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file (never blocks on a FIFO or device: opened non-blocking and
    checked with fstat); raises ``OSError`` naming the file otherwise."""
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFileError(errno.EINVAL, "not a regular file (FIFO, socket or device)", str(path))
        with os.fdopen(fd, "rb", closefd=False) as handle:
            return handle.read()
    finally:
        os.close(fd)


def read_regular_text(path: Path) -> str:
    """:func:`read_regular_bytes` decoded as UTF-8, undecodable bytes replaced."""
    return read_regular_bytes(path).decode("utf-8", errors="replace")


def is_regular_file(path: Path) -> bool:
    """``path`` is a regular file (not a FIFO, socket, device, directory; a symlink is followed)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def subdirs(directory: Path, warnings: List[str]) -> List[Path]:
    """The real sub-directories of ``directory``, sorted; directory symlinks are skipped with a warning (a link
    such as ``rank_0/Net/0/9 -> ../..`` would otherwise be analysed as iteration 9, or loop)."""
    out: List[Path] = []
    try:
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_symlink():
                    if entry.is_dir():
                        warnings.append(f"skipped directory symlink {entry.path} -> {os.readlink(entry.path)}: "
                                        f"mindguard follows no directory symlinks in a dump")
                    continue
                if entry.is_dir(follow_symlinks=False):
                    out.append(Path(entry.path))
    except OSError as exc:
        warnings.append(f"could not list {directory}: {exc.strerror or exc}")
    return sorted(out)


@dataclass
class TensorFile:
    """One dumped tensor: ``io`` is ``"input"``/``"output"``, ``slot`` 0-based, ``timestamp`` in µs."""

    op_type: str
    op_name: str
    task: str
    stream: str
    timestamp: int
    io: str
    slot: int
    fmt: str
    dtype: Optional[str]
    path: Optional[Path]
    stats: Optional[dict] = None          # pre-computed statistics (statistic.csv dumps): no tensor to read
    graph: int = 0
    member: Optional[str] = None          # the array's name in ``path`` when that is an ``.npz`` (a kept state)

    @property
    def is_parameter(self) -> bool:
        return self.op_type == "Parameter"


@dataclass
class IterationFiles:
    """All files of one iteration of one rank, merged over the kernel graphs that ran in it."""

    rank_dir: Path
    rank: int
    net: str
    iteration: Optional[int]   # (None: nothing of the step was dumped -- its first kernel raised)
    graphs: List[int]
    tensors: List[TensorFile] = field(default_factory=list)
    overflow_records: List[Path] = field(default_factory=list)
    warnings: List[str] = field(default_factory=list)


def parse_tensor_name(file_name: str) -> Optional[Tuple[str, str, str, str, int, str, int, str, Optional[str]]]:
    """Split a dump file name into its fields, or None when it is not a dump tensor file."""
    if not file_name.endswith(".npy"):
        return None
    parts = file_name[:-4].split(".")
    for io_index in range(len(parts) - 3, 3, -1):
        if parts[io_index] in ("input", "output") and parts[io_index + 1].isdigit():
            tail = parts[io_index + 2:]
            if len(tail) not in (1, 2):
                continue
            try:
                timestamp = int(parts[io_index - 1])
            except ValueError:
                return None
            op_name = ".".join(parts[1:io_index - 3])
            if not op_name:
                return None
            return (parts[0], op_name, parts[io_index - 3], parts[io_index - 2], timestamp, parts[io_index],
                    int(parts[io_index + 1]), tail[0], tail[1] if len(tail) == 2 else None)
    return None


def file_timestamp_us(file_name: str) -> Optional[int]:
    """The timestamp field of a dump tensor file name (epoch microseconds), or None for another file."""
    fields = parse_tensor_name(file_name)
    return fields[4] if fields is not None else None


def rank_of(rank_dir: Path) -> int:
    match = re.fullmatch(r"rank_(\d+)", rank_dir.name)
    return int(match.group(1)) if match else 0


def resolve_dump_path(path: Path) -> Tuple[List[Path], Optional[Tuple[str, int, int]]]:
    """Rank directories under ``path`` and, when ``path`` pointed at an iteration, ``(net, graph, iteration)``.

    ``path`` may be the dump root (holding ``rank_*``), a rank directory, a net/graph directory, or an
    iteration directory. Raises ``FileNotFoundError`` naming what was expected.
    """
    path = Path(path).expanduser().resolve()
    if not path.is_dir():
        raise DumpNotFoundError(f"dump path {str(path)!r} is not a directory; pass the dump root (the one "
                                f"holding rank_*), a rank_* directory or an iteration directory")
    ranks = sorted((p for p in path.glob("rank_*") if p.is_dir()), key=rank_of)
    if ranks:
        return ranks, None
    if path.name.startswith("rank_") or (path / "execution_order").is_dir() or (path / ".dump_metadata").is_dir():
        return [path], None
    if path.name.isdigit() and path.parent.name.isdigit():            # <net>/<graph>/<iteration>
        return [path.parents[2]], (path.parents[1].name, int(path.parent.name), int(path.name))
    if path.name.isdigit() and path.parent.parent.name.startswith("rank_"):   # <net>/<graph>
        return [path.parents[1]], None
    if path.parent.name.startswith("rank_"):                          # <net>
        return [path.parent], None
    nested = sorted({p.parent for p in path.rglob("rank_*") if p.is_dir()})
    if nested:
        return resolve_dump_path(nested[0])
    not_dirs = sorted(p.name for p in path.glob("rank_*") if not p.is_dir())
    odd = f" ({', '.join(not_dirs)}: not a directory)" if not_dirs else ""
    raise DumpNotFoundError(f"no MindSpore dump found under {str(path)!r}{odd}: expected rank_*/<net>/<graph>/"
                            f"<iteration>/*.npy (is 'path' in dump.json the same directory? did training reach the "
                            f"dumped iteration?)")


def iteration_dirs(rank_dir: Path, warnings: Optional[List[str]] = None) -> Dict[int, List[Tuple[str, int, Path]]]:
    """``{iteration: [(net, graph, dir), ...]}`` for one rank (0-based iteration ids). Only real directories:
    regular files named like them and directory symlinks are skipped (said in ``warnings``)."""
    warnings = [] if warnings is None else warnings
    found: Dict[int, List[Tuple[str, int, Path]]] = {}
    for net_dir in (p for p in subdirs(rank_dir, warnings) if p.name not in _NON_NET_DIRS):
        for graph_dir in (p for p in subdirs(net_dir, warnings) if p.name.isdigit()):
            for it_dir in (p for p in subdirs(graph_dir, warnings) if p.name.isdigit()):
                found.setdefault(int(it_dir.name), []).append((net_dir.name, int(graph_dir.name), it_dir))
    return found


def find_iteration_dirs(path: Union[str, "os.PathLike[str]"], iteration: int, *, rank: int = 0,
                        net_name: str = "Net") -> List[Path]:
    """Every ``<path>/rank_<rank>/<net_name>/<graph>/<iteration>`` directory that holds files.

    ``iteration`` is the 0-based dump iteration id. Sorted so the training graph (the one with
    ``Parameter.inputs*`` batch files) comes first, then by graph id.
    """
    base = Path(path) / f"rank_{rank}" / net_name
    found = [d for d in base.glob(f"*/{iteration}") if d.is_dir() and any(d.iterdir())]

    def key(d: Path):
        has_batch = any(f.name.startswith("Parameter.inputs") for f in d.iterdir())
        return (not has_batch, int(d.parent.name) if d.parent.name.isdigit() else 1 << 30)

    return sorted(found, key=key)


def dumped_iterations(path: Union[str, "os.PathLike[str]"], rank: int, net_name: str) -> List[int]:
    """The 0-based iteration ids with a directory under ``<path>/rank_<rank>/<net_name>/<graph>/``, any graph,
    sorted and without repeats."""
    base = Path(path) / f"rank_{rank}" / net_name
    return sorted({int(d.name) for d in base.glob("*/*") if d.is_dir() and d.name.isdigit()})


def in_time_window(tensors: List[TensorFile], window: Optional[Tuple[int, int]]) -> Tuple[List[TensorFile], int]:
    """``(tensors whose dump timestamp is within window, how many were outside)``; ``window`` is
    ``(start_us, end_us)``, inclusive, in epoch microseconds (the wall clock of the timestamp field of dump file
    names, measured on CPU within a few ms of the files' mtime); None keeps everything."""
    if window is None:
        return tensors, 0
    start, end = window
    kept = [t for t in tensors if start <= t.timestamp <= end]
    return kept, len(tensors) - len(kept)


def _read_mapping(directory: Path, warnings: List[str]) -> Dict[str, str]:
    """mapping.csv (overlong names): ``{short file name or stem: original file name}``."""
    mapping: Dict[str, str] = {}
    path = directory / "mapping.csv"
    if not path.is_file():
        return mapping
    try:
        for row in csv.reader(io.StringIO(read_regular_text(path), newline="")):
            if len(row) < 2:
                continue
            a, b = row[0].strip(), row[1].strip()
            short, long_ = (a, b) if len(a) <= len(b) else (b, a)
            mapping[short] = long_
            mapping[Path(short).stem] = long_
    except (OSError, csv.Error) as exc:
        warnings.append(f"could not read {path}: {exc}")
    return mapping


#: An iteration directory whose newest file is younger than this may still be written by a training that is dumping
#: it (MindSpore writes a step's files kernel by kernel, into the directory of the iteration under way).
SETTLE_SECONDS = 1.0
#: How long the analysis waits for such a directory to settle before it refuses to read it.
WAIT_SECONDS = 10.0


def _newest_change(directory: Path) -> Tuple[float, int]:
    """``(newest mtime of the directory and its files, number of entries)``."""
    newest, count = 0.0, 0
    try:
        newest = os.stat(directory).st_mtime
        with os.scandir(directory) as entries:
            for entry in entries:
                count += 1
                try:
                    newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
                except OSError:
                    continue
    except OSError:
        pass
    return newest, count


def _later_iteration_exists(directory: Path) -> bool:
    """Whether the graph of ``<graph>/<iteration>`` already ran a later iteration (then this one is complete)."""
    try:
        number = int(directory.name)
        with os.scandir(directory.parent) as entries:
            return any(e.name.isdigit() and int(e.name) > number and e.is_dir(follow_symlinks=False) for e in entries)
    except (OSError, ValueError):
        return False


def wait_until_written(dirs: Iterable[Tuple[str, int, Path]], *, settle: float = SETTLE_SECONDS,
                       wait: float = WAIT_SECONDS) -> None:
    """Return once no iteration directory of ``dirs`` is being written; raise :class:`DumpInProgressError` when
    one still is after ``wait`` seconds.

    An iteration is complete once its graph ran a later one, or when none of its files changed for ``settle``
    seconds; a training still dumping it (``mindguard analyze`` pointed at a live run) otherwise makes the files
    read a step that "stopped" half-way."""
    pending = [d for _, _, d in dirs if not _later_iteration_exists(d)]
    if not pending:
        return
    deadline = time.monotonic() + wait
    while True:
        newest = max(_newest_change(d)[0] for d in pending)
        age = time.time() - newest
        if age >= settle:
            return
        if time.monotonic() >= deadline:
            shown = ", ".join(str(d) for d in pending[:3])
            raise DumpInProgressError(
                f"iteration {pending[0].name} ({shown}) is still being written: a file changed {max(age, 0):.1f}s "
                f"ago, and went on changing for {wait:.0f}s. A training is dumping it now; analyse it once the "
                f"training has moved past it or ended (or pass an earlier --iteration)")
        time.sleep(min(0.2, max(settle - age, 0.05)))
        pending = [d for d in pending if not _later_iteration_exists(d)]
        if not pending:
            return


def list_iteration(dirs: Iterable[Tuple[str, int, Path]], warnings: List[str], *, writer_ended: bool = False
                   ) -> Tuple[List[TensorFile], List[Path]]:
    """Parse every file of the given graph/iteration directories (no tensor is read here), once they are no longer
    being written (:func:`wait_until_written`; not waited on when ``writer_ended``: the writing process ended)."""
    dirs = list(dirs)
    if not writer_ended:
        wait_until_written(dirs)
    tensors: List[TensorFile] = []
    overflow: List[Path] = []
    foreign: List[str] = []
    special: List[str] = []
    for _net, graph, directory in dirs:
        mapping = _read_mapping(directory, warnings)
        stat_csv = directory / "statistic.csv"
        if stat_csv.is_file():
            tensors.extend(read_statistic_csv(stat_csv, graph, warnings))
        try:
            entries = sorted(directory.iterdir())
        except OSError as exc:
            warnings.append(f"could not list {directory}: {exc.strerror or exc}")
            entries = []
        for entry in entries:
            name = entry.name
            if name in ("mapping.csv", "statistic.csv") or entry.is_dir():
                continue
            if not is_regular_file(entry):
                special.append(name)
                continue
            if name.startswith("Opdebug.Node_OpDebug") or name.startswith("Opdebug."):
                overflow.append(entry)
                continue
            parsed = parse_tensor_name(name)
            if parsed is None and (name in mapping or Path(name).stem in mapping):
                parsed = parse_tensor_name(mapping.get(name) or mapping[Path(name).stem])
            if parsed is None:
                foreign.append(name)
                continue
            op_type, op_name, task, stream, ts, io, slot, fmt, dtype = parsed
            tensors.append(TensorFile(op_type, op_name, task, stream, ts, io, slot, fmt, dtype, entry, graph=graph))
    if special:
        warnings.append(f"skipped {len(special)} file(s) that are not regular files (FIFO, socket, device or broken "
                        f"link), never opened: {', '.join(special[:5])}")
    if foreign:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        warnings.append(f"ignored {len(foreign)} file(s) that are not dump tensors: {shown}")
    return tensors, overflow


_STAT_COLUMNS = {
    "max value": "max", "min value": "min", "nan count": "nan", "negative inf count": "neg_inf",
    "positive inf count": "pos_inf", "zero count": "zeros",
}


def read_statistic_csv(path: Path, graph: int, warnings: List[str]) -> List[TensorFile]:
    """Rows of a GPU/Ascend ``statistic.csv`` as tensors carrying their statistics (nothing else to read)."""
    out: List[TensorFile] = []
    try:
        reader = csv.DictReader(io.StringIO(read_regular_text(path), newline=""))
        for line_no, row in enumerate(reader, start=2):
            row = {(k or "").strip().lower(): (v or "").strip() for k, v in row.items() if k}
            try:
                stats: Dict[str, Any] = {"shape": _parse_shape(row.get("shape", "")),
                         "dtype": _normalize_dtype(row.get("data type", ""))}
                for column, key in _STAT_COLUMNS.items():
                    value = row.get(column, "")
                    if value == "":
                        stats[key] = None if key in ("min", "max") else 0
                    elif key in ("min", "max"):
                        stats[key] = float(value)
                    else:
                        stats[key] = int(float(value))
                out.append(TensorFile(row["op type"], row["op name"], row.get("task id", "0"),
                                      row.get("stream id", "0"), int(row.get("timestamp") or 0),
                                      row["io"].lower(), int(row["slot"]), "", stats["dtype"], None,
                                      stats=stats, graph=graph))
            except (KeyError, ValueError, AttributeError) as exc:
                warnings.append(f"{path}:{line_no}: unreadable statistic row ({exc!r}); skipped")
    except (OSError, csv.Error) as exc:
        warnings.append(f"could not read {path}: {exc}")
    return out


def npy_dtype_problem(header_dtype: "np.dtype", name_dtype: Optional[str]) -> Optional[str]:
    """Why a ``.npy`` whose header says ``header_dtype`` is not a tensor MindSpore wrote as ``name_dtype`` (the
    file name's dtype field, e.g. ``"Float32"``; None when the name has none), or None when it is consistent.
    MindSpore writes plain numeric dtypes in native (little-endian) byte order."""
    if header_dtype.fields is not None or header_dtype.kind not in "biufc":
        return f"its header dtype {header_dtype.str!r} is not a plain numeric dtype"
    if not header_dtype.isnative:
        return f"its header dtype {header_dtype.str!r} has a non-native byte order (MindSpore writes native order)"
    if name_dtype:
        try:
            expected = np.dtype(_normalize_dtype(name_dtype))
        except TypeError:
            return None                      # a name numpy has no dtype for (BFloat16): nothing to compare
        if expected != header_dtype:
            return f"its header dtype {header_dtype.str!r} ({header_dtype}) contradicts the file name's {name_dtype}"
    return None


def _parse_shape(text: str) -> List[int]:
    return [int(d) for d in re.findall(r"\d+", text)]


def normalize_dtype(text: str) -> str:
    """``"DT_FLOAT16"``/``"Float16"``/``"float16"`` -> ``"float16"``."""
    t = text.lower().replace("dt_", "").strip()
    return {"float": "float32", "double": "float64", "half": "float16"}.get(t, t)


_normalize_dtype = normalize_dtype


def element_count(tensor: TensorFile) -> Optional[int]:
    """How many elements ``tensor`` holds, from its statistics or its ``.npy`` header alone (the data is not
    read); None when unknown (an ``.npz`` member, a damaged or unreadable file)."""
    if tensor.stats is not None and tensor.stats.get("shape") is not None:
        return int(np.prod(tensor.stats["shape"]))
    if tensor.path is None or tensor.member is not None:
        return None
    try:
        fd = os.open(str(tensor.path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            return None
        with os.fdopen(fd, "rb") as handle:
            version = np.lib.format.read_magic(handle)
            if version == (1, 0):
                shape, _, _ = np.lib.format.read_array_header_1_0(handle)
            elif version == (2, 0):
                shape, _, _ = np.lib.format.read_array_header_2_0(handle)
            else:
                return None
    except (OSError, ValueError, EOFError):
        return None
    return int(np.prod(shape))


def check_step_dump(root: Path, rank: int, net_name: str, window: Sequence[int],
                    batch: Sequence[np.ndarray]) -> Tuple[List[Path], List[str]]:
    """The iteration directories under ``root`` holding files written during ``window`` (epoch µs, inclusive),
    and the problems that say the dump does not hold the step whose batch is ``batch``."""
    base = root / f"rank_{rank}" / net_name
    start, end = window
    dirs: List[Path] = []
    batch_files: Dict[int, Path] = {}
    for directory in sorted(base.glob("*/*")):
        if not directory.is_dir() or directory.is_symlink():
            continue
        inside = False
        for entry in os.scandir(directory):
            stamp = file_timestamp_us(entry.name)
            if stamp is not None and start <= stamp <= end:
                inside = True
                if entry.name.startswith("Parameter.inputs"):
                    slot = _batch_slot(entry.name)
                    if slot is not None:
                        batch_files[slot] = Path(entry.path)
        if inside:
            dirs.append(directory)
    problems = []
    if not dirs:
        problems.append(f"no file under {base} was written during the step: MindSpore did not dump it (the dump "
                        f"was armed for other iterations, or after the first graph compile; or the step raised in "
                        f"the first kernel it launched, before any kernel's files were written)")
    for slot, path in sorted(batch_files.items()):
        if slot < len(batch):
            try:
                dumped = np.load(path, allow_pickle=False)
            except (OSError, ValueError, EOFError) as exc:   # a file cut short (a full disk) is EOFError
                problems.append(f"batch file {path.name} is unreadable ({type(exc).__name__}: {exc})")
                continue
            if dumped.shape != batch[slot].shape or not np.array_equal(dumped, batch[slot], equal_nan=True):
                problems.append(f"batch file {path.name} does not hold input {slot} of the step: the dump is of "
                                f"another step")
    return dirs, problems


def _batch_slot(file_name: str) -> Optional[int]:
    """``Parameter.inputs0.<...>.output.0...`` -> 0 (the 0-based batch position), else ``None``."""
    head = file_name.split(".")[1] if file_name.count(".") >= 1 else ""
    digits = head[len("inputs"):] if head.startswith("inputs") else ""
    return int(digits) if digits.isdigit() else None
