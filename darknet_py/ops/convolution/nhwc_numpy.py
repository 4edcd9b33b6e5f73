"""The NumPy reference of the channels-last 16-bit convolution forward (issue 42): a mixin of
NumpyBackend, the reference of ops/convolution/nhwc.py's wgmma kernel (conv_nhwc.cu).

16-bit arrays are NumpyBackend's storage_zeros arrays (float32 values already rounded to
fp16 or bf16, StoredArray); the products are computed in fp32 from those values, one
matrix product per filter tap, and the stored result rounded to the 16 bits
(precision.round_to: fp16 by NumPy's float16, bf16 to nearest even on the fp32 bits)."""

import numpy as np

from ... import activations
from ... import precision as precisions
from .nhwc_common import check_forward, check_pack, pack_host


class NumpyConvNhwc:
    """pack_nhwc_weights, conv_nhwc_forward."""

    def pack_nhwc_weights(self, weights, cout, c, ksize, cx, precision):
        """Darknet's fp32 weights [cout, c, ksize, ksize] as a 16-bit array (storage_zeros
        at `precision`) [cout, ksize, ksize, cx], rounded, zeros in channels c..cx-1:
        conv_nhwc_forward's weights."""
        check_pack(cout, c, ksize, cx, precision)
        packed = pack_host(weights, int(cout), int(c), int(ksize), int(cx)).reshape(-1)
        kept = self.storage_zeros(packed.size, precision)
        kept[...] = precisions.round_to(packed, precision)
        return kept

    def conv_nhwc_forward(
        self,
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
        bias=None,
        activation="linear",
        stats=None,
        dilation=1,
    ):
        """A convolution over 16-bit NHWC images (x: [batch, h, w, cx], cx the pixel pitch,
        padded channels zero) with packed 16-bit weights [cout, ksize, ksize, cx]
        (pack_nhwc_weights), Darknet's geometry (out = (in + 2 pad - ksize) / stride + 1,
        the window's corner at -pad): out[pixel, out_offset + o] = activation(sum + bias[o])
        rounded to `precision`, for the out_h x out_w pixels of each image, rows
        `out_pitch` apart; the other channels of out untouched. bias: fp32 [cout] or None;
        activation one of precision.EPILOGUE_ACTIVATIONS; stats: None or (sums, squares),
        fp32 [cout] arrays each channel's sum and sum of squares of the stored (rounded)
        values are added into. dilation: 1 only."""
        out_h, out_w = check_forward(
            self,
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
        )
        images = np.asarray(x[: batch * h * w * cx], dtype=np.float32).reshape(batch, h, w, cx)
        filters = np.asarray(weights[: cout * ksize * ksize * cx], dtype=np.float32)
        filters = filters.reshape(cout, ksize, ksize, cx)
        padded = np.zeros((batch, h + 2 * pad, w + 2 * pad, cx), dtype=np.float32)
        padded[:, pad : pad + h, pad : pad + w] = images
        acc = np.zeros((batch * out_h * out_w, cout), dtype=np.float32)
        reach_y, reach_x = stride * (out_h - 1) + 1, stride * (out_w - 1) + 1
        for ky in range(ksize):
            for kx in range(ksize):
                window = padded[:, ky : ky + reach_y : stride, kx : kx + reach_x : stride]
                acc += window.reshape(-1, cx) @ filters[:, ky, kx, :].T
        if bias is not None:
            acc += np.asarray(bias[:cout], dtype=np.float32)
        if activation != "linear":
            acc = activations.activate(acc, activation).astype(np.float32)
        kept = precisions.round_to(acc, precision)
        rows = out[: batch * out_h * out_w * out_pitch].reshape(-1, out_pitch)
        rows[:, out_offset : out_offset + cout] = kept
        if stats is not None:
            sums, squares = stats
            wide = kept.astype(np.float64)
            sums[:cout] += wide.sum(axis=0).astype(sums.dtype)
            squares[:cout] += (wide * wide).sum(axis=0).astype(squares.dtype)
