"""What several test modules share: small cfgs, dataset writers and network helpers."""

import subprocess
import sys

import numpy as np

from darknet_py import demo_data
from darknet_py.boxes import TRUTH_FIELDS
from darknet_py.losses.detection import detection_grid_truth
from darknet_py.network import load_network
from darknet_py.weights import read_header

# ---- the tiny two-class "bars" classifier (its dataset: the `bars` fixture in conftest.py) ----
CLASSIFIER_CFG = """
[net]
batch={batch}
subdivisions={subdivisions}
width=12
height=12
channels=1
learning_rate=0.05
momentum={momentum}
decay=0.0005
max_batches={max_batches}
policy=poly
power=2
min_crop=12
max_crop=14
flip=0

[convolutional]
batch_normalize=1
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[convolutional]
filters=2
size=1
stride=1
pad=1
activation=linear

[avgpool]

[softmax]
"""


def write_classifier_cfg(
    tmp_path,
    name="tiny.cfg",
    batch=8,
    subdivisions=2,
    momentum=0.0,
    max_batches=6,
    text=CLASSIFIER_CFG,
):
    path = tmp_path / name
    path.write_text(
        text.format(
            batch=batch, subdivisions=subdivisions, momentum=momentum, max_batches=max_batches
        )
    )
    return str(path)


def data_file(root, backup):
    path = backup.parent / f"{backup.name}.data"
    path.write_text(
        f"classes=2\ntrain={root}/train.list\nvalid={root}/valid.list\n"
        f"names={root}/bars.names\nbackup={backup}/\n"
    )
    return str(path)


class Lines(list):
    def __call__(self, line):
        self.append(line)


# ---- data-parallel runs of the bars classifier, as `darknet-py train` subprocesses ------------
# No batch norm: its statistics are per pass and per rank, so split batches would differ.
NO_BN_CFG = CLASSIFIER_CFG.replace("batch_normalize=1\n", "")
# A rate that steps at iteration 3, so that a resume shows whether it continues at the right rate.
RUN_CFG = NO_BN_CFG.replace("policy=poly\npower=2\n", "policy=steps\nsteps=3\nscales=.5\n")


def write_run_cfg(tmp_path, max_batches=4):
    path = tmp_path / "tiny.cfg"
    path.write_text(RUN_CFG.format(batch=4, subdivisions=2, momentum=0.0, max_batches=max_batches))
    return str(path)


def darknet_py(*args, **popen):
    return subprocess.Popen(
        [sys.executable, "-m", "darknet_py", *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen,
    )


def finish(process, timeout=120):
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def weights_floats(path):
    """(seen, every float after the header) of a .weights file."""
    with open(path, "rb") as f:
        _, seen, _, offset = read_header(f, path)
    return seen, np.fromfile(path, dtype="<f4", offset=offset)


# ---- tiny digit detectors -------------------------------------------------------------------
def yolo_head(classes=10):
    """A 1x1 convolution and the [yolo] head it feeds: three anchors of 8 to 16 pixels."""
    return (
        f"[convolutional]\nfilters={3 * (classes + 5)}\nsize=1\nactivation=linear\n"
        f"[yolo]\nmask=0,1,2\nanchors=8,8, 12,12, 16,16\nclasses={classes}\nnum=3\n"
    )


def digit_set(root, n_train, n_valid, max_digits=2):
    """demo_data's detection set on 32x32 canvases, digits of 8 to 16 pixels: its .data path."""
    return demo_data.build_detection_set(
        root,
        n_train,
        n_valid,
        seed=0,
        canvas_size=32,
        max_digits=max_digits,
        min_digit=8,
        max_digit=16,
    )


# A small 10-class detector (untrained_detector writes it with its weights).
DETECTOR_CFG = """[net]
batch=1
width=32
height=32
channels=3
[convolutional]
batch_normalize=1
filters=4
size=3
pad=1
activation=leaky
[maxpool]
size=2
stride=2
""" + yolo_head(10)


def untrained_detector(directory):
    """(cfg, weights) of a small 10-class detector with random weights and usable
    batch-norm statistics, so that its boxes are finite."""
    cfg = directory / "det.cfg"
    cfg.write_text(DETECTOR_CFG)
    net = load_network(str(cfg), seed=4)
    unit_rolling_variance(net)
    weights = str(directory / "det.weights")
    net.save_weights(weights)
    return str(cfg), weights


# ---- transcriptions of Darknet's C ---------------------------------------------------------
def c_iou(a, b):
    """Darknet's box_iou (both forks), in Python floats: 0 when there is no overlap."""

    def overlap(x1, w1, x2, w2):
        return min(x1 + w1 / 2, x2 + w2 / 2) - max(x1 - w1 / 2, x2 - w2 / 2)

    w, h = overlap(a[0], a[2], b[0], b[2]), overlap(a[1], a[3], b[1], b[3])
    inter = 0 if w < 0 or h < 0 else w * h
    union = a[2] * a[3] + b[2] * b[3] - inter
    return 0.0 if inter == 0 or union == 0 else inter / union


# ---- networks -------------------------------------------------------------------------------
def host_params(net):
    """Every parameter array on the host, by (layer index, name)."""
    return {(l.index, name): net.be.to_host(a).copy() for l in net.layers for name, a in l.params()}


def unit_rolling_variance(net):
    """Rolling variance 1 in every batch-norm layer: a fresh network's 0 would blow the
    outputs of an inference pass up."""
    for layer in net.layers:
        if getattr(layer, "rolling_variance", None) is not None:
            net.be.write(layer.rolling_variance, np.ones(layer.rolling_variance.size))


def random_batch_norm(net, rng, scales=False):
    """Plausible random batch-norm statistics (and scales), so that every layer of a fresh
    network carries real values: its rolling variance 0 is divided by in inference."""
    for layer in net.layers:
        if getattr(layer, "batch_normalize", 0):
            n = layer.out_c
            net.be.write(layer.rolling_mean, rng.normal(0, 0.1, n))
            net.be.write(layer.rolling_variance, rng.uniform(0.5, 2.0, n))
            if scales:
                net.be.write(layer.scales, rng.uniform(0.5, 1.5, n))


def param_arrays(net):
    """Every parameter array on the host, in layer order."""
    return [net.be.to_host(a) for l in net.layers for _, a in l.params()]


def adopt_forward_state(net, source):
    """Overwrite net's forward state (every layer's backend buffers other than parameters,
    deltas and accumulated updates: outputs, batch-norm x and statistics, dropout masks,
    max-pool choices) with source's after a step, so that net's backward starts from the
    same activations. Without it, one activation within rounding of a kink (leaky's 0, a
    tie between maxima) may take the other branch on each backend, and comparing the two
    backwards would measure that accident, not the backward (cifar's layer 10 has an
    output 7.6e-7 standard deviations from zero)."""
    for layer, twin in zip(net.layers, source.layers):
        skip = {name for name, _ in layer.params()} | {"delta"}
        for name, value in vars(layer).items():
            theirs = getattr(twin, name, None)
            if (
                name in skip
                or name.endswith("_updates")
                or not isinstance(value, np.ndarray)
                or theirs is None
            ):
                continue
            if not isinstance(theirs, np.ndarray):  # a backend buffer (host settings are)
                theirs = source.be.to_host(theirs)
            value[...] = np.asarray(theirs).reshape(value.shape)


def assert_same_update(before, cpu, gpu):
    """The GPU network's parameters moved from `before` as the CPU network's did, to 1e-3 of
    each array's largest step."""
    for i, (b, c, g) in enumerate(zip(before, param_arrays(cpu), param_arrays(gpu))):
        step = np.max(np.abs(c - b))
        assert np.max(np.abs(g - c)) <= 1e-3 * step + 1e-7, f"parameter array {i}"


def grid_truth_from_boxes(boxes, side, classes):
    """The [detection] grid truth (detection_grid_truth) of one image's (n, 5) rows of
    (x, y, w, h, class): float32 (side*side*(5 + classes),)."""
    boxes = np.asarray(boxes, dtype=np.float32).reshape(1, -1)
    grid = np.zeros(side * side * (5 + classes), dtype=np.float32)
    detection_grid_truth(boxes, 1, TRUTH_FIELDS, boxes.size, side, classes, grid)
    return grid


def write_synthetic_tree(path, classes, seed=0):
    """A Darknet tree file of `classes` classes (10 roots, then up to 6 children for each
    class in turn, siblings together), e.g. in place of Darknet's data/9k.tree."""
    rng = np.random.default_rng(seed)
    parents = [-1] * min(10, classes)
    node = 0
    while len(parents) < classes:
        children = min(int(rng.integers(0, 7)), classes - len(parents))
        parents += [node] * children
        node += 1
    path.write_text("".join(f"c{i} {p}\n" for i, p in enumerate(parents)))
    return path
