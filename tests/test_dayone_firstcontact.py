"""First contact (issue 28): map on a validation set without labels, map's progress line,
check's box totals, a cut-off .weights download, calc_anchors' anchors.txt, the API's truth
shapes and an unreadable valid list, and the README's CPU-sized training example."""
import re

import numpy as np
import pytest

from darknet_py import load_network
from helpers import digit_set, untrained_detector
from test_cli import run_in_process

WEIGHTS_HEADER = 20   # 0.2.0: three int32 and a 64-bit seen


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
        tmp_path, detector, size):
    """Cut mid-float or on a float: either way the line says 'cut-off download' with the
    size found and the size this cfg's weights have, as well as the cfg question."""
    cfg, weights = detector
    expected = len(open(weights, "rb").read())
    short = cut(weights, tmp_path, size)
    r = run_in_process(["detect", cfg, short, "--device", "cpu", "--out", "none",
                        tmp_path / "none.png"])
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
    with pytest.raises(WeightsError, match=r"does not end on a layer boundary .*: a cut-off "
                                           r"download \(the file is 60 bytes where this cfg's "
                                           r"weights are [\d,]+\), or weights of another cfg"):
        load_weights(load_network(cfg), short, allow_partial=True)
