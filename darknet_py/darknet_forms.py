"""Darknet's own command forms, translated into darknet-py's before click parses them.

Users of either Darknet type ``detector train DATA CFG [WEIGHTS]`` and the AlexeyAB fork's
single-dash flags (``-map``, ``-thresh 0.3``, ``-dont_show``); darknet-py's commands take the
cfg first (``train CFG DATA``) and double-dash options. `translate` maps the first onto the
second and says what it ran; a .data/.cfg pair given in the wrong order to one of our own
commands is named as such, instead of failing on the .data file read as a cfg.
"""
import os

# The fork's flags (and pjreddie's) -> ours: (our option or None to drop it, takes a value).
# Dropped flags only steer windows and servers darknet-py does not open.
FLAGS = {
    "-thresh": ("--thresh", True),
    "-hier": (None, True),
    "-iou_thresh": ("--iou-thresh", True),
    "-points": ("--points", True),
    "-map": ("--map", False),
    "-clear": ("--clear", False),
    "-gpus": ("--gpus", True),
    "-i": ("--gpu", True),
    "-ext_output": ("--ext-output", False),
    "-out": ("--json", True),        # or --out: see _split
    "-out_filename": ("--out", True),
    "-c": ("--camera", True),
    "-num_of_clusters": ("--num", True),
    "-width": ("--width", True),
    "-height": ("--height", True),
    "-dont_show": (None, False),
    "-show": (None, False),
    "-show_imgs": (None, False),
    "-nogpu": ("--device=cpu", False),
    "-mjpeg_port": (None, True),
    "-json_port": (None, True),
    "-benchmark_layers": (None, False),
    "-benchmark": (None, False),
    "-fullscreen": (None, False),
    "-dontuse_opencv": (None, False),
    "-topk": (None, False),          # valid always prints top-1 and top-k
    "-s": (None, True),              # frame skip
    "-avg": (None, True),
    "-t": ("--top", True),
    "-save_labels": ("--save-txt", False),
    "-json_file_output": ("--json", True),
    "-letter_box": (None, False),
    "-avgframes": (None, True),
    "-prefix": (None, True),
}

# Darknet's subcommand -> (ours, where DATA goes, the positional names after DATA CFG).
DETECTOR = {
    "train": "train", "test": "detect", "demo": "detect", "valid": "valid", "map": "map",
    "calc_anchors": "anchors",
}
CLASSIFIER = {"train": "train", "predict": "test", "test": "test", "valid": "valid"}


class DarknetFormError(Exception):
    """Darknet's form given with too few arguments, or an unknown subcommand."""


def _split(args):
    """(positionals, our options) from Darknet-form arguments; known fork flags are mapped,
    others (ours, or unknown ones that click then refuses) pass through."""
    positionals, options, dropped = [], [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in FLAGS:
            ours, takes_value = FLAGS[arg]
            value = args[i + 1] if takes_value and i + 1 < len(args) else None
            if takes_value and value is None:
                raise DarknetFormError(f"{arg} needs a value")
            if arg == "-out" and not value.lower().endswith(".json"):
                ours = "--out"   # pjreddie's -out names the picture; the fork's, JSON results
            if ours is None:
                dropped.append(arg)
            else:
                options += [ours] + ([value] if takes_value else [])
            i += 2 if takes_value else 1
        elif arg.startswith("-") and arg != "-":
            options.append(arg)
            # An option of ours with its value: keep the pair together.
            if i + 1 < len(args) and not args[i + 1].startswith("-") and "=" not in arg \
                    and arg not in FLAG_OPTIONS:
                options.append(args[i + 1])
                i += 1
            i += 1
        else:
            positionals.append(arg)
            i += 1
    return positionals, options, dropped


# Our options that take no value (so the argument after them is a positional).
FLAG_OPTIONS = {"--map", "--clear", "--overwrite", "--quiet", "--ext-output", "--darknet-order",
                "--train", "--layers", "--save-txt", "-h", "--help"}


def _need(positionals, count, usage):
    if len(positionals) < count:
        raise DarknetFormError(f"Darknet's form is `{usage}`")


def _detector(sub, rest):
    pos, opts, dropped = _split(rest)
    ours = DETECTOR[sub]
    if sub == "calc_anchors":
        _need(pos, 1, "detector calc_anchors DATA [-num_of_clusters N -width W -height H]")
        # The fork writes (and replaces) anchors.txt in the current directory.
        return (["anchors", pos[0]] + pos[1:] + opts + ["--out", "anchors.txt", "--overwrite"],
                dropped)
    if sub == "train":
        _need(pos, 2, "detector train DATA CFG [WEIGHTS]")
        weights = ["--weights", pos[2]] if len(pos) > 2 else []
        return ["train", pos[1], pos[0]] + weights + pos[3:] + opts, dropped
    _need(pos, 3, f"detector {sub} DATA CFG WEIGHTS" + (" [IMAGE]" if sub == "test" else
                                                        " [VIDEO]" if sub == "demo" else ""))
    data, cfg, weights, more = pos[0], pos[1], pos[2], pos[3:]
    if ours == "detect":
        return ["detect", cfg, weights] + more + ["--data", data] + opts, dropped
    return [ours, cfg, data, weights] + more + opts, dropped


def _classifier(sub, rest):
    pos, opts, dropped = _split(rest)
    if sub == "train":
        _need(pos, 2, "classifier train DATA CFG [WEIGHTS]")
        weights = ["--weights", pos[2]] if len(pos) > 2 else []
        return ["train", pos[1], pos[0]] + weights + pos[3:] + opts, dropped
    _need(pos, 3, f"classifier {sub} DATA CFG WEIGHTS" + (" [IMAGE]" if sub != "valid" else ""))
    data, cfg, weights, more = pos[0], pos[1], pos[2], pos[3:]
    if sub == "valid":
        return ["valid", cfg, data, weights] + more + opts, dropped
    return ["test", cfg, weights] + more + ["--data", data] + opts, dropped


# Darknet's `rnn` flags (examples/rnn.c) -> ours; -file is the training text.
RNN_FLAGS = {"-file": "TEXT", "-seed": "--seed-text", "-len": "--length", "-temp": "--temp",
             "-srand": "--srand", "-clear": "--clear"}
RNN_DEFAULT_TEXT = "data/shakespeare.txt"   # Darknet's -file default


def _rnn(rest):
    """`rnn train CFG [WEIGHTS] -file TEXT` and `rnn generate CFG WEIGHTS -len N -seed S
    -temp T -srand R` (Darknet's forms) in ours."""
    sub, args = rest[0], rest[1:]
    positionals, options, text, i = [], [], RNN_DEFAULT_TEXT, 0
    while i < len(args):
        arg = args[i]
        if arg in RNN_FLAGS and arg != "-clear":
            if i + 1 >= len(args):
                raise DarknetFormError(f"{arg} needs a value")
            if arg == "-file":
                text = args[i + 1]
            else:
                options += [RNN_FLAGS[arg], args[i + 1]]
            i += 2
            continue
        if not arg.startswith("-"):
            positionals.append(arg)
        else:
            options.append(RNN_FLAGS.get(arg, arg))
            # An option of ours with its value: keep the pair together.
            if (arg != "-clear" and i + 1 < len(args) and not args[i + 1].startswith("-")
                    and "=" not in arg and arg not in FLAG_OPTIONS):
                options.append(args[i + 1])
                i += 1
        i += 1
    if sub == "train":
        _need(positionals, 1, "rnn train CFG [WEIGHTS] -file TEXT")
        weights = ["--weights", positionals[1]] if len(positionals) > 1 else []
        return ["rnn", "train", positionals[0], text] + weights + positionals[2:] + options, []
    return ["rnn", sub] + positionals + options, []


def _fork_flags_only(args):
    """Our own command with the fork's flag spellings: map the flags, keep the order."""
    out, dropped, i = [], [], 0
    while i < len(args):
        arg = args[i]
        if arg in FLAGS and arg != "-out":   # ours has --out (an image); the fork's is JSON
            ours, takes_value = FLAGS[arg]
            if takes_value and i + 1 >= len(args):
                raise DarknetFormError(f"{arg} needs a value")
            if ours is None:
                dropped.append(arg)
            else:
                out += [ours] + ([args[i + 1]] if takes_value else [])
            i += 2 if takes_value else 1
        else:
            out.append(arg)
            i += 1
    return out, dropped


def translate(args):
    """(args in darknet-py's form, a note for the user or None). Raises DarknetFormError."""
    args = list(args)
    if not args:
        return args, None
    head, rest = args[0], args[1:]
    if head in ("detector", "classifier"):
        table = DETECTOR if head == "detector" else CLASSIFIER
        if not rest or rest[0] not in table:
            raise DarknetFormError(f"`{head}` takes one of: {', '.join(table)} "
                                   f"(Darknet's `{head} SUBCOMMAND DATA CFG ...`)")
        out, dropped = (_detector if head == "detector" else _classifier)(rest[0], rest[1:])
    elif head == "rnn" and rest and any(a in RNN_FLAGS for a in rest[1:]):
        out, dropped = _rnn(rest)
    else:
        out, dropped = _fork_flags_only(args)
        if head in ("train", "valid", "map"):
            positionals = _split(out[1:])[0]
            if len(positionals) >= 2:
                message = swapped_arguments(head, positionals[0], positionals[1])
                if message:
                    raise DarknetFormError(message)
        if out == args:
            return args, None
    note = f"running `darknet-py {' '.join(out)}`"
    if dropped:
        note += f" ({', '.join(dropped)}: nothing to do without a window)"
    return out, note


def _looks_like(path, section):
    """True when the first meaningful line of a regular file is a [section] header
    (a cfg) or, with section None, a key=value line (a .data file)."""
    try:
        if not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f.read(65536).splitlines():
                line = line.strip()
                if not line or line.startswith(("#", ";")):
                    continue
                return line.startswith("[") if section else ("=" in line and
                                                             not line.startswith("["))
    except OSError:
        return False
    return False


def swapped_arguments(command, cfg, data):
    """The message for `train DATA CFG` (Darknet's order given to our command), or None."""
    if _looks_like(data, "cfg") and _looks_like(cfg, None):
        return (f"{cfg} is a .data file and {data} a .cfg: darknet-py's order is "
                f"`{command} CFG DATA ...` (Darknet's own `detector {command} DATA CFG ...` "
                f"works too)")
    return None
