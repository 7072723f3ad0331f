"""GuardedTrainStep, SkipPolicy, guard_model: real MindSpore training on CPU, GRAPH and PyNative."""
from __future__ import annotations

import logging

import numpy as np
import pytest

import mindspore as ms
from mindspore import Parameter, Tensor, mutable, nn
from mindspore.train import Callback, Model

import mindguard
import mindguard.protocol.record
import mindguard.training.locator
from mindguard.demos import norm_nan
from mindguard.training.checks.finite import AllFinite
from mindguard.errors import RefusedStepsError
from mindguard.nn.protect import SkipPolicy

CLEAN = np.array([[1, 2, 3], [4, 5, 1], [2, 2, 3], [5, 4, 3]], np.int32)
PADDED = np.array([[1, 2, 0], [4, 5, 1], [2, 2, 3], [5, 4, 3]], np.int32)  # token 0 -> Norm(0) -> NaN grads
LABEL = np.full((4, 1), 1.5, np.float32)


def _optimizer(name, params):
    if name == "SGD":
        return nn.SGD(params, learning_rate=0.05)
    if name == "Momentum":
        return nn.Momentum(params, learning_rate=0.05, momentum=0.9)
    return nn.Adam(params, learning_rate=0.05)


def _state(cell):
    """Every Parameter of ``cell`` (network weights and optimizer state) as numpy copies, by name."""
    return {name: p.asnumpy().copy() for name, p in cell.parameters_and_names()}


def _demo_step(opt_name, *, guarded=True, max_skips=0, seed=1):
    ms.set_seed(seed)
    np.random.seed(seed)
    net = norm_nan.build_network()
    opt = _optimizer(opt_name, net.trainable_params())
    loss_net = nn.WithLossCell(net, nn.MSELoss())
    if guarded:
        return net, opt, mindguard.GuardedTrainStep(loss_net, opt, max_skips=max_skips)
    return net, opt, nn.TrainOneStepCell(loss_net, opt)


@pytest.mark.parametrize("opt_name", ["SGD", "Adam"])
def test_refused_step_leaves_parameters_and_optimizer_state_bit_identical(ms_mode, opt_name):
    _, opt, step = _demo_step(opt_name, max_skips=1)  # go on after the refused step
    _, _, plain = _demo_step(opt_name, guarded=False)
    data = norm_nan.make_dataset(steps_per_epoch=4, poison_step=3)
    seen = []
    for i, (tokens, label) in enumerate(data.create_tuple_iterator(num_epochs=1), 1):
        before = _state(step)
        loss, refused = step(tokens, label)
        plain_loss = plain(tokens, label)
        seen.append(bool(refused.asnumpy()))
        assert refused.dtype == ms.bool_ and refused.shape == (), (refused.dtype, refused.shape)
        if i <= 3:  # up to the bad step both nets hold the same weights; the loss comes back as computed
            assert loss.asnumpy().tobytes() == plain_loss.asnumpy().tobytes(), (i, loss, plain_loss)
        after = _state(step)
        if i == 3:
            changed = [k for k in before if before[k].tobytes() != after[k].tobytes()]
            assert changed == [], f"refused step changed {changed}"
            assert np.isfinite(loss.asnumpy()), loss  # Norm NaN hits the gradients, not this step's loss
        else:
            assert any(before[k].tobytes() != after[k].tobytes() for k in before), f"step {i} applied nothing"
    assert seen == [False, False, True, False], seen
    assert step.total_refusals == 1 and step.last_refused_step == 3, (step.total_refusals, step.last_refused_step)
    assert all(np.isfinite(v).all() for v in _state(step).values())
    # the same data wrecks the unguarded network: the test can fail
    assert not all(np.isfinite(p.asnumpy()).all() for p in plain.trainable_params())
    if opt_name == "Adam":
        assert int(opt.global_step.asnumpy()[0]) == int(plain.optimizer.global_step.asnumpy()[0]) - 1


class _TinyMLP(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Dense(4, 8, activation="relu")
        self.fc2 = nn.Dense(8, 1)

    def construct(self, x):
        return self.fc2(self.fc1(x))


@pytest.mark.parametrize("opt_name", ["SGD", "Momentum", "Adam"])
def test_healthy_training_is_bit_identical_to_train_one_step_cell(ms_mode, opt_name):
    net_a, net_b = _TinyMLP(), _TinyMLP()
    for pa, pb in zip(net_a.trainable_params(), net_b.trainable_params()):
        pb.set_data(Tensor(pa.asnumpy().copy()))
    # sens=None is what Model(net, loss_fn, opt) builds
    plain = nn.TrainOneStepCell(nn.WithLossCell(net_a, nn.MSELoss()), _optimizer(opt_name, net_a.trainable_params()))
    guarded = mindguard.GuardedTrainStep(nn.WithLossCell(net_b, nn.MSELoss()),
                                         _optimizer(opt_name, net_b.trainable_params()))
    rng = np.random.default_rng(0)
    batches = [(Tensor(rng.normal(size=(6, 4)).astype(np.float32)), Tensor(rng.normal(size=(6, 1)).astype(np.float32)))
               for _ in range(4)]
    for epoch in range(3):
        for x, y in batches:
            loss_a = plain(x, y)
            loss_b, refused = guarded(x, y)
            assert not refused.asnumpy()
            assert loss_a.asnumpy().tobytes() == loss_b.asnumpy().tobytes(), (epoch, loss_a, loss_b)
    for pa, pb in zip(net_a.trainable_params(), net_b.trainable_params()):
        assert pa.asnumpy().tobytes() == pb.asnumpy().tobytes(), pa.name
    assert guarded.steps == 12 and guarded.total_refusals == 0


def test_all_finite_finds_every_nan_and_inf_position_without_false_alarms(ms_mode):
    shapes = [(3, 5), (7,), (2, 3, 4), ()]
    params = [Parameter(Tensor(np.zeros(s, np.float32)), name=f"p{i}") for i, s in enumerate(shapes)]
    params.append(Parameter(Tensor(np.zeros((4, 4), np.float16)), name="half"))
    params.append(Parameter(Tensor(np.zeros((3,), np.float64)), name="double"))
    check = AllFinite(params)
    finite_loss = Tensor(np.float32(0.5))

    def grads(fill=1.0):
        return [np.full(p.shape, fill, p.dtype == ms.float16 and np.float16 or
                        (p.dtype == ms.float64 and np.float64 or np.float32)) for p in params]

    def run(values, loss=finite_loss):
        # mutable: one compiled graph for all calls (a plain tuple argument recompiles each time)
        return bool(check(loss, mutable(tuple(Tensor(v) for v in values))).asnumpy())

    assert run(grads()) is True
    # every element at the top of its dtype's range: a plain sum would overflow, the weighted sum must not
    huge = [np.full(g.shape, np.finfo(g.dtype).max, g.dtype) for g in grads()]
    huge[0][0, 0] = -np.finfo(np.float32).max
    assert run(huge) is True
    assert run(grads(), loss=Tensor(np.float32(np.nan))) is False
    missed = []
    for index, base in enumerate(grads()):
        size = max(base.size, 1)
        for position in range(size):  # NaN everywhere; +-Inf at the ends and the middle
            for bad in ((np.nan, np.inf, -np.inf) if position in (0, size // 2, size - 1) else (np.nan,)):
                values = grads()
                flat = values[index].reshape(-1)
                flat[position] = bad
                values[index] = flat.reshape(base.shape)
                if run(values):
                    missed.append((params[index].name, position, bad))
    assert missed == [], f"non-finite values not detected: {missed[:10]}"


def _step_on(step, batch):
    return step(Tensor(batch), Tensor(LABEL))


def test_max_skips_tolerates_k_consecutive_refusals_and_logs_each(ms_mode, caplog):
    _, _, step = _demo_step("SGD", max_skips=2)
    plan = [CLEAN, PADDED, PADDED, CLEAN, PADDED, PADDED, PADDED]
    history = []
    with caplog.at_level(logging.WARNING, logger="mindguard"):
        for batch in plan:
            _, refused = _step_on(step, batch)
            history.append((bool(refused.asnumpy()), step.consecutive_refusals, step.should_stop))
    assert history == [(False, 0, False), (True, 1, False), (True, 2, False), (False, 0, False),
                       (True, 1, False), (True, 2, False), (True, 3, True)], history
    logged = [r.getMessage() for r in caplog.records if r.name == "mindguard" and "refused" in r.getMessage()]
    assert [int(m.split("step ")[1].split()[0]) for m in logged] == [2, 3, 5, 6, 7], logged
    # nothing stopped the loop: the next call refuses to train on, naming the fix
    with pytest.raises(RefusedStepsError, match=r"max_skips=2.*SkipPolicy"):
        _step_on(step, CLEAN)
    step.reset()
    _, refused = _step_on(step, CLEAN)
    assert not refused.asnumpy() and step.consecutive_refusals == 0


def test_nonfinite_loss_is_refused_and_returned_as_is(ms_mode):
    net, _, step = _demo_step("Adam", max_skips=1)
    before = _state(step)
    loss, refused = step(Tensor(CLEAN), Tensor(np.full((4, 1), np.nan, np.float32)))
    assert np.isnan(loss.asnumpy()) and refused.asnumpy(), (loss, refused)
    after = _state(step)
    assert [k for k in before if before[k].tobytes() != after[k].tobytes()] == []


class _StopAt(Callback):
    def __init__(self, step):
        self.step = step

    def on_train_step_end(self, run_context):
        if run_context.original_args().get("cur_step_num") == self.step:
            run_context.request_stop()


def _tokens_dataset(plan):
    import mindspore.dataset as ds

    tokens = np.concatenate(plan)
    labels = np.concatenate([LABEL] * len(plan))
    return ds.NumpySlicesDataset({"tokens": tokens, "label": labels}, shuffle=False).batch(4)


@pytest.mark.parametrize("max_skips, stop_at", [(0, 2), (1, 5)])
def test_skip_policy_stops_model_train_after_max_skips(graph_mode, max_skips, stop_at):
    net, _, step = _demo_step("SGD", max_skips=max_skips)
    plan = [CLEAN, PADDED, CLEAN, PADDED, PADDED, CLEAN, CLEAN]
    policy = SkipPolicy()
    steps_seen = []

    class Seen(Callback):
        def on_train_step_end(self, run_context):
            steps_seen.append(run_context.original_args().get("cur_step_num"))

    Model(step).train(1, _tokens_dataset(plan), callbacks=[policy, Seen()], dataset_sink_mode=False)
    assert policy.stopped_at == stop_at and steps_seen[-1] == stop_at, (policy.stopped_at, steps_seen)
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


def test_skip_policy_refuses_a_model_without_guarded_step():
    ms.set_seed(1)
    net = norm_nan.build_network()
    model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05))
    with pytest.raises(TypeError, match="guard_model"):
        model.train(1, _tokens_dataset([CLEAN]), callbacks=[SkipPolicy()], dataset_sink_mode=False)


def test_guard_model_refuses_the_demos_bad_step_and_keeps_eval_and_predict(ms_mode):
    """Seed 1, 8 steps/epoch: the unguarded demo's parameters go NaN at global step 11 (facts file)."""
    def build():
        ms.set_seed(1)
        np.random.seed(1)
        net = norm_nan.build_network()
        model = Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05), metrics={"loss"})
        return net, model, norm_nan.make_dataset(steps_per_epoch=8)

    ref_net, ref_model, ref_data = build()
    ref_model.train(2, ref_data, callbacks=[_StopAt(10)], dataset_sink_mode=False)
    expected = {p.name: p.asnumpy().copy() for p in ref_net.trainable_params()}

    net, model, data = build()
    guarded = mindguard.guard_model(model)
    assert isinstance(guarded._train_network, mindguard.GuardedTrainStep)
    policy = SkipPolicy()
    guarded.train(2, data, callbacks=[policy], dataset_sink_mode=False)
    assert policy.stopped_at == 11, policy.stopped_at
    after = {p.name: p.asnumpy() for p in net.trainable_params()}
    assert {k: after[k].tobytes() == expected[k].tobytes() for k in expected} == {k: True for k in expected}
    assert all(np.isfinite(v).all() for v in after.values())
    # metrics and prediction still work, with the user's network
    result = guarded.eval(_tokens_dataset([CLEAN]), dataset_sink_mode=False)
    assert np.isfinite(result["loss"]), result
    prediction = guarded.predict(Tensor(CLEAN))
    assert prediction.shape == (4, 1), prediction.shape
    assert mindguard.guard_model(guarded) is guarded


def test_guard_model_carries_a_fixed_loss_scale(graph_mode):
    from mindspore.amp import FixedLossScaleManager

    ms.set_seed(1)
    net = _TinyMLP()
    opt = nn.Momentum(net.trainable_params(), learning_rate=0.05, momentum=0.9, loss_scale=1024.0)
    model = Model(net, nn.MSELoss(), opt, loss_scale_manager=FixedLossScaleManager(1024.0, drop_overflow_update=False))
    guarded = mindguard.guard_model(model, max_skips=3)
    step = guarded._train_network
    assert step.sens == 1024.0 and step.max_skips == 3, (step.sens, step.max_skips)
    x, y = Tensor(np.ones((2, 4), np.float32)), Tensor(np.ones((2, 1), np.float32))
    loss, refused = step(x, y)
    assert np.isfinite(loss.asnumpy()) and not refused.asnumpy()


def test_guard_model_carries_amp_casts(graph_mode):
    def build():
        ms.set_seed(1)
        net = _TinyMLP()
        return Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9), amp_level="O3")

    x, y = Tensor(np.ones((2, 4), np.float32)), Tensor(np.ones((2, 1), np.float32))
    plain, guarded = build()._train_network, mindguard.guard_model(build())._train_network
    for _ in range(3):
        loss_plain = plain(x, y)
        loss, refused = guarded(x, y)
        assert loss.asnumpy().tobytes() == loss_plain.asnumpy().tobytes() and not refused.asnumpy(), (loss, loss_plain)


def test_guard_model_refuses_what_it_cannot_carry_with_the_fix():
    net = _TinyMLP()
    opt = nn.SGD(net.trainable_params(), learning_rate=0.05)
    ready = nn.TrainOneStepWithLossScaleCell(nn.WithLossCell(net, nn.MSELoss()), opt, scale_sense=Tensor(1024.0))
    with pytest.raises(ValueError, match=r"TrainOneStepWithLossScaleCell.*GuardedTrainStep\(nn.WithLossCell"):
        mindguard.guard_model(Model(ready))
    with pytest.raises(ValueError, match=r"BoostTrainOneStepCell.*boost_level='O1'.*boost_level='O0'"):
        mindguard.guard_model(Model(net, nn.MSELoss(), nn.Momentum(net.trainable_params(), 0.05, 0.9),
                                    boost_level="O1"))
    with pytest.raises(TypeError, match="Model"):
        mindguard.guard_model(net)


@pytest.mark.parametrize("kwargs, message", [
    (dict(sens=0), "sens=0 must be a finite non-zero"),
    (dict(sens=float("nan")), "sens=nan"),
    (dict(max_skips=-1), "max_skips=-1 must be an int >= 0"),
    (dict(max_skips=1.5), "max_skips=1.5"),
])
def test_bad_arguments_are_refused_before_training(kwargs, message):
    net = _TinyMLP()
    with pytest.raises(ValueError, match=message):
        mindguard.GuardedTrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params()), **kwargs)


def test_failure_locator_records_nonfinite_grads(graph_mode, tmp_path):
    net, _, step = _demo_step("SGD")
    record = tmp_path / "failure.json"
    Model(step).train(2, norm_nan.make_dataset(steps_per_epoch=4, poison_step=6),
                      callbacks=[mindguard.training.locator.FailureLocator(str(record))], dataset_sink_mode=False)
    failure = mindguard.protocol.record.FailureRecord.load(record)
    assert (failure.kind, failure.global_step, failure.epoch, failure.step_in_epoch) == \
        ("nonfinite_grads", 6, 2, 2), failure
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


_DISTRIBUTED_SCRIPT = r'''
import numpy as np, mindspore as ms
from mindspore import nn, Tensor, ops
from mindspore.communication import init, get_rank
from mindspore.context import ParallelMode
ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
init()
ms.set_auto_parallel_context(parallel_mode=ParallelMode.DATA_PARALLEL, gradients_mean=True)
import mindguard
ms.set_seed(1)
rank = get_rank()

class LossNet(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 1)
        self.loss = nn.MSELoss()

    def construct(self, x, y, extra):
        # extra is NaN on rank 1 at step 2 only: that rank's loss is NaN, every gradient stays finite
        return self.loss(self.fc(x), y) + ops.stop_gradient(extra)

net = LossNet()
step = mindguard.GuardedTrainStep(net, nn.SGD(net.trainable_params(), learning_rate=0.05), max_skips=5)
x, y = Tensor(np.ones((4, 3), np.float32)), Tensor(np.zeros((4, 1), np.float32))
for i in range(1, 4):
    extra = Tensor(np.float32(np.nan if (i == 2 and rank == 1) else 0.0))
    loss, refused = step(x, y, extra)
    print(f"RESULT rank={rank} step={i} refused={bool(refused.asnumpy())} "
          f"reducer={type(step.grad_reducer).__name__} w={net.fc.weight.asnumpy().tobytes().hex()}", flush=True)
'''


@pytest.mark.slow
def test_distributed_ranks_refuse_together(tmp_path):
    """2 data-parallel workers under msrun: a non-finite loss on rank 1 alone makes both ranks refuse."""
    import os
    import shutil
    import socket
    import subprocess
    import sys

    bin_dir = os.path.dirname(sys.executable)
    msrun = shutil.which("msrun", path=bin_dir) or shutil.which("msrun")
    if msrun is None:
        pytest.skip("msrun not installed")
    (tmp_path / "train.py").write_text(_DISTRIBUTED_SCRIPT)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, GLOG_v="3", PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    env.pop("MINDSPORE_DUMP_CONFIG", None)
    proc = subprocess.run([msrun, "--worker_num=2", "--local_worker_num=2", "--master_addr=127.0.0.1",
                           f"--master_port={port}", "--join=True", f"--log_dir={tmp_path / 'logs'}", "train.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    logs = "".join(p.read_text(errors="replace") for p in sorted((tmp_path / "logs").glob("worker_*.log")))
    assert proc.returncode == 0, f"msrun exited {proc.returncode}\n{proc.stdout[-2000:]}\n{logs[-4000:]}"
    results = {}
    for line in logs.splitlines():
        if line.startswith("RESULT "):
            fields = dict(item.split("=", 1) for item in line.split()[1:])
            results[(int(fields["rank"]), int(fields["step"]))] = fields
    assert len(results) == 6, logs[-4000:]
    assert {k: v["refused"] for k, v in results.items()} == {
        (r, s): "True" if s == 2 else "False" for r in (0, 1) for s in (1, 2, 3)}, results
    assert {v["reducer"] for v in results.values()} == {"DistributedGradReducer"}
    for s in (1, 2, 3):  # replicas never diverge
        assert results[(0, s)]["w"] == results[(1, s)]["w"], (s, results)
    assert results[(0, 1)]["w"] == results[(0, 2)]["w"] != results[(0, 3)]["w"], results


@pytest.mark.parametrize("max_skips, plan, failing_step", [
    (1, [CLEAN, PADDED, CLEAN, PADDED, CLEAN, CLEAN], None),   # isolated refusals are tolerated
    (1, [CLEAN, PADDED, CLEAN, PADDED, PADDED, CLEAN], 5),     # the second refusal in a row is the failure
])
def test_failure_locator_honours_max_skips(graph_mode, tmp_path, max_skips, plan, failing_step):
    net, _, step = _demo_step("SGD", max_skips=max_skips)
    locator = mindguard.training.locator.FailureLocator(str(tmp_path / "failure.json"))
    Model(step).train(1, _tokens_dataset(plan), callbacks=[locator], dataset_sink_mode=False)
    record = mindguard.protocol.record.FailureRecord.load(tmp_path / "failure.json")
    if failing_step is None:
        assert locator.failure is None and record.status == "finished", record
        assert step.total_refusals == 2, step.total_refusals
    else:
        assert (record.kind, record.global_step) == ("nonfinite_grads", failing_step), record
    assert all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
