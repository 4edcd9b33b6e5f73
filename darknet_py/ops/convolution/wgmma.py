"""Hopper's GEMM for the CUDA backend: gemm_wgmma.cu (wgmma fed by TMA, built for
sm_90a) and its launcher.

CudaBackend.gemm_lowp offers every fp16 / bf16 product to gemm_lowp below first. It takes
the product on a GPU of compute capability 9.0 when K >= MIN_K; a product whose 128 x 256
tiles do not fill the chip splits its K into runs (split_plan: a weight gradient's few
tiles over a long batch of positions), whose partial products splitk_reduce adds up in a
fixed order. Otherwise (another GPU, tf32, a short K, a forced tensor-core plan in
tc_override, DARKNET_WGMMA=0, or the sm_90a build not loading) it declines and the
mma.sync kernels of gemm_tc_*.cu run as before.

The kernel multiplies half-precision operands laid out K-major (A as M x K rows, B as N x K
rows, rows a multiple of 8 elements apart). gemm_lowp's operands are fp32 in any of the
layouts Darknet's gemm takes, so they are first rounded into two scratch buffers in that
layout (to_kmajor: one pass each, transposing where needed); gemm_half multiplies operands
already stored that way. Both write C = alpha * A @ B^T + beta * C in fp32.

The sm_90a binary comes from the wheel (prebuilt.FILE_ARCHS builds this file for sm_90a
only) or from nvcc through the kernel cache, like the other kernel files, but is loaded
only here, on the first product that asks for it. Its blocks come in pairs along M that
share B; a product of one 128-row tile row (m <= 128) runs instead on the same kernel
built with lone blocks (gemm_wgmma_solo.cu, solo_kernels), where the pair's second block
would multiply only zeros.
"""

import ctypes
import functools
import os
import sys

import numpy as np

from ...activations import ACTIVATION_IDS
from ...backends import kernel_cache, prebuilt
from ...shapes import conv_out_size, conv_strides

SOURCE = "gemm_wgmma.cu"
# The same kernels with lone blocks, for products of one tile row (solo_kernels).
SOLO_SOURCE = "gemm_wgmma_solo.cu"
ARCH = "sm_90a"
# gemm_wgmma.cu's WG_BM, WG_BN, WG_BK, WG_STAGES, WG_THREADS, WG_CLUSTER
TILE_M, TILE_N, TILE_K, STAGES, THREADS, CLUSTER = 128, 256, 64, 4, 384, 2


def shared_bytes(stages):
    """Dynamic shared memory of the kernel: the stage ring, 1 KB for its mbarriers, the
    epilogue's 4 buffers of 64 x 32 fp32, and 1 KB to align the ring to 1024 bytes."""
    return stages * (TILE_M + TILE_N) * TILE_K * 2 + 1024 + 4 * 64 * 32 * 4 + 1024


SHARED_BYTES = shared_bytes(STAGES)
# C through TMA stores where its layout allows (rows 16-byte aligned, beta = 0); else
# stores from the registers (bench/kernels/wgmma_probe.py times both).
TMA_STORE = True
# K below this: the product is memory-bound and the conversion pass does not pay (a data
# gradient 288 x 692224 x 64 took 1.16 ms here against 0.75 with mma.sync; at K = 128,
# 0.30 against 0.41, on an H200).
MIN_K = 128
_LINEAR = ACTIVATION_IDS["linear"]
# The kernel's stores of a convolution's images (gemm_wgmma.cu's `store`): fp32, added to
# the fp32 there, or at the operands' 16 bits.
_IMAGES, _IMAGES_16, _IMAGES_ADD = 3, 4, 5
# Below this many multiply-adds, a product of fewer pairs of tiles than the chip's clusters
# stays on mma.sync (its conversion passes and launches would cost more than they save).
MIN_SPLIT_MACS = 1 << 26
# precision -> (kernel name part, CUtensorMapDataType)
PRECISIONS = {"fp16": ("f16", 6), "bf16": ("bf16", 9)}
_FLOAT32 = 7  # CUtensorMapDataType
CONVERT_TILE = (32, 64)  # KM_ROWS, KM_COLS of gemm_wgmma.cu
CONVERT_BLOCK = (32, 8)
_ROW_ALIGN = 8  # halves: TMA wants row strides in multiples of 16 bytes
# cuTensorMapEncodeTiled enums (cuda.h)
_SWIZZLE_128B, _L2_PROMOTION_256B = 3, 3


class WgmmaError(RuntimeError):
    """A failed wgmma launch or tensor-map encoding, naming the kernel and its arguments."""


def _ceil_div(a, b):
    return -(-a // b)


class _Kernels:
    """The sm_90a module of one device, loaded and launched through the driver API (ctypes):
    PyCUDA's packed-argument launch handed this kernel zeros for every argument (its
    64-byte-aligned tensor-map parameters), while a launch with one pointer per argument
    lets the driver place each where the kernel declares it."""

    def __init__(self, image=None, shared_bytes=SHARED_BYTES, cluster=CLUSTER, source=SOURCE):
        """image: a cubin or fatbin of gemm_wgmma.cu (bench/kernels/wgmma_probe.py's variants, with
        their own shared_bytes and cluster size); by default the wheel's or the kernel
        cache's build of `source` (SOURCE, or SOLO_SOURCE with cluster 1)."""
        if image is None:
            with open(prebuilt.kernel_paths()[source]) as f:
                text = f.read()
            binaries, _ = prebuilt.binaries(
                {source: text}, ARCH, kernel_cache.KERNEL_OPTIONS, include_dirs=prebuilt.KERNEL_DIRS
            )
            image = binaries[source]
        lib = _driver()
        self._image = image  # kept alive as long as the module
        self.shared_bytes, self.cluster = shared_bytes, cluster
        module = ctypes.c_void_p()
        _check(lib, "cuModuleLoadData", lib.cuModuleLoadData(ctypes.byref(module), self._image))
        self.functions = {}
        for part, _ in PRECISIONS.values():
            for name in (f"wgmma_gemm_{part}", f"to_kmajor_{part}"):
                fn = ctypes.c_void_p()
                _check(
                    lib,
                    "cuModuleGetFunction",
                    lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
                )
                self.functions[name] = fn
            _check(
                lib,
                "cuFuncSetAttribute",
                lib.cuFuncSetAttribute(
                    self.functions[f"wgmma_gemm_{part}"], _MAX_DYNAMIC_SHARED, shared_bytes
                ),
            )
        # Clusters that fit on the chip at once: the persistent grid's size (a GPC with an
        # odd count of free SMs leaves one idle).
        config = _LaunchConfig((cluster, 1, 1), (THREADS, 1, 1), shared_bytes, None, None, 0)
        count = ctypes.c_int()
        _check(
            lib,
            "cuOccupancyMaxActiveClusters",
            lib.cuOccupancyMaxActiveClusters(
                ctypes.byref(count), self.functions["wgmma_gemm_f16"], ctypes.byref(config)
            ),
        )
        if count.value < 1:
            raise WgmmaError(f"no cluster of {cluster} wgmma blocks fits on this GPU")
        self.max_clusters = count.value


_loaded = {}  # device index -> _Kernels, or None where this device cannot run them
_loaded_solo = {}  # the same for solo_kernels


def kernels(be):
    """The wgmma kernels for be's device; None on a GPU other than compute capability 9.0,
    or where the sm_90a build cannot be had (said once on stderr)."""
    index = be.device_index
    if index not in _loaded:
        _loaded[index] = None
        if be._dev.device.compute_capability() == (9, 0):
            try:
                _loaded[index] = _Kernels()
            except (kernel_cache.KernelCompileError, WgmmaError, OSError) as e:
                print(
                    f"darknet-py: the Hopper GEMM (wgmma) is unavailable, using mma.sync: {e}",
                    file=sys.stderr,
                )
    return _loaded[index]


def solo_kernels(be):
    """The lone-block build (SOLO_SOURCE) for be's device, loaded on the first product of
    one tile row; None where it cannot be had (said once: the pairs then run it)."""
    index = be.device_index
    if index not in _loaded_solo:
        _loaded_solo[index] = None
        try:
            _loaded_solo[index] = _Kernels(cluster=1, source=SOLO_SOURCE)
        except (kernel_cache.KernelCompileError, WgmmaError, OSError) as e:
            print(f"darknet-py: the lone-block wgmma kernels are unavailable: {e}", file=sys.stderr)
    return _loaded_solo[index]


def handles(be, precision, m, n, k):
    """Whether gemm_lowp takes an m x n x k product in `precision` on this backend: K >=
    MIN_K, and a product that does not fill the chip's clusters with pairs of tiles has at
    least MIN_SPLIT_MACS multiply-adds (it splits its K: split_plan); a smaller one (a
    [connected] layer at batch 1) is the mma.sync kernels' small tiles' work."""
    if precision not in PRECISIONS or be.tc_override is not None or k < MIN_K:
        return False
    if os.environ.get("DARKNET_WGMMA", "") == "0":
        return False
    kern = kernels(be)
    if kern is None:
        return False
    pairs = _ceil_div(m, TILE_M * kern.cluster) * _ceil_div(n, TILE_N)
    return pairs >= kern.max_clusters or m * n * k >= MIN_SPLIT_MACS


# split_plan's cost model, in microseconds on an H100/H200: one 64-wide K slice of a
# cluster's pair of 128 x 256 tiles (2 x 4.2 MFLOP at ~75% of the tensor cores' peak), a
# work item's fixed cost (pipeline fill, epilogue) in slices, and the partials' traffic
# (written by the items, read by the reduction).
_SLICE_US, _ITEM_SLICES, _PARTIAL_BYTES_PER_US = 0.75, 5, 3e6
_PARTIALS_CAP = 1 << 25  # floats of partial products (128 MiB)
_MAX_RUNS = 64
split_override = None  # runs of K for every product (tests); None: split_plan's


def split_plan(kern, m, n, k):
    """(slices per run, runs): K's 64-wide slices in runs, each run of each pair of tiles a
    work item of the persistent grid, the runs' partial products then added up. One run
    where the pairs of tiles fill the clusters; else the count the cost model (waves of
    items x their slices, plus the partials' bytes) finds cheapest: the weight gradient of
    a 3x3 layer at 13x13 (512 x 4608 x 5408: 36 pairs on 66 clusters) takes 3 runs, one at
    52x52 (256 x 1152 x 86528: 5 pairs) 13."""
    if split_override is not None:
        slices = _ceil_div(k, TILE_K)
        per = _ceil_div(slices, min(split_override, slices))
        return per, _ceil_div(slices, per)
    return _cheapest_split(kern.cluster, kern.max_clusters, m, n, k)


@functools.lru_cache(maxsize=4096)
def _cheapest_split(cluster, clusters, m, n, k):
    """split_plan's search, once per shape (an eager pass asks it for every GEMM)."""
    slices = _ceil_div(k, TILE_K)
    pairs = _ceil_div(m, TILE_M * cluster) * _ceil_div(n, TILE_N)
    if pairs >= clusters:
        return slices, 1
    best = None
    for runs in range(1, min(_MAX_RUNS, slices, max(1, _PARTIALS_CAP // (m * n))) + 1):
        per = _ceil_div(slices, runs)
        used = _ceil_div(slices, per)  # runs of `per` slices that K fills
        waves = _ceil_div(pairs * used, clusters)
        cost = waves * (per + _ITEM_SLICES) * _SLICE_US
        if used > 1:
            cost += (used + 1) * m * n * 4 / _PARTIAL_BYTES_PER_US
        if best is None or cost < best[0]:
            best = (cost, per, used)
    return best[1], best[2]


class _LaunchConfig(ctypes.Structure):
    """CUlaunchConfig (cuda.h)."""

    _fields_ = [
        ("grid", ctypes.c_uint * 3),
        ("block", ctypes.c_uint * 3),
        ("shared", ctypes.c_uint),
        ("stream", ctypes.c_void_p),
        ("attrs", ctypes.c_void_p),
        ("num_attrs", ctypes.c_uint),
    ]


_lib = None
_MAX_DYNAMIC_SHARED = 8  # CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES


def _driver():
    global _lib
    if _lib is None:
        lib = ctypes.CDLL("libcuda.so.1")
        vp, u32, u64p = ctypes.c_void_p, ctypes.c_uint32, ctypes.POINTER(ctypes.c_uint64)
        u32p = ctypes.POINTER(ctypes.c_uint32)
        for name, args in (
            (
                "cuTensorMapEncodeTiled",
                (
                    vp,
                    ctypes.c_int,
                    u32,
                    vp,
                    u64p,
                    u64p,
                    u32p,
                    u32p,
                    ctypes.c_int,
                    ctypes.c_int,
                    ctypes.c_int,
                    ctypes.c_int,
                ),
            ),
            ("cuModuleLoadData", (ctypes.POINTER(vp), ctypes.c_char_p)),
            ("cuModuleGetFunction", (ctypes.POINTER(vp), vp, ctypes.c_char_p)),
            ("cuFuncSetAttribute", (vp, ctypes.c_int, ctypes.c_int)),
            (
                "cuLaunchKernel",
                (vp, u32, u32, u32, u32, u32, u32, u32, vp, ctypes.POINTER(vp), ctypes.POINTER(vp)),
            ),
            (
                "cuOccupancyMaxActiveClusters",
                (ctypes.POINTER(ctypes.c_int), vp, ctypes.POINTER(_LaunchConfig)),
            ),
            ("cuGetErrorName", (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p))),
        ):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, ctypes.c_int
        _lib = lib
    return _lib


def _check(lib, call, code, what=""):
    if code:
        name = ctypes.c_char_p()
        lib.cuGetErrorName(code, ctypes.byref(name))
        raise WgmmaError(f"{call} failed{what}: {(name.value or b'CUDA error %d' % code).decode()}")


_maps = {}  # tensor_map's arguments -> its bytes: encoding costs ~10 us of host time


def tensor_map(ptr, rows, cols, pitch, box_rows, data_type, box_cols=TILE_K, item=2):
    """_encode_map's tensor map, encoded once per set of arguments."""
    key = (ptr, rows, cols, pitch, box_rows, data_type, box_cols, item)
    found = _maps.get(key)
    if found is None:
        if len(_maps) >= 256:
            _maps.clear()
        found = _maps[key] = _encode_map(*key)
    return found


def _encode_map(ptr, rows, cols, pitch, box_rows, data_type, box_cols, item):
    """The 128 bytes (a ctypes array) of a 2-D tensor map over a rows x cols matrix of
    `item`-byte elements at `ptr` (rows `pitch` elements apart): boxes of box_cols x box_rows
    (box_cols * item = 128 bytes), 128-byte swizzle, zeros outside the matrix."""
    buf = ctypes.create_string_buffer(128 + 64)
    address = (ctypes.addressof(buf) + 63) & ~63  # the driver wants it 64-byte aligned
    dims = (ctypes.c_uint64 * 2)(cols, rows)
    strides = (ctypes.c_uint64 * 1)(pitch * item)
    box = (ctypes.c_uint32 * 2)(box_cols, box_rows)
    steps = (ctypes.c_uint32 * 2)(1, 1)
    err = _driver().cuTensorMapEncodeTiled(
        address,
        data_type,
        2,
        ptr,
        dims,
        strides,
        box,
        steps,
        0,
        _SWIZZLE_128B,
        _L2_PROMOTION_256B,
        0,
    )
    if err:
        raise WgmmaError(
            f"cuTensorMapEncodeTiled failed (CUresult {err}) for a {rows} x {cols} "
            f"matrix at 0x{ptr:x}, row pitch {pitch}"
        )
    return (ctypes.c_ubyte * 128).from_buffer_copy(ctypes.string_at(address, 128))


def _launch(be, kern, name, grid, block, *args, shared=0):
    """Queue kernel `name` on be's stream; args are ctypes values (a tensor map: 128 bytes)."""
    grid = (*map(int, grid), 1, 1)[:3]
    block = (*map(int, block), 1, 1)[:3]
    pointers = (ctypes.c_void_p * len(args))(
        *(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args)
    )
    lib = _driver()
    _check(
        lib,
        "cuLaunchKernel",
        lib.cuLaunchKernel(
            kern.functions[name], *grid, *block, shared, be.stream.handle, pointers, None
        ),
        f" for kernel {name} with grid={grid} block={block}",
    )
    be._launched(name, grid, block, WgmmaError)


def row_pitch(k):
    """Elements between rows of a K-major half-precision operand of K columns."""
    return _ceil_div(max(int(k), 1), _ROW_ALIGN) * _ROW_ALIGN


def _to_kmajor(be, kern, part, src, ld, rows, cols, transposed, dst, pitch):
    grid = (_ceil_div(rows, CONVERT_TILE[0]), _ceil_div(cols, CONVERT_TILE[1]))
    i = ctypes.c_int
    _launch(
        be,
        kern,
        f"to_kmajor_{part}",
        grid,
        CONVERT_BLOCK,
        ctypes.c_uint64(src),
        i(ld),
        i(rows),
        i(cols),
        i(int(transposed)),
        ctypes.c_uint64(dst),
        i(pitch),
    )


def _multiply(
    be,
    kern,
    precision,
    m,
    n,
    k,
    alpha,
    a,
    lda,
    b,
    ldb,
    beta,
    c,
    ldc,
    images=None,
    bias=0,
    act=_LINEAR,
    store=_IMAGES,
):
    """C = alpha * A @ B^T + beta * C on the wgmma kernel, A and B already K-major. images:
    (positions, image_stride): C is a convolution's output, column j going to position
    j % positions of image j / positions, bias (a pointer or 0) added and the activation
    act (an activations.ACTIVATION_IDS value) applied (ldc and beta unused: one run, no
    split), written as `store` says (_IMAGES, _IMAGES_ADD or _IMAGES_16). A product of one
    tile row runs on the lone blocks (solo_kernels): in a pair, the second block would
    multiply only zeros."""
    if m <= TILE_M and kern.cluster > 1:
        kern = solo_kernels(be) or kern
    part, data_type = PRECISIONS[precision]
    a_map = tensor_map(a, m, k, lda, TILE_M, data_type)
    b_map = tensor_map(b, n, k, ldb, TILE_N // kern.cluster, data_type)  # each block its part
    tile_pairs = _ceil_div(m, TILE_M * kern.cluster) * _ceil_div(n, TILE_N)
    per, runs = (_ceil_div(k, TILE_K), 1) if images else split_plan(kern, m, n, k)
    out, out_ld, out_alpha, out_beta = c, ldc, alpha, beta
    if runs > 1:  # each run's partial product (m x n, rows n apart), added up below
        out = be._ptr(be._scratch_buffer("gemm", 4 * runs * m * n))
        out_ld, out_alpha, out_beta = n, 1.0, 0.0
    c_map = a_map  # unused but by TMA stores
    if not images:
        if TMA_STORE and runs == 1 and beta == 0 and c % 16 == 0 and ldc % 4 == 0:
            store, c_map = 2, tensor_map(c, m, n, ldc, 64, _FLOAT32, box_cols=32, item=4)
        else:  # float2 stores where aligned, else scalar
            store = int(out % 8 == 0 and out_ld % 2 == 0 and (runs == 1 or m * n % 2 == 0))
    positions, image_stride = images or (0, 0)
    i, f = ctypes.c_int, ctypes.c_float
    _launch(
        be,
        kern,
        f"wgmma_gemm_{part}",
        (kern.cluster * min(tile_pairs * runs, kern.max_clusters),),
        (THREADS,),
        a_map,
        b_map,
        c_map,
        i(m),
        i(n),
        i(k),
        f(out_alpha),
        f(out_beta),
        ctypes.c_uint64(out),
        i(out_ld),
        i(store),
        i(per),
        ctypes.c_int64(m * n),
        i(positions),
        ctypes.c_int64(image_stride),
        ctypes.c_uint64(bias),
        i(act),
        shared=kern.shared_bytes,
    )
    if runs > 1:
        be._splitk_reduce(m, n, runs, out, alpha, beta, c, ldc)


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


def weight_grad_unfolded(
    be,
    precision,
    im,
    channels,
    height,
    width,
    ksize,
    stride,
    pad,
    dilation,
    batch,
    im_stride,
    delta,
    filters,
    weight_updates,
):
    """CudaBackend.conv_weight_grad_unfolded on the wgmma kernel (arguments checked by the
    caller, handles() true): delta (filters x batch*positions fp32) rounded into the A
    operand by to_kmajor, the images unfolded by im2col_{f16,bf16}_kernel (im2col.cu)
    straight into the B operand (channels*ksize^2 rows of batch*positions), then
    weight_updates += A @ B^T. A 16-bit im (a layer output at `precision`): its bits as
    they are (im2col_{f16,bf16}_from_*)."""
    kern = kernels(be)
    part, _ = PRECISIONS[precision]
    unfold = _unfolding(be, "weight_grad_unfolded im", im, precision, f"im2col_{part}")
    out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
    stride_y, stride_x = conv_strides(stride)
    m, n, k = int(filters), channels * ksize * ksize, batch * out_h * out_w
    pitch = row_pitch(k)
    a16 = be._ptr(be._scratch_buffer("wgmma_a", 2 * m * pitch))
    b16 = be._ptr(be._scratch_buffer("wgmma_b", 2 * n * pitch))
    _to_kmajor(be, kern, part, be._ptr(delta), k, m, k, False, a16, pitch)
    # A thread: two columns of col (4-byte stores), ~4 channels (its columns' image and
    # window origin worked out once for them).
    be._launch_rows(
        unfold,
        _ceil_div(channels, 4),
        _ceil_div(k, 2),
        be._ptr(im),
        int(channels),
        int(height),
        int(width),
        int(ksize),
        int(stride_y),
        int(stride_x),
        int(pad),
        int(dilation),
        int(out_h),
        int(out_w),
        b16,
        int(batch),
        int(im_stride),
        int(pitch),
    )
    _multiply(
        be, kern, precision, m, n, k, 1.0, a16, pitch, b16, pitch, 1.0, be._ptr(weight_updates), n
    )


def _unfolding(be, what, im, precision, kernel):
    """`kernel`'s name, or that of its twin over a 16-bit im at `precision`'s own bits."""
    if be._input_storage(what, im, precision) == precision:
        part, _ = PRECISIONS[precision]
        return f"{kernel}_from_{part}_kernel"
    return f"{kernel}_kernel"


# The forward convolutions conv_forward takes: 3x3 kernels over at most this many output
# positions, where the implicit mma.sync kernel is bound by its math (the 3x3 layers at
# 13x13-52x52 ran at 59-83 TFLOP/s, ~550 on wgmma) and the unfolded operand stays as
# small as the weight gradients' (the same scratch).
FORWARD_MAX_POSITIONS = 52 * 52
# im2col.cu's IM2COL_ROW_CHANNELS and IM2COL_ROWS_TILE: a block stages a tile of rows x a
# chunk of channels (a thread a row and 8 channels), then stores the rows coalesced.
_ROW_CHANNELS, _ROWS_TILE = 16, 64
_ROWS_THREADS = _ROWS_TILE * _ROW_CHANNELS // 8


def forward_takes(be, precision, m, n, k, ksize, positions):
    """Whether conv_forward runs a convolution of m filters, k weights a filter and n =
    images * positions outputs on the wgmma kernel: fp16/bf16, a 3x3 kernel over at most
    FORWARD_MAX_POSITIONS positions, and a product handles() takes with at least half as
    many pairs of tiles as the chip has clusters (no split K here: a batch of one image
    stays on conv_tc)."""
    if precision not in PRECISIONS or ksize != 3 or not 0 < positions <= FORWARD_MAX_POSITIONS:
        return False
    if not handles(be, precision, m, n, k):
        return False
    kern = kernels(be)
    return _ceil_div(m, TILE_M * kern.cluster) * _ceil_div(n, TILE_N) >= kern.max_clusters // 2


def conv_forward(
    be,
    packed,
    im,
    channels,
    height,
    width,
    ksize,
    stride,
    pad,
    dilation,
    batch,
    im_stride,
    biases,
    activation,
    out,
    out_stride,
    half_out=False,
    accumulate=False,
):
    """CudaBackend.conv_forward on the wgmma kernel where it pays (arguments checked by the
    caller, activation one of precision.EPILOGUE_ACTIVATIONS); False, having done nothing,
    where forward_takes() says no. The images are unfolded position by position
    (im2col_rows_{f16,bf16}_kernel) into the B operand; the packed weights are the A operand
    as they are; the tiles go out in the layer's layout, bias and activation applied as
    conv_tc's epilogue applies them, as fp32, added to the fp32 there (accumulate), or
    rounded to the operands' 16 bits (half_out). im: fp32, or a 16-bit layer output at the
    weights' precision (im2col_rows_*_from_*: its bits as they are)."""
    precision = packed.precision
    out_h, out_w = conv_out_size(height, width, ksize, stride, pad, dilation)
    positions = out_h * out_w
    m, n, k = packed.rows, batch * positions, packed.k
    if not forward_takes(be, precision, m, n, k, ksize, positions) or packed.pitch % _ROW_ALIGN:
        return False
    kern = kernels(be)
    part, _ = PRECISIONS[precision]
    stride_y, stride_x = conv_strides(stride)
    pitch = row_pitch(k)
    b16 = be._ptr(be._scratch_buffer("wgmma_b", 2 * n * pitch))
    be._launch(
        _unfolding(be, "conv_forward im", im, precision, f"im2col_rows_{part}"),
        (_ceil_div(n, _ROWS_TILE) * _ceil_div(channels, _ROW_CHANNELS),),
        (_ROWS_THREADS,),
        be._ptr(im),
        int(channels),
        int(height),
        int(width),
        int(stride_y),
        int(stride_x),
        int(pad),
        int(dilation),
        int(out_h),
        int(out_w),
        b16,
        int(n),
        int(im_stride),
        int(pitch),
    )
    _multiply(
        be,
        kern,
        precision,
        m,
        n,
        k,
        1.0,
        be._ptr(packed.data),
        packed.pitch,
        b16,
        pitch,
        0.0,
        be._ptr(out),
        0,
        images=(positions, int(out_stride)),
        bias=0 if biases is None else be._ptr(biases),
        act=ACTIVATION_IDS[activation],
        store=_IMAGES_16 if half_out else _IMAGES_ADD if accumulate else _IMAGES,
    )
    return True


def gemm_half(be, precision, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """C (fp32, M x N, ldc) = alpha * A @ B^T + beta * C for half-precision operands already
    K-major: A (M x K, rows lda apart) and B (N x K, rows ldb apart) as float16 arrays
    holding `precision`'s bits; lda and ldb multiples of 8. Needs compute capability 9.0."""
    m, n, k, lda, ldb, ldc = (int(v) for v in (m, n, k, lda, ldb, ldc))
    kern = kernels(be)
    if kern is None:
        raise WgmmaError(
            f"gemm_half needs the sm_90a wgmma kernels; {be.device_name} cannot run them"
        )
    if precision not in PRECISIONS:
        raise ValueError(f"gemm_half multiplies {' or '.join(PRECISIONS)}, not {precision}")
    for what, arr, rows, ld in (("A", a, m, lda), ("B", b, n, ldb)):
        if (
            arr.dtype != np.float16
            or ld % _ROW_ALIGN
            or ld < k
            or arr.size < (rows - 1) * ld + k
            or arr.ptr % 16
        ):
            raise ValueError(
                f"gemm_half {what}: want a 16-byte aligned float16 array of {rows} rows "
                f"of {k}, {ld} apart (a multiple of {_ROW_ALIGN})"
            )
    if c.size < (m - 1) * ldc + n:
        raise ValueError(f"gemm_half C: {c.size} elements for {m} x {n} rows {ldc} apart")
    if m <= 0 or n <= 0 or k <= 0:
        raise ValueError(f"gemm_half: empty product {m} x {n} x {k}")
    _multiply(be, kern, precision, m, n, k, alpha, a.ptr, lda, b.ptr, ldb, beta, c.ptr, ldc)


def variant_kernels(image, stages, cluster):
    """The Hopper GEMM from a cubin built another way (-D WGMMA_STAGES, WGMMA_GROUP_M,
    WG_CLUSTER), for bench/kernels/wgmma_probe.py to time against the shipped build."""
    return _Kernels(image, shared_bytes(stages), cluster)


def gemm_half_on(be, kern, precision, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc):
    """gemm_half's product on the kernels `kern` (variant_kernels), unchecked."""
    _multiply(be, kern, precision, m, n, k, alpha, a.ptr, lda, b.ptr, ldb, beta, c.ptr, ldc)
