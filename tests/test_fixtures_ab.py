"""The AlexeyAB C Darknet's own numbers (../shared/fixtures-ab, see its README.md): every
layer of a yolov4-tiny at 160x160 with seeded weights, run on the CPU in the fork's
flavour (chosen from the cfg: [route] groups and [yolo] scale_x_y are fork-only)."""

from pathlib import Path

import numpy as np
import pytest

import darknet_py

FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures-ab"
TOLERANCE = 1e-4  # relative: max|a - r| / max|r|
NAME = "a1_yolov4tiny"
# The yolo heads apply scale_x_y, the [yolo] option another part of issue 12 adds.
NEEDS_SCALE_X_Y = {30, 37}

pytestmark = pytest.mark.skipif(
    not (FIXTURES / NAME / f"{NAME}.npz").is_file(),
    reason=f"AlexeyAB reference fixtures not found at {FIXTURES}",
)


def rel_error(actual, ref):
    actual = np.asarray(actual, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert actual.shape == ref.shape, f"shape {actual.shape} != the fork's {ref.shape}"
    return float(np.abs(actual - ref).max() / max(1e-6, np.abs(ref).max()))


# The flavour from the cfg (the fork trained as its GPU build does) and the fork's CPU-build
# rules: the forward is the same in both.
@pytest.fixture(scope="module", params=[None, "alexeyab-cpu"])
def run(request):
    d = FIXTURES / NAME
    ref = np.load(d / f"{NAME}.npz")
    with _no_check():
        net = darknet_py.load_network(
            d / f"{NAME}.cfg",
            d / f"{NAME}.weights",
            device="cpu",
            darknet=request.param,
            engine="numpy",
        )
    net.predict(ref["input"])
    return net, ref


class _no_check:
    def __enter__(self):
        import warnings

        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore")  # the yolo options not read yet

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def test_flavour_and_structure(run):
    net, ref = run
    assert net.darknet == "alexeyab"
    assert (net.truth_size, net.max_boxes) == (6, 200)
    assert len(net.layers) == len(ref["layer_types"]) == 38
    for i, layer in enumerate(net.layers):
        name = layer.section.header if layer.type == "upsample" else layer.type
        assert name == ref["layer_types"][i], i
        assert (layer.out_c, layer.out_h, layer.out_w) == tuple(ref["layer_shapes"][i]), i
        assert layer.outputs == ref["layer_outputs"][i], i


@pytest.mark.parametrize("index", range(38))
def test_layer_matches_the_fork(run, index):
    net, ref = run
    err = rel_error(net.layer_output(index), ref[f"layer_{index}"])
    assert err < TOLERANCE, f"layer {index} ({net.layers[index].type}): {err:.3g}"
