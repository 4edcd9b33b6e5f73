"""[maxpool]: Darknet's max pooling (windows start at -padding/2; default padding size-1).

The AlexeyAB fork adds stride_x/stride_y (across and down, overriding stride) and
maxpool_depth=1 with out_channels=K: a maximum across channels instead of space,
output channel g taking the maximum over input channels g, g+K, g+2K, ... at the
same position."""

from . import nhwc_forward
from .base import Layer


class MaxpoolLayer(Layer):
    type = "maxpool"
    fork_train = True
    short = "max"
    reads_depth = True  # [local_avgpool] shares the window options, not maxpool_depth

    def parse(self, s, ctx):
        self.stride = s.get_int("stride", 1)
        self.stride_x = s.get_int("stride_x", self.stride)
        self.stride_y = s.get_int("stride_y", self.stride)
        self.size = s.get_int("size", self.stride)
        self.padding = s.get_int("padding", self.size - 1)
        self.depth = s.get_int("maxpool_depth", 0) if self.reads_depth else 0
        self.depth_channels = s.get_int("out_channels", 1) if self.reads_depth else 1
        for key, v in (
            ("size", self.size),
            ("stride", self.stride),
            ("stride_x", self.stride_x),
            ("stride_y", self.stride_y),
        ):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        if not (self.w and self.h and self.c):
            raise s.error(f"the layer before [{s.header}] must output an image")
        if self.depth:
            if not 1 <= self.depth_channels <= self.c:
                raise s.error(f"must be in 1..{self.c} (the input channels)", "out_channels")
            self.out_c, self.out_h, self.out_w = self.depth_channels, self.h, self.w
        else:
            self.out_h = (self.h + self.padding - self.size) // self.stride_y + 1
            self.out_w = (self.w + self.padding - self.size) // self.stride_x + 1
            self.out_c = self.c
        if self.out_h < 1 or self.out_w < 1:
            raise s.error(
                f"a {self.size}x{self.size} window does not fit the {self.w}x{self.h} input", "size"
            )
        self.outputs = self.out_c * self.out_h * self.out_w

    @property
    def fork_bflops(self):
        # The fork counts size*size*c compares per output position (integer product).
        return self.size * self.size * self.c * self.out_h * self.out_w / 1e9

    def describe(self):
        # Darknet's row: "max          %d x %d / %d  %4d x%4d x%4d   ->  ..."
        stride = (
            f"{self.stride_x:d}"
            if self.stride_x == self.stride_y
            else f"{self.stride_x:d}x{self.stride_y:d}"
        )
        window = "depth    " if self.depth else f"{self.size:d} x {self.size:d} / {stride}"
        return (
            f"{'':7s}{window}  "
            f"{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.indexes = be.int_zeros(batch * self.outputs)

    def forward(self, net):
        if nhwc_forward.is_nhwc(self):  # the layout plan's NHWC 16-bit output (issue 42)
            return nhwc_forward.forward(self, net)
        be = net.be
        if self.depth:
            be.maxpool_depth_forward(
                net.input,
                self.batch,
                self.c,
                self.h * self.w,
                self.out_c,
                self.output,
                self.indexes,
            )
        elif self.stride_x == self.stride_y:
            be.maxpool_forward(
                net.input,
                self.batch,
                self.c,
                self.h,
                self.w,
                self.size,
                self.stride_x,
                self.padding,
                self.output,
                self.indexes if net.train else None,
            )
        else:
            be.maxpool_forward_xy(
                net.input,
                self.batch,
                self.c,
                self.h,
                self.w,
                self.size,
                self.stride_x,
                self.stride_y,
                self.padding,
                self.output,
                self.indexes if net.train else None,
            )

    def backward(self, net):
        if net.delta is None:
            return
        if self.depth:
            net.be.maxpool_backward(self.delta, self.indexes, self.batch * self.outputs, net.delta)
        else:  # windows known: deterministic on every backend
            net.be.maxpool_backward_xy(
                self.delta,
                self.indexes,
                self.batch,
                self.c,
                self.h,
                self.w,
                self.size,
                self.stride_x,
                self.stride_y,
                self.padding,
                net.delta,
            )
