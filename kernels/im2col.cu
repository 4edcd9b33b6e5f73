// im2col / col2im for a batch of images (channels x height x width each, im_stride
// floats apart), with strides (down, across), zero padding and dilation. col is
// (channels * ksize * ksize) x batch x (out_h * out_w), row-major: row (c, ki, kj),
// image b holds im[b, c, oh*stride_y - pad + ki*dilation, ow*stride_x - pad + kj*dilation]
// for every output position (oh, ow), so one GEMM covers the whole batch. With
// batch 1 this is Darknet's im2col. Groups are the caller's business (it offsets im).

#include "x_storage.cuh"

// What a col entry is stored as: fp32 as read (im2col_kernel), or rounded to nearest even
// into fp16 / bf16 bits (im2col_f16_kernel, im2col_bf16_kernel: the Hopper GEMM's
// K-major operand, cuda_wgmma.py).
struct ColF32 {
    using Storage = float;
    static __device__ __forceinline__ float stored(float v) { return v; }
};
template <class X>
struct ColHalf {
    using Storage = unsigned short;
    static __device__ __forceinline__ unsigned short stored(float v) { return X::rounded(v); }
};

// Writes the ksize^2 col entries of one (channel, output position). KS > 0 fixes
// ksize at compile time, so the loops unroll and all the loads issue before the
// stores (KS == 0: ksize at run time).
template <int KS, class Col>
__device__ __forceinline__ void im2col_position(const float* __restrict__ img, int ksize_rt, int height,
                                                int width, int dilation, int h0, int w0,
                                                typename Col::Storage* __restrict__ out,
                                                long long row_stride)
{
    const int ksize = KS > 0 ? KS : ksize_rt;
    for (int ki = 0; ki < ksize; ++ki) {
        const int h = h0 + ki * dilation;
        const bool h_in = h >= 0 && h < height;
        for (int kj = 0; kj < ksize; ++kj) {
            const int w = w0 + kj * dilation;
            out[(ki * ksize + kj) * row_stride] =
                Col::stored((h_in && w >= 0 && w < width) ? img[h * width + w] : 0.0f);
        }
    }
}

// One thread per (channel, image, output position): x (blocks and threads) spans
// the positions, y the (channel, image) pairs. Consecutive threads write
// consecutive addresses of each col row and read neighbouring pixels; the index
// arithmetic is paid once per ksize^2 elements. Col rows are row_stride entries apart.
template <class Col>
__device__ __forceinline__ void im2col_of(const float* __restrict__ im, int channels, int height,
                                          int width, int ksize, int stride_y, int stride_x, int pad,
                                          int dilation, int out_h, int out_w,
                                          typename Col::Storage* __restrict__ col, int batch,
                                          long long im_stride, long long row_stride)
{
    const int out_hw = out_h * out_w;
    const int pos = blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= out_hw) return;
    const int oh = pos / out_w;
    const int ow = pos - oh * out_w;
    const int h0 = oh * stride_y - pad;
    const int w0 = ow * stride_x - pad;
    for (int cb = blockIdx.y * blockDim.y + threadIdx.y; cb < channels * batch; cb += gridDim.y * blockDim.y) {
        const int c = cb / batch;
        const int b = cb - c * batch;
        const float* img = im + b * im_stride + (long long)c * height * width;
        typename Col::Storage* out = col + (long long)c * ksize * ksize * row_stride + (long long)b * out_hw + pos;
        switch (ksize) {
        case 1: im2col_position<1, Col>(img, 1, height, width, dilation, h0, w0, out, row_stride); break;
        case 3: im2col_position<3, Col>(img, 3, height, width, dilation, h0, w0, out, row_stride); break;
        default: im2col_position<0, Col>(img, ksize, height, width, dilation, h0, w0, out, row_stride); break;
        }
    }
}

// col rows packed: batch * out_h * out_w entries each.
extern "C" __global__ void im2col_kernel(const float* __restrict__ im, int channels, int height, int width,
                                        int ksize, int stride_y, int stride_x, int pad, int dilation,
                                        int out_h, int out_w, float* __restrict__ col,
                                        int batch, long long im_stride)
{
    im2col_of<ColF32>(im, channels, height, width, ksize, stride_y, stride_x, pad, dilation, out_h,
                      out_w, col, batch, im_stride, (long long)batch * out_h * out_w);
}

// col in 16 bits, rows row_pitch entries apart (the entries past batch * out_h * out_w
// are left as they are).
#define IM2COL_HALF(NAME, X)                                                                      \
    extern "C" __global__ void NAME(const float* __restrict__ im, int channels, int height,       \
                                    int width, int ksize, int stride_y, int stride_x, int pad,    \
                                    int dilation, int out_h, int out_w,                           \
                                    unsigned short* __restrict__ col, int batch,                  \
                                    long long im_stride, long long row_pitch)                     \
    {                                                                                             \
        im2col_of<ColHalf<X>>(im, channels, height, width, ksize, stride_y, stride_x, pad,        \
                              dilation, out_h, out_w, col, batch, im_stride, row_pitch);          \
    }
IM2COL_HALF(im2col_f16_kernel, XF16)
IM2COL_HALF(im2col_bf16_kernel, XBF16)

// Sum of the col entries that im2col read from pixel (h, w) of one channel.
// KS > 0 fixes ksize at compile time, so the loops unroll and the loads issue
// together; KS == 0 takes ksize at run time. UNIT_STRIDE (strides 1) drops the
// run-time divisions and remainders by the strides, ~40 integer instructions a tap.
template <int KS, bool UNIT_STRIDE>
__device__ __forceinline__ float col2im_pixel(const float* __restrict__ cols, int ksize_rt, int h, int w,
                                              int stride_y_rt, int stride_x_rt, int pad, int dilation,
                                              int out_h, int out_w, long long row_stride)
{
    const int ksize = KS > 0 ? KS : ksize_rt;
    const int stride_y = UNIT_STRIDE ? 1 : stride_y_rt;
    const int stride_x = UNIT_STRIDE ? 1 : stride_x_rt;
    float sum = 0.0f;
    for (int ki = 0; ki < ksize; ++ki) {
        const int hs = h + pad - ki * dilation;     // = oh * stride_y when row (ki) read this pixel
        if (hs < 0 || hs % stride_y != 0 || hs / stride_y >= out_h) continue;
        const int oh = hs / stride_y;
        for (int kj = 0; kj < ksize; ++kj) {
            const int ws = w + pad - kj * dilation;
            if (ws < 0 || ws % stride_x != 0 || ws / stride_x >= out_w) continue;
            sum += cols[(ki * ksize + kj) * row_stride + oh * out_w + ws / stride_x];
        }
    }
    return sum;
}

// The adjoint: im[b, c, h, w] += sum of every col entry that im2col read from it.
// One thread per (channel, image, pixel) gathers its entries (no atomics,
// deterministic); x spans the pixels, y the (channel, image) pairs.
extern "C" __global__ void col2im_kernel(const float* __restrict__ col, int channels, int height, int width,
                                        int ksize, int stride_y, int stride_x, int pad, int dilation,
                                        int out_h, int out_w, float* __restrict__ im,
                                        int batch, long long im_stride)
{
    const int hw = height * width;
    const int pix = blockIdx.x * blockDim.x + threadIdx.x;
    if (pix >= hw) return;
    const int h = pix / width;
    const int w = pix - h * width;
    const long long row_stride = (long long)batch * out_h * out_w;
    for (int cb = blockIdx.y * blockDim.y + threadIdx.y; cb < channels * batch; cb += gridDim.y * blockDim.y) {
        const int c = cb / batch;
        const int b = cb - c * batch;
        const float* cols = col + (long long)c * ksize * ksize * row_stride + (long long)b * out_h * out_w;
        float sum;
        if (ksize == 3 && stride_y == 1 && stride_x == 1)
            sum = col2im_pixel<3, true>(cols, 3, h, w, 1, 1, pad, dilation, out_h, out_w, row_stride);
        else if (ksize == 3)
            sum = col2im_pixel<3, false>(cols, 3, h, w, stride_y, stride_x, pad, dilation, out_h, out_w, row_stride);
        else if (ksize == 1)
            sum = col2im_pixel<1, false>(cols, 1, h, w, stride_y, stride_x, pad, dilation, out_h, out_w, row_stride);
        else
            sum = col2im_pixel<0, false>(cols, ksize, h, w, stride_y, stride_x, pad, dilation, out_h, out_w, row_stride);
        im[b * im_stride + (long long)c * hw + pix] += sum;
    }
}
