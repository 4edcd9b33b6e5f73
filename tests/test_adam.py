"""adam=1 as both Darknets' GPU builds train with it (darknet_py/adam.py): the update
against Darknet's formula worked by hand, which layers use it and what t is in each
flavour, small networks learning with it, and (gpu) the CUDA kernel against NumPy."""

import math

import numpy as np
import pytest

from darknet_py.adam import ADAM_LAYERS, Adam
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.network import Network
from darknet_py.weights import save_weights


def darknet_adam_by_hand(w, d, m, v, rate, t, b1, b2, eps, decay, batch):
    """adam_update_gpu (src/blas_kernels.cu of both Darknets) one element at a time, in
    Python floats: scal m by B1, v by B2; axpy -decay*batch*w into d; axpy (1-B1)*d into
    m; d *= d; axpy (1-B2)*d into v; adam_kernel; fill d with 0."""
    w, d, m, v = (list(map(float, a)) for a in (w, d, m, v))
    for i in range(len(w)):
        m[i] *= b1
        v[i] *= b2
        d[i] += -decay * batch * w[i]
        m[i] += (1 - b1) * d[i]
        d[i] *= d[i]
        v[i] += (1 - b2) * d[i]
        mhat = m[i] / (1 - b1**t)
        vhat = v[i] / (1 - b2**t)
        w[i] = w[i] + rate * mhat / (math.sqrt(vhat) + eps)
        d[i] = 0.0
    return [np.array(a) for a in (w, d, m, v)]


@pytest.mark.parametrize("dtype, rtol", [(np.float64, 1e-12), (np.float32, 2e-6)])
def test_numpy_adam_update_is_darknets_formula_over_three_steps(dtype, rtol):
    be = NumpyBackend(dtype)
    rng = np.random.default_rng(0)
    b1, b2, eps, decay, batch = 0.9, 0.999, 1e-7, 0.0005, 4
    w0 = rng.uniform(-1, 1, 7)
    w, m, v = be.from_host(w0), be.zeros(7), be.zeros(7)
    want = [w0, None, np.zeros(7), np.zeros(7)]
    for t, rate in ((1, 0.01), (2, 0.005), (3, 0.02)):
        grad = rng.uniform(-2, 2, 7) * 10.0 ** rng.integers(-3, 1, 7)
        d = be.from_host(grad)
        be.adam_update(
            w,
            d,
            m,
            v,
            be.from_host([rate, t]),
            b1,
            b2,
            eps,
            float(np.float32(decay) * batch) if dtype == np.float32 else decay * batch,
        )
        want = darknet_adam_by_hand(
            want[0], grad, want[2], want[3], rate, t, b1, b2, eps, decay, batch
        )
        np.testing.assert_allclose(w, want[0], rtol=rtol, atol=0)
        np.testing.assert_allclose(m, want[2], rtol=rtol * 10, atol=0)
        np.testing.assert_allclose(v, want[3], rtol=rtol * 10, atol=0)
        assert not d.any()  # the accumulated update starts again from zero


# ---- networks --------------------------------------------------------------------------------
NET = """[net]
batch=2
width=4
height=4
channels=2
learning_rate=0.01
momentum=0.9
decay=0
adam=1
{extra}
[convolutional]
filters=3
size=3
pad=1
activation=linear
[connected]
output=3
activation=linear
[cost]
"""


def network(darknet, extra="", seed=0):
    return Network(parse_cfg_text(NET.format(extra=extra)), darknet=darknet, seed=seed)


def data(seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.uniform(0, 1, (2, 2, 4, 4)).astype(np.float32),
        rng.uniform(-1, 1, (2, 3)).astype(np.float32),
    )


def params(net, i):
    return {name: net.be.to_host(a).copy() for name, a in net.layers[i].params()}


@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
def test_the_first_step_moves_every_adam_parameter_by_the_rate(darknet):
    """t=1: m/(1-B1) = d and sqrt(v/(1-B2)) = |d|, so each parameter moves by
    rate * d / (|d| + eps): the rate itself, whatever the gradient's size. pjreddie uses
    Adam in its convolutional and connected layers, the fork in its convolutional ones
    only (its connected layers keep SGD)."""
    net = network(darknet)
    x, truth = data()
    before = [params(net, 0), params(net, 1)]
    net.train_iteration(x, truth)
    assert net.adam.step.tolist() == [np.float32(0.01), 1.0]
    # rtol 1e-3: eps=1e-6 takes 2e-4 off a gradient of 0.005 (the fork's uniform start
    # gives such small ones)
    for name in ("weights", "biases"):
        moved = np.abs(params(net, 0)[name] - before[0][name])
        np.testing.assert_allclose(moved, 0.01, rtol=1e-3)
    moved = np.abs(params(net, 1)["weights"] - before[1]["weights"])
    if darknet == "original":
        np.testing.assert_allclose(moved, 0.01, rtol=1e-3)
    else:
        assert not np.allclose(moved, 0.01, rtol=1e-2)


def test_which_layers_each_darknet_updates_with_adam():
    assert ADAM_LAYERS["alexeyab"] == {"convolutional"}
    assert {"convolutional", "connected", "deconvolutional", "rnn", "gru", "lstm"} <= ADAM_LAYERS[
        "original"
    ]
    assert "local" not in ADAM_LAYERS["original"] | ADAM_LAYERS["alexeyab"]


def test_t_counts_this_process_updates_in_the_original_and_iterations_in_the_fork():
    x, truth = data()
    for darknet, want in (("original", [1, 2, 3]), ("alexeyab", [11, 12, 13])):
        net = network(darknet)
        net.seen = 10 * net.images_per_iteration  # as if resumed from weights at 10
        got = []
        for _ in range(3):
            net.train_iteration(x, truth)
            got.append(int(net.be.to_host(net.adam.step)[1]))
        assert got == want, darknet


@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
def test_a_tiny_network_learns_with_adam(darknet):
    net = network(darknet, extra="subdivisions=2")
    x, truth = data(1)
    losses = [net.train_iteration(x, truth) for _ in range(40)]
    assert net.adam.updates == 40
    assert losses[-1] < 0.2 * losses[0], losses[::8]


def test_adam_options_defaults_and_errors():
    assert network("original").options.adam_betas_eps == (0.9, 0.999, 1e-7)
    assert network("alexeyab").options.adam_betas_eps == (0.9, 0.999, 1e-6)
    net = network("original", extra="B1=.8\nB2=.99\neps=1e-8")
    assert net.options.adam_betas_eps == (0.8, 0.99, 1e-8)
    with pytest.raises(CfgError, match=r":10: B1: must be at least 0 and below 1, got 1"):
        network("original", extra="B1=1")
    with pytest.raises(CfgError, match="eps: must be above 0"):
        network("alexeyab", extra="eps=0")


def test_the_moments_are_not_saved_in_the_weights(tmp_path):
    """Darknet's .weights hold no Adam state: the same bytes count as without adam."""
    x, truth = data()
    adam = network("original")
    adam.train_iteration(x, truth)
    sgd = Network(parse_cfg_text(NET.format(extra="").replace("adam=1", "")), seed=0)
    sgd.train_iteration(x, truth)
    save_weights(adam, tmp_path / "adam.weights")
    save_weights(sgd, tmp_path / "sgd.weights")
    assert (tmp_path / "adam.weights").stat().st_size == (tmp_path / "sgd.weights").stat().st_size


def test_moments_are_kept_per_parameter():
    be = NumpyBackend()
    adam = Adam(be, "original", 0.9, 0.999, 1e-7)
    a, b = be.zeros(3), be.zeros(3)
    assert adam.moments(a)[0] is adam.moments(a)[0]
    assert adam.moments(a)[0] is not adam.moments(b)[0]


# ---- gpu -------------------------------------------------------------------------------------
@pytest.mark.gpu
def test_cuda_adam_update_matches_numpy_over_three_steps(cuda):
    """The op on views past a NaN-poisoned head (which it must leave alone), three steps
    whose rate and t are read from the step array when the kernel runs. The reference is
    NumPy in float32: B1, B2 and 1 - B are Darknet's floats (in float64, 1 - 0.999 differs
    from float32's by 1.3e-5 relative, which v shows)."""
    from test_cuda_ops import REF32, View, assert_close, run

    rng = np.random.default_rng(3)
    n, head = 10_000, 17
    state = {"w": rng.uniform(-1, 1, n), "m": np.zeros(n), "v": np.zeros(n)}
    state = {
        k: np.concatenate([np.full(head, np.nan), a]).astype(np.float32) for k, a in state.items()
    }
    for t, rate in ((1, 0.01), (2, 0.001), (3, 0.03)):
        grad = (rng.uniform(-2, 2, n) * 10.0 ** rng.integers(-4, 1, n)).astype(np.float32)
        d = np.concatenate([np.full(head, np.nan, np.float32), grad])
        args = (
            View(state["w"], head),
            View(d, head),
            View(state["m"], head),
            View(state["v"], head),
            np.float32([rate, t]),
            0.9,
            0.999,
            1e-7,
            0.002,
        )
        _, want = run(REF32, "adam_update", *args)
        _, got = run(cuda, "adam_update", *args)
        for name, g, w in zip(("w", "d", "m", "v", "step"), got, want):
            assert_close(g, w, 1e-5, f"adam_update {name} at t={t}")
            assert np.isnan(g[:head]).all() if name != "step" else True
        state = {
            "w": got[0].astype(np.float32),
            "m": got[2].astype(np.float32),
            "v": got[3].astype(np.float32),
        }


@pytest.mark.gpu
@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
def test_cuda_network_trains_with_adam_as_numpy(cuda, darknet):
    x, truth = data()
    cpu = network(darknet)
    gpu = Network(parse_cfg_text(NET.format(extra="")), darknet=darknet, seed=0, backend=cuda)
    for i in range(2):
        gpu.be.write(gpu.layers[i].weights, cpu.be.to_host(cpu.layers[i].weights))
        gpu.be.write(gpu.layers[i].biases, cpu.be.to_host(cpu.layers[i].biases))
    gpu.params_changed()
    for _ in range(3):
        want, got = cpu.train_iteration(x, truth), gpu.train_iteration(x, truth)
        assert got == pytest.approx(want, rel=1e-4)
    for i in range(2):
        for name, value in params(cpu, i).items():
            np.testing.assert_allclose(params(gpu, i)[name], value, rtol=1e-4, atol=1e-6)
