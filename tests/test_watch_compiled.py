"""Which watched steps are compiled (examined by dump) and which run eagerly (replayed), on real MindSpore (CPU):
a Cell called in GRAPH mode compiles its ``construct`` whatever calls it -- a ``TrainOneStepCell`` stepped by hand
is one graph, not only an ``@jit`` function (issue 43)."""
from __future__ import annotations

import numpy as np
import pytest

import mindguard
from mindguard.training.watch import runs_compiled
from mindguard.errors import NonFiniteError


def _train_cell():
    from mindspore import nn

    net = nn.Dense(3, 1)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.01)
    return net, optimizer, nn.TrainOneStepCell(nn.WithLossCell(net, nn.MSELoss()), optimizer)


def test_a_train_cell_stepped_in_graph_mode_is_examined_by_dump_and_in_pynative_by_replay(ms_mode, tmp_path):
    import mindspore as ms

    net, optimizer, train_cell = _train_cell()
    step = mindguard.watch(train_cell, net, optimizer, record=str(tmp_path / "failure.json"))
    x = np.ones((2, 3), np.float32)
    step(ms.Tensor(x), ms.Tensor(np.ones((2, 1), np.float32)))
    x[0, 0] = np.inf
    with pytest.raises(NonFiniteError) as caught:
        step(ms.Tensor(x), ms.Tensor(np.ones((2, 1), np.float32)))
    failure = caught.value.record
    assert failure.global_step == 2 and failure.examine == ("dump" if ms_mode == "graph" else "replay"), failure


def test_what_runs_compiled_is_decided_by_the_callable_and_the_mode_at_the_call(ms_mode):
    import mindspore as ms
    from mindspore import nn

    net, _, train_cell = _train_cell()

    def eager_step(x, y):
        return train_cell(x, y)

    class JitCell(nn.Cell):
        @ms.jit
        def construct(self, x):
            return net(x)

    assert runs_compiled(train_cell) is (ms_mode == "graph")
    assert runs_compiled(ms.jit(eager_step)) and runs_compiled(JitCell())
    # a plain function: eager, even in GRAPH mode (its value_and_grad runs op by op)
    assert not runs_compiled(eager_step)
