"""[batchnorm], and the batch normalisation every conv/connected layer can use.

Darknet's batchnorm math (CPU formulas, quirks included: forward divides by
sqrt(var)+1e-6, backward uses sqrt(var+1e-5); variance is unbiased). The
functions here work on any layer carrying the BN arrays (scales, rolling stats,
x, x_norm, mean, variance and their deltas), so convolutional and connected
layers share them.
"""
from .base import Layer, host_param, momentum_update


def bn_init_params(layer, be, rng, n):
    layer.scales = be.from_host(host_param(rng, n, kind="ones"))
    layer.rolling_mean = be.zeros(n)
    layer.rolling_variance = be.zeros(n)


def bn_init_updates(layer, be, n):
    """Buffers only training needs: batch statistics and the scales' update."""
    layer.scale_updates = be.zeros(n)
    layer.mean = be.zeros(n)
    layer.variance = be.zeros(n)
    layer.mean_delta = be.zeros(n)
    layer.variance_delta = be.zeros(n)


def bn_allocate(layer, be, batch, train):
    if train:
        layer.x = be.zeros(batch * layer.outputs)
        layer.x_norm = be.zeros(batch * layer.outputs)


def bn_forward(layer, net, out_c, spatial):
    """Normalise layer.output in place, then scale and add biases."""
    be, out, batch = net.be, layer.output, layer.batch
    if net.train:
        be.copy(out, layer.x)
        be.mean(out, batch, out_c, spatial, layer.mean)
        be.variance(out, layer.mean, batch, out_c, spatial, layer.variance)
        be.scal(0.99, layer.rolling_mean)
        be.axpy(0.01, layer.mean, layer.rolling_mean)
        be.scal(0.99, layer.rolling_variance)
        be.axpy(0.01, layer.variance, layer.rolling_variance)
        be.normalize(out, layer.mean, layer.variance, batch, out_c, spatial)
        be.copy(out, layer.x_norm)
    else:
        be.normalize(out, layer.rolling_mean, layer.rolling_variance, batch, out_c, spatial)
    be.scale_bias(out, layer.scales, batch, out_c, spatial)
    be.add_bias(out, layer.biases, batch, out_c, spatial)


def bn_backward(layer, net, out_c, spatial):
    """Turn layer.delta (w.r.t. the BN output) into the delta w.r.t. the BN input."""
    be, delta, batch = net.be, layer.delta, layer.batch
    mean = layer.mean if net.train else layer.rolling_mean
    variance = layer.variance if net.train else layer.rolling_variance
    be.backward_bias(layer.bias_updates, delta, batch, out_c, spatial)
    be.backward_scale(layer.x_norm, delta, batch, out_c, spatial, layer.scale_updates)
    be.scale_bias(delta, layer.scales, batch, out_c, spatial)
    be.mean_delta(delta, variance, batch, out_c, spatial, layer.mean_delta)
    be.variance_delta(layer.x, delta, mean, variance, batch, out_c, spatial, layer.variance_delta)
    be.normalize_delta(layer.x, mean, variance, layer.mean_delta, layer.variance_delta,
                       batch, out_c, spatial, delta)


def bn_params(layer):
    return [("scales", layer.scales), ("rolling_mean", layer.rolling_mean),
            ("rolling_variance", layer.rolling_variance)]


class BatchnormLayer(Layer):
    """[batchnorm]: a standalone normalisation with its own scales and biases."""
    type = "batchnorm"

    def parse(self, section, ctx):
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def describe(self):
        return f"{'':24s}{self.w:4d} x{self.h:4d} x{self.c:4d}"

    def init_params(self, be, rng):
        self.biases = be.zeros(self.out_c)
        bn_init_params(self, be, rng, self.out_c)

    def init_updates(self, be):
        self.bias_updates = be.zeros(self.out_c)
        bn_init_updates(self, be, self.out_c)

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        bn_allocate(self, be, batch, train)

    def params(self):
        return bn_params(self)

    def forward(self, net):
        net.be.copy(net.input[:self.batch * self.inputs], self.output)
        bn_forward(self, net, self.out_c, self.out_h * self.out_w)

    def backward(self, net):
        bn_backward(self, net, self.out_c, self.out_h * self.out_w)
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[:self.batch * self.inputs])

    def update(self, args):
        momentum_update(self.be, args, self.biases, self.bias_updates)
        momentum_update(self.be, args, self.scales, self.scale_updates)
