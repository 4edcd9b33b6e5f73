"""[sam]: the AlexeyAB fork's spatial attention: out = activation(prev * from), element-wise.

The `from` layer and the previous layer must have the same shape; the output has it."""

from .base import Layer, parse_activation, source_layer


class SamLayer(Layer):
    type = "sam"
    short = "sam"

    def parse(self, s, ctx):
        self.source = source_layer(self, s, ctx, "from")
        self.activation = parse_activation(s, "linear")
        src = self.source
        if (src.out_w, src.out_h, src.out_c) != (self.w, self.h, self.c):
            raise s.error(
                f"layer {src.index} is {src.out_w}x{src.out_h}x{src.out_c} but the "
                f"previous layer is {self.w}x{self.h}x{self.c}: [sam] multiplies "
                f"them element-wise",
                "from",
            )

    def describe(self):
        return f"{self.source.index:4d}{'':20s}{self.w:4d} x{self.h:4d} x{self.c:4d}"

    def forward(self, net):
        be, n = net.be, self.batch * self.outputs
        be.copy(net.input[:n], self.output)
        be.mul(self.source.output, self.output)
        self.activate_output(be)

    def backward(self, net):
        be, n = net.be, self.batch * self.outputs
        self.activation_gradient(be)
        if net.delta is not None:
            be.mul_add(self.delta, self.source.output, net.delta[:n])
        if self.source.delta is not None:
            # (the fork assigns here, dropping earlier contributions; this adds)
            be.mul_add(self.delta, net.input[:n], self.source.delta)
