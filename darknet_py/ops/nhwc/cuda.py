"""The NHWC 16-bit ops on the device (nhwc.cu; the reference and the layout's rules are
ops/nhwc/numpy.py): a [route]'s copies, maxpool, upsample, shortcut, and the boundaries
fp32 NCHW <-> 16-bit NHWC. A mixin of CudaBackend."""

import numpy as np

from ... import activations
from ...backends.cuda_core import _BLOCK, _ceil_div
from ..elementwise.cuda import _STORAGE_SUFFIX
from ..images.cuda import GEOMETRY_SLOT_WORDS, image_geometry
from .numpy import PIXEL_ALIGN, check_span, half_storage, padded_end

# The kernel files launched from here (their formats read from the declarations); the
# letterbox into an NHWC input, letterbox_u8_nhwc_kernel_*, lives in preprocess.cu (images).
KERNEL_FILES = ("nhwc.cu",)

_VECTOR_BYTES = 16  # a group of 8 16-bit channels


def _aligned(*tensors):
    """Whether every (array, pitch, offset) allows the kernels' 16-byte accesses: the
    array's address a multiple of 16, the pitch and the offset multiples of 8."""
    return all(
        a.ptr % _VECTOR_BYTES == 0 and pitch % PIXEL_ALIGN == 0 and offset % PIXEL_ALIGN == 0
        for a, pitch, offset in tensors
    )


def _groups(c, out_pitch, out_offset):
    """Groups of 8 channels a writer of c channels at out_offset covers per pixel."""
    return (padded_end(out_offset, c, out_pitch) - (out_offset & ~7)) // PIXEL_ALIGN


class CudaNhwc:
    """CudaBackend's NHWC ops (NumpyBackend's ops/nhwc/numpy.py NumpyNhwc)."""

    def _nhwc_sizes(self, op, x, x_pixels, x_pitch, out, out_pixels, out_pitch):
        self._check_size(f"{op} x", x, x_pixels * x_pitch)
        self._check_size(f"{op} out", out, out_pixels * out_pitch)

    def nhwc_from_nchw(self, x, batch, c, h, w, out, out_pitch, out_offset):
        op = "nhwc_from_nchw"
        kept = half_storage(op, self.storage_of, out=out)
        if x.dtype != np.float32:
            raise TypeError(f"{op}: x must be an fp32 array, got {x.dtype}")
        check_span(op, "out", c, out_pitch, out_offset)
        self._check_size(f"{op} x", x, batch * c * h * w)
        self._check_size(f"{op} out", out, batch * h * w * out_pitch)
        groups = _groups(c, out_pitch, out_offset)
        self._launch(
            "nhwc_from_nchw_kernel" + _STORAGE_SUFFIX[kept],
            self._grid1d(batch * h * w * groups),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(c),
            int(h * w),
            self._ptr(out),
            int(out_pitch),
            int(out_offset),
            int(groups),
            int(_aligned((out, out_pitch, out_offset))),
        )

    def nhwc_to_nchw(self, x, batch, c, h, w, x_pitch, x_offset, out):
        op = "nhwc_to_nchw"
        kept = half_storage(op, self.storage_of, x=x)
        if out.dtype != np.float32:
            raise TypeError(f"{op}: out must be an fp32 array, got {out.dtype}")
        check_span(op, "x", c, x_pitch, x_offset)
        self._check_size(f"{op} x", x, batch * h * w * x_pitch)
        self._check_size(f"{op} out", out, batch * c * h * w)
        groups = _ceil_div(c, PIXEL_ALIGN)
        self._launch(
            "nhwc_to_nchw_kernel" + _STORAGE_SUFFIX[kept],
            self._grid1d(batch * h * w * groups),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(c),
            int(h * w),
            int(x_pitch),
            int(x_offset),
            self._ptr(out),
            int(groups),
            int(_aligned((x, x_pitch, x_offset))),
        )

    def nhwc_copy_channels(self, x, batch, c, h, w, x_pitch, x_offset, out, out_pitch, out_offset):
        op = "nhwc_copy_channels"
        half_storage(op, self.storage_of, x=x, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        pixels = batch * h * w
        self._nhwc_sizes(op, x, pixels, x_pitch, out, pixels, out_pitch)
        groups = _groups(c, out_pitch, out_offset)
        self._launch(
            "nhwc_copy_channels_kernel",
            self._grid1d(pixels * groups),
            (_BLOCK,),
            self._ptr(x),
            int(pixels),
            int(c),
            int(x_pitch),
            int(x_offset),
            self._ptr(out),
            int(out_pitch),
            int(out_offset),
            int(groups),
            int(_aligned((x, x_pitch, x_offset), (out, out_pitch, out_offset))),
        )

    def nhwc_maxpool(
        self,
        x,
        batch,
        c,
        h,
        w,
        x_pitch,
        x_offset,
        size,
        stride_x,
        stride_y,
        padding,
        out,
        out_pitch,
        out_offset,
    ):
        op = "nhwc_maxpool"
        kept = half_storage(op, self.storage_of, x=x, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        self._nhwc_sizes(op, x, batch * h * w, x_pitch, out, batch * out_h * out_w, out_pitch)
        groups = _groups(c, out_pitch, out_offset)
        self._launch(
            "nhwc_maxpool_kernel" + _STORAGE_SUFFIX[kept],
            self._grid1d(batch * out_h * out_w * groups),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(c),
            int(h),
            int(w),
            int(x_pitch),
            int(x_offset),
            int(size),
            int(stride_x),
            int(stride_y),
            int(padding),
            int(out_h),
            int(out_w),
            self._ptr(out),
            int(out_pitch),
            int(out_offset),
            int(groups),
            int(_aligned((x, x_pitch, x_offset), (out, out_pitch, out_offset))),
        )

    def nhwc_upsample(
        self, x, batch, c, h, w, x_pitch, x_offset, stride, scale, out, out_pitch, out_offset
    ):
        op = "nhwc_upsample"
        kept = half_storage(op, self.storage_of, x=x, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        self._nhwc_sizes(
            op, x, batch * h * w, x_pitch, out, batch * h * w * stride * stride, out_pitch
        )
        groups = _groups(c, out_pitch, out_offset)
        self._launch(
            "nhwc_upsample_kernel" + _STORAGE_SUFFIX[kept],
            self._grid1d(batch * h * w * stride * stride * groups),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(c),
            int(h),
            int(w),
            int(x_pitch),
            int(x_offset),
            int(stride),
            float(scale),
            self._ptr(out),
            int(out_pitch),
            int(out_offset),
            int(groups),
            int(_aligned((x, x_pitch, x_offset), (out, out_pitch, out_offset))),
        )

    def nhwc_shortcut(
        self,
        x,
        x_pitch,
        x_offset,
        add,
        add_c,
        add_pitch,
        add_offset,
        batch,
        c,
        h,
        w,
        s1,
        s2,
        activation,
        out,
        out_pitch,
        out_offset,
    ):
        op = "nhwc_shortcut"
        kept = half_storage(op, self.storage_of, x=x, add=add, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "add", add_c, add_pitch, add_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        pixels = batch * h * w
        self._nhwc_sizes(op, x, pixels, x_pitch, out, pixels, out_pitch)
        self._check_size(f"{op} add", add, pixels * add_pitch)
        groups = _groups(c, out_pitch, out_offset)
        vector = _aligned(
            (x, x_pitch, x_offset), (add, add_pitch, add_offset), (out, out_pitch, out_offset)
        )
        self._launch(
            "nhwc_shortcut_kernel" + _STORAGE_SUFFIX[kept],
            self._grid1d(pixels * groups),
            (_BLOCK,),
            self._ptr(x),
            int(x_pitch),
            int(x_offset),
            self._ptr(add),
            int(add_c),
            int(add_pitch),
            int(add_offset),
            int(pixels),
            int(c),
            float(s1),
            float(s2),
            int(activations.ACTIVATION_IDS[activation]),
            self._ptr(out),
            int(out_pitch),
            int(out_offset),
            int(groups),
            int(vector),
        )

    def letterbox_images_nhwc(self, src, shapes, offsets, width, height, letter, out, out_pitch):
        op = "letterbox_images_nhwc"
        kept = half_storage(op, self.storage_of, out=out)
        check_span(op, "out", 3, out_pitch, 0)
        shapes = [(int(h), int(w)) for h, w in shapes]
        if src.dtype != np.uint8:
            raise TypeError(f"{op}: src must be a uint8 array (upload_bytes_async)")
        for (ih, iw), offset in zip(shapes, offsets):
            if ih <= 0 or iw <= 0:
                raise ValueError(f"{op}: an image of {iw} x {ih} pixels")
            self._check_size(f"{op} src", src, int(offset) + ih * iw * 3)
        self._check_size(f"{op} out", out, len(shapes) * height * width * out_pitch)
        if not shapes:
            return
        words = image_geometry(shapes, offsets, width, height, letter)
        geometry = self._scratch_buffer("image_geometry", words.nbytes)  # stream-ordered
        if words.size <= GEOMETRY_SLOT_WORDS:
            self._geometry_copy(geometry, words)
        else:
            self._htod(geometry, words)
        self._launch(
            "letterbox_u8_nhwc_kernel" + _STORAGE_SUFFIX[kept],
            (_ceil_div(height * width, _BLOCK), len(shapes)),
            (_BLOCK,),
            self._ptr(src),
            self._ptr(geometry),
            int(height),
            int(width),
            self._ptr(out),
            int(out_pitch),
            int(_aligned((out, out_pitch, 0))),
        )
