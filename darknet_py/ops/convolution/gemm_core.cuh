// The GEMM core shared by the fp32 FFMA kernels (gemm.cu) and the tensor-core kernels
// (gemm_tc.cuh): cp.async staging, the block-order swizzle, and the implicit-GEMM gather
// of a convolution's input (the im2col matrix read in place, never written out).
//
// The CUDA backend inlines this file into each .cu that includes it before compiling,
// so the kernel cache's key (the source text) changes with it.
#pragma once

// ---- cp.async: global -> shared without passing through registers -------------------
__device__ __forceinline__ unsigned smem_address(const void* smem)
{
    return (unsigned)__cvta_generic_to_shared(smem);
}

__device__ __forceinline__ void cp_async_f32(float* smem, const float* gmem, bool valid)
{
    // src-size 0 reads nothing and writes a zero.
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
                 "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(smem)), "l"(gmem),
                 "r"(valid ? 16 : 0));
}

__device__ __forceinline__ void cp_async_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

template <int PENDING>
__device__ __forceinline__ void cp_async_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING));
}

// ---- block order --------------------------------------------------------------------
// Row groups for the block-order swizzle: consecutive blocks cover GROUP_M tile rows
// before moving right, so the A and B panels they share stay in L2.
constexpr int GROUP_M = 8;

struct TileCoord {
    int m0, n0;
};

// The (m, n) origin of this block's BM x BN tile of C; the grid is (tiles along n,
// tiles along m).
template <int BM, int BN>
__device__ __forceinline__ TileCoord swizzled_tile()
{
    const int tiles_m = gridDim.y, tiles_n = gridDim.x;
    const int pid = blockIdx.y * tiles_n + blockIdx.x;
    const int group = pid / (GROUP_M * tiles_n);
    const int first_m = group * GROUP_M;
    const int group_rows = min(tiles_m - first_m, GROUP_M);
    const int in_group = pid - group * GROUP_M * tiles_n;
    TileCoord t;
    t.m0 = (first_m + in_group % group_rows) * BM;
    t.n0 = (in_group / group_rows) * BN;
    return t;
}

// ---- implicit GEMM: a convolution's im2col matrix, read in place -------------------
// col[k][n], k = (c, ky, kx) over one group's channels, n = (image, oy, ox) over the
// batch: im[image * im_stride + c * h * w + iy * w + ix] with iy = oy * stride_y - pad +
// ky * dilation (ix alike), zero outside the image. A thread reads a run of consecutive
// k for one n: the (c, ky, kx) split is done once per run and then stepped.
// T: the image's elements, float or unsigned short (a 16-bit layer output: fp16 or bf16
// bits, which the gather hands on as they are, the operand's own bits; zero is 0 in both).
template <class T>
struct ConvGeometryOf {
    const T* im;              // first image, this group's first channel
    long long im_stride;      // elements between images
    int h, w, ksize, stride_y, stride_x, pad, dilation, out_h, out_w;
    int k_total;              // channels of the group * ksize * ksize
    int n_total;              // images * out_h * out_w
};
using ConvGeometry = ConvGeometryOf<float>;

template <class T>
struct ColumnCursorOf {
    const T* image;           // this column's image; null when n is past the end
    int iy0, ix0;             // the input position of (ky, kx) = (0, 0)
    int origin;               // iy0 * w + ix0: the offset of tap (0, 0) from the image plane
    unsigned taps;            // bit ky * ksize + kx: that tap lies inside the image (ksize <= 5)
};
using ColumnCursor = ColumnCursorOf<float>;

// Kernels of up to this many taps keep one validity bit per tap (ksize <= 5).
constexpr int MASKED_TAPS = 32;

template <class T>
__device__ __forceinline__ ColumnCursorOf<T> column_cursor(const ConvGeometryOf<T>& g, int n)
{
    ColumnCursorOf<T> c;
    const int positions = g.out_h * g.out_w;
    c.image = nullptr;
    c.iy0 = c.ix0 = c.origin = 0;
    c.taps = 0;
    if (n >= g.n_total) return c;
    const int b = n / positions;
    const int p = n - b * positions;
    const int oy = p / g.out_w;
    const int ox = p - oy * g.out_w;
    c.image = g.im + b * g.im_stride;
    c.iy0 = oy * g.stride_y - g.pad;
    c.ix0 = ox * g.stride_x - g.pad;
    c.origin = c.iy0 * g.w + c.ix0;
    if (g.ksize * g.ksize <= MASKED_TAPS) {
        for (int ky = 0; ky < g.ksize; ++ky) {
            const int iy = c.iy0 + ky * g.dilation;
            for (int kx = 0; kx < g.ksize; ++kx) {
                const int ix = c.ix0 + kx * g.dilation;
                if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) c.taps |= 1u << (ky * g.ksize + kx);
            }
        }
    }
    return c;
}

// v[j] = col[k0 + j][column], j < RUN. Up to MASKED_TAPS taps an element costs a bit test,
// an add and a load (the taps' validity was worked out once per column); larger kernels
// test the bounds of each element.
template <int RUN, class T>
__device__ __forceinline__ void gather_column(const ConvGeometryOf<T>& g, const ColumnCursorOf<T>& col, int k0,
                                              T (&v)[RUN])
{
    const int kk = g.ksize * g.ksize;
    int ch = k0 / kk;
    int r = k0 - ch * kk;
    int ky = r / g.ksize;
    int kx = r - ky * g.ksize;
    const long long plane = (long long)g.h * g.w;
    if (kk <= MASKED_TAPS) {
        const T* chan = (col.image != nullptr ? col.image : g.im) + ch * plane;
        const int wrap = g.dilation * g.w - g.ksize * g.dilation;   // end of a tap row -> next
        int off = col.origin + ky * g.dilation * g.w + kx * g.dilation;
#pragma unroll
        for (int j = 0; j < RUN; ++j) {
            const bool ok = ((col.taps >> r) & 1u) != 0 && k0 + j < g.k_total;
            v[j] = ok ? chan[off] : T(0);
            off += g.dilation;
            if (++kx == g.ksize) {
                kx = 0;
                off += wrap;
            }
            if (++r == kk) {
                r = 0;
                off = col.origin;
                chan += plane;
            }
        }
        return;
    }
#pragma unroll
    for (int j = 0; j < RUN; ++j) {
        const int iy = col.iy0 + ky * g.dilation;
        const int ix = col.ix0 + kx * g.dilation;
        const bool ok = col.image != nullptr && k0 + j < g.k_total && iy >= 0 && iy < g.h && ix >= 0 &&
                        ix < g.w;
        v[j] = ok ? col.image[ch * plane + iy * g.w + ix] : T(0);
        if (++kx == g.ksize) {
            kx = 0;
            if (++ky == g.ksize) {
                ky = 0;
                ++ch;
            }
        }
    }
}

// ---- epilogues: a column's place in an output of images ------------------------------
// Column n = image * per_image + p (p < per_image) of a product whose output holds its
// images image_stride elements apart: image * image_stride + p; -1 past the cols columns.
// The convolution's (gemm_tc.cuh) and the data gradient's (conv_backward.cuh) epilogues.
__device__ __forceinline__ long long image_column(int n, int cols, int per_image, long long image_stride)
{
    if (n >= cols) return -1;
    const int b = n / per_image;
    return b * image_stride + (n - b * per_image);
}
