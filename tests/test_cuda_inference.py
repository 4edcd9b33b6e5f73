"""The inference data path on the CUDA backend against NumPy: the fp32 convolution's fused
epilogue (bias, batch norm folded in, and activation written by the GEMM: one kernel),
the reduced-precision convolutions' epilogue in whole networks, and photos uploaded as
uint8 and letterboxed on the GPU (ops/images/preprocess.cu) against image.py.

GPU tests (marked gpu); outputs are poisoned with NaN before each run, inputs random.
"""

from pathlib import Path

import numpy as np
import pytest
from helpers import random_batch_norm
from test_cuda_ops import REF, assert_close, nan, rand, reduction_tol, run

import darknet_py as dn
from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.image import ImageError, from_bgr, letterbox, letterbox_size, resize_image

gpu = pytest.mark.gpu
SHARED = Path(__file__).resolve().parents[1].parent / "shared"
ACTIVATIONS = ("linear", "leaky", "mish", "logistic", "relu", "swish")
GEMM_PLANS = [
    ("128x128x8s4", 1),
    ("64x64x8s4r8", 1),
    ("32x32x8s4w", 1),
    ("64x64x8s4r8", 5),
    ("32x32x8s4w", 40),
    None,
]


def _epilogue_case(rng, m, n, k, ldc):
    a, b, biases = rand(rng, m * k), rand(rng, k * n), rand(rng, m)
    return (m, n, k, a, k, b, n, nan((m - 1) * ldc + n), ldc, biases)


# ---- fp32: gemm + bias + activation in one kernel -----------------------------------------


@gpu
@pytest.mark.parametrize("plan", GEMM_PLANS)
@pytest.mark.parametrize("m,n,k", [(3, 1001, 27), (255, 169, 512), (16, 333, 75), (64, 7, 4608)])
def test_gemm_bias_activate_against_numpy(cuda, plan, m, n, k):
    rng = np.random.default_rng(m * 131 + n * 7 + k)
    cuda.gemm_override = plan
    try:
        for activation in ACTIVATIONS + ("tanh",):  # tanh: a pass of its own after
            for ldc in (n, n + 3):
                case = _epilogue_case(rng, m, n, k, ldc)
                _, want = run(REF, "gemm_bias_activate", *case, activation)
                _, got = run(cuda, "gemm_bias_activate", *case, activation)
                assert_close(got[2], want[2], reduction_tol(k), f"{activation} ldc {ldc}")
    finally:
        cuda.gemm_override = None


@gpu
@pytest.mark.parametrize("plan", GEMM_PLANS)
def test_gemm_bias_activate_has_the_bits_of_gemm_then_bias_activate(cuda, plan):
    """fp32 stays Darknet-exact: the fused epilogue gives the bits the two ops gave."""
    rng = np.random.default_rng(5)
    m, n, k = 255, 507, 1152
    cuda.gemm_override = plan
    try:
        for activation in precisions.EPILOGUE_ACTIVATIONS:
            a, b, biases = (
                cuda.from_host(v) for v in (rand(rng, m * k), rand(rng, k * n), rand(rng, m))
            )
            apart, fused = cuda.from_host(nan(m * n)), cuda.from_host(nan(m * n))
            cuda.gemm(False, False, m, n, k, 1.0, a, k, b, n, 0.0, apart, n)
            cuda.bias_activate(apart, biases, 1, m, n, activation)
            cuda.gemm_bias_activate(m, n, k, a, k, b, n, fused, n, biases, activation)
            want, got = cuda.to_host(apart), cuda.to_host(fused)
            assert np.isfinite(got).all(), activation
            assert np.array_equal(got.view(np.uint32), want.view(np.uint32)), activation
    finally:
        cuda.gemm_override = None


CONV_NET = """[net]
width={w}
height={h}
channels=3
precision={p}

[convolutional]
batch_normalize=1
filters=255
size=3
stride=2
pad=1
activation=mish

[convolutional]
batch_normalize=1
filters=3
size=1
stride=1
activation=leaky

[convolutional]
filters=33
size=3
stride=2
pad=1
activation=logistic

[convolutional]
batch_normalize=1
filters=17
size=3
stride=1
pad=1
activation=relu

[convolutional]
filters=7
size=1
stride=1
activation=linear
"""


def _conv_nets(precision, batch, w=37, h=29):
    text = CONV_NET.format(w=w, h=h, p=precision)
    nets = []
    for device in ("cpu", "cuda"):
        sections = dn.cfg.parse_cfg_text(text, "conv_net.cfg")
        net = dn.Network(
            sections,
            "conv_net.cfg",
            batch=batch,
            backend=dn.backends.get_backend(device) if device == "cuda" else NumpyBackend(),
            seed=3,
        )
        random_batch_norm(net, np.random.default_rng(4), scales=True)
        net.params_changed()
        nets.append(net)
    return nets


def _poisoned_predict(net, x):
    net.set_batch(len(x))
    for layer in net.layers:
        net.be.fill(layer.output, np.nan)
    net.predict(x)
    return [net.layer_output(i) for i in range(len(net.layers))]


@gpu
@pytest.mark.parametrize("batch", [1, 5])
def test_fp32_network_with_fused_epilogues_matches_numpy(cuda, batch):
    """Batch norm folded at load, bias and activation in the GEMM epilogue: 3 and 255
    channels, stride 2, every epilogue activation, one image (GEMM into the output) and
    several (a chunk's product, then moved)."""
    cpu, gpu_net = _conv_nets("fp32", batch)
    x = np.random.default_rng(6).random((batch, 3, 29, 37), dtype=np.float32)
    for i, (got, want) in enumerate(zip(_poisoned_predict(gpu_net, x), _poisoned_predict(cpu, x))):
        assert_close(got.astype(np.float64), want.astype(np.float64), 1e-5, f"layer {i}")


@gpu
@pytest.mark.parametrize("p", ["fp16", "bf16"])
def test_reduced_network_epilogue_matches_the_emulation(cuda, p, monkeypatch):
    """fp16 / bf16: folded batch norm, bias and the activation (in fp32) in the implicit
    GEMM's epilogue, against the NumPy emulation of the precision. Tolerance 3e-3 (fp16)
    and 2e-2 (bf16) of the largest output: the sums' order differs, and a next layer may
    round an operand the other way."""
    monkeypatch.delenv(precisions.ENV, raising=False)
    cpu, gpu_net = _conv_nets(p, 3)
    x = np.random.default_rng(7).random((3, 3, 29, 37), dtype=np.float32)
    tol = {"fp16": 3e-3, "bf16": 2e-2}[p]
    for i, (got, want) in enumerate(zip(_poisoned_predict(gpu_net, x), _poisoned_predict(cpu, x))):
        assert_close(got.astype(np.float64), want.astype(np.float64), tol, f"{p} layer {i}")


# ---- photos: uint8 upload, letterbox on the GPU --------------------------------------------

IMAGE_SIZES = [(480, 640), (416, 416), (1, 9), (9, 1), (1, 1), (300, 17), (17, 300), (101, 103)]


def _photos(rng):
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in IMAGE_SIZES]


def _host_sized(photo, width, height, letter):
    img = from_bgr(photo, 3)
    return letterbox(img, width, height) if letter else resize_image(img, width, height)


@gpu
@pytest.mark.parametrize("letter", [True, False])
@pytest.mark.parametrize("width,height", [(416, 416), (33, 17), (64, 96)])
def test_letterbox_images_has_image_py_bits(cuda, letter, width, height):
    rng = np.random.default_rng(width * 7 + height + letter)
    photos, degenerate = [], []  # letterboxing leaves no pixel row or column of the latter
    for p in _photos(rng):
        fits = min(letterbox_size(p.shape[1], p.shape[0], width, height)) >= 1 or not letter
        (photos if fits else degenerate).append(p)
    for p in degenerate:  # refused in one clear line, as on the host
        with pytest.raises(ImageError, match="letterboxed into"):
            cuda.letterbox_images(
                cuda.upload_bytes_async(p)[0],
                [p.shape[:2]],
                [0],
                width,
                height,
                letter,
                cuda.empty(3 * height * width),
            )
    flat = np.concatenate([p.reshape(-1) for p in photos])
    offsets = np.cumsum([0] + [p.size for p in photos[:-1]])
    shapes = [p.shape[:2] for p in photos]
    src, upload = cuda.upload_bytes_async(flat)
    cuda.wait_upload(upload)
    out = cuda.from_host(nan(len(photos) * 3 * height * width))
    cuda.letterbox_images(src, shapes, offsets, width, height, letter, out)
    got = cuda.to_host(out).reshape(len(photos), 3, height, width)
    cuda.finish_upload(upload)
    for i, photo in enumerate(photos):
        want = _host_sized(photo, width, height, letter)
        diff = np.abs(got[i].astype(np.float64) - want)
        assert np.isfinite(got[i]).all(), f"image {photo.shape}: unwritten values"
        assert np.array_equal(got[i], want), (
            f"image {photo.shape}: {np.count_nonzero(diff)} "
            f"values differ, by up to {diff.max():.3g}"
        )


@gpu
def test_predict_from_uint8_photos_equals_predict_from_host_letterboxed(cuda):
    """predict on an (N, H, W, 3) uint8 batch (bytes uploaded, letterboxed on the GPU) gives
    the outputs of predict on the same photos letterboxed on the host as float32."""
    _, net = _conv_nets("fp32", 4, w=64, h=48)
    rng = np.random.default_rng(8)
    photos = rng.integers(0, 256, (6, 75, 50, 3), dtype=np.uint8)
    host = np.stack([_host_sized(p, 64, 48, True) for p in photos])
    want = net.predict(host)
    net.be.fill(net._input_buf, np.nan)
    got = net.predict(photos)
    assert np.array_equal(got, want)
    got_list = net.predict([p for p in photos])  # a list of photos: the same
    assert np.array_equal(got_list, want)
    # in parts (part k+1's bytes and part k-1's output copy beside part k's layers): as
    # the float batch in the same parts
    assert np.array_equal(net.predict_in_parts(photos, 2), net.predict_in_parts(host, 2))


@gpu
@pytest.mark.skipif(
    not (SHARED / "fixtures" / "p2_tinyyolo").is_dir(), reason="Darknet fixtures not found"
)
def test_detect_on_photo_files_matches_the_cpu(cuda):
    """detect on photo files: the GPU letterboxes the decoded bytes into the input the CPU
    makes on the host (the same bits), and the heads' outputs agree."""
    d = SHARED / "fixtures" / "p2_tinyyolo"
    images = sorted(str(p) for p in (SHARED / "images").glob("*.jpg"))
    assert images, "no photos in ../shared/images"
    nets = {}
    for device in ("cpu", "cuda"):
        net = nets[device] = dn.load_network(
            d / "p2_tinyyolo.cfg", d / "p2_tinyyolo.weights", device=device, engine="numpy"
        )
        net.detect(images, thresh=0.25, batch=len(images))
    cpu, gpu_net = nets["cpu"], nets["cuda"]
    assert np.array_equal(gpu_net.be.to_host(gpu_net._input_buf), cpu._input_buf)
    for i in (16, 23):  # the yolo heads
        assert_close(
            gpu_net.layer_output(i).astype(np.float64),
            cpu.layer_output(i).astype(np.float64),
            1e-4,
            f"head {i}",
        )


def test_predict_from_photos_on_the_cpu_equals_predict_from_host_letterboxed():
    """The photo path's plumbing (parts, offsets, input slices) on the NumPy backend, whose
    letterbox_images is image.py's: photos of mixed sizes, 7 of them in parts of 2."""
    text = CONV_NET.format(w=20, h=16, p="fp32")
    net = dn.Network(
        dn.cfg.parse_cfg_text(text, "conv_net.cfg"),
        "conv_net.cfg",
        batch=1,
        backend=NumpyBackend(),
        seed=3,
    )
    random_batch_norm(net, np.random.default_rng(4), scales=True)
    rng = np.random.default_rng(9)
    photos = [
        rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        for h, w in [(30, 40), (16, 20), (5, 50), (50, 5), (1, 1), (17, 19), (64, 48)]
    ]
    want = net.predict(np.stack([_host_sized(p, 20, 16, True) for p in photos]))
    got = net.predict(photos)
    assert got.shape == want.shape and np.array_equal(got, want)
    square = [p[:16, :16] for p in photos if p.shape[0] >= 16 and p.shape[1] >= 16]
    want = net.predict_in_parts(np.stack([_host_sized(p, 20, 16, True) for p in square]), 1)
    assert np.array_equal(net.predict_in_parts(square, 1), want)
    assert net.as_photos(np.zeros((2, 3, 16, 20), np.float32)) is None  # float input
    with pytest.raises(ImageError, match="300 x 1 pixels letterboxed into 20 x 16 is 20 x 0"):
        net.predict(np.zeros((1, 300, 3), np.uint8))
