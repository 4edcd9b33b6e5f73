"""[convolutional]: im2col + GEMM per image and group, as Darknet does it."""
import math

from ..backends.numpy_backend import conv_out_size
from .base import Layer, host_param, momentum_update, parse_activation, refuse_options
from .batchnorm import (bn_allocate, bn_backward, bn_forward, bn_init_params, bn_init_updates,
                        bn_params)


class ConvolutionalLayer(Layer):
    type = "convolutional"
    short = "conv"

    def parse(self, s, ctx):
        self.filters = s.get_int("filters", 1)
        self.size = s.get_int("size", 1)
        self.stride = s.get_int("stride", 1)
        self.groups = s.get_int("groups", 1)
        self.dilation = s.get_int("dilation", 1)
        pad = s.get_int("pad", 0)
        self.padding = s.get_int("padding", 0)
        if pad:  # Darknet: pad=1 means "same" padding, size/2 (scaled by dilation)
            self.padding = self.dilation * (self.size // 2)
        self.activation = parse_activation(s, "logistic")
        self.batch_normalize = s.get_int("batch_normalize", 0)
        refuse_options(s, "binary", "xnor")
        for key, v in (("filters", self.filters), ("size", self.size), ("stride", self.stride),
                       ("groups", self.groups), ("dilation", self.dilation)):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        if self.c % self.groups or self.filters % self.groups:
            raise s.error(f"groups={self.groups} must divide both the input channels "
                          f"({self.c}) and filters ({self.filters})", "groups")
        self.out_h, self.out_w = conv_out_size(self.h, self.w, self.size, self.stride,
                                               self.padding, self.dilation)
        if self.out_h < 1 or self.out_w < 1:
            raise s.error(f"a {self.size}x{self.size} kernel does not fit the "
                          f"{self.w}x{self.h} input", "size")
        self.out_c = self.filters
        self.outputs = self.out_c * self.out_h * self.out_w
        self.nweights = self.c // self.groups * self.filters * self.size * self.size
        if not self._col_is_input():
            self.workspace_size = (self.c // self.groups * self.size * self.size
                                   * self.out_h * self.out_w)

    def _col_is_input(self):
        # A 1x1, stride-1, unpadded convolution needs no im2col: the image is its own column matrix.
        return self.size == 1 and self.stride == 1 and self.padding == 0 and self.dilation == 1

    @property
    def bflops(self):
        return (2.0 * self.filters * self.size * self.size * self.c / self.groups
                * self.out_h * self.out_w) / 1e9

    def describe(self):
        # Darknet's row ("conv  %5d %2d x%2d /%2d  %4d x..."); groups, which it does not
        # print, are shown only when there are some.
        groups = f" g{self.groups}" if self.groups > 1 else "  "
        return (f"{self.filters:5d} {self.size:2d} x{self.size:2d} /{self.stride:2d}{groups}"
                f"{self.w:4d} x{self.h:4d} x{self.c:4d}   ->  "
                f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}  {self.bflops:5.3f} BFLOPs")

    # ---- buffers ----------------------------------------------------------------
    def init_params(self, be, rng):
        scale = math.sqrt(2.0 / (self.size * self.size * self.c / self.groups))
        self.weights = be.from_host(host_param(rng, self.nweights, scale, "normal"))
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
    def _gemm_dims(self):
        m = self.filters // self.groups                   # filters per group
        k = self.size * self.size * self.c // self.groups  # weights per filter
        n = self.out_h * self.out_w                       # output positions
        return m, k, n

    def _columns(self, be, image, workspace):
        """The column matrix of one image group: the image itself for plain 1x1 convs."""
        if self._col_is_input():
            return image
        be.im2col(image, self.c // self.groups, self.h, self.w, self.size, self.stride,
                  self.padding, self.dilation, workspace)
        return workspace

    def forward(self, net):
        be = net.be
        m, k, n = self._gemm_dims()
        in_group = self.c // self.groups * self.h * self.w
        be.fill(self.output, 0.0)
        for b in range(self.batch):
            for g in range(self.groups):
                image = net.input[(b * self.groups + g) * in_group:][:in_group]
                cols = self._columns(be, image, net.workspace)
                out = self.output[(b * self.groups + g) * m * n:]
                be.gemm(False, False, m, n, k, 1.0, self.weights[g * m * k:], k,
                        cols, n, 1.0, out, n)
        spatial = self.out_h * self.out_w
        if self.batch_normalize:
            bn_forward(self, net, self.out_c, spatial)
        else:
            be.add_bias(self.output, self.biases, self.batch, self.out_c, spatial)
        be.activate(self.output, self.activation)

    def backward(self, net):
        be = net.be
        m, k, n = self._gemm_dims()
        spatial = self.out_h * self.out_w
        be.gradient(self.output, self.activation, self.delta)
        if self.batch_normalize:
            bn_backward(self, net, self.out_c, spatial)
        else:
            be.backward_bias(self.bias_updates, self.delta, self.batch, self.out_c, spatial)
        in_group = self.c // self.groups * self.h * self.w
        for b in range(self.batch):
            for g in range(self.groups):
                offset = (b * self.groups + g) * in_group
                image = net.input[offset:][:in_group]
                delta_out = self.delta[(b * self.groups + g) * m * n:]
                cols = self._columns(be, image, net.workspace)
                # weight_updates += delta (m x n) @ cols^T (n x k)
                be.gemm(False, True, m, k, n, 1.0, delta_out, n, cols, n, 1.0,
                        self.weight_updates[g * m * k:], k)
                if net.delta is not None:
                    delta_in = net.delta[offset:][:in_group]
                    if self._col_is_input():
                        # delta_in += weights^T (k x m) @ delta (m x n), accumulated
                        # (Darknet overwrites here, losing shortcut deltas).
                        be.gemm(True, False, k, n, m, 1.0, self.weights[g * m * k:], k,
                                delta_out, n, 1.0, delta_in, n)
                    else:
                        be.gemm(True, False, k, n, m, 1.0, self.weights[g * m * k:], k,
                                delta_out, n, 0.0, net.workspace, n)
                        be.col2im(net.workspace, self.c // self.groups, self.h, self.w,
                                  self.size, self.stride, self.padding, self.dilation, delta_in)

    def update(self, args):
        momentum_update(self.be, args, self.biases, self.bias_updates)
        if self.batch_normalize:
            momentum_update(self.be, args, self.scales, self.scale_updates)
        momentum_update(self.be, args, self.weights, self.weight_updates, n_is_decayed=True)
