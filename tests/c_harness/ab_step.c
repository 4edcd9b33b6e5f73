/* Reference step of the AlexeyAB fork of Darknet for darknet-py's layer fixtures.
 *
 * usage: ab_step CFG INPUT TRUTH OUTDIR   (the same files as orig_step.c writes)
 * The step is the fork's train_network: train_network_datum (forward and backward), then
 * update_network. Built and run by tests/c_harness/make_fixtures.py. */
#include <stdio.h>
#include <stdlib.h>
#include "darknet.h"
#include "network.h"
#include "parser.h"

static void read_floats(const char *path, float *dst, size_t n)
{
    FILE *f = fopen(path, "rb");
    if (!f || fread(dst, sizeof(float), n, f) != n) { fprintf(stderr, "cannot read %s\n", path); exit(2); }
    fclose(f);
}

static void write_floats(const char *dir, const char *what, int i, const float *src, size_t n)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/%s_%d.f32", dir, what, i);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(src, sizeof(float), n, f) != n) { fprintf(stderr, "cannot write %s\n", path); exit(2); }
    fclose(f);
}

int main(int argc, char **argv)
{
    if (argc != 5) { fprintf(stderr, "usage: %s CFG INPUT TRUTH OUTDIR\n", argv[0]); return 2; }
    char path[4096];
    srand(12345);
    network net = parse_network_cfg(argv[1]);
    snprintf(path, sizeof path, "%s/weights0.weights", argv[4]);
    save_weights(net, path);
    layer last = net.layers[net.n - 1];
    size_t inputs = (size_t)net.batch * net.inputs, truths = (size_t)net.batch * last.outputs;
    float *x = calloc(inputs, sizeof(float)), *y = calloc(truths, sizeof(float));
    read_floats(argv[2], x, inputs);
    read_floats(argv[3], y, truths);
    int i;
    network_state state = {0};
    state.net = net;
    state.input = x;
    state.truth = y;
    state.train = 0;
    forward_network(net, state);
    for (i = 0; i < net.n; ++i)
        write_floats(argv[4], "infer", i, net.layers[i].output, (size_t)net.batch * net.layers[i].outputs);
    float cost = train_network_datum(net, x, y);
    for (i = 0; i < net.n; ++i) {
        layer l = net.layers[i];
        write_floats(argv[4], "out", i, l.output, (size_t)net.batch * l.outputs);
        if (l.delta) write_floats(argv[4], "delta", i, l.delta, (size_t)net.batch * l.outputs);
    }
    write_floats(argv[4], "cost", 0, &cost, 1);
    update_network(net);
    snprintf(path, sizeof path, "%s/weights1.weights", argv[4]);
    save_weights(net, path);
    return 0;
}
