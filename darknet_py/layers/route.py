"""[route]: concatenate the outputs of earlier layers along channels, per image."""
from .base import Layer


class RouteLayer(Layer):
    type = "route"

    def parse(self, s, ctx):
        refs = s.get_int_list("layers")
        if not refs:
            raise s.error("needs layers=<index>[,<index>...]", "layers")
        self.sources = []
        for ref in refs:
            index = ref if ref >= 0 else self.index + ref
            if not 0 <= index < self.index:
                raise s.error(f"layer {ref} is out of range: route at layer {self.index} can "
                              f"use layers 0..{self.index - 1} or -1..-{self.index}", "layers")
            self.sources.append(ctx.layers[index])
        first = self.sources[0]
        self.out_w, self.out_h = first.out_w, first.out_h
        self.out_c = 0
        for src in self.sources:
            if (src.out_w, src.out_h) != (self.out_w, self.out_h):
                raise s.error(f"layer {src.index} is {src.out_w}x{src.out_h} but layer "
                              f"{first.index} is {self.out_w}x{self.out_h}: routed layers must "
                              f"have the same width and height", "layers")
            self.out_c += src.out_c
        self.outputs = sum(src.outputs for src in self.sources)
        self.inputs = self.outputs

    def describe(self):
        return " " + " ".join(f"{src.index:d}" for src in self.sources)

    def forward(self, net):
        offset = 0
        for src in self.sources:
            net.be.copy_blocks(src.output, 0, src.outputs, self.output, offset, self.outputs,
                               src.outputs, self.batch)
            offset += src.outputs

    def backward(self, net):
        offset = 0
        for src in self.sources:
            if src.delta is not None:
                net.be.copy_blocks(self.delta, offset, self.outputs, src.delta, 0, src.outputs,
                                   src.outputs, self.batch, accumulate=True)
            offset += src.outputs
