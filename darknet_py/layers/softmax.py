"""[softmax]: softmax over groups with a temperature; with a truth, cross-entropy cost."""
from .base import Layer, refuse_options


class SoftmaxLayer(Layer):
    type = "softmax"
    image_shaped = False  # Darknet reports 0 x 0 x 0

    def parse(self, s, ctx):
        self.groups = s.get_int("groups", 1)
        self.temperature = s.get_float("temperature", 1.0)
        self.noloss = s.get_int("noloss", 0)
        refuse_options(s, "tree")
        s.get_int("spatial", 0)
        if self.groups < 1 or self.inputs % self.groups:
            raise s.error(f"groups={self.groups} must divide the {self.inputs} inputs", "groups")
        if self.temperature <= 0:
            raise s.error("must be positive", "temperature")
        self.out_c = self.out_h = self.out_w = 0
        self.outputs = self.inputs

    def describe(self):
        return f"{'':40s}{self.inputs:4d}"  # Darknet: "softmax" then 40 spaces and %4d

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.loss = be.zeros(batch * self.inputs) if train else None
        self.scalars = be.zeros(1) if train else None

    def forward(self, net):
        be = net.be
        n = self.inputs // self.groups
        be.softmax(net.input, n, self.batch, self.inputs, self.groups, n, 1, self.temperature,
                   self.output)
        if net.truth is not None and net.train and not self.noloss:
            be.softmax_x_ent(self.output, net.truth, self.delta, self.loss)
            be.sum_into(self.loss, self.scalars)
            self.pending = True
        self.cost = None

    def backward(self, net):
        if net.delta is not None:
            net.be.axpy(1.0, self.delta, net.delta[:self.batch * self.inputs])
