/* layout_chain.h: chains of layout operators as exporters write them
 * (Swin-T's cyclic shift and window partition, its patch merging), built
 * for the tests of chains gathered into one copy of rows (plan_gathers):
 * on the host (test_gather.c) and on the GPU (test_cuda_layout.c). Include
 * after check.h and tensor_check.h; builders report through
 * attention_graph.h's Diag D. */
#ifndef TEQ_TESTS_LAYOUT_CHAIN_H
#define TEQ_TESTS_LAYOUT_CHAIN_H

#include "tests/attention_graph.h"

static inline int relu(Graph *g, TensorRef x) { return node(g, OP_RELU, &x, 1, 1, NULL); }

static inline int slice(Graph *g, TensorRef x, const int64_t *starts, const int64_t *ends,
                 const int64_t *steps) {
  int r = graph_shape(g, x)->ndim;
  Params p;
  params_default(OP_SLICE, &p);
  param_set_ints(&p, 0, starts, r);
  param_set_ints(&p, 1, ends, r);
  param_set_ints(&p, 2, steps, r);
  return node(g, OP_SLICE, &x, 1, 1, &p);
}

/* x's elements [from, to) along axis, step 1. */
static inline int cut(Graph *g, TensorRef x, int axis, int64_t from, int64_t to) {
  const Shape *s = graph_shape(g, x);
  int64_t st[TEQ_MAX_DIMS] = {0}, en[TEQ_MAX_DIMS], sp[TEQ_MAX_DIMS];
  for (int i = 0; i < s->ndim; i++) en[i] = s->d[i], sp[i] = 1;
  st[axis] = from, en[axis] = to;
  return slice(g, x, st, en, sp);
}

static inline int concat(Graph *g, const TensorRef *in, int n, int axis) {
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, 0, axis);
  return node(g, OP_CONCAT, in, n, 1, &p);
}

/* torch.roll(x, -k, axis) as exporters write it: the tail, then the head. */
static inline int roll(Graph *g, TensorRef x, int axis, int64_t k) {
  int64_t n = graph_shape(g, x)->d[axis];
  int tail = cut(g, x, axis, k, n), head = cut(g, x, axis, 0, k);
  return concat(g, (TensorRef[]){{tail, 0}, {head, 0}}, 2, axis);
}

static inline int pad(Graph *g, TensorRef x, const int64_t *pads, double value) {
  int r = graph_shape(g, x)->ndim;
  Params p;
  params_default(OP_PAD, &p);
  param_set_ints(&p, 0, pads, 2 * r);
  param_set_float(&p, 1, value);
  return node(g, OP_PAD, &x, 1, 1, &p);
}

/* A relu of a graph input of shape xs: the computed value chains start at. */
static inline int relu_of_input(Graph *g, Shape xs) {
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  return relu(g, (TensorRef){x, 0});
}

/* Value slot of node id's output 0 (graph_use_counts' numbering), which
 * the plan's rows name. */
static inline int slot_of(const Graph *g, int id) {
  int32_t *offset = NULL, *uses = graph_use_counts(g, &offset);
  int s = offset ? offset[id] : -1;
  free(uses), free(offset);
  return s;
}

/* Swin's shifted windows on a side x side map of c channels, windows of
 * win: roll by shift along both axes, partition, and a relu reads the
 * windows. src is the relu the chain starts at, exit its last reshape. */
typedef struct Chain {
  Graph *g;
  int src, exit, out;
} Chain;

static inline Chain shifted_windows(int side, int win, int c, int shift) {
  Chain ch = {graph_new(), 0, 0, 0};
  Graph *g = ch.g;
  ch.src = relu_of_input(g, shape_of(4, 1, side, side, c));
  int h = roll(g, (TensorRef){ch.src, 0}, 1, shift);
  int w = roll(g, (TensorRef){h, 0}, 2, shift);
  int n = side / win;
  int r6 = reshape(g, (TensorRef){w, 0}, (int64_t[]){1, n, win, n, win, c}, 6);
  int t = transpose(g, (TensorRef){r6, 0}, (int64_t[]){0, 1, 3, 2, 4, 5}, 6);
  ch.exit = reshape(g, (TensorRef){t, 0}, (int64_t[]){n * n, win * win, c}, 3);
  ch.out = relu(g, (TensorRef){ch.exit, 0});
  graph_add_output(g, (TensorRef){ch.out, 0}, "y", &D);
  return ch;
}

/* Swin's patch merging of a side x side map of c channels: x[0::2, 0::2],
 * x[1::2, 0::2], x[0::2, 1::2] and x[1::2, 1::2] (each a slice of rows,
 * then one of columns) concatenated along the channels; exit the concat. */
static inline Chain patch_merging(int side, int c) {
  Chain ch = {graph_new(), 0, 0, 0};
  Graph *g = ch.g;
  ch.src = relu_of_input(g, shape_of(4, 1, side, side, c));
  TensorRef parts[4];
  for (int k = 0; k < 4; k++) {
    int64_t oh = k % 2, ow = k / 2;
    int rows = slice(g, (TensorRef){ch.src, 0}, (int64_t[]){0, oh, 0, 0},
                     (int64_t[]){1, side, side, c}, (int64_t[]){1, 2, 1, 1});
    int cols = slice(g, (TensorRef){rows, 0}, (int64_t[]){0, 0, ow, 0},
                     (int64_t[]){1, side / 2, side, c}, (int64_t[]){1, 1, 2, 1});
    parts[k] = (TensorRef){cols, 0};
  }
  ch.exit = concat(g, parts, 4, 3);
  ch.out = relu(g, (TensorRef){ch.exit, 0});
  graph_add_output(g, (TensorRef){ch.out, 0}, "y", &D);
  return ch;
}

#endif
