"""[softmax]: softmax over groups with a temperature; with a truth, cross-entropy cost.

With tree= (a class hierarchy, tree.py) the softmax runs over each group of sibling
classes instead, and outputs whose truth is tree.NO_TRUTH (groups holding none of the
image's classes) give no delta and no cost: Darknet's GPU build masks them (its CPU build
does not, and trains on the -1234 marker).
"""

from ..plurals import counted
from ..tree import NO_TRUTH, TreeArrays, tree_option
from .base import Layer


class SoftmaxLayer(Layer):
    type = "softmax"
    image_shaped = False  # Darknet reports 0 x 0 x 0

    def parse(self, s, ctx):
        self.groups = s.get_int("groups", 1)
        self.temperature = s.get_float("temperature", 1.0)
        self.noloss = s.get_int("noloss", 0)
        self.hierarchy = tree_option(s)
        s.get_int("spatial", 0)
        if self.groups < 1 or self.inputs % self.groups:
            raise s.error(f"groups={self.groups} must divide the {self.inputs} inputs", "groups")
        if self.temperature <= 0:
            raise s.error("must be positive", "temperature")
        if self.hierarchy is not None and self.hierarchy.n != self.inputs:
            raise s.error(
                f"{self.hierarchy.path} has "
                f"{counted(self.hierarchy.n, 'class', 'classes')} but the layer gets "
                f"{counted(self.inputs, 'input')}",
                "tree",
            )
        self.out_c = self.out_h = self.out_w = 0
        self.outputs = self.inputs

    def describe(self):
        return f"{'':40s}{self.inputs:4d}"  # Darknet: "softmax" then 40 spaces and %4d

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        self.loss = be.zeros(batch * self.inputs) if train else None
        self.scalars = be.zeros(1) if train else None
        self.tree = TreeArrays(be, self.hierarchy) if self.hierarchy is not None else None

    def forward(self, net):
        be = net.be
        if self.tree is not None:
            be.softmax_tree(
                net.input,
                1,
                self.batch,
                self.inputs,
                self.temperature,
                self.tree.offset,
                self.tree.size,
                self.tree.classes,
                self.output,
            )
        else:
            n = self.inputs // self.groups
            be.softmax(
                net.input,
                n,
                self.batch,
                self.inputs,
                self.groups,
                n,
                1,
                self.temperature,
                self.output,
            )
        if net.truth is not None and net.train and not self.noloss:
            be.softmax_x_ent(self.output, net.truth, self.delta, self.loss)
            if self.tree is not None:
                be.mask(self.delta, net.truth, NO_TRUTH)
                be.mask(self.loss, net.truth, NO_TRUTH)
            be.sum_into(self.loss, self.scalars)
            self.pending = True
        self.cost = None

    def backward(self, net):
        if net.delta is not None:
            # The fork's GPU build scales the gradient by its loss_scale (1 elsewhere).
            net.be.axpy(
                getattr(net, "fork_loss_scale", 1.0),
                self.delta,
                net.delta[: self.batch * self.inputs],
            )
