"""Dataset description files: .data files (Darknet's key=value options), list files
(one image path a line) and names files (one class name a line)."""

import os
from dataclasses import dataclass, field

from ..cfg import CfgError, read_data_file
from ..errors import DarknetError
from ..names import data_file_path


class DataError(DarknetError):
    """A problem with a dataset file; the message names the file (and line where known)."""


def _where(path):
    """A path as the user wrote it, plus where a relative one was looked for."""
    path = os.fspath(path)
    if os.path.isabs(path):
        return path
    return f"{path} (relative to {os.getcwd()})"


def _read_text(path, what):
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isfile(path) and not os.path.isdir(path):
        # a named pipe would block the read until someone writes to it
        raise DataError(f"{_where(path)}: {what} is not a regular file (a pipe, socket or device)")
    try:
        # surrogateescape keeps non-UTF-8 bytes in paths intact on the round trip to open()
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            return f.read()
    except FileNotFoundError:
        raise DataError(f"{_where(path)}: {what} not found") from None
    except IsADirectoryError:
        raise DataError(f"{_where(path)}: {what} is a directory, expected a file") from None
    except OSError as e:
        raise DataError(f"{_where(path)}: cannot read {what}: {e.strerror}") from None


def read_list(path, what="list file"):
    """Lines of a Darknet list file (image paths, class names): CRLF or LF, surrounding
    whitespace removed, blank lines skipped (Darknet would keep a blank line as an empty
    path or, in a names file, as an empty label that matches every path)."""
    lines = _read_text(path, what).splitlines()
    for lineno, line in enumerate(lines, start=1):
        if "\0" in line:  # open() would fail on such a path with "embedded null byte"
            raise DataError(f"{path}:{lineno}: holds a NUL byte: not a text {what}")
    return [s for s in (line.strip() for line in lines) if s]


@dataclass
class DataConfig:
    """A parsed .data file. Paths are kept as written: relative ones are relative to the
    current directory, as in Darknet."""

    path: str
    classes: int
    train: str
    valid: str
    names_path: str  # display names (``names=``, else ``labels=``)
    labels_path: str  # strings matched against classifier paths (``labels=``, else ``names=``)
    backup: str
    top: int
    names: list
    labels: list
    options: dict = field(default_factory=dict)  # every key=value, as strings

    def train_paths(self):
        return read_list(self.train, "train list")

    def valid_paths(self):
        return read_list(self.valid, "valid list")


def load_data_config(path, require=()):
    """Read a Darknet .data file and its names file.

    Keys and defaults as Darknet: classes, train (data/train.list), valid (defaults to
    train), names / labels (either serves for both), backup (/backup/), top (1). Darknet
    defaults a missing ``classes`` to 2; here it defaults to the number of names, which is
    what that default is meant to stand for. ``require`` lists keys among "train", "valid"
    whose files must exist now (detection-only use of a .data needs no training list).
    Raises DataError naming the file for anything missing or malformed.
    """
    path = os.fspath(path)
    try:
        options = read_data_file(path)
    except CfgError as e:
        if not os.path.exists(path):
            raise DataError(f"{_where(path)}: .data file not found") from None
        raise DataError(str(e)) from None

    train = options.get("train", "data/train.list")
    valid = options.get("valid", train)
    # Relative to the current directory as in Darknet, else beside the .data file.
    names_path = data_file_path(
        options.get("names") or options.get("labels") or "data/names.list", path
    )
    labels_path = data_file_path(
        options.get("labels") or options.get("names") or "data/labels.list", path
    )
    backup = options.get("backup", "/backup/")

    def int_option(key, default):
        if key not in options:
            return default
        try:
            return int(options[key])
        except ValueError:
            raise DataError(f"{path}: {key}: expected an integer, got '{options[key]}'") from None

    if "names" not in options and "labels" not in options:
        raise DataError(f"{path}: no names= (or labels=) file given")
    names = _read_names(names_path, path)
    labels = names if labels_path == names_path else _read_names(labels_path, path)
    classes = int_option("classes", len(names))
    top = int_option("top", 1)
    if classes <= 0:
        raise DataError(f"{path}: classes: must be positive, got {classes}")
    for what, lst, p in (("names", names, names_path), ("labels", labels, labels_path)):
        if len(lst) < classes:
            raise DataError(f"{_where(p)}: {len(lst)} {what} for classes={classes} given in {path}")
    # Darknet uses the first `classes` entries and ignores the rest.
    names, labels = names[:classes], labels[:classes]

    for key in require:
        if key not in ("train", "valid"):
            raise ValueError(f"require: unknown key {key!r}")
        p = train if key == "train" else valid
        if not os.path.isfile(p):
            raise DataError(f"{_where(p)}: {key} list not found (given in {path})")

    return DataConfig(
        path=path,
        classes=classes,
        train=train,
        valid=valid,
        names_path=names_path,
        labels_path=labels_path,
        backup=backup,
        top=top,
        names=names,
        labels=labels,
        options=dict(options),
    )


def _read_names(names_path, data_path):
    try:
        return read_list(names_path, "names file")
    except DataError as e:
        raise DataError(f"{e} (given in {data_path})") from None
