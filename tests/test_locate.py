"""FailureLocator, FailureRecord, dump_iteration and the CLI helpers -- real MindSpore training on CPU."""
from __future__ import annotations

import json
import math
import signal
import textwrap
from pathlib import Path

import numpy as np
import pytest

import mindguard
import mindguard._util.io
import mindguard.training.locator
from mindguard.cli.record import cli_iteration, cli_record
from mindguard.errors import NonFiniteError, RecordError
from mindguard.protocol.record import FailureRecord, dump_iteration
from mindguard.cli import build_parser

STEPS_PER_EPOCH = 4
BATCH = 2


# ---------------------------------------------------------------------------------------------------------
# small real training set-ups
# ---------------------------------------------------------------------------------------------------------

class PoisonedSource:
    """Regression data, ``STEPS_PER_EPOCH`` batches per epoch; the batches of the 1-based global steps in
    ``poison`` carry ``value`` in their features (every epoch is a new pass, so each step is distinct)."""

    def __init__(self, poison=(), value=np.inf, dim=3):
        self.poison = set(poison)
        self.value = value
        self.dim = dim
        self._epoch = 0

    def __len__(self):
        return STEPS_PER_EPOCH * BATCH

    def __iter__(self):
        self._epoch += 1
        rng = np.random.default_rng(self._epoch)
        for index in range(STEPS_PER_EPOCH * BATCH):
            global_step = (self._epoch - 1) * STEPS_PER_EPOCH + index // BATCH + 1
            x = rng.uniform(-1, 1, self.dim).astype(np.float32)
            if global_step in self.poison:
                x[1] = self.value
            yield x, np.array([x[0] if np.isfinite(x[0]) else 0.0], np.float32)


def poisoned_dataset(poison=(), value=np.inf):
    import mindspore.dataset as ds

    return ds.GeneratorDataset(PoisonedSource(poison, value), ["x", "y"], shuffle=False).batch(BATCH)


def global_step_of(epoch, step):
    return (epoch - 1) * STEPS_PER_EPOCH + step


def make_steps_recorder():
    from mindspore.train import Callback

    class StepsRun(Callback):
        """Appends ``cur_step_num`` at every step end (placed after the locator)."""

        def __init__(self):
            super().__init__()
            self.steps = []

        def on_train_step_end(self, run_context):
            self.steps.append(run_context.original_args().get("cur_step_num"))

    return StepsRun()


def train_dense(callbacks, data, epochs=2, net=None):
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    ms.set_seed(0)
    net = net or nn.Dense(3, 1)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.01)).train(
        epochs, data, callbacks=callbacks, dataset_sink_mode=False)
    return net


def all_finite(net):
    return all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())


# ---------------------------------------------------------------------------------------------------------
# poisoned batch: the record names exactly that step; the three actions
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["stop", "raise", "continue"])
def test_poisoned_batch_is_located_exactly(ms_mode, tmp_path, action):
    epoch, step = 2, 2
    poisoned = global_step_of(epoch, step)  # 6
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", action=action)
    steps_run = make_steps_recorder()
    data = poisoned_dataset(poison=[poisoned])
    if action == "raise":
        with pytest.raises(NonFiniteError) as excinfo:
            train_dense([locator, steps_run], data)
        message = str(excinfo.value)
        for part in (f"epoch {epoch}", f"step {step}/{STEPS_PER_EPOCH}", f"global step {poisoned}",
                     f"dump iteration {poisoned - 1}", "loss"):
            assert part in message, f"{part!r} missing from {message!r}"
        assert excinfo.value.record is locator.failure
    else:
        train_dense([locator, steps_run], data)

    failure = locator.failure
    assert failure is not None, f"no failure recorded; steps run {steps_run.steps}"
    got = (failure.status, failure.kind, failure.epoch, failure.step_in_epoch, failure.global_step,
           failure.dump_iteration, failure.steps_per_epoch)
    assert got == ("failed", "nonfinite_loss", epoch, step, poisoned, poisoned - 1, STEPS_PER_EPOCH), got
    assert not math.isfinite(failure.loss), failure.loss
    assert failure.nonfinite[0] == "loss" and {"weight", "bias"} <= set(failure.nonfinite), failure.nonfinite
    # the recorder runs after the locator: "raise" leaves step 6 before the recorder's hook
    last = {"stop": poisoned, "raise": poisoned - 1, "continue": 2 * STEPS_PER_EPOCH}[action]
    expected_steps = list(range(1, last + 1))
    assert steps_run.steps == expected_steps, f"action={action}: steps run {steps_run.steps}"
    on_disk = FailureRecord.load(locator.record_path)
    assert on_disk.to_dict() == failure.to_dict(), (on_disk, failure)
    assert locator.record_path == (tmp_path / "failure.json").absolute()


def test_loss_only_detection_is_later_than_parameter_check(ms_mode, tmp_path):
    """contract 7: the Embedding(padding_idx=0) -> nn.Norm model's weights go NaN at global step 11 while the
    loss stays finite until global step 12; a check of the Parameters after every step names the real step."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    from mindguard.demos import norm_nan

    from mindguard.training.run import reset_run

    found = {}
    for check_params in (True, False):
        reset_run()  # two independent trainings in one process: each its own run
        ms.set_seed(1)
        np.random.seed(1)
        net = norm_nan.build_network()
        names_before = [p.name for p in net.trainable_params()]
        locator = mindguard.training.locator.FailureLocator(tmp_path / f"params_{check_params}.json",
                                                            check_params=check_params, check_every_step=True)
        Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
            3, norm_nan.make_dataset(8), callbacks=[locator], dataset_sink_mode=False)
        assert [p.name for p in net.trainable_params()] == names_before  # the checker renames nothing
        found[check_params] = locator.failure

    with_params, loss_only = found[True], found[False]
    assert (with_params.kind, with_params.epoch, with_params.step_in_epoch, with_params.global_step,
            with_params.dump_iteration, with_params.nonfinite) == (
        "nonfinite_params", 2, 3, 11, 10, ["embedding.embedding_table"]), with_params
    assert math.isfinite(with_params.loss), with_params.loss
    assert (loss_only.kind, loss_only.global_step, loss_only.dump_iteration) == ("nonfinite_loss", 12, 11), loss_only
    assert with_params.global_step < loss_only.global_step
    assert str(with_params) == ("epoch 2, step 3/8 (global step 11), dump iteration 10: parameters became "
                                "non-finite: embedding.embedding_table")


def test_the_budgeted_check_records_the_window_the_failing_step_lies_in(ms_mode, tmp_path):
    """The same model under the default, budgeted check (issue 28) with a budget so small that only the measuring
    probe (every other step, three times) and the forced checks run: the loss goes NaN at global step 12, the check
    forced then
    finds the embedding NaN, and the record states the window -- finite after step m, non-finite at 12 -- that
    holds the real step 11, and a training state kept on disk before it (its Parameters checked finite)."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    from mindguard.demos import norm_nan

    from mindspore.train import Callback
    from mindguard.training.run import current_run

    class FirstStateOnly(Callback):
        """After the first kept state, no other before the failure: the keeper's cadence is wall time (a state about
        every second, and a young run's every YOUNG_RUN_SHARE of its time, each after a Parameter check), and a slow
        step on a loaded machine would bring a check at step 11 that finds the NaN there, before the loss does. A
        step cadence the run never reaches turns both off."""
        def on_train_step_end(self, run_context):
            keeper = current_run().state.keeper
            if keeper is not None and keeper.kept:
                keeper.schedule.min_seconds = 1e9
                keeper.schedule.every_steps = 10 ** 9

    ms.set_seed(1)
    np.random.seed(1)
    net = norm_nan.build_network()
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", check_budget=1e-6)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
        3, norm_nan.make_dataset(8), callbacks=[locator, FirstStateOnly()], dataset_sink_mode=False)
    failure = FailureRecord.load(locator.record_path)
    assert (failure.kind, failure.global_step) == ("nonfinite_loss", 12), failure
    assert "embedding.embedding_table" in failure.nonfinite, failure.nonfinite
    first, last = failure.failure_window
    assert failure.params_finite_after == first - 1 and 1 <= failure.params_finite_after < 11 and last == 12, failure
    assert "one of global steps" in failure.message and f"{first}-12" in failure.message, failure.message
    kept = failure.kept_state
    assert 2 <= kept["step"] <= first and (Path(kept["path"]) / "state.npz").is_file(), kept
    assert Path(kept["path"]).parent == tmp_path / "failure.state" / failure.run_id   # the run's own state folder
    assert failure.param_checks["checks"] >= 4 and failure.argv, failure.param_checks


def test_fast_check_false_alarm_is_confirmed_finite(graph_mode, tmp_path):
    """A finite parameter whose sum exceeds float32 range trips the fused check; the exact check clears it."""
    import mindspore as ms
    from mindspore import nn

    class WithHugeParameter(nn.Cell):
        def __init__(self):
            super().__init__()
            self.dense = nn.Dense(3, 1)
            self.huge = ms.Parameter(ms.Tensor(np.full((2, 2), 3e38, np.float32)), name="huge")  # no gradient

        def construct(self, x):
            return self.dense(x)

    net = WithHugeParameter()
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", check_every_step=True)
    train_dense([locator], poisoned_dataset(), epochs=1, net=net)
    assert locator.failure is None, locator.failure
    assert locator.false_alarms == STEPS_PER_EPOCH, locator.false_alarms
    assert FailureRecord.load(locator.record_path).status == "finished"


# ---------------------------------------------------------------------------------------------------------
# tuple outputs: GuardedTrainStep-style (loss, refused) and loss-scale (loss, overflow, scale)
# ---------------------------------------------------------------------------------------------------------

def make_scaled_step(net, outputs, scale):
    """A model-zoo-style loss-scale step over MindSpore's own ``nn.DynamicLossScaleUpdateCell`` (the stock
    ``TrainOneStepWithLossScaleCell`` cannot run on CPU: it reads NPU float-status registers): gradients of
    ``loss * scale``, ``mindspore.amp.all_finite`` on them, the update skipped and the scale halved on overflow.
    Returns ``(loss, overflow, scale)`` or, like GuardedTrainStep, ``(loss, refused)``."""
    import mindspore as ms
    from mindspore import nn, ops
    from mindspore.amp import all_finite

    class ZooLossScaleStep(nn.TrainOneStepCell):
        def __init__(self, network, optimizer, manager):
            super().__init__(network, optimizer)
            self.loss_scaling_manager = manager
            self.scale_sense = ms.Parameter(ms.Tensor(manager.get_loss_scale(), ms.float32), name="scale_sense")

        def construct(self, x, y):
            loss = self.network(x, y)
            scaling_sens = self.scale_sense
            sens = ops.ones_like(loss) * ops.cast(scaling_sens, ops.dtype(loss))
            grads = self.grad(self.network, self.weights)(x, y, sens)
            grads = tuple(g / scaling_sens for g in grads)
            overflow = ops.logical_not(all_finite(grads))
            overflow = self.loss_scaling_manager(self.scale_sense, overflow)
            if not overflow:
                loss = ops.depend(loss, self.optimizer(grads))
            if outputs == "loss_scale":
                return loss, overflow, scaling_sens
            return loss, overflow

    manager = nn.DynamicLossScaleUpdateCell(loss_scale_value=scale, scale_factor=2, scale_window=1000)
    return ZooLossScaleStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), learning_rate=0.01),
                            manager)


def train_step_cell(step_cell, callbacks, data, epochs=2):
    from mindspore.train import Model

    Model(step_cell).train(epochs, data, callbacks=callbacks, dataset_sink_mode=False)


def test_guarded_step_refusal_is_nonfinite_grads(graph_mode, tmp_path):
    from mindspore import nn

    net = nn.Dense(3, 1)
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
    poisoned = global_step_of(1, 3)
    train_step_cell(make_scaled_step(net, "guarded", 1.0), [locator], poisoned_dataset(poison=[poisoned]))
    failure = locator.failure
    assert (failure.kind, failure.global_step, failure.epoch, failure.step_in_epoch) == (
        "nonfinite_grads", poisoned, 1, 3), failure
    assert "gradients" in failure.nonfinite, failure.nonfinite
    assert all_finite(net), "the refused update must leave the weights finite"


# A feature of 1e19 keeps the loss finite (< 3.4e38) while the *scaled* gradients overflow to Inf: an overflow
# step of loss scaling, which is normal; an Inf feature makes the loss itself non-finite, which never is.
@pytest.mark.parametrize("poison, scale, kwargs, expected_step", [
    ([5], 1024.0, {"max_overflow_steps": 2}, None),            # one overflow: normal loss-scale behaviour
    ([3, 4, 5], 1024.0, {"max_overflow_steps": 3}, None),      # 3 in a row while the scale halves: no collapse
    ([3, 6], 2.0 ** 20, {"min_loss_scale": 2.0 ** 19}, 6),     # the second overflow used 2**19: the floor
])
def test_loss_scale_overflow_and_collapse(graph_mode, tmp_path, poison, scale, kwargs, expected_step):
    from mindspore import nn
    from mindspore.train import Callback

    class Overflows(Callback):
        def __init__(self):
            super().__init__()
            self.steps = []

        def on_train_step_end(self, run_context):
            p = run_context.original_args()
            if p.get("net_outputs")[1].asnumpy():
                self.steps.append(p.get("cur_step_num"))

    net = nn.Dense(3, 1)
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", **kwargs)
    overflows = Overflows()
    train_step_cell(make_scaled_step(net, "loss_scale", scale), [locator, overflows],
                    poisoned_dataset(poison, value=1e19))
    assert overflows.steps == [s for s in poison if expected_step is None or s <= expected_step], overflows.steps
    if expected_step is None:
        assert locator.failure is None, locator.failure
        assert FailureRecord.load(locator.record_path).status == "finished"
    else:
        assert (locator.failure.kind, locator.failure.global_step) == ("loss_scale_collapse", expected_step), \
            locator.failure
    assert all_finite(net)


def test_nonfinite_loss_on_a_loss_scale_overflow_step_is_a_failure(graph_mode, tmp_path):
    """The loss a loss-scale cell returns is computed before scaling: Inf/NaN in it is never just an overflow."""
    from mindspore import nn

    net = nn.Dense(3, 1)
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", max_overflow_steps=5)
    train_step_cell(make_scaled_step(net, "loss_scale", 1024.0), [locator], poisoned_dataset([3], value=np.inf))
    failure = locator.failure
    assert failure is not None and (failure.kind, failure.global_step) == ("nonfinite_loss", 3), failure
    assert "loss-scale overflow step" in failure.message and "loss" in failure.nonfinite, failure
    assert all_finite(net), "the overflow step skipped the update"


# ---------------------------------------------------------------------------------------------------------
# exceptions: recorded with their step, never swallowed or changed
# ---------------------------------------------------------------------------------------------------------

def test_runtime_error_inside_the_step_is_recorded_and_propagates(ms_mode, tmp_path):
    """An out-of-range token makes the CPU Gather kernel raise inside global step 6 (a 'run task error')."""
    import mindspore.dataset as ds
    from mindspore import nn

    class TokenSource:
        def __init__(self):
            self._epoch = 0

        def __len__(self):
            return STEPS_PER_EPOCH * BATCH

        def __iter__(self):
            self._epoch += 1
            for index in range(STEPS_PER_EPOCH * BATCH):
                tokens = np.array([1, 2, 3], np.int32)
                if self._epoch == 2 and index // BATCH == 1:
                    tokens[1] = 99
                yield tokens, np.ones(1, np.float32)

    class Bag(nn.Cell):
        def __init__(self):
            super().__init__()
            self.embedding = nn.Embedding(6, 4)
            self.head = nn.Dense(4, 1)

        def construct(self, tokens):
            return self.head(self.embedding(tokens).sum(1))

    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
    steps_run = make_steps_recorder()
    data = ds.GeneratorDataset(TokenSource(), ["tokens", "y"], shuffle=False).batch(BATCH)
    with pytest.raises(RuntimeError) as excinfo:
        train_dense([locator, steps_run], data, net=Bag())
    assert type(excinfo.value) is RuntimeError and "Gather" in str(excinfo.value)
    record = FailureRecord.load(locator.record_path)
    assert (record.status, record.kind, record.epoch, record.step_in_epoch, record.global_step,
            record.dump_iteration) == ("failed", "exception", 2, 2, 6, 5), record
    assert record.message.startswith("RuntimeError: For 'Gather'"), record.message
    assert steps_run.steps == [1, 2, 3, 4, 5], steps_run.steps


@pytest.mark.parametrize("error, kind", [(ValueError("boom at step 3"), "exception"),
                                         (KeyboardInterrupt(), "interrupted")])
def test_callback_exception_keeps_identity_and_is_recorded(ms_mode, tmp_path, error, kind):
    from mindspore.train import Callback

    class Raiser(Callback):
        def on_train_step_end(self, run_context):
            if run_context.original_args().get("cur_step_num") == 3:
                raise error

    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
    with pytest.raises(type(error)) as excinfo:
        train_dense([locator, Raiser()], poisoned_dataset())
    assert excinfo.value is error
    record = FailureRecord.load(locator.record_path)
    assert (record.kind, record.global_step, record.epoch, record.step_in_epoch) == (kind, 3, 1, 3), record
    assert record.message.startswith(f"{type(error).__name__}: {error}".strip()), record.message
    if kind == "exception":   # the script's own error, after the step's checks passed: named where it was raised
        assert record.phase == "script", record
        assert "raised by Raiser.on_train_step_end at " in record.message and "test_locate.py:" in record.message, \
            record.message


# ---------------------------------------------------------------------------------------------------------
# the record on disk while training runs; killed processes; ranks; previous records
# ---------------------------------------------------------------------------------------------------------

def test_record_names_the_step_in_progress_then_finished(graph_mode, tmp_path):
    from mindspore.train import Callback

    seen = []

    class Reader(Callback):
        """Reads the record from disk while training runs (placed after the locator)."""

        def on_train_begin(self, run_context):
            r = FailureRecord.load(tmp_path / "failure.json")
            seen.append((r.status, r.global_step))

        def on_train_step_begin(self, run_context):
            r = FailureRecord.load(tmp_path / "failure.json")
            seen.append((r.status, r.epoch, r.step_in_epoch, r.global_step, r.dump_iteration))

    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
    train_dense([locator, Reader()], poisoned_dataset())
    expected = [("running", None)] + [
        ("running", (g - 1) // STEPS_PER_EPOCH + 1, (g - 1) % STEPS_PER_EPOCH + 1, g, g - 1)
        for g in range(1, 2 * STEPS_PER_EPOCH + 1)]
    assert seen == expected, seen
    final = FailureRecord.load(locator.record_path)
    assert (final.status, final.kind, final.global_step, final.rank, final.group_size, final.device_target) == (
        "finished", None, 2 * STEPS_PER_EPOCH, 0, 1, "CPU"), final
    assert locator.failure is None


def test_sigkill_mid_training_leaves_the_step_in_progress(run_py, tmp_path):
    """The child trains 'forever' and is killed with SIGKILL inside global step 7 (from a callback that runs
    after the locator's step-begin hook, i.e. before the step's graph runs)."""
    code = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import mindspore as ms
        from mindspore.train import Callback
        import mindguard.training.locator
        from test_locate import poisoned_dataset, train_dense

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")

        class KillAtStep7(Callback):
            def on_train_step_begin(self, run_context):
                if run_context.original_args().get("cur_step_num") == 7:
                    os.kill(os.getpid(), signal.SIGKILL)

        train_dense([mindguard.training.locator.FailureLocator(sys.argv[1]), KillAtStep7()], poisoned_dataset(),
                    epochs=1000)
        """)
    record_path = tmp_path / "failure.json"
    proc = run_py(code, str(record_path), check=False)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr[-2000:])
    record = FailureRecord.load(record_path)
    assert (record.status, record.kind, record.epoch, record.step_in_epoch, record.global_step,
            record.dump_iteration) == ("running", None, 2, 3, 7, 6), record
    assert record.format() == "running: epoch 2, step 3/4 (global step 7), dump iteration 6 in progress"


def test_dump_iteration_matches_mindspore_dump_with_the_checker_running(run_py, tmp_path):
    """The record's dump_iteration is the directory MindSpore's dump wrote the poisoned batch to, and the
    locator's helper graph does not shift the training graph's numbering."""
    dump_dir = tmp_path / "dump"
    config = {"common_dump_settings": {"dump_mode": 0, "path": str(dump_dir), "net_name": "Net",
                                       "iteration": "all", "saved_data": "tensor", "input_output": 0,
                                       "kernels": [], "support_device": [0]},
              "e2e_dump_settings": {"enable": True, "trans_flag": True}}
    (tmp_path / "dump.json").write_text(json.dumps(config))
    code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        import mindspore as ms
        import mindguard.training.locator
        from test_locate import poisoned_dataset, train_dense

        ms.set_context(mode=ms.GRAPH_MODE, device_target="CPU")
        train_dense([mindguard.training.locator.FailureLocator(sys.argv[1])], poisoned_dataset(poison=[6]))
        """)
    record_path = tmp_path / "failure.json"
    run_py(code, str(record_path), env={"MINDSPORE_DUMP_CONFIG": str(tmp_path / "dump.json")})
    record = FailureRecord.load(record_path)
    assert (record.global_step, record.dump_iteration) == (6, 5), record

    net_dir = dump_dir / "rank_0" / "Net"
    training = [g for g in net_dir.iterdir() if any(g.glob("*/Parameter.inputs0.*.npy"))]
    assert len(training) == 1, sorted(p.name for p in net_dir.iterdir())
    iterations = sorted(int(p.name) for p in training[0].iterdir())
    assert iterations == list(range(6)), iterations
    batches = {k: mindguard._util.io.load_npy(next((training[0] / str(k)).glob("Parameter.inputs0.*.npy")))
               for k in iterations}
    nonfinite = [k for k, batch in batches.items() if not np.isfinite(batch).all()]
    assert nonfinite == [record.dump_iteration], nonfinite


def test_rank_aware_record_path(graph_mode, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK_ID", "1")
    monkeypatch.setenv("RANK_SIZE", "2")
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
    train_dense([locator], poisoned_dataset(), epochs=1)
    assert locator.record_path == (tmp_path / "failure.rank1.json").absolute()
    assert not (tmp_path / "failure.json").exists()
    record = FailureRecord.load(locator.record_path)
    assert (record.rank, record.group_size, record.status) == (1, 2, "finished"), record


def test_previous_records_and_foreign_files(graph_mode, tmp_path):
    path = tmp_path / "failure.json"
    FailureRecord(status="failed", kind="nonfinite_loss", epoch=1, step_in_epoch=2, global_step=2, dump_iteration=1,
                  steps_per_epoch=4, message="loss became non-finite").save(path)
    with pytest.warns(UserWarning, match="earlier failure: epoch 1, step 2/4"):
        train_dense([mindguard.training.locator.FailureLocator(path)], poisoned_dataset(), epochs=1)
    assert FailureRecord.load(path).status == "finished"

    foreign = tmp_path / "notes.json"
    foreign.write_text('{"my": "data"}')
    with pytest.raises(ValueError, match="will not overwrite"):
        train_dense([mindguard.training.locator.FailureLocator(foreign)], poisoned_dataset(), epochs=1)
    assert foreign.read_text() == '{"my": "data"}'


@pytest.mark.parametrize("kwargs, error, match", [
    ({"action": "halt"}, ValueError, "action=.*'halt'"),
    ({"check_params": "yes"}, TypeError, "check_params"),
    ({"defer_check": 1}, TypeError, "defer_check"),
    ({"record": 3}, TypeError, "record=.*3"),
    ({"record": b"x.json"}, TypeError, "record="),
    ({"record": ""}, ValueError, "empty"),
    ({"max_overflow_steps": 0}, ValueError, "max_overflow_steps"),
    ({"initial_iteration": -1}, ValueError, "initial_iteration"),
])
def test_constructor_validation(kwargs, error, match):
    with pytest.raises(error, match=match):
        mindguard.training.locator.FailureLocator(**kwargs)


def test_record_directory_is_refused(tmp_path):
    with pytest.raises(ValueError, match="is a directory"):
        mindguard.training.locator.FailureLocator(tmp_path)


# ---------------------------------------------------------------------------------------------------------
# arithmetic, record file format, CLI
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("epoch, step, steps_per_epoch, initial, expected", [
    (3, 50, 100, 0, 249),   # the field report's example (its formula gave 250: the 1-based global step)
    (1, 1, 8, 0, 0),
    (2, 1, 5, 0, 5),        # epoch 2 step 1 of 5-step epochs (measured in the facts file)
    (2, 3, 8, 0, 10),       # contract 7's failing step
    (1, 8, 8, 0, 7),
    (2, 3, 8, 100, 110),
])
def test_dump_iteration_table(epoch, step, steps_per_epoch, initial, expected):
    assert dump_iteration(epoch, step, steps_per_epoch, initial_iteration=initial) == expected


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((0, 1, 8), {}, ValueError, "epoch"),
    ((1, 0, 8), {}, ValueError, "step"),
    ((1, 9, 8), {}, ValueError, r"between 1 and steps_per_epoch \(8\), got 9.*epoch 2, step 1"),
    ((1, 1, 0), {}, ValueError, "steps_per_epoch"),
    ((1.5, 1, 8), {}, TypeError, "epoch"),
    ((True, 1, 8), {}, TypeError, "epoch"),
    ((1, 1, 8), {"initial_iteration": -1}, ValueError, "initial_iteration"),
])
def test_dump_iteration_validation(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        dump_iteration(*args, **kwargs)


def test_sink_window_arithmetic():
    from mindguard.training.run import Run

    # Ascend/GPU sink mode, sink_size 10: the 2nd hook call covers global steps 11..20
    run = Run()
    call = run.begin_call(object(), None)
    run.begin_step(call, 10, batch_num=10, epoch=1)
    position = run.begin_step(call, 20, batch_num=10, epoch=2)
    assert (position.epoch, position.step_in_epoch, position.global_step, position.dump_iteration,
            position.iteration_range) == (2, 10, 20, 19, [10, 19]), position
    # non-sink: one step per call, no window
    single = run.begin_step(call, 21, batch_num=10, epoch=3)
    assert (single.global_step, single.step_in_epoch, single.iteration_range) == (21, 1, None), single
    fields = {k: v for k, v in position.fields().items() if k not in ("epoch", "call", "step_window_us")}
    record = FailureRecord(status="failed", kind="nonfinite_loss", epoch=2, message="loss became non-finite",
                           **fields)
    assert "(sink window: dump iterations 10-19)" in record.format(), record.format()


def test_record_round_trip_and_load_errors(tmp_path):
    record = FailureRecord(status="failed", kind="nonfinite_params", epoch=2, step_in_epoch=3, global_step=11,
                           dump_iteration=10, steps_per_epoch=8, dataset_sink_mode=False, rank=0, group_size=1,
                           loss=float("nan"), nonfinite=["embedding.embedding_table"],
                           message="parameters became non-finite: embedding.embedding_table", time="t")
    path = record.save(tmp_path / "r.json")
    text = path.read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-strict JSON constant {c} in {text}"))
    assert json.loads(text)["loss"] == "nan"
    loaded = FailureRecord.load(path)
    assert loaded.to_dict() == record.to_dict() and math.isnan(loaded.loss)
    assert list(record.to_dict()) == ["schema", "status", "kind", "global_step", "call", "epoch", "step_in_epoch",
                                      "dump_iteration", "graph", "dump_graphs", "iteration_observed", "iteration_range",
                                      "steps_per_epoch", "dataset_sink_mode", "sink_size", "rank", "group_size",
                                      "device_target", "mindspore_version", "mindguard_version", "seed", "loss",
                                      "nonfinite", "message", "time", "mode", "examine", "phase", "step_window_us"]

    with pytest.raises(RecordError, match=r"no failure record at .*missing\.json"):
        FailureRecord.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    for content, match in [("{not json", "bad.json.*not valid JSON"),
                           ("[1, 2]", "bad.json.*JSON object"),
                           ('{"schema": 3, "status": "failed"}', "bad.json.*schema"),
                           ('{"schema": 1, "status": "exploded"}', "bad.json.*status"),
                           ('{"schema": 1, "status": "failed", "kind": "oops"}', "kind"),
                           ('{"schema": 1, "status": "failed", "global_step": "7"}', "global_step"),
                           ('{"schema": 1, "status": "failed", "loss": "big"}', "loss")]:
        bad.write_text(content)
        with pytest.raises(RecordError, match=match):
            FailureRecord.load(bad)


def test_cli_iteration_and_record(tmp_path, capsys):
    parser = build_parser()
    args = parser.parse_args(["iteration", "--epoch", "3", "--step", "50", "--steps-per-epoch", "100"])
    assert cli_iteration(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("dump iteration 249\n") and "100 * (3 - 1) + 50 - 1 + 0" in out, out
    assert cli_iteration(parser.parse_args(["iteration", "--epoch", "1", "--step", "9", "--steps-per-epoch", "8"])) == 2
    assert "between 1 and steps_per_epoch" in capsys.readouterr().err

    path = FailureRecord(status="failed", kind="exception", epoch=1, step_in_epoch=2, global_step=2, dump_iteration=1,
                         steps_per_epoch=4, message="RuntimeError: run task error").save(tmp_path / "f.json")
    assert cli_record(parser.parse_args(["record", str(path)])) == 0
    out = capsys.readouterr().out
    assert "epoch 1, step 2/4 (global step 2), dump iteration 1: RuntimeError: run task error" in out, out
    assert cli_record(parser.parse_args(["record", str(path), "--json"])) == 0
    assert json.loads(capsys.readouterr().out)["kind"] == "exception"
    assert cli_record(parser.parse_args(["record", str(tmp_path / "none.json")])) == 2
    assert "no failure record" in capsys.readouterr().err


def test_arithmetic_and_records_do_not_import_mindspore(run_py, tmp_path):
    """``mindguard iteration`` / ``mindguard record`` only do arithmetic and read JSON: no 2 s mindspore import."""
    run_py(f"""
        import sys
        import mindguard.protocol.record
        from mindguard.protocol.record import FailureRecord
        assert mindguard.protocol.record.dump_iteration(3, 50, 100) == 249
        FailureRecord(status="finished").save({str(tmp_path / "r.json")!r})
        assert FailureRecord.load({str(tmp_path / "r.json")!r}).status == "finished"
        loaded = sorted(m for m in sys.modules if m.split(".")[0] == "mindspore")
        assert not loaded, loaded
        """)


@pytest.mark.parametrize("on_host", [True, False], ids=["host-blas", "compiled"])
def test_both_parameter_checks_find_every_nan_and_inf_and_clear_finite_overflow(ms_mode, on_host):
    """The CPU path (BLAS over zero-copy views) and the device path (compiled fused sum) agree."""
    import mindspore as ms
    from mindspore import ops

    from mindguard.training.checks.finite import ParamChecker as _ParamChecker

    values = {"w": np.ones((64, 32), np.float32), "b": np.zeros((32,), np.float32),
              "h": np.ones((8, 4), np.float16)}
    params = [ms.Parameter(ms.Tensor(v), name=n) for n, v in values.items()]
    checker = _ParamChecker(params, on_host=on_host)
    assert checker.nonfinite_names() == []
    for name, index, bad in (("w", (63, 31), np.nan), ("b", (0,), np.inf), ("h", (2, 3), -np.inf),
                             ("w", (0, 0), -np.inf)):
        param = params[list(values).index(name)]
        data = values[name].copy()
        data[index] = bad
        ops.assign(param, ms.Tensor(data))  # in place, as an optimizer writes (a PyNative @jit graph does not
        assert checker.nonfinite_names() == [name], (name, index, bad)  # see Parameter.set_data replacements)
        ops.assign(param, ms.Tensor(values[name]))
    ops.assign(params[0], ms.Tensor(np.full((64, 32), 3e38, np.float32)))  # finite, but its sum overflows
    # the host sum of squares overflows and the exact check clears it; the compiled AllFinite never alarms
    assert checker.nonfinite_names() == [] and checker.false_alarms == (1 if on_host else 0)


def test_a_bug_in_mindguards_own_check_is_never_reported_as_the_trainings_failure(graph_mode, tmp_path, monkeypatch):
    """mindguard's own check raising (simulated by breaking mindguard's parameter checker, not MindSpore): the
    training runs to its end, one MindguardWarning says whose problem it is, and the record says "finished"."""
    from mindguard.errors import MindguardWarning
    from mindguard.training.checks.finite import ParamChecker

    def broken(self):
        raise IndexError("simulated mindguard bug")

    monkeypatch.setattr(ParamChecker, "start", broken)
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
    steps_run = make_steps_recorder()
    with pytest.warns(MindguardWarning, match=r"mindguard's own error .*not your training's") as caught:
        train_dense([locator, steps_run], poisoned_dataset())
    assert steps_run.steps == list(range(1, 2 * STEPS_PER_EPOCH + 1)), steps_run.steps
    assert sum("disabled its Parameter check" in str(w.message) for w in caught) == 1, [str(w.message) for w in caught]
    record = FailureRecord.load(locator.record_path)
    assert (record.status, record.kind, locator.failure) == ("finished", None, None), record
    assert [lost["check"] for lost in record.checks_lost] == ["Parameter"], record


def test_running_record_of_each_step_is_the_full_record(graph_mode, tmp_path):
    """The per-step record comes from a template; it must be the document the full record writer would write."""
    from mindspore.train import Callback

    from mindguard.protocol.record import read_record_data
    from mindguard.training.run import current_run

    compared = []

    class Reader(Callback):
        def on_train_step_begin(self, run_context):  # placed after the locator: the step's record is written
            written = read_record_data(tmp_path / "failure.json")   # the step in progress: its progress file
            full = current_run().recorder.record("running").to_dict()
            assert list(written) == list(full), (list(written), list(full))
            for key in full:
                if key == "step_window_us":
                    assert written[key][0] == full[key][0], (written[key], full[key])
                elif key != "time":
                    assert written[key] == full[key], (key, written[key], full[key])
            compared.append(written["global_step"])

    train_dense([mindguard.training.locator.FailureLocator(tmp_path / "failure.json"), Reader()], poisoned_dataset())
    assert compared == list(range(1, 2 * STEPS_PER_EPOCH + 1))


def test_parameter_check_follows_parameters_whose_memory_moved(graph_mode):
    """The host check keeps zero-copy views between steps; a Parameter given new memory (set_data) must be
    read from its new memory, and an in-place write must be seen through the kept view."""
    import mindspore as ms
    from mindspore import nn, ops

    from mindguard.training.checks.finite import ParamChecker

    net = nn.Dense(3, 2)
    checker = ParamChecker(net.trainable_params(), on_host=True)
    assert checker.nonfinite_names() == []
    weight, bias = net.weight, net.bias
    weight.set_data(ms.Tensor(np.full((2, 3), np.nan, np.float32)))
    assert checker.nonfinite_names() == [weight.name]
    weight.set_data(ms.Tensor(np.ones((2, 3), np.float32)))
    assert checker.nonfinite_names() == []
    ops.assign(bias, ms.Tensor(np.array([0.0, np.inf], np.float32)))
    assert checker.nonfinite_names() == [bias.name]


# ---------------------------------------------------------------------------------------------------------
# deferred verdicts (the GPU/Ascend default; forced here, which runs the device path's compiled check on CPU)
# ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("action", ["stop", "raise"])
def test_deferred_verdict_names_the_failing_step_and_says_when_it_was_seen(ms_mode, tmp_path, action):
    """Read one step late, the verdict still names global step 6 (the poisoned batch); the record adds
    ``seen_at_step`` 7, and with "stop" step 7 is the last that ran."""
    poisoned = global_step_of(2, 2)
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", action=action, defer_check=True,
                                               check_every_step=True)
    steps_run = make_steps_recorder()
    if action == "raise":
        with pytest.raises(NonFiniteError, match=f"global step {poisoned}"):
            train_dense([locator, steps_run], poisoned_dataset(poison=[poisoned]))
    else:
        train_dense([locator, steps_run], poisoned_dataset(poison=[poisoned]))
    failure = FailureRecord.load(locator.record_path)
    assert (failure.kind, failure.global_step, failure.dump_iteration, failure.seen_at_step) == (
        "nonfinite_loss", poisoned, poisoned - 1, poisoned + 1), failure
    assert {"loss", "weight", "bias"} <= set(failure.nonfinite), failure.nonfinite
    assert f"seen at the end of global step {poisoned + 1}" in failure.message, failure.message
    assert steps_run.steps == list(range(1, poisoned + (2 if action == "stop" else 1))), steps_run.steps


def test_deferred_parameter_check_names_the_step_whose_update_went_bad(ms_mode, tmp_path):
    """The norm model's weights go NaN at global step 11 with a finite loss (the loss shows it at 12, when the
    deferred verdict of 11 is read): the deferred device-path check still names step 11 and the parameter."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    from mindguard.demos import norm_nan

    ms.set_seed(1)
    np.random.seed(1)
    net = norm_nan.build_network()
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", defer_check=True,
                                                        check_every_step=True)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
        3, norm_nan.make_dataset(8), callbacks=[locator], dataset_sink_mode=False)
    failure = locator.failure
    assert (failure.kind, failure.global_step, failure.dump_iteration, failure.nonfinite, failure.seen_at_step) == (
        "nonfinite_params", 11, 10, ["embedding.embedding_table"], 12), failure
    assert math.isfinite(failure.loss), failure.loss


def test_deferred_verdict_of_an_epochs_last_step_is_read_at_the_epochs_end(graph_mode, tmp_path):
    """Global step 4 ends epoch 1: its verdict is read at the epoch's end, before another step runs."""
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", defer_check=True)
    steps_run = make_steps_recorder()
    train_dense([locator, steps_run], poisoned_dataset(poison=[STEPS_PER_EPOCH]))
    failure = FailureRecord.load(locator.record_path)
    assert (failure.kind, failure.global_step, failure.seen_at_step) == ("nonfinite_loss", STEPS_PER_EPOCH, None)
    assert "seen at the end" not in failure.message, failure.message
    assert steps_run.steps == list(range(1, STEPS_PER_EPOCH + 1)), steps_run.steps


def test_deferred_verdict_is_read_before_an_exception_is_recorded(graph_mode, tmp_path):
    """Step 5 went non-finite, then a callback raised as step 6 began, before step 5's verdict was read: the
    record names step 5's failure, and the exception propagates unchanged."""
    from mindspore.train import Callback

    class RaisesAtSix(Callback):
        def on_train_step_begin(self, run_context):
            if run_context.original_args().get("cur_step_num") == 6:
                raise ValueError("boom as step 6 began")

    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", defer_check=True)
    with pytest.raises(ValueError, match="boom as step 6 began"):
        train_dense([locator, RaisesAtSix()], poisoned_dataset(poison=[5]))
    failure = FailureRecord.load(locator.record_path)
    assert (failure.status, failure.kind, failure.global_step) == ("failed", "nonfinite_loss", 5), failure


def test_deferred_verdict_of_a_healthy_run_finishes_with_nothing_recorded(graph_mode, tmp_path):
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", defer_check=True)
    net = train_dense([locator], poisoned_dataset())
    record = FailureRecord.load(locator.record_path)
    assert (record.status, record.global_step, locator.failure) == ("finished", 2 * STEPS_PER_EPOCH, None), record
    assert "seen_at_step" not in json.loads(locator.record_path.read_text())
    assert all_finite(net)


def test_deferred_verdict_is_refused_for_a_guarded_train_step(graph_mode, tmp_path):
    """A GuardedTrainStep must hear of its refusal before its next step: defer_check=True is refused before
    the first step, and the default does not defer it."""
    import mindspore as ms
    from mindspore import nn

    net = nn.Dense(3, 1)
    step = mindguard.GuardedTrainStep(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.01))
    steps_run = make_steps_recorder()
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", defer_check=True)
    with pytest.raises(mindguard.errors.ArgumentError, match=r"defer_check=True\) cannot .*GuardedTrainStep"):
        train_step_cell(step, [locator, steps_run], poisoned_dataset())
    assert steps_run.steps == []
    # the user's argument is not the training's failure: nothing recorded, no record file left behind
    assert locator.failure is None and not (tmp_path / "failure.json").exists(), locator.failure
    default = mindguard.training.locator.FailureLocator(tmp_path / "default.json")
    assert mindguard.training.locator.choose_defer(default.defer_check, step) == (False, False)
    assert ms.get_context("device_target") == "CPU"


def test_compiled_check_is_rebuilt_when_a_parameter_gets_new_memory(ms_mode):
    """A compiled (device-path) check follows the memory it was compiled with; after ``set_data`` (a checkpoint
    loaded between two training calls) ``checks()`` says it no longer covers the Parameters, and a new checker
    sees the new values."""
    import mindspore as ms
    from mindspore import nn

    from mindguard.training.checks.finite import ParamChecker

    net = nn.Dense(3, 2)
    params = net.trainable_params()
    checker = ParamChecker(params, on_host=False)
    assert checker.checks(params) and checker.nonfinite_names() == []
    net.weight.set_data(ms.Tensor(np.full((2, 3), np.nan, np.float32)))
    assert not checker.checks(params)
    assert ParamChecker(params, on_host=False).nonfinite_names() == [net.weight.name]


def test_an_error_mindspore_raises_is_told_from_mindguards_own():
    """A RuntimeError from MindSpore's code (here a real kernel error: a Gather index out of range) is the
    training's and propagates from the verdict; one raised in mindguard's own code is mindguard's."""
    import mindspore as ms
    from mindspore import ops

    from mindguard.training.checks.verdicts import raised_by_mindspore as _raised_by_mindspore

    with pytest.raises(RuntimeError) as from_mindspore:
        ops.gather(ms.Tensor(np.ones((3, 2), np.float32)), ms.Tensor(np.array([7], np.int32)), 0).asnumpy()
    assert _raised_by_mindspore(from_mindspore.value), from_mindspore.value
    try:
        raise RuntimeError("mindguard's own")
    except RuntimeError as ours:
        assert not _raised_by_mindspore(ours)
    assert not _raised_by_mindspore(ValueError("not a RuntimeError"))


def test_cpu_default_checks_small_parameters_on_the_host_and_large_ones_compiled(graph_mode):
    """At most HOST_CHECK_MAX_BYTES of Parameters are read by numpy on CPU; more go to the compiled check (a host
    read of them slows the next step, docs/mindspore-facts.md). Both name exactly the non-finite Parameter."""
    import mindspore as ms
    from mindguard.training.checks.finite import HOST_CHECK_MAX_BYTES, ParamChecker, host_check_by_default

    small = ms.Parameter(ms.Tensor(np.ones((256, 256), np.float32)), name="small")            # 256 KiB
    large = ms.Parameter(ms.Tensor(np.ones((1024, 1024), np.float32)), name="large")          # 4 MiB
    assert small.size * 4 <= HOST_CHECK_MAX_BYTES < large.size * 4
    assert host_check_by_default([small]) is True
    assert host_check_by_default([small, large]) is False
    checker = ParamChecker([small, large])
    assert checker.on_host is False and checker.nonfinite_names() == []
    large.set_data(ms.Tensor(np.full((1024, 1024), np.nan, np.float32)))
    assert ParamChecker([small, large]).nonfinite_names() == ["large"]
    small.set_data(ms.Tensor(np.full((256, 256), np.inf, np.float32)))
    assert ParamChecker([small]).nonfinite_names() == ["small"]


def test_compiled_cpu_default_names_the_step_whose_update_went_bad(ms_mode, tmp_path, monkeypatch):
    """The norm model's weights go NaN at global step 11 with a finite loss: with every model above the host
    threshold, the compiled check the locator then picks names step 11 and the Parameter, as the host check does,
    at once (CPU does not defer)."""
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model
    from mindguard.demos import norm_nan

    monkeypatch.setattr(mindguard.training.checks.finite, "HOST_CHECK_MAX_BYTES", 0)
    ms.set_seed(1)
    np.random.seed(1)
    net = norm_nan.build_network()
    locator = mindguard.training.locator.FailureLocator(tmp_path / "failure.json", check_every_step=True)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params(), learning_rate=0.05)).train(
        3, norm_nan.make_dataset(8), callbacks=[locator], dataset_sink_mode=False)
    failure = locator.failure
    assert locator.verdicts.checker.on_host is False and not locator.verdicts.defer
    assert (failure.kind, failure.global_step, failure.dump_iteration, failure.nonfinite, failure.seen_at_step) == (
        "nonfinite_params", 11, 10, ["embedding.embedding_table"], None), failure


def test_the_run_changes_no_dataset_config_until_the_training_is_set_up(tmp_path):
    """Issue 40: creating the run (its hunt request asks for the dataset examination) leaves MindSpore's dataset
    config as it is; the synchronous pipeline is set where the training is set up -- here a FailureLocator."""
    import mindspore.dataset as ds

    from mindguard.protocol.request import HuntRequest
    from mindguard.training.run import Run, reset_run

    request = HuntRequest(pass_name="examine", record=tmp_path / "failure.json", examine_step=3, examine="dataset")
    assert ds.config.get_debug_mode() is False
    try:
        Run(request)
        assert ds.config.get_debug_mode() is False, "the run's constructor changed the dataset config"
        reset_run(request)
        assert ds.config.get_debug_mode() is False
        mindguard.training.locator.FailureLocator(tmp_path / "failure.json")
        assert ds.config.get_debug_mode() is True, "the locator did not set up what the hunt's request asks"
    finally:
        ds.config.set_debug_mode(False)
        reset_run(None)
