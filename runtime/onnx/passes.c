/* passes.c: clean-up of a freshly imported graph.
 * Removing no-ops (Identity, inference-time Dropout, and arithmetic with a
 * neutral constant, x * 1 or x + 0, once the written layer norms are fused:
 * a fresh one's gamma of ones and beta of zeros are part of its pattern)
 * rewires their users to their input. A Pad of zeros read by a window
 * that pads with zeros (a convolution; an average pool counting its
 * padding) becomes more of that window's own padding, which no kernel
 * writes out. Folding BatchNormalization into the convolution (or
 * transposed one) before it rescales each output channel of the weights
 * and bias once, at import:
 *   W'[c] = W[c] * s[c],  b'[c] = (b[c] - mean[c]) * s[c] + beta[c],
 *   s[c] = gamma[c] / sqrt(var[c] + eps),
 * which is exact in real arithmetic; a BatchNorm, or a constant scale or
 * shift, before a convolution folds into it too, with a constant residual
 * where its padding reads zeros the shift never saw. A layer normalization
 * that an exporter wrote out in nine operators (PyTorch below opset 17:
 * ReduceMean, Sub, Pow 2, ReduceMean, Add eps, Sqrt, Div, Mul gamma, Add
 * beta) becomes the one operator it computes, also exact in real
 * arithmetic, and so does a GELU written out in erf (x / sqrt 2, Erf, + 1,
 * times x, times 1/2, as PyTorch below opset 20 and most exporters write
 * it) or in tanh (its approximation, as GPT-2's is written). A bias added
 * to a product alone becomes a gemm's C, and attention's scale on the
 * queries a product made goes into their columns of its weights. An
 * activation that is the only reader of a convolution or product (or of a
 * reshape of one) becomes that operator's fused act: an exporter (Teq's
 * own among them) writes a fused activation as a second node, and every
 * runtime fuses it back, so a graph priced or timed with the two apart
 * would charge a kernel nobody runs (the residual adds fold before,
 * graph_fuse_residuals, with the activation after each). A max pool
 * whose windows tile the convolution's output (VGG's 2x2 at stride 2)
 * becomes the conv's pool, last, after its activation. Parameters are
 * found by name through the registry rows, never by index. Dead nodes are
 * removed by the caller. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/onnx/onnx_int.h"

/* Each output's readers as counted when a pass begins (graph_use_counts).
 * A node the pass adds afterwards was not counted, and uses_of says -1 for
 * it, so it is never taken for a sole reader's producer: a second
 * BatchNorm reads the conv the first one's fold made, a second scale the
 * product the first one's made. */
typedef struct Uses {
  int32_t *count, *offset;
  int32_t n; /* the nodes counted */
} Uses;

/* TEQ_OK, or TEQ_ERR_NOMEM with the error (naming what the pass does) in d. */
static int pass_uses(const Graph *g, Uses *u, const char *what, Diag *d) {
  u->n = g->n_nodes;
  u->count = graph_use_counts(g, &u->offset);
  if (u->count) return TEQ_OK;
  free(u->offset);
  u->offset = NULL;
  return diag_error(d, "out of memory %s", what), TEQ_ERR_NOMEM;
}

static void uses_fini(Uses *u) {
  free(u->count);
  free(u->offset);
}

/* How many readers output r has; -1 for a node added since the count. */
static int32_t uses_of(const Uses *u, TensorRef r) {
  return r.node >= 0 && r.node < u->n ? u->count[u->offset[r.node] + r.out] : -1;
}

/* A node of kind on in that takes over the readers of node at's output 0,
 * named as node named_like is (the name copied first: adding a node may
 * move the array). Its id, or the error graph_add_node gave (in d). */
static int take_over(Graph *g, int32_t at, int32_t named_like, OpKind kind, const TensorRef *in,
                     int n_in, const Params *p, Diag *d) {
  char *name = g->nodes[named_like].name ? strdup(g->nodes[named_like].name) : NULL;
  int id = graph_add_node(g, kind, in, n_in, 1, p, name, d);
  free(name);
  if (id >= 0) graph_replace_uses(g, (TensorRef){at, 0}, (TensorRef){id, 0});
  return id;
}

/* Producer node p again with parameter param_i set to value, taking over
 * the readers of node at (the activation or pool it absorbs), named as p
 * is. Its id, or an error (in d). p has at most 8 inputs. */
static int retake_with(Graph *g, int32_t at, int32_t p, int param_i, int64_t value, Diag *d) {
  const Node *pn = &g->nodes[p];
  Params params = pn->params;
  params.v[param_i].i[0] = value;
  TensorRef in[8];
  memcpy(in, pn->in, (size_t)pn->n_in * sizeof *in);
  return take_over(g, at, p, pn->kind, in, pn->n_in, &params, d);
}

/* Follows a chain of no-ops back to the value it passes through. */
static TensorRef through_noops(const Graph *g, TensorRef r) {
  while (op_def(g->nodes[r.node].kind)->flags & OPF_NOOP && g->nodes[r.node].n_in > 0)
    r = g->nodes[r.node].in[0];
  return r;
}

int onnx_pass_remove_noops(Graph *g, Diag *d) {
  (void)d;
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const Node *nd = &g->nodes[i];
    if (!(op_def(nd->kind)->flags & OPF_NOOP) || nd->n_in < 1) continue;
    TensorRef src = through_noops(g, nd->in[0]);
    for (int32_t o = 0; o < nd->n_out; o++) graph_replace_uses(g, (TensorRef){i, o}, src);
    n++;
  }
  return n;
}

static const Tensor *const_input(const Graph *g, const Node *n, int i, int64_t numel) {
  if (i >= n->n_in) return NULL;
  const Node *src = &g->nodes[n->in[i].node];
  if (src->kind != OP_CONST || !src->value || src->value->dtype != DT_F32) return NULL;
  return numel < 0 || tensor_numel(src->value) == numel ? src->value : NULL;
}

/* Whether input j of n is a float32 constant holding the row's neutral
 * value everywhere (x * 1, x - 0), where the row allows it there. */
static bool neutral_operand(const Graph *g, const Node *n, int j) {
  const OpDef *o = op_def(n->kind);
  const Tensor *t = o->neutral_inputs >> j & 1u ? const_input(g, n, j, -1) : NULL;
  for (int64_t k = 0; t && k < tensor_numel(t); k++)
    if (((const float *)t->data)[k] != o->neutral) return false; /* -0.0 == 0.0: x + 0's too */
  return t != NULL;
}

/* The input that binary node n passes through unchanged, its other input
 * being neutral (x * 1); -1 when there is none. Not where the constant
 * widens the result (x[3] * ones[2, 3] is two copies of x). */
static int passed_through(const Graph *g, const Node *n) {
  if (!op_def(n->kind)->neutral_inputs || n->n_in != 2 || n->n_out != 1) return -1;
  for (int j = 0; j < 2; j++)
    if (neutral_operand(g, n, j) && shape_equal(graph_shape(g, n->in[1 - j]), &n->out[0]))
      return 1 - j;
  return -1;
}

int onnx_pass_drop_neutral_operands(Graph *g, Diag *d) {
  (void)d;
  int n = 0;
  for (int32_t i = 0; i < g->n_nodes; i++) {
    int x = passed_through(g, &g->nodes[i]);
    if (x < 0) continue;
    graph_replace_uses(g, (TensorRef){i, 0}, g->nodes[i].in[x]);
    n++;
  }
  return n;
}

/* ---- folding into a convolution's weights ----
 * A BatchNorm, or a constant scale or shift, after a convolution, a
 * transposed one or a gemm (onnx_pass_fold_affines_after_convs; a gemm's
 * channels are its output's columns: a face recognizer's BatchNorm1d after
 * its embedding) or before a convolution (onnx_pass_fold_affines_into_convs)
 * becomes the convolution with new weights and bias. */

/* Whether gemm node c's B is stored transposed, [N, K]. */
static bool gemm_trans_b(const Node *c) {
  return param_int(&c->params, param_index(OP_GEMM, "transB")) != 0;
}

/* Output channels of conv2d, conv_transpose or gemm node c, whose weights
 * are w: conv2d's W is [M, C/G, kh, kw], conv_transpose's [C, M/G, kh, kw],
 * gemm's B [K, N] or, transposed, [N, K]. */
static int64_t out_channels(const Node *c, const Tensor *w) {
  if (c->kind == OP_CONV2D) return w->shape.d[0];
  if (c->kind == OP_GEMM) return w->shape.d[gemm_trans_b(c) ? 0 : 1];
  return w->shape.d[1] * param_int(&c->params, param_index(OP_CONV_TRANSPOSE, "groups"));
}

/* The output channel that weight element e of c (weights w, m output
 * channels) adds to: conv2d's row; conv_transpose's column j of its
 * group's rows; gemm's column of B (a row where it is transposed). */
static int64_t weight_out_channel(const Node *c, const Tensor *w, int64_t m, int64_t e) {
  if (c->kind == OP_GEMM) return gemm_trans_b(c) ? e / w->shape.d[1] : e % m;
  int64_t taps = w->shape.d[2] * w->shape.d[3];
  if (c->kind == OP_CONV2D) return e / (w->shape.d[1] * taps);
  int64_t mg = w->shape.d[1], cg = w->shape.d[0] / (m / mg), ci = e / (mg * taps);
  return (ci / cg) * mg + (e / taps) % mg;
}

/* Whether node c applies a fused activation (conv_transpose has none). */
static bool fused_act(const Node *c) {
  int i = param_index(c->kind, "act");
  return i >= 0 && param_int(&c->params, i) != ACT_NONE;
}

/* Weight and bias of conv2d, conv_transpose or gemm node c when both are
 * float32 constants (the bias may be absent: *b NULL) and c has neither
 * residual nor pool; a gemm's alpha and beta 1 and its C one value per
 * column. Else false. */
static bool layer_weights(const Graph *g, const Node *c, const Tensor **w, const Tensor **b) {
  bool gemm = c->kind == OP_GEMM;
  if ((c->kind != OP_CONV2D && c->kind != OP_CONV_TRANSPOSE && !gemm) || c->n_out != 1 ||
      c->n_in < 2 || c->n_in > 3 || c->dtype != DT_F32 || op_output_pooled(c))
    return false;
  if (gemm && (param_float(&c->params, param_index(OP_GEMM, "alpha")) != 1.0 ||
               param_float(&c->params, param_index(OP_GEMM, "beta")) != 1.0))
    return false;
  *w = const_input(g, c, 1, -1);
  if (!*w || (*w)->shape.ndim != (gemm ? 2 : 4)) return false;
  *b = c->n_in == 3 ? const_input(g, c, 2, out_channels(c, *w)) : NULL;
  if (gemm && *b && (*b)->shape.ndim == 2 && (*b)->shape.d[0] != 1) return false; /* per row */
  return c->n_in == 2 || *b;
}

/* Node c (a conv, gemm or matmul) again on input x with weights w and
 * bias b (NULL: none; both taken over, freed on failure), in place of
 * node at's readers; its id or an error. */
static int remake_with_weights(Graph *g, int32_t at, int32_t c, TensorRef x, Tensor *w, Tensor *b,
                               Diag *d) {
  Params p = g->nodes[c].params;
  OpKind kind = g->nodes[c].kind;
  int wi = graph_add_const(g, NULL, w, d);
  if (wi < 0) tensor_unref(w);
  int bi = wi < 0 || !b ? wi : graph_add_const(g, NULL, b, d);
  if (bi < 0) tensor_unref(b);
  if (bi < 0) return bi;
  return take_over(g, at, c, kind, (TensorRef[]){x, {wi, 0}, {bi, 0}}, b ? 3 : 2, &p, d);
}

/* Copies of w and of b (zeros where there is none, [m]), or NULL both. */
static bool clone_weights(const Tensor *w, const Tensor *b, int64_t m, Tensor **nw, Tensor **nb) {
  Shape bs = shape_of(1, m);
  *nw = tensor_clone(w);
  *nb = b ? tensor_clone(b) : tensor_new(DT_F32, &bs);
  if (*nw && *nb) return true;
  tensor_unref(*nw);
  tensor_unref(*nb);
  *nw = *nb = NULL;
  return false;
}

/* Node c (a conv or gemm, layer_weights) with weights w and bias b
 * (absent: 0) followed by the affine y * scale[o] + shift[o] of each
 * output channel o (either NULL: 1 or 0), as one node with scaled weights
 * and bias, in place of node at's readers: what a BatchNorm, or a
 * constant scale and shift, after it folds into. Its id or an error. */
static int fold_channel_affine(Graph *g, int32_t at, int32_t c, const Tensor *w, const Tensor *b,
                               const double *scale, const double *shift, Diag *d) {
  Tensor *nw, *nb;
  const Node *cn = &g->nodes[c];
  int64_t m = out_channels(cn, w);
  if (!clone_weights(w, b, m, &nw, &nb))
    return diag_error(d, "out of memory folding into a conv"), TEQ_ERR_NOMEM;
  float *wd = nw->data, *bias = nb->data;
  for (int64_t e = 0; scale && e < tensor_numel(nw); e++)
    wd[e] = (float)(wd[e] * scale[weight_out_channel(cn, w, m, e)]);
  for (int64_t o = 0; o < m; o++)
    bias[o] = (float)(bias[o] * (scale ? scale[o] : 1.0) + (shift ? shift[o] : 0.0));
  return remake_with_weights(g, at, c, cn->in[0], nw, nb, d);
}

/* ---- layer normalization written out ---- */

/* Tensor r's producer when it is of kind k and r is its only use; else -1. */
static int32_t sole(const Graph *g, TensorRef r, OpKind k, const Uses *u) {
  return g->nodes[r.node].kind == k && uses_of(u, r) == 1 ? r.node : -1;
}

/* The one float of a one-element constant r, or NAN (also for no tensor,
 * r.node < 0). */
static double scalar_of(const Graph *g, TensorRef r) {
  if (r.node < 0) return NAN;
  const Node *n = &g->nodes[r.node];
  if (n->kind != OP_CONST || n->value->dtype != DT_F32 || tensor_numel(n->value) != 1) return NAN;
  return ((const float *)n->value->data)[0];
}

/* The first axis of a reduce_mean that keeps its dimensions and averages
 * the trailing axes of its input, from that axis on; -1 if it is not one. */
static int trailing_mean(const Graph *g, const Node *m) {
  const ParamValue *axes = &m->params.v[param_index(OP_REDUCE_MEAN, "axes")];
  int rank = graph_shape(g, m->in[0])->ndim;
  if (!param_int(&m->params, param_index(OP_REDUCE_MEAN, "keepdims")) || axes->n < 1) return -1;
  bool at[TEQ_MAX_DIMS] = {false};
  for (int i = 0; i < axes->n; i++)
    if (axes->i[i] >= 0 && axes->i[i] < rank) at[axes->i[i]] = true;
  int first = rank - axes->n;
  for (int k = 0; k < rank; k++)
    if (at[k] != (k >= first)) return -1;
  return first;
}

/* Whether the Div at dv ends a written-out layer normalization; fills x,
 * its first axis and epsilon, and the Sub the Div reads. */
static bool normalized(const Graph *g, int32_t dv, const Uses *u, TensorRef *x, int *axis,
                       double *eps) {
  const Node *d = &g->nodes[dv];
  const Node *sb = &g->nodes[d->in[0].node];
  int32_t sq = sole(g, d->in[1], OP_SQRT, u);
  if (sb->kind != OP_SUB || uses_of(u, d->in[0]) != 2 || sq < 0) return false;
  int32_t m1 = sole(g, sb->in[1], OP_REDUCE_MEAN, u);
  if (m1 < 0 || g->nodes[m1].in[0].node != sb->in[0].node ||
      g->nodes[m1].in[0].out != sb->in[0].out)
    return false;
  const Node *ad = &g->nodes[g->nodes[sq].in[0].node];
  if (sole(g, g->nodes[sq].in[0], OP_EWADD, u) < 0) return false;
  int which = isnan(scalar_of(g, ad->in[1])) ? 1 : 0; /* the operand that is not epsilon */
  *eps = scalar_of(g, ad->in[1 - which]);
  int32_t m2 = sole(g, ad->in[which], OP_REDUCE_MEAN, u);
  if (isnan(*eps) || !(*eps > 0) || m2 < 0) return false;
  int32_t pw = sole(g, g->nodes[m2].in[0], OP_POW, u);
  if (pw < 0 || g->nodes[pw].in[0].node != d->in[0].node || scalar_of(g, g->nodes[pw].in[1]) != 2)
    return false;
  int a1 = trailing_mean(g, &g->nodes[m1]), a2 = trailing_mean(g, &g->nodes[m2]);
  if (a1 < 0 || a1 != a2) return false;
  *x = sb->in[0];
  *axis = a1;
  return true;
}

/* The first of g's nodes below n0 of kind k that reads node id's output
 * beside a constant (*c), or -1. */
static int32_t const_reader(const Graph *g, int32_t id, OpKind k, int32_t n0, TensorRef *c) {
  for (int32_t j = 0; j < n0; j++) {
    const Node *u = &g->nodes[j];
    if (u->kind != k || u->n_in != 2) continue;
    for (int s = 0; s < 2; s++)
      if (u->in[s].node == id && g->nodes[u->in[1 - s].node].kind == OP_CONST) {
        *c = u->in[1 - s];
        return j;
      }
  }
  return -1;
}

int onnx_pass_fuse_layer_norm(Graph *g, Diag *d) {
  Uses u;
  if (pass_uses(g, &u, "fusing layer normalizations", d)) return TEQ_ERR_NOMEM;
  int n = 0, rc = TEQ_OK;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0 && rc == TEQ_OK; i++) {
    TensorRef x;
    int axis;
    double eps;
    if (g->nodes[i].kind != OP_DIV || !normalized(g, i, &u, &x, &axis, &eps)) continue;
    /* gamma (required: layer_norm always scales), then beta */
    TensorRef in[3] = {x, {-1, 0}, {-1, 0}};
    int32_t mul = uses_of(&u, (TensorRef){i, 0}) == 1 ? const_reader(g, i, OP_EWMUL, n0, &in[1])
                                                       : -1;
    if (mul < 0) continue;
    int32_t add = uses_of(&u, (TensorRef){mul, 0}) == 1
                      ? const_reader(g, mul, OP_EWADD, n0, &in[2])
                      : -1;
    int n_in = add < 0 ? 2 : 3, last = add < 0 ? mul : add;
    /* A one-element epsilon, exponent, scale or bias of a higher rank
     * broadcasts the result to that rank; layer_norm keeps x's shape.
     * Broadcasting never lowers a rank or an extent, so the end's shape
     * being x's holds every step to it. */
    if (!shape_equal(&g->nodes[last].out[0], graph_shape(g, x))) continue;
    Params p;
    params_default(OP_LAYER_NORM, &p);
    param_set_int(&p, param_index(OP_LAYER_NORM, "axis"), axis);
    param_set_float(&p, param_index(OP_LAYER_NORM, "epsilon"), eps);
    Diag quiet; /* a scale or bias layer_norm cannot take leaves the operators as they are */
    diag_init(&quiet);
    int id = take_over(g, last, last, OP_LAYER_NORM, in, n_in, &p, &quiet);
    diag_fini(&quiet);
    if (id == TEQ_ERR_NOMEM) rc = id;
    if (id < 0) continue;
    n++;
  }
  uses_fini(&u);
  return rc == TEQ_OK ? n : rc;
}

/* ---- GELU written out ---- */

static bool near(double v, double want) { return fabs(v - want) <= 1e-6 * fabs(want); }

/* The operand of binary node b that is not `r` (either side), or {-1}. */
static TensorRef other_operand(const Node *b, TensorRef r) {
  if (b->n_in != 2) return (TensorRef){-1, 0};
  for (int s = 0; s < 2; s++)
    if (b->in[s].node == r.node && b->in[s].out == r.out) return b->in[1 - s];
  return (TensorRef){-1, 0};
}

static bool same_ref(TensorRef a, TensorRef b) { return a.node == b.node && a.out == b.out; }

/* x when r, used once, is x / sqrt 2 or x * (1 / sqrt 2); else {-1}. */
static TensorRef scaled_input(const Graph *g, TensorRef r, const Uses *u) {
  const Node *n = &g->nodes[r.node];
  if (uses_of(u, r) != 1) return (TensorRef){-1, 0};
  if (n->kind == OP_DIV && near(scalar_of(g, n->in[1]), M_SQRT2)) return n->in[0];
  if (n->kind == OP_EWMUL)
    for (int s = 0; s < 2; s++)
      if (near(scalar_of(g, n->in[s]), M_SQRT1_2)) return n->in[1 - s];
  return (TensorRef){-1, 0};
}

/* x when r, used once, is sqrt(2/pi) (x + 0.044715 x^3), the cube written
 * x (x x) or Pow(x, 3) (PyTorch's tanh GELU below opset 20); else {-1}. */
static TensorRef cubic_input(const Graph *g, TensorRef r, const Uses *u) {
  const TensorRef none = {-1, 0};
  const Node *m = &g->nodes[r.node];
  if (m->kind != OP_EWMUL || uses_of(u, r) != 1) return none;
  int s = near(scalar_of(g, m->in[0]), 0.7978845608028654) ? 0 : 1;
  if (!near(scalar_of(g, m->in[s]), 0.7978845608028654)) return none;
  TensorRef inner = m->in[1 - s];
  const Node *a = &g->nodes[inner.node];
  if (a->kind != OP_EWADD || uses_of(u, inner) != 1) return none;
  for (int k = 0; k < 2; k++) { /* a = x + v, v = 0.044715 x^3 */
    TensorRef x = a->in[k], v = a->in[1 - k];
    const Node *vm = &g->nodes[v.node];
    if (vm->kind != OP_EWMUL || uses_of(u, v) != 1) continue;
    int c = near(scalar_of(g, vm->in[0]), 0.044715) ? 0 : 1;
    if (!near(scalar_of(g, vm->in[c]), 0.044715)) continue;
    TensorRef cube = vm->in[1 - c];
    const Node *cb = &g->nodes[cube.node];
    if (uses_of(u, cube) != 1) continue;
    if (cb->kind == OP_POW && same_ref(cb->in[0], x) && scalar_of(g, cb->in[1]) == 3) return x;
    TensorRef sq = other_operand(cb, x);
    if (cb->kind != OP_EWMUL || sq.node < 0 || uses_of(u, sq) != 1) continue;
    const Node *q = &g->nodes[sq.node];
    if (q->kind == OP_EWMUL && same_ref(q->in[0], x) && same_ref(q->in[1], x)) return x;
  }
  return none;
}

/* The only reader of node id's output 0 among nodes below n0, or -1. */
static int32_t only_reader(const Graph *g, int32_t id, int32_t n0, const Uses *u) {
  if (uses_of(u, (TensorRef){id, 0}) != 1) return -1;
  for (int32_t j = 0; j < n0; j++)
    for (int k = 0; k < g->nodes[j].n_in; k++)
      if (g->nodes[j].in[k].node == id && g->nodes[j].in[k].out == 0) return j;
  return -1; /* a graph output */
}

/* Whether the Erf or Tanh at e is that of a GELU, 1 + erf(x / sqrt 2) or
 * 1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)): fills x and the node whose
 * output is the GELU (the last multiplication). Both orders of the halving
 * are taken: (x (1 + f)) / 2 and (x / 2) (1 + f). */
static bool gelu_of(const Graph *g, int32_t e, int32_t n0, const Uses *u, TensorRef *x,
                    int32_t *last) {
  TensorRef in = g->nodes[e].in[0];
  *x = g->nodes[e].kind == OP_ERF ? scaled_input(g, in, u) : cubic_input(g, in, u);
  if (x->node < 0) return false;
  int32_t add = only_reader(g, e, n0, u);
  if (add < 0 || g->nodes[add].kind != OP_EWADD ||
      scalar_of(g, other_operand(&g->nodes[add], (TensorRef){e, 0})) != 1)
    return false;
  int32_t mul = only_reader(g, add, n0, u);
  if (mul < 0 || g->nodes[mul].kind != OP_EWMUL) return false;
  TensorRef by = other_operand(&g->nodes[mul], (TensorRef){add, 0});
  if (by.node < 0) return false;
  if (same_ref(by, *x)) { /* then halved */
    int32_t half = only_reader(g, mul, n0, u);
    if (half < 0 || g->nodes[half].kind != OP_EWMUL ||
        scalar_of(g, other_operand(&g->nodes[half], (TensorRef){mul, 0})) != 0.5)
      return false;
    *last = half;
    return true;
  }
  const Node *h = &g->nodes[by.node]; /* x halved first, used here only */
  if (h->kind != OP_EWMUL || uses_of(u, by) != 1 ||
      scalar_of(g, other_operand(h, *x)) != 0.5)
    return false;
  *last = mul;
  return true;
}

/* One unary operator found in a chain a pass replaces: `kind`, with p, on
 * x, takes over the readers of node `at` (the chain's last). */
typedef struct UnaryFound {
  TensorRef x;
  int32_t at;
  OpKind kind;
  Params p;
} UnaryFound;

/* Whether node i (of the first n0, whose readers u counted before the
 * pass) ends or starts a chain the pass replaces. */
typedef bool (*UnaryMatch)(const Graph *g, int32_t i, int32_t n0, const Uses *u, UnaryFound *f);

/* Replaces every chain match finds by its one operator; returns how many,
 * or an error. what says what the pass does, for an out-of-memory message. */
static int replace_by_unary(Graph *g, const char *what, UnaryMatch match, Diag *d) {
  Uses u;
  if (pass_uses(g, &u, what, d)) return TEQ_ERR_NOMEM;
  int n = 0, rc = TEQ_OK;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0 && rc == TEQ_OK; i++) {
    UnaryFound f;
    if (!match(g, i, n0, &u, &f)) continue;
    int id = take_over(g, f.at, f.at, f.kind, &f.x, 1, &f.p, d);
    if (id < 0) rc = id;
    else n++;
  }
  uses_fini(&u);
  return rc == TEQ_OK ? n : rc;
}

static bool match_gelu(const Graph *g, int32_t i, int32_t n0, const Uses *u, UnaryFound *f) {
  OpKind k = g->nodes[i].kind;
  if ((k != OP_ERF && k != OP_TANH) || !gelu_of(g, i, n0, u, &f->x, &f->at))
    return false;
  const Shape *xs = graph_shape(g, f->x), *ys = &g->nodes[f->at].out[0];
  if (!shape_equal(xs, ys) || g->nodes[f->x.node].dtype != DT_F32) return false;
  f->kind = OP_GELU;
  params_default(OP_GELU, &f->p);
  param_set_int(&f->p, param_index(OP_GELU, "approximate"), k == OP_TANH);
  return true;
}

int onnx_pass_fuse_gelu(Graph *g, Diag *d) {
  return replace_by_unary(g, "fusing GELUs", match_gelu, d);
}

/* The gate g of x in x * g(x) (ewmul m, either order) that m alone reads:
 * its node id, with x, or -1. */
static int32_t gate_of(const Graph *g, const Node *m, const Uses *u, TensorRef *x) {
  if (m->kind != OP_EWMUL || m->n_in != 2) return -1;
  for (int s = 0; s < 2; s++) {
    TensorRef r = m->in[s];
    const Node *gate = &g->nodes[r.node];
    if (gate->n_in != 1 || gate->n_out != 1 || !same_ref(gate->in[0], m->in[1 - s]) ||
        uses_of(u, (TensorRef){r.node, 0}) != 1)
      continue;
    *x = gate->in[0];
    return r.node;
  }
  return -1;
}

/* The kind computing x * gate(x) in one pass, for the gate's node: silu for
 * a sigmoid, hard_swish for a hard_sigmoid of x / 6 + 1/2 (PyTorch's
 * Hardswish below opset 14); 0 for any other. */
static OpKind swish_of(const Node *gate) {
  if (gate->kind == OP_SIGMOID) return OP_SILU;
  if (gate->kind == OP_HARD_SIGMOID &&
      (float)param_float(&gate->params, param_index(OP_HARD_SIGMOID, "alpha")) == 1.0f / 6.0f &&
      param_float(&gate->params, param_index(OP_HARD_SIGMOID, "beta")) == 0.5)
    return OP_HARD_SWISH;
  return 0;
}

static bool match_swish(const Graph *g, int32_t i, int32_t n0, const Uses *u, UnaryFound *f) {
  int32_t gate = gate_of(g, &g->nodes[i], u, &f->x);
  f->kind = gate >= 0 && gate < n0 ? swish_of(&g->nodes[gate]) : 0;
  /* The product broadcasts nothing: x has its shape. */
  if (!f->kind || !shape_equal(graph_shape(g, f->x), &g->nodes[i].out[0]) ||
      g->nodes[i].dtype != DT_F32)
    return false;
  f->at = i;
  params_default(f->kind, &f->p);
  return true;
}

int onnx_pass_fuse_swishes(Graph *g, Diag *d) {
  return replace_by_unary(g, "fusing swishes", match_swish, d);
}

/* ---- hard gates written out ----
 * Paddle's exporter writes hard_swish(x) as x * clip(x + 3, 0, 6) / 6, four
 * element-wise nodes over the whole activation; TensorFlow's and hand-made
 * graphs write the gate relu6(x + 3) / 6 and multiply x by it. Each chain
 * becomes its one operator: (x * relu6(x + 3)) / 6 hard_swish, relu6(x + 3)
 * / 6 hard_sigmoid with PyTorch's parameters (which fuse_swishes then takes
 * with the x * gate after it into hard_swish). Rounding differs from the
 * chain's by an ulp or two, as a fused GELU's does from its nine nodes. */

/* x when r, used once, is clip(x + 3, 0, 6) (either side of the add);
 * else {-1}. */
static TensorRef relu6_shifted(const Graph *g, TensorRef r, const Uses *u) {
  const TensorRef none = {-1, 0};
  const Node *c = &g->nodes[r.node];
  if (c->kind != OP_CLIP || c->n_in != 1 || uses_of(u, r) != 1 || act_of_node(c) != ACT_RELU6)
    return none;
  TensorRef s = c->in[0];
  const Node *a = &g->nodes[s.node];
  if (a->kind != OP_EWADD || a->n_in != 2 || uses_of(u, s) != 1) return none;
  for (int k = 0; k < 2; k++)
    if (scalar_of(g, a->in[k]) == 3.0) return a->in[1 - k];
  return none;
}

/* m when node i is m / 6 or m * (1/6) (either side); else {-1}. */
static TensorRef sixth_of(const Graph *g, int32_t i) {
  const Node *n = &g->nodes[i];
  if (n->n_in == 2 && n->kind == OP_DIV && scalar_of(g, n->in[1]) == 6.0) return n->in[0];
  if (n->n_in == 2 && n->kind == OP_EWMUL)
    for (int s = 0; s < 2; s++)
      if (near(scalar_of(g, n->in[s]), 1.0 / 6.0)) return n->in[1 - s];
  return (TensorRef){-1, 0};
}

static bool match_hard_gate(const Graph *g, int32_t i, int32_t n0, const Uses *u,
                            UnaryFound *f) {
  (void)n0;
  TensorRef m = sixth_of(g, i), x = {-1, 0};
  if (m.node < 0) return false;
  f->kind = OP_HARD_SIGMOID;
  x = relu6_shifted(g, m, u);
  const Node *p = &g->nodes[m.node];
  if (x.node < 0 && p->kind == OP_EWMUL && p->n_in == 2 && uses_of(u, m) == 1) {
    f->kind = OP_HARD_SWISH; /* (x * relu6(x + 3)) / 6 */
    for (int s = 0; s < 2 && x.node < 0; s++) {
      TensorRef y = relu6_shifted(g, p->in[s], u);
      if (y.node >= 0 && same_ref(y, p->in[1 - s])) x = y;
    }
  }
  /* The constants broadcast nothing: x has the chain's shape. */
  if (x.node < 0 || !shape_equal(graph_shape(g, x), &g->nodes[i].out[0]) ||
      g->nodes[i].dtype != DT_F32)
    return false;
  f->x = x;
  f->at = i;
  if (f->kind == OP_HARD_SIGMOID) act_op_params(ACT_HARD_SIGMOID, &f->p);
  else params_default(OP_HARD_SWISH, &f->p);
  return true;
}

int onnx_pass_fuse_hard_gates(Graph *g, Diag *d) {
  return replace_by_unary(g, "fusing hard gates", match_hard_gate, d);
}

int onnx_pass_fold_zero_pads(Graph *g, Diag *d) {
  int n = 0;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0; i++) {
    const Node *r = &g->nodes[i];
    if (!op_def(r->kind)->take_zero_pad || r->n_in < 1 || r->n_in > 8) continue;
    TensorRef in[8];
    memcpy(in, r->in, (size_t)r->n_in * sizeof *in);
    int32_t pad = in[0].node;
    bool elsewhere = false; /* the padded tensor also as a weight or bias */
    for (int j = 1; j < r->n_in; j++) elsewhere |= in[j].node == pad;
    Params p;
    if (elsewhere || !op_takes_pad(r, &g->nodes[pad], &p)) continue;
    in[0] = g->nodes[pad].in[0];
    int id = take_over(g, i, i, r->kind, in, r->n_in, &p, d);
    if (id < 0) return id;
    n++; /* the Pad goes with the dead nodes once its last reader has gone */
  }
  return n;
}

/* ---- constant scales folded into products ----
 * gamma * (x W + b), with W, b and gamma constants and gamma one value per
 * output column (ConvNeXt's layer scale, which PyTorch applies after
 * permuting the block's output back to channels first: gamma [C, 1, 1] *
 * permute(x W + b)), is x (W gamma) + b gamma: one multiplication fewer
 * over the activations, as a BatchNorm folds into its convolution. */

/* The axis of an output of shape out along which a constant t of another
 * shape varies when broadcast to it (t right-aligned; its other extents
 * 1): 0..rank-1, TEQ_MAX_DIMS for one value everywhere, -1 where t varies
 * along more than one axis or does not broadcast to exactly out. */
static int broadcast_axis(const Tensor *t, const Shape *out) {
  const Shape *s = &t->shape;
  if (s->ndim > out->ndim) return -1;
  int axis = TEQ_MAX_DIMS;
  for (int k = 0; k < s->ndim; k++) {
    int o = out->ndim - s->ndim + k;
    if (s->d[k] == 1) continue;
    if (s->d[k] != out->d[o] || axis != TEQ_MAX_DIMS) return -1;
    axis = o;
  }
  return axis;
}

/* t's value at index i along the axis it varies along (any i where it is
 * one value). */
static float along(const Tensor *t, int64_t i) {
  return ((const float *)t->data)[tensor_numel(t) == 1 ? 0 : i];
}

/* The float32 constant among node n's two inputs, its index in *k (the
 * other is 1 - *k); NULL if none. */
static const Tensor *const_operand(const Graph *g, const Node *n, int *k) {
  for (*k = 0; *k < 2; (*k)++) {
    const Tensor *t = const_input(g, n, *k, -1);
    if (t) return t;
  }
  return NULL;
}

/* Folds the scale mul (node m) into its product where the chain above it
 * is product [-> add of a constant] [-> transpose], each read by the next
 * alone; 1 if it did, 0 where it does not apply, or an error. */
static int fold_scale(Graph *g, int32_t m, const Uses *u, Diag *d) {
  const Node *mn = &g->nodes[m];
  int k;
  const Tensor *gamma = mn->n_in == 2 ? const_operand(g, mn, &k) : NULL;
  if (!gamma || mn->dtype != DT_F32) return 0;
  TensorRef cur = mn->in[1 - k];
  if (!shape_equal(graph_shape(g, cur), &mn->out[0])) return 0;
  int axis = broadcast_axis(gamma, &mn->out[0]);
  if (axis < 0) return 0;
  int32_t trans = sole(g, cur, OP_TRANSPOSE, u), add = -1;
  if (trans >= 0) {
    const ParamValue *perm = &g->nodes[trans].params.v[param_index(OP_TRANSPOSE, "perm")];
    int rank = mn->out[0].ndim;
    if (axis != TEQ_MAX_DIMS) axis = perm->n ? (int)perm->i[axis] : rank - 1 - axis;
    cur = g->nodes[trans].in[0];
  }
  const Tensor *bias = NULL;
  if ((add = sole(g, cur, OP_EWADD, u)) >= 0) {
    int j;
    const Node *an = &g->nodes[add];
    bias = const_operand(g, an, &j);
    if (!bias || !shape_equal(graph_shape(g, an->in[1 - j]), &an->out[0])) return 0;
    int bax = broadcast_axis(bias, &an->out[0]);
    if (bax < 0 || (bax != TEQ_MAX_DIMS && bax != axis && axis != TEQ_MAX_DIMS)) return 0;
    if (axis == TEQ_MAX_DIMS) axis = bax; /* a scalar scale follows the bias's axis */
    cur = an->in[1 - j];
  }
  int32_t prod = sole(g, cur, OP_MATMUL, u);
  if (prod < 0 || g->nodes[prod].n_in != 2) return 0;
  const Node *pn = &g->nodes[prod];
  const Tensor *w = const_input(g, pn, 1, -1);
  int last = pn->out[0].ndim - 1;
  int act_i = param_index(OP_MATMUL, "act");
  if (!w || w->shape.ndim != 2 || param_int(&pn->params, act_i) != ACT_NONE ||
      (axis != TEQ_MAX_DIMS && axis != last))
    return 0;
  int64_t cols = w->shape.d[1], rows = w->shape.d[0];
  Tensor *nw = tensor_clone(w);
  Shape bs = shape_of(1, (int)cols);
  Tensor *nb = bias ? tensor_new(DT_F32, &bs) : NULL;
  if (!nw || (bias && !nb)) {
    tensor_unref(nw);
    tensor_unref(nb);
    diag_error(d, "out of memory folding a scale");
    return TEQ_ERR_NOMEM;
  }
  for (int64_t c = 0; c < cols; c++) {
    float s = along(gamma, c);
    for (int64_t r = 0; r < rows; r++) ((float *)nw->data)[r * cols + c] *= s;
    if (nb) ((float *)nb->data)[c] = along(bias, c) * s;
  }
  /* The chain again over the new constants, named like the old. */
  TensorRef x = pn->in[0];
  Params pp = pn->params;
  int wi = graph_add_const(g, NULL, nw, d);
  if (wi < 0) {
    tensor_unref(nw);
    tensor_unref(nb);
    return wi;
  }
  int top = take_over(g, prod, prod, OP_MATMUL, (TensorRef[]){x, {wi, 0}}, 2, &pp, d);
  if (top >= 0 && nb) {
    int bi = graph_add_const(g, NULL, nb, d);
    if (bi < 0) {
      tensor_unref(nb);
      return bi;
    }
    top = take_over(g, add, add, OP_EWADD, (TensorRef[]){{top, 0}, {bi, 0}}, 2, NULL, d);
  }
  if (top >= 0 && trans >= 0) {
    Params tp = g->nodes[trans].params;
    top = take_over(g, trans, trans, OP_TRANSPOSE, (TensorRef[]){{top, 0}}, 1, &tp, d);
  }
  if (top < 0) return top;
  graph_replace_uses(g, (TensorRef){m, 0}, (TensorRef){top, 0});
  return 1;
}

int onnx_pass_fold_product_scales(Graph *g, Diag *d) {
  Uses u;
  if (pass_uses(g, &u, "folding scales", d)) return TEQ_ERR_NOMEM;
  int n = 0, rc = TEQ_OK;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0; i++) {
    if (g->nodes[i].kind != OP_EWMUL) continue;
    if ((rc = fold_scale(g, i, &u, d)) < 0) break;
    n += rc;
  }
  uses_fini(&u);
  return rc < 0 ? rc : n;
}

/* ---- constant affines around convolutions ----
 * PaddleOCR's PP-LCNetV3 follows every convolution and every activation
 * with a learnable affine block, s x + b of two scalars, which its exporter
 * writes as a Mul and an Add over the whole tensor. After a convolution
 * each is the convolution with scaled weights and bias, as a BatchNorm is,
 * and before one too ("affines around a convolution" below). Either way a
 * pass over the tensor goes. Only constants of one value, or of one per
 * channel (axis 1), are taken. */

/* The constant operand of element-wise node n (ewmul or ewadd; its index
 * in *k) when it is one value or one per channel of n's output and the
 * other operand has that output's shape; else NULL. */
static const Tensor *channel_operand(const Graph *g, const Node *n, int *k) {
  if ((n->kind != OP_EWMUL && n->kind != OP_EWADD) || n->n_in != 2 || n->n_out != 1 ||
      n->dtype != DT_F32 || (n->out[0].ndim != 4 && n->out[0].ndim != 2))
    return NULL;
  const Tensor *t = const_operand(g, n, k);
  if (!t || !shape_equal(graph_shape(g, n->in[1 - *k]), &n->out[0])) return NULL;
  int axis = broadcast_axis(t, &n->out[0]);
  return axis == 1 || axis == TEQ_MAX_DIMS ? t : NULL;
}

/* A fold of one node: 0 where it does not apply, a positive tag (what it
 * folded) where it did, or an error. */
typedef int (*FoldOne)(Graph *g, int32_t i, const Uses *u, const void *how, Diag *d);

/* fold on every node of g, in rounds until one folds nothing: a round sees
 * the nodes the one before made, whose readers are counted anew, so that a
 * Mul and the Add beside it fold in turn. tally[tag - 1] counts the folds
 * of each tag up to n_tags. Returns how many folded, or an error. */
static int fold_rounds(Graph *g, const char *what, FoldOne fold, const void *how, int *tally,
                       int n_tags, Diag *d) {
  int total = 0, n;
  do {
    Uses u;
    if (pass_uses(g, &u, what, d)) return TEQ_ERR_NOMEM;
    n = 0;
    int rc = TEQ_OK;
    for (int32_t i = 0, n0 = g->n_nodes; i < n0 && rc >= 0; i++) {
      rc = fold(g, i, &u, how, d);
      n += rc > 0;
      if (rc > 0 && rc <= n_tags) tally[rc - 1]++;
    }
    uses_fini(&u);
    if (rc < 0) return rc;
    if (n > 0 && (rc = graph_remove_dead(g)) < 0) return rc;
    total += n;
  } while (n > 0);
  return total;
}

/* Which affines a pass folds into convolutions. */
typedef struct AffineKinds {
  bool batchnorms, scales;
} AffineKinds;

/* fold_rounds over fold, which tags a BatchNorm 1 and a scale or shift 2;
 * how many folded, *n_batchnorms of them BatchNorms, or an error. */
static int fold_affines(Graph *g, FoldOne fold, bool batchnorms, bool scales, int *n_batchnorms,
                        Diag *d) {
  int tally[2] = {0, 0};
  AffineKinds how = {batchnorms, scales};
  int n = fold_rounds(g, "folding affines into convolutions", fold, &how, tally, 2, d);
  *n_batchnorms = tally[0];
  return n;
}

/* ---- affines around a convolution ----
 * A BatchNorm, or a constant scale or shift of one value or one per
 * channel (channel_affine recognizes all three), folds into a convolution.
 * After a conv2d or conv_transpose whose output it alone reads, it rescales
 * each output channel's weights and bias (fold_channel_affine). Before a
 * conv2d that alone reads it (IResNet's BatchNorm at the head of each block;
 * PP-LCNetV3's affine blocks after an activation), with x' = s x + t per
 * input channel and the padding's zeros put in after the affine, as the
 * model does,
 *   conv(pad(x'), W) = conv(pad(x), W s) + conv(pad(t), W).
 * The second term depends on the weights alone. At an output pixel whose
 * window lies inside the image it is the sum over every tap and channel
 * of W t, one value per output channel, which joins the bias. Where the
 * window reaches into the padding, those taps read zeros instead, and what
 * they would have added is taken off again by a constant residual (conv2d's
 * input Z) of the output's shape, zero inside. Exact in real arithmetic.
 * The residual is made where the convolution has none or holds such a
 * constant already; the pass runs after graph_fuse_residuals, so a
 * convolution whose output an add of another tensor took keeps that add
 * fused, and a shift before it that would need a residual stays as written
 * (an add is dearer than the BatchNorm it would save). The folds after
 * convolutions run earlier (onnx_pass_fold_affines_after_convs), so that
 * an affine between two convolutions folds into the one before it. */

/* What a per-channel affine computes of each channel of its input x:
 * s x + t (s NULL: 1; t NULL: 0). */
typedef struct ChannelAffine {
  TensorRef x; /* the tensor it scales and shifts */
  double *s, *t;
  bool batchnorm;
} ChannelAffine;

/* Node a as a per-channel affine of C channels into *f (arrays the caller
 * frees): an ewmul or ewadd of a constant of one value or one per channel,
 * or an inference BatchNorm without a fused act; 1, 0 where it is neither,
 * or an error. */
static int channel_affine(const Graph *g, const Node *a, int64_t c, ChannelAffine *f, Diag *d) {
  memset(f, 0, sizeof *f);
  const Tensor *k[4] = {NULL};
  int j = -1;
  if (a->kind == OP_BATCHNORM) {
    if (a->n_in != 5 || a->n_out != 1 || a->dtype != DT_F32 ||
        (a->out[0].ndim != 4 && a->out[0].ndim != 2) ||
        param_int(&a->params, param_index(OP_BATCHNORM, "act")) != ACT_NONE)
      return 0;
    for (int i = 0; i < 4; i++)
      if (!(k[i] = const_input(g, a, i + 1, c))) return 0;
  } else if (!(k[0] = channel_operand(g, a, &j))) {
    return 0;
  }
  bool scale = a->kind != OP_EWADD, shift = a->kind != OP_EWMUL;
  f->s = scale ? malloc((size_t)c * sizeof *f->s) : NULL;
  f->t = shift ? malloc((size_t)c * sizeof *f->t) : NULL;
  if ((scale && !f->s) || (shift && !f->t)) {
    free(f->s), free(f->t);
    return diag_error(d, "out of memory folding into a convolution"), TEQ_ERR_NOMEM;
  }
  if (a->kind == OP_BATCHNORM) {
    double eps = param_float(&a->params, param_index(OP_BATCHNORM, "epsilon"));
    const float *gamma = k[0]->data, *beta = k[1]->data, *mean = k[2]->data, *var = k[3]->data;
    for (int64_t i = 0; i < c; i++) {
      f->s[i] = gamma[i] / sqrt((double)var[i] + eps);
      f->t[i] = beta[i] - mean[i] * f->s[i];
    }
  } else {
    for (int64_t i = 0; i < c; i++) (scale ? f->s : f->t)[i] = along(k[0], i);
  }
  for (int64_t i = 0; i < c; i++)
    if ((f->s && !isfinite(f->s[i])) || (f->t && !isfinite(f->t[i]))) {
      free(f->s), free(f->t);
      return 0;
    }
  f->x = a->kind == OP_BATCHNORM ? a->in[0] : a->in[1 - j];
  f->batchnorm = a->kind == OP_BATCHNORM;
  return 1;
}

/* Node i, an affine (channel_affine) of the output of a conv2d,
 * conv_transpose or gemm that it alone reads, folded into that operator's
 * weights and bias: 1 for a BatchNorm, 2 for a scale or shift, 0 where it
 * does not apply, or an error. */
static int fold_after_conv_one(Graph *g, int32_t i, const Uses *u, const void *how, Diag *d) {
  const AffineKinds *k = how;
  const Node *n = &g->nodes[i];
  if (!(n->kind == OP_BATCHNORM ? k->batchnorms : k->scales) || n->n_out != 1 ||
      (n->out[0].ndim != 4 && n->out[0].ndim != 2) || uses_of(u, (TensorRef){i, 0}) < 1)
    return 0;
  ChannelAffine f;
  int rc = channel_affine(g, n, n->out[0].d[1], &f, d);
  if (rc <= 0) return rc;
  int32_t c = f.x.out == 0 && uses_of(u, f.x) == 1 ? f.x.node : -1;
  const Tensor *w, *b;
  rc = 0;
  if (c >= 0 && layer_weights(g, &g->nodes[c], &w, &b) && !fused_act(&g->nodes[c]) &&
      out_channels(&g->nodes[c], w) == n->out[0].d[1]) {
    int id = fold_channel_affine(g, i, c, w, b, f.s, f.t, d);
    rc = id < 0 ? id : f.batchnorm ? 1 : 2;
  }
  free(f.s), free(f.t);
  return rc;
}

int onnx_pass_fold_affines_after_convs(Graph *g, bool batchnorms, bool scales, int *n_batchnorms,
                                       Diag *d) {
  return fold_affines(g, fold_after_conv_one, batchnorms, scales, n_batchnorms, d);
}

/* The convolution's geometry as the border needs it. */
typedef struct ConvWindow {
  int64_t n, m, cg, kh, kw, h, w, oh, ow, sh, sw, ph, pw, dh, dw, groups;
} ConvWindow;

/* Whether input row (or column) i * s - p + k * dl of an extent of n lies
 * inside it. */
static bool tap_inside(int64_t i, int64_t k, int64_t s, int64_t p, int64_t dl, int64_t n) {
  int64_t r = i * s - p + k * dl;
  return r >= 0 && r < n;
}

/* What the shift t adds through weights w at output pixel (i, j) of
 * channel o, less what it adds inside the image: minus the taps that fall
 * in the padding, each sum_c W[o, c, ki, kj] t[c] (tw[o][ki][kj]). */
static double border_term(const ConvWindow *v, const double *tw, int64_t o, int64_t i, int64_t j) {
  double off = 0;
  for (int64_t ki = 0; ki < v->kh; ki++)
    for (int64_t kj = 0; kj < v->kw; kj++)
      if (!tap_inside(i, ki, v->sh, v->ph, v->dh, v->h) ||
          !tap_inside(j, kj, v->sw, v->pw, v->dw, v->w))
        off -= tw[(o * v->kh + ki) * v->kw + kj];
  return off;
}

/* The largest border residual made, in elements (64 MB): one is as large
 * as the convolution's output, a constant the runtime then holds (PP-OCRv4's
 * detector on a 640x640 page: 4.7 MB of weights, 22 MB with its residuals),
 * so none is made for a batch of large images. A written model carries
 * only its distinct rows and columns (export.c's write_as_slices). */
#define BORDER_RESIDUAL_MAX (INT64_C(1) << 24)

/* The constant residual that the shift leaves at the border, added to z0
 * (the convolution's constant residual, or NULL), into *z: NULL where every
 * window of every pixel lies inside the image (nothing to add), 1 made, 2
 * where one is needed but would pass BORDER_RESIDUAL_MAX, or an error. tw
 * as border_term takes it. */
static int border_residual(const ConvWindow *v, const double *tw, const Tensor *z0, Tensor **z,
                           Diag *d) {
  *z = NULL;
  bool any = false;
  for (int64_t o = 0; o < v->m && !any; o++)
    for (int64_t i = 0; i < v->oh && !any; i++)
      for (int64_t j = 0; j < v->ow && !any; j++) any = border_term(v, tw, o, i, j) != 0;
  if (!any) return 0;
  if (v->n * v->m * v->oh * v->ow > BORDER_RESIDUAL_MAX) return 2;
  Shape zs = shape_of(4, v->n, v->m, v->oh, v->ow);
  if (!(*z = z0 ? tensor_clone(z0) : tensor_new(DT_F32, &zs)))
    return diag_error(d, "out of memory folding into a convolution"), TEQ_ERR_NOMEM;
  float *zd = (*z)->data;
  int64_t plane = v->oh * v->ow;
  for (int64_t o = 0; o < v->m; o++)
    for (int64_t i = 0; i < v->oh; i++)
      for (int64_t j = 0; j < v->ow; j++) {
        float off = (float)border_term(v, tw, o, i, j);
        for (int64_t b = 0; off != 0 && b < v->n; b++)
          zd[(b * v->m + o) * plane + i * v->ow + j] += off;
      }
  return 1;
}

/* Conv node c with the affine f of its input folded in: weights w, bias b
 * (NULL: zero), constant residual z0 (NULL: none), dyn where its residual
 * is not a constant (no border can join it then). In place of c's readers;
 * its id, 0 where a border is needed and impossible, or an error. */
static int fold_affine(Graph *g, int32_t c, const ChannelAffine *f, const ConvWindow *v,
                       const Tensor *w, const Tensor *b, const Tensor *z0, bool dyn, Diag *d) {
  int64_t per = v->kh * v->kw, m = v->m;
  double *tw = f->t ? calloc((size_t)(m * per), sizeof *tw) : NULL;
  Tensor *nw = NULL, *nb = NULL, *z = NULL;
  if ((f->t && !tw) || !clone_weights(w, b, m, &nw, &nb)) {
    free(tw);
    return diag_error(d, "out of memory folding into a convolution"), TEQ_ERR_NOMEM;
  }
  for (int64_t o = 0; o < m; o++) {
    int64_t first = (o / (m / v->groups)) * v->cg; /* x's channel of input j = 0 */
    double inside = 0;
    for (int64_t j = 0; j < v->cg; j++)
      for (int64_t e = 0; e < per; e++) {
        float *wj = (float *)nw->data + (o * v->cg + j) * per + e;
        if (f->t) {
          double add = (double)*wj * f->t[first + j];
          tw[o * per + e] += add;
          inside += add;
        }
        if (f->s) *wj = (float)(*wj * f->s[first + j]);
      }
    float *bo = (float *)nb->data + o;
    *bo = (float)(*bo + inside);
  }
  int rc = f->t ? border_residual(v, tw, z0, &z, d) : 0;
  free(tw);
  if (rc < 0 || rc == 2 || (z && dyn)) {
    tensor_unref(nw), tensor_unref(nb), tensor_unref(z);
    return rc < 0 ? rc : 0;
  }
  const Node *cn = &g->nodes[c];
  Params p = cn->params;
  TensorRef in[4] = {f->x, {-1, 0}, {-1, 0}, cn->n_in > 3 ? cn->in[3] : (TensorRef){-1, 0}};
  int n_in = z || cn->n_in > 3 ? 4 : 3;
  Tensor *made[3] = {nw, nb, z};
  for (int k = 0; k < 3; k++) {
    if (!made[k]) continue;
    int id = graph_add_const(g, NULL, made[k], d);
    if (id < 0) {
      for (int r = k; r < 3; r++) tensor_unref(made[r]);
      return id;
    }
    in[k + 1] = (TensorRef){id, 0};
  }
  return take_over(g, c, c, OP_CONV2D, in, n_in, &p, d);
}

/* Conv node c folding the affine it alone reads: 1 for a BatchNorm, 2 for
 * a scale or shift, 0 where it does not apply, or an error. (fold_affine's
 * new node is never node 0: it comes after the nodes it reads.) */
static int fold_before_conv(Graph *g, int32_t c, const Uses *u, bool batchnorms, bool scales,
                            Diag *d) {
  const Node *cn = &g->nodes[c];
  if (cn->kind != OP_CONV2D || cn->n_out != 1 || cn->n_in < 2 || cn->dtype != DT_F32 ||
      op_output_pooled(cn) || uses_of(u, (TensorRef){c, 0}) < 1 || cn->in[0].out != 0 ||
      uses_of(u, cn->in[0]) != 1)
    return 0;
  const Node *a = &g->nodes[cn->in[0].node];
  if (!(a->kind == OP_BATCHNORM ? batchnorms : scales)) return 0;
  const Tensor *w = const_input(g, cn, 1, -1);
  if (!w || w->shape.ndim != 4) return 0;
  const Tensor *b = cn->n_in > 2 ? const_input(g, cn, 2, w->shape.d[0]) : NULL;
  const Tensor *z0 = cn->n_in > 3 ? const_input(g, cn, 3, shape_numel(&cn->out[0])) : NULL;
  const Shape *xs = &a->out[0], *ys = &cn->out[0];
  if ((cn->n_in > 2 && !b) || xs->ndim != 4 || ys->ndim != 4) return 0;
  const Params *p = &cn->params;
  int si = param_index(OP_CONV2D, "stride"), pi = param_index(OP_CONV2D, "pads");
  int di = param_index(OP_CONV2D, "dilation");
  ConvWindow v = {.n = ys->d[0], .m = ys->d[1], .cg = w->shape.d[1], .kh = w->shape.d[2],
                  .kw = w->shape.d[3], .h = xs->d[2], .w = xs->d[3], .oh = ys->d[2],
                  .ow = ys->d[3], .sh = p->v[si].i[0], .sw = p->v[si].i[1],
                  .ph = p->v[pi].i[0], .pw = p->v[pi].i[1], .dh = p->v[di].i[0],
                  .dw = p->v[di].i[1], .groups = param_int(p, param_index(OP_CONV2D, "groups"))};
  if (v.cg * v.groups != xs->d[1] || v.m != w->shape.d[0]) return 0;
  ChannelAffine f;
  int rc = channel_affine(g, a, xs->d[1], &f, d);
  if (rc <= 0) return rc;
  rc = fold_affine(g, c, &f, &v, w, b, z0, cn->n_in > 3 && !z0, d);
  free(f.s), free(f.t);
  return rc <= 0 ? rc : f.batchnorm ? 1 : 2;
}

/* Gemm node c reading, through a reshape that flattens each sample
 * ([N, C, ...] to [N, C x ...]) or directly, the per-channel affine a
 * alone reads (IResNet's BatchNorm before its embedding): no padding, so
 *   (s x + t) W = x (s W) + t W,
 * B's inputs of channel ch scaled by s[ch] and t W added to the bias.
 * Returns as fold_before_conv does. */
static int fold_before_gemm(Graph *g, int32_t c, const Uses *u, bool batchnorms, bool scales,
                            Diag *d) {
  const Node *cn = &g->nodes[c];
  const Tensor *w, *b;
  if (cn->kind != OP_GEMM || !layer_weights(g, cn, &w, &b) ||
      param_int(&cn->params, param_index(OP_GEMM, "transA")) || cn->in[0].out != 0 ||
      uses_of(u, cn->in[0]) != 1)
    return 0;
  int32_t view = -1;
  TensorRef r = cn->in[0];
  const Shape *ys = &g->nodes[r.node].out[0];
  if (g->nodes[r.node].kind == OP_RESHAPE) {
    const Shape *xs = graph_shape(g, g->nodes[r.node].in[0]);
    if (ys->ndim != 2 || xs->ndim < 2 || xs->d[0] != ys->d[0]) return 0;
    view = r.node;
    r = g->nodes[view].in[0];
    if (r.out != 0 || uses_of(u, r) != 1) return 0;
  }
  const Node *a = &g->nodes[r.node];
  if (!(a->kind == OP_BATCHNORM ? batchnorms : scales) || a->out[0].ndim < 2) return 0;
  bool trans_b = gemm_trans_b(cn);
  int64_t channels = a->out[0].d[1], n = out_channels(cn, w), k = w->shape.d[trans_b ? 1 : 0];
  int64_t per = shape_numel(&a->out[0]) / a->out[0].d[0] / channels; /* elements of a channel */
  if (channels * per != k || (view < 0 && a->out[0].ndim != 2)) return 0;
  ChannelAffine f;
  int rc = channel_affine(g, a, channels, &f, d);
  if (rc <= 0) return rc;
  Tensor *nw, *nb;
  if (!clone_weights(w, b, n, &nw, &nb)) {
    free(f.s), free(f.t);
    return diag_error(d, "out of memory folding into a gemm"), TEQ_ERR_NOMEM;
  }
  float *wd = nw->data, *bias = nb->data;
  for (int64_t j = 0; j < n; j++) {
    double shift = 0;
    for (int64_t e = 0; e < k; e++) {
      float *v = wd + (trans_b ? j * k + e : e * n + j);
      if (f.t) shift += (double)*v * f.t[e / per];
      if (f.s) *v = (float)(*v * f.s[e / per]);
    }
    bias[j] = (float)(bias[j] + shift);
  }
  bool batchnorm = f.batchnorm;
  TensorRef x = f.x;
  free(f.s), free(f.t);
  if (view >= 0) {
    Params vp = g->nodes[view].params;
    int vi = graph_add_node(g, OP_RESHAPE, &x, 1, 1, &vp, NULL, d);
    if (vi < 0) {
      tensor_unref(nw);
      tensor_unref(nb);
      return vi;
    }
    x = (TensorRef){vi, 0};
  }
  int id = remake_with_weights(g, c, c, x, nw, nb, d);
  return id < 0 ? id : batchnorm ? 1 : 2;
}

static int fold_before_conv_one(Graph *g, int32_t i, const Uses *u, const void *how, Diag *d) {
  const AffineKinds *k = how;
  if (g->nodes[i].kind == OP_GEMM) return fold_before_gemm(g, i, u, k->batchnorms, k->scales, d);
  return fold_before_conv(g, i, u, k->batchnorms, k->scales, d);
}

int onnx_pass_fold_affines_into_convs(Graph *g, bool batchnorms, bool scales, int *n_batchnorms,
                                      Diag *d) {
  return fold_affines(g, fold_before_conv_one, batchnorms, scales, n_batchnorms, d);
}

int onnx_pass_fuse_activations(Graph *g, Diag *d) {
  Uses u;
  if (pass_uses(g, &u, "fusing activations", d)) return TEQ_ERR_NOMEM;
  int n = 0, rc = TEQ_OK;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0 && rc == TEQ_OK; i++) {
    const Node *a = &g->nodes[i];
    int act = a->n_in == 1 ? act_of_node(a) : ACT_NONE;
    if (act == ACT_NONE) continue;
    TensorRef x = a->in[0];
    /* Through a reshape it alone reads (a product's bias fused into a
     * gemm, seen in the product's shape again): an activation is applied
     * element by element, so before the reshape or after is the same. */
    int32_t view = -1;
    if (g->nodes[x.node].kind == OP_RESHAPE && uses_of(&u, x) == 1) {
      view = x.node;
      x = g->nodes[view].in[0];
    }
    const Node *p = &g->nodes[x.node];
    int act_i = param_index(p->kind, "act");
    /* The producer's only use, and its only output: fusing must not change
     * what another reader (or the graph's output) sees. */
    if (act_i < 0 || p->n_out != 1 || uses_of(&u, (TensorRef){x.node, 0}) != 1 ||
        p->params.v[act_i].i[0] != ACT_NONE || p->dtype != DT_F32 || op_output_pooled(p) ||
        p->n_in > 8)
      continue;
    int id = retake_with(g, view < 0 ? i : x.node, x.node, act_i, act, d);
    if (id < 0) {
      rc = id;
      break;
    }
    if (view >= 0) graph_replace_uses(g, (TensorRef){i, 0}, (TensorRef){view, 0});
    n++;
  }
  uses_fini(&u);
  return rc == TEQ_OK ? n : rc;
}

/* ---- a product's bias ----
 * PyTorch writes a linear layer over an input of more than two dimensions
 * (a transformer's tokens) as MatMul and then an Add of the bias, which
 * ONNX's Gemm, two-dimensional, cannot hold: the Add is a pass over the
 * product's output of its own. A matmul of x [..., m, k] and a matrix
 * [k, n] that an Add of one value per column alone reads becomes a gemm of
 * x seen as [rows, k] with that bias as its C, seen in the product's shape
 * again (reshapes, views): the bias is added as each sum finishes, where
 * cuBLASLt's epilogue adds it, and a relu after it fuses as well
 * (onnx_pass_fuse_activations runs after this). The same products and
 * sums; a BLAS may add the bias to a partial sum rather than the whole,
 * which can round the last bit differently. */

/* Fuses add node a into the product it adds a bias to; 1 if it did, 0
 * where it does not apply, or an error. products: how many products read
 * each output, indexed as u's counts. A product whose input another
 * product reads too is left to the search, which may merge the two into
 * one (NasRNN's cells, where the first step's bias is a product of
 * constants: taken into gemms, its products no longer merged, 2.08 ->
 * 1.99 over as given). */
static int fuse_product_bias(Graph *g, int32_t a, const Uses *u, const int32_t *products,
                             Diag *d) {
  const Node *an = &g->nodes[a];
  int k;
  const Tensor *b = an->n_in == 2 && an->dtype == DT_F32 ? const_operand(g, an, &k) : NULL;
  if (!b) return 0;
  TensorRef prod = an->in[1 - k];
  const Node *pn = &g->nodes[prod.node];
  Shape out = an->out[0];
  if (pn->kind != OP_MATMUL || pn->n_in != 2 || uses_of(u, prod) != 1 || pn->dtype != DT_F32 ||
      param_int(&pn->params, param_index(OP_MATMUL, "act")) != ACT_NONE ||
      !shape_equal(&pn->out[0], &out) || uses_of(u, pn->in[0]) < 0 ||
      products[u->offset[pn->in[0].node] + pn->in[0].out] != 1)
    return 0;
  const Shape *xs = graph_shape(g, pn->in[0]), *ws = graph_shape(g, pn->in[1]);
  int axis = broadcast_axis(b, &out);
  if (xs->ndim < 2 || ws->ndim != 2 || (axis != TEQ_MAX_DIMS && axis != out.ndim - 1)) return 0;
  int64_t cols = ws->d[1], depth = ws->d[0], rows = shape_numel(xs) / depth;
  if (rows > INT32_MAX || cols > INT32_MAX || depth > INT32_MAX || rows * cols == 0) return 0;
  bool flat = xs->ndim == 2;
  TensorRef x = pn->in[0], w = pn->in[1];
  Shape bs = shape_of(1, (int)cols), xs2 = shape_of(2, (int)rows, (int)depth);
  Tensor *bias = tensor_new(DT_F32, &bs);
  if (!bias) return diag_error(d, "out of memory fusing a product's bias"), TEQ_ERR_NOMEM;
  for (int64_t c = 0; c < cols; c++) ((float *)bias->data)[c] = along(b, c);
  int bi = graph_add_const(g, NULL, bias, d);
  if (bi < 0) {
    tensor_unref(bias);
    return bi;
  }
  Params rp, gp;
  params_default(OP_RESHAPE, &rp);
  params_default(OP_GEMM, &gp);
  int r = param_index(OP_RESHAPE, "shape");
  if (!flat) {
    param_set_ints(&rp, r, xs2.d, 2);
    int xi = graph_add_node(g, OP_RESHAPE, &x, 1, 1, &rp, NULL, d);
    if (xi < 0) return xi;
    x = (TensorRef){xi, 0};
  }
  TensorRef in[3] = {x, w, {bi, 0}};
  if (flat) {
    int id = take_over(g, a, prod.node, OP_GEMM, in, 3, &gp, d);
    return id < 0 ? id : 1;
  }
  char *name = g->nodes[prod.node].name ? strdup(g->nodes[prod.node].name) : NULL;
  int gi = graph_add_node(g, OP_GEMM, in, 3, 1, &gp, name, d);
  free(name);
  if (gi < 0) return gi;
  param_set_ints(&rp, r, out.d, out.ndim);
  int id = take_over(g, a, a, OP_RESHAPE, (TensorRef[]){{gi, 0}}, 1, &rp, d);
  return id < 0 ? id : 1;
}

/* One round of fuse_product_bias over the nodes g has now: how many fused,
 * or an error. */
static int fuse_product_biases_once(Graph *g, Diag *d) {
  Uses u;
  if (pass_uses(g, &u, "fusing products' biases", d)) return TEQ_ERR_NOMEM;
  int32_t *products = calloc((size_t)u.offset[u.n] + 1, sizeof *products);
  if (!products) {
    uses_fini(&u);
    return diag_error(d, "out of memory fusing products' biases"), TEQ_ERR_NOMEM;
  }
  for (int32_t i = 0; i < u.n; i++) {
    const Node *p = &g->nodes[i];
    if (p->kind != OP_MATMUL && p->kind != OP_GEMM) continue;
    for (int j = 0; j < p->n_in; j++) products[u.offset[p->in[j].node] + p->in[j].out]++;
  }
  int n = 0, rc = TEQ_OK;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0; i++) {
    if (g->nodes[i].kind != OP_EWADD) continue;
    if ((rc = fuse_product_bias(g, i, &u, products, d)) < 0) break;
    n += rc;
  }
  free(products);
  uses_fini(&u);
  return rc < 0 ? rc : n;
}

/* In rounds: a linear layer that reads the one before it directly reads a
 * reshape this pass made, whose readers the round after counts. */
int onnx_pass_fuse_product_biases(Graph *g, Diag *d) {
  int total = 0, n;
  while ((n = fuse_product_biases_once(g, d)) > 0) {
    int rc = graph_remove_dead(g);
    if (rc < 0) return rc;
    total += n;
  }
  return n < 0 ? n : total;
}

/* ---- a scale on some of a product's columns ----
 * Attention divides its queries by the square root of their width after
 * one product has made queries, keys and values together and slices (or
 * a split), reshapes and transposes have cut them apart (PyTorch's
 * nn.MultiheadAttention): a pass over the queries of its own. A scale of
 * one value (x * s, or x / s) whose input such a chain cuts from a product
 * of constant weights (a matmul, or a gemm with a bias of one value per
 * column) scales every element of some of the product's columns, so those
 * columns of the weights and bias take it instead. Which columns: the
 * chain run on a tensor of the product's shape holding each element's
 * column. These operators move elements or part them, never copy one, so
 * the fold holds where the scale reaches every element of its columns and
 * the chain's other readers (the keys' and values' slices) none of them. */

#define SCALE_CHAIN_MAX 8 /* nodes between a product and its scale */
/* The largest product whose columns are traced, in elements (64 MB): the
 * trace runs the chain on a tensor of the product's shape, and a batch of
 * long sequences is left as written rather than copied a few times. */
#define SCALE_PROBE_MAX (INT64_C(1) << 24)

/* Output k of node c of g run on in (a layout operator: its other inputs,
 * a gather's indices, are constants): a new tensor in *out, or an error. */
static int run_layout(const Graph *g, const Node *c, Tensor *in, int k, Tensor **out, Diag *d) {
  Graph *s = graph_new();
  if (!s) return diag_error(d, "out of memory folding a scale"), TEQ_ERR_NOMEM;
  TensorRef r[2] = {{graph_add_const(s, NULL, tensor_ref(in), d), 0}};
  int rc = r[0].node;
  if (rc < 0) tensor_unref(in);
  if (rc >= 0 && c->n_in == 2) {
    Tensor *idx = tensor_ref(g->nodes[c->in[1].node].value);
    r[1] = (TensorRef){rc = graph_add_const(s, NULL, idx, d), 0};
    if (rc < 0) tensor_unref(idx);
  }
  if (rc >= 0) rc = graph_add_node(s, c->kind, r, c->n_in, c->n_out, &c->params, NULL, d);
  if (rc >= 0) rc = graph_add_output(s, (TensorRef){rc, k}, "columns", d);
  if (rc >= 0) rc = exec_run(s, EXEC_F32, NULL, out, d);
  graph_free(s);
  return rc < 0 ? rc : TEQ_OK;
}

/* Each column held by t (a probe: elements are their columns) marked v in
 * cols, counted in count where not NULL. */
static void mark_columns(const Tensor *t, uint8_t *cols, uint8_t v, int64_t *count) {
  for (int64_t i = 0; i < tensor_numel(t); i++) {
    int64_t c = (int64_t)((const float *)t->data)[i];
    cols[c] |= v;
    if (count) count[c]++;
  }
}

/* The chain from a product to its scale: at[0] reads the product, at[k]
 * reads at[k - 1]'s output out[k - 1], the last's output out[n - 1] is the
 * scale's input. Where a node's input has other readers, each cuts it
 * too (siblings: the keys' and values' slices). */
typedef struct ScaleChain {
  int32_t product, at[SCALE_CHAIN_MAX], out[SCALE_CHAIN_MAX];
  int n;
} ScaleChain;

/* Whether gather node c of g takes up to 64 constant indices, none
 * negative, none twice. */
static bool gathers_distinct(const Graph *g, const Node *c) {
  const Node *src = c->n_in == 2 ? &g->nodes[c->in[1].node] : NULL;
  if (!src || src->kind != OP_CONST || !src->value || src->value->dtype != DT_I64) return false;
  const int64_t *v = src->value->data;
  int64_t n = tensor_numel(src->value);
  for (int64_t i = 0; i < n && i < 64; i++) { /* -1 and the last would be one element */
    if (v[i] < 0) return false;
    for (int64_t j = 0; j < i; j++)
      if (v[i] == v[j]) return false;
  }
  return n <= 64;
}

/* Whether node c of g cuts its input 0 without copying an element (the
 * registry's OPF_NO_COPIES, or a gather of distinct indices); with one
 * output, where it reads beside the chain. */
static bool cuts(const Graph *g, const Node *c, bool one_output) {
  if (c->kind == OP_GATHER) return gathers_distinct(g, c);
  return op_def(c->kind)->flags & OPF_NO_COPIES && c->n_in == 1 &&
         (!one_output || c->n_out == 1);
}

/* Whether every reader of r in g but chain node next cuts it (cuts, with
 * one output), reading it once. */
static bool only_cuts_beside(const Graph *g, TensorRef r, int32_t next) {
  for (int32_t i = 0; i < g->n_nodes; i++) {
    const Node *c = &g->nodes[i];
    for (int j = 0; j < c->n_in; j++)
      if (c->in[j].node == r.node && c->in[j].out == r.out && i != next &&
          (j != 0 || !cuts(g, c, true)))
        return false;
  }
  for (int32_t j = 0; j < g->n_outputs; j++)
    if (g->outputs[j].node == r.node && g->outputs[j].out == r.out) return false;
  return true;
}

/* The columns of the product's output that reach the scale through chain
 * h, 1 in cols. 1 when each reaches it whole and no sibling slice reads
 * one, 0 when not, or an error. */
static int columns_reaching(const Graph *g, const ScaleChain *h, uint8_t *cols, Diag *d) {
  const Shape *ps = &g->nodes[h->product].out[0];
  int64_t width = ps->d[ps->ndim - 1], total = shape_numel(ps);
  Tensor *cur = tensor_new_uninit(DT_F32, ps);
  int64_t *count = calloc((size_t)width, sizeof *count);
  int rc = cur && count ? TEQ_OK : diag_error(d, "out of memory folding a scale");
  for (int64_t i = 0; rc == TEQ_OK && i < total; i++) ((float *)cur->data)[i] = (float)(i % width);
  memset(cols, 0, (size_t)width);
  TensorRef r = {h->product, 0};
  for (int k = 0; rc == TEQ_OK && k < h->n; k++) {
    const Node *c = &g->nodes[h->at[k]];
    for (int32_t i = 0; i < g->n_nodes && rc == TEQ_OK; i++) { /* siblings: their columns */
      const Node *sib = &g->nodes[i];
      if (i == h->at[k] || sib->n_in < 1 || sib->in[0].node != r.node ||
          sib->in[0].out != r.out || !cuts(g, sib, true))
        continue;
      Tensor *t = NULL;
      if ((rc = run_layout(g, sib, cur, 0, &t, d)) == TEQ_OK) mark_columns(t, cols, 2, NULL);
      tensor_unref(t);
    }
    Tensor *next = NULL;
    if (rc == TEQ_OK) rc = run_layout(g, c, cur, h->out[k], &next, d);
    tensor_unref(cur);
    cur = next;
    r = (TensorRef){h->at[k], h->out[k]};
  }
  int whole = 1;
  if (rc == TEQ_OK) {
    mark_columns(cur, cols, 1, count);
    for (int64_t c = 0; c < width; c++) {
      whole &= cols[c] != 3 && (count[c] == 0 || count[c] == total / width);
      cols[c] &= 1;
    }
  }
  tensor_unref(cur);
  free(count);
  return rc < 0 ? rc : whole;
}

/* Folds scale node m (a Mul or Div of one value) into the columns of the
 * product its input is cut from; 1 if it did, 0 where it does not apply,
 * or an error. */
static int fold_head_scale(Graph *g, int32_t m, const Uses *u, Diag *d) {
  const Node *mn = &g->nodes[m];
  int k = 1;
  const Tensor *sc = mn->kind == OP_DIV ? const_input(g, mn, 1, 1)
                     : mn->kind == OP_EWMUL && mn->n_in == 2 ? const_operand(g, mn, &k)
                                                             : NULL;
  if (!sc || tensor_numel(sc) != 1 || mn->dtype != DT_F32 || mn->n_in != 2) return 0;
  TensorRef q = mn->in[mn->kind == OP_DIV ? 0 : 1 - k];
  if (!shape_equal(graph_shape(g, q), &mn->out[0]) || uses_of(u, q) != 1) return 0;
  ScaleChain h = {.n = 0};
  int32_t rev[SCALE_CHAIN_MAX], rev_out[SCALE_CHAIN_MAX], next = m;
  TensorRef r = q;
  for (; cuts(g, &g->nodes[r.node], false); next = r.node, r = g->nodes[r.node].in[0]) {
    if (h.n == SCALE_CHAIN_MAX || uses_of(u, r) < 1 ||
        (uses_of(u, r) > 1 && !only_cuts_beside(g, r, next)))
      return 0;
    rev[h.n] = r.node, rev_out[h.n++] = r.out;
  }
  const Node *pn = &g->nodes[r.node];
  if (h.n == 0 || r.out != 0 || uses_of(u, r) < 1 || pn->dtype != DT_F32 || pn->n_out != 1 ||
      (pn->kind != OP_MATMUL && pn->kind != OP_GEMM) ||
      param_int(&pn->params, param_index(pn->kind, "act")) != ACT_NONE ||
      (uses_of(u, r) > 1 && !only_cuts_beside(g, r, next)))
    return 0;
  for (int j = 0; j < h.n; j++) h.at[j] = rev[h.n - 1 - j], h.out[j] = rev_out[h.n - 1 - j];
  h.product = r.node;
  bool gemm = pn->kind == OP_GEMM;
  const Shape *ps = &pn->out[0];
  int64_t width = ps->d[ps->ndim - 1];
  const Tensor *w = const_input(g, pn, 1, -1);
  const Tensor *c = gemm && pn->n_in > 2 ? const_input(g, pn, 2, width) : NULL;
  bool trans_b = gemm && param_int(&pn->params, param_index(OP_GEMM, "transB"));
  if (!w || w->shape.ndim != 2 || w->shape.d[trans_b ? 0 : 1] != width ||
      (gemm && pn->n_in > 2 && !c) || pn->n_in > 3 || shape_numel(ps) > SCALE_PROBE_MAX)
    return 0;
  uint8_t *cols = malloc((size_t)width);
  if (!cols) return diag_error(d, "out of memory folding a scale"), TEQ_ERR_NOMEM;
  int32_t p = r.node;
  int rc = columns_reaching(g, &h, cols, d);
  Tensor *nw = rc == 1 ? tensor_clone(w) : NULL, *nc = rc == 1 && c ? tensor_clone(c) : NULL;
  if (rc == 1 && (!nw || (c && !nc))) {
    diag_error(d, "out of memory folding a scale");
    rc = TEQ_ERR_NOMEM;
  }
  if (rc == 1) {
    bool div = mn->kind == OP_DIV;
    float s = ((const float *)sc->data)[0];
    int64_t depth = w->shape.d[trans_b ? 1 : 0];
    for (int64_t j = 0; j < width; j++) {
      if (!cols[j]) continue;
      for (int64_t e = 0; e < depth; e++) {
        float *v = (float *)nw->data + (trans_b ? j * depth + e : e * width + j);
        *v = div ? *v / s : *v * s;
      }
      float *cv = nc ? (float *)nc->data + j : NULL;
      if (cv) *cv = div ? *cv / s : *cv * s;
    }
  }
  free(cols);
  if (rc != 1) {
    tensor_unref(nw);
    tensor_unref(nc);
    return rc;
  }
  int id = remake_with_weights(g, p, p, g->nodes[p].in[0], nw, nc, d);
  if (id < 0) return id;
  graph_replace_uses(g, (TensorRef){m, 0}, q);
  return 1;
}

static int fold_head_scale_one(Graph *g, int32_t i, const Uses *u, const void *how, Diag *d) {
  (void)how;
  OpKind k = g->nodes[i].kind;
  return k == OP_EWMUL || k == OP_DIV ? fold_head_scale(g, i, u, d) : 0;
}

/* In rounds: where the keys are scaled too, their chain reads the product
 * the queries' fold made, whose readers the next round counts. */
int onnx_pass_fold_head_scales(Graph *g, Diag *d) {
  int tally = 0;
  return fold_rounds(g, "folding scales into products", fold_head_scale_one, NULL, &tally, 1, d);
}

/* The window k of maxpool node m when it is k x k at stride k, unpadded
 * and undilated, else 0. */
static int64_t tiling_window(const Node *m) {
  const Params *p = &m->params;
  const int64_t *k = p->v[param_index(OP_MAXPOOL, "kernel")].i;
  const int64_t *s = p->v[param_index(OP_MAXPOOL, "stride")].i;
  const int64_t *dl = p->v[param_index(OP_MAXPOOL, "dilation")].i;
  const int64_t *pads = p->v[param_index(OP_MAXPOOL, "pads")].i;
  if (k[0] < 2 || k[1] != k[0] || s[0] != k[0] || s[1] != k[0] || dl[0] != 1 || dl[1] != 1)
    return 0;
  for (int i = 0; i < 4; i++)
    if (pads[i]) return 0;
  return k[0];
}

int onnx_pass_fuse_pools(Graph *g, Diag *d) {
  Uses u;
  if (pass_uses(g, &u, "fusing pools", d)) return TEQ_ERR_NOMEM;
  int n = 0, rc = TEQ_OK;
  for (int32_t i = 0, n0 = g->n_nodes; i < n0 && rc == TEQ_OK; i++) {
    const Node *m = &g->nodes[i];
    if (m->kind != OP_MAXPOOL || m->n_out != 1 || m->n_in != 1) continue;
    int64_t k = tiling_window(m);
    TensorRef x = m->in[0];
    const Node *p = &g->nodes[x.node];
    int pool_i = param_index(p->kind, "pool");
    if (!k || pool_i < 0 || x.out != 0 || p->n_out != 1 || uses_of(&u, x) != 1 ||
        p->params.v[pool_i].i[0] != 0 || p->dtype != DT_F32 || p->n_in > 8)
      continue;
    /* ceil_mode keeps a partial last window where the extent is not a
     * multiple of k: the pool's output must be the whole windows alone. */
    const Shape *full = &p->out[0];
    if (full->ndim != 4) continue;
    Shape whole = shape_make(4, (int64_t[]){full->d[0], full->d[1], full->d[2] / k, full->d[3] / k});
    if (!shape_equal(&m->out[0], &whole)) continue;
    int id = retake_with(g, i, x.node, pool_i, k, d);
    if (id < 0) {
      rc = id;
      break;
    }
    n++;
  }
  uses_fini(&u);
  return rc == TEQ_OK ? n : rc;
}
