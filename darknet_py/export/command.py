"""What `darknet-py export` does, and the --engine option of the inference commands.
cli.py registers them (export_options, run_export, engine_option)."""

import os

import click
import numpy as np

from ..files import atomic_output, refuse_overwrite
from . import ExportError, require
from .engine import ENGINES, QUIET_KEY, load_with_engine  # noqa: F401  (cli's)
from .model import DEFAULT_OPSET, PRECISIONS

EXPORT_HELP = """Write CFG with WEIGHTS as an ONNX model (OUT, default: the weights' name
with .onnx, in the current directory), then check it: ONNX Runtime and darknet-py's own
forward on a random input (and on --image) must agree; the largest difference is printed.

The model takes `input` [B, C, H, W] (RGB, 0..1, the image letterboxed or resized as
`detect` does: metadata `letterbox`) and gives the raw outputs as predict() returns them:
one per detection head (`yolo_16`, ...), else `output`. --decode adds `boxes` [B, N, 4]
(centre x, y, width, height relative to the network input) and `scores` [B, N, classes]
for [yolo]/[region] heads; --nms adds `selected` [K, 3] (image, class, box) from ONNX's
NonMaxSuppression. Class names (--names/--data), input size, letterbox and the Darknet
flavour go into the model's metadata. Needs onnx and onnxruntime (installed with
darknet-py). An existing OUT is kept unless --overwrite."""


def export_options(command):
    """The arguments and options of `export` (cli adds --names/--data and --darknet)."""
    options = [
        click.argument("cfg"),
        click.argument("weights"),
        click.argument("out", required=False),
        click.option(
            "--opset",
            type=click.IntRange(min=1),
            default=DEFAULT_OPSET,
            show_default=True,
            help="ONNX opset to write.",
        ),
        click.option(
            "--batch",
            type=click.IntRange(min=1),
            default=None,
            metavar="N",
            help="A fixed batch of N images [default: 1].",
        ),
        click.option(
            "--dynamic-batch", is_flag=True, help="A batch dimension of any size (`batch`)."
        ),
        click.option(
            "--precision",
            type=click.Choice(list(PRECISIONS)),
            default="fp32",
            show_default=True,
            help="Weights and arithmetic inside the model; inputs and outputs stay float32.",
        ),
        click.option("--decode", is_flag=True, help="Add boxes and scores outputs."),
        click.option("--nms", is_flag=True, help="Add NonMaxSuppression (implies --decode)."),
        click.option(
            "--thresh",
            type=click.FloatRange(0, 1),
            default=0.5,
            show_default=True,
            help="--nms: the score a box needs.",
        ),
        click.option(
            "--nms-thresh",
            type=click.FloatRange(0, 1),
            default=0.45,
            show_default=True,
            help="--nms: the IoU above which a box is dropped.",
        ),
        click.option(
            "--image",
            metavar="IMAGE",
            default=None,
            help="Also check on this image (letterboxed or resized as detect does).",
        ),
        click.option("--no-check", is_flag=True, help="Skip the check in ONNX Runtime."),
        click.option("--overwrite", is_flag=True, help="Replace OUT if it exists."),
    ]
    for option in reversed(options):
        command = option(command)
    return command


def run_export(
    cfg,
    weights,
    out,
    opset,
    batch,
    dynamic_batch,
    precision,
    decode,
    nms,
    thresh,
    nms_thresh,
    image,
    no_check,
    overwrite,
    names,
    darknet,
    log,
):
    from ..network import load_network
    from .model import export_model

    if batch is not None and dynamic_batch:
        raise click.UsageError("give --batch N or --dynamic-batch, not both")
    out = out or os.path.splitext(os.path.basename(weights))[0] + ".onnx"
    refuse_overwrite([out], overwrite)
    onnx = require("onnx")
    if not no_check:
        require("onnxruntime")
    net = load_network(cfg, weights, batch=1, device="cpu", darknet=darknet, engine="numpy")
    sized = network_image(net, image) if image is not None and not no_check else None
    model = export_model(
        net,
        opset=opset,
        batch=None if dynamic_batch else (batch or 1),
        precision=precision,
        decode=decode or nms,
        nms=nms,
        names=names,
        thresh=thresh,
        nms_thresh=nms_thresh,
    )
    data = model.SerializeToString()
    with atomic_output(out) as tmp, open(tmp, "wb") as f:
        f.write(data)
    outputs = ", ".join(o.name for o in model.graph.output)
    log(
        f"{out}: {len(data) / 2**20:.1f} MiB, opset {opset}, {precision}, input "
        f"[{'batch' if dynamic_batch else batch or 1}, {', '.join(map(str, net.input_shape))}]"
        f", outputs {outputs}"
    )
    if not no_check:
        onnx.checker.check_model(model)
        check_export(net, data, 2 if dynamic_batch else batch or 1, precision, image, sized, log)


def check_export(net, data, batch, precision, image, sized, log):
    """Run the written model and darknet-py's forward on the same inputs (a random one, and
    `sized`, the image at `image` as the network takes it); fp32 must agree within
    CHECK_TOLERANCE (else an error), fp16's difference is reported."""
    from .check import CHECK_TOLERANCE, compare, session

    log(
        "check: running the model in ONNX Runtime and darknet-py's forward (--no-check "
        "skips this) ..."
    )
    sess = session(data)
    inputs = [
        (
            "a random input",
            np.random.default_rng(0).random((batch,) + net.input_shape, dtype=np.float32),
        )
    ]
    if image is not None:
        inputs.append((image, np.repeat(sized[None], batch, axis=0)))
    for what, x in inputs:
        diffs = compare(net, sess, x)
        worst = max(diffs, key=diffs.get)
        log(
            f"check: ONNX Runtime against darknet-py's forward on {what}: largest relative "
            f"difference {diffs[worst]:.2e} ({worst})"
        )
        if precision == "fp32" and not diffs[worst] < CHECK_TOLERANCE:
            raise ExportError(
                f"the exported model differs from darknet-py's forward by "
                f"{diffs[worst]:.2e} (over {CHECK_TOLERANCE:g}) on {what}"
            )


def network_image(net, path):
    """The image as detect() feeds it to the network."""
    from ..image import letterbox, resize_image
    from ..predictions import as_image
    from .model import letterboxed

    channels, neth, netw = net.input_shape
    img = as_image(path, channels)
    return (letterbox if letterboxed(net) else resize_image)(img, netw, neth)


def engine_option(command, default="auto", quiet_option=True):
    """Add --engine auto|numpy|onnxruntime (the command receives `engine`) and --quiet (no
    note saying which engine runs; load_with_engine reads it from click's context).
    quiet_option=False for a command with its own --quiet (that one silences the note)."""

    def quiet(ctx, param, value):
        ctx.meta[QUIET_KEY] = value

    if quiet_option:
        command = click.option(
            "--quiet",
            is_flag=True,
            expose_value=False,
            callback=quiet,
            help="No note saying which engine runs the inference.",
        )(command)
    return click.option(
        "--engine",
        type=click.Choice(list(ENGINES)),
        default=default,
        show_default=True,
        help="Where inference runs on the CPU: onnxruntime (the network exported once, "
        "checked against NumPy and cached in ~/.cache/darknet-py/onnx; faster), numpy "
        "(Darknet's exact arithmetic), or auto: onnxruntime when it is installed and "
        "the network exports, else numpy. A GPU runs darknet-py's own backend.",
    )(command)
