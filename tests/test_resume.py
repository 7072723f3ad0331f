"""A hunt's pass 2 resumed from the training state pass 1 kept before the failure (mindguard.training.state.resume).

Every hunt here runs real training scripts in subprocesses (``--resume always`` forces the resumed route on
runs short enough for CI; ``--keep-every`` makes pass 1 keep the state at known steps). What must hold: the
answer is the one the run from step 1 gives (same step, operator, direction, line), the resumed pass skipped
the steps before the kept state, and a resumed run that computes something else is noticed and replaced by
a run from step 1.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from conftest import REPO, run_python
from hunting import explain, line_of, run_hunt, summary_of

ZOO = REPO / "tests" / "zoo"
SAMPLE = REPO / "samples" / "functional_loop.py"


def hunt(tmp_path: Path, name: str, script: Path, *args: str, options=()):
    run = tmp_path / name
    proc = run_hunt(run, sys.executable, str(script), *args, cwd=tmp_path, options=options)
    return proc, run, (summary_of(run) if (run / "summary.json").exists() else {})


def origin_of(summary: dict):
    origin = summary.get("origin") or {}
    return origin.get("op_type"), origin.get("direction"), (origin.get("source") or {}).get("line")


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["graph", "pynative"])
def test_resumed_hunt_of_a_per_epoch_loop_gives_the_answer_of_the_run_from_step_1(tmp_path, mode):
    """``for epoch: model.train(1, ...)`` with one shared Guard fails at global step 10 (call 3); pass 1 keeps the
    state at steps 5 and 9 (every 4):
    pass 2 skips calls 1-2 and step 9's predecessors, loads step 9's state, and finds what a run from step 1
    finds. GRAPH: one dumped pass (the iteration counted from the kept step); PyNative: the replay."""
    script = ZOO / "per_epoch_loop.py"
    args = ("--mode", mode, "--output_dir", str(tmp_path / "out"))
    resumed, run, summary = hunt(tmp_path, "resumed", script, *args,
                                 options=("--resume", "always", "--keep-every", "4"))
    assert resumed.returncode == 1, explain(resumed)
    assert summary["resume"]["route"] == "resumed" and summary["resume"]["kept_step"] == 9, summary["resume"]
    assert not (run / "pass2").exists() and not (run / "locate").exists(), sorted(p.name for p in run.iterdir())
    log = (run / "resumed" / "output.log").read_text(errors="replace")
    assert "steps 1-8 skipped (" in log and "training state of global step 9 loaded" in log, log[-3000:]
    state = json.loads((run / "pass1" / "state" / "state.json").read_text())
    assert state["step"] == 9 and set(state["trace"]) == {"9", "10"}, state
    assert summary["failure"]["global_step"] == 10
    repeated = summary["resumed"]["records"][0]
    assert (repeated["global_step"], repeated["kind"]) == (10, summary["failure"]["kind"]), repeated
    assert repeated["loss"] == summary["failure"]["loss"], "the resumed step must compute exactly what pass 1 did"

    # the run from step 1 (also the plain hunt of per_epoch_loop.py with its default shared Guard, which
    # tests/test_zoo_hunt.py hunted again before): the failure as MindSpore counted it, the norm's backward
    full, full_run, full_summary = hunt(tmp_path, "full", script, *args, options=("--resume", "never"))
    assert full.returncode == 1 and full_summary.get("outcome") == "failure_found", explain(full)
    assert not (full_run / "pass1" / "state").exists(), "--resume never keeps nothing"
    failure = full_summary["failure"]
    assert (failure["kind"], failure["global_step"], failure["epoch"], failure["step_in_epoch"]) == \
        ("nonfinite_params", 10, 1, 2), failure
    assert {k: failure["call"].get(k) for k in ("index", "network")} == \
        {"index": 3, "network": "TrainOneStepCellWithGradClip"}, failure
    full_origin = full_summary["origin"]
    assert full_origin["op_type"] in ("SqrtGrad", "Norm") and full_origin["direction"] == "backward", full_origin
    assert Path(full_origin["source"]["file"]).resolve() == script.resolve(), full_origin["source"]
    assert full_origin["source"]["line"] == line_of(script, "# CULPRIT") and "SafeNorm" in full_origin["hint"], \
        full_origin
    assert origin_of(summary) == origin_of(full_summary), (summary.get("origin"), full_summary.get("origin"))
    assert origin_of(summary)[2] == line_of(script, "# CULPRIT"), summary.get("origin")
    if mode == "graph":
        dumped = {p.name for p in (run / "resumed" / "dump").rglob("*") if p.is_dir() and p.name.isdigit()}
        assert "1" in dumped, dumped   # step 10 is the second step the resumed process ran


@pytest.mark.slow
def test_a_state_kept_at_the_failing_step_is_dumped_from_its_first_step(tmp_path):
    """Two phases on two train cells: the failure is at global step 10, the second step of phase 2's epoch 2,
    and pass 1 kept the state exactly there (every 3 steps: 4, 7, 10): pass 2 skips phase 1 whole, runs phase 2's
    3 steps before the kept one as its warm-up (MindSpore's kernels launched as often as in pass 1:
    training/state/warm_up.py) and dumps everything its run computes from the kept step on, which is that one step:
    the train graph's iteration 3."""
    script = ZOO / "kg_two_phase.py"
    args = ("--bad_phase", "tail", "--bad_step", "4", "--output_path", str(tmp_path / "out"))
    proc, run, summary = hunt(tmp_path, "run", script, *args, options=("--resume", "always", "--keep-every", "3"))
    assert proc.returncode == 1, explain(proc)
    assert summary["resume"] == {**summary["resume"], "route": "resumed", "kept_step": 10}, summary["resume"]
    assert summary["failure"]["global_step"] == 10 and summary["failure"]["call"]["index"] == 2
    op, direction, line = origin_of(summary)
    assert (op, direction, line) == ("SqrtGrad", "backward", line_of(script, "# CULPRIT")), summary.get("origin")
    warm_up = json.loads((run / "pass1" / "state" / "state.json").read_text())["warm_up"]
    assert warm_up == 3, warm_up   # phase 2 began at global step 7
    iterations = {p.name for p in (run / "resumed" / "dump").glob("rank_*/*/*/*") if p.is_dir()}   # <net>/<graph>/<it>
    assert iterations == {"3"}, iterations


@pytest.mark.slow
def test_a_resumed_run_that_computes_something_else_is_replaced_by_a_run_from_step_1(tmp_path):
    """plateau_lr.py raises its learning rate from a loss history kept in Python: resumed from step 9, the
    skipped steps' history differs, the schedule follows it, and the trace shows it (step 11's Parameters);
    the hunt says so and examines the step from step 1 -- the answer a resumed run would have got wrong."""
    script = ZOO / "plateau_lr.py"
    proc, run, summary = hunt(tmp_path, "run", script, options=("--resume", "always", "--keep-every", "8"))
    assert proc.returncode == 1, explain(proc)
    assert summary["resume"]["kept_step"] == 9, summary["resume"]
    assert summary["resume"]["route"].startswith("from step 1"), summary["resume"]
    status = json.loads((run / "resumed" / "pass_status.json").read_text())
    assert status["ended"] == "diverged" and not status["diverged"]["unfit"], status
    assert 9 <= status["diverged"]["step"] < summary["failure"]["global_step"], status
    assert "stopped: from the kept state the run computes something else" in proc.stderr, explain(proc)
    assert (run / "pass2" / "dump").is_dir() and summary["pass2"]["records"][0]["global_step"] == \
        summary["failure"]["global_step"]
    full, _, full_summary = hunt(tmp_path, "full", script, options=("--resume", "never"))
    assert full.returncode == 1 and origin_of(summary) == origin_of(full_summary), explain(full)


@pytest.mark.slow
@pytest.mark.parametrize("mode, jit", [("graph", True), ("pynative", False)])
def test_resumed_hunt_of_the_functional_loop(tmp_path, mode, jit):
    """mindguard.watch: the skipped calls return zeros shaped like the step's output (the loop prints them),
    the state of the net and its optimizer is loaded at the kept step, and the answer is Log on its line.

    The failure and answer are the ones tests/test_watch.py's hunts of this loop from step 1 checked (compiled
    steps dumped, an eager step replayed); test_watch keeps the PyNative @jit case, and the plain route of a
    watched GRAPH @jit / eager step stays in tests/test_zoo_hunt.py (grad_accumulation, masked_attention)."""
    proc, run, summary = hunt(tmp_path, "run", SAMPLE, "--mode", mode, *(["--jit"] if jit else []),
                              options=("--resume", "always", "--keep-every", "1"))
    assert proc.returncode == 1, explain(proc)
    assert summary["resume"]["route"] == "resumed" and summary["resume"]["kept_step"] == 3, summary["resume"]
    failure = summary["failure"]
    assert (failure["global_step"], failure["call"]["kind"], failure["examine"]) == \
        (3, "watch", "dump" if jit else "replay"), failure
    op, direction, line = origin_of(summary)
    culprit = next(n for n, text in enumerate(SAMPLE.read_text().splitlines(), 1)
                   if text.rstrip().endswith("# the culprit"))
    assert (op, direction, line) == ("Log", "forward", culprit), summary.get("origin")
    assert "log_softmax" in summary["origin"]["hint"], summary["origin"]
    log = (run / "resumed" / "output.log").read_text(errors="replace")
    assert "epoch 1 step 1 loss: 0.000000" in log, log[-2000:]   # a skipped step's placeholder loss


def test_the_kept_state_round_trips_and_a_different_network_is_refused(tmp_path, graph_mode):
    """StateKeeper keeps host copies (not views of the live memory), writes the one at or before the failing
    step with allow_pickle-free arrays, and Resumer assigns them -- or names the Parameter that differs."""
    import mindspore as ms
    from mindspore import nn

    from mindguard.training.state.resume import Resumer, StateKeeper, state_parameters
    from mindguard.errors import HuntProtocolError

    net = nn.Dense(3, 2)
    opt = nn.Momentum(net.trainable_params(), 0.1, 0.9)
    params = state_parameters(net, opt)
    assert [p.name for p in params][:2] == ["weight", "bias"] and len(params) == len({id(p) for p in params})
    keeper = StateKeeper(tmp_path / "state", every_steps=2)
    assert [s for s in range(1, 8) if keeper.due(s)] == [3, 4, 5, 6, 7]   # due from step 3 until one is kept
    keeper.keep(3, params)
    kept_weight = net.weight.asnumpy().copy()
    ms.ops.assign(net.weight, ms.Tensor(np.full((2, 3), 7.0, np.float32)))
    assert np.array_equal(keeper.kept[3].arrays[0], kept_weight), "the kept copy must not follow the live memory"
    assert not keeper.due(4) and keeper.due(5)
    assert keeper.write(2) is None                     # nothing kept at or before step 2
    assert keeper.write(4) == tmp_path / "state"
    resumer = Resumer(tmp_path / "state")
    assert (resumer.step, resumer.skips(2), resumer.skips(3)) == (3, True, False)
    resumer.load(params)
    assert np.array_equal(net.weight.asnumpy(), kept_weight) and resumer.loaded
    buffers = keeper.kept[3].arrays
    ms.ops.assign(net.weight, ms.Tensor(np.full((2, 3), 5.0, np.float32)))
    keeper.keep(5, params)   # a later copy overwrites the earlier one's buffers: no new memory for the OS to map
    assert list(keeper.kept) == [5] and all(a is b for a, b in zip(keeper.kept[5].arrays, buffers))
    ms.ops.assign(net.weight, ms.Tensor(np.zeros((2, 3), np.float32)))
    assert keeper.kept[5].arrays[0].tolist() == [[5.0] * 3] * 2, "a reused buffer must not follow the live memory"

    half = ms.Parameter(ms.Tensor(np.array([1.5, -2.25], np.float32), ms.bfloat16), name="half")  # numpy has no bf16
    bf16 = StateKeeper(tmp_path / "bf16", every_steps=1)
    bf16.keep(2, [half])
    bf16.write(2)
    ms.ops.assign(net.bias, ms.Tensor(np.zeros(2, np.float32)))
    half.set_data(ms.Tensor(np.zeros(2, np.float32), ms.bfloat16))
    Resumer(tmp_path / "bf16").load([half])
    assert ms.ops.cast(half, ms.float32).asnumpy().tolist() == [1.5, -2.25]

    other = nn.Dense(3, 4)
    with pytest.raises(HuntProtocolError, match=r"shape \[4, 3\] here, \[2, 3\] when it was kept"):
        Resumer(tmp_path / "state").load(state_parameters(other, nn.Momentum(other.trainable_params(), 0.1, 0.9)))
    with pytest.raises(HuntProtocolError, match="no kept training state"):
        Resumer(tmp_path / "nowhere")


def test_a_resumed_pass_keeps_the_state_it_loaded_without_copying_it_again(tmp_path):
    """A locate pass resumes at step 31 and keeps the state at every step from there: its first copy is the arrays
    the state was loaded from (a 1 GB checkpoint's first copy took 3.8 s of fresh memory on a 2-core VM), apart from
    the live Parameters, into whose own memory the state was copied; later copies go into those buffers. A big first
    copy of the always-on kind is mapped whole at once and holds the values, not a view."""
    import mindspore as ms
    from mindspore import nn

    from mindguard.training.state.keeper import StateKeeper
    from mindguard.training.state.resumer import Resumer
    from mindguard.training.state.state_files import POPULATE_MIN_BYTES, _host_copy, state_parameters

    net = nn.Dense(512, 1024)   # a 2 MB weight: mapped with MAP_POPULATE where the OS has it
    params = state_parameters(net, nn.Momentum(net.trainable_params(), 0.1, 0.9))
    source = StateKeeper(tmp_path / "kept", every_steps=1)
    source.keep(31, params)
    source.write(31)
    kept_weight = net.weight.asnumpy().copy()
    ms.ops.assign(net.weight, ms.Tensor(np.zeros((1024, 512), np.float32)))

    resumer = Resumer(tmp_path / "kept")
    memory = net.weight.asnumpy()
    resumer.load(params)
    assert np.shares_memory(memory, net.weight.asnumpy()), "on CPU the state is copied into the Parameter's memory"
    loaded = resumer.take_values()
    assert loaded is not None and len(loaded) == len(params) and resumer.take_values() is None   # handed over once
    keeper = StateKeeper(tmp_path / "locate", steps=range(31, 34))
    keeper.keep(31, params, loaded=loaded)
    held = keeper.kept[31].arrays
    assert all(a is b for a, b in zip(held, loaded)), "the loaded arrays are the copy: no second one"
    assert np.array_equal(held[0], kept_weight) and np.array_equal(net.weight.asnumpy(), kept_weight)
    ms.ops.assign(net.weight, ms.Tensor(np.full((1024, 512), 3.0, np.float32)))
    assert np.array_equal(held[0], kept_weight), "the held arrays must not follow the live Parameters"
    keeper.keep(32, params)
    assert all(a is b for a, b in zip(keeper.kept[32].arrays, held)) and keeper.kept[32].arrays[0][0, 0] == 3.0

    refused = StateKeeper(tmp_path / "other", steps=[31])
    refused.keep(31, params, loaded=[np.zeros(3, np.float32)] * len(params))   # not the Parameters' shapes: copied
    assert np.array_equal(refused.kept[31].arrays[0], net.weight.asnumpy())

    copy = _host_copy(net.weight)
    assert copy.nbytes >= POPULATE_MIN_BYTES and copy.flags.writeable and copy.dtype == np.float32
    ms.ops.assign(net.weight, ms.Tensor(np.full((1024, 512), 4.0, np.float32)))
    assert copy[0, 0] == 3.0 and copy.shape == (1024, 512), "a copy, not a view of the Parameter"


def test_hunt_request_carries_the_resume_fields_and_refuses_bad_ones(tmp_path):
    from mindguard.errors import HuntProtocolError
    from mindguard.training.run import HuntRequest

    request = HuntRequest(pass_name="record", record=tmp_path / "f.json", keep_dir=tmp_path / "k", keep_every=5,
                          keep_steps=(7, 9), resume_dir=tmp_path / "r")
    assert HuntRequest.from_environ(request.to_environ()) == request
    env = request.to_environ()
    for name, value, rule in (("MINDGUARD_KEEP_EVERY", "0", "number of steps >= 1"),
                              ("MINDGUARD_KEEP_STEPS", "9-7", "first-last")):
        with pytest.raises(HuntProtocolError, match=rule):
            HuntRequest.from_environ({**env, name: value})


def test_cli_refuses_a_bad_resume_choice(tmp_path):
    proc = run_python("import sys, mindguard.cli as c; sys.exit(c.main(['hunt', '--resume', 'sometimes', '--', "
                      "'python', 'x.py']))", check=False)
    assert proc.returncode == 2 and "--resume" in proc.stderr and "auto" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_a_guard_deferring_its_verdicts_resumes_like_any_other(tmp_path):
    """Guard(defer_check=True), the GPU/Ascend default, in PyNative (a replay pass, no dump armed): every hunt pass
    must still check on the host, or the resumed pass's trace (the sum of squares of the Parameters) differs from
    pass 1's and the hunt falls back to step 1. Kept every 3 steps: resumed at 19, steps 19-20 compared."""
    script = ZOO / "bn_explode.py"
    proc, run, summary = hunt(tmp_path, "defer", script, "--mode", "pynative", "--guard_defer",
                              options=("--resume", "always", "--keep-every", "3"))
    assert proc.returncode == 1, explain(proc)
    assert summary["resume"]["route"] == "resumed" and summary["resume"]["kept_step"] == 19, summary["resume"]
    assert json.loads((run / "resumed" / "pass_status.json").read_text())["diverged"] is None
    assert not (run / "pass2").exists(), sorted(p.name for p in run.iterdir())
    assert summary["failure"]["global_step"] == 21 and summary["resumed"]["records"][0]["global_step"] == 21
    assert origin_of(summary)[2] == line_of(script, "# CULPRIT"), summary.get("origin")


def test_the_copy_after_a_rare_check_is_priced_at_the_reused_buffers(monkeypatch, tmp_path):
    """An always-on Guard keeps a state only right after a passing Parameter check, and on a budget those are rare
    (every ~1,000 steps while a check's compile is paid for). The first copy allocates its buffers; priced at that,
    the next one could be due only after the check it must follow, and a failure at step 1500 of a 13 s MLP run
    resumed from step 2 (benchmarks/failing_train.py, 2 runs of 3). The next copy is priced at most at the reused
    buffers' rate, and is due once the copy budget has paid for that."""
    import mindspore as ms

    from mindguard.training.state import keeper as _keeper

    now = [1000.0]
    monkeypatch.setattr(_keeper.time, "monotonic", lambda: now[0])
    params = [ms.Parameter(ms.Tensor(np.ones((4096, 2048), np.float32)), name="table")]   # 32 MB: < 10% of the RSS
    keeper = _keeper.StateKeeper(tmp_path, on_disk=True, min_seconds=1.0)
    keeper.keep(2, params)
    first = keeper.kept[2].seconds
    priced = min(first, 32 * 2**20 / _keeper.REUSED_COPY_BYTES_PER_S)
    assert keeper.schedule.copy_seconds == pytest.approx(priced), (keeper.schedule.copy_seconds, first)
    interval = max(1.0, priced / keeper.schedule.copy_budget)   # training seconds the copy budget needs for the next
    now[0] += interval * 0.9
    assert not keeper.due(1006), (first, interval)
    now[0] += interval * 0.2   # then a check passes
    assert keeper.due(1006), (first, interval)
    keeper.keep(1006, params)
    assert list(keeper.kept) == [1006]
    assert keeper.schedule.copy_seconds == pytest.approx((priced + keeper.kept[1006].seconds) / 2)   # the median
