/* prove.c: the prover of one rule: ground instantiation of the axioms in
 * an e-graph, then a quantifier-free Z3 query.
 *
 * Both sides of the rule go into one e-graph (hash-consed nodes, classes of
 * equal tensors, each class with the shape the registry infers). Each round
 * matches every axiom side that can trigger against every class (matching
 * modulo the equalities found so far), checks the conditions at the
 * concrete shapes, builds the other side (refusing it where shape inference
 * refuses), and merges. A round that changed nothing ends the saturation,
 * and so do the node limit and the deadline: no axiom set makes it loop.
 * When the outputs of src and dst share classes, the instances that changed
 * the e-graph are asserted to Z3 as ground equations over an uninterpreted
 * sort of tensors (each class stands for one of its smallest terms),
 * together with the literal terms of both sides and src != dst; Z3 must
 * answer unsat for the rule to count as proved. An instance that changed
 * nothing is implied by the others, so leaving it out loses nothing.
 * A rule the saturation cannot prove is evaluated in Z_p (refute.c) before
 * more rounds are spent on it. */
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <z3.h>

#include "verify/verify_int.h"

#define ROUNDS_FIRST 6        /* rounds before looking for a counterexample */
#define NODES_FIRST 3000
#define NODES_MAX 40000       /* a hard cap, far above what proofs need */
#define RULES_PER_CONTEXT 400 /* a fresh Z3 context now and then bounds its memory */

typedef struct ENode {
  int16_t kind;
  int16_t decl;               /* the declaration that names it, or -1 */
  int8_t out, n_out, n_in;
  int32_t params;             /* index into Prover.params */
  int32_t in[AX_MAX_TARGS];   /* classes */
  int32_t cls;
} ENode;

typedef struct Instance {
  int16_t axiom;
  int8_t backward;
  Binding b;
} Instance;

struct Prover {
  const Axioms *ax;
  VerifyLimits lim;
  /* Z3 */
  Z3_context z3;
  Z3_sort tensor_sort, int_sort;
  Z3_func_decl *decl_fn;      /* per declaration, made on first use */
  int rules_in_context;
  /* e-graph */
  ENode *nodes;
  int n_nodes, cap_nodes;
  int32_t *parent;            /* union-find over classes */
  Shape *shape;               /* per class (valid at roots) */
  int n_classes, cap_classes;
  int32_t *table;             /* hash-cons: open addressing, node index + 1 */
  int table_cap;
  int32_t *first, *members;   /* class -> its nodes (CSR), rebuilt each round */
  Params *params;
  int n_params, cap_params;
  Instance *inst;
  int n_inst, cap_inst;
  Instance *pending;
  int n_pending, cap_pending;
  bool changed;
  double deadline;
  int skip_axiom;             /* left out (redundancy checks), or -1 */
};

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

const char *verify_result_name(VerifyResult r) {
  static const char *const names[] = {"proved", "refuted", "unknown"};
  return (int)r >= 0 && r <= VERIFY_UNKNOWN ? names[r] : "?";
}

/* ---- Z3 context ---- */

static void z3_ignore_error(Z3_context c, Z3_error_code e) {
  (void)c, (void)e; /* checked where it matters: a failed check is "unknown" */
}

static int z3_open(Prover *p) {
  Z3_config cfg = Z3_mk_config();
  if (!cfg) return TEQ_ERR_NOMEM;
  Z3_set_param_value(cfg, "model", "false");
  p->z3 = Z3_mk_context(cfg);
  Z3_del_config(cfg);
  if (!p->z3) return TEQ_ERR_NOMEM;
  Z3_set_error_handler(p->z3, z3_ignore_error);
  p->tensor_sort = Z3_mk_uninterpreted_sort(p->z3, Z3_mk_string_symbol(p->z3, "Tensor"));
  p->int_sort = Z3_mk_int_sort(p->z3);
  memset(p->decl_fn, 0, (size_t)p->ax->n_decls * sizeof *p->decl_fn);
  p->rules_in_context = 0;
  return TEQ_OK;
}

static Z3_func_decl decl_function(Prover *p, int i) {
  if (!p->decl_fn[i]) {
    const AxDecl *dc = &p->ax->decls[i];
    Z3_sort dom[AX_MAX_IARGS + AX_MAX_TARGS];
    int n = 0;
    for (int k = 0; k < dc->n_iargs; k++) dom[n++] = p->int_sort;
    for (int k = 0; k < dc->n_targs; k++) dom[n++] = p->tensor_sort;
    p->decl_fn[i] = Z3_mk_func_decl(p->z3, Z3_mk_string_symbol(p->z3, dc->name), (unsigned)n,
                                    dom, p->tensor_sort);
  }
  return p->decl_fn[i];
}

int prover_new(const Axioms *ax, const VerifyLimits *lim, Prover **out, Diag *d) {
  Prover *p = calloc(1, sizeof *p);
  if (!p) return TEQ_ERR_NOMEM;
  p->ax = ax;
  p->lim = *lim;
  p->skip_axiom = -1;
  p->decl_fn = calloc((size_t)ax->n_decls + 1, sizeof *p->decl_fn);
  if (!p->decl_fn || z3_open(p)) {
    prover_free(p);
    return diag_error(d, "verify-rules: cannot create a Z3 context"), TEQ_ERR_NOMEM;
  }
  *out = p;
  return TEQ_OK;
}

void prover_free(Prover *p) {
  if (!p) return;
  if (p->z3) Z3_del_context(p->z3);
  free(p->decl_fn);
  free(p->nodes);
  free(p->parent);
  free(p->shape);
  free(p->table);
  free(p->first);
  free(p->members);
  free(p->params);
  free(p->inst);
  free(p->pending);
  free(p);
}

/* ---- e-graph ---- */

#define GROW(arr, n, cap, min)                                                   \
  ((n) < (cap) ? true : grow_array((void **)&(arr), &(cap), sizeof *(arr), (min)))

static bool grow_array(void **arr, int *cap, size_t size, int min) {
  int c = *cap ? *cap * 2 : min;
  void *g = realloc(*arr, (size_t)c * size);
  if (!g) return false;
  *arr = g;
  *cap = c;
  return true;
}

static int32_t find(Prover *p, int32_t c) {
  while (p->parent[c] != c) c = p->parent[c] = p->parent[p->parent[c]];
  return c;
}

static int intern_params(Prover *p, const Params *pa) {
  for (int i = p->n_params - 1; i >= 0; i--)
    if (!memcmp(&p->params[i], pa, sizeof *pa)) return i;
  if (!GROW(p->params, p->n_params, p->cap_params, 64)) return -1;
  p->params[p->n_params] = *pa;
  return p->n_params++;
}

static uint64_t node_hash(Prover *p, const ENode *n) {
  uint64_t h = hash_mix(0x9e37, (uint64_t)n->kind << 32 | (uint64_t)(uint8_t)n->out << 16 |
                                    (uint64_t)(uint8_t)n->n_out << 8 | (uint64_t)n->n_in);
  h = hash_mix(h, (uint64_t)n->params);
  for (int i = 0; i < n->n_in; i++) h = hash_mix(h, (uint64_t)find(p, n->in[i]));
  return h;
}

static bool node_same(Prover *p, const ENode *a, const ENode *b) {
  if (a->kind != b->kind || a->out != b->out || a->n_out != b->n_out || a->n_in != b->n_in ||
      a->params != b->params)
    return false;
  for (int i = 0; i < a->n_in; i++)
    if (find(p, a->in[i]) != find(p, b->in[i])) return false;
  return true;
}

/* The slot of a node equal to n, or the empty slot where it would go. */
static int table_slot(Prover *p, const ENode *n) {
  int mask = p->table_cap - 1;
  for (int s = (int)(node_hash(p, n) & (uint64_t)mask);; s = (s + 1) & mask)
    if (!p->table[s] || node_same(p, &p->nodes[p->table[s] - 1], n)) return s;
}

static bool table_resize(Prover *p, int cap) {
  int32_t *t = calloc((size_t)cap, sizeof *t);
  if (!t) return false;
  free(p->table);
  p->table = t;
  p->table_cap = cap;
  for (int i = 0; i < p->n_nodes; i++) {
    int s = table_slot(p, &p->nodes[i]);
    if (!p->table[s]) p->table[s] = i + 1;
  }
  return true;
}

static int32_t new_class(Prover *p, const Shape *s) {
  int old = p->cap_classes;
  if (!GROW(p->parent, p->n_classes, p->cap_classes, 256)) return -1;
  if (p->cap_classes != old || !p->shape) {
    Shape *g = realloc(p->shape, (size_t)p->cap_classes * sizeof *g);
    if (!g) return -1;
    p->shape = g;
  }
  p->parent[p->n_classes] = p->n_classes;
  p->shape[p->n_classes] = *s;
  return p->n_classes++;
}

/* The class of node (kind, out of n_out, params, in), added if new; -1
 * when the registry's shape inference refuses it or memory runs out. */
static int32_t add_node(Prover *p, OpKind kind, int out, int n_out, int params, int n_in,
                        const int32_t *in, const Shape *known, int32_t *node) {
  ENode n = {.kind = (int16_t)kind, .out = (int8_t)out, .n_out = (int8_t)n_out,
             .n_in = (int8_t)n_in, .params = params};
  for (int i = 0; i < n_in; i++) n.in[i] = find(p, in[i]);
  if (2 * (p->n_nodes + 1) > p->table_cap && !table_resize(p, p->table_cap ? 2 * p->table_cap : 1024))
    return -1;
  int s = table_slot(p, &n);
  if (p->table[s]) {
    if (node) *node = p->table[s] - 1;
    return find(p, p->nodes[p->table[s] - 1].cls);
  }
  Shape sh;
  if (known) {
    sh = *known;
  } else {
    Shape ins[AX_MAX_TARGS];
    for (int i = 0; i < n_in; i++) ins[i] = p->shape[n.in[i]];
    if (!infer_output(kind, &p->params[params], n_in, ins, n_out, out, &sh)) return -1;
  }
  if (!GROW(p->nodes, p->n_nodes, p->cap_nodes, 1024)) return -1;
  n.decl = (int16_t)(kind == OP_INPUT || kind == OP_CONST || kind == OP_OPAQUE
                         ? -1 : axioms_decl_for(p->ax, kind, out, n_out, &p->params[params]));
  int32_t c = new_class(p, &sh);
  if (c < 0) return -1;
  n.cls = c;
  if (node) *node = p->n_nodes;
  p->nodes[p->n_nodes] = n;
  p->table[s] = ++p->n_nodes;
  p->changed = true;
  return c;
}

/* Merges two classes of the same shape; false if the shapes differ (an
 * ill-typed instance, never merged). */
static bool merge(Prover *p, int32_t a, int32_t b) {
  a = find(p, a), b = find(p, b);
  if (a == b) return true;
  if (!shape_equal(&p->shape[a], &p->shape[b])) return false;
  if (a > b) {
    int32_t t = a;
    a = b, b = t;
  }
  p->parent[b] = a; /* the older class stays the root */
  p->changed = true;
  return true;
}

/* Restores congruence: nodes equal up to their children's classes are
 * merged, until nothing changes; then lists each class's nodes. */
static bool rebuild(Prover *p) {
  for (bool again = true; again;) {
    again = false;
    memset(p->table, 0, (size_t)p->table_cap * sizeof *p->table);
    for (int i = 0; i < p->n_nodes; i++) {
      ENode *n = &p->nodes[i];
      for (int k = 0; k < n->n_in; k++) n->in[k] = find(p, n->in[k]);
      int s = table_slot(p, n);
      if (!p->table[s]) p->table[s] = i + 1;
      else if (find(p, p->nodes[p->table[s] - 1].cls) != find(p, n->cls))
        again |= merge(p, p->nodes[p->table[s] - 1].cls, n->cls);
    }
  }
  free(p->first);
  free(p->members);
  p->first = calloc((size_t)p->n_classes + 1, sizeof *p->first);
  p->members = malloc((size_t)(p->n_nodes + 1) * sizeof *p->members);
  if (!p->first || !p->members) return false;
  for (int i = 0; i < p->n_nodes; i++) p->first[find(p, p->nodes[i].cls) + 1]++;
  for (int c = 0; c < p->n_classes; c++) p->first[c + 1] += p->first[c];
  int32_t *fill = malloc((size_t)(p->n_classes + 1) * sizeof *fill);
  if (!fill) return false;
  memcpy(fill, p->first, (size_t)(p->n_classes + 1) * sizeof *fill);
  for (int i = 0; i < p->n_nodes; i++) p->members[fill[find(p, p->nodes[i].cls)]++] = i;
  free(fill);
  return true;
}

/* ---- matching ---- */

typedef struct MatchState {
  Binding b;
  int n_deferred;
  const IExpr *deferred[AX_MAX_IARGS * 2];
  int64_t want[AX_MAX_IARGS * 2];
} MatchState;

typedef struct Matcher {
  Prover *p;
  const Axiom *a;
  int axiom, backward;
  bool failed;
} Matcher;

static void bind_tensor(Prover *p, Binding *b, int var, int32_t cls) {
  b->bound[var] = true;
  b->cls[var] = find(p, cls);
  b->shape[var] = &p->shape[b->cls[var]];
}

static void on_match(Matcher *m, MatchState *st) {
  for (int i = 0; i < st->n_deferred; i++) {
    int64_t v;
    if (!iexpr_eval(st->deferred[i], &st->b, &v) || v != st->want[i]) return;
  }
  if (!conds_hold(m->a, &st->b)) return;
  Prover *p = m->p;
  if (!GROW(p->pending, p->n_pending, p->cap_pending, 256)) {
    m->failed = true;
    return;
  }
  Instance *in = &p->pending[p->n_pending++];
  in->axiom = (int16_t)m->axiom;
  in->backward = (int8_t)m->backward;
  in->b = st->b;
  for (int i = 0; i < AX_MAX_VARS; i++) {
    in->b.shape[i] = NULL; /* recomputed when applied */
    if (i >= m->a->n_vars || m->a->vars[i].sort != SORT_TENSOR) in->b.cls[i] = -1;
  }
}

/* Matches the pending (pattern, class) pairs, last first. */
static void match_pairs(Matcher *m, const Term **pats, const int32_t *cls, int n,
                        MatchState *st) {
  if (m->failed) return;
  if (n == 0) return on_match(m, st);
  Prover *p = m->p;
  const Term *t = pats[n - 1];
  int32_t c = find(p, cls[n - 1]);
  if (t->decl < 0) {
    if (st->b.bound[t->var]) {
      if (find(p, st->b.cls[t->var]) == c) match_pairs(m, pats, cls, n - 1, st);
      return;
    }
    MatchState next = *st;
    bind_tensor(p, &next.b, t->var, c);
    return match_pairs(m, pats, cls, n - 1, &next);
  }
  const AxDecl *dc = &p->ax->decls[t->decl];
  for (int k = p->first[c]; k < p->first[c + 1]; k++) {
    const ENode *e = &p->nodes[p->members[k]];
    /* The node's own declaration, so that Z3 sees one symbol per node. */
    if (e->decl != t->decl || e->n_in != dc->n_targs) continue;
    int64_t iargs[AX_MAX_IARGS];
    if (!decl_matches(dc, &p->params[e->params], iargs)) continue;
    MatchState next = *st;
    bool ok = true;
    for (int i = 0; i < dc->n_iargs && ok; i++) {
      const IExpr *x = t->iargs[i];
      int64_t v;
      if (x->kind == I_VAR && !next.b.bound[x->var]) {
        next.b.bound[x->var] = true;
        next.b.ival[x->var] = iargs[i];
      } else if (x->kind == I_NUM || x->kind == I_VAR) {
        ok = iexpr_eval(x, &next.b, &v) && v == iargs[i];
      } else {
        next.deferred[next.n_deferred] = x;
        next.want[next.n_deferred++] = iargs[i];
      }
    }
    if (!ok) continue;
    const Term *np[32];
    int32_t nc[32];
    if (n - 1 + dc->n_targs > 32) continue;
    memcpy(np, pats, (size_t)(n - 1) * sizeof *np);
    memcpy(nc, cls, (size_t)(n - 1) * sizeof *nc);
    for (int i = 0; i < dc->n_targs; i++) np[n - 1 + i] = t->targs[i], nc[n - 1 + i] = e->in[i];
    match_pairs(m, np, nc, n - 1 + dc->n_targs, &next);
  }
}

/* ---- instantiation ---- */

/* Points a binding's tensor variables at their classes' shapes (the
 * shape array moves when nodes are added). */
static void point_shapes(Prover *p, Binding *b) {
  for (int i = 0; i < AX_MAX_VARS; i++)
    b->shape[i] = b->bound[i] && b->cls[i] >= 0 ? &p->shape[b->cls[i] = find(p, b->cls[i])] : NULL;
}

/* Builds t under b in the e-graph; its class or -1. */
static int32_t build(Prover *p, const Term *t, Binding *b) {
  if (t->decl < 0) return find(p, b->cls[t->var]);
  const AxDecl *dc = &p->ax->decls[t->decl];
  int32_t in[AX_MAX_TARGS];
  for (int i = 0; i < dc->n_targs; i++)
    if ((in[i] = build(p, t->targs[i], b)) < 0) return -1;
  int64_t iargs[AX_MAX_IARGS];
  point_shapes(p, b);
  for (int i = 0; i < dc->n_iargs; i++)
    if (!iexpr_eval(t->iargs[i], b, &iargs[i])) return -1;
  Params pa;
  decl_params(dc, iargs, &pa);
  if (axioms_decl_for(p->ax, dc->kind, dc->out, dc->n_out, &pa) != t->decl) return -1;
  int pid = intern_params(p, &pa);
  if (pid < 0) return -1;
  return add_node(p, dc->kind, dc->out, dc->n_out, pid, dc->n_targs, in, NULL, NULL);
}

/* Applies one instance; records it when it changed the e-graph. */
static bool apply(Prover *p, Instance *in) {
  const Axiom *a = &p->ax->axioms[in->axiom];
  Binding b = in->b;
  for (int i = 0; i < a->n_vars; i++)
    if (a->vars[i].sort != SORT_TENSOR) b.cls[i] = -1;
  point_shapes(p, &b);
  const Term *from = in->backward ? a->rhs : a->lhs, *to = in->backward ? a->lhs : a->rhs;
  bool was = p->changed;
  p->changed = false;
  int32_t x = build(p, from, &b);
  int32_t y = x >= 0 ? build(p, to, &b) : -1;
  bool ok = y >= 0 && merge(p, x, y);
  bool did = p->changed;
  p->changed = was || did;
  if (ok && did) {
    if (!GROW(p->inst, p->n_inst, p->cap_inst, 256)) return false;
    p->inst[p->n_inst] = *in;
    p->inst[p->n_inst++].b = b;
  }
  return true;
}

/* One round: every trigger against every class, then every instance. */
static bool round_once(Prover *p, int node_limit) {
  p->n_pending = 0;
  /* The deadline is checked inside a round too: one round over a large
   * e-graph can take seconds. Stopping part-way is sound, since every
   * instance found is a true equation; the rule just ends unknown. */
  for (int ai = 0; ai < p->ax->n_axioms && now_ms() <= p->deadline; ai++) {
    const Axiom *a = &p->ax->axioms[ai];
    if (ai == p->skip_axiom) continue;
    for (int dir = 0; dir < 2; dir++) {
      if (!(dir ? a->backward : a->forward)) continue;
      const Term *side = dir ? a->rhs : a->lhs;
      Matcher m = {p, a, ai, dir, false};
      for (int32_t c = 0; c < p->n_classes; c++) {
        if ((c & 1023) == 1023 && now_ms() > p->deadline) break;
        if (find(p, c) != c) continue;
        MatchState st;
        memset(&st, 0, sizeof st);
        const Term *pats[1] = {side};
        int32_t cls[1] = {c};
        match_pairs(&m, pats, cls, 1, &st);
      }
      if (m.failed) return false;
    }
  }
  p->changed = false;
  for (int i = 0; i < p->n_pending && p->n_nodes < node_limit; i++) {
    if ((i & 255) == 255 && now_ms() > p->deadline) break;
    if (!apply(p, &p->pending[i])) return false;
  }
  return rebuild(p);
}

/* ---- the rule ---- */

typedef struct RuleMap {
  int32_t *cls;   /* per (node, out) of a side, at offset[node] + out: its class */
  int32_t *enode; /* and the e-node it was added as */
  int32_t *offset;
} RuleMap;

static int input_params(Prover *p, int index) {
  Params pa;
  memset(&pa, 0, sizeof pa);
  pa.v[0].n = 1;
  pa.v[0].i[0] = index;
  return intern_params(p, &pa);
}

/* Adds a side's nodes; map receives each output's class. */
static int add_side(Prover *p, const Graph *g, RuleMap *map) {
  map->offset = malloc((size_t)(g->n_nodes + 1) * sizeof *map->offset);
  int total = 0;
  if (!map->offset) return TEQ_ERR_NOMEM;
  for (int i = 0; i < g->n_nodes; i++) map->offset[i] = total, total += g->nodes[i].n_out;
  map->offset[g->n_nodes] = total;
  map->cls = malloc((size_t)(total + 1) * sizeof *map->cls);
  map->enode = malloc((size_t)(total + 1) * sizeof *map->enode);
  int32_t *order = malloc((size_t)(g->n_nodes + 1) * sizeof *order);
  if (!map->cls || !map->enode || !order || graph_topo_order(g, order)) {
    free(order);
    return TEQ_ERR_NOMEM;
  }
  int rc = TEQ_OK;
  for (int k = 0; k < g->n_nodes && !rc; k++) {
    const Node *n = &g->nodes[order[k]];
    int index = -1;
    for (int i = 0; i < g->n_inputs; i++)
      if (g->inputs[i] == order[k]) index = i;
    if (n->kind == OP_INPUT || n->kind == OP_CONST) {
      /* A variable is its position among the inputs, a constant its content. */
      int pid = n->kind == OP_INPUT ? input_params(p, index)
                                    : input_params(p, (int)(tensor_content_hash(n->value) >> 33) + (1 << 20));
      int32_t c = pid < 0 ? -1 : add_node(p, n->kind, 0, 1, pid, 0, NULL, &n->out[0],
                                           &map->enode[map->offset[order[k]]]);
      if (c < 0) rc = TEQ_ERR_NOMEM;
      else map->cls[map->offset[order[k]]] = c;
      continue;
    }
    int pid = intern_params(p, &n->params);
    int32_t in[AX_MAX_TARGS];
    bool wide = n->n_in > AX_MAX_TARGS;
    for (int i = 0; i < n->n_in && !wide; i++)
      in[i] = map->cls[map->offset[n->in[i].node] + n->in[i].out];
    for (int o = 0; o < n->n_out && !rc; o++) {
      /* An operator with more inputs than axioms can name stays opaque: a
       * fresh leaf, equal only to itself. */
      int32_t *en = &map->enode[map->offset[order[k]] + o];
      int32_t c = pid < 0 ? -1
                  : wide ? add_node(p, OP_OPAQUE, 0, 1, input_params(p, (1 << 24) + order[k] * 16 + o),
                                    0, NULL, &n->out[o], en)
                         : add_node(p, n->kind, o, n->n_out, pid, n->n_in, in, &n->out[o], en);
      if (c < 0) rc = TEQ_ERR_NOMEM;
      else map->cls[map->offset[order[k]] + o] = c;
    }
  }
  free(order);
  return rc;
}

static int32_t output_class(Prover *p, const Graph *g, const RuleMap *m, int o) {
  return find(p, m->cls[m->offset[g->outputs[o].node] + g->outputs[o].out]);
}

static bool goal_reached(Prover *p, const Graph *src, const RuleMap *ms, const Graph *dst,
                         const RuleMap *md) {
  for (int o = 0; o < src->n_outputs; o++)
    if (output_class(p, src, ms, o) != output_class(p, dst, md, o)) return false;
  return true;
}

/* ---- Z3 terms ---- */

/* The Z3 term of a node (kind, out, params) over child terms: through its
 * declaration, or an uninterpreted symbol of its own. */
static Z3_ast node_term(Prover *p, OpKind kind, int out, int n_out, int pid, int n_in,
                        const Z3_ast *kids) {
  const Params *pa = &p->params[pid];
  Z3_ast args[AX_MAX_IARGS + AX_MAX_TARGS];
  int di = (kind == OP_INPUT || kind == OP_CONST || kind == OP_OPAQUE)
             ? -1 : axioms_decl_for(p->ax, kind, out, n_out, pa);
  if (di >= 0) {
    const AxDecl *dc = &p->ax->decls[di];
    int64_t iargs[AX_MAX_IARGS];
    decl_matches(dc, pa, iargs);
    int n = 0;
    for (int i = 0; i < dc->n_iargs; i++) args[n++] = Z3_mk_int64(p->z3, iargs[i], p->int_sort);
    for (int i = 0; i < n_in; i++) args[n++] = kids[i];
    return Z3_mk_app(p->z3, decl_function(p, di), (unsigned)n, args);
  }
  char name[96];
  /* One symbol per (operator, output, parameters): nodes no declaration
   * names are equal only when they are the same function of equal inputs. */
  snprintf(name, sizeof name, "%s.%d/%d#%016llx", op_def(kind)->name, out, n_out,
           (unsigned long long)hash_bytes(0, pa, sizeof *pa));
  Z3_sort dom[AX_MAX_TARGS];
  for (int i = 0; i < n_in; i++) dom[i] = p->tensor_sort;
  Z3_func_decl f = Z3_mk_func_decl(p->z3, Z3_mk_string_symbol(p->z3, name), (unsigned)n_in, dom,
                                   p->tensor_sort);
  return Z3_mk_app(p->z3, f, (unsigned)n_in, kids);
}

/* Each class's term: one of its nodes of least depth over the classes'
 * terms (acyclic, since depth strictly drops). */
static Z3_ast *class_terms(Prover *p) {
  int nc = p->n_classes;
  int *depth = malloc((size_t)nc * sizeof *depth), *best = malloc((size_t)nc * sizeof *best);
  Z3_ast *term = calloc((size_t)nc, sizeof *term);
  if (!depth || !best || !term) {
    free(depth), free(best), free(term);
    return NULL;
  }
  for (int c = 0; c < nc; c++) depth[c] = 1 << 30, best[c] = -1;
  for (bool again = true; again;) {
    again = false;
    for (int i = 0; i < p->n_nodes; i++) {
      const ENode *e = &p->nodes[i];
      int dd = 0;
      for (int k = 0; k < e->n_in; k++) {
        int cd = depth[find(p, e->in[k])];
        if (cd + 1 > dd) dd = cd + 1;
      }
      int32_t c = find(p, e->cls);
      if (dd < depth[c]) depth[c] = dd, best[c] = i, again = true;
    }
  }
  /* Build in order of depth so children come first. */
  for (int level = 0, left = 1; left; level++) {
    left = 0;
    for (int c = 0; c < nc; c++) {
      if (find(p, c) != c || best[c] < 0 || term[c]) continue;
      if (depth[c] != level) {
        left = 1;
        continue;
      }
      const ENode *e = &p->nodes[best[c]];
      Z3_ast kids[AX_MAX_TARGS];
      for (int k = 0; k < e->n_in; k++) kids[k] = term[find(p, e->in[k])];
      term[c] = node_term(p, e->kind, e->out, e->n_out, e->params, e->n_in, kids);
    }
  }
  free(depth);
  free(best);
  return term;
}

static Z3_ast instance_side(Prover *p, const Term *t, const Binding *b, Z3_ast *cls_term) {
  if (t->decl < 0) return cls_term[find(p, b->cls[t->var])];
  const AxDecl *dc = &p->ax->decls[t->decl];
  Z3_ast args[AX_MAX_IARGS + AX_MAX_TARGS];
  int n = 0;
  for (int i = 0; i < dc->n_iargs; i++) {
    int64_t v = 0;
    iexpr_eval(t->iargs[i], b, &v);
    args[n++] = Z3_mk_int64(p->z3, v, p->int_sort);
  }
  for (int i = 0; i < dc->n_targs; i++) args[n++] = instance_side(p, t->targs[i], b, cls_term);
  return Z3_mk_app(p->z3, decl_function(p, t->decl), (unsigned)n, args);
}

/* The literal term of every output of a side. */
static int side_terms(Prover *p, const Graph *g, const RuleMap *m, Z3_ast *out) {
  int total = m->offset[g->n_nodes];
  Z3_ast *t = calloc((size_t)total + 1, sizeof *t);
  int32_t *order = malloc((size_t)(g->n_nodes + 1) * sizeof *order);
  if (!t || !order) {
    free(t), free(order);
    return TEQ_ERR_NOMEM;
  }
  graph_topo_order(g, order);
  for (int k = 0; k < g->n_nodes; k++) {
    const Node *n = &g->nodes[order[k]];
    int base = m->offset[order[k]];
    for (int o = 0; o < n->n_out; o++) {
      const ENode *e = &p->nodes[m->enode[base + o]];
      Z3_ast kids[AX_MAX_TARGS];
      /* An opaque leaf (too many inputs) has no children. */
      for (int i = 0; i < e->n_in; i++) kids[i] = t[m->offset[n->in[i].node] + n->in[i].out];
      t[base + o] = node_term(p, e->kind, e->out, e->n_out, e->params, e->n_in, kids);
    }
  }
  for (int o = 0; o < g->n_outputs; o++) out[o] = t[m->offset[g->outputs[o].node] + g->outputs[o].out];
  free(t);
  free(order);
  return TEQ_OK;
}

/* Asserts the instances and src != dst; true if Z3 says unsat. */
static bool z3_confirms(Prover *p, const Graph *src, const RuleMap *ms, const Graph *dst,
                        const RuleMap *md, int timeout_ms) {
  Z3_ast *cls_term = class_terms(p);
  if (!cls_term) return false;
  Z3_solver s = Z3_mk_simple_solver(p->z3);
  Z3_solver_inc_ref(p->z3, s);
  Z3_params prm = Z3_mk_params(p->z3);
  Z3_params_inc_ref(p->z3, prm);
  Z3_params_set_uint(p->z3, prm, Z3_mk_string_symbol(p->z3, "timeout"),
                     (unsigned)(timeout_ms > 1 ? timeout_ms : 1));
  Z3_solver_set_params(p->z3, s, prm);
  for (int i = 0; i < p->n_inst; i++) {
    const Instance *in = &p->inst[i];
    const Axiom *a = &p->ax->axioms[in->axiom];
    Binding b = in->b;
    for (int v = 0; v < a->n_vars; v++)
      if (a->vars[v].sort == SORT_TENSOR) b.shape[v] = &p->shape[find(p, b.cls[v])];
    Z3_ast l = instance_side(p, a->lhs, &b, cls_term), r = instance_side(p, a->rhs, &b, cls_term);
    Z3_solver_assert(p->z3, s, Z3_mk_eq(p->z3, l, r));
  }
  int n = src->n_outputs;
  Z3_ast *ts = calloc((size_t)n + 1, sizeof *ts), *td = calloc((size_t)n + 1, sizeof *td);
  Z3_ast *diff = calloc((size_t)n + 1, sizeof *diff);
  bool unsat = false;
  if (ts && td && diff && !side_terms(p, src, ms, ts) && !side_terms(p, dst, md, td)) {
    for (int o = 0; o < n; o++) diff[o] = Z3_mk_not(p->z3, Z3_mk_eq(p->z3, ts[o], td[o]));
    Z3_solver_assert(p->z3, s, n == 1 ? diff[0] : Z3_mk_or(p->z3, (unsigned)n, diff));
    unsat = Z3_solver_check(p->z3, s) == Z3_L_FALSE;
  }
  free(ts), free(td), free(diff);
  Z3_params_dec_ref(p->z3, prm);
  Z3_solver_dec_ref(p->z3, s);
  free(cls_term);
  return unsat;
}

static void reset(Prover *p) {
  p->n_nodes = p->n_classes = p->n_params = p->n_inst = p->n_pending = 0;
  if (p->table) memset(p->table, 0, (size_t)p->table_cap * sizeof *p->table);
}

/* Rounds until the goal, a fixpoint, the node limit or the deadline. */
static int saturate(Prover *p, int rounds, int node_limit, const Graph *src, const RuleMap *ms,
                    const Graph *dst, const RuleMap *md, bool *proved, bool *fixpoint) {
  *fixpoint = false;
  for (int r = 0; r < rounds; r++) {
    if ((*proved = goal_reached(p, src, ms, dst, md))) return TEQ_OK;
    if (p->n_nodes >= node_limit || now_ms() > p->deadline) return TEQ_OK;
    if (!round_once(p, node_limit)) return TEQ_ERR_NOMEM;
    if (!p->changed) {
      *fixpoint = true;
      break;
    }
  }
  *proved = goal_reached(p, src, ms, dst, md);
  return TEQ_OK;
}

int prover_decide(Prover *p, const Graph *src, const Graph *dst, VerifyOutcome *out, Diag *d) {
  double t0 = now_ms();
  memset(out, 0, sizeof *out);
  p->deadline = t0 + p->lim.timeout_ms;
  if (p->rules_in_context++ >= RULES_PER_CONTEXT) {
    Z3_del_context(p->z3);
    p->z3 = NULL;
    if (z3_open(p)) return diag_error(d, "verify-rules: cannot create a Z3 context"), TEQ_ERR_NOMEM;
  }
  reset(p);
  RuleMap ms = {0}, md = {0};
  bool proved = false, fixpoint = false, refuted = false;
  int rc = TEQ_OK;
  if (src->n_outputs != dst->n_outputs) {
    refuted = true;
    out->counterexample = strdup("the sides have different numbers of outputs");
    goto done;
  }
  if ((rc = add_side(p, src, &ms)) || (rc = add_side(p, dst, &md)) || !rebuild(p)) {
    rc = rc ? rc : TEQ_ERR_NOMEM;
    goto done;
  }
  if ((rc = saturate(p, ROUNDS_FIRST, NODES_FIRST, src, &ms, dst, &md, &proved, &fixpoint)))
    goto done;
  if (!proved && (refuted = refute_modp(src, dst, p->lim.seed, &out->counterexample))) goto done;
  if (!proved && !fixpoint &&
      (rc = saturate(p, 1 << 20, NODES_MAX, src, &ms, dst, &md, &proved, &fixpoint)))
    goto done;
  if (proved) proved = z3_confirms(p, src, &ms, dst, &md, (int)(p->deadline - now_ms()) + 50);
done:
  out->result = refuted ? VERIFY_REFUTED : proved ? VERIFY_PROVED : VERIFY_UNKNOWN;
  out->instances = p->n_inst;
  out->millis = now_ms() - t0;
  free(ms.cls), free(ms.offset), free(ms.enode), free(md.cls), free(md.offset), free(md.enode);
  return rc;
}

void prover_skip_axiom(Prover *p, int i) { p->skip_axiom = i; }

int prover_merges_inputs(Prover *p, const Graph *g, int rounds, bool *merged, int *n_nodes) {
  reset(p);
  p->deadline = now_ms() + p->lim.timeout_ms;
  RuleMap m = {0};
  int rc = add_side(p, g, &m);
  if (!rc && !rebuild(p)) rc = TEQ_ERR_NOMEM;
  for (int r = 0; !rc && r < rounds && p->n_nodes < NODES_MAX && now_ms() < p->deadline; r++) {
    if (!round_once(p, NODES_MAX)) rc = TEQ_ERR_NOMEM;
    else if (!p->changed) break;
  }
  *merged = false;
  for (int i = 0; !rc && i < g->n_inputs && !*merged; i++)
    for (int k = i + 1; k < g->n_inputs && !*merged; k++)
      *merged = find(p, m.cls[m.offset[g->inputs[i]]]) == find(p, m.cls[m.offset[g->inputs[k]]]);
  *n_nodes = p->n_nodes;
  free(m.cls), free(m.offset), free(m.enode);
  return rc;
}
