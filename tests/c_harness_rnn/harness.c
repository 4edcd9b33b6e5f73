/* Reference runs of Darknet's recurrent layers for darknet-py's fixtures.
 *
 * harness CFG WEIGHTS X Y OUTDIR
 * Loads CFG and WEIGHTS with the C Darknet it is linked against (-DFORK: the AlexeyAB
 * fork), runs two inference passes on X (the hidden state carried between them), then
 * one training pass on X and truth Y followed by the weight update, and writes into
 * OUTDIR: pred1.bin, pred2.bin (the last layer's output of each inference pass),
 * out_<i>.bin and delta_<i>.bin (every layer's output and delta of the training pass),
 * cost.bin and updated.weights. X and Y are raw float32, batch rows each. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "darknet.h"
#include "lstm_layer.h"
#ifdef FORK
#include "network.h"
#include "parser.h"
#define NET(n) (*(n))
#else
#define NET(n) (n)
void backward_lstm_layer(layer l, network net);   /* in lstm_layer.c, not in its header */
#endif

static float *read_floats(const char *path, size_t n)
{
    float *a = calloc(n, sizeof(float));
    FILE *f = fopen(path, "rb");
    if (!f || fread(a, sizeof(float), n, f) != n) { fprintf(stderr, "cannot read %s\n", path); exit(1); }
    fclose(f);
    return a;
}

static void write_floats(const char *dir, const char *name, int index, const float *a, size_t n)
{
    char path[1024];
    if (index >= 0) snprintf(path, sizeof path, "%s/%s_%d.bin", dir, name, index);
    else snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f || (a && fwrite(a, sizeof(float), n, f) != n)) { fprintf(stderr, "cannot write %s\n", path); exit(1); }
    fclose(f);
}

/* What the C code needs to train these layers on the CPU at all: the original's [rnn]
 * keeps one step of state but a training forward writes steps + 1 of them (a heap
 * overflow), and its [crnn] convolutions use a workspace sized without them (another);
 * neither Darknet allocates a CPU delta for [lstm] (its training forward
 * clears a NULL pointer), and the original never hooks up its CPU backward_lstm_layer. */
static void make_trainable(network *net)
{
    int i;
    for (i = 0; i < net->n; ++i) {
        layer *l = &net->layers[i];
#ifndef FORK
        if (l->type == CRNN) {   /* the original sizes the workspace without its convolutions */
            size_t need = l->input_layer->workspace_size;
            if (l->self_layer->workspace_size > need) need = l->self_layer->workspace_size;
            if (l->output_layer->workspace_size > need) need = l->output_layer->workspace_size;
            free(net->workspace);
            net->workspace = calloc(need / sizeof(float) + 1 + 65536, sizeof(float));
        }
        if (l->type == RNN) {
            free(l->state);
            l->state = calloc((size_t)l->outputs * l->batch * (l->steps + 1), sizeof(float));
        }
        if (l->type == LSTM) l->backward = backward_lstm_layer;
#endif
#ifdef FORK
        if (l->type == CONV_LSTM && !l->delta)   /* nor for [conv_lstm] */
            l->delta = calloc((size_t)l->outputs * l->batch * l->steps, sizeof(float));
#endif
        if (l->type == LSTM && !l->delta)
            l->delta = calloc((size_t)l->outputs * l->batch * l->steps, sizeof(float));
    }
}

int main(int argc, char **argv)
{
    if (argc != 6) { fprintf(stderr, "usage: harness CFG WEIGHTS X Y OUTDIR\n"); return 2; }
    char *outdir = argv[5];
    char path[1024];
    int i;
#ifdef FORK
    network net = parse_network_cfg(argv[1]);
    load_weights(&net, argv[2]);
    network *pnet = &net;
#else
    network *pnet = load_network(argv[1], argv[2], 0);
#endif
    make_trainable(pnet);
    network *n = pnet;
    int rows = n->batch;
    int last = n->n - 1;
    float *x = read_floats(argv[3], (size_t)rows * n->inputs);
    float *y = read_floats(argv[4], (size_t)rows * n->layers[last].outputs);

    network_predict(NET(pnet), x);
    write_floats(outdir, "pred1", -1, n->layers[last].output, (size_t)rows * n->layers[last].outputs);
    network_predict(NET(pnet), x);
    write_floats(outdir, "pred2", -1, n->layers[last].output, (size_t)rows * n->layers[last].outputs);

#ifdef FORK
    float cost = train_network_datum(net, x, y);
    update_network(net);
#else
    memcpy(n->input, x, sizeof(float) * rows * n->inputs);
    memcpy(n->truth, y, sizeof(float) * rows * n->truths);
    float cost = train_network_datum(n);   /* updates: subdivisions=1 */
#endif
    write_floats(outdir, "cost", -1, &cost, 1);
    for (i = 0; i < n->n; ++i) {
        layer l = n->layers[i];
        write_floats(outdir, "out", i, l.output, (size_t)rows * l.outputs);
        write_floats(outdir, "delta", i, l.delta, (size_t)rows * l.outputs);
    }
    snprintf(path, sizeof path, "%s/updated.weights", outdir);
    save_weights(NET(pnet), path);
    return 0;
}
