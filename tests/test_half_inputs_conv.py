"""16-bit layer outputs as a convolution's input (issue 26, M4): the CUDA convolution ops
that read a layer's output take a storage_zeros(n, p) array (float16 for fp16, uint16
holding bf16's bits) as well as fp32, picking their kernels by storage_of:
  * conv_forward: conv_tc's `_in16` entries (the output fp32 or 16-bit by their last
    argument) and the wgmma forward's im2col_rows_{f16,bf16}_from_* unfolding;
  * conv_weight_grad: the implicit weight gradient's conv_wgrad_*_in16 tiles;
  * conv_weight_grad_unfolded: im2col_{f16,bf16}_from_* into wgmma's operand, or off
    Hopper (or short K) im2col_from_{f16,bf16}_kernel into the fp32 col.
The 16-bit bits are the operand's, and today's kernels round an fp32 input to nearest even
(a value already representable rounds to itself), so every result with a 16-bit `im` must
equal, bit for bit, the result with the same values widened into an fp32 array: that is
the test, on both routes of each op, in fp16 and bf16, over shapes that divide no tile
(3 and 255 channels, 1x1, 3x3, 5x5 and 7x7 kernels, stride 2, dilation 2, groups), every
output poisoned with NaN first. And a 16-bit input of another precision (fp16 into a bf16
op, any 16 bits into tf32 / fp32) is a ValueError naming both.

All GPU tests (CudaBackend needs PyCUDA); the wgmma routes are skipped off compute
capability 9.0.
"""

import zlib

import numpy as np
import pytest
from test_bn_passes import poisoned_storage
from test_cuda_ops import nan, rand

from darknet_py.shapes import conv_out_size

gpu = pytest.mark.gpu
HALF = ("fp16", "bf16")

# (c, h, w, filters, size, stride, pad, dilation, groups, batch)
CASES = [
    (3, 23, 29, 16, 3, 1, 1, 1, 1, 3),  # a first layer: 3 channels
    (19, 17, 15, 33, 3, 2, 1, 1, 1, 2),  # stride 2
    (64, 13, 13, 255, 1, 1, 0, 1, 1, 2),  # a head's 255 filters, 1x1
    (24, 12, 11, 40, 3, 1, 2, 2, 1, 2),  # dilation 2
    (32, 11, 14, 32, 3, 1, 1, 1, 4, 2),  # groups
    (255, 9, 7, 36, 3, 1, 1, 1, 1, 3),  # 255 channels
    (5, 7, 6, 130, 5, 2, 2, 1, 1, 4),  # 5x5, stride 2
    (4, 11, 10, 8, 7, 1, 3, 1, 1, 2),  # 7x7: the gather's per-element bounds
    (33, 10, 12, 17, 1, 2, 0, 1, 1, 3),  # 1x1, stride 2
]
# The wgmma forward unfolds 3x3 kernels only (im2col_rows).
WGMMA_FORWARD_CASES = [c for c in CASES if c[4] == 3] + [
    (64, 19, 17, 128, 3, 1, 2, 2, 2, 4),  # dilation 2, groups
    (128, 13, 13, 260, 3, 1, 1, 1, 1, 6),  # more than one 128-row tile pair
]


def _seed(*key):
    return zlib.crc32(repr(key).encode())


def _ids(cases):
    return ["c{}h{}w{}f{}k{}s{}p{}d{}g{}b{}".format(*c) for c in cases]


_poisoned = poisoned_storage  # storage_zeros filled with each format's quiet NaN


def _images(cuda, p, values):
    """(the images at p's 16 bits, the same values widened into an fp32 array)."""
    half = cuda.storage_zeros(values.size, p)
    cuda.copy_rounded(cuda.from_host(values), half, p)
    assert cuda.storage_of(half) == p
    widened = cuda.from_host(cuda.to_host(half))
    assert cuda.storage_of(widened) == "fp32"
    return half, widened


def _bits(cuda, a):
    """The values of a device array as float32 (16 bits widened exactly), as their bits."""
    return np.asarray(cuda.to_host(a), np.float32).view(np.uint32)


def _same(cuda, got, want, what):
    g, w = _bits(cuda, got), _bits(cuda, want)
    assert not np.isnan(np.asarray(cuda.to_host(want), np.float32)).any(), f"{what}: NaN left"
    bad = np.flatnonzero(g != w)
    assert bad.size == 0, (
        f"{what}: {bad.size} of {g.size} differ, first at {bad[0]}: "
        f"{g[bad[0]]:#010x} against {w[bad[0]]:#010x}"
    )


@pytest.fixture
def route(cuda, monkeypatch):
    """route(name): the wgmma or the mma.sync kernels for the ops below (skips the test
    where wgmma cannot run)."""
    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    def force(name):
        if name == "wgmma":
            if cuda_wgmma.kernels(cuda) is None:
                pytest.skip("the wgmma kernels need compute capability 9.0")
            monkeypatch.setattr(
                cuda_wgmma, "forward_takes", lambda be, p, m, n, k, ksize, positions: ksize == 3
            )
            monkeypatch.setattr(cuda_wgmma, "handles", lambda be, p, m, n, k: p in HALF)
        else:
            monkeypatch.setattr(cuda_wgmma, "forward_takes", lambda *args: False)
            monkeypatch.setattr(cuda_wgmma, "handles", lambda *args: False)

    yield force
    cuda.tc_override = cuda.wgrad_override = None


# ---- conv_forward -------------------------------------------------------------------------


def _forward(cuda, p, case, weights, im, biases, activation, out_precision):
    """conv_forward of every group of `case` (im: a device array) into a NaN-poisoned
    array at out_precision."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    out = _poisoned(cuda, batch * filters * out_h * out_w, out_precision)
    W = cuda.from_host(weights)
    bias = None if biases is None else cuda.from_host(biases)
    cg, m = c // groups, filters // groups
    k = cg * size * size
    for g in range(groups):
        packed = cuda.pack_weights(W[g * m * k :], m, k, p)
        cuda.conv_forward(
            packed,
            im[g * cg * h * w :],
            cg,
            h,
            w,
            size,
            stride,
            pad,
            dilation,
            batch,
            c * h * w,
            None if bias is None else bias[g * m :],
            activation,
            out[g * m * out_h * out_w :],
            filters * out_h * out_w,
            out_precision=out_precision,
        )
    return out


def _check_forward(cuda, p, case, seed, tiles=(None,)):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(seed)
    weights = rand(rng, filters * c // groups * size * size)
    biases = rand(rng, filters)
    half, widened = _images(cuda, p, rand(rng, batch * c * h * w, -4.0, 4.0))
    for tile in tiles:
        cuda.tc_override = tile
        # fp32 out (linear; bias + leaky), and 16 bits in and out (the inference epilogue)
        for act, bias, out_p in (
            ("linear", None, "fp32"),
            ("leaky", biases, "fp32"),
            ("mish", biases, p),
            ("linear", None, p),
        ):
            what = f"{p} tile {tile} {act} bias={bias is not None} out {out_p}"
            got = _forward(cuda, p, case, weights, half, bias, act, out_p)
            want = _forward(cuda, p, case, weights, widened, bias, act, out_p)
            _same(cuda, got, want, what)
    cuda.tc_override = None


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_conv_forward_conv_tc_takes_16_bit_images(cuda, route, p, case):
    route("conv_tc")
    # the heuristic's tile, and the widest and narrowest tiles on some shapes
    tiles = (None, ("128x128", 1), ("16x128", 1)) if case[0] in (3, 255) else (None,)
    _check_forward(cuda, p, case, _seed(p, str(case), "tc"), tiles)


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", WGMMA_FORWARD_CASES, ids=_ids(WGMMA_FORWARD_CASES))
def test_conv_forward_wgmma_takes_16_bit_images(cuda, route, p, case):
    route("wgmma")
    _check_forward(cuda, p, case, _seed(p, str(case), "wgmma"))


# ---- the weight gradients ---------------------------------------------------------------------


def _weight_grad(cuda, p, case, delta, im, updates, unfolded):
    """conv_weight_grad (or, unfolded, conv_weight_grad_unfolded with an fp32 col) of every
    group of `case`, added into a copy of `updates`."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    U = cuda.from_host(updates)
    if unfolded:  # delta as the layer moves it: each group's filters x batch * positions
        col = cuda.from_host(nan(k * batch * n))
        for g in range(groups):
            D = cuda.from_host(delta[g])
            cuda.conv_weight_grad_unfolded(
                p,
                im[g * cg * h * w :],
                cg,
                h,
                w,
                size,
                stride,
                pad,
                dilation,
                batch,
                c * h * w,
                D,
                m,
                U[g * m * k :],
                col,
            )
        return U
    D = cuda.from_host(delta)
    for g in range(groups):
        cuda.conv_weight_grad(
            p,
            D[g * m * n :],
            filters * n,
            im[g * cg * h * w :],
            c * h * w,
            cg,
            h,
            w,
            size,
            stride,
            pad,
            dilation,
            batch,
            m,
            U[g * m * k :],
        )
    return U


def _check_weight_grad(cuda, p, case, seed, unfolded, plans=(None,)):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    m, n = filters // groups, out_h * out_w
    rng = np.random.default_rng(seed)
    updates = rand(rng, filters * c // groups * size * size)
    if unfolded:
        delta = [rand(rng, m * batch * n) for _ in range(groups)]
    else:
        delta = rand(rng, batch * filters * n)
    half, widened = _images(cuda, p, rand(rng, batch * c * h * w, -4.0, 4.0))
    for plan in plans:
        cuda.wgrad_override = plan
        got = _weight_grad(cuda, p, case, delta, half, updates, unfolded)
        want = _weight_grad(cuda, p, case, delta, widened, updates, unfolded)
        _same(cuda, got, want, f"{p} plan {plan}")
    cuda.wgrad_override = None


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_implicit_weight_grad_takes_16_bit_images(cuda, p, case):
    # the heuristic's plan, and every tile once over the cases with 3 or 255 channels (one
    # split, several)
    plans = (None,)
    if case[0] == 3:
        plans = (None, ("128x128", 1), ("64x128", 3), ("32x128", 2))
    elif case[0] == 255:
        plans = (None, ("64x64", 5), ("32x64", 1))
    _check_weight_grad(cuda, p, case, _seed(p, str(case), "wgrad"), False, plans)


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("via", ("wgmma", "mma.sync"))
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_unfolded_weight_grad_takes_16_bit_images(cuda, route, p, via, case):
    route(via)
    _check_weight_grad(cuda, p, case, _seed(p, str(case), via), True)


# ---- im2col ---------------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", CASES[:4], ids=_ids(CASES[:4]))
def test_im2col_of_16_bit_images_is_the_widened_one(cuda, p, case):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    rng = np.random.default_rng(_seed(p, str(case), "im2col"))
    half, widened = _images(cuda, p, rand(rng, batch * c * h * w, -4.0, 4.0))
    cols = []
    for im in (half, widened):
        col = cuda.from_host(nan(c * size * size * batch * out_h * out_w))
        cuda.im2col(im, c, h, w, size, stride, pad, dilation, col, batch, c * h * w)
        cols.append(col)
    _same(cuda, *cols, f"{p} im2col")


# ---- mismatched storage ---------------------------------------------------------------------


@gpu
def test_a_16_bit_input_of_another_precision_is_refused(cuda, route):
    route("conv_tc")
    c, h, w, size = 3, 9, 8, 3
    rng = np.random.default_rng(3)
    weights = cuda.from_host(rand(rng, 4 * c * size * size))
    delta = cuda.from_host(rand(rng, 4 * h * w))
    for stored, op in (
        ("fp16", "bf16"),
        ("bf16", "fp16"),
        ("fp16", "tf32"),
        ("bf16", "tf32"),
        ("fp16", "fp32"),
    ):
        im = cuda.storage_zeros(c * h * w, stored)
        updates = cuda.zeros(4 * c * size * size)
        message = f"kept at {stored}, the op runs at {op}"
        if op != "fp32":  # conv_forward runs at the packed weights' tensor-core precision
            packed = cuda.pack_weights(weights, 4, c * size * size, op)
            with pytest.raises(ValueError, match=message):
                cuda.conv_forward(
                    packed,
                    im,
                    c,
                    h,
                    w,
                    size,
                    1,
                    1,
                    1,
                    1,
                    0,
                    None,
                    "linear",
                    cuda.zeros(4 * h * w),
                    4 * h * w,
                )
        with pytest.raises(ValueError, match=message):
            cuda.conv_weight_grad(op, delta, 0, im, 0, c, h, w, size, 1, 1, 1, 1, 4, updates)
        with pytest.raises(ValueError, match=message):
            cuda.conv_weight_grad_unfolded(
                op,
                im,
                c,
                h,
                w,
                size,
                1,
                1,
                1,
                1,
                0,
                delta,
                4,
                updates,
                cuda.zeros(c * size * size * h * w),
            )
