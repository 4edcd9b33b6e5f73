"""detect's outputs (issue 21, items 3 and 9): a second run with the default output gets
new numbered files instead of failing, every file written is named with its input, folders
of images, --save-txt, and --json for a video."""

import json

import numpy as np
from test_cli import DOG, P2_CFG, P2_WEIGHTS, needs_shared, run_in_process

DETECT = ["detect", P2_CFG, P2_WEIGHTS]
OPTIONS = ["--device", "cpu", "--thresh", "0.45"]


def wrote(r):
    return [line for line in r.err.splitlines() if "wrote" in line]


@needs_shared
def test_a_second_detect_writes_numbered_outputs_and_names_them(tmp_path):
    mine = tmp_path / "predictions.jpg"
    mine.write_bytes(b"an earlier run")
    r = run_in_process(DETECT + [DOG] + OPTIONS, cwd=tmp_path)
    assert r.code == 0, r
    assert wrote(r) == [f"darknet-py: wrote predictions-2.jpg (boxes drawn on {DOG})"]
    r = run_in_process(DETECT + [DOG] + OPTIONS + ["--save-txt"], cwd=tmp_path)
    assert r.code == 0, r
    assert wrote(r) == [
        f"darknet-py: wrote predictions-3.jpg (boxes drawn on {DOG})",
        f"darknet-py: wrote predictions-3.txt (detections in {DOG}, YOLO format)",
    ]
    assert mine.read_bytes() == b"an earlier run"
    assert (tmp_path / "predictions-2.jpg").read_bytes() == (
        tmp_path / "predictions-3.jpg"
    ).read_bytes()
    # An output the user names is still never replaced.
    r = run_in_process(DETECT + [DOG] + OPTIONS + ["--out", mine], cwd=tmp_path)
    assert r.code == 2 and "already exists" in r.err


@needs_shared
def test_save_txt_holds_yolo_lines_that_match_the_printed_boxes(tmp_path):
    r = run_in_process(
        DETECT + [DOG] + OPTIONS + ["--save-txt", "--out", "none", "--json", tmp_path / "d.json"],
        cwd=tmp_path,
    )
    assert r.code == 0, r
    rows = np.loadtxt(tmp_path / "predictions.txt", ndmin=2)
    dets = json.loads((tmp_path / "d.json").read_text())["images"][0]["detections"]
    assert len(rows) == len(dets) >= 1
    for row, det in zip(rows, dets):
        assert row[0] == det["class_id"] and abs(row[5] - det["prob"]) < 1e-6
        box = det["relative_box"]
        assert np.allclose(row[1:5], [box["x"], box["y"], box["w"], box["h"]], atol=1e-6)
    assert not (tmp_path / "predictions.jpg").exists()
    assert (
        r.err.splitlines()[-1] == f"darknet-py: wrote {tmp_path / 'd.json'} (detections of 1 image)"
    )


@needs_shared
def test_detect_on_a_folder_takes_its_images_by_name(tmp_path):
    folder = tmp_path / "photos"
    folder.mkdir()
    for name in ("b.jpg", "a.JPG", "notes.txt"):
        (folder / name).write_bytes(DOG.read_bytes())
    r = run_in_process(DETECT + [folder] + OPTIONS + ["--out", f"{tmp_path}/out/"])
    assert r.code == 0, r
    assert [l.split(":")[0] for l in r.out.splitlines() if "Predicted" in l] == [
        f"{folder}/a.JPG",
        f"{folder}/b.jpg",
    ]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["a.jpg", "b.jpg"]
    empty = tmp_path / "empty"
    empty.mkdir()
    r = run_in_process(DETECT + [empty] + OPTIONS)
    assert r.code == 2 and "is a directory with no images in it" in r.err, r


@needs_shared
def test_a_video_gets_json_of_every_frame_and_a_numbered_default_output(tmp_path):
    import cv2

    video = tmp_path / "v.avi"
    writer = cv2.VideoWriter(str(video), cv2.VideoWriter_fourcc(*"MJPG"), 5, (96, 64))
    for _ in range(3):
        writer.write(cv2.resize(cv2.imread(str(DOG)), (96, 64)))
    writer.release()
    (tmp_path / "predictions.mp4").write_bytes(b"mine")
    r = run_in_process(DETECT + [video] + OPTIONS + ["--json", tmp_path / "v.json"], cwd=tmp_path)
    assert r.code == 0, r
    assert r.out.splitlines()[-1].endswith("wrote predictions-2.mp4")
    content = json.loads((tmp_path / "v.json").read_text())
    assert (content["width"], content["height"], content["thresh"]) == (96, 64, 0.45)
    assert [f["frame"] for f in content["frames"]] == [1, 2, 3]
    counts = [int(l.split(", ")[1].split()[0]) for l in r.out.splitlines()[:3]]
    assert [len(f["detections"]) for f in content["frames"]] == counts
    assert (tmp_path / "predictions.mp4").read_bytes() == b"mine"


def test_confusion_matrix_counts_matches_confusions_and_misses():
    from darknet_py.map_plots import confusion_matrix

    truth = np.array([[0.2, 0.2, 0.2, 0.2, 0], [0.7, 0.7, 0.2, 0.2, 1], [0.5, 0.9, 0.1, 0.1, 1]])
    dets = [
        (0, 0.9, (0.2, 0.2, 0.2, 0.2)),
        (1, 0.3, (0.2, 0.2, 0.2, 0.2)),  # one box, best class 0
        (0, 0.8, (0.7, 0.71, 0.2, 0.2)),  # a 1 detected as a 0
        (1, 0.6, (0.1, 0.9, 0.1, 0.1)),  # nothing there
        (1, 0.1, (0.5, 0.9, 0.1, 0.1)),
    ]  # below thresh: a miss
    m = confusion_matrix([(dets, truth)], 2, iou_thresh=0.5, thresh=0.25)
    assert m.tolist() == [[1, 0, 0], [1, 0, 1], [0, 1, 0]]


@needs_shared
def test_map_plots_writes_a_pr_curve_per_class_and_the_confusion_matrix(tmp_path):
    import cv2

    (tmp_path / "three.names").write_text("a\nb\nc\n")
    (tmp_path / "valid.list").write_text(f"{tmp_path}/dog.jpg\n")
    (tmp_path / "dog.jpg").write_bytes(DOG.read_bytes())
    (tmp_path / "dog.txt").write_text("1 0.3 0.6 0.3 0.5\n2 0.74 0.15 0.05 0.23\n")
    data = tmp_path / "p2.data"
    data.write_text(f"classes=3\nvalid={tmp_path}/valid.list\nnames={tmp_path}/three.names\n")
    plots = tmp_path / "plots"
    r = run_in_process(["map", P2_CFG, data, P2_WEIGHTS, "--plots", plots, "--device", "cpu"])
    assert r.code == 0, r
    names = ["pr_00_a.png", "pr_01_b.png", "pr_02_c.png", "confusion_matrix.png"]
    assert sorted(p.name for p in plots.iterdir()) == sorted(names)
    assert r.out.splitlines()[-4:] == [f"wrote {plots / n}" for n in names]
    for name in names:
        assert cv2.imread(str(plots / name)).std() > 10
    r = run_in_process(["map", P2_CFG, data, P2_WEIGHTS, "--plots", plots, "--device", "cpu"])
    assert r.code == 2 and "already exist" in r.err, r
