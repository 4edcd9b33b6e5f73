// Hopper GEMM: wgmma (warpgroup MMA) fed by the bulk tensor copy engine (TMA), for fp16
// and bf16 operands with fp32 accumulation. Built for sm_90a only (wgmma and setmaxnreg
// are sm_90a features): on any other target the kernels compile to an empty body and are
// never launched (darknet_py/backends/cuda_wgmma.py loads this file's sm_90a build).
//
// C (M x N, fp32, row-major, ldc) = alpha * A @ B^T + beta * C, with A (M x K) and B (N x K)
// both K-major in half precision, rows `pitch` elements apart (a multiple of 8: TMA wants
// 16-byte strides). Other layouts and fp32 operands are converted first by to_kmajor below.
//
// Blocks are persistent (one per SM) and come in clusters of WG_CLUSTER (2) along M: the
// blocks of a cluster walk groups of 128 x 256 tiles of C stacked along M (block rank r
// takes tile row WG_CLUSTER * i + r), which share their B panel: each block copies its own
// A slice and its part of the shared B slice, multicast into every block of the cluster.
// A block's 384 threads are three warpgroups: warpgroup 0 is the producer (one thread
// issues the TMA copies of each 64-wide K slice into a ring of WG_STAGES shared-memory
// stages), warpgroups 1 and 2 are consumers, each owning 64 rows of the tile: per K slice
// four m64n256k16 wgmmas read both operands straight from shared memory. Two mbarriers
// per stage: `full` (the copies landed, counted in bytes by TMA) and `empty` (every
// consumer warp of the cluster is done with the stage: any block's multicast overwrites
// it in all). The producer runs ahead into the next tile while the consumers store the
// last one (through shared memory and TMA stores, which drain during the next tile's
// MMAs), so the copies overlap the epilogue.
//
// Shared-memory tiles use the 128-byte swizzle on both sides: TMA writes a row of 64 halves
// (128 bytes) with its 16-byte chunks permuted by row % 8, and the wgmma descriptors say
// the same (layout 1, 8-row groups 1024 bytes apart); stage buffers are 1024-byte aligned
// so the hardware's address-based swizzle lines up. Edges (M, N, K not multiples of the
// tile) come back from TMA as zeros; the epilogue stores only the rows and columns inside C.
//
// Tensor maps (A, B, and C for the TMA stores) come by value as __grid_constant__
// parameters, built on the host with cuTensorMapEncodeTiled; the launcher passes one
// pointer per argument (cuLaunchKernel), so the driver places each 64-byte aligned.

#include "../common/activations.cuh"   // the convolution epilogue's activation (store_tile_images)

constexpr int WG_THREADS = 384;      // producer + 2 consumer warpgroups
// Blocks per cluster (along M), sharing B through multicast (a third less L2 traffic: pairs
// 1-4% faster than lone blocks; -D for bench/kernels/wgmma_probe.py's variants).
#ifndef WG_CLUSTER
#define WG_CLUSTER 2
#endif

struct __align__(64) TensorMap {
    unsigned long long opaque[16];
};

// The operand types, and a float rounded (nearest even) to one's 16 bits: the wgmma
// epilogue's 16-bit image store (Images16) and the operand conversion (to_half_bits).
struct F16Op {};
struct BF16Op {};
__device__ __forceinline__ unsigned short rounded_to(F16Op, float v)
{
    unsigned short h;
    asm("cvt.rn.f16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return h;
}
__device__ __forceinline__ unsigned short rounded_to(BF16Op, float v)
{
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
    return h;
}

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define DARKNET_WGMMA 1
#endif

#ifdef DARKNET_WGMMA
constexpr int WG_BM = 128;           // tile rows (M): 64 per consumer warpgroup
constexpr int WG_BN = 256;           // tile columns (N): one m64n256 wgmma a consumer
constexpr int WG_BK = 64;            // K per stage: 64 halves = one 128-byte swizzle row
// Stages and group rows may be set with -D for bench/kernels/wgmma_probe.py's variants.
#ifndef WGMMA_STAGES
#define WGMMA_STAGES 4
#endif
#ifndef WGMMA_GROUP_M
#define WGMMA_GROUP_M 8
#endif
constexpr int WG_STAGES = WGMMA_STAGES;
constexpr int WG_A_BYTES = WG_BM * WG_BK * 2;
constexpr int WG_B_BYTES = WG_BN * WG_BK * 2;
constexpr int WG_STAGE_BYTES = WG_A_BYTES + WG_B_BYTES;
constexpr int WG_GROUP_M = WGMMA_GROUP_M;   // tile rows walked before moving right (L2 reuse)
constexpr int WG_EMPTY_ARRIVALS = 8 * WG_CLUSTER;   // one per consumer warp of the cluster
// Epilogue through TMA stores: per consumer two buffers of 64 rows x 32 fp32 (one 128-byte
// swizzled row each), filled from the registers while the other drains to C.
constexpr int WG_OUT_COLS = 32;
constexpr int WG_OUT_BYTES = 64 * WG_OUT_COLS * 4;

__device__ __forceinline__ unsigned wg_smem(const void* p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}

__device__ __forceinline__ void mbar_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

// Tell every producer of the cluster that this warp is done with a stage. A plain local
// arrive for lone blocks: the cluster-scope release form cost a memory barrier per slice
// per warp (ncu: 36% of the stalls).
__device__ __forceinline__ void release_stage(unsigned bar)
{
#if WG_CLUSTER == 1
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
#else
#pragma unroll
    for (unsigned cta = 0; cta < WG_CLUSTER; ++cta)
        asm volatile(
            "{\n"
            ".reg .b32 remote;\n"
            "mapa.shared::cluster.u32 remote, %0, %1;\n"
            "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
            "}\n" ::"r"(bar),
            "r"(cta)
            : "memory");
#endif
}

__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}

// Every thread of both blocks; orders shared memory (barrier inits) cluster-wide.
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;\n" ::: "memory");
}

// Spin until the barrier's phase of this parity has completed.
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile(
        "{\n"
        ".reg .pred done;\n"
        "WAIT_LOOP:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT_LOOP;\n"
        "}\n" ::"r"(bar),
        "r"(parity)
        : "memory");
}

// A box of the tensor map at (inner, outer) = (k, row) into shared memory; completion is
// counted on `bar` in bytes.
__device__ __forceinline__ void tma_load(unsigned dst, const TensorMap* map, unsigned bar, int k, int row)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(
            dst),
        "l"(map), "r"(bar), "r"(k), "r"(row)
        : "memory");
}

// The same box into the same shared-memory offset of every block in `mask`, each block's
// barrier at `bar` counting the bytes.
__device__ __forceinline__ void tma_load_multicast(unsigned dst, const TensorMap* map, unsigned bar, int k, int row,
                                                   unsigned short mask)
{
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
        "l"(map), "r"(bar), "r"(k), "r"(row), "h"(mask)
        : "memory");
}

// A box of shared memory out to the tensor map at (col, row); clipped to the tensor's bounds.
__device__ __forceinline__ void tma_store(const TensorMap* map, unsigned src, int col, int row)
{
    asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n" ::"l"(map), "r"(src),
                 "r"(col), "r"(row)
                 : "memory");
    asm volatile("cp.async.bulk.commit_group;\n" ::: "memory");
}

// Until at most PENDING of this thread's bulk stores still read shared memory.
template <int PENDING>
__device__ __forceinline__ void tma_store_wait()
{
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(PENDING) : "memory");
}

// The 128 threads of one consumer warpgroup (named barrier 1 + consumer).
__device__ __forceinline__ void consumer_sync(int consumer)
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(consumer + 1) : "memory");
}

// Shared-memory matrix descriptor: K-major, 128-byte swizzle, 8-row groups 1024 bytes apart.
__device__ __forceinline__ unsigned long long smem_desc(unsigned address)
{
    return (unsigned long long)((address & 0x3FFFF) >> 4) | (1ull << 16) | ((1024ull >> 4) << 32) | (1ull << 62);
}

__device__ __forceinline__ void wgmma_fence()
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void wgmma_commit()
{
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int PENDING>
__device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(PENDING) : "memory");
}

// Keep the compiler from moving accumulator reads or writes across the asynchronous MMAs.
__device__ __forceinline__ void pin_accumulators(float (&d)[128])
{
#pragma unroll
    for (int i = 0; i < 128; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// d (+)= A (64 x 16) @ B (256 x 16)^T in the operand type TYPE ("f16" or "bf16");
// accumulate = 0 overwrites d. One statement for both types: the 128 accumulator operands.
#define WGMMA_64X256(TYPE)                                                                                  \
    asm volatile("{\n"                                                                                       \
                 ".reg .pred acc;\n"                                                                          \
                 "setp.ne.b32 acc, %130, 0;\n"                                                                \
                 "wgmma.mma_async.sync.aligned.m64n256k16.f32." TYPE "." TYPE " "                             \
                 "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127}, %128, %129, acc, 1, 1, 0, 0;\n" \
                 "}\n"                                                                                        \
                 : WGMMA_ACCUMULATORS                                                                         \
                 : "l"(a), "l"(b), "r"(accumulate))

#define WGMMA_ACCUMULATORS \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), \
    "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), \
    "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), \
    "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), \
    "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), \
    "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), \
    "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), \
    "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), \
    "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), \
    "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), \
    "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), \
    "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])

__device__ __forceinline__ void wgmma_64x256(F16Op, float (&d)[128], unsigned long long a, unsigned long long b,
                                             int accumulate)
{
    WGMMA_64X256("f16");
}

__device__ __forceinline__ void wgmma_64x256(BF16Op, float (&d)[128], unsigned long long a, unsigned long long b,
                                             int accumulate)
{
    WGMMA_64X256("bf16");
}

// The (m0, n0) origin of this block's tile in the cluster's t-th pair of tiles: pairs walked
// GROUP_M pair rows at a time, down then right; the block of rank r takes tile row 2i + r.
__device__ __forceinline__ void tile_origin(int t, int pair_rows, int tiles_n, unsigned rank, int& m0, int& n0)
{
    const int group = t / (WG_GROUP_M * tiles_n);
    const int first = group * WG_GROUP_M;
    const int rows = min(pair_rows - first, WG_GROUP_M);
    const int in_group = t - group * WG_GROUP_M * tiles_n;
    m0 = ((first + in_group % rows) * WG_CLUSTER + (int)rank) * WG_BM;
    n0 = (in_group / rows) * WG_BN;
}

// Where a consumer thread's accumulators lie in its 64 x 256 part of a tile (the wgmma
// m64n256 fragment): d[j * 4 + half * 2 + e] is row r_base + 8 * half, column c_base + 8 * j
// + e.
struct Fragment {
    int r_base, c_base;
    __device__ __forceinline__ Fragment(int row0, int col0)
    {
        const int lane = threadIdx.x & 31;
        const int warp = (threadIdx.x >> 5) & 3;
        r_base = row0 + warp * 16 + (lane >> 2);
        c_base = col0 + (lane & 3) * 2;
    }
};

// One consumer's 64 x 256 part of a tile: c = alpha * acc + beta * c inside M x N.
__device__ __forceinline__ void store_tile(const float (&d)[128], int row0, int col0, int m, int n, float alpha,
                                           float beta, float* c, int ldc, bool pairs)
{
    const Fragment f(row0, col0);
    const int r_base = f.r_base, c_base = f.c_base;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r_base + half * 8;
        if (r >= m) continue;
        float* out = c + (size_t)r * ldc;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
            const int col = c_base + j * 8;
            float v0 = alpha * d[j * 4 + half * 2];
            float v1 = alpha * d[j * 4 + half * 2 + 1];
            if (pairs && col + 1 < n) {
                float2* p = reinterpret_cast<float2*>(out + col);
                if (beta != 0.0f) {
                    const float2 old = *p;
                    v0 += beta * old.x;
                    v1 += beta * old.y;
                }
                *p = make_float2(v0, v1);
            } else {
                if (col < n) out[col] = beta != 0.0f ? v0 + beta * out[col] : v0;
                if (col + 1 < n) out[col + 1] = beta != 0.0f ? v1 + beta * out[col + 1] : v1;
            }
        }
    }
}

// How store_tile_images writes a value: as fp32, added to the fp32 there (a data gradient
// adding into the input's delta), or rounded to the operands' own 16 bits (a
// batch-normalised layer's x under fp16/bf16 training, x_storage.cuh's layout).
struct ImagesF32 {
    using Storage = float;
    static __device__ __forceinline__ void put(float* p, float v) { *p = v; }
};
struct ImagesF32Add {
    using Storage = float;
    static __device__ __forceinline__ void put(float* p, float v) { *p += v; }
};
template <class Op> struct Images16 {
    using Storage = unsigned short;
    static __device__ __forceinline__ void put(unsigned short* p, float v) { *p = rounded_to(Op{}, v); }
};

// One consumer's part of a convolution's output, C's column j being position j % positions
// of image j / positions: c[image * image_stride + row * positions + position] = act(alpha *
// acc + bias[row]) (bias unless null; act an activations.cuh id, as conv_tc's epilogue
// applies it), stored as Out says. The layer's NCHW layout straight from the tile (the
// forward convolution, cuda_wgmma.conv_forward).
template <class Out>
__device__ __forceinline__ void store_tile_images(const float (&d)[128], int row0, int col0, int m, int n,
                                                  float alpha, typename Out::Storage* c, int positions,
                                                  long long image_stride, const float* __restrict__ bias, int act)
{
    const Fragment f(row0, col0);
    const int r_base = f.r_base, c_base = f.c_base;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
        const int r = r_base + half * 8;
        if (r >= m) continue;
        const float b = bias ? bias[r] : 0.0f;
        typename Out::Storage* const row = c + (long long)r * positions;
#pragma unroll
        for (int j = 0; j < 32; ++j) {
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                const int col = c_base + j * 8 + e;
                if (col >= n) continue;
                const int image = col / positions;
                const float v = alpha * d[j * 4 + half * 2 + e] + b;
                Out::put(row + image * image_stride + (col - image * positions),
                         act == LINEAR ? v : epilogue_activate(v, act));
            }
        }
    }
}

// The same 64 x 256 part through shared memory and TMA stores (C's rows 16-byte aligned,
// beta = 0): 8 chunks of 32 columns, alternating between the consumer's two buffers; a
// buffer is refilled only once the store issued from it two chunks ago has read it. The
// stores drain while the consumer goes on to the next tile's MMAs.
__device__ __forceinline__ void store_tile_tma(const float (&d)[128], const TensorMap* c_map, unsigned buffers,
                                               int consumer, int row0, int col0, float alpha)
{
    const int lane = threadIdx.x & 31;
    const int warp = (threadIdx.x >> 5) & 3;
    const bool issuer = (threadIdx.x & 127) == 0;
#pragma unroll
    for (int chunk = 0; chunk < WG_BN / WG_OUT_COLS; ++chunk) {
        const unsigned buf = buffers + (chunk & 1) * WG_OUT_BYTES;
        if (issuer) tma_store_wait<1>();
        consumer_sync(consumer);
#pragma unroll
        for (int j = 0; j < WG_OUT_COLS / 8; ++j) {
#pragma unroll
            for (int half = 0; half < 2; ++half) {
                const int r = warp * 16 + (lane >> 2) + half * 8;
                const int col = j * 8 + (lane & 3) * 2;           // within the chunk
                const int q = (col >> 2) ^ (r & 7);                // 16-byte unit, swizzled
                const unsigned at = buf + r * 128 + q * 16 + (col & 3) * 4;
                const int idx = (chunk * 4 + j) * 4 + half * 2;
                asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(at), "f"(alpha * d[idx]),
                             "f"(alpha * d[idx + 1])
                             : "memory");
            }
        }
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        consumer_sync(consumer);
        if (issuer) tma_store(c_map, buf, col0 + chunk * WG_OUT_COLS, row0);
    }
}

template <class Op>
// store: 0 scalar stores of C, 1 float2 stores, 2 TMA stores through c_map (beta = 0),
// 3 a convolution's images (store_tile_images: positions, image_stride, bias, act; one run),
// 4 the same rounded to the operands' 16 bits (c then holds 16-bit values), 5 the same
// added to the fp32 values there.
// Split K: K's 64-wide slices go in runs of split_blocks, and run s of a tile is a work
// item of its own that stores its partial product into c + s * split_stride (store 0 or
// 1, beta = 0; the launcher adds the partials up after): a product of few tiles and a long
// K (a weight gradient over a batch of positions) then fills the SMs. split_blocks >= K's
// slices: one run, c itself.
__device__ __forceinline__ void wgmma_gemm_body(const TensorMap* a_map, const TensorMap* b_map,
                                                const TensorMap* c_map, int m, int n, int k, float alpha,
                                                float beta, float* c, int ldc, int store, int split_blocks,
                                                long long split_stride, int positions, long long image_stride,
                                                const float* bias, int act)
{
    extern __shared__ unsigned char wg_dynamic[];
    // Stage buffers 1024-byte aligned (the launcher asks for 1 KB of slack).
    const unsigned raw = wg_smem(wg_dynamic);
    const unsigned base = (raw + 1023u) & ~1023u;
    const unsigned a_tiles = base;
    const unsigned b_tiles = base + WG_STAGES * WG_A_BYTES;
    const unsigned full_bar = b_tiles + WG_STAGES * WG_B_BYTES;
    const unsigned empty_bar = full_bar + WG_STAGES * 8;
    const unsigned out_buffers = full_bar + 1024;   // after the barriers, 1024-byte aligned

    // A tile row past M (an odd count of them) computes zeros from TMA's fill and stores
    // nothing, but still copies and multicasts its half of B for its partner.
    const int pair_rows = (m + WG_BM * WG_CLUSTER - 1) / (WG_BM * WG_CLUSTER);
    const int tiles_n = (n + WG_BN - 1) / WG_BN;
    const int pairs = pair_rows * tiles_n;
    const unsigned rank = cluster_rank();
    const int cluster = blockIdx.x / WG_CLUSTER, clusters = gridDim.x / WG_CLUSTER;
    const int k_blocks = (k + WG_BK - 1) / WG_BK;
    const int items = pairs * ((k_blocks + split_blocks - 1) / split_blocks);
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
            int stage = 0;
            unsigned phase = 0;
            for (int t = cluster; t < items; t += clusters) {
                int m0, n0;
                tile_origin(t % pairs, pair_rows, tiles_n, rank, m0, n0);
                const int first = (t / pairs) * split_blocks, last = min(k_blocks, first + split_blocks);
                for (int kb = first; kb < last; ++kb) {
                    mbar_wait(empty_bar + 8 * stage, phase ^ 1u);
                    const unsigned full = full_bar + 8 * stage;
                    mbar_expect_tx(full, WG_STAGE_BYTES);   // A + both halves of B
                    tma_load(a_tiles + stage * WG_A_BYTES, a_map, full, kb * WG_BK, m0);
#if WG_CLUSTER == 1
                    tma_load(b_tiles + stage * WG_B_BYTES, b_map, full, kb * WG_BK, n0);
#else
                    tma_load_multicast(b_tiles + stage * WG_B_BYTES + rank * (WG_B_BYTES / WG_CLUSTER), b_map, full,
                                       kb * WG_BK, n0 + (int)rank * (WG_BN / WG_CLUSTER), (1u << WG_CLUSTER) - 1u);
#endif
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
        float d[128];
#pragma unroll
        for (int i = 0; i < 128; ++i) d[i] = 0.0f;
        int stage = 0;
        unsigned phase = 0;
        for (int t = cluster; t < items; t += clusters) {
            int m0, n0;
            tile_origin(t % pairs, pair_rows, tiles_n, rank, m0, n0);
            const int first = (t / pairs) * split_blocks, last = min(k_blocks, first + split_blocks);
            float* const out = c + (t / pairs) * split_stride;
            int previous = -1;
            pin_accumulators(d);
            for (int kb = first; kb < last; ++kb) {
                mbar_wait(full_bar + 8 * stage, phase);
                const unsigned a = a_tiles + stage * WG_A_BYTES + consumer * (WG_A_BYTES / 2);
                const unsigned b = b_tiles + stage * WG_B_BYTES;
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < WG_BK / 16; ++kk)   // 16 halves = 32 bytes along K
                    wgmma_64x256(Op{}, d, smem_desc(a + kk * 32), smem_desc(b + kk * 32), kb > first || kk > 0);
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
            if (store == 3)
                store_tile_images<ImagesF32>(d, m0 + consumer * 64, n0, m, n, alpha, c, positions, image_stride, bias,
                                             act);
            else if (store == 5)
                store_tile_images<ImagesF32Add>(d, m0 + consumer * 64, n0, m, n, alpha, c, positions, image_stride,
                                                bias, act);
            else if (store == 4)
                store_tile_images<Images16<Op>>(d, m0 + consumer * 64, n0, m, n, alpha,
                                                reinterpret_cast<unsigned short*>(c), positions, image_stride, bias,
                                                act);
            else if (store == 2)
                store_tile_tma(d, c_map, out_buffers + consumer * 2 * WG_OUT_BYTES, consumer, m0 + consumer * 64,
                               n0, alpha);
            else
                store_tile(d, m0 + consumer * 64, n0, m, n, alpha, beta, out, ldc, store == 1);
        }
        if (store == 2 && (threadIdx.x & 127) == 0) tma_store_wait<0>();   // before the block's memory goes
    }
    cluster_sync();   // no block leaves while its partner may still arrive on its barriers
}
#endif   // DARKNET_WGMMA

#define WGMMA_GEMM_KERNEL(NAME, OP)                                                                             \
    extern "C" __global__ void __cluster_dims__(WG_CLUSTER, 1, 1) __launch_bounds__(WG_THREADS, 1)            \
        NAME(const __grid_constant__ TensorMap a_map, const __grid_constant__ TensorMap b_map,              \
             const __grid_constant__ TensorMap c_map, int m, int n, int k, float alpha, float beta, float* c, \
             int ldc, int store, int split_blocks, long long split_stride, int positions,                     \
             long long image_stride, const float* bias, int act)                                              \
    {                                                                                                          \
        WGMMA_BODY(OP)                                                                                         \
    }

#ifdef DARKNET_WGMMA
#define WGMMA_BODY(OP)                                                                                     \
    wgmma_gemm_body<OP>(&a_map, &b_map, &c_map, m, n, k, alpha, beta, c, ldc, store, split_blocks, split_stride, \
                        positions, image_stride, bias, act);
#else
#define WGMMA_BODY(OP)
#endif

WGMMA_GEMM_KERNEL(wgmma_gemm_f16, F16Op)
WGMMA_GEMM_KERNEL(wgmma_gemm_bf16, BF16Op)

// ---- operands into the wgmma layout --------------------------------------------------
// dst[r * pitch + c] = half(src element (r, c)) for r < rows, c < cols, where element
// (r, c) is src[r * ld + c] (transposed = 0) or src[c * ld + r] (transposed = 1). A 32 x 64
// tile goes through shared memory so both the fp32 reads and the half writes are coalesced
// whichever way the source runs. Block: 32 x 8 threads; grid: (row tiles, column tiles), rows
// on x because an operand's rows (a batch of positions) can outnumber grid.y's limit.
constexpr int KM_ROWS = 32;
constexpr int KM_COLS = 64;

__device__ __forceinline__ unsigned short to_half_bits(float x, int bf16)
{
    return bf16 ? rounded_to(BF16Op{}, x) : rounded_to(F16Op{}, x);
}

__device__ __forceinline__ void to_kmajor_body(const float* src, int ld, int rows, int cols, int transposed,
                                               unsigned short* dst, int pitch, int bf16)
{
    __shared__ float tile[KM_ROWS][KM_COLS + 1];
    const int r0 = blockIdx.x * KM_ROWS, c0 = blockIdx.y * KM_COLS;
    const int tx = threadIdx.x, ty = threadIdx.y;
    if (transposed) {
        // src runs along r: threads along x read consecutive r of one c.
        for (int cc = ty; cc < KM_COLS; cc += 8) {
            const int r = r0 + tx, col = c0 + cc;
            tile[tx][cc] = (r < rows && col < cols) ? src[(size_t)col * ld + r] : 0.0f;
        }
    } else {
        for (int rr = ty; rr < KM_ROWS; rr += 8) {
            const int r = r0 + rr;
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int col = c0 + tx + 32 * h;
                tile[rr][tx + 32 * h] = (r < rows && col < cols) ? src[(size_t)r * ld + col] : 0.0f;
            }
        }
    }
    __syncthreads();
    // Each thread writes one pair of halves: 32 threads cover a 64-wide row.
    for (int rr = ty; rr < KM_ROWS; rr += 8) {
        const int r = r0 + rr, col = c0 + 2 * tx;
        if (r >= rows || col >= cols) continue;
        const unsigned lo = to_half_bits(tile[rr][2 * tx], bf16);
        if (col + 1 < cols) {
            const unsigned hi = to_half_bits(tile[rr][2 * tx + 1], bf16);
            *reinterpret_cast<unsigned*>(dst + (size_t)r * pitch + col) = lo | (hi << 16);
        } else {
            dst[(size_t)r * pitch + col] = (unsigned short)lo;
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) to_kmajor_f16(const float* src, int ld, int rows, int cols,
                                                                 int transposed, unsigned short* dst, int pitch)
{
    to_kmajor_body(src, ld, rows, cols, transposed, dst, pitch, 0);
}

extern "C" __global__ void __launch_bounds__(256) to_kmajor_bf16(const float* src, int ld, int rows, int cols,
                                                                  int transposed, unsigned short* dst, int pitch)
{
    to_kmajor_body(src, ld, rows, cols, transposed, dst, pitch, 1);
}
