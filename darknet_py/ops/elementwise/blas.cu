// Level-1 BLAS-like ops over flat float arrays (Darknet's blas_kernels.cu family).
// Element-wise kernels use grid-stride loops so the launch grid can be capped.

#include "../common/common.cuh"

// y += alpha * x
extern "C" __global__ void axpy_kernel(int n, float alpha, const float* __restrict__ x,
                                      float* __restrict__ y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] += alpha * x[i];
}

// y += alpha[0] * x: the factor is read from device memory, so a captured graph uses
// the value written before each replay (the learning rate of the update).
extern "C" __global__ void axpy_array_kernel(int n, const float* __restrict__ alpha,
                                            const float* __restrict__ x, float* __restrict__ y)
{
    const float a = *alpha;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] += a * x[i];
}

// x *= alpha
extern "C" __global__ void scal_kernel(int n, float alpha, float* __restrict__ x)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] *= alpha;
}

// x = min(limit, max(-limit, x)): Darknet's constrain_gpu (the fork's GPU build clips a
// weighted [shortcut]'s updates with it)
extern "C" __global__ void constrain_kernel(int n, float limit, float* __restrict__ x)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] = fminf(limit, fmaxf(-limit, x[i]));
}

// y *= x (element-wise)
extern "C" __global__ void mul_kernel(int n, const float* __restrict__ x, float* __restrict__ y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] *= x[i];
}

// x[r * row_stride + c] = x * scale + add for r < rows, c < width (x already offset):
// the AlexeyAB fork's scal_add on strided rows ([yolo] scale_x_y).
// x (blocks and threads) spans the width, y the rows.
extern "C" __global__ void scale_add_strided(float* __restrict__ x, int rows, int row_stride,
                                            int width, float scale, float add)
{
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= width) return;
    for (int r = blockIdx.y * blockDim.y + threadIdx.y; r < rows; r += gridDim.y * blockDim.y) {
        float* p = x + (long long)r * row_stride + c;
        *p = __fadd_rn(__fmul_rn(*p, scale), add);  // no FMA: the same rounding as the CPU
    }
}

// y += a * b (element-wise)
extern "C" __global__ void mul_add_kernel(int n, const float* __restrict__ a, const float* __restrict__ b,
                                         float* __restrict__ y)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        y[i] += a[i] * b[i];
}

// partial[blockIdx.x] = sum of this block's grid-stride share of x, in double
// (the NumPy reference sums in float64; a float32 tree would lose digits on
// cancelling sums).
extern "C" __global__ void sum_partial(int n, const float* __restrict__ x, double* __restrict__ partial)
{
    double s = 0.0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        s += (double)x[i];
    s = block_sum(s);
    if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// total[0] = sum of partial[0..n); one block.
extern "C" __global__ void sum_final(int n, const double* __restrict__ partial, double* __restrict__ total)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) total[0] = s;
}

// total[0] = sum of partial[0..n) rounded to float: a loss kept on the device until the
// host reads every layer's figures once, after the step.
extern "C" __global__ void sum_final_f32(int n, const double* __restrict__ partial, float* __restrict__ total)
{
    double s = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
    s = block_sum(s);
    if (threadIdx.x == 0) total[0] = (float)s;
}
