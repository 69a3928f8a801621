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
 * Most rewrites are never built. The graph being expanded is analysed
 * once, and each rewrite's structural hash and exported cost are derived
 * from it (delta.c); only the rewrites the search keeps, queued or a new
 * best, are spliced into graphs of their own. Derived or built, a rewrite
 * gets the same hash and the same cost to the last bit, so the search
 * takes the same path. Rules are first screened by their root in brief
 * (opt_root_fits), and each rule instance is solved once per rule and
 * shapes for the whole search (opt_inst_get), and checked in Z_p once,
 * when a rewrite through it is first made the best or taken to expand:
 * most are priced and dropped, and most of those queued are never taken
 * (NasRNN: 26 instances checked, where checking each on queueing checked
 * 53, 0.6-1.0 s of a 0.9-1.2 s search).
 *
 * Besides one rewrite per match, expanding a graph also applies each rule
 * at all its matches that share no node, as one candidate kept only if it
 * is cheaper than the graph it rewrites (expand_sites): a change that pays
 * only once made everywhere is one step, not a valley of dearer graphs
 * the greedy queue never crosses (OptOptions.one_site turns it off).
 * A merge rule goes on for more rounds over what it merged, and the rules
 * that only remove operators follow each round (more_rounds).
 *
 * A graph larger than one window is searched a window at a time: a run of
 * consecutive operators (in topological order) is cut out as a graph of its
 * own, its inputs the tensors it reads from outside, its outputs the
 * tensors read outside; the best rewrite of the window is spliced back. A
 * window ends, in its last quarter, where the fewest tensors cross the cut
 * (narrow_cut), and a last window under half a window joins the one before
 * it, with a budget in proportion. A second pass with windows shifted by
 * half their size lets rewrites span the seams of the first, and a few
 * expansions of the whole graph after them (search_whole, in at most half
 * the windows' time) find what spans windows that never meet. Each window
 * costs about the same, so time grows linearly with the model.
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
  OptInst *in;        /* the mutant (in->g), spliced in as a rule's target is */
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
  PetPostCache *post; /* pet_post_optimize's: chains decided, constants moved; the
                       * windows' finishes share it (opt_search makes it) */
} PetCache;

static void pet_cache_fini(PetCache *pc) {
  for (int i = 0; i < pc->n_m; i++) opt_inst_free(pc->m[i].in);
  free(pc->e), free(pc->m);
  pet_post_cache_free(pc->post);
  memset(pc, 0, sizeof *pc);
}

/* A graph being expanded, shared by the queued rewrites of it not built
 * yet: of the candidates queued, only one in ten or so is ever expanded. */
typedef struct Shared {
  Graph *g;
  int refs;
} Shared;

static void shared_drop(Shared *s) {
  if (s && --s->refs == 0) {
    graph_free(s->g);
    free(s);
  }
}

typedef struct Cand {
  Graph *g;          /* built; or NULL until it is taken, and then built from: */
  Shared *from;      /* the graph it rewrites, */
  const OptInst *in; /* spliced in, */
  TensorRef *io;     /* its inputs reading io[0 .. inputs), replacing io[inputs ..), */
  uint64_t hash;     /* giving a graph of this hash */
  double cost;
  int32_t *hist; /* steps so far, in order: a directed rule, or -1 - k for PET mutant k */
  int n_hist;
  /* The instances its last step spliced in that are not yet checked in
   * Z_p: checked when it is taken to expand (the graph it rewrites was). */
  OptInst **unchecked;
  int n_unchecked;
} Cand;

static void cand_free(Cand *c) {
  graph_free(c->g);
  shared_drop(c->from);
  free(c->io);
  free(c->hist);
  free(c->unchecked);
  memset(c, 0, sizeof *c);
}

typedef struct Heap {
  Cand *a;
  int n, cap;
} Heap;

/* Whether a is taken before b: the cheaper first, and at one cost the one
 * reached in fewer rewrites, so that rewrites the cost model cannot see
 * (a vector transposed into a view for a gemm that reads it transposed
 * back) are not expanded before the graphs they only respell. */
static bool before(const Cand *a, const Cand *b) {
  return a->cost < b->cost || (a->cost == b->cost && a->n_hist < b->n_hist);
}

static int heap_push(Heap *h, Cand c) {
  if (h->n == h->cap) {
    int cap = h->cap ? h->cap * 2 : 64;
    Cand *a = realloc(h->a, (size_t)cap * sizeof *a);
    if (!a) return TEQ_ERR_NOMEM;
    h->a = a, h->cap = cap;
  }
  int i = h->n++;
  while (i > 0 && before(&c, &h->a[(i - 1) / 2])) {
    h->a[i] = h->a[(i - 1) / 2];
    i = (i - 1) / 2;
  }
  h->a[i] = c;
  return TEQ_OK;
}

/* The queue is bounded (a search keeps far more candidates than it can
 * expand): when full, a candidate cheaper than the dearest queued one
 * takes its place, and the dearest is handed back in *out (freed by the
 * caller); a dearer one is handed back itself. The dearest of a binary
 * heap is one of its leaves. Refusing every candidate once full, as the
 * queue once did, also refused the new best graphs: the search went on
 * expanding the old plateau (NasRNN in one window, budget 100: -0.4%;
 * budget 200, never full: -26%). */
static int heap_push_bounded(Heap *h, Cand c, int cap, Cand *out) {
  memset(out, 0, sizeof *out);
  if (h->n < cap) return heap_push(h, c);
  int worst = h->n / 2;
  for (int i = worst + 1; i < h->n; i++)
    if (before(&h->a[worst], &h->a[i])) worst = i;
  if (h->n == 0 || !before(&c, &h->a[worst])) {
    *out = c;
    return TEQ_OK;
  }
  *out = h->a[worst];
  int i = worst;
  while (i > 0 && before(&c, &h->a[(i - 1) / 2])) {
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
    const Cand *mc = &last;
    if (l < h->n && before(&h->a[l], mc)) m = l, mc = &h->a[l];
    if (r < h->n && before(&h->a[r], mc)) m = r;
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
 * search time). Rule rewrites get this price derived (delta.c); this is
 * for the windows, PET's mutants and what delta.c leaves to built graphs. */
static int price(CostModel *cm, OptPricer *pr, const Graph *g, double *us, Diag *d) {
  /* Through the pricer's caches when it can: the same double, without a
   * refolded copy or a formatted key per node. */
  int r = pr ? opt_pricer_price(pr, g, us, d) : OPT_DELTA_BUILD;
  if (r != OPT_DELTA_BUILD) return r;
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
  KeySet *checked; /* opt_apply_rule's Z_p verdicts (the search's are its instances') */
  Heap heap;
  Cand best;
  /* The bests before best, oldest first (at most RUNNERS_MAX; NULL: not
   * kept): a window chooses among them by the cost as run. */
  Cand *runners;
  int n_runners;
  const Cand *parent;
  Shared *shared;  /* the parent's graph (g), for the rewrites queued unbuilt */
  int rule;        /* the rule being applied */
  int step;        /* its entry in the history: rule, or -1 - k for PET mutant k */
  PetCache *pet;   /* shared by every window */
  bool queued;     /* offer's verdict on the last graph */
  const Graph *g;  /* the graph it is applied to */
  int rc;
  double deadline;
  OptPricer *pr;     /* configuration costs, shared by every window */
  OptInstMemo *memo; /* instances and their Z_p verdicts, shared by every window */
  ExecInputs *inputs; /* the Z_p checks' random inputs, likewise */
  OptBase *base;     /* g analysed, while it is expanded */
  /* The matches of g that its rules rewrite alone without a cycle, for
   * the rewrites at every site at once (expand_sites). */
  struct Site *sites;
  int n_sites, cap_sites;
  int repeat;     /* history entries the next settled candidate adds (its step) */
  const int32_t *steps; /* or these rules, n_steps of them, when set */
  int n_steps;
  double ceiling; /* settle drops candidates costing this or more */
  bool sites_only; /* search_whole: matches only gathered for expand_sites */
  bool cycle;     /* offer_derived's verdict on the last rewrite: a cycle */
  /* The instances the next offered rewrite splices in: checked in Z_p
   * only if the search makes it the best or takes it to expand. */
  OptInst *const *pending;
  int n_pending;
  /* opt_apply_rule's caller, or opt_apply_rule_priced's */
  bool (*take)(Graph *rewritten, void *ctx);
  OptPricedFn priced;
  void *take_ctx;
} Ctx;

enum { CHECK_NONE, CHECK_OK, CHECK_BAD, CHECK_TRUSTED };

/* One place a rule rewrites the graph being expanded. */
typedef struct Site {
  int rule, seq; /* seq: found seq-th in this expansion */
  OptMatch m;
  OptInst *in; /* the memo's, alive for the whole search */
} Site;

/* What running g once in Z_p costs, in operations: its flops, the elements
 * its operators read and write, and its inputs' elements (each made
 * random). Data moved counts as much as arithmetic: VGG-19's classifier
 * weight, [4096, 25088], transposed by a layout rule costs no flops, and
 * checking instances that filled and moved it took 0.4 s of a 1.0 s search. */
static double graph_check_work(const Graph *g) {
  double w = 0;
  for (int id = 0; id < g->n_nodes; id++)
    if (op_def(g->nodes[id].kind)->flags & OPF_SOURCE)
      w += (double)shape_numel(&g->nodes[id].out[0]);
    else
      w += cost_node_flops(g, id) + cost_node_bytes(g, id) / sizeof(float);
  return w;
}

/* Whether inst computes what src does (CHECK_BAD: it does not), checked
 * exactly in Z_p on random inputs when that is cheap enough. */
static int zp_verdict(Ctx *c, const Graph *src, const Graph *inst, int *out) {
  double work = graph_check_work(src) + graph_check_work(inst);
  if (c->o->zp_check_flops <= 0 || work > c->o->zp_check_flops) {
    c->st->zp_trusted++;
    *out = CHECK_TRUSTED;
    return TEQ_OK;
  }
  double t0 = now_s();
  ExecDiff diff;
  Diag quiet;
  diag_init(&quiet);
  int rc = exec_compare_kept(src, inst, EXEC_MODP, c->o->seed, 0, 0, c->inputs, &diff, &quiet);
  *out = rc == TEQ_OK && !diff.differ ? CHECK_OK : CHECK_BAD;
  if (rc == TEQ_OK) exec_diff_fini(&diff);
  diag_fini(&quiet);
  c->st->zp_checked++;
  c->st->zp_s += now_s() - t0;
  return TEQ_OK;
}

/* Whether this instance of the rule holds at match m, each distinct one
 * checked once (opt_apply_rule's path; the search's instances keep their
 * own verdicts). */
static int check_instance(Ctx *c, const OptRule *rule, const OptMatch *m, const Graph *inst,
                          int *out) {
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
      key = params_hash(key, &c->g->nodes[m->node[p]].params);
  int verdict = c->checked ? keyset_get(c->checked, key) : CHECK_NONE;
  if (verdict == CHECK_NONE) {
    Graph *src = NULL;
    int rc = opt_extract_match(rule, c->g, m, &src);
    if (rc == TEQ_OK) rc = zp_verdict(c, src, inst, &verdict);
    graph_free(src);
    if (rc) return rc;
    if (c->checked && (rc = keyset_put(c->checked, key, (uint8_t)verdict))) return rc;
  }
  *out = verdict;
  return TEQ_OK;
}

/* Whether an instance of the search holds: decided on first asking. */
static int inst_holds(Ctx *c, OptInst *in, bool *holds) {
  if (in->verdict == CHECK_NONE) {
    int rc = zp_verdict(c, in->src, in->g, &in->verdict);
    if (rc) return rc;
    graph_free(in->src);
    in->src = NULL;
  }
  *holds = in->verdict != CHECK_BAD;
  return TEQ_OK;
}

/* The bound and replaced tensors of match m of rule c->rule. */
static void match_tensors(const Ctx *c, const OptMatch *m, TensorRef *bind, TensorRef *replace) {
  const OptRule *rule = &c->rs->r[c->rule];
  for (int v = 0; v < rule->src->n_inputs; v++) bind[v] = m->bind[rule->src->inputs[v]];
  for (int k = 0; k < rule->src->n_outputs; k++) {
    TensorRef r = rule->src->outputs[k];
    replace[k] = (TensorRef){m->node[r.node], r.out};
  }
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
  int verdict = CHECK_NONE;
  rc = check_instance(c, rule, m, inst, &verdict);
  if (verdict == CHECK_BAD) c->st->rejected_zp++;
  if (rc == TEQ_OK && verdict != CHECK_BAD) {
    TensorRef bind[OPT_MAX_SIDE], replace[OPT_MAX_SIDE];
    match_tensors(c, m, bind, replace);
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

/* How to build a rewrite the search priced without building it. */
typedef struct Lazy {
  const OptInst *in;
  const TensorRef *bind, *replace;
  uint64_t hash;
} Lazy;

/* The rewrite of g lz describes, built; its structural hash must be the
 * one derived (delta.c), or deduplication would have gone wrong. */
static int build(Ctx *c, const Graph *g, const Lazy *lz, Graph **out) {
  Diag quiet;
  diag_init(&quiet);
  int rc = opt_splice(g, lz->in->g, lz->bind, lz->replace, out, &quiet);
  diag_fini(&quiet);
  if (rc == TEQ_ERR_INPUT) /* delta.c found no cycle */
    return diag_error(c->d, "optimize: a rewrite delta.c found acyclic has a cycle"),
           TEQ_ERR_INTERNAL;
  if (rc == TEQ_OK && graph_hash(*out, NULL) != lz->hash) {
    graph_free(*out);
    *out = NULL;
    return diag_error(c->d, "optimize: a rewrite's derived hash differs from its graph's"),
           TEQ_ERR_INTERNAL;
  }
  return rc;
}

/* The bests a window remembers besides its last (Ctx.runners). NasNet-A's
 * windows make at most 14 bests. */
enum { RUNNERS_MAX = 16 };

/* A new rewrite of c->parent costing cost: made the best if it is, and
 * queued within alpha of the best. It is ng, or (ng NULL) the one lz
 * describes, built now for a new best, else queued as lz until taken. False
 * to stop expanding (an error in c->rc, or the time is up). */
static bool settle(Ctx *c, Graph *ng, double cost, const Lazy *lz) {
  if (c->step < 0 && isnan(c->pet->m[-1 - c->step].info.cost_delta_us))
    c->pet->m[-1 - c->step].info.cost_delta_us = cost - c->parent->cost;
  bool best = cost < c->best.cost && cost < c->ceiling;
  bool keep = cost < c->o->alpha * (best ? cost : c->best.cost) && cost < c->ceiling;
  if (!best && !keep) {
    graph_free(ng);
    return now_s() < c->deadline;
  }
  /* Its instances are checked now if it is the best (the search's result
   * is always checked), else when it is taken to expand: most rewrites are
   * dropped above, and most of those queued are never taken. */
  int n_unchecked = 0;
  for (int k = 0; k < c->n_pending; k++) {
    bool holds = c->pending[k]->verdict != CHECK_BAD;
    if (holds && best && (c->rc = inst_holds(c, c->pending[k], &holds))) {
      graph_free(ng);
      return false;
    }
    if (!holds) {
      c->st->rejected_zp++;
      graph_free(ng);
      return now_s() < c->deadline;
    }
    n_unchecked += c->pending[k]->verdict == CHECK_NONE;
  }
  if (!ng && best) {
    if ((c->rc = build(c, c->g, lz, &ng))) return false;
    c->st->materialized++;
  }
  const Cand *p = c->parent;
  int added = c->steps ? c->n_steps : c->repeat;
  Cand nc = {.g = ng, .cost = cost, .n_hist = p->n_hist + added};
  nc.hist = malloc((size_t)nc.n_hist * sizeof *nc.hist);
  if (!ng) {
    int n_in = lz->in->g->n_inputs, n_out = lz->in->g->n_outputs;
    nc.io = malloc((size_t)(n_in + n_out) * sizeof *nc.io);
    if (nc.io) {
      memcpy(nc.io, lz->bind, (size_t)n_in * sizeof *nc.io);
      memcpy(nc.io + n_in, lz->replace, (size_t)n_out * sizeof *nc.io);
      nc.from = c->shared, nc.in = lz->in, nc.hash = lz->hash;
      c->shared->refs++;
    }
  }
  if (n_unchecked && (nc.unchecked = malloc((size_t)n_unchecked * sizeof *nc.unchecked)))
    for (int k = 0; k < c->n_pending; k++)
      if (c->pending[k]->verdict == CHECK_NONE) nc.unchecked[nc.n_unchecked++] = c->pending[k];
  if (!nc.hist || (!ng && !nc.io) || (n_unchecked && !nc.unchecked)) {
    cand_free(&nc);
    c->rc = TEQ_ERR_NOMEM;
    return false;
  }
  if (p->n_hist) memcpy(nc.hist, p->hist, (size_t)p->n_hist * sizeof *nc.hist);
  for (int k = 0; k < added; k++) nc.hist[p->n_hist + k] = c->steps ? c->steps[k] : c->step;
  if (best) {
    Cand copy = {.g = graph_copy(ng), .cost = cost, .n_hist = nc.n_hist};
    copy.hist = malloc((size_t)nc.n_hist * sizeof *copy.hist);
    if (!copy.g || !copy.hist) {
      cand_free(&copy);
      cand_free(&nc);
      c->rc = TEQ_ERR_NOMEM;
      return false;
    }
    memcpy(copy.hist, nc.hist, (size_t)nc.n_hist * sizeof *copy.hist);
    if (c->runners) {
      if (c->n_runners == RUNNERS_MAX) {
        cand_free(&c->runners[0]);
        memmove(c->runners, c->runners + 1, (RUNNERS_MAX - 1) * sizeof *c->runners);
        c->n_runners--;
      }
      c->runners[c->n_runners++] = c->best;
    } else {
      cand_free(&c->best);
    }
    c->best = copy;
    c->st->best_at = c->st->explored;
    c->st->best_s = now_s(); /* made relative to the search's start at its end */
  }
  if (keep) {
    Cand dropped;
    if ((c->rc = heap_push_bounded(&c->heap, nc, 8 * c->o->budget + 64, &dropped))) {
      cand_free(&nc);
      return false;
    }
    c->queued = dropped.hist != nc.hist; /* nc's own history: nc was not queued */
    c->st->kept += c->queued;
    cand_free(&dropped);
  } else {
    cand_free(&nc);
  }
  return now_s() < c->deadline;
}

/* A rewritten graph of c->parent (taken): dropped when seen before, else
 * costed and settled. False to stop expanding (an error in c->rc, or the
 * time is up). */
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
  if ((c->rc = price(c->cm, c->pr, ng, &cost, c->d))) {
    graph_free(ng);
    return false;
  }
  return settle(c, ng, cost, NULL);
}

static int check_mutant_derived(Ctx *c, const PetMut *pm, const PetSubprogram *sp,
                                uint64_t hash, double cost);

/* A rewrite of c->g whose hash delta.c derived (lz): dropped when seen
 * before, else priced (derived, or built where delta.c leaves the price to
 * the built graph) and settled. pm: the PET mutant it splices in (NULL
 * for a rule's), built and post-optimized too under check_derived. */
static bool settle_derived(Ctx *c, const Lazy *lz, const PetMut *pm,
                           const PetSubprogram *sp) {
  if (keyset_get(&c->seen, lz->hash)) {
    c->st->duplicates++;
    return true;
  }
  if ((c->rc = keyset_put(&c->seen, lz->hash, 1))) return false;
  double cost;
  int r = opt_delta_cost(c->base, &cost, c->d);
  if (r < 0) return c->rc = r, false;
  Graph *ng = NULL;
  if (r == OPT_DELTA_BUILD) {
    if ((c->rc = build(c, c->g, lz, &ng))) return false;
    c->st->materialized++;
    if ((c->rc = price(c->cm, c->pr, ng, &cost, c->d))) {
      graph_free(ng);
      return false;
    }
  }
  if (pm && c->o->check_derived && (c->rc = check_mutant_derived(c, pm, sp, lz->hash, cost))) {
    graph_free(ng);
    return false;
  }
  return settle(c, ng, cost, lz);
}

/* The rewrite of c->g by instance in at match m: derived (delta.c) and
 * built only if the search keeps it; what delta.c leaves to the built
 * graph is built and offered as every rewrite once was. */
static bool offer_derived(Ctx *c, OptInst *in, const OptMatch *m) {
  TensorRef bind[OPT_MAX_SIDE], replace[OPT_MAX_SIDE];
  match_tensors(c, m, bind, replace);
  Lazy lz = {.in = in, .bind = bind, .replace = replace};
  c->queued = false;
  c->cycle = false;
  OptDelta v = opt_delta_hash(c->base, in, bind, replace, &lz.hash);
  if (v == OPT_DELTA_CYCLE) {
    c->st->rejected_cycle++;
    c->cycle = true;
    return true;
  }
  if (v == OPT_DELTA_BUILD) {
    Graph *ng = NULL;
    Diag quiet;
    diag_init(&quiet);
    c->rc = opt_splice(c->g, in->g, bind, replace, &ng, &quiet);
    diag_fini(&quiet);
    if (c->rc == TEQ_ERR_INPUT) {
      c->st->rejected_cycle++;
      c->cycle = true;
      c->rc = TEQ_OK;
      return true;
    }
    if (c->rc) return false;
    c->st->generated++;
    c->st->materialized++;
    return offer(c, ng);
  }
  c->st->generated++;
  return settle_derived(c, &lz, NULL, NULL);
}

/* opt_apply_rule_priced's step: the rewrite derived as the search derives
 * it, then built, and both handed to the caller; a rewrite delta.c calls
 * cyclic must be one opt_splice refuses. */
static bool priced_match(Ctx *c, OptInst *in, const OptMatch *m) {
  TensorRef bind[OPT_MAX_SIDE], replace[OPT_MAX_SIDE];
  match_tensors(c, m, bind, replace);
  uint64_t hash = 0;
  OptDelta v = opt_delta_hash(c->base, in, bind, replace, &hash);
  double cost = 0;
  if (v == OPT_DELTA_OK) {
    int r = opt_delta_cost(c->base, &cost, c->d);
    if (r < 0) return c->rc = r, false;
    if (r == OPT_DELTA_BUILD) v = OPT_DELTA_BUILD;
  }
  Graph *ng = NULL;
  Diag quiet;
  diag_init(&quiet);
  int rc = opt_splice(c->g, in->g, bind, replace, &ng, &quiet);
  diag_fini(&quiet);
  if (rc == TEQ_ERR_INPUT) {
    c->st->rejected_cycle++;
    if (v == OPT_DELTA_OK) c->rc = diag_error(c->d, "optimize: delta.c missed a cycle");
    return c->rc == TEQ_OK;
  }
  if (rc) return c->rc = rc, false;
  if (v == OPT_DELTA_CYCLE) {
    graph_free(ng);
    c->rc = diag_error(c->d, "optimize: delta.c found a cycle opt_splice did not");
    return false;
  }
  c->st->generated++;
  if (v == OPT_DELTA_BUILD) {
    hash = graph_hash(ng, NULL);
    if ((c->rc = price(c->cm, c->pr, ng, &cost, c->d))) {
      graph_free(ng);
      return false;
    }
  }
  if (!c->priced(ng, cost, hash, v == OPT_DELTA_OK, c->take_ctx)) graph_free(ng);
  return true;
}

static int add_site(Ctx *c, const OptMatch *m, OptInst *in) {
  if (c->n_sites == c->cap_sites) {
    int cap = c->cap_sites ? 2 * c->cap_sites : 64;
    Site *s = realloc(c->sites, (size_t)cap * sizeof *s);
    if (!s) return TEQ_ERR_NOMEM;
    c->sites = s, c->cap_sites = cap;
  }
  c->sites[c->n_sites] = (Site){.rule = c->rule, .seq = c->n_sites, .m = *m, .in = in};
  c->n_sites++;
  return TEQ_OK;
}

static bool on_match(const OptMatch *m, void *ctx) {
  Ctx *c = ctx;
  if (c->take) { /* opt_apply_rule */
    Graph *ng = NULL;
    c->rc = rewrite(c, m, &ng);
    if (c->rc) return false;
    if (!ng) return true;
    c->st->generated++;
    if (!c->take(ng, c->take_ctx)) graph_free(ng);
    return true;
  }
  /* The search: each instance once per rule and shapes, and the rewrite
   * derived from c->g rather than built. */
  OptInst *in;
  if ((c->rc = opt_inst_get(c->memo, c->rs, c->rule, c->g, m, &in))) return false;
  if (!in) {
    c->st->rejected_shape++;
    return true;
  }
  if ((c->rc = opt_inst_prepare(in))) return false;
  if (c->sites_only) /* each alone is not offered; splice_sites refuses a cycle they make */
    return (c->rc = add_site(c, m, in)) == TEQ_OK;
  if (c->priced) { /* every rewrite is handed over: each checked first */
    bool holds;
    if ((c->rc = inst_holds(c, in, &holds))) return false;
    if (!holds) c->st->rejected_zp++;
    return holds ? priced_match(c, in, m) : true;
  }
  c->step = c->rule;
  c->pending = &in, c->n_pending = 1;
  bool go = offer_derived(c, in, m);
  c->n_pending = 0;
  if (go && !c->cycle && !c->o->one_site && (c->rc = add_site(c, m, in))) return false;
  return go;
}

/* What the regions a correction recomputes look like in a report:
 * "2 regions, 896 elements: out0 [0:1, 0:64, 0:28, 13:15] ...". */
static void regions_text(const PetRegions *rg, char *buf, size_t size) {
  if (rg->n == 0) {
    snprintf(buf, size, "none (exact)");
    return;
  }
  int64_t elems = pet_regions_elements(rg);
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

/* Elements of g's largest tensor. */
static double largest_tensor(const Graph *g) {
  double most = 0;
  for (int id = 0; id < g->n_nodes; id++)
    for (int j = 0; j < g->nodes[id].n_out; j++)
      most = fmax(most, (double)shape_numel(&g->nodes[id].out[j]));
  return most;
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
  if (sp->flops > c->o->pet_max_flops || largest_tensor(sp->graph) > c->o->pet_max_elements) {
    c->st->pet_too_large++;
    return e;
  }
  c->st->pet_subprograms++;
  PetMutateOptions mo = {.depth = c->o->pet_depth, .max_mutants = c->o->pet_mutants,
                         .seed = c->o->seed, .trials = c->o->pet_trials, .jobs = c->o->jobs};
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
    OptInst *in = NULL;
    if ((rc = opt_inst_wrap(fixed, &in)) == TEQ_OK) rc = opt_inst_prepare(in);
    if (rc) {
      opt_inst_free(in);
      c->rc = rc;
      pet_regions_fini(&rg);
      break;
    }
    PetMut *pm = &pc->m[pc->n_m++];
    *pm = (PetMut){.in = in};
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

/* Whether PET's post-optimization leaves c->g as it is. */
static int post_leaves_alone(Ctx *c, bool *alone) {
  Graph *h = graph_copy(c->g);
  PetPostStats post;
  int rc = h ? pet_post_optimize_cached(&h, c->pet->post, &post, c->d) : TEQ_ERR_NOMEM;
  *alone = rc == TEQ_OK && pet_post_rewrites(&post) == 0;
  graph_free(h);
  return rc;
}

/* Mutant pm spliced into c->g in place of subprogram sp, post-optimized
 * and merged: the candidate as built. TEQ_ERR_INPUT (no message) for a
 * cycle through the subprogram's outside. */
static int splice_mutant(Ctx *c, const PetMut *pm, const PetSubprogram *sp, Graph **out,
                         PetPostStats *post) {
  Graph *ng = NULL;
  Diag quiet;
  diag_init(&quiet);
  int rc = opt_splice(c->g, pm->in->g, sp->in, sp->out, &ng, &quiet);
  diag_fini(&quiet);
  if (rc) return rc;
  rc = pet_post_optimize_cached(&ng, c->pet->post, post, c->d);
  /* Moving layouts may leave two nodes computing one value; merged, the
   * candidate's rewrites are derived (delta.c) rather than built. */
  if (rc == TEQ_OK && graph_merge_duplicates(ng) < 0) rc = TEQ_ERR_NOMEM;
  if (rc) graph_free(ng);
  else *out = ng;
  return rc;
}

/* Mutant pm of subprogram sp spliced in and offered: built, as any
 * candidate whose post-optimization may rewrite something. */
static bool offer_mutant_built(Ctx *c, const PetMut *pm, const PetSubprogram *sp) {
  Graph *ng = NULL;
  PetPostStats post;
  int rc = splice_mutant(c, pm, sp, &ng, &post);
  c->queued = false;
  if (rc == TEQ_ERR_INPUT) {
    c->st->rejected_cycle++;
    return true;
  }
  if (rc) return c->rc = rc, false;
  c->st->pet_post_moved += post.moved, c->st->pet_post_removed += post.removed;
  c->st->pet_post_fused += post.fused, c->st->pet_post_hoisted += post.hoisted;
  c->st->generated++, c->st->pet_built++;
  return offer(c, ng);
}

/* check_derived: the candidate derived with hash and cost, built as
 * offer_mutant_built builds it, must be the same graph at the same price,
 * and post-optimization must have found nothing. */
static int check_mutant_derived(Ctx *c, const PetMut *pm, const PetSubprogram *sp,
                                uint64_t hash, double cost) {
  Graph *ng = NULL;
  PetPostStats post = {0};
  double built = 0;
  int rc = splice_mutant(c, pm, sp, &ng, &post);
  if (rc == TEQ_ERR_INPUT)
    return diag_error(c->d, "optimize: PET candidate '%s' derived acyclic has a cycle when "
                      "built", pm->info.desc), TEQ_ERR_INTERNAL;
  if (rc == TEQ_OK) rc = price(c->cm, c->pr, ng, &built, c->d);
  if (rc == TEQ_OK && (graph_hash(ng, NULL) != hash || built != cost ||
                       pet_post_rewrites(&post))) {
    diag_error(c->d, "optimize: PET candidate '%s' derived unbuilt differs when built "
               "(cost %.17g against %.17g, %lld post-optimization rewrites)", pm->info.desc,
               cost, built, (long long)pet_post_rewrites(&post));
    rc = TEQ_ERR_INTERNAL;
  }
  graph_free(ng);
  return rc;
}

/* Mutant pm of subprogram sp offered as offer_derived offers a rule's
 * rewrite: hashed and priced from c->base without building it, for a
 * splice PET's post-optimization is sure to leave alone (c->g itself
 * left alone, and pet_post_splice_quiet). What delta.c leaves to the
 * built graph goes the built way. */
static bool offer_mutant(Ctx *c, const PetMut *pm, const PetSubprogram *sp) {
  Lazy lz = {.in = pm->in, .bind = sp->in, .replace = sp->out};
  c->queued = false;
  OptDelta v = opt_delta_hash(c->base, pm->in, sp->in, sp->out, &lz.hash);
  if (v == OPT_DELTA_CYCLE) {
    c->st->rejected_cycle++;
    return true;
  }
  if (v == OPT_DELTA_BUILD) return offer_mutant_built(c, pm, sp);
  c->st->generated++, c->st->pet_built++, c->st->pet_derived++;
  return settle_derived(c, &lz, pm, sp);
}

/* Every corrected mutant of every subprogram of c->g, spliced in. Most
 * are derived rather than built, as rules' rewrites are: of NasNet-A's,
 * post-optimization rewrites one in thirty. */
static int expand_pet(Ctx *c) {
  double t0 = now_s();
  PetSplit sp;
  Diag quiet;
  diag_init(&quiet);
  int rc = pet_split(c->g, NULL, &sp, &quiet);
  int derive = c->base ? -1 : 0; /* -1: not known yet (asked at the first mutant) */
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
      const PetMut *pm = &c->pet->m[k];
      c->step = -1 - k;
      if (derive < 0) {
        bool alone = false;
        if ((rc = post_leaves_alone(c, &alone))) break;
        derive = alone;
      }
      bool go = derive && pet_post_splice_quiet(c->g, pm->in->g, sp.v[i].in, sp.v[i].out)
                    ? offer_mutant(c, pm, &sp.v[i])
                    : offer_mutant_built(c, pm, &sp.v[i]);
      c->st->pet_kept += c->queued;
      rc = c->rc;
      if (!go) break;
    }
  }
  pet_split_fini(&sp);
  diag_fini(&quiet);
  return rc;
}

/* Most rules applied at all their sites per expansion: a bound on the
 * graphs each expansion builds (about 16 rules qualify per expansion in
 * the suite's models). */
enum { SITES_MAX_RULES = 64 };

static int by_rule(const void *a, const void *b) {
  const Site *x = a, *y = b;
  if (x->rule != y->rule) return (x->rule > y->rule) - (x->rule < y->rule);
  return (x->seq > y->seq) - (x->seq < y->seq);
}

/* g with the n instances in[k] spliced in at once, each reading bind[k]
 * and computing what replace[k] names; *out NULL when the sites together
 * make a cycle (each alone does not). */
static int splice_sites(Ctx *c, const Graph *g, int n, OptInst *const *in,
                        TensorRef (*bind)[OPT_MAX_SIDE], TensorRef (*replace)[OPT_MAX_SIDE],
                        Graph **out) {
  *out = NULL;
  const Graph **inst = malloc((size_t)n * sizeof *inst);
  const TensorRef **binds = malloc((size_t)n * sizeof *binds);
  const TensorRef **replaces = malloc((size_t)n * sizeof *replaces);
  int rc = inst && binds && replaces ? TEQ_OK : TEQ_ERR_NOMEM;
  for (int k = 0; k < n && rc == TEQ_OK; k++)
    inst[k] = in[k]->g, binds[k] = bind[k], replaces[k] = replace[k];
  if (rc == TEQ_OK) {
    Diag quiet;
    diag_init(&quiet);
    rc = opt_splice_many(g, n, inst, binds, replaces, out, &quiet);
    diag_fini(&quiet);
    if (rc == TEQ_ERR_INPUT) {
      c->st->rejected_cycle++;
      rc = TEQ_OK;
    }
  }
  free(inst), free(binds), free(replaces);
  return rc;
}

/* Further rounds of a merge rule after its first round at all sites:
 * what one round merged may merge again. Eight products of one input merge
 * in pairs, the pairs in pairs, then the two halves: three rounds, and on
 * an H100 a product 1024 wide costs more than the two 512 wide it replaces
 * while one 4096 wide costs a fifth of the eight (NasRNN's cell). A round
 * dearer than the graph before it is a valley the greedy queue does not
 * cross, so the rounds are applied without pricing in between, and the
 * graph after each is offered as one candidate of c->parent. Only rules
 * with two or more source outputs (merges) go on: a rule of one output
 * applied again to its own result only grows (relu into transposes).
 *
 * After each round the rules that only remove operators (their target is
 * their variables: concat(split(y)) = y, transpose(transpose(x)) = x) are
 * applied wherever they match: a merge often leaves such a pair (the adds
 * of two split products merge into a split of the add of the concat of
 * the one's halves), and a removal never costs more, since every tensor
 * downstream keeps its shape. */
enum { MERGE_MAX_ROUNDS = 4, ELIMINATE_MAX_PASSES = 8 };

/* The sites one round applies (matches of rule c->rule in g that share
 * no node, each acyclic alone), and every instance and rule applied so
 * far, for the Z_p checks and the history of the graph offered. */
typedef struct Round {
  Ctx *c;
  const Graph *g;
  OptBase *base; /* for delta.c's cycle check; NULL: removals, never cyclic */
  const bool *weights;
  bool *used;
  int n, cap;
  OptInst **in;
  int32_t *rule;
  TensorRef (*bind)[OPT_MAX_SIDE], (*replace)[OPT_MAX_SIDE];
} Round;

static void round_fini(Round *r) {
  free(r->in), free(r->rule), free(r->bind), free(r->replace);
}

static int round_reserve(Round *r, int more) {
  if (r->n + more <= r->cap) return TEQ_OK;
  int cap = r->cap ? 2 * r->cap : 16;
  while (cap < r->n + more) cap *= 2;
  OptInst **a = realloc(r->in, (size_t)cap * sizeof *a);
  if (a) r->in = a;
  int32_t *k = realloc(r->rule, (size_t)cap * sizeof *k);
  if (k) r->rule = k;
  TensorRef(*b)[OPT_MAX_SIDE] = realloc(r->bind, (size_t)cap * sizeof *b);
  if (b) r->bind = b;
  TensorRef(*e)[OPT_MAX_SIDE] = realloc(r->replace, (size_t)cap * sizeof *e);
  if (e) r->replace = e;
  if (!a || !k || !b || !e) return TEQ_ERR_NOMEM;
  r->cap = cap;
  return TEQ_OK;
}

static bool round_match(const OptMatch *m, void *ctx) {
  Round *r = ctx;
  Ctx *c = r->c;
  const OptRule *rule = &c->rs->r[c->rule];
  for (int p = 0; p < rule->src->n_nodes; p++)
    if (m->node[p] >= 0 && r->used[m->node[p]]) return true;
  OptInst *in;
  if ((c->rc = opt_inst_get(c->memo, c->rs, c->rule, r->g, m, &in))) return false;
  if (!in) return true;
  if ((c->rc = opt_inst_prepare(in)) || (c->rc = round_reserve(r, 1))) return false;
  match_tensors(c, m, r->bind[r->n], r->replace[r->n]);
  uint64_t hash;
  if (r->base &&
      opt_delta_hash(r->base, in, r->bind[r->n], r->replace[r->n], &hash) == OPT_DELTA_CYCLE)
    return true;
  for (int p = 0; p < rule->src->n_nodes; p++)
    if (m->node[p] >= 0) r->used[m->node[p]] = true;
  r->rule[r->n] = c->rule;
  r->in[r->n++] = in;
  return true;
}

/* Whether a match of rule may start at node id of g (want: its root's
 * signature). */
static bool roots_at(const Graph *g, int id, const OptRule *rule, OptRootSig want) {
  return g->nodes[id].kind == rule->root && opt_root_fits(want, opt_node_sig(g, id));
}

/* Rule c->rule applied at all its sites in g: *out the rewritten graph,
 * NULL when it has no site (or the sites together make a cycle). cycles:
 * check each site alone for one (a removal cannot make one). */
static int apply_round(Ctx *c, const Graph *g, Round *r, bool cycles, Graph **out) {
  *out = NULL;
  const OptRule *rule = &c->rs->r[c->rule];
  OptRootSig want = opt_root_sig(rule->src);
  bool any = false; /* a node a match may start from, before anything is built */
  for (int id = 0; id < g->n_nodes && !any; id++) any = roots_at(g, id, rule, want);
  if (!any) return TEQ_OK;
  OptUses u;
  int rc = opt_uses_build(g, &u);
  if (rc) return rc;
  r->g = g;
  r->base = NULL, r->weights = NULL;
  if (cycles && (rc = opt_base_new(c->pr, g, &u, &r->base, c->d)) == TEQ_OK)
    r->weights = opt_base_weights(r->base);
  r->used = rc ? NULL : calloc((size_t)g->n_nodes + 1, sizeof *r->used);
  if (rc == TEQ_OK && !r->used) rc = TEQ_ERR_NOMEM;
  int first = r->n;
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK && c->rc == TEQ_OK; id++)
    if (!(r->weights && r->weights[id]) && roots_at(g, id, rule, want))
      opt_match_at(rule, g, &u, id, c->o->max_matches, round_match, r);
  if (rc == TEQ_OK) rc = c->rc;
  int n = r->n - first;
  if (rc == TEQ_OK && n > 0)
    rc = splice_sites(c, g, n, r->in + first, r->bind + first, r->replace + first, out);
  if (!*out) r->n = first;
  free(r->used);
  r->used = NULL;
  opt_base_free(r->base);
  r->base = NULL;
  opt_uses_fini(&u);
  return rc;
}

/* The removals applied to *g (replaced when one applies) until none
 * does. */
static int eliminate(Ctx *c, Graph **g, Round *r) {
  int rule = c->rule, rc = TEQ_OK;
  for (int pass = 0; pass < ELIMINATE_MAX_PASSES && rc == TEQ_OK; pass++) {
    bool changed = false;
    for (int k = 0; k < c->rs->n_removals && rc == TEQ_OK; k++) {
      c->rule = c->rs->removals[k];
      Graph *next = NULL;
      if ((rc = apply_round(c, *g, r, false, &next)) || !next) continue;
      graph_free(*g);
      *g = next;
      changed = true;
    }
    if (!changed) break;
  }
  c->rule = rule;
  return rc;
}

/* Offers a copy of g, made from c->parent by the rules and instances r
 * holds: false to stop expanding. */
static bool offer_rounds(Ctx *c, const Graph *g, const Round *r) {
  Graph *copy = graph_copy(g);
  if (!copy) return c->rc = TEQ_ERR_NOMEM, false;
  c->st->generated++;
  c->st->materialized++;
  c->st->all_sites++;
  c->steps = r->rule, c->n_steps = r->n, c->ceiling = c->parent->cost;
  c->pending = r->in, c->n_pending = r->n;
  bool go = offer(c, copy);
  c->steps = NULL, c->n_steps = 0, c->ceiling = INFINITY, c->n_pending = 0;
  return go;
}

/* After rule c->rule's first round at all sites made g (taken) from
 * c->parent with the n instances held: the removals, then (for a merge)
 * its later rounds, each graph offered. */
static int more_rounds(Ctx *c, Graph *g, OptInst *const *held, int n) {
  Round r = {.c = c};
  int rc = round_reserve(&r, n);
  if (rc == TEQ_OK) {
    for (int k = 0; k < n; k++) r.in[k] = held[k], r.rule[k] = c->rule;
    r.n = n;
  }
  bool merge = c->rs->r[c->rule].src->n_outputs >= 2;
  int before = r.n;
  if (rc == TEQ_OK) rc = eliminate(c, &g, &r);
  if (rc == TEQ_OK && r.n > before && !offer_rounds(c, g, &r)) rc = c->rc;
  for (int round = 2; merge && round <= MERGE_MAX_ROUNDS && rc == TEQ_OK &&
                      now_s() < c->deadline;
       round++) {
    Graph *next = NULL;
    if ((rc = apply_round(c, g, &r, true, &next)) || !next) break;
    graph_free(g);
    g = next;
    if ((rc = eliminate(c, &g, &r))) break;
    if (!offer_rounds(c, g, &r)) rc = c->rc;
    if (rc || now_s() >= c->deadline) break;
  }
  graph_free(g);
  round_fini(&r);
  return rc;
}

/* Each rule that rewrites c->g at two or more places that share no node,
 * applied at all of them at once: one candidate, kept only if it costs
 * less than c->g. One site at a time, the search must pass through every
 * intermediate graph, and some are dearer: NasRNN's x W_i + h U_i ->
 * concat(x, h) [W_i; U_i] costs a concat the first time and saves once
 * the eight share it, but the cheaper merges of the x W_i alone fill the
 * queue first and then outprice it (TASO's search is greedy here; Tensat's
 * e-graph applies every rule everywhere each iteration). A rule that
 * gains at some site alone is applied everywhere too: that its one-site
 * rewrites are cheaper does not mean the queue takes them before others
 * outprice the path (the recurrent cell of test_every_site, priced by the
 * analytic model, is such a case). */
static int expand_sites(Ctx *c) {
  if (c->n_sites < 2) return TEQ_OK;
  /* Grouped by rule, each group in the order its matches were found. */
  qsort(c->sites, (size_t)c->n_sites, sizeof *c->sites, by_rule);
  size_t most = (size_t)c->n_sites;
  bool *used = calloc((size_t)c->g->n_nodes + 1, sizeof *used);
  OptInst **held = malloc(most * sizeof *held);
  TensorRef(*bind)[OPT_MAX_SIDE] = malloc(most * sizeof *bind);
  TensorRef(*replace)[OPT_MAX_SIDE] = malloc(most * sizeof *replace);
  int rc = used && held && bind && replace ? TEQ_OK : TEQ_ERR_NOMEM;
  int rules = 0;
  for (int a = 0, b; a < c->n_sites && rc == TEQ_OK && rules < SITES_MAX_RULES; a = b) {
    for (b = a + 1; b < c->n_sites && c->sites[b].rule == c->sites[a].rule; b++) {}
    if (b - a < 2) continue;
    const OptRule *rule = &c->rs->r[c->sites[a].rule];
    int n = 0;
    memset(used, 0, (size_t)c->g->n_nodes * sizeof *used);
    c->rule = c->sites[a].rule;
    for (int k = a; k < b; k++) {
      const OptMatch *m = &c->sites[k].m;
      bool free_site = true;
      for (int p = 0; p < rule->src->n_nodes && free_site; p++)
        free_site = m->node[p] < 0 || !used[m->node[p]];
      if (!free_site) continue;
      for (int p = 0; p < rule->src->n_nodes; p++)
        if (m->node[p] >= 0) used[m->node[p]] = true;
      match_tensors(c, m, bind[n], replace[n]);
      held[n++] = c->sites[k].in;
    }
    if (n < 2) continue;
    rules++;
    Graph *ng = NULL;
    if ((rc = splice_sites(c, c->g, n, held, bind, replace, &ng))) break;
    if (!ng) continue; /* each alone is acyclic, together they are not */
    c->st->generated++;
    c->st->materialized++;
    c->st->all_sites++;
    /* A merge's later rounds start from this round's graph, offered
     * (and maybe freed) next. */
    bool merge = rule->src->n_outputs >= 2;
    Graph *again = merge ? graph_copy(ng) : NULL;
    if (merge && !again) {
      graph_free(ng);
      rc = TEQ_ERR_NOMEM;
      break;
    }
    c->step = c->rule, c->repeat = n, c->ceiling = c->parent->cost;
    c->pending = held, c->n_pending = n;
    bool go = offer(c, ng);
    c->repeat = 1, c->ceiling = INFINITY, c->n_pending = 0;
    rc = c->rc;
    if (go && rc == TEQ_OK && again) {
      rc = more_rounds(c, again, held, n);
      go = rc == TEQ_OK && now_s() < c->deadline;
    } else {
      graph_free(again);
    }
    if (!go) break;
  }
  free(used), free(held), free(bind), free(replace);
  return rc;
}

/* Every rule at every match in c->g, then every rule at all its matches
 * at once. */
static int expand(Ctx *c) {
  c->n_sites = 0;
  OptUses u;
  int rc = opt_uses_build(c->g, &u);
  if (rc) return rc;
  rc = opt_base_new(c->pr, c->g, &u, &c->base, c->d);
  /* Nodes computed from weights alone are precomputed before export, so
   * rewriting them gains nothing; they are matched only inside rules rooted
   * elsewhere. */
  const bool *weights = rc ? NULL : opt_base_weights(c->base);
  for (int id = 0; id < c->g->n_nodes && rc == TEQ_OK; id++) {
    OpKind k = c->g->nodes[id].kind;
    if (weights[id]) continue;
    OptRootSig sig = opt_node_sig(c->g, id);
    uint64_t key[OPT_ROOT_MASKS];
    for (int m = 0; m < c->rs->n_root_masks[k]; m++)
      key[m] = opt_params_key(&c->g->nodes[id], c->rs->root_masks[k][m]);
    for (int j = 0; j < c->rs->n_by_root[k] && rc == TEQ_OK; j++) {
      /* Nearly every rule fails at the root at once, in brief; the clock
       * is read after those that matched (each candidate reads it too). */
      const OptRootEntry *e = &c->rs->by_root[k][j];
      if (!opt_root_fits(e->sig, sig) || (e->mask >= 0 && e->pkey != key[e->mask])) continue;
      c->rule = e->rule;
      if (opt_match_at(&c->rs->r[c->rule], c->g, &u, id, c->o->max_matches, on_match, c) == 0)
        continue;
      rc = c->rc;
      if (now_s() >= c->deadline) break;
    }
  }
  if (rc == TEQ_OK && !c->o->one_site && now_s() < c->deadline) rc = expand_sites(c);
  if (rc == TEQ_OK && c->pet && now_s() < c->deadline) rc = expand_pet(c);
  opt_base_free(c->base);
  c->base = NULL;
  opt_uses_fini(&u);
  return rc;
}

/* Searches g alone; *best_out receives the best candidate, and runners
 * (optional, room for RUNNERS_MAX) the bests before it, oldest first,
 * *n_runners of them. sites_only: each expansion applies rules at all
 * their sites only (search_whole). */
static int search_graph(const Graph *g, const OptRules *rs, CostModel *cm, const OptOptions *o,
                        OptPricer *pr, OptInstMemo *memo, ExecInputs *inputs, PetCache *pet,
                        bool sites_only, double deadline, OptStats *st, Cand *best_out,
                        Cand *runners, int *n_runners, Diag *d) {
  Ctx c = {.runners = runners, .rs = rs, .cm = cm, .o = o, .st = st, .d = d, .pet = pet,
           .deadline = deadline, .pr = pr, .memo = memo, .inputs = inputs, .repeat = 1,
           .ceiling = INFINITY, .sites_only = sites_only};
  double cost;
  int rc = price(cm, pr, g, &cost, d);
  if (rc) return rc;
  Cand start = {.g = graph_copy(g), .cost = cost};
  c.best = (Cand){.g = graph_copy(g), .cost = cost};
  if (!start.g || !c.best.g) rc = TEQ_ERR_NOMEM;
  if (!rc) rc = keyset_put(&c.seen, graph_hash(g, NULL), 1);
  if (!rc) rc = heap_push(&c.heap, start);
  else cand_free(&start);
  int improved = 0; /* expansions when the best last improved */
  for (int expanded = 0; rc == TEQ_OK && c.heap.n > 0 && expanded < o->budget; expanded++) {
    if (now_s() >= deadline) {
      st->stopped_by_time = true;
      break;
    }
    if (o->patience > 0 && expanded - improved >= o->patience) break;
    double best_cost = c.best.cost;
    Cand cur = heap_pop(&c.heap);
    bool holds = true;
    for (int k = 0; rc == TEQ_OK && holds && k < cur.n_unchecked; k++)
      rc = inst_holds(&c, cur.unchecked[k], &holds);
    if (rc != TEQ_OK || !holds) {
      cand_free(&cur);
      if (rc) break;
      st->rejected_zp++; /* refused: taking it spent nothing of the budget */
      expanded--;
      continue;
    }
    st->explored++;
    if (!cur.g) { /* queued unbuilt: build it from the graph it rewrites */
      Lazy lz = {.in = cur.in, .bind = cur.io, .replace = cur.io + cur.in->g->n_inputs,
                 .hash = cur.hash};
      rc = build(&c, cur.from->g, &lz, &cur.g);
      st->materialized += rc == TEQ_OK;
      shared_drop(cur.from);
      free(cur.io);
      cur.from = NULL, cur.io = NULL;
    }
    c.shared = rc ? NULL : malloc(sizeof *c.shared);
    if (!rc && !c.shared) rc = TEQ_ERR_NOMEM;
    if (rc) {
      cand_free(&cur);
      break;
    }
    *c.shared = (Shared){.g = cur.g, .refs = 1};
    cur.g = NULL; /* c.shared's now */
    c.parent = &cur;
    c.g = c.shared->g;
    rc = expand(&c);
    shared_drop(c.shared);
    c.shared = NULL;
    cand_free(&cur);
    if (c.best.cost < best_cost) improved = expanded + 1;
  }
  while (c.heap.n > 0) {
    Cand x = heap_pop(&c.heap);
    cand_free(&x);
  }
  free(c.heap.a);
  free(c.sites);
  keyset_fini(&c.seen);
  if (n_runners) *n_runners = c.n_runners;
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

int opt_apply_rule_priced(const OptRules *rs, int i, const Graph *g, CostModel *cm,
                          const OptOptions *opt, OptPricedFn fn, void *ctx, OptStats *st,
                          Diag *d) {
  bool any = false;
  for (int id = 0; id < g->n_nodes && !any; id++) any = g->nodes[id].kind == rs->r[i].root;
  if (!any) return TEQ_OK;
  OptOptions o = opt ? *opt : OPT_DEFAULTS;
  Ctx c = {.rs = rs, .o = &o, .st = st, .d = d, .deadline = INFINITY,
           .rule = i, .g = g, .cm = cm, .priced = fn, .take_ctx = ctx};
  OptUses u = {0};
  c.memo = opt_inst_memo_new();
  int rc = c.memo ? opt_pricer_new(cm, &c.pr) : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = opt_uses_build(g, &u);
  if (rc == TEQ_OK) rc = opt_base_new(c.pr, g, &u, &c.base, d);
  for (int id = 0; id < g->n_nodes && rc == TEQ_OK; id++)
    if (g->nodes[id].kind == rs->r[i].root) {
      opt_match_at(&rs->r[i], g, &u, id, o.max_matches, on_match, &c);
      rc = c.rc;
    }
  opt_base_free(c.base);
  opt_uses_fini(&u);
  opt_pricer_free(c.pr);
  opt_inst_memo_free(c.memo);
  return rc;
}

/* ---- windows ---- */

/* The Z_p checks' random inputs kept for the whole search: the instances
 * checked share shapes (NasRNN's merges and layouts are over the same
 * [512, 2048] and [512, 4096] weights), and filling a fresh input, its
 * pages faulted in, could cost more than running the check. */
#define KEPT_INPUT_BYTES ((size_t)128 << 20)

enum { WINDOW_MAX_IN = 16, WINDOW_MAX_OUT = 8 };

/* Whether the search may move node id into a window. A node wider than a
 * window's bookkeeping (a concat of many corrected regions) stays where it
 * is, as an opaque node does: the window reads it as an input. */
static bool movable(const Node *n) {
  return n->kind != OP_INPUT && n->kind != OP_CONST && n->kind != OP_OPAQUE &&
         n->n_in <= WINDOW_MAX_IN && n->n_out <= WINDOW_MAX_OUT;
}

/* Where a window ending by hi (not before lo) is best cut: the position c
 * in [lo, hi] where the fewest tensors made before c (by the m movable
 * nodes of order) are read at or after it, the last such on ties. A cut
 * there splits the fewest rewrites between two windows: between the steps
 * of an RNN one state crosses, in the middle of one many products do. */
static int narrow_cut(const Graph *g, const int32_t *order, int m, int lo, int hi) {
  int n = g->n_nodes;
  int32_t *off = NULL, *uses = graph_use_counts(g, &off);
  int32_t *pos = malloc(((size_t)n + 1) * sizeof *pos);
  int32_t *last = uses ? malloc(((size_t)off[n] + 1) * sizeof *last) : NULL; /* per tensor */
  int32_t *live = calloc((size_t)m + 2, sizeof *live);
  int best = hi;
  if (!pos || !last || !live) goto done; /* no memory: the plain cut */
  for (int i = 0; i < n; i++) pos[i] = -1;
  for (int k = 0; k < m; k++) pos[order[k]] = k;
  for (int32_t t = 0; t < off[n]; t++) last[t] = -1;
  for (int k = 0; k < m; k++) {
    const Node *c = &g->nodes[order[k]];
    for (int j = 0; j < c->n_in; j++) {
      int32_t t = off[c->in[j].node] + c->in[j].out;
      if (last[t] < k) last[t] = k;
    }
  }
  for (int i = 0; i < n; i++) {
    if (pos[i] < 0) continue;
    for (int32_t t = off[i]; t < off[i + 1]; t++)
      if (last[t] > pos[i]) live[pos[i] + 1]++, live[last[t] + 1]--;
  }
  int run = 0, fewest = INT32_MAX;
  for (int c = 0; c <= hi; c++) {
    run += live[c];
    if (c >= lo && run <= fewest) fewest = run, best = c;
  }
done:
  free(uses);
  free(off);
  free(pos);
  free(last);
  free(live);
  return best;
}

/* Cuts the movable nodes at positions [lo, hi) of order out of g as a
 * graph of its own; ext_in receives the tensor each of its inputs reads,
 * ext_out the tensor each of its outputs replaces. */
static int cut_window(const Graph *g, const int32_t *mov, int lo, int hi, Graph **out,
                      TensorRef **ext_in, TensorRef **ext_out, Diag *d) {
  int n = g->n_nodes;
  int32_t *off = NULL, *uses = graph_use_counts(g, &off); /* off: (node, out) -> tensor */
  size_t n_t = uses ? (size_t)off[n] : 0;
  int32_t *map = malloc((size_t)n * sizeof *map);            /* node -> window node */
  int32_t *in_of = malloc((n_t + 1) * sizeof *in_of);        /* tensor -> window input */
  TensorRef *xi = malloc((n_t + 1) * sizeof *xi), *xo = malloc((n_t + 1) * sizeof *xo);
  Graph *w = graph_new();
  int rc = uses && map && in_of && xi && xo && w ? TEQ_OK : TEQ_ERR_NOMEM;
  int n_xi = 0;
  if (rc == TEQ_OK) {
    for (int i = 0; i < n; i++) map[i] = -1;
    for (size_t i = 0; i < n_t; i++) in_of[i] = -1;
  }
  for (int k = lo; k < hi && rc == TEQ_OK; k++) {
    const Node *nd = &g->nodes[mov[k]];
    TensorRef in[WINDOW_MAX_IN];
    for (int j = 0; j < nd->n_in && rc == TEQ_OK; j++) {
      TensorRef r = nd->in[j];
      if (map[r.node] >= 0) {
        in[j] = (TensorRef){map[r.node], r.out};
        continue;
      }
      int *slot = &in_of[off[r.node] + r.out];
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
  }
  free(uses), free(off);
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

/* Which of a window's bests to splice into cur: one whose splice runs no
 * slower once finished as optimize exports it (opt_finished_cost) than
 * cur as run (*cur_us, then the choice's). The search prices graphs before
 * the passes that fold residual adds, lay concats out in place and
 * regroup epilogues through splits, so its best need not run fastest:
 * NasNet-A's third window, best 251.1 us searched, runs at 893.0 us in the
 * whole graph, and its tenth best (262.1 us searched) at 886.9. Finishing
 * the whole graph is a pass over all of it, so the bests are ranked by
 * their window finished alone, and only the first CHOSEN_TRIES of that
 * order are spliced and finished whole. Returns the index chosen (-1 the
 * best, k runners[k]) with its splice in *next, or -2 and *next NULL to
 * keep cur. */
enum { CHOSEN_TRIES = 2 };

static int choose_as_run(const Graph *cur, const Cand *best, const Cand *runners, int n_runners,
                         double before, const TensorRef *xi, const TensorRef *xo, CostModel *cm,
                         bool pet, const OptFinishMemo *fm, double *cur_us, Graph **next,
                         Diag *d) {
  int n = 0, rank[RUNNERS_MAX + 1];
  double alone[RUNNERS_MAX + 1];
  int rc = TEQ_OK;
  *next = NULL;
  /* Newest first, so that ties go to the cheaper search cost. */
  for (int k = -1; k < n_runners && rc == TEQ_OK; k++) {
    int i = k < 0 ? -1 : n_runners - 1 - k;
    const Cand *cd = i < 0 ? best : &runners[i];
    if (!cd->g || cd->cost >= before) continue;
    double us = 0;
    rc = opt_finished_cost(cm, cd->g, pet, fm, &us, d);
    int at = n++;
    for (; at > 0 && alone[at - 1] > us; at--) alone[at] = alone[at - 1], rank[at] = rank[at - 1];
    alone[at] = us, rank[at] = i;
  }
  int pick = -2;
  for (int r = 0; r < n && r < CHOSEN_TRIES && rc == TEQ_OK && pick == -2; r++) {
    const Cand *cd = rank[r] < 0 ? best : &runners[rank[r]];
    Graph *g = NULL;
    double us = 0;
    Diag quiet;
    diag_init(&quiet);
    rc = opt_splice(cur, cd->g, xi, xo, &g, &quiet);
    diag_fini(&quiet);
    if (rc == TEQ_ERR_INPUT) { /* cannot happen for a window cut at a topological run */
      rc = TEQ_OK;
      continue;
    }
    if (rc == TEQ_OK) rc = opt_finished_cost(cm, g, pet, fm, &us, d);
    if (rc == TEQ_OK && us <= *cur_us) {
      *next = g, g = NULL;
      *cur_us = us;
      pick = rank[r];
    }
    graph_free(g);
  }
  return rc ? rc : pick;
}

/* After the windows, a few expansions of the whole graph, until deadline:
 * a rewrite whose sites lie in windows that never meet, such as one
 * product for the input products of every step of an RNN whose steps
 * share their weights, is seen only there. Windows leave twins of what
 * they built (each its own concat of the same weights), so they are merged
 * first, as the import merges a model's. Each expansion applies rules at
 * all their sites only: a rewrite at one site was the windows' to find,
 * and deriving each one's hash over the whole graph (downstream of it)
 * grows faster than the graph. Rules alone: PET's mutants were tried in
 * the windows. NasRNN at 8 times its steps (21 windows): 1,868.5 ->
 * 1,687.3 us. */
enum { WHOLE_BUDGET = 3 };

static int search_whole(Graph **cur, const OptRules *rs, CostModel *cm, const OptOptions *o,
                        OptPricer *pr, OptInstMemo *memo, ExecInputs *inputs, const OptFinishMemo *fm,
                        double deadline, OptStats *st, double t0, Diag *d) {
  int merged = graph_merge_duplicates(*cur);
  if (merged < 0) return merged;
  OptOptions wo = *o;
  wo.budget = WHOLE_BUDGET, wo.pet = false;
  double before = 0, run_before = 0, run_after = 0;
  Cand best = {0};
  int rc = price(cm, pr, *cur, &before, d);
  if (rc == TEQ_OK) rc = opt_finished_cost(cm, *cur, o->pet, fm, &run_before, d);
  run_after = run_before;
  if (rc == TEQ_OK)
    rc = search_graph(*cur, rs, cm, &wo, pr, memo, inputs, NULL, true, deadline, st, &best,
                      NULL, NULL, d);
  bool taken = false;
  /* Taken only if it runs no slower, as a window's result is. */
  if (rc == TEQ_OK && best.g && best.cost < before)
    rc = opt_finished_cost(cm, best.g, o->pet, fm, &run_after, d);
  if (rc == TEQ_OK && best.g && best.cost < before && run_after <= run_before) {
    for (int k = 0; k < best.n_hist; k++)
      if (best.hist[k] >= 0) st->applied[best.hist[k]]++;
    graph_free(*cur);
    *cur = best.g;
    best.g = NULL;
    taken = true;
  }
  if (rc == TEQ_OK && !o->quiet && o->progress)
    fprintf(o->progress, "optimize: the whole graph (%d operators): cost %.1f -> %.1f us, as run "
            "%.1f -> %.1f us, %lld graphs expanded, %.1f s%s\n", graph_count_ops(*cur), before,
            taken ? best.cost : before, run_before, taken ? run_after : run_before,
            (long long)st->explored, now_s() - t0,
            now_s() >= deadline ? " (stopped at its time)" : "");
  cand_free(&best);
  return rc;
}

int opt_search(const Graph *g, const OptRules *rs, CostModel *cm, const OptOptions *o,
               Graph **out, OptStats *st, Diag *d) {
  double t0 = now_s();
  double deadline = o->time_limit_s > 0 ? t0 + o->time_limit_s : INFINITY;
  memset(st, 0, sizeof *st);
  st->n_rules = rs->n;
  st->applied = calloc((size_t)rs->n + 1, sizeof *st->applied);
  PetCache pet = {0};
  int *pet_idx = NULL; /* the mutant of each st->pet_applied entry */
  Graph *cur = graph_copy(g);
  OptPricer *pr = NULL;
  OptInstMemo *memo = opt_inst_memo_new();
  ExecInputs *inputs = exec_inputs_new(KEPT_INPUT_BYTES);
  /* The windows' choices finish graphs: their folds, and the chains and
   * constants PET's post-optimization decided, shared with the mutants'. */
  pet.post = pet_post_cache_new();
  OptFinishMemo fm = {.folds = opt_fold_memo_new(), .post = pet.post};
  int rc = st->applied && cur && memo && inputs && fm.folds && fm.post ? TEQ_OK : TEQ_ERR_NOMEM;
  if (rc == TEQ_OK) rc = opt_pricer_new(cm, &pr);
  int window = o->window > 8 ? o->window : 8;
  int n_mov = 0;
  for (int i = 0; i < g->n_nodes; i++) n_mov += movable(&g->nodes[i]);
  /* A last window under half a window joins the one before it, so a graph
   * under one and a half windows is one window, and has no seam for a
   * second pass (shifted by half a window) to span. */
  int passes = n_mov >= window + window / 2 ? 2 : 1;
  int n_windows = passes == 1 ? 1 : (n_mov + window - 1) / window * 2;
  /* The current graph's cost as run (choose_as_run), kept from window to
   * window: the one chosen is the next one's. */
  double cur_us = 0;
  if (rc == TEQ_OK && passes > 1) rc = opt_finished_cost(cm, cur, o->pet, &fm, &cur_us, d);
  for (int pass = 0; pass < passes && rc == TEQ_OK; pass++) {
    /* lo: where the next window starts, in the current graph's order. A
     * window's rewrite changes how many operators come before the rest,
     * so the next starts where this one now ends. */
    for (int lo = pass ? window / 2 : 0, next_lo;; lo = next_lo) {
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
      /* No sliver of a last window: one under half a window joins this one. */
      if (pass == 0 && m - hi < window / 2) hi = m;
      if (hi < m && !o->plain_windows) hi = narrow_cut(cur, order, m, lo + window * 3 / 4, hi);
      next_lo = hi;
      Graph *w = NULL;
      TensorRef *xi = NULL, *xo = NULL;
      rc = cut_window(cur, order, lo, hi, &w, &xi, &xo, d);
      free(order);
      if (rc) break;
      /* A share of the time left, by the windows left. */
      int left = n_windows - st->windows;
      double wd = isinf(deadline) ? deadline : now_s() + (deadline - now_s()) / (left > 0 ? left : 1);
      Cand best = {0}, runners[RUNNERS_MAX];
      int n_runners = 0;
      double before = 0, run_before = cur_us;
      rc = price(cm, pr, w, &before, d);
      /* A window enlarged by a last sliver gets a budget in proportion. */
      OptOptions wo = *o;
      if (hi - lo > window) wo.budget = (int)ceil((double)o->budget * (hi - lo) / window);
      if (!rc)
        rc = search_graph(w, rs, cm, &wo, pr, memo, inputs, o->pet ? &pet : NULL, false, wd,
                          st, &best, passes > 1 ? runners : NULL, &n_runners, d);
      st->windows++;
      if (pass == 0) st->first_pass_ops += hi - lo;
      const Cand *chosen = NULL;
      if (!rc && best.cost < before) {
        Graph *next = NULL;
        if (passes == 1) { /* one window: the result is finished once, after */
          Diag quiet;
          diag_init(&quiet);
          rc = opt_splice(cur, best.g, xi, xo, &next, &quiet);
          diag_fini(&quiet);
          if (rc == TEQ_OK) chosen = &best;
          else if (rc == TEQ_ERR_INPUT) rc = TEQ_OK; /* cannot happen: keep cur */
        } else {
          int k = choose_as_run(cur, &best, runners, n_runners, before, xi, xo, cm, o->pet,
                                &fm, &cur_us, &next, d);
          if (k < -2) rc = k;
          else if (k >= -1) chosen = k < 0 ? &best : &runners[k];
        }
        if (chosen) {
          /* The next window starts after what this one left. */
          int m_after = 0;
          for (int i = 0; i < next->n_nodes; i++) m_after += movable(&next->nodes[i]);
          next_lo = hi - (m - m_after);
          graph_free(cur);
          cur = next;
          for (int k = 0; k < chosen->n_hist && rc == TEQ_OK; k++)
            if (chosen->hist[k] >= 0) st->applied[chosen->hist[k]]++;
            else rc = pet_applied(st, &pet, -1 - chosen->hist[k], &pet_idx);
        }
      }
      if (!rc && !o->quiet && o->progress) {
        /* Windows after a rewrite start where it ended, so their count is
         * known only as they go. */
        fprintf(o->progress, passes > 1 ? "optimize: window %d of about %d (%d operators): "
                "cost %.1f -> %.1f us" : "optimize: window %d/%d (%d operators): cost %.1f -> "
                "%.1f us", st->windows, n_windows, hi - lo, before, chosen ? chosen->cost : before);
        if (passes > 1) fprintf(o->progress, ", as run %.1f -> %.1f us", run_before, cur_us);
        fprintf(o->progress, ", %lld graphs expanded, %.1f s\n", (long long)st->explored,
                now_s() - t0);
      }
      cand_free(&best);
      for (int k = 0; k < n_runners; k++) cand_free(&runners[k]);
      graph_free(w);
      free(xi);
      free(xo);
      if (rc || hi >= m) break;
    }
  }
  if (rc == TEQ_OK && st->windows > 1 && !o->one_site && now_s() < deadline) {
    /* Twice as long as the windows took, and a second, at most: an
     * expansion of the whole graph derives each rewrite's hash anew
     * downstream of it, which on a long chain grows faster than the graph,
     * and the search's time must not. The box is a guard, not a budget: a
     * clock that binds makes the result depend on the machine's load. It
     * once was half the windows' time, which at --budget 0 (a few ms of
     * windows) cut Inception-v3's three expansions anywhere from 0 to 6
     * rewrites from one run to the next; these three finish in 0.3 s, and
     * NasRNN's at 16 times its steps, BERT's at 4 and NasNet-A's at 4
     * within the old box (2026-12-07). */
    double box = now_s() + fmax(1.0, 2.0 * (now_s() - t0));
    bool stopped = st->stopped_by_time;
    rc = search_whole(&cur, rs, cm, o, pr, memo, inputs, &fm, box < deadline ? box : deadline, st,
                      t0, d);
    if (box < deadline) st->stopped_by_time = stopped; /* its own limit, not the caller's */
  }
  pet_cache_fini(&pet);
  free(pet_idx);
  opt_pricer_free(pr);
  opt_inst_memo_free(memo);
  exec_inputs_free(inputs);
  opt_fold_memo_free(fm.folds);
  st->search_s = now_s() - t0;
  st->best_s = st->best_s > 0 ? st->best_s - t0 : 0;
  if (rc) {
    graph_free(cur);
    return rc;
  }
  *out = cur;
  return TEQ_OK;
}
