"""replace_cells on real MindSpore networks: the swap takes effect (GRAPH and PyNative), parameter names
and checkpoints survive it, and the two cases MindSpore would silently get wrong are refused."""
from __future__ import annotations

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn

from mindguard.nn.cells import replace_cells
from mindguard.errors import CellSurgeryError


class Block(nn.Cell):
    def __init__(self):
        super().__init__()
        self.fc = nn.Dense(3, 3)
        self.act = nn.ReLU()

    def construct(self, x):
        return self.act(self.fc(x))


class Nested(nn.Cell):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.seq = nn.SequentialCell([nn.Dense(3, 3), nn.ReLU()])
        self.layers = nn.CellList([nn.ReLU(), nn.Dense(3, 2)])

    def construct(self, x):
        x = self.seq(self.block(x))
        for layer in self.layers:
            x = layer(x)
        return x


def _x():
    return Tensor(np.linspace(-2, 2, 12, dtype=np.float32).reshape(4, 3))


def _manual(net, x, act):
    """The network's computation in numpy, with `act` for every activation."""
    def dense(cell, v):
        return v @ cell.weight.asnumpy().T + cell.bias.asnumpy()
    v = act(dense(net.block.fc, x.asnumpy()))
    v = act(dense(net.seq[0], v))
    return dense(net.layers[1], act(v))


def test_nested_sequential_and_celllist_swaps_take_effect(ms_mode):
    net = Nested()
    x = _x()
    before = net(x).asnumpy() if ms_mode == "pynative" else None
    if before is not None:
        np.testing.assert_allclose(before, _manual(net, x, lambda v: np.maximum(v, 0)), rtol=1e-5, atol=1e-6)
    replaced = replace_cells(net, nn.ReLU, lambda old: nn.Tanh())
    assert replaced == ["block.act", "seq.1", "layers.0"], replaced
    assert isinstance(net.seq[1], nn.Tanh) and isinstance(net.layers[0], nn.Tanh) and isinstance(net.block.act, nn.Tanh)
    out = net(x).asnumpy()
    np.testing.assert_allclose(out, _manual(net, x, np.tanh), rtol=1e-5, atol=1e-6,
                               err_msg=f"swap ignored in {ms_mode} mode")


def test_predicate_match_and_children_of_a_match_are_not_visited():
    net = Nested()
    replaced = replace_cells(net, lambda c: isinstance(c, Block), lambda old: nn.Dense(3, 3))
    assert replaced == ["block"], replaced
    assert replace_cells(net, nn.Conv2d, lambda old: nn.Identity()) == []


def test_cell_shared_under_two_names_is_replaced_everywhere():
    class Shared(nn.Cell):
        def __init__(self):
            super().__init__()
            act = nn.ReLU()
            self.a = act
            self.b = act

        def construct(self, x):
            return self.a(x) + self.b(x)

    net = Shared()
    assert replace_cells(net, nn.ReLU, lambda old: nn.Tanh()) == ["a", "b"]
    assert isinstance(net.a, nn.Tanh) and net.a is net.b, (type(net.a), type(net.b))


def test_parameter_names_stable_and_checkpoint_loads_after_swap(tmp_path):
    net = Nested()
    names_before = [p.name for p in net.get_parameters()]
    ckpt = str(tmp_path / "before.ckpt")
    ms.save_checkpoint(net, ckpt)
    saved = {p.name: p.asnumpy().copy() for p in net.get_parameters()}

    replaced = replace_cells(net, nn.Dense, lambda old: nn.Dense(old.in_channels, old.out_channels))
    assert replaced == ["block.fc", "seq.0", "layers.1"], replaced
    names_after = [p.name for p in net.get_parameters()]
    assert names_after == names_before, (names_before, names_after)
    assert not np.array_equal(net.seq[0].weight.asnumpy(), saved["seq.0.weight"])  # fresh weights

    not_loaded, _ = ms.load_param_into_net(net, ms.load_checkpoint(ckpt))
    assert not not_loaded, not_loaded
    for p in net.get_parameters():
        np.testing.assert_array_equal(p.asnumpy(), saved[p.name], err_msg=p.name)


def test_refuses_after_graph_compile(graph_mode):
    net = Nested()
    net(_x())  # compiles the whole network in GRAPH mode
    with pytest.raises(CellSurgeryError, match="already compiled in GRAPH mode") as err:
        replace_cells(net, nn.ReLU, lambda old: nn.Tanh())
    assert "block.act" in str(err.value)
    assert isinstance(net.block.act, nn.ReLU)  # untouched


def test_refuses_after_model_train_compiled_the_backbone(graph_mode):
    import mindspore.dataset as ds
    from mindspore.train import Model

    net = nn.SequentialCell([nn.Dense(2, 2), nn.ReLU()])
    x = np.ones((4, 2), np.float32)
    Model(net, nn.MSELoss(), nn.SGD(net.trainable_params())).train(
        1, ds.NumpySlicesDataset((x, x), column_names=["x", "y"], shuffle=False).batch(2), dataset_sink_mode=False)
    with pytest.raises(CellSurgeryError, match="compiled"):
        replace_cells(net, nn.ReLU, lambda old: nn.Tanh())


def test_refuses_param_owning_swap_after_optimizer_built_but_allows_param_free():
    net = Nested()
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.1)
    with pytest.raises(CellSurgeryError, match="optimizer SGD already updates") as err:
        replace_cells(net, nn.Dense, lambda old: nn.Dense(old.in_channels, old.out_channels))
    assert "block.fc.weight" in str(err.value), str(err.value)
    assert replace_cells(net, nn.ReLU, lambda old: nn.Tanh()) == ["block.act", "seq.1", "layers.0"]
    del optimizer


@pytest.mark.parametrize("args, message", [
    (("not a net", nn.ReLU, lambda o: nn.Tanh()), "needs a mindspore.nn.Cell, got str"),
    ((None, nn.ReLU, lambda o: nn.Tanh()), "needs a mindspore.nn.Cell, got NoneType"),
    ((nn.ReLU(), int, lambda o: nn.Tanh()), "class int, which is not a mindspore.nn.Cell"),
    ((nn.ReLU(), "ReLU", lambda o: nn.Tanh()), "must be a Cell class or a predicate"),
    ((nn.ReLU(), nn.ReLU, "Tanh"), "factory=...\\) must be callable"),
])
def test_bad_arguments_are_type_errors(args, message):
    with pytest.raises(TypeError, match=message):
        replace_cells(*args)


def test_factory_returning_non_cell_replaces_nothing():
    net = Nested()
    made = []

    def factory(old):
        made.append(old)
        return nn.Tanh() if len(made) < 3 else "oops"

    with pytest.raises(TypeError, match="factory returned str for 'layers.0'.*nothing was replaced"):
        replace_cells(net, nn.ReLU, factory)
    assert [type(c).__name__ for c in (net.block.act, net.seq[1], net.layers[0])] == ["ReLU"] * 3
