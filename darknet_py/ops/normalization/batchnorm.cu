// Per-channel ops over arrays laid out batch x filters x spatial: bias and scale,
// batch-norm statistics, normalisation and their backward passes (Darknet's CPU
// formulas, quirks included: see NumpyBackend).
//
// Channel reductions run in two launches so that few channels still fill the
// GPU: channel_sums splits each channel's batch*spatial terms over `parts`
// blocks (grid parts x filters) and writes double partial sums; channel_finalize
// adds each channel's partials in a fixed order (deterministic) and applies the
// op's formula (channel_finalize_wide: a block a channel, for the row kernels' many
// partials).

#include "../common/activations.cuh"
#include "../common/common.cuh"
#include "../common/x_storage.cuh"

// ---- x kept at 16 bits (fp16/bf16 training): x_storage.cuh's XF32/XF16/XBF16 -------------
// dst[i] = src[i] rounded to X's 16 bits (x kept for the backward).
#define ROUND_COPY(NAME, X)                                                                      \
    extern "C" __global__ void NAME(const float* __restrict__ src,                               \
                                    unsigned short* __restrict__ dst, long long n)               \
    {                                                                                            \
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;              \
             i += (long long)gridDim.x * blockDim.x)                                             \
            dst[i] = X::rounded(src[i]);                                                         \
    }
ROUND_COPY(round_copy_f16, XF16)
ROUND_COPY(round_copy_bf16, XBF16)

// Row-wise kernels: x (blocks and threads) spans a row's spatial elements, y the
// batch*filters rows; a 1-wide row (connected layers) still fills whole warps.
// out[row, s] += biases[row % n]
extern "C" __global__ void add_bias(float* __restrict__ out, const float* __restrict__ biases,
                                   int rows, int n, int size)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= size) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y)
        out[(long long)r * size + s] += biases[r % n];
}

// out[row, s] *= scales[row % n]
extern "C" __global__ void scale_bias(float* __restrict__ out, const float* __restrict__ scales,
                                     int rows, int n, int size)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= size) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y)
        out[(long long)r * size + s] *= scales[r % n];
}

// What channel_sums adds up, for channel f over its batch*spatial elements i:
enum ChannelTerm {
    TERM_A = 0,               // a[i]                      (mean, backward_bias, mean_delta)
    TERM_A_MINUS_MEAN_SQ = 1, // (a[i] - mean[f])^2        (variance)
    TERM_A_TIMES_B = 2,       // a[i] * b[i]               (backward_scale)
    TERM_A_TIMES_B_MINUS_MEAN = 3 // a[i] * (b[i] - mean[f]) (variance_delta)
};

// Channel f's term at element idx (f's arrays already offset): `a` gets what the sum_a
// reduction adds (the term's first operand), `t` the term itself.
template <int TERM, class B>
struct PlainTerm {
    using Value = float;   // what a term is computed in (each added to a double sum)
    static constexpr bool writes = false;   // stores nothing: its loads may run ahead
    const float* __restrict__ a;
    B b;
    float m;
    __device__ __forceinline__ void operator()(long long idx, float& ta, float& t) const
    {
        ta = a[idx];
        if (TERM == TERM_A) t = ta;
        else if (TERM == TERM_A_MINUS_MEAN_SQ) { const float d = ta - m; t = d * d; }
        else if (TERM == TERM_A_TIMES_B) t = ta * b[idx];
        else t = ta * (b[idx] - m);
    }
};

// One thread's share of channel f's terms i = first, first + blockDim.x, ... < end; term
// i is element (i / spatial, f, i % spatial). The (image, position) pair is carried from
// term to term (one division per thread, not per term), and UNROLL terms are loaded
// before any is added, so that several loads are in flight: this pass is bound by memory
// bandwidth (a 64-bit division per term and one load at a time per thread held it to
// ~40% of it). The terms are added in the order of i, as a plain loop would.
// SUM_A: also the sum of the terms' first operands into sum_a (two reductions, one read).
template <bool SUM_A, typename Term>
__device__ __forceinline__ void accumulate_channel_terms(const Term& term, int filters, int spatial,
                                                    long long first, long long end,
                                                    double& sum, double& sum_a)
{
    constexpr int UNROLL = 4;
    const int step = blockDim.x;
    const int step_images = step / spatial;
    const int step_pos = step - step_images * spatial;
    const long long image_stride = (long long)filters * spatial;
    long long img = first / spatial;
    int pos = (int)(first - img * spatial);
    for (long long i = first; i < end; i += UNROLL * step) {
        typename Term::Value t[UNROLL], ta[UNROLL];
        if constexpr (Term::writes) {
            // A term that stores (delta) would keep the compiler from loading the next
            // terms before that store (the same array): all UNROLL terms' loads go first,
            // then their math and stores, so that they are in flight together
            // (batchnorm_activation_sums 14.3 -> 12.9 ms a yolov4 pass).
            // Terms that store nothing keep the one-phase loop below: the two-phase one
            // made channel_moments' double terms 40% slower (0.17 -> 0.25 ms).
            typename Term::Loaded in[UNROLL];
            long long at[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                at[u] = img * image_stride + pos;
                if (i + (long long)u * step < end) in[u] = term.load(at[u]);
                img += step_images;
                pos += step_pos;
                if (pos >= spatial) { pos -= spatial; ++img; }
            }
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                t[u] = ta[u] = 0;
                if (i + (long long)u * step < end) term.apply(at[u], in[u], ta[u], t[u]);
            }
        } else {
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                t[u] = ta[u] = 0;
                if (i + (long long)u * step < end) term(img * image_stride + pos, ta[u], t[u]);
                img += step_images;
                pos += step_pos;
                if (pos >= spatial) { pos -= spatial; ++img; }
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            sum += (double)t[u];
            if (SUM_A) sum_a += (double)ta[u];
        }
    }
}

template <typename Term>
__device__ __forceinline__ void channel_thread_sums(bool with_a, const Term& term, int filters,
                                                    int spatial, long long first, long long end,
                                                    double& sum, double& sum_a)
{
    if (with_a) accumulate_channel_terms<true>(term, filters, spatial, first, end, sum, sum_a);
    else accumulate_channel_terms<false>(term, filters, spatial, first, end, sum, sum_a);
}

// Block p's share of channel f's terms: [p * chunk, min(count, (p + 1) * chunk)).
struct ChannelPart {
    long long begin, end;
    __device__ ChannelPart(int batch, int spatial, int parts)
    {
        const long long count = (long long)batch * spatial;
        const long long chunk = (count + parts - 1) / parts;
        begin = blockIdx.x * chunk + threadIdx.x;
        end = min(count, blockIdx.x * chunk + chunk);
    }
};

// Block sums of s (and sa) into partial[f * parts + p] (partial_a unless null).
__device__ __forceinline__ void store_channel_partials(double s, double sa, int parts,
                                                       double* __restrict__ partial,
                                                       double* __restrict__ partial_a)
{
    const long long at = (long long)blockIdx.y * parts + blockIdx.x;
    s = block_sum(s);
    if (threadIdx.x == 0) partial[at] = s;
    if (partial_a) {
        sa = block_sum(sa);
        if (threadIdx.x == 0) partial_a[at] = sa;
    }
}

// partial[f * parts + p] = block p's sum of channel f's terms; partial_a (unless null)
// likewise for the sum of a alone. B: how b is read (XF32; XF16/XBF16 for a kept 16-bit x,
// the `_x_f16`/`_x_bf16` kernels).
template <class B>
__device__ __forceinline__ void channel_sums_of(const float* __restrict__ a, B b,
                                                const float* __restrict__ mean, int term,
                                                int batch, int filters, int spatial, int parts,
                                                double* __restrict__ partial,
                                                double* __restrict__ partial_a)
{
    const int f = blockIdx.y;
    const ChannelPart part(batch, spatial, parts);
    const float m = (term == TERM_A_MINUS_MEAN_SQ || term == TERM_A_TIMES_B_MINUS_MEAN) ? mean[f] : 0.0f;
    const float* af = a + (long long)f * spatial;
    const B bf{b.p ? b.p + (long long)f * spatial : b.p};
    const bool with_a = partial_a != nullptr;
    const long long begin = part.begin, end = part.end;
    double s = 0.0, sa = 0.0;
    switch (term) {
    case TERM_A: channel_thread_sums(with_a, PlainTerm<TERM_A, B>{af, bf, m}, filters, spatial, begin, end, s, sa); break;
    case TERM_A_MINUS_MEAN_SQ: channel_thread_sums(with_a, PlainTerm<TERM_A_MINUS_MEAN_SQ, B>{af, bf, m}, filters, spatial, begin, end, s, sa); break;
    case TERM_A_TIMES_B: channel_thread_sums(with_a, PlainTerm<TERM_A_TIMES_B, B>{af, bf, m}, filters, spatial, begin, end, s, sa); break;
    default: channel_thread_sums(with_a, PlainTerm<TERM_A_TIMES_B_MINUS_MEAN, B>{af, bf, m}, filters, spatial, begin, end, s, sa); break;
    }
    store_channel_partials(s, sa, parts, partial, partial_a);
}

#define CHANNEL_SUMS(NAME, B, BTYPE)                                                              \
    extern "C" __global__ void NAME(const float* __restrict__ a, const BTYPE* __restrict__ b,     \
                                    const float* __restrict__ mean, int term, int batch,          \
                                    int filters, int spatial, int parts,                          \
                                    double* __restrict__ partial, double* __restrict__ partial_a) \
    {                                                                                             \
        channel_sums_of(a, B{b}, mean, term, batch, filters, spatial, parts, partial, partial_a); \
    }
CHANNEL_SUMS(channel_sums, XF32, float)
CHANNEL_SUMS(channel_sums_x_f16, XF16, unsigned short)
CHANNEL_SUMS(channel_sums_x_bf16, XBF16, unsigned short)

// A training batch's statistics in one read of x (mean_variance, tf32/fp16/bf16 layers):
// partial_a gets the sums of x, partial those of x^2, both in double (the square of a
// float is exact in a double), for mean_variance_finalize.
struct MomentTerm {
    using Value = double;
    static constexpr bool writes = false;
    const float* __restrict__ a;
    __device__ __forceinline__ void operator()(long long idx, double& ta, double& t) const
    {
        ta = (double)a[idx];
        t = ta * ta;
    }
};

extern "C" __global__ void channel_moments(const float* __restrict__ x, int batch, int filters,
                                          int spatial, int parts, double* __restrict__ partial,
                                          double* __restrict__ partial_a)
{
    const ChannelPart part(batch, spatial, parts);
    double s = 0.0, sa = 0.0;
    accumulate_channel_terms<true>(MomentTerm{x + (long long)blockIdx.y * spatial}, filters,
                                   spatial, part.begin, part.end, s, sa);
    store_channel_partials(s, sa, parts, partial, partial_a);
}

// mean[f] = S / n rounded to float (as FINAL_MEAN) and Darknet's unbiased variance around
// that float mean m, from the sums S of x (partial_a) and Q of x^2 (partial):
// sum (x - m)^2 = Q - 2 m S + n m^2, / (n - 1), in double; clamped at 0 (the exact value is
// never negative, the rounded one might be: a constant channel).
__device__ __forceinline__ void store_mean_variance(double q, double s, long long count, int f,
                                                    float* __restrict__ mean,
                                                    float* __restrict__ variance)
{
    const float m = (float)(s / (double)count);
    const double md = m, n = (double)count;
    const double v = (q - 2.0 * md * s + n * md * md) / (n - 1.0);
    mean[f] = m;
    variance[f] = (float)(v < 0.0 ? 0.0 : v);   // NaN (n = 1) stays NaN, as FINAL_VARIANCE's
}

extern "C" __global__ void mean_variance_finalize(const double* __restrict__ partial,
                                                 const double* __restrict__ partial_a, int parts,
                                                 int filters, long long count,
                                                 float* __restrict__ mean,
                                                 float* __restrict__ variance)
{
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= filters) return;
    double q = 0.0, s = 0.0;
    for (int p = 0; p < parts; ++p) {
        q += partial[(long long)f * parts + p];
        s += partial_a[(long long)f * parts + p];
    }
    store_mean_variance(q, s, count, f, mean, variance);
}

// Channel f's partial[f * parts + p] added by a whole block (the _wide finalizes): thread t
// adds p = t, t + blockDim.x, ... in that order (consecutive threads, consecutive partials:
// coalesced), then block_sum's fixed tree; valid in thread 0. The same bits every run (for a
// given blockDim), not those of the one-thread loop: another order of the additions.
__device__ __forceinline__ double wide_channel_sum(const double* __restrict__ partial, int parts,
                                                   int f)
{
    const double* __restrict__ own = partial + (long long)f * parts;
    double s = 0.0;
    for (int p = threadIdx.x; p < parts; p += blockDim.x) s += own[p];
    return block_sum(s);
}

// mean_variance_finalize with a block a channel (grid: filters blocks), for many parts.
extern "C" __global__ void mean_variance_finalize_wide(const double* __restrict__ partial,
                                                      const double* __restrict__ partial_a,
                                                      int parts, int filters, long long count,
                                                      float* __restrict__ mean,
                                                      float* __restrict__ variance)
{
    const int f = blockIdx.x;
    if (f >= filters) return;   // the whole block: block_sum's barriers stay uniform
    const double q = wide_channel_sum(partial, parts, f);
    const double s = wide_channel_sum(partial_a, parts, f);
    if (threadIdx.x == 0) store_mean_variance(q, s, count, f, mean, variance);
}

// Batch norm's backward up to its parameter gradients, in one pass, for a layer that keeps
// x but not x_norm nor the activation's input: per element, x_norm = (x - mean) /
// divisor and the activation's input x_norm * scale + bias are recomputed as
// batchnorm_apply_kernel computed them (activations.cuh's BatchnormChannel: exact for an
// fp32 x, the fast steps for a 16-bit one), delta *= the activation's
// gradient (from the output y, or from that input where from_input), and the sums of
// delta (partial_a, unless null: the biases' update) and delta * x_norm (partial: the
// scales') go out as channel_sums' TERM_A_TIMES_B would give them for the stored arrays:
// the same terms, rounded the same, added in the same order. A 16-bit x (not X::exact)
// never reads y: the output, perhaps itself kept at 16 bits (issue 26), is recomputed from x
// as batchnorm_rebuild_kernel makes it (batchnorm_rebuilt), the fp32 bits that kernel's
// fp32 output held (y may be null then).
template <class X>
struct BatchnormActivationTerm {
    using Value = float;
    using Channel = BatchnormChannel<X::exact>;   // an fp32 x: the forward's exact steps
    X x;
    const float* __restrict__ y;
    float* __restrict__ delta;
    Channel channel;
    int act, from_input;
    static constexpr bool writes = true;   // delta: loads first (accumulate_channel_terms)
    struct Loaded {
        float x, delta, y;
    };
    __device__ __forceinline__ Loaded load(long long idx) const
    {
        return {x[idx], delta[idx],
                (!X::exact || from_input || act == LINEAR) ? 0.0f : y[idx]};
    }
    __device__ __forceinline__ void apply(long long idx, const Loaded& in, float& g,
                                          float& t) const
    {
        const float x_norm = channel.normalized(in.x);
        g = in.delta;
        if (from_input)
            g = __fmul_rn(g, Channel::input_gradient(channel.scaled(x_norm), act));
        else if (act != LINEAR)
            g = __fmul_rn(g, gradient(X::exact ? in.y : batchnorm_rebuilt(in.x, channel, act),
                                      act));
        delta[idx] = g;
        t = __fmul_rn(g, x_norm);
    }
};

template <class X>
__device__ __forceinline__ void batchnorm_activation_sums_of(X x, const float* __restrict__ y,
                                                             const float* __restrict__ mean,
                                                             const float* __restrict__ variance,
                                                             const float* __restrict__ scales,
                                                             const float* __restrict__ biases,
                                                             int batch, int filters, int spatial,
                                                             float eps, int act, int from_input,
                                                             int parts, float* __restrict__ delta,
                                                             double* __restrict__ partial,
                                                             double* __restrict__ partial_a)
{
    const int f = blockIdx.y;
    const ChannelPart part(batch, spatial, parts);
    const long long offset = (long long)f * spatial;
    const BatchnormActivationTerm<X> term{
        X{x.p + offset}, y + offset, delta + offset,
        BatchnormChannel<X::exact>(mean[f], variance[f], eps, scales[f], biases[f]), act,
        from_input};
    double s = 0.0, sa = 0.0;
    channel_thread_sums(partial_a != nullptr, term, filters, spatial, part.begin, part.end, s, sa);
    store_channel_partials(s, sa, parts, partial, partial_a);
}

#define BATCHNORM_ACTIVATION_SUMS(NAME, X, XTYPE)                                                 \
    extern "C" __global__ void NAME(const XTYPE* __restrict__ x, const float* __restrict__ y,     \
                                    const float* __restrict__ mean,                               \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ scales,                             \
                                    const float* __restrict__ biases, int batch, int filters,     \
                                    int spatial, float eps, int act, int from_input, int parts,   \
                                    float* __restrict__ delta, double* __restrict__ partial,      \
                                    double* __restrict__ partial_a)                               \
    {                                                                                             \
        batchnorm_activation_sums_of(X{x}, y, mean, variance, scales, biases, batch, filters,     \
                                     spatial, eps, act, from_input, parts, delta, partial,        \
                                     partial_a);                                                  \
    }
BATCHNORM_ACTIVATION_SUMS(batchnorm_activation_sums, XF32, float)   // a 16-bit x: the rows below

// The row kernels (a 16-bit x; no per-term index arithmetic): row r = image b * filters + f holds
// `spatial` contiguous elements of channel f, cut into `chunks` pieces of `chunk` elements
// (the last one shorter). A piece goes to ROW_THREADS threads (32, 64, 128 or 256: 256 /
// ROW_THREADS pieces a block), and its sums to partial[(f * batch + b) * chunks + piece]:
// channel f's batch * chunks parts together, for channel_finalize(_wide) and
// mean_variance_finalize(_wide), which add them in a fixed order.
template <int ROW_THREADS>
struct RowPiece {
    bool live;          // false: past the last row (the grid's tail)
    int row, part, f;   // the piece's row, its place in the row, the row's channel
    __device__ __forceinline__ RowPiece(int batch, int filters, int chunks)
    {
        const long long piece =
            (long long)blockIdx.x * (256 / ROW_THREADS) + threadIdx.x / ROW_THREADS;
        live = piece < (long long)batch * filters * chunks;
        row = (int)(piece / chunks);
        part = (int)(piece - (long long)row * chunks);
        f = live ? row % filters : 0;
    }
    __device__ __forceinline__ long long offset(int spatial, int chunk) const   // its first element
    {
        return (long long)row * spatial + (long long)part * chunk;
    }
    __device__ __forceinline__ int length(int spatial, int chunk) const
    {
        return min(chunk, spatial - part * chunk);
    }
    __device__ __forceinline__ long long at(int batch, int filters, int chunks) const   // its sums'
    {
        return ((long long)f * batch + row / filters) * chunks + part;
    }
};

// The row kernels' entries: Rows<N>::run(args...) with N = row_threads (32, 64 or 128;
// anything else 256). The arguments pass by value as a direct call's would (a generic lambda
// capturing them gave the same instructions but two of them in another order).
template <template <int> class Rows, class... Args>
__device__ __forceinline__ void with_row_threads(int row_threads, Args... args)
{
    switch (row_threads) {
    case 32: Rows<32>::run(args...); break;
    case 64: Rows<64>::run(args...); break;
    case 128: Rows<128>::run(args...); break;
    default: Rows<256>::run(args...); break;
    }
}

// A piece's threads' sums, valid in its first thread (lane 0): within each warp, then
// (pieces wider than a warp) across them, in a fixed order. Every thread of the block calls it.
template <int ROW_THREADS>
__device__ __forceinline__ void piece_sums(double& s, double& sa, int lane)
{
    for (int o = 16; o > 0; o >>= 1) {
        s += __shfl_down_sync(0xffffffffu, s, o);
        sa += __shfl_down_sync(0xffffffffu, sa, o);
    }
    if constexpr (ROW_THREADS > 32) {
        __shared__ double warp_s[8], warp_sa[8];
        const int warp = threadIdx.x / 32;
        if (threadIdx.x % 32 == 0) {
            warp_s[warp] = s;
            warp_sa[warp] = sa;
        }
        __syncthreads();
        if (lane == 0) {
            for (int w = 1; w < ROW_THREADS / 32; ++w) {
                s += warp_s[warp + w];
                sa += warp_sa[warp + w];
            }
        }
    }
}

// batchnorm_activation_sums row by row, for a 16-bit x (the fast steps): a piece's
// threads sweep it UNROLL terms at a time, loading them all before any delta is stored,
// and leave its two sums (partial_a unless null). Against the channel-wise pass: no
// (image, position) arithmetic a term, the loads contiguous, and many blocks of equal work
// (no wave left nearly empty).
template <int ROW_THREADS, class X>
__device__ __forceinline__ void batchnorm_activation_rows_of(
    X x, const float* __restrict__ y, const float* __restrict__ mean,
    const float* __restrict__ variance, const float* __restrict__ scales,
    const float* __restrict__ biases, int batch, int filters, int spatial, float eps, int act,
    int from_input, int chunk, int chunks, float* __restrict__ delta,
    double* __restrict__ partial, double* __restrict__ partial_a)
{
    constexpr int UNROLL = 4;
    const RowPiece<ROW_THREADS> piece(batch, filters, chunks);
    const int lane = threadIdx.x % ROW_THREADS;
    double s = 0.0, sa = 0.0;
    if (piece.live) {
        const int f = piece.f, end = piece.length(spatial, chunk);
        const long long offset = piece.offset(spatial, chunk);
        const BatchnormActivationTerm<X> term{
            X{x.p + offset}, y + offset, delta + offset,
            BatchnormChannel<X::exact>(mean[f], variance[f], eps, scales[f], biases[f]), act,
            from_input};
        for (int i = lane; i < end; i += UNROLL * ROW_THREADS) {
            typename BatchnormActivationTerm<X>::Loaded in[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                if (i + u * ROW_THREADS < end) in[u] = term.load(i + u * ROW_THREADS);
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {
                if (i + u * ROW_THREADS >= end) break;
                float g, t;
                term.apply(i + u * ROW_THREADS, in[u], g, t);
                s += (double)t;
                sa += (double)g;
            }
        }
    }
    piece_sums<ROW_THREADS>(s, sa, lane);
    if (piece.live && lane == 0) {
        const long long at = piece.at(batch, filters, chunks);
        partial[at] = s;
        if (partial_a) partial_a[at] = sa;
    }
}

template <int ROW_THREADS>
struct BatchnormActivationRows {
    template <class... Args>
    static __device__ __forceinline__ void run(Args... args)
    {
        batchnorm_activation_rows_of<ROW_THREADS>(args...);
    }
};

#define BATCHNORM_ACTIVATION_ROWS(NAME, X, XTYPE)                                                 \
    extern "C" __global__ void NAME(const XTYPE* __restrict__ x, const float* __restrict__ y,     \
                                    const float* __restrict__ mean,                               \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ scales,                             \
                                    const float* __restrict__ biases, int batch, int filters,     \
                                    int spatial, float eps, int act, int from_input,              \
                                    int row_threads, int chunk, int chunks,                       \
                                    float* __restrict__ delta,                                    \
                                    double* __restrict__ partial, double* __restrict__ partial_a) \
    {                                                                                             \
        with_row_threads<BatchnormActivationRows>(row_threads, X{x}, y, mean, variance, scales,  \
                                                  biases, batch, filters, spatial, eps, act,     \
                                                  from_input, chunk, chunks, delta, partial,     \
                                                  partial_a);                                    \
    }
BATCHNORM_ACTIVATION_ROWS(batchnorm_activation_rows_x_f16, XF16, unsigned short)
BATCHNORM_ACTIVATION_ROWS(batchnorm_activation_rows_x_bf16, XBF16, unsigned short)

// channel_moments row by row, for a 16-bit x (the statistics of the x a convolution wrote
// straight into 16-bit storage): a piece's sums of x (partial_a) and of x^2 (partial),
// in double as channel_moments' (the square of a widened 16-bit value is exact), for
// mean_variance_finalize(_wide). One 2-byte load a term, so UNROLL = 8 of them are issued
// before any is added (the activation rows keep 4 terms of three loads in flight): the
// pass is bound by its loads.
template <int ROW_THREADS, class X>
__device__ __forceinline__ void channel_moments_rows_of(X x, int batch, int filters, int spatial,
                                                        int chunk, int chunks,
                                                        double* __restrict__ partial,
                                                        double* __restrict__ partial_a)
{
    constexpr int UNROLL = 8;
    const RowPiece<ROW_THREADS> piece(batch, filters, chunks);
    const int lane = threadIdx.x % ROW_THREADS;
    double s = 0.0, sa = 0.0;
    if (piece.live) {
        const X own{x.p + piece.offset(spatial, chunk)};
        const int end = piece.length(spatial, chunk);
        for (int i = lane; i < end; i += UNROLL * ROW_THREADS) {
            float v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; ++u)
                v[u] = i + u * ROW_THREADS < end ? own[i + u * ROW_THREADS] : 0.0f;
#pragma unroll
            for (int u = 0; u < UNROLL; ++u) {   // the zeros past the end add nothing
                const double d = v[u];
                sa += d;
                s += d * d;
            }
        }
    }
    piece_sums<ROW_THREADS>(s, sa, lane);
    if (piece.live && lane == 0) {
        const long long at = piece.at(batch, filters, chunks);
        partial[at] = s;
        partial_a[at] = sa;
    }
}

template <int ROW_THREADS>
struct ChannelMomentsRows {
    template <class... Args>
    static __device__ __forceinline__ void run(Args... args)
    {
        channel_moments_rows_of<ROW_THREADS>(args...);
    }
};

#define CHANNEL_MOMENTS_ROWS(NAME, X, XTYPE)                                                      \
    extern "C" __global__ void NAME(const XTYPE* __restrict__ x, int batch, int filters,          \
                                    int spatial, int row_threads, int chunk, int chunks,          \
                                    double* __restrict__ partial, double* __restrict__ partial_a) \
    {                                                                                             \
        with_row_threads<ChannelMomentsRows>(row_threads, X{x}, batch, filters, spatial, chunk,  \
                                             chunks, partial, partial_a);                        \
    }
CHANNEL_MOMENTS_ROWS(channel_moments_rows_x_f16, XF16, unsigned short)
CHANNEL_MOMENTS_ROWS(channel_moments_rows_x_bf16, XBF16, unsigned short)

// What channel_finalize does with a channel's sum S (count = batch*spatial), S first
// multiplied by scales[f] when scales is not null (the delta summed was not yet scaled);
// sum_out[f] = S itself (unless null; before scales), and nothing else where out is null:
enum ChannelFinal {
    FINAL_MEAN = 0,           // out[f] = S / count
    FINAL_VARIANCE = 1,       // out[f] = S / (count - 1)
    FINAL_ACCUMULATE = 2,     // out[f] += S
    FINAL_MEAN_DELTA = 3,     // out[f] = S * -1 / sqrt(var[f] + 1e-5)
    FINAL_VARIANCE_DELTA = 4  // out[f] = S * -0.5 * (var[f] + 1e-5)^-1.5
};

// The op on channel f's sum s (both finalizes alike).
__device__ __forceinline__ void apply_channel_final(double s, int f, int final_op, long long count,
                                                    const float* __restrict__ variance,
                                                    const float* __restrict__ scales,
                                                    float* __restrict__ out,
                                                    float* __restrict__ sum_out)
{
    if (sum_out) sum_out[f] = (float)s;
    if (!out) return;
    if (scales) s *= (double)scales[f];
    switch (final_op) {
    case FINAL_MEAN: out[f] = (float)(s / (double)count); break;
    case FINAL_VARIANCE: out[f] = (float)(s / (double)(count - 1)); break;
    case FINAL_ACCUMULATE: out[f] = (float)((double)out[f] + s); break;
    case FINAL_MEAN_DELTA: out[f] = (float)(s * (-1.0 / sqrt((double)variance[f] + 1e-5))); break;
    default: out[f] = (float)(s * -0.5 * pow((double)variance[f] + 1e-5, -1.5)); break;
    }
}

extern "C" __global__ void channel_finalize(const double* __restrict__ partial, int parts, int filters,
                                           int final_op, long long count,
                                           const float* __restrict__ variance,
                                           const float* __restrict__ scales, float* __restrict__ out,
                                           float* __restrict__ sum_out)
{
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= filters) return;
    double s = 0.0;
    for (int p = 0; p < parts; ++p) s += partial[(long long)f * parts + p];
    apply_channel_final(s, f, final_op, count, variance, scales, out, sum_out);
}

// channel_finalize with a block a channel (grid: filters blocks; wide_channel_sum), for the
// row kernels' batch x pieces partials a channel (a thread adding 1376
// of them one after another made channel_finalize 0.41 -> 1.71 ms a yolov4 fp16 pass).
extern "C" __global__ void channel_finalize_wide(const double* __restrict__ partial, int parts,
                                                int filters, int final_op, long long count,
                                                const float* __restrict__ variance,
                                                const float* __restrict__ scales,
                                                float* __restrict__ out,
                                                float* __restrict__ sum_out)
{
    const int f = blockIdx.x;
    if (f >= filters) return;   // the whole block: block_sum's barriers stay uniform
    const double s = wide_channel_sum(partial, parts, f);
    if (threadIdx.x == 0)
        apply_channel_final(s, f, final_op, count, variance, scales, out, sum_out);
}

// mean_delta and variance_delta from the sums of this backward's g (the delta after the
// activation's gradient, before the scales) that batchnorm_activation_sums left:
// delta_sum[f] = sum g and delta_x_norm_sum[f] = sum g * x_norm, x_norm = (x - m) / D with
// D the forward's divisor (batchnorm_divisor: sqrt(v) + 1e-6, or sqrt(v + eps)). With
// d = scale * g the delta batchnorm_delta's reduction would sum,
//   mean_delta     = sum d * -1 / sqrt(v + 1e-5)                = -scale * sum g / sqrt(v + 1e-5)
//   variance_delta = sum d * (x - m) * -1/2 * (v + 1e-5)^-3/2
//                  = -1/2 * scale * (v + 1e-5)^-3/2 * D * sum g * x_norm,
// since sum g (x - m) = D sum g x_norm: the same sums up to each x_norm's rounding (a float
// division: half an ulp of each term). One thread per channel, in double, as
// channel_finalize's FINAL_MEAN_DELTA and FINAL_VARIANCE_DELTA.
extern "C" __global__ void batchnorm_delta_factors(const float* __restrict__ delta_sum,
                                                  const float* __restrict__ delta_x_norm_sum,
                                                  const float* __restrict__ variance,
                                                  const float* __restrict__ scales, int filters,
                                                  float eps, float* __restrict__ mean_delta,
                                                  float* __restrict__ variance_delta)
{
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= filters) return;
    const double v = (double)variance[f] + 1e-5, scale = scales[f];
    const double divisor = batchnorm_divisor(variance[f], eps);
    mean_delta[f] = (float)((double)delta_sum[f] * scale * (-1.0 / sqrt(v)));
    variance_delta[f] = (float)((double)delta_x_norm_sum[f] * scale * divisor * -0.5 * pow(v, -1.5));
}

// x = (x - mean[f]) / (sqrt(variance[f]) + 1e-6), per row as add_bias.
extern "C" __global__ void normalize_kernel(float* __restrict__ x, const float* __restrict__ mean,
                                           const float* __restrict__ variance,
                                           int rows, int filters, int spatial)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= spatial) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const int f = r % filters;
        float* p = x + (long long)r * spatial + s;
        *p = (*p - mean[f]) / (sqrtf(variance[f]) + 1e-6f);
    }
}

// x = (x - mean[f]) / sqrt(variance[f] + eps): the AlexeyAB fork's forward.
extern "C" __global__ void normalize_sqrt_eps_kernel(float* __restrict__ x, const float* __restrict__ mean,
                                                    const float* __restrict__ variance,
                                                    int rows, int filters, int spatial, float eps)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= spatial) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const int f = r % filters;
        float* p = x + (long long)r * spatial + s;
        *p = (*p - mean[f]) / sqrtf(variance[f] + eps);
    }
}

// delta = delta / sqrt(var + 1e-5) + variance_delta * 2 * (x - mean) / n + mean_delta / n,
// n = batch * spatial; delta is first multiplied by scales[f] (rounded, as scale_bias
// would) when scales is not null. fork: the AlexeyAB fork's CPU divisor sqrt(var) + 1e-5
// in place of sqrt(var + 1e-5).
// X: how x is read (XF32; XF16/XBF16 for a kept 16-bit x, the `_x_f16`/`_x_bf16` kernels).
template <class X>
__device__ __forceinline__ void normalize_delta_of(X x, const float* __restrict__ mean,
                                                   const float* __restrict__ variance,
                                                   const float* __restrict__ mean_delta,
                                                   const float* __restrict__ variance_delta,
                                                   int rows, int filters, int spatial, float n,
                                                   const float* __restrict__ scales,
                                                   float* __restrict__ delta, int fork)
{
    // Several elements of a row a thread, the channel's constants worked out once for them
    // (as batchnorm_apply_of: fewer sqrts and divisions); each is what the per-element expression
    // d / divisor + variance_delta * 2 * xc / n + mean_delta / n rounds to, left to right.
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const int f = r % filters;
        const float m = mean[f], scale = scales ? scales[f] : 1.0f;
        const float divisor = fork ? sqrtf(variance[f]) + 1e-5f : sqrtf(variance[f] + 1e-5f);
        const float twice_variance_delta = variance_delta[f] * 2.0f;
        const float mean_term = mean_delta[f] / n;
        // A 16-bit x (fp16/bf16): multiplications by the two divisors' reciprocals and
        // fused multiply-adds in place of the exact steps (activations.cuh, BatchnormChannel).
        const float inverse = X::exact ? 0.0f : __frcp_rn(divisor);
        const float x_factor = X::exact ? 0.0f : twice_variance_delta / n;
        const long long row = (long long)r * spatial;
        for (int s = blockIdx.x * blockDim.x + threadIdx.x; s < spatial;
             s += gridDim.x * blockDim.x) {
            const long long i = row + s;
            const float xc = x[i] - m;
            const float d = scales ? __fmul_rn(delta[i], scale) : delta[i];
            if constexpr (X::exact)
                delta[i] = __fadd_rn(__fadd_rn(__fdiv_rn(d, divisor),
                                               __fdiv_rn(__fmul_rn(twice_variance_delta, xc), n)),
                                     mean_term);
            else
                delta[i] = fmaf(d, inverse, fmaf(x_factor, xc, mean_term));
        }
    }
}

#define NORMALIZE_DELTA(NAME, X, XTYPE)                                                           \
    extern "C" __global__ void NAME(const XTYPE* __restrict__ x, const float* __restrict__ mean,  \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ mean_delta,                         \
                                    const float* __restrict__ variance_delta, int rows,           \
                                    int filters, int spatial, float n,                            \
                                    const float* __restrict__ scales, float* __restrict__ delta,  \
                                    int fork)                                                     \
    {                                                                                             \
        normalize_delta_of(X{x}, mean, variance, mean_delta, variance_delta, rows, filters,       \
                           spatial, n, scales, delta, fork);                                      \
    }
NORMALIZE_DELTA(normalize_delta_kernel, XF32, float)
NORMALIZE_DELTA(normalize_delta_kernel_x_f16, XF16, unsigned short)
NORMALIZE_DELTA(normalize_delta_kernel_x_bf16, XBF16, unsigned short)

// normalize_delta_of's fast steps (a 16-bit x) eight elements a thread, flat over the rows:
// 16-byte loads of x and delta, the channel's constants for the first of the eight and again
// where they cross into the next row (as batchnorm_rebuild_eights_of: half the time).
// The same values as normalize_delta_of, bit for bit. Needs x and delta 16-byte aligned and
// total a multiple of 8.
template <class X>
__device__ __forceinline__ void normalize_delta_eights_of(
    const unsigned short* __restrict__ x, const float* __restrict__ mean,
    const float* __restrict__ variance, const float* __restrict__ mean_delta,
    const float* __restrict__ variance_delta, long long total, int filters, int spatial, float n,
    const float* __restrict__ scales, float* __restrict__ delta, int fork)
{
    const long long first = ((long long)blockIdx.x * blockDim.x + threadIdx.x) * 8;
    if (first >= total) return;
    const uint4 loaded_x = *reinterpret_cast<const uint4*>(x + first);
    const unsigned short* xs = reinterpret_cast<const unsigned short*>(&loaded_x);
    float4 d[2] = {reinterpret_cast<const float4*>(delta + first)[0],
                   reinterpret_cast<const float4*>(delta + first)[1]};
    float* ds = reinterpret_cast<float*>(d);
    const long long row = first / spatial;
    int s = (int)(first - row * spatial);
    int f = (int)(row % filters);
    float m = 0.0f, scale = 1.0f, inverse = 0.0f, x_factor = 0.0f, mean_term = 0.0f;
    auto channel = [&]() {
        m = mean[f];
        scale = scales ? scales[f] : 1.0f;
        const float divisor = fork ? sqrtf(variance[f]) + 1e-5f : sqrtf(variance[f] + 1e-5f);
        inverse = __frcp_rn(divisor);
        x_factor = variance_delta[f] * 2.0f / n;
        mean_term = mean_delta[f] / n;
    };
    channel();
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        if (s == spatial) {   // the next row: its channel
            s = 0;
            f = f + 1 == filters ? 0 : f + 1;
            channel();
        }
        const float xc = X::widen(xs[k]) - m;
        const float g = scales ? __fmul_rn(ds[k], scale) : ds[k];
        ds[k] = fmaf(g, inverse, fmaf(x_factor, xc, mean_term));
        ++s;
    }
    reinterpret_cast<float4*>(delta + first)[0] = d[0];
    reinterpret_cast<float4*>(delta + first)[1] = d[1];
}

#define NORMALIZE_DELTA_EIGHTS(NAME, X)                                                           \
    extern "C" __global__ void NAME(const unsigned short* __restrict__ x,                         \
                                    const float* __restrict__ mean,                               \
                                    const float* __restrict__ variance,                           \
                                    const float* __restrict__ mean_delta,                         \
                                    const float* __restrict__ variance_delta, long long total,    \
                                    int filters, int spatial, float n,                            \
                                    const float* __restrict__ scales,                             \
                                    float* __restrict__ delta, int fork)                          \
    {                                                                                             \
        normalize_delta_eights_of<X>(x, mean, variance, mean_delta, variance_delta, total,        \
                                     filters, spatial, n, scales, delta, fork);                   \
    }
NORMALIZE_DELTA_EIGHTS(normalize_delta_eights_x_f16, XF16)
NORMALIZE_DELTA_EIGHTS(normalize_delta_eights_x_bf16, XBF16)
