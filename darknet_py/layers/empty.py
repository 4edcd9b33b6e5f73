"""[empty] ([silence]): the AlexeyAB fork's pass-through layer: output = input."""

from .base import Layer


class EmptyLayer(Layer):
    type = "empty"
    short = "empty"

    def parse(self, s, ctx):
        pass  # the input's shape, as Layer set it

    def forward(self, net):
        net.be.copy(net.input[: self.batch * self.inputs], self.output)

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[: self.batch * self.inputs])
