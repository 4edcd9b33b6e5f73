"""[crnn]: Darknet's convolutional recurrent layer (crnn_layer.c): [rnn] with its three inner
layers [convolutional] instead of [connected] (the same step loop, state handling and
backward quirks; see rnn.py). The state holds `hidden` feature maps of the input's size.

The original's convolutions are 3x3, stride 1, padding 1, on the image with height and width
swapped (its parser passes them in the wrong order); its options are hidden_filters and
output_filters. The fork names them hidden and output and takes size, stride, dilation,
pad/padding and groups for all three convolutions; it trains [crnn] (unlike its [rnn]), while
the original never does (its inner convolutions' learning-rate scale is 0). The fork's
convolution backward replaces the delta it writes instead of adding to it
(ConvolutionalLayer.clears_input_delta), so its [crnn] drops the delta a step's state gets
from the next step (only the output's reaches it).
"""

from .base import parse_activation, refuse_options
from .recurrent import inner_section
from .rnn import RnnLayer


class CrnnLayer(RnnLayer):
    type = "crnn"
    short = "crnn"
    frozen_flavours = ("original",)
    fork_train = True  # the fork's make_crnn_layer sets l.train
    convolutional_steps = True

    def parse(self, s, ctx):
        self.read_steps(s, ctx)
        self.activation_name = parse_activation(s, "logistic")
        self.batch_normalize = s.get_int("batch_normalize", 0)
        if self.darknet == "alexeyab":
            hidden, output = s.get_int("hidden", 1), s.get_int("output", 1)
            size, stride = s.get_int("size", 3), s.get_int("stride", 1)
            dilation, groups = s.get_int("dilation", 1), s.get_int("groups", 1)
            padding = s.get_int("padding", 0)
            if s.get_int("pad", 0):
                padding = size // 2
            refuse_options(s, "xnor")
        else:
            hidden, output = s.get_int("hidden_filters", 1), s.get_int("output_filters", 1)
            size, stride, dilation, groups, padding = 3, 1, 1, 1, 1
        self.shortcut = s.get_int("shortcut", 0)
        if self.c < 1 or self.h < 1 or self.w < 1:
            raise s.error("[crnn] needs an image-shaped input (width, height, channels)")

        def conv(filters):
            return inner_section(
                s,
                "convolutional",
                filters=filters,
                size=size,
                stride=stride,
                padding=padding,
                dilation=dilation,
                groups=groups,
                activation=self.activation_name,
                batch_normalize=self.batch_normalize,
            )

        # The original's parse_crnn hands make_crnn_layer (w, h) where it takes (h, w): its
        # convolutions see the image transposed (the same for square inputs), and so does
        # the layer after it.
        h, w = (self.h, self.w) if self.darknet == "alexeyab" else (self.w, self.h)
        first = self.make_inner("input_layer", ctx, conv(hidden), self.c, h, w, self.inputs)
        state = first.layer
        self.inner = [
            first,
            self.make_inner(
                "self_layer", ctx, conv(hidden), hidden, state.out_h, state.out_w, state.outputs
            ),
            self.make_inner(
                "output_layer", ctx, conv(output), hidden, state.out_h, state.out_w, state.outputs
            ),
        ]
        if self.inner[1].layer.outputs != state.outputs:
            raise s.error(
                f"the state ({state.out_w}x{state.out_h}x{hidden}) must keep its "
                f"size through the self convolution: use stride=1 and pad=1",
                "stride",
            )
        self.hidden = state.outputs  # floats of state per image
        last = self.inner[2].layer
        self.out_c, self.out_h, self.out_w = last.out_c, last.out_h, last.out_w
        self.outputs = last.outputs
        self.workspace_size = max(i.layer.workspace_size for i in self.inner)
