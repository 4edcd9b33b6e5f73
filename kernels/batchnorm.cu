// Per-channel ops over arrays laid out batch x filters x spatial: bias and scale,
// batch-norm statistics, normalisation and their backward passes (Darknet's CPU
// formulas, quirks included: see NumpyBackend).
//
// Channel reductions run in two launches so that few channels still fill the
// GPU: channel_sums splits each channel's batch*spatial terms over `parts`
// blocks (grid parts x filters) and writes double partial sums; channel_finalize
// adds each channel's partials in a fixed order (deterministic) and applies the
// op's formula.

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

__device__ __forceinline__ double block_sum(double v)
{
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = 0.0;
    if (warp == 0) {
        if (lane < (int)(blockDim.x >> 5)) v = warp_sums[lane];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    return v;
}

// What channel_sums adds up, for channel f over its batch*spatial elements i:
enum ChannelTerm {
    TERM_A = 0,               // a[i]                      (mean, backward_bias, mean_delta)
    TERM_A_MINUS_MEAN_SQ = 1, // (a[i] - mean[f])^2        (variance)
    TERM_A_TIMES_B = 2,       // a[i] * b[i]               (backward_scale)
    TERM_A_TIMES_B_MINUS_MEAN = 3 // a[i] * (b[i] - mean[f]) (variance_delta)
};

// One thread's share of channel f's terms i = first, first + blockDim.x, ... < end; term
// i is element (i / spatial, f, i % spatial). The (image, position) pair is carried from
// term to term (one division per thread, not per term), and UNROLL terms are loaded
// before any is added, so that several loads are in flight: this pass is bound by memory
// bandwidth (a 64-bit division per term and one load at a time per thread held it to
// ~40%: bench/NOTES.md, R1). The terms are added in the order of i, as a plain loop would.
// SUM_A: also the sum of a[i] alone into sum_a (two reductions for one read of a).
template <int TERM, bool SUM_A>
__device__ __forceinline__ void accumulate_channel_terms(const float* __restrict__ a, const float* __restrict__ b,
                                                    float m, int filters, int spatial,
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
        float t[UNROLL], ta[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            t[u] = ta[u] = 0.0f;
            if (i + (long long)u * step < end) {
                const long long idx = img * image_stride + pos;
                ta[u] = a[idx];
                if (TERM == TERM_A) t[u] = ta[u];
                else if (TERM == TERM_A_MINUS_MEAN_SQ) { const float d = ta[u] - m; t[u] = d * d; }
                else if (TERM == TERM_A_TIMES_B) t[u] = ta[u] * b[idx];
                else t[u] = ta[u] * (b[idx] - m);
            }
            img += step_images;
            pos += step_pos;
            if (pos >= spatial) { pos -= spatial; ++img; }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            sum += (double)t[u];
            if (SUM_A) sum_a += (double)ta[u];
        }
    }
}

template <int TERM>
__device__ __forceinline__ void channel_thread_sums(bool with_a, const float* __restrict__ a,
                                                    const float* __restrict__ b, float m, int filters,
                                                    int spatial, long long first, long long end,
                                                    double& sum, double& sum_a)
{
    if (with_a) accumulate_channel_terms<TERM, true>(a, b, m, filters, spatial, first, end, sum, sum_a);
    else accumulate_channel_terms<TERM, false>(a, b, m, filters, spatial, first, end, sum, sum_a);
}

// partial[f * parts + p] = block p's sum of channel f's terms; partial_a (unless null)
// likewise for the sum of a alone.
extern "C" __global__ void channel_sums(const float* __restrict__ a, const float* __restrict__ b,
                                       const float* __restrict__ mean, int term,
                                       int batch, int filters, int spatial, int parts,
                                       double* __restrict__ partial, double* __restrict__ partial_a)
{
    const int f = blockIdx.y;
    const int p = blockIdx.x;
    const long long count = (long long)batch * spatial;
    const long long chunk = (count + parts - 1) / parts;
    const long long begin = p * chunk + threadIdx.x;
    const long long end = min(count, p * chunk + chunk);
    const float m = (term == TERM_A_MINUS_MEAN_SQ || term == TERM_A_TIMES_B_MINUS_MEAN) ? mean[f] : 0.0f;
    const float* af = a + (long long)f * spatial;
    const float* bf = b ? b + (long long)f * spatial : b;
    const bool with_a = partial_a != nullptr;
    double s = 0.0, sa = 0.0;
    switch (term) {
    case TERM_A: channel_thread_sums<TERM_A>(with_a, af, bf, m, filters, spatial, begin, end, s, sa); break;
    case TERM_A_MINUS_MEAN_SQ: channel_thread_sums<TERM_A_MINUS_MEAN_SQ>(with_a, af, bf, m, filters, spatial, begin, end, s, sa); break;
    case TERM_A_TIMES_B: channel_thread_sums<TERM_A_TIMES_B>(with_a, af, bf, m, filters, spatial, begin, end, s, sa); break;
    default: channel_thread_sums<TERM_A_TIMES_B_MINUS_MEAN>(with_a, af, bf, m, filters, spatial, begin, end, s, sa); break;
    }
    s = block_sum(s);
    if (threadIdx.x == 0) partial[(long long)f * parts + p] = s;
    if (with_a) {
        __syncthreads();   // block_sum's shared words are about to be reused
        sa = block_sum(sa);
        if (threadIdx.x == 0) partial_a[(long long)f * parts + p] = sa;
    }
}

// What channel_finalize does with a channel's sum S (count = batch*spatial), S first
// multiplied by scales[f] when scales is not null (the delta summed was not yet scaled):
enum ChannelFinal {
    FINAL_MEAN = 0,           // out[f] = S / count
    FINAL_VARIANCE = 1,       // out[f] = S / (count - 1)
    FINAL_ACCUMULATE = 2,     // out[f] += S
    FINAL_MEAN_DELTA = 3,     // out[f] = S * -1 / sqrt(var[f] + 1e-5)
    FINAL_VARIANCE_DELTA = 4  // out[f] = S * -0.5 * (var[f] + 1e-5)^-1.5
};

extern "C" __global__ void channel_finalize(const double* __restrict__ partial, int parts, int filters,
                                           int final_op, long long count,
                                           const float* __restrict__ variance,
                                           const float* __restrict__ scales, float* __restrict__ out)
{
    const int f = blockIdx.x * blockDim.x + threadIdx.x;
    if (f >= filters) return;
    double s = 0.0;
    for (int p = 0; p < parts; ++p) s += partial[(long long)f * parts + p];
    if (scales) s *= (double)scales[f];
    switch (final_op) {
    case FINAL_MEAN: out[f] = (float)(s / (double)count); break;
    case FINAL_VARIANCE: out[f] = (float)(s / (double)(count - 1)); break;
    case FINAL_ACCUMULATE: out[f] = (float)((double)out[f] + s); break;
    case FINAL_MEAN_DELTA: out[f] = (float)(s * (-1.0 / sqrt((double)variance[f] + 1e-5))); break;
    default: out[f] = (float)(s * -0.5 * pow((double)variance[f] + 1e-5, -1.5)); break;
    }
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
extern "C" __global__ void normalize_delta_kernel(const float* __restrict__ x, const float* __restrict__ mean,
                                                 const float* __restrict__ variance,
                                                 const float* __restrict__ mean_delta,
                                                 const float* __restrict__ variance_delta,
                                                 int rows, int filters, int spatial, float n,
                                                 const float* __restrict__ scales,
                                                 float* __restrict__ delta, int fork)
{
    const int s = blockIdx.x * blockDim.x + threadIdx.x;
    if (s >= spatial) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        const int f = r % filters;
        const long long i = (long long)r * spatial + s;
        const float xc = x[i] - mean[f];
        const float d = scales ? __fmul_rn(delta[i], scales[f]) : delta[i];
        const float divisor = fork ? sqrtf(variance[f]) + 1e-5f : sqrtf(variance[f] + 1e-5f);
        delta[i] = d / divisor
                 + variance_delta[f] * 2.0f * xc / n
                 + mean_delta[f] / n;
    }
}
