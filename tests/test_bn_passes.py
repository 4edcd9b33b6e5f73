"""Batch norm's element-wise passes cut (bench/NOTES.md E1/E2, issue 26).

E1a: batchnorm_apply writes the kept x (keep=, rounded as copy_rounded would) as it reads x,
so a training forward makes no copy pass; every precision, the same bits as copy_rounded
then batchnorm_apply.
"""
import numpy as np
import pytest

from darknet_py import precision as precisions
from darknet_py.backends.numpy_backend import NumpyBackend
from test_bn_fused import bn_case
from test_bn_half_x import SPECIAL, widened
from test_cuda_ops import REF, assert_close, rand

gpu = pytest.mark.gpu
STORAGE = ("fp32",) + precisions.HALF_STORAGE
# batch, filters, spatial: filters 3 and 255, spatial 1, 169, a yolov4 plane and an odd one.
ODD_SHAPES = [(2, 3, 169), (1, 255, 169), (5, 255, 1), (2, 3, 173056), (1, 3, 173057)]
EPS = (None, 1e-5)   # Darknet's divisor, the fork's


# SPECIAL's rounding ties, fp16 overflows, subnormals and NaN; not the values whose
# normalised float32 result overflows where float64's does not.
KEEP_SPECIAL = SPECIAL[np.isnan(SPECIAL) | (np.abs(SPECIAL) < 1e7)]


def apply_case(rng, shape):
    """x (KEEP_SPECIAL among it), mean, variance, scales, biases (host float32)."""
    x, mean, variance, scales, biases = bn_case(rng, *shape)[:5]
    n = min(x.size, KEEP_SPECIAL.size)
    x[rng.choice(x.size, n, replace=False)] = KEEP_SPECIAL[:n]
    return x, mean, variance, scales, biases


def apply(be, case, shape, eps, activation, x_norm, keep, precision):
    """be.batchnorm_apply on `case` (keep=None or True: storage_zeros(precision), or a
    ready array); host copies of x, x_norm (or None) and the kept x (widened; or None)."""
    x, mean, variance, scales, biases = (be.from_host(a) for a in case)
    norm = be.zeros(x.size) if x_norm else None
    if keep is True:
        keep = be.storage_zeros(x.size, precision)
    be.batchnorm_apply(x, mean, variance, scales, biases, *shape, eps, activation, norm,
                       keep=keep, keep_precision=precision)
    kept = None
    if keep is not None:
        kept = (be.to_host(keep) if isinstance(be, NumpyBackend)
                else widened(be, keep, precision) if precision != "fp32" else be.to_host(keep))
    return be.to_host(x), None if norm is None else be.to_host(norm), kept


def assert_same_bits(got, want, what):
    assert got.shape == want.shape, what
    same = (got.view(np.uint32) == want.view(np.uint32)) | (np.isnan(got) & np.isnan(want))
    assert same.all(), f"{what}: {np.count_nonzero(~same)} elements differ"


@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("eps", EPS)
def test_apply_keeps_what_copy_rounded_keeps_numpy(precision, eps):
    """keep= is copy_rounded of the x read, and x and x_norm are what they are without it."""
    be, shape = NumpyBackend(), (2, 3, 7)
    case = apply_case(np.random.default_rng(1), shape)
    out, norm, kept = apply(be, case, shape, eps, "leaky", True, True, precision)
    want = be.storage_zeros(case[0].size, precision)
    be.copy_rounded(be.from_host(case[0]), want, precision)
    assert_same_bits(kept, be.to_host(want), "keep")
    plain_out, plain_norm, _ = apply(be, case, shape, eps, "leaky", True, None, precision)
    assert_same_bits(out, plain_out, "x")
    assert_same_bits(norm, plain_norm, "x_norm")
    if precision != "fp32":   # the rounding is there: keep is not x
        assert not np.array_equal(kept, case[0], equal_nan=True)


# =============================================================================
# GPU
# =============================================================================

def poisoned_storage(cuda, n, precision):
    """storage_zeros(n, precision) filled with NaN (each format's quiet NaN)."""
    import pycuda.driver as drv
    a = cuda.storage_zeros(n, precision)
    if precision == "fp32":
        drv.memset_d32_async(cuda._ptr(a), 0x7FC00000, n, cuda.stream)
    else:
        drv.memset_d16_async(cuda._ptr(a), 0x7E00 if precision == "fp16" else 0x7FC0, n,
                             cuda.stream)
    return a


@gpu
@pytest.mark.parametrize("precision", STORAGE)
@pytest.mark.parametrize("shape", ODD_SHAPES)
@pytest.mark.parametrize("eps", EPS)
def test_apply_keeps_copy_rounded_bits_cuda(cuda, precision, shape, eps):
    """The kept x (into NaN-poisoned storage) is copy_rounded's, on CUDA and NumPy, bit for
    bit; x and x_norm are the kernel's own without keep, bit for bit, and NumPy float64's
    within test_batchnorm_apply's 1e-5."""
    rng = np.random.default_rng(sum(shape) + len(precision))
    case = apply_case(rng, shape)
    total = case[0].size
    for activation, x_norm in (("leaky", True), ("mish", False)):
        out, norm, kept = apply(cuda, case, shape, eps, activation, x_norm,
                                poisoned_storage(cuda, total, precision), precision)
        assert_same_bits(kept, precisions.round_to(case[0], precisions.storage(precision)),
                         "keep against round_to")
        copied = poisoned_storage(cuda, total, precision)
        cuda.copy_rounded(cuda.from_host(case[0]), copied, precision)
        assert_same_bits(kept, widened(cuda, copied, precision) if precision != "fp32"
                         else cuda.to_host(copied), "keep against copy_rounded")
        plain_out, plain_norm, _ = apply(cuda, case, shape, eps, activation, x_norm, None,
                                         precision)
        assert_same_bits(out, plain_out, "x")
        ref_out, ref_norm, _ = apply(REF, case, shape, eps, activation, x_norm, None,
                                     precision)
        assert_close(out.astype(np.float64), ref_out, 1e-5, "x against NumPy float64")
        if x_norm:
            assert_same_bits(norm, plain_norm, "x_norm")
            assert_close(norm.astype(np.float64), ref_norm, 1e-5, "x_norm against NumPy")


@gpu
def test_apply_refuses_a_keep_of_another_precision_cuda(cuda):
    case = [cuda.from_host(a) for a in apply_case(np.random.default_rng(0), (1, 3, 4))]
    with pytest.raises(TypeError, match="bf16"):
        cuda.batchnorm_apply(*case, 1, 3, 4, None, "leaky", None,
                             keep=cuda.storage_zeros(12, "fp16"), keep_precision="bf16")
