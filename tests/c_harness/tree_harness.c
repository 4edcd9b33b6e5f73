/* Reference outputs of pjreddie Darknet's softmax-tree code (tree.c, softmax_layer.c,
 * region_layer.c, data.c) for tests/test_tree.py. Built and run by
 * tests/c_harness/make_tree_fixture.py against a CPU build of Darknet (libdarknet.a);
 * prints "name count values..." lines that the script stores as an npz. */
#include <stdio.h>
#include <stdlib.h>
#include "darknet.h"

void fill_hierarchy(float *truth, int k, tree *hierarchy);
int hierarchy_top_prediction(float *predictions, tree *hier, float thresh, int stride);
void delta_region_class(float *output, float *delta, int index, int class, int classes,
                        tree *hier, float scale, int stride, float *avg_cat, int tag);
layer make_region_layer(int batch, int w, int h, int n, int classes, int coords);
layer make_softmax_layer(int batch, int inputs, int groups);
void forward_softmax_layer(const layer l, network net);

static unsigned long long state = 12345;
static float uniform(void)   /* a fixed LCG: the same numbers on every machine */
{
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (float)((state >> 40) & 0xFFFFFF) / 16777216.0f;
}

static void put_f(const char *name, const float *v, int n)
{
    printf("%s f %d", name, n);
    for (int i = 0; i < n; ++i) printf(" %.9g", v[i]);
    printf("\n");
}

static void put_i(const char *name, const int *v, int n)
{
    printf("%s i %d", name, n);
    for (int i = 0; i < n; ++i) printf(" %d", v[i]);
    printf("\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) { fprintf(stderr, "usage: tree_harness TREE\n"); return 2; }
    tree *t = read_tree(argv[1]);
    const int k = t->n;
    put_i("parent", t->parent, k); put_i("child", t->child, k); put_i("group", t->group, k);
    put_i("leaf", t->leaf, k);
    put_i("group_offset", t->group_offset, t->groups); put_i("group_size", t->group_size, t->groups);

    /* fill_hierarchy: rows with one class each, and one with two */
    float truth[4 * 64] = {0};
    int labels[4][2] = {{9, -1}, {13, -1}, {2, -1}, {4, 12}};
    for (int r = 0; r < 4; ++r)
        for (int j = 0; j < 2; ++j) if (labels[r][j] >= 0) truth[r * k + labels[r][j]] = 1;
    for (int r = 0; r < 4; ++r) fill_hierarchy(truth + r * k, k, t);
    put_f("fill_hierarchy", truth, 4 * k);

    /* [softmax] tree=: forward at temperature 2 over 3 images */
    layer s = make_softmax_layer(3, k, 1);
    s.softmax_tree = t; s.temperature = 2;
    network net = {0};
    float *x = calloc(3 * k, sizeof(float));
    for (int i = 0; i < 3 * k; ++i) x[i] = 4 * uniform() - 2;
    net.input = x;
    forward_softmax_layer(s, net);
    put_f("softmax_input", x, 3 * k); put_f("softmax_output", s.output, 3 * k);

    /* hierarchy_predictions and hierarchy_top_prediction at stride 3 (3 interleaved rows) */
    float p[3 * 64], q[3 * 64];
    for (int i = 0; i < 3 * k; ++i) p[i] = q[i] = uniform();
    put_f("hier_input", p, 3 * k);
    for (int r = 0; r < 3; ++r) {
        hierarchy_predictions(p + r, k, t, 0, 3);
        hierarchy_predictions(q + r, k, t, 1, 3);
    }
    put_f("hier_all", p, 3 * k); put_f("hier_leaves", q, 3 * k);
    float thresholds[5] = {0.0f, 0.1f, 0.3f, 0.5f, 0.9f};
    int top[15];
    for (int r = 0; r < 3; ++r)
        for (int h = 0; h < 5; ++h) top[r * 5 + h] = hierarchy_top_prediction(p + r, t, thresholds[h], 3);
    put_f("top_thresholds", thresholds, 5); put_i("top", top, 15);

    /* delta_region_class's tree branch at stride 4 for class 10 (retriever) then 12 */
    float out[4 * 64], delta[4 * 64] = {0}, avg_cat = 0;
    for (int i = 0; i < 4 * k; ++i) out[i] = uniform();
    delta_region_class(out, delta, 1, 10, k, t, 1.5f, 4, &avg_cat, 1);
    delta_region_class(out, delta, 2, 12, k, t, 1.5f, 4, &avg_cat, 1);
    put_f("class_output", out, 4 * k); put_f("class_delta", delta, 4 * k);
    put_f("class_avg_cat", &avg_cat, 1);

    /* get_region_detections with the tree: 2 anchors on a 3x2 grid */
    int w = 3, h = 2, n = 2;
    layer r = make_region_layer(1, w, h, n, k, 4);
    r.softmax_tree = t; r.softmax = 1;
    for (int i = 0; i < 2 * n; ++i) r.biases[i] = 0.5f + 2 * uniform();
    for (int i = 0; i < r.outputs; ++i) r.output[i] = uniform();
    for (int a = 0; a < n; ++a)          /* box offsets in (-1, 1), as raw logits */
        for (int e = 0; e < 4; ++e)
            for (int c = 0; c < w * h; ++c) r.output[(a * (5 + k) + e) * w * h + c] = 2 * uniform() - 1;
    put_f("region_biases", r.biases, 2 * n); put_f("region_output", r.output, r.outputs);
    detection *dets = calloc(w * h * n, sizeof(detection));
    for (int i = 0; i < w * h * n; ++i) dets[i].prob = calloc(k, sizeof(float));
    get_region_detections(r, 640, 480, 96, 64, 0.4f, 0, 0.45f, 1, dets);
    float *boxes = calloc(4 * w * h * n, sizeof(float)), *obj = calloc(w * h * n, sizeof(float));
    float *probs = calloc(k * w * h * n, sizeof(float));
    for (int i = 0; i < w * h * n; ++i) {
        boxes[4 * i] = dets[i].bbox.x; boxes[4 * i + 1] = dets[i].bbox.y;
        boxes[4 * i + 2] = dets[i].bbox.w; boxes[4 * i + 3] = dets[i].bbox.h;
        obj[i] = dets[i].objectness;
        for (int c = 0; c < k; ++c) probs[i * k + c] = dets[i].prob[c];
    }
    put_f("region_boxes", boxes, 4 * w * h * n); put_f("region_objectness", obj, w * h * n);
    put_f("region_probs", probs, k * w * h * n);
    return 0;
}
