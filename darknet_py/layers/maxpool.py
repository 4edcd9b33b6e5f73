"""[maxpool]: Darknet's max pooling (windows start at -padding/2; default padding size-1)."""
from .base import Layer


class MaxpoolLayer(Layer):
    type = "maxpool"
    short = "max"

    def parse(self, s, ctx):
        self.stride = s.get_int("stride", 1)
        self.size = s.get_int("size", self.stride)
        self.padding = s.get_int("padding", self.size - 1)
        if self.size < 1 or self.stride < 1:
            raise s.error("size and stride must be at least 1", "size" if self.size < 1 else "stride")
        self.out_h = (self.h + self.padding - self.size) // self.stride + 1
        self.out_w = (self.w + self.padding - self.size) // self.stride + 1
        if self.out_h < 1 or self.out_w < 1:
            raise s.error(f"a {self.size}x{self.size} window does not fit the {self.w}x{self.h} "
                          f"input", "size")
        self.out_c = self.c
        self.outputs = self.out_c * self.out_h * self.out_w

    def describe(self):
        # Darknet's row: "max          %d x %d / %d  %4d x%4d x%4d   ->  ..."
        return (f"{'':7s}{self.size:d} x {self.size:d} / {self.stride:d}  "
                f"{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
                f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}")

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.indexes = be.int_zeros(batch * self.outputs)

    def forward(self, net):
        # Only backward reads the argmax indexes: inference does not keep them.
        net.be.maxpool_forward(net.input, self.batch, self.c, self.h, self.w, self.size,
                               self.stride, self.padding, self.output,
                               self.indexes if net.train else None)

    def backward(self, net):
        if net.delta is not None:
            net.be.maxpool_backward(self.delta, self.indexes, self.batch * self.outputs, net.delta)
