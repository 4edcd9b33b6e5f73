"""[implicit]: the AlexeyAB fork's implicit-knowledge layer (representation_layer.c).

A learned constant: every image's output is the layer's `filters x atoms` weights (shape
filters x atoms x 1), whatever the input; backward sums the delta over the batch into the
weights' update and passes nothing back. Initial weights are mean + uniform(-std, std).
The fork never updates it (its update_network skips layers whose `train` flag is unset,
which this one never sets), and darknet-py does the same.
"""

from .base import Layer, host_param


class ImplicitLayer(Layer):
    type = "implicit"
    short = "implicit"

    def parse(self, s, ctx):
        if self.darknet != "alexeyab":
            raise s.error("[implicit] is the AlexeyAB fork's layer: use --darknet alexeyab")
        self.mean_init = s.get_float("mean", 0.0)
        self.std_init = s.get_float("std", 0.2)
        filters, atoms = s.get_int("filters", 128), s.get_int("atoms", 1)
        for key, v in (("filters", filters), ("atoms", atoms)):
            if v < 1:
                raise s.error(f"must be at least 1, got {v}", key)
        self.c = self.h = self.w = 1  # the fork's make_implicit_layer: it reads no input
        self.out_c, self.out_h, self.out_w = filters, atoms, 1
        self.outputs = self.nweights = filters * atoms

    def describe(self):
        return f"{'':24s}{'':16s}  ->  {self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"

    def init_params(self, be, rng):
        values = host_param(rng, self.nweights, self.std_init, "uniform") + self.mean_init
        self.weights = be.from_host(values)

    def init_updates(self, be):
        self.weight_updates = be.zeros(self.nweights)

    def params(self):
        return [("weights", self.weights)]

    def forward(self, net):
        net.be.copy_blocks(
            self.weights, 0, 0, self.output, 0, self.nweights, self.nweights, self.batch
        )

    def backward(self, net):
        # weight_updates[i] += sum over images of delta[image, i]: a bias gradient's sum
        net.be.backward_bias(self.weight_updates, self.delta, self.batch, self.nweights, 1)
