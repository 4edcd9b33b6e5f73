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

// Under fp16/bf16 the activations batch norm's passes apply (the layers that keep a 16-bit
// x) in fast forms, each from one hardware exponential (__expf) and approximate divisions:
// within a few units in the last place of fp32 where the exact forms above cost three
// library calls (mish's expf, log1pf and tanhf), far under the 2^-11 / 2^-8 of the 16-bit x
// they start from (mish's library calls made these passes cost more than their bytes).
// The others are the exact forms.
//   mish(x) = x tanh(softplus(x)) = x n / (n + 2) with n = e^x (e^x + 2),
//   mish'(x) = t + x (1 - t^2) sigmoid(x), t = n / (n + 2), 1 - t = 2 / (n + 2),
// both x (and 1) above the fork's threshold, as the exact forms give there.
__device__ __forceinline__ float sigmoid_fast(float x)
{
    return __fdividef(1.0f, 1.0f + __expf(-x));   // 1 / inf = 0 below -88
}

__device__ __forceinline__ float activate_fast(float x, int act)
{
    switch (act) {
    case LOGISTIC: return sigmoid_fast(x);
    case SWISH:    return x * sigmoid_fast(x);
    case MISH: {
        if (x > MISH_THRESHOLD) return x;
        const float e = __expf(x);
        const float n = e * (e + 2.0f);
        return x * __fdividef(n, n + 2.0f);
    }
    default:       return activate(x, act);
    }
}

__device__ __forceinline__ float gradient_from_input_fast(float x, int act)
{
    switch (act) {
    case SWISH: {
        const float s = sigmoid_fast(x);
        return s * (1.0f + x * (1.0f - s));
    }
    case MISH: {
        if (x > MISH_THRESHOLD) return 1.0f;
        const float e = __expf(x);
        const float n = e * (e + 2.0f);
        const float inverse = __fdividef(1.0f, n + 2.0f);
        const float t = n * inverse, one_minus_t = 2.0f * inverse;
        return t + x * (one_minus_t * (1.0f + t)) * __fdividef(e, 1.0f + e);
    }
    default:       return gradient_from_input(x, act);
    }
}

// A channel's batch norm constants and the per-element steps its passes share (forward,
// rebuild, the backward's recompute). EXACT (an fp32 x: fp32 and tf32): each IEEE step
// rounded on its own, no contraction, the C code's bits. Else (a 16-bit x: fp16, bf16):
// x_norm by the divisor's reciprocal, scale and bias in one fused multiply-add, the fast
// activations above.
template <bool EXACT>
struct BatchnormChannel {
    float mean, divisor, inverse, scale, bias;
    __device__ __forceinline__ BatchnormChannel(float mean_, float variance, float eps,
                                                float scale_, float bias_)
        : mean(mean_), divisor(batchnorm_divisor(variance, eps)), scale(scale_), bias(bias_)
    {
        inverse = EXACT ? 0.0f : __frcp_rn(divisor);
    }
    __device__ __forceinline__ float normalized(float x) const
    {
        if constexpr (EXACT) return batchnorm_normalized(x, mean, divisor);
        else return (x - mean) * inverse;
    }
    __device__ __forceinline__ float scaled(float x_norm) const
    {
        if constexpr (EXACT) return batchnorm_scaled(x_norm, scale, bias);
        else return fmaf(x_norm, scale, bias);
    }
    static __device__ __forceinline__ float activated(float v, int act)
    {
        if constexpr (EXACT) return activate(v, act);
        else return activate_fast(v, act);
    }
    static __device__ __forceinline__ float input_gradient(float v, int act)
    {
        if constexpr (EXACT) return gradient_from_input(v, act);
        else return gradient_from_input_fast(v, act);
    }
};

// v as it stands, hidden from the compiler's contraction: a value one kernel stores and
// another recomputes is rounded to fp32 on its own in both, never fused into the
// multiply-add of what reads it (an inline asm the optimiser cannot look through).
__device__ __forceinline__ float as_stored(float v)
{
    asm("mov.b32 %0, %0;" : "+f"(v));
    return v;
}

// A batch-normalised layer's output from its x (widened to fp32): act(x_norm * scale + bias)
// in the channel's steps. batchnorm_rebuild_kernel stores it; batchnorm_activation_rows (a
// 16-bit x) recomputes it for the gradients from the output, the same fp32 bits.
template <bool EXACT>
__device__ __forceinline__ float batchnorm_rebuilt(float x, const BatchnormChannel<EXACT>& c,
                                                   int act)
{
    return as_stored(BatchnormChannel<EXACT>::activated(c.scaled(c.normalized(x)), act));
}
