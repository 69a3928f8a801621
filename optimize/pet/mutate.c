/* mutate.c: PET's mutation generator (OSDI'21, section 4, Algorithm 1).
 *
 * A depth-first search builds programs over the original's inputs one
 * PET-level operator at a time and keeps those whose outputs have the
 * original's shapes. Parameters are never enumerated blindly: they come from
 * the shapes at hand and from the original's own operators (its convs' pads,
 * strides and dilations, its outputs' extents), as PET's generator derives
 * its candidate operators from the subprogram it mutates. The operators:
 *   - layout: reshape, transpose, reshape fused into one (PET's "reshape &
 *     transpose"), in five forms: batch into H or W side by side (Fig. 1)
 *     and back, H and W phases into the batch (Fig. 3) and back, and
 *     space-to-depth after a zero pad (stride s -> stride 1), which applies
 *     to an input and a kernel alike; and a sixth made of pads and a
 *     concat: H or W cut into the batch in overlapping pieces (halos), so
 *     that a conv computes the seams a plain cut gets wrong (derive_halos);
 *   - conv2d with an original conv's parameters, or with its dilation or
 *     its stride folded away, or with the pads of a halo-cut axis zeroed;
 *     matmul where the original has one;
 *   - split of a result into the original's outputs;
 *   - concatenation of two of the original's data inputs along channels,
 *     where two independent convs of one shape can run as one grouped conv
 *     with twice the groups (section 6.1's merge of subprograms);
 *   - weight-only operators: centred zero-padding of a kernel to another's
 *     size, concatenation of kernels, space-to-depth of a kernel. They do
 *     not count in the depth (optimize folds them into constants), but a
 *     mutant holds at most MAX_WEIGHT_OPS of them.
 * Pruning follows PET's code: no layout of a layout's output (the fused
 * operator already covers it), no compute operator fed by another, no more
 * compute operators than the original, a complete mutant is not extended,
 * and a state reached again in another order is cut. Every mutant is then
 * tested with pet_compare; one that differs in every box of some output is
 * dropped (its correction would recompute that output whole), the others
 * keep their report. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "optimize/pet/pet.h"

enum {
  MAX_AVAIL = 40,      /* tensors one candidate can hold */
  MAX_WEIGHT_OPS = 2,  /* a kernel padded and concatenated is the most any family needs */
  MAX_PSETS = 16,
  MAX_FACTORS = 6,
  MAX_STRIDED = 4,
  MAX_HALOS = 8,
  DESC_MAX = PET_MUTANT_DESC_MAX,
  MAX_PATH = 32,       /* steps in one candidate */
};

/* The fused layouts on [N, C, H, W]. AX_H, AX_W select the axes. */
typedef enum LayoutKind { L_N2S, L_S2N, L_D2N, L_N2D, L_S2D, L_HALO } LayoutKind;
enum { AX_H = 1, AX_W = 2 };

typedef struct Layout {
  LayoutKind kind;
  int axes;
  int64_t f;
  int64_t pads[8]; /* L_S2D: ONNX pads applied first (negative crops) */
  int64_t lo, step, len; /* L_HALO: piece i is rows [i step, i step + len) of the axis
                            zero-padded by lo before it */
} Layout;

/* A tensor a candidate can use. */
typedef struct Avail {
  TensorRef ref;
  bool is_weight;  /* computed from weights alone */
  bool is_orig;    /* an input or constant of the original */
  bool is_layout;  /* a layout's or a data concat's result: not laid out again */
  bool computed;   /* a compute operator lies on its path */
  int halo;        /* L_HALO's result: the axis (AX_H, AX_W) cut with halos, else 0 */
  int uses;
} Avail;

/* An original conv's window along one axis, for cutting its input into
 * pieces with halos (L_HALO): each piece holds the rows its share of the
 * output reads, so the conv on the pieces, with no pads along that axis,
 * computes the original exactly. */
typedef struct Halo {
  Shape x;        /* its input */
  int axis;       /* AX_H or AX_W */
  int64_t reach;  /* (k - 1) dilation + 1: the rows one output reads */
  int64_t s, lo;  /* stride and leading pad along the axis */
  int64_t out;    /* output extent along it */
} Halo;

/* An original conv with stride > 1: what space-to-depth needs of it. */
typedef struct Strided {
  Shape x, w;     /* its input and kernel shapes */
  int64_t s;
  int64_t pt, pl; /* its top and left pads */
  Shape y;        /* its output */
} Strided;

typedef enum StepKind { S_LAYOUT, S_CONV, S_MATMUL, S_SPLIT, S_WPAD, S_WCONCAT, S_DCONCAT } StepKind;

typedef struct Step {
  StepKind kind;
  int a, b;          /* avail indices */
  Layout L;          /* S_LAYOUT */
  int pset;          /* S_CONV */
  int axis;          /* S_SPLIT, S_WCONCAT, S_DCONCAT */
  int64_t pads[8];   /* S_WPAD */
} Step;

typedef struct Cand {
  Graph *g;
  uint64_t hash;
  char desc[DESC_MAX];
} Cand;

typedef struct Gen {
  const Graph *orig;
  Diag *d;
  int depth, max_cands;
  int n_compute;          /* conv and matmul nodes in the original */
  bool has_conv, has_matmul;
  bool can_group;         /* two convs could run as one grouped conv (S_DCONCAT) */
  Params psets[MAX_PSETS];
  int pset_halo[MAX_PSETS]; /* an axis: the set exists for inputs cut with halos along it */
  int n_psets;
  int64_t factors[MAX_FACTORS];
  int n_factors;
  Strided strided[MAX_STRIDED];
  int n_strided;
  Halo halos[MAX_HALOS];
  int n_halos;
  uint64_t orig_hash;
  int n_base;             /* nodes of the original's inputs and constants */

  /* the candidate being built, in one graph: each step's nodes are added,
   * searched on from, and taken back (graph_truncate) */
  Avail av[MAX_AVAIL];
  int n_av, n_counted, n_weight_ops, n_comp;
  Step path[MAX_PATH];    /* its steps, described only when it is kept */
  int n_path;
  uint64_t *nh, *nh_sum;  /* state_hash's node hashes, and their sums before each node */
  int32_t cap_nh, n_hashed; /* nodes whose nh and next nh_sum hold */
  TensorRef assign[TEQ_MAX_PARAM_LEN]; /* output j of a complete candidate */

  uint64_t *seen;         /* visited states, open addressing, 0 = empty */
  size_t cap_seen, n_seen;
  Cand *cands;
  int n_cands;
  int rc;                 /* first hard error: allocation */
} Gen;

/* ---- validation ---- */

/* PET's Table 1: multi-linear operators, in their plain form. */
static int check_multilinear(const Graph *g, Diag *d) {
  char lab[GRAPH_LABEL_MAX];
  for (int i = 0; i < g->n_nodes; i++)
    if (!(op_def(g->nodes[i].kind)->flags & OPF_SOURCE) && !pet_is_multilinear(g, i))
      return diag_error(d, "pet_mutate: %s is not multi-linear (PET mutates multi-linear "
                        "subprograms only: conv, matmul, add, mul, layout operators)",
                        graph_node_label(g, i, lab, sizeof lab));
  return TEQ_OK;
}

/* ---- what the original says about parameters ---- */

static void add_factor(Gen *G, int64_t f) {
  if (f < 2) return;
  for (int i = 0; i < G->n_factors; i++)
    if (G->factors[i] == f) return;
  if (G->n_factors < MAX_FACTORS) G->factors[G->n_factors++] = f;
}

/* halo: the axis whose halo-cut inputs alone the set is for, or 0. A set
 * already there for every input stays so. */
static void add_pset_for(Gen *G, const Params *p, int halo) {
  for (int i = 0; i < G->n_psets; i++)
    if (!memcmp(&G->psets[i], p, sizeof *p)) return;
  if (G->n_psets < MAX_PSETS) G->pset_halo[G->n_psets] = halo, G->psets[G->n_psets++] = *p;
}

static void add_pset(Gen *G, const Params *p) { add_pset_for(G, p, 0); }

/* Conv i's halo cuts (L_HALO), one per axis whose window reaches past one
 * row or is padded: its parameters with that axis's pads zeroed, which the
 * pieces' halos replace. This is PET's correction fusion (section 5.3,
 * Fig. 6) done before the fact: cut into plain pieces (S2N), the conv is
 * wrong at the seams and a correction conv with the same kernel recomputes
 * them from the rows around each seam; concatenating those rows onto the
 * pieces lets the one conv compute its pieces and their seams together. */
static void derive_halos(Gen *G, int i) {
  const Node *n = &G->orig->nodes[i];
  /* A grouped (depthwise) conv reads each input byte for a few flops: the
   * copies that cut its input would cost what the conv does, and the
   * cuts' candidates would multiply the search's work for nothing. */
  if (param_int(&n->params, param_index(OP_CONV2D, "groups")) > 1) return;
  int ipd = param_index(OP_CONV2D, "pads");
  const int64_t *pads = n->params.v[ipd].i;
  const int64_t *st = n->params.v[param_index(OP_CONV2D, "stride")].i;
  const int64_t *dl = n->params.v[param_index(OP_CONV2D, "dilation")].i;
  const Shape *w = graph_shape(G->orig, n->in[1]);
  for (int a = 0; a < 2 && G->n_halos < MAX_HALOS; a++) {
    int64_t reach = (w->d[2 + a] - 1) * dl[a] + 1;
    if (reach == 1 && pads[a] == 0 && pads[a + 2] == 0) continue;
    Params q = n->params;
    q.v[ipd].i[a] = 0, q.v[ipd].i[a + 2] = 0;
    int axis = a == 0 ? AX_H : AX_W;
    add_pset_for(G, &q, axis);
    G->halos[G->n_halos++] = (Halo){.x = *graph_shape(G->orig, n->in[0]), .axis = axis,
                                    .reach = reach, .s = st[a], .lo = pads[a],
                                    .out = n->out[0].d[2 + a]};
  }
}

/* Conv i beside another conv on a different input that pet_groupable
 * accepts: i's parameters with twice the groups,
 * the conv on both inputs concatenated along channels (each group reads
 * its own input's channels, so each half of the output is one original
 * conv; the other's kernel is zero-padded to i's extent where smaller). */
static void derive_grouped(Gen *G, int i) {
  const Graph *g = G->orig;
  const Node *a = &g->nodes[i];
  int ig = param_index(OP_CONV2D, "groups");
  for (int j = 0; j < g->n_nodes; j++) {
    const Node *b = &g->nodes[j];
    if (j == i || (a->in[0].node == b->in[0].node && a->in[0].out == b->in[0].out) ||
        !pet_groupable(g, i, j))
      continue;
    Params p = a->params;
    param_set_int(&p, ig, 2 * param_int(&a->params, ig));
    add_pset(G, &p);
    G->can_group = true;
    return;
  }
}

/* Conv parameter sets: each original conv's own; with its dilation d
 * folded away (dilation 1, pads / d: the conv on d x d phase images); with
 * its stride folded away (stride 1, no pads: the conv after space-to-depth,
 * whose zero pad is explicit). Factors: 2, every dilation and stride, and
 * the small batch extents, for the layouts. */
static void derive(Gen *G) {
  const Graph *g = G->orig;
  int ist = param_index(OP_CONV2D, "stride"), ipd = param_index(OP_CONV2D, "pads");
  int idl = param_index(OP_CONV2D, "dilation");
  add_factor(G, 2);
  for (int i = 0; i < g->n_inputs; i++) {
    const Shape *s = &g->nodes[g->inputs[i]].out[0];
    if (s->ndim == 4 && s->d[0] <= 8) add_factor(G, s->d[0]);
  }
  for (int i = 0; i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    if (n->kind == OP_MATMUL || n->kind == OP_GEMM) G->n_compute++, G->has_matmul = true;
    if (n->kind != OP_CONV2D) continue;
    G->n_compute++, G->has_conv = true;
    if (op_output_pooled(n)) continue; /* a mutant's conv is its product alone */
    Params p = n->params;
    add_pset(G, &p);
    derive_grouped(G, i);
    derive_halos(G, i);
    const ParamValue *st = &p.v[ist], *pd = &p.v[ipd], *dl = &p.v[idl];
    int64_t dil = dl->i[0], s = st->i[0];
    add_factor(G, dil);
    add_factor(G, s);
    if (dil > 1 && dl->i[1] == dil) {
      Params q = p;
      bool ok = true;
      int64_t pads[4];
      for (int k = 0; k < 4; k++) ok = ok && pd->i[k] % dil == 0, pads[k] = pd->i[k] / dil;
      param_set_ints(&q, idl, (int64_t[]){1, 1}, 2);
      param_set_ints(&q, ipd, pads, 4);
      if (ok) add_pset(G, &q);
    }
    if (s > 1 && st->i[1] == s && dl->i[0] == 1 && dl->i[1] == 1) {
      Params q = p;
      param_set_ints(&q, ist, (int64_t[]){1, 1}, 2);
      param_set_ints(&q, ipd, (int64_t[]){0, 0, 0, 0}, 4);
      add_pset(G, &q);
      if (G->n_strided < MAX_STRIDED)
        G->strided[G->n_strided++] = (Strided){
          .x = *graph_shape(g, n->in[0]), .w = *graph_shape(g, n->in[1]), .s = s,
          .pt = pd->i[0], .pl = pd->i[1], .y = n->out[0]};
    }
  }
}

/* ---- building the operators ---- */

/* graph_add_node for one output; TEQ_ERR_INPUT means "not applicable here". */
static int add(Graph *g, OpKind k, const TensorRef *in, int n_in, const Params *p, TensorRef *out) {
  int id = graph_add_node(g, k, in, n_in, 1, p, NULL, NULL);
  if (id < 0) return id;
  *out = (TensorRef){id, 0};
  return TEQ_OK;
}

static int reshape(Graph *g, TensorRef x, int r, const int64_t *dims, TensorRef *out) {
  Params p;
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, 0, dims, r);
  return add(g, OP_RESHAPE, &x, 1, &p, out);
}

static int transpose(Graph *g, TensorRef x, int r, const int64_t *perm, TensorRef *out) {
  Params p;
  params_default(OP_TRANSPOSE, &p);
  param_set_ints(&p, 0, perm, r);
  return add(g, OP_TRANSPOSE, &x, 1, &p, out);
}

static int zero_pad(Graph *g, TensorRef x, const int64_t *pads, TensorRef *out) {
  Params p;
  params_default(OP_PAD, &p);
  param_set_ints(&p, param_index(OP_PAD, "pads"), pads, 8);
  return add(g, OP_PAD, &x, 1, &p, out);
}

/* reshape to r dims, permute, reshape to the 4 dims of `to`. */
static int relinearize(Graph *g, TensorRef x, int r, const int64_t *split, const int64_t *perm,
                       const int64_t *to, TensorRef *out) {
  TensorRef a, b;
  int rc = reshape(g, x, r, split, &a);
  if (!rc) rc = transpose(g, a, r, perm, &b);
  if (!rc) rc = reshape(g, b, 4, to, out);
  return rc;
}

/* The layouts, each exactly inverted by its partner (N2S by S2N, D2N by
 * N2D) when given the same axes and factor:
 *   N2S  [N, C, H, W] -> [N/f, C, H, f W]: consecutive images side by side
 *        (the factor is the batch's inner part, the new axis's outer part);
 *   S2N  [N, C, H, W] -> [N f, C, H, W/f]: W cut into f blocks, into the batch;
 *   D2N  [N, C, H, W] -> [f f N, C, H/f, W/f]: the f x f phases (h mod f,
 *        w mod f) as images, phase major: a conv with dilation f on the
 *        original is a conv with dilation 1 on each phase;
 *   N2D  its inverse;
 *   S2D  [N, C, H, W] -> [N, C f f, H/f, W/f] after a zero pad, channel
 *        major, phases minor; kernels get the same layout, so a stride-f
 *        conv is a stride-1 conv on both;
 *   HALO [1, C, H, W] -> [f, C, len, W] (or along W): piece i is rows
 *        [i step, i step + len) of the input zero-padded by lo, cut by a
 *        pad with negative (cropping) pads; N2S puts the conv's results
 *        side by side again. */
static int layout_apply(Graph *g, TensorRef x, const Layout *L, TensorRef *out) {
  Shape s = *graph_shape(g, x);
  if (s.ndim != 4) return TEQ_ERR_INPUT;
  int64_t N = s.d[0], C = s.d[1], H = s.d[2], W = s.d[3], f = L->f;
  int64_t fh = L->axes & AX_H ? f : 1, fw = L->axes & AX_W ? f : 1;
  bool on_w = L->axes == AX_W;
  switch (L->kind) {
  case L_N2S:
    if (N % f || (L->axes != AX_H && !on_w)) return TEQ_ERR_INPUT;
    return relinearize(g, x, 5, (int64_t[]){N / f, f, C, H, W},
                       on_w ? (int64_t[]){0, 2, 3, 1, 4} : (int64_t[]){0, 2, 1, 3, 4},
                       on_w ? (int64_t[]){N / f, C, H, f * W} : (int64_t[]){N / f, C, f * H, W}, out);
  case L_S2N:
    if (on_w ? W % f : H % f) return TEQ_ERR_INPUT;
    if (on_w)
      return relinearize(g, x, 5, (int64_t[]){N, C, H, f, W / f}, (int64_t[]){0, 3, 1, 2, 4},
                         (int64_t[]){N * f, C, H, W / f}, out);
    return relinearize(g, x, 5, (int64_t[]){N, C, f, H / f, W}, (int64_t[]){0, 2, 1, 3, 4},
                       (int64_t[]){N * f, C, H / f, W}, out);
  case L_D2N:
    if (H % fh || W % fw) return TEQ_ERR_INPUT;
    return relinearize(g, x, 6, (int64_t[]){N, C, H / fh, fh, W / fw, fw},
                       (int64_t[]){3, 5, 0, 1, 2, 4}, (int64_t[]){fh * fw * N, C, H / fh, W / fw},
                       out);
  case L_N2D:
    if (N % (fh * fw)) return TEQ_ERR_INPUT;
    return relinearize(g, x, 6, (int64_t[]){fh, fw, N / (fh * fw), C, H, W},
                       (int64_t[]){2, 3, 4, 0, 5, 1}, (int64_t[]){N / (fh * fw), C, H * fh, W * fw},
                       out);
  case L_HALO: {
    /* Only one image: the pieces are concatenated piece-major, which is
     * the order N2S reads back only when the batch is 1. */
    int a = on_w ? 3 : 2;
    int64_t L_ax = s.d[a];
    if (N != 1 || f > TEQ_MAX_PARAM_LEN) return TEQ_ERR_INPUT;
    TensorRef pieces[TEQ_MAX_PARAM_LEN];
    for (int64_t i = 0; i < f; i++) {
      int64_t pads[8] = {0};
      pads[a] = L->lo - i * L->step;
      pads[4 + a] = i * L->step + L->len - (L_ax + L->lo);
      int rc = zero_pad(g, x, pads, &pieces[i]);
      if (rc) return rc;
    }
    Params p;
    params_default(OP_CONCAT, &p);
    param_set_int(&p, 0, 0);
    return add(g, OP_CONCAT, pieces, (int)f, &p, out);
  }
  case L_S2D: {
    TensorRef p = x;
    bool any = false;
    for (int k = 0; k < 8; k++) any = any || L->pads[k];
    int rc = any ? zero_pad(g, x, L->pads, &p) : TEQ_OK;
    if (rc) return rc;
    H = graph_shape(g, p)->d[2], W = graph_shape(g, p)->d[3];
    if (H % f || W % f) return TEQ_ERR_INPUT;
    return relinearize(g, p, 6, (int64_t[]){N, C, H / f, f, W / f, f},
                       (int64_t[]){0, 1, 3, 5, 2, 4}, (int64_t[]){N, C * f * f, H / f, W / f}, out);
  }
  }
  return TEQ_ERR_INPUT;
}

static void layout_text(const Layout *L, bool kernel, char *buf, size_t size) {
  const char *ax = L->axes == (AX_H | AX_W) ? "H,W" : L->axes == AX_H ? "H" : "W";
  long long f = (long long)L->f;
  switch (L->kind) {
  case L_N2S: snprintf(buf, size, "layout batch/%lld -> %s side by side", f, ax); break;
  case L_S2N: snprintf(buf, size, "layout %s/%lld -> batch", ax, f); break;
  case L_HALO:
    snprintf(buf, size, "layout %s/%lld -> batch with halos of %lld", ax, f,
             (long long)(L->len - L->step));
    break;
  case L_D2N: snprintf(buf, size, "layout %s phases %lld -> batch", ax, f); break;
  case L_N2D: snprintf(buf, size, "layout batch -> %s phases %lld", ax, f); break;
  case L_S2D:
    snprintf(buf, size, "%s pad (%lld %lld %lld %lld), space-to-depth %lld",
             kernel ? "kernel" : "layout", (long long)L->pads[2], (long long)L->pads[3], (long long)L->pads[6],
             (long long)L->pads[7], f);
    break;
  }
}

/* ---- the search ---- */

static void build(Gen *G, Graph *g);

/* Adds s's nodes to g; fills outs. TEQ_ERR_INPUT: not applicable. */
static int step_apply(Gen *G, Graph *g, const Step *s, TensorRef *outs, int *n_outs) {
  TensorRef a = G->av[s->a].ref, b = s->b >= 0 ? G->av[s->b].ref : a;
  *n_outs = 1;
  switch (s->kind) {
  case S_LAYOUT: return layout_apply(g, a, &s->L, &outs[0]);
  case S_CONV: return add(g, OP_CONV2D, (TensorRef[]){a, b}, 2, &G->psets[s->pset], &outs[0]);
  case S_MATMUL: return add(g, OP_MATMUL, (TensorRef[]){a, b}, 2, NULL, &outs[0]);
  case S_WPAD: return zero_pad(g, a, s->pads, &outs[0]);
  case S_WCONCAT:
  case S_DCONCAT: {
    Params p;
    params_default(OP_CONCAT, &p);
    param_set_int(&p, 0, s->axis);
    return add(g, OP_CONCAT, (TensorRef[]){a, b}, 2, &p, &outs[0]);
  }
  case S_SPLIT: {
    const Graph *o = G->orig;
    int64_t sizes[TEQ_MAX_PARAM_LEN];
    int n = o->n_outputs;
    for (int j = 0; j < n; j++) sizes[j] = graph_shape(o, o->outputs[j])->d[s->axis];
    Params p;
    params_default(OP_SPLIT, &p);
    param_set_int(&p, param_index(OP_SPLIT, "axis"), s->axis);
    param_set_ints(&p, param_index(OP_SPLIT, "sizes"), sizes, n);
    int id = graph_add_node(g, OP_SPLIT, &a, 1, n, &p, NULL, NULL);
    if (id < 0) return id;
    for (int j = 0; j < n; j++) outs[j] = (TensorRef){id, j};
    *n_outs = n;
    return TEQ_OK;
  }
  }
  return TEQ_ERR_INPUT;
}

/* What step s of the candidate in g did, for the mutant's description. */
static void step_text(const Gen *G, const Graph *g, const Step *s, char *text, size_t size) {
  char buf[160];
  switch (s->kind) {
  case S_LAYOUT: layout_text(&s->L, G->av[s->a].is_weight, text, size); return;
  case S_CONV:
    params_format(OP_CONV2D, &G->psets[s->pset], true, buf, sizeof buf);
    snprintf(text, size, "conv2d%s%s", *buf ? " " : "", buf);
    return;
  case S_MATMUL: snprintf(text, size, "matmul"); return;
  case S_WPAD: {
    const Shape *a = graph_shape(g, G->av[s->a].ref);
    snprintf(text, size, "kernel zero-padded to %lldx%lld",
             (long long)(a->d[2] + s->pads[2] + s->pads[6]),
             (long long)(a->d[3] + s->pads[3] + s->pads[7]));
    return;
  }
  case S_WCONCAT:
  case S_DCONCAT:
    snprintf(text, size, "%s concatenated on axis %d", s->kind == S_WCONCAT ? "kernels" : "inputs",
             s->axis);
    return;
  case S_SPLIT: snprintf(text, size, "split on axis %d", s->axis); return;
  }
}

/* Takes g back to its first mark nodes, and their hashes (state_hash)
 * with it. */
static void take_back(Gen *G, Graph *g, int32_t mark) {
  graph_truncate(g, mark);
  if (G->n_hashed > mark) G->n_hashed = mark;
}

/* Tries s on g and searches on from there; g is as it was after. */
static void extend(Gen *G, Graph *g, const Step *s) {
  if (G->rc || G->n_cands >= G->max_cands || G->n_path == MAX_PATH) return;
  TensorRef outs[TEQ_MAX_PARAM_LEN];
  int n_outs = 0;
  int32_t mark = g->n_nodes;
  int rc = step_apply(G, g, s, outs, &n_outs);
  if (rc || G->n_av + n_outs > MAX_AVAIL) {
    if (rc && rc != TEQ_ERR_INPUT) G->rc = rc;
    take_back(G, g, mark);
    return;
  }
  bool weight = s->kind == S_WPAD || s->kind == S_WCONCAT ||
                (s->kind == S_LAYOUT && G->av[s->a].is_weight);
  bool compute = s->kind == S_CONV || s->kind == S_MATMUL;
  bool computed = compute || G->av[s->a].computed;
  for (int j = 0; j < n_outs; j++)
    G->av[G->n_av + j] = (Avail){.ref = outs[j], .is_weight = weight, .computed = computed,
                                 .is_layout = s->kind == S_LAYOUT || s->kind == S_DCONCAT,
                                 .halo = s->kind == S_LAYOUT && s->L.kind == L_HALO ? s->L.axes
                                                                                    : 0};
  G->av[s->a].uses++;
  if (s->b >= 0) G->av[s->b].uses++;
  G->n_av += n_outs;
  G->n_counted += !weight, G->n_weight_ops += weight, G->n_comp += compute;
  G->path[G->n_path++] = *s;

  build(G, g);

  G->n_path--;
  G->n_counted -= !weight, G->n_weight_ops -= weight, G->n_comp -= compute;
  G->n_av -= n_outs;
  G->av[s->a].uses--;
  if (s->b >= 0) G->av[s->b].uses--;
  take_back(G, g, mark);
}

/* A state is its multiset of nodes, whatever order built them. Nodes come
 * after their inputs, so one forward pass hashes them; the original's
 * inputs and constants hash by id, the same in every candidate (graph_hash
 * would rehash every weight's contents in every state). The search only
 * appends nodes and takes the last ones back, so the hashes of the nodes
 * below what it took back still hold: a state hashes its new nodes alone
 * (hashing every node of every state was 8% of NasNet-A's optimize).
 * 0: no memory. */
static uint64_t state_hash(Gen *G, const Graph *g) {
  if (g->n_nodes + 1 > G->cap_nh) {
    int32_t cap = 2 * g->n_nodes + 1;
    uint64_t *nh = realloc(G->nh, (size_t)cap * sizeof *nh);
    if (nh) G->nh = nh;
    uint64_t *sum = nh ? realloc(G->nh_sum, (size_t)cap * sizeof *sum) : NULL;
    if (!sum) {
      G->rc = TEQ_ERR_NOMEM;
      return 0;
    }
    G->nh_sum = sum, G->cap_nh = cap;
  }
  uint64_t *nh = G->nh, *sum = G->nh_sum;
  sum[0] = 0;
  for (int i = G->n_hashed; i < g->n_nodes; i++) {
    const Node *n = &g->nodes[i];
    nh[i] = hash_mix(0x70657473, (uint64_t)i);
    sum[i + 1] = sum[i];
    if (i < G->n_base) continue;
    nh[i] = params_hash(hash_mix(nh[i], (uint64_t)n->kind), &n->params);
    for (int k = 0; k < n->n_in; k++)
      nh[i] = hash_mix(hash_mix(nh[i], nh[n->in[k].node]), (uint64_t)n->in[k].out);
    sum[i + 1] += nh[i];
  }
  G->n_hashed = g->n_nodes;
  uint64_t h = sum[g->n_nodes];
  return h ? h : 1;
}

/* Inserts h; false if it was there. */
static bool seen_insert(Gen *G, uint64_t h) {
  if (2 * (G->n_seen + 1) > G->cap_seen) {
    size_t cap = G->cap_seen ? 2 * G->cap_seen : 1024;
    uint64_t *t = calloc(cap, sizeof *t);
    if (!t) {
      G->rc = TEQ_ERR_NOMEM;
      return false;
    }
    for (size_t i = 0; i < G->cap_seen; i++)
      if (G->seen[i])
        for (size_t j = G->seen[i] & (cap - 1);; j = (j + 1) & (cap - 1))
          if (!t[j]) {
            t[j] = G->seen[i];
            break;
          }
    free(G->seen);
    G->seen = t, G->cap_seen = cap;
  }
  for (size_t j = h & (G->cap_seen - 1);; j = (j + 1) & (G->cap_seen - 1)) {
    if (G->seen[j] == h) return false;
    if (!G->seen[j]) {
      G->seen[j] = h, G->n_seen++;
      return true;
    }
  }
}


/* Algorithm 1's test: every input of the original is used, and the
 * computed tensors nobody uses are weight-free and have the original's
 * output shapes; output j takes the first such tensor of its shape. Fills
 * G->assign. */
static bool is_mutant(Gen *G, const Graph *g) {
  const Graph *o = G->orig;
  bool taken[MAX_AVAIL] = {false};
  int n_sinks = 0;
  for (int i = 0; i < G->n_av; i++) {
    const Avail *v = &G->av[i];
    if (v->is_orig ? !v->uses : !v->uses && v->is_weight) return false;
    n_sinks += !v->is_orig && !v->uses;
  }
  if (n_sinks != o->n_outputs) return false;
  for (int j = 0; j < o->n_outputs; j++) {
    int i = 0;
    for (; i < G->n_av; i++) {
      const Avail *v = &G->av[i];
      if (!v->is_orig && !v->uses && !taken[i] &&
          shape_equal(graph_shape(g, v->ref), graph_shape(o, o->outputs[j])))
        break;
    }
    if (i == G->n_av) return false;
    taken[i] = true;
    G->assign[j] = G->av[i].ref;
  }
  return true;
}

/* Stores a complete candidate unless it is the original or one already
 * kept (the same program built in another order). */
static void keep(Gen *G, const Graph *g) {
  const Graph *o = G->orig;
  Graph *h = graph_copy(g);
  if (!h) {
    G->rc = TEQ_ERR_NOMEM;
    return;
  }
  for (int j = 0; j < o->n_outputs; j++)
    if (graph_add_output(h, G->assign[j], o->output_names ? o->output_names[j] : NULL, G->d) < 0) {
      G->rc = TEQ_ERR_INTERNAL;
      graph_free(h);
      return;
    }
  graph_remove_dead(h);
  uint64_t hash = graph_hash(h, NULL);
  bool dup = hash == G->orig_hash;
  for (int i = 0; i < G->n_cands && !dup; i++) dup = G->cands[i].hash == hash;
  if (dup) {
    graph_free(h);
    return;
  }
  Cand *c = &G->cands[G->n_cands++];
  c->g = h, c->hash = hash;
  size_t len = 0;
  c->desc[0] = 0;
  for (int k = 0; k < G->n_path && len < sizeof c->desc; k++) {
    char text[DESC_MAX];
    step_text(G, g, &G->path[k], text, sizeof text);
    len += (size_t)snprintf(c->desc + len, sizeof c->desc - len, "%s%s", k ? ", " : "", text);
  }
}

/* Layouts of data tensor i, factors and pads from the original. */
static void try_layouts(Gen *G, Graph *g, int i) {
  const Shape *s = graph_shape(g, G->av[i].ref);
  Step st = {.kind = S_LAYOUT, .a = i, .b = -1};
  for (int k = 0; k < G->n_factors; k++) {
    int64_t f = G->factors[k];
    static const struct { LayoutKind kind; int axes; } forms[] = {
      {L_N2S, AX_H}, {L_N2S, AX_W}, {L_S2N, AX_H}, {L_S2N, AX_W},
      {L_D2N, AX_H | AX_W}, {L_N2D, AX_H | AX_W},
    };
    for (size_t m = 0; m < sizeof forms / sizeof *forms; m++) {
      st.L = (Layout){.kind = forms[m].kind, .axes = forms[m].axes, .f = f};
      extend(G, g, &st);
    }
  }
  /* space-to-depth where an original strided conv reads this shape: its
   * own top/left pads, and the bottom/right ones that make the padded
   * extent s (out + ceil(k/s) - 1), what a 1-strided conv with the
   * ceil(k/s) kernel needs (negative ones crop rows no tap reads). */
  for (int k = 0; k < G->n_strided; k++) {
    const Strided *q = &G->strided[k];
    if (!shape_equal(s, &q->x)) continue;
    int64_t kh = (q->w.d[2] + q->s - 1) / q->s, kw = (q->w.d[3] + q->s - 1) / q->s;
    int64_t ph = q->s * (q->y.d[2] + kh - 1), pw = q->s * (q->y.d[3] + kw - 1);
    st.L = (Layout){.kind = L_S2D, .axes = AX_H | AX_W, .f = q->s,
                    .pads = {0, 0, q->pt, q->pl, 0, 0, ph - s->d[2] - q->pt, pw - s->d[3] - q->pl}};
    extend(G, g, &st);
  }
  /* pieces with halos where an original conv reads this shape: piece i
   * holds the rows output rows [i m, (i + 1) m) read, m = out / f */
  for (int k = 0; k < G->n_halos; k++) {
    const Halo *q = &G->halos[k];
    if (!shape_equal(s, &q->x)) continue;
    for (int j = 0; j < G->n_factors; j++) {
      int64_t f = G->factors[j], m = q->out / f;
      if (q->out % f) continue;
      st.L = (Layout){.kind = L_HALO, .axes = q->axis, .f = f, .lo = q->lo, .step = m * q->s,
                      .len = (m - 1) * q->s + q->reach};
      extend(G, g, &st);
    }
  }
}

/* Weight-only operators on the original kernel i. */
static void try_weight_ops(Gen *G, Graph *g, int i) {
  const Shape *s = graph_shape(g, G->av[i].ref);
  Step st = {.kind = S_LAYOUT, .a = i, .b = -1};
  if (s->ndim != 4) return;
  /* space-to-depth of a strided conv's kernel, zero-padded at the end to a
   * multiple of the stride */
  for (int k = 0; k < G->n_strided; k++) {
    const Strided *q = &G->strided[k];
    if (!shape_equal(s, &q->w)) continue;
    int64_t kh = (s->d[2] + q->s - 1) / q->s * q->s, kw = (s->d[3] + q->s - 1) / q->s * q->s;
    st.L = (Layout){.kind = L_S2D, .axes = AX_H | AX_W, .f = q->s,
                    .pads = {0, 0, 0, 0, 0, 0, kh - s->d[2], kw - s->d[3]}};
    extend(G, g, &st);
  }
  /* centred zero pad to a larger kernel of the same input channels: with
   * the larger kernel's conv pads it computes the same conv */
  st.kind = S_WPAD;
  for (int j = 0; j < G->n_av; j++) {
    const Shape *t = graph_shape(g, G->av[j].ref);
    if (j == i || !G->av[j].is_weight || t->ndim != 4 || t->d[1] != s->d[1]) continue;
    int64_t dh = t->d[2] - s->d[2], dw = t->d[3] - s->d[3];
    if (dh < 0 || dw < 0 || dh % 2 || dw % 2 || dh + dw == 0) continue;
    memcpy(st.pads, (int64_t[]){0, 0, dh / 2, dw / 2, 0, 0, dh / 2, dw / 2}, sizeof st.pads);
    extend(G, g, &st);
  }
}

/* Whether conv parameter set p may run on an input cut with halos along
 * `halo` (0: not cut): a set made for halos only on such an input, and on
 * such an input only a set with no pads along the cut axis. */
static bool pset_fits(const Gen *G, int p, int halo) {
  if (!halo || G->pset_halo[p]) return G->pset_halo[p] == halo;
  const int64_t *pads = G->psets[p].v[param_index(OP_CONV2D, "pads")].i;
  int a = halo == AX_H ? 0 : 1;
  return pads[a] == 0 && pads[a + 2] == 0;
}

static void build(Gen *G, Graph *g) {
  if (G->rc || G->n_cands >= G->max_cands) return;
  uint64_t sh = state_hash(G, g);
  if (!sh || !seen_insert(G, sh)) return;
  if (is_mutant(G, g)) {
    keep(G, g);
    return;
  }
  if (G->n_counted >= G->depth) return;
  const Graph *o = G->orig;
  int n = G->n_av; /* extend appends; only what exists now is a choice */
  for (int i = 0; i < n; i++) {
    const Avail *v = &G->av[i];
    if (graph_shape(g, v->ref)->ndim != 4 || v->is_layout) continue;
    if (!v->is_weight) try_layouts(G, g, i);
    else if (v->is_orig && !v->uses && G->n_weight_ops < MAX_WEIGHT_OPS) try_weight_ops(G, g, i);
  }
  /* two of the original's inputs side by side along channels, for a
   * grouped conv (derive_grouped) */
  for (int i = 0; i < n && G->can_group; i++)
    for (int j = i + 1; j < n; j++) {
      const Avail *a = &G->av[i], *b = &G->av[j];
      if (a->is_weight || b->is_weight || !a->is_orig || !b->is_orig || a->uses || b->uses ||
          !shape_equal(graph_shape(g, a->ref), graph_shape(g, b->ref)))
        continue;
      extend(G, g, &(Step){.kind = S_DCONCAT, .a = i, .b = j, .axis = 1});
    }
  for (int i = 0; i < n && G->n_comp < G->n_compute; i++) {
    if (G->av[i].is_weight || G->av[i].computed) continue;
    for (int j = 0; j < n; j++) {
      if (!G->av[j].is_weight) continue;
      for (int p = 0; p < G->n_psets && G->has_conv; p++)
        if (pset_fits(G, p, G->av[i].halo))
          extend(G, g, &(Step){.kind = S_CONV, .a = i, .b = j, .pset = p});
      if (G->has_matmul) extend(G, g, &(Step){.kind = S_MATMUL, .a = i, .b = j});
    }
  }
  /* merging: kernels side by side along their output axis (0 for a conv
   * kernel, the last for a matmul's), a split into the original's outputs */
  for (int i = 0; i < n && G->n_compute > 1 && G->n_weight_ops < MAX_WEIGHT_OPS; i++)
    for (int j = 0; j < n; j++) {
      const Avail *a = &G->av[i], *b = &G->av[j];
      if (i == j || !a->is_weight || !b->is_weight || a->uses || b->uses) continue;
      int r = graph_shape(g, a->ref)->ndim;
      if (G->has_conv && r == 4) extend(G, g, &(Step){.kind = S_WCONCAT, .a = i, .b = j, .axis = 0});
      if (G->has_matmul && r >= 2)
        extend(G, g, &(Step){.kind = S_WCONCAT, .a = i, .b = j, .axis = r - 1});
    }
  for (int i = 0; i < n && o->n_outputs > 1 && o->n_outputs <= TEQ_MAX_PARAM_LEN; i++) {
    const Avail *v = &G->av[i];
    if (v->is_weight || !v->computed || v->uses) continue;
    const Shape *s = graph_shape(g, v->ref);
    for (int axis = 0; axis < s->ndim; axis++) {
      int64_t sum = 0;
      bool fits = true;
      for (int j = 0; j < o->n_outputs && fits; j++) {
        const Shape *t = graph_shape(o, o->outputs[j]);
        fits = t->ndim == s->ndim;
        for (int k = 0; k < s->ndim && fits; k++) fits = k == axis || t->d[k] == s->d[k];
        sum += fits ? t->d[axis] : 0;
      }
      if (fits && sum == s->d[axis])
        extend(G, g, &(Step){.kind = S_SPLIT, .a = i, .b = -1, .axis = axis});
    }
  }
}

/* ---- the entry point ---- */

/* The original's inputs and constants, in its order, as the start of every
 * candidate. A weight is a constant or an input some conv or matmul reads
 * as its second operand. */
static int base_graph(Gen *G, Graph **out) {
  const Graph *o = G->orig;
  Graph *g = graph_new();
  bool *weight = calloc((size_t)o->n_nodes + 1, sizeof *weight);
  int rc = g && weight ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int i = 0; i < o->n_nodes && !rc; i++) {
    const Node *n = &o->nodes[i];
    if (n->kind == OP_CONST) weight[i] = true;
    if ((n->kind == OP_CONV2D || n->kind == OP_MATMUL || n->kind == OP_GEMM) && n->n_in >= 2)
      weight[n->in[1].node] = true;
  }
  for (int pass = 0; pass < 2 && !rc; pass++)
    for (int k = 0; k < (pass ? o->n_nodes : o->n_inputs) && !rc; k++) {
      int i = pass ? k : o->inputs[k];
      const Node *n = &o->nodes[i];
      if (pass && n->kind != OP_CONST) continue;
      if (G->n_av == MAX_AVAIL) {
        rc = TEQ_ERR_UNSUPPORTED;
        diag_error(G->d, "pet_mutate: more than %d inputs and weights", MAX_AVAIL);
        break;
      }
      int id = pass ? graph_add_const(g, n->name, tensor_ref(n->value), G->d)
                    : graph_add_input(g, n->name, &n->out[0], n->dtype, G->d);
      if (id < 0) rc = id;
      else G->av[G->n_av++] = (Avail){.ref = {id, 0}, .is_weight = weight[i], .is_orig = true};
    }
  free(weight);
  if (rc) graph_free(g);
  else *out = g, G->n_base = g->n_nodes;
  return rc;
}

void pet_mutants_free(PetMutant *m, int n) {
  for (int i = 0; m && i < n; i++) {
    graph_free(m[i].graph);
    pet_report_fini(&m[i].report);
  }
  free(m);
}

/* ---- the tests, side by side ---- */

/* Every candidate is tested (pet_compare) on its own: threads take the
 * next one untested, all with one set of runs of the original (once per
 * trial). The candidates share constant tensors, whose counts of
 * references are atomic; everything else a test writes is its own. */
typedef struct Tests {
  const Graph *orig;
  Cand *cands;
  int n;
  const PetTestOptions *to;
  PetOrigRuns *runs; /* the original's, shared */
  PetReport *rep; /* per candidate */
  int *rc;        /* per candidate */
  int next;       /* the next candidate untested, taken atomically */
} Tests;

typedef struct Worker {
  Tests *T;
  Diag d;
} Worker;

static void *test_worker(void *arg) {
  Worker *w = arg;
  Tests *T = w->T;
  for (int i; (i = __atomic_fetch_add(&T->next, 1, __ATOMIC_RELAXED)) < T->n;)
    T->rc[i] = pet_compare_cached(T->orig, T->cands[i].g, T->to, &T->runs, &T->rep[i], &w->d);
  return NULL;
}

/* Runs T on jobs threads (this one among them); on a failure, the first
 * failed candidate's code, and the failures' messages in d. */
static int run_tests(Tests *T, int jobs, Diag *d) {
  enum { MAX_JOBS = 64 };
  if (jobs > T->n) jobs = T->n;
  if (jobs > MAX_JOBS) jobs = MAX_JOBS;
  if (jobs < 1) jobs = 1;
  Worker w[MAX_JOBS];
  pthread_t tid[MAX_JOBS];
  int started = 1;
  for (int k = 0; k < jobs; k++) w[k].T = T, diag_init(&w[k].d);
  for (; started < jobs; started++)
    if (pthread_create(&tid[started], NULL, test_worker, &w[started])) break;
  test_worker(&w[0]);
  for (int k = 1; k < started; k++) pthread_join(tid[k], NULL);
  int rc = TEQ_OK;
  for (int i = 0; i < T->n && !rc; i++) rc = T->rc[i];
  for (int k = 0; k < jobs; k++) {
    if (rc && w[k].d.n_errors) { /* its messages, less the last line's end */
      size_t len = strlen(w[k].d.text);
      diag_error(d, "%.*s", (int)(len && w[k].d.text[len - 1] == '\n' ? len - 1 : len),
                 w[k].d.text);
    }
    diag_fini(&w[k].d);
  }
  return rc;
}

int pet_mutate(const Graph *orig, const PetMutateOptions *o, PetMutant **out, int *n_out,
               Diag *d) {
  static const PetMutateOptions defaults = {0};
  if (!o) o = &defaults;
  if (orig->n_outputs < 1)
    return diag_error(d, "pet_mutate: the subprogram has no outputs");
  if (orig->n_outputs > TEQ_MAX_PARAM_LEN)
    return diag_error(d, "pet_mutate: %d outputs, at most %d", orig->n_outputs,
                      TEQ_MAX_PARAM_LEN);
  int rc = check_multilinear(orig, d);
  if (rc) return rc;
  int max_mutants = o->max_mutants > 0 ? o->max_mutants : PET_MUTATE_MAX_MUTANTS;
  Gen G = {.orig = orig, .d = d, .depth = o->depth > 0 ? o->depth : PET_MUTATE_DEPTH};
  /* room for the mutants that pet_compare will drop */
  G.max_cands = 4 * max_mutants < 64 ? 64 : 4 * max_mutants;
  G.cands = calloc((size_t)G.max_cands, sizeof *G.cands);
  PetMutant *res = calloc((size_t)max_mutants, sizeof *res);
  int n_res = 0;
  Graph *base = NULL;
  rc = G.cands && res ? base_graph(&G, &base) : TEQ_ERR_NOMEM;
  if (rc) goto out;
  derive(&G);
  G.orig_hash = graph_hash(orig, NULL);
  build(&G, base);
  graph_free(base);
  if ((rc = G.rc)) goto out;

  PetTestOptions to = {.trials = o->trials, .seed = o->seed, .stop_if_whole = true};
  Tests T = {.orig = orig, .cands = G.cands, .n = G.n_cands, .to = &to,
             .runs = pet_orig_runs_new(orig, to.seed),
             .rep = calloc((size_t)G.n_cands + 1, sizeof *T.rep),
             .rc = calloc((size_t)G.n_cands + 1, sizeof *T.rc)};
  if (!T.runs || !T.rep || !T.rc) {
    pet_orig_runs_free(T.runs);
    free(T.rep), free(T.rc);
    rc = TEQ_ERR_NOMEM;
    goto out;
  }
  rc = run_tests(&T, o->jobs, d);
  pet_orig_runs_free(T.runs);
  for (int i = 0; i < G.n_cands && !rc; i++) {
    if ((rc = T.rc[i])) break;
    /* An output wrong in every box is recomputed whole by its correction:
     * the mutant's work for it is wasted, and a mutant without that work
     * is always cheaper (the outputs of a merge put in the wrong order). */
    PetReport *r = &T.rep[i];
    bool whole = false;
    for (int j = 0; j < r->n_outputs; j++)
      whole = whole || r->out[j].n_differ == r->out[j].n_boxes;
    if (whole || n_res == max_mutants) continue;
    PetMutant *m = &res[n_res++];
    m->report = *r;
    memset(r, 0, sizeof *r);
    m->graph = G.cands[i].g, G.cands[i].g = NULL;
    memcpy(m->desc, G.cands[i].desc, sizeof m->desc);
  }
  for (int i = 0; i < G.n_cands; i++) pet_report_fini(&T.rep[i]);
  free(T.rep), free(T.rc);
out:
  for (int i = 0; i < G.n_cands; i++) graph_free(G.cands[i].g);
  free(G.cands);
  free(G.seen);
  free(G.nh);
  free(G.nh_sum);
  if (rc) {
    pet_mutants_free(res, n_res);
    return rc;
  }
  *out = res, *n_out = n_res;
  return TEQ_OK;
}
