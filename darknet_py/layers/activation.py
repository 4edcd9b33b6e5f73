"""[activation]: an activation function as a layer of its own (Darknet's activation_layer.c).

The output is activation(input), with the shape of the input. Backward multiplies the
delta by the activation's gradient and passes it to the previous layer. Darknet copies it
there (overwriting what a later [shortcut] or [route] may have added); it is added here, as
every other layer of darknet-py does, which is the same whenever nothing else wrote it.
The fork's swish, mish and hard_mish are computed, with their true gradient (through the
kept input); the fork's CPU [activation] has no case for them and outputs (and passes) 0.
"""

from .base import Layer, parse_activation


class ActivationLayer(Layer):
    type = "activation"
    short = "act"

    def parse(self, s, ctx):
        # Not the fork's normalize_channels family: they normalise a convolution's channels,
        # and the fork's [activation] has no case for them (its CPU output is 0).
        self.activation = parse_activation(s, "linear")
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def describe(self):
        return f" {self.activation:23s}{self.inputs:4d}  ->  {self.outputs:4d}"

    def forward(self, net):
        net.be.copy(net.input[: self.batch * self.inputs], self.output)
        self.activate_output(net.be)

    def backward(self, net):
        self.activation_gradient(net.be)
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[: self.batch * self.inputs])
