// im2col / col2im for a batch of images (channels x height x width each, im_stride
// floats apart), with strides (down, across), zero padding and dilation. col is
// (channels * ksize * ksize) x batch x (out_h * out_w), row-major: row (c, ki, kj),
// image b holds im[b, c, oh*stride_y - pad + ki*dilation, ow*stride_x - pad + kj*dilation]
// for every output position (oh, ow), so one GEMM covers the whole batch. With
// batch 1 this is Darknet's im2col. Groups are the caller's business (it offsets im).

#include "../common/x_storage.cuh"

// The images may be fp32 or a 16-bit layer output (X: XF16 / XBF16 storage). The kernels
// unfolding into fp32 read through X (widened exactly); those unfolding into 16 bits take
// an image at their own precision's bits as they are (half_bits: no conversion), and round
// an fp32 one (X::rounded, to nearest even), which gives the same bits for the same values.
template <class X>
__device__ __forceinline__ unsigned short half_bits(float v) { return X::rounded(v); }
template <class X>
__device__ __forceinline__ unsigned short half_bits(unsigned short v) { return v; }

// Writes the ksize^2 col entries of one (channel, output position). KS > 0 fixes
// ksize at compile time, so the loops unroll and all the loads issue before the
// stores (KS == 0: ksize at run time).
template <int KS, class X>
__device__ __forceinline__ void im2col_position(const typename X::Storage* __restrict__ img, int ksize_rt,
                                                int height,
                                                int width, int dilation, int h0, int w0,
                                                float* __restrict__ out, long long row_stride)
{
    const int ksize = KS > 0 ? KS : ksize_rt;
    for (int ki = 0; ki < ksize; ++ki) {
        const int h = h0 + ki * dilation;
        const bool h_in = h >= 0 && h < height;
        for (int kj = 0; kj < ksize; ++kj) {
            const int w = w0 + kj * dilation;
            out[(ki * ksize + kj) * row_stride] = (h_in && w >= 0 && w < width) ? X{img}[h * width + w] : 0.0f;
        }
    }
}

// One thread per (channel, image, output position): x (blocks and threads) spans
// the positions, y the (channel, image) pairs. Consecutive threads write
// consecutive addresses of each col row and read neighbouring pixels; the index
// arithmetic is paid once per ksize^2 elements. X: how the images are kept (x_storage.cuh).
template <class X>
__device__ __forceinline__ void im2col_of(const typename X::Storage* __restrict__ im, int channels, int height,
                                          int width, int ksize, int stride_y, int stride_x, int pad,
                                          int dilation, int out_h, int out_w, float* __restrict__ col,
                                          int batch, long long im_stride)
{
    const int out_hw = out_h * out_w;
    const int pos = blockIdx.x * blockDim.x + threadIdx.x;
    if (pos >= out_hw) return;
    const int oh = pos / out_w;
    const int ow = pos - oh * out_w;
    const int h0 = oh * stride_y - pad;
    const int w0 = ow * stride_x - pad;
    const long long row_stride = (long long)batch * out_hw;
    for (int cb = blockIdx.y * blockDim.y + threadIdx.y; cb < channels * batch; cb += gridDim.y * blockDim.y) {
        const int c = cb / batch;
        const int b = cb - c * batch;
        const typename X::Storage* img = im + b * im_stride + (long long)c * height * width;
        float* out = col + (long long)c * ksize * ksize * row_stride + (long long)b * out_hw + pos;
        switch (ksize) {
        case 1: im2col_position<1, X>(img, 1, height, width, dilation, h0, w0, out, row_stride); break;
        case 3: im2col_position<3, X>(img, 3, height, width, dilation, h0, w0, out, row_stride); break;
        default: im2col_position<0, X>(img, ksize, height, width, dilation, h0, w0, out, row_stride); break;
        }
    }
}

#define IM2COL(NAME, X)                                                                           \
    extern "C" __global__ void NAME(const typename X::Storage* __restrict__ im, int channels,     \
                                    int height, int width, int ksize, int stride_y, int stride_x, \
                                    int pad, int dilation, int out_h, int out_w,                  \
                                    float* __restrict__ col, int batch, long long im_stride)      \
    {                                                                                             \
        im2col_of<X>(im, channels, height, width, ksize, stride_y, stride_x, pad, dilation,       \
                     out_h, out_w, col, batch, im_stride);                                        \
    }
IM2COL(im2col_kernel, XF32)
// fp32 col from a 16-bit layer output (the unfolded weight gradient off Hopper).
IM2COL(im2col_from_f16_kernel, XF16)
IM2COL(im2col_from_bf16_kernel, XBF16)

// col in 16 bits (X: XF16 or XBF16 rounding), rows row_pitch entries apart (a multiple of
// 8: the wgmma operand's), the entries past batch * out_h * out_w left as they are. A
// thread takes two neighbouring columns n, n + 1 of col (n = image * out_hw + position;
// they may lie in two images) for one channel at a time and stores each tap's pair as one
// 4-byte word: a warp writes 128 contiguous bytes of a row, where one column a thread
// wrote 2-byte entries (0.8 TB/s). x (blocks and threads) spans the column
// pairs, y the channels. KS > 0 fixes ksize at compile time (KS == 0: ksize_rt).
// T: the images' elements, float, or unsigned short holding X's own bits (taken as they are).
template <class X, class T, int KS>
__device__ __forceinline__ void im2col_half_pairs(const T* __restrict__ im, int channels,
                                                  int height, int width, int ksize_rt, int stride_y,
                                                  int stride_x, int pad, int dilation, int out_h,
                                                  int out_w, unsigned short* __restrict__ col,
                                                  int batch, long long im_stride,
                                                  long long row_pitch)
{
    const int ksize = KS > 0 ? KS : ksize_rt;
    const long long out_hw = (long long)out_h * out_w, columns = batch * out_hw;
    const long long n = 2 * ((long long)blockIdx.x * blockDim.x + threadIdx.x);
    if (n >= columns) return;
    const bool second = n + 1 < columns;
    // Each column's image and window origin, worked out once for every channel.
    long long base[2];
    int h0[2], w0[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
        const long long nj = second || j == 0 ? n + j : n;
        const long long b = nj / out_hw;
        const int pos = (int)(nj - b * out_hw);
        const int oh = pos / out_w;
        h0[j] = oh * stride_y - pad;
        w0[j] = (pos - oh * out_w) * stride_x - pad;
        base[j] = b * im_stride;
    }
    const int taps = ksize * ksize;
    for (int c = blockIdx.y * blockDim.y + threadIdx.y; c < channels; c += gridDim.y * blockDim.y) {
        const long long plane = (long long)c * height * width;
        unsigned short* out = col + (long long)c * taps * row_pitch + n;
        for (int ki = 0; ki < ksize; ++ki) {
            for (int kj = 0; kj < ksize; ++kj) {
                unsigned short v[2];
#pragma unroll
                for (int j = 0; j < 2; ++j) {
                    const int h = h0[j] + ki * dilation, w = w0[j] + kj * dilation;
                    v[j] = half_bits<X>((h >= 0 && h < height && w >= 0 && w < width)
                                            ? im[base[j] + plane + h * width + w] : T(0));
                }
                unsigned short* at = out + (ki * ksize + kj) * row_pitch;
                if (second)   // n even, row_pitch a multiple of 8: 4-byte aligned
                    *reinterpret_cast<unsigned*>(at) = (unsigned)v[0] | ((unsigned)v[1] << 16);
                else
                    *at = v[0];
            }
        }
    }
}

#define IM2COL_HALF(NAME, X, T)                                                                   \
    extern "C" __global__ void NAME(const T* __restrict__ im, int channels, int height,           \
                                    int width, int ksize, int stride_y, int stride_x, int pad,    \
                                    int dilation, int out_h, int out_w,                           \
                                    unsigned short* __restrict__ col, int batch,                  \
                                    long long im_stride, long long row_pitch)                     \
    {                                                                                             \
        switch (ksize) {                                                                          \
        case 1: im2col_half_pairs<X, T, 1>(im, channels, height, width, 1, stride_y, stride_x, pad,  \
                                        dilation, out_h, out_w, col, batch, im_stride,            \
                                        row_pitch); break;                                        \
        case 3: im2col_half_pairs<X, T, 3>(im, channels, height, width, 3, stride_y, stride_x, pad,  \
                                        dilation, out_h, out_w, col, batch, im_stride,            \
                                        row_pitch); break;                                        \
        default: im2col_half_pairs<X, T, 0>(im, channels, height, width, ksize, stride_y, stride_x,  \
                                         pad, dilation, out_h, out_w, col, batch, im_stride,      \
                                         row_pitch); break;                                       \
        }                                                                                         \
    }
IM2COL_HALF(im2col_f16_kernel, XF16, float)
IM2COL_HALF(im2col_bf16_kernel, XBF16, float)
// The images already at the col's 16 bits (a 16-bit layer output).
IM2COL_HALF(im2col_f16_from_f16_kernel, XF16, unsigned short)
IM2COL_HALF(im2col_bf16_from_bf16_kernel, XBF16, unsigned short)

// The wgmma forward's B operand for a 3x3 kernel, position-major: row n (n = image *
// out_hw + position) holds that position's 9 taps of every channel, col[n * row_pitch + c *
// 9 + tap], in 16 bits (X's rounding); the entries past channels * 9 are left as they are.
// Staged in shared memory so that the global stores are coalesced (a
// thread storing its own row's slice from registers made each warp store touch 32 rows
// row_pitch apart, 0.7 TB/s). A block takes IM2COL_ROWS_TILE consecutive rows and a chunk
// of IM2COL_ROW_CHANNELS channels, in two phases:
//   1. a thread takes a row and 8 of the chunk's channels: its 72 loads run along the
//      positions across the warp (coalesced), and the 72 rounded entries (144 bytes) go to
//      the row's place in shared memory as nine 16-byte stores;
//   2. the block stores the tile's rows, consecutive threads taking consecutive 16-byte
//      pieces of a row's slice (18 pieces, 288 bytes), so that a warp store covers about
//      two rows' whole slices.
// x spans (row tile, channel chunk), the chunks fastest: the blocks in flight together
// fill whole rows. 3x3 kernels only.
constexpr int IM2COL_ROWS_TILE = 64;       // rows (positions) a block
constexpr int IM2COL_ROW_CHANNELS = 16;    // channels a block: a multiple of 8 (aligned slices)
constexpr int IM2COL_ROWS_THREADS = IM2COL_ROWS_TILE * IM2COL_ROW_CHANNELS / 8;   // 128
constexpr int IM2COL_SLICE_PIECES = IM2COL_ROW_CHANNELS * 9 / 8;   // 16-byte pieces a row's slice
// The staged rows lie this many pieces apart: an odd count, so that a quarter warp's
// 16-byte stores of one piece of 8 consecutive rows (phase 1) hit 8 different bank quads.
constexpr int IM2COL_STAGE_PITCH = IM2COL_SLICE_PIECES | 1;

template <class X, class T>
__device__ __forceinline__ void im2col_rows_of(const T* __restrict__ im, int channels,
                                               int height, int width, int stride_y, int stride_x,
                                               int pad, int dilation, int out_h, int out_w,
                                               unsigned short* __restrict__ col, int rows,
                                               long long im_stride, long long row_pitch)
{
    __shared__ uint4 stage[IM2COL_ROWS_TILE * IM2COL_STAGE_PITCH];   // 19 KB
    const int chunks = (channels + IM2COL_ROW_CHANNELS - 1) / IM2COL_ROW_CHANNELS;
    const int n0 = (blockIdx.x / chunks) * IM2COL_ROWS_TILE;
    const int c0 = (blockIdx.x % chunks) * IM2COL_ROW_CHANNELS;
    const int tile_rows = min(IM2COL_ROWS_TILE, rows - n0);

    // Phase 1: thread (r, group) stages row n0 + r's entries of channels c0 + 8 * group + 0..7.
    const int r = threadIdx.x % IM2COL_ROWS_TILE, group = threadIdx.x / IM2COL_ROWS_TILE;
    const int cg = c0 + 8 * group;
    if (r < tile_rows && cg < channels) {
        const int n = n0 + r, out_hw = out_h * out_w;
        const int b = n / out_hw, pos = n - b * out_hw;
        const int oh = pos / out_w;
        const int h0 = oh * stride_y - pad, w0 = (pos - oh * out_w) * stride_x - pad;
        const int plane = height * width;
        const T* img = im + b * im_stride + (long long)cg * plane;
        // Each tap's offset in a channel and which taps fall inside the image, the same for
        // every channel. A tap outside reads the channel's first pixel, then takes 0, and a
        // channel past the last one (cs) reads the last one again, never stored: no load
        // needs a predicate (48 registers against 78 with them).
        int at[9];
        unsigned inside = 0;
#pragma unroll
        for (int tap = 0; tap < 9; ++tap) {
            const int h = h0 + (tap / 3) * dilation, w = w0 + (tap % 3) * dilation;
            const bool in = h >= 0 && h < height && w >= 0 && w < width;
            at[tap] = in ? h * width + w : 0;
            inside |= (unsigned)in << tap;
        }
        const int cs = min(8, channels - cg);
        unsigned words[36];
#pragma unroll
        for (int e = 0; e < 72; e += 2) {
            unsigned short v[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                const int c = (e + j) / 9, tap = (e + j) % 9;
                const T x = img[min(c, cs - 1) * plane + at[tap]];
                v[j] = half_bits<X>(inside >> tap & 1u ? x : T(0));
            }
            words[e / 2] = (unsigned)v[0] | ((unsigned)v[1] << 16);
        }
        uint4* staged = stage + r * IM2COL_STAGE_PITCH + 9 * group;
#pragma unroll
        for (int q = 0; q < 9; ++q)
            staged[q] = make_uint4(words[4 * q], words[4 * q + 1], words[4 * q + 2],
                                   words[4 * q + 3]);
    }
    __syncthreads();

    // Phase 2: consecutive threads store consecutive 16-byte pieces of the rows' slices
    // (c0 * 9 and row_pitch multiples of 8: every piece 16-byte aligned).
    unsigned short* out = col + (long long)n0 * row_pitch + c0 * 9;
    const int entries = min(IM2COL_ROW_CHANNELS, channels - c0) * 9;
    if (entries == IM2COL_ROW_CHANNELS * 9) {
        for (int i = threadIdx.x; i < tile_rows * IM2COL_SLICE_PIECES; i += IM2COL_ROWS_THREADS) {
            const int row = i / IM2COL_SLICE_PIECES, q = i - row * IM2COL_SLICE_PIECES;
            uint4* dst = reinterpret_cast<uint4*>(out + row * row_pitch);
            dst[q] = stage[row * IM2COL_STAGE_PITCH + q];
        }
    } else {   // the last chunk, partial: only its entries, the last piece entry by entry
        const int pieces = (entries + 7) / 8;
        for (int i = threadIdx.x; i < tile_rows * pieces; i += IM2COL_ROWS_THREADS) {
            const int row = i / pieces, q = i - row * pieces;
            unsigned short* dst = out + row * row_pitch + 8 * q;
            const uint4* src = stage + row * IM2COL_STAGE_PITCH + q;
            if (8 * q + 8 <= entries) {
                *reinterpret_cast<uint4*>(dst) = *src;
            } else {
                for (int e = 0; e < entries - 8 * q; ++e)
                    dst[e] = reinterpret_cast<const unsigned short*>(src)[e];
            }
        }
    }
}

#define IM2COL_ROWS(NAME, X, T)                                                                   \
    extern "C" __global__ void __launch_bounds__(IM2COL_ROWS_THREADS)                             \
    NAME(const T* __restrict__ im, int channels, int height, int width, int stride_y,         \
         int stride_x, int pad, int dilation, int out_h, int out_w,                               \
         unsigned short* __restrict__ col, int rows, long long im_stride, long long row_pitch)    \
    {                                                                                             \
        im2col_rows_of<X, T>(im, channels, height, width, stride_y, stride_x, pad, dilation, out_h,  \
                          out_w, col, rows, im_stride, row_pitch);                                \
    }
IM2COL_ROWS(im2col_rows_f16_kernel, XF16, float)
IM2COL_ROWS(im2col_rows_bf16_kernel, XBF16, float)
IM2COL_ROWS(im2col_rows_f16_from_f16_kernel, XF16, unsigned short)
IM2COL_ROWS(im2col_rows_bf16_from_bf16_kernel, XBF16, unsigned short)

// Sum of the col entries that im2col read from pixel (h, w) of one channel.
// KS > 0 fixes ksize at compile time, so the loops unroll and the loads issue
// together; KS == 0 takes ksize at run time. UNIT_STRIDE (strides 1) drops the
// run-time divisions and remainders by the strides, ~40 integer instructions a tap.
template <int KS, bool UNIT_STRIDE>
__device__ __forceinline__ float col2im_pixel(const float* __restrict__ cols, int ksize_rt, int h, int w,
                                              int stride_y_rt, int stride_x_rt, int pad, int dilation,
                                              int out_h, int out_w, long long row_stride)
{
    const int ksize = KS > 0 ? KS : ksize_rt;
    const int stride_y = UNIT_STRIDE ? 1 : stride_y_rt;
    const int stride_x = UNIT_STRIDE ? 1 : stride_x_rt;
    float sum = 0.0f;
    for (int ki = 0; ki < ksize; ++ki) {
        const int hs = h + pad - ki * dilation;     // = oh * stride_y when row (ki) read this pixel
        if (hs < 0 || hs % stride_y != 0 || hs / stride_y >= out_h) continue;
        const int oh = hs / stride_y;
        for (int kj = 0; kj < ksize; ++kj) {
            const int ws = w + pad - kj * dilation;
            if (ws < 0 || ws % stride_x != 0 || ws / stride_x >= out_w) continue;
            sum += cols[(ki * ksize + kj) * row_stride + oh * out_w + ws / stride_x];
        }
    }
    return sum;
}

// The adjoint: im[b, c, h, w] += sum of every col entry that im2col read from it.
// One thread per (channel, image, pixel) gathers its entries (no atomics,
// deterministic); x spans the pixels, y the (channel, image) pairs.
extern "C" __global__ void col2im_kernel(const float* __restrict__ col, int channels, int height, int width,
                                        int ksize, int stride_y, int stride_x, int pad, int dilation,
                                        int out_h, int out_w, float* __restrict__ im,
                                        int batch, long long im_stride)
{
    const int hw = height * width;
    const int pix = blockIdx.x * blockDim.x + threadIdx.x;
    if (pix >= hw) return;
    const int h = pix / width;
    const int w = pix - h * width;
    const long long row_stride = (long long)batch * out_h * out_w;
    for (int cb = blockIdx.y * blockDim.y + threadIdx.y; cb < channels * batch; cb += gridDim.y * blockDim.y) {
        const int c = cb / batch;
        const int b = cb - c * batch;
        const float* cols = col + (long long)c * ksize * ksize * row_stride + (long long)b * out_h * out_w;
        float sum;
        if (ksize == 3 && stride_y == 1 && stride_x == 1)
            sum = col2im_pixel<3, true>(cols, 3, h, w, 1, 1, pad, dilation, out_h, out_w, row_stride);
        else if (ksize == 3)
            sum = col2im_pixel<3, false>(cols, 3, h, w, stride_y, stride_x, pad, dilation, out_h, out_w, row_stride);
        else if (ksize == 1)
            sum = col2im_pixel<1, false>(cols, 1, h, w, stride_y, stride_x, pad, dilation, out_h, out_w, row_stride);
        else
            sum = col2im_pixel<0, false>(cols, ksize, h, w, stride_y, stride_x, pad, dilation, out_h, out_w, row_stride);
        im[b * im_stride + (long long)c * hw + pix] += sum;
    }
}
