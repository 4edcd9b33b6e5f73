/* Reference detections and NMS of the AlexeyAB fork (CPU build), for darknet-py's tests.
 *
 * usage: fork_detect CFG WEIGHTS IMAGE THRESH NMS BETA OUT.bin
 * Loads IMAGE as the fork's detector test does, letterboxes it to the network size,
 * predicts, takes get_network_boxes(thresh, hier .5, letter 1), then runs each NMS kind
 * (do_nms_sort for the default; diounms_sort for greedynms, diounms with BETA, cornersnms)
 * on its own copy. OUT.bin: records (int32 name length, name, int32 count, float32s):
 * the detections before NMS ("boxes" n x 4, "objectness", "probs" n x classes) and, per
 * kind, the detections in the order NMS leaves them ("<kind>_boxes", "<kind>_probs"). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "darknet.h"
#include "network.h"
#include "parser.h"
#include "image.h"
#include "box.h"

static void record(FILE *f, const char *name, const float *v, int count)
{
    int len = (int)strlen(name);
    fwrite(&len, sizeof(int), 1, f);
    fwrite(name, 1, len, f);
    fwrite(&count, sizeof(int), 1, f);
    fwrite(v, sizeof(float), count, f);
}

static void record_dets(FILE *f, const char *prefix, detection *dets, int n, int classes)
{
    float *boxes = (float *)calloc(4 * n + 1, sizeof(float));
    float *probs = (float *)calloc(classes * n + 1, sizeof(float));
    float *obj = (float *)calloc(n + 1, sizeof(float));
    char name[64];
    int i;
    for (i = 0; i < n; ++i) {
        boxes[4 * i] = dets[i].bbox.x;
        boxes[4 * i + 1] = dets[i].bbox.y;
        boxes[4 * i + 2] = dets[i].bbox.w;
        boxes[4 * i + 3] = dets[i].bbox.h;
        obj[i] = dets[i].objectness;
        memcpy(probs + classes * i, dets[i].prob, classes * sizeof(float));
    }
    snprintf(name, sizeof(name), "%sboxes", prefix);
    record(f, name, boxes, 4 * n);
    snprintf(name, sizeof(name), "%sprobs", prefix);
    record(f, name, probs, classes * n);
    snprintf(name, sizeof(name), "%sobjectness", prefix);
    record(f, name, obj, n);
    free(boxes); free(probs); free(obj);
}

static detection *copy_dets(detection *dets, int n, int classes)
{
    detection *c = (detection *)calloc(n, sizeof(detection));
    int i;
    for (i = 0; i < n; ++i) {
        c[i] = dets[i];
        c[i].prob = (float *)calloc(classes, sizeof(float));
        memcpy(c[i].prob, dets[i].prob, classes * sizeof(float));
    }
    return c;
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: %s CFG WEIGHTS IMAGE THRESH NMS BETA OUT.bin\n", argv[0]);
        return 2;
    }
    float thresh = atof(argv[4]), nms = atof(argv[5]), beta = atof(argv[6]);
    network net = parse_network_cfg_custom(argv[1], 1, 1);
    load_weights(&net, argv[2]);
    fuse_conv_batchnorm(net);
    image im = load_image(argv[3], 0, 0, net.c);
    image sized = letterbox_image(im, net.w, net.h);
    network_predict(net, sized.data);
    int n = 0, k;
    detection *dets = get_network_boxes(&net, im.w, im.h, thresh, .5, 0, 1, &n, 1);
    layer l = net.layers[net.n - 1];
    FILE *f = fopen(argv[7], "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", argv[7]); return 2; }
    float meta[4] = { (float)n, (float)l.classes, (float)im.w, (float)im.h };
    record(f, "meta", meta, 4);
    record_dets(f, "", dets, n, l.classes);
    const char *names[4] = { "default_", "greedynms_", "diounms_", "cornersnms_" };
    NMS_KIND kinds[4] = { DEFAULT_NMS, GREEDY_NMS, DIOU_NMS, CORNERS_NMS };
    for (k = 0; k < 4; ++k) {
        detection *c = copy_dets(dets, n, l.classes);
        if (kinds[k] == DEFAULT_NMS) do_nms_sort(c, n, l.classes, nms);
        else diounms_sort(c, n, l.classes, nms, kinds[k], beta);
        record_dets(f, names[k], c, n, l.classes);
    }
    fclose(f);
    return 0;
}
