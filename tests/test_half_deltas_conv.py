"""16-bit deltas into a convolution's backward (issue 26): conv_weight_grad,
conv_weight_grad_unfolded and conv_data_grad take the gradient w.r.t. the convolution's
output as a storage_zeros(n, p) array (float16 for fp16, uint16 holding bf16's bits) as well
as fp32, picked by storage_of:
  * conv_weight_grad: the implicit tiles' conv_wgrad_*_d16 entries, the images fp32 or
    16-bit (their last argument);
  * conv_weight_grad_unfolded: the delta as wgmma's A operand in place (rows of a multiple
    of 8) or copied to its pitch; off wgmma widened (im2col_from_*) for gemm_lowp;
  * conv_data_grad: conv_dgrad_*_d16 (unit strides), conv_dgrad_class_*_d16 (a launch a
    parity class), and the wgmma forward of the deltas (>= 256 channels), which takes the
    16-bit delta as its image.
Today's kernels round an fp32 delta to the operand's 16 bits (nearest even), so a delta
already at 16 bits must give, bit for bit, the result with its values widened into an fp32
array: the test, over every route, in fp16 and bf16, outputs poisoned with NaN where the
op writes. A 16-bit delta of another precision is a ValueError naming both.

All GPU tests; the wgmma routes are skipped off compute capability 9.0.
"""
import numpy as np
import pytest

from darknet_py.shapes import conv_out_size

from test_cuda_ops import nan, rand
from test_half_inputs_conv import _ids, _images, _poisoned, _same, _seed, route  # noqa: F401

gpu = pytest.mark.gpu
HALF = ("fp16", "bf16")

# (c, h, w, filters, size, stride, pad, dilation, groups, batch)
CASES = [
    (3, 23, 29, 16, 3, 1, 1, 1, 1, 3),       # a first layer: 3 channels; k = 2001 (odd)
    (19, 17, 15, 33, 3, 2, 1, 1, 1, 2),      # stride 2
    (64, 13, 13, 255, 1, 1, 0, 1, 1, 2),     # a head's 255 filters, 1x1
    (24, 12, 11, 40, 3, 1, 2, 2, 1, 2),      # dilation 2; k = 264 (wgmma reads it in place)
    (32, 11, 14, 32, 3, 1, 1, 1, 4, 2),      # groups
    (255, 9, 7, 36, 3, 1, 1, 1, 1, 3),       # 255 channels
    (33, 10, 12, 17, 1, 2, 0, 1, 1, 3),      # 1x1, stride 2
]
# The data gradient as the wgmma forward of the deltas: unit stride, 3x3, >= 256 channels.
FORWARD_DGRAD_CASES = [
    (256, 13, 11, 64, 3, 1, 1, 1, 1, 2),
    (260, 9, 10, 40, 3, 1, 2, 2, 1, 2),      # dilation 2
]


def _deltas(cuda, p, case, rng):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    return _images(cuda, p, rand(rng, batch * filters * out_h * out_w, -2.0, 2.0))


# ---- conv_weight_grad -----------------------------------------------------------------------

def _weight_grad(cuda, p, case, delta, im, updates):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    U = cuda.from_host(updates)
    for g in range(groups):
        cuda.conv_weight_grad(p, delta[g * m * n:], filters * n, im[g * cg * h * w:], c * h * w,
                              cg, h, w, size, stride, pad, dilation, batch, m, U[g * m * k:])
    return U


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_implicit_weight_grad_takes_16_bit_deltas(cuda, p, case):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(_seed(p, str(case), "wgrad-d16"))
    updates = rand(rng, filters * c // groups * size * size)
    d_half, d_wide = _deltas(cuda, p, case, rng)
    ims = _images(cuda, p, rand(rng, batch * c * h * w, -4.0, 4.0))
    plans = (None,)
    if c == 3:
        plans = (None, ("128x128", 1), ("64x128", 3), ("32x128", 2))
    elif c == 255:
        plans = (None, ("64x64", 5), ("32x64", 1))
    try:
        for plan in plans:
            cuda.wgrad_override = plan
            for im, stored in zip(ims, (p, "fp32")):   # the images 16-bit, then fp32
                got = _weight_grad(cuda, p, case, d_half, im, updates)
                want = _weight_grad(cuda, p, case, d_wide, im, updates)
                _same(cuda, got, want, f"{p} plan {plan} images {stored}")
    finally:
        cuda.wgrad_override = None


# ---- conv_weight_grad_unfolded --------------------------------------------------------------

@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("via", ("wgmma", "mma.sync"))
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_unfolded_weight_grad_takes_16_bit_deltas(cuda, route, p, via, case):
    route(via)
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    rng = np.random.default_rng(_seed(p, str(case), via, "unfolded-d16"))
    updates = rand(rng, filters * k)
    # each group's delta as the layer moves it: filters x batch * positions
    deltas = [_images(cuda, p, rand(rng, m * batch * n, -2.0, 2.0)) for _ in range(groups)]
    ims = _images(cuda, p, rand(rng, batch * c * h * w, -4.0, 4.0))
    for im, stored in zip(ims, (p, "fp32")):
        results = []
        for which in (0, 1):   # the 16-bit deltas, then the widened ones
            U = cuda.from_host(updates)
            col = cuda.from_host(nan(k * batch * n))
            for g in range(groups):
                cuda.conv_weight_grad_unfolded(p, im[g * cg * h * w:], cg, h, w, size, stride,
                                               pad, dilation, batch, c * h * w,
                                               deltas[g][which], m, U[g * m * k:], col)
            results.append(U)
        _same(cuda, *results, f"{p} {via} images {stored}")


# ---- conv_data_grad -------------------------------------------------------------------------

def _data_grad(cuda, p, case, weights, delta, dx0, accumulate):
    """conv_data_grad of every group into a copy of dx0 (accumulate) or a NaN-poisoned dx."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    dx = cuda.from_host(dx0) if accumulate else _poisoned(cuda, batch * c * h * w, "fp32")
    for g in range(groups):
        cuda.conv_data_grad(p, weights[g * m * k:], m, delta[g * m * n:], filters * n, cg, h, w,
                            size, stride, pad, dilation, batch, dx[g * cg * h * w:], c * h * w,
                            accumulate)
    return dx


def _check_data_grad(cuda, p, case, seed, tiles=(None,)):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(seed)
    weights = cuda.from_host(rand(rng, filters * c // groups * size * size))
    d_half, d_wide = _deltas(cuda, p, case, rng)
    dx0 = rand(rng, batch * c * h * w)
    try:
        for tile in tiles:
            cuda.dgrad_override = tile
            for accumulate in (False, True):
                got = _data_grad(cuda, p, case, weights, d_half, dx0, accumulate)
                want = _data_grad(cuda, p, case, weights, d_wide, dx0, accumulate)
                _same(cuda, got, want, f"{p} tile {tile} accumulate {accumulate}")
    finally:
        cuda.dgrad_override = None


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", CASES, ids=_ids(CASES))
def test_implicit_data_grad_takes_16_bit_deltas(cuda, route, p, case):
    # the implicit kernels (unit strides: conv_dgrad_*; others: a launch a parity class)
    route("conv_tc")
    tiles = (None, "128x128", "64x128", "32x128") if case[0] in (3, 255) else (None,)
    _check_data_grad(cuda, p, case, _seed(p, str(case), "dgrad-d16"), tiles)


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("case", FORWARD_DGRAD_CASES, ids=_ids(FORWARD_DGRAD_CASES))
def test_data_grad_as_forward_takes_16_bit_deltas(cuda, route, p, case):
    route("wgmma")
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    assert cuda._data_grad_takes_forward(p, batch, c, h, w, size, pad, dilation, filters)
    _check_data_grad(cuda, p, case, _seed(p, str(case), "forward-dgrad-d16"))


# ---- mismatched storage ---------------------------------------------------------------------

@gpu
def test_a_16_bit_delta_of_another_precision_is_refused(cuda, route):
    route("conv_tc")
    c, h, w, size, filters = 3, 9, 8, 3, 4
    rng = np.random.default_rng(5)
    weights = cuda.from_host(rand(rng, filters * c * size * size))
    im = cuda.from_host(rand(rng, c * h * w))
    for stored, op in (("fp16", "bf16"), ("bf16", "fp16"), ("fp16", "tf32"), ("bf16", "tf32"),
                       ("fp16", "fp32"), ("bf16", "fp32")):
        delta = cuda.storage_zeros(filters * h * w, stored)
        updates = cuda.zeros(filters * c * size * size)
        message = f"kept at {stored}, the op runs at {op}"
        with pytest.raises(ValueError, match=message):
            cuda.conv_weight_grad(op, delta, 0, im, 0, c, h, w, size, 1, 1, 1, 1, filters,
                                  updates)
        with pytest.raises(ValueError, match=message):
            cuda.conv_weight_grad_unfolded(op, im, c, h, w, size, 1, 1, 1, 1, 0, delta, filters,
                                           updates, cuda.zeros(c * size * size * h * w))
        with pytest.raises(ValueError, match=message):
            cuda.conv_data_grad(op, weights, filters, delta, 0, c, h, w, size, 1, 1, 1, 1,
                                cuda.zeros(c * h * w), 0, False)
