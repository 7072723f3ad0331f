"""The data a run read, fingerprinted without reading it, and what changed since (mindguard.training.record.provenance).

Pure file-system facts: real files and folders in tmp_path, no MindSpore.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from mindguard.training.record import provenance

pytestmark = pytest.mark.fast


class _Stage:
    """A stand-in for a pipeline stage: MindSpore's source stages carry these attributes (the names are what the
    function reads; the attribute values are the user's paths)."""
    def __init__(self, **attributes: object):
        self.__dict__.update(attributes)


def test_the_source_stages_name_their_files_and_folders_once(tmp_path):
    stages = [_Stage(), _Stage(dataset_files=["a.mindrecord", "b.mindrecord"]), _Stage(dataset_dir="imgs"),
              _Stage(dataset_files="a.mindrecord", annotation_file="ann.json"), _Stage(source=object())]
    assert provenance.dataset_paths(stages) == ["a.mindrecord", "b.mindrecord", "imgs", "ann.json"]


def test_an_unchanged_file_and_folder_say_nothing(tmp_path):
    (tmp_path / "train.csv").write_text("1,2\n")
    (tmp_path / "imgs" / "cls").mkdir(parents=True)
    (tmp_path / "imgs" / "cls" / "0.jpg").write_bytes(b"x" * 10)
    kept = provenance.data_fingerprints(["train.csv", str(tmp_path / "imgs")], str(tmp_path))
    assert set(kept) == {"train.csv", "imgs"}
    assert kept["imgs"] == {"kind": "dir", "files": 1, "bytes": 10, "mtime_ns": kept["imgs"]["mtime_ns"],
                            "complete": True}
    assert provenance.data_changes(kept, str(tmp_path)) == []


def test_a_grown_file_a_new_image_and_a_missing_file_are_each_named(tmp_path):
    (tmp_path / "train.csv").write_text("1,2\n")
    (tmp_path / "val.csv").write_text("3,4\n")
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / "0.jpg").write_bytes(b"x" * 10)
    kept = provenance.data_fingerprints(["train.csv", "val.csv", "imgs"], str(tmp_path))
    (tmp_path / "train.csv").write_text("1,2\n5,6\n")
    (tmp_path / "imgs" / "1.jpg").write_bytes(b"y" * 5)
    os.remove(tmp_path / "val.csv")
    assert provenance.data_changes(kept, str(tmp_path)) == [
        "train.csv changed since the failure (4 -> 8 bytes)",
        "val.csv is missing",
        "imgs/ changed since the failure (1 -> 2 files, 10 -> 15 bytes)"]


def test_a_rewrite_of_the_same_size_is_seen_by_its_modification_time(tmp_path):
    data = tmp_path / "train.csv"
    data.write_text("1,2\n")
    kept = provenance.data_fingerprints([str(data)], str(tmp_path))
    data.write_text("3,4\n")
    os.utime(data, ns=(data.stat().st_atime_ns, data.stat().st_mtime_ns + 1_000_000))
    assert provenance.data_changes(kept, str(tmp_path)) == ["train.csv changed since the failure (modified since)"]


def test_a_huge_folder_is_summarised_not_walked(tmp_path, monkeypatch):
    monkeypatch.setattr(provenance, "MAX_DIR_ENTRIES", 20)
    for i in range(50):
        (tmp_path / f"{i}.bin").write_bytes(b"z")
    print_ = provenance.data_fingerprint(str(tmp_path))
    assert print_["kind"] == "dir" and print_["complete"] is False and print_["files"] == 20


def test_the_paths_are_shown_relative_to_the_runs_folder_when_under_it(tmp_path):
    outside = Path(os.path.realpath(tmp_path)) / "elsewhere.csv"
    outside.write_text("x")
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    kept = provenance.data_fingerprints([str(outside)], str(run_dir))
    assert list(kept) == [str(outside)]
