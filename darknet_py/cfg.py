"""Darknet .cfg parser.

A cfg is a list of ``[section]`` headers, each followed by ``key=value`` lines.
Comments start with ``#`` or ``;``; spaces anywhere in a line are ignored (as
Darknet strips them). Values are read lazily and typed by the layer that asks
for them, so every error can name the file, line and key. Options a layer never
reads are reported as warnings with their line, since they are usually typos.
"""

import math
import os
import re
import stat
import warnings

from .errors import DarknetError, DarknetWarning

# Darknet's section names and their aliases -> canonical type.
SECTION_ALIASES = {
    "net": "net",
    "network": "net",
    "conv": "convolutional",
    "convolutional": "convolutional",
    "conn": "connected",
    "connected": "connected",
    "max": "maxpool",
    "maxpool": "maxpool",
    "avg": "avgpool",
    "avgpool": "avgpool",
    "soft": "softmax",
    "softmax": "softmax",
    "dropout": "dropout",
    "cost": "cost",
    "route": "route",
    "shortcut": "shortcut",
    "upsample": "upsample",
    "reorg": "reorg",
    "crop": "crop",
    "local": "local",
    "batchnorm": "batchnorm",
    "yolo": "yolo",
    "region": "region",
    "detection": "detection",
    # the AlexeyAB fork's ([reorg3d] is its new reorg; its [reorg] is the original's)
    "sam": "sam",
    "scale_channels": "scale_channels",
    "local_avgpool": "local_avgpool",
    "local_avg": "local_avgpool",
    "reorg3d": "reorg3d",
    "empty": "empty",
    "silence": "empty",
    "gaussian_yolo": "gaussian_yolo",
    "activation": "activation",
    "logistic": "logistic",
    "l2norm": "l2norm",
    "lrn": "normalization",
    "normalization": "normalization",
    "deconv": "deconvolutional",
    "deconvolutional": "deconvolutional",
    "rnn": "rnn",
    "gru": "gru",
    "lstm": "lstm",
    "crnn": "crnn",
    "conv_lstm": "conv_lstm",
    "history": "history",
    "implicit": "implicit",
}
# Darknet sections darknet-py knows but does not implement: a clear error, not "unknown".
UNSUPPORTED_SECTIONS = {
    "reorg_old",
    # the AlexeyAB fork's contrastive layer, and implicit layers of its later versions
    "contrastive",
    "implicit_add",
    "implicit_mul",
}

# What C's atof reads at the start of a value (atoi reads a prefix of it): a decimal number
# with an optional exponent, or inf/nan, which are refused once read.
FLOAT_TEXT = re.compile(
    r"[+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan)", re.IGNORECASE
)
INT_MIN, INT_MAX = -(2**31), 2**31 - 1
BOM = "\ufeff"


class CfgError(DarknetError):
    """A problem in a cfg file; str() reads 'file:line: key: message'."""

    def __init__(self, message, path=None, line=None, key=None):
        self.path, self.line, self.key, self.message = path, line, key, message
        where = os.fspath(path) if path else "<cfg>"
        if line is not None:
            where += f":{line}"
        super().__init__(f"{where}: {key + ': ' if key else ''}{message}")


class CfgWarning(DarknetWarning):
    pass


class Option:
    __slots__ = ("key", "value", "line", "used")

    def __init__(self, key, value, line):
        self.key, self.value, self.line, self.used = key, value, line, False


class Section:
    """One ``[type]`` block: typed getters with Darknet defaults, and error context."""

    def __init__(self, type_, header, path, line):
        self.type = type_  # canonical type, e.g. "convolutional"
        self.header = header  # as written, e.g. "conv"
        self.path = path
        self.line = line
        self.options = {}  # key -> Option

    def __repr__(self):
        return f"Section([{self.header}] at {self.path}:{self.line})"

    def error(self, message, key=None):
        opt = self.options.get(key) if key else None
        return CfgError(message, self.path, opt.line if opt else self.line, key)

    def warn(self, message, key=None):
        """A CfgWarning naming the file and the line of `key` (or of the section)."""
        opt = self.options.get(key) if key else None
        where = f"{self.path}:{opt.line if opt else self.line}: " + (f"{key}: " if key else "")
        warnings.warn(CfgWarning(where + message), stacklevel=3)

    def has(self, key):
        return key in self.options

    def _raw(self, key):
        opt = self.options.get(key)
        if opt is None:
            return None
        opt.used = True
        return opt.value

    def get_str(self, key, default=None):
        v = self._raw(key)
        return default if v is None else v

    def _number(self, key, text, cast, item=None):
        """Darknet's atoi/atof reading of one value: the leading number counts and the rest is
        ignored (with a warning: `filters=40#32` is 40, as stock AlexeyAB cfgs rely on).
        Infinities, NaN and ints outside C's int range are errors, as nothing sensible
        follows from them. `item` is the full list value, for messages about list items."""
        kind = "an integer" if cast is int else "a number"
        shown = text if item is None else item
        whole = FLOAT_TEXT.fullmatch(text)
        lead = whole or FLOAT_TEXT.match(text)
        if lead is None:
            what = kind if item is None else f"a comma-separated list of {kind.split()[-1]}s"
            raise self.error(f"expected {what}, got '{shown}'", key)
        number = lead.group(0)
        value = float(number)
        if not math.isfinite(value):
            raise self.error(f"expected a finite number, got '{shown}'", key)
        if cast is int:
            if value != int(value):
                raise self.error(f"expected an integer, got '{shown}'", key)
            value = int(value)
            if not INT_MIN <= value <= INT_MAX:
                raise self.error(
                    f"{value} is out of range (Darknet reads a C int: at most {INT_MAX})", key
                )
        if not whole:
            self._warn_ignored(key, shown, number)
        return value

    def _warn_ignored(self, key, shown, number):
        opt = self.options.get(key)
        line = opt.line if opt else self.line
        warnings.warn(
            CfgWarning(
                f"{self.path}:{line}: {key}: '{shown}' read as {number} (the text after the "
                f"number is ignored, as Darknet does)"
            ),
            stacklevel=3,
        )

    def _get_number(self, key, default, cast):
        v = self._raw(key)
        if v is None:
            if default is None:
                raise self.error(f"required option missing in [{self.header}]", key)
            return cast(default)
        return self._number(key, v, cast)

    def get_int(self, key, default=None):
        return self._get_number(key, default, int)

    def get_float(self, key, default=None):
        return self._get_number(key, default, float)

    def get_list(self, key, cast, default=None):
        """A comma-separated list of numbers; each item is read as get_int/get_float read a
        value (Darknet's route layers= and anchors= read item by item with atoi/atof), so
        `layers=-1,180###P6` is [-1, 180] with a warning."""
        v = self._raw(key)
        if v is None:
            return default
        items = [s for s in v.split(",") if s != ""]
        return [self._number(key, s, cast, item=v) for s in items]

    def get_int_list(self, key, default=None):
        return self.get_list(key, int, default)

    def get_float_list(self, key, default=None):
        return self.get_list(key, float, default)

    def unused(self):
        return [o for o in self.options.values() if not o.used]

    def warn_unused(self):
        for o in self.unused():
            warnings.warn(
                CfgWarning(
                    f"{self.path}:{o.line}: {o.key}: option not used by [{self.header}] (a typo?)"
                ),
                stacklevel=2,
            )


def parse_cfg_text(text, path="<cfg>"):
    """Parse cfg text into a list of Sections (the first is normally [net])."""
    sections = []
    current = None
    # A UTF-8 byte-order mark (left by Windows editors) is not part of the first line.
    for lineno, raw in enumerate(text.removeprefix(BOM).splitlines(), start=1):
        line = "".join(raw.split())  # Darknet strips all whitespace
        if not line or line[0] in "#;":
            continue
        if line[0] == "[":
            if not line.endswith("]") or len(line) < 3:
                raise CfgError(f"malformed section header '{raw.strip()}'", path, lineno)
            header = line[1:-1]
            name = header.lower()
            if name in UNSUPPORTED_SECTIONS:
                raise CfgError(
                    f"section [{header}] is a Darknet layer darknet-py does not support",
                    path,
                    lineno,
                )
            if name not in SECTION_ALIASES:
                raise CfgError(f"unknown section [{header}]", path, lineno)
            current = Section(SECTION_ALIASES[name], header, path, lineno)
            sections.append(current)
            continue
        if "=" not in line:
            raise CfgError(f"malformed line '{raw.strip()}' (expected key=value)", path, lineno)
        key, value = line.split("=", 1)
        if not key:
            raise CfgError(f"malformed line '{raw.strip()}' (empty key)", path, lineno)
        if current is None:
            raise CfgError("option before the first [section]", path, lineno, key)
        if key in current.options:  # the message names the file and line itself
            warnings.warn(  # noqa: B028
                CfgWarning(
                    f"{path}:{lineno}: {key}: repeated; this value replaces "
                    f"line {current.options[key].line}"
                )
            )
        current.options[key] = Option(key, value, lineno)
    if not sections:
        raise CfgError("no sections found", path)
    return sections


# The largest stock cfg is ~30 KB; a file far beyond this is not a cfg (or is /dev/zero).
MAX_CFG_BYTES = 16 << 20


def read_small_text(path, what="file"):
    """A cfg or .data file's text: only a regular file is opened (a named pipe would block),
    at most MAX_CFG_BYTES are read, NUL bytes are refused. CfgError names the path."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise CfgError("file not found", path) from None
    except OSError as e:
        raise CfgError(f"cannot read: {e.strerror}", path) from None
    if stat.S_ISDIR(mode):
        raise CfgError(f"is a directory, not a {what}", path)
    if not stat.S_ISREG(mode):
        raise CfgError(
            f"not a regular file (a pipe, socket or device); give the {what} as a file", path
        )
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_CFG_BYTES + 1)
    except OSError as e:
        raise CfgError(f"cannot read: {e.strerror}", path) from None
    if len(data) > MAX_CFG_BYTES:
        raise CfgError(f"larger than {MAX_CFG_BYTES >> 20} MiB: not a Darknet {what}", path)
    if b"\0" in data:
        raise CfgError(
            f"holds NUL bytes: not a text {what}", path, data[: data.index(b"\0")].count(b"\n") + 1
        )
    return data.decode("utf-8", errors="replace")


def parse_cfg(path):
    path = os.fspath(path)
    return parse_cfg_text(read_small_text(path, "cfg"), path)


def read_data_file(path):
    """Read a Darknet .data / options file (key=value lines) into a dict of str."""
    path = os.fspath(path)
    lines = read_small_text(path, ".data file").splitlines()
    options = {}
    if lines:
        lines[0] = lines[0].removeprefix(BOM)
    for lineno, raw in enumerate(lines, start=1):
        line = "".join(raw.split())
        if not line or line[0] in "#;":
            continue
        if "=" not in line:
            raise CfgError(f"malformed line '{raw.strip()}' (expected key=value)", path, lineno)
        key, value = line.split("=", 1)
        options[key] = value
    return options
