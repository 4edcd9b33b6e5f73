"""Each convolution shape of a cfg: the backward's two products timed both ways on the GPU.

    python3 bench/kernels/conv_backward.py CFG [--batch 32] [--precision fp16] [--sweep]
                                           [--json FILE]
    python3 bench/kernels/conv_backward.py --make-cfg build/yolov4_3c.cfg

The second form writes the fork's yolov4.cfg (../shared/darknet-cfg-ab) with 3 classes at
416x416, as bench/training/vs_pytorch.py measures it, for a machine without ../shared.

Per unique [convolutional] shape (one group): the weight gradient as im2col + GEMM (the
layer's old path, in its workspace chunks) and as conv_weight_grad (the implicit GEMM,
ops/convolution/conv_backward_*.cu), the data gradient as GEMM + col2im and as conv_data_grad;
--sweep also times every implicit tile (and splits for the weight gradient) to check the
plans. CUDA events, medians of 5 after 2 warm-ups; ms per layer (all groups). The (move)
column is the old path's copy of the delta into (filters, images, positions) order, which
both its products need.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import three_class_cfg  # noqa: E402
from darknet_py.network import load_network  # noqa: E402


def _time(be, fn, warmup=2, repeats=5):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t = be.timer()
        t.start()
        fn()
        times.append(t.stop() * 1e3)
    return float(np.median(times))


def _shape(layer):
    return (
        layer.c,
        layer.h,
        layer.w,
        layer.filters,
        layer.size,
        layer.stride,
        layer.padding,
        layer.dilation,
        layer.groups,
    )


def bench_layer(be, layer, batch, precision, sweep):
    m, k, n = layer.gemm_dims()
    cg, hw = layer.c // layer.groups, layer.h * layer.w
    rng = np.random.default_rng(0)
    im = be.from_host(rng.uniform(-1, 1, batch * layer.c * hw).astype(np.float32))
    delta = be.from_host(rng.uniform(-1, 1, batch * layer.outputs).astype(np.float32))
    weights = be.from_host(rng.uniform(-1, 1, layer.nweights).astype(np.float32))
    updates, dx = be.zeros(layer.nweights), be.zeros(batch * layer.c * hw)
    chunk = layer.images_per_chunk(batch)
    col, prod = be.empty(k * chunk * n), be.empty(m * chunk * n)
    gemm = be.gemm if precision == "fp32" else (lambda *a: be.gemm_lowp(precision, *a))
    geometry = (
        cg,
        layer.h,
        layer.w,
        layer.size,
        layer.stride,
        layer.padding,
        layer.dilation,
        batch,
    )

    def move():
        for b0 in range(0, batch, chunk):
            count = min(chunk, batch - b0)
            for g in range(layer.groups):
                be.copy_blocks(
                    delta,
                    b0 * layer.outputs + g * m * n,
                    n,
                    prod,
                    0,
                    count * n,
                    n,
                    m,
                    planes=count,
                    src_plane_stride=layer.outputs,
                    dst_plane_stride=n,
                )

    def old(weight):
        for b0 in range(0, batch, chunk):
            count = min(chunk, batch - b0)
            for g in range(layer.groups):
                if weight:
                    be.im2col(
                        im[b0 * layer.c * hw + g * cg * hw :],
                        cg,
                        layer.h,
                        layer.w,
                        layer.size,
                        layer.stride,
                        layer.padding,
                        layer.dilation,
                        col,
                        count,
                        layer.c * hw,
                    )
                    gemm(
                        False,
                        True,
                        m,
                        k,
                        count * n,
                        1.0,
                        prod,
                        count * n,
                        col,
                        count * n,
                        1.0,
                        updates[g * m * k :],
                        k,
                    )
                else:
                    gemm(
                        True,
                        False,
                        k,
                        count * n,
                        m,
                        1.0,
                        weights[g * m * k :],
                        k,
                        prod,
                        count * n,
                        0.0,
                        col,
                        count * n,
                    )
                    be.col2im(
                        col,
                        cg,
                        layer.h,
                        layer.w,
                        layer.size,
                        layer.stride,
                        layer.padding,
                        layer.dilation,
                        dx[b0 * layer.c * hw + g * cg * hw :],
                        count,
                        layer.c * hw,
                    )

    def wgrad():
        for g in range(layer.groups):
            be.conv_weight_grad(
                precision,
                delta[g * m * n :],
                layer.outputs,
                im[g * cg * hw :],
                layer.c * hw,
                *geometry,
                m,
                updates[g * m * k :],
            )

    def dgrad():
        for g in range(layer.groups):
            be.conv_data_grad(
                precision,
                weights[g * m * k :],
                m,
                delta[g * m * n :],
                layer.outputs,
                *geometry,
                dx[g * cg * hw :],
                layer.c * hw,
                True,
            )

    # The data gradient as the wgmma forward of the deltas where it is taken, and as the
    # implicit kernel (that route switched off for the time).
    as_forward = (
        be.data_grad_takes_forward(
            precision, batch, cg, layer.h, layer.w, layer.size, layer.padding, layer.dilation, m
        )
        and layer.stride == 1
    )
    forward_ms = _time(be, dgrad) if as_forward else None
    be.data_grad_as_forward = False
    try:
        implicit_ms = _time(be, dgrad)
    finally:
        be.data_grad_as_forward = True
    row = {
        "shape": _shape(layer),
        "move": _time(be, move),
        "old_wgrad": _time(be, lambda: old(True)),
        "old_dgrad": _time(be, lambda: old(False)),
        "wgrad": _time(be, wgrad),
        "dgrad": implicit_ms,
        "dgrad_forward": forward_ms,
        "wgrad_plan": be.wgrad_plan(precision, m, k, batch * n),
        "dgrad_plan": be.dgrad_plan(precision, cg, batch * hw),
    }
    if sweep:
        wtiles, dtiles = be.backward_tiles(precision)
        plans = {}
        for tile in wtiles:
            for splits in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512):
                if splits > max(1, batch * n // 1024):
                    continue
                be.wgrad_override = (tile, splits)
                plans[f"{tile}/{splits}"] = _time(be, wgrad)
        be.wgrad_override = None
        row["wgrad_best"] = min(plans.items(), key=lambda kv: kv[1])
        plans = {}
        for tile in dtiles:
            be.dgrad_override = tile
            plans[tile] = _time(be, dgrad)
        be.dgrad_override = None
        row["dgrad_best"] = min(plans.items(), key=lambda kv: kv[1])
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("cfg", nargs="?")
    ap.add_argument("--make-cfg", metavar="PATH")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--precision", default="fp16")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.make_cfg:
        three_class_cfg("yolov4.cfg", None, path=args.make_cfg)
        return
    if not args.cfg:
        ap.error("a cfg is needed")
    net = load_network(args.cfg, batch=1, device="cuda:0", precision=args.precision)
    be = net.be
    seen, rows = {}, []
    for i, layer in enumerate(net.layers):
        if layer.type != "convolutional":
            continue
        key = (_shape(layer), layer.precision)
        if key in seen:
            seen[key]["layers"].append(i)
            continue
        row = bench_layer(be, layer, args.batch, layer.precision, args.sweep)
        row["layers"] = [i]
        row["precision"] = layer.precision
        seen[key] = row
        rows.append(row)
    total = {
        k: sum(r[k] * len(r["layers"]) for r in rows)
        for k in ("move", "old_wgrad", "old_dgrad", "wgrad", "dgrad")
    }
    total["dgrad_forward"] = sum(
        (r["dgrad_forward"] or r["dgrad"]) * len(r["layers"]) for r in rows
    )
    print(
        f"{'layers':>14} {'c h w f k s':>24} {'move':>6} {'oldW':>6} {'impW':>6} {'oldD':>6} "
        f"{'impD':>6} {'fwdD':>6}  plans / best"
    )
    for r in rows:
        c, h, w, f, k, s, *_ = r["shape"]
        best = f" {r.get('wgrad_best', '')} {r.get('dgrad_best', '')}" if args.sweep else ""
        print(
            f"{str(r['layers'][:3])[:14]:>14} {f'{c} {h} {w} {f} {k} {s}':>24} {r['move']:6.2f} "
            f"{r['old_wgrad']:6.2f} {r['wgrad']:6.2f} {r['old_dgrad']:6.2f} {r['dgrad']:6.2f} "
            f"{'-' if r['dgrad_forward'] is None else format(r['dgrad_forward'], '6.2f'):>6}  "
            f"{r['wgrad_plan']} {r['dgrad_plan']}{best}"
        )
    print("totals over the network (ms):", {k: round(v, 2) for k, v in total.items()})
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "totals": total}, f, indent=1, default=str)


if __name__ == "__main__":
    main()
