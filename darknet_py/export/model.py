"""export_model: a darknet-py network as an ONNX ModelProto.

Inputs and outputs: `input` [B, C, H, W] float32 in [0, 1] (the image as predict takes
it); one output per detection head, named `<type>_<index>` (its activated output, as
predict leaves it), or `output` for any other network (predict's result); with decode
also `boxes` and `scores`, with nms `selected` (heads.py). B is the batch given, or the
symbolic `batch` with dynamic_batch. fp16 keeps float32 inputs and outputs and casts
inside, so callers feed and read the same arrays."""

import json

import numpy as np

from ..layers.heads import is_fork_flavour
from ..predictions import DETECTOR_TYPES, nms_kind, output_layer
from . import ExportError, require

# The graph builder, the layers' and the heads' exporters are imported on the first export
# (export_model): every darknet-py command imports this module, a cached export needs none.

DEFAULT_OPSET = 17
MIN_OPSET = 13  # ReduceSum's axes input, Resize's and Split's current forms
PRECISIONS = {"fp32": np.float32, "fp16": np.float16}


def output_layers(net):
    """[(name, layer)] of the raw outputs: every detection head, else predict's layer."""
    heads = [l for l in net.layers if l.type in DETECTOR_TYPES]
    if heads:
        return [(f"{l.type.lower()}_{l.index}", l) for l in heads]
    return [("output", output_layer(net))]


def letterboxed(net):
    """Whether detect() letterboxes this network's input (else it resizes plainly)."""
    heads = [l for l in net.layers if l.type in DETECTOR_TYPES]
    if heads and heads[-1].type == "detection":
        return False
    if is_fork_flavour(net):
        return bool(getattr(net.options, "letter_box", 0))
    return True


def check_exportable(net):
    """Refuse, before anything is built, a layer no function is registered for (the
    recurrent layers, which carry state from call to call, among them)."""
    from .layers import EXPORTERS

    for layer in net.layers:
        if type(layer) not in EXPORTERS:
            raise ExportError(
                f"layer {layer.index} [{layer.type}]: ONNX export does not cover this layer type"
            )
    if len(net.input_shape) != 3:
        raise ExportError(
            "ONNX export takes image networks ([net] width, height, channels); "
            "this one reads rows of [net] inputs"
        )


def build_layers(g, net, x):
    """Every layer's function in order."""
    from .layers import EXPORTERS

    for layer in net.layers:
        y = EXPORTERS[type(layer)](g, layer, x)
        y = g.reshape(y, layer.output_shape(1)[1:])
        g.outputs[layer.index] = y
        x = y


def export_model(
    net,
    opset=DEFAULT_OPSET,
    batch=1,
    precision="fp32",
    decode=False,
    nms=False,
    names=None,
    thresh=0.5,
    nms_thresh=0.45,
    winograd=None,
):
    """The network as an onnx.ModelProto. batch: an int, or None for a dynamic batch.
    winograd: None, plain Conv (what `darknet-py export` writes); "auto", 3x3 stride-1
    convolutions as Winograd F(4x4, 3x3) where that pays on the CPU (the CPU engine's
    graph, winograd.py); "all", every such convolution (tests)."""
    from .builder import GraphBuilder
    from .heads import add_nms, decode_heads

    onnx = require("onnx")
    if opset < MIN_OPSET or opset > onnx.defs.onnx_opset_version():
        raise ExportError(f"--opset {opset}: use {MIN_OPSET}..{onnx.defs.onnx_opset_version()}")
    if precision not in PRECISIONS:
        raise ExportError(f"unknown precision '{precision}' (known: {', '.join(PRECISIONS)})")
    check_exportable(net)
    g = GraphBuilder(onnx, opset, PRECISIONS[precision])
    g.net = net
    g.winograd = winograd
    g.host = lambda arr: np.asarray(net.be.to_host(arr), dtype=np.float32)
    c, h, w = net.input_shape
    x = "input"
    g.shapes[x] = (c, h, w)
    if precision != "fp32":
        x = g.op("Cast", [x], (c, h, w), to=onnx.helper.np_dtype_to_tensor_dtype(g.dtype))
    build_layers(g, net, x)
    outputs = [(name, g.outputs[layer.index]) for name, layer in output_layers(net)]
    if decode or nms:
        heads = [l for l in net.layers if l.type in DETECTOR_TYPES]
        if not heads:
            raise ExportError("--decode and --nms need a detector ([yolo] or [region] layers)")
        boxes, scores = decode_heads(g, net, heads)
        outputs += [("boxes", boxes), ("scores", scores)]
        if nms:
            kind, _ = nms_kind(net)
            outputs.append(("selected", add_nms(g, boxes, scores, kind, nms_thresh, thresh)))
    return _model(
        g,
        net,
        outputs,
        batch,
        opset,
        _metadata(net, names, precision, decode, nms, thresh, nms_thresh),
    )


def _model(g, net, outputs, batch, opset, metadata):
    onnx, helper = g.onnx, g.onnx.helper
    dim = batch if batch is not None else "batch"
    float_type = onnx.TensorProto.FLOAT
    graph_outputs = []
    for name, tensor in outputs:
        if name == "selected":
            g.op("Identity", [tensor], None, hint=name)
            g.nodes[-1].output[0] = name
            graph_outputs.append(
                helper.make_tensor_value_info(name, onnx.TensorProto.INT64, [None, 3])
            )
            continue
        shape = g.shapes[tensor]
        to = [tensor] if g.dtype == np.float32 else [g.op("Cast", [tensor], shape, to=float_type)]
        g.op("Identity", to, shape)
        g.nodes[-1].output[0] = name
        graph_outputs.append(helper.make_tensor_value_info(name, float_type, [dim, *shape]))
    # Filled in place (helper.make_graph and make_model would copy the weights twice).
    model = g.model
    graph = model.graph
    graph.name = "darknet"
    graph.node.extend(g.nodes)
    graph.input.append(helper.make_tensor_value_info("input", float_type, [dim, *net.input_shape]))
    graph.output.extend(graph_outputs)
    opsets = [helper.make_opsetid("", opset)]
    model.opset_import.extend(opsets)
    model.producer_name = "darknet-py"
    # The oldest IR version the opset allows, so older runtimes read the file too.
    model.ir_version = max(7, helper.find_min_ir_version_for(opsets))
    helper.set_model_props(model, metadata)
    return model


def _metadata(net, names, precision, decode, nms, thresh, nms_thresh):
    c, h, w = net.input_shape
    meta = {
        "darknet": net.darknet,
        "input_width": str(w),
        "input_height": str(h),
        "input_channels": str(c),
        "input_range": "0..1, RGB, CHW",
        "letterbox": str(letterboxed(net)).lower(),
        "precision": precision,
        "cfg": str(net.path),
    }
    if names is not None:
        meta["names"] = json.dumps(list(names))
    if decode or nms:
        meta["boxes"] = (
            "centre x, centre y, width, height relative to the network input; "
            "undo the letterbox (when letterbox is true) to map them to the image"
        )
    if nms:
        meta.update(
            nms_iou_threshold=str(nms_thresh),
            score_threshold=str(thresh),
            nms_kind=nms_kind(net)[0],
        )
    return meta
