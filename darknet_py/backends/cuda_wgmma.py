"""Hopper's GEMM for the CUDA backend: kernels/gemm_wgmma.cu (wgmma fed by TMA, built for
sm_90a) and its launcher.

CudaBackend.gemm_lowp offers every fp16 / bf16 product to gemm_lowp below first. It takes
the product on a GPU of compute capability 9.0 when the product fills the chip at least
once with 128 x 256 tiles (and K >= MIN_K); otherwise (another GPU, tf32, a small or
split-K-shaped product, a forced tensor-core plan in tc_override, DARKNET_WGMMA=0, or the
sm_90a build not loading) it declines and the mma.sync kernels of gemm_tc.cu run as
before.

The kernel multiplies half-precision operands laid out K-major (A as M x K rows, B as N x K
rows, rows a multiple of 8 elements apart). gemm_lowp's operands are fp32 in any of the
layouts Darknet's gemm takes, so they are first rounded into two scratch buffers in that
layout (to_kmajor: one pass each, transposing where needed); gemm_half multiplies operands
already stored that way. Both write C = alpha * A @ B^T + beta * C in fp32.

The sm_90a binary comes from the wheel (prebuilt.FILE_ARCHS builds this file for sm_90a
only) or from nvcc through the kernel cache, like the other kernel files, but is loaded
only here, on the first product that asks for it.
"""
import ctypes
import os
import sys

import numpy as np
import pycuda.driver as drv

from . import kernel_cache, prebuilt

SOURCE = "gemm_wgmma.cu"
ARCH = "sm_90a"
# kernels/gemm_wgmma.cu's WG_BM, WG_BN, WG_BK, WG_STAGES, WG_THREADS
TILE_M, TILE_N, TILE_K, STAGES, THREADS = 128, 256, 64, 4, 384
# The stage ring, its 2 x STAGES mbarriers, and 1 KB to align the ring to 1024 bytes.
SHARED_BYTES = STAGES * (TILE_M + TILE_N) * TILE_K * 2 + 2 * STAGES * 8 + 1024
# K below this: the product is too thin for the conversion pass to pay.
MIN_K = 64
# precision -> (kernel name part, CUtensorMapDataType)
PRECISIONS = {"fp16": ("f16", 6), "bf16": ("bf16", 9)}
# Two tensor maps by value (first, so 64-byte aligned), then m n k alpha beta c ldc pairs.
GEMM_ARGS = "128s128siiiffPii"
CONVERT_ARGS = "PiiiiPi"
CONVERT_TILE = (32, 64)     # KM_ROWS, KM_COLS of kernels/gemm_wgmma.cu
CONVERT_BLOCK = (32, 8)
_ROW_ALIGN = 8              # halves: TMA wants row strides in multiples of 16 bytes
# cuTensorMapEncodeTiled enums (cuda.h)
_SWIZZLE_128B, _L2_PROMOTION_256B = 3, 3


class WgmmaError(RuntimeError):
    """A failed wgmma launch or tensor-map encoding, naming the kernel and its arguments."""


def _ceil_div(a, b):
    return -(-a // b)


class _Kernels:
    """The sm_90a module of one device, its functions prepared."""

    def __init__(self):
        with open(os.path.join(prebuilt.KERNEL_DIR, SOURCE)) as f:
            source = f.read()
        binaries, _ = prebuilt.binaries({SOURCE: source}, ARCH, kernel_cache.KERNEL_OPTIONS,
                                        include_dir=prebuilt.KERNEL_DIR)
        self.module = drv.module_from_buffer(binaries[SOURCE])
        self.functions = {}
        for part, _ in PRECISIONS.values():
            fn = self.module.get_function(f"wgmma_gemm_{part}")
            fn.prepare(GEMM_ARGS)
            fn.set_attribute(drv.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, SHARED_BYTES)
            self.functions[f"wgmma_gemm_{part}"] = fn
            fn = self.module.get_function(f"to_kmajor_{part}")
            fn.prepare(CONVERT_ARGS)
            self.functions[f"to_kmajor_{part}"] = fn


_loaded = {}   # device index -> _Kernels, or None where this device cannot run them


def kernels(be):
    """The wgmma kernels for be's device; None on a GPU other than compute capability 9.0,
    or where the sm_90a build cannot be had (said once on stderr)."""
    index = be.device_index
    if index not in _loaded:
        _loaded[index] = None
        if be._dev.device.compute_capability() == (9, 0):
            try:
                _loaded[index] = _Kernels()
            except (kernel_cache.KernelCompileError, drv.Error, OSError) as e:
                print(f"darknet-py: the Hopper GEMM (wgmma) is unavailable, using mma.sync: {e}",
                      file=sys.stderr)
    return _loaded[index]


def handles(be, precision, m, n, k):
    """Whether gemm_lowp takes an m x n x k product in `precision` on this backend."""
    if precision not in PRECISIONS or be.tc_override is not None or k < MIN_K:
        return False
    if os.environ.get("DARKNET_WGMMA", "") == "0":
        return False
    if _ceil_div(m, TILE_M) * _ceil_div(n, TILE_N) < be.sm_count:
        return False   # less than a wave: mma.sync with split-K fills the chip better
    return kernels(be) is not None


_encode = None


def _encoder():
    global _encode
    if _encode is None:
        fn = ctypes.CDLL("libcuda.so.1").cuTensorMapEncodeTiled
        fn.restype = ctypes.c_int
        u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p,
                       u32p, u32p, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
        _encode = fn
    return _encode


def tensor_map(ptr, rows, cols, pitch, box_rows, data_type):
    """The 128 bytes of a 2-D tensor map over a rows x cols half-precision matrix at `ptr`
    (rows `pitch` elements apart): boxes of TILE_K columns x box_rows rows, 128-byte
    swizzle, zeros outside the matrix."""
    buf = ctypes.create_string_buffer(128 + 64)
    address = (ctypes.addressof(buf) + 63) & ~63      # the driver wants it 64-byte aligned
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(pitch * 2)
    box = (ctypes.c_uint32 * 2)(TILE_K, box_rows)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    err = _encoder()(address, data_type, 2, ptr, dims, strides, box, steps, 0, _SWIZZLE_128B,
                     _L2_PROMOTION_256B, 0)
    if err:
        raise WgmmaError(f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {rows} x {cols} "
                         f"matrix at 0x{ptr:x}, row pitch {pitch}")
    return ctypes.string_at(address, 128)


def _launch(be, kern, name, grid, block, *args, shared=0):
    try:
        kern.functions[name].prepared_async_call(grid, block, be.stream, *args, shared_size=shared)
    except drv.Error as e:
        raise WgmmaError(f"CUDA error launching kernel {name} with grid={grid} block={block}: {e}") from e
    be._recent.append((name, grid, block))
    if be.sync_each_launch:
        try:
            be.stream.synchronize()
        except drv.Error as e:
            raise WgmmaError(f"CUDA error in kernel {name} with grid={grid} block={block}: {e}") from e


def row_pitch(k):
    """Elements between rows of a K-major half-precision operand of K columns."""
    return _ceil_div(max(int(k), 1), _ROW_ALIGN) * _ROW_ALIGN


def _to_kmajor(be, kern, part, src, ld, rows, cols, transposed, dst, pitch):
    grid = (_ceil_div(rows, CONVERT_TILE[0]), _ceil_div(cols, CONVERT_TILE[1]))
    _launch(be, kern, f"to_kmajor_{part}", grid, CONVERT_BLOCK, src, int(ld), int(rows), int(cols),
            int(transposed), dst, int(pitch))


def _multiply(be, kern, precision, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    part, data_type = PRECISIONS[precision]
    a_map = tensor_map(a, m, k, lda, TILE_M, data_type)
    b_map = tensor_map(b, n, k, ldb, TILE_N, data_type)
    tiles = _ceil_div(m, TILE_M) * _ceil_div(n, TILE_N)
    pairs = int(c % 8 == 0 and ldc % 2 == 0)   # float2 stores of C
    _launch(be, kern, f"wgmma_gemm_{part}", (min(tiles, be.sm_count),), (THREADS,), a_map, b_map,
            int(m), int(n), int(k), float(alpha), float(beta), c, int(ldc), pairs, shared=SHARED_BYTES)


def gemm_lowp(be, precision, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc, force=False):
    """CudaBackend.gemm_lowp's product on the wgmma kernel (arguments already checked by the
    caller); False, having done nothing, where handles() says no. force: take any shape
    and K >= 1 (tests), still only on a device that can run the kernel."""
    if force:
        if precision not in PRECISIONS or k < 1 or kernels(be) is None:
            return False
    elif not handles(be, precision, m, n, k):
        return False
    kern = kernels(be)
    part, _ = PRECISIONS[precision]
    pitch = row_pitch(k)
    a16 = be._ptr(be._scratch_buffer("wgmma_a", 2 * m * pitch))
    b16 = be._ptr(be._scratch_buffer("wgmma_b", 2 * n * pitch))
    # A as M x K rows: op(A) = A (M x K, lda) or A^T (A stored K x M).
    _to_kmajor(be, kern, part, be._ptr(a), lda, m, k, bool(ta), a16, pitch)
    # B as N x K rows: op(B) = B^T (B stored N x K) or B (K x N, read transposed).
    _to_kmajor(be, kern, part, be._ptr(b), ldb, n, k, not tb, b16, pitch)
    _multiply(be, kern, precision, m, n, k, alpha, a16, pitch, b16, pitch, beta, be._ptr(c), ldc)
    return True


def gemm_half(be, precision, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """C (fp32, M x N, ldc) = alpha * A @ B^T + beta * C for half-precision operands already
    K-major: A (M x K, rows lda apart) and B (N x K, rows ldb apart) as float16 arrays
    holding `precision`'s bits; lda and ldb multiples of 8. Needs compute capability 9.0."""
    m, n, k, lda, ldb, ldc = (int(v) for v in (m, n, k, lda, ldb, ldc))
    kern = kernels(be)
    if kern is None:
        raise WgmmaError(f"gemm_half needs the sm_90a wgmma kernels; {be.device_name} cannot run them")
    if precision not in PRECISIONS:
        raise ValueError(f"gemm_half multiplies {' or '.join(PRECISIONS)}, not {precision}")
    for what, arr, rows, ld in (("A", a, m, lda), ("B", b, n, ldb)):
        if arr.dtype != np.float16 or ld % _ROW_ALIGN or ld < k or arr.size < (rows - 1) * ld + k \
                or arr.ptr % 16:
            raise ValueError(f"gemm_half {what}: want a 16-byte aligned float16 array of {rows} rows "
                             f"of {k}, {ld} apart (a multiple of {_ROW_ALIGN})")
    if c.size < (m - 1) * ldc + n:
        raise ValueError(f"gemm_half C: {c.size} elements for {m} x {n} rows {ldc} apart")
    if m <= 0 or n <= 0 or k <= 0:
        raise ValueError(f"gemm_half: empty product {m} x {n} x {k}")
    _multiply(be, kern, precision, m, n, k, alpha, a.ptr, lda, b.ptr, ldb, beta, c.ptr, ldc)
