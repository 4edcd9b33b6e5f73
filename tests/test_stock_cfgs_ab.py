"""The AlexeyAB fork's stock cfg files (../shared/darknet-cfg-ab) build in the fork's
flavour with the fork's layer count and printed BFLOPs (the table in that folder's
README.md), or fail with one clear error where darknet-py does not support a layer."""
import re
import warnings
from pathlib import Path

import pytest

from darknet_py.cfg import CfgError
from darknet_py.network import build_network

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
    "yolo9000.cfg": ":217: tree: option is not supported by darknet-py",
}
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
def test_builds_with_the_forks_layers_and_bflops(name, layers, bflops):
    path = STOCK_DIR / name
    if name in UNSUPPORTED:
        with pytest.raises(CfgError) as e:
            build_network(path, darknet="alexeyab")
        assert str(e.value).startswith(str(path) + UNSUPPORTED[name])
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        net = build_network(path, darknet="alexeyab")
    unread = [str(w.message) for w in caught if "not used" in str(w.message)
              and not str(w.message).endswith(tuple(f"by {s} (a typo?)"
                                                    for s in OTHER_PART_SECTIONS))]
    assert not unread, "\n".join(unread)
    assert len(net.layers) == layers
    assert f"{net.bflops:.3f}" == bflops
    assert net.summary()[-1] == f"Total BFLOPs: {bflops}"


@needs_stock
def test_the_same_cfg_counts_differently_in_each_flavour():
    path = STOCK_DIR / "yolov3-tiny.cfg"   # byte-identical in both Darknets
    assert build_network(path).darknet == "original"
    assert f"{build_network(path).bflops:.3f}" == "5.565"   # Darknet publishes 5.56
    assert f"{build_network(path, darknet='alexeyab').bflops:.3f}" == "5.571"


@needs_stock
@pytest.mark.parametrize("name,flavour", [
    ("yolov4-tiny.cfg", "alexeyab"),      # [route] groups, [yolo] scale_x_y
    ("yolov4-sam-mish-csp-reorg-bfm.cfg", "alexeyab"),   # [sam], mish
    ("efficientnet_b0.cfg", "alexeyab"),  # [scale_channels], swish
    ("yolov3.cfg", "original"), ("darknet53.cfg", "original")])
def test_flavour_is_chosen_from_the_cfg(name, flavour):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert build_network(STOCK_DIR / name).darknet == flavour
