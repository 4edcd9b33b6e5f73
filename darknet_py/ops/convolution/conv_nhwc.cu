// Channels-last (NHWC) 16-bit convolution forward on Hopper: an implicit GEMM on wgmma, its
// A operand (the unfolded images) copied by TMA in im2col mode, so no unfold buffer exists.
// Built for sm_90a only, like gemm_wgmma.cu, whose pipeline this reuses (the producer
// warpgroup, the ring of 128-byte-swizzled stages, the two consumer warpgroups' wgmmas,
// clusters of WG_CLUSTER blocks sharing B by multicast); on any other target the kernels
// compile to an empty body and are never launched (ops/convolution/nhwc.py loads this
// file's sm_90a build). Tiles are 128 pixels x BN channels, BN 256, 128 or 64 (one kernel
// each: a layer of 64 filters would leave three quarters of a 256-wide tile empty); the
// narrower tiles' smaller stages let the ring run deeper (NcTile).
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
// Narrow pixels (cx < 64: a first layer's 3 channels in a pitch of 8) would leave most of a
// 64-channel slice zeros. There (mode NC_NARROW) K goes in chunks of 8 channels instead, a
// stage 8 chunks in (tap, channel) order, crossing taps: 8 im2col copies of 128 pixels x 8
// channels (16 bytes a pixel, no swizzle), each its own 2 KB block, which is the wgmma's
// no-swizzle K-major layout (core matrices of 8 rows x 16 bytes: 128 bytes between 8-row
// groups, 2 KB between K chunks). B is then the packed weights as a plain [cout][taps * cx]
// matrix (a 2-D map, 64 columns a stage, zeros past the last tap); copies of chunks past
// the last repeat the last one, finite values that B's zeros cancel.
//
// Epilogue, per consumer's 64 x BN part: v = act(acc + bias[col]) rounded to the operands'
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

// How A is copied (nhwc.py's _PLAIN, _IM2COL, _NARROW).
enum NhwcMode { NC_PLAIN = 0, NC_IM2COL = 1, NC_NARROW = 2 };

// The convolution's scalars, gathered once from the kernel's parameters.
struct NhwcConv {
    int mode;          // NhwcMode: A tiled (a 1x1 stride-1 unpadded plain GEMM), im2col by 64-channel
                       // slices, or im2col by 8-channel chunks (cx < 64)
    int m, n;          // output pixels, output channels
    int c_slices;      // 64-wide channel runs a tap (ceil(cx / 64)); NC_NARROW: 8-channel chunks a tap
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
// The shape of a BN-wide tile's pipeline: its B stage, the ring's depth (the ring within
// ~192 KB), and per consumer each warp's column sums and squares (a float2 a column).
template <int BN> struct NcTile {
    static constexpr int B_BYTES = BN * WG_BK * 2;
    static constexpr int STAGE_BYTES = WG_A_BYTES + B_BYTES;
    static constexpr int STAGES = BN == 256 ? 4 : BN == 128 ? 6 : 8;
    static constexpr int STATS_BYTES = 4 * BN * 8;
};

// d (+)= A (64 x 16) @ B (N x 16)^T for N = 128 and 64, as gemm_wgmma.cu's wgmma_64x256.
#define NC_ACCUMULATORS_64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])

#define NC_ACCUMULATORS_32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])

#define NC_WGMMA_64X128(TYPE)                                                                               \
    asm volatile("{\n"                                                                                      \
                 ".reg .pred acc;\n"                                                                         \
                 "setp.ne.b32 acc, %66, 0;\n"                                                                \
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32." TYPE "." TYPE " "                            \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, "  \
                 "%38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, "  \
                 "%56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, acc, 1, 1, 0, 0;\n"                       \
                 "}\n"                                                                                       \
                 : NC_ACCUMULATORS_64                                                                        \
                 : "l"(a), "l"(b), "r"(accumulate))

#define NC_WGMMA_64X64(TYPE)                                                                                \
    asm volatile("{\n"                                                                                      \
                 ".reg .pred acc;\n"                                                                         \
                 "setp.ne.b32 acc, %34, 0;\n"                                                                \
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32." TYPE "." TYPE " "                             \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, " \
                 "%20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, acc, 1, 1, 0, 0;\n"   \
                 "}\n"                                                                                       \
                 : NC_ACCUMULATORS_32                                                                        \
                 : "l"(a), "l"(b), "r"(accumulate))

__device__ __forceinline__ void nc_wgmma(F16Op, float (&d)[128], unsigned long long a, unsigned long long b,
                                         int accumulate)
{
    wgmma_64x256(F16Op{}, d, a, b, accumulate);
}
__device__ __forceinline__ void nc_wgmma(BF16Op, float (&d)[128], unsigned long long a, unsigned long long b,
                                         int accumulate)
{
    wgmma_64x256(BF16Op{}, d, a, b, accumulate);
}
__device__ __forceinline__ void nc_wgmma(F16Op, float (&d)[64], unsigned long long a, unsigned long long b,
                                         int accumulate)
{
    NC_WGMMA_64X128("f16");
}
__device__ __forceinline__ void nc_wgmma(BF16Op, float (&d)[64], unsigned long long a, unsigned long long b,
                                         int accumulate)
{
    NC_WGMMA_64X128("bf16");
}
__device__ __forceinline__ void nc_wgmma(F16Op, float (&d)[32], unsigned long long a, unsigned long long b,
                                         int accumulate)
{
    NC_WGMMA_64X64("f16");
}
__device__ __forceinline__ void nc_wgmma(BF16Op, float (&d)[32], unsigned long long a, unsigned long long b,
                                         int accumulate)
{
    NC_WGMMA_64X64("bf16");
}

template <int R>
__device__ __forceinline__ void nc_pin(float (&d)[R])
{
#pragma unroll
    for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// gemm_wgmma.cu's tile_origin for BN-wide tiles.
template <int BN>
__device__ __forceinline__ void nc_tile_origin(int t, int pair_rows, int tiles_n, unsigned rank, int& m0, int& n0)
{
    const int group = t / (WG_GROUP_M * tiles_n);
    const int first = group * WG_GROUP_M;
    const int rows = min(pair_rows - first, WG_GROUP_M);
    const int in_group = t - group * WG_GROUP_M * tiles_n;
    m0 = ((first + in_group % rows) * WG_CLUSTER + (int)rank) * WG_BM;
    n0 = (in_group / rows) * BN;
}

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

// Shared-memory matrix descriptor of NC_NARROW's A: K-major, no swizzle, K's 8-element chunks
// 2048 bytes apart (leading byte offset), 8-row groups 128 bytes apart (stride byte offset).
constexpr unsigned NC_CHUNK_BYTES = WG_BM * 16;   // one 8-channel im2col copy: 128 pixels
__device__ __forceinline__ unsigned long long narrow_desc(unsigned address)
{
    return (unsigned long long)((address & 0x3FFFF) >> 4) | ((unsigned long long)(NC_CHUNK_BYTES >> 4) << 16) |
           ((128ull >> 4) << 32);
}

// One consumer's 64 x BN part of the tile out to the NHWC buffer (see the file's head);
// `stats` is this consumer's NcTile<BN>::STATS_BYTES of shared memory.
template <class Op, int BN>
__device__ __forceinline__ void store_tile_nhwc(const float (&d)[BN / 2], int row0, int col0, const NhwcConv& p,
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
    for (int j = 0; j < BN / 8; ++j) {
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
                if (lane < 4) stats[warp * BN + (col - col0) + e] = make_float2(sum[e], square[e]);
            }
        }
    }
    if (with_stats) {
        consumer_sync(consumer);   // every warp's sums are in shared memory
#pragma unroll
        for (int c = threadIdx.x & 127; c < BN; c += 128) {
            if (col0 + c >= p.n) continue;
            float s = 0.0f, q = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const float2 part = stats[w * BN + c];
                s += part.x;
                q += part.y;
            }
            atomicAdd(p.sums + col0 + c, s);
            atomicAdd(p.squares + col0 + c, q);
        }
        consumer_sync(consumer);   // read before the next tile's epilogue overwrites them
    }
}

template <class Op, int BN>
__device__ __forceinline__ void conv_nhwc_body(const TensorMap* a_map, const TensorMap* b_map, const NhwcConv& p)
{
    using Tile = NcTile<BN>;
    extern __shared__ unsigned char wg_dynamic[];
    // Stage buffers 1024-byte aligned (the launcher asks for 1 KB of slack).
    const unsigned raw = wg_smem(wg_dynamic);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned a_tiles = base;
    const unsigned b_tiles = base + Tile::STAGES * WG_A_BYTES;
    const unsigned full_bar = b_tiles + Tile::STAGES * Tile::B_BYTES;
    const unsigned empty_bar = full_bar + Tile::STAGES * 8;
    const unsigned stats_area = full_bar + 1024;   // after the barriers, Tile::STATS_BYTES a consumer

    const int pair_rows = (p.m + WG_BM * WG_CLUSTER - 1) / (WG_BM * WG_CLUSTER);
    const int tiles_n = (p.n + BN - 1) / BN;
    const int pairs = pair_rows * tiles_n;
    const unsigned rank = cluster_rank();
    const int cluster = blockIdx.x / WG_CLUSTER, clusters = gridDim.x / WG_CLUSTER;
    const int taps = p.ksize * p.ksize;
    const bool narrow = p.mode == NC_NARROW;
    const int chunks = taps * p.c_slices;   // NC_NARROW's 8-channel chunks
    const int k_blocks = narrow ? (chunks + 7) / 8 : taps * p.c_slices;
    const int warpgroup = threadIdx.x / 128;

    if (threadIdx.x == 0) {
        for (int s = 0; s < Tile::STAGES; ++s) {
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
                nc_tile_origin<BN>(t, pair_rows, tiles_n, rank, m0, n0);
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
                    mbar_expect_tx(full, Tile::STAGE_BYTES);   // A + every block's part of B
                    const unsigned a_dst = a_tiles + stage * WG_A_BYTES;
                    const unsigned b_dst = b_tiles + stage * Tile::B_BYTES + rank * (Tile::B_BYTES / WG_CLUSTER);
                    const int b_row = n0 + (int)rank * (BN / WG_CLUSTER);
                    if (narrow) {
                        for (int i = 0; i < 8; ++i) {
                            const int q = min(kb * 8 + i, chunks - 1);
                            const int chunk_tap = q / p.c_slices;
                            const int ky = chunk_tap / p.ksize;
                            tma_load_im2col(a_dst + i * NC_CHUNK_BYTES, a_map, full, (q - chunk_tap * p.c_slices) * 8,
                                            w0, h0, image, (unsigned short)(chunk_tap - ky * p.ksize),
                                            (unsigned short)ky);
                        }
#if WG_CLUSTER == 1
                        tma_load(b_dst, b_map, full, kb * WG_BK, b_row);
#else
                        tma_load_multicast(b_dst, b_map, full, kb * WG_BK, b_row, (1u << WG_CLUSTER) - 1u);
#endif
                    } else {
                        if (p.mode == NC_IM2COL) {
                            const int ky = tap / p.ksize;
                            tma_load_im2col(a_dst, a_map, full, slice * WG_BK, w0, h0, image,
                                            (unsigned short)(tap - ky * p.ksize), (unsigned short)ky);
                        } else {
                            tma_load(a_dst, a_map, full, slice * WG_BK, m0);
                        }
                        tma_load_weights(b_dst, b_map, full, slice * WG_BK, tap, b_row);
                    }
                    if (++slice == p.c_slices) {
                        slice = 0;
                        ++tap;
                    }
                    if (++stage == Tile::STAGES) {
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
            reinterpret_cast<float2*>(wg_dynamic + (stats_area - raw) + consumer * Tile::STATS_BYTES);
        float d[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) d[i] = 0.0f;
        int stage = 0;
        unsigned phase = 0;
        for (int t = cluster; t < pairs; t += clusters) {
            int m0, n0;
            nc_tile_origin<BN>(t, pair_rows, tiles_n, rank, m0, n0);
            int previous = -1;
            nc_pin(d);
            for (int kb = 0; kb < k_blocks; ++kb) {
                mbar_wait(full_bar + 8 * stage, phase);
                const unsigned a_stage = a_tiles + stage * WG_A_BYTES;
                const unsigned b = b_tiles + stage * Tile::B_BYTES;
                wgmma_fence();
                // K by 16: 32 bytes along a swizzled row, or two 8-channel chunks (NC_NARROW, whose
                // consumer's 64 rows start 1 KB into each chunk)
                if (narrow) {
#pragma unroll
                    for (int kk = 0; kk < WG_BK / 16; ++kk)
                        nc_wgmma(Op{}, d, narrow_desc(a_stage + consumer * 1024 + kk * 2 * NC_CHUNK_BYTES),
                                 smem_desc(b + kk * 32), kb > 0 || kk > 0);
                } else {
                    const unsigned a = a_stage + consumer * (WG_A_BYTES / 2);
#pragma unroll
                    for (int kk = 0; kk < WG_BK / 16; ++kk)
                        nc_wgmma(Op{}, d, smem_desc(a + kk * 32), smem_desc(b + kk * 32), kb > 0 || kk > 0);
                }
                wgmma_commit();
                wgmma_wait<1>();   // the previous slice's MMAs are done: its stage is free
                if (previous >= 0 && releaser) release_stage(empty_bar + 8 * previous);
                previous = stage;
                if (++stage == Tile::STAGES) {
                    stage = 0;
                    phase ^= 1u;
                }
            }
            wgmma_wait<0>();
            nc_pin(d);
            if (previous >= 0 && releaser) release_stage(empty_bar + 8 * previous);
            store_tile_nhwc<Op, BN>(d, m0 + consumer * 64, n0, p, consumer, stats);
        }
    }
    cluster_sync();   // no block leaves while its partner may still arrive on its barriers
}
#endif   // DARKNET_WGMMA

#ifdef DARKNET_WGMMA
#define CONV_NHWC_BODY(OP, BN) conv_nhwc_body<OP, BN>(&a_map, &b_map, p);
#else
#define CONV_NHWC_BODY(OP, BN)
#endif

#define CONV_NHWC_KERNEL(NAME, OP, BN)                                                                                 \
    extern "C" __global__ void __cluster_dims__(WG_CLUSTER, 1, 1) __launch_bounds__(WG_THREADS, 1)               \
        NAME(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map, int mode, int m,   \
             int n, int c_slices, int ksize, int out_h, int out_w, int stride, int pad, unsigned short* out,      \
             long long out_pitch, int out_offset, const float* bias, int act, float* sums, float* squares)        \
    {                                                                                                             \
        const NhwcConv p{mode, m,   n,    c_slices,   ksize, out_h, out_w, stride,                               \
                         pad,    out, out_pitch, out_offset, bias, act,  sums,  squares};                          \
        (void)p;                                                                                                  \
        CONV_NHWC_BODY(OP, BN)                                                                                    \
    }

CONV_NHWC_KERNEL(conv_nhwc_f16_n256, F16Op, 256)
CONV_NHWC_KERNEL(conv_nhwc_bf16_n256, BF16Op, 256)
CONV_NHWC_KERNEL(conv_nhwc_f16_n128, F16Op, 128)
CONV_NHWC_KERNEL(conv_nhwc_bf16_n128, BF16Op, 128)
CONV_NHWC_KERNEL(conv_nhwc_f16_n64, F16Op, 64)
CONV_NHWC_KERNEL(conv_nhwc_bf16_n64, BF16Op, 64)

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
