// How a batch-normalised layer keeps x (the normalisation's input, read by its backward
// only): as fp32 or, under fp16/bf16, as 16-bit storage. batchnorm_apply_kernel (activations.cu)
// writes it, round_copy_* and the backward's kernels (batchnorm.cu) read or write it through
// these: X{p}[i] widens the stored value to fp32 (exact), X::rounded(v) makes the stored bits
// of v (precision.round_to: fp16 and bf16 to nearest even). One source per kernel: templates
// over X. The same types serve a layer's 16-bit outputs (issue 26: storage_zeros' arrays that
// route, shortcut, maxpool, upsample and batchnorm_rebuild read and write): X::widen(s) of
// one stored value, and the fp32 twin (XF32: widen and rounded the identity) keeps the bits
// of the kernels that took float arrays before.
#pragma once

struct XF32 {
    using Storage = float;
    static constexpr bool exact = true;   // the passes' arithmetic: BatchnormChannel<exact>
    const float* __restrict__ p;
    __device__ __forceinline__ float operator[](long long i) const { return p[i]; }
    static __device__ __forceinline__ float widen(float s) { return s; }
    static __device__ __forceinline__ float rounded(float v) { return v; }
};
struct XF16 {
    using Storage = unsigned short;
    static constexpr bool exact = false;
    const unsigned short* __restrict__ p;
    __device__ __forceinline__ float operator[](long long i) const { return widen(p[i]); }
    static __device__ __forceinline__ float widen(unsigned short s)
    {
        float r;
        asm("cvt.f32.f16 %0, %1;" : "=f"(r) : "h"(s));
        return r;
    }
    // v rounded to nearest even: overflow to infinity, subnormals kept.
    static __device__ __forceinline__ unsigned short rounded(float v)
    {
        unsigned short h;
        asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
};
struct XBF16 {   // bf16: the upper 16 bits of an fp32
    using Storage = unsigned short;
    static constexpr bool exact = false;
    const unsigned short* __restrict__ p;
    __device__ __forceinline__ float operator[](long long i) const { return widen(p[i]); }
    static __device__ __forceinline__ float widen(unsigned short s)
    {
        return __uint_as_float((unsigned)s << 16);
    }
    static __device__ __forceinline__ unsigned short rounded(float v)   // nearest even
    {
        unsigned short h;
        asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
        return h;
    }
};
