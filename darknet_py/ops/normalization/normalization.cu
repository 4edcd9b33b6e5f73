// Normalisations across channels: [l2norm] and [lrn] (Darknet's l2norm_layer.c and
// normalization_layer.c). Arrays are batch x channels x spatial, row-major; one thread
// walks the channels of one (image, position), in the order Darknet's CPU code adds.

// x /= sqrt(sum over channels of x^2), per image and position.
extern "C" __global__ void l2normalize_kernel(float* __restrict__ x, int batch, int filters,
                                              int spatial)
{
    const long long positions = (long long)batch * spatial;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < positions;
         p += (long long)gridDim.x * blockDim.x) {
        const long long b = p / spatial;
        float* v = x + b * filters * spatial + (p - b * spatial);
        float sum = 0.0f;
        for (int f = 0; f < filters; ++f) sum = __fadd_rn(sum, __fmul_rn(v[f * spatial], v[f * spatial]));
        sum = sqrtf(sum);
        for (int f = 0; f < filters; ++f) v[f * spatial] = __fdiv_rn(v[f * spatial], sum);
    }
}

// Local response normalisation. norms[k] = kappa + alpha * (sum of x^2 over Darknet's window
// of channel k), kept as Darknet's running sum: channel 0 adds channels [0, size/2), channel
// k starts from channel k-1's, subtracts channel k-(size-1)/2-1 and adds k+size/2 (so, as in
// Darknet, channel size/2 never enters and is later subtracted). out = x * norms^-beta.
extern "C" __global__ void lrn_forward_kernel(const float* __restrict__ x, int batch, int c,
                                              int spatial, int size, float alpha, float beta,
                                              float kappa, float* __restrict__ norms,
                                              float* __restrict__ out)
{
    const long long positions = (long long)batch * spatial;
    for (long long p = blockIdx.x * (long long)blockDim.x + threadIdx.x; p < positions;
         p += (long long)gridDim.x * blockDim.x) {
        const long long b = p / spatial;
        const long long base = b * c * spatial + (p - b * spatial);
        const float* in = x + base;
        float norm = kappa;
        for (int k = 0; k < size / 2 && k < c; ++k)
            norm = __fadd_rn(norm, __fmul_rn(alpha, __fmul_rn(in[k * spatial], in[k * spatial])));
        norms[base] = norm;
        for (int k = 1; k < c; ++k) {
            const int prev = k - (size - 1) / 2 - 1;
            const int next = k + size / 2;
            if (prev >= 0)
                norm = __fadd_rn(norm, __fmul_rn(-alpha, __fmul_rn(in[prev * spatial], in[prev * spatial])));
            if (next < c)
                norm = __fadd_rn(norm, __fmul_rn(alpha, __fmul_rn(in[next * spatial], in[next * spatial])));
            norms[base + (long long)k * spatial] = norm;
        }
        for (int k = 0; k < c; ++k) {
            const long long i = base + (long long)k * spatial;
            out[i] = __fmul_rn(powf(norms[i], -beta), x[i]);
        }
    }
}

// Darknet's approximate LRN gradient: delta_in += norms^-beta * delta.
extern "C" __global__ void lrn_backward_kernel(int n, const float* __restrict__ norms,
                                               const float* __restrict__ delta, float beta,
                                               float* __restrict__ delta_in)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        delta_in[i] += powf(norms[i], -beta) * delta[i];
}
