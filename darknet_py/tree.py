"""Softmax trees: Darknet's class hierarchies (tree.c), as YOLO9000 and the ImageNet-9k
classifiers use them.

A tree file has one class a line, `name parent`, the parent being the line index of an
earlier class or -1 for a root. Classes of one parent that follow each other form a
group: the network takes a softmax over each group instead of over all classes, so an
output is P(class | parent). Darknet starts a new group whenever the parent differs from
the previous line's, so siblings must be written together (a parent whose children are
split gets two groups, and only the last one counts as its children, as in Darknet).
"""

import os
from dataclasses import dataclass

import numpy as np

# Darknet's SECRET_NUM: a truth value meaning "no truth here" (fill_hierarchy writes it
# for every group that holds none of an image's classes; the loss ignores those outputs).
NO_TRUTH = -1234.0


class TreeError(Exception):
    """A tree file that cannot be read; str() names the file (and line)."""


@dataclass(frozen=True)
class Hierarchy:
    """A read tree file: per class its parent (-1 for a root), the group it belongs to,
    the group its children form (-1 for a leaf: Darknet's `child`) and whether it is a
    leaf; per group its first class and its size. Groups are in file order; group 0 is
    the roots'."""

    path: str
    names: tuple
    parent: np.ndarray
    group: np.ndarray
    child: np.ndarray
    leaf: np.ndarray
    group_offset: np.ndarray
    group_size: np.ndarray
    levels: tuple  # the non-root classes by depth, 1 first (arrays of class indexes)

    @property
    def n(self):
        return len(self.parent)

    @property
    def groups(self):
        return len(self.group_size)


def read_tree(path):
    """Read a Darknet tree file (tree.c's read_tree). A parent that is not an earlier line
    is refused: Darknet's products along the tree assume parents come first."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.split() for line in f.read().splitlines()]
    except OSError as e:
        raise TreeError(f"{path}: {e.strerror or e}") from None
    names, parents = [], []
    for number, fields in enumerate(lines, 1):
        if not fields:
            raise TreeError(f"{path}:{number}: empty line (expected 'name parent')")
        try:
            parent = int(fields[1]) if len(fields) > 1 else -1
        except ValueError:
            raise TreeError(f"{path}:{number}: parent '{fields[1]}' is not a line number") from None
        if not -1 <= parent < len(names):
            raise TreeError(
                f"{path}:{number}: parent {parent} is not an earlier line "
                f"(0..{len(names) - 1}) or -1"
            )
        names.append(fields[0])
        parents.append(parent)
    if not names:
        raise TreeError(f"{path}: no classes")
    return _hierarchy(os.fspath(path), names, parents)


def _hierarchy(path, names, parents):
    parent = np.array(parents, dtype=np.int64)
    n = len(parent)
    # A new group wherever the parent changes from the line before (read_tree's rule).
    starts = np.flatnonzero(np.concatenate([[True], parent[1:] != parent[:-1]]))
    group_size = np.diff(np.append(starts, n))
    group = np.repeat(np.arange(len(starts)), group_size)
    child = np.full(n, -1, dtype=np.int64)
    for g, first in enumerate(starts):  # the last group of a parent wins, as in C
        if parent[first] >= 0:
            child[parent[first]] = g
    leaf = np.ones(n, dtype=bool)
    leaf[parent[parent >= 0]] = False
    depth = np.zeros(n, dtype=np.int64)
    for j in np.flatnonzero(parent >= 0):  # parents come first (read_tree checks it)
        depth[j] = depth[parent[j]] + 1
    levels = tuple(np.flatnonzero(depth == d) for d in range(1, int(depth.max()) + 1))
    return Hierarchy(
        path,
        tuple(names),
        parent,
        group,
        child,
        leaf,
        starts.astype(np.int64),
        group_size.astype(np.int64),
        levels,
    )


def resolve_tree_path(value, cfg_path):
    """Where a tree= (or map=) path of a cfg is: as Darknet opens it, relative to the
    working directory; failing that, next to the cfg file. None when neither exists."""
    candidates = [value]
    if cfg_path and not os.path.isabs(value):
        candidates.append(os.path.join(os.path.dirname(os.fspath(cfg_path)), value))
    return next((c for c in candidates if os.path.isfile(c)), None)


def hierarchy_predictions(pred, hier, only_leaves=False):
    """Darknet's hierarchy_predictions on rows of class outputs (..., classes): each
    P(class | parent) times its parent's product, parents first, so every value becomes
    P(class); with only_leaves the inner classes are zeroed. Returns a new array."""
    p = np.array(pred, dtype=np.float32)
    # Darknet multiplies in class order; parents come before their children, so a level at
    # a time takes the same products (each parent's is final before its children use it).
    for level in hier.levels:
        p[..., level] *= p[..., hier.parent[level]]
    if only_leaves:
        p[..., ~hier.leaf] = 0
    return p


def hierarchy_top_prediction(pred, hier, thresh):
    """Darknet's hierarchy_top_prediction for one row of P(class) values (after
    hierarchy_predictions): from the roots down, the most likely child while the product of
    the chosen conditionals stays above thresh. Returns a class index."""
    p, group = np.float32(1), 0
    while True:
        first, size = hier.group_offset[group], hier.group_size[group]
        values = np.asarray(pred[first : first + size], dtype=np.float32)
        best = int(np.argmax(values))
        largest = values[best]
        # C's strict `val > max` from max = 0, max_i = 0: class 0 when no value is above 0.
        best_class = first + best if largest > 0 else 0
        largest = max(largest, np.float32(0))
        if p * largest > np.float32(thresh):
            p = p * largest
            group = hier.child[best_class]
            if group < 0:
                return int(best_class)
        elif group == 0:
            return int(best_class)
        else:
            return int(hier.parent[first])


def fill_hierarchy(truth, hier):
    """Darknet's fill_hierarchy on a classifier's truth rows (..., classes): every ancestor
    of a class set in a row is set too, and a group holding none of the row's classes gets
    NO_TRUTH, which the loss ignores. Returns a new float32 array."""
    t = np.array(truth, dtype=np.float32)
    flat = t.reshape(-1, t.shape[-1])
    for row in flat:
        classes = row[: hier.n]
        for level in reversed(hier.levels):  # deepest first: a set class sets its parent
            classes[hier.parent[level[classes[level] != 0]]] = 1
        empty = np.add.reduceat(classes != 0, hier.group_offset) == 0
        classes[np.repeat(empty, hier.group_size)] = NO_TRUTH
    return t


def tree_option(section, key="tree"):
    """The Hierarchy a cfg section's tree= names, or None without one; a file that is
    missing or malformed is the section's error (file, line, key)."""
    value = section.get_str(key)
    if value is None:
        return None
    path = resolve_tree_path(value, section.path)
    if path is None:
        raise section.error(
            f"{value}: no such file (looked in the working directory, as "
            f"Darknet does, and next to the cfg)",
            key,
        )
    try:
        return read_tree(path)
    except TreeError as e:
        raise section.error(str(e), key) from None


def int_array(be, values):
    """A backend integer array (int_zeros) holding values."""
    arr = be.int_zeros(len(values))
    be.write(arr, np.asarray(values))
    return arr


class TreeArrays:
    """A hierarchy as backend integer arrays: per group its first class and size (the
    softmax_tree op), per class its parent and group (the region loss)."""

    def __init__(self, be, hier):
        self.offset = int_array(be, hier.group_offset)
        self.size = int_array(be, hier.group_size)
        self.parent = int_array(be, hier.parent)
        self.group = int_array(be, hier.group)
        self.classes = hier.n
