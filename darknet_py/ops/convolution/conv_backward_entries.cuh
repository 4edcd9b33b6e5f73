// A convolution's backward without im2col or col2im buffers: the weight gradient and
// the data gradient as implicit GEMMs (conv_backward.cuh says which products), on the
// tensor cores (gemm_tc.cuh's tile loop: fp16 / bf16 / tf32 operands, fp32 sums) and in
// fp32 FFMA.
//
// Weight gradient: K (images * output positions) is huge and M x N (filters x weights)
// often small, so K is split over gridDim.z into chunks of k_chunk; each split writes its
// raw partial into C + z * partial_stride and gemm.cu's splitk_reduce adds the partials
// in a fixed order (deterministic, no atomics). One split adds straight into C (beta 1).
// Data gradient: written (accumulate 0) or added (1) into dx; unit strides in one launch
// (the forward's gather over the delta, taps flipped), other strides in one launch per
// parity class of the input pixels over only the taps that reach the delta from it.
//
// The entry points are instantiated one precision a file: conv_backward_f16.cu, _bf16.cu,
// _tf32.cu (tensor cores) and conv_backward_f32.cu (FFMA).
#pragma once
#include "gemm_tc.cuh"
#include "conv_backward.cuh"

// ---- tensor-core stagers for the backward's operands -------------------------------------
// Quads of a k-contiguous operand (the delta, the transposed im2col), stored as gemm_tc.cuh's
// [row][k] tiles.
template <class P, class Src, int ROWS, int THREADS>
struct TcQuadStager {
    using Loader = QuadLoader<Src, ROWS, THREADS, SLICE_BYTES / P::BYTES>;
    Loader ld;
    __device__ __forceinline__ void begin(const Src& src, int row0, int tid) { ld.begin(src, row0, tid); }
    __device__ __forceinline__ void fetch(const Src& src, int k0, unsigned char*) { ld.load(src, k0); }
    __device__ __forceinline__ void store(unsigned char* tile) const
    {
        if (!ld.active) return;
#pragma unroll
        for (int i = 0; i < Loader::Map::PER; ++i) {
            unsigned char* dst = tile + (ld.first_row + i * Loader::Map::ROW_STEP) * ROW_PITCH + ld.quad * 4 * P::BYTES;
            unsigned w[P::BYTES];
            if constexpr (sizeof(typename Loader::Value) == 2) {   // 16-bit operand bits, as they are
                static_assert(P::BYTES == 2, "16-bit values only for 16-bit operands");
                raw_words<4>(ld.v[i], w);
            } else {
                to_words<P, 4>(ld.v[i], w);
            }
            if constexpr (P::BYTES == 4)
                *reinterpret_cast<uint4*>(dst) = make_uint4(w[0], w[1], w[2], w[3]);
            else
                *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
        }
    }
};

// The data gradient's delta gather, a column per thread: gemm_tc.cuh's Stager with the
// dgrad gather (G: DgradGeometry or DgradClassGeometry) in place of the forward's.
template <class P, class G, int ROWS, int THREADS>
struct TcDgradStager : Stager<P, RowMajorKSource, ROWS, THREADS> {
    using Base = Stager<P, RowMajorKSource, ROWS, THREADS>;
    typename G::Cursor cursor;
    __device__ __forceinline__ void begin(const G& g, int row0, int tid)
    {
        this->row_local = Base::Map::row(tid);
        this->row = row0 + this->row_local;
        this->k_off = Base::Map::k_offset(tid);
        this->active = tid < Base::Map::ACTIVE;
        cursor = dgrad_cursor(g, this->row);
    }
    __device__ __forceinline__ void fetch(const G& g, int k0, unsigned char*)
    {
        if (this->active) gather_dgrad<Base::RUN>(g, cursor, k0 + this->k_off, this->v);
    }
};

template <class P, int ROWS, int THREADS>
struct StagerFor<P, DeltaRowsSource, ROWS, THREADS> {
    using type = TcQuadStager<P, DeltaRowsSource, ROWS, THREADS>;
};
template <class P, class T, int ROWS, int THREADS>
struct StagerFor<P, ImageRowsSourceOf<T>, ROWS, THREADS> {
    using type = TcQuadStager<P, ImageRowsSourceOf<T>, ROWS, THREADS>;
};
template <class P, int ROWS, int THREADS>
struct StagerFor<P, DgradGeometry, ROWS, THREADS> {
    using type = TcDgradStager<P, DgradGeometry, ROWS, THREADS>;
};
template <class P, int ROWS, int THREADS>
struct StagerFor<P, DgradClassGeometry, ROWS, THREADS> {
    using type = TcDgradStager<P, DgradClassGeometry, ROWS, THREADS>;
};

// ---- operands and epilogues from the kernels' arguments ------------------------------------
template <class T>
struct WgradOperandsOf {
    DeltaRowsSource a;
    ImageRowsSourceOf<T> b;
    GemmEpilogue epi;
    int k_begin, k_end;
};
using WgradOperands = WgradOperandsOf<float>;

// Split blockIdx.z's share of K; C + z * partial_stride, ld = ldc, C = acc + beta * C. T:
// the image's elements (ImageRowsSourceOf).
template <class T>
__device__ __forceinline__ WgradOperandsOf<T> wgrad_operands(const float* delta, long long delta_stride, const T* im,
                                                        long long im_stride, int h, int w, int ksize, int stride_y,
                                                        int stride_x, int pad, int dilation, int out_h, int out_w,
                                                        int filters, int k_total, int n_total, int k_chunk, float* c,
                                                        int ldc, float beta, long long partial_stride)
{
    WgradOperandsOf<T> o;
    o.k_begin = blockIdx.z * k_chunk;
    o.k_end = min(n_total, o.k_begin + k_chunk);
    o.a = DeltaRowsSource{delta, delta_stride, filters, out_h * out_w, o.k_end};
    o.b = ImageRowsSourceOf<T>{{im, im_stride, h, w, ksize, stride_y, stride_x, pad, dilation, out_h, out_w, k_total, n_total},
                          o.k_end};
    o.epi = GemmEpilogue{c + blockIdx.z * partial_stride, filters, k_total, ldc, 1.0f, beta};
    return o;
}

// Unit strides: the flipped forward view, "image" = the delta, "output" = the input plane.
__device__ __forceinline__ DgradGeometry dgrad_geometry(const float* delta, long long delta_stride, int out_h,
                                                        int out_w, int ksize, int pad, int dilation, int h, int w,
                                                        int k_total, int n_total)
{
    return DgradGeometry{{delta, delta_stride, out_h, out_w, ksize, 1, 1, -pad, -dilation, h, w, k_total, n_total}};
}

#define WGRAD_ARGS                                                                                                \
    delta, delta_stride, im, im_stride, h, w, ksize, stride_y, stride_x, pad, dilation, out_h, out_w, filters,   \
        k_total, n_total, k_chunk, c, ldc, beta, partial_stride
#define DGRAD_GEOMETRY dgrad_geometry(delta, delta_stride, out_h, out_w, ksize, pad, dilation, h, w, k_total, n_total)
#define CLASS_GEOMETRY                                                                                            \
    DgradClassGeometry{delta, delta_stride, out_h, out_w, hc, wc, ny, nx, cy0, cx0, tap_dy, tap_dx, k_total,     \
                       n_total}
#define CLASS_EPILOGUE                                                                                            \
    DgradClassEpilogue{dx, channels, n_total, hc, wc, w, py, px, sy, sx, h * w, accumulate, dx_stride}

// ---- entry points --------------------------------------------------------------------------
// Tensor cores. Weight gradient tiles: BM follows the filters, 32x64 for a first layer's
// few weights; data gradient tiles: BM follows the channels. CONV_BACKWARD_TC_ENTRIES below
// names every tile of one precision.
#define CONV_WGRAD_TC(NAME, P, BM, BN, WM, WN)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 512 / (32 * WM * WN)) NAME(                      \
        const float* delta, long long delta_stride, const float* im, long long im_stride, int h, int w,         \
        int ksize, int stride_y, int stride_x, int pad, int dilation, int out_h, int out_w, int filters,        \
        int k_total, int n_total, int k_chunk, float* c, int ldc, float beta, long long partial_stride)         \
    {                                                                                                           \
        const WgradOperands o = wgrad_operands(WGRAD_ARGS);                                                     \
        tc_tile<P, BM, BN, WM, WN>(o.a, o.b, o.epi, o.k_begin, o.k_end);                                        \
    }

// The same over an image kept at P's own 16 bits (a 16-bit layer output, staged as it is).
#define CONV_WGRAD_IN16_TC(NAME, P, BM, BN, WM, WN)                                                             \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 512 / (32 * WM * WN)) NAME(                      \
        const float* delta, long long delta_stride, const unsigned short* im, long long im_stride, int h,       \
        int w, int ksize, int stride_y, int stride_x, int pad, int dilation, int out_h, int out_w, int filters, \
        int k_total, int n_total, int k_chunk, float* c, int ldc, float beta, long long partial_stride)         \
    {                                                                                                           \
        const WgradOperandsOf<unsigned short> o = wgrad_operands(WGRAD_ARGS);                                   \
        tc_tile<P, BM, BN, WM, WN>(o.a, o.b, o.epi, o.k_begin, o.k_end);                                        \
    }

#define CONV_DGRAD_TC(NAME, P, BM, BN, WM, WN)                                                                  \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 512 / (32 * WM * WN)) NAME(                      \
        const void* weights_t, int pitch, const float* delta, long long delta_stride, int out_h, int out_w,     \
        int ksize, int pad, int dilation, int h, int w, int channels, int k_total, int n_total, float* dx,      \
        long long dx_stride, int accumulate)                                                                    \
    {                                                                                                           \
        const PackedSource a{static_cast<const unsigned char*>(weights_t), channels, pitch};                    \
        const DgradEpilogue epi{dx, channels, n_total, h * w, accumulate, dx_stride};                          \
        tc_tile<P, BM, BN, WM, WN>(a, DGRAD_GEOMETRY, epi, 0, k_total);                                         \
    }

// A strided data gradient, one parity class (py, px) a launch (DgradClassGeometry).
#define CONV_DGRAD_CLASS_TC(NAME, P, BM, BN, WM, WN)                                                            \
    extern "C" __global__ void __launch_bounds__(32 * WM * WN, 512 / (32 * WM * WN)) NAME(                      \
        const void* weights_t, int pitch, const float* delta, long long delta_stride, int out_h, int out_w,     \
        int hc, int wc, int ny, int nx, int cy0, int cx0, int tap_dy, int tap_dx, int channels, int k_total,    \
        int n_total, float* dx, long long dx_stride, int h, int w, int py, int px, int sy, int sx,              \
        int accumulate)                                                                                         \
    {                                                                                                           \
        const PackedSource a{static_cast<const unsigned char*>(weights_t), channels, pitch};                    \
        tc_tile<P, BM, BN, WM, WN>(a, CLASS_GEOMETRY, CLASS_EPILOGUE, 0, k_total);                              \
    }



// fp32 FFMA (BM x BN x BK, TM x TN outputs a thread, least blocks per SM).
#define CONV_WGRAD_F32(NAME, BM, BN, BK, TM, TN, MINB)                                                          \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MINB) NAME(                             \
        const float* delta, long long delta_stride, const float* im, long long im_stride, int h, int w,         \
        int ksize, int stride_y, int stride_x, int pad, int dilation, int out_h, int out_w, int filters,        \
        int k_total, int n_total, int k_chunk, float* c, int ldc, float beta, long long partial_stride)         \
    {                                                                                                           \
        constexpr int T = (BM / TM) * (BN / TN);                                                                \
        const WgradOperands o = wgrad_operands(WGRAD_ARGS);                                                     \
        ffma_tile<BM, BN, BK, TM, TN, DeltaRowsSource, QuadLoader<DeltaRowsSource, BM, T, BK>, ImageRowsSource, \
                  QuadLoader<ImageRowsSource, BN, T, BK>>(o.a, o.b, o.epi, o.k_begin, o.k_end);                 \
    }

#define CONV_DGRAD_F32(NAME, BM, BN, BK, TM, TN, MINB)                                                          \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MINB) NAME(                             \
        const void* weights_t, int pitch, const float* delta, long long delta_stride, int out_h, int out_w,     \
        int ksize, int pad, int dilation, int h, int w, int channels, int k_total, int n_total, float* dx,      \
        long long dx_stride, int accumulate)                                                                    \
    {                                                                                                           \
        constexpr int T = (BM / TM) * (BN / TN);                                                                \
        const PackedRowsSource a{static_cast<const float*>(weights_t), channels, pitch};                        \
        const DgradEpilogue epi{dx, channels, n_total, h * w, accumulate, dx_stride};                          \
        ffma_tile<BM, BN, BK, TM, TN, PackedRowsSource, QuadLoader<PackedRowsSource, BM, T, BK>, DgradGeometry, \
                  DgradLoader<DgradGeometry, BN, T, BK>>(a, DGRAD_GEOMETRY, epi, 0, k_total);                   \
    }

#define CONV_DGRAD_CLASS_F32(NAME, BM, BN, BK, TM, TN, MINB)                                                    \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MINB) NAME(                             \
        const void* weights_t, int pitch, const float* delta, long long delta_stride, int out_h, int out_w,     \
        int hc, int wc, int ny, int nx, int cy0, int cx0, int tap_dy, int tap_dx, int channels, int k_total,    \
        int n_total, float* dx, long long dx_stride, int h, int w, int py, int px, int sy, int sx,              \
        int accumulate)                                                                                         \
    {                                                                                                           \
        constexpr int T = (BM / TM) * (BN / TN);                                                                \
        const PackedRowsSource a{static_cast<const float*>(weights_t), channels, pitch};                        \
        ffma_tile<BM, BN, BK, TM, TN, PackedRowsSource, QuadLoader<PackedRowsSource, BM, T, BK>,                \
                  DgradClassGeometry, DgradLoader<DgradClassGeometry, BN, T, BK>>(a, CLASS_GEOMETRY,            \
                                                                                  CLASS_EPILOGUE, 0, k_total);  \
    }


// ---- the data gradient's weights, transposed -------------------------------------------------
// out[c][f * ny * nx + i * nx + j] = in[((f * channels + c) * ksize + ky0 + i * step_y) * ksize
// + kx0 + j * step_x] (one group's filters x channels x ksize x ksize weights; the taps of
// one parity class, or all of them), rows of `pitch` elements, zero past filters * ny * nx;
// converted to P (RAW: fp32 as is).
template <class P, bool RAW>
__device__ __forceinline__ void pack_transposed(const float* in, int filters, int channels, int ksize, int ky0,
                                                int step_y, int ny, int kx0, int step_x, int nx, int pitch,
                                                unsigned* out)
{
    constexpr int PER_WORD = RAW ? 1 : 4 / P::BYTES;
    const int taps = ny * nx;
    const int k = filters * taps;
    const long long words = (long long)channels * pitch / PER_WORD;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < words;
         i += (long long)gridDim.x * blockDim.x) {
        const long long e = i * PER_WORD;
        const int r = (int)(e / pitch), col = (int)(e - (long long)r * pitch);
        float v[PER_WORD];
#pragma unroll
        for (int j = 0; j < PER_WORD; ++j) {
            const int kc = col + j;
            float x = 0.0f;
            if (kc < k) {
                const int f = kc / taps, t = kc - f * taps;
                const int ty = t / nx, tx = t - ty * nx;
                x = in[(((long long)f * channels + r) * ksize + ky0 + ty * step_y) * ksize + kx0 + tx * step_x];
            }
            v[j] = x;
        }
        if constexpr (RAW) {
            out[i] = __float_as_uint(v[0]);
        } else {
            unsigned wd[1];
            to_words<P, PER_WORD>(v, wd);
            out[i] = wd[0];
        }
    }
}

#define PACK_TRANSPOSED(NAME, P, RAW)                                                                         \
    extern "C" __global__ void NAME(const float* in, int filters, int channels, int ksize, int ky0, int step_y, \
                                    int ny, int kx0, int step_x, int nx, int pitch, void* out)                \
    {                                                                                                         \
        pack_transposed<P, RAW>(in, filters, channels, ksize, ky0, step_y, ny, kx0, step_x, nx, pitch,       \
                                static_cast<unsigned*>(out));                                                 \
    }

// Every tensor-core entry point of one precision (PREC f16, bf16 or tf32; P its type).
#define CONV_BACKWARD_TC_ENTRIES(PREC, P)                                         \
    CONV_WGRAD_TC(conv_wgrad_##PREC##_128x128, P, 128, 128, 2, 4)                 \
    CONV_WGRAD_TC(conv_wgrad_##PREC##_64x128, P, 64, 128, 2, 4)                   \
    CONV_WGRAD_TC(conv_wgrad_##PREC##_32x128, P, 32, 128, 1, 4)                   \
    CONV_WGRAD_TC(conv_wgrad_##PREC##_64x64, P, 64, 64, 2, 2)                     \
    CONV_WGRAD_TC(conv_wgrad_##PREC##_32x64, P, 32, 64, 1, 2)                     \
    CONV_DGRAD_TC(conv_dgrad_##PREC##_128x128, P, 128, 128, 2, 4)                 \
    CONV_DGRAD_TC(conv_dgrad_##PREC##_64x128, P, 64, 128, 2, 4)                   \
    CONV_DGRAD_TC(conv_dgrad_##PREC##_32x128, P, 32, 128, 1, 4)                   \
    CONV_DGRAD_CLASS_TC(conv_dgrad_class_##PREC##_128x128, P, 128, 128, 2, 4)     \
    CONV_DGRAD_CLASS_TC(conv_dgrad_class_##PREC##_64x128, P, 64, 128, 2, 4)       \
    CONV_DGRAD_CLASS_TC(conv_dgrad_class_##PREC##_32x128, P, 32, 128, 1, 4)       \
    PACK_TRANSPOSED(pack_transposed_##PREC, P, false)

// The weight gradient's tiles over an image at the 16-bit precision's own bits (f16, bf16).
#define CONV_WGRAD_IN16_ENTRIES(PREC, P)                                          \
    CONV_WGRAD_IN16_TC(conv_wgrad_##PREC##_128x128_in16, P, 128, 128, 2, 4)       \
    CONV_WGRAD_IN16_TC(conv_wgrad_##PREC##_64x128_in16, P, 64, 128, 2, 4)         \
    CONV_WGRAD_IN16_TC(conv_wgrad_##PREC##_32x128_in16, P, 32, 128, 1, 4)         \
    CONV_WGRAD_IN16_TC(conv_wgrad_##PREC##_64x64_in16, P, 64, 64, 2, 2)           \
    CONV_WGRAD_IN16_TC(conv_wgrad_##PREC##_32x64_in16, P, 32, 64, 1, 2)
