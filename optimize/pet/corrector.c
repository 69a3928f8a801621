/* corrector.c: PET's random tests (section 5.2, step 2): which boxes of a
 * mutant's outputs differ from the original's.
 *
 * Both programs run exactly in Z_p (p = 2^31 - 1) on t random inputs, each
 * element uniform in Z_p and drawn from the caller's seed. In every box of
 * the common refinement of both programs' boxes, the positions v0 and
 * v0 + e_k of Theorem 1 are compared (e_k only along axes where the box is
 * at least 2 wide: the theorem asks that the differences span the box, and
 * a 1-wide axis has nothing to span). v0 is drawn from the seed inside the
 * box, far enough from its end that every v0 + e_k stays inside. A box of
 * unknown structure (is_whole) is compared at every position instead.
 *
 * Why (n/p)^t: if the programs differ somewhere in a box, Theorem 1 says
 * they differ at one of the tested positions as polynomials in the inputs,
 * a polynomial of degree at most n; Schwartz-Zippel (Theorem 2) makes each
 * trial miss that with probability at most n/p, independently. Both
 * programs run only at the positions tested (exec_points: convolutions and
 * products summed at those positions alone, the layouts after them
 * followed, not run); running them whole was most of what PET's tests
 * spent. The inputs of each trial are drawn once for every mutant tested
 * against one original. all_positions runs both whole instead, to
 * cross-check Theorem 1 at every position. The rebuilding of the
 * differing boxes is in correct.c. */
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "optimize/pet/pet.h"
#include "runtime/exec.h"
#include "runtime/modp.h"

/* Trials when the degree is unknown: no bound holds, so only a margin. */
#define TRIALS_NO_DEGREE 4
/* Differing boxes listed per output by pet_report_print. */
#define PRINT_MAX 32

int pet_default_trials(int degree) {
  double per = log2((double)MODP_P) - log2(degree < 1 ? 1.0 : (double)degree);
  if (per <= 0) return 1000;
  int t = (int)ceil(60.0 / per);
  return t < 1 ? 1 : t;
}

/* Same inputs (count, shapes, element types) and outputs (count, shapes). */
static int check_interface(const Graph *a, const Graph *b, Diag *d) {
  char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
  if (a->n_inputs != b->n_inputs || a->n_outputs != b->n_outputs)
    return diag_error(d, "pet: the original has %d inputs and %d outputs, the mutant %d and %d",
                      a->n_inputs, a->n_outputs, b->n_inputs, b->n_outputs);
  for (int i = 0; i < a->n_inputs; i++) {
    const Node *x = &a->nodes[a->inputs[i]], *y = &b->nodes[b->inputs[i]];
    if (!shape_equal(&x->out[0], &y->out[0]) || x->dtype != y->dtype)
      return diag_error(d, "pet: input %d is %s %s in the original but %s %s in the mutant", i,
                        dtype_name(x->dtype), shape_format(&x->out[0], sa, sizeof sa),
                        dtype_name(y->dtype), shape_format(&y->out[0], sb, sizeof sb));
  }
  for (int j = 0; j < a->n_outputs; j++) {
    const Shape *x = graph_shape(a, a->outputs[j]), *y = graph_shape(b, b->outputs[j]);
    if (!shape_equal(x, y) || !shape_is_known(x))
      return diag_error(d, "pet: output %d has shape %s in the original but %s in the mutant", j,
                        shape_format(x, sa, sizeof sa), shape_format(y, sb, sizeof sb));
  }
  return TEQ_OK;
}

void pet_report_fini(PetReport *rep) {
  for (int j = 0; rep->out && j < rep->n_outputs; j++) {
    pet_boxes_fini(&rep->out[j].boxes);
    free(rep->out[j].differs);
  }
  free(rep->out);
  memset(rep, 0, sizeof *rep);
}

/* The boxes of every output of both graphs, refined. */
static int report_boxes(const Graph *orig, const Graph *mutant, PetReport *rep, Diag *d) {
  rep->n_outputs = orig->n_outputs;
  rep->out = calloc((size_t)rep->n_outputs + 1, sizeof *rep->out);
  if (!rep->out) return TEQ_ERR_NOMEM;
  for (int j = 0; j < rep->n_outputs; j++) {
    PetOutputReport *o = &rep->out[j];
    PetBoxes a, b;
    int rc = pet_boxes(orig, j, &a, d);
    if (rc) return rc;
    if ((rc = pet_boxes(mutant, j, &b, d))) {
      pet_boxes_fini(&a);
      return rc;
    }
    rc = pet_boxes_refine(&a, &b, &o->boxes, d);
    pet_boxes_fini(&a);
    pet_boxes_fini(&b);
    if (rc) return rc;
    o->n_boxes = pet_boxes_count(&o->boxes);
    o->differs = calloc((size_t)o->n_boxes + 1, 1);
    if (!o->differs) return TEQ_ERR_NOMEM;
    rep->n_boxes += o->n_boxes;
  }
  return TEQ_OK;
}

/* Fresh random inputs for trial k: element-wise uniform in Z_p. */
static int make_inputs(const Graph *g, uint64_t seed, int k, Tensor **in) {
  for (int i = 0; i < g->n_inputs; i++) {
    const Node *x = &g->nodes[g->inputs[i]];
    in[i] = tensor_new_uninit(x->dtype == DT_I64 ? DT_I64 : DT_MODP, &x->out[0]);
    if (!in[i]) return TEQ_ERR_NOMEM;
    tensor_fill_random(in[i], hash_mix(hash_mix(seed, (uint64_t)k + 1), (uint64_t)i + 1));
  }
  return TEQ_OK;
}

static bool same_at(const Tensor *a, const Tensor *b, int64_t flat) {
  size_t es = dtype_size(a->dtype);
  return memcmp((const char *)a->data + (size_t)flat * es, (const char *)b->data + (size_t)flat * es,
                es) == 0;
}

/* The positions in box [lo, hi) of rank nd. */
static int64_t box_size(const int64_t *lo, const int64_t *hi, int nd) {
  int64_t n = 1;
  for (int k = 0; k < nd; k++) n *= hi[k] - lo[k];
  return n;
}

/* Every position of box [lo, hi), odometer order. */
static bool same_everywhere(const Tensor *a, const Tensor *b, const int64_t *lo,
                            const int64_t *hi, int64_t *count) {
  int nd = a->shape.ndim;
  int64_t st[TEQ_MAX_DIMS], v[TEQ_MAX_DIMS];
  shape_strides(&a->shape, st);
  int64_t n = box_size(lo, hi, nd);
  *count += n;
  if (n <= 0) return true;
  memcpy(v, lo, (size_t)nd * sizeof *v);
  for (;;) {
    int64_t flat = 0;
    for (int k = 0; k < nd; k++) flat += v[k] * st[k];
    if (!same_at(a, b, flat)) return false;
    int k = nd - 1;
    while (k >= 0 && ++v[k] == hi[k]) v[k] = lo[k], k--;
    if (k < 0) return true;
  }
}

/* Theorem 1's positions in box [lo, hi) of an output of shape s: v0, then
 * v0 + e_k wherever the box is 2 or more wide, written to pos (at most
 * 1 + rank of them); returns how many. The same v0 in every trial: it
 * depends on the seed, the output and the box only. */
static int theorem1_positions(const Shape *s, const int64_t *lo, const int64_t *hi,
                              uint64_t pos_seed, int64_t *pos) {
  int64_t st[TEQ_MAX_DIMS], flat0 = 0;
  uint64_t rng = pos_seed;
  int n = 1;
  shape_strides(s, st);
  for (int k = 0; k < s->ndim; k++) {
    int64_t w = hi[k] - lo[k];
    flat0 += (lo[k] + (w >= 2 ? (int64_t)(rng_next(&rng) % (uint64_t)(w - 1)) : 0)) * st[k];
  }
  pos[0] = flat0;
  for (int k = 0; k < s->ndim; k++)
    if (hi[k] - lo[k] >= 2) pos[n++] = flat0 + st[k];
  return n;
}

static uint64_t box_seed(const PetTestOptions *opt, int j, int64_t i) {
  return hash_mix(hash_mix(opt->seed ^ 0x5045545f424f58ull, (uint64_t)j), (uint64_t)i);
}

static bool same_at_theorem1(const Tensor *a, const Tensor *b, const int64_t *lo,
                             const int64_t *hi, uint64_t pos_seed, int64_t *count) {
  int64_t pos[TEQ_MAX_DIMS + 1];
  int n = theorem1_positions(&a->shape, lo, hi, pos_seed, pos);
  *count += n;
  bool same = true;
  for (int q = 0; q < n && same; q++) same = same_at(a, b, pos[q]);
  return same;
}

/* The positions tested in each output, box after box: Theorem 1's, or
 * every position of a box of unknown structure. Box i of output j holds
 * pos[j][start[j][i] .. start[j][i + 1]). */
typedef struct Tested {
  int n_outputs;
  int64_t **pos, *n_pos, **start;
  uint32_t **vals, **ovals; /* per output, the mutant's and the original's values there */
} Tested;

static void tested_fini(Tested *t) {
  for (int j = 0; j < t->n_outputs; j++) {
    if (t->pos) free(t->pos[j]);
    if (t->start) free(t->start[j]);
    if (t->vals) free(t->vals[j]);
    if (t->ovals) free(t->ovals[j]);
  }
  free(t->pos), free(t->n_pos), free(t->start), free(t->vals), free(t->ovals);
}

/* Whether the positions tested are under a quarter of the outputs'
 * elements, so that running both programs at them alone pays: boxes of
 * unknown structure are tested whole, and then the original's whole runs,
 * shared by every mutant, cost less than a run of it per mutant. */
static bool few_positions(const Graph *orig, const PetReport *rep) {
  int64_t tested = 0, total = 0, lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS];
  for (int j = 0; j < rep->n_outputs; j++) {
    const PetOutputReport *o = &rep->out[j];
    const Shape *s = graph_shape(orig, orig->outputs[j]);
    total += shape_numel(s);
    if (!o->boxes.is_whole) {
      tested += o->n_boxes * (s->ndim + 1);
      continue;
    }
    for (int64_t i = 0; i < o->n_boxes; i++) {
      pet_box_bounds(&o->boxes, i, lo, hi);
      tested += box_size(lo, hi, s->ndim);
    }
  }
  return 4 * tested < total;
}

static int tested_positions(const Graph *orig, const PetReport *rep, const PetTestOptions *opt,
                            Tested *t) {
  int m = rep->n_outputs;
  t->n_outputs = m;
  t->pos = calloc((size_t)m + 1, sizeof *t->pos);
  t->n_pos = calloc((size_t)m + 1, sizeof *t->n_pos);
  t->start = calloc((size_t)m + 1, sizeof *t->start);
  t->vals = calloc((size_t)m + 1, sizeof *t->vals);
  t->ovals = calloc((size_t)m + 1, sizeof *t->ovals);
  if (!t->pos || !t->n_pos || !t->start || !t->vals || !t->ovals) return TEQ_ERR_NOMEM;
  for (int j = 0; j < m; j++) {
    const PetOutputReport *o = &rep->out[j];
    const Shape *s = graph_shape(orig, orig->outputs[j]);
    int64_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS], cap = 0, n = 0;
    if (!(t->start[j] = malloc(((size_t)o->n_boxes + 1) * sizeof *t->start[j])))
      return TEQ_ERR_NOMEM;
    for (int64_t i = 0; i < o->n_boxes; i++) {
      pet_box_bounds(&o->boxes, i, lo, hi);
      cap += o->boxes.is_whole ? box_size(lo, hi, s->ndim) : s->ndim + 1;
    }
    t->pos[j] = malloc(((size_t)cap + 1) * sizeof *t->pos[j]);
    t->vals[j] = malloc(((size_t)cap + 1) * sizeof *t->vals[j]);
    t->ovals[j] = malloc(((size_t)cap + 1) * sizeof *t->ovals[j]);
    if (!t->pos[j] || !t->vals[j] || !t->ovals[j]) return TEQ_ERR_NOMEM;
    int64_t st[TEQ_MAX_DIMS];
    shape_strides(s, st);
    for (int64_t i = 0; i < o->n_boxes; i++) {
      t->start[j][i] = n;
      pet_box_bounds(&o->boxes, i, lo, hi);
      if (!o->boxes.is_whole) {
        n += theorem1_positions(s, lo, hi, box_seed(opt, j, i), t->pos[j] + n);
        continue;
      }
      int64_t v[TEQ_MAX_DIMS], size = box_size(lo, hi, s->ndim);
      if (size <= 0) continue;
      memcpy(v, lo, (size_t)s->ndim * sizeof *v);
      for (int64_t e = 0; e < size; e++) { /* odometer order */
        int64_t flat = 0;
        for (int k = 0; k < s->ndim; k++) flat += v[k] * st[k];
        t->pos[j][n++] = flat;
        for (int k = s->ndim - 1; k >= 0 && ++v[k] == hi[k]; k--) v[k] = lo[k];
      }
    }
    t->start[j][o->n_boxes] = n;
    t->n_pos[j] = n;
  }
  return TEQ_OK;
}

/* One trial's outputs compared box by box; boxes already found to differ
 * are skipped. count is the positions of the plan (the first trial tests
 * them all), whether or not a comparison stopped at the first difference. */
static void compare_output(PetOutputReport *o, int j, const Tensor *a, const Tensor *b,
                           const PetTestOptions *opt, bool first) {
  int64_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS], count = 0;
  for (int64_t i = 0; i < o->n_boxes; i++) {
    if (o->differs[i]) continue;
    pet_box_bounds(&o->boxes, i, lo, hi);
    uint64_t ps = box_seed(opt, j, i);
    bool same = o->boxes.is_whole ? same_everywhere(a, b, lo, hi, &count)
                                  : same_at_theorem1(a, b, lo, hi, ps, &count);
    if (opt->all_positions && !o->boxes.is_whole)
      same = same_everywhere(a, b, lo, hi, &count) && same;
    if (!same) o->differs[i] = 1;
  }
  if (first) o->n_positions = count;
}

/* The original's values at one set of tested positions in one trial:
 * mutants whose boxes refine the original's alike are tested at the same
 * positions, and the original need not run there again for each. */
typedef struct OrigPoints {
  uint64_t key;    /* of the positions (tested_key); 0: none yet */
  int64_t *n_pos;  /* per output, how many, and */
  int64_t **pos;   /* the positions themselves, compared on a match */
  uint32_t **vals; /* per output */
} OrigPoints;

/* The inputs of each trial, and the original's whole outputs where a
 * cross-check wants them, and its values at the positions last tested:
 * the same for every mutant tested against the original with the same
 * seed (pet_mutate tests dozens, on several threads, which share one). */
struct PetOrigRuns {
  const Graph *orig;
  uint64_t seed;
  pthread_mutex_t lock;
  int n_trials;
  Tensor ***in, ***out; /* per trial: n_inputs, n_outputs tensors; NULL until made */
  OrigPoints *at;       /* per trial */
};

PetOrigRuns *pet_orig_runs_new(const Graph *orig, uint64_t seed) {
  PetOrigRuns *c = calloc(1, sizeof *c);
  if (!c) return NULL;
  c->orig = orig, c->seed = seed;
  pthread_mutex_init(&c->lock, NULL);
  return c;
}

static void orig_points_fini(OrigPoints *op, int n_outputs) {
  for (int j = 0; op->vals && j < n_outputs; j++) free(op->vals[j]);
  for (int j = 0; op->pos && j < n_outputs; j++) free(op->pos[j]);
  free(op->vals), free(op->pos), free(op->n_pos);
  *op = (OrigPoints){0};
}

void pet_orig_runs_free(PetOrigRuns *c) {
  if (!c) return;
  for (int k = 0; k < c->n_trials; k++) {
    for (int i = 0; c->in[k] && i < c->orig->n_inputs; i++) tensor_unref(c->in[k][i]);
    for (int j = 0; c->out[k] && j < c->orig->n_outputs; j++) tensor_unref(c->out[k][j]);
    free(c->in[k]), free(c->out[k]);
    orig_points_fini(&c->at[k], c->orig->n_outputs);
  }
  free(c->in), free(c->out), free(c->at);
  pthread_mutex_destroy(&c->lock);
  free(c);
}

/* Trial k's inputs, made on first use; with whole, the original's outputs
 * too, run on first use. The caller holds c->lock: a thread that waits
 * for another's run would otherwise make the same run. */
static int orig_trial(PetOrigRuns *c, int k, bool whole, Diag *d) {
  if (k >= c->n_trials) {
    int n = k + 4;
    Tensor ***in = realloc(c->in, (size_t)n * sizeof *in);
    if (in) c->in = in;
    Tensor ***out = realloc(c->out, (size_t)n * sizeof *out);
    if (out) c->out = out;
    OrigPoints *at = realloc(c->at, (size_t)n * sizeof *at);
    if (at) c->at = at;
    if (!in || !out || !at) return diag_error(d, "pet: out of memory"), TEQ_ERR_NOMEM;
    for (int i = c->n_trials; i < n; i++)
      c->in[i] = NULL, c->out[i] = NULL, c->at[i] = (OrigPoints){0};
    c->n_trials = n;
  }
  const Graph *g = c->orig;
  int rc = TEQ_OK;
  if (!c->in[k]) {
    Tensor **in = calloc((size_t)g->n_inputs + 1, sizeof *in);
    if (!in || (rc = make_inputs(g, c->seed, k, in))) {
      for (int i = 0; in && i < g->n_inputs; i++) tensor_unref(in[i]);
      free(in);
      return diag_error(d, "pet: out of memory"), TEQ_ERR_NOMEM;
    }
    c->in[k] = in;
  }
  if (!whole || c->out[k]) return TEQ_OK;
  Tensor **out = calloc((size_t)g->n_outputs + 1, sizeof *out);
  if (!out) return diag_error(d, "pet: out of memory"), TEQ_ERR_NOMEM;
  if ((rc = exec_run(g, EXEC_MODP, c->in[k], out, d))) {
    diag_error(d, "pet: the original does not run in Z_p");
    free(out);
    return rc;
  }
  c->out[k] = out;
  return TEQ_OK;
}

/* What identifies the positions t tests (never 0). */
static uint64_t tested_key(const Tested *t) {
  uint64_t h = hash_mix(0x74657374, (uint64_t)t->n_outputs);
  for (int j = 0; j < t->n_outputs; j++)
    h = hash_bytes(hash_mix(h, (uint64_t)t->n_pos[j]), t->pos[j],
                   (size_t)t->n_pos[j] * sizeof *t->pos[j]);
  return h ? h : 1;
}

/* The original's values at t's positions in trial k, into t->ovals: kept
 * from a mutant tested at the same positions before, or run (its plan
 * made on first need) and kept. */
static int orig_points(PetOrigRuns *c, ExecPoints **orig_plan, Tested *t, uint64_t key, int k,
                       Tensor *const *in, Diag *d) {
  int m = t->n_outputs;
  pthread_mutex_lock(&c->lock);
  OrigPoints *op = &c->at[k];
  bool kept = op->key == key &&
              !memcmp(op->n_pos, t->n_pos, (size_t)m * sizeof *t->n_pos);
  for (int j = 0; kept && j < m; j++)
    kept = !memcmp(op->pos[j], t->pos[j], (size_t)t->n_pos[j] * sizeof *t->pos[j]);
  for (int j = 0; kept && j < m; j++)
    memcpy(t->ovals[j], op->vals[j], (size_t)t->n_pos[j] * sizeof *t->ovals[j]);
  pthread_mutex_unlock(&c->lock);
  if (kept) return TEQ_OK;
  int rc = TEQ_OK;
  if (!*orig_plan)
    rc = exec_points_new(c->orig, (const int64_t *const *)t->pos, t->n_pos, orig_plan, d);
  if (!rc) rc = exec_points_run(*orig_plan, in, t->ovals, d);
  if (rc) return diag_error(d, "pet: the original does not run in Z_p"), rc;
  OrigPoints made = {.key = key, .n_pos = malloc(((size_t)m + 1) * sizeof *made.n_pos),
                     .pos = calloc((size_t)m + 1, sizeof *made.pos),
                     .vals = calloc((size_t)m + 1, sizeof *made.vals)};
  bool whole = made.n_pos && made.pos && made.vals;
  if (whole) memcpy(made.n_pos, t->n_pos, (size_t)m * sizeof *made.n_pos);
  for (int j = 0; whole && j < m; j++) {
    size_t n = (size_t)t->n_pos[j];
    made.pos[j] = malloc((n + 1) * sizeof *made.pos[j]);
    made.vals[j] = malloc((n + 1) * sizeof *made.vals[j]);
    if (!(whole = made.pos[j] && made.vals[j])) break;
    memcpy(made.pos[j], t->pos[j], n * sizeof *made.pos[j]);
    memcpy(made.vals[j], t->ovals[j], n * sizeof *made.vals[j]);
  }
  if (whole) { /* else out of memory: not kept, the next mutant runs it again */
    pthread_mutex_lock(&c->lock);
    OrigPoints old = c->at[k];
    c->at[k] = made;
    made = old;
    pthread_mutex_unlock(&c->lock);
  }
  orig_points_fini(&made, m);
  return TEQ_OK;
}

/* One trial of both programs at the tested positions only. */
static int run_trial_at(PetOrigRuns *c, ExecPoints **orig_plan, const ExecPoints *plan,
                        Tested *t, uint64_t key, int k, PetReport *rep, Diag *d) {
  pthread_mutex_lock(&c->lock);
  int rc = orig_trial(c, k, false, d);
  Tensor **in = rc ? NULL : c->in[k]; /* made once, never moved */
  pthread_mutex_unlock(&c->lock);
  if (rc) return rc;
  if ((rc = orig_points(c, orig_plan, t, key, k, in, d))) return rc;
  if ((rc = exec_points_run(plan, in, t->vals, d)))
    return diag_error(d, "pet: the mutant does not run in Z_p"), rc;
  for (int j = 0; j < rep->n_outputs; j++) {
    PetOutputReport *o = &rep->out[j];
    for (int64_t i = 0; i < o->n_boxes; i++) {
      bool same = true;
      for (int64_t q = t->start[j][i]; q < t->start[j][i + 1] && same; q++)
        same = t->ovals[j][q] == t->vals[j][q];
      if (!same) o->differs[i] = 1;
    }
    if (k == 0) o->n_positions = t->n_pos[j];
  }
  return TEQ_OK;
}

static int run_trial(PetOrigRuns *c, const Graph *mutant, const PetTestOptions *opt, int k,
                     PetReport *rep, Diag *d) {
  int m = c->orig->n_outputs;
  pthread_mutex_lock(&c->lock);
  int rc = orig_trial(c, k, true, d);
  Tensor **in = rc ? NULL : c->in[k], **out = rc ? NULL : c->out[k]; /* made once, never moved */
  pthread_mutex_unlock(&c->lock);
  if (rc) return rc;
  Tensor **ob = calloc((size_t)m + 1, sizeof *ob);
  if (!ob) return diag_error(d, "pet: out of memory"), TEQ_ERR_NOMEM;
  if ((rc = exec_run(mutant, EXEC_MODP, in, ob, d))) {
    diag_error(d, "pet: the mutant does not run in Z_p");
    free(ob);
    return rc;
  }
  for (int j = 0; j < m; j++) {
    compare_output(&rep->out[j], j, out[j], ob[j], opt, k == 0);
    tensor_unref(ob[j]);
  }
  free(ob);
  return rc;
}

int pet_compare_cached(const Graph *orig, const Graph *mutant, const PetTestOptions *o,
                       PetOrigRuns **cache, PetReport *rep, Diag *d) {
  PetReport r;
  memset(&r, 0, sizeof r);
  int rc = check_interface(orig, mutant, d);
  if (rc) return rc;
  PetOrigRuns *c = cache ? *cache : NULL;
  if (c && (c->orig != orig || c->seed != o->seed)) {
    pet_orig_runs_free(c);
    c = *cache = NULL;
  }
  if (!c) {
    if (!(c = pet_orig_runs_new(orig, o->seed)))
      return diag_error(d, "pet: out of memory"), TEQ_ERR_NOMEM;
    if (cache) *cache = c;
  }
  int da = pet_degree(orig), db = pet_degree(mutant);
  r.degree = da < 0 || db < 0 ? -1 : da > db ? da : db;
  r.trials = o->trials > 0 ? o->trials
             : r.degree < 0 ? TRIALS_NO_DEGREE
                            : pet_default_trials(r.degree);
  r.seed = o->seed;
  r.log2_bound = r.degree < 0 ? 0.0
                 : r.trials * (log2(r.degree < 1 ? 1.0 : (double)r.degree) - log2((double)MODP_P));
  if ((rc = report_boxes(orig, mutant, &r, d)) == TEQ_ERR_NOMEM) diag_error(d, "pet: out of memory");
  Tested t = {0};
  ExecPoints *plan = NULL, *orig_plan = NULL;
  if (!rc && !o->all_positions && few_positions(orig, &r)) {
    if ((rc = tested_positions(orig, &r, o, &t)) == TEQ_ERR_NOMEM)
      diag_error(d, "pet: out of memory");
    const int64_t *const *pos = (const int64_t *const *)t.pos;
    if (!rc && (rc = exec_points_new(mutant, pos, t.n_pos, &plan, d)))
      diag_error(d, "pet: the mutant does not run in Z_p");
  }
  uint64_t key = plan ? tested_key(&t) : 0;
  for (int k = 0; k < r.trials && !rc; k++) {
    rc = plan ? run_trial_at(c, &orig_plan, plan, &t, key, k, &r, d)
              : run_trial(c, mutant, o, k, &r, d);
    bool whole = false; /* a box that differs in one trial differs, whatever the others say */
    for (int j = 0; j < r.n_outputs && o->stop_if_whole && !rc && !whole; j++) {
      int64_t i = 0;
      while (i < r.out[j].n_boxes && r.out[j].differs[i]) i++;
      whole = i == r.out[j].n_boxes;
    }
    if (whole && k + 1 < r.trials) { /* the report tells the trials run */
      r.log2_bound *= (double)(k + 1) / r.trials;
      r.trials = k + 1;
    }
  }
  exec_points_free(plan);
  exec_points_free(orig_plan);
  tested_fini(&t);
  if (!cache) pet_orig_runs_free(c);
  if (rc) {
    pet_report_fini(&r);
    return rc;
  }
  for (int j = 0; j < r.n_outputs; j++) {
    PetOutputReport *out = &r.out[j];
    for (int64_t i = 0; i < out->n_boxes; i++) out->n_differ += out->differs[i];
    r.n_differ += out->n_differ;
    r.n_positions += out->n_positions;
  }
  *rep = r;
  return TEQ_OK;
}

int pet_compare(const Graph *orig, const Graph *mutant, const PetTestOptions *o, PetReport *rep,
                Diag *d) {
  return pet_compare_cached(orig, mutant, o, NULL, rep, d);
}

void pet_report_print(const PetReport *rep, FILE *f) {
  fprintf(f, "pet: t = %d trials, degree n = ", rep->trials);
  if (rep->degree < 0) fprintf(f, "unknown (no bound)");
  else fprintf(f, "%d, a differing box passes with probability <= 2^%.1f", rep->degree,
               rep->log2_bound);
  fprintf(f, "\npet: %lld boxes, %lld differ, %lld positions per trial, seed %llu\n",
          (long long)rep->n_boxes, (long long)rep->n_differ, (long long)rep->n_positions,
          (unsigned long long)rep->seed);
  for (int j = 0; j < rep->n_outputs; j++) {
    const PetOutputReport *o = &rep->out[j];
    int64_t lo[TEQ_MAX_DIMS], hi[TEQ_MAX_DIMS], shown = 0;
    fprintf(f, "output %d: ", j);
    pet_boxes_print(&o->boxes, f);
    fprintf(f, "\n  %lld boxes, %lld differ\n", (long long)o->n_boxes, (long long)o->n_differ);
    for (int64_t i = 0; i < o->n_boxes && shown < PRINT_MAX; i++) {
      if (!o->differs[i]) continue;
      pet_box_bounds(&o->boxes, i, lo, hi);
      fprintf(f, "  differs: [");
      for (int k = 0; k < o->boxes.ndim; k++)
        fprintf(f, "%s%lld:%lld", k ? ", " : "", (long long)lo[k], (long long)hi[k]);
      fprintf(f, "]\n");
      shown++;
    }
    if (o->n_differ > shown) fprintf(f, "  ... %lld more\n", (long long)(o->n_differ - shown));
  }
}
