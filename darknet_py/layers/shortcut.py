"""[shortcut]: add earlier layers' outputs to the previous layer's (a residual link).

Original Darknet (shortcut_layer.c): output = activation(alpha * input + beta * from)
over the part the two shapes share, and output = activation(input) elsewhere. The
`from` layer may differ in size by an integer factor (it is then sampled with a
stride, or added to every stride-th cell) and in channels (the common ones are
added), exactly as Darknet's shortcut_cpu.

The AlexeyAB fork (layer.darknet == "alexeyab"): `from` may list several layers of
the previous layer's width and height, each added over the flat per-image prefix the
two share (no strided sampling). weights_type=per_feature (one weight per input) or
per_channel (one per input and channel) makes it a weighted sum w0*prev + sum w_i*from_i,
the weights normalised over the inputs by weights_normalization=relu or softmax and
stored in the .weights file at the layer's place. Their gradient is the fork's: the
product of delta and input, as if the normalisation were not there.
"""

from . import nhwc_forward
from .base import Layer, momentum_update, parse_activation, source_layer, source_layers

WEIGHTS_TYPES = ("none", "per_feature", "per_channel")
WEIGHTS_NORMALIZATIONS = ("none", "relu", "softmax")


class ShortcutLayer(Layer):
    type = "shortcut"
    fork_train = True
    short = "res"  # Darknet's layer table prints residual links as "res"

    def parse(self, s, ctx):
        if not s.has("from"):
            raise s.error("needs from=<layer index>", "from")
        self.activation = parse_activation(s, "linear")
        if self.darknet == "alexeyab":
            self._parse_fork(s, ctx)
        else:
            self._parse_original(s, ctx)
        self.out_c, self.out_h, self.out_w = self.c, self.h, self.w
        self.outputs = self.inputs

    def _parse_original(self, s, ctx):
        self.source = source_layer(self, s, ctx, "from")
        self.sources = [self.source]
        self.weights_type = "none"
        self.alpha = s.get_float("alpha", 1.0)
        self.beta = s.get_float("beta", 1.0)
        src = self.source
        if not (src.out_w and src.out_h and src.out_c and self.w and self.h and self.c):
            raise s.error(
                f"layer {src.index} ({src.out_w}x{src.out_h}x{src.out_c}) and the "
                f"previous layer ({self.w}x{self.h}x{self.c}) must both output "
                f"images",
                "from",
            )
        # Darknet asserts that width and height scale by the same integer factor.
        stride, sample = src.out_w // self.w, self.w // src.out_w
        if stride != src.out_h // self.h or sample != self.h // src.out_h:
            raise s.error(
                f"layer {src.index} is {src.out_w}x{src.out_h} and the previous "
                f"layer is {self.w}x{self.h}: their widths and heights must differ "
                f"by the same factor",
                "from",
            )

    def _parse_fork(self, s, ctx):
        self.sources = source_layers(self, s, ctx, "from")
        for src in self.sources:
            if (src.out_w, src.out_h) != (self.w, self.h):
                raise s.error(
                    f"layer {src.index} is {src.out_w}x{src.out_h} but the previous "
                    f"layer is {self.w}x{self.h}: the AlexeyAB fork's shortcut needs "
                    f"the same width and height",
                    "from",
                )
        self.source = self.sources[0]
        self.weights_type = s.get_str("weights_type", "none")
        if self.weights_type == "per_layer":  # the fork's other name for it
            self.weights_type = "per_feature"
        if self.weights_type not in WEIGHTS_TYPES:
            raise s.error(
                f"unknown weights_type '{self.weights_type}' (known: {', '.join(WEIGHTS_TYPES)})",
                "weights_type",
            )
        self.normalization = s.get_str("weights_normalization", "none")
        if self.normalization == "avg_relu":
            self.normalization = "relu"
        if self.normalization not in WEIGHTS_NORMALIZATIONS:
            raise s.error(
                f"unknown weights_normalization '{self.normalization}' (known: "
                f"{', '.join(WEIGHTS_NORMALIZATIONS)})",
                "weights_normalization",
            )
        # weights per input: 1 (per_feature) or one per channel
        self.weight_channels = self.c if self.weights_type == "per_channel" else 1
        self.nweights = (
            (len(self.sources) + 1) * self.weight_channels if self.weights_type != "none" else 0
        )

    @property
    def fork_bflops(self):
        # The fork counts one add per output per `from` layer, twice when weighted.
        flops = self.out_w * self.out_h * self.out_c * len(self.sources) / 1e9
        return 2 * flops if self.weights_type != "none" else flops

    def describe(self):
        # Darknet: "res  %3d" then the from layer's shape and the output shape.
        src = self.source
        if len(self.sources) > 1:
            return (
                " " + ",".join(str(s.index) for s in self.sources) + "   ->  "
                f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
            )
        idx = f"{src.index:3d}"
        return (
            f"{idx[1:] if idx[0] == ' ' else idx}{'':16s}"
            f"{src.out_w:4d} x{src.out_h:4d} x{src.out_c:4d}   ->  "
            f"{self.out_w:4d} x{self.out_h:4d} x{self.out_c:4d}"
        )

    # ---- weights (the fork's weighted shortcut) ---------------------------------------
    def init_params(self, be, rng):
        if self.weights_type != "none":
            self.weights = be.from_host([1.0] * self.nweights)  # the fork starts at 1

    def init_updates(self, be):
        if self.weights_type != "none":
            self.weight_updates = be.zeros(self.nweights)

    def allocate(self, be, batch, train):
        super().allocate(be, batch, train)
        if self.weights_type != "none":
            self.normalized_weights = be.zeros(self.nweights)

    def params(self):
        return [("weights", self.weights)] if self.weights_type != "none" else []

    def update(self, args):
        if self.weights_type == "none":
            return
        if self.fork_cpu:
            momentum_update(self.be, args, self.weights, self.weight_updates, weight_decay=True)
        else:
            # The fork's GPU build (update_shortcut_layer_gpu): no decay, updates within ±1.
            self.be.constrain(1.0, self.weight_updates)
            momentum_update(self.be, args, self.weights, self.weight_updates)

    def _inputs(self, net):
        """(output, delta, per-image size, width added, its weights) of the previous layer
        and of each `from` layer."""
        wc = self.weight_channels
        weights = getattr(self, "normalized_weights", None)
        layers = [(net.input, net.delta, self.outputs)]
        layers += [(s.output, s.delta, s.outputs) for s in self.sources]
        for i, (out, delta, size) in enumerate(layers):
            yield (
                out,
                delta,
                size,
                min(size, self.outputs),
                (weights[i * wc : (i + 1) * wc] if weights is not None else None),
            )

    # ---- computation ----------------------------------------------------------------
    def forward(self, net):
        if nhwc_forward.is_nhwc(self):  # the layout plan's NHWC 16-bit output (issue 42)
            return nhwc_forward.forward(self, net)
        be = net.be
        if self.darknet != "alexeyab":
            src = self.source
            be.copy(net.input[: self.batch * self.inputs], self.output)
            be.shortcut(
                self.batch,
                src.out_w,
                src.out_h,
                src.out_c,
                src.output,
                self.out_w,
                self.out_h,
                self.out_c,
                self.alpha,
                self.beta,
                self.output,
            )
        elif self.weights_type == "none":
            be.copy(net.input[: self.batch * self.inputs], self.output)
            for src in self.sources:
                width = min(src.outputs, self.outputs)
                be.copy_blocks(
                    src.output,
                    0,
                    src.outputs,
                    self.output,
                    0,
                    self.outputs,
                    width,
                    self.batch,
                    accumulate=True,
                )
        else:
            be.shortcut_weights(
                self.weights,
                len(self.sources) + 1,
                self.weight_channels,
                self.normalization,
                self.normalized_weights,
            )
            be.fill(self.output, 0.0)
            step = self.outputs // self.weight_channels
            for out, _, size, width, w in self._inputs(net):
                be.channel_weighted_add(
                    out, size, w, step, width, self.batch, self.output, self.outputs
                )
        self.activate_output(be)

    def backward(self, net):
        be = net.be
        self.activation_gradient(be)
        if self.darknet != "alexeyab":
            src = self.source
            if net.delta is not None:
                # As Darknet: alpha scales the whole delta, also where no `from` value was added.
                be.axpy(self.alpha, self.delta, net.delta[: self.batch * self.inputs])
            if src.delta is not None:
                be.shortcut(
                    self.batch,
                    self.out_w,
                    self.out_h,
                    self.out_c,
                    self.delta,
                    src.out_w,
                    src.out_h,
                    src.out_c,
                    1.0,
                    self.beta,
                    src.delta,
                )
            return
        step = self.outputs // self.weight_channels
        wc = self.weight_channels
        for i, (out, delta, size, width, w) in enumerate(self._inputs(net)):
            if delta is not None:
                if w is None:
                    be.copy_blocks(
                        self.delta,
                        0,
                        self.outputs,
                        delta,
                        0,
                        size,
                        width,
                        self.batch,
                        accumulate=True,
                    )
                else:
                    be.channel_weighted_add(
                        self.delta, self.outputs, w, step, width, self.batch, delta, size
                    )
            if w is not None:
                be.channel_weighted_dot(
                    self.delta,
                    self.outputs,
                    out,
                    size,
                    step,
                    width,
                    self.batch,
                    self.weight_updates[i * wc : (i + 1) * wc],
                )
