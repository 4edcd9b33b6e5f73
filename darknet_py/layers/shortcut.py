"""[shortcut]: add an earlier layer's output to the previous layer's (a residual link).

Darknet's shortcut_layer.c: output = activation(alpha * input + beta * from) over
the part the two shapes share, and output = activation(input) elsewhere. The
`from` layer may differ in size by an integer factor (it is then sampled with a
stride, or added to every stride-th cell) and in channels (the common ones are
added), exactly as Darknet's shortcut_cpu.
"""
from .base import Layer, parse_activation


class ShortcutLayer(Layer):
    type = "shortcut"
    short = "res"  # Darknet's layer table prints residual links as "res"

    def parse(self, s, ctx):
        if not s.has("from"):
            raise s.error("needs from=<layer index>", "from")
        ref = s.get_int("from")
        index = ref if ref >= 0 else self.index + ref
        if not 0 <= index < self.index:
            raise s.error(f"layer {ref} is out of range: shortcut at layer {self.index} can "
                          f"use layers 0..{self.index - 1} or -1..-{self.index}", "from")
        self.source = ctx.layers[index]
        self.activation = parse_activation(s, "linear")
        self.alpha = s.get_float("alpha", 1.0)
        self.beta = s.get_float("beta", 1.0)
        src = self.source
        if not (src.out_w and src.out_h and src.out_c and self.w and self.h and self.c):
            raise s.error(f"layer {src.index} ({src.out_w}x{src.out_h}x{src.out_c}) and the "
                          f"previous layer ({self.w}x{self.h}x{self.c}) must both output "
                          f"images", "from")
        # Darknet asserts that width and height scale by the same integer factor.
        stride, sample = src.out_w // self.w, self.w // src.out_w
        if stride != src.out_h // self.h or sample != self.h // src.out_h:
            raise s.error(f"layer {src.index} is {src.out_w}x{src.out_h} and the previous "
                          f"layer is {self.w}x{self.h}: their widths and heights must differ "
                          f"by the same factor", "from")
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def describe(self):
        # Darknet: "res  %3d" then the from layer's shape and the output shape.
        idx = f"{self.source.index:3d}"
        src = self.source
        return (f"{idx[1:] if idx[0] == ' ' else idx}{'':16s}"
                f"{src.out_w:4d} x{src.out_h:4d} x{src.out_c:4d}   ->  "
                f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}")

    def forward(self, net):
        be, src = net.be, self.source
        be.copy(net.input[:self.batch * self.inputs], self.output)
        be.shortcut(self.batch, src.out_w, src.out_h, src.out_c, src.output,
                    self.out_w, self.out_h, self.out_c, self.alpha, self.beta, self.output)
        be.activate(self.output, self.activation)

    def backward(self, net):
        be, src = net.be, self.source
        be.gradient(self.output, self.activation, self.delta)
        if net.delta is not None:
            # As Darknet: alpha scales the whole delta, also where no `from` value was added.
            be.axpy(self.alpha, self.delta, net.delta[:self.batch * self.inputs])
        if src.delta is not None:
            be.shortcut(self.batch, self.out_w, self.out_h, self.out_c, self.delta,
                        src.out_w, src.out_h, src.out_c, 1.0, self.beta, src.delta)
