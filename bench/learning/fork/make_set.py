"""A synthetic 3-class detection set for the fork learning check: filled rectangles,
circles and triangles of random colours and sizes on smooth noisy backgrounds, 160x160 PNG,
Darknet's layout (images/ + labels/ side by side, train.list, valid.list, .names, .data).

usage: python make_set.py OUT_DIR [N_TRAIN N_VALID SEED]"""

import sys
from pathlib import Path

import cv2
import numpy as np

SIZE = 160
NAMES = ("rectangle", "circle", "triangle")


def draw(rng, img):
    cls = int(rng.integers(3))
    w, h = (int(v) for v in rng.integers(18, 70, 2))
    if cls == 1:
        h = w
    x0, y0 = int(rng.integers(0, SIZE - w)), int(rng.integers(0, SIZE - h))
    colour = tuple(int(c) for c in rng.integers(0, 256, 3))
    if cls == 0:
        cv2.rectangle(img, (x0, y0), (x0 + w - 1, y0 + h - 1), colour, -1)
    elif cls == 1:
        cv2.circle(img, (x0 + w // 2, y0 + h // 2), w // 2, colour, -1)
    else:
        pts = np.array([[x0, y0 + h - 1], [x0 + w - 1, y0 + h - 1], [x0 + w // 2, y0]])
        cv2.fillPoly(img, [pts.astype(np.int32)], colour)
    return cls, (x0 + w / 2) / SIZE, (y0 + h / 2) / SIZE, w / SIZE, h / SIZE


def make(out, n_train, n_valid, seed):
    rng = np.random.default_rng(seed)
    (out / "images").mkdir(parents=True, exist_ok=True)
    (out / "labels").mkdir(exist_ok=True)
    lists = {"train": [], "valid": []}
    for split, count in (("train", n_train), ("valid", n_valid)):
        for i in range(count):
            base = rng.integers(0, 256, 3)
            img = np.empty((SIZE, SIZE, 3), np.uint8)
            img[...] = np.clip(base + rng.normal(0, 12, (SIZE, SIZE, 3)), 0, 255)
            rows = [draw(rng, img) for _ in range(int(rng.integers(1, 4)))]
            name = f"{split}_{i:04d}"
            cv2.imwrite(str(out / "images" / f"{name}.png"), img)
            label = "".join(f"{c} {x:.6f} {y:.6f} {w:.6f} {h:.6f}\n" for c, x, y, w, h in rows)
            # The original Darknet reads labels/..., the fork (no JPEGImages or train2017
            # in the path) the .txt beside the image: both are written.
            (out / "labels" / f"{name}.txt").write_text(label)
            (out / "images" / f"{name}.txt").write_text(label)
            lists[split].append(str((out / "images" / f"{name}.png").resolve()))
        (out / f"{split}.list").write_text("\n".join(lists[split]) + "\n")
    (out / "shapes.names").write_text("\n".join(NAMES) + "\n")
    (out / "backup").mkdir(exist_ok=True)
    (out / "shapes.data").write_text(
        f"classes=3\ntrain={(out / 'train.list').resolve()}\n"
        f"valid={(out / 'valid.list').resolve()}\n"
        f"names={(out / 'shapes.names').resolve()}\nbackup={(out / 'backup').resolve()}\n"
    )


if __name__ == "__main__":
    args = sys.argv[1:]
    make(Path(args[0]), *(int(a) for a in (args[1:4] or (400, 100, 0))))
