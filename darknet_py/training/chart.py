"""The training chart (chart_<cfg>.png: loss, average loss and the evaluation score over
the iterations) and the history behind it (<cfg>.history.json beside the backup, so a
resumed run's chart shows the whole run)."""

import json
import math
import os

import numpy as np

from ..files import atomic_output, write_text_atomically


def _nice_ceiling(value):
    """A round number >= value (1, 2, 2.5, 5 times a power of ten) for an axis end."""
    if not value > 0 or not math.isfinite(value):
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * power >= value * 0.9999:
            return step * power
    return 10 * power


def _tick_label(value):
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def draw_chart(
    path, losses, averages, iterations, scores=(), score_name="mAP@0.5", title="", max_batches=None
):
    """Write a PNG chart: loss (grey) and average loss (blue) against the iteration on the
    left axis, the evaluation score (red, 0..1) on the right axis. Atomic write."""
    import cv2

    width, height = 1000, 600
    left, right, top, bottom = 80, 90 if scores else 30, 50, 70
    img = np.full((height, width, 3), 255, dtype=np.uint8)
    pw, ph = width - left - right, height - top - bottom
    font = cv2.FONT_HERSHEY_SIMPLEX
    ink, grid = (0, 0, 0), (225, 225, 225)
    x_end = max([max_batches or 0] + list(iterations) + [1])
    # The first iterations' losses are far larger than the rest: scale the axis to the
    # average loss after the first tenth of the run, so later progress stays visible
    # (the start of the grey raw-loss line is clipped at the top).
    settled = [v for v in averages[len(averages) // 10 :] if math.isfinite(v)]
    everything = [v for v in list(averages) + list(losses) if math.isfinite(v)]
    y_end = _nice_ceiling(max(settled) * 1.1) if settled else 1.0
    if everything and max(everything) <= 1.5 * y_end:  # nothing far above: show it all
        y_end = _nice_ceiling(max(everything) * 1.05)

    def px(it):
        return int(round(left + pw * it / x_end))

    def py(v, end):
        return int(round(top + ph * (1 - min(max(v, 0.0), end) / end)))

    for k in range(6):  # grid and axis ticks
        y = top + ph * k // 5
        cv2.line(img, (left, y), (left + pw, y), grid, 1)
        label = _tick_label(y_end * (5 - k) / 5)
        (tw, th), _ = cv2.getTextSize(label, font, 0.45, 1)
        cv2.putText(img, label, (left - tw - 8, y + th // 2), font, 0.45, ink, 1, cv2.LINE_AA)
        if scores:
            cv2.putText(
                img,
                f"{(5 - k) / 5:.1f}",
                (left + pw + 8, y + th // 2),
                font,
                0.45,
                (0, 0, 200),
                1,
                cv2.LINE_AA,
            )
        x = left + pw * k // 5
        cv2.line(img, (x, top), (x, top + ph), grid, 1)
        label = _tick_label(round(x_end * k / 5))
        (tw, th), _ = cv2.getTextSize(label, font, 0.45, 1)
        cv2.putText(img, label, (x - tw // 2, top + ph + th + 8), font, 0.45, ink, 1, cv2.LINE_AA)
    cv2.rectangle(img, (left, top), (left + pw, top + ph), ink, 1)

    def polyline(values, end, colour, thickness):
        pts = [(px(i), py(v, end)) for i, v in zip(iterations, values) if math.isfinite(v)]
        if len(pts) > 1:
            cv2.polylines(
                img, [np.array(pts, dtype=np.int32)], False, colour, thickness, cv2.LINE_AA
            )

    polyline(losses, y_end, (190, 190, 190), 1)
    polyline(averages, y_end, (200, 80, 0), 2)
    if scores:
        pts = [(px(i), py(v, 1.0)) for i, v in scores]
        if len(pts) > 1:
            cv2.polylines(img, [np.array(pts, dtype=np.int32)], False, (0, 0, 200), 2, cv2.LINE_AA)
        for p in pts:
            cv2.circle(img, p, 4, (0, 0, 200), -1, cv2.LINE_AA)
        best = max(scores, key=lambda s: s[1])
        cv2.putText(
            img,
            f"best {score_name} {best[1]:.4f} at {best[0]}",
            (left + pw - 330, top + 22),
            font,
            0.5,
            (0, 0, 200),
            1,
            cv2.LINE_AA,
        )
    cv2.putText(img, title, (left, 32), font, 0.65, ink, 1, cv2.LINE_AA)
    cv2.putText(
        img, "iteration", (left + pw // 2 - 35, height - 18), font, 0.55, ink, 1, cv2.LINE_AA
    )
    legend = "loss (grey), average loss (blue)"
    if scores:
        legend += f", {score_name} (red, right axis)"
    (tw, _), _ = cv2.getTextSize(legend, font, 0.45, 1)
    cv2.putText(img, legend, (width - right - tw, 32), font, 0.45, ink, 1, cv2.LINE_AA)
    vertical = np.full((20, 100, 3), 255, dtype=np.uint8)  # the y-axis title, rotated
    cv2.putText(vertical, "loss", (30, 15), font, 0.55, ink, 1, cv2.LINE_AA)
    vertical = cv2.rotate(vertical, cv2.ROTATE_90_COUNTERCLOCKWISE)
    y0 = top + ph // 2 - 50
    img[y0 : y0 + 100, 8:28] = vertical
    with atomic_output(path, kind="chart") as tmp:
        if not cv2.imwrite(tmp, img):
            raise OSError(f"{path}: cannot write the chart")


# ---- the history behind the chart --------------------------------------------------------
def history_path(backup_dir, base):
    return os.path.join(backup_dir, f"{base}.history.json")


def save_history(path, losses, scores):
    """The losses [(iteration, loss, average)] and scores [(iteration, score)] so far,
    beside <cfg>.backup, so that a resumed run's chart shows the whole run. Written
    atomically, whenever the backup is."""
    write_text_atomically(path, json.dumps({"losses": losses, "scores": scores}) + "\n")


def load_history(path, up_to, log):
    """(losses, scores) of the iterations up to `up_to` from a history file; empty when
    there is none or it cannot be read (the chart then starts at the resume)."""
    if not os.path.exists(path):
        return [], []
    try:
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
        losses = [tuple(row) for row in saved["losses"] if row[0] <= up_to]
        scores = [tuple(row) for row in saved["scores"] if row[0] <= up_to]
    except (OSError, ValueError, KeyError, TypeError, IndexError) as e:
        log(
            f"darknet-py: warning: {path}: cannot read the training history ({e}); the "
            f"chart starts at this run"
        )
        return [], []
    return losses, scores
