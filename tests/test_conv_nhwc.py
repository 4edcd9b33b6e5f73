"""The channels-last 16-bit convolution forward's NumPy reference (ops/convolution/nhwc_numpy.py)
and the weights' packing, on the CPU (issue 42).

The reference is checked against the NCHW path the networks run today (NumpyBackend's
conv_forward over the same 16-bit values, its output rounded to the same 16 bits): both
sum the same fp32 products in different orders, so a stored value may differ by one unit
in the last place of the 16-bit format, and few do. Tolerances: max |got - want| / max
|want| <= 2^-9 (fp16) and 2^-6 (bf16), two units at the top of the range, and at most 5%
of the values differing at all.
"""

import zlib

import numpy as np
import pytest

from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.ops.convolution.nhwc_common import NhwcConvError
from darknet_py.precision import round_to

HALF = ("fp16", "bf16")
TOL = {"fp16": 2.0**-9, "bf16": 2.0**-6}
# (batch, channels, cx, h, w, cout, ksize, stride, pad, out_pitch, out_offset, activation)
SHAPES = [
    (2, 3, 8, 13, 11, 32, 3, 1, 1, 32, 0, "leaky"),  # a first layer: 3 channels in a pitch of 8
    (1, 70, 72, 9, 10, 255, 1, 1, 0, 255, 0, "linear"),  # a head: 255 filters, 1x1
    (3, 16, 16, 12, 9, 40, 3, 2, 1, 96, 24, "mish"),  # stride 2 into a slice of a route's buffer
    (1, 24, 32, 7, 7, 19, 5, 1, 2, 40, 21, "swish"),  # 5x5, odd offset and pitch
    (2, 8, 8, 8, 8, 64, 3, 2, 0, 64, 0, "logistic"),  # stride 2, no padding
    (1, 5, 8, 6, 7, 9, 7, 1, 3, 16, 3, "relu"),  # 7x7
    (2, 64, 64, 5, 6, 30, 1, 2, 0, 30, 0, "leaky"),  # 1x1 stride 2
    (1, 20, 24, 4, 5, 12, 1, 1, 1, 12, 0, "linear"),  # 1x1 with padding (im2col, not the GEMM)
]


def rand(rng, n, scale=1.0):
    x = rng.uniform(-scale, scale, int(n)).astype(np.float32)
    x[x == 0] = 0.25
    return x


def stored(be, values, precision):
    """A 16-bit array (storage_zeros at precision) holding `values` rounded."""
    kept = be.storage_zeros(values.size, precision)
    be.copy_rounded(np.asarray(values, dtype=np.float32).reshape(-1), kept, precision)
    return kept


def nhwc_images(rng, batch, channels, cx, h, w):
    """Random NHWC images (padded channels zero) and the same values NCHW."""
    images = np.zeros((batch, h, w, cx), dtype=np.float32)
    images[..., :channels] = rand(rng, batch * h * w * channels).reshape(batch, h, w, channels)
    return images, np.ascontiguousarray(images[..., :channels].transpose(0, 3, 1, 2))


def nchw_reference(be, precision, nchw, weights, bias, shape):
    """NumpyBackend.conv_forward (the NCHW path) over the same 16-bit values: [pixels, cout]."""
    batch, channels, _, h, w, cout, ksize, stride, pad, _, _, activation = shape
    packed = be.pack_weights(weights, cout, channels * ksize * ksize, precision)
    out_h = (h + 2 * pad - ksize) // stride + 1
    out_w = (w + 2 * pad - ksize) // stride + 1
    out = be.storage_zeros(batch * cout * out_h * out_w, precision)
    im = round_to(nchw.reshape(-1), precision)
    positions = out_h * out_w
    be.conv_forward(
        packed, im, channels, h, w, ksize, stride, pad, 1, batch, 0, bias, activation, out,
        cout * positions, precision,
    )  # fmt: skip
    out = np.asarray(out).reshape(batch, cout, out_h * out_w)
    return out.transpose(0, 2, 1).reshape(-1, cout), out_h, out_w


def assert_close_16(got, want, precision, what):
    assert np.isfinite(got).all(), f"{what}: non-finite values (unwritten?)"
    scale = np.abs(want).max()
    err = np.abs(got - want).max() / scale
    assert err <= TOL[precision], f"{what}: max error {err:.3g} of the largest value"
    differing = np.mean(got != want)
    assert differing <= 0.05, f"{what}: {differing:.1%} of the values differ"


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[:10])) + s[-1])
def test_reference_matches_the_nchw_path(precision, shape):
    batch, channels, cx, h, w, cout, ksize, stride, pad, out_pitch, out_offset, activation = shape
    be = NumpyBackend()
    rng = np.random.default_rng(zlib.crc32(repr(shape).encode()))
    images, nchw = nhwc_images(rng, batch, channels, cx, h, w)
    weights = rand(rng, cout * channels * ksize * ksize, 0.5)
    bias = rand(rng, cout, 0.3)
    want, out_h, out_w = nchw_reference(be, precision, nchw, weights, bias, shape)
    x = stored(be, images, precision)
    packed = be.pack_nhwc_weights(weights, cout, channels, ksize, cx, precision)
    out = stored(be, np.full(batch * out_h * out_w * out_pitch, 7.0, np.float32), precision)
    be.conv_nhwc_forward(
        precision, x, batch, h, w, cx, packed, cout, ksize, stride, pad, out, out_pitch, out_offset,
        bias=bias, activation=activation,
    )  # fmt: skip
    rows = np.asarray(out).reshape(-1, out_pitch)
    assert_close_16(
        rows[:, out_offset : out_offset + cout], want, precision, f"{precision} {shape}"
    )
    # the other channels of the buffer are left as they were
    others = np.delete(rows, np.s_[out_offset : out_offset + cout], axis=1)
    assert (others == 7.0).all()
    # the stored values are the format's own
    kept = rows[:, out_offset : out_offset + cout]
    assert (round_to(kept, precision) == kept).all()


@pytest.mark.parametrize("precision", HALF)
def test_packing_puts_taps_outside_channels_and_zeros_the_pitch(precision):
    be = NumpyBackend()
    rng = np.random.default_rng(3)
    cout, c, k, cx = 5, 3, 3, 8
    weights = rand(rng, cout * c * k * k)
    kept = be.pack_nhwc_weights(weights, cout, c, k, cx, precision)
    assert kept.size == cout * k * k * cx and be.storage_of(kept) == precision
    packed = np.asarray(kept)
    grid = packed.reshape(cout, k, k, cx)
    darknet = weights.reshape(cout, c, k, k)
    for o in range(cout):
        for ch in range(c):
            for ky in range(k):
                for kx in range(k):
                    want = round_to(darknet[o, ch, ky, kx : kx + 1], precision)[0]
                    assert grid[o, ky, kx, ch] == want
    assert (grid[..., c:] == 0).all()
    # bf16 rounds to nearest even on the fp32 bits, fp16 as NumPy's float16
    assert (packed == round_to(packed, precision)).all()


@pytest.mark.parametrize("precision", HALF)
def test_statistics_are_added_from_the_stored_values(precision):
    be = NumpyBackend()
    rng = np.random.default_rng(5)
    batch, channels, cx, h, w, cout, out_pitch, out_offset = 2, 10, 16, 6, 5, 7, 12, 4
    images, _ = nhwc_images(rng, batch, channels, cx, h, w)
    x = stored(be, images, precision)
    packed = be.pack_nhwc_weights(rand(rng, cout * channels * 9), cout, channels, 3, cx, precision)
    out = be.storage_zeros(batch * h * w * out_pitch, precision)
    sums, squares = be.from_host(np.full(cout, 2.0)), be.from_host(np.full(cout, 3.0))
    be.conv_nhwc_forward(
        precision, x, batch, h, w, cx, packed, cout, 3, 1, 1, out, out_pitch, out_offset,
        stats=(sums, squares),
    )  # fmt: skip
    kept = (
        np.asarray(out).reshape(-1, out_pitch)[:, out_offset : out_offset + cout].astype(np.float64)
    )
    np.testing.assert_allclose(sums, 2.0 + kept.sum(axis=0), rtol=1e-6)
    np.testing.assert_allclose(squares, 3.0 + (kept * kept).sum(axis=0), rtol=1e-6)


def _call(
    be, precision="fp16", cx=8, stride=1, dilation=1, out_offset=0, x=None, activation="leaky"
):
    batch, h, w, cout, k = 1, 5, 5, 4, 3
    x = stored(be, np.ones(batch * h * w * cx), "fp16") if x is None else x
    packed = be.pack_nhwc_weights(np.ones(cout * 3 * k * k), cout, 3, k, max(cx, 8), "fp16")
    out = be.storage_zeros(batch * h * w * 8, "fp16")
    be.conv_nhwc_forward(
        precision, x, batch, h, w, cx, packed, cout, k, stride, 1, out, 8, out_offset,
        activation=activation, dilation=dilation,
    )  # fmt: skip


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"dilation": 2}, "dilation 2 is not supported"),
        ({"stride": 3}, "stride must be 1 or 2, got 3"),
        ({"cx": 12}, "pitch cx must be a positive multiple of 8, got 12"),
        ({"precision": "fp32"}, "precision must be fp16 or bf16"),
        ({"out_offset": 6}, r"channels \[6, 10\) do not fit the output's pitch 8"),
        ({"x": np.ones(200, np.float32)}, "x must be a fp16 array"),
        ({"activation": "elu"}, "activation must be one of"),
    ],
)
def test_bad_arguments_are_refused_in_one_line(kwargs, message):
    with pytest.raises(NhwcConvError, match=message) as caught:
        _call(NumpyBackend(), **kwargs)
    assert "\n" not in str(caught.value)


def test_packing_refuses_a_pitch_under_the_channels():
    with pytest.raises(NhwcConvError, match="pitch cx=8 is under the 9 channels"):
        NumpyBackend().pack_nhwc_weights(np.ones(9 * 9), 1, 9, 3, 8, "bf16")


# ---- the CUDA launcher's host side, without a GPU ------------------------------------

_C_CTYPES = {"int": "c_int", "long long": "int64", "TensorMap": "c_ubyte_Array_128"}


def _kernel_parameters(source, macro):
    """[C type] of the parameters of the kernels `macro` defines in conv_nhwc.cu."""
    body = source[source.index(f"#define {macro}(") :]
    params = body[body.index("NAME(") + 5 : body.index(")", body.index("NAME("))]
    types = []
    for p in params.replace("\\", " ").split(","):
        words = [w for w in p.split() if w not in ("const", "__grid_constant__")]
        types.append("pointer" if "*" in p else " ".join(words[:-1]))
    return types


def _ctype_name(value):
    """A launch argument's kind: pointers go as unsigned 64-bit, long long as signed."""
    name = type(value).__name__
    if name in ("c_ulong", "c_ulonglong"):
        return "pointer"
    return "int64" if name in ("c_long", "c_longlong") else name


class _FakeKernels:
    cluster = 2
    max_clusters = {64: 66, 128: 66, 256: 66}
    driver_needs_fix = False

    @staticmethod
    def conv_name(precision, width):
        return f"conv_nhwc_{'f16' if precision == 'fp16' else 'bf16'}_n{width}"


class _Arr:
    def __init__(self, ptr):
        self.ptr = ptr


@pytest.mark.parametrize(
    "shape, mode, width",
    [
        ((2, 8, 8, 32, 3, 1, 1), 2, 64),  # cx 8: 8-channel chunks; 32 filters: 64 wide
        ((2, 64, 64, 128, 3, 2, 1), 1, 128),  # 64-channel slices
        ((2, 72, 72, 255, 1, 1, 0), 0, 256),  # 1x1 stride 1: plain GEMM
        ((2, 16, 16, 300, 1, 2, 0), 2, 256),  # 1x1 stride 2: im2col
    ],
)
def test_launcher_passes_what_the_kernel_declares(shape, mode, width, monkeypatch):
    from pathlib import Path

    from darknet_py.ops.convolution import nhwc, wgmma

    batch, h, cx, cout, k, stride, pad = shape
    launches, maps = [], []
    monkeypatch.setattr(wgmma, "_launch", lambda *a, **kw: launches.append((a, kw)))
    blank = (nhwc.ctypes.c_ubyte * 128)()

    def fake_map(kind):
        def make(*args, **kwargs):
            maps.append((kind, args, kwargs))
            return blank

        return make

    monkeypatch.setattr(nhwc, "tiled_map", fake_map("tiled"))
    monkeypatch.setattr(nhwc, "im2col_map", fake_map("im2col"))
    out_h = (h + 2 * pad - k) // stride + 1
    nhwc.launch_forward(
        None, _FakeKernels(), "bf16", _Arr(256), batch, h, h, cx, _Arr(512), cout, k, stride,
        pad, _Arr(1024), cout + 1, 1, None, "mish", None, out_h, out_h,
    )  # fmt: skip
    ((args, kwargs),) = launches
    be, kern, name, grid, block, *params = args
    assert name == f"conv_nhwc_bf16_n{width}" and block == (nhwc.THREADS,)
    assert kwargs["shared"] == nhwc.shared_bytes(width) <= 227 * 1024
    source = (Path(nhwc.__file__).parent / "conv_nhwc.cu").read_text()
    declared = _kernel_parameters(source, "CONV_NHWC_KERNEL")
    passed = [_ctype_name(p) for p in params]
    assert passed == [_C_CTYPES.get(t, t) for t in declared]
    values = [getattr(p, "value", None) for p in params]
    assert values[2] == mode and values[3] == batch * out_h * out_h and values[4] == cout
    assert values[5] == (cx // 8 if mode == 2 else -(-cx // 64))
    assert values[11:14] == [1024, cout + 1, 1] and values[14] == 0  # out, pitch, offset, no bias
    pairs = -(-batch * out_h * out_h // 256) * -(-cout // width)
    assert grid == (2 * min(pairs, 66),)
    kinds = [m[0] for m in maps]
    assert kinds == (["tiled", "tiled"] if mode == 0 else ["im2col", "tiled"])
    weights_dims, weights_box = maps[-1][1][2], maps[-1][1][3]
    if mode == 2:  # the weights as [cout][taps * cx]
        assert weights_dims == (k * k * cx, cout) and weights_box == (64, width // 2)
    else:
        assert weights_dims == (cx, k * k, cout) and weights_box == (64, 1, width // 2)


def test_pack_kernel_declaration_matches_the_launch():
    from pathlib import Path

    from darknet_py.ops.convolution import nhwc

    source = (Path(nhwc.__file__).parent / "conv_nhwc.cu").read_text()
    start = source.index("pack_nhwc_weights_f16(")
    params = source[start + len("pack_nhwc_weights_f16(") : source.index(")", start)]
    assert [p.split()[-1].lstrip("*") for p in params.split(",")] == [
        "weights", "cout", "c", "taps", "cx", "dst",
    ]  # fmt: skip
