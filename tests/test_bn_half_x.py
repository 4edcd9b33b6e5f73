"""A batch-normalised layer's x kept at 16 bits under fp16/bf16 (precision.HALF_STORAGE).

A convolution's training forward writes its product into x rounded to nearest even
(conv_forward's out_precision; a [batchnorm] layer's copy_rounded), batch norm takes its
statistics from x and makes the output from it (bench/NOTES.md E9: as cuDNN's batch norm
reads an fp16 convolution's output), and the backward reads it widened to fp32. On NumPy x
holds float values rounded with precision.round_to: the emulation the CUDA kernels (16-bit
storage) are tested against. fp32 and tf32 keep an fp32 x (the fixture tests hold their
bits to the C code). Measured on CPU (NET_CFG, 4 training passes, `train`, the three
flavours), a 16-bit x against an fp32 x: the per-pass loss differs by at most 2.8e-5
relative under fp16 and 2.5e-4 under bf16; what the 4 updates added to each BN layer's
weights, scales and biases by at most 8.1e-2 and 1.8e-1 of its largest element, 8.0e-3 and
2.8e-2 on average over the arrays (the formats' unit roundoff, 2^-11 and 2^-8, through
statistics of 4 x 16 x 16 values a channel and the cancellations of batch norm's gradient:
against a whole fp32 run the fp32-x path itself is 4.5e-2 and 8.6e-2 off at most); the
weights themselves by 2.8e-3 and 4.6e-2 of their largest.
"""

import numpy as np
import pytest
from test_bn_fused import FLAVOURS, SHAPES, bn_case, poison_channel_scratch
from test_cuda_ops import REF, assert_close, rand, reduction_tol

from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.layers import batchnorm
from darknet_py.network import Network

gpu = pytest.mark.gpu
HALF = precisions.HALF_STORAGE
# With a 16-bit x against an fp32 x after `train`'s passes: the loss (relative) and what
# the updates added to each parameter array (relative to its largest element); a few times
# what was measured (see above).
LOSS_TOL = {"fp16": 1e-4, "bf16": 1e-3}
UPDATE_TOL = {"fp16": 0.15, "bf16": 0.35}
MEAN_UPDATE_TOL = {"fp16": 0.02, "bf16": 0.06}
# The 16-bit kernels' fast forms (activations.cuh: BatchnormChannel<false>) against the
# exact fp32 steps on the same values, relative to the array's largest element.
FAST_TOL = 1e-5
PARAMS = ("weights", "scales", "biases")

NET_CFG = """[net]
batch=4
subdivisions=1
width=16
height=16
channels=3
learning_rate=0.05
momentum=0.9
decay=0.0005
max_batches=10

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=12
size=3
stride=1
pad=1
activation=mish

[convolutional]
batch_normalize=1
filters=8
size=1
stride=1
activation=swish

[shortcut]
from=-3
activation=linear

[convolutional]
batch_normalize=1
filters=5
size=3
stride=2
pad=1
activation=logistic

[avgpool]

[softmax]
"""


def bn_layers(net):
    return [l for l in net.layers if getattr(l, "batch_normalize", 0)]


def train(precision, flavour, half_x, iterations=4):
    """(net, per-pass costs, {(layer index, name): the BN layers' PARAMS before training})
    after `iterations` training passes at `precision`; half_x False: every BN layer keeps an
    fp32 x (the layers' x_precision patched)."""
    with pytest.MonkeyPatch.context() as patch:
        if not half_x:
            patch.setattr(batchnorm, "x_precision", lambda layer: precisions.DEFAULT)
        net = Network(
            parse_cfg_text(NET_CFG),
            backend=NumpyBackend(),
            seed=3,
            darknet=flavour,
            precision=precision,
        )
        initial = {
            (l.index, name): net.be.to_host(getattr(l, name)).copy()
            for l in bn_layers(net)
            for name in PARAMS
        }
        costs = train_passes(net, iterations)
    return net, costs, initial


def train_passes(net, iterations):
    """The per-pass costs of `iterations` training passes of NET_CFG's network on random
    images and classes (the same each call)."""
    rng = np.random.default_rng(17)
    costs = []
    for _ in range(iterations):
        x = rng.random((net.images_per_pass,) + net.input_shape, dtype=np.float32)
        truth = np.eye(5, dtype=np.float32)[rng.integers(0, 5, net.images_per_pass)]
        costs.append(net.train_pass(x, truth))
    return np.array(costs, np.float64)


def relative(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("precision", HALF)
def test_half_x_training_follows_fp32_x_numpy(precision, flavour, monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    half, half_costs, initial = train(precision, flavour, True)
    full, full_costs, _ = train(precision, flavour, False)
    assert all(batchnorm.x_precision(l) == precision for l in bn_layers(half))
    assert np.isfinite(half_costs).all() and np.isfinite(full_costs).all()
    assert relative(half_costs, full_costs) < LOSS_TOL[precision]
    changed, updates = False, []
    for a, b in zip(bn_layers(half), bn_layers(full)):
        for name in PARAMS:
            got, want = half.be.to_host(getattr(a, name)), full.be.to_host(getattr(b, name))
            start = initial[a.index, name]
            if flavour == "alexeyab-cpu" and name == "biases":
                np.testing.assert_array_equal(got, start)  # no BN beta gradient
                continue
            updates.append(relative(got - start, want - start))
            assert updates[-1] < UPDATE_TOL[precision], (a.index, name)
            changed |= not np.array_equal(got, want)
    assert np.mean(updates) < MEAN_UPDATE_TOL[precision]
    assert changed  # the rounding reaches the weights: the two runs are not the same one


@pytest.mark.parametrize("precision", HALF)
def test_kept_x_is_the_rounded_input_of_the_normalisation_numpy(precision, monkeypatch):
    """x is the convolution's product rounded once: after one pass the first layer's x
    (the same images and weights in both runs) is exactly round_to of the fp32 x the same
    pass kept with the storage patched to fp32, and its output what batchnorm_rebuild
    makes of it (the statistics taken from x). Deeper layers see inputs normalised with
    those statistics, so theirs differ by more than the rounding."""
    monkeypatch.delenv(precisions.ENV, raising=False)
    half = train(precision, "original", True, iterations=1)[0]
    full = train(precision, "original", False, iterations=1)[0]
    a, b = bn_layers(half)[0], bn_layers(full)[0]
    fp32_x = full.be.to_host(b.x)
    got = half.be.to_host(a.x)
    np.testing.assert_array_equal(got, precisions.round_to(fp32_x, precision))
    assert not np.array_equal(got, fp32_x)
    be, spatial = half.be, a.out_h * a.out_w
    mean, variance = be.zeros(a.out_c), be.zeros(a.out_c)
    be.mean_variance(a.x, a.batch, a.out_c, spatial, mean, variance, x_precision=precision)
    np.testing.assert_array_equal(mean, a.mean)
    np.testing.assert_array_equal(variance, a.variance)


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fp32_and_tf32_keep_x_unrounded(precision, monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    net = Network(parse_cfg_text(NET_CFG), backend=NumpyBackend(), precision=precision)
    assert [batchnorm.x_precision(l) for l in bn_layers(net)] == ["fp32"] * 4
    be, src = NumpyBackend(), np.array([1.0 + 2.0**-20, 3.14159265], np.float32)
    dst = be.storage_zeros(2, precision)
    be.copy_rounded(be.from_host(src), dst, precision)
    np.testing.assert_array_equal(dst, src)


def test_stepped_layers_keep_an_fp32_x(monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    net = Network(parse_cfg_text(NET_CFG), backend=NumpyBackend(), precision="fp16")
    layer = bn_layers(net)[0]
    assert batchnorm.x_precision(layer) == "fp16"
    monkeypatch.setattr(layer, "stepped", True)
    assert batchnorm.x_precision(layer) == "fp32"


def test_memory_estimate_counts_x_at_two_bytes(monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    # Against tf32: a reduced precision like them (the same workspace), x kept in fp32.
    nets = {
        p: Network(parse_cfg_text(NET_CFG), backend=NumpyBackend(), precision=p)
        for p in ("tf32", "fp16", "bf16")
    }
    for net in nets.values():  # outputs at 16 bits: test_output_storage's
        net.half_outputs = False
    x_values = 32 * sum(l.outputs for l in bn_layers(nets["tf32"]))
    for p in HALF:
        assert nets["tf32"].memory_bytes(32, True) - nets[p].memory_bytes(32, True) == 2 * x_values
        assert nets[p].memory_bytes(32, False) == nets["tf32"].memory_bytes(32, False)


def test_storage_refuses_an_unknown_precision():
    with pytest.raises(precisions.PrecisionError, match="fp64"):
        NumpyBackend().storage_zeros(4, "fp64")


# =============================================================================
# GPU: the 16-bit kernels against the emulation
# =============================================================================

SPECIAL = np.array(
    [
        0.0,
        -0.0,
        1.0,
        1.0 + 2.0**-11,
        1.0 + 3 * 2.0**-11,  # fp16 ties
        1.0 + 2.0**-8,
        1.0 + 3 * 2.0**-8,  # bf16 ties
        65504.0,
        65520.0,
        1e6,
        -1e6,
        3e38,
        6e-8,
        3e-8,
        -1e-6,
        1e-40,
        np.inf,
        -np.inf,
        np.nan,
    ],
    np.float32,
)


def widened(cuda, x, precision):
    """A 16-bit x as the kernels read it: float32 values (to_host widens a 16-bit storage
    array, issue 26)."""
    assert x.dtype == (np.float16 if precision == "fp16" else np.uint16)
    host = cuda.to_host(x)
    assert host.dtype == np.float32
    return host


def kept_x(be, values, precision):
    x = be.storage_zeros(values.size, precision)
    be.copy_rounded(be.from_host(values), x, precision)
    return x


@gpu
@pytest.mark.parametrize("precision", HALF)
def test_copy_rounded_is_round_to_bit_for_bit_cuda(cuda, precision):
    rng = np.random.default_rng(5)
    values = np.concatenate(
        [SPECIAL, rand(rng, 100_003, -70.0, 70.0), rand(rng, 4099, -1e-4, 1e-4)]
    )
    x = kept_x(cuda, values, precision)
    assert x.nbytes == 2 * values.size
    got, want = widened(cuda, x, precision), precisions.round_to(values, precision)
    assert np.array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_array_equal(got[~np.isnan(want)], want[~np.isnan(want)])


@gpu
def test_half_x_ops_refuse_a_mismatched_array_cuda(cuda):
    x = kept_x(cuda, np.ones(12, np.float32), "fp16")
    stats = [cuda.from_host(np.ones(3, np.float32)) for _ in range(4)]
    delta = cuda.from_host(np.ones(12, np.float32))
    with pytest.raises(TypeError, match="bf16"):
        cuda.batchnorm_delta(
            x,
            stats[0],
            stats[1],
            stats[2],
            1,
            3,
            4,
            stats[3],
            cuda.zeros(3),
            delta,
            x_precision="bf16",
        )
    with pytest.raises(TypeError, match="fp32"):
        cuda.batchnorm_activation_backward(
            x, *stats, delta, 1, 3, 4, None, "leaky", delta, None, cuda.zeros(3)
        )


def run_half_x_op(be, op, precision, x, args, poison=lambda be: None):
    """be.<op> with x kept at `precision` (from float32 values x) and the other arguments
    host arrays (made backend arrays) or scalars; host copies of the arrays afterwards."""
    poison(be)
    arrays = [be.from_host(a) if isinstance(a, np.ndarray) else a for a in args]
    getattr(be, op)(kept_x(be, x, precision), *arrays, x_precision=precision)
    return [
        np.asarray(be.to_host(a), np.float64)
        for a, h in zip(arrays, args)
        if isinstance(h, np.ndarray)
    ]


def half_x_cases(rng, shape, eps, activation, train_beta):
    """(x, batchnorm_activation_backward's arguments after x, batchnorm_delta's)."""
    batch, filters, spatial = shape
    x, mean, variance, scales, biases, delta, bias_updates, scale_updates = bn_case(rng, *shape)
    tail = np.full(37, np.nan, np.float32)  # past the layer: never read nor written
    activation_args = [
        mean,
        variance,
        scales,
        biases,
        rand(rng, x.size, -3.0, 3.0),
        batch,
        filters,
        spatial,
        eps,
        activation,
        np.concatenate([delta, tail]),
        bias_updates if train_beta else None,
        scale_updates,
    ]
    delta_args = [
        mean,
        variance,
        scales,
        batch,
        filters,
        spatial,
        rand(rng, filters),
        rand(rng, filters),
        delta,
    ]
    return x, activation_args, delta_args


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ["leaky", "mish", "logistic"])
@pytest.mark.parametrize("shape", SHAPES)
def test_half_x_backward_against_the_emulation_cuda(cuda, precision, flavour, activation, shape):
    """CUDA with a 16-bit x against NumPy (float64) on the rounded values, at the fp32 x
    tests' tolerance (reduction_tol: 1e-5, 1e-4 past 1000 terms a channel); and against
    CUDA's fp32 kernels given the rounded values as an fp32 x: within FAST_TOL (widening is
    exact; the 16-bit kernels' fast forms differ from the exact steps by a few ulp)."""
    eps, train_beta = FLAVOURS[flavour]
    fork = flavour == "alexeyab-cpu"
    rng = np.random.default_rng(sum(shape) + len(activation) + len(precision))
    x, activation_args, delta_args = half_x_cases(rng, shape, eps, activation, train_beta)
    rounded = precisions.round_to(x, precision)
    # A 16-bit x's backward recomputes the output from x (issue 26); the fp32 x's reads it:
    # the output the fp32 steps rebuild from the rounded x, within a few ulp of the fast one.
    output = REF.zeros(x.size)
    REF.batchnorm_rebuild(
        REF.from_host(rounded), output, *activation_args[:4], *shape, eps, activation
    )
    activation_args[4] = np.asarray(output, np.float32)
    tol = reduction_tol(shape[0] * shape[2])
    for op, args in (
        ("batchnorm_activation_backward", activation_args),
        ("batchnorm_delta", delta_args + [fork]),
    ):
        got = run_half_x_op(cuda, op, precision, x, args, poison_channel_scratch)
        want = run_half_x_op(REF, op, precision, x, args)
        fp32 = run_half_x_op(cuda, op, "fp32", rounded, args, poison_channel_scratch)
        for i, (g, w, f) in enumerate(zip(got, want, fp32)):
            assert_close(g, w, tol, f"{op} {precision}: array argument {i}")
            assert_close(g, f, FAST_TOL, f"{op} {precision} vs fp32 x: array argument {i}")


@gpu
@pytest.mark.parametrize("precision", HALF)
def test_network_keeps_x_at_16_bits_cuda(cuda, precision, monkeypatch):
    """Each BN layer's x is a 16-bit array on CUDA, and one training pass leaves in it the
    bits the NumPy emulation's x holds, to the forward's tolerance."""
    monkeypatch.delenv(precisions.ENV, raising=False)
    rng = np.random.default_rng(2)
    x = rng.random((4, 3, 16, 16), dtype=np.float32)
    truth = np.eye(5, dtype=np.float32)[[0, 1, 2, 3]]
    kept = {}
    for be in (cuda, NumpyBackend()):
        net = Network(parse_cfg_text(NET_CFG), backend=be, seed=3, precision=precision)
        net.train_pass(x, truth)
        layers = bn_layers(net)
        if be is cuda:
            assert all(l.x.nbytes == 2 * l.x.size for l in layers)
            kept["cuda"] = [widened(cuda, l.x, precision) for l in layers]
        else:
            kept["numpy"] = [be.to_host(l.x) for l in layers]
    for i, (g, w) in enumerate(zip(kept["cuda"], kept["numpy"])):
        assert_close(g.astype(np.float64), w.astype(np.float64), 1e-2, f"layer x {i}")


def exact_activation(x, activation):
    """mish, swish, logistic and their derivatives in float64 (the fork's mish: softplus
    is x above 20)."""
    x = x.astype(np.float64)
    sig = 1.0 / (1.0 + np.exp(-x))
    if activation == "logistic":
        return sig, sig * (1.0 - sig)
    if activation == "swish":
        return x * sig, sig * (1.0 + x * (1.0 - sig))
    softplus = np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))
    t = np.tanh(softplus)
    return x * t, t + x * (1.0 - t * t) * sig


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("activation", ["mish", "swish", "logistic"])
def test_fast_activations_are_within_a_few_ulp_cuda(cuda, precision, activation):
    """The 16-bit kernels' fast activations (one __expf each) against float64, element by
    element over x in [-40, 40]: batchnorm_apply (the value) and
    batchnorm_activation_backward (the derivative, as delta = 1 times it) on a channel
    whose normalisation is the identity (mean 0, variance 1, eps 0, scale 1, bias 0)."""
    x = np.linspace(-40.0, 40.0, 80_001, dtype=np.float32)
    x = np.concatenate(
        [x, np.float32([-20.0, 20.0, np.nextafter(np.float32(20.0), 30), -1e-30, 0.0])]
    )
    one = lambda v: cuda.from_host(np.float32([v]))  # noqa: E731
    mean, variance, scales, biases = one(0.0), one(1.0), one(1.0), one(0.0)
    out = cuda.from_host(x)
    cuda.batchnorm_apply(
        out,
        mean,
        variance,
        scales,
        biases,
        1,
        1,
        x.size,
        0.0,
        activation,
        None,
        keep_precision=precision,
    )
    delta = cuda.from_host(np.ones_like(x))
    # The derivative from the input (mish, swish) or from the output (logistic), which a
    # 16-bit x's backward recomputes from x as batchnorm_rebuild does (out is not read).
    kept = kept_x(cuda, x, precision)
    cuda.batchnorm_activation_backward(
        kept,
        mean,
        variance,
        scales,
        biases,
        out,
        1,
        1,
        x.size,
        0.0,
        activation,
        delta,
        None,
        cuda.zeros(1),
        x_precision=precision,
    )
    _, derivative = exact_activation(precisions.round_to(x, precision), activation)
    got_value = cuda.to_host(out).astype(np.float64)
    want_value, _ = exact_activation(x, activation)
    # The value is computed from the fp32 x; the derivative from the kept (rounded) x.
    # Relative error, with an absolute floor where the derivative crosses zero (its
    # terms are of order 1) and where the values all but vanish (x below -25: __expf's
    # error grows with |x|, 2 + 1.17 |x| ulp).
    err = np.abs(got_value - want_value)
    assert np.all(err <= 4e-6 * np.abs(want_value) + 1e-12), (
        f"value: largest error {err.max():.3g} at x = {x[np.argmax(err)]}"
    )
    got = cuda.to_host(delta).astype(np.float64)
    if activation == "logistic":  # from the output the fast value of the kept x gives
        rebuilt = cuda.zeros(x.size)
        cuda.batchnorm_rebuild(
            kept,
            rebuilt,
            mean,
            variance,
            scales,
            biases,
            1,
            1,
            x.size,
            0.0,
            activation,
            x_precision=precision,
        )
        y = cuda.to_host(rebuilt)
        derivative = ((np.float32(1.0) - y) * y).astype(np.float64)  # gradient()'s floats
    err = np.abs(got - derivative)
    assert np.all(err <= 4e-6 * np.abs(derivative) + 5e-7), (
        f"derivative: largest error {err.max():.3g} at x = {x[np.argmax(err)]}"
    )
