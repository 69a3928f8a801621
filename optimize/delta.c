/* delta.c: a rewrite's structural hash and exported cost, derived from the
 * graph it rewrites without building it.
 *
 * Most rewrites the search makes are thrown away: more than half were seen
 * before (same structural hash), and of the rest nearly all cost too much.
 * Building each (a copy of the whole graph), hashing it, and pricing it as
 * exported (another copy refolded by opt_fuse_bias, then every node's cost
 * key formatted and looked up) was most of the search's time. Here the
 * graph about to be expanded is analysed once (OptBase: node hashes,
 * weights, uses, each node's cost) and each rewrite of it is derived:
 *
 *   hash  graph_hash is bottom-up, so only the nodes downstream of the
 *         replaced tensors hash anew, on top of the instance's new nodes;
 *   cost  the rewritten graph's nodes are the base's, less those the
 *         rewrite leaves dead (use counts), plus the instance's; which
 *         convolutions refold with their only consumer is decided again
 *         from the uses, as opt_fuse_bias decides it, and each cost comes
 *         from a table by configuration (OptPricer). The sum is taken in
 *         the order opt_graph_cost takes it over the refolded graph, so it
 *         is the same double, and the search compares, keeps and orders
 *         candidates exactly as when it built every one.
 *
 * opt_splice merges the nodes a rewrite leaves computing the same value
 * (graph_merge_duplicates). That leaves the hash as it is (graph_hash
 * reads only the outputs' cones, and a duplicate hashes as its twin) but
 * not the cost: one copy is priced, and refolding sees the merged uses.
 * So a rewrite whose hashed-anew nodes meet another node's hash is not
 * derived; it is rare (a rule rebuilding concat(x, h) the graph has).
 *
 * The rewritten graph is built only when the search keeps it. What this
 * file does not derive (a variable bound to a tensor the match computes, a
 * rewrite that changes which nodes are weights, opaque nodes, a value
 * computed twice) it answers OPT_DELTA_BUILD, and the caller builds and
 * prices that one in full.
 * tests/optimize/test_optimize.c compares both ways on every rule. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "optimize/opt_int.h"

/* ---- structural hashes, as runtime/graph.c computes them ---- */

/* Node id's hash before its inputs are mixed in (graph.c: node_hash_one).
 * Opaque nodes are not derived (*opaque set). */
static uint64_t hash_start(const Graph *g, int id, bool *opaque) {
  const Node *n = &g->nodes[id];
  uint64_t h = hash_mix(0x6e6f6465, (uint64_t)n->kind);
  h = params_hash(h, &n->params);
  h = hash_mix(h, (uint64_t)n->n_out);
  *opaque = false;
  if (n->kind == OP_INPUT) {
    for (int i = 0; i < g->n_inputs; i++)
      if (g->inputs[i] == id) h = hash_mix(h, (uint64_t)i + 1);
    h = hash_bytes(h, &n->out[0], sizeof n->out[0]);
  } else if (n->kind == OP_CONST) {
    h = hash_mix(h, tensor_content_hash(n->value));
  } else if (n->opaque) {
    *opaque = true;
  }
  return h;
}

/* The hash of a node of this kind from its start and its inputs' x[j] =
 * hash_mix(producer's hash, output index); commutative operands in either
 * order hash alike. */
static uint64_t hash_finish(uint64_t h, OpKind kind, int n_in, const uint64_t *x) {
  if ((op_def(kind)->flags & OPF_COMMUTATIVE) && n_in == 2) {
    uint64_t lo = x[0] < x[1] ? x[0] : x[1], hi = x[0] < x[1] ? x[1] : x[0];
    return hash_mix(hash_mix(h, lo), hi);
  }
  for (int j = 0; j < n_in; j++) h = hash_mix(h, x[j]);
  return h;
}

/* ---- costs by configuration ---- */

struct OptPricer {
  CostModel *cm;
  int act_i; /* conv2d's "act" parameter */
  OptChannels *channels; /* verdicts on biases, remembered */
};

int opt_pricer_new(CostModel *cm, OptPricer **out) {
  OptPricer *p = calloc(1, sizeof *p);
  if (!p) return TEQ_ERR_NOMEM;
  p->cm = cm;
  p->act_i = param_index(OP_CONV2D, "act");
  if (!(p->channels = opt_channels_new())) {
    free(p);
    return TEQ_ERR_NOMEM;
  }
  *out = p;
  return TEQ_OK;
}

void opt_pricer_free(OptPricer *p) {
  if (!p) return;
  opt_channels_free(p->channels);
  free(p);
}

static bool costs_nothing(const Node *n) {
  return (op_def(n->kind)->flags & (OPF_SOURCE | OPF_NOOP | OPF_OPAQUE)) || n->kind == OP_OPAQUE;
}

/* Node id of g's cost as opt_graph_cost counts a node that is not a
 * weight: 0 for sources, no-ops and opaque nodes. The cost model finds a
 * configuration it priced before by its bytes (cost.h: CostConfig). */
static int plain_cost(OptPricer *p, const Graph *g, int id, double *us, Diag *d) {
  *us = 0;
  if (costs_nothing(&g->nodes[id])) return TEQ_OK;
  CostEstimate e;
  int rc = cost_node(p->cm, g, id, &e, d);
  if (rc == TEQ_OK) *us = e.us;
  return rc;
}

/* The cost of convolution id of g (no activation) refolded as fuse says
 * (OPT_FUSE_BIAS: a new [C] bias; + act). A refolded configuration is in
 * no graph, so on first sight it is built alone to be costed. */
static int fused_cost(OptPricer *p, const Graph *g, int id, int fuse, double *us, Diag *d) {
  const Node *c = &g->nodes[id];
  CostConfig k;
  k.kind = OP_CONV2D, k.n_out = 1, k.unused = 0;
  k.params = c->params;
  k.params.v[p->act_i].i[0] = fuse & OPT_FUSE_ACT;
  Shape bias = shape_of(1, (int)c->out[0].d[1]);
  const Shape *in[3] = {graph_shape(g, c->in[0]), graph_shape(g, c->in[1]), NULL};
  DType dt[3] = {g->nodes[c->in[0].node].dtype, g->nodes[c->in[1].node].dtype, DT_F32};
  if (fuse & OPT_FUSE_BIAS) {
    in[2] = &bias;
  } else if (c->n_in == 3) {
    in[2] = graph_shape(g, c->in[2]);
    dt[2] = g->nodes[c->in[2].node].dtype;
  }
  k.n_in = in[2] ? 3 : 2;
  for (int j = 0; j < k.n_in; j++) cost_config_input(&k, j, in[j], dt[j]);
  CostEstimate e;
  if (cost_config_known(p->cm, &k, &e)) {
    *us = e.us;
    return TEQ_OK;
  }
  Graph *one = graph_new();
  if (!one) return TEQ_ERR_NOMEM;
  TensorRef refs[3];
  int rc = TEQ_OK;
  for (int j = 0; j < k.n_in && rc == TEQ_OK; j++) {
    int r = graph_add_input(one, NULL, in[j], dt[j], d);
    if (r < 0) rc = r;
    refs[j] = (TensorRef){r, 0};
  }
  int node = rc ? rc : graph_add_node(one, OP_CONV2D, refs, k.n_in, 1, &k.params, NULL, d);
  if (node < 0) rc = node;
  if (rc == TEQ_OK) rc = cost_node(p->cm, one, node, &e, d);
  if (rc == TEQ_OK) *us = e.us;
  graph_free(one);
  return rc;
}

/* ---- the base: a graph about to be expanded ---- */

struct OptBase {
  OptPricer *pr;
  const Graph *g;
  const OptUses *u;
  int n;             /* g's nodes; a rewrite's new node i is virtual node n + i */
  int32_t *order;    /* topological */
  uint64_t *hs, *h;  /* per node: hash before its inputs, and its hash */
  bool *w, *live, *gin;
  int32_t *uses;     /* per node: edges from live nodes, plus graph outputs */
  double *plain;     /* per node: its cost in g (0 when free or a weight); NAN until asked */
  double *fused;     /* per node and fusion: NAN until asked */
  int32_t *convs;    /* live convolutions without an activation, by id */
  int n_convs;
  uint64_t *x;       /* room for the widest node's input hashes */
  /* Node hashes, for the values a rewrite computes twice: g's nodes that
   * graph_merge_duplicates compares, by hash (-1: empty); and this
   * rewrite's hashed-anew ones (slots marked gen). unmerged: g itself has
   * two nodes of one hash, so every rewrite of it would merge them. */
  int32_t *by_hash;
  uint32_t *anew_gen;
  int32_t *anew;
  size_t hash_cap;
  bool unmerged, twice; /* twice: the rewrite set up computes a value twice */

  /* The rewrite opt_delta_hash set up; arrays by virtual node. */
  uint32_t gen;                   /* marks equal to gen are this rewrite's */
  uint32_t *desc, *repl, *absorbed, *head, *seen, *done;
  OptInst *in;
  int k;                          /* new nodes */
  int n_rep;
  TensorRef bind[OPT_MAX_SIDE], rep[OPT_MAX_SIDE], to[OPT_MAX_SIDE];
  bool active[OPT_MAX_SIDE];      /* rep[o] is replaced (to[o] differs) */
  TensorRef new_in[OPT_MAX_SIDE][8];
  uint64_t *h2;
  int32_t *uses2, *user2, *stack, *next_in;
  bool *dead2, *w2;
  uint8_t *fuse2, *place2;         /* per refolded conv: how, and where its cost is summed */
  uint32_t *pushed;                /* concats that take a bias into their convs (gen) */
  double *l1, *l2;
};

const bool *opt_base_weights(const OptBase *b) { return b->w; }

void opt_base_free(OptBase *b) {
  if (!b) return;
  free(b->order), free(b->hs), free(b->h), free(b->w), free(b->live), free(b->gin);
  free(b->uses), free(b->plain), free(b->fused), free(b->convs), free(b->x);
  free(b->desc), free(b->repl), free(b->absorbed), free(b->head), free(b->seen), free(b->done);
  free(b->h2), free(b->uses2), free(b->user2), free(b->stack), free(b->next_in), free(b->dead2);
  free(b->w2);
  free(b->fuse2), free(b->place2), free(b->pushed), free(b->l1), free(b->l2);
  free(b->by_hash), free(b->anew_gen), free(b->anew);
  free(b);
}

/* Whether graph_merge_duplicates may merge n with a node of its hash. */
static bool merges(const Node *n) { return n->kind != OP_INPUT && !n->opaque; }

/* Which nodes opt_splice's graph_remove_dead would keep: those a graph
 * output needs, and the inputs. */
static void mark_live(const Graph *g, bool *live, int32_t *stack) {
  int sp = 0;
  for (int i = 0; i < g->n_outputs; i++) {
    int v = g->outputs[i].node;
    if (!live[v]) live[v] = true, stack[sp++] = v;
  }
  for (int i = 0; i < g->n_inputs; i++)
    if (!live[g->inputs[i]]) live[g->inputs[i]] = true, stack[sp++] = g->inputs[i];
  while (sp) {
    const Node *v = &g->nodes[stack[--sp]];
    for (int j = 0; j < v->n_in; j++)
      if (!live[v->in[j].node]) live[v->in[j].node] = true, stack[sp++] = v->in[j].node;
  }
}

int opt_base_new(OptPricer *p, const Graph *g, const OptUses *u, OptBase **out, Diag *d) {
  OptBase *b = calloc(1, sizeof *b);
  if (!b) return TEQ_ERR_NOMEM;
  int n = g->n_nodes, max_in = 8; /* a new node has up to 8 */
  for (int v = 0; v < n; v++)
    if (g->nodes[v].n_in > max_in) max_in = g->nodes[v].n_in;
  size_t cap = (size_t)n + OPT_MAX_SIDE + 1;
  b->pr = p, b->g = g, b->u = u, b->n = n;
  b->order = malloc(cap * sizeof *b->order);
  b->hs = malloc(cap * sizeof *b->hs);
  b->h = malloc(cap * sizeof *b->h);
  b->live = calloc(cap, sizeof *b->live);
  b->gin = calloc(cap, sizeof *b->gin);
  b->uses = calloc(cap, sizeof *b->uses);
  b->plain = calloc(cap, sizeof *b->plain);
  b->fused = malloc(cap * OPT_FUSE__COUNT * sizeof *b->fused);
  b->convs = malloc(cap * sizeof *b->convs);
  b->x = malloc(((size_t)max_in + 1) * sizeof *b->x);
  b->desc = calloc(cap, sizeof *b->desc);
  b->repl = calloc(cap, sizeof *b->repl);
  b->seen = calloc(cap, sizeof *b->seen);
  b->done = calloc(cap, sizeof *b->done);
  b->next_in = malloc(cap * sizeof *b->next_in);
  b->absorbed = calloc(cap, sizeof *b->absorbed);
  b->head = calloc(cap, sizeof *b->head);
  b->h2 = malloc(cap * sizeof *b->h2);
  b->uses2 = malloc(cap * sizeof *b->uses2);
  b->user2 = malloc(cap * sizeof *b->user2);
  b->stack = malloc(cap * sizeof *b->stack);
  b->dead2 = malloc(cap * sizeof *b->dead2);
  b->w2 = malloc(cap * sizeof *b->w2);
  b->fuse2 = malloc(cap * sizeof *b->fuse2);
  b->place2 = malloc(cap * sizeof *b->place2);
  b->pushed = calloc(cap, sizeof *b->pushed);
  b->l1 = malloc(cap * sizeof *b->l1);
  b->l2 = malloc(cap * sizeof *b->l2);
  b->hash_cap = 16;
  while (b->hash_cap < 2 * cap) b->hash_cap *= 2;
  b->by_hash = malloc(b->hash_cap * sizeof *b->by_hash);
  b->anew_gen = calloc(b->hash_cap, sizeof *b->anew_gen);
  b->anew = malloc(b->hash_cap * sizeof *b->anew);
  int rc = b->order && b->hs && b->h && b->live && b->gin && b->uses && b->plain && b->fused &&
                   b->convs && b->x && b->desc && b->repl && b->seen && b->done && b->next_in &&
                   b->absorbed && b->head && b->h2 && b->uses2 && b->user2 && b->stack &&
                   b->dead2 && b->w2 &&
                   b->fuse2 && b->place2 && b->pushed && b->l1 && b->l2 && b->by_hash && b->anew_gen && b->anew
               ? TEQ_OK
               : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = graph_topo_order(g, b->order) == TEQ_OK ? TEQ_OK : TEQ_ERR_INTERNAL;
  if (rc == TEQ_OK && !(b->w = opt_weight_only(g, b->order))) rc = TEQ_ERR_NOMEM;
  if (rc) {
    opt_base_free(b);
    return rc;
  }
  /* Hashes: graph_hash's, and the same rebuilt from their starts here;
   * they must agree, or a rewrite's derived hash would not be graph_hash's. */
  graph_hash(g, b->h);
  for (int v = 0; v < n; v++) {
    bool opaque;
    const Node *nd = &g->nodes[v];
    b->hs[v] = hash_start(g, v, &opaque);
    if (opaque) continue;
    for (int j = 0; j < nd->n_in; j++)
      b->x[j] = hash_mix(b->h[nd->in[j].node], (uint64_t)nd->in[j].out);
    if (hash_finish(b->hs[v], nd->kind, nd->n_in, b->x) != b->h[v]) {
      opt_base_free(b);
      return diag_error(d, "optimize: node hashes differ from graph_hash's"), TEQ_ERR_INTERNAL;
    }
  }
  for (size_t i = 0; i < b->hash_cap; i++) b->by_hash[i] = -1;
  for (int v = 0; v < n; v++) {
    if (!merges(&g->nodes[v])) continue;
    size_t at = b->h[v] & (b->hash_cap - 1);
    for (; b->by_hash[at] >= 0; at = (at + 1) & (b->hash_cap - 1))
      if (b->h[b->by_hash[at]] == b->h[v]) b->unmerged = true;
    b->by_hash[at] = v;
  }
  mark_live(g, b->live, b->stack);
  for (int i = 0; i < g->n_inputs; i++) b->gin[g->inputs[i]] = true;
  for (int v = 0; v < n; v++) {
    if (!b->live[v]) continue;
    for (int j = 0; j < g->nodes[v].n_in; j++) b->uses[g->nodes[v].in[j].node]++;
  }
  for (int i = 0; i < g->n_outputs; i++) b->uses[g->outputs[i].node]++;
  for (size_t i = 0; i < cap * OPT_FUSE__COUNT; i++) b->fused[i] = NAN;
  /* Costs are asked only as rewrites need them, so the cost model is asked
   * (and records, or measures) what the refolded candidates hold, as when
   * each was built and priced: not a convolution that always refolds. */
  for (int v = 0; v < n; v++) {
    const Node *nd = &g->nodes[v];
    b->plain[v] = b->live[v] && !b->w[v] ? NAN : 0;
    if (b->live[v] && nd->kind == OP_CONV2D && nd->params.v[p->act_i].i[0] == ACT_NONE &&
        !op_output_pooled(nd))
      b->convs[b->n_convs++] = v;
  }
  *out = b;
  return TEQ_OK;
}

int opt_inst_prepare(OptInst *in) {
  if (in->hs) return TEQ_OK;
  int k = in->n_new;
  in->hs = malloc(((size_t)k + 1) * sizeof *in->hs);
  in->plain = malloc(((size_t)k + 1) * sizeof *in->plain);
  in->fused = malloc(((size_t)k + 1) * OPT_FUSE__COUNT * sizeof *in->fused);
  if (!in->hs || !in->plain || !in->fused) {
    free(in->hs), free(in->plain), free(in->fused);
    in->hs = NULL, in->plain = in->fused = NULL;
    return TEQ_ERR_NOMEM;
  }
  for (int i = 0; i < k; i++) {
    bool opaque;
    in->hs[i] = hash_start(in->g, in->order[i], &opaque);
    in->built_only |= opaque;
    in->plain[i] = NAN;
  }
  for (int i = 0; i < k * OPT_FUSE__COUNT; i++) in->fused[i] = NAN;
  return TEQ_OK;
}

/* ---- one rewrite ---- */

/* The node behind virtual node v: g's, or the instance's new node v - n. */
static const Node *vnode(const OptBase *b, int v) {
  return v < b->n ? &b->g->nodes[v] : &b->in->g->nodes[b->in->order[v - b->n]];
}

/* Tensor r of g as the rewritten graph reads it: graph_replace_uses runs
 * once per output of the instance, in order. */
static TensorRef sub(const OptBase *b, TensorRef r) {
  if (b->repl[r.node] != b->gen) return r;
  for (int o = 0; o < b->n_rep; o++)
    if (b->active[o] && r.node == b->rep[o].node && r.out == b->rep[o].out) r = b->to[o];
  return r;
}

/* Input j of virtual node v in the rewritten graph. */
static TensorRef vin(const OptBase *b, int v, int j) {
  return v < b->n ? sub(b, b->g->nodes[v].in[j]) : b->new_in[v - b->n][j];
}

static uint64_t vhash(const OptBase *b, int v) {
  return v >= b->n || b->desc[v] == b->gen ? b->h2[v] : b->h[v];
}

static DType vdtype(const OptBase *b, int v) { return vnode(b, v)->dtype; }

/* Whether virtual node v may hash anew: a new node, or one downstream of
 * a replaced tensor. Every other node's cone is g's. */
static bool affected(const OptBase *b, int v) { return v >= b->n || b->desc[v] == b->gen; }

/* Hashes the affected nodes in a topological order of the rewritten
 * graph (depth first, post-order, over their affected inputs). A cycle of
 * the rewritten graph runs through affected nodes only (it takes a new
 * edge, and every node of g on it is downstream of a replaced tensor), so
 * it shows here as an edge back to a node on the stack, as it would in
 * opt_splice's graph_topo_order. False on a cycle. */
static bool hash_affected(OptBase *b, const int32_t *roots, int n_roots) {
  for (int r = 0; r < n_roots; r++) {
    int v0 = roots[r];
    if (b->seen[v0] == b->gen) continue;
    int sp = 0;
    b->stack[sp++] = v0;
    b->seen[v0] = b->gen;
    b->next_in[v0] = 0;
    while (sp) {
      int v = b->stack[sp - 1];
      const Node *nd = vnode(b, v);
      if (b->next_in[v] < nd->n_in) {
        int t = vin(b, v, b->next_in[v]++).node;
        if (!affected(b, t) || b->done[t] == b->gen) continue;
        if (b->seen[t] == b->gen) return false; /* on the stack: a cycle */
        b->seen[t] = b->gen;
        b->next_in[t] = 0;
        b->stack[sp++] = t;
        continue;
      }
      for (int j = 0; j < nd->n_in; j++) {
        TensorRef t = vin(b, v, j);
        b->x[j] = hash_mix(vhash(b, t.node), (uint64_t)t.out);
      }
      b->h2[v] = hash_finish(v < b->n ? b->hs[v] : b->in->hs[v - b->n], nd->kind, nd->n_in, b->x);
      b->done[v] = b->gen;
      sp--;
    }
  }
  return true;
}

/* Whether a node hashed anew (roots: all of them) meets another node of
 * its hash in the rewritten graph: one of g's whose hash stands, or
 * another hashed anew. graph_merge_duplicates would merge the two (or, on
 * a collision of hashes alone, compare them and not), and in either case
 * the rewrite is left to the built graph. A node of g that becomes dead
 * counts too: the merge runs before dead nodes are removed, and keeps
 * whichever comes first. */
static bool computes_twice(OptBase *b, const int32_t *roots, int n_roots) {
  size_t mask = b->hash_cap - 1;
  for (int r = 0; r < n_roots; r++) {
    int v = roots[r];
    if (!merges(vnode(b, v))) continue;
    uint64_t hv = b->h2[v];
    for (size_t at = hv & mask; b->by_hash[at] >= 0; at = (at + 1) & mask) {
      int u = b->by_hash[at];
      if (b->h[u] == hv && u != v && !affected(b, u)) return true;
    }
    size_t at = hv & mask;
    for (; b->anew_gen[at] == b->gen; at = (at + 1) & mask)
      if (b->h2[b->anew[at]] == hv) return true;
    b->anew_gen[at] = b->gen, b->anew[at] = v;
  }
  return false;
}

OptDelta opt_delta_hash(OptBase *b, OptInst *in, const TensorRef *bind, const TensorRef *replace,
                        uint64_t *hash) {
  const Graph *g = b->g;
  const OptUses *u = b->u;
  int n = b->n;
  if (++b->gen == 0) { /* the marks wrapped: clear them */
    size_t cap = (size_t)n + OPT_MAX_SIDE + 1;
    memset(b->desc, 0, cap * sizeof *b->desc), memset(b->repl, 0, cap * sizeof *b->repl);
    memset(b->seen, 0, cap * sizeof *b->seen), memset(b->done, 0, cap * sizeof *b->done);
    memset(b->absorbed, 0, cap * sizeof *b->absorbed), memset(b->head, 0, cap * sizeof *b->head);
    memset(b->pushed, 0, cap * sizeof *b->pushed);
    memset(b->anew_gen, 0, b->hash_cap * sizeof *b->anew_gen);
    b->gen = 1;
  }
  b->in = in, b->k = in->n_new, b->n_rep = in->g->n_outputs;
  if (in->built_only || !in->hs || b->k > OPT_MAX_SIDE || b->n_rep > OPT_MAX_SIDE ||
      in->g->n_inputs > OPT_MAX_SIDE) /* PET's mutants may read more */
    return OPT_DELTA_BUILD;
  /* A variable bound to a node dead before the rewrite (only a window cut
   * from a model has such nodes) is left to the built graph. */
  for (int v = 0; v < in->g->n_inputs; v++) {
    b->bind[v] = bind[v];
    if (in->input_read[v] && (bind[v].node < 0 || !b->live[bind[v].node])) return OPT_DELTA_BUILD;
  }
  for (int o = 0; o < b->n_rep; o++) {
    TensorRef r = in->g->outputs[o];
    int s = in->slot[r.node];
    b->rep[o] = replace[o];
    b->to[o] = s < 0 ? bind[-1 - s] : (TensorRef){n + s, r.out};
    b->active[o] = b->to[o].node != replace[o].node || b->to[o].out != replace[o].out;
    if (!b->active[o]) continue;
    b->repl[replace[o].node] = b->gen;
    if (vdtype(b, b->to[o].node) != g->nodes[replace[o].node].dtype) return OPT_DELTA_BUILD;
  }
  /* An output replaced by a tensor that is itself replaced (a variable
   * bound to another output): the uses move twice; left to the built graph. */
  for (int o = 0; o < b->n_rep; o++)
    for (int q = 0; q < b->n_rep && b->active[o]; q++)
      if (b->active[q] && b->to[o].node == b->rep[q].node && b->to[o].out == b->rep[q].out)
        return OPT_DELTA_BUILD;
  /* The nodes downstream of a replaced tensor (in g), and the new ones,
   * whose edges are redirected too: graph_replace_uses runs after they
   * are added. */
  int n_roots = 0, sp = 0;
  int32_t *roots = b->user2; /* free until opt_delta_cost */
  for (int i = 0; i < b->k; i++) {
    const Node *nd = &in->g->nodes[in->order[i]];
    if (nd->n_in > 8) return OPT_DELTA_BUILD;
    for (int j = 0; j < nd->n_in; j++) {
      TensorRef r = nd->in[j];
      int s = in->slot[r.node];
      b->new_in[i][j] = sub(b, s < 0 ? bind[-1 - s] : (TensorRef){n + s, r.out});
    }
    roots[n_roots++] = n + i;
  }
  for (int o = 0; o < b->n_rep; o++) {
    if (!b->active[o]) continue;
    int x = b->rep[o].node;
    for (int e = u->start[x]; e < u->start[x + 1]; e++) {
      int y = u->user[e];
      if (g->nodes[y].in[u->slot[e]].out != b->rep[o].out || b->desc[y] == b->gen) continue;
      b->desc[y] = b->gen;
      b->stack[sp++] = y;
    }
  }
  while (sp) {
    int y = b->stack[--sp];
    if (g->nodes[y].kind == OP_OPAQUE) return OPT_DELTA_BUILD;
    roots[n_roots++] = y;
    for (int e = u->start[y]; e < u->start[y + 1]; e++) {
      int z = u->user[e];
      if (b->desc[z] != b->gen) b->desc[z] = b->gen, b->stack[sp++] = z;
    }
  }
  if (!hash_affected(b, roots, n_roots)) return OPT_DELTA_CYCLE;
  b->twice = b->unmerged || computes_twice(b, roots, n_roots);
  uint64_t h = hash_mix(0x67726170, (uint64_t)g->n_outputs);
  for (int i = 0; i < g->n_outputs; i++) {
    TensorRef t = sub(b, g->outputs[i]);
    h = hash_mix(h, hash_mix(vhash(b, t.node), (uint64_t)t.out));
  }
  *hash = h;
  return OPT_DELTA_OK;
}

/* Whether virtual node v is computed from weights alone. */
static bool vweight(const OptBase *b, int v) { return v < b->n ? b->w[v] : b->w2[v]; }

/* Marks v dead and releases its inputs, and theirs in turn. */
static void kill(OptBase *b, int v0) {
  int sp = 0;
  b->dead2[v0] = true;
  b->stack[sp++] = v0;
  while (sp) {
    int v = b->stack[--sp];
    const Node *nd = vnode(b, v);
    for (int j = 0; j < nd->n_in; j++) {
      int t = vin(b, v, j).node;
      if (--b->uses2[t] == 0 && !b->dead2[t] && !(t < b->n && b->gin[t]))
        b->dead2[t] = true, b->stack[sp++] = t;
    }
  }
}

/* opt_bias_value_per_channel over the rewritten graph, with constants'
 * verdicts remembered. */
static bool vbias_per_channel(OptBase *b, TensorRef r, const Shape *out, int depth) {
  const Node *n = vnode(b, r.node);
  if (n->kind == OP_CONST) return opt_bias_per_channel(b->pr->channels, n->value, out, NULL);
  if (depth == 0 || !vweight(b, r.node) || n->n_in > OPT_BIAS_MAX_IN ||
      !shape_equal(&n->out[r.out], out))
    return false;
  Shape in[OPT_BIAS_MAX_IN];
  for (int j = 0; j < n->n_in; j++) {
    TensorRef t = vin(b, r.node, j);
    in[j] = vnode(b, t.node)->out[t.out];
  }
  if (!opt_bias_keeps_channels(n, in)) return false;
  for (int j = 0; j < n->n_in; j++)
    if (!vbias_per_channel(b, vin(b, r.node, j), &in[j], depth - 1)) return false;
  return true;
}

/* How opt_fuse_bias refolds convolution c of the rewritten graph, with
 * user2 its only consumers; marks what it absorbs. */
static uint8_t refold(OptBase *b, int c) {
  const Node *cn = vnode(b, c);
  int u = b->user2[c];
  if (u < 0) return OPT_FUSE_NONE;
  const Node *un = vnode(b, u);
  if (un->kind == OP_EWADD && cn->n_in == 2) {
    TensorRef a = vin(b, u, 0), other = a.node == c ? vin(b, u, 1) : a;
    if (other.node == c || cn->out[0].ndim != 4 ||
        !vbias_per_channel(b, other, &cn->out[0], OPT_BIAS_DEPTH))
      return OPT_FUSE_NONE;
    b->absorbed[u] = b->gen;
    uint8_t fuse = OPT_FUSE_BIAS;
    int u2 = b->user2[u]; /* the refolded convolution takes over u's uses */
    int act = u2 >= 0 ? act_of_node(vnode(b, u2)) : ACT_NONE;
    if (act != ACT_NONE) fuse |= (uint8_t)act, b->absorbed[u2] = b->gen;
    return fuse;
  }
  int act = act_of_node(un);
  if (act == ACT_NONE) return OPT_FUSE_NONE;
  b->absorbed[u] = b->gen;
  return (uint8_t)act;
}

static int vplain(OptBase *b, int v, double *us, Diag *d) {
  bool base = v < b->n;
  double *slot = base ? &b->plain[v] : &b->in->plain[v - b->n];
  if (isnan(*slot)) {
    int rc = base ? plain_cost(b->pr, b->g, v, slot, d)
                  : plain_cost(b->pr, b->in->g, b->in->order[v - b->n], slot, d);
    if (rc) return rc;
  }
  *us = *slot;
  return TEQ_OK;
}

static int vfused(OptBase *b, int v, int fuse, double *us, Diag *d) {
  bool base = v < b->n;
  double *slot = base ? &b->fused[(size_t)v * OPT_FUSE__COUNT + (size_t)fuse]
                      : &b->in->fused[(size_t)(v - b->n) * OPT_FUSE__COUNT + (size_t)fuse];
  if (isnan(*slot)) {
    int rc = base ? fused_cost(b->pr, b->g, v, fuse, slot, d)
                  : fused_cost(b->pr, b->in->g, b->in->order[v - b->n], fuse, slot, d);
    if (rc) return rc;
  }
  *us = *slot;
  return TEQ_OK;
}

/* Where opt_fuse_bias leaves a refolded convolution, which decides where
 * opt_graph_cost's sum takes its cost: appended by the pass that folds its
 * bias or activation (and, with both, by a second pass); appended once,
 * its activation then set in place (bias.c: push_through_concat); left in
 * place with its activation set; or appended with the new concat that
 * took its consumer's bias, at that concat's turn. */
enum { PLACE_REFOLD, PLACE_ONCE, PLACE_IN_SITU, PLACE_BY_CONCAT };

/* Whether virtual node v is a convolution without an activation read by
 * reader alone (bare: and without a bias). */
static bool conv_for(const OptBase *b, int v, int reader, bool bare) {
  const Node *n = vnode(b, v);
  return n->kind == OP_CONV2D && b->user2[v] == reader &&
         n->params.v[b->pr->act_i].i[0] == ACT_NONE && !op_output_pooled(n) &&
         (!bare || n->n_in == 2);
}

/* The refolded convolution whose bias absorbs ewadd e, read by reader
 * alone; -1 if none. */
static int folded_into(const OptBase *b, int e, int reader) {
  const Node *en = vnode(b, e);
  if (en->kind != OP_EWADD || b->user2[e] != reader || b->absorbed[e] != b->gen) return -1;
  for (int k = 0; k < en->n_in; k++) {
    int c = vin(b, e, k).node;
    if (b->head[c] == b->gen && b->fuse2[c] == OPT_FUSE_BIAS && b->user2[c] == e)
      return c;
  }
  return -1;
}

/* What opt_fuse_bias pushes through concat v of the rewritten graph
 * (bias.c: push_through_concat): its consumer's per-channel bias into its
 * bare convolutions (then an activation after it), or an activation into
 * convolutions, including those a first pass refolds with their bias. */
static void push_through_concat(OptBase *b, int v) {
  const Node *cat = vnode(b, v);
  int u = b->user2[v];
  if (!opt_is_channel_concat(cat) || u < 0) return;
  const Node *un = vnode(b, u);
  int act = act_of_node(un);
  if (un->kind == OP_EWADD) {
    for (int j = 0; j < cat->n_in; j++)
      if (!conv_for(b, vin(b, v, j).node, v, true)) return;
    TensorRef other = vin(b, u, 0);
    if (other.node == v) other = vin(b, u, 1);
    if (other.node == v || !vbias_per_channel(b, other, &cat->out[0], OPT_BIAS_DEPTH)) return;
    int u2 = b->user2[u]; /* the new concat takes over u's uses */
    int act2 = u2 >= 0 ? act_of_node(vnode(b, u2)) : ACT_NONE;
    b->pushed[v] = b->gen, b->absorbed[u] = b->gen;
    if (act2 != ACT_NONE) b->absorbed[u2] = b->gen;
    for (int j = 0; j < cat->n_in; j++) {
      int c = vin(b, v, j).node;
      b->head[c] = b->gen, b->fuse2[c] = (uint8_t)(OPT_FUSE_BIAS | act2),
      b->place2[c] = PLACE_BY_CONCAT;
    }
    return;
  }
  if (act == ACT_NONE) return;
  for (int j = 0; j < cat->n_in; j++) {
    int c = vin(b, v, j).node;
    if (!conv_for(b, c, v, false) && folded_into(b, c, v) < 0) return;
  }
  b->absorbed[u] = b->gen;
  for (int j = 0; j < cat->n_in; j++) {
    int c = vin(b, v, j).node, f = folded_into(b, c, v);
    if (f >= 0) {
      b->fuse2[f] = (uint8_t)(OPT_FUSE_BIAS | act), b->place2[f] = PLACE_ONCE;
    } else {
      b->head[c] = b->gen, b->fuse2[c] = (uint8_t)act, b->place2[c] = PLACE_IN_SITU;
    }
  }
}

int opt_delta_cost(OptBase *b, double *us, Diag *d) {
  const Graph *g = b->g;
  int n = b->n, k = b->k, nv = n + k;
  if (b->twice) return OPT_DELTA_BUILD;
  /* Weights among the new nodes; a rewrite that changes what is a weight
   * downstream is left to the built graph. */
  for (int i = 0; i < k; i++) { /* as opt_weight_only */
    const Node *nd = vnode(b, n + i);
    bool all;
    if (nd->kind == OP_INPUT || nd->kind == OP_OPAQUE) {
      all = false;
    } else if (op_def(nd->kind)->flags & OPF_SOURCE) {
      all = true;
    } else {
      all = nd->n_in > 0;
      for (int j = 0; j < nd->n_in && all; j++) all = vweight(b, b->new_in[i][j].node);
    }
    b->w2[n + i] = all;
  }
  for (int o = 0; o < b->n_rep; o++)
    if (b->active[o] && vweight(b, b->to[o].node) != b->w[b->rep[o].node]) return OPT_DELTA_BUILD;
  /* Uses in the rewritten graph, then what is left dead. */
  memcpy(b->uses2, b->uses, (size_t)n * sizeof *b->uses2);
  for (int v = 0; v < n; v++) b->dead2[v] = !b->live[v];
  for (int i = 0; i < k; i++) b->uses2[n + i] = 0, b->dead2[n + i] = false;
  for (int i = 0; i < k; i++)
    for (int j = 0; j < vnode(b, n + i)->n_in; j++) b->uses2[b->new_in[i][j].node]++;
  for (int o = 0; o < b->n_rep; o++) {
    if (!b->active[o]) continue;
    TensorRef r = b->rep[o];
    int moved = 0;
    for (int e = b->u->start[r.node]; e < b->u->start[r.node + 1]; e++)
      moved += b->live[b->u->user[e]] && g->nodes[b->u->user[e]].in[b->u->slot[e]].out == r.out;
    for (int i = 0; i < g->n_outputs; i++)
      moved += g->outputs[i].node == r.node && g->outputs[i].out == r.out;
    b->uses2[r.node] -= moved;
    b->uses2[b->to[o].node] += moved;
  }
  for (int o = 0; o < b->n_rep; o++) {
    int x = b->rep[o].node;
    if (b->active[o] && b->uses2[x] == 0 && !b->dead2[x] && !b->gin[x]) kill(b, x);
  }
  for (int i = 0; i < k; i++)
    if (b->uses2[n + i] == 0 && !b->dead2[n + i]) kill(b, n + i);
  /* Each node's only consumer (opt_fuse_bias: exactly one edge, and not a
   * graph output), -1 for none. */
  for (int v = 0; v < nv; v++) b->user2[v] = -2;
  for (int v = 0; v < nv; v++) {
    if (b->dead2[v]) continue;
    int n_in = vnode(b, v)->n_in;
    for (int j = 0; j < n_in; j++) {
      int t = vin(b, v, j).node;
      b->user2[t] = b->user2[t] == -2 ? v : -1;
    }
  }
  for (int i = 0; i < g->n_outputs; i++) b->user2[sub(b, g->outputs[i]).node] = -1;
  for (int v = 0; v < nv; v++)
    if (b->user2[v] == -2) b->user2[v] = -1;
  /* Refolding. */
  for (int i = 0; i < b->n_convs; i++) {
    int c = b->convs[i];
    if (b->dead2[c]) continue;
    b->fuse2[c] = refold(b, c);
    b->head[c] = b->gen, b->place2[c] = PLACE_REFOLD;
  }
  for (int v = n; v < nv; v++) {
    const Node *nd = vnode(b, v);
    if (b->dead2[v] || nd->kind != OP_CONV2D || nd->params.v[b->pr->act_i].i[0] != ACT_NONE ||
        op_output_pooled(nd))
      continue;
    b->fuse2[v] = refold(b, v);
    b->head[v] = b->gen, b->place2[v] = PLACE_REFOLD;
  }
  for (int v = 0; v < nv; v++)
    if (!b->dead2[v]) push_through_concat(b, v);
  /* The sum in opt_graph_cost's order over the refolded graph: the nodes
   * left as they were, in the rewritten graph's order (g's, then the new
   * ones); then the convolutions refolded once, which opt_fuse_bias
   * appended in that order; then those refolded twice (bias, then
   * activation), appended by its second pass. */
  double total = 0;
  int n1 = 0, n2 = 0, rc = TEQ_OK;
  for (int v = 0; v < nv && rc == TEQ_OK; v++) {
    if (b->dead2[v] || b->absorbed[v] == b->gen) continue;
    if (vweight(b, v)) continue;
    double c = 0;
    if (b->pushed[v] == b->gen) { /* its convolutions, then the new concat: appended */
      const Node *cat = vnode(b, v);
      for (int j = 0; j < cat->n_in && rc == TEQ_OK; j++) {
        int cv = vin(b, v, j).node;
        rc = vfused(b, cv, b->fuse2[cv], &c, d);
        b->l1[n1++] = c;
      }
      if (rc == TEQ_OK) rc = vplain(b, v, &c, d);
      b->l1[n1++] = c;
      continue;
    }
    uint8_t fuse = b->head[v] == b->gen ? b->fuse2[v] : OPT_FUSE_NONE;
    if (fuse != OPT_FUSE_NONE) {
      uint8_t place = b->place2[v];
      if (place == PLACE_BY_CONCAT) continue;
      rc = vfused(b, v, fuse, &c, d);
      bool both = (fuse & OPT_FUSE_BIAS) && (fuse & OPT_FUSE_ACT);
      if (place == PLACE_IN_SITU) total += c;
      else if (place == PLACE_REFOLD && both) b->l2[n2++] = c;
      else b->l1[n1++] = c;
      continue;
    }
    rc = vplain(b, v, &c, d);
    if (c != 0) total += c;
  }
  if (rc) return rc;
  for (int i = 0; i < n1; i++) total += b->l1[i];
  for (int i = 0; i < n2; i++) total += b->l2[i];
  *us = total;
  return OPT_DELTA_OK;
}

/* ---- a whole graph ---- */

int opt_pricer_price(OptPricer *p, const Graph *g, double *us, Diag *d) {
  /* The rewrite that adds nothing and replaces nothing, set up on g as a
   * base: what opt_delta_cost then sums is g refolded and priced. */
  OptUses u;
  OptBase *b = NULL;
  OptInst none = {.g = graph_new()};
  int rc = none.g ? opt_uses_build(g, &u) : TEQ_ERR_NOMEM;
  if (rc) {
    graph_free(none.g);
    return rc;
  }
  rc = opt_base_new(p, g, &u, &b, d);
  if (rc == TEQ_OK) rc = opt_inst_prepare(&none);
  bool all_live = true;
  for (int v = 0; rc == TEQ_OK && v < g->n_nodes; v++) all_live &= b->live[v];
  uint64_t hash;
  if (rc == TEQ_OK && all_live && opt_delta_hash(b, &none, NULL, NULL, &hash) == OPT_DELTA_OK) {
    b->twice = false; /* g is priced as it is, merged or not */
    rc = opt_delta_cost(b, us, d);
  } else if (rc == TEQ_OK) {
    rc = OPT_DELTA_BUILD; /* dead nodes, which opt_graph_cost would price: the caller's */
  }
  opt_base_free(b);
  opt_uses_fini(&u);
  free(none.hs), free(none.plain), free(none.fused);
  graph_free(none.g);
  return rc;
}
