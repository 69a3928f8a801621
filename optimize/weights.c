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

/* Both costs: with as_run, less the nodes g's producers write in place. */
static int graph_cost(CostModel *cm, const Graph *g, bool as_run, double *us,
                      int counts[COST__SOURCES], double us_by_source[COST__SOURCES], Diag *d) {
  int32_t *order = malloc(((size_t)g->n_nodes + 1) * sizeof *order);
  if (!order) return TEQ_ERR_NOMEM;
  int rc = graph_topo_order(g, order);
  bool *w = rc ? NULL : opt_weight_only(g, order);
  /* The search prices every candidate it builds here: no homes unless asked. */
  int32_t *home = rc || !as_run ? NULL : graph_piece_homes(g);
  if (!rc && (!w || (as_run && !home))) rc = TEQ_ERR_NOMEM;
  double total = 0;
  if (counts) memset(counts, 0, COST__SOURCES * sizeof *counts);
  if (us_by_source)
    for (int s = 0; s < COST__SOURCES; s++) us_by_source[s] = 0;
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++) {
    const Node *n = &g->nodes[id];
    if (w[id] || (op_def(n->kind)->flags & (OPF_SOURCE | OPF_NOOP)) || n->kind == OP_OPAQUE ||
        (as_run && graph_node_in_place(g, id, home, w, NULL)))
      continue;
    CostEstimate e;
    rc = cost_node(cm, g, id, &e, d);
    if (rc) break;
    total += e.us;
    if (counts) counts[e.source]++;
    if (us_by_source) us_by_source[e.source] += e.us;
  }
  free(order);
  free(w);
  free(home);
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

/* Evaluates node id of g (all inputs constants) into new constants. */
static int fold_node(Graph *g, int id, Diag *d) {
  const Node *n = &g->nodes[id];
  const int n_out = n->n_out;
  Graph *one = graph_new();
  if (!one) return TEQ_ERR_NOMEM;
  TensorRef *in = malloc(((size_t)n->n_in + 1) * sizeof *in);
  Tensor **vals = calloc((size_t)n_out + 1, sizeof *vals);
  int rc = in && vals ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int j = 0; j < n->n_in && rc == TEQ_OK; j++) {
    const Node *src = &g->nodes[n->in[j].node];
    int cid = graph_add_const(one, src->name, tensor_ref(src->value), d);
    if (cid < 0) rc = cid;
    in[j] = (TensorRef){cid, 0};
  }
  int nid = rc ? rc : graph_add_node(one, n->kind, in, n->n_in, n->n_out, &n->params, n->name, d);
  if (nid < 0) rc = nid;
  for (int o = 0; o < n_out && rc == TEQ_OK; o++) {
    int r = graph_add_output(one, (TensorRef){nid, o}, NULL, d);
    if (r < 0) rc = r;
  }
  if (rc == TEQ_OK) rc = exec_run(one, EXEC_F32, NULL, vals, d);
  graph_free(one);
  free(in);
  for (int o = 0; o < n_out && rc == TEQ_OK; o++) { /* graph_add_const may move g->nodes */
    char name[64];
    snprintf(name, sizeof name, "%s_w%d", g->nodes[id].name ? g->nodes[id].name : "folded", o);
    int cid = graph_add_const(g, name, vals[o], d); /* takes the reference */
    vals[o] = NULL;
    if (cid < 0) {
      rc = cid;
      break;
    }
    graph_replace_uses(g, (TensorRef){id, o}, (TensorRef){cid, 0});
  }
  for (int o = 0; vals && o < n_out; o++) tensor_unref(vals[o]);
  free(vals);
  return rc;
}

int opt_fold_weights(Graph *g, int *n_folded, Diag *d) {
  int folded = 0, rc = TEQ_OK;
  /* Folding one node makes its consumers' inputs constants: repeat in
   * topological order until nothing is left. */
  for (bool again = true; again && rc == TEQ_OK;) {
    again = false;
    int n = g->n_nodes;
    for (int id = 0; id < n && rc == TEQ_OK; id++) {
      const Node *nd = &g->nodes[id];
      const OpDef *def = op_def(nd->kind);
      if (nd->kind == OP_INPUT || nd->kind == OP_CONST || nd->kind == OP_OPAQUE) continue;
      if (def->flags & OPF_NOOP) continue;
      bool all = true;
      for (int j = 0; j < nd->n_in && all; j++) all = g->nodes[nd->in[j].node].kind == OP_CONST;
      if (!all) continue;
      rc = fold_node(g, id, d);
      if (rc == TEQ_OK) folded++, again = true;
    }
    if (rc == TEQ_OK && again) {
      int r = graph_remove_dead(g);
      if (r < 0) rc = r;
    }
  }
  if (n_folded) *n_folded = folded;
  return rc;
}
