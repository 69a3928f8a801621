/* correct.c: PET's correction kernels (section 5.2, step 3): the mutant,
 * with every box where it differs from the original recomputed by the
 * original's operators.
 *
 * A region of an original tensor is rebuilt backwards: each operator in
 * rows[] (keyed by OpKind, the per-operator knowledge of this file) says
 * which region of each input it reads and how to run itself on just that
 * (a conv reads rows lo*stride - pad to (hi-1)*stride - pad + the dilated
 * kernel extent, clipped to the input, and gets the clipped part back as its
 * own pads; a pad shrinks its pads; a concat keeps the inputs the region
 * overlaps). Inputs and weights are cut with slice. Regions are memoized,
 * so a shared subexpression is rebuilt once per region.
 *
 * Writing regions into the mutant's output M uses slice and concat only:
 * along dimension 0 the box grid's intervals are walked in order and runs
 * of intervals whose whole slab is equal (or whole slab differs) are
 * merged, and so are runs of mixed slabs that differ in the same cells of
 * the later dimensions (a seam column crossing the rows' intervals is one
 * region, one correction); an equal slab is a slice of M, a differing slab
 * is recomputed, and a mixed one is split the same way along the next
 * dimension. The
 * pieces of each level are concatenated back along its dimension, so the
 * result has M's shape and differs from M exactly on the differing boxes.
 * The mutant is copied node by node into a new graph first (the graph API
 * can add an output but not re-point one). */
#include <stdlib.h>
#include <string.h>

#include "optimize/pet/pet.h"

typedef struct Region {
  int nd;
  int64_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS];
} Region;

typedef struct Memo {
  TensorRef src; /* in the original */
  Region r;
  TensorRef ref; /* in the corrected graph */
} Memo;

typedef struct Fix {
  const Graph *orig;
  Graph *g;        /* the corrected graph */
  Memo *memo;
  int32_t n_memo, cap_memo;
  PetRegions regions;
  int32_t cap_regions;
  Diag *d;
} Fix;

typedef int (*FixRule)(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res);

static int build(Fix *fx, TensorRef src, const Region *r, TensorRef *res);

/* ---- helpers ---- */

static Region region_full(const Shape *s) {
  Region r = {.nd = s->ndim};
  for (int k = 0; k < s->ndim; k++) r.hi[k] = s->d[k];
  return r;
}

static bool region_is_full(const Region *r, const Shape *s) {
  for (int k = 0; k < r->nd; k++)
    if (r->lo[k] != 0 || r->hi[k] != s->d[k]) return false;
  return true;
}

static const Shape *orig_in(const Fix *fx, const Node *n, int i) {
  return graph_shape(fx->orig, n->in[i]);
}

static int64_t param(const Node *n, const char *name, int i) {
  return n->params.v[param_index(n->kind, name)].i[i];
}

static int add_node(Fix *fx, OpKind kind, const TensorRef *in, int n_in, const Params *p,
                    TensorRef *res) {
  int id = graph_add_node(fx->g, kind, in, n_in, 1, p, NULL, fx->d);
  if (id < 0) return id;
  *res = (TensorRef){id, 0};
  return TEQ_OK;
}

/* Region r of tensor t of the corrected graph (t itself when r is all of it). */
static int slice_of(Fix *fx, TensorRef t, const Region *r, TensorRef *res) {
  if (region_is_full(r, graph_shape(fx->g, t))) {
    *res = t;
    return TEQ_OK;
  }
  Params p;
  int64_t one[TEQ_MAX_DIMS] = {1, 1, 1, 1, 1, 1};
  params_default(OP_SLICE, &p);
  param_set_ints(&p, param_index(OP_SLICE, "starts"), r->lo, r->nd);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), r->hi, r->nd);
  param_set_ints(&p, param_index(OP_SLICE, "steps"), one, r->nd);
  return add_node(fx, OP_SLICE, &t, 1, &p, res);
}

/* Input i of n over region r. */
static int build_in(Fix *fx, const Node *n, int i, const Region *r, TensorRef *res) {
  return build(fx, n->in[i], r, res);
}

/* ---- the rules ---- */

static int fix_input(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  int id = (int)(n - fx->orig->nodes);
  for (int k = 0; k < fx->orig->n_inputs; k++)
    if (fx->orig->inputs[k] == id) return slice_of(fx, (TensorRef){fx->g->inputs[k], 0}, r, res);
  return diag_error(fx->d, "pet: input node %d is not a graph input", id);
}

static int fix_const(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  if (!region_is_full(r, &n->out[0])) {
    Region full = region_full(&n->out[0]);
    TensorRef whole;
    int rc = build(fx, (TensorRef){(int32_t)(n - fx->orig->nodes), out}, &full, &whole);
    return rc ? rc : slice_of(fx, whole, r, res);
  }
  int id = graph_add_const(fx->g, n->name, tensor_ref(n->value), fx->d);
  if (id < 0) return id;
  *res = (TensorRef){id, 0};
  return TEQ_OK;
}

static int fix_identity(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  return build_in(fx, n, 0, r, res);
}

/* Rows of the receptive field along one spatial axis, with the part that
 * falls outside the input returned as pads. */
static int conv_window(Fix *fx, const Node *n, int a, const Region *r, Region *rx, int64_t *pads) {
  const Shape *x = orig_in(fx, n, 0), *w = orig_in(fx, n, 1);
  int64_t s = param(n, "stride", a), dl = param(n, "dilation", a), pad = param(n, "pads", a);
  int64_t lo = r->lo[2 + a] * s - pad, hi = (r->hi[2 + a] - 1) * s - pad + (w->d[2 + a] - 1) * dl + 1;
  int64_t clo = lo > 0 ? lo : 0, chi = hi < x->d[2 + a] ? hi : x->d[2 + a];
  if (chi <= clo)
    return diag_error(fx->d, "pet: a corrected region of a conv2d reads only its padding");
  rx->lo[2 + a] = clo, rx->hi[2 + a] = chi;
  pads[a] = clo - lo, pads[a + 2] = hi - chi;
  return TEQ_OK;
}

/* Output channels [m0, m1) need the weights [m0, m1) and the input
 * channels of their groups; a region spanning several groups computes the
 * whole groups and slices the channels it wants. */
static int fix_conv2d(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  const Shape *x = orig_in(fx, n, 0), *w = orig_in(fx, n, 1);
  int64_t groups = param(n, "groups", 0), mg = w->d[0] / groups, cg = x->d[1] / groups;
  int64_t g0 = r->lo[1] / mg, g1 = (r->hi[1] - 1) / mg + 1, m0 = r->lo[1], m1 = r->hi[1];
  int64_t c0 = groups == 1 ? 0 : g0 * cg, c1 = groups == 1 ? x->d[1] : g0 * cg + cg, ng = 1;
  if (groups > 1 && g1 > g0 + 1) m0 = g0 * mg, m1 = g1 * mg, c1 = g1 * cg, ng = g1 - g0;
  Region rx = region_full(x), rw = region_full(w), rb = {.nd = 1, .lo = {m0}, .hi = {m1}};
  int64_t pads[4];
  rx.lo[0] = r->lo[0], rx.hi[0] = r->hi[0], rx.lo[1] = c0, rx.hi[1] = c1;
  rw.lo[0] = m0, rw.hi[0] = m1;
  TensorRef in[3];
  int rc = conv_window(fx, n, 0, r, &rx, pads);
  if (!rc) rc = conv_window(fx, n, 1, r, &rx, pads);
  if (!rc) rc = build_in(fx, n, 0, &rx, &in[0]);
  if (!rc) rc = build_in(fx, n, 1, &rw, &in[1]);
  if (!rc && n->n_in > 2) rc = build_in(fx, n, 2, &rb, &in[2]);
  if (rc) return rc;
  Params p = n->params;
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), pads, 4);
  param_set_int(&p, param_index(OP_CONV2D, "groups"), ng);
  TensorRef y;
  if ((rc = add_node(fx, OP_CONV2D, in, n->n_in, &p, &y))) return rc;
  Region keep = region_full(graph_shape(fx->g, y));
  keep.lo[1] = r->lo[1] - m0, keep.hi[1] = r->hi[1] - m0;
  return slice_of(fx, y, &keep, res);
}

/* Input region for an output region through numpy broadcasting: a
 * broadcast (extent 1) dimension is read whole, and so is every dimension
 * that aligns with an output dimension at or past `upto` (a matmul's K). */
static Region broadcast_region(const Shape *s, const Region *r, int upto) {
  Region ri = region_full(s);
  int shift = r->nd - s->ndim;
  for (int k = 0; k < s->ndim; k++) {
    int i = k + shift;
    if (i >= 0 && i < upto && s->d[k] != 1) ri.lo[k] = r->lo[i], ri.hi[k] = r->hi[i];
  }
  return ri;
}

static int fix_elementwise(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  TensorRef in[2];
  for (int i = 0; i < n->n_in; i++) {
    const Shape *s = orig_in(fx, n, i);
    Region ri = n->kind == OP_SMUL && i == 1 ? region_full(s) : broadcast_region(s, r, r->nd);
    int rc = build_in(fx, n, i, &ri, &in[i]);
    if (rc) return rc;
  }
  return add_node(fx, n->kind, in, n->n_in, &n->params, res);
}

/* Rows of A, columns of B, batch entries of both; K whole. */
static int fix_matmul(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  const Shape *a = orig_in(fx, n, 0), *b = orig_in(fx, n, 1);
  if (a->ndim < 2 || b->ndim < 2)
    return diag_error(fx->d, "pet: cannot correct a region of a matmul with a 1-D operand");
  Region ra = broadcast_region(a, r, r->nd - 2), rb = broadcast_region(b, r, r->nd - 2);
  ra.lo[a->ndim - 2] = r->lo[r->nd - 2], ra.hi[a->ndim - 2] = r->hi[r->nd - 2];
  rb.lo[b->ndim - 1] = r->lo[r->nd - 1], rb.hi[b->ndim - 1] = r->hi[r->nd - 1];
  TensorRef in[2];
  int rc = build_in(fx, n, 0, &ra, &in[0]);
  if (!rc) rc = build_in(fx, n, 1, &rb, &in[1]);
  return rc ? rc : add_node(fx, OP_MATMUL, in, 2, &n->params, res);
}

static int fix_concat(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  int axis = (int)param(n, "axis", 0), np = 0;
  TensorRef *pieces = malloc((size_t)n->n_in * sizeof *pieces);
  int64_t off = 0;
  int rc = pieces ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int k = 0; k < n->n_in && !rc; k++) {
    int64_t len = orig_in(fx, n, k)->d[axis];
    int64_t lo = r->lo[axis] > off ? r->lo[axis] : off, hi = r->hi[axis] < off + len ? r->hi[axis] : off + len;
    if (lo < hi) {
      Region rk = *r;
      rk.lo[axis] = lo - off, rk.hi[axis] = hi - off;
      rc = build_in(fx, n, k, &rk, &pieces[np++]);
    }
    off += len;
  }
  if (!rc && np == 1) *res = pieces[0];
  else if (!rc) rc = add_node(fx, OP_CONCAT, pieces, np, &n->params, res);
  free(pieces);
  return rc;
}

/* Output k of a split is a region of its input: no split node needed. */
static int fix_split(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  int axis = (int)param(n, "axis", 0);
  int64_t off = 0;
  for (int k = 0; k < out; k++) off += n->out[k].d[axis];
  Region ri = *r;
  ri.lo[axis] += off, ri.hi[axis] += off;
  return build_in(fx, n, 0, &ri, res);
}

/* The input part the region overlaps, padded by what it does not; a
 * region entirely in the padding is a constant of the fill value. */
static int fix_pad(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  if (param(n, "mode", 0) != 0)
    return diag_error(fx->d, "pet: cannot correct a region of a reflect or edge pad");
  const Shape *x = orig_in(fx, n, 0);
  Region ri = {.nd = r->nd};
  int64_t pads[2 * TEQ_MAX_DIMS];
  bool empty = false, padded = false;
  for (int k = 0; k < r->nd; k++) {
    int64_t b = param(n, "pads", k), lo = r->lo[k] - b, hi = r->hi[k] - b;
    ri.lo[k] = lo > 0 ? lo : 0, ri.hi[k] = hi < x->d[k] ? hi : x->d[k];
    empty = empty || ri.hi[k] <= ri.lo[k];
    pads[k] = ri.lo[k] - lo, pads[r->nd + k] = hi - ri.hi[k];
    padded = padded || pads[k] || pads[r->nd + k];
  }
  double value = n->params.v[param_index(OP_PAD, "value")].f;
  if (empty) {
    Shape s = {.ndim = r->nd};
    for (int k = 0; k < r->nd; k++) s.d[k] = r->hi[k] - r->lo[k];
    Tensor *t = tensor_new(DT_F32, &s);
    if (!t) return TEQ_ERR_NOMEM;
    for (int64_t i = 0; i < tensor_numel(t); i++) ((float *)t->data)[i] = (float)value;
    int id = graph_add_const(fx->g, NULL, t, fx->d);
    if (id < 0) return id;
    *res = (TensorRef){id, 0};
    return TEQ_OK;
  }
  TensorRef in;
  int rc = build_in(fx, n, 0, &ri, &in);
  if (rc || !padded) {
    *res = in;
    return rc;
  }
  Params p = n->params;
  param_set_ints(&p, param_index(OP_PAD, "pads"), pads, 2 * r->nd);
  return add_node(fx, OP_PAD, &in, 1, &p, res);
}

/* Output i reads start + i*step: the input rows between the region's first
 * and last, stepped through again. */
static int fix_slice(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  Region ri = {.nd = r->nd};
  int64_t starts[TEQ_MAX_DIMS], ends[TEQ_MAX_DIMS], steps[TEQ_MAX_DIMS];
  bool unit = true;
  for (int k = 0; k < r->nd; k++) {
    int64_t start = param(n, "starts", k), st = param(n, "steps", k);
    int64_t first = start + r->lo[k] * st, last = start + (r->hi[k] - 1) * st;
    ri.lo[k] = st > 0 ? first : last, ri.hi[k] = (st > 0 ? last : first) + 1;
    starts[k] = st > 0 ? 0 : ri.hi[k] - ri.lo[k] - 1;
    ends[k] = st > 0 ? ri.hi[k] - ri.lo[k] : -1;
    steps[k] = st;
    unit = unit && st == 1;
  }
  TensorRef in;
  int rc = build_in(fx, n, 0, &ri, &in);
  if (rc || unit) {
    *res = in;
    return rc;
  }
  Params p = n->params;
  param_set_ints(&p, param_index(OP_SLICE, "starts"), starts, r->nd);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), ends, r->nd);
  param_set_ints(&p, param_index(OP_SLICE, "steps"), steps, r->nd);
  return add_node(fx, OP_SLICE, &in, 1, &p, res);
}

static int fix_transpose(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  const ParamValue *perm = &n->params.v[param_index(OP_TRANSPOSE, "perm")];
  Region ri = {.nd = r->nd};
  for (int i = 0; i < r->nd; i++) {
    int k = (int)(perm->n ? perm->i[i] : r->nd - 1 - i);
    ri.lo[k] = r->lo[i], ri.hi[k] = r->hi[i];
  }
  TensorRef in;
  int rc = build_in(fx, n, 0, &ri, &in);
  return rc ? rc : add_node(fx, OP_TRANSPOSE, &in, 1, &n->params, res);
}

/* The whole input, reshaped, then sliced: a region of a reshape is not in
 * general a box of its input. */
static int fix_reshape(Fix *fx, const Node *n, int out, const Region *r, TensorRef *res) {
  (void)out;
  Region full = region_full(orig_in(fx, n, 0));
  TensorRef in, y;
  int rc = build_in(fx, n, 0, &full, &in);
  if (!rc) rc = add_node(fx, OP_RESHAPE, &in, 1, &n->params, &y);
  return rc ? rc : slice_of(fx, y, r, res);
}

/* What each operator reads for a region of its output, and how it is run
 * on that; an operator without a row is refused. */
static const FixRule rows[OP__COUNT] = {
  [OP_INPUT] = fix_input,
  [OP_CONST] = fix_const,
  [OP_IDENTITY] = fix_identity,
  [OP_EWADD] = fix_elementwise,
  [OP_SUB] = fix_elementwise,
  [OP_EWMUL] = fix_elementwise,
  [OP_SMUL] = fix_elementwise,
  [OP_CONV2D] = fix_conv2d,
  [OP_MATMUL] = fix_matmul,
  [OP_CONCAT] = fix_concat,
  [OP_SPLIT] = fix_split,
  [OP_PAD] = fix_pad,
  [OP_SLICE] = fix_slice,
  [OP_TRANSPOSE] = fix_transpose,
  [OP_RESHAPE] = fix_reshape,
};

/* Region r of original tensor src, in the corrected graph. A whole output
 * of a single-output operator is the operator itself on whole inputs. */
static int build(Fix *fx, TensorRef src, const Region *r, TensorRef *res) {
  for (int32_t i = 0; i < fx->n_memo; i++) {
    const Memo *m = &fx->memo[i];
    if (m->src.node == src.node && m->src.out == src.out && !memcmp(&m->r, r, sizeof *r)) {
      *res = m->ref;
      return TEQ_OK;
    }
  }
  const Node *n = &fx->orig->nodes[src.node];
  char label[GRAPH_LABEL_MAX];
  if (!rows[n->kind]) {
    diag_error(fx->d, "pet: cannot correct: %s is not an operator the correction can rebuild "
               "on a region", graph_node_label(fx->orig, src.node, label, sizeof label));
    return TEQ_ERR_UNSUPPORTED;
  }
  int rc;
  bool plain = n->n_out == 1 && !(op_def(n->kind)->flags & OPF_SOURCE) &&
               region_is_full(r, &n->out[0]);
  if (plain) {
    TensorRef in[64];
    if (n->n_in > 64) return diag_error(fx->d, "pet: a node has more than 64 inputs");
    rc = TEQ_OK;
    for (int i = 0; i < n->n_in && !rc; i++) {
      Region full = region_full(orig_in(fx, n, i));
      rc = build_in(fx, n, i, &full, &in[i]);
    }
    if (!rc) rc = add_node(fx, n->kind, in, n->n_in, &n->params, res);
  } else {
    rc = rows[n->kind](fx, n, src.out, r, res);
  }
  if (rc) return rc;
  if (fx->n_memo == fx->cap_memo) {
    int32_t cap = fx->cap_memo ? 2 * fx->cap_memo : 16;
    Memo *m = realloc(fx->memo, (size_t)cap * sizeof *m);
    if (!m) return TEQ_ERR_NOMEM;
    fx->memo = m, fx->cap_memo = cap;
  }
  fx->memo[fx->n_memo++] = (Memo){src, *r, *res};
  return TEQ_OK;
}

/* ---- splicing into the mutant's output ---- */

typedef struct Grid {
  const PetOutputReport *o;
  int output;
  TensorRef orig_out, mut_out;
  int32_t count[TEQ_MAX_DIMS]; /* intervals per dimension */
} Grid;

enum { CELLS_EQUAL = 1, CELLS_DIFFER = 2, CELLS_MIXED = 3 };

/* Which kinds of cells lie in interval ranges [ilo, ihi) of dimensions
 * 0..dim, every interval of the later ones. */
static int classify(const Grid *gr, int dim, const int32_t *ilo, const int32_t *ihi) {
  int nd = gr->o->boxes.ndim, seen = 0;
  int32_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS], v[TEQ_MAX_DIMS];
  for (int k = 0; k < nd; k++) {
    lo[k] = k <= dim ? ilo[k] : 0, hi[k] = k <= dim ? ihi[k] : gr->count[k];
    v[k] = lo[k];
  }
  for (;;) {
    int64_t box = 0;
    for (int k = 0; k < nd; k++) box = box * gr->count[k] + v[k];
    seen |= gr->o->differs[box] ? CELLS_DIFFER : CELLS_EQUAL;
    if (seen == CELLS_MIXED) return seen;
    int k = nd - 1;
    while (k >= 0 && ++v[k] == hi[k]) v[k] = lo[k], k--;
    if (k < 0) return seen;
  }
}

/* Whether intervals i and j of dimension dim hold the same pattern of
 * differing cells over ranges [ilo, ihi) of the earlier dimensions and
 * all of the later ones. */
static bool same_pattern(const Grid *gr, int dim, const int32_t *ilo, const int32_t *ihi,
                         int32_t i, int32_t j) {
  int nd = gr->o->boxes.ndim;
  int32_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS], v[TEQ_MAX_DIMS];
  for (int k = 0; k < nd; k++) {
    lo[k] = k < dim ? ilo[k] : 0, hi[k] = k < dim ? ihi[k] : gr->count[k];
    if (k == dim) lo[k] = 0, hi[k] = 1;
    v[k] = lo[k];
  }
  for (;;) {
    int64_t a = 0, b = 0;
    for (int k = 0; k < nd; k++) {
      a = a * gr->count[k] + (k == dim ? i : v[k]);
      b = b * gr->count[k] + (k == dim ? j : v[k]);
    }
    if (gr->o->differs[a] != gr->o->differs[b]) return false;
    int k = nd - 1;
    while (k >= 0 && ++v[k] == hi[k]) v[k] = lo[k], k--;
    if (k < 0) return true;
  }
}

/* Positions of interval ranges [ilo, ihi) on dimensions 0..dim, all of
 * the later ones. */
static Region cells_region(const Grid *gr, int dim, const int32_t *ilo, const int32_t *ihi) {
  const PetBoxes *b = &gr->o->boxes;
  Region r = {.nd = b->ndim};
  for (int k = 0; k < b->ndim; k++) {
    int32_t a = k <= dim ? ilo[k] : 0, e = k <= dim ? ihi[k] : gr->count[k];
    r.lo[k] = a == 0 ? 0 : b->points[k][a - 1];
    r.hi[k] = e == gr->count[k] ? b->extent[k] : b->points[k][e - 1];
  }
  return r;
}

static int record(Fix *fx, int output, const Region *r) {
  if (fx->regions.n == fx->cap_regions) {
    int32_t cap = fx->cap_regions ? 2 * fx->cap_regions : 8;
    PetRegion *v = realloc(fx->regions.v, (size_t)cap * sizeof *v);
    if (!v) return TEQ_ERR_NOMEM;
    fx->regions.v = v, fx->cap_regions = cap;
  }
  PetRegion *p = &fx->regions.v[fx->regions.n++];
  memset(p, 0, sizeof *p);
  p->output = output, p->ndim = r->nd;
  memcpy(p->lo, r->lo, sizeof p->lo);
  memcpy(p->hi, r->hi, sizeof p->hi);
  return TEQ_OK;
}

static int assemble(Fix *fx, const Grid *gr, int dim, int32_t *ilo, int32_t *ihi, TensorRef *res) {
  int32_t n = gr->count[dim], np = 0;
  TensorRef *pieces = malloc((size_t)n * sizeof *pieces);
  int rc = pieces ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int32_t i = 0; i < n && !rc;) {
    ilo[dim] = i, ihi[dim] = i + 1;
    int cls = classify(gr, dim, ilo, ihi);
    int32_t j = i + 1;
    for (; j < n; j++) {
      ilo[dim] = j, ihi[dim] = j + 1;
      if (classify(gr, dim, ilo, ihi) != cls ||
          (cls == CELLS_MIXED && !same_pattern(gr, dim, ilo, ihi, i, j)))
        break;
    }
    ilo[dim] = i, ihi[dim] = j;
    Region r = cells_region(gr, dim, ilo, ihi);
    if (cls == CELLS_EQUAL) rc = slice_of(fx, gr->mut_out, &r, &pieces[np]);
    else if (cls == CELLS_DIFFER && !(rc = record(fx, gr->output, &r)))
      rc = build(fx, gr->orig_out, &r, &pieces[np]);
    else if (cls == CELLS_MIXED) rc = assemble(fx, gr, dim + 1, ilo, ihi, &pieces[np]);
    np++;
    i = j;
  }
  if (!rc && np == 1) *res = pieces[0];
  else if (!rc) {
    Params p;
    params_default(OP_CONCAT, &p);
    param_set_int(&p, param_index(OP_CONCAT, "axis"), dim);
    rc = add_node(fx, OP_CONCAT, pieces, np, &p, res);
  }
  free(pieces);
  return rc;
}

/* ---- the mutant, copied ---- */

static int copy_mutant(Fix *fx, const Graph *m, int32_t *map) {
  int32_t *order = malloc(((size_t)m->n_nodes + 1) * sizeof *order);
  int rc = order ? graph_topo_order(m, order) : TEQ_ERR_NOMEM;
  for (int i = 0; i < m->n_inputs && !rc; i++) {
    const Node *x = &m->nodes[m->inputs[i]];
    int id = graph_add_input(fx->g, x->name, &x->out[0], x->dtype, fx->d);
    rc = id < 0 ? id : TEQ_OK;
    map[m->inputs[i]] = id;
  }
  for (int k = 0; k < m->n_nodes && !rc; k++) {
    const Node *x = &m->nodes[order[k]];
    TensorRef in[64];
    int id;
    if (x->kind == OP_INPUT) continue;
    if (x->kind == OP_OPAQUE || x->n_in > 64) {
      diag_error(fx->d, "pet: cannot correct a mutant holding an opaque node or a node of more "
                 "than 64 inputs");
      rc = TEQ_ERR_UNSUPPORTED;
      break;
    }
    for (int i = 0; i < x->n_in; i++) in[i] = (TensorRef){map[x->in[i].node], x->in[i].out};
    if (x->kind == OP_CONST) id = graph_add_const(fx->g, x->name, tensor_ref(x->value), fx->d);
    else id = graph_add_node(fx->g, x->kind, in, x->n_in, x->n_out, &x->params, x->name, fx->d);
    rc = id < 0 ? id : TEQ_OK;
    map[order[k]] = id;
  }
  free(order);
  return rc;
}

static int check_report(const Graph *orig, const Graph *mutant, const PetReport *rep, Diag *d) {
  if (rep->n_outputs != orig->n_outputs || rep->n_outputs != mutant->n_outputs ||
      orig->n_inputs != mutant->n_inputs)
    return diag_error(d, "pet: the report has %d outputs; the original %d inputs and %d outputs, "
                      "the mutant %d and %d", rep->n_outputs, orig->n_inputs, orig->n_outputs,
                      mutant->n_inputs, mutant->n_outputs);
  for (int j = 0; j < rep->n_outputs; j++) {
    const PetBoxes *b = &rep->out[j].boxes;
    const Shape *s = graph_shape(orig, orig->outputs[j]), *t = graph_shape(mutant, mutant->outputs[j]);
    bool ok = b->ndim == s->ndim && shape_equal(s, t);
    for (int k = 0; k < b->ndim && ok; k++) ok = b->extent[k] == s->d[k];
    if (!ok) return diag_error(d, "pet: output %d: the report's boxes do not fit the graphs", j);
  }
  return TEQ_OK;
}

static int correct_output(Fix *fx, const Graph *orig, const Graph *mutant, const int32_t *map,
                          const PetReport *rep, int j) {
  const PetOutputReport *o = &rep->out[j];
  Grid gr = {.o = o, .output = j, .orig_out = orig->outputs[j]};
  gr.mut_out = (TensorRef){map[mutant->outputs[j].node], mutant->outputs[j].out};
  TensorRef res = gr.mut_out;
  int32_t ilo[TEQ_MAX_DIMS] = {0}, ihi[TEQ_MAX_DIMS] = {0};
  for (int k = 0; k < o->boxes.ndim; k++) gr.count[k] = o->boxes.is_whole ? 1 : o->boxes.n_points[k] + 1;
  int rc = TEQ_OK;
  if (o->n_differ && o->boxes.ndim == 0) {
    Region r = {.nd = 0};
    rc = record(fx, j, &r);
    if (!rc) rc = build(fx, gr.orig_out, &r, &res);
  } else if (o->n_differ) {
    rc = assemble(fx, &gr, 0, ilo, ihi, &res);
  }
  if (rc) return rc;
  int id = graph_add_output(fx->g, res, mutant->output_names ? mutant->output_names[j] : NULL, fx->d);
  return id < 0 ? id : TEQ_OK;
}

int pet_correct(const Graph *orig, const Graph *mutant, const PetReport *rep, Graph **corrected,
                PetRegions *regions, Diag *d) {
  int rc = check_report(orig, mutant, rep, d);
  if (rc) return rc;
  Fix fx = {.orig = orig, .g = graph_new(), .d = d};
  int32_t *map = malloc(((size_t)mutant->n_nodes + 1) * sizeof *map);
  rc = fx.g && map ? copy_mutant(&fx, mutant, map) : TEQ_ERR_NOMEM;
  for (int j = 0; j < rep->n_outputs && !rc; j++) rc = correct_output(&fx, orig, mutant, map, rep, j);
  if (!rc && graph_remove_dead(fx.g) < 0) rc = TEQ_ERR_NOMEM;
  if (!rc && (rc = graph_check(fx.g, d))) diag_error(d, "pet: the corrected graph is malformed");
  if (rc == TEQ_ERR_NOMEM) diag_error(d, "pet: out of memory");
  free(map);
  free(fx.memo);
  if (rc) {
    graph_free(fx.g);
    pet_regions_fini(&fx.regions);
    return rc;
  }
  *corrected = fx.g;
  if (regions) *regions = fx.regions;
  else pet_regions_fini(&fx.regions);
  return TEQ_OK;
}

int64_t pet_regions_elements(const PetRegions *r) {
  int64_t elems = 0;
  for (int i = 0; i < r->n; i++) {
    int64_t k = 1;
    for (int j = 0; j < r->v[i].ndim; j++) k *= r->v[i].hi[j] - r->v[i].lo[j];
    elems += k;
  }
  return elems;
}

void pet_regions_fini(PetRegions *r) {
  free(r->v);
  memset(r, 0, sizeof *r);
}
