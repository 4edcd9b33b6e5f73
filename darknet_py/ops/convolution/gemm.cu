// SGEMM, row-major, as Darknet's gemm(): C = alpha * op(A) * op(B) + beta * C.
// op(A) is M x K (stored K x M when TA), op(B) is K x N (stored N x K when TB).
//
// One block computes a BM x BN tile of C, stepping through K in slices of BK.
// Each slice of op(A) and op(B) is staged in shared memory k-major (As[k][m],
// Bs[k][n]) so that every thread reads its fragments as 16-byte vectors; each
// thread then accumulates a TM x TN block of C in registers (register blocking).
// Global loads are element-wise and predicated: leading dimensions, offsets and
// sizes are arbitrary, and a warp's loads still coalesce along the contiguous
// dimension. cp.async copies them straight into shared memory, STAGES - 1 slices
// ahead of the multiply (no registers held for the loads; out-of-range elements
// are zero-filled by the copy itself), so several slices' loads are in flight
// while one is multiplied.
//
// Split-K: gridDim.z > 1 splits K into chunks of k_chunk; each z-slice writes its
// raw partial product to C + z * partial_stride (a workspace, ld = N) and
// splitk_reduce folds the partials into C with alpha and beta. Deterministic.
//
// Epilogue of a convolution's inference forward: with `bias` non-null, C = act(alpha *
// acc + beta * C + bias[m]) per row m (split-K: splitk_reduce applies it), so a layer's
// bias (its batch norm folded in) and activation cost no pass of their own. The
// activations are kernels/activations.cu's expressions, op for op: the fused result has
// the bits of gemm followed by its bias_activate (alpha is 1 and beta 0 there, so
// alpha * acc + bias rounds once either way).
//
// Full fp32 FFMA throughout: no tensor cores, no TF32.

#include "../common/activations.cuh"
#include "gemm_core.cuh"

// v + bias[m], then the activation: what the epilogue stores for row m.
__device__ __forceinline__ float sgemm_finish(float v, const float* __restrict__ bias, int m, int act)
{
    if (bias == nullptr) return v;
    return epilogue_activate(v + bias[m], act);
}

template <int BM, int BN, int BK, int TM, int TN, int STAGES, bool TA, bool TB>
__device__ __forceinline__ void sgemm_tile(
    int M, int N, int K, float alpha,
    const float* __restrict__ A, int lda,
    const float* __restrict__ B, int ldb,
    float beta, float* __restrict__ C, int ldc,
    int k_chunk, int c_vec4, long long partial_stride, const float* __restrict__ bias, int act)
{
    constexpr int TX = BN / TN;                 // threads along n
    constexpr int TY = BM / TM;                 // threads along m
    constexpr int THREADS = TX * TY;
    constexpr int A_LOADS = BM * BK / THREADS;
    constexpr int B_LOADS = BN * BK / THREADS;
    // Fragment layout: a thread's TM rows are TM/4 runs of 4, the runs BM/(TM/4) apart,
    // so a warp's 16-byte reads hit consecutive addresses (no bank conflicts).
    constexpr int A_RUN = BM / (TM / 4);
    constexpr int B_RUN = BN / (TN / 4);
    static_assert(TM % 4 == 0 && TN % 4 == 0, "fragments are read as float4");
    static_assert(A_LOADS * THREADS == BM * BK && B_LOADS * THREADS == BN * BK, "tile/threads mismatch");
    static_assert(THREADS % BM == 0 && THREADS % BN == 0 && THREADS % BK == 0, "load mapping");
    static_assert(STAGES >= 3, "cp.async pipeline: at least 3 stages");

    // +4 floats per row: keeps rows 16-byte aligned and spreads the transposed
    // stores of the k-contiguous operands over all 32 banks.
    __shared__ __align__(16) float As[STAGES][BK][BM + 4];
    __shared__ __align__(16) float Bs[STAGES][BK][BN + 4];

    const int tid = threadIdx.x;
    const int tx = tid % TX;
    const int ty = tid / TX;

    // Swizzled block coordinates (see GROUP_M in gemm_core.cuh).
    const TileCoord tile = swizzled_tile<BM, BN>();
    const int m0 = tile.m0;
    const int n0 = tile.n0;

    const int k_begin = blockIdx.z * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);

    // Load mapping. The fastest-varying thread index runs along the operand's
    // contiguous dimension so each warp's loads coalesce.
    //   A stored M x K (!TA): contiguous in k;  A stored K x M (TA): contiguous in m.
    //   B stored K x N (!TB): contiguous in n;  B stored N x K (TB): contiguous in k.
    constexpr int A_STEP = TA ? THREADS / BM : THREADS / BK;   // per-load step (k if TA, else m)
    constexpr int B_STEP = TB ? THREADS / BK : THREADS / BN;   // per-load step (n if TB, else k)
    const int a_m = TA ? tid % BM : tid / BK;
    const int a_k = TA ? tid / BM : tid % BK;
    const int b_n = TB ? tid / BK : tid % BN;
    const int b_k = TB ? tid % BK : tid / BN;

    // Per-thread base pointers at k = k_begin; load l adds l * step along its
    // dimension. Row/column validity is fixed for the block, k validity per slice.
    const float* a_ptr = TA ? A + (size_t)(k_begin + a_k) * lda + (m0 + a_m)
                            : A + (size_t)(m0 + a_m) * lda + (k_begin + a_k);
    const float* b_ptr = TB ? B + (size_t)(n0 + b_n) * ldb + (k_begin + b_k)
                            : B + (size_t)(k_begin + b_k) * ldb + (n0 + b_n);
    const size_t a_load_step = (size_t)A_STEP * lda;   // along k if TA, along m if not: both are rows of A
    const size_t b_load_step = (size_t)B_STEP * ldb;
    const size_t a_slice_step = TA ? (size_t)BK * lda : (size_t)BK;
    const size_t b_slice_step = TB ? (size_t)BK : (size_t)BK * ldb;

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    // acc += the product of the slice held in shared buffer `buf`.
    auto multiply = [&](int buf) {
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int r = 0; r < TM / 4; ++r) {
                const float4 v = *reinterpret_cast<const float4*>(&As[buf][kk][r * A_RUN + ty * 4]);
                a[r * 4 + 0] = v.x; a[r * 4 + 1] = v.y; a[r * 4 + 2] = v.z; a[r * 4 + 3] = v.w;
            }
#pragma unroll
            for (int r = 0; r < TN / 4; ++r) {
                const float4 v = *reinterpret_cast<const float4*>(&Bs[buf][kk][r * B_RUN + tx * 4]);
                b[r * 4 + 0] = v.x; b[r * 4 + 1] = v.y; b[r * 4 + 2] = v.z; b[r * 4 + 3] = v.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
    };

    // Shared-memory destinations of load l (A: row-major k x m, B: k x n).
    auto a_dst = [&](int buf, int l) -> float* {
        return TA ? &As[buf][a_k + l * A_STEP][a_m] : &As[buf][a_k][a_m + l * A_STEP];
    };
    auto b_dst = [&](int buf, int l) -> float* {
        return TB ? &Bs[buf][b_k][b_n + l * B_STEP] : &Bs[buf][b_k + l * B_STEP][b_n];
    };
    auto a_ok = [&](int k0, int l) {
        const int m = m0 + a_m + (TA ? 0 : l * A_STEP);
        const int k = k_begin + k0 + a_k + (TA ? l * A_STEP : 0);
        return m < M && k < k_end;
    };
    auto b_ok = [&](int k0, int l) {
        const int n = n0 + b_n + (TB ? l * B_STEP : 0);
        const int k = k_begin + k0 + b_k + (TB ? 0 : l * B_STEP);
        return n < N && k < k_end;
    };

    const int tiles_k = (k_end - k_begin + BK - 1) / BK;

    auto load_async = [&](int buf, int k0) {   // slice at k0 -> shared buffer buf
        const float* pa = a_ptr + (size_t)(k0 / BK) * a_slice_step;
        const float* pb = b_ptr + (size_t)(k0 / BK) * b_slice_step;
#pragma unroll
        for (int l = 0; l < A_LOADS; ++l) {
            const bool ok = a_ok(k0, l);
            cp_async_f32(a_dst(buf, l), ok ? pa + l * a_load_step : A, ok);
        }
#pragma unroll
        for (int l = 0; l < B_LOADS; ++l) {
            const bool ok = b_ok(k0, l);
            cp_async_f32(b_dst(buf, l), ok ? pb + l * b_load_step : B, ok);
        }
    };
    // One commit group per slice (empty past the end, so the count stays uniform):
    // at iteration t, slices 0..t are complete once at most STAGES-2 groups pend.
#pragma unroll
    for (int s = 0; s < STAGES - 1; ++s) {
        if (s < tiles_k) load_async(s, s * BK);
        cp_async_commit();
    }
    for (int t = 0; t < tiles_k; ++t) {
        cp_async_wait<STAGES - 2>();
        __syncthreads();   // slice t visible to all; everyone is done with slice t-1
        const int next = t + STAGES - 1;
        if (next < tiles_k) load_async(next % STAGES, next * BK);   // refills slice t-1's buffer
        cp_async_commit();
        multiply(t % STAGES);
    }
    cp_async_wait<0>();

    // Epilogue. In split-K mode C is this z-slice's partial (alpha 1, beta 0).
    float* __restrict__ out = C + blockIdx.z * partial_stride;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * A_RUN + ty * 4 + (i % 4);
        if (m >= M) continue;
        float* row = out + (size_t)m * ldc;
#pragma unroll
        for (int r = 0; r < TN / 4; ++r) {
            const int n = n0 + r * B_RUN + tx * 4;
            if (c_vec4 && n + 3 < N) {
                float4* p = reinterpret_cast<float4*>(row + n);
                float4 v;
                v.x = alpha * acc[i][r * 4 + 0];
                v.y = alpha * acc[i][r * 4 + 1];
                v.z = alpha * acc[i][r * 4 + 2];
                v.w = alpha * acc[i][r * 4 + 3];
                if (beta != 0.0f) {   // C is not read when beta == 0 (it may hold NaN)
                    const float4 c = *p;
                    v.x = fmaf(beta, c.x, v.x); v.y = fmaf(beta, c.y, v.y);
                    v.z = fmaf(beta, c.z, v.z); v.w = fmaf(beta, c.w, v.w);
                }
                v.x = sgemm_finish(v.x, bias, m, act); v.y = sgemm_finish(v.y, bias, m, act);
                v.z = sgemm_finish(v.z, bias, m, act); v.w = sgemm_finish(v.w, bias, m, act);
                *p = v;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) {
                    if (n + j < N) {
                        float v = alpha * acc[i][r * 4 + j];
                        if (beta != 0.0f) v = fmaf(beta, row[n + j], v);
                        row[n + j] = sgemm_finish(v, bias, m, act);
                    }
                }
            }
        }
    }
}

// Entry points: variant x transpose case. All pipeline 4 slices (s4).
// 128x128x8s4 (256 threads, 8x8 outputs each, 2 blocks per SM) is for products with
// enough tiles to fill the SMs; 64x64x8s4r8 (64 threads, 8x8 each, up to 8 blocks per
// SM) gives 4x the blocks for the rest, with split-K on top; 32x32x8s4w (one warp,
// 4x8 each, up to 16 blocks per SM) is for a small C over a long K (a convolution's
// weight gradient: C is filters x weights, K is images x positions), split into
// thousands of K slices. Each was the fastest plan on some of yolov3-tiny's and cifar's
// convolution products (bench/kernels/conv_plans.py).
#define SGEMM_ENTRY(NAME, BM, BN, BK, TM, TN, STAGES, TA, TB, MINB)                              \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MINB) NAME(               \
        int M, int N, int K, float alpha, const float* __restrict__ A, int lda,                    \
        const float* __restrict__ B, int ldb, float beta, float* __restrict__ C, int ldc,          \
        int k_chunk, int c_vec4, long long partial_stride, const float* __restrict__ bias, int act) \
    {                                                                                              \
        sgemm_tile<BM, BN, BK, TM, TN, STAGES, TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C,    \
                                                       ldc, k_chunk, c_vec4, partial_stride, bias, \
                                                       act);                                       \
    }

SGEMM_ENTRY(sgemm_128x128x8s4_nn, 128, 128, 8, 8, 8, 4, false, false, 2)
SGEMM_ENTRY(sgemm_128x128x8s4_nt, 128, 128, 8, 8, 8, 4, false, true, 2)
SGEMM_ENTRY(sgemm_128x128x8s4_tn, 128, 128, 8, 8, 8, 4, true, false, 2)
SGEMM_ENTRY(sgemm_128x128x8s4_tt, 128, 128, 8, 8, 8, 4, true, true, 2)

SGEMM_ENTRY(sgemm_64x64x8s4r8_nn, 64, 64, 8, 8, 8, 4, false, false, 8)
SGEMM_ENTRY(sgemm_64x64x8s4r8_nt, 64, 64, 8, 8, 8, 4, false, true, 8)
SGEMM_ENTRY(sgemm_64x64x8s4r8_tn, 64, 64, 8, 8, 8, 4, true, false, 8)
SGEMM_ENTRY(sgemm_64x64x8s4r8_tt, 64, 64, 8, 8, 8, 4, true, true, 8)

SGEMM_ENTRY(sgemm_32x32x8s4w_nn, 32, 32, 8, 4, 8, 4, false, false, 16)
SGEMM_ENTRY(sgemm_32x32x8s4w_nt, 32, 32, 8, 4, 8, 4, false, true, 16)
SGEMM_ENTRY(sgemm_32x32x8s4w_tn, 32, 32, 8, 4, 8, 4, true, false, 16)
SGEMM_ENTRY(sgemm_32x32x8s4w_tt, 32, 32, 8, 4, 8, 4, true, true, 16)

// C[m, n] = alpha * sum_z partial[z][m, n] + beta * C[m, n] (then + bias[m] and the
// activation where bias is non-null); partials are M x N, ld N.
// x (blocks and threads) spans the M*N outputs, y the splits: thread y sums splits
// y, y + blockDim.y, ... in order and row y == 0 adds the rows' sums in order, so the
// result is the same on every run (no atomics). Thousands of splits (a weight
// gradient's) are summed by 32 threads per output instead of one.
extern "C" __global__ void splitk_reduce(int M, int N, int splits, const float* __restrict__ partial,
                                         float alpha, float beta, float* __restrict__ C, int ldc,
                                         const float* __restrict__ bias, int act)
{
    __shared__ float sums[256];
    const long long total = (long long)M * N;
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    float s = 0.0f;
    if (i < total)
        for (int z = threadIdx.y; z < splits; z += blockDim.y) s += partial[z * total + i];
    sums[threadIdx.y * blockDim.x + threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || i >= total) return;
    for (int y = 1; y < blockDim.y; ++y) s += sums[y * blockDim.x + threadIdx.x];
    const int m = (int)(i / N);
    const int n = (int)(i - (long long)m * N);
    float* c = C + (size_t)m * ldc + n;
    float v = alpha * s;
    if (beta != 0.0f) v = fmaf(beta, *c, v);
    *c = sgemm_finish(v, bias, m, act);
}
