"""The darknet-py command line: Darknet's classifier, detector, info and partial commands.

Every command runs inside DarknetGroup.invoke, which turns the errors a user can fix
(errors.USER_ERRORS: a missing file, a cfg error, weights of the wrong size, an unreadable
image, a bad device, each module's DarknetError) into one line on stderr and exit code 2,
and prints their warnings (errors.USER_WARNINGS) one line each. Any other exception is a
bug in darknet-py and keeps its traceback.

Commands that run a network take the shared options from `device_options` and
`names_options` (cli_options.py, with the other shared pieces); new commands (training:
train, valid, anchors) go in the marked section near the end and get the same error
handling by being added to `cli`.
"""

import errno
import functools
import json
import os
import sys
import time
import warnings

import click

from . import __version__
from .cli_options import (
    IMAGE_ARGUMENT_HELP,
    PROG,
    Probability,
    UserError,
    claim_outputs,
    class_name,
    darknet_option,
    device_options,
    expand_images,
    letter_box_option,
    log_line,
    names_options,
    overwrite_option,
    run_on_images,
    same_file,
    warn,
)
from .darknet_forms import DarknetFormError, DarknetFormHelp
from .darknet_forms import translate as translate_darknet_form
from .errors import USER_ERRORS, USER_WARNINGS, describe_error
from .export.command import EXPORT_HELP, engine_option, export_options, load_with_engine, run_export
from .files import atomic_output, first_free_run, run_numbered, write_text_atomically
from .network import DARKNET_FLAVOURS, build_network, load_network
from .plurals import counted
from .predictions import check_names
from .processes import exit_process
from .weights import floats_needed


class DarknetGroup(click.Group):
    def parse_args(self, ctx, args):
        try:  # Darknet's `detector train DATA CFG` and the fork's -flags, in our form
            args, note = translate_darknet_form(args)
        except DarknetFormHelp as e:  # `detector --help`
            click.echo(str(e))
            ctx.exit(0)
        except DarknetFormError as e:
            raise UserError(str(e)) from None
        if note:
            click.echo(f"{PROG}: note: {note}", err=True)
        return super().parse_args(ctx, args)

    def invoke(self, ctx):
        with warnings.catch_warnings():
            # "always": the same cfg read twice in one process must warn twice.
            for category in USER_WARNINGS:
                warnings.simplefilter("always", category)
            python_showwarning = warnings.showwarning

            def show_warning(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, USER_WARNINGS):
                    warn(message)
                elif issubclass(category, RuntimeWarning):  # NumPy's: one line, no source
                    warn(f"{message} ({os.path.basename(filename)}:{lineno})")
                else:
                    python_showwarning(message, category, filename, lineno, file, line)

            warnings.showwarning = show_warning  # catch_warnings restores it
            try:
                return super().invoke(ctx)
            except USER_ERRORS as e:
                # A closed pipe (`darknet-py info x.cfg | head`) is click's to handle.
                if isinstance(e, OSError) and e.errno == errno.EPIPE:
                    raise
                raise UserError(describe_error(e)) from None


@click.group(cls=DarknetGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name=PROG, message="%(prog)s %(version)s")
def cli():
    """Darknet's cfg-driven neural networks in Python.

    Runs Darknet .cfg/.weights files: classify images (test), find objects in images,
    videos or a camera (detect), print a network's layer table (info), cut a weights file
    down to its first layers (partial), train a classifier or detector (train), score
    weights on a dataset (valid) or as the AlexeyAB fork's detector map does (map),
    compute YOLO anchors (anchors), check a dataset's labels (check) and time a network
    (bench).

    Darknet's own forms work too: `detector train|test|demo|valid|map|calc_anchors DATA
    CFG [WEIGHTS] ...` and `classifier train|predict|valid DATA CFG [WEIGHTS] ...`, with the
    AlexeyAB fork's flags (-thresh, -map, -clear, -gpus, -ext_output, -dont_show, ...).

    Commands that write files never replace an existing one unless given --overwrite.
    """


# ---- test: classify -----------------------------------------------------------------------
@cli.command(
    "test",
    help=f"""Classify images with a classifier network.

Prints, per image, the time taken and the --top most probable classes as
"percent%: name", most probable first (Darknet's `classifier predict`).

{IMAGE_ARGUMENT_HELP}""",
)
@click.argument("cfg")
@click.argument("weights")
@click.argument("images", metavar="IMAGE...", nargs=-1, required=True)
@click.option(
    "--top",
    type=click.IntRange(min=1),
    default=None,
    metavar="K",
    help="How many classes to print per image [default: the .data file's top=, else 5].",
)
@names_options
@device_options
@engine_option
@darknet_option
def classify_command(cfg, weights, images, top, names, data, device, engine, darknet):
    refuse_onnx_model(cfg, weights, images, "test")
    if top is None:
        try:
            top = int(data.get("top", 5))
        except ValueError:
            raise UserError(f"top={data['top']} in the --data file is not a whole number") from None
    from .predictions import detector_layers, output_layer

    paths = expand_images(images)
    net = load_with_engine(
        load_network, engine, device, cfg=cfg, weights=weights, batch=1, darknet=darknet
    )
    if detector_layers(net):
        raise UserError(
            f"{cfg}: the network is a detector (it has a "
            f"[{detector_layers(net)[-1].type}] layer); use `{PROG} detect`"
        )
    net.names = names = check_names(names, output_layer(net).outputs, weights, cfg)

    def classify_one(index, path):
        start = time.perf_counter()
        predictions = net.classify(path, top=top)
        seconds = time.perf_counter() - start
        click.echo(f"{path}: Predicted in {seconds:f} seconds.")
        for class_id, prob, _ in predictions:
            click.echo(f"{100 * prob:5.2f}%: {class_name(names, class_id)}")

    if run_on_images(paths, classify_one):
        sys.exit(UserError.exit_code)


# ---- detect ---------------------------------------------------------------------------------
def output_paths(out, images):
    """Where detect writes each image's drawing: see the --out help."""
    if os.path.isdir(out) or out.endswith(("/", os.sep)):
        paths, taken = [], set()
        for index, image in enumerate(images, start=1):
            stem = os.path.splitext(os.path.basename(image))[0]
            path = os.path.join(out, f"{stem}.jpg")
            if path in taken:  # the same file name from two folders
                path = os.path.join(out, f"{stem}_{index}.jpg")
            taken.add(path)
            paths.append(path)
    else:
        stem, ext = os.path.splitext(out)
        ext = ext or ".jpg"  # Darknet's save_image adds .jpg
        if len(images) == 1:
            paths = [stem + ext]
        else:
            paths = [f"{stem}_{index}{ext}" for index in range(1, len(images) + 1)]
    for path, image in zip(paths, images):
        if same_file(path, image):
            raise UserError(f"{path}: --out would overwrite the input image; choose another --out")
    bad = sorted({os.path.splitext(p)[1] for p in paths if not cv2().haveImageWriter(p)})
    if bad:
        raise UserError(
            f"--out {out}: OpenCV cannot write {', '.join(bad)} images (use .jpg or .png)"
        )
    return paths


def cv2():
    import cv2 as opencv  # imported on use: `darknet-py info` and --help stay quick

    return opencv


@cli.command(
    "detect",
    short_help="Find objects in images with a YOLO network.",
    help=f"""\
Find objects in images with a detector network (YOLO).

Prints, per image, the time taken and one line per detected class:
"name: percent%  left=L top=T width=W height=H", the box in pixels of the
original image (a box with several classes above --thresh gets a line for
each, as in Darknet). Writes the image with labelled boxes to --out, and, with
--json, every detection of every image to one JSON file. Existing outputs are
not replaced without --overwrite.

{IMAGE_ARGUMENT_HELP}

A video file (.mp4, .avi, .mov, ...) or --camera N runs as Darknet's `detector
demo` does, without a window: every frame is detected and written with its boxes to
--out (a video; default predictions.mp4; an existing file is not replaced), with a
line per frame (progress, FPS, objects). Ctrl-C stops and finishes the video.""",
)
@click.argument("cfg")
@click.argument("weights")
@click.argument("images", metavar="IMAGE...", nargs=-1)
@click.option(
    "--camera",
    type=click.IntRange(min=0),
    metavar="N",
    default=None,
    help="Detect on camera N's frames until Ctrl-C (instead of IMAGE).",
)
@click.option(
    "--thresh",
    type=Probability(),
    default=None,
    help="Report a class when its probability is above this. [default: .25 for a "
    "network of the AlexeyAB fork's flavour, as its detector test; else .5, "
    "as pjreddie's]",
)
@click.option(
    "--nms",
    type=Probability(),
    default=0.45,
    show_default=True,
    help="Drop a box overlapping a likelier one of its class by more than this "
    "IoU; 0 turns NMS off.",
)
@click.option(
    "--hier-thresh",
    type=Probability(),
    default=0.5,
    show_default=True,
    help="With a class tree ([region] tree=, YOLO9000): walk down the tree while "
    "the class probability stays above this (Darknet's -hier).",
)
@click.option(
    "--out",
    metavar="PATH",
    default=None,
    help="Image with the labelled boxes. For several images, each image's number "
    "goes before the extension: predictions_1.jpg, predictions_2.jpg, ... If "
    "PATH is a directory (or ends with /), each image is written into it under "
    "its own name with .jpg (dog.png -> PATH/dog.jpg). A PATH without an "
    "extension gets .jpg. `--out none` writes no image. [default: "
    "predictions.jpg; when an earlier run's is there, predictions-2.jpg, "
    "predictions-3.jpg, ... (never replaced)]",
)
@click.option(
    "--json",
    "json_file",
    metavar="FILE",
    default=None,
    help="Write the detections of all images (or of every video frame) to FILE as JSON.",
)
@click.option(
    "--json-format",
    type=click.Choice(["darknet-py", "alexeyab"]),
    default="darknet-py",
    show_default=True,
    help="--json's layout for images: darknet-py's, or the AlexeyAB fork's "
    "`detector test -out` file (frame_id, filename, objects with class_id, "
    "name, relative_coordinates, confidence), byte for byte.",
)
@click.option(
    "--save-txt",
    is_flag=True,
    help="Also write each image's detections in YOLO label format beside its "
    "drawing (predictions.jpg -> predictions.txt): \"class x y w h score\" "
    "a line, relative to the image.",
)
@click.option(
    "--darknet-order",
    is_flag=True,
    help="Print detections as the C Darknet does (\"name: percent%\" lines, in its "
    "order: after NMS, not by probability), so logs diff against it.",
)
@click.option(
    "--ext-output",
    is_flag=True,
    help="Print detections as the AlexeyAB fork's -ext_output does, leftmost "
    "first: \"name: 87%  (left_x: L   top_y: T   width: W   height: H)\", "
    "in pixels.",
)
@overwrite_option
@names_options
@device_options
@engine_option
@darknet_option
@letter_box_option
def detect_command(
    cfg,
    weights,
    images,
    camera,
    thresh,
    nms,
    hier_thresh,
    out,
    json_file,
    json_format,
    save_txt,
    darknet_order,
    ext_output,
    overwrite,
    names,
    data,
    device,
    engine,
    darknet,
):
    from . import fork_json
    from .image import decode_image, from_bgr
    from .predictions import default_thresh, detect, detections_to_json, detector_layers
    from .video import is_video

    refuse_onnx_model(cfg, weights, images, "detect")

    if camera is not None or any(is_video(image) for image in images):
        return detect_video(
            cfg,
            weights,
            images,
            camera,
            out,
            json_file,
            json_format,
            dict(thresh=thresh, nms=nms, hier=hier_thresh),
            names,
            device,
            engine,
            overwrite,
            darknet,
        )
    if not images:
        raise UserError("give an IMAGE (or a video file, or --camera N)")
    paths = expand_images(images)
    outputs = detection_outputs(paths, out, save_txt)
    claim_outputs(files_of(outputs) + ([json_file] if json_file else []), overwrite)
    net = load_detector(cfg, weights, engine, device, darknet)
    classes = detector_layers(net)[-1].classes
    net.names = names = check_names(names, classes, weights, cfg)
    thresh = default_thresh(net) if thresh is None else thresh
    results, fork_entries = [], []

    def detect_one(index, path):
        output, txt = outputs[index]
        # Pixel boxes are in the file's own size, even when a huge image is decoded reduced.
        bgr, (width, height) = decode_image(path)
        start = time.perf_counter()
        in_nms_order = detect(
            net, from_bgr(bgr), thresh=thresh, hier=hier_thresh, nms=nms, darknet_order=True
        )
        seconds = time.perf_counter() - start
        # The same stable sort detect() makes without darknet_order.
        dets = in_nms_order if darknet_order else sorted(in_nms_order, key=lambda d: -d.prob)
        click.echo(f"{path}: Predicted in {seconds:f} seconds.")
        print_detections(
            in_nms_order, dets, width, height, names, thresh, ext_output, darknet_order
        )
        write_image_outputs(path, output, txt, bgr, dets, names, classes)
        results.append(
            {
                "image": path,
                "output": output,
                "width": width,
                "height": height,
                "detections": detections_to_json(dets, width, height, names),
            }
        )
        # frame_id counts every path given, as the fork's does, also one that fails to read.
        fork_entries.append(fork_json.image_entry(index + 1, path, in_nms_order, names))

    failed = run_on_images(paths, detect_one)
    if json_file is not None and json_format == "alexeyab":
        write_fork_json(json_file, fork_entries)
    elif json_file is not None:
        write_detections_json(json_file, cfg, weights, thresh, nms, results)
    if failed:
        sys.exit(UserError.exit_code)


def write_image_outputs(path, output, txt, bgr, dets, names, classes):
    """One image's drawing with its boxes and its YOLO .txt, each where one is wanted."""
    from .predictions import draw_detections, yolo_txt

    if output is not None:
        write_image(output, draw_detections(bgr, dets, names, classes=classes))
        click.echo(f"{PROG}: wrote {output} (boxes drawn on {path})", err=True)
    if txt is not None:
        write_text_atomically(txt, yolo_txt(dets))
        click.echo(f"{PROG}: wrote {txt} (detections in {path}, YOLO format)", err=True)


def detect_video(
    cfg,
    weights,
    images,
    camera,
    out,
    json_file,
    json_format,
    thresholds,
    names,
    device,
    engine,
    overwrite,
    darknet,
):
    """`detect` on a video file or a camera: Darknet's `detector demo`, without a window."""
    if engine == "onnxruntime":
        raise UserError("--engine onnxruntime serves images; videos run on --engine numpy")
    from .video import detect_video_command

    if json_format != "darknet-py":
        raise UserError(
            "--json-format alexeyab is for images; a video's --json is darknet-py's layout"
        )
    return detect_video_command(
        cfg,
        weights,
        images,
        camera,
        out,
        json_file,
        thresholds,
        names,
        device,
        overwrite,
        darknet,
    )


def detection_outputs(paths, out, save_txt):
    """Per image: (its drawing or None, its YOLO .txt or None). Our default names go past
    an earlier run's files; a name the user gave is used as given."""
    drawn = out is None or out.lower() != "none"
    numbered = out is None or not drawn

    def run_outputs(run):
        base = run_numbered("predictions.jpg", run) if numbered else out
        return [
            (p if drawn else None, os.path.splitext(p)[0] + ".txt" if save_txt else None)
            for p in output_paths(base, paths)
        ]

    return first_free_run(run_outputs, files_of) if numbered else run_outputs(1)


def load_detector(cfg, weights, engine, device, darknet):
    """The network for `detect`, refused unless it ends in a detection layer."""
    from .predictions import detector_layers

    net = load_with_engine(
        load_network, engine, device, cfg=cfg, weights=weights, batch=1, darknet=darknet
    )
    if not detector_layers(net):
        raise UserError(
            f"{cfg}: the network has no [yolo], [region] or [detection] layer; "
            f"classify with `{PROG} test`"
        )
    return net


def print_detections(in_nms_order, dets, width, height, names, thresh, ext_output, darknet_order):
    """One image's detections on stdout, in the layout the options chose."""
    from .predictions import detection_classes, ext_output_lines, pixel_box

    if ext_output:
        for line in ext_output_lines(in_nms_order, width, height, names, thresh):
            click.echo(line)
        return
    for det in dets:
        left, top, right, bottom = pixel_box(det.box, width, height)
        # Like Darknet's draw_detections: a line for every class above thresh.
        for class_id, prob in detection_classes(det):
            if darknet_order:
                click.echo(f"{class_name(names, class_id)}: {100 * prob:.0f}%")
            else:
                click.echo(
                    f"{class_name(names, class_id)}: {100 * prob:.0f}%  "
                    f"left={left} top={top} width={right - left} "
                    f"height={bottom - top}"
                )


def write_fork_json(json_file, fork_entries):
    """--json-format alexeyab: the fork's `detector test -out` file."""
    from . import fork_json

    write_text_atomically(json_file, fork_json.results_file(fork_entries))
    click.echo(
        f"{PROG}: wrote {json_file} (the fork's layout, {len(fork_entries)} image"
        f"{'s' if len(fork_entries) != 1 else ''})",
        err=True,
    )


def write_detections_json(json_file, cfg, weights, thresh, nms, results):
    """--json: every image's detections, in darknet-py's layout."""
    with atomic_output(json_file) as tmp, open(tmp, "w", encoding="utf-8") as json_out:
        json.dump(
            {"cfg": cfg, "weights": weights, "thresh": thresh, "nms": nms, "images": results},
            json_out,
            indent=1,
        )
        json_out.write("\n")
    click.echo(
        f"{PROG}: wrote {json_file} (detections of {len(results)} image"
        f"{'s' if len(results) != 1 else ''})",
        err=True,
    )


def refuse_onnx_model(cfg, weights, images, command):
    """`detect model.onnx IMAGE`: an .onnx file is not a cfg. One line with the command
    that runs the network on ONNX Runtime (from its cfg and weights; the engine exports
    and checks its own model)."""
    if cfg.lower().endswith(".onnx"):
        given = list(images) if weights.lower().endswith(".weights") else [weights, *images]
        image = " ".join(given) or "IMAGE"
        raise UserError(
            f"{cfg}: an ONNX model is not a cfg; ONNX Runtime runs the network "
            f"from the cfg and weights it was exported from: `{PROG} {command} "
            f"CFG WEIGHTS {image} --engine onnxruntime`"
        )


def files_of(outputs):
    return [p for pair in outputs for p in pair if p is not None]


def write_image(path, image):
    """Write an OpenCV image atomically (a failed write leaves no half image behind)."""
    with atomic_output(path) as tmp:
        if not cv2().imwrite(tmp, image):
            raise UserError(f"{path}: cannot write the image")


# ---- info -----------------------------------------------------------------------------------
@cli.command("info")
@click.argument("cfg")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Images per forward pass, for the memory estimate [default: 1].",
)
@darknet_option
def info_command(cfg, batch, darknet):
    """Print a network's layer table and its total BFLOPs.

    Works out every layer's shape from CFG without allocating anything or loading
    weights, so it is quick even for large networks. The last line estimates the memory
    the activations need at --batch images (for training, with the arrays `train` shares
    between layers).
    """
    net = build_network(cfg, batch=batch, darknet=darknet)
    click.echo(
        f"Darknet: {net.flavour} ({'chosen with --darknet' if darknet else 'from the cfg'}"
        f"; BFLOPs as {'the AlexeyAB fork' if net.darknet == 'alexeyab' else 'pjreddie'}"
        f"'s Darknet counts them)"
    )
    for line in net.summary():
        click.echo(line)
    batch = net.batch
    net.share_deltas = net.share_outputs = True  # as `darknet-py train` trains
    click.echo(
        f"Activations and workspace at batch {batch}: "
        f"{net.memory_bytes(batch, train=False) / 2**20:.1f} MiB for inference, "
        f"{net.memory_bytes(batch, train=True) / 2**20:.1f} MiB for training "
        f"(weights not counted)"
    )


# ---- partial --------------------------------------------------------------------------------
@cli.command("partial", short_help="Copy the first N layers' weights into a new file.")
@click.argument("cfg")
@click.argument("weights")
@click.argument("out")
@click.argument("layers", metavar="N", type=click.IntRange(min=0))
@overwrite_option
@darknet_option
def partial_command(cfg, weights, out, layers, overwrite, darknet):
    """Copy the weights of the first N layers of WEIGHTS into OUT (Darknet's partial).

    Used to make a pretrained backbone, e.g. darknet53.conv.74 from darknet53.weights.
    WEIGHTS must hold at least the floats of those N layers; OUT gets the same header
    with `seen` reset to 0, as Darknet does. N larger than the number of layers means all
    of them. An existing OUT (WEIGHTS itself included) is replaced only with --overwrite.
    """
    claim_outputs([out], overwrite)
    # Darknet runs partial on the CPU: it is file work, not inference.
    net = load_network(cfg, None, batch=1, device="cpu", darknet=darknet)
    net.load_weights(weights, cutoff=layers)
    net.seen = 0
    net.save_weights(out, cutoff=layers)
    kept = min(layers, len(net.layers))
    click.echo(
        f"{out}: wrote the weights of layers 0-{kept - 1} of {len(net.layers)} "
        f"({floats_needed(net, layers)} floats, {os.path.getsize(out)} bytes)"
        if kept
        else f"{out}: wrote a header and no layers"
    )


# ---- training commands (darknet_py/train.py): train, valid, anchors go here -----------------
@cli.command("train", short_help="Train a classifier or a YOLO detector.")
@click.argument("cfg")
@click.argument("data")
@click.option(
    "--weights",
    metavar="WEIGHTS",
    default=None,
    help="Start from these weights: a backup (resumes at its iteration), a "
    "finished run's weights, a pretrained partial file such as "
    "darknet53.conv.74 (the layers it covers), or weights trained for "
    "another class count (the layers whose shapes match; a notice lists them).",
)
@click.option(
    "--clear",
    is_flag=True,
    help="Start counting iterations at 0 (Darknet's -clear), e.g. to fine-tune "
    "weights that have already reached max_batches.",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seeds the initial weights, image sampling and augmentation.",
)
@click.option(
    "--map",
    "map_eval",
    is_flag=True,
    help="Evaluate on the valid list (mAP@0.5; top-1 for a classifier) every "
    "--map-every iterations and at the end; keep <cfg>_best.weights and "
    "<cfg>_last.weights.",
)
@click.option(
    "--map-every",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Iterations between --map evaluations [default: about 4 passes over the "
    "training list, at least 100].",
)
@click.option(
    "--max-batches",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Train to N iterations instead of the cfg's max_batches.",
)
@functools.partial(
    overwrite_option,
    help=(
        "Let this run replace files an earlier run left in the backup directory: "
        "<cfg>_final.weights, numbered weights, chart_<cfg>.png and its history, _last/_best and "
        "(for a run starting at iteration 0) <cfg>.backup. Without it they are an error, even "
        "with --clear."
    ),
)
@click.option(
    "--quiet", is_flag=True, help="Leave out the [yolo]/[region] layers' per-step statistics."
)
@click.option(
    "--gpus",
    metavar="LIST|all",
    default=None,
    help="Data-parallel training on these GPUs (0,1 or all), one process each, "
    "gradients summed over NCCL: the result of one GPU with batch x GPUs "
    "images per iteration (batch keeps its meaning per GPU).",
)
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Data-parallel training on the CPU in N processes (--gpus's CPU twin, over TCP).",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    metavar="N",
    help="Machines in a data-parallel run (each runs this command "
    "with its --node-rank and the same --master).",
)
@click.option(
    "--node-rank",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    metavar="R",
    help="This machine's index among --nodes (0 hosts rank 0).",
)
@click.option(
    "--master",
    metavar="HOST:PORT",
    default=None,
    help="Where node 0's rank 0 listens for the others (needed with --nodes > 1).",
)
@click.option(
    "--comm-timeout",
    type=click.FloatRange(min=1),
    default=600,
    show_default=True,
    metavar="SECONDS",
    help="A data-parallel rank that does not answer for this long ends the run.",
)
@click.option(
    "--bucket-mb",
    type=click.FloatRange(min=0),
    default=None,
    metavar="MB",
    expose_value=False,
    callback=lambda ctx, param, value: set_environment("DARKNET_BUCKET_MB", value),
    help="Data-parallel: megabytes of gradients summed together while the backward "
    "goes on (0: every gradient summed after the backward) [default: "
    "$DARKNET_BUCKET_MB, else 25].",
)
@click.option(
    "--exchange",
    type=click.Choice(["auto", "fp32"]),
    default=None,
    expose_value=False,
    callback=lambda ctx, param, value: set_environment("DARKNET_EXCHANGE", value),
    help="Data-parallel: the gradients' type between ranks: auto (16 bits under "
    "fp16/bf16 training, else fp32) or fp32 [default: $DARKNET_EXCHANGE, else "
    "auto].",
)
@click.option(
    "--workers",
    type=click.IntRange(min=0),
    default=None,
    metavar="N",
    help="Processes loading and augmenting images (0: in the training process) "
    "[default: one per available CPU less one, at most 16].",
)
@device_options
@darknet_option
def train_command(
    cfg,
    data,
    weights,
    clear,
    seed,
    map_eval,
    map_every,
    max_batches,
    overwrite,
    quiet,
    gpus,
    ranks,
    nodes,
    node_rank,
    master,
    comm_timeout,
    workers,
    device,
    darknet,
):
    """Train CFG on the dataset described by the .data file DATA.

    A classifier (its last layer is [softmax]) or a detector ([yolo]/[region]) is
    trained as Darknet's `classifier train` / `detector train` do: one line per
    iteration ("iteration: loss, average loss, rate, seconds, images"), weights saved
    in the .data file's backup directory: <cfg>.backup every 100 iterations,
    numbered weights at Darknet's intervals, <cfg>_final.weights at the end, and
    chart_<cfg>.png (the whole run's, also after a resume). Ctrl-C (or SIGTERM) saves
    <cfg>.backup; --weights <backup>/<cfg>.backup resumes at the same iteration and learning
    rate. Resuming weights that already reached max_batches is an error (exit code 2) that
    points to --clear. A loss that turns NaN or infinite stops the run (exit code 2) without
    saving the diverged weights.
    """
    from .train import train
    from .training.stops import exit_code, held_stop_signals

    kwargs = dict(
        cfg=cfg,
        data=data,
        weights=weights,
        clear=clear,
        seed=seed,
        map_eval=map_eval,
        map_every=map_every,
        max_batches=max_batches,
        overwrite=overwrite,
        verbose=not quiet,
        darknet=darknet,
    )
    cluster = cluster_rank(gpus, ranks, nodes, master)
    check_exchange_settings()
    try:
        with held_stop_signals():  # every stop signal: backup, one line, 128 + signal
            if cluster is not None:
                sys.exit(train_cluster_rank(cluster, kwargs, device, workers, comm_timeout))
            if gpus is not None or ranks is not None or nodes > 1:
                train_data_parallel(
                    kwargs, gpus, ranks, nodes, node_rank, master, comm_timeout, workers, device
                )
            else:
                train(device=device, workers=workers, log=log_line, **kwargs)
    except KeyboardInterrupt as e:  # the weights are saved and the resume command printed
        if not getattr(e, "reported", True):
            from .training.loop import describe_stop

            log_line(f"{describe_stop(e)} before training started: nothing saved")
        sys.exit(exit_code(e))  # as a shell reports a job the signal ended


def set_environment(name, value):
    """An option that the ranks read from the environment (they inherit it): set when given."""
    if value is not None:
        os.environ[name] = str(value)


def check_exchange_settings():
    """$DARKNET_BUCKET_MB and $DARKNET_EXCHANGE (distributed/buckets.py), refused in one
    line before any rank starts."""
    from .distributed import buckets

    try:
        buckets.bucket_bytes()
        buckets.exchange_setting()
    except ValueError as e:
        raise UserError(str(e)) from None


def cluster_rank(gpus, ranks, nodes, master):
    """The ClusterRank srun's or torchrun's variables make of this process (None without
    them); --gpus/--ranks/--nodes/--master are refused alongside."""
    from .distributed.cluster import (
        ClusterEnvironmentError,
        read_cluster_environment,
        slurm_without_srun,
    )

    try:
        cluster = read_cluster_environment()
    except ClusterEnvironmentError as e:
        raise UserError(str(e)) from None
    if cluster is None:
        if slurm_without_srun():
            log_line(slurm_without_srun())
        return None
    if gpus is not None or ranks is not None or nodes > 1 or master is not None:
        raise click.UsageError(
            f"{cluster.launcher} started this process as rank "
            f"{cluster.rank} of {cluster.world_size}: leave out --gpus, "
            f"--ranks, --nodes and --master"
        )
    return cluster


def train_cluster_rank(cluster, kwargs, device, workers, comm_timeout):
    """`srun/torchrun darknet-py train`: this process is one rank; its exit code."""
    from .backends import cuda_device_count
    from .distributed.launcher import cluster_device, cluster_workers, run_as_cluster_rank

    try:
        rank_device = cluster_device(cluster, device, 0 if device == "cpu" else cuda_device_count())
    except ValueError as e:
        raise UserError(str(e)) from None
    kwargs["workers"] = cluster_workers(cluster, workers)
    return run_as_cluster_rank(cluster, kwargs, rank_device, timeout=comm_timeout)


def train_data_parallel(
    kwargs, gpus, ranks, nodes, node_rank, master, comm_timeout, workers, device
):
    """`train --gpus/--ranks [--nodes --node-rank --master]`: start this node's ranks."""
    from .backends import cuda_device_count
    from .data.loader import default_workers
    from .distributed.comm import parse_master
    from .distributed.launcher import LaunchError, launch, parse_gpus

    if gpus is not None and ranks is not None:
        raise click.UsageError("give --gpus (GPUs) or --ranks (CPU processes), not both")
    if device != "auto":
        raise click.UsageError("--gpus/--ranks choose the devices; leave out --gpu/--device")
    if gpus is None and ranks is None:
        raise click.UsageError("--nodes needs --gpus or --ranks: the ranks on each node")
    if node_rank >= nodes:
        raise click.UsageError(
            f"--node-rank {node_rank} with --nodes {nodes}: expected 0..{nodes - 1}"
        )
    if nodes > 1 and master is None:
        raise click.UsageError("--nodes > 1 needs --master HOST:PORT (node 0's address)")
    # An explicit GPU list is checked against the GPUs while the ranks start: CUDA's start
    # in this process (up to a second on a machine of several GPUs) then delays none of them.
    listed = gpus is not None and str(gpus).strip() != "all"
    try:
        devices = (
            parse_gpus(gpus, None if listed else cuda_device_count())
            if gpus is not None
            else ["cpu"] * ranks
        )
        address = parse_master(master) if master is not None else None
    except ValueError as e:
        raise UserError(str(e)) from None
    # The node's CPUs load images for all its ranks: each rank gets its share of workers.
    kwargs["workers"] = default_workers(len(devices)) if workers is None else workers
    try:
        launch(
            devices,
            kwargs,
            first_rank=node_rank * len(devices),
            world_size=nodes * len(devices),
            master=address,
            timeout=comm_timeout,
            check=(lambda: parse_gpus(gpus, cuda_device_count())) if listed else None,
        )
    except LaunchError as e:
        raise UserError(str(e)) from None


@cli.command("valid", short_help="Score weights on a dataset's valid list.")
@click.argument("cfg")
@click.argument("data")
@click.argument("weights")
@click.option(
    "--results-dir",
    metavar="DIR",
    default="results",
    show_default=True,
    help="Detectors: where Darknet's results files go (comp4_det_test_<class>.txt "
    "per class, coco_results.json).",
)
@click.option(
    "--overwrite", is_flag=True, help="Replace results files an earlier run left in --results-dir."
)
@device_options
@engine_option
@darknet_option
@letter_box_option
def valid_command(cfg, data, weights, results_dir, overwrite, device, engine, darknet):
    """Score CFG with WEIGHTS on the valid list of the .data file DATA.

    A classifier gets its top-1 and top-k accuracy (k: the .data file's top=, else 5;
    images centre-cropped as Darknet's validation does); a detector its mAP@0.5 with
    PASCAL VOC's all-point interpolation, per class and overall (detections above .005,
    NMS .45). The last line is for scripts: "top-1: 0.9533 top-5: 0.9990" or
    "mAP@0.5: 0.7120".

    A detector's detections are also written as Darknet's `detector valid` writes them,
    into --results-dir: comp4_det_test_<class>.txt (image id, probability, left, top,
    right, bottom in pixels, 1-based) and coco_results.json (COCO's detection format).
    """
    from .validate import validate

    validate(
        cfg,
        data,
        weights,
        device=device,
        log=log_line,
        results_dir=results_dir,
        overwrite=overwrite,
        darknet=darknet,
        engine=engine,
    )


@cli.command("map", short_help="The AlexeyAB fork's detector map: AP, precision, recall.")
@click.argument("cfg")
@click.argument("data")
@click.argument("weights")
@click.option(
    "--iou-thresh",
    type=click.FloatRange(0, 1, min_open=True),
    default=0.5,
    show_default=True,
    help="IoU with a truth box that makes a true positive.",
)
@click.option(
    "--points",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Recall points of the AP: 11 (PASCAL VOC 2007), 101 (MS COCO), or 0 for "
    "the area under the curve at every recall (VOC 2010-2012).",
)
@click.option(
    "--thresh",
    type=click.FloatRange(0, 1),
    default=0.25,
    show_default=True,
    help="Confidence at which precision, recall, F1 and the average IoU are taken.",
)
@click.option(
    "--plots",
    metavar="DIR",
    default=None,
    help="Write a precision/recall curve per class (pr_<id>_<name>.png) and a "
    "confusion matrix at --thresh (confusion_matrix.png) into DIR.",
)
@click.option(
    "--quiet",
    is_flag=True,
    help="No progress line (images done, images/s, ETA) on stderr, and no note "
    "saying which engine runs.",
)
@overwrite_option
@device_options
@functools.partial(engine_option, quiet_option=False)  # map has its own --quiet
@darknet_option
@letter_box_option
def map_command(
    cfg, data, weights, iou_thresh, points, thresh, plots, quiet, overwrite, device, engine, darknet
):
    """Score a detector on the valid list of DATA as the AlexeyAB fork's `detector map`.

    Prints per class the AP and, at --thresh, TP, FP, precision, recall and F1; then the
    totals and "mean average precision (mAP@0.50) = ...". Every class of the network
    counts in the mean, also those without ground truth (as in the fork). A valid set
    without a single labelled box is refused (exit code 2), naming where the label files
    were looked for.
    """
    if points == 1:
        raise click.BadParameter("needs 0 or at least 2 recall points", param_hint="--points")
    from .validate import detector_map

    if plots is not None:
        from .data.config import load_data_config
        from .map_plots import plot_paths
        from .predictions import detector_layers

        heads = detector_layers(build_network(cfg, darknet=darknet))
        classes = heads[-1].classes if heads else 0
        claim_outputs(plot_paths(plots, classes, load_data_config(data).names), overwrite)
    detector_map(
        cfg,
        data,
        weights,
        device=device,
        iou_thresh=iou_thresh,
        points=points,
        thresh=thresh,
        darknet=darknet,
        log=log_line,
        plots=plots,
        engine=engine,
        progress=not quiet,
    )


@cli.command("anchors", short_help="Compute YOLO anchors for a dataset.")
@click.argument("data")
@click.option(
    "--cfg",
    metavar="CFG",
    default=None,
    help="Take --num (its last [yolo] layer's num), --width and --height from CFG.",
)
@click.option(
    "--num",
    type=click.IntRange(min=1),
    default=None,
    help="How many anchors (9 for YOLOv3, 6 for yolov3-tiny). [default: the --cfg's, else 9]",
)
@click.option(
    "--width",
    type=click.IntRange(min=1),
    default=None,
    help="The network's input width. [default: the --cfg's, else 416]",
)
@click.option(
    "--height",
    type=click.IntRange(min=1),
    default=None,
    help="The network's input height. [default: the --cfg's, else 416]",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seeds the k-means initialisation."
)
@click.option(
    "--out",
    metavar="FILE",
    default=None,
    help="Also write the anchors to FILE as the AlexeyAB fork's calc_anchors writes anchors.txt.",
)
@click.option(
    "--counts-out",
    metavar="FILE",
    default=None,
    help="Also write the boxes per class to FILE as the fork's calc_anchors "
    "writes counters_per_class.txt.",
)
@overwrite_option
def anchors_command(data, cfg, num, width, height, seed, out, counts_out, overwrite):
    """Cluster the box sizes of DATA's training labels into --num anchors.

    k-means on (width, height) with 1 - IoU as the distance, at the network's input
    size. Prints the cfg line ("anchors = 10,13, 16,30, ...", smallest first) on
    stdout, and on stderr how well the anchors fit the boxes.

    --out FILE writes them as the fork's anchors.txt ("w,h, w,h, ..." without a line end,
    each value padded to 3 characters, or with 4 decimals for a network 32 pixels wide or
    less); --counts-out FILE the boxes per class as its counters_per_class.txt. Darknet's
    form `detector calc_anchors DATA` writes both in the current directory, replacing
    earlier ones as the fork does, and names them.
    """
    from .data.anchors import (
        anchor_mean_iou,
        anchor_settings,
        compute_anchors,
        fork_anchors_text,
        fork_class_counters_text,
        format_anchors,
        training_label_rows,
    )

    outputs = [f for f in (out, counts_out) if f is not None]
    replacing = {f for f in outputs if os.path.exists(f)}
    claim_outputs(outputs, overwrite)
    settings, used = anchor_settings(cfg, num=num, width=width, height=height)
    if used:
        click.echo(
            f"{PROG}: note: " + ", ".join(f"{k}={settings[k]}" for k in used) + f" from {cfg}",
            err=True,
        )
    labels = training_label_rows(data)  # (rows, classes): read once for both files
    anchors, boxes = compute_anchors(data, seed=seed, labels=labels, **settings)
    click.echo(format_anchors(anchors))
    click.echo(
        f"{counted(len(boxes), 'box', 'boxes')}; mean IoU of a box with its best anchor: "
        f"{anchor_mean_iou(boxes, anchors):.4f}",
        err=True,
    )
    written = []
    if counts_out is not None:
        write_text_atomically(counts_out, fork_class_counters_text(*labels))
        written.append((counts_out, "the boxes per class in the fork's counters_per_class.txt"))
    if out is not None:
        write_text_atomically(out, fork_anchors_text(anchors, settings["width"]))
        written.append((out, "the anchors in the fork's anchors.txt form"))
    for path, what in written:
        click.echo(
            f"{PROG}: wrote {os.path.abspath(path)} ({what}"
            f"{'; it replaced an earlier file' if path in replacing else ''})",
            err=True,
        )


@cli.command("check", short_help="Check a detector dataset: lists, labels, boxes per class.")
@click.argument("data")
@click.option(
    "--picture",
    metavar="PNG",
    default=None,
    help="The labels overview picture (boxes per class, centres, sizes) "
    "[default: <data>_labels.png, numbered past an earlier one; `none`: no "
    "picture].",
)
@click.option(
    "--darknet",
    type=click.Choice(DARKNET_FLAVOURS),
    default="original",
    show_default=True,
    help="Whose label-path rule to follow: the original Darknet's (images -> "
    "labels) or the AlexeyAB fork's (the label file beside the image).",
)
def check_command(data, picture, darknet):
    """Report what the .data file DATA's train and valid lists hold: images (and missing
    ones, and those whose header says they cannot be decoded: an empty file, a text file
    named .jpg), label files, boxes per class, and every label problem by file and line
    (pixel coordinates, values outside 0-1, class ids out of range, malformed lines).
    Exit code 0 when nothing is wrong, 1 when problems were found."""
    from .dataset_check import check_dataset

    if picture is None:
        stem = os.path.splitext(os.path.basename(data))[0]
        picture = first_free_run(lambda run: [run_numbered(f"{stem}_labels.png", run)])[0]
    elif picture.lower() == "none":
        picture = None
    else:
        claim_outputs([picture], overwrite=False)
    if check_dataset(data, picture, log=click.echo, warn=warn, darknet=darknet):
        sys.exit(1)


@cli.command("bench", short_help="Time a network: forward, training step, per layer.")
@click.argument("cfg")
@click.option(
    "--batch",
    type=click.IntRange(min=1),
    default=None,
    help="Images per forward; a recurrent cfg's, whole sequences of time_steps rows "
    "each.  [default: 1, or one sequence for a recurrent cfg]",
)
@click.option(
    "--train",
    is_flag=True,
    help="Also time a training step (forward, backward, update) on random truth.",
)
@click.option(
    "--layers",
    is_flag=True,
    help="Also time every layer on its own: forward (and backward with --train), "
    "in ms and as a share of the total.",
)
@click.option(
    "--json", "json_file", metavar="FILE", default=None, help="Write the figures to FILE as JSON."
)
@click.option(
    "--repeats",
    type=click.IntRange(min=1),
    default=20,
    show_default=True,
    help="Timed runs; the median is reported.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Untimed runs before the timed ones.",
)
@overwrite_option
@device_options
@functools.partial(engine_option, default="numpy")
@darknet_option
def bench_command(
    cfg, batch, train, layers, json_file, overwrite, repeats, warmup, device, engine, darknet
):
    """Time CFG with random weights and a random input batch.

    Prints the median forward time (inference, as `detect` and `test` run it) and
    images/s, with --train also a training step's, and the peak device memory where the
    backend knows it (the GPU). Times come from the backend: CUDA events on the GPU, the
    wall clock on the CPU.
    """
    from .bench import bench_batch, format_report, prepare, run_bench

    batch = bench_batch(cfg, batch, darknet)
    if json_file is not None:
        claim_outputs([json_file], overwrite)  # before the work, not after
    if engine != "numpy" and (train or layers):
        raise UserError("--engine onnxruntime times inference: leave out --train and --layers")

    def prepared(**kwargs):  # random weights in place before ONNX Runtime copies them
        net = load_network(**kwargs)
        prepare(net)
        return net

    net = load_with_engine(
        prepared, engine, device, cfg=cfg, weights=None, batch=batch, darknet=darknet
    )
    result = run_bench(net, train=train, layers=layers, warmup=warmup, repeats=repeats)
    for line in format_report(result):
        click.echo(line)
    if json_file is not None:
        with atomic_output(json_file) as tmp, open(tmp, "w", encoding="utf-8") as json_out:
            json.dump(result, json_out, indent=1)
            json_out.write("\n")


# ---- export: ONNX (darknet_py/export) --------------------------------------------------------
@cli.command("export", help=EXPORT_HELP, short_help="Write a network as an ONNX model, checked.")
@export_options
@names_options
@darknet_option
def export_command(names, data, **options):
    run_export(names=names, log=click.echo, **options)


def main(argv=None):
    """Console entry point (`darknet-py`). Given argv (tests, callers in Python) it returns
    or raises SystemExit as click does; run as the command (argv None) it ends the process
    when the command is done, skipping the interpreter's teardown (exit_process)."""
    if argv is not None:
        return cli.main(args=argv, prog_name=PROG)
    try:
        cli.main(prog_name=PROG)
    except SystemExit as e:
        exit_process(e.code)
    exit_process(0)


if __name__ == "__main__":
    main()


# ---- rnn: Darknet's character models (implemented in rnn_text.py) ---------------------------
@cli.group("rnn")
def rnn_group():
    """Train and sample character models as Darknet's `rnn train` / `rnn generate` do."""


@rnn_group.command("train")
@click.argument("cfg")
@click.argument("text")
@click.option(
    "--weights", default=None, help="Start from these weights (resumes at their iteration)."
)
@click.option("--clear", is_flag=True, help="Start the iteration count at 0 (with --weights).")
@click.option(
    "--backup",
    "backup_dir",
    default="backup",
    show_default=True,
    help="Directory for <cfg>.backup (every 100 iterations), <cfg>_<N>.weights "
    "(every 10000) and <cfg>_final.weights.",
)
@click.option(
    "--max-batches",
    type=click.IntRange(min=1),
    default=None,
    metavar="N",
    help="Stop after N iterations [default: the cfg's max_batches].",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the initial weights and the streams' offsets.",
)
@overwrite_option
@device_options
@darknet_option
def rnn_train_command(
    cfg, text, weights, clear, backup_dir, max_batches, seed, overwrite, device, darknet
):
    """Train the character network CFG on the bytes of TEXT (one line per iteration)."""
    from .rnn_text import train_text

    try:
        train_text(
            cfg,
            text,
            weights=weights,
            backup_dir=backup_dir,
            max_batches=max_batches,
            seed=seed,
            clear=clear,
            device=device,
            darknet=darknet,
            overwrite=overwrite,
            log=lambda line: click.echo(line, err=True),
        )
    except KeyboardInterrupt:
        sys.exit(130)  # <cfg>.backup is saved and the resume command printed


@rnn_group.command("generate")
@click.argument("cfg")
@click.argument("weights")
@click.option(
    "--seed-text",
    default="\n\n",
    show_default=True,
    help="Text fed first (backslash escapes such as \\n are read).",
)
@click.option(
    "--length",
    type=click.IntRange(min=0),
    default=1000,
    show_default=True,
    help="Bytes to generate after the seed text.",
)
@click.option(
    "--temp",
    type=float,
    default=0.7,
    show_default=True,
    help="Softmax temperature: lower is more conservative.",
)
@click.option(
    "--srand", type=int, default=None, help="Seed of the sampling [default: the clock, as Darknet]."
)
@device_options
@darknet_option
def rnn_generate_command(cfg, weights, seed_text, length, temp, srand, device, darknet):
    """Write the seed text and LENGTH bytes drawn from the network to stdout."""
    from .rnn_text import generate_text

    seed = seed_text.encode("latin-1", "backslashreplace").decode("unicode_escape")
    out = sys.stdout.buffer
    generate_text(
        cfg,
        weights,
        seed.encode("utf-8"),
        length,
        temp,
        srand,
        device,
        darknet,
        write=lambda b: (out.write(b), out.flush()),
    )
    out.write(b"\n")
