// The [yolo] head's training loss (darknet_py/losses/yolo.py is the reference): Darknet's
// forward_yolo_layer in both flavours, the original's and the AlexeyAB fork's.
//
// Four launches, all deterministic (no atomics; every sum has a fixed order):
//   yolo_predictions  one thread per prediction (image, anchor, cell): its best IoU with
//                     the image's truths; writes every delta entry of the prediction.
//   yolo_truths       one warp per image: the truths in order (a later truth on the same
//                     cell and anchor overwrites an earlier one), lanes over the classes;
//                     the image's statistics into stats[image].
//   yolo_finish       one thread per prediction: the fork's averaging over iou_thresh's
//                     anchors, then per block the sums of objectness and delta².
//   yolo_reduce       one block: the blocks' and images' sums in order, the cost, into
//                     the layer's float32 scalars (losses/yolo.py SCALARS).
// The arithmetic follows the NumPy reference's float32 (double where it uses float64)
// operation by operation; the backend compiles this file without fused multiply-adds.

#include "../common/common.cuh"

struct YoloArgs {          // packed by cuda_backend._yolo_args, in this order
    int batch, n, classes, h, w, total, netw, neth;
    int truth_fields, truth_stride, max_boxes;
    int fork, new_coords, iou_loss, iou_thresh_kind, objectness_smooth, has_multipliers,
        clip_delta, extra_anchors;
    float ignore_thresh, truth_thresh, iou_normalizer, obj_normalizer, cls_normalizer,
        max_delta, iou_thresh, smooth_one, smooth_zero;
    // followed by float biases[2 * total], int mask[n], float multipliers[classes]
};

enum IouKind { MSE = 0, IOU = 1, GIOU = 2, DIOU = 3, CIOU = 4 };   // losses/yolo.py IOU_LOSSES
enum Stat { S_IOU, S_CAT, S_OBJ, S_RECALL, S_RECALL75, S_COUNT, S_IOU_LOSS, S_GIOU_LOSS,
            STATS };
#define THREADS 256
#define TRUTH_CHUNK 256

__device__ __forceinline__ const float* biases_of(const YoloArgs* a)
{
    return (const float*)(a + 1);
}
__device__ __forceinline__ const int* mask_of(const YoloArgs* a)
{
    return (const int*)(biases_of(a) + 2 * a->total);
}
__device__ __forceinline__ const float* multipliers_of(const YoloArgs* a)
{
    return (const float*)(mask_of(a) + a->n);
}

// Boxes in an image's truth row: those before the first with x == 0, at most max_boxes.
__device__ int truth_count(const YoloArgs* a, const float* row)
{
    const int limit = min(a->max_boxes, a->truth_stride / a->truth_fields);
    int k = 0;
    while (k < limit && row[k * a->truth_fields] != 0.0f) k++;
    return k;
}

__device__ __forceinline__ Box truth_box(const YoloArgs* a, const float* row, int k)
{
    const float* t = row + k * a->truth_fields;
    return Box{t[0], t[1], t[2], t[3]};
}

// ---- boxes (boxes.py; Box, overlap and Darknet's box_iou are in common.cuh) ------------
// The fork's box_iou: 0 for an empty union.
__device__ __forceinline__ float fork_iou(Box a, Box b)
{
    const float iou = box_iou(a, b);
    return isnan(iou) ? 0.0f : iou;
}

__device__ __forceinline__ void enclosing(Box a, Box b, float* cw, float* ch)
{
    const float left = fminf(a.x - a.w / 2.0f, b.x - b.w / 2.0f);
    const float right = fmaxf(a.x + a.w / 2.0f, b.x + b.w / 2.0f);
    const float top = fminf(a.y - a.h / 2.0f, b.y - b.h / 2.0f);
    const float bottom = fmaxf(a.y + a.h / 2.0f, b.y + b.h / 2.0f);
    *cw = right - left;
    *ch = bottom - top;
}

__device__ __forceinline__ float centre_distance2(Box a, Box b)
{
    return (a.x - b.x) * (a.x - b.x) + (a.y - b.y) * (a.y - b.y);
}

__device__ float box_giou(Box a, Box b)
{
    const float iou = fork_iou(a, b);
    float cw, ch;
    enclosing(a, b, &cw, &ch);
    const float c = cw * ch;
    const float w = overlap(a.x, a.w, b.x, b.w), h = overlap(a.y, a.h, b.y, b.h);
    const float uni = a.w * a.h + b.w * b.h - ((w < 0.0f || h < 0.0f) ? 0.0f : w * h);
    return c == 0.0f ? iou : iou - (c - uni) / c;
}

__device__ float box_diou(Box a, Box b)
{
    const float iou = fork_iou(a, b);
    float cw, ch;
    enclosing(a, b, &cw, &ch);
    const float c = cw * cw + ch * ch;
    const float term = (float)pow((double)(centre_distance2(a, b) / c), 0.6);
    return c == 0.0f ? iou : iou - term;
}

// CIoU's atan gap (pred p, truth t) in double, as the fork.
__device__ __forceinline__ double aspect_gap(Box p, Box t)
{
    return atan((double)(t.w / t.h)) - atan((double)(p.w / p.h));
}

#define FOUR_OVER_PI2 (4.0 / (3.141592653589793 * 3.141592653589793))

__device__ float box_ciou(Box a, Box b)
{
    const float iou = fork_iou(a, b);
    float cw, ch;
    enclosing(a, b, &cw, &ch);
    const float c = cw * cw + ch * ch;
    const double gap = aspect_gap(a, b);
    const float v = (float)(FOUR_OVER_PI2 * gap * gap);
    const float alpha = (float)((double)v / (1.0 - (double)iou + (double)v + 0.000001));
    return c == 0.0f ? iou : iou - (centre_distance2(a, b) / c + alpha * v);
}

__device__ float box_iou_kind(Box a, Box b, int kind)
{
    switch (kind) {
    case GIOU: return box_giou(a, b);
    case DIOU: return box_diou(a, b);
    case CIOU: return box_ciou(a, b);
    default: return fork_iou(a, b);
    }
}

// The fork's dx_box_iou (boxes.dx_box_iou): the (x, y, w, h) gradient raising the IoU of
// the kind of pred p with truth t.
__device__ void dx_box_iou(Box p, Box t, int kind, float d[4])
{
    const float pt0 = p.y - p.h / 2.0f, pb0 = p.y + p.h / 2.0f;
    const float pl0 = p.x - p.w / 2.0f, pr0 = p.x + p.w / 2.0f;
    const float pt = fminf(pt0, pb0), pb = fmaxf(pt0, pb0);
    const float pl = fminf(pl0, pr0), pr = fmaxf(pl0, pr0);
    const float tt = t.y - t.h / 2.0f, tb = t.y + t.h / 2.0f;
    const float tl = t.x - t.w / 2.0f, tr = t.x + t.w / 2.0f;
    const float X = (pb - pt) * (pr - pl);
    const float Xhat = (tb - tt) * (tr - tl);
    const float Ih = fminf(pb, tb) - fmaxf(pt, tt);
    const float Iw = fminf(pr, tr) - fmaxf(pl, tl);
    const float I = Iw * Ih;
    const float U = X + Xhat - I;
    const float S = centre_distance2(p, t);
    const float gCw = fmaxf(pr, tr) - fminf(pl, tl);
    const float gCh = fmaxf(pb, tb) - fminf(pt, tt);
    const float gC = gCw * gCh;
    // edges in the order top, bottom, left, right
    const float dX[4] = {-(pr - pl), pr - pl, -(pb - pt), pb - pt};
    const float dI[4] = {pt > tt ? -Iw : 0.0f, pb < tb ? Iw : 0.0f,
                         pl > tl ? -Ih : 0.0f, pr < tr ? Ih : 0.0f};
    const float dC[4] = {pt < tt ? -gCw : 0.0f, pb > tb ? gCw : 0.0f,
                         pl < tl ? -gCh : 0.0f, pr > tr ? gCh : 0.0f};
    float dU[4], g[4];
    for (int k = 0; k < 4; k++) {
        dU[k] = dX[k] - dI[k];
        g[k] = U > 0.0f ? (U * dI[k] - I * dU[k]) / (U * U) : 0.0f;
    }
    // Edges out of order: the fork gives both the bottom (right) edge's gradient.
    if (!(pt0 < pb0)) g[0] = g[1];
    if (!(pl0 < pr0)) g[2] = g[3];
    const bool apart = Iw <= 0.0f || Ih <= 0.0f;
    if (kind == GIOU) {
        for (int k = 0; k < 4; k++) {
            const float c_term = (gC * dU[k] - U * dC[k]) / (gC * gC);
            g[k] = apart ? c_term : (gC > 0.0f ? g[k] + c_term : g[k]);
        }
    }
    float dx = g[2] + g[3], dy = g[0] + g[1], dw = g[3] - g[2], dh = g[1] - g[0];
    if (kind == DIOU || kind == CIOU) {
        float Cw, Ch;
        enclosing(p, t, &Cw, &Ch);
        const float C = Cw * Cw + Ch * Ch;
        const float dCw_dx = (pr > tr ? 1.0f : 0.0f) - (pl < tl ? 1.0f : 0.0f);
        const float dCw_dw = (pr > tr ? 0.5f : 0.0f) - (pl < tl ? -0.5f : 0.0f);
        const float dCh_dy = (pb > tb ? 1.0f : 0.0f) - (pt < tt ? 1.0f : 0.0f);
        const float dCh_dh = (pb > tb ? 0.5f : 0.0f) - (pt < tt ? -0.5f : 0.0f);
        const float C2 = C * C;
        const float ex = (2.0f * (t.x - p.x) * C - (2.0f * Cw * dCw_dx) * S) / C2;
        const float ey = (2.0f * (t.y - p.y) * C - (2.0f * Ch * dCh_dy) * S) / C2;
        float ew = (2.0f * Cw * dCw_dw) * S / C2;
        float eh = (2.0f * Ch * dCh_dh) * S / C2;
        if (kind == CIOU) {
            const double gap = aspect_gap(p, t);
            const double v = FOUR_OVER_PI2 * gap * gap;
            const float alpha = (float)(v / (1.0 - (double)(I / U) + v + 0.000001));
            const float ar_dw = (float)(2.0 * FOUR_OVER_PI2 * gap * (double)p.h);
            const float ar_dh = (float)(-2.0 * FOUR_OVER_PI2 * gap * (double)p.w);
            ew = ew + alpha * ar_dw;
            eh = eh + alpha * ar_dh;
        }
        const bool near = C > 0.0f;
        dx = apart ? ex : (near ? dx + ex : dx);
        dy = apart ? ey : (near ? dy + ey : dy);
        dw = apart ? ew : (near ? dw + ew : dw);
        dh = apart ? eh : (near ? dh + eh : dh);
    }
    d[0] = dx; d[1] = dy; d[2] = dw; d[3] = dh;
}

// ---- predictions and their deltas ----------------------------------------------------------
// Entry k of the prediction at `at` (image, anchor slot, cell) is at + k * wh.

// get_yolo_box of anchor `anchor` (an index into the biases) at cell (j, i).
__device__ Box decode(const YoloArgs* a, const float* out, long long at, int wh, int anchor,
                      int i, int j)
{
    const float aw = biases_of(a)[2 * anchor], ah = biases_of(a)[2 * anchor + 1];
    const float tx = out[at], ty = out[at + wh], tw = out[at + 2 * wh], th = out[at + 3 * wh];
    Box b;
    b.x = ((float)i + tx) / (float)a->w;
    b.y = ((float)j + ty) / (float)a->h;
    if (a->new_coords) {
        b.w = tw * tw * 4.0f * aw / (float)a->netw;
        b.h = th * th * 4.0f * ah / (float)a->neth;
    } else {
        b.w = (float)(exp((double)tw) * (double)aw / (double)a->netw);
        b.h = (float)(exp((double)th) * (double)ah / (double)a->neth);
    }
    return b;
}

// delta_yolo_box of the original: the box delta (overwritten), scaled by 2 - w*h.
__device__ void box_delta(const YoloArgs* a, Box t, const float* out, float* delta,
                          long long at, int wh, int anchor, int i, int j)
{
    const float scale = 2.0f - t.w * t.h;
    const float target[4] = {
        t.x * (float)a->w - (float)i, t.y * (float)a->h - (float)j,
        (float)log((double)(t.w * (float)a->netw / biases_of(a)[2 * anchor])),
        (float)log((double)(t.h * (float)a->neth / biases_of(a)[2 * anchor + 1]))};
    for (int k = 0; k < 4; k++)
        delta[at + k * wh] = scale * (target[k] - out[at + k * wh]);
}

// The fork's delta_yolo_box (accumulating): mse's scaled differences or the iou_loss's
// gradient, times norm. Sets the prediction's IoU and GIoU with the truth.
__device__ void fork_box_delta(const YoloArgs* a, Box t, const float* out, float* delta,
                               long long at, int wh, int anchor, int i, int j, float norm,
                               float* iou, float* giou)
{
    const float aw = biases_of(a)[2 * anchor], ah = biases_of(a)[2 * anchor + 1];
    Box pred = decode(a, out, at, wh, anchor, i, j);
    *iou = fork_iou(pred, t);
    *giou = box_giou(pred, t);
    if (a->iou_loss == MSE) {
        const float scale = 2.0f - t.w * t.h;
        float target[4] = {t.x * (float)a->w - (float)i, t.y * (float)a->h - (float)j, 0, 0};
        if (a->new_coords) {
            target[2] = (float)sqrt((double)(t.w * (float)a->netw / (4.0f * aw)));
            target[3] = (float)sqrt((double)(t.h * (float)a->neth / (4.0f * ah)));
        } else {
            target[2] = (float)log((double)(t.w * (float)a->netw / aw));
            target[3] = (float)log((double)(t.h * (float)a->neth / ah));
        }
        for (int k = 0; k < 4; k++)
            delta[at + k * wh] += scale * (target[k] - out[at + k * wh]) * norm;
        return;
    }
    if (pred.w == 0.0f) pred.w = 1.0f;   // the fork's guard against NaN in dx_box_iou
    if (pred.h == 0.0f) pred.h = 1.0f;
    float d[4];
    dx_box_iou(pred, t, a->iou_loss, d);
    if (!a->new_coords) {
        d[2] *= (float)exp((double)out[at + 2 * wh]);
        d[3] *= (float)exp((double)out[at + 3 * wh]);
    }
    for (int k = 0; k < 4; k++) {
        float v = d[k] * norm;
        if (!isfinite(v)) v = 0.0f;
        if (a->clip_delta) v = fminf(fmaxf(v, -a->max_delta), a->max_delta);
        delta[at + k * wh] += v;
    }
}

__device__ __forceinline__ float class_multiplier(const YoloArgs* a, int class_id)
{
    return a->has_multipliers ? multipliers_of(a)[class_id] : 1.0f;
}

// Class delta of class c: the target (one-hot, or the fork's smoothed one) minus p; the
// fork keeps the old value where that is not finite.
__device__ __forceinline__ void set_class_delta(const YoloArgs* a, float* delta, long long at,
                                                float p, bool is_class)
{
    if (a->fork) {
        const float r = (is_class ? a->smooth_one : a->smooth_zero) - p;
        if (isfinite(r)) delta[at] = r;
    } else {
        delta[at] = (is_class ? 1.0f : 0.0f) - p;
    }
}

// ---- kernels --------------------------------------------------------------------------------
// One thread per prediction of image blockIdx.y: the per-prediction part of the loss.
extern "C" __global__ void __launch_bounds__(THREADS)
yolo_predictions(const YoloArgs* args, const float* __restrict__ out, const float* truth,
                 float* __restrict__ delta)
{
    __shared__ Box truths[TRUTH_CHUNK];
    const YoloArgs* a = args;
    const int b = blockIdx.y, wh = a->w * a->h, entries = 5 + a->classes;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    const bool live = p < a->n * wh;
    const int slot = live ? p / wh : 0, cell = live ? p - slot * wh : 0;
    const int i = cell % a->w, j = cell / a->w;
    const long long at = (long long)b * a->n * entries * wh + (long long)slot * entries * wh + cell;
    const float* row = truth + (long long)b * a->truth_stride;
    const int count = truth_count(a, row);
    const int anchor = mask_of(a)[slot];
    Box pred = {0, 0, 0, 0};
    if (live) pred = decode(a, out, at, wh, anchor, i, j);
    float best = 0.0f;
    int best_t = 0;
    for (int base = 0; base < count; base += TRUTH_CHUNK) {
        const int chunk = min(TRUTH_CHUNK, count - base);
        __syncthreads();
        for (int k = threadIdx.x; k < chunk; k += blockDim.x) truths[k] = truth_box(a, row, base + k);
        __syncthreads();
        for (int k = 0; k < chunk; k++) {
            const float iou = box_iou(pred, truths[k]);   // NaN never passes >
            if (iou > best) { best = iou; best_t = base + k; }
        }
    }
    if (!live) return;
    const float obj = out[at + 4 * wh];
    for (int k = 0; k < entries; k++) delta[at + k * wh] = 0.0f;
    float d_obj;
    if (!a->fork) {
        d_obj = best > a->ignore_thresh ? 0.0f : 0.0f - obj;
    } else {
        const float obj_norm = a->obj_normalizer;
        d_obj = obj_norm * (0.0f - obj);
        // Near a truth, objectness is not punished when the prediction names some class.
        bool named = false;
        for (int c = 0; c < a->classes; c++) named |= out[at + (5 + c) * wh] > 0.25f;
        const float best_match = named ? best : 0.0f;
        if (best_match > a->ignore_thresh) {
            if (a->objectness_smooth) {
                d_obj = fmaxf(d_obj, obj_norm * (best_match - obj));
            } else {
                d_obj = 0.0f;
            }
        }
    }
    if (best > a->truth_thresh) {
        const float* t = row + best_t * a->truth_fields;
        const Box tb = {t[0], t[1], t[2], t[3]};
        const int class_id = (int)t[4];
        const float mult = class_multiplier(a, class_id);
        if (a->fork)
            d_obj = a->obj_normalizer * (a->objectness_smooth ? best * best - obj : 1.0f - obj);
        else
            d_obj = 1.0f - obj;
        for (int c = 0; c < a->classes; c++)
            set_class_delta(a, delta, at + (5 + c) * wh, out[at + (5 + c) * wh], c == class_id);
        const long long at_class = at + (5 + class_id) * wh;
        if (a->fork && a->has_multipliers) delta[at_class] *= mult * a->cls_normalizer;
        if (a->fork && a->objectness_smooth) delta[at_class] = mult * (best * best - out[at_class]);
        if (a->fork) {
            float iou, giou;
            fork_box_delta(a, tb, out, delta, at, wh, anchor, i, j, a->iou_normalizer * mult,
                           &iou, &giou);
        } else {
            box_delta(a, tb, out, delta, at, wh, anchor, i, j);
        }
    }
    delta[at + 4 * wh] = d_obj;
}

// Make slot `slot` (of `anchor`) of cell (j, i) responsible for truth t, as one warp: box
// and objectness deltas and the statistics in lane 0, the class deltas over the lanes.
__device__ void assign(const YoloArgs* a, const float* out, float* delta, Box t, int class_id,
                       int anchor, int slot, int i, int j, double* st)
{
    const int lane = threadIdx.x & 31, wh = a->w * a->h, entries = 5 + a->classes;
    const long long at = (long long)blockIdx.x * a->n * entries * wh
                         + (long long)slot * entries * wh + j * a->w + i;
    const long long at_class = at + (5 + class_id) * wh;
    const float mult = class_multiplier(a, class_id);
    // Darknet's quirk: a class delta already set (class 0's in the original, class_id's in
    // the fork) means an earlier truth told this slot: only class_id's is rewritten.
    __syncwarp();
    const bool told = delta[a->fork ? at_class : at + 5 * wh] != 0.0f;
    __syncwarp();
    if (lane == 0) {
        const float obj = out[at + 4 * wh];
        float iou, giou = 0.0f;
        if (a->fork) {
            fork_box_delta(a, t, out, delta, at, wh, anchor, i, j, a->iou_normalizer * mult,
                           &iou, &giou);
            const float fresh = mult * a->obj_normalizer * (1.0f - obj);
            if (!a->objectness_smooth || delta[at + 4 * wh] == 0.0f) delta[at + 4 * wh] = fresh;
        } else {
            box_delta(a, t, out, delta, at, wh, anchor, i, j);
            iou = box_iou(decode(a, out, at, wh, anchor, i, j), t);
            delta[at + 4 * wh] = 1.0f - obj;
        }
        st[S_IOU] += (double)iou;
        if (a->fork) {
            st[S_IOU_LOSS] += 1.0 - (double)iou;
            st[S_GIOU_LOSS] += 1.0 - (double)giou;
        }
        st[S_OBJ] += (double)obj;
        st[S_CAT] += (double)out[at_class];
        st[S_COUNT] += 1.0;
        st[S_RECALL] += iou > 0.5f ? 1.0 : 0.0;
        st[S_RECALL75] += iou > 0.75f ? 1.0 : 0.0;
    }
    if (told) {
        if (lane == (class_id & 31)) {
            if (a->fork) {
                const float r = a->smooth_one - out[at_class];
                if (isfinite(r)) delta[at_class] = r;
                if (a->has_multipliers) delta[at_class] *= mult;
            } else {
                delta[at_class] = 1.0f - out[at_class];
            }
        }
    } else {
        for (int c = lane; c < a->classes; c += 32) {
            const long long k = at + (5 + c) * wh;
            set_class_delta(a, delta, k, out[k], c == class_id);
            if (c == class_id && a->fork && a->has_multipliers)
                delta[k] *= mult * a->cls_normalizer;
        }
    }
    __syncwarp();
}

// One warp (block) per image: its truths in order. stats[image * STATS + Stat].
extern "C" __global__ void yolo_truths(const YoloArgs* args, const float* __restrict__ out,
                                       const float* truth, float* delta, double* stats)
{
    const YoloArgs* a = args;
    const float* row = truth + (long long)blockIdx.x * a->truth_stride;
    const int count = truth_count(a, row);
    const int* mask = mask_of(a);
    double st[STATS] = {0};
    for (int k = 0; k < count; k++) {
        const Box t = truth_box(a, row, k);
        const int class_id = (int)row[k * a->truth_fields + 4];
        const int j = min((int)(t.y * (float)a->h), a->h - 1);   // x = 1 would overrun
        const int i = min((int)(t.x * (float)a->w), a->w - 1);
        const Box shape = {0.0f, 0.0f, t.w, t.h};
        int best_n = 0;
        float best = 0.0f;
        for (int n = 0; n < a->total; n++) {
            const Box anchor = {0.0f, 0.0f, biases_of(a)[2 * n] / (float)a->netw,
                                biases_of(a)[2 * n + 1] / (float)a->neth};
            const float iou = box_iou(anchor, shape);
            if (iou > best) { best = iou; best_n = n; }
        }
        for (int slot = 0; slot < a->n; slot++)
            if (mask[slot] == best_n) {
                assign(a, out, delta, t, class_id, best_n, slot, i, j, st);
                break;
            }
        if (!a->extra_anchors) continue;
        // The fork's iou_thresh: every other masked anchor close enough in shape, in order.
        for (int n = 0; n < a->total; n++) {
            if (n == best_n) continue;
            const Box anchor = {0.0f, 0.0f, biases_of(a)[2 * n] / (float)a->netw,
                                biases_of(a)[2 * n + 1] / (float)a->neth};
            if (!(box_iou_kind(anchor, shape, a->iou_thresh_kind) > a->iou_thresh)) continue;
            for (int slot = 0; slot < a->n; slot++)
                if (mask[slot] == n) {
                    assign(a, out, delta, t, class_id, n, slot, i, j, st);
                    break;
                }
        }
    }
    if ((threadIdx.x & 31) == 0)
        for (int s = 0; s < STATS; s++) stats[blockIdx.x * STATS + s] = st[s];
}

// One thread per prediction (grid as yolo_predictions): the fork's averaging of the box
// delta over the classes a slot was told (iou_thresh < 1), then this block's sums of
// objectness, delta² and delta² but the box's into partial[block * 3 ...].
extern "C" __global__ void __launch_bounds__(THREADS)
yolo_finish(const YoloArgs* args, const float* __restrict__ out, float* __restrict__ delta,
            double* __restrict__ partial)
{
    const YoloArgs* a = args;
    const int wh = a->w * a->h, entries = 5 + a->classes;
    const int p = blockIdx.x * blockDim.x + threadIdx.x;
    double obj = 0.0, all = 0.0, box_free = 0.0;
    if (p < a->n * wh) {
        const int slot = p / wh, cell = p - slot * wh;
        const long long at = (long long)blockIdx.y * a->n * entries * wh
                             + (long long)slot * entries * wh + cell;
        if (a->extra_anchors) {
            int told = 0;
            for (int c = 0; c < a->classes; c++) told += delta[at + (5 + c) * wh] > 0.0f;
            if (delta[at + 4 * wh] != 0.0f && told > 0)
                for (int k = 0; k < 4; k++)
                    delta[at + k * wh] = (float)((double)delta[at + k * wh] / told);
        }
        obj = (double)out[at + 4 * wh];
        for (int k = 0; k < entries; k++) {
            const double d = (double)delta[at + k * wh];
            all += d * d;
            if (k >= 4) box_free += d * d;
        }
    }
    const int block = blockIdx.y * gridDim.x + blockIdx.x;
    obj = block_sum(obj);
    if (threadIdx.x == 0) partial[3 * block] = obj;
    all = block_sum(all);
    if (threadIdx.x == 0) partial[3 * block + 1] = all;
    box_free = block_sum(box_free);
    if (threadIdx.x == 0) partial[3 * block + 2] = box_free;
}

// One block: the sums in order and the cost into scalars (losses/yolo.py SCALARS).
extern "C" __global__ void __launch_bounds__(THREADS)
yolo_reduce(const YoloArgs* args, const double* __restrict__ partial, int blocks,
            const double* __restrict__ stats, float* __restrict__ scalars)
{
    const YoloArgs* a = args;
    double sums[3];
    for (int s = 0; s < 3; s++) {
        double v = 0.0;
        for (int k = threadIdx.x; k < blocks; k += blockDim.x) v += partial[3 * k + s];
        sums[s] = block_sum(v);
    }
    if (threadIdx.x != 0) return;
    double st[STATS] = {0};
    for (int b = 0; b < a->batch; b++)
        for (int s = 0; s < STATS; s++) st[s] += stats[b * STATS + s];
    const double anyobj = sums[0], loss = sums[1], box_free = sums[2];
    double cost = loss;
    if (a->fork && a->iou_loss != MSE) {
        const double lost = a->iou_loss == GIOU ? st[S_GIOU_LOSS] : st[S_IOU_LOSS];
        cost = (double)a->iou_normalizer * lost / fmax(st[S_COUNT], 1.0)
               + (double)a->obj_normalizer * box_free;
    }
    const double values[12] = {cost, st[S_IOU], st[S_CAT], st[S_OBJ], anyobj, st[S_RECALL],
                               st[S_RECALL75], st[S_COUNT], loss, box_free, st[S_IOU_LOSS],
                               st[S_GIOU_LOSS]};
    for (int s = 0; s < 12; s++) scalars[s] = (float)values[s];
}
