/* test_pet_search.c: PET's mutations competing in optimize's search
 * (optimize/pet/split.c, the PET step of optimize/search.c).
 *
 * Two convolutions read one input, a 1x1 and a 3x3 kernel. No rule is
 * given, so nothing but PET can merge them: the 1x1 kernel zero-padded to
 * 3x3, both kernels concatenated, one conv and a split (PET's Fig. 10a).
 * The analytic cost model is set so that memory traffic decides and a
 * split is nearly free: the merged conv reads the input once instead of
 * twice, so only the mutation lowers the cost. With PET on the result must
 * hold the merged conv and equal the original exactly in Z_p (weights are
 * small integers so that the original runs there) and within 1e-4 in
 * float32; with PET off it is the original. A graph with nothing
 * multi-linear comes back unchanged, and the splitting itself finds the
 * subprograms of an Inception-like block. */
#include <math.h>
#include <string.h>

#include "optimize/optimize.h"
#include "optimize/pet/pet.h"
#include "tests/optimize/pet_graphs.h"

static TensorRef unary(Graph *g, OpKind k, TensorRef x) {
  return (TensorRef){must(graph_add_node(g, k, &x, 1, 1, NULL, NULL, &diag)), 0};
}

/* Convs in g that read data (not weights alone). */
static int data_convs(const Graph *g) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++)
    n += g->nodes[i].kind == OP_CONV2D && g->nodes[g->nodes[i].in[0].node].kind != OP_CONST;
  return n;
}

/* Memory traffic decides; a split and a kernel pad cost next to nothing. */
static CostModel *traffic_model(void) {
  CostModel *cm = cost_model_new();
  CostCalib c = *cost_model_calib(cm);
  c.peak_gflops = 1e9, c.mem_gbps = 1, c.launch_us = 0;
  for (int k = 0; k < OP__COUNT; k++) c.byte_eff[k] = 1;
  c.byte_eff[OP_SPLIT] = 1e6;
  cost_model_set_calib(cm, &c);
  return cm;
}

static Graph *two_convs(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(4, 1, 8, 12, 12);
  TensorRef x = {must(graph_add_input(g, "x", &xs, DT_F32, &diag)), 0};
  TensorRef a = conv(g, x, small_int_weight(g, shape_of(4, 4, 8, 1, 1), 1), 0, 1, 1, 1);
  TensorRef b = conv(g, x, small_int_weight(g, shape_of(4, 6, 8, 3, 3), 2), 1, 1, 1, 1);
  must(graph_add_output(g, a, "a", &diag));
  must(graph_add_output(g, b, "b", &diag));
  return g;
}

static Graph *search(const Graph *g, bool pet, OptStats *st) {
  OptRules *rs = opt_rules_new();
  CostModel *cm = traffic_model();
  OptOptions o = OPT_DEFAULTS;
  o.pet = pet;
  o.budget = 10;
  o.check_derived = true; /* candidates derived unbuilt are built too, and must agree */
  Graph *best = NULL;
  int rc = opt_search(g, rs, cm, &o, &best, st, &diag);
  CHECK(rc == TEQ_OK);
  if (rc) diag_flush(&diag, stderr);
  if (best) CHECK(graph_check(best, &diag) == TEQ_OK);
  cost_model_free(cm);
  opt_rules_free(rs);
  return best;
}

static void test_merge_only_by_pet(void) {
  Graph *g = two_convs();
  OptStats st;
  Graph *best = search(g, true, &st);
  CostModel *cm = traffic_model();
  double before = 0, after = 0;
  CHECK(opt_graph_cost(cm, g, &before, NULL, &diag) == TEQ_OK);
  if (best) {
    CHECK(opt_graph_cost(cm, best, &after, NULL, &diag) == TEQ_OK);
    printf("PET on: cost %.4f -> %.4f us, %lld subprograms, %lld mutants, %d applied\n", before,
           after, (long long)st.pet_subprograms, (long long)st.pet_mutants, st.n_pet_applied);
    CHECK(after < before);
    CHECK_EQ_INT(data_convs(best), 1);
    CHECK_EQ_INT(count_kind(best, OP_SPLIT), 1);
    CHECK(equal_everywhere(g, best, 1, false));
    /* the weight-only kernel operators fold into constants, as optimize exports */
    Graph *folded = graph_copy(best);
    CHECK(folded && opt_fold_weights(folded, NULL, &diag) == TEQ_OK);
    if (folded) {
      CHECK_EQ_INT(count_kind(folded, OP_PAD) + count_kind(folded, OP_CONCAT), 0);
      CHECK(equal_everywhere(g, folded, 1, false));
    }
    graph_free(folded);
  }
  CHECK(st.pet_subprograms >= 3); /* each conv and the pair */
  printf("PET candidates: %lld, %lld derived unbuilt (each also built: check_derived)\n",
         (long long)st.pet_built, (long long)st.pet_derived);
  CHECK(st.pet_derived > 0); /* else check_derived above checked nothing */
  CHECK_EQ_INT(st.n_pet_applied, 1);
  if (st.n_pet_applied == 1) {
    const OptPetApplied *p = &st.pet_applied[0];
    printf("  %s; correction %s; cost %+.4f us; bound 2^%.1f\n", p->desc, p->correction,
           p->cost_delta_us, p->log2_bound);
    CHECK(strstr(p->desc, "kernels concatenated") && strstr(p->desc, "split"));
    CHECK(strstr(p->desc, "zero-padded to 3x3") != NULL);
    CHECK(p->cost_delta_us < 0);
    CHECK(p->log2_bound <= -60);
  }
  opt_stats_fini(&st);

  /* PET off: no rule applies, the original comes back */
  Graph *plain = search(g, false, &st);
  CHECK(plain && graph_hash(plain, NULL) == graph_hash(g, NULL));
  CHECK(plain && best && graph_hash(plain, NULL) != graph_hash(best, NULL));
  CHECK_EQ_INT(st.n_pet_applied, 0);
  opt_stats_fini(&st);
  graph_free(plain);
  graph_free(best);
  cost_model_free(cm);
  graph_free(g);
}

/* Nothing multi-linear: relu and softmax. PET finds no subprogram. */
static void test_nothing_linear(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(2, 3, 5);
  TensorRef x = {must(graph_add_input(g, "x", &xs, DT_F32, &diag)), 0};
  must(graph_add_output(g, unary(g, OP_SOFTMAX, unary(g, OP_RELU, x)), "y", &diag));
  OptStats st;
  Graph *best = search(g, true, &st);
  CHECK(best && graph_hash(best, NULL) == graph_hash(g, NULL));
  CHECK_EQ_INT(st.pet_subprograms, 0);
  CHECK_EQ_INT(st.pet_built, 0);
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* An Inception-like block: three convs on one input (1x1, 1x1, 3x3), one
 * behind a relu, a conv with a fused relu (not multi-linear), and a conv
 * fed by another conv. Regions and subprograms as split.c describes. */
static void test_split(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(4, 1, 4, 6, 6);
  TensorRef x = {must(graph_add_input(g, "x", &xs, DT_F32, &diag)), 0};
  TensorRef a = conv(g, x, small_int_weight(g, shape_of(4, 2, 4, 1, 1), 3), 0, 1, 1, 1);
  TensorRef b = conv(g, x, small_int_weight(g, shape_of(4, 3, 4, 1, 1), 4), 0, 1, 1, 1);
  TensorRef c = conv(g, x, small_int_weight(g, shape_of(4, 2, 4, 3, 3), 5), 1, 1, 1, 1);
  TensorRef r = unary(g, OP_RELU, b);
  TensorRef e = conv(g, r, small_int_weight(g, shape_of(4, 2, 3, 3, 3), 6), 1, 1, 1, 1);
  TensorRef f = conv(g, e, small_int_weight(g, shape_of(4, 2, 2, 1, 1), 7), 0, 1, 1, 1);
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_RELU);
  TensorRef w = small_int_weight(g, shape_of(4, 2, 4, 1, 1), 8);
  TensorRef h = {must(graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w}, 2, 1, &p, NULL, &diag)), 0};
  must(graph_add_output(g, a, "a", &diag));
  must(graph_add_output(g, c, "c", &diag));
  must(graph_add_output(g, f, "f", &diag));
  must(graph_add_output(g, h, "h", &diag));
  PetSplit sp;
  CHECK(pet_split(g, NULL, &sp, &diag) == TEQ_OK);
  /* regions: {a, b, c} (joined through nothing: three), {e, f}; h is not linear */
  printf("split: %d regions, %d subprograms\n", sp.n_regions, sp.n);
  CHECK_EQ_INT(sp.n_regions, 4);
  int singles = 0, pairs = 0;
  for (int i = 0; i < sp.n; i++) {
    const PetSubprogram *s = &sp.v[i];
    singles += s->n_nodes == 1, pairs += s->n_nodes == 2;
    CHECK(graph_check(s->graph, &diag) == TEQ_OK);
    CHECK_EQ_INT(s->graph->n_outputs, s->n_nodes);
    CHECK_EQ_INT(s->graph->n_inputs, s->n_nodes + 1); /* x and each kernel */
    for (int k = 0; k < s->graph->n_inputs; k++)
      CHECK(shape_equal(graph_shape(s->graph, (TensorRef){s->graph->inputs[k], 0}),
                        graph_shape(g, s->in[k])));
    if (s->n_nodes == 2) CHECK(s->in[0].node == x.node);
  }
  CHECK_EQ_INT(singles, 5); /* a, b, c, e, f */
  CHECK_EQ_INT(pairs, 3);   /* a-b, a-c, b-c */
  /* same operators at the same shapes hash alike: a and b differ in M */
  pet_split_fini(&sp);
  graph_free(g);
}

/* Parallel branches: a and b, same-shaped convs on different tensors, are
 * one independent pair; c reads a's relu, so a-c is not a pair (merged, the
 * grouped conv would read its own output) while b-c is. */
static void test_split_independent(void) {
  Graph *g = graph_new();
  Shape xs = shape_of(4, 1, 4, 6, 6);
  TensorRef x = {must(graph_add_input(g, "x", &xs, DT_F32, &diag)), 0};
  TensorRef y = {must(graph_add_input(g, "y", &xs, DT_F32, &diag)), 0};
  TensorRef a = conv(g, unary(g, OP_RELU, x), small_int_weight(g, shape_of(4, 4, 4, 3, 3), 1), 1, 1, 1, 1);
  TensorRef b = conv(g, unary(g, OP_RELU, y), small_int_weight(g, shape_of(4, 4, 4, 3, 3), 2), 1, 1, 1, 1);
  TensorRef c = conv(g, unary(g, OP_RELU, a), small_int_weight(g, shape_of(4, 4, 4, 1, 1), 3), 0, 1, 1, 1);
  must(graph_add_output(g, b, "b", &diag));
  must(graph_add_output(g, c, "c", &diag));
  PetSplit sp;
  CHECK(pet_split(g, NULL, &sp, &diag) == TEQ_OK);
  int singles = 0, pairs = 0;
  bool ab = false, bc = false, ac = false;
  for (int i = 0; i < sp.n; i++) {
    const PetSubprogram *s = &sp.v[i];
    singles += s->n_nodes == 1;
    if (s->n_nodes != 2) continue;
    pairs++;
    CHECK(graph_check(s->graph, &diag) == TEQ_OK);
    CHECK_EQ_INT(s->graph->n_inputs, 4); /* two data tensors, two kernels */
    CHECK_EQ_INT(s->graph->n_outputs, 2);
    int p = s->nodes[0], q = s->nodes[1];
    ab |= p == a.node && q == b.node, bc |= p == b.node && q == c.node;
    ac |= p == a.node && q == c.node;
  }
  printf("split, parallel branches: %d subprograms, %d pairs\n", sp.n, pairs);
  CHECK_EQ_INT(singles, 3);
  CHECK_EQ_INT(pairs, 2);
  CHECK(ab && bc && !ac);
  pet_split_fini(&sp);
  graph_free(g);
}

int main(void) {
  diag_init(&diag);
  test_split();
  test_split_independent();
  test_merge_only_by_pet();
  test_nothing_linear();
  diag_flush(&diag, stderr);
  diag_fini(&diag);
  return check_exit();
}
