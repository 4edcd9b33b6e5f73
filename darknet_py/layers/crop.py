"""[crop]: crop the input image to crop_height x crop_width, as Darknet's crop_layer.c (CPU).

At inference Darknet takes the centre crop (integer offsets (h - crop_height)/2
and (w - crop_width)/2); in training it takes one random crop, mirrored with
probability 1/2 when flip=1, for the whole batch. Values are mapped by
x * 2 - 1 (to [-1, 1]) unless noadjust=1. Darknet's backward is empty: the crop
is a data layer that sits on the network input, and no delta goes through it.

angle, saturation, exposure and shift are read but, as in Darknet's CPU code,
not applied (Darknet's GPU path uses them for colour and rotation jitter).
"""

import numpy as np

from .base import Layer


class CropLayer(Layer):
    type = "crop"
    capturable = False  # training crops on the host, at a random place
    short = "crop"

    def parse(self, s, ctx):
        self.crop_height = s.get_int("crop_height", 1)
        self.crop_width = s.get_int("crop_width", 1)
        self.flip = s.get_int("flip", 0)
        self.angle = s.get_float("angle", 0.0)
        self.saturation = s.get_float("saturation", 1.0)
        self.exposure = s.get_float("exposure", 1.0)
        self.shift = s.get_float("shift", 0.0)
        self.noadjust = s.get_int("noadjust", 0)
        if not (self.w and self.h and self.c):
            raise s.error("the layer before [crop] must output an image")
        for key, size, limit in (
            ("crop_height", self.crop_height, self.h),
            ("crop_width", self.crop_width, self.w),
        ):
            if not 1 <= size <= limit:
                raise s.error(f"must be between 1 and the input's {limit}, got {size}", key)
        self.out_c, self.out_h, self.out_w = self.c, self.crop_height, self.crop_width
        self.outputs = self.out_c * self.out_h * self.out_w
        self.scale, self.trans = (1.0, 0.0) if self.noadjust else (2.0, -1.0)

    def describe(self):
        # Darknet prints a free-form "Crop Layer: ..." line; this is the table's layout.
        return (
            f"{'':18s}{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.ones = None
        if not self.noadjust:
            self.ones = be.zeros(batch * self.outputs)  # for adding the -1 offset
            be.fill(self.ones, 1.0)

    def forward(self, net):
        if net.train:
            self._forward_random(net)
        else:
            self._forward_centre(net)

    def _forward_centre(self, net):
        be = net.be
        x, out = net.input, self.output
        h, w, oh, ow = self.h, self.w, self.out_h, self.out_w
        dh, dw = (h - oh) // 2, (w - ow) // 2
        planes = self.batch * self.c
        # One strided block copy per image plane, or per output row if that is fewer calls.
        if planes <= oh:
            for p in range(planes):
                be.copy_blocks(x, p * h * w + dh * w + dw, w, out, p * oh * ow, ow, ow, oh)
        else:
            for i in range(oh):
                be.copy_blocks(x, (dh + i) * w + dw, h * w, out, i * ow, oh * ow, ow, planes)
        if not self.noadjust:
            be.scal(self.scale, out)
            be.axpy(self.trans, self.ones, out)

    def _forward_random(self, net):
        # On the host: a mirrored window is a reversed copy, which no backend op makes; the
        # crop reads only the network input, so the round trip costs one image batch.
        be = net.be
        h, w, oh, ow = self.h, self.w, self.out_h, self.out_w
        rng = net.rng
        flip = bool(self.flip) and bool(rng.integers(2))
        dh = int(rng.integers(h - oh + 1))
        dw = int(rng.integers(w - ow + 1))
        self.last_crop = (dh, dw, flip)
        x = be.to_host(net.input[: self.batch * self.inputs]).reshape(self.batch, self.c, h, w)
        cols = (w - dw - 1 - np.arange(ow)) if flip else (dw + np.arange(ow))
        crop = x[:, :, dh : dh + oh, :][:, :, :, cols]
        dtype = crop.dtype.type
        be.write(self.output, crop * dtype(self.scale) + dtype(self.trans))

    def backward(self, net):
        # Darknet's backward_crop_layer does nothing.
        pass
