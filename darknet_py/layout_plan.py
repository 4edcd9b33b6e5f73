"""Which layer outputs are kept channels-last (NHWC) at 16 bits (issue 42), and where.

Under fp16/bf16 on CUDA the activations between layers can live as NHWC 16-bit tensors
(ops/nhwc/), so that a convolution runs as an implicit GEMM (conv_nhwc_forward) with no
unfolding. This plan decides each layer output's layout, beside output_storage.py's
storage decision, and is asked for: Network.nhwc, default the environment's DARKNET_NHWC
(off), and only for inference for now. Off, and in every fp32/tf32 network, on NumPy and
in training, every output is NCHW and nothing changes.

A layer's output is NHWC ("nhwc") when the layer can write it so:
  * a convolution at the network's 16-bit precision that conv_nhwc_forward can run: one
    group, no dilation, stride 1 or 2 (across and down alike), not binary/xnor nor
    stepped, an activation its epilogue applies (precision.EPILOGUE_ACTIVATIONS), batch
    norm folded or none. Its input may be NCHW (the network's image, an fp32 layer's
    output): it is converted at its input.
    A convolution feeding a head runs at fp32 (precision.assign), so it stays NCHW and its
    input is converted for it: the heads' boundary;
  * a [route], a 2-D [maxpool], an [upsample] (not reverse) and a [shortcut] without the
    fork's weights (and of its input's width and height) whose every input is NHWC.
A reader that is not NHWC reads an NCHW fp32 copy made right after the writer's forward
(Layout.boundary); so does the network's output, and layer_output converts any other.

Each NHWC tensor has a pixel pitch (its channels rounded up to 8: 16-byte pixels, padding
channels zero) and lives in an owner's array at a channel offset: its own at 0, or a
[route]'s concatenation, into which its writer then writes in place (the route copies
nothing for it). A route's input S is written in place when
  * S is NHWC, writes its whole output (the route has no groups), owns its array (not a
    viewing route) and is not placed in another route already;
  * its slice starts on a multiple of 8 channels and holds a multiple of 8 (or is the
    route's last): its writer's zeros up to the next multiple of 8 touch no other slice;
  * every other reader of S reads it at any pitch and offset: the NHWC [route]s,
    [maxpool]s, [upsample]s and [shortcut]s, and the NCHW readers (the conversion does),
    but not a convolution (conv_nhwc_forward reads a dense input: offset 0, its own pitch).
Routes placed in routes compose (the offsets add up, the outer route's pitch).
"""

import os
from dataclasses import dataclass

from . import precision as precisions
from .activations import CHANNEL_ACTIVATIONS
from .layers.base import keeps_activation_input
from .layers.nhwc_forward import tensor
from .net_options import NetworkError
from .ops.nhwc.numpy import PIXEL_ALIGN, pixel_pitch
from .output_plan import array_owner, readers
from .output_storage import input_layers

NCHW, NHWC = "nchw", "nhwc"
ENV = "DARKNET_NHWC"
# Layer types that write an NHWC output at any pitch and offset (into a [route]'s slice).
SLICE_WRITERS = ("convolutional", "route", "maxpool", "upsample", "shortcut")


@dataclass(frozen=True)
class Layout:
    """One layer output's layout. NHWC: the tensor's channel ch of pixel p is element
    p * pitch + offset + ch of layer `owner`'s 16-bit array."""

    layout: str = NCHW
    pitch: int = 0  # channels a pixel takes in the owner's array (a multiple of 8)
    owner: int = -1  # the layer whose array holds it: itself, or the [route] it is placed in
    offset: int = 0  # its first channel among the owner's
    boundary: bool = False  # an NCHW fp32 copy is made after its forward (a reader needs it)
    input_boundary: bool = False  # a convolution converting its NCHW input to NHWC

    @property
    def nhwc(self):
        return self.layout == NHWC


def nhwc_from_environment():
    """Whether DARKNET_NHWC asks for NHWC outputs: 1/on/yes/true, or 0/off/no/false (or
    unset); NetworkError naming the variable for anything else."""
    value = os.environ.get(ENV, "").strip()
    if value.lower() in ("1", "on", "yes", "true"):
        return True
    if value.lower() in ("", "0", "off", "no", "false"):
        return False
    raise NetworkError(f"{ENV}={value}: use 1 (NHWC layer outputs under fp16/bf16) or 0")


def _convolution_runs_nhwc(layer, precision, fold_batchnorm):
    """Whether conv_nhwc_forward can run this convolution (see the module's docstring)."""
    return (
        layer.precision == precision
        and not layer.stepped
        and layer.groups == 1
        and layer.dilation == 1
        and layer.stride in (1, 2)  # one stride (not the fork's pair), as the kernel takes
        and not getattr(layer, "binary", 0)
        and not getattr(layer, "xnor", 0)
        and layer.activation in precisions.EPILOGUE_ACTIVATIONS
        and layer.activation not in CHANNEL_ACTIVATIONS
        and not keeps_activation_input(layer)
        and (fold_batchnorm or not layer.batch_normalize)
    )


def _mover_writes_nhwc(layer):
    """Whether a [route]/[maxpool]/[upsample]/[shortcut] has an NHWC op (inputs aside)."""
    if layer.stepped:
        return False
    if layer.type == "route":
        return True
    if layer.type == "maxpool":
        return not layer.depth
    if layer.type == "upsample":
        return not layer.reverse
    if layer.type == "shortcut":
        if getattr(layer, "weights_type", "none") != "none":
            return False
        if layer.activation in CHANNEL_ACTIVATIONS:
            return False
        return all((s.out_w, s.out_h) == (layer.w, layer.h) for s in layer.sources)
    return False


def _reads_any_slice(reader, nhwc):
    """Whether `reader` reads its input at any pitch and offset (see the docstring)."""
    if reader.index not in nhwc:
        return True  # through the NCHW copy
    return reader.type != "convolutional"


def plan_layouts(layers, output_index, precision, train, fold_batchnorm=True, on=False):
    """Each layer output's Layout, a list by layer index (see the module's docstring)."""
    plain = [Layout() for _ in layers]
    if not on or train or precision not in precisions.HALF_STORAGE:
        return plain
    nhwc = set()
    for layer in layers:
        if layer.type == "convolutional":
            if _convolution_runs_nhwc(layer, precision, fold_batchnorm):
                nhwc.add(layer.index)
        elif layer.type in ("route", "maxpool", "upsample", "shortcut"):
            if _mover_writes_nhwc(layer):
                nhwc.add(layer.index)
    dropped = True  # a mover whose inputs are not all NHWC writes NCHW
    while dropped:
        dropped = False
        for i in sorted(nhwc):
            layer = layers[i]
            if layer.type == "convolutional":
                continue
            sources = input_layers(layer, layers)
            if sources is None or not all(array_owner(s).index in nhwc for s in sources):
                nhwc.discard(i)
                dropped = True

    read_by = readers(layers)
    network_output = array_owner(layers[output_index]).index
    placed = {}  # layer -> (route, offset): written in place into the route's array
    for route in layers:
        if route.index not in nhwc or route.type != "route" or route.views_its_input():
            continue
        if route.groups != 1:
            continue
        offset = 0
        last = route.sources[-1]
        for src in route.sources:
            if _writes_in_place(src, route, offset, last, nhwc, placed, read_by, layers):
                placed[src.index] = (route.index, offset)
            offset += src.out_c

    def where(i):
        """(owner, pitch, offset) of NHWC layer i, through routes placed in routes."""
        owner, offset = i, 0
        while owner in placed:
            owner, more = placed[owner]
            offset += more
        return owner, pixel_pitch(layers[owner].out_c), offset

    plan = []
    for layer in layers:
        i = layer.index
        if i not in nhwc:
            plan.append(Layout())
            continue
        source = array_owner(layer).index  # a viewing route is its input's tensor
        owner, pitch, offset = where(source)
        boundary = source == network_output or any(
            r not in nhwc and not layers[r].views_its_input() for r in read_by[source]
        )
        input_boundary = False
        if layer.type == "convolutional":
            inputs = input_layers(layer, layers)
            input_boundary = inputs is None or array_owner(inputs[0]).index not in nhwc
        plan.append(
            Layout(
                NHWC,
                pitch,
                owner,
                offset,
                boundary=boundary and source == i,
                input_boundary=input_boundary,
            )
        )
    return plan


def _writes_in_place(src, route, offset, last, nhwc, placed, read_by, layers):
    """Whether route's input src can write its output into route's array (the docstring's
    rules)."""
    if src.index not in nhwc or src.views_its_input() or src.index in placed:
        return False
    if src.type not in SLICE_WRITERS or src.stepped:
        return False
    if offset % PIXEL_ALIGN or (src.out_c % PIXEL_ALIGN and src is not last):
        return False
    if route.sources.count(src) > 1:
        return False  # one tensor, one place
    others = [r for r in read_by[src.index] if r != route.index]
    return all(_reads_any_slice(layers[r], nhwc) for r in others)


def assign_layouts(layers, output_index, precision, train, fold_batchnorm=True, on=False):
    """Set each layer's `layout` (plan_layouts) and, under NHWC, its output_precision (of
    Layer.output): the 16-bit precision for an NHWC output (its tensor), fp32 for every
    other and for an NHWC layer's NCHW copy (layout.boundary). Returns the plan; with none
    NHWC, output_precision is left as output_storage set it."""
    plan = plan_layouts(layers, output_index, precision, train, fold_batchnorm, on)
    any_nhwc = any(p.nhwc for p in plan)
    for layer, layout in zip(layers, plan):
        layer.layout = layout
        if any_nhwc:
            tensor = layout.nhwc and not layout.boundary
            layer.output_precision = precision if tensor else precisions.DEFAULT
    return plan


def nchw_output(layer, be):
    """An NHWC layer's output as NCHW fp32 on the backend (layer_output): its boundary copy
    where it has one, else converted now."""
    owner = array_owner(layer)
    if owner.layout.boundary:
        return owner.output
    array, pitch, offset = tensor(layer)
    out = be.zeros(layer.batch * layer.outputs)
    be.nhwc_to_nchw(array, layer.batch, layer.out_c, layer.out_h, layer.out_w, pitch, offset, out)
    return out
