// fp16 training's loss scaler on the device (precision.py's LossScaler launches these through
// ops/optimizers/cuda.py): its state never leaves the GPU, so a whole training step, update
// included, is one recorded graph whatever the scale does.
//
//   scales = (scale, 1/scale)           float32
//   counts = (found_inf, clean, skipped) int32
//
// The update buffers are reached through a table of (pointer, size, first block) triples
// (int64), one per buffer, in the order of the network's update_buffers: one launch covers
// every buffer, each block taking a chunk of one buffer.

// The table entry whose chunks block b belongs to: the last one whose first block is <= b
// (an empty buffer owns no blocks; its successor starts where it does and is found instead).
__device__ __forceinline__ int table_entry(const long long* __restrict__ table, int entries,
                                           long long b)
{
    int lo = 0, hi = entries - 1;
    while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (table[3 * mid + 2] <= b)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

// Elements a thread takes in a chunk: all loaded before any is stored, so the loads of a
// thread are in flight together.
#define CHUNK_PER_THREAD 8

// x *= factor[0]: the heads' deltas times the scale, read from device memory so a recorded
// step takes the scale of the moment it replays.
extern "C" __global__ void scale_by_kernel(int n, const float* __restrict__ factor,
                                           float* __restrict__ x)
{
    const float f = *factor;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = __fmul_rn(x[i], f);
}

// Every update buffer checked for inf/NaN (counts[0] = 1 where one is found; the caller zeroes
// it first) and multiplied by 1/scale. A step found non-finite is skipped and its buffers
// zeroed later, so what the multiplication leaves in them then does not matter.
extern "C" __global__ void unscale_check_kernel(const long long* __restrict__ table, int entries,
                                                long long chunk, const float* __restrict__ scales,
                                                int* __restrict__ counts)
{
    const long long b = blockIdx.x;
    const int e = table_entry(table, entries, b);
    float* __restrict__ x = reinterpret_cast<float*>(table[3 * e]);
    const long long n = table[3 * e + 1];
    const long long start = (b - table[3 * e + 2]) * chunk + threadIdx.x;
    const float inverse = scales[1];
    float v[CHUNK_PER_THREAD];
#pragma unroll
    for (int k = 0; k < CHUNK_PER_THREAD; k++) {
        const long long i = start + (long long)k * blockDim.x;
        v[k] = i < n ? x[i] : 0.f;
    }
    int bad = 0;
#pragma unroll
    for (int k = 0; k < CHUNK_PER_THREAD; k++) {
        const long long i = start + (long long)k * blockDim.x;
        bad |= !isfinite(v[k]);
        if (i < n) x[i] = __fmul_rn(v[k], inverse);
    }
    if (__syncthreads_or(bad) && threadIdx.x == 0) counts[0] = 1;
}

// After the update: the buffers back in scaled units (momentum's history times the new
// scale), or zeroed when the step was skipped (its gradients and history dropped).
extern "C" __global__ void rescale_or_zero_kernel(const long long* __restrict__ table,
                                                  int entries, long long chunk,
                                                  const float* __restrict__ scales,
                                                  const int* __restrict__ counts)
{
    const long long b = blockIdx.x;
    const int e = table_entry(table, entries, b);
    float* __restrict__ x = reinterpret_cast<float*>(table[3 * e]);
    const long long n = table[3 * e + 1];
    const long long start = (b - table[3 * e + 2]) * chunk + threadIdx.x;
    if (counts[0]) {
#pragma unroll
        for (int k = 0; k < CHUNK_PER_THREAD; k++) {
            const long long i = start + (long long)k * blockDim.x;
            if (i < n) x[i] = 0.f;
        }
        return;
    }
    const float scale = scales[0];
    float v[CHUNK_PER_THREAD];
#pragma unroll
    for (int k = 0; k < CHUNK_PER_THREAD; k++) {
        const long long i = start + (long long)k * blockDim.x;
        v[k] = i < n ? x[i] : 0.f;
    }
#pragma unroll
    for (int k = 0; k < CHUNK_PER_THREAD; k++) {
        const long long i = start + (long long)k * blockDim.x;
        if (i < n) x[i] = __fmul_rn(v[k], scale);
    }
}

// The step's bookkeeping, one thread: a skipped step counts, restarts the clean run and (dynamic)
// halves the scale down to 1; a clean one counts, and (dynamic) doubles the scale after every
// growth_interval clean updates in a row. A static scale never moves (its inverse was written by
// the host, as the host scaler computed it). A dynamic one's inverse is 1/scale rounded once to
// float, which is what the host scaler's double 1.0 / scale rounded to float gave for a scale
// held in float (a double division rounds to the same float for float operands).
extern "C" __global__ void loss_scale_step_kernel(float* __restrict__ scales,
                                                  int* __restrict__ counts, int dynamic,
                                                  int growth_interval)
{
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    float scale = scales[0];
    if (counts[0]) {
        counts[2] += 1;
        counts[1] = 0;
        if (dynamic) scale = fmaxf(1.f, __fmul_rn(scale, 0.5f));
    } else {
        counts[1] += 1;
        if (dynamic && counts[1] % growth_interval == 0) scale = __fmul_rn(scale, 2.f);
    }
    if (dynamic && scale != scales[0]) {
        scales[0] = scale;
        scales[1] = __fdiv_rn(1.f, scale);
    }
}
