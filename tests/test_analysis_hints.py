"""hint_for (contract 5: shared with replay) and the tensor scans the analyzer uses. Pure numpy/text: fast."""
from __future__ import annotations

import numpy as np

from mindguard.analysis.hints import hint_for
from mindguard.analysis.stats import fp16_risk_counts, light_scan, nonfinite_counts, tensor_stats


def _zero_input():
    return [tensor_stats(np.array([0.0, 1.0], np.float32))]


def _inf_output():
    return [tensor_stats(np.array([np.inf, 1.0], np.float32))]


def test_nn_norm_call_points_at_safenorm_and_make_safe():
    hint = hint_for("SqrtGrad", _zero_input(), _inf_output(), direction="backward",
                    source_code="return self.head(self.norm(self.embedding(tokens)))")
    assert "self.norm = mindguard.SafeNorm(" in hint and "mindguard.make_safe(net)" in hint, hint
    assert "0 in 1 element" in hint, hint


def test_cell_class_name_from_replay_gets_the_same_fix():
    hint = hint_for("Norm", _zero_input(), _inf_output(), direction="backward")
    assert "SafeNorm" in hint and "make_safe" in hint, hint


def test_functional_norm_line_is_shown_as_is_and_as_it_would_be():
    line = "dist = ops.norm(h + r - t, dim=-1, keepdim=False)"
    hint = hint_for("SqrtGrad", _zero_input(), _inf_output(), direction="backward", source_code=line)
    assert f"now:    {line}" in hint, hint
    assert "fix:    dist = mindguard.safe_norm(h + r - t, axis=-1, keep_dims=False)" in hint, hint
    mint = hint_for("SqrtGrad", _zero_input(), _inf_output(), direction="backward",
                    source_code="d = mint.norm(x)")
    assert "fix:    d = mindguard.safe_norm(x)" in mint, mint


def test_log_of_zero_gets_an_epsilon_on_the_users_line():
    hint = hint_for("Log", _zero_input(), [tensor_stats(np.array([-np.inf], np.float32))], direction="forward",
                    source_code="loss = -ops.log(probs[:, 0]).mean()")
    assert "fix:    loss = -ops.log(probs[:, 0] + 1e-6).mean()" in hint, hint
    assert "ops.clamp(probs[:, 0], min=1e-6)" in hint, hint


def test_exp_overflow_in_fp16_suggests_fp32_and_loss_scaling():
    inputs = [tensor_stats(np.array([12.0], np.float32))]
    outputs = [tensor_stats(np.array([np.inf], np.float16))]
    hint = hint_for("Exp", inputs, outputs, direction="forward")
    assert "65504" in hint and "to_float(mindspore.float32)" in hint and "loss scaling" in hint, hint


def test_fp16_underflow_suggests_fp32_and_an_epsilon_that_survives_fp16():
    inputs = [tensor_stats(np.array([0.0, 1.0], np.float16))]
    outputs = [tensor_stats(np.array([np.nan, 1.0], np.float16))]
    hint = hint_for("RealDiv", inputs, outputs, direction="forward")
    assert "1e-6" in hint and "fp32" in hint, hint
    underflow = hint_for("Mul", inputs, outputs, direction="backward")
    assert "underflow" in underflow and "1e-6" in underflow and "to_float" in underflow, underflow


def test_unknown_kind_still_names_what_to_look_at():
    hint = hint_for("SomeCustomOp", [tensor_stats(np.ones(2, np.float32))],
                    [tensor_stats(np.array([np.nan, 1], np.float32))], direction="forward")
    assert "SomeCustomOp" in hint and "1 NaN" in hint, hint


def test_scans_count_nonfinite_and_fp16_risk():
    a = np.array([0.0, 1e-9, 70000.0, np.nan, np.inf, -np.inf, 1.0], np.float32)
    assert nonfinite_counts(a) == {"nan": 1, "pos_inf": 1, "neg_inf": 1}
    assert fp16_risk_counts(a) == {"underflow": 1, "overflow": 1}
    scan = light_scan(a)
    assert (scan["nan"], scan["pos_inf"], scan["neg_inf"], scan["underflow"], scan["overflow"]) == (1, 1, 1, 1, 1), scan
    assert scan["absmax"] == 70000.0, scan
    assert fp16_risk_counts(np.array([0.0, 1e-3], np.float16))["underflow"] == 0   # already fp16: no prediction
    assert light_scan(np.arange(3, dtype=np.int32))["absmax"] is None
