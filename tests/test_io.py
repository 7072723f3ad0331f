"""The file and environment helpers every writer and reader relies on."""
from __future__ import annotations

import json

import numpy as np
import pytest

from mindguard._util.io import JsonSlot, atomic_write_bytes, atomic_write_json, load_npy, save_npy


def test_atomic_write_leaves_no_temp_files_and_replaces_whole(tmp_path):
    path = tmp_path / "sub" / "record.json"
    atomic_write_json(path, {"step": 1})
    atomic_write_json(path, {"step": 2, "message": "x" * 10000})
    assert json.loads(path.read_text()) == {"step": 2, "message": "x" * 10000}
    assert sorted(p.name for p in path.parent.iterdir()) == ["record.json"]


def test_json_slot_rewrites_in_place_at_a_fixed_size(tmp_path):
    path = tmp_path / "record.json"
    slot = JsonSlot(path, size=512)
    assert not slot.write({"step": 1}), "no file yet: the caller must create it atomically first"
    atomic_write_bytes(path, slot.padded({"step": 1}))
    slot.reopen()
    inode = path.stat().st_ino
    for step in (2, 3, 1000):
        assert slot.write({"step": step, "status": "running"})
        assert path.stat().st_size == 512 and path.stat().st_ino == inode
        assert json.loads(path.read_text()) == {"step": step, "status": "running"}  # padding is whitespace
    assert slot.padded({"message": "y" * 600}) is None and not slot.write({"message": "y" * 600})
    assert json.loads(path.read_text())["step"] == 1000, "a document too large for the slot must not be written"
    atomic_write_json(path, {"status": "finished"})       # replaced by rename: the slot no longer matches it
    # within recheck_seconds a write may still go to the replaced (unlinked) file, never into the new one
    slot.write({"step": 1001})
    assert json.loads(path.read_text()) == {"status": "finished"}
    slot.recheck_seconds = 0.0
    assert not slot.write({"step": 1002}), "writing through a stale descriptor would lose the update"
    assert json.loads(path.read_text()) == {"status": "finished"}
    slot.close()


def test_json_slot_shrinking_documents_leave_no_tail(tmp_path):
    path = tmp_path / "record.json"
    slot = JsonSlot(path, size=256)
    atomic_write_bytes(path, slot.padded({"message": "x" * 100}))
    slot.reopen()
    assert slot.write({"message": "y" * 150})
    assert slot.write({"step": 2})          # shorter than the document before it: its tail becomes spaces
    assert json.loads(path.read_text()) == {"step": 2} and path.stat().st_size == 256
    for doc in ({"message": "z" * 60}, {"m": "w" * 30}, {"s": 1}, {"message": "v" * 200}, {"t": 0}):
        assert slot.write(doc)   # each write pads only over what the one before it held
        assert json.loads(path.read_text()) == doc and path.read_bytes().rstrip().endswith(b"}")
        assert path.stat().st_size == 256
    slot.close()


def test_npy_round_trip_and_pickles_are_refused(tmp_path):
    save_npy(tmp_path / "a.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    assert load_npy(tmp_path / "a.npy").tolist() == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(TypeError, match="object array"):
        save_npy(tmp_path / "b.npy", np.array([{"x": 1}], dtype=object))
    np.save(tmp_path / "evil.npy", np.array([{"x": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(ValueError, match="allow_pickle"):
        load_npy(tmp_path / "evil.npy")


def test_json_slot_survives_the_file_being_truncated_under_it(tmp_path):
    """Someone empties the record in place (``> mindguard_failure.json``) while training writes it: the next write
    must neither crash the process nor leave a broken document."""
    import os

    path = tmp_path / "record.json"
    slot = JsonSlot(path, size=256)
    atomic_write_bytes(path, slot.padded({"step": 1}))
    slot.reopen()
    os.truncate(path, 0)
    assert slot.write({"step": 2})
    assert json.loads(path.read_text()) == {"step": 2} and path.stat().st_size == 256
    slot.close()


def test_mapped_slot_stores_in_place_and_notices_a_replaced_file(tmp_path):
    from mindguard._util.io import MappedSlot

    path = tmp_path / ".record.json.progress"
    slot = MappedSlot(path, json.dumps({"step": 1, "message": "x" * 100}) + "\n", size=512)
    inode = path.stat().st_ino
    for doc in ({"step": 2}, {"step": 3, "message": "y" * 300}, {"s": 4}):
        assert slot.write_text(json.dumps(doc) + "\n")   # a store into the map: the file follows
        assert json.loads(path.read_text()) == doc and path.stat().st_size == 512 and path.stat().st_ino == inode
    assert not slot.write_text(json.dumps({"message": "z" * 600}) + "\n")
    assert json.loads(path.read_text()) == {"s": 4}, "a document too large for the slot must not be written"
    atomic_write_json(path, {"replaced": True})
    slot.recheck_seconds = 0.0
    assert not slot.write_text(json.dumps({"step": 5}) + "\n"), "the map is of a file no longer at that path"
    assert json.loads(path.read_text()) == {"replaced": True}
    slot.close(remove=True)
    assert not path.exists()
