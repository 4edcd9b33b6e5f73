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
    SELU = 13
};

constexpr float SELU_LAMBDA = 1.0507f;
constexpr float SELU_ALPHA = 1.6732f;

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

// delta[i] *= act'(y[i]) for i < n
extern "C" __global__ void gradient_array(const float* __restrict__ y, int n, int act,
                                         float* __restrict__ delta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        delta[i] *= gradient(y[i], act);
}
