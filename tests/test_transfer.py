"""Transfer loading: weights trained for another class count fill the layers that match."""

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from helpers import digit_set, host_params, yolo_head
from test_real_weights import SHARED, WEIGHTS, needs_real_weights

from darknet_py.cfg import parse_cfg_text
from darknet_py.cli import cli
from darknet_py.network import Network, load_network
from darknet_py.train import train
from darknet_py.weights import TransferReport, WeightsError, load_weights

REPO = Path(__file__).resolve().parents[1]
STOCK_CFG = SHARED / "darknet-cfg"

# Two heads, as yolov3-tiny: the second head's branch routes from before the first head.
LEAKY_CONV = """[convolutional]
batch_normalize=1
filters={filters}
size=3
pad=1
activation=leaky
"""
TRUNK = (
    """[net]
batch=2
width=32
height=32
channels=3
max_batches=2
learning_rate=0.001
flip=0
"""
    + LEAKY_CONV.format(filters=4)
    + """[maxpool]
size=2
stride=2
"""
    + LEAKY_CONV.format(filters=8)
)


def write_cfg(path, classes):
    head = yolo_head(classes)
    path.write_text(TRUNK + head + "[route]\nlayers=-3\n" + LEAKY_CONV.format(filters=8) + head)
    return str(path)


@pytest.fixture()
def ten_class_weights(tmp_path):
    cfg = write_cfg(tmp_path / "ten.cfg", 10)
    net = load_network(cfg, seed=5)
    net.seen = 4000
    path = str(tmp_path / "ten.weights")
    net.save_weights(path)
    return path, host_params(net)


def test_transfer_loads_matching_layers_and_keeps_random_heads(ten_class_weights, tmp_path):
    path, trained = ten_class_weights
    cfg = write_cfg(tmp_path / "three.cfg", 3)
    fresh = host_params(load_network(cfg, seed=1))
    net = load_network(cfg, path, seed=1, transfer=True)
    report = net.transfer_report
    assert isinstance(report, TransferReport)
    assert (report.classes, report.loaded, report.not_loaded) == (10, [0, 2, 6], [3, 7])
    for (index, name), values in host_params(net).items():
        expected = fresh if index in (3, 7) else trained  # heads: Darknet's random start
        np.testing.assert_array_equal(values, expected[(index, name)])
    assert net.seen == 0
    assert report.lines(path)[1].startswith("layers 3, 7 differ in shape")


def gaussian_head(classes):
    """A 1x1 convolution and the [Gaussian_yolo] head it feeds: 9 + classes per anchor."""
    return (
        f"[convolutional]\nfilters={3 * (classes + 9)}\nsize=1\nactivation=linear\n"
        f"[Gaussian_yolo]\nmask=0,1,2\nanchors=8,8, 12,12, 16,16\nclasses={classes}\n"
        f"num=3\n"
    )


def test_transfer_knows_gaussian_yolo_heads(tmp_path):
    def cfg(name, classes):
        path = tmp_path / name
        path.write_text(
            TRUNK
            + gaussian_head(classes)
            + "[route]\nlayers=-3\n"
            + LEAKY_CONV.format(filters=8)
            + gaussian_head(classes)
        )
        return str(path)

    ten = load_network(cfg("ten.cfg", 10), seed=5)
    path = str(tmp_path / "ten.weights")
    ten.save_weights(path)
    trained = host_params(ten)
    three = cfg("three.cfg", 3)
    with pytest.raises(WeightsError) as info:
        load_network(three, path)
    assert (
        "trained for 10 classes, but the cfg's [Gaussian_yolo] layers have classes=3: "
        "layers 3, 7" in str(info.value)
    )
    fresh = host_params(load_network(three, seed=1))
    net = load_network(three, path, seed=1, transfer=True)
    report = net.transfer_report
    assert (report.classes, report.loaded, report.not_loaded) == (10, [0, 2, 6], [3, 7])
    for (index, name), values in host_params(net).items():
        expected = fresh if index in (3, 7) else trained
        np.testing.assert_array_equal(values, expected[(index, name)])


def test_without_transfer_the_error_names_partial_with_a_count_that_works(
    ten_class_weights, tmp_path
):
    path, trained = ten_class_weights
    cfg = write_cfg(tmp_path / "three.cfg", 3)
    with pytest.raises(WeightsError) as info:
        load_network(cfg, path)
    message = str(info.value)
    assert "trained for 10 classes" in message and "classes=3" in message
    assert "layers 3, 7 (the convolutions before them) differ" in message
    partial_command = f"darknet-py partial {cfg} {path} OUT 3"
    assert partial_command in message and "transfer=True" in message
    # The suggested command works and keeps exactly the trained layers 0-2.
    out = str(tmp_path / "three.conv.3")
    result = CliRunner().invoke(cli, partial_command.split()[1:-2] + [out, "3"])
    assert result.exit_code == 0, result.output
    net = Network(parse_cfg_text(open(cfg).read(), cfg), cfg, seed=3)
    assert load_weights(net, out, allow_partial=True) == 3
    np.testing.assert_array_equal(net.be.to_host(net.layers[2].weights), trained[(2, "weights")])


def test_a_file_of_no_class_count_keeps_the_size_error(tmp_path):
    cfg = write_cfg(tmp_path / "three.cfg", 3)
    net = load_network(cfg)
    path = str(tmp_path / "odd.weights")
    net.save_weights(path)
    with open(path, "ab") as f:
        f.write(np.zeros(7, "<f4").tobytes())  # 7 floats: no whole class count
    with pytest.raises(WeightsError, match=r"has \d+ floats .*`darknet-py partial THAT.cfg"):
        load_network(cfg, path, transfer=True)


def test_train_fine_tunes_from_another_class_count_with_a_notice(ten_class_weights, tmp_path):
    path, _ = ten_class_weights
    data = digit_set(tmp_path / "set", 4, 1, max_digits=1)
    cfg = write_cfg(tmp_path / "three.cfg", 3)
    lines = []
    with np.errstate(over="ignore", invalid="ignore"):
        result = train(
            cfg, data, weights=path, device="cpu", log=lines.append, verbose=False, workers=1
        )
    assert (
        f"{path}: weights trained for 10 classes; loaded the 3 layers whose shapes "
        f"match (0, 2, 6)" in lines
    )
    assert result.iterations == 2  # counted from 0, not from the file's 4000 images
    # The command prints the same notice (a second run into the same backup: --overwrite).
    out = CliRunner().invoke(
        cli,
        [
            "train",
            cfg,
            data,
            "--weights",
            path,
            "--device",
            "cpu",
            "--quiet",
            "--overwrite",
            "--workers",
            "0",
        ],
    )
    assert out.exit_code == 0, out.output
    assert "loaded the 3 layers whose shapes match (0, 2, 6)" in out.output
    assert "layers 3, 7 differ in shape and start from random values" in out.output


@needs_real_weights
def test_coco_yolov3_tiny_into_the_three_class_cfg():
    coco = load_network(STOCK_CFG / "yolov3-tiny.cfg", WEIGHTS / "yolov3-tiny.weights")
    net = load_network(
        REPO / "cfg" / "yolov3-tiny-3class.cfg", WEIGHTS / "yolov3-tiny.weights", transfer=True
    )
    report = net.transfer_report
    assert report.classes == 80 and report.not_loaded == [15, 22]
    assert report.loaded == [0, 2, 4, 6, 8, 10, 12, 13, 14, 18, 21]
    for index in report.loaded:
        for (name, a), (_, b) in zip(net.layers[index].params(), coco.layers[index].params()):
            np.testing.assert_array_equal(net.be.to_host(a), coco.be.to_host(b), err_msg=name)


@needs_real_weights
def test_detect_with_weights_of_another_class_count_is_one_line_naming_partial(tmp_path):
    cfg = str(REPO / "cfg" / "yolov3-tiny-3class.cfg")
    weights = str(WEIGHTS / "yolov3-tiny.weights")
    result = CliRunner().invoke(
        cli,
        [
            "detect",
            cfg,
            weights,
            str(tmp_path / "x.jpg"),
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "p.jpg"),
        ],
    )
    assert result.exit_code == 2
    (line,) = result.output.strip().splitlines()
    assert f"darknet-py partial {cfg} {weights} OUT 15" in line
