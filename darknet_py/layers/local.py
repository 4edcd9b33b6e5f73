"""[local]: a locally connected layer (a convolution with separate weights per output
position), as Darknet's local_layer.c.

Per image the input is unfolded by im2col; each output location j then has its
own filters x (size*size*c) weight matrix and one GEMM with column j. Biases
are per output value (filters x out_h x out_w). Darknet quirks kept:
  * pad is a flag for the output size ((h - 1)/stride + 1 when set, else
    (h - size)/stride + 1) but its integer value is the im2col padding; the two
    agree for the usual size=3, pad=1 and any other cfg is refused;
  * the random initialisation fills only the first location's weights (the
    rest start at 0), with scale sqrt(2 / (size*size*c)).
"""

import math

from ..shapes import conv_out_size
from .base import Layer, filter_row, host_param, momentum_update, parse_activation


class LocalLayer(Layer):
    type = "local"
    short = "local"

    def parse(self, s, ctx):
        self.filters = s.get_int("filters", 1)
        self.size = s.get_int("size", 1)
        self.stride = s.get_int("stride", 1)
        self.pad = s.get_int("pad", 0)
        self.activation = parse_activation(s, "logistic")
        for key, v in (("filters", self.filters), ("size", self.size), ("stride", self.stride)):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        if self.pad < 0:
            raise s.error(f"must not be negative, got {self.pad}", "pad")
        if not (self.w and self.h and self.c):
            raise s.error("the layer before [local] must output an image")
        span = 1 if self.pad else self.size
        self.out_h = (self.h - span) // self.stride + 1
        self.out_w = (self.w - span) // self.stride + 1
        if self.h < span or self.w < span or self.out_h < 1 or self.out_w < 1:
            raise s.error(
                f"a {self.size}x{self.size} window does not fit the {self.w}x{self.h} input", "size"
            )
        if conv_out_size(self.h, self.w, self.size, self.stride, self.pad) != (
            self.out_h,
            self.out_w,
        ):
            raise s.error(
                f"pad={self.pad} with size={self.size}: Darknet's output size "
                f"({self.out_w}x{self.out_h}) and its im2col (padding {self.pad}) "
                f"disagree; use pad=1 with size=3, or pad=0",
                "pad",
            )
        self.out_c = self.filters
        self.outputs = self.out_c * self.out_h * self.out_w
        self.locations = self.out_h * self.out_w
        self.ksize = self.size * self.size * self.c  # weights per filter and location
        self.nweights = self.ksize * self.filters * self.locations
        self.workspace_size = self.ksize * self.locations

    @property
    def bflops(self):
        # Darknet counts no operations for local layers (it prints none).
        return 0.0

    def describe(self):
        # Darknet prints a free-form "Local Layer: ..." line; this is the conv row's layout.
        return filter_row(self)

    # ---- buffers ----------------------------------------------------------------
    def init_params(self, be, rng):
        scale = math.sqrt(2.0 / self.ksize)
        first = self.ksize * self.filters
        self.weights = be.zeros(self.nweights)  # the other locations stay 0, as Darknet's calloc
        be.write(self.weights[:first], host_param(rng, first, scale, "uniform"))
        self.biases = be.zeros(self.outputs)

    def init_updates(self, be):
        self.weight_updates = be.zeros(self.nweights)
        self.bias_updates = be.zeros(self.outputs)

    def params(self):
        return [("biases", self.biases), ("weights", self.weights)]

    # ---- computation --------------------------------------------------------------
    def _im2col(self, be, net, b):
        image = net.input[b * self.inputs :][: self.inputs]
        be.im2col(image, self.c, self.h, self.w, self.size, self.stride, self.pad, 1, net.workspace)

    def forward(self, net):
        be = net.be
        f, k, L = self.filters, self.ksize, self.locations
        be.fill(self.output, 0.0)
        be.add_bias(self.output, self.biases, self.batch, self.outputs, 1)  # one bias per value
        for b in range(self.batch):
            self._im2col(be, net, b)
            out = self.output[b * self.outputs :]
            for j in range(L):
                # out[:, j] (filters x 1) += W_j (filters x k) @ col[:, j] (k x 1)
                be.gemm(
                    False,
                    False,
                    f,
                    1,
                    k,
                    1.0,
                    self.weights[j * k * f :],
                    k,
                    net.workspace[j:],
                    L,
                    1.0,
                    out[j:],
                    L,
                )
        self.activate_output(be)

    def backward(self, net):
        be = net.be
        f, k, L = self.filters, self.ksize, self.locations
        self.activation_gradient(be)
        be.backward_bias(self.bias_updates, self.delta, self.batch, self.outputs, 1)
        for b in range(self.batch):
            self._im2col(be, net, b)
            delta = self.delta[b * self.outputs :]
            for j in range(L):
                # W_j updates (filters x k) += delta[:, j] (filters x 1) @ col[:, j]^T (1 x k)
                be.gemm(
                    False,
                    True,
                    f,
                    k,
                    1,
                    1.0,
                    delta[j:],
                    L,
                    net.workspace[j:],
                    L,
                    1.0,
                    self.weight_updates[j * k * f :],
                    k,
                )
            if net.delta is not None:
                for j in range(L):
                    # col[:, j] (k x 1) = W_j^T (k x filters) @ delta[:, j] (filters x 1)
                    be.gemm(
                        True,
                        False,
                        k,
                        1,
                        f,
                        1.0,
                        self.weights[j * k * f :],
                        k,
                        delta[j:],
                        L,
                        0.0,
                        net.workspace[j:],
                        L,
                    )
                be.col2im(
                    net.workspace,
                    self.c,
                    self.h,
                    self.w,
                    self.size,
                    self.stride,
                    self.pad,
                    1,
                    net.delta[b * self.inputs :][: self.inputs],
                )

    def update(self, args):
        momentum_update(self.be, args, self.biases, self.bias_updates)
        momentum_update(self.be, args, self.weights, self.weight_updates, weight_decay=True)
