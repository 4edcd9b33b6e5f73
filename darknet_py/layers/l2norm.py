"""[l2norm]: scale each position's channel vector to unit length (Darknet's l2norm_layer.c).

Output: input / sqrt(sum over channels of input^2), per image and position, with the shape
of the input. Backward is Darknet's CPU one: the delta passes to the previous layer
unchanged (its GPU build adds a term its CPU build leaves out; the CPU's is followed).
An all-zero position divides by zero, as in Darknet.
"""

from .base import Layer


class L2normLayer(Layer):
    type = "l2norm"
    short = "l2norm"

    def parse(self, s, ctx):
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def _channels_spatial(self):
        # A flat input (no image): one channel vector of all inputs per image.
        return (self.c, self.h * self.w) if self.c else (self.inputs, 1)

    def describe(self):
        return f"{'':40s}{self.inputs:4d}"  # Darknet: "l2norm", then %4d

    def forward(self, net):
        be = net.be
        be.copy(net.input[: self.batch * self.inputs], self.output)
        be.l2normalize(self.output, self.batch, *self._channels_spatial())

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[: self.batch * self.inputs])
