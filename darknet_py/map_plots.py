"""`map --plots DIR`: a precision/recall curve per class and a confusion matrix, as pictures.

The confusion matrix is taken at map's confidence threshold: each box's best class above it
is a detection; detections, likeliest first, claim the unclaimed truth box (of any class)
they overlap most, above map's IoU threshold. Row: the truth's class, column: the detected
class; a detection that claims nothing counts in the background row, a truth box nothing
claimed in the background column.
"""

import os
import re

import numpy as np

from .boxes import box_iou_matrix
from .files import atomic_output


def confusion_matrix(images, classes, iou_thresh, thresh):
    """(classes + 1) x (classes + 1) counts from map's [(detections, truth rows)]."""
    matrix = np.zeros((classes + 1, classes + 1), dtype=np.int64)
    for dets, truth in images:
        truth = np.asarray(truth, dtype=np.float32).reshape(-1, 5)
        best = {}  # a box's best class above thresh: image_detections lists each class
        for c, score, box in dets:
            key = tuple(np.asarray(box, dtype=np.float64).round(6))
            if score > thresh and (key not in best or score > best[key][1]):
                best[key] = (c, score, box)
        found = sorted(best.values(), key=lambda d: -d[1])
        claimed = np.zeros(len(truth), dtype=bool)
        ious = (
            box_iou_matrix(np.array([d[2] for d in found], np.float32).reshape(-1, 4), truth[:, :4])
            if len(found) and len(truth)
            else np.zeros((len(found), len(truth)))
        )
        for k, (c, _, _) in enumerate(found):
            row = np.where(claimed, -1.0, ious[k]) if len(truth) else ious[k]
            j = int(np.argmax(row)) if len(truth) else -1
            if j >= 0 and row[j] > iou_thresh:
                claimed[j] = True
                matrix[int(truth[j, 4]), c] += 1
            else:
                matrix[classes, c] += 1
        for j in np.flatnonzero(~claimed):
            matrix[int(truth[j, 4]), classes] += 1
    return matrix


def _file_name(index, name):
    return f"pr_{index:02d}_{re.sub(r'[^A-Za-z0-9_.-]+', '_', str(name))[:40]}.png"


def plot_paths(directory, classes, names):
    names = list(names) + [str(c) for c in range(len(names), classes)]
    return [os.path.join(directory, _file_name(c, names[c])) for c in range(classes)] + [
        os.path.join(directory, "confusion_matrix.png")
    ]


def write_map_plots(directory, result, images, classes, names):
    """Write the pictures into directory; returns their paths."""
    import cv2

    from .plots import confusion_picture, pr_curve_picture

    names = list(names) + [str(c) for c in range(len(names), classes)]
    paths = plot_paths(directory, classes, names)
    pictures = [
        pr_curve_picture(
            *result.curves[c], f"{c} {names[c]} ({result.truths[c]} truth boxes)", result.aps[c]
        )
        for c in range(classes)
    ]
    matrix = confusion_matrix(images, classes, result.iou_thresh, result.thresh)
    pictures.append(
        confusion_picture(
            matrix,
            names[:classes],
            f"confusion matrix at conf {result.thresh:g}, IoU {result.iou_thresh:g}",
        )
    )
    for path, picture in zip(paths, pictures):
        with atomic_output(path) as tmp:
            if not cv2.imwrite(tmp, picture):
                raise OSError(0, "cannot write the image", path)
    return paths
