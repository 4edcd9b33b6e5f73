"""[avgpool]: global average pooling to one value per channel."""

from .base import Layer


class AvgpoolLayer(Layer):
    type = "avgpool"
    short = "avg"

    def parse(self, s, ctx):
        self.out_c, self.out_h, self.out_w = self.c, 1, 1
        self.outputs = self.out_c

    def describe(self):
        # Darknet's row: "avg                     %4d x%4d x%4d   ->  %4d"
        return f"{'':18s}{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  {self.out_c:4d}"

    def forward(self, net):
        net.be.avgpool_forward(net.input, self.batch, self.c, self.h * self.w, self.output)

    def backward(self, net):
        if net.delta is not None:
            net.be.avgpool_backward(self.delta, self.batch, self.c, self.h * self.w, net.delta)
