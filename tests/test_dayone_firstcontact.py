"""First contact (issue 28): map on a validation set without labels, map's progress line,
check's box totals, a cut-off .weights download, calc_anchors' anchors.txt, the API's truth
shapes and an unreadable valid list, and the README's CPU-sized training example."""

import re

import numpy as np
import pytest
from helpers import digit_set, untrained_detector
from test_cli import run_in_process

from darknet_py import load_network

WEIGHTS_HEADER = 20  # 0.2.0: three int32 and a 64-bit seen


@pytest.fixture(scope="module")
def detector(tmp_path_factory):
    """(cfg, weights) of helpers' small 10-class detector."""
    return untrained_detector(tmp_path_factory.mktemp("detector"))


def cut(weights, folder, size):
    path = folder / "cut.weights"
    with open(weights, "rb") as f:
        path.write_bytes(f.read(size))
    return path


# ---- a cut-off .weights download -------------------------------------------------------
@pytest.mark.parametrize("size", [20 + 4 * 100 + 3, 20 + 4 * 100])
def test_a_cut_off_weights_file_is_said_to_be_maybe_a_download_with_both_sizes(
    tmp_path, detector, size
):
    """Cut mid-float or on a float: either way the line says 'cut-off download' with the
    size found and the size this cfg's weights have, as well as the cfg question."""
    cfg, weights = detector
    expected = len(open(weights, "rb").read())
    short = cut(weights, tmp_path, size)
    r = run_in_process(
        ["detect", cfg, short, "--device", "cpu", "--out", "none", tmp_path / "none.png"]
    )
    assert r.code == 2 and "Traceback" not in r.err, r
    error = r.err.strip().splitlines()[-1]
    assert error.startswith(f"darknet-py: error: {short}: "), error
    assert "cut-off download" in error, error
    assert f"the file is {size:,} bytes where this cfg's weights are {expected:,}" in error
    if size % 4 == 0:
        assert "fewer than needed" in error and "this cfg?" in error, error
    else:
        assert "403 bytes after the header is not a whole number of floats" in error, error


def test_a_cut_off_backbone_names_both_sizes(tmp_path, detector):
    """train --weights takes a partial file; one cut inside a layer is not a backbone."""
    from darknet_py.weights import WeightsError, load_weights

    cfg, weights = detector
    short = cut(weights, tmp_path, WEIGHTS_HEADER + 4 * 10)
    with pytest.raises(
        WeightsError,
        match=r"does not end on a layer boundary .*: a cut-off "
        r"download \(the file is 60 bytes where this cfg's "
        r"weights are [\d,]+\), or weights of another cfg",
    ):
        load_weights(load_network(cfg), short, allow_partial=True)


# ---- map, valid and train --map on a valid set they cannot score ------------------------
def digits(tmp_path, valid=3):
    """A digit set (2 training images, `valid` valid ones): the .data path and its folder."""
    data = digit_set(tmp_path / "set", 2, valid)
    return data, tmp_path / "set"


def error_line(r):
    errors = [l for l in r.err.splitlines() if l.startswith("darknet-py: error: ")]
    assert len(errors) == 1 and "Traceback" not in r.err, r
    return errors[0]


@pytest.mark.parametrize("command", ["map", "valid"])
def test_a_valid_set_without_label_files_is_refused_naming_where_they_were_looked_for(
    tmp_path, detector, command
):
    """The fork's map prints mAP 0 and exits 0 here; valid refused only after detecting
    every image, without saying where the labels were looked for."""
    data, root = digits(tmp_path)
    for label in (root / "labels" / "valid").iterdir():
        label.unlink()
    cfg, weights = detector
    r = run_in_process([command, cfg, data, weights, "--device", "cpu"], cwd=tmp_path)
    assert r.code == 2, r
    line = error_line(r)
    # every place either Darknet's rule looks, the flavour's own (pjreddie's) first
    assert line.startswith(
        f"darknet-py: error: none of the 3 validation images has a label file; for the first "
        f"image they were looked for at {root}/labels/valid/000000.txt (the original "
        f"Darknet's rule"
    ), line
    assert f"{root}/images/valid/000000.txt (the fork's rule" in line, line
    assert "mean average precision" not in r.out and "map: " not in r.err, r
    assert not (tmp_path / "results").exists()


def test_a_valid_set_of_empty_label_files_is_refused_too(tmp_path, detector):
    data, root = digits(tmp_path)
    for label in (root / "labels" / "valid").iterdir():
        label.write_text("")
    cfg, weights = detector
    r = run_in_process(["map", cfg, data, weights, "--device", "cpu"])
    assert r.code == 2, r
    assert error_line(r) == (
        f"darknet-py: error: none of the 3 validation images has a labelled box (0 label files "
        f"missing; of the 3 found, 3 empty, the others without a sound 'class x y w h' line; "
        f"the first image's at {root}/labels/valid/000000.txt)"
    )


@pytest.mark.parametrize("command", ["map", "valid"])
def test_a_valid_list_of_missing_images_names_the_first_and_the_count(tmp_path, detector, command):
    data, root = digits(tmp_path)
    for image in (root / "images" / "valid").iterdir():
        image.unlink()
    cfg, weights = detector
    r = run_in_process([command, cfg, data, weights, "--device", "cpu"])
    assert r.code == 2, r
    assert error_line(r) == (
        f"darknet-py: error: no image of the valid list could be read: all 3 are missing, "
        f"the first {root}/images/valid/000000.png (listed in {root}/valid.list)"
    )


@pytest.mark.parametrize("damage", ["labels", "images"])
def test_train_map_checks_the_valid_set_before_iteration_1(tmp_path, detector, damage):
    """Such a run stopped at its first evaluation (after 100 iterations; one shorter than
    the interval left no weights at all): now it is refused before anything is written."""
    data, root = digits(tmp_path)
    for path in (root / damage / "valid").iterdir():
        path.unlink()
    cfg, _ = detector
    r = run_in_process(
        ["train", cfg, data, "--map", "--max-batches", "2", "--device", "cpu"], cwd=tmp_path
    )
    assert r.code == 2, r
    words = (
        "none of the 3 validation images has a label file"
        if damage == "labels"
        else "no image of the valid list could be read: all 3 are missing"
    )
    assert words in error_line(r), r
    assert "images/s" not in r.out + r.err  # no iteration ran
    assert not (root / "backup").exists() or not list((root / "backup").iterdir())


def test_train_map_warns_about_some_missing_valid_images_and_runs(tmp_path, detector):
    data, root = digits(tmp_path)
    (root / "images" / "valid" / "000001.png").unlink()
    cfg, _ = detector
    r = run_in_process(
        ["train", cfg, data, "--map", "--max-batches", "1", "--device", "cpu", "--workers", "0"],
        cwd=tmp_path,
    )
    assert r.code == 0, r
    assert (
        f"darknet-py: warning: 1 of the 3 valid images is missing (the first: "
        f"{root}/images/valid/000001.png); it is skipped"
    ) in r.err


# ---- map's progress line -----------------------------------------------------------------
def test_map_shows_its_progress_on_stderr_and_not_with_quiet(tmp_path, detector):
    data, _ = digits(tmp_path)
    cfg, weights = detector
    r = run_in_process(["map", cfg, data, weights, "--device", "cpu"])
    assert r.code == 0, r
    assert re.fullmatch(r"map: 3/3 images, [\d.]+ images/s, in \d+ s", r.err.splitlines()[-1]), r
    assert "images/s" not in r.out
    quiet = run_in_process(["map", cfg, data, weights, "--device", "cpu", "--quiet"])
    assert quiet.code == 0 and "images/s" not in quiet.err, quiet
    assert quiet.out == r.out


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Stream:
    def __init__(self, tty):
        self.text, self.tty = "", tty

    def write(self, text):
        self.text += text

    def flush(self):
        pass

    def isatty(self):
        return self.tty


@pytest.mark.parametrize("tty", [False, True])
def test_image_progress_gives_done_total_rate_and_eta(tty):
    from darknet_py.validate import ImageProgress

    clock, stream = Clock(), Stream(tty)
    progress = ImageProgress(200, "map", stream=stream, every=5.0, clock=clock)
    for done, now in ((10, 102.0), (25, 105.0), (30, 106.0), (160, 140.0)):
        clock.now = now
        progress.update(done)
    clock.now = 150.0
    progress.done = 200
    progress.finish()
    lines = [
        "map: 25/200 images, 5.0 images/s, ETA 35 s",
        "map: 160/200 images, 4.0 images/s, ETA 10 s",
        "map: 200/200 images, 4.0 images/s, in 50 s",
    ]
    if tty:  # one line, rewritten in place
        assert stream.text == "".join(f"\r{line}\x1b[K" for line in lines) + "\n"
    else:
        assert stream.text == "".join(f"{line}\n" for line in lines)
    before = stream.text
    progress.end_line()  # nothing left open after finish()
    assert stream.text == before


def test_image_progress_ends_an_open_terminal_line_before_a_warning():
    from darknet_py.validate import ImageProgress

    clock, stream = Clock(), Stream(True)
    progress = ImageProgress(10, "map", stream=stream, every=1.0, clock=clock)
    clock.now += 2
    progress.update(4)
    progress.end_line()
    progress.end_line()  # once
    assert stream.text == "\rmap: 4/10 images, 2.0 images/s, ETA 3 s\x1b[K\n"


# ---- the Python API's truth ---------------------------------------------------------------
CLASSIFIER_CFG = """[net]
batch=1
width=8
height=8
channels=3
[convolutional]
filters=20
size=3
pad=1
activation=leaky
[avgpool]
[softmax]
"""


@pytest.mark.parametrize(
    "truth", [np.zeros(6), np.zeros((2, 6)), np.zeros((2, 21)), np.zeros((3, 20))]
)
def test_a_classifier_truth_of_the_wrong_shape_says_the_shape_wanted(tmp_path, truth):
    """It raised NumPy's 'operands could not be broadcast together with shapes (6,) (20,)'
    (or, for (2, 21) and (3, 20), trained on the wrong numbers)."""
    cfg = tmp_path / "c.cfg"
    cfg.write_text(CLASSIFIER_CFG)
    net = load_network(str(cfg), batch=2)  # passes of 2 images
    x = np.zeros((2, 3, 8, 8), np.float32)
    for step in (net.train_pass, net.train_iteration):
        with pytest.raises(ValueError) as info:
            step(x, truth)
        assert str(info.value) == (
            f"truth of shape {truth.shape} for 2 images: this network wants (2, 20): per image "
            f"the 20 values its [softmax] layer 2 is trained towards (one-hot: 1 at the "
            f"image's class)"
        )
    assert net.seen == 0  # refused before the step counted
    net.train_iteration(x, np.eye(20, dtype=np.float32)[[3, 5]])  # the shape it said
    net.train_pass(x, np.eye(20, dtype=np.float32)[[3, 5]].ravel())  # flat is fine too


def test_a_detector_truth_of_the_wrong_shape_says_the_shape_wanted(detector):
    cfg, _ = detector
    net = load_network(cfg, batch=2)  # passes of 2 images
    x = np.zeros((2, 3, 32, 32), np.float32)
    for truth in (np.zeros((2, 7)), np.zeros((1, 450))):
        with pytest.raises(
            ValueError,
            match=re.escape(
                f"truth of shape {truth.shape} for 2 images: this network wants (2, 450): 90 "
                f"boxes of (x, y, w, h, class) per image, zero padded (any whole number of "
                f"boxes does)"
            ),
        ):
            net.train_pass(x, truth)
    net.train_pass(x, np.zeros((2, 10 * 5), np.float32))


# ---- detector calc_anchors' anchors.txt -------------------------------------------------
def test_fork_anchors_text_is_the_forks_printf():
    """detector.c calc_anchors: sprintf "%3.0f,%3.0f" (width > 32) or "%2.4f,%2.4f", joined
    by ", ", no line end; C's printf rounds a tie to even, as Python's format does."""
    from darknet_py.data.anchors import fork_anchors_text

    assert fork_anchors_text([(12.5, 9.0), (116.0, 90.2)], 416) == " 12,  9, 116, 90"
    assert fork_anchors_text([(6.0, 9.25), (8.5, 13.0)], 32) == "6.0000,9.2500, 8.5000,13.0000"


def test_calc_anchors_writes_anchors_txt_as_the_fork_and_names_it(tmp_path):
    data, _ = digits(tmp_path)
    form = [
        "detector",
        "calc_anchors",
        data,
        "-num_of_clusters",
        "2",
        "-width",
        "320",
        "-height",
        "320",
    ]
    r = run_in_process(form, cwd=tmp_path)
    assert r.code == 0, r
    written = (tmp_path / "anchors.txt").read_text()
    shown = r.out.strip().removeprefix("anchors = ")
    assert re.fullmatch(r" *\d+, *\d+,  *\d+, *\d+", written), written
    assert [int(v) for v in written.split(",")] == [int(v) for v in shown.split(",")]
    assert (
        f"darknet-py: wrote {tmp_path}/anchors.txt (the anchors in the fork's anchors.txt form)"
    ) in r.err.splitlines(), r
    # and the boxes per class beside it, as the fork's counters_per_class.txt
    counters = (tmp_path / "counters_per_class.txt").read_text()
    assert counters.startswith("counters_per_class = ") and not counters.endswith("\n")
    counts = [int(v) for v in counters.removeprefix("counters_per_class = ").split(", ")]
    classes = int(re.search(r"classes\s*=\s*(\d+)", open(data).read()).group(1))
    boxes = int(re.search(r"^(\d+) boxes;", r.err, re.M).group(1))
    assert len(counts) == classes and sum(counts) == boxes, (counts, r)
    assert (
        f"darknet-py: wrote {tmp_path}/counters_per_class.txt (the boxes per class in the "
        f"fork's counters_per_class.txt)"
    ) in r.err.splitlines(), r
    (tmp_path / "anchors.txt").write_text("mine")
    r = run_in_process(form, cwd=tmp_path)  # the fork replaces it; we say so
    assert r.code == 0 and (tmp_path / "anchors.txt").read_text() == written, r
    assert r.err.splitlines()[-1].endswith("form; it replaced an earlier file)"), r


def test_anchors_out_never_replaces_a_file_without_overwrite(tmp_path):
    data, _ = digits(tmp_path)
    mine = tmp_path / "mine.txt"
    mine.write_text("my anchors")
    r = run_in_process(["anchors", data, "--num", "2", "--out", mine])
    assert r.code == 2 and "mine.txt: already exists" in error_line(r), r
    assert mine.read_text() == "my anchors" and r.out == ""
    r = run_in_process(
        [
            "anchors",
            data,
            "--num",
            "2",
            "--out",
            mine,
            "--overwrite",
            "--width",
            "32",
            "--height",
            "32",
        ]
    )
    assert r.code == 0, r
    assert re.fullmatch(r"\d+\.\d{4},\d+\.\d{4}, \d+\.\d{4},\d+\.\d{4}", mine.read_text())


# ---- the README's transfer-learning example on a CPU ------------------------------------
def test_the_readmes_cpu_cfg_is_the_gpu_cfg_at_a_cpu_size():
    """The README's example took 145 s an iteration on 2 cores (64 images up to 608x608):
    its CPU twin has the same layers and parameters (yolov3-tiny.conv.15 starts both), 16
    images of 256x256 an iteration, no random resizing, anchors scaled to 256/416."""
    from pathlib import Path

    from darknet_py.cfg import parse_cfg
    from darknet_py.network import build_network
    from darknet_py.weights import floats_needed

    repo = Path(__file__).resolve().parents[1]
    readme = (repo / "README.md").read_text()
    for cfg in set(re.findall(r"cfg/[\w.-]+\.cfg", readme)):
        assert (repo / cfg).is_file(), f"the README names {cfg}, which is not in cfg/"
    assert "darknet-py train cfg/yolov3-tiny-3class-cpu.cfg my.data" in readme
    assert "wants a GPU" in readme
    gpu = build_network(str(repo / "cfg/yolov3-tiny-3class.cfg"))
    cpu = build_network(str(repo / "cfg/yolov3-tiny-3class-cpu.cfg"))
    assert [l.type for l in cpu.layers] == [l.type for l in gpu.layers]
    assert floats_needed(
        load_network(str(repo / "cfg/yolov3-tiny-3class-cpu.cfg"), batch=1)
    ) == floats_needed(load_network(str(repo / "cfg/yolov3-tiny-3class.cfg"), batch=1))
    net = parse_cfg(str(repo / "cfg/yolov3-tiny-3class-cpu.cfg"))[0]
    assert [net.get_int(k) for k in ("batch", "subdivisions", "width", "height")] == [
        16,
        1,
        256,
        256,
    ]
    heads = [l for l in cpu.layers if l.type == "yolo"]
    assert [h.random for h in heads] == [0, 0]
    gpu_anchors = np.asarray([l for l in gpu.layers if l.type == "yolo"][0].biases[:12])
    assert np.abs(np.asarray(heads[0].biases[:12]) - gpu_anchors * 256 / 416).max() <= 0.5


def test_train_map_checks_a_classifiers_valid_labels_before_iteration_1(tmp_path, bars):
    """A classifier's valid image is labelled by the class name in its path: a valid list
    where no path names a class stopped the run at its first evaluation."""
    import shutil

    from helpers import write_classifier_cfg

    unnamed = []
    for i, image in enumerate(sorted((bars / "valid").iterdir())[:3]):
        unnamed.append(str(shutil.copyfile(image, tmp_path / f"img{i}.png")))
    (tmp_path / "valid.list").write_text("\n".join(unnamed) + "\n")
    data = tmp_path / "c.data"
    data.write_text(
        f"classes=2\ntrain={bars}/train.list\nvalid={tmp_path}/valid.list\n"
        f"names={bars}/bars.names\nbackup={tmp_path}/backup/\n"
    )
    cfg = write_classifier_cfg(tmp_path)
    r = run_in_process(["train", cfg, data, "--map", "--device", "cpu"], cwd=tmp_path)
    assert r.code == 2, r
    assert error_line(r) == (
        f"darknet-py: error: no image of the valid list {tmp_path}/valid.list can be labelled: "
        f"{tmp_path}/img0.png: no class name occurs in the path (a classifier image's class is "
        f"the class name found in its path)"
    )
    assert not (tmp_path / "backup").exists() or not list((tmp_path / "backup").iterdir())
