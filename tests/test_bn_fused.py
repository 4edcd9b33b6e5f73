"""Batch-normalised layers keep x only: their backward recomputes x_norm and the activation's
input (batchnorm_activation_backward) instead of reading arrays the forward stored.

The stored path is what the layers ran before: batchnorm_apply writing x_norm, the
activation's input copied out before the activation, delta times the activation's gradient,
then bias_scale_updates over the stored x_norm. The fused op must give the same bits on the
same backend (float32), on NumPy here and on CUDA in the gpu tests. A recurrent layer's inner
layers (Layer.stepped) still keep both arrays, so a network whose layers are all marked
stepped trains by the stored path: network against network, the same bits too.
"""

import numpy as np
import pytest
from test_cuda_ops import check, rand, reduction_tol

from darknet_py import activations
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.layers import base
from darknet_py.network import Network

gpu = pytest.mark.gpu
FORK_EPS = 1e-5
# eps (None: Darknet's sqrt(var) + 1e-6; else the fork's sqrt(var + eps)) and whether the
# biases (BN beta) get a gradient (not in the fork's CPU build), per flavour.
FLAVOURS = {
    "original": (None, True),
    "alexeyab": (FORK_EPS, True),
    "alexeyab-cpu": (FORK_EPS, False),
}
ACTIVATIONS = ("linear", "leaky", "logistic", "relu6", "mish", "swish", "gelu", "hard_mish")
SHAPES = [(2, 3, 169), (3, 255, 13), (5, 7, 1), (1, 4, 4099)]  # batch, filters, spatial


def bn_case(rng, batch, filters, spatial):
    """x, mean, variance, scales, biases, delta, bias_updates, scale_updates (host float32)."""
    total = batch * filters * spatial
    return (
        rand(rng, total, -2.0, 3.0),
        rand(rng, filters, -0.5, 0.5),
        rand(rng, filters, 0.2, 2.0),
        rand(rng, filters, 0.5, 1.5),
        rand(rng, filters),
        rand(rng, total),
        rand(rng, filters),
        rand(rng, filters),
    )


def run_paths(be, case, shape, eps, activation, train_beta, before=lambda be: None):
    """{path: {array: host copy}} for the stored path and the fused one on backend `be`;
    before(be) runs before each."""
    x, mean, variance, scales, biases, delta, bias_updates, scale_updates = case
    batch, filters, spatial = shape
    results = {}
    for path in ("stored", "fused"):
        before(be)
        a = {
            name: be.from_host(v)
            for name, v in (
                ("output", x),
                ("mean", mean),
                ("variance", variance),
                ("scales", scales),
                ("biases", biases),
                ("delta", delta),
                ("bias_updates", bias_updates),
                ("scale_updates", scale_updates),
            )
        }
        kept_x = be.zeros(x.size)
        be.copy(a["output"], kept_x)
        from_input = activation in activations.INPUT_GRADIENT
        stats = (a["mean"], a["variance"], a["scales"], a["biases"], batch, filters, spatial, eps)
        beta = a["bias_updates"] if train_beta else None
        if path == "stored":
            x_norm, activation_input = be.zeros(x.size), be.zeros(x.size)
            be.batchnorm_apply(a["output"], *stats, "linear" if from_input else activation, x_norm)
            if from_input:
                be.copy(a["output"], activation_input)
                be.activate(a["output"], activation)
                be.gradient_from_input(activation_input, activation, a["delta"])
            else:
                be.gradient(a["output"], activation, a["delta"])
            be.bias_scale_updates(
                a["delta"], x_norm, batch, filters, spatial, beta, a["scale_updates"]
            )
            a["x_norm"] = x_norm
        else:
            be.batchnorm_apply(a["output"], *stats, activation, None)
            be.batchnorm_activation_backward(
                kept_x,
                *stats[:4],
                a["output"],
                *stats[4:],
                activation,
                a["delta"],
                beta,
                a["scale_updates"],
            )
        results[path] = {name: be.to_host(arr) for name, arr in a.items()}
    return results


def assert_fused_is_stored(results):
    stored, fused = results["stored"], results["fused"]
    for name in ("output", "delta", "bias_updates", "scale_updates"):
        assert np.isfinite(stored[name]).all(), name
        np.testing.assert_array_equal(fused[name], stored[name], err_msg=name)


def x_norm_case(rng, filters, spatial=1):
    """One image, one position per channel, delta 1 and no scale update yet: the fused op's
    scale update for channel f is then x_norm[f] itself, the recomputed value exposed."""
    case = list(bn_case(rng, 1, filters, spatial))
    case[5] = np.ones(filters * spatial, np.float32)
    case[7] = np.zeros(filters, np.float32)
    return case


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_fused_backward_is_the_stored_path_bit_for_bit_numpy(flavour, activation):
    eps, train_beta = FLAVOURS[flavour]
    rng = np.random.default_rng(len(flavour) * 31 + len(activation))
    for shape in SHAPES[:3]:
        results = run_paths(
            NumpyBackend(), bn_case(rng, *shape), shape, eps, activation, train_beta
        )
        assert_fused_is_stored(results)
        if not train_beta:
            np.testing.assert_array_equal(
                results["fused"]["bias_updates"], results["stored"]["bias_updates"]
            )


@pytest.mark.parametrize("eps", [None, FORK_EPS])
def test_recomputed_x_norm_is_the_stored_one_bit_for_bit_numpy(eps):
    rng = np.random.default_rng(7)
    results = run_paths(NumpyBackend(), x_norm_case(rng, 4099), (1, 4099, 1), eps, "linear", True)
    np.testing.assert_array_equal(results["fused"]["scale_updates"], results["stored"]["x_norm"])


def test_fused_backward_refuses_activations_that_mix_channels():
    be = NumpyBackend()
    case = [be.from_host(a) for a in bn_case(np.random.default_rng(0), 1, 3, 4)]
    x, mean, variance, scales, biases, delta, bias_updates, scale_updates = case
    with pytest.raises(ValueError, match="mixes channels"):
        be.batchnorm_activation_backward(
            x,
            mean,
            variance,
            scales,
            biases,
            x,
            1,
            3,
            4,
            None,
            "normalize_channels",
            delta,
            bias_updates,
            scale_updates,
        )


# ---- whole networks: every BN layer kind, fused against stored --------------------------
NET_CFG = """[net]
batch=4
subdivisions=1
width=8
height=8
channels=3
learning_rate=0.1
momentum=0.9
decay=0.0005
max_batches=10

[convolutional]
batch_normalize=1
filters=5
size=3
stride=1
pad=1
activation=mish

[convolutional]
batch_normalize=1
filters=3
size=3
stride=1
pad=1
activation=leaky

[batchnorm]

[deconvolutional]
batch_normalize=1
filters=4
size=2
stride=2
activation=swish

[convolutional]
batch_normalize=1
filters=6
size=3
stride=2
pad=1
activation=normalize_channels

[convolutional]
batch_normalize=1
filters=3
size=1
stride=2
activation=hard_mish

[connected]
batch_normalize=1
output=7
activation=gelu

[connected]
batch_normalize=1
output=3
activation=linear

[softmax]
"""


def train_network(be, flavour, stepped, steps=2):
    """Every array of every layer after `steps` training passes; stepped: every layer keeps
    x_norm and its activation's input (the stored path)."""
    with pytest.MonkeyPatch.context() as patch:
        if stepped:
            patch.setattr(base.Layer, "stepped", True)
        net = Network(parse_cfg_text(NET_CFG), backend=be, seed=5, darknet=flavour)
        rng = np.random.default_rng(11)
        for _ in range(steps):
            x = rng.random((net.images_per_pass,) + net.input_shape, dtype=np.float32)
            truth = np.eye(3, dtype=np.float32)[rng.integers(0, 3, net.images_per_pass)]
            net.train_pass(x, truth)
        kept = [
            (l.type, l.x_norm is not None, l.activation_input is not None)
            for l in net.layers
            if hasattr(l, "x_norm")
        ]
        arrays = {}
        for i, layer in enumerate(net.layers):
            for name in (
                "output",
                "delta",
                "weights",
                "biases",
                "scales",
                "rolling_mean",
                "rolling_variance",
                "weight_updates",
                "bias_updates",
                "scale_updates",
            ):
                if getattr(layer, name, None) is not None:
                    arrays[f"layer {i} {name}"] = be.to_host(getattr(layer, name))
    return arrays, kept


def assert_networks_agree(be_stored, be_fused, flavour):
    stored, kept_stored = train_network(be_stored, flavour, stepped=True)
    fused, kept_fused = train_network(be_fused, flavour, stepped=False)
    assert all(x_norm and act for _, x_norm, act in kept_stored[:1])
    # Fused: no BN layer keeps x_norm; only the normalize_channels one keeps its input.
    assert [(t, x, a) for t, x, a in kept_fused] == [
        ("convolutional", False, False),
        ("convolutional", False, False),
        ("batchnorm", False, False),
        ("deconvolutional", False, False),
        ("convolutional", False, True),
        ("convolutional", False, False),
        ("connected", False, False),
        ("connected", False, False),
    ]
    assert stored.keys() == fused.keys()
    for name in stored:
        assert np.isfinite(stored[name]).all(), name  # NaN would equal NaN
        np.testing.assert_array_equal(fused[name], stored[name], err_msg=name)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_networks_train_the_same_bits_fused_or_stored_numpy(flavour):
    assert_networks_agree(NumpyBackend(), NumpyBackend(), flavour)


# =============================================================================
# GPU
# =============================================================================


def poison_channel_scratch(cuda):
    """NaN in every double of the channel reductions' partial sums (the backend's scratch
    buffer, grown to 8 MiB first): a partial sum a kernel fails to write shows."""
    import pycuda.driver as drv

    scratch = cuda._scratch_buffer("channels", 8 << 20)
    drv.memset_d32_async(cuda._ptr(scratch), 0x7FF80000, scratch.nbytes // 4, cuda.stream)


@gpu
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_backward_is_the_stored_path_bit_for_bit_cuda(cuda, flavour, activation, shape):
    eps, train_beta = FLAVOURS[flavour]
    rng = np.random.default_rng(sum(shape) + len(activation))
    assert_fused_is_stored(
        run_paths(
            cuda,
            bn_case(rng, *shape),
            shape,
            eps,
            activation,
            train_beta,
            before=poison_channel_scratch,
        )
    )


@gpu
@pytest.mark.parametrize("eps", [None, FORK_EPS])
def test_recomputed_x_norm_is_numpys_and_the_stored_one_bit_for_bit_cuda(cuda, eps):
    """x_norm rounds as NumPy's float32 normalize (IEEE sqrt and division, no contraction):
    with one term per channel the scale update is x_norm itself, on both."""
    rng = np.random.default_rng(3)
    shape = (1, 4099, 1)
    case = x_norm_case(rng, 4099)
    on_cuda = run_paths(cuda, case, shape, eps, "linear", True, before=poison_channel_scratch)
    on_numpy = run_paths(NumpyBackend(), case, shape, eps, "linear", True)
    assert_fused_is_stored(on_cuda)
    np.testing.assert_array_equal(on_cuda["stored"]["x_norm"], on_numpy["stored"]["x_norm"])
    np.testing.assert_array_equal(on_cuda["fused"]["scale_updates"], on_numpy["stored"]["x_norm"])


@gpu
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ["linear", "leaky", "relu6"])
def test_fused_backward_is_numpys_float32_bit_for_bit_cuda(cuda, flavour, activation):
    """One term per channel (the sums add nothing to zero) and a gradient that is exact in
    float32 (piecewise constant): the fused op gives NumPy float32's bits on CUDA."""
    eps, train_beta = FLAVOURS[flavour]
    rng = np.random.default_rng(len(flavour) + len(activation))
    shape = (1, 4099, 1)
    case = list(bn_case(rng, *shape))
    case[6], case[7] = np.zeros(4099, np.float32), np.zeros(4099, np.float32)
    on_cuda = run_paths(
        cuda, case, shape, eps, activation, train_beta, before=poison_channel_scratch
    )["fused"]
    on_numpy = run_paths(NumpyBackend(), case, shape, eps, activation, train_beta)["fused"]
    for name in ("delta", "bias_updates", "scale_updates"):
        np.testing.assert_array_equal(on_cuda[name], on_numpy[name], err_msg=name)


@gpu
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("shape", SHAPES)
def test_fused_backward_against_the_numpy_reference(cuda, flavour, activation, shape):
    """CUDA float32 against NumPy float64 on the same inputs; elements of delta past the
    layer's (NaN) must stay untouched and unread."""
    eps, train_beta = FLAVOURS[flavour]
    batch, filters, spatial = shape
    rng = np.random.default_rng(batch * filters + spatial)
    x, mean, variance, scales, biases, delta, bias_updates, scale_updates = bn_case(rng, *shape)
    output = rand(rng, x.size, -3.0, 3.0)
    tail = np.full(37, np.nan, np.float32)
    poison_channel_scratch(cuda)
    check(
        cuda,
        "batchnorm_activation_backward",
        x,
        mean,
        variance,
        scales,
        biases,
        output,
        batch,
        filters,
        spatial,
        eps,
        activation,
        np.concatenate([delta, tail]),
        bias_updates if train_beta else None,
        scale_updates,
        tol=reduction_tol(batch * spatial),
    )


@gpu
@pytest.mark.parametrize("flavour", FLAVOURS)
def test_networks_train_the_same_bits_fused_or_stored_cuda(cuda, flavour):
    assert_networks_agree(cuda, cuda, flavour)
