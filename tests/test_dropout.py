"""The dropout Guard puts in place of nn.Dropout (mindguard.training.dropout, issue 39): the masks a resumed step draws
are the failing run's, bit for bit, and it computes what nn.Dropout computes (keep probability, 1/keep scaling,
training mode only). Real MindSpore, GRAPH and PyNative (the ms_mode fixture)."""
from __future__ import annotations

import warnings

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn

from mindguard.errors import MindguardWarning
from mindguard.training.dropout import KeptStateDropout, host_keep, install, make_restorable


class Net(nn.Cell):
    def __init__(self, keep_prob=None):
        super().__init__()
        self.fc1 = nn.Dense(16, 64)
        self.drop = nn.Dropout(keep_prob=keep_prob) if keep_prob is not None else nn.Dropout(p=0.3)
        self.fc2 = nn.Dense(64, 1)

    def construct(self, x):
        return self.fc2(self.drop(self.fc1(x)))


def _train_cell(restorable: bool):
    ms.set_seed(1)
    net = Net()
    if restorable:
        assert make_restorable(net) == ["drop"]
    cell = nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), nn.SGD(net.trainable_params(), 0.05))
    cell.set_train()
    return net, cell


def _batch(step: int):
    rng = np.random.RandomState(step)
    return ms.Tensor(rng.randn(8, 16).astype(np.float32)), ms.Tensor(rng.randn(8, 1).astype(np.float32))


def _losses_after_resume(restorable: bool):
    """Losses of global steps 4-6 (1-based) of one run, and of a second run built afresh that starts from the first
    run's Parameters at the beginning of step 4 (what a hunt's resumed pass does)."""
    net, cell = _train_cell(restorable)
    for step in (1, 2, 3):
        cell(*_batch(step))
    kept = {p.name: p.asnumpy().copy() for p in cell.get_parameters()}
    failing = [cell(*_batch(step)).asnumpy() for step in (4, 5, 6)]
    net, cell = _train_cell(restorable)
    for param in cell.get_parameters():
        param.set_data(ms.Tensor(kept[param.name]))
    resumed = [cell(*_batch(step)).asnumpy() for step in (4, 5, 6)]
    return kept, failing, resumed


def test_a_resumed_step_draws_the_failing_runs_masks(ms_mode):
    kept, failing, resumed = _losses_after_resume(restorable=True)
    # one draw per forward: 3 steps, 3 draws -- or 6 where PyNative runs the forward again for the gradient (it does
    # after some earlier work in the same process; a CI worker saw it); the resumed run draws the same way
    assert int(kept["drop.draws"]) in (3, 6), kept["drop.draws"]
    assert [float(v) for v in resumed] == [float(v) for v in failing]   # bit for bit


def test_nn_dropouts_kernel_draws_other_masks_after_the_same_restore(ms_mode):
    """The control: restoring every Parameter does not bring nn.Dropout's kernel to where it was."""
    _, failing, resumed = _losses_after_resume(restorable=False)
    assert [float(v) for v in resumed] != [float(v) for v in failing]


def test_it_keeps_and_scales_as_nn_dropout_in_training_and_passes_through_in_eval(ms_mode):
    x = ms.Tensor(np.ones((32, 128), np.float32))
    for spelled, keep in (({"p": 0.25}, 0.75), ({"keep_prob": 0.9}, 0.9)):
        ms.set_seed(1)
        net = nn.SequentialCell([nn.Dropout(**spelled)])
        make_restorable(net)
        drop = net[0]
        assert isinstance(drop, KeptStateDropout) and drop.keep_prob == pytest.approx(keep)
        net.set_train()
        outs = np.stack([net(x).asnumpy() for _ in range(10)])
        assert set(np.unique(outs).tolist()) == {0.0, float(np.float32(1.0) / np.float32(keep))}
        assert abs((outs != 0).mean() - keep) < 0.01          # 40,960 draws: 5+ standard deviations
        assert not all(np.array_equal(outs[0], o) for o in outs[1:])   # a new mask per call
        assert int(drop.draws.asnumpy()) == 10
        net.set_train(False)
        assert np.array_equal(net(x).asnumpy(), x.asnumpy()) and int(drop.draws.asnumpy()) == 10


def test_two_cells_never_share_masks_and_other_dropouts_stay(ms_mode):
    ms.set_seed(1)
    net = nn.SequentialCell([nn.Dropout(p=0.5), nn.Dropout(p=0.5), nn.Dropout2d(p=0.5)])
    assert make_restorable(net) == ["0", "1"]   # Dropout2d's channel masks are not replaced (the kept state names it)
    assert type(net[2]) is nn.Dropout2d
    net.set_train()
    x = ms.Tensor(np.ones((64, 64), np.float32))
    assert not np.array_equal(net[0](x).asnumpy(), net[1](x).asnumpy())
    assert [p.name for p in net.get_parameters()] == ["0.draws", "1.draws"]


def test_a_network_compiled_before_guard_starts_keeps_its_kernels_with_a_warning(graph_mode):
    ms.set_seed(1)
    net = Net()
    net.set_train()
    net(ms.Tensor(np.ones((2, 16), np.float32)))   # compiled: a swap now would be ignored by MindSpore
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert install(net) == []
    assert type(net.drop) is nn.Dropout
    assert any(issubclass(w.category, MindguardWarning) and "keeping nn.Dropout's own random kernels" in str(w.message)
               for w in caught), [str(w.message) for w in caught]


def test_a_graph_draws_the_masks_an_eager_call_computes_on_the_host(graph_mode):
    """GRAPH runs the int32 hash as graph ops, PyNative computes it with numpy (host_keep): the same masks, bit for
    bit, so a run's masks do not depend on how its construct ran."""
    drop = KeptStateDropout(0.8, seed=2024)
    drop.set_train()
    ones = ms.Tensor(np.ones((3, 5, 7), np.float32))
    graph = [drop(ones).asnumpy() for _ in range(3)]
    for count, got in enumerate(graph, start=1):
        assert np.array_equal(got, host_keep(count, 2024, 0.8, (3, 5, 7), np.float32)), count
    assert len({g.tobytes() for g in graph}) == 3


def test_a_tensor_too_big_for_a_constant_draws_the_same_masks(graph_mode, monkeypatch):
    """Above CONSTANT_ELEMENTS the graph computes the element indices per call instead of holding them as a constant
    (no constant as big as the activations): the same masks."""
    from mindguard.training import dropout

    monkeypatch.setattr(dropout, "CONSTANT_ELEMENTS", 16)
    drop = KeptStateDropout(0.5, seed=7)
    drop.set_train()
    got = drop(ms.Tensor(np.ones((4, 9), np.float32))).asnumpy()
    assert np.array_equal(got, host_keep(1, 7, 0.5, (4, 9), np.float32))


def test_a_float16_input_gets_a_float16_mask(ms_mode):
    drop = KeptStateDropout(0.75, seed=3)
    drop.set_train()
    out = drop(ms.Tensor(np.ones((8, 64), np.float16)))
    assert out.dtype == ms.float16
    assert set(np.unique(out.asnumpy()).tolist()) == {0.0, float(np.float16(1 / 0.75))}
    assert np.array_equal(out.asnumpy(), host_keep(1, 3, 0.75, (8, 64), np.float16))
