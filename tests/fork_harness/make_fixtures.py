"""Make the fork training fixtures (tests/fixtures/fork_train/*.npz) from the AlexeyAB C code.

Needs the fork built for the CPU (GPU=0 AVX=0 OPENMP=0) and fork_train_step built from it
(tests/fork_harness/build.sh). Each case: a cfg, seeded images and truth boxes; the harness
initialises the network with the fork's own random start (saved and stored in the npz as the
bytes of a .weights file), runs ITERATIONS train_network calls on the same data, and dumps
every layer's output and delta of the last pass and every parameter after the last update.

usage: python tests/fork_harness/make_fixtures.py [HARNESS] [CASE ...]   (CASE "nms": the
NMS fixtures, tests/fixtures/fork_nms, made with fork_detect beside HARNESS)

With FORK_BUILD=gpu (a harness built against the fork's GPU=1 CUDNN=1 build, on a GPU
machine: make_gpu_fixtures.sh) the fixtures go to tests/fixtures/fork_train_gpu, the steps of
the GPU build that the default "alexeyab" flavour follows. DARKNET_CFG_AB: where the fork's
stock cfgs are (default ../shared/darknet-cfg-ab).

Case a5_train_yolov4tiny takes its cfg, start weights, input and truth from the shared fixture
of that name (FIXTURES_AB, default ../shared/fixtures-ab, made by the fork's CPU build through
harness/abharness.c), so that the GPU build's step of it can be set beside it; its fixture
stores none of them (tests/test_fork_train_a5.py reads them from there).
"""

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GPU_BUILD = os.environ.get("FORK_BUILD", "cpu") == "gpu"
OUT = HERE.parent / "fixtures" / ("fork_train_gpu" if GPU_BUILD else "fork_train")
STOCK = Path(os.environ.get("DARKNET_CFG_AB", HERE.parents[2] / "shared" / "darknet-cfg-ab"))
FIXTURES_AB = Path(os.environ.get("FIXTURES_AB", HERE.parents[2] / "shared" / "fixtures-ab"))
# What the fixtures say they were made with.
BUILD = "59596d78 GPU=1 CUDNN=1" if GPU_BUILD else "59596d78"
MAX_BOXES, TRUTH_FIELDS = 200, 6

NET = """[net]
batch={batch}
subdivisions={subdivisions}
width={size}
height={size}
channels=3
momentum=0.9
decay=0.0005
learning_rate={rate}
burn_in={burn_in}
max_batches=100
{net_extra}
"""

# A small detector: two BN convolutions, a logistic or linear head, one [yolo].
SMALL = """
[convolutional]
batch_normalize=1
filters=8
size=3
stride=2
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=16
size=3
stride=2
pad=1
activation={mid_act}

[convolutional]
size=1
stride=1
pad=1
filters={head}
activation={head_act}

[yolo]
mask=0,1,2
anchors=4,6, 10,8, 12,20, 24,16, 30,34, 52,40
classes=3
num=6
jitter=.3
{yolo}
"""


# Layers whose deltas the fork treats apart: a [batchnorm] (no beta gradient, copies its
# delta back), route/upsample (deltas never cleared), a weighted shortcut, over 2 passes.
LAYERS = """
[convolutional]
filters=8
size=3
stride=2
pad=1
activation=leaky

[batchnorm]

[convolutional]
batch_normalize=1
filters=8
size=3
stride=1
pad=1
activation=mish

[route]
layers=-1,-3

[maxpool]
size=2
stride=2

[convolutional]
batch_normalize=1
filters=16
size=3
stride=1
pad=1
activation=leaky

[upsample]
stride=2

[shortcut]
from=-5
weights_type=per_channel
weights_normalization=relu
activation=linear

[convolutional]
size=1
stride=1
pad=1
filters=24
activation=linear

[yolo]
mask=0,1,2
anchors=4,6, 10,8, 12,20, 24,16, 30,34, 52,40
classes=3
num=6
iou_loss=ciou
iou_normalizer=0.07
scale_x_y=1.05
"""


# A classifier: the fork never updates a [connected] layer on the CPU (its l.train is 0).
CLASSIFIER = """
[convolutional]
batch_normalize=1
filters=4
size=3
stride=2
pad=1
activation=leaky

[connected]
output=8
activation=leaky

[connected]
output=3
activation=linear

[softmax]
"""


def tiny_yolov4(classes=3, shrink=16):
    """The fork's stock yolov4-tiny.cfg with its [net] replaced, filters / shrink (heads:
    3 * (classes + 5)), `classes` classes."""
    text = (STOCK / "yolov4-tiny.cfg").read_text()
    body = text[text.index("[convolutional]") :]
    head = 3 * (classes + 5)
    body = re.sub(
        r"filters=(\d+)",
        lambda m: (
            f"filters={head}"
            if m.group(1) == "255"
            else f"filters={max(int(m.group(1)) // shrink, 2)}"
        ),
        body,
    )
    return body.replace("classes=80", f"classes={classes}")


def image_floats(pixels):
    """The network input of uint8 pixels, as Darknet loads an image: pixel / 255 in float32."""
    return (pixels.astype(np.float32) / np.float32(255)).astype(np.float32)


def truth_rows(rng, images, boxes, classes=3):
    y = np.zeros((images, MAX_BOXES, TRUTH_FIELDS), np.float32)
    for b in range(images):
        for t in range(boxes):
            w, h = rng.uniform(0.08, 0.6, 2)
            x, yy = rng.uniform(w / 2 + 0.01, 1 - w / 2), rng.uniform(h / 2 + 0.01, 1 - h / 2)
            y[b, t] = (x, yy, w, h, rng.integers(classes), 0)
    return y.reshape(images, -1)


STEPS = "policy=steps\nsteps=3,5\nscales=.5,.1"


def small(
    yolo="",
    net_extra=STEPS,
    mid_act="leaky",
    head_act="linear",
    batch=2,
    size=32,
    iterations=2,
    rate=0.01,
    burn_in=2,
):
    return dict(
        cfg=NET.format(
            batch=batch, subdivisions=1, size=size, rate=rate, burn_in=burn_in, net_extra=net_extra
        )
        + SMALL.format(yolo=yolo, mid_act=mid_act, head_act=head_act, head=24),
        iterations=iterations,
        size=size,
        images=batch,
    )


CASES = {
    # The case: yolov4-tiny, filters / 16, 3 classes, 160x160, batch 2, 3 iterations.
    "yolov4tiny_step": dict(
        cfg=NET.format(batch=2, subdivisions=1, size=160, rate=0.00261, burn_in=2, net_extra=STEPS)
        + tiny_yolov4(),
        iterations=1,
        size=160,
        images=2,
    ),
    "subdivisions": dict(
        cfg=NET.format(batch=4, subdivisions=2, size=32, rate=0.01, burn_in=0, net_extra=STEPS)
        + SMALL.format(
            yolo="iou_loss=ciou\niou_normalizer=0.07", mid_act="leaky", head_act="linear", head=24
        ),
        iterations=2,
        size=32,
        images=4,
    ),
    "mse": small("iou_loss=mse\nignore_thresh=.5\nscale_x_y=1.2"),
    "iou": small("iou_loss=iou\niou_normalizer=0.5\ncls_normalizer=2.0\nobj_normalizer=0.7"),
    "giou": small("iou_loss=giou\niou_normalizer=0.3\nmax_delta=0.05\nignore_thresh=.3"),
    "diou": small("iou_loss=diou\niou_normalizer=0.1\niou_thresh=0.2\nlabel_smooth_eps=0.1"),
    "ciou": small(
        "iou_loss=ciou\niou_normalizer=0.07\nscale_x_y=1.05\nobjectness_smooth=1\n"
        "delta_normalizer=0.5"
    ),
    "new_coords": small(
        "iou_loss=ciou\niou_normalizer=0.07\nscale_x_y=2.0\nnew_coords=1\niou_thresh=0.2",
        head_act="logistic",
    ),
    "mish_sgdr": small(
        "iou_loss=ciou",
        net_extra="policy=sgdr\nsgdr_cycle=2\npower=2\nmosaic=0\ncutmix=0",
        mid_act="mish",
        iterations=4,
        burn_in=2,
    ),
    "loss_scale": small("iou_loss=giou", net_extra=STEPS + "\nloss_scale=128", iterations=2),
    "adam": small("iou_loss=ciou", net_extra=STEPS + "\nadam=1\nB1=0.8\nB2=0.99\neps=0.0001"),
    "multipliers": small(
        "iou_loss=ciou\niou_normalizer=0.07\ncounters_per_class=10,50,200\n"
        "max_delta=5\niou_thresh=0.3\niou_thresh_kind=giou"
    ),
    "resumed": dict(small("iou_loss=ciou\niou_normalizer=0.07"), seen=8),
    "show_details": small("iou_loss=giou\niou_normalizer=0.3\nshow_details=0"),
    # probability=0: the C RNG's draws cannot be matched, the dropout's delta handling can.
    "dropout": dict(
        cfg=NET.format(batch=4, subdivisions=2, size=32, rate=0.01, burn_in=0, net_extra=STEPS)
        + SMALL.format(yolo="iou_loss=ciou", mid_act="leaky", head_act="linear", head=24).replace(
            "\n[convolutional]\nsize=1", "\n[dropout]\nprobability=0\n\n[convolutional]\nsize=1", 1
        ),
        iterations=2,
        size=32,
        images=4,
    ),
    "classifier": dict(
        cfg=NET.format(batch=4, subdivisions=2, size=16, rate=0.1, burn_in=0, net_extra=STEPS)
        + CLASSIFIER,
        iterations=2,
        size=16,
        images=4,
        classes=3,
    ),
    "layers": dict(
        cfg=NET.format(batch=4, subdivisions=2, size=32, rate=0.01, burn_in=0, net_extra=STEPS)
        + LAYERS,
        iterations=3,
        size=32,
        images=4,
    ),
}


# yolov4-tiny's block in small: convolution 0 is read by a grouped route (groups=2
# group_id=1, feeding a convolution whose CPU col2im overwrites that route's delta) and by
# the route closing the block; two passes per iteration.
GROUPED_ROUTE = """
[convolutional]
batch_normalize=1
filters=8
size=3
stride=2
pad=1
activation=leaky

[route]
layers=-1
groups=2
group_id=1

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[route]
layers=-1,-2

[convolutional]
batch_normalize=1
filters=8
size=1
stride=1
pad=1
activation=leaky

[route]
layers=-6,-1

[maxpool]
size=2
stride=2

[convolutional]
size=1
stride=1
pad=1
filters=24
activation=linear

[yolo]
mask=0,1,2
anchors=4,6, 10,8, 12,20, 24,16, 30,34, 52,40
classes=3
num=6
iou_loss=ciou
scale_x_y=1.05
"""
CASES["grouped_route"] = dict(
    cfg=NET.format(batch=4, subdivisions=2, size=32, rate=0.01, burn_in=2, net_extra=STEPS)
    + GROUPED_ROUTE,
    iterations=2,
    size=32,
    images=4,
)

# A shared fixture's step (see the module's docstring): one iteration, as that fixture has.
CASES["a5_train_yolov4tiny"] = dict(shared=True, iterations=1)


def max_pool_inputs(cfg):
    """The indices of the layers whose output a [maxpool] reads (the one before it)."""
    sections = re.findall(r"^\[(\w+)\]", cfg, re.MULTILINE)[1:]  # after [net]
    return {i - 1 for i, name in enumerate(sections) if name == "maxpool" and i}


def keep(key, value, arrays, pinned=()):
    """What the fixture keeps (< 1 MB): parameters, losses, rates, costs, and the outputs and
    deltas of the [yolo] layers (those with a cost) and of small layers; and the outputs of
    the layers in `pinned`, which the test hands on instead of its own (a max pool's input:
    its choice between near-equal values follows the fork's numbers)."""
    if not key.endswith(("_output", "_delta")):
        return True
    layer = key.rsplit("_", 1)[0]
    if key.endswith("_output") and int(layer.split("_")[1]) in pinned:
        return True
    return f"{layer}_cost" in arrays or value.size <= 4096


def shared_case(name):
    """(cfg, x, y, start weights) of the shared fixture `name`, or None where it is absent."""
    source = FIXTURES_AB / name
    if not source.is_dir():
        return None
    ref = np.load(source / f"{name}.npz")
    return (
        (source / f"{name}.cfg").read_text(),
        ref["input"],
        ref["truth"],
        str(source / f"{name}.weights"),
    )


def make(harness, name, case, seed, debug=None):
    if case.get("shared"):
        inputs = shared_case(name)
        if inputs is None:
            print(name, "skipped:", FIXTURES_AB / name, "is absent (set FIXTURES_AB)")
            return
        cfg, x, y, start = inputs
        pixels = None
    else:
        cfg, start = case["cfg"], "-"
        rng = np.random.default_rng(seed)
        images, size = case["images"], case["size"]
        pixels = rng.integers(0, 256, (images, 3, size, size), dtype=np.uint8)
        x = image_floats(pixels)
        if case.get("classes"):  # a classifier: one-hot rows
            y = np.eye(case["classes"], dtype=np.float32)[
                rng.integers(case["classes"], size=images)
            ]
        else:
            y = truth_rows(rng, images, boxes=3)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "net.cfg").write_text(cfg)
        x.tofile(tmp / "x.f32")
        y.tofile(tmp / "y.f32")
        if case.get("seen"):
            # Resume: the fork's random start with `seen` images in the weights header.
            subprocess.run(
                [
                    harness,
                    str(tmp / "net.cfg"),
                    "-",
                    str(tmp / "x.f32"),
                    str(tmp / "y.f32"),
                    "0",
                    str(tmp / "out.bin"),
                    str(tmp / "start.weights"),
                ],
                check=True,
                capture_output=True,
            )
            blob = bytearray((tmp / "start.weights").read_bytes())
            blob[12:20] = np.uint64(case["seen"]).tobytes()
            (tmp / "start.weights").write_bytes(bytes(blob))
            start = str(tmp / "start.weights")
        subprocess.run(
            [
                harness,
                str(tmp / "net.cfg"),
                start,
                str(tmp / "x.f32"),
                str(tmp / "y.f32"),
                str(case["iterations"]),
                str(tmp / "out.bin"),
                str(tmp / "init.weights"),
            ],
            check=True,
            capture_output=True,
        )
        arrays = read_records((tmp / "out.bin").read_bytes())
        init = np.frombuffer((tmp / "init.weights").read_bytes(), np.uint8)
    if debug:
        Path(debug).mkdir(parents=True, exist_ok=True)
        np.savez(Path(debug) / f"{name}_full.npz", **arrays)
    pinned = max_pool_inputs(cfg) if case.get("shared") else ()
    arrays = {k: v for k, v in arrays.items() if keep(k, v, arrays, pinned)}
    if case.get("shared"):  # cfg, weights, input and truth: the shared fixture's
        given = dict(shared_case=name)
    else:
        given = dict(init_weights=init, pixels=pixels, truth=y)
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        OUT / f"{name}.npz",
        cfg=cfg,
        iterations=case["iterations"],
        darknet_commit=BUILD,
        **given,
        **arrays,
    )
    print(name, (OUT / f"{name}.npz").stat().st_size, "bytes, losses", arrays["losses"])


def read_records(blob):
    arrays, pos = {}, 0
    while pos < len(blob):
        (n,) = np.frombuffer(blob, np.int32, 1, pos)
        name = blob[pos + 4 : pos + 4 + n].decode()
        pos += 4 + n
        (count,) = np.frombuffer(blob, np.int32, 1, pos)
        arrays[name] = np.frombuffer(blob, np.float32, count, pos + 4).copy()
        pos += 4 + 4 * count
    return arrays


if __name__ == "__main__":
    harness = sys.argv[1] if len(sys.argv) > 1 else "/tmp/forktrain/fork_train_step"
    names = sys.argv[2:] or list(CASES) + ["nms"]
    for i, name in enumerate(CASES):
        if name in names:
            make(harness, name, CASES[name], 4000 + i, debug="/tmp/forktrain")


# ---- NMS: fork_detect on the stock yolov4-tiny.cfg (letter_box=1) with the seeded random
# weights of ../shared/fixtures-ab/a1_yolov4tiny, dog.jpg letterboxed to 416x416.
NMS_OUT = HERE.parent / "fixtures" / "fork_nms"
NMS_CASES = {
    "dog_yolov4tiny": dict(thresh=0.92, nms=0.45, beta=0.6),
    "dog_yolov4tiny_beta": dict(thresh=0.88, nms=0.3, beta=0.85),
}
NMS_KINDS = ("default", "greedynms", "diounms", "cornersnms")


def make_nms(detector, name, case):
    shared = HERE.parents[2] / "shared"
    cfg = (STOCK / "yolov4-tiny.cfg").read_text().replace("[net]\n", "[net]\nletter_box=1\n", 1)
    weights = shared / "fixtures-ab" / "a1_yolov4tiny" / "a1_yolov4tiny.weights"
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "net.cfg").write_text(cfg)
        subprocess.run(
            [
                detector,
                str(tmp / "net.cfg"),
                str(weights),
                str(shared / "images" / "dog.jpg"),
                str(case["thresh"]),
                str(case["nms"]),
                str(case["beta"]),
                str(tmp / "out.bin"),
            ],
            check=True,
            capture_output=True,
        )
        arrays = read_records((tmp / "out.bin").read_bytes())
    n, classes, img_w, img_h = (int(v) for v in arrays.pop("meta"))
    shaped = {k: v.reshape(n, -1) if v.size != n else v for k, v in arrays.items()}
    kept = {
        f"{kind}_kept": int((shaped[f"{kind}_probs"].max(axis=1) > case["thresh"]).sum())
        for kind in NMS_KINDS
    }
    NMS_OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        NMS_OUT / f"{name}.npz",
        cfg=cfg,
        classes=classes,
        image_w=img_w,
        image_h=img_h,
        darknet_commit="59596d78",
        **case,
        **kept,
        **shaped,
    )
    print(name, (NMS_OUT / f"{name}.npz").stat().st_size, "bytes,", n, "detections, kept", kept)


if __name__ == "__main__" and "nms" in (sys.argv[2:] or ["nms"]):
    for name, case in NMS_CASES.items():
        make_nms(str(Path(sys.argv[1]).with_name("fork_detect")), name, case)
