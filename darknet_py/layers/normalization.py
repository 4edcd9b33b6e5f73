"""[normalization] / [lrn]: local response normalisation across channels (Darknet's
normalization_layer.c).

Options: size (5), alpha (0.0001), beta (0.75), kappa (1). out = x * norms^-beta with
norms = kappa + alpha * the sum of x^2 over a window of channels, built as Darknet's
running sum (see NumpyBackend.lrn_forward: alpha is not divided by size, and channel size/2
never enters a window, quirks of Darknet kept for its numbers). Backward is Darknet's
approximation: the previous delta gets norms^-beta * delta (Darknet overwrites it; it is
added here, the same when nothing else wrote it).
"""

from .base import Layer


class NormalizationLayer(Layer):
    type = "normalization"
    short = "norm"

    def parse(self, s, ctx):
        self.size = s.get_int("size", 5)
        self.alpha = s.get_float("alpha", 0.0001)
        self.beta = s.get_float("beta", 0.75)
        self.kappa = s.get_float("kappa", 1.0)
        if self.size < 1:
            raise s.error(f"must be at least 1, got {self.size}", "size")
        if not (self.w and self.h and self.c):
            raise s.error(f"the layer before [{s.header}] must output an image")
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def describe(self):
        return f"{self.size:5d}{'':19s}{self.w:4d} x{self.h:4d} x{self.c:4d}"

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.norms = be.zeros(batch * self.outputs)

    def forward(self, net):
        net.be.lrn_forward(
            net.input[: self.batch * self.inputs],
            self.batch,
            self.c,
            self.h * self.w,
            self.size,
            self.alpha,
            self.beta,
            self.kappa,
            self.norms,
            self.output,
        )

    def backward(self, net):
        if net.delta is not None:
            net.be.lrn_backward(
                self.norms, self.delta, self.beta, net.delta[: self.batch * self.inputs]
            )
