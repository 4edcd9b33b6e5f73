"""Images the way Darknet holds them: float32 (channels, height, width), RGB, in [0, 1].

OpenCV decodes files; resizing is Darknet's own two-pass bilinear resize (not
OpenCV's), so letterboxed inputs match what the C Darknet feeds its network.
"""
import os

import numpy as np


class ImageError(Exception):
    pass


def _cv2():
    import cv2  # imported lazily: importing the package stays fast
    return cv2


def load_image(path, channels=3):
    """Read an image file into float32 (C, H, W) RGB in [0, 1]."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise ImageError(f"{path}: image file not found")
    cv2 = _cv2()
    flag = cv2.IMREAD_GRAYSCALE if channels == 1 else cv2.IMREAD_COLOR
    bgr = cv2.imread(path, flag)
    if bgr is None:
        raise ImageError(f"{path}: cannot read image (not an image, or a format OpenCV cannot decode)")
    return from_bgr(bgr, channels)


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
        part = np.repeat(img[:, :, iw - 1:iw], w, axis=2)
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


def letterbox(img, w, h):
    """Darknet's letterbox_image: resize keeping aspect, centre on a 0.5 grey w x h canvas."""
    c, ih, iw = img.shape
    new_w, new_h = letterbox_size(iw, ih, w, h)
    resized = resize_image(img, new_w, new_h)
    boxed = np.full((c, h, w), 0.5, dtype=np.float32)
    dx, dy = (w - new_w) // 2, (h - new_h) // 2
    boxed[:, dy:dy + new_h, dx:dx + new_w] = resized
    return boxed
