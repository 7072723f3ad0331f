"""A kept training state as both sides of the hunt read it: its ``state.json`` (:func:`read_state_meta`, typed:
:class:`StateMeta`), whether a state folder is complete and the record's own (:func:`check_state`), which state
``mindguard hunt --from`` resumes a record's failure from (:func:`choose_kept_state`), and the sentences that
describe it (:func:`describe_state`, :func:`unrestorable_note`).

The training side writes and loads states (:mod:`mindguard.training.state.keeper`,
:mod:`mindguard.training.state.resumer`) and re-exports these readers (:mod:`mindguard.training.state.resume`); the hunt
reads them from here and never imports the training side. Pure file reading: imports neither MindSpore nor numpy.

Files: ``<dir>/state.json`` (schema :data:`STATE_SCHEMA`), ``<dir>/state.npz`` and the big arrays'
``<dir>/p<i>.npy`` (``state.json``'s ``files``, with their sha256). Steps are 1-based, process-wide global steps;
sizes are bytes; times are ``time.time()`` seconds (epoch), durations seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from .._util.io import file_sha256, read_json
from . import folder as layout

#: ``state.json``'s format version: a reader takes no other.
STATE_SCHEMA = 1

#: what makes a run with a random kernel resumable, in the words of the fallback reason
FIX = ("`mindguard hunt --from` resumes all the same and says whether the failure repeats with other masks (a failure "
       "from the data or the weights does); for the failing run's own masks it runs from step 1, where the kernels "
       "start as they did (seeded with mindguard.fix_randomness)")


def _number(value: Any) -> Optional[float]:
    """``value`` as a float when it is a JSON number (not a bool), else ``None``."""
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _integer(value: Any, default: int = 0) -> int:
    """``value`` when it is a JSON integer (not a bool), else ``default``."""
    return value if isinstance(value, int) and not isinstance(value, bool) else default


@dataclass(frozen=True)
class StateMeta:
    """The fields of a kept state's ``state.json`` the hunt (the parent process) reads, typed. Read leniently, as the
    parent always read them: a missing or mistyped field takes its default.

    ``step``: the 1-based global step the state was kept at the beginning of (0: not said); ``names``: its
    Parameters, in order; ``nbytes``: the state's size in bytes (0: not said); ``step_seconds``: the failing run's
    time a step (seconds); ``process_started``/``first_step_end``: when the keeping process started and its first step
    ended (``time.time()`` seconds); ``summarized``: how many Parameters are kept as statistics only (such a state
    serves its step's analysis, never a resume); ``checkpoint_path``: the training's own checkpoint the state names
    (an always-on Guard's ``CheckpointPoint``); ``unrestorable``/``mindspore``: the
    random sources the state cannot hold and the MindSpore version that says so; ``trace``: the exact text of the
    values each step (by 1-based global step as text) computed after it was kept; ``call``: the 1-based training call
    the step belongs to; ``dump_graphs``: the step's observed ``{graph: dump iteration}`` (0-based iterations);
    ``warm_up``: how many steps before ``step`` a pass resumed from it runs for real first (MindSpore's kernels are
    launched as often as in the failing run: ``mindguard.training.state.warm_up``), so that ``step`` is the train
    graph's dump iteration ``warm_up`` of such a pass (0: a state kept before this field was).
    """

    step: int = 0
    names: Tuple[str, ...] = ()
    nbytes: int = 0
    step_seconds: Optional[float] = None
    process_started: Optional[float] = None
    first_step_end: Optional[float] = None
    summarized: int = 0
    checkpoint_path: Optional[str] = None
    unrestorable: Tuple[str, ...] = ()
    mindspore: Optional[str] = None
    trace: Mapping[str, Sequence[Optional[str]]] = field(default_factory=dict)
    call: int = 1
    dump_graphs: Mapping[str, int] = field(default_factory=dict)
    warm_up: int = 0

    @classmethod
    def from_json(cls, meta: Mapping[str, Any]) -> "StateMeta":
        """The typed view of a ``state.json`` object (:func:`read_state_meta`'s)."""
        checkpoint = meta.get("checkpoint")
        path = checkpoint.get("path") if isinstance(checkpoint, dict) else None
        rng = meta.get("rng")
        rng = rng if isinstance(rng, dict) else {}
        sources = rng.get("unrestorable")
        version = rng.get("mindspore")
        names, trace, graphs = meta.get("names"), meta.get("trace"), meta.get("dump_graphs")
        summarized = meta.get("summarized")
        return cls(step=_integer(meta.get("step")),
                   names=tuple(str(n) for n in names) if isinstance(names, list) else (),
                   nbytes=_integer(meta.get("bytes")),
                   step_seconds=_number(meta.get("step_seconds")),
                   process_started=_number(meta.get("process_started")),
                   first_step_end=_number(meta.get("first_step_end")),
                   summarized=len(summarized) if isinstance(summarized, (dict, list)) else int(bool(summarized)),
                   checkpoint_path=path if isinstance(path, str) and path else None,
                   unrestorable=tuple(str(s) for s in sources) if isinstance(sources, list) else (),
                   mindspore=version if isinstance(version, str) else None,
                   trace={str(k): list(v) for k, v in trace.items() if isinstance(v, list)}
                   if isinstance(trace, dict) else {},
                   call=_integer(meta.get("call"), 1),
                   dump_graphs={str(k): int(v) for k, v in graphs.items() if isinstance(v, int)}
                   if isinstance(graphs, dict) else {},
                   warm_up=max(_integer(meta.get("warm_up")), 0))


#: What the hunt's rules take for a kept state: the typed view, or ``state.json``'s object as read.
StateLike = Union[StateMeta, Mapping[str, Any]]


def as_state_meta(meta: Optional[StateLike]) -> Optional[StateMeta]:
    """``meta`` typed (``None`` stays ``None``)."""
    if meta is None or isinstance(meta, StateMeta):
        return meta
    return StateMeta.from_json(meta)


def read_state_meta(directory: Path) -> Optional[Dict[str, Any]]:
    """The ``state.json`` of a kept state, or ``None`` when ``directory`` holds none or one of another schema
    (``ValueError`` when it is not JSON: :func:`check_state` says why in one line)."""
    path = layout.state_meta(directory)
    if not path.is_file():
        return None
    meta = read_json(path)
    return meta if isinstance(meta, dict) and meta.get("schema") == STATE_SCHEMA else None


def read_state(directory: Path) -> Optional[StateMeta]:
    """:func:`read_state_meta`, typed."""
    return as_state_meta(read_state_meta(directory))


def describe_state(meta: StateLike) -> str:
    """``"global step 500 (12 Parameters, 3.2 MB, the training's checkpoint net-5_100.ckpt)"``."""
    typed = StateMeta.from_json(meta) if not isinstance(meta, StateMeta) else meta
    source = f", the training's checkpoint {Path(typed.checkpoint_path).name}" if typed.checkpoint_path else ""
    return f"global step {typed.step} ({len(typed.names)} Parameters, {typed.nbytes / 1e6:.1f} MB{source})"


def describe_unrestorable(sources: Optional[Sequence[str]], version: Optional[str] = None) -> Optional[str]:
    """One sentence naming the random sources a kept state could not hold, with the fix; ``None`` when none."""
    if not sources:
        return None
    on = f"MindSpore {version}" if version else "this MindSpore"
    what = ", ".join(sources[:3]) + (f" and {len(sources) - 3} more" if len(sources) > 3 else "")
    verb = "draws" if len(sources) == 1 else "draw"
    return (f"{what} {verb} from a random kernel whose state is not restorable on {on} (a resumed step draws "
            f"other masks than the failing run's): {FIX}")


def unrestorable_note(meta: Optional[StateLike]) -> Optional[str]:
    """Why a resume from the kept state ``meta`` (its ``state.json``) cannot compute what the failing run did,
    with the fix; ``None`` when its random state is all restorable."""
    if isinstance(meta, StateMeta):
        return describe_unrestorable(list(meta.unrestorable), meta.mindspore)
    rng = (meta or {}).get("rng")
    if not isinstance(rng, dict):
        return None
    return describe_unrestorable(rng.get("unrestorable"), rng.get("mindspore"))


# -- checking and choosing a state -----------------------------------------------------------------------------
def check_state(directory: Path, *, run_id: Optional[str] = None, sha256: Optional[str] = None
                ) -> Tuple[Optional[Dict[str, Any]], Optional[str]]:
    """``(state.json, None)`` when ``directory`` holds a complete state of run ``run_id`` whose ``state.npz`` is
    the one its ``state.json`` (and the record: ``sha256``) was written with; else ``(None, why)``, one line."""
    directory = Path(directory)
    meta_path, arrays = layout.state_meta(directory), layout.state_arrays(directory)
    if not directory.is_dir():
        return None, f"the kept training state {directory} is gone or unreadable (its folder is missing)"
    try:
        meta = read_json(meta_path)
    except FileNotFoundError:
        return None, f"{meta_path} is missing (the write of the state was cut short?)"
    except (OSError, ValueError) as exc:
        return None, f"{meta_path} is damaged ({_short(exc)})"
    if not isinstance(meta, dict) or meta.get("schema") != STATE_SCHEMA or not isinstance(meta.get("step"), int) \
            or not isinstance(meta.get("names"), list) or not _arrays_described(meta):
        return None, f"{meta_path} is not a kept state of this mindguard (schema {STATE_SCHEMA}) or is damaged"
    if meta.get("summarized"):
        return None, (f"the kept state in {directory} holds {len(meta['summarized'])} Parameter(s) as statistics only "
                      f"(written for its dumped step's analysis): not a state to resume from")
    if run_id is not None and meta.get("run_id") not in (None, run_id):
        return None, (f"the kept state in {directory} was kept by run {meta.get('run_id')}, not by run {run_id} whose "
                      f"record this is (copied from another run?)")
    if sha256 is not None and meta.get("sha256") not in (None, sha256):
        return None, (f"the kept state in {directory} is not the one the record names (its checksum differs: "
                      f"replaced by another run's state?)")
    if not arrays.is_file():
        return None, f"{arrays} is missing (the write of the state was cut short?)"
    if meta.get("sha256") is not None and file_sha256(arrays) != meta["sha256"]:
        return None, f"{arrays} is damaged or replaced (its checksum is not the one {meta_path} was written with)"
    bad = damaged_file(directory, meta)
    if bad is not None:
        return None, bad
    return meta, None


def damaged_file(directory: Path, meta: Mapping[str, Any]) -> Optional[str]:
    """Why one of the big arrays' own files ``state.json`` lists (``files``: ``p<i>.npy`` and its checksum) is not
    the one it was written with -- missing, damaged or replaced --, or ``None``."""
    files = meta.get("files") or {}
    if not isinstance(files, dict):
        return f"{layout.state_meta(directory)} is damaged (its `files` is not an object)"
    for index, entry in sorted(files.items()):
        path = layout.state_array_file(directory, int(index)) if str(index).isdigit() else None
        if path is None or not isinstance(entry, dict):
            return f"{layout.state_meta(directory)} is damaged (its `files` names {index!r})"
        if not path.is_file():
            return f"{path} is missing (the write of the state was cut short?)"
        if file_sha256(path) != entry.get("sha256"):
            return f"{path} is damaged or replaced (its checksum is not the one {layout.state_meta(directory)} names)"
    return None


def _arrays_described(meta: Mapping[str, Any]) -> bool:
    """Whether ``meta`` says where its Parameters' values are: ``shapes`` of the arrays in ``state.npz``, or the
    training's own ``checkpoint`` file (an always-on Guard's ``CheckpointPoint``)."""
    if "checkpoint" in meta:
        return isinstance(meta["checkpoint"], dict) and isinstance(meta["checkpoint"].get("path"), str)
    return isinstance(meta.get("shapes"), list)


def _short(exc: BaseException) -> str:
    if isinstance(exc, ValueError) and type(exc).__name__ == "JSONDecodeError":
        return f"not valid JSON: {getattr(exc, 'msg', exc)} at line {getattr(exc, 'lineno', '?')}: truncated?"
    return str(getattr(exc, "strerror", None) or exc)


def last_complete_state(states: Path, upto: int, *, run_id: Optional[str] = None, skip: Optional[Path] = None
                        ) -> Tuple[Optional[Path], Optional[Dict[str, Any]]]:
    """The latest complete, undamaged state (:func:`check_state`) of run ``run_id`` in its folder ``states``
    kept at a global step in ``2..upto``, other than ``skip``; ``(None, None)`` when there is none."""
    found: List[Tuple[int, Path]] = []
    for folder in Path(states).glob(layout.kept_step_pattern()):
        tail = folder.name[len(layout.KEPT_STEP_PREFIX):]
        if tail.isdigit() and 1 < int(tail) <= upto and folder != skip:
            found.append((int(tail), folder))
    for _, folder in sorted(found, reverse=True):
        meta, _ = check_state(folder, run_id=run_id)
        if meta is not None and 1 < int(meta["step"]) <= upto:
            return folder, meta
    return None, None


def choose_kept_state(record: Mapping[str, Any], upto: int) -> Tuple[Optional[Path], Optional[Dict[str, Any]],
                                                                     Optional[str]]:
    """The state ``mindguard hunt --from`` resumes ``record``'s failure from: ``(folder, state.json, note)``.

    The state the record names when it is complete, undamaged and the record's own (its run id and checksum);
    otherwise -- or when the record names none (the run was killed, or killed while writing it at the failure) --
    the last complete state of the run on disk (its ``states`` folder) kept at or before ``upto`` (the failure's
    first possible 1-based global step), and ``note`` says why; ``(None, None, why)`` when there is none."""
    kept: Dict[str, Any] = record["kept_state"] if isinstance(record.get("kept_state"), dict) else {}
    run_id = record.get("run_id") if isinstance(record.get("run_id"), str) else None
    named = Path(kept["path"]) if isinstance(kept.get("path"), str) else None
    why: Optional[str] = None
    if named is not None:
        meta, why = check_state(named, run_id=run_id or kept.get("run_id"), sha256=kept.get("sha256"))
        if meta is not None:
            return named, meta, None
    states = record.get("states")
    if not isinstance(states, str) and named is not None and run_id is not None and named.parent.name == run_id:
        states = str(named.parent)
    if isinstance(states, str) and run_id is not None:
        folder, meta = last_complete_state(Path(states), upto, run_id=run_id, skip=named)
        if folder is not None and meta is not None:
            how = (f"{why}; resuming from the run's earlier state" if why else
                   "the record names no kept state (the run was killed, or killed while writing it); resuming from "
                   "the last complete state on disk")
            return folder, meta, f"{how}, kept at global step {meta['step']} ({folder})"
    if why is None and named is None:
        why = ("the run kept no training state (Guard keeps one about every second of training once its Parameters "
               "were checked finite, with keep_state=True)")
    return None, None, why


def choose_state(record: Mapping[str, Any], upto: int) -> Tuple[Optional[Path], Optional[StateMeta], Optional[str]]:
    """:func:`choose_kept_state`, its ``state.json`` typed."""
    folder, meta, note = choose_kept_state(record, upto)
    return folder, as_state_meta(meta), note


__all__ = ["FIX", "STATE_SCHEMA", "StateLike", "StateMeta", "as_state_meta", "check_state", "choose_kept_state",
           "choose_state", "damaged_file", "describe_state", "describe_unrestorable", "last_complete_state",
           "read_state", "read_state_meta", "unrestorable_note"]
