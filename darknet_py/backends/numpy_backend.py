"""The NumPy backend: the reference implementation of every op a layer uses.

Contract shared with the CUDA backend (backends/cuda_backend.py):
  * Every array is 1-D and contiguous (NumPy ndarray here, GPUArray there);
    a flat slice ``a[i:j]`` is a view on both. Layers keep their shapes as ints.
  * Ops work in place on the arrays they are given and return nothing,
    unless documented otherwise. Names and arguments follow Darknet's
    blas.h / im2col.h / gemm.h so a Darknet reader finds their way.
  * ``delta`` arrays hold Darknet's delta: minus the gradient of the loss.
  * Where Darknet's numbers depend on its order of operations or on a quirk of its CPU code
    (lrn_forward's running window sum, binarize's ``> 0``, logistic_x_ent without an
    epsilon), the op's docstring here says so and both backends follow it.
  * On the CPU, GEMMs (in fixed tiles of single-threaded BLAS calls, so that their bits do
    not depend on the thread count) and the element-wise and copy work of inference
    (im2col, bias + activation, maxpool) are split over the cores by cpu_threads.parallel.
"""

import threading
import time

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import activations
from .. import precision as precisions
from ..draws import uniform_hash
from ..image import from_bgr, letterbox, resize_image, sized_shape
from ..losses import detection as detection_loss
from ..losses import region as region_loss
from ..losses.yolo import image_truths, yolo_loss
from ..ops.convolution.nhwc_numpy import NumpyConvNhwc
from ..ops.convolution.numpy import NumpyConvBackward
from ..ops.normalization.numpy import NumpyBatchnorm, one_storage
from ..ops.optimizers.numpy import NumpyOptimizerOps
from ..shapes import conv_out_size, conv_strides
from .cpu_threads import GRAIN_FLOATS, blas_threads, parallel
from .pinning import unpin_nothing


class NumpyBackend(
    NumpyBatchnorm, NumpyConvBackward, NumpyConvNhwc, NumpyOptimizerOps
):  # ops in their files
    name = "cpu"

    def __init__(self, dtype=np.float32, seed=0):
        # dtype=float64 is used by the gradient-check tests.
        self.dtype = np.dtype(dtype)
        self.rng = np.random.default_rng(seed)

    # ---- memory -------------------------------------------------------------
    def zeros(self, n):
        return np.zeros(int(n), dtype=self.dtype)

    def empty(self, n):
        return np.empty(int(n), dtype=self.dtype)

    def int_zeros(self, n):
        """An integer array (maxpool argmax indexes); int32 on the GPU."""
        return np.zeros(int(n), dtype=np.int64)

    def from_host(self, host):
        """A new backend array holding a copy of `host` (flattened)."""
        return np.array(host, dtype=self.dtype).reshape(-1)

    def to_host(self, arr):
        """A NumPy copy of `arr` (an integer array stays integer: int64)."""
        return np.array(arr, dtype=self.dtype if arr.dtype.kind == "f" else np.int64)

    def download_async(self, arr, out):
        """Start copying `arr` into host array `out` (contiguous, arr.size elements of
        arr's dtype) after the work queued so far; finish_download(the returned handle)
        returns once out holds the values. Here the copy is made at once."""
        if out.size != arr.size or out.dtype != arr.dtype or not out.flags.c_contiguous:
            raise ValueError(
                f"download_async: {out.size} {out.dtype} for an array of {arr.size} {arr.dtype}"
            )
        out.reshape(-1)[...] = arr.reshape(-1)

    def finish_download(self, download):
        """Return once the download_async `download` has filled its host array."""

    def write(self, arr, host):
        """Copy host data (any shape, arr.size elements) into an existing array (cast to
        the array's dtype: an int_zeros array stays integer)."""
        arr[...] = np.asarray(host, dtype=arr.dtype).reshape(-1)

    # Asynchronous uploads: the CUDA backend copies a coming batch on a copy stream while
    # the current one computes. Here the CPU reads host memory itself: nothing to pin, and
    # an "upload" is the host array, copied once where the network takes its input.
    def pin(self, host):
        """Page-lock the memory of host array `host` so uploads from it run asynchronously
        at full speed; returns a function that unpins it (call it before the memory goes)."""
        return unpin_nothing

    def upload_async(self, host):
        """(array, upload): a backend array that receives host's values (flattened), and
        the upload filling it, which starts after the work queued so far. Ops queued after
        wait_upload(upload) see the values; `host` must stay unchanged until
        finish_upload(upload) returns. Here the array is a view of `host`, not a copy."""
        return np.asarray(host, dtype=self.dtype).reshape(-1), None

    def upload_bytes_async(self, host):
        """upload_async for a uint8 host array: the backend array holds its bytes (here a
        view of `host`)."""
        host = np.asarray(host)
        if host.dtype != np.uint8:
            raise TypeError(f"upload_bytes_async takes uint8 arrays, got {host.dtype}")
        return host.reshape(-1), None

    def letterbox_images(self, src, shapes, offsets, width, height, letter, out):
        """out (N, 3, height, width) = the OpenCV BGR uint8 (rows, columns, 3) images in
        `src` (a uint8 array, image i's bytes from offsets[i]) as detect sizes a photo:
        image.from_bgr, then image.letterbox (letter) or image.resize_image. The GPU does
        it after uploading the bytes (a quarter of the float input's)."""
        plane = 3 * height * width
        for i, ((ih, iw), offset) in enumerate(zip(shapes, offsets)):
            sized_shape(iw, ih, width, height, letter)  # refuses a degenerate letterbox
            bgr = src[int(offset) : int(offset) + ih * iw * 3].reshape(ih, iw, 3)
            img = from_bgr(bgr, 3)
            sized = letterbox(img, width, height) if letter else resize_image(img, width, height)
            out[i * plane : (i + 1) * plane] = sized.reshape(-1)

    def wait_upload(self, upload):
        """Ops queued from now on run after `upload` has landed (no wait on the host)."""

    def finish_upload(self, upload):
        """Return once `upload` has read its host memory (which may then change)."""

    def synchronize(self):
        pass

    def capture(self, fn):
        """A callable doing fn's work at each call. The CUDA backend records fn's kernels
        once as a graph and replays them; here there is nothing to record, so fn runs each
        time. Either way fn must queue the same work whenever it runs, and what it does on
        the host (Python state) happens once on the GPU, at capture."""
        return fn

    def timer(self):
        """A stopwatch for benchmarks: start(), then stop() returns the seconds between,
        all queued work included (the wall clock here; CUDA events on the GPU)."""
        return _WallTimer()

    @property
    def peak_allocated_bytes(self):
        """Peak bytes of device memory; None: the NumPy backend has no device memory."""
        return None

    def reset_peak_allocated(self):
        """Start peak_allocated_bytes again from the bytes live now: nothing to do here."""

    def fill(self, arr, value):
        """Every element set to value (a 16-bit StoredArray: value rounded to its storage)."""
        kept = self.storage_of(arr)
        arr.fill(
            value
            if kept == precisions.DEFAULT
            else precisions.round_to(np.float32([value]), kept)[0]
        )

    def copy(self, src, dst):
        """dst <- src, arrays of one storage (storage_of; ValueError naming both otherwise, as
        the CUDA backend's byte copy): into a 16-bit StoredArray the values stored rounded
        (already so when src is one; copy_rounded rounds fp32 values into one)."""
        kept = one_storage("copy", self.storage_of, src=src, dst=dst)
        _store(dst, src, kept)

    def copy_blocks(
        self,
        src,
        src_offset,
        src_stride,
        dst,
        dst_offset,
        dst_stride,
        width,
        rows,
        accumulate=False,
        planes=1,
        src_plane_stride=0,
        dst_plane_stride=0,
    ):
        """For p in planes, r in rows: dst[dst_offset + p*dst_plane_stride + r*dst_stride : +width]
        (+)= src[src_offset + p*src_plane_stride + r*src_stride : +width].

        Route layers use it to concatenate per-image blocks (and to route deltas back);
        convolutions use the planes to move between (filters, batch, positions) and
        (batch, filters, positions) layouts.
        """
        kept = one_storage("copy_blocks", self.storage_of, src=src, dst=dst)
        s = _blocks(src, src_offset, planes, rows, width, src_plane_stride, src_stride)
        d = _blocks(dst, dst_offset, planes, rows, width, dst_plane_stride, dst_stride)
        if accumulate and kept != precisions.DEFAULT:  # the fp32 sum, rounded once
            d[...] = precisions.round_to(np.asarray(d) + np.asarray(s), kept).reshape(d.shape)
        elif accumulate:
            d += s
        else:
            d[...] = s

    # ---- BLAS-like ----------------------------------------------------------
    def axpy(self, alpha, x, y):
        """y += alpha * x"""
        y += self.dtype.type(alpha) * x

    def axpy_array(self, alpha, x, y):
        """y += alpha[0] * x, alpha a one-element array (a value the GPU reads when the
        kernel runs, so that a captured step sees the one written before each replay)."""
        y += alpha[0] * x

    def scal(self, alpha, x):
        """x *= alpha"""
        x *= self.dtype.type(alpha)

    def constrain(self, limit, x):
        """x = min(limit, max(-limit, x)) (element-wise; C's fminf/fmaxf: NaN gives a bound)"""
        np.fmin(limit, np.fmax(-limit, x), out=x)

    def mul(self, x, y):
        """y *= x (element-wise)"""
        y *= x

    def mul_add(self, a, b, y):
        """y += a * b (element-wise): the product rule of [sam]'s backward."""
        y += a * b

    def sum(self, x):
        """Sum of all elements as a Python float (a host sync on the GPU)."""
        return float(np.sum(x, dtype=np.float64))

    def sum_into(self, x, out):
        """out[0] = the sum of x (accumulated in double), without a host sync on the GPU."""
        out[0] = np.sum(x, dtype=np.float64)

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """C = alpha * op(A) @ op(B) + beta * C, row-major, as Darknet's gemm().

        op(A) is m x k (A stored k x m with leading dim lda when ta), op(B) is k x n.
        """
        A = _matrix(a, 0, k, m, lda).T if ta else _matrix(a, 0, m, k, lda)
        B = _matrix(b, 0, n, k, ldb).T if tb else _matrix(b, 0, k, n, ldb)
        C = _matrix(c, 0, m, n, ldc)
        alpha, beta = self.dtype.type(alpha), self.dtype.type(beta)
        # Fixed tiles of C, each one single-threaded BLAS call: OpenBLAS's sums depend on
        # how many threads split a product, and the thread count here follows the
        # machine's load (cpu_threads.threads_now), so one product split its own way would
        # give other last bits under load. Threads only decide which thread computes which
        # tile.
        col_tiles = -(-n // _GEMM_COLUMNS)
        row_tiles = -(-m // _GEMM_ROWS) if col_tiles == 1 else 1
        rows = _GEMM_ROWS if row_tiles > 1 else m

        def tiles(t0, t1):
            with blas_threads(1):
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

    # ---- reduced precision (tensor cores on the GPU; emulated here) ---------------
    def gemm_lowp(self, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """gemm with op(A) and op(B) rounded to `precision` (precision.round_to) and the
        products summed in this backend's float type."""
        A = _matrix(a, 0, k, m, lda).T if ta else _matrix(a, 0, m, k, lda)
        B = _matrix(b, 0, n, k, ldb).T if tb else _matrix(b, 0, k, n, ldb)
        A = precisions.round_to(A, precision).astype(self.dtype)
        B = precisions.round_to(B, precision).astype(self.dtype)
        C = _matrix(c, 0, m, n, ldc)
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

    # ---- convolution helpers -----------------------------------------------
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

    # ---- bias / scale (per-channel, layout batch x n x size) ----------------
    def add_bias(self, output, biases, batch, n, size):
        output.reshape(batch, n, size)[...] += biases[:n].reshape(1, n, 1)

    def scale_bias(self, output, scales, batch, n, size):
        output.reshape(batch, n, size)[...] *= scales[:n].reshape(1, n, 1)

    def bias_activate(self, output, biases, batch, n, size, activation):
        """output = activation(output + biases per channel), in place: the inference tail of
        a convolution. Done in blocks of about _BLOCK_FLOATS so the second pass over each
        block hits the cache instead of memory."""
        rows = output[: batch * n * size].reshape(batch * n, size)
        bias = np.tile(biases[:n], batch).reshape(-1, 1)  # one per row
        step = max(1, _BLOCK_FLOATS // size)

        def run(r_start, r_stop):
            for r0 in range(r_start, r_stop, step):
                block = rows[r0 : min(r0 + step, r_stop)]
                block += bias[r0 : r0 + block.shape[0]]
                _activate_inplace(
                    block, activation, _scratch(block.size, rows.dtype).reshape(block.shape)
                )

        parallel(batch * n, run, max(1, GRAIN_FLOATS // size))

    def backward_bias(self, bias_updates, delta, batch, n, size):
        """bias_updates += sum of delta over batch and space."""
        bias_updates[:n] += delta.reshape(batch, n, size).sum(axis=(0, 2))

    def backward_scale(self, x_norm, delta, batch, n, size, scale_updates):
        scale_updates[:n] += (delta.reshape(batch, n, size) * x_norm.reshape(batch, n, size)).sum(
            axis=(0, 2)
        )

    def bias_scale_updates(self, delta, x_norm, batch, n, size, bias_updates, scale_updates):
        """Batch norm's parameter gradients: backward_bias (skipped when bias_updates is
        None) and backward_scale."""
        if bias_updates is not None:
            self.backward_bias(bias_updates, delta, batch, n, size)
        self.backward_scale(x_norm, delta, batch, n, size, scale_updates)

    # ---- activations ---------------------------------------------------------
    def activate(self, x, activation):
        if activation == "linear":
            return
        if activation not in _IN_PLACE:
            x[...] = activations.activate(x, activation)
            return

        def run(b_start, b_stop):
            for i in range(
                b_start * _BLOCK_FLOATS, min(b_stop * _BLOCK_FLOATS, x.size), _BLOCK_FLOATS
            ):
                block = x[i : i + _BLOCK_FLOATS]
                _activate_inplace(block, activation, _scratch(block.size, x.dtype))

        parallel(-(-x.size // _BLOCK_FLOATS), run, GRAIN_FLOATS // _BLOCK_FLOATS)

    def activate_strided(self, x, rows, row_stride, offset, width, activation):
        """Activate x[offset + r*row_stride : +width] for each r < rows (one launch on
        the GPU; YOLO and region layers use it for their logistic channels)."""
        v = _matrix(x, offset, rows, width, row_stride)
        v[...] = activations.activate(v, activation)

    def scale_add_strided(self, x, rows, row_stride, offset, width, scale, add):
        """x = x*scale + add over x[offset + r*row_stride : +width] for each r < rows (the
        AlexeyAB fork's scal_add; its [yolo] scale_x_y moves x and y by it)."""
        v = _matrix(x, offset, rows, width, row_stride)
        v[...] = v * self.dtype.type(scale) + self.dtype.type(add)

    def gradient(self, y, activation, delta):
        """delta *= activation'(.) computed from the output y."""
        if activation != "linear":
            delta *= activations.gradient(y, activation)

    def gradient_strided(self, y, rows, row_stride, offset, width, activation, delta):
        """delta *= activation'(y) over [offset + r*row_stride : +width] for each r < rows
        (one launch on the GPU; the region layer's backward)."""
        if activation != "linear":
            _matrix(delta, offset, rows, width, row_stride)[...] *= activations.gradient(
                _matrix(y, offset, rows, width, row_stride), activation
            )

    def gradient_from_input(self, x, activation, delta):
        """delta *= activation'(x) from the input x (gelu, swish, mish, hard_mish)."""
        delta *= activations.gradient_from_input(x, activation)

    def normalize_channels(self, x, batch, channels, spatial, activation):
        """The fork's normalize_channels family in place on x (batch, channels, spatial)."""
        v = x[: batch * channels * spatial].reshape(batch, channels, spatial)
        v[...] = activations.normalize_channels(v, activation)

    def normalize_channels_gradient(self, x, batch, channels, spatial, activation, delta):
        """delta <- its gradient through normalize_channels, from the input x."""
        d = delta[: batch * channels * spatial].reshape(batch, channels, spatial)
        d[...] = activations.normalize_channels_gradient(
            x[: batch * channels * spatial].reshape(batch, channels, spatial), activation, d
        )

    # ---- pooling -------------------------------------------------------------
    def maxpool_forward(self, x, batch, c, h, w, size, stride, padding, out, indexes):
        """Darknet maxpool: windows start at -padding//2; indexes get the flat argmax
        (into x, over the whole batch) for backward, or are None in inference (no argmax
        kept). out_h = (h + padding - size)//stride + 1. x and out of one storage (a 16-bit
        x's values are already its rounded ones: the maxima are copied)."""
        one_storage("maxpool_forward", self.storage_of, x=x, out=out)
        out_h = (h + padding - size) // stride + 1
        out_w = (w + padding - size) // stride + 1
        off = padding // 2
        n = batch * c * out_h * out_w
        if indexes is None or size != stride or off or out_h * size > h or out_w * size > w:
            self.maxpool_forward_xy(x, batch, c, h, w, size, stride, stride, padding, out, indexes)
            return
        # Training with non-overlapping windows inside the image (the usual 2x2/2): compare
        # the size*size strided views in window order, keeping the first maximum (Darknet's
        # strict '>'); no padded or index copies (several times faster).
        src = x[: batch * c * h * w].reshape(batch * c, h, w)
        rows, cols = out_h * size, out_w * size
        best = src[:, 0:rows:size, 0:cols:size].copy()
        which = np.zeros(best.shape, dtype=np.int64)
        for k in range(1, size * size):
            dy, dx = divmod(k, size)
            cand = src[:, dy:rows:size, dx:cols:size]
            better = cand > best
            np.copyto(best, cand, where=better)
            which[better] = k
        out[:n] = best.reshape(-1)
        dy, dx = np.divmod(which, size)
        plane = (np.arange(batch * c) * (h * w)).reshape(-1, 1, 1)
        top = np.arange(out_h).reshape(1, -1, 1) * (size * w)
        left = np.arange(out_w).reshape(1, 1, -1) * size
        indexes[:n] = (plane + top + left + dy * w + dx).reshape(-1)

    def maxpool_forward_xy(
        self, x, batch, c, h, w, size, stride_x, stride_y, padding, out, indexes
    ):
        """maxpool_forward with the AlexeyAB fork's separate strides across and down."""
        one_storage("maxpool_forward", self.storage_of, x=x, out=out)
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        off = padding // 2
        if indexes is None:
            src = x[: batch * c * h * w].reshape(batch * c, h, w)
            dst = out[: batch * c * out_h * out_w].reshape(batch * c, out_h, out_w)
            parallel(
                batch * c,
                lambda p0, p1: _maxpool_values(
                    src[p0:p1], size, stride_y, stride_x, off, dst[p0:p1]
                ),
                max(1, GRAIN_FLOATS // (h * w)),
            )
            return
        # Pad so every window is in range; padded cells never win (-inf).
        ph = max(0, (out_h - 1) * stride_y + size - off - h)
        pw = max(0, (out_w - 1) * stride_x + size - off - w)
        src = x[: batch * c * h * w].reshape(batch * c, h, w)
        padded = np.full((batch * c, off + h + ph, off + w + pw), -np.inf, dtype=x.dtype)
        padded[:, off : off + h, off : off + w] = src
        idx = np.full(padded.shape, -1, dtype=np.int64)
        idx[:, off : off + h, off : off + w] = np.arange(batch * c * h * w).reshape(batch * c, h, w)
        sb, sh, sw = padded.strides
        win = as_strided(
            padded,
            (batch * c, out_h, out_w, size, size),
            (sb, sh * stride_y, sw * stride_x, sh, sw),
        ).reshape(batch * c, out_h, out_w, -1)
        arg = win.argmax(axis=3)  # first max in row-major window order, as Darknet's strict '>'
        ib, ih, iw = idx.strides
        iwin = as_strided(
            idx, (batch * c, out_h, out_w, size, size), (ib, ih * stride_y, iw * stride_x, ih, iw)
        ).reshape(batch * c, out_h, out_w, -1)
        out[: batch * c * out_h * out_w] = np.take_along_axis(win, arg[..., None], 3).reshape(-1)
        indexes[: batch * c * out_h * out_w] = np.take_along_axis(iwin, arg[..., None], 3).reshape(
            -1
        )

    def maxpool_backward(self, delta_out, indexes, n_out, delta_in):
        """delta_in[indexes[i]] += delta_out[i] for i < n_out; index -1 (a window wholly
        in the padding) routes nowhere."""
        idx = indexes[:n_out]
        hit = idx >= 0
        np.add.at(delta_in, idx[hit], delta_out[:n_out][hit])

    def maxpool_backward_xy(
        self, delta_out, indexes, batch, c, h, w, size, stride_x, stride_y, padding, delta_in
    ):
        """maxpool_backward of a spatial maxpool given its geometry (the CUDA backend gathers
        per input cell there, deterministically); np.add.at adds in output order."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        self.maxpool_backward(delta_out, indexes, batch * c * out_h * out_w, delta_in)

    def maxpool_depth_forward(self, x, batch, c, spatial, out_c, out, indexes):
        """The fork's maxpool_depth: out[b, g, p] = max over channels g, g+out_c, g+2*out_c, ...
        of x[b, :, p]; indexes get the flat argmax (the first maximum)."""
        planes = x[: batch * c * spatial].reshape(batch, c, spatial)
        best = np.full((batch, out_c, spatial), -np.inf, dtype=x.dtype)
        where = np.zeros((batch, out_c, spatial), dtype=np.int64)
        base = (np.arange(batch) * c * spatial).reshape(-1, 1, 1) + np.arange(spatial)
        for k in range(c):
            g = k % out_c
            better = planes[:, k] > best[:, g]
            best[:, g] = np.where(better, planes[:, k], best[:, g])
            where[:, g] = np.where(better, base[:, 0] + k * spatial, where[:, g])
        out[: batch * out_c * spatial] = best.reshape(-1)
        indexes[: batch * out_c * spatial] = where.reshape(-1)

    def local_avgpool(
        self, x, batch, c, h, w, size, stride_x, stride_y, padding, out, forward=True
    ):
        """The fork's [local_avgpool]: the mean of each size x size window over its cells
        inside the image (windows start at -padding/2). forward=False: the adjoint, adding
        each out value / its cell count into those cells of x."""
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        off = padding // 2
        img = x[: batch * c * h * w].reshape(batch * c, h, w)
        res = out[: batch * c * out_h * out_w].reshape(batch * c, out_h, out_w)
        rows = np.arange(out_h) * stride_y - off
        cols = np.arange(out_w) * stride_x - off
        # cells of each window inside the image, per output row / column
        row_count = np.array([len(range(max(r, 0), min(r + size, h))) for r in rows])
        col_count = np.array([len(range(max(q, 0), min(q + size, w))) for q in cols])
        count = (row_count[:, None] * col_count[None, :]).astype(x.dtype)
        if forward:
            res[...] = 0
        else:
            share = res / count
        for n in range(size):
            for m in range(size):
                ys, xs = rows + n, cols + m
                vy, vx = (ys >= 0) & (ys < h), (xs >= 0) & (xs < w)
                yi, xi = np.nonzero(vy)[0], np.nonzero(vx)[0]
                if not len(yi) or not len(xi):
                    continue
                sel = np.ix_(ys[yi], xs[xi])
                if forward:
                    res[:, yi[:, None], xi[None, :]] += img[:, sel[0], sel[1]]
                else:
                    np.add.at(
                        img, (slice(None), sel[0], sel[1]), share[:, yi[:, None], xi[None, :]]
                    )
        if forward:
            res /= count

    def scale_channels(self, scale, src, batch, channels, spatial, scale_wh, out):
        """The fork's [scale_channels]: out[b, c, p] = scale[b, c] * src[b, c, p]; scale_wh:
        out[b, c, p] = scale[b, p] * src[b, c, p]."""
        out[: batch * channels * spatial] = (
            self._broadcast_scale(scale, batch, channels, spatial, scale_wh)
            * src[: batch * channels * spatial].reshape(batch, channels, spatial)
        ).reshape(-1)

    def scale_channels_backward(
        self, scale, src, delta, batch, channels, spatial, scale_wh, scale_delta, src_delta
    ):
        """The adjoint of scale_channels, added into scale_delta and src_delta (either may be
        None)."""
        d = delta[: batch * channels * spatial].reshape(batch, channels, spatial)
        if src_delta is not None:
            src_delta[: batch * channels * spatial] += (
                self._broadcast_scale(scale, batch, channels, spatial, scale_wh) * d
            ).reshape(-1)
        if scale_delta is not None:
            prod = d * src[: batch * channels * spatial].reshape(batch, channels, spatial)
            n = spatial if scale_wh else channels
            scale_delta[: batch * n] += prod.sum(axis=1 if scale_wh else 2).reshape(-1)

    @staticmethod
    def _broadcast_scale(scale, batch, channels, spatial, scale_wh):
        if scale_wh:
            return scale[: batch * spatial].reshape(batch, 1, spatial)
        return scale[: batch * channels].reshape(batch, channels, 1)

    def shortcut_weights(self, weights, inputs, channels, normalization, out):
        """The fork's weighted-shortcut weights, (inputs x channels), normalised over the
        inputs per channel: none, relu (relu(w) / (1e-4 + sum relu)) or softmax
        (exp(w - max) / (1e-4 + sum exp(w - max)))."""
        w = weights[: inputs * channels].reshape(inputs, channels)
        if normalization == "relu":
            r = np.maximum(w, 0)
            w = r / (self.dtype.type(1e-4) + r.sum(axis=0))
        elif normalization == "softmax":
            e = np.exp(w - w.max(axis=0))
            w = e / (self.dtype.type(1e-4) + e.sum(axis=0))
        out[: inputs * channels] = w.reshape(-1)

    def channel_weighted_add(self, src, src_stride, weights, step, width, batch, out, out_stride):
        """out[b*out_stride + j] += weights[j // step] * src[b*src_stride + j], j < width."""
        s = _matrix(src, 0, batch, width, src_stride)
        d = _matrix(out, 0, batch, width, out_stride)
        d += np.repeat(weights[: -(-width // step)], step)[:width] * s

    def channel_weighted_dot(self, a, a_stride, b, b_stride, step, width, batch, out):
        """out[c] += sum over images and j < width with j // step == c of a[.. j] * b[.. j]."""
        prod = (_matrix(a, 0, batch, width, a_stride) * _matrix(b, 0, batch, width, b_stride)).sum(
            0
        )
        np.add.at(out, np.arange(width) // step, prod)

    def avgpool_forward(self, x, batch, c, spatial, out):
        out[: batch * c] = x[: batch * c * spatial].reshape(batch * c, spatial).mean(axis=1)

    def avgpool_backward(self, delta_out, batch, c, spatial, delta_in):
        d = delta_in[: batch * c * spatial].reshape(batch * c, spatial)
        d += (delta_out[: batch * c] / spatial).reshape(-1, 1)

    # ---- softmax -------------------------------------------------------------
    def softmax(self, x, n, batch, batch_offset, groups, group_offset, stride, temp, out):
        """Darknet's softmax_cpu: batch*groups softmaxes of n elements spaced `stride` apart."""
        b = np.arange(batch).reshape(-1, 1, 1) * batch_offset
        g = np.arange(groups).reshape(1, -1, 1) * group_offset
        i = np.arange(n).reshape(1, 1, -1) * stride
        _softmax_at(x, (b + g + i).reshape(batch * groups, n), temp, out)

    def softmax_tree(self, x, spatial, batch, stride, temp, group_offset, group_size, classes, out):
        """A softmax over each group of a class tree of `classes` classes (tree.py): for
        instance b < batch and position s < spatial, group g's group_size[g] elements at
        x[b*stride + (group_offset[g] + i)*spatial + s] (integer arrays, as int_zeros)."""
        instances = (np.arange(batch)[:, None] * stride + np.arange(spatial)).reshape(-1)
        for first, size in zip(np.asarray(group_offset).tolist(), np.asarray(group_size).tolist()):
            _softmax_at(x, (instances[:, None] + (first + np.arange(size)) * spatial), temp, out)

    def mask(self, x, truth, value):
        """x[i] = 0 wherever truth[i] == value (Darknet's mask_gpu with mask_num 0)."""
        x[truth[: x.size] == value] = 0

    def softmax_x_ent(self, pred, truth, delta, error):
        """Cross-entropy: error = -t*log(p) where t != 0; delta = t - p."""
        t = truth[: pred.size]
        with np.errstate(divide="ignore"):
            error[...] = np.where(t != 0, -t * np.log(pred), 0)
        delta[...] = t - pred

    def l2(self, pred, truth, delta, error):
        """Sum-squared error: delta = t - p, error = (t - p)^2."""
        delta[...] = truth[: pred.size] - pred
        error[...] = delta * delta

    def logistic_x_ent(self, pred, truth, delta, error):
        """Logistic cross-entropy ([logistic]): error = -t*log(p) - (1-t)*log(1-p);
        delta = t - p. As Darknet's CPU code: no epsilon, so p of exactly 0 or 1 gives inf
        (or nan where t makes 0 * inf)."""
        t = truth[: pred.size]
        with np.errstate(divide="ignore", invalid="ignore"):
            error[...] = -t * np.log(pred) - (1 - t) * np.log(1 - pred)
        delta[...] = t - pred

    # ---- normalisations across channels ([l2norm], [lrn]) ----------------------------
    def l2normalize(self, x, batch, filters, spatial):
        """x /= sqrt(sum over the filters of x^2), per image and position (Darknet's
        l2normalize_cpu, without its unused gradient output)."""
        v = x.reshape(batch, filters, spatial)
        total = np.zeros((batch, spatial), dtype=x.dtype)
        for f in range(filters):  # Darknet's order of additions
            total += v[:, f] * v[:, f]
        v /= np.sqrt(total)[:, None, :]

    def lrn_forward(self, x, batch, c, spatial, size, alpha, beta, kappa, norms, out):
        """Darknet's local response normalisation: norms = kappa + alpha * the sum of x^2
        over each channel's window, built as its running sum (channel 0 adds channels
        [0, size/2); channel k starts from k-1's, subtracts k-(size-1)/2-1 and adds
        k+size/2: channel size/2 never enters, as in Darknet); out = x * norms^-beta."""
        v = x.reshape(batch, c, spatial)
        n = norms.reshape(batch, c, spatial)
        alpha = self.dtype.type(alpha)
        squared = v * v
        norm = np.full((batch, spatial), kappa, dtype=x.dtype)
        for k in range(min(size // 2, c)):
            norm += alpha * squared[:, k]
        n[:, 0] = norm
        for k in range(1, c):
            prev, nxt = k - (size - 1) // 2 - 1, k + size // 2
            if prev >= 0:
                norm += -alpha * squared[:, prev]
            if nxt < c:
                norm += alpha * squared[:, nxt]
            n[:, k] = norm
        out[...] = np.power(norms, -self.dtype.type(beta)) * x

    def lrn_backward(self, norms, delta, beta, delta_in):
        """Darknet's approximate LRN gradient: delta_in += norms^-beta * delta."""
        delta_in += np.power(norms, -self.dtype.type(beta)) * delta

    # ---- binary convolutions (binary=1, xnor=1) ---------------------------------------
    def binarize_weights(self, weights, n, size, binary):
        """Per filter (n filters of `size` weights): binary = +mean where the weight is > 0,
        else -mean, mean = the filter's mean absolute weight (Darknet's binarize_weights)."""
        w = weights[: n * size].reshape(n, size)
        mean = np.abs(w).sum(axis=1, dtype=w.dtype) / self.dtype.type(size)
        binary[: n * size].reshape(n, size)[...] = np.where(w > 0, mean[:, None], -mean[:, None])

    def binarize(self, x, binary):
        """binary = +1 where x > 0, else -1 (Darknet's binarize_cpu: xnor's input)."""
        binary[: x.size] = np.where(x > 0, 1, -1)

    # ---- detection losses --------------------------------------------------------
    def yolo_loss(self, spec, output, truth, delta, scalars):
        """The [yolo] head's training loss (losses/yolo.py, of spec's flavour) of output
        (spec.batch images, after activation) against the truth buffer (spec.batch rows of
        truth_fields floats a box): writes the whole delta and the yolo_loss.SCALARS
        (cost first) into scalars."""
        d, sums = yolo_loss(spec, output, image_truths(spec, truth))
        delta[: d.size] = d
        scalars[: sums.size] = sums

    # ---- shape ops -------------------------------------------------------------
    def upsample(self, x, w, h, c, batch, stride, forward, scale, out):
        """forward: out (w*stride x h*stride) = scale * nearest(x).
        backward (forward=False): x += scale * sum of out over each stride x stride cell.
        The forward takes x and out of one storage (16-bit: scaled in fp32, rounded once);
        the backward fp32 arrays only."""
        kept = one_storage(
            "upsample" if forward else "upsample (backward)",
            self.storage_of,
            None if forward else (precisions.DEFAULT,),
            x=x,
            out=out,
        )
        big = out.reshape(batch * c, h * stride, w * stride)
        small = x.reshape(batch * c, h, w)
        if forward:
            # Each input cell broadcast over its stride x stride block: one pass, no copies.
            cells = big.reshape(batch * c, h, stride, w, stride)
            cells[...] = small[:, :, None, :, None]
            if scale != 1:
                big *= self.dtype.type(scale)
                if kept != precisions.DEFAULT:
                    big[...] = precisions.round_to(big, kept).reshape(big.shape)
        else:
            small += scale * big.reshape(batch * c, h, stride, w, stride).sum(axis=(2, 4))

    def reorg(self, x, w, h, c, batch, stride, forward, out):
        """Darknet's reorg_cpu index mapping (its 'forward' flag is reversed in the layer)."""
        out_c = c // (stride * stride)
        b, k, j, i = np.meshgrid(
            np.arange(batch), np.arange(c), np.arange(h), np.arange(w), indexing="ij"
        )
        in_index = i + w * (j + h * (k + c * b))
        c2 = k % out_c
        offset = k // out_c
        w2 = i * stride + offset % stride
        h2 = j * stride + offset // stride
        out_index = w2 + w * stride * (h2 + h * stride * (c2 + out_c * b))
        if forward:
            out[out_index.reshape(-1)] = x[in_index.reshape(-1)]
        else:
            out[in_index.reshape(-1)] = x[out_index.reshape(-1)]

    def shortcut(self, batch, w1, h1, c1, add, w2, h2, c2, s1, s2, out):
        """Darknet's shortcut_cpu: out = s1*out + s2*add, over the common shape, with
        sampling strides when the two shapes differ. add and out of one storage (16-bit: the
        fp32 result rounded once)."""
        kept = one_storage("shortcut", self.storage_of, add=add, out=out)
        stride = max(1, w1 // w2)
        sample = max(1, w2 // w1)
        minw, minh, minc = min(w1, w2), min(h1, h2), min(c1, c2)
        src = add[: batch * c1 * h1 * w1].reshape(batch, c1, h1, w1)
        dst = out[: batch * c2 * h2 * w2].reshape(batch, c2, h2, w2)
        a = src[:, :minc, 0 : minh * stride : stride, 0 : minw * stride : stride]
        d = dst[:, :minc, 0 : minh * sample : sample, 0 : minw * sample : sample]
        value = s1 * np.asarray(d) + s2 * np.asarray(a)
        d[...] = (
            value
            if kept == precisions.DEFAULT
            else precisions.round_to(value, kept).reshape(value.shape)
        )

    # ---- random ----------------------------------------------------------------
    def dropout(self, x, prob, scale, rand, step_seed, layer_seed):
        """Training dropout. rand[i] = uniform_hash(seed, i) with seed = step_seed[0] +
        layer_seed (step_seed: a one-element int array, written once per step), the same
        counter-based draw the CUDA kernel makes; x[rand < prob] = 0, the rest *= scale."""
        seed = (int(step_seed[0]) + int(layer_seed)) & 0xFFFFFFFF
        rand[...] = uniform_hash(seed, rand.size).astype(self.dtype)
        x[...] = np.where(rand < prob, 0, x * scale)

    def dropout_backward(self, rand, prob, scale, delta):
        delta[...] = np.where(rand < prob, 0, delta * scale)

    def uniform(self, rand, seed):
        """rand[i] = uniform_hash(seed, i): draws in [0, 1) the CUDA kernel makes alike."""
        rand[...] = uniform_hash(seed, rand.size).astype(self.dtype)

    # ---- detection losses --------------------------------------------------------
    def region_loss(
        self, head, output, truth, truth_size, anchors, seen, delta, scalars, classes=None
    ):
        """[region]'s training loss (losses/region.py) for head (a RegionHead): every element
        of delta; the cost and statistics in scalars (region_loss.REGION_SCALARS). classes:
        the layer's region_loss.RegionClasses (map= and tree=) or None."""
        region_loss.region_loss(
            head, output, truth, truth_size, anchors, seen, delta, scalars, classes
        )

    def detection_grid_truth(self, truth, batch, truth_size, max_boxes, side, classes, grid):
        """[detection]'s grid truth from box rows (losses/detection.py): every element of grid."""
        detection_loss.detection_grid_truth(
            truth, batch, truth_size, max_boxes, side, classes, grid
        )

    def detection_loss(self, head, output, grid, draws, delta, scalars):
        """[detection]'s training loss (losses/detection.py) for head (a DetectionHead): every
        element of delta; the cost and statistics in scalars (DETECTION_SCALARS)."""
        detection_loss.detection_loss(head, output, grid, draws, delta, scalars)


def _softmax_at(x, index, temp, out):
    """One softmax per row of the index matrix (instances x elements) of flat x into out."""
    v = x[index] / temp
    e = np.exp(v - v.max(axis=1, keepdims=True))
    out[index] = e / e.sum(axis=1, keepdims=True)


# Floats per block of activate/bias_activate: the passes over a block stay in L2 cache.
_BLOCK_FLOATS = 1 << 16
_local = threading.local()


class _WallTimer:
    def start(self):
        self._t0 = time.perf_counter()

    def stop(self):
        return time.perf_counter() - self._t0


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


def _scratch(n, dtype):
    """This thread's reusable buffer of n elements (grows, never shrinks)."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.size < n or buf.dtype != dtype:
        buf = _local.buf = np.empty(max(n, _BLOCK_FLOATS), dtype=dtype)
    return buf[:n]


_IN_PLACE = ("linear", "leaky", "relu", "logistic")


def _activate_inplace(x, activation, scratch):
    """x = activation(x) without temporaries for the activations inference nets use
    (the same float32 values as activations.activate); the rest go through it.
    `scratch` is a buffer shaped like x."""
    if activation == "linear":
        return
    if activation == "leaky":  # max(x, .1x) is x for x > 0 and .1x otherwise
        np.multiply(x, x.dtype.type(0.1), out=scratch)
        np.maximum(x, scratch, out=x)
    elif activation == "relu":
        np.maximum(x, 0, out=x)
    elif activation == "logistic":
        with np.errstate(over="ignore"):  # exp overflows to inf: 1/(1+inf) = 0 is right
            np.negative(x, out=x)
            np.exp(x, out=x)
        x += 1
        np.reciprocal(x, out=x)
    else:
        x[...] = activations.activate(x, activation)


def _maxpool_values(src, size, stride_y, stride_x, off, out):
    """out (planes, out_h, out_w) = the maximum of each window, without argmax or index
    arrays, taken in two running np.maximum passes: down the window's rows over whole
    image rows (contiguous, vectorised), then across its columns on that smaller result.
    Cells outside the image (padding) are -inf, so a window wholly in the padding gives
    -inf."""
    planes, h, w = src.shape
    _, out_h, out_w = out.shape
    ph = max(0, (out_h - 1) * stride_y + size - off - h)
    pw = max(0, (out_w - 1) * stride_x + size - off - w)
    if off or ph or pw:
        padded = np.full((planes, off + h + ph, off + w + pw), -np.inf, dtype=src.dtype)
        padded[:, off : off + h, off : off + w] = src
        src = padded
    rows, cols = stride_y * (out_h - 1) + 1, stride_x * (out_w - 1) + 1
    width = src.shape[2]
    down = _scratch(planes * out_h * width, src.dtype).reshape(planes, out_h, width)
    down[...] = src[:, 0:rows:stride_y]
    for dy in range(1, size):
        np.maximum(down, src[:, dy : dy + rows : stride_y], out=down)
    out[...] = down[:, :, 0:cols:stride_x]
    for dx in range(1, size):
        np.maximum(out, down[:, :, dx : dx + cols : stride_x], out=out)


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


def _store(dst, values, kept):
    """dst[...] = values, rounded to kept (storage_of dst) when 16-bit."""
    if kept == precisions.DEFAULT:
        dst[...] = values
    else:
        dst[...] = precisions.round_to(np.asarray(values), kept).reshape(np.shape(dst))


def _blocks(flat, offset, planes, rows, cols, plane_stride, ld):
    """A (planes x rows x cols) strided view of a flat array."""
    if planes <= 1:
        return _matrix(flat, offset, rows, cols, ld)[None]
    if rows and cols and offset + (planes - 1) * plane_stride + (rows - 1) * ld + cols > flat.size:
        raise ValueError(f"{planes}x{rows}x{cols} blocks at {offset} exceed array of {flat.size}")
    isz = flat.itemsize
    return as_strided(flat[offset:], (planes, rows, cols), (plane_stride * isz, ld * isz, isz))


def _matrix(flat, offset, rows, cols, ld):
    """A (rows x cols) strided view of a flat array, row stride `ld` elements."""
    if rows == 0 or cols == 0:
        return flat[offset:offset].reshape(rows, cols)
    need = offset + (rows - 1) * ld + cols
    if need > flat.size:
        raise ValueError(
            f"matrix view {rows}x{cols} (ld {ld}) at {offset} exceeds array of {flat.size}"
        )
    base = flat[offset:]
    return as_strided(base, (rows, cols), (ld * flat.itemsize, flat.itemsize))
