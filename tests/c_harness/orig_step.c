/* Reference step of the original (pjreddie) Darknet for darknet-py's layer fixtures.
 *
 * usage: orig_step CFG INPUT TRUTH OUTDIR
 * INPUT and TRUTH hold batch * inputs and batch * truths float32 values. Writes into OUTDIR:
 *   weights0.weights   the parameters as built (save_weights)
 *   infer_<i>.f32      layer i's output of an inference forward
 *   out_<i>.f32        layer i's output of the training forward
 *   delta_<i>.f32      layer i's delta after backward
 *   cost.f32           the network's cost of the training step
 *   weights1.weights   the parameters after the update
 * Built and run by tests/c_harness/make_fixtures.py, which packs these into an npz. */
#include <stdio.h>
#include <stdlib.h>
#include "darknet.h"

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
    network *net = parse_network_cfg(argv[1]);
    snprintf(path, sizeof path, "%s/weights0.weights", argv[4]);
    save_weights(net, path);
    read_floats(argv[2], net->input, (size_t)net->batch * net->inputs);
    read_floats(argv[3], net->truth, (size_t)net->batch * net->truths);
    int i;
    net->train = 0;
    forward_network(net);
    for (i = 0; i < net->n; ++i)
        write_floats(argv[4], "infer", i, net->layers[i].output, (size_t)net->batch * net->layers[i].outputs);
    float cost = train_network_datum(net);
    for (i = 0; i < net->n; ++i) {
        layer l = net->layers[i];
        write_floats(argv[4], "out", i, l.output, (size_t)net->batch * l.outputs);
        if (l.delta) write_floats(argv[4], "delta", i, l.delta, (size_t)net->batch * l.outputs);
    }
    write_floats(argv[4], "cost", 0, &cost, 1);
    snprintf(path, sizeof path, "%s/weights1.weights", argv[4]);
    save_weights(net, path);
    return 0;
}
