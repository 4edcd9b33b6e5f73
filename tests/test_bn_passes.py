"""Batch norm's element-wise passes cut (bench/NOTES.md E1/E2, issue 26).

E1a: batchnorm_apply writes the kept x (keep=, rounded as copy_rounded would) as it reads x,
so a training forward makes no copy pass; every precision, the same bits as copy_rounded
then batchnorm_apply.
E1b: tf32/fp16/bf16 layers take the batch's mean and variance from one read (mean_variance:
double sums of x and x^2) instead of mean's and variance's two; fp32 keeps Darknet's two
passes. Measured on NumPy (MEAN_STD_RATIOS, 3 seeds, per-channel std 0.01..100, 131 k and
1.38 M terms a channel): the one-pass variance is within 5.4e-8 relative of the exact
float64 one (about its float32 rounding), the float32 two-pass within 1.7e-7, the two apart
by at most 1.7e-7. VARIANCE_TOL asserts a few times that.
E2: layers that keep a 16-bit x (fp16/bf16) make batchnorm_delta's mean_delta and
variance_delta from the sums their activation pass already makes (delta_sum,
delta_x_norm_sum: batchnorm_delta_from_sums), not from a reduction pass; the same up to each
x_norm's rounding (E2_TOL; 1e-12 in float64). Whole networks: the fused passes against the
compositions they replace (unfused), fp32 bit for bit, else within PASSES_TOL.
E9b: the statistics of an x kept at 16 bits (mean_variance's x_precision) row by row
(channel_moments_rows), and the row kernels' many partials a channel added by a block a
channel (channel_finalize_wide, mean_variance_finalize_wide).
"""

import numpy as np
import pytest
from test_bn_fused import FLAVOURS, bn_case, poison_channel_scratch
from test_bn_half_x import NET_CFG, SPECIAL, bn_layers, kept_x, relative, train_passes, widened
from test_cuda_ops import REF, assert_close, check, nan, rand, reduction_tol

from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.network import Network

gpu = pytest.mark.gpu
STORAGE = ("fp32",) + precisions.HALF_STORAGE
# batch, filters, spatial: filters 3 and 255, spatial 1, 169, a yolov4 plane and an odd one.
ODD_SHAPES = [(2, 3, 169), (1, 255, 169), (5, 255, 1), (2, 3, 173056), (1, 3, 173057)]
EPS = (None, 1e-5)  # Darknet's divisor, the fork's
# The row kernels' shapes besides ODD_SHAPES (spatial 1 there, and 43 pieces a row): rows of
# 2 and 3 pieces, the latter 96 parts a channel (a block a channel adds them: 64 on).
ROWS_SHAPES = [(1, 4, 4099), (32, 5, 9000)]
MEAN_STD_RATIOS = (0, 1, 10, 100)
# mean_variance's variance against the exact one (float64 around the float mean) and against
# the float32 two passes (NumPy's; CUDA's sums are in double), relative per channel.
VARIANCE_TOL = {"exact": 1e-7, "two_pass": 5e-7}
# A network trained with the fused passes against the unfused ones (tf32/fp16/bf16, 2
# passes): the per-pass loss (relative) and each BN layer's parameters (relative to the
# array's largest). One pass moves them by float32 roundings (4e-7); the next carries each
# 16-bit (or tf32) operand whose rounding that flipped: measured at most 1.3e-5 and 3.3e-3
# (bf16, the BN biases, which start at 0), about the format's unit roundoff.
PASSES_TOL = {"loss": 1e-4, "params": 2e-2}
# batchnorm_delta_from_sums against batchnorm_delta, both float32 (NumPy), relative to each
# array's largest element: measured at most 7e-7 (variance_delta; each within 4.6e-7 of
# float64), bench/NOTES.md E2.
E2_TOL = 5e-6


# SPECIAL's rounding ties, fp16 overflows, subnormals and NaN; not the values whose
# normalised float32 result overflows where float64's does not.
KEEP_SPECIAL = SPECIAL[np.isnan(SPECIAL) | (np.abs(SPECIAL) < 1e7)]


def apply_case(rng, shape):
    """x (KEEP_SPECIAL among it), mean, variance, scales, biases (host float32)."""
    x, mean, variance, scales, biases = bn_case(rng, *shape)[:5]
    n = min(x.size, KEEP_SPECIAL.size)
    x[rng.choice(x.size, n, replace=False)] = KEEP_SPECIAL[:n]
    return x, mean, variance, scales, biases


def apply(be, case, shape, eps, activation, x_norm, keep, precision):
    """be.batchnorm_apply on `case` (keep=None or True: storage_zeros(precision), or a
    ready array); host copies of x, x_norm (or None) and the kept x (widened; or None)."""
    x, mean, variance, scales, biases = (be.from_host(a) for a in case)
    norm = be.zeros(x.size) if x_norm else None
    if keep is True:
        keep = be.storage_zeros(x.size, precision)
    be.batchnorm_apply(
        x,
        mean,
        variance,
        scales,
        biases,
        *shape,
        eps,
        activation,
        norm,
        keep=keep,
        keep_precision=precision,
    )
    kept = None
    if keep is not None:
        kept = (
            be.to_host(keep)
            if isinstance(be, NumpyBackend)
            else widened(be, keep, precision)
            if precision != "fp32"
            else be.to_host(keep)
        )
    return be.to_host(x), None if norm is None else be.to_host(norm), kept


def assert_same_bits(got, want, what):
    assert got.shape == want.shape, what
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {np.count_nonzero(~same)} elements differ"


@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("eps", EPS)
def test_apply_keeps_what_copy_rounded_keeps_numpy(precision, eps):
    """keep= is copy_rounded of the x read, and x and x_norm are what they are without it."""
    be, shape = NumpyBackend(), (2, 3, 7)
    case = apply_case(np.random.default_rng(1), shape)
    out, norm, kept = apply(be, case, shape, eps, "leaky", True, True, precision)
    want = be.storage_zeros(case[0].size, precision)
    be.copy_rounded(be.from_host(case[0]), want, precision)
    assert_same_bits(kept, be.to_host(want), "keep")
    plain_out, plain_norm, _ = apply(be, case, shape, eps, "leaky", True, None, precision)
    assert_same_bits(out, plain_out, "x")
    assert_same_bits(norm, plain_norm, "x_norm")
    if precision != "fp32":  # the rounding is there: keep is not x
        assert not np.array_equal(kept, case[0], equal_nan=True)


def rebuilt(be, kept, case, shape, eps, activation, precision):
    """be.batchnorm_rebuild from a kept x into a NaN-poisoned output; its host copy."""
    out = be.from_host(np.full(case[0].size, np.nan, np.float32))
    be.batchnorm_rebuild(
        kept, out, *(be.from_host(a) for a in case[1:]), *shape, eps, activation, precision
    )
    return be.to_host(out)


@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("eps", EPS)
def test_rebuild_makes_the_training_output_again_numpy(precision, eps):
    """The output made again from the kept x alone (output_plan's rebuilt outputs): fp32 the
    forward's bit for bit; fp16/bf16 the forward's of the kept (rounded) values."""
    be, shape = NumpyBackend(), (2, 3, 7)
    case = apply_case(np.random.default_rng(2), shape)
    rounded = (precisions.round_to(case[0], precisions.storage(precision)),) + case[1:]
    for activation in ("leaky", "mish", "logistic"):
        keep = be.storage_zeros(case[0].size, precision)
        out, _, _ = apply(be, case, shape, eps, activation, False, keep, precision)
        again = rebuilt(be, keep, case, shape, eps, activation, precision)
        want = (
            out
            if precision == "fp32"
            else apply(be, rounded, shape, eps, activation, False, None, precision)[0]
        )
        assert_same_bits(again, want, f"{activation}: rebuilt")


def moments_case(rng, shape, ratio):
    """x of each channel: mean ratio * std, std from 0.01 to 100 across the channels."""
    batch, filters, spatial = shape
    std = rng.uniform(0.01, 100.0, filters)[None, :, None]
    return (
        (std * (ratio + rng.standard_normal((batch, filters, spatial)))).astype(np.float32).ravel()
    )


def exact_variance(x, mean, shape):
    """Darknet's unbiased variance around the float mean, in float64."""
    batch, filters, spatial = shape
    d = x.reshape(shape).astype(np.float64) - np.asarray(mean, np.float64)[None, :, None]
    return (d * d).sum(axis=(0, 2)) / (batch * spatial - 1)


def statistics(be, x, shape, one_pass):
    """(mean, variance) host copies from mean_variance or from mean then variance."""
    filters = shape[1]
    mean, variance, x = be.zeros(filters), be.zeros(filters), be.from_host(x)
    if one_pass:
        be.mean_variance(x, *shape, mean, variance)
    else:
        be.mean(x, *shape, mean)
        be.variance(x, mean, *shape, variance)
    return be.to_host(mean), be.to_host(variance)


def per_channel_relative(got, want):
    return float(np.max(np.abs(np.asarray(got, np.float64) - want) / np.abs(want)))


@pytest.mark.parametrize("ratio", MEAN_STD_RATIOS)
def test_one_pass_statistics_against_exact_and_two_pass_numpy(ratio):
    be, shape = NumpyBackend(), (4, 8, 4099)
    x = moments_case(np.random.default_rng(ratio), shape, ratio)
    mean, variance = statistics(be, x, shape, True)
    two_mean, two_variance = statistics(be, x, shape, False)
    # The mean is the float64 sum's, rounded once to float32.
    np.testing.assert_array_equal(
        mean, (x.reshape(shape).astype(np.float64).sum(axis=(0, 2)) / (4 * 4099)).astype(np.float32)
    )
    assert per_channel_relative(variance, exact_variance(x, mean, shape)) < VARIANCE_TOL["exact"]
    assert per_channel_relative(variance, two_variance) < VARIANCE_TOL["two_pass"]
    # The two means a float32 ulp or two apart (NumPy's float32 mean rounds its sum).
    assert np.max(np.abs(mean - two_mean) / (np.abs(mean) + np.sqrt(variance))) < 2.5e-7


def test_one_pass_variance_of_a_constant_channel_is_not_negative_numpy():
    be, shape = NumpyBackend(), (3, 2, 1001)
    x = np.concatenate([np.full(1001, 0.1, np.float32), np.full(1001, -7.3, np.float32)] * 3)
    mean, variance = statistics(be, x, shape, True)
    np.testing.assert_array_equal(mean, np.float32([0.1, -7.3]))
    assert (variance >= 0).all() and (variance <= 1e-12).all()


def kept_statistics(be, kept, shape, precision, poison=lambda be: None):
    """(mean, variance) host copies from mean_variance of x kept at `precision`
    (storage_zeros' array), into NaN."""
    poison(be)
    mean, variance = be.from_host(nan(shape[1])), be.from_host(nan(shape[1]))
    be.mean_variance(kept, *shape, mean, variance, x_precision=precision)
    return be.to_host(mean), be.to_host(variance)


@pytest.mark.parametrize("precision", precisions.HALF_STORAGE)
def test_one_pass_statistics_of_a_16_bit_x_numpy(precision):
    """E9b: x kept at 16 bits holds rounded values here; its statistics are the fp32 call's
    on those values, bit for bit. An unknown x_precision is refused."""
    be, shape = NumpyBackend(), (4, 8, 4099)
    values = precisions.round_to(moments_case(np.random.default_rng(5), shape, 10), precision)
    kept = kept_x(be, values, precision)
    for got, want, what in zip(
        kept_statistics(be, kept, shape, precision),
        statistics(be, values, shape, True),
        ("mean", "variance"),
    ):
        assert_same_bits(got, want, what)
    with pytest.raises(precisions.PrecisionError):
        be.mean_variance(kept, *shape, be.zeros(8), be.zeros(8), x_precision="fp12")


# ---- E2: batchnorm_delta from the activation pass's sums --------------------------------
def delta_paths(be, case, shape, flavour, activation, precision, poison=lambda be: None):
    """{path: {array: host copy}} of batch norm's backward on `be` from x kept at
    `precision`: "reduction" (batchnorm_activation_backward, then batchnorm_delta) and
    "sums" (the same pass writing delta_sum and delta_x_norm_sum, NaN before, then
    batchnorm_delta_from_sums). The updates start at 0, so that they are the sums."""
    x, mean, variance, scales, biases, output, delta = case
    eps, train_beta = FLAVOURS[flavour]
    filters = shape[1]
    results = {}
    for path in ("reduction", "sums"):
        poison(be)
        a = {
            name: be.from_host(v)
            for name, v in (
                ("mean", mean),
                ("variance", variance),
                ("scales", scales),
                ("biases", biases),
                ("output", output),
                ("delta", delta),
                ("bias_updates", np.zeros(filters, np.float32)),
                ("scale_updates", np.zeros(filters, np.float32)),
                ("mean_delta", nan(filters)),
                ("variance_delta", nan(filters)),
                ("delta_sum", nan(filters)),
                ("delta_x_norm_sum", nan(filters)),
            )
        }
        kept = be.storage_zeros(x.size, precision)
        be.copy_rounded(be.from_host(x), kept, precision)
        stats = (a["mean"], a["variance"], a["scales"])
        sums = (a["delta_sum"], a["delta_x_norm_sum"]) if path == "sums" else (None, None)
        be.batchnorm_activation_backward(
            kept,
            *stats,
            a["biases"],
            a["output"],
            *shape,
            eps,
            activation,
            a["delta"],
            a["bias_updates"] if train_beta else None,
            a["scale_updates"],
            x_precision=precision,
            delta_sum=sums[0],
            delta_x_norm_sum=sums[1],
        )
        if path == "sums":
            be.batchnorm_delta_from_sums(
                kept,
                *stats,
                *shape,
                eps,
                *sums,
                a["mean_delta"],
                a["variance_delta"],
                a["delta"],
                fork=flavour == "alexeyab-cpu",
                x_precision=precision,
            )
        else:
            be.batchnorm_delta(
                kept,
                *stats,
                *shape,
                a["mean_delta"],
                a["variance_delta"],
                a["delta"],
                fork=flavour == "alexeyab-cpu",
                x_precision=precision,
            )
        results[path] = {name: np.asarray(be.to_host(arr), np.float64) for name, arr in a.items()}
    return results


def delta_case(rng, shape):
    """x, mean, variance, scales, biases, output, delta (host float32); mean and variance
    x's own, as a training pass has them."""
    x, _, _, scales, biases, delta = bn_case(rng, *shape)[:6]
    batch, filters, spatial = shape
    planes = x.reshape(shape).astype(np.float64)
    mean = planes.mean(axis=(0, 2)).astype(np.float32)
    variance = (planes.var(axis=(0, 2), ddof=1) + 0.01).astype(np.float32)
    return x, mean, variance, scales, biases, rand(rng, x.size, -3.0, 3.0), delta


BACKWARD_OUTPUTS = ("delta", "mean_delta", "variance_delta", "bias_updates", "scale_updates")


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ["leaky", "mish", "linear"])
def test_delta_from_sums_is_the_identity_numpy(flavour, activation):
    """In float64 the two paths differ only by float64 roundings (the identity holds: any
    wrong divisor would show at 1e-6); in float32 within E2_TOL, x kept at fp16 and bf16."""
    for shape in ((2, 3, 169), (3, 255, 13), (5, 7, 1)):
        case = delta_case(np.random.default_rng(sum(shape) + len(activation)), shape)
        for precision in precisions.HALF_STORAGE:
            for be, tol in ((REF, 1e-12), (NumpyBackend(), E2_TOL)):
                got = delta_paths(be, case, shape, flavour, activation, precision)
                sums, reduction = got["sums"], got["reduction"]
                for name in BACKWARD_OUTPUTS:
                    assert_close(sums[name], reduction[name], tol, f"{name} {precision}")
                # The sums are set, not added to: the updates started at 0.
                np.testing.assert_array_equal(sums["delta_x_norm_sum"], sums["scale_updates"])
                if FLAVOURS[flavour][1]:
                    np.testing.assert_array_equal(sums["delta_sum"], sums["bias_updates"])
                else:
                    assert np.isfinite(sums["delta_sum"]).all()


def test_activation_backward_takes_both_sums_or_neither():
    be = NumpyBackend()
    case = [be.from_host(a) for a in bn_case(np.random.default_rng(0), 1, 3, 4)]
    x, mean, variance, scales, biases, delta, bias_updates, scale_updates = case
    with pytest.raises(ValueError, match="both or neither"):
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
            "leaky",
            delta,
            bias_updates,
            scale_updates,
            delta_sum=be.zeros(3),
        )


# ---- whole networks: the fused passes against the compositions they replace ------------
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
PARAMS = ("weights", "scales", "biases", "rolling_mean", "rolling_variance")


def unfused(be, patch):
    """Patch the backend instance `be` so that the layers' fused batch-norm ops run as the
    compositions they replace (the passes before E1/E2); returns {op: calls} of the fused
    ops the layers asked for."""
    calls = {"keep": 0, "mean_variance": 0, "sums": 0, "from_sums": 0}
    apply, activation_backward = be.batchnorm_apply, be.batchnorm_activation_backward
    one_read, conv_forward = be.mean_variance, be.conv_forward

    def conv_forward_into_x(*args, out_precision="fp32"):
        # A 16-bit x written by the convolution itself (E9) is x kept, as keep= was.
        calls["keep"] += precisions.storage(out_precision) != precisions.DEFAULT
        conv_forward(*args, out_precision=out_precision)

    def batchnorm_apply(
        x,
        mean,
        variance,
        scales,
        biases,
        batch,
        filters,
        spatial,
        eps,
        activation,
        x_norm,
        keep=None,
        keep_precision="fp32",
    ):
        if keep is not None:
            calls["keep"] += 1
            be.copy_rounded(x, keep, keep_precision)
        apply(x, mean, variance, scales, biases, batch, filters, spatial, eps, activation, x_norm)

    def mean_variance(x, batch, filters, spatial, mean, variance, x_precision="fp32"):
        calls["mean_variance"] += 1
        if precisions.storage(x_precision) != precisions.DEFAULT:
            # A 16-bit x (E9b): no two passes read one (on CUDA); its one read stands.
            one_read(x, batch, filters, spatial, mean, variance, x_precision)
            return
        be.mean(x, batch, filters, spatial, mean)
        be.variance(x, mean, batch, filters, spatial, variance)

    def batchnorm_activation_backward(
        *args, x_precision="fp32", delta_sum=None, delta_x_norm_sum=None
    ):
        calls["sums"] += delta_sum is not None
        activation_backward(*args, x_precision=x_precision)

    def batchnorm_delta_from_sums(
        x,
        mean,
        variance,
        scales,
        batch,
        filters,
        spatial,
        eps,
        delta_sum,
        delta_x_norm_sum,
        mean_delta,
        variance_delta,
        delta,
        fork=False,
        x_precision="fp32",
    ):
        calls["from_sums"] += 1
        be.batchnorm_delta(
            x,
            mean,
            variance,
            scales,
            batch,
            filters,
            spatial,
            mean_delta,
            variance_delta,
            delta,
            fork,
            x_precision,
        )

    for op in (
        batchnorm_apply,
        mean_variance,
        batchnorm_activation_backward,
        batchnorm_delta_from_sums,
    ):
        patch.setattr(be, op.__name__, op)
    patch.setattr(be, "conv_forward", conv_forward_into_x)
    return calls


def train(be, precision, flavour, fused, iterations=2):
    """(per-pass costs, {(layer index, name): host copy of PARAMS}, calls or None) after
    `iterations` training passes of test_bn_half_x's network; fused False: through
    unfused(be)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv(precisions.ENV, raising=False)
        calls = None if fused else unfused(be, patch)
        net = Network(
            parse_cfg_text(NET_CFG), backend=be, seed=3, darknet=flavour, precision=precision
        )
        costs = train_passes(net, iterations)
        params = {
            (l.index, name): be.to_host(getattr(l, name)).copy()
            for l in bn_layers(net)
            for name in PARAMS
        }
    return costs, params, calls


def assert_fused_follows_unfused(be, precision, flavour):
    """fp32: the same bits (and no one-pass statistics); else within PASSES_TOL."""
    costs, params, _ = train(be, precision, flavour, True)
    want_costs, want_params, calls = train(be, precision, flavour, False)
    assert calls["keep"] > 0 and np.isfinite(want_costs).all()
    half = precision in precisions.HALF_STORAGE  # E2: a 16-bit x only
    assert calls["sums"] == calls["from_sums"] == (calls["keep"] if half else 0)
    if precision == "fp32":
        assert calls["mean_variance"] == 0
        np.testing.assert_array_equal(costs, want_costs)
        for key, want in want_params.items():
            np.testing.assert_array_equal(params[key], want, err_msg=str(key))
        return
    assert calls["mean_variance"] > 0
    assert relative(costs, want_costs) < PASSES_TOL["loss"]
    for key, want in want_params.items():
        assert relative(params[key], want) < PASSES_TOL["params"], key


@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_networks_train_as_before_numpy(precision, flavour):
    assert_fused_follows_unfused(NumpyBackend(), precision, flavour)


# =============================================================================
# GPU
# =============================================================================


def poisoned_storage(cuda, n, precision):
    """storage_zeros(n, precision) filled with NaN (each format's quiet NaN)."""
    import pycuda.driver as drv

    a = cuda.storage_zeros(n, precision)
    if precision == "fp32":
        drv.memset_d32_async(cuda._ptr(a), 0x7FC00000, n, cuda.stream)
    else:
        drv.memset_d16_async(
            cuda._ptr(a), 0x7E00 if precision == "fp16" else 0x7FC0, n, cuda.stream
        )
    return a


@gpu
@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("eps", EPS)
def test_apply_keeps_copy_rounded_bits_cuda(cuda, precision, shape, eps):
    """The kept x (into NaN-poisoned storage) is copy_rounded's, on CUDA and NumPy, bit for
    bit; x and x_norm are the kernel's own without keep, bit for bit, and NumPy float64's
    within test_batchnorm_apply's 1e-5."""
    rng = np.random.default_rng(sum(shape) + len(precision))
    case = apply_case(rng, shape)
    total = case[0].size
    for activation, x_norm in (("leaky", True), ("mish", False)):
        out, norm, kept = apply(
            cuda,
            case,
            shape,
            eps,
            activation,
            x_norm,
            poisoned_storage(cuda, total, precision),
            precision,
        )
        assert_same_bits(
            kept,
            precisions.round_to(case[0], precisions.storage(precision)),
            "keep against round_to",
        )
        copied = poisoned_storage(cuda, total, precision)
        cuda.copy_rounded(cuda.from_host(case[0]), copied, precision)
        assert_same_bits(
            kept,
            widened(cuda, copied, precision) if precision != "fp32" else cuda.to_host(copied),
            "keep against copy_rounded",
        )
        plain_out, plain_norm, _ = apply(
            cuda, case, shape, eps, activation, x_norm, None, precision
        )
        assert_same_bits(out, plain_out, "x")
        ref_out, ref_norm, _ = apply(REF, case, shape, eps, activation, x_norm, None, precision)
        assert_close(out.astype(np.float64), ref_out, 1e-5, "x against NumPy float64")
        if x_norm:
            assert_same_bits(norm, plain_norm, "x_norm")
            assert_close(norm.astype(np.float64), ref_norm, 1e-5, "x_norm against NumPy")


@gpu
@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("eps", EPS)
def test_rebuild_makes_the_training_output_again_cuda(cuda, precision, shape, eps):
    """batchnorm_rebuild from the kept x: fp32 the forward's output bit for bit; fp16/bf16
    the forward's of the kept values (batchnorm_apply on round_to(x)), bit for bit."""
    case = apply_case(np.random.default_rng(sum(shape) + 7), shape)
    rounded = (precisions.round_to(case[0], precisions.storage(precision)),) + case[1:]
    for activation in ("leaky", "mish"):
        keep = poisoned_storage(cuda, case[0].size, precision)
        out, _, _ = apply(cuda, case, shape, eps, activation, False, keep, precision)
        again = rebuilt(cuda, keep, case, shape, eps, activation, precision)
        want = (
            out
            if precision == "fp32"
            else apply(cuda, rounded, shape, eps, activation, False, None, precision)[0]
        )
        assert_same_bits(again, want, f"{activation}: rebuilt")
    with pytest.raises(TypeError):
        cuda.batchnorm_rebuild(
            keep,
            cuda.zeros(case[0].size),
            *(cuda.from_host(a) for a in case[1:]),
            *shape,
            eps,
            "leaky",
            "bf16" if precision == "fp16" else "fp16",
        )


@gpu
def test_apply_refuses_a_keep_of_another_precision_cuda(cuda):
    case = [cuda.from_host(a) for a in apply_case(np.random.default_rng(0), (1, 3, 4))]
    with pytest.raises(TypeError, match="bf16"):
        cuda.batchnorm_apply(
            *case,
            1,
            3,
            4,
            None,
            "leaky",
            None,
            keep=cuda.storage_zeros(12, "fp16"),
            keep_precision="bf16",
        )


@gpu
@pytest.mark.parametrize("ratio", MEAN_STD_RATIOS)
@pytest.mark.parametrize("shape", ODD_SHAPES + [(32, 3, 43264)])
def test_one_pass_statistics_cuda(cuda, shape, ratio):
    """mean_variance on CUDA: its mean is mean()'s bit for bit (the same double sum, in the
    same order); its variance within VARIANCE_TOL of the exact one and of CUDA's two passes;
    both against NumPy float64's one pass. Outputs poisoned with NaN."""
    x = moments_case(np.random.default_rng(shape[2] + ratio), shape, ratio)
    poison_channel_scratch(cuda)
    mean, variance = statistics(cuda, x, shape, True)
    two_mean, two_variance = statistics(cuda, x, shape, False)
    assert_same_bits(mean, two_mean, "mean")
    assert per_channel_relative(variance, exact_variance(x, mean, shape)) < VARIANCE_TOL["exact"]
    assert per_channel_relative(variance, two_variance) < VARIANCE_TOL["two_pass"]
    check(cuda, "mean_variance", x, *shape, nan(shape[1]), nan(shape[1]), tol=1e-6)


@gpu
def test_one_pass_variance_of_a_constant_channel_is_not_negative_cuda(cuda):
    shape = (3, 2, 1001)
    x = np.concatenate([np.full(1001, 0.1, np.float32), np.full(1001, -7.3, np.float32)] * 3)
    mean, variance = statistics(cuda, x, shape, True)
    np.testing.assert_array_equal(mean, np.float32([0.1, -7.3]))
    assert (variance >= 0).all() and (variance <= 1e-12).all()


# ---- E9b: the statistics of a 16-bit x, row by row; the row kernels' wide finalize -------
def within(got, want, tol):
    """|got - want| <= tol * |want| element by element, in float64 (0 only for 0)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return bool((np.abs(got - want) <= tol * np.abs(want)).all())


@gpu
@pytest.mark.parametrize("ratio", MEAN_STD_RATIOS)
@pytest.mark.parametrize("shape", ODD_SHAPES + ROWS_SHAPES)
@pytest.mark.parametrize("precision", precisions.HALF_STORAGE)
def test_one_pass_statistics_of_a_16_bit_x_cuda(cuda, precision, shape, ratio):
    """mean_variance of x kept at 16 bits (channel_moments_rows, then mean_variance_finalize
    or its _wide twin): against NumPy float64 on the widened values (as the fp32 one-pass
    test), the variance within VARIANCE_TOL of the exact one around its float mean and of
    the fp32 path's on the same values (the same double sums, added in another order), the
    mean within a float32 ulp or two of that path's; the same bits on a second run. Outputs
    and partial sums poisoned with NaN."""
    rng = np.random.default_rng(shape[2] + ratio)
    values = precisions.round_to(moments_case(rng, shape, ratio), precision)
    kept = kept_x(cuda, values, precision)
    mean, variance = kept_statistics(cuda, kept, shape, precision, poison_channel_scratch)
    again = kept_statistics(cuda, kept, shape, precision, poison_channel_scratch)
    assert_same_bits(mean, again[0], "mean, a second run")
    assert_same_bits(variance, again[1], "variance, a second run")
    want_mean, want_variance = statistics(REF, values, shape, True)
    assert_close(mean.astype(np.float64), want_mean, 1e-6, "mean against NumPy float64")
    assert_close(variance.astype(np.float64), want_variance, 1e-6, "variance against NumPy float64")
    assert within(variance, exact_variance(values, mean, shape), VARIANCE_TOL["exact"])
    fp32_mean, fp32_variance = statistics(cuda, values, shape, True)
    assert within(variance, fp32_variance, VARIANCE_TOL["exact"])
    spread = np.abs(fp32_mean.astype(np.float64)) + np.sqrt(fp32_variance)
    assert (np.abs(mean.astype(np.float64) - fp32_mean) <= 2.5e-7 * spread).all()


@gpu
@pytest.mark.parametrize("precision", precisions.HALF_STORAGE)
def test_one_pass_statistics_of_a_16_bit_x_constant_or_single_cuda(cuda, precision):
    """A constant channel: its value and a variance of exactly 0, through the thread a
    channel finalize (3 parts) and the wide one (64); one term a channel (n = 1): the value
    and NaN, as Darknet's unbiased variance (0 / 0)."""
    constants = precisions.round_to(np.float32([0.1, -7.3]), precision)
    for shape in ((3, 2, 1001), (32, 2, 4099)):
        batch, _, spatial = shape
        values = np.tile(np.repeat(constants, spatial), batch)
        mean, variance = kept_statistics(
            cuda, kept_x(cuda, values, precision), shape, precision, poison_channel_scratch
        )
        np.testing.assert_array_equal(mean, constants, err_msg=str(shape))
        np.testing.assert_array_equal(variance, np.zeros(2, np.float32), err_msg=str(shape))
    values = precisions.round_to(rand(np.random.default_rng(0), 3, -5.0, 5.0), precision)
    mean, variance = kept_statistics(
        cuda, kept_x(cuda, values, precision), (1, 3, 1), precision, poison_channel_scratch
    )
    np.testing.assert_array_equal(mean, values)
    assert np.isnan(variance).all()


@gpu
def test_one_pass_statistics_refuse_an_x_of_another_precision_cuda(cuda):
    mean, variance = cuda.zeros(3), cuda.zeros(3)
    for x, precision in (
        (cuda.storage_zeros(12, "fp16"), "bf16"),
        (cuda.storage_zeros(12, "bf16"), "fp16"),
        (cuda.zeros(12), "fp16"),
        (cuda.storage_zeros(12, "fp16"), "fp32"),
    ):
        with pytest.raises(TypeError, match=precision):
            cuda.mean_variance(x, 1, 3, 4, mean, variance, x_precision=precision)


FINALS = ("mean", "variance", "accumulate", "mean_delta", "variance_delta")  # ChannelFinal


def finalize_want(sums, final, count, variance, scales, start):
    """channel_finalize's op on the exact sums, in float64."""
    s = sums * (1.0 if scales is None else scales.astype(np.float64))
    v = variance.astype(np.float64) + 1e-5
    return {
        "mean": s / count,
        "variance": s / (count - 1),
        "accumulate": start + s,
        "mean_delta": s * (-1.0 / np.sqrt(v)),
        "variance_delta": s * -0.5 * v**-1.5,
    }[final]


@gpu
@pytest.mark.parametrize("parts", [1, 63, 64, 300, 1376])
def test_wide_finalize_against_a_thread_a_channel_cuda(cuda, parts):
    """channel_finalize_wide (a block a channel) and channel_finalize (a thread a channel) on
    the same double partials, every ChannelFinal op with and without scales: both within
    float32 rounding of the op on the exact sums (math.fsum), sum_out the sum itself; the
    wide one the same bits on a second run. _finalize_launch takes the wide form for a row
    kernel's partials from _WIDE_FINALIZE_PARTS on, never for a channel-wise reduction's."""
    import math

    from darknet_py.backends.cuda_core import _BLOCK
    from darknet_py.ops.normalization.cuda import _WIDE_FINALIZE_PARTS

    assert cuda._finalize_launch("channel_finalize", 5, parts)[0] == (
        "channel_finalize_wide" if parts >= _WIDE_FINALIZE_PARTS else "channel_finalize"
    )
    assert cuda._finalize_launch("mean_variance_finalize", 5, 0)[0] == "mean_variance_finalize"
    rng = np.random.default_rng(parts)
    for filters in (3, 255):
        host = rng.standard_normal((filters, parts)) * 10.0 ** rng.uniform(-3, 3, (filters, 1))
        sums = np.array([math.fsum(row) for row in host])
        partial = cuda._new(host.size, np.float64)
        cuda._htod(partial, np.ascontiguousarray(host.ravel()))
        variance, scales = rand(rng, filters, 0.01, 2.0), rand(rng, filters, -2.0, 2.0)
        start, count = rand(rng, filters), parts * 37
        on_device = {"variance": cuda.from_host(variance), "scales": cuda.from_host(scales)}
        for op, final in enumerate(FINALS):
            for scaled in (None, scales):
                want = finalize_want(sums, final, count, variance, scaled, start)
                got = {}
                for name, grid in (
                    ("channel_finalize", (-(-filters // _BLOCK),)),
                    ("channel_finalize_wide", (filters,)),
                    ("channel_finalize_wide", (filters,)),
                ):
                    out, sum_out = cuda.from_host(start), cuda.from_host(nan(filters))
                    cuda._launch(
                        name,
                        grid,
                        (_BLOCK,),
                        partial.ptr,
                        parts,
                        filters,
                        op,
                        count,
                        on_device["variance"].ptr,
                        0 if scaled is None else on_device["scales"].ptr,
                        out.ptr,
                        sum_out.ptr,
                    )
                    what = f"{name} {final} {filters} channels, scaled {scaled is not None}"
                    out, sum_out = cuda.to_host(out), cuda.to_host(sum_out)
                    assert within(out, want, 1e-6), what
                    assert within(sum_out, sums, 1e-6), what
                    if name in got:
                        assert_same_bits(out, got[name][0], what + ", a second run")
                        assert_same_bits(sum_out, got[name][1], what + ", a second run")
                    got[name] = out, sum_out


@gpu
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("precision", PRECISIONS)
def test_networks_train_as_before_cuda(cuda, precision, flavour):
    assert_fused_follows_unfused(cuda, precision, flavour)


@gpu
@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("flavour", FLAVOURS)
@pytest.mark.parametrize("activation", ["leaky", "mish"])
@pytest.mark.parametrize("shape", ODD_SHAPES + ROWS_SHAPES)
def test_delta_from_sums_cuda(cuda, precision, flavour, activation, shape):
    """CUDA's sums path against NumPy float64's reduction path (reduction_tol, as the
    reduction path's own gpu tests) and against CUDA's reduction path; the parameters'
    updates are the same bits on both (the same partial sums, finalised alike), and the
    sums are those updates (set, not added: the NaN they held is gone)."""
    case = delta_case(np.random.default_rng(sum(shape) + len(flavour)), shape)
    tol = reduction_tol(shape[0] * shape[2])
    got = delta_paths(cuda, case, shape, flavour, activation, precision, poison_channel_scratch)
    want = delta_paths(REF, case, shape, flavour, activation, precision)["reduction"]
    sums, reduction = got["sums"], got["reduction"]
    for name in BACKWARD_OUTPUTS:
        assert_close(sums[name], want[name], tol, f"{name} against NumPy")
        assert_close(sums[name], reduction[name], tol, f"{name} against CUDA's reduction")
    for name in ("bias_updates", "scale_updates"):
        assert_same_bits(sums[name].astype(np.float32), reduction[name].astype(np.float32), name)
    assert_same_bits(
        sums["delta_x_norm_sum"].astype(np.float32),
        sums["scale_updates"].astype(np.float32),
        "delta_x_norm_sum",
    )
    if FLAVOURS[flavour][1]:
        assert_same_bits(
            sums["delta_sum"].astype(np.float32),
            sums["bias_updates"].astype(np.float32),
            "delta_sum",
        )
    assert np.isfinite(sums["delta_sum"]).all()


# ---- E7: channel reductions split to fill whole waves ----------------------------------
@gpu
def test_reduction_parts_fill_whole_waves(cuda):
    """yolov4's batch-32 layers on 132 SMs of 4 resident blocks (528): one wave of blocks
    where 17 parts of 64 channels (the split before E7) made 2.06 waves; every split within
    the bounds (>= 4096 terms a part, <= 1024 parts); the device's capacity a whole number
    of blocks an SM."""
    from darknet_py.ops.normalization.cuda import reduction_parts

    for filters, spatial, parts in (
        (64, 208 * 208, 8),
        (32, 208 * 208, 16),
        (128, 104 * 104, 4),
        (256, 52 * 52, 2),
        (512, 26 * 26, 1),
        (1024, 13 * 13, 1),
        (3, 169, 2),
    ):
        assert reduction_parts(filters, 32 * spatial, 528) == parts, (filters, spatial)
    for filters, count in ((1, 1), (7, 5000), (300, 86528), (65, 10**7), (2, 10**9)):
        p = reduction_parts(filters, count, 660)
        assert 1 <= p <= max(1, min(-(-count // 4096), 1024)), (filters, count, p)
    from darknet_py.ops.normalization.cuda import activation_rows_plan  # E8's pieces

    assert [activation_rows_plan(s) for s in (43264, 2704, 2048, 676, 169, 1)] == [
        (256, 4096),
        (256, 4096),
        (128, 2048),
        (64, 676),
        (32, 169),
        (32, 1),
    ]
    capacity = cuda._reduction_capacity()
    assert capacity % cuda.sm_count == 0 and 1 <= capacity // cuda.sm_count <= 8
