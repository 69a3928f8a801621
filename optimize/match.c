/* match.c: where a rule's source graph occurs in a model graph.
 *
 * Matching starts at a graph node whose kind is that of the node making the
 * source's first output, and walks the source's inputs downward: each
 * operator must have the same kind, arity and parameters, each variable
 * binds one graph tensor (the same one wherever it occurs), and inputs of a
 * commutative operator may match in either order. Source nodes no output
 * path reaches downward (a second output's operators) are then matched
 * outward, among the consumers of tensors already bound. Every choice is
 * backtracked, so all matches are found.
 *
 * A match is kept only if nothing outside it reads a tensor the match
 * computes internally: every tensor used outside must be one of the
 * source's outputs, which the rewrite replaces. */
#include <string.h>
#include <stdlib.h>

#include "optimize/opt_int.h"

int opt_uses_build(const Graph *g, OptUses *u) {
  memset(u, 0, sizeof *u);
  int n = g->n_nodes, edges = 0;
  for (int i = 0; i < n; i++) edges += g->nodes[i].n_in;
  u->start = calloc((size_t)n + 1, sizeof *u->start);
  u->user = malloc(((size_t)edges + 1) * sizeof *u->user);
  u->slot = malloc(((size_t)edges + 1) * sizeof *u->slot);
  u->is_output = calloc((size_t)n + 1, sizeof *u->is_output);
  if (!u->start || !u->user || !u->slot || !u->is_output) {
    opt_uses_fini(u);
    return TEQ_ERR_NOMEM;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) u->start[g->nodes[i].in[j].node + 1]++;
  for (int i = 0; i < n; i++) u->start[i + 1] += u->start[i];
  int32_t *fill = calloc((size_t)n + 1, sizeof *fill);
  if (!fill) {
    opt_uses_fini(u);
    return TEQ_ERR_NOMEM;
  }
  for (int i = 0; i < n; i++)
    for (int j = 0; j < g->nodes[i].n_in; j++) {
      int p = g->nodes[i].in[j].node, at = u->start[p] + fill[p]++;
      u->user[at] = i, u->slot[at] = j;
    }
  free(fill);
  for (int o = 0; o < g->n_outputs; o++) u->is_output[g->outputs[o].node] = true;
  return TEQ_OK;
}

void opt_uses_fini(OptUses *u) {
  free(u->start), free(u->user), free(u->slot), free(u->is_output);
  memset(u, 0, sizeof *u);
}

bool opt_is_depthwise(const Graph *side, int p) {
  const Node *n = &side->nodes[p];
  int gi = param_index(n->kind, "groups");
  if (gi < 0 || n->n_in < 2) return false;
  const Shape *w = graph_shape(side, n->in[1]), *x = graph_shape(side, n->in[0]);
  return w->ndim >= 2 && x->ndim >= 2 && w->d[1] == 1 && n->params.v[gi].i[0] == x->d[1] &&
         x->d[1] > 1;
}

bool opt_param_is_free(const Graph *side, int p, int i) {
  const Node *n = &side->nodes[p];
  const OpDef *def = op_def(n->kind);
  if ((def->flags & OPF_SOURCE) && n->kind != OP_INPUT) return true;
  const char *name = def->params[i].name;
  if (def->n_out_max != 1 && !strcmp(name, "sizes")) return true;
  if (!strcmp(name, "groups")) return opt_is_depthwise(side, p);
  return false;
}

typedef struct Search {
  const OptRule *rule;
  const Graph *P, *G;
  const OptUses *u;
  int max, found;
  bool stop;
  bool (*fn)(const OptMatch *m, void *ctx);
  void *ctx;
} Search;

/* The state one branch of the search carries: copied at each choice. */
typedef struct State {
  OptMatch m;
  int16_t pend_p[OPT_MAX_SIDE * 2];
  int32_t pend_g[OPT_MAX_SIDE * 2];
  int n_pend;
} State;

bool opt_broadcast_like(const Graph *side, int p, const Graph *g, int id) {
  const Node *a = &side->nodes[p], *b = &g->nodes[id];
  if (!(op_def(a->kind)->flags & OPF_BROADCAST)) return true;
  for (int j = 0; j < a->n_in && j < b->n_in; j++) {
    const Shape *pa = graph_shape(side, a->in[j]), *ga = graph_shape(g, b->in[j]);
    if (shape_equal(pa, &a->out[0]) != shape_equal(ga, &b->out[0])) return false;
    if (pa->ndim == 0 && shape_numel(ga) != 1) return false;
  }
  return true;
}

uint64_t opt_params_key(const Node *n, uint32_t free_mask) {
  const OpDef *def = op_def(n->kind);
  uint64_t h = 0x70617261;
  for (int i = 0; i < def->n_params; i++)
    if (!(free_mask >> i & 1)) h = hash_bytes(h, &n->params.v[i], sizeof n->params.v[i]);
  return h;
}

/* opt_params_key hashes what this compares; keep the two alike. */
static bool params_match(const OptRule *rule, int p, const Graph *G, int g) {
  const Node *a = &rule->src->nodes[p], *b = &G->nodes[g];
  const OpDef *def = op_def(a->kind);
  for (int i = 0; i < def->n_params; i++) {
    if (rule->free_params[p] >> i & 1) continue;
    if (memcmp(&a->params.v[i], &b->params.v[i], sizeof a->params.v[i])) return false;
  }
  if (rule->depthwise[p]) {
    const Shape *w = graph_shape(G, b->in[1]);
    if (w->ndim < 2 || w->d[1] != 1) return false;
  }
  return true;
}

static bool bind_var(State *s, int var, TensorRef r) {
  TensorRef *b = &s->m.bind[var];
  if (b->node < 0) {
    *b = r;
    return true;
  }
  return b->node == r.node && b->out == r.out;
}

static void solve(Search *S, State *s);

/* Pairs source node p with graph node g, then goes on with each way of
 * matching its inputs. */
static void pair_and_go(Search *S, const State *s0, int p, int g) {
  const Node *pn = &S->P->nodes[p], *gn = &S->G->nodes[g];
  if (s0->m.node[p] >= 0) {
    if (s0->m.node[p] != g) return;
    State s = *s0;
    solve(S, &s);
    return;
  }
  if (pn->kind != gn->kind || pn->n_in != gn->n_in || pn->n_out != gn->n_out) return;
  for (int q = 0; q < S->P->n_nodes; q++)
    if (s0->m.node[q] == g) return; /* one graph node per source node */
  if (!params_match(S->rule, p, S->G, g)) return;
  if (!opt_broadcast_like(S->P, p, S->G, g)) return;
  int orders = (op_def(pn->kind)->flags & OPF_COMMUTATIVE) && pn->n_in == 2 ? 2 : 1;
  for (int ord = 0; ord < orders && !S->stop; ord++) {
    State s = *s0;
    s.m.node[p] = g;
    s.m.swapped[p] = ord == 1;
    bool ok = true;
    for (int j = 0; j < pn->n_in && ok; j++) {
      TensorRef pr = pn->in[ord ? 1 - j : j], gr = gn->in[j];
      if (S->P->nodes[pr.node].kind == OP_INPUT) {
        ok = bind_var(&s, pr.node, gr);
      } else {
        ok = pr.out == gr.out;
        if (ok) {
          s.pend_p[s.n_pend] = (int16_t)pr.node;
          s.pend_g[s.n_pend++] = gr.node;
        }
      }
    }
    if (ok) solve(S, &s);
  }
}

/* Whether the match may be replaced: no tensor computed inside it and
 * read outside it, other than the source's outputs. */
static bool closed(const Search *S, const OptMatch *m) {
  const Graph *P = S->P, *G = S->G;
  for (int p = 0; p < P->n_nodes; p++) {
    int g = m->node[p];
    if (g < 0) continue;
    for (int o = 0; o < P->nodes[p].n_out; o++) {
      bool is_out = false;
      for (int k = 0; k < P->n_outputs; k++)
        is_out |= P->outputs[k].node == p && P->outputs[k].out == o;
      if (is_out) continue;
      for (int k = 0; k < G->n_outputs; k++)
        if (G->outputs[k].node == g && G->outputs[k].out == o) return false;
      for (int e = S->u->start[g]; e < S->u->start[g + 1]; e++) {
        int user = S->u->user[e];
        if (G->nodes[user].in[S->u->slot[e]].out != o) continue;
        bool inside = false;
        for (int q = 0; q < P->n_nodes && !inside; q++) inside = m->node[q] == user;
        if (!inside) return false;
      }
    }
  }
  return true;
}

static void solve(Search *S, State *s) {
  if (S->stop) return;
  if (s->n_pend > 0) {
    s->n_pend--;
    pair_and_go(S, s, s->pend_p[s->n_pend], s->pend_g[s->n_pend]);
    return;
  }
  const Graph *P = S->P;
  /* An operator of the source not matched yet: take the first one with a
   * bound input and try the consumers of that tensor. */
  for (int p = 0; p < P->n_nodes; p++) {
    const Node *pn = &P->nodes[p];
    if (pn->kind == OP_INPUT || s->m.node[p] >= 0) continue;
    for (int j = 0; j < pn->n_in; j++) {
      TensorRef pr = pn->in[j];
      TensorRef gr = P->nodes[pr.node].kind == OP_INPUT
                         ? s->m.bind[pr.node]
                         : (TensorRef){s->m.node[pr.node], pr.out};
      if (gr.node < 0) continue;
      for (int e = S->u->start[gr.node]; e < S->u->start[gr.node + 1] && !S->stop; e++) {
        int user = S->u->user[e];
        if (S->G->nodes[user].kind != pn->kind) continue;
        if (S->G->nodes[user].in[S->u->slot[e]].out != gr.out) continue;
        pair_and_go(S, s, p, user);
      }
      return; /* every match of p reads this tensor, so its consumers are all */
    }
    /* A source operator with no input (a constant tensor) is matched from
     * its consumers instead; keep looking. */
  }
  for (int p = 0; p < P->n_nodes; p++)
    if (P->nodes[p].kind != OP_INPUT && s->m.node[p] < 0) return; /* unreachable part */
  if (!closed(S, &s->m)) return;
  S->found++;
  if (!S->fn(&s->m, S->ctx) || S->found >= S->max) S->stop = true;
}

/* An operand in brief: its producer's kind and output, or any. */
static uint64_t operand_sig(const Graph *g, TensorRef r, bool var_is_any) {
  const Node *p = &g->nodes[r.node];
  if ((var_is_any && p->kind == OP_INPUT) || r.out >= 16) return 0xffff;
  return (uint64_t)p->kind << 4 | (uint64_t)r.out;
}

static OptRootSig sig_of(const Graph *g, int id, bool is_rule) {
  const Node *n = &g->nodes[id];
  uint64_t s = (uint64_t)(n->n_in & 0xff) | (uint64_t)(n->n_out & 0xff) << 16;
  if (is_rule && (op_def(n->kind)->flags & OPF_COMMUTATIVE) && n->n_in == 2) s |= 1u << 8;
  s |= (n->n_in > 0 ? operand_sig(g, n->in[0], is_rule) : 0xffff) << 32;
  s |= (n->n_in > 1 ? operand_sig(g, n->in[1], is_rule) : 0xffff) << 48;
  return s;
}

OptRootSig opt_root_sig(const Graph *src) { return sig_of(src, src->outputs[0].node, true); }
OptRootSig opt_node_sig(const Graph *g, int id) { return sig_of(g, id, false); }

/* Whether source node p could pair with graph node g as far as their
 * arity and their operands' kinds tell: a necessary condition of
 * pair_and_go, checked before any state is set up. The search tries every
 * rule with the right root kind at every node, and nearly all fail here. */
static bool may_pair(const Graph *P, int p, const Graph *G, int g) {
  const Node *pn = &P->nodes[p], *gn = &G->nodes[g];
  if (pn->kind != gn->kind || pn->n_in != gn->n_in || pn->n_out != gn->n_out) return false;
  int orders = (op_def(pn->kind)->flags & OPF_COMMUTATIVE) && pn->n_in == 2 ? 2 : 1;
  for (int ord = 0; ord < orders; ord++) {
    bool ok = true;
    for (int j = 0; j < pn->n_in && ok; j++) {
      TensorRef pr = pn->in[ord ? 1 - j : j], gr = gn->in[j];
      const Node *pc = &P->nodes[pr.node];
      ok = pc->kind == OP_INPUT || (pc->kind == G->nodes[gr.node].kind && pr.out == gr.out);
    }
    if (ok) return true;
  }
  return false;
}

int opt_match_at(const OptRule *rule, const Graph *g, const OptUses *u, int root, int max,
                 bool (*fn)(const OptMatch *m, void *ctx), void *ctx) {
  const TensorRef out0 = rule->src->outputs[0];
  if (g->nodes[root].n_out <= out0.out || !may_pair(rule->src, out0.node, g, root) ||
      !params_match(rule, out0.node, g, root) ||
      !opt_broadcast_like(rule->src, out0.node, g, root))
    return 0;
  Search S = {.rule = rule, .P = rule->src, .G = g, .u = u, .max = max, .fn = fn, .ctx = ctx};
  State s;
  memset(&s, 0, sizeof s);
  for (int i = 0; i < OPT_MAX_SIDE; i++) s.m.node[i] = -1, s.m.bind[i] = (TensorRef){-1, 0};
  pair_and_go(&S, &s, out0.node, root);
  return S.found;
}
