"""The NumPy reference of the convolution ops (mixed into NumpyBackend): NumpyConv (the
GEMMs, in fixed tiles of single-threaded BLAS calls; the reduced-precision GEMM and
convolution emulated; im2col/col2im) and NumpyConvBackward (the backward products as
whole-batch ops: the reference of the CUDA backend's implicit-GEMM kernels,
conv_backward_*.cu; its layers keep Darknet's im2col + GEMM + col2im: conv_backward_implicit
is False here)."""

import numpy as np
from numpy.lib.stride_tricks import as_strided

from ... import activations
from ... import precision as precisions
from ...backends.cpu_threads import GRAIN_FLOATS, blas_threads, parallel
from ...shapes import conv_out_size, conv_strides
from ..common.numpy import matrix


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


class NumpyConv:
    """gemm, gemm_bias_activate, gemm_lowp, pack_weights, conv_forward, im2col, col2im."""

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """C = alpha * op(A) @ op(B) + beta * C, row-major, as Darknet's gemm().

        op(A) is m x k (A stored k x m with leading dim lda when ta), op(B) is k x n.
        """
        A = matrix(a, 0, k, m, lda).T if ta else matrix(a, 0, m, k, lda)
        B = matrix(b, 0, n, k, ldb).T if tb else matrix(b, 0, k, n, ldb)
        C = matrix(c, 0, m, n, ldc)
        alpha, beta = self.dtype.type(alpha), self.dtype.type(beta)
        # Fixed tiles of C, each one single-threaded BLAS call: OpenBLAS's sums depend on
        # how many threads split a product, and the thread count here follows the
        # machine's load (cpu_threads.threads_now), so one product split its own way would
        # give other last bits under load. Threads only decide which thread computes which
        # tile. The caller holds BLAS at one thread for the whole product too: OpenBLAS's
        # pthreads builds (NumPy's wheels) keep one count for the process, so a pool thread
        # leaving its tiles would otherwise let BLAS split a tile another is still on.
        col_tiles = -(-n // _GEMM_COLUMNS)
        row_tiles = -(-m // _GEMM_ROWS) if col_tiles == 1 else 1
        rows = _GEMM_ROWS if row_tiles > 1 else m

        def tiles(t0, t1):
            with blas_threads(1):  # this thread's own count, where the build keeps one
                for t in range(t0, t1):
                    row, col = divmod(t, col_tiles)
                    i, j = row * rows, col * _GEMM_COLUMNS
                    _gemm_tile(
                        A[i : i + rows],
                        B[:, j : j + _GEMM_COLUMNS],
                        C[i : i + rows, j : j + _GEMM_COLUMNS],
                        alpha,
                        beta,
                    )

        with blas_threads(1):
            parallel(row_tiles * col_tiles, tiles, 1)

    def gemm_bias_activate(self, m, n, k, a, lda, b, ldb, c, ldc, biases, activation):
        """C = activation(A @ B + biases[row]) (A m x k, B k x n, row-major): a convolution's
        inference forward with its bias (batch norm folded in) and activation, which the
        GPU applies in the GEMM's epilogue. Here gemm, then bias_activate: the same values
        as the two ops called in turn."""
        self.gemm(False, False, m, n, k, 1.0, a, lda, b, ldb, 0.0, c, ldc)
        if ldc == n:
            self.bias_activate(c, biases, 1, m, n, activation)
            return
        for row in range(m):
            self.bias_activate(c[row * ldc :], biases[row:], 1, 1, n, activation)

    def gemm_lowp(self, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """gemm with op(A) and op(B) rounded to `precision` (precision.round_to) and the
        products summed in this backend's float type."""
        A = matrix(a, 0, k, m, lda).T if ta else matrix(a, 0, m, k, lda)
        B = matrix(b, 0, n, k, ldb).T if tb else matrix(b, 0, k, n, ldb)
        A = precisions.round_to(A, precision).astype(self.dtype)
        B = precisions.round_to(B, precision).astype(self.dtype)
        C = matrix(c, 0, m, n, ldc)
        prod = self.dtype.type(alpha) * (A @ B)
        C[...] = prod if beta == 0 else self.dtype.type(beta) * C + prod

    def pack_weights(self, weights, rows, k, precision):
        """A convolution group's weights (rows x k) converted once for conv_forward."""
        values = precisions.round_to(np.asarray(weights[: rows * k]).reshape(rows, k), precision)
        return precisions.PackedWeights(values.astype(self.dtype), rows, k, k, precision)

    def conv_forward(
        self,
        packed,
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
        biases,
        activation,
        out,
        out_stride,
        out_precision="fp32",
    ):
        """One group of a convolution at packed.precision, im2col read in place (the GPU
        has no col buffer): out[b * out_stride + f * positions + p] = activation(sum_k
        W[f, k] col[k, b, p] + biases[f]) for f < packed.rows; biases None: none;
        activation one of precision.EPILOGUE_ACTIVATIONS. out_precision fp16/bf16 (the
        packed precision's own): out is storage_zeros' array, the values rounded to it (a
        batch-normalised layer's x)."""
        if activation not in precisions.EPILOGUE_ACTIVATIONS:
            raise ValueError(
                f"conv_forward applies {', '.join(precisions.EPILOGUE_ACTIVATIONS)}, "
                f"not {activation}"
            )
        stored = precisions.storage(out_precision)
        if stored != precisions.DEFAULT and out_precision != packed.precision:
            raise ValueError(
                f"conv_forward at {packed.precision} writes fp32 or "
                f"{packed.precision}, not {out_precision}"
            )
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        positions = out_h * out_w
        if batch > 0 and (batch - 1) * out_stride + packed.rows * positions > out.size:
            raise ValueError(
                f"conv_forward: {batch} outputs {out_stride} apart exceed an array of {out.size}"
            )
        col = np.empty(packed.k * batch * positions, dtype=self.dtype)
        self.im2col(
            im, channels, height, width, ksize, stride, pad, dilation, col, batch, im_stride
        )
        col = precisions.round_to(col, packed.precision).astype(self.dtype)
        prod = packed.data.astype(self.dtype) @ col.reshape(packed.k, batch * positions)
        if biases is not None:
            prod += np.asarray(biases[: packed.rows], dtype=self.dtype).reshape(-1, 1)
        prod = activations.activate(prod, activation) if activation != "linear" else prod
        if stored != precisions.DEFAULT:
            prod = precisions.round_to(prod, stored)
        view = as_strided(
            out,
            (batch, packed.rows, positions),
            (out_stride * out.itemsize, positions * out.itemsize, out.itemsize),
        )
        view[...] = prod.reshape(packed.rows, batch, positions).transpose(1, 0, 2)

    def im2col(
        self, im, channels, height, width, ksize, stride, pad, dilation, col, batch=1, im_stride=0
    ):
        """Unfold images (channels x height x width each, `im_stride` apart; 0: packed)
        into col, laid out (channels*k*k) x batch x (out_h*out_w): one GEMM then covers
        the whole batch. With batch=1 that is Darknet's im2col of one image. stride: an
        int, or (stride_y, stride_x)."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        sy, sx = conv_strides(stride)
        images = _images(im, batch, im_stride, channels, height, width)
        rows = ksize * ksize * batch * out_h * out_w  # col floats per channel

        def unfold(c0, c1):  # channels [c0, c1) fill col rows [c0*k*k, c1*k*k)
            part = images[:, c0:c1]
            if pad:
                padded = np.zeros(
                    (batch, c1 - c0, height + 2 * pad, width + 2 * pad), dtype=im.dtype
                )
                padded[:, :, pad : pad + height, pad : pad + width] = part
                part = padded
            sb, sc, sh, sw = part.strides
            windows = as_strided(
                part,
                (c1 - c0, ksize, ksize, batch, out_h, out_w),
                (sc, sh * dilation, sw * dilation, sb, sh * sy, sw * sx),
            )
            # Assign through a shaped view of col: reshape(-1) of the windows copies twice.
            col[c0 * rows : c1 * rows].reshape(windows.shape)[...] = windows

        parallel(channels, unfold, max(1, GRAIN_FLOATS // rows))

    def col2im(
        self, col, channels, height, width, ksize, stride, pad, dilation, im, batch=1, im_stride=0
    ):
        """Fold col (laid out as im2col writes it) back, *adding* into the images
        (the adjoint of im2col)."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        sy, sx = conv_strides(stride)
        cols = col[: channels * ksize * ksize * batch * out_h * out_w].reshape(
            channels, ksize, ksize, batch, out_h, out_w
        )
        padded = np.zeros((batch, channels, height + 2 * pad, width + 2 * pad), dtype=im.dtype)
        for ki in range(ksize):
            for kj in range(ksize):
                r0, c0 = ki * dilation, kj * dilation
                padded[
                    :, :, r0 : r0 + sy * (out_h - 1) + 1 : sy, c0 : c0 + sx * (out_w - 1) + 1 : sx
                ] += cols[:, ki, kj].transpose(1, 0, 2, 3)
        images = _images(im, batch, im_stride, channels, height, width)
        images += padded[:, :, pad : pad + height, pad : pad + width]


# The tiles of C a gemm computes in one BLAS call each (see NumpyBackend.gemm).
_GEMM_COLUMNS = 1024
_GEMM_ROWS = 128


def _gemm_tile(A, B, C, alpha, beta):
    """C = alpha * A @ B + beta * C for one tile."""
    if beta == 0 and alpha == 1:
        np.matmul(A, B, out=C)  # straight into C: no product temporary, no extra pass
        return
    prod = A @ B
    if beta == 0:
        C[...] = alpha * prod
        return
    if beta != 1:
        C *= beta
    C += alpha * prod


def _images(flat, batch, im_stride, channels, height, width):
    """A writable (batch, channels, height, width) view of images `im_stride` apart."""
    size = channels * height * width
    im_stride = im_stride or size
    if flat.size < (batch - 1) * im_stride + size:
        raise ValueError(
            f"{batch} images of {size} elements, {im_stride} apart, exceed an array of {flat.size}"
        )
    isz = flat.itemsize
    return as_strided(
        flat,
        (batch, channels, height, width),
        (im_stride * isz, height * width * isz, width * isz, isz),
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
