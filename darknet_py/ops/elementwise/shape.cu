// Data movement between layer layouts: route copies, upsample, reorg, shortcut, and the
// AlexeyAB fork's weighted shortcut and scale_channels.
// All arrays are batch x channels x height x width, row-major.
// A layer's output kept at 16 bits (issue 26: storage_zeros' fp16/bf16 arrays) goes through
// the _f16 / _bf16 twins of route's copy, upsample's forward and the shortcut: one template
// over x_storage.cuh's types each, the arithmetic in fp32 and one rounding at the store
// (XF32's the identity: the fp32 kernels' bits).

#include "../common/x_storage.cuh"

// dst[p*dst_plane_stride + r*dst_stride + c] (+)= src[p*src_plane_stride + r*src_stride + c]
// for p < planes, r < rows, c < width: route concatenation (one plane) and the
// (filters, batch, positions) <-> (batch, filters, positions) moves of a convolution.
// x spans c, COPY_RUN elements a thread (blockDim.x apart, so a warp's accesses stay
// coalesced), loaded together before any store: one element a thread kept too few loads
// in flight for the copy bandwidth. y spans the (plane, row) pairs.
// A 16-bit copy moves the stored bits; accumulating adds the widened values in fp32 and
// rounds the sum once.
constexpr int COPY_RUN = 4;

template <class X>
__device__ __forceinline__ void copy_blocks_of(const typename X::Storage* __restrict__ src,
                                               int src_stride, long long src_plane_stride,
                                               typename X::Storage* __restrict__ dst,
                                               int dst_stride, long long dst_plane_stride,
                                               int width, int rows, int planes, int accumulate)
{
    using Storage = typename X::Storage;
    const int c0 = blockIdx.x * blockDim.x * COPY_RUN + threadIdx.x;
    if (c0 >= width) return;
    for (long long pr = blockIdx.y * blockDim.y + threadIdx.y; pr < (long long)rows * planes;
         pr += gridDim.y * blockDim.y) {
        const long long p = pr / rows;
        const long long r = pr - p * rows;
        const Storage* s = src + p * src_plane_stride + r * src_stride;
        Storage* d = dst + p * dst_plane_stride + r * dst_stride;
        Storage v[COPY_RUN];
#pragma unroll
        for (int u = 0; u < COPY_RUN; ++u) {
            const int c = c0 + u * blockDim.x;
            v[u] = c < width ? s[c] : Storage(0);
        }
#pragma unroll
        for (int u = 0; u < COPY_RUN; ++u) {
            const int c = c0 + u * blockDim.x;
            if (c < width) d[c] = accumulate ? X::rounded(X::widen(d[c]) + X::widen(v[u])) : v[u];
        }
    }
}

#define COPY_BLOCKS(NAME, X)                                                                      \
    extern "C" __global__ void NAME(const X::Storage* __restrict__ src, int src_stride,           \
                                    long long src_plane_stride, X::Storage* __restrict__ dst,     \
                                    int dst_stride, long long dst_plane_stride, int width,        \
                                    int rows, int planes, int accumulate)                         \
    {                                                                                             \
        copy_blocks_of<X>(src, src_stride, src_plane_stride, dst, dst_stride, dst_plane_stride,   \
                          width, rows, planes, accumulate);                                       \
    }
COPY_BLOCKS(copy_blocks_kernel, XF32)
COPY_BLOCKS(copy_blocks_kernel_f16, XF16)
COPY_BLOCKS(copy_blocks_kernel_bf16, XBF16)

// Nearest-neighbour upsample of planes (batch*c) of h x w by `stride`:
// out[p, y, x] = scale * in[p, y/stride, x/stride]. One thread per output element.
template <class X>
__device__ __forceinline__ void upsample_forward_of(const typename X::Storage* __restrict__ in,
                                                    int planes, int h, int w, int stride,
                                                    float scale,
                                                    typename X::Storage* __restrict__ out)
{
    const int ow = w * stride, oh = h * stride;
    const long long total = (long long)planes * oh * ow;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int x = (int)(i % ow);
        const long long t = i / ow;
        const int y = (int)(t % oh);
        const long long p = t / oh;
        out[i] = X::rounded(scale * X::widen(in[(p * h + y / stride) * w + x / stride]));
    }
}

#define UPSAMPLE_FORWARD(NAME, X)                                                                 \
    extern "C" __global__ void NAME(const X::Storage* __restrict__ in, int planes, int h, int w,  \
                                    int stride, float scale, X::Storage* __restrict__ out)        \
    {                                                                                             \
        upsample_forward_of<X>(in, planes, h, w, stride, scale, out);                             \
    }
UPSAMPLE_FORWARD(upsample_forward_kernel, XF32)
UPSAMPLE_FORWARD(upsample_forward_kernel_f16, XF16)
UPSAMPLE_FORWARD(upsample_forward_kernel_bf16, XBF16)

// Its adjoint: in[p, y, x] += scale * sum of out over the stride x stride cell
// of (y, x). One thread per small element gathers its cell (no atomics).
extern "C" __global__ void upsample_backward_kernel(float* __restrict__ in, int planes, int h, int w,
                                                   int stride, float scale, const float* __restrict__ out)
{
    const int ow = w * stride;
    const long long total = (long long)planes * h * w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int x = (int)(i % w);
        const long long t = i / w;
        const int y = (int)(t % h);
        const long long p = t / h;
        const float* cell = out + ((p * h + y) * stride * (long long)ow) + (long long)x * stride;
        float s = 0.0f;
        for (int dy = 0; dy < stride; ++dy)
            for (int dx = 0; dx < stride; ++dx) s += cell[(long long)dy * ow + dx];
        in[i] += scale * s;
    }
}

// Darknet's reorg_cpu index mapping, one thread per element of the (batch, c, h, w)
// input space. forward: out[out_index] = x[in_index]; else out[in_index] = x[out_index].
extern "C" __global__ void reorg_kernel(const float* __restrict__ x, int w, int h, int c, int batch,
                                       int stride, int forward, float* __restrict__ out)
{
    const int out_c = c / (stride * stride);
    const long long total = (long long)batch * c * h * w;
    for (long long in_index = blockIdx.x * (long long)blockDim.x + threadIdx.x; in_index < total;
         in_index += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(in_index % w);
        long long t = in_index / w;
        const int j = (int)(t % h);
        t /= h;
        const int k = (int)(t % c);
        const long long b = t / c;
        const int c2 = k % out_c;
        const int offset = k / out_c;
        const long long w2 = (long long)i * stride + offset % stride;
        const long long h2 = (long long)j * stride + offset / stride;
        const long long out_index = w2 + (long long)w * stride * (h2 + (long long)h * stride * (c2 + out_c * b));
        if (forward) out[out_index] = x[in_index];
        else out[in_index] = x[out_index];
    }
}

// Darknet's shortcut_cpu: out = s1*out + s2*add over the common shape
// (batch, minc, minh, minw), sampling add every `stride` and out every `sample`.
template <class X>
__device__ __forceinline__ void shortcut_of(int batch, int minw, int minh, int minc, int stride,
                                            int sample,
                                            const typename X::Storage* __restrict__ add, int w1,
                                            int h1, int c1, typename X::Storage* __restrict__ out,
                                            int w2, int h2, int c2, float s1, float s2)
{
    const long long total = (long long)batch * minc * minh * minw;
    for (long long n = blockIdx.x * (long long)blockDim.x + threadIdx.x; n < total;
         n += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(n % minw);
        long long t = n / minw;
        const int j = (int)(t % minh);
        t /= minh;
        const int k = (int)(t % minc);
        const long long b = t / minc;
        const long long out_index = ((b * c2 + k) * h2 + (long long)j * sample) * w2 + (long long)i * sample;
        const long long add_index = ((b * c1 + k) * h1 + (long long)j * stride) * w1 + (long long)i * stride;
        out[out_index] = X::rounded(s1 * X::widen(out[out_index]) + s2 * X::widen(add[add_index]));
    }
}

#define SHORTCUT(NAME, X)                                                                         \
    extern "C" __global__ void NAME(int batch, int minw, int minh, int minc, int stride,          \
                                    int sample, const X::Storage* __restrict__ add, int w1,       \
                                    int h1, int c1, X::Storage* __restrict__ out, int w2, int h2, \
                                    int c2, float s1, float s2)                                   \
    {                                                                                             \
        shortcut_of<X>(batch, minw, minh, minc, stride, sample, add, w1, h1, c1, out, w2, h2, c2, \
                       s1, s2);                                                                   \
    }
SHORTCUT(shortcut_kernel, XF32)
SHORTCUT(shortcut_kernel_f16, XF16)
SHORTCUT(shortcut_kernel_bf16, XBF16)

// The fork's [scale_channels]: out[b, c, p] = scale[b, c] * src[b, c, p], or with scale_wh
// scale[b, p] * src[b, c, p]. One thread per output element.
__device__ __forceinline__ long long scale_index(long long i, int channels, int spatial, int scale_wh)
{
    const long long b = i / ((long long)channels * spatial);
    return scale_wh ? b * spatial + i % spatial : i / spatial;
}

extern "C" __global__ void scale_channels_kernel(const float* __restrict__ scale,
                                                const float* __restrict__ src, int batch, int channels,
                                                int spatial, int scale_wh, float* __restrict__ out)
{
    const long long total = (long long)batch * channels * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        out[i] = scale[scale_index(i, channels, spatial, scale_wh)] * src[i];
}

// Its adjoint: src_delta += scale * delta (one thread per element, when src_delta is set)
// and scale_delta[j] += sum of delta * src over the elements j scales (one warp per j).
extern "C" __global__ void scale_channels_src_delta_kernel(const float* __restrict__ scale,
                                                          const float* __restrict__ delta, int batch,
                                                          int channels, int spatial, int scale_wh,
                                                          float* __restrict__ src_delta)
{
    const long long total = (long long)batch * channels * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        src_delta[i] += scale[scale_index(i, channels, spatial, scale_wh)] * delta[i];
}

extern "C" __global__ void scale_channels_scale_delta_kernel(const float* __restrict__ src,
                                                            const float* __restrict__ delta, int batch,
                                                            int channels, int spatial, int scale_wh,
                                                            float* __restrict__ scale_delta)
{
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const long long n = scale_wh ? (long long)batch * spatial : (long long)batch * channels;
    const int terms = scale_wh ? channels : spatial;       // elements each scale value touches
    for (long long j = (blockIdx.x * (long long)blockDim.x + threadIdx.x) >> 5; j < n; j += warps) {
        float s = 0.0f;
        for (int k = lane; k < terms; k += 32) {
            long long e;
            if (scale_wh) {
                const long long b = j / spatial;
                e = (b * channels + k) * spatial + (j - b * spatial);
            } else {
                e = j * spatial + k;
            }
            s += delta[e] * src[e];
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) scale_delta[j] += s;
    }
}

// The fork's weighted-shortcut weights (inputs x channels), normalised over the inputs per
// channel: 0 none, 1 relu(w) / (1e-4 + sum relu), 2 exp(w - max) / (1e-4 + sum exp(w - max)).
// One thread per channel.
extern "C" __global__ void shortcut_weights_kernel(const float* __restrict__ weights, int inputs,
                                                  int channels, int normalization,
                                                  float* __restrict__ out)
{
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < channels; c += gridDim.x * blockDim.x) {
        float top = -INFINITY;
        for (int i = 0; i < inputs; ++i) top = fmaxf(top, weights[i * channels + c]);
        float sum = 1e-4f;
        for (int i = 0; i < inputs; ++i) {
            const float w = weights[i * channels + c];
            sum += normalization == 1 ? fmaxf(w, 0.0f) : expf(w - top);
        }
        for (int i = 0; i < inputs; ++i) {
            const float w = weights[i * channels + c];
            out[i * channels + c] = normalization == 0 ? w
                : normalization == 1 ? fmaxf(w, 0.0f) / sum : expf(w - top) / sum;
        }
    }
}

// out[b*out_stride + j] += weights[j / step] * src[b*src_stride + j] for b < batch, j < width.
// x (blocks and threads) spans j, y the images.
extern "C" __global__ void channel_weighted_add_kernel(const float* __restrict__ src, int src_stride,
                                                      const float* __restrict__ weights, int step,
                                                      int width, int batch, float* __restrict__ out,
                                                      int out_stride)
{
    const int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= width) return;
    const float w = weights[j / step];
    for (int b = blockIdx.y * blockDim.y + threadIdx.y; b < batch; b += gridDim.y * blockDim.y)
        out[(long long)b * out_stride + j] += w * src[(long long)b * src_stride + j];
}

// out[c] += sum over b < batch and j < width with j / step == c of a[b*a_stride + j] *
// b[b*b_stride + j]: one block per channel c, a block-wide reduction.
extern "C" __global__ void channel_weighted_dot_kernel(const float* __restrict__ a, int a_stride,
                                                      const float* __restrict__ bv, int b_stride,
                                                      int step, int width, int batch,
                                                      float* __restrict__ out)
{
    __shared__ float partial[32];
    const int c = blockIdx.x;
    const int j0 = c * step;
    const int j1 = min(j0 + step, width);
    const int span = max(j1 - j0, 0);
    float s = 0.0f;
    for (long long e = threadIdx.x; e < (long long)span * batch; e += blockDim.x) {
        const long long b = e / span;
        const int j = j0 + (int)(e - b * span);
        s += a[b * a_stride + j] * bv[b * b_stride + j];
    }
    for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0) partial[threadIdx.x >> 5] = s;
    __syncthreads();
    if (threadIdx.x < 32) {
        s = threadIdx.x < (blockDim.x >> 5) ? partial[threadIdx.x] : 0.0f;
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (threadIdx.x == 0) out[c] += s;
    }
}
