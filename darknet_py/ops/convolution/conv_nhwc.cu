// Channels-last (NHWC) 16-bit convolution forward on Hopper: an implicit GEMM on wgmma, its
// A operand (the unfolded images) copied by TMA in im2col mode, so no unfold buffer exists.
// Built for sm_90a only, like gemm_wgmma.cu, whose pipeline this reuses as it is (the
// producer warpgroup, the ring of 128-byte-swizzled stages, the two consumer warpgroups'
// m64n256k16 wgmmas, clusters of WG_CLUSTER blocks sharing B by multicast); on any other
// target the kernels compile to an empty body and are never launched (ops/convolution/
// nhwc.py loads this file's sm_90a build).
//
// The product: C (M x N) = A (M x K) @ B (N x K)^T with
//   M = batch * out_h * out_w output pixels (row m: image m / positions, pixel m % positions),
//   N = cout output channels,
//   K = ksize * ksize taps x cx channels, in that order (tap-major: weights [cout][ky][kx][cx]).
// K goes in 64-wide slices, each one tap and one run of 64 channels (c_slices runs a tap, the
// last one zero-filled by TMA past cx). A slice of A is one im2col copy: 128 output pixels
// x 64 channels, the pixels walked by TMA over the images (elementStrides = the convolution
// stride), each read at its window's corner plus the tap's (kx, ky) offsets; pixels of the
// padding and past the last image come back as zeros. A 1x1 stride-1 unpadded convolution
// is a plain GEMM over the NHWC pixels: the same body with a tiled 2-D copy of A.
// B's slice is a tiled copy of a 3-D map over the packed weights (cx, taps, cout): box 64 x
// 1 x rows, so channels past cx come back as zeros rather than the next tap's weights.
//
// Epilogue, per consumer's 64 x 256 part: v = act(acc + bias[col]) rounded to the operands'
// 16 bits, stored at out[pixel * out_pitch + out_offset + col] (a slice of a wider NHWC
// buffer: a route's concatenation); with statistics, each output channel's sum and sum of
// squares of the stored (rounded) values, over the tile's pixels inside M, reduced over the
// warp by shuffles and over the warpgroup's 4 warps in shared memory, then added into the
// fp32 arrays sums[cout] and squares[cout] by one atomic per column and consumer.

#include "gemm_wgmma.cu"

// A 16-bit value of the operand type widened to fp32, exactly.
__device__ __forceinline__ float widened(F16Op, unsigned short h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;\n" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float widened(BF16Op, unsigned short h) { return __uint_as_float((unsigned)h << 16); }

// The convolution's scalars, gathered once from the kernel's parameters.
struct NhwcConv {
    int im2col;        // 1: A by im2col copies; 0: a plain GEMM, A tiled (1x1, stride 1, no padding)
    int m, n;          // output pixels, output channels
    int c_slices;      // 64-wide channel runs a tap (ceil(cx / 64))
    int ksize, out_h, out_w, stride, pad;
    unsigned short* out;
    long long out_pitch;
    int out_offset;
    const float* bias;   // [n] or null
    int act;             // activations.cuh id
    float* sums;         // [n] or null: no statistics
    float* squares;      // [n] (with sums)
};

#ifdef DARKNET_WGMMA
// Per consumer: each warp's column sums and sums of squares (float2 per column).
constexpr int NC_STATS_BYTES = 4 * WG_BN * 8;

// A box of the 4-D NHWC image map in im2col mode: 128 pixels from the one whose window's
// corner is (w, h) of image `image`, each read at (w + off_w, h + off_h), channels from c.
__device__ __forceinline__ void tma_load_im2col(unsigned dst, const TensorMap* map, unsigned bar, int c, int w, int h,
                                                int image, unsigned short off_w, unsigned short off_h)
{
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6}], [%2], {%7, %8};\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c), "r"(w), "r"(h), "r"(image), "h"(off_w), "h"(off_h)
        : "memory");
}

// A box of the 3-D weight map (channel c, tap, row) into this block (cluster of one) or
// into the same offset of every block of the cluster.
__device__ __forceinline__ void tma_load_weights(unsigned dst, const TensorMap* map, unsigned bar, int c, int tap,
                                                 int row)
{
#if WG_CLUSTER == 1
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n" ::"r"(
            dst),
        "l"(map), "r"(bar), "r"(c), "r"(tap), "r"(row)
        : "memory");
#else
    const unsigned short mask = (1u << WG_CLUSTER) - 1u;
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4, %5}], [%2], %6;\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(c), "r"(tap), "r"(row), "h"(mask)
        : "memory");
#endif
}

// One consumer's 64 x 256 part of the tile out to the NHWC buffer (see the file's head);
// `stats` is this consumer's NC_STATS_BYTES of shared memory.
template <class Op>
__device__ __forceinline__ void store_tile_nhwc(const float (&d)[128], int row0, int col0, const NhwcConv& p,
                                                int consumer, float2* stats)
{
    const Fragment f(row0, col0);
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x >> 5) & 3;
    const bool with_stats = p.sums != nullptr;
    // Two channels a 4-byte store where both the pitch and the offset keep pairs aligned.
    const bool pairs = ((p.out_pitch | (long long)p.out_offset) & 1) == 0;
    const bool inside[2] = {f.r_base < p.m, f.r_base + 8 < p.m};
#pragma unroll
    for (int j = 0; j < 32; ++j) {
        const int col = f.c_base + j * 8;   // this thread's columns col and col + 1
        float bias[2];
#pragma unroll
        for (int e = 0; e < 2; ++e) bias[e] = (p.bias && col + e < p.n) ? p.bias[col + e] : 0.0f;
        float sum[2] = {0.0f, 0.0f}, square[2] = {0.0f, 0.0f};
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            unsigned short h[2];
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const float v = d[j * 4 + half * 2 + e] + bias[e];
                h[e] = rounded_to(Op{}, p.act == LINEAR ? v : epilogue_activate(v, p.act));
                if (with_stats && inside[half]) {
                    const float kept = widened(Op{}, h[e]);
                    sum[e] += kept;
                    square[e] += kept * kept;
                }
            }
            if (!inside[half]) continue;
            unsigned short* const at = p.out + (long long)(f.r_base + half * 8) * p.out_pitch + p.out_offset + col;
            if (pairs && col + 1 < p.n) {
                *reinterpret_cast<unsigned*>(at) = (unsigned)h[0] | ((unsigned)h[1] << 16);
            } else {
                if (col < p.n) at[0] = h[0];
                if (col + 1 < p.n) at[1] = h[1];
            }
        }
        if (with_stats) {
            // The 8 lanes holding these columns (lane >> 2 = 0..7) add up; lanes 0-3 keep the sums.
#pragma unroll
            for (int e = 0; e < 2; ++e) {
#pragma unroll
                for (int delta = 4; delta < 32; delta <<= 1) {
                    sum[e] += __shfl_xor_sync(0xffffffffu, sum[e], delta);
                    square[e] += __shfl_xor_sync(0xffffffffu, square[e], delta);
                }
                if (lane < 4) stats[warp * WG_BN + (col - col0) + e] = make_float2(sum[e], square[e]);
            }
        }
    }
    if (with_stats) {
        consumer_sync(consumer);   // every warp's sums are in shared memory
        const int t = threadIdx.x & 127;
#pragma unroll
        for (int k = 0; k < 2; ++k) {
            const int c = t + k * 128;
            if (col0 + c >= p.n) continue;
            float s = 0.0f, q = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float2 part = stats[w * WG_BN + c];
                s += part.x;
                q += part.y;
            }
            atomicAdd(p.sums + col0 + c, s);
            atomicAdd(p.squares + col0 + c, q);
        }
        consumer_sync(consumer);   // read before the next tile's epilogue overwrites them
    }
}

template <class Op>
__device__ __forceinline__ void conv_nhwc_body(const TensorMap* a_map, const TensorMap* b_map, const NhwcConv& p)
{
    extern __shared__ unsigned char wg_dynamic[];
    // Stage buffers 1024-byte aligned (the launcher asks for 1 KB of slack).
    const unsigned raw = wg_smem(wg_dynamic);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned a_tiles = base;
    const unsigned b_tiles = base + WG_STAGES * WG_A_BYTES;
    const unsigned full_bar = b_tiles + WG_STAGES * WG_B_BYTES;
    const unsigned empty_bar = full_bar + WG_STAGES * 8;
    const unsigned stats_area = full_bar + 1024;   // after the barriers, NC_STATS_BYTES a consumer

    const int pair_rows = (p.m + WG_BM * WG_CLUSTER - 1) / (WG_BM * WG_CLUSTER);
    const int tiles_n = (p.n + WG_BN - 1) / WG_BN;
    const int pairs = pair_rows * tiles_n;
    const unsigned rank = cluster_rank();
    const int cluster = blockIdx.x / WG_CLUSTER, clusters = gridDim.x / WG_CLUSTER;
    const int taps = p.ksize * p.ksize;
    const int k_blocks = taps * p.c_slices;
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < WG_STAGES; ++s) {
            mbar_init(full_bar + 8 * s, 1);
            mbar_init(empty_bar + 8 * s, WG_EMPTY_ARRIVALS);
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    cluster_sync();   // both blocks' barriers exist before either copies or arrives

    if (warpgroup == 0) {
        // Producer: few registers; one thread issues every copy.
        asm volatile("setmaxnreg.dec.sync.aligned.u32 40;\n" ::: "memory");
        if (threadIdx.x == 0) {
            const int positions = p.out_h * p.out_w;
            int stage = 0;
            unsigned phase = 0;
            for (int t = cluster; t < pairs; t += clusters) {
                int m0, n0;
                tile_origin(t, pair_rows, tiles_n, rank, m0, n0);
                // The tile's first pixel, where TMA's walk over the output pixels starts: its
                // window's top-left corner in the image (a row past M: an image past the last,
                // all zeros).
                const int image = m0 / positions;
                const int in_image = m0 - image * positions;
                const int oy = in_image / p.out_w, ox = in_image - oy * p.out_w;
                const int w0 = ox * p.stride - p.pad, h0 = oy * p.stride - p.pad;
                int tap = 0, slice = 0;
                for (int kb = 0; kb < k_blocks; ++kb) {
                    mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
                    const unsigned full = full_bar + 8 * stage;
                    mbar_expect_tx(full, WG_STAGE_BYTES);   // A + every block's part of B
                    const unsigned a_dst = a_tiles + stage * WG_A_BYTES;
                    if (p.im2col) {
                        const int ky = tap / p.ksize;
                        tma_load_im2col(a_dst, a_map, full, slice * WG_BK, w0, h0, image,
                                        (unsigned short)(tap - ky * p.ksize), (unsigned short)ky);
                    } else {
                        tma_load(a_dst, a_map, full, slice * WG_BK, m0);
                    }
                    tma_load_weights(b_tiles + stage * WG_B_BYTES + rank * (WG_B_BYTES / WG_CLUSTER), b_map, full,
                                     slice * WG_BK, tap, n0 + (int)rank * (WG_BN / WG_CLUSTER));
                    if (++slice == p.c_slices) {
                        slice = 0;
                        ++tap;
                    }
                    if (++stage == WG_STAGES) {
                        stage = 0;
                        phase ^= 1u;
                    }
                }
            }
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 232;\n" ::: "memory");
        const int consumer = warpgroup - 1;
        const bool releaser = (threadIdx.x & 31) == 0;   // one arrival per warp and block
        float2* const stats =
            reinterpret_cast<float2*>(wg_dynamic + (stats_area - raw) + consumer * NC_STATS_BYTES);
        float d[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) d[i] = 0.0f;
        int stage = 0;
        unsigned phase = 0;
        for (int t = cluster; t < pairs; t += clusters) {
            int m0, n0;
            tile_origin(t, pair_rows, tiles_n, rank, m0, n0);
            int previous = -1;
            pin_accumulators(d);
            for (int kb = 0; kb < k_blocks; ++kb) {
                mbar_wait(full_bar + 8 * stage, phase);
                const unsigned a = a_tiles + stage * WG_A_BYTES + consumer * (WG_A_BYTES / 2);
                const unsigned b = b_tiles + stage * WG_B_BYTES;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; ++kk)   // 16 halves = 32 bytes along K
                    wgmma_64x256(Op{}, d, smem_desc(a + kk * 32), smem_desc(b + kk * 32), kb > 0 || kk > 0);
                wgmma_commit();
                wgmma_wait<1>();   // the previous slice's MMAs are done: its stage is free
                if (previous >= 0 && releaser) release_stage(empty_bar + 8 * previous);
                previous = stage;
                if (++stage == WG_STAGES) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
            wgmma_wait<0>();
            pin_accumulators(d);
            if (previous >= 0 && releaser) release_stage(empty_bar + 8 * previous);
            store_tile_nhwc<Op>(d, m0 + consumer * 64, n0, p, consumer, stats);
        }
    }
    cluster_sync();   // no block leaves while its partner may still arrive on its barriers
}
#endif   // DARKNET_WGMMA

#ifdef DARKNET_WGMMA
#define CONV_NHWC_BODY(OP) conv_nhwc_body<OP>(&a_map, &b_map, p);
#else
#define CONV_NHWC_BODY(OP)
#endif

#define CONV_NHWC_KERNEL(NAME, OP)                                                                                 \
    extern "C" __global__ void __cluster_dims__(WG_CLUSTER, 1, 1) __launch_bounds__(WG_THREADS, 1)               \
        NAME(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map, int im2col, int m, \
             int n, int c_slices, int ksize, int out_h, int out_w, int stride, int pad, unsigned short* out,      \
             long long out_pitch, int out_offset, const float* bias, int act, float* sums, float* squares)        \
    {                                                                                                             \
        const NhwcConv p{im2col, m,   n,    c_slices,   ksize, out_h, out_w, stride,                             \
                         pad,    out, out_pitch, out_offset, bias, act,  sums,  squares};                          \
        (void)p;                                                                                                  \
        CONV_NHWC_BODY(OP)                                                                                        \
    }

CONV_NHWC_KERNEL(conv_nhwc_f16, F16Op)
CONV_NHWC_KERNEL(conv_nhwc_bf16, BF16Op)

// ---- Darknet's fp32 weights [cout][c][k][k] into the packed [cout][k][k][cx] -----------
// dst[(o * taps + tap) * cx + ch] = 16-bit weights[(o * c + ch) * taps + tap] for ch < c, 0
// for the padded channels c <= ch < cx. One thread an element of dst, grid-stride.
template <class Op>
__device__ __forceinline__ void pack_nhwc_weights_body(const float* __restrict__ weights, int cout, int c,
                                                       int taps, int cx, unsigned short* __restrict__ dst)
{
    const long long total = (long long)cout * taps * cx;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int ch = (int)(i % cx);
        const long long row = i / cx;   // o * taps + tap
        const int tap = (int)(row % taps);
        const long long o = row / taps;
        dst[i] = ch < c ? rounded_to(Op{}, weights[(o * c + ch) * taps + tap]) : (unsigned short)0;
    }
}

extern "C" __global__ void __launch_bounds__(256)
    pack_nhwc_weights_f16(const float* weights, int cout, int c, int taps, int cx, unsigned short* dst)
{
    pack_nhwc_weights_body<F16Op>(weights, cout, c, taps, cx, dst);
}

extern "C" __global__ void __launch_bounds__(256)
    pack_nhwc_weights_bf16(const float* weights, int cout, int c, int taps, int cx, unsigned short* dst)
{
    pack_nhwc_weights_body<BF16Op>(weights, cout, c, taps, cx, dst);
}
