"""Darknet's stock cfg files build, with Darknet's shapes and Darknet's BFLOPs.

Published totals come from pjreddie.com, whose pages are the Markdown files of the
pjreddie/pjreddie.github.io repository:
  * /darknet/imagenet/ (_darknet/imagenet/imagenet.md), the "Ops" column of the
    pre-trained model table, and its printed darknet19 layer table;
  * /darknet/yolo/ (_darknet/yolo/yolo.md), the "FLOPS" column for YOLOv2 608,
    Tiny YOLO (yolov2-tiny), YOLOv3-320/416/608, YOLOv3-tiny and YOLOv3-spp, and its
    printed yolov3 layer rows at 416;
  * the YOLOv2-era version of /darknet/yolo/ (quoted verbatim by many mirrors): "Old
    YOLO" (yolov1.cfg) 40.19 Bn and Tiny YOLO VOC (yolov2-tiny-voc.cfg) 6.97 Bn;
  * /darknet/tiny-darknet/ (_darknet/tiny-darknet/tiny-darknet.md): Tiny Darknet 0.98 Bn.
Darknet counts 2*filters*size*size*c/groups*out_h*out_w per convolution and
2*inputs*outputs per connected layer (the AlexNet and VGG-16 totals include their
connected layers), and nothing for [local] (YOLOv1's 40.19 excludes it).
"""

import re
import warnings
from pathlib import Path

import pytest

from darknet_py.cfg import parse_cfg, parse_cfg_text
from darknet_py.network import Network, build_network

REPO = Path(__file__).resolve().parents[1]
STOCK_DIR = REPO.parent / "shared" / "darknet-cfg"
REPO_CFG_DIR = REPO / "cfg"

needs_stock = pytest.mark.skipif(
    not STOCK_DIR.is_dir(), reason=f"Darknet's stock cfgs are not at {STOCK_DIR}"
)


def _cfg_params(directory, why_empty):
    files = sorted(directory.glob("*.cfg")) if directory.is_dir() else []
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=why_empty))]
    return [pytest.param(f, id=f.name) for f in files]


def _build(path):
    """build_network, failing on any option the layers left unread (a missed Darknet option)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = build_network(path)
    unread = [str(w.message) for w in caught if "not used" in str(w.message)]
    assert not unread, "\n".join(unread)
    return net


def _at_size(path, size):
    """The network of a cfg with its [net] width and height replaced, as Darknet's
    published YOLOv3-320/416/608 numbers use one cfg at three sizes."""
    text = Path(path).read_text()
    text = re.sub(r"(?m)^width\s*=\s*\d+", f"width={size}", text)
    text = re.sub(r"(?m)^height\s*=\s*\d+", f"height={size}", text)
    return Network(parse_cfg_text(text, str(path)), str(path), batch=1, allocate=False)


@needs_stock
@pytest.mark.parametrize("path", _cfg_params(STOCK_DIR, "no stock cfgs"))
def test_stock_cfg_builds_without_allocating(path):
    net = _build(path)
    assert net.layers
    for layer in net.layers:
        assert layer.outputs > 0, f"layer {layer.index} ({layer.type}) has no outputs"
        assert layer.output is None  # shapes only
    assert len(net.summary()) == len(net.layers) + 2


@pytest.mark.parametrize(
    "path", _cfg_params(REPO_CFG_DIR, "no cfg files in the repository's cfg/ directory yet")
)
def test_repo_cfg_builds(path):
    net = _build(path)
    assert net.layers and all(layer.outputs > 0 for layer in net.layers)


# ---- Darknet's published BFLOPs ---------------------------------------------------------------
PUBLISHED_BFLOPS = {
    # /darknet/imagenet/
    "alexnet.cfg": "2.27",
    "darknet.cfg": "0.96",
    "vgg-16.cfg": "30.94",
    "extraction.cfg": "8.52",
    "darknet19.cfg": "7.29",
    "darknet19_448.cfg": "22.33",
    "resnet18.cfg": "4.69",
    "resnet34.cfg": "9.52",
    "resnet50.cfg": "9.74",
    "resnet101.cfg": "19.70",
    "resnet152.cfg": "29.39",
    "resnext50.cfg": "10.11",
    "resnext101-32x4d.cfg": "18.92",
    "resnext152-32x4d.cfg": "28.20",
    "densenet201.cfg": "10.85",
    "darknet53.cfg": "18.57",
    "darknet53_448.cfg": "56.87",
    # /darknet/yolo/ (the cfgs at their own sizes)
    "yolov2.cfg": "62.94",
    "yolov2-tiny.cfg": "5.41",
    "yolov3.cfg": "140.69",
    "yolov3-tiny.cfg": "5.56",
    "yolov3-spp.cfg": "141.45",
    # the YOLOv2-era /darknet/yolo/ table
    "yolov1.cfg": "40.19",
    "yolov2-tiny-voc.cfg": "6.97",
    # /darknet/tiny-darknet/
    "tiny.cfg": "0.98",
}


@needs_stock
@pytest.mark.parametrize("name,published", sorted(PUBLISHED_BFLOPS.items()))
def test_total_bflops_equal_darknets_published(name, published):
    net = _build(STOCK_DIR / name)
    assert f"{net.bflops:.2f}" == published, f"{name}: {net.bflops:.4f} BFLOPs"
    assert net.summary()[-1] == f"Total BFLOPs: {net.bflops:.3f}"


@needs_stock
@pytest.mark.parametrize("size,published", [(320, "38.97"), (416, "65.86"), (608, "140.69")])
def test_yolov3_bflops_at_each_published_size(size, published):
    net = _at_size(STOCK_DIR / "yolov3.cfg", size)
    assert f"{net.bflops:.2f}" == published
    heads = [(l.out_w, l.out_h, l.out_c) for l in net.layers if l.type == "yolo"]
    assert heads == [(size // s, size // s, 255) for s in (32, 16, 8)]


@needs_stock
def test_layer_table_rows_as_darknet_prints_them():
    # Rows of the darknet19 table printed on /darknet/imagenet/ ...
    rows = _build(STOCK_DIR / "darknet19.cfg").summary()
    assert rows[0] == "layer     filters    size              input                output"
    expected = {
        0: "    0 conv     32  3 x 3 / 1   256 x 256 x   3   ->   256 x 256 x  32  0.113 BFLOPs",
        1: "    1 max          2 x 2 / 2   256 x 256 x  32   ->   128 x 128 x  32",
        5: "    5 conv     64  1 x 1 / 1    64 x  64 x 128   ->    64 x  64 x  64  0.067 BFLOPs",
        18: "   18 conv   1024  3 x 3 / 1     8 x   8 x 512   ->     8 x   8 x1024  0.604 BFLOPs",
        23: "   23 conv   1000  1 x 1 / 1     8 x   8 x1024   ->     8 x   8 x1000  0.131 BFLOPs",
        24: "   24 avg                        8 x   8 x1000   ->  1000",
        25: "   25 softmax                                        1000",
    }
    for index, row in expected.items():
        assert rows[index + 1] == row
    # ... and of yolov3 at 416 on /darknet/yolo/.
    rows = _at_size(STOCK_DIR / "yolov3.cfg", 416).summary()
    expected = {
        0: "    0 conv     32  3 x 3 / 1   416 x 416 x   3   ->   416 x 416 x  32  0.299 BFLOPs",
        1: "    1 conv     64  3 x 3 / 2   416 x 416 x  32   ->   208 x 208 x  64  1.595 BFLOPs",
        104: "  104 conv    256  3 x 3 / 1    52 x  52 x 128   ->    52 x  52 x 256  1.595 BFLOPs",
        105: "  105 conv    255  1 x 1 / 1    52 x  52 x 256   ->    52 x  52 x 255  0.353 BFLOPs",
    }
    for index, row in expected.items():
        assert rows[index + 1] == row


# ---- shapes the cfgs imply ----------------------------------------------------------------------
# The last non-cost layer's outputs: the classes of the data set the cfg was made for.
FINAL_OUTPUTS = {
    "alexnet.cfg": 1000,
    "cifar.cfg": 10,
    "cifar.test.cfg": 10,
    "darknet.cfg": 1000,
    "darknet19.cfg": 1000,
    "darknet19_448.cfg": 1000,
    "darknet53.cfg": 1000,
    "darknet53_448.cfg": 1000,
    "densenet201.cfg": 1000,
    "extraction.cfg": 1000,
    "extraction.conv.cfg": 1000,
    "extraction22k.cfg": 21842,
    "resnet18.cfg": 1000,
    "resnet34.cfg": 1000,
    "resnet50.cfg": 1000,
    "resnet101.cfg": 1000,
    "resnet152.cfg": 1000,
    "resnext50.cfg": 1000,
    "resnext101-32x4d.cfg": 1000,
    "resnext152-32x4d.cfg": 1000,
    "strided.cfg": 1000,
    "tiny.cfg": 1000,
    "vgg-16.cfg": 1000,
    # Go: a 19x19 board of moves plus one extra (pass) value appended by [reorg] extra=1.
    "go.cfg": 19 * 19 + 1,
    "go.test.cfg": 19 * 19 + 1,
    # Feature extractors: the last conv stage, 1x1x1024 and 7x7x512.
    "jnet-conv.cfg": 1024,
    "vgg-conv.cfg": 7 * 7 * 512,
}

# Strides of the detection heads, in cfg order.
HEAD_STRIDES = {
    "yolov3.cfg": (32, 16, 8),
    "yolov3-spp.cfg": (32, 16, 8),
    "yolov3-voc.cfg": (32, 16, 8),
    "yolov3-openimages.cfg": (32, 16, 8),
    "yolov3-tiny.cfg": (32, 16),
    "yolov2.cfg": (32,),
    "yolov2-voc.cfg": (32,),
    "yolov2-tiny.cfg": (32,),
    "yolov2-tiny-voc.cfg": (32,),
    "yolov1.cfg": (),
    "yolov1-tiny.cfg": (),
    "t1.test.cfg": (),
}


def _output_layer(net):
    return next(l for l in reversed(net.layers) if l.type != "cost")


@needs_stock
def test_every_stock_cfg_has_an_expected_shape():
    names = {p.name for p in STOCK_DIR.glob("*.cfg")}
    assert names == set(FINAL_OUTPUTS) | set(HEAD_STRIDES)


@needs_stock
@pytest.mark.parametrize("name,outputs", sorted(FINAL_OUTPUTS.items()))
def test_classifier_outputs(name, outputs):
    assert _output_layer(_build(STOCK_DIR / name)).outputs == outputs


@needs_stock
@pytest.mark.parametrize("name,strides", sorted(HEAD_STRIDES.items()))
def test_detector_heads(name, strides):
    """Each head's shape from its own section: yolo len(mask)*(classes+5) channels,
    region num*(classes+coords+1), detection side*side*((1+coords)*num+classes) values."""
    path = STOCK_DIR / name
    net = _build(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # _build has already reported on this cfg
        sections = parse_cfg(path)[1:]
    channels, size = net.options.channels, net.options.width
    heads = [
        (s, l) for s, l in zip(sections, net.layers) if l.type in ("yolo", "region", "detection")
    ]
    assert heads and channels == 3
    if heads[0][1].type == "detection":
        ((s, layer),) = heads
        side, coords, num = s.get_int("side"), s.get_int("coords"), s.get_int("num")
        assert layer.outputs == side * side * ((1 + coords) * num + s.get_int("classes"))
        return
    assert len(heads) == len(strides)
    for (s, layer), stride in zip(heads, strides):
        if layer.type == "yolo":
            depth = len(s.get_int_list("mask")) * (s.get_int("classes") + 5)
        else:
            depth = s.get_int("num") * (s.get_int("classes") + s.get_int("coords") + 1)
        assert (layer.out_w, layer.out_h, layer.out_c) == (size // stride, size // stride, depth)
