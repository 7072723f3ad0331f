"""The run's record writer (mindguard._record_writer): the per-step record is the full record, a path that
cannot be written is said and never raised. Pure Python (no MindSpore): a Run is given its constant fields."""
from __future__ import annotations

import json

import pytest

from mindguard._record_writer import RecordWriter
from mindguard.errors import ArgumentError
from mindguard.record import FailureRecord
from mindguard.run import Run, StepInfo, TrainingCall

pytestmark = pytest.mark.fast

BASE = {"rank": 0, "group_size": 1, "device_target": "CPU", "mindspore_version": "2.10.0", "seed": 7,
        "mode": "pynative", "examine": "replay", "argv": ["python", "train.py"], "cwd": "/home/user"}


def _comparable(document: dict) -> dict:
    """The record without what changes between two reads of the clock."""
    document = dict(document)
    document.pop("time", None)
    document["step_window_us"] = document["step_window_us"][:1]
    return document


def test_every_steps_running_record_is_the_record_the_run_would_write(tmp_path, monkeypatch):
    monkeypatch.setattr("mindguard.run.rank_info", lambda: (0, 1))   # (MindSpore's answer for one process)
    run = Run()
    run._base = dict(BASE)   # what begin_call reads from MindSpore (_constant_fields)
    call = TrainingCall(index=1, network="Net", kind="watch", key=object())
    run.calls.append(call)
    path = run.add_record_path(tmp_path / "record.json")
    for cur_step in range(1, 5):
        info = run.begin_step(call, cur_step, batch_num=2, epoch=(cur_step + 1) // 2)
        on_disk = json.loads(path.read_text())
        assert _comparable(on_disk) == _comparable(run._record("running").to_dict()), cur_step
        assert on_disk["global_step"] == cur_step and on_disk["step_in_epoch"] == (cur_step - 1) % 2 + 1
        run.end_step(info)
    run.end_exit()
    assert json.loads(path.read_text())["status"] == "finished"


def test_the_first_progress_write_asks_for_the_full_record(tmp_path):
    writer = RecordWriter(under_hunt=False, cannot_write=None)
    assert writer.add(tmp_path / "record.json") and not writer.add(tmp_path / "record.json")
    call = TrainingCall(index=1, network="Net", kind="watch")
    assert writer.write_progress(StepInfo(global_step=1, call=call), BASE) is False   # no slot yet
    writer.write(FailureRecord(status="running", **BASE))
    assert writer.write_progress(StepInfo(global_step=2, call=call), BASE) is True
    assert json.loads((tmp_path / "record.json").read_text())["global_step"] == 2
    writer.close()


def test_a_removed_pass_folder_is_said_not_raised_nor_recreated(tmp_path):
    said = []
    writer = RecordWriter(under_hunt=True, cannot_write=lambda *args, **kwargs: said.append(args))
    path = tmp_path / "pass1" / "record.json"
    writer.add(path)
    writer.write(FailureRecord(status="failed", kind="exception", **BASE), fsync=True)
    assert [(what, target) for what, target, _ in said] == [("the failure record", path)]
    assert isinstance(said[0][2], FileNotFoundError) and not path.parent.exists()


def test_a_file_that_is_no_record_is_never_replaced(tmp_path):
    other = tmp_path / "notes.json"
    other.write_text("[1, 2]")
    with pytest.raises(ArgumentError, match="not a mindguard failure record"):
        RecordWriter(under_hunt=False, cannot_write=None).add(other)
    assert other.read_text() == "[1, 2]"
