"""[reorg]: Darknet's space-to-depth permutation (YOLOv2's passthrough), and its variants.

pjreddie's reorg_layer.c, including its quirks:
  * the output shape is (w/stride, h/stride, c*stride^2) (reverse: the inverse), but the
    values are placed by reorg_cpu called with the *input* shape and, when not reversed,
    with forward=0; the result is the permutation YOLOv2's weights were trained with,
    not a textbook space-to-depth;
  * flatten=1 instead transposes each image from CHW to HWC (reverse: HWC to CHW);
  * extra=N appends N values (kept at 0) to each image and reports a 0x0x0 shape.
Backward applies the inverse permutation and adds it into the previous delta.
"""

from .base import Layer


class ReorgLayer(Layer):
    type = "reorg"
    short = "reorg"

    def parse(self, s, ctx):
        self.stride = s.get_int("stride", 1)
        self.reverse = s.get_int("reverse", 0)
        self.flatten = s.get_int("flatten", 0)
        self.extra = s.get_int("extra", 0)
        if self.stride < 1:
            raise s.error(f"must be at least 1, got {self.stride}", "stride")
        if self.extra < 0:
            raise s.error(f"must not be negative, got {self.extra}", "extra")
        if not (self.w and self.h and self.c):
            raise s.error("the layer before [reorg] must output an image")
        st = self.stride
        if self.reverse:
            self.out_w, self.out_h, self.out_c = self.w * st, self.h * st, self.c // (st * st)
        else:
            self.out_w, self.out_h, self.out_c = self.w // st, self.h // st, self.c * st * st
        if self.extra:
            # Darknet copies each image and appends `extra` zeros; the stride plays no part.
            self.image_shaped = False
            self.out_w = self.out_h = self.out_c = 0
            self.outputs = self.inputs + self.extra
            return
        self.outputs = self.out_w * self.out_h * self.out_c
        if not self.flatten and self.c % (st * st):
            # reorg_cpu splits the channels into stride^2 groups in both directions.
            raise s.error(
                f"stride={st} needs the input channels ({self.c}) to be a multiple of {st * st}",
                "stride",
            )
        if self.outputs != self.inputs:
            raise s.error(
                f"stride={st} does not fit the {self.w}x{self.h}x{self.c} input: "
                f"the {self.out_w}x{self.out_h}x{self.out_c} output would hold "
                f"{self.outputs} values, not {self.inputs}",
                "stride",
            )

    def describe(self):
        if self.extra:
            return f"{'':13s}{self.inputs:4d}   ->  {self.outputs:4d}"
        return (
            f"{'':13s}/{self.stride:2d}  {self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        # The inverse permutation of a delta is built here before being added to the
        # previous layer's delta (which may already hold route/shortcut contributions).
        self.delta_in = be.zeros(batch * self.inputs) if train else None

    # ---- the permutations ----------------------------------------------------------
    def _transpose(self, be, src, dst, to_hwc):
        """Per image, CHW -> HWC (to_hwc) or HWC -> CHW: Darknet's flatten()."""
        size, layers = self.w * self.h, self.c
        per_image = size * layers
        for b in range(self.batch):
            base = b * per_image
            if layers <= size:
                for ch in range(layers):  # one strided copy per channel
                    if to_hwc:
                        be.copy_blocks(src, base + ch * size, 1, dst, base + ch, layers, 1, size)
                    else:
                        be.copy_blocks(src, base + ch, layers, dst, base + ch * size, 1, 1, size)
            else:
                for i in range(size):  # one strided copy per position
                    if to_hwc:
                        be.copy_blocks(src, base + i, size, dst, base + i * layers, 1, 1, layers)
                    else:
                        be.copy_blocks(src, base + i * layers, 1, dst, base + i, size, 1, layers)

    def forward(self, net):
        be = net.be
        x = net.input[: self.batch * self.inputs]
        if self.flatten:
            self._transpose(be, x, self.output, to_hwc=not self.reverse)
        elif self.extra:
            # The appended values are never written: zero from allocation, as Darknet's calloc.
            be.copy_blocks(x, 0, self.inputs, self.output, 0, self.outputs, self.inputs, self.batch)
        else:
            be.reorg(
                x, self.w, self.h, self.c, self.batch, self.stride, bool(self.reverse), self.output
            )

    def backward(self, net):
        if net.delta is None:
            return
        be = net.be
        back = self.delta_in
        if self.flatten:
            self._transpose(be, self.delta, back, to_hwc=bool(self.reverse))
        elif self.extra:
            # (Darknet tests reverse before extra here, unlike its forward; this follows
            # the forward so the gradient matches it.)
            be.copy_blocks(
                self.delta, 0, self.outputs, back, 0, self.inputs, self.inputs, self.batch
            )
        else:
            be.reorg(
                self.delta, self.w, self.h, self.c, self.batch, self.stride, not self.reverse, back
            )
        be.axpy(1.0, back, net.delta[: self.batch * self.inputs])
