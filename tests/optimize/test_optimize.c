/* test_optimize.c: optimize's rewriting engine on real rules.
 *
 * Rules come from gen-rules (depth 3 over matmul, conv2d, ewadd, relu,
 * transpose, concat and split) proved by verify-rules, as optimize uses
 * them. Every rewrite any rule makes of the graphs below must compute what
 * the original computes: exactly in Z_p on random inputs and within 1e-4 in
 * float32. The instances are not checked in Z_p by the engine here (the
 * option is off), so what is tested is the matching and the solving of
 * shape-dependent parameters themselves, at shapes gen-rules never used. */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gen/gen.h"
#include "optimize/optimize.h"
#include "runtime/exec.h"
#include "tests/check.h"
#include "verify/verify.h"

/* Nodes of kind k in g. */
static int count_kind(const Graph *g, OpKind k) {
  int n = 0;
  for (int i = 0; i < g->n_nodes; i++) n += g->nodes[i].kind == k;
  return n;
}

static OptRules *rules;
static char tmpdir[256];

typedef struct Seen {
  const Graph *orig;
  int rewrites, unequal, smaller, with_opaque;
  int min_ops;
} Seen;

/* Whether a and b agree exactly in Z_p and closely in float32. */
static bool equal_outputs(const Graph *a, const Graph *b) {
  Diag d;
  diag_init(&d);
  bool ok = true;
  for (int mode = 0; mode < 2 && ok; mode++) {
    ExecDiff diff;
    int rc = exec_compare(a, b, mode ? EXEC_F32 : EXEC_MODP, 7, 0, mode ? 1e-4 : 0, &diff, &d);
    ok = rc == TEQ_OK && !diff.differ;
    if (rc == TEQ_OK) exec_diff_fini(&diff);
  }
  if (!ok) diag_flush(&d, stderr);
  diag_fini(&d);
  return ok;
}

static bool take(Graph *g, void *ctx) {
  Seen *s = ctx;
  s->rewrites++;
  Diag d;
  diag_init(&d);
  CHECK(graph_check(g, &d) == TEQ_OK);
  diag_fini(&d);
  if (!equal_outputs(s->orig, g)) {
    s->unequal++;
    fprintf(stderr, "a rewrite changed the result:\n");
    graph_dump(s->orig, stderr);
    graph_dump(g, stderr);
  }
  int ops = graph_count_ops(g);
  if (ops < graph_count_ops(s->orig)) s->smaller++;
  if (ops < s->min_ops) s->min_ops = ops;
  for (int i = 0; i < g->n_nodes; i++) s->with_opaque += g->nodes[i].kind == OP_OPAQUE;
  return false;
}

/* Every directed rule at every match of g. */
static Seen apply_all(const Graph *g, OptStats *st) {
  Seen s = {.orig = g, .min_ops = 1 << 30};
  OptOptions o = OPT_DEFAULTS;
  o.zp_check_flops = 0;
  memset(st, 0, sizeof *st);
  Diag d;
  diag_init(&d);
  for (int i = 0; i < opt_rules_count(rules); i++)
    CHECK(opt_apply_rule(rules, i, g, &o, take, &s, st, &d) == TEQ_OK);
  diag_flush(&d, stderr);
  diag_fini(&d);
  return s;
}

static TensorRef input(Graph *g, const char *name, Shape s) {
  return (TensorRef){graph_add_input(g, name, &s, DT_F32, NULL), 0};
}
static TensorRef op(Graph *g, OpKind k, TensorRef a, TensorRef b, int n_in, const Params *p) {
  TensorRef in[2] = {a, b};
  int id = graph_add_node(g, k, in, n_in, 1, p, NULL, NULL);
  CHECK(id >= 0);
  return (TensorRef){id, 0};
}

/* a and b side by side along axis 1 (the channels of images). */
static TensorRef concat1(Graph *g, TensorRef a, TensorRef b) {
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, param_index(OP_CONCAT, "axis"), 1);
  TensorRef in[2] = {a, b};
  int id = graph_add_node(g, OP_CONCAT, in, 2, 1, &p, NULL, NULL);
  CHECK(id >= 0);
  return (TensorRef){id, 0};
}

static TensorRef weight(Graph *g, const char *name, Shape s, uint64_t seed) {
  Tensor *t = tensor_new(DT_F32, &s);
  tensor_fill_random(t, seed);
  return (TensorRef){graph_add_const(g, name, t, NULL), 0};
}

/* A weight of small integers, so that equal_outputs runs in Z_p too; no
 * two seeds give equal weights. */
static TensorRef int_weight(Graph *g, Shape s, int seed) {
  Tensor *t = tensor_new(DT_F32, &s);
  for (int64_t e = 0; e < tensor_numel(t); e++)
    ((float *)t->data)[e] = (float)((uint32_t)((e + 1000 * seed) * 2654435761u) >> 20 & 3) - 2;
  return (TensorRef){graph_add_const(g, NULL, t, NULL), 0};
}

/* Two products sharing x with weights of different widths, at shapes no
 * rule was found at; merging them must split at 5 and 3. */
static void test_shared_matmul(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 2, 6));
  TensorRef w1 = input(g, "w1", shape_of(2, 6, 5)), w2 = input(g, "w2", shape_of(2, 6, 3));
  graph_add_output(g, op(g, OP_MATMUL, x, w1, 2, NULL), "a", NULL);
  graph_add_output(g, op(g, OP_MATMUL, x, w2, 2, NULL), "b", NULL);
  OptStats st;
  Seen s = apply_all(g, &st);
  CHECK(s.rewrites > 0);
  CHECK_EQ_INT(s.unequal, 0);
  graph_free(g);
}

/* split(concat(a, b)) at odd sizes: the rewrite to (a, b) must find them. */
static void test_split_concat(void) {
  Graph *g = graph_new();
  TensorRef a = input(g, "a", shape_of(4, 1, 3, 5, 5)), b = input(g, "b", shape_of(4, 1, 7, 5, 5));
  Params pc;
  params_default(OP_CONCAT, &pc);
  param_set_int(&pc, param_index(OP_CONCAT, "axis"), 1);
  TensorRef c = op(g, OP_CONCAT, a, b, 2, &pc);
  TensorRef r = op(g, OP_RELU, c, c, 1, NULL);
  Params ps;
  params_default(OP_SPLIT, &ps);
  param_set_int(&ps, param_index(OP_SPLIT, "axis"), 1);
  param_set_ints(&ps, param_index(OP_SPLIT, "sizes"), (int64_t[]){3, 7}, 2);
  int sp = graph_add_node(g, OP_SPLIT, &r, 1, 2, &ps, NULL, NULL);
  CHECK(sp >= 0);
  graph_add_output(g, (TensorRef){sp, 0}, "p", NULL);
  graph_add_output(g, (TensorRef){sp, 1}, "q", NULL);
  OptStats st;
  Seen s = apply_all(g, &st);
  CHECK(s.rewrites > 0);
  CHECK(s.smaller > 0); /* split(relu(concat(a, b))) -> relu(a), relu(b) */
  CHECK_EQ_INT(s.unequal, 0);
  graph_free(g);
}

/* conv(ewadd(i, bias)) with a broadcast [1, C, 1, 1] bias: the rules'
 * ewadd adds equal shapes, so distributing the conv over this one would be
 * wrong (conv of a constant image is not a constant image at the borders). */
static void test_broadcast_refused(void) {
  Graph *g = graph_new();
  TensorRef i = input(g, "i", shape_of(4, 1, 4, 6, 6)), b = input(g, "b", shape_of(4, 1, 4, 1, 1));
  TensorRef k = input(g, "k", shape_of(4, 4, 4, 3, 3));
  Params pc;
  params_default(OP_CONV2D, &pc);
  param_set_ints(&pc, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  TensorRef y = op(g, OP_CONV2D, op(g, OP_EWADD, i, b, 2, NULL), k, 2, &pc);
  graph_add_output(g, y, "y", NULL);
  OptStats st;
  Seen s = apply_all(g, &st);
  CHECK_EQ_INT(s.unequal, 0);
  graph_free(g);
}

/* a = x.w; b = x.relu(a): merging the two products would make the merged
 * product read its own result. */
static void test_cycle_rejected(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 4, 4)), w = input(g, "w", shape_of(2, 4, 4));
  TensorRef a = op(g, OP_MATMUL, x, w, 2, NULL);
  TensorRef b = op(g, OP_MATMUL, x, op(g, OP_RELU, a, a, 1, NULL), 2, NULL);
  graph_add_output(g, a, "a", NULL);
  graph_add_output(g, b, "b", NULL);
  OptStats st;
  Seen s = apply_all(g, &st);
  CHECK(st.rejected_cycle > 0);
  CHECK_EQ_INT(s.unequal, 0);
  graph_free(g);
}

/* g searched under o with a fresh cost model (the analytic one): the best
 * graph, its stats in *st (the caller's to finish) and, with cost, its
 * price under the same model. */
static Graph *searched(const Graph *g, const OptOptions *o, OptStats *st, double *cost) {
  CostModel *cm = cost_model_new();
  Graph *best = NULL;
  Diag d;
  diag_init(&d);
  CHECK(opt_search(g, rules, cm, o, &best, st, &d) == TEQ_OK);
  if (cost) CHECK(best && opt_graph_cost(cm, best, cost, NULL, &d) == TEQ_OK);
  diag_flush(&d, stderr);
  diag_fini(&d);
  cost_model_free(cm);
  return best;
}

/* An operator Teq does not know stays as it was, attributes and all. */
static void test_opaque_survives(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 3, 4)), w = input(g, "w", shape_of(2, 4, 4));
  TensorRef r = op(g, OP_RELU, op(g, OP_MATMUL, x, w, 2, NULL), x, 1, NULL);
  OpaqueInfo *info = calloc(1, sizeof *info);
  info->op_type = strdup("MysteryOp");
  info->domain = strdup("com.example");
  info->proto_len = 5;
  info->proto = malloc(5);
  memcpy(info->proto, "\x0a\x03" "abc", 5);
  Shape s34 = shape_of(2, 3, 4);
  DType f32 = DT_F32;
  int q = graph_add_opaque(g, info, &r, 1, 1, &s34, &f32, "mystery", NULL);
  CHECK(q >= 0);
  TensorRef t = op(g, OP_TRANSPOSE, op(g, OP_RELU, (TensorRef){q, 0}, x, 1, NULL), x, 1, NULL);
  graph_add_output(g, t, "y", NULL);
  OptOptions o = OPT_DEFAULTS;
  o.budget = 20;
  OptStats st;
  Graph *best = searched(g, &o, &st, NULL);
  int found = 0;
  for (int i = 0; best && i < best->n_nodes; i++) {
    const Node *n = &best->nodes[i];
    if (n->kind != OP_OPAQUE) continue;
    found++;
    CHECK(!strcmp(n->opaque->op_type, "MysteryOp") && !strcmp(n->opaque->domain, "com.example"));
    CHECK(n->opaque->proto_len == 5 && !memcmp(n->opaque->proto, "\x0a\x03" "abc", 5));
    CHECK(!strcmp(n->name, "mystery"));
  }
  CHECK_EQ_INT(found, 1);
  CHECK(best && graph_check(best, NULL) == TEQ_OK);
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* Nothing matches a softmax: the graph comes back as it was. */
static void test_no_match_unchanged(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 3, 5));
  graph_add_output(g, op(g, OP_SOFTMAX, x, x, 1, NULL), "y", NULL);
  OptOptions o = OPT_DEFAULTS;
  OptStats st;
  Graph *best = searched(g, &o, &st, NULL);
  CHECK(best && graph_hash(best, NULL) == graph_hash(g, NULL));
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* A rule graph over two inputs of s, its one output rooted at op(a, b)
 * (b unused for unary ops) applied to relus or not. */
static Graph *rule_side(Shape s, OpKind outer, OpKind inner, bool inner_on_inputs) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", s), y = input(g, "y", s);
  if (inner_on_inputs) x = op(g, inner, x, x, 1, NULL), y = op(g, inner, y, y, 1, NULL);
  TensorRef r = op(g, outer, x, y, op_def(outer)->n_in_min, NULL);
  if (!inner_on_inputs) r = op(g, inner, r, r, 1, NULL);
  graph_add_output(g, r, "r", NULL);
  return g;
}

/* g searched with rules rs by the analytic model; messages flushed. */
static Graph *searched_by(const Graph *g, const OptRules *rs, const OptOptions *o, OptStats *st,
                          Diag *d) {
  CostModel *cm = cost_model_new();
  Graph *best = NULL;
  CHECK(opt_search(g, rs, cm, o, &best, st, d) == TEQ_OK);
  diag_flush(d, stderr);
  cost_model_free(cm);
  return best;
}

/* Unsound rules: their rewrites are checked in Z_p when the search makes
 * one the best, and refused; a rewrite the search never keeps is never
 * checked. relu(x) + relu(y) => relu(x + y) saves an operator and would be
 * the best (it is refused); relu(x + y) => relu(x) + relu(y) costs one
 * more and, at an alpha of 1, is never kept, so its instance is never
 * checked. */
static void test_unsound_refused_when_kept(void) {
  Shape s = shape_of(2, 64, 64);
  OptRules *rs = opt_rules_new();
  Diag d;
  diag_init(&d);
  CHECK(opt_rules_add(rs, rule_side(s, OP_EWADD, OP_RELU, true),
                      rule_side(s, OP_EWADD, OP_RELU, false), 1, "unsound merge", &d) == TEQ_OK);
  CHECK(opt_rules_add(rs, rule_side(s, OP_EWADD, OP_RELU, false),
                      rule_side(s, OP_EWADD, OP_RELU, true), 2, "unsound split", &d) == TEQ_OK);
  /* relu(a) + relu(b), and relu(c + d) beside it */
  Graph *g = graph_new();
  TensorRef a = input(g, "a", s), b = input(g, "b", s), c = input(g, "c", s), e = input(g, "d", s);
  TensorRef sum = op(g, OP_EWADD, op(g, OP_RELU, a, a, 1, NULL), op(g, OP_RELU, b, b, 1, NULL), 2,
                     NULL);
  TensorRef both = op(g, OP_EWADD, c, e, 2, NULL);
  graph_add_output(g, sum, "sum", NULL);
  graph_add_output(g, op(g, OP_RELU, both, both, 1, NULL), "relu_of_sum", NULL);
  OptOptions o = OPT_DEFAULTS;
  o.alpha = 1.0, o.budget = 20, o.pet = false;
  OptStats st;
  Graph *best = searched_by(g, rs, &o, &st, &d);
  CHECK(best && graph_hash(best, NULL) == graph_hash(g, NULL));
  CHECK_EQ_INT(st.zp_checked, 1);  /* the merge's instance alone */
  CHECK(st.rejected_zp >= 1);
  CHECK(st.generated >= 2);        /* both rules made a rewrite */
  opt_stats_fini(&st);
  graph_free(best);
  opt_rules_free(rs);
  graph_free(g);
  diag_fini(&d);
}

/* A rewrite the search queues is checked in Z_p only when it is taken to
 * expand (or made the best): the unsound split above, dearer than the
 * graph it rewrites, is queued at an alpha of 2. With a budget of one
 * expansion it is never taken, so never checked; with more it is taken,
 * checked, refused without spending the budget, and the result is the
 * original. */
static void test_unsound_refused_when_taken(void) {
  Shape s = shape_of(2, 64, 64);
  Diag d;
  diag_init(&d);
  for (int budget = 1; budget <= 5; budget += 4) {
    OptRules *rs = opt_rules_new();
    CHECK(opt_rules_add(rs, rule_side(s, OP_EWADD, OP_RELU, false),
                        rule_side(s, OP_EWADD, OP_RELU, true), 2, "unsound split", &d) == TEQ_OK);
    Graph *g = graph_new();
    TensorRef c = input(g, "c", s), e = input(g, "d", s);
    TensorRef both = op(g, OP_EWADD, c, e, 2, NULL);
    graph_add_output(g, op(g, OP_RELU, both, both, 1, NULL), "relu_of_sum", NULL);
    OptOptions o = OPT_DEFAULTS;
    o.alpha = 2.0, o.budget = budget, o.pet = false;
    OptStats st;
    Graph *best = searched_by(g, rs, &o, &st, &d);
    CHECK(best && graph_hash(best, NULL) == graph_hash(g, NULL));
    CHECK(st.kept >= 1); /* the split was queued */
    CHECK_EQ_INT(st.zp_checked, budget == 1 ? 0 : 1);
    CHECK_EQ_INT(st.rejected_zp, budget == 1 ? 0 : 1);
    CHECK_EQ_INT(st.explored, 1); /* the original alone: the refused one spent nothing */
    opt_stats_fini(&st);
    graph_free(best);
    opt_rules_free(rs);
    graph_free(g);
  }
  diag_fini(&d);
}

/* The search on a small graph with a merge to find: two products sharing
 * their input, each followed by relu; the result must equal the original
 * and cost no more. */
static void test_search_equivalent(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 64, 256));
  Tensor *wt[2];
  for (int k = 0; k < 2; k++) {
    Shape s = shape_of(2, 256, 256);
    wt[k] = tensor_new(DT_F32, &s);
    for (int64_t e = 0; e < tensor_numel(wt[k]); e++) ((float *)wt[k]->data)[e] = (float)((e * 7 + k) % 5) - 2;
  }
  TensorRef w1 = {graph_add_const(g, "w1", wt[0], NULL), 0}, w2 = {graph_add_const(g, "w2", wt[1], NULL), 0};
  graph_add_output(g, op(g, OP_RELU, op(g, OP_MATMUL, x, w1, 2, NULL), x, 1, NULL), "a", NULL);
  graph_add_output(g, op(g, OP_RELU, op(g, OP_MATMUL, x, w2, 2, NULL), x, 1, NULL), "b", NULL);
  CostModel *cm = cost_model_new();
  OptOptions o = OPT_DEFAULTS;
  o.budget = 50;
  Graph *best = NULL;
  OptStats st;
  Diag d;
  diag_init(&d);
  CHECK(opt_search(g, rules, cm, &o, &best, &st, &d) == TEQ_OK);
  double before = 0, after = 0;
  CHECK(opt_graph_cost(cm, g, &before, NULL, &d) == TEQ_OK);
  CHECK(best && opt_graph_cost(cm, best, &after, NULL, &d) == TEQ_OK);
  CHECK(after <= before);
  CHECK(st.explored > 0 && st.generated > 0);
  int folded = 0;
  CHECK(best && opt_fold_weights(best, &folded, &d) == TEQ_OK);
  for (int i = 0; best && i < best->n_nodes; i++) { /* nothing left computes on weights alone */
    const Node *n = &best->nodes[i];
    if (n->kind == OP_CONST || n->kind == OP_INPUT || !n->n_in) continue;
    bool all = true;
    for (int j = 0; j < n->n_in; j++) all &= best->nodes[n->in[j].node].kind == OP_CONST;
    CHECK(!all);
  }
  CHECK(best && equal_outputs(g, best));
  diag_flush(&d, stderr);
  opt_stats_fini(&st);
  graph_free(best);
  cost_model_free(cm);
  diag_fini(&d);
  graph_free(g);
}

/* A recurrent cell's eight candidates x W_i + h U_i, searched one site at
 * a time: every pair of products sharing x or h merges, so the first
 * expansions queue hundreds of rewrites within alpha of the best, more
 * than the queue holds at a small budget. A full queue must still take a
 * new best (dropping its dearest candidate): the search then goes on from
 * it, and a small budget ends about where a large one does. (With every
 * site at once, test_every_site, the cell needs no full queue.) */
enum { CELL_CANDIDATES = 8, CELL_HIDDEN = 64 };

static Graph *cell_graph(void) {
  enum { CANDIDATES = CELL_CANDIDATES, HIDDEN = CELL_HIDDEN };
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 1, HIDDEN)), h = input(g, "h", shape_of(2, 1, HIDDEN));
  for (int i = 0; i < CANDIDATES; i++) {
    TensorRef w = int_weight(g, shape_of(2, HIDDEN, HIDDEN), 2 * i);
    TensorRef u = int_weight(g, shape_of(2, HIDDEN, HIDDEN), 2 * i + 1);
    TensorRef t = op(g, OP_EWADD, op(g, OP_MATMUL, x, w, 2, NULL), op(g, OP_MATMUL, h, u, 2, NULL),
                     2, NULL);
    /* tanh, which no rule fuses into a product: the merges are what is tested. */
    graph_add_output(g, op(g, OP_TANH, t, t, 1, NULL), NULL, NULL);
  }
  return g;
}

static double cell_cost_after(int budget, int *explored) {
  Graph *g = cell_graph();
  OptOptions o = OPT_DEFAULTS;
  o.budget = budget;
  o.one_site = true;
  OptStats st;
  double after = NAN;
  graph_free(searched(g, &o, &st, &after));
  *explored = st.explored;
  opt_stats_fini(&st);
  graph_free(g);
  return after;
}

static void test_full_queue(void) {
  int small_explored = 0, large_explored = 0;
  double small = cell_cost_after(20, &small_explored), large = cell_cost_after(200, &large_explored);
  printf("recurrent cell: %.2f us after %d graphs expanded, %.2f us after %d\n", small,
         small_explored, large, large_explored);
  CHECK(small_explored == 20);
  CHECK(small <= 1.05 * large);
}

/* The same cell where TASO's merge pays only in full: x W_i + h U_i ->
 * concat(x, h) [W_i; U_i] costs a concat at the first i and saves a
 * product and an add at each one after, and then the eight products share
 * their input and merge. One site at a time, the first step is dearer
 * than the merges of the x W_i alone, which then outprice it; each rule
 * applied at all its sites at once is a step of its own, and the cell
 * ends with one concat and its products merged. */
static void test_every_site(void) {
  Graph *g = cell_graph();
  OptOptions o = OPT_DEFAULTS;
  o.budget = 20;
  OptStats st;
  double before = NAN, after = NAN;
  CostModel *cm = cost_model_new();
  CHECK(opt_graph_cost(cm, g, &before, NULL, NULL) == TEQ_OK);
  cost_model_free(cm);
  Graph *best = searched(g, &o, &st, &after);
  int concats = 0, products = 0;
  for (int i = 0; best && i < best->n_nodes; i++) {
    OpKind k = best->nodes[i].kind;
    concats += k == OP_CONCAT && best->nodes[i].n_in == 2 &&
               best->nodes[best->nodes[i].in[0].node].kind == OP_INPUT &&
               best->nodes[best->nodes[i].in[1].node].kind == OP_INPUT;
    products += k == OP_MATMUL || k == OP_GEMM;
  }
  printf("recurrent cell, every site at once: %.2f -> %.2f us, %d concat of x and h, %d products, "
         "%lld steps of a rule at all its sites\n", before, after, concats, products,
         (long long)st.all_sites);
  CHECK(st.all_sites > 0);
  CHECK(concats == 1);
  CHECK(products <= CELL_CANDIDATES / 4);
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* Nodes wider than a window's bookkeeping (a concat of 20 pieces: what
 * PET's corrections of many regions make, and a configuration too long to
 * name in the cost table) stay outside the windows, are priced by the
 * analytic model, and a model holding them is searched, folded and
 * exported like any other. */
static void test_wide_nodes(void) {
  enum { JOINED = 20 };
  Graph *g = graph_new();
  TensorRef parts[JOINED];
  for (int i = 0; i < JOINED; i++) {
    char name[16];
    snprintf(name, sizeof name, "x%d", i);
    TensorRef xi = input(g, name, shape_of(2, 4, 4));
    parts[i] = op(g, OP_RELU, xi, xi, 1, NULL);
  }
  Params cp;
  params_default(OP_CONCAT, &cp);
  param_set_int(&cp, param_index(OP_CONCAT, "axis"), 1);
  TensorRef cat = {graph_add_node(g, OP_CONCAT, parts, JOINED, 1, &cp, NULL, NULL), 0};
  CHECK(cat.node >= 0);
  TensorRef w = int_weight(g, shape_of(2, JOINED * 4, 8), 0);
  TensorRef y = op(g, OP_MATMUL, cat, w, 2, NULL);
  graph_add_output(g, op(g, OP_RELU, y, y, 1, NULL), "y", NULL);
  graph_add_output(g, op(g, OP_EWADD, parts[0], parts[1], 2, NULL), "z", NULL);
  CostModel *cm = cost_model_new();
  CostEstimate e;
  Diag d;
  diag_init(&d);
  { /* a concat whose configuration does not fit in a cost key */
    enum { MANY = 160 };
    Graph *wide = graph_new();
    TensorRef in[MANY];
    for (int i = 0; i < MANY; i++) in[i] = input(wide, NULL, shape_of(3, 1000, 1000, 7));
    int id = graph_add_node(wide, OP_CONCAT, in, MANY, 1, &cp, NULL, NULL);
    char key[COST_KEY_MAX];
    CHECK(id >= 0 && cost_config_key(wide, id, key, sizeof key) >= (int)sizeof key);
    CHECK(cost_node(cm, wide, id, &e, &d) == TEQ_OK && e.us > 0 && e.source == COST_ANALYTIC);
    graph_free(wide);
  }
  OptOptions o = OPT_DEFAULTS;
  o.budget = 10;
  o.window = 8; /* several windows, each cut around the wide nodes */
  Graph *best = NULL;
  OptStats st;
  CHECK(opt_search(g, rules, cm, &o, &best, &st, &d) == TEQ_OK);
  int folded = 0;
  CHECK(best && opt_fold_weights(best, &folded, &d) == TEQ_OK);
  CHECK(best && equal_outputs(g, best));
  diag_flush(&d, stderr);
  opt_stats_fini(&st);
  graph_free(best);
  cost_model_free(cm);
  diag_fini(&d);
  graph_free(g);
}

/* Windows end where the fewest tensors cross: in a chain of recurrent
 * steps (two products of the state, their sum, a tanh) the first window of
 * 10 operators ends after its second step, at 8, where only the state
 * crosses, not in the third step's products, where two tensors would;
 * --plain-windows cuts at 10. The rewrites that merge a step's products
 * then all fall inside one window. */
/* searched, with the search's progress lines in *text (free it). */
static Graph *searched_told(const Graph *g, OptOptions o, OptStats *st, char **text) {
  size_t len = 0;
  *text = NULL;
  o.progress = open_memstream(text, &len);
  Graph *best = searched(g, &o, st, NULL);
  fclose(o.progress);
  return best;
}

static int first_window_size(const Graph *g, bool plain) {
  OptOptions o = OPT_DEFAULTS;
  o.budget = 5;
  o.window = 10;
  o.plain_windows = plain;
  char *text;
  OptStats st;
  Graph *best = searched_told(g, o, &st, &text);
  int size = -1;
  const char *at = text ? strstr(text, "window 1 of about") : NULL;
  const char *paren = at ? strchr(at, '(') : NULL;
  if (paren) size = atoi(paren + 1);
  CHECK(best && equal_outputs(g, best));
  free(text);
  opt_stats_fini(&st);
  graph_free(best);
  return size;
}

static void test_window_seams(void) {
  Graph *g = graph_new();
  TensorRef h = input(g, "h", shape_of(2, 1, 16));
  for (int t = 0; t < 6; t++) {
    TensorRef a = op(g, OP_MATMUL, h, int_weight(g, shape_of(2, 16, 16), 2 * t), 2, NULL);
    TensorRef b = op(g, OP_MATMUL, h, int_weight(g, shape_of(2, 16, 16), 2 * t + 1), 2, NULL);
    TensorRef sum = op(g, OP_EWADD, a, b, 2, NULL);
    h = op(g, OP_TANH, sum, sum, 1, NULL);
  }
  graph_add_output(g, h, "h6", NULL);
  int narrow = first_window_size(g, false), plain = first_window_size(g, true);
  printf("first window of a recurrent chain: %d operators, %d cut plainly\n", narrow, plain);
  CHECK_EQ_INT(narrow, 8);
  CHECK_EQ_INT(plain, 10);
  graph_free(g);
}

/* Layouts: a transpose feeding a product, written with an explicit perm as
 * ONNX models write it, is absorbed into gemm's flags (a gemm without bias
 * costs what the matmul does until measured, so the transpose is the
 * saving), on either operand; the result is equal. */
static void test_layout_absorbed(void) {
  for (int side = 0; side < 2; side++) {
    Graph *g = graph_new();
    TensorRef x = input(g, "x", side ? shape_of(2, 16, 8) : shape_of(2, 8, 16));
    TensorRef y = input(g, "y", side ? shape_of(2, 16, 12) : shape_of(2, 12, 16));
    Params perm;
    params_default(OP_TRANSPOSE, &perm);
    param_set_ints(&perm, 0, (int64_t[]){1, 0}, 2);
    TensorRef t = op(g, OP_TRANSPOSE, side ? x : y, x, 1, &perm);
    graph_add_output(g, side ? op(g, OP_MATMUL, t, y, 2, NULL) : op(g, OP_MATMUL, x, t, 2, NULL),
                     "z", NULL);
    CHECK_EQ_INT(graph_canonicalize(g), 1);
    OptOptions o = OPT_DEFAULTS;
    o.budget = 20;
    OptStats st;
    Graph *best = searched(g, &o, &st, NULL);
    int gemms = 0, transposes = 0;
    for (int i = 0; best && i < best->n_nodes; i++) {
      const Node *n = &best->nodes[i];
      transposes += n->kind == OP_TRANSPOSE;
      if (n->kind == OP_GEMM && n->n_in == 2 &&
          param_int(&n->params, param_index(OP_GEMM, "transA")) == side &&
          param_int(&n->params, param_index(OP_GEMM, "transB")) == !side)
        gemms++;
    }
    CHECK_MSG(gemms == 1 && transposes == 0, "operand %d: %d gemms, %d transposes", side, gemms,
              transposes);
    CHECK(best && equal_outputs(g, best));
    opt_stats_fini(&st);
    graph_free(best);
    graph_free(g);
  }
}

/* A relu after a matrix product becomes the product's fused activation
 * (the rule the matmul_relu templates prove), at shapes no rule was found
 * at; a relu after a product something else also reads stays apart. */
static void test_relu_fused(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 16, 24));
  TensorRef p = op(g, OP_MATMUL, x, int_weight(g, shape_of(2, 24, 40), 1), 2, NULL);
  TensorRef q = op(g, OP_MATMUL, x, int_weight(g, shape_of(2, 24, 8), 2), 2, NULL);
  graph_add_output(g, op(g, OP_RELU, p, p, 1, NULL), "relu_only", NULL);
  graph_add_output(g, op(g, OP_RELU, q, q, 1, NULL), "relu_shared", NULL);
  graph_add_output(g, q, "product", NULL);
  graph_canonicalize(g);
  OptOptions o = OPT_DEFAULTS;
  o.budget = 20;
  OptStats st;
  double before = 0, after = 0;
  CostModel *cm = cost_model_new();
  Diag d;
  diag_init(&d);
  CHECK(opt_graph_cost(cm, g, &before, NULL, &d) == TEQ_OK);
  cost_model_free(cm);
  diag_fini(&d);
  Graph *best = searched(g, &o, &st, &after);
  int fused = 0, relus = 0;
  for (int i = 0; best && i < best->n_nodes; i++) {
    const Node *n = &best->nodes[i];
    relus += n->kind == OP_RELU;
    fused += n->kind == OP_MATMUL && param_int(&n->params, param_index(OP_MATMUL, "act")) ==
                                         ACT_RELU;
  }
  CHECK_MSG(fused == 1 && relus == 1, "%d fused products, %d relus", fused, relus);
  CHECK_MSG(after < before, "cost %.3f -> %.3f us", before, after);
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* Biases and activations split off for the search and folded back give
 * the same graph: the activation back as it was (a relu6 as a relu6, not
 * a clip of the row's default bounds). */
static void test_bias_round_trip(void) {
  static const int acts[] = {ACT_RELU,  ACT_SILU,         ACT_HARD_SWISH,
                             ACT_RELU6, ACT_HARD_SIGMOID, ACT_HARD_SIGMOID_FIFTH};
  for (size_t a = 0; a < sizeof acts / sizeof *acts; a++) {
    Graph *g = graph_new();
    TensorRef i = input(g, "i", shape_of(4, 1, 3, 7, 7));
    Shape ks = shape_of(4, 5, 3, 3, 3), bs = shape_of(1, 5);
    Tensor *k = tensor_new(DT_F32, &ks), *b = tensor_new(DT_F32, &bs);
    tensor_fill_random(k, 3);
    tensor_fill_random(b, 4);
    for (int64_t e = 0; e < tensor_numel(k); e++) ((float *)k->data)[e] *= 4.0f; /* past 6 */
    TensorRef in[3] = {i, {graph_add_const(g, "k", k, NULL), 0},
                       {graph_add_const(g, "b", b, NULL), 0}};
    Params p;
    params_default(OP_CONV2D, &p);
    param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
    param_set_int(&p, param_index(OP_CONV2D, "act"), acts[a]);
    int c = graph_add_node(g, OP_CONV2D, in, 3, 1, &p, "c", NULL);
    graph_add_output(g, (TensorRef){c, 0}, "y", NULL);
    Graph *h = graph_copy(g);
    Diag d;
    diag_init(&d);
    int split = 0, fused = 0;
    CHECK(opt_split_bias(h, &split, &d) == TEQ_OK);
    CHECK_EQ_INT(split, 1);
    CHECK_EQ_INT(graph_count_ops(h), 3); /* conv, ewadd, the activation */
    ExecDiff diff;
    CHECK(exec_compare(g, h, EXEC_F32, 1, 0, 1e-5, &diff, &d) == TEQ_OK && !diff.differ);
    exec_diff_fini(&diff);
    CHECK(opt_fuse_bias(h, &fused, &d) == TEQ_OK);
    CHECK_EQ_INT(fused, 2);
    CHECK_EQ_INT(graph_count_ops(h), 1);
    int conv_act = -1;
    for (int n = 0; n < h->n_nodes; n++)
      if (h->nodes[n].kind == OP_CONV2D)
        conv_act = (int)param_int(&h->nodes[n].params, param_index(OP_CONV2D, "act"));
    CHECK_MSG(conv_act == acts[a], "%s came back as act %d", act_symbols[acts[a]], conv_act);
    CHECK(exec_compare(g, h, EXEC_F32, 1, 0, 1e-6, &diff, &d) == TEQ_OK && !diff.differ);
    exec_diff_fini(&diff);
    diag_flush(&d, stderr);
    diag_fini(&d);
    graph_free(h);
    graph_free(g);
  }
}

/* Every directed rule applied to its own source side, at the shapes it
 * was found at. */
static void test_every_rule_on_itself(void) {
  OptOptions o = OPT_DEFAULTS;
  o.zp_check_flops = 0;
  int applied = 0, unequal = 0;
  for (int i = 0; i < opt_rules_count(rules); i++) {
    const Graph *src = opt_rules_source(rules, i);
    Seen s = {.orig = src, .min_ops = 1 << 30};
    OptStats st = {0};
    Diag d;
    diag_init(&d);
    CHECK(opt_apply_rule(rules, i, src, &o, take, &s, &st, &d) == TEQ_OK);
    diag_fini(&d);
    applied += s.rewrites > 0;
    unequal += s.unequal;
  }
  printf("%d of %d directed rules rewrite their own source side\n", applied,
         opt_rules_count(rules));
  CHECK(applied >= opt_rules_count(rules) * 9 / 10);
  CHECK_EQ_INT(unequal, 0);
}

/* ---- the search's derived prices ---- */

typedef struct Priced {
  CostModel *cm;
  double orig;       /* the original's price as exported */
  int orig_fused;    /* ... and how many folds that took */
  int rewrites, derived, bad_cost, bad_hash, cheaper_or_dearer, refold_differs;
  int64_t cycles;    /* rewrites both the search and opt_splice refused */
} Priced;

/* g's price as the search used to take it on every candidate: a copy
 * refolded by opt_fuse_bias, then opt_graph_cost. */
static double reference_price(CostModel *cm, const Graph *g, int *fused) {
  Graph *f = graph_copy(g);
  double us = -1;
  Diag d;
  diag_init(&d);
  CHECK(f && opt_fuse_bias(f, fused, &d) == TEQ_OK && opt_graph_cost(cm, f, &us, NULL, &d) == TEQ_OK);
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(f);
  return us;
}

/* Each rewrite: the price and hash the search derived without building it
 * must be those of the built graph, to the last bit. */
static bool check_priced(Graph *g, double cost, uint64_t hash, bool derived, void *ctx) {
  Priced *p = ctx;
  int fused = 0;
  double ref = reference_price(p->cm, g, &fused);
  p->rewrites++;
  p->derived += derived;
  if (memcmp(&ref, &cost, sizeof ref)) {
    if (p->bad_cost++ < 5) {
      fprintf(stderr, "derived price %.17g, built graph's %.17g:\n", cost, ref);
      graph_dump(g, stderr);
    }
  }
  if (graph_hash(g, NULL) != hash) p->bad_hash++;
  p->cheaper_or_dearer += ref != p->orig;
  p->refold_differs += fused != p->orig_fused;
  return false;
}

/* Every rule at every match of g, priced as the search prices it. */
static Priced price_all(const Graph *g, CostModel *cm) {
  Priced p = {.cm = cm};
  p.orig = reference_price(cm, g, &p.orig_fused);
  OptOptions o = OPT_DEFAULTS;
  o.zp_check_flops = 0;
  Diag d;
  diag_init(&d);
  for (int i = 0; i < opt_rules_count(rules); i++) {
    OptStats st = {0};
    CHECK(opt_apply_rule_priced(rules, i, g, cm, &o, check_priced, &p, &st, &d) == TEQ_OK);
    p.cycles += st.rejected_cycle;
  }
  diag_flush(&d, stderr);
  diag_fini(&d);
  return p;
}

/* price_all under a fresh cost model; every derived price and hash must
 * be the built graph's. */
static Priced price_all_checked(const Graph *g) {
  CostModel *cm = cost_model_new();
  Priced p = price_all(g, cm);
  CHECK_EQ_INT(p.bad_cost, 0);
  CHECK_EQ_INT(p.bad_hash, 0);
  cost_model_free(cm);
  return p;
}

static TensorRef conv(Graph *g, TensorRef x, TensorRef k, TensorRef b, int pad, int act) {
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){pad, pad, pad, pad}, 4);
  param_set_int(&p, param_index(OP_CONV2D, "act"), act);
  TensorRef in[3] = {x, k, b};
  int id = graph_add_node(g, OP_CONV2D, in, b.node >= 0 ? 3 : 2, 1, &p, NULL, NULL);
  CHECK(id >= 0);
  return (TensorRef){id, 0};
}

/* Convolutions with biases and activations, split for the search as
 * optimize splits them: merging two of them, or moving an ewadd, changes
 * which ones refold on export, and weight-only nodes appear. */
static void test_priced_convs(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 8, 10, 10)), none = {-1, 0};
  TensorRef a = conv(g, x, weight(g, "k1", shape_of(4, 8, 8, 3, 3), 1),
                     weight(g, "b1", shape_of(1, 8), 2), 1, ACT_RELU);
  TensorRef b = conv(g, x, weight(g, "k2", shape_of(4, 8, 8, 3, 3), 3),
                     weight(g, "b2", shape_of(1, 8), 4), 1, ACT_RELU);
  TensorRef c = conv(g, a, weight(g, "k3", shape_of(4, 8, 8, 1, 1), 5),
                     weight(g, "b3", shape_of(1, 8), 6), 0, ACT_NONE);
  TensorRef e = conv(g, x, weight(g, "k4", shape_of(4, 4, 8, 1, 1), 7), none, 0, ACT_SIGMOID);
  /* the mobile networks' activations, a relu6 among them (a clip with bounds) */
  TensorRef f = conv(g, x, weight(g, "k5", shape_of(4, 8, 8, 1, 1), 8),
                     weight(g, "b5", shape_of(1, 8), 9), 0, ACT_RELU6);
  TensorRef h = conv(g, x, weight(g, "k6", shape_of(4, 8, 8, 1, 1), 10),
                     weight(g, "b6", shape_of(1, 8), 11), 0, ACT_SILU);
  graph_add_output(g, op(g, OP_EWADD, b, c, 2, NULL), "y", NULL);
  graph_add_output(g, op(g, OP_RELU, e, e, 1, NULL), "z", NULL);
  graph_add_output(g, op(g, OP_EWADD, f, h, 2, NULL), "m", NULL);
  Diag d;
  diag_init(&d);
  CHECK(opt_split_bias(g, NULL, &d) == TEQ_OK);
  diag_fini(&d);
  Priced p = price_all_checked(g);
  printf("convolutions: %d rewrites priced, %d derived, %d with another price, %d refolded "
         "otherwise\n", p.rewrites, p.derived, p.cheaper_or_dearer, p.refold_differs);
  CHECK(p.derived > 0 && p.cheaper_or_dearer > 0 && p.refold_differs > 0);
  graph_free(g);
}

/* Products with weights (a transposed weight is a weight-only node),
 * element-wise tails, a sum of a tensor with itself (variables bound to
 * what a match computes), a product that reads the other's result (merging
 * them is a cycle), and three outputs. */
static void test_priced_matmuls(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 32, 32));
  TensorRef w1 = weight(g, "w1", shape_of(2, 32, 32), 1), w2 = weight(g, "w2", shape_of(2, 32, 32), 2);
  TensorRef t = op(g, OP_TRANSPOSE, w2, w2, 1, NULL);
  TensorRef a = op(g, OP_MATMUL, x, w1, 2, NULL), b = op(g, OP_MATMUL, x, t, 2, NULL);
  TensorRef s = op(g, OP_EWADD, a, b, 2, NULL), ra = op(g, OP_RELU, a, a, 1, NULL);
  graph_add_output(g, op(g, OP_RELU, s, s, 1, NULL), "y", NULL);
  graph_add_output(g, op(g, OP_MATMUL, ra, w1, 2, NULL), "z", NULL);
  graph_add_output(g, op(g, OP_EWADD, op(g, OP_MATMUL, x, ra, 2, NULL), ra, 2, NULL), "u", NULL);
  Priced p = price_all_checked(g);
  printf("products: %d rewrites priced, %d derived, %d with another price, %lld cycles refused\n",
         p.rewrites, p.derived, p.cheaper_or_dearer, (long long)p.cycles);
  CHECK(p.derived > 0 && p.cheaper_or_dearer > 0 && p.cycles > 0);
  graph_free(g);
}

/* A rewrite that computes a value the graph has: x*A + h*B as one product
 * of concat(x, h), which z already reads. opt_splice merges the two
 * concats (graph_merge_duplicates), so that rewrite costs one concat less
 * than its nodes: it must be priced from the built graph. */
static void test_priced_duplicates(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 4, 16)), h = input(g, "h", shape_of(2, 4, 16));
  TensorRef a = weight(g, "A", shape_of(2, 16, 16), 1), b = weight(g, "B", shape_of(2, 16, 16), 2);
  TensorRef c = weight(g, "C", shape_of(2, 32, 16), 3);
  TensorRef xh = concat1(g, x, h);
  TensorRef s = op(g, OP_EWADD, op(g, OP_MATMUL, x, a, 2, NULL), op(g, OP_MATMUL, h, b, 2, NULL), 2,
                   NULL);
  graph_add_output(g, op(g, OP_RELU, s, s, 1, NULL), "y", NULL);
  graph_add_output(g, op(g, OP_MATMUL, xh, c, 2, NULL), "z", NULL);
  Priced p = price_all_checked(g);
  printf("duplicates: %d rewrites priced, %d derived, %d with another price\n", p.rewrites,
         p.derived, p.cheaper_or_dearer);
  CHECK(p.derived > 0 && p.derived < p.rewrites);
  graph_free(g);
}

/* Every directed rule on its own source side: the whole graph replaced,
 * graph outputs among the replaced tensors. */
static void test_priced_rule_sources(void) {
  CostModel *cm = cost_model_new();
  OptOptions o = OPT_DEFAULTS;
  o.zp_check_flops = 0;
  int rewrites = 0, derived = 0, bad = 0;
  for (int i = 0; i < opt_rules_count(rules); i++) {
    const Graph *src = opt_rules_source(rules, i);
    Priced p = {.cm = cm};
    p.orig = reference_price(cm, src, &p.orig_fused);
    OptStats st = {0};
    Diag d;
    diag_init(&d);
    CHECK(opt_apply_rule_priced(rules, i, src, cm, &o, check_priced, &p, &st, &d) == TEQ_OK);
    diag_flush(&d, stderr);
    diag_fini(&d);
    rewrites += p.rewrites, derived += p.derived, bad += p.bad_cost + p.bad_hash;
  }
  printf("rule sources: %d rewrites priced, %d derived\n", rewrites, derived);
  CHECK(derived > rewrites / 2);
  CHECK_EQ_INT(bad, 0);
  cost_model_free(cm);
}

/* A bias that is an expression of weights keeping channels apart (two
 * spread biases concatenated, then put through a relu) folds into the
 * convolution as the constant it computes; one that mixes channels' values
 * (a spread bias plus a weight that varies along H) stays an ewadd. */
static void test_bias_expression_folded(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 4, 6, 6)), none = {-1, 0};
  TensorRef c = conv(g, x, weight(g, "k", shape_of(4, 6, 4, 3, 3), 1), none, 1, ACT_NONE);
  TensorRef d2 = conv(g, x, weight(g, "k2", shape_of(4, 6, 4, 3, 3), 2), none, 1, ACT_NONE);
  Tensor *spread[2];
  for (int i = 0; i < 2; i++) {
    Shape s = shape_of(4, 1, 3, 6, 6);
    spread[i] = tensor_new(DT_F32, &s);
    for (int64_t e = 0; e < tensor_numel(spread[i]); e++)
      ((float *)spread[i]->data)[e] = (float)(e / 36) * (i ? -0.5f : 0.25f) - 0.1f;
  }
  TensorRef b1 = {graph_add_const(g, "b1", spread[0], NULL), 0};
  TensorRef b2 = {graph_add_const(g, "b2", spread[1], NULL), 0};
  TensorRef cat = concat1(g, b1, b2);
  TensorRef bias = op(g, OP_RELU, cat, cat, 1, NULL);
  graph_add_output(g, op(g, OP_RELU, op(g, OP_EWADD, c, bias, 2, NULL), none, 1, NULL), "y", NULL);
  TensorRef rows = weight(g, "rows", shape_of(4, 1, 6, 6, 6), 3);
  TensorRef mixed = op(g, OP_EWADD, bias, rows, 2, NULL);
  graph_add_output(g, op(g, OP_EWADD, d2, mixed, 2, NULL), "z", NULL);
  Graph *h = graph_copy(g);
  Diag d;
  diag_init(&d);
  int fused = 0;
  CHECK(opt_fuse_bias(h, &fused, &d) == TEQ_OK);
  CHECK_EQ_INT(fused, 2); /* y's bias, then its relu; z's stays */
  int biased = 0;
  for (int i = 0; i < h->n_nodes; i++)
    biased += h->nodes[i].kind == OP_CONV2D && h->nodes[i].n_in == 3;
  CHECK_EQ_INT(count_kind(h, OP_CONV2D), 2);
  CHECK_EQ_INT(biased, 1);
  CHECK_EQ_INT(count_kind(h, OP_EWADD), 2);
  ExecDiff diff;
  CHECK(exec_compare(g, h, EXEC_F32, 1, 0, 1e-6, &diff, &d) == TEQ_OK && !diff.differ);
  exec_diff_fini(&diff);
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(h);
  graph_free(g);
}

/* A [1, C, 6, 6] constant of one value per channel (vary_h: and along H,
 * which no convolution's bias can hold). */
static TensorRef spread_bias(Graph *g, int64_t channels, float scale, bool vary_h) {
  Shape s = shape_of(4, 1, channels, 6, 6);
  Tensor *t = tensor_new(DT_F32, &s);
  for (int64_t e = 0; e < tensor_numel(t); e++)
    ((float *)t->data)[e] = (float)(e / 36) * scale - 0.1f + (vary_h ? 0.01f * (float)(e / 6 % 6) : 0);
  return (TensorRef){graph_add_const(g, NULL, t, NULL), 0};
}

/* Two convolutions of one input side by side, then an epilogue after the
 * concat: shape 0 a spread bias and a relu; 1 each convolution with its
 * own bias, then a relu after the concat (the biases fold first, then the
 * relu is pushed); 2 a bias that varies along H, and a relu; 3 a relu
 * after a concat of a convolution and a pool; 4 a relu alone; 5 a relu,
 * one convolution with its own bias and one without. */
static Graph *concat_epilogue(int shape) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 4, 6, 6)), none = {-1, 0};
  TensorRef a = conv(g, x, weight(g, "k1", shape_of(4, 6, 4, 3, 3), 1), none, 1, ACT_NONE);
  TensorRef b = conv(g, x, weight(g, "k2", shape_of(4, 5, 4, 3, 3), 2), none, 1, ACT_NONE);
  if (shape == 1 || shape == 5) a = op(g, OP_EWADD, a, spread_bias(g, 6, 0.25f, false), 2, NULL);
  if (shape == 1) b = op(g, OP_EWADD, spread_bias(g, 5, -0.5f, false), b, 2, NULL);
  if (shape == 3) {
    Params p;
    params_default(OP_MAXPOOL, &p);
    param_set_ints(&p, param_index(OP_MAXPOOL, "kernel"), (int64_t[]){3, 3}, 2);
    param_set_ints(&p, param_index(OP_MAXPOOL, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
    b = op(g, OP_MAXPOOL, x, x, 1, &p);
  }
  int64_t channels = shape == 3 ? 10 : 11;
  TensorRef cat = concat1(g, a, b);
  if (shape == 0 || shape == 2)
    cat = op(g, OP_EWADD, cat, spread_bias(g, channels, 0.125f, shape == 2), 2, NULL);
  graph_add_output(g, op(g, OP_RELU, cat, cat, 1, NULL), "y", NULL);
  return g;
}

/* A per-channel bias or an activation after a concat of convolutions is
 * pushed into them on export (and priced so in the search, derived to the
 * last bit): SqueezeNet's fire after rules moved its relus and biases out
 * of the concat, on the way to merging its convolutions, costs what it
 * did before. What cannot be pushed stays. */
static void test_epilogue_through_concat(void) {
  static const int expect_biased[] = {2, 2, 0, 0, 0, 1}, expect_relus[] = {0, 0, 1, 1, 0, 0};
  static const int expect_relu_convs[] = {2, 2, 0, 0, 2, 2};
  for (int shape = 0; shape < 6; shape++) {
    Graph *g = concat_epilogue(shape), *h = graph_copy(g);
    Diag d;
    diag_init(&d);
    int fused = 0;
    CHECK(h && opt_fuse_bias(h, &fused, &d) == TEQ_OK);
    int biased = 0, relu_convs = 0;
    for (int i = 0; i < h->n_nodes; i++) {
      const Node *n = &h->nodes[i];
      if (n->kind != OP_CONV2D) continue;
      biased += n->n_in == 3;
      relu_convs += n->params.v[param_index(OP_CONV2D, "act")].i[0] == ACT_RELU;
    }
    CHECK_MSG(biased == expect_biased[shape] && count_kind(h, OP_RELU) == expect_relus[shape],
              "shape %d: %d convolutions with a bias, %d relus left", shape, biased,
              count_kind(h, OP_RELU));
    CHECK_EQ_INT(relu_convs, expect_relu_convs[shape]);
    CHECK_EQ_INT(count_kind(h, OP_EWADD), shape == 2 ? 1 : 0);
    CHECK(graph_check(h, &d) == TEQ_OK);
    ExecDiff diff;
    CHECK(exec_compare(g, h, EXEC_F32, 3, 0, 1e-6, &diff, &d) == TEQ_OK && !diff.differ);
    exec_diff_fini(&diff);
    Priced p = price_all_checked(g);
    CHECK(p.derived > 0);
    printf("concat epilogue %d: %d folds on export; %d rewrites priced, %d derived\n", shape,
           fused, p.rewrites, p.derived);
    diag_flush(&d, stderr);
    diag_fini(&d);
    graph_free(h);
    graph_free(g);
  }
}

/* NasRNN's first step: a merged product split into halves, each half plus
 * its own constant. The two adds become one on the whole product (the
 * rule with a wide matrix, proved with the axioms of element-wise
 * operators on the parts of a split), the constants concatenated. */
static void test_split_adds_merged(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 2, 24));
  TensorRef m = op(g, OP_MATMUL, x, int_weight(g, shape_of(2, 24, 64), 1), 2, NULL);
  Params halves;
  params_default(OP_SPLIT, &halves);
  param_set_int(&halves, param_index(OP_SPLIT, "axis"), 1);
  param_set_ints(&halves, param_index(OP_SPLIT, "sizes"), (int64_t[]){32, 32}, 2);
  int sp = graph_add_node(g, OP_SPLIT, &m, 1, 2, &halves, NULL, NULL);
  CHECK(sp >= 0);
  graph_add_output(g, op(g, OP_EWADD, (TensorRef){sp, 0}, int_weight(g, shape_of(2, 2, 32), 2), 2,
                         NULL), "a", NULL);
  graph_add_output(g, op(g, OP_EWADD, int_weight(g, shape_of(2, 2, 32), 3), (TensorRef){sp, 1}, 2,
                         NULL), "b", NULL);
  OptOptions o = OPT_DEFAULTS;
  o.budget = 20;
  OptStats st;
  Graph *best = searched(g, &o, &st, NULL);
  int adds = best ? count_kind(best, OP_EWADD) : -1;
  CHECK_MSG(adds == 1, "%d adds after the search", adds);
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* The committed table of H100 costs, found as the axioms are (main). */
static char table_path[1024];

/* SqueezeNet's fire (its expand convolutions, both 3x3 here: the rules of
 * this file have no enlarge): two convolutions of one input, each with its
 * own bias and relu, concatenated. Merging them moves both biases through
 * the concat (a rule with four distinct images) and leaves concat(B1, B2)
 * as the merged convolution's bias, which the search must price as folded.
 * Priced by the GPU's table: on it the steps between are about 10% dearer
 * (a relu and an ewadd beside convolutions), within reach of the search's
 * alpha; the analytic model prices a relu near a convolution. */
static void test_fire_merged(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 16, 55, 55));
  TensorRef a = conv(g, x, int_weight(g, shape_of(4, 64, 16, 3, 3), 1),
                     int_weight(g, shape_of(1, 64), 2), 1, ACT_RELU);
  TensorRef b = conv(g, x, int_weight(g, shape_of(4, 64, 16, 3, 3), 3),
                     int_weight(g, shape_of(1, 64), 4), 1, ACT_RELU);
  graph_add_output(g, concat1(g, a, b), "y", NULL);
  Graph *plain = graph_copy(g), *best = NULL;
  Diag d;
  diag_init(&d);
  CHECK(opt_split_bias(plain, NULL, &d) == TEQ_OK);
  CostModel *cm = cost_model_new();
  CHECK_MSG(cost_model_load_table(cm, table_path, NULL, &d) == TEQ_OK, "%s", diag_last(&d));
  OptOptions o = OPT_DEFAULTS;
  o.budget = 50;
  OptStats st;
  CHECK(opt_search(plain, rules, cm, &o, &best, &st, &d) == TEQ_OK);
  CHECK(best && opt_fold_weights(best, NULL, &d) == TEQ_OK && opt_fuse_bias(best, NULL, &d) == TEQ_OK);
  int convs = best ? count_kind(best, OP_CONV2D) : -1;
  CHECK_MSG(convs == 1 && graph_count_ops(best) == 1, "%d convolutions, %d operators after the search",
            convs, graph_count_ops(best));
  CHECK(best && equal_outputs(g, best));
  Priced p = price_all(plain, cm);
  CHECK_EQ_INT(p.bad_cost, 0);
  CHECK_EQ_INT(p.bad_hash, 0);
  printf("fire: merged into %d operator after %lld graphs expanded; %d rewrites priced, %d "
         "derived\n", graph_count_ops(best), (long long)st.explored, p.rewrites, p.derived);
  diag_flush(&d, stderr);
  diag_fini(&d);
  cost_model_free(cm);
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(plain);
  graph_free(g);
}

static void load_rules(const char *axioms) {
  char db[320];
  snprintf(db, sizeof db, "%s/rules.sqlite", tmpdir);
  GenOptions go = {.depth = 3, .ops = "matmul,conv2d,ewadd,relu,transpose,concat,split",
                   .db_path = db, .threads = 2, .seed = 1, .quiet = true};
  GenSummary gs;
  VerifySummary vs;
  Diag d;
  diag_init(&d);
  CHECK(gen_rules_run(&go, &gs, &d) == TEQ_OK);
  /* The rules of products into the same database: transposed operands as
   * gemm's flags, and a relu fused into the product. */
  GenOptions layouts = go;
  layouts.depth = 2, layouts.ops = "matmul,transpose,gemm,relu,matmul_relu";
  CHECK(gen_rules_run(&layouts, &gs, &d) == TEQ_OK);
  /* Before verify-rules nothing is proved: the set is refused. */
  OptRules *none = NULL;
  CHECK(opt_rules_load(db, false, &none, &d) == TEQ_ERR_INPUT);
  CHECK(strstr(diag_last(&d), "proved") != NULL);
  diag_fini(&d);
  diag_init(&d);
  VerifyOptions vo = {.db_path = db, .axioms_path = axioms, .timeout_ms = 10000, .jobs = 2,
                      .seed = 1, .quiet = true};
  CHECK(verify_rules_run(&vo, &vs, &d) == TEQ_OK);
  CHECK(opt_rules_load(db, false, &rules, &d) == TEQ_OK);
  diag_flush(&d, stderr);
  diag_fini(&d);
  printf("%d directed rules from %lld proved\n", rules ? opt_rules_count(rules) : 0,
         (long long)vs.decided[VERIFY_PROVED]);
  /* A database that is not there. */
  diag_init(&d);
  OptRules *missing = NULL;
  char path[340];
  snprintf(path, sizeof path, "%s/none.sqlite", tmpdir);
  CHECK(opt_rules_load(path, false, &missing, &d) == TEQ_ERR_INPUT);
  diag_fini(&d);
}

/* Prices of a few configurations, as a GPU measured them. */
typedef struct Price {
  const char *config;
  double us;
} Price;

/* g searched (budget 20) with the costs of a table holding prices alone
 * (written to TMPDIR/file; the analytic model beyond it); *before and
 * *after are g's cost and the result's under them. */
static Graph *searched_at(const Graph *g, const char *file, const Price *prices, int n,
                          OptStats *st, double *before, double *after) {
  char path[360];
  snprintf(path, sizeof path, "%s/%s", tmpdir, file);
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return NULL;
  fprintf(f, "# device\tconfiguration\tmedian_us\tmin_us\talgo\n");
  for (int i = 0; i < n; i++)
    fprintf(f, "valley\t%s\t%.2f\t%.2f\t-\n", prices[i].config, prices[i].us, prices[i].us);
  CHECK(fclose(f) == 0);
  Diag d;
  diag_init(&d);
  CostModel *cm = cost_model_new();
  CHECK_MSG(cost_model_load_table(cm, path, NULL, &d) == TEQ_OK, "%s", diag_last(&d));
  OptOptions o = OPT_DEFAULTS;
  o.budget = 20;
  Graph *best = NULL;
  CHECK(opt_graph_cost(cm, g, before, NULL, &d) == TEQ_OK);
  CHECK(opt_search(g, rules, cm, &o, &best, st, &d) == TEQ_OK);
  CHECK(best && opt_graph_cost(cm, best, after, NULL, &d) == TEQ_OK);
  diag_flush(&d, stderr);
  diag_fini(&d);
  cost_model_free(cm);
  return best;
}

/* Eight products of one input whose pairwise merges are dearer than the
 * products they replace, while all eight merged are far cheaper: the
 * prices of NasRNN's cell on the H100 (a product 1024 wide at 7.3 us
 * against two 512 wide at 3.0 each; 4096 wide at 4.7). Applied at all
 * sites once, the merge is a valley; its later rounds (merge_rounds) reach
 * the one wide product in three. */
static void test_merge_rounds(void) {
  enum { PRODUCTS = 8 };
  static const Price prices[] = {{"matmul [1,1024] [1024,512] {act=none}", 2.95},
                                 {"matmul [1,1024] [1024,1024] {act=none}", 7.26},
                                 {"matmul [1,1024] [1024,1536] {act=none}", 7.27},
                                 {"matmul [1,1024] [1024,2048] {act=none}", 3.70},
                                 {"matmul [1,1024] [1024,4096] {act=none}", 4.70}};
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 1, 1024));
  for (int i = 0; i < PRODUCTS; i++) {
    TensorRef y = op(g, OP_MATMUL, x, int_weight(g, shape_of(2, 1024, 512), i), 2, NULL);
    graph_add_output(g, op(g, OP_TANH, y, y, 1, NULL), NULL, NULL);
  }
  OptStats st;
  double before = NAN, after = NAN;
  Graph *best = searched_at(g, "products.tsv", prices, 5, &st, &before, &after);
  int products = best ? count_kind(best, OP_MATMUL) + count_kind(best, OP_GEMM) : -1;
  printf("eight products of one input: %.2f -> %.2f us, %d products after %lld graphs expanded\n",
         before, after, products, (long long)st.explored);
  CHECK_MSG(products == 1, "%d products left", products);
  CHECK(before - after > 18.0); /* 8 x 2.95 - 4.70, the tanh unchanged */
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* A chain of n element-wise operators searched with windows of 8: a
 * sliver under half a window joins the first one, and a first pass of one
 * window that took the whole graph leaves no seam for a second pass. */
static int windows_for_chain(int n) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 4, 4));
  for (int i = 0; i < n; i++) x = op(g, i % 2 ? OP_RELU : OP_NEG, x, x, 1, NULL);
  graph_add_output(g, x, "y", NULL);
  OptOptions o = OPT_DEFAULTS;
  o.budget = 2;
  o.window = 8;
  OptStats st;
  graph_free(searched(g, &o, &st, NULL));
  int windows = st.windows;
  opt_stats_fini(&st);
  graph_free(g);
  return windows;
}

static void test_one_window(void) {
  int joined = windows_for_chain(11), two = windows_for_chain(16);
  printf("windows of 8: %d for 11 operators, %d for 16\n", joined, two);
  CHECK_EQ_INT(joined, 1);
  CHECK(two >= 3); /* two in the first pass, and the shifted second pass */
}

/* A recurrent chain whose every step multiplies the state by two weights,
 * in windows of 10: each window merges its steps' two products into one,
 * leaving fewer operators before the rest, and the next window starts
 * where this one now ends: the first pass's windows hold each operator
 * once. Windows that started a fixed stride apart passed over those a
 * merge moved below the stride (NasRNN at twice its steps: 1.970 where
 * one window reaches 2.128). */
static void test_windows_cover_every_step(void) {
  enum { STEPS = 16 };
  Graph *g = graph_new();
  TensorRef h = input(g, "h", shape_of(2, 1, 16));
  for (int t = 0; t < STEPS; t++) {
    TensorRef p[4];
    for (int i = 0; i < 4; i++)
      p[i] = op(g, OP_MATMUL, h, int_weight(g, shape_of(2, 16, 16), 4 * t + i), 2, NULL);
    TensorRef sum = op(g, OP_EWADD, op(g, OP_EWADD, p[0], p[1], 2, NULL),
                       op(g, OP_EWMUL, p[2], p[3], 2, NULL), 2, NULL);
    h = op(g, OP_TANH, sum, sum, 1, NULL);
  }
  graph_add_output(g, h, "h", NULL);
  OptOptions o = OPT_DEFAULTS;
  o.budget = 20;
  o.window = 10;
  o.pet = false;
  OptStats st;
  Graph *best = searched(g, &o, &st, NULL);
  int products = best ? count_kind(best, OP_MATMUL) + count_kind(best, OP_GEMM) : -1;
  printf("a chain of %d steps in windows of 10: %d windows, %d products\n", STEPS, st.windows,
         products);
  CHECK(st.windows >= 4);
  CHECK_EQ_INT(st.first_pass_ops, STEPS * 8);
  CHECK_EQ_INT(products, STEPS);
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* The constant the product of x reads once its weights are folded. */
static const Tensor *folded_weight(const Graph *g) {
  for (int i = 0; i < g->n_nodes; i++)
    if (g->nodes[i].kind == OP_MATMUL) return g->nodes[g->nodes[i].in[1].node].value;
  return NULL;
}

/* Folds taken from a memo: two copies of x (w1 | w2) fold to the very same
 * tensor, holding what a fold without the memo computes; the graph
 * finished (opt_finish) costs what opt_finished_cost says, with a memo
 * (twice: the second takes PET's verdict on the transposes from it) or
 * without, its weights are folded and its transposes, which meet across
 * a relu, are gone. */
static void test_fold_memo_and_finish(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 2, 8));
  TensorRef w = concat1(g, int_weight(g, shape_of(2, 8, 4), 1), int_weight(g, shape_of(2, 8, 4), 2));
  TensorRef y = op(g, OP_MATMUL, x, w, 2, NULL);
  graph_add_output(g, y, "y", NULL);
  TensorRef t = op(g, OP_TRANSPOSE, op(g, OP_RELU, op(g, OP_TRANSPOSE, y, y, 1, NULL), y, 1, NULL),
                   y, 1, NULL);
  graph_add_output(g, t, "z", NULL);
  Graph *a = graph_copy(g), *b = graph_copy(g), *plain = graph_copy(g);
  OptFoldMemo *memo = opt_fold_memo_new();
  Diag d;
  diag_init(&d);
  int n = 0;
  CHECK(opt_fold_weights_memo(a, memo, &n, &d) == TEQ_OK && n == 1);
  CHECK(opt_fold_weights_memo(b, memo, &n, &d) == TEQ_OK && n == 1);
  CHECK(opt_fold_weights(plain, NULL, &d) == TEQ_OK);
  const Tensor *ta = folded_weight(a), *tb = folded_weight(b), *tp = folded_weight(plain);
  CHECK(ta && ta == tb && tp && tp != ta);
  CHECK(ta && tp && tensor_bytes(ta) == tensor_bytes(tp) &&
        !memcmp(ta->data, tp->data, tensor_bytes(tp)));
  CostModel *cm = cost_model_new();
  double us = -1, again = -1;
  OptFinish f = {0};
  Graph *fin = graph_copy(g);
  OptFinishMemo fm = {.folds = memo, .post = pet_post_cache_new()};
  CHECK(fm.post && opt_finished_cost(cm, g, true, &fm, &us, &d) == TEQ_OK);
  CHECK(fm.post && opt_finished_cost(cm, g, true, &fm, &again, &d) == TEQ_OK);
  CHECK(opt_finish(cm, &fin, true, NULL, &f, &d) == TEQ_OK);
  CHECK_MSG(us > 0 && us == f.us && again == us, "%g, %g against %g", us, again, f.us);
  CHECK(f.folded == 1 && count_kind(fin, OP_CONCAT) == 0 && equal_outputs(g, fin));
  CHECK_MSG(f.posted && count_kind(fin, OP_TRANSPOSE) == 0, "%d transposes left",
            count_kind(fin, OP_TRANSPOSE));
  diag_flush(&d, stderr);
  diag_fini(&d);
  cost_model_free(cm);
  pet_post_cache_free(fm.post);
  opt_fold_memo_free(memo);
  graph_free(fin), graph_free(a), graph_free(b), graph_free(plain), graph_free(g);
}

/* Biases judged through a memo (the fold memo's verdicts on biases): two
 * convolutions whose biases are spread as the search spreads them, the
 * second's spread copy one value off at one position, are finished twice
 * through one memo (the second time from what it remembers) and once
 * without. Each time the first bias, with its own values, folds into its
 * convolution as a bias, the second only as a residual, and the outputs
 * are the original's. */
static void test_finish_memo_biases(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 3, 6, 6));
  Params p;
  params_default(OP_CONV2D, &p);
  for (int k = 0; k < 2; k++) {
    TensorRef in[3] = {x, int_weight(g, shape_of(4, 4, 3, 3, 3), 1 + k),
                       int_weight(g, shape_of(1, 4), 3 + k)};
    int c = graph_add_node(g, OP_CONV2D, in, 3, 1, &p, NULL, NULL);
    CHECK(c >= 0);
    graph_add_output(g, (TensorRef){c, 0}, k ? "y1" : "y0", NULL);
  }
  Diag d;
  diag_init(&d);
  int split = 0;
  CHECK(opt_split_bias(g, &split, &d) == TEQ_OK && split == 2);
  Tensor *spread = NULL; /* the second spread bias */
  for (int n = 0; n < g->n_nodes; n++)
    if (g->nodes[n].kind == OP_CONST && g->nodes[n].out[0].ndim == 4) spread = g->nodes[n].value;
  CHECK(spread && tensor_numel(spread) == 4 * 4 * 4);
  if (spread) ((float *)spread->data)[21] += 1.0f;
  CostModel *cm = cost_model_new();
  OptFinishMemo fm = {.folds = opt_fold_memo_new()};
  for (int k = 0; k < 3; k++) {
    Graph *f = graph_copy(g);
    OptFinish fin = {0};
    CHECK(f && opt_finish(cm, &f, false, k < 2 ? &fm : NULL, &fin, &d) == TEQ_OK);
    CHECK_MSG(fin.fused == 1 && fin.residuals == 1, "finish %d: %d fused, %d residuals", k,
              fin.fused, fin.residuals);
    CHECK_MSG(equal_outputs(g, f), "finish %d", k);
    graph_free(f);
  }
  diag_flush(&d, stderr);
  diag_fini(&d);
  opt_fold_memo_free(fm.folds);
  cost_model_free(cm);
  graph_free(g);
}

/* Folds that read folds: t = transpose(concat(w1, w2)) is a graph output
 * and feeds a product through a transpose, and a transpose of t is
 * another output. Four nodes fold in three sweeps (each sweep points
 * readers at its constants at once), no layout operator is left, and
 * every output is what it was (exactly in Z_p: these only move elements). */
static void test_fold_chains(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 3, 4));
  TensorRef c = concat1(g, int_weight(g, shape_of(2, 4, 4), 3), int_weight(g, shape_of(2, 4, 4), 4));
  TensorRef t = op(g, OP_TRANSPOSE, c, c, 1, NULL);
  graph_add_output(g, t, "t", NULL);
  graph_add_output(g, op(g, OP_TRANSPOSE, t, t, 1, NULL), "u", NULL);
  graph_add_output(g, op(g, OP_MATMUL, x, op(g, OP_TRANSPOSE, t, t, 1, NULL), 2, NULL), "y", NULL);
  Graph *f = graph_copy(g);
  Diag d;
  diag_init(&d);
  int n = 0;
  CHECK(f && opt_fold_weights(f, &n, &d) == TEQ_OK);
  CHECK_MSG(n == 4, "%d folded", n);
  CHECK(f && count_kind(f, OP_CONCAT) + count_kind(f, OP_TRANSPOSE) == 0);
  CHECK(f && graph_check(f, &d) == TEQ_OK && equal_outputs(g, f));
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(f), graph_free(g);
}

/* A graph only priced holds no values of weights nothing reads: a
 * product's concatenated weight becomes a constant without data, while a
 * bias (an add's operand) and what computes it (a product of two weights,
 * one of them concatenated) are folded by value. */
static void test_fold_for_price(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 2, 8));
  TensorRef w = concat1(g, int_weight(g, shape_of(2, 8, 4), 1), int_weight(g, shape_of(2, 8, 4), 2));
  TensorRef y = op(g, OP_MATMUL, x, w, 2, NULL);
  TensorRef row = op(g, OP_MATMUL, weight(g, "a", shape_of(2, 2, 1), 5),
                     concat1(g, int_weight(g, shape_of(2, 1, 4), 3), int_weight(g, shape_of(2, 1, 4), 4)),
                     2, NULL);
  graph_add_output(g, op(g, OP_EWADD, y, row, 2, NULL), "z", NULL);
  Diag d;
  diag_init(&d);
  int n = 0;
  CHECK(opt_fold_weights_for_price(g, NULL, &n, &d) == TEQ_OK);
  CHECK_MSG(n == 3, "%d folded", n);
  int unbacked = 0, backed = 0;
  for (int i = 0; i < g->n_nodes; i++) {
    const Node *nd = &g->nodes[i];
    if (nd->kind != OP_MATMUL && nd->kind != OP_EWADD) continue;
    for (int j = 0; j < nd->n_in; j++) {
      const Node *c = &g->nodes[nd->in[j].node];
      if (c->kind != OP_CONST) continue;
      if (nd->kind == OP_MATMUL) unbacked += !c->value->data;
      else backed += c->value->data != NULL;
    }
  }
  CHECK_MSG(unbacked == 1 && backed == 1, "%d without data, %d with", unbacked, backed);
  CHECK(count_kind(g, OP_CONCAT) == 0 && count_kind(g, OP_MATMUL) == 1);
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(g);
}

/* Two inputs each multiplied by two weights, once at each end of a chain
 * longer than three windows: no window holds both products of an input,
 * nor does the shifted second pass; the expansions of the whole graph
 * after the windows (search_whole), which apply a rule at all its sites,
 * merge each input's two into one product, and the result still computes
 * what the original does. */
static void test_whole_graph_after_windows(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(2, 1, 64)), y = input(g, "y", shape_of(2, 1, 64));
  TensorRef h = op(g, OP_EWMUL, op(g, OP_MATMUL, x, int_weight(g, shape_of(2, 64, 64), 1), 2, NULL),
                   op(g, OP_MATMUL, y, int_weight(g, shape_of(2, 64, 64), 2), 2, NULL), 2, NULL);
  for (int i = 0; i < 30; i++) h = op(g, i % 2 ? OP_RELU : OP_NEG, h, h, 1, NULL);
  TensorRef late = op(g, OP_EWMUL, op(g, OP_MATMUL, x, int_weight(g, shape_of(2, 64, 64), 3), 2, NULL),
                      op(g, OP_MATMUL, y, int_weight(g, shape_of(2, 64, 64), 4), 2, NULL), 2, NULL);
  graph_add_output(g, op(g, OP_EWADD, h, late, 2, NULL), "y", NULL);
  OptOptions o = OPT_DEFAULTS;
  o.budget = 5;
  o.window = 8;
  o.pet = false;
  char *text;
  OptStats st;
  Graph *best = searched_told(g, o, &st, &text);
  CHECK(st.windows >= 4);
  CHECK_MSG(text && strstr(text, "optimize: the whole graph ("), "%s", text ? text : "");
  CHECK_MSG(best && count_kind(best, OP_MATMUL) == 2, "%d products after the search",
            best ? count_kind(best, OP_MATMUL) : -1);
  CHECK(best && equal_outputs(g, best));
  free(text);
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* The halves of a split along the columns. */
static int halves1(Graph *g, TensorRef x) {
  int64_t w = graph_shape(g, x)->d[1];
  Params ps;
  params_default(OP_SPLIT, &ps);
  param_set_int(&ps, param_index(OP_SPLIT, "axis"), 1);
  param_set_ints(&ps, param_index(OP_SPLIT, "sizes"), (int64_t[]){w / 2, w / 2}, 2);
  return graph_add_node(g, OP_SPLIT, &x, 1, 2, &ps, NULL, NULL);
}

/* The adds of two wide products cut into quarters (NasRNN's x W + h U
 * after each side's products merged): merging a pair of adds leaves
 * concat(split(a)) of the one side, which only a removal rule takes away,
 * and then the merged pairs merge again. With the removals applied after
 * each round, the four adds become one. */
static void test_merged_adds(void) {
  Graph *g = graph_new();
  TensorRef a = input(g, "a", shape_of(2, 1, 256)), b = input(g, "b", shape_of(2, 1, 256));
  int sa = halves1(g, a), sb = halves1(g, b);
  for (int i = 0; i < 2; i++) {
    int qa = halves1(g, (TensorRef){sa, i}), qb = halves1(g, (TensorRef){sb, i});
    for (int j = 0; j < 2; j++) {
      TensorRef t = op(g, OP_EWADD, (TensorRef){qa, j}, (TensorRef){qb, j}, 2, NULL);
      graph_add_output(g, op(g, OP_TANH, t, t, 1, NULL), NULL, NULL);
    }
  }
  /* The H100's prices: an add or a tanh about the same at every width
   * here, a concat dearer than an add. */
  static const Price prices[] = {
    {"ewadd [1,64] [1,64] {}", 1.48},        {"ewadd [1,128] [1,128] {}", 1.50},
    {"ewadd [1,256] [1,256] {}", 1.52},      {"concat [1,64] [1,64] {axis=1}", 2.01},
    {"concat [1,128] [1,128] {axis=1}", 2.01}, {"tanh [1,64] {}", 1.46}};
  OptStats st;
  double before = NAN, after = NAN;
  Graph *best = searched_at(g, "adds.tsv", prices, 6, &st, &before, &after);
  int adds = best ? count_kind(best, OP_EWADD) : -1, concats = best ? count_kind(best, OP_CONCAT) : -1;
  printf("four adds of quarters: %.2f -> %.2f us, %d adds, %d concats after %lld graphs "
         "expanded\n", before, after, adds, concats, (long long)st.explored);
  CHECK_MSG(adds == 1 && concats == 0, "%d adds, %d concats", adds, concats);
  CHECK(best && equal_outputs(g, best));
  opt_stats_fini(&st);
  graph_free(best);
  graph_free(g);
}

/* A dense block as DenseNet exports it: layer k convolves concat(x0, f1,
 * ..., fk-1), a new concat of every feature so far (layer 1 a concat of x0
 * alone), and the block ends in the concat of them all. Each feature is a
 * piece of every later concat, so none is written in place. With every
 * concat taking the one before it as its first piece, each feature is in
 * one concat only and the whole block lives in the last one's buffer:
 * the same outputs (exactly, in Z_p), the kernels' cost unchanged, and the
 * cost as run less by every concat. */
static void test_concat_prefixes_shared(void) {
  Graph *g = graph_new();
  TensorRef x0 = op(g, OP_RELU, input(g, "x", shape_of(4, 1, 8, 6, 6)), (TensorRef){0}, 1, NULL);
  TensorRef feature[5] = {x0};
  Params cp;
  params_default(OP_CONCAT, &cp);
  param_set_int(&cp, param_index(OP_CONCAT, "axis"), 1);
  TensorRef cat = {-1, 0};
  for (int k = 1; k <= 5; k++) {
    int id = graph_add_node(g, OP_CONCAT, feature, k, 1, &cp, NULL, NULL);
    CHECK(id >= 0);
    cat = (TensorRef){id, 0};
    if (k == 5) break;
    TensorRef w = int_weight(g, shape_of(4, 4, 8 + 4 * (k - 1), 3, 3), k);
    feature[k] = conv(g, op(g, OP_RELU, cat, (TensorRef){0}, 1, NULL), w, (TensorRef){-1, 0}, 1,
                      ACT_NONE);
  }
  graph_add_output(g, cat, "y", NULL);
  Graph *shared = graph_copy(g);
  Diag d;
  diag_init(&d);
  int n = -1;
  CHECK(opt_share_concat_prefixes(shared, &n, &d) == TEQ_OK);
  CHECK_EQ_INT(n, 4); /* layer 1's concat has no shorter one before it */
  CHECK(graph_check(shared, &d) == TEQ_OK);
  CHECK(equal_outputs(g, shared));
  CHECK_EQ_INT(count_kind(shared, OP_CONCAT), 5);
  int32_t *home_before = graph_piece_homes(g), *home = graph_piece_homes(shared);
  int in_place_before = 0, in_place = 0;
  for (int i = 0; i < g->n_nodes; i++)
    in_place_before += graph_node_in_place(g, i, home_before, NULL, NULL);
  for (int i = 0; i < shared->n_nodes; i++) in_place += graph_node_in_place(shared, i, home, NULL, NULL);
  CHECK_EQ_INT(in_place_before, 0);
  CHECK_EQ_INT(in_place, 5);
  free(home_before);
  free(home);
  CostModel *cm = cost_model_new();
  double kernels_before = 0, kernels = 0, run_before = 0, run = 0;
  CHECK(opt_graph_cost(cm, g, &kernels_before, NULL, &d) == TEQ_OK);
  CHECK(opt_graph_cost_run(cm, g, &run_before, NULL, NULL, &d) == TEQ_OK);
  CHECK(opt_graph_cost(cm, shared, &kernels, NULL, &d) == TEQ_OK);
  CHECK(opt_graph_cost_run(cm, shared, &run, NULL, NULL, &d) == TEQ_OK);
  CHECK(run_before == kernels_before && run < kernels && run < run_before);
  CHECK_MSG(fabs(kernels - kernels_before) <= 1e-9 * kernels, "kernels %g us, before %g", kernels,
            kernels_before);
  cost_model_free(cm);
  /* A second pass finds nothing more to share. */
  CHECK(opt_share_concat_prefixes(shared, &n, &d) == TEQ_OK);
  CHECK_EQ_INT(n, 0);
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(shared);
  graph_free(g);
}

/* A split of split s's input into pieces of these channel counts. */
static int split_channels(Graph *g, TensorRef x, const int64_t *sizes, int n) {
  Params p;
  params_default(OP_SPLIT, &p);
  param_set_int(&p, param_index(OP_SPLIT, "axis"), 1);
  param_set_ints(&p, param_index(OP_SPLIT, "sizes"), sizes, n);
  int id = graph_add_node(g, OP_SPLIT, &x, 1, n, &p, NULL, NULL);
  CHECK(id >= 0);
  return id;
}

/* A conv merged with its siblings leaves split(conv) with each piece's
 * bias add and relu after it. opt_fold_through_splits takes the adds into
 * the conv's bias (zeros for the piece without one) and the relus, one per
 * piece, before the split, where opt_fuse_bias makes them the conv's act:
 * no add, no relu left, the same outputs, a lower cost as run. Pieces that
 * end in two different activations stay as they are. */
static void test_fold_through_splits(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 8, 6, 6));
  TensorRef y = conv(g, x, int_weight(g, shape_of(4, 12, 8, 1, 1), 1), (TensorRef){-1, 0}, 0,
                     ACT_NONE);
  int s = split_channels(g, y, (const int64_t[]){4, 4, 4}, 3);
  Tensor *b = tensor_new(DT_F32, &(Shape){4, {1, 4, 6, 6}});
  for (int64_t e = 0; e < tensor_numel(b); e++) ((float *)b->data)[e] = (float)(e / 36) - 2;
  TensorRef bias = {graph_add_const(g, NULL, b, NULL), 0};
  TensorRef biased = op(g, OP_EWADD, (TensorRef){s, 0}, bias, 2, NULL);
  TensorRef r0 = op(g, OP_RELU, biased, (TensorRef){0}, 1, NULL);
  TensorRef r1 = op(g, OP_RELU, (TensorRef){s, 1}, (TensorRef){0}, 1, NULL);
  /* Another split, whose pieces end in a relu and a sigmoid: left alone. */
  int s2 = split_channels(g, (TensorRef){s, 2}, (const int64_t[]){2, 2}, 2);
  TensorRef r2 = op(g, OP_RELU, (TensorRef){s2, 0}, (TensorRef){0}, 1, NULL);
  TensorRef g2 = op(g, OP_SIGMOID, (TensorRef){s2, 1}, (TensorRef){0}, 1, NULL);
  graph_add_output(g, r0, "r0", NULL);
  graph_add_output(g, r1, "r1", NULL);
  graph_add_output(g, r2, "r2", NULL);
  graph_add_output(g, g2, "g2", NULL);
  Graph *f = graph_copy(g);
  Diag d;
  diag_init(&d);
  CostModel *cm = cost_model_new();
  double before = 0, after = 0;
  int moved = -1, fused = 0;
  CHECK(opt_graph_cost_run(cm, g, &before, NULL, NULL, &d) == TEQ_OK);
  CHECK(opt_fold_through_splits(cm, &f, &moved, &fused, &d) == TEQ_OK);
  CHECK(opt_graph_cost_run(cm, f, &after, NULL, NULL, &d) == TEQ_OK);
  CHECK(graph_check(f, &d) == TEQ_OK);
  CHECK(equal_outputs(g, f));
  CHECK_MSG(after < before, "%g us after, %g before", after, before);
  /* The add (one piece) and then the relus of s's first two pieces ... */
  CHECK_MSG(moved >= 1 && count_kind(f, OP_EWADD) == 0, "moved %d, %d adds", moved,
            count_kind(f, OP_EWADD));
  /* ... which cannot reach the conv past the third piece's sigmoid. */
  CHECK_EQ_INT(count_kind(f, OP_SIGMOID), 1);
  int with_bias = 0;
  for (int i = 0; i < f->n_nodes; i++)
    with_bias += f->nodes[i].kind == OP_CONV2D && f->nodes[i].n_in == 3;
  CHECK_EQ_INT(with_bias, 1);
  /* Nothing more to do. */
  int again = -1;
  CHECK(opt_fold_through_splits(cm, &f, &again, NULL, &d) == TEQ_OK);
  CHECK_EQ_INT(again, 0);
  cost_model_free(cm);
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(f);
  graph_free(g);
}

/* Every piece of a conv's split ends in a relu: the relus become one before
 * the split, and the conv's fused act. */
static void test_act_through_split(void) {
  Graph *g = graph_new();
  TensorRef x = input(g, "x", shape_of(4, 1, 8, 6, 6));
  TensorRef y = conv(g, x, int_weight(g, shape_of(4, 12, 8, 1, 1), 2), (TensorRef){-1, 0}, 0,
                     ACT_NONE);
  int s = split_channels(g, y, (const int64_t[]){4, 8}, 2);
  int s2 = split_channels(g, (TensorRef){s, 1}, (const int64_t[]){4, 4}, 2);
  TensorRef r[3] = {op(g, OP_RELU, (TensorRef){s, 0}, (TensorRef){0}, 1, NULL),
                    op(g, OP_RELU, (TensorRef){s2, 0}, (TensorRef){0}, 1, NULL),
                    op(g, OP_RELU, (TensorRef){s2, 1}, (TensorRef){0}, 1, NULL)};
  for (int j = 0; j < 3; j++) graph_add_output(g, r[j], NULL, NULL);
  Graph *f = graph_copy(g);
  Diag d;
  diag_init(&d);
  CostModel *cm = cost_model_new();
  int moved = -1, fused = 0;
  CHECK(opt_fold_through_splits(cm, &f, &moved, &fused, &d) == TEQ_OK);
  CHECK(equal_outputs(g, f));
  CHECK_EQ_INT(moved, 4); /* s2's two relus, then s's two */
  CHECK_EQ_INT(fused, 1);
  CHECK_EQ_INT(count_kind(f, OP_RELU), 0);
  int relu_conv = 0;
  for (int i = 0; i < f->n_nodes; i++)
    relu_conv += f->nodes[i].kind == OP_CONV2D &&
                 param_int(&f->nodes[i].params, param_index(OP_CONV2D, "act")) == ACT_RELU;
  CHECK_EQ_INT(relu_conv, 1);
  cost_model_free(cm);
  diag_flush(&d, stderr);
  diag_fini(&d);
  graph_free(f);
  graph_free(g);
}

int main(void) {
  /* The axioms beside the sources, found from where the compiler saw this
   * file (meson runs tests where it compiled them), unless TEQ_AXIOMS says. */
  static char path[1024];
  const char *axioms = getenv("TEQ_AXIOMS");
  if (!axioms) {
    const char *self = __FILE__, *tail = strstr(self, "tests/optimize/test_optimize.c");
    snprintf(path, sizeof path, "%.*sspecs/ops.axioms", tail ? (int)(tail - self) : 0, self);
    axioms = path;
  }
  if (access(axioms, R_OK)) check_skip("specs/ops.axioms not found (set TEQ_AXIOMS)");
  /* The first H100 table, kept as it was: the searches below are sized to
   * its prices (tools/profiles/h100.tsv grows with every GPU session). */
  snprintf(table_path, sizeof table_path, "%.*stests/data/h100-2026-11-22.tsv",
           (int)(strlen(axioms) - strlen("specs/ops.axioms")), axioms);
  snprintf(tmpdir, sizeof tmpdir, "%s/teq-opt-XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  CHECK(mkdtemp(tmpdir) != NULL);
  load_rules(axioms);
  if (!rules) return check_exit();
  test_shared_matmul();
  test_split_concat();
  test_broadcast_refused();
  test_cycle_rejected();
  test_opaque_survives();
  test_no_match_unchanged();
  test_unsound_refused_when_kept();
  test_unsound_refused_when_taken();
  test_search_equivalent();
  test_full_queue();
  test_every_site();
  test_merge_rounds();
  test_merged_adds();
  test_one_window();
  test_whole_graph_after_windows();
  test_windows_cover_every_step();
  test_fold_memo_and_finish();
  test_finish_memo_biases();
  test_fold_chains();
  test_fold_for_price();
  test_wide_nodes();
  test_window_seams();
  test_bias_round_trip();
  test_layout_absorbed();
  test_relu_fused();
  test_every_rule_on_itself();
  test_priced_convs();
  test_priced_matmuls();
  test_priced_duplicates();
  test_priced_rule_sources();
  test_bias_expression_folded();
  test_epilogue_through_concat();
  test_fire_merged();
  test_split_adds_merged();
  test_concat_prefixes_shared();
  test_fold_through_splits();
  test_act_through_split();
  opt_rules_free(rules);
  char cmd[400];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
  CHECK(system(cmd) == 0);
  return check_exit();
}
