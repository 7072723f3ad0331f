"""The run's record writer (mindguard.training.record.record_writer): the per-step record is the full record, a path
that cannot be written is said and never raised. Pure Python (no MindSpore): a Run is given its constant fields."""
from __future__ import annotations

import json

import pytest

from mindguard.training.record.record_writer import RecordWriter
from mindguard.errors import ArgumentError
from mindguard.protocol.folder import progress_beside
from mindguard.protocol.record import FailureRecord, read_record_data
from mindguard.protocol.record_json import one_line
from mindguard.training.run import Run, StepInfo, TrainingCall

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
    # (MindSpore's answer for one process)
    monkeypatch.setattr("mindguard.training.record.recorder.rank_info", lambda: (0, 1))
    run = Run()
    run.recorder.base = dict(BASE)   # what begin_call reads from MindSpore (recorder.constant_fields)
    call = TrainingCall(index=1, network="Net", kind="watch", key=object())
    run.calls.append(call)
    path = run.recorder.add_path(tmp_path / "record.json")
    progress = progress_beside(path)
    for cur_step in range(1, 5):
        info = run.begin_step(call, cur_step, batch_num=2, epoch=(cur_step + 1) // 2)
        on_disk = read_record_data(path)   # outside the hunt the step in progress is in the progress file
        assert _comparable(on_disk) == _comparable(run.recorder.record("running").to_dict()), cur_step
        assert on_disk["global_step"] == cur_step and on_disk["step_in_epoch"] == (cur_step - 1) % 2 + 1
        assert json.loads(progress.read_text()) == on_disk and progress.stat().st_size == 4096
        assert json.loads(path.read_text())["global_step"] == 1, "the record itself is written whole, not per step"
        assert FailureRecord.load(path).global_step == cur_step
        run.end_step(info)
    run.end_exit()
    assert json.loads(path.read_text())["status"] == "finished" and not progress.exists()
    assert read_record_data(path)["status"] == "finished"


def test_a_progress_file_of_another_command_is_not_read_with_the_record(tmp_path):
    path = tmp_path / "record.json"
    path.write_text(json.dumps({**BASE, "status": "running", "global_step": 3}))
    other = {**BASE, "status": "running", "global_step": 9, "argv": ["python", "other.py"]}
    progress_beside(path).write_text(json.dumps(other))
    assert read_record_data(path)["global_step"] == 3
    progress_beside(path).write_text(json.dumps({**other, "argv": BASE["argv"]}))
    assert read_record_data(path)["global_step"] == 9
    progress_beside(path).write_text("{ half a docu")
    assert read_record_data(path)["global_step"] == 3


def test_the_first_progress_write_asks_for_the_full_record(tmp_path):
    writer = RecordWriter(under_hunt=False, cannot_write=None)
    assert writer.add(tmp_path / "record.json") and not writer.add(tmp_path / "record.json")
    call = TrainingCall(index=1, network="Net", kind="watch")
    assert writer.write_progress(StepInfo(global_step=1, call=call), BASE) is False   # no slot yet
    writer.write(FailureRecord(status="running", **BASE))
    assert writer.write_progress(StepInfo(global_step=2, call=call), BASE) is True
    assert read_record_data(tmp_path / "record.json")["global_step"] == 2
    writer.close()
    progress_beside(tmp_path / "record.json").unlink()   # gone (removed by hand): the next step asks again
    assert writer.write_progress(StepInfo(global_step=3, call=call), BASE) is False


def test_under_the_hunt_every_step_is_written_into_the_record_itself(tmp_path):
    writer = RecordWriter(under_hunt=True, cannot_write=None)
    writer.add(tmp_path / "record.json")
    call = TrainingCall(index=1, network="Net", kind="watch")
    writer.write(FailureRecord(status="running", **BASE))
    assert writer.write_progress(StepInfo(global_step=2, call=call), BASE) is True
    assert json.loads((tmp_path / "record.json").read_text())["global_step"] == 2
    assert not progress_beside(tmp_path / "record.json").exists()
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


def test_a_message_of_many_lines_is_said_on_one():
    dataset = ("RuntimeError: Exception thrown from user defined Python function in dataset.\n\n---\n"
               "- Python Call Stack:\nTraceback (most recent call last):\n  File \"train.py\", line 61, in "
               "__getitem__\nValueError: corrupt image file 0158.png: truncated PNG chunk\n\n- C++ Call Stack:\n"
               "generator_op.cc(383).")
    assert one_line(dataset) == ("RuntimeError: Exception thrown from user defined Python function in dataset. ... "
                                 "ValueError: corrupt image file 0158.png: truncated PNG chunk [8 lines: the record's "
                                 "message]")
    kernel = "RuntimeError: For 'Gather', ... but got 50\n\n----\n- C++ Call Stack:\nmindspore/ccsrc/gather.cc(58)"
    assert one_line(kernel) == "RuntimeError: For 'Gather', ... but got 50 [4 lines: the record's message]"
    assert one_line("loss became non-finite (loss=nan)") == "loss became non-finite (loss=nan)"
