// A convolution's backward as implicit GEMMs: the operand loaders (the input patch and
// the output delta gathered in place, no im2col or col2im buffer) and the fp32 FFMA tile
// loop; conv_backward_entries.cuh puts them together with gemm_tc.cuh's tensor-core tile loop.
//
//   weight gradient  dW[f][kidx] += sum_n delta[f][n] * col[kidx][n]
//                    M = filters, N = channels * k * k, K = images * out positions;
//   data gradient    dX[c][n] (+)= sum_kidx Wt[c][kidx] * dcol[kidx][n]
//                    M = channels, N = images * in pixels, K = filters * k * k, with
//                    Wt[c][(f, ky, kx)] = W[f][c][ky][kx] and dcol[(f, ky, kx)][(b, y, x)] =
//                    delta[b][f][(y + pad - ky*d) / sy][(x + pad - kx*d) / sx] where both
//                    divide and land inside the output, else 0.
// An operand element is (row, k): row one of M (A) or N (B), k counted from the start of K.
#pragma once
#include "gemm_core.cuh"

// ---- quad loaders: operands contiguous (or nearly) along k --------------------------
// A thread loads runs of 4 consecutive k ("quads") for PER rows: consecutive threads take
// consecutive quads of one row, so a warp reads whole lines of a k-contiguous operand.
template <int ROWS, int THREADS, int KT>
struct QuadMap {
    static constexpr int QUADS_PER_ROW = KT / 4;
    static constexpr int QUADS = ROWS * QUADS_PER_ROW;
    static constexpr int PER = QUADS >= THREADS ? QUADS / THREADS : 1;
    static constexpr int ACTIVE = QUADS / PER;
    static constexpr int ROW_STEP = THREADS / QUADS_PER_ROW;
    static_assert(KT % 4 == 0 && THREADS % QUADS_PER_ROW == 0, "quads per row");
    static_assert(QUADS < THREADS || QUADS % THREADS == 0, "quads per thread");
};

// The output delta as the weight gradient's A: element (f, n) with n = (image, position),
// at delta[image * image_stride + f * positions + position].
struct DeltaRowsSource {
    const float* delta;
    long long image_stride;
    int rows, positions, k_end;
    struct Row {
        int offset;   // f * positions (within one image); -1: past the rows
    };
    struct Pos {
        int b, p;
    };
    __device__ __forceinline__ Row row(int r) const
    {
        Row s;
        s.offset = r < rows ? r * positions : -1;
        return s;
    }
    __device__ __forceinline__ Pos pos(int k) const
    {
        Pos q;
        q.b = k / positions;
        q.p = k - q.b * positions;
        return q;
    }
    __device__ __forceinline__ bool vectors() const
    {
        return (positions & 3) == 0 && (image_stride & 3) == 0 &&
               (reinterpret_cast<unsigned long long>(delta) & 15) == 0;
    }
    __device__ __forceinline__ void quad(const Row& s, Pos q, int k, bool vec, float (&v)[4]) const
    {
        if (s.offset >= 0 && vec && k + 3 < k_end) {   // positions % 4 == 0: one image, aligned
            const float4 x = *reinterpret_cast<const float4*>(delta + q.b * image_stride + s.offset + q.p);
            v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
            return;
        }
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            v[j] = (s.offset >= 0 && k + j < k_end) ? delta[q.b * image_stride + s.offset + q.p] : 0.0f;
            if (++q.p == positions) {
                q.p = 0;
                ++q.b;
            }
        }
    }
};

// The input's im2col matrix as the weight gradient's B, transposed: element (kidx, n),
// kidx = (c, ky, kx), n = (image, oy, ox): im[image][c][oy*sy - pad + ky*d][ox*sx - pad + kx*d],
// zero outside the image. T: the image's elements, float, or unsigned short holding the
// operands' own 16 bits (a 16-bit layer output, loaded and staged as they are).
template <class T>
struct ImageRowsSourceOf {
    using Value = T;
    ConvGeometryOf<T> g;   // k_total: rows (channels * k * k); n_total: K
    int k_end;
    struct Row {
        int offset;         // c * h * w (within one image); -1: past the rows
        int dy, dx;         // ky * d - pad, kx * d - pad
    };
    struct Pos {
        int b, oy, ox;
    };
    __device__ __forceinline__ Row row(int r) const
    {
        Row s;
        const int kk = g.ksize * g.ksize;
        const int c = r / kk, t = r - c * kk;
        const int ky = t / g.ksize, kx = t - ky * g.ksize;
        s.offset = r < g.k_total ? c * g.h * g.w : -1;
        s.dy = ky * g.dilation - g.pad;
        s.dx = kx * g.dilation - g.pad;
        return s;
    }
    __device__ __forceinline__ Pos pos(int k) const
    {
        Pos q;
        const int positions = g.out_h * g.out_w;
        q.b = k / positions;
        const int p = k - q.b * positions;
        q.oy = p / g.out_w;
        q.ox = p - q.oy * g.out_w;
        return q;
    }
    __device__ __forceinline__ bool vectors() const { return false; }
    __device__ __forceinline__ void quad(const Row& s, Pos q, int k, bool, T (&v)[4]) const
    {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int iy = q.oy * g.stride_y + s.dy, ix = q.ox * g.stride_x + s.dx;
            const bool ok = s.offset >= 0 && k + j < k_end && iy >= 0 && iy < g.h && ix >= 0 && ix < g.w;
            v[j] = ok ? g.im[q.b * g.im_stride + (s.offset + iy * g.w + ix)] : T(0);
            if (++q.ox == g.out_w) {
                q.ox = 0;
                if (++q.oy == g.out_h) {
                    q.oy = 0;
                    ++q.b;
                }
            }
        }
    }
};
using ImageRowsSource = ImageRowsSourceOf<float>;

// What a quad source's values are held as: fp32, or (ImageRowsSourceOf<unsigned short>)
// 16-bit operand bits.
template <class Src> struct QuadValue { using type = float; };
template <class T> struct QuadValue<ImageRowsSourceOf<T>> { using type = T; };

// fp32 rows of `pitch` floats (a multiple of 4, zero past the data): the data gradient's
// transposed weights in the FFMA kernels.
struct PackedRowsSource {
    const float* base;
    int rows, pitch;
    struct Row {
        const float* p;   // null: past the rows
    };
    struct Pos {
        int k;
    };
    __device__ __forceinline__ Row row(int r) const
    {
        Row s;
        s.p = r < rows ? base + (long long)r * pitch : nullptr;
        return s;
    }
    __device__ __forceinline__ Pos pos(int k) const { return Pos{k}; }
    __device__ __forceinline__ bool vectors() const { return true; }
    __device__ __forceinline__ void quad(const Row& s, Pos, int k, bool, float (&v)[4]) const
    {
        if (s.p != nullptr && k < pitch) {
            const float4 x = *reinterpret_cast<const float4*>(s.p + k);
            v[0] = x.x; v[1] = x.y; v[2] = x.z; v[3] = x.w;
        } else {
            v[0] = v[1] = v[2] = v[3] = 0.0f;
        }
    }
};

// A thread's quads of one operand: PER rows (ROW_STEP apart), one quad of k each.
template <class Src, int ROWS, int THREADS, int KT>
struct QuadLoader {
    using Map = QuadMap<ROWS, THREADS, KT>;
    using Value = typename QuadValue<Src>::type;
    Value v[Map::PER][4];
    typename Src::Row rows[Map::PER];
    int first_row, quad;
    bool active, vec;

    __device__ __forceinline__ void begin(const Src& src, int row0, int tid)
    {
        first_row = tid / Map::QUADS_PER_ROW;
        quad = tid % Map::QUADS_PER_ROW;
        active = tid < Map::ACTIVE;
        vec = src.vectors();
#pragma unroll
        for (int i = 0; i < Map::PER; ++i) rows[i] = src.row(row0 + first_row + i * Map::ROW_STEP);
    }

    __device__ __forceinline__ void load(const Src& src, int k0)
    {
        if (!active) return;
        const int k = k0 + quad * 4;
        const typename Src::Pos q = src.pos(k);   // the same k for all of the thread's rows
#pragma unroll
        for (int i = 0; i < Map::PER; ++i) src.quad(rows[i], q, k, vec, v[i]);
    }

    // fp32 tile stored [k][row] (FFMA kernels), rows `ld` floats apart.
    __device__ __forceinline__ void store_kmajor(float* tile, int ld) const
    {
        if (!active) return;
#pragma unroll
        for (int i = 0; i < Map::PER; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) tile[(quad * 4 + j) * ld + first_row + i * Map::ROW_STEP] = v[i][j];
    }
};

// ---- the data gradient's delta gather: one input pixel (a column of dcol) a thread ----
// Unit strides: the stride-1 forward gather of gemm_core.cuh over the delta with the taps
// flipped (pad -> -pad, dilation -> -dilation: tap (ky, kx) reads delta at y + pad - ky*d).
struct DgradGeometry {
    using Cursor = ColumnCursor;
    ConvGeometry flipped;     // "image": the delta; "output": the input plane
};

__device__ __forceinline__ ColumnCursor dgrad_cursor(const DgradGeometry& g, int n)
{
    return column_cursor(g.flipped, n);
}

template <int RUN>
__device__ __forceinline__ void gather_dgrad(const DgradGeometry& g, const ColumnCursor& col, int k0, float (&v)[RUN])
{
    gather_column<RUN>(g.flipped, col, k0, v);
}

// One parity class of a strided data gradient (conv_backward_entries.cuh launches one per class):
// the input pixels (py + sy*y', px + sx*x') see only the taps (ky0 + i*step_y, kx0 +
// j*step_x), i < ny, j < nx, for which y + pad - ky*d divides by the stride, and tap (i, j)
// reads the delta at (y' + cy0 - i*dy, x' + cx0 - j*dx): a dense stride-1 gather over a
// rectangular kernel, no zero taps and no division.
struct ClassCursor {
    const float* image;       // this column's delta image; null past the end
    int oy0, ox0;             // y' + cy0, x' + cx0
};

struct DgradClassGeometry {
    using Cursor = ClassCursor;
    const float* delta;       // first image, this group's first filter
    long long image_stride;   // floats between the delta's images
    int out_h, out_w;         // the delta's plane
    int hc, wc;               // the class's columns: y' < hc, x' < wc
    int ny, nx, cy0, cx0, dy, dx;
    int k_total;              // filters of the group * ny * nx
    int n_total;              // images * hc * wc
};

__device__ __forceinline__ ClassCursor dgrad_cursor(const DgradClassGeometry& g, int n)
{
    ClassCursor c;
    c.image = nullptr;
    c.oy0 = c.ox0 = 0;
    if (n >= g.n_total) return c;
    const int plane = g.hc * g.wc;
    const int b = n / plane;
    const int p = n - b * plane;
    const int y = p / g.wc;
    c.image = g.delta + b * g.image_stride;
    c.oy0 = y + g.cy0;
    c.ox0 = p - y * g.wc + g.cx0;
    return c;
}

template <int RUN>
__device__ __forceinline__ void gather_dgrad(const DgradClassGeometry& g, const ClassCursor& col, int k0,
                                             float (&v)[RUN])
{
    const int taps = g.ny * g.nx;
    const int ch = taps > 0 ? k0 / taps : 0;
    const int r = k0 - ch * taps;
    int i = g.nx > 0 ? r / g.nx : 0;
    int j = r - i * g.nx;
    const long long plane = (long long)g.out_h * g.out_w;
    const float* chan = (col.image != nullptr ? col.image : g.delta) + ch * plane;
#pragma unroll
    for (int e = 0; e < RUN; ++e) {
        const int oy = col.oy0 - i * g.dy, ox = col.ox0 - j * g.dx;
        const bool ok = col.image != nullptr && k0 + e < g.k_total && (unsigned)oy < (unsigned)g.out_h &&
                        (unsigned)ox < (unsigned)g.out_w;
        v[e] = ok ? chan[oy * g.out_w + ox] : 0.0f;
        if (++j == g.nx) {
            j = 0;
            if (++i == g.ny) {
                i = 0;
                chan += plane;
            }
        }
    }
}

// A thread's run of consecutive k for one column (row of B): consecutive threads take
// consecutive columns, i.e. neighbouring pixels of the delta. G: DgradGeometry or
// DgradClassGeometry.
template <class G, int ROWS, int THREADS, int BK>
struct DgradLoader {
    static constexpr int RUN = ROWS * BK / THREADS;
    static_assert(THREADS % ROWS == 0 && RUN * (THREADS / ROWS) == BK, "runs per column");
    float v[RUN];
    typename G::Cursor cursor;
    int row_local, k_off;
    bool active;

    __device__ __forceinline__ void begin(const G& g, int row0, int tid)
    {
        row_local = tid % ROWS;
        k_off = (tid / ROWS) * RUN;
        active = true;
        cursor = dgrad_cursor(g, row0 + row_local);
    }

    __device__ __forceinline__ void load(const G& g, int k0)
    {
        if (active) gather_dgrad<RUN>(g, cursor, k0 + k_off, v);
    }

    __device__ __forceinline__ void store_kmajor(float* tile, int ld) const
    {
        if (!active) return;
#pragma unroll
        for (int j = 0; j < RUN; ++j) tile[(k_off + j) * ld + row_local] = v[j];
    }
};

// ---- epilogues --------------------------------------------------------------------------
// The data gradient: dx[image * image_stride + c * plane + pixel] = acc, or += acc
// (accumulate), n = image * plane + pixel.
struct DgradEpilogue {
    float* dx;
    int rows, cols, plane, accumulate;
    long long image_stride;
    __device__ __forceinline__ long long column(int n) const
    {
        return image_column(n, cols, plane, image_stride);
    }
    __device__ __forceinline__ void store(int m, long long col, float acc) const
    {
        if (m >= rows || col < 0) return;
        float* p = dx + (long long)m * plane + col;
        *p = accumulate ? *p + acc : acc;
    }
};

// A parity class's data gradient: column n = (image, y', x') is pixel (py + sy*y', px + sx*x').
struct DgradClassEpilogue {
    float* dx;
    int rows, cols, hc, wc, w, py, px, sy, sx, plane, accumulate;
    long long image_stride;
    __device__ __forceinline__ long long column(int n) const
    {
        if (n >= cols) return -1;
        const int b = n / (hc * wc);
        const int p = n - b * hc * wc;
        const int y = p / wc;
        return b * image_stride + (long long)(py + sy * y) * w + px + sx * (p - y * wc);
    }
    __device__ __forceinline__ void store(int m, long long col, float acc) const
    {
        if (m >= rows || col < 0) return;
        float* p = dx + (long long)m * plane + col;
        *p = accumulate ? *p + acc : acc;
    }
};

// ---- fp32 FFMA tile loop ----------------------------------------------------------------
// A BM x BN tile of C over k in [k_begin, k_end): slices of BK staged in shared memory
// k-major (two stages; the next slice's loads in registers during this slice's products),
// TM x TN outputs a thread (its rows as TM/4 runs of 4, BM/(TM/4) apart, read as float4).
// The loaders: load(src, k0) into registers, store_kmajor(tile, ld) into shared memory.
template <int BM, int BN, int BK, int TM, int TN, class SrcA, class LoadA, class SrcB, class LoadB, class Epi>
__device__ __forceinline__ void ffma_tile(const SrcA& src_a, const SrcB& src_b, const Epi& epi, int k_begin,
                                          int k_end)
{
    constexpr int TX = BN / TN;
    constexpr int A_RUN = BM / (TM / 4), B_RUN = BN / (TN / 4);
    constexpr int LDA = BM + 4, LDB = BN + 4;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "fragments are float4");
    __shared__ __align__(16) float As[2][BK * LDA];
    __shared__ __align__(16) float Bs[2][BK * LDB];

    const TileCoord tile = swizzled_tile<BM, BN>();
    const int tid = threadIdx.x, tx = tid % TX, ty = tid / TX;
    LoadA a;
    LoadB b;
    a.begin(src_a, tile.m0, tid);
    b.begin(src_b, tile.n0, tid);

    float acc[TM][TN];
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.0f;

    const int slices = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
    if (slices > 0) {
        a.load(src_a, k_begin);
        b.load(src_b, k_begin);
        a.store_kmajor(As[0], LDA);
        b.store_kmajor(Bs[0], LDB);
    }
    for (int t = 0; t < slices; ++t) {
        __syncthreads();   // slice t stored; everyone is done with slice t - 1
        const bool more = t + 1 < slices;
        if (more) {
            a.load(src_a, k_begin + (t + 1) * BK);
            b.load(src_b, k_begin + (t + 1) * BK);
        }
        const float* as = As[t & 1];
        const float* bs = Bs[t & 1];
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float av[TM], bv[TN];
#pragma unroll
            for (int r = 0; r < TM / 4; ++r) {
                const float4 x = *reinterpret_cast<const float4*>(as + kk * LDA + r * A_RUN + ty * 4);
                av[4 * r] = x.x; av[4 * r + 1] = x.y; av[4 * r + 2] = x.z; av[4 * r + 3] = x.w;
            }
#pragma unroll
            for (int r = 0; r < TN / 4; ++r) {
                const float4 x = *reinterpret_cast<const float4*>(bs + kk * LDB + r * B_RUN + tx * 4);
                bv[4 * r] = x.x; bv[4 * r + 1] = x.y; bv[4 * r + 2] = x.z; bv[4 * r + 3] = x.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
        }
        if (more) {
            a.store_kmajor(As[(t + 1) & 1], LDA);
            b.store_kmajor(Bs[(t + 1) & 1], LDB);
        }
    }

#pragma unroll
    for (int j = 0; j < TN; ++j) {
        const long long col = epi.column(tile.n0 + (j / 4) * B_RUN + tx * 4 + j % 4);
#pragma unroll
        for (int i = 0; i < TM; ++i) epi.store(tile.m0 + (i / 4) * A_RUN + ty * 4 + i % 4, col, acc[i][j]);
    }
}
