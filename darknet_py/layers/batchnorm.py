"""[batchnorm], and the batch normalisation every conv/connected layer can use.

Darknet's batchnorm math (CPU formulas, quirks included: forward divides by
sqrt(var)+1e-6, backward uses sqrt(var+1e-5); variance is unbiased; rolling
statistics move by 0.01). The AlexeyAB fork divides by sqrt(var+1e-5) in the
forward too. Its CPU build ("alexeyab-cpu") moves its rolling statistics by 0.1, gives a
convolution's BN beta no gradient and divides by sqrt(var)+1e-5 in the backward; its GPU
build ("alexeyab": cuDNN's batch norm) normalises a training batch with the biased variance,
moves the rolling mean and the unbiased variance by 0.01 and back-propagates the exact
gradient, beta included (layer.darknet and layer.fork_cpu pick which). The
functions here work on any layer carrying the BN arrays (scales, rolling stats,
x, mean, variance and their deltas), so convolutional and connected
layers share them. Training keeps x (the normalisation's input), not x_norm nor the
activation's input: the backward recomputes both, bit for bit, from x and the statistics.
Only a recurrent layer's inner layers (Layer.stepped) keep x_norm (their backward pairs each
step's x_norm with the last step's statistics, as Darknet's does).
Under fp16/bf16 (the layer's precision, precision.HALF_STORAGE) x is kept at 16 bits, rounded
to nearest even as the forward's batchnorm_apply reads it (keep=, x_precision): its
convolution's operands were rounded so already; fp32 and tf32 layers, and stepped ones, keep
an fp32 x. Passes cut for reduced precisions (a batch read fewer each): a layer whose precision
is not fp32 takes its batch statistics from one read (mean_variance); one that keeps a
16-bit x takes batchnorm_delta's sums from its activation pass (batchnorm_delta_from_sums).
fp32 keeps Darknet's passes, bit for bit.
"""

from .. import precision as precisions
from ..activations import CHANNEL_ACTIVATIONS
from .base import Layer, initial_param, momentum_update

ROLLING_KEEP = 0.99  # rolling statistics: keep * old + (1 - keep) * batch
FORK_ROLLING_KEEP = 0.9
FORK_CONNECTED_ROLLING_KEEP = 0.95  # the fork's forward_connected_layer moves them by 0.05
FORK_BN_EPS = 1e-5  # the fork's forward: (x - mean) / sqrt(var + eps)


def bn_init_params(layer, be, rng, n):
    layer.scales = initial_param(be, rng, n, kind="ones")
    layer.rolling_mean = be.zeros(n)
    layer.rolling_variance = be.zeros(n)


def bn_init_updates(layer, be, n):
    """Buffers only training needs: batch statistics and the scales' update."""
    layer.scale_updates = be.zeros(n)
    layer.mean = be.zeros(n)
    layer.variance = be.zeros(n)
    layer.mean_delta = be.zeros(n)
    layer.variance_delta = be.zeros(n)
    # A 16-bit x's backward: batchnorm_activation_backward's per-channel sums (no pass of
    # batchnorm_delta's own to make them).
    layer.delta_sum = be.zeros(n)
    layer.delta_x_norm_sum = be.zeros(n)


def x_precision(layer):
    """How the layer keeps x: at its precision's 16 bits under fp16/bf16, unless stepped
    (precision.storage); else fp32."""
    if layer.stepped:
        return precisions.DEFAULT
    return precisions.storage(getattr(layer, "precision", precisions.DEFAULT))


def product_into_x(layer, net):
    """The precision a forward that normalises its product writes it at straight into x
    (its 16 bits: bn_forward's from_x, half the bytes): in training, and in an unfolded
    inference whose output is kept at 16 bits (no fp32 array to normalise in place; the
    product is rounded once more than Darknet's unfolded inference rounds it); None: into
    layer.output, as fp32."""
    at = x_precision(layer)
    if at not in precisions.HALF_STORAGE:
        return None
    if net.train:
        return at
    if net.be.storage_of(layer.output) == precisions.DEFAULT:
        return None
    if getattr(layer, "x", None) is None:
        raise ValueError(
            f"layer {layer.index}: its output is kept at {at} but no x was "
            f"allocated to normalise an unfolded inference from; allocate the "
            f"network again after changing fold_batchnorm"
        )
    return at


def bn_allocate(layer, be, batch, train):
    """Training keeps x (the input of the normalisation, at x_precision); x_norm only where
    the layer is stepped (recurrent: Layer.stepped), else the backward recomputes it from x."""
    if train:
        layer.x = be.storage_zeros(batch * layer.outputs, x_precision(layer))
        layer.x_norm = be.zeros(batch * layer.outputs) if layer.stepped else None


def bn_forward(
    layer, net, out_c, spatial, activation="linear", fork_keep=FORK_ROLLING_KEEP, from_x=False
):
    """Normalise layer.output in place, then scale, add biases and apply `activation` (one
    pass after the statistics). fork_keep: how much of the rolling statistics the fork's
    layer keeps per pass. from_x (training, a 16-bit x): the input is already in layer.x,
    not in layer.output: the statistics are taken from x and the output made from it by
    batchnorm_rebuild (x's bits as batchnorm_apply would have kept them)."""
    be, out, batch = net.be, layer.output, layer.batch
    fork = layer.darknet == "alexeyab"
    if net.train:
        if from_x:
            be.mean_variance(
                layer.x,
                batch,
                out_c,
                spatial,
                layer.mean,
                layer.variance,
                x_precision=x_precision(layer),
            )
        elif getattr(layer, "precision", precisions.DEFAULT) == precisions.DEFAULT:
            be.mean(out, batch, out_c, spatial, layer.mean)
            be.variance(out, layer.mean, batch, out_c, spatial, layer.variance)
        else:  # one read for both; the variance within 2e-7 of the two passes'
            # (double sums of x and x^2); fp32 keeps Darknet's two passes, bit for bit
            be.mean_variance(out, batch, out_c, spatial, layer.mean, layer.variance)
        keep = fork_keep if layer.fork_cpu else ROLLING_KEEP
        be.scal(keep, layer.rolling_mean)
        be.axpy(1.0 - keep, layer.mean, layer.rolling_mean)
        be.scal(keep, layer.rolling_variance)
        be.axpy(1.0 - keep, layer.variance, layer.rolling_variance)
        if fork and not layer.fork_cpu:
            # cuDNN normalises (and back-propagates) with the biased variance: sum / n.
            count = batch * spatial
            be.scal((count - 1) / count, layer.variance)
        mean, variance = layer.mean, layer.variance
    else:
        mean, variance = layer.rolling_mean, layer.rolling_variance
    if from_x:
        be.batchnorm_rebuild(
            layer.x,
            out,
            mean,
            variance,
            layer.scales,
            layer.biases,
            batch,
            out_c,
            spatial,
            _forward_eps(layer),
            activation,
            x_precision(layer),
        )
        return
    # Training keeps x (the input, at x_precision) in the same pass.
    be.batchnorm_apply(
        out,
        mean,
        variance,
        layer.scales,
        layer.biases,
        batch,
        out_c,
        spatial,
        _forward_eps(layer),
        activation,
        layer.x_norm if net.train else None,
        keep=layer.x if net.train else None,
        keep_precision=x_precision(layer),
    )


def bn_rebuild_output(layer, net):
    """Make the output this pass's forward made again from what training keeps (x, the
    pass's mean and variance, scales and biases), in the same batchnorm_apply: fp32/tf32
    bit for bit; fp16/bf16 from x's 16 bits, the values batch norm's backward reads
    (output_plan.py: shared until then). For a layer whose activation joins
    batchnorm_apply (output_plan.rebuildable)."""
    net.be.batchnorm_rebuild(
        layer.x,
        layer.output,
        layer.mean,
        layer.variance,
        layer.scales,
        layer.biases,
        layer.batch,
        layer.out_c,
        layer.out_h * layer.out_w,
        _forward_eps(layer),
        layer.activation,
        x_precision(layer),
    )


def bn_activation_backward(layer, net, out_c, spatial, train_beta=True):
    """The activation's gradient and batch norm's backward: layer.delta (w.r.t. the layer's
    output) becomes the delta w.r.t. the BN input; the scales' and biases' updates grow.
    train_beta=False: the biases (BN beta) get no gradient. The fork's GPU build (cuDNN's
    exact gradient with the biased variance the forward left in layer.variance) is the
    original's formula with that variance; its CPU build has its own divisor.
    A layer that kept no x_norm (all but stepped ones) recomputes it and the activation's
    input from x as the forward computed them, in the pass that applies the activation's
    gradient and adds the parameters' sums (batchnorm_activation_backward); a gradient that
    mixes channels (normalize_channels) runs first, from its kept input."""
    be = net.be
    activation = getattr(layer, "activation", "linear")  # [batchnorm] has none
    if layer.x_norm is not None or activation in CHANNEL_ACTIVATIONS:
        if activation != "linear":
            layer.activation_gradient(be)
        activation = "linear"
    mean, variance = (
        (layer.mean, layer.variance) if net.train else (layer.rolling_mean, layer.rolling_variance)
    )
    bias_updates = layer.bias_updates if train_beta else None
    x_at = x_precision(layer)
    # A 16-bit x (fp16/bf16): batchnorm_delta's two per-channel sums are the activation
    # pass's own (delta_sum, delta_x_norm_sum), not a reduction pass of their own; fp32
    # and tf32 keep Darknet's, bit for bit.
    from_sums = layer.x_norm is None and x_at != precisions.DEFAULT
    sums = (layer.delta_sum, layer.delta_x_norm_sum) if from_sums else (None, None)
    if layer.x_norm is not None:
        be.bias_scale_updates(
            layer.delta,
            layer.x_norm,
            layer.batch,
            out_c,
            spatial,
            bias_updates,
            layer.scale_updates,
        )
    else:
        be.batchnorm_activation_backward(
            layer.x,
            mean,
            variance,
            layer.scales,
            layer.biases,
            layer.output,
            layer.batch,
            out_c,
            spatial,
            _forward_eps(layer),
            activation,
            layer.delta,
            bias_updates,
            layer.scale_updates,
            x_precision=x_at,
            delta_sum=sums[0],
            delta_x_norm_sum=sums[1],
        )
    if from_sums:
        be.batchnorm_delta_from_sums(
            layer.x,
            mean,
            variance,
            layer.scales,
            layer.batch,
            out_c,
            spatial,
            _forward_eps(layer),
            *sums,
            layer.mean_delta,
            layer.variance_delta,
            layer.delta,
            fork=layer.fork_cpu,
            x_precision=x_at,
        )
    else:
        be.batchnorm_delta(
            layer.x,
            mean,
            variance,
            layer.scales,
            layer.batch,
            out_c,
            spatial,
            layer.mean_delta,
            layer.variance_delta,
            layer.delta,
            fork=layer.fork_cpu,
            x_precision=x_at,
        )


def _forward_eps(layer):
    """batchnorm_apply's eps: None (Darknet's sqrt(var) + 1e-6) or the fork's."""
    return FORK_BN_EPS if layer.darknet == "alexeyab" else None


def bn_params(layer):
    return [
        ("scales", layer.scales),
        ("rolling_mean", layer.rolling_mean),
        ("rolling_variance", layer.rolling_variance),
    ]


class BatchnormLayer(Layer):
    """[batchnorm]: a standalone normalisation with its own scales and biases."""

    type = "batchnorm"
    fork_train = True

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
        # The fork's .weights also stores a [batchnorm] layer's biases, first.
        return ([("biases", self.biases)] if self.darknet == "alexeyab" else []) + bn_params(self)

    def forward(self, net):
        net.be.copy(net.input[: self.batch * self.inputs], self.output)
        bn_forward(self, net, self.out_c, self.out_h * self.out_w)

    def backward(self, net):
        fork = self.darknet == "alexeyab"
        # The fork's backward_batchnorm_layer (both builds) copies its delta over the
        # previous layer's (what others left there is lost); its CPU build gives the
        # biases no gradient.
        bn_activation_backward(
            self, net, self.out_c, self.out_h * self.out_w, train_beta=not self.fork_cpu
        )
        if net.delta is not None:
            if fork:
                net.be.copy(self.delta, net.delta[: self.batch * self.inputs])
            else:
                net.be.axpy(1.0, self.delta, net.delta[: self.batch * self.inputs])

    def update(self, args):
        momentum_update(self.be, args, self.biases, self.bias_updates)
        momentum_update(self.be, args, self.scales, self.scale_updates)
