/* instance.c: a rule's target built at the shapes of one match, and
 * spliced into the graph in place of the matched source.
 *
 * A rule was found at small shapes, so some of its target's parameters are
 * really functions of shapes: the sizes of a split (where a concatenation
 * joined two tensors), the extents of constant tensors (C_pool, I_conv,
 * I_matmul, ones), the groups of a depthwise convolution. Rather than
 * guess which extent each came from, they are solved for: each free value
 * ranges over the extents the match binds, every node's shape must infer,
 * and the target's outputs must have exactly the shapes of the source's.
 * The solution must be unique; two different ones mean the rule does not
 * say which applies, and it is not used there. The search keeps each
 * instance it builds (opt_inst_get), since it meets the same rule at the
 * same shapes in nearly every candidate. */
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"

#define MAX_OUT 4
#define MAX_CAND 24

typedef struct Solver {
  const Graph *D;
  Shape var_shape[OPT_MAX_SIDE];
  Shape want[MAX_OUT * 2];
  int64_t cand[MAX_CAND];
  int n_cand;
  Params prm[OPT_MAX_SIDE];
  Shape out[OPT_MAX_SIDE][MAX_OUT];
  Params best[OPT_MAX_SIDE];
  int solutions;
  long steps;
} Solver;

static void add_cand(Solver *s, int64_t v) {
  if (v < 1) return;
  for (int i = 0; i < s->n_cand; i++)
    if (s->cand[i] == v) return;
  if (s->n_cand < MAX_CAND) s->cand[s->n_cand++] = v;
}

static void node_at(Solver *s, int id);

/* The free values of node id, one at a time: unknown u of n. For a split,
 * the unknowns are its sizes but the last, which takes what remains. */
typedef struct Unknown {
  int param, elem;
} Unknown;

static void try_unknowns(Solver *s, int id, const Unknown *un, int n_un, int u) {
  if (s->solutions >= 2 || ++s->steps > 200000) return;
  const Node *n = &s->D->nodes[id];
  const OpDef *def = op_def(n->kind);
  Shape in[8];
  if (u == n_un) {
    for (int j = 0; j < n->n_in; j++) {
      TensorRef r = n->in[j];
      in[j] = s->D->nodes[r.node].kind == OP_INPUT ? s->var_shape[r.node] : s->out[r.node][r.out];
    }
    int si = def->n_out_max != 1 ? param_index(n->kind, "sizes") : -1;
    if (si >= 0 && s->prm[id].v[si].n > 0) { /* the last size takes what remains */
      int axis_i = param_index(n->kind, "axis");
      int64_t axis = axis_i >= 0 ? s->prm[id].v[axis_i].i[0] : 0, sum = 0;
      ParamValue *v = &s->prm[id].v[si];
      if (axis < 0 || axis >= in[0].ndim) return;
      for (int k = 0; k < v->n - 1; k++) sum += v->i[k];
      v->i[v->n - 1] = in[0].d[axis] - sum;
      if (v->i[v->n - 1] < 1) return;
    }
    int gi = param_index(n->kind, "groups");
    if (gi >= 0 && opt_is_depthwise(s->D, id)) s->prm[id].v[gi].i[0] = in[0].d[1];
    Node tmp;
    memset(&tmp, 0, sizeof tmp);
    tmp.kind = n->kind, tmp.n_in = n->n_in, tmp.n_out = n->n_out, tmp.params = s->prm[id];
    if (params_check(n->kind, &tmp.params, NULL) != TEQ_OK) return;
    if (def->infer_shape(&tmp, in, s->out[id], NULL) != TEQ_OK) return;
    node_at(s, id + 1);
    return;
  }
  ParamValue *v = &s->prm[id].v[un[u].param];
  for (int c = 0; c < s->n_cand && s->solutions < 2; c++) {
    v->i[un[u].elem] = s->cand[c];
    try_unknowns(s, id, un, n_un, u + 1);
  }
}

static void node_at(Solver *s, int id) {
  const Graph *D = s->D;
  if (id == D->n_nodes) {
    for (int o = 0; o < D->n_outputs; o++) {
      TensorRef r = D->outputs[o];
      const Shape *got = D->nodes[r.node].kind == OP_INPUT ? &s->var_shape[r.node]
                                                           : &s->out[r.node][r.out];
      if (!shape_equal(got, &s->want[o])) return;
    }
    if (s->solutions == 0) memcpy(s->best, s->prm, sizeof s->best);
    else if (!memcmp(s->best, s->prm, sizeof s->best)) return; /* the same, reached again */
    s->solutions++;
    return;
  }
  const Node *n = &D->nodes[id];
  if (n->kind == OP_INPUT) {
    node_at(s, id + 1);
    return;
  }
  const OpDef *def = op_def(n->kind);
  Unknown un[TEQ_MAX_PARAMS * TEQ_MAX_PARAM_LEN];
  int n_un = 0;
  s->prm[id] = n->params;
  for (int i = 0; i < def->n_params; i++) {
    if (!opt_param_is_free(D, id, i) || def->params[i].type == PARAM_FLOAT) continue;
    if (!strcmp(def->params[i].name, "groups")) continue; /* derived, not searched */
    int count = n->params.v[i].n;
    if (def->n_out_max != 1 && !strcmp(def->params[i].name, "sizes")) count--;
    for (int e = 0; e < count; e++) un[n_un++] = (Unknown){i, e};
  }
  try_unknowns(s, id, un, n_un, 0);
}

int opt_instantiate(const OptRule *rule, const Graph *g, const OptMatch *m, Graph **out) {
  const Graph *P = rule->src, *D = rule->dst;
  if (D->n_outputs > MAX_OUT * 2) return TEQ_ERR_UNSUPPORTED;
  Solver *s = calloc(1, sizeof *s);
  if (!s) return TEQ_ERR_NOMEM;
  s->D = D;
  for (int v = 0; v < D->n_inputs; v++) {
    TensorRef b = m->bind[P->inputs[v]];
    int dv = D->inputs[v];
    if (b.node < 0) { /* a variable the target does not read */
      s->var_shape[dv] = D->nodes[dv].out[0];
      continue;
    }
    if (g->nodes[b.node].dtype != DT_F32) goto fail;
    s->var_shape[dv] = *graph_shape(g, b);
    for (int k = 0; k < s->var_shape[dv].ndim; k++) add_cand(s, s->var_shape[dv].d[k]);
  }
  for (int o = 0; o < P->n_outputs; o++) {
    TensorRef r = P->outputs[o];
    s->want[o] = *graph_shape(g, (TensorRef){m->node[r.node], r.out});
    for (int k = 0; k < s->want[o].ndim; k++) add_cand(s, s->want[o].d[k]);
  }
  /* The values at the rule's own shapes stay candidates (a 3x3 kernel). */
  for (int id = 0; id < D->n_nodes; id++) {
    const Node *n = &D->nodes[id];
    if (n->n_out > MAX_OUT || n->n_in > 8) goto fail;
    const OpDef *def = op_def(n->kind);
    for (int i = 0; i < def->n_params; i++)
      if (opt_param_is_free(D, id, i) && def->params[i].type != PARAM_FLOAT)
        for (int e = 0; e < n->params.v[i].n; e++) add_cand(s, n->params.v[i].i[e]);
  }
  node_at(s, 0);
  if (s->solutions != 1) goto fail;

  Graph *r = graph_new();
  if (!r) {
    free(s);
    return TEQ_ERR_NOMEM;
  }
  int32_t map[OPT_MAX_SIDE];
  for (int id = 0; id < D->n_nodes; id++) {
    const Node *n = &D->nodes[id];
    int rc;
    if (n->kind == OP_INPUT) {
      rc = graph_add_input(r, n->name, &s->var_shape[id], DT_F32, NULL);
    } else {
      TensorRef in[8];
      for (int j = 0; j < n->n_in; j++) in[j] = (TensorRef){map[n->in[j].node], n->in[j].out};
      rc = graph_add_node(r, n->kind, in, n->n_in, n->n_out, &s->best[id], NULL, NULL);
    }
    if (rc < 0 || (n->kind != OP_INPUT && !opt_broadcast_like(D, id, r, rc))) {
      graph_free(r);
      goto fail;
    }
    map[id] = rc;
  }
  for (int o = 0; o < D->n_outputs; o++) {
    TensorRef ref = {map[D->outputs[o].node], D->outputs[o].out};
    if (graph_add_output(r, ref, NULL, NULL) < 0) {
      graph_free(r);
      goto fail;
    }
  }
  free(s);
  *out = r;
  return TEQ_OK;
fail:
  free(s);
  return TEQ_ERR_INPUT;
}

int opt_extract_match(const OptRule *rule, const Graph *g, const OptMatch *m, Graph **out) {
  const Graph *P = rule->src;
  Graph *r = graph_new();
  if (!r) return TEQ_ERR_NOMEM;
  int32_t map[OPT_MAX_SIDE];
  for (int id = 0; id < P->n_nodes; id++) {
    const Node *pn = &P->nodes[id];
    int rc;
    if (pn->kind == OP_INPUT) {
      TensorRef b = m->bind[id];
      const Shape *sh = b.node >= 0 ? graph_shape(g, b) : &pn->out[0];
      rc = graph_add_input(r, pn->name, sh, DT_F32, NULL);
    } else {
      /* The source's structure, in the graph node's operand order, with
       * the graph node's parameters (a tensor may be both a variable's and
       * an inner node's, so the graph's edges alone are ambiguous). */
      const Node *gn = &g->nodes[m->node[id]];
      TensorRef in[8];
      if (pn->n_in > 8) {
        graph_free(r);
        return TEQ_ERR_UNSUPPORTED;
      }
      for (int j = 0; j < pn->n_in; j++) {
        TensorRef pr = pn->in[m->swapped[id] ? pn->n_in - 1 - j : j];
        in[j] = (TensorRef){map[pr.node], P->nodes[pr.node].kind == OP_INPUT ? 0 : pr.out};
      }
      rc = graph_add_node(r, gn->kind, in, gn->n_in, gn->n_out, &gn->params, NULL, NULL);
    }
    if (rc < 0) {
      graph_free(r);
      return TEQ_ERR_INPUT;
    }
    map[id] = rc;
  }
  for (int o = 0; o < P->n_outputs; o++)
    if (graph_add_output(r, (TensorRef){map[P->outputs[o].node], P->outputs[o].out}, NULL, NULL) <
        0) {
      graph_free(r);
      return TEQ_ERR_INPUT;
    }
  *out = r;
  return TEQ_OK;
}

/* Adds inst's nodes to r, input k reading bind[k] (map, order and in are
 * scratch of inst's size), and points every use of replace[o] at inst's
 * output o. */
static int splice_one(Graph *r, const Graph *inst, const TensorRef *bind, const TensorRef *replace,
                      TensorRef *map, int32_t *order, TensorRef *in, Diag *d) {
  for (int k = 0; k < inst->n_inputs; k++) map[inst->inputs[k]] = bind[k];
  /* In topological order: a rewritten window's new nodes come after the
   * nodes that read them. */
  if (graph_topo_order(inst, order) != TEQ_OK) return TEQ_ERR_INTERNAL;
  for (int k = 0; k < inst->n_nodes; k++) {
    int id = order[k];
    const Node *n = &inst->nodes[id];
    if (n->kind == OP_INPUT) continue;
    int nid;
    if (n->kind == OP_CONST) {
      nid = graph_add_const(r, n->name, tensor_ref(n->value), d);
    } else if (n->kind == OP_OPAQUE) {
      return TEQ_ERR_INTERNAL; /* windows never move opaque nodes */
    } else {
      for (int j = 0; j < n->n_in; j++) {
        TensorRef m = map[n->in[j].node];
        in[j] = inst->nodes[n->in[j].node].kind == OP_INPUT ? m : (TensorRef){m.node, n->in[j].out};
      }
      nid = graph_add_node(r, n->kind, in, n->n_in, n->n_out, &n->params, n->name, d);
    }
    if (nid < 0) return nid;
    map[id] = (TensorRef){nid, 0};
  }
  for (int o = 0; o < inst->n_outputs; o++) {
    TensorRef io = inst->outputs[o];
    TensorRef to = inst->nodes[io.node].kind == OP_INPUT ? map[io.node]
                                                          : (TensorRef){map[io.node].node, io.out};
    if (to.node != replace[o].node || to.out != replace[o].out)
      graph_replace_uses(r, replace[o], to);
  }
  return TEQ_OK;
}

int opt_splice_many(const Graph *g, int n, const Graph *const *inst, const TensorRef *const *bind,
                    const TensorRef *const *replace, Graph **out, Diag *d) {
  int most_inst = 0, widest = 1, added = 0;
  for (int i = 0; i < n; i++) {
    if (inst[i]->n_nodes > most_inst) most_inst = inst[i]->n_nodes;
    added += inst[i]->n_nodes;
    for (int id = 0; id < inst[i]->n_nodes; id++)
      if (inst[i]->nodes[id].n_in > widest) widest = inst[i]->nodes[id].n_in;
  }
  /* Room for every node the splices add: the search keeps thousands of
   * these graphs, and a node array grown by doubling held about half its
   * room empty (Inception-v3: 200 MB of its peak). */
  Graph *r = graph_copy(g);
  if (!r || graph_reserve(r, g->n_nodes + added) != TEQ_OK) {
    graph_free(r);
    return TEQ_ERR_NOMEM;
  }
  /* Room for r's order after every splice: g's nodes and all the new ones. */
  size_t most = (size_t)g->n_nodes + (size_t)n * (size_t)most_inst + 1;
  TensorRef *map = malloc(((size_t)most_inst + 1) * sizeof *map);
  int32_t *order = malloc(most * sizeof *order);
  TensorRef *in = malloc((size_t)widest * sizeof *in);
  int rc = map && order && in ? TEQ_OK : TEQ_ERR_NOMEM;
  /* Every instance first reads the tensors its match bound in g; a tensor
   * another instance replaces is then read from its replacement, which
   * computes the same value. */
  for (int i = 0; i < n && rc == TEQ_OK; i++)
    rc = splice_one(r, inst[i], bind[i], replace[i], map, order, in, d);
  if (rc == TEQ_OK && graph_topo_order(r, order) != TEQ_OK) rc = TEQ_ERR_INPUT; /* a cycle */
  if (rc == TEQ_OK) {
    /* The rewrite may rebuild a value the graph already has (two rules
     * each making concat(x, h)); one copy is cheaper, and rules that need
     * a shared input match only once the copies are one. */
    int removed = graph_merge_duplicates(r);
    if (removed >= 0) removed = graph_remove_dead(r);
    if (removed < 0) rc = removed;
  }
  free(map);
  free(order);
  free(in);
  if (rc) {
    graph_free(r);
    return rc;
  }
  *out = r;
  return TEQ_OK;
}

int opt_splice(const Graph *g, const Graph *inst, const TensorRef *bind, const TensorRef *replace,
               Graph **out, Diag *d) {
  return opt_splice_many(g, 1, &inst, &bind, &replace, out, d);
}

/* ---- instances, once per rule and shapes ---- */

/* The search meets the same rule at the same shapes over and over (every
 * candidate repeats most of its parent's matches), and solving the
 * target's free parameters is a search of its own. So each instance is
 * kept under an exact key: what opt_instantiate reads from the match, and
 * the matched parameters, which the instance's Z_p verdict depends on. */

typedef struct MemoSlot {
  uint64_t hash;
  size_t len;
  unsigned char *key; /* NULL: empty slot */
  OptInst *inst;      /* NULL: the target does not fit these shapes */
} MemoSlot;

struct OptInstMemo {
  MemoSlot *slot;
  size_t cap, n;
  unsigned char *buf; /* room for the longest key */
};

/* The rule, a shape per variable and per output, the parameters per node. */
enum {
  MEMO_KEY_MAX = 8 + 3 * OPT_MAX_SIDE * (8 + 8 * TEQ_MAX_DIMS) + OPT_MAX_SIDE * sizeof(Params)
};

OptInstMemo *opt_inst_memo_new(void) {
  OptInstMemo *memo = calloc(1, sizeof *memo);
  if (memo && !(memo->buf = malloc(MEMO_KEY_MAX))) {
    free(memo);
    return NULL;
  }
  return memo;
}

void opt_inst_free(OptInst *in) {
  if (!in) return;
  graph_free(in->g);
  graph_free(in->src);
  free(in->order), free(in->slot), free(in->input_read);
  free(in->hs), free(in->plain), free(in->fused);
  free(in);
}

void opt_inst_memo_free(OptInstMemo *memo) {
  if (!memo) return;
  for (size_t i = 0; i < memo->cap; i++)
    if (memo->slot[i].key) {
      free(memo->slot[i].key);
      opt_inst_free(memo->slot[i].inst);
    }
  free(memo->slot);
  free(memo->buf);
  free(memo);
}

/* Appends a shape field by field: a Shape's padding bytes are not set. */
static size_t put_shape(unsigned char *k, size_t at, const Shape *s, int32_t tag) {
  memcpy(k + at, &tag, 4);
  memcpy(k + at + 4, &s->ndim, 4);
  at += 8;
  size_t dims = (size_t)(s->ndim > 0 ? s->ndim : 0) * sizeof s->d[0];
  memcpy(k + at, s->d, dims);
  return at + dims;
}

static size_t memo_key(const OptRules *rs, int i, const Graph *g, const OptMatch *m,
                       unsigned char *k) {
  const Graph *P = rs->r[i].src;
  int32_t rule = i;
  memcpy(k, &rule, 4);
  size_t at = 4;
  for (int v = 0; v < P->n_inputs; v++) {
    TensorRef b = m->bind[P->inputs[v]];
    Shape none = {.ndim = -2};
    at = put_shape(k, at, b.node >= 0 ? graph_shape(g, b) : &none,
                   b.node >= 0 ? (int32_t)g->nodes[b.node].dtype : -1);
  }
  for (int o = 0; o < P->n_outputs; o++) {
    TensorRef r = P->outputs[o];
    at = put_shape(k, at, graph_shape(g, (TensorRef){m->node[r.node], r.out}), 0);
  }
  for (int p = 0; p < P->n_nodes; p++)
    if (m->node[p] >= 0) {
      memcpy(k + at, &g->nodes[m->node[p]].params, sizeof(Params));
      at += sizeof(Params);
    }
  return at;
}

static int memo_grow(OptInstMemo *memo) {
  size_t cap = memo->cap ? 2 * memo->cap : 256;
  MemoSlot *s = calloc(cap, sizeof *s);
  if (!s) return TEQ_ERR_NOMEM;
  for (size_t i = 0; i < memo->cap; i++) {
    if (!memo->slot[i].key) continue;
    size_t j = memo->slot[i].hash & (cap - 1);
    while (s[j].key) j = (j + 1) & (cap - 1);
    s[j] = memo->slot[i];
  }
  free(memo->slot);
  memo->slot = s, memo->cap = cap;
  return TEQ_OK;
}

/* g wrapped with the order opt_splice adds its nodes in. */
int opt_inst_wrap(Graph *g, OptInst **out) {
  OptInst *in = calloc(1, sizeof *in);
  int n = g->n_nodes;
  if (in) {
    in->g = g;
    in->order = malloc(((size_t)n + 1) * sizeof *in->order);
    in->slot = malloc(((size_t)n + 1) * sizeof *in->slot);
    in->input_read = calloc((size_t)g->n_inputs + 1, sizeof *in->input_read);
  }
  if (!in || !in->order || !in->slot || !in->input_read) {
    if (in) opt_inst_free(in);
    else graph_free(g);
    return TEQ_ERR_NOMEM;
  }
  int32_t *topo = malloc(((size_t)n + 1) * sizeof *topo);
  if (!topo || graph_topo_order(g, topo) != TEQ_OK) {
    free(topo);
    opt_inst_free(in);
    return topo ? TEQ_ERR_INTERNAL : TEQ_ERR_NOMEM;
  }
  for (int k = 0; k < g->n_inputs; k++) in->slot[g->inputs[k]] = -1 - k;
  for (int k = 0; k < n; k++) {
    const Node *nd = &g->nodes[topo[k]];
    if (nd->kind == OP_INPUT) continue;
    in->built_only |= nd->kind == OP_OPAQUE;
    in->slot[topo[k]] = in->n_new;
    in->order[in->n_new++] = topo[k];
    for (int j = 0; j < nd->n_in; j++) {
      int src = nd->in[j].node;
      if (g->nodes[src].kind == OP_INPUT) in->input_read[-1 - in->slot[src]] = true;
    }
  }
  for (int o = 0; o < g->n_outputs; o++)
    if (g->nodes[g->outputs[o].node].kind == OP_INPUT)
      in->input_read[-1 - in->slot[g->outputs[o].node]] = true;
  free(topo);
  *out = in;
  return TEQ_OK;
}

int opt_inst_get(OptInstMemo *memo, const OptRules *rs, int i, const Graph *g,
                 const OptMatch *m, OptInst **out) {
  size_t len = memo_key(rs, i, g, m, memo->buf);
  uint64_t h = hash_bytes(0x1a57, memo->buf, len);
  size_t j = memo->cap ? h & (memo->cap - 1) : 0;
  for (; memo->cap && memo->slot[j].key; j = (j + 1) & (memo->cap - 1)) {
    const MemoSlot *s = &memo->slot[j];
    if (s->hash == h && s->len == len && !memcmp(s->key, memo->buf, len)) {
      *out = s->inst;
      return TEQ_OK;
    }
  }
  if (2 * (memo->n + 1) > memo->cap) {
    if (memo_grow(memo)) return TEQ_ERR_NOMEM;
    for (j = h & (memo->cap - 1); memo->slot[j].key; j = (j + 1) & (memo->cap - 1)) {}
  }
  OptInst *in = NULL;
  Graph *inst = NULL;
  int rc = opt_instantiate(&rs->r[i], g, m, &inst);
  if (rc == TEQ_OK) rc = opt_inst_wrap(inst, &in);
  else if (rc == TEQ_ERR_INPUT || rc == TEQ_ERR_UNSUPPORTED) rc = TEQ_OK;
  if (rc == TEQ_OK && in) rc = opt_extract_match(&rs->r[i], g, m, &in->src);
  unsigned char *key = rc ? NULL : malloc(len ? len : 1);
  if (!rc && !key) rc = TEQ_ERR_NOMEM;
  if (rc) {
    opt_inst_free(in);
    return rc;
  }
  memcpy(key, memo->buf, len);
  memo->slot[j] = (MemoSlot){.hash = h, .len = len, .key = key, .inst = in};
  memo->n++;
  *out = in;
  return TEQ_OK;
}
