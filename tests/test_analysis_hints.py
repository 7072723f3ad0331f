"""hint_for (contract 5: shared with replay) and the tensor scans the analyzer uses. Pure numpy/text: fast."""
from __future__ import annotations

import numpy as np
import pytest

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


NORM_REWRITES = [   # (user line, the safe_norm line proposed) -- MindSpore 2.10 signatures:
    # ops.norm(A, ord=None, dim=None, keepdim=False, *, dtype=None); mint.norm(input, p='fro', dim=None, keepdim=False)
    ("y = mint.norm(x, 2, 1, True) + 1", "y = mindguard.safe_norm(x, 1, True) + 1"),
    ("y = mint.norm(x, 'fro', (0, 1))", "y = mindguard.safe_norm(x, (0, 1))"),
    ("y = mint.norm(input=x, p=2.0, keepdim=True)", "y = mindguard.safe_norm(x=x, keep_dims=True)"),
    ("y = mint.norm(x, p='fro', dim=-1, keepdim=False)", "y = mindguard.safe_norm(x, axis=-1, keep_dims=False)"),
    ("y = ops.norm(x, ord=2, dim=-1)", "y = mindguard.safe_norm(x, axis=-1)"),
    ("y = ops.norm(x, 2, -1, True)", "y = mindguard.safe_norm(x, -1, True)"),
    ("y = ops.norm(x, None, -1, True)", "y = mindguard.safe_norm(x, -1, True)"),
    ("y = ops.norm(x, ord=None, dim=None, keepdim=True)", "y = mindguard.safe_norm(x, keep_dims=True)"),
    ("y = ops.norm(x, 'fro', dim=(0, 1))", "y = mindguard.safe_norm(x, axis=(0, 1))"),
    ("y = ms.ops.norm(a * b, dim=(1, 2))", "y = mindguard.safe_norm(a * b, axis=(1, 2))"),
]

NORM_NOT_REWRITTEN = [   # (user line, what the hint says instead)
    ("y = ops.norm(x, 1, dim=-1)", "order ord=1"),
    ("y = mint.norm(x, 1, -1)", "order p=1"),
    ("y = ops.norm(x, ord=float('inf'), dim=-1)", "order ord=float('inf')"),
    ("y = mint.norm(x, p=np.inf)", "order p=np.inf"),
    ("y = mint.norm(x, p, -1)", "order p=p"),
    ("y = ops.norm(x, 'nuc')", "order ord='nuc'"),
    ("y = ops.norm(x, -2, dim=-1)", "order ord=-2"),
    ("y = ops.norm(x, 2, (0, 1))", "matrix spectral norm"),
    ("y = ops.norm(x, ord=2)", "matrix spectral norm"),
    ("y = ops.norm(x, dim=-1, dtype=ms.float32)", "`dtype=`"),
    ("y = ops.norm(*args)", "*args"),
    ("y = ops.norm(x, dim=-1,", "does not end on this line"),
]


@pytest.mark.parametrize("line,fixed", NORM_REWRITES)
def test_functional_2_norm_is_rewritten_with_safe_norms_parameters(line, fixed):
    hint = hint_for("SqrtGrad", _zero_input(), _inf_output(), direction="backward", source_code=line)
    assert f"now:    {line}\n    fix:    {fixed}" in hint, hint


@pytest.mark.parametrize("line,why", NORM_NOT_REWRITTEN)
def test_other_norm_orders_get_the_epsilon_hint_not_safe_norm(line, why):
    hint = hint_for("SqrtGrad", _zero_input(), _inf_output(), direction="backward", source_code=line)
    assert "fix:" not in hint and "mindguard.safe_norm(" not in hint, hint
    assert why in hint and "add an epsilon" in hint and f"line:   {line}" in hint, hint


def test_ord_2_with_a_variable_dim_is_rewritten_with_its_condition():
    hint = hint_for("SqrtGrad", _zero_input(), _inf_output(), direction="backward",
                    source_code="d = ops.norm(x, 2, axis)")
    assert "fix:    d = mindguard.safe_norm(x, axis)" in hint and "valid when dim is a single axis" in hint, hint


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


# --- the fix shown where the culprit cell is created (the user's file, read only) --------------------------

TWO_CLASSES = '''\
from mindspore import nn
import mindguard


class Other(nn.Cell):
    def __init__(self):
        super().__init__()
        self.norm = nn.Norm(axis=0)

    def construct(self, x):
        return self.norm(x)


class Net(nn.Cell):
    def __init__(self, dim):
        super().__init__()
        self.embedding = nn.Embedding(6, dim)
        self.norm = nn.Norm(axis=-1, keep_dims=True)
        self.head = nn.Dense(3, 1)

    def construct(self, tokens):
        return self.head(self.norm(self.embedding(tokens)))
'''
CALL = "return self.head(self.norm(self.embedding(tokens)))"


def _norm_hint(path, line, code=CALL, kind="SqrtGrad"):
    return hint_for(kind, _zero_input(), _inf_output(), direction="backward", source_code=code,
                    source_file=str(path), source_line=line)


def _line_of(text: str, needle: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), start=1) if needle in line)


def test_norm_fix_is_shown_at_the_assignment_in_the_enclosing_class(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(TWO_CLASSES)
    hint = _norm_hint(path, _line_of(TWO_CLASSES, CALL))
    created = _line_of(TWO_CLASSES, "keep_dims=True")
    assert f"now:    self.norm = nn.Norm(axis=-1, keep_dims=True)    (model.py:{created})" in hint, hint
    assert "fix:    self.norm = mindguard.SafeNorm(axis=-1, keep_dims=True)\n" in hint, hint
    assert "axis=0" not in hint and "mindguard.make_safe(net)" in hint, hint


def test_norm_fix_follows_an_edited_file_and_falls_back_to_any_assignment(tmp_path):
    path = tmp_path / "model.py"
    shifted = "# a comment added after the run\n" * 3 + TWO_CLASSES
    path.write_text(shifted)
    hint = _norm_hint(path, _line_of(TWO_CLASSES, CALL))        # the old line number: the call moved down 3
    assert f"(model.py:{_line_of(shifted, 'keep_dims=True')})" in hint, hint
    # call line gone from the file: any `self.norm =` in the file (here the first one)
    hint = _norm_hint(path, 2, code="y = self.norm(h)")
    assert f"now:    self.norm = nn.Norm(axis=0)    (model.py:{_line_of(shifted, 'axis=0')})" in hint, hint


def test_norm_created_by_a_factory_gets_make_safe_and_the_line_as_found(tmp_path):
    path = tmp_path / "factory.py"
    path.write_text("class Net(nn.Cell):\n    def __init__(self):\n        super().__init__()\n"
                    "        self.norm = make_norm(\n            'l2', axis=-1)\n\n"
                    "    def construct(self, x):\n        return self.norm(x)\n")
    hint = _norm_hint(path, 9, code="return self.norm(x)")
    assert "mindguard.make_safe(net)" in hint and "not created by a literal nn.Norm" in hint, hint
    assert "line:   self.norm = make_norm('l2', axis=-1)    (factory.py:4)" in hint, hint
    assert "fix:" not in hint, hint


def test_norm_hint_never_fails_on_a_missing_or_unreadable_file(tmp_path):
    generic = _norm_hint(tmp_path / "gone.py", 3)
    assert "self.norm = mindguard.SafeNorm(axis=...)" in generic and "make_safe" in generic, generic
    binary = tmp_path / "binary.py"
    binary.write_bytes(b"\xff\xfe\x00garbage\x00" * 50)
    assert _norm_hint(binary, 2) == generic
    assert _norm_hint(tmp_path, 1) == generic                          # a directory, not a file
    assert _norm_hint(binary, -5) == generic and _norm_hint(binary, None) == generic


def test_demo_network_hint_shows_its_literal_nn_norm():
    from mindguard.demos import norm_nan

    source = open(norm_nan.__file__).read()
    hint = _norm_hint(norm_nan.__file__, _line_of(source, CALL))
    assert f"now:    self.norm = nn.Norm(axis=-1)    " \
           f"(norm_nan.py:{_line_of(source, 'self.norm = ')})" in hint, hint
    assert "fix:    self.norm = mindguard.SafeNorm(axis=-1)" in hint, hint


# --- custom cell class names (replay) ----------------------------------------------------------------------

def test_cell_class_names_naming_an_op_get_that_ops_hint():
    out = [tensor_stats(np.array([-np.inf], np.float32))]
    for name in ("LogCell", "MyLog", "SafeLog", "logcell", "Log_Layer"):
        hint = hint_for(name, _zero_input(), out, direction="forward", source_code="y = self.log(x)")
        assert "fix:    y = self.log(x + 1e-6)" in hint and hint.startswith(f"{name} (forward) got 1 zero"), hint
    assert "epsilon under the square root" in hint_for("SqrtCell", _zero_input(), _inf_output(), direction="forward")
    assert "denominator" in hint_for("MyDiv", _zero_input(), _inf_output(), direction="forward")
    assert "SafeNorm" in hint_for("MyNorm", _zero_input(), _inf_output(), direction="backward")
    assert "variance" in hint_for("MyLayerNorm", _zero_input(), _inf_output(), direction="backward")
    logits = hint_for("LogitsHead", [tensor_stats(np.ones(2, np.float32))], _inf_output(), direction="forward")
    assert "epsilon inside the log" not in logits and "LogitsHead" in logits, logits


# --- log(softmax(x)) ---------------------------------------------------------------------------------------

def test_log_of_softmax_proposes_log_softmax():
    out = [tensor_stats(np.array([-np.inf], np.float32))]
    line = "log_probs = ops.log(ops.softmax(logits, axis=-1))"
    hint = hint_for("Log", _zero_input(), out, direction="forward", source_code=line)
    assert f"now:    {line}\n    fix:    log_probs = ops.log_softmax(logits, axis=-1)\n" in hint, hint
    nested = "loss = -(onehot * ops.log(ops.softmax(self.fc(x), axis=1))).sum()"
    hint = hint_for("LogGrad", _zero_input(), _inf_output(), direction="backward", source_code=nested)
    assert "fix:    loss = -(onehot * ops.log_softmax(self.fc(x), axis=1)).sum()" in hint, hint
    mint = hint_for("Log", _zero_input(), out, direction="forward", source_code="p = mint.log(mint.softmax(z, 1))")
    assert "fix:    p = mint.nn.functional.log_softmax(z, 1)" in mint, mint
    cells = hint_for("Log", _zero_input(), out, direction="forward", source_code="p = self.log(self.softmax(z))")
    assert "nn.LogSoftmax" in cells and "line:   p = self.log(self.softmax(z))" in cells, cells
    plain = hint_for("Log", _zero_input(), out, direction="forward", source_code="p = ops.log(probs)")
    assert "fix:    p = ops.log(probs + 1e-6)" in plain and "log_softmax" not in plain, plain


def test_a_weight_gradient_that_sums_to_nan_is_an_overflow_of_its_products():
    """Conv2DBackpropFilter with finite inputs up to 1e38 and 72 NaN outputs: +Inf and -Inf partial sums, not a
    division -- the hint says so, with the loss scale for a backward op."""
    inputs = [tensor_stats(np.array([1e38, -2.0, 0.5], np.float32)), tensor_stats(np.array([3.0, -1.0], np.float32))]
    outputs = [tensor_stats(np.array([np.nan] * 72 + [1.0], np.float32))]
    hint = hint_for("Conv2DBackpropFilter", inputs, outputs, direction="backward",
                    source_code="x = self.relu(self.conv1(x))")
    assert "made NaN in 72 element(s)" in hint and "+Inf and -Inf" in hint and "1e+38" in hint, hint
    assert "loss scale" in hint and "normalize" in hint, hint
    forward = hint_for("MatMul", inputs, outputs, direction="forward")
    assert "+Inf and -Inf" in forward and "loss scale" not in forward, forward
