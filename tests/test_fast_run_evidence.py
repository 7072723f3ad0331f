"""The rules that keep a failure's evidence bound to its run, without MindSpore: which record path a run claims,
what a new run keeps aside, which state folders are stale, which kept state `hunt --from` may use, and what an
edit of the project is called. (tests/test_evidence.py runs each fault on real trainings.)"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from mindguard.training.record import provenance as _provenance
from mindguard.training.record.record_writer import claim, held_by_a_live_run
from mindguard.training.state.resume import check_state, choose_kept_state, clean_stale_states
from mindguard.protocol import folder as layout
from mindguard.protocol.record import FailureRecord

pytestmark = pytest.mark.fast


def failed(run_id, **fields) -> FailureRecord:
    return FailureRecord(status="failed", kind="nonfinite_loss", global_step=7, run_id=run_id, **fields)


def write_state(folder: Path, step: int, run_id: str) -> dict:
    """A complete kept state as StateKeeper writes it (state.npz, then state.json with its checksum)."""
    folder.mkdir(parents=True)
    np.savez(folder / "state.npz", p0=np.arange(6, dtype=np.float32))
    meta = {"schema": 1, "step": step, "names": ["w"], "shapes": [[6]], "run_id": run_id,
            "sha256": hashlib.sha256((folder / "state.npz").read_bytes()).hexdigest()}
    (folder / "state.json").write_text(json.dumps(meta))
    return meta


HOLDER = """
import os, sys, time
from pathlib import Path
from mindguard.training.record.record_writer import _lock
fd, _ = _lock(Path(sys.argv[1]))
Path(sys.argv[2]).touch()
time.sleep(120)
"""


def test_a_live_runs_path_is_not_claimed_and_a_dead_runs_lock_is_free(tmp_path):
    record = tmp_path / "mindguard_failure.json"
    ready = tmp_path / "ready"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(layout.record_lock(record)), str(ready)],
                              env=dict(os.environ))
    try:
        while not ready.exists():
            assert holder.poll() is None, "the holder died"
            time.sleep(0.01)
        assert held_by_a_live_run(layout.record_lock(record))
        path, fd = claim(record, "20261203-130512-2")
        assert path == tmp_path / "mindguard_failure.20261203-130512-2.json" and fd is None
    finally:
        holder.kill()
        holder.wait()
    assert not held_by_a_live_run(layout.record_lock(record))   # SIGKILL: the kernel let go of it
    path, fd = claim(record, "20261203-130512-3")
    assert path == record and fd is not None
    os.close(fd)


@pytest.mark.parametrize("status, copy, kept", [
    ("failed", True, "stays"),             # the failed run wrote its own copy: nothing to move
    ("failed", False, "kept as"),          # an older mindguard's, or killed before the copy: renamed
    ("running", False, "kept as"),         # a killed run's
])
def test_a_new_run_keeps_an_earlier_failure_aside(tmp_path, status, copy, kept):
    record = tmp_path / "mindguard_failure.json"
    earlier = failed("20261203-120000-7") if status == "failed" else FailureRecord(
        status="running", global_step=9, run_id="20261203-120000-7")
    earlier.save(record)
    if status == "running":
        layout.progress_beside(record).write_text("{}")
    aside = layout.run_record(record, "20261203-120000-7")
    if copy:
        earlier.save(aside)
    with pytest.warns(UserWarning, match=kept):
        path, fd = claim(record, "20261203-130000-8")
    os.close(fd)
    assert path == record and FailureRecord.load(aside).to_dict() == earlier.to_dict()
    assert record.exists() == copy    # renamed, or left for the new run to replace
    if status == "running":
        assert layout.progress_beside(aside).exists() and not layout.progress_beside(record).exists()


def test_nothing_to_hunt_is_replaced_and_a_foreign_file_refused(tmp_path):
    record = tmp_path / "r.json"
    FailureRecord(status="failed", kind="interrupted", global_step=3, run_id="a").save(record)
    with pytest.warns(UserWarning, match="nothing to hunt"):
        path, fd = claim(record, "b")
    os.close(fd)
    assert path == record and not layout.run_record(record, "a").exists()
    notes = tmp_path / "notes.json"
    notes.write_text("[1]")
    with pytest.raises(ValueError, match="will not overwrite"):
        claim(notes, "b")
    assert notes.read_text() == "[1]"


def test_stale_states_are_what_no_record_names_and_no_live_run_holds(tmp_path):
    record = tmp_path / "mindguard_failure.json"
    root = layout.kept_states(record)
    failed("kept").save(layout.run_record(record, "kept"))
    write_state(root / "kept" / "step-4", 4, "kept")
    cut = root / "kept" / "step-6"
    cut.mkdir()
    (cut / ".state.npz.x1.tmp").write_bytes(b"PK")
    write_state(root / "orphan" / "step-2", 2, "orphan")
    (root / "mine").mkdir()
    removed = clean_stale_states(root, keep="mine")
    assert not (root / "orphan").exists() and not cut.exists() and (root / "mine").is_dir()
    assert check_state(root / "kept" / "step-4", run_id="kept")[0] is not None
    assert set(removed) >= {root / "orphan", cut}


def test_the_state_hunt_from_uses_and_why(tmp_path):
    states = tmp_path / "s" / "A"
    early = write_state(states / "step-3", 3, "A")
    late = write_state(states / "step-5", 5, "A")
    record = {"run_id": "A", "states": str(states),
              "kept_state": {"path": str(states / "step-5"), "step": 5, "run_id": "A", "sha256": late["sha256"]}}
    assert choose_kept_state(record, 6) == (states / "step-5", late, None)
    # the named state damaged: the run's earlier one, and why
    (states / "step-5" / "state.json").write_text('{"schema": 1, "st')
    folder, meta, note = choose_kept_state(record, 6)
    assert (folder, meta) == (states / "step-3", early) and "state.json is damaged (not valid JSON" in note
    assert "resuming from the run's earlier state, kept at global step 3" in note
    # another run's state in its place
    (states / "step-3" / "state.json").write_text(json.dumps({**early, "run_id": "B"}))
    assert choose_kept_state(record, 6)[0] is None
    assert "was kept by run B, not by run A" in check_state(states / "step-3", run_id="A")[1]
    # none named (killed): the last complete one at or before the first possible step
    write_state(states / "step-2", 2, "A")
    folder, meta, note = choose_kept_state({"run_id": "A", "states": str(states)}, 6)
    assert folder == states / "step-2" and "the record names no kept state" in note
    assert choose_kept_state({"run_id": "A"}, 6)[2].startswith("the run kept no training state")


def test_an_edit_is_named_by_file(tmp_path):
    (tmp_path / "model").mkdir()
    script, module = tmp_path / "train.py", tmp_path / "model" / "net.py"
    script.write_text("import model.net\n")
    module.write_text("W = 1\n")
    outside = Path(np.__file__)
    recorded = _provenance.source_hashes(str(tmp_path), str(script), [str(module), str(outside), None])
    assert set(recorded) == {"train.py", os.path.join("model", "net.py")}, recorded
    assert _provenance.source_changes(recorded, str(tmp_path), str(tmp_path)) == []
    module.write_text("W = 2\n")
    assert _provenance.source_changes(recorded, str(tmp_path), str(tmp_path)) == \
        [f"{os.path.join('model', 'net.py')} changed since the failure"]
    elsewhere = tmp_path / "copy"
    elsewhere.mkdir()
    (elsewhere / "train.py").write_text(script.read_text())
    assert _provenance.source_changes(recorded, str(tmp_path), str(elsewhere)) == \
        [f"{os.path.join('model', 'net.py')} is missing here (the failing run had it in {tmp_path})"]
