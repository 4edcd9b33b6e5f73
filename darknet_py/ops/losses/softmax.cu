// Softmax (Darknet's softmax_cpu layout) and the per-element losses next to it.

// One softmax of n elements x[base + i*stride] into out by a warp (lane: this thread's):
// a max pass, a sum pass, a write pass, each over the lanes.
__device__ __forceinline__ void warp_softmax(const float* x, long long base, int n, long long stride,
                                             float temp, float* out, int lane)
{
    float largest = -INFINITY;
    for (int i = lane; i < n; i += 32) largest = fmaxf(largest, x[base + i * stride] / temp);
    for (int o = 16; o > 0; o >>= 1) largest = fmaxf(largest, __shfl_xor_sync(0xffffffffu, largest, o));
    float sum = 0.0f;
    for (int i = lane; i < n; i += 32) sum += expf(x[base + i * stride] / temp - largest);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    for (int i = lane; i < n; i += 32) {
        const long long j = base + i * stride;
        out[j] = expf(x[j] / temp - largest) / sum;
    }
}

// batch*groups softmaxes of n elements each; instance (b, g) reads
// x[b*batch_offset + g*group_offset + i*stride] for i < n. One warp per instance.
extern "C" __global__ void softmax_kernel(const float* x, int n, int batch, int batch_offset,
                                         int groups, int group_offset, int stride, float temp,
                                         float* out)  // may alias x (in place)
{
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const int instances = batch * groups;
    for (int inst = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; inst < instances; inst += warps) {
        const int b = inst / groups;
        const int g = inst - b * groups;
        warp_softmax(x, (long long)b * batch_offset + (long long)g * group_offset, n, stride, temp,
                     out, threadIdx.x & 31);
    }
}

// A softmax over each group of a class tree: instance (b, g, s) for b < batch, group g,
// position s < spatial reads group_size[g] elements at
// x[b*stride + (group_offset[g] + i)*spatial + s]. One warp per instance, as softmax_kernel.
extern "C" __global__ void softmax_tree_kernel(const float* x, int spatial, int batch, int stride,
                                              float temp, const int* __restrict__ group_offset,
                                              const int* __restrict__ group_size, int groups,
                                              float* out)
{
    const int warps = (gridDim.x * blockDim.x) >> 5;
    const long long instances = (long long)batch * groups * spatial;
    for (long long inst = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; inst < instances; inst += warps) {
        const int s = (int)(inst % spatial);
        const long long bg = inst / spatial;
        const int g = (int)(bg % groups), b = (int)(bg / groups);
        warp_softmax(x, (long long)b * stride + (long long)group_offset[g] * spatial + s,
                     group_size[g], spatial, temp, out, threadIdx.x & 31);
    }
}

// x[i] = 0 where truth[i] == value: outputs without a truth (a softmax tree's groups that
// hold none of an image's classes) give no delta and no loss.
extern "C" __global__ void mask_kernel(int n, float* __restrict__ x, const float* __restrict__ truth,
                                      float value)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        if (truth[i] == value) x[i] = 0.0f;
}

// Cross-entropy after a softmax: error = -t*log(p) where t != 0 (else 0); delta = t - p.
extern "C" __global__ void softmax_x_ent_kernel(int n, const float* __restrict__ pred,
                                               const float* __restrict__ truth,
                                               float* __restrict__ delta, float* __restrict__ error)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float t = truth[i], p = pred[i];
        error[i] = (t != 0.0f) ? -t * logf(p) : 0.0f;
        delta[i] = t - p;
    }
}

// Logistic cross-entropy ([logistic], Darknet's logistic_x_ent_cpu, without the GPU build's
// 1e-7 inside the logs): error = -t*log(p) - (1-t)*log(1-p), delta = t - p.
extern "C" __global__ void logistic_x_ent_kernel(int n, const float* __restrict__ pred,
                                                 const float* __restrict__ truth,
                                                 float* __restrict__ delta, float* __restrict__ error)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float t = truth[i], p = pred[i];
        error[i] = -t * logf(p) - (1.0f - t) * logf(1.0f - p);
        delta[i] = t - p;
    }
}

// Sum-squared error: delta = t - p, error = delta^2.
extern "C" __global__ void l2_kernel(int n, const float* __restrict__ pred, const float* __restrict__ truth,
                                    float* __restrict__ delta, float* __restrict__ error)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float d = truth[i] - pred[i];
        delta[i] = d;
        error[i] = d * d;
    }
}
