"""SafeNorm / safe_norm / make_safe against the real mindspore.nn.Norm: same shapes, values within the
documented bound, finite gradients at zero (where nn.Norm's are NaN), and the demo training fixed."""
from __future__ import annotations

import math
import os

import numpy as np
import pytest

import mindspore as ms
from mindspore import Tensor, nn
from mindspore.train import Callback, Model

import mindguard
from mindguard import SafeNorm, make_safe, safe_norm
from mindguard.training import seed as _seed
from mindguard.errors import CellSurgeryError
from mindguard.demos import norm_nan

EPS = 1e-6
SHAPES_AXES = [
    ((5,), [(), 0, -1, (0,)]),
    ((3, 4), [(), 0, 1, -1, (0, 1), (-2,), (1, 0)]),
    ((2, 3, 4), [(), -1, 1, (0, 2), (-1, -3), (0, 1, 2)]),
]
# fp rounding allowance on top of the exact difference, relative to the norm's magnitude
TOL = {np.float32: 2e-6, np.float16: 4e-3}


def _input(shape, dtype):
    rng = np.random.RandomState(sum(shape))
    x = rng.uniform(-1.5, 1.5, size=shape)
    x.reshape(-1, shape[-1])[0] = 0.0          # an all-zero row: s = 0 on every reduction including it
    return x.astype(dtype)


def _sum_squares(x, axis, keep_dims):
    axis = None if axis == () else axis
    return np.sum(np.square(x.astype(np.float64)), axis=axis, keepdims=keep_dims)


def _check_parity(shape, axis, keep_dims, dtype):
    x = _input(shape, dtype)
    safe = SafeNorm(axis=axis, keep_dims=keep_dims)(Tensor(x)).asnumpy()
    plain = nn.Norm(axis=axis, keep_dims=keep_dims)(Tensor(x)).asnumpy()
    where = f"shape={shape} axis={axis} keep_dims={keep_dims} dtype={dtype.__name__}"
    assert safe.shape == plain.shape, (where, safe.shape, plain.shape)
    assert safe.dtype == plain.dtype == dtype, (where, safe.dtype, plain.dtype)
    s = _sum_squares(x, axis, keep_dims).reshape(safe.shape)
    exact = EPS / (np.sqrt(s + EPS) + np.sqrt(s))             # the documented difference
    diff = safe.astype(np.float64) - plain.astype(np.float64)  # the measured one
    allowance = TOL[dtype] * np.maximum(np.sqrt(s), 1e-3)
    assert np.all(np.abs(diff - exact) <= allowance), (where, diff, exact)
    # the README's bounds, on what SafeNorm computed: 0 <= diff <= sqrt(eps), and <= eps / (2 sqrt(s)) for s > 0
    assert np.all(diff >= -allowance), (where, diff)
    assert np.all(diff <= math.sqrt(EPS) + allowance), (where, diff)
    positive = s > 0
    assert np.all(diff[positive] <= EPS / (2 * np.sqrt(s[positive])) + allowance[positive]), (where, diff)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_parity_with_nn_norm_within_the_bound_pynative(dtype):
    previous = ms.get_context("mode")
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    try:
        for shape, axes in SHAPES_AXES:
            for axis in axes:
                for keep_dims in (False, True):
                    _check_parity(shape, axis, keep_dims, dtype)
    finally:
        ms.set_context(mode=previous)


@pytest.mark.parametrize("shape, axis, keep_dims, dtype", [
    ((3, 4), (), False, np.float32), ((2, 3, 4), -1, True, np.float16), ((2, 3, 4), (0, 2), False, np.float32),
    ((3, 4), 0, True, np.float16),
])
def test_parity_with_nn_norm_graph(graph_mode, shape, axis, keep_dims, dtype):
    _check_parity(shape, axis, keep_dims, dtype)


def test_zero_input_is_exactly_sqrt_eps_and_bound_attained(ms_mode):
    out = SafeNorm(axis=-1)(Tensor(np.zeros((2, 4), np.float32))).asnumpy()
    np.testing.assert_allclose(out, [math.sqrt(EPS)] * 2, rtol=1e-6)
    assert nn.Norm(axis=-1)(Tensor(np.zeros((2, 4), np.float32))).asnumpy().tolist() == [0.0, 0.0]


def test_functional_form_matches_the_cell_inside_a_compiled_construct(ms_mode):
    class UsesFunction(nn.Cell):
        def construct(self, x):
            return safe_norm(x, axis=(0, 2), keep_dims=True)

    x = Tensor(_input((2, 3, 4), np.float32))
    np.testing.assert_array_equal(UsesFunction()(x).asnumpy(), SafeNorm((0, 2), True)(x).asnumpy())
    np.testing.assert_array_equal(safe_norm(x, -1).asnumpy(), SafeNorm(-1)(x).asnumpy())


@pytest.mark.parametrize("dtype, rtol", [(np.float32, 1e-4), (np.float16, 2e-2)])
def test_gradients_match_nn_norm_away_from_zero(ms_mode, dtype, rtol):
    rng = np.random.RandomState(0)
    x = Tensor((rng.uniform(0.5, 1.5, (3, 4)) * rng.choice([-1, 1], (3, 4))).astype(dtype))
    for axis in (-1, (), (0, 1), 0):
        safe = ms.grad(SafeNorm(axis=axis))(x).asnumpy()
        plain = ms.grad(nn.Norm(axis=axis))(x).asnumpy()
        assert safe.dtype == dtype
        np.testing.assert_allclose(safe.astype(np.float64), plain.astype(np.float64), rtol=rtol, atol=rtol * 1e-2,
                                   err_msg=f"{ms_mode} axis={axis} {dtype.__name__}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_gradient_at_exact_zero_is_finite_where_nn_norm_is_nan(ms_mode, dtype):
    x = np.ones((3, 4), dtype)
    x[1] = 0.0                                             # one zero vector, like a padding embedding
    safe = ms.grad(SafeNorm(axis=-1))(Tensor(x)).asnumpy()
    plain = ms.grad(nn.Norm(axis=-1))(Tensor(x)).asnumpy()
    assert np.isfinite(safe).all(), (ms_mode, dtype.__name__, safe)
    assert safe[1].tolist() == [0.0] * 4, safe[1]
    assert np.isnan(plain[1]).all(), (ms_mode, dtype.__name__, "nn.Norm's gradient at 0 was expected NaN", plain)
    # eps below fp16's range still works: the sum and eps are in float32
    tiny = ms.grad(SafeNorm(axis=-1, epsilon=1e-8))(Tensor(x)).asnumpy()
    assert np.isfinite(tiny).all(), tiny
    assert np.float16(1e-8) == 0  # ... where an fp16 computation would have lost it


class _Losses(Callback):
    def __init__(self):
        super().__init__()
        self.values = []

    def on_train_step_end(self, run_context):
        self.values.append(float(run_context.original_args().get("net_outputs").asnumpy()))


def _train_demo(fix):
    mindguard.fix_randomness(1, deterministic=False)
    net = norm_nan.build_network(SafeNorm if fix == "norm_cls" else None)
    optimizer = nn.SGD(net.trainable_params(), learning_rate=0.05)
    replaced = make_safe(net) if fix == "make_safe" else None    # after the optimizer: Norm owns no params
    losses = _Losses()
    Model(net, nn.MSELoss(), optimizer).train(3, norm_nan.make_dataset(8), callbacks=[losses],
                                              dataset_sink_mode=False)
    finite_params = all(np.isfinite(p.asnumpy()).all() for p in net.trainable_params())
    return losses.values, finite_params, replaced


def test_demo_training_stays_finite_with_make_safe_and_norm_cls(graph_mode, monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", os.environ.get("PYTHONHASHSEED", "0"))
    monkeypatch.setattr(_seed, "_FIXED_SEED", _seed._FIXED_SEED)   # don't leak the seed to other tests
    losses, finite, _ = _train_demo(None)
    assert len(losses) == 24 and not finite and not np.isfinite(losses).all(), ("nn.Norm should go NaN", losses)
    for fix in ("make_safe", "norm_cls"):
        losses, finite, replaced = _train_demo(fix)
        assert len(losses) == 24 and np.isfinite(losses).all() and finite, (fix, losses, finite)
        if fix == "make_safe":
            assert replaced == ["norm"], replaced


def test_make_safe_replaces_nested_norms_with_same_arguments(ms_mode):
    net = nn.SequentialCell([nn.Dense(4, 4), nn.Norm(axis=(0, 1), keep_dims=True)])
    outer = nn.SequentialCell([net, nn.Norm()])
    x = Tensor(_input((3, 4), np.float32))
    assert make_safe(outer) == ["0.1", "1"]
    inner = outer[0][1]
    assert isinstance(inner, SafeNorm) and (inner.axis, inner.keep_dims, inner.epsilon) == ((0, 1), True, EPS)
    assert isinstance(outer[1], SafeNorm) and outer[1].axis == ()
    assert np.isfinite(outer(x).asnumpy()).all()
    assert make_safe(outer) == []                                  # nothing left to replace
    assert "axis=(0, 1), keep_dims=True, epsilon=1e-06" in repr(inner)


def test_make_safe_refuses_after_graph_compile(graph_mode):
    net = norm_nan.build_network()
    net(Tensor(np.ones((4, 3), np.int32)))
    with pytest.raises(CellSurgeryError, match=r"cannot replace \['norm'\].*already compiled"):
        make_safe(net)
    assert isinstance(net.norm, nn.Norm)


@pytest.mark.parametrize("kwargs, error, message", [
    ({"epsilon": 0}, ValueError, "must be positive and finite"),
    ({"epsilon": -1e-6}, ValueError, "must be positive and finite"),
    ({"epsilon": float("nan")}, ValueError, "must be positive and finite"),
    ({"epsilon": float("inf")}, ValueError, "must be positive and finite"),
    ({"epsilon": 1e-50}, ValueError, "not representable in float32"),
    ({"epsilon": "1e-6"}, TypeError, "must be a positive finite float"),
    ({"epsilon": True}, TypeError, "must be a positive finite float"),
    ({"axis": 1.5}, TypeError, "axis must be an int or a tuple of ints"),
    ({"axis": "0"}, TypeError, "axis must be an int or a tuple of ints"),
    ({"axis": (0, True)}, TypeError, "axis must be an int or a tuple of ints"),
    ({"axis": (1, 1)}, ValueError, "duplicates"),
    ({"keep_dims": 1}, TypeError, "keep_dims must be True or False"),
])
def test_bad_arguments_are_refused_with_the_rule(kwargs, error, message):
    with pytest.raises(error, match=message):
        SafeNorm(**kwargs)
    with pytest.raises(error, match=message):
        safe_norm(Tensor(np.ones(3, np.float32)), **kwargs)


def test_bad_arguments_to_make_safe_and_inside_graph(graph_mode):
    with pytest.raises(TypeError, match="needs a mindspore.nn.Cell, got list"):
        make_safe([nn.Norm()])
    with pytest.raises(ValueError, match="make_safe.*must be positive"):
        make_safe(nn.SequentialCell([nn.Norm()]), epsilon=0.0)

    class BadEps(nn.Cell):
        def construct(self, x):
            return safe_norm(x, axis=-1, epsilon=-1.0)

    with pytest.raises(ValueError, match="must be positive and finite"):
        BadEps()(Tensor(np.ones((2, 3), np.float32)))
