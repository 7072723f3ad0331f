"""The random state a kept training state holds (mindguard.training.state.rng) and the hunt's decision when it names a
random kernel no state can hold (mindguard.hunt.plan); pure decisions, without MindSpore (the MindSpore generator's part
is covered by tests/test_zoo_random.py)."""
from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import numpy as np
import pytest

from mindguard.training.state import rng as _rng
from mindguard.training.state.resume import unrestorable_note
from mindguard.hunt.plan import choose_resume, plan_from_record

pytestmark = pytest.mark.fast

DROPOUT = ["nn.Dropout in `network.encoder.drop`"]


def test_numpy_and_python_draw_again_what_they_drew_after_the_capture():
    np.random.seed(11)
    random.seed(11)
    np.random.normal()   # a cached Gaussian half is part of numpy's state
    random.gauss(0, 1)   # and of Python's
    arrays, meta = _rng.capture_host()
    want = (np.random.normal(size=5).tolist(), np.random.randint(0, 1000, 5).tolist(), random.random(),
            random.gauss(0, 1))
    np.random.seed(99)
    random.seed(99)
    stored = {_rng.ARRAY_PREFIX + k: v for k, v in arrays.items()}
    assert _rng.restore(_rng.split_arrays(stored), meta) == ["numpy", "python"]
    got = (np.random.normal(size=5).tolist(), np.random.randint(0, 1000, 5).tolist(), random.random(),
           random.gauss(0, 1))
    assert got == want


def test_a_state_kept_by_an_older_mindguard_restores_nothing():
    np.random.seed(3)
    before = np.random.get_state()[1].copy()
    assert _rng.restore({}, {}) == []
    assert np.array_equal(np.random.get_state()[1], before)


def test_an_unrestorable_source_is_named_with_the_version_and_the_fix():
    note = _rng.describe_unrestorable(DROPOUT, "2.10.0")
    assert note.startswith("nn.Dropout in `network.encoder.drop` draws from a random kernel")
    assert "not restorable on MindSpore 2.10.0" in note and "hunt --from` resumes all the same" in note
    many = _rng.describe_unrestorable([f"nn.Dropout in `l{i}.drop`" for i in range(5)], None)
    assert "and 2 more draw from" in many and "this MindSpore" in many
    assert _rng.describe_unrestorable([], "2.10.0") is None
    assert unrestorable_note({"rng": {"numpy": {}}}) is None and unrestorable_note(None) is None


RECORD = {"schema": 2, "status": "failed", "kind": "nonfinite_loss", "global_step": 1500, "phase": "step",
          "argv": ["python", "train.py"], "kept_state": {"path": "/r/mindguard_failure.state/step-1400",
                                                       "step": 1400}}


def test_a_kept_state_naming_a_random_kernel_is_resumed_approximately_and_says_why():
    meta = {"schema": 1, "step": 1400, "rng": {"unrestorable": DROPOUT, "mindspore": "2.10.0"}}
    plan = plan_from_record(RECORD, meta, ["python", "train.py"], "dump")
    assert plan.route == "resume" and plan.state_step == 1400, plan
    assert plan.approximate is not None and plan.approximate.startswith("nn.Dropout in `network.encoder.drop`"), plan
    exact = plan_from_record(RECORD, {"schema": 1, "step": 1400, "rng": {}}, ["python", "train.py"], "dump")
    assert exact.route == "resume" and exact.approximate is None, exact


def test_an_approximate_request_survives_the_environment():
    from mindguard.protocol.request import HuntRequest

    request = HuntRequest(pass_name="record", record=Path("/r/rec.json"), resume_dir=Path("/r/state"),
                          approximate=True)
    assert HuntRequest.from_environ(request.to_environ()).approximate
    assert not HuntRequest.from_environ(dataclasses.replace(request, approximate=False).to_environ()).approximate


def test_the_plain_hunts_pass_2_does_not_resume_such_a_state_unless_told_to():
    failure = {"global_step": 1500, "step_window_us": [0, 10_000_000_000]}
    meta = {"schema": 1, "step": 1400, "first_step_end": 1.0, "step_seconds": 0.001,
            "rng": {"unrestorable": DROPOUT, "mindspore": "2.10.0"}}
    choice = choose_resume(failure, meta, 0.0, "dump")
    assert choice is not None and not choice.resume and "nn.Dropout in `network.encoder.drop`" in choice.why
    assert choose_resume(failure, meta, 0.0, "dump", mode="always").resume
