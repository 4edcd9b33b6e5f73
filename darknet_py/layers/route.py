"""[route]: concatenate the outputs of earlier layers along channels, per image.

The AlexeyAB fork's groups=G, group_id=k take from each input only the k-th of G
contiguous slices of its per-image output (channels k*C/G .. (k+1)*C/G - 1)."""

from ..plurals import counted
from . import nhwc_forward
from .base import Layer, source_layers


class RouteLayer(Layer):
    type = "route"
    is_view = False  # set by allocate: the output is the one source's output array

    def parse(self, s, ctx):
        self.sources = source_layers(self, s, ctx, "layers")
        first = self.sources[0]
        self.out_w, self.out_h = first.out_w, first.out_h
        self.out_c = 0
        for src in self.sources:
            if (src.out_w, src.out_h) != (self.out_w, self.out_h):
                raise s.error(
                    f"layer {src.index} is {src.out_w}x{src.out_h} but layer "
                    f"{first.index} is {self.out_w}x{self.out_h}: routed layers must "
                    f"have the same width and height",
                    "layers",
                )
            self.out_c += src.out_c
        self.groups = s.get_int("groups", 1)
        self.group_id = s.get_int("group_id", 0)
        if self.groups < 1:
            raise s.error(f"must be at least 1, got {self.groups}", "groups")
        if not 0 <= self.group_id < self.groups:
            raise s.error(f"must be in 0..{self.groups - 1} for groups={self.groups}", "group_id")
        for src in self.sources:
            if src.out_c % self.groups:
                raise s.error(
                    f"groups={self.groups} does not divide the "
                    f"{counted(src.out_c, 'channel')} of layer {src.index}",
                    "groups",
                )
        self.out_c //= self.groups
        self.outputs = sum(src.outputs for src in self.sources) // self.groups
        self.inputs = self.outputs

    def describe(self):
        group = f"  {self.group_id}/{self.groups}" if self.groups > 1 else ""
        return " " + " ".join(f"{src.index:d}" for src in self.sources) + group

    def views_its_input(self):
        """One whole input (groups=1): the output is that input's output array itself, so
        the forward copies nothing and the memory is not spent twice (yolov4: 0.85 GiB at b32).
        The backward still adds this layer's delta into the input's, in Darknet's order."""
        return len(self.sources) == 1 and self.groups == 1

    def new_output(self, be, batch):
        source = self.sources[0].output
        # A source that keeps more than this batch (a recurrent layer's steps) is copied.
        self.is_view = (
            self.views_its_input() and source is not None and source.size == batch * self.outputs
        )
        return source if self.is_view else super().new_output(be, batch)

    def _parts(self):
        """(source, offset of its slice in its image, slice length, offset in ours)."""
        offset = 0
        for src in self.sources:
            part = src.outputs // self.groups
            yield src, self.group_id * part, part, offset
            offset += part

    def forward(self, net):
        if nhwc_forward.is_nhwc(self):  # the layout plan's NHWC 16-bit output (issue 42)
            return nhwc_forward.forward(self, net)
        if self.is_view:
            return
        for src, start, part, offset in self._parts():
            net.be.copy_blocks(
                src.output, start, src.outputs, self.output, offset, self.outputs, part, self.batch
            )

    def backward(self, net):
        for src, start, part, offset in self._parts():
            if src.delta is not None:
                net.be.copy_blocks(
                    self.delta,
                    offset,
                    self.outputs,
                    src.delta,
                    start,
                    src.outputs,
                    part,
                    self.batch,
                    accumulate=True,
                )
