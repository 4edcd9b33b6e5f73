"""The inference forward of layers whose output the layout plan keeps NHWC at 16 bits
(layout_plan.py, issue 42): convolutions through the backend's conv_nhwc_forward, and
[route], [maxpool], [upsample], [shortcut] through the NHWC ops (ops/nhwc/).

A layer's NHWC tensor is (layer.nhwc_output, layout.pitch, layout.offset): the owner's
16-bit array (its own, or the [route]'s it is written into), pixel pitch and first
channel. Where a reader needs NCHW (layout.boundary) the forward ends by converting into
layer.output, an fp32 NCHW array; a convolution whose input is NCHW converts it first
(layout.input_boundary) into layer.nhwc_input.
"""

import numpy as np

from .. import precision as precisions
from ..ops.nhwc.numpy import pixel_pitch


def is_nhwc(layer):
    """Whether the layout plan keeps this layer's output NHWC."""
    layout = getattr(layer, "layout", None)
    return layout is not None and layout.nhwc


def tensor(layer):
    """(array, pitch, offset) of an NHWC layer's output."""
    return layer.nhwc_output, layer.layout.pitch, layer.layout.offset


def finish(layer, be):
    """The NCHW fp32 copy of the output for readers that are not NHWC (layout.boundary)."""
    if layer.layout.boundary:
        array, pitch, offset = tensor(layer)
        be.nhwc_to_nchw(
            array, layer.batch, layer.out_c, layer.out_h, layer.out_w, pitch, offset, layer.output
        )


def _previous(layer, net):
    return net.layers[layer.index - 1]


# ---- convolution ----------------------------------------------------------------------


def nhwc_weights(layer, be, weights):
    """The convolution's weights as conv_nhwc_forward takes them: 16-bit [cout, k, k, cx]
    (cx: the input's pixel pitch, the padding channels' weights zero), made once per set
    of inference weights (cached until params_changed): by the backend's
    pack_nhwc_weights, which comes with its conv_nhwc_forward, else here on the host."""
    cached = getattr(layer, "_nhwc_weights", None)
    if cached is not None and cached[0] is weights:
        return cached[1]
    k, c, cout = layer.size, layer.c, layer.filters
    cx = pixel_pitch(c)
    pack = getattr(be, "pack_nhwc_weights", None)
    if pack is not None:
        array = pack(weights, cout, c, k, cx, layer.precision)
    else:
        host = np.asarray(be.to_host(weights), np.float32)[: cout * c * k * k]
        packed = np.zeros((cout, k, k, cx), np.float32)
        packed[..., :c] = host.reshape(cout, c, k, k).transpose(0, 2, 3, 1)
        array = be.storage_zeros(packed.size, layer.precision)
        be.copy_rounded(be.from_host(packed.reshape(-1)), array, layer.precision)
    layer._nhwc_weights = (weights, array)
    return array


def convolution_input(layer, net):
    """(array, pitch) of the convolution's dense NHWC input: the previous layer's tensor,
    or net.input (NCHW) converted into layer.nhwc_input."""
    be = net.be
    if layer.layout.input_boundary:
        pitch = pixel_pitch(layer.c)
        if not getattr(layer, "nhwc_input_ready", False):
            be.nhwc_from_nchw(
                net.input, layer.batch, layer.c, layer.h, layer.w, layer.nhwc_input, pitch, 0
            )
        layer.nhwc_input_ready = False  # an input written ahead (letterbox) serves once
        return layer.nhwc_input, pitch
    array, pitch, offset = tensor(_previous(layer, net))
    if offset or pitch != pixel_pitch(layer.c):
        raise AssertionError(
            f"layer {layer.index}: an NHWC convolution reads a dense input (the layout plan "
            f"gave pitch {pitch}, offset {offset})"
        )
    return array, pitch


def convolution_forward(layer, net):
    """The one place an NHWC convolution runs: conv_nhwc_forward with batch norm folded
    into the weights and bias, the activation in its epilogue."""
    be = net.be
    x, cx = convolution_input(layer, net)
    weights, biases = layer.inference_params(be)
    out, pitch, offset = tensor(layer)
    be.conv_nhwc_forward(
        layer.precision,
        x,
        layer.batch,
        layer.h,
        layer.w,
        cx,
        nhwc_weights(layer, be, weights),
        layer.filters,
        layer.size,
        layer.stride,
        layer.padding,
        out,
        pitch,
        offset,
        bias=biases,
        activation=layer.activation,
        stats=None,
    )
    finish(layer, be)


# ---- the movers -----------------------------------------------------------------------


def maxpool_forward(layer, net):
    x, x_pitch, x_offset = tensor(_previous(layer, net))
    out, pitch, offset = tensor(layer)
    net.be.nhwc_maxpool(
        x,
        layer.batch,
        layer.c,
        layer.h,
        layer.w,
        x_pitch,
        x_offset,
        layer.size,
        layer.stride_x,
        layer.stride_y,
        layer.padding,
        out,
        pitch,
        offset,
    )
    finish(layer, net.be)


def upsample_forward(layer, net):
    x, x_pitch, x_offset = tensor(_previous(layer, net))
    out, pitch, offset = tensor(layer)
    net.be.nhwc_upsample(
        x,
        layer.batch,
        layer.c,
        layer.h,
        layer.w,
        x_pitch,
        x_offset,
        layer.stride,
        layer.scale,
        out,
        pitch,
        offset,
    )
    finish(layer, net.be)


def route_forward(layer, net):
    """Each input's part copied into its slice, except where its writer wrote it there
    already (layout_plan: written in place); a viewing route is its input's tensor."""
    if layer.views_its_input():
        return
    out, pitch, offset = tensor(layer)
    spatial = layer.out_h * layer.out_w
    for src, start, part, at in layer._parts():  # floats per image
        channels, first, at = part // spatial, start // spatial, at // spatial
        array, src_pitch, src_offset = tensor(src)
        if array is out and src_offset + first == offset + at and src_pitch == pitch:
            continue  # written in place
        net.be.nhwc_copy_channels(
            array,
            layer.batch,
            channels,
            layer.out_h,
            layer.out_w,
            src_pitch,
            src_offset + first,
            out,
            pitch,
            offset + at,
        )
    finish(layer, net.be)


def shortcut_forward(layer, net):
    """out = activation(alpha * input + beta * from) (the fork: input + each from, rounded
    after each sum, the activation with the last), on the channels they share."""
    be = net.be
    x, x_pitch, x_offset = tensor(_previous(layer, net))
    out, pitch, offset = tensor(layer)
    original = layer.darknet != "alexeyab"
    s1, s2 = (layer.alpha, layer.beta) if original else (1.0, 1.0)
    for k, src in enumerate(layer.sources):
        add, add_pitch, add_offset = tensor(src)
        last = k == len(layer.sources) - 1
        be.nhwc_shortcut(
            x,
            x_pitch,
            x_offset,
            add,
            src.out_c,
            add_pitch,
            add_offset,
            layer.batch,
            layer.c,
            layer.h,
            layer.w,
            s1,
            s2,
            layer.activation if last else "linear",
            out,
            pitch,
            offset,
        )
        x, x_pitch, x_offset = out, pitch, offset
    finish(layer, be)


FORWARDS = {
    "convolutional": convolution_forward,
    "maxpool": maxpool_forward,
    "upsample": upsample_forward,
    "route": route_forward,
    "shortcut": shortcut_forward,
}


def forward(layer, net):
    """The NHWC forward of `layer` (is_nhwc): inference only."""
    if net.train:
        raise AssertionError(f"layer {layer.index}: the NHWC layout serves inference only")
    FORWARDS[layer.type](layer, net)


# ---- arrays ---------------------------------------------------------------------------


def give_nhwc_arrays(layers, be, batch, precision):
    """Make every NHWC tensor's owner array (16-bit, batch x pixels x pitch) and point
    each NHWC layer at its owner's (nhwc_output); a convolution converting its NCHW input
    gets nhwc_input. Layers not NHWC get None. Returns {owner index: array}."""
    stored = precisions.storage(precision)
    arrays = {}
    for layer in layers:
        layer.nhwc_output = layer.nhwc_input = None
        if not is_nhwc(layer):
            continue
        owner = layers[layer.layout.owner]
        if owner.index not in arrays:
            pixels = batch * owner.out_h * owner.out_w
            arrays[owner.index] = be.storage_zeros(pixels * layer.layout.pitch, stored)
        layer.nhwc_output = arrays[owner.index]
        if layer.type == "convolutional" and layer.layout.input_boundary:
            layer.nhwc_input = be.storage_zeros(
                batch * layer.h * layer.w * pixel_pitch(layer.c), stored
            )
    return arrays
