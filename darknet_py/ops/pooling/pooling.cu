// Max and average pooling (Darknet's maxpool and avgpool layers).

#include "../common/x_storage.cuh"

// Output element i of (planes) x out_h x out_w: its column, row and plane.
__device__ __forceinline__ long long pool_position(long long i, int out_w, int out_h, int* ow, int* oh)
{
    *ow = (int)(i % out_w);
    const long long t = i / out_w;
    *oh = (int)(t % out_h);
    return t / out_h;
}

// One thread per output element of (batch*c) x out_h x out_w. Windows start at
// -(padding / 2) and move by stride_x across, stride_y down (the same for the original
// Darknet); cells outside the image never win. indexes gets the flat index into x of the
// first maximum in row-major window order (strict '>', as Darknet), or -1 when the window
// holds no image cell. X: how x and out are kept (x_storage.cuh; a 16-bit layer output,
// issue 26): the values compared widened, the winner's stored bits copied.
template <class X>
__device__ __forceinline__ void maxpool_forward_of(const typename X::Storage* __restrict__ x,
                                                   int planes, int h, int w, int size,
                                                   int stride_x, int stride_y, int padding,
                                                   int out_h, int out_w,
                                                   typename X::Storage* __restrict__ out,
                                                   int* __restrict__ indexes)
{
    const long long total = (long long)planes * out_h * out_w;
    const int off = padding / 2;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int ow, oh;
        const long long plane = pool_position(i, out_w, out_h, &ow, &oh);
        const int h0 = oh * stride_y - off;
        const int w0 = ow * stride_x - off;
        float best = -INFINITY;
        typename X::Storage best_stored = X::rounded(-INFINITY);
        int best_i = -1;
        for (int dy = 0; dy < size; ++dy) {
            const int y = h0 + dy;
            if (y < 0 || y >= h) continue;
            for (int dx = 0; dx < size; ++dx) {
                const int xx = w0 + dx;
                if (xx < 0 || xx >= w) continue;
                const int idx = (int)((plane * h + y) * w + xx);
                const typename X::Storage stored = x[idx];
                const float v = X::widen(stored);
                if (best_i < 0 || v > best) {
                    best = v;
                    best_stored = stored;
                    best_i = idx;
                }
            }
        }
        out[i] = best_stored;
        if (indexes) indexes[i] = best_i;  // null in inference: no argmax kept
    }
}

#define MAXPOOL_FORWARD(NAME, X)                                                                  \
    extern "C" __global__ void NAME(const X::Storage* __restrict__ x, int planes, int h, int w,   \
                                    int size, int stride_x, int stride_y, int padding, int out_h, \
                                    int out_w, X::Storage* __restrict__ out,                      \
                                    int* __restrict__ indexes)                                    \
    {                                                                                             \
        maxpool_forward_of<X>(x, planes, h, w, size, stride_x, stride_y, padding, out_h, out_w,   \
                              out, indexes);                                                      \
    }
MAXPOOL_FORWARD(maxpool_forward_kernel, XF32)
MAXPOOL_FORWARD(maxpool_forward_kernel_f16, XF16)
MAXPOOL_FORWARD(maxpool_forward_kernel_bf16, XBF16)

// The same sums as maxpool_backward_kernel for a spatial maxpool, one thread per input
// cell gathering from the windows that hold it, in output order: deterministic (atomics
// add in whatever order threads come) and equal, bit for bit, to adding one output after
// another. A window of output (oh, ow) covers rows oh*stride_y - off .. + size - 1.
extern "C" __global__ void maxpool_backward_gather_kernel(const float* __restrict__ delta_out,
                                                          const int* __restrict__ indexes,
                                                          int planes, int h, int w, int size,
                                                          int stride_x, int stride_y, int padding,
                                                          int out_h, int out_w,
                                                          float* __restrict__ delta_in)
{
    const long long total = (long long)planes * h * w;
    const int off = padding / 2;
    for (long long j = blockIdx.x * (long long)blockDim.x + threadIdx.x; j < total;
         j += (long long)gridDim.x * blockDim.x) {
        int x, y;
        const long long plane = pool_position(j, w, h, &x, &y);
        // Windows starting at or before this cell and ending at or after it.
        const int oh0 = max(0, (y + off - size + stride_y) / stride_y);
        const int oh1 = min(out_h - 1, (y + off) / stride_y);
        const int ow0 = max(0, (x + off - size + stride_x) / stride_x);
        const int ow1 = min(out_w - 1, (x + off) / stride_x);
        float acc = 0.0f;
        bool hit = false;
        for (int oh = oh0; oh <= oh1; ++oh)
            for (int ow = ow0; ow <= ow1; ++ow) {
                const long long o = (plane * out_h + oh) * out_w + ow;
                if (indexes[o] == (int)j) {
                    acc = (hit ? acc : delta_in[j]) + delta_out[o];   // read only when hit
                    hit = true;
                }
            }
        if (hit) delta_in[j] = acc;
    }
}

// delta_in[indexes[i]] += delta_out[i]. Overlapping windows (stride < size) can
// route several outputs to one input, hence the atomics; -1 routes nowhere.
extern "C" __global__ void maxpool_backward_kernel(const float* __restrict__ delta_out,
                                                  const int* __restrict__ indexes, int n_out,
                                                  float* __restrict__ delta_in)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n_out; i += gridDim.x * blockDim.x) {
        const int j = indexes[i];
        if (j >= 0) atomicAdd(delta_in + j, delta_out[i]);
    }
}

// out[r] = mean of x[r*spatial .. +spatial) for r < rows; one warp per row.
extern "C" __global__ void avgpool_forward_kernel(const float* __restrict__ x, int rows, int spatial,
                                                 float* __restrict__ out)
{
    const int lane = threadIdx.x & 31;
    const int warps = (gridDim.x * blockDim.x) >> 5;
    for (int r = (blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += warps) {
        const float* p = x + (long long)r * spatial;
        float s = 0.0f;
        for (int k = lane; k < spatial; k += 32) s += p[k];
        for (int o = 16; o > 0; o >>= 1) s += __shfl_down_sync(0xffffffffu, s, o);
        if (lane == 0) out[r] = s / (float)spatial;
    }
}

// delta_in[r*spatial + k] += delta_out[r] / spatial
extern "C" __global__ void avgpool_backward_kernel(const float* __restrict__ delta_out, int rows, int spatial,
                                                  float* __restrict__ delta_in)
{
    const long long total = (long long)rows * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        delta_in[i] += delta_out[i / spatial] / (float)spatial;
}

// The fork's maxpool_depth: out[b, g, p] = max over channels g, g+out_c, g+2*out_c, ... of
// x[b, :, p]; indexes get the flat index of the first maximum. One thread per output.
extern "C" __global__ void maxpool_depth_kernel(const float* __restrict__ x, int batch, int c, int spatial,
                                               int out_c, float* __restrict__ out,
                                               int* __restrict__ indexes)
{
    const long long total = (long long)batch * out_c * spatial;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int p, g;   // position, output channel, image
        const long long b = pool_position(i, spatial, out_c, &p, &g);
        float best = -INFINITY;
        int best_i = -1;
        for (int k = g; k < c; k += out_c) {
            const int idx = (int)((b * c + k) * spatial + p);
            const float v = x[idx];
            if (best_i < 0 || v > best) {
                best = v;
                best_i = idx;
            }
        }
        out[i] = best;
        indexes[i] = best_i;
    }
}

// The image cells of window (oh, ow): rows [y0, y1), columns [x0, x1).
__device__ __forceinline__ void window_cells(int oh, int ow, int h, int w, int size, int stride_x,
                                             int stride_y, int off, int* y0, int* y1, int* x0,
                                             int* x1)
{
    const int top = oh * stride_y - off, left = ow * stride_x - off;
    *y0 = max(top, 0);
    *y1 = min(top + size, h);
    *x0 = max(left, 0);
    *x1 = min(left + size, w);
}

// The fork's [local_avgpool]: out = the mean of each window's cells inside the image.
// One thread per output element of (batch*c) x out_h x out_w.
extern "C" __global__ void local_avgpool_forward_kernel(const float* __restrict__ x, int planes, int h,
                                                       int w, int size, int stride_x, int stride_y,
                                                       int padding, int out_h, int out_w,
                                                       float* __restrict__ out)
{
    const long long total = (long long)planes * out_h * out_w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int ow, oh;
        const long long plane = pool_position(i, out_w, out_h, &ow, &oh);
        int y0, y1, x0, x1;
        window_cells(oh, ow, h, w, size, stride_x, stride_y, padding / 2, &y0, &y1, &x0, &x1);
        float s = 0.0f;
        for (int y = y0; y < y1; ++y)
            for (int xx = x0; xx < x1; ++xx) s += x[(plane * h + y) * w + xx];
        out[i] = s / (float)((y1 - y0) * (x1 - x0));
    }
}

// Its adjoint: each output's delta / its cell count is added to those cells (atomics:
// overlapping windows share cells).
extern "C" __global__ void local_avgpool_backward_kernel(float* __restrict__ delta_in, int planes, int h,
                                                        int w, int size, int stride_x, int stride_y,
                                                        int padding, int out_h, int out_w,
                                                        const float* __restrict__ delta_out)
{
    const long long total = (long long)planes * out_h * out_w;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int ow, oh;
        const long long plane = pool_position(i, out_w, out_h, &ow, &oh);
        int y0, y1, x0, x1;
        window_cells(oh, ow, h, w, size, stride_x, stride_y, padding / 2, &y0, &y1, &x0, &x1);
        const float share = delta_out[i] / (float)((y1 - y0) * (x1 - x0));
        for (int y = y0; y < y1; ++y)
            for (int xx = x0; xx < x1; ++xx) atomicAdd(delta_in + (plane * h + y) * w + xx, share);
    }
}
