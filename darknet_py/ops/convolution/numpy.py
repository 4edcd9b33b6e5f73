"""NumpyBackend's convolution backward products as whole-batch ops: the reference of
the CUDA backend's implicit-GEMM kernels (conv_backward_*.cu). A mixin of
NumpyBackend; its layers keep Darknet's im2col + GEMM + col2im (conv_backward_implicit
is False here)."""

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import precision as precisions
from ...shapes import conv_out_size


def _batched(flat, batch, stride, rows, cols):
    """A writable (batch, rows, cols) view of per-image (rows x cols) blocks `stride` apart."""
    stride = stride or rows * cols
    if batch > 0 and flat.size < (batch - 1) * stride + rows * cols:
        raise ValueError(
            f"{batch} blocks of {rows}x{cols}, {stride} apart, exceed an array of {flat.size}"
        )
    isz = flat.itemsize
    return as_strided(flat, (batch, rows, cols), (stride * isz, cols * isz, isz))


def unfolded_weight_grad(
    be,
    precision,
    im,
    channels,
    height,
    width,
    ksize,
    stride,
    pad,
    dilation,
    batch,
    im_stride,
    delta,
    filters,
    weight_updates,
    col,
):
    """conv_weight_grad_unfolded as Darknet computes it, on any backend: im2col into col,
    then weight_updates += delta @ col^T in gemm (fp32) or gemm_lowp."""
    out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
    n, k = channels * ksize * ksize, batch * out_h * out_w
    be.im2col(im, channels, height, width, ksize, stride, pad, dilation, col, batch, im_stride)
    if precision == precisions.DEFAULT:
        be.gemm(False, True, filters, n, k, 1.0, delta, k, col, k, 1.0, weight_updates, n)
    else:
        be.gemm_lowp(
            precision, False, True, filters, n, k, 1.0, delta, k, col, k, 1.0, weight_updates, n
        )


class NumpyConvBackward:
    """conv_backward_implicit, conv_weight_grad, conv_data_grad,
    conv_weight_grad_unfolded."""

    def conv_backward_implicit(
        self, precision, batch, channels, height, width, ksize, stride, pad, dilation, filters
    ):
        """(weight gradient, data gradient): whether a convolution group's backward runs
        them as conv_weight_grad and conv_data_grad (no im2col buffer). Here never: the CPU
        keeps Darknet's im2col + GEMM + col2im per chunk of images, whose sums the
        fixtures pin."""
        return False, False

    def conv_weight_grad_unfolded(
        self,
        precision,
        im,
        channels,
        height,
        width,
        ksize,
        stride,
        pad,
        dilation,
        batch,
        im_stride,
        delta,
        filters,
        weight_updates,
        col,
    ):
        """A convolution group's weight gradient over `batch` images through im2col (the
        path conv_backward_implicit does not take): weight_updates (filters x
        channels*ksize^2) += delta (filters x batch*positions: the images' deltas side by
        side, as the layer moves them) @ im2col(images)^T, the operands rounded to
        `precision` (fp32: Darknet's gemm). col: an fp32 workspace of at least
        channels*ksize^2 x batch*positions, which this may unfold the images into."""
        unfolded_weight_grad(
            self,
            precision,
            im,
            channels,
            height,
            width,
            ksize,
            stride,
            pad,
            dilation,
            batch,
            im_stride,
            delta,
            filters,
            weight_updates,
            col,
        )

    def _rounded(self, x, precision):
        if precision == precisions.DEFAULT:
            return x
        return precisions.round_to(x, precision).astype(self.dtype)

    def _delta_matrix(self, delta, delta_stride, batch, filters, positions, precision):
        """The delta of `batch` images as filters x (batch * positions), rounded."""
        d = _batched(delta, batch, delta_stride, filters, positions)
        return self._rounded(d.transpose(1, 0, 2).reshape(filters, batch * positions), precision)

    def conv_weight_grad(
        self,
        precision,
        delta,
        delta_stride,
        im,
        im_stride,
        channels,
        height,
        width,
        ksize,
        stride,
        pad,
        dilation,
        batch,
        filters,
        weight_updates,
    ):
        """weight_updates[f * k + j] += sum over images b and output positions p of
        delta[b * delta_stride + f * positions + p] * col[j, b, p] (col: im2col of the
        images, `im_stride` apart; k = channels * ksize * ksize; strides 0: packed), both
        operands rounded to `precision`: one convolution group's weight gradient."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        positions, k = out_h * out_w, channels * ksize * ksize
        col = np.empty(k * batch * positions, dtype=self.dtype)
        self.im2col(
            im, channels, height, width, ksize, stride, pad, dilation, col, batch, im_stride
        )
        d = self._delta_matrix(delta, delta_stride, batch, filters, positions, precision)
        col = self._rounded(col.reshape(k, batch * positions), precision)
        weight_updates[: filters * k].reshape(filters, k)[...] += d @ col.T

    def conv_data_grad(
        self,
        precision,
        weights,
        filters,
        delta,
        delta_stride,
        channels,
        height,
        width,
        ksize,
        stride,
        pad,
        dilation,
        batch,
        dx,
        dx_stride,
        accumulate,
    ):
        """dx (images `dx_stride` apart, `channels` of them from its start) = col2im of
        weights^T (k x filters) @ delta, operands rounded to `precision`; accumulate: added
        to dx, else written over it (the fork's CPU col2im clears the image first)."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        positions, k = out_h * out_w, channels * ksize * ksize
        w = self._rounded(np.asarray(weights[: filters * k]).reshape(filters, k), precision)
        d = self._delta_matrix(delta, delta_stride, batch, filters, positions, precision)
        col = np.ascontiguousarray(w.T @ d, dtype=self.dtype).reshape(-1)
        if not accumulate:
            _batched(dx, batch, dx_stride, channels, height * width)[...] = 0
        self.col2im(
            col, channels, height, width, ksize, stride, pad, dilation, dx, batch, dx_stride
        )
