"""Issue 26's inference rows: yolov3-tiny, batch 64, 416x416, fp16, random weights.

    python3 bench/inference_bench.py [--torch] [--repeats 20] [--json bench/results.json]

  * yolov3tiny_b64_forward_layers_ms_fp16: every layer's inference forward timed on its own
    (CUDA events, median), summed (darknet_py.bench.layer_seconds, as `bench --layers`);
  * yolov3tiny_b64_forward_whole_ms_fp16: the whole call from host images, as a user makes
    it: predict() on 64 OpenCV-style uint8 (416, 416, 3) photos (their bytes uploaded on
    the copy stream, letterboxed on the GPU, the layers, the output downloaded), wall
    clock, median; beside it the same call from the float32 (64, 3, 416, 416) batch the
    row was measured with before (..._from_fp32), from 640x480 photos (..._640x480), and
    predict_in_parts in 4 parts (..._in_parts: part k+1's bytes and part k-1's output
    copy while part k's layers run);
  * torch_yolov3tiny_b64_forward_layers_ms_fp16 (--torch): the same network in PyTorch,
    AMP (autocast fp16) + channels_last + cudnn.benchmark, replayed as a CUDA graph
    (PyTorch is used here only, as the reference a user would pick instead).

Prints a table; with --json, merges the rows (ms) with `gpu` and `date` into that file.
"""
import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from darknet_py.bench import layer_seconds, median_seconds, prepare  # noqa: E402
from darknet_py.network import load_network  # noqa: E402

SHARED = ROOT.parent / "shared"
CFG = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
BATCH = 64


def wall_ms(be, fn, warmup, repeats):
    """Median wall-clock ms of fn() (which returns once its results are on the host)."""
    for _ in range(warmup):
        fn()
    be.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def darknet_rows(repeats):
    net = load_network(CFG, batch=BATCH, device="cuda", precision="fp16")
    prepare(net)
    be = net.be
    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (BATCH, 416, 416, 3), dtype=np.uint8)
    floats = np.ascontiguousarray(photos[..., ::-1].transpose(0, 3, 1, 2), dtype=np.float32)
    floats /= np.float32(255)
    rows = {"yolov3tiny_b64_forward_whole_ms_fp16":
            wall_ms(be, lambda: net.predict(photos), 3, repeats)}
    rows["yolov3tiny_b64_forward_whole_ms_fp16_from_fp32"] = wall_ms(
        be, lambda: net.predict(floats), 3, repeats)
    large = rng.integers(0, 256, (BATCH, 480, 640, 3), dtype=np.uint8)
    rows["yolov3tiny_b64_forward_whole_ms_fp16_640x480"] = wall_ms(
        be, lambda: net.predict(large), 3, repeats)
    breakdown = whole_call_parts(net, photos, floats, repeats)
    rows["yolov3tiny_b64_forward_whole_in_parts_ms_fp16"] = breakdown[
        "predict_in_parts(photos, 16)"]
    net.predict(photos)
    rows["yolov3tiny_b64_forward_graph_ms_fp16"] = 1e3 * median_seconds(be, net.infer, 3,
                                                                        repeats)
    per_layer = layer_seconds(net, False, 3, repeats)
    rows["yolov3tiny_b64_forward_layers_ms_fp16"] = 1e3 * sum(f for f, _ in per_layer)
    layers = [(layer.index, layer.type, 1e3 * f) for layer, (f, _) in zip(net.layers, per_layer)]
    return rows, layers, breakdown, be.device_name


def whole_call_parts(net, photos, floats, repeats):
    """{step: wall ms} of the whole call's parts, each run on its own and waited for: the
    input staged from photos or from floats, the layers (graph replay), the output's
    download; and predict_in_parts on the photos (4 parts of 16: the copies beside the
    layers). Leaves the network at batch 64."""
    be = net.be
    out = net.output_index

    def staged(fn):
        return lambda: (fn(), be.synchronize())

    parts = {"photos staged": wall_ms(be, staged(lambda: net._run_photos(
        net._upload_photos(photos), True)), 2, repeats)}
    parts["photos staged"] -= wall_ms(be, staged(net.infer), 2, repeats)   # less the layers
    parts["floats staged"] = wall_ms(be, staged(lambda: net._stage(floats, None, False)), 2,
                                     repeats)
    parts["layers (graph replay)"] = wall_ms(be, staged(net.infer), 2, repeats)
    parts["output download"] = wall_ms(be, lambda: net.layer_output(out), 2, repeats)
    parts["predict_in_parts(photos, 16)"] = wall_ms(
        be, lambda: net.predict_in_parts(photos, BATCH // 4), 2, repeats)
    net.set_batch(BATCH)
    return parts


def torch_layers_ms(repeats):
    """PyTorch's forward of yolov3-tiny (the cfg's layers one for one), AMP fp16,
    channels_last, one CUDA graph replay per timed run; ms, median."""
    import torch
    from darknet_py.cfg import parse_cfg_text

    torch.backends.cudnn.benchmark = True
    sections = parse_cfg_text(CFG.read_text(), str(CFG))[1:]
    model = TorchDarknet(sections).cuda().eval().to(memory_format=torch.channels_last)
    x = torch.rand(BATCH, 3, 416, 416, device="cuda").to(memory_format=torch.channels_last)
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                model(x)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            model(x)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(3):
        graph.replay()
    for _ in range(repeats):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def _torch_module_class():
    import torch
    import torch.nn.functional as F

    class Net(torch.nn.Module):
        """yolov3-tiny's cfg sections as PyTorch layers: conv (+BN, leaky), Darknet's
        maxpool (stride 1: padded right and bottom), upsample, route, yolo (logistic on
        x, y, objectness and classes)."""

        def __init__(self, sections):
            super().__init__()
            self.kinds, self.mods, self.args = [], torch.nn.ModuleList(), []
            channels, outs = 3, []
            for s in sections:
                kind = s.type
                mod, arg = torch.nn.Identity(), None
                if kind == "convolutional":
                    filters, size = s.get_int("filters", 1), s.get_int("size", 1)
                    stride, bn = s.get_int("stride", 1), s.get_int("batch_normalize", 0)
                    pad = size // 2 if s.get_int("pad", 0) else 0
                    layers = [torch.nn.Conv2d(channels, filters, size, stride, pad, bias=not bn)]
                    if bn:
                        layers.append(torch.nn.BatchNorm2d(filters))
                    if s.get_str("activation", "logistic") == "leaky":
                        layers.append(torch.nn.LeakyReLU(0.1))
                    mod, channels = torch.nn.Sequential(*layers), filters
                elif kind == "maxpool":
                    arg = (s.get_int("size", 2), s.get_int("stride", 2))
                elif kind == "upsample":
                    arg = s.get_int("stride", 2)
                elif kind == "route":
                    idx = [int(v) for v in s.get_str("layers", "").split(",")]
                    arg = [i if i >= 0 else len(outs) + i for i in idx]
                    channels = sum(outs[i] for i in arg)
                elif kind == "yolo":
                    arg = len(s.get_str("mask", "").split(","))
                self.kinds.append(kind)
                self.mods.append(mod)
                self.args.append(arg)
                outs.append(channels)

        def forward(self, x):
            outputs, heads = [], []
            for kind, mod, arg in zip(self.kinds, self.mods, self.args):
                if kind == "convolutional":
                    x = mod(x)
                elif kind == "maxpool":
                    size, stride = arg
                    if stride == 1:
                        x = F.pad(x, (0, size - 1, 0, size - 1), value=float("-inf"))
                    x = F.max_pool2d(x, size, stride)
                elif kind == "upsample":
                    x = F.interpolate(x, scale_factor=arg, mode="nearest")
                elif kind == "route":
                    x = torch.cat([outputs[i] for i in arg], 1)
                elif kind == "yolo":
                    b, c, h, w = x.shape
                    v = x.reshape(b, arg, c // arg, h, w)
                    x = torch.cat([v[:, :, :2].sigmoid(), v[:, :, 2:4], v[:, :, 4:].sigmoid()],
                                  2).reshape(b, c, h, w)
                    heads.append(x)
                outputs.append(x)
            return heads

    return Net


def TorchDarknet(sections):   # noqa: N802 (a class made on first use: torch is optional)
    return _torch_module_class()(sections)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--torch", action="store_true", help="also time PyTorch's twin")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help="merge the rows into this JSON file")
    args = ap.parse_args()
    rows, layers, breakdown, gpu = darknet_rows(args.repeats)
    if args.torch:
        rows["torch_yolov3tiny_b64_forward_layers_ms_fp16"] = torch_layers_ms(args.repeats)
    print(f"yolov3-tiny 416, batch {BATCH}, fp16, {gpu}; medians of {args.repeats}\n")
    print("| layer | type | forward ms |\n|---|---|---|")
    for index, kind, ms in layers:
        print(f"| {index} | {kind} | {ms:.3f} |")
    print("\n| whole call, step alone (wall) | ms |\n|---|---|")
    for name, value in breakdown.items():
        print(f"| {name} | {value:.2f} |")
    print("\n| row | ms |\n|---|---|")
    for name, value in rows.items():
        print(f"| {name} | {value:.2f} |")
    if args.json:
        path = Path(args.json)
        merged = json.loads(path.read_text()) if path.is_file() else {}
        merged.update({name: round(value, 3) for name, value in rows.items()})
        merged["gpu"] = gpu
        merged["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        path.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
