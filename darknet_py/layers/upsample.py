"""[upsample]: nearest-neighbour upsampling by an integer stride (negative: downsample)."""

from . import nhwc_forward
from .base import Layer


class UpsampleLayer(Layer):
    type = "upsample"

    def parse(self, s, ctx):
        stride = s.get_int("stride", 2)
        self.scale = s.get_float("scale", 1.0)
        if stride == 0:
            raise s.error("must not be 0", "stride")
        self.reverse = stride < 0
        self.short = "downsample" if self.reverse else "upsample"  # as Darknet's table
        self.stride = abs(stride)
        self.out_c = self.c
        if self.reverse:
            self.out_w, self.out_h = self.w // self.stride, self.h // self.stride
        else:
            self.out_w, self.out_h = self.w * self.stride, self.h * self.stride
        self.outputs = self.out_c * self.out_w * self.out_h

    def describe(self):
        # Darknet's row: "upsample           %2dx  %4d x..." (reverse: "downsample         ")
        pad = 9 if self.reverse else 11
        return (
            f"{'':{pad}s}{self.stride:2d}x  {self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def forward(self, net):
        if nhwc_forward.is_nhwc(self):  # the layout plan's NHWC 16-bit output (issue 42)
            return nhwc_forward.forward(self, net)
        be = net.be
        if self.reverse:  # downsample: the adjoint of upsampling, into a zeroed output
            be.fill(self.output, 0.0)
            be.upsample(
                self.output,
                self.out_w,
                self.out_h,
                self.c,
                self.batch,
                self.stride,
                False,
                self.scale,
                net.input,
            )
        else:
            be.upsample(
                net.input,
                self.w,
                self.h,
                self.c,
                self.batch,
                self.stride,
                True,
                self.scale,
                self.output,
            )

    def backward(self, net):
        if net.delta is None:
            return
        be = net.be
        if self.reverse:
            be.upsample(
                self.delta,
                self.out_w,
                self.out_h,
                self.c,
                self.batch,
                self.stride,
                True,
                self.scale,
                net.delta,
            )
        else:
            be.upsample(
                net.delta,
                self.w,
                self.h,
                self.c,
                self.batch,
                self.stride,
                False,
                self.scale,
                self.delta,
            )
