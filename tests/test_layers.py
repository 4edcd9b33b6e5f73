"""Forward passes of [connected], [dropout], [cost], [shortcut], [reorg], [crop] and
[local] against loop transcriptions of Darknet's C code, their layer-table rows
against Darknet's printf formats, and cfg errors that name the offending key."""

import math

import numpy as np
import pytest

from darknet_py import activations
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import CfgError, parse_cfg_text
from darknet_py.draws import uniform_hash
from darknet_py.network import Network


def build(body, width, height, channels, batch=2, seed=0):
    text = f"[net]\nbatch={batch}\nwidth={width}\nheight={height}\nchannels={channels}\n\n" + body
    return Network(parse_cfg_text(text), backend=NumpyBackend(dtype=np.float64), seed=seed)


def random_input(net, seed=1, low=-1.0, high=1.0):
    # float32-representable, since Network.forward uploads through float32
    rng = np.random.default_rng(seed)
    x = rng.uniform(low, high, (net.batch,) + net.input_shape)
    return x.astype(np.float32).astype(np.float64)


def randomize(arr, seed, low=-1.0, high=1.0):
    arr[...] = np.random.default_rng(seed).uniform(low, high, arr.size)


def row(net, i):
    layer = net.layers[i]
    return f"{getattr(layer, 'short', layer.type):<6s}{layer.describe()}"


# ---- [connected] ---------------------------------------------------------------------------------
def connected_reference(x, weights, biases, act):
    batch, inputs = x.shape
    outputs = biases.size
    w = weights.reshape(outputs, inputs)
    out = np.zeros((batch, outputs))
    for b in range(batch):
        for o in range(outputs):
            out[b, o] = sum(x[b, i] * w[o, i] for i in range(inputs)) + biases[o]
    return activations.activate(out, act)


def test_connected_forward_and_params():
    net = build("[connected]\noutput=4\nactivation=leaky\n", 3, 2, 2, batch=3)
    layer = net.layers[0]
    assert (layer.out_c, layer.out_h, layer.out_w, layer.outputs) == (4, 1, 1, 4)
    # Darknet's initialisation: uniform in +-sqrt(2/inputs), zero biases.
    bound = math.sqrt(2.0 / 12)
    assert np.abs(layer.weights).max() <= bound and np.abs(layer.weights).max() > bound / 2
    assert not layer.biases.any()
    assert [n for n, _ in layer.params()] == ["biases", "weights"]
    randomize(layer.biases, 2)
    x = random_input(net)
    out = net.predict(x)
    ref = connected_reference(x.reshape(3, -1), layer.weights, layer.biases, "leaky")
    np.testing.assert_allclose(out.reshape(3, 4), ref, rtol=1e-12, atol=1e-12)
    assert layer.bflops == 2.0 * 12 * 4 / 1e9


def test_connected_batch_normalize_forward():
    net = build("[connected]\noutput=3\nbatch_normalize=1\nactivation=linear\n", 2, 2, 1, batch=4)
    layer = net.layers[0]
    assert [n for n, _ in layer.params()] == [
        "biases",
        "weights",
        "scales",
        "rolling_mean",
        "rolling_variance",
    ]
    randomize(layer.biases, 3)
    randomize(layer.scales, 4, 0.5, 1.5)
    randomize(layer.rolling_mean, 5)
    randomize(layer.rolling_variance, 6, 0.5, 2.0)
    rolling = (layer.rolling_mean.copy(), layer.rolling_variance.copy())
    x = random_input(net)
    raw = connected_reference(x.reshape(4, -1), layer.weights, np.zeros(3), "linear")
    # Inference: Darknet's normalize_cpu with the rolling statistics.
    out = net.predict(x).reshape(4, 3)
    ref = (raw - rolling[0]) / (np.sqrt(rolling[1]) + 1e-6) * layer.scales + layer.biases
    np.testing.assert_allclose(out, ref, rtol=1e-10)
    # Training: batch mean, unbiased variance, rolling averages moved by 1%.
    net.forward(x, train=True)
    mean, var = raw.mean(axis=0), raw.var(axis=0, ddof=1)
    ref = (raw - mean) / (np.sqrt(var) + 1e-6) * layer.scales + layer.biases
    np.testing.assert_allclose(net.layer_output(0).reshape(4, 3), ref, rtol=1e-10)
    np.testing.assert_allclose(layer.rolling_mean, 0.99 * rolling[0] + 0.01 * mean, rtol=1e-12)
    np.testing.assert_allclose(layer.rolling_variance, 0.99 * rolling[1] + 0.01 * var, rtol=1e-12)


# ---- [dropout] -----------------------------------------------------------------------------------
def test_dropout_inference_copies_and_training_drops_with_a_fresh_mask_per_step():
    net = build("[dropout]\nprobability=0.3\n", 8, 8, 4)
    layer = net.layers[0]
    assert layer.scale == 1 / 0.7
    x = random_input(net)
    np.testing.assert_array_equal(net.predict(x), x)
    net.forward(x, train=True)
    # The seed: the step's part on the backend, the layer's own part added.
    step_seed = int(net.be.to_host(net.step_seed)[0])
    assert step_seed == net.seen * 1000003 + net.seed * 104729
    rand = uniform_hash(step_seed + layer.mask_seed(), x.size)
    expected = np.where(rand < 0.3, 0.0, x.reshape(-1) * (1 / 0.7))
    np.testing.assert_allclose(net.layer_output(0).reshape(-1), expected, rtol=1e-15)
    dropped = (net.layer_output(0) == 0).mean()
    assert 0.25 < dropped < 0.35
    first = net.layer_output(0).copy()
    net.forward(x, train=True)  # same step: same mask
    np.testing.assert_array_equal(net.layer_output(0), first)
    net.seen += net.batch  # next step: another mask
    net.forward(x, train=True)
    assert not np.array_equal(net.layer_output(0) == 0, first == 0)


# ---- [cost] --------------------------------------------------------------------------------------
def cost_reference(kind, pred, truth):
    """Darknet's l2_cpu / l1_cpu / smooth_l1 (GPU sign) / masked, element by element."""
    error, delta = np.zeros_like(pred), np.zeros_like(pred)
    for i, (p, t) in enumerate(zip(pred, truth)):
        if kind == "masked" and t == -1234.0:
            p = -1234.0
        diff = t - p
        if kind == "L1":
            error[i], delta[i] = abs(diff), (1.0 if diff > 0 else -1.0)
        elif kind == "smooth" and abs(diff) >= 1:
            error[i], delta[i] = 2 * abs(diff) - 1, (1.0 if diff > 0 else -1.0)
        else:
            error[i], delta[i] = diff * diff, diff
    return error, delta


@pytest.mark.parametrize("kind", ["sse", "seg", "masked", "L1", "smooth"])
def test_cost_forward_and_backward(kind):
    body = f"[connected]\noutput=6\nactivation=linear\n\n[cost]\ntype={kind}\nscale=0.5\n"
    net = build(body, 2, 2, 1)
    rng = np.random.default_rng(9)
    truth = rng.uniform(-3, 3, (2, 6)).astype(np.float32)
    truth[0, 2] = -1234.0
    x = random_input(net)
    net.forward(x, truth, train=True)
    pred = net.layer_output(0).reshape(-1)
    error, delta = cost_reference(kind, pred, truth.astype(np.float64).reshape(-1))
    cost = net.layers[1]
    np.testing.assert_allclose(cost.output, error, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(cost.delta, delta, rtol=1e-12, atol=1e-12)
    assert cost.cost == pytest.approx(error.sum(), rel=1e-12)
    assert net.cost == pytest.approx(error.sum(), rel=1e-12)
    net.backward()
    np.testing.assert_allclose(net.layers[0].delta, 0.5 * delta, rtol=1e-12, atol=1e-12)
    # predict() answers with the layer before the cost, as Darknet's network output.
    np.testing.assert_allclose(net.predict(x).reshape(-1), pred)
    assert net.layers[1].cost is None  # no truth, no cost


def test_cost_smooth_uses_both_branches():
    pred = np.array([0.0, 0.0, 0.0, 0.0])
    truth = np.array([0.5, -0.25, 3.0, -2.0])
    error, delta = cost_reference("smooth", pred, truth)
    np.testing.assert_allclose(error, [0.25, 0.0625, 5.0, 3.0])
    np.testing.assert_allclose(delta, [0.5, -0.25, 1.0, -1.0])


# ---- [shortcut] ----------------------------------------------------------------------------------
def shortcut_reference(batch, w1, h1, c1, add, w2, h2, c2, s1, s2, out):
    """A transcription of Darknet's shortcut_cpu (blas.c)."""
    stride, sample = max(1, w1 // w2), max(1, w2 // w1)
    out = out.copy()
    for b in range(batch):
        for k in range(min(c1, c2)):
            for j in range(min(h1, h2)):
                for i in range(min(w1, w2)):
                    o = i * sample + w2 * (j * sample + h2 * (k + c2 * b))
                    a = i * stride + w1 * (j * stride + h1 * (k + c1 * b))
                    out[o] = s1 * out[o] + s2 * add[a]
    return out


SHORTCUT_CASES = {
    "same": (
        "[convolutional]\nfilters=3\nsize=1\nactivation=linear\n\n"
        "[convolutional]\nfilters=3\nsize=3\npad=1\nactivation=linear\n",
        4,
    ),
    "from larger": (
        "[convolutional]\nfilters=4\nsize=1\nactivation=linear\n\n"
        "[convolutional]\nfilters=2\nsize=3\nstride=2\npad=1\nactivation=linear\n",
        6,
    ),
    "from smaller": (
        "[convolutional]\nfilters=2\nsize=3\nstride=2\npad=1\nactivation=linear\n\n"
        "[upsample]\nstride=2\n\n"
        "[convolutional]\nfilters=3\nsize=1\nactivation=linear\n",
        6,
    ),
}


@pytest.mark.parametrize("case", SHORTCUT_CASES)
def test_shortcut_forward(case):
    body, size = SHORTCUT_CASES[case]
    body += "\n[shortcut]\nfrom=0\nalpha=0.5\nbeta=2\nactivation=leaky\n"
    net = build(body, size, size, 2)
    x = random_input(net)
    out = net.predict(x)
    src, prev, sc = net.layers[0], net.layers[-2], net.layers[-1]
    assert (sc.out_w, sc.out_h, sc.out_c) == (prev.out_w, prev.out_h, prev.out_c)
    ref = shortcut_reference(
        2,
        src.out_w,
        src.out_h,
        src.out_c,
        src.output,
        sc.out_w,
        sc.out_h,
        sc.out_c,
        0.5,
        2.0,
        prev.output,
    )
    np.testing.assert_allclose(
        out.reshape(-1), activations.activate(ref, "leaky"), rtol=1e-12, atol=1e-15
    )
    if case == "from smaller":  # only every second cell of 2 of the 3 channels gets `from`
        untouched = ref == prev.output
        assert untouched.any() and not untouched.all()


# ---- [reorg] -------------------------------------------------------------------------------------
def reorg_reference(x, w, h, c, batch, stride, forward):
    """A transcription of Darknet's reorg_cpu (blas.c)."""
    out = np.zeros_like(x)
    out_c = c // (stride * stride)
    for b in range(batch):
        for k in range(c):
            for j in range(h):
                for i in range(w):
                    in_index = i + w * (j + h * (k + c * b))
                    c2 = k % out_c
                    offset = k // out_c
                    w2 = i * stride + offset % stride
                    h2 = j * stride + offset // stride
                    out_index = w2 + w * stride * (h2 + h * stride * (c2 + out_c * b))
                    if forward:
                        out[out_index] = x[in_index]
                    else:
                        out[in_index] = x[out_index]
    return out


def flatten_reference(x, size, layers, batch, forward):
    """A transcription of Darknet's flatten (blas.c)."""
    swap = np.zeros_like(x)
    for b in range(batch):
        for c in range(layers):
            for i in range(size):
                i1 = b * layers * size + c * size + i
                i2 = b * layers * size + i * layers + c
                if forward:
                    swap[i2] = x[i1]
                else:
                    swap[i1] = x[i2]
    return swap


@pytest.mark.parametrize(
    "options,shape,out_shape",
    [
        ("stride=2", (8, 6, 4), (32, 3, 2)),  # c x h x w in, out
        ("stride=2\nreverse=1", (8, 3, 2), (2, 6, 4)),
        ("stride=3", (9, 3, 6), (81, 1, 2)),
    ],
)
def test_reorg_matches_reorg_cpu(options, shape, out_shape):
    c, h, w = shape
    net = build(f"[reorg]\n{options}\n", w, h, c)
    layer = net.layers[0]
    assert (layer.out_c, layer.out_h, layer.out_w) == out_shape
    x = random_input(net)
    out = net.predict(x).reshape(-1)
    # Darknet's forward calls reorg_cpu with the input's shape and forward = reverse.
    ref = reorg_reference(x.reshape(-1), w, h, c, 2, layer.stride, bool(layer.reverse))
    np.testing.assert_array_equal(out, ref)
    assert not np.array_equal(out, x.reshape(-1))


def test_reorg_yolov2_passthrough_mapping():
    # The 26x26x64 -> 13x13x256 reorg of yolov2.cfg, on a ramp so the mapping shows.
    net = build("[reorg]\nstride=2\n", 26, 26, 64, batch=1)
    x = np.arange(26 * 26 * 64, dtype=np.float64).reshape(1, 64, 26, 26)
    out = net.predict(x).reshape(-1)
    np.testing.assert_array_equal(out, reorg_reference(x.reshape(-1), 26, 26, 64, 1, 2, False))
    assert sorted(out) == list(range(26 * 26 * 64))  # a permutation


@pytest.mark.parametrize("reverse", [0, 1])
def test_reorg_flatten_matches_flatten(reverse):
    net = build(f"[reorg]\nflatten=1\nreverse={reverse}\n", 5, 3, 4)
    x = random_input(net)
    out = net.predict(x).reshape(-1)
    np.testing.assert_array_equal(out, flatten_reference(x.reshape(-1), 15, 4, 2, not reverse))


def test_reorg_extra_appends_zeros():
    net = build("[reorg]\nextra=3\nstride=1\n", 3, 3, 1)
    layer = net.layers[0]
    assert (layer.outputs, layer.image_shaped) == (12, False)
    x = random_input(net)
    out = net.predict(x)
    np.testing.assert_array_equal(out[:, :9], x.reshape(2, 9))
    assert not out[:, 9:].any()


# ---- [crop] --------------------------------------------------------------------------------------
def crop_reference(x, out_h, out_w, dh, dw, flip, scale, trans):
    """A transcription of Darknet's forward_crop_layer loop for given offsets."""
    batch, c, h, w = x.shape
    out = np.zeros((batch, c, out_h, out_w))
    for b in range(batch):
        for k in range(c):
            for i in range(out_h):
                for j in range(out_w):
                    col = w - dw - j - 1 if flip else j + dw
                    out[b, k, i, j] = x[b, k, i + dh, col] * scale + trans
    return out


@pytest.mark.parametrize("noadjust", [0, 1])
def test_crop_inference_is_the_centre(noadjust):
    net = build(f"[crop]\ncrop_height=5\ncrop_width=4\nflip=1\nnoadjust={noadjust}\n", 9, 8, 3)
    x = random_input(net, low=0.0, high=1.0)
    scale, trans = (1.0, 0.0) if noadjust else (2.0, -1.0)
    np.testing.assert_allclose(
        net.predict(x), crop_reference(x, 5, 4, 1, 2, False, scale, trans), rtol=1e-15
    )


def test_crop_training_draws_offsets_and_flips():
    net = build("[crop]\ncrop_height=4\ncrop_width=5\nflip=1\n", 9, 7, 2)
    layer = net.layers[0]
    x = random_input(net, low=0.0, high=1.0)
    seen = set()
    for _ in range(40):
        net.forward(x, train=True)
        dh, dw, flip = layer.last_crop
        assert 0 <= dh <= 3 and 0 <= dw <= 4
        np.testing.assert_allclose(
            net.layer_output(0), crop_reference(x, 4, 5, dh, dw, flip, 2.0, -1.0), rtol=1e-15
        )
        seen.add(layer.last_crop)
    assert len({s[2] for s in seen}) == 2 and len(seen) > 10


# ---- [local] -------------------------------------------------------------------------------------
def local_reference(x, weights, biases, filters, size, stride, pad, out_h, out_w, act):
    """Per output location its own filters: Darknet's im2col + per-location gemm, as loops."""
    batch, c, h, w = x.shape
    k = size * size * c
    wts = weights.reshape(out_h * out_w, filters, k)
    out = np.zeros((batch, filters, out_h, out_w))
    for b in range(batch):
        for oy in range(out_h):
            for ox in range(out_x := out_w):
                loc = oy * out_x + ox
                patch = np.zeros(k)
                for ch in range(c):
                    for ky in range(size):
                        for kx in range(size):
                            y, xx = oy * stride + ky - pad, ox * stride + kx - pad
                            if 0 <= y < h and 0 <= xx < w:
                                patch[(ch * size + ky) * size + kx] = x[b, ch, y, xx]
                for f in range(filters):
                    out[b, f, oy, ox] = wts[loc, f] @ patch + biases[(f * out_h + oy) * out_w + ox]
    return activations.activate(out, act)


@pytest.mark.parametrize(
    "options,size,out_size",
    [
        ("size=3\nstride=1\npad=1", 5, 5),
        ("size=3\nstride=2\npad=0", 7, 3),
        ("size=2\nstride=2\npad=0", 6, 3),
    ],
)
def test_local_forward(options, size, out_size):
    net = build(f"[local]\nfilters=3\n{options}\nactivation=leaky\n", size, size, 2)
    layer = net.layers[0]
    assert (layer.out_c, layer.out_h, layer.out_w) == (3, out_size, out_size)
    # Darknet initialises only the first location's weights; the rest start at 0.
    first = layer.ksize * layer.filters
    assert layer.weights[:first].any() and not layer.weights[first:].any()
    assert [n for n, _ in layer.params()] == ["biases", "weights"]
    randomize(layer.weights, 7)
    randomize(layer.biases, 8)
    x = random_input(net)
    ref = local_reference(
        x,
        layer.weights,
        layer.biases,
        3,
        layer.size,
        layer.stride,
        layer.pad,
        out_size,
        out_size,
        "leaky",
    )
    np.testing.assert_allclose(net.predict(x), ref, rtol=1e-12, atol=1e-14)


# ---- the layer table -----------------------------------------------------------------------------
def test_rows_follow_darknets_printf_formats():
    body = """
[reorg]
stride=2

[convolutional]
filters=16
size=1
activation=linear

[shortcut]
from=-2

[dropout]
probability=0.25

[connected]
output=10
activation=linear

[reorg]
extra=2

[cost]
"""
    net = build(body, 8, 6, 4)
    assert row(net, 0) == "reorg              / 2     8 x   6 x   4   ->     4 x   3 x  16"
    assert row(net, 2) == "res    0                   4 x   3 x  16   ->     4 x   3 x  16"
    assert row(net, 3) == "dropout       p = 0.25                192  ->   192"
    assert row(net, 4) == "connected                             192  ->    10"
    assert row(net, 5) == "reorg                10   ->    12"
    assert row(net, 6) == "cost                                             12"


# ---- errors that name the key --------------------------------------------------------------------
ERRORS = [
    ("[convolutional]\nfilters=3\nsize=1\n\n[route]\nlayers=-3\n", "layers", "out of range"),
    ("[convolutional]\nfilters=3\nsize=1\n\n[route]\nlayers=1\n", "layers", "out of range"),
    ("[convolutional]\nfilters=4\nsize=1\n\n[shortcut]\nfrom=-5\n", "from", "out of range"),
    ("[convolutional]\nfilters=4\nsize=1\n\n[shortcut]\nfrom=1\n", "from", "out of range"),
    ("[convolutional]\nfilters=4\nsize=1\n\n[shortcut]\nactivation=linear\n", "from", "from="),
    (
        "[convolutional]\nfilters=4\nsize=1\n\n[crop]\ncrop_height=4\ncrop_width=2\n\n"
        "[shortcut]\nfrom=0\n",
        "from",
        "same factor",
    ),
    ("[convolutional]\nfilters=3\nsize=1\ngroups=2\n", "groups", "groups=2"),
    ("[reorg]\nstride=2\n", "stride", "multiple of 4"),
    ("[convolutional]\nfilters=9\nsize=1\n\n[reorg]\nstride=3\n", "stride", "does not fit"),
    ("[reorg]\nstride=0\n", "stride", "at least 1"),
    ("[crop]\ncrop_height=9\ncrop_width=2\n", "crop_height", "between 1 and"),
    ("[crop]\ncrop_height=2\ncrop_width=0\n", "crop_width", "between 1 and"),
    ("[local]\nfilters=2\nsize=5\npad=1\n", "pad", "disagree"),
    ("[local]\nfilters=2\nsize=9\n", "size", "does not fit"),
    ("[connected]\noutput=0\n", "output", "at least 1"),
    ("[connected]\noutput=2\nactivation=swishy\n", "activation", "unknown activation"),
    ("[dropout]\nprobability=1\n", "probability", "[0, 1)"),
    ("[cost]\ntype=l2\n", "type", "unknown cost type"),
    ("[cost]\nthresh=0.5\n", "thresh", "not supported"),
]


@pytest.mark.parametrize("body,key,words", ERRORS)
def test_errors_name_file_line_and_key(body, key, words):
    text = "[net]\nbatch=1\nwidth=4\nheight=4\nchannels=2\n\n" + body
    with pytest.raises(CfgError) as info:
        Network(parse_cfg_text(text, "bad.cfg"), "bad.cfg", allocate=False)
    err = info.value
    assert err.key == key and words in err.message, str(err)
    lines = text.splitlines()
    if any(line.startswith(key + "=") for line in lines):
        # The line of the key in the *last* section (where the error is).
        expected = max(i for i, line in enumerate(lines, 1) if line.startswith(key + "="))
        assert err.line == expected
    assert str(err).startswith(f"bad.cfg:{err.line}: {key}: ")
