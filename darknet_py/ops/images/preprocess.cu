// Photos to network input on the GPU: OpenCV BGR uint8 (H, W, 3) images, uploaded as
// they are (a quarter of the bytes of the float input), become Darknet's (C, H, W) RGB
// floats in [0, 1], letterboxed into the network size (or plainly resized): image.py's
// from_bgr, resize_image and letterbox on the device.
//
// The arithmetic is image.py's, operation for operation, so the values are its bits:
//   * a byte becomes v / 255 in float32 (from_bgr's division);
//   * resize_image's sample positions are float32 (index * float32 scale), and NumPy
//     computes the blends in float64 (the fraction is a float32 minus an int64), rounding
//     to float32 once at the end: the same here, each double operation rounded on its
//     own (the _rn intrinsics are never fused into multiply-adds);
//   * its edge rules: the last column is the source's last column, the last row adds no
//     lower neighbour, a one-pixel source or target repeats the source's last column and
//     the x pass's first row.
// Letterbox: the resized image at (dx, dy) on a 0.5 grey canvas; the host works out the
// sizes (image.letterbox_size) and the float32 scales.

#include "../common/x_storage.cuh"

// One image's geometry, int32 words (darknet_py/backends/cuda_images.py GEOMETRY_WORDS).
enum Geometry {
    G_OFFSET_LO = 0,   // the image's first byte in `src`, low and high 32 bits
    G_OFFSET_HI,
    G_IH,              // source rows and columns
    G_IW,
    G_NEW_H,           // resized rows and columns
    G_NEW_W,
    G_DY,              // where the resized image sits on the canvas
    G_DX,
    G_SCALE_Y,         // float32 bits: (ih - 1) / (new_h - 1), and x alike (0 when unused)
    G_SCALE_X,
    G_WORDS
};

__device__ __forceinline__ float byte_value(const unsigned char* __restrict__ image, int iw, int row,
                                            int col, int channel)
{
    // channel is RGB; the bytes are BGR
    return __fdiv_rn((float)image[((long long)row * iw + col) * 3 + (2 - channel)], 255.0f);
}

// resize_image's x pass at source row `row`, output column x, in float64.
__device__ __forceinline__ double x_pass(const unsigned char* __restrict__ image, int iw, int new_w,
                                         float scale_x, int row, int x, int channel)
{
    if (new_w == 1 || iw == 1 || x == new_w - 1) return (double)byte_value(image, iw, row, iw - 1, channel);
    const float sx = __fmul_rn((float)x, scale_x);
    const int ix = (int)sx;
    const double dx = __dadd_rn((double)sx, -(double)ix);
    const int ix1 = min(ix + 1, iw - 1);
    const double left = __dmul_rn(__dadd_rn(1.0, -dx), (double)byte_value(image, iw, row, ix, channel));
    const double right = __dmul_rn(dx, (double)byte_value(image, iw, row, ix1, channel));
    return __dadd_rn(left, right);
}

// The resized image's value at (y, x), channel c.
__device__ __forceinline__ float resized(const unsigned char* __restrict__ image, const int* __restrict__ g,
                                         int y, int x, int channel)
{
    const int ih = g[G_IH], iw = g[G_IW], new_h = g[G_NEW_H], new_w = g[G_NEW_W];
    if (ih == new_h && iw == new_w) return byte_value(image, iw, y, x, channel);
    const float scale_x = __int_as_float(g[G_SCALE_X]);
    if (new_h == 1 || ih == 1) return __double2float_rn(x_pass(image, iw, new_w, scale_x, 0, x, channel));
    const float sy = __fmul_rn((float)y, __int_as_float(g[G_SCALE_Y]));
    const int iy = (int)sy;
    const double dy = __dadd_rn((double)sy, -(double)iy);
    const double upper = __dmul_rn(__dadd_rn(1.0, -dy), x_pass(image, iw, new_w, scale_x, iy, x, channel));
    const double lower = y == new_h - 1
                             ? 0.0
                             : __dmul_rn(dy, x_pass(image, iw, new_w, scale_x, min(iy + 1, ih - 1), x, channel));
    return __double2float_rn(__dadd_rn(upper, lower));
}

// out[b][c][y][x] for images b < gridDim.y: x (blocks and threads) spans the height x
// width positions, one thread a position, all three channels.
extern "C" __global__ void letterbox_u8_kernel(const unsigned char* __restrict__ src,
                                               const int* __restrict__ geometry, int height, int width,
                                               float* __restrict__ out)
{
    const int b = blockIdx.y;
    const int* g = geometry + b * G_WORDS;
    const long long plane = (long long)height * width;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= plane) return;
    const int y = p / width, x = p - (p / width) * width;
    const long long offset = ((long long)(unsigned)g[G_OFFSET_HI] << 32) | (unsigned)g[G_OFFSET_LO];
    const unsigned char* image = src + offset;
    const int ry = y - g[G_DY], rx = x - g[G_DX];
    const bool inside = ry >= 0 && ry < g[G_NEW_H] && rx >= 0 && rx < g[G_NEW_W];
    float* o = out + b * 3 * plane + p;
#pragma unroll
    for (int c = 0; c < 3; ++c) o[c * plane] = inside ? resized(image, g, ry, rx, c) : 0.5f;
}

// The same images into a 16-bit NHWC network input (issue 42): pixel p of image b at
// ((b * height * width) + p) * pitch, its 3 channels rounded to X's 16 bits, then zeros to
// channel 8 (the first convolution's padded input). `vector`: out 16-byte aligned and the
// pitch a multiple of 8, so a pixel is one 16-byte store.
template <class X>
__device__ __forceinline__ void letterbox_u8_nhwc_of(const unsigned char* __restrict__ src,
                                                     const int* __restrict__ geometry,
                                                     int height, int width,
                                                     unsigned short* __restrict__ out, int pitch,
                                                     int vector)
{
    const int b = blockIdx.y;
    const int* g = geometry + b * G_WORDS;
    const long long plane = (long long)height * width;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= plane) return;
    const int y = p / width, x = p - (p / width) * width;
    const long long offset = ((long long)(unsigned)g[G_OFFSET_HI] << 32) | (unsigned)g[G_OFFSET_LO];
    const unsigned char* image = src + offset;
    const int ry = y - g[G_DY], rx = x - g[G_DX];
    const bool inside = ry >= 0 && ry < g[G_NEW_H] && rx >= 0 && rx < g[G_NEW_W];
    unsigned short v[3];
#pragma unroll
    for (int c = 0; c < 3; ++c) v[c] = X::rounded(inside ? resized(image, g, ry, rx, c) : 0.5f);
    unsigned short* o = out + (b * plane + p) * pitch;
    if (vector) {
        *reinterpret_cast<uint4*>(o) = make_uint4(v[0] | ((unsigned)v[1] << 16), v[2], 0u, 0u);
    } else {
#pragma unroll
        for (int c = 0; c < 8; ++c) o[c] = c < 3 ? v[c] : (unsigned short)0;
    }
}

#define LETTERBOX_NHWC(NAME, X)                                                                   \
    extern "C" __global__ void NAME(const unsigned char* __restrict__ src,                        \
                                    const int* __restrict__ geometry, int height, int width,      \
                                    unsigned short* __restrict__ out, int pitch, int vector)      \
    {                                                                                             \
        letterbox_u8_nhwc_of<X>(src, geometry, height, width, out, pitch, vector);                \
    }
LETTERBOX_NHWC(letterbox_u8_nhwc_kernel_f16, XF16)
LETTERBOX_NHWC(letterbox_u8_nhwc_kernel_bf16, XBF16)
