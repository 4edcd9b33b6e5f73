// Darknet's activations over arrays (the device functions are in activations.cuh), the
// batch-norm forward's last pass and the fork's normalize_channels family.

#include "../common/activations.cuh"
#include "../common/x_storage.cuh"

// x[i] = act(x[i]) for i < n
extern "C" __global__ void activate_array(float* __restrict__ x, int n, int act)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = activate(x[i], act);
}

// out[row, s] = act(out[row, s] + biases[row % n]) over rows = batch * n rows of `size`:
// a convolution's inference tail (bias, or folded batch norm, then activation) in one pass.
// x (blocks and threads) spans the row, y the rows.
extern "C" __global__ void bias_activate(float* __restrict__ out, const float* __restrict__ biases,
                                        int rows, int n, int size, int act)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= size) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        float* p = out + (long long)r * size + s;
        *p = activate(*p + biases[r % n], act);
    }
}

// Visits every element of rows = batch * filters rows of `spatial` elements with its
// channel's constants: body(i, channel), channel a BatchnormChannel<EXACT> (its divisor:
// Darknet's sqrt(var) + 1e-6 for eps < 0, the fork's sqrt(var + eps)). A thread takes
// several elements of a row (the launcher's per_thread), so that the channel's constants
// (the divisor's sqrt) are worked out once for them: the passes are bound by their
// arithmetic as much as by their bytes.
template <bool EXACT, class Body>
__device__ __forceinline__ void batchnorm_rows(const float* __restrict__ mean,
                                               const float* __restrict__ variance,
                                               const float* __restrict__ scales,
                                               const float* __restrict__ biases, int rows,
                                               int filters, int spatial, float eps, Body body)
{
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const int f = r % filters;
        const BatchnormChannel<EXACT> channel(mean[f], variance[f], eps, scales[f], biases[f]);
        const long long row = (long long)r * spatial;
        for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < spatial;
             s += gridDim.x * blockDim.x)
            body(row + s, channel);
    }
}

// Batch norm's forward after its statistics, per element: keep = x rounded to X's storage
// when keep is not null (the x a training layer keeps for its backward: what copy_rounded
// would write, in this pass's read of x), v = (x - mean[f]) / divisor, x_norm = v when
// x_norm is not null, x = act(v * scales[f] + biases[f]). One pass for what a copy,
// normalize, a copy, scale_bias, add_bias and the activation did in six. With an fp32 x
// each step rounds as its own pass did (no fused multiply-add: BatchnormChannel<true>), so
// the bits are theirs; with a 16-bit x (fp16/bf16) the steps are its fast ones. Either way
// batchnorm_activation_sums recomputes them in the backward as this pass made them.
template <class X>
__device__ __forceinline__ void batchnorm_apply_of(float* __restrict__ x, const float* __restrict__ mean,
                                                   const float* __restrict__ variance,
                                                   const float* __restrict__ scales,
                                                   const float* __restrict__ biases,
                                                   int rows, int filters, int spatial, float eps,
                                                   int act, float* __restrict__ x_norm,
                                                   typename X::Storage* __restrict__ keep)
{
    using Channel = BatchnormChannel<X::exact>;
    batchnorm_rows<X::exact>(mean, variance, scales, biases, rows, filters, spatial, eps,
                             [&](long long i, const Channel& c) {
                                 const float in = x[i];
                                 if (keep) keep[i] = X::rounded(in);
                                 const float v = c.normalized(in);
                                 if (x_norm) x_norm[i] = v;
                                 x[i] = Channel::activated(c.scaled(v), act);
                             });
}

#define BATCHNORM_APPLY(NAME, X)                                                                  \
    extern "C" __global__ void NAME(float* __restrict__ x, const float* __restrict__ mean,        \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ scales,                             \
                                    const float* __restrict__ biases, int rows, int filters,      \
                                    int spatial, float eps, int act, float* __restrict__ x_norm,  \
                                    X::Storage* __restrict__ keep)                                \
    {                                                                                             \
        batchnorm_apply_of<X>(x, mean, variance, scales, biases, rows, filters, spatial, eps,     \
                              act, x_norm, keep);                                                 \
    }
BATCHNORM_APPLY(batchnorm_apply_kernel, XF32)
BATCHNORM_APPLY(batchnorm_apply_kernel_x_f16, XF16)
BATCHNORM_APPLY(batchnorm_apply_kernel_x_bf16, XBF16)

// A training layer's output made again from its kept x right before the backward reads it
// (darknet_py/output_plan.py: shared until then): out = act(v * scales[f] + biases[f]) with
// v normalised from X{x}[i] (a 16-bit x widened, exactly), in batchnorm_apply_of's steps
// (BatchnormChannel<X::exact>): from an fp32 x, the bits that pass wrote. O: how out is
// kept, fp32 or (a 16-bit output, issue 26) x's own 16 bits, the fp32 value rounded once as
// it is stored. batchnorm_activation_rows recomputes the same value (batchnorm_rebuilt).
template <class X, class O>
__device__ __forceinline__ void batchnorm_rebuild_of(X x, typename O::Storage* __restrict__ out,
                                                     const float* __restrict__ mean,
                                                     const float* __restrict__ variance,
                                                     const float* __restrict__ scales,
                                                     const float* __restrict__ biases,
                                                     int rows, int filters, int spatial, float eps,
                                                     int act)
{
    using Channel = BatchnormChannel<X::exact>;
    batchnorm_rows<X::exact>(mean, variance, scales, biases, rows, filters, spatial, eps,
                             [&](long long i, const Channel& c) {
                                 out[i] = O::rounded(batchnorm_rebuilt(x[i], c, act));
                             });
}

#define BATCHNORM_REBUILD(NAME, X, O)                                                             \
    extern "C" __global__ void NAME(const typename X::Storage* __restrict__ x,                    \
                                    typename O::Storage* __restrict__ out,                        \
                                    const float* __restrict__ mean,                               \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ scales,                             \
                                    const float* __restrict__ biases, int rows, int filters,      \
                                    int spatial, float eps, int act)                              \
    {                                                                                             \
        batchnorm_rebuild_of<X, O>(X{x}, out, mean, variance, scales, biases, rows, filters,      \
                                   spatial, eps, act);                                            \
    }
BATCHNORM_REBUILD(batchnorm_rebuild_kernel, XF32, XF32)
BATCHNORM_REBUILD(batchnorm_rebuild_kernel_x_f16, XF16, XF32)
BATCHNORM_REBUILD(batchnorm_rebuild_kernel_x_bf16, XBF16, XF32)
BATCHNORM_REBUILD(batchnorm_rebuild_kernel_x_f16_out, XF16, XF16)     // a 16-bit output
BATCHNORM_REBUILD(batchnorm_rebuild_kernel_x_bf16_out, XBF16, XBF16)

// The 16-bit rebuild (x and out at X's 16 bits) eight elements a thread, flat over the
// rows: one 16-byte load and one 16-byte store for the eight, the channel's constants
// worked out for the first and again where the eight cross into the next row. The 2-byte
// accesses of batchnorm_rebuild_of ran at about a quarter of the memory's rate. The same
// values as batchnorm_rebuild_of, bit for bit. Needs x and out
// 16-byte aligned and total a multiple of 8 (the launcher checks).
template <class X>
__device__ __forceinline__ void batchnorm_rebuild_eights_of(
    const unsigned short* __restrict__ x, unsigned short* __restrict__ out,
    const float* __restrict__ mean, const float* __restrict__ variance,
    const float* __restrict__ scales, const float* __restrict__ biases, long long total,
    int filters, int spatial, float eps, int act)
{
    using Channel = BatchnormChannel<X::exact>;
    const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (first >= total) return;
    const uint4 loaded = *reinterpret_cast<const uint4*>(x + first);
    const unsigned short* in = reinterpret_cast<const unsigned short*>(&loaded);
    uint4 stored;
    unsigned short* result = reinterpret_cast<unsigned short*>(&stored);
    const long long row = first / spatial;
    int s = (int)(first - row * spatial);
    int f = (int)(row % filters);
    Channel c(mean[f], variance[f], eps, scales[f], biases[f]);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if (s == spatial) {   // the next row: its channel
            s = 0;
            f = f + 1 == filters ? 0 : f + 1;
            c = Channel(mean[f], variance[f], eps, scales[f], biases[f]);
        }
        result[k] = X::rounded(batchnorm_rebuilt(X::widen(in[k]), c, act));
        ++s;
    }
    *reinterpret_cast<uint4*>(out + first) = stored;
}

#define BATCHNORM_REBUILD_EIGHTS(NAME, X)                                                         \
    extern "C" __global__ void NAME(const unsigned short* __restrict__ x,                         \
                                    unsigned short* __restrict__ out,                             \
                                    const float* __restrict__ mean,                               \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ scales,                             \
                                    const float* __restrict__ biases, long long total,            \
                                    int filters, int spatial, float eps, int act)                 \
    {                                                                                             \
        batchnorm_rebuild_eights_of<X>(x, out, mean, variance, scales, biases, total, filters,    \
                                       spatial, eps, act);                                        \
    }
BATCHNORM_REBUILD_EIGHTS(batchnorm_rebuild_eights_x_f16, XF16)
BATCHNORM_REBUILD_EIGHTS(batchnorm_rebuild_eights_x_bf16, XBF16)

// x[r * row_stride + c] = act(...) for r < rows, c < width (x already offset).
// x (blocks and threads) spans the width, y the rows.
extern "C" __global__ void activate_strided(float* __restrict__ x, int rows, int row_stride,
                                           int width, int act)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        float* p = x + (long long)r * row_stride + c;
        *p = activate(*p, act);
    }
}

// delta[r * row_stride + c] *= act'(y[r * row_stride + c]) for r < rows, c < width (y and
// delta already offset): the logistic planes of [region] in one launch. x (blocks and
// threads) spans the width, y the rows.
extern "C" __global__ void gradient_strided(const float* __restrict__ y, int rows, int row_stride,
                                           int width, int act, float* __restrict__ delta)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const long long i = (long long)r * row_stride + c;
        delta[i] *= gradient(y[i], act);
    }
}

// delta[i] *= act'(y[i]) for i < n
extern "C" __global__ void gradient_array(const float* __restrict__ y, int n, int act,
                                         float* __restrict__ delta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        delta[i] *= gradient(y[i], act);
}

// delta[i] *= act'(x[i]) from the activation's input x
extern "C" __global__ void gradient_from_input_array(const float* __restrict__ x, int n, int act,
                                                    float* __restrict__ delta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        delta[i] *= gradient_from_input(x[i], act);
}

// The fork's normalize_channels family in place on x (batch, channels, spatial): one thread
// per (image, position) normalises over the channels (kind: ChannelActivation).
extern "C" __global__ void normalize_channels_kernel(float* __restrict__ x, int batch, int channels,
                                                    int spatial, int kind)
{
    const long long total = (long long)batch * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long b = i / spatial;
        float* p = x + b * channels * spatial + (i - b * spatial);
        float top = 0.0f;
        if (kind == NORM_CHAN_SOFTMAX_MAXVAL) {
            top = p[0];
            for (int k = 1; k < channels; ++k) top = fmaxf(top, p[(long long)k * spatial]);
        }
        float sum = CHANNEL_EPS;
        for (int k = 0; k < channels; ++k) {
            const float v = p[(long long)k * spatial];
            sum += kind == NORM_CHAN ? fmaxf(v, 0.0f) : expf(v - top);
        }
        for (int k = 0; k < channels; ++k) {
            float* v = p + (long long)k * spatial;
            *v = kind == NORM_CHAN ? fmaxf(*v, 0.0f) / sum : expf(*v - top) / sum;
        }
    }
}

// The exact gradient of normalize_channels_kernel from its input x: delta (dL/dy) becomes
// dL/dx. For *_maxval the maximum's own term through the eps (first maximum) is included.
extern "C" __global__ void normalize_channels_gradient_kernel(const float* __restrict__ x, int batch,
                                                             int channels, int spatial, int kind,
                                                             float* __restrict__ delta)
{
    const long long total = (long long)batch * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const long long b = i / spatial;
        const long long base = b * channels * spatial + (i - b * spatial);
        const float* p = x + base;
        float* d = delta + base;
        float top = 0.0f;
        int first = 0;
        if (kind == NORM_CHAN_SOFTMAX_MAXVAL) {
            top = p[0];
            for (int k = 1; k < channels; ++k) {
                const float v = p[(long long)k * spatial];
                if (v > top) { top = v; first = k; }
            }
        }
        float sum = CHANNEL_EPS;
        for (int k = 0; k < channels; ++k) {
            const float v = p[(long long)k * spatial];
            sum += kind == NORM_CHAN ? fmaxf(v, 0.0f) : expf(v - top);
        }
        float gy = 0.0f;   // sum over channels of dL/dy * y
        for (int k = 0; k < channels; ++k) {
            const float v = p[(long long)k * spatial];
            const float y = kind == NORM_CHAN ? fmaxf(v, 0.0f) / sum : expf(v - top) / sum;
            gy += d[(long long)k * spatial] * y;
        }
        for (int k = 0; k < channels; ++k) {
            const float v = p[(long long)k * spatial];
            float* dk = d + (long long)k * spatial;
            if (kind == NORM_CHAN) {
                *dk = v > 0.0f ? (*dk - gy) / sum : 0.0f;
            } else {
                *dk = expf(v - top) / sum * (*dk - gy);
                if (kind == NORM_CHAN_SOFTMAX_MAXVAL && k == first) *dk -= CHANNEL_EPS / sum * gy;
            }
        }
    }
}
