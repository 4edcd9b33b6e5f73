"""Reduced precision: the tensor-core kernels (ops/convolution/gemm_tc_*.cu) against NumPy, the
NumPy emulation (precision.round_to), and the precision switches (--precision, precision=,
[net] precision=).

GPU tests compare each kernel twice, on fresh random inputs with NaN-poisoned outputs:
  * with the NumPy backend emulating the precision in float64 (operands rounded as the
    GPU rounds them): the only difference left is the order of the fp32 sums, so the
    tolerance is 1e-4 of the largest output (max |got - want| / max |want|);
  * with the exact float64 product of the unrounded operands: what the precision costs,
    PRECISION_TOL below (fp16 and tf32 keep 10-11 mantissa bits, bf16 8).
"""

import numpy as np
import pytest
from test_cuda_ops import assert_close, nan, rand

from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.cfg import CfgError
from darknet_py.network import NetworkError, load_network
from darknet_py.shapes import conv_out_size

gpu = pytest.mark.gpu
REDUCED = ("tf32", "fp16", "bf16")
# Against the exact product of the unrounded fp32 operands (sums of up to ~5,000 terms of
# uniform(-1, 1) operands).
PRECISION_TOL = {"tf32": 3e-3, "fp16": 3e-3, "bf16": 2e-2}
EMULATION_TOL = 1e-4
REF = NumpyBackend(np.float64)
TILES = ("128x128", "64x128", "32x128", "16x128", "64x64")


# ---- emulation and switches (CPU) ---------------------------------------------------


def test_round_to_matches_the_formats():
    x = np.array(
        [1.0, 1 + 2**-11, 1 + 3 * 2**-11, -(1 + 2**-8), 65504.0, 70000.0, np.inf, -3.0], np.float32
    )
    # fp16: ties to even (1 + 2^-11 -> 1, 1 + 3*2^-11 -> 1 + 2^-9), overflow to inf
    np.testing.assert_array_equal(
        precisions.round_to(x, "fp16")[:6], [1.0, 1.0, 1 + 2**-9, -(1 + 2**-8), 65504.0, np.inf]
    )
    # bf16 keeps 8 bits: 1 + 2^-8 is a tie, to even (1); tf32 keeps 11: ties away from zero
    np.testing.assert_array_equal(precisions.round_to(x[3:4], "bf16"), [-1.0])
    np.testing.assert_array_equal(
        precisions.round_to(np.float32([1 + 2**-11]), "tf32"), [1 + 2**-10]
    )
    assert np.isinf(precisions.round_to(x, "bf16")[6]) and precisions.round_to(x, "tf32")[7] == -3.0
    with pytest.raises(precisions.PrecisionError, match="fp32, tf32, fp16, bf16"):
        precisions.round_to(x, "fp8")


def test_numpy_gemm_lowp_rounds_the_operands_only():
    rng = np.random.default_rng(3)
    a, b = rand(rng, 6 * 5).reshape(6, 5), rand(rng, 5 * 7).reshape(5, 7)
    for p in REDUCED:
        out = np.full(42, np.nan)
        REF.gemm_lowp(
            p,
            0,
            0,
            6,
            7,
            5,
            1.0,
            a.reshape(-1).astype(np.float64),
            5,
            b.reshape(-1).astype(np.float64),
            7,
            0.0,
            out,
            7,
        )
        want = precisions.round_to(a, p).astype(np.float64) @ precisions.round_to(b, p)
        np.testing.assert_allclose(out.reshape(6, 7), want, rtol=1e-12)


TINY_CFG = """[net]
batch=2
width=12
height=10
channels=3
{net_extra}

[convolutional]
filters=8
size=3
stride=1
pad=1
batch_normalize={bn}
activation=leaky

[convolutional]
filters=6
size=1
stride=1
activation=linear

[softmax]
"""


def _tiny(tmp_path, net_extra="", bn=1):
    path = tmp_path / f"tiny{bn}.cfg"
    path.write_text(TINY_CFG.format(net_extra=net_extra, bn=bn))
    return path


def test_precision_comes_from_the_argument_the_environment_or_the_cfg(tmp_path, monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    assert load_network(_tiny(tmp_path)).precision == "fp32"
    net = load_network(_tiny(tmp_path, "precision=bf16"))
    assert net.precision == "bf16"
    # the head's input (the convolution before [softmax]) stays fp32
    assert [layer.precision for layer in net.layers[:2]] == ["bf16", "fp32"]
    monkeypatch.setenv(precisions.ENV, "fp16")
    assert load_network(_tiny(tmp_path, "precision=bf16")).precision == "fp16"
    assert load_network(_tiny(tmp_path), precision="TF32").precision == "tf32"
    with pytest.raises(NetworkError, match="unknown precision 'fp64'"):
        load_network(_tiny(tmp_path), precision="fp64")
    monkeypatch.setenv(precisions.ENV, "half")
    with pytest.raises(NetworkError, match=r"\$DARKNET_PRECISION: unknown precision 'half'"):
        load_network(_tiny(tmp_path))
    monkeypatch.setenv(precisions.ENV, "fp16")
    with pytest.raises(CfgError, match="precision.*unknown precision 'half'"):
        load_network(_tiny(tmp_path, "precision=half"))
    # the fork's loss_scale alone leaves fp32 (read: no unknown-option warning)
    monkeypatch.delenv(precisions.ENV)
    net = load_network(_tiny(tmp_path, "loss_scale=128"))
    assert net.precision == "fp32" and net.net_precision.loss_scale == 128.0


def test_cpu_forward_at_each_precision_is_the_emulated_product(tmp_path, monkeypatch):
    monkeypatch.delenv(precisions.ENV, raising=False)
    rng = np.random.default_rng(5)
    x = rng.uniform(0, 1, (2, 3 * 10 * 12)).astype(np.float32)
    fp32 = load_network(_tiny(tmp_path, bn=0))  # (unfolded batch norm's start has variance 0)
    want = fp32.predict(x)
    for p in REDUCED:
        net = load_network(_tiny(tmp_path, bn=0), precision=p)
        # the implicit GEMM unfolds nothing: only the head's fp32 1x1 convolution's chunk
        assert net.workspace.size == (8 + 6) * 120 * 2 < fp32.workspace.size
        got = net.predict(x)
        err = np.max(np.abs(got - want))
        assert 0 < err < 5 * PRECISION_TOL[p], (p, err)


def test_cli_precision_option_reaches_the_network(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from darknet_py.cli import cli

    monkeypatch.delenv(precisions.ENV, raising=False)
    result = CliRunner().invoke(
        cli, ["bench", str(_tiny(tmp_path)), "--device", "cpu", "--precision", "nope"]
    )
    assert result.exit_code == 2 and "nope" in result.output
    for command in ("train", "detect", "test", "valid", "map", "bench"):
        help_text = CliRunner().invoke(cli, [command, "--help"]).output
        assert "--precision [fp32|tf32|fp16|bf16]" in help_text, command


# ---- GPU: the kernels ---------------------------------------------------------------------


def _gemm_case(rng, ta, tb, m, n, k):
    a = rand(rng, m * k)
    b = rand(rng, k * n)
    c = rand(rng, m * n)
    return a, (m if ta else k), b, (k if tb else n), c


def _run_gemm(backend, p, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c):
    dt = np.float64 if backend is REF else np.float32
    A, B, C = (backend.from_host(v.astype(dt)) for v in (a, b, c))
    backend.gemm_lowp(p, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, n)
    return np.asarray(backend.to_host(C), np.float64)


@gpu
@pytest.mark.parametrize("p", REDUCED)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0)])
@pytest.mark.parametrize("tile", TILES)
def test_gemm_lowp_every_tile(cuda, p, ta, tb, tile):
    rng = np.random.default_rng(hash((p, ta, tb, tile)) % 2**32)
    m, n, k = 131, 197, 333  # divides no tile
    a, lda, b, ldb, c = _gemm_case(rng, ta, tb, m, n, k)
    for beta, splits in ((0.0, 1), (0.5, 3)):
        cuda.tc_override = (tile, splits)
        try:
            got = _run_gemm(
                cuda, p, ta, tb, m, n, k, 0.75, a, lda, b, ldb, beta, nan(m * n) if beta == 0 else c
            )
        finally:
            cuda.tc_override = None
        want = _run_gemm(REF, p, ta, tb, m, n, k, 0.75, a, lda, b, ldb, beta, c)
        assert_close(got, want, EMULATION_TOL, f"{p} {tile} split {splits}")


@gpu
@pytest.mark.parametrize("p", REDUCED)
def test_gemm_lowp_against_the_exact_product(cuda, p):
    rng = np.random.default_rng(11)
    for ta, tb, m, n, k in ((0, 1, 64, 1152, 5000), (1, 0, 577, 900, 128), (0, 0, 16, 300, 27)):
        a, lda, b, ldb, _ = _gemm_case(rng, ta, tb, m, n, k)
        got = _run_gemm(cuda, p, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, nan(m * n))
        A = a.astype(np.float64).reshape((k, m) if ta else (m, k))
        B = b.astype(np.float64).reshape((n, k) if tb else (k, n))
        want = (A.T if ta else A) @ (B.T if tb else B)
        assert_close(got, want.reshape(-1), PRECISION_TOL[p], f"{p} {m}x{n}x{k}")
        emulated = _run_gemm(REF, p, ta, tb, m, n, k, 1.0, a, lda, b, ldb, 0.0, nan(m * n))
        assert_close(got, emulated, EMULATION_TOL, f"{p} {m}x{n}x{k} emulated")


# (c, h, w, filters, size, stride, pad, dilation, groups, batch): the stock cfgs' kinds —
# 3x3 and 1x1, stride 2 and the fork's stride_x != stride_y, dilation 2, grouped and
# depthwise, a first layer's 3 channels, a small 13x13 map with many filters.
CONV_CASES = [
    (3, 23, 29, 16, 3, 1, 1, 1, 1, 3),
    (19, 17, 15, 33, 3, 2, 1, 1, 1, 2),
    (64, 13, 13, 255, 1, 1, 0, 1, 1, 2),
    (24, 12, 11, 40, 3, 1, 2, 2, 1, 2),
    (32, 11, 14, 32, 3, 1, 1, 1, 4, 2),
    (16, 9, 10, 16, 3, 1, 1, 1, 16, 2),
    (12, 14, 13, 20, 3, (1, 2), 1, 1, 1, 2),
    (256, 13, 13, 512, 3, 1, 1, 1, 1, 1),
    (5, 7, 6, 130, 5, 2, 2, 1, 1, 4),
]


def _conv_groups(backend, p, case, weights, im, biases, activation, out, dt, out_precision="fp32"):
    """conv_forward of each group of `case` at precision p into out (host arrays converted
    to dt first)."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    W, X = backend.from_host(weights.astype(dt)), backend.from_host(im.astype(dt))
    bias = None if biases is None else backend.from_host(biases.astype(dt))
    cg, m = c // groups, filters // groups
    k = cg * size * size
    for g in range(groups):
        packed = backend.pack_weights(W[g * m * k :], m, k, p)
        backend.conv_forward(
            packed,
            X[g * cg * h * w :],
            cg,
            h,
            w,
            size,
            stride,
            pad,
            dilation,
            batch,
            c * h * w,
            None if bias is None else bias[g * m :],
            activation,
            out[g * m * out_h * out_w :],
            filters * out_h * out_w,
            out_precision=out_precision,
        )


def _conv(backend, p, case, weights, im, biases, activation):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    dt = np.float64 if backend is REF else np.float32
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    out = backend.from_host(nan(batch * filters * out_h * out_w).astype(dt))
    _conv_groups(backend, p, case, weights, im, biases, activation, out, dt)
    return np.asarray(backend.to_host(out), np.float64)


@gpu
@pytest.mark.parametrize("p", REDUCED)
@pytest.mark.parametrize(
    "case", CONV_CASES, ids=lambda c: "c{}h{}w{}f{}k{}s{}p{}d{}g{}b{}".format(*c)
)
def test_conv_forward_against_numpy(cuda, p, case):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(abs(hash((p, str(case)))) % 2**32)
    weights = rand(rng, filters * c // groups * size * size)
    im = rand(rng, batch * c * h * w)
    biases = rand(rng, filters)
    for act, bias in (("leaky", biases), ("linear", None), ("mish", biases), ("logistic", biases)):
        got = _conv(cuda, p, case, weights, im, bias, act)
        want = _conv(REF, p, case, weights, im, bias, act)
        assert_close(got, want, EMULATION_TOL, f"{p} {act}")
    exact = _conv(REF, "fp32", case, weights, im, None, "linear")
    got = _conv(cuda, p, case, weights, im, None, "linear")
    assert_close(got, exact, PRECISION_TOL[p], f"{p} against fp32")


# Forward products the Hopper GEMM takes (cuda_wgmma.conv_forward: 3x3 kernels over <= 52x52
# outputs, enough multiply-adds and at least half as many pairs of 128 x 256 tiles as the
# chip's 66 clusters): stride 2, dilation 2 with groups, channels not a multiple of
# im2col_rows' chunk of 16 (nor of its thread's 8), row counts not a multiple of its tile of
# 64; edges everywhere.
WGMMA_CONV_CASES = [
    (128, 13, 13, 260, 3, 1, 1, 1, 1, 26),
    (64, 27, 25, 96, 3, 2, 1, 1, 1, 48),
    (61, 21, 23, 130, 3, 1, 1, 1, 1, 19),
    (64, 19, 17, 128, 3, 1, 2, 2, 2, 28),
    (21, 15, 15, 272, 3, 1, 1, 1, 1, 40),
]


@gpu
@pytest.mark.parametrize("p", ("fp16", "bf16"))
@pytest.mark.parametrize(
    "case", WGMMA_CONV_CASES, ids=lambda c: "c{}h{}w{}f{}k{}s{}p{}d{}g{}b{}".format(*c)
)
def test_conv_forward_on_wgmma_against_numpy(cuda, p, case, monkeypatch):
    """The forward through cuda_wgmma.conv_forward (taken once per group, checked), into
    the layer's layout with outputs poisoned with NaN, each epilogue activation with and
    without biases, against NumPy; the same layer on one image stays on conv_tc."""
    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    if cuda_wgmma.kernels(cuda) is None:
        pytest.skip("the wgmma kernels need compute capability 9.0")
    taken = []
    original = cuda_wgmma.conv_forward
    monkeypatch.setattr(
        cuda_wgmma, "conv_forward", lambda *a: taken.append(original(*a)) or taken[-1]
    )
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(abs(hash((p, str(case)))) % 2**32)
    weights = rand(rng, filters * c // groups * size * size)
    im, biases = rand(rng, batch * c * h * w), rand(rng, filters)
    for act, bias in (
        ("linear", None),
        ("linear", biases),
        ("leaky", biases),
        ("mish", biases),
        ("logistic", None),
    ):
        taken.clear()
        got = _conv(cuda, p, case, weights, im, bias, act)
        assert taken == [True] * groups
        assert np.isfinite(got).all()
        assert_close(got, _conv(REF, p, case, weights, im, bias, act), EMULATION_TOL, f"{p} {act}")
    exact = _conv(REF, "fp32", case, weights, im, None, "linear")
    assert_close(
        _conv(cuda, p, case, weights, im, None, "linear"),
        exact,
        PRECISION_TOL[p],
        f"{p} against fp32",
    )
    one = case[:-1] + (1,)
    taken.clear()
    got = _conv(cuda, p, one, weights, im[: c * h * w], biases, "leaky")
    assert taken == [False] * groups
    assert_close(
        got,
        _conv(REF, p, one, weights, im[: c * h * w], biases, "leaky"),
        EMULATION_TOL,
        f"{p} one image",
    )


@gpu
def test_conv_forward_every_tile(cuda):
    case = (19, 17, 15, 33, 3, 2, 1, 1, 1, 2)
    rng = np.random.default_rng(17)
    weights, im, biases = rand(rng, 33 * 19 * 9), rand(rng, 2 * 19 * 17 * 15), rand(rng, 33)
    for p in REDUCED:
        want = _conv(REF, p, case, weights, im, biases, "relu")
        for tile in TILES:
            cuda.tc_override = (tile, 1)
            try:
                got = _conv(cuda, p, case, weights, im, biases, "relu")
            finally:
                cuda.tc_override = None
            assert_close(got, want, EMULATION_TOL, f"{p} {tile}")


def _conv_into_x(backend, p, case, weights, im, biases, activation):
    """_conv's product written at p's 16 bits (out_precision=p, storage_zeros' array, NaN
    first), as float32 values."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    n = batch * filters * out_h * out_w
    if backend is REF:
        out = backend.storage_zeros(n, p)
        out[:] = np.nan
    else:
        from test_bn_passes import poisoned_storage

        out = poisoned_storage(backend, n, p)
    _conv_groups(
        backend, p, case, weights, im, biases, activation, out, np.float32, out_precision=p
    )
    if backend is REF:
        return np.asarray(out, np.float32)
    from test_bn_half_x import widened

    return widened(backend, out, p)


def test_conv_forward_into_16_bit_storage_numpy():
    """NumPy: the 16-bit output is the fp32 one rounded (round_to); a storage of another
    precision is refused."""
    be = REF
    case = CONV_CASES[1]
    rng = np.random.default_rng(5)
    weights, im, biases = rand(rng, 33 * 19 * 9), rand(rng, 2 * 19 * 17 * 15), rand(rng, 33)
    for p in ("fp16", "bf16"):
        want = precisions.round_to(_conv(be, p, case, weights, im, biases, "leaky"), p)
        np.testing.assert_array_equal(_conv_into_x(be, p, case, weights, im, biases, "leaky"), want)
    packed = be.pack_weights(be.from_host(weights[:9]), 1, 9, "fp16")
    with pytest.raises(ValueError, match="writes fp32 or fp16, not bf16"):
        be.conv_forward(
            packed,
            be.from_host(im),
            1,
            17,
            15,
            3,
            1,
            1,
            1,
            1,
            0,
            None,
            "linear",
            be.zeros(255),
            255,
            out_precision="bf16",
        )


@gpu
@pytest.mark.parametrize("p", ("fp16", "bf16"))
@pytest.mark.parametrize(
    "case",
    CONV_CASES[:3] + WGMMA_CONV_CASES[:3],
    ids=lambda c: "c{}h{}w{}f{}k{}s{}p{}d{}g{}b{}".format(*c),
)
def test_conv_forward_into_16_bit_storage_cuda(cuda, p, case):
    """The `_h` entries (conv_tc's and wgmma's store 4): every value is the fp32 entry's
    rounded to nearest even, bit for bit (the same sums, one rounding), NaN overwritten;
    a mismatched array refused."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(abs(hash((p, str(case), 16))) % 2**32)
    weights = rand(rng, filters * c // groups * size * size)
    im, biases = rand(rng, batch * c * h * w), rand(rng, filters)
    for act, bias in (("linear", None), ("leaky", biases), ("mish", biases)):
        fp32 = _conv(cuda, p, case, weights, im, bias, act).astype(np.float32)
        got = _conv_into_x(cuda, p, case, weights, im, bias, act)
        np.testing.assert_array_equal(got, precisions.round_to(fp32, p), err_msg=f"{p} {act}")
    packed = cuda.pack_weights(cuda.from_host(weights[: c * 9]), 1, c * 9, p)
    args = (cuda.from_host(im), c, h, w, 3, 1, 1, 1, 1, 0, None, "linear")
    with pytest.raises(TypeError, match=p):
        cuda.conv_forward(packed, *args, cuda.zeros(h * w), h * w, out_precision=p)
    other = "bf16" if p == "fp16" else "fp16"
    with pytest.raises(ValueError, match=f"not {other}"):
        cuda.conv_forward(
            packed, *args, cuda.storage_zeros(h * w, other), h * w, out_precision=other
        )


# ---- GPU: networks --------------------------------------------------------------------------


@gpu
@pytest.mark.parametrize("p", REDUCED)
def test_training_step_on_the_gpu_follows_the_emulation(cuda, tmp_path, p, monkeypatch):
    """One training iteration at precision p: the GPU's updated weights and the CPU's
    emulated ones agree (the same rounded operands, sums in another order)."""
    monkeypatch.delenv(precisions.ENV, raising=False)
    rng = np.random.default_rng(23)
    x = rng.uniform(0, 1, (2, 3 * 10 * 12)).astype(np.float32)
    truth = np.zeros((2, 720), np.float32)
    truth[0, 1] = truth[1, 400] = 1
    weights = {}
    for device in ("cpu", "cuda"):
        net = load_network(_tiny(tmp_path), device=device, precision=p, seed=4)
        net.train_iteration(x, truth)
        weights[device] = [
            np.asarray(net.be.to_host(layer.weights), np.float64) for layer in net.layers[:2]
        ]
        assert np.isfinite(net.cost)
    for got, want in zip(weights["cuda"], weights["cpu"]):
        assert_close(got, want, 1e-4, f"{p} weights after a step")


@gpu
def test_real_weights_detect_the_same_objects_at_every_precision(cuda, monkeypatch):
    """yolov3-tiny on the four photos: fp16 and tf32 find fp32's classes above 0.25 with
    probabilities within 2 points; bf16 (8 mantissa bits) is held to its emulation."""
    from pathlib import Path

    import cv2

    monkeypatch.delenv(precisions.ENV, raising=False)
    shared = Path(__file__).resolve().parents[2] / "shared"
    cfg, weights = (
        shared / "darknet-cfg" / "yolov3-tiny.cfg",
        shared / "weights" / "yolov3-tiny.weights",
    )
    if not weights.exists():
        pytest.skip("no ../shared/weights/yolov3-tiny.weights")
    images = sorted((shared / "images").glob("*.jpg"))
    found = {}
    for p in ("fp32",) + REDUCED:
        net = load_network(cfg, weights, batch=1, device="cuda", precision=p)
        found[p] = [
            sorted((d.class_id, d.prob) for d in net.detect(cv2.imread(str(i)), thresh=0.25))
            for i in images
        ]
    worst = {}
    for p in ("fp16", "tf32"):
        for image, got, want in zip(images, found[p], found["fp32"]):
            assert [c for c, _ in got] == [c for c, _ in want], (p, image.name, got, want)
            worst[p] = max([worst.get(p, 0)] + [abs(a[1] - b[1]) for a, b in zip(got, want)])
            assert worst[p] < 0.02, (p, image.name, got, want)
    print("largest probability change against fp32:", worst)


def test_loss_scaler_scales_unscales_and_skips(tmp_path, monkeypatch):
    """fp16 training: the heads' deltas are scaled, the update sees unscaled gradients (the
    same weights as an fp16 run at scale 1, to rounding), a non-finite gradient skips the
    update and halves a dynamic scale; [net] loss_scale= gives a static one."""
    monkeypatch.delenv(precisions.ENV, raising=False)
    rng = np.random.default_rng(29)
    x = rng.uniform(0, 1, (2, 3 * 10 * 12)).astype(np.float32)
    truth = np.zeros((2, 720), np.float32)
    truth[0, 7] = truth[1, 300] = 1
    net = load_network(_tiny(tmp_path, "momentum=0.9"), precision="fp16", seed=2)
    plain = load_network(_tiny(tmp_path, "momentum=0.9"), precision="fp16", seed=2)
    assert net.loss_scaler.dynamic and net.loss_scaler.scale == 4096.0
    plain.loss_scaler = precisions.LossScaler(scale=1.0)
    for _ in range(2):  # the second step also carries momentum's history
        net.train_iteration(x, truth)
        plain.train_iteration(x, truth)
    for a, b in zip(net.layers[:2], plain.layers[:2]):
        np.testing.assert_allclose(a.weights, b.weights, rtol=0, atol=2e-5)
    before = net.layers[0].weights.copy()
    net.loss_scaler.scale = 2.0**100  # scaled deltas overflow fp16 (and fp32)
    net.train_iteration(x, truth)
    assert net.loss_scaler.skipped == 1 and net.loss_scaler.scale == 2.0**99
    np.testing.assert_array_equal(net.layers[0].weights, before)
    assert precisions.log_note(net) == f", fp16 loss scale {2.0**99:g}, 1 skipped"
    net.loss_scaler.scale = 4096.0
    net.train_iteration(x, truth)  # and it trains on
    assert net.loss_scaler.skipped == 1 and not np.array_equal(net.layers[0].weights, before)
    static = load_network(_tiny(tmp_path, "loss_scale=128"), precision="fp16")
    assert not static.loss_scaler.dynamic and static.loss_scaler.scale == 128.0
    assert load_network(_tiny(tmp_path), precision="bf16").loss_scaler is None
