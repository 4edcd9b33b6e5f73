"""Images the way Darknet holds them: float32 (channels, height, width), RGB, in [0, 1].

OpenCV decodes files; resizing is Darknet's own two-pass bilinear resize (not
OpenCV's), so letterboxed inputs match what the C Darknet feeds its network.
"""

import atexit
import contextlib
import os
import sys
import tempfile
import threading
import warnings

import numpy as np

from .errors import DarknetError, DarknetWarning
from .files import check_input_file


class ImageError(DarknetError):
    pass


class ImageWarning(DarknetWarning):
    """A decoder's complaint about an image it could still decode (corrupt JPEG data)."""


# OpenCV refuses images above this many pixels (its CV_IO_MAX_IMAGE_PIXELS default).
MAX_IMAGE_PIXELS = 1 << 30
# Images above this many pixels are decoded at 1/2, 1/4 or 1/8 scale (libjpeg does it
# while decoding), so a 20000 x 20000 photo takes ~100 MB instead of ~5 GB as floats; a
# network input is at most a few thousand pixels wide, so detections do not change.
DECODE_PIXELS = 1 << 25
REDUCTIONS = (2, 4, 8)


def _cv2():
    import cv2  # imported lazily: importing the package stays fast

    return cv2


def _be16(data, at):
    return int.from_bytes(data[at : at + 2], "big")


def image_size(data):
    """(width, height) from a PNG, JPEG, GIF or BMP header, without decoding; None when the
    format is another or the header is cut short."""
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        return int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
    if data[:2] == b"BM" and len(data) >= 26:
        return (
            abs(int.from_bytes(data[18:22], "little", signed=True)),
            abs(int.from_bytes(data[22:26], "little", signed=True)),
        )
    if data[:2] == b"\xff\xd8":
        at = 2
        while at + 9 < len(data):
            if data[at] != 0xFF:
                return None
            marker = data[at + 1]
            if marker == 0xFF:  # fill byte
                at += 1
                continue
            if 0xD0 <= marker <= 0xD9 or marker == 0x01:  # markers without a length
                at += 2
                continue
            if 0xC0 <= marker <= 0xCF and marker not in (0xC4, 0xC8, 0xCC):  # a frame
                return _be16(data, at + 7), _be16(data, at + 5)
            at += 2 + _be16(data, at + 2)
    return None


def _truncated_jpeg(data):
    """True when a JPEG stops inside its image data: after the last start-of-scan marker
    there must be an end-of-image marker (the coded data cannot contain one). Bytes after
    the end marker, which some cameras append, are fine; a file without image data is
    left to the decoder to refuse."""
    scan = data.rfind(b"\xff\xda")
    return scan >= 0 and data.find(b"\xff\xd9", scan) < 0


# What header_problem reads of a file: a JPEG's size comes after its EXIF block (64 KiB
# at most), the other formats' within the first 26 bytes.
HEADER_BYTES = 1 << 16


def header_problem(path):
    """Why an image file cannot be decoded, judged from its header alone (fast: the first
    HEADER_BYTES and OpenCV's signature test, no decoding), or None when it looks like an
    image OpenCV reads. decode_image refuses all of these too; a file whose image data is
    damaged further on passes here and is found only by decoding it."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEADER_BYTES)
    except OSError as e:
        return f"cannot read the file ({e.strerror or e})"
    if not head:
        return "the image file is empty"
    if not _cv2().haveImageReader(os.fspath(path)):
        return "not an image (no decoder knows its first bytes)"
    size = image_size(head)
    if size is not None and (size[0] < 1 or size[1] < 1 or size[0] * size[1] > MAX_IMAGE_PIXELS):
        return (
            f"the image header claims {size[0]} x {size[1]} pixels; images of 1 to "
            f"{MAX_IMAGE_PIXELS // 2**20} million pixels are read"
        )
    return None


_FD2_LOCK = threading.Lock()
_fd2_sink = None  # one temporary file per process, emptied before each use


@contextlib.contextmanager
def _decoder_messages():
    """Collect what C libraries (libjpeg, libpng) print on file descriptor 2 meanwhile, so
    it reaches the user as one darknet-py warning instead of raw. Yields the list the
    lines are added to on exit."""
    global _fd2_sink
    lines = []
    with _FD2_LOCK:
        if _fd2_sink is None:
            _fd2_sink = tempfile.TemporaryFile()
            atexit.register(_fd2_sink.close)
        sink = _fd2_sink
        sink.seek(0)
        sink.truncate()
        try:
            sys.stderr.flush()
            saved = os.dup(2)
        except (OSError, ValueError):  # no usable fd 2: nothing to keep clean
            yield lines
            return
        os.dup2(sink.fileno(), 2)
        try:
            yield lines
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            sink.seek(0)
            lines += [
                l.strip() for l in sink.read().decode("utf-8", "replace").splitlines() if l.strip()
            ]


def decode_image(path, channels=3, quiet_decoder=True):
    """Read an image file into OpenCV's uint8 array ((H, W, 3) BGR, or (H, W) grey when
    channels == 1), refusing what would hang, crash or silently give garbage: a path that
    is not a regular file, an empty or truncated file, a header claiming more pixels than
    OpenCV decodes. Returns (array, (width, height) of the file's full image); a very large
    image is decoded at a reduced scale (DECODE_PIXELS). With quiet_decoder, the decoder's
    own messages become one ImageWarning (callers decoding in several threads pass False:
    the capture holds a process-wide lock)."""
    path = check_input_file(path, "image", ImageError)
    with open(path, "rb") as f:
        data = f.read()
    if not data:
        raise ImageError(f"{path}: the image file is empty")
    size = image_size(data)
    if size is not None:
        w, h = size
        if w < 1 or h < 1 or w * h > MAX_IMAGE_PIXELS:
            raise ImageError(
                f"{path}: the image header claims {w} x {h} pixels; images of "
                f"1 to {MAX_IMAGE_PIXELS // 2**20} million pixels are read"
            )
    if data[:2] == b"\xff\xd8" and _truncated_jpeg(data):
        raise ImageError(f"{path}: truncated JPEG (the file ends inside the image data)")
    cv2 = _cv2()
    reduce = 1
    if size is not None and size[0] * size[1] > DECODE_PIXELS:
        reduce = next(
            (r for r in REDUCTIONS if size[0] * size[1] <= DECODE_PIXELS * r * r), REDUCTIONS[-1]
        )
    flag = {
        1: cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR,
        2: cv2.IMREAD_REDUCED_GRAYSCALE_2 if channels == 1 else cv2.IMREAD_REDUCED_COLOR_2,
        4: cv2.IMREAD_REDUCED_GRAYSCALE_4 if channels == 1 else cv2.IMREAD_REDUCED_COLOR_4,
        8: cv2.IMREAD_REDUCED_GRAYSCALE_8 if channels == 1 else cv2.IMREAD_REDUCED_COLOR_8,
    }[reduce]
    buffer = np.frombuffer(data, dtype=np.uint8)
    with _decoder_messages() if quiet_decoder else contextlib.nullcontext([]) as messages:
        try:
            image = cv2.imdecode(buffer, flag)
        except cv2.error as e:
            image, messages = None, [str(e).strip().splitlines()[-1]]
    if image is None or image.size == 0:
        why = f": {' '.join(messages)}" if messages else ""
        raise ImageError(
            f"{path}: cannot read image (not an image, or a format OpenCV cannot decode){why}"
        )
    if messages:
        warnings.warn(ImageWarning(f"{path}: the decoder says: {' '.join(messages)}"), stacklevel=2)
    if size is None:
        size = (image.shape[1] * reduce, image.shape[0] * reduce)
    return image, size


def load_image(path, channels=3):
    """Read an image file into float32 (C, H, W) RGB in [0, 1] (see decode_image for what
    is refused, and for very large images, which come back reduced)."""
    return from_bgr(decode_image(path, channels)[0], channels)


def from_bgr(array, channels=3):
    """Convert an OpenCV-style uint8 array (H, W[, 3]) BGR into Darknet's (C, H, W) RGB float."""
    a = np.asarray(array)
    if a.ndim == 2:
        a = a[:, :, None]
    if a.ndim != 3 or a.shape[2] not in (1, 3, 4):
        raise ImageError(f"expected an (H, W, 3) BGR image array, got shape {a.shape}")
    if a.shape[2] == 4:
        a = a[:, :, :3]
    if a.shape[2] == 3:
        a = a[:, :, ::-1]  # BGR -> RGB
    scale = 255.0 if a.dtype == np.uint8 else 1.0
    img = np.ascontiguousarray(a.transpose(2, 0, 1), dtype=np.float32) / np.float32(scale)
    return match_channels(img, channels)


# OpenCV's (and ITU-R BT.601's) luma weights, so a colour image converted here equals the
# same file read with IMREAD_GRAYSCALE.
LUMA_RGB = np.array([0.299, 0.587, 0.114], dtype=np.float32)


def match_channels(img, channels):
    """A (C, H, W) RGB image with `channels` channels: colour -> grey by luma, grey -> colour
    by repetition; unchanged when it already has them."""
    c = img.shape[0]
    if c == channels:
        return img
    if channels == 1 and c == 3:
        return np.tensordot(LUMA_RGB, img, axes=1)[None].astype(np.float32)
    if channels == 3 and c == 1:
        return np.repeat(img, 3, axis=0)
    raise ImageError(f"cannot convert a {c}-channel image to the network's {channels} channels")


def to_bgr(img):
    """Darknet (C, H, W) float image -> OpenCV uint8 (H, W, 3) BGR."""
    a = np.clip(np.asarray(img, dtype=np.float32), 0, 1)
    if a.shape[0] == 1:
        a = np.repeat(a, 3, axis=0)
    return np.ascontiguousarray((a[::-1].transpose(1, 2, 0) * 255.0 + 0.5).astype(np.uint8))


def resize_image(img, w, h):
    """Darknet's resize_image: bilinear, first along x then along y, with corner alignment
    (source sample = dest index * (src-1)/(dst-1))."""
    c, ih, iw = img.shape
    if (iw, ih) == (w, h):
        return img.copy()
    img = img.astype(np.float32, copy=False)
    # Pass 1: along x.
    if w == 1 or iw == 1:
        part = np.repeat(img[:, :, iw - 1 : iw], w, axis=2)
    else:
        sx = np.arange(w, dtype=np.float32) * np.float32((iw - 1) / (w - 1))
        ix = sx.astype(np.int64)
        dx = sx - ix
        ix1 = np.minimum(ix + 1, iw - 1)
        part = (1 - dx) * img[:, :, ix] + dx * img[:, :, ix1]
        part[:, :, w - 1] = img[:, :, iw - 1]
    # Pass 2: along y.
    if h == 1 or ih == 1:
        return np.ascontiguousarray(np.repeat(part[:, 0:1, :], h, axis=1), dtype=np.float32)
    sy = np.arange(h, dtype=np.float32) * np.float32((ih - 1) / (h - 1))
    iy = sy.astype(np.int64)
    dy = (sy - iy)[None, :, None]
    out = (1 - dy) * part[:, iy, :]
    below = np.minimum(iy + 1, ih - 1)
    lower = dy * part[:, below, :]
    lower[:, h - 1, :] = 0  # Darknet adds no lower neighbour on the last row
    return np.ascontiguousarray(out + lower, dtype=np.float32)


def letterbox_size(iw, ih, w, h):
    """(new_w, new_h) of an iw x ih image letterboxed into w x h, Darknet's integer rule."""
    # Darknet compares the two ratios as floats; in double a near-tie can go the other way.
    if np.float32(w) / np.float32(iw) < np.float32(h) / np.float32(ih):
        return w, (ih * w) // iw
    return (iw * h) // ih, h


def sized_shape(iw, ih, w, h, letter=True):
    """(new_w, new_h) an iw x ih image is resized to for a w x h input: letterbox_size
    (letter) or w x h; ImageError when letterboxing leaves no pixel row or column."""
    new_w, new_h = letterbox_size(iw, ih, w, h) if letter else (w, h)
    if new_w < 1 or new_h < 1:
        raise ImageError(
            f"an image of {iw} x {ih} pixels letterboxed into {w} x {h} is {new_w} x {new_h} pixels"
        )
    return new_w, new_h


def letterbox(img, w, h):
    """Darknet's letterbox_image: resize keeping aspect, centre on a 0.5 grey w x h canvas."""
    c, ih, iw = img.shape
    new_w, new_h = letterbox_size(iw, ih, w, h)
    resized = resize_image(img, new_w, new_h)
    boxed = np.full((c, h, w), 0.5, dtype=np.float32)
    dx, dy = (w - new_w) // 2, (h - new_h) // 2
    boxed[:, dy : dy + new_h, dx : dx + new_w] = resized
    return boxed
