/* test_pet_mutate.c: PET's mutation generator (optimize/pet/pet.h,
 * pet_mutate).
 *
 * For each of PET's four example families the original is built at small
 * odd-ish shapes and the family's mutant must be among those generated,
 * recognised by its description and its operator kinds: batch -> width
 * around a conv (Fig. 1, wrong only at the seam, which pet_correct fixes),
 * dilated conv -> dilation 1 on phase images (Fig. 3), two convs -> one
 * conv on concatenated, zero-padded kernels and a split (Fig. 10a), and a
 * stride-2 conv -> stride 1 on space-to-depth input and kernel (exact);
 * and the cut into pieces with halos that fuses a seam's correction into
 * the conv (Fig. 6, exact).
 * Every mutant must have the original's output shapes and pass
 * graph_check; the exact ones, and the corrected inexact ones, must equal
 * the original at every position in Z_p and within 1e-4 in float32. */
#include <string.h>

#include "optimize/pet/pet.h"
#include "tests/optimize/pet_graphs.h"

/* The mutants of g, tested by three threads; one thread must find the
 * same ones, with the same verdicts. */
static PetMutant *mutate(const Graph *g, int depth, int max, int *n) {
  PetMutateOptions o = {.depth = depth, .max_mutants = max, .seed = 77, .jobs = 3};
  PetMutant *m = NULL, *one = NULL;
  int n_one = 0;
  *n = 0;
  int rc = pet_mutate(g, &o, &m, n, &diag);
  o.jobs = 1;
  if (rc == TEQ_OK) rc = pet_mutate(g, &o, &one, &n_one, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) {
    diag_flush(&diag, stderr);
    exit(1);
  }
  CHECK_EQ_INT(n_one, *n);
  for (int i = 0; i < n_one && i < *n; i++) {
    CHECK_MSG(!strcmp(one[i].desc, m[i].desc), "mutant %d: %s / %s", i, one[i].desc, m[i].desc);
    CHECK(one[i].report.n_differ == m[i].report.n_differ);
    CHECK(graph_hash(one[i].graph, NULL) == graph_hash(m[i].graph, NULL));
  }
  pet_mutants_free(one, n_one);
  return m;
}

/* Only these kinds compute in g (sources aside). */
static bool kinds_within(const Graph *g, const OpKind *ok, int n_ok) {
  for (int i = 0; i < g->n_nodes; i++) {
    OpKind k = g->nodes[i].kind;
    bool found = op_def(k)->flags & OPF_SOURCE;
    for (int j = 0; j < n_ok && !found; j++) found = ok[j] == k;
    if (!found) return false;
  }
  return true;
}

static const Node *the_conv(const Graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind == OP_CONV2D) return &g->nodes[i];
  return NULL;
}

static int64_t conv_param(const Node *n, const char *name, int k) {
  return n->params.v[param_index(OP_CONV2D, name)].i[k];
}

/* The first mutant whose description holds every one of words (NULL-ended). */
static PetMutant *find(PetMutant *m, int n, const char *const *words) {
  for (int i = 0; i < n; i++) {
    bool all = true;
    for (int j = 0; words[j] && all; j++) all = strstr(m[i].desc, words[j]) != NULL;
    if (all) return &m[i];
  }
  return NULL;
}

/* Every mutant: the original's output shapes, a valid graph, neither the
 * original nor another mutant, and no output wrong in every box. */
static void check_all(const Graph *orig, PetMutant *m, int n) {
  uint64_t h0 = graph_hash(orig, NULL);
  for (int i = 0; i < n; i++) {
    const Graph *g = m[i].graph;
    CHECK_MSG(g->n_outputs == orig->n_outputs, "mutant %d: %s", i, m[i].desc);
    for (int j = 0; j < g->n_outputs && j < orig->n_outputs; j++)
      CHECK_MSG(shape_equal(graph_shape(g, g->outputs[j]), graph_shape(orig, orig->outputs[j])),
                "mutant %d output %d: %s", i, j, m[i].desc);
    CHECK_MSG(graph_check(g, &diag) == TEQ_OK, "mutant %d: %s", i, m[i].desc);
    CHECK(g->n_inputs == orig->n_inputs);
    uint64_t h = graph_hash(g, NULL);
    CHECK_MSG(h != h0, "mutant %d is the original: %s", i, m[i].desc);
    for (int k = 0; k < i; k++) CHECK_MSG(h != graph_hash(m[k].graph, NULL), "%d = %d", i, k);
    for (int j = 0; j < m[i].report.n_outputs; j++)
      CHECK_MSG(m[i].report.out[j].n_differ < m[i].report.out[j].n_boxes, "mutant %d output %d: %s",
                i, j, m[i].desc);
  }
  diag_flush(&diag, stderr);
}

static void print_all(const char *what, PetMutant *m, int n) {
  printf("%s: %d mutants\n", what, n);
  for (int i = 0; i < n; i++)
    printf("  %s  (%lld of %lld boxes differ)\n", m[i].desc, (long long)m[i].report.n_differ,
           (long long)m[i].report.n_boxes);
}

/* PET's Figure 1 found, not built: the two images of a [2, 3, 6, 7] batch
 * side by side along W, one conv, apart again. Wrong exactly at the seam
 * (image 0's last column, image 1's first), right after pet_correct. */
static void test_batch_to_width(void) {
  enum { N = 2, C = 3, H = 6, W = 7, M = 4 };
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, N, C, H, W)), w = input(g, "w", shape_of(4, M, C, 3, 3));
  output(g, conv(g, x, w, 1, 1, 1, 1));
  int n;
  PetMutant *m = mutate(g, 0, 0, &n);
  print_all("conv [2, 3, 6, 7]", m, n);
  check_all(g, m, n);
  PetMutant *f = find(m, n, (const char *[]){"batch/2 -> W side by side", "W/2 -> batch", NULL});
  CHECK(f != NULL);
  if (f) {
    const Graph *mg = f->graph;
    CHECK_EQ_INT(count_kind(mg, OP_CONV2D), 1);
    CHECK_EQ_INT(count_kind(mg, OP_TRANSPOSE), 2);
    CHECK(kinds_within(mg, (OpKind[]){OP_CONV2D, OP_RESHAPE, OP_TRANSPOSE}, 3));
    CHECK(the_conv(mg) && graph_shape(mg, (TensorRef){(int)(the_conv(mg) - mg->nodes), 0})->d[3] == 2 * W);
    const PetOutputReport *o = &f->report.out[0];
    CHECK(o->n_differ > 0);
    int64_t seam_boxes = 0;
    for (int64_t i = 0; i < o->n_boxes; i++) {
      int64_t lo[4], hi[4];
      pet_box_bounds(&o->boxes, i, lo, hi);
      bool seam = (lo[0] == 0 && lo[3] == W - 1) || (lo[0] == 1 && hi[3] == 1);
      seam_boxes += seam;
      CHECK_MSG(o->differs[i] == seam, "box %lld", (long long)i);
    }
    CHECK_EQ_INT(o->n_differ, seam_boxes);
    CHECK(!equal_everywhere(g, mg, 2, true)); /* the seam really is wrong */
    Graph *c = NULL;
    PetRegions rg = {0};
    CHECK(pet_correct(g, mg, &f->report, &c, &rg, &diag) == TEQ_OK);
    if (c) {
      CHECK(graph_check(c, &diag) == TEQ_OK);
      CHECK(equal_everywhere(g, c, 2, false));
      int64_t covered = 0;
      for (int i = 0; i < rg.n; i++) {
        int64_t k = 1;
        for (int j = 0; j < rg.v[i].ndim; j++) k *= rg.v[i].hi[j] - rg.v[i].lo[j];
        covered += k;
      }
      CHECK_EQ_INT(covered, 2 * M * H); /* one column of each image */
    }
    pet_regions_fini(&rg);
    graph_free(c);
  }
  /* the family needs three operators */
  pet_mutants_free(m, n);
  m = mutate(g, 2, 0, &n);
  CHECK(find(m, n, (const char *[]){"side by side", NULL}) == NULL);
  pet_mutants_free(m, n);
  m = mutate(g, 3, 1, &n);
  CHECK_EQ_INT(n, 1);
  pet_mutants_free(m, n);
  graph_free(g);
}

/* PET's Figure 3: dilation 2 on [1, 2, 8, 8] is dilation 1 on the four
 * phase images (pads 2 -> 1), exact. */
static void test_dilated(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 2, 8, 8)), w = input(g, "w", shape_of(4, 3, 2, 3, 3));
  output(g, conv(g, x, w, 2, 1, 2, 1));
  int n;
  PetMutant *m = mutate(g, 0, 0, &n);
  print_all("dilated conv [1, 2, 8, 8]", m, n);
  check_all(g, m, n);
  PetMutant *f =
      find(m, n, (const char *[]){"H,W phases 2 -> batch", "batch -> H,W phases 2", NULL});
  CHECK(f != NULL);
  if (f) {
    const Graph *mg = f->graph;
    CHECK(kinds_within(mg, (OpKind[]){OP_CONV2D, OP_RESHAPE, OP_TRANSPOSE}, 3));
    const Node *cv = the_conv(mg);
    CHECK_EQ_INT(count_kind(mg, OP_CONV2D), 1);
    CHECK(cv && conv_param(cv, "dilation", 0) == 1 && conv_param(cv, "dilation", 1) == 1);
    CHECK(cv && graph_shape(mg, cv->in[0])->d[0] == 4); /* the phases are the batch */
    CHECK_EQ_INT(f->report.n_differ, 0);
    CHECK(f->report.n_boxes > 1);
    CHECK(equal_everywhere(g, mg, 2, false));
  }
  pet_mutants_free(m, n);
  graph_free(g);
}

/* PET's Figure 10a on one input: convs 3x3 (4 channels) and 1x1 (6) become
 * one conv on the concatenation of the first kernel and the second, zero-
 * padded to 3x3, and a split. Exact. */
static void test_merged_convs(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 3, 5, 5));
  TensorRef w1 = input(g, "w1", shape_of(4, 4, 3, 3, 3)), w2 = input(g, "w2", shape_of(4, 6, 3, 1, 1));
  output(g, conv(g, x, w1, 1, 1, 1, 1));
  output(g, conv(g, x, w2, 0, 1, 1, 1));
  int n;
  PetMutant *m = mutate(g, 0, 0, &n);
  print_all("two convs [1, 3, 5, 5]", m, n);
  check_all(g, m, n);
  PetMutant *f = find(m, n, (const char *[]){"zero-padded to 3x3", "concatenated", "split", NULL});
  CHECK(f != NULL);
  if (f) {
    const Graph *mg = f->graph;
    CHECK(kinds_within(mg, (OpKind[]){OP_CONV2D, OP_PAD, OP_CONCAT, OP_SPLIT}, 4));
    CHECK_EQ_INT(count_kind(mg, OP_CONV2D), 1);
    CHECK_EQ_INT(count_kind(mg, OP_SPLIT), 1);
    const Node *cv = the_conv(mg);
    CHECK(cv && shape_equal(graph_shape(mg, cv->in[1]), &(Shape){4, {10, 3, 3, 3}}));
    CHECK(cv && mg->nodes[cv->in[1].node].kind == OP_CONCAT);
    CHECK_EQ_INT(f->report.n_differ, 0);
    CHECK(equal_everywhere(g, mg, 2, false));
  }
  pet_mutants_free(m, n);
  graph_free(g);
}

/* Two independent convs of one shape on different inputs (PET section
 * 6.1, Inception's parallel branches): the inputs concatenated along
 * channels, the kernels along their outputs (the 1x1 zero-padded to 3x3),
 * one conv with twice the groups and a split. Exact. The same for two
 * depthwise convs (groups 4 -> 8), as in NasNet's parallel separable
 * convolutions. */
static void test_independent_convs(void) {
  struct { int c, m, k2, groups; } cases[] = {{4, 5, 1, 1}, {4, 4, 3, 4}};
  for (int t = 0; t < 2; t++) {
    int c = cases[t].c, m = cases[t].m, k2 = cases[t].k2, groups = cases[t].groups;
    Graph *g = graph_new();
    TensorRef x1 = input(g, "x1", shape_of(4, 1, c, 6, 5)), x2 = input(g, "x2", shape_of(4, 1, c, 6, 5));
    TensorRef w1 = input(g, "w1", shape_of(4, m, c / groups, 3, 3));
    TensorRef w2 = input(g, "w2", shape_of(4, m, c / groups, k2, k2));
    output(g, conv(g, x1, w1, 1, 1, 1, groups));
    output(g, conv(g, x2, w2, k2 / 2, 1, 1, groups));
    int n;
    PetMutant *m_ = mutate(g, 0, 0, &n);
    print_all(groups > 1 ? "two depthwise convs on two inputs" : "two convs on two inputs", m_, n);
    check_all(g, m_, n);
    PetMutant *f = find(m_, n, (const char *[]){"inputs concatenated on axis 1",
                                                "kernels concatenated", "split", NULL});
    CHECK(f != NULL);
    if (f) {
      const Graph *mg = f->graph;
      CHECK_EQ_INT(count_kind(mg, OP_CONV2D), 1);
      const Node *cv = the_conv(mg);
      CHECK(cv && conv_param(cv, "groups", 0) == 2 * groups);
      CHECK(cv && shape_equal(graph_shape(mg, cv->in[0]), &(Shape){4, {1, 2 * c, 6, 5}}));
      CHECK(cv && shape_equal(graph_shape(mg, cv->in[1]), &(Shape){4, {2 * m, c / groups, 3, 3}}));
      CHECK_EQ_INT(f->report.n_differ, 0);
      CHECK(equal_everywhere(g, mg, 2, false));
    }
    pet_mutants_free(m_, n);
    graph_free(g);
  }
  /* a stride that differs: no grouped conv can compute both */
  Graph *g = graph_new();
  TensorRef x1 = input(g, "x1", shape_of(4, 1, 4, 5, 5)), x2 = input(g, "x2", shape_of(4, 1, 4, 5, 5));
  output(g, conv(g, x1, input(g, "w1", shape_of(4, 4, 4, 3, 3)), 1, 2, 1, 1));
  output(g, conv(g, x2, input(g, "w2", shape_of(4, 4, 4, 3, 3)), 0, 1, 1, 1));
  int n;
  PetMutant *m_ = mutate(g, 0, 0, &n);
  check_all(g, m_, n);
  CHECK(find(m_, n, (const char *[]){"inputs concatenated", NULL}) == NULL);
  pet_mutants_free(m_, n);
  graph_free(g);
}

/* Stride 2 on [1, 2, 8, 8] (3x3, pads 1): the input zero-padded to 10x10
 * and its kernel to 4x4, both space-to-depth, one stride-1 2x2 conv. */
static void test_strided(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 2, 8, 8)), w = input(g, "w", shape_of(4, 3, 2, 3, 3));
  output(g, conv(g, x, w, 1, 2, 1, 1));
  int n;
  PetMutant *m = mutate(g, 0, 0, &n);
  print_all("strided conv [1, 2, 8, 8]", m, n);
  check_all(g, m, n);
  PetMutant *f = find(m, n, (const char *[]){"layout pad (1 1 1 1), space-to-depth 2",
                                             "kernel pad (0 0 1 1), space-to-depth 2", NULL});
  CHECK(f != NULL);
  if (f) {
    const Graph *mg = f->graph;
    CHECK(kinds_within(mg, (OpKind[]){OP_CONV2D, OP_PAD, OP_RESHAPE, OP_TRANSPOSE}, 4));
    const Node *cv = the_conv(mg);
    CHECK_EQ_INT(count_kind(mg, OP_CONV2D), 1);
    CHECK(cv && conv_param(cv, "stride", 0) == 1 && conv_param(cv, "stride", 1) == 1);
    CHECK(cv && shape_equal(graph_shape(mg, cv->in[0]), &(Shape){4, {1, 8, 5, 5}}));
    CHECK(cv && shape_equal(graph_shape(mg, cv->in[1]), &(Shape){4, {3, 8, 2, 2}}));
    CHECK_EQ_INT(f->report.n_differ, 0);
    CHECK(equal_everywhere(g, mg, 2, false));
  }
  pet_mutants_free(m, n);
  graph_free(g);
}

/* PET's correction fusion (Fig. 6) as the generator builds it: H cut into
 * two pieces that each hold the rows their half of the output reads (the
 * halo), concatenated along the batch, one conv with no H pads, the halves
 * side by side again. Exact, where the plain cut (H/2 -> batch) is wrong at
 * the seam: the rows a correction conv would read are in the pieces. At
 * stride 1, stride 2 and dilation 2. */
static void test_halos(void) {
  static const struct {
    int64_t h, w, k;
    int pad, stride, dil;
    int64_t len; /* rows per piece */
  } cases[] = {
    {10, 7, 3, 1, 1, 1, 7},  /* 5 output rows a piece read 5 + 2 */
    {12, 10, 5, 2, 2, 1, 9}, /* 3 rows at stride 2 read 2 * 2 + 5 */
    {8, 8, 3, 2, 1, 2, 8},   /* 4 rows at dilation 2 read 3 + 5 */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", shape_of(4, 1, 2, cases[i].h, cases[i].w));
    TensorRef w = input(g, "w", shape_of(4, 3, 2, cases[i].k, cases[i].k));
    output(g, conv(g, x, w, cases[i].pad, cases[i].stride, cases[i].dil, 1));
    int n;
    PetMutant *m = mutate(g, 0, 0, &n);
    print_all("conv with halos", m, n);
    check_all(g, m, n);
    PetMutant *f = find(m, n, (const char *[]){"H/2 -> batch with halos", NULL});
    CHECK_MSG(f != NULL, "case %zu", i);
    if (f) {
      const Graph *mg = f->graph;
      CHECK(kinds_within(mg, (OpKind[]){OP_CONV2D, OP_PAD, OP_CONCAT, OP_RESHAPE, OP_TRANSPOSE},
                         5));
      CHECK_EQ_INT(count_kind(mg, OP_CONV2D), 1);
      const Node *cv = the_conv(mg);
      CHECK(cv && conv_param(cv, "pads", 0) == 0 && conv_param(cv, "pads", 2) == 0);
      CHECK(cv && conv_param(cv, "pads", 1) == cases[i].pad);
      CHECK(cv && shape_equal(graph_shape(mg, cv->in[0]),
                              &(Shape){4, {2, 2, cases[i].len, cases[i].w}}));
      CHECK_EQ_INT(f->report.n_differ, 0);
      CHECK(equal_everywhere(g, mg, 2, false));
    }
    /* the plain cut is wrong at the seam */
    PetMutant *plain = find(m, n, (const char *[]){"H/2 -> batch,", NULL});
    CHECK_MSG(!plain || plain->report.n_differ > 0, "case %zu", i);
    pet_mutants_free(m, n);
    graph_free(g);
  }
}

/* Weights as constants: the mutant keeps them (transformed by weight-only
 * operators) and is still exact. */
static void test_const_weights(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 2, 8, 8));
  Shape ws = shape_of(4, 3, 2, 3, 3);
  Tensor *t = tensor_new(DT_F32, &ws);
  for (int64_t i = 0; i < tensor_numel(t); i++) ((float *)t->data)[i] = (float)(i % 7) - 3;
  TensorRef w = {must(graph_add_const(g, "w", t, &diag)), 0};
  output(g, conv(g, x, w, 1, 2, 1, 1));
  int n;
  PetMutant *m = mutate(g, 0, 0, &n);
  check_all(g, m, n);
  PetMutant *f = find(m, n, (const char *[]){"kernel pad (0 0 1 1), space-to-depth 2", NULL});
  CHECK(f != NULL);
  if (f) {
    CHECK_EQ_INT(count_kind(f->graph, OP_CONST), 1);
    CHECK_EQ_INT(f->report.n_differ, 0);
    CHECK(equal_everywhere(g, f->graph, 2, false));
  }
  pet_mutants_free(m, n);
  graph_free(g);
}

/* Two matmuls reading the same A: one matmul on the concatenated B's and a
 * split (the merge family beyond convs). */
static void test_merged_matmuls(void) {
  Graph *g = graph_new();
  TensorRef a = input(g, "a", shape_of(2, 5, 4));
  TensorRef b1 = input(g, "b1", shape_of(2, 4, 3)), b2 = input(g, "b2", shape_of(2, 4, 6));
  for (int i = 0; i < 2; i++)
    output(g, (TensorRef){must(graph_add_node(g, OP_MATMUL, (TensorRef[]){a, i ? b2 : b1}, 2, 1,
                                              NULL, NULL, &diag)), 0});
  int n;
  PetMutant *m = mutate(g, 0, 0, &n);
  print_all("two matmuls [5, 4]", m, n);
  check_all(g, m, n);
  PetMutant *f = find(m, n, (const char *[]){"concatenated on axis 1", "split on axis 1", NULL});
  CHECK(f != NULL);
  if (f) {
    CHECK_EQ_INT(count_kind(f->graph, OP_MATMUL), 1);
    CHECK_EQ_INT(f->report.n_differ, 0);
    CHECK(equal_everywhere(g, f->graph, 2, false));
  }
  pet_mutants_free(m, n);
  graph_free(g);
}

static void test_bad_input(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 2, 6, 6)), w = input(g, "w", shape_of(4, 2, 2, 3, 3));
  TensorRef y = conv(g, x, w, 1, 1, 1, 1);
  output(g, (TensorRef){must(graph_add_node(g, OP_RELU, &y, 1, 1, NULL, NULL, &diag)), 0});
  Diag d;
  diag_init(&d);
  PetMutant *m = (PetMutant *)&d; /* must stay untouched */
  int n = -7;
  CHECK_EQ_INT(pet_mutate(g, NULL, &m, &n, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "relu") != NULL, "message: %s", diag_last(&d));
  CHECK(m == (PetMutant *)&d && n == -7);
  diag_fini(&d);
  graph_free(g);

  /* a conv with a fused activation is not multi-linear either */
  g = graph_new();
  x = input(g, "x", shape_of(4, 1, 2, 6, 6)), w = input(g, "w", shape_of(4, 2, 2, 3, 3));
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_RELU);
  output(g, (TensorRef){must(graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w}, 2, 1, &p, NULL, &diag)), 0});
  diag_init(&d);
  CHECK_EQ_INT(pet_mutate(g, NULL, &m, &n, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "conv2d") != NULL, "message: %s", diag_last(&d));
  diag_fini(&d);
  graph_free(g);
}

/* At the sizes of a real layer the tested positions are a sliver of each
 * output, and pet_mutate's tests run both programs at them alone
 * (exec_points): every mutant's verdict, box by box, must be what the
 * whole runs give (pet_compare with all_positions, with the same seed),
 * and every corrected mutant the original at every position. A conv with
 * a batch of two (Figure 1's family), a dilated one (Figure 3's) and two
 * convs on one input (Figure 10a's). */
static void test_reports_at_positions(void) {
  Graph *gs[3] = {graph_new(), graph_new(), graph_new()};
  TensorRef x = input(gs[0], "x", shape_of(4, 2, 8, 18, 20));
  output(gs[0], conv(gs[0], x, input(gs[0], "w", shape_of(4, 12, 8, 3, 3)), 1, 1, 1, 1));
  x = input(gs[1], "x", shape_of(4, 1, 6, 24, 24));
  output(gs[1], conv(gs[1], x, input(gs[1], "w", shape_of(4, 10, 6, 3, 3)), 2, 1, 2, 1));
  x = input(gs[2], "x", shape_of(4, 1, 6, 16, 16));
  output(gs[2], conv(gs[2], x, input(gs[2], "w1", shape_of(4, 8, 6, 3, 3)), 1, 1, 1, 1));
  output(gs[2], conv(gs[2], x, input(gs[2], "w2", shape_of(4, 12, 6, 1, 1)), 0, 1, 1, 1));
  for (int t = 0; t < 3; t++) {
    int n, at_positions = 0;
    PetMutant *m = mutate(gs[t], 0, 0, &n);
    CHECK_MSG(n >= 2, "case %d: %d mutants", t, n);
    check_all(gs[t], m, n);
    for (int i = 0; i < n; i++) {
      PetTestOptions all = {.seed = 77, .all_positions = true};
      PetReport whole;
      CHECK(pet_compare(gs[t], m[i].graph, &all, &whole, &diag) == TEQ_OK);
      int64_t same = 0, boxes = 0;
      bool few = true;
      for (int j = 0; j < whole.n_outputs; j++) {
        const PetOutputReport *a = &m[i].report.out[j], *b = &whole.out[j];
        CHECK_EQ_INT(a->n_boxes, b->n_boxes);
        for (int64_t k = 0; k < a->n_boxes && k < b->n_boxes; k++)
          same += a->differs[k] == b->differs[k], boxes++;
        /* what makes pet_compare run them at positions (corrector.c) */
        int64_t bound = a->n_boxes * (graph_shape(gs[t], gs[t]->outputs[j])->ndim + 1);
        few = few && !a->boxes.is_whole &&
              4 * bound < shape_numel(graph_shape(gs[t], gs[t]->outputs[j]));
      }
      CHECK_MSG(same == boxes, "case %d mutant %d (%s): %lld of %lld boxes agree", t, i, m[i].desc,
                (long long)same, (long long)boxes);
      pet_report_fini(&whole);
      at_positions += few;
      Graph *c = NULL;
      CHECK(pet_correct(gs[t], m[i].graph, &m[i].report, &c, NULL, &diag) == TEQ_OK);
      CHECK_MSG(c && equal_everywhere(gs[t], c, 1, false), "case %d mutant %d: %s", t, i, m[i].desc);
      graph_free(c);
    }
    /* (a mutant whose boxes are many, as the phases of a dilated conv
     * make, is tested whole) */
    printf("case %d: %d mutants, %d tested at positions\n", t, n, at_positions);
    CHECK_MSG(at_positions >= n - 1, "case %d: %d of %d mutants tested at positions", t,
              at_positions, n);
    pet_mutants_free(m, n);
    graph_free(gs[t]);
  }
  diag_flush(&diag, stderr);
}

int main(void) {
  diag_init(&diag);
  test_batch_to_width();
  test_dilated();
  test_merged_convs();
  test_independent_convs();
  test_strided();
  test_halos();
  test_const_weights();
  test_merged_matmuls();
  test_reports_at_positions();
  test_bad_input();
  diag_flush(&diag, stderr);
  diag_fini(&diag);
  return check_exit();
}
