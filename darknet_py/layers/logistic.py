"""[logistic]: logistic activation with a cross-entropy cost (Darknet's logistic_layer.c).

The output is logistic(input). When the step has a truth (the size of this layer's
outputs), forward leaves -t*log(p) - (1-t)*log(1-p) per value in `loss`, t - p in delta,
and their sum as the layer's cost; backward adds delta to the previous layer's delta.
Darknet's CPU code takes the logs without an epsilon (its GPU build adds 1e-7): so do both
backends here, so a saturated p = 1 with t < 1 gives an infinite cost, as on Darknet's CPU.
"""

from .base import Layer


class LogisticLayer(Layer):
    type = "logistic"
    short = "logxent"

    def parse(self, s, ctx):
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def describe(self):
        return f"{'':40s}{self.inputs:4d}"  # Darknet: "logistic x entropy", then %4d

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        n = batch * self.inputs
        # delta and loss are where forward writes the cost, so they exist at inference too.
        if self.delta is None:
            self.delta = be.zeros(n)
        self.loss = be.zeros(n)
        self.scalars = be.zeros(1)

    def forward(self, net):
        be = net.be
        be.copy(net.input[: self.batch * self.inputs], self.output)
        be.activate(self.output, "logistic")
        self.cost = None
        if net.truth is not None:
            be.logistic_x_ent(self.output, net.truth, self.delta, self.loss)
            be.sum_into(self.loss, self.scalars)
            self.pending = True

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[: self.batch * self.inputs])
