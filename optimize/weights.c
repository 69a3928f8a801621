/* weights.c: what depends on weights alone.
 *
 * Rewrites often leave operators whose inputs are all weights: the
 * concatenated kernel of two merged convolutions, an enlarged kernel, a
 * transposed weight matrix, a kernel plus I_conv. They run once, not per
 * inference, so the search counts them as free, and before export they are
 * computed on the CPU and replaced by constants (initializers). */
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"
#include "runtime/exec.h"
#include "runtime/plan.h"

/* Per node: every input is a weight (a constant, a constant tensor, or
 * such a node). Sources other than graph inputs are weights. */
bool *opt_weight_only(const Graph *g, const int32_t *order) {
  bool *w = calloc((size_t)g->n_nodes + 1, sizeof *w);
  if (!w) return NULL;
  for (int k = 0; k < g->n_nodes; k++) {
    int id = order[k];
    const Node *n = &g->nodes[id];
    const OpDef *def = op_def(n->kind);
    if (n->kind == OP_INPUT || n->kind == OP_OPAQUE) continue;
    if (def->flags & OPF_SOURCE) {
      w[id] = true;
      continue;
    }
    bool all = n->n_in > 0;
    for (int j = 0; j < n->n_in && all; j++) all = w[n->in[j].node];
    w[id] = all;
  }
  return w;
}

/* Both costs: with as_run, less the nodes g's producers write in place
 * and those whose values their readers read by strides, and with each
 * chain of layout operators the one gather it runs as (plan_gathers). */
static int graph_cost(CostModel *cm, const Graph *g, bool as_run, double *us,
                      int counts[COST__SOURCES], double us_by_source[COST__SOURCES], Diag *d) {
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  if (!order) return TEQ_ERR_NOMEM;
  int rc = graph_topo_order(g, order);
  bool *w = rc ? NULL : opt_weight_only(g, order);
  /* The search prices every candidate it builds here: no plan unless asked. */
  PlanAsRun ar = {0};
  if (!rc && !w) rc = TEQ_ERR_NOMEM;
  if (!rc && as_run) rc = plan_as_run(g, &ar, d);
  double total = 0;
  if (counts) memset(counts, 0, COST__SOURCES * sizeof *counts);
  if (us_by_source)
    for (int s = 0; s < COST__SOURCES; s++) us_by_source[s] = 0;
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++) {
    const Node *n = &g->nodes[id];
    PlanRun run = as_run ? plan_node_runs(g, &ar, id, w) : PLAN_RUN_KERNEL;
    if (w[id] || (op_def(n->kind)->flags & (OPF_SOURCE | OPF_NOOP)) || n->kind == OP_OPAQUE ||
        (run != PLAN_RUN_KERNEL && run != PLAN_RUN_GATHER))
      continue;
    CostEstimate e;
    if (run == PLAN_RUN_GATHER) e = cost_gather(cm, g, &ar.gathers.exits[ar.gathers.exit[id]]);
    else rc = cost_node(cm, g, id, &e, d);
    if (rc) break;
    total += e.us;
    if (counts) counts[e.source]++;
    if (us_by_source) us_by_source[e.source] += e.us;
  }
  free(order);
  free(w);
  plan_as_run_fini(&ar);
  if (rc == TEQ_OK) *us = total;
  return rc;
}

int opt_graph_cost(CostModel *cm, const Graph *g, double *us, int counts[COST__SOURCES],
                   Diag *d) {
  return graph_cost(cm, g, false, us, counts, NULL, d);
}

int opt_graph_cost_run(CostModel *cm, const Graph *g, double *us, int counts[COST__SOURCES],
                       double us_by_source[COST__SOURCES], Diag *d) {
  return graph_cost(cm, g, true, us, counts, us_by_source, d);
}

/* ---- folds remembered ---- */

/* A search finishes graph after graph that share their folded weights
 * (NasRNN's concatenated [1024, 4096] matrices in every window's bests),
 * so a fold is kept under what it computes from: the operator, its
 * parameters and its input tensors, held by reference so that no other
 * tensor takes their address meanwhile. A search keeps a few dozen
 * (NasNet-A 52, NasRNN at 16 times its steps 25), so a list will do. */
typedef struct FoldEntry {
  uint64_t hash;
  OpKind kind;
  Params params;
  int n_in, n_out;
  Tensor **in, **out; /* n_in inputs, then n_out outputs, one array */
} FoldEntry;

struct OptFoldMemo {
  FoldEntry *e;
  int n, cap;
  OptChannels *channels; /* what folding biases into convolutions read */
};

OptFoldMemo *opt_fold_memo_new(void) {
  OptFoldMemo *m = calloc(1, sizeof *m);
  if (m && !(m->channels = opt_channels_new())) {
    free(m);
    m = NULL;
  }
  return m;
}

OptChannels *opt_fold_memo_channels(OptFoldMemo *m) { return m ? m->channels : NULL; }

void opt_fold_memo_free(OptFoldMemo *m) {
  if (!m) return;
  opt_channels_free(m->channels);
  for (int i = 0; i < m->n; i++) {
    for (int j = 0; j < m->e[i].n_in + m->e[i].n_out; j++) tensor_unref(m->e[i].in[j]);
    free(m->e[i].in);
  }
  free(m->e);
  free(m);
}

static uint64_t fold_hash(const Graph *g, const Node *n) {
  uint64_t h = hash_mix(0xf01d, (uint64_t)n->kind);
  h = hash_bytes(h, &n->params, sizeof n->params);
  for (int j = 0; j < n->n_in; j++)
    h = hash_mix(h, (uint64_t)(uintptr_t)g->nodes[n->in[j].node].value);
  return h;
}

/* The entry for node n of g (every input a constant), or NULL. */
static const FoldEntry *fold_find(const OptFoldMemo *m, const Graph *g, const Node *n,
                                  uint64_t h) {
  for (int i = 0; m && i < m->n; i++) {
    const FoldEntry *e = &m->e[i];
    if (e->hash != h || e->kind != n->kind || e->n_in != n->n_in || e->n_out != n->n_out ||
        memcmp(&e->params, &n->params, sizeof n->params))
      continue;
    bool same = true;
    for (int j = 0; j < n->n_in && same; j++) same = e->in[j] == g->nodes[n->in[j].node].value;
    if (same) return e;
  }
  return NULL;
}

static void fold_keep(OptFoldMemo *m, const Graph *g, const Node *n, uint64_t h, Tensor **vals) {
  if (m->n == m->cap) {
    int cap = m->cap ? 2 * m->cap : 32;
    FoldEntry *e = realloc(m->e, (size_t)cap * sizeof *e);
    if (!e) return; /* not remembered: folded again next time */
    m->e = e, m->cap = cap;
  }
  Tensor **t = malloc((size_t)(n->n_in + n->n_out) * sizeof *t);
  if (!t) return;
  for (int j = 0; j < n->n_in; j++) t[j] = tensor_ref(g->nodes[n->in[j].node].value);
  for (int o = 0; o < n->n_out; o++) t[n->n_in + o] = tensor_ref(vals[o]);
  m->e[m->n++] = (FoldEntry){.hash = h, .kind = n->kind, .params = n->params, .n_in = n->n_in,
                             .n_out = n->n_out, .in = t, .out = t + n->n_in};
}

/* Runs node n of g (all inputs constants) alone: vals[o] its outputs. */
static int run_alone(const Graph *g, const Node *n, Tensor **vals, Diag *d) {
  Graph *one = graph_new();
  TensorRef *in = malloc(((size_t)n->n_in + 1) * sizeof *in);
  int rc = one && in ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int j = 0; j < n->n_in && rc == TEQ_OK; j++) {
    const Node *src = &g->nodes[n->in[j].node];
    int cid = graph_add_const(one, src->name, tensor_ref(src->value), d);
    if (cid < 0) rc = cid;
    in[j] = (TensorRef){cid, 0};
  }
  int nid = rc ? rc : graph_add_node(one, n->kind, in, n->n_in, n->n_out, &n->params, n->name, d);
  if (nid < 0) rc = nid;
  for (int o = 0; o < n->n_out && rc == TEQ_OK; o++) {
    int r = graph_add_output(one, (TensorRef){nid, o}, NULL, d);
    if (r < 0) rc = r;
  }
  if (rc == TEQ_OK) rc = exec_run(one, EXEC_F32, NULL, vals, d);
  graph_free(one);
  free(in);
  return rc;
}

/* Evaluates node id of g (all inputs constants) into new constants, or
 * takes them from memo (optional), or with unread, makes constants of its
 * shapes that hold no values (tensor_new_unbacked): n_out of them, added
 * one after another from *first on. Its readers are left to the caller. */
static int fold_node(Graph *g, int id, OptFoldMemo *memo, bool unread, int32_t *first,
                     Diag *d) {
  const Node *n = &g->nodes[id];
  const int n_out = n->n_out;
  uint64_t h = memo && !unread ? fold_hash(g, n) : 0;
  const FoldEntry *hit = memo && !unread ? fold_find(memo, g, n, h) : NULL;
  Tensor **vals = calloc((size_t)n_out + 1, sizeof *vals);
  if (!vals) return TEQ_ERR_NOMEM;
  int rc = TEQ_OK;
  if (unread) {
    for (int o = 0; o < n_out && rc == TEQ_OK; o++)
      if (!(vals[o] = tensor_new_unbacked(n->dtype, &n->out[o]))) rc = TEQ_ERR_NOMEM;
  } else if (hit) {
    for (int o = 0; o < n_out; o++) vals[o] = tensor_ref(hit->out[o]);
  } else {
    rc = run_alone(g, n, vals, d);
    if (rc == TEQ_OK && memo) fold_keep(memo, g, n, h, vals);
  }
  *first = g->n_nodes;
  for (int o = 0; o < n_out && rc == TEQ_OK; o++) { /* graph_add_const may move g->nodes */
    char name[64];
    snprintf(name, sizeof name, "%s_w%d", g->nodes[id].name ? g->nodes[id].name : "folded", o);
    int cid = graph_add_const(g, name, vals[o], d); /* takes the reference */
    vals[o] = NULL;
    if (cid < 0) rc = cid;
  }
  for (int o = 0; vals && o < n_out; o++) tensor_unref(vals[o]);
  free(vals);
  return rc;
}

/* Whether input j of node n is an operand of a contraction: a
 * multi-linear operator that computes (neither element-wise nor a layout),
 * at one of its first two inputs, the ones it is multi-linear in (a
 * product's two, a convolution's input and kernel; a bias or a residual
 * after them makes it affine). */
static bool contraction_operand(const Node *n, int j) {
  unsigned f = op_def(n->kind)->flags;
  return j < 2 && (f & OPF_MULTILINEAR) && !(f & (OPF_ELEMENTWISE | OPF_LAYOUT_ONLY));
}

/* Per node of g: a weight-only node whose values nothing reads while a
 * graph is finished and priced: it is no graph output, and each reader is
 * a contraction of activations (contraction_operand) or such a node. The
 * passes after the fold read the values of biases and scales (the
 * operands of element-wise operators, a convolution's bias), of a
 * gather's indices and of constants moved through a layout; costs depend
 * on shapes alone. NULL when out of memory. */
static bool *values_unread(const Graph *g) {
  int n = g->n_nodes;
  int32_t *order = malloc(((size_t)n + 1) * sizeof *order);
  bool *w = NULL, *unread = calloc((size_t)n + 1, sizeof *unread);
  bool *read = calloc((size_t)n + 1, sizeof *read), *has_reader = calloc((size_t)n + 1, 1);
  bool ok = order && unread && read && has_reader && graph_topo_order(g, order) == TEQ_OK &&
            (w = opt_weight_only(g, order));
  for (int i = 0; ok && i < g->n_outputs; i++) read[g->outputs[i].node] = true;
  /* Readers after what they read: every reader of a node is decided
   * before the node is. */
  for (int k = n - 1; ok && k >= 0; k--) {
    int id = order[k];
    const Node *nd = &g->nodes[id];
    unread[id] = w[id] && !(op_def(nd->kind)->flags & OPF_SOURCE) && has_reader[id] && !read[id];
    for (int j = 0; j < nd->n_in; j++) {
      int src = nd->in[j].node;
      has_reader[src] = true;
      /* A weight computed by value needs its inputs' values too. */
      bool blind = unread[id] || (!w[id] && contraction_operand(nd, j));
      if (!blind) read[src] = true;
    }
  }
  free(order), free(w), free(read), free(has_reader);
  if (!ok) free(unread);
  return ok ? unread : NULL;
}

static int fold_weights(Graph *g, OptFoldMemo *memo, bool for_price, int *n_folded, Diag *d) {
  int folded = 0, rc = TEQ_OK;
  bool *unread = for_price ? values_unread(g) : NULL;
  if (for_price && !unread) return TEQ_ERR_NOMEM;
  int n_first = g->n_nodes; /* unread covers the nodes g had */
  /* Folding one node makes its readers' inputs constants: sweep until
   * nothing is left. Each sweep folds what reads constants alone (or, for
   * a price, any weight whose values go unread), then points every reader
   * at the new constants in one pass over the graph (a pass per fold was
   * quadratic in a long model's weights). */
  for (bool again = true; again && rc == TEQ_OK;) {
    again = false;
    int n = g->n_nodes;
    int32_t *first = malloc(((size_t)n + 1) * sizeof *first); /* -1: not folded */
    if (!first) {
      rc = TEQ_ERR_NOMEM;
      break;
    }
    for (int id = 0; id < n && rc == TEQ_OK; id++) {
      first[id] = -1;
      const Node *nd = &g->nodes[id];
      const OpDef *def = op_def(nd->kind);
      if (nd->kind == OP_INPUT || nd->kind == OP_CONST || nd->kind == OP_OPAQUE) continue;
      if (def->flags & OPF_NOOP) continue;
      bool skip = unread && id < n_first && unread[id];
      bool all = true;
      for (int j = 0; j < nd->n_in && all && !skip; j++)
        all = g->nodes[nd->in[j].node].kind == OP_CONST;
      if (!all) continue;
      rc = fold_node(g, id, memo, skip, &first[id], d);
      if (rc == TEQ_OK) folded++, again = true;
    }
    for (int i = 0; i < g->n_nodes && rc == TEQ_OK && again; i++)
      for (int j = 0; j < g->nodes[i].n_in; j++) {
        TensorRef *r = &g->nodes[i].in[j];
        if (r->node < n && first[r->node] >= 0) *r = (TensorRef){first[r->node] + r->out, 0};
      }
    for (int i = 0; i < g->n_outputs && rc == TEQ_OK && again; i++) {
      TensorRef *r = &g->outputs[i];
      if (r->node < n && first[r->node] >= 0) *r = (TensorRef){first[r->node] + r->out, 0};
    }
    free(first);
    if (rc == TEQ_OK && again) {
      int r = graph_remove_dead(g);
      if (r < 0) rc = r;
      /* Node ids moved: the unread marks are spent (every one was folded
       * in the first sweep). */
      free(unread);
      unread = NULL;
    }
  }
  free(unread);
  if (n_folded) *n_folded = folded;
  return rc;
}

int opt_fold_weights(Graph *g, int *n_folded, Diag *d) {
  return fold_weights(g, NULL, false, n_folded, d);
}

int opt_fold_weights_memo(Graph *g, OptFoldMemo *memo, int *n_folded, Diag *d) {
  return fold_weights(g, memo, false, n_folded, d);
}

int opt_fold_weights_for_price(Graph *g, OptFoldMemo *memo, int *n_folded, Diag *d) {
  return fold_weights(g, memo, true, n_folded, d);
}
