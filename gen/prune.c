/* prune.c: from confirmed pairs to the rules worth storing (TASO §4).
 *
 * 1. Input renaming. Each pair is put in a canonical form: its variables
 *    renamed, class by class, onto the first ones in the way that gives
 *    the smallest key, and both sides' operators in canonical order. Pairs
 *    with equal keys are one rule. A rule that is another with variables
 *    merged (x2 renamed to x1) is less general and dropped.
 * 2. Common subgraph, both forms. (a) An operation computed identically in
 *    both sides is replaced by a fresh random tensor; if the sides still
 *    agree (at both shape assignments), the more general rule holds and
 *    this one is dropped. (b) Both sides end in the same operator and its
 *    inputs already agree: the rule is that smaller rule with an operator
 *    on top, and is dropped.
 * 3. Disjoint unions: a rule whose outputs fall into groups that share no
 *    operator on either side is two smaller rules side by side (TASO's
 *    rule 63), and is dropped.
 * 4. Float32: what is left is run in float32 with the real non-linear
 *    functions, which Z_p can only stand in for.
 * The key is readable text, so the database's UNIQUE key is also what a
 * person sees when two runs disagree. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gen/gen_int.h"
#include "runtime/exec.h"

#define KEY_MAX 1024

/* ---- canonical form of one side ---- */

typedef struct Canon {
  GenGraph g;
  uint64_t sh[GEN_MAX_DEPTH];          /* structural hash of each canonical op */
  uint8_t slot_map[GEN_MAX_SLOTS];     /* old slot -> new slot */
} Canon;


/* Renames variables by var_map, merges operators that became identical,
 * and orders operators canonically (smallest available hash first). */
static void canon_graph(const GenVocab *v, const GenGraph *in, const uint8_t *var_map, Canon *c) {
  int nv = v->n_vars;
  uint64_t slot_sh[GEN_MAX_SLOTS];
  int slot_of[GEN_MAX_SLOTS];       /* old slot -> representative old slot */
  int slot_op[GEN_MAX_SLOTS];       /* old slot -> producing kept op (-1 var) */
  int slot_out[GEN_MAX_SLOTS];
  for (int i = 0; i < nv; i++) slot_sh[i] = gen_hash_var(var_map[i]), slot_of[i] = i, slot_op[i] = -1;
  uint64_t sh[GEN_MAX_DEPTH];
  int keep[GEN_MAX_DEPTH], n_keep = 0;
  int first_slot[GEN_MAX_DEPTH];
  int slot = nv;
  for (int k = 0; k < in->n_ops; k++) {
    const GenTemplate *t = &v->t[in->op[k].t];
    uint64_t a = 0, b = 0;
    if (t->n_in > 0) a = slot_sh[slot_of[in->op[k].in[0]]];
    if (t->n_in > 1) b = slot_sh[slot_of[in->op[k].in[1]]];
    uint64_t h = gen_hash_op(v, in->op[k].t, a, b);
    int dup = -1;
    for (int j = 0; j < n_keep; j++)
      if (sh[keep[j]] == h) dup = keep[j];
    sh[k] = h;
    first_slot[k] = slot;
    for (int o = 0; o < t->n_out; o++, slot++) {
      slot_sh[slot] = hash_mix(h, (uint64_t)o);
      slot_of[slot] = dup >= 0 ? first_slot[dup] + o : slot;
      slot_op[slot] = dup >= 0 ? dup : k;
      slot_out[slot] = o;
    }
    if (dup < 0) keep[n_keep++] = k;
  }
  /* Greedy topological order by hash. */
  bool placed[GEN_MAX_DEPTH] = {false};
  int order[GEN_MAX_DEPTH];
  for (int step = 0; step < n_keep; step++) {
    int best = -1;
    for (int j = 0; j < n_keep; j++) {
      int k = keep[j];
      if (placed[k]) continue;
      const GenTemplate *t = &v->t[in->op[k].t];
      bool ready = true;
      for (int i = 0; i < t->n_in; i++) {
        int p = slot_op[slot_of[in->op[k].in[i]]];
        if (p >= 0 && !placed[p]) ready = false;
      }
      if (ready && (best < 0 || sh[k] < sh[best])) best = k;
    }
    placed[best] = true;
    order[step] = best;
  }
  /* New slots. */
  memset(c, 0, sizeof *c);
  int new_first[GEN_MAX_DEPTH];
  int next = nv;
  for (int step = 0; step < n_keep; step++) {
    new_first[order[step]] = next;
    next += v->t[in->op[order[step]].t].n_out;
  }
  for (int i = 0; i < nv; i++) c->slot_map[i] = var_map[i];
  for (int s = nv; s < slot; s++)
    c->slot_map[s] = (uint8_t)(new_first[slot_op[s]] + slot_out[s]);
  c->g.n_ops = (uint8_t)n_keep;
  for (int step = 0; step < n_keep; step++) {
    int k = order[step];
    const GenTemplate *t = &v->t[in->op[k].t];
    GenOp op = {.t = in->op[k].t};
    for (int i = 0; i < t->n_in; i++) op.in[i] = c->slot_map[in->op[k].in[i]];
    /* Commutative operands in the order of their hashes under the new
     * names, so that renamed copies print alike. */
    if (t->flags & T_COMMUTATIVE) {
      uint64_t ha = slot_sh[slot_of[in->op[k].in[0]]], hb = slot_sh[slot_of[in->op[k].in[1]]];
      if (hb < ha) {
        uint8_t x = op.in[0];
        op.in[0] = op.in[1], op.in[1] = x;
      }
    }
    c->g.op[step] = op;
    c->sh[step] = sh[k];
  }
}

/* ---- keys ---- */

typedef struct CanonPair {
  Canon src, dst;
  GenPair p;   /* the canonical pair */
  uint8_t sig[64]; /* its bytes: what renamings are compared by */
  int sig_len;
  char key[KEY_MAX]; /* its text, filled for the chosen renaming only */
} CanonPair;

static int cmp_u8pair(const void *a, const void *b) {
  const uint8_t *x = a, *y = b;
  return x[0] != y[0] ? x[0] - y[0] : x[1] - y[1];
}

static int graph_bytes(const GenGraph *g, uint8_t *b) {
  b[0] = g->n_ops;
  memcpy(b + 1, g->op, (size_t)g->n_ops * sizeof g->op[0]);
  return 1 + g->n_ops * (int)sizeof g->op[0];
}

static int cmp_graph_bytes(const GenGraph *a, const GenGraph *b) {
  uint8_t x[32], y[32];
  int nx = graph_bytes(a, x), ny = graph_bytes(b, y);
  return nx != ny ? nx - ny : memcmp(x, y, (size_t)nx);
}

/* Canonical pair under one variable map, oriented larger side first (on a
 * tie, the orientation with the smaller bytes). */
static void canon_pair(const GenVocab *v, const GenPair *p, const uint8_t *var_map,
                       CanonPair *out) {
  Canon a, b;
  canon_graph(v, &p->src, var_map, &a);
  canon_graph(v, &p->dst, var_map, &b);
  uint8_t outs[2 * GEN_MAX_DEPTH][2];
  int ra = gen_graph_real_ops(v, &a.g), rb = gen_graph_real_ops(v, &b.g);
  bool swap = rb > ra || (ra == rb && cmp_graph_bytes(&b.g, &a.g) < 0);
  const Canon *s = swap ? &b : &a, *d = swap ? &a : &b;
  const uint8_t *so = swap ? p->dst_out : p->src_out, *dout = swap ? p->src_out : p->dst_out;
  for (int i = 0; i < p->n_out; i++) outs[i][0] = s->slot_map[so[i]], outs[i][1] = d->slot_map[dout[i]];
  qsort(outs, p->n_out, sizeof outs[0], cmp_u8pair);
  out->src = *s;
  out->dst = *d;
  memset(&out->p, 0, sizeof out->p);
  out->p.src = s->g;
  out->p.dst = d->g;
  out->p.n_out = p->n_out;
  for (int i = 0; i < p->n_out; i++) out->p.src_out[i] = outs[i][0], out->p.dst_out[i] = outs[i][1];
  int n = graph_bytes(&s->g, out->sig);
  n += graph_bytes(&d->g, out->sig + n);
  out->sig[n++] = p->n_out;
  memcpy(out->sig + n, outs, (size_t)p->n_out * 2);
  out->sig_len = n + 2 * p->n_out;
  out->key[0] = 0;
}

/* The readable key of a canonical pair. */
static void key_text(const GenVocab *v, const GenPair *p, char *key, size_t size) {
  char ta[KEY_MAX / 2], tb[KEY_MAX / 2];
  gen_graph_format(v, &p->src, ta, sizeof ta);
  gen_graph_format(v, &p->dst, tb, sizeof tb);
  int len = snprintf(key, size, "%s => %s @", ta, tb);
  for (int i = 0; i < p->n_out && len > 0 && (size_t)len < size; i++)
    len += snprintf(key + len, size - (size_t)len, " %%%d=%%%d", p->src_out[i] - v->n_vars,
                    p->dst_out[i] - v->n_vars);
}

/* The variables a pair uses, grouped by class; both searches below map
 * these. map receives the identity. */
typedef struct UsedVars {
  int var[GEN_MAX_CLASSES][GEN_MAX_VARS];
  int n[GEN_MAX_CLASSES];
} UsedVars;

static void used_by_class(const GenVocab *v, const GenPair *p, UsedVars *u, uint8_t *map) {
  bool used[GEN_MAX_VARS];
  gen_pair_used_vars(v, p, used);
  memset(u->n, 0, sizeof u->n);
  for (int i = 0; i < v->n_vars; i++) {
    map[i] = (uint8_t)i;
    if (used[i]) {
      int c = v->vars[i].cls;
      u->var[c][u->n[c]++] = i;
    }
  }
}

/* Smallest key over every renaming of the used variables onto the first
 * ones of their class: a DFS over classes and permutations. */
typedef struct RenameSearch {
  const GenVocab *v;
  const GenPair *p;
  UsedVars used;
  uint8_t map[GEN_MAX_VARS];
  CanonPair best, cur;
  bool have;
} RenameSearch;

static void rename_dfs(RenameSearch *r, int cls, int pos, unsigned taken) {
  const GenVocab *v = r->v;
  if (cls == v->n_classes) {
    canon_pair(v, r->p, r->map, &r->cur);
    if (!r->have || r->cur.sig_len < r->best.sig_len ||
        (r->cur.sig_len == r->best.sig_len &&
         memcmp(r->cur.sig, r->best.sig, (size_t)r->cur.sig_len) < 0))
      r->best = r->cur, r->have = true;
    return;
  }
  if (pos == r->used.n[cls]) {
    rename_dfs(r, cls + 1, 0, 0);
    return;
  }
  for (int target = 0; target < r->used.n[cls]; target++) {
    if (taken & (1u << target)) continue;
    r->map[r->used.var[cls][pos]] = (uint8_t)(v->classes[cls].first + target);
    rename_dfs(r, cls, pos + 1, taken | (1u << target));
  }
}

/* The canonical pair in out->p; its readable key too if with_key. */
static void canon_renamed(const GenVocab *v, const GenPair *p, CanonPair *out, bool with_key) {
  RenameSearch r = {.v = v, .p = p};
  used_by_class(v, p, &r.used, r.map);
  rename_dfs(&r, 0, 0, 0);
  *out = r.best;
  if (with_key) key_text(v, &out->p, out->key, sizeof out->key);
}

void gen_pair_key(const GenVocab *v, const GenPair *p, char *key, size_t size) {
  CanonPair *cp = malloc(sizeof *cp);
  if (!cp) {
    snprintf(key, size, "?");
    return;
  }
  canon_renamed(v, p, cp, true);
  snprintf(key, size, "%s", cp->key);
  free(cp);
}

/* ---- a set of canonical pairs ----
 * Canonical pairs are compared as bytes: canon_pair zeroes what it does not
 * fill, so two renamed copies of one rule are equal byte for byte. */

typedef struct PairSet {
  const GenCand *c;   /* the candidates the indices refer to */
  size_t *slot;       /* index + 1; 0 empty */
  size_t cap;
} PairSet;

static uint64_t pair_hash(const GenPair *p) { return hash_bytes(0x70616972, p, sizeof *p); }

static int pairset_init(PairSet *k, const GenCand *c, size_t n) {
  k->c = c;
  k->cap = 16;
  while (k->cap < 2 * n + 16) k->cap *= 2;
  k->slot = calloc(k->cap, sizeof *k->slot);
  return k->slot ? TEQ_OK : TEQ_ERR_NOMEM;
}

static void pairset_fini(PairSet *k) { free(k->slot); }

/* The index of the candidate equal to p, or SIZE_MAX. */
static size_t pairset_find(const PairSet *k, const GenPair *p) {
  for (size_t i = pair_hash(p) & (k->cap - 1); k->slot[i]; i = (i + 1) & (k->cap - 1))
    if (!memcmp(&k->c[k->slot[i] - 1].p, p, sizeof *p)) return k->slot[i] - 1;
  return SIZE_MAX;
}

static void pairset_add(PairSet *k, size_t idx) {
  size_t i = pair_hash(&k->c[idx].p) & (k->cap - 1);
  while (k->slot[i]) i = (i + 1) & (k->cap - 1);
  k->slot[i] = idx + 1;
}

/* ---- the checks that need values ---- */

typedef struct Checker {
  const GenVocab *v;
  GenState st[2];   /* A and B, with inputs of their own */
  Diag *d;
} Checker;

/* Evaluates both sides at each assignment and tells whether every aligned
 * output pair is equal; fresh_sh (0: none) becomes a fresh variable. */
static int sides_agree(Checker *c, const GenPair *p, uint64_t fresh_sh, bool *agree) {
  *agree = true;
  for (int e = 0; e < 2 && *agree; e++) {
    GenState *s = &c->st[e];
    Tensor *outs[2 * GEN_MAX_DEPTH] = {NULL};
    gen_state_set_fresh(s, fresh_sh, hash_mix(fresh_sh, 0x6672657368));
    int rc = gen_push_graph(s, &p->src, c->d);
    if (rc == 1)
      for (int i = 0; i < p->n_out; i++) outs[i] = tensor_ref(s->slot[p->src_out[i]].t);
    gen_pop_all(s);
    if (rc == 1) rc = gen_push_graph(s, &p->dst, c->d);
    if (rc == 1)
      for (int i = 0; i < p->n_out; i++) {
        const Tensor *x = outs[i], *y = s->slot[p->dst_out[i]].t;
        if (!shape_equal(&x->shape, &y->shape) || memcmp(x->data, y->data, tensor_bytes(x)))
          *agree = false;
      }
    gen_pop_all(s);
    gen_state_set_fresh(s, 0, 0);
    for (int i = 0; i < p->n_out; i++) tensor_unref(outs[i]);
    if (rc < 0) return rc;
    if (rc == 0) *agree = false;
  }
  return TEQ_OK;
}

/* Form (a): an operation both sides compute the same way. */
static int common_operation(Checker *c, const GenPair *p, bool *redundant) {
  *redundant = false;
  uint8_t same[GEN_MAX_VARS];
  for (int i = 0; i < GEN_MAX_VARS; i++) same[i] = (uint8_t)i;
  Canon a, b; /* canonical already: only their hashes are wanted */
  canon_graph(c->v, &p->src, same, &a);
  canon_graph(c->v, &p->dst, same, &b);
  for (int i = 0; i < a.g.n_ops && !*redundant; i++) {
    if (c->v->t[a.g.op[i].t].flags & T_IDENT) continue;
    for (int j = 0; j < b.g.n_ops; j++)
      if (a.sh[i] == b.sh[j]) {
        int rc = sides_agree(c, p, a.sh[i], redundant);
        if (rc) return rc;
        break;
      }
  }
  return TEQ_OK;
}

/* The operator producing every output of g, or -1 if there are several. */
static int top_op(const GenVocab *v, const GenGraph *g, const uint8_t *outs, int n_out) {
  int top = -1;
  for (int i = 0; i < n_out; i++) {
    int slot = v->n_vars, k = 0;
    for (; k < g->n_ops; k++) {
      int n = v->t[g->op[k].t].n_out;
      if (outs[i] < slot + n) break;
      slot += n;
    }
    if (k == g->n_ops || (top >= 0 && top != k)) return -1;
    top = k;
  }
  return top;
}

/* Form (b): the same operator on top of both sides, its inputs equal. */
static int common_top(Checker *c, const GenPair *p, bool *redundant) {
  *redundant = false;
  const GenVocab *v = c->v;
  int ts = top_op(v, &p->src, p->src_out, p->n_out), td = top_op(v, &p->dst, p->dst_out, p->n_out);
  if (ts < 0 || td < 0 || p->src.op[ts].t != p->dst.op[td].t) return TEQ_OK;
  const GenTemplate *t = &v->t[p->src.op[ts].t];
  if ((t->flags & T_IDENT) || t->n_in == 0) return TEQ_OK;
  /* A pair whose outputs are the top operator's inputs. */
  GenPair q = *p;
  q.src.n_ops = p->src.n_ops, q.dst.n_ops = p->dst.n_ops;
  for (int order = 0; order < ((t->flags & T_COMMUTATIVE) ? 2 : 1) && !*redundant; order++) {
    q.n_out = (uint8_t)t->n_in;
    for (int i = 0; i < t->n_in; i++) {
      q.src_out[i] = p->src.op[ts].in[i];
      q.dst_out[i] = p->dst.op[td].in[order ? 1 - i : i];
    }
    int rc = sides_agree(c, &q, 0, redundant);
    if (rc) return rc;
  }
  return TEQ_OK;
}

/* Bit mask of the operators output slot `out` depends on. */
static unsigned cone(const GenVocab *v, const GenGraph *g, int out) {
  int first[GEN_MAX_DEPTH], slot = v->n_vars;
  for (int k = 0; k < g->n_ops; k++) first[k] = slot, slot += v->t[g->op[k].t].n_out;
  unsigned mask = 0;
  for (int k = g->n_ops - 1; k >= 0; k--) {
    int n = v->t[g->op[k].t].n_out;
    bool needed = out >= first[k] && out < first[k] + n;
    for (int j = k + 1; j < g->n_ops && !needed; j++)
      if (mask & (1u << j)) {
        const GenTemplate *t = &v->t[g->op[j].t];
        for (int i = 0; i < t->n_in; i++)
          if (g->op[j].in[i] >= first[k] && g->op[j].in[i] < first[k] + n) needed = true;
      }
    if (needed) mask |= 1u << k;
  }
  return mask;
}

static bool disjoint_union(const GenVocab *v, const GenPair *p) {
  if (p->n_out < 2) return false;
  unsigned ms[2 * GEN_MAX_DEPTH], md[2 * GEN_MAX_DEPTH];
  int group[2 * GEN_MAX_DEPTH];
  for (int i = 0; i < p->n_out; i++) {
    ms[i] = cone(v, &p->src, p->src_out[i]);
    md[i] = cone(v, &p->dst, p->dst_out[i]);
    group[i] = i;
  }
  /* Union-find by repeated relabelling: at most 10 outputs. */
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < p->n_out; i++)
      for (int j = 0; j < p->n_out; j++)
        if (group[i] != group[j] && ((ms[i] & ms[j]) || (md[i] & md[j]))) {
          int lo = group[i] < group[j] ? group[i] : group[j];
          group[i] = group[j] = lo;
          changed = true;
        }
  }
  for (int i = 1; i < p->n_out; i++)
    if (group[i] != group[0]) return true;
  return false;
}

/* ---- the pipeline ---- */

/* Every map of a rule's used variables into themselves, class by class,
 * that merges at least two: each gives a rule that is an instance of this
 * one (x2 renamed to x1); an instance found among the kept rules is less
 * general and is dropped. Instances of instances are instances, so the
 * result does not depend on the order rules are visited in. */
typedef struct MergeSearch {
  const GenVocab *v;
  UsedVars used;
  uint8_t map[GEN_MAX_VARS];
  const GenPair *p;
  const PairSet *set;
  size_t self;
  atomic_bool *drop;
  CanonPair scratch;
} MergeSearch;

static void merge_dfs(MergeSearch *m, int cls, int pos, bool merged) {
  const GenVocab *v = m->v;
  if (cls == v->n_classes) {
    if (!merged) return;
    GenPair q = *m->p;
    for (int s = 0; s < 2; s++) {
      GenGraph *g = s ? &q.dst : &q.src;
      for (int k = 0; k < g->n_ops; k++)
        for (int i = 0; i < v->t[g->op[k].t].n_in; i++)
          if (g->op[k].in[i] < v->n_vars) g->op[k].in[i] = m->map[g->op[k].in[i]];
    }
    canon_renamed(v, &q, &m->scratch, false);
    /* Only when no two operators became one: a matcher maps operators
     * one to one, so a collapsed instance is not covered by this rule. */
    if (m->scratch.p.src.n_ops + m->scratch.p.dst.n_ops != m->p->src.n_ops + m->p->dst.n_ops)
      return;
    size_t j = pairset_find(m->set, &m->scratch.p);
    if (j != SIZE_MAX && j != m->self) atomic_store_explicit(&m->drop[j], true, memory_order_relaxed);
    return;
  }
  if (pos == m->used.n[cls]) {
    merge_dfs(m, cls + 1, 0, merged);
    return;
  }
  int var = m->used.var[cls][pos];
  for (int j = 0; j < m->used.n[cls]; j++) {
    int target = m->used.var[cls][j];
    bool dup = false;
    for (int q = 0; q < pos; q++) dup |= m->map[m->used.var[cls][q]] == target;
    m->map[var] = (uint8_t)target;
    merge_dfs(m, cls, pos + 1, merged || dup);
  }
  m->map[var] = (uint8_t)var;
}

void gen_rules_free(GenRule *rules, size_t n) {
  for (size_t i = 0; rules && i < n; i++) free(rules[i].key);
  free(rules);
}

int gen_prune_bucket(const GenVocab *v, const GenPair *pairs, size_t n, GenCand **out,
                     size_t *n_out) {
  GenCand *c = malloc((n ? n : 1) * sizeof *c);
  CanonPair *tmp = malloc(sizeof *tmp);
  PairSet set = {0};
  int rc = c && tmp ? pairset_init(&set, c, n) : TEQ_ERR_NOMEM;
  size_t m = 0;
  for (size_t i = 0; !rc && i < n; i++) {
    canon_renamed(v, &pairs[i], tmp, false);
    if (pairset_find(&set, &tmp->p) != SIZE_MAX) continue;
    c[m].p = tmp->p;
    c[m].flags = 0;
    pairset_add(&set, m++);
  }
  pairset_fini(&set);
  free(tmp);
  if (rc) {
    free(c);
    return rc;
  }
  *out = c;
  *n_out = m;
  return TEQ_OK;
}

/* ---- the float32 check ----
 * Z_p has no relu, sigmoid or tanh: the registry evaluates fixed
 * polynomials in their place, and a rule can hold for the polynomial only
 * (with relu(1) = 3, ewadd(1, ewadd(1, 1)) = relu(1)). So each rule that
 * survives the other steps is also run in float32, with the CPU executor
 * and the real functions, at assignment A, on exec_compare's four draws:
 * every sign pattern of the inputs, which a scalar needs. */

#define F32_TOLERANCE 1e-3 /* relative, per element */
#define F32_DRAWS 4

static int f32_agree(const GenVocab *v, const GenPair *p, uint64_t seed, bool *agree, Diag *d) {
  *agree = true;
  Graph *src = NULL, *dst = NULL;
  int rc = gen_pair_graphs(v, p, SHAPE_A, &src, &dst, d);
  for (int draw = 0; !rc && *agree && draw < F32_DRAWS; draw++) {
    ExecDiff diff;
    rc = exec_compare(src, dst, EXEC_F32, seed, draw, F32_TOLERANCE, &diff, d);
    *agree = !diff.differ;
    exec_diff_fini(&diff);
  }
  graph_free(src);
  graph_free(dst);
  return rc;
}

/* ---- the merge, in threads ----
 * Workers take chunks of candidate indices from a shared counter. The
 * instance search only sets drop flags (atomically: several rules may
 * find the same instance); the value checks write each candidate's own
 * flags. */

enum { MERGE_INSTANCES, MERGE_CHECKS, MERGE_FLOAT32 };
#define MERGE_CHUNK 256

typedef struct Merge {
  const GenVocab *v;
  uint64_t seed;
  GenCand *c;
  size_t n;
  const PairSet *set;
  atomic_bool *drop;
  int stage;
  atomic_size_t next;
  atomic_int rc;
  Diag *d;
  pthread_mutex_t diag_mu;
} Merge;

static void *merge_worker(void *arg) {
  Merge *m = arg;
  const GenVocab *v = m->v;
  Checker *ck = NULL;
  MergeSearch *ms = calloc(1, sizeof *ms);
  int rc = ms ? TEQ_OK : TEQ_ERR_NOMEM;
  Diag d;
  diag_init(&d);
  if (!rc && m->stage == MERGE_CHECKS) {
    ck = calloc(1, sizeof *ck);
    rc = ck ? TEQ_OK : TEQ_ERR_NOMEM;
    if (!rc) {
      ck->v = v;
      ck->d = &d;
      rc = gen_state_init(&ck->st[0], v, SHAPE_A, gen_seed(m->seed, 3));
      if (!rc) rc = gen_state_init(&ck->st[1], v, SHAPE_B, gen_seed(m->seed, 4));
    }
  }
  while (!rc && !atomic_load(&m->rc)) {
    size_t lo = atomic_fetch_add(&m->next, MERGE_CHUNK);
    if (lo >= m->n) break;
    size_t hi = lo + MERGE_CHUNK < m->n ? lo + MERGE_CHUNK : m->n;
    for (size_t i = lo; !rc && i < hi; i++) {
      GenCand *c = &m->c[i];
      if (m->stage == MERGE_INSTANCES) {
        memset(ms, 0, sizeof *ms);
        ms->v = v, ms->p = &c->p, ms->set = m->set, ms->self = i, ms->drop = m->drop;
        used_by_class(v, &c->p, &ms->used, ms->map);
        merge_dfs(ms, 0, 0, false);
        continue;
      }
      if (atomic_load_explicit(&m->drop[i], memory_order_relaxed)) continue;
      if (m->stage == MERGE_FLOAT32) {
        bool agree = false;
        rc = f32_agree(v, &c->p, gen_seed(m->seed, 5), &agree, &d);
        if (!agree) c->flags |= CAND_FLOAT32;
        continue;
      }
      bool red = false;
      rc = common_operation(ck, &c->p, &red);
      if (!rc && !red) rc = common_top(ck, &c->p, &red);
      if (red) c->flags |= CAND_COMMON;
      if (disjoint_union(v, &c->p)) c->flags |= CAND_DISJOINT;
    }
  }
  if (rc) {
    pthread_mutex_lock(&m->diag_mu);
    int expected = 0;
    if (atomic_compare_exchange_strong(&m->rc, &expected, rc) && d.text && *d.text)
      diag_error(m->d, "%s", d.text);
    pthread_mutex_unlock(&m->diag_mu);
  }
  if (ck) {
    gen_state_fini(&ck->st[0]);
    gen_state_fini(&ck->st[1]);
  }
  free(ck);
  free(ms);
  diag_fini(&d);
  return NULL;
}

static int merge_stage(Merge *m, int stage, int threads) {
  m->stage = stage;
  atomic_store(&m->next, 0);
  pthread_t tid[64];
  int started = 0;
  for (int i = 0; i < threads && i < 64; i++) {
    if (pthread_create(&tid[i], NULL, merge_worker, m)) break;
    started++;
  }
  if (!started) merge_worker(m); /* no thread to be had: do it here */
  for (int i = 0; i < started; i++) pthread_join(tid[i], NULL);
  return atomic_load(&m->rc);
}

int gen_prune_merge(const GenVocab *v, uint64_t seed, int threads, GenCand *c, size_t n,
                    int64_t initial, GenRule **rules, size_t *n_rules, GenPruneStats *st,
                    Diag *d) {
  st->initial = initial;
  /* 1. Renaming: one copy of each canonical rule (buckets removed their
   * own copies already), and none that is another with variables merged. */
  PairSet set;
  int rc = pairset_init(&set, c, n);
  size_t m = 0;
  for (size_t i = 0; !rc && i < n; i++) {
    if (pairset_find(&set, &c[i].p) != SIZE_MAX) continue;
    c[m] = c[i];
    c[m].flags = 0;
    pairset_add(&set, m++);
  }
  atomic_bool *drop = rc ? NULL : calloc(m ? m : 1, sizeof *drop);
  if (!rc && !drop) rc = TEQ_ERR_NOMEM;
  Merge mg = {.v = v, .seed = seed, .c = c, .n = m, .set = &set, .drop = drop, .d = d};
  pthread_mutex_init(&mg.diag_mu, NULL);
  for (size_t i = 0; !rc && i < m; i++) atomic_init(&drop[i], false);
  if (!rc) rc = merge_stage(&mg, MERGE_INSTANCES, threads);
  pairset_fini(&set);
  int64_t kept = 0;
  for (size_t i = 0; !rc && i < m; i++) kept += !atomic_load(&drop[i]);
  st->after_renaming = kept;

  /* 2. Common subgraphs and 3. disjoint unions, on what is left. */
  if (!rc) rc = merge_stage(&mg, MERGE_CHECKS, threads);
  for (size_t i = 0; !rc && i < m; i++)
    if (!atomic_load(&drop[i]) && (c[i].flags & CAND_COMMON)) atomic_store(&drop[i], true), kept--;
  st->after_common = kept;
  for (size_t i = 0; !rc && i < m; i++)
    if (!atomic_load(&drop[i]) && (c[i].flags & CAND_DISJOINT)) atomic_store(&drop[i], true), kept--;
  st->after_disjoint = kept;

  /* 4. The float32 check, on what is left. */
  if (!rc) rc = merge_stage(&mg, MERGE_FLOAT32, threads);
  for (size_t i = 0; !rc && i < m; i++)
    if (!atomic_load(&drop[i]) && (c[i].flags & CAND_FLOAT32)) atomic_store(&drop[i], true), kept--;
  st->after_float32 = kept;

  pthread_mutex_destroy(&mg.diag_mu);

  /* Survivors, with their keys. */
  GenRule *out = rc ? NULL : malloc((kept ? (size_t)kept : 1) * sizeof *out);
  if (!rc && !out) rc = TEQ_ERR_NOMEM;
  size_t k = 0;
  char key[KEY_MAX];
  for (size_t i = 0; !rc && i < m; i++) {
    if (atomic_load(&drop[i])) continue;
    out[k].p = c[i].p;
    key_text(v, &c[i].p, key, sizeof key);
    if (!(out[k].key = strdup(key))) rc = TEQ_ERR_NOMEM;
    else k++;
  }
  free(drop);
  if (rc) {
    gen_rules_free(out, k);
    return rc;
  }
  *rules = out;
  *n_rules = k;
  return TEQ_OK;
}

int gen_prune(const GenVocab *v, uint64_t seed, const GenPair *pairs, size_t n, GenRule **rules,
              size_t *n_rules, GenPruneStats *st, Diag *d) {
  GenCand *c = NULL;
  size_t nc = 0;
  int rc = gen_prune_bucket(v, pairs, n, &c, &nc);
  if (!rc) rc = gen_prune_merge(v, seed, 1, c, nc, (int64_t)n, rules, n_rules, st, d);
  free(c);
  return rc;
}
