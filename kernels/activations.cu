// Darknet's activations and their gradients (as functions of the output y),
// mirroring darknet_py/activations.py. The enum order is ACTIVATIONS' order
// there: the backend passes ACTIVATION_IDS[name] as `act`.

enum Activation {
    LOGISTIC = 0,
    RELU = 1,
    RELIE = 2,
    LINEAR = 3,
    RAMP = 4,
    TANH = 5,
    PLSE = 6,
    LEAKY = 7,
    ELU = 8,
    LOGGY = 9,
    STAIR = 10,
    HARDTAN = 11,
    LHTAN = 12,
    SELU = 13,
    // the AlexeyAB fork's
    RELU6 = 14,
    REVLEAKY = 15,
    GELU = 16,
    SWISH = 17,
    MISH = 18,
    HARD_MISH = 19
};

// The fork's normalize_channels family (CHANNEL_ACTIVATIONS' order in activations.py).
enum ChannelActivation {
    NORM_CHAN = 0,
    NORM_CHAN_SOFTMAX = 1,
    NORM_CHAN_SOFTMAX_MAXVAL = 2
};

constexpr float SELU_LAMBDA = 1.0507f;
constexpr float SELU_ALPHA = 1.6732f;
constexpr float MISH_THRESHOLD = 20.0f;
constexpr float GELU_A = 0.797885f;
constexpr float GELU_B = 0.035677f;
constexpr float CHANNEL_EPS = 1e-4f;

// The fork's softplus: x above the threshold, exp(x) below minus it, else log(exp(x) + 1).
__device__ __forceinline__ float softplus(float x)
{
    if (x > MISH_THRESHOLD) return x;
    if (x < -MISH_THRESHOLD) return expf(x);
    return log1pf(expf(x));
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__device__ __forceinline__ float stair_activate(float x)
{
    const float n = floorf(x);
    const float half = floorf(x / 2.0f);
    return ((int)n % 2 != 0) ? (x - n) + half : half;
}

__device__ __forceinline__ float activate(float x, int act)
{
    switch (act) {
    case LOGISTIC: return 1.0f / (1.0f + expf(-x));
    case RELU:     return x > 0.0f ? x : 0.0f;
    case RELIE:    return x > 0.0f ? x : 0.01f * x;
    case LINEAR:   return x;
    case RAMP:     return (x > 0.0f ? x : 0.0f) + 0.1f * x;
    case TANH:     return tanhf(x);
    case PLSE:
        if (x < -4.0f) return 0.01f * (x + 4.0f);
        if (x > 4.0f) return 0.01f * (x - 4.0f) + 1.0f;
        return 0.125f * x + 0.5f;
    case LEAKY:    return x > 0.0f ? x : 0.1f * x;
    case ELU:      return x >= 0.0f ? x : expm1f(x);
    case LOGGY:    return 2.0f / (1.0f + expf(-x)) - 1.0f;
    case STAIR:    return stair_activate(x);
    case HARDTAN:  return fminf(fmaxf(x, -1.0f), 1.0f);
    case LHTAN:
        if (x < 0.0f) return 0.001f * x;
        if (x > 1.0f) return 0.001f * (x - 1.0f) + 1.0f;
        return x;
    case SELU:     return x >= 0.0f ? SELU_LAMBDA * x : (SELU_LAMBDA * SELU_ALPHA) * expm1f(x);
    case RELU6:    return fminf(fmaxf(x, 0.0f), 6.0f);
    case REVLEAKY: return x > 0.0f ? x : 0.1f * x;
    case GELU:     return 0.5f * x * (1.0f + tanhf(GELU_A * x + GELU_B * x * x * x));
    case SWISH:    return x * sigmoid(x);
    case MISH:     return x * tanhf(softplus(x));
    case HARD_MISH:
        if (x > 0.0f) return x;
        if (x > -2.0f) return 0.5f * x * x + x;
        return 0.0f;
    default:       return x;
    }
}

__device__ __forceinline__ float gradient(float y, int act)
{
    switch (act) {
    case LOGISTIC: return (1.0f - y) * y;
    case RELU:     return y > 0.0f ? 1.0f : 0.0f;
    case RELIE:    return y > 0.0f ? 1.0f : 0.01f;
    case LINEAR:   return 1.0f;
    case RAMP:     return (y > 0.0f ? 1.0f : 0.0f) + 0.1f;
    case TANH:     return 1.0f - y * y;
    case PLSE:     return (y < 0.0f || y > 1.0f) ? 0.01f : 0.125f;
    case LEAKY:    return y > 0.0f ? 1.0f : 0.1f;
    case ELU:      return y >= 0.0f ? 1.0f : y + 1.0f;
    case LOGGY: {
        const float h = (y + 1.0f) / 2.0f;
        return 2.0f * (1.0f - h) * h;
    }
    case STAIR:    return floorf(y) == y ? 0.0f : 1.0f;
    case HARDTAN:  return (y > -1.0f && y < 1.0f) ? 1.0f : 0.0f;
    case LHTAN:    return (y > 0.0f && y < 1.0f) ? 1.0f : 0.001f;
    case SELU:     return y >= 0.0f ? SELU_LAMBDA : y + SELU_LAMBDA * SELU_ALPHA;
    case RELU6:    return (y > 0.0f && y < 6.0f) ? 1.0f : 0.0f;
    case REVLEAKY: return y > 0.0f ? 1.0f : 0.1f;
    default:       return 1.0f;
    }
}

// The derivative from the input x, for the activations that need it (INPUT_GRADIENT).
__device__ __forceinline__ float gradient_from_input(float x, int act)
{
    switch (act) {
    case GELU: {
        const float t = tanhf(GELU_A * x + GELU_B * x * x * x);
        return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * (GELU_A + 3.0f * GELU_B * x * x);
    }
    case SWISH: {
        const float s = sigmoid(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case MISH: {
        const float sp = softplus(x);
        const float t = tanhf(sp);
        return t + x * (1.0f - t * t) * (1.0f - expf(-sp));
    }
    case HARD_MISH:
        if (x > 0.0f) return 1.0f;
        if (x > -2.0f) return x + 1.0f;
        return 0.0f;
    default:       return 1.0f;
    }
}

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

// Batch norm's forward after its statistics, per element of rows = batch * filters rows:
// v = (x - mean[f]) / (sqrt(var[f]) + 1e-6) (Darknet; eps < 0) or / sqrt(var[f] + eps)
// (the fork), x_norm = v when x_norm is not null, x = act(v * scales[f] + biases[f]). One
// pass for what normalize, a copy, scale_bias, add_bias and the activation did in five;
// each step rounds as its own pass did (no fused multiply-add), so the bits are theirs.
extern "C" __global__ void batchnorm_apply_kernel(float* __restrict__ x, const float* __restrict__ mean,
                                                 const float* __restrict__ variance,
                                                 const float* __restrict__ scales,
                                                 const float* __restrict__ biases,
                                                 int rows, int filters, int spatial, float eps, int act,
                                                 float* __restrict__ x_norm)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= spatial) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const int f = r % filters;
        const long long i = (long long)r * spatial + s;
        const float d = eps < 0.0f ? __fadd_rn(sqrtf(variance[f]), 1e-6f) : sqrtf(__fadd_rn(variance[f], eps));
        const float v = __fdiv_rn(__fsub_rn(x[i], mean[f]), d);
        if (x_norm) x_norm[i] = v;
        x[i] = activate(__fadd_rn(__fmul_rn(v, scales[f]), biases[f]), act);
    }
}

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
