"""The AlexeyAB fork's CLI habits (issue 28): -letter_box, the fork flavour's -thresh
default, -i/-gpus on a machine without a GPU, `detector test ... -out result.json <
images.txt` (paths from stdin, the fork's JSON layout), -ext_output, `detector --help`,
and `detect model.onnx IMAGE`. The real-weights tests read ../shared/weights (skipped
without it); everything runs on the CPU in about a second a command."""

import json
import re

import numpy as np
import pytest
from test_cli import DOG, IMAGES, SHARED, STOCK_CFG, run_in_process

from darknet_py import darknet_forms, fork_json, predictions
from darknet_py.boxes import Detection
from darknet_py.darknet_forms import translate

WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"
COCO_NAMES = SHARED / "weights" / "coco.names"
TINY_CFG = STOCK_CFG / "yolov3-tiny.cfg"
EAGLE = IMAGES / "eagle.jpg"
needs_weights = pytest.mark.skipif(
    not (WEIGHTS.is_file() and TINY_CFG.is_file() and DOG.is_file() and EAGLE.is_file()),
    reason=f"real yolov3-tiny weights not found under {SHARED}",
)
CPU = ["--device", "cpu"]


@pytest.fixture
def coco_data(tmp_path):
    data = tmp_path / "coco.data"
    data.write_text(f"classes=80\nnames={COCO_NAMES}\n")
    return data


def printed_detections(out):
    return [line for line in out.splitlines() if re.match(r"^\w[\w ]*: \d+%", line)]


# ---- -thresh: .25 in the fork's flavour, .5 in pjreddie's ----------------------------------------
@needs_weights
def test_thresh_default_is_the_flavours(tmp_path):
    common = [
        TINY_CFG,
        WEIGHTS,
        DOG,
        "--names",
        COCO_NAMES,
        "--out",
        "none",
        *CPU,
        "--engine",
        "numpy",
    ]
    fork = run_in_process(["detect", *common, "--darknet", "alexeyab"])
    original = run_in_process(["detect", *common])
    fork_at_half = run_in_process(["detect", *common, "--darknet", "alexeyab", "--thresh", ".5"])
    assert fork.code == original.code == fork_at_half.code == 0, (fork, original)
    # ../shared/weights/README.md: the C Darknet at -thresh .25 finds these six
    assert sorted(l.split(":")[0] for l in printed_detections(fork.out)) == [
        "bicycle",
        "car",
        "car",
        "dog",
        "truck",
        "truck",
    ]
    # pjreddie's -thresh .5: the README's C output less truck 43%
    assert sorted(l.split(":")[0] for l in printed_detections(original.out)) == [
        "bicycle",
        "car",
        "car",
        "dog",
        "truck",
    ]
    assert len(printed_detections(fork_at_half.out)) == 3


def test_default_thresh_follows_the_flavour():
    class Net:
        darknet = "alexeyab"

    assert predictions.default_thresh(Net()) == 0.25
    Net.darknet = "original"
    assert predictions.default_thresh(Net()) == 0.5


# ---- -letter_box ---------------------------------------------------------------------------------
@needs_weights
def test_letter_box_letterboxes_a_fork_flavour_detector(tmp_path, coco_data):
    """detector test -letter_box: the boxes differ from the plain resize's and are the
    network's boxes on the letterboxed input mapped back by the letterbox arithmetic."""
    from darknet_py import load_network
    from darknet_py.image import letterbox, letterbox_size, load_image

    def run(*flags, out):
        r = run_in_process(
            [
                "detector",
                "test",
                coco_data,
                TINY_CFG,
                WEIGHTS,
                DOG,
                "-dont_show",
                "-out",
                tmp_path / out,
                "--out",
                "none",
                "--darknet",
                "alexeyab",
                *flags,
                *CPU,
                "--engine",
                "numpy",
            ]
        )
        assert r.code == 0, r
        return r, json.loads((tmp_path / out).read_text())[0]["objects"]

    boxed, letter_objects = run("-letter_box", out="letter.json")
    _, plain_objects = run(out="plain.json")
    assert "-letter_box" not in boxed.err  # mapped, not dropped

    def coords(objects):
        return sorted(tuple(o["relative_coordinates"].values()) for o in objects)

    assert coords(letter_objects) != coords(plain_objects)

    net = load_network(
        str(TINY_CFG), str(WEIGHTS), batch=1, device="cpu", darknet="alexeyab", engine="numpy"
    )
    image = load_image(str(DOG))
    _, img_h, img_w = image.shape
    _, neth, netw = net.input_shape
    net.infer(letterbox(image, netw, neth)[None])
    # boxes relative to the network input, then the letterbox undone by hand
    raw = predictions.get_network_boxes(net, netw, neth, 0.25, letter=False)
    new_w, new_h = letterbox_size(img_w, img_h, netw, neth)
    assert (new_w, new_h) == (416, 312)  # dog.jpg is 768x576
    expected = {}
    for d in raw:
        x, y, w, h = (float(v) for v in d.box)
        box = (
            (x - (netw - new_w) / 2 / netw) * netw / new_w,
            (y - (neth - new_h) / 2 / neth) * neth / new_h,
            w * netw / new_w,
            h * neth / new_h,
        )
        for c in np.flatnonzero(d.probs > 0.25):
            expected.setdefault(int(c), []).append(box)
    assert len(letter_objects) >= 3
    for o in letter_objects:
        got = tuple(o["relative_coordinates"].values())
        assert any(np.allclose(got, box, atol=2e-6) for box in expected[o["class_id"]]), o


def test_letter_box_flag_reaches_map_valid_and_demo(monkeypatch, tmp_path):
    """--letter-box (the fork's -letter_box) is on while map, valid and a video run detect."""
    seen = {}
    import darknet_py.validate as validate
    import darknet_py.video as video

    monkeypatch.setattr(
        validate,
        "detector_map",
        lambda *a, **k: seen.setdefault("map", predictions._letterbox_forced),
    )
    monkeypatch.setattr(
        validate,
        "validate",
        lambda *a, **k: seen.setdefault("valid", predictions._letterbox_forced),
    )
    monkeypatch.setattr(
        video,
        "detect_video_command",
        lambda *a, **k: seen.setdefault("demo", predictions._letterbox_forced),
    )
    (tmp_path / "d.data").write_text("classes=1\n")
    for args in (
        ["detector", "map", "d.data", "c.cfg", "w", "-letter_box"],
        ["detector", "valid", "d.data", "c.cfg", "w", "-letter_box"],
        ["detector", "demo", "d.data", "c.cfg", "w", "v.mp4", "-letter_box"],
    ):
        r = run_in_process(args, cwd=tmp_path)
        assert r.code == 0, r
    assert seen == {"map": True, "valid": True, "demo": True}
    assert predictions._letterbox_forced is False  # switched off after the command
    r = run_in_process(["detector", "map", "d.data", "c.cfg", "w", "-letter_box"])
    assert "the fork's own map and valid read only [net] letter_box=1" in r.err


def test_letterboxes_decides_per_flavour_and_flag():
    class Options:
        letter_box = 0

    class Layer:
        type = "yolo"

    class Net:
        darknet = "alexeyab"
        options = Options()
        layers = [Layer()]

    assert not predictions.letterboxes(Net())
    with predictions.letterbox_forced(True):
        assert predictions.letterboxes(Net())
    assert not predictions.letterboxes(Net())
    Net.options.letter_box = 1  # [net] letter_box=1
    assert predictions.letterboxes(Net())


# ---- -i / -gpus without a GPU --------------------------------------------------------------------
def test_gpu_flags_without_a_gpu_run_on_the_cpu(monkeypatch):
    monkeypatch.setattr(darknet_forms, "gpu_present", lambda: False)
    out, note = translate("detector test d.data c.cfg w dog.jpg -i 0".split())
    assert out == "detect c.cfg w dog.jpg --data d.data".split()
    assert (
        "(-i 0: no CUDA GPU here, so the CPU runs it, as a CPU build of Darknet ignores it)" in note
    )
    out, note = translate("detector train d.data c.cfg -gpus 0,1 -map".split())
    assert out == "train c.cfg d.data --map".split() and "-gpus 0,1: no CUDA GPU here" in note
    monkeypatch.setattr(darknet_forms, "gpu_present", lambda: True)
    out, note = translate("detector test d.data c.cfg w dog.jpg -i 1 -gpus 0".split())
    assert out == "detect c.cfg w dog.jpg --data d.data --gpu 1".split()
    assert "-gpus 0: the fork reads it in train only" in note


@needs_weights
def test_detector_test_with_i_0_runs_without_a_gpu(monkeypatch, tmp_path, coco_data):
    monkeypatch.setattr(darknet_forms, "gpu_present", lambda: False)
    r = run_in_process(
        [
            "detector",
            "test",
            coco_data,
            TINY_CFG,
            WEIGHTS,
            DOG,
            "-i",
            "0",
            "-dont_show",
            "--out",
            "none",
        ]
    )
    assert r.code == 0, r
    assert "needs PyCUDA" not in r.err and "-i 0: no CUDA GPU here" in r.err
    assert len(printed_detections(r.out)) == 5  # pjreddie's weights: .5


# ---- the batch idiom: paths on stdin, -out result.json in the fork's layout ----------------------
def test_fork_json_text_is_the_forks_sprintf():
    car_truck = Detection(
        box=np.array([0.5, 0.25, 0.125, 0.0625], np.float32),
        objectness=0.9,
        probs=np.array([0, 0.75, 0.5, 0], np.float32),
    )
    hidden = Detection(box=(0.1, 0.2, 0.3, 0.4), objectness=0.9, probs=np.array([0, 0, 0, 0.9]))
    names = ["a", 'say "car"', "truck", "dont_show_me"]
    entry = fork_json.image_entry(3, "x/dog.jpg", [car_truck, hidden], names)
    assert fork_json.results_file([entry, fork_json.image_entry(4, "e.jpg", [], names)]) == (
        '[\n{\n "frame_id":3, \n "filename":"x/dog.jpg", \n "objects": [ \n'
        '  {"class_id":1, "name":"say \\"car\\"", "relative_coordinates":{"center_x":0.500000, '
        '"center_y":0.250000, "width":0.125000, "height":0.062500}, "confidence":0.750000}, \n'
        '  {"class_id":2, "name":"truck", "relative_coordinates":{"center_x":0.500000, '
        '"center_y":0.250000, "width":0.125000, "height":0.062500}, "confidence":0.500000}'
        '\n ] \n}, \n{\n "frame_id":4, \n "filename":"e.jpg", \n "objects": [ \n\n ] \n}\n]'
    )


def test_detector_test_without_an_image_reads_stdin():
    out, note = translate("detector test d.data c.cfg w -dont_show -out r.json".split())
    assert out == "detect c.cfg w - --data d.data --json r.json --json-format alexeyab".split()
    assert "no IMAGE: image paths are read from stdin" in note


@needs_weights
def test_batch_idiom_writes_the_forks_json(tmp_path, coco_data):
    from darknet_py import load_network

    missing = tmp_path / "missing.jpg"
    listing = f"{DOG}\n{missing}\n\n{EAGLE}\n"
    r = run_in_process(
        [
            "detector",
            "test",
            coco_data,
            TINY_CFG,
            WEIGHTS,
            "-ext_output",
            "-dont_show",
            "-out",
            "result.json",
            "--darknet",
            "alexeyab",
            *CPU,
            "--engine",
            "numpy",
        ],
        input=listing,
        cwd=tmp_path,
    )
    assert r.code == 2, r  # the missing image: reported, the others done
    assert str(missing) in r.err
    text = (tmp_path / "result.json").read_text()
    assert text.startswith('[\n{\n "frame_id":1, \n "filename":"') and text.endswith("\n ] \n}\n]")
    assert all(len(n.split(".")[1]) == 6 for n in re.findall(r'":(-?\d+\.\d+)', text))
    frames = json.loads(text)
    assert [(f["frame_id"], f["filename"]) for f in frames] == [(1, str(DOG)), (3, str(EAGLE))]
    assert [list(f) for f in frames] == [["frame_id", "filename", "objects"]] * 2
    first = frames[0]["objects"][0]
    assert list(first) == ["class_id", "name", "relative_coordinates", "confidence"]
    assert list(first["relative_coordinates"]) == ["center_x", "center_y", "width", "height"]
    # the values: the API's detections of the fork flavour at .25, every class of a box
    net = load_network(
        str(TINY_CFG), str(WEIGHTS), batch=1, device="cpu", darknet="alexeyab", engine="numpy"
    )
    for frame, image in zip(frames, (DOG, EAGLE)):
        dets = predictions.detect(net, str(image), thresh=0.25, darknet_order=True)
        want = [
            (int(c), round(float(d.probs[c]), 6), tuple(round(float(v), 6) for v in d.box))
            for d in dets
            for c in np.flatnonzero(d.probs > 0)
        ]
        got = [
            (o["class_id"], o["confidence"], tuple(o["relative_coordinates"].values()))
            for o in frame["objects"]
        ]
        assert got == want
    assert sorted(o["name"] for o in frames[0]["objects"]) == [
        "bicycle",
        "car",
        "car",
        "dog",
        "truck",
        "truck",
    ]
    assert [o["name"] for o in frames[1]["objects"]] == ["bird"]
    # -ext_output: the fork's lines, leftmost box first, the box on every class's line
    lines = printed_detections(r.out)
    assert lines[0] == "dog: 81%\t(left_x:  124   top_y:  220   width:  258   height:  298)"
    assert len(lines) == 7 and all("\t(left_x: " in line for line in lines)
    assert lines[-1].startswith("bird: 76%\t(left_x: ")


# ---- help and .onnx ------------------------------------------------------------------------------
@pytest.mark.parametrize("head", ["detector", "classifier"])
def test_form_help(head):
    r = run_in_process([head, "--help"])
    assert r.code == 0, r
    assert r.out.startswith(f"Usage: darknet-py {head} ")
    assert (
        f"{head} train DATA CFG [WEIGHTS]" in r.out
        and "darknet-py train CFG DATA [--weights WEIGHTS]" in r.out
    )


def test_subcommand_help_is_the_commands():
    r = run_in_process(["detector", "test", "--help"])
    assert r.code == 0, r
    assert re.match(r"Usage: \S+ detect \[OPTIONS\] CFG WEIGHTS IMAGE\.\.\.", r.out)
    assert "--thresh" in r.out and "--letter-box" in r.out and "--json-format" in r.out
    assert "`detector test DATA CFG WEIGHTS [IMAGE]` runs `darknet-py detect" in r.err
    r = run_in_process(["detector", "map", "-h"])
    assert r.code == 0 and re.match(r"Usage: \S+ map ", r.out), r


@pytest.mark.parametrize("command", ["detect"])
def test_an_onnx_model_is_refused_with_the_command_to_use(command, tmp_path):
    r = run_in_process([command, "model.onnx", "dog.jpg"])
    assert r.code == 2, r
    assert r.err.splitlines() == [
        f"darknet-py: error: model.onnx: an ONNX model is not a cfg; ONNX Runtime runs the "
        f"network from the cfg and weights it was exported from: `darknet-py {command} CFG "
        f"WEIGHTS dog.jpg --engine onnxruntime`"
    ]
