"""The CUDA backend op by op against the NumPy reference, plus CPU-side contract checks.

GPU tests (marked gpu; `make gpu-test`) run the same case on both backends: the
NumPy backend in float64 is the reference, the CUDA backend runs float32 on the
same (float32-representable) inputs. Inputs are random, never zeros; arrays an op
only writes are poisoned with NaN first, so an element it fails to write (or
writes outside its range) shows. Error measure: max |got - ref| / max |ref| over
the finite elements; 1e-5 for element-wise ops, 1e-4 for reductions over more
than 1,000 terms; indexes and dropout masks must match exactly.

The CPU-side tests (not marked) read cuda_backend.py, its op-family mixins
(backends/cuda_*.py, ops/*/*.py) and the kernel files (ops/*/*.cu) as text, so
they run without PyCUDA: every NumpyBackend op exists on CudaBackend with the
same parameters. (Every launch against its kernel's declaration: test_kernel_launches.py.)
"""

import ast
import inspect
import re
import zlib
from pathlib import Path

import numpy as np
import pytest

from darknet_py import activations
from darknet_py.backends import prebuilt
from darknet_py.backends.numpy_backend import NumpyBackend
from darknet_py.shapes import conv_out_size

ROOT = Path(__file__).resolve().parents[1]
BACKEND_DIR = ROOT / "darknet_py" / "backends"
CUDA_BACKEND_PY = BACKEND_DIR / "cuda_backend.py"
OPS_DIR = ROOT / "darknet_py" / "ops"

gpu = pytest.mark.gpu


# =============================================================================
# CPU-side contract checks
# =============================================================================


def _cuda_backend_ast():
    tree = ast.parse(CUDA_BACKEND_PY.read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "CudaBackend":
            return tree, node
    raise AssertionError("cuda_backend.py defines no class CudaBackend")


def _family_modules():
    """{path: ast} of the CUDA backend's core modules (backends/cuda_*.py but cuda_backend.py)
    and of the op families' modules (ops/*/*.py)."""
    paths = [*BACKEND_DIR.glob("cuda_*.py"), *OPS_DIR.glob("*/*.py")]
    return {path: ast.parse(path.read_text()) for path in sorted(paths) if path != CUDA_BACKEND_PY}


def _kernel_file(name):
    """The path of a kernel file (.cu or .cuh) in the op families' folders, where it is once."""
    found = [
        Path(folder) / name for folder in prebuilt.KERNEL_DIRS if (Path(folder) / name).is_file()
    ]
    assert len(found) == 1, f"{name} is in {len(found)} kernel folders: {found}"
    return found[0]


def _backend_methods():
    """{name: FunctionDef} of CudaBackend and the mixins it is composed of (found in the
    family modules by name), the class's own first as Python's lookup would take them."""
    _, cls = _cuda_backend_ast()
    classes = {
        node.name: node
        for tree in _family_modules().values()
        for node in tree.body
        if isinstance(node, ast.ClassDef)
    }
    bases = [b.id for b in cls.bases if isinstance(b, ast.Name)]
    missing = [b for b in bases if b not in classes]
    assert not missing, f"CudaBackend's mixins not found in their modules: {missing}"
    methods = {}
    for klass in [cls] + [classes[b] for b in bases]:
        for f in klass.body:
            if isinstance(f, ast.FunctionDef):
                methods.setdefault(f.name, f)
    return methods


def _params(args):
    """[(name, default value or None)] of an ast.arguments, without self."""
    positional = args.posonlyargs + args.args
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    return [(a.arg, None if d is None else _literal(d)) for a, d in zip(positional, defaults)][1:]


def _literal(node):
    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def test_cuda_backend_has_every_numpy_backend_op_with_the_same_parameters():
    cuda_methods = {name: _params(f.args) for name, f in _backend_methods().items()}
    for name, fn in inspect.getmembers(NumpyBackend, inspect.isfunction):
        if name.startswith("_"):
            continue
        assert name in cuda_methods, f"CudaBackend lacks {name}()"
        want = [
            (p.name, None if p.default is inspect.Parameter.empty else p.default)
            for p in list(inspect.signature(fn).parameters.values())[1:]
        ]
        assert cuda_methods[name] == want, (
            f"{name}: CudaBackend {cuda_methods[name]} vs NumpyBackend {want}"
        )


def test_cuda_backend_class_attributes_and_constructor():
    _, cls = _cuda_backend_ast()
    attrs = {
        t.id: v
        for node in cls.body
        if isinstance(node, ast.Assign)
        for t, v in [(node.targets[0], node.value)]
        if isinstance(t, ast.Name)
    }
    assert ast.literal_eval(attrs["name"]) == "cuda"
    assert "float32" in ast.unparse(attrs["dtype"])
    init = next(f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    assert _params(init.args)[0] == ("device_index", 0)


def test_activation_kernel_ids_match_activations_py():
    text = _kernel_file("activations.cuh").read_text()
    body = re.search(r"enum Activation\s*\{(.*?)\}", text, flags=re.S).group(1)
    enum = [(n.lower(), int(v)) for n, v in re.findall(r"(\w+)\s*=\s*(\d+)", body)]
    assert enum == [(name, activations.ACTIVATION_IDS[name]) for name in activations.ACTIVATIONS]

    def body(signature):  # a device function's text, from its signature to its closing brace
        start = text.index(signature)
        return text[start : text.index("\n}\n", start)]

    forward = body("float activate(float x, int act)")
    gradients = body("float gradient(float y, int act)") + body(
        "float gradient_from_input(float x, int act)"
    )
    for name in activations.ACTIVATIONS:
        case = rf"case {name.upper()}:"
        assert len(re.findall(case, forward)) == 1, f"{name}: forward"
        assert len(re.findall(case, gradients)) == 1, f"{name}: gradient"


def test_copy_run_matches_the_kernel():
    kernel = re.search(r"constexpr int COPY_RUN = (\d+);", _kernel_file("shape.cu").read_text())
    launcher = (OPS_DIR / "elementwise" / "cuda.py").read_text()
    backend = re.search(r"^_COPY_RUN = (\d+)", launcher, flags=re.M)
    assert kernel and backend and kernel.group(1) == backend.group(1)


def test_kernels_include_only_the_kernel_folders_headers():
    # What a kernel file or header includes besides the toolkit's <...> headers is found
    # beside it, as nvcc finds it with no -I (a family's own headers, or ../common/'s),
    # and lies in one of the op families' folders (hashed into the cache key and the
    # prebuilt manifest: kernel_digest).
    paths = prebuilt.kernel_paths()
    assert "gemm.cu" in paths and "preprocess.cu" in paths
    folders = {Path(folder).resolve() for folder in prebuilt.KERNEL_DIRS}
    files = [p for folder in folders for p in folder.iterdir() if p.suffix in (".cu", ".cuh")]
    for path in files:
        for line in path.read_text().splitlines():
            if line.strip().startswith('#include "'):
                header = (path.parent / line.split('"')[1]).resolve()
                assert header.is_file(), f"{path}: {line.strip()} is not beside it"
                assert header.parent in folders, f"{path}: {header} is outside the ops folders"


# =============================================================================
# GPU: the same case on both backends
# =============================================================================

REF = NumpyBackend(np.float64)  # reference: higher precision, same inputs
REF32 = NumpyBackend(np.float32)  # for bit-exact comparisons (dropout)


class View:
    """An op argument that is the view host[offset:] of a backend array."""

    def __init__(self, host, offset):
        self.host, self.offset = host, offset


def _to_backend(backend, host):
    if host.dtype.kind in "iu":
        arr = backend.int_zeros(host.size)
        backend.write(arr, host)
        return arr
    return backend.from_host(host)


def run(backend, op, *args):
    """Call backend.<op>(*args) with every host array (or View) made a backend array.
    Returns (the op's result, host copies of all array arguments afterwards)."""
    wholes, call = [], []
    for a in args:
        if isinstance(a, View):
            whole = _to_backend(backend, a.host)
            wholes.append(whole)
            call.append(whole[a.offset :])
        elif isinstance(a, np.ndarray):
            whole = _to_backend(backend, a)
            wholes.append(whole)
            call.append(whole)
        else:
            call.append(a)
    result = getattr(backend, op)(*call)
    return result, [np.asarray(backend.to_host(w)).astype(np.float64) for w in wholes]


def assert_close(got, want, tol, what, exact=False):
    assert got.shape == want.shape, f"{what}: shape {got.shape} vs {want.shape}"
    bad = np.flatnonzero(np.isfinite(got) != np.isfinite(want))
    assert bad.size == 0, (
        f"{what}: {bad.size} elements finite on one backend only (unwritten "
        f"or stray writes?), first at {bad[:8].tolist()}"
    )
    fin = np.isfinite(want)
    nonfinite_differ = ~fin & ~((got == want) | (np.isnan(got) & np.isnan(want)))
    assert not nonfinite_differ.any(), f"{what}: non-finite elements differ"
    g, w = got[fin], want[fin]
    if exact:
        diff = np.flatnonzero(g != w)
        assert diff.size == 0, f"{what}: {diff.size} elements differ, first at {diff[:8].tolist()}"
        return
    if w.size == 0:
        return
    scale = np.max(np.abs(w))
    err = np.max(np.abs(g - w)) / (scale if scale > 0 else 1.0)
    assert err < tol, f"{what}: relative error {err:.3g} (tolerance {tol:g})"


def check(cuda, op, *args, tol=1e-5, exact=False, ref=REF):
    """Run op on the reference and on CUDA; compare every array argument afterwards."""
    want_result, want = run(ref, op, *args)
    got_result, got = run(cuda, op, *args)
    for i, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, tol, f"{op}: array argument {i}", exact=exact)
    return got_result, want_result


def rand(rng, n, lo=-1.0, hi=1.0):
    """float32 uniform in [lo, hi) with no exact zeros."""
    x = rng.uniform(lo, hi, int(n)).astype(np.float32)
    x[x == 0] = np.float32(0.5 * (lo + hi) + 1e-3)
    return x


def nan(n):
    return np.full(int(n), np.nan, dtype=np.float32)


def reduction_tol(terms):
    return 1e-4 if terms > 1000 else 1e-5


# ---- memory ------------------------------------------------------------------


@gpu
def test_memory_roundtrip_fill_copy_and_views(cuda):
    rng = np.random.default_rng(1)
    host = rand(rng, 1001)
    a = cuda.from_host(host.reshape(7, 11, 13))
    assert a.size == 1001 and a.dtype == np.float32
    np.testing.assert_array_equal(cuda.to_host(a), host)
    z = cuda.zeros(37)
    np.testing.assert_array_equal(cuda.to_host(z), np.zeros(37, np.float32))
    idx = cuda.int_zeros(19)
    assert idx.dtype == np.int32
    np.testing.assert_array_equal(cuda.to_host(idx), np.zeros(19))
    cuda.write(idx, np.arange(19) - 5)
    np.testing.assert_array_equal(cuda.to_host(idx), np.arange(19) - 5)
    e = cuda.empty(1001)
    cuda.copy(a, e)
    np.testing.assert_array_equal(cuda.to_host(e), host)
    # Views at odd offsets: write, fill and copy touch exactly their range.
    cuda.fill(e[3:10], -2.5)
    cuda.write(e[100:105], np.arange(5))
    cuda.copy(a[500:513], e[201:214])
    want = host.copy()
    want[3:10] = -2.5
    want[100:105] = np.arange(5)
    want[201:214] = host[500:513]
    np.testing.assert_array_equal(cuda.to_host(e), want)
    np.testing.assert_array_equal(cuda.to_host(e[201:214]), host[500:513])
    cuda.synchronize()


@gpu
def test_memory_is_tracked(cuda):
    before = cuda.allocated_bytes
    a = cuda.empty(1 << 20)
    assert cuda.allocated_bytes >= before + (4 << 20)
    assert cuda.peak_allocated_bytes >= cuda.allocated_bytes
    del a


@gpu
def test_out_of_memory_raises_device_out_of_memory(cuda):
    from darknet_py.backends import DeviceOutOfMemory

    keep = cuda.empty(1000)
    with pytest.raises(DeviceOutOfMemory) as info:
        cuda.empty(1 << 42)  # 16 TiB
    assert info.value.requested_bytes == 4 << 42
    assert info.value.allocated_bytes >= 4000
    assert "out of GPU memory" in str(info.value)
    # The backend still works afterwards.
    b = cuda.from_host(np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(cuda.to_host(b), np.arange(5))
    del keep


@gpu
def test_launch_error_names_kernel_and_shape(cuda):
    from darknet_py.backends.cuda_backend import CudaError

    x = cuda.from_host(np.ones(4, np.float32))
    with pytest.raises(CudaError) as info:
        cuda._launch("scal_kernel", (1,), (4096,), 4, 2.0, cuda._ptr(x))  # too many threads
    msg = str(info.value)
    assert "scal_kernel" in msg and "(4096, 1, 1)" in msg and "(1, 1, 1)" in msg
    cuda.scal(2.0, x)
    np.testing.assert_array_equal(cuda.to_host(x), 2 * np.ones(4))


@gpu
@pytest.mark.parametrize("accumulate", [False, True])
def test_copy_blocks(cuda, accumulate):
    rng = np.random.default_rng(2)
    src, dst = rand(rng, 3 * 50 + 17), rand(rng, 3 * 71 + 40)
    check(cuda, "copy_blocks", src, 5, 50, dst, 9, 71, 31, 3, accumulate)
    # Narrow rows (width 1) and many of them.
    src, dst = rand(rng, 1000), rand(rng, 2000)
    check(cuda, "copy_blocks", src, 1, 3, dst, 0, 6, 1, 333, accumulate)
    # Planes: the (filters, batch, n) -> (batch, filters, n) move of a convolution.
    m, b, n, filters = 7, 5, 13, 11
    src, dst = rand(rng, m * b * n), rand(rng, b * filters * n + 9)
    check(cuda, "copy_blocks", src, 0, b * n, dst, 3 * n, n, n, m, accumulate, b, n, filters * n)


# ---- BLAS-like ---------------------------------------------------------------


@gpu
@pytest.mark.parametrize("n", [1, 37, 4099, 1 << 20 | 7])
def test_axpy_scal_mul(cuda, n):
    rng = np.random.default_rng(n)
    x, y = rand(rng, n), rand(rng, n)
    check(cuda, "axpy", -1.75, x, y)
    check(cuda, "axpy_array", np.array([-1.75e-3], np.float32), x, y)  # factor on the device
    check(cuda, "scal", 0.37, y)
    check(cuda, "mul", x, y)
    check(cuda, "constrain", 0.5, rand(rng, n, -2.0, 2.0), exact=True)


@gpu
@pytest.mark.parametrize("n", [1, 999, 100003, 3 << 20])
def test_sum(cuda, n):
    x = rand(np.random.default_rng(n), n, -1.0, 1.2)
    got, want = check(cuda, "sum", x, tol=reduction_tol(n))
    assert isinstance(got, float)
    assert abs(got - want) <= reduction_tol(n) * max(abs(want), np.abs(x).max())


@gpu
@pytest.mark.parametrize("n", [0, 1, 100003])
def test_sum_into(cuda, n):
    """The queued sum (a loss left on the device): out[0] written, out[1] untouched."""
    x = rand(np.random.default_rng(n), n, -1.0, 1.2)
    out = np.array([np.nan, 7.0], dtype=np.float32)
    got = check(cuda, "sum_into", x, out, tol=reduction_tol(n))
    assert got == (None, None)


# ---- gemm --------------------------------------------------------------------


def _gemm_case(rng, ta, tb, m, n, k, alpha, beta, layout):
    """Host arguments for gemm. layout: 'packed' (ld = columns, offset 0),
    'padded' (ld = columns + 3, odd offsets: no 16-byte alignment anywhere),
    'aligned' (ld a multiple of 4, offsets 4: the vectorised C path)."""

    def mat(rows, cols, fill):
        if layout == "packed":
            ld, off = cols, 0
        elif layout == "padded":
            ld, off = cols + 3, 1
        else:
            ld, off = -(-cols // 4) * 4 + 4, 4
        size = off + (rows - 1) * ld + cols + 5 if rows and cols else off + 5
        host = fill(size)
        return (View(host, off) if off else host), ld

    a, lda = mat(k, m, lambda s: rand(rng, s)) if ta else mat(m, k, lambda s: rand(rng, s))
    b, ldb = mat(n, k, lambda s: rand(rng, s)) if tb else mat(k, n, lambda s: rand(rng, s))
    # C is NaN when beta == 0: the kernel must not read it.
    c, ldc = mat(m, n, (lambda s: rand(rng, s)) if beta else nan)
    return (ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc)


GEMM_SHAPES = [
    (1, 1, 1),
    (7, 13, 5),
    (33, 65, 17),
    (64, 64, 64),
    (129, 127, 131),
    (100, 3000, 27),
    (1023, 515, 257),
    (256, 169, 2304),
    (31, 1000, 1500),
    (5, 7, 0),
    # weight-gradient shapes: a small C over a long K, hundreds of K splits
    (16, 27, 60000),
    (32, 144, 20000),
]


@gpu
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
def test_gemm_shapes(cuda, ta, tb, m, n, k):
    rng = np.random.default_rng(m * 7919 + n * 31 + k + 2 * ta + tb)
    for alpha, beta, layout in [(1.0, 0.0, "packed"), (-0.7, 1.3, "padded")]:
        args = _gemm_case(rng, ta, tb, m, n, k, alpha, beta, layout)
        check(cuda, "gemm", *args, tol=reduction_tol(k))


@gpu
@pytest.mark.parametrize(
    "plan",
    [
        ("128x128x8s4", 1),
        ("64x64x8s4r8", 1),
        ("64x64x8s4r8", 5),
        ("128x128x8s4", 3),
        ("32x32x8s4w", 1),
        ("32x32x8s4w", 40),
    ],
)
@pytest.mark.parametrize("ta,tb", [(0, 0), (0, 1), (1, 0), (1, 1)])
@pytest.mark.parametrize("layout", ["packed", "padded", "aligned"])
def test_gemm_every_kernel_variant(cuda, plan, ta, tb, layout):
    rng = np.random.default_rng(zlib.crc32(repr((plan, ta, tb, layout)).encode()))
    cuda.gemm_override = plan
    try:
        for alpha, beta in [(1.0, 0.0), (0.7, -0.4)]:
            args = _gemm_case(rng, ta, tb, 131, 197, 333, alpha, beta, layout)
            check(cuda, "gemm", *args)
    finally:
        cuda.gemm_override = None


@gpu
@pytest.mark.parametrize("splits", [20, 700])
def test_gemm_split_k_is_deterministic_and_sums_every_split(cuda, splits):
    """Hundreds of K splits (the reduce then sums with 8 to 32 threads per output, in a
    fixed order): within rounding of the reference, and the same bits on every run."""
    rng = np.random.default_rng(splits)
    m, n, k = 16, 27, 256 * splits
    args = _gemm_case(rng, 0, 1, m, n, k, 0.5, 0.0, "packed")
    cuda.gemm_override = ("32x32x8s4w", splits)
    try:
        _, want = run(REF, "gemm", *args)
        outputs = [run(cuda, "gemm", *args)[1][2] for _ in range(3)]
    finally:
        cuda.gemm_override = None
    assert_close(outputs[0], want[2], 1e-4, "gemm C")
    assert all(np.array_equal(o, outputs[0], equal_nan=True) for o in outputs[1:])  # C's pad is NaN


# ---- convolution helpers -----------------------------------------------------

CONV_CASES = [  # channels, height, width, ksize, stride, pad, dilation
    (3, 13, 17, 3, 1, 1, 1),
    (5, 8, 9, 3, 2, 1, 1),
    (4, 11, 7, 1, 1, 0, 1),
    (2, 15, 16, 3, 1, 2, 2),
    (7, 9, 9, 5, 3, 2, 1),
    (16, 26, 26, 3, 1, 1, 1),
    (1, 6, 5, 7, 1, 3, 1),
    (3, 20, 21, 2, 2, 0, 1),
    (33, 7, 7, 3, 1, 1, 1),
    (2, 30, 31, 3, 2, 1, 3),
    (4, 12, 13, 3, (2, 1), 1, 1),
    (3, 9, 14, 3, (1, 3), 1, 2),
]  # the fork's (stride_y, stride_x)


@gpu
@pytest.mark.parametrize("c,h,w,k,s,p,d", CONV_CASES)
def test_im2col_col2im(cuda, c, h, w, k, s, p, d):
    rng = np.random.default_rng(c * 1000 + h * 10 + k)
    out_h, out_w = conv_out_size(h, w, k, s, p, d)
    cols = c * k * k * out_h * out_w
    im = rand(rng, c * h * w + 3)
    check(cuda, "im2col", im, c, h, w, k, s, p, d, nan(cols + 11))
    check(cuda, "col2im", rand(rng, cols + 2), c, h, w, k, s, p, d, im)
    # A batch of 3 images with a gap between them (a group of a larger image).
    stride = c * h * w + 7
    ims = rand(rng, 3 * stride)
    check(cuda, "im2col", ims, c, h, w, k, s, p, d, nan(3 * cols + 5), 3, stride)
    check(cuda, "col2im", rand(rng, 3 * cols), c, h, w, k, s, p, d, ims, 3, stride)


# ---- bias, scale, batch norm -------------------------------------------------

CHANNEL_SHAPES = [(3, 5, 7), (2, 17, 1), (1, 64, 169), (4, 3, 1000), (8, 3, 4096), (2, 1, 1)]


@gpu
@pytest.mark.parametrize("batch,n,size", CHANNEL_SHAPES)
def test_bias_and_scale(cuda, batch, n, size):
    rng = np.random.default_rng(batch * n * size)
    total, terms = batch * n * size, batch * size
    check(cuda, "add_bias", rand(rng, total), rand(rng, n), batch, n, size)
    check(cuda, "scale_bias", rand(rng, total), rand(rng, n), batch, n, size)
    for activation in ("leaky", "logistic", "linear", "relu", "tanh"):
        check(
            cuda,
            "bias_activate",
            rand(rng, total, -3.0, 3.0),
            rand(rng, n),
            batch,
            n,
            size,
            activation,
        )
    check(
        cuda,
        "backward_bias",
        rand(rng, n),
        rand(rng, total),
        batch,
        n,
        size,
        tol=reduction_tol(terms),
    )
    check(
        cuda,
        "backward_scale",
        rand(rng, total),
        rand(rng, total),
        batch,
        n,
        size,
        rand(rng, n),
        tol=reduction_tol(terms),
    )


@gpu
@pytest.mark.parametrize("batch,filters,spatial", CHANNEL_SHAPES)
def test_batchnorm(cuda, batch, filters, spatial):
    rng = np.random.default_rng(batch + filters + spatial)
    total, terms = batch * filters * spatial, batch * spatial
    tol = reduction_tol(terms)
    x = rand(rng, total, -2.0, 3.0)
    mean = x.reshape(batch, filters, spatial).mean(axis=(0, 2)).astype(np.float32)
    var = rand(rng, filters, 0.2, 2.0)
    delta = rand(rng, total)
    check(cuda, "mean", x, batch, filters, spatial, nan(filters), tol=tol)
    check(cuda, "variance", x, mean, batch, filters, spatial, nan(filters), tol=tol)
    check(cuda, "normalize", x, mean, var, batch, filters, spatial)
    check(cuda, "mean_delta", delta, var, batch, filters, spatial, nan(filters), tol=tol)
    check(
        cuda, "variance_delta", x, delta, mean, var, batch, filters, spatial, nan(filters), tol=tol
    )
    for fork in (False, True):  # the fork's CPU divisor sqrt(var) + 1e-5
        check(
            cuda,
            "normalize_delta",
            x,
            mean,
            var,
            rand(rng, filters),
            rand(rng, filters),
            batch,
            filters,
            spatial,
            delta,
            fork,
        )
    x_norm = rand(rng, total)
    for bias_updates in (rand(rng, filters), None):
        check(
            cuda,
            "bias_scale_updates",
            delta,
            x_norm,
            batch,
            filters,
            spatial,
            bias_updates,
            rand(rng, filters),
            tol=tol,
        )
    for fork in (False, True):
        check(
            cuda,
            "batchnorm_delta",
            x,
            mean,
            var,
            rand(rng, filters, 0.5, 1.5),
            batch,
            filters,
            spatial,
            nan(filters),
            nan(filters),
            delta,
            fork,
            tol=tol,
        )


@gpu
@pytest.mark.parametrize("batch,filters,spatial", CHANNEL_SHAPES)
@pytest.mark.parametrize("eps", [None, 1e-5])
def test_batchnorm_apply(cuda, batch, filters, spatial, eps):
    rng = np.random.default_rng(batch * filters + spatial)
    total = batch * filters * spatial
    for activation, x_norm in (
        ("leaky", nan(total)),
        ("linear", None),
        ("logistic", None),
        ("mish", nan(total)),
    ):
        check(
            cuda,
            "batchnorm_apply",
            rand(rng, total, -2.0, 3.0),
            rand(rng, filters),
            rand(rng, filters, 0.2, 2.0),
            rand(rng, filters, 0.5, 1.5),
            rand(rng, filters),
            batch,
            filters,
            spatial,
            eps,
            activation,
            x_norm,
        )


# ---- activations -------------------------------------------------------------


@gpu
@pytest.mark.parametrize("activation", activations.ACTIVATIONS)
def test_activate_and_gradient(cuda, activation):
    rng = np.random.default_rng(activations.ACTIVATION_IDS[activation])
    n = 4099
    check(cuda, "activate", rand(rng, n, -6.0, 6.0), activation)
    if activation not in activations.INPUT_GRADIENT:  # those: test_gradient_from_input
        check(cuda, "gradient", rand(rng, n, -1.5, 1.5), activation, rand(rng, n))
    # Strided: rows of `width` at `offset`, `row_stride` apart; the rest is untouched.
    rows, row_stride, offset, width = 7, 23, 3, 11
    x = rand(rng, offset + (rows - 1) * row_stride + width + 4, -6.0, 6.0)
    check(cuda, "activate_strided", x, rows, row_stride, offset, width, activation)
    x = rand(rng, 5000 * 3, -6.0, 6.0)
    check(cuda, "activate_strided", x, 5000, 3, 0, 1, activation)


@gpu
@pytest.mark.parametrize(
    "rows,row_stride,offset,width", [(7, 23, 3, 11), (5000, 3, 0, 1), (6, 200, 0, 128)]
)
def test_scale_add_strided(cuda, rows, row_stride, offset, width):
    rng = np.random.default_rng(rows * width)
    x = rand(rng, offset + (rows - 1) * row_stride + width + 4)
    check(cuda, "scale_add_strided", x, rows, row_stride, offset, width, 1.05, -0.025)


@gpu
@pytest.mark.parametrize("activation", activations.INPUT_GRADIENT)
def test_gradient_from_input(cuda, activation):
    rng = np.random.default_rng(len(activation))
    n = 4099
    check(cuda, "gradient_from_input", rand(rng, n, -25.0, 25.0), activation, rand(rng, n))
    check(cuda, "gradient_from_input", rand(rng, n, -3.0, 3.0), activation, rand(rng, n))


@gpu
@pytest.mark.parametrize("activation", activations.CHANNEL_ACTIVATIONS)
@pytest.mark.parametrize("batch,channels,spatial", [(2, 5, 169), (1, 255, 4), (3, 2, 7)])
def test_normalize_channels(cuda, activation, batch, channels, spatial):
    rng = np.random.default_rng(batch * channels * spatial)
    n = batch * channels * spatial
    check(
        cuda,
        "normalize_channels",
        rand(rng, n, -4.0, 4.0),
        batch,
        channels,
        spatial,
        activation,
        tol=reduction_tol(channels),
    )
    check(
        cuda,
        "normalize_channels_gradient",
        rand(rng, n, -4.0, 4.0),
        batch,
        channels,
        spatial,
        activation,
        rand(rng, n),
        tol=reduction_tol(channels),
    )


@gpu
@pytest.mark.parametrize("batch,filters,spatial", [(2, 16, 169), (1, 3, 1)])
def test_normalize_sqrt_eps(cuda, batch, filters, spatial):
    rng = np.random.default_rng(filters)
    check(
        cuda,
        "normalize_sqrt_eps",
        rand(rng, batch * filters * spatial),
        rand(rng, filters),
        rand(rng, filters, 1e-4, 2.0),
        batch,
        filters,
        spatial,
        1e-5,
    )


@gpu
def test_mul_add(cuda):
    rng = np.random.default_rng(3)
    check(cuda, "mul_add", rand(rng, 10007), rand(rng, 10007), rand(rng, 10007))


# ---- pooling -----------------------------------------------------------------

MAXPOOL_CASES = [  # batch, c, h, w, size, stride, padding
    (2, 3, 13, 13, 2, 2, 1),
    (1, 4, 13, 13, 2, 1, 1),
    (2, 3, 9, 11, 3, 2, 2),
    (1, 2, 7, 7, 3, 3, 0),
    (2, 5, 8, 6, 5, 2, 4),
    (3, 7, 26, 26, 2, 2, 0),
    (1, 1, 5, 5, 4, 1, 6),
    (1, 2, 3, 3, 2, 1, 8),
]  # windows wholly in the padding: -inf, index -1


@gpu
@pytest.mark.parametrize("batch,c,h,w,size,stride,padding", MAXPOOL_CASES)
def test_maxpool(cuda, batch, c, h, w, size, stride, padding):
    rng = np.random.default_rng(batch * c * h * w + size)
    out_h = (h + padding - size) // stride + 1
    out_w = (w + padding - size) // stride + 1
    n_out = batch * c * out_h * out_w
    x = rand(rng, batch * c * h * w)
    poisoned_indexes = np.full(n_out + 3, -7, dtype=np.int64)
    _, want = run(
        REF,
        "maxpool_forward",
        x,
        batch,
        c,
        h,
        w,
        size,
        stride,
        padding,
        nan(n_out + 3),
        poisoned_indexes,
    )
    _, got = run(
        cuda,
        "maxpool_forward",
        x,
        batch,
        c,
        h,
        w,
        size,
        stride,
        padding,
        nan(n_out + 3),
        poisoned_indexes,
    )
    assert_close(got[1], want[1], 1e-5, "maxpool out", exact=True)
    assert_close(got[2], want[2], 0, "maxpool indexes", exact=True)
    # Inference: no indexes (a null pointer), the same maxima.
    _, got = run(
        cuda, "maxpool_forward", x, batch, c, h, w, size, stride, padding, nan(n_out + 3), None
    )
    assert_close(got[1], want[1], 1e-5, "maxpool out without indexes", exact=True)
    # Backward with the reference's indexes (overlapping windows route twice).
    indexes = want[2][:n_out].astype(np.int64)
    check(cuda, "maxpool_backward", rand(rng, n_out), indexes, n_out, rand(rng, x.size))
    # The gathering backward adds in output order: the reference's floats, bit for bit,
    # and the same every run.
    delta_out, delta_in = rand(rng, n_out) * 1e3, rand(rng, x.size)
    got = [
        run(
            cuda,
            "maxpool_backward_xy",
            delta_out,
            indexes,
            batch,
            c,
            h,
            w,
            size,
            stride,
            stride,
            padding,
            delta_in.copy(),
        )[1][-1]
        for _ in range(2)
    ]
    want = run(
        REF32,
        "maxpool_backward_xy",
        delta_out,
        indexes,
        batch,
        c,
        h,
        w,
        size,
        stride,
        stride,
        padding,
        delta_in.copy(),
    )[1][-1]
    assert_close(got[0], want, 0, "maxpool_backward_xy", exact=True)
    assert np.array_equal(got[0], got[1])


@gpu
@pytest.mark.parametrize(
    "batch,c,h,w,size,stride_x,stride_y,padding",
    [(2, 3, 13, 11, 2, 2, 1, 1), (1, 4, 9, 9, 3, 1, 2, 2), (2, 2, 8, 6, 3, 3, 1, 0)],
)
def test_maxpool_xy_and_local_avgpool(cuda, batch, c, h, w, size, stride_x, stride_y, padding):
    rng = np.random.default_rng(h * w + stride_x)
    out_h = (h + padding - size) // stride_y + 1
    out_w = (w + padding - size) // stride_x + 1
    n_out = batch * c * out_h * out_w
    x = rand(rng, batch * c * h * w)
    args = (batch, c, h, w, size, stride_x, stride_y, padding)
    _, want = run(REF, "maxpool_forward_xy", x, *args, nan(n_out), np.full(n_out, -7, np.int64))
    _, got = run(cuda, "maxpool_forward_xy", x, *args, nan(n_out), np.full(n_out, -7, np.int64))
    assert_close(got[1], want[1], 0, "maxpool_xy out", exact=True)
    assert_close(got[2], want[2], 0, "maxpool_xy indexes", exact=True)
    indexes = want[2][:n_out].astype(np.int64)
    check(
        cuda,
        "maxpool_backward_xy",
        rand(rng, n_out),
        indexes,
        *args,
        rand(rng, x.size),
        exact=True,
        ref=REF32,
    )
    check(cuda, "local_avgpool", x, *args, nan(n_out), True)
    check(cuda, "local_avgpool", rand(rng, x.size), *args, rand(rng, n_out), False)


@gpu
@pytest.mark.parametrize("batch,c,spatial,out_c", [(2, 6, 25, 2), (1, 7, 13, 3), (2, 4, 9, 4)])
def test_maxpool_depth(cuda, batch, c, spatial, out_c):
    rng = np.random.default_rng(c * spatial)
    n_out = batch * out_c * spatial
    x = rand(rng, batch * c * spatial)
    _, want = run(
        REF,
        "maxpool_depth_forward",
        x,
        batch,
        c,
        spatial,
        out_c,
        nan(n_out),
        np.full(n_out, -7, np.int64),
    )
    _, got = run(
        cuda,
        "maxpool_depth_forward",
        x,
        batch,
        c,
        spatial,
        out_c,
        nan(n_out),
        np.full(n_out, -7, np.int64),
    )
    assert_close(got[1], want[1], 0, "maxpool_depth out", exact=True)
    assert_close(got[2], want[2], 0, "maxpool_depth indexes", exact=True)


@gpu
@pytest.mark.parametrize("batch,c,spatial", [(2, 7, 169), (3, 1000, 1), (1, 5, 4096), (4, 33, 49)])
def test_avgpool(cuda, batch, c, spatial):
    rng = np.random.default_rng(batch * c * spatial)
    rows = batch * c
    check(
        cuda,
        "avgpool_forward",
        rand(rng, rows * spatial),
        batch,
        c,
        spatial,
        nan(rows + 2),
        tol=reduction_tol(spatial),
    )
    check(cuda, "avgpool_backward", rand(rng, rows), batch, c, spatial, rand(rng, rows * spatial))


# ---- softmax and losses --------------------------------------------------------

SOFTMAX_CASES = [  # n, batch, batch_offset, groups, group_offset, stride, temp
    (1000, 3, 1000, 1, 0, 1, 1.0),  # classifier
    (20, 2 * 5, 25 * 169, 169, 1, 169, 1.0),  # region layer: classes strided over w*h
    (7, 4, 7 * 3, 3, 7, 1, 0.5),  # groups, temperature
    (1, 5, 2, 1, 0, 1, 1.0),
    (33, 1, 40, 1, 0, 1, 2.0),
]


@gpu
@pytest.mark.parametrize("n,batch,batch_offset,groups,group_offset,stride,temp", SOFTMAX_CASES)
def test_softmax(cuda, n, batch, batch_offset, groups, group_offset, stride, temp):
    rng = np.random.default_rng(n * batch)
    size = (batch - 1) * batch_offset + (groups - 1) * group_offset + (n - 1) * stride + 1
    x = rand(rng, size + 4, -4.0, 4.0)
    check(
        cuda,
        "softmax",
        x,
        n,
        batch,
        batch_offset,
        groups,
        group_offset,
        stride,
        temp,
        nan(size + 4),
    )


@gpu
def test_softmax_in_place(cuda):
    x = rand(np.random.default_rng(5), 3 * 50, -3.0, 3.0)
    want = x.astype(np.float64).reshape(3, 50)
    want = np.exp(want - want.max(1, keepdims=True))
    want /= want.sum(1, keepdims=True)
    a = cuda.from_host(x)
    cuda.softmax(a, 50, 3, 50, 1, 0, 1, 1.0, a)
    assert_close(cuda.to_host(a).astype(np.float64), want.reshape(-1), 1e-5, "in-place softmax")


@gpu
@pytest.mark.parametrize("n", [1, 1001, 30011])
def test_losses(cuda, n):
    rng = np.random.default_rng(n)
    pred = rand(rng, n, 0.01, 1.0)
    truth = rand(rng, n, 0.0, 1.0)
    truth[rng.random(n) < 0.5] = 0  # the t == 0 branch of cross-entropy
    check(cuda, "softmax_x_ent", pred, truth, nan(n), nan(n))
    check(cuda, "l2", pred, rand(rng, n), nan(n), nan(n))


# ---- shape ops -----------------------------------------------------------------


@gpu
@pytest.mark.parametrize(
    "w,h,c,batch,stride,scale", [(13, 13, 3, 2, 2, 1.0), (5, 7, 4, 1, 3, 0.5), (1, 1, 9, 3, 2, 1.5)]
)
def test_upsample(cuda, w, h, c, batch, stride, scale):
    rng = np.random.default_rng(w * h * c)
    small, big = batch * c * h * w, batch * c * h * w * stride * stride
    check(cuda, "upsample", rand(rng, small), w, h, c, batch, stride, True, scale, nan(big))
    check(cuda, "upsample", rand(rng, small), w, h, c, batch, stride, False, scale, rand(rng, big))


@gpu
@pytest.mark.parametrize(
    "w,h,c,batch,stride", [(6, 4, 8, 2, 2), (5, 3, 18, 1, 3), (26, 26, 64, 1, 2)]
)
@pytest.mark.parametrize("forward", [True, False])
def test_reorg(cuda, w, h, c, batch, stride, forward):
    rng = np.random.default_rng(w * h * c + forward)
    total = batch * c * h * w
    check(cuda, "reorg", rand(rng, total), w, h, c, batch, stride, forward, nan(total), exact=True)


@gpu
@pytest.mark.parametrize(
    "w1,h1,c1,w2,h2,c2",
    [
        (13, 13, 16, 13, 13, 16),
        (26, 26, 8, 13, 13, 12),
        (13, 13, 12, 26, 26, 8),
        (7, 5, 3, 7, 5, 6),
    ],
)
def test_shortcut(cuda, w1, h1, c1, w2, h2, c2):
    rng = np.random.default_rng(w1 * c1 + w2 * c2)
    batch = 2
    check(
        cuda,
        "shortcut",
        batch,
        w1,
        h1,
        c1,
        rand(rng, batch * c1 * h1 * w1),
        w2,
        h2,
        c2,
        0.75,
        -1.25,
        rand(rng, batch * c2 * h2 * w2),
    )


@gpu
@pytest.mark.parametrize(
    "batch,channels,spatial,scale_wh",
    [(2, 16, 169, 0), (1, 3, 7, 1), (2, 64, 40, 1), (3, 40, 1, 0)],
)
def test_scale_channels(cuda, batch, channels, spatial, scale_wh):
    rng = np.random.default_rng(channels * spatial + scale_wh)
    n = batch * channels * spatial
    m = batch * (spatial if scale_wh else channels)
    shape = (batch, channels, spatial, scale_wh)
    check(cuda, "scale_channels", rand(rng, m), rand(rng, n), *shape, nan(n))
    terms = channels if scale_wh else spatial
    check(
        cuda,
        "scale_channels_backward",
        rand(rng, m),
        rand(rng, n),
        rand(rng, n),
        *shape,
        rand(rng, m),
        rand(rng, n),
        tol=reduction_tol(terms),
    )


@gpu
@pytest.mark.parametrize("normalization", ["none", "relu", "softmax"])
@pytest.mark.parametrize("inputs,channels", [(3, 1), (2, 64)])
def test_shortcut_weights(cuda, normalization, inputs, channels):
    rng = np.random.default_rng(inputs * channels)
    check(
        cuda,
        "shortcut_weights",
        rand(rng, inputs * channels, -1.0, 2.0),
        inputs,
        channels,
        normalization,
        nan(inputs * channels),
    )


@gpu
@pytest.mark.parametrize(
    "outputs,width,channels,src_stride",
    [(16 * 169, 16 * 169, 16, 16 * 169), (8 * 25, 4 * 25, 8, 4 * 25), (7 * 9, 7 * 9, 1, 9 * 9)],
)
def test_channel_weighted_add_and_dot(cuda, outputs, width, channels, src_stride):
    rng = np.random.default_rng(outputs + width)
    batch, step = 3, outputs // channels
    src = rand(rng, batch * src_stride)
    w = rand(rng, channels)
    check(
        cuda,
        "channel_weighted_add",
        src,
        src_stride,
        w,
        step,
        width,
        batch,
        rand(rng, batch * outputs),
        outputs,
    )
    check(
        cuda,
        "channel_weighted_dot",
        rand(rng, batch * outputs),
        outputs,
        src,
        src_stride,
        step,
        width,
        batch,
        rand(rng, channels),
        tol=reduction_tol(batch * step),
    )


# ---- dropout -------------------------------------------------------------------


@gpu
@pytest.mark.parametrize(
    "n,prob,step_seed,layer_seed",
    [(1, 0.5, 0, 0), (10007, 0.3, 12345, 7919), (1 << 20, 0.9, -3, 2**40 + 3)],
)
def test_dropout_matches_numpy_bit_for_bit(cuda, n, prob, step_seed, layer_seed):
    rng = np.random.default_rng(n)
    scale = 1.0 / (1.0 - prob)
    seed = np.array([step_seed], dtype=np.int32)  # the step's part, read on the device
    check(
        cuda, "dropout", rand(rng, n), prob, scale, nan(n), seed, layer_seed, exact=True, ref=REF32
    )
    rnd = REF32.empty(n)
    REF32.dropout(REF32.from_host(rand(rng, n)), prob, scale, rnd, seed, layer_seed)
    check(cuda, "dropout_backward", rnd, prob, scale, rand(rng, n), exact=True, ref=REF32)
