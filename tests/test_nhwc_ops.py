"""Issue 42: the NHWC 16-bit ops (ops/nhwc/): a tensor's channel ch of pixel p is element
p * pitch + offset + ch of a 16-bit array, the pitch a multiple of 8.

CPU tests: each NumPy reference against the existing NCHW op on the same 16-bit values,
transposed (maxpool_forward_xy, upsample, shortcut, copy_blocks, letterbox_images), on
random shapes with odd sizes and 3, 13 and 255 channels, each tensor on its own (offset 0)
or as a slice of a wider one (a [route]'s concatenation, also at an offset that is not a
multiple of 8). Every op must leave the channels outside its span alone (they hold NaN) and
write zeros from its last channel to the next multiple of 8.

GPU tests (marked gpu): each kernel against its NumPy reference on fp16 and bf16, the
outputs poisoned with NaN first, bit for bit (the ops move values or round one fp32 result;
shortcut's transcendental activations within one 16-bit step), on the 16-byte path
(aligned) and the channel-by-channel one (an offset not a multiple of 8, or an array view
that does not start on 16 bytes).
"""

import numpy as np
import pytest

from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.ops.nhwc.numpy import padded_end, pixel_pitch

gpu = pytest.mark.gpu
HALF = ["fp16", "bf16"]
REF32 = NumpyBackend(np.float32)

# (pitch extra channels before, offset): the tensor on its own, a slice at 16 of a wider
# tensor, a slice at 5 (the channel-by-channel path)
PLACES = [(0, 0), (16, 16), (5, 5)]


def rand(rng, shape, lo=-4.0, hi=4.0):
    x = rng.uniform(lo, hi, shape).astype(np.float32)
    x[x == 0] = np.float32(0.25)
    return x


def place(c, before):
    """(pitch, offset) of a c-channel tensor after `before` other channels, 8 after it."""
    return pixel_pitch(before + c + 8), before


class Tensor:
    """An NHWC 16-bit tensor on a backend: `values` (batch, c, h, w) rounded, at `offset` of
    pixels of `pitch`, the array's other channels random (other producers' values)."""

    def __init__(self, be, rng, precision, batch, c, h, w, before=0, shift=0):
        self.be, self.precision = be, precision
        self.batch, self.c, self.h, self.w = batch, c, h, w
        self.pitch, self.offset = place(c, before)
        full = precisions.round_to(rand(rng, (batch, h, w, self.pitch)), precision)
        self.values = full[..., self.offset : self.offset + c].transpose(0, 3, 1, 2).copy()
        self.whole = be.storage_zeros(full.size + shift, precision)
        be.copy_rounded(
            be.from_host(np.concatenate([np.zeros(shift, np.float32), full.ravel()])),
            self.whole,
            precision,
        )
        self.array = self.whole[shift:]


def poisoned(be, n, precision, shift=0):
    """A 16-bit array of n NaNs (a view from `shift`: off the 16-byte alignment)."""
    whole = be.storage_zeros(n + shift, precision)
    be.fill(whole, float("nan"))
    return whole, whole[shift:]


def host(be, a):
    return np.asarray(be.to_host(a), np.float32)


def nhwc_part(flat, batch, c, h, w, pitch, offset):
    """The c channels at offset of an NHWC host array, as (batch, c, h, w)."""
    return flat[: batch * h * w * pitch].reshape(batch, h, w, pitch)[..., offset : offset + c]


def check_written(flat, batch, c, h, w, pitch, offset, want, what):
    """The tensor's channels equal want (batch, c, h, w), bits and NaNs alike; zeros to the
    next multiple of 8; every other channel still NaN."""
    pixels = flat[: batch * h * w * pitch].reshape(batch, h, w, pitch)
    got = pixels[..., offset : offset + c].transpose(0, 3, 1, 2)
    assert_same(got, want, what)
    end = padded_end(offset, c, pitch)
    assert np.all(pixels[..., offset + c : end] == 0), f"{what}: padding channels not zero"
    assert np.all(np.isnan(pixels[..., :offset])), f"{what}: wrote channels before its offset"
    assert np.all(np.isnan(pixels[..., end:])), f"{what}: wrote channels past its padding"


def assert_same(got, want, what):
    got, want = np.asarray(got, np.float32), np.asarray(want, np.float32)
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    bad = np.flatnonzero(~same)
    assert bad.size == 0, f"{what}: {bad.size} values differ, first at {bad[:8].tolist()}"


def stored_nchw(values, precision):
    """NumPy's 16-bit NCHW array of values (already rounded)."""
    a = REF32.storage_zeros(values.size, precision)
    a[...] = values.ravel()
    return a


# =============================================================================
# CPU: the NumPy references against the NCHW ops
# =============================================================================

MAXPOOLS = [  # size, stride_x, stride_y, padding
    (2, 2, 2, 1),
    (2, 1, 1, 1),  # yolov3-tiny's last maxpool
    (3, 2, 2, 2),
    (3, 1, 1, 2),
    (5, 1, 1, 4),  # SPP
    (2, 2, 1, 1),  # the fork's stride_x / stride_y
    (3, 1, 2, 0),
]
SHAPES = [(2, 3, 13, 11), (1, 13, 7, 9), (2, 255, 5, 4)]  # batch, c, h, w


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("before", [p[0] for p in PLACES])
def test_numpy_boundaries_round_trip(precision, shape, before):
    rng = np.random.default_rng(1)
    batch, c, h, w = shape
    values = rand(rng, shape)
    pitch, offset = place(c, before)
    _, out = poisoned(REF32, batch * h * w * pitch, precision)
    REF32.nhwc_from_nchw(values.ravel(), batch, c, h, w, out, pitch, offset)
    want = precisions.round_to(values, precision)
    check_written(np.asarray(out), batch, c, h, w, pitch, offset, want, "nhwc_from_nchw")
    back = np.full(values.size, np.nan, np.float32)
    REF32.nhwc_to_nchw(out, batch, c, h, w, pitch, offset, back)
    assert_same(back.reshape(shape), want, "nhwc_to_nchw")
    assert REF32.storage_of(out) == precision


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("window", MAXPOOLS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("before", [p[0] for p in PLACES])
def test_numpy_maxpool_matches_the_nchw_maxpool(precision, window, shape, before):
    rng = np.random.default_rng(2)
    size, sx, sy, padding = window
    batch, c, h, w = shape
    x = Tensor(REF32, rng, precision, *shape, before=before)
    x.values[0, 0, 0, :2] = np.nan  # a NaN first in its windows, then one later
    x.values[0, 0, 1, 1] = np.inf
    REF32.nhwc_from_nchw(x.values.ravel(), batch, c, h, w, x.array, x.pitch, x.offset)
    out_h = (h + padding - size) // sy + 1
    out_w = (w + padding - size) // sx + 1
    pitch, offset = place(c, 8 if before else 0)
    _, out = poisoned(REF32, batch * out_h * out_w * pitch, precision)
    REF32.nhwc_maxpool(
        x.array, batch, c, h, w, x.pitch, x.offset, size, sx, sy, padding, out, pitch, offset
    )
    want = REF32.storage_zeros(batch * c * out_h * out_w, precision)
    REF32.maxpool_forward_xy(
        stored_nchw(x.values, precision), batch, c, h, w, size, sx, sy, padding, want, None
    )
    want = np.asarray(want).reshape(batch, c, out_h, out_w)
    check_written(np.asarray(out), batch, c, out_h, out_w, pitch, offset, want, "nhwc_maxpool")


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("stride,scale", [(2, 1.0), (2, 0.3), (3, 1.0)])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("before", [p[0] for p in PLACES])
def test_numpy_upsample_matches_the_nchw_upsample(precision, stride, scale, shape, before):
    rng = np.random.default_rng(3)
    batch, c, h, w = shape
    x = Tensor(REF32, rng, precision, *shape, before=before)
    pitch, offset = place(c, before)
    oh, ow = h * stride, w * stride
    _, out = poisoned(REF32, batch * oh * ow * pitch, precision)
    REF32.nhwc_upsample(
        x.array, batch, c, h, w, x.pitch, x.offset, stride, scale, out, pitch, offset
    )
    want = REF32.storage_zeros(batch * c * oh * ow, precision)
    REF32.upsample(stored_nchw(x.values, precision), w, h, c, batch, stride, True, scale, want)
    want = np.asarray(want).reshape(batch, c, oh, ow)
    check_written(np.asarray(out), batch, c, oh, ow, pitch, offset, want, "nhwc_upsample")


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("groups,group_id", [(1, 0), (2, 1), (4, 2)])
def test_numpy_route_copies_match_copy_blocks(precision, groups, group_id):
    """A [route] of three inputs (the fork's groups take a slice of each) copied part by
    part into its concatenation, as the NCHW route's copy_blocks."""
    rng = np.random.default_rng(4)
    batch, h, w = 2, 5, 7
    sources = [
        Tensor(REF32, rng, precision, batch, c, h, w, before=before)
        for c, before in ((12, 0), (4, 16), (20, 5))
    ]
    parts = [s.c // groups for s in sources]
    total = sum(parts)
    pitch = pixel_pitch(total)
    _, out = poisoned(REF32, batch * h * w * pitch, precision)
    want = REF32.storage_zeros(batch * total * h * w, precision)
    at = 0
    for s, part in zip(sources, parts):
        REF32.nhwc_copy_channels(
            s.array, batch, part, h, w, s.pitch, s.offset + group_id * part, out, pitch, at
        )
        REF32.copy_blocks(
            stored_nchw(s.values, precision),
            group_id * part * h * w,
            s.c * h * w,
            want,
            at * h * w,
            total * h * w,
            part * h * w,
            batch,
        )
        at += part
    want = np.asarray(want).reshape(batch, total, h, w)
    check_written(np.asarray(out), batch, total, h, w, pitch, 0, want, "route copies")


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("activation", ["linear", "leaky", "logistic", "mish"])
@pytest.mark.parametrize("channels", [(13, 13), (255, 255), (16, 5), (3, 8)])
@pytest.mark.parametrize("before", [p[0] for p in PLACES])
def test_numpy_shortcut_matches_the_nchw_shortcut(precision, activation, channels, before):
    """Darknet's shortcut (out = x, then s1*out + s2*add over the shared channels, then
    the activation): the NCHW ops in fp32 on the 16-bit values, rounded once."""
    rng = np.random.default_rng(5)
    c, add_c = channels
    batch, h, w = 2, 5, 3
    s1, s2 = (1.0, 1.0) if activation == "linear" else (0.7, 1.3)
    x = Tensor(REF32, rng, precision, batch, c, h, w, before=before)
    add = Tensor(REF32, rng, precision, batch, add_c, h, w, before=8 if before else 0)
    pitch, offset = place(c, before)
    _, out = poisoned(REF32, batch * h * w * pitch, precision)
    REF32.nhwc_shortcut(
        x.array,
        x.pitch,
        x.offset,
        add.array,
        add_c,
        add.pitch,
        add.offset,
        batch,
        c,
        h,
        w,
        s1,
        s2,
        activation,
        out,
        pitch,
        offset,
    )
    want = x.values.ravel().copy()
    REF32.shortcut(batch, w, h, add_c, add.values.ravel(), w, h, c, s1, s2, want)
    REF32.activate(want, activation)
    want = precisions.round_to(want, precision).reshape(batch, c, h, w)
    check_written(np.asarray(out), batch, c, h, w, pitch, offset, want, "nhwc_shortcut")


def bgr_images(rng, shapes):
    """OpenCV BGR uint8 images of shapes, concatenated, and their byte offsets."""
    images = [rng.integers(0, 256, (ih, iw, 3), dtype=np.uint8) for ih, iw in shapes]
    offsets = np.cumsum([0] + [im.size for im in images])[:-1]
    return np.concatenate([im.ravel() for im in images]), offsets


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("letter", [True, False])
def test_numpy_letterbox_into_nhwc_matches_letterbox_images(precision, letter):
    rng = np.random.default_rng(6)
    shapes = [(37, 53), (64, 20), (1, 1)]
    width, height = 32, 24
    src, offsets = bgr_images(rng, shapes)
    pitch = 8
    _, out = poisoned(REF32, len(shapes) * height * width * pitch, precision)
    REF32.letterbox_images_nhwc(src, shapes, offsets, width, height, letter, out, pitch)
    want = np.zeros(len(shapes) * 3 * height * width, np.float32)
    REF32.letterbox_images(src, shapes, offsets, width, height, letter, want)
    want = precisions.round_to(want, precision).reshape(len(shapes), 3, height, width)
    check_written(np.asarray(out), len(shapes), 3, height, width, pitch, 0, want, "letterbox")


def test_numpy_nhwc_ops_refuse_bad_layouts_and_storages():
    rng = np.random.default_rng(7)
    x = Tensor(REF32, rng, "fp16", 1, 8, 2, 2)
    out = REF32.storage_zeros(4 * 8, "fp16")
    with pytest.raises(ValueError, match=r"nhwc_copy_channels: out pitch 12 is not a posit"):
        REF32.nhwc_copy_channels(x.array, 1, 8, 2, 2, x.pitch, 0, out, 12, 0)
    with pytest.raises(ValueError, match=r"nhwc_copy_channels: out channels 4\.\.11 do not fit"):
        REF32.nhwc_copy_channels(x.array, 1, 8, 2, 2, x.pitch, 0, out, 8, 4)
    with pytest.raises(ValueError, match=r"nhwc_copy_channels: .*fp16.*bf16"):
        REF32.nhwc_copy_channels(
            x.array, 1, 8, 2, 2, x.pitch, 0, REF32.storage_zeros(32, "bf16"), 8, 0
        )
    with pytest.raises(TypeError, match=r"nhwc_maxpool: .*fp32.*takes fp16 or bf16"):
        REF32.nhwc_maxpool(REF32.zeros(64), 1, 8, 2, 2, 16, 0, 2, 2, 2, 1, REF32.zeros(8), 8, 0)
    with pytest.raises(ValueError, match=r"nhwc_maxpool: x kept at fp32, out kept at fp16"):
        REF32.nhwc_maxpool(REF32.zeros(64), 1, 8, 2, 2, 16, 0, 2, 2, 2, 1, out, 8, 0)
    with pytest.raises(ValueError, match=r"nhwc_to_nchw: x holds 64 values, needs 128"):
        REF32.nhwc_to_nchw(x.array, 2, 8, 2, 2, x.pitch, 0, REF32.zeros(64))


# =============================================================================
# GPU: each kernel against its NumPy reference
# =============================================================================


def both(cuda, rng_seed, precision, make, shift=0):
    """make(be, rng, shift) on NumPy and CUDA from the same random draws: the host
    copies of what each returns."""
    results = []
    for be, s in ((REF32, 0), (cuda, shift)):
        results.append(make(be, np.random.default_rng(rng_seed), s))
    return results


GPU_SHAPES = [(2, 3, 13, 11), (3, 64, 9, 10), (2, 255, 5, 4), (1, 13, 1, 1)]
# (before, shift): aligned 16-byte path; a slice at 5 and an array view off 16 bytes
GPU_PLACES = [(0, 0), (16, 0), (5, 0), (0, 1)]


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("before,shift", GPU_PLACES)
def test_cuda_boundaries(cuda, precision, shape, before, shift):
    batch, c, h, w = shape
    pitch, offset = place(c, before)

    def make(be, rng, s):
        values = rand(rng, shape)
        values[0, 0, 0, 0] = np.nan
        values.ravel()[-1] = 1e6  # past fp16's range: infinity
        x32 = be.from_host(np.concatenate([np.zeros(s, np.float32), values.ravel()]))[s:]
        whole, out = poisoned(be, batch * h * w * pitch, precision, s)
        be.nhwc_from_nchw(x32, batch, c, h, w, out, pitch, offset)
        back = be.from_host(np.full(values.size + s, np.nan, np.float32))
        be.nhwc_to_nchw(out, batch, c, h, w, pitch, offset, back[s:])
        return host(be, whole)[s:], host(be, back)[s:]

    (want_nhwc, want_back), (got_nhwc, got_back) = both(cuda, 11, precision, make, shift)
    assert_same(got_nhwc, want_nhwc, "nhwc_from_nchw")
    assert_same(got_back, want_back, "nhwc_to_nchw")


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("window", MAXPOOLS)
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("before,shift", GPU_PLACES)
def test_cuda_maxpool(cuda, precision, window, shape, before, shift):
    size, sx, sy, padding = window
    batch, c, h, w = shape
    out_h = (h + padding - size) // sy + 1
    out_w = (w + padding - size) // sx + 1
    if out_h < 1 or out_w < 1:
        pytest.skip("the window does not fit")
    pitch, offset = place(c, 8 if before else 0)

    def make(be, rng, s):
        x = Tensor(be, rng, precision, *shape, before=before, shift=s)
        whole, out = poisoned(be, batch * out_h * out_w * pitch, precision, s)
        be.nhwc_maxpool(
            x.array, batch, c, h, w, x.pitch, x.offset, size, sx, sy, padding, out, pitch, offset
        )
        return host(be, whole)[s:]

    want, got = both(cuda, 12, precision, make, shift)
    assert_same(got, want, "nhwc_maxpool")


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("stride,scale", [(2, 1.0), (2, 0.3), (3, 1.0)])
@pytest.mark.parametrize("shape", GPU_SHAPES)
@pytest.mark.parametrize("before,shift", GPU_PLACES)
def test_cuda_upsample(cuda, precision, stride, scale, shape, before, shift):
    batch, c, h, w = shape
    pitch, offset = place(c, before)

    def make(be, rng, s):
        x = Tensor(be, rng, precision, *shape, before=before, shift=s)
        whole, out = poisoned(be, batch * h * w * stride * stride * pitch, precision, s)
        be.nhwc_upsample(
            x.array, batch, c, h, w, x.pitch, x.offset, stride, scale, out, pitch, offset
        )
        return host(be, whole)[s:]

    want, got = both(cuda, 13, precision, make, shift)
    assert_same(got, want, "nhwc_upsample")


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("channels,before", [(64, 0), (255, 16), (13, 5), (3, 0)])
@pytest.mark.parametrize("shift", [0, 1])
def test_cuda_copy_channels(cuda, precision, channels, before, shift):
    batch, h, w = 2, 7, 5
    pitch, offset = place(channels, 8 if before else 0)

    def make(be, rng, s):
        x = Tensor(be, rng, precision, batch, channels, h, w, before=before, shift=s)
        whole, out = poisoned(be, batch * h * w * pitch, precision, s)
        be.nhwc_copy_channels(x.array, batch, channels, h, w, x.pitch, x.offset, out, pitch, offset)
        return host(be, whole)[s:]

    want, got = both(cuda, 14, precision, make, shift)
    assert_same(got, want, "nhwc_copy_channels")


def assert_within_a_step(got, want, precision, what):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert np.array_equal(np.isnan(got), np.isnan(want)), f"{what}: NaNs differ"
    fin = np.isfinite(want)
    assert np.array_equal(got[~fin & ~np.isnan(want)], want[~fin & ~np.isnan(want)]), what
    bits = 10 if precision == "fp16" else 7
    v = np.maximum(np.abs(got[fin]), np.abs(want[fin]))
    step = np.maximum(2.0 ** (np.floor(np.log2(np.where(v > 0, v, 1.0))) - bits), 2.0**-24)
    bad = np.flatnonzero(np.abs(got[fin] - want[fin]) > step)
    assert bad.size == 0, f"{what}: {bad.size} values more than a 16-bit step apart"


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("activation", ["linear", "leaky", "relu", "logistic", "mish"])
@pytest.mark.parametrize("channels", [(64, 64), (255, 255), (16, 5), (3, 8)])
@pytest.mark.parametrize("before,shift", GPU_PLACES)
def test_cuda_shortcut(cuda, precision, activation, channels, before, shift):
    c, add_c = channels
    batch, h, w = 2, 9, 7
    s1, s2 = (1.0, 1.0) if activation == "linear" else (0.7, 1.3)
    pitch, offset = place(c, before)

    def make(be, rng, s):
        x = Tensor(be, rng, precision, batch, c, h, w, before=before, shift=s)
        add = Tensor(be, rng, precision, batch, add_c, h, w, before=8 if before else 0, shift=s)
        whole, out = poisoned(be, batch * h * w * pitch, precision, s)
        be.nhwc_shortcut(
            x.array,
            x.pitch,
            x.offset,
            add.array,
            add_c,
            add.pitch,
            add.offset,
            batch,
            c,
            h,
            w,
            s1,
            s2,
            activation,
            out,
            pitch,
            offset,
        )
        return host(be, whole)[s:]

    want, got = both(cuda, 15, precision, make, shift)
    if activation in ("linear", "leaky", "relu"):
        assert_same(got, want, "nhwc_shortcut")
    else:  # expf and log1pf against NumPy's: within a step where they round apart
        assert_within_a_step(got, want, precision, "nhwc_shortcut")


@gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("letter", [True, False])
@pytest.mark.parametrize("pitch,shift", [(8, 0), (8, 1), (16, 0)])
def test_cuda_letterbox_into_nhwc(cuda, precision, letter, pitch, shift):
    shapes = [(37, 53), (64, 20), (1, 1), (416, 300)]
    width, height = 96, 64
    rng = np.random.default_rng(16)
    src, offsets = bgr_images(rng, shapes)

    def make(be, _rng, s):
        whole, out = poisoned(be, len(shapes) * height * width * pitch, precision, s)
        source, upload = be.upload_bytes_async(src)
        be.wait_upload(upload)
        be.letterbox_images_nhwc(source, shapes, offsets, width, height, letter, out, pitch)
        be.finish_upload(upload)
        return host(be, whole)[s:]

    want, got = both(cuda, 16, precision, make, shift)
    assert_same(got, want, "letterbox_images_nhwc")
