"""`mindguard hunt` on training scripts written the way model-zoo code is (tests/zoo/*.py).

Each script plants one bug at a step stated in its docstring (read off a plain run with ``--watch``).
These tests hunt the script in a real subprocess and check the answer in ``<run>/summary.json``:
``failure`` (pass 1's record: kind, process-wide 1-based ``global_step``, ``call`` = {index, network},
``epoch``/``step_in_epoch`` as MindSpore printed them in that call), ``origin`` (op_type, direction,
source {file, line, code}, hint), ``stopped_at`` for crashes and ``nonfinite_inputs`` for a bad batch.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterable, Tuple

import numpy as np
import pytest

from conftest import REPO
from hunting import explain, line_of, run_hunt, summary_of
from page_checks import check_page_file

pytestmark = pytest.mark.slow

ZOO = REPO / "tests" / "zoo"










def hunt_zoo(tmp_path: Path, script: str, *args: str) -> Tuple[subprocess.CompletedProcess, Path, dict]:
    """Hunt ``tests/zoo/<script>`` from ``tmp_path`` (so its checkpoints and records land there)."""
    run = tmp_path / "run"
    out = tmp_path / "out"
    out_flag = {"per_epoch_loop.py": "--output_dir", "kg_two_phase.py": "--output_path",
                "train_with_eval.py": "--ckpt_path"}.get(script)
    extra = (out_flag, str(out)) if out_flag else ()
    proc = run_hunt(run, sys.executable, str(ZOO / script), *args, *extra, cwd=tmp_path)
    summary = summary_of(run) if (run / "summary.json").exists() else {}
    return proc, run, summary


def check_exit(proc, summary, code: int, outcome: str) -> None:
    assert proc.returncode == code, f"expected exit {code}\n{explain(proc)}"
    assert summary.get("outcome") == outcome, \
        f"outcome {summary.get('outcome')!r}, expected {outcome!r}; summary keys {sorted(summary)}"


def check_failure(summary: dict, *, kind: str, global_step: int, call: int, network: str,
                  epoch: int, step_in_epoch: int) -> dict:
    failure = summary.get("failure")
    assert failure, (f"summary has no 'failure' (keys {sorted(summary)}); pass 1 records: "
                     f"{json.dumps((summary.get('pass1') or {}).get('records'), default=str)[:1500]}")
    got = {"kind": failure.get("kind"), "global_step": failure.get("global_step"), "call": failure.get("call"),
           "epoch": failure.get("epoch"), "step_in_epoch": failure.get("step_in_epoch")}
    want = {"kind": kind, "global_step": global_step, "call": {"index": call, "network": network},
            "epoch": epoch, "step_in_epoch": step_in_epoch}
    if isinstance(got["call"], dict):
        got["call"] = {k: got["call"].get(k) for k in ("index", "network")}
    assert got == want, f"failure record\n  got:  {got}\n  want: {want}\n  full: {failure}"
    return failure


def check_origin(summary: dict, script: str, *, op_types: Iterable[str], direction: str,
                 markers: Iterable[str], hint_words: Iterable[str] = ()) -> dict:
    origin = summary.get("origin")
    shown = {k: summary.get(k) for k in ("outcome", "origin", "stopped_at", "replay")}
    assert origin, f"summary has no origin: {json.dumps(shown, default=str)[:2000]}"
    op_types = set(op_types)
    assert origin.get("op_type") in op_types, f"op_type {origin.get('op_type')!r} not in {op_types}: {origin}"
    assert origin.get("direction") == direction, f"direction {origin.get('direction')!r} != {direction!r}: {origin}"
    path = ZOO / script
    source = origin.get("source") or {}
    assert source.get("file") and Path(source["file"]).resolve() == path.resolve(), f"source file: {source}"
    lines = {line_of(path, marker): marker for marker in markers}
    assert source.get("line") in lines, f"source line {source.get('line')} not one of {lines}: {source}"
    for word in hint_words:
        assert word in (origin.get("hint") or ""), f"{word!r} not in hint: {origin.get('hint')!r}"
    return origin


# 1-3. per-epoch loop ----------------------------------------------------------------------------

# the shared-Guard loop (GRAPH and PyNative) is hunted from step 1 and resumed in tests/test_resume.py
# (test_resumed_hunt_of_a_per_epoch_loop_gives_the_answer_of_the_run_from_step_1), its failure and origin checked there

def test_per_epoch_loop_fresh_guard_every_call(tmp_path):
    proc, run, summary = hunt_zoo(tmp_path, "per_epoch_loop.py", "--guard", "fresh")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_params", global_step=10, call=3,
                  network="TrainOneStepCellWithGradClip", epoch=1, step_in_epoch=2)
    check_origin(summary, "per_epoch_loop.py", op_types={"SqrtGrad"}, direction="backward",
                 markers=["# CULPRIT"], hint_words=["SafeNorm"])


def test_per_epoch_loop_guard_model(tmp_path):
    """guard_model: the refused update at global step 10 is recorded as nonfinite_grads. GuardedTrainStep refused the
    bad update, so the weights are intact: the step is captured and replayed in pass 1, and the hunt never reruns
    the training (this carries tests/test_hunt.py's GuardedTrainStep hunt of the norm demo)."""
    proc, run, summary = hunt_zoo(tmp_path, "per_epoch_loop.py", "--guard", "guard_model")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_grads", global_step=10, call=3,
                  network="GuardedTrainStep", epoch=1, step_in_epoch=2)
    check_origin(summary, "per_epoch_loop.py", op_types={"SqrtGrad", "Norm"}, direction="backward",
                 markers=["# CULPRIT"], hint_words=["SafeNorm"])
    assert summary["failure"]["dump_iteration"] == 9, summary["failure"]
    assert not (run / "pass2").exists(), "the hunt reran the training"
    first = json.loads((run / "pass1" / "replay.json").read_text())["first"]
    assert (first["cell"], first["direction"]) == ("norm", "backward"), first
    assert "no second pass needed" in proc.stderr and "SafeNorm" in proc.stdout, explain(proc)


# 4 + 11. two phases, ops.norm in a helper two calls deep ------------------------------------------

@pytest.mark.parametrize("guard", ["shared", "per_phase_record"])   # (per_phase: in phase two, below)
def test_two_phase_failure_in_phase_one_stops_phase_two(tmp_path, guard):
    proc, run, summary = hunt_zoo(tmp_path, "kg_two_phase.py", "--guard", guard, "--bad_phase", "head",
                                  "--bad_step", "5")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_params", global_step=5, call=1, network="KGTrainOneStepCell",
                  epoch=2, step_in_epoch=2)
    check_origin(summary, "kg_two_phase.py", op_types={"SqrtGrad"}, direction="backward",
                 markers=["# CULPRIT"], hint_words=["safe_norm(x, axis=2)"])
    assert "stopped before its first step" in proc.stderr, explain(proc)


# (per_phase_record: under the hunt every Guard's record= is replaced by the hunt's path (Recorder.add_path), so it
# runs per_phase's path -- a Guard of its own per call; it stays in phase one, above)
@pytest.mark.parametrize("guard", ["shared", "per_phase"])
def test_two_phase_failure_in_phase_two(tmp_path, guard):
    """Phase 1 has 6 steps; the bad triple is phase-2 step 4: global step 10, call 2, epoch 2 step 1."""
    proc, run, summary = hunt_zoo(tmp_path, "kg_two_phase.py", "--guard", guard, "--bad_phase", "tail",
                                  "--bad_step", "4")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_params", global_step=10, call=2, network="KGTrainOneStepCell",
                  epoch=2, step_in_epoch=1)
    check_origin(summary, "kg_two_phase.py", op_types={"SqrtGrad"}, direction="backward",
                 markers=["# CULPRIT"], hint_words=["safe_norm(x, axis=2)"])


def test_norm_helper_two_calls_deep_in_pynative(tmp_path):
    proc, run, summary = hunt_zoo(tmp_path, "kg_two_phase.py", "--mode", "pynative")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_params", global_step=5, call=1, network="KGTrainOneStepCell",
                  epoch=2, step_in_epoch=2)
    check_origin(summary, "kg_two_phase.py", op_types={"SqrtGrad", "Sqrt", "TransE"}, direction="backward",
                 markers=["# CULPRIT"], hint_words=["safe_norm(x, axis=2)"])


# 5. a step that raises inside the per-epoch loop ------------------------------------------------

def test_per_epoch_loop_out_of_range_token_crash(tmp_path):
    proc, run, summary = hunt_zoo(tmp_path, "per_epoch_loop.py", "--bug", "oov")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="exception", global_step=7, call=2, network="TrainOneStepCellWithGradClip",
                  epoch=1, step_in_epoch=3)
    stopped = summary.get("stopped_at")
    assert stopped and (stopped.get("op") or {}).get("op_type") == "Gather", f"stopped_at: {stopped}"
    assert "index out of range" in (stopped.get("hint") or ""), stopped.get("hint")
    source = stopped["op"].get("source") or {}
    assert source.get("line") == line_of(ZOO / "per_epoch_loop.py", "# GATHER"), f"stopped_at source: {source}"


# 6-7. validation inside training ----------------------------------------------------------------

def test_fit_healthy_exits_zero(tmp_path):
    """A healthy run (validation inside training included) exits 0 with no second pass (nothing dumped), and the
    user's output passes through (also tests/test_hunt.py's healthy norm demo before)."""
    proc, run, summary = hunt_zoo(tmp_path, "train_with_eval.py", "--style", "fit", "--healthy")
    check_exit(proc, summary, 0, "healthy")
    assert not (run / "pass2").exists(), sorted(p.name for p in run.iterdir())
    assert "all parameters finite: True" in proc.stdout, explain(proc)


@pytest.mark.parametrize("style", ["fit", "eval_callback"])
def test_validation_during_training_then_nan(tmp_path, style):
    """Two evaluations run before the mis-scaled batch of global step 10 (epoch 3 step 2)."""
    proc, run, summary = hunt_zoo(tmp_path, "train_with_eval.py", "--style", style)
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_loss", global_step=10, call=1, network="TrainOneStepCell",
                  epoch=3, step_in_epoch=2)
    check_origin(summary, "train_with_eval.py", op_types={"Log"}, direction="forward",
                 markers=["# CULPRIT"], hint_words=["log_softmax"])


# 8. dynamic loss scale --------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_dynamic_loss_scale_nan_loss_is_a_failure_finite_overflow_is_not(tmp_path, mode):
    """PyNative replays the captured step: the DynamicLossScaleUpdateCell's step counters are the train cell's own
    Parameters, not the network's (they were captured as the network's, and the replay refused the capture)."""
    proc, run, summary = hunt_zoo(tmp_path, "loss_scale_step.py", "--mode", mode)
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_loss", global_step=7, call=1,
                  network="TrainOneStepWithDynamicLossScaleCell", epoch=2, step_in_epoch=3)
    if mode == "graph":   # the dump's analysis lists the non-finite graph inputs; the replay names the input
        assert summary.get("nonfinite_inputs"), f"nonfinite_inputs: {summary.get('nonfinite_inputs')!r}"
    origin = summary.get("origin")
    assert origin and origin.get("direction") == "input", f"origin: {origin}"


# 9-10. BatchNorm ----------------------------------------------------------------------------------

def first_nonfinite_step(tmp_path: Path, script: str, *args: str) -> Tuple[int, int, int]:
    """``(global step, epoch, step in epoch)`` where a plain run of ``script`` (no Guard; tests/zoo/nan_watch.py
    checks the loss, every Parameter and the batch after each step) first sees a non-finite value. The oracle for
    exploding-learning-rate runs, whose failing step moves with MindSpore's numerics (2.7.2: step 16, 2.10: 14)."""
    env = dict(os.environ, GLOG_v="3")
    proc = subprocess.run([sys.executable, str(ZOO / script), *args, "--watch", "--no_guard"], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    match = re.search(r"FIRST NON-FINITE at global step (\d+) \(call \d+, epoch (\d+) step (\d+)/", proc.stdout)
    assert match, explain(proc)
    return int(match.group(1)), int(match.group(2)), int(match.group(3))


def test_exploding_lr_batchnorm_forward(tmp_path):
    """Hunted twice against one plain run's answer (the oracle): with the default Guard, and with
    ``Guard(defer_check=True)``, the GPU/Ascend default, whose compiled check must stay out of the hunt's dump (it
    would be dumped as a graph of its own, and the training graph's iterations went unobserved)."""
    step, epoch, in_epoch = first_nonfinite_step(tmp_path, "bn_explode.py", "--arch", "convbn")
    for guard in ("default", "defer"):
        where = tmp_path / guard
        where.mkdir()
        proc, run, summary = hunt_zoo(where, "bn_explode.py", "--arch", "convbn",
                                      *(["--guard_defer"] if guard == "defer" else []))
        check_exit(proc, summary, 1, "failure_found")
        if guard == "defer":
            assert "defer_check=True is not applied under mindguard hunt" in proc.stderr, proc.stderr[-2000:]
            assert summary["failure"].get("seen_at_step") is None, summary["failure"]
        check_failure(summary, kind="nonfinite_params", global_step=step, call=1, network="TrainStep",
                      epoch=epoch, step_in_epoch=in_epoch)
        check_origin(summary, "bn_explode.py", op_types={"BatchNorm"}, direction="forward",
                     markers=["# CULPRIT"], hint_words=["learning rate"])
        # the BatchNorm's Parameter inputs are read from the state kept when the step began, not from files dumped
        # after it: the moving variance it read is finite (it is what overflows in this step) and equals the kept
        # copy
        states = [p.parent for p in run.glob("*/state/state.json") if json.loads(p.read_text())["step"] == step]
        assert states, sorted(p.name for p in run.iterdir())
        meta = json.loads((states[0] / "state.json").read_text())
        with np.load(states[0] / "state.npz", allow_pickle=False) as arrays:
            kept = arrays[f"p{meta['names'].index('bn.moving_variance')}"]
        read = summary["origin"]["inputs"][4]
        assert not read.get("post_update") and read["pos_inf"] == 0, read
        assert np.isclose(read["max"], kept.max(), rtol=1e-4), (read["max"], kept.max())


def test_batchnorm_buffer_goes_inf_before_any_weight(tmp_path):
    step, epoch, in_epoch = first_nonfinite_step(tmp_path, "bn_explode.py", "--arch", "resnet")
    proc, run, summary = hunt_zoo(tmp_path, "bn_explode.py", "--arch", "resnet")
    check_exit(proc, summary, 1, "failure_found")
    failure = check_failure(summary, kind="nonfinite_params", global_step=step, call=1, network="TrainStep",
                            epoch=epoch, step_in_epoch=in_epoch)
    assert "moving_variance" in json.dumps(failure.get("nonfinite") or failure.get("message")), failure
    # the BatchNorm whose statistics overflowed first depends on MindSpore's numerics (2.10: bn1, 2.7/2.8: bn2)
    marker = "# CULPRIT-RESNET-BN2" if any(".bn2." in n for n in failure["nonfinite"]) and not any(
        ".bn1." in n for n in failure["nonfinite"]) else "# CULPRIT-RESNET"
    check_origin(summary, "bn_explode.py", op_types={"BatchNorm"}, direction="forward",
                 markers=[marker], hint_words=["learning rate"])
    # the EMA train step reads weights through TensorMove copies: the narrow dump leaves the copies out and the
    # BatchNorm's five inputs are still read (through the copies, from the state kept at the step)
    names = [p.name for p in run.glob("*/dump/**/*.npy")]
    assert names and not any(n.startswith(("TensorMove.", "Assign.")) for n in names), sorted(set(
        n.split(".")[0] for n in names))
    inputs = summary["origin"]["inputs"]
    assert [i["slot"] for i in inputs] == [0, 1, 2, 3, 4] and not any(i.get("unreadable") for i in inputs), inputs
    # a ResNet's page stays small (its graph is the culprit's neighbourhood, not the network)
    check_page_file(run)


# 12. PyNative with a jit sub-cell ---------------------------------------------------------------

def test_pynative_jit_subcell_backward_is_the_culprit(tmp_path):
    """The replay runs the @ms.jit cell eagerly (MS_JIT=0) and sees its ops: the backward of its sqrt, on its line."""
    proc, run, summary = hunt_zoo(tmp_path, "pynative_jit_cell.py")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_params", global_step=6, call=1, network="TrainOneStepCell",
                  epoch=2, step_in_epoch=2)
    origin = check_origin(summary, "pynative_jit_cell.py", op_types={"SqrtGrad"}, direction="backward",
                          markers=["keepdims=True))  # CULPRIT"], hint_words=["+ 1e-6)"])
    assert origin.get("cell_type") == "PairDistance", origin
    assert "error: SqrtGrad (backward of Sqrt)" in proc.stdout, explain(proc)


# 13. the dataset raises ---------------------------------------------------------------------------

def test_generator_raising_is_recorded_at_its_batch(tmp_path):
    """An exception from the data pipeline arrives steps early (the pipeline reads ahead); the hunt re-runs the
    pipeline synchronously, records the step whose batch raised (global step 6) and names the raising line."""
    proc, run, summary = hunt_zoo(tmp_path, "generator_raises.py")
    check_exit(proc, summary, 1, "failure_found")
    first = summary["pass1"]["records"][0]
    assert first["phase"] == "between_steps" and first["global_step"] < 6, first   # read ahead: too early
    failure = check_failure(summary, kind="exception", global_step=6, call=1, network="TrainOneStepCell",
                            epoch=1, step_in_epoch=6)
    assert "corrupt record 21" in (failure.get("message") or ""), failure
    origin = summary.get("origin") or {}
    assert (origin.get("op_type"), origin.get("direction")) == ("dataset", "input"), origin
    assert origin["source"]["line"] == line_of(ZOO / "generator_raises.py", "# BUG: the corrupt record"), origin
    assert "the dataset raised while producing the batch of epoch 1, step 6/6 (global step 6)" in proc.stdout, \
        explain(proc)


def test_generator_raising_under_sink_mode_is_refused_with_the_fix(tmp_path):
    """MindSpore cannot run the pipeline synchronously (its debug mode) with dataset_sink_mode=True: the hunt says
    to hunt without sink mode and exits 2, instead of calling the run not reproducible."""
    proc, run, summary = hunt_zoo(tmp_path, "generator_raises.py", "--sink")
    check_exit(proc, summary, 2, "examine_failed")
    assert "Hunt with Model.train(..., dataset_sink_mode=False)" in proc.stderr, explain(proc)
    assert "NOT REPRODUCIBLE" not in proc.stderr, explain(proc)


# 14. PyNative, a train step that is a plain Cell (no .network to replay) ------------------------

def test_plain_train_cell_in_pynative_is_recorded_in_place(tmp_path):
    """No `.network` to rebuild the step from: the examined step itself runs with every operator recorded."""
    proc, run, summary = hunt_zoo(tmp_path, "plain_train_cell.py")
    check_exit(proc, summary, 1, "failure_found")
    check_failure(summary, kind="nonfinite_loss", global_step=4, call=1, network="TrainStep",
                  epoch=1, step_in_epoch=4)
    check_origin(summary, "plain_train_cell.py", op_types={"Log"}, direction="forward",
                 markers=["# CULPRIT"], hint_words=["log_softmax"])


# hand-written BCE: log(1 - sigmoid) of a saturated logit -------------------------------------------

@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_saturated_sigmoid_in_a_hand_written_bce_is_the_forward_log(tmp_path, mode):
    """bce_saturated.py: the forward ``Log`` of ``1 - p`` is the origin in both modes, never the backward ``Div``
    of that Log, which reads the same zero and which MindSpore's CPU runtime may run first (then the report says
    so), and on the culprit's own line in both: in GRAPH the .ir gives both Log kernels the first call's line,
    and the line that computes this kernel's argument, which calls log too, is shown instead."""
    proc, run, summary = hunt_zoo(tmp_path, "bce_saturated.py", "--mode", mode)
    check_exit(proc, summary, 1, "failure_found")
    assert summary["failure"]["global_step"] == 4, summary["failure"]
    origin = summary["origin"]
    assert (origin["op_type"], origin["direction"]) == ("Log", "forward"), origin
    assert origin["inputs"][0]["zeros"] >= 1 and origin["inputs"][0]["min"] == 0, origin["inputs"]
    culprit = line_of(ZOO / "bce_saturated.py", "# CULPRIT")
    assert origin["source"]["line"] == culprit, origin["source"]
    assert "ops.log(1.0 - p + 1e-6)" in origin["hint"], origin["hint"]   # the fix edits this call, not log(p)
    if mode == "graph":
        assert "dump_scopes" not in summary, summary.get("dump_scopes")   # the narrow dump explains it
        report = (run / "report.txt").read_text()   # the .ir said the first call's line: the report says why not
        assert f"so line {culprit} is shown" in report, report[-3000:]


@pytest.mark.parametrize("mode,mask", [("graph-jit", "fill"), ("pynative", "additive")])   # each mode, each mask
# (the rule itself runs on a recorded dump of this script in tests/test_fast_evidence.py)
def test_intended_minus_inf_masks_are_not_the_culprit_the_nan_they_meet_is(tmp_path, mode, mask):
    """masked_attention.py: a padding mask of -inf (masked_fill, or an additive 0/-inf mask in the batch) is
    harmless until a sequence is all padding; then the softmax's ``s - max(s)`` is ``-inf - -inf``. The culprit is
    that Sub, named with the masking fix -- not the masked_fill that wrote the -inf, nor the batch holding it."""
    options = ["--mode", "pynative"] if mode == "pynative" else ["--mode", "graph", "--jit"]
    proc, run, summary = hunt_zoo(tmp_path, "masked_attention.py", *options, "--mask", mask)
    check_exit(proc, summary, 1, "failure_found")
    assert (summary["failure"]["kind"], summary["failure"]["global_step"]) == ("nonfinite_loss", 4), summary["failure"]
    origin = check_origin(summary, "masked_attention.py", op_types={"Sub"}, direction="forward",
                          markers=["# CULPRIT"], hint_words=["-1e9"])
    assert any(i.get("neg_inf") for i in origin["inputs"]) and not any(i.get("nan") for i in origin["inputs"]), origin
    assert "turned infinite inputs (no NaN) into NaN" in proc.stdout, explain(proc)


@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_amp_o2_division_by_a_zero_std_is_named_not_a_mislabelled_fp16_file(tmp_path, mode):
    """amp_input_norm.py: AMP O2, a fixed loss scale, a conv-BN net. In GRAPH, MindSpore's CPU dump labels the
    float32 result of several float16-typed kernels (the Pow of the variance) float16: read as float16 those bytes
    hold NaN, and the Pow was named. The .ir's kernel types say float32: such files are not read, and the division
    by the zero std is the origin in both modes."""
    proc, run, summary = hunt_zoo(tmp_path, "amp_input_norm.py", "--mode", mode)
    check_exit(proc, summary, 1, "failure_found")
    assert summary["failure"]["global_step"] == 5, summary["failure"]
    check_origin(summary, "amp_input_norm.py", op_types={"Div", "RealDiv"}, direction="forward",
                 markers=["# CULPRIT"], hint_words=["epsilon"])
    if mode == "graph":
        assert "its kernel computed float32" in (run / "report.txt").read_text(), (run / "report.txt").read_text()


@pytest.mark.parametrize("mode", ["pynative", "graph-jit"])
def test_a_nan_gradient_waiting_in_an_accumulator_is_caught_at_its_micro_step(tmp_path, mode):
    """grad_accumulation.py: the tutorial's Accumulator (a plain object holding cloned Parameters) sums the
    gradients; micro-step 4 does not update, so its NaN gradient waits in the buffers while the weights and the loss
    stay finite. watch checks the Parameters the step function reaches by name too: the failure is step 4, the
    buffers, and the norm's backward at its line -- not step 6's update (AssignAdd, before)."""
    options = ["--mode", "pynative"] if mode == "pynative" else ["--mode", "graph", "--jit"]
    proc, run, summary = hunt_zoo(tmp_path, "grad_accumulation.py", *options)
    check_exit(proc, summary, 1, "failure_found")
    failure = summary["failure"]
    assert (failure["kind"], failure["global_step"]) == ("nonfinite_params", 4), failure
    assert failure["nonfinite"] == ["accumulate_.embedding.embedding_table"], failure
    check_origin(summary, "grad_accumulation.py", op_types={"SqrtGrad"}, direction="backward",
                 markers=["# CULPRIT"])
