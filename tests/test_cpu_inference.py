"""The CPU inference path: batch norm folded into the convolution weights, the fused
bias + activation, maxpool without argmax indexes. Each must give what the exact path
(Darknet's unfolded normalisation, separate passes) gives."""

import time
from pathlib import Path

import numpy as np
import pytest
from test_cuda_ops import MAXPOOL_CASES  # the last has windows wholly in the padding

import darknet_py
from darknet_py import activations
from darknet_py.backends import cpu_threads
from darknet_py.backends.numpy_backend import NumpyBackend

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
FIXTURES = SHARED / "fixtures"
TINY_CFG = SHARED / "darknet-cfg" / "yolov3-tiny.cfg"
TINY_WEIGHTS = SHARED / "weights" / "yolov3-tiny.weights"
TOLERANCE = 1e-4  # relative, as tests/test_fixtures.py


def rel_error(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / (np.abs(b).max() or 1.0))


def all_outputs(net, x, fold):
    net.fold_batchnorm = fold
    net.predict(x)
    return [net.layer_output(i) for i in range(len(net.layers))]


# ---- backend ops ---------------------------------------------------------------


@pytest.mark.parametrize("activation", activations.ACTIVATIONS)
@pytest.mark.parametrize("batch,n,size", [(1, 3, 70001), (2, 5, 13), (3, 40, 1700)])
def test_bias_activate_equals_add_bias_then_activate(activation, batch, n, size):
    be = NumpyBackend()
    rng = np.random.default_rng(n * size)
    x = rng.uniform(-6, 6, batch * n * size).astype(np.float32)
    biases = rng.uniform(-1, 1, n).astype(np.float32)
    want = x.copy()
    be.add_bias(want, biases, batch, n, size)
    want = activations.activate(want, activation)
    got = x.copy()
    be.bias_activate(got, biases, batch, n, size, activation)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("activation", activations.ACTIVATIONS)
def test_activate_in_place_equals_the_formula(activation):
    # Longer than one block of the in-place loop, with extremes that overflow exp().
    x = np.random.default_rng(3).uniform(-8, 8, 200003).astype(np.float32)
    x[:4] = [-1000, 1000, 0, -0.0]
    got = x.copy()
    NumpyBackend().activate(got, activation)
    np.testing.assert_array_equal(got, activations.activate(x, activation))


def test_parallel_covers_every_item_once_and_raises_a_workers_error(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_THREADS", 2)
    monkeypatch.setattr(cpu_threads, "_FIXED_THREADS", 2)  # whatever the machine's load
    seen = np.zeros(1000, dtype=np.int64)
    parts = []

    def work(start, stop):
        parts.append((start, stop))
        seen[start:stop] += 1

    cpu_threads.parallel(1000, work, 10)
    assert (seen == 1).all() and len(parts) == 8  # 4 parts per thread
    parts.clear()
    cpu_threads.parallel(1000, work, 600)  # too little work to split
    assert parts == [(0, 1000)]

    def fail(start, stop):
        if start > 0:
            raise ValueError(f"part at {start}")

    with pytest.raises(ValueError, match="part at"):
        cpu_threads.parallel(1000, fail, 10)


def test_parallel_splits_the_same_way_whatever_the_load(monkeypatch):
    # A part's bounds can decide its values' last bits: they follow the machine's cores,
    # not how many threads the load leaves this moment.
    monkeypatch.setattr(cpu_threads, "_THREADS", 2)
    splits = []
    for threads in (1, 2):
        monkeypatch.setattr(cpu_threads, "_FIXED_THREADS", threads)
        parts = []
        cpu_threads.parallel(1000, lambda start, stop: parts.append((start, stop)), 10)
        splits.append(sorted(parts))
    assert splits[0] == splits[1] and len(splits[0]) == 8


@pytest.mark.skipif(cpu_threads._SET_BLAS_THREADS is None, reason="no OpenBLAS thread setter")
def test_gemm_tiles_run_on_one_blas_thread_while_others_finish(monkeypatch):
    # NumPy's OpenBLAS keeps one thread count for the whole process: a pool thread done
    # with its tiles must not hand BLAS its threads back while another still computes one
    # (OpenBLAS would split that tile its own way, and its sums would change with timing:
    # a CI run's losses once differed in the 7th digit).
    from darknet_py.ops.convolution import numpy as conv_numpy

    monkeypatch.setattr(cpu_threads, "_THREADS", 2)
    monkeypatch.setattr(cpu_threads, "_FIXED_THREADS", 2)
    tile = conv_numpy._gemm_tile
    counts = []

    def counted_tile(*args):
        time.sleep(0.002)  # long enough for the other thread to run out of parts
        before = cpu_threads._SET_BLAS_THREADS(1)  # reads the count (and puts it back)
        cpu_threads._SET_BLAS_THREADS(before)
        counts.append(before)
        tile(*args)

    monkeypatch.setattr(conv_numpy, "_gemm_tile", counted_tile)
    rng = np.random.default_rng(1)
    m, n, k = 8, 16 * conv_numpy._GEMM_COLUMNS, 9
    a, b = rng.normal(size=m * k).astype(np.float32), rng.normal(size=k * n).astype(np.float32)
    c = np.zeros(m * n, np.float32)
    for _ in range(3):
        NumpyBackend().gemm(False, False, m, n, k, 1.0, a, k, b, n, 0.0, c, n)
    assert len(counts) == 48 and set(counts) == {1}
    np.testing.assert_allclose(c.reshape(m, n), a.reshape(m, k) @ b.reshape(k, n), atol=1e-5)


def test_threads_now_leaves_the_cores_other_processes_use(monkeypatch):
    monkeypatch.setattr(cpu_threads, "_THREADS", 4)
    monkeypatch.setattr(cpu_threads, "_threads_checked", float("-inf"))
    assert 1 <= cpu_threads.threads_now() <= 4
    monkeypatch.setattr(cpu_threads, "_FIXED_THREADS", 3)
    assert cpu_threads.threads_now() == 3
    # The count the GEMM asks BLAS for is never above what BLAS was given.
    if cpu_threads._SET_BLAS_THREADS:
        before = cpu_threads._SET_BLAS_THREADS(1)
        cpu_threads._SET_BLAS_THREADS(before)
        with cpu_threads.blas_threads(before + 5):
            inside = cpu_threads._SET_BLAS_THREADS(before)
        assert inside == before
        with cpu_threads.blas_threads(1):
            inside = cpu_threads._SET_BLAS_THREADS(1)
        assert inside == 1
        after = cpu_threads._SET_BLAS_THREADS(before)
        assert after == before


@pytest.mark.parametrize("batch,c,h,w,size,stride,padding", MAXPOOL_CASES)
def test_maxpool_without_indexes_gives_the_same_maxima(batch, c, h, w, size, stride, padding):
    be = NumpyBackend()
    x = np.random.default_rng(size * h + c).standard_normal(batch * c * h * w).astype(np.float32)
    out_h = (h + padding - size) // stride + 1
    out_w = (w + padding - size) // stride + 1
    n_out = batch * c * out_h * out_w
    want, got = np.full(n_out, np.nan, np.float32), np.full(n_out, np.nan, np.float32)
    be.maxpool_forward(x, batch, c, h, w, size, stride, padding, want, be.int_zeros(n_out))
    be.maxpool_forward(x, batch, c, h, w, size, stride, padding, got, None)
    np.testing.assert_array_equal(got, want)
    if padding == 8:
        assert np.isneginf(got).any()


@pytest.mark.parametrize(
    "size,stride_x,stride_y,padding", [(2, 1, 2, 1), (3, 2, 1, 2), (2, 2, 1, 0), (3, 3, 2, 4)]
)
def test_maxpool_xy_without_indexes_gives_the_same_maxima(size, stride_x, stride_y, padding):
    be = NumpyBackend()
    batch, c, h, w = 2, 3, 9, 11
    x = np.random.default_rng(size).standard_normal(batch * c * h * w).astype(np.float32)
    n_out = (
        batch * c * ((h + padding - size) // stride_y + 1) * ((w + padding - size) // stride_x + 1)
    )
    want, got = np.full(n_out, np.nan, np.float32), np.full(n_out, np.nan, np.float32)
    args = (x, batch, c, h, w, size, stride_x, stride_y, padding)
    be.maxpool_forward_xy(*args, want, be.int_zeros(n_out))
    be.maxpool_forward_xy(*args, got, None)
    np.testing.assert_array_equal(got, want)


# ---- folded batch norm -----------------------------------------------------------

fixtures = pytest.mark.skipif(
    not (FIXTURES / "README.md").is_file(), reason=f"Darknet fixtures not found at {FIXTURES}"
)


@fixtures
@pytest.mark.parametrize("name", ["p1_classifier", "p2_tinyyolo"])
def test_folded_and_unfolded_inference_both_match_darknet(name):
    d = FIXTURES / name
    ref = np.load(d / f"{name}.npz")
    net = darknet_py.load_network(
        d / f"{name}.cfg", d / f"{name}.weights", device="cpu", engine="numpy"
    )
    assert any(getattr(l, "batch_normalize", 0) for l in net.layers)
    folded = all_outputs(net, ref["input"], fold=True)
    unfolded = all_outputs(net, ref["input"], fold=False)
    for i, (f, u) in enumerate(zip(folded, unfolded)):
        darknet = ref[f"layer_{i}"]
        assert rel_error(f, darknet) < TOLERANCE, f"layer {i} folded vs Darknet"
        assert rel_error(u, darknet) < TOLERANCE, f"layer {i} unfolded vs Darknet"
        assert rel_error(f, u) < TOLERANCE, f"layer {i} folded vs unfolded"
    # Folding changes the rounding, so the two paths are not bit-identical on BN layers.
    assert any(not np.array_equal(f, u) for f, u in zip(folded, unfolded))


@fixtures
def test_the_fold_is_remade_after_training_and_after_loading():
    d = FIXTURES / "p3_train_classifier"
    ref = np.load(d / "p3_train_classifier.npz")
    net = darknet_py.load_network(
        d / "p3_train_classifier.cfg",
        d / "p3_train_classifier.weights",
        device="cpu",
        engine="numpy",
    )
    x = ref["input"]
    before = all_outputs(net, x, fold=True)[-2]
    net.train_pass(x, ref["truth"])  # moves weights, biases, scales and rolling stats
    after_update = all_outputs(net, x, fold=True)[-2]
    assert rel_error(after_update, all_outputs(net, x, fold=False)[-2]) < TOLERANCE
    assert rel_error(after_update, before) > 10 * TOLERANCE  # the step did change the output
    net.load_weights(d / "p3_train_classifier.weights")
    np.testing.assert_allclose(all_outputs(net, x, fold=True)[-2], before, rtol=0, atol=1e-6)


real_weights = pytest.mark.skipif(
    not TINY_WEIGHTS.is_file(), reason=f"real weights not found at {TINY_WEIGHTS}"
)


# cap 1: one image per GEMM, straight into the output; 1 << 25: all five in one GEMM.
@pytest.mark.parametrize("cap", [1, 1 << 25])
def test_folded_inference_with_groups_and_chunks(monkeypatch, cap):
    from test_conv_chunks import CFG  # BN conv with groups=2, a 1x1 conv, a dilated conv

    from darknet_py.cfg import parse_cfg_text
    from darknet_py.layers import convolutional

    monkeypatch.setattr(convolutional, "WORKSPACE_CAP_FLOATS", cap)
    net = darknet_py.Network(parse_cfg_text(CFG, "chunks.cfg"), "chunks.cfg", seed=4)
    rng = np.random.default_rng(5)
    conv = net.layers[0]
    for name, low, high in (
        ("rolling_mean", -0.5, 0.5),
        ("rolling_variance", 0.5, 2.0),
        ("scales", 0.5, 1.5),
        ("biases", -0.5, 0.5),
    ):
        net.be.write(getattr(conv, name), rng.uniform(low, high, conv.out_c))
    x = rng.random((5, 4, 9, 11), dtype=np.float32)
    folded = all_outputs(net, x, fold=True)
    unfolded = all_outputs(net, x, fold=False)
    assert conv._chunk(5) == (1 if cap == 1 else 5)
    for i in range(3):
        assert rel_error(folded[i], unfolded[i]) < 1e-5, i


@real_weights
def test_folding_keeps_real_yolov3_tiny_outputs_and_detections():
    net = darknet_py.load_network(TINY_CFG, TINY_WEIGHTS, batch=1, device="cpu", engine="numpy")
    net.names = (SHARED / "weights" / "coco.names").read_text().split("\n")
    for photo in sorted((SHARED / "images").glob("*.jpg")):
        x = darknet_py.letterbox(darknet_py.load_image(photo), 416, 416)[None]
        folded = all_outputs(net, x, fold=True)
        dets_folded = net.detect(str(photo), thresh=0.25)
        unfolded = all_outputs(net, x, fold=False)
        dets_unfolded = net.detect(str(photo), thresh=0.25)
        for i in (15, 16, 22, 23):  # the last convolutions and the YOLO heads
            assert rel_error(folded[i], unfolded[i]) < TOLERANCE, f"{photo.name} layer {i}"
        assert [d.name for d in dets_folded] == [d.name for d in dets_unfolded], photo.name
        for a, b in zip(dets_folded, dets_unfolded):
            assert abs(a.prob - b.prob) < 1e-4 and np.allclose(a.box, b.box, atol=1e-4)
        if photo.name == "dog.jpg":
            # What the C Darknet prints, a line per class above thresh (../shared/weights/
            # README.md); its own JPEG decoder and resize move the percentages by under 1.
            darknet = sorted(
                [
                    ("bicycle", 59),
                    ("car", 52),
                    ("car", 62),
                    ("dog", 57),
                    ("truck", 43),
                    ("truck", 56),
                ]
            )
            found = sorted(
                (net.names[c], 100 * float(p))
                for d in dets_folded
                for c, p in enumerate(d.probs)
                if p > 0.25
            )
            assert [n for n, _ in found] == [n for n, _ in darknet]
            assert all(abs(p - q) < 1.0 for (_, p), (_, q) in zip(found, darknet)), found


# ---- process start ----------------------------------------------------------------


def test_import_and_a_cpu_detect_never_import_pycuda(tmp_path):
    # A stand-in pycuda first on the path leaves a mark if anything imports it.
    import subprocess
    import sys

    fake = tmp_path / "site" / "pycuda"
    fake.mkdir(parents=True)
    mark = tmp_path / "pycuda-imported"
    (fake / "__init__.py").write_text(f"open({str(mark)!r}, 'w').close()\n")
    repo = Path(__file__).resolve().parents[1]
    env = {"PYTHONPATH": f"{tmp_path / 'site'}:{repo}", "PATH": "/usr/bin:/bin"}
    fixture = FIXTURES / "p2_tinyyolo"
    probe = subprocess.run([sys.executable, "-c", "import pycuda"], env=env)
    assert probe.returncode == 0 and mark.exists()  # the stand-in works
    mark.unlink()
    run = subprocess.run([sys.executable, "-c", "import darknet_py"], env=env)
    assert run.returncode == 0 and not mark.exists()
    if fixture.is_dir():
        run = subprocess.run(
            [
                sys.executable,
                "-m",
                "darknet_py",
                "detect",
                fixture / "p2_tinyyolo.cfg",
                fixture / "p2_tinyyolo.weights",
                SHARED / "images" / "dog.jpg",
                "--device",
                "cpu",
                "--out",
                tmp_path / "out.jpg",
            ],
            env=env,
            capture_output=True,
        )
        assert run.returncode == 0, run.stderr
        assert not mark.exists()


@pytest.mark.parametrize(
    "m,n,k,ta,tb",
    [(16, 5000, 27, False, False), (300, 169, 200, False, True), (64, 2100, 75, True, False)],
)
def test_gemm_does_not_depend_on_the_thread_count(monkeypatch, m, n, k, ta, tb):
    """The NumPy backend's products give the same bits whatever number of threads the
    machine's load allows (OpenBLAS's sums depend on how a product is split)."""
    rng = np.random.default_rng(m)
    a = rng.standard_normal(m * k).astype(np.float32)
    b = rng.standard_normal(k * n).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        monkeypatch.setattr(cpu_threads, "threads_now", lambda: threads)
        c = np.full(m * n, 0.5, dtype=np.float32)
        NumpyBackend().gemm(ta, tb, m, n, k, 1.5, a, m if ta else k, b, k if tb else n, 0.25, c, n)
        results.append(c)
    for c in results[1:]:
        np.testing.assert_array_equal(c, results[0])
    A = a.reshape(k, m).T if ta else a.reshape(m, k)
    B = b.reshape(n, k).T if tb else b.reshape(k, n)
    np.testing.assert_allclose(results[0].reshape(m, n), 1.5 * A @ B + 0.125, rtol=1e-4, atol=1e-4)
