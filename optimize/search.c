/* search.c: MetaFlow's cost-based backtracking search (TASO Algorithm 2).
 *
 * Candidates wait in a priority queue ordered by cost. The cheapest is
 * taken, every rule is tried at every place it matches, and each rewritten
 * graph that was never seen before (by structural hash) and costs less than
 * alpha times the best so far is queued: alpha slightly above 1 lets the
 * search pass through a slightly worse graph on the way to a much better
 * one. It stops when the queue is empty, the budget of expanded graphs is
 * spent or time runs out.
 *
 * A graph larger than one window is searched a window at a time: a run of
 * consecutive operators (in topological order) is cut out as a graph of its
 * own, its inputs the tensors it reads from outside, its outputs the
 * tensors read outside; the best rewrite of the window is spliced back. A
 * second pass with windows shifted by half their size lets rewrites span
 * the seams of the first. Each window costs about the same, so time grows
 * linearly with the model.
 *
 * PET's partially equivalent mutations compete in the same queue (with
 * OptOptions.pet). Expanding a candidate also splits it into multi-linear
 * subprograms (pet_split), and each corrected mutant of each subprogram is
 * spliced in, post-optimized (pet_post_optimize: the layouts of mutants
 * that meet across an activation cancel), costed with its corrections by
 * the same model and kept or dropped by the same alpha rule and hash.
 * Mutants depend only on a subprogram's operators and shapes, so they are
 * generated once per structural hash for the whole search (every window),
 * and tested once.
 *
 * PET's Algorithm 2 keeps the top K programs per subprogram over r rounds
 * of mutation. Here the queue plays both parts: K bounds the corrected
 * mutants per subprogram (pet_mutants); a candidate within alpha of the
 * best stays in the queue, as a program stays in PET's top-K heap; and a
 * candidate holding a mutant is split again when it is expanded, so the
 * mutant's own operators are mutated in a later step: the rounds. Rule
 * rewrites and mutations interleave freely, which PET's greedy pass over
 * the subprograms in a fixed order does not allow. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "optimize/opt_int.h"
#include "optimize/pet/pet.h"
#include "runtime/exec.h"

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void opt_stats_fini(OptStats *st) {
  free(st->applied);
  free(st->pet_applied);
  st->applied = NULL;
  st->pet_applied = NULL;
  st->n_pet_applied = 0;
}

/* ---- a set of 64-bit keys, with a small value each ---- */

typedef struct KeySet {
  uint64_t *key;
  uint8_t *val;
  size_t cap, n;
} KeySet;

static void keyset_fini(KeySet *s) {
  free(s->key), free(s->val);
  memset(s, 0, sizeof *s);
}

/* The slot of k (0 is reserved as empty: keys are made non-zero). */
static size_t keyset_slot(const KeySet *s, uint64_t k) {
  size_t i = (size_t)(k * 0x9E3779B97F4A7C15ull) & (s->cap - 1);
  while (s->key[i] && s->key[i] != k) i = (i + 1) & (s->cap - 1);
  return i;
}

static int keyset_get(const KeySet *s, uint64_t k) {
  if (!s->cap) return 0;
  k |= 1;
  size_t i = keyset_slot(s, k);
  return s->key[i] ? s->val[i] : 0;
}

static int keyset_put(KeySet *s, uint64_t k, uint8_t v) {
  k |= 1;
  if (2 * (s->n + 1) > s->cap) {
    KeySet bigger = {.cap = s->cap ? s->cap * 2 : 1024};
    bigger.key = calloc(bigger.cap, sizeof *bigger.key);
    bigger.val = calloc(bigger.cap, sizeof *bigger.val);
    if (!bigger.key || !bigger.val) {
      keyset_fini(&bigger);
      return TEQ_ERR_NOMEM;
    }
    for (size_t i = 0; i < s->cap; i++)
      if (s->key[i]) {
        size_t j = keyset_slot(&bigger, s->key[i]);
        bigger.key[j] = s->key[i], bigger.val[j] = s->val[i], bigger.n++;
      }
    keyset_fini(s);
    *s = bigger;
  }
  size_t i = keyset_slot(s, k);
  if (!s->key[i]) s->n++;
  s->key[i] = k, s->val[i] = v;
  return TEQ_OK;
}

/* ---- candidates and the queue ---- */

/* ---- PET's mutants, once per subprogram ---- */

/* One corrected mutant. Its inputs and outputs are the subprogram's. */
typedef struct PetMut {
  Graph *g;
  OptPetApplied info; /* cost_delta_us is NAN until it is first spliced in */
} PetMut;

/* The mutants of one subprogram: muts[first .. first + n). */
typedef struct PetEntry {
  uint64_t hash;
  int first, n;
} PetEntry;

typedef struct PetCache {
  PetEntry *e;
  int n_e, cap_e;
  PetMut *m;
  int n_m, cap_m;
} PetCache;

static void pet_cache_fini(PetCache *pc) {
  for (int i = 0; i < pc->n_m; i++) graph_free(pc->m[i].g);
  free(pc->e), free(pc->m);
  memset(pc, 0, sizeof *pc);
}

typedef struct Cand {
  Graph *g;
  double cost;
  int32_t *hist; /* steps so far, in order: a directed rule, or -1 - k for PET mutant k */
  int n_hist;
} Cand;

static void cand_free(Cand *c) {
  graph_free(c->g);
  free(c->hist);
  memset(c, 0, sizeof *c);
}

typedef struct Heap {
  Cand *a;
  int n, cap;
} Heap;

static int heap_push(Heap *h, Cand c) {
  if (h->n == h->cap) {
    int cap = h->cap ? h->cap * 2 : 64;
    Cand *a = realloc(h->a, (size_t)cap * sizeof *a);
    if (!a) return TEQ_ERR_NOMEM;
    h->a = a, h->cap = cap;
  }
  int i = h->n++;
  while (i > 0 && h->a[(i - 1) / 2].cost > c.cost) {
    h->a[i] = h->a[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->a[i] = c;
  return TEQ_OK;
}

static Cand heap_pop(Heap *h) {
  Cand top = h->a[0], last = h->a[--h->n];
  int i = 0;
  for (;;) {
    int l = 2 * i + 1, r = l + 1, m = i;
    double mc = last.cost;
    if (l < h->n && h->a[l].cost < mc) m = l, mc = h->a[l].cost;
    if (r < h->n && h->a[r].cost < mc) m = r;
    if (m == i) break;
    h->a[i] = h->a[m];
    i = m;
  }
  if (h->n) h->a[i] = last;
  return top;
}

/* ---- prices ---- */

/* What g costs as it will be exported: biases and activations are first
 * folded back into the convolutions that can take them, as opt_fuse_bias
 * does after the search. A rewrite that reassociates a bias add away from
 * its conv, or a mutant that merges two convs behind a split, leaves
 * biases and activations as separate operators; priced as searched, that
 * looks free, and the exported model came out dearer than the original
 * (MobileNetV2: +1.5%; priced as exported: -1.7%, and ResNet-18 -17.1%
 * against -14.7%, SqueezeNet -14.2% against -8.0%, at about twice the
 * search time). */
static int price(CostModel *cm, const Graph *g, double *us, Diag *d) {
  Graph *f = graph_copy(g);
  if (!f) return TEQ_ERR_NOMEM;
  int rc = opt_fuse_bias(f, NULL, d);
  if (rc == TEQ_OK) rc = opt_graph_cost(cm, f, us, NULL, d);
  graph_free(f);
  return rc;
}

/* ---- one window's search ---- */

typedef struct Ctx {
  const OptRules *rs;
  CostModel *cm;
  const OptOptions *o;
  OptStats *st;
  Diag *d;
  KeySet seen;
  KeySet *checked; /* Z_p verdicts, shared by every window */
  Heap heap;
  Cand best;
  const Cand *parent;
  int rule;        /* the rule being applied */
  int step;        /* its entry in the history: rule, or -1 - k for PET mutant k */
  PetCache *pet;   /* shared by every window */
  bool queued;     /* offer's verdict on the last graph */
  const Graph *g;  /* the graph it is applied to */
  int rc;
  double deadline;
  /* opt_apply_rule's caller */
  bool (*take)(Graph *rewritten, void *ctx);
  void *take_ctx;
} Ctx;

enum { CHECK_NONE, CHECK_OK, CHECK_BAD, CHECK_TRUSTED };

static double graph_flops(const Graph *g) {
  double f = 0;
  for (int id = 0; id < g->n_nodes; id++)
    if (!(op_def(g->nodes[id].kind)->flags & OPF_SOURCE)) f += cost_node_flops(g, id);
  return f;
}

/* Whether this instance of the rule holds, checked exactly in Z_p on
 * random inputs at the match's shapes when that is cheap enough. */
static int check_instance(Ctx *c, const OptRule *rule, const OptMatch *m, const Graph *inst,
                          bool *ok) {
  uint64_t key = hash_bytes(0x5eed, &c->rule, sizeof c->rule);
  for (int v = 0; v < rule->src->n_inputs; v++) {
    TensorRef b = m->bind[rule->src->inputs[v]];
    if (b.node < 0) continue;
    /* Field by field: a Shape's padding bytes are not set. */
    const Shape *sh = graph_shape(c->g, b);
    key = hash_bytes(key, &sh->ndim, sizeof sh->ndim);
    key = hash_bytes(key, sh->d, (size_t)(sh->ndim > 0 ? sh->ndim : 0) * sizeof sh->d[0]);
  }
  for (int p = 0; p < rule->src->n_nodes; p++)
    if (m->node[p] >= 0)
      key = hash_bytes(key, &c->g->nodes[m->node[p]].params, sizeof(Params));
  int verdict = c->checked ? keyset_get(c->checked, key) : CHECK_NONE;
  if (verdict == CHECK_NONE) {
    Graph *src = NULL;
    int rc = opt_extract_match(rule, c->g, m, &src);
    if (rc) return rc;
    double flops = graph_flops(src) + graph_flops(inst);
    if (c->o->zp_check_flops <= 0 || flops > c->o->zp_check_flops) {
      verdict = CHECK_TRUSTED;
      c->st->zp_trusted++;
    } else {
      ExecDiff diff;
      Diag quiet;
      diag_init(&quiet);
      rc = exec_compare(src, inst, EXEC_MODP, c->o->seed, 0, 0, &diff, &quiet);
      verdict = rc == TEQ_OK && !diff.differ ? CHECK_OK : CHECK_BAD;
      if (rc == TEQ_OK) exec_diff_fini(&diff);
      diag_fini(&quiet);
      c->st->zp_checked++;
    }
    graph_free(src);
    if (c->checked && (rc = keyset_put(c->checked, key, (uint8_t)verdict))) return rc;
  }
  if (verdict == CHECK_BAD) c->st->rejected_zp++;
  *ok = verdict != CHECK_BAD;
  return TEQ_OK;
}

/* Builds the rewrite of one match; *out is NULL when it does not apply. */
static int rewrite(Ctx *c, const OptMatch *m, Graph **out) {
  const OptRule *rule = &c->rs->r[c->rule];
  *out = NULL;
  Graph *inst = NULL;
  int rc = opt_instantiate(rule, c->g, m, &inst);
  if (rc == TEQ_ERR_INPUT || rc == TEQ_ERR_UNSUPPORTED) {
    c->st->rejected_shape++;
    return TEQ_OK;
  }
  if (rc) return rc;
  bool ok = true;
  rc = check_instance(c, rule, m, inst, &ok);
  if (rc == TEQ_OK && ok) {
    TensorRef bind[OPT_MAX_SIDE], replace[OPT_MAX_SIDE];
    for (int v = 0; v < rule->src->n_inputs; v++) bind[v] = m->bind[rule->src->inputs[v]];
    for (int k = 0; k < rule->src->n_outputs; k++) {
      TensorRef r = rule->src->outputs[k];
      replace[k] = (TensorRef){m->node[r.node], r.out};
    }
    Diag quiet;
    diag_init(&quiet);
    rc = opt_splice(c->g, inst, bind, replace, out, &quiet);
    diag_fini(&quiet);
    if (rc == TEQ_ERR_INPUT) {
      c->st->rejected_cycle++;
      rc = TEQ_OK;
    }
  }
  graph_free(inst);
  return rc;
}

/* A rewritten graph of c->parent (taken): dropped when seen before, else
 * costed, made the best if it is, and queued within alpha of the best.
 * False to stop expanding (an error in c->rc, or the time is up). */
static bool offer(Ctx *c, Graph *ng) {
  c->queued = false;
  uint64_t h = graph_hash(ng, NULL);
  if (keyset_get(&c->seen, h)) {
    c->st->duplicates++;
    graph_free(ng);
    return true;
  }
  if ((c->rc = keyset_put(&c->seen, h, 1))) {
    graph_free(ng);
    return false;
  }
  double cost;
  if ((c->rc = price(c->cm, ng, &cost, c->d))) {
    graph_free(ng);
    return false;
  }
  if (c->step < 0 && isnan(c->pet->m[-1 - c->step].info.cost_delta_us))
    c->pet->m[-1 - c->step].info.cost_delta_us = cost - c->parent->cost;
  const Cand *p = c->parent;
  Cand nc = {.g = ng, .cost = cost, .n_hist = p->n_hist + 1};
  nc.hist = malloc((size_t)nc.n_hist * sizeof *nc.hist);
  if (!nc.hist) {
    graph_free(ng);
    c->rc = TEQ_ERR_NOMEM;
    return false;
  }
  if (p->n_hist) memcpy(nc.hist, p->hist, (size_t)p->n_hist * sizeof *nc.hist);
  nc.hist[p->n_hist] = c->step;
  if (cost < c->best.cost) {
    Cand copy = {.g = graph_copy(ng), .cost = cost, .n_hist = nc.n_hist};
    copy.hist = malloc((size_t)nc.n_hist * sizeof *copy.hist);
    if (!copy.g || !copy.hist) {
      cand_free(&copy);
      cand_free(&nc);
      c->rc = TEQ_ERR_NOMEM;
      return false;
    }
    memcpy(copy.hist, nc.hist, (size_t)nc.n_hist * sizeof *copy.hist);
    cand_free(&c->best);
    c->best = copy;
  }
  if (cost < c->o->alpha * c->best.cost && c->heap.n < 8 * c->o->budget + 64) {
    c->st->kept++;
    c->queued = true;
    if ((c->rc = heap_push(&c->heap, nc))) {
      cand_free(&nc);
      return false;
    }
  } else {
    cand_free(&nc);
  }
  return now_s() < c->deadline;
}

static bool on_match(const OptMatch *m, void *ctx) {
  Ctx *c = ctx;
  Graph *ng = NULL;
  c->rc = rewrite(c, m, &ng);
  if (c->rc) return false;
  if (!ng) return true;
  c->st->generated++;
  if (c->take) { /* opt_apply_rule */
    if (!c->take(ng, c->take_ctx)) graph_free(ng);
    return true;
  }
  c->step = c->rule;
  return offer(c, ng);
}

/* What the regions a correction recomputes look like in a report:
 * "2 regions, 896 elements: out0 [0:1, 0:64, 0:28, 13:15] ...". */
static void regions_text(const PetRegions *rg, char *buf, size_t size) {
  if (rg->n == 0) {
    snprintf(buf, size, "none (exact)");
    return;
  }
  int64_t elems = 0;
  for (int i = 0; i < rg->n; i++) {
    int64_t k = 1;
    for (int j = 0; j < rg->v[i].ndim; j++) k *= rg->v[i].hi[j] - rg->v[i].lo[j];
    elems += k;
  }
  size_t len = (size_t)snprintf(buf, size, "%d region%s, %lld elements:", rg->n,
                                rg->n == 1 ? "" : "s", (long long)elems);
  for (int i = 0; i < rg->n && i < 3 && len < size; i++) {
    len += (size_t)snprintf(buf + len, size - len, " out%d [", rg->v[i].output);
    for (int j = 0; j < rg->v[i].ndim && len < size; j++)
      len += (size_t)snprintf(buf + len, size - len, "%s%lld:%lld", j ? ", " : "",
                              (long long)rg->v[i].lo[j], (long long)rg->v[i].hi[j]);
    if (len < size) len += (size_t)snprintf(buf + len, size - len, "]");
  }
  if (rg->n > 3 && len < size) snprintf(buf + len, size - len, " ...");
}

/* The corrected mutants of subprogram sp, generated on first sight; NULL
 * (with c->rc set) on a hard error, or an entry with none. */
static const PetEntry *pet_entry(Ctx *c, const PetSubprogram *sp) {
  PetCache *pc = c->pet;
  for (int i = 0; i < pc->n_e; i++)
    if (pc->e[i].hash == sp->hash) return &pc->e[i];
  if (pc->n_e == pc->cap_e) {
    int cap = pc->cap_e ? 2 * pc->cap_e : 64;
    PetEntry *e = realloc(pc->e, (size_t)cap * sizeof *e);
    if (!e) return c->rc = TEQ_ERR_NOMEM, NULL;
    pc->e = e, pc->cap_e = cap;
  }
  PetEntry *e = &pc->e[pc->n_e++];
  *e = (PetEntry){.hash = sp->hash, .first = pc->n_m};
  if (sp->flops > c->o->pet_max_flops) {
    c->st->pet_too_large++;
    return e;
  }
  c->st->pet_subprograms++;
  PetMutateOptions mo = {.depth = c->o->pet_depth, .max_mutants = c->o->pet_mutants,
                         .seed = c->o->seed, .trials = c->o->pet_trials};
  PetMutant *mut = NULL;
  int n_mut = 0;
  Diag quiet;
  diag_init(&quiet);
  int rc = pet_mutate(sp->graph, &mo, &mut, &n_mut, &quiet);
  if (rc == TEQ_ERR_NOMEM) c->rc = rc;
  for (int k = 0; k < n_mut && !c->rc; k++) {
    Graph *fixed = NULL;
    PetRegions rg = {0};
    rc = pet_correct(sp->graph, mut[k].graph, &mut[k].report, &fixed, &rg, &quiet);
    if (rc == TEQ_ERR_NOMEM) c->rc = rc;
    if (rc) {
      c->st->pet_failed++;
      continue;
    }
    if (pc->n_m == pc->cap_m) {
      int cap = pc->cap_m ? 2 * pc->cap_m : 64;
      PetMut *m = realloc(pc->m, (size_t)cap * sizeof *m);
      if (!m) {
        c->rc = TEQ_ERR_NOMEM;
        graph_free(fixed);
        pet_regions_fini(&rg);
        break;
      }
      pc->m = m, pc->cap_m = cap;
    }
    PetMut *pm = &pc->m[pc->n_m++];
    *pm = (PetMut){.g = fixed};
    snprintf(pm->info.desc, sizeof pm->info.desc, "%s", mut[k].desc);
    regions_text(&rg, pm->info.correction, sizeof pm->info.correction);
    pm->info.cost_delta_us = NAN;
    pm->info.log2_bound = mut[k].report.log2_bound;
    pm->info.trials = mut[k].report.trials;
    e->n++;
    c->st->pet_mutants++;
    pet_regions_fini(&rg);
  }
  pet_mutants_free(mut, n_mut);
  diag_fini(&quiet);
  return c->rc ? NULL : e;
}

/* Every corrected mutant of every subprogram of c->g, spliced in. */
static int expand_pet(Ctx *c) {
  double t0 = now_s();
  PetSplit sp;
  Diag quiet;
  diag_init(&quiet);
  int rc = pet_split(c->g, NULL, &sp, &quiet);
  c->st->pet_s += now_s() - t0;
  for (int i = 0; i < sp.n && rc == TEQ_OK && now_s() < c->deadline; i++) {
    t0 = now_s();
    const PetEntry *e = pet_entry(c, &sp.v[i]);
    c->st->pet_s += now_s() - t0;
    if (!e) {
      rc = c->rc;
      break;
    }
    for (int k = e->first; k < e->first + e->n && rc == TEQ_OK; k++) {
      Graph *ng = NULL;
      rc = opt_splice(c->g, c->pet->m[k].g, sp.v[i].in, sp.v[i].out, &ng, &quiet);
      if (rc == TEQ_ERR_INPUT) { /* a cycle through the subprogram's outside */
        c->st->rejected_cycle++;
        rc = TEQ_OK;
        continue;
      }
      PetPostStats post;
      if (rc == TEQ_OK && (rc = pet_post_optimize(&ng, &post, c->d))) graph_free(ng);
      if (rc) break;
      c->st->pet_post_moved += post.moved, c->st->pet_post_removed += post.removed;
      c->st->pet_post_fused += post.fused;
      c->st->generated++, c->st->pet_built++;
      c->step = -1 - k;
      bool go = offer(c, ng);
      c->st->pet_kept += c->queued;
      rc = c->rc;
      if (!go) break;
    }
  }
  pet_split_fini(&sp);
  diag_fini(&quiet);
  return rc;
}

/* Every rule at every match in c->g. */
static int expand(Ctx *c) {
  OptUses u;
  int rc = opt_uses_build(c->g, &u);
  if (rc) return rc;
  /* Nodes computed from weights alone are precomputed before export, so
   * rewriting them gains nothing; they are matched only inside rules rooted
   * elsewhere. */
  bool *weights = NULL;
  int32_t *order = malloc(((size_t)c->g->n_nodes + 1) * sizeof *order);
  if (!order) rc = TEQ_ERR_NOMEM;
  if (!rc) rc = graph_topo_order(c->g, order);
  if (!rc && !(weights = opt_weight_only(c->g, order))) rc = TEQ_ERR_NOMEM;
  free(order);
  for (int id = 0; id < c->g->n_nodes && rc == TEQ_OK; id++) {
    OpKind k = c->g->nodes[id].kind;
    if (weights[id]) continue;
    for (int j = 0; j < c->rs->n_by_root[k] && rc == TEQ_OK; j++) {
      c->rule = c->rs->by_root[k][j];
      opt_match_at(&c->rs->r[c->rule], c->g, &u, id, c->o->max_matches, on_match, c);
      rc = c->rc;
      if (now_s() >= c->deadline) break;
    }
  }
  opt_uses_fini(&u);
  free(weights);
  if (rc == TEQ_OK && c->pet && now_s() < c->deadline) rc = expand_pet(c);
  return rc;
}

/* Searches g alone; *best_out receives the best candidate. */
static int search_graph(const Graph *g, const OptRules *rs, CostModel *cm, const OptOptions *o,
                        KeySet *checked, PetCache *pet, double deadline, OptStats *st,
                        Cand *best_out, Diag *d) {
  Ctx c = {.rs = rs, .cm = cm, .o = o, .st = st, .d = d, .checked = checked, .pet = pet,
           .deadline = deadline};
  double cost;
  int rc = price(cm, g, &cost, d);
  if (rc) return rc;
  Cand start = {.g = graph_copy(g), .cost = cost};
  c.best = (Cand){.g = graph_copy(g), .cost = cost};
  if (!start.g || !c.best.g) rc = TEQ_ERR_NOMEM;
  if (!rc) rc = keyset_put(&c.seen, graph_hash(g, NULL), 1);
  if (!rc) rc = heap_push(&c.heap, start);
  else cand_free(&start);
  for (int expanded = 0; rc == TEQ_OK && c.heap.n > 0 && expanded < o->budget; expanded++) {
    if (now_s() >= deadline) {
      st->stopped_by_time = true;
      break;
    }
    Cand cur = heap_pop(&c.heap);
    st->explored++;
    c.parent = &cur;
    c.g = cur.g;
    rc = expand(&c);
    cand_free(&cur);
  }
  while (c.heap.n > 0) {
    Cand x = heap_pop(&c.heap);
    cand_free(&x);
  }
  free(c.heap.a);
  keyset_fini(&c.seen);
  if (rc) {
    cand_free(&c.best);
    return rc;
  }
  *best_out = c.best;
  return TEQ_OK;
}

int opt_apply_rule(const OptRules *rs, int i, const Graph *g, const OptOptions *opt,
                   bool (*fn)(Graph *rewritten, void *ctx), void *ctx, OptStats *st, Diag *d) {
  OptOptions o = opt ? *opt : OPT_DEFAULTS;
  int max_matches = o.max_matches;
  KeySet checked = {0};
  Ctx c = {.rs = rs, .o = &o, .st = st, .d = d, .checked = &checked, .deadline = INFINITY,
           .rule = i, .g = g, .take = fn, .take_ctx = ctx};
  OptUses u;
  int rc = opt_uses_build(g, &u);
  if (rc) return rc;
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++)
    if (g->nodes[id].kind == rs->r[i].root) {
      opt_match_at(&rs->r[i], g, &u, id, max_matches, on_match, &c);
      rc = c.rc;
    }
  opt_uses_fini(&u);
  keyset_fini(&checked);
  return rc;
}

/* ---- windows ---- */

/* Whether the search may move node id into a window. */
static bool movable(const Node *n) {
  return n->kind != OP_INPUT && n->kind != OP_CONST && n->kind != OP_OPAQUE;
}

/* Cuts the movable nodes at positions [lo, hi) of order out of g as a
 * graph of its own; ext_in receives the tensor each of its inputs reads,
 * ext_out the tensor each of its outputs replaces. */
static int cut_window(const Graph *g, const int32_t *mov, int lo, int hi, Graph **out,
                      TensorRef **ext_in, TensorRef **ext_out, Diag *d) {
  int n = g->n_nodes;
  int32_t *map = malloc((size_t)n * sizeof *map);        /* node -> window node */
  int32_t *in_of = malloc((size_t)n * 8 * sizeof *in_of); /* (node, out) -> window input */
  TensorRef *xi = malloc(((size_t)n + 1) * sizeof *xi), *xo = malloc(((size_t)n * 8 + 1) * sizeof *xo);
  Graph *w = graph_new();
  int rc = map && in_of && xi && xo && w ? TEQ_OK : TEQ_ERR_NOMEM;
  int n_xi = 0;
  if (rc == TEQ_OK) {
    for (int i = 0; i < n; i++) map[i] = -1;
    for (int i = 0; i < n * 8; i++) in_of[i] = -1;
  }
  for (int k = lo; k < hi && rc == TEQ_OK; k++) {
    const Node *nd = &g->nodes[mov[k]];
    TensorRef in[16];
    if (nd->n_in > 16 || nd->n_out > 8) {
      rc = TEQ_ERR_UNSUPPORTED;
      break;
    }
    for (int j = 0; j < nd->n_in && rc == TEQ_OK; j++) {
      TensorRef r = nd->in[j];
      if (map[r.node] >= 0) {
        in[j] = (TensorRef){map[r.node], r.out};
        continue;
      }
      int *slot = &in_of[r.node * 8 + (r.out < 8 ? r.out : 0)];
      if (*slot < 0) {
        const Node *p = &g->nodes[r.node];
        int id = p->kind == OP_CONST ? graph_add_const(w, p->name, tensor_ref(p->value), d)
                                     : graph_add_input(w, NULL, graph_shape(g, r), p->dtype, d);
        if (id < 0) {
          rc = id;
          break;
        }
        *slot = id;
        if (p->kind != OP_CONST) xi[n_xi++] = r;
      }
      in[j] = (TensorRef){*slot, 0};
    }
    if (rc) break;
    int id = graph_add_node(w, nd->kind, in, nd->n_in, nd->n_out, &nd->params, nd->name, d);
    if (id < 0) rc = id;
    else map[mov[k]] = id;
  }
  /* Outputs: window tensors read outside the window or by the graph. */
  int n_xo = 0;
  if (rc == TEQ_OK) {
    int32_t *off = NULL, *uses = graph_use_counts(g, &off);
    if (!uses) rc = TEQ_ERR_NOMEM;
    for (int k = lo; k < hi && rc == TEQ_OK; k++) {
      int id = mov[k];
      for (int o = 0; o < g->nodes[id].n_out && rc == TEQ_OK; o++) {
        int inside = 0;
        for (int q = lo; q < hi; q++) {
          const Node *u = &g->nodes[mov[q]];
          for (int j = 0; j < u->n_in; j++) inside += u->in[j].node == id && u->in[j].out == o;
        }
        if (uses[off[id] + o] > inside) {
          int r = graph_add_output(w, (TensorRef){map[id], o}, NULL, d);
          if (r < 0) rc = r;
          xo[n_xo++] = (TensorRef){id, o};
        }
      }
    }
    free(uses);
    free(off);
  }
  free(map);
  free(in_of);
  if (rc) {
    graph_free(w);
    free(xi);
    free(xo);
    return rc;
  }
  *out = w, *ext_in = xi, *ext_out = xo;
  return TEQ_OK;
}

/* Counts PET mutant k once more in the result. */
static int pet_applied(OptStats *st, const PetCache *pc, int k, int **idx) {
  for (int i = 0; i < st->n_pet_applied; i++)
    if ((*idx)[i] == k) return st->pet_applied[i].times++, TEQ_OK;
  int n = st->n_pet_applied + 1;
  OptPetApplied *a = realloc(st->pet_applied, (size_t)n * sizeof *a);
  if (a) st->pet_applied = a;
  int *x = realloc(*idx, (size_t)n * sizeof *x);
  if (x) *idx = x;
  if (!a || !x) return TEQ_ERR_NOMEM;
  a[n - 1] = pc->m[k].info;
  a[n - 1].times = 1;
  x[n - 1] = k;
  st->n_pet_applied = n;
  return TEQ_OK;
}

int opt_search(const Graph *g, const OptRules *rs, CostModel *cm, const OptOptions *o,
               Graph **out, OptStats *st, Diag *d) {
  double t0 = now_s();
  double deadline = o->time_limit_s > 0 ? t0 + o->time_limit_s : INFINITY;
  memset(st, 0, sizeof *st);
  st->n_rules = rs->n;
  st->applied = calloc((size_t)rs->n + 1, sizeof *st->applied);
  KeySet checked = {0};
  PetCache pet = {0};
  int *pet_idx = NULL; /* the mutant of each st->pet_applied entry */
  Graph *cur = graph_copy(g);
  int rc = st->applied && cur ? TEQ_OK : TEQ_ERR_NOMEM;
  int window = o->window > 8 ? o->window : 8;
  int n_mov = 0;
  for (int i = 0; i < g->n_nodes; i++) n_mov += movable(&g->nodes[i]);
  int passes = n_mov > window ? 2 : 1;
  int n_windows = passes == 1 ? 1 : (n_mov + window - 1) / window * 2;
  for (int pass = 0; pass < passes && rc == TEQ_OK; pass++) {
    for (int lo = pass ? window / 2 : 0;; lo += window) {
      if (now_s() >= deadline) {
        st->stopped_by_time = true;
        break;
      }
      /* The movable nodes of the current graph in topological order. */
      int32_t *order = malloc(((size_t)cur->n_nodes + 1) * sizeof *order);
      if (!order) {
        rc = TEQ_ERR_NOMEM;
        break;
      }
      rc = graph_topo_order(cur, order);
      int m = 0;
      for (int k = 0; k < cur->n_nodes; k++)
        if (movable(&cur->nodes[order[k]])) order[m++] = order[k];
      if (rc || lo >= m) {
        free(order);
        break;
      }
      int hi = lo + window < m ? lo + window : m;
      if (pass == 0 && m - hi < window / 4) hi = m; /* no sliver of a last window */
      Graph *w = NULL;
      TensorRef *xi = NULL, *xo = NULL;
      rc = cut_window(cur, order, lo, hi, &w, &xi, &xo, d);
      free(order);
      if (rc) break;
      /* A share of the time left, by the windows left. */
      int left = n_windows - st->windows;
      double wd = isinf(deadline) ? deadline : now_s() + (deadline - now_s()) / (left > 0 ? left : 1);
      Cand best = {0};
      double before = 0;
      rc = price(cm, w, &before, d);
      if (!rc) rc = search_graph(w, rs, cm, o, &checked, o->pet ? &pet : NULL, wd, st, &best, d);
      st->windows++;
      if (!rc && best.cost < before) {
        Graph *next = NULL;
        Diag quiet;
        diag_init(&quiet);
        rc = opt_splice(cur, best.g, xi, xo, &next, &quiet);
        diag_fini(&quiet);
        if (rc == TEQ_OK) {
          graph_free(cur);
          cur = next;
          for (int k = 0; k < best.n_hist && rc == TEQ_OK; k++)
            if (best.hist[k] >= 0) st->applied[best.hist[k]]++;
            else rc = pet_applied(st, &pet, -1 - best.hist[k], &pet_idx);
        } else if (rc == TEQ_ERR_INPUT) {
          rc = TEQ_OK; /* cannot happen for a window cut at a topological run; keep cur */
        }
      }
      if (!rc && !o->quiet && o->progress)
        fprintf(o->progress, "optimize: window %d/%d (%d operators): cost %.1f -> %.1f us, "
                "%lld graphs expanded, %.1f s\n", st->windows, n_windows, hi - lo, before,
                best.g ? best.cost : before, (long long)st->explored, now_s() - t0);
      cand_free(&best);
      graph_free(w);
      free(xi);
      free(xo);
      if (rc || hi >= m) break;
    }
  }
  keyset_fini(&checked);
  pet_cache_fini(&pet);
  free(pet_idx);
  st->search_s = now_s() - t0;
  if (rc) {
    graph_free(cur);
    return rc;
  }
  *out = cur;
  return TEQ_OK;
}
