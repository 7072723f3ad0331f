"""The readers of what a training process leaves on disk, on damaged input: the failure record
(:mod:`mindguard.protocol.record`) and the kept state's ``state.json`` / ``state.npz``
(:func:`mindguard.training.state.resume.check_state`, :func:`~mindguard.training.state.resume.read_state_meta`).

A reader never takes a damaged, truncated or foreign file for a good one, and says which file and what is wrong
with it in one line. Pure Python and numpy: the files are written here the way the writers lay them out.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict

import numpy as np
import pytest

from mindguard.errors import RecordError
from mindguard.protocol import folder as layout
from mindguard.protocol.record import (FailureRecord, failing_iteration, failing_record, progress_problem,
                                       read_record_data)
from mindguard.training.state.resume import STATE_SCHEMA, check_state, read_state_meta

pytestmark = pytest.mark.fast


def _failed(**fields: Any) -> FailureRecord:
    """A record of a run that failed at global step 12 (epoch 2, step 4 of 8), dump iteration 11."""
    values: Dict[str, Any] = dict(status="failed", kind="nonfinite_loss", global_step=12, epoch=2, step_in_epoch=4,
                                  steps_per_epoch=8, dump_iteration=11, loss=float("nan"), nonfinite=["loss"],
                                  argv=["train.py"], cwd="/work")
    values.update(fields)
    return FailureRecord(**values)


# -- the failure record --------------------------------------------------------------------------------------------

def test_a_record_reads_back_as_written_with_a_non_finite_loss(tmp_path: Path) -> None:
    path = _failed().save(tmp_path / "mindguard_failure.json")
    assert json.loads(path.read_text())["loss"] == "nan"   # strict JSON: no bare NaN token
    back = FailureRecord.load(path)
    assert (back.status, back.kind, back.global_step, back.dump_iteration) == ("failed", "nonfinite_loss", 12, 11)
    assert back.loss != back.loss   # NaN
    assert failing_iteration(path) == 11


@pytest.mark.parametrize("cut", [1, 40, -2])
def test_a_truncated_record_is_refused_naming_the_file_and_the_json_error(tmp_path: Path, cut: int) -> None:
    whole = _failed().save(tmp_path / "whole.json").read_text()
    path = tmp_path / "cut.json"
    path.write_text(whole[:cut])
    with pytest.raises(RecordError, match=r"cut\.json.*is not valid JSON \(.* at line \d+ column \d+\)"):
        FailureRecord.load(path)


def test_a_record_that_is_not_utf8_is_refused_naming_the_byte(tmp_path: Path) -> None:
    path = tmp_path / "binary.json"
    data = b'{"schema": 2, "status": "\xff\xfe"}'
    path.write_bytes(data)
    with pytest.raises(RecordError, match=rf"binary\.json.*not UTF-8 text \(byte {data.index(0xFF)}\)"):
        FailureRecord.load(path)


def test_an_empty_or_missing_record_is_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.json").write_text("")
    with pytest.raises(RecordError, match=r"empty\.json.*is not valid JSON"):
        FailureRecord.load(tmp_path / "empty.json")
    with pytest.raises(RecordError, match=r"no failure record at .*absent\.json.*does not exist"):
        FailureRecord.load(tmp_path / "absent.json")


def test_a_record_too_large_to_be_one_is_not_read_whole(tmp_path: Path) -> None:
    path = tmp_path / "huge.json"
    path.write_text('{"schema": 2, "message": "' + "x" * (2 << 20) + '"}')
    with pytest.raises(RecordError, match=r"cannot read failure record .*huge\.json"):
        FailureRecord.load(path)


@pytest.mark.parametrize("document, problem", [
    ([1, 2], r"expected a JSON object .* got list"),
    ({"schema": 99, "status": "failed"}, r"not a mindguard failure record of schema 2 \(schema=99\)"),
    ({"status": "failed"}, r"schema=None"),
    ({"schema": 2, "status": "exploded"}, r"status must be one of .* got 'exploded'"),
    ({"schema": 2, "status": "failed", "kind": "oops"}, r"kind must be null or one of .* got 'oops'"),
    ({"schema": 2, "status": "failed", "global_step": "12"}, r"global_step must be an integer or null, got '12'"),
    ({"schema": 2, "status": "failed", "global_step": True}, r"global_step must be an integer or null, got True"),
    ({"schema": 2, "status": "failed", "global_step": -1}, r"global_step must be >= 0 or null, got -1"),
    ({"schema": 2, "status": "failed", "loss": "NaN!"}, r"loss must be a number, \"nan\", .* got 'NaN!'"),
    ({"schema": 2, "status": "failed", "failure_window": [9, 3]}, r"failure_window must be null or \[first, last\]"),
    ({"schema": 2, "status": "failed", "kept_state": {"path": 3}}, r"kept_state must be null or"),
    ({"schema": 2, "status": "failed", "nonfinite": "loss"}, r"nonfinite must be a list of names"),
])
def test_a_record_of_the_wrong_schema_or_shape_is_refused_naming_the_field(tmp_path: Path, document: Any,
                                                                            problem: str) -> None:
    path = tmp_path / "record.json"
    path.write_text(json.dumps(document))
    with pytest.raises(RecordError, match=problem):
        FailureRecord.load(path)


def test_a_record_of_a_newer_minor_version_keeps_its_known_fields(tmp_path: Path) -> None:
    data = _failed().to_dict()
    data["a_field_of_tomorrow"] = {"x": 1}
    path = tmp_path / "newer.json"
    path.write_text(json.dumps(data))
    assert FailureRecord.load(path).global_step == 12


def test_a_finished_or_stepless_record_names_no_failing_step(tmp_path: Path) -> None:
    finished = _failed(status="finished", kind=None).save(tmp_path / "finished.json")
    with pytest.raises(RecordError, match=r"finished without a failure; its step \(global step 12\)"):
        failing_record(finished)
    stepless = FailureRecord(status="running").save(tmp_path / "stepless.json")
    with pytest.raises(RecordError, match=r"names no step \(status 'running'\)"):
        failing_record(stepless)


def _running(tmp_path: Path, global_step: int) -> Path:
    return _failed(status="running", kind=None, global_step=global_step, loss=None).save(
        tmp_path / "mindguard_failure.json")


def test_the_progress_file_of_the_same_run_says_the_step_in_progress(tmp_path: Path) -> None:
    record = _running(tmp_path, 3)
    layout.progress_beside(record).write_text(json.dumps(_failed(status="running", kind=None, global_step=7,
                                                                 loss=None).to_dict()))
    assert read_record_data(record)["global_step"] == 7
    assert progress_problem(record) is None


def test_a_truncated_progress_file_is_named_and_the_record_alone_is_read(tmp_path: Path) -> None:
    record = _running(tmp_path, 3)
    whole = json.dumps(_failed(status="running", kind=None, global_step=7, loss=None).to_dict())
    layout.progress_beside(record).write_text(whole[: len(whole) // 2])
    assert read_record_data(record)["global_step"] == 3
    assert "is damaged" in (progress_problem(record) or "")


def test_a_progress_file_of_another_run_is_not_taken(tmp_path: Path) -> None:
    record = _running(tmp_path, 3)
    layout.progress_beside(record).write_text(json.dumps(_failed(status="running", kind=None, global_step=7,
                                                                 loss=None, argv=["other.py"]).to_dict()))
    assert read_record_data(record)["global_step"] == 3
    assert "is not this run's" in (progress_problem(record) or "")


def test_an_older_progress_file_does_not_move_the_step_back(tmp_path: Path) -> None:
    record = _running(tmp_path, 5)
    layout.progress_beside(record).write_text(json.dumps(_failed(status="running", kind=None, global_step=4,
                                                                 loss=None).to_dict()))
    assert read_record_data(record)["global_step"] == 5


# -- the kept state: state.json + state.npz ------------------------------------------------------------------------

def _kept_state(folder: Path, *, step: int = 9, run_id: str = "20261203-130512-4242") -> Dict[str, Any]:
    """A kept state laid out as :class:`mindguard.training.state.resume.KeptState` writes it (arrays first, then
    the json naming their checksum); returns the json written."""
    from mindguard._util.io import file_sha256

    folder.mkdir(parents=True)
    arrays = [np.arange(6, dtype=np.float32).reshape(2, 3), np.ones(3, dtype=np.float32)]
    np.savez(layout.state_arrays(folder), **{f"p{i}": a for i, a in enumerate(arrays)})
    meta = {"schema": STATE_SCHEMA, "step": step, "names": ["dense.weight", "dense.bias"], "run_id": run_id,
            "sha256": file_sha256(layout.state_arrays(folder)), "shapes": [list(a.shape) for a in arrays],
            "dtypes": [str(a.dtype) for a in arrays]}
    layout.state_meta(folder).write_text(json.dumps(meta))
    return meta


def test_a_complete_state_is_accepted(tmp_path: Path) -> None:
    meta = _kept_state(tmp_path / "step-9")
    assert check_state(tmp_path / "step-9", run_id=meta["run_id"], sha256=meta["sha256"]) == (meta, None)
    assert read_state_meta(tmp_path / "step-9") == meta


def test_a_truncated_state_json_is_named_damaged(tmp_path: Path) -> None:
    _kept_state(tmp_path / "step-9")
    meta_path = layout.state_meta(tmp_path / "step-9")
    meta_path.write_text(meta_path.read_text()[:-10])
    meta, why = check_state(tmp_path / "step-9")
    assert meta is None and why is not None
    assert str(meta_path) in why and "is damaged (not valid JSON" in why and "truncated?" in why
    with pytest.raises(ValueError):
        read_state_meta(tmp_path / "step-9")


@pytest.mark.parametrize("change", [{"schema": STATE_SCHEMA + 1}, {"step": "9"}, {"names": None},
                                   {"shapes": None}])
def test_a_state_json_of_another_schema_or_shape_is_refused(tmp_path: Path, change: Dict[str, Any]) -> None:
    meta = _kept_state(tmp_path / "step-9")
    meta.update(change)
    layout.state_meta(tmp_path / "step-9").write_text(json.dumps(meta))
    found, why = check_state(tmp_path / "step-9")
    assert found is None and f"is not a kept state of this mindguard (schema {STATE_SCHEMA}) or is damaged" in why
    if "schema" in change:
        assert read_state_meta(tmp_path / "step-9") is None


def test_a_state_json_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    _kept_state(tmp_path / "step-9")
    layout.state_meta(tmp_path / "step-9").write_text("[1, 2, 3]")
    assert check_state(tmp_path / "step-9")[0] is None
    assert read_state_meta(tmp_path / "step-9") is None


def test_a_state_of_another_run_or_checksum_is_refused(tmp_path: Path) -> None:
    meta = _kept_state(tmp_path / "step-9", run_id="20261203-130512-4242")
    found, why = check_state(tmp_path / "step-9", run_id="20261203-140000-1111")
    assert found is None and "kept by run 20261203-130512-4242, not by run 20261203-140000-1111" in why
    found, why = check_state(tmp_path / "step-9", sha256="0" * 64)
    assert found is None and "not the one the record names" in why
    assert check_state(tmp_path / "step-9", sha256=meta["sha256"])[1] is None


def test_a_damaged_or_missing_state_npz_is_refused(tmp_path: Path) -> None:
    _kept_state(tmp_path / "step-9")
    arrays = layout.state_arrays(tmp_path / "step-9")
    data = bytearray(arrays.read_bytes())
    data[len(data) // 2] ^= 0xFF
    arrays.write_bytes(bytes(data))
    found, why = check_state(tmp_path / "step-9")
    assert found is None and "is damaged or replaced" in why
    arrays.unlink()
    found, why = check_state(tmp_path / "step-9")
    assert found is None and f"{arrays} is missing" in why


def test_a_missing_state_folder_or_json_is_named(tmp_path: Path) -> None:
    found, why = check_state(tmp_path / "step-4")
    assert found is None and "its folder is missing" in why
    assert read_state_meta(tmp_path / "step-4") is None
    (tmp_path / "step-5").mkdir()
    found, why = check_state(tmp_path / "step-5")
    assert found is None and "state.json is missing" in why


def test_a_state_kept_for_its_dumps_analysis_holds_big_arrays_as_statistics_and_is_never_resumed(
        tmp_path: Path) -> None:
    """A hunt pass that dumped its failing step writes that step's state for the analysis alone: arrays of
    ``summarize_over`` bytes or more as their statistics (the counts the analysis reads of them), the rest as
    arrays. The analysis reads the statistics in place of the array; a resume refuses the state, naming why."""
    from mindguard._util.io import file_sha256
    from mindguard.analysis.report import _kept_state as analysed
    from mindguard.training.state.keeper import summarized_arrays

    table = np.full((64, 1024), 0.5, dtype=np.float32)
    table[3, 7], table[5, 0], table[9, 9] = np.nan, np.inf, 0.0
    bias = np.ones(3, dtype=np.float32)
    stats = summarized_arrays([table, bias], over=1024)
    assert list(stats) == [0], stats
    assert stats[0] == {"shape": [64, 1024], "dtype": "float32", "min": 0.0, "max": 0.5, "zeros": 1, "nan": 1,
                        "pos_inf": 1, "neg_inf": 0}, stats

    folder = tmp_path / "state"
    folder.mkdir()
    np.savez(layout.state_arrays(folder), p1=bias)
    layout.state_meta(folder).write_text(json.dumps({
        "schema": STATE_SCHEMA, "step": 17, "names": ["embedding.table", "fc.bias"], "shapes": [[64, 1024], [3]],
        "dtypes": ["float32", "float32"], "sha256": file_sha256(layout.state_arrays(folder)),
        "summarized": {str(i): s for i, s in stats.items()}}))
    found, why = check_state(folder)
    assert found is None and why == (f"the kept state in {folder} holds 1 Parameter(s) as statistics only (written "
                                     f"for its dumped step's analysis): not a state to resume from"), why

    kept = analysed(folder)
    table_file, bias_file = sorted(kept.files.values(), key=lambda f: f.op_name)
    assert table_file.path is None and table_file.stats == stats[0] and table_file.is_parameter, table_file
    assert bias_file.path == layout.state_arrays(folder) and bias_file.member == "p1", bias_file
