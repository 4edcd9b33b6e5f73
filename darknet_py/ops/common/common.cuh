// What several kernel files share: a block-wide sum and Darknet's box IoU.
// Included as "common.cuh" (nvcc finds it beside the including file; the kernel cache
// inlines it, see backends/kernel_cache.py read_kernel_source, so a change here rebuilds
// every kernel that includes it).
#pragma once

// ---- reductions ---------------------------------------------------------------------------
// Block-wide sum of one double per thread, valid in thread 0, in a fixed order (a warp's
// shuffles, then warp 0 over the warps' sums): repeated runs give the same bits. Every
// thread of the block must call it; blockDim.x a multiple of 32, at most 1024.
// The barrier before the shared words are written lets a kernel call it several times in
// a row (yolo_loss.cu's yolo_finish/yolo_reduce do): without it a warp of the next call
// could overwrite warp_sums while warp 0 still reads the previous call's. (The copies this
// replaces had drifted: blas.cu's and batchnorm.cu's lacked it, and batchnorm.cu put a
// barrier between its two calls instead; this is yolo_loss.cu's, safe for every caller.)
__device__ __forceinline__ double block_sum(double v)
{
    __shared__ double warp_sums[32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();
    if (lane == 0) warp_sums[warp] = v;
    __syncthreads();
    v = 0.0;
    if (warp == 0) {
        if (lane < (int)(blockDim.x >> 5)) v = warp_sums[lane];
        for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    }
    return v;
}

// ---- boxes (boxes.py) ---------------------------------------------------------------------
// Centre x, y, width, height, relative to the network input.
struct Box { float x, y, w, h; };

// The float rounding is Darknet's, one IEEE operation at a time: the _rn intrinsics are
// never fused into multiply-adds, whatever the file's nvcc options. That matters because
// the IoU decides branches (which anchor fits, which truth passes a threshold) that must
// be the NumPy reference's. region_loss.cu is compiled with nvcc's default contraction
// (its other arithmetic pins its roundings op by op the same way); yolo_loss.cu is compiled
// with --fmad=false as a whole (cuda_backend._KERNEL_OPTIONS) and writes plain operators
// for its other box maths. Both reach the same roundings, so one box_iou serves both.
__device__ __forceinline__ float overlap(float x1, float w1, float x2, float w2)
{
    const float left = fmaxf(__fsub_rn(x1, w1 / 2.0f), __fsub_rn(x2, w2 / 2.0f));
    const float right = fminf(__fadd_rn(x1, w1 / 2.0f), __fadd_rn(x2, w2 / 2.0f));
    return __fsub_rn(right, left);
}

// Darknet's box_iou; NaN where the union is empty (NaN loses every comparison; the fork's
// fork_iou in yolo_loss.cu turns it into 0).
__device__ float box_iou(Box a, Box b)
{
    const float w = overlap(a.x, a.w, b.x, b.w), h = overlap(a.y, a.h, b.y, b.h);
    const float inter = (w < 0.0f || h < 0.0f) ? 0.0f : __fmul_rn(w, h);
    const float areas = __fadd_rn(__fmul_rn(a.w, a.h), __fmul_rn(b.w, b.h));
    return __fdiv_rn(inter, __fsub_rn(areas, inter));
}
