"""The batch-64 forward: yolov3-tiny, 416x416, random weights, per precision; fp16's rows
go to bench/results.json.

    python3 bench/networks/forward.py [--precisions fp16 ...] [--torch] [--repeats 20]
                                      [--json bench/results.json] [--results bench/RESULTS.md]

Rows (ms, medians; fp16 unless named otherwise):
  * yolov3tiny_b64_forward_layers_ms_fp16: every layer's inference forward timed on its own
    (CUDA events), summed (darknet_py.bench.layer_seconds, as `bench --layers`); each
    convolution's TFLOP/s beside it, and its share of the H100 SXM datasheet peak;
  * yolov3tiny_b64_forward_graph_ms_fp16: the layers as one call (Network.infer, a CUDA
    graph replay), the input already on the device;
  * yolov3tiny_b64_forward_whole_ms_fp16: the whole call from host images, as a user makes
    it: predict() on 64 OpenCV-style uint8 (416, 416, 3) photos (their bytes uploaded on
    the copy stream, letterboxed on the GPU, the layers, the output downloaded), wall
    clock; beside it the same call from the float32 (64, 3, 416, 416) batch
    (..._from_fp32), from 640x480 photos (..._640x480), and predict_in_parts in 4 parts
    (..._in_parts: part k+1's bytes and part k-1's output copy while part k's layers run);
  * torch_yolov3tiny_b64_forward_layers_ms_fp16 (--torch): the same network in PyTorch
    (bench/torch_port.py), AMP (autocast fp16) + channels_last + cudnn.benchmark, replayed
    as a CUDA graph (PyTorch is used here only, as the reference a user would pick instead).
  * yolov3tiny_b1_forward_whole_ms (--batch1): one image's whole call, predict() on a float32
    (1, 3, 416, 416) array to the output on the host, wall clock, in fp32 (the default, and
    at batch 1 the fastest: tf32's tiles lose there); beside it ..._tf32 and ..._fp16, and
    torch_yolov3tiny_b1_forward_whole_ms (--torch): the port in TF32 replayed as a CUDA
    graph, the array copied in and the output copied back to a NumPy array in the timed call.
Other precisions (--precisions fp32 tf32 bf16) give the layers' rows, printed and appended
to --results only.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench.common import RESULTS_JSON, SHARED, append_section, merge_json, utc_now  # noqa: E402
from darknet_py.bench import layer_seconds, median_seconds, prepare  # noqa: E402
from darknet_py.network import load_network  # noqa: E402

CFG = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
BATCH = 64
# H100 SXM dense peaks, TFLOP/s (fp32 FFMA; tensor cores dense): the datasheet's figures,
# a scale for the layers' rates, not a measurement (bench/kernels/gemm.py measures cuBLAS).
DATASHEET_PEAK = {"fp32": 67.0, "tf32": 495.0, "fp16": 990.0, "bf16": 990.0}


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


def layer_rows(net, repeats):
    """[(index, type, ms, TFLOP/s or None)] of each layer's forward timed on its own."""
    rows = []
    for layer, (f, _) in zip(net.layers, layer_seconds(net, False, 3, repeats)):
        rate = (
            layer.bflops * net.batch / f / 1e3 if layer.type == "convolutional" and f > 0 else None
        )
        rows.append((layer.index, layer.type, 1e3 * f, rate))
    return rows


def forward_rows(precision, repeats):
    """({key: ms}, layer rows, whole-call parts or {}, GPU name) of one precision."""
    net = load_network(CFG, batch=BATCH, device="cuda", precision=precision)
    prepare(net)
    be = net.be
    rng = np.random.default_rng(0)
    photos = rng.integers(0, 256, (BATCH, 416, 416, 3), dtype=np.uint8)
    floats = np.ascontiguousarray(photos[..., ::-1].transpose(0, 3, 1, 2), dtype=np.float32)
    floats /= np.float32(255)
    name = f"yolov3tiny_b64_forward_%s_ms_{precision}"
    rows, parts = {}, {}
    if precision == "fp16":
        rows[name % "whole"] = wall_ms(be, lambda: net.predict(photos), 3, repeats)
        rows[name % "whole" + "_from_fp32"] = wall_ms(be, lambda: net.predict(floats), 3, repeats)
        large = rng.integers(0, 256, (BATCH, 480, 640, 3), dtype=np.uint8)
        rows[name % "whole" + "_640x480"] = wall_ms(be, lambda: net.predict(large), 3, repeats)
        parts = whole_call_parts(net, photos, floats, repeats)
        rows[name % "whole_in_parts"] = parts["predict_in_parts(photos, 16)"]
    net.predict(photos)
    rows[name % "graph"] = 1e3 * median_seconds(be, net.infer, 3, repeats)
    layers = layer_rows(net, repeats)
    rows[name % "layers"] = sum(ms for _, _, ms, _ in layers)
    return rows, layers, parts, be.device_name


def whole_call_parts(net, photos, floats, repeats):
    """{step: wall ms} of the whole call's parts, each waited for: the input staged from
    photos or from floats (the call less the layers alone), the layers (graph replay), the
    output's download; and predict_in_parts on the photos (4 parts of 16: the copies beside
    the layers). Leaves the network at batch 64."""
    be = net.be
    out = net.output_index

    def waited(fn):
        return lambda: (fn(), be.synchronize())

    layers = wall_ms(be, waited(net.infer), 2, repeats)
    parts = {
        "photos staged": wall_ms(be, waited(lambda: net.infer_photos(photos)), 2, repeats) - layers,
        "floats staged": wall_ms(be, waited(lambda: net.infer(floats)), 2, repeats) - layers,
        "layers (graph replay)": layers,
        "output download": wall_ms(be, lambda: net.layer_output(out), 2, repeats),
        "predict_in_parts(photos, 16)": wall_ms(
            be, lambda: net.predict_in_parts(photos, BATCH // 4), 2, repeats
        ),
    }
    net.set_batch(BATCH)
    return parts


def torch_graph(model, x):
    """(graph, its output) of model(x) recorded as a CUDA graph after 3 warm-up calls on a
    side stream, as PyTorch's documentation records one."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            model(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(x)
    return graph, out


def batch1_rows(repeats):
    """{key: ms} of one image's whole call (predict on a float32 array, the output back on
    the host) in fp32, tf32 and fp16, and of its layers alone (graph replay, waited)."""
    rows = {}
    x = np.random.default_rng(0).random((1, 3, 416, 416), dtype=np.float32)
    for precision in ("fp32", "tf32", "fp16"):
        net = load_network(CFG, batch=1, device="cuda", precision=precision)
        prepare(net)
        be = net.be
        whole = wall_ms(be, lambda: net.predict(x), 5, 5 * repeats)
        net.predict(x)
        layers = wall_ms(be, lambda: (net.infer(), be.synchronize()), 5, 5 * repeats)
        rows[f"yolov3tiny_b1_forward_whole_ms_{precision}"] = whole
        rows[f"yolov3tiny_b1_forward_layers_ms_{precision}"] = layers
    rows["yolov3tiny_b1_forward_whole_ms"] = rows["yolov3tiny_b1_forward_whole_ms_fp32"]
    return rows


def torch_batch1_ms(repeats):
    """PyTorch's whole call on one image: the float32 NumPy array copied into the graph's
    input, yolov3-tiny in TF32 (cuDNN, channels_last) replayed as a CUDA graph, the output
    copied back to a NumPy array; wall ms, median."""
    import torch

    from bench.torch_port import DarknetPort

    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    model = DarknetPort(CFG).cuda().eval().to(memory_format=torch.channels_last)
    static_in = torch.zeros(1, 3, 416, 416, device="cuda").to(memory_format=torch.channels_last)
    with torch.inference_mode():
        graph, static_out = torch_graph(model, static_in)
        out = static_out[-1] if isinstance(static_out, (list, tuple)) else static_out
        x = np.random.default_rng(0).random((1, 3, 416, 416), dtype=np.float32)

        def call():
            static_in.copy_(torch.from_numpy(x))
            graph.replay()
            return out.cpu().numpy()

        times = []
        for i in range(5 + 5 * repeats):
            t0 = time.perf_counter()
            call()
            if i >= 5:
                times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def torch_layers_ms(repeats):
    """PyTorch's forward of yolov3-tiny (bench/torch_port.py: the cfg's layers one for one),
    AMP fp16, channels_last, one CUDA graph replay per timed run; ms, median."""
    import torch

    from bench.torch_port import DarknetPort

    torch.backends.cudnn.benchmark = True
    model = DarknetPort(CFG).cuda().eval().to(memory_format=torch.channels_last)
    x = torch.rand(BATCH, 3, 416, 416, device="cuda").to(memory_format=torch.channels_last)
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        graph, _ = torch_graph(model, x)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        graph.replay()
    times = []
    for _ in range(repeats):
        start.record()
        graph.replay()
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop))
    return statistics.median(times)


def markdown(gpu, repeats, per_precision, parts, rows):
    lines = [
        f"\n## {utc_now()}, the batch-64 forward (bench/networks/forward.py), {gpu}",
        "",
        f"yolov3-tiny 416, batch {BATCH}, random weights; medians of {repeats}.",
        "",
        "| layer | type | "
        + " | ".join(f"{p} ms (TFLOP/s, share of peak)" for p in per_precision)
        + " |",
        "|---|---|" + "---|" * len(per_precision),
    ]
    first = next(iter(per_precision.values()))
    for i, (index, kind, _, _) in enumerate(first):
        cells = []
        for p, layers in per_precision.items():
            _, _, ms, rate = layers[i]
            cells.append(
                f"{ms:.3f}"
                + ("" if rate is None else f" ({rate:.1f}, {100 * rate / DATASHEET_PEAK[p]:.0f}%)")
            )
        lines.append(f"| {index} | {kind} | " + " | ".join(cells) + " |")
    if parts:
        lines += ["", "| whole call, step alone (wall) | ms |", "|---|---|"]
        lines += [f"| {name} | {value:.2f} |" for name, value in parts.items()]
    lines += ["", "| row | ms |", "|---|---|"]
    return lines + [f"| {name} | {value:.2f} |" for name, value in rows.items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--precisions", nargs="+", default=["fp16"], choices=sorted(DATASHEET_PEAK))
    ap.add_argument("--torch", action="store_true", help="also time PyTorch's twin")
    ap.add_argument("--batch1", action="store_true", help="also time one image's whole call")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", help=f"merge fp16's rows into this file ({RESULTS_JSON})")
    ap.add_argument("--results", help="append a dated section to this Markdown file")
    args = ap.parse_args()
    rows, per_precision, parts, gpu = {}, {}, {}, "unknown GPU"
    for precision in args.precisions:
        got, per_precision[precision], got_parts, gpu = forward_rows(precision, args.repeats)
        rows.update(got)
        parts.update(got_parts)
    if args.torch:
        rows["torch_yolov3tiny_b64_forward_layers_ms_fp16"] = torch_layers_ms(args.repeats)
    if args.batch1:
        rows.update(batch1_rows(args.repeats))
        if args.torch:
            rows["torch_yolov3tiny_b1_forward_whole_ms"] = torch_batch1_ms(args.repeats)
    lines = markdown(gpu, args.repeats, per_precision, parts, rows)
    print("\n".join(lines))
    if args.json:
        kept = {k: v for k, v in rows.items() if "_fp16" in k or "_b1_" in k}
        merge_json(args.json, kept, gpu, digits=3)
    if args.results:
        append_section(args.results, lines)


if __name__ == "__main__":
    main()
