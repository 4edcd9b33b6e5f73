"""A detector dataset's labels checked before they are used: every box whose coordinates are
not what YOLO labels hold (relative 0-1 centre and size), classes out of range, malformed
lines and missing label files, each named by file and line, plus the totals.

Pixel coordinates (``0 220 63 24 16`` for a 0-1 ``0 0.43 0.12 0.05 0.03``) are the costly
mistake: Darknet clips such boxes to the image, the [yolo] loss then finds no truth in any
cell (``count: 0``) and a run trains to nothing without an error. train and anchors refuse
a dataset in which most boxes look so; `check` reports them all.
"""

import os
from collections import Counter
from dataclasses import dataclass, field

import numpy as np

from ..plurals import counted
from .config import DataError, _read_text
from .labels import RULE_NAMES, find_label_file, is_fork_rule, label_candidates

# A coordinate this far past 1 is not a rounding slip at the image border: it is pixels.
PIXEL_LIKE = 1.5
# Rounding in label tools puts centres and sizes a hair outside [0, 1]; that is fine.
SLACK = 1e-3
# How many problems of each kind are printed one a line; the rest are counted.
SHOWN_PER_KIND = 10

FIX_PIXELS = (
    "YOLO labels are relative: divide x and w by the image width, y and h by its height (each 0-1)"
)

# Each kind's noun, singular and plural, for the counts ("1 malformed line").
KINDS = {
    "pixels": (
        "box whose coordinates look like pixels (YOLO labels are 0-1)",
        "boxes whose coordinates look like pixels (YOLO labels are 0-1)",
    ),
    "range": ("box with coordinates outside 0-1", "boxes with coordinates outside 0-1"),
    "class": ("class id out of range", "class ids out of range"),
    "size": ("box of zero or negative size", "boxes of zero or negative size"),
    "format": ("malformed line", "malformed lines"),
    "missing": ("label file not found", "label files not found"),
    "unreadable": ("unreadable label file", "unreadable label files"),
    "path": (
        "image path names no class, or several (a classifier's label)",
        "image paths name no class, or several (a classifier's label)",
    ),
}
# Problems whose line is still a box of its class (Darknet clips it to the image): counted
# in the boxes and per class. A malformed line, a class id out of range and a box without
# size are counted by neither (Darknet skips or drops them).
BOX_KINDS = ("pixels", "range")


@dataclass
class LabelProblem:
    path: str
    line: int  # 0 for a problem with the whole file
    kind: str  # a key of KINDS
    message: str

    def __str__(self):
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


@dataclass
class LabelReport:
    """What the scan of a list of detector images found."""

    images: int = 0
    label_files: int = 0
    empty_files: int = 0
    boxes: int = 0  # the boxes of a class: sum(per_class.values())
    per_class: Counter = field(default_factory=Counter)
    problems: list = field(default_factory=list)
    rows: list = field(default_factory=list)  # (n, 5) float64 arrays: class x y w h
    classifier: bool = False  # labels are image paths (boxes counts the images)
    first_label: str = None  # the label file looked for for the first image
    darknet: str = "original"  # whose label-path rule was followed (labels.find_label_file)
    # rule -> how many images had their label file where only that other rule puts it, and
    # the first such (image, label path)
    found_elsewhere: Counter = field(default_factory=Counter)
    first_elsewhere: dict = field(default_factory=dict)
    looked_for: list = field(default_factory=list)  # the first image's [(rule, path)]

    def count(self, kind):
        return sum(1 for p in self.problems if p.kind == kind)

    def pixel_share(self):
        return self.count("pixels") / self.boxes if self.boxes else 0.0

    def box_array(self):
        """Every well-formed box, (n, 5) float64: class, x, y, w, h."""
        return np.concatenate(self.rows) if self.rows else np.zeros((0, 5))


def check_label_line(fields, classes):
    """(kind, message) for a label line's fields, or None when the box is sound."""
    if len(fields) != 5:
        return "format", f"expected 'class x y w h' (5 fields), got {len(fields)}"
    try:
        cls = int(fields[0])
        x, y, w, h = (float(v) for v in fields[1:])
    except ValueError:
        return "format", f"expected a whole class id and 4 numbers, got '{' '.join(fields)}'"
    if not all(np.isfinite((x, y, w, h))):
        return "format", f"x y w h must be finite numbers, got '{' '.join(fields[1:])}'"
    if cls < 0 or (classes is not None and cls >= classes):
        top = f"0..{classes - 1}" if classes is not None else "0 or more"
        return "class", f"class id {cls} out of range ({top})"
    values = f"x={fields[1]} y={fields[2]} w={fields[3]} h={fields[4]}"
    if max(x, y, w, h) > PIXEL_LIKE:
        return "pixels", f"{values} look like pixels; {FIX_PIXELS}"
    if w <= 0 or h <= 0:
        return "size", f"box size w={fields[3]} h={fields[4]} is not positive"
    if min(x, y, w, h) < -SLACK or max(x, y, w, h) > 1 + SLACK:
        return "range", f"{values}: outside 0-1 (Darknet clips the box to the image)"
    return None


def scan_label_file(path, classes, report):
    """Add one label file's boxes and problems to report."""
    text = _read_text(path, "label file")
    if "\0" in text:
        report.problems.append(
            LabelProblem(path, 0, "unreadable", "holds NUL bytes (not a text label file)")
        )
        return
    good = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        fields = raw.split()
        if not fields:
            continue
        found = check_label_line(fields, classes)
        if found is not None:
            report.problems.append(LabelProblem(path, lineno, *found))
            if found[0] not in BOX_KINDS:
                continue  # no box of a class: the totals and the class table agree
        else:
            good.append([float(v) for v in fields])
        report.boxes += 1
        report.per_class[int(fields[0])] += 1
    if good:
        report.rows.append(np.array(good, dtype=np.float64))
    elif not text.strip():
        report.empty_files += 1


def scan_labels(image_paths, classes=None, darknet="original"):
    """Scan the label file of every image (found by labels.find_label_file for the Darknet
    of flavour `darknet`) into a LabelReport."""
    report = LabelReport(images=len(image_paths), darknet=darknet)
    own = "alexeyab" if is_fork_rule(darknet) else "original"
    for image in image_paths:
        try:
            rule, path = find_label_file(image, darknet)
            if not report.looked_for:
                report.looked_for = label_candidates(image, darknet)
        except DataError as e:
            report.problems.append(LabelProblem(os.fspath(image), 0, "missing", str(e)))
            continue
        report.first_label = report.first_label or path
        if not os.path.isfile(path):
            report.problems.append(
                LabelProblem(path, 0, "missing", f"label file not found (for image {image})")
            )
            continue
        if rule != own:
            report.found_elsewhere[rule] += 1
            report.first_elsewhere.setdefault(rule, (os.fspath(image), path))
        report.label_files += 1
        try:
            scan_label_file(path, classes, report)
        except DataError as e:
            report.problems.append(LabelProblem(path, 0, "unreadable", str(e)))
    return report


def label_location_line(report):
    """One line when some label files were found only where the flavour's own rule does not
    look (with how many images have none anywhere); None when the rule found them all."""
    if not report.found_elsewhere:
        return None
    own = "alexeyab" if is_fork_rule(report.darknet) else "original"
    moved = sum(report.found_elsewhere.values())
    places = "; ".join(
        f"{count} by {RULE_NAMES[rule]}, e.g. {report.first_elsewhere[rule][1]}"
        for rule, count in report.found_elsewhere.most_common()
    )
    missing = report.count("missing")
    return (
        f"labels: {moved} of {counted(report.images, 'image')} "
        f"{'has' if moved == 1 else 'have'} no label file where {RULE_NAMES[own]} looks; "
        f"found {places}; reading those; {counted(missing, 'image')} "
        f"{'has' if missing == 1 else 'have'} no label file anywhere"
    )


def refuse_no_label_files(report, what="training"):
    """DataError when not one image of a detector list has a label file anywhere."""
    if report.images and not report.label_files and report.looked_for:
        where = ", ".join(f"{path} ({RULE_NAMES[rule]})" for rule, path in report.looked_for)
        raise DataError(
            f"none of the {counted(report.images, f'{what} image')} has a label "
            f"file; for the first image they were looked for at {where}"
        )


def problem_lines(report, shown=SHOWN_PER_KIND, kinds=None):
    """Warning lines: up to `shown` problems of each kind, one a line, then one count line
    per kind that had more, then the summary (None when there is nothing to say)."""
    lines, by_kind = [], Counter()
    for problem in report.problems:
        if kinds is not None and problem.kind not in kinds:
            continue
        by_kind[problem.kind] += 1
        if by_kind[problem.kind] <= shown:
            lines.append(str(problem))
    for kind, count in by_kind.items():
        if count > shown:
            lines.append(f"... and {count - shown} more {KINDS[kind][1]}")
    if by_kind:
        lines.append(summary_line(report, by_kind))
    return lines


def summary_line(report, by_kind=None):
    by_kind = by_kind if by_kind is not None else Counter(p.kind for p in report.problems)
    parts = [counted(count, *KINDS[kind]) for kind, count in sorted(by_kind.items())]
    images = counted(report.images, "image")
    if report.classifier:
        return f"labels of {images}: " + "; ".join(parts)
    skipped = sum(1 for p in report.problems if p.line and p.kind not in BOX_KINDS)
    uncounted = f" ({counted(skipped, 'line')} not counted)" if skipped else ""
    return f"labels of {images}: {counted(report.boxes, 'box', 'boxes')}{uncounted}; " + "; ".join(
        parts
    )


def refuse_pixel_labels(report, what="training"):
    """DataError when most boxes look like pixel coordinates: nothing would be learnt."""
    pixels = report.count("pixels")
    if report.boxes and pixels * 2 > report.boxes:
        first = next(p for p in report.problems if p.kind == "pixels")
        raise DataError(
            f"{pixels} of the {counted(report.boxes, 'box', 'boxes')} in the "
            f"{what} labels {'looks' if pixels == 1 else 'look'} like pixel "
            f"coordinates (first: {first.path}:{first.line}); {FIX_PIXELS}. "
            f"`darknet-py check DATA` lists them all"
        )


def refuse_unlabelled(report, what="validation"):
    """DataError when the scanned images hold not one labelled box (a mAP of such a set is
    0 whatever the weights): refuse_no_label_files' line where there is no label file,
    else one saying what the files hold."""
    if report.boxes:
        return
    refuse_no_label_files(report, what)
    if not report.label_files:  # not even a label path came of the image names
        raise DataError(
            f"none of the {counted(report.images, f'{what} image')} has a label "
            f"file (none could be derived from the image names)"
        )
    missing = sum(1 for p in report.problems if p.kind == "missing")
    raise DataError(
        f"none of the {counted(report.images, f'{what} image')} has a labelled "
        f"box ({counted(missing, 'label file')} missing; of the "
        f"{report.label_files} found, "
        f"{report.empty_files} empty, the others without a sound 'class x y w "
        f"h' line; the first image's at {report.first_label})"
    )


def check_detector_dataset(
    image_paths, classes, warn, what="training", kinds=None, darknet="original"
):
    """Scan, say where label files were found when the flavour's rule did not find them
    (one line), warn (one line per problem, capped, and a summary), and refuse a dataset
    without a single label file or whose boxes are mostly pixels. Missing label files are
    otherwise left to the data loader, which sums them up in its own warning. Returns the
    LabelReport."""
    report = scan_labels(image_paths, classes, darknet)
    refuse_no_label_files(report, what)
    located = label_location_line(report)
    if located is not None:
        warn(located)
    kinds = kinds or set(KINDS) - {"missing"}
    for line in problem_lines(report, kinds=kinds):
        warn(line)
    refuse_pixel_labels(report, what)
    return report
