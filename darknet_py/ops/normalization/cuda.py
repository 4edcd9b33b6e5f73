"""The CUDA backend's normalisation ops: per-channel bias and scale, batch normalisation
(forward, backward) and its per-channel reductions (batchnorm.cu, with the fused
normalise-scale-shift-activation of ops/elementwise/activations.cu), [l2norm] and [lrn]
(normalization.cu). A mixin of CudaBackend.

A BN layer's x kept at 16 bits under fp16/bf16 (precision.HALF_STORAGE): storage_zeros
makes the array (float16 for fp16, uint16 holding bf16 bits for bf16), copy_rounded writes
it, and the kernels that read x have `_x_f16` / `_x_bf16` twins (batchnorm.cu's loaders)
picked by the ops' x_precision. Those twins also compute in fast forms (the divisor's
reciprocal, fused multiply-adds, mish/swish/logistic from one __expf: activations.cuh's
BatchnormChannel: a few ulp of fp32, far under a 16-bit x's rounding); an fp32 x keeps the
exact steps, the C code's bits."""

import functools

import numpy as np
import pycuda.driver as drv

from ... import activations
from ... import precision as precisions
from ...backends.cuda_core import _BLOCK, _MAX_GRID_Y, _ceil_div
from .numpy import delta_sums_given, rebuild_storage

# Elements of a row each thread of batchnorm_apply and normalize_delta takes, the channel's
# constants worked out once for them (one element a thread spent more on the sqrt and
# divisions than on the bytes).
_ROW_ELEMENTS = 4

# The kernel files this family launches from (formats from their declarations,
# backends/kernel_signatures.py); activations.cu: batch norm's fused apply and rebuild.
KERNEL_FILES = ("batchnorm.cu", "normalization.cu", "activations.cu")

# The channel reductions, whose blocks split each channel's terms alike (_channel_partials):
# paired paths (a pass's own sums against channel_sums over the stored arrays) must add the
# same partial sums to give the same bits.
_CHANNEL_REDUCTIONS = ("channel_sums", "channel_moments", "batchnorm_activation_sums")
# (batchnorm_activation_rows and channel_moments_rows, a 16-bit x's, split by rows: their
# partials pair with none, and they are no part of _reduction_capacity's family.)
# A block's least share of a channel's terms.
_MIN_PART_TERMS = 4096
# The row kernels' partials (batch x pieces a channel) are added by a block a channel
# (channel_finalize_wide, mean_variance_finalize_wide) from this many on: one thread adding
# a channel's parts one after another reads one 32-byte sector a part for its warp, in
# `parts` dependent additions (1376 of them took 1.71 ms a yolov4 fp16 pass), while a block
# a channel pays a fixed two barriers and one wave of `filters` blocks. From 16 parts on (a
# batch of 16 or more over rows of up to 4096 elements) that is the cheaper, as measured
# on the 32 parts of batch-32 rows (64 before). The channel-wise reductions (fp32, tf32: at
# most 1024 parts) always keep channel_finalize, so that their bits and pairings are
# unchanged.
_WIDE_FINALIZE_PARTS = 16


@functools.lru_cache(maxsize=4096)
def reduction_parts(filters, count, capacity):
    """How many blocks split each of `filters` channels of `count` terms, `capacity` blocks
    resident on the whole GPU at once: blocks of equal work take ceil(filters * parts /
    capacity) waves of count / parts terms each, so the fewest parts within 5% of the
    least waves x work (17 parts of 64 channels made 2.06 waves of 4
    resident blocks an SM, a third wave nearly empty). Each part >= _MIN_PART_TERMS terms
    (the block's sums cost as much as that many), at most 1024."""
    most = max(1, min(_ceil_div(count, _MIN_PART_TERMS), 1024))
    cost = {p: _ceil_div(filters * p, capacity) / p for p in range(1, most + 1)}
    best = min(cost.values())
    return next(p for p in range(1, most + 1) if cost[p] <= best * 1.05)


def activation_rows_plan(spatial):
    """(threads a piece, piece length) for batchnorm_activation_rows: rows over 2048
    elements go in pieces of 4096 to 256 threads; shorter ones whole, to the fewest of 32,
    64, 128 or 256 threads that leave each at most 16 elements."""
    if spatial > 2048:
        return 256, 4096
    threads = 32
    while threads < 256 and spatial > 16 * threads:
        threads *= 2
    return threads, max(1, spatial)


# channel_sums terms and channel_finalize ops (enums in batchnorm.cu)
_TERM_A, _TERM_A_MINUS_MEAN_SQ, _TERM_A_TIMES_B, _TERM_A_TIMES_B_MINUS_MEAN = range(4)
_FINAL_MEAN, _FINAL_VARIANCE, _FINAL_ACCUMULATE, _FINAL_MEAN_DELTA, _FINAL_VARIANCE_DELTA = range(5)

# How x is kept, per storage precision: the array's dtype and the suffix of the kernels
# that read it.
_X_STORAGE = {
    "fp32": (np.float32, ""),
    "fp16": (np.float16, "_x_f16"),
    "bf16": (np.uint16, "_x_bf16"),
}
_STORAGE_OF_DTYPE = {
    np.dtype(dtype): name for name, (dtype, _) in _X_STORAGE.items() if name != "fp32"
}


class CudaNorm:
    """Bias/scale, batch norm and channel reductions, l2normalize, lrn."""

    # ---- bias / scale (per-channel, layout batch x n x size) ----------------
    def add_bias(self, output, biases, batch, n, size):
        self._check_size("add_bias output", output, batch * n * size)
        self._check_size("add_bias biases", biases, n)
        self._launch_rows(
            "add_bias",
            batch * n,
            size,
            self._ptr(output),
            self._ptr(biases),
            int(batch * n),
            int(n),
            int(size),
        )

    def scale_bias(self, output, scales, batch, n, size):
        self._check_size("scale_bias output", output, batch * n * size)
        self._check_size("scale_bias scales", scales, n)
        self._launch_rows(
            "scale_bias",
            batch * n,
            size,
            self._ptr(output),
            self._ptr(scales),
            int(batch * n),
            int(n),
            int(size),
        )

    def _channel_reduce(
        self,
        term,
        a,
        b,
        mean,
        batch,
        filters,
        spatial,
        final_op,
        out,
        variance=None,
        scales=None,
        sum_a=None,
        b_suffix="",
    ):
        """out[f] <- final_op(sum over batch and space of term(a, b, mean) for channel f),
        the sum first multiplied by scales[f] when scales is given. sum_a = (final_op,
        out): the same for the sum of a alone, from the same pass over a. b_suffix: b is a
        16-bit x (_x_suffix)."""
        batch, filters, spatial = int(batch), int(filters), int(spatial)
        if filters <= 0:
            return
        self._check_size("channel reduction input", a, batch * filters * spatial)
        if b is not None:
            self._check_size("channel reduction input", b, batch * filters * spatial)
        for arr in (out, variance, scales) + ((sum_a[1],) if sum_a else ()):
            if arr is not None:
                self._check_size("channel reduction per-channel array", arr, filters)
        ptr = lambda arr: 0 if arr is None else self._ptr(arr)  # noqa: E731 (0: null)
        parts, partial, partial_a = self._channel_partials(batch, filters, spatial, sum_a)
        self._launch(
            "channel_sums" + b_suffix,
            (parts, filters),
            (_BLOCK,),
            self._ptr(a),
            ptr(b),
            ptr(mean),
            term,
            batch,
            filters,
            spatial,
            parts,
            partial,
            partial_a,
        )
        self._channel_finalize(
            parts,
            partial,
            partial_a,
            batch * spatial,
            filters,
            (final_op, out),
            sum_a,
            variance,
            scales,
        )

    def _channel_partials(self, batch, filters, spatial, two_sums):
        """(parts, partial, partial_a) for a channel reduction: how many blocks split each
        channel's terms and where they leave their sums (partial_a 0, null, unless
        two_sums)."""
        if filters > _MAX_GRID_Y:
            raise ValueError(f"{filters} channels: at most {_MAX_GRID_Y}")
        parts = reduction_parts(int(filters), int(batch * spatial), self._reduction_capacity())
        return (parts, *self._partial_buffers(filters, parts, two_sums))

    def _partial_buffers(self, filters, parts, two_sums):
        """(partial, partial_a): the scratch doubles a reduction's blocks leave their sums in,
        filters * parts of each (partial_a 0, null, unless two_sums)."""
        plane = 8 * filters * parts
        partial = self._ptr(self._scratch_buffer("channels", 2 * plane))
        return partial, partial + plane if two_sums else 0

    def _reduction_capacity(self):
        """Blocks of _BLOCK threads of every channel reduction resident on the GPU at once:
        the family's tightest kernel (its registers) on each SM, times the SMs."""
        capacity = self.__dict__.get("_channel_reduction_capacity")
        if capacity is None:
            attribute = drv.device_attribute
            device = self._dev.device
            registers = device.get_attribute(attribute.MAX_REGISTERS_PER_MULTIPROCESSOR)
            threads = device.get_attribute(attribute.MAX_THREADS_PER_MULTIPROCESSOR)
            blocks = device.get_attribute(attribute.MAX_BLOCKS_PER_MULTIPROCESSOR)
            warps = _BLOCK // 32
            per_sm = min(threads // _BLOCK, blocks)
            family = {
                name + suffix for name in _CHANNEL_REDUCTIONS for _, suffix in _X_STORAGE.values()
            }
            # By name (channel_moments_rows_* is not of it); each loaded as it is looked up.
            for name in sorted(family):
                if name in self._fn:
                    # registers go to warps in units of 256
                    warp_registers = _ceil_div(self._fn[name].num_regs * 32, 256) * 256
                    per_sm = min(per_sm, registers // warp_registers // warps)
            capacity = self._channel_reduction_capacity = max(1, per_sm) * self.sm_count
        return capacity

    def _channel_finalize(
        self,
        parts,
        partial,
        partial_a,
        count,
        filters,
        final,
        final_a,
        variance=None,
        scales=None,
        sum_outs=(None, None),
        rows=False,
    ):
        """Each channel's partial sums added in a fixed order, then (final_op, out) applied
        (out None: nothing); final_a likewise for partial_a's, unless None. sum_outs: arrays
        that get each channel's plain sum (partial's, partial_a's), unless None. rows: the
        partials are a row kernel's (a block a channel adds them from _WIDE_FINALIZE_PARTS
        on)."""
        ptr = lambda arr: 0 if arr is None else self._ptr(arr)  # noqa: E731 (0: null)
        name, grid = self._finalize_launch("channel_finalize", filters, parts if rows else 0)
        for (op, destination), sums, sum_out in ((final, partial, sum_outs[0]),) + (
            ((final_a, partial_a, sum_outs[1]),) if final_a else ()
        ):
            self._launch(
                name,
                grid,
                (_BLOCK,),
                sums,
                parts,
                filters,
                op,
                count,
                ptr(variance),
                ptr(scales),
                ptr(destination),
                ptr(sum_out),
            )

    @staticmethod
    def _finalize_launch(kernel, filters, row_parts):
        """(kernel name, grid) of a finalize of `filters` channels: `kernel` a thread a
        channel, or its _wide twin a block a channel for a row kernel's row_parts >=
        _WIDE_FINALIZE_PARTS (row_parts 0: not a row kernel's)."""
        if row_parts >= _WIDE_FINALIZE_PARTS:
            return kernel + "_wide", (filters,)
        return kernel, (_ceil_div(filters, _BLOCK),)

    def backward_bias(self, bias_updates, delta, batch, n, size):
        """bias_updates += sum of delta over batch and space."""
        self._channel_reduce(
            _TERM_A, delta, None, None, batch, n, size, _FINAL_ACCUMULATE, bias_updates
        )

    def backward_scale(self, x_norm, delta, batch, n, size, scale_updates):
        self._channel_reduce(
            _TERM_A_TIMES_B, delta, x_norm, None, batch, n, size, _FINAL_ACCUMULATE, scale_updates
        )

    def bias_scale_updates(self, delta, x_norm, batch, n, size, bias_updates, scale_updates):
        """backward_bias (unless bias_updates is None) and backward_scale in one pass."""
        self._channel_reduce(
            _TERM_A_TIMES_B,
            delta,
            x_norm,
            None,
            batch,
            n,
            size,
            _FINAL_ACCUMULATE,
            scale_updates,
            sum_a=None if bias_updates is None else (_FINAL_ACCUMULATE, bias_updates),
        )

    # ---- batch normalisation ------------------------------------------------
    def storage_zeros(self, n, precision):
        """NumpyBackend.storage_zeros: fp16/bf16 as 16 bits a value (float16, or uint16
        holding bf16 bits), else zeros(n)."""
        dtype, _ = _X_STORAGE[precisions.storage(precision)]
        if dtype == np.float32:
            return self.zeros(n)
        a = self._new(n, dtype)
        if a.size:
            drv.memset_d16_async(self._ptr(a), 0, a.size, self.stream)
        return a

    def storage_of(self, a):
        """NumpyBackend.storage_of: fp16 for a float16 array, bf16 for a uint16 one (bf16's
        bits), else fp32."""
        return _STORAGE_OF_DTYPE.get(np.dtype(a.dtype), precisions.DEFAULT)

    def copy_rounded(self, src, dst, precision):
        """NumpyBackend.copy_rounded into storage_zeros(n, precision)'s array: fp16/bf16
        rounded to nearest even (round_copy_*), else a plain copy."""
        stored = precisions.storage(precision)
        if stored == precisions.DEFAULT:
            self.copy(src, dst)
            return
        self._sizes_match("copy_rounded", src, dst)
        self._x_suffix(dst, stored)
        self._launch(
            f"round_copy_{stored.replace('fp', 'f')}",
            self._grid1d(src.size),
            (_BLOCK,),
            self._ptr(src),
            self._ptr(dst),
            int(src.size),
        )

    @staticmethod
    def _x_suffix(x, x_precision):
        """The suffix of the kernels that read x kept at x_precision (TypeError when x's
        dtype is not storage_zeros'; x None: the suffix alone)."""
        dtype, suffix = _X_STORAGE[precisions.storage(x_precision)]
        if x is not None and x.dtype != dtype:
            raise TypeError(
                f"x kept at {x_precision} is a {np.dtype(dtype).name} array, got {x.dtype}"
            )
        return suffix

    def batchnorm_activation_backward(
        self,
        x,
        mean,
        variance,
        scales,
        biases,
        output,
        batch,
        filters,
        spatial,
        eps,
        activation,
        delta,
        bias_updates,
        scale_updates,
        x_precision="fp32",
        delta_sum=None,
        delta_x_norm_sum=None,
    ):
        """NumpyBackend.batchnorm_activation_backward in one pass over x and delta (and the
        output, for gradients from it): batchnorm.cu's batchnorm_activation_sums,
        whose sums are bias_scale_updates' to the bit (and delta_sum's and
        delta_x_norm_sum's, rounded to float, where given). x_precision: how x is kept
        (storage_zeros); a 16-bit x is widened to fp32 as it is read, and goes row by row
        (batchnorm_activation_rows: each row's sums, then the rows' per channel),
        `output` ignored (None allowed): the gradients from the output recompute it from x
        as batchnorm_rebuild_kernel does, its fp32 bits (issue 26)."""
        suffix = self._x_suffix(x, x_precision)
        sums = delta_sums_given(delta_sum, delta_x_norm_sum)
        batch, filters, spatial = int(batch), int(filters), int(spatial)
        if activation in activations.CHANNEL_ACTIVATIONS:
            raise ValueError(f"{activation} mixes channels: normalize_channels_gradient first")
        act = self._activation_id(activation)
        total = batch * filters * spatial
        if suffix:  # a 16-bit x: the output recomputed from it, never read
            output = None
        checked = (
            ("x", x, total),
            ("output", output, total),
            ("delta", delta, total),
            ("mean", mean, filters),
            ("variance", variance, filters),
            ("scales", scales, filters),
            ("biases", biases, filters),
            ("scale_updates", scale_updates, filters),
            ("bias_updates", bias_updates, filters),
            ("delta_sum", delta_sum, filters),
            ("delta_x_norm_sum", delta_x_norm_sum, filters),
        )
        optional = ("bias_updates", "delta_sum", "delta_x_norm_sum") + (
            ("output",) if suffix else ()
        )
        for what, arr, need in checked:
            if arr is not None or what not in optional:
                self._check_size(f"batchnorm_activation_backward {what}", arr, need)
        if filters <= 0 or batch * spatial <= 0:
            return
        two_sums = bias_updates is not None or sums
        args = (
            self._ptr(x),
            0 if output is None else self._ptr(output),
            self._ptr(mean),
            self._ptr(variance),
            self._ptr(scales),
            self._ptr(biases),
            batch,
            filters,
            spatial,
            -1.0 if eps is None else float(eps),
            act,
            int(activation in activations.INPUT_GRADIENT),
        )
        parts, partial, partial_a = self._activation_sums_pass(
            suffix, args, batch, filters, spatial, two_sums, delta
        )
        self._channel_finalize(
            parts,
            partial,
            partial_a,
            batch * spatial,
            filters,
            (_FINAL_ACCUMULATE, scale_updates),
            (_FINAL_ACCUMULATE, bias_updates) if two_sums else None,
            sum_outs=(delta_x_norm_sum, delta_sum),
            rows=bool(suffix),
        )

    def _activation_sums_pass(self, suffix, args, batch, filters, spatial, two_sums, delta):
        """batchnorm_activation_backward's one pass over x and delta (args: the leading
        arguments both of its kernels take): row by row for a 16-bit x (suffix), else
        channel by channel. (parts, partial, partial_a): where the partial sums lie."""
        if suffix:  # a 16-bit x: row by row (plain offsets), each row's pieces a part
            threads, chunk, chunks, parts, grid = self._rows_plan(batch, filters, spatial)
            partial, partial_a = self._partial_buffers(filters, parts, two_sums)
            self._launch(
                "batchnorm_activation_rows" + suffix,
                grid,
                (_BLOCK,),
                *args,
                threads,
                chunk,
                chunks,
                self._ptr(delta),
                partial,
                partial_a,
            )
        else:
            parts, partial, partial_a = self._channel_partials(batch, filters, spatial, two_sums)
            self._launch(
                "batchnorm_activation_sums",
                (parts, filters),
                (_BLOCK,),
                *args,
                parts,
                self._ptr(delta),
                partial,
                partial_a,
            )
        return parts, partial, partial_a

    def mean(self, x, batch, filters, spatial, mean):
        self._channel_reduce(_TERM_A, x, None, None, batch, filters, spatial, _FINAL_MEAN, mean)

    def variance(self, x, mean, batch, filters, spatial, variance):
        self._check_size("variance mean", mean, filters)
        self._channel_reduce(
            _TERM_A_MINUS_MEAN_SQ, x, None, mean, batch, filters, spatial, _FINAL_VARIANCE, variance
        )

    @staticmethod
    def _rows_plan(batch, filters, spatial):
        """(threads a piece, piece length, pieces a row, parts a channel, grid) of a row
        kernel (activation_rows_plan's pieces; 256 / threads pieces a block)."""
        threads, chunk = activation_rows_plan(spatial)
        chunks = _ceil_div(spatial, chunk)
        parts = batch * chunks
        return threads, chunk, chunks, parts, (_ceil_div(filters * parts, _BLOCK // threads),)

    def mean_variance(self, x, batch, filters, spatial, mean, variance, x_precision="fp32"):
        """NumpyBackend.mean_variance in one read of x: channel_moments' double sums of x and
        x^2, then mean_variance_finalize. x_precision: how x is kept (storage_zeros'
        array); a 16-bit x goes row by row (channel_moments_rows: each row's pieces' sums,
        then the channel's added as _channel_finalize adds a row kernel's)."""
        suffix = self._x_suffix(x, x_precision)
        batch, filters, spatial = int(batch), int(filters), int(spatial)
        self._check_size("mean_variance x", x, batch * filters * spatial)
        self._check_size("mean_variance mean", mean, filters)
        self._check_size("mean_variance variance", variance, filters)
        if filters <= 0:
            return
        if suffix:
            threads, chunk, chunks, parts, grid = self._rows_plan(batch, filters, spatial)
            partial, partial_a = self._partial_buffers(filters, parts, True)
            self._launch(
                "channel_moments_rows" + suffix,
                grid,
                (_BLOCK,),
                self._ptr(x),
                batch,
                filters,
                spatial,
                threads,
                chunk,
                chunks,
                partial,
                partial_a,
            )
        else:  # fp32: channel by channel, Darknet's bits
            parts, partial, partial_a = self._channel_partials(batch, filters, spatial, True)
            self._launch(
                "channel_moments",
                (parts, filters),
                (_BLOCK,),
                self._ptr(x),
                batch,
                filters,
                spatial,
                parts,
                partial,
                partial_a,
            )
        name, grid = self._finalize_launch(
            "mean_variance_finalize", filters, parts if suffix else 0
        )
        self._launch(
            name,
            grid,
            (_BLOCK,),
            partial,
            partial_a,
            parts,
            filters,
            batch * spatial,
            self._ptr(mean),
            self._ptr(variance),
        )

    def normalize(self, x, mean, variance, batch, filters, spatial):
        self._check_size("normalize x", x, batch * filters * spatial)
        self._check_size("normalize mean", mean, filters)
        self._check_size("normalize variance", variance, filters)
        self._launch_rows(
            "normalize_kernel",
            batch * filters,
            spatial,
            self._ptr(x),
            self._ptr(mean),
            self._ptr(variance),
            int(batch * filters),
            int(filters),
            int(spatial),
        )

    def normalize_sqrt_eps(self, x, mean, variance, batch, filters, spatial, eps):
        """x = (x - mean) / sqrt(variance + eps) per channel (the AlexeyAB fork's forward)."""
        self._check_size("normalize_sqrt_eps x", x, batch * filters * spatial)
        self._check_size("normalize_sqrt_eps mean", mean, filters)
        self._check_size("normalize_sqrt_eps variance", variance, filters)
        self._launch_rows(
            "normalize_sqrt_eps_kernel",
            batch * filters,
            spatial,
            self._ptr(x),
            self._ptr(mean),
            self._ptr(variance),
            int(batch * filters),
            int(filters),
            int(spatial),
            float(eps),
        )

    def batchnorm_apply(
        self,
        x,
        mean,
        variance,
        scales,
        biases,
        batch,
        filters,
        spatial,
        eps,
        activation,
        x_norm,
        keep=None,
        keep_precision="fp32",
    ):
        """NumpyBackend.batchnorm_apply in one pass (ops/elementwise/activations.cu), keep (unless
        None: storage_zeros(n, keep_precision)'s array) written as x is read. Under a
        keep_precision of fp16/bf16 the normalisation, scale, bias and activation take
        their fast forms (activations.cuh's BatchnormChannel; within ~1e-6 of the exact)."""
        total = batch * filters * spatial
        self._check_size("batchnorm_apply x", x, total)
        for what, arr in (
            ("mean", mean),
            ("variance", variance),
            ("scales", scales),
            ("biases", biases),
        ):
            self._check_size(f"batchnorm_apply {what}", arr, filters)
        for what, arr in (("x_norm", x_norm), ("keep", keep)):
            if arr is not None:
                self._check_size(f"batchnorm_apply {what}", arr, total)
        # keep_precision picks the kernel with or without keep: a layer's forward under
        # fp16/bf16 takes the fast steps whether it keeps x (training) or not (activations.cuh).
        suffix = self._x_suffix(keep, keep_precision)
        ptr = lambda arr: 0 if arr is None else self._ptr(arr)  # noqa: E731 (0: null)
        self._launch_rows(
            "batchnorm_apply_kernel" + suffix,
            batch * filters,
            spatial,
            self._ptr(x),
            self._ptr(mean),
            self._ptr(variance),
            self._ptr(scales),
            self._ptr(biases),
            int(batch * filters),
            int(filters),
            int(spatial),
            -1.0 if eps is None else float(eps),
            self._activation_id(activation),
            ptr(x_norm),
            ptr(keep),
            per_thread=_ROW_ELEMENTS,
        )

    def batchnorm_rebuild(
        self,
        x,
        out,
        mean,
        variance,
        scales,
        biases,
        batch,
        filters,
        spatial,
        eps,
        activation,
        x_precision="fp32",
    ):
        """NumpyBackend.batchnorm_rebuild in one pass (ops/elementwise/activations.cu), x kept at
        x_precision (storage_zeros' array, widened as it is read); out fp32 or x's 16-bit
        storage (the _out twins: the same fp32 value rounded once as it is stored)."""
        out_suffix = (
            ""
            if rebuild_storage(self.storage_of, x_precision, out) == precisions.DEFAULT
            else "_out"
        )
        total = batch * filters * spatial
        for what, arr, need in (
            ("x", x, total),
            ("out", out, total),
            ("mean", mean, filters),
            ("variance", variance, filters),
            ("scales", scales, filters),
            ("biases", biases, filters),
        ):
            self._check_size(f"batchnorm_rebuild {what}", arr, need)
        x_suffix = self._x_suffix(x, x_precision)
        constants = (self._ptr(mean), self._ptr(variance), self._ptr(scales), self._ptr(biases))
        tail = (-1.0 if eps is None else float(eps), self._activation_id(activation))
        if out_suffix and total % 8 == 0 and self._ptr(x) % 16 == 0 and self._ptr(out) % 16 == 0:
            # 16 bits in and out: eight elements a thread, 16-byte accesses (2-byte ones
            # ran at a quarter of the memory's rate)
            self._launch(
                "batchnorm_rebuild_eights" + x_suffix,
                (_ceil_div(total // 8, _BLOCK),),
                (_BLOCK,),
                self._ptr(x),
                self._ptr(out),
                *constants,
                int(total),
                int(filters),
                int(spatial),
                *tail,
            )
            return
        self._launch_rows(
            "batchnorm_rebuild_kernel" + x_suffix + out_suffix,
            batch * filters,
            spatial,
            self._ptr(x),
            self._ptr(out),
            *constants,
            int(batch * filters),
            int(filters),
            int(spatial),
            *tail,
            per_thread=_ROW_ELEMENTS,
        )

    def mean_delta(self, delta, variance, batch, filters, spatial, mean_delta):
        self._check_size("mean_delta variance", variance, filters)
        self._channel_reduce(
            _TERM_A,
            delta,
            None,
            None,
            batch,
            filters,
            spatial,
            _FINAL_MEAN_DELTA,
            mean_delta,
            variance=variance,
        )

    def variance_delta(self, x, delta, mean, variance, batch, filters, spatial, variance_delta):
        self._check_size("variance_delta mean", mean, filters)
        self._check_size("variance_delta variance", variance, filters)
        self._channel_reduce(
            _TERM_A_TIMES_B_MINUS_MEAN,
            delta,
            x,
            mean,
            batch,
            filters,
            spatial,
            _FINAL_VARIANCE_DELTA,
            variance_delta,
            variance=variance,
        )

    def _normalize_delta(
        self,
        x,
        mean,
        variance,
        mean_delta,
        variance_delta,
        scales,
        batch,
        filters,
        spatial,
        delta,
        fork,
        x_suffix="",
    ):
        total = batch * filters * spatial
        for what, arr, need in (
            ("x", x, total),
            ("delta", delta, total),
            ("mean", mean, filters),
            ("variance", variance, filters),
            ("mean_delta", mean_delta, filters),
            ("variance_delta", variance_delta, filters),
        ):
            self._check_size(f"normalize_delta {what}", arr, need)
        if x_suffix and total % 8 == 0 and self._ptr(x) % 16 == 0 and self._ptr(delta) % 16 == 0:
            # a 16-bit x: eight elements a thread, 16-byte accesses (7.1 -> 3.7 ms a
            # yolov4 fp16 pass)
            self._launch(
                "normalize_delta_eights" + x_suffix,
                (_ceil_div(total // 8, _BLOCK),),
                (_BLOCK,),
                self._ptr(x),
                self._ptr(mean),
                self._ptr(variance),
                self._ptr(mean_delta),
                self._ptr(variance_delta),
                int(total),
                int(filters),
                int(spatial),
                float(batch * spatial),
                0 if scales is None else self._ptr(scales),
                self._ptr(delta),
                int(bool(fork)),
            )
            return
        self._launch_rows(
            "normalize_delta_kernel" + x_suffix,
            batch * filters,
            spatial,
            self._ptr(x),
            self._ptr(mean),
            self._ptr(variance),
            self._ptr(mean_delta),
            self._ptr(variance_delta),
            int(batch * filters),
            int(filters),
            int(spatial),
            float(batch * spatial),
            0 if scales is None else self._ptr(scales),
            self._ptr(delta),
            int(bool(fork)),
            per_thread=_ROW_ELEMENTS,
        )

    def normalize_delta(
        self,
        x,
        mean,
        variance,
        mean_delta,
        variance_delta,
        batch,
        filters,
        spatial,
        delta,
        fork=False,
    ):
        self._normalize_delta(
            x,
            mean,
            variance,
            mean_delta,
            variance_delta,
            None,
            batch,
            filters,
            spatial,
            delta,
            fork,
        )

    def batchnorm_delta(
        self,
        x,
        mean,
        variance,
        scales,
        batch,
        filters,
        spatial,
        mean_delta,
        variance_delta,
        delta,
        fork=False,
        x_precision="fp32",
    ):
        """NumpyBackend.batchnorm_delta in two passes over delta instead of five: one
        reduction gives both sums of the unscaled delta (each then times the channel's
        scale), and normalize_delta scales delta as it reads it. x_precision: as
        batchnorm_activation_backward's."""
        suffix = self._x_suffix(x, x_precision)
        self._check_size("batchnorm_delta mean", mean, filters)
        self._channel_reduce(
            _TERM_A_TIMES_B_MINUS_MEAN,
            delta,
            x,
            mean,
            batch,
            filters,
            spatial,
            _FINAL_VARIANCE_DELTA,
            variance_delta,
            variance=variance,
            scales=scales,
            sum_a=(_FINAL_MEAN_DELTA, mean_delta),
            b_suffix=suffix,
        )
        self._normalize_delta(
            x,
            mean,
            variance,
            mean_delta,
            variance_delta,
            scales,
            batch,
            filters,
            spatial,
            delta,
            fork,
            suffix,
        )

    def batchnorm_delta_from_sums(
        self,
        x,
        mean,
        variance,
        scales,
        batch,
        filters,
        spatial,
        eps,
        delta_sum,
        delta_x_norm_sum,
        mean_delta,
        variance_delta,
        delta,
        fork=False,
        x_precision="fp32",
    ):
        """NumpyBackend.batchnorm_delta_from_sums: batchnorm_delta_factors (a thread a
        channel), then normalize_delta scaling delta as it reads it; no pass over delta
        for the sums."""
        suffix = self._x_suffix(x, x_precision)
        for what, arr in (
            ("variance", variance),
            ("scales", scales),
            ("delta_sum", delta_sum),
            ("delta_x_norm_sum", delta_x_norm_sum),
            ("mean_delta", mean_delta),
            ("variance_delta", variance_delta),
        ):
            self._check_size(f"batchnorm_delta_from_sums {what}", arr, filters)
        if filters <= 0:
            return
        self._launch(
            "batchnorm_delta_factors",
            (_ceil_div(filters, _BLOCK),),
            (_BLOCK,),
            self._ptr(delta_sum),
            self._ptr(delta_x_norm_sum),
            self._ptr(variance),
            self._ptr(scales),
            int(filters),
            -1.0 if eps is None else float(eps),
            self._ptr(mean_delta),
            self._ptr(variance_delta),
        )
        self._normalize_delta(
            x,
            mean,
            variance,
            mean_delta,
            variance_delta,
            scales,
            batch,
            filters,
            spatial,
            delta,
            fork,
            suffix,
        )

    # ---- normalisations across channels ([l2norm], [lrn]) ----------------------------
    def l2normalize(self, x, batch, filters, spatial):
        self._check_size("l2normalize x", x, batch * filters * spatial)
        self._launch(
            "l2normalize_kernel",
            self._grid1d(batch * spatial),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(filters),
            int(spatial),
        )

    def lrn_forward(self, x, batch, c, spatial, size, alpha, beta, kappa, norms, out):
        n = batch * c * spatial
        for what, arr in (("x", x), ("norms", norms), ("out", out)):
            self._check_size(f"lrn_forward {what}", arr, n)
        self._launch(
            "lrn_forward_kernel",
            self._grid1d(batch * spatial),
            (_BLOCK,),
            self._ptr(x),
            int(batch),
            int(c),
            int(spatial),
            int(size),
            float(alpha),
            float(beta),
            float(kappa),
            self._ptr(norms),
            self._ptr(out),
        )

    def lrn_backward(self, norms, delta, beta, delta_in):
        n = norms.size
        for what, arr in (("delta", delta), ("delta_in", delta_in)):
            self._check_size(f"lrn_backward {what}", arr, n)
        self._launch(
            "lrn_backward_kernel",
            self._grid1d(n),
            (_BLOCK,),
            n,
            self._ptr(norms),
            self._ptr(delta),
            float(beta),
            self._ptr(delta_in),
        )
