/* Reference dumps of the AlexeyAB fork's training step, for darknet-py's tests: of its CPU
 * build, or (compiled with -DGPU -DCUDNN against a GPU=1 CUDNN=1 build) of its GPU build.
 *
 * Links against the fork's compiled objects (see build.sh); none of the fork's code is here.
 * usage: fork_train_step CFG WEIGHTS|- X.f32 Y.f32 ITERATIONS OUT.bin INIT.weights
 *   X.f32: the images of one iteration (batch*subdivisions of them), float32, NCHW planes;
 *   Y.f32: their truth rows, (batch*subdivisions) x (the last [yolo]'s truths) float32, or
 *   for a network without [yolo] x (the last layer's outputs): a classifier's one-hot rows.
 * Runs ITERATIONS calls of train_network (the same data each time), then writes OUT.bin:
 * records (int32 name length, name, int32 count, count float32s): every layer's output and
 * delta of the last pass, every parameter after the last update, the losses and rates. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "darknet.h"
#include "network.h"
#include "parser.h"
#include "data.h"
#ifdef GPU
#include "dark_cuda.h"
#include "convolutional_layer.h"
#endif

static void record(FILE *f, const char *name, const float *v, int count)
{
    int len = (int)strlen(name);
    fwrite(&len, sizeof(int), 1, f);
    fwrite(name, 1, len, f);
    fwrite(&count, sizeof(int), 1, f);
    fwrite(v, sizeof(float), count, f);
}

static void record_layer(FILE *f, int i, const char *what, const float *v, int count)
{
    char name[64];
    if (!v || count <= 0) return;
    snprintf(name, sizeof(name), "layer_%d_%s", i, what);
    record(f, name, v, count);
}

static float *read_floats(const char *path, size_t count)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) { fprintf(stderr, "cannot open %s\n", path); exit(2); }
    float *v = (float *)calloc(count, sizeof(float));
    if (fread(v, sizeof(float), count, fp) != count) {
        fprintf(stderr, "%s: expected %zu floats\n", path, count); exit(2);
    }
    fclose(fp);
    return v;
}

static void dump_layer(FILE *f, network net, int i)
{
    layer l = net.layers[i];
    int n_out = l.outputs * l.batch;
    if (l.type == DROPOUT) return;   /* its output and delta are the previous layer's */
#ifdef GPU
    /* The GPU build keeps its numbers on the device. Its batch norm's mean and variance
     * are cuDNN's saved mean and inverse deviation: not dumped. */
    if (l.output_gpu && l.output) cuda_pull_array(l.output_gpu, l.output, n_out);
    if (l.delta_gpu && l.delta) cuda_pull_array(l.delta_gpu, l.delta, n_out);
    if (l.type == CONVOLUTIONAL) pull_convolutional_layer(l);
    if (l.type == CONVOLUTIONAL) l.mean = l.variance = 0;
#endif
#ifdef GPU
    /* cudnnBatchNormalizationBackward leaves the delta in output_gpu: no output to dump */
    if (!l.batch_normalize && l.type != BATCHNORM)
#endif
    record_layer(f, i, "output", l.output, n_out);
    record_layer(f, i, "delta", l.delta, n_out);
    if (l.type == CONNECTED) {
        record_layer(f, i, "weights", l.weights, l.inputs * l.outputs);
        record_layer(f, i, "biases", l.biases, l.outputs);
    }
    if (l.type == CONVOLUTIONAL && !l.share_layer) {
        record_layer(f, i, "weights", l.weights, l.nweights);
        record_layer(f, i, "biases", l.biases, l.n);
        if (l.batch_normalize) {
            record_layer(f, i, "scales", l.scales, l.n);
            record_layer(f, i, "rolling_mean", l.rolling_mean, l.n);
            record_layer(f, i, "rolling_variance", l.rolling_variance, l.n);
            record_layer(f, i, "mean", l.mean, l.n);
            record_layer(f, i, "variance", l.variance, l.n);
        }
    }
    if (l.cost) record_layer(f, i, "cost", l.cost, 1);
}

int main(int argc, char **argv)
{
    if (argc != 8) {
        fprintf(stderr, "usage: %s CFG WEIGHTS|- X.f32 Y.f32 ITERATIONS OUT.bin INIT.weights\n", argv[0]);
        return 2;
    }
#ifdef GPU
    cuda_set_device(0);
#endif
    network net = parse_network_cfg(argv[1]);
    if (strcmp(argv[2], "-")) load_weights(&net, argv[2]);
    save_weights(net, argv[7]);
    int images = net.batch * net.subdivisions, i, it;
    int truths = 0;
    for (i = 0; i < net.n; ++i) if (net.layers[i].type == YOLO) truths = net.layers[i].truths;
    if (!truths) truths = net.layers[net.n - 1].outputs;   /* a classifier: one-hot rows */
    int cols = net.h * net.w * net.c;
    float *x = read_floats(argv[3], (size_t)images * cols);
    float *y = read_floats(argv[4], (size_t)images * truths);
    data d = {0};
    d.X.rows = d.y.rows = images;
    d.X.cols = cols;
    d.y.cols = truths;
    d.X.vals = (float **)calloc(images, sizeof(float *));
    d.y.vals = (float **)calloc(images, sizeof(float *));
    for (i = 0; i < images; ++i) {
        d.X.vals[i] = x + (size_t)i * cols;
        d.y.vals[i] = y + (size_t)i * truths;
    }
    int iterations = atoi(argv[5]);
    float *losses = (float *)calloc(iterations, sizeof(float));
    float *rates = (float *)calloc(iterations, sizeof(float));
    for (it = 0; it < iterations; ++it) {
#ifndef GPU
        /* darknet-py zeroes, as an iteration starts, the deltas this build lets grow from
         * iteration to iteration (layers without l.train: route, upsample, ...; they make
         * its training diverge): the same here, so that the fixtures hold that rule. (The
         * GPU build clears every delta before each pass.) */
        for (i = 0; i < net.n; ++i)
            if (!net.layers[i].train && net.layers[i].delta)
                memset(net.layers[i].delta, 0, sizeof(float) * net.layers[i].outputs * net.layers[i].batch);
#endif
        losses[it] = train_network(net, d);
        rates[it] = get_current_rate(net);
    }
    FILE *f = fopen(argv[6], "wb");
    if (!f) { fprintf(stderr, "cannot write %s\n", argv[6]); return 2; }
    record(f, "losses", losses, iterations);
    record(f, "rates", rates, iterations);
    for (i = 0; i < net.n; ++i) dump_layer(f, net, i);
    fclose(f);
    return 0;
}
