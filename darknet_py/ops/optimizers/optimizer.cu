// Optimizer updates (ops/optimizers/cuda.py launches them; adam.py says which Darknet
// rule each follows), and the 16-bit gradient exchange's packing (distributed/buckets.py).
//
// skip: null, or an int in device memory (fp16's loss scaler's found-inf flag,
// loss_scale.cu) that, when nonzero, makes the update do nothing: a recorded step skips an
// overflowing update without the host looking at the gradients.

#include "../common/x_storage.cuh"

// Adam as both Darknets' GPU builds apply it (adam_update_gpu, src/blas_kernels.cu), its
// seven kernels fused into one pass: each element is rounded as theirs is. Their axpy
// kernels contract y += a*x into an FMA; their scal and mul round the product first.
//   d += -decay * w; m = b1*m + (1-b1)*d; v = b2*v + (1-b2)*d*d;
//   w += rate * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps); d = 0
// step = (learning rate, t), read from device memory so a captured graph takes the
// values written before each replay. decay is decay * images per iteration.
extern "C" __global__ void adam_update_kernel(int n, float* __restrict__ w, float* __restrict__ d,
                                             float* __restrict__ m, float* __restrict__ v,
                                             const float* __restrict__ step, float b1, float b2,
                                             float eps, float decay, const int* __restrict__ skip)
{
    if (skip && *skip) return;
    const float rate = step[0], t = step[1];
    const float m_scale = 1.f - powf(b1, t), v_scale = 1.f - powf(b2, t);
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float wi = w[i];
        const float di = fmaf(-decay, wi, d[i]);
        const float mi = fmaf(1.f - b1, di, __fmul_rn(m[i], b1));
        const float vi = fmaf(1.f - b2, __fmul_rn(di, di), __fmul_rn(v[i], b2));
        m[i] = mi;
        v[i] = vi;
        const float mhat = __fdiv_rn(mi, m_scale);
        const float vhat = __fdiv_rn(vi, v_scale);
        w[i] = __fadd_rn(wi, __fdiv_rn(__fmul_rn(rate, mhat), __fadd_rn(__fsqrt_rn(vhat), eps)));
        d[i] = 0.f;
    }
}

// Darknet's SGD step of one parameter (layers/base.py momentum_update), the three kernels its
// GPU builds run fused into one pass, each element rounded as those kernels round it (blas.cu,
// nvcc's default contraction: axpy's y += a*x is an FMA, scal's product is rounded):
//   with_decay: d += decay * w   (decay = -decay * batch);   w += rate[0] * d;   d *= momentum
// rate read from device memory, as axpy_array reads it.
extern "C" __global__ void sgd_update_kernel(int n, float* __restrict__ w, float* __restrict__ d,
                                            const float* __restrict__ rate, float decay,
                                            int with_decay, float momentum,
                                            const int* __restrict__ skip)
{
    if (skip && *skip) return;
    const float r = *rate;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        float di = d[i];
        float wi = w[i];
        if (with_decay) di = fmaf(decay, wi, di);
        w[i] = fmaf(r, di, wi);
        d[i] = __fmul_rn(di, momentum);
    }
}

// The 16-bit gradient exchange: a bucket of fp32 gradients packed into 16 bits for the
// all-reduce (dst = src * scale, the product in fp32 and rounded once, as NumPy's
// round_scaled), and the sum widened back (dst = widen(src) * scale).
template <class X>
__device__ __forceinline__ void round_scaled_of(const float* __restrict__ src,
                                                typename X::Storage* __restrict__ dst,
                                                long long n, float scale)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = X::rounded(__fmul_rn(src[i], scale));
}

template <class X>
__device__ __forceinline__ void widen_scaled_of(const typename X::Storage* __restrict__ src,
                                                float* __restrict__ dst, long long n,
                                                float scale)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = __fmul_rn(X::widen(src[i]), scale);
}

#define ROUND_SCALED(NAME, X)                                                                \
    extern "C" __global__ void NAME(const float* __restrict__ src,                           \
                                    X::Storage* __restrict__ dst, long long n, float scale)  \
    {                                                                                        \
        round_scaled_of<X>(src, dst, n, scale);                                              \
    }
ROUND_SCALED(round_scaled_f16, XF16)
ROUND_SCALED(round_scaled_bf16, XBF16)

#define WIDEN_SCALED(NAME, X)                                                                \
    extern "C" __global__ void NAME(const X::Storage* __restrict__ src,                      \
                                    float* __restrict__ dst, long long n, float scale)       \
    {                                                                                        \
        widen_scaled_of<X>(src, dst, n, scale);                                              \
    }
WIDEN_SCALED(widen_scaled_f16, XF16)
WIDEN_SCALED(widen_scaled_bf16, XBF16)
