"""Small pictures drawn with OpenCV (no plotting library): precision/recall curves, a
confusion matrix and a dataset's labels overview. Each function returns a BGR uint8 image.
"""

import numpy as np

from .plurals import counted

WHITE, BLACK, GREY, BLUE = (255, 255, 255), (0, 0, 0), (200, 200, 200), (180, 100, 30)
FONT_SCALE = 0.45


def _cv2():
    import cv2

    return cv2


def _text(img, text, org, scale=FONT_SCALE, color=BLACK, anchor="left"):
    cv2 = _cv2()
    (w, h), _ = cv2.getTextSize(text, cv2.FONT_HERSHEY_SIMPLEX, scale, 1)
    x, y = org
    if anchor == "centre":
        x -= w // 2
    elif anchor == "right":
        x -= w
    cv2.putText(img, text, (int(x), int(y)), cv2.FONT_HERSHEY_SIMPLEX, scale, color, 1, cv2.LINE_AA)


class Axes:
    """A plotting area inside img at (x0, y0, x1, y1) for data in xlim x ylim."""

    def __init__(
        self,
        img,
        rect,
        xlim=(0, 1),
        ylim=(0, 1),
        title="",
        xlabel="",
        ylabel="",
        ticks=(0, 0.25, 0.5, 0.75, 1),
    ):
        cv2 = _cv2()
        self.img, self.rect, self.xlim, self.ylim = img, rect, xlim, ylim
        x0, y0, x1, y1 = rect
        for t in ticks:
            px, py = self.px(xlim[0] + t * (xlim[1] - xlim[0]), ylim[0] + t * (ylim[1] - ylim[0]))
            cv2.line(img, (px, y0), (px, y1), GREY, 1)
            cv2.line(img, (x0, py), (x1, py), GREY, 1)
            _text(img, _tick(xlim[0] + t * (xlim[1] - xlim[0])), (px, y1 + 16), anchor="centre")
            _text(img, _tick(ylim[0] + t * (ylim[1] - ylim[0])), (x0 - 5, py + 5), anchor="right")
        cv2.rectangle(img, (x0, y0), (x1, y1), BLACK, 1)
        _text(img, title, ((x0 + x1) // 2, y0 - 8), 0.55, anchor="centre")
        _text(img, xlabel, ((x0 + x1) // 2, y1 + 34), anchor="centre")
        _text(img, ylabel, (x0 - 5, y0 - 8), anchor="right")

    def px(self, x, y):
        x0, y0, x1, y1 = self.rect
        fx = (x - self.xlim[0]) / (self.xlim[1] - self.xlim[0])
        fy = (y - self.ylim[0]) / (self.ylim[1] - self.ylim[0])
        return int(round(x0 + fx * (x1 - x0))), int(round(y1 - fy * (y1 - y0)))


def _tick(v):
    return f"{v:g}" if abs(v) < 1000 else f"{v:.0f}"


def pr_curve_picture(recall, precision, title, ap=None):
    """One class's precision against recall (the monotonic curve AP integrates, drawn as
    steps, and the raw points in grey)."""
    cv2 = _cv2()
    img = np.full((420, 480, 3), 255, np.uint8)
    axes = Axes(
        img,
        (60, 40, 450, 360),
        title=title + (f"  AP {100 * ap:.2f}%" if ap is not None else ""),
        xlabel="recall",
        ylabel="precision",
    )
    recall, precision = np.asarray(recall, float), np.asarray(precision, float)
    if len(recall):
        best = np.maximum.accumulate(precision[::-1])[::-1]  # the curve AP integrates
        for r, p in zip(recall, precision):
            cv2.circle(img, axes.px(r, p), 2, GREY, -1)
        points = [axes.px(0, best[0])] + [axes.px(r, p) for r, p in zip(recall, best)]
        steps = []
        for (ax, ay), (bx, by) in zip(points, points[1:]):
            steps += [(ax, ay), (bx, ay), (bx, by)]
        cv2.polylines(img, [np.array(steps, np.int32)], False, BLUE, 2, cv2.LINE_AA)
    else:
        _text(img, "no detections", (255, 200), anchor="centre")
    return img


def confusion_picture(matrix, names, title="confusion matrix"):
    """Rows: the truth's class (last: background, a detection matching no truth); columns:
    the detected class (last: background, a truth nothing detected). Each row is shaded by
    its share of the row's total; counts are written where the cells are large enough."""
    cv2 = _cv2()
    matrix = np.asarray(matrix, dtype=np.int64)
    n = len(matrix)
    labels = [str(x) for x in names] + ["background"]
    cell = int(max(10, min(48, 960 // n)))
    margin = 12 + max(cv2.getTextSize(l, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0] for l in labels)
    size = margin + n * cell + 20
    width = max(size, 340)
    img = np.full((size + 60, width, 3), 255, np.uint8)
    top = margin + 60
    totals = matrix.sum(axis=1, keepdims=True)
    share = np.where(totals > 0, matrix / np.maximum(totals, 1), 0.0)
    for i in range(n):
        for j in range(n):
            x, y = margin + j * cell, top + i * cell
            shade = int(255 - 200 * share[i, j])
            cv2.rectangle(img, (x, y), (x + cell - 1, y + cell - 1), (255, shade, shade), -1)
            if cell >= 28 and matrix[i, j]:
                _text(
                    img,
                    str(matrix[i, j]),
                    (x + cell // 2, y + cell // 2 + 4),
                    0.35,
                    WHITE if share[i, j] > 0.6 else BLACK,
                    anchor="centre",
                )
    cv2.rectangle(img, (margin, top), (margin + n * cell, top + n * cell), BLACK, 1)
    if cell >= 10:
        for k, label in enumerate(labels):
            _text(img, label, (margin - 6, top + k * cell + cell // 2 + 4), 0.4, anchor="right")
            # column labels, written vertically
            (w, h), _ = cv2.getTextSize(label, cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)
            patch = np.full((h + 6, w + 4, 3), 255, np.uint8)
            _text(patch, label, (2, h + 2), 0.4)
            patch = np.rot90(patch).copy()
            x = margin + k * cell + (cell - patch.shape[1]) // 2
            y = max(0, top - 4 - patch.shape[0])
            ph, pw = patch.shape[:2]
            region = img[y : y + ph, max(0, x) : x + pw]
            region[...] = np.minimum(region, patch[: region.shape[0], : region.shape[1]])
    _text(img, title, (width // 2, 20), 0.5, anchor="centre")
    _text(img, "rows: truth, columns: detected", (width // 2, 42), 0.45, anchor="centre")
    return img


def labels_overview_picture(per_class, names, boxes):
    """A dataset's labels at a glance: boxes per class (bars), box centres (x, y) and box
    sizes (w, h), each box a dot, darker where many fall. boxes: (n, 5) class x y w h."""
    cv2 = _cv2()
    img = np.full((520, 1380, 3), 255, np.uint8)
    _class_bars(img, [per_class.get(c, 0) for c in range(len(names))], names)
    for k, (title, cols, labels) in enumerate(
        (("box centres", (1, 2), ("x", "y")), ("box sizes", (3, 4), ("width", "height")))
    ):
        x0 = 530 + k * 430
        # the frame, ticks and labels drawn on img; the density below fills it
        Axes(img, (x0, 50, x0 + 330, 380), title=title, xlabel=labels[0], ylabel=labels[1])
        density = np.zeros((331, 331), np.float32)
        if len(boxes):
            xs = np.clip(boxes[:, cols[0]], 0, 1) * 330
            ys = (1 - np.clip(boxes[:, cols[1]], 0, 1)) * 330
            np.add.at(density, (ys.astype(int), xs.astype(int)), 1)
            density = cv2.dilate(density, np.ones((3, 3), np.uint8))
            shade = (
                255 - 200 * np.minimum(1, density / max(1, np.percentile(density[density > 0], 95)))
            ).astype(np.uint8)
            area = img[50:381, x0 : x0 + 331]
            mask = density > 0
            area[mask] = np.stack([np.full_like(shade, 200), shade, shade // 2 + 60], axis=-1)[mask]
            cv2.rectangle(img, (x0, 50), (x0 + 330, 380), BLACK, 1)
    _text(
        img,
        f"centres and sizes of the {counted(len(boxes), 'box', 'boxes')} with 0-1 coordinates",
        (1380 // 2, 500),
        0.5,
        anchor="centre",
    )
    return img


def _class_bars(img, counts, names, rect=(70, 50, 450, 380)):
    """Boxes per class as bars, each named below (turned upright when names are long)."""
    cv2 = _cv2()
    x0, y0, x1, y1 = rect
    top = max(counts + [1])
    for t in (0, 0.5, 1):
        y = int(y1 - t * (y1 - y0))
        cv2.line(img, (x0, y), (x1, y), GREY, 1)
        _text(img, f"{round(t * top)}", (x0 - 5, y + 5), anchor="right")
    _text(img, "boxes per class", ((x0 + x1) // 2, y0 - 8), 0.55, anchor="centre")
    bar = (x1 - x0) / max(1, len(counts))
    upright = any(
        cv2.getTextSize(str(n), cv2.FONT_HERSHEY_SIMPLEX, 0.4, 1)[0][0] > bar - 4 for n in names
    )
    for c, count in enumerate(counts):
        left, right = int(x0 + c * bar) + 1, int(x0 + (c + 1) * bar) - 1
        cv2.rectangle(
            img, (left, int(y1 - count / top * (y1 - y0))), (max(left, right), y1), BLUE, -1
        )
        if bar < 12:
            continue
        label = str(names[c])[:14]
        if not upright:
            _text(img, label, ((left + right) // 2, y1 + 16), 0.4, anchor="centre")
            continue
        patch = np.full((14, 100, 3), 255, np.uint8)
        _text(patch, label, (98, 11), 0.4, anchor="right")  # ends next to the axis
        patch = np.rot90(patch).copy()  # reads bottom to top
        ph, pw = patch.shape[:2]
        x = (left + right) // 2 - pw // 2
        region = img[y1 + 4 : y1 + 4 + ph, max(0, x) : x + pw]
        region[...] = np.minimum(region, patch[: region.shape[0], : region.shape[1]])
    cv2.rectangle(img, (x0, y0), (x1, y1), BLACK, 1)
