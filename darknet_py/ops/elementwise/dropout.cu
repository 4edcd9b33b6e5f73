// Training dropout with a counter-based draw: rand[i] is a 32-bit integer hash of
// (seed, i), so no RNG state lives on the GPU and the NumPy backend
// (numpy_backend.uniform_hash) draws the very same numbers.

// uniform in [0, 1): the top 24 bits of the hash of i + offset, where
// offset = seed * 0x9E3779B9 mod 2^32. Exact in float (24-bit mantissa).
__device__ __forceinline__ float uniform_hash(unsigned int i, unsigned int offset)
{
    unsigned int v = i + offset;
    v ^= v >> 16;
    v *= 0x7FEB352Du;
    v ^= v >> 15;
    v *= 0x846CA68Bu;
    v ^= v >> 16;
    return (float)(v >> 8) * (1.0f / 16777216.0f);
}

// rand[i] = uniform_hash(i); x[i] = rand[i] < prob ? 0 : x[i] * scale, with the seed
// step_seed[0] + layer_seed (mod 2^32): the step's part is read from device memory, so a
// captured graph draws the mask of the step written before each replay.
extern "C" __global__ void dropout_forward_kernel(float* __restrict__ x, int n, float prob, float scale,
                                                 const unsigned int* __restrict__ step_seed,
                                                 unsigned int layer_seed, float* __restrict__ rand)
{
    const unsigned int offset = (*step_seed + layer_seed) * 0x9E3779B9u;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        const float r = uniform_hash((unsigned int)i, offset);
        rand[i] = r;
        x[i] = r < prob ? 0.0f : x[i] * scale;
    }
}

// delta[i] = rand[i] < prob ? 0 : delta[i] * scale
extern "C" __global__ void dropout_backward_kernel(const float* __restrict__ rand, int n, float prob,
                                                  float scale, float* __restrict__ delta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        delta[i] = rand[i] < prob ? 0.0f : delta[i] * scale;
}

// rand[i] = uniform_hash(i): draws for a choice both backends make alike ([detection]
// random=1's responsible box).
extern "C" __global__ void uniform_kernel(float* __restrict__ rand, int n, unsigned int offset)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        rand[i] = uniform_hash((unsigned int)i, offset);
}
