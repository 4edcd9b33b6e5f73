"""`darknet-py check DATA`: what a detector dataset holds and what is wrong with it, before
a training run finds out: images and label files of the train and valid lists, boxes per
class, every label problem by file and line (data/check.py), missing images and those whose
header says they cannot be decoded, and a labels overview picture (boxes per class, box
centres, box sizes).
"""

import os
from collections import Counter

from .data.check import (
    LabelProblem,
    LabelReport,
    label_location_line,
    problem_lines,
    refuse_no_label_files,
    scan_labels,
)
from .data.config import DataError, load_data_config
from .data.labels import classifier_label_index
from .files import atomic_output
from .image import header_problem
from .plurals import counted


def is_classifier_data(config):
    """A classifier's .data names its classes with labels= (matched against image paths);
    a detector's with names=."""
    return "labels" in config.options and "names" not in config.options


def classifier_report(paths, labels):
    """A LabelReport for a classifier list: one 'box' per image, its class found in its path
    (Darknet's rule); an image whose path names no class, or several, is a problem."""
    report = LabelReport(
        images=len(paths), label_files=len(paths), boxes=len(paths), classifier=True
    )
    for path in paths:
        try:
            report.per_class[classifier_label_index(path, labels)] += 1
        except DataError as e:
            report.problems.append(LabelProblem(path, 0, "path", str(e).split(": ", 1)[-1]))
    return report


def missing_images(paths):
    return [p for p in paths if not os.path.isfile(p)]


def unreadable_images(paths):
    """[(path, why)] for the images whose header says they cannot be decoded (an empty
    file, a text file named .jpg): training would skip them. Only the headers are read, so
    a list of thousands is checked in a moment."""
    found = []
    for path in paths:
        why = header_problem(path)
        if why is not None:
            found.append((path, why))
    return found


def check_dataset(data, picture=None, log=print, warn=print, darknet="original"):
    """Report on DATA's train and valid lists (detector labels found by the label-path
    rule of the Darknet of flavour `darknet`, see data.labels.find_label_file); write the
    overview picture to `picture` (a path, or None). Returns the number of problems found
    (0: the dataset looks sound); a list without a single label file is refused."""
    config = load_data_config(data)
    lists = [("train", config.train)]
    if config.valid != config.train:
        lists.append(("valid", config.valid))
    reports, problems = {}, 0
    for what, path in lists:
        if not os.path.isfile(path):
            warn(f"{path}: {what} list not found (given in {data})")
            problems += 1
            continue
        paths = config.train_paths() if what == "train" else config.valid_paths()
        absent = missing_images(paths)
        missing = set(absent)
        unreadable = unreadable_images([p for p in paths if p not in missing])
        report = (
            classifier_report(paths, config.labels)
            if is_classifier_data(config)
            else scan_labels(paths, config.classes, darknet)
        )
        if not is_classifier_data(config):
            refuse_no_label_files(report, what)
            located = label_location_line(report)
            if located is not None:
                warn(located)
        reports[what] = report
        log(
            f"{what}: {path}: {counted(len(paths), 'image')} ({len(absent)} missing"
            f"{f', {len(unreadable)} unreadable' if unreadable else ''})"
            + (
                ""
                if is_classifier_data(config)
                else f", {counted(report.label_files, 'label file')} ({report.empty_files} empty), "
                f"{counted(report.boxes, 'box', 'boxes')}"
            )
        )
        for image in absent[:10]:
            warn(f"{image}: image not found (listed in {path})")
        if len(absent) > 10:
            warn(f"... and {counted(len(absent) - 10, 'more image')} not found")
        for image, why in unreadable[:10]:
            warn(f"{image}: {why}; training skips it (listed in {path})")
        if len(unreadable) > 10:
            warn(f"... and {counted(len(unreadable) - 10, 'more unreadable image')}")
        for line in problem_lines(report):
            warn(line)
        problems += len(absent) + len(unreadable) + len(report.problems)
    if not reports:
        raise DataError(f"{data}: neither list could be read")
    log(f"{'class':>5}  {'name':<20}" + "".join(f"{what:>8}" for what in reports))
    for c, name in enumerate(config.names):
        log(
            f"{c:>5}  {name[:20]:<20}"
            + "".join(f"{r.per_class.get(c, 0):>8}" for r in reports.values())
        )
    unused = [
        c for c in range(config.classes) if not any(r.per_class.get(c) for r in reports.values())
    ]
    if unused:
        warn(
            f"{len(unused)} class{'es' if len(unused) > 1 else ''} without a single box: "
            f"{', '.join(config.names[c] for c in unused[:10])}"
        )
    if picture is not None and is_classifier_data(config):
        picture = None  # centres and sizes mean nothing for whole-image labels
    if picture is not None:
        write_overview(picture, reports.get("train") or next(iter(reports.values())), config.names)
        log(f"wrote {picture} (boxes per class, box centres and sizes)")
    log(
        "no problems found"
        if not problems
        else f"{problems} problem{'s' if problems > 1 else ''} found"
    )
    return problems


def write_overview(path, report, names):
    import cv2

    from .plots import labels_overview_picture

    img = labels_overview_picture(Counter(report.per_class), names, report.box_array())
    with atomic_output(path) as tmp:
        if not cv2.imwrite(tmp, img):
            raise OSError(0, "cannot write the image", path)
