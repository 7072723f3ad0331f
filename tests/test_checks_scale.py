"""Guard's checks at real scale, and mindguard's own errors (issues 38 and 39).

* the Parameter check works at 10, 500 and 5,000 Parameters: a zoo-style SSD detector (529 Parameters, 14 MB,
  GRAPH, Model.train) and a 5,000-Parameter stack train with Guard with no warning, and the record counts the
  Parameters checked;
* a Parameter check that cannot run is mindguard's problem: one warning, the training goes on with the loss check,
  the record lists the lost check;
* every failing watch loop (its own loader raising between steps, the script raising after the last step) and
  every Model.train script raising after Guard's last step prints the ``hunt --from`` line.
"""
from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from hunting import clean_env

REPO = Path(__file__).resolve().parents[1]
ZOO = REPO / "tests" / "zoo"
LINE = re.compile(r"^    (.* hunt --from (\S+) -- .*)$", re.M)


def run_zoo(script: str, *args: str, cwd: Path, timeout: float = 400) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, GLOG_v="3", PYTHONWARNINGS="always")
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    return subprocess.run([sys.executable, str(ZOO / script), *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def explain(proc: subprocess.CompletedProcess) -> str:
    return f"exit {proc.returncode}\n--- stdout ---\n{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-5000:]}"


def mindguard_said(stderr: str) -> list:
    """The lines of stderr in which mindguard speaks (its warnings, its messages)."""
    return [line for line in stderr.splitlines() if "mindguard" in line.lower() and "site-packages" not in line]


# -- the check budget counts a check's compile -------------------------------------------------------------------

@pytest.mark.fast
def test_a_checks_compile_time_is_owed_to_the_budget_and_no_sample_of_a_checks_cost():
    from mindguard.training.checks.budget import CheckBudget

    clock = [0.0]
    budget = CheckBudget(fraction=0.01, clock=lambda: clock[0])
    budget.end_period()
    clock[0] += 0.01
    budget.end_period()                       # one 10 ms period: credit 0.1 ms
    budget.charge(2, seconds=2.0005, setup=2.0)
    assert budget.setup_debt == pytest.approx(2.0)
    assert budget.own == pytest.approx(0.0005) and budget.spent == pytest.approx(0.0005)
    assert budget.describe()["setup_ms"] == pytest.approx(2000.0)
    for step in range(3, 400):                # the debt is paid at 1 % of the training time before checks resume
        clock[0] += 0.01
        budget.end_period()
        if budget.due(step):
            budget.charge(step, 0.0005)
    assert budget.checks == 3, budget.describe()   # the probe's three, then none while the debt lasts
    assert budget.setup_debt == pytest.approx(2.0 - 397 * 0.0001, rel=0.01), budget.describe()
    last = budget.last_checked
    assert budget.due(last + 1000) and not budget.due(last + 999)   # max_interval still bounds the window


# -- the Parameter check at scale --------------------------------------------------------------------------------

def test_compiled_check_of_600_parameters_compiles_and_names_the_bad_one(graph_mode):
    """Before: one graph summing 510 Parameters exceeded MindSpore's call-depth limit (1000). Now the compiled check
    maps over the Parameters (no nesting per Parameter) in graphs of at most COMPILED_CHUNK of them."""
    import mindspore as ms

    from mindguard.training.checks.finite import COMPILED_CHUNK, ParamChecker

    params = [ms.Parameter(ms.Tensor(np.ones((4, 3), np.float32)), name=f"p{i}") for i in range(600)]
    params.append(ms.Parameter(ms.Tensor(np.ones(3, np.float64)), name="double"))
    checker = ParamChecker(params, on_host=False)
    assert checker.nonfinite_names() == [] and checker.fell_back is None
    assert len(checker.compiled) == -(-len(params) // COMPILED_CHUNK) >= 2
    assert checker.take_setup_seconds() > 0 and checker.take_setup_seconds() == 0
    bad = params[COMPILED_CHUNK + 3]   # in the second graph
    ms.ops.assign(bad, ms.Tensor(np.full((4, 3), np.nan, np.float32)))
    ms.ops.assign(params[-1], ms.Tensor(np.array([1.0, np.inf, 0.0])))
    assert checker.nonfinite_names() == [bad.name, "double"]


def test_a_compiled_check_mindspore_cannot_compile_is_replaced_by_the_host_check(graph_mode):
    """A real compile failure (the process's call-depth limit set below what the check's graph needs): the checker
    says why and checks on the host instead, exactly, with no exception to the caller."""
    import mindspore as ms

    from mindguard.training.checks.finite import ParamChecker

    params = [ms.Parameter(ms.Tensor(np.ones((4, 3), np.float32)), name=f"q{i}") for i in range(5)]
    previous = ms.get_context("max_call_depth")
    ms.set_context(max_call_depth=5)
    try:
        checker = ParamChecker(params, on_host=False)
        assert checker.nonfinite_names() == []
    finally:
        ms.set_context(max_call_depth=previous)
    assert checker.on_host and checker.compiled is None, checker.fell_back
    assert "call depth" in checker.fell_back, checker.fell_back
    assert checker.take_setup_seconds() > 0
    ms.ops.assign(params[2], ms.Tensor(np.full((4, 3), np.inf, np.float32)))
    assert checker.nonfinite_names() == ["q2"]


def test_cpu_checks_many_parameters_on_the_host_whatever_their_bytes():
    """More than COMPILED_MAX_PARAMS Parameters: the host check (a compiled one costs ~20 us a Parameter a call and
    seconds to compile); a few large ones: the compiled check, as before."""
    import mindspore as ms

    from mindguard.training.checks.finite import (COMPILED_MAX_PARAMS, HOST_CHECK_MAX_BYTES, host_check_by_default)

    per = HOST_CHECK_MAX_BYTES // 4 // COMPILED_MAX_PARAMS + 1024
    many = [ms.Parameter(ms.Tensor(np.zeros(per, np.float32)), name=f"m{i}") for i in range(COMPILED_MAX_PARAMS + 1)]
    assert sum(p.size * 4 for p in many) > HOST_CHECK_MAX_BYTES
    assert host_check_by_default(many) is True
    assert host_check_by_default(many[:COMPILED_MAX_PARAMS]) is False


def test_the_compiled_checks_compile_time_is_in_the_records_budget(graph_mode, tmp_path):
    """A few large Parameters (4 MiB: the compiled check on CPU): its compile is charged to the budget and said in
    the finished record (``param_checks.setup_ms``)."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    import mindguard
    from mindguard.training.checks.finite import HOST_CHECK_MAX_BYTES

    ms.set_seed(0)
    net = nn.Dense(6, 2)
    net.weight = ms.Parameter(ms.Tensor(np.zeros((2, 6), np.float32)), name="weight")
    table = ms.Parameter(ms.Tensor(np.zeros((1024, 1024), np.float32)), name="table", requires_grad=False)
    net.table = table   # a large buffer of the network (a frozen table): written state the check covers
    assert table.size * 4 > HOST_CHECK_MAX_BYTES
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
        2, _dataset(5), callbacks=[mindguard.Guard(str(tmp_path / "failure.json"))], dataset_sink_mode=False)
    record = json.loads((tmp_path / "failure.json").read_text())
    assert (record["status"], record["params_checked"]) == ("finished", 3), record
    assert record["param_checks"]["setup_ms"] > 0 and record["param_checks"]["checks"] >= 2, record


def _finished_with_every_parameter_checked(proc, cwd: Path, at_least: int) -> dict:
    assert proc.returncode == 0, explain(proc)
    assert "training finished" in proc.stdout, explain(proc)
    assert not mindguard_said(proc.stderr), mindguard_said(proc.stderr)
    count = int(re.search(r"^parameters: (\d+)$", proc.stdout, re.M).group(1))
    assert count >= at_least, proc.stdout
    record = json.loads((cwd / "mindguard_failure.json").read_text())
    assert (record["status"], record["kind"]) == ("finished", None), record
    assert record["params_checked"] == count, record          # every Parameter of the network
    assert record["param_checks"]["checks"] >= 2, record      # and the checks ran
    assert "checks_lost" not in record, record
    return record


def test_ssd_detector_of_529_parameters_trains_with_guard_as_bare(tmp_path):
    """The SSD-MobileNetV2 detector (GRAPH, Model.train, 14 MB of weights) whose healthy training Guard used to
    stop at the end of epoch 1 with "Exceed function call depth limit 1000": it finishes, no mindguard warning."""
    proc = run_zoo("ssd_detector.py", "--steps", "3", cwd=tmp_path)
    _finished_with_every_parameter_checked(proc, tmp_path, 500)
    assert len(re.findall(r"loss is \d", proc.stdout)) == 6, proc.stdout


def test_5000_parameter_stack_trains_with_guard_as_bare(tmp_path):
    proc = run_zoo("deep_stack.py", cwd=tmp_path)
    _finished_with_every_parameter_checked(proc, tmp_path, 5000)
    assert len(re.findall(r"loss is \d", proc.stdout)) == 4, proc.stdout


# -- mindguard's own errors never end a training ------------------------------------------------------------------

def _dataset(steps: int, nan_at: int = 0):
    import mindspore.dataset as ds

    rng = np.random.RandomState(0)
    x = rng.normal(0, 1, (steps * 4, 6)).astype(np.float32)
    y = x[:, :2].copy()
    if nan_at:
        x[(nan_at - 1) * 4] = np.nan        # the batch of global step nan_at (1-based)
    return ds.NumpySlicesDataset({"x": x, "y": y}, shuffle=False).batch(4)


def _broken_host_check(monkeypatch):
    """A Parameter check that cannot run on the network: it reads each Parameter as rows of 7 (a real MindSpore
    error: no Parameter of the network has a multiple of 7 elements)."""
    import mindspore as ms

    from mindguard.training.checks.finite import ParamChecker

    def read_in_sevens(self):
        return [ms.ops.reshape(p, (-1, 7)).asnumpy() for p in self.params]

    monkeypatch.setattr(ParamChecker, "_host_views", read_in_sevens)


def test_a_parameter_check_that_cannot_run_is_dropped_and_the_loss_check_still_finds_the_nan(graph_mode, tmp_path,
                                                                                            monkeypatch):
    """The check raises MindSpore's own error from inside Guard's hook: one warning names what was disabled and why,
    the training goes on, the loss check records the NaN of step 7 (not the check's error), and the record says
    which check was lost."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Callback, Model

    import mindguard
    from mindguard.errors import MindguardWarning

    _broken_host_check(monkeypatch)
    steps = []

    class Steps(Callback):
        def on_train_step_end(self, run_context):
            steps.append(run_context.original_args().cur_step_num)

    ms.set_seed(0)
    net = nn.Dense(6, 2)
    guard = mindguard.Guard(str(tmp_path / "failure.json"), action="continue")
    with pytest.warns(MindguardWarning) as caught:
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            1, _dataset(10, nan_at=7), callbacks=[guard, Steps()], dataset_sink_mode=False)
    assert steps == list(range(1, 11)), steps
    said = [str(w.message) for w in caught if issubclass(w.category, MindguardWarning)]
    assert len(said) == 1, said
    lost_at = int(re.search(r"disabled its Parameter check from global step (\d+) on", said[0]).group(1))
    assert 1 <= lost_at < 7, said                      # the first check after a step, before the NaN
    assert "not your training's" in said[0] and "the loss check still runs" in said[0], said
    record = json.loads((tmp_path / "failure.json").read_text())
    assert (record["status"], record["kind"], record["global_step"]) == ("failed", "nonfinite_loss", 7), record
    lost = record["checks_lost"]
    assert [(x["check"], x["from_step"]) for x in lost] == [("Parameter", lost_at)], lost
    assert "7" in lost[0]["reason"] and lost[0]["reason"].split(":")[0] in ("ValueError", "RuntimeError"), lost


def test_a_parameter_check_that_cannot_run_leaves_a_healthy_training_finished(graph_mode, tmp_path, monkeypatch):
    """The same fault on a healthy training: it finishes, recorded "finished" (never as the training's failure)."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    import mindguard
    from mindguard.errors import MindguardWarning

    _broken_host_check(monkeypatch)
    ms.set_seed(0)
    net = nn.Dense(6, 2)
    with pytest.warns(MindguardWarning, match="disabled its Parameter check"):
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            2, _dataset(5), callbacks=[mindguard.Guard(str(tmp_path / "failure.json"))], dataset_sink_mode=False)
    record = json.loads((tmp_path / "failure.json").read_text())
    assert (record["status"], record["kind"], record["global_step"]) == ("finished", None, 10), record
    assert [x["check"] for x in record["checks_lost"]] == ["Parameter"], record


def test_a_bug_in_another_of_guards_hooks_turns_off_that_part_only(graph_mode, tmp_path, monkeypatch):
    """A mindguard bug (simulated in mindguard's own Reproducible, not in MindSpore) raising in Guard's step hook:
    that part is dropped with one warning, the locator still records the NaN loss of step 4."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    import mindguard
    from mindguard.errors import MindguardWarning
    from mindguard.training.reproduce import Reproducible

    def broken(self, run_context):
        raise AttributeError("'NoneType' object has no attribute 'seed' (simulated mindguard bug)")

    monkeypatch.setattr(Reproducible, "on_train_step_begin", broken, raising=False)
    ms.set_seed(0)
    net = nn.Dense(6, 2)
    with pytest.warns(MindguardWarning, match="disabled its reproducibility check from global step 1 on") as caught:
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            1, _dataset(6, nan_at=4), callbacks=[mindguard.Guard(str(tmp_path / "failure.json"))],
            dataset_sink_mode=False)
    assert sum(issubclass(w.category, MindguardWarning) for w in caught) == 1
    record = json.loads((tmp_path / "failure.json").read_text())
    assert (record["kind"], record["global_step"]) == ("nonfinite_loss", 4), record
    assert [(x["check"], x["from_step"]) for x in record["checks_lost"]] == [("reproducibility", 1)], record


def test_a_bug_in_a_bare_failure_locators_hook_turns_it_off_and_the_training_finishes(graph_mode, tmp_path,
                                                                                     monkeypatch):
    """A mindguard bug (simulated in mindguard's own run events, not in MindSpore) at the first epoch's end of a bare
    FailureLocator: one warning, both epochs run, the record says finished and lists the lost check."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    import mindguard
    from mindguard.errors import MindguardWarning
    from mindguard.training.step.events import RunEvents

    def broken(self):
        raise KeyError("budget (simulated mindguard bug)")

    monkeypatch.setattr(RunEvents, "timing_paused", broken)
    ms.set_seed(0)
    net = nn.Dense(6, 2)
    locator = mindguard.FailureLocator(str(tmp_path / "failure.json"))
    with pytest.warns(MindguardWarning, match="disabled its loss check from global step 5 on") as caught:
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            2, _dataset(5), callbacks=[locator], dataset_sink_mode=False)
    assert sum(issubclass(w.category, MindguardWarning) for w in caught) == 1
    record = json.loads((tmp_path / "failure.json").read_text())
    assert (record["status"], record["global_step"]) == ("finished", 10), record
    assert [(x["check"], x["from_step"]) for x in record["checks_lost"]] == [("loss", 5)], record


def test_watch_with_a_parameter_check_that_cannot_run_goes_on_with_the_loss_check(graph_mode, tmp_path, monkeypatch):
    import mindspore as ms
    from mindspore import nn

    import mindguard
    from mindguard.errors import MindguardWarning, NonFiniteError

    _broken_host_check(monkeypatch)
    ms.set_seed(0)
    net = nn.Dense(6, 2)
    opt = nn.SGD(net.trainable_params(), 0.01)
    loss_fn = nn.MSELoss()

    def forward(x, y):
        return loss_fn(net(x), y)

    grad_fn = ms.value_and_grad(forward, None, opt.parameters)

    def train_step(x, y):
        loss, grads = grad_fn(x, y)
        opt(grads)
        return loss

    step = mindguard.watch(train_step, net, opt, record=str(tmp_path / "failure.json"))
    done = 0
    with pytest.warns(MindguardWarning, match="disabled its Parameter check"):
        with pytest.raises(NonFiniteError):
            for x, y in _dataset(10, nan_at=6).create_tuple_iterator():
                step(x, y)
                done += 1
    assert done == 5
    record = json.loads((tmp_path / "failure.json").read_text())
    assert (record["kind"], record["global_step"]) == ("nonfinite_loss", 6), record
    assert [x["check"] for x in record["checks_lost"]] == ["Parameter"], record


# -- every failing run prints the line ----------------------------------------------------------------------------

@pytest.mark.parametrize("how, raised, step", [("loader", "ValueError: corrupt image file 0158.png", 40),
                                               ("after", "OSError: cannot write samples.png", 40)])
def test_a_failing_watch_loop_prints_the_hunt_line(tmp_path, how, raised, step):
    """A GAN's watch loop whose own loader raises between steps (the corrupt file of step 40's batch), or whose
    script raises after the last step: the traceback, then Guard's line naming this run's record. The loader's
    error is the failure of step 40, whose batch it could not make: the printed line answers it from the record at
    once (exit 1, step 40, the loader's line), no training re-run (issue 51)."""
    proc = run_zoo("gan_loader_watch.py", *(["--after"] if how == "after" else []), cwd=tmp_path, timeout=300)
    assert proc.returncode == 1, explain(proc)
    assert raised in proc.stderr, explain(proc)
    found = LINE.findall(proc.stderr)
    assert found, explain(proc)
    assert proc.stderr.rindex(raised) < proc.stderr.rindex(found[-1][0]), explain(proc)   # last, after the traceback
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert Path(found[-1][1]) == tmp_path / f"mindguard_failure.{record['run_id']}.json", found   # kept by run
    assert (record["status"], record["kind"], record["global_step"]) == ("failed", "exception", step), record
    assert raised in record["message"], record
    if how == "loader":
        assert record["phase"] == "loader" and "gan_loader_watch.py:40 (in decode)" in record["message"], record
        assert "its batch could not be made, the script's data loader raised" in proc.stderr, explain(proc)
        hunt = subprocess.run(shlex.split(found[-1][0]), cwd=tmp_path, env=clean_env(), capture_output=True,
                              text=True, timeout=120)
        assert hunt.returncode == 1, explain(hunt)
        run, = (tmp_path / "mindguard_runs").iterdir()
        summary = json.loads((run / "summary.json").read_text())
        assert summary["failure"]["global_step"] == 40 and summary["from_record"]["route"] == "done", summary
        assert not [p for p in run.iterdir() if (p / "output.log").is_file()], "no training re-run"
        assert "global step 40's batch could not be made: ValueError: corrupt image file 0158.png" in hunt.stderr


def test_a_script_raising_after_guards_last_step_prints_the_hunt_line(tmp_path, run_py):
    proc = run_py("""
        import numpy as np
        import mindspore as ms
        import mindspore.dataset as ds
        from mindspore import nn
        from mindspore.train import Model
        import mindguard

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        net = nn.Dense(3, 1)
        data = ds.NumpySlicesDataset({"x": np.ones((8, 3), np.float32), "y": np.ones((8, 1), np.float32)},
                                     shuffle=False).batch(4)
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), 0.01)).train(
            2, data, callbacks=[mindguard.Guard()], dataset_sink_mode=False)
        print("trained", flush=True)
        raise KeyError("the evaluation's label map has no class 7")
        """, cwd=tmp_path, check=False)
    assert proc.returncode == 1 and "trained" in proc.stdout, explain(proc)
    found = LINE.findall(proc.stderr)
    record = json.loads((tmp_path / "mindguard_failure.json").read_text())
    assert found and Path(found[-1][1]) == tmp_path / f"mindguard_failure.{record['run_id']}.json", explain(proc)
    assert proc.stderr.rindex("KeyError") < proc.stderr.rindex(found[-1][0]), explain(proc)
    assert (record["status"], record["phase"], record["global_step"]) == ("failed", "script", 4), record
