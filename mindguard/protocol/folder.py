"""The run folder's layout: every file and folder ``mindguard hunt`` and the training process it runs share, named
once (issue 29). Code on either side asks this module for a path; no other module spells these names (a test
checks it).

A hunt's run folder::

    <run>/command.json  summary.json  report.json  report.txt  report.html
    <run>/<pass>/       failure.json (the record; per rank: failure.rankN.json)  pass_status.json  replay.json
                        replay.txt  dump.json  output.log  step_batch.npz  observe/  capture/  dump/  state/
    <state>/            state.json  state.npz       (a kept training state; :mod:`mindguard.training.state.resume`)

An always-on Guard keeps its states beside its record, one folder per run: ``<record stem>.state/<run id>/step-<N>/``
(N: the 1-based global step the state is kept at the beginning of), with ``run.json`` (the run's identity: cwd,
command line, the hashes of its source files) and ``.lock`` (held by the live run). A run's failure record is kept
under its run id too, ``<record stem>.<run id>.json`` (the path Guard prints), so a later run in the folder never
replaces it. A record name too long for the names derived from it gets a shorter stem for them
(:func:`fitted_stem`); a record folder that cannot be written is replaced by one in the temp directory
(:func:`fallback_folders`). Never imports MindSpore.
"""
from __future__ import annotations

import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import List, Tuple, Union

PathLike = Union[str, "os.PathLike[str]"]

# -- files ---------------------------------------------------------------------------------------------------
DEFAULT_RECORD = "mindguard_failure.json"   # an always-on Guard's record, in the working directory
DEFAULT_CAPTURE = "mindguard_capture"       # where a step is captured outside the hunt
DEFAULT_REPLAY = "mindguard_replay.json"    # where a replay's report goes outside the hunt
DEFAULT_DUMP = "mindguard_dump"             # where a step is dumped outside the hunt
RECORD = "failure.json"          # a pass's failure record (per rank: failure.rankN.json)
RECORD_GLOB = "failure*.json"    # ... every rank's
PASS_STATUS = "pass_status.json"  # beside the record: how the pass's process ended (:mod:`.pass_status`; per rank)
STEP_BATCH = "step_batch.npz"    # beside the record: the batch of an examined step that raised (:mod:`.step_batch`)
REPLAY = "replay.json"           # a replay's report (JSON); its text beside it, REPLAY_TEXT
REPLAY_TEXT_SUFFIX = ".txt"
REPLAY_TEXT = "replay.txt"
DUMP_CONFIG = "dump.json"        # the MindSpore dump config the hunt armed for a pass
OUTPUT_LOG = "output.log"        # a pass's stdout and stderr
STATE_META = "state.json"        # a kept training state: what it is (step, names, shapes, sha256 of the arrays)
STATE_ARRAYS = "state.npz"       # ... and its arrays (p0, p1, ... in the order of state.json's names)
RUN_INFO = "run.json"            # in a run's state folder: its identity (run id, cwd, argv, source hashes)
RUN_LOCK = ".lock"               # ... held (flock) while the run lives: a folder whose lock is free is a dead run's
COMMAND = "command.json"         # the command the hunt runs, written when the run folder is created
SUMMARY = "summary.json"         # the hunt's result (:class:`mindguard.protocol.summary.HuntSummary`)
REPORT = "report.json"           # the answer: a dump's analysis, or the replays
REPORT_TEXT = "report.txt"       # ... as text
PAGE = "report.html"             # ... as a page

#: Every file name above (what no module outside :mod:`mindguard.protocol` may spell).
FILE_NAMES: Tuple[str, ...] = (DEFAULT_RECORD, DEFAULT_REPLAY, RECORD, REPLAY, REPLAY_TEXT, DUMP_CONFIG,
                               OUTPUT_LOG, STATE_META, STATE_ARRAYS, COMMAND, SUMMARY, REPORT, REPORT_TEXT, PAGE,
                               RUN_INFO, PASS_STATUS, STEP_BATCH)

# -- folders inside a pass's ---------------------------------------------------------------------------------
CAPTURE = "capture"
DUMP = "dump"
STATE = "state"
OBSERVE = "observe"
KEPT_STATES_SUFFIX = ".state"    # <record stem>.state/: an always-on Guard's kept states
KEPT_STEP_PREFIX = "step-"       # ... one step-<N>/ folder per state
HELD_CHECKPOINT = "checkpoint.ckpt"   # ... a hard link to the training's own checkpoint a state resumes from
FAST_FORWARD_ATTEMPT_SUFFIX = ".fast-forward"   # <pass>.fast-forward/: a pass whose dataset reset was not exact


@dataclass(frozen=True)
class PassName:
    """A pass's name, which is its folder's name and its key in ``summary.json``: ``family`` (``pass1``,
    ``locate``, ``pass2``, ``resumed``, ``examine``) and, for a further look of that family, a ``variant``
    (``at-step``, ``every-iteration``, a dump scope, ``<scope>-from-step-1``). The hunt carries the family here,
    never parses it back out of the folder's name."""

    family: str
    variant: str = ""

    @property
    def folder(self) -> str:
        return f"{self.family}-{self.variant}" if self.variant else self.family

    def wider(self, scope: str) -> "PassName":
        """The pass of this family that dumps the same step wider (``scope``: a dump scope)."""
        return PassName(self.family, scope)

    def __str__(self) -> str:
        return self.folder


PASS1 = PassName("pass1")                      # record: find the failing step, from step 1
LOCATE = PassName("locate")                    # record again from a kept state, keeping the state at the step
LOCATE_FROM_STEP_1 = PassName("locate", "from-step-1")   # ... from step 1, after a resumed locate pass diverged
PASS2 = PassName("pass2")                      # examine the step, from step 1
RESUMED = PassName("resumed")                  # examine it from pass 1's kept state
RESUMED_AT_STEP = PassName("resumed", "at-step")   # ... from the state kept at the step itself
EXAMINE = PassName("examine")                  # `hunt --from`: examine it from the failing run's kept state
EVERY_ITERATION = PassName("pass2", "every-iteration")   # dump every iteration when the step's was not observed


def from_step_1(scope: str) -> PassName:
    """The pass that dumps the step at ``scope`` from step 1 (no state kept at it)."""
    return PassName(PASS2.family, f"{scope}-from-step-1")


#: Folder names no module outside :mod:`mindguard.protocol` may spell (``resumed`` and ``examine`` are words in
#: other uses too: a resume route, a request's pass).
FOLDER_NAMES: Tuple[str, ...] = (DEFAULT_CAPTURE, DEFAULT_DUMP, PASS1.folder, LOCATE.folder, PASS2.folder,
                                 RESUMED_AT_STEP.folder, EVERY_ITERATION.folder)

#: The passes that examine a step by a dump or a replay (the page lists their dumps).
EXAMINE_FOLDERS: Tuple[str, ...] = (PASS2.folder, RESUMED.folder, RESUMED_AT_STEP.folder)


@dataclass(frozen=True)
class PassFolder:
    """One pass's folder in the run folder (:class:`RunFolder.pass_folder`)."""

    path: Path

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def record(self) -> Path:
        return self.path / RECORD

    @property
    def pass_status(self) -> Path:
        return pass_status_beside(self.record)

    @property
    def fast_forward_attempt(self) -> Path:
        """Where the pass's first attempt goes when its dataset reset computed something else (it runs again)."""
        return self.path.with_name(self.path.name + FAST_FORWARD_ATTEMPT_SUFFIX)

    @property
    def replay_report(self) -> Path:
        return self.path / REPLAY

    @property
    def dump_config(self) -> Path:
        return self.path / DUMP_CONFIG

    @property
    def output_log(self) -> Path:
        return self.path / OUTPUT_LOG

    @property
    def capture(self) -> Path:
        return self.path / CAPTURE

    @property
    def dump(self) -> Path:
        return self.path / DUMP

    @property
    def state(self) -> Path:
        return self.path / STATE

    @property
    def observe(self) -> Path:
        return self.path / OBSERVE


@dataclass(frozen=True)
class RunFolder:
    """A hunt's run folder (``root``): its own files, and one :class:`PassFolder` per pass."""

    root: Path

    def pass_folder(self, name: "PassName | str") -> PassFolder:
        return PassFolder(self.root / str(name))

    @property
    def command(self) -> Path:
        return self.root / COMMAND

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def report(self) -> Path:
        return self.root / REPORT

    @property
    def report_text(self) -> Path:
        return self.root / REPORT_TEXT

    @property
    def page(self) -> Path:
        return self.root / PAGE


# -- names that fit the file system ---------------------------------------------------------------------------
#: Bytes a name derived from a record adds to the record's name at most, with room to spare: ``.<run id>`` before
#: the suffix (``.20261203-130512-4194304``, a kept-aside copy's ``-<n>`` or ``earlier-`` more), ``.state``, a
#: leading ``.`` and ``.progress``/``.lock``.
DERIVED_ROOM = 40
NAME_MAX = 255   # the longest file name, when the file system cannot be asked
_FALLBACK_PREFIX = "mindguard-"   # <temp dir>/mindguard-<uid>/: records whose folder cannot be written
_FALLBACK_CACHE = (".cache", "mindguard", "records")   # ~/.cache/mindguard/records/: when the temp dir cannot be


def name_max(folder: PathLike) -> int:
    """The longest file name (bytes) the file system of ``folder`` takes: ``os.pathconf(..., "PC_NAME_MAX")`` of its
    nearest existing ancestor, :data:`NAME_MAX` when that cannot be told."""
    folder = Path(os.path.abspath(folder))
    while not os.path.isdir(folder) and folder != folder.parent:
        folder = folder.parent
    try:
        return int(os.pathconf(folder, "PC_NAME_MAX"))
    except (OSError, ValueError, AttributeError):   # (no pathconf off POSIX)
        return NAME_MAX


def _bytes(text: str) -> int:
    return len(os.fsencode(text))


def _cut(text: str, size: int) -> str:
    """``text``'s first characters, at most ``size`` bytes of them in the file system's encoding."""
    while text and _bytes(text) > size:
        text = text[:-max(1, (_bytes(text) - size) // 4)]
    return text


def short_digest(text: str) -> str:
    """8 hex digits of ``text``'s sha256: what tells two shortened names apart."""
    return hashlib.sha256(os.fsencode(text)).hexdigest()[:8]


def _fitted(record: Path) -> Tuple[str, str]:
    """``(stem, suffix)`` of the names derived from ``record`` (:func:`fitted_stem`)."""
    stem, suffix = record.stem, record.suffix
    limit = name_max(record.parent)
    if _bytes(record.name) + DERIVED_ROOM <= limit:
        return stem, suffix
    if _bytes(suffix) > 16:   # (not a file type: part of the name)
        stem, suffix = record.name, ""
    keep = max(limit - DERIVED_ROOM - _bytes(suffix) - 9, 1)
    return f"{_cut(stem, keep)}-{short_digest(record.name)}", suffix


def fitted_stem(record: PathLike) -> str:
    """The stem of every name derived from the record at ``record`` (:func:`run_record`, :func:`kept_states`,
    :func:`progress_beside`, :func:`record_lock`): the record's own; or, when the record's name leaves no room for
    what they add (:data:`DERIVED_ROOM`) on its file system (:func:`name_max`, 255 bytes on most), its first
    characters and :func:`short_digest` of its name (``xxx...x-1f3a9c02``) -- the same in every process that derives
    it."""
    return _fitted(Path(record))[0]


def fitted_record(record: PathLike) -> Path:
    """``record`` itself when its name fits its file system, else the name its derived files use
    (:func:`fitted_stem` and the suffix): a record mindguard can write."""
    record = Path(record)
    if _bytes(record.name) <= name_max(record.parent):
        return record
    stem, suffix = _fitted(record)
    return record.with_name(stem + suffix)


def fallback_folders(folder: PathLike) -> List[Path]:
    """Where an always-on Guard writes its record and keeps its states when ``folder``, where they were asked for,
    cannot be written (code on a read-only cluster mount), in order of preference: one folder per asked folder --
    its name and :func:`short_digest` of its path, so that every run started there finds the same record, keeps an
    earlier failure aside and cleans dead runs' states as beside the script -- under ``mindguard-<uid>/`` in the temp
    directory (``$TMPDIR``, else ``/tmp``...: room for training states, where home quotas are small), else under
    ``~/.cache/mindguard/records/``."""
    folder = Path(os.path.abspath(folder))
    leaf = f"{_cut(folder.name, 64) or 'root'}-{short_digest(str(folder))}"
    owner = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    found: List[Path] = []
    try:
        found.append(Path(tempfile.gettempdir()) / f"{_FALLBACK_PREFIX}{owner}" / leaf)
    except OSError:   # (no temp directory can be written)
        pass
    try:
        found.append(Path.home().joinpath(*_FALLBACK_CACHE) / leaf)
    except (RuntimeError, KeyError, OSError):   # (no home directory)
        pass
    return [path for path in found if path != folder]


def progress_beside(record: PathLike) -> Path:
    """Where an always-on Guard writes the record of the step in progress, through a memory map: a hidden file
    beside the record (``mindguard_failure.json`` -> ``.mindguard_failure.json.progress``); read with the record
    while it says ``running`` (:func:`mindguard.protocol.record.read_record_data`)."""
    record = Path(record)
    stem, suffix = _fitted(record)
    return record.with_name(f".{stem}{suffix}.progress")


def pass_status_beside(record: PathLike) -> Path:
    """Where the training process of a pass says how it ended: beside its record, per rank as the record is
    (``failure.json`` -> ``pass_status.json``, ``failure.rank1.json`` -> ``pass_status.rank1.json``)."""
    return _beside(record, PASS_STATUS)


def step_batch_beside(record: PathLike) -> Path:
    """Where an examine pass keeps the batch of the examined step when that step raised: beside its record, per
    rank as the record is (``failure.json`` -> ``step_batch.npz``, ``failure.rank1.json`` ->
    ``step_batch.rank1.npz``)."""
    return _beside(record, STEP_BATCH)


def _beside(record: PathLike, name: str) -> Path:
    """The file ``name`` beside ``record``, with the record's ``.rank<r>`` part when it has one."""
    record = Path(record)
    stem = Path(RECORD).stem
    rank = record.name[len(stem):-len(record.suffix)] if record.name.startswith(stem + ".rank") else ""
    return record.parent / f"{Path(name).stem}{rank}{Path(name).suffix}"


def replay_text(report: PathLike) -> Path:
    """The text of the replay report at ``report`` (``replay.json`` -> ``replay.txt``; per rank as well)."""
    return Path(report).with_suffix(REPLAY_TEXT_SUFFIX)


def replay_beside_capture(capture: PathLike) -> Path:
    """Where a Guard outside the hunt writes the replay of the step it captured into ``capture``
    (``mindguard_capture`` -> ``mindguard_capture_replay.json``)."""
    return Path(f"{capture}_{REPLAY}")


def state_meta(state: PathLike) -> Path:
    """A kept state's ``state.json``."""
    return Path(state) / STATE_META


def state_arrays(state: PathLike) -> Path:
    """A kept state's ``state.npz``."""
    return Path(state) / STATE_ARRAYS


def state_array_file(state: PathLike, index: int) -> Path:
    """A kept state's big array ``index`` (0-based, in the order of ``state.json``'s names) in a file of its own,
    ``p<index>.npy`` (``state.json``'s ``files`` lists them)."""
    return Path(state) / f"p{index}.npy"


def kept_states(record: PathLike) -> Path:
    """Where an always-on Guard keeps the training state for the record at ``record``: ``<stem>.state/`` beside
    it (``mindguard_failure.json`` -> ``mindguard_failure.state/``)."""
    record = Path(record)
    return record.with_name(fitted_stem(record) + KEPT_STATES_SUFFIX)


def run_states(record: PathLike, run_id: str) -> Path:
    """The folder of one run's kept states: ``<stem>.state/<run id>/`` beside the record the run was started with
    (``mindguard_failure.json``, run ``20261203-130512-4242`` -> ``mindguard_failure.state/20261203-130512-4242/``)."""
    return kept_states(record) / run_id


def run_info(states: PathLike) -> Path:
    """A run's identity file in its state folder (:func:`run_states`)."""
    return Path(states) / RUN_INFO


def run_lock(states: PathLike) -> Path:
    """The file a live run holds locked in its state folder (:func:`run_states`)."""
    return Path(states) / RUN_LOCK


def run_record(record: PathLike, run_id: str) -> Path:
    """A run's own record beside the usual one: ``<stem>.<run id><suffix>`` (``mindguard_failure.json`` ->
    ``mindguard_failure.20261203-130512-4242.json``): a failed run's (the path Guard prints), an earlier run's kept
    aside, or a run's whose usual record another live run holds."""
    record = Path(record)
    stem, suffix = _fitted(record)
    return record.with_name(f"{stem}.{run_id}{suffix}")


def run_records_pattern(record: PathLike) -> str:
    """The glob (in the record's folder) that lists :func:`run_record` files of ``record``."""
    stem, suffix = _fitted(Path(record))
    return f"{stem}.*{suffix}"


def record_lock(record: PathLike) -> Path:
    """The file the run writing the record at ``record`` holds locked (``.mindguard_failure.json.lock``): a second
    training started in the folder finds it held and writes a record of its own (:func:`run_record`)."""
    record = Path(record)
    stem, suffix = _fitted(record)
    return record.with_name(f".{stem}{suffix}{RUN_LOCK}")


def rank_state(resume: PathLike, rank: int, group_size: int) -> Path:
    """The kept state rank ``rank`` of ``group_size`` resumes from when the hunt asks it to resume from ``resume``:
    ``resume`` itself for one process; several ranks each load their own rank's, ``<resume>/rank<r>/`` (the hunt
    links each rank's kept state there). A hunt pass's keep folder is laid out the same way."""
    return Path(resume) if group_size <= 1 else Path(resume) / f"rank{rank}"


def kept_step(states: PathLike, step: int) -> Path:
    """The folder of the state kept at the beginning of 1-based global step ``step`` in ``states``."""
    return Path(states) / f"{KEPT_STEP_PREFIX}{step}"


def kept_step_pattern() -> str:
    """The glob that lists the ``step-<N>`` folders of :func:`kept_states`."""
    return f"{KEPT_STEP_PREFIX}*"
