/* box.c: PET's box propagation (section 5.2, step 1) and the degree of
 * Theorem 2.
 *
 * Every tensor of a graph gets split points per dimension, computed from
 * its producer's inputs in topological order. The invariant a rule keeps:
 * inside one cell of its output grid, each output position reads its
 * inputs through index maps that are affine in the position, over one
 * summation range, and never crosses a cell boundary of an input. That is
 * what Theorem 1 needs for m+1 positions to speak for a whole box. The one
 * table below, rules[], keyed by OpKind, is the only per-operator knowledge
 * here; an operator without a row (or a row that declines its parameters)
 * makes its outputs, and everything they reach, is_whole: one box tested at
 * every position. The rebuilding of regions for corrections is correct.c's
 * own table. */
#include <stdlib.h>
#include <string.h>

#include "optimize/pet/pet.h"

/* A rule's answer besides TEQ_OK and errors: the split structure cannot be
 * expressed (an activation, a reflect pad, a reshape that would need too
 * many points). */
#define RULE_DECLINE 1
/* Bound on the points one merging reshape may create along a dimension. */
#define MERGE_POINTS_MAX (1 << 20)

/* ---- point lists ---- */

static int push(int64_t **v, int32_t *n, int32_t *cap, int64_t x) {
  if (*n == *cap) {
    int32_t c = *cap ? 2 * *cap : 8;
    int64_t *p = realloc(*v, (size_t)c * sizeof *p);
    if (!p) return TEQ_ERR_NOMEM;
    *v = p;
    *cap = c;
  }
  (*v)[(*n)++] = x;
  return TEQ_OK;
}

/* Adds split point x to dimension k; points outside (0, extent) cut nothing. */
static int add(PetBoxes *b, int k, int64_t x) {
  if (x <= 0 || x >= b->extent[k]) return TEQ_OK;
  return push(&b->points[k], &b->n_points[k], &b->cap[k], x);
}

/* Every point of src's dimension ks, moved by shift, into dst's kd. */
static int copy(PetBoxes *dst, int kd, const PetBoxes *src, int ks, int64_t shift) {
  int rc = TEQ_OK;
  for (int i = 0; i < src->n_points[ks] && !rc; i++) rc = add(dst, kd, src->points[ks][i] + shift);
  return rc;
}

static int cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

static void normalize(PetBoxes *b) {
  for (int k = 0; k < b->ndim; k++) {
    int32_t n = b->n_points[k], m = 0;
    if (n) qsort(b->points[k], (size_t)n, sizeof(int64_t), cmp_i64);
    for (int32_t i = 0; i < n; i++)
      if (m == 0 || b->points[k][m - 1] != b->points[k][i]) b->points[k][m++] = b->points[k][i];
    b->n_points[k] = m;
  }
}

static void boxes_init(PetBoxes *b, const Shape *s) {
  memset(b, 0, sizeof *b);
  if (!shape_is_known(s)) {
    b->is_whole = true;
    snprintf(b->why, sizeof b->why, "unknown shape");
    return;
  }
  b->ndim = s->ndim;
  for (int k = 0; k < s->ndim; k++) b->extent[k] = s->d[k];
}

void pet_boxes_fini(PetBoxes *b) {
  for (int k = 0; k < TEQ_MAX_DIMS; k++) free(b->points[k]);
  memset(b, 0, sizeof *b);
}

static void make_whole(PetBoxes *b, const char *why) {
  for (int k = 0; k < b->ndim; k++) b->n_points[k] = 0;
  b->is_whole = true;
  snprintf(b->why, sizeof b->why, "%s", why);
}

static int64_t floor_div(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static int64_t ceil_div(int64_t a, int64_t b) { return -floor_div(-a, b); }

/* ---- the rules ---- */

typedef int (*BoxRule)(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out);

static const Shape *in_shape(const Graph *g, const Node *n, int i) {
  return graph_shape(g, n->in[i]);
}

static int64_t param(const Node *n, const char *name, int i) {
  return n->params.v[param_index(n->kind, name)].i[i];
}

static int rule_none(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  (void)g, (void)n, (void)in, (void)out;
  return TEQ_OK;
}

static int rule_identity(const Graph *g, const Node *n, const PetBoxes *const *in,
                         PetBoxes *out) {
  int rc = TEQ_OK;
  (void)g, (void)n;
  for (int k = 0; k < out->ndim && !rc; k++) rc = copy(out, k, in[0], k, 0);
  return rc;
}

/* A weight's values are fixed, so it is a split wherever two adjacent
 * hyperplanes differ: inside a box it is then constant along each axis. */
static int rule_const(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  (void)g, (void)in;
  const Tensor *t = n->value;
  const Shape *s = &t->shape;
  const char *data = t->data;
  size_t es = dtype_size(t->dtype);
  for (int k = 0; k < s->ndim; k++) {
    int64_t outer = 1, inner = 1, len = s->d[k];
    for (int i = 0; i < k; i++) outer *= s->d[i];
    for (int i = k + 1; i < s->ndim; i++) inner *= s->d[i];
    size_t row = (size_t)inner * es;
    for (int64_t i = 1; i < len; i++) {
      bool same = true;
      for (int64_t o = 0; o < outer && same; o++) {
        const char *p = data + (size_t)(o * len + i) * row;
        same = memcmp(p, p - row, row) == 0;
      }
      int rc = same ? TEQ_OK : add(out, k, i);
      if (rc) return rc;
    }
  }
  return TEQ_OK;
}

/* One spatial axis of a conv: tap j of output o reads input o*s + j*dl -
 * pad, so the taps that fall in the padding, or on either side of an
 * input split q, change where o*s + j*dl - pad crosses q (0 and the extent
 * count as splits: the padding borders). */
static int conv_axis(PetBoxes *o, int ko, const PetBoxes *x, int kx, int64_t len, int64_t k,
                     int64_t s, int64_t dl, int64_t pad) {
  int32_t np = x->n_points[kx];
  for (int32_t i = 0; i <= np + 1; i++) {
    int64_t q = i == 0 ? 0 : i == np + 1 ? len : x->points[kx][i - 1];
    for (int64_t j = 0; j < k; j++) {
      int rc = add(o, ko, ceil_div(q + pad - j * dl, s));
      if (rc) return rc;
    }
  }
  return TEQ_OK;
}

/* Batch follows X, channels follow W's (and the bias's) first axis; the
 * summed axes (input channels, taps) cut nothing, except that output
 * channel m reads the input channels of group m / (M/groups), a map that is
 * affine only inside one group. */
static int rule_conv2d(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  if (param(n, "act", 0) != ACT_NONE || op_output_pooled(n)) return RULE_DECLINE;
  const Shape *x = in_shape(g, n, 0), *w = in_shape(g, n, 1);
  int64_t groups = param(n, "groups", 0), mg = w->d[0] / groups;
  int rc = copy(out, 0, in[0], 0, 0);
  if (!rc) rc = copy(out, 1, in[1], 0, 0);
  if (!rc && n->n_in > 2) rc = copy(out, 1, in[2], 0, 0);
  for (int64_t m = mg; groups > 1 && m < w->d[0] && !rc; m += mg) rc = add(out, 1, m);
  for (int a = 0; a < 2 && !rc; a++)
    rc = conv_axis(out, 2 + a, in[0], 2 + a, x->d[2 + a], w->d[2 + a], param(n, "stride", a),
                   param(n, "dilation", a), param(n, "pads", a));
  return rc;
}

/* Output dimensions [from, to) of out take the points of src (shape s)
 * aligned to the right, numpy-style, where src is not broadcast. */
static int align(PetBoxes *out, int from, int to, const PetBoxes *src, const Shape *s) {
  int shift = out->ndim - s->ndim, rc = TEQ_OK;
  for (int i = from; i < to && !rc; i++) {
    int k = i - shift;
    if (k >= 0 && s->d[k] == out->extent[i]) rc = copy(out, i, src, k, 0);
  }
  return rc;
}

static int rule_elementwise(const Graph *g, const Node *n, const PetBoxes *const *in,
                            PetBoxes *out) {
  int rc = TEQ_OK;
  for (int i = 0; i < n->n_in && !rc; i++) rc = align(out, 0, out->ndim, in[i], in_shape(g, n, i));
  return rc;
}

/* Rows follow A, columns follow B, batch dimensions both; K is summed. */
static int rule_matmul(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  const Shape *a = in_shape(g, n, 0), *b = in_shape(g, n, 1);
  int r = out->ndim;
  if (param(n, "act", 0) != ACT_NONE || a->ndim < 2 || b->ndim < 2) return RULE_DECLINE;
  int rc = align(out, 0, r - 2, in[0], a);
  if (!rc) rc = align(out, 0, r - 2, in[1], b);
  if (!rc) rc = copy(out, r - 2, in[0], a->ndim - 2, 0);
  if (!rc) rc = copy(out, r - 1, in[1], b->ndim - 1, 0);
  return rc;
}

static int rule_concat(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  int axis = (int)param(n, "axis", 0), rc = TEQ_OK;
  int64_t off = 0;
  for (int k = 0; k < n->n_in && !rc; k++) {
    for (int i = 0; i < out->ndim && !rc; i++) rc = copy(out, i, in[k], i, i == axis ? off : 0);
    if (!rc) rc = add(out, axis, off);
    off += in_shape(g, n, k)->d[axis];
  }
  return rc;
}

static int rule_split(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  (void)g;
  int axis = (int)param(n, "axis", 0), rc = TEQ_OK;
  int64_t off = 0;
  for (int k = 0; k < n->n_out && !rc; k++) {
    for (int i = 0; i < out[k].ndim && !rc; i++) rc = copy(&out[k], i, in[0], i, i == axis ? -off : 0);
    off += out[k].extent[axis];
  }
  return rc;
}

/* A constant pad shifts the points and adds its two borders; a non-zero
 * fill is constant on its side of them. Reflect and edge fold indices. */
static int rule_pad(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  if (param(n, "mode", 0) != 0) return RULE_DECLINE;
  const Shape *x = in_shape(g, n, 0);
  int rc = TEQ_OK;
  for (int i = 0; i < out->ndim && !rc; i++) {
    int64_t b = param(n, "pads", i);
    rc = copy(out, i, in[0], i, b);
    if (!rc) rc = add(out, i, b);
    if (!rc) rc = add(out, i, b + x->d[i]);
  }
  return rc;
}

/* Output i reads start + i*step: an input split q falls where that
 * crosses q. */
static int rule_slice(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  (void)g;
  int rc = TEQ_OK;
  for (int i = 0; i < out->ndim && !rc; i++) {
    int64_t start = param(n, "starts", i), step = param(n, "steps", i);
    for (int j = 0; j < in[0]->n_points[i] && !rc; j++) {
      int64_t q = in[0]->points[i][j];
      rc = add(out, i, step > 0 ? ceil_div(q - start, step) : floor_div(start - q, -step) + 1);
    }
  }
  return rc;
}

static int rule_transpose(const Graph *g, const Node *n, const PetBoxes *const *in,
                          PetBoxes *out) {
  (void)g;
  const ParamValue *p = &n->params.v[param_index(OP_TRANSPOSE, "perm")];
  int r = out->ndim, rc = TEQ_OK;
  for (int i = 0; i < r && !rc; i++) rc = copy(out, i, in[0], (int)(p->n ? p->i[i] : r - 1 - i), 0);
  return rc;
}

/* One factor group of a reshape: input dimensions [ia, ib) hold as many
 * elements as output dimensions [ja, jb). Merging dimensions is affine only
 * inside one row of the innermost, so every row start is a split of the
 * flat index; splitting the flat index into dimensions turns a flat split q
 * (digits c) into c and c+1 on every digit before the last non-zero one and
 * c on that one: a grid that separates the positions below q from the rest. */
static int reshape_group(const PetBoxes *x, int ia, int ib, PetBoxes *out, int ja, int jb) {
  int din[TEQ_MAX_DIMS], dout[TEQ_MAX_DIMS], ni = 0, no = 0, rc = TEQ_OK;
  int64_t total = 1;
  for (int i = ia; i < ib; i++) {
    total *= x->extent[i];
    if (x->extent[i] > 1) din[ni++] = i;
  }
  for (int j = ja; j < jb; j++)
    if (out->extent[j] > 1) dout[no++] = j;
  if (ni == 0 || no == 0) return TEQ_OK;
  if (ni == 1 && no == 1) return copy(out, dout[0], x, din[0], 0);
  int64_t *flat = NULL;
  int32_t nf = 0, cap = 0;
  int kin = din[ni - 1];
  int64_t a = x->extent[kin], rows = ni == 1 ? 1 : total / a;
  if (rows * (x->n_points[kin] + 1) > MERGE_POINTS_MAX) return RULE_DECLINE;
  for (int64_t row = 0; row < rows && !rc; row++) {
    if (row) rc = push(&flat, &nf, &cap, row * a);
    for (int32_t i = 0; i < x->n_points[kin] && !rc; i++)
      rc = push(&flat, &nf, &cap, row * a + x->points[kin][i]);
  }
  for (int32_t f = 0; f < nf && !rc; f++) {
    int64_t q = flat[f], c[TEQ_MAX_DIMS];
    int last = 0;
    for (int l = no - 1; l >= 0; l--) {
      c[l] = q % out->extent[dout[l]];
      q /= out->extent[dout[l]];
    }
    for (int l = 0; l < no; l++)
      if (c[l]) last = l;
    for (int l = 0; l < last && !rc; l++) {
      rc = add(out, dout[l], c[l]);
      if (!rc) rc = add(out, dout[l], c[l] + 1);
    }
    if (!rc) rc = add(out, dout[last], c[last]);
  }
  free(flat);
  return rc;
}

static int rule_reshape(const Graph *g, const Node *n, const PetBoxes *const *in, PetBoxes *out) {
  const Shape *x = in_shape(g, n, 0);
  int i = 0, j = 0, rc = TEQ_OK;
  if (shape_numel(x) == 0) return RULE_DECLINE;
  while ((i < x->ndim || j < out->ndim) && !rc) {
    int ia = i, ja = j;
    int64_t pi = i < x->ndim ? x->d[i++] : 1, pj = j < out->ndim ? out->extent[j++] : 1;
    while (pi != pj) {
      if (pi < pj && i < x->ndim) pi *= x->d[i++];
      else if (pj < pi && j < out->ndim) pj *= out->extent[j++];
      else return RULE_DECLINE;
    }
    rc = reshape_group(in[0], ia, i, out, ja, j);
  }
  return rc;
}

/* How a node's degree follows from its inputs': graph inputs are the
 * variables, weights are constants, products add degrees, sums and moves
 * keep the largest. */
enum { DEG_MAX, DEG_SUM, DEG_INPUT, DEG_CONST };

typedef struct BoxRow {
  BoxRule rule;
  int degree;
} BoxRow;

/* Every row holds for the plain operator (no fused activation); the rules
 * check the parameters that would make it non-linear or non-affine. */
static const BoxRow rows[OP__COUNT] = {
  [OP_INPUT] = {rule_none, DEG_INPUT},
  [OP_CONST] = {rule_const, DEG_CONST},
  [OP_IDENTITY] = {rule_identity, DEG_MAX},
  [OP_EWADD] = {rule_elementwise, DEG_MAX},
  [OP_SUB] = {rule_elementwise, DEG_MAX},
  [OP_EWMUL] = {rule_elementwise, DEG_SUM},
  [OP_SMUL] = {rule_identity, DEG_SUM},
  [OP_CONV2D] = {rule_conv2d, DEG_SUM},
  [OP_MATMUL] = {rule_matmul, DEG_SUM},
  [OP_CONCAT] = {rule_concat, DEG_MAX},
  [OP_SPLIT] = {rule_split, DEG_MAX},
  [OP_PAD] = {rule_pad, DEG_MAX},
  [OP_SLICE] = {rule_slice, DEG_MAX},
  [OP_TRANSPOSE] = {rule_transpose, DEG_MAX},
  [OP_RESHAPE] = {rule_reshape, DEG_MAX},
};

/* ---- propagation ---- */

typedef struct Flow {
  int32_t *offset;  /* tensor (node, out) is offset[node] + out */
  PetBoxes *t;
  int *degree;      /* per tensor; -1 unknown */
} Flow;

static void flow_fini(Flow *f, int n_tensors) {
  for (int i = 0; f->t && i < n_tensors; i++) pet_boxes_fini(&f->t[i]);
  free(f->t);
  free(f->offset);
  free(f->degree);
}

static int node_degree(const BoxRow *row, const Node *n, const Flow *f, bool declined) {
  if (!row->rule || declined) return -1;
  if (row->degree == DEG_INPUT) return 1;
  if (row->degree == DEG_CONST) return 0;
  int deg = 0;
  for (int i = 0; i < n->n_in; i++) {
    int di = f->degree[f->offset[n->in[i].node] + n->in[i].out];
    if (di < 0) return -1;
    deg = row->degree == DEG_SUM ? deg + di : (di > deg ? di : deg);
  }
  return deg;
}

/* The boxes of one node's outputs from its inputs'. */
static int flow_node(const Graph *g, int id, Flow *f) {
  const Node *n = &g->nodes[id];
  const BoxRow *row = &rows[n->kind];
  PetBoxes *out = &f->t[f->offset[id]];
  const PetBoxes *in[64];
  char label[GRAPH_LABEL_MAX], why[160];
  const char *inherited = NULL;
  for (int k = 0; k < n->n_out; k++) boxes_init(&out[k], &n->out[k]);
  if (n->n_in > 64) return TEQ_ERR_UNSUPPORTED;
  for (int i = 0; i < n->n_in; i++) {
    in[i] = &f->t[f->offset[n->in[i].node] + n->in[i].out];
    if (in[i]->is_whole && !inherited) inherited = in[i]->why;
  }
  int rc = RULE_DECLINE;
  for (int k = 0; k < n->n_out; k++)
    if (out[k].is_whole && !inherited) inherited = "an output of unknown shape";
  if (!inherited && row->rule) rc = row->rule(g, n, in, out);
  if (rc < 0) return rc;
  if (inherited) snprintf(why, sizeof why, "%s", inherited);
  else if (rc == RULE_DECLINE)
    snprintf(why, sizeof why, "%s %s", graph_node_label(g, id, label, sizeof label),
             row->rule ? "has parameters outside the box analysis"
                       : "is not an operator the box analysis knows");
  for (int k = 0; k < n->n_out; k++) {
    if (inherited || rc == RULE_DECLINE) make_whole(&out[k], why);
    normalize(&out[k]);
    f->degree[f->offset[id] + k] = node_degree(row, n, f, rc == RULE_DECLINE);
  }
  return TEQ_OK;
}

static int flow_run(const Graph *g, Flow *f, int *n_tensors, Diag *d) {
  memset(f, 0, sizeof *f);
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  f->offset = malloc(((size_t)g->n_nodes + 1) * sizeof *f->offset);
  int rc = order && f->offset ? TEQ_OK : TEQ_ERR_NOMEM;
  *n_tensors = 0;
  for (int i = 0; i < g->n_nodes && !rc; i++) {
    f->offset[i] = *n_tensors;
    *n_tensors += g->nodes[i].n_out;
  }
  if (!rc) {
    f->t = calloc((size_t)*n_tensors + 1, sizeof *f->t);
    f->degree = calloc((size_t)*n_tensors + 1, sizeof *f->degree);
    if (!f->t || !f->degree) rc = TEQ_ERR_NOMEM;
  }
  if (!rc && graph_topo_order(g, order)) rc = diag_error(d, "pet: the graph has a cycle");
  for (int i = 0; i < g->n_nodes && !rc; i++) rc = flow_node(g, order[i], f);
  if (rc == TEQ_ERR_NOMEM) diag_error(d, "pet: out of memory in box propagation");
  else if (rc == TEQ_ERR_UNSUPPORTED) diag_error(d, "pet: a node has more than 64 inputs");
  free(order);
  return rc;
}

static int take(PetBoxes *dst, PetBoxes *src) {
  *dst = *src;
  memset(src, 0, sizeof *src);
  return TEQ_OK;
}

int pet_boxes(const Graph *g, int output, PetBoxes *out, Diag *d) {
  if (output < 0 || output >= g->n_outputs)
    return diag_error(d, "pet: output %d: the graph has %d outputs", output, g->n_outputs);
  Flow f;
  int nt = 0, rc = flow_run(g, &f, &nt, d);
  if (!rc) {
    TensorRef r = g->outputs[output];
    rc = take(out, &f.t[f.offset[r.node] + r.out]);
  }
  flow_fini(&f, nt);
  return rc;
}

int pet_degree(const Graph *g) {
  Flow f;
  int nt = 0, deg = 0;
  if (flow_run(g, &f, &nt, NULL)) deg = -1;
  for (int j = 0; j < g->n_outputs && deg >= 0; j++) {
    int dj = f.degree[f.offset[g->outputs[j].node] + g->outputs[j].out];
    deg = dj < 0 ? -1 : dj > deg ? dj : deg;
  }
  flow_fini(&f, nt);
  return deg;
}

/* ---- boxes as a grid ---- */

int pet_boxes_refine(const PetBoxes *a, const PetBoxes *b, PetBoxes *out, Diag *d) {
  bool same = a->ndim == b->ndim;
  for (int k = 0; k < a->ndim && same; k++) same = a->extent[k] == b->extent[k];
  if (!same) return diag_error(d, "pet: boxes of tensors of different shapes");
  memset(out, 0, sizeof *out);
  out->ndim = a->ndim;
  memcpy(out->extent, a->extent, sizeof out->extent);
  if (a->is_whole || b->is_whole) {
    make_whole(out, a->is_whole ? a->why : b->why);
    return TEQ_OK;
  }
  int rc = TEQ_OK;
  for (int k = 0; k < a->ndim && !rc; k++) {
    rc = copy(out, k, a, k, 0);
    if (!rc) rc = copy(out, k, b, k, 0);
  }
  if (rc) {
    pet_boxes_fini(out);
    diag_error(d, "pet: out of memory");
    return rc;
  }
  normalize(out);
  return TEQ_OK;
}

int64_t pet_boxes_count(const PetBoxes *b) {
  int64_t n = 1;
  for (int k = 0; k < b->ndim && !b->is_whole; k++) n *= b->n_points[k] + 1;
  return n;
}

void pet_box_bounds(const PetBoxes *b, int64_t index, int64_t *lo, int64_t *hi) {
  for (int k = b->ndim - 1; k >= 0; k--) {
    int32_t np = b->is_whole ? 0 : b->n_points[k];
    int64_t i = index % (np + 1);
    index /= np + 1;
    lo[k] = i == 0 ? 0 : b->points[k][i - 1];
    hi[k] = i == np ? b->extent[k] : b->points[k][i];
  }
}

void pet_boxes_print(const PetBoxes *b, FILE *f) {
  if (b->is_whole) {
    fprintf(f, "one box (%s)", b->why);
    return;
  }
  for (int k = 0; k < b->ndim; k++) {
    fprintf(f, "%sdim %d {", k ? "; " : "", k);
    for (int i = 0; i < b->n_points[k]; i++)
      fprintf(f, "%s%lld", i ? ", " : "", (long long)b->points[k][i]);
    fputc('}', f);
  }
}
