"""Darknet's own command forms, translated into darknet-py's before click parses them.

Users of either Darknet type ``detector train DATA CFG [WEIGHTS]`` and the AlexeyAB fork's
single-dash flags (``-map``, ``-thresh 0.3``, ``-dont_show``); darknet-py's commands take the
cfg first (``train CFG DATA``) and double-dash options. `translate` maps the first onto the
second and says what it ran; a .data/.cfg pair given in the wrong order to one of our own
commands is named as such, instead of failing on the .data file read as a cfg.
"""

import os
import textwrap

# The fork's flags (and pjreddie's) -> ours: (our option or None to drop it, takes a value).
# Dropped flags only steer windows and servers darknet-py does not open.
FLAGS = {
    "-thresh": ("--thresh", True),
    "-hier": ("--hier-thresh", True),
    "-iou_thresh": ("--iou-thresh", True),
    "-points": ("--points", True),
    "-map": ("--map", False),
    "-clear": ("--clear", False),
    "-gpus": ("--gpus", True),
    "-i": ("--gpu", True),
    "-ext_output": ("--ext-output", False),
    "-out": ("--json", True),  # or --out: see _split
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
    "-topk": (None, False),  # valid always prints top-1 and top-k
    "-s": (None, True),  # frame skip
    "-avg": (None, True),
    "-t": ("--top", True),
    "-save_labels": ("--save-txt", False),
    "-json_file_output": ("--json", True),
    "-letter_box": ("--letter-box", False),
    "-avgframes": (None, True),
    "-prefix": (None, True),
}

# Darknet's subcommand -> (ours, where DATA goes, the positional names after DATA CFG).
DETECTOR = {
    "train": "train",
    "test": "detect",
    "demo": "detect",
    "valid": "valid",
    "map": "map",
    "calc_anchors": "anchors",
}
CLASSIFIER = {"train": "train", "predict": "test", "test": "test", "valid": "valid"}


class DarknetFormError(Exception):
    """Darknet's form given with too few arguments, or an unknown subcommand."""


WINDOW = "nothing to do without a window"
NO_GPU = "no CUDA GPU here, so the CPU runs it, as a CPU build of Darknet ignores it"


def gpu_present():
    """Whether -i/-gpus can mean a GPU here (PyCUDA and a device); a CPU build of Darknet
    ignores them, and so do Darknet's forms on a machine without one."""
    from .backends import cuda_available

    return cuda_available()


def _split(args, sub=None):
    """(positionals, our options, dropped) from Darknet-form arguments of `detector SUB`;
    known fork flags are mapped, others (ours, or unknown ones that click then refuses)
    pass through. dropped: (flag, why) for each flag that does nothing here."""
    positionals, options, dropped = [], [], []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in FLAGS:
            ours, takes_value = FLAGS[arg]
            value = args[i + 1] if takes_value and i + 1 < len(args) else None
            if takes_value and value is None:
                raise DarknetFormError(f"{arg} needs a value")
            why = _why_dropped(arg, sub)
            if arg == "-out" and value.lower().endswith(".json"):
                # The fork's -out: its JSON results file, in its layout.
                ours = ["--json", value, "--json-format", "alexeyab"] if sub == "test" else ours
            elif arg == "-out":
                ours = "--out"  # pjreddie's -out names the picture
            if ours is None or why:
                dropped.append((f"{arg} {value}" if takes_value else arg, why or WINDOW))
            elif isinstance(ours, list):
                options += ours
            else:
                options += [ours] + ([value] if takes_value else [])
            i += 2 if takes_value else 1
        elif arg.startswith("-") and arg != "-":
            options.append(arg)
            # An option of ours with its value: keep the pair together.
            if (
                i + 1 < len(args)
                and not args[i + 1].startswith("-")
                and "=" not in arg
                and arg not in FLAG_OPTIONS
            ):
                options.append(args[i + 1])
                i += 1
            i += 1
        else:
            positionals.append(arg)
            i += 1
    return positionals, options, dropped


def _why_dropped(flag, sub):
    """Why a flag the fork reads does nothing in `detector SUB` here, or None."""
    if flag in ("-i", "-gpus") and not gpu_present():
        return NO_GPU
    if flag == "-gpus" and sub not in (None, "train"):
        return "the fork reads it in train only (-i picks the GPU)"
    if flag == "-hier" and sub not in ("test", "demo", None):
        return f"the fork's {sub} does not read it"
    if flag == "-letter_box" and sub in ("train", "calc_anchors"):
        return f"the fork's {sub} does not read it ([net] letter_box=1 is the cfg's)"
    return None


# Our options that take no value (so the argument after them is a positional).
FLAG_OPTIONS = {
    "--map",
    "--clear",
    "--overwrite",
    "--quiet",
    "--ext-output",
    "--darknet-order",
    "--train",
    "--layers",
    "--save-txt",
    "--letter-box",
    "-h",
    "--help",
}


def _need(positionals, count, usage):
    if len(positionals) < count:
        raise DarknetFormError(f"Darknet's form is `{usage}`")


STDIN_NOTE = (
    "no IMAGE",
    "image paths are read from stdin, one a line, as the fork's detector test does",
)
LETTER_BOX_NOTE = (
    "-letter_box",
    "letterboxes as asked, though the fork's own map and valid read only [net] letter_box=1",
)


def _detector(sub, rest):
    pos, opts, dropped = _split(rest, sub)
    ours = DETECTOR[sub]
    if sub == "calc_anchors":
        _need(pos, 1, "detector calc_anchors DATA [-num_of_clusters N -width W -height H]")
        # The fork writes (and replaces) anchors.txt in the current directory.
        return (
            ["anchors", pos[0]]
            + pos[1:]
            + opts
            + ["--out", "anchors.txt", "--counts-out", "counters_per_class.txt", "--overwrite"],
            dropped,
        )
    if sub == "train":
        _need(pos, 2, "detector train DATA CFG [WEIGHTS]")
        weights = ["--weights", pos[2]] if len(pos) > 2 else []
        return ["train", pos[1], pos[0]] + weights + pos[3:] + opts, dropped
    _need(
        pos,
        3,
        f"detector {sub} DATA CFG WEIGHTS"
        + (" [IMAGE]" if sub == "test" else " [VIDEO]" if sub == "demo" else ""),
    )
    data, cfg, weights, more = pos[0], pos[1], pos[2], pos[3:]
    if sub in ("map", "valid") and "-letter_box" in rest:
        dropped.append(LETTER_BOX_NOTE)
    if ours == "detect":
        if sub == "test" and not more:  # the fork's batch idiom: `... < images.txt`
            more = ["-"]
            dropped.append(STDIN_NOTE)
        return ["detect", cfg, weights] + more + ["--data", data] + opts, dropped
    return [ours, cfg, data, weights] + more + opts, dropped


def _classifier(sub, rest):
    pos, opts, dropped = _split(rest, sub)
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
RNN_FLAGS = {
    "-file": "TEXT",
    "-seed": "--seed-text",
    "-len": "--length",
    "-temp": "--temp",
    "-srand": "--srand",
    "-clear": "--clear",
}
RNN_DEFAULT_TEXT = "data/shakespeare.txt"  # Darknet's -file default


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
            if (
                arg != "-clear"
                and i + 1 < len(args)
                and not args[i + 1].startswith("-")
                and "=" not in arg
                and arg not in FLAG_OPTIONS
            ):
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
        if arg in FLAGS and arg != "-out":  # ours has --out (an image); the fork's is JSON
            ours, takes_value = FLAGS[arg]
            if takes_value and i + 1 >= len(args):
                raise DarknetFormError(f"{arg} needs a value")
            why = _why_dropped(arg, None)
            if ours is None or why:
                dropped.append((f"{arg} {args[i + 1]}" if takes_value else arg, why or WINDOW))
            else:
                out += [ours] + ([args[i + 1]] if takes_value else [])
            i += 2 if takes_value else 1
        else:
            out.append(arg)
            i += 1
    return out, dropped


HELP = ("-h", "--help")
# What `detector SUB --help` / `classifier SUB --help` says each form runs.
FORMS = {
    "detector": {
        "train": ("DATA CFG [WEIGHTS]", "train CFG DATA [--weights WEIGHTS]"),
        "test": (
            "DATA CFG WEIGHTS [IMAGE]",
            "detect CFG WEIGHTS IMAGE --data DATA (no IMAGE: paths from stdin, one a line)",
        ),
        "demo": (
            "DATA CFG WEIGHTS [VIDEO] [-c N]",
            "detect CFG WEIGHTS VIDEO --data DATA (or --camera N)",
        ),
        "valid": ("DATA CFG WEIGHTS", "valid CFG DATA WEIGHTS"),
        "map": ("DATA CFG WEIGHTS", "map CFG DATA WEIGHTS"),
        "calc_anchors": ("DATA [-num_of_clusters N]", "anchors DATA [--num N]"),
    },
    "classifier": {
        "train": ("DATA CFG [WEIGHTS]", "train CFG DATA [--weights WEIGHTS]"),
        "predict": ("DATA CFG WEIGHTS [IMAGE]", "test CFG WEIGHTS IMAGE --data DATA"),
        "test": ("DATA CFG WEIGHTS [IMAGE]", "test CFG WEIGHTS IMAGE --data DATA"),
        "valid": ("DATA CFG WEIGHTS", "valid CFG DATA WEIGHTS"),
    },
}


class DarknetFormHelp(DarknetFormError):
    """`detector --help` (or classifier's): no command to run, the text to print (exit
    code 0)."""


def form_help(head):
    """The help of Darknet's `detector` or `classifier` form."""
    forms = FORMS[head]
    width = max(len(f"{head} {sub} {usage}") for sub, (usage, _) in forms.items())
    lines = [
        f"Usage: darknet-py {head} {'|'.join(forms)} DATA CFG [WEIGHTS] ... [-flags]",
        "",
        f"Darknet's `{head}` forms, each run as darknet-py's own command:",
        "",
    ]
    lines += [
        f"  {f'{head} {sub} {usage}':<{width}}  ->  darknet-py {runs}"
        for sub, (usage, runs) in forms.items()
    ]
    mapped = [
        f"{flag} -> {ours}" + (" (a .json file; else --out)" if flag == "-out" else "")
        for flag, (ours, _) in FLAGS.items()
        if ours
    ]
    ignored = [flag for flag, (ours, _) in FLAGS.items() if not ours]
    lines += [""] + textwrap.wrap(
        "The fork's flags become darknet-py's options: " + ", ".join(mapped) + ".",
        88,
        break_on_hyphens=False,
    )
    lines += textwrap.wrap(
        "These do nothing without a window or server: " + ", ".join(ignored) + ".",
        88,
        break_on_hyphens=False,
    )
    lines += [
        "-i and -gpus are ignored on a machine without a CUDA GPU, as by a CPU build.",
        "",
        f"`darknet-py {head} SUBCOMMAND --help` shows the options of the command it runs.",
    ]
    return "\n".join(lines)


def translate(args):
    """(args in darknet-py's form, a note for the user or None). Raises DarknetFormError,
    or DarknetFormHelp for `detector --help`."""
    args = list(args)
    if not args:
        return args, None
    head, rest = args[0], args[1:]
    if head in ("detector", "classifier"):
        table = DETECTOR if head == "detector" else CLASSIFIER
        if not rest or rest[0] in HELP:
            raise DarknetFormHelp(form_help(head))
        if rest[0] not in table:
            raise DarknetFormError(
                f"`{head}` takes one of: {', '.join(table)} "
                f"(Darknet's `{head} SUBCOMMAND DATA CFG ...`)"
            )
        if any(a in HELP for a in rest[1:]):
            usage, runs = FORMS[head][rest[0]]
            return [table[rest[0]], "--help"], (
                f"`{head} {rest[0]} {usage}` runs `darknet-py {runs}`; its options:"
            )
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
        reasons = {}  # the flags of each reason, in the order given
        for flag, why in dropped:
            reasons.setdefault(why, []).append(flag)
        note += (
            " (" + "; ".join(f"{', '.join(flags)}: {why}" for why, flags in reasons.items()) + ")"
        )
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
                return (
                    line.startswith("[") if section else ("=" in line and not line.startswith("["))
                )
    except OSError:
        return False
    return False


def swapped_arguments(command, cfg, data):
    """The message for `train DATA CFG` (Darknet's order given to our command), or None."""
    if _looks_like(data, "cfg") and _looks_like(cfg, None):
        return (
            f"{cfg} is a .data file and {data} a .cfg: darknet-py's order is "
            f"`{command} CFG DATA ...` (Darknet's own `detector {command} DATA CFG ...` "
            f"works too)"
        )
    return None
