"""[dropout]: inverted dropout, as Darknet's dropout_layer.c.

In training each value is zeroed with `probability` and the survivors are
scaled by 1/(1 - probability); at inference the layer passes its input through.
Darknet runs dropout in place on the previous layer's buffers; here the layer
has its own output and delta, which gives the same forward values and the same
gradient for every activation Darknet's stock cfgs put before a dropout.
"""

from .base import Layer


class DropoutLayer(Layer):
    type = "dropout"
    short = "dropout"
    # In the fork this delta is the previous layer's buffer, cleared before each pass with
    # it (see Layer.fork_train).
    fork_train = True

    def parse(self, s, ctx):
        self.probability = s.get_float("probability", 0.5)
        if not 0.0 <= self.probability < 1.0:
            raise s.error(f"must be in [0, 1), got {self.probability:g}", "probability")
        self.scale = 1.0 / (1.0 - self.probability)
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def describe(self):
        return (
            f"       p = {self.probability:.2f}               "
            f"{self.inputs:4d}  ->  {self.outputs:4d}"
        )

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        # The uniform draws of the last training forward, kept for backward's mask.
        self.rand = be.zeros(batch * self.inputs) if train else None

    def mask_seed(self):
        """This layer's part of the dropout seed; the network adds the step's part
        (Network.step_seed, on the backend), so each training step and each layer draws a
        fresh mask while backward (and a repeated forward of the same step, as gradient
        checks do) sees the same one."""
        return self.index * 7919

    def forward(self, net):
        be = net.be
        be.copy(net.input[: self.batch * self.inputs], self.output)
        if net.train:
            be.dropout(
                self.output,
                self.probability,
                self.scale,
                self.rand,
                net.step_seed,
                self.mask_seed(),
            )

    def backward(self, net):
        if net.delta is None:
            return
        be = net.be
        be.dropout_backward(self.rand, self.probability, self.scale, self.delta)
        be.axpy(1.0, self.delta, net.delta[: self.batch * self.inputs])
