/* rules.c: a generated pair as runtime graphs, for the rule database and
 * for tests that evaluate a rule at either shape assignment.
 *
 * Both sides get the same inputs (the variables either side uses, in pool
 * order, with their shapes at the assignment) and aligned outputs. The
 * parameters are those the templates derive at that assignment, so a side
 * built at B has B's split sizes and constant extents. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"
#include "ruledb/ruledb.h"
#include "runtime/graph.h"

static int side_graph(const GenVocab *v, const GenGraph *g, const bool *used, int shape,
                      const uint8_t *outs, int n_out, Graph **out, Diag *d) {
  GenState s;
  int rc = gen_state_init(&s, v, shape, 1);
  if (rc) return rc;
  Graph *G = graph_new();
  if (!G) rc = TEQ_ERR_NOMEM;
  if (!rc && gen_push_graph(&s, g, d) != 1)
    rc = diag_error(d, "gen-rules: a rule side does not apply at shape assignment %c",
                    shape == SHAPE_A ? 'A' : 'B');
  TensorRef ref[GEN_MAX_SLOTS];
  for (int i = 0; !rc && i < v->n_vars; i++) {
    if (!used[i]) continue;
    Shape sh = gen_var_shape(v, i, shape);
    int id = graph_add_input(G, v->vars[i].name, &sh, DT_F32, d);
    if (id < 0) rc = id;
    else ref[i] = (TensorRef){id, 0};
  }
  for (int k = 0; !rc && k < g->n_ops; k++) {
    const GenTemplate *t = &v->t[g->op[k].t];
    int first = s.op_first[k];
    if (t->flags & T_IDENT) {
      ref[first] = ref[g->op[k].in[0]];
      continue;
    }
    TensorRef in[2];
    for (int i = 0; i < t->n_in; i++) in[i] = ref[g->op[k].in[i]];
    int id = graph_add_node(G, t->kind, in, t->n_in, t->n_out, &s.op_params[k], NULL, d);
    if (id < 0) rc = id;
    for (int o = 0; !rc && o < t->n_out; o++) ref[first + o] = (TensorRef){id, o};
  }
  for (int i = 0; !rc && i < n_out; i++) {
    char name[16];
    snprintf(name, sizeof name, "y%d", i);
    int id = graph_add_output(G, ref[outs[i]], name, d);
    if (id < 0) rc = id;
  }
  gen_state_fini(&s);
  if (rc) {
    graph_free(G);
    return rc;
  }
  *out = G;
  return TEQ_OK;
}

int gen_pair_graphs(const GenVocab *v, const GenPair *p, int shape, Graph **src, Graph **dst,
                    Diag *d) {
  bool used[GEN_MAX_VARS];
  gen_pair_used_vars(v, p, used);
  int rc = side_graph(v, &p->src, used, shape, p->src_out, p->n_out, src, d);
  if (rc) return rc;
  rc = side_graph(v, &p->dst, used, shape, p->dst_out, p->n_out, dst, d);
  if (rc) {
    graph_free(*src);
    *src = NULL;
  }
  return rc;
}

int gen_rule_to_ruledb(const GenVocab *v, const GenRule *g, Rule *r, Diag *d) {
  memset(r, 0, sizeof *r);
  int rc = gen_pair_graphs(v, &g->p, SHAPE_A, &r->src, &r->dst, d);
  if (rc) return rc;
  r->key = strdup(g->key);
  if (!r->key) {
    rule_fini(r);
    return TEQ_ERR_NOMEM;
  }
  r->status = RULE_CANDIDATE;
  int a = rule_side_ops(r->src), b = rule_side_ops(r->dst);
  r->depth = a > b ? a : b;
  return TEQ_OK;
}
