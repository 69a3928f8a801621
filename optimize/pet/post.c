/* post.c: PET's post-optimization (OSDI'21, section 6.3): the reshapes and
 * transposes (R/T) that mutants leave at their boundaries, cleaned up once
 * spliced mutants meet across the element-wise operators between them.
 *
 * Four rewrites, tried in this order and repeated until none applies:
 *   - inverse groups: a chain of R/T whose composition is the identity is
 *     removed. Whether it is, is decided by evaluation, as PET decides it
 *     with its random tests (section 7): the chain runs in Z_p on its
 *     index map, the tensor holding 0..n-1, and is removed only when every
 *     position gets its own index back. That evaluation is exact, not
 *     probabilistic: an R/T moves elements and computes nothing, so one
 *     input whose elements are all distinct shows where each one goes.
 *   - fusion: a reshape of a reshape is one reshape, a transpose of a
 *     transpose one transpose with the composed perm;
 *   - motion: an R/T whose only reader is an element-wise operator (what
 *     the registry marks OPF_ELEMENTWISE, of any arity) moves after it,
 *     when each other input of that operator comes through the same R/T or
 *     is a constant. A constant is moved back through the R/T's inverse
 *     here: that is a conv's bias, which optimize spreads to the conv's
 *     output shape for the search.
 *   - hoisting: a split along the last axis of a tensor (or slices that
 *     cut it so, or gathers that select each part of it after R/T brought
 *     the parts to an axis of their own) whose every piece is cut into
 *     heads by a reshape and brought heads-first by a transpose
 *     (attention's Q, K and V after their products merged into one, or as
 *     PyTorch exports them) becomes one reshape and one transpose of the
 *     whole tensor and a split along its first axis, which is a view: one
 *     kernel for the three copies of the split and the three transposes.
 *     A piece transposed otherwise (K, heads first and keys last) keeps a
 *     transpose of its own, of its two last axes. Checked by evaluation as inverse groups
 *     are: both forms run on the index map and every position compares.
 * Each rewrite removes an operator, moves an R/T downstream, or turns a
 * split along the columns into one along the first axis, so the
 * repetition ends. Motion is what lets the transpose-back of one mutated
 * conv meet the transpose-forth of the next across a relu (the Fig. 1
 * batch/width layouts on consecutive layers, Fig. 7 (b)); it also leaves
 * the relu and the bias right after their conv, where opt_fuse_bias
 * folds them back in (Fig. 7 (c)).
 *
 * Reshape and transpose are named by kind: this file composes and inverts
 * their parameters, which is knowledge of those two rows; hoisting also
 * reads the axis and sizes of a split and the ranges of a slice, asks the
 * registry which index a gather takes, and writes a split. Other layout operators are
 * not moved (a pad inserts values an element-wise operator would change,
 * a slice would make it compute more).
 *
 * Section 6.3's preprocessing (operators whose inputs are all weights) is
 * not here: optimize prices those as free and computes them into
 * constants before export (opt_fold_weights in optimize/weights.c). */
#include <stdlib.h>
#include <string.h>

#include "optimize/pet/pet.h"
#include "runtime/exec.h"
#include "runtime/modp.h"

enum {
  MAX_CHAIN = 8,   /* R/T followed back from a chain's end */
  MAX_EW_IN = 16,  /* inputs of an element-wise operator considered */
};

/* Verdicts of the chains evaluated, by chain_key: whether each is the
 * identity. A search post-optimizes candidate after candidate holding the
 * same mutants, and evaluating their chains over activations of a few
 * hundred thousand elements was most of its time. Open addressing; key 0
 * is never stored (such a chain is evaluated each time). */
enum { VERDICTS = 4096 };
typedef struct Verdicts {
  uint64_t key[VERDICTS];
  bool yes[VERDICTS];
  int n;
} Verdicts;

static bool verdict_find(const Verdicts *v, uint64_t key, bool *yes) {
  for (uint32_t i = (uint32_t)key % VERDICTS; key && v->key[i]; i = (i + 1) % VERDICTS)
    if (v->key[i] == key) {
      *yes = v->yes[i];
      return true;
    }
  return false;
}

static void verdict_put(Verdicts *v, uint64_t key, bool yes) {
  if (!key || v->n >= VERDICTS / 2) return; /* full enough: evaluate from now on */
  uint32_t i = (uint32_t)key % VERDICTS;
  while (v->key[i] && v->key[i] != key) i = (i + 1) % VERDICTS;
  if (!v->key[i]) v->n++;
  v->key[i] = key;
  v->yes[i] = yes;
}

/* Constants moved back through an R/T, remembered across calls: a search
 * splices the same mutant next to the same bias in graph after graph, and
 * running a spread bias through a transpose each time was most of the
 * post-optimization's time. Each entry holds a reference to the constant
 * it was computed from (so its address names it while cached) and to the
 * result (NULL: the constant does not fit). */
enum { MEMO_CONSTS = 1024 }; /* MobileNetV2's search moves about 350 */
/* Moved constants held at most: spread biases are megabytes each (the
 * constants they came from are the graphs', shared, and not counted). */
#define MEMO_BYTES ((size_t)512 << 20)
typedef struct MovedConst {
  uint64_t key;      /* moved_key: compared first */
  Tensor *src, *moved;
  OpKind kind;       /* the R/T */
  Params params;
  Shape in;          /* its input shape */
} MovedConst;
struct PetPostCache {
  MovedConst e[MEMO_CONSTS]; /* a ring: the oldest at first, n of them */
  int first, n;
  size_t bytes;              /* of the moved tensors held */
  Verdicts chains;
};

static size_t held_bytes(const MovedConst *m) { return m->moved ? tensor_bytes(m->moved) : 0; }

PetPostCache *pet_post_cache_new(void) { return calloc(1, sizeof(PetPostCache)); }

static void moved_drop_oldest(PetPostCache *c) {
  MovedConst *m = &c->e[c->first];
  c->bytes -= held_bytes(m);
  tensor_unref(m->src), tensor_unref(m->moved);
  c->first = (c->first + 1) % MEMO_CONSTS;
  c->n--;
}

void pet_post_cache_free(PetPostCache *c) {
  if (!c) return;
  while (c->n) moved_drop_oldest(c);
  free(c);
}

static uint64_t moved_key(const Tensor *t, const Node *l, const Shape *in) {
  uint64_t h = params_hash(hash_mix((uint64_t)(uintptr_t)t, (uint64_t)l->kind), &l->params);
  return hash_bytes(hash_mix(h, (uint64_t)in->ndim), in->d, (size_t)in->ndim * sizeof in->d[0]);
}

static MovedConst *moved_find(PetPostCache *c, const Tensor *t, const Node *l, const Shape *in) {
  uint64_t key = c ? moved_key(t, l, in) : 0;
  for (int i = 0; c && i < c->n; i++) {
    MovedConst *m = &c->e[(c->first + i) % MEMO_CONSTS];
    if (m->key == key && m->src == t && m->kind == l->kind && shape_equal(&m->in, in) &&
        !memcmp(&m->params, &l->params, sizeof m->params))
      return m;
  }
  return NULL;
}

static void moved_put(PetPostCache *c, Tensor *t, const Node *l, const Shape *in, Tensor *moved) {
  if (!c) return;
  size_t need = moved ? tensor_bytes(moved) : 0;
  if (need > MEMO_BYTES) return;
  while (c->n && (c->n == MEMO_CONSTS || c->bytes + need > MEMO_BYTES)) moved_drop_oldest(c);
  MovedConst *m = &c->e[(c->first + c->n++) % MEMO_CONSTS];
  c->bytes += need;
  *m = (MovedConst){.key = moved_key(t, l, in), .src = tensor_ref(t),
                    .moved = moved ? tensor_ref(moved) : NULL,
                    .kind = l->kind, .params = l->params, .in = *in};
}

typedef struct Post {
  PetPostCache *cache; /* may be NULL */
  Graph *g;
  int32_t *uses, *off;        /* graph_use_counts, refreshed after each rewrite */
  int32_t *rd, *rd_off;       /* the nodes reading each output, as refreshed: those
                               * of output k of node i are rd[rd_off[off[i] + k] ..
                               * rd_off[off[i] + k + 1]), in the order of their ids */
  int32_t n;                  /* nodes as refreshed; a rewrite may add more */
  Verdicts *chains;           /* the cache's, or this call's own */
  PetPostStats st;
} Post;

static bool is_rt(const Node *n) { return n->kind == OP_RESHAPE || n->kind == OP_TRANSPOSE; }

/* Readers of node id's output 0, graph outputs included. A node nothing
 * reads (dead before the pass began) is left to itself. */
static int32_t uses_of(const Post *p, int id) { return p->uses[p->off[id]]; }

/* The perm a transpose applies at rank r; an empty perm reverses, as in ONNX. */
static void perm_of(const Node *n, int r, int64_t *perm) {
  const ParamValue *v = &n->params.v[0];
  for (int i = 0; i < r; i++) perm[i] = v->n ? v->i[i] : r - 1 - i;
}

/* The use counts of the graph as it now is; its readers are found when
 * hoisting first asks (readers). */
static int refresh(Post *p) {
  free(p->uses), free(p->off), free(p->rd), free(p->rd_off);
  p->off = p->rd = p->rd_off = NULL;
  p->n = p->g->n_nodes;
  p->uses = graph_use_counts(p->g, &p->off);
  return p->uses ? TEQ_OK : TEQ_ERR_NOMEM;
}

/* The readers of every output as refreshed (p->rd, p->rd_off). Hoisting
 * follows chains reader by reader; found by a scan of every node each
 * time, a post-optimization of NasRNN at 16 times its steps grew with the
 * square of the graph. */
static int readers(Post *p) {
  if (p->rd) return TEQ_OK;
  const Graph *g = p->g;
  int32_t slots = p->off[p->n], edges = 0;
  p->rd_off = calloc((size_t)slots + 2, sizeof *p->rd_off);
  for (int i = 0; i < p->n; i++) edges += g->nodes[i].n_in;
  p->rd = malloc(((size_t)edges + 1) * sizeof *p->rd);
  if (!p->rd_off || !p->rd) {
    free(p->rd), free(p->rd_off);
    p->rd = p->rd_off = NULL;
    return TEQ_ERR_NOMEM;
  }
  /* counted at slot + 2, summed to starts at slot + 1, filled back to slot */
  for (int i = 0; i < p->n; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++)
      p->rd_off[p->off[g->nodes[i].in[j].node] + g->nodes[i].in[j].out + 2]++;
  for (int32_t k = 2; k <= slots + 1; k++) p->rd_off[k] += p->rd_off[k - 1];
  for (int i = 0; i < p->n; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++)
      p->rd[p->rd_off[p->off[g->nodes[i].in[j].node] + g->nodes[i].in[j].out + 1]++] = i;
  return TEQ_OK;
}

/* A graph node like n (kind, parameters, name) on inputs in; *id < 0
 * when it does not apply there (shapes that do not infer). */
static int add_like(Graph *g, const Node *n, const TensorRef *in, int n_in, int *id) {
  Params prm = n->params; /* n may move when the node array grows */
  OpKind kind = n->kind;
  const char *name = n->name;
  *id = graph_add_node(g, kind, in, n_in, 1, &prm, name, NULL);
  return *id == TEQ_ERR_NOMEM ? TEQ_ERR_NOMEM : TEQ_OK;
}

/* An element-wise operator of one tensor, and of constants of one element
 * if any: it commutes with every layout (a scale of attention's Q, a
 * relu), so hoisting carries it along. Its tensor input's index, or -1. */
static int scalar_wise(const Graph *g, const Node *n) {
  unsigned f = op_def(n->kind)->flags;
  if (!(f & OPF_ELEMENTWISE) || (f & (OPF_LAYOUT_ONLY | OPF_SOURCE | OPF_OPAQUE | OPF_NOOP)) ||
      n->n_out != 1 || n->n_in > MAX_EW_IN)
    return -1;
  int data = -1;
  for (int j = 0; j < n->n_in; j++) {
    const Node *a = &g->nodes[n->in[j].node];
    if (a->kind == OP_CONST && tensor_numel(a->value) == 1) continue;
    if (data >= 0) return -1;
    data = j;
  }
  return data;
}

/* The nodes ids[0..n_ids) of g (in topological order, reading x or one
 * another) copied into a graph of their own reading x's index map (the
 * tensor holding 0..n-1), run in Z_p: vals[k] is what node outs[k] (its
 * output 0) holds. An R/T moves elements and computes nothing, so one run
 * shows where each element goes, exactly. Element-wise operators of one
 * tensor are passed through: they commute with every layout, and where
 * each element goes is what is asked. vals[] stays NULL when the run is
 * not possible (too many elements to be distinct residues, a node reading
 * anything but its data and constants, a kernel that fails). */
static int on_index_map(const Graph *g, TensorRef x, const int32_t *ids, int n_ids,
                        const int32_t *outs, int n_outs, Tensor **vals) {
  const Shape *s = graph_shape(g, x);
  int64_t numel = shape_numel(s);
  if (numel >= (int64_t)MODP_P) return TEQ_OK;
  Graph *m = graph_new();
  Tensor *idx = tensor_new(DT_MODP, s);
  TensorRef *map = malloc(((size_t)g->n_nodes + 1) * sizeof *map); /* g's node -> m's tensor */
  int rc = m && idx && map ? TEQ_OK : TEQ_ERR_NOMEM;
  int in = rc ? -1 : graph_add_input(m, "index", s, DT_F32, NULL);
  if (in < 0 && rc == TEQ_OK) rc = in;
  for (int i = 0; i < n_ids && rc == TEQ_OK; i++) {
    const Node *nd = &g->nodes[ids[i]];
    int data = scalar_wise(g, nd);
    TensorRef a = data >= 0 ? nd->in[data] : nd->in[0];
    TensorRef src = a.node == x.node && a.out == x.out ? (TensorRef){in, 0}
                     : scalar_wise(g, &g->nodes[a.node]) >= 0 ? map[a.node] /* passed through */
                                                              : (TensorRef){map[a.node].node, a.out};
    if (data >= 0) {
      map[ids[i]] = src;
      continue;
    }
    /* the data first; any further input a constant (a gather's index) */
    TensorRef ins[MAX_EW_IN];
    ins[0] = src;
    if (nd->n_in > MAX_EW_IN) rc = TEQ_ERR_INTERNAL;
    for (int j = 1; j < nd->n_in && rc == TEQ_OK; j++) {
      const Node *c = &g->nodes[nd->in[j].node];
      if (c->kind != OP_CONST) rc = TEQ_ERR_INTERNAL;
      else if ((ins[j].node = graph_add_const(m, NULL, tensor_ref(c->value), NULL)) < 0)
        rc = ins[j].node == TEQ_ERR_NOMEM ? TEQ_ERR_NOMEM : TEQ_ERR_INTERNAL;
      ins[j].out = 0;
    }
    Params prm = nd->params;
    int id = rc ? -1 : graph_add_node(m, nd->kind, ins, nd->n_in, nd->n_out, &prm, NULL, NULL);
    if (rc == TEQ_OK && id < 0) rc = id == TEQ_ERR_NOMEM ? id : TEQ_ERR_INTERNAL;
    if (rc == TEQ_OK) map[ids[i]] = (TensorRef){id, 0};
  }
  for (int k = 0; k < n_outs && rc == TEQ_OK; k++)
    if (graph_add_output(m, map[outs[k]], NULL, NULL) < 0) rc = TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) {
    uint32_t *v = idx->data;
    for (int64_t i = 0; i < numel; i++) v[i] = (uint32_t)i;
    if (exec_run(m, EXEC_MODP, &idx, vals, NULL) != TEQ_OK)
      for (int k = 0; k < n_outs; k++) vals[k] = NULL;
  }
  tensor_unref(idx);
  graph_free(m);
  free(map);
  return rc == TEQ_ERR_INTERNAL ? TEQ_OK : rc; /* a form it cannot copy: not run */
}

/* ---- inverse groups ---- */

static uint64_t chain_key(const Graph *g, const int32_t *c, int len) {
  const Shape *s = graph_shape(g, g->nodes[c[len - 1]].in[0]);
  uint64_t h = hash_bytes(hash_mix(0x706f7374, (uint64_t)s->ndim), s->d,
                          (size_t)s->ndim * sizeof s->d[0]);
  for (int k = len - 1; k >= 0; k--) {
    const Node *n = &g->nodes[c[k]];
    h = params_hash(hash_mix(h, (uint64_t)n->kind), &n->params);
  }
  return h;
}

/* Whether the chain c[len-1], ..., c[0] (c[0] last) returns every element
 * to its place. The evaluation test PET runs on R/T chains, in its exact
 * form: the chain runs in Z_p (the registry's own kernels, as for any
 * random test) on the tensor holding 0..n-1, its index map, so every
 * position is compared and a chain that moves any element fails. */
static int chain_is_identity(Post *p, const int32_t *c, int len, bool *yes) {
  const Graph *g = p->g;
  TensorRef x = g->nodes[c[len - 1]].in[0];
  const Shape *s = graph_shape(g, x);
  int64_t n = shape_numel(s);
  *yes = false;
  uint64_t key = chain_key(g, c, len);
  if (verdict_find(p->chains, key, yes)) return TEQ_OK;
  int32_t ids[MAX_CHAIN];
  for (int k = 0; k < len; k++) ids[k] = c[len - 1 - k]; /* the chain's first node first */
  Tensor *y = NULL;
  int rc = on_index_map(g, x, ids, len, &c[0], 1, &y);
  if (rc || !y) return rc; /* nothing decided, nothing to remember */
  const uint32_t *w = y->data;
  int64_t i = 0;
  bool same_shape = shape_equal(&y->shape, s);
  while (same_shape && i < n && w[i] == (uint32_t)i) i++;
  *yes = same_shape && i == n;
  tensor_unref(y);
  verdict_put(p->chains, key, *yes);
  return TEQ_OK;
}

/* The longest chain of R/T ending at node e that is the identity: e's
 * readers read the chain's input instead. A graph output may come to read
 * a computed tensor that way (same values), never a graph input or a
 * weight: the model would pass it straight through. */
static int try_inverse(Post *p, int e, bool *done) {
  Graph *g = p->g;
  if (!is_rt(&g->nodes[e]) || !uses_of(p, e) || !shape_is_known(&g->nodes[e].out[0]))
    return TEQ_OK;
  bool is_output = false;
  for (int i = 0; i < g->n_outputs; i++) is_output = is_output || g->outputs[i].node == e;
  int32_t c[MAX_CHAIN];
  int len = 0;
  for (int id = e; len < MAX_CHAIN && is_rt(&g->nodes[id]); id = g->nodes[id].in[0].node)
    c[len++] = id;
  for (int k = len; k >= 1; k--) {
    TensorRef s = g->nodes[c[k - 1]].in[0];
    if (!shape_equal(graph_shape(g, s), &g->nodes[e].out[0])) continue;
    if (is_output && (op_def(g->nodes[s.node].kind)->flags & OPF_SOURCE)) continue;
    bool yes = false;
    int rc = chain_is_identity(p, c, k, &yes);
    if (rc) return rc;
    if (yes) {
      graph_replace_uses(g, (TensorRef){e, 0}, s);
      p->st.removed++;
      *done = true;
      return TEQ_OK;
    }
  }
  return TEQ_OK;
}

/* ---- fusion ---- */

/* reshape(reshape(x)) = reshape(x); transpose(transpose(x, a), b) =
 * transpose(x, a o b), where the inner one has no other reader. */
static int try_fuse(Post *p, int e, bool *done) {
  Graph *g = p->g;
  const Node *n = &g->nodes[e];
  if (!is_rt(n) || !uses_of(p, e)) return TEQ_OK;
  int inner = n->in[0].node;
  const Node *in = &g->nodes[inner];
  if (in->kind != n->kind || uses_of(p, inner) != 1 || !shape_is_known(graph_shape(g, in->in[0])))
    return TEQ_OK;
  Node like = *n; /* kind, name and the parameters of the fused operator */
  TensorRef x = in->in[0];
  if (n->kind == OP_TRANSPOSE) {
    const Shape *xs = graph_shape(g, x);
    int r = xs->ndim;
    int64_t a[TEQ_MAX_DIMS], b[TEQ_MAX_DIMS], ab[TEQ_MAX_DIMS];
    perm_of(in, r, a);
    perm_of(n, r, b);
    for (int i = 0; i < r; i++) ab[i] = a[b[i]]; /* out[i] = mid[b[i]] = x[a[b[i]]] */
    param_set_ints(&like.params, 0, ab, r);
    if (op_def(OP_TRANSPOSE)->canonical) op_def(OP_TRANSPOSE)->canonical(&like, xs);
  }
  int id = -1;
  int rc = add_like(g, &like, &x, 1, &id);
  if (rc || id < 0) return rc;
  graph_replace_uses(g, (TensorRef){e, 0}, (TensorRef){id, 0});
  p->st.fused++;
  *done = true;
  return TEQ_OK;
}

/* ---- motion ---- */

/* For a constant c read by an element-wise operator next to L(y): a
 * constant c2 of L's input shape with L(c2) = c spread to L's output
 * shape, so that f(L(y), c) = L(f(y, c2)). Computed by running c through
 * the inverse of L (reshape back, transpose by the inverse perm), and
 * kept only if L takes it back to c exactly (sure for a c of L's whole
 * output shape, as a bias the search spread is). A one-element constant
 * spreads alike over any shape and stays. *out.node < 0 when c does not
 * fit. */
static int side_constant(Post *p, TensorRef c, int l, TensorRef *out) {
  Graph *g = p->g;
  const Node *ln = &g->nodes[l];
  Tensor *t = g->nodes[c.node].value;
  Shape s_in = *graph_shape(g, ln->in[0]), s_out = ln->out[0], spread;
  *out = (TensorRef){-1, 0};
  if (t->dtype != DT_F32) return TEQ_OK;
  if (tensor_numel(t) == 1 && t->shape.ndim <= s_in.ndim) {
    *out = c;
    return TEQ_OK;
  }
  if (shape_broadcast(&t->shape, &s_out, &spread, NULL) || !shape_equal(&spread, &s_out))
    return TEQ_OK;
  MovedConst *known = moved_find(p->cache, t, ln, &s_in);
  if (known) {
    if (!known->moved) return TEQ_OK;
    int id = graph_add_const(g, g->nodes[c.node].name, tensor_ref(known->moved), NULL);
    if (id < 0) return id;
    *out = (TensorRef){id, 0};
    return TEQ_OK;
  }
  Node back = *ln; /* L's inverse */
  if (ln->kind == OP_RESHAPE) {
    param_set_ints(&back.params, 0, s_in.d, s_in.ndim);
  } else {
    int64_t perm[TEQ_MAX_DIMS], inv[TEQ_MAX_DIMS];
    perm_of(ln, s_in.ndim, perm);
    for (int i = 0; i < s_in.ndim; i++) inv[perm[i]] = i;
    param_set_ints(&back.params, 0, inv, s_in.ndim);
  }
  Node lcopy = *ln;
  Graph *m = graph_new();
  int rc = m ? TEQ_OK : TEQ_ERR_NOMEM, k = -1, c2 = -1, again = -1;
  /* c of L's whole output shape: L^-1 moves each element back where it
   * came from, and L takes it there again; spread, it must be checked */
  bool whole = shape_equal(&t->shape, &s_out);
  if (rc == TEQ_OK && (k = graph_add_const(m, NULL, tensor_ref(t), NULL)) < 0) rc = k;
  if (rc == TEQ_OK && !whole) {
    Params e;
    params_default(OP_EXPAND, &e);
    param_set_ints(&e, 0, s_out.d, s_out.ndim);
    k = graph_add_node(m, OP_EXPAND, &(TensorRef){k, 0}, 1, 1, &e, NULL, NULL);
    if (k < 0) rc = k == TEQ_ERR_NOMEM ? k : TEQ_ERR_INTERNAL;
  }
  if (rc == TEQ_OK) rc = add_like(m, &back, &(TensorRef){k, 0}, 1, &c2);
  if (rc == TEQ_OK && c2 >= 0 && !whole)
    rc = add_like(m, &lcopy, &(TensorRef){c2, 0}, 1, &again);
  Tensor *v[3] = {NULL, NULL, NULL};
  if (rc == TEQ_OK && c2 >= 0 && (whole || again >= 0)) {
    TensorRef outs[3] = {{c2, 0}, {again, 0}, {k, 0}};
    for (int i = 0; i < (whole ? 1 : 3) && rc == TEQ_OK; i++)
      if (graph_add_output(m, outs[i], NULL, NULL) < 0) rc = TEQ_ERR_NOMEM;
    if (rc == TEQ_OK && exec_run(m, EXEC_F32, NULL, v, NULL) == TEQ_OK) {
      bool same = whole || (shape_equal(&v[1]->shape, &v[2]->shape) &&
                            !memcmp(v[1]->data, v[2]->data, tensor_bytes(v[2])));
      moved_put(p->cache, t, &lcopy, &s_in, same ? v[0] : NULL);
      if (same) {
        int id = graph_add_const(g, g->nodes[c.node].name, tensor_ref(v[0]), NULL);
        if (id < 0) rc = id;
        else *out = (TensorRef){id, 0};
      }
      for (int i = 0; i < 3; i++) tensor_unref(v[i]);
    }
  }
  graph_free(m);
  return rc;
}

/* f(L(y1), ..., c, ...) = L(f(y1, ..., c2, ...)) for an element-wise f
 * whose inputs are each L (the same R/T, read by f alone) or a constant. */
static int try_move(Post *p, int f, bool *done) {
  Graph *g = p->g;
  const Node *fn = &g->nodes[f];
  unsigned flags = op_def(fn->kind)->flags;
  if (!(flags & OPF_ELEMENTWISE) ||
      (flags & (OPF_LAYOUT_ONLY | OPF_SOURCE | OPF_OPAQUE | OPF_NOOP | OPF_INT64_OUT)) ||
      fn->n_out != 1 || fn->n_in > MAX_EW_IN || !uses_of(p, f))
    return TEQ_OK;
  int l = -1;
  for (int j = 0; j < fn->n_in && l < 0; j++)
    if (is_rt(&g->nodes[fn->in[j].node])) l = fn->in[j].node;
  if (l < 0) return TEQ_OK;
  const Node *ln = &g->nodes[l];
  const Shape s_in = *graph_shape(g, ln->in[0]);
  if (!shape_is_known(&s_in) || !shape_equal(&fn->out[0], &ln->out[0]))
    return TEQ_OK; /* unknown, or f spreads L(y) out */
  /* Check every input before any node is added. */
  for (int j = 0; j < fn->n_in; j++) {
    const Node *a = &g->nodes[fn->in[j].node];
    if (a->kind == OP_CONST) continue;
    if (a->kind != ln->kind || memcmp(&a->params, &ln->params, sizeof a->params) ||
        !shape_equal(graph_shape(g, a->in[0]), &s_in))
      return TEQ_OK;
    int reads = 0;
    for (int k = 0; k < fn->n_in; k++) reads += fn->in[k].node == fn->in[j].node;
    if (uses_of(p, fn->in[j].node) != reads) return TEQ_OK; /* L is read elsewhere too */
  }
  int n_in = fn->n_in;
  TensorRef in[MAX_EW_IN], was[MAX_EW_IN];
  memcpy(was, fn->in, (size_t)n_in * sizeof *was);
  for (int j = 0; j < n_in; j++) {
    const Node *a = &g->nodes[was[j].node];
    if (a->kind != OP_CONST) {
      in[j] = a->in[0];
      continue;
    }
    int rc = side_constant(p, was[j], l, &in[j]);
    if (rc || in[j].node < 0) return rc;
  }
  Node fcopy = g->nodes[f], lcopy = g->nodes[l];
  int f2 = -1, l2 = -1;
  int rc = add_like(g, &fcopy, in, n_in, &f2);
  if (rc || f2 < 0) return rc;
  if (!shape_equal(&g->nodes[f2].out[0], &s_in)) return TEQ_OK; /* left dead, removed later */
  if ((rc = add_like(g, &lcopy, &(TensorRef){f2, 0}, 1, &l2)) || l2 < 0) return rc;
  graph_replace_uses(g, (TensorRef){f, 0}, (TensorRef){l2, 0});
  p->st.moved++;
  *done = true;
  return TEQ_OK;
}

/* ---- hoisting ---- */

/* Readers of output k of node id. */
static int32_t uses_at(const Post *p, int id, int k) { return p->uses[p->off[id] + k]; }

/* The single reader of output k of node id, or -1 (once readers has run). */
static int sole_reader(const Post *p, int id, int k) {
  if (id >= p->n || uses_at(p, id, k) != 1) return -1;
  int32_t at = p->off[id] + k;
  return p->rd_off[at + 1] > p->rd_off[at] ? p->rd[p->rd_off[at]] : -1; /* -1: a graph output */
}

enum { MAX_PIECES = 8, MAX_CHAIN_NODES = 8 };

/* Whether the hoisted form computes what the split form does: each
 * old[k] and new[k] (nodes among ids, both forms reading x) give the same
 * tensor on x's index map. */
static int hoist_holds(const Graph *g, TensorRef x, const int32_t *ids, int n_ids,
                       const int32_t *old, const int32_t *new, int n, bool *yes) {
  int32_t *outs = malloc((size_t)(2 * n) * sizeof *outs);
  Tensor **vals = calloc((size_t)(2 * n), sizeof *vals);
  int rc = outs && vals ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int k = 0; k < n && rc == TEQ_OK; k++) outs[2 * k] = old[k], outs[2 * k + 1] = new[k];
  if (rc == TEQ_OK) rc = on_index_map(g, x, ids, n_ids, outs, 2 * n, vals);
  bool same = rc == TEQ_OK && vals[0];
  for (int k = 0; k < n && same; k++)
    same = shape_equal(&vals[2 * k]->shape, &vals[2 * k + 1]->shape) &&
           !memcmp(vals[2 * k]->data, vals[2 * k + 1]->data, tensor_bytes(vals[2 * k]));
  *yes = same;
  for (int k = 0; vals && k < 2 * n; k++) tensor_unref(vals[k]);
  free(outs), free(vals);
  return rc;
}

/* Whether slice n of a tensor of shape xs takes the range [*b, *e) of its
 * last axis, step 1, and the whole of every other axis. */
static bool last_axis_range(const Node *n, const Shape *xs, int64_t *b, int64_t *e) {
  const ParamValue *st = &n->params.v[param_index(OP_SLICE, "starts")],
                   *en = &n->params.v[param_index(OP_SLICE, "ends")],
                   *sp = &n->params.v[param_index(OP_SLICE, "steps")];
  int r = xs->ndim, last = r - 1;
  if (st->n != r || en->n != r || sp->n != r || sp->i[last] != 1 || en->i[last] <= st->i[last])
    return false;
  for (int i = 0; i < last; i++)
    if (st->i[i] != 0 || en->i[i] != xs->d[i] || sp->i[i] != 1) return false;
  *b = st->i[last], *e = en->i[last];
  return true;
}

/* Whether gather n of g takes one constant index k along an axis of its
 * data (the registry's op_gather_one). */
static bool gather_one(const Graph *g, const Node *n, int64_t *axis, int64_t *k) {
  const Node *c = &g->nodes[n->in[1].node];
  return c->kind == OP_CONST && op_gather_one(n, graph_shape(g, n->in[0]), c->value, axis, k);
}

/* The pieces that hoisting starts from, in order, and x, the tensor whose
 * last axis they cut:
 *   - the outputs of a split along x's last axis;
 *   - slices of x each of one range of its last axis (whole along the
 *     others, step 1) that together cover it, as PyTorch 1.x exports
 *     attention's Q, K and V;
 *   - gathers of the indices 0, 1, ... of one axis of a tensor that R/T
 *     made of x, as PyTorch 2.x exports them (x [L, B, 3E] reshaped to
 *     [L, B, 3, E], its 3 brought first, each of Q, K and V selected);
 *     pre[0..*n_pre) are those R/T, in order.
 * Node id is the split, or the slice or gather of the first piece (so that
 * each group is seen once). 0 pieces when it is none of these; a negative
 * error code when memory runs out. */
static int pieces_of(Post *p, int id, TensorRef *x, TensorRef *piece, int32_t *pre,
                     int *n_pre) {
  const Graph *g = p->g;
  const Node *n = &g->nodes[id];
  *n_pre = 0;
  *x = n->n_in ? n->in[0] : (TensorRef){-1, 0};
  bool cuts = n->kind == OP_SPLIT || n->kind == OP_GATHER || n->kind == OP_SLICE;
  if (!n->n_in || id >= p->n || !cuts) return 0;
  int rc = readers(p);
  if (rc) return rc;
  /* the readers of x, among them n */
  const int32_t *rx = p->rd + p->rd_off[p->off[x->node] + x->out];
  int32_t n_rx = p->rd_off[p->off[x->node] + x->out + 1] - p->rd_off[p->off[x->node] + x->out];
  const Shape *xs = graph_shape(g, *x);
  int r = xs->ndim, last = r - 1;
  if (r < 2 || !shape_is_known(xs)) return 0;
  if (n->kind == OP_SPLIT) {
    if (param_int(&n->params, param_index(OP_SPLIT, "axis")) != last || n->n_out > MAX_PIECES)
      return 0;
    for (int k = 0; k < n->n_out; k++) piece[k] = (TensorRef){id, k};
    return n->n_out;
  }
  if (n->kind == OP_GATHER) {
    int64_t axis, at;
    if (!gather_one(g, n, &axis, &at) || at != 0 || xs->d[axis] > MAX_PIECES) return 0;
    int k = 0;
    for (; k < xs->d[axis]; k++) { /* the gather of each index */
      int found = -1;
      for (int32_t q = 0; q < n_rx && found < 0; q++) {
        const Node *c = &g->nodes[rx[q]];
        int64_t a2, i2;
        if (c->kind == OP_GATHER && c->in[0].node == x->node && c->in[0].out == x->out &&
            gather_one(g, c, &a2, &i2) && a2 == axis && i2 == k)
          found = rx[q];
      }
      if (found < 0) return 0;
      piece[k] = (TensorRef){found, 0};
    }
    /* back through the R/T that made the gathered tensor */
    int32_t back[MAX_CHAIN];
    int len = 0;
    while (len < MAX_CHAIN && is_rt(&g->nodes[x->node])) {
      back[len++] = x->node;
      *x = g->nodes[x->node].in[0];
    }
    if (!len || is_rt(&g->nodes[x->node]) || graph_shape(g, *x)->ndim < 2) return 0;
    for (int i = 0; i < len; i++) pre[i] = back[len - 1 - i];
    *n_pre = len;
    return k >= 2 ? k : 0;
  }
  if (n->kind != OP_SLICE) return 0;
  int64_t b, e;
  if (!last_axis_range(n, xs, &b, &e) || b != 0) return 0;
  /* the slices of x along its last axis, by where they start */
  int64_t at = 0;
  int k = 0;
  while (at < xs->d[last]) {
    int found = -1;
    for (int32_t q = 0; q < n_rx && found < 0; q++) {
      const Node *c = &g->nodes[rx[q]];
      if (c->kind == OP_SLICE && c->in[0].node == x->node && c->in[0].out == x->out &&
          last_axis_range(c, xs, &b, &e) && b == at)
        found = rx[q];
    }
    if (found < 0 || k == MAX_PIECES || (k == 0 && found != id)) return 0;
    last_axis_range(&g->nodes[found], xs, &b, &e);
    piece[k++] = (TensorRef){found, 0};
    at = e;
  }
  return at == xs->d[last] && k >= 2 ? k : 0;
}

/* pieces of x [..., N] along its last axis -> per piece reshape [M, h_k,
 * d] (M the leading extents) -> transpose (1 0 2) or (1 2 0), with
 * element-wise operators of one tensor anywhere between (carried along,
 * after the new layout): see the file's head. */
static int try_hoist(Post *p, int sp, bool *done) {
  Graph *g = p->g;
  TensorRef x, piece[MAX_PIECES];
  int32_t pre[MAX_CHAIN];
  int n_pre;
  int n = pieces_of(p, sp, &x, piece, pre, &n_pre);
  if (n < 2) return n < 0 ? n : TEQ_OK;
  const Shape xs = *graph_shape(g, x);
  int64_t lead = shape_numel(&xs) / xs.d[xs.ndim - 1];
  /* old[k]: piece k's chain, in order, its transpose last */
  int32_t old[MAX_PIECES][MAX_CHAIN_NODES];
  int n_old[MAX_PIECES];
  bool keys_last[MAX_PIECES];
  int64_t heads = 0, d = -1;
  for (int k = 0; k < n; k++) {
    n_old[k] = 0;
    int r = sole_reader(p, piece[k].node, piece[k].out);
    for (; r >= 0 && scalar_wise(g, &g->nodes[r]) >= 0 && uses_of(p, r); r = sole_reader(p, r, 0))
      if (n_old[k] < MAX_CHAIN_NODES - 2) old[k][n_old[k]++] = r;
      else return TEQ_OK;
    if (r < 0 || g->nodes[r].kind != OP_RESHAPE || !uses_of(p, r)) return TEQ_OK;
    const Shape *rs = &g->nodes[r].out[0];
    if (rs->ndim != 3 || rs->d[0] != lead || (d >= 0 && rs->d[2] != d)) return TEQ_OK;
    d = rs->d[2];
    heads += rs->d[1];
    old[k][n_old[k]++] = r;
    int t = sole_reader(p, r, 0);
    for (; t >= 0 && scalar_wise(g, &g->nodes[t]) >= 0 && uses_of(p, t); t = sole_reader(p, t, 0))
      if (n_old[k] < MAX_CHAIN_NODES - 1) old[k][n_old[k]++] = t;
      else return TEQ_OK;
    if (t < 0 || g->nodes[t].kind != OP_TRANSPOSE || !uses_of(p, t)) return TEQ_OK;
    int64_t perm[3];
    perm_of(&g->nodes[t], 3, perm);
    bool first = perm[0] == 1 && perm[1] == 0 && perm[2] == 2;
    bool last = perm[0] == 1 && perm[1] == 2 && perm[2] == 0;
    if (!first && !last) return TEQ_OK;
    old[k][n_old[k]++] = t;
    keys_last[k] = last;
  }
  if (heads * d != xs.d[xs.ndim - 1]) return TEQ_OK;
  /* reshape(x, [M, heads, d]) -> transpose (1 0 2) -> split along axis 0 */
  Params rp, tp, spp, swap;
  params_default(OP_RESHAPE, &rp);
  param_set_ints(&rp, param_index(OP_RESHAPE, "shape"), (int64_t[]){lead, heads, d}, 3);
  params_default(OP_TRANSPOSE, &tp);
  param_set_ints(&tp, param_index(OP_TRANSPOSE, "perm"), (int64_t[]){1, 0, 2}, 3);
  params_default(OP_TRANSPOSE, &swap);
  param_set_ints(&swap, param_index(OP_TRANSPOSE, "perm"), (int64_t[]){0, 2, 1}, 3);
  params_default(OP_SPLIT, &spp);
  param_set_int(&spp, param_index(OP_SPLIT, "axis"), 0);
  int64_t sizes[MAX_PIECES];
  for (int k = 0; k < n; k++) sizes[k] = g->nodes[old[k][n_old[k] - 1]].out[0].d[0];
  param_set_ints(&spp, param_index(OP_SPLIT, "sizes"), sizes, n);
  int r2 = graph_add_node(g, OP_RESHAPE, &x, 1, 1, &rp, NULL, NULL);
  int t2 = r2 < 0 ? r2 : graph_add_node(g, OP_TRANSPOSE, &(TensorRef){r2, 0}, 1, 1, &tp, NULL, NULL);
  int s2 = t2 < 0 ? t2 : graph_add_node(g, OP_SPLIT, &(TensorRef){t2, 0}, 1, n, &spp, NULL, NULL);
  if (s2 == TEQ_ERR_NOMEM) return TEQ_ERR_NOMEM;
  if (s2 < 0) return TEQ_OK; /* left dead, removed later */
  /* fresh[k]: what replaces piece k's chain: K's transpose of its last two
   * axes, then the element-wise operators again; now[k] its result */
  int32_t fresh[MAX_PIECES][MAX_CHAIN_NODES];
  int n_fresh[MAX_PIECES];
  TensorRef now[MAX_PIECES];
  for (int k = 0; k < n; k++) {
    n_fresh[k] = 0;
    now[k] = (TensorRef){s2, k};
    for (int e = keys_last[k] ? -1 : 0; e < n_old[k] - 1; e++) {
      int id = -1, rc = TEQ_OK;
      if (e < 0) {
        id = graph_add_node(g, OP_TRANSPOSE, &now[k], 1, 1, &swap, NULL, NULL);
        if (id == TEQ_ERR_NOMEM) return id;
      } else if (g->nodes[old[k][e]].kind == OP_RESHAPE) {
        continue;
      } else {
        Node like = g->nodes[old[k][e]];
        TensorRef ins[MAX_EW_IN];
        int data = scalar_wise(g, &like);
        for (int j = 0; j < like.n_in; j++) ins[j] = j == data ? now[k] : like.in[j];
        if ((rc = add_like(g, &like, ins, like.n_in, &id))) return rc;
        if (id >= 0 && !shape_equal(&g->nodes[id].out[0], graph_shape(g, now[k]))) id = -1;
      }
      if (id < 0) return TEQ_OK;
      fresh[k][n_fresh[k]++] = id;
      now[k] = (TensorRef){id, 0};
    }
  }
  /* Both forms, compared piece by piece (a piece read straight from the
   * new split through a reshape to its own shape: the check reads output
   * 0 of each node). */
  int32_t ids[MAX_CHAIN + MAX_PIECES * (2 * MAX_CHAIN_NODES + 2) + 4], check_old[MAX_PIECES],
      check_new[MAX_PIECES];
  int n_ids = 0;
  for (int i = 0; i < n_pre; i++) ids[n_ids++] = pre[i];
  for (int k = 0; k < n; k++) /* the split once, or each slice or gather */
    if (k == 0 || piece[k].node != piece[k - 1].node) ids[n_ids++] = piece[k].node;
  for (int k = 0; k < n; k++)
    for (int e = 0; e < n_old[k]; e++) ids[n_ids++] = old[k][e];
  ids[n_ids++] = r2, ids[n_ids++] = t2, ids[n_ids++] = s2;
  for (int k = 0; k < n; k++) {
    for (int e = 0; e < n_fresh[k]; e++) ids[n_ids++] = fresh[k][e];
    int id = now[k].node;
    if (id == s2) {
      Params same;
      params_default(OP_RESHAPE, &same);
      const Shape *ps = &g->nodes[old[k][n_old[k] - 1]].out[0];
      param_set_ints(&same, param_index(OP_RESHAPE, "shape"), ps->d, ps->ndim);
      id = graph_add_node(g, OP_RESHAPE, &now[k], 1, 1, &same, NULL, NULL);
      if (id == TEQ_ERR_NOMEM) return id;
      if (id < 0) return TEQ_OK;
      ids[n_ids++] = id;
    }
    check_old[k] = old[k][n_old[k] - 1], check_new[k] = id;
  }
  bool yes = false;
  int rc = hoist_holds(g, x, ids, n_ids, check_old, check_new, n, &yes);
  if (rc || !yes) return rc; /* the new nodes are left dead, removed later */
  for (int k = 0; k < n; k++) graph_replace_uses(g, (TensorRef){old[k][n_old[k] - 1], 0}, now[k]);
  p->st.hoisted++;
  *done = true;
  return TEQ_OK;
}

/* ---- splices it leaves alone ---- */

/* Each rewrite above acts at an R/T: the end of a chain of them that may
 * be the identity (its first input of the last one's output shape), one
 * reading another of its kind (fusion), one read by an element-wise
 * operator whose every other input is a constant or an R/T (motion). If g
 * is left alone, a rewrite of the spliced graph must involve a node of
 * sub, or one of g's whose readers sub changed (an R/T read by the part
 * sub replaces may be left with an element-wise reader alone). Each such
 * meeting is refused here, whether or not the rewrite would then find the
 * R/T alike or the chain the identity: refusing more is safe. Hoisting
 * acts at a split or slices: an R/T of sub reading one or a reshape of one,
 * an output of sub or a tensor it reads that is either, is refused too. */

/* The node computing node id of sub in the spliced graph: sub's own, or
 * g's for an input of sub. */
static const Node *spliced(const Graph *g, const Graph *sub, const TensorRef *in, int id) {
  for (int k = 0; k < sub->n_inputs && sub->nodes[id].kind == OP_INPUT; k++)
    if (sub->inputs[k] == id) return &g->nodes[in[k].node];
  return &sub->nodes[id];
}

static bool is_cut(const Node *n) {
  return n->kind == OP_SPLIT || n->kind == OP_SLICE || n->kind == OP_GATHER;
}

/* Whether node id of sub (spliced into g) is a split, a slice or a
 * gather, or a reshape of one: a piece hoisting may start from. */
static bool near_split(const Graph *g, const Graph *sub, const TensorRef *in, int id) {
  const Node *n = spliced(g, sub, in, id);
  if (is_cut(n)) return true;
  if (n->kind != OP_RESHAPE) return false;
  if (n != &sub->nodes[id]) return is_cut(&g->nodes[n->in[0].node]); /* g's own */
  return is_cut(spliced(g, sub, in, n->in[0].node));
}

/* Whether an element-wise operator might move an R/T among its inputs:
 * none of its inputs is computed by anything but an R/T or a constant. */
static bool might_move(const Node *const *inputs, int n_in) {
  for (int j = 0; j < n_in; j++)
    if (!is_rt(inputs[j]) && inputs[j]->kind != OP_CONST) return false;
  return true;
}

bool pet_post_splice_quiet(const Graph *g, const Graph *sub, const TensorRef *in,
                           const TensorRef *out) {
  const Node *inputs[MAX_EW_IN];
  for (int k = 0; k < sub->n_inputs; k++)
    if (is_rt(&g->nodes[in[k].node])) return false;
  for (int id = 0; id < sub->n_nodes; id++) {
    const Node *n = &sub->nodes[id];
    if (is_rt(n) && near_split(g, sub, in, n->in[0].node)) return false;
    if (is_rt(n)) {
      /* a pair to fuse, or a chain ending here that may be an inverse group */
      if (sub->nodes[n->in[0].node].kind == n->kind) return false;
      for (const Node *a = n; is_rt(a); a = &sub->nodes[a->in[0].node])
        if (shape_equal(graph_shape(sub, a->in[0]), &n->out[0])) return false;
    } else if (op_def(n->kind)->flags & OPF_ELEMENTWISE) {
      if (n->n_in > MAX_EW_IN) return false;
      for (int j = 0; j < n->n_in; j++) inputs[j] = spliced(g, sub, in, n->in[j].node);
      if (might_move(inputs, n->n_in)) return false;
    }
  }
  /* g's readers of a split or slice of sub, or of a reshape of one; g's
   * splits and slices whose readers sub changes (those it reads) */
  for (int o = 0; o < sub->n_outputs; o++)
    if (near_split(g, sub, in, sub->outputs[o].node)) return false;
  for (int k = 0; k < sub->n_inputs; k++)
    if (near_split(g, sub, in, sub->inputs[k])) return false;
  /* g's readers of an R/T of sub */
  for (int o = 0; o < sub->n_outputs; o++) {
    if (!is_rt(&sub->nodes[sub->outputs[o].node])) continue;
    for (int id = 0; id < g->n_nodes; id++) {
      const Node *n = &g->nodes[id];
      bool ew = (op_def(n->kind)->flags & OPF_ELEMENTWISE) != 0;
      bool gather = n->kind == OP_GATHER; /* hoisting follows its data back through R/T */
      if (!is_rt(n) && !ew && !gather) continue;
      bool reads = false;
      for (int j = 0; j < n->n_in && !reads; j++)
        reads = n->in[j].node == out[o].node && n->in[j].out == out[o].out;
      if (!reads) continue;
      if (is_rt(n) || gather || n->n_in > MAX_EW_IN) return false;
      for (int j = 0; j < n->n_in; j++) {
        inputs[j] = &g->nodes[n->in[j].node];
        for (int q = 0; q < sub->n_outputs; q++) /* read from sub's output instead */
          if (n->in[j].node == out[q].node && n->in[j].out == out[q].out)
            inputs[j] = spliced(g, sub, in, sub->outputs[q].node);
      }
      if (might_move(inputs, n->n_in)) return false;
    }
  }
  return true;
}

/* ---- the pass ---- */

typedef int (*Rewrite)(Post *p, int id, bool *done);

int pet_post_optimize(Graph **gp, PetPostStats *stats, Diag *d) {
  return pet_post_optimize_cached(gp, NULL, stats, d);
}

int pet_post_optimize_cached(Graph **gp, PetPostCache *cache, PetPostStats *stats, Diag *d) {
  static const Rewrite rewrites[] = {try_inverse, try_fuse, try_move, try_hoist};
  Verdicts *own = cache ? NULL : calloc(1, sizeof *own);
  Post p = {.g = *gp, .cache = cache, .chains = cache ? &cache->chains : own};
  int rc = p.chains ? refresh(&p) : TEQ_ERR_NOMEM;
  int32_t n0 = p.g->n_nodes;
  bool changed = false;
  /* Each rewrite removes an operator or moves an R/T past one, so there
   * are fewer rewrites than (nodes)^2; the bound only guards against a bug
   * turning that into a loop. */
  int64_t limit = (int64_t)n0 * n0 + 64;
  for (int round = 0; rc == TEQ_OK && round < limit; round++) {
    bool done = false;
    for (size_t r = 0; r < sizeof rewrites / sizeof *rewrites && !done && rc == TEQ_OK; r++)
      for (int id = 0; id < p.g->n_nodes && !done && rc == TEQ_OK; id++)
        rc = rewrites[r](&p, id, &done);
    if (rc || !done) break;
    changed = true;
    int removed = graph_remove_dead(p.g);
    rc = removed < 0 ? removed : refresh(&p);
  }
  /* A motion that gave up leaves its nodes behind, read by nothing. */
  if (rc == TEQ_OK && !changed) graph_truncate(p.g, n0);
  if (rc == TEQ_OK && changed) {
    int removed = graph_remove_dead(p.g);
    if (removed < 0) {
      rc = removed;
    } else if (graph_check(p.g, d) != TEQ_OK) {
      diag_error(d, "pet_post_optimize: the rewritten graph fails graph_check");
      rc = TEQ_ERR_INTERNAL;
    }
  }
  free(p.uses), free(p.off), free(p.rd), free(p.rd_off);
  free(own);
  if (rc == TEQ_OK && stats) *stats = p.st;
  return rc;
}
