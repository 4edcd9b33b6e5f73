"""Class names: from a names file, a .data file's names= (or labels=), or found for the user.

Darknet resolves a .data file's relative names= path against the current directory (its
cfg/coco.data says names=data/coco.names, run from the Darknet folder). Here that is tried
first; a path that does not exist there is looked for beside the .data file, and an error
says which .data file the path came from.
"""

import os

from .cfg import CfgError, read_data_file
from .errors import DarknetError

NAMES_SUFFIXES = (".names",)


class NamesError(DarknetError):
    """A names file that is missing, unreadable or empty; the message names its path and
    where the path came from."""


def read_names(path, came_from=None):
    """Class names, one a line (Darknet's get_labels); trailing blank lines dropped."""
    path = os.fspath(path)
    origin = f" (given as names= in {came_from})" if came_from else ""
    try:
        if not os.path.isfile(path):
            raise NamesError(
                f"{path}: names file not found{origin}"
                if not os.path.exists(path)
                else f"{path}: not a regular file{origin}"
            )
        with open(path, "rb") as f:
            data = f.read(1 << 24)
    except OSError as e:
        raise NamesError(f"{path}: cannot read the names file{origin}: {e.strerror}") from None
    names = data.decode("utf-8", errors="replace").replace("\0", "").splitlines()
    while names and not names[-1].strip():
        names.pop()
    if not names:
        raise NamesError(f"{path}: the names file is empty{origin}")
    return [n.strip() for n in names]


def data_file_path(value, data_file):
    """A path from a .data file: relative to the current directory, as in Darknet; one that
    is not there but is beside the .data file is taken from there."""
    if os.path.isabs(value) or os.path.exists(value):
        return value
    beside = os.path.join(os.path.dirname(os.path.abspath(data_file)), value)
    return beside if os.path.exists(beside) else value


def names_from_data(data_file, data=None):
    """(names or None, the path they came from) for a .data file's names= (else labels=)."""
    if data is None:
        try:
            data = read_data_file(data_file)
        except CfgError as e:
            raise NamesError(str(e)) from None
    value = data.get("names") or data.get("labels")
    if not value:
        return None, None
    path = data_file_path(value, data_file)
    return read_names(path, came_from=data_file), path


def load_names(names):
    """names for load_network / Network.names: a list (kept), a .data file (its names=), or
    a names file; None stays None."""
    if names is None or isinstance(names, (list, tuple)):
        return None if names is None else [str(n) for n in names]
    path = os.fspath(names)
    if path.endswith(".data"):
        found, _ = names_from_data(path)
        if found is None:
            raise NamesError(f"{path}: no names= (or labels=) key")
        return found
    return read_names(path)


def find_names(classes, *beside):
    """A names file for a user who gave none: <stem>.names beside the weights or the cfg,
    then, for 80 classes, coco.names there or Darknet's data/coco.names. Returns the path or
    None."""
    candidates = []
    for path in beside:
        if path:
            stem = os.path.splitext(os.fspath(path))[0]
            candidates.append(stem + ".names")
    if classes == 80:
        candidates += [
            os.path.join(os.path.dirname(os.fspath(p)), "coco.names") for p in beside if p
        ] + [os.path.join("data", "coco.names")]
    for candidate in candidates:
        if os.path.isfile(candidate):
            try:
                if len(read_names(candidate)) == classes:
                    return candidate
            except NamesError:
                continue
    return None
