"""Darknet's command forms (issue 21, item 2): `detector ...`/`classifier ...` with DATA CFG
first and the fork's single-dash flags give the same runs as darknet-py's own form; a .data
and a .cfg given the wrong way round to our commands are named as swapped."""

import pytest
from test_cli import DOG, P1_CFG, P1_WEIGHTS, P2_CFG, P2_WEIGHTS, needs_shared, run_in_process
from test_dayone_labels import GOOD, make_dataset

from darknet_py.darknet_forms import DarknetFormError, translate


@pytest.mark.parametrize(
    "darknet, ours",
    [
        ("detector train my.data my.cfg", "train my.cfg my.data"),
        (
            "detector train my.data my.cfg darknet53.conv.74 -map -dont_show -clear -gpus 0,1",
            "train my.cfg my.data --weights darknet53.conv.74 --map --clear --gpus 0,1",
        ),
        (
            "detector test my.data my.cfg my.weights dog.jpg -thresh 0.3 -ext_output",
            "detect my.cfg my.weights dog.jpg --data my.data --thresh 0.3 --ext-output",
        ),
        (
            "detector demo my.data my.cfg my.weights -c 0",
            "detect my.cfg my.weights --data my.data --camera 0",
        ),
        ("detector valid my.data my.cfg my.weights", "valid my.cfg my.data my.weights"),
        (
            "detector map my.data my.cfg my.weights -iou_thresh 0.75 -points 101",
            "map my.cfg my.data my.weights --iou-thresh 0.75 --points 101",
        ),
        (
            "detector calc_anchors my.data -num_of_clusters 6 -width 416 -height 416",
            "anchors my.data --num 6 --width 416 --height 416 --out anchors.txt --counts-out "
            "counters_per_class.txt --overwrite",
        ),
        ("classifier train my.data my.cfg", "train my.cfg my.data"),
        (
            "classifier predict my.data my.cfg my.weights dog.jpg",
            "test my.cfg my.weights dog.jpg --data my.data",
        ),
        ("classifier valid my.data my.cfg my.weights", "valid my.cfg my.data my.weights"),
        (
            "classifier predict my.data my.cfg my.weights dog.jpg -t 3",
            "test my.cfg my.weights dog.jpg --data my.data --top 3",
        ),
        (
            "detector test my.data my.cfg my.weights list.txt -out result.json",
            "detect my.cfg my.weights list.txt --data my.data --json result.json --json-format "
            "alexeyab",
        ),
        (
            "detector test my.data my.cfg my.weights dog.jpg -out boxes",
            "detect my.cfg my.weights dog.jpg --data my.data --out boxes",
        ),
        (
            "detector test my.data my.cfg my.weights dog.jpg -save_labels -i 1",
            "detect my.cfg my.weights dog.jpg --data my.data --save-txt --gpu 1",
        ),
        # our own commands with the fork's flags
        (
            "detect my.cfg my.weights dog.jpg -thresh 0.3 -dont_show",
            "detect my.cfg my.weights dog.jpg --thresh 0.3",
        ),
        ("train my.cfg my.data -map", "train my.cfg my.data --map"),
    ],
)
def test_translation(darknet, ours, monkeypatch):
    # -i and -gpus as on a GPU machine (without one they are dropped: test_fork_cli.py)
    monkeypatch.setattr("darknet_py.darknet_forms.gpu_present", lambda: True)
    out, note = translate(darknet.split())
    assert out == ours.split()
    assert note.startswith(f"running `darknet-py {ours}`")


def test_our_own_form_is_left_alone():
    args = "detect a.cfg a.weights dog.jpg --thresh 0.3 --out x.jpg".split()
    assert translate(args) == (args, None)


@pytest.mark.parametrize(
    "args, words",
    [
        ("detector train only.data", "detector train DATA CFG [WEIGHTS]"),
        ("detector frobnicate a b", "`detector` takes one of: train, test"),
        ("classifier predict a.data a.cfg", "classifier predict DATA CFG WEIGHTS [IMAGE]"),
        ("detect a.cfg a.weights dog.jpg -thresh", "-thresh needs a value"),
    ],
)
def test_short_forms_are_refused_with_the_usage(args, words):
    with pytest.raises(DarknetFormError, match=words.replace("[", r"\[").replace("]", r"\]")):
        translate(args.split())


def test_swapped_cfg_and_data_are_named(tmp_path):
    data = make_dataset(tmp_path, [GOOD, GOOD])
    cfg = tmp_path / "d.cfg"
    r = run_in_process(["train", data, cfg, "--device", "cpu"])
    assert r.code == 2, r
    assert r.err.splitlines() == [
        f"darknet-py: error: {data} is a .data file and {cfg} a .cfg: darknet-py's order is "
        f"`train CFG DATA ...` (Darknet's own `detector train DATA CFG ...` works too)"
    ]


def without_timing(text):
    return [line for line in text.splitlines() if "Predicted in" not in line]


@needs_shared
def test_detector_test_and_map_match_our_form(tmp_path):
    (tmp_path / "three.names").write_text("a\nb\nc\n")
    (tmp_path / "valid.list").write_text(f"{tmp_path}/dog.jpg\n")
    (tmp_path / "dog.jpg").write_bytes(DOG.read_bytes())
    (tmp_path / "dog.txt").write_text("1 0.3 0.6 0.3 0.5\n2 0.7 0.2 0.2 0.2\n")
    data = tmp_path / "p2.data"
    data.write_text(f"classes=3\nvalid={tmp_path}/valid.list\nnames={tmp_path}/three.names\n")
    theirs = run_in_process(
        [
            "detector",
            "test",
            data,
            P2_CFG,
            P2_WEIGHTS,
            DOG,
            "-thresh",
            "0.3",
            "-ext_output",
            "-dont_show",
            "-out_filename",
            tmp_path / "a.jpg",
            "--device",
            "cpu",
        ]
    )
    ours = run_in_process(
        [
            "detect",
            P2_CFG,
            P2_WEIGHTS,
            DOG,
            "--data",
            data,
            "--thresh",
            "0.3",
            "--ext-output",
            "--out",
            tmp_path / "b.jpg",
            "--device",
            "cpu",
        ]
    )
    assert theirs.code == ours.code == 0, (theirs, ours)
    assert without_timing(theirs.out) == without_timing(ours.out)
    assert len(without_timing(ours.out)) >= 1
    assert (tmp_path / "a.jpg").read_bytes() == (tmp_path / "b.jpg").read_bytes()
    assert "darknet-py: note: running `darknet-py detect" in theirs.err
    theirs = run_in_process(
        ["detector", "map", data, P2_CFG, P2_WEIGHTS, "-points", "11", "--device", "cpu"]
    )
    ours = run_in_process(["map", P2_CFG, data, P2_WEIGHTS, "--points", "11", "--device", "cpu"])
    assert theirs.code == ours.code == 0, (theirs, ours)
    assert theirs.out == ours.out and "mean average precision" in ours.out


@needs_shared
def test_classifier_predict_matches_test(tmp_path):
    data = tmp_path / "p1.data"
    names = tmp_path / "p1.names"
    from darknet_py.network import build_network

    classes = build_network(str(P1_CFG)).layers[-1].outputs
    names.write_text("".join(f"class{i}\n" for i in range(classes)))
    data.write_text(f"classes={classes}\nnames={names}\ntop=2\n")
    theirs = run_in_process(
        ["classifier", "predict", data, P1_CFG, P1_WEIGHTS, DOG, "--device", "cpu"]
    )
    ours = run_in_process(["test", P1_CFG, P1_WEIGHTS, DOG, "--data", data, "--device", "cpu"])
    assert theirs.code == ours.code == 0, (theirs, ours)
    assert without_timing(theirs.out) == without_timing(ours.out)
    assert len(without_timing(ours.out)) == 2


def test_calc_anchors_matches_anchors(tmp_path):
    data = make_dataset(tmp_path, [GOOD, "0 0.4 0.4 0.6 0.5\n1 .5 .5 .05 .1\n"])
    theirs = run_in_process(
        [
            "detector",
            "calc_anchors",
            data,
            "-num_of_clusters",
            "3",
            "-width",
            "320",
            "-height",
            "320",
            "-show",
        ],
        cwd=tmp_path,
    )
    ours = run_in_process(["anchors", data, "--num", "3", "--width", "320", "--height", "320"])
    assert theirs.code == ours.code == 0, (theirs, ours)
    assert theirs.out == ours.out and ours.out.startswith("anchors = ")
    assert "(-show: nothing to do without a window)" in theirs.err


def test_detector_train_matches_train(tmp_path):
    data = make_dataset(tmp_path, [GOOD, GOOD])
    common = ["--max-batches", "1", "--workers", "0", "--device", "cpu", "--quiet"]
    theirs = run_in_process(["detector", "train", data, tmp_path / "d.cfg", "-dont_show"] + common)
    assert theirs.code == 0, theirs
    first = (tmp_path / "backup" / "d_final.weights").read_bytes()
    ours = run_in_process(["train", tmp_path / "d.cfg", data, "--overwrite"] + common)
    assert ours.code == 0, ours
    assert (tmp_path / "backup" / "d_final.weights").read_bytes() == first


@needs_shared
def test_detector_valid_matches_valid(tmp_path):
    (tmp_path / "three.names").write_text("a\nb\nc\n")
    (tmp_path / "valid.list").write_text(f"{tmp_path}/dog.jpg\n")
    (tmp_path / "dog.jpg").write_bytes(DOG.read_bytes())
    (tmp_path / "dog.txt").write_text("1 0.3 0.6 0.3 0.5\n")
    data = tmp_path / "p2.data"
    data.write_text(f"classes=3\nvalid={tmp_path}/valid.list\nnames={tmp_path}/three.names\n")
    for run in ("theirs", "ours"):
        (tmp_path / run).mkdir()
    theirs = run_in_process(
        ["detector", "valid", data, P2_CFG, P2_WEIGHTS, "--device", "cpu"], cwd=tmp_path / "theirs"
    )
    ours = run_in_process(
        ["valid", P2_CFG, data, P2_WEIGHTS, "--device", "cpu"], cwd=tmp_path / "ours"
    )
    assert theirs.code == ours.code == 0, (theirs, ours)
    assert theirs.out == ours.out and "mAP@0.5" in ours.out
    written = sorted(p.name for p in (tmp_path / "ours" / "results").iterdir())
    assert written == sorted(p.name for p in (tmp_path / "theirs" / "results").iterdir())
    for name in written:
        assert (tmp_path / "ours" / "results" / name).read_bytes() == (
            tmp_path / "theirs" / "results" / name
        ).read_bytes()
