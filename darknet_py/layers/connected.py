"""[connected]: a fully connected layer, output = activation(input @ weights^T + biases).

Darknet's connected_layer.c: weights are stored outputs x inputs (one row per
output), the whole batch goes through one GEMM, and batch normalisation (when
asked for) is the shared batchnorm code with one value per output (spatial 1).
"""

import math

from .base import Layer, initial_param, momentum_update, parse_activation
from .batchnorm import (
    FORK_CONNECTED_ROLLING_KEEP,
    bn_activation_backward,
    bn_allocate,
    bn_forward,
    bn_init_params,
    bn_init_updates,
    bn_params,
)


class ConnectedLayer(Layer):
    type = "connected"
    short = "connected"  # Darknet prints the full word in its layer table

    def parse(self, s, ctx):
        self.n_outputs = s.get_int("output", 1)
        self.activation = parse_activation(s, "logistic")
        self.batch_normalize = s.get_int("batch_normalize", 0)
        if self.n_outputs < 1:
            raise s.error(f"must be at least 1, got {self.n_outputs}", "output")
        if self.inputs < 1:
            raise s.error("the layer before [connected] has no outputs")
        self.out_c, self.out_h, self.out_w = self.n_outputs, 1, 1
        self.outputs = self.n_outputs
        self.nweights = self.inputs * self.outputs

    @property
    def bflops(self):
        return 2.0 * self.inputs * self.outputs / 1e9

    @property
    def fork_bflops(self):
        return 0.0  # the fork's make_connected_layer sets no bflops

    def describe(self):
        return f"{'':28s}{self.inputs:4d}  ->  {self.outputs:4d}"

    # ---- buffers ----------------------------------------------------------------
    def init_params(self, be, rng):
        # Darknet: uniform in [-scale, scale] with scale = sqrt(2 / inputs), biases 0.
        scale = math.sqrt(2.0 / self.inputs)
        self.weights = initial_param(be, rng, self.nweights, scale, "uniform")
        self.biases = be.zeros(self.outputs)
        if self.batch_normalize:
            bn_init_params(self, be, rng, self.outputs)

    def init_updates(self, be):
        self.weight_updates = be.zeros(self.nweights)
        self.bias_updates = be.zeros(self.outputs)
        if self.batch_normalize:
            bn_init_updates(self, be, self.outputs)

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        if self.batch_normalize:
            bn_allocate(self, be, batch, train)

    def params(self):
        # Darknet's load_connected_weights order: biases, weights, then the BN arrays.
        p = [("biases", self.biases), ("weights", self.weights)]
        if self.batch_normalize:
            p += bn_params(self)
        return p

    # ---- computation --------------------------------------------------------------
    def forward(self, net):
        be = net.be
        # output (batch x outputs) = input (batch x inputs) @ weights^T (inputs x outputs)
        be.gemm(
            False,
            True,
            self.batch,
            self.outputs,
            self.inputs,
            1.0,
            net.input,
            self.inputs,
            self.weights,
            self.inputs,
            0.0,
            self.output,
            self.outputs,
        )
        if self.batch_normalize:
            bn_forward(self, net, self.outputs, 1, fork_keep=FORK_CONNECTED_ROLLING_KEEP)
        else:
            be.add_bias(self.output, self.biases, self.batch, self.outputs, 1)
        self.activate_output(be)

    def backward(self, net):
        be = net.be
        if self.batch_normalize:
            bn_activation_backward(self, net, self.outputs, 1)
        else:
            self.activation_gradient(be)
            be.backward_bias(self.bias_updates, self.delta, self.batch, self.outputs, 1)
        # weight_updates (outputs x inputs) += delta^T (outputs x batch) @ input (batch x inputs)
        be.gemm(
            True,
            False,
            self.outputs,
            self.inputs,
            self.batch,
            1.0,
            self.delta,
            self.outputs,
            net.input,
            self.inputs,
            1.0,
            self.weight_updates,
            self.inputs,
        )
        if net.delta is not None:
            # previous delta (batch x inputs) += delta (batch x outputs) @ weights
            be.gemm(
                False,
                False,
                self.batch,
                self.inputs,
                self.outputs,
                1.0,
                self.delta,
                self.outputs,
                self.weights,
                self.inputs,
                1.0,
                net.delta,
                self.inputs,
            )

    def update(self, args):
        momentum_update(self.be, args, self.biases, self.bias_updates)
        if self.batch_normalize:
            momentum_update(self.be, args, self.scales, self.scale_updates)
        momentum_update(self.be, args, self.weights, self.weight_updates, weight_decay=True)
