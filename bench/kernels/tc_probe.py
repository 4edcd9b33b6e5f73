"""One tensor-core convolution launch per shape (for a profiler: ncu -k regex:conv_tc).

    python3 bench/kernels/tc_probe.py [fp16|bf16|tf32] [layer0|layer4|layer12] [--sweep]
--sweep: every tile, not only the plan's.
Shapes: yolov3-tiny 416 at batch 64, layers 0 (3->16 3x3 416x416), 4 (32->64 3x3 104x104)
and 12 (512->1024 3x3 13x13); prints each launch's time (CUDA events, median of 10)."""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from darknet_py.backends import get_backend  # noqa: E402
from darknet_py.bench import median_seconds  # noqa: E402

SHAPES = {"layer0": (3, 416, 416, 16), "layer4": (32, 104, 104, 64), "layer12": (512, 13, 13, 1024)}


def main(precision="fp16", only=None, sweep=False, repeats=10):
    be = get_backend("cuda:0")
    rng = np.random.default_rng(0)
    batch = 64
    for name, (c, h, w, f) in SHAPES.items():
        if only and name != only:
            continue
        k = c * 9
        weights = be.from_host(rng.uniform(-1, 1, f * k).astype(np.float32))
        im = be.from_host(rng.uniform(-1, 1, batch * c * h * w).astype(np.float32))
        out = be.empty(batch * f * h * w)
        bias = be.from_host(rng.uniform(-1, 1, f).astype(np.float32))
        packed = be.pack_weights(weights, f, k, precision)
        geometry = (c, h, w, 3, 1, 1, 1, batch, c * h * w)

        def run(packed=packed, im=im, geometry=geometry, bias=bias, out=out, size=f * h * w):
            be.conv_forward(packed, im, *geometry, bias, "leaky", out, size)

        flop = 2.0 * f * k * batch * h * w
        plan = be.tc_plan(f, batch * h * w, k, split=False)
        for tile in [None] + [t for t in be.tc_tiles() if sweep and t != plan[0]]:
            be.tc_override = None if tile is None else (tile, 1)
            try:
                ms = 1e3 * median_seconds(be, run, 1, repeats)
            finally:
                be.tc_override = None
            print(
                f"{name} {precision} {tile or 'plan ' + plan[0]}: {ms:.3f} ms, "
                f"{flop / ms / 1e9:.1f} TFLOP/s",
                flush=True,
            )


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("precision", nargs="?", default="fp16", choices=("fp16", "bf16", "tf32"))
    ap.add_argument("shape", nargs="?", choices=sorted(SHAPES), help="one shape (default: all)")
    ap.add_argument("--sweep", action="store_true", help="every tile, not only the plan's")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    main(args.precision, args.shape, args.sweep, args.repeats)
