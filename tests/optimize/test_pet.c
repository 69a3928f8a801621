/* test_pet.c: PET's mutation corrector (optimize/pet/pet.h).
 *
 * Box propagation is checked against split points worked out by hand; the
 * tester against mutants whose differing boxes are known by construction
 * (a conv whose padding is recreated after the fact differs on its border;
 * a region doubled by slice + pad + add differs exactly there); every
 * corrected mutant is then compared with the original at every output
 * position, exactly in Z_p and within 1e-4 in float32, and against the
 * mutant, from which it must differ only inside the corrected regions. */
#include <pthread.h>
#include <string.h>

#include "optimize/pet/pet.h"
#include "tests/optimize/pet_graphs.h"

/* pads in ONNX order: every begin, then every end. */
static TensorRef pad(Graph *g, TensorRef x, const int64_t *pads) {
  Params p;
  params_default(OP_PAD, &p);
  param_set_ints(&p, param_index(OP_PAD, "pads"), pads, 2 * graph_shape(g, x)->ndim);
  return node(g, OP_PAD, &x, 1, &p);
}

static TensorRef slice(Graph *g, TensorRef x, const int64_t *lo, const int64_t *hi,
                       const int64_t *steps) {
  int r = graph_shape(g, x)->ndim;
  int64_t one[TEQ_MAX_DIMS] = {1, 1, 1, 1, 1, 1};
  Params p;
  params_default(OP_SLICE, &p);
  param_set_ints(&p, param_index(OP_SLICE, "starts"), lo, r);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), hi, r);
  param_set_ints(&p, param_index(OP_SLICE, "steps"), steps ? steps : one, r);
  return node(g, OP_SLICE, &x, 1, &p);
}

static TensorRef concat(Graph *g, TensorRef a, TensorRef b, int axis) {
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, 0, axis);
  return node(g, OP_CONCAT, (TensorRef[]){a, b}, 2, &p);
}

static TensorRef add(Graph *g, TensorRef a, TensorRef b) {
  return node(g, OP_EWADD, (TensorRef[]){a, b}, 2, NULL);
}

/* y plus a copy of y's region [lo, hi), zero elsewhere: differs from y
 * exactly on that region. */
static TensorRef double_region(Graph *g, TensorRef y, const int64_t *lo, const int64_t *hi) {
  const Shape *s = graph_shape(g, y);
  int r = s->ndim;
  int64_t pads[2 * TEQ_MAX_DIMS];
  for (int k = 0; k < r; k++) pads[k] = lo[k], pads[r + k] = s->d[k] - hi[k];
  return add(g, y, pad(g, slice(g, y, lo, hi, NULL), pads));
}

static bool points_are(const PetBoxes *b, int dim, const int64_t *want, int n) {
  bool ok = b->n_points[dim] == n;
  for (int i = 0; i < n && ok; i++) ok = b->points[dim][i] == want[i];
  if (!ok) {
    fprintf(stderr, "boxes: ");
    pet_boxes_print(b, stderr);
    fprintf(stderr, "\n");
  }
  return ok;
}

static PetBoxes boxes_of(const Graph *g) {
  PetBoxes b;
  int rc = pet_boxes(g, 0, &b, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) exit(1);
  return b;
}

/* ---- box propagation ---- */

static void test_boxes_conv(void) {
  struct { int pad, stride, dil, in; int64_t want[2]; int n; } cases[] = {
    {1, 1, 1, 8, {1, 7}, 2},   /* receptive fields touching the padding */
    {1, 2, 1, 8, {1, 0}, 1},   /* stride 2: only the first row reaches the top pad */
    {2, 1, 2, 8, {2, 6}, 2},   /* dilation 2 reaches two rows into the padding */
    {0, 1, 1, 8, {0, 0}, 0},   /* no padding, no boxes */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(4, 1, 3, cases[i].in, cases[i].in));
    TensorRef w = input(g, "w", shape_of(4, 4, 3, 3, 3));
    output(g, conv(g, x, w, cases[i].pad, cases[i].stride, cases[i].dil, 1));
    PetBoxes b = boxes_of(g);
    CHECK(!b.is_whole);
    CHECK_MSG(points_are(&b, 2, cases[i].want, cases[i].n), "case %zu H", i);
    CHECK_MSG(points_are(&b, 3, cases[i].want, cases[i].n), "case %zu W", i);
    CHECK(b.n_points[0] == 0 && b.n_points[1] == 0);
    CHECK_EQ_INT(pet_degree(g), 2);
    pet_boxes_fini(&b);
    graph_free(g);
  }
}

static void test_boxes_layout(void) {
  Graph *g = graph_new();
  TensorRef a = input(g, "a", shape_of(4, 1, 2, 4, 3)), b = input(g, "b", shape_of(4, 1, 2, 4, 5));
  TensorRef c = concat(g, a, b, 3);
  output(g, c);
  /* slice [1, 8) moves the seam to 2; a step of 2 from 0 puts it at ceil(3/2) */
  output(g, slice(g, c, (int64_t[]){0, 0, 0, 1}, (int64_t[]){1, 2, 4, 8}, NULL));
  output(g, slice(g, c, (int64_t[]){0, 0, 0, 0}, (int64_t[]){1, 2, 4, 8}, (int64_t[]){1, 1, 1, 2}));
  /* a transpose carries the seam to where the axis goes */
  Params p;
  params_default(OP_TRANSPOSE, &p);
  param_set_ints(&p, 0, (int64_t[]){3, 0, 1, 2}, 4);
  output(g, node(g, OP_TRANSPOSE, &c, 1, &p));
  /* merging (4, 8) cuts every row of 8 and the seam in each */
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, 0, (int64_t[]){1, 2, 32}, 3);
  output(g, node(g, OP_RESHAPE, &c, 1, &p));
  /* a pad adds its borders and shifts the seam */
  output(g, pad(g, c, (int64_t[]){0, 0, 1, 2, 0, 0, 0, 1}));
  int64_t want[][8] = {{3}, {2}, {2}, {3}, {3, 8, 11, 16, 19, 24, 27}, {2, 5, 10}};
  int n[] = {1, 1, 1, 1, 7, 3}, dim[] = {3, 3, 3, 0, 2, 3};
  for (int j = 0; j < 6; j++) {
    PetBoxes bx;
    CHECK(pet_boxes(g, j, &bx, &diag) == TEQ_OK);
    CHECK_MSG(points_are(&bx, dim[j], want[j], n[j]), "output %d", j);
    int64_t none = 0;
    for (int k = 0; k < bx.ndim; k++)
      none += k == dim[j] ? 0 : bx.n_points[k];
    CHECK_MSG(none == (j == 5 ? 1 : 0), "output %d: points on other dimensions", j);
    if (j == 5) CHECK(points_are(&bx, 2, (int64_t[]){1}, 1));
    pet_boxes_fini(&bx);
  }
  graph_free(g);
}

/* A weight's output channels become boxes only where they differ. */
static void test_boxes_const(void) {
  for (int differ = 0; differ < 2; differ++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(4, 1, 2, 5, 5));
    Shape ws = shape_of(4, 3, 2, 3, 3);
    Tensor *t = tensor_new(DT_F32, &ws);
    for (int64_t i = 0; i < tensor_numel(t); i++) ((float *)t->data)[i] = (float)(i % 18);
    if (differ) ((float *)t->data)[2 * 18 + 4] = 7; /* channel 2 */
    TensorRef w = {must(graph_add_const(g, "w", t, &diag)), 0};
    output(g, conv(g, x, w, 1, 1, 1, 1));
    PetBoxes b = boxes_of(g);
    CHECK(points_are(&b, 1, (int64_t[]){2}, differ));
    CHECK_EQ_INT(pet_degree(g), 1);
    pet_boxes_fini(&b);
    graph_free(g);
  }
}

static void test_boxes_unknown(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 2, 6, 6)), w = input(g, "w", shape_of(4, 2, 2, 3, 3));
  TensorRef y = conv(g, x, w, 1, 1, 1, 1);
  output(g, node(g, OP_RELU, &y, 1, NULL));
  PetBoxes b = boxes_of(g);
  CHECK(b.is_whole);
  CHECK_EQ_INT(pet_boxes_count(&b), 1);
  CHECK_MSG(strstr(b.why, "relu") != NULL, "why: %s", b.why);
  CHECK_EQ_INT(pet_degree(g), -1);
  pet_boxes_fini(&b);
  graph_free(g);
}

/* ---- tests and corrections ---- */

/* The original: conv2d(x, w, pad 1) on [1, 2, 6, 6], weights an input. */
static Graph *conv_graph(TensorRef *y, TensorRef *x, TensorRef *w) {
  Graph *g = graph_new();
  *x = input(g, "x", shape_of(4, 1, 2, 6, 6));
  *w = input(g, "w", shape_of(4, 2, 2, 3, 3));
  *y = conv(g, *x, *w, 1, 1, 1, 1);
  return g;
}

static PetReport compare(const Graph *a, const Graph *b, bool all) {
  PetTestOptions o = {.seed = 1234, .all_positions = all};
  PetReport rep;
  int rc = pet_compare(a, b, &o, &rep, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) {
    diag_flush(&diag, stderr);
    exit(1);
  }
  return rep;
}

static bool in_regions(const PetRegions *rg, int output, const int64_t *v, int nd) {
  for (int i = 0; i < rg->n; i++) {
    bool in = rg->v[i].output == output;
    for (int k = 0; k < nd && in; k++) in = v[k] >= rg->v[i].lo[k] && v[k] < rg->v[i].hi[k];
    if (in) return true;
  }
  return false;
}

/* Corrects mutant and checks that the result is the original everywhere,
 * and the mutant exactly outside the recomputed regions, which must be
 * disjoint and cover `expect` positions of output 0. */
static void check_correction(const Graph *orig, const Graph *mutant, const PetReport *rep,
                             PetRegions *rg, int64_t expect) {
  Graph *c = NULL;
  int rc = pet_correct(orig, mutant, rep, &c, rg, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) {
    diag_flush(&diag, stderr);
    return;
  }
  CHECK(graph_check(c, &diag) == TEQ_OK);
  CHECK(equal_everywhere(orig, c, 2, false));
  int64_t covered = 0;
  for (int i = 0; i < rg->n; i++) {
    int64_t n = 1;
    for (int k = 0; k < rg->v[i].ndim; k++) n *= rg->v[i].hi[k] - rg->v[i].lo[k];
    if (rg->v[i].output == 0) covered += n;
  }
  CHECK_EQ_INT(covered, expect);
  ExecDiff diff;
  if (exec_compare(mutant, c, EXEC_MODP, 5, 0, 0, &diff, &diag) == TEQ_OK) {
    const Tensor *t = diff.a;
    int64_t st[TEQ_MAX_DIMS], v[TEQ_MAX_DIMS], outside = 0, inside_same = 0;
    if (t) {
      shape_strides(&t->shape, st);
      for (int64_t f = 0; f < tensor_numel(t); f++) {
        for (int k = 0; k < t->shape.ndim; k++) v[k] = f / st[k] % t->shape.d[k];
        bool same = ((uint32_t *)diff.a->data)[f] == ((uint32_t *)diff.b->data)[f];
        bool in = in_regions(rg, diff.output, v, t->shape.ndim);
        outside += !same && !in;
        inside_same += same && in;
      }
    }
    CHECK_MSG(diff.differ == (expect > 0), "corrected vs mutant: differ %d", diff.differ);
    CHECK_EQ_INT(outside, 0);
    CHECK_EQ_INT(inside_same, 0);
    exec_diff_fini(&diff);
  }
  graph_free(c);
}

/* concat(conv(x, w1), conv(x, w2)) along channels (*a) and conv(x,
 * concat(w1, w2)) (*b), equal everywhere: x [1, 3, hw, hw], m1 and m2
 * output channels, 3x3 kernels, pads 1. */
static void merged_pair(Graph **a, Graph **b, int64_t hw, int64_t m1, int64_t m2) {
  Graph *gs[2] = {*a = graph_new(), *b = graph_new()};
  for (int i = 0; i < 2; i++) {
    Graph *g = gs[i];
    TensorRef x = input(g, "x", shape_of(4, 1, 3, hw, hw));
    TensorRef w1 = input(g, "w1", shape_of(4, m1, 3, 3, 3)), w2 = input(g, "w2", shape_of(4, m2, 3, 3, 3));
    if (i == 0) output(g, concat(g, conv(g, x, w1, 1, 1, 1, 1), conv(g, x, w2, 1, 1, 1, 1), 1));
    else output(g, conv(g, x, concat(g, w1, w2, 0), 1, 1, 1, 1));
  }
}

/* A conv padded by its dilation dl (*a) and the same conv unpadded, then
 * zero-padded (*b): equal inside, wrong on a border ring dl wide. x [1, c,
 * hw, hw], m output channels, 3x3 kernels. */
static void border_pair(Graph **a, Graph **b, int64_t c, int64_t hw, int64_t m, int dl) {
  Graph *gs[2] = {*a = graph_new(), *b = graph_new()};
  for (int i = 0; i < 2; i++) {
    TensorRef x = input(gs[i], "x", shape_of(4, 1, c, hw, hw)), w = input(gs[i], "w", shape_of(4, m, c, 3, 3));
    if (i == 0) output(gs[i], conv(gs[i], x, w, dl, 1, dl, 1));
    else output(gs[i], pad(gs[i], conv(gs[i], x, w, 0, 1, dl, 1), (int64_t[]){0, 0, dl, dl, 0, 0, dl, dl}));
  }
}

static void test_equal_mutants(void) {
  TensorRef y, x, w;
  Graph *a = conv_graph(&y, &x, &w), *b = graph_new();
  output(a, y);
  TensorRef bx = input(b, "x", shape_of(4, 1, 2, 6, 6)), bw = input(b, "w", shape_of(4, 2, 2, 3, 3));
  output(b, conv(b, pad(b, bx, (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}), bw, 0, 1, 1, 1));
  PetReport rep = compare(a, b, false);
  CHECK_EQ_INT(rep.n_differ, 0);
  CHECK_EQ_INT(rep.n_boxes, 9);
  CHECK_EQ_INT(rep.degree, 2);
  CHECK_EQ_INT(rep.trials, pet_default_trials(2));
  CHECK(rep.trials >= 2 && rep.log2_bound <= -60);
  CHECK_EQ_INT(pet_default_trials(1), 2); /* (1/p)^2 = 2^-62 */
  CHECK_EQ_INT(pet_default_trials(2), 3); /* (2/p)^2 is just above 2^-60 */
  /* Theorem 1: v0 plus a step along each axis wider than 1 (channels, and
   * H or W where the box is): 4 corners x 2, 4 edges x 3, the interior 4 */
  CHECK_EQ_INT(rep.out[0].n_positions, 4 * 2 + 4 * 3 + 4);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);

  merged_pair(&a, &b, 7, 2, 4);
  rep = compare(a, b, false);
  CHECK_EQ_INT(rep.n_differ, 0);
  CHECK_EQ_INT(rep.n_boxes, 18); /* channels {2} x H {1, 6} x W {1, 6} */
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);
}

/* conv pad 0 then a zero pad: right inside, wrong on the 8 border boxes. */
static void test_border_mutant(void) {
  TensorRef y, x, w;
  Graph *a = conv_graph(&y, &x, &w), *b = graph_new();
  output(a, y);
  TensorRef bx = input(b, "x", shape_of(4, 1, 2, 6, 6)), bw = input(b, "w", shape_of(4, 2, 2, 3, 3));
  output(b, pad(b, conv(b, bx, bw, 0, 1, 1, 1), (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}));
  for (int all = 0; all < 2; all++) {
    PetReport rep = compare(a, b, all);
    const PetOutputReport *o = &rep.out[0];
    CHECK(points_are(&o->boxes, 2, (int64_t[]){1, 5}, 2));
    CHECK(points_are(&o->boxes, 3, (int64_t[]){1, 5}, 2));
    CHECK_EQ_INT(o->n_boxes, 9);
    CHECK_EQ_INT(o->n_differ, 8);
    for (int i = 0; i < 9; i++) CHECK_MSG(o->differs[i] == (i != 4), "box %d", i);
    if (all) {
      pet_report_print(&rep, stdout);
      PetRegions rg = {0};
      check_correction(a, b, &rep, &rg, 2 * (36 - 16));
      CHECK_EQ_INT(rg.n, 4); /* top row, left, right, bottom row */
      pet_regions_fini(&rg);
    }
    pet_report_fini(&rep);
  }
  graph_free(a);
  graph_free(b);
}

/* Wrong everywhere (twice the conv): with stop_if_whole the test stops
 * after its first trial, with the same verdict; a mutant right in some box
 * runs every trial either way. */
static void test_stop_if_whole(void) {
  TensorRef y, x, w;
  Graph *a = conv_graph(&y, &x, &w), *b = graph_new();
  output(a, y);
  TensorRef bx = input(b, "x", shape_of(4, 1, 2, 6, 6)), bw = input(b, "w", shape_of(4, 2, 2, 3, 3));
  TensorRef c = conv(b, bx, bw, 1, 1, 1, 1);
  output(b, node(b, OP_EWADD, (TensorRef[]){c, c}, 2, NULL));
  for (int stop = 0; stop < 2; stop++) {
    PetTestOptions o = {.seed = 1234, .stop_if_whole = stop};
    PetReport rep;
    CHECK(pet_compare(a, b, &o, &rep, &diag) == TEQ_OK);
    printf("twice the conv, stop_if_whole %d: %d trials, %lld of %lld boxes differ\n", stop,
           rep.trials, (long long)rep.n_differ, (long long)rep.n_boxes);
    CHECK(rep.n_differ == rep.n_boxes && rep.n_boxes > 0);
    CHECK(stop ? rep.trials == 1 : rep.trials >= 2);
    pet_report_fini(&rep);
  }
  Graph *m = graph_new(); /* right inside, wrong on the border */
  TensorRef mx = input(m, "x", shape_of(4, 1, 2, 6, 6)), mw = input(m, "w", shape_of(4, 2, 2, 3, 3));
  output(m, pad(m, conv(m, mx, mw, 0, 1, 1, 1), (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1}));
  PetTestOptions o = {.seed = 1234, .stop_if_whole = true};
  PetReport rep;
  CHECK(pet_compare(a, m, &o, &rep, &diag) == TEQ_OK);
  CHECK(rep.trials >= 2 && rep.n_differ == 8);
  pet_report_fini(&rep);
  graph_free(m);
  graph_free(a);
  graph_free(b);
}

/* One cache of the original's runs shared by two threads, each testing
 * mutants in its own order, some at the positions of the one before
 * (the original's values there kept), some not: every verdict is the
 * one an uncached test gives. */
enum { SHARED_TESTS = 6 };
typedef struct SharedTests {
  const Graph *orig, *const *mutants;
  PetOrigRuns *runs;
  int order[SHARED_TESTS];
  PetReport rep[SHARED_TESTS];
  int rc[SHARED_TESTS];
  Diag d;
} SharedTests;

static void *shared_tests(void *arg) {
  SharedTests *s = arg;
  PetTestOptions o = {.seed = 99, .stop_if_whole = true};
  for (int i = 0; i < SHARED_TESTS; i++)
    s->rc[i] = pet_compare_cached(s->orig, s->mutants[s->order[i]], &o, &s->runs,
                                  &s->rep[i], &s->d);
  return NULL;
}

/* conv2d(x, w) on [1, 2, 24, 24], large enough that the tests run at
 * positions only (a quarter of the output or fewer): pad 1; pad 0 and the
 * border padded after; twice the conv; or cut in two along W and joined
 * again (the same values, tested at other positions: its boxes split W). */
static Graph *big_conv(int form) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 2, 24, 24));
  TensorRef w = input(g, "w", shape_of(4, 2, 2, 3, 3));
  TensorRef c = conv(g, x, w, form == 1 ? 0 : 1, 1, 1, 1);
  if (form == 1) c = pad(g, c, (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1});
  if (form == 2) c = node(g, OP_EWADD, (TensorRef[]){c, c}, 2, NULL);
  if (form == 3)
    c = concat(g, slice(g, c, (int64_t[]){0, 0, 0, 0}, (int64_t[]){1, 2, 24, 11}, NULL),
               slice(g, c, (int64_t[]){0, 0, 0, 11}, (int64_t[]){1, 2, 24, 24}, NULL), 3);
  output(g, c);
  return g;
}

static void test_shared_runs(void) {
  Graph *a = big_conv(0), *same = big_conv(0), *border = big_conv(1), *twice = big_conv(2),
        *cut = big_conv(3);
  const Graph *mutants[4] = {same, border, twice, cut};
  PetOrigRuns *runs = pet_orig_runs_new(a, 99);
  SharedTests s[2] = {{.orig = a, .mutants = mutants, .runs = runs, .order = {0, 3, 1, 3, 2, 0}},
                      {.orig = a, .mutants = mutants, .runs = runs, .order = {3, 2, 0, 3, 1, 0}}};
  diag_init(&s[0].d), diag_init(&s[1].d);
  pthread_t other;
  bool started = pthread_create(&other, NULL, shared_tests, &s[1]) == 0;
  shared_tests(&s[0]);
  if (started) pthread_join(other, NULL);
  else shared_tests(&s[1]);
  PetTestOptions o = {.seed = 99, .stop_if_whole = true};
  for (int t = 0; t < 2; t++)
    for (int i = 0; i < SHARED_TESTS; i++) {
      PetReport want;
      CHECK_EQ_INT(s[t].rc[i], TEQ_OK);
      CHECK(pet_compare(a, mutants[s[t].order[i]], &o, &want, &diag) == TEQ_OK);
      CHECK_MSG(s[t].rep[i].n_differ == want.n_differ && s[t].rep[i].n_boxes == want.n_boxes &&
                    s[t].rep[i].trials == want.trials,
                "thread %d test %d (mutant %d): %lld of %lld boxes differ in %d trials, uncached "
                "%lld of %lld in %d", t, i, s[t].order[i], (long long)s[t].rep[i].n_differ,
                (long long)s[t].rep[i].n_boxes, s[t].rep[i].trials, (long long)want.n_differ,
                (long long)want.n_boxes, want.trials);
      CHECK(s[t].order[i] % 3 == 0 ? want.n_differ == 0 : want.n_differ > 0);
      pet_report_fini(&want);
      pet_report_fini(&s[t].rep[i]);
    }
  diag_fini(&s[0].d), diag_fini(&s[1].d);
  pet_orig_runs_free(runs);
  graph_free(same), graph_free(border), graph_free(twice), graph_free(cut);
  graph_free(a);
}

/* Wrong in one column, every row: the column crosses the conv's three row
 * intervals (H points {1, 5}), and the correction recomputes it as one
 * region, not one per interval. */
static void test_column_mutant(void) {
  TensorRef y, x, w, by, bxx, bw;
  Graph *a = conv_graph(&y, &x, &w), *b = conv_graph(&by, &bxx, &bw);
  output(a, y);
  output(b, double_region(b, by, (int64_t[]){0, 0, 0, 2}, (int64_t[]){1, 2, 6, 3}));
  PetReport rep = compare(a, b, false);
  const PetOutputReport *o = &rep.out[0];
  CHECK(points_are(&o->boxes, 2, (int64_t[]){1, 5}, 2));
  CHECK_EQ_INT(o->n_differ, 3);
  PetRegions rg = {0};
  check_correction(a, b, &rep, &rg, 2 * 6);
  CHECK_EQ_INT(rg.n, 1);
  if (rg.n == 1) {
    const PetRegion *r = &rg.v[0];
    CHECK(r->lo[2] == 0 && r->hi[2] == 6 && r->lo[3] == 2 && r->hi[3] == 3);
  }
  pet_regions_fini(&rg);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);
}

/* Wrong in the top-left corner box only, two ways: the corner of the conv
 * doubled, and a constant added that is non-zero only there. */
static void test_corner_mutant(void) {
  for (int way = 0; way < 2; way++) {
    TensorRef y, x, w, by, bxx, bw;
    Graph *a = conv_graph(&y, &x, &w), *b = conv_graph(&by, &bxx, &bw);
    output(a, y);
    if (way == 0) {
      output(b, double_region(b, by, (int64_t[]){0, 0, 0, 0}, (int64_t[]){1, 2, 1, 1}));
    } else {
      Shape s = shape_of(4, 1, 2, 6, 6);
      Tensor *t = tensor_new(DT_F32, &s);
      ((float *)t->data)[0] = 3, ((float *)t->data)[36] = 3;
      output(b, add(b, by, (TensorRef){must(graph_add_const(b, "c", t, &diag)), 0}));
    }
    PetReport rep = compare(a, b, false);
    const PetOutputReport *o = &rep.out[0];
    CHECK_EQ_INT(o->n_boxes, 9);
    CHECK_EQ_INT(o->n_differ, 1);
    CHECK(o->differs[0] == 1);
    PetRegions rg = {0};
    check_correction(a, b, &rep, &rg, 2);
    CHECK_EQ_INT(rg.n, 1);
    if (rg.n == 1) {
      const PetRegion *r = &rg.v[0];
      CHECK(r->lo[0] == 0 && r->hi[0] == 1 && r->lo[1] == 0 && r->hi[1] == 2);
      CHECK(r->lo[2] == 0 && r->hi[2] == 1 && r->lo[3] == 0 && r->hi[3] == 1);
    }
    pet_regions_fini(&rg);
    pet_report_fini(&rep);
    graph_free(a);
    graph_free(b);
  }
}

/* Regions of strided, grouped and dilated convolutions and of a batched
 * matmul, rebuilt from slices of their inputs. */
static void test_corrections(void) {
  /* stride 2, groups 2, channels 1..3 (two groups) doubled in rows 0..2 */
  Graph *a = graph_new(), *b = graph_new();
  Graph *gs[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    TensorRef x = input(gs[i], "x", shape_of(4, 1, 4, 9, 9)), w = input(gs[i], "w", shape_of(4, 4, 2, 3, 3));
    TensorRef y = conv(gs[i], x, w, 1, 2, 1, 2);
    output(gs[i], i ? double_region(gs[i], y, (int64_t[]){0, 1, 0, 3}, (int64_t[]){1, 3, 2, 5}) : y);
  }
  PetReport rep = compare(a, b, true);
  CHECK(rep.n_differ > 0);
  PetRegions rg = {0};
  check_correction(a, b, &rep, &rg, 2 * 2 * 2);
  pet_regions_fini(&rg);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);

  /* dilation 2, pad 2: a pad 0 conv re-padded is wrong on a ring 2 wide */
  border_pair(&a, &b, 2, 7, 3, 2);
  rep = compare(a, b, true);
  CHECK_EQ_INT(rep.n_differ, 8);
  check_correction(a, b, &rep, &rg, 3 * (49 - 9));
  pet_regions_fini(&rg);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);

  /* batched matmul [2, 5, 4] x [4, 6]: rows 3..5 computed with B + B */
  a = graph_new(), b = graph_new();
  gs[0] = a, gs[1] = b;
  for (int i = 0; i < 2; i++) {
    Graph *g = gs[i];
    TensorRef A = input(g, "A", shape_of(3, 2, 5, 4)), B = input(g, "B", shape_of(2, 4, 6));
    if (i == 0) {
      output(g, node(g, OP_MATMUL, (TensorRef[]){A, B}, 2, NULL));
    } else {
      TensorRef top = slice(g, A, (int64_t[]){0, 0, 0}, (int64_t[]){2, 3, 4}, NULL);
      TensorRef bot = slice(g, A, (int64_t[]){0, 3, 0}, (int64_t[]){2, 5, 4}, NULL);
      TensorRef mt = node(g, OP_MATMUL, (TensorRef[]){top, B}, 2, NULL);
      TensorRef mb = node(g, OP_MATMUL, (TensorRef[]){bot, add(g, B, B)}, 2, NULL);
      output(g, concat(g, mt, mb, 1));
    }
  }
  rep = compare(a, b, true);
  CHECK_EQ_INT(rep.n_differ, 1);
  check_correction(a, b, &rep, &rg, 2 * 2 * 6);
  CHECK_EQ_INT(rg.n, 1);
  pet_regions_fini(&rg);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);
}

static TensorRef reshape(Graph *g, TensorRef x, Shape s) {
  Params p;
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, 0, s.d, s.ndim);
  return node(g, OP_RESHAPE, &x, 1, &p);
}

static TensorRef transpose(Graph *g, TensorRef x, const int64_t *perm, int r) {
  Params p;
  params_default(OP_TRANSPOSE, &p);
  param_set_ints(&p, 0, perm, r);
  return node(g, OP_TRANSPOSE, &x, 1, &p);
}

/* PET's Figure 1: two images side by side along the width, one conv, then
 * apart again. Wrong only at the seam: image 0's last column and image 1's
 * first read each other instead of the padding. */
static void test_figure1_mutant(void) {
  enum { C = 2, M = 3, H = 5, W = 6 };
  Graph *a = graph_new(), *b = graph_new();
  Graph *gs[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    Graph *g = gs[i];
    TensorRef x = input(g, "x", shape_of(4, 2, C, H, W)), w = input(g, "w", shape_of(4, M, C, 3, 3));
    if (i == 0) {
      output(g, conv(g, x, w, 1, 1, 1, 1));
      continue;
    }
    TensorRef t = reshape(g, x, shape_of(5, 1, 2, C, H, W));
    t = transpose(g, t, (int64_t[]){0, 2, 3, 1, 4}, 5);
    t = conv(g, reshape(g, t, shape_of(4, 1, C, H, 2 * W)), w, 1, 1, 1, 1);
    t = transpose(g, reshape(g, t, shape_of(5, 1, M, H, 2, W)), (int64_t[]){0, 3, 1, 2, 4}, 5);
    output(g, reshape(g, t, shape_of(4, 2, M, H, W)));
  }
  PetReport rep = compare(a, b, true);
  const PetOutputReport *o = &rep.out[0];
  CHECK(points_are(&o->boxes, 0, (int64_t[]){1}, 1));
  CHECK(points_are(&o->boxes, 2, (int64_t[]){1, H - 1}, 2));
  CHECK(points_are(&o->boxes, 3, (int64_t[]){1, W - 1}, 2));
  CHECK_EQ_INT(o->n_boxes, 18);
  CHECK_EQ_INT(o->n_differ, 6);
  for (int64_t i = 0; i < o->n_boxes; i++) {
    int64_t lo[4], hi[4];
    pet_box_bounds(&o->boxes, i, lo, hi);
    bool seam = (lo[0] == 0 && lo[3] == W - 1) || (lo[0] == 1 && hi[3] == 1);
    CHECK_MSG(o->differs[i] == seam, "box %lld", (long long)i);
  }
  PetRegions rg = {0};
  check_correction(a, b, &rep, &rg, 2 * M * H);
  pet_regions_fini(&rg);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);
}

static void test_bad_input(void) {
  TensorRef y, x, w;
  Graph *a = conv_graph(&y, &x, &w), *b = graph_new();
  output(a, y);
  TensorRef bx = input(b, "x", shape_of(4, 1, 2, 6, 6)), bw = input(b, "w", shape_of(4, 2, 2, 3, 3));
  output(b, conv(b, bx, bw, 0, 1, 1, 1));
  PetTestOptions o = {.seed = 1};
  PetReport rep;
  Diag d;
  diag_init(&d);
  CHECK_EQ_INT(pet_compare(a, b, &o, &rep, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "[1, 2, 6, 6]") && strstr(diag_last(&d), "[1, 2, 4, 4]"),
            "message: %s", diag_last(&d));
  diag_fini(&d);
  graph_free(b);

  /* an operator the correction cannot rebuild is refused, not miscorrected */
  b = graph_new();
  Graph *c = graph_new();
  TensorRef cx = input(c, "x", shape_of(4, 1, 2, 6, 6)), cw = input(c, "w", shape_of(4, 2, 2, 3, 3));
  output(c, node(c, OP_RELU, (TensorRef[]){conv(c, cx, cw, 1, 1, 1, 1)}, 1, NULL));
  bx = input(b, "x", shape_of(4, 1, 2, 6, 6)), bw = input(b, "w", shape_of(4, 2, 2, 3, 3));
  TensorRef z = pad(b, conv(b, bx, bw, 0, 1, 1, 1), (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1});
  output(b, node(b, OP_RELU, &z, 1, NULL));
  rep = compare(c, b, false);
  CHECK_EQ_INT(rep.n_boxes, 1);
  CHECK_EQ_INT(rep.n_differ, 1);
  CHECK_EQ_INT(rep.n_positions, 72);
  CHECK_EQ_INT(rep.degree, -1);
  Graph *fixed = NULL;
  diag_init(&d);
  CHECK_EQ_INT(pet_correct(c, b, &rep, &fixed, NULL, &d), TEQ_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(diag_last(&d), "relu") != NULL, "message: %s", diag_last(&d));
  CHECK(fixed == NULL);
  diag_fini(&d);
  pet_report_fini(&rep);
  graph_free(a);
  graph_free(b);
  graph_free(c);
}

/* At a size where the tested positions are a sliver of the output (45 of
 * 2048), both programs run at those positions alone (exec_points); the
 * verdicts must be the whole runs': the border mutant wrong in its 8
 * border boxes, the merged convolutions right everywhere. */
static void test_positions_only(void) {
  Graph *a, *b;
  border_pair(&a, &b, 4, 16, 8, 1);
  PetReport at = compare(a, b, false), all = compare(a, b, true);
  CHECK_EQ_INT(at.out[0].n_boxes, 9);
  CHECK_EQ_INT(at.out[0].n_differ, 8);
  for (int i = 0; i < 9; i++) CHECK_MSG(at.out[0].differs[i] == all.out[0].differs[i], "box %d", i);
  CHECK_EQ_INT(at.out[0].differs[4], 0);
  pet_report_fini(&at);
  pet_report_fini(&all);
  graph_free(a);
  graph_free(b);

  merged_pair(&a, &b, 12, 4, 6);
  at = compare(a, b, false);
  CHECK_EQ_INT(at.n_boxes, 18);
  CHECK_EQ_INT(at.n_differ, 0);
  pet_report_fini(&at);
  graph_free(a);
  graph_free(b);
}

int main(void) {
  diag_init(&diag);
  test_boxes_conv();
  test_boxes_layout();
  test_boxes_const();
  test_boxes_unknown();
  test_equal_mutants();
  test_border_mutant();
  test_positions_only();
  test_stop_if_whole();
  test_shared_runs();
  test_corner_mutant();
  test_column_mutant();
  test_corrections();
  test_figure1_mutant();
  test_bad_input();
  diag_flush(&diag, stderr);
  diag_fini(&diag);
  return check_exit();
}
