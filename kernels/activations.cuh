// Darknet's activations and their gradients (as functions of the output y, or of the
// input x for the ones that need it), mirroring darknet_py/activations.py, and batch
// norm's forward rounding: what activations.cu and batchnorm.cu (whose backward recomputes
// the forward's values) share. The enum order is ACTIVATIONS' order there: the backend
// passes ACTIVATION_IDS[name] as `act`.
#pragma once

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

// A GEMM epilogue's activation (gemm.cu, gemm_tc.cuh): activate, kept out of line so that
// their many tile instantiations each call one copy rather than inline the whole switch
// (which tripled their compile time), and the same floats as the activation pass.
__device__ __noinline__ float epilogue_activate(float x, int act) { return activate(x, act); }

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

// Batch norm's divisor per channel: Darknet's sqrt(var) + 1e-6 (eps < 0) or the fork's
// sqrt(var + eps), each IEEE operation rounded on its own (the _rn intrinsics are never
// contracted), so batchnorm_apply_kernel and the backward's recompute get the same bits.
__device__ __forceinline__ float batchnorm_divisor(float variance, float eps)
{
    return eps < 0.0f ? __fadd_rn(sqrtf(variance), 1e-6f) : sqrtf(__fadd_rn(variance, eps));
}

// x_norm = (x - mean) / divisor, as NumPy's normalize rounds it.
__device__ __forceinline__ float batchnorm_normalized(float x, float mean, float divisor)
{
    return __fdiv_rn(__fsub_rn(x, mean), divisor);
}

// The activation's input: x_norm * scale + bias, two roundings (scale_bias, add_bias).
__device__ __forceinline__ float batchnorm_scaled(float x_norm, float scale, float bias)
{
    return __fadd_rn(__fmul_rn(x_norm, scale), bias);
}
