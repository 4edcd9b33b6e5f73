// The training losses of [region] (YOLOv2, Darknet's forward_region_layer) and of its
// ancestor [detection] (YOLOv1, forward_detection_layer): the NumPy references are
// darknet_py/losses/region.py and darknet_py/losses/detection.py, matched element for element.
//
// Float arithmetic goes through __fadd_rn/__fmul_rn/__fdiv_rn so that no multiply-add is
// fused: every rounding is the reference's, and both backends take the same decisions
// (which anchor fits, which truth passes thresh). exp and log are taken in double, as
// the references do. Sums are fixed-order (no atomics): repeated steps are bit-identical.
// One thread walks one image's truths in order, because a later truth may overwrite an
// earlier one's deltas.

#include "../common/common.cuh"   // Box, box_iou

__device__ __forceinline__ Box truth_box(const float* t)
{
    return Box{t[0], t[1], t[2], t[3]};
}

__device__ __forceinline__ int clamp_index(int v, int n)
{
    return min(max(v, 0), n - 1);
}

// ---- [region] ----------------------------------------------------------------------------
// get_region_box of the anchor plane at o (entries wh apart) in cell (j, i).
__device__ Box region_box(const float* o, int wh, float anchor_w, float anchor_h, int i, int j,
                          int w, int h)
{
    return Box{__fdiv_rn(__fadd_rn((float)i, o[0]), (float)w),
               __fdiv_rn(__fadd_rn((float)j, o[wh]), (float)h),
               (float)(exp((double)o[2 * wh]) * (double)anchor_w / (double)w),
               (float)(exp((double)o[3 * wh]) * (double)anchor_h / (double)h)};
}

// Darknet's log of a float ratio, in double, rounded once.
__device__ __forceinline__ float log_ratio(float num, float den)
{
    return (float)log((double)__fdiv_rn(num, den));
}

// One thread per image, anchor and cell: every delta of the cell. Objectness: the
// no-object term, or 0 where a truth of the image overlaps the predicted box by more than
// thresh. Coordinates: with prior, the pull towards the anchor at the cell centre (scale
// .01), else 0. Classes: 0. truth: truth_stride floats an image, truths boxes of
// truth_size floats read at most, ending at the first x == 0.
extern "C" __global__ void region_cells(const float* __restrict__ out,
                                        const float* __restrict__ truth, int truth_stride,
                                        int truth_size, int truths,
                                        const float* __restrict__ anchors, int batch, int n,
                                        int h, int w, int classes, float thresh,
                                        float noobject_scale, int prior,
                                        float* __restrict__ delta)
{
    const int wh = w * h, entries = 5 + classes, cells = batch * n * wh;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cells; c += gridDim.x * blockDim.x) {
        const int loc = c % wh, plane = c / wh, a = plane % n, b = plane / n;
        const int i = loc % w, j = loc / w;
        const long long base = (long long)plane * entries * wh + loc;
        const float* o = out + base;
        float* d = delta + base;
        const float aw = anchors[2 * a], ah = anchors[2 * a + 1];
        const Box pred = region_box(o, wh, aw, ah, i, j, w, h);
        const float* image = truth + (long long)b * truth_stride;
        float best = 0.0f;
        for (int t = 0; t < truths && image[t * truth_size] != 0.0f; ++t) {
            const float iou = box_iou(pred, truth_box(image + t * truth_size));
            if (iou > best) best = iou;
        }
        d[4 * wh] = best > thresh ? 0.0f : __fmul_rn(noobject_scale, __fsub_rn(0.0f, o[4 * wh]));
        if (prior) {
            const float shape_w = __fdiv_rn(aw, (float)w), shape_h = __fdiv_rn(ah, (float)h);
            const float target[4] = {
                __fsub_rn(__fmul_rn((float)((i + 0.5) / w), (float)w), (float)i),
                __fsub_rn(__fmul_rn((float)((j + 0.5) / h), (float)h), (float)j),
                log_ratio(__fmul_rn(shape_w, (float)w), aw),
                log_ratio(__fmul_rn(shape_h, (float)h), ah)};
            for (int k = 0; k < 4; ++k)
                d[k * wh] = __fmul_rn(0.01f, __fsub_rn(target[k], o[k * wh]));
        } else {
            for (int k = 0; k < 4; ++k) d[k * wh] = 0.0f;
        }
        for (int k = 0; k < classes; ++k) d[(5 + k) * wh] = 0.0f;
    }
}

// One thread per image, its truths in order: the cell the truth's centre falls in, the
// anchor whose shape fits it best (the anchor's own with bias_match), and there the box,
// objectness and class deltas. stats[b*5..]: IoU sum, recall (IoU > .5) count, class
// score sum, objectness sum, truth count. A class id outside 0..classes-1 (the layer
// refuses those before) sets no class delta. class_map (or null): the layer's map=, a
// class id for each truth class id. parent (or null), group, group_offset, group_size:
// a softmax tree (darknet_py/tree.py), whose class delta runs from the class up to its
// root, every sibling group on the way (delta_region_class's hierarchy branch).
extern "C" __global__ void region_truths(const float* __restrict__ out,
                                         const float* __restrict__ truth, int truth_stride,
                                         int truth_size, int truths,
                                         const float* __restrict__ anchors, int batch, int n,
                                         int h, int w, int classes, int softmax, int bias_match,
                                         int rescore, float coord_scale, float object_scale,
                                         float class_scale, const int* __restrict__ class_map,
                                         const int* __restrict__ parent,
                                         const int* __restrict__ group,
                                         const int* __restrict__ group_offset,
                                         const int* __restrict__ group_size,
                                         float* __restrict__ delta, double* __restrict__ stats)
{
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const int wh = w * h, entries = 5 + classes;
    double iou_sum = 0.0, recall = 0.0, class_sum = 0.0, obj_sum = 0.0, count = 0.0;
    const float* image = truth + (long long)b * truth_stride;
    for (int t = 0; t < truths; ++t) {
        const float* tr = image + t * truth_size;
        if (tr[0] == 0.0f) break;
        const int i = clamp_index((int)__fmul_rn(tr[0], (float)w), w);
        const int j = clamp_index((int)__fmul_rn(tr[1], (float)h), h);
        const Box shape = {0.0f, 0.0f, tr[2], tr[3]};
        int a = 0;
        float best = 0.0f;
        for (int k = 0; k < n; ++k) {
            const float* o = out + ((long long)(b * n + k) * entries) * wh + j * w + i;
            Box fit = region_box(o, wh, anchors[2 * k], anchors[2 * k + 1], i, j, w, h);
            if (bias_match) {
                fit.w = __fdiv_rn(anchors[2 * k], (float)w);
                fit.h = __fdiv_rn(anchors[2 * k + 1], (float)h);
            }
            fit.x = fit.y = 0.0f;
            float iou = box_iou(fit, shape);
            if (iou != iou) iou = 0.0f;
            if (k == 0 || iou > best) { a = k; best = iou; }
        }
        const long long base = ((long long)(b * n + a) * entries) * wh + j * w + i;
        const float* o = out + base;
        float* d = delta + base;
        const float aw = anchors[2 * a], ah = anchors[2 * a + 1];
        const float scale = __fmul_rn(coord_scale, __fsub_rn(2.0f, __fmul_rn(tr[2], tr[3])));
        const float target[4] = {__fsub_rn(__fmul_rn(tr[0], (float)w), (float)i),
                                 __fsub_rn(__fmul_rn(tr[1], (float)h), (float)j),
                                 log_ratio(__fmul_rn(tr[2], (float)w), aw),
                                 log_ratio(__fmul_rn(tr[3], (float)h), ah)};
        for (int k = 0; k < 4; ++k) d[k * wh] = __fmul_rn(scale, __fsub_rn(target[k], o[k * wh]));
        const float iou = box_iou(region_box(o, wh, aw, ah, i, j, w, h), truth_box(tr));
        const float p = o[4 * wh];
        d[4 * wh] = __fmul_rn(object_scale, __fsub_rn(rescore ? iou : 1.0f, p));
        iou_sum += iou;
        recall += iou > 0.5f;
        obj_sum += p;
        count += 1.0;
        int cls = (int)tr[4];
        if (class_map) cls = class_map[cls];
        if (cls < 0 || cls >= classes) continue;
        float* dc = d + 5 * wh;
        const float* oc = o + 5 * wh;
        if (parent) {
            float pred = 1.0f;
            for (int c = cls; c >= 0; c = parent[c]) {
                pred = __fmul_rn(pred, oc[c * wh]);
                const int first = group_offset[group[c]], size = group_size[group[c]];
                for (int k = first; k < first + size; ++k)
                    dc[k * wh] = __fmul_rn(class_scale, __fsub_rn(0.0f, oc[k * wh]));
                dc[c * wh] = __fmul_rn(class_scale, __fsub_rn(1.0f, oc[c * wh]));
            }
            class_sum += pred;
        } else if (dc[0] != 0.0f && !softmax) {
            // delta_region_class's tag: a class-0 delta an earlier truth left here.
            dc[cls * wh] = __fmul_rn(class_scale, __fsub_rn(1.0f, oc[cls * wh]));
        } else {
            for (int k = 0; k < classes; ++k)
                dc[k * wh] = __fmul_rn(class_scale, __fsub_rn(k == cls ? 1.0f : 0.0f, oc[k * wh]));
            class_sum += oc[cls * wh];
        }
    }
    double* s = stats + 5 * b;
    s[0] = iou_sum; s[1] = recall; s[2] = class_sum; s[3] = obj_sum; s[4] = count;
}

// ---- [detection] -------------------------------------------------------------------------
// One thread per image and cell: Darknet's grid truth of the cell (is_object, one-hot
// class, x, y relative to the cell, w, h) from box rows: the first box whose centre falls
// in it, boxes under .005 wide or high dropped; zeros where none.
extern "C" __global__ void detection_grid(const float* __restrict__ truth, int truth_stride,
                                          int truth_size, int truths, int batch, int side,
                                          int classes, float* __restrict__ grid)
{
    const int loc = side * side, per_cell = 5 + classes;
    for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < batch * loc; c += gridDim.x * blockDim.x) {
        const int b = c / loc, cell = c % loc;
        float* g = grid + (long long)c * per_cell;
        for (int k = 0; k < per_cell; ++k) g[k] = 0.0f;
        const float* image = truth + (long long)b * truth_stride;
        for (int t = 0; t < truths; ++t) {
            const float* tr = image + t * truth_size;
            if (tr[0] == 0.0f) break;
            if ((double)tr[2] < .005 || (double)tr[3] < .005) continue;  // C's double compare
            const int col = clamp_index((int)__fmul_rn(tr[0], (float)side), side);
            const int row = clamp_index((int)__fmul_rn(tr[1], (float)side), side);
            if (col + row * side != cell) continue;
            g[0] = 1.0f;
            const int cls = (int)tr[4];
            if (cls >= 0 && cls < classes) g[1 + cls] = 1.0f;
            g[1 + classes] = __fsub_rn(__fmul_rn(tr[0], (float)side), (float)col);
            g[2 + classes] = __fsub_rn(__fmul_rn(tr[1], (float)side), (float)row);
            g[3 + classes] = tr[2];
            g[4 + classes] = tr[3];
            break;
        }
    }
}

// Every delta of the batch: the no-object term on each image's objectness scores
// (outputs [p_begin, p_end) of an image), 0 elsewhere.
extern "C" __global__ void detection_base(const float* __restrict__ out, int total, int outputs,
                                          int p_begin, int p_end, float noobject_scale,
                                          float* __restrict__ delta)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const int r = i % outputs;
        delta[i] = (r >= p_begin && r < p_end) ? __fmul_rn(noobject_scale, __fsub_rn(0.0f, out[i]))
                                              : 0.0f;
    }
}

// A predicted box of [detection] relative to the image: x, y over side, w, h squared
// with sqrt=1.
__device__ Box detection_box(const float* o, int side, int sqrt_wh)
{
    Box p = {__fdiv_rn(o[0], (float)side), __fdiv_rn(o[1], (float)side), o[2], o[3]};
    if (sqrt_wh) { p.w = __fmul_rn(p.w, p.w); p.h = __fmul_rn(p.h, p.h); }
    return p;
}

__device__ double box_rmse(Box a, Box b)
{
    const double dx = (double)a.x - b.x, dy = (double)a.y - b.y;
    const double dw = (double)a.w - b.w, dh = (double)a.h - b.h;
    return sqrt(__dadd_rn(__dadd_rn(__dadd_rn(__dmul_rn(dx, dx), __dmul_rn(dy, dy)),
                                    __dmul_rn(dw, dw)), __dmul_rn(dh, dh)));
}

// One thread per image, its object cells in order: class deltas, the responsible box
// (best IoU once any overlaps, else the least RMSE under 20; by truth area with forced;
// drawn with draws != null), its objectness and coordinate deltas. With no box chosen
// (best -1) Darknet writes the slots just before the cell's, and so does this.
// stats[b*5..]: IoU sum, true-class score sum, all class scores sum, objectness sum, count.
extern "C" __global__ void detection_objects(const float* __restrict__ out,
                                             const float* __restrict__ grid,
                                             const float* __restrict__ draws, int batch,
                                             int side, int n, int classes, int sqrt_wh,
                                             int rescore, int forced, float coord_scale,
                                             float object_scale, float class_scale,
                                             float* __restrict__ delta, double* __restrict__ stats)
{
    const int b = blockIdx.x * blockDim.x + threadIdx.x;
    if (b >= batch) return;
    const int loc = side * side, per_cell = 5 + classes;
    const int outputs = loc * (5 * n + classes), p_base = loc * classes, box_base = loc * (classes + n);
    const float* o = out + (long long)b * outputs;
    float* d = delta + (long long)b * outputs;
    double iou_sum = 0.0, pos_cat = 0.0, all_cat = 0.0, obj_sum = 0.0, count = 0.0;
    for (int cell = 0; cell < loc; ++cell) {
        const float* t = grid + ((long long)b * loc + cell) * per_cell;
        if ((int)t[0] == 0) continue;
        for (int k = 0; k < classes; ++k) {
            const float score = o[cell * classes + k];
            d[cell * classes + k] = __fmul_rn(class_scale, __fsub_rn(t[1 + k], score));
            if (t[1 + k] != 0.0f) pos_cat += score;
            all_cat += score;
        }
        const float* tc = t + 1 + classes;
        const Box tbox = {__fdiv_rn(tc[0], (float)side), __fdiv_rn(tc[1], (float)side), tc[2], tc[3]};
        int best = -1;
        float best_iou = 0.0f;
        double best_rmse = 20.0;
        for (int k = 0; k < n; ++k) {
            const Box p = detection_box(o + box_base + (cell * n + k) * 4, side, sqrt_wh);
            const float iou = box_iou(p, tbox);
            const double rmse = box_rmse(p, tbox);
            if (best_iou > 0.0f || iou > 0.0f) {
                if (iou > best_iou) { best = k; best_iou = iou; }
            } else if (rmse < best_rmse) {
                best = k; best_rmse = rmse;
            }
        }
        if (forced) best = (double)__fmul_rn(tbox.w, tbox.h) < .1 ? 1 : 0;
        if (draws) best = min((int)__fmul_rn(draws[b * loc + cell], (float)n), n - 1);
        const int box_index = box_base + (cell * n + best) * 4, p_index = p_base + cell * n + best;
        const float iou = box_iou(detection_box(o + box_index, side, sqrt_wh), tbox);
        d[p_index] = __fmul_rn(object_scale, __fsub_rn(rescore ? iou : 1.0f, o[p_index]));
        const float target[4] = {tc[0], tc[1], sqrt_wh ? __fsqrt_rn(tc[2]) : tc[2],
                                 sqrt_wh ? __fsqrt_rn(tc[3]) : tc[3]};
        for (int k = 0; k < 4; ++k)
            d[box_index + k] = __fmul_rn(coord_scale, __fsub_rn(target[k], o[box_index + k]));
        iou_sum += iou;
        obj_sum += o[p_index];
        count += 1.0;
    }
    double* s = stats + 5 * b;
    s[0] = iou_sum; s[1] = pos_cat; s[2] = all_cat; s[3] = obj_sum; s[4] = count;
}

// ---- the figures, for both ---------------------------------------------------------------
#define SUM_THREADS 256

// Sums of the block's threads' values in a fixed order; the result is valid in thread 0.
__device__ double tree_sum(double v, double* shared)
{
    shared[threadIdx.x] = v;
    __syncthreads();
    for (int s = SUM_THREADS / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
        __syncthreads();
    }
    v = shared[0];
    __syncthreads();
    return v;
}

// Blocks of SUM_THREADS threads. partial[2*block] = this block's share of the sum of
// delta^2, partial[2*block + 1] of the objectness: out[i] where i % period lies in
// [offset, offset + width).
extern "C" __global__ void loss_sums(const float* __restrict__ delta, const float* __restrict__ out,
                                     int total, int period, int offset, int width,
                                     double* __restrict__ partial)
{
    __shared__ double shared[SUM_THREADS];
    double cost = 0.0, obj = 0.0;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const double v = delta[i];
        cost += v * v;
        const int r = i % period - offset;
        if (r >= 0 && r < width) obj += out[i];
    }
    cost = tree_sum(cost, shared);
    obj = tree_sum(obj, shared);
    if (threadIdx.x == 0) {
        partial[2 * blockIdx.x] = cost;
        partial[2 * blockIdx.x + 1] = obj;
    }
}

// One block of SUM_THREADS threads: scalars = cost (the partials' delta^2), the per-image
// stats summed over the batch (nstats of them), the objectness sum; rounded to float.
extern "C" __global__ void loss_final(const double* __restrict__ partial, int blocks,
                                      const double* __restrict__ stats, int batch, int nstats,
                                      float* __restrict__ scalars)
{
    __shared__ double shared[SUM_THREADS];
    double cost = 0.0, obj = 0.0;
    for (int k = threadIdx.x; k < blocks; k += blockDim.x) {
        cost += partial[2 * k];
        obj += partial[2 * k + 1];
    }
    cost = tree_sum(cost, shared);
    obj = tree_sum(obj, shared);
    if (threadIdx.x < nstats) {
        double s = 0.0;
        for (int b = 0; b < batch; ++b) s += stats[b * nstats + threadIdx.x];
        scalars[1 + threadIdx.x] = (float)s;
    }
    if (threadIdx.x == 0) {
        scalars[0] = (float)cost;
        scalars[1 + nstats] = (float)obj;
    }
}
