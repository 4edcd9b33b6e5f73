"""What both backends' channels-last 16-bit convolution forward (conv_nhwc_forward) share:
its argument checks, and the weights' packing on the host.

Layouts (issue 42):
  * images: 16-bit NHWC [batch, h, w, cx], cx the pixel pitch in elements (>= the channels,
    a multiple of 8 so each pixel's row is 16-byte aligned, as TMA wants); the padded
    channels hold zeros;
  * weights: 16-bit [cout, ksize, ksize, cx] (pack_nhwc_weights from Darknet's fp32
    [cout, c, ksize, ksize]), zeros in the padded channels: the GEMM's K runs (tap, channel);
  * output: 16-bit NHWC [batch, out_h, out_w, out_pitch], this layer's cout channels at
    [out_offset, out_offset + cout) of each pixel (a slice of a route's concatenation).
"""

import numpy as np

from ... import precision as precisions
from ...shapes import conv_out_size

HALF_PRECISIONS = ("fp16", "bf16")
PITCH_ALIGN = 8  # elements: 16-byte pixel rows
STRIDES = (1, 2)


class NhwcConvError(ValueError):
    """conv_nhwc_forward or pack_nhwc_weights given arguments it cannot take (one line
    naming the argument and what it takes)."""


def _positive(what, value, least=1):
    if int(value) != value or value < least:
        raise NhwcConvError(f"conv_nhwc_forward: {what} must be an integer >= {least}, got {value}")
    return int(value)


def check_precision(op, precision):
    if precision not in HALF_PRECISIONS:
        raise NhwcConvError(f"{op}: precision must be fp16 or bf16, got {precision!r}")


def check_pitch(op, cx, channels=None):
    """cx: a multiple of PITCH_ALIGN, at least `channels` where given."""
    if int(cx) != cx or cx < 1 or cx % PITCH_ALIGN:
        raise NhwcConvError(
            f"{op}: the pixel pitch cx must be a positive multiple of {PITCH_ALIGN}, got {cx}"
        )
    if channels is not None and cx < channels:
        raise NhwcConvError(f"{op}: the pixel pitch cx={cx} is under the {channels} channels")


def check_pack(cout, c, ksize, cx, precision):
    check_precision("pack_nhwc_weights", precision)
    for what, value in (("cout", cout), ("c", c), ("ksize", ksize)):
        if int(value) != value or value < 1:
            raise NhwcConvError(f"pack_nhwc_weights: {what} must be an integer >= 1, got {value}")
    check_pitch("pack_nhwc_weights", cx, c)


def pack_host(weights, cout, c, ksize, cx):
    """Darknet's fp32 weights [cout, c, ksize, ksize] (the first cout*c*ksize^2 values of
    `weights`) as float32 [cout, ksize, ksize, cx], zeros in channels c..cx-1 (not rounded)."""
    need = cout * c * ksize * ksize
    w = np.asarray(weights, dtype=np.float32).reshape(-1)
    if w.size < need:
        raise NhwcConvError(
            f"pack_nhwc_weights: {w.size} weights for cout={cout} x c={c} x "
            f"{ksize}x{ksize} ({need})"
        )
    packed = np.zeros((cout, ksize, ksize, cx), dtype=np.float32)
    packed[..., :c] = w[:need].reshape(cout, c, ksize, ksize).transpose(0, 2, 3, 1)
    return packed


def check_forward(
    be,
    precision,
    x,
    batch,
    h,
    w,
    cx,
    weights,
    cout,
    ksize,
    stride,
    pad,
    out,
    out_pitch,
    out_offset,
    bias,
    activation,
    stats,
    dilation,
):
    """Every check of conv_nhwc_forward (NhwcConvError: one line naming what is wrong);
    returns (out_h, out_w)."""
    op = "conv_nhwc_forward"
    check_precision(op, precision)
    if dilation != 1:
        raise NhwcConvError(f"{op}: dilation {dilation} is not supported (1 only)")
    batch, h, w = (_positive(n, v) for n, v in (("batch", batch), ("h", h), ("w", w)))
    cout, ksize = _positive("cout", cout), _positive("ksize", ksize)
    pad = _positive("pad", pad, least=0)
    check_pitch(op, cx)
    if stride not in STRIDES:
        raise NhwcConvError(f"{op}: stride must be 1 or 2, got {stride}")
    # TMA's im2col window corners: signed 8-bit offsets for 4-D images.
    if pad > 127 or ksize - 1 - pad > 128:
        raise NhwcConvError(
            f"{op}: ksize {ksize} with pad {pad} is beyond the im2col copies' range"
        )
    out_h, out_w = conv_out_size(h, w, ksize, stride, pad, 1)
    if out_h < 1 or out_w < 1:
        raise NhwcConvError(
            f"{op}: a {ksize}x{ksize} window with pad {pad} does not fit a {h}x{w} image"
        )
    out_pitch, out_offset = (
        _positive("out_pitch", out_pitch),
        _positive("out_offset", out_offset, 0),
    )
    if out_offset + cout > out_pitch:
        raise NhwcConvError(
            f"{op}: channels [{out_offset}, {out_offset + cout}) do not fit the "
            f"output's pitch {out_pitch}"
        )
    if activation not in precisions.EPILOGUE_ACTIVATIONS:
        raise NhwcConvError(
            f"{op}: activation must be one of "
            f"{', '.join(precisions.EPILOGUE_ACTIVATIONS)}, got {activation!r}"
        )
    for what, arr, need in (
        ("x", x, batch * h * w * cx),
        ("weights", weights, cout * ksize * ksize * cx),
        ("out", out, batch * out_h * out_w * out_pitch),
    ):
        kept = be.storage_of(arr)
        if kept != precision:
            raise NhwcConvError(
                f"{op}: {what} must be a {precision} array (storage_zeros), it is kept at {kept}"
            )
        if arr.size < need:
            raise NhwcConvError(f"{op}: {what} holds {arr.size} values, needs {need}")
    fp32 = [("bias", bias)] if bias is not None else []
    if stats is not None:
        if len(stats) != 2:
            raise NhwcConvError(f"{op}: stats must be (sums, squares) or None")
        fp32 += [("stats sums", stats[0]), ("stats squares", stats[1])]
    for what, arr in fp32:
        if be.storage_of(arr) != precisions.DEFAULT or np.dtype(arr.dtype) != be.dtype:
            raise NhwcConvError(f"{op}: {what} must be an fp32 array (the backend's float array)")
        if arr.size < cout:
            raise NhwcConvError(f"{op}: {what} holds {arr.size} values, needs {cout}")
    return out_h, out_w
