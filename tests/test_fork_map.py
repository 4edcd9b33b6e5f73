"""`darknet-py map`: the AlexeyAB fork's validate_detector_map against a loop-by-loop
transcription of its C code, and its report."""

from pathlib import Path

import numpy as np
import pytest
from helpers import c_iou, digit_set, yolo_head

from darknet_py.validate import curve_ap, fork_map


def c_detections_comparator(a, b):
    """The fork's detections_comparator: higher p first, 0 for equal p."""
    diff = np.float32(a["p"]) - np.float32(b["p"])
    return 1 if diff < 0 else -1 if diff > 0 else 0


def glibc_qsort(items, compare):
    """glibc's qsort as it runs when it can allocate its buffer (msort.c, every release):
    a top-down merge sort, n / 2 items in the first half, the first half's item taken
    when the comparison is <= 0."""
    n = len(items)
    if n <= 1:
        return list(items)
    first, second = glibc_qsort(items[: n // 2], compare), glibc_qsort(items[n // 2 :], compare)
    merged = []
    while first and second:
        merged.append(first.pop(0) if compare(first[0], second[0]) <= 0 else second.pop(0))
    return merged + first + second


def c_validate_detector_map(images, classes, iou_thresh, map_points, thresh_calc_avg_iou):
    """The fork's validate_detector_map from the detections on: returns (mAP, aps, tp, fp)."""
    detections = []
    unique_truth_count = 0
    truth_classes_count = [0] * classes
    tp_for_thresh = [0] * classes
    fp_for_thresh = [0] * classes
    for dets, truth in images:
        for t in truth:
            truth_classes_count[int(t[4])] += 1
        checkpoint = len(detections)
        for class_id, prob, box in dets:
            truth_index, max_iou = -1, 0
            for j, t in enumerate(truth):
                current = c_iou(box, t[:4])
                if current > iou_thresh and class_id == int(t[4]) and current > max_iou:
                    max_iou, truth_index = current, unique_truth_count + j
            detections.append(
                dict(
                    p=prob,
                    class_id=class_id,
                    truth_flag=truth_index > -1,
                    unique_truth_index=truth_index,
                )
            )
            if prob > thresh_calc_avg_iou:
                found = any(
                    detections[z]["unique_truth_index"] == truth_index
                    for z in range(checkpoint, len(detections) - 1)
                )
                if truth_index > -1 and not found:
                    tp_for_thresh[class_id] += 1
                else:
                    fp_for_thresh[class_id] += 1
        unique_truth_count += len(truth)
    detections = glibc_qsort(detections, c_detections_comparator)
    n = len(detections)
    pr = [[dict(tp=0, fp=0, precision=0.0, recall=0.0) for _ in range(n)] for _ in range(classes)]
    truth_flags = [0] * unique_truth_count
    for rank in range(n):
        if rank > 0:
            for c in range(classes):
                pr[c][rank]["tp"], pr[c][rank]["fp"] = pr[c][rank - 1]["tp"], pr[c][rank - 1]["fp"]
        d = detections[rank]
        if d["truth_flag"] and truth_flags[d["unique_truth_index"]] == 0:
            truth_flags[d["unique_truth_index"]] = 1
            pr[d["class_id"]][rank]["tp"] += 1
        else:
            pr[d["class_id"]][rank]["fp"] += 1
        for c in range(classes):
            tp, fp = pr[c][rank]["tp"], pr[c][rank]["fp"]
            fn = truth_classes_count[c] - tp
            pr[c][rank]["precision"] = tp / (tp + fp) if tp + fp > 0 else 0
            pr[c][rank]["recall"] = tp / (tp + fn) if tp + fn > 0 else 0
    aps = []
    for c in range(classes):
        avg_precision = 0
        if map_points == 0:
            last_recall, last_precision = pr[c][n - 1]["recall"], pr[c][n - 1]["precision"]
            for rank in range(n - 2, -1, -1):
                delta_recall = last_recall - pr[c][rank]["recall"]
                last_recall = pr[c][rank]["recall"]
                if pr[c][rank]["precision"] > last_precision:
                    last_precision = pr[c][rank]["precision"]
                avg_precision += delta_recall * last_precision
            avg_precision += last_recall * last_precision
        else:
            for point in range(map_points):
                cur_recall = point * 1.0 / (map_points - 1)
                cur_precision = 0
                for rank in range(n):
                    if (
                        pr[c][rank]["recall"] >= cur_recall
                        and pr[c][rank]["precision"] > cur_precision
                    ):
                        cur_precision = pr[c][rank]["precision"]
                avg_precision += cur_precision
            avg_precision /= map_points
        aps.append(avg_precision)
    return sum(aps) / classes, aps, tp_for_thresh, fp_for_thresh


def random_images(seed, count=12, classes=3):
    """Truth boxes and detections around them (some good, some shifted, duplicates, strays)."""
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(count):
        truth = np.concatenate(
            [rng.random((rng.integers(0, 4), 2)) * 0.6 + 0.2, rng.random((0, 2))], axis=0
        )
        truth = np.concatenate(
            [
                truth,
                rng.random((len(truth), 2)) * 0.2 + 0.1,
                rng.integers(0, classes - 1, (len(truth), 1)),
            ],
            axis=1,
        )
        dets = []
        for t in truth:
            for _ in range(rng.integers(0, 3)):
                box = tuple(float(v) for v in t[:4] + rng.normal(0, 0.03, 4) * [1, 1, 0.5, 0.5])
                c = int(t[4]) if rng.random() < 0.8 else int(rng.integers(0, classes))
                dets.append((c, float(rng.random()), box))
        for _ in range(rng.integers(0, 3)):
            dets.append(
                (
                    int(rng.integers(0, classes)),
                    float(rng.random() * 0.5),
                    tuple(float(v) for v in rng.random(4) * [1, 1, 0.3, 0.3] + 0.05),
                )
            )
        images.append((dets, truth.astype(np.float32)))
    return images


@pytest.mark.parametrize("points", [0, 11, 101])
@pytest.mark.parametrize("iou_thresh", [0.5, 0.75])
def test_fork_map_matches_the_forks_validate_detector_map(points, iou_thresh):
    images = random_images(points + int(iou_thresh * 100))
    got = fork_map(images, 3, iou_thresh, points, thresh=0.25)
    want_map, want_aps, want_tp, want_fp = c_validate_detector_map(
        images, 3, iou_thresh, points, 0.25
    )
    assert got.aps == pytest.approx(want_aps, abs=1e-9)
    assert got.map == pytest.approx(want_map, abs=1e-9) and 0 < got.map < 1
    assert (got.tp, got.fp) == (want_tp, want_fp)
    assert got.aps[2] == 0 and got.truths[2] == 0  # no truth of class 2: AP 0, still averaged


def test_ties_rank_as_the_forks_qsort_leaves_them():
    """Scores on a coarse grid tie across and within images: the ranking (and with it
    every AP) is the fork's on glibc, and another order of the ties changes the AP."""
    differs = 0
    for seed in range(6):
        images = [
            ([(c, round(p * 4) / 4 or 0.25, box) for c, p, box in dets], truth)
            for dets, truth in random_images(seed)
        ]
        got = fork_map(images, 3, thresh=0.25)
        want_map, want_aps, want_tp, want_fp = c_validate_detector_map(images, 3, 0.5, 0, 0.25)
        assert got.aps == pytest.approx(want_aps, abs=1e-12)
        assert (got.tp, got.fp) == (want_tp, want_fp)
        flipped = fork_map([(dets[::-1], truth) for dets, truth in images[::-1]], 3, thresh=0.25)
        differs += flipped.aps != got.aps
    assert differs >= 3


def test_a_tie_between_a_miss_and_a_hit_ranks_the_first_given_first():
    truth = np.array([[0.5, 0.5, 0.2, 0.2, 0]], dtype=np.float32)
    hit, miss = (0, 0.5, (0.5, 0.5, 0.2, 0.2)), (0, 0.5, (0.1, 0.1, 0.1, 0.1))
    # miss first: precision 0 at rank 0, 1/2 at rank 1 where the recall reaches 1.
    assert fork_map([([miss], truth[:0]), ([hit], truth)], 1).aps == [0.5]
    assert fork_map([([hit], truth), ([miss], truth[:0])], 1).aps == [1.0]


def test_image_detections_are_in_nms_order(tmp_path):
    """image_detections lists boxes in the order NMS leaves them (as the fork's loops over
    dets visit them), not by score, and each box's classes ascending."""
    from helpers import untrained_detector

    from darknet_py.network import load_network
    from darknet_py.predictions import detect
    from darknet_py.validate import image_detections

    net = load_network(*untrained_detector(tmp_path), device="cpu")
    image = np.random.default_rng(0).random((3, 40, 48)).astype(np.float32)
    got = image_detections(net, image)
    nms_order = detect(net, image, thresh=0.005, nms=0.45, darknet_order=True)
    want = [
        (int(c), float(d.probs[c]), d.box) for d in nms_order for c in np.nonzero(d.probs > 0)[0]
    ]
    assert got == want and len({d.class_id for d in nms_order}) > 1
    best = [d.prob for d in nms_order]
    assert best != sorted(best, reverse=True)  # score order would differ


def test_curve_ap_by_hand():
    recall = np.array([0.5, 0.5, 1.0])
    precision = np.array([1.0, 0.5, 2 / 3])
    assert curve_ap(recall, precision) == pytest.approx(0.5 * 1 + 0.5 * 2 / 3)
    assert curve_ap(recall, precision, 11) == pytest.approx((6 * 1 + 5 * 2 / 3) / 11)
    assert curve_ap(np.array([]), np.array([])) == 0


def test_fork_map_report_lines():
    truth = np.array([[0.5, 0.5, 0.2, 0.2, 0], [0.2, 0.2, 0.1, 0.1, 1]], dtype=np.float32)
    dets = [
        (0, 0.9, (0.5, 0.5, 0.2, 0.2)),
        (0, 0.8, (0.51, 0.5, 0.2, 0.2)),
        (1, 0.1, (0.2, 0.2, 0.1, 0.1)),
    ]
    result = fork_map([(dets, truth)], 2, names=["cat", "dog"])
    lines = result.lines()
    assert lines[0] == " detections_count = 3, unique_truth_count = 2  "
    assert lines[1] == (
        "class_id = 0, name = cat, ap = 100.00%   \t (TP = 1, FP = 1) "
        "precision = 0.50, recall = 1.00, F1-score = 0.67 "
    )
    assert lines[2].startswith("class_id = 1, name = dog, ap = 100.00%   \t (TP = 0, FP = 0)")
    assert " for conf_thresh = 0.25, precision = 0.50, recall = 0.50, F1-score = 0.50 " in lines
    # The fork averages the true positives' IoU over true and false positives.
    assert " for conf_thresh = 0.25, TP = 1, FP = 1, FN = 1, average IoU = 50.00 % " in lines
    assert lines[-2] == " IoU threshold = 50 %, used Area-Under-Curve for each unique Recall "
    assert lines[-1] == " mean average precision (mAP@0.50) = 1.000000, or 100.00 % "


# ---- the commands: `map` and `detect --ext-output` -----------------------------------------
TINY_DETECTOR = (
    """[net]
width=32
height=32
channels=3
[convolutional]
batch_normalize=0
filters=8
size=3
stride=2
pad=1
activation=leaky
[maxpool]
size=2
stride=2
"""
    + yolo_head(10)
    + "nms_kind=greedynms\n"
)


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory):
    from darknet_py.cfg import parse_cfg_text
    from darknet_py.network import Network

    root = tmp_path_factory.mktemp("forkmap")
    data = digit_set(root / "set", 1, 6)
    cfg = root / "tiny.cfg"
    cfg.write_text(TINY_DETECTOR)
    net = Network(parse_cfg_text(TINY_DETECTOR), str(cfg), seed=3)
    weights = str(root / "tiny.weights")
    net.save_weights(weights)
    return str(cfg), data, weights


def invoke(args):
    from click.testing import CliRunner

    from darknet_py.cli import cli

    return CliRunner().invoke(cli, args)


def test_map_command_prints_the_forks_report(tiny_set):
    from darknet_py.validate import detector_map

    cfg, data, weights = tiny_set
    r = invoke(
        [
            "map",
            cfg,
            data,
            weights,
            "--device",
            "cpu",
            "--points",
            "11",
            "--thresh",
            ".005",
            "--engine",
            "numpy",
        ]
    )
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[-2] == " IoU threshold = 50 %, used 11 Recall-points "
    classes = [line for line in lines if line.startswith("class_id = ")]
    assert len(classes) == 10 and classes[3].startswith("class_id = 3, name = digit3, ap = ")
    result = detector_map(
        cfg, data, weights, device="cpu", points=11, thresh=0.005, log=lambda line: None
    )
    assert result.detections > 0 and sum(result.truths) > 0
    assert lines[-1] == (
        f" mean average precision (mAP@0.50) = {result.map:f}, or {result.map * 100:2.2f} % "
    )


@pytest.mark.parametrize(
    "args,message",
    [
        (["--points", "1"], "needs 0 or at least 2 recall points"),
        (["--iou-thresh", "0"], "--iou-thresh"),
    ],
)
def test_map_command_bad_options(tiny_set, args, message):
    cfg, data, weights = tiny_set
    r = invoke(["map", cfg, data, weights, "--device", "cpu", *args])
    assert r.exit_code == 2 and message in r.output and "Traceback" not in r.output


def test_ext_output_lines_leftmost_first_rounded_pixels_and_other_classes():
    from darknet_py.boxes import Detection
    from darknet_py.predictions import ext_output_lines

    right = Detection(
        box=(0.75, 0.5, 0.2, 0.25),
        objectness=0.9,
        probs=np.array([0.8, 0.6], np.float32),
        class_id=0,
        prob=0.8,
    )
    left = Detection(
        box=(0.25, 0.5, 0.1, 0.5),
        objectness=0.9,
        probs=np.array([0, 0.7], np.float32),
        class_id=1,
        prob=0.7,
    )
    lines = ext_output_lines([right, left], 100, 50, names=["cat", "dog"], thresh=0.5)
    assert lines == [
        "dog: 70%\t(left_x:   20   top_y:   13   width:   10   height:   25)",
        "cat: 80%\t(left_x:   65   top_y:   19   width:   20   height:   13)",
        # the fork repeats the box on other classes' lines (since 2020-01)
        "dog: 60%\t(left_x:   65   top_y:   19   width:   20   height:   13)",
    ]


def test_detect_ext_output_prints_the_api_detections(tiny_set, tmp_path):
    import darknet_py
    from darknet_py.image import load_image
    from darknet_py.predictions import ext_output_lines

    cfg, data, weights = tiny_set
    image = str(next((Path(data).parent / "images" / "valid").iterdir()))
    r = invoke(
        [
            "detect",
            cfg,
            weights,
            image,
            "--device",
            "cpu",
            "--thresh",
            ".01",
            "--out",
            str(tmp_path / "p.jpg"),
            "--ext-output",
            "--engine",
            "numpy",
        ]
    )
    assert r.exit_code == 0, r.output
    net = darknet_py.load_network(cfg, weights, batch=1, device="cpu", engine="numpy")
    dets = net.detect(image, thresh=0.01)
    _, h, w = load_image(image).shape
    want = ext_output_lines(dets, w, h, None, 0.01)
    printed = [l for l in r.output.splitlines() if not l.startswith("darknet-py: ")]  # stderr
    assert want and printed[1:] == want


def test_map_refuses_a_classifier(tiny_set, tmp_path):
    from darknet_py.network import load_network

    _, data, _ = tiny_set
    cfg = Path(__file__).resolve().parents[1] / "cfg" / "digits-classifier.cfg"
    weights = str(tmp_path / "c.weights")
    load_network(cfg, None, device="cpu").save_weights(weights)
    r = invoke(["map", str(cfg), data, weights, "--device", "cpu"])
    assert r.exit_code == 2 and "map scores detectors" in r.output, r.output
