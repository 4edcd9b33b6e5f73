"""The Hopper GEMM (ops/convolution/gemm_wgmma.cu through ops/convolution/wgmma.py) against NumPy.

GPU tests, skipped on a GPU other than compute capability 9.0. Every product runs on fresh
random operands with a NaN-poisoned C (beta = 0) or a random C (beta != 0), on shapes that
divide no tile (M, N, K of 1, 3, 255, ...), in each layout gemm_lowp takes (nn, nt, tn), in
fp16 and bf16. Tolerances (max |got - want| / max |want|, test_precision.assert_close):
  * 1e-4 against NumPy multiplying the same rounded operands in float64 (what is left is
    the order of the fp32 sums);
  * 3e-3 (fp16) and 2e-2 (bf16) against the exact product of the unrounded operands.
CPU tests check the host side that needs no GPU: the prebuilt build's sm_90a target.
"""

import numpy as np
import pytest
from test_cuda_ops import assert_close, nan, rand
from test_prebuilt_kernels import FAKE_NVCC

from darknet_py.backends import prebuilt
from darknet_py.precision import round_to

gpu = pytest.mark.gpu
HALF = ("fp16", "bf16")
EMULATION_TOL = 1e-4
PRECISION_TOL = {"fp16": 3e-3, "bf16": 2e-2}
LAYOUTS = [(0, 0), (0, 1), (1, 0)]
# (m, n, k): odd sizes, a single row or column, K under one 64-wide slice, tiles with edges
# (C rows a multiple of 4 floats with beta = 0 go out through TMA stores, the others from
# the registers: both kinds here)
SHAPES = [
    (255, 3, 255),
    (3, 255, 3),
    (1, 1, 1),
    (129, 257, 65),
    (300, 520, 1000),
    (128, 256, 64),
    (1000, 777, 333),
    (255, 516, 100),
]


@pytest.fixture(scope="module")
def hopper(cuda):
    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    if cuda_wgmma.kernels(cuda) is None:
        pytest.skip("the wgmma kernels need compute capability 9.0")
    return cuda_wgmma


def _product(p, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, rounded=True):
    """alpha * op(A) @ op(B) + beta * C in float64 (rows ldc apart; other C entries kept)."""

    def op(x, rows, cols, ld, t):
        x = (round_to(x, p) if rounded else x).astype(np.float64)
        return x.reshape(-1, ld)[:cols, :rows].T if t else x.reshape(-1, ld)[:rows, :cols]

    out = c.astype(np.float64).reshape(m, ldc).copy()
    prod = op(a, m, k, lda, ta) @ op(b, k, n, ldb, tb)
    out[:, :n] = alpha * prod + (beta * out[:, :n] if beta != 0 else 0.0)
    return out.reshape(-1)


def half_bits(x, p):
    """float32 values rounded to p, as the float16 array holding their bits."""
    r = round_to(x, p)
    return (
        r.astype(np.float16)
        if p == "fp16"
        else (r.view(np.uint32) >> 16).astype(np.uint16).view(np.float16)
    )


def _case(rng, ta, tb, m, n, k, pad):
    """Operands with leading dimensions `pad` past their rows' width, C rows 2 * pad wider."""
    lda = (m if ta else k) + pad
    ldb = (k if tb else n) + pad
    a = rand(rng, (k if ta else m) * lda)
    b = rand(rng, (n if tb else k) * ldb)
    return a, lda, b, ldb, n + 2 * pad


def _run(cuda, hopper, p, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    A, B, C = cuda.from_host(a), cuda.from_host(b), cuda.from_host(c)
    assert hopper.gemm_lowp(
        cuda, p, ta, tb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc, force=True
    )
    return np.asarray(cuda.to_host(C), np.float64)


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("ta,tb", LAYOUTS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_wgmma_gemm_matches_numpy(cuda, hopper, p, ta, tb, m, n, k):
    rng = np.random.default_rng(hash((p, ta, tb, m, n, k)) % 2**32)
    for beta, pad in ((0.0, 0), (0.5, 5)):
        a, lda, b, ldb, ldc = _case(rng, ta, tb, m, n, k, pad)
        c = nan(m * ldc) if beta == 0 else rand(rng, m * ldc)
        got = _run(cuda, hopper, p, ta, tb, m, n, k, 0.75, a, lda, b, ldb, beta, c, ldc)
        inside = got.reshape(m, ldc)[:, :n]
        assert not np.isnan(inside).any(), f"{p} {m}x{n}x{k}: C entries left unwritten"
        if beta == 0 and ldc > n:  # nothing written past each row's n
            assert np.isnan(got.reshape(m, ldc)[:, n:]).all()
        want = _product(p, ta, tb, m, n, k, 0.75, a, lda, b, ldb, beta, np.nan_to_num(c), ldc)
        assert_close(
            inside, want.reshape(m, ldc)[:, :n], EMULATION_TOL, f"{p} {m}x{n}x{k} beta {beta}"
        )
        if beta == 0:  # (beta * C may cancel the product: no relative bound on a few terms)
            exact = _product(p, ta, tb, m, n, k, 0.75, a, lda, b, ldb, beta, c, ldc, rounded=False)
            assert_close(inside, exact.reshape(m, ldc)[:, :n], PRECISION_TOL[p], f"{p} exact")


@gpu
@pytest.mark.parametrize("p", HALF)
def test_gemm_lowp_takes_the_wgmma_path_for_a_large_product(cuda, hopper, p):
    """Through CudaBackend.gemm_lowp: a product that fills the chip goes to wgmma and agrees
    with the mma.sync kernels (forced by tc_override) to fp32 rounding."""
    m, n, k = 1536, 23 * 256 - 7, 300
    assert hopper.handles(cuda, p, m, n, k)
    rng = np.random.default_rng(5)
    a, b = rand(rng, m * k), rand(rng, k * n)
    A, B = cuda.from_host(a), cuda.from_host(b)
    outs = []
    for override in (None, ("128x128", 1)):
        cuda.tc_override = override
        try:
            assert hopper.handles(cuda, p, m, n, k) == (override is None)
            C = cuda.from_host(nan(m * n))
            cuda.gemm_lowp(p, 0, 0, m, n, k, 1.0, A, k, B, n, 0.0, C, n)
            outs.append(np.asarray(cuda.to_host(C), np.float64))
        finally:
            cuda.tc_override = None
    assert not np.isnan(outs[0]).any()
    rows = rng.choice(m, 64, replace=False)
    want = round_to(a, p).astype(np.float64).reshape(m, k)[rows] @ round_to(b, p).astype(
        np.float64
    ).reshape(k, n)
    assert_close(outs[0].reshape(m, n)[rows], want, EMULATION_TOL, f"{p} wgmma")
    assert_close(outs[0], outs[1], EMULATION_TOL, f"{p} wgmma vs mma.sync")


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("m", [128, 77])
def test_a_product_of_one_tile_row_runs_on_lone_blocks(cuda, hopper, p, m, monkeypatch):
    """m <= 128: the lone-block build (clusters of one) takes the product, split K or not,
    and agrees with the NumPy emulation; above 128 rows the pairs keep it."""
    solo = hopper.solo_kernels(cuda)
    assert solo is not None and solo.cluster == 1
    assert solo.max_clusters > hopper.kernels(cuda).max_clusters  # lone blocks: about twice
    used = []
    launch = hopper._launch
    monkeypatch.setattr(
        hopper,
        "_launch",
        lambda be, kern, name, *args, **kw: (
            used.append((name, kern.cluster)),
            launch(be, kern, name, *args, **kw),
        )[1],
    )
    rng = np.random.default_rng(m)
    for n, k in ((4000, 640), (300, 20000)):  # one run; K split into runs
        a, b = rand(rng, m * k), rand(rng, k * n)
        used.clear()
        got = _run(cuda, hopper, p, 0, 0, m, n, k, 1.0, a, k, b, n, 0.0, nan(m * n), n)
        assert (f"wgmma_gemm_{hopper.PRECISIONS[p][0]}", 1) in used
        want = _product(p, 0, 0, m, n, k, 1.0, a, k, b, n, 0.0, np.zeros(m * n), n)
        assert_close(got, want, EMULATION_TOL, f"{p} {m}x{n}x{k}")
    used.clear()
    _run(
        cuda,
        hopper,
        p,
        0,
        0,
        129,
        512,
        256,
        1.0,
        rand(rng, 129 * 256),
        256,
        rand(rng, 256 * 512),
        512,
        0.0,
        nan(129 * 512),
        512,
    )
    assert (f"wgmma_gemm_{hopper.PRECISIONS[p][0]}", 2) in used


@gpu
@pytest.mark.parametrize("p", HALF)
def test_gemm_half_on_half_operands(cuda, hopper, p):
    m, n, k = 300, 700, 190
    rng = np.random.default_rng(9)
    a, b = rand(rng, m * 192), rand(rng, n * 200)  # rows 192 and 200 apart (multiples of 8)
    A, B = cuda._new(a.size, np.float16), cuda._new(b.size, np.float16)
    cuda.write(A, half_bits(a, p))
    cuda.write(B, half_bits(b, p))
    C = cuda.from_host(nan(m * n))
    hopper.gemm_half(cuda, p, m, n, k, 2.0, A, 192, B, 200, 0.0, C, n)
    want = 2.0 * (
        round_to(a, p).astype(np.float64).reshape(m, 192)[:, :k]
        @ round_to(b, p).astype(np.float64).reshape(n, 200)[:, :k].T
    )
    assert_close(np.asarray(cuda.to_host(C), np.float64), want.reshape(-1), EMULATION_TOL, p)
    with pytest.raises(ValueError, match="multiple of 8"):
        hopper.gemm_half(cuda, p, m, n, k, 1.0, A, 190, B, 200, 0.0, C, n)


@gpu
def test_handles_declines_what_mma_sync_does_better(cuda, hopper):
    assert not hopper.handles(cuda, "tf32", 4096, 4096, 4096)
    assert not hopper.handles(cuda, "fp16", 4096, 4096, 16)  # too thin for the conversion
    assert not hopper.handles(cuda, "fp16", 288, 692224, 64)  # memory-bound data gradient
    assert hopper.handles(cuda, "fp16", 4096, 4096, 4096)
    assert hopper.handles(cuda, "fp16", 256, 1152, 200000)  # weight gradient: split K
    assert not hopper.handles(cuda, "fp16", 1, 1000, 4096)  # a batch of 1: mma.sync


@gpu
def test_split_plan_splits_only_products_of_few_tiles(cuda, hopper):
    kern = hopper.kernels(cuda)
    assert hopper.split_plan(kern, 4096, 4096, 4096) == (64, 1)  # 128 pairs of tiles
    per, runs = hopper.split_plan(kern, 256, 1152, 86528)  # 5 pairs
    assert runs > 1 and per * runs >= 86528 // 64 and (runs - 1) * per < -(-86528 // 64)
    assert 5 * runs <= 2 * kern.max_clusters  # at most two waves
    per, runs = hopper.split_plan(kern, 24, 1024, 5408)  # a head's 24 filters
    assert runs > 1


@gpu
@pytest.mark.parametrize("p", HALF)
@pytest.mark.parametrize("runs", [2, 3, 7])
@pytest.mark.parametrize(
    "m,n,k", [(255, 3, 1000), (129, 257, 700), (300, 520, 1000), (64, 1152, 4100)]
)
def test_split_k_matches_numpy(cuda, hopper, p, runs, m, n, k):
    """K split into runs (forced by split_override), the partials added by splitk_reduce:
    alpha and beta applied once, nothing written past each row of C, the same tolerances."""
    rng = np.random.default_rng(hash((p, runs, m, n, k)) % 2**32)
    hopper.split_override = runs
    try:
        assert 1 < hopper.split_plan(hopper.kernels(cuda), m, n, k)[1] <= runs
        for beta, pad in ((0.0, 3), (0.5, 5)):
            a, lda, b, ldb, ldc = _case(rng, 0, 1, m, n, k, pad)
            c = nan(m * ldc) if beta == 0 else rand(rng, m * ldc)
            got = _run(cuda, hopper, p, 0, 1, m, n, k, 0.75, a, lda, b, ldb, beta, c, ldc)
            rows = got.reshape(m, ldc)
            assert not np.isnan(rows[:, :n]).any()
            if beta == 0:
                assert np.isnan(rows[:, n:]).all()
            want = _product(p, 0, 1, m, n, k, 0.75, a, lda, b, ldb, beta, np.nan_to_num(c), ldc)
            assert_close(
                rows[:, :n],
                want.reshape(m, ldc)[:, :n],
                EMULATION_TOL,
                f"{p} {m}x{n}x{k} in {runs} runs, beta {beta}",
            )
    finally:
        hopper.split_override = None


# ---- host side (no GPU) ----------------------------------------------------------------


def test_split_plan_cost_model_on_an_h100_or_h200_shape():
    """split_plan's choices for a chip of 66 clusters of 2 (what H100 and H200 report):
    one run where the pairs of tiles fill the clusters, the runs the cost model prices
    cheapest elsewhere (each run non-empty, K covered), the same answer asked twice."""
    from types import SimpleNamespace

    from darknet_py.ops.convolution import wgmma as cuda_wgmma

    kern = SimpleNamespace(cluster=2, max_clusters=66)
    assert cuda_wgmma.split_plan(kern, 4096, 4096, 4096) == (64, 1)  # 256 pairs
    assert cuda_wgmma.split_plan(kern, 1024, 4608, 5408) == (85, 1)  # 72 pairs
    assert cuda_wgmma.split_plan(kern, 512, 4608, 5408) == (29, 3)  # 36 pairs
    assert cuda_wgmma.split_plan(kern, 256, 1152, 86528) == (104, 13)  # 5 pairs
    assert cuda_wgmma.split_plan(kern, 24, 1024, 5408) == (6, 15)  # 4 pairs
    for m, n, k in ((512, 4608, 5408), (256, 1152, 86528), (24, 1024, 5408), (3, 5, 64 * 7 + 1)):
        per, runs = cuda_wgmma.split_plan(kern, m, n, k)
        slices = -(-k // 64)
        assert per * runs >= slices > per * (runs - 1)
        assert cuda_wgmma.split_plan(kern, m, n, k) == (per, runs)


def test_the_wgmma_file_is_built_for_sm_90a_only(tmp_path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(0o755)
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    sources = {
        "gemm_wgmma.cu": 'extern "C" __global__ void w() {}\n',
        "gemm_wgmma_solo.cu": 'extern "C" __global__ void s() {}\n',
        "blas.cu": 'extern "C" __global__ void b() {}\n',
    }
    for name, text in sources.items():
        (kernels / name).write_text(text)
    built = tmp_path / "bin"
    manifest = prebuilt.build(str(built), [str(kernels)], options={}, nvcc=str(nvcc))
    assert manifest["kernels"]["gemm_wgmma.cu"]["archs"] == ["sm_90a"]
    assert manifest["kernels"]["gemm_wgmma_solo.cu"]["archs"] == ["sm_90a"]
    assert "archs" not in manifest["kernels"]["blas.cu"]
    wgmma = (built / "gemm_wgmma.fatbin").read_text()
    assert "arch=compute_90a,code=sm_90a" in wgmma and "code=sm_90 " not in wgmma
    assert "code=sm_90 " in (built / "blas.fatbin").read_text()
    found = {
        arch: prebuilt.prebuilt_binary(
            manifest,
            "gemm_wgmma.cu",
            sources["gemm_wgmma.cu"],
            (),
            arch,
            str(built),
            [str(kernels)],
        )[1]
        for arch in ("sm_90", "sm_90a")
    }
    assert found == {"sm_90": "arch", "sm_90a": None}
