/* split.c: PET's program splitting (OSDI'21, section 6.1): the subprograms
 * of a graph that the mutation generator is asked about.
 *
 * The graph is cut at every operator outside PET's Table 1 (activations,
 * pooling, normalization, anything with a fused activation or bias): what
 * remains falls apart into regions, maximal connected sets of multi-linear
 * operators. Operators computed from weights alone belong to no region;
 * they are constants to the search.
 *
 * A region is often larger than the generator can afford (its DFS grows
 * quickly with the operators it must reproduce), so PET queries it a
 * subset of operators at a time (Algorithm 2, line 26). Ours are the
 * subsets the generator can do something with: each conv or matmul on its
 * own (layouts around it, dilation phases, space-to-depth), and each pair
 * of them reading the same data tensor, which merges into one operator on
 * zero-padded, concatenated kernels (Fig. 10a; the Inception branches that
 * share an input), and each pair of independent convs of one shape on
 * different tensors (section 6.1: subprograms without a data dependency,
 * merged into a grouped operator; Inception's parallel 1x3 convs, NasNet's
 * parallel separable convs). Larger subsets are not formed: merging three
 * needs more weight operators than pet_mutate lets a mutant hold. The operators
 * around a subset (bias additions, layout operators, other convs) stay as
 * they are, as PET keeps "the remaining operators unchanged".
 *
 * Each subprogram is a standalone Graph: its inputs are the tensors it
 * reads from outside, weights included, so that the random tests in Z_p
 * treat kernels as variables (real weights are not integers) and a mutant
 * holds for every value of them; its outputs are the tensors read outside.
 * The search splices a corrected mutant back with in[] and out[]. */
#include <stdlib.h>
#include <string.h>

#include "optimize/pet/pet.h"
#include "runtime/cost.h"

bool pet_is_multilinear(const Graph *g, int id) {
  const Node *n = &g->nodes[id];
  const OpDef *def = op_def(n->kind);
  if (!(def->flags & OPF_MULTILINEAR) || (def->flags & OPF_OPAQUE)) return false;
  int act = param_index(n->kind, "act");
  if ((act >= 0 && param_int(&n->params, act) != ACT_NONE) || op_output_pooled(n)) return false;
  if ((n->kind == OP_CONV2D || n->kind == OP_GEMM) && n->n_in > 2) return false; /* bias: affine */
  if (n->kind == OP_PAD && (param_float(&n->params, param_index(OP_PAD, "value")) != 0 ||
                            param_int(&n->params, param_index(OP_PAD, "mode")) != 0))
    return false;
  return true;
}

void pet_split_fini(PetSplit *s) {
  for (int i = 0; s->v && i < s->n; i++) {
    PetSubprogram *p = &s->v[i];
    graph_free(p->graph);
    free(p->nodes), free(p->in), free(p->out);
  }
  free(s->v);
  memset(s, 0, sizeof *s);
}

typedef struct Splitter {
  const Graph *g;
  int32_t *order, *pos;   /* a topological order and each node's place in it */
  bool *weight;           /* computed from weights alone */
  int32_t *uses, *off;    /* graph_use_counts */
  int32_t *parent;        /* union-find over the region nodes */
  PetSplit *out;
  int cap;
} Splitter;

static int find_root(int32_t *parent, int x) {
  while (parent[x] != x) x = parent[x] = parent[parent[x]];
  return x;
}

/* The standalone graph of nodes[0..n) (in topological order). */
static int extract(Splitter *S, const int32_t *nodes, int n, int region, Diag *d) {
  const Graph *g = S->g;
  PetSubprogram sp = {.region = region, .n_nodes = n};
  int max_in = 0, max_out = 0;
  for (int k = 0; k < n; k++) max_in += g->nodes[nodes[k]].n_in, max_out += g->nodes[nodes[k]].n_out;
  sp.nodes = malloc((size_t)n * sizeof *sp.nodes);
  sp.in = malloc(((size_t)max_in + 1) * sizeof *sp.in);
  sp.out = malloc(((size_t)max_out + 1) * sizeof *sp.out);
  int32_t *map = malloc((size_t)n * sizeof *map), *in_id = malloc(((size_t)max_in + 1) * sizeof *in_id);
  sp.graph = graph_new();
  int rc = sp.nodes && sp.in && sp.out && map && in_id && sp.graph ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) memcpy(sp.nodes, nodes, (size_t)n * sizeof *nodes);
  int n_in = 0;
  for (int k = 0; k < n && rc == TEQ_OK; k++) {
    const Node *nd = &g->nodes[nodes[k]];
    TensorRef in[8];
    if (nd->n_in > 8) {
      rc = TEQ_ERR_UNSUPPORTED;
      break;
    }
    for (int j = 0; j < nd->n_in && rc == TEQ_OK; j++) {
      TensorRef r = nd->in[j];
      int inside = -1;
      for (int q = 0; q < k; q++)
        if (nodes[q] == r.node) inside = q;
      if (inside >= 0) {
        in[j] = (TensorRef){map[inside], r.out};
        continue;
      }
      int e = 0;
      while (e < n_in && (sp.in[e].node != r.node || sp.in[e].out != r.out)) e++;
      if (e == n_in) {
        int id = graph_add_input(sp.graph, NULL, graph_shape(g, r), g->nodes[r.node].dtype, d);
        if (id < 0) {
          rc = id;
          break;
        }
        sp.in[n_in] = r, in_id[n_in++] = id;
      }
      in[j] = (TensorRef){in_id[e], 0};
    }
    if (rc) break;
    int id = graph_add_node(sp.graph, nd->kind, in, nd->n_in, nd->n_out, &nd->params, NULL, d);
    if (id < 0) rc = id;
    else map[k] = id;
  }
  /* Outputs: every tensor used more often than the subset uses it. */
  for (int k = 0; k < n && rc == TEQ_OK; k++) {
    int id = nodes[k];
    for (int o = 0; o < g->nodes[id].n_out && rc == TEQ_OK; o++) {
      int inside = 0;
      for (int q = 0; q < n; q++) {
        const Node *u = &g->nodes[nodes[q]];
        for (int j = 0; j < u->n_in; j++) inside += u->in[j].node == id && u->in[j].out == o;
      }
      if (S->uses[S->off[id] + o] <= inside) continue;
      int r = graph_add_output(sp.graph, (TensorRef){map[k], o}, NULL, d);
      if (r < 0) rc = r;
      else sp.out[sp.graph->n_outputs - 1] = (TensorRef){id, o};
    }
  }
  free(map);
  free(in_id);
  if (rc == TEQ_OK && sp.graph->n_outputs == 0) rc = TEQ_ERR_INPUT; /* dead: nothing to mutate */
  if (rc == TEQ_OK) {
    for (int k = 0; k < n; k++) sp.flops += cost_node_flops(g, nodes[k]);
    sp.hash = graph_hash(sp.graph, NULL);
  }
  if (rc == TEQ_OK && S->out->n == S->cap) {
    int cap = S->cap ? 2 * S->cap : 16;
    PetSubprogram *v = realloc(S->out->v, (size_t)cap * sizeof *v);
    if (!v) rc = TEQ_ERR_NOMEM;
    else S->out->v = v, S->cap = cap;
  }
  if (rc) {
    graph_free(sp.graph);
    free(sp.nodes), free(sp.in), free(sp.out);
    return rc == TEQ_ERR_INPUT ? TEQ_OK : rc;
  }
  S->out->v[S->out->n++] = sp;
  return TEQ_OK;
}

/* Whether b depends on a (a before b in topological order): a walk back
 * from b over nodes after a. mark[] is all false before and after. */
static bool depends(Splitter *S, int a, int b, int32_t *stack, bool *mark) {
  const Graph *g = S->g;
  int n = 0, top = 0;
  bool found = false;
  stack[n++] = b, mark[b] = true;
  while (top < n && !found) {
    const Node *nd = &g->nodes[stack[top++]];
    for (int j = 0; j < nd->n_in && !found; j++) {
      int p = nd->in[j].node;
      found = p == a;
      if (!found && !mark[p] && S->pos[p] > S->pos[a]) mark[p] = true, stack[n++] = p;
    }
  }
  for (int k = 0; k < n; k++) mark[stack[k]] = false;
  return found;
}

bool pet_groupable(const Graph *g, int a, int b) {
  const Node *na = &g->nodes[a], *nb = &g->nodes[b];
  if (na->kind != OP_CONV2D || nb->kind != OP_CONV2D) return false;
  const Shape *wa = graph_shape(g, na->in[1]), *wb = graph_shape(g, nb->in[1]);
  if (!shape_equal(graph_shape(g, na->in[0]), graph_shape(g, nb->in[0])) ||
      !shape_equal(&na->out[0], &nb->out[0]) || wa->d[0] != wb->d[0] || wa->d[1] != wb->d[1])
    return false;
  static const char *const same[] = {"stride", "dilation", "groups"};
  for (int k = 0; k < 3; k++) {
    int i = param_index(OP_CONV2D, same[k]);
    if (memcmp(&na->params.v[i], &nb->params.v[i], sizeof na->params.v[i])) return false;
  }
  return true;
}

/* A conv or matmul the generator can mutate: plain, on a data tensor, with
 * a weight as its second operand (so that kernel operators are free). */
static bool is_core(const Splitter *S, int id) {
  const Node *n = &S->g->nodes[id];
  if (n->kind != OP_CONV2D && n->kind != OP_MATMUL) return false;
  if (S->weight[id] || !pet_is_multilinear(S->g, id) || n->n_in != 2) return false;
  if (S->weight[n->in[0].node] || !S->weight[n->in[1].node]) return false;
  const Shape *x = graph_shape(S->g, n->in[0]);
  return shape_is_known(x) && shape_is_known(&n->out[0]) && (n->kind != OP_CONV2D || x->ndim == 4);
}

int pet_split(const Graph *g, const PetSplitOptions *o, PetSplit *out, Diag *d) {
  int max_sub = o && o->max_subprograms > 0 ? o->max_subprograms : PET_SPLIT_MAX_SUBPROGRAMS;
  memset(out, 0, sizeof *out);
  size_t n = (size_t)g->n_nodes + 1;
  Splitter S = {.g = g, .out = out};
  S.order = malloc(n * sizeof *S.order);
  S.pos = malloc(n * sizeof *S.pos);
  S.weight = calloc(n, sizeof *S.weight);
  S.parent = malloc(n * sizeof *S.parent);
  int32_t *core = malloc(n * sizeof *core);
  int rc = S.order && S.pos && S.weight && S.parent && core ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = graph_topo_order(g, S.order);
  if (rc == TEQ_OK && !(S.uses = graph_use_counts(g, &S.off))) rc = TEQ_ERR_NOMEM;
  for (int k = 0; k < g->n_nodes && rc == TEQ_OK; k++) {
    int id = S.order[k];
    const Node *nd = &g->nodes[id];
    S.pos[id] = k;
    S.parent[id] = id;
    if (nd->kind == OP_INPUT || nd->kind == OP_OPAQUE) continue;
    bool all = nd->n_in > 0 || (op_def(nd->kind)->flags & OPF_SOURCE);
    for (int j = 0; j < nd->n_in && all; j++) all = S.weight[nd->in[j].node];
    S.weight[id] = all;
  }
  /* Regions: multi-linear data operators joined by the edges between them. */
  int n_core = 0;
  for (int k = 0; k < g->n_nodes && rc == TEQ_OK; k++) {
    int id = S.order[k];
    const Node *nd = &g->nodes[id];
    bool lin = !(op_def(nd->kind)->flags & OPF_SOURCE) && !S.weight[id] && pet_is_multilinear(g, id);
    if (!lin) {
      S.parent[id] = -1;
      continue;
    }
    for (int j = 0; j < nd->n_in; j++) {
      int p = nd->in[j].node;
      if (S.parent[p] >= 0 && !S.weight[p] && !(op_def(g->nodes[p].kind)->flags & OPF_SOURCE)) {
        int a = find_root(S.parent, p), b = find_root(S.parent, id);
        if (a != b) S.parent[a] = b;
      }
    }
    if (is_core(&S, id)) core[n_core++] = id;
  }
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++)
    if (S.parent[id] >= 0 && !(op_def(g->nodes[id].kind)->flags & OPF_SOURCE) && !S.weight[id])
      out->n_regions += find_root(S.parent, id) == id;
  /* Subprograms: each core operator, then each pair reading one tensor,
   * in topological order; then independent pairs. */
  for (int a = 0; a < n_core && rc == TEQ_OK && out->n < max_sub; a++) {
    int ia = core[a];
    rc = extract(&S, &core[a], 1, find_root(S.parent, ia), d);
    for (int b = a + 1; b < n_core && rc == TEQ_OK && out->n < max_sub; b++) {
      int ib = core[b];
      const Node *na = &g->nodes[ia], *nb = &g->nodes[ib];
      if (na->kind != nb->kind || na->in[0].node != nb->in[0].node || na->in[0].out != nb->in[0].out)
        continue;
      int32_t pair[2] = {ia, ib}; /* core[] is in topological order */
      rc = extract(&S, pair, 2, find_root(S.parent, ia), d);
    }
  }
  /* Independent pairs: parallel branches lie close in topological order,
   * so each conv is paired with the next few groupable ones only (linear
   * in the graph's size, as the search's windows are). */
  int32_t *stack = rc ? NULL : malloc(n * sizeof *stack);
  bool *mark = rc ? NULL : calloc(n, sizeof *mark);
  if (!rc && (!stack || !mark)) rc = TEQ_ERR_NOMEM;
  for (int a = 0; a < n_core && rc == TEQ_OK && out->n < max_sub; a++) {
    int ia = core[a], tried = 0;
    for (int b = a + 1; b < n_core && tried < PET_SPLIT_PAIR_REACH && rc == TEQ_OK && out->n < max_sub; b++) {
      int ib = core[b];
      const Node *na = &g->nodes[ia], *nb = &g->nodes[ib];
      if ((na->in[0].node == nb->in[0].node && na->in[0].out == nb->in[0].out) ||
          !pet_groupable(g, ia, ib))
        continue;
      tried++;
      if (depends(&S, ia, ib, stack, mark)) continue;
      int32_t pair[2] = {ia, ib};
      rc = extract(&S, pair, 2, find_root(S.parent, ia), d);
    }
  }
  free(stack), free(mark);
  free(S.order), free(S.pos), free(S.weight), free(S.parent), free(core);
  free(S.uses), free(S.off);
  if (rc) pet_split_fini(out);
  return rc;
}
