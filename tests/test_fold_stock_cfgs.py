"""Folded batch norm against Darknet's unfolded normalisation on every stock cfg (the
original's and the fork's): random weights and batch-norm statistics, a small input where
the network can be resized, every layer's output within the fixtures' tolerance."""

import os
import re
import warnings
from pathlib import Path

import numpy as np
import pytest

from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.network import Network

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
TOLERANCE = 1e-4  # relative, as tests/test_fixtures.py
SIZES = (32, 64, 128, 256)  # the first input size the network builds at
# Left out for time unless DARKNET_TEST_ALL_CFGS=1: networks with more parameters than
# this (copying them dominates) or more BFLOPs at the size they run (YOLOv1, which cannot
# be resized; the P6/P7 networks). All of them passed when this test was written.
EVERY_CFG = os.environ.get("DARKNET_TEST_ALL_CFGS", "") not in ("", "0")
MAX_WEIGHTS = float("inf") if EVERY_CFG else 25e6
MAX_BFLOPS = float("inf") if EVERY_CFG else 1.0


def _cfgs():
    files = [
        f for d in ("darknet-cfg", "darknet-cfg-ab") for f in sorted((SHARED / d).glob("*.cfg"))
    ]
    texts = {f.read_text() for f in files if f.parent.name == "darknet-cfg"}
    # The fork's folder repeats some of the original's files: each text once.
    files = [f for f in files if f.parent.name == "darknet-cfg" or f.read_text() not in texts]
    if not files:
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"no stock cfgs in {SHARED}"))]
    return [pytest.param(f, id=f"{f.parent.name}/{f.name}") for f in files]


def _network(text, path, size=None, allocate=False):
    if size is not None:
        text = re.sub(r"(?m)^\s*width\s*=\s*\d+", f"width={size}", text)
        text = re.sub(r"(?m)^\s*height\s*=\s*\d+", f"height={size}", text)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # random_init=False: the test writes cheaper random parameters itself.
        return Network(
            parse_cfg_text(text, str(path)),
            str(path),
            batch=1,
            allocate=allocate,
            random_init=False,
        )


def _randomize(net, rng):
    """Random parameters, cheaply: every array is a slice of one random pool, weights scaled
    by 1/sqrt(fan-in) so activations stay in range through deep networks."""
    pool = rng.standard_normal(1 << 20).astype(np.float32)
    for layer in net.layers:
        for name, arr in layer.params():
            start = int(rng.integers(0, pool.size))
            values = np.resize(np.roll(pool, -start), arr.size)
            if name == "weights":
                values = values * (1.0 / np.sqrt(max(1, arr.size // max(1, layer.out_c))))
            elif name == "rolling_variance":
                values = 0.5 + np.abs(values)
            elif name == "scales":
                values = 1.0 + 0.2 * values
            else:  # biases, rolling means
                values = 0.1 * values
            net.be.write(arr, values)
    net.params_changed()


@pytest.mark.parametrize("path", _cfgs())
def test_folded_inference_equals_unfolded(path):
    text = path.read_text()
    try:
        shapes = _network(text, path)
    except CfgError as e:
        pytest.skip(f"darknet-py refuses this cfg: {e}")
    if not any(getattr(layer, "batch_normalize", 0) for layer in shapes.layers):
        pytest.skip("no batch-normalised layer to fold")
    if sum(getattr(layer, "nweights", 0) for layer in shapes.layers) > MAX_WEIGHTS:
        pytest.skip("too many parameters for a quick test")
    size = None  # networks with connected or local layers run at their own size
    if not any(layer.type in ("connected", "local") for layer in shapes.layers):
        for size in SIZES:
            try:
                shapes = _network(text, path, size)
                break
            except CfgError:
                continue
    if shapes.bflops > MAX_BFLOPS:
        pytest.skip(f"{shapes.bflops:.1f} BFLOPs at its smallest size: too slow for a quick test")
    net = _network(text, path, size, allocate=True)
    rng = np.random.default_rng(1)
    _randomize(net, rng)
    x = rng.random((1,) + net.input_shape, dtype=np.float32)
    outputs = {}
    for fold in (True, False):
        net.fold_batchnorm = fold
        net.predict(x)
        outputs[fold] = [net.layer_output(i) for i in range(len(net.layers))]
    for i, (a, b) in enumerate(zip(outputs[True], outputs[False])):
        assert np.isfinite(b).all(), f"layer {i}: the unfolded output is not finite"
        scale = np.abs(b).max() or 1.0
        error = np.abs(a.astype(np.float64) - b).max() / scale
        assert error < TOLERANCE, f"layer {i} ({net.layers[i].type}): {error:.2e}"
