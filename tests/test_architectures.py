"""The detectors darknet_py.architectures writes: the same sections and option values as the
AlexeyAB fork's stock cfgs (where ../shared has them), and networks of the stock shapes with
any class count and size (always)."""

from pathlib import Path

import pytest

from darknet_py.architectures import ARCHITECTURES, cfg_text
from darknet_py.cfg import parse_cfg, parse_cfg_text
from darknet_py.network import Network

CFG_AB = Path(__file__).resolve().parents[2] / "shared" / "darknet-cfg-ab"


def number_or_text(value):
    """An option's value as Darknet reads it: lists of numbers compared as numbers."""
    items = [v.strip() for v in value.split(",")]
    try:
        return tuple(float(v) for v in items)
    except ValueError:
        return value.strip()


def sections(cfg):
    return [(s.type, {k: number_or_text(o.value) for k, o in s.options.items()}) for s in cfg]


@pytest.mark.parametrize("name", sorted(ARCHITECTURES))
def test_written_cfg_has_the_stock_files_sections_and_values(name):
    stock = CFG_AB / f"{name}.cfg"
    if not stock.exists():
        pytest.skip(f"needs ../shared: {stock} is absent")
    ours, theirs = sections(parse_cfg_text(cfg_text(name))), sections(parse_cfg(stock))
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"section {i}"


@pytest.mark.parametrize(
    "name,layers,heads",
    [
        ("yolov4", 162, (139, 150, 161)),
        ("yolov4-tiny", 38, (30, 37)),
        ("yolov3-tiny", 24, (16, 23)),
    ],
)
def test_written_detectors_build_with_any_class_count_and_size(name, layers, heads):
    net = Network(
        parse_cfg_text(cfg_text(name, classes=3, size=320, batch=2, subdivisions=1)),
        batch=1,
        allocate=False,
    )
    assert len(net.layers) == layers
    assert [l.index for l in net.layers if l.type == "yolo"] == list(heads)
    assert net.input_shape == (3, 320, 320)
    for i in heads:
        assert net.layers[i - 1].output_shape(1)[1] == 3 * (3 + 5)
    # the coarsest head's grid is the input over 32
    assert min(net.layers[i].output_shape(1)[2] for i in heads) == 320 // 32


def test_unknown_architecture_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="no architecture 'yolov5'; known: yolov4, "):
        cfg_text("yolov5")
