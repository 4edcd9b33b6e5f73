"""The darknet-py command line, through click's CliRunner and as a real subprocess.

Errors a user can cause must give one `darknet-py: error:` line and exit code 2, never a
traceback; the outputs are checked against the Python API on the same fixture networks.
"""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from darknet_py import __version__
from darknet_py import cli as cli_module
from darknet_py.cli import cli, output_paths
from darknet_py.cli_options import resolve_device
from darknet_py.network import build_network, load_network
from darknet_py.weights import floats_needed

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"
STOCK_CFG = SHARED / "darknet-cfg"
IMAGES = SHARED / "images"
P1_CFG = FIXTURES / "p1_classifier" / "p1_classifier.cfg"
P1_WEIGHTS = FIXTURES / "p1_classifier" / "p1_classifier.weights"
P2_CFG = FIXTURES / "p2_tinyyolo" / "p2_tinyyolo.cfg"
P2_WEIGHTS = FIXTURES / "p2_tinyyolo" / "p2_tinyyolo.weights"
DOG = IMAGES / "dog.jpg"

needs_shared = pytest.mark.skipif(
    not (FIXTURES.is_dir() and IMAGES.is_dir() and STOCK_CFG.is_dir()),
    reason=f"shared Darknet fixtures, images and cfgs not found under {SHARED}",
)


def detection_module():
    """darknet_py.predictions, which test/detect need; skip while it is not in the tree."""
    return pytest.importorskip(
        "darknet_py.predictions", reason="darknet_py/predictions.py (classify/detect) not present"
    )


PREDICTION_LINE = re.compile(r"^ ?\d{1,3}\.\d\d%: (.+)$")
TIME_LINE = re.compile(r"^(.+): Predicted in \d+\.\d{6} seconds\.$")
DETECTION_LINE = re.compile(r"^(.+): (\d+)%  left=(\d+) top=(\d+) width=(-?\d+) height=(-?\d+)$")


class Run:
    """What one command gave: exit code, stdout, stderr."""

    def __init__(self, code, out, err):
        self.code, self.out, self.err = code, out, err

    @property
    def lines(self):
        return self.out.splitlines()

    def __repr__(self):
        return f"Run(code={self.code}, out={self.out[-2000:]!r}, err={self.err[-2000:]!r})"


def cli_runner():
    """A CliRunner keeping stderr apart from stdout (click < 8.2 mixes them by default)."""
    try:
        return CliRunner(mix_stderr=False)
    except TypeError:  # click >= 8.2 always keeps them apart
        return CliRunner()


def run_in_process(args, input=None, cwd=None):
    old = os.getcwd()
    try:
        if cwd is not None:
            os.chdir(cwd)
        result = cli_runner().invoke(cli, [str(a) for a in args], input=input)
    finally:
        os.chdir(old)
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a bug: let pytest show the traceback
    return Run(result.exit_code, result.stdout, result.stderr)


def run_subprocess(args, input=None, cwd=None, command=None):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    command = command or [sys.executable, "-m", "darknet_py.cli"]
    p = subprocess.run(
        command + [str(a) for a in args],
        input=input,
        capture_output=True,
        text=True,
        cwd=cwd,
        env=env,
        timeout=120,
    )
    return Run(p.returncode, p.stdout, p.stderr)


@pytest.fixture(params=["clirunner", "subprocess"])
def run(request):
    """Run darknet-py both ways: in-process (CliRunner) and as `python -m darknet_py.cli`."""
    return run_in_process if request.param == "clirunner" else run_subprocess


def assert_user_error(r, *fragments):
    """Exit code 2 and exactly one stderr line, `darknet-py: error: ...`, naming fragments."""
    assert r.code == 2, r
    assert "Traceback" not in r.out + r.err, r
    errors = [l for l in r.err.splitlines() if l.startswith("darknet-py: error: ")]
    assert len(errors) == 1, r
    for fragment in fragments:
        assert str(fragment) in errors[0], (fragment, r)
    return errors[0]


def write_cfg(path, text):
    path.write_text(text)
    return path


SMALL_CFG = """[net]
batch=1
width=8
height=8
channels=3

[convolutional]
filters=4
size=3
stride=1
pad=1
activation=leaky

[maxpool]
size=2
stride=2

[avgpool]

[softmax]
"""


# ---- group, help, version -------------------------------------------------------------------
def test_version(run):
    r = run(["--version"])
    assert r.code == 0 and r.out.strip() == f"darknet-py {__version__}", r


@pytest.mark.parametrize(
    "command, mentions",
    [
        ("test", ["--top", "--data", "--names", "--gpu", "--device", "stdin"]),
        (
            "detect",
            [
                "--thresh",
                "--nms",
                "--out",
                "--json",
                "--gpu",
                "--device",
                "predictions_1.jpg",
                "--overwrite",
                "--darknet-order",
                "--out none",
            ],
        ),
        ("info", ["--batch"]),
        ("partial", ["--overwrite", "N"]),
    ],
)
def test_every_command_has_help(command, mentions):
    r = run_in_process([command, "--help"])
    assert r.code == 0, r
    text = " ".join(r.out.split())  # help is wrapped to the terminal width
    for word in mentions:
        assert word in text, (word, r.out)


def test_group_help_lists_the_commands():
    r = run_in_process(["--help"])
    assert r.code == 0
    for command in ("test", "detect", "info", "partial", "train", "valid", "anchors"):
        assert re.search(rf"^\s+{command}\s", r.out, re.M), r.out
        assert f"({command})" in " ".join(r.out.split()), r.out  # and the prose says what


def test_python_dash_m_darknet_py_runs_the_cli():
    r = run_subprocess(["--version"], command=[sys.executable, "-m", "darknet_py"])
    assert r.code == 0 and r.out.strip() == f"darknet-py {__version__}", r


def test_console_script_when_installed():
    exe = shutil.which("darknet-py") or shutil.which(
        "darknet-py", path=str(Path(sys.executable).parent)
    )
    if exe is None:
        pytest.skip("the darknet-py console script is not installed (pip install -e .)")
    r = run_subprocess(["--version"], command=[exe])
    assert r.code == 0 and r.out.strip() == f"darknet-py {__version__}", r


# ---- info -------------------------------------------------------------------------------------
def table_rows(lines):
    return [l for l in lines if re.match(r"^\s*\d+ ", l)]


def test_info_prints_the_layer_table_and_total(run, tmp_path):
    cfg = write_cfg(tmp_path / "small.cfg", SMALL_CFG)
    r = run(["info", cfg])
    assert r.code == 0 and "Traceback" not in r.err, r
    assert r.lines[0] == (
        "Darknet: original (from the cfg; BFLOPs as pjreddie's Darknet counts them)"
    )
    assert r.lines[1:-1] == build_network(cfg).summary()
    rows = table_rows(r.lines)
    assert [row.split()[:2] for row in rows] == [
        ["0", "conv"],
        ["1", "max"],
        ["2", "avg"],
        ["3", "softmax"],
    ]
    # conv: 2 * 4 filters * 3 channels * 9 * 8 * 8 outputs = 13824 FLOPs
    assert "Total BFLOPs: 0.000" in r.lines


@needs_shared
def test_info_fixture_and_batch_memory_estimate():
    one = run_in_process(["info", P1_CFG])
    four = run_in_process(["info", P1_CFG, "--batch", "4"])
    assert one.code == four.code == 0, (one, four)
    assert one.lines[1:-1] == four.lines[1:-1] == build_network(P1_CFG).summary()
    memory = re.compile(
        r"^Activations and workspace at batch (\d+): ([\d.]+) MiB for inference, "
        r"([\d.]+) MiB for training"
    )
    m1, m4 = memory.match(one.lines[-1]), memory.match(four.lines[-1])
    assert m1 and m4, (one.lines[-1], four.lines[-1])
    assert (m1.group(1), m4.group(1)) == ("1", "4")
    # Three more images of p1's activations: 8192 + 2048 + 4096 + 2560 + 10 + 10 floats each.
    net = build_network(P1_CFG)
    assert net.memory_bytes(4, train=False) - net.memory_bytes(1, train=False) == 3 * 4 * 16916
    private = net.memory_bytes(4, train=True)
    net.share_deltas = net.share_outputs = True  # training's estimate: as `train` trains
    assert net.memory_bytes(4, train=True) < private
    for m, batch in ((m1, 1), (m4, 4)):
        assert float(m.group(2)) == round(net.memory_bytes(batch, train=False) / 2**20, 1)
        assert float(m.group(3)) == round(net.memory_bytes(batch, train=True) / 2**20, 1)


@needs_shared
@pytest.mark.parametrize(
    "name, layers, bflops",
    [
        # Darknet's totals: the sums of its per-layer conv BFLOPs (yolov3-tiny: 5.56 Bn).
        ("yolov3-tiny.cfg", 24, "5.565"),
        ("darknet.cfg", 16, "0.965"),
    ],
)
def test_info_on_stock_darknet_cfgs(run, name, layers, bflops):
    r = run(["info", STOCK_CFG / name])
    assert r.code == 0 and "Traceback" not in r.err, r
    assert r.lines[1].split()[:5] == ["layer", "filters", "size", "input", "output"]
    rows = table_rows(r.lines)
    assert [int(row.split()[0]) for row in rows] == list(range(layers))
    assert f"Total BFLOPs: {bflops}" in r.lines, r.out


@needs_shared
@pytest.mark.parametrize(
    "flavour, first, bflops",
    [
        (None, "Darknet: original (from the cfg;", "5.565"),
        ("alexeyab", "Darknet: alexeyab (chosen with --darknet;", "5.571"),
    ],
)
def test_info_prints_the_flavour_and_its_bflops(run, flavour, first, bflops):
    r = run(["info", STOCK_CFG / "yolov3-tiny.cfg"] + (["--darknet", flavour] if flavour else []))
    assert r.code == 0 and r.lines[0].startswith(first), r
    assert f"Total BFLOPs: {bflops}" in r.lines, r.out


def test_info_batch_must_be_positive():
    r = run_in_process(["info", "x.cfg", "--batch", "0"])
    assert r.code == 2 and "--batch" in r.err


# ---- test (classify) -------------------------------------------------------------------------
def predictions(lines):
    """[(image, [(percent, name), ...]), ...] from the test command's output."""
    images = []
    for line in lines:
        if m := TIME_LINE.match(line):
            images.append((m.group(1), []))
        else:
            m = PREDICTION_LINE.match(line)
            assert m and images, f"unexpected line {line!r}"
            images[-1][1].append((float(line.split("%")[0]), m.group(1)))
    return images


@needs_shared
def test_classify_dog_prints_top5_like_darknet(run):
    detection_module()
    r = run(["test", P1_CFG, P1_WEIGHTS, DOG, "--device", "cpu", "--engine", "numpy"])
    assert r.code == 0 and "Traceback" not in r.err, r
    assert len(r.lines) == 6, r  # the time, then 5 predictions
    [(image, top)] = predictions(r.lines)
    assert image == str(DOG) and len(top) == 5
    net = load_network(P1_CFG, P1_WEIGHTS, batch=1, device="cpu", engine="numpy")
    expected = net.classify(str(DOG), top=5)
    assert [name for _, name in top] == [str(class_id) for class_id, _, _ in expected]
    assert [p for p, _ in top] == pytest.approx([100 * p for _, p, _ in expected], abs=0.006)
    assert [p for p, _ in top] == sorted((p for p, _ in top), reverse=True)


@needs_shared
def test_classify_names_from_names_file_data_file_and_top(tmp_path):
    detection_module()
    names = [f"class-{i} with space" for i in range(10)]
    (tmp_path / "p1.names").write_text("\n".join(names) + "\n\n")
    by_names = run_in_process(
        [
            "test",
            P1_CFG,
            P1_WEIGHTS,
            DOG,
            "--device",
            "cpu",
            "--names",
            tmp_path / "p1.names",
            "--top",
            "3",
            "--engine",
            "numpy",
        ]
    )
    assert by_names.code == 0, by_names
    [(_, top)] = predictions(by_names.lines)
    assert len(top) == 3 and all(name in names for _, name in top)
    # A .data file's names= is relative to the current directory, as in Darknet.
    (tmp_path / "p1.data").write_text("classes=10\nnames = p1.names\ntop=2\n")
    by_data = run_in_process(
        [
            "test",
            P1_CFG,
            P1_WEIGHTS,
            DOG,
            "--device",
            "cpu",
            "--data",
            "p1.data",
            "--engine",
            "numpy",
        ],
        cwd=tmp_path,
    )
    assert by_data.code == 0, by_data
    [(_, top2)] = predictions(by_data.lines)
    assert top2 == top[:2]  # top=2 from the .data file
    assert "warning" not in by_names.err + by_data.err
    # Too few names: a warning, and the classes without one are numbered.
    (tmp_path / "two.names").write_text("first\nsecond\n")
    few = run_in_process(
        [
            "test",
            P1_CFG,
            P1_WEIGHTS,
            DOG,
            "--device",
            "cpu",
            "--names",
            tmp_path / "two.names",
            "--top",
            "10",
            "--engine",
            "numpy",
        ]
    )
    assert few.code == 0, few
    assert few.err.splitlines() == [
        "darknet-py: warning: 2 class names given, but the network "
        "has 10 classes; the others are shown as numbers"
    ]
    [(_, all10)] = predictions(few.lines)
    assert sorted(name for _, name in all10) == sorted(["first", "second"] + list("23456789"))


@needs_shared
def test_classify_several_images_from_args_list_file_and_stdin(tmp_path):
    detection_module()
    listing = tmp_path / "images.list"
    listing.write_text(f"{IMAGES / 'eagle.jpg'}\n\n{IMAGES / 'horses.jpg'}\n")
    r = run_in_process(
        ["test", P1_CFG, P1_WEIGHTS, DOG, listing, "-", "--device", "cpu", "--top", "2"],
        input=f"{IMAGES / 'person.jpg'}\n",
    )
    assert r.code == 0, r
    got = predictions(r.lines)
    assert [image for image, _ in got] == [
        str(IMAGES / n) for n in ("dog.jpg", "eagle.jpg", "horses.jpg", "person.jpg")
    ]
    assert all(len(top) == 2 for _, top in got)


@needs_shared
def test_default_device_is_auto_with_a_notice_once_per_process(monkeypatch):
    detection_module()
    from darknet_py import backends

    if backends.cuda_available():
        pytest.skip("CUDA is available here, so auto picks it without a notice")
    monkeypatch.setattr(backends, "_cpu_notice_given", False)
    r = run_in_process(["test", P1_CFG, P1_WEIGHTS, DOG])
    assert r.code == 0, r
    notices = [l for l in r.err.splitlines() if "running on the CPU" in l]
    assert len(notices) == 1, r
    again = run_in_process(["test", P1_CFG, P1_WEIGHTS, DOG])  # same process: no repeat
    assert again.code == 0 and "running on the CPU" not in again.err, again


# ---- partial --------------------------------------------------------------------------------
@needs_shared
@pytest.mark.parametrize("n", [0, 1, 3, 6, 100])
def test_partial_writes_header_and_first_n_layers(run, tmp_path, n):
    out = tmp_path / "p1.partial"
    r = run(["partial", P1_CFG, P1_WEIGHTS, out, n])
    assert r.code == 0, r
    net = load_network(P1_CFG, batch=1, device="cpu")
    floats = floats_needed(net, n)
    header = 20  # major, minor, revision, 64-bit seen (version 0.2)
    data = out.read_bytes()
    assert len(data) == header + 4 * floats
    original = P1_WEIGHTS.read_bytes()
    assert data[:12] == original[:12]
    assert struct.unpack("<Q", data[12:20]) == (0,)  # seen is reset, as in Darknet
    assert data[header:] == original[header : header + 4 * floats]
    if n >= len(net.layers):
        assert floats == (len(original) - header) // 4


@needs_shared
def test_partial_refuses_to_overwrite_its_input_without_overwrite(run, tmp_path):
    weights = tmp_path / "p1.weights"
    shutil.copyfile(P1_WEIGHTS, weights)
    before = weights.read_bytes()
    r = run(["partial", P1_CFG, weights, weights, 2])
    assert_user_error(r, weights, "--overwrite")
    assert weights.read_bytes() == before
    # The same file by another spelling is refused too.
    r = run(["partial", P1_CFG, weights, tmp_path / "." / "p1.weights", 2], cwd=tmp_path)
    assert_user_error(r, "--overwrite")
    forced = run(["partial", P1_CFG, weights, weights, 2, "--overwrite"])
    assert forced.code == 0, forced
    net = load_network(P1_CFG, batch=1, device="cpu")
    assert weights.stat().st_size == 20 + 4 * floats_needed(net, 2)


@needs_shared
def test_partial_of_a_too_short_file_names_both_float_counts(run, tmp_path):
    short = tmp_path / "short.weights"
    short.write_bytes(P1_WEIGHTS.read_bytes()[: 20 + 4 * 100])
    net = load_network(P1_CFG, batch=1, device="cpu")
    r = run(["partial", P1_CFG, short, tmp_path / "out.weights", 3])
    assert_user_error(r, short, "100", str(floats_needed(net, 3)))
    assert not (tmp_path / "out.weights").exists()


# ---- errors ---------------------------------------------------------------------------------
@needs_shared
@pytest.mark.parametrize("command", ["test", "detect"])
def test_missing_cfg_weights_or_image(run, tmp_path, command):
    missing = tmp_path / "missing"
    assert_user_error(
        run([command, f"{missing}.cfg", P1_WEIGHTS, DOG, "--device", "cpu"]),
        f"{missing}.cfg",
        "not found",
    )
    assert_user_error(
        run([command, P1_CFG, f"{missing}.weights", DOG, "--device", "cpu"]),
        f"{missing}.weights",
        "not found",
    )
    if command == "test":
        detection_module()
        assert_user_error(
            run([command, P1_CFG, P1_WEIGHTS, f"{missing}.jpg", "--device", "cpu"]),
            f"{missing}.jpg",
            "not found",
        )


def test_info_missing_cfg(run, tmp_path):
    assert_user_error(run(["info", tmp_path / "nope.cfg"]), tmp_path / "nope.cfg", "not found")


@needs_shared
def test_partial_missing_files(run, tmp_path):
    out = tmp_path / "out.weights"
    assert_user_error(run(["partial", tmp_path / "no.cfg", P1_WEIGHTS, out, 2]), "no.cfg")
    assert_user_error(run(["partial", P1_CFG, tmp_path / "no.weights", out, 2]), "no.weights")
    assert not out.exists()


@pytest.mark.parametrize("command", ["info", "test", "detect", "partial"])
def test_cfg_error_names_file_line_and_key(run, tmp_path, command):
    cfg = write_cfg(tmp_path / "bad.cfg", SMALL_CFG.replace("filters=4", "filters=many"))
    assert cfg.read_text().splitlines()[7] == "filters=many"  # line 8
    args = {
        "info": [cfg],
        "test": [cfg, "x.weights", "x.jpg", "--device", "cpu"],
        "detect": [cfg, "x.weights", "x.jpg", "--device", "cpu"],
        "partial": [cfg, "x.weights", tmp_path / "o.weights", 1],
    }[command]
    line = assert_user_error(run([command, *args]), f"{cfg}:8: filters: ", "many")
    assert line == f"darknet-py: error: {cfg}:8: filters: expected an integer, got 'many'"


def test_cfg_warning_is_one_line_without_python_boilerplate(run, tmp_path):
    cfg = write_cfg(tmp_path / "typo.cfg", SMALL_CFG.replace("pad=1", "pad=1\nfliters=3"))
    r = run(["info", cfg])
    assert r.code == 0, r
    warnings = r.err.splitlines()
    assert warnings == [
        f"darknet-py: warning: {cfg}:12: fliters: option not used by [convolutional] (a typo?)"
    ], r
    # The same cfg again in the same process warns again.
    assert run(["info", cfg]).err.splitlines() == warnings


@needs_shared
def test_weights_of_the_wrong_size_say_both_float_counts(run, tmp_path):
    net = load_network(P1_CFG, batch=1, device="cpu")
    need = floats_needed(net)
    data = P1_WEIGHTS.read_bytes()
    short, long_ = tmp_path / "short.weights", tmp_path / "long.weights"
    short.write_bytes(data[: -4 * 10])
    long_.write_bytes(data + b"\0" * 4 * 3)
    for command in ("test", "detect"):
        assert_user_error(
            run([command, P1_CFG, short, DOG, "--device", "cpu"]), short, str(need - 10), str(need)
        )
        assert_user_error(
            run([command, P1_CFG, long_, DOG, "--device", "cpu"]), long_, str(need + 3), str(need)
        )


@needs_shared
def test_unreadable_image(run, tmp_path):
    detection_module()
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(bytes(range(256)) * 8)
    r = run(["test", P1_CFG, P1_WEIGHTS, garbage, "--device", "cpu"])
    assert_user_error(r, garbage, "cannot read image")


@needs_shared
def test_an_unreadable_image_among_good_ones_is_reported_and_skipped(tmp_path):
    detection_module()
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"not a jpeg")
    r = run_in_process(["test", P1_CFG, P1_WEIGHTS, garbage, DOG, "--device", "cpu"])
    assert_user_error(r, garbage)
    assert [image for image, _ in predictions(r.lines)] == [str(DOG)]


@needs_shared
@pytest.mark.parametrize(
    "args, fragments",
    [
        (["--device", "tpu"], ["unknown device 'tpu'"]),
        (["--device", "cuda:x"], ["bad device 'cuda:x'"]),
        # Without PyCUDA: "needs PyCUDA"; with it: "no CUDA device 99". Either way one line.
        (["--device", "cuda:99"], ["99"]),
        (["--gpu", "99"], ["99"]),
    ],
)
def test_bad_device(run, args, fragments):
    assert_user_error(run(["test", P1_CFG, P1_WEIGHTS, DOG, *args]), *fragments)


def test_gpu_and_device_together_is_a_usage_error():
    r = run_in_process(["info", "--help"])  # info runs nothing on a device
    assert "--gpu" not in r.out
    r = run_in_process(["test", "a.cfg", "a.weights", "a.jpg", "--gpu", "0", "--device", "cpu"])
    assert r.code == 2 and "give --gpu or --device, not both" in r.err, r
    r = run_in_process(["test", "a.cfg", "a.weights", "a.jpg", "--gpu", "-1"])
    assert r.code == 2 and "--gpu" in r.err, r


def test_resolve_device():
    assert resolve_device(None, None) == "auto"
    assert resolve_device(None, "cpu") == "cpu"
    assert resolve_device(2, None) == "cuda:2"


@needs_shared
def test_missing_names_data_and_list_files(run, tmp_path):
    base = ["test", P1_CFG, P1_WEIGHTS, DOG, "--device", "cpu"]
    assert_user_error(run(base + ["--names", tmp_path / "no.names"]), "no.names")
    assert_user_error(run(base + ["--data", tmp_path / "no.data"]), "no.data", "not found")
    (tmp_path / "x.data").write_text("names=elsewhere/coco.names\n")
    assert_user_error(run(base + ["--data", "x.data"], cwd=tmp_path), "elsewhere/coco.names")
    assert_user_error(
        run(["test", P1_CFG, P1_WEIGHTS, tmp_path / "no.txt", "--device", "cpu"]), "no.txt"
    )
    (tmp_path / "empty.txt").write_text("\n")
    assert_user_error(run(["test", P1_CFG, P1_WEIGHTS, tmp_path / "empty.txt"]), "empty")
    r = run(base + ["--names", "a", "--data", "b"])
    assert r.code == 2 and "not both" in r.err


def test_unexpected_exceptions_keep_their_traceback(monkeypatch, tmp_path):
    def broken(*args, **kwargs):
        raise RuntimeError("a bug")

    monkeypatch.setattr(cli_module, "build_network", broken)
    result = cli_runner().invoke(cli, ["info", str(write_cfg(tmp_path / "a.cfg", SMALL_CFG))])
    assert isinstance(result.exception, RuntimeError)
    assert result.exit_code == 1


# ---- detect helpers ---------------------------------------------------------------------------
def test_output_paths(tmp_path):
    a, b = str(tmp_path / "a" / "dog.jpg"), str(tmp_path / "b" / "dog.png")
    assert output_paths("predictions.jpg", [a]) == ["predictions.jpg"]
    assert output_paths("out/pred", [a]) == ["out/pred.jpg"]
    assert output_paths("pred.png", [a, b]) == ["pred_1.png", "pred_2.png"]
    assert output_paths(str(tmp_path) + "/", [a, b]) == [
        str(tmp_path / "dog.jpg"),
        str(tmp_path / "dog_2.jpg"),
    ]
    (tmp_path / "a").mkdir()
    with pytest.raises(cli_module.UserError, match="overwrite the input image"):
        output_paths(str(tmp_path / "a"), [a])
    with pytest.raises(cli_module.UserError, match="overwrite the input image"):
        output_paths(a, [a])
    with pytest.raises(cli_module.UserError, match="cannot write .xyz"):
        output_paths("pred.xyz", [a])


# ---- detect ---------------------------------------------------------------------------------
# p2 has seeded random weights, so its boxes mean nothing; this threshold keeps a few.
P2_THRESH = "0.3"


def detections_printed(lines):
    """[(image, [(name, percent, (left, top, width, height)), ...]), ...] from detect."""
    images = []
    for line in lines:
        if m := TIME_LINE.match(line):
            images.append((m.group(1), []))
        else:
            m = DETECTION_LINE.match(line)
            assert m and images, f"unexpected line {line!r}"
            images[-1][1].append(
                (m.group(1), int(m.group(2)), tuple(int(m.group(k)) for k in range(3, 7)))
            )
    return images


def p2_api_detections(image, thresh):
    detection = detection_module()
    net = load_network(P2_CFG, P2_WEIGHTS, batch=1, device="cpu", engine="numpy")
    dets = net.detect(str(image), thresh=thresh, hier=0.5, nms=0.45)
    return detection, dets


@needs_shared
def test_detect_prints_boxes_writes_labelled_image_and_json(run, tmp_path):
    import cv2

    detection, dets = p2_api_detections(DOG, float(P2_THRESH))
    assert dets, "p2 finds nothing on dog.jpg at this threshold: lower P2_THRESH"
    out, report = tmp_path / "pred.png", tmp_path / "dets.json"
    r = run(
        [
            "detect",
            P2_CFG,
            P2_WEIGHTS,
            DOG,
            "--device",
            "cpu",
            "--thresh",
            P2_THRESH,
            "--out",
            out,
            "--json",
            report,
            "--engine",
            "numpy",
        ]
    )
    assert r.code == 0 and "Traceback" not in r.err, r
    # Printed: one line per class above thresh of each detection, boxes in pixels.
    original = cv2.imread(str(DOG))
    height, width = original.shape[:2]
    [(image, printed)] = detections_printed(r.lines)
    assert image == str(DOG)
    expected = []
    for d in dets:
        left, top, right, bottom = detection.pixel_box(d.box, width, height)
        for class_id in np.nonzero(d.probs > float(P2_THRESH))[0]:
            expected.append(
                (
                    str(class_id),
                    round(100 * float(d.probs[class_id])),
                    (left, top, right - left, bottom - top),
                )
            )
    assert [(n, b) for n, _, b in printed] == [(n, b) for n, _, b in expected]
    assert all(abs(p - q) <= 1 for (_, p, _), (_, q, _) in zip(printed, expected))
    # The drawing: the original image (not the 96x96 letterboxed input) with boxes on it.
    drawn = cv2.imread(str(out))
    assert drawn is not None and drawn.shape == original.shape
    changed = np.any(drawn != original, axis=2)
    assert changed.any()
    # The left edge of every box that lies inside the image is drawn.
    inside = [b for _, _, b in expected if b[2] > 0 and b[3] > 0]
    assert inside
    for left, top, _, box_h in inside:
        assert changed[top + box_h // 2, left], (left, top, box_h)
    # Everything else is untouched: png is lossless, so with no detection it is the input.
    plain = tmp_path / "plain.png"
    r = run(
        [
            "detect",
            P2_CFG,
            P2_WEIGHTS,
            DOG,
            "--device",
            "cpu",
            "--thresh",
            "1",
            "--out",
            plain,
            "--engine",
            "numpy",
        ]
    )
    assert r.code == 0 and r.lines[1:] == [], r
    assert np.array_equal(cv2.imread(str(plain)), original)
    # JSON: every detection of every image.
    content = json.loads(report.read_text())
    assert content["thresh"] == float(P2_THRESH) and content["nms"] == 0.45
    [entry] = content["images"]
    assert entry["image"] == str(DOG) and entry["output"] == str(out)
    assert (entry["width"], entry["height"]) == (width, height)
    assert entry["detections"] == json.loads(
        json.dumps(detection.detections_to_json(dets, width, height, None))
    )
    assert [d["name"] for d in entry["detections"]] == [str(d.class_id) for d in dets]


@needs_shared
def test_detect_several_images_numbered_or_into_a_directory(tmp_path):
    import cv2

    detection_module()
    images = [DOG, IMAGES / "horses.jpg"]
    base = ["detect", P2_CFG, P2_WEIGHTS, *images, "--device", "cpu", "--thresh", P2_THRESH]
    (tmp_path / "p2.names").write_text("cat\ndog\nbike\n")
    r = run_in_process(
        base
        + [
            "--out",
            tmp_path / "pred.jpg",
            "--json",
            tmp_path / "all.json",
            "--names",
            tmp_path / "p2.names",
        ]
    )
    assert r.code == 0 and "warning" not in r.err, r
    printed = detections_printed(r.lines)
    assert [image for image, _ in printed] == [str(i) for i in images]
    assert {name for _, dets in printed for name, _, _ in dets} <= {"cat", "dog", "bike"}
    for index, image in enumerate(images, start=1):
        drawn = cv2.imread(str(tmp_path / f"pred_{index}.jpg"))
        assert drawn is not None and drawn.shape == cv2.imread(str(image)).shape
    assert not (tmp_path / "pred.jpg").exists()
    entries = json.loads((tmp_path / "all.json").read_text())["images"]
    assert [e["image"] for e in entries] == [str(i) for i in images]
    assert all(
        d["name"] == ("cat", "dog", "bike")[d["class_id"]] for e in entries for d in e["detections"]
    )
    assert sum(len(e["detections"]) for e in entries) > 0
    assert [e["output"] for e in entries] == [str(tmp_path / f"pred_{i}.jpg") for i in (1, 2)]
    # A directory: each image under its own name.
    r = run_in_process(base + ["--out", f"{tmp_path / 'drawn'}/"])
    assert r.code == 0, r
    assert sorted(p.name for p in (tmp_path / "drawn").iterdir()) == ["dog.jpg", "horses.jpg"]


@needs_shared
def test_detect_errors(run, tmp_path):
    detection_module()
    # A classifier is not a detector.
    assert_user_error(
        run(["detect", P1_CFG, P1_WEIGHTS, DOG, "--device", "cpu"]),
        P1_CFG,
        "no [yolo]",
        "darknet-py test",
    )
    # An unreadable image.
    garbage = tmp_path / "garbage.jpg"
    garbage.write_bytes(b"\xff\xd8\xff garbage " * 50)
    r = run(["detect", P2_CFG, P2_WEIGHTS, garbage, "--device", "cpu", "--out", tmp_path / "o.jpg"])
    assert_user_error(r, garbage, "cannot read image")
    assert not (tmp_path / "o.jpg").exists()
    # Outputs that cannot be written are refused before any work.
    assert_user_error(run(["detect", P2_CFG, P2_WEIGHTS, DOG, "--out", tmp_path / "o.xyz"]), ".xyz")
    copy = tmp_path / "dog.jpg"
    shutil.copyfile(DOG, copy)
    assert_user_error(
        run(["detect", P2_CFG, P2_WEIGHTS, copy, "--out", copy]), "overwrite the input image"
    )
    assert copy.read_bytes() == DOG.read_bytes()
    assert_user_error(
        run(
            [
                "detect",
                P2_CFG,
                P2_WEIGHTS,
                DOG,
                "--device",
                "cpu",
                "--out",
                tmp_path / "o.jpg",
                "--json",
                copy / "dir.json",
            ]
        ),
        str(copy),
        "not a directory",
    )
    assert not (tmp_path / "o.jpg").exists()


# ---- detect's outputs: every class everywhere, Darknet's order, the overwrite rule ------------
YOLOV3_TINY_CFG = STOCK_CFG / "yolov3-tiny.cfg"
YOLOV3_TINY_WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"
COCO_NAMES = SHARED / "weights" / "coco.names"
needs_real_weights = pytest.mark.skipif(
    not YOLOV3_TINY_WEIGHTS.is_file(), reason=f"{YOLOV3_TINY_WEIGHTS} not found"
)


@needs_shared
@needs_real_weights
def test_detect_darknet_order_json_and_labels_carry_every_class(tmp_path):
    base = [
        "detect",
        YOLOV3_TINY_CFG,
        YOLOV3_TINY_WEIGHTS,
        DOG,
        "--names",
        COCO_NAMES,
        "--thresh",
        ".25",
        "--device",
        "cpu",
        "--engine",
        "numpy",
    ]
    ordered = run_in_process(base + ["--darknet-order", "--out", "none"], cwd=tmp_path)
    assert ordered.code == 0, ordered
    assert list(tmp_path.iterdir()) == []  # --out none: no picture
    # What the C Darknet prints for this cfg, weights and image (../shared/weights/README.md),
    # percentages within a point of its rounding.
    c_darknet = [
        ("dog", 57),
        ("car", 52),
        ("truck", 56),
        ("car", 62),
        ("truck", 43),
        ("bicycle", 59),
    ]
    printed = [line.rsplit(": ", 1) for line in ordered.lines[1:]]
    assert [name for name, _ in printed] == [name for name, _ in c_darknet], ordered
    assert all(abs(int(p.rstrip("%")) - q) <= 1 for (_, p), (_, q) in zip(printed, c_darknet))
    # Default order and format, with --json: each printed line is a class in the JSON and
    # a box with two classes above thresh carries both.
    report = tmp_path / "dets.json"
    r = run_in_process(base + ["--out", tmp_path / "drawn.jpg", "--json", report], cwd=tmp_path)
    assert r.code == 0, r
    [(_, lines)] = detections_printed(r.lines)
    detections = json.loads(report.read_text())["images"][0]["detections"]
    in_json = [
        (
            c["name"],
            round(100 * c["prob"]),
            (d["box"]["left"], d["box"]["top"], d["box"]["width"], d["box"]["height"]),
        )
        for d in detections
        for c in d["classes"]
    ]
    assert sorted(lines) == sorted(in_json)
    assert sorted(name for name, _, _ in lines) == sorted(name for name, _ in c_darknet)
    two = [d for d in detections if len(d["classes"]) == 2]
    assert {c["name"] for d in two for c in d["classes"]} == {"car", "truck"}
    assert all(d["name"] == max(d["classes"], key=lambda c: c["prob"])["name"] for d in two)


def test_box_label_names_every_class_above_thresh():
    from darknet_py.boxes import Detection
    from darknet_py.predictions import _label

    det = Detection(
        box=(0.5, 0.5, 0.2, 0.2),
        objectness=0.9,
        probs=np.array([0, 0.62, 0, 0.41], dtype=np.float32),
        class_id=1,
        prob=0.62,
    )
    assert _label(det, ["a", "car", "c", "truck"]) == "car, truck 62%"
    assert _label(det, None) == "1, 3 62%"


@needs_shared
def test_detect_replaces_its_outputs_only_with_overwrite(tmp_path):
    out, report = tmp_path / "pred.jpg", tmp_path / "dets.json"
    out.write_bytes(b"an earlier picture")
    report.write_text("{}")
    stale = tmp_path / ".output-999999999-x.jpg"  # a write interrupted in a dead process
    stale.write_bytes(b"half")
    args = ["detect", P2_CFG, P2_WEIGHTS, DOG, "--device", "cpu", "--out", out, "--json", report]
    refused = run_in_process(args)
    assert refused.code == 2 and "--overwrite" in refused.err, refused
    assert out.read_bytes() == b"an earlier picture" and report.read_text() == "{}"
    r = run_in_process(args + ["--overwrite"])
    assert r.code == 0, r
    assert out.read_bytes()[:2] == b"\xff\xd8" and json.loads(report.read_text())["images"]
    assert not stale.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dets.json", "pred.jpg"]


@needs_shared
def test_detect_on_an_empty_array_is_an_image_error():
    from darknet_py.image import ImageError

    net = load_network(P2_CFG, None, batch=1, device="cpu")
    with pytest.raises(ImageError, match="empty"):
        net.detect(np.zeros((0, 0, 3), dtype=np.uint8))
