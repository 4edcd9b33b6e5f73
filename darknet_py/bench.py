"""`darknet-py bench`: how fast a cfg runs on a device.

Random weights (timings do not depend on the values, but batch norm gets plausible
statistics so nothing overflows), a random input batch, warm-up runs, then the median of
timed runs through the backend's timer (CUDA events on the GPU, the wall clock on the
CPU): a forward (inference, as predict() runs it: upload, layers, download) and those
three parts on their own, and with train=True a training step.
With layers=True every layer is also timed on its own (forward, and backward when
training), each layer's run fed with the outputs of the full pass before it.
"""

import math
import statistics

import numpy as np

from .errors import DarknetError
from .predictions import DETECTOR_TYPES

MAX_BOXES = 90  # Darknet's truth buffer: 90 boxes of (x, y, w, h, class) per image


class BenchError(DarknetError):
    """Options a benchmark cannot run with (one line, exit code 2)."""


def random_truth(net, rng):
    """A training target for the network's last layer: a few boxes per image for a
    detector, a one-hot class per image otherwise."""
    last = net.layers[-1]
    while last.type == "cost" and last.index > 0:
        last = net.layers[last.index - 1]
    if last.type in DETECTOR_TYPES:
        classes = getattr(last, "classes", 1)
        truth = np.zeros((net.batch, MAX_BOXES * 5), dtype=np.float32)
        for b in range(net.batch):
            for j in range(3):
                w, h = rng.uniform(0.05, 0.4, 2)
                x, y = rng.uniform(w / 2, 1 - w / 2), rng.uniform(h / 2, 1 - h / 2)
                truth[b, 5 * j : 5 * j + 5] = (x, y, w, h, rng.integers(0, classes))
        return truth
    return np.eye(last.outputs, dtype=np.float32)[rng.integers(0, last.outputs, net.batch)]


def prepare(net, seed=0):
    """Give batch-norm layers usable rolling statistics (fresh ones have zero variance,
    which inference divides by) and silence per-step training statistics."""
    rng = np.random.default_rng(seed)
    for layer in net.layers:
        layer.verbose = False
        # A recurrent layer's statistics are its inner layers' (param_owners lists them).
        for owner in layer.param_owners():
            if getattr(owner, "batch_normalize", 0):
                net.be.write(owner.rolling_mean, rng.normal(0.0, 0.1, owner.out_c))
                net.be.write(owner.rolling_variance, rng.uniform(0.5, 2.0, owner.out_c))
    net.params_changed()


def sequence_rows(layers):
    """The fewest rows a batch can have: one whole sequence for every time-stepped layer
    (the least common multiple of their time_steps), 1 without such layers."""
    rows = 1
    for layer in layers:
        rows = math.lcm(rows, getattr(layer, "steps", 1))
    return rows


def bench_batch(cfg, batch=None, darknet=None):
    """The batch to time: `batch`, or when not given the smallest that holds whole
    sequences (1 for a cfg without time steps). A given batch that a time-stepped layer
    cannot split into its time_steps (Darknet's batch of such a cfg is sequences x
    time_steps) is refused in one line."""
    from .network import build_network

    layers = build_network(cfg, batch=batch or 1, darknet=darknet).layers
    if batch is None:
        return sequence_rows(layers)
    for layer in layers:
        steps = getattr(layer, "steps", 1)
        if batch % steps:
            raise BenchError(
                f"{cfg}: layer {layer.index} [{layer.type}] runs time_steps="
                f"{steps}: give --batch a multiple of {steps} (--batch {steps} "
                f"is one sequence), not {batch}"
            )
    return batch


def parts_of_whole_sequences(net, parts=4):
    """The rows of each of `parts` equal parts of the network's batch when each holds
    whole sequences and the batch is big enough (32) for the split to be worth timing;
    else None (a part that cuts a sequence cannot run its time steps)."""
    batch = net.batch
    if batch < 32 or batch % parts or (batch // parts) % sequence_rows(net.layers):
        return None
    return batch // parts


def median_seconds(be, run, warmup, repeats):
    for _ in range(warmup):
        run()
    timer = be.timer()
    times = []
    for _ in range(repeats):
        timer.start()
        run()
        times.append(timer.stop())
    return statistics.median(times)


def layer_seconds(net, train, warmup, repeats):
    """[(forward s, backward s or None)] per layer, each the median of its own timed runs
    on the state the last full pass left (the same input, delta and truth buffers)."""
    be = net.be
    rows = []
    for i, layer in enumerate(net.layers):
        prev = net.layers[i - 1] if i else None
        net.train = train

        def forward():
            net.input = prev.output if prev else net._net_input
            net.delta = prev.delta if prev else None
            layer.forward(net)

        fwd = median_seconds(be, forward, warmup, repeats)
        bwd = None
        if train:

            def backward():
                net.input = prev.output if prev else net._net_input
                net.delta = prev.delta if prev else None
                layer.backward(net)

            bwd = median_seconds(be, backward, warmup, repeats)
        rows.append((fwd, bwd))
    return rows


def forward_parts(net, x, warmup, repeats):
    """The forward's parts, each timed on its own: the input's upload, the layers alone
    (input already on the device, outputs left there) and the output's download."""
    be = net.be
    upload_s = median_seconds(be, lambda: net._stage(x, None, False), warmup, repeats)
    layers_s = median_seconds(be, net.infer, warmup, repeats)
    out = net.layers[net.output_index].output
    download_s = median_seconds(be, lambda: net.layer_output(net.output_index), warmup, repeats)
    return {
        "gpu_forward_ms": 1e3 * layers_s,
        "upload_ms": 1e3 * upload_s,
        "upload_bytes": int(x.nbytes),
        "download_ms": 1e3 * download_s,
        "download_bytes": int(out.size * out.itemsize),
    }


def run_bench(net, train=False, layers=False, warmup=3, repeats=20, seed=0):
    """The figures of one benchmark as a dict (see `darknet-py bench --help`)."""
    rng = np.random.default_rng(seed)
    prepare(net, seed)
    be = net.be
    x = rng.random((net.batch,) + net.input_shape, dtype=np.float32)
    engine = net.engine if net.engine == "onnxruntime" else None
    device = f"{be.name} ({engine})" if engine else be.name
    result = {
        "cfg": net.path,
        "device": device,
        "batch": net.batch,
        "bflops": net.bflops,
        "precision": net.precision,
        "warmup": warmup,
        "repeats": repeats,
    }
    forward_s = median_seconds(be, lambda: net.predict(x), warmup, repeats)
    result["forward_ms"] = 1e3 * forward_s
    result["forward_images_per_s"] = net.batch / forward_s
    if not engine:  # ONNX Runtime takes host arrays as they are: no copies to time apart
        result.update(forward_parts(net, x, warmup, repeats))
    part = None if engine else parts_of_whole_sequences(net)
    if part:  # the copies of one part behind the layers of another
        batch = net.batch
        in_parts_s = median_seconds(be, lambda: net.predict_in_parts(x, part), warmup, repeats)
        result["forward_in_parts_ms"] = 1e3 * in_parts_s
        net.set_batch(batch)
    truth = None
    if train:
        net.share_deltas = True  # as `darknet-py train` trains (delta_plan.py,
        net.share_outputs = True  # output_plan.py)
        truth = random_truth(net, rng)
        be.reset_peak_allocated()  # training's own peak, its re-allocation included
        step_s = median_seconds(be, lambda: net.train_pass(x, truth), warmup, repeats)
        result["train_step_ms"] = 1e3 * step_s
        result["train_images_per_s"] = net.batch / step_s
        peak = be.peak_allocated_bytes
        result["train_peak_device_memory_bytes"] = None if peak is None else int(peak)
    if layers:
        net.forward(x, truth, train=train)  # the state each layer's timed runs start from
        if train:
            net.backward()
        per_layer = layer_seconds(net, train, warmup, repeats)
        fwd_total = sum(f for f, _ in per_layer) or 1.0
        bwd_total = sum(b for _, b in per_layer if b is not None) or 1.0
        result["layers"] = [
            {
                "index": layer.index,
                "type": layer.type,
                "forward_ms": 1e3 * f,
                "forward_share": f / fwd_total,
                # achieved arithmetic rate of a convolution's forward (bflops: per image)
                "forward_tflops": (
                    getattr(layer, "bflops", 0) * net.batch / f / 1e3
                    if layer.type == "convolutional" and f > 0
                    else None
                ),
                **({"backward_ms": 1e3 * b, "backward_share": b / bwd_total} if train else {}),
            }
            for layer, (f, b) in zip(net.layers, per_layer)
        ]
    peak = be.peak_allocated_bytes
    result["peak_device_memory_bytes"] = None if peak is None else int(peak)
    return result


def format_report(r):
    """The benchmark as text lines."""
    lines = [
        f"{r['cfg']}: batch {r['batch']}, {r['device']}, {r.get('precision', 'fp32')}, "
        f"{r['bflops']:.3f} BFLOPs per image; "
        f"medians of {r['repeats']} runs after {r['warmup']} warm-up",
        f"forward:       {r['forward_ms']:10.2f} ms  {r['forward_images_per_s']:9.1f} images/s",
    ]
    if "gpu_forward_ms" in r:  # not with ONNX Runtime, which reads host arrays itself
        lines += [
            f"  layers only: {r['gpu_forward_ms']:10.2f} ms  (input on the device, "
            f"output left there)",
            f"  upload:      {r['upload_ms']:10.2f} ms  ({r['upload_bytes'] / 2**20:.1f} MiB in)",
            f"  download:    {r['download_ms']:10.2f} ms  "
            f"({r['download_bytes'] / 2**20:.1f} MiB out)",
        ]
    if "forward_in_parts_ms" in r:
        lines.append(
            f"  in 4 parts:  {r['forward_in_parts_ms']:10.2f} ms  (predict_in_parts: "
            f"the copies of one part behind the layers of another)"
        )
    if "train_step_ms" in r:
        lines.append(
            f"training step: {r['train_step_ms']:10.2f} ms  {r['train_images_per_s']:9.1f} images/s"
        )
    peak = r["peak_device_memory_bytes"]
    lines.append(
        "peak device memory: " + ("not known (CPU)" if peak is None else f"{peak / 2**20:.1f} MiB")
    )
    if r.get("train_peak_device_memory_bytes") is not None:
        lines.append(
            "peak device memory while training: "
            f"{r['train_peak_device_memory_bytes'] / 2**20:.1f} MiB"
        )
    if "layers" in r:
        train = "train_step_ms" in r
        lines.append("")
        lines.append(
            "layer type            forward ms  share"
            + ("   backward ms  share" if train else "")
            + "  TFLOP/s"
        )
        for row in r["layers"]:
            rate = row.get("forward_tflops")
            line = (
                f"{row['index']:5d} {row['type']:<14s} {row['forward_ms']:11.3f} "
                f"{100 * row['forward_share']:5.1f}%"
            )
            if train:
                line += f" {row['backward_ms']:13.3f} {100 * row['backward_share']:5.1f}%"
            if rate:  # the forward's
                line += f" {rate:8.2f}"
            lines.append(line)
        fwd = sum(row["forward_ms"] for row in r["layers"])
        total = f"{'total':20s} {fwd:11.3f} 100.0%"
        if train:
            total += f" {sum(row['backward_ms'] for row in r['layers']):13.3f} 100.0%"
        lines.append(total)
    return lines
