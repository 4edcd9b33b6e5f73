// Tensor-core GEMM and implicit-GEMM convolution: fp16 / bf16 operands through
// mma.sync m16n8k16, tf32 through m16n8k8, every product accumulated in fp32.
//
// One tile loop for all three precisions. A block computes a BM x BN tile of C with
// WARPS_M x WARPS_N warps; K is walked in slices of 64 bytes per row (32 halves or 16
// tf32s), two shared-memory stages. Both operands sit in shared memory k-contiguous,
// [row][k], rows 80 bytes apart (64 + 16 of padding: the 8 rows an ldmatrix reads fall
// on distinct banks). A 32-byte step of k is one mma in either precision (k16 of
// halves, k8 of tf32s), and ldmatrix.x4 reads the same bytes for both, so the fragment
// code does not depend on the precision.
//
// Operands reach shared memory two ways:
//   * packed weights (the layer's weights converted once to the precision, rows padded
//     to 16 bytes): cp.async, 16 bytes a copy, zero-filled past the edges;
//   * fp32 arrays (activations, deltas, an im2col matrix read in place through
//     gemm_core.cuh's gather): loaded into registers one slice ahead, converted, and
//     stored as 16-byte vectors after the current slice's mmas.
// Epilogues: C = alpha * acc + beta * C (split-K: raw partials, reduced by gemm.cu's
// splitk_reduce), or a convolution's output act(acc + bias) in (image, filter, position)
// order, as fp32 or (the `_h` entries) rounded to the precision's own 16 bits: a
// batch-normalised layer's x under fp16/bf16 training, which batch norm then reads.
#pragma once
#include "../common/activations.cuh"
#include "gemm_core.cuh"
#include "../common/x_storage.cuh"

template <class X, class Y> struct same_type { static constexpr bool value = false; };
template <class X> struct same_type<X, X> { static constexpr bool value = true; };
template <bool C, class X, class Y> struct pick_type { using type = X; };
template <class X, class Y> struct pick_type<false, X, Y> { using type = Y; };

// ---- precisions -----------------------------------------------------------------------
struct F16 {
    static constexpr int BYTES = 2;
};
struct BF16 {
    static constexpr int BYTES = 2;
};
struct TF32 {
    static constexpr int BYTES = 4;
};
// The 16-bit storage (x_storage.cuh) a precision's `_h` convolution entries write.
template <class P> struct HalfStorage;
template <> struct HalfStorage<F16> { using type = XF16; };
template <> struct HalfStorage<BF16> { using type = XBF16; };

// One 32-bit word holding lo (lower address) and hi, rounded to nearest even.
__device__ __forceinline__ unsigned pack_pair(F16, float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ unsigned pack_pair(BF16, float lo, float hi)
{
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// tf32: nearest, ties away from zero (the only rounding cvt offers for tf32).
__device__ __forceinline__ unsigned to_tf32(float x)
{
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;\n" : "=r"(r) : "f"(x));
    return r;
}

// Words of v[0..RUN) in precision P, in memory order.
template <class P, int RUN>
__device__ __forceinline__ void to_words(const float (&v)[RUN], unsigned (&w)[RUN * P::BYTES / 4])
{
    if constexpr (P::BYTES == 4) {
#pragma unroll
        for (int j = 0; j < RUN; ++j) w[j] = to_tf32(v[j]);
    } else {
#pragma unroll
        for (int j = 0; j < RUN / 2; ++j) w[j] = pack_pair(P{}, v[2 * j], v[2 * j + 1]);
    }
}

__device__ __forceinline__ void mma(F16, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma(BF16, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void mma(TF32, float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2])
{
    asm volatile("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned (&r)[4], unsigned address)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(address));
}

// ---- staging: which 16-byte chunks of a ROWS x 64-byte slice a thread fills ----------
constexpr int SLICE_BYTES = 64;   // of each row, per k slice
constexpr int ROW_PITCH = 80;     // bytes between rows in shared memory

template <int ROWS, int THREADS, int BYTES>
struct StageMap {
    static_assert(ROWS <= THREADS && THREADS % ROWS == 0, "rows per thread group");
    static constexpr int CHUNKS = ROWS * SLICE_BYTES / 16;
    static constexpr int PER_THREAD = CHUNKS >= THREADS ? CHUNKS / THREADS : 1;   // consecutive chunks
    static constexpr int CHUNK_ELEMS = 16 / BYTES;
    static constexpr int RUN = PER_THREAD * CHUNK_ELEMS;   // elements of k a thread stages
    static constexpr int ACTIVE = CHUNKS / PER_THREAD;     // threads with chunks
    // Thread tid: row tid % ROWS (consecutive threads, consecutive rows), chunks from
    // (tid / ROWS) * PER_THREAD on.
    static __device__ __forceinline__ int row(int tid) { return tid % ROWS; }
    static __device__ __forceinline__ int k_offset(int tid) { return (tid / ROWS) * RUN; }
};

// Operand sources. rows: M (A) or N (B); every source reads element (row, k) of its
// operand, k counted from the start of K.

// Weights converted to P, rows of `pitch` elements (a multiple of 16 bytes), zero past k_total.
struct PackedSource {
    static constexpr bool ASYNC = true;
    const unsigned char* base;
    int rows, pitch;
};

// fp32 matrix with element (row, k) at base[k * ld + row] (contiguous along rows).
struct RowMajorKSource {
    static constexpr bool ASYNC = false;
    const float* base;
    int rows, ld, k_end;
};

// fp32 matrix with element (row, k) at base[row * ld + k] (contiguous along k; RowStager).
struct RowMajorRowSource {
    static constexpr bool ASYNC = false;
    const float* base;
    int rows, ld, k_end;
};

// A convolution's im2col matrix, column n = row here (gemm_core.cuh); T: the image's
// elements, float, or unsigned short holding P's own 16 bits (a 16-bit layer output).
template <class T>
struct ConvColumnSourceOf {
    static constexpr bool ASYNC = false;
    ConvGeometryOf<T> g;
};
using ConvColumnSource = ConvColumnSourceOf<float>;

// What a source's values are held as in registers until they are stored: fp32, or the
// raw 16 bits of an image kept at the operands' precision (stored as they are).
template <class Src> struct StagedValue { using type = float; };
template <class T> struct StagedValue<ConvColumnSourceOf<T>> { using type = T; };
template <class Src> struct IsConvColumns { static constexpr bool value = false; };
template <class T> struct IsConvColumns<ConvColumnSourceOf<T>> { static constexpr bool value = true; };

// Words of v[0..RUN) already in a 16-bit precision's bits, in memory order.
template <int RUN>
__device__ __forceinline__ void raw_words(const unsigned short (&v)[RUN], unsigned (&w)[RUN / 2])
{
#pragma unroll
    for (int j = 0; j < RUN / 2; ++j) w[j] = (unsigned)v[2 * j] | ((unsigned)v[2 * j + 1] << 16);
}

// A thread's part of one operand's staging: its row's state and the values in flight.
template <class P, class Src, int ROWS, int THREADS>
struct Stager {
    using Map = StageMap<ROWS, THREADS, P::BYTES>;
    using Value = typename StagedValue<Src>::type;
    static_assert(sizeof(Value) == 4 || P::BYTES == 2, "16-bit values only for 16-bit operands");
    static constexpr int RUN = Map::RUN;
    Value v[Src::ASYNC ? 1 : RUN];
    int row, row_local, k_off;   // row: of the operand; row_local: of the tile
    bool active;
    ColumnCursorOf<Value> column;   // ConvColumnSourceOf

    __device__ __forceinline__ void begin(const Src& src, int row0, int tid)
    {
        row_local = Map::row(tid);
        row = row0 + row_local;
        k_off = Map::k_offset(tid);
        active = tid < Map::ACTIVE;
        if constexpr (IsConvColumns<Src>::value) {
            column = column_cursor(src.g, row);
        }
    }

    // Start the loads of the slice at k0: cp.async into `tile` (the operand's rows of
    // this stage), or into registers.
    __device__ __forceinline__ void fetch(const Src& src, int k0, unsigned char* tile)
    {
        if (!active) return;
        const int k = k0 + k_off;
        if constexpr (Src::ASYNC) {
#pragma unroll
            for (int c = 0; c < Map::PER_THREAD; ++c) {
                const int kc = k + c * Map::CHUNK_ELEMS;
                const bool ok = row < src.rows && kc < src.pitch;
                const unsigned char* from =
                    ok ? src.base + ((size_t)row * src.pitch + kc) * P::BYTES : src.base;
                cp_async_16(tile + row_local * ROW_PITCH + (k_off + c * Map::CHUNK_ELEMS) * P::BYTES, from, ok);
            }
        } else if constexpr (IsConvColumns<Src>::value) {
            gather_column<RUN>(src.g, column, k, v);
        } else {
            const bool row_ok = row < src.rows;
#pragma unroll
            for (int j = 0; j < RUN; ++j)
                v[j] = (row_ok && k + j < src.k_end) ? src.base[(size_t)(k + j) * src.ld + row] : 0.0f;
        }
    }

    // Convert the registers' values and store them into `tile` (nothing for cp.async).
    __device__ __forceinline__ void store(unsigned char* tile)
    {
        if constexpr (!Src::ASYNC) {
            if (!active) return;
            unsigned w[RUN * P::BYTES / 4];
            if constexpr (sizeof(Value) == 2)
                raw_words<RUN>(v, w);
            else
                to_words<P, RUN>(v, w);
            uint4* dst = reinterpret_cast<uint4*>(tile + row_local * ROW_PITCH + k_off * P::BYTES);
#pragma unroll
            for (int c = 0; c < RUN * P::BYTES / 16; ++c)
                dst[c] = make_uint4(w[4 * c], w[4 * c + 1], w[4 * c + 2], w[4 * c + 3]);
        }
    }
};

// Staging of a k-contiguous fp32 operand (RowMajorRowSource): consecutive threads read
// consecutive 16-byte quads of one row (whole lines per warp), a thread holding the same
// quad of k for QUADS / THREADS rows; float4 loads where the rows are 16-byte aligned.
template <class P, int ROWS, int THREADS>
struct RowStager {
    static constexpr int QUADS_PER_ROW = SLICE_BYTES / P::BYTES / 4;
    static constexpr int QUADS = ROWS * QUADS_PER_ROW;
    static constexpr int PER_THREAD = QUADS >= THREADS ? QUADS / THREADS : 1;
    static constexpr int ACTIVE = QUADS / PER_THREAD;
    static constexpr int ROW_STEP = THREADS / QUADS_PER_ROW;
    static_assert(THREADS % QUADS_PER_ROW == 0, "quads per row");
    float v[PER_THREAD][4];
    int row0, first_row, quad;
    bool active, vec;

    __device__ __forceinline__ void begin(const RowMajorRowSource& src, int tile_row0, int tid)
    {
        row0 = tile_row0;
        first_row = tid / QUADS_PER_ROW;
        quad = tid % QUADS_PER_ROW;
        active = tid < ACTIVE;
        vec = ((reinterpret_cast<unsigned long long>(src.base) & 15) == 0) && (src.ld & 3) == 0;
    }

    __device__ __forceinline__ void fetch(const RowMajorRowSource& src, int k0, unsigned char*)
    {
        if (!active) return;
        const int k = k0 + quad * 4;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            const int r = row0 + first_row + i * ROW_STEP;
            const float* p = src.base + (size_t)r * src.ld + k;
            if (r < src.rows && vec && k + 3 < src.k_end) {
                const float4 q = *reinterpret_cast<const float4*>(p);
                v[i][0] = q.x; v[i][1] = q.y; v[i][2] = q.z; v[i][3] = q.w;
            } else {
#pragma unroll
                for (int j = 0; j < 4; ++j) v[i][j] = (r < src.rows && k + j < src.k_end) ? p[j] : 0.0f;
            }
        }
    }

    __device__ __forceinline__ void store(unsigned char* tile)
    {
        if (!active) return;
#pragma unroll
        for (int i = 0; i < PER_THREAD; ++i) {
            unsigned char* dst = tile + (first_row + i * ROW_STEP) * ROW_PITCH + quad * 4 * P::BYTES;
            unsigned w[P::BYTES];
            to_words<P, 4>(v[i], w);
            if constexpr (P::BYTES == 4)
                *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
            else
                *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
        }
    }
};

template <class P, class Src, int ROWS, int THREADS>
struct StagerFor {
    using type = Stager<P, Src, ROWS, THREADS>;
};
template <class P, int ROWS, int THREADS>
struct StagerFor<P, RowMajorRowSource, ROWS, THREADS> {
    using type = RowStager<P, ROWS, THREADS>;
};

// ---- epilogues ------------------------------------------------------------------------
// The convolution epilogue applies activations.cuh's epilogue_activate (ids of
// darknet_py/activations.py); the backend runs the ones it does not fuse as a pass of their
// own after.

// C[m * ldc + n] = alpha * acc + beta * C (C not read when beta == 0).
struct GemmEpilogue {
    float* c;
    int rows, cols, ldc;
    float alpha, beta;
    __device__ __forceinline__ long long column(int n) const { return n < cols ? n : -1; }
    __device__ __forceinline__ void store(int m, long long col, float acc) const
    {
        if (m >= rows || col < 0) return;
        float* p = c + (size_t)m * ldc + col;
        float v = alpha * acc;
        if (beta != 0.0f) v = fmaf(beta, *p, v);
        *p = v;
    }
};

// out[image * image_stride + m * positions + p] = act(acc + bias[m]), n = image * positions + p,
// stored as Out (x_storage.cuh's XF32, XF16 or XBF16) rounds it.
template <class Out>
struct ConvEpilogue {
    typename Out::Storage* out;
    const float* bias;   // null: none
    int rows, cols, positions, act;
    long long image_stride;
    __device__ __forceinline__ long long column(int n) const
    {
        return image_column(n, cols, positions, image_stride);
    }
    __device__ __forceinline__ void store(int m, long long col, float acc) const
    {
        if (m >= rows || col < 0) return;
        const float x = bias != nullptr ? acc + bias[m] : acc;
        out[(size_t)m * positions + col] = Out::rounded(epilogue_activate(x, act));
    }
};

// ConvEpilogue's store with the output's storage chosen at run time: fp32, or (half_out)
// Half's 16 bits (one uniform branch a store).
template <class Half>
struct ConvEpilogueEither {
    void* out;
    const float* bias;   // null: none
    int rows, cols, positions, act, half_out;
    long long image_stride;
    __device__ __forceinline__ long long column(int n) const
    {
        return image_column(n, cols, positions, image_stride);
    }
    __device__ __forceinline__ void store(int m, long long col, float acc) const
    {
        if (m >= rows || col < 0) return;
        const float x = epilogue_activate(bias != nullptr ? acc + bias[m] : acc, act);
        const size_t at = (size_t)m * positions + col;
        if (half_out)
            static_cast<typename Half::Storage*>(out)[at] = Half::rounded(x);
        else
            static_cast<float*>(out)[at] = x;
    }
};

// ---- the tile loop ----------------------------------------------------------------------
template <class P, int BM, int BN, int WARPS_M, int WARPS_N, class SrcA, class SrcB, class Epi>
__device__ __forceinline__ void tc_tile(const SrcA& src_a, const SrcB& src_b, const Epi& epi, int k_begin,
                                        int k_end)
{
    constexpr int THREADS = 32 * WARPS_M * WARPS_N;
    constexpr int KT = SLICE_BYTES / P::BYTES;    // k per slice
    constexpr int WTM = BM / WARPS_M, WTN = BN / WARPS_N;
    constexpr int MT = WTM / 16, NT = WTN / 8;    // mma tiles per warp
    static_assert(MT >= 1 && NT % 2 == 0 && WTM % 16 == 0, "warp tile");
    constexpr int A_BYTES = BM * ROW_PITCH;
    constexpr int STAGE_BYTES = (BM + BN) * ROW_PITCH;
    __shared__ __align__(128) unsigned char smem[2 * STAGE_BYTES];

    const TileCoord tile = swizzled_tile<BM, BN>();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;

    typename StagerFor<P, SrcA, BM, THREADS>::type a;
    typename StagerFor<P, SrcB, BN, THREADS>::type b;
    a.begin(src_a, tile.m0, tid);
    b.begin(src_b, tile.n0, tid);

    float acc[MT][NT][4];
#pragma unroll
    for (int i = 0; i < MT; ++i)
#pragma unroll
        for (int j = 0; j < NT; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

    const int slices = k_end > k_begin ? (k_end - k_begin + KT - 1) / KT : 0;
    if (slices > 0) {
        a.fetch(src_a, k_begin, smem);
        b.fetch(src_b, k_begin, smem + A_BYTES);
        a.store(smem);
        b.store(smem + A_BYTES);
        cp_async_commit();
    }
    for (int t = 0; t < slices; ++t) {
        cp_async_wait<0>();
        __syncthreads();   // slice t visible to all; everyone is done with slice t - 1
        unsigned char* next = smem + ((t + 1) & 1) * STAGE_BYTES;
        const bool more = t + 1 < slices;
        if (more) {   // into the buffer slice t - 1 used
            a.fetch(src_a, k_begin + (t + 1) * KT, next);
            b.fetch(src_b, k_begin + (t + 1) * KT, next + A_BYTES);
        }
        cp_async_commit();

        const unsigned a_base = smem_address(smem + (t & 1) * STAGE_BYTES);
        const unsigned b_base = a_base + A_BYTES;
#pragma unroll
        for (int s = 0; s < SLICE_BYTES / 32; ++s) {
            unsigned af[MT][4], bf[NT][2];
#pragma unroll
            for (int i = 0; i < MT; ++i)
                ldmatrix_x4(af[i], a_base + (wm * WTM + i * 16 + (lane & 15)) * ROW_PITCH + s * 32 + (lane >> 4) * 16);
#pragma unroll
            for (int j = 0; j < NT / 2; ++j) {
                unsigned r[4];
                ldmatrix_x4(r, b_base + (wn * WTN + j * 16 + (lane & 7) + (lane >> 4) * 8) * ROW_PITCH + s * 32 +
                                   ((lane >> 3) & 1) * 16);
                bf[2 * j][0] = r[0];
                bf[2 * j][1] = r[1];
                bf[2 * j + 1][0] = r[2];
                bf[2 * j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < MT; ++i)
#pragma unroll
                for (int j = 0; j < NT; ++j) mma(P{}, acc[i][j], af[i], bf[j]);
        }
        if (more) {
            a.store(next);
            b.store(next + A_BYTES);
        }
    }

    // acc[i][j]: rows lane / 4 and + 8, columns 2 * (lane % 4) and + 1 of mma tile (i, j).
#pragma unroll
    for (int j = 0; j < NT; ++j) {
        const int n = tile.n0 + wn * WTN + j * 8 + (lane & 3) * 2;
        const long long c0 = epi.column(n), c1 = epi.column(n + 1);
#pragma unroll
        for (int i = 0; i < MT; ++i) {
            const int m = tile.m0 + wm * WTM + i * 16 + (lane >> 2);
            epi.store(m, c0, acc[i][j][0]);
            epi.store(m, c1, acc[i][j][1]);
            epi.store(m + 8, c0, acc[i][j][2]);
            epi.store(m + 8, c1, acc[i][j][3]);
        }
    }
}

// ---- entry points (instantiated per precision: gemm_tc_f16.cu, _bf16.cu, _tf32.cu) -------
// Convolution forward, one group: out = act(W (M x K, packed) @ col (K x N) + bias), N
// = images * out_h * out_w, written into (image, filter, position) order.
template <class P, int BM, int BN, int WARPS_M, int WARPS_N, class Out>
__device__ __forceinline__ void conv_forward_tile(const void* weights, int pitch, const float* im, long long im_stride,
                                                  int h, int w, int ksize, int stride_y, int stride_x, int pad,
                                                  int dilation, int out_h, int out_w, int filters, int k_total,
                                                  int n_total, const float* bias, int act, void* out,
                                                  long long out_image_stride)
{
    const PackedSource a{static_cast<const unsigned char*>(weights), filters, pitch};
    const ConvColumnSource b{{im, im_stride, h, w, ksize, stride_y, stride_x, pad, dilation, out_h, out_w, k_total,
                              n_total}};
    const ConvEpilogue<Out> epi{static_cast<typename Out::Storage*>(out), bias, filters, n_total, out_h * out_w, act,
                                out_image_stride};
    tc_tile<P, BM, BN, WARPS_M, WARPS_N>(a, b, epi, 0, k_total);
}

// The same over an image kept at P's own 16 bits (HalfStorage<P>'s: a 16-bit layer output,
// whose bits are the operand's, staged as they are), written as fp32 or (half_out) at
// those 16 bits: one entry a tile for both outputs.
template <class P, int BM, int BN, int WARPS_M, int WARPS_N>
__device__ __forceinline__ void conv_forward_tile_in16(const void* weights, int pitch, const unsigned short* im,
                                                       long long im_stride, int h, int w, int ksize, int stride_y,
                                                       int stride_x, int pad, int dilation, int out_h, int out_w,
                                                       int filters, int k_total, int n_total, const float* bias,
                                                       int act, void* out, long long out_image_stride, int half_out)
{
    const PackedSource a{static_cast<const unsigned char*>(weights), filters, pitch};
    const ConvColumnSourceOf<unsigned short> b{
        {im, im_stride, h, w, ksize, stride_y, stride_x, pad, dilation, out_h, out_w, k_total, n_total}};
    const ConvEpilogueEither<typename HalfStorage<P>::type> epi{out, bias, filters, n_total, out_h * out_w, act,
                                                                half_out, out_image_stride};
    tc_tile<P, BM, BN, WARPS_M, WARPS_N>(a, b, epi, 0, k_total);
}

#define TC_CONV_ENTRY(ENTRY, P, BM, BN, WARPS_M, WARPS_N, OUT)                                                  \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_M * WARPS_N, 512 / (32 * WARPS_M * WARPS_N)) ENTRY(                                 \
        const void* weights, int pitch, const float* im, long long im_stride, int h, int w, int ksize,          \
        int stride_y, int stride_x, int pad, int dilation, int out_h, int out_w, int filters, int k_total,     \
        int n_total, const float* bias, int act, void* out, long long out_image_stride)                        \
    {                                                                                                          \
        conv_forward_tile<P, BM, BN, WARPS_M, WARPS_N, OUT>(weights, pitch, im, im_stride, h, w, ksize, stride_y, \
                                                       stride_x, pad, dilation, out_h, out_w, filters, k_total, \
                                                       n_total, bias, act, out, out_image_stride);              \
    }

// C = alpha * op(A) @ op(B) + beta * C, fp32 in memory, operands rounded to P; as
// gemm.cu's sgemm (split-K over gridDim.z into C + z * partial_stride).
template <class P, int BM, int BN, int WARPS_M, int WARPS_N, bool TA, bool TB>
__device__ __forceinline__ void gemm_tile(int M, int N, int K, float alpha, const float* A, int lda, const float* B,
                                          int ldb, float beta, float* C, int ldc, int k_chunk,
                                          long long partial_stride)
{
    const int k_begin = blockIdx.z * k_chunk;
    const int k_end = min(K, k_begin + k_chunk);
    const GemmEpilogue epi{C + blockIdx.z * partial_stride, M, N, ldc, alpha, beta};
    using SrcA = typename pick_type<TA, RowMajorKSource, RowMajorRowSource>::type;
    using SrcB = typename pick_type<TB, RowMajorRowSource, RowMajorKSource>::type;
    const SrcA a{A, M, lda, k_end};
    const SrcB b{B, N, ldb, k_end};
    tc_tile<P, BM, BN, WARPS_M, WARPS_N>(a, b, epi, k_begin, k_end);
}

#define TC_GEMM_ENTRY(ENTRY, P, BM, BN, WARPS_M, WARPS_N, TA, TB)                                                 \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_M * WARPS_N, 512 / (32 * WARPS_M * WARPS_N)) ENTRY(                                 \
        int M, int N, int K, float alpha, const float* A, int lda, const float* B, int ldb, float beta, float* C, \
        int ldc, int k_chunk, long long partial_stride)                                                        \
    {                                                                                                          \
        gemm_tile<P, BM, BN, WARPS_M, WARPS_N, TA, TB>(M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, k_chunk,    \
                                                       partial_stride);                                        \
    }

// Tiles (BM x BN, warps): 128x128 (2x4 warps of 64x32) for wide products; 64x128 and
// 32x128 and 16x128 (warps of 32x32 / 16x32) for few filters; 64x64 (2x2) for few columns.
// (16x128 and 32x128 over 8 warps measured slower on every yolov3-tiny shape, fp16 b64.)
#define TC_TILES(X, PREC, P)                 \
    X(PREC, P, 128x128, 128, 128, 2, 4)      \
    X(PREC, P, 64x128, 64, 128, 2, 4)        \
    X(PREC, P, 32x128, 32, 128, 1, 4)        \
    X(PREC, P, 16x128, 16, 128, 1, 4)        \
    X(PREC, P, 64x64, 64, 64, 2, 2)

#define TC_CONV_IN16(NAME, P, BM, BN, WARPS_M, WARPS_N)                                                         \
    extern "C" __global__ void __launch_bounds__(32 * WARPS_M * WARPS_N, 512 / (32 * WARPS_M * WARPS_N)) NAME(   \
        const void* weights, int pitch, const unsigned short* im, long long im_stride, int h, int w, int ksize, \
        int stride_y, int stride_x, int pad, int dilation, int out_h, int out_w, int filters, int k_total,      \
        int n_total, const float* bias, int act, void* out, long long out_image_stride, int half_out)          \
    {                                                                                                           \
        conv_forward_tile_in16<P, BM, BN, WARPS_M, WARPS_N>(weights, pitch, im, im_stride, h, w, ksize,         \
                                                            stride_y, stride_x, pad, dilation, out_h, out_w,    \
                                                            filters, k_total, n_total, bias, act, out,          \
                                                            out_image_stride, half_out);                        \
    }

#define TC_CONV_X(PREC, P, TILE, BM, BN, WM, WN) TC_CONV_ENTRY(conv_tc_##PREC##_##TILE, P, BM, BN, WM, WN, XF32)
// The output at the precision's 16 bits (fp16 and bf16 only).
#define TC_CONV_HALF_X(PREC, P, TILE, BM, BN, WM, WN) \
    TC_CONV_ENTRY(conv_tc_##PREC##_##TILE##_h, P, BM, BN, WM, WN, HalfStorage<P>::type)
#define TC_GEMM_X(PREC, P, TILE, BM, BN, WM, WN)                               \
    TC_GEMM_ENTRY(gemm_tc_##PREC##_##TILE##_nn, P, BM, BN, WM, WN, false, false) \
    TC_GEMM_ENTRY(gemm_tc_##PREC##_##TILE##_nt, P, BM, BN, WM, WN, false, true)  \
    TC_GEMM_ENTRY(gemm_tc_##PREC##_##TILE##_tn, P, BM, BN, WM, WN, true, false)

// The image at the precision's 16 bits, the output fp32 or 16-bit (fp16 and bf16 only): one
// entry a tile of TC_TILES.
#define TC_CONV_IN16_ENTRIES(PREC, P)                                   \
    TC_CONV_IN16(conv_tc_##PREC##_128x128_in16, P, 128, 128, 2, 4)      \
    TC_CONV_IN16(conv_tc_##PREC##_64x128_in16, P, 64, 128, 2, 4)        \
    TC_CONV_IN16(conv_tc_##PREC##_32x128_in16, P, 32, 128, 1, 4)        \
    TC_CONV_IN16(conv_tc_##PREC##_16x128_in16, P, 16, 128, 1, 4)        \
    TC_CONV_IN16(conv_tc_##PREC##_64x64_in16, P, 64, 64, 2, 2)

// ---- weight packing ---------------------------------------------------------------------
// out (rows x pitch elements of P) = in (rows x k fp32), zero in columns k..pitch.
template <class P>
__device__ __forceinline__ void pack_rows(const float* in, int rows, int k, int pitch, unsigned char* out)
{
    constexpr int PER_WORD = 4 / P::BYTES;
    const long long words = (long long)rows * pitch / PER_WORD;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < words;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = i * PER_WORD;
        const int r = (int)(e / pitch), c = (int)(e - (long long)r * pitch);
        float v[PER_WORD];
#pragma unroll
        for (int j = 0; j < PER_WORD; ++j) v[j] = c + j < k ? in[(size_t)r * k + c + j] : 0.0f;
        unsigned w[1];
        to_words<P, PER_WORD>(v, w);
        reinterpret_cast<unsigned*>(out)[i] = w[0];
    }
}

// Every entry point of one precision: the convolution forward and the GEMMs of each tile,
// and the weight packing. One precision a file, so that each compiles in a third of the
// time (the three in parallel).
#define TC_PRECISION_ENTRIES(PREC, P)                                                              \
    TC_TILES(TC_CONV_X, PREC, P)                                                                   \
    TC_TILES(TC_GEMM_X, PREC, P)                                                                   \
    extern "C" __global__ void pack_weights_##PREC(const float* in, int rows, int k, int pitch,    \
                                                   void* out)                                      \
    {                                                                                              \
        pack_rows<P>(in, rows, k, pitch, static_cast<unsigned char*>(out));                        \
    }
