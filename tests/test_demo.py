"""The demo's detection canvases: digits the grey-input detector can see."""

import numpy as np

from darknet_py import demo_data
from darknet_py.image import LUMA_RGB


def test_every_digit_stands_out_from_its_background_in_grey():
    images, labels = demo_data.load_digits()
    pool = np.arange(len(labels))
    weakest = 1.0
    for n in range(60):
        rng = np.random.default_rng(n)
        canvas, boxes = demo_data.render_canvas(
            rng, images, labels, pool, canvas_size=64, min_digit=16, max_digit=28
        )
        grey = np.tensordot(LUMA_RGB, canvas, axes=1)
        outside = np.ones(grey.shape, dtype=bool)
        for _, left, top, right, bottom in boxes:
            outside[top:bottom, left:right] = False
        background = np.median(grey[outside])
        for _, left, top, right, bottom in boxes:
            weakest = min(weakest, grey[top:bottom, left:right].max() - background)
    # INK_CONTRAST above the background colour, less the canvas noise and a glyph whose
    # brightest pixel is not full ink.
    assert weakest >= demo_data.INK_CONTRAST - 0.1, weakest
