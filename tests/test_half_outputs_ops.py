"""Issue 26 (M4): the ops that read and write a layer's output kept at 16 bits.

Under fp16/bf16 a layer's output may be storage_zeros(n, p)'s array: float16 (fp16) or
uint16 holding bf16's bits on CUDA, a float32 StoredArray of already-rounded values on
NumPy. The ops here pick their 16-bit kernels by storage_of their arrays, compute in fp32
and round once where they store; a 16-bit array mixes only with arrays of its own storage
(a ValueError/TypeError naming the op and the storages otherwise). batchnorm_activation_
backward with a 16-bit x no longer reads the output: it recomputes it from x as
batchnorm_rebuild does, the same fp32 bits.

CPU tests: the NumPy side (rounding on write, the errors). GPU tests (marked gpu): CUDA
against NumPy in float32 (REF32) on random shapes, exact where the arithmetic is exact
(copies, maxpool and its indexes, sums of two 16-bit values, scaling) and within one
16-bit step elsewhere.
"""

import numpy as np
import pytest

from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.ops.normalization.numpy import StoredArray

gpu = pytest.mark.gpu
HALF = ["fp16", "bf16"]
OTHER = {"fp16": "bf16", "bf16": "fp16"}
REF32 = NumpyBackend(np.float32)


def rand(rng, n, lo=-4.0, hi=4.0):
    x = rng.uniform(lo, hi, int(n)).astype(np.float32)
    x[x == 0] = np.float32(0.25)
    return x


def stored(be, values, precision):
    """storage_zeros(n, precision)'s array holding values rounded (copy_rounded)."""
    values = np.asarray(values, np.float32).reshape(-1)
    a = be.storage_zeros(values.size, precision)
    be.copy_rounded(be.from_host(values), a, precision)
    return a


def host(be, a):
    return np.asarray(be.to_host(a), np.float32)


def step(values, precision):
    """The spacing of `precision`'s values at each (rounded) value: one unit in the last
    place of the 16-bit format (fp16's subnormals: 2^-24)."""
    v = np.abs(np.asarray(values, np.float64))
    bits = 10 if precision == "fp16" else 7
    least = 2.0**-24 if precision == "fp16" else 2.0**-133
    e = np.floor(np.log2(np.where(v > 0, v, 1.0)))
    return np.maximum(2.0 ** (e - bits), least)


def assert_within_a_step(got, want, precision, what, slack=0.0):
    """Within a 16-bit step (plus `slack`: what fp32 arithmetic may differ by before the
    rounding where a result cancels its terms)."""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape, what
    assert np.array_equal(np.isnan(got), np.isnan(want)), what
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)]), what
    err = np.abs(got[fin] - want[fin])
    # a step of the larger of the two: a rounding that crosses a power of two takes the
    # step above it
    allowed = step(np.maximum(np.abs(got[fin]), np.abs(want[fin])), precision) + slack
    bad = np.flatnonzero(err > allowed)
    assert bad.size == 0, f"{what}: {bad.size} elements more than a 16-bit step apart"


def assert_same(got, want, what):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, what
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{what}: {bad.size} elements differ, first at {bad[:8].tolist()}"


def bn_stats(rng, filters):
    return (
        rand(rng, filters, -0.5, 0.5),
        rand(rng, filters, 0.2, 2.0),
        rand(rng, filters, 0.5, 1.5),
        rand(rng, filters, -0.5, 0.5),
    )


# =============================================================================
# CPU: the NumPy side
# =============================================================================


@pytest.mark.parametrize("precision", HALF)
def test_numpy_copy_keeps_one_storage(precision):
    be, rng = REF32, np.random.default_rng(1)
    values = rand(rng, 50)
    src = stored(be, values, precision)
    dst = be.storage_zeros(50, precision)
    be.copy(src, dst)
    assert be.storage_of(dst) == precision
    assert_same(dst, precisions.round_to(values, precision), "copy")
    with pytest.raises(ValueError, match=rf"copy: .*fp32.*{precision}"):
        be.copy(be.from_host(values), dst)
    with pytest.raises(ValueError, match=rf"copy: .*{precision}.*{OTHER[precision]}"):
        be.copy(src, be.storage_zeros(50, OTHER[precision]))
    with pytest.raises(ValueError, match=r"copy: .*fp32"):
        be.copy(src, be.zeros(50))
    plain = be.zeros(50)
    be.copy(be.from_host(values), plain)  # fp32: as before
    assert_same(plain, values, "fp32 copy")


@pytest.mark.parametrize("precision", HALF)
def test_numpy_fill_rounds_into_a_16_bit_array(precision):
    a = REF32.storage_zeros(7, precision)
    REF32.fill(a, 0.1)
    assert_same(a, precisions.round_to(np.full(7, 0.1, np.float32), precision), "fill")
    REF32.fill(a, 0)
    assert_same(a, np.zeros(7, np.float32), "fill 0")


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("accumulate", [False, True])
def test_numpy_copy_blocks_rounds_the_sum(precision, accumulate):
    be, rng = REF32, np.random.default_rng(2)
    s_values, d_values = rand(rng, 3 * 50 + 17), rand(rng, 3 * 71 + 40)
    src, dst = stored(be, s_values, precision), stored(be, d_values, precision)
    be.copy_blocks(src, 5, 50, dst, 9, 71, 31, 3, accumulate)
    s, want = precisions.round_to(s_values, precision), precisions.round_to(d_values, precision)
    for r in range(3):
        piece = s[5 + r * 50 : 5 + r * 50 + 31]
        at = slice(9 + r * 71, 9 + r * 71 + 31)
        want[at] = precisions.round_to(want[at] + piece, precision) if accumulate else piece
    assert_same(dst, want, "copy_blocks")
    assert be.storage_of(dst) == precision
    with pytest.raises(ValueError, match=rf"copy_blocks: .*{precision}.*{OTHER[precision]}"):
        be.copy_blocks(
            src, 0, 50, be.storage_zeros(300, OTHER[precision]), 0, 71, 31, 3, accumulate
        )
    with pytest.raises(ValueError, match=r"copy_blocks: .*fp32"):
        be.copy_blocks(be.zeros(300), 0, 50, dst, 0, 71, 31, 3, accumulate)


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize(
    "shapes", [((8, 6, 5), (8, 6, 5)), ((8, 6, 5), (4, 3, 7)), ((4, 3, 7), (8, 6, 5))]
)
def test_numpy_shortcut_rounds_once(precision, shapes):
    (w1, h1, c1), (w2, h2, c2) = shapes
    be, rng, batch = REF32, np.random.default_rng(3), 2
    a_values, o_values = rand(rng, batch * c1 * h1 * w1), rand(rng, batch * c2 * h2 * w2)
    add, out = stored(be, a_values, precision), stored(be, o_values, precision)
    plain = be.from_host(precisions.round_to(o_values, precision))
    be.shortcut(batch, w1, h1, c1, add, w2, h2, c2, 0.7, 1.3, out)
    be.shortcut(
        batch,
        w1,
        h1,
        c1,
        be.from_host(precisions.round_to(a_values, precision)),
        w2,
        h2,
        c2,
        0.7,
        1.3,
        plain,
    )  # the fp32 arithmetic on the same values
    assert_same(out, precisions.round_to(plain, precision), "shortcut")
    assert be.storage_of(out) == precision
    with pytest.raises(ValueError, match=rf"shortcut: .*{precision}.*fp32"):
        be.shortcut(batch, w1, h1, c1, add, w2, h2, c2, 1.0, 1.0, be.zeros(out.size))


@pytest.mark.parametrize("precision", HALF)
def test_numpy_upsample_forward_rounds_and_backward_refuses(precision):
    be, rng = REF32, np.random.default_rng(4)
    w, h, c, batch, stride = 5, 3, 4, 2, 2
    values = rand(rng, batch * c * h * w)
    x = stored(be, values, precision)
    for scale in (1.0, 0.3):
        out = be.storage_zeros(x.size * stride * stride, precision)
        plain = be.zeros(out.size)
        be.upsample(x, w, h, c, batch, stride, True, scale, out)
        be.upsample(
            be.from_host(precisions.round_to(values, precision)),
            w,
            h,
            c,
            batch,
            stride,
            True,
            scale,
            plain,
        )
        assert_same(out, precisions.round_to(plain, precision), f"upsample x{scale}")
    with pytest.raises(TypeError, match=rf"upsample \(backward\): .*{precision}"):
        be.upsample(x, w, h, c, batch, stride, False, 1.0, out)
    with pytest.raises(ValueError, match=rf"upsample: .*{precision}.*fp32"):
        be.upsample(x, w, h, c, batch, stride, True, 1.0, be.zeros(out.size))


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("train", [False, True])
def test_numpy_maxpool_copies_the_16_bit_maxima(precision, train):
    be, rng = REF32, np.random.default_rng(5)
    batch, c, h, w, size, stride, padding = 2, 3, 7, 6, 2, 2, 0
    values = rand(rng, batch * c * h * w)
    out_h, out_w = (h + padding - size) // stride + 1, (w + padding - size) // stride + 1
    n = batch * c * out_h * out_w
    out, want = be.storage_zeros(n, precision), be.zeros(n)
    idx, want_idx = (be.int_zeros(n), be.int_zeros(n)) if train else (None, None)
    be.maxpool_forward(
        stored(be, values, precision), batch, c, h, w, size, stride, padding, out, idx
    )
    be.maxpool_forward(
        be.from_host(precisions.round_to(values, precision)),
        batch,
        c,
        h,
        w,
        size,
        stride,
        padding,
        want,
        want_idx,
    )
    assert_same(out, want, "maxpool")
    if train:
        assert_same(idx, want_idx, "maxpool indexes")
    with pytest.raises(ValueError, match=rf"maxpool_forward: .*{precision}.*fp32"):
        be.maxpool_forward(
            stored(be, values, precision), batch, c, h, w, size, stride, padding, be.zeros(n), idx
        )


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("eps", [None, 1e-5])
def test_numpy_rebuild_into_a_16_bit_output_rounds_once(precision, eps):
    be, rng = REF32, np.random.default_rng(6)
    batch, filters, spatial = 2, 3, 10
    values = rand(rng, batch * filters * spatial)
    stats = [be.from_host(s) for s in bn_stats(rng, filters)]
    x = stored(be, values, precision)
    fp32, half = be.zeros(values.size), be.storage_zeros(values.size, precision)
    be.batchnorm_rebuild(x, fp32, *stats, batch, filters, spatial, eps, "leaky", precision)
    be.batchnorm_rebuild(x, half, *stats, batch, filters, spatial, eps, "leaky", precision)
    assert_same(half, precisions.round_to(fp32, precision), "rebuild")
    assert not np.array_equal(half, fp32)
    with pytest.raises(
        ValueError,
        match=rf"batchnorm_rebuild: .*{precision}.*"
        rf"{OTHER[precision]}",
    ):
        be.batchnorm_rebuild(
            x,
            be.storage_zeros(values.size, OTHER[precision]),
            *stats,
            batch,
            filters,
            spatial,
            eps,
            "leaky",
            precision,
        )


BACKWARD_ACTIVATIONS = ["leaky", "logistic", "relu", "tanh", "linear", "mish", "elu"]


def backward_results(
    be,
    x,
    stats,
    output,
    batch,
    filters,
    spatial,
    eps,
    activation,
    delta_values,
    precision,
    sums=False,
):
    """Host copies of delta, bias_updates, scale_updates (and the sums) after
    batchnorm_activation_backward."""
    delta = be.from_host(delta_values)
    bias_updates, scale_updates = be.zeros(filters), be.zeros(filters)
    extra = {}
    if sums:
        extra = {"delta_sum": be.zeros(filters), "delta_x_norm_sum": be.zeros(filters)}
    be.batchnorm_activation_backward(
        x,
        *stats,
        output,
        batch,
        filters,
        spatial,
        eps,
        activation,
        delta,
        bias_updates,
        scale_updates,
        x_precision=precision,
        **extra,
    )
    return [host(be, a) for a in (delta, bias_updates, scale_updates, *extra.values())]


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("activation", BACKWARD_ACTIVATIONS)
def test_numpy_half_x_backward_reads_no_output(precision, activation):
    """With a 16-bit x the results are the same whether output is the rebuilt fp32 output,
    None or NaN, and they are the fp32 path's given that rebuilt output (Darknet's way: the
    gradient from the output)."""
    be, rng = REF32, np.random.default_rng(7)
    batch, filters, spatial, eps = 2, 3, 16, None
    values = rand(rng, batch * filters * spatial)
    stats = [be.from_host(s) for s in bn_stats(rng, filters)]
    delta_values = rand(rng, values.size, -1.0, 1.0)
    x = stored(be, values, precision)
    rebuilt = be.zeros(values.size)
    be.batchnorm_rebuild(x, rebuilt, *stats, batch, filters, spatial, eps, activation, precision)
    args = (batch, filters, spatial, eps, activation, delta_values)
    want = backward_results(
        be, be.from_host(precisions.round_to(values, precision)), stats, rebuilt, *args, "fp32"
    )
    for output in (rebuilt, None, be.from_host(np.full(values.size, np.nan, np.float32))):
        got = backward_results(be, x, stats, output, *args, precision)
        for g, w, what in zip(got, want, ("delta", "bias_updates", "scale_updates")):
            assert_same(g, w, f"{activation} {what}")
    with_sums = backward_results(be, x, stats, None, *args, precision, sums=True)
    assert np.isfinite(with_sums[3]).all() and np.isfinite(with_sums[4]).all()


def test_numpy_stored_array_keeps_its_storage_through_views():
    a = REF32.storage_zeros(12, "bf16")
    assert isinstance(a, StoredArray)
    assert REF32.storage_of(a[3:9]) == "bf16"
    assert REF32.storage_of(a.reshape(3, 4)) == "bf16"
    assert REF32.storage_of(REF32.zeros(3)) == "fp32"


# =============================================================================
# GPU: CUDA against NumPy (float32)
# =============================================================================


def both(cuda, fn):
    """fn(be) on CUDA and on REF32."""
    return fn(cuda), fn(REF32)


@gpu
@pytest.mark.parametrize("precision", HALF)
def test_to_host_widens_and_fill_sets_16_bit_arrays_cuda(cuda, precision):
    rng = np.random.default_rng(10)
    values = np.concatenate(
        [
            rand(rng, 1000, -70000.0, 70000.0),
            rand(rng, 100, -1e-6, 1e-6),
            np.float32([0.0, -0.0, 1.0 + 2.0**-11, 1.0 + 2.0**-8, 65520.0, np.inf, -np.inf]),
        ]
    )
    a = stored(cuda, values, precision)
    got = cuda.to_host(a)
    assert got.dtype == np.float32
    assert_same(got, precisions.round_to(values, precision), "to_host")
    assert_same(cuda.to_host(a[5:17]), precisions.round_to(values[5:17], precision), "view")
    for value in (0.0, 0.1, -3.0):
        cuda.fill(a, value)
        REF32_a = REF32.storage_zeros(a.size, precision)
        REF32.fill(REF32_a, value)
        assert_same(cuda.to_host(a), REF32_a, f"fill {value}")


@gpu
@pytest.mark.parametrize("precision", HALF)
def test_copy_of_16_bit_arrays_cuda(cuda, precision):
    rng = np.random.default_rng(11)
    values = rand(rng, 4099)
    src, dst = stored(cuda, values, precision), cuda.storage_zeros(4099, precision)
    cuda.copy(src, dst)
    assert_same(cuda.to_host(dst), precisions.round_to(values, precision), "copy")
    with pytest.raises(ValueError, match=rf"copy: .*{precision}.*{OTHER[precision]}"):
        cuda.copy(src, cuda.storage_zeros(4099, OTHER[precision]))
    with pytest.raises(ValueError, match=rf"copy: .*fp32.*{precision}"):
        cuda.copy(cuda.from_host(values), dst)


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("accumulate", [False, True])
def test_copy_blocks_16_bit_cuda(cuda, precision, accumulate):
    rng = np.random.default_rng(12 + accumulate)
    cases = [  # (src size, dst size, args after the arrays)
        (3 * 50 + 17, 3 * 71 + 40, dict(so=5, ss=50, do=9, ds=71, width=31, rows=3)),
        (1000, 2000, dict(so=1, ss=3, do=0, ds=6, width=1, rows=333)),
        (
            7 * 5 * 13,
            5 * 11 * 13 + 9,
            dict(so=0, ss=5 * 13, do=3 * 13, ds=13, width=13, rows=7, planes=5, sp=13, dp=11 * 13),
        ),
        (4 * 1031, 4 * 2063, dict(so=3, ss=1031, do=0, ds=2063, width=1027, rows=4)),
    ]
    for n_src, n_dst, k in cases:
        s_values, d_values = rand(rng, n_src), rand(rng, n_dst)

        def run(be):
            src, dst = stored(be, s_values, precision), stored(be, d_values, precision)
            be.copy_blocks(
                src,
                k["so"],
                k["ss"],
                dst,
                k["do"],
                k["ds"],
                k["width"],
                k["rows"],
                accumulate,
                k.get("planes", 1),
                k.get("sp", 0),
                k.get("dp", 0),
            )
            return host(be, dst)

        got, want = both(cuda, run)
        assert_same(got, want, f"copy_blocks {k}")
    src = stored(cuda, rand(rng, 100), precision)
    with pytest.raises(ValueError, match=rf"copy_blocks: .*{precision}.*{OTHER[precision]}"):
        cuda.copy_blocks(
            src, 0, 10, cuda.storage_zeros(100, OTHER[precision]), 0, 10, 10, 10, accumulate
        )
    with pytest.raises(ValueError, match=rf"copy_blocks: .*{precision}.*fp32"):
        cuda.copy_blocks(src, 0, 10, cuda.zeros(100), 0, 10, 10, 10, accumulate)


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("scales", [(1.0, 1.0), (0.7, 1.3)])
@pytest.mark.parametrize(
    "shapes",
    [((13, 13, 32), (13, 13, 32)), ((26, 26, 8), (13, 13, 16)), ((13, 13, 16), (26, 26, 8))],
)
def test_shortcut_16_bit_cuda(cuda, precision, scales, shapes):
    (w1, h1, c1), (w2, h2, c2) = shapes
    rng, batch = np.random.default_rng(14), 3
    a_values, o_values = rand(rng, batch * c1 * h1 * w1), rand(rng, batch * c2 * h2 * w2)

    def run(be):
        out = stored(be, o_values, precision)
        be.shortcut(batch, w1, h1, c1, stored(be, a_values, precision), w2, h2, c2, *scales, out)
        return host(be, out)

    got, want = both(cuda, run)
    if scales == (1.0, 1.0):  # out + add: one fp32 addition, rounded once
        assert_same(got, want, "shortcut")
    else:  # a fused multiply-add on the GPU: within the 16-bit rounding of results that
        # keep their terms' size; a sum that cancels them differs by fp32's rounding of those
        slack = 2.0**-22 * (
            abs(scales[0]) * np.abs(o_values).max() + abs(scales[1]) * np.abs(a_values).max()
        )
        assert_within_a_step(got, want, precision, "shortcut", slack)
    with pytest.raises(ValueError, match=rf"shortcut: .*{precision}.*{OTHER[precision]}"):
        cuda.shortcut(
            batch,
            w1,
            h1,
            c1,
            stored(cuda, a_values, precision),
            w2,
            h2,
            c2,
            1.0,
            1.0,
            cuda.storage_zeros(o_values.size, OTHER[precision]),
        )


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("case", [(2, 2, 0), (3, 1, 2), (2, 1, 1), (3, 2, 1), (5, 3, 4)])
@pytest.mark.parametrize("train", [False, True])
def test_maxpool_forward_16_bit_cuda(cuda, precision, case, train):
    size, stride, padding = case
    rng = np.random.default_rng(sum(case) + train)
    batch, c, h, w = 2, 5, 13, 11
    values = rand(rng, batch * c * h * w)
    values[::7] = values[1::7][: values[::7].size]  # ties: the first maximum wins
    out_h, out_w = (h + padding - size) // stride + 1, (w + padding - size) // stride + 1
    n = batch * c * out_h * out_w

    def run(be):
        out = be.storage_zeros(n, precision)
        be.fill(out, np.nan)  # poisoned: every element must be written
        idx = be.int_zeros(n) if train else None
        be.maxpool_forward(
            stored(be, values, precision), batch, c, h, w, size, stride, padding, out, idx
        )
        return host(be, out), (be.to_host(idx) if train else None)

    (got, got_idx), (want, want_idx) = both(cuda, run)
    assert_same(got, want, "maxpool")
    if train:
        assert_same(got_idx, want_idx, "maxpool indexes")


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("scale", [1.0, 0.5, 0.3])
@pytest.mark.parametrize("stride", [2, 3])
def test_upsample_forward_16_bit_cuda(cuda, precision, scale, stride):
    rng = np.random.default_rng(stride)
    w, h, c, batch = 13, 7, 6, 2
    values = rand(rng, batch * c * h * w)

    def run(be):
        out = be.storage_zeros(values.size * stride * stride, precision)
        be.upsample(stored(be, values, precision), w, h, c, batch, stride, True, scale, out)
        return host(be, out)

    got, want = both(cuda, run)
    assert_same(got, want, "upsample")  # one fp32 product, rounded once, on both
    with pytest.raises(TypeError, match=r"upsample \(backward\)"):
        cuda.upsample(
            stored(cuda, values, precision),
            w,
            h,
            c,
            batch,
            stride,
            False,
            scale,
            cuda.storage_zeros(values.size * stride * stride, precision),
        )


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize("activation", ["leaky", "mish", "logistic", "linear", "swish"])
@pytest.mark.parametrize("shape", [(3, 7, 169), (4, 6, 169), (8, 3, 1), (2, 16, 3)])
def test_rebuild_into_a_16_bit_output_cuda(cuda, precision, eps, activation, shape):
    """The 16-bit out is exactly the fp32 out of the same kernel family rounded once, and
    within a 16-bit step of NumPy's (exact steps against the GPU's fast ones: a few fp32
    ulp before the rounding). Shapes: 3549 values (one a thread, rows apart), then totals
    that divide by 8 (eight a thread, 16-byte accesses: rows crossed inside the eight, one
    or several times)."""
    rng = np.random.default_rng(len(activation))
    batch, filters, spatial = shape
    values = rand(rng, batch * filters * spatial)
    stats_host = bn_stats(rng, filters)

    def run(be, out_precision):
        stats = [be.from_host(s) for s in stats_host]
        x = stored(be, values, precision)
        out = be.storage_zeros(values.size, out_precision)
        be.batchnorm_rebuild(x, out, *stats, batch, filters, spatial, eps, activation, precision)
        return host(be, out)

    half, fp32 = run(cuda, precision), run(cuda, "fp32")
    assert_same(half, precisions.round_to(fp32, precision), "16-bit out = rounded fp32 out")
    assert_within_a_step(half, run(REF32, precision), precision, "against NumPy")
    x = stored(cuda, values, precision)
    with pytest.raises(ValueError, match=rf"batchnorm_rebuild: .*{OTHER[precision]}"):
        cuda.batchnorm_rebuild(
            x,
            cuda.storage_zeros(values.size, OTHER[precision]),
            *[cuda.from_host(s) for s in stats_host],
            batch,
            filters,
            spatial,
            eps,
            activation,
            precision,
        )


def host_gradient(y, activation):
    """gradient() of activations.cuh in float32, for the activations whose device form is
    one rounding a step (no multiply-add to contract): the same bits."""
    y = np.asarray(y, np.float32)
    one = np.float32(1.0)
    if activation == "leaky":
        return np.where(y > 0, one, np.float32(0.1))
    if activation == "relu":
        return np.where(y > 0, one, np.float32(0.0))
    if activation == "logistic":
        return (one - y) * y
    raise ValueError(activation)


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("eps", [None, 1e-5])
@pytest.mark.parametrize(
    "activation", ["leaky", "relu", "logistic", "tanh", "elu", "linear", "mish"]
)
@pytest.mark.parametrize("shape", [(2, 5, 37), (3, 4, 2500), (1, 3, 6000)])
def test_half_x_backward_reads_no_output_cuda(cuda, precision, eps, activation, shape):
    """With a 16-bit x the backward gives the same bits whether output is the rebuilt fp32
    output, None or NaN-poisoned; its delta is the rebuilt output's gradient (host float32
    where gradient() is one rounding a step: the same bits as reading it); and it is within
    the reductions' tolerance of NumPy's."""
    batch, filters, spatial = shape
    rng = np.random.default_rng(sum(shape) + len(activation))
    values = rand(rng, batch * filters * spatial)
    stats_host = bn_stats(rng, filters)
    delta_values = rand(rng, values.size, -1.0, 1.0)
    stats = [cuda.from_host(s) for s in stats_host]
    x = stored(cuda, values, precision)
    rebuilt = cuda.zeros(values.size)
    cuda.batchnorm_rebuild(x, rebuilt, *stats, batch, filters, spatial, eps, activation, precision)
    args = (batch, filters, spatial, eps, activation, delta_values, precision)
    results = [
        backward_results(cuda, x, stats, output, *args, sums=sums)
        for output in (rebuilt, None, cuda.from_host(np.full(values.size, np.nan, np.float32)))
        for sums in (False, True)
    ]
    for other in results[2:]:
        for g, w in zip(other, results[len(other) == 5]):
            assert_same(g, w, f"{activation}: output ignored")
    delta = results[0][0]
    if activation in ("leaky", "relu", "logistic"):
        y = cuda.to_host(rebuilt)
        assert_same(delta, delta_values * host_gradient(y, activation), "delta from the output")
    if activation == "linear":
        assert_same(delta, delta_values, "linear delta")
    ref_stats = [REF32.from_host(s) for s in stats_host]
    want = backward_results(REF32, stored(REF32, values, precision), ref_stats, None, *args)
    for g, w, what in zip(results[0], want, ("delta", "bias_updates", "scale_updates")):
        scale = max(np.max(np.abs(w)), 1e-30)
        tol = 1e-4 if what != "delta" else 1e-5
        if what == "delta" and activation not in ("linear", "leaky", "relu"):
            tol = 1e-4  # the fast forms (mish, logistic) against the exact ones
        assert np.max(np.abs(g.astype(np.float64) - w)) / scale < tol, f"{activation} {what}"


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("shape", [(4, 6, 169), (8, 3, 1), (2, 16, 3), (3, 7, 13)])
@pytest.mark.parametrize("fork", [False, True])
def test_batchnorm_delta_from_sums_16_bit_x_cuda(cuda, precision, shape, fork):
    """batchnorm_delta_from_sums over a 16-bit x, within fp32's rounding of NumPy's exact
    steps. Totals that divide by 8 take the eight-a-thread normalize_delta (rows crossed
    inside the eight, once or several times: NOTES M4c); 3 x 7 x 13 the row kernel; both
    give the same values (the same fast steps)."""
    batch, filters, spatial = shape
    rng = np.random.default_rng(batch * filters + spatial)
    n = batch * filters * spatial
    x_values, delta_values = rand(rng, n), rand(rng, n, -1.0, 1.0)
    stats = [
        rand(rng, filters, -0.5, 0.5),
        rand(rng, filters, 0.2, 2.0),
        rand(rng, filters, 0.5, 1.5),
        rand(rng, filters, -2.0, 2.0),
        rand(rng, filters, -2.0, 2.0),
    ]

    def run(be):
        mean, variance, scales, delta_sum, delta_x_norm_sum = [be.from_host(s) for s in stats]
        x, delta = stored(be, x_values, precision), be.from_host(delta_values)
        mean_delta, variance_delta = be.zeros(filters), be.zeros(filters)
        be.batchnorm_delta_from_sums(
            x,
            mean,
            variance,
            scales,
            batch,
            filters,
            spatial,
            None,
            delta_sum,
            delta_x_norm_sum,
            mean_delta,
            variance_delta,
            delta,
            fork=fork,
            x_precision=precision,
        )
        return host(be, delta)

    got, want = run(cuda), run(REF32)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
