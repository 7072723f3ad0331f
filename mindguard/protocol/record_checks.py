"""Validating a decoded failure record (:meth:`.record.FailureRecord.from_dict`): each field's JSON type, its
closed vocabulary and its range, or a :class:`~mindguard.errors.RecordError` naming the source and the field."""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from ..errors import RecordError
from .record_json import loss_from_json
from .record_vocab import CALL_KINDS, EXAMINERS, KINDS, PHASES, READABLE_SCHEMAS, SCHEMA, STATUSES

_INT_FIELDS = ("epoch", "step_in_epoch", "global_step", "dump_iteration", "graph", "steps_per_epoch", "sink_size",
               "rank", "group_size", "seed", "stopped_by_rank", "seen_at_step", "params_finite_after", "params_checked")
_STR_FIELDS = ("device_target", "mindspore_version", "mindguard_version", "message", "time", "mode", "cwd", "run_id",
               "states")


def check_record_data(data: Any, source: str) -> Tuple[Optional[float], List[str]]:
    """``(loss, nonfinite)`` of the decoded record ``data`` (the loss as a float, ``"nan"``/``"inf"`` read back),
    once every field it holds is of the record's types and values; else :class:`RecordError` naming ``source``
    and the first field found wrong."""
    if not isinstance(data, dict):
        raise RecordError(f"{source}: expected a JSON object (a mindguard failure record), got "
                          f"{type(data).__name__}")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise RecordError(f"{source}: not a mindguard failure record of schema {SCHEMA} "
                          f"(schema={data.get('schema')!r}); was it written by a newer mindguard?")
    if data.get("status") not in STATUSES:
        raise RecordError(f"{source}: status must be one of {list(STATUSES)}, got {data.get('status')!r}")
    if data.get("kind") is not None and data["kind"] not in KINDS:
        raise RecordError(f"{source}: kind must be null or one of {list(KINDS)}, got {data['kind']!r}")
    if data.get("origin_kind") is not None and data["origin_kind"] not in KINDS:
        raise RecordError(f"{source}: origin_kind must be null or one of {list(KINDS)}, got "
                          f"{data['origin_kind']!r}")
    _check_types(data, source)
    _check_ranges(data, source)
    _check_objects(data, source)
    nonfinite = data.get("nonfinite") or []
    if not (isinstance(nonfinite, list) and all(isinstance(v, str) for v in nonfinite)):
        raise RecordError(f"{source}: nonfinite must be a list of names, got {nonfinite!r}")
    try:
        loss = loss_from_json(data.get("loss"))
    except (TypeError, ValueError):
        raise RecordError(f"{source}: loss must be a number, \"nan\", \"inf\", \"-inf\" or null, "
                          f"got {data.get('loss')!r}") from None
    return loss, list(nonfinite)


def _check_types(data: Dict[str, Any], source: str) -> None:
    """Each scalar and list field's JSON type, and the fields of a closed vocabulary (``mode``, ``examine``,
    ``phase``, ``call``'s ``kind``)."""
    for name in _INT_FIELDS:
        value = data.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise RecordError(f"{source}: {name} must be an integer or null, got {value!r}")
    for name in _STR_FIELDS:
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise RecordError(f"{source}: {name} must be a string or null, got {value!r}")
    sink = data.get("dataset_sink_mode")
    if sink is not None and not isinstance(sink, bool):
        raise RecordError(f"{source}: dataset_sink_mode must be true, false or null, got {sink!r}")
    window = data.get("iteration_range")
    if window is not None and not (isinstance(window, list) and len(window) == 2
                                   and all(isinstance(v, int) and not isinstance(v, bool) for v in window)):
        raise RecordError(f"{source}: iteration_range must be null or [first, last], got {window!r}")
    for name, allowed in (("mode", ("graph", "pynative")), ("examine", EXAMINERS), ("phase", PHASES)):
        if data.get(name) is not None and data[name] not in allowed:
            raise RecordError(f"{source}: {name} must be null or one of {list(allowed)}, got {data[name]!r}")
    call = data.get("call")
    if call is not None and not (isinstance(call, dict) and isinstance(call.get("index"), int)
                                 and not isinstance(call.get("index"), bool) and call["index"] >= 1
                                 and isinstance(call.get("network"), str) and call.get("kind") in CALL_KINDS):
        raise RecordError(f"{source}: call must be null or {{\"index\": n >= 1, \"network\": name, \"kind\": "
                          f"one of {list(CALL_KINDS)}}}, got {call!r}")
    window = data.get("step_window_us")
    if window is not None and not (isinstance(window, list) and len(window) == 2
                                   and all(isinstance(v, int) and not isinstance(v, bool) for v in window)):
        raise RecordError(f"{source}: step_window_us must be null or [start, end], got {window!r}")
    graphs = data.get("dump_graphs")
    if graphs is not None and not (isinstance(graphs, dict) and all(
            isinstance(k, str) and k.isdigit() and isinstance(v, int) and not isinstance(v, bool) and v >= 0
            for k, v in graphs.items())):
        raise RecordError(f"{source}: dump_graphs must be null or {{\"<graph id>\": <iteration>}}, got {graphs!r}")
    candidates = data.get("dump_candidates")
    if candidates is not None and not (isinstance(candidates, list) and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in candidates)):
        raise RecordError(f"{source}: dump_candidates must be null or a list of iterations >= 0, "
                          f"got {candidates!r}")
    observed = data.get("iteration_observed", False)
    if not isinstance(observed, bool):
        raise RecordError(f"{source}: iteration_observed must be true or false, got {observed!r}")


def _check_ranges(data: Dict[str, Any], source: str) -> None:
    """The integer fields' ranges (``>= 0``; ``sink_size`` -1 or positive) and the windows' order; the kept
    state's shape."""
    for name in _INT_FIELDS:
        value = data.get(name)
        if name == "sink_size":   # MindSpore's sink_size default is -1 (no sink window)
            if value is not None and (value < -1 or value == 0):
                raise RecordError(f"{source}: sink_size must be -1 (no sink), a positive count or null, "
                                  f"got {value!r}")
        elif value is not None and value < 0:
            raise RecordError(f"{source}: {name} must be >= 0 or null, got {value!r}")
    window = data.get("iteration_range")
    if window is not None and not 0 <= window[0] <= window[1]:
        raise RecordError(f"{source}: iteration_range must be null or [first, last] with 0 <= first <= last, "
                          f"got {window!r}")
    window = data.get("step_window_us")   # wall-clock: end < start only if the clock was set back
    if window is not None and min(window) < 0:
        raise RecordError(f"{source}: step_window_us must be null or [start, end] in microseconds >= 0, "
                          f"got {window!r}")
    window = data.get("failure_window")
    if window is not None and not (isinstance(window, list) and len(window) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in window) and window[0] <= window[1]):
        raise RecordError(f"{source}: failure_window must be null or [first, last] 1-based global steps, "
                          f"got {window!r}")
    kept = data.get("kept_state")
    if kept is not None and not (isinstance(kept, dict) and isinstance(kept.get("path"), str)
                                 and isinstance(kept.get("step"), int) and not isinstance(kept.get("step"), bool)):
        raise RecordError(f"{source}: kept_state must be null or {{\"path\": folder, \"step\": n}}, got {kept!r}")


def _check_objects(data: Dict[str, Any], source: str) -> None:
    """The object and list fields written only when set (``sources``, ``checkpoints``, ``costs``, ...)."""
    sources = data.get("sources")
    if sources is not None and not (isinstance(sources, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in sources.items())):
        raise RecordError(f"{source}: sources must be null or {{\"<path>\": \"<sha256>\"}}, got {sources!r}")
    data_sources = data.get("data_sources")
    if data_sources is not None and not (isinstance(data_sources, dict) and all(
            isinstance(k, str) and isinstance(v, dict) for k, v in data_sources.items())):
        raise RecordError(f"{source}: data_sources must be null or {{\"<path>\": {{fingerprint}}}}, "
                          f"got {data_sources!r}")
    checkpoints = data.get("checkpoints")
    if checkpoints is not None and not (isinstance(checkpoints, dict) and isinstance(
            checkpoints.get("poisoned", []), list) and all(
            isinstance(v, dict) and isinstance(v.get("path"), str) for v in checkpoints.get("poisoned", []))
            and (checkpoints.get("last_good") is None or isinstance(checkpoints.get("last_good"), dict))):
        raise RecordError(f"{source}: checkpoints must be null or {{\"from_step\": n, \"poisoned\": [{{\"path\": "
                          f"file, ...}}], \"last_good\": {{...}} | null}}, got {checkpoints!r}")
    raised_by = data.get("raised_by")
    if raised_by is not None and not (isinstance(raised_by, dict) and isinstance(raised_by.get("callback"), str)
                                      and isinstance(raised_by.get("hook"), str)):
        raise RecordError(f"{source}: raised_by must be null or {{\"callback\": name, \"hook\": name, \"line\": "
                          f"\"file:line\"}}, got {raised_by!r}")
    lost = data.get("checks_lost")
    if lost is not None and not (isinstance(lost, list) and all(
            isinstance(v, dict) and isinstance(v.get("check"), str) and isinstance(v.get("reason"), str)
            for v in lost)):
        raise RecordError(f"{source}: checks_lost must be null or a list of {{\"check\": name, \"from_step\": n, "
                          f"\"reason\": text}}, got {lost!r}")
    for key in ("argv", "unrestorable_random"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise RecordError(f"{source}: {key} must be null or a list of strings, got {value!r}")
    for key in ("loss_history", "learning_rate", "divergence"):
        value = data.get(key)
        if value is not None and not isinstance(value, dict):
            raise RecordError(f"{source}: {key} must be null or an object, got {value!r}")
    costs = data.get("costs")
    if costs is not None and not (isinstance(costs, dict) and all(
            v is None or (isinstance(v, (int, float)) and not isinstance(v, bool)) for v in costs.values())):
        raise RecordError(f"{source}: costs must be null or an object of numbers, got {costs!r}")
