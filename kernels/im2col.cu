// im2col / col2im for one image (channels x height x width), with stride, zero
// padding and dilation. col is (channels * ksize * ksize) x (out_h * out_w),
// row-major; row (c, ki, kj) holds im[c, oh*stride - pad + ki*dilation,
// ow*stride - pad + kj*dilation] for every output position (oh, ow).
// Groups are the caller's business (it offsets im and col).

// One thread per (channel, output position): it writes that position's ksize^2
// column entries; consecutive threads write consecutive addresses of each col
// row and read neighbouring pixels. The y dimension (blocks and threads) walks
// the channels, so small feature maps still fill whole warps.
extern "C" __global__ void im2col_kernel(const float* __restrict__ im, int channels, int height, int width,
                                        int ksize, int stride, int pad, int dilation,
                                        int out_h, int out_w, float* __restrict__ col)
{
    const int out_hw = out_h * out_w;
    const int pos = blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= out_hw) return;
    const int oh = pos / out_w;
    const int ow = pos - oh * out_w;
    const int h0 = oh * stride - pad;
    const int w0 = ow * stride - pad;
    for (int c = blockIdx.y * blockDim.y + threadIdx.y; c < channels; c += gridDim.y * blockDim.y) {
        const float* img = im + (long long)c * height * width;
        float* out = col + (long long)c * ksize * ksize * out_hw + pos;
        for (int ki = 0; ki < ksize; ++ki) {
            const int h = h0 + ki * dilation;
            const bool h_in = h >= 0 && h < height;
            for (int kj = 0; kj < ksize; ++kj) {
                const int w = w0 + kj * dilation;
                *out = (h_in && w >= 0 && w < width) ? img[h * width + w] : 0.0f;
                out += out_hw;
            }
        }
    }
}

// The adjoint: im[c, h, w] += sum of every col entry that im2col read from (c, h, w).
// One thread per (channel, pixel) gathers its entries (no atomics, deterministic).
extern "C" __global__ void col2im_kernel(const float* __restrict__ col, int channels, int height, int width,
                                        int ksize, int stride, int pad, int dilation,
                                        int out_h, int out_w, float* __restrict__ im)
{
    const int hw = height * width;
    const int out_hw = out_h * out_w;
    const int pix = blockIdx.x * blockDim.x + threadIdx.x;
    if (pix >= hw) return;
    const int h = pix / width;
    const int w = pix - h * width;
    for (int c = blockIdx.y * blockDim.y + threadIdx.y; c < channels; c += gridDim.y * blockDim.y) {
        const float* cols = col + (long long)c * ksize * ksize * out_hw;
        float sum = 0.0f;
        for (int ki = 0; ki < ksize; ++ki) {
            const int hs = h + pad - ki * dilation;     // = oh * stride when (c, ki) reads this row
            if (hs < 0 || hs % stride != 0) continue;
            const int oh = hs / stride;
            if (oh >= out_h) continue;
            for (int kj = 0; kj < ksize; ++kj) {
                const int ws = w + pad - kj * dilation;
                if (ws < 0 || ws % stride != 0) continue;
                const int ow = ws / stride;
                if (ow >= out_w) continue;
                sum += cols[(long long)(ki * ksize + kj) * out_hw + oh * out_w + ow];
            }
        }
        im[(long long)c * hw + pix] += sum;
    }
}
