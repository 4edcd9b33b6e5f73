"""Export scikit-learn's bundled handwritten digits into darknet_py/demo_data/digits.npz.

Run once, on a machine with scikit-learn (which is not a darknet-py dependency):

    python -m venv /tmp/skl && /tmp/skl/bin/pip install scikit-learn
    /tmp/skl/bin/python scripts/export_digits.py

scikit-learn's digits are the 1797-image test set of the UCI "Optical Recognition of
Handwritten Digits" data (Alpaydin & Kaynak, 1998): 8x8 images whose pixels count the
inked pixels of 4x4 blocks, 0..16. They are stored as uint8 0..255 (value * 255 / 16,
rounded; every level stays distinct) with their labels 0..9, in the dataset's order.
"""

import argparse
import hashlib
import os
import sys

import numpy as np

DEFAULT_OUT = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, "darknet_py", "demo_data", "digits.npz"
)


def export(out_path):
    try:
        from sklearn import __version__ as sklearn_version
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit(
            "export_digits.py needs scikit-learn: pip install scikit-learn "
            "(into a throwaway virtual environment)"
        )
    digits = load_digits()
    levels = digits.images
    if levels.shape != (1797, 8, 8) or levels.min() < 0 or levels.max() > 16:
        sys.exit(
            f"unexpected digits data: shape {levels.shape}, range {levels.min()}..{levels.max()}"
        )
    images = np.rint(levels * (255.0 / 16.0)).astype(np.uint8)
    labels = digits.target.astype(np.uint8)
    out_path = os.path.abspath(out_path)
    os.makedirs(os.path.dirname(out_path), exist_ok=True)
    np.savez_compressed(out_path, images=images, labels=labels)
    with open(out_path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    content = hashlib.sha256(images.tobytes() + labels.tobytes()).hexdigest()
    print(f"wrote {out_path}: {len(images)} images, {os.path.getsize(out_path)} bytes")
    print(f"scikit-learn {sklearn_version}; file sha256 {digest}")
    print(f"content sha256 (images bytes + labels bytes) {content}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="output .npz (default: %(default)s)")
    export(parser.parse_args().out)


if __name__ == "__main__":
    main()
