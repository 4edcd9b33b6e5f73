"""The CUDA backend's image input: photos uploaded as their uint8 bytes (a quarter of the
float input's) on the copy stream, then converted, letterboxed or resized and normalised
into the network input by preprocess.cu. A mixin of CudaBackend."""

import numpy as np
import pycuda.driver as drv

from ...backends.cuda_core import _BLOCK, _ceil_div
from ...image import sized_shape

# The kernel file this family launches from (formats from its declarations,
# backends/kernel_signatures.py).
KERNEL_FILES = ("preprocess.cu",)

GEOMETRY_WORDS = 10  # G_WORDS of preprocess.cu (enum Geometry)
# Page-locked host slots the geometry is copied from, used in turn: a copy from pageable
# memory may wait for the stream to drain (the host could not queue the next part's
# work ahead), one from a slot is a DMA. A slot is reused once its last copy has run;
# _Device.close frees them. Geometry of more images goes the pageable way.
GEOMETRY_SLOTS = 8
GEOMETRY_SLOT_WORDS = 1024 * GEOMETRY_WORDS


def image_geometry(shapes, offsets, width, height, letter):
    """The kernel's per-image words (enum Geometry of preprocess.cu) for images of
    `shapes` (rows, columns) at byte `offsets`: image.letterbox's sizes and placement
    (letter) or a plain resize to width x height, and resize_image's float32 scales."""
    words = np.zeros((len(shapes), GEOMETRY_WORDS), dtype=np.int64)
    for row, ((ih, iw), offset) in zip(words, zip(shapes, offsets)):
        new_w, new_h = sized_shape(iw, ih, width, height, letter)
        scale_x = np.float32((iw - 1) / (new_w - 1)) if new_w > 1 else np.float32(0)
        scale_y = np.float32((ih - 1) / (new_h - 1)) if new_h > 1 else np.float32(0)
        row[:] = (
            int(offset) & 0xFFFFFFFF,
            int(offset) >> 32,
            ih,
            iw,
            new_h,
            new_w,
            (height - new_h) // 2,
            (width - new_w) // 2,
            scale_y.view(np.uint32),
            scale_x.view(np.uint32),
        )
    return words.astype(np.uint32).view(np.int32).reshape(-1)


class CudaImages:
    """upload_bytes_async, letterbox_images."""

    def upload_bytes_async(self, host):
        """upload_async for a uint8 host array: the backend array holds its bytes."""
        host = np.asarray(host)
        if host.dtype != np.uint8:
            raise TypeError(f"upload_bytes_async takes uint8 arrays, got {host.dtype}")
        return self._upload_flat_async(np.ascontiguousarray(host.reshape(-1)))

    def letterbox_images(self, src, shapes, offsets, width, height, letter, out):
        """out (N, 3, height, width) = the OpenCV BGR uint8 (rows, columns, 3) images of
        `src` (a uint8 array; image i's bytes from offsets[i]) as image.py makes them:
        from_bgr, then letterbox (letter) or resize_image to width x height. One launch."""
        shapes = [(int(h), int(w)) for h, w in shapes]
        if src.dtype != np.uint8:
            raise TypeError("letterbox_images: src must be a uint8 array (upload_bytes_async)")
        for (ih, iw), offset in zip(shapes, offsets):
            if ih <= 0 or iw <= 0:
                raise ValueError(f"letterbox_images: an image of {iw} x {ih} pixels")
            self._check_size("letterbox_images src", src, int(offset) + ih * iw * 3)
        self._check_size("letterbox_images out", out, len(shapes) * 3 * height * width)
        if not shapes:
            return
        words = image_geometry(shapes, offsets, width, height, letter)
        geometry = self._scratch_buffer("image_geometry", words.nbytes)  # stream-ordered
        if words.size <= GEOMETRY_SLOT_WORDS:
            self._geometry_copy(geometry, words)
        else:
            self._htod(geometry, words)
        self._launch(
            "letterbox_u8_kernel",
            (_ceil_div(height * width, _BLOCK), len(shapes)),
            (_BLOCK,),
            self._ptr(src),
            self._ptr(geometry),
            int(height),
            int(width),
            self._ptr(out),
        )

    def _geometry_copy(self, geometry, words):
        """Queue words -> geometry on the stream through the next page-locked slot."""
        slots = self._dev.__dict__.setdefault("geometry_slots", [])
        turn = self._dev.__dict__.get("geometry_turn", 0) % GEOMETRY_SLOTS
        self._dev.geometry_turn = turn + 1
        if turn == len(slots):
            slots.append((drv.pagelocked_empty(GEOMETRY_SLOT_WORDS, np.int32), drv.Event()))
        host, copied = slots[turn]
        copied.synchronize()  # its last copy (GEOMETRY_SLOTS calls ago) has run
        host[: words.size] = words
        drv.memcpy_htod_async(self._ptr(geometry), host[: words.size], self.stream)
        copied.record(self.stream)
