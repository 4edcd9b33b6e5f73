"""The CUDA backend's element-wise and shape ops: BLAS-like vector ops and sums (blas.cu),
activations and their gradients (activations.cu), route copies, upsample, reorg, shortcut,
scale_channels and the weighted shortcut (shape.cu), binarisation (binary.cu), dropout and
uniform draws (dropout.cu). A mixin of CudaBackend."""

import numpy as np
import pycuda.driver as drv

from ... import activations
from ... import precision as precisions
from ...backends.cuda_core import _BLOCK, _ceil_div
from ..common.numpy import one_storage

# The kernel files this family launches from (formats from their declarations,
# backends/kernel_signatures.py).
KERNEL_FILES = ("blas.cu", "activations.cu", "shape.cu", "binary.cu", "dropout.cu")

_COPY_RUN = 4  # COPY_RUN of shape.cu
# The twins of the kernels that take a layer's output kept at 16 bits (issue 26:
# storage_zeros' arrays, storage_of), by the storage their arrays share.
_STORAGE_SUFFIX = {"fp32": "", "fp16": "_f16", "bf16": "_bf16"}


class CudaElementwise:
    """Vector ops, activations, shape ops, binarisation and dropout."""

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
        (+)= src[src_offset + p*src_plane_stride + r*src_stride : +width]. src and dst of one
        storage (fp32, or both 16-bit: the stored bits copied; accumulated in fp32 and
        rounded once)."""
        suffix = _STORAGE_SUFFIX[one_storage("copy_blocks", self.storage_of, src=src, dst=dst)]
        size = src.dtype.itemsize
        planes = int(planes)
        for what, arr, off, stride, pstride in (
            ("src", src, src_offset, src_stride, src_plane_stride),
            ("dst", dst, dst_offset, dst_stride, dst_plane_stride),
        ):
            self._check_matrix(f"copy_blocks {what}", arr, off, rows, width, stride)
            if planes > 1:
                self._check_matrix(
                    f"copy_blocks {what} last plane",
                    arr,
                    off + (planes - 1) * pstride,
                    rows,
                    width,
                    stride,
                )
        if rows <= 0 or width <= 0 or planes <= 0:
            return
        # x spans the width in runs of _COPY_RUN elements a thread (shape.cu)
        self._launch_rows(
            "copy_blocks_kernel" + suffix,
            rows * planes,
            _ceil_div(width, _COPY_RUN),
            self._ptr(src) + size * int(src_offset),
            int(src_stride),
            int(src_plane_stride),
            self._ptr(dst) + size * int(dst_offset),
            int(dst_stride),
            int(dst_plane_stride),
            int(width),
            int(rows),
            planes,
            int(bool(accumulate)),
        )

    # ---- BLAS-like ----------------------------------------------------------
    def axpy(self, alpha, x, y):
        """y += alpha * x"""
        self._sizes_match("axpy", x, y)
        self._launch(
            "axpy_kernel",
            self._grid1d(y.size),
            (_BLOCK,),
            y.size,
            float(alpha),
            self._ptr(x),
            self._ptr(y),
        )

    def axpy_array(self, alpha, x, y):
        """y += alpha[0] * x, alpha a one-element array: read on the device when the kernel
        runs, so a captured step takes the value written before each replay."""
        self._sizes_match("axpy_array", x, y)
        self._check_size("axpy_array alpha", alpha, 1)
        self._launch(
            "axpy_array_kernel",
            self._grid1d(y.size),
            (_BLOCK,),
            y.size,
            self._ptr(alpha),
            self._ptr(x),
            self._ptr(y),
        )

    def scal(self, alpha, x):
        """x *= alpha"""
        self._launch(
            "scal_kernel", self._grid1d(x.size), (_BLOCK,), x.size, float(alpha), self._ptr(x)
        )

    def constrain(self, limit, x):
        """x = min(limit, max(-limit, x)) (element-wise)"""
        self._launch(
            "constrain_kernel", self._grid1d(x.size), (_BLOCK,), x.size, float(limit), self._ptr(x)
        )

    def mul(self, x, y):
        """y *= x (element-wise)"""
        self._sizes_match("mul", x, y)
        self._launch(
            "mul_kernel", self._grid1d(y.size), (_BLOCK,), y.size, self._ptr(x), self._ptr(y)
        )

    def mul_add(self, a, b, y):
        """y += a * b (element-wise)"""
        self._sizes_match("mul_add", a, y)
        self._sizes_match("mul_add", b, y)
        self._launch(
            "mul_add_kernel",
            self._grid1d(y.size),
            (_BLOCK,),
            y.size,
            self._ptr(a),
            self._ptr(b),
            self._ptr(y),
        )

    def sum(self, x):
        """Sum of all elements as a Python float (accumulated in double; a host sync)."""
        if x.size == 0:
            return 0.0
        blocks = self._grid1d(x.size)[0]
        scratch = self._scratch_buffer("sum", 8 * (blocks + 1))
        partial = self._ptr(scratch)
        self._launch("sum_partial", (blocks,), (_BLOCK,), x.size, self._ptr(x), partial)
        self._launch("sum_final", (1,), (_BLOCK,), blocks, partial, partial + 8 * blocks)
        out = np.empty(1, dtype=np.float64)
        drv.memcpy_dtoh_async(out, partial + 8 * blocks, self.stream)
        self._sync("sum")
        return float(out[0])

    def sum_into(self, x, out):
        """out[0] = the sum of x (accumulated in double, stored as float32), queued on the
        stream: no host sync."""
        if x.size == 0:
            self.fill(out[:1], 0.0)
            return
        blocks = self._grid1d(x.size)[0]
        scratch = self._scratch_buffer("sum", 8 * (blocks + 1))
        partial = self._ptr(scratch)
        self._launch("sum_partial", (blocks,), (_BLOCK,), x.size, self._ptr(x), partial)
        self._launch("sum_final_f32", (1,), (_BLOCK,), blocks, partial, self._ptr(out))

    # ---- activations ---------------------------------------------------------
    @staticmethod
    def _activation_id(activation):
        try:
            return activations.ACTIVATION_IDS[activation]
        except KeyError:
            raise ValueError(f"unknown activation '{activation}'") from None

    def activate(self, x, activation):
        act = self._activation_id(activation)
        if activation != "linear":
            self._launch(
                "activate_array", self._grid1d(x.size), (_BLOCK,), self._ptr(x), x.size, act
            )

    def bias_activate(self, output, biases, batch, n, size, activation):
        """output = activation(output + biases per channel), in place, in one launch."""
        self._check_size("bias_activate output", output, batch * n * size)
        self._check_size("bias_activate biases", biases, n)
        self._launch_rows(
            "bias_activate",
            batch * n,
            size,
            self._ptr(output),
            self._ptr(biases),
            int(batch * n),
            int(n),
            int(size),
            self._activation_id(activation),
        )

    def activate_strided(self, x, rows, row_stride, offset, width, activation):
        """Activate x[offset + r*row_stride : +width] for each r < rows, in one launch."""
        act = self._activation_id(activation)
        self._check_matrix("activate_strided", x, offset, rows, width, row_stride)
        if activation == "linear" or rows <= 0 or width <= 0:
            return
        self._launch_rows(
            "activate_strided",
            rows,
            width,
            self._ptr(x) + 4 * int(offset),
            int(rows),
            int(row_stride),
            int(width),
            act,
        )

    def scale_add_strided(self, x, rows, row_stride, offset, width, scale, add):
        """x = x*scale + add over x[offset + r*row_stride : +width] for each r < rows."""
        self._check_matrix("scale_add_strided", x, offset, rows, width, row_stride)
        self._launch_rows(
            "scale_add_strided",
            rows,
            width,
            self._ptr(x) + 4 * int(offset),
            int(rows),
            int(row_stride),
            int(width),
            float(scale),
            float(add),
        )

    def gradient(self, y, activation, delta):
        """delta *= activation'(.) computed from the output y."""
        act = self._activation_id(activation)
        if activation in activations.INPUT_GRADIENT:
            raise ValueError(f"the gradient of {activation} needs its input: gradient_from_input")
        self._sizes_match("gradient", y, delta)
        if activation != "linear":
            self._launch(
                "gradient_array",
                self._grid1d(y.size),
                (_BLOCK,),
                self._ptr(y),
                y.size,
                act,
                self._ptr(delta),
            )

    def gradient_strided(self, y, rows, row_stride, offset, width, activation, delta):
        """delta *= activation'(y) over [offset + r*row_stride : +width] for each r < rows,
        in one launch."""
        act = self._activation_id(activation)
        if activation in activations.INPUT_GRADIENT:
            raise ValueError(f"the gradient of {activation} needs its input: gradient_from_input")
        for what, arr in (("y", y), ("delta", delta)):
            self._check_matrix(f"gradient_strided {what}", arr, offset, rows, width, row_stride)
        if activation == "linear" or rows <= 0 or width <= 0:
            return
        self._launch_rows(
            "gradient_strided",
            rows,
            width,
            self._ptr(y) + 4 * int(offset),
            int(rows),
            int(row_stride),
            int(width),
            act,
            self._ptr(delta) + 4 * int(offset),
        )

    def gradient_from_input(self, x, activation, delta):
        """delta *= activation'(x) from the input x (gelu, swish, mish, hard_mish)."""
        act = self._activation_id(activation)
        self._sizes_match("gradient_from_input", x, delta)
        self._launch(
            "gradient_from_input_array",
            self._grid1d(x.size),
            (_BLOCK,),
            self._ptr(x),
            x.size,
            act,
            self._ptr(delta),
        )

    def _channel_kind(self, activation):
        try:
            return activations.CHANNEL_ACTIVATIONS.index(activation)
        except ValueError:
            raise ValueError(f"not a normalize_channels activation: '{activation}'") from None

    def normalize_channels(self, x, batch, channels, spatial, activation):
        """The fork's normalize_channels family in place on x (batch, channels, spatial)."""
        self._check_size("normalize_channels x", x, batch * channels * spatial)
        self._launch(
            "normalize_channels_kernel",
            self._grid1d(batch * spatial),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(channels),
            int(spatial),
            self._channel_kind(activation),
        )

    def normalize_channels_gradient(self, x, batch, channels, spatial, activation, delta):
        """delta <- its gradient through normalize_channels, from the input x."""
        for what, arr in (("x", x), ("delta", delta)):
            self._check_size(f"normalize_channels_gradient {what}", arr, batch * channels * spatial)
        self._launch(
            "normalize_channels_gradient_kernel",
            self._grid1d(batch * spatial),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(channels),
            int(spatial),
            self._channel_kind(activation),
            self._ptr(delta),
        )

    # ---- binary convolutions (binary=1, xnor=1) ---------------------------------------
    def binarize_weights(self, weights, n, size, binary):
        for what, arr in (("weights", weights), ("binary", binary)):
            self._check_size(f"binarize_weights {what}", arr, n * size)
        self._launch(
            "binarize_weights_kernel",
            self._grid1d(n, 64),
            (64,),
            self._ptr(weights),
            int(n),
            int(size),
            self._ptr(binary),
        )

    def binarize(self, x, binary):
        n = x.size
        self._check_size("binarize binary", binary, n)
        self._launch(
            "binarize_kernel", self._grid1d(n), (_BLOCK,), n, self._ptr(x), self._ptr(binary)
        )

    # ---- shape ops -------------------------------------------------------------
    def upsample(self, x, w, h, c, batch, stride, forward, scale, out):
        """forward: out = scale * nearest(x); backward: x += scale * cell sums of out. The
        forward takes x and out of one storage (fp32, or both 16-bit: scaled in fp32 and
        rounded once); the backward fp32 arrays only."""
        suffix = _STORAGE_SUFFIX[
            one_storage(
                "upsample" if forward else "upsample (backward)",
                self.storage_of,
                None if forward else (precisions.DEFAULT,),
                x=x,
                out=out,
            )
        ]
        planes = batch * c
        self._check_size("upsample x", x, planes * h * w)
        self._check_size("upsample out", out, planes * h * w * stride * stride)
        if forward:
            self._launch(
                "upsample_forward_kernel" + suffix,
                self._grid1d(planes * h * w * stride * stride),
                (_BLOCK,),
                self._ptr(x),
                int(planes),
                int(h),
                int(w),
                int(stride),
                float(scale),
                self._ptr(out),
            )
        else:
            self._launch(
                "upsample_backward_kernel",
                self._grid1d(planes * h * w),
                (_BLOCK,),
                self._ptr(x),
                int(planes),
                int(h),
                int(w),
                int(stride),
                float(scale),
                self._ptr(out),
            )

    def reorg(self, x, w, h, c, batch, stride, forward, out):
        """Darknet's reorg_cpu index mapping (its 'forward' flag is reversed in the layer)."""
        total = batch * c * h * w
        self._check_size("reorg x", x, total)
        self._check_size("reorg out", out, total)
        self._launch(
            "reorg_kernel",
            self._grid1d(total),
            (_BLOCK,),
            self._ptr(x),
            int(w),
            int(h),
            int(c),
            int(batch),
            int(stride),
            int(bool(forward)),
            self._ptr(out),
        )

    def shortcut(self, batch, w1, h1, c1, add, w2, h2, c2, s1, s2, out):
        """Darknet's shortcut: out = s1*out + s2*add over the common shape. add and out of
        one storage (fp32, or both 16-bit: the sum in fp32, rounded once)."""
        suffix = _STORAGE_SUFFIX[one_storage("shortcut", self.storage_of, add=add, out=out)]
        stride = max(1, w1 // w2)
        sample = max(1, w2 // w1)
        minw, minh, minc = min(w1, w2), min(h1, h2), min(c1, c2)
        self._check_size("shortcut add", add, batch * c1 * h1 * w1)
        self._check_size("shortcut out", out, batch * c2 * h2 * w2)
        self._launch(
            "shortcut_kernel" + suffix,
            self._grid1d(batch * minc * minh * minw),
            (_BLOCK,),
            int(batch),
            int(minw),
            int(minh),
            int(minc),
            int(stride),
            int(sample),
            self._ptr(add),
            int(w1),
            int(h1),
            int(c1),
            self._ptr(out),
            int(w2),
            int(h2),
            int(c2),
            float(s1),
            float(s2),
        )

    def scale_channels(self, scale, src, batch, channels, spatial, scale_wh, out):
        """The fork's [scale_channels]: out = scale (per channel, or per position) * src."""
        n = batch * channels * spatial
        self._check_size("scale_channels scale", scale, batch * (spatial if scale_wh else channels))
        self._check_size("scale_channels src", src, n)
        self._check_size("scale_channels out", out, n)
        self._launch(
            "scale_channels_kernel",
            self._grid1d(n),
            (_BLOCK,),
            self._ptr(scale),
            self._ptr(src),
            int(batch),
            int(channels),
            int(spatial),
            int(bool(scale_wh)),
            self._ptr(out),
        )

    def scale_channels_backward(
        self, scale, src, delta, batch, channels, spatial, scale_wh, scale_delta, src_delta
    ):
        """The adjoint of scale_channels, added into scale_delta and src_delta (either may be
        None)."""
        n = batch * channels * spatial
        shape = (int(batch), int(channels), int(spatial), int(bool(scale_wh)))
        if src_delta is not None:
            self._check_size("scale_channels_backward src_delta", src_delta, n)
            self._launch(
                "scale_channels_src_delta_kernel",
                self._grid1d(n),
                (_BLOCK,),
                self._ptr(scale),
                self._ptr(delta),
                *shape,
                self._ptr(src_delta),
            )
        if scale_delta is not None:
            m = batch * (spatial if scale_wh else channels)
            self._check_size("scale_channels_backward scale_delta", scale_delta, m)
            self._launch(
                "scale_channels_scale_delta_kernel",
                self._grid1d(32 * m),
                (_BLOCK,),
                self._ptr(src),
                self._ptr(delta),
                *shape,
                self._ptr(scale_delta),
            )

    _NORMALIZATIONS = ("none", "relu", "softmax")

    def shortcut_weights(self, weights, inputs, channels, normalization, out):
        """The fork's weighted-shortcut weights normalised over the inputs per channel."""
        self._check_size("shortcut_weights weights", weights, inputs * channels)
        self._check_size("shortcut_weights out", out, inputs * channels)
        self._launch(
            "shortcut_weights_kernel",
            self._grid1d(channels),
            (_BLOCK,),
            self._ptr(weights),
            int(inputs),
            int(channels),
            self._NORMALIZATIONS.index(normalization),
            self._ptr(out),
        )

    def channel_weighted_add(self, src, src_stride, weights, step, width, batch, out, out_stride):
        """out[b*out_stride + j] += weights[j // step] * src[b*src_stride + j], j < width."""
        self._check_matrix("channel_weighted_add src", src, 0, batch, width, src_stride)
        self._check_matrix("channel_weighted_add out", out, 0, batch, width, out_stride)
        self._check_size("channel_weighted_add weights", weights, _ceil_div(width, step))
        self._launch_rows(
            "channel_weighted_add_kernel",
            batch,
            width,
            self._ptr(src),
            int(src_stride),
            self._ptr(weights),
            int(step),
            int(width),
            int(batch),
            self._ptr(out),
            int(out_stride),
        )

    def channel_weighted_dot(self, a, a_stride, b, b_stride, step, width, batch, out):
        """out[c] += sum over images and j < width with j // step == c of a[.. j] * b[.. j]."""
        self._check_matrix("channel_weighted_dot a", a, 0, batch, width, a_stride)
        self._check_matrix("channel_weighted_dot b", b, 0, batch, width, b_stride)
        channels = _ceil_div(width, step)
        self._check_size("channel_weighted_dot out", out, channels)
        self._launch(
            "channel_weighted_dot_kernel",
            (channels,),
            (_BLOCK,),
            self._ptr(a),
            int(a_stride),
            self._ptr(b),
            int(b_stride),
            int(step),
            int(width),
            int(batch),
            self._ptr(out),
        )

    # ---- random ----------------------------------------------------------------
    def dropout(self, x, prob, scale, rand, step_seed, layer_seed):
        """Training dropout with draws.uniform_hash(seed, i) as the draw, seed =
        step_seed[0] + layer_seed mod 2^32 (step_seed: a one-element int array, read on
        the device)."""
        self._sizes_match("dropout", x, rand)
        if step_seed.dtype != np.int32:
            raise TypeError("dropout step_seed must be an int32 array (backend.int_zeros)")
        self._launch(
            "dropout_forward_kernel",
            self._grid1d(rand.size),
            (_BLOCK,),
            self._ptr(x),
            rand.size,
            float(prob),
            float(scale),
            self._ptr(step_seed),
            int(layer_seed) & 0xFFFFFFFF,
            self._ptr(rand),
        )

    def dropout_backward(self, rand, prob, scale, delta):
        self._sizes_match("dropout_backward", rand, delta)
        self._launch(
            "dropout_backward_kernel",
            self._grid1d(rand.size),
            (_BLOCK,),
            self._ptr(rand),
            rand.size,
            float(prob),
            float(scale),
            self._ptr(delta),
        )

    def uniform(self, rand, seed):
        """rand[i] = draws.uniform_hash(seed, i)."""
        self._launch(
            "uniform_kernel",
            self._grid1d(rand.size),
            (_BLOCK,),
            self._ptr(rand),
            rand.size,
            (int(seed) * 0x9E3779B9) & 0xFFFFFFFF,
        )
