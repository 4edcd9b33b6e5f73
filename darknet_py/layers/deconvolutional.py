"""[deconvolutional] / [deconv]: a transposed convolution (the original Darknet's
deconvolutional_layer.c; the AlexeyAB fork has no such layer: its parser skips the section
as "Type not recognized", so darknet-py builds it as the original does under either flavour).

Options: filters (1), size (1), stride (1), pad (0: when set, padding = size/2), padding (0),
batch_normalize (0), activation (logistic). Output: (h-1)*stride + size - 2*padding on each
side, filters channels. The weights are a c x (filters*size*size) matrix W (stored in that
order in .weights, after the biases and the batch-norm scales and rolling statistics, as a
convolution's). Per image: col = W^T @ input, folded by col2im into the output (overlapping
windows add); backward unfolds the delta by im2col: W's update += input @ col^T, the previous
delta += W @ col. The original Darknet saves these weights but cannot read them back (its
loader divides by the layer's groups, 0 for a deconvolution); darknet-py reads what it saves.
"""

from ..activations import CHANNEL_ACTIVATIONS
from .base import Layer, filter_row, initial_param, momentum_update, parse_activation
from .batchnorm import (
    bn_activation_backward,
    bn_allocate,
    bn_forward,
    bn_init_params,
    bn_init_updates,
    bn_params,
)

INIT_SCALE = 0.02  # Darknet's deconvolution weights: 0.02 * normal * (output area / input area)


class DeconvolutionalLayer(Layer):
    type = "deconvolutional"
    short = "deconv"

    def parse(self, s, ctx):
        self.filters = s.get_int("filters", 1)
        self.size = s.get_int("size", 1)
        self.stride = s.get_int("stride", 1)
        self.activation = parse_activation(s, "logistic")
        self.batch_normalize = s.get_int("batch_normalize", 0)
        pad = s.get_int("pad", 0)
        self.padding = s.get_int("padding", 0)
        if pad:
            self.padding = self.size // 2
        for key, v in (("filters", self.filters), ("size", self.size), ("stride", self.stride)):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        if self.padding < 0:
            raise s.error(f"must not be negative, got {self.padding}", "padding")
        if not (self.w and self.h and self.c):
            raise s.error(f"the layer before [{s.header}] must output an image")
        self.out_h = (self.h - 1) * self.stride + self.size - 2 * self.padding
        self.out_w = (self.w - 1) * self.stride + self.size - 2 * self.padding
        if self.out_h < 1 or self.out_w < 1:
            raise s.error(
                f"padding {self.padding} leaves no output for a {self.w}x{self.h} "
                f"input and a {self.size}x{self.size} kernel",
                "padding",
            )
        self.out_c = self.filters
        self.outputs = self.out_c * self.out_h * self.out_w
        self.nweights = self.c * self.filters * self.size * self.size
        self.workspace_size = self._col_rows() * self.h * self.w

    def _col_rows(self):
        return self.filters * self.size * self.size

    @property
    def bflops(self):
        # Darknet counts no operations for a deconvolution (it prints none).
        return 0.0

    def describe(self):
        return filter_row(self)

    # ---- buffers ----------------------------------------------------------------
    def init_params(self, be, rng):
        scale = INIT_SCALE * (self.out_w * self.out_h) / (self.w * self.h)
        self.weights = initial_param(be, rng, self.nweights, scale, "normal")
        self.biases = be.zeros(self.filters)
        if self.batch_normalize:
            bn_init_params(self, be, rng, self.filters)

    def init_updates(self, be):
        self.weight_updates = be.zeros(self.nweights)
        self.bias_updates = be.zeros(self.filters)
        if self.batch_normalize:
            bn_init_updates(self, be, self.filters)

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        if self.batch_normalize:
            bn_allocate(self, be, batch, train)

    def params(self):
        p = [("biases", self.biases)]
        if self.batch_normalize:
            p += bn_params(self)
        return p + [("weights", self.weights)]

    # ---- computation --------------------------------------------------------------
    def _fold(self, be, col, image):
        be.col2im(
            col, self.out_c, self.out_h, self.out_w, self.size, self.stride, self.padding, 1, image
        )

    def forward(self, net):
        be = net.be
        m, k, n = self._col_rows(), self.c, self.h * self.w
        col = net.workspace[: m * n]
        be.fill(self.output, 0.0)
        for b in range(self.batch):
            # col (m x n) = W^T (m x k) @ input (k x n), then added into the output's windows
            be.gemm(
                True,
                False,
                m,
                n,
                k,
                1.0,
                self.weights,
                m,
                net.input[b * self.inputs :],
                n,
                0.0,
                col,
                n,
            )
            self._fold(be, col, self.output[b * self.outputs :][: self.outputs])
        spatial = self.out_h * self.out_w
        fused = self.activation_input is None and self.activation not in CHANNEL_ACTIVATIONS
        if self.batch_normalize:
            bn_forward(self, net, self.out_c, spatial, self.activation if fused else "linear")
        elif fused:
            be.bias_activate(
                self.output, self.biases, self.batch, self.out_c, spatial, self.activation
            )
        else:
            be.add_bias(self.output, self.biases, self.batch, self.out_c, spatial)
        if not fused:
            self.activate_output(be)

    def backward(self, net):
        be = net.be
        m, k, n = self._col_rows(), self.c, self.h * self.w
        col = net.workspace[: m * n]
        if self.batch_normalize:
            bn_activation_backward(self, net, self.out_c, self.out_h * self.out_w)
        else:
            self.activation_gradient(be)
            be.backward_bias(
                self.bias_updates, self.delta, self.batch, self.out_c, self.out_h * self.out_w
            )
        for b in range(self.batch):
            be.im2col(
                self.delta[b * self.outputs :][: self.outputs],
                self.out_c,
                self.out_h,
                self.out_w,
                self.size,
                self.stride,
                self.padding,
                1,
                col,
            )
            image = net.input[b * self.inputs :]
            # W's update (k x m) += input (k x n) @ col^T (n x m)
            be.gemm(False, True, k, m, n, 1.0, image, n, col, n, 1.0, self.weight_updates, m)
            if net.delta is not None:
                # previous delta (k x n) += W (k x m) @ col (m x n)
                be.gemm(
                    False,
                    False,
                    k,
                    n,
                    m,
                    1.0,
                    self.weights,
                    m,
                    col,
                    n,
                    1.0,
                    net.delta[b * self.inputs :],
                    n,
                )

    def update(self, args):
        momentum_update(self.be, args, self.biases, self.bias_updates)
        if self.batch_normalize:
            momentum_update(self.be, args, self.scales, self.scale_updates)
        momentum_update(self.be, args, self.weights, self.weight_updates, weight_decay=True)
