// The NHWC 16-bit layer outputs of issue 42 (ops/nhwc/numpy.py is the reference): channel
// ch of pixel p of a tensor is element p * pitch + offset + ch of a 16-bit array, the
// pitch a multiple of 8. A writer of c channels at `offset` writes them and then zeros to
// the next multiple of 8 of offset + c (the padding channels a convolution reads).
//
// One thread per (pixel, group of 8 channels): group g covers the array's channels
// 8g .. 8g + 7 of the pixel. Where the host found every access aligned (`vector`: the
// arrays 16-byte aligned, pitches and offsets multiples of 8) a group is one 16-byte load
// per source pixel and one 16-byte store; otherwise each channel goes on its own. Values
// only moved keep their stored bits; arithmetic is fp32, one IEEE operation at a time (no
// fused multiply-adds: the NumPy reference's roundings), rounded once at the store.

#include "../common/activations.cuh"
#include "../common/x_storage.cuh"

typedef unsigned short Half16;   // fp16 or bf16 bits (X says which)

struct Lanes {
    Half16 v[8];
};

__device__ __forceinline__ Lanes load_lanes(const Half16* __restrict__ p, bool vector, int valid)
{
    Lanes l;
    if (vector) {
        const uint4 q = *reinterpret_cast<const uint4*>(p);
        l.v[0] = (Half16)(q.x & 0xFFFFu); l.v[1] = (Half16)(q.x >> 16);
        l.v[2] = (Half16)(q.y & 0xFFFFu); l.v[3] = (Half16)(q.y >> 16);
        l.v[4] = (Half16)(q.z & 0xFFFFu); l.v[5] = (Half16)(q.z >> 16);
        l.v[6] = (Half16)(q.w & 0xFFFFu); l.v[7] = (Half16)(q.w >> 16);
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) l.v[i] = i < valid ? p[i] : (Half16)0;
    }
    return l;
}

// One pixel's group: `first` is the tensor channel of lane 0 (negative lanes lie before
// the tensor's offset and are not this writer's), lanes at or past c are zero.
struct Group {
    long long pixel;
    int first;
};

// The group of thread index i: pixels * groups of them, the groups of a pixel together
// (neighbouring threads write neighbouring bytes).
__device__ __forceinline__ Group group_of(long long i, int groups, int out_offset)
{
    Group g;
    g.pixel = i / groups;
    g.first = (int)(i - g.pixel * groups) * 8 + (out_offset & ~7) - out_offset;
    return g;
}

// Store 8 lanes at tensor channels first.. of the pixel at `base` (its offset applied):
// lanes before channel 0 untouched, lanes at or past c written as zero.
__device__ __forceinline__ void store_lanes(Half16* __restrict__ base, int first, int c,
                                            bool vector, Lanes l)
{
#pragma unroll
    for (int i = 0; i < 8; ++i)
        if (first + i >= c) l.v[i] = 0;
    if (vector) {
        uint4 q;
        q.x = l.v[0] | ((unsigned)l.v[1] << 16);
        q.y = l.v[2] | ((unsigned)l.v[3] << 16);
        q.z = l.v[4] | ((unsigned)l.v[5] << 16);
        q.w = l.v[6] | ((unsigned)l.v[7] << 16);
        *reinterpret_cast<uint4*>(base + first) = q;
    } else {
#pragma unroll
        for (int i = 0; i < 8; ++i)
            if (first + i >= 0) base[first + i] = l.v[i];
    }
}

// Lanes of tensor channels first.. of pixel `pixel` of (x, pitch, offset); lanes before
// channel 0 or past c read as zero (the scalar path; the vector path's first is >= 0 and
// its lanes past c are dropped at the store).
__device__ __forceinline__ Lanes read_group(const Half16* __restrict__ x, long long pixel,
                                            int pitch, int offset, int first, int c, bool vector)
{
    const Half16* p = x + pixel * pitch + offset + first;
    if (vector) return load_lanes(p, true, 8);
    Lanes l;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int ch = first + i;
        l.v[i] = (ch >= 0 && ch < c) ? p[i] : (Half16)0;
    }
    return l;
}

// ---- copies: a [route]'s parts ---------------------------------------------------------
extern "C" __global__ void nhwc_copy_channels_kernel(const Half16* __restrict__ x, long long pixels,
                                                     int c, int x_pitch, int x_offset,
                                                     Half16* __restrict__ out, int out_pitch,
                                                     int out_offset, int groups, int vector)
{
    const long long total = pixels * groups;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const Group g = group_of(i, groups, out_offset);
        const Lanes l = read_group(x, g.pixel, x_pitch, x_offset, g.first, c, vector);
        store_lanes(out + g.pixel * out_pitch + out_offset, g.first, c, vector, l);
    }
}

// ---- maxpool (inference: no indexes) ----------------------------------------------------
// maxpool_forward_of's windows and test, per lane: the first image cell, then only a
// strictly larger value; a window without image cells gives -inf.
template <class X>
__device__ __forceinline__ void nhwc_maxpool_of(const Half16* __restrict__ x, int batch, int c,
                                                int h, int w, int x_pitch, int x_offset, int size,
                                                int stride_x, int stride_y, int padding,
                                                int out_h, int out_w, Half16* __restrict__ out,
                                                int out_pitch, int out_offset, int groups,
                                                bool vector)
{
    const long long total = (long long)batch * out_h * out_w * groups;
    const int off = padding / 2;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const Group g = group_of(i, groups, out_offset);
        const int ox = (int)(g.pixel % out_w);
        const long long t = g.pixel / out_w;
        const int oy = (int)(t % out_h);
        const long long b = t / out_h;
        float best[8];
        Lanes kept;
        bool found = false;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            best[k] = -INFINITY;
            kept.v[k] = X::rounded(-INFINITY);
        }
        for (int dy = 0; dy < size; ++dy) {
            const int y = oy * stride_y - off + dy;
            if (y < 0 || y >= h) continue;
            for (int dx = 0; dx < size; ++dx) {
                const int xx = ox * stride_x - off + dx;
                if (xx < 0 || xx >= w) continue;
                const Lanes l =
                    read_group(x, (b * h + y) * w + xx, x_pitch, x_offset, g.first, c, vector);
#pragma unroll
                for (int k = 0; k < 8; ++k) {
                    const float v = X::widen(l.v[k]);
                    if (!found || v > best[k]) {
                        best[k] = v;
                        kept.v[k] = l.v[k];
                    }
                }
                found = true;
            }
        }
        store_lanes(out + g.pixel * out_pitch + out_offset, g.first, c, vector, kept);
    }
}

#define NHWC_MAXPOOL(NAME, X)                                                                     \
    extern "C" __global__ void NAME(const Half16* __restrict__ x, int batch, int c, int h, int w, \
                                    int x_pitch, int x_offset, int size, int stride_x,            \
                                    int stride_y, int padding, int out_h, int out_w,              \
                                    Half16* __restrict__ out, int out_pitch, int out_offset,      \
                                    int groups, int vector)                                       \
    {                                                                                             \
        nhwc_maxpool_of<X>(x, batch, c, h, w, x_pitch, x_offset, size, stride_x, stride_y,        \
                           padding, out_h, out_w, out, out_pitch, out_offset, groups, vector);    \
    }
NHWC_MAXPOOL(nhwc_maxpool_kernel_f16, XF16)
NHWC_MAXPOOL(nhwc_maxpool_kernel_bf16, XBF16)

// ---- upsample (nearest, forward) --------------------------------------------------------
template <class X>
__device__ __forceinline__ void nhwc_upsample_of(const Half16* __restrict__ x, int batch, int c,
                                                 int h, int w, int x_pitch, int x_offset,
                                                 int stride, float scale,
                                                 Half16* __restrict__ out, int out_pitch,
                                                 int out_offset, int groups, bool vector)
{
    const int out_w = w * stride, out_h = h * stride;
    const long long total = (long long)batch * out_h * out_w * groups;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const Group g = group_of(i, groups, out_offset);
        const int ox = (int)(g.pixel % out_w);
        const long long t = g.pixel / out_w;
        const int oy = (int)(t % out_h);
        const long long b = t / out_h;
        Lanes l = read_group(x, (b * h + oy / stride) * w + ox / stride, x_pitch, x_offset,
                             g.first, c, vector);
        if (scale != 1.0f) {
#pragma unroll
            for (int k = 0; k < 8; ++k) l.v[k] = X::rounded(__fmul_rn(X::widen(l.v[k]), scale));
        }
        store_lanes(out + g.pixel * out_pitch + out_offset, g.first, c, vector, l);
    }
}

#define NHWC_UPSAMPLE(NAME, X)                                                                    \
    extern "C" __global__ void NAME(const Half16* __restrict__ x, int batch, int c, int h, int w, \
                                    int x_pitch, int x_offset, int stride, float scale,           \
                                    Half16* __restrict__ out, int out_pitch, int out_offset,      \
                                    int groups, int vector)                                       \
    {                                                                                             \
        nhwc_upsample_of<X>(x, batch, c, h, w, x_pitch, x_offset, stride, scale, out, out_pitch,  \
                            out_offset, groups, vector);                                          \
    }
NHWC_UPSAMPLE(nhwc_upsample_kernel_f16, XF16)
NHWC_UPSAMPLE(nhwc_upsample_kernel_bf16, XBF16)

// ---- shortcut ---------------------------------------------------------------------------
// out = activation(s1 * x + s2 * add) on the channels x and add share (add_c of them),
// activation(x) on x's others; a linear one copies those bits.
template <class X>
__device__ __forceinline__ void nhwc_shortcut_of(const Half16* __restrict__ x, int x_pitch,
                                                 int x_offset, const Half16* __restrict__ add,
                                                 int add_c, int add_pitch, int add_offset,
                                                 long long pixels, int c, float s1, float s2,
                                                 int act, Half16* __restrict__ out,
                                                 int out_pitch, int out_offset, int groups,
                                                 bool vector)
{
    const long long total = pixels * groups;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const Group g = group_of(i, groups, out_offset);
        Lanes l = read_group(x, g.pixel, x_pitch, x_offset, g.first, c, vector);
        // add's lanes: 16-byte loads only where all 8 are add's channels
        const bool whole = vector && g.first + 8 <= add_c;
        const Lanes a = read_group(add, g.pixel, add_pitch, add_offset, g.first, add_c, whole);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int ch = g.first + k;
            if (ch < 0 || ch >= c) continue;
            if (ch < add_c) {
                float v = __fadd_rn(__fmul_rn(s1, X::widen(l.v[k])), __fmul_rn(s2, X::widen(a.v[k])));
                if (act != LINEAR) v = activate(v, act);
                l.v[k] = X::rounded(v);
            } else if (act != LINEAR) {
                l.v[k] = X::rounded(activate(X::widen(l.v[k]), act));
            }
        }
        store_lanes(out + g.pixel * out_pitch + out_offset, g.first, c, vector, l);
    }
}

#define NHWC_SHORTCUT(NAME, X)                                                                    \
    extern "C" __global__ void NAME(const Half16* __restrict__ x, int x_pitch, int x_offset,      \
                                    const Half16* __restrict__ add, int add_c, int add_pitch,     \
                                    int add_offset, long long pixels, int c, float s1, float s2,  \
                                    int act, Half16* __restrict__ out, int out_pitch,             \
                                    int out_offset, int groups, int vector)                       \
    {                                                                                             \
        nhwc_shortcut_of<X>(x, x_pitch, x_offset, add, add_c, add_pitch, add_offset, pixels, c,   \
                            s1, s2, act, out, out_pitch, out_offset, groups, vector);             \
    }
NHWC_SHORTCUT(nhwc_shortcut_kernel_f16, XF16)
NHWC_SHORTCUT(nhwc_shortcut_kernel_bf16, XBF16)

// ---- the boundaries ---------------------------------------------------------------------
// fp32 NCHW -> 16-bit NHWC, rounded. One thread per (pixel, group), the pixels of a group
// together (neighbouring threads read neighbouring floats of each channel plane).
template <class X>
__device__ __forceinline__ void nhwc_from_nchw_of(const float* __restrict__ x, int batch, int c,
                                                  long long spatial, Half16* __restrict__ out,
                                                  int out_pitch, int out_offset, int groups,
                                                  bool vector)
{
    const long long pixels = (long long)batch * spatial;
    const long long total = pixels * groups;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int group = (int)(i / pixels);
        const long long pixel = i - group * pixels;
        const long long b = pixel / spatial, s = pixel - b * spatial;
        const int first = group * 8 + (out_offset & ~7) - out_offset;
        Lanes l;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int ch = first + k;
            l.v[k] = (ch >= 0 && ch < c) ? X::rounded(x[(b * c + ch) * spatial + s]) : (Half16)0;
        }
        store_lanes(out + pixel * out_pitch + out_offset, first, c, vector, l);
    }
}

// 16-bit NHWC -> fp32 NCHW, widened (exact); the pixels of a group together.
template <class X>
__device__ __forceinline__ void nhwc_to_nchw_of(const Half16* __restrict__ x, int batch, int c,
                                                long long spatial, int x_pitch, int x_offset,
                                                float* __restrict__ out, int groups, bool vector)
{
    const long long pixels = (long long)batch * spatial;
    const long long total = pixels * groups;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        const int group = (int)(i / pixels);
        const long long pixel = i - group * pixels;
        const long long b = pixel / spatial, s = pixel - b * spatial;
        const Lanes l = read_group(x, pixel, x_pitch, x_offset, group * 8, c, vector);
#pragma unroll
        for (int k = 0; k < 8; ++k) {
            const int ch = group * 8 + k;
            if (ch < c) out[(b * c + ch) * spatial + s] = X::widen(l.v[k]);
        }
    }
}

#define NHWC_FROM_NCHW(NAME, X)                                                                   \
    extern "C" __global__ void NAME(const float* __restrict__ x, int batch, int c,                \
                                    long long spatial, Half16* __restrict__ out, int out_pitch,   \
                                    int out_offset, int groups, int vector)                       \
    {                                                                                             \
        nhwc_from_nchw_of<X>(x, batch, c, spatial, out, out_pitch, out_offset, groups, vector);   \
    }
NHWC_FROM_NCHW(nhwc_from_nchw_kernel_f16, XF16)
NHWC_FROM_NCHW(nhwc_from_nchw_kernel_bf16, XBF16)

#define NHWC_TO_NCHW(NAME, X)                                                                     \
    extern "C" __global__ void NAME(const Half16* __restrict__ x, int batch, int c,               \
                                    long long spatial, int x_pitch, int x_offset,                 \
                                    float* __restrict__ out, int groups, int vector)              \
    {                                                                                             \
        nhwc_to_nchw_of<X>(x, batch, c, spatial, x_pitch, x_offset, out, groups, vector);         \
    }
NHWC_TO_NCHW(nhwc_to_nchw_kernel_f16, XF16)
NHWC_TO_NCHW(nhwc_to_nchw_kernel_bf16, XBF16)
