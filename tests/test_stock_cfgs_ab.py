"""The AlexeyAB fork's stock cfg files (../shared/darknet-cfg-ab) build in the fork's
flavour with the fork's layer count and printed BFLOPs (the table in that folder's
README.md), or fail with one clear error where darknet-py does not support a layer."""

import re
import warnings
from pathlib import Path

import numpy as np
import pytest
from helpers import random_batch_norm, write_synthetic_tree

from darknet_py.cfg import CfgError
from darknet_py.network import build_network, load_network
from darknet_py.predictions import get_network_boxes

REPO = Path(__file__).resolve().parents[1]
STOCK_DIR = REPO.parent / "shared" / "darknet-cfg-ab"


def _table():
    readme = STOCK_DIR / "README.md"
    rows = {}
    if readme.is_file():
        for line in readme.read_text().splitlines():
            m = re.match(r"\| `(.+?\.cfg)` \| (\d+) \| ([\d.]+) \|", line)
            if m:
                rows[m[1]] = (int(m[2]), m[3])
    return rows


TABLE = _table()
needs_stock = pytest.mark.skipif(not TABLE, reason=f"the fork's stock cfgs are not at {STOCK_DIR}")

# Refused, with this error (file:line: key: message).
UNSUPPORTED = {
    "yolov4-tiny_contrastive.cfg": ":447: section [contrastive] is a Darknet layer darknet-py "
    "does not support",
}
# Cfgs that read files beside them: built in a folder holding stand-ins of those files.
NEEDS_FILES = {"yolo9000.cfg": 9418}  # data/9k.tree (9418 classes) and data/coco9k.map
# Options the fork reads (or, for [yolo], the stock cfgs set) that [net] and [yolo] do not
# read here yet: warned about, which this test leaves to those sections.
OTHER_PART_SECTIONS = ("[net]", "[yolo]")


def _params():
    if not TABLE:
        return [pytest.param(None, None, None, marks=pytest.mark.skip(reason="no table"))]
    out = []
    for name, (layers, bflops) in sorted(TABLE.items()):
        out.append(pytest.param(name, layers, bflops, id=name))
    return out


@needs_stock
def test_every_stock_cfg_is_in_the_table():
    assert {p.name for p in STOCK_DIR.glob("*.cfg")} == set(TABLE)
    assert set(UNSUPPORTED) <= set(TABLE)


@needs_stock
@pytest.mark.parametrize("name,layers,bflops", _params())
def test_builds_with_the_forks_layers_and_bflops(name, layers, bflops, tmp_path, monkeypatch):
    path = STOCK_DIR / name
    if name in NEEDS_FILES:
        stand_in_data_files(tmp_path, NEEDS_FILES[name])
        monkeypatch.chdir(tmp_path)
    if name in UNSUPPORTED:
        with pytest.raises(CfgError) as e:
            build_network(path, darknet="alexeyab")
        assert str(e.value).startswith(str(path) + UNSUPPORTED[name])
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = build_network(path, darknet="alexeyab")
    unread = [
        str(w.message)
        for w in caught
        if "not used" in str(w.message)
        and not str(w.message).endswith(tuple(f"by {s} (a typo?)" for s in OTHER_PART_SECTIONS))
    ]
    assert not unread, "\n".join(unread)
    assert len(net.layers) == layers
    assert f"{net.bflops:.3f}" == bflops
    assert net.summary()[-1] == f"Total BFLOPs: {bflops}"


def stand_in_data_files(root, classes):
    """Darknet's data/9k.tree and data/coco9k.map as yolo9000.cfg names them, made up."""
    (root / "data").mkdir()
    write_synthetic_tree(root / "data" / "9k.tree", classes)
    ids = np.random.default_rng(1).choice(classes, 80, replace=False)
    (root / "data" / "coco9k.map").write_text("".join(f"{i}\n" for i in ids))


@needs_stock
def test_yolo9000_runs_and_detects_down_its_tree(tmp_path, monkeypatch):
    """yolo9000.cfg (a [region] with a 9418-class softmax tree) at 64x64: forward, and
    each detection's one class found by walking the tree (get_region_detections)."""
    stand_in_data_files(tmp_path, 9418)
    monkeypatch.chdir(tmp_path)
    text = (STOCK_DIR / "yolo9000.cfg").read_text()
    text = re.sub(r"(?m)^(width|height)\s*=\s*\d+", r"\1=64", text)
    cfg = tmp_path / "yolo9000.cfg"
    cfg.write_text(text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = load_network(cfg, device="cpu", batch=1)
    random_batch_norm(net, np.random.default_rng(2))
    net.params_changed()
    region = net.layers[-1]
    assert region.type == "region" and region.hierarchy.n == 9418
    net.predict(np.random.default_rng(0).random((1, 3, 64, 64), dtype=np.float32))
    hier = region.hierarchy
    for tree_thresh, kind in ((0.0, "leaf"), (0.999, "root")):
        # a walk that never stops ends at a leaf; one that cannot start picks a root
        dets = get_network_boxes(net, 640, 480, thresh=0.0, hier=tree_thresh)
        assert len(dets) == 2 * 2 * 3
        for d in dets:
            best = int(np.argmax(d.probs))
            assert np.isfinite(d.box).all() and 0 < d.objectness < 1
            assert np.count_nonzero(d.probs) == 1 and d.probs[best] == np.float32(d.objectness)
            assert hier.leaf[best] if kind == "leaf" else hier.parent[best] == -1


@needs_stock
def test_the_same_cfg_counts_differently_in_each_flavour():
    path = STOCK_DIR / "yolov3-tiny.cfg"  # byte-identical in both Darknets
    assert build_network(path).darknet == "original"
    assert f"{build_network(path).bflops:.3f}" == "5.565"  # Darknet publishes 5.56
    assert f"{build_network(path, darknet='alexeyab').bflops:.3f}" == "5.571"


@needs_stock
@pytest.mark.parametrize(
    "name,flavour",
    [
        ("yolov4-tiny.cfg", "alexeyab"),  # [route] groups, [yolo] scale_x_y
        ("yolov4-sam-mish-csp-reorg-bfm.cfg", "alexeyab"),  # [sam], mish
        ("efficientnet_b0.cfg", "alexeyab"),  # [scale_channels], swish
        ("yolov3.cfg", "original"),
        ("darknet53.cfg", "original"),
    ],
)
def test_flavour_is_chosen_from_the_cfg(name, flavour):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert build_network(STOCK_DIR / name).darknet == flavour
