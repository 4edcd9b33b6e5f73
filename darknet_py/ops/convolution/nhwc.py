"""The channels-last 16-bit convolution forward on Hopper (issue 42): conv_nhwc.cu's implicit
GEMM on wgmma, its images copied by TMA in im2col mode (no unfold buffer), and its
launcher; a mixin of CudaBackend (CudaConvNhwc), NumpyBackend's nhwc_numpy.py the
reference.

The kernel is gemm_wgmma.cu's pipeline (persistent blocks in clusters of wgmma.CLUSTER
along M, 64-wide K slices in a ring of stages) with M the output pixels, N the output
channels and K the filter taps x the pixel pitch cx, (tap, channel); tiles of 128 pixels x
64, 128 or 256 channels, the narrowest that holds the layer's (tile_width; one kernel
each, the narrower with deeper rings):
  * A: a 4-D im2col tensor map over the images (dims cx, w, h, batch; the window's
    corners -pad and pad - (ksize - 1) in W and H; elementStrides the convolution's
    stride; 64 channels x 128 pixels a copy, 128-byte swizzle); a copy names the tile's
    first pixel by its window's corner (w, h, image) and the tap by the im2col offsets
    (kx, ky). A 1x1 stride-1 unpadded convolution is a plain GEMM: a 2-D tiled map over
    the batch's pixels (rows) x cx.
  * B: a 3-D tiled map over the packed weights (dims cx, taps, cout; box 64 x 1 x
    width / 2, each block of a pair copying its half of the tile's rows, multicast to both).
  * Pixels under 64 channels (cx < 64: a first layer's 3 channels in a pitch of 8) go by
    8-channel chunks instead: A by 8 im2col copies a stage of 128 pixels x 8 channels
    (no swizzle), B by a 2-D map over the weights as [cout][taps * cx].
The sm_90a build is loaded on the first call, as wgmma.py's (prebuilt.FILE_ARCHS builds
this file for sm_90a only); on any other GPU conv_nhwc_forward refuses in one line.
"""

import ctypes
import sys

import numpy as np

from ... import precision as precisions
from ...activations import ACTIVATION_IDS
from ...backends import kernel_cache, prebuilt
from . import wgmma
from .nhwc_common import NhwcConvError, check_forward, check_pack, pack_host

SOURCE = "conv_nhwc.cu"
ARCH = "sm_90a"
TILE_M, TILE_K, THREADS, CLUSTER = wgmma.TILE_M, wgmma.TILE_K, wgmma.THREADS, wgmma.CLUSTER
# The tiles' widths (output channels), one kernel each, and conv_nhwc.cu's NcTile<BN>::STAGES.
TILE_WIDTHS = (64, 128, 256)
_RING_STAGES = {256: 4, 128: 6, 64: 8}


def shared_bytes(width):
    """Dynamic shared memory of the BN = width kernel (conv_nhwc_body's layout): the stage
    ring, 1 KB for its mbarriers, both consumers' statistics (each warp's float2 a column),
    and 1 KB of slack to align the ring to 1024 bytes."""
    ring = _RING_STAGES[width] * (TILE_M + width) * TILE_K * 2
    return ring + 1024 + 2 * 4 * width * 8 + 1024


def tile_width(cout):
    """The narrowest tile that holds cout channels (256 past that)."""
    return next((w for w in TILE_WIDTHS if cout <= w), TILE_WIDTHS[-1])


PACK_BLOCK = 256
# None: clear the descriptor bit below on the drivers CUTLASS names; True / False: always /
# never (tests run both ways, in case the workaround itself misbehaves on a driver).
small_tensor_fix = None
# Images with a pitch under 64 channels go by 8-channel chunks (conv_nhwc.cu's NC_NARROW)
# rather than 64-channel slices mostly zeros; False: by slices (tests compare the two).
narrow_chunks = True
_PLAIN, _IM2COL, _NARROW = 0, 1, 2  # conv_nhwc.cu's NhwcMode
_SWIZZLE_NONE, _CHUNK = 0, 8
# True: every convolution through im2col copies, 1x1 stride-1 unpadded ones too (tests
# compare the two ways of copying A).
always_im2col = False
# cuTensorMapEncode* enums (cuda.h)
_INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS = 0, 3, 3, 0
# Drivers up to 13.1 mis-handle a TMA descriptor over a tensor under 128 KiB now and then;
# CUTLASS (4.3.4) clears this bit of the descriptor's second word for them, as done here.
_SMALL_TENSOR_BYTES, _SMALL_TENSOR_BIT, _LAST_AFFECTED_DRIVER = 128 * 1024, 21, 13010


class NhwcKernels:
    """conv_nhwc.cu's sm_90a module on one device (loaded through the driver API, as
    wgmma._Kernels: one pointer per argument, so the tensor maps land 64-byte aligned)."""

    def __init__(self, image=None):
        if image is None:
            with open(prebuilt.kernel_paths()[SOURCE]) as f:
                text = f.read()
            binaries, _ = prebuilt.binaries(
                {SOURCE: text}, ARCH, kernel_cache.KERNEL_OPTIONS, include_dirs=prebuilt.KERNEL_DIRS
            )
            image = binaries[SOURCE]
        lib = _driver()
        self._image = image  # kept alive as long as the module
        self.cluster = CLUSTER
        module = ctypes.c_void_p()
        wgmma._check(lib, "cuModuleLoadData", lib.cuModuleLoadData(ctypes.byref(module), image))
        self.functions = {}
        names = [f"pack_nhwc_weights_{part}" for part, _ in wgmma.PRECISIONS.values()]
        names += [self.conv_name(p, width) for p in wgmma.PRECISIONS for width in TILE_WIDTHS]
        for name in names:
            fn = ctypes.c_void_p()
            wgmma._check(
                lib,
                "cuModuleGetFunction",
                lib.cuModuleGetFunction(ctypes.byref(fn), module, name.encode()),
            )
            self.functions[name] = fn
        self.max_clusters = {}  # tile width -> clusters that fit on the chip at once
        for width in TILE_WIDTHS:
            for p in wgmma.PRECISIONS:
                wgmma._check(
                    lib,
                    "cuFuncSetAttribute",
                    lib.cuFuncSetAttribute(
                        self.functions[self.conv_name(p, width)],
                        wgmma._MAX_DYNAMIC_SHARED,
                        shared_bytes(width),
                    ),
                )
            config = wgmma._LaunchConfig(
                (CLUSTER, 1, 1), (THREADS, 1, 1), shared_bytes(width), None, None, 0
            )
            count = ctypes.c_int()
            wgmma._check(
                lib,
                "cuOccupancyMaxActiveClusters",
                lib.cuOccupancyMaxActiveClusters(
                    ctypes.byref(count),
                    self.functions[self.conv_name("fp16", width)],
                    ctypes.byref(config),
                ),
            )
            if count.value < 1:
                raise wgmma.WgmmaError(f"no cluster of {CLUSTER} conv_nhwc blocks fits on this GPU")
            self.max_clusters[width] = count.value
        version = ctypes.c_int()
        wgmma._check(lib, "cuDriverGetVersion", lib.cuDriverGetVersion(ctypes.byref(version)))
        self.driver_needs_fix = version.value <= _LAST_AFFECTED_DRIVER

    @staticmethod
    def conv_name(precision, width):
        return f"conv_nhwc_{wgmma.PRECISIONS[precision][0]}_n{width}"


_loaded = {}  # device index -> NhwcKernels, or None where the device cannot run them


def kernels(be):
    """conv_nhwc.cu's kernels for be's device; None on a GPU other than compute capability
    9.0, or where the sm_90a build cannot be had (said once on stderr)."""
    index = be.device_index
    if index not in _loaded:
        _loaded[index] = None
        if be._dev.device.compute_capability() == (9, 0):
            try:
                _loaded[index] = NhwcKernels()
            except (kernel_cache.KernelCompileError, wgmma.WgmmaError, OSError) as e:
                print(
                    f"darknet-py: the NHWC convolution kernels are unavailable: {e}",
                    file=sys.stderr,
                )
    return _loaded[index]


_lib = None


def _driver():
    """wgmma's driver library with the two entry points it does not declare."""
    global _lib
    if _lib is None:
        lib = wgmma._driver()
        vp, u32 = ctypes.c_void_p, ctypes.c_uint32
        u64p, u32p, ip = (
            ctypes.POINTER(t) for t in (ctypes.c_uint64, ctypes.c_uint32, ctypes.c_int)
        )
        encode = lib.cuTensorMapEncodeIm2col
        encode.argtypes = (vp, ctypes.c_int, u32, vp, u64p, u64p, ip, ip, u32, u32, u32p)
        encode.argtypes += (ctypes.c_int,) * 4
        encode.restype = ctypes.c_int
        version = lib.cuDriverGetVersion
        version.argtypes, version.restype = (ip,), ctypes.c_int
        _lib = lib
    return _lib


_maps = {}  # a map's arguments -> its bytes: encoding costs ~10 us of host time


def _cached(key, encode):
    found = _maps.get(key)
    if found is None:
        if len(_maps) >= 256:
            _maps.clear()
        found = _maps[key] = encode()
    return found


def _descriptor(encode_call, what, tensor_bytes, fix):
    """The 128 bytes of a tensor map that encode_call(address) writes (CUresult 0) at a
    64-byte aligned address; NhwcConvError naming `what` if the driver refuses it. fix:
    clear the small-tensor bit (_fix_small_tensors)."""
    buf = ctypes.create_string_buffer(128 + 64)
    address = (ctypes.addressof(buf) + 63) & ~63
    err = encode_call(address)
    if err:
        raise NhwcConvError(
            f"conv_nhwc_forward: the driver refused the tensor map of {what} (CUresult {err})"
        )
    words = (ctypes.c_uint64 * 16).from_address(address)
    if fix and tensor_bytes < _SMALL_TENSOR_BYTES:
        words[1] &= ~(1 << _SMALL_TENSOR_BIT)
    return (ctypes.c_ubyte * 128).from_buffer_copy(ctypes.string_at(address, 128))


def _fix_small_tensors(kern):
    return kern.driver_needs_fix if small_tensor_fix is None else bool(small_tensor_fix)


def im2col_map(kern, ptr, batch, h, w, cx, ksize, stride, pad, data_type, narrow=False):
    """The im2col tensor map over NHWC images [batch, h, w, cx] (see the module's docstring):
    64 channels a pixel, 128-byte swizzle; narrow: 8 channels a pixel, no swizzle."""
    channels, swizzle = (_CHUNK, _SWIZZLE_NONE) if narrow else (TILE_K, _SWIZZLE_128B)

    def encode():
        def call(address):
            dims = (ctypes.c_uint64 * 4)(cx, w, h, batch)
            strides = (ctypes.c_uint64 * 3)(cx * 2, w * cx * 2, h * w * cx * 2)
            lower = (ctypes.c_int * 2)(-pad, -pad)  # W, H: the first window's corner
            upper = (ctypes.c_int * 2)(pad - (ksize - 1), pad - (ksize - 1))  # the last one's
            steps = (ctypes.c_uint32 * 4)(1, stride, stride, 1)
            return _driver().cuTensorMapEncodeIm2col(
                address,
                data_type,
                4,
                ptr,
                dims,
                strides,
                lower,
                upper,
                channels,
                TILE_M,
                steps,
                _INTERLEAVE_NONE,
                swizzle,
                _L2_PROMOTION_256B,
                _OOB_FILL_ZEROS,
            )

        what = (
            f"the {batch}x{h}x{w}x{cx} images (im2col, {ksize}x{ksize} pad {pad} stride {stride})"
        )
        return _descriptor(call, what, batch * h * w * cx * 2, fix)

    fix = _fix_small_tensors(kern)
    key = ("im2col", ptr, batch, h, w, cx, ksize, stride, pad, data_type, narrow, fix)
    return _cached(key, encode)


def tiled_map(kern, ptr, dims, box, data_type, what):
    """A tiled tensor map over a packed 16-bit tensor of `dims` (innermost first), boxes of
    `box`, 128-byte swizzle, zeros outside the tensor."""

    def encode():
        def call(address):
            rank = len(dims)
            strides, step = [], 2
            for d in dims[:-1]:
                step *= d
                strides.append(step)
            return _driver().cuTensorMapEncodeTiled(
                address,
                data_type,
                rank,
                ptr,
                (ctypes.c_uint64 * rank)(*dims),
                (ctypes.c_uint64 * max(1, rank - 1))(*strides),
                (ctypes.c_uint32 * rank)(*box),
                (ctypes.c_uint32 * rank)(*([1] * rank)),
                _INTERLEAVE_NONE,
                _SWIZZLE_128B,
                _L2_PROMOTION_256B,
                _OOB_FILL_ZEROS,
            )

        return _descriptor(call, what, int(np.prod(dims)) * 2, fix)

    fix = _fix_small_tensors(kern)
    return _cached(("tiled", ptr, tuple(dims), tuple(box), data_type, fix), encode)


def _aligned(what, arr, alignment):
    if arr.ptr % alignment:
        raise NhwcConvError(
            f"conv_nhwc_forward: {what} must start {alignment}-byte aligned (0x{arr.ptr:x})"
        )


def launch_forward(
    be,
    kern,
    precision,
    x,
    batch,
    h,
    w,
    cx,
    weights,
    cout,
    ksize,
    stride,
    pad,
    out,
    out_pitch,
    out_offset,
    bias,
    activation,
    stats,
    out_h,
    out_w,
):
    """Queue conv_nhwc_{f16,bf16} (arguments checked: nhwc_common.check_forward)."""
    _aligned("x", x, 16)
    _aligned("weights", weights, 16)
    _aligned("out", out, 4)
    _, data_type = wgmma.PRECISIONS[precision]
    m, n = batch * out_h * out_w, cout
    width = tile_width(cout)
    taps = ksize * ksize
    if ksize == 1 and stride == 1 and pad == 0 and not always_im2col:
        # the pixels themselves are A's rows
        mode, runs = _PLAIN, wgmma._ceil_div(cx, TILE_K)
        a_map = tiled_map(
            kern, x.ptr, (cx, batch * h * w), (TILE_K, TILE_M), data_type, "the images"
        )
    elif cx < TILE_K and narrow_chunks:
        mode, runs = _NARROW, cx // _CHUNK
        a_map = im2col_map(kern, x.ptr, batch, h, w, cx, ksize, stride, pad, data_type, narrow=True)
    else:
        mode, runs = _IM2COL, wgmma._ceil_div(cx, TILE_K)
        a_map = im2col_map(kern, x.ptr, batch, h, w, cx, ksize, stride, pad, data_type)
    if mode == _NARROW:  # K runs across the taps: the weights as [cout][taps * cx]
        dims, box = (taps * cx, cout), (TILE_K, width // kern.cluster)
    else:  # a slice never crosses a tap: past cx come zeros, not the next tap's weights
        dims, box = (cx, taps, cout), (TILE_K, 1, width // kern.cluster)
    b_map = tiled_map(kern, weights.ptr, dims, box, data_type, "the weights")
    pairs = wgmma._ceil_div(m, TILE_M * kern.cluster) * wgmma._ceil_div(n, width)
    sums, squares = stats if stats is not None else (None, None)
    i, pointer = ctypes.c_int, ctypes.c_uint64
    wgmma._launch(
        be,
        kern,
        f"conv_nhwc_{wgmma.PRECISIONS[precision][0]}_n{width}",  # NhwcKernels.conv_name
        (kern.cluster * min(pairs, kern.max_clusters[width]),),
        (THREADS,),
        a_map,
        b_map,
        i(mode),
        i(m),
        i(n),
        i(runs),
        i(ksize),
        i(out_h),
        i(out_w),
        i(stride),
        i(pad),
        pointer(out.ptr),
        ctypes.c_int64(out_pitch),
        i(out_offset),
        pointer(0 if bias is None else bias.ptr),
        i(ACTIVATION_IDS[activation]),
        pointer(0 if sums is None else sums.ptr),
        pointer(0 if squares is None else squares.ptr),
        shared=shared_bytes(width),
    )


class CudaConvNhwc:
    """pack_nhwc_weights, conv_nhwc_forward (NumpyBackend's nhwc_numpy.py the reference)."""

    def pack_nhwc_weights(self, weights, cout, c, ksize, cx, precision):
        """NumpyConvNhwc.pack_nhwc_weights: a 16-bit device array (storage_zeros at
        `precision`) [cout, ksize, ksize, cx], by pack_nhwc_weights_{f16,bf16} on Hopper
        (a training step repacks on the device), on the host elsewhere."""
        check_pack(cout, c, ksize, cx, precision)
        cout, c, ksize, cx = int(cout), int(c), int(ksize), int(cx)
        need = cout * c * ksize * ksize
        if self.storage_of(weights) != precisions.DEFAULT or weights.size < need:
            raise NhwcConvError(
                f"pack_nhwc_weights: weights must be an fp32 array of at least {need} values "
                f"(cout x c x ksize x ksize), got {weights.size} kept at {self.storage_of(weights)}"
            )
        packed = self.storage_zeros(cout * ksize * ksize * cx, precision)
        kern = kernels(self)
        if kern is None:
            host = pack_host(self.to_host(weights[:need]), cout, c, ksize, cx).reshape(-1)
            self.copy_rounded(self.from_host(host), packed, precision)
            return packed
        part, _ = wgmma.PRECISIONS[precision]
        blocks = min(wgmma._ceil_div(packed.size, PACK_BLOCK), self.sm_count * 8)
        i = ctypes.c_int
        wgmma._launch(
            self,
            kern,
            f"pack_nhwc_weights_{part}",
            (blocks,),
            (PACK_BLOCK,),
            ctypes.c_uint64(weights.ptr),
            i(cout),
            i(c),
            i(ksize * ksize),
            i(cx),
            ctypes.c_uint64(packed.ptr),
        )
        return packed

    def conv_nhwc_forward(
        self,
        precision,
        x,
        batch,
        h,
        w,
        cx,
        weights,
        cout,
        ksize,
        stride,
        pad,
        out,
        out_pitch,
        out_offset,
        bias=None,
        activation="linear",
        stats=None,
        dilation=1,
    ):
        """NumpyConvNhwc.conv_nhwc_forward on conv_nhwc.cu's wgmma kernel (a GPU of compute
        capability 9.0; elsewhere NhwcConvError). x and weights 16-byte aligned, out
        4-byte aligned (whole arrays are). The statistics are added by fp32 atomics, one
        per channel per 64 pixels: their last bits depend on the order the tiles finish."""
        out_h, out_w = check_forward(
            self,
            precision,
            x,
            batch,
            h,
            w,
            cx,
            weights,
            cout,
            ksize,
            stride,
            pad,
            out,
            out_pitch,
            out_offset,
            bias,
            activation,
            stats,
            dilation,
        )
        kern = kernels(self)
        if kern is None:
            raise NhwcConvError(
                f"conv_nhwc_forward needs a GPU of compute capability 9.0 (wgmma, TMA im2col); "
                f"{self.device_name} cannot run it"
            )
        launch_forward(
            self,
            kern,
            precision,
            x,
            int(batch),
            int(h),
            int(w),
            int(cx),
            weights,
            int(cout),
            int(ksize),
            int(stride),
            int(pad),
            out,
            int(out_pitch),
            int(out_offset),
            bias,
            activation,
            stats,
            out_h,
            out_w,
        )
