"""`valid` writes Darknet's results files: comp4_det_test_<class>.txt and coco_results.json."""

import json
import os

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import digit_set, untrained_detector

from darknet_py.boxes import results_corners
from darknet_py.cli import cli
from darknet_py.network import load_network
from darknet_py.predictions import detect
from darknet_py.validate import COCO_CATEGORY_IDS


def test_results_corners_are_darknets_one_based_clipped_pixels():
    # validate_detector: x - w/2 + 1 ... clipped to [1, size]; COCO: 0-based, [0, size]
    assert results_corners((0.5, 0.5, 0.2, 0.4), 100, 50, origin=1) == (41, 16, 61, 36)
    assert results_corners((0.5, 0.5, 0.2, 0.4), 100, 50, origin=0) == (40, 15, 60, 35)
    assert results_corners((0.05, 0.5, 0.2, 0.2), 100, 50, origin=1) == (1, 21, 16, 31)
    assert results_corners((0.95, 0.95, 0.2, 0.2), 100, 50, origin=0) == (85, 42.5, 100, 50)


@pytest.fixture()
def detector(tmp_path):
    data = digit_set(tmp_path / "set", 2, 3)
    cfg, weights = untrained_detector(tmp_path)
    return cfg, data, weights


def test_valid_writes_comp4_and_coco_results_and_keeps_them(detector, tmp_path):
    cfg, data, weights = detector
    results = tmp_path / "results"
    command = [
        "valid",
        cfg,
        data,
        weights,
        "--device",
        "cpu",
        "--results-dir",
        str(results),
        "--engine",
        "numpy",
    ]
    out = CliRunner().invoke(cli, command)
    assert out.exit_code == 0, out.output
    names = [f"digit{i}" for i in range(10)]
    assert sorted(os.listdir(results)) == sorted(
        [f"comp4_det_test_{n}.txt" for n in names] + ["coco_results.json"]
    )

    # What the files must hold, computed here from the network's own detections.
    net = load_network(cfg, weights, engine="numpy")
    valid = open(data.replace("digits.data", "valid.list")).read().split()
    expected = {n: [] for n in names}
    for path in valid:
        image_id = os.path.splitext(os.path.basename(path))[0]
        # In Darknet's order: boxes as NMS leaves them (print_detector_detections).
        for d in detect(net, path, thresh=0.005, nms=0.45, darknet_order=True):
            x, y, w, h = (v * 32 for v in d.box)
            corners = [
                max(1, x - w / 2 + 1),
                max(1, y - h / 2 + 1),
                min(32, x + w / 2 + 1),
                min(32, y + h / 2 + 1),
            ]
            coco_box = [
                max(0, x - w / 2),
                max(0, y - h / 2),
                min(32, x + w / 2),
                min(32, y + h / 2),
            ]
            coco_box[2:] = [coco_box[2] - coco_box[0], coco_box[3] - coco_box[1]]
            for c in np.nonzero(d.probs > 0)[0]:
                expected[names[c]].append((image_id, float(d.probs[c]), corners, coco_box))
    total = 0
    for name in names:
        lines = (results / f"comp4_det_test_{name}.txt").read_text().splitlines()
        assert len(lines) == len(expected[name])
        for line, (image_id, prob, corners, _) in zip(lines, expected[name]):
            fields = line.split(" ")
            assert fields[0] == image_id and len(fields) == 6
            np.testing.assert_allclose([float(v) for v in fields[1:]], [prob] + corners, atol=2e-6)
        total += len(lines)
    assert total > 0
    coco = json.loads((results / "coco_results.json").read_text())
    assert len(coco) == total
    rows = sorted((r["image_id"], r["category_id"], r["score"], r["bbox"]) for r in coco)
    # 000000.png -> image_id 0, as Darknet reads it; not an 80-class net: the class index
    wanted = sorted(
        (int(image_id), c, round(prob, 6), box)
        for c, n in enumerate(names)
        for image_id, prob, _, box in expected[n]
    )
    assert [r[:3] for r in rows] == [w[:3] for w in wanted]
    np.testing.assert_allclose([r[3] for r in rows], [w[3] for w in wanted], atol=2e-6)

    # A second run keeps them unless --overwrite
    before = (results / "coco_results.json").read_text()
    again = CliRunner().invoke(cli, command)
    assert again.exit_code == 2
    assert "results of an earlier run; pass --overwrite" in again.output
    assert str(results / "comp4_det_test_digit0.txt") in again.output
    assert again.output.count("\n") == 1
    assert (results / "coco_results.json").read_text() == before
    assert CliRunner().invoke(cli, command + ["--overwrite"]).exit_code == 0


def test_coco_category_ids_are_cocos_ninety_with_gaps():
    assert (
        len(COCO_CATEGORY_IDS) == 80
        and COCO_CATEGORY_IDS[:12] == (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 13)
        and COCO_CATEGORY_IDS[-1] == 90
    )
