"""The NumPy reference of the NHWC 16-bit ops (issue 42; mixed into NumpyBackend).

Under fp16/bf16 on CUDA a layer output may be kept channels-last: image b, row y, column
x, channel ch of a tensor is element ((b * h + y) * w + x) * pitch + offset + ch of a
16-bit storage array (storage_zeros' array; here a StoredArray of already-rounded
floats). `pitch` (the pixel pitch) is a multiple of 8, so a pixel's channels start on a
16-byte boundary; `offset` places a tensor among the channels of a [route]'s
concatenation, whose producers then write into it in place. Each op that writes c
channels at `offset` also writes zeros up to the next multiple of 8 of offset + c: a
tensor's padding channels are zero (a convolution reads them with zero weights, and
0 * NaN would not be 0), and the writer of a [route]'s last slice zeroes the route's.

The ops move values as the NCHW ops do (exact), or compute in fp32 and round once where
they store (upsample's scale, shortcut's sum and activation).
"""

import numpy as np

from ... import precision as precisions
from ...image import from_bgr, letterbox, resize_image, sized_shape
from ..normalization.numpy import one_storage

PIXEL_ALIGN = 8  # channels a pixel's pitch is a multiple of (8 halves: 16 bytes)


def pixel_pitch(channels):
    """The pixel pitch of a tensor of `channels` stored on its own: rounded up to 8."""
    return -(-int(channels) // PIXEL_ALIGN) * PIXEL_ALIGN


def padded_end(offset, channels, pitch):
    """The channel after the last one a writer of `channels` at `offset` writes: its values,
    then zeros to the next multiple of 8 (never past the pitch)."""
    return min(pixel_pitch(offset + channels), pitch)


def check_span(op, what, channels, pitch, offset):
    """ValueError naming op and the tensor unless `channels` at `offset` fit a pitch that is
    a multiple of 8."""
    if pitch % PIXEL_ALIGN or pitch <= 0:
        raise ValueError(f"{op}: {what} pitch {pitch} is not a positive multiple of 8")
    if offset < 0 or channels < 1 or offset + channels > pitch:
        raise ValueError(
            f"{op}: {what} channels {offset}..{offset + channels - 1} do not fit its pitch {pitch}"
        )


def half_storage(op, storage_of, **arrays):
    """The 16-bit storage (fp16/bf16) the named arrays share (one_storage's errors)."""
    return one_storage(op, storage_of, precisions.HALF_STORAGE, **arrays)


def pixels_of(a, batch, h, w, pitch, op, what):
    """a's first batch*h*w*pitch values as (batch, h, w, pitch), a view."""
    need = batch * h * w * pitch
    if a.size < need:
        raise ValueError(f"{op}: {what} holds {a.size} values, needs {need}")
    return a[:need].reshape(batch, h, w, pitch)


def store_span(out, offset, values, kept):
    """out[..., offset:offset + c] = values rounded to kept, then zeros to padded_end."""
    c = values.shape[-1]
    end = padded_end(offset, c, out.shape[-1])
    out[..., offset : offset + c] = precisions.round_to(values, kept).reshape(values.shape)
    out[..., offset + c : end] = 0


class NumpyNhwc:
    """NumpyBackend's NHWC ops (the CUDA backend's ops/nhwc/cuda.py has the same ones)."""

    def nhwc_from_nchw(self, x, batch, c, h, w, out, out_pitch, out_offset):
        """out (16-bit NHWC, channels at out_offset of pixel pitch out_pitch) <- x (fp32
        NCHW, batch x c x h x w) rounded: the boundary into the NHWC layers (the network's
        input, an fp32 layer output a convolution reads)."""
        op = "nhwc_from_nchw"
        kept = half_storage(op, self.storage_of, out=out)
        one_storage(op, self.storage_of, (precisions.DEFAULT,), x=x)
        check_span(op, "out", c, out_pitch, out_offset)
        values = np.asarray(x[: batch * c * h * w], np.float32).reshape(batch, c, h, w)
        target = pixels_of(out, batch, h, w, out_pitch, op, "out")
        store_span(target, out_offset, values.transpose(0, 2, 3, 1), kept)

    def nhwc_to_nchw(self, x, batch, c, h, w, x_pitch, x_offset, out):
        """out (fp32 NCHW) <- x's c channels at x_offset (16-bit NHWC), widened (exact): the
        boundary out of the NHWC layers (heads, losses, layer_output, predict)."""
        op = "nhwc_to_nchw"
        half_storage(op, self.storage_of, x=x)
        one_storage(op, self.storage_of, (precisions.DEFAULT,), out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        if out.size < batch * c * h * w:
            raise ValueError(f"{op}: out holds {out.size} values, needs {batch * c * h * w}")
        source = pixels_of(x, batch, h, w, x_pitch, op, "x")[..., x_offset : x_offset + c]
        out[: batch * c * h * w] = source.transpose(0, 3, 1, 2).reshape(-1)

    def nhwc_copy_channels(self, x, batch, c, h, w, x_pitch, x_offset, out, out_pitch, out_offset):
        """out's channels out_offset.. <- x's c channels at x_offset, the bits as they are
        (a [route]'s part that its producer did not write in place; groups take x_offset
        into the producer's channels)."""
        op = "nhwc_copy_channels"
        kept = half_storage(op, self.storage_of, x=x, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        source = pixels_of(x, batch, h, w, x_pitch, op, "x")[..., x_offset : x_offset + c]
        target = pixels_of(out, batch, h, w, out_pitch, op, "out")
        store_span(target, out_offset, np.array(source, np.float32), kept)

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
        """maxpool_forward_xy on NHWC tensors (inference: no indexes): windows start at
        -(padding / 2); the first maximum in row-major window order (strict '>') wins, its
        stored bits copied; a window with no image cell gives -inf."""
        op = "nhwc_maxpool"
        kept = half_storage(op, self.storage_of, x=x, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        out_h = (h + padding - size) // stride_y + 1
        out_w = (w + padding - size) // stride_x + 1
        source = pixels_of(x, batch, h, w, x_pitch, op, "x")[..., x_offset : x_offset + c]
        source = np.asarray(source, np.float32)
        best = np.full((batch, out_h, out_w, c), -np.inf, np.float32)
        found = np.zeros(best.shape, bool)
        off = padding // 2
        oy, ox = np.arange(out_h), np.arange(out_w)
        for dy in range(size):
            ys = oy * stride_y - off + dy
            row_ok = (ys >= 0) & (ys < h)
            for dx in range(size):
                xs = ox * stride_x - off + dx
                col_ok = (xs >= 0) & (xs < w)
                ok = row_ok[:, None] & col_ok[None, :]
                cell = source[:, np.clip(ys, 0, h - 1)][:, :, np.clip(xs, 0, w - 1)]
                # Darknet's test: the first image cell, then only a strictly larger value
                # (a NaN never wins after the first; a first NaN stays).
                take = ok[None, :, :, None] & (~found | (cell > best))
                best = np.where(take, cell, best)
                found |= ok[None, :, :, None]
        target = pixels_of(out, batch, out_h, out_w, out_pitch, op, "out")
        store_span(target, out_offset, best, kept)

    def nhwc_upsample(
        self, x, batch, c, h, w, x_pitch, x_offset, stride, scale, out, out_pitch, out_offset
    ):
        """upsample's forward on NHWC tensors: out (h*stride x w*stride) = scale *
        nearest(x), in fp32 and rounded once (scale 1: the bits copied)."""
        op = "nhwc_upsample"
        kept = half_storage(op, self.storage_of, x=x, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        source = pixels_of(x, batch, h, w, x_pitch, op, "x")[..., x_offset : x_offset + c]
        big = np.repeat(np.repeat(np.asarray(source, np.float32), stride, 1), stride, 2)
        if scale != 1:
            big = big * np.float32(scale)
        target = pixels_of(out, batch, h * stride, w * stride, out_pitch, op, "out")
        store_span(target, out_offset, big, kept)

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
        """[shortcut] of two NHWC tensors of one width and height (Darknet's shortcut_cpu
        after copying x into out): out = activation(s1*x + s2*add) over the channels the
        two share, activation(x) on x's channels beyond add's; fp32, rounded once."""
        op = "nhwc_shortcut"
        kept = half_storage(op, self.storage_of, x=x, add=add, out=out)
        check_span(op, "x", c, x_pitch, x_offset)
        check_span(op, "add", add_c, add_pitch, add_offset)
        check_span(op, "out", c, out_pitch, out_offset)
        value = np.array(
            pixels_of(x, batch, h, w, x_pitch, op, "x")[..., x_offset : x_offset + c], np.float32
        )
        common = min(c, add_c)
        other = pixels_of(add, batch, h, w, add_pitch, op, "add")[
            ..., add_offset : add_offset + common
        ]
        value[..., :common] = s1 * value[..., :common] + s2 * np.asarray(other, np.float32)
        if activation != "linear":
            flat = np.ascontiguousarray(value).reshape(-1)
            self.activate(flat, activation)
            value = flat.reshape(value.shape)
        target = pixels_of(out, batch, h, w, out_pitch, op, "out")
        store_span(target, out_offset, value, kept)

    def letterbox_images_nhwc(self, src, shapes, offsets, width, height, letter, out, out_pitch):
        """letterbox_images into a 16-bit NHWC network input: the 3 channels rounded, then
        zeros to 8 (the first convolution's input pitch)."""
        op = "letterbox_images_nhwc"
        half_storage(op, self.storage_of, out=out)
        check_span(op, "out", 3, out_pitch, 0)
        plane = 3 * height * width
        images = np.zeros(len(shapes) * plane, np.float32)
        for i, ((ih, iw), offset) in enumerate(zip(shapes, offsets)):
            sized_shape(iw, ih, width, height, letter)  # refuses a degenerate letterbox
            bgr = src[int(offset) : int(offset) + ih * iw * 3].reshape(ih, iw, 3)
            img = from_bgr(bgr, 3)
            sized = letterbox(img, width, height) if letter else resize_image(img, width, height)
            images[i * plane : (i + 1) * plane] = sized.reshape(-1)
        self.nhwc_from_nchw(images, len(shapes), 3, height, width, out, out_pitch, 0)
