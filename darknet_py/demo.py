"""`make demo`: train a digit classifier and a digit detector from scratch, on the CPU.

    python -m darknet_py.demo [--out demo-run] [--seed 0]

1. builds two datasets from the bundled 8x8 UCI handwritten digits in demo-run/
   (git-ignored; rebuilt on every run): single digits for the classifier, and 64x64
   canvases with a few tinted digits each for the detector;
2. trains cfg/digits-classifier.cfg and validates it (top-1 must reach 95%);
3. cuts the classifier's first 5 layers into a pretrained backbone (Darknet's
   `partial`), trains cfg/digits-yolo.cfg from it with mAP evaluation, validates it;
4. detects digits on held-out canvases and writes demo-run/predictions.png.

Each step prints the darknet-py command that does the same. Uses a CUDA GPU when one
is available, else NumPy on the CPU (about 5 minutes on two cores).
"""

import argparse
import os
import shutil
import sys
import time

# The repository's cfg/ folder, reached through the package (darknet_py/cfgs links to it in
# a checkout and is package data in a wheel), so the demo runs from a pip install too.
REPO_CFG = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "cfgs"))
CLASSIFIER_CFG = os.path.join(REPO_CFG, "digits-classifier.cfg")
DETECTOR_CFG = os.path.join(REPO_CFG, "digits-yolo.cfg")
BACKBONE_LAYERS = 5  # conv, max, conv, max, conv: shared by both cfgs
TOP1_NEEDED = 0.95
# Digits 16-28 px tall, about the classifier's scale (24x24 crops), so its layers carry
# over: with 12-28 px the detector's AP for 8 and 9 was 0.56 and 0.62, with 16-28 0.74 and
# 0.78 (same cfg and training).
DETECTION_SET = dict(
    n_train=2000, n_valid=200, canvas_size=64, max_digits=4, min_digit=16, max_digit=28
)
SHOW_THRESH = 0.4  # detections drawn in predictions.png (Darknet: .5 for detect)
SHOW_CANVASES = 6


def _single_threaded_blas():
    """Re-run this process with one BLAS thread unless the user chose a number. The
    demo's matrices are small: a second OpenBLAS thread costs more in hand-offs than it
    gains, and the data loader's worker process uses the other core."""
    if "OPENBLAS_NUM_THREADS" in os.environ or os.environ.get("DARKNET_PY_DEMO_CHILD"):
        return
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", DARKNET_PY_DEMO_CHILD="1")
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "darknet_py.demo", *sys.argv[1:]], env)


def _step(title):
    print(f"\n== {title} ==", flush=True)


def _command(text):
    print(f"   (the same from the shell: {text})", flush=True)


def _relative(path):
    rel = os.path.relpath(path)
    return rel if not rel.startswith("..") else path


def _clean_backup(data_path):
    """Remove a previous demo run's weights: the demo owns demo-run/."""
    backup = os.path.join(os.path.dirname(data_path), "backup")
    shutil.rmtree(backup, ignore_errors=True)
    os.makedirs(backup, exist_ok=True)
    return backup


def _draw_predictions(net, paths, names, out_path):
    """Detect on held-out canvases, print what was found against the truth, and save a
    mosaic of the canvases (enlarged 4x) with labelled boxes."""
    import cv2
    import numpy as np

    from .data.labels import read_image_labels
    from .predictions import draw_detections

    tiles = []
    for path in paths:
        bgr = cv2.imread(path, cv2.IMREAD_COLOR)
        dets = net.detect(path, thresh=SHOW_THRESH, nms=0.45)
        truth = read_image_labels(path, len(names))
        # Left to right, as one reads them.
        found = sorted(dets, key=lambda d: d.box[0])
        wanted = [names[int(c)] for c in truth[np.argsort(truth[:, 0]), 4]]
        got = ", ".join(f"{d.name} {100 * d.prob:.0f}%" for d in found) or "nothing"
        print(f"   {os.path.basename(path)}: truth {' '.join(wanted)}  ->  found {got}")
        big = cv2.resize(bgr, (bgr.shape[1] * 4, bgr.shape[0] * 4), interpolation=cv2.INTER_NEAREST)
        tiles.append(
            cv2.copyMakeBorder(
                draw_detections(big, dets, names),
                4,
                4,
                4,
                4,
                cv2.BORDER_CONSTANT,
                value=(255, 255, 255),
            )
        )
    while len(tiles) % 3:
        tiles.append(np.full_like(tiles[0], 255))
    rows = [np.hstack(tiles[i : i + 3]) for i in range(0, len(tiles), 3)]
    if not cv2.imwrite(out_path, np.vstack(rows)):
        raise OSError(f"{out_path}: cannot write the image")


def _parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m darknet_py.demo", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--out",
        default="demo-run",
        help="working directory, rebuilt on each run [default: demo-run]",
    )
    parser.add_argument("--seed", type=int, default=0, help="seeds data and training")
    return parser.parse_args(argv)


def _log(line):
    print(f"   {line}", flush=True)


def _build_datasets(out, seed):
    """Step 1: the classification and detection sets, each with an empty backup folder."""
    from . import demo_data

    _step("1/5 Building the datasets from the bundled UCI digits")
    t = time.perf_counter()
    cls_data = demo_data.build_classification_set(os.path.join(out, "classification"), seed=seed)
    det_data = demo_data.build_detection_set(
        os.path.join(out, "detection"), seed=seed, **DETECTION_SET
    )
    for path in (cls_data, det_data):
        _clean_backup(path)
    print(
        f"   {_relative(cls_data)}: single digits; {_relative(det_data)}: "
        f"{DETECTION_SET['n_train']} + {DETECTION_SET['n_valid']} canvases of "
        f"{DETECTION_SET['canvas_size']}x{DETECTION_SET['canvas_size']} "
        f"({time.perf_counter() - t:.1f} s)"
    )
    return cls_data, det_data


def _train_classifier(cls_data, seed, device):
    """Steps 2 and 3: the classifier's training run and its validation."""
    from .train import train
    from .validate import validate

    _step("2/5 Training the classifier")
    _command(f"darknet-py train {_relative(CLASSIFIER_CFG)} {_relative(cls_data)}")
    cls = train(
        CLASSIFIER_CFG,
        cls_data,
        seed=seed,
        device=device,
        log=_log,
        log_every=50,
        overwrite=True,
    )
    _step("3/5 Validating the classifier")
    _command(
        f"darknet-py valid {_relative(CLASSIFIER_CFG)} {_relative(cls_data)} "
        f"{_relative(cls.final_weights)}"
    )
    top = validate(CLASSIFIER_CFG, cls_data, cls.final_weights, device=device, log=_log)
    return cls, top


def _train_detector(out, cls, det_data, seed, device):
    """Step 4: the classifier's first layers cut into a backbone, the detector trained
    from it."""
    from .network import load_network
    from .train import train

    _step("4/5 Training the detector from the classifier's first layers")
    backbone = os.path.join(out, f"digits-classifier.conv.{BACKBONE_LAYERS}")
    _command(
        f"darknet-py partial {_relative(CLASSIFIER_CFG)} {_relative(cls.final_weights)} "
        f"{_relative(backbone)} {BACKBONE_LAYERS}"
    )
    net = load_network(CLASSIFIER_CFG, cls.final_weights, batch=1, device="cpu")
    net.seen = 0
    net.save_weights(backbone, cutoff=BACKBONE_LAYERS)
    _command(
        f"darknet-py train {_relative(DETECTOR_CFG)} {_relative(det_data)} "
        f"--weights {_relative(backbone)} --map --map-every 300"
    )
    return train(
        DETECTOR_CFG,
        det_data,
        weights=backbone,
        seed=seed,
        device=device,
        log=_log,
        log_every=50,
        map_eval=True,
        map_every=300,
        verbose=False,
        overwrite=True,
    )


def _validate_detector(out, det, det_data, device):
    """Step 5: the detector's validation, and its detections on held-out canvases drawn
    into predictions.png (returned with the validation's result)."""
    from . import demo_data
    from .network import load_network
    from .validate import validate

    _step("5/5 Validating the detector and detecting on held-out canvases")
    results = os.path.join(out, "detection", "results")
    _command(
        f"darknet-py valid {_relative(DETECTOR_CFG)} {_relative(det_data)} "
        f"{_relative(det.final_weights)} --results-dir {_relative(results)} --overwrite"
    )
    found = validate(
        DETECTOR_CFG,
        det_data,
        det.final_weights,
        device=device,
        log=_log,
        results_dir=results,
        overwrite=True,
    )
    detector = load_network(DETECTOR_CFG, det.final_weights, batch=1, device=device)
    names = list(demo_data.CLASS_NAMES)
    detector.names = names
    held_out = [p for p in open(det_data.replace("digits.data", "valid.list")).read().split()][
        :SHOW_CANVASES
    ]
    predictions = os.path.join(out, "predictions.png")
    _command(
        f"darknet-py detect {_relative(DETECTOR_CFG)} {_relative(det.final_weights)} "
        f"{_relative(held_out[0])} --data {_relative(det_data)} --thresh {SHOW_THRESH}"
    )
    _draw_predictions(detector, held_out, names, predictions)
    return found, predictions


def _summary(started, cls, top, det, found, predictions):
    """Print what both networks reached; the exit code: 1 when the classifier fell short."""
    minutes, seconds = divmod(round(time.perf_counter() - started, 1), 60)
    _step("Summary")
    print(
        f"   classifier: {top.summary()} on {top.images} held-out digits "
        f"(needs top-1 >= {TOP1_NEEDED:.2f})"
    )
    print(f"   detector:   {found.summary()} on {found.images} held-out canvases")
    print(
        f"   labelled detections: {_relative(predictions)}; training charts: "
        f"{_relative(os.path.join(cls.backup_dir, 'chart_digits-classifier.png'))}, "
        f"{_relative(os.path.join(det.backup_dir, 'chart_digits-yolo.png'))}"
    )
    print(f"   total time {int(minutes)}:{seconds:04.1f}")
    if top.top1 < TOP1_NEEDED:
        print(
            f"darknet-py demo: the classifier's top-1 {top.top1:.4f} is below {TOP1_NEEDED}",
            file=sys.stderr,
        )
        return 1
    return 0


def main(argv=None):
    args = _parse_args(argv)
    if argv is None:
        _single_threaded_blas()

    from .backends import cuda_available

    for cfg in (CLASSIFIER_CFG, DETECTOR_CFG):
        if not os.path.isfile(cfg):
            sys.exit(f"darknet-py demo: {cfg} not found (run the demo from a darknet-py checkout)")
    started = time.perf_counter()
    out = os.path.abspath(args.out)
    device = "cuda" if cuda_available() else "cpu"
    where = "a CUDA GPU" if device == "cuda" else "the CPU (NumPy)"
    print(f"darknet-py demo: training on {where}; working directory {_relative(out)}/")

    cls_data, det_data = _build_datasets(out, args.seed)
    cls, top = _train_classifier(cls_data, args.seed, device)
    det = _train_detector(out, cls, det_data, args.seed, device)
    found, predictions = _validate_detector(out, det, det_data, device)
    return _summary(started, cls, top, det, found, predictions)


if __name__ == "__main__":
    sys.exit(main())
