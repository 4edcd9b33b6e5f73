// Binary convolutions (binary=1, xnor=1 in [convolutional]): Darknet's binarize_weights and
// binarize_cpu rules, run in float32 (the convolution itself is the ordinary GEMM).

// Per filter f (size weights each): binary = +mean where the weight is > 0, else -mean,
// mean = the filter's mean absolute weight (summed in order, as Darknet's loop).
extern "C" __global__ void binarize_weights_kernel(const float* __restrict__ weights, int n,
                                                   int size, float* __restrict__ binary)
{
    for (int f = blockIdx.x * blockDim.x + threadIdx.x; f < n; f += gridDim.x * blockDim.x) {
        const float* w = weights + (long long)f * size;
        float* out = binary + (long long)f * size;
        float mean = 0.0f;
        for (int i = 0; i < size; ++i) mean = __fadd_rn(mean, fabsf(w[i]));
        mean = __fdiv_rn(mean, (float)size);
        for (int i = 0; i < size; ++i) out[i] = w[i] > 0.0f ? mean : -mean;
    }
}

// xnor's input: +1 where x > 0, else -1 (Darknet's CPU rule; its GPU kernel sends 0 to +1).
extern "C" __global__ void binarize_kernel(int n, const float* __restrict__ x,
                                           float* __restrict__ binary)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        binary[i] = x[i] > 0.0f ? 1.0f : -1.0f;
}
