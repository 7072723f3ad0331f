"""What the hunt says when no operator was isolated (mindguard/hunt/known.py, issue 43): never an empty answer, and
never one that contradicts the evidence. Pure data: records and reports written here, no MindSpore."""
from __future__ import annotations

import pytest

from mindguard.hunt.known import failing_pass, known, render

pytestmark = pytest.mark.fast

COMMAND = ["python", "train.py", "--mode", "pynative"]


def record(kind="nonfinite_params", loss=10.0, nonfinite=("net_d.conv.weight", "net_d.fc.weight"), step=1):
    return {"kind": kind, "loss": loss, "nonfinite": list(nonfinite), "global_step": step}


def test_weights_non_finite_after_a_finite_loss_is_the_backward_and_a_non_finite_loss_the_forward():
    assert failing_pass(record()) == "backward"
    assert failing_pass(record(kind="nonfinite_grads", nonfinite=("gradients",))) == "backward"
    assert failing_pass(record(kind="nonfinite_loss", loss="nan")) == "forward"
    assert failing_pass(record(loss="nan")) is None            # weights and loss both bad: not known which
    assert failing_pass(record(loss=None)) is None
    assert failing_pass(record(kind="exception", loss=None)) is None


def test_an_unisolated_replay_states_the_pass_the_first_parameters_what_it_saw_and_the_next_command():
    """The WGAN-GP in PyNative (tests/zoo/wgan_gp.py --mode pynative): the replay sees 61 operator calls, none
    non-finite, while the critic's weights are NaN after a loss of 10.0."""
    replay = {"first": None, "ops_recorded": 61, "parameters_nonfinite_after_update": ["net_d.conv.weight"]}
    found = known(record(), "replay", COMMAND, "/run/pass2", replay=replay, tried=["replay of global step 1"])
    assert found["pass"] == "backward"
    text = render(found)
    assert "the loss was finite (10) while Parameters went non-finite" in text and "backward pass" in text, text
    assert "first Parameters found non-finite after global step 1: net_d.conv.weight, net_d.fc.weight" in text, text
    assert "recorded 61 operator call(s) of the step and none made Inf/NaN" in text, text
    assert "GRAPH_MODE" in found["next"] and "mindguard hunt -- python train.py --mode pynative" in found["next"]
    assert "examined by: replay of global step 1" in text


def test_a_dump_with_inf_nan_but_no_origin_lists_the_ops_holding_it_in_execution_order():
    report = {"origin": None, "nonfinite_inputs": [],
              "first_nonfinite": {"op_type": "Mul", "name": "Gradients/Default/Grad_Pow/Mul-op1",
                                  "direction": "backward"},
              "profile": [{"index": 0, "name": "Default/MatMul-op0", "op_type": "MatMul", "nonfinite": False},
                          {"index": 1, "name": "Gradients/Default/Grad_Pow/Mul-op1", "op_type": "Mul",
                           "nonfinite": True},
                          {"index": 2, "name": "Default/Adam-op0", "op_type": "Adam", "nonfinite": True}]}
    found = known(record(), "dump", ["python", "t.py"], "/run/pass2-full/dump", report=report, widest=True)
    text = render(found)
    assert found["pass"] == "backward"
    assert "Inf/NaN first appears at Mul (Gradients/Default/Grad_Pow/Mul-op1, backward)" in text, text
    assert ("operators with non-finite outputs, in execution order: Mul (Gradients/Default/Grad_Pow/Mul-op1, #2 of "
            "3), Adam (Default/Adam-op0, #3 of 3)") in text, text
    assert "mindguard analyze /run/pass2-full/dump --json" in found["next"], found["next"]
    narrow = known(record(), "dump", ["python", "t.py"], "/run/pass2/dump", report=report, widest=False)
    assert "mindguard hunt --dump-scope full -- python t.py" in narrow["next"], narrow["next"]


def test_a_clean_dump_of_a_step_whose_weights_went_nan_says_it_was_made_outside_the_graph_not_the_backward():
    """A callback overwrote a Parameter with NaN after the step (tests/test_hunt.py): the loss was finite and the
    step's complete dump holds no Inf/NaN, so "the backward" would contradict the dump."""
    report = {"origin": None, "first_nonfinite": None, "nonfinite_inputs": [], "profile": [
        {"index": 0, "name": "Default/MatMul-op0", "op_type": "MatMul", "nonfinite": False}]}
    found = known(record(nonfinite=("embedding.embedding_table",), step=5, loss=0.48), "dump", ["python", "t.py"],
                  "/run/d", report=report, widest=True)
    assert found["pass"] == "outside", found
    text = render(found)
    assert "holds no Inf/NaN in any file mindguard could read" in text and "outside the dumped graph" in text, text
    assert "between steps" in found["next"], found["next"]
