"""The convolution backward as implicit GEMMs: conv_weight_grad and conv_data_grad.

CPU: the NumPy ops (the GPU kernels' reference) against Darknet's per-image im2col + GEMM
+ col2im. GPU (ops/convolution/conv_backward_*.cu): every kernel, tile and split against NumPy on
random shapes that divide no tile (3 and 255 channels, stride 2 and the fork's (1, 2),
k 1, 3 and 5, dilation, groups), outputs poisoned with NaN, in each precision:
  * fp32 (FFMA): against NumPy float64, FP32_TOL of the largest output (only the sums'
    order differs from Darknet's);
  * tf32 / fp16 / bf16: against the NumPy emulation in float64 (operands rounded as the
    GPU rounds them) to EMULATION_TOL, and against the exact product to PRECISION_TOL;
and a whole training step with the implicit backward against the im2col path.
"""

import numpy as np
import pytest
from test_cuda_ops import assert_close, nan, rand

from darknet_py.backends import BackendError
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.shapes import conv_out_size

gpu = pytest.mark.gpu
REF = NumpyBackend(np.float64)
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
FP32_TOL = 1e-5
EMULATION_TOL = 1e-4
PRECISION_TOL = {"tf32": 3e-3, "fp16": 3e-3, "bf16": 2e-2}

# (c, h, w, filters, size, stride, pad, dilation, groups, batch)
CASES = [
    (3, 23, 29, 16, 3, 1, 1, 1, 1, 3),  # a first layer: 3 channels, 27 weights
    (19, 17, 15, 33, 3, 2, 1, 1, 1, 2),  # stride 2
    (64, 13, 13, 255, 1, 1, 0, 1, 1, 2),  # a head: 255 filters, 1x1
    (24, 12, 11, 40, 3, 1, 2, 2, 1, 2),  # dilation 2
    (32, 11, 14, 32, 3, 1, 1, 1, 4, 2),  # groups
    (16, 9, 10, 16, 3, 1, 1, 1, 16, 2),  # depthwise
    (12, 14, 13, 20, 3, (1, 2), 1, 1, 1, 2),  # the fork's stride_y != stride_x
    (5, 7, 6, 130, 5, 2, 2, 1, 1, 4),  # 5x5, stride 2
    (255, 9, 7, 36, 3, 1, 1, 1, 1, 3),  # 255 channels
    (33, 10, 12, 17, 1, 2, 0, 1, 1, 3),  # 1x1 stride 2 (3 of 4 parity classes: no tap)
    (8, 15, 13, 12, 3, 2, 2, 2, 1, 2),  # stride 2, dilation 2 (odd pixels: no tap)
    (6, 16, 15, 10, 3, (2, 1), 1, 1, 2, 3),  # strides (2, 1), groups
]
CASE_IDS = ["c{}h{}w{}f{}k{}s{}p{}d{}g{}b{}".format(*c) for c in CASES]


def _arrays(case, seed):
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    rng = np.random.default_rng(seed)
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    return dict(
        weights=rand(rng, filters * c // groups * size * size),
        im=rand(rng, batch * c * h * w),
        delta=rand(rng, batch * filters * out_h * out_w),
        updates=rand(rng, filters * c // groups * size * size),
        dx=rand(rng, batch * c * h * w),
    )


def _weight_grad(backend, p, case, a):
    """A layer's weight gradient, group by group, added to a.updates."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    dt = np.float64 if backend is REF else np.float32
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    D, X, U = (backend.from_host(a[key].astype(dt)) for key in ("delta", "im", "updates"))
    for g in range(groups):
        backend.conv_weight_grad(
            p,
            D[g * m * n :],
            filters * n,
            X[g * cg * h * w :],
            c * h * w,
            cg,
            h,
            w,
            size,
            stride,
            pad,
            dilation,
            batch,
            m,
            U[g * m * k :],
        )
    return np.asarray(backend.to_host(U), np.float64)


def _data_grad(backend, p, case, a, accumulate):
    """A layer's input delta: added to a.dx, or written over NaN."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    dt = np.float64 if backend is REF else np.float32
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    W, D = backend.from_host(a["weights"].astype(dt)), backend.from_host(a["delta"].astype(dt))
    dx = backend.from_host((a["dx"] if accumulate else nan(a["dx"].size)).astype(dt))
    for g in range(groups):
        backend.conv_data_grad(
            p,
            W[g * m * k :],
            m,
            D[g * m * n :],
            filters * n,
            cg,
            h,
            w,
            size,
            stride,
            pad,
            dilation,
            batch,
            dx[g * cg * h * w :],
            c * h * w,
            accumulate,
        )
    return np.asarray(backend.to_host(dx), np.float64)


# ---- CPU: the reference against Darknet's products ------------------------------------


def _darknet_backward(case, a):
    """Darknet's loop: per image and group, im2col + GEMM into the updates, GEMM + col2im
    into the input's delta (added)."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    updates, dx = a["updates"].astype(np.float64), a["dx"].astype(np.float64)
    col = np.empty(k * n)
    for b in range(batch):
        for g in range(groups):
            REF.im2col(
                a["im"].astype(np.float64)[(b * c + g * cg) * h * w :],
                cg,
                h,
                w,
                size,
                stride,
                pad,
                dilation,
                col,
            )
            d = a["delta"].astype(np.float64)[(b * filters + g * m) * n :][: m * n].reshape(m, n)
            updates[g * m * k : (g + 1) * m * k] += (d @ col.reshape(k, n).T).reshape(-1)
            wg = a["weights"].astype(np.float64)[g * m * k : (g + 1) * m * k].reshape(m, k)
            REF.col2im(
                (wg.T @ d).reshape(-1),
                cg,
                h,
                w,
                size,
                stride,
                pad,
                dilation,
                dx[(b * c + g * cg) * h * w :],
            )
    return updates, dx


@pytest.mark.parametrize("case", CASES[:8], ids=CASE_IDS[:8])
def test_numpy_backward_products_are_darknets(case):
    a = _arrays(case, 5)
    updates, dx = _darknet_backward(case, a)
    np.testing.assert_allclose(_weight_grad(REF, "fp32", case, a), updates, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(_data_grad(REF, "fp32", case, a, True), dx, rtol=1e-12, atol=1e-12)
    # overwrite: the fork's col2im clears the image first
    cleared = _data_grad(REF, "fp32", case, a, False)
    np.testing.assert_allclose(cleared, dx - a["dx"], rtol=1e-9, atol=1e-9)


def test_numpy_backward_rounds_the_operands():
    case = CASES[1]
    a = _arrays(case, 6)
    exact = _weight_grad(REF, "fp32", case, a)
    for p, tol in PRECISION_TOL.items():
        got = _weight_grad(REF, p, case, a)
        err = np.max(np.abs(got - exact)) / np.max(np.abs(exact))
        assert 0 < err < tol, (p, err)


def _unfolded_weight_grad(backend, p, case, a):
    """conv_weight_grad_unfolded group by group over a batched delta (filters x images *
    positions, as the layer moves it), added to a.updates."""
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    dt = np.float64 if backend is REF else np.float32
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    cg, m, n = c // groups, filters // groups, out_h * out_w
    k = cg * size * size
    batched = a["delta"].reshape(batch, filters, n).transpose(1, 0, 2)  # (filters, images, n)
    X, U = backend.from_host(a["im"].astype(dt)), backend.from_host(a["updates"].astype(dt))
    col = backend.from_host(nan(k * batch * n).astype(dt))
    for g in range(groups):
        D = backend.from_host(np.ascontiguousarray(batched[g * m : (g + 1) * m]).ravel().astype(dt))
        backend.conv_weight_grad_unfolded(
            p,
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
            D,
            m,
            U[g * m * k :],
            col,
        )
    return np.asarray(backend.to_host(U), np.float64)


@pytest.mark.parametrize("p", PRECISIONS)
@pytest.mark.parametrize("case", CASES[:8], ids=CASE_IDS[:8])
def test_numpy_unfolded_weight_grad_is_the_implicit_ones(p, case):
    """The im2col path's op (im2col + gemm / gemm_lowp) gives what conv_weight_grad gives."""
    a = _arrays(case, 8)
    np.testing.assert_allclose(
        _unfolded_weight_grad(REF, p, case, a),
        _weight_grad(REF, p, case, a),
        rtol=1e-12,
        atol=1e-12,
    )


def test_the_numpy_backend_keeps_the_im2col_backward():
    assert REF.conv_backward_implicit("fp16", 2, 3, 8, 8, 3, 1, 1, 1, 4) == (False, False)


# ---- GPU: the kernels -------------------------------------------------------------------


def _compare(cuda, p, case, seed, what):
    a = _arrays(case, seed)
    ops = {
        "weight": lambda be, q: _weight_grad(be, q, case, a),
        "data+": lambda be, q: _data_grad(be, q, case, a, True),
        "data=": lambda be, q: _data_grad(be, q, case, a, False),
    }
    for name, op in ops.items():
        got = op(cuda, p)
        assert np.isfinite(got).all(), f"{what} {name}: unwritten (NaN) outputs"
        if p == "fp32":
            assert_close(got, op(REF, "fp32"), FP32_TOL, f"{what} {name}")
            continue
        assert_close(got, op(REF, p), EMULATION_TOL, f"{what} {name} emulated")
        assert_close(got, op(REF, "fp32"), PRECISION_TOL[p], f"{what} {name} exact")


@gpu
@pytest.mark.parametrize("p", PRECISIONS)
@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_backward_products_against_numpy(cuda, p, case):
    _compare(cuda, p, case, abs(hash((p, str(case)))) % 2**32, p)


# Large enough for the Hopper GEMM (cuda_wgmma.handles: >= 2^26 multiply-adds), with
# edges: 130 filters, 3x3 over 67 channels, stride 2 and dilation among them.
WGMMA_CASES = [
    (67, 27, 25, 130, 3, 1, 1, 1, 1, 5),
    (40, 41, 39, 96, 3, 2, 1, 1, 1, 6),
    (64, 26, 26, 257, 1, 1, 0, 1, 1, 7),
    (48, 29, 31, 128, 3, 1, 2, 2, 2, 8),
]


@gpu
@pytest.mark.parametrize("p", PRECISIONS)
@pytest.mark.parametrize(
    "case",
    CASES[:4] + WGMMA_CASES,
    ids=CASE_IDS[:4] + [f"wgmma{i}" for i in range(len(WGMMA_CASES))],
)
def test_unfolded_weight_grad_against_numpy(cuda, p, case):
    """conv_weight_grad_unfolded on CUDA (fp16/bf16 on Hopper: im2col into the wgmma
    operand, for the products handles() takes) against NumPy's im2col + gemm_lowp."""
    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    a = _arrays(case, 11)
    got = _unfolded_weight_grad(cuda, p, case, a)
    assert np.isfinite(got).all()
    if p == "fp32":
        assert_close(got, _unfolded_weight_grad(REF, p, case, a), FP32_TOL, p)
        return
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    if case in WGMMA_CASES and p in cuda_wgmma.PRECISIONS and cuda_wgmma.kernels(cuda):
        assert cuda_wgmma.handles(
            cuda, p, filters // groups, c // groups * size * size, batch * out_h * out_w
        )
    assert_close(got, _unfolded_weight_grad(REF, p, case, a), EMULATION_TOL, f"{p} emulated")
    assert_close(got, _unfolded_weight_grad(REF, "fp32", case, a), PRECISION_TOL[p], f"{p} exact")


# Unit-stride data gradients the wgmma forward takes (E10: >= 256 channels, >= 33 pairs of
# 128 x 256 tiles of channels x images * pixels): 260 channels (the last tile rows nearly
# empty), a "valid" 3x3 (pad 0: the deltas padded by 2), dilation 2 with groups.
FORWARD_DGRAD_CASES = [
    (260, 26, 26, 96, 3, 1, 1, 1, 1, 20),
    (256, 20, 22, 80, 3, 1, 0, 1, 1, 24),
    (512, 29, 31, 64, 3, 1, 2, 2, 2, 10),
]


@gpu
@pytest.mark.parametrize("p", ("fp16", "bf16"))
@pytest.mark.parametrize(
    "case",
    FORWARD_DGRAD_CASES,
    ids=["c{}h{}w{}f{}k{}s{}p{}d{}g{}b{}".format(*c) for c in FORWARD_DGRAD_CASES],
)
def test_data_grad_as_the_forward_of_the_deltas(cuda, p, case, monkeypatch):
    """conv_data_grad through _data_grad_as_forward (the wgmma forward of the deltas with
    the flipped weights; taken once per group, checked), added into dx and written over
    NaN, against the NumPy emulation and the exact product; conv_backward_implicit routes
    these data gradients to it."""
    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    if cuda_wgmma.kernels(cuda) is None:
        pytest.skip("the wgmma kernels need compute capability 9.0")
    taken = []
    original = cuda_wgmma.conv_forward
    monkeypatch.setattr(
        cuda_wgmma,
        "conv_forward",
        lambda *args, **kw: taken.append(original(*args, **kw)) or taken[-1],
    )
    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    assert cuda.conv_backward_implicit(
        p, batch, c // groups, h, w, size, stride, pad, dilation, filters // groups
    )[1]
    a = _arrays(case, 29)
    for accumulate in (True, False):
        taken.clear()
        got = _data_grad(cuda, p, case, a, accumulate)
        assert taken == [True] * groups
        assert np.isfinite(got).all()
        assert_close(
            got,
            _data_grad(REF, p, case, a, accumulate),
            EMULATION_TOL,
            f"{p} accumulate={accumulate} emulated",
        )
        assert_close(
            got,
            _data_grad(REF, "fp32", case, a, accumulate),
            PRECISION_TOL[p],
            f"{p} accumulate={accumulate} exact",
        )


@gpu
@pytest.mark.parametrize("p", ("fp16", "bf16"))
@pytest.mark.parametrize(
    "case",
    [CASES[0], CASES[1], CASES[3], CASES[6], CASES[7], CASES[9]],
    ids=[CASE_IDS[i] for i in (0, 1, 3, 6, 7, 9)],
)
def test_im2col_half_is_the_rounded_im2col(cuda, p, case):
    """im2col_{f16,bf16}_kernel (the wgmma operand, rows `pitch` apart) holds NumPy's
    im2col rounded to p, bit for bit; the entries past each row's columns untouched."""
    from test_bn_half_x import widened
    from test_bn_passes import poisoned_storage

    from darknet_py.ops.convolution import wgmma as cuda_wgmma
    from darknet_py.precision import round_to
    from darknet_py.shapes import conv_strides

    c, h, w, filters, size, stride, pad, dilation, groups, batch = case
    out_h, out_w = conv_out_size(h, w, size, stride, pad, dilation)
    rows, columns = c * size * size, batch * out_h * out_w
    pitch = cuda_wgmma.row_pitch(columns + 1)  # room past the columns
    im = _arrays(case, 3)["im"]
    want = np.empty(rows * columns)
    REF.im2col(im.astype(np.float64), c, h, w, size, stride, pad, dilation, want, batch)
    col = poisoned_storage(cuda, rows * pitch, p)
    sy, sx = conv_strides(stride)
    part = cuda_wgmma.PRECISIONS[p][0]
    cuda._launch_rows(
        f"im2col_{part}_kernel",
        -(-c // 4),
        -(-columns // 2),
        cuda._ptr(cuda.from_host(im)),
        c,
        h,
        w,
        size,
        sy,
        sx,
        pad,
        dilation,
        out_h,
        out_w,
        cuda._ptr(col),
        batch,
        c * h * w,
        pitch,
    )
    got = widened(cuda, col, p).reshape(rows, pitch)
    np.testing.assert_array_equal(
        got[:, :columns], round_to(want.astype(np.float32), p).reshape(rows, columns)
    )
    assert np.isnan(got[:, columns:]).all()


def _tiles(p):
    from darknet_py.ops.convolution import cuda_backward as cb

    if p == "fp32":
        return list(cb._WGRAD_F32_TILES), list(cb._DGRAD_F32_TILES)
    return list(cb._WGRAD_TC_TILES), list(cb._DGRAD_TC_TILES)


@gpu
@pytest.mark.parametrize("p", PRECISIONS)
def test_every_tile_and_split(cuda, p):
    wgrad_tiles, dgrad_tiles = _tiles(p)
    case = (19, 17, 15, 33, 3, 2, 1, 1, 1, 2)
    for i, tile in enumerate(wgrad_tiles):
        for splits in (1, 3, 7):
            cuda.wgrad_override = (tile, splits)
            cuda.dgrad_override = dgrad_tiles[i % len(dgrad_tiles)]
            try:
                _compare(cuda, p, case, 100 + i * 10 + splits, f"{p} {tile} split {splits}")
                _compare(cuda, p, CASES[3], 7 + i, f"{p} {tile} dilated")
            finally:
                cuda.wgrad_override = cuda.dgrad_override = None


@gpu
@pytest.mark.parametrize("p", ("fp32", "fp16"))
def test_weight_gradient_is_deterministic_over_many_splits(cuda, p):
    # a first layer's shape: few weights, a long K split thousands of ways
    case = (3, 64, 80, 32, 3, 1, 1, 1, 1, 8)
    a = _arrays(case, 21)
    first = _weight_grad(cuda, p, case, a)
    assert cuda.wgrad_plan(p, 32, 27, 8 * 64 * 80)[1] > 1
    for _ in range(3):
        np.testing.assert_array_equal(_weight_grad(cuda, p, case, a), first)
    want = _weight_grad(REF, p, case, a)
    assert_close(first, want, FP32_TOL if p == "fp32" else EMULATION_TOL, p)


TRAIN_CFG = """[net]
batch=4
width=20
height=18
channels=3
learning_rate=0.01
momentum=0.9
decay=0.0005

[convolutional]
batch_normalize=1
filters=12
size=3
stride=1
pad=1
activation=leaky

[convolutional]
filters=16
size=3
stride=2
pad=1
activation=logistic

[convolutional]
filters=16
size=3
groups=4
pad=1
activation=leaky

[route]
layers=-1,-2

[convolutional]
filters=8
size=1
activation=linear

[convolutional]
batch_normalize=1
filters=10
size=3
dilation=2
pad=1
activation=leaky

[avgpool]

[softmax]
"""


@gpu
@pytest.mark.parametrize("darknet", ("original", "alexeyab"))
@pytest.mark.parametrize("products", ("both", "weights", "data"))
def test_training_step_matches_the_im2col_backward(cuda, tmp_path, darknet, products):
    """A training step with the implicit products (both, or one beside the im2col path's
    other) against the im2col path: the same updates and deltas; the fork's flavour
    overwrites the input's delta (route and convolution both feed layer 1's)."""
    from helpers import param_arrays

    import darknet_py as dn

    cfg = tmp_path / "train.cfg"
    cfg.write_text(TRAIN_CFG)
    rng = np.random.default_rng(4)
    x = rng.random((4, 3, 18, 20), dtype=np.float32)
    truth = np.eye(10, dtype=np.float32)[rng.integers(0, 10, 4)]
    results = []
    for mode in ("never", "always"):
        net = dn.load_network(cfg, batch=4, device="cuda", seed=3, darknet=darknet)
        net.be.implicit_conv_backward = mode
        if mode == "always" and products != "both":
            net.be.conv_backward_implicit = lambda *a: (products == "weights", products == "data")
        before = param_arrays(net)
        net.train_pass(x, truth)
        steps = [after - b for after, b in zip(param_arrays(net), before)]
        results.append((steps, [net.layer_delta(i) for i in range(1, 6)]))
    (steps0, deltas0), (steps1, deltas1) = results
    assert max(np.max(np.abs(s)) for s in steps0) > 0
    # 1e-3 of the largest step, as helpers.assert_same_update: a weight gradient behind
    # batch norm (whose delta sums to zero per channel) cancels heavily, so the order of
    # its sums shows at ~2e-4 (seen on layer 0).
    for i, (a, b) in enumerate(zip(steps0, steps1)):
        assert_close(b, a, 1e-3, f"update of parameter array {i}")
    for i, (a, b) in enumerate(zip(deltas0, deltas1)):
        assert_close(b, a, 1e-5, f"delta of layer {i + 1}")


@gpu
def test_the_plans_route_yolov4s_shapes(monkeypatch):
    """The routing rules on shapes measured in NOTES B2 (the mixin alone: cuda_core needs
    PyCUDA to import)."""
    from darknet_py.ops.convolution import wgmma as cuda_wgmma
    from darknet_py.ops.convolution.cuda_backward import CudaConvBackward

    be = CudaConvBackward()
    be.sm_count = 132
    route = be.conv_backward_implicit
    # A GPU without the wgmma forward first (E10's route below).
    monkeypatch.setattr(cuda_wgmma, "forward_takes", lambda *args: False)
    assert route("fp16", 32, 64, 208, 208, 1, 1, 0, 1, 64) == (True, True)  # 1x1 at 208
    assert route("fp16", 32, 32, 416, 416, 3, 2, 1, 1, 64) == (True, True)  # stride 2
    assert route("fp16", 32, 512, 13, 13, 3, 1, 1, 1, 1024) == (False, False)  # deep 3x3
    assert route("fp16", 32, 512, 26, 26, 3, 2, 1, 1, 1024) == (False, True)
    assert route("fp16", 32, 256, 26, 26, 3, 1, 1, 1, 512) == (False, True)
    assert route("tf32", 1 << 20, 64, 208, 208, 1, 1, 0, 1, 64) == (False, False)  # int32
    assert route("fp32", 32, 3, 416, 416, 3, 1, 1, 1, 32) == (True, False)  # FFMA
    assert route("fp32", 32, 32, 208, 208, 3, 1, 1, 1, 64) == (False, False)
    assert route("fp32", 32, 64, 208, 208, 3, 2, 1, 1, 128) == (False, True)
    # E10: a unit-stride data gradient the wgmma forward takes goes to conv_data_grad (as
    # that forward of the deltas), unless its padding leaves the flipped one negative.
    monkeypatch.setattr(cuda_wgmma, "forward_takes", lambda *args: True)
    assert route("fp16", 32, 512, 13, 13, 3, 1, 1, 1, 1024) == (False, True)
    assert route("fp16", 32, 512, 13, 13, 3, 1, 3, 1, 1024) == (False, False)
    assert route("fp16", 32, 128, 13, 13, 3, 1, 1, 1, 256) == (False, False)  # few channels
    monkeypatch.setattr(be, "implicit_conv_backward", "never")
    assert route("fp16", 32, 64, 208, 208, 1, 1, 0, 1, 64) == (False, False)
    monkeypatch.setattr(be, "implicit_conv_backward", "1")
    with pytest.raises(BackendError, match="DARKNET_IMPLICIT_BACKWARD='1': use auto"):
        route("fp16", 32, 64, 208, 208, 1, 1, 0, 1, 64)
    assert be.wgrad_plan("fp16", 32, 27, 32 * 416 * 416) == ("32x64", 2112)
    assert be.wgrad_plan("fp16", 64, 288, 32 * 208 * 208) == ("64x64", 512)
    assert be.wgrad_plan("fp16", 1024, 4608, 32 * 169) == ("128x128", 2)
