"""The NumPy backend's image input (mixed into NumpyBackend): photos as uint8 bytes, sized as
detect sizes them (image.from_bgr, letterbox or resize_image)."""

import numpy as np

from ...image import from_bgr, letterbox, resize_image, sized_shape


class NumpyImages:
    """upload_bytes_async, letterbox_images."""

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
