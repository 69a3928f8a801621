/* attention_graph.h: attention as BERT's search leaves it, Swin's
 * windowed attention and MaxViT's, built for the
 * tests of values read and written by strides (graph_strided): on the
 * host (test_strided.c) and on the GPU (test_cuda_linear.c). Include after
 * check.h and tensor_check.h; its builders report through its Diag D,
 * which the includer diag_inits. */
#ifndef TEQ_TESTS_ATTENTION_GRAPH_H
#define TEQ_TESTS_ATTENTION_GRAPH_H

#include "runtime/graph.h"
#include "runtime/plan.h"

static Diag D;

static inline int node(Graph *g, OpKind k, const TensorRef *in, int n_in, int n_out, const Params *p) {
  int id = graph_add_node(g, k, in, n_in, n_out, p, NULL, &D);
  CHECK_MSG(id >= 0, "%s: %s", op_def(k)->name, diag_last(&D));
  return id;
}

/* The steps of g's plan: the kernels the GPU runs. */
static inline int plan_steps(const Graph *g) {
  MemPlan p;
  if (mem_plan_build(g, &p, &D) != TEQ_OK) return -1;
  int n = p.n_steps;
  mem_plan_fini(&p);
  return n;
}

static inline int transpose(Graph *g, TensorRef x, const int64_t *perm, int r) {
  Params p;
  params_default(OP_TRANSPOSE, &p);
  param_set_ints(&p, 0, perm, r);
  return node(g, OP_TRANSPOSE, &x, 1, 1, &p);
}

static inline int reshape(Graph *g, TensorRef x, const int64_t *dims, int r) {
  Params p;
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, 0, dims, r);
  return node(g, OP_RESHAPE, &x, 1, 1, &p);
}

static inline int softmax(Graph *g, TensorRef x, int axis) {
  Params p;
  params_default(OP_SOFTMAX, &p);
  param_set_int(&p, 0, axis);
  return node(g, OP_SOFTMAX, &x, 1, 1, &p);
}

static inline int matmul(Graph *g, TensorRef a, TensorRef b) {
  return node(g, OP_MATMUL, (TensorRef[]){a, b}, 2, 1, NULL);
}

/* Attention over s tokens of h heads of width w, as the search leaves
 * BERT's: x W [s, 3 h w] reshaped [s, 3h, w] and transposed to heads
 * first, split into Q, K and V along the heads, K's keys last; scores,
 * softmax, V; the heads back to tokens. The last transpose is read by a
 * reshape to the output. relu_k: K's transpose also read by a relu, an
 * output (a kernel must write it then). */
typedef struct Attention {
  Graph *g;
  int heads_first, split, keys_last, scores, values, back;
} Attention;

static inline Attention attention(int s, int h, int w, bool relu_k) {
  Attention a = {graph_new(), 0, 0, 0, 0, 0, 0};
  Graph *g = a.g;
  Shape xs = shape_of(2, s, h * w * 1), ws = shape_of(2, h * w, 3 * h * w);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  int wt = graph_add_const(g, "w", random_f32(ws, 7), &D);
  int qkv = matmul(g, (TensorRef){x, 0}, (TensorRef){wt, 0});
  int r = reshape(g, (TensorRef){qkv, 0}, (int64_t[]){s, 3 * h, w}, 3);
  a.heads_first = transpose(g, (TensorRef){r, 0}, (int64_t[]){1, 0, 2}, 3);
  Params sp;
  params_default(OP_SPLIT, &sp);
  param_set_int(&sp, 0, 0);
  param_set_ints(&sp, 1, (int64_t[]){h, h, h}, 3);
  a.split = node(g, OP_SPLIT, (TensorRef[]){{a.heads_first, 0}}, 1, 3, &sp);
  a.keys_last = transpose(g, (TensorRef){a.split, 1}, (int64_t[]){0, 2, 1}, 3);
  a.scores = matmul(g, (TensorRef){a.split, 0}, (TensorRef){a.keys_last, 0});
  int soft = softmax(g, (TensorRef){a.scores, 0}, 2);
  a.values = matmul(g, (TensorRef){soft, 0}, (TensorRef){a.split, 2});
  a.back = transpose(g, (TensorRef){a.values, 0}, (int64_t[]){1, 0, 2}, 3);
  int y = reshape(g, (TensorRef){a.back, 0}, (int64_t[]){s, h * w}, 2);
  graph_add_output(g, (TensorRef){y, 0}, "y", &D);
  if (relu_k) {
    int k = node(g, OP_RELU, (TensorRef[]){{a.keys_last, 0}}, 1, 1, NULL);
    graph_add_output(g, (TensorRef){k, 0}, "k", &D);
  }
  CHECK_MSG(graph_check(g, &D) == TEQ_OK, "%s", diag_last(&D));
  return a;
}

/* Swin's windowed attention: q, k and v of w windows of t tokens, h heads
 * of width c, as one tensor [w, t, 3, h, c] put [3, w, h, t, c] and split;
 * K's keys last; the values' heads put back [w, t, h, c]. Each operand's
 * batch axes (window, head) step by two strides, so its products run over
 * arrays of pointers. The same fields as attention(): heads_first is the
 * [3, w, h, t, c] transpose. */
static inline Attention windowed_attention(int w, int t, int h, int c) {
  Attention a = {graph_new(), 0, 0, 0, 0, 0, 0};
  Graph *g = a.g;
  Shape xs = shape_of(5, w, t, 3, h, c);
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  a.heads_first = transpose(g, (TensorRef){x, 0}, (int64_t[]){2, 0, 3, 1, 4}, 5);
  Params sp;
  params_default(OP_SPLIT, &sp);
  param_set_int(&sp, 0, 0);
  param_set_ints(&sp, 1, (int64_t[]){1, 1, 1}, 3);
  a.split = node(g, OP_SPLIT, (TensorRef[]){{a.heads_first, 0}}, 1, 3, &sp);
  a.keys_last = transpose(g, (TensorRef){a.split, 1}, (int64_t[]){0, 1, 2, 4, 3}, 5);
  a.scores = matmul(g, (TensorRef){a.split, 0}, (TensorRef){a.keys_last, 0});
  int soft = softmax(g, (TensorRef){a.scores, 0}, 4);
  a.values = matmul(g, (TensorRef){soft, 0}, (TensorRef){a.split, 2});
  a.back = transpose(g, (TensorRef){a.values, 0}, (int64_t[]){0, 1, 3, 2, 4}, 5);
  graph_add_output(g, (TensorRef){a.back, 0}, "y", &D);
  CHECK_MSG(graph_check(g, &D) == TEQ_OK, "%s", diag_last(&D));
  return a;
}

/* MaxViT's attention: x W [b, t, 3 h d] cut into Q, K and V by slices of
 * its last axis, each [b, t, h, d] put heads first [b, h, t, d]; K's keys
 * last; the values' heads put back [b, t, h d]. The fields as attention()
 * fills them, with split K's slice and heads_first Q's transpose. */
static inline Attention sliced_attention(int b, int t, int h, int d) {
  Attention a = {graph_new(), 0, 0, 0, 0, 0, 0};
  Graph *g = a.g;
  int64_t c = (int64_t)h * d;
  Shape xs = shape_of(3, b, t, (int)c), ws = shape_of(2, (int)c, (int)(3 * c));
  int x = graph_add_input(g, "x", &xs, DT_F32, &D);
  int wt = graph_add_const(g, "w", random_f32(ws, 9), &D);
  int qkv = matmul(g, (TensorRef){x, 0}, (TensorRef){wt, 0});
  int heads[3];
  for (int k = 0; k < 3; k++) {
    Params sp;
    params_default(OP_SLICE, &sp);
    param_set_ints(&sp, 0, (int64_t[]){0, 0, k * c}, 3);
    param_set_ints(&sp, 1, (int64_t[]){b, t, (k + 1) * c}, 3);
    param_set_ints(&sp, 2, (int64_t[]){1, 1, 1}, 3);
    int cut = node(g, OP_SLICE, (TensorRef[]){{qkv, 0}}, 1, 1, &sp);
    if (k == 1) a.split = cut;
    int r = reshape(g, (TensorRef){cut, 0}, (int64_t[]){b, t, h, d}, 4);
    heads[k] = transpose(g, (TensorRef){r, 0}, (int64_t[]){0, 2, 1, 3}, 4);
  }
  a.heads_first = heads[0];
  a.keys_last = transpose(g, (TensorRef){heads[1], 0}, (int64_t[]){0, 1, 3, 2}, 4);
  a.scores = matmul(g, (TensorRef){heads[0], 0}, (TensorRef){a.keys_last, 0});
  int soft = softmax(g, (TensorRef){a.scores, 0}, 3);
  a.values = matmul(g, (TensorRef){soft, 0}, (TensorRef){heads[2], 0});
  a.back = transpose(g, (TensorRef){a.values, 0}, (int64_t[]){0, 2, 1, 3}, 4);
  int y = reshape(g, (TensorRef){a.back, 0}, (int64_t[]){b, t, c}, 3);
  graph_add_output(g, (TensorRef){y, 0}, "y", &D);
  CHECK_MSG(graph_check(g, &D) == TEQ_OK, "%s", diag_last(&D));
  return a;
}

#endif
