"""Hand-written training loops of the model zoo (two train cells stepped by hand, watched GAN loops, torch-style
models, a shared cell called twice) and hints that never claim more than the evidence shows (CTC, division, acos,
index bounds; mindguard's own errors told from the user's). Added for issue 30.

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
from hunting import check_outcome as check, explain, hunt_zoo as hunt, line_of, run_hunt, summary_of
from mindguard.analysis.hints import hint_for, input_violation
from mindguard.analysis.stats import tensor_stats
from mindguard.analysis.trace import constant_tensor

ZOO = REPO / "tests" / "zoo"


# -- evidence rules (fast) ------------------------------------------------------------------------------------

def _slot(slot, array):
    return {"slot": slot, **tensor_stats(np.asarray(array))}


@pytest.mark.fast
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
    # ops.ctc_loss / nn.CTCLoss run as CTCLossV2: targets [N, S], input_lengths, target_lengths
    v2 = [_slot(0, np.zeros((8, 2, 37), np.float32)), _slot(1, np.array([[3, 4, 0, 0], [5, 5, 5, 6]], np.int32)),
          _slot(2, np.array([8, 5], np.int32)), _slot(3, np.array([2, 4], np.int32))]
    hint = hint_for("CTCLossV2", v2, out, direction="forward", source_code="loss = self.ctc(lp, y, il, tl)")
    assert "sample 1's label has 4 character(s) with 2 pair(s)" in hint and "needs 6 time steps, and its input " \
        "gives 5" in hint, hint


@pytest.mark.fast
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


@pytest.mark.fast
def test_division_hints_follow_the_divisor():
    count = hint_for("RealDiv", [tensor_stats(np.array([0.0, 0.0], np.float32)),
                                 tensor_stats(np.array([0.0, 0.0], np.float32))],
                     [tensor_stats(np.array([np.nan, np.nan], np.float32))], direction="forward",
                     source_code="loss = masked.sum() / mask.sum()")
    assert "0/0 = NaN" in count and "/ ops.maximum(mask.sum(), 1)" in count and "(b + 1e-6)" not in count, count
    far = hint_for("RealDiv", [tensor_stats(np.array([1.0, 2.0], np.float32)),
                               tensor_stats(np.array([0.5, 3.0], np.float32))],
                   [tensor_stats(np.array([np.inf], np.float32))], direction="forward")
    assert "divides by zero" not in far and "ruled out" in far, far


@pytest.mark.fast
def test_acos_outside_its_domain_is_clamped_in_the_users_terms():
    hint = hint_for("ACos", [tensor_stats(np.array([0.2, 1.0000001], np.float32))],
                    [tensor_stats(np.array([np.nan], np.float32))], direction="forward",
                    source_code="angle = torch.acos(cos_sim)")
    assert "outside [-1, 1]" in hint and "angle = torch.acos(torch.clamp(cos_sim, -1 + 1e-6, 1 - 1e-6))" in hint, hint


@pytest.mark.fast
def test_index_violation_is_evidence_for_the_kernel_a_step_stopped_in():
    table = {"slot": 0, "shape": [50, 8], "dtype": "float32", "parameter": "ent.embedding_table"}
    assert input_violation("Gather", [table, _slot(1, np.array([4, 50], np.int32))]).startswith(
        "index out of range: max index 50 >= 50 rows")
    assert input_violation("Gather", [table, _slot(1, np.array([4, 49], np.int32))]) is None
    assert input_violation("MatMul", [table]) is None


# -- the hunts (slow) -----------------------------------------------------------------------------------------

@pytest.mark.slow
def test_a_step_that_raised_in_a_manual_loop_over_two_train_cells_is_found_in_its_graphs_own_count(tmp_path):
    """kg_manual_loop.py: head and tail train cells alternate (graph 0 runs iterations 0..16, graph 3 1..16, each
    counting its own runs; graph 0's record stops listing it once graph 3 runs). The step that raised is not listed
    by MindSpore: its iteration comes from what was observed of each graph, never step - 1, and the dump holds it."""
    proc, run, summary = hunt(tmp_path, "kg_manual_loop.py")
    check(proc, summary, 1, "failure_found")
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"]) == ("exception", 33), failure
    assert failure.get("dump_candidates") and 16 in failure["dump_candidates"], failure
    assert failure["dump_iteration"] != 32 and not failure["iteration_observed"], failure
    stopped = summary["stopped_at"]
    assert (stopped["op"]["op_type"], stopped["op"]["direction"]) == ("Gather", "forward"), stopped["op"]
    assert stopped["op"]["source"]["line"] == line_of(ZOO / "kg_manual_loop.py", "# GATHER"), stopped["op"]["source"]
    assert "index out of range: max index 50 >= 50 rows of `entity_embedding.embedding_table`" in stopped["hint"], \
        stopped["hint"]
    assert "ReproducibilityWarning" not in proc.stderr, explain(proc)   # ms.set_seed(1) counts as a seed
    assert (summary["pass1"]["records"][0].get("seed"), "Unused Kernel" in proc.stderr) == (1, False), explain(proc)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_a_shared_cell_called_twice_is_named_at_the_call_that_raised_with_the_index_hint(tmp_path, mode):
    """shared_embedding.py: the .ir gives both Gathers of ``self.ent`` the first call's line; the second call's line
    is named, the index input is read (not "(unreadable)": tuple arguments of StridedSlice no longer make its files
    "another kernel's"), and the hint names the 50 rows. In PyNative the replay records the op the step raised in
    (the kernel error surfaces at the next read of a tensor: it is that op's, not mindguard's and not a finite
    value). The fix (clip the ids, --fix) trains to the end."""
    proc, run, summary = hunt(tmp_path, "shared_embedding.py", "--mode", mode)
    check(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("exception", 6), summary["failure"]
    if mode == "graph":
        stopped = summary["stopped_at"]
        op, hint = stopped["op"], stopped["hint"]
        report = json.loads((run / "report.json").read_text())
        assert not any(e["rule"] == "files of another kernel" for e in report["excluded"]), report["excluded"]
    else:
        op = summary["origin"]
        hint = op["hint"]
        assert op.get("stopped") and "'input_indices' should be in the range" in op["exception"], op
    assert op["op_type"] == "Gather", op
    assert op["source"]["line"] == line_of(ZOO / "shared_embedding.py", "# CULPRIT"), op["source"]
    index = next(i for i in op["inputs"] if i["slot"] == 1)
    assert not index.get("unreadable") and index["max"] == 50, op["inputs"]
    assert "max index 50 >= 50 rows of `ent.embedding_table`" in hint, hint
    assert "ops.clip_by_value(ids, 0, 49)" in hint, hint
    if mode == "graph":
        fixed, _, summary = hunt(tmp_path, "shared_embedding.py", "--fix", name="fixed")
        check(fixed, summary, 0, "healthy")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_ctc_loss_of_a_label_longer_than_its_input_gets_the_ctc_fix_and_the_fix_trains_finite(tmp_path, mode):
    """crnn_ctc.py: the hint is CTC's (the sample that cannot be aligned, from the label and length values), not
    an epsilon or a clamp the finite logits rule out; the table shows CTCLoss's own input shapes; no warning blames
    a correct answer on another op; ms.set_seed(1) counts as a seed. --fix applies the hint and trains finite."""
    proc, run, summary = hunt(tmp_path, "crnn_ctc.py", "--mode", mode)
    check(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("nonfinite_loss", 5), summary["failure"]
    assert summary["failure"]["seed"] == 1 and "ReproducibilityWarning" not in proc.stderr, explain(proc)
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("CTCLoss", "forward"), origin
    assert origin["source"]["line"] == line_of(ZOO / "crnn_ctc.py", "# CULPRIT"), origin["source"]
    assert [i["shape"] for i in origin["inputs"]][:4] == [[8, 2, 37], [14, 2], [14], [2]], origin["inputs"]
    hint = origin["hint"]
    assert "needs 10 time steps, and its input gives 8" in hint, hint
    assert "loss = ops.select(ops.isinf(loss), ops.zeros_like(loss), loss)" in hint, hint
    assert "need an epsilon" not in hint and "clamp them" not in hint, hint
    assert not any("is the origin" in w for w in summary.get("warnings") or []), summary.get("warnings")
    if mode == "graph":
        fixed, _, summary = hunt(tmp_path, "crnn_ctc.py", "--fix", name="fixed")
        check(fixed, summary, 0, "healthy")


@pytest.mark.slow
def test_a_corrupt_file_in_a_watched_gan_loop_is_hunted_like_under_model_train(tmp_path):
    """gan_watch.py: one cell holding the discriminator's and generator's train cells, stepped by hand and wrapped
    with watch; the pipeline raises between steps, outside the watched call. The run is recorded failed (never
    finished), at a step it says is not certain; pass 2 runs the pipeline synchronously: global step 40 and the
    raising line, exit 1."""
    proc, run, summary = hunt(tmp_path, "gan_watch.py")
    check(proc, summary, 1, "failure_found")
    first = summary["pass1"]["records"][0]
    assert first["status"] == "failed" and first["phase"] == "between_steps" and first["global_step"] < 40, first
    assert first["message"].startswith("[step not certain"), first["message"][:200]
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"], failure["call"]["kind"]) == ("exception", 40, "watch"), failure
    origin = summary["origin"]
    assert origin["op_type"] == "dataset" and origin["source"]["line"] == line_of(
        ZOO / "gan_watch.py", "# BUG: the corrupt image"), origin
    assert "corrupt image file 0158.png" in proc.stdout, explain(proc)


@pytest.mark.slow
def test_a_torch_style_model_with_a_replaced_register_hook_is_hunted_and_its_fix_trains_finite(tmp_path):
    """torch_style_watch.py: the model is not an nn.Cell (its MindSpore Parameters reached by named_parameters()),
    and the script replaces Tensor.register_hook like mindnlp does. watch takes the model; the eager step is
    replayed with mindguard calling MindSpore's own hook registration, so the answer is right: global step 5, the
    0/0 of the masked mean on its line, the count-of-zero hint. --fix applies it and trains finite."""
    proc, run, summary = hunt(tmp_path, "torch_style_watch.py")
    check(proc, summary, 1, "failure_found")
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"]) == ("nonfinite_loss", 5), failure
    assert failure.get("params_checked") == 7, failure
    assert not any(n.startswith("adam_") for n in failure["nonfinite"]), failure["nonfinite"]   # moments: not checked
    origin = summary["origin"]
    assert origin["op_type"] in ("Div", "RealDiv") and origin["direction"] == "forward", origin
    assert origin["source"]["line"] == line_of(ZOO / "torch_style_watch.py", "# CULPRIT"), origin["source"]
    assert "0/0 = NaN" in origin["hint"] and "/ ops.maximum(count, 1)" in origin["hint"], origin["hint"]
    assert "NOT REPRODUCIBLE" not in proc.stderr, explain(proc)
    fixed, _, summary = hunt(tmp_path, "torch_style_watch.py", "--fix", name="fixed")
    check(fixed, summary, 0, "healthy")


BROKEN_MINDGUARD = """
import runpy, sys
import mindguard.training.examine.api_hooks as hooks

def broken(tensor, hook):   # mindguard's own code failing inside the recorded step (a bug of its, simulated)
    raise AttributeError("'Parameter' object has no attribute '_data'")

hooks.register_hook = broken
sys.argv = [{script!r}]
runpy.run_path({script!r}, run_name="__main__")
"""


@pytest.mark.slow
def test_mindguards_own_failure_in_the_replay_is_its_own_never_not_reproducible(tmp_path):
    """When mindguard's recording itself fails in pass 2, the hunt ends with its own message and exit 2 -- not
    NOT REPRODUCIBLE with seed advice, and the user's step still ran."""
    wrapper = tmp_path / "broken_train.py"
    wrapper.write_text(BROKEN_MINDGUARD.format(script=str(ZOO / "torch_style_watch.py")))
    run = tmp_path / "run"
    proc = run_hunt(run, sys.executable, str(wrapper), cwd=tmp_path)
    summary = summary_of(run)
    check(proc, summary, 2, "mindguard_failed")
    assert "mindguard itself failed" in proc.stderr and "'_data'" in summary["mindguard_error"], explain(proc)
    assert "NOT REPRODUCIBLE" not in proc.stderr and "fix_randomness" not in proc.stderr, explain(proc)


@pytest.mark.slow
def test_a_nan_in_a_watched_gan_container_is_found_at_its_op_and_the_fix_trains_finite(tmp_path):
    """gan_watch.py --nan_step 9: watch over the container of two train cells and two optimizers (every Parameter
    of both networks checked, neither optimizer's moments); the failing call is replayed with every operator
    recorded: the forward Log of log(sigmoid) on its line, fixed from the logit (-softplus), which trains finite."""
    proc, run, summary = hunt(tmp_path, "gan_watch.py", "--nan_step", "9")
    check(proc, summary, 1, "failure_found")
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"], failure.get("params_checked")) == ("nonfinite_loss", 9, 6), failure
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("Log", "forward"), origin
    assert origin["source"]["line"] == line_of(ZOO / "gan_watch.py", "# CULPRIT"), origin["source"]
    assert "fix:    loss_real = ops.softplus(-out_real).mean()" in origin["hint"], origin["hint"]
    fixed, _, summary = hunt(tmp_path, "gan_watch.py", "--nan_step", "9", "--fix", name="fixed")
    check(fixed, summary, 0, "healthy")


@pytest.mark.fast
def test_log_of_sigmoid_is_rewritten_from_the_logit():
    from mindguard.analysis.rewrite import rewrite_log_sigmoid

    assert rewrite_log_sigmoid("l = -ops.log(ops.sigmoid(d)).mean()") == "l = ops.softplus(-d).mean()"
    assert rewrite_log_sigmoid("l = -ops.log(1.0 - ops.sigmoid(d) + 1e-6)") == "l = ops.softplus(d)"
    assert rewrite_log_sigmoid("y = torch.log(torch.sigmoid(a + b))") == "y = -torch.nn.functional.softplus(-(a + b))"
    assert rewrite_log_sigmoid("p = ops.log(probs)") is None


@pytest.mark.fast
def test_a_raised_steps_candidate_iterations_come_from_each_graphs_own_count():
    """The measured pattern of kg_manual_loop.py: graph 0 listed once (iteration 0, step 1), then only graph 3 is
    listed (1..16 at the even steps) while graph 0 runs unlisted at the odd ones; step 33 raised in graph 0's 17th
    run, iteration 16. Its candidates hold 16, and never only step - 1."""
    from mindguard.training.run import Run, StepInfo, TrainingCall

    run = Run(None)
    call = TrainingCall(index=1, network="KG", kind="train")
    for step in range(1, 33):
        runs = {0: [0]} if step == 1 else {3: [step // 2]} if step % 2 == 0 else {}
        run.iterations.note_listed(StepInfo(global_step=step, call=call), runs)
    candidates = run.iterations.candidates(StepInfo(global_step=33, call=call))
    assert 16 in candidates and len(candidates) <= 6, candidates


@pytest.mark.fast
def test_mindguards_own_errors_are_told_from_the_users():
    from mindguard.training.run import _mindguards_own

    def raise_in(code: str, filename: str):
        try:
            exec(compile(code, filename, "exec"), {})
        except Exception as exc:  # noqa: BLE001
            return exc
    import mindguard

    own = raise_in("raise AttributeError('x')",
                   str(Path(mindguard.__file__).parent / "training" / "examine" / "capture.py"))
    user = raise_in("raise AttributeError('x')", str(REPO / "tests" / "zoo" / "train.py"))
    assert _mindguards_own(own) and _mindguards_own(user) is None
    assert _mindguards_own(mindguard.errors.NonFiniteError("loss", None)) is None


def test_watch_takes_a_torch_style_model_and_refuses_what_has_no_parameters():
    import mindspore as ms
    from mindspore import nn

    import mindguard
    from mindguard.training.checks.params import as_network, written_parameters
    from mindguard.errors import ArgumentTypeError

    class TorchStyle:   # not a Cell: Parameters reached the torch way
        def __init__(self):
            self.dense = nn.Dense(3, 2)

        def named_parameters(self):
            return ((f"dense.{p.name}", p) for p in self.dense.get_parameters())

        def forward(self, x):
            return self.dense(x)

    model = TorchStyle()
    view = as_network(model)
    assert type(view).__name__ == "TorchStyle" and len(list(view.get_parameters())) == 2
    assert any(cell is model.dense for _, cell in view.cells_and_names())
    opt = nn.Adam(list(view.get_parameters()), 1e-3)
    assert len(written_parameters(view, opt, extra=(opt,))) == 2   # the moments are the optimizer's, not checked
    with pytest.raises(ArgumentTypeError, match="torch-style model"):
        mindguard.watch(lambda x: x, object())
    mindguard.watch(lambda x: ms.Tensor(0.0), model, opt)   # accepted
