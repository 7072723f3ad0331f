"""Round 3 of the real-script suite (issue 30): the next model-zoo shapes, and answers that never claim more than
the evidence shows.

The hunts (marked ``slow``) run ``mindguard hunt`` on the scripts of ``tests/zoo/`` in real subprocesses and check
exit code, global step, op, line and hint; where the hint proposes a fix, the script's ``--fix`` applies it and the
run is hunted again to show it trains finite. The fast tests pin the evidence rules behind them on statistics alone.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO
from hunting import explain, line_of, run_hunt, summary_of
from mindguard.analysis.hints import hint_for, input_violation
from mindguard.analysis.stats import tensor_stats
from mindguard.analysis.trace import constant_tensor

ZOO = REPO / "tests" / "zoo"


# -- evidence rules (fast) ------------------------------------------------------------------------------------

def _slot(slot, array):
    return {"slot": slot, **tensor_stats(np.asarray(array))}


def test_ctc_hint_names_the_sample_that_cannot_be_aligned_and_never_an_epsilon():
    logits = _slot(0, np.linspace(-0.28, 1.45, 8 * 2 * 37, dtype=np.float32).reshape(8, 2, 37))
    indices = {"slot": 1, **constant_tensor("Tensor(shape=[14, 2], dtype=Int64, value= [[0 0] [0 1] [0 2] ... "
                                            "[1 4] [1 5] [1 6]])")}
    labels = _slot(2, np.array([4, 9, 1, 7, 3, 2, 8, 0, 0, 1, 1, 2, 2, 3], np.int32))
    lengths = {"slot": 3, **constant_tensor("Tensor(shape=[2], dtype=Int32, value=[8 8])")}
    out = [tensor_stats(np.array([26.1, np.inf], np.float32))]
    code = "loss, _ = self.ctc_loss(logit, self.labels_indices, labels_values, self.sequence_length)"
    hint = hint_for("CTCLoss", [logits, indices, labels, lengths], out, direction="forward", source_code=code)
    assert "sample 1's label has 7 character(s) with 3 pair(s) of equal neighbours" in hint, hint
    assert "needs 10 time steps, and its input gives 8" in hint, hint
    assert "loss = ops.select(ops.isinf(loss), ops.zeros_like(loss), loss)" in hint, hint
    assert "epsilon (" not in hint and "clamp them" not in hint and "[-0.28, 1.45]" in hint, hint
    # torch-style code gets the fix in its own terms
    torch = hint_for("CTCLoss", [logits, indices, labels, lengths], out, direction="forward",
                     source_code="loss = F.ctc_loss(log_probs, targets, in_len, tgt_len)")
    assert "loss = torch.where(torch.isinf(loss), torch.zeros_like(loss), loss)" in torch, torch


def test_a_hint_outside_the_catalogue_says_what_the_statistics_rule_out():
    moderate = [tensor_stats(np.array([-0.28, 1.45], np.float32))]
    hint = hint_for("SomeKernel", moderate, [tensor_stats(np.array([np.inf], np.float32))], direction="forward")
    assert "ruled out" in hint and "no epsilon or clamp" in hint and "[-0.28, 1.45]" in hint, hint
    zeros = hint_for("SomeKernel", [tensor_stats(np.array([0.0, 2.0], np.float32))],
                     [tensor_stats(np.array([np.inf], np.float32))], direction="forward")
    assert "epsilon" in zeros and "clamp" not in zeros, zeros
    huge = hint_for("SomeKernel", [tensor_stats(np.array([3e25, 1.0], np.float32))],
                    [tensor_stats(np.array([np.nan], np.float32))], direction="forward")
    assert "3e+25" in huge and "scale it down" in huge and "epsilon" not in huge, huge


def test_division_hints_follow_the_divisor():
    count = hint_for("RealDiv", [tensor_stats(np.array([0.0, 0.0], np.float32)),
                                 tensor_stats(np.array([0.0, 0.0], np.float32))],
                     [tensor_stats(np.array([np.nan, np.nan], np.float32))], direction="forward",
                     source_code="loss = masked.sum() / mask.sum()")
    assert "0 by 0" in count and "ops.maximum(count, 1)" in count, count
    far = hint_for("RealDiv", [tensor_stats(np.array([1.0, 2.0], np.float32)),
                               tensor_stats(np.array([0.5, 3.0], np.float32))],
                   [tensor_stats(np.array([np.inf], np.float32))], direction="forward")
    assert "divides by zero" not in far and "ruled out" in far, far


def test_acos_outside_its_domain_is_clamped_in_the_users_terms():
    hint = hint_for("ACos", [tensor_stats(np.array([0.2, 1.0000001], np.float32))],
                    [tensor_stats(np.array([np.nan], np.float32))], direction="forward",
                    source_code="angle = torch.acos(cos_sim)")
    assert "outside [-1, 1]" in hint and "angle = torch.acos(torch.clamp(cos_sim, -1 + 1e-6, 1 - 1e-6))" in hint, hint


def test_index_violation_is_evidence_for_the_kernel_a_step_stopped_in():
    table = {"slot": 0, "shape": [50, 8], "dtype": "float32", "parameter": "ent.embedding_table"}
    assert input_violation("Gather", [table, _slot(1, np.array([4, 50], np.int32))]).startswith(
        "index out of range: max index 50 >= 50 rows")
    assert input_violation("Gather", [table, _slot(1, np.array([4, 49], np.int32))]) is None
    assert input_violation("MatMul", [table]) is None
