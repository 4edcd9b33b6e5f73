"""The command line's shared pieces: the one-line UserError, warnings, the options every
command that runs a network takes (device, flavour, names, letterboxing, overwrite) and
the image-argument helpers. cli.py builds the commands from them."""

import errno
import functools
import os
import sys

import click

from . import precision as precisions
from .cfg import read_data_file
from .errors import describe_error
from .files import refuse_overwrite, remove_stale_temporaries
from .image import ImageError
from .names import names_from_data, read_names
from .network import DARKNET_FLAVOURS

PROG = "darknet-py"

# IMAGE arguments ending like this are lists of image paths, one a line.
LIST_SUFFIXES = (".txt", ".list")


class UserError(click.ClickException):
    """An error the user can fix: one line on stderr, exit code 2."""

    exit_code = 2

    def show(self, file=None):
        click.echo(f"{PROG}: error: {self.format_message()}", err=True)


def warn(message):
    click.echo(f"{PROG}: warning: {message}", err=True)


def log_line(line):
    """A line of a long command's log: its warnings go to stderr with the others."""
    click.echo(line, err=line.startswith(f"{PROG}: warning:"))


# ---- shared options and helpers ---------------------------------------------------------
def resolve_device(gpu, device):
    """The device string for get_backend from --gpu N and --device."""
    # --gpu N on a machine without a GPU stays an error: asked for by name, a GPU run that
    # silently took the CPU would be ~100x slower. Darknet's -i/-gpus are another matter:
    # a CPU build of Darknet ignores them, and so does darknet_forms without a GPU.
    if gpu is not None:
        if device is not None:
            raise click.UsageError("give --gpu or --device, not both")
        return f"cuda:{gpu}"
    return device if device is not None else "auto"


def device_options(command):
    """Add --gpu N and --device to a command, which receives `device` (a get_backend string)."""

    @functools.wraps(command)
    def with_device(*args, gpu, device, **kwargs):
        return command(*args, device=resolve_device(gpu, device), **kwargs)

    with_device = click.option(
        "--device",
        metavar="auto|cpu|cuda|cuda:N",
        default=None,
        help="Where to run: auto (CUDA when available, else the CPU), cpu, cuda or cuda:N. "
        "[default: auto]",
    )(with_device)
    with_device = click.option(
        "--gpu",
        type=click.IntRange(min=0),
        metavar="N",
        default=None,
        help="Run on CUDA GPU N (the same as --device cuda:N).",
    )(with_device)
    return click.option(  # sets $DARKNET_PRECISION for the networks the command builds
        "--precision",
        type=click.Choice(precisions.PRECISIONS),
        default=None,
        expose_value=False,
        callback=lambda ctx, param, value: precisions.ask(value),
        help="Convolution arithmetic: fp32 (Darknet-exact) or tf32/fp16/bf16 on the GPU's "
        "tensor cores (emulated on the CPU). [default: the cfg's [net] precision=, "
        "else fp32]",
    )(with_device)


def overwrite_option(
    command,
    help="Replace output files that already exist (without it, "
    "an existing output is an error and is left as it is).",
):
    """Add --overwrite, the one switch every command that writes files takes."""
    return click.option("--overwrite", is_flag=True, help=help)(command)


def claim_outputs(paths, overwrite):
    """The rule for a command's outputs, checked before any work: an existing file is
    refused without --overwrite; temporaries that interrupted writes left in the outputs'
    directories are removed."""
    refuse_overwrite(paths, overwrite)
    for directory in sorted({os.path.dirname(os.path.abspath(p)) for p in paths}):
        existing = directory  # missing directories are made; where would they go?
        while not os.path.exists(existing):
            existing = os.path.dirname(existing)
        if not os.path.isdir(existing):
            raise OSError(errno.ENOTDIR, "not a directory, so no output can go under it", existing)
        if not os.access(existing, os.W_OK):
            raise OSError(errno.EACCES, "cannot write into this directory", existing)
        for stale in remove_stale_temporaries(directory):
            warn(f"removed {stale}, left by an interrupted write")


class Probability(click.ParamType):
    """A float in [0, 1]; click's FloatRange lets NaN through (every comparison is False)."""

    name = "probability"

    def convert(self, value, param, ctx):
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"'{value}' is not a number", param, ctx)
        if not 0 <= number <= 1:
            self.fail(f"{value} is not in the range 0 to 1", param, ctx)
        return number


def darknet_option(command):
    """Add --darknet original|alexeyab|alexeyab-cpu: which Darknet's arithmetic the network
    follows."""
    return click.option(
        "--darknet",
        type=click.Choice(DARKNET_FLAVOURS),
        default=None,
        help="Follow the original Darknet (pjreddie) or the AlexeyAB fork (batch-norm "
        "epsilon and momentum, BFLOPs, weights header, truth layout), trained as its "
        "GPU build (alexeyab) or its CPU build (alexeyab-cpu) does. [default: the "
        "fork's GPU build when the weights header or the cfg is the fork's]",
    )(command)


def letter_box_option(command):
    """Add --letter-box (the fork's -letter_box): letterbox the images of a fork-flavour
    detector, which the fork otherwise resizes plainly (as with [net] letter_box=1)."""

    @functools.wraps(command)
    def with_letter_box(*args, letter_box, **kwargs):
        from .predictions import letterbox_forced

        with letterbox_forced(letter_box):  # the networks load deep inside (map, valid)
            return command(*args, **kwargs)

    return click.option(
        "--letter-box",
        is_flag=True,
        help="Letterbox the images (keep their aspect, grey bars) for a network of the "
        "fork's flavour, as the fork's -letter_box or [net] letter_box=1; pjreddie's "
        "detectors always letterbox.",
    )(with_letter_box)


def load_names(names_file=None, data_file=None, data=None):
    """Class names from a names file, or from the names= (else labels=) key of a .data
    file (see names.py for where a relative path is looked for). None when neither is
    given, or the .data file has neither key (classes are then numbered)."""
    if names_file is not None:
        return read_names(names_file)
    if data_file is not None:
        names, _ = names_from_data(data_file, data)
        if names is None:
            warn(f"{data_file}: no names= or labels= key; classes are shown as numbers")
        return names
    return None


def names_options(command):
    """Add --data and --names to a command, which receives `names` (a list, or None) and
    `data` (the .data file's options as a dict; empty without --data)."""

    @functools.wraps(command)
    def with_names(*args, data_file, names_file, **kwargs):
        if data_file is not None and names_file is not None:
            raise click.UsageError("give --data or --names, not both")
        data = read_data_file(data_file) if data_file is not None else {}
        names = load_names(names_file, data_file, data)
        return command(*args, names=names, data=data, **kwargs)

    with_names = click.option(
        "--names",
        "names_file",
        metavar="FILE",
        default=None,
        help="Class names, one a line (e.g. data/coco.names).",
    )(with_names)
    with_names = click.option(
        "--data",
        "data_file",
        metavar="DATA",
        default=None,
        help="A Darknet .data file; class names come from its names= (or labels=) file, "
        "a path relative to the current directory. Without --data or --names, "
        "classes are shown as numbers.",
    )(with_names)
    return with_names


def read_path_list(stream, name="stdin"):
    lines = stream.read().splitlines()
    for lineno, line in enumerate(lines, start=1):
        if "\0" in line:  # open() would fail with "embedded null byte"
            raise UserError(f"{name}:{lineno}: holds a NUL byte: not a list of image paths")
    return [line.strip() for line in lines if line.strip()]


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")


def expand_images(args):
    """Image paths from IMAGE arguments: paths, folders (their images, by name), list files
    (.txt/.list, one path a line) and `-` (paths on stdin)."""
    paths = []
    for arg in args:
        if os.path.isdir(arg):
            found = sorted(
                os.path.join(arg, n) for n in os.listdir(arg) if n.lower().endswith(IMAGE_SUFFIXES)
            )
            if not found:
                raise UserError(
                    f"{arg}: is a directory with no images in it ({', '.join(IMAGE_SUFFIXES)})"
                )
            paths.extend(found)
        elif arg == "-":
            paths.extend(read_path_list(sys.stdin))
        elif arg.lower().endswith(LIST_SUFFIXES):
            if os.path.exists(arg) and not os.path.isfile(arg):
                raise UserError(
                    f"{arg}: not a regular file (a pipe, socket or device); give "
                    f"the image list as a file"
                )
            with open(arg, encoding="utf-8", errors="replace") as f:
                paths.extend(read_path_list(f, arg))
        else:
            paths.append(arg)
    if not paths:
        raise UserError("no image paths given (the image list is empty)")
    return paths


def class_name(names, class_id):
    if names is not None and 0 <= class_id < len(names):
        return names[class_id]
    return str(class_id)


def run_on_images(paths, run_one):
    """Call run_one(index, path) for each image. An unreadable image is reported and
    skipped, so one bad file does not lose the others' results; returns how many failed
    (the command then exits with 2)."""
    failed = 0
    for index, path in enumerate(paths):
        try:
            run_one(index, path)
        except ImageError as e:
            click.echo(f"{PROG}: error: {describe_error(e)}", err=True)
            failed += 1
    return failed


def same_file(a, b):
    return os.path.realpath(a) == os.path.realpath(b)


IMAGE_ARGUMENT_HELP = (
    "IMAGE is an image file, a list file (.txt or .list, one image path a "
    "line), or - to read image paths from stdin; give as many as you like."
)
