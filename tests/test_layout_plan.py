"""Issue 42: the layout plan (layout_plan.py) and the NHWC inference wiring
(layers/nhwc_forward.py).

The plan on yolov3-tiny's and yolov4-tiny's shapes (architectures.py): which outputs are
NHWC, their pitches, the [route] slices their writers fill in place, the NCHW copies at the
boundaries; and that with the option off (the default), in fp32/tf32, in training and
under DARKNET_NHWC on the NumPy backend every output stays NCHW as before.

The wiring runs on the NumPy backend with the NHWC references and a stand-in for the
convolution (conv_nhwc_forward, written by another change: here a float64 one, rounded
once), so every NHWC layer's output (layer_output: NCHW fp32) is checked against the NCHW
op on its inputs' outputs: bit for bit for the ops that move values, within a 16-bit step
for convolutions. predict's output is the head's.
"""

import numpy as np
import pytest

from darknet_py import precision as precisions
from darknet_py.architectures import cfg_text
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import parse_cfg_text
from darknet_py.layout_plan import ENV, plan_layouts
from darknet_py.net_options import NetworkError
from darknet_py.network import Network
from darknet_py.ops.nhwc.numpy import pixel_pitch, store_span

HALF = ("fp16", "bf16")


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    monkeypatch.delenv(ENV, raising=False)


def text(name, precision, size=416, batch=1):
    cfg = cfg_text(name, classes=80, size=size, batch=batch)
    return cfg.replace("[net]\n", f"[net]\nprecision={precision}\n", 1)


def shapes_only(name, precision):
    return Network(parse_cfg_text(text(name, precision)), batch=1, allocate=False)


def layouts(net, precision, train=False, fold=True, on=True):
    return plan_layouts(net.layers, net.output_index, precision, train, fold, on)


# =============================================================================
# The plan
# =============================================================================


@pytest.mark.parametrize("precision", HALF)
def test_yolov3_tiny_plan(precision):
    net = shapes_only("yolov3-tiny", precision)
    plan = layouts(net, precision)
    types = [l.type for l in net.layers]
    nchw = [i for i, p in enumerate(plan) if not p.nhwc]
    # the heads' convolutions run at fp32 (precision.assign), and the heads themselves
    assert nchw == [15, 16, 22, 23]
    assert [types[i] for i in nchw] == ["convolutional", "yolo"] * 2
    # 0 converts the image; 14 and 21 give the heads' convolutions an NCHW fp32 copy
    assert [i for i, p in enumerate(plan) if p.input_boundary] == [0]
    assert [i for i, p in enumerate(plan) if p.boundary] == [14, 21]
    # route 20 = [19 (upsample, 128), 8 (conv, 256)]: both written in place, 8 at 128 of
    # 384 (and still read by maxpool 9 from there)
    assert (plan[19].owner, plan[19].pitch, plan[19].offset) == (20, 384, 0)
    assert (plan[8].owner, plan[8].pitch, plan[8].offset) == (20, 384, 128)
    assert (plan[20].owner, plan[20].pitch, plan[20].offset) == (20, 384, 0)
    # route 17 views 13: its tensor, read by convolution 18 (dense: 13 keeps its own)
    assert (plan[17].owner, plan[17].pitch, plan[17].offset) == (13, 256, 0)
    assert (plan[13].owner, plan[13].offset) == (13, 0)
    for i in (0, 1, 2, 11, 12):
        assert (plan[i].owner, plan[i].offset) == (i, 0)
        assert plan[i].pitch == pixel_pitch(net.layers[i].out_c)


@pytest.mark.parametrize("precision", HALF)
def test_yolov4_tiny_plan(precision):
    net = shapes_only("yolov4-tiny", precision)
    plan = layouts(net, precision)
    assert [i for i, p in enumerate(plan) if not p.nhwc] == [29, 30, 36, 37]
    assert [i for i, p in enumerate(plan) if p.boundary] == [28, 35]
    placed = {i: (p.owner, p.offset) for i, p in enumerate(plan) if p.nhwc and p.owner != i}
    assert placed == {
        # route 8 = [2, 7]: 2 is also read by the grouped route 3 (a strided copy)
        2: (8, 0),
        7: (8, 64),
        # route 6 = [5, 4]: 4 is read by convolution 5, which needs it dense: copied
        5: (6, 0),
        10: (16, 0),
        15: (16, 128),
        13: (14, 0),
        18: (24, 0),
        23: (24, 256),
        21: (22, 0),
        # route 34 = [33, 23]: 23 lives in route 24 already, so 33 alone is in place
        33: (34, 0),
        # viewing routes are their input's tensor
        31: (27, 0),
    }
    assert plan[3].pitch == 32 and plan[3].owner == 3  # the grouped route's own copy
    assert plan[2].pitch == 128 and plan[34].pitch == 384


def test_a_slice_not_on_8_channels_is_copied_and_conv_readers_stay_dense():
    cfg = """[net]
precision=fp16
width=16
height=16
channels=3

[convolutional]
filters=12
size=3
pad=1
activation=leaky

[convolutional]
filters=5
size=1
activation=leaky

[maxpool]
size=2
stride=1

[route]
layers=-1,-3

[convolutional]
filters=8
size=1
activation=linear

[route]
layers=-1,-4

[convolutional]
filters=8
size=1
activation=linear
"""
    net = Network(parse_cfg_text(cfg), batch=1, allocate=False)
    plan = layouts(net, "fp16")
    assert all(p.nhwc for p in plan)
    # route 3 = [2 (maxpool, 5 channels) at 0, 0 (conv, 12) at 5]: 2's zeros up to 8
    # would cover 0's slice, and 5 is not on 8 channels: both copied
    assert plan[2].owner == 2 and plan[0].owner == 0 and plan[3].pitch == 24
    # route 5 = [4 (conv, 8) at 0, 1 (conv, 5) at 8]: 1 is the last slice (its zeros are
    # the route's padding) and its other reader, maxpool 2, reads it from there
    assert (plan[4].owner, plan[4].offset) == (5, 0)
    assert (plan[1].owner, plan[1].offset, plan[1].pitch) == (5, 8, 16)
    assert (plan[1].owner, plan[1].offset) != (1, 0)
    # swapped, [1 at 0, 4 at 5]: 1's 5 channels are not last, 4 starts off 8: copied
    net = Network(parse_cfg_text(cfg.replace("layers=-1,-4", "layers=-4,-1")), allocate=False)
    plan = layouts(net, "fp16")
    assert plan[1].owner == 1 and plan[4].owner == 4 and plan[5].owner == 5


def test_no_nhwc_unless_asked_for_16_bit_inference():
    for precision in ("fp32", "tf32"):
        net = shapes_only("yolov3-tiny", precision)
        assert not any(p.nhwc for p in layouts(net, precision))
    net = shapes_only("yolov3-tiny", "fp16")
    assert not any(p.nhwc for p in layouts(net, "fp16", on=False))
    assert not any(p.nhwc for p in layouts(net, "fp16", train=True))
    # unfolded batch norm: the convolutions stay NCHW, and so do the movers after them
    assert not any(p.nhwc for p in layouts(net, "fp16", fold=False))


def storages(net):
    return [l.output_precision for l in net.layers]


@pytest.mark.parametrize("precision", HALF)
def test_the_option_off_changes_nothing(precision, monkeypatch):
    """Off (the default), and DARKNET_NHWC on the NumPy backend: every layout NCHW, the
    same 16-bit output storage as output_storage.py's plan, the same outputs."""
    cfg = text("yolov3-tiny", precision, size=64, batch=2)
    x = np.random.default_rng(0).uniform(0, 1, (2, 3, 64, 64)).astype(np.float32)
    plain = Network(parse_cfg_text(cfg), batch=2, backend=NumpyBackend())
    set_statistics(plain, np.random.default_rng(1))
    assert not plain.nhwc
    plain.predict(x)
    want = [plain.layer_output(i) for i in (16, 23)]
    assert all(np.isfinite(w).all() for w in want)
    monkeypatch.setenv(ENV, "1")
    net = Network(parse_cfg_text(cfg), batch=2, backend=NumpyBackend())
    set_statistics(net, np.random.default_rng(1))
    assert not net.nhwc  # the environment asks the CUDA backend only
    assert all(not l.layout.nhwc for l in net.layers)
    assert storages(net) == storages(plain)
    assert "fp16" in storages(net) or "bf16" in storages(net)
    net.predict(x)
    # Within a few float32 ulps, not bit for bit: two such networks' fp32 head (layer 22,
    # a 255x32x256 product) differed by 4e-6 in about 1 run of 10 (2026-11-28; also with
    # OPENBLAS_NUM_THREADS=1; cause not found). A layout or storage change would move the
    # outputs by 16-bit roundings (1e-3).
    for got, w in zip([net.layer_output(i) for i in (16, 23)], want):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("value,wanted", [("1", True), ("on", True), ("0", False), ("", False)])
def test_the_environment_variable(monkeypatch, value, wanted):
    from darknet_py.layout_plan import nhwc_from_environment

    monkeypatch.setenv(ENV, value)
    assert nhwc_from_environment() is wanted
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(NetworkError, match=r"^DARKNET_NHWC=maybe: use 1 \(NHWC"):
        nhwc_from_environment()


class WithoutNhwcConvolution(NumpyBackend):
    conv_nhwc_forward = None  # as a backend before the NHWC convolution landed


def test_asking_a_backend_without_the_nhwc_convolution_is_refused_in_one_line():
    be = WithoutNhwcConvolution()
    net = Network(parse_cfg_text(text("yolov3-tiny", "fp16", size=64)), backend=be)
    with pytest.raises(NetworkError, match=r"^NHWC layer outputs .* the cpu backend does not"):
        net.nhwc = True
    assert not net.nhwc  # refused: left as it was
    fp32 = Network(parse_cfg_text(text("yolov3-tiny", "fp32", size=64)), backend=be)
    fp32.nhwc = True  # nothing to keep at 16 bits: nothing asked of the backend
    assert all(not l.layout.nhwc for l in fp32.layers)


# =============================================================================
# The wiring, on NumPy with a stand-in convolution
# =============================================================================


def conv_nhwc_forward(
    self,
    precision,
    x,
    batch,
    h,
    w,
    cx,
    weights,
    cout,
    ksize,
    stride,
    pad,
    out,
    out_pitch,
    out_offset,
    bias=None,
    activation="linear",
    stats=None,
):
    """A float64 NHWC convolution with the agreed signature, rounded once at the store."""
    assert stats is None
    assert self.storage_of(x) == self.storage_of(weights) == self.storage_of(out) == precision
    out_h = (h + 2 * pad - ksize) // stride + 1
    out_w = (w + 2 * pad - ksize) // stride + 1
    xs = np.asarray(x[: batch * h * w * cx], np.float64).reshape(batch, h, w, cx)
    padded = np.pad(xs, ((0, 0), (pad, pad), (pad, pad), (0, 0)))
    ws = np.asarray(weights, np.float64).reshape(cout, ksize, ksize, cx)
    acc = np.zeros((batch, out_h, out_w, cout))
    for dy in range(ksize):
        for dx in range(ksize):
            patch = padded[:, dy : dy + stride * out_h : stride, dx : dx + stride * out_w : stride]
            acc += patch @ ws[:, dy, dx, :].T
    if bias is not None:
        acc += np.asarray(bias[:cout], np.float64)
    value = acc.astype(np.float32).reshape(-1)
    self.activate(value, activation)
    pixels = out[: batch * out_h * out_w * out_pitch].reshape(batch, out_h, out_w, out_pitch)
    store_span(pixels, out_offset, value.reshape(batch, out_h, out_w, cout), precision)


class NhwcNumpy(NumpyBackend):
    conv_nhwc_forward = conv_nhwc_forward


def reference_conv(layer, be, x):
    """The convolution of NCHW x (float64) with the layer's inference weights, rounded to
    its 16 bits as conv_nhwc_forward stores."""
    weights, biases = layer.inference_params(be)
    k, c, f, s, p = layer.size, layer.c, layer.filters, layer.stride, layer.padding
    w = precisions.round_to(np.asarray(weights[: f * c * k * k]), layer.precision)
    w = w.astype(np.float64).reshape(f, c, k, k)
    xs = precisions.round_to(x, layer.precision).astype(np.float64)
    padded = np.pad(xs, ((0, 0), (0, 0), (p, p), (p, p)))
    acc = np.zeros((x.shape[0], f, layer.out_h, layer.out_w))
    for dy in range(k):
        for dx in range(k):
            patch = padded[
                :, :, dy : dy + s * layer.out_h : s, dx : dx + s * layer.out_w : s
            ]  # b, c, oh, ow
            acc += np.einsum("bchw,fc->bfhw", patch, w[:, :, dy, dx])
    acc += np.asarray(biases[:f], np.float64)[None, :, None, None]
    value = acc.astype(np.float32).reshape(-1)
    be.activate(value, layer.activation)
    return precisions.round_to(value, layer.precision).reshape(acc.shape)


def within_a_step(got, want, precision):
    bits = 10 if precision == "fp16" else 7
    v = np.maximum(np.abs(got), np.abs(want)).astype(np.float64)
    step = np.maximum(2.0 ** (np.floor(np.log2(np.where(v > 0, v, 1.0))) - bits), 2.0**-24)
    return np.all(np.abs(got.astype(np.float64) - want) <= step)


def expected_mover(net, layer, inputs):
    """The NCHW op of a [route]/[maxpool]/[upsample]/[shortcut] on its inputs' outputs
    (fp32 NCHW host arrays), in float32 and rounded once to the 16 bits."""
    be, batch, p = net.be, net.batch, net.precision
    if layer.type == "route":
        parts = []
        for src, value in zip(layer.sources, inputs):
            part = src.out_c // layer.groups
            parts.append(value[:, layer.group_id * part : (layer.group_id + 1) * part])
        return np.concatenate(parts, axis=1)
    x = inputs[0]
    if layer.type == "maxpool":
        out = np.zeros(batch * layer.outputs, np.float32)
        be.maxpool_forward_xy(
            x.reshape(-1),
            batch,
            layer.c,
            layer.h,
            layer.w,
            layer.size,
            layer.stride_x,
            layer.stride_y,
            layer.padding,
            out,
            None,
        )
        return out.reshape(batch, layer.out_c, layer.out_h, layer.out_w)
    if layer.type == "upsample":
        out = np.zeros(batch * layer.outputs, np.float32)
        be.upsample(
            x.reshape(-1), layer.w, layer.h, layer.c, batch, layer.stride, True, layer.scale, out
        )
        return precisions.round_to(out, p).reshape(batch, layer.out_c, layer.out_h, layer.out_w)
    if layer.type == "shortcut":  # Darknet's sum in fp32 (the fork: rounded after each)
        value = x.astype(np.float32).copy()
        fork = layer.darknet == "alexeyab"
        s1, s2 = (1.0, 1.0) if fork else (layer.alpha, layer.beta)
        for k, (src, add) in enumerate(zip(layer.sources, inputs[1:])):
            common = min(layer.c, src.out_c)
            value[:, :common] = s1 * value[:, :common] + s2 * add[:, :common]
            if k == len(layer.sources) - 1:
                flat = value.reshape(-1)
                be.activate(flat, layer.activation)
                value = flat.reshape(value.shape)
            value = precisions.round_to(value, p).reshape(value.shape)
        return value
    raise AssertionError(layer.type)


def set_statistics(net, rng):
    """Batch norm statistics of a trained network's scale (a fresh network's rolling
    variance of 0 would blow the folded weights past fp16's range)."""
    for layer in net.layers:
        if getattr(layer, "batch_normalize", 0):
            for attr, lo, hi in (
                ("rolling_mean", -0.2, 0.2),
                ("rolling_variance", 0.5, 1.5),
                ("scales", 0.5, 1.5),
            ):
                getattr(layer, attr)[...] = rng.uniform(lo, hi, layer.filters)
    net.params_changed()


def run_nhwc(name, precision, size=64, batch=2, darknet=None):
    """A network (architectures.py's `name`, or a cfg text) on NumPy with NHWC outputs,
    batch norm statistics of a trained network's scale, after predict on random images."""
    if name in ("yolov3-tiny", "yolov4-tiny"):
        cfg = text(name, precision, size=size, batch=batch)
    else:
        cfg = name.replace("[net]\n", f"[net]\nprecision={precision}\n", 1)
    net = Network(parse_cfg_text(cfg), batch=batch, backend=NhwcNumpy(), seed=3, darknet=darknet)
    net.nhwc = True
    rng = np.random.default_rng(1)
    set_statistics(net, rng)
    x = rng.uniform(0, 1, (batch, 3, size, size)).astype(np.float32)
    output = net.predict(x)
    return net, x, output


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("name", ["yolov3-tiny", "yolov4-tiny"])
def test_nhwc_inference_layer_by_layer(name, precision):
    net, x, output = run_nhwc(name, precision)
    assert net.nhwc
    check_layer_by_layer(net, x, output, precision)
    head_input = [l for l in net.layers if l.type == "yolo"][0].index - 2
    assert net.layers[head_input].layout.boundary
    assert net.layers[head_input].output.dtype == np.float32


def check_layer_by_layer(net, x, output, precision):
    """Every NHWC layer's output (layer_output: NCHW fp32) against the NCHW op on its
    inputs' outputs; predict's output is the output layer's."""
    assert np.isfinite(output).all()
    outs = {}
    for layer in net.layers:
        i = layer.index
        outs[i] = net.layer_output(i)
        assert outs[i].dtype == np.float32
        assert outs[i].shape == (net.batch, layer.out_c, layer.out_h, layer.out_w)
        if not layer.layout.nhwc:
            continue
        assert net.be.storage_of(layer.nhwc_output) == precision
        previous = outs[i - 1] if i else x
        if layer.type == "convolutional":
            want = reference_conv(layer, net.be, previous)
            assert within_a_step(outs[i], want, precision), f"layer {i}"
        elif layer.type == "route":
            want = expected_mover(net, layer, [outs[s.index] for s in layer.sources])
            assert np.array_equal(outs[i], want), f"layer {i} [route]"
        elif layer.type == "shortcut":
            adds = [outs[s.index] for s in layer.sources]
            want = expected_mover(net, layer, [previous] + adds)
            assert np.array_equal(outs[i], want), f"layer {i} [shortcut]"
        else:
            want = expected_mover(net, layer, [previous])
            assert np.array_equal(outs[i], want), f"layer {i} [{layer.type}]"
    assert np.array_equal(output, outs[net.output_index])


MOVERS = """[net]
width=32
height=32
channels=3

[convolutional]
batch_normalize=1
filters=16
size=3
pad=1
activation=leaky

[convolutional]
batch_normalize=1
filters=16
size=3
pad=1
activation=mish

[shortcut]
from=-2
activation=linear

[maxpool]
size=5
stride=1

[route]
layers=-2

[maxpool]
size=9
stride=1

[route]
layers=-1,-3,-4

[convolutional]
filters=8
size=1
activation=linear

[shortcut]
from=-6
activation=leaky

[upsample]
stride=2

[convolutional]
batch_normalize=1
filters=24
size=3
stride=2
pad=1
activation=leaky

[route]
layers=-1,-3
groups=2
group_id=1

[convolutional]
filters=8
size=1
activation=linear
"""


@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("darknet", ["original", "alexeyab"])
def test_nhwc_movers_layer_by_layer(precision, darknet):
    """Shortcuts (of different channel counts, with an activation; the fork's of two
    inputs), SPP's maxpools written in place into their route and read from there, a
    grouped route, an upsample, the output layer's NCHW copy."""
    cfg = MOVERS
    if darknet == "alexeyab":
        cfg = cfg.replace("from=-6\nactivation=leaky", "from=-6,-2\nactivation=leaky")
    net, x, output = run_nhwc(cfg, precision, size=32, darknet=darknet)
    plan = [l.layout for l in net.layers]
    assert all(p.nhwc for p in plan)
    assert [(plan[i].owner, plan[i].offset) for i in (5, 3, 2)] == [(6, 0), (6, 16), (6, 32)]
    assert plan[6].pitch == 48 and plan[12].boundary
    assert len(net.layers[8].sources) == (2 if darknet == "alexeyab" else 1)
    check_layer_by_layer(net, x, output, precision)


BOUNDARIES = """[net]
width=32
height=32
channels=3

[convolutional]
batch_normalize=1
filters=16
size=3
pad=1
activation=leaky

[reorg]
stride=2

[convolutional]
batch_normalize=1
filters=24
size=3
pad=1
activation=leaky

[route]
layers=-1,-2

[convolutional]
filters=8
size=1
activation=linear
"""


@pytest.mark.parametrize("precision", HALF)
def test_a_layer_without_nhwc_op_in_the_middle(precision):
    """[reorg] has no NHWC op: the convolution before it gives it an NCHW fp32 copy, the
    one after converts its NCHW input, and a [route] of the two stays NCHW (the
    convolution's NCHW copy)."""
    net, x, output = run_nhwc(BOUNDARIES, precision, size=32)
    plan = [l.layout for l in net.layers]
    assert [p.nhwc for p in plan] == [True, False, True, False, True]
    assert plan[0].boundary and plan[2].boundary and plan[4].boundary  # 4: the output
    assert [p.input_boundary for p in plan] == [True, False, True, False, True]
    assert net.layers[0].output.dtype == np.float32
    check_layer_by_layer(net, x, output, precision)


@pytest.mark.parametrize("precision", HALF)
def test_route_slices_are_written_in_place(precision):
    net, _, _ = run_nhwc("yolov3-tiny", precision)
    route = net.layers[20]
    assert net.layers[8].nhwc_output is route.nhwc_output
    assert net.layers[19].nhwc_output is route.nhwc_output
    # the route copied nothing: its array already holds 19's and 8's values
    calls = []
    original = net.be.nhwc_copy_channels
    net.be.nhwc_copy_channels = lambda *a: calls.append(a) or original(*a)
    net.predict(np.zeros((2, 3, 64, 64), np.float32))
    del net.be.nhwc_copy_channels
    assert calls == []
    # the other way round: after disabling NHWC the layouts are NCHW again
    net.nhwc = False
    assert all(not l.layout.nhwc for l in net.layers)


@pytest.mark.parametrize("precision", HALF)
def test_nhwc_outputs_close_to_the_nchw_16_bit_network(precision):
    """The same network with the option off (16-bit NCHW outputs where output_storage.py
    allows): the heads' outputs agree within the 16-bit rounding the NHWC path adds (the
    heads' inputs rounded to 16 bits)."""
    net, x, output = run_nhwc("yolov3-tiny", precision)
    net.nhwc = False
    want = net.predict(x)
    assert output.shape == want.shape
    tolerance = 1e-2 if precision == "fp16" else 6e-2
    error = np.max(np.abs(output - want)) / max(1.0, np.max(np.abs(want)))
    assert error < tolerance


def photos(rng, count):
    return [
        rng.integers(0, 256, (int(rng.integers(30, 90)), int(rng.integers(30, 90)), 3), np.uint8)
        for _ in range(count)
    ]


@pytest.mark.parametrize("precision", HALF)
def test_photos_are_letterboxed_into_the_nhwc_input(precision):
    """predict on photos letterboxes them straight into the first convolution's NHWC
    input (no fp32 image, no conversion): the same outputs as predict on the letterboxed
    float images."""
    from darknet_py.image import from_bgr, letterbox

    net, _, _ = run_nhwc("yolov3-tiny", precision, batch=3)
    shots = photos(np.random.default_rng(4), 3)
    calls = []
    for op in ("letterbox_images", "letterbox_images_nhwc"):
        original = getattr(net.be, op)
        setattr(net.be, op, lambda *a, op=op, original=original: calls.append(op) or original(*a))
    got = net.predict(shots)
    assert calls == ["letterbox_images_nhwc"]
    assert net.layers[0].nhwc_input_ready is False  # served once
    del net.be.letterbox_images, net.be.letterbox_images_nhwc
    images = np.stack([letterbox(from_bgr(p, 3), 64, 64) for p in shots])
    want = net.predict(images)
    assert np.array_equal(got, want)


# =============================================================================
# GPU: the wiring on CUDA against the NumPy run
# =============================================================================


def cuda_stand_in(cuda):
    """The CUDA backend with conv_nhwc_forward standing in as conv_nhwc_forward above on
    the host (the NHWC convolution is another change's): every other op on the device."""

    def host_conv(precision, x, batch, h, w, cx, weights, cout, ksize, stride, pad, out,
                  out_pitch, out_offset, bias=None, activation="linear", stats=None):  # fmt: skip
        ref = NhwcNumpy()
        hx, hw, ho = (ref.storage_zeros(a.size, precision) for a in (x, weights, out))
        hx[...], hw[...] = cuda.to_host(x), cuda.to_host(weights)
        ho[...] = cuda.to_host(out)
        hb = None if bias is None else cuda.to_host(bias)
        ref.conv_nhwc_forward(precision, hx, batch, h, w, cx, hw, cout, ksize, stride, pad,
                              ho, out_pitch, out_offset, hb, activation, stats)  # fmt: skip
        cuda.copy_rounded(cuda.from_host(np.asarray(ho, np.float32)), out, precision)

    cuda.conv_nhwc_forward = host_conv
    return cuda


@pytest.mark.gpu
@pytest.mark.parametrize("precision", HALF)
@pytest.mark.parametrize("name", ["yolov3-tiny", "yolov4-tiny"])
def test_cuda_nhwc_inference_matches_numpy(cuda, name, precision):
    want_net, x, want = run_nhwc(name, precision)
    be = cuda_stand_in(cuda)
    try:
        net = Network(parse_cfg_text(text(name, precision, size=64, batch=2)), batch=2,
                      backend=be, seed=3)  # fmt: skip
        net.graphs.enabled = False  # the stand-in reads the device
        for mine, theirs in zip(net.layers, want_net.layers):  # the NumPy run's parameters
            if mine.type != "convolutional":
                continue
            for attr in ("weights", "biases", "scales", "rolling_mean", "rolling_variance"):
                if getattr(theirs, attr, None) is not None:
                    be.write(getattr(mine, attr), np.asarray(getattr(theirs, attr)))
        net.params_changed()
        net.nhwc = True
        got = net.predict(x)
        for layer in net.layers:
            g, w = net.layer_output(layer.index), want_net.layer_output(layer.index)
            if layer.layout.nhwc:  # 16-bit values moved, or the same host convolution
                assert np.array_equal(g, w), f"layer {layer.index} [{layer.type}]"
            else:  # fp32 heads: CUDA's fp32 convolution against NumPy's
                assert np.max(np.abs(g - w)) <= 1e-4 * max(1.0, np.max(np.abs(w))), layer.index
        assert np.max(np.abs(got - want)) <= 1e-4 * max(1.0, np.max(np.abs(want)))
        # photos letterboxed on the device straight into the NHWC input
        shots = photos(np.random.default_rng(4), 2)
        from darknet_py.image import from_bgr, letterbox

        images = np.stack([letterbox(from_bgr(p, 3), 64, 64) for p in shots])
        assert np.array_equal(net.predict(shots), net.predict(images))
    finally:
        del cuda.conv_nhwc_forward


class PackingNumpy(NhwcNumpy):
    """A backend with the agreed pack_nhwc_weights, the packing counted."""

    packed = 0

    def pack_nhwc_weights(self, weights, cout, c, ksize, cx, precision):
        PackingNumpy.packed += 1
        w = np.asarray(weights[: cout * c * ksize * ksize], np.float32)
        out = np.zeros((cout, ksize, ksize, cx), np.float32)
        out[..., :c] = w.reshape(cout, c, ksize, ksize).transpose(0, 2, 3, 1)
        array = self.storage_zeros(out.size, precision)
        array[...] = precisions.round_to(out.reshape(-1), precision)
        return array


def test_the_backends_weight_packing_is_used_once():
    cfg = MOVERS.replace("[net]\n", "[net]\nprecision=fp16\n", 1)
    net = Network(parse_cfg_text(cfg), batch=1, backend=PackingNumpy(), seed=3)
    set_statistics(net, np.random.default_rng(1))
    net.nhwc = True
    x = np.random.default_rng(2).uniform(0, 1, (1, 3, 32, 32)).astype(np.float32)
    PackingNumpy.packed = 0
    net.predict(x)
    convolutions = sum(l.type == "convolutional" for l in net.layers)
    assert PackingNumpy.packed == convolutions
    net.predict(x)
    assert PackingNumpy.packed == convolutions  # cached
    net.params_changed()
    net.predict(x)
    assert PackingNumpy.packed == 2 * convolutions  # made again from the new weights
    check_layer_by_layer(net, x, net.layer_output(net.output_index), "fp16")


def test_a_bad_value_is_refused_on_the_cpu_too(monkeypatch):
    """DARKNET_NHWC asks the GPU's backend alone, but a value it cannot read is refused
    wherever the network runs (never ignored)."""
    monkeypatch.setenv(ENV, "maybe")
    with pytest.raises(NetworkError, match=r"^DARKNET_NHWC=maybe: use 1 \(NHWC"):
        net = Network(parse_cfg_text(text("yolov3-tiny", "fp16", size=64)), backend=NumpyBackend())
        net.predict(np.zeros((1, 3, 64, 64), np.float32))
