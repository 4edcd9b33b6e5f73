"""[scale_channels]: the AlexeyAB fork's channel attention (squeeze-and-excitation).

out[b, c, y, x] = prev[b, c] * from[b, c, y, x], the previous layer being 1x1xC and
the output taking the `from` layer's shape; scale_wh=1 swaps the roles: the previous
layer is WxHx1 and scales every channel at each position."""

from .base import Layer, parse_activation, source_layer


class ScaleChannelsLayer(Layer):
    type = "scale_channels"
    short = "scale"

    def parse(self, s, ctx):
        self.source = source_layer(self, s, ctx, "from")
        self.scale_wh = s.get_int("scale_wh", 0)
        self.activation = parse_activation(s, "linear")
        src = self.source
        if self.scale_wh:
            fits = self.c == 1 and (self.w, self.h) == (src.out_w, src.out_h)
            need = f"{src.out_w}x{src.out_h}x1"
        else:
            fits = self.w == 1 and self.h == 1 and self.c == src.out_c
            need = f"1x1x{src.out_c}"
        if not fits:
            raise s.error(
                f"the previous layer is {self.w}x{self.h}x{self.c}; with layer "
                f"{src.index} ({src.out_w}x{src.out_h}x{src.out_c}) it must be "
                f"{need}",
                "from",
            )
        self.out_c, self.out_h, self.out_w = src.out_c, src.out_h, src.out_w
        self.outputs = src.outputs

    def describe(self):
        return f"{self.source.index:4d}{'':20s}{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"

    def _shape(self):
        return self.batch, self.out_c, self.out_h * self.out_w, self.scale_wh

    def forward(self, net):
        net.be.scale_channels(net.input, self.source.output, *self._shape(), self.output)
        self.activate_output(net.be)

    def backward(self, net):
        self.activation_gradient(net.be)
        net.be.scale_channels_backward(
            net.input, self.source.output, self.delta, *self._shape(), net.delta, self.source.delta
        )
