"""The CUDA backend's convolution backward as implicit GEMMs (conv_backward_*.cu):
the weight gradient and the data gradient read the input and the output delta where
they lie, with no im2col or col2im buffer, in fp32 (FFMA) or on the tensor cores
(tf32 / fp16 / bf16 operands, fp32 sums). A mixin of CudaBackend."""

import os

from ... import precision as precisions
from ...backends.cuda_core import _BLOCK, _ceil_div
from ...backends.errors import BackendError
from ...shapes import conv_out_size, conv_strides
from . import wgmma
from .numpy import unfolded_weight_grad

# precision -> (kernel name part, bytes of a packed weight)
_PARTS = {"fp32": ("f32", 4), "tf32": ("tf32", 4), "fp16": ("f16", 2), "bf16": ("bf16", 2)}
_PARTS_BYTES = dict(_PARTS.values())
# conv_backward_entries.cuh's tiles -> (BM, BN, threads per block)
_WGRAD_TC_TILES = {
    "128x128": (128, 128, 256),
    "64x128": (64, 128, 256),
    "32x128": (32, 128, 128),
    "64x64": (64, 64, 128),
    "32x64": (32, 64, 64),
}
_DGRAD_TC_TILES = {"128x128": (128, 128, 256), "64x128": (64, 128, 256), "32x128": (32, 128, 128)}
_WGRAD_F32_TILES = {
    "128x128x8": (128, 128, 256),
    "64x64x16": (64, 64, 256),
    "32x32x16": (32, 32, 64),
}
_DGRAD_F32_TILES = {"128x128x8": (128, 128, 256), "64x64x16": (64, 64, 256)}
# Split-K chunks are whole multiples of this many k (every tile's slice divides it).
_K_STEP = 32
# The most floats of split-K partials a weight gradient may take (128 MiB).
_PARTIALS_CAP = 1 << 25
# The fewest input channels of a data gradient run as the wgmma forward of the deltas.
_FORWARD_DGRAD_MIN_CHANNELS = 256
# Indexes inside the kernels are int32 per image and over images * pixels.
_INT32 = 2**31 - 1

# The kernel files this family launches from (formats from their declarations,
# backends/kernel_signatures.py): one file a precision (conv_backward_entries.cuh), a quarter
# of the compile each.
KERNEL_FILES = tuple(f"conv_backward_{part}.cu" for part in ("f16", "bf16", "tf32", "f32"))


class CudaConvBackward:
    """conv_backward_implicit, conv_weight_grad, conv_data_grad, conv_weight_grad_unfolded."""

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
        """NumpyBackend.conv_weight_grad_unfolded. Where the Hopper GEMM takes the product
        (fp16/bf16, wgmma.handles), im2col unfolds the images straight into its
        half-precision K-major operand (no fp32 col, no conversion pass: half the bytes
        written); else im2col into col and gemm / gemm_lowp, as Darknet. im: fp32, or a 16-bit
        layer output at `precision` (ValueError for another)."""
        self._input_storage("conv_weight_grad_unfolded im", im, precision)
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        n, k = channels * ksize * ksize, batch * out_h * out_w
        im_stride = int(im_stride) or channels * height * width
        if wgmma.handles(self, precision, filters, n, k):
            self._check_size("conv_weight_grad_unfolded delta", delta, filters * k)
            self._check_size(
                "conv_weight_grad_unfolded weight_updates", weight_updates, filters * n
            )
            self._check_size(
                "conv_weight_grad_unfolded im",
                im,
                (batch - 1) * im_stride + channels * height * width,
            )
            wgmma.weight_grad_unfolded(
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
            )
            return
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

    # "auto": each product where it measured faster (conv_backward_implicit); "always" and
    # "never" (im2col + GEMM + col2im) for benchmarks and the tests that compare the paths.
    # DARKNET_IMPLICIT_BACKWARD sets it for a process.
    implicit_conv_backward = os.environ.get("DARKNET_IMPLICIT_BACKWARD", "auto")
    # Forced plans for tests and benchmarks: (tile, splits) and tile; None = heuristic.
    wgrad_override = None
    dgrad_override = None
    # False: no unit-stride data gradient runs as the wgmma forward of the deltas (the
    # benchmarks time the implicit kernel on the same products).
    data_grad_as_forward = True

    @staticmethod
    def backward_tiles(precision):
        """(weight-gradient tiles, data-gradient tiles): the names wgrad_override and
        dgrad_override take for `precision`'s kernels."""
        if precision == "fp32":
            return tuple(_WGRAD_F32_TILES), tuple(_DGRAD_F32_TILES)
        return tuple(_WGRAD_TC_TILES), tuple(_DGRAD_TC_TILES)

    def conv_backward_implicit(
        self, precision, batch, channels, height, width, ksize, stride, pad, dilation, filters
    ):
        """(weight gradient, data gradient): whether conv_weight_grad and conv_data_grad
        take them for this convolution group; False: the caller unfolds im2col. Rules from
        timing both paths on every yolov4 shape (bench/kernels/conv_backward.py):
          * weight gradient: 1x1 kernels over at least 52x52 outputs, or up to 128 filters
            over at least 104x104 (past those, the gather repeated for each row of tiles
            costs more than the im2col buffer);
          * data gradient: a 1x1 kernel, at least 26x26 outputs, or strides other than 1
            (per parity class: 1.1-2.9x); not 3x3 at unit stride over fewer outputs
            (13x13, 512-1024 filters: 0.37 -> 0.42 ms, 0.57 -> 0.75), unless it runs as
            the wgmma forward of the deltas (_data_grad_as_forward, >= 256 channels).
        fp32 (FFMA tiles, against SGEMM): the weight gradient of 1x1 kernels over >= 52x52
        outputs and <= 128 filters, or of <= 32 weights a filter (a first layer); the data
        gradient of 1x1 kernels over >= 26x26 outputs, or strided over >= 52x52."""
        mode = self.implicit_conv_backward
        if mode not in ("auto", "always", "never"):
            raise BackendError(f"DARKNET_IMPLICIT_BACKWARD={mode!r}: use auto, always or never")
        if mode == "never" or precision not in _PARTS:
            return False, False
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        per_image = max(channels * height * width, filters * out_h * out_w)
        if not (
            out_h > 0
            and out_w > 0
            and batch * per_image <= _INT32
            and filters * ksize * ksize * channels <= _INT32
        ):
            return False, False
        if mode == "always":
            return True, True
        positions, strided = out_h * out_w, conv_strides(stride) != (1, 1)
        if precision == "fp32":  # FFMA against im2col + SGEMM + col2im
            weights = (
                ksize == 1 and positions >= 52 * 52 and filters <= 128
            ) or channels * ksize * ksize <= 32
            data = (ksize == 1 and positions >= 26 * 26) or (strided and positions >= 52 * 52)
            return weights, data
        weights = (ksize == 1 and positions >= 52 * 52) or (
            filters <= 128 and positions >= 104 * 104
        )
        data = (
            ksize == 1
            or positions >= 26 * 26
            or strided
            or self.data_grad_takes_forward(
                precision, batch, channels, height, width, ksize, pad, dilation, filters
            )
        )
        return weights, data

    # ---- plans ------------------------------------------------------------------------
    def wgrad_plan(self, precision, m, n, k):
        """(tile, splits) for a weight gradient of m filters x n weights over k = images *
        positions: tiles follow the filters (32x64 for a first layer's few weights); K split
        into chunks of ~2700, more where the tiles would not fill the SMs (each split >= 1024
        of K), the partials under 128 MiB."""
        if self.wgrad_override is not None:
            return self.wgrad_override
        sms = self.sm_count
        if precision == "fp32":
            if min(m, n) <= 32:
                tile = "32x32x16"
            elif min(m, n) <= 64 or _ceil_div(m, 128) * _ceil_div(n, 128) < sms:
                tile = "64x64x16"
            else:
                tile = "128x128x8"
            bm, bn, threads = _WGRAD_F32_TILES[tile]
        else:
            tile = "32x64" if m <= 32 and n <= 64 else "64x64" if m <= 64 else "128x128"
            bm, bn, threads = _WGRAD_TC_TILES[tile]
        tiles = _ceil_div(m, bm) * _ceil_div(n, bn)
        # at least 16 one-warp blocks per SM, 4 of four warps or 2 of eight, and splits of
        # ~2700 of K (the sweep's best on the 3x3 layers at 208x208: 512 splits of 1.4M)
        target = sms * {64: 16, 128: 4, 256: 2}[threads]
        splits = min(
            max(_ceil_div(target, tiles), k // 2700),
            k // 1024,
            max(1, _PARTIALS_CAP // (m * n)),
            4096,
        )
        return tile, max(1, splits)

    def dgrad_plan(self, precision, m, n):
        """The tile for a data gradient of m channels x n = images * pixels: rows follow
        the channels (n is always large)."""
        if self.dgrad_override is not None:
            return self.dgrad_override
        if precision == "fp32":
            return "64x64x16" if m <= 64 else "128x128x8"
        return "32x128" if m <= 32 else "64x128" if m <= 64 else "128x128"

    # ---- the ops --------------------------------------------------------------------------
    def _backward_geometry(
        self,
        what,
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
    ):
        out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
        batch, positions = int(batch), out_h * out_w
        delta_stride = int(delta_stride) or filters * positions
        im_stride = int(im_stride) or channels * height * width
        self._check_size(f"{what} delta", delta, (batch - 1) * delta_stride + filters * positions)
        self._check_size(f"{what} images", im, (batch - 1) * im_stride + channels * height * width)
        stride_y, stride_x = conv_strides(stride)
        geometry = (int(ksize), int(stride_y), int(stride_x), int(pad), int(dilation))
        return out_h, out_w, delta_stride, im_stride, geometry

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
        """NumpyBackend.conv_weight_grad as one implicit GEMM (K split over images and
        positions, partials added in a fixed order). im: fp32, or a 16-bit layer output at
        `precision` (its bits the operand's; ValueError for another)."""
        part, _ = _PARTS[precision]
        half_in = self._input_storage("conv_weight_grad im", im, precision) != precisions.DEFAULT
        channels, height, width, filters = int(channels), int(height), int(width), int(filters)
        out_h, out_w, delta_stride, im_stride, (ksize, sy, sx, pad, dilation) = (
            self._backward_geometry(
                "conv_weight_grad",
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
            )
        )
        m, n, k = filters, channels * ksize * ksize, int(batch) * out_h * out_w
        self._check_size("conv_weight_grad weight_updates", weight_updates, m * n)
        if m <= 0 or n <= 0 or k <= 0:
            return
        tile, splits = self.wgrad_plan(precision, m, n, k)
        bm, bn, threads = (_WGRAD_F32_TILES if precision == "fp32" else _WGRAD_TC_TILES)[tile]
        chunk = _ceil_div(_ceil_div(k, max(1, splits)), _K_STEP) * _K_STEP
        splits = _ceil_div(k, chunk)
        grid = (_ceil_div(n, bn), _ceil_div(m, bm), splits)
        args = (
            self._ptr(delta),
            delta_stride,
            self._ptr(im),
            im_stride,
            height,
            width,
            ksize,
            sy,
            sx,
            pad,
            dilation,
            out_h,
            out_w,
            m,
            n,
            k,
            chunk,
        )
        kernel = f"conv_wgrad_{part}_{tile}{'_in16' if half_in else ''}"
        if splits == 1:
            self._launch(kernel, grid, (threads,), *args, self._ptr(weight_updates), n, 1.0, 0)
            return
        partials = self._ptr(self._scratch_buffer("conv_wgrad", 4 * splits * m * n))
        self._launch(kernel, grid, (threads,), *args, partials, n, 0.0, m * n)
        self._splitk_reduce(m, n, splits, partials, 1.0, 1.0, self._ptr(weight_updates), n)

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
        """NumpyBackend.conv_data_grad as implicit GEMMs: each input pixel gathers the
        delta entries its taps reached (no col buffer, no atomics). Unit strides: one
        launch; others: one per parity class of the input pixels, each over only the taps
        that reach the delta from that class (a stride-2 3x3 kernel: 1, 2, 2 and 4 taps)."""
        part, _ = _PARTS[precision]
        channels, height, width, filters = int(channels), int(height), int(width), int(filters)
        out_h, out_w, delta_stride, dx_stride, (ksize, sy, sx, pad, dilation) = (
            self._backward_geometry(
                "conv_data_grad",
                delta,
                delta_stride,
                dx,
                dx_stride,
                channels,
                height,
                width,
                ksize,
                stride,
                pad,
                dilation,
                batch,
                filters,
            )
        )
        self._check_size("conv_data_grad weights", weights, filters * channels * ksize * ksize)
        batch = int(batch)
        if channels <= 0 or batch * height * width <= 0:
            return
        common = (self._ptr(delta), delta_stride, out_h, out_w)
        if (sy, sx) == (1, 1):
            self._data_grad_unit_stride(
                precision,
                part,
                weights,
                filters,
                delta,
                delta_stride,
                common,
                channels,
                height,
                width,
                ksize,
                pad,
                dilation,
                batch,
                dx,
                dx_stride,
                accumulate,
            )
            return
        self._data_grad_by_parity_class(
            precision,
            part,
            weights,
            filters,
            common,
            channels,
            height,
            width,
            ksize,
            sy,
            sx,
            pad,
            dilation,
            batch,
            dx,
            dx_stride,
            accumulate,
        )

    def _data_grad_unit_stride(
        self,
        precision,
        part,
        weights,
        filters,
        delta,
        delta_stride,
        common,
        channels,
        height,
        width,
        ksize,
        pad,
        dilation,
        batch,
        dx,
        dx_stride,
        accumulate,
    ):
        """conv_data_grad at unit strides: the wgmma forward of the deltas where it takes
        the product (_data_grad_as_forward), else one implicit-GEMM launch (conv_dgrad_*).
        common: (delta pointer, delta_stride, out_h, out_w), the kernels' shared arguments."""
        if self._data_grad_as_forward(
            precision,
            weights,
            filters,
            delta,
            delta_stride,
            channels,
            height,
            width,
            ksize,
            pad,
            dilation,
            batch,
            dx,
            dx_stride,
            accumulate,
        ):
            return
        k, n = filters * ksize * ksize, batch * height * width
        packed, pitch = self._pack_transposed(
            part, weights, filters, channels, ksize, (0, 1, ksize), (0, 1, ksize)
        )
        tile, bm, bn, threads = self._dgrad_tile(precision, channels, n)
        self._launch(
            f"conv_dgrad_{part}_{tile}",
            (_ceil_div(n, bn), _ceil_div(channels, bm)),
            (threads,),
            self._ptr(packed),
            pitch,
            *common,
            ksize,
            pad,
            dilation,
            height,
            width,
            channels,
            k,
            n,
            self._ptr(dx),
            dx_stride,
            int(bool(accumulate)),
        )

    def _data_grad_by_parity_class(
        self,
        precision,
        part,
        weights,
        filters,
        common,
        channels,
        height,
        width,
        ksize,
        sy,
        sx,
        pad,
        dilation,
        batch,
        dx,
        dx_stride,
        accumulate,
    ):
        """conv_data_grad at other strides: a launch (conv_dgrad_class_*) per parity class
        of the input pixels that has pixels (and, when accumulating, taps), over only the
        taps that reach the delta from it. common: as _data_grad_unit_stride's."""
        for py, *taps_y, cy0, dy, hc in _parity_classes(height, sy, pad, dilation, ksize):
            for px, *taps_x, cx0, dx_, wc in _parity_classes(width, sx, pad, dilation, ksize):
                ny, nx, n = taps_y[2], taps_x[2], batch * hc * wc
                if n == 0 or (accumulate and ny * nx == 0):
                    continue  # no pixels; or nothing to add
                packed, pitch = self._pack_transposed(
                    part, weights, filters, channels, ksize, taps_y, taps_x
                )
                tile, bm, bn, threads = self._dgrad_tile(precision, channels, n)
                self._launch(
                    f"conv_dgrad_class_{part}_{tile}",
                    (_ceil_div(n, bn), _ceil_div(channels, bm)),
                    (threads,),
                    self._ptr(packed),
                    pitch,
                    *common,
                    hc,
                    wc,
                    ny,
                    nx,
                    cy0,
                    cx0,
                    dy,
                    dx_,
                    channels,
                    filters * ny * nx,
                    n,
                    self._ptr(dx),
                    dx_stride,
                    height,
                    width,
                    py,
                    px,
                    sy,
                    sx,
                    int(bool(accumulate)),
                )

    @staticmethod
    def _flipped_pad(ksize, pad, dilation):
        """The padding of the forward convolution that is a unit-stride data gradient: the
        deltas padded so that the flipped kernel's taps reach what the forward's reached."""
        return dilation * (ksize - 1) - pad

    def data_grad_takes_forward(
        self, precision, batch, channels, height, width, ksize, pad, dilation, filters
    ):
        """Whether conv_data_grad runs this unit-stride data gradient as the wgmma forward
        of the deltas (_data_grad_as_forward): _data_grad_takes_forward, unless
        data_grad_as_forward is off."""
        return self.data_grad_as_forward and self._data_grad_takes_forward(
            precision, batch, channels, height, width, ksize, pad, dilation, filters
        )

    def _data_grad_takes_forward(
        self, precision, batch, channels, height, width, ksize, pad, dilation, filters
    ):
        """Whether a unit-stride data gradient runs as _data_grad_as_forward's convolution:
        where the wgmma forward takes it and its rows (the input's channels) fill the
        kernel's pairs of 128-row tiles. Fewer than 256 channels leave half a pair idle:
        yolov4's and yolov3-tiny's 64-128 channel layers at 26x26-52x52 measured 10-80%
        slower than the implicit kernel, those of 256 channels or more even to 45% faster
        (b32 fp16)."""
        return (
            channels >= _FORWARD_DGRAD_MIN_CHANNELS
            and self._flipped_pad(ksize, pad, dilation) >= 0
            and wgmma.forward_takes(
                self,
                precision,
                channels,
                batch * height * width,
                filters * ksize * ksize,
                ksize,
                height * width,
            )
        )

    def _data_grad_as_forward(
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
        pad,
        dilation,
        batch,
        dx,
        dx_stride,
        accumulate,
    ):
        """A unit-stride data gradient on Hopper (fp16/bf16) as the forward convolution of
        the deltas with the weights transposed (filters become channels) and flipped,
        padded by _flipped_pad: the wgmma forward's kernel, its sums added into dx
        (written, unless accumulate), no col buffer (folding a col's nine taps a pixel
        cost what the GEMM saved). False, having done nothing, where that kernel does not
        take the product."""
        if not self.data_grad_takes_forward(
            precision, batch, channels, height, width, ksize, pad, dilation, filters
        ):
            return False
        part, _ = _PARTS[precision]
        last = ksize - 1
        packed, pitch = self._pack_transposed(
            part, weights, filters, channels, ksize, (last, -1, ksize), (last, -1, ksize)
        )
        flipped = precisions.PackedWeights(
            packed, channels, filters * ksize * ksize, pitch, precision
        )
        out_h, out_w = conv_out_size(height, width, ksize, 1, pad, dilation)
        return wgmma.conv_forward(
            self,
            flipped,
            delta,
            filters,
            out_h,
            out_w,
            ksize,
            1,
            self._flipped_pad(ksize, pad, dilation),
            dilation,
            batch,
            delta_stride,
            None,
            "linear",
            dx,
            dx_stride,
            accumulate=accumulate,
        )

    def _dgrad_tile(self, precision, m, n):
        tile = self.dgrad_plan(precision, m, n)
        return (tile, *(_DGRAD_F32_TILES if precision == "fp32" else _DGRAD_TC_TILES)[tile])

    def _pack_transposed(self, part, weights, filters, channels, ksize, taps_y, taps_x):
        """(array, pitch) of Wt[c][(f, i, j)] = W[f][c][ky0 + i*step_y][kx0 + j*step_x]
        (taps_*: (first tap, step, count)) in the kernel's precision, rows padded to 16
        bytes (the FFMA tiles read float4s): a scratch buffer, reused by the next call
        (the stream orders them)."""
        size = _PARTS_BYTES[part]
        k = filters * taps_y[2] * taps_x[2]
        per = 16 // size
        pitch = _ceil_div(max(k, 1), per) * per
        packed = self._scratch_buffer("conv_dgrad_weights", channels * pitch * size)
        self._launch(
            f"pack_transposed_{part}",
            self._grid1d(channels * pitch * size // 4),
            (_BLOCK,),
            self._ptr(weights),
            filters,
            channels,
            ksize,
            *taps_y,
            *taps_x,
            pitch,
            self._ptr(packed),
        )
        return packed, pitch


def _parity_classes(size, stride, pad, dilation, ksize):
    """Along one axis of a strided data gradient: per parity p < stride of the input
    pixels (p + stride*i), (p, first tap, tap step, taps, c0, delta step, pixels): the taps
    t with (p + pad - t*dilation) divisible by the stride (every `step`-th one), and tap j of
    them reads the delta at i + c0 - j*(delta step)."""
    classes = []
    for p in range(stride):
        pixels = max(0, _ceil_div(size - p, stride))
        taps = [t for t in range(ksize) if (p + pad - t * dilation) % stride == 0]
        if not taps:
            classes.append((p, 0, 1, 0, 0, 0, pixels))
            continue
        step = taps[1] - taps[0] if len(taps) > 1 else 1
        c0 = (p + pad - taps[0] * dilation) // stride
        classes.append((p, taps[0], step, len(taps), c0, step * dilation // stride, pixels))
    return classes
