"""The CUDA backend's convolution path: SGEMM (gemm.cu), the tensor-core GEMM and
implicit-GEMM convolution forward with its weight packing (gemm_tc_*.cu,
gemm_core.cuh), im2col/col2im (ops/convolution/im2col.cu). A mixin of CudaBackend."""

import numpy as np

from ... import activations
from ... import precision as precisions
from ...backends.cuda_core import _BLOCK, _ceil_div
from ...shapes import conv_out_size, conv_strides
from . import wgmma

_GEMM_TILES = {  # variant (see gemm.cu) -> (BM, BN, BK, threads per block)
    "128x128x8s4": (128, 128, 8, 256),
    "64x64x8s4r8": (64, 64, 8, 64),
    "32x32x8s4w": (32, 32, 8, 32),
}
# Tensor-core tiles (gemm_tc.cuh's TC_TILES) -> (BM, BN, threads per block).
_TC_TILES = {
    "128x128": (128, 128, 256),
    "64x128": (64, 128, 256),
    "32x128": (32, 128, 128),
    "16x128": (16, 128, 128),
    "64x64": (64, 64, 128),
}
# precision -> (kernel name part, bytes of an operand element)
_TC_PRECISIONS = {"fp16": ("f16", 2), "bf16": ("bf16", 2), "tf32": ("tf32", 4)}
_TC_SLICE_BYTES = 64  # SLICE_BYTES of gemm_tc.cuh: K advances by this many bytes a row
# The sgemm / splitk_reduce epilogue's (bias, activation) when there is none: a null
# pointer, and linear (gemm.cu EPI_NONE).
_NO_EPILOGUE = (0, activations.ACTIVATION_IDS["linear"])

# The kernel files this family launches from; each kernel's argument format is read from its
# declaration there (backends/kernel_signatures.py). gemm_tc_*.cu: one file a precision
# (gemm_tc.cuh's TC_PRECISION_ENTRIES), a third of the compile each; conv_tc_half_*.cu: the
# forward with a 16-bit side (fp32 images into a 16-bit output, _h, and images at the
# precision's 16 bits, _in16), a file of its own a precision.
KERNEL_FILES = (
    "gemm.cu",
    *(f"gemm_tc_{p}.cu" for p, _ in _TC_PRECISIONS.values()),
    *(f"conv_tc_half_{p}.cu" for p in ("f16", "bf16")),
    "im2col.cu",
)


# storage_of's 16-bit storages -> the kernel name part of their bits
_STORAGE_PARTS = {"fp16": "f16", "bf16": "bf16"}


class CudaConv:
    """gemm, gemm_lowp, pack_weights, conv_forward, im2col, col2im."""

    @staticmethod
    def tc_tiles():
        """The tensor-core tiles' names, as tc_plan gives them and tc_override takes them."""
        return tuple(_TC_TILES)

    def _input_storage(self, what, im, precision):
        """How `im` (a layer's output read as a convolution's input) is kept: fp32, or the
        16 bits of storage_zeros(n, precision), whose bits the kernels take as the operand's
        (ValueError for 16 bits of another precision: fp16 into bf16, or any into fp32 /
        tf32)."""
        stored = self.storage_of(im)
        if stored != precisions.DEFAULT and stored != precision:
            raise ValueError(
                f"{what}: the input is kept at {stored}, the op runs at {precision} "
                f"(an input must be fp32 or at the op's own 16-bit precision)"
            )
        return stored

    def gemm_plan(self, m, n, k):
        """(variant, splits) the gemm heuristic picks for an m x n x k product.

        Rules from timing every plan on the convolutions of yolov3-tiny and cifar
        (bench/kernels/conv_plans.py):
          * m or n at most 32 (a first layer's few filters or weights): one-warp
            32x32 tiles, K split until about 8 blocks per SM (each split >= 256 of K);
          * at least 2.5 waves of 128x128 tiles (2 per SM): 128x128, K whole;
          * fewer, but still 48 or more: 128x128 with K split into up to 8 slices,
            toward ~1150 blocks, each slice >= 512 of K (a weight gradient, or a
            forward whose tiles would leave a second wave nearly empty);
          * else 64x64 tiles with K split toward 16 blocks per SM (each >= 512)."""
        if self.gemm_override is not None:
            return self.gemm_override
        sms = self.sm_count
        if min(m, n) <= 32:
            tiles = _ceil_div(m, 32) * _ceil_div(n, 32)
            return "32x32x8s4w", max(1, min(_ceil_div(8 * sms, tiles), k // 256))
        big = _ceil_div(m, 128) * _ceil_div(n, 128)
        if m > 64 and n > 64 and 2 * big >= 5 * sms:
            return "128x128x8s4", 1
        if m > 64 and n > 64 and big >= 48:
            return "128x128x8s4", max(1, min(8, _ceil_div(1152, big), k // 512))
        tiles = _ceil_div(m, 64) * _ceil_div(n, 64)
        return "64x64x8s4r8", max(1, min(_ceil_div(16 * sms, tiles), k // 512))

    def gemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """C = alpha * op(A) @ op(B) + beta * C, row-major, as Darknet's gemm()."""
        self._sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, None, "linear")

    def gemm_bias_activate(self, m, n, k, a, lda, b, ldb, c, ldc, biases, activation):
        """C = activation(A @ B + biases[row]): a convolution's inference forward with its
        bias (batch norm folded in) and activation in the GEMM's epilogue, one kernel, the
        bits of gemm + bias_activate. Activations outside precision.EPILOGUE_ACTIVATIONS
        run as a pass of their own after."""
        self._check_size("gemm_bias_activate biases", biases, m)
        fused = activation in precisions.EPILOGUE_ACTIVATIONS
        self._sgemm(
            False,
            False,
            m,
            n,
            k,
            1.0,
            a,
            lda,
            b,
            ldb,
            0.0,
            c,
            ldc,
            biases,
            activation if fused else "linear",
        )
        if not fused:
            self.activate_strided(c, m, ldc, 0, n, activation)

    def _sgemm(self, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, biases, activation):
        """gemm, then biases[row] (None: none) and the activation in the epilogue."""
        m, n, k, lda, ldb, ldc = (int(v) for v in (m, n, k, lda, ldb, ldc))
        if ta:
            self._check_matrix("gemm A", a, 0, k, m, lda)
        else:
            self._check_matrix("gemm A", a, 0, m, k, lda)
        if tb:
            self._check_matrix("gemm B", b, 0, n, k, ldb)
        else:
            self._check_matrix("gemm B", b, 0, k, n, ldb)
        self._check_matrix("gemm C", c, 0, m, n, ldc)
        if m <= 0 or n <= 0:
            return
        tile, splits = self.gemm_plan(m, n, k)
        bm, bn, bk, threads = _GEMM_TILES[tile]
        kernel = f"sgemm_{tile}_{'t' if ta else 'n'}{'t' if tb else 'n'}"
        grid_mn = (_ceil_div(n, bn), _ceil_div(m, bm))
        if splits > 1 and k > 0:
            # Chunks are whole BK slices; recount splits so none is empty.
            chunk = _ceil_div(_ceil_div(k, splits), bk) * bk
            splits = _ceil_div(k, chunk)
        else:
            splits, chunk = 1, max(k, 1)
        pa, pb, pc = self._ptr(a), self._ptr(b), self._ptr(c)
        alpha, beta = float(alpha), float(beta)
        epilogue = (
            0 if biases is None else self._ptr(biases),  # 0: a null pointer
            activations.ACTIVATION_IDS[activation],
        )
        if splits == 1:
            vec4 = int(pc % 16 == 0 and ldc % 4 == 0)
            self._launch(
                kernel,
                grid_mn + (1,),
                (threads,),
                m,
                n,
                k,
                alpha,
                pa,
                lda,
                pb,
                ldb,
                beta,
                pc,
                ldc,
                chunk,
                vec4,
                0,
                *epilogue,
            )
            return
        ws = self._ptr(self._scratch_buffer("gemm", 4 * splits * m * n))
        self._launch(
            kernel,
            grid_mn + (splits,),
            (threads,),
            m,
            n,
            k,
            1.0,
            pa,
            lda,
            pb,
            ldb,
            0.0,
            ws,
            n,
            chunk,
            int(n % 4 == 0),
            m * n,
            *_NO_EPILOGUE,
        )
        self._splitk_reduce(m, n, splits, ws, alpha, beta, pc, ldc, epilogue)

    def _splitk_reduce(self, m, n, splits, ws, alpha, beta, pc, ldc, epilogue=None):
        """C = alpha * the splits' partials summed + beta * C (then the epilogue)."""
        # Threads per output: one per 16 splits, up to 32 (a block is 256 threads).
        per_output = min(32, 1 << (max(1, splits // 16).bit_length() - 1))
        width = _BLOCK // per_output
        self._launch(
            "splitk_reduce",
            (_ceil_div(m * n, width),),
            (width, per_output),
            m,
            n,
            splits,
            ws,
            float(alpha),
            float(beta),
            pc,
            ldc,
            *(epilogue or _NO_EPILOGUE),
        )

    # ---- reduced precision: tensor cores (gemm_tc_*.cu) -------------------
    def tc_plan(self, m, n, k, split=True):
        """(tile, splits) for an m x n x k tensor-core product: the tile's rows follow m
        (few filters: 16 or 32 rows), 64x64 where wider tiles would not fill the SMs
        once; K split (split=True) until about 2 blocks per SM, each split >= 1024 of K."""
        if self.tc_override is not None:
            return self.tc_override
        sms = self.sm_count
        if m <= 16:
            tile = "16x128"
        elif m <= 32:
            tile = "32x128"
        elif m <= 64:
            tile = "64x128" if _ceil_div(n, 128) >= sms else "64x64"
        else:
            tile = "128x128" if _ceil_div(m, 128) * _ceil_div(n, 128) >= sms else "64x64"
        bm, bn, _ = _TC_TILES[tile]
        tiles = _ceil_div(m, bm) * _ceil_div(n, bn)
        splits = max(1, min(_ceil_div(2 * sms, tiles), k // 1024, 256)) if split else 1
        return tile, splits

    @staticmethod
    def _tc_name(precision):
        try:
            return _TC_PRECISIONS[precision]
        except KeyError:
            raise ValueError(
                f"no tensor-core kernels for precision '{precision}' "
                f"(use one of {', '.join(_TC_PRECISIONS)})"
            ) from None

    def gemm_lowp(self, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
        """gemm on the tensor cores: op(A), op(B) rounded to `precision`, fp32 sums."""
        part, _ = self._tc_name(precision)
        m, n, k, lda, ldb, ldc = (int(v) for v in (m, n, k, lda, ldb, ldc))
        if ta and tb:
            raise ValueError("gemm_lowp: op(A) and op(B) both transposed is not supported")
        self._check_matrix("gemm A", a, 0, *((k, m) if ta else (m, k)), lda)
        self._check_matrix("gemm B", b, 0, *((n, k) if tb else (k, n)), ldb)
        self._check_matrix("gemm C", c, 0, m, n, ldc)
        if m <= 0 or n <= 0:
            return
        # Hopper: wgmma + TMA where the product fills the chip (wgmma.handles).
        if wgmma.gemm_lowp(self, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
            return
        tile, splits = self.tc_plan(m, n, k)
        bm, bn, threads = _TC_TILES[tile]
        kernel = f"gemm_tc_{part}_{tile}_{'t' if ta else 'n'}{'t' if tb else 'n'}"
        chunk = _ceil_div(_ceil_div(max(k, 1), splits), 32) * 32
        splits = max(1, _ceil_div(k, chunk))
        grid = (_ceil_div(n, bn), _ceil_div(m, bm), splits)
        pa, pb, pc = self._ptr(a), self._ptr(b), self._ptr(c)
        if splits == 1:
            self._launch(
                kernel,
                grid,
                (threads,),
                m,
                n,
                k,
                float(alpha),
                pa,
                lda,
                pb,
                ldb,
                float(beta),
                pc,
                ldc,
                chunk,
                0,
            )
            return
        ws = self._ptr(self._scratch_buffer("gemm", 4 * splits * m * n))
        self._launch(
            kernel, grid, (threads,), m, n, k, 1.0, pa, lda, pb, ldb, 0.0, ws, n, chunk, m * n
        )
        self._splitk_reduce(m, n, splits, ws, alpha, beta, pc, ldc)

    def pack_weights(self, weights, rows, k, precision):
        """A convolution group's weights (rows x k fp32) converted once for conv_forward:
        rows of `pitch` elements (16-byte aligned, zero past k)."""
        part, size = self._tc_name(precision)
        rows, k = int(rows), int(k)
        self._check_size("pack_weights weights", weights, rows * k)
        pitch = _ceil_div(k, 16 // size) * (16 // size)
        data = self._new(rows * pitch, np.float16 if size == 2 else np.float32)
        words = rows * pitch * size // 4
        self._launch(
            f"pack_weights_{part}",
            self._grid1d(words),
            (_BLOCK,),
            self._ptr(weights),
            rows,
            k,
            pitch,
            self._ptr(data),
        )
        return precisions.PackedWeights(data, rows, k, pitch, precision)

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
        """NumpyBackend.conv_forward as one implicit-GEMM launch (no col buffer); a 16-bit
        out (out_precision fp16/bf16: storage_zeros' array) written by the `_h` entries. im:
        fp32, or a 16-bit layer output at packed.precision (storage_of), whose bits the
        `_in16` entries stage as the operand's: the same bits as its values widened to fp32
        (ValueError for 16 bits of another precision)."""
        part, _ = self._tc_name(packed.precision)
        half_in = self._input_storage("conv_forward im", im, packed.precision) != precisions.DEFAULT
        half_out = self._conv_forward_writes_half(packed, activation, out, out_precision)
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        batch, positions = int(batch), out_h * out_w
        im_stride = int(im_stride) or channels * height * width
        if packed.k != channels * ksize * ksize:
            raise ValueError(
                f"conv_forward: weights of {packed.k} per filter for "
                f"{channels} channels of {ksize}x{ksize}"
            )
        self._check_size("conv_forward im", im, (batch - 1) * im_stride + channels * height * width)
        self._check_size(
            "conv_forward out", out, (batch - 1) * out_stride + packed.rows * positions
        )
        if biases is not None:
            self._check_size("conv_forward biases", biases, packed.rows)
        # Hopper: the layers whose implicit GEMM is bound by its math go to wgmma.
        if wgmma.conv_forward(
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
            half_out,
        ):
            return
        self._conv_forward_implicit_gemm(
            part,
            packed,
            im,
            im_stride,
            height,
            width,
            ksize,
            stride,
            pad,
            dilation,
            batch * positions,
            out_h,
            out_w,
            biases,
            activation,
            out,
            out_stride,
            half_in,
            half_out,
        )

    def _conv_forward_writes_half(self, packed, activation, out, out_precision):
        """Whether conv_forward writes a 16-bit out (the `_h` entries), having checked that
        out is kept at out_precision, fp32 or packed's own 16 bits, and that the epilogue
        applies the activation (ValueError, TypeError)."""
        half_out = precisions.storage(out_precision) != precisions.DEFAULT
        if half_out and out_precision != packed.precision:
            raise ValueError(
                f"conv_forward at {packed.precision} writes fp32 or "
                f"{packed.precision}, not {out_precision}"
            )
        self._x_suffix(out, out_precision)  # TypeError: out is not that storage
        if activation not in precisions.EPILOGUE_ACTIVATIONS:
            raise ValueError(
                f"conv_forward applies {', '.join(precisions.EPILOGUE_ACTIVATIONS)}, "
                f"not {activation}"
            )
        return half_out

    def _conv_forward_implicit_gemm(
        self,
        part,
        packed,
        im,
        im_stride,
        height,
        width,
        ksize,
        stride,
        pad,
        dilation,
        n,
        out_h,
        out_w,
        biases,
        activation,
        out,
        out_stride,
        half_in,
        half_out,
    ):
        """conv_forward's checked arguments as one tensor-core implicit-GEMM launch
        (conv_tc_*) over n = images * output positions, where the Hopper kernel did not
        take them."""
        stride_y, stride_x = conv_strides(stride)
        tile, _ = self.tc_plan(packed.rows, n, packed.k, split=False)
        bm, bn, threads = _TC_TILES[tile]
        # a 16-bit image: the _in16 entry, whose last argument picks the output's storage
        kernel, last = (
            (f"conv_tc_{part}_{tile}_in16", (int(half_out),))
            if half_in
            else (f"conv_tc_{part}_{tile}{'_h' if half_out else ''}", ())
        )
        self._launch(
            kernel,
            (_ceil_div(n, bn), _ceil_div(packed.rows, bm)),
            (threads,),
            self._ptr(packed.data),
            packed.pitch,
            self._ptr(im),
            im_stride,
            int(height),
            int(width),
            int(ksize),
            int(stride_y),
            int(stride_x),
            int(pad),
            int(dilation),
            int(out_h),
            int(out_w),
            packed.rows,
            packed.k,
            n,
            0 if biases is None else self._ptr(biases),
            activations.ACTIVATION_IDS[activation],
            self._ptr(out),
            int(out_stride),
            *last,
        )

    # ---- convolution helpers -----------------------------------------------
    def _conv_args(self, src, channels, height, width, ksize, stride, pad, dilation, dst):
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        stride_y, stride_x = conv_strides(stride)
        return (
            self._ptr(src),
            int(channels),
            int(height),
            int(width),
            int(ksize),
            int(stride_y),
            int(stride_x),
            int(pad),
            int(dilation),
            int(out_h),
            int(out_w),
            self._ptr(dst),
        )

    def im2col(
        self, im, channels, height, width, ksize, stride, pad, dilation, col, batch=1, im_stride=0
    ):
        """Unfold images (`im_stride` apart; 0: packed) into col, laid out
        (channels*k*k) x batch x (out_h*out_w). im: fp32, or a 16-bit layer output
        (storage_zeros), widened exactly."""
        stored = self.storage_of(im)
        kernel = (
            "im2col_kernel"
            if stored == precisions.DEFAULT
            else f"im2col_from_{_STORAGE_PARTS[stored]}_kernel"
        )
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        batch, im_stride = int(batch), int(im_stride) or channels * height * width
        self._check_size("im2col im", im, (batch - 1) * im_stride + channels * height * width)
        self._check_size(
            "im2col col", col, channels * ksize * ksize * batch * max(out_h, 0) * max(out_w, 0)
        )
        if out_h > 0 and out_w > 0:
            # one thread per (channel, image, output position)
            self._launch_rows(
                kernel,
                channels * batch,
                out_h * out_w,
                *self._conv_args(im, channels, height, width, ksize, stride, pad, dilation, col),
                batch,
                im_stride,
            )

    def col2im(
        self, col, channels, height, width, ksize, stride, pad, dilation, im, batch=1, im_stride=0
    ):
        """Fold col back, *adding* into the images (the adjoint of im2col)."""
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        batch, im_stride = int(batch), int(im_stride) or channels * height * width
        self._check_size("col2im im", im, (batch - 1) * im_stride + channels * height * width)
        self._check_size(
            "col2im col", col, channels * ksize * ksize * batch * max(out_h, 0) * max(out_w, 0)
        )
        if out_h > 0 and out_w > 0:
            # one thread per image element: (channel, image) x pixels
            self._launch_rows(
                "col2im_kernel",
                channels * batch,
                height * width,
                *self._conv_args(col, channels, height, width, ksize, stride, pad, dilation, im),
                batch,
                im_stride,
            )
