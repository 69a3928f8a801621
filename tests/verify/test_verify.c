/* test_verify.c: verify-rules proves what it must, refutes what is false
 * with a counterexample, and reads and checks its axioms.
 *
 * Rules are built by hand as runtime graphs at gen-rules' shape A: matmul
 * associativity, TASO's Fig. 2b, conv+relu fusion and avgpool as a conv
 * with C_pool must be proved from specs/ops.axioms; concat regrouped the
 * way TASO's associativity axiom allowed, relu distributed over ewadd and a
 * grouped-convolution merge at incompatible shapes must be refuted with a
 * counterexample. Then gen-rules writes its depth-2 database and every
 * rule in it must be proved, stored, and skipped on a rerun. The parser's
 * errors carry file:line:col; a deliberately false axiom is found by
 * validation; every registry axiom_name is declared in the file. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gen/gen.h"
#include "ruledb/ruledb.h"
#include "runtime/graph.h"
#include "tests/check.h"
#include "verify/verify.h"

static const char *axioms_path;
static Axioms *axioms;
static char tmpdir[] = "/tmp/teq-verify-XXXXXX";

/* ---- building rule sides ---- */

typedef struct Side {
  Graph *g;
  Diag d;
} Side;

static Side side_new(int n_vars, const Shape *shapes) {
  Side s = {graph_new(), {0}};
  diag_init(&s.d);
  for (int i = 0; i < n_vars; i++) {
    char name[8];
    snprintf(name, sizeof name, "v%d", i + 1);
    CHECK(graph_add_input(s.g, name, &shapes[i], DT_F32, &s.d) == i);
  }
  return s;
}

static TensorRef var(int i) { return (TensorRef){i, 0}; }

static TensorRef op(Side *s, OpKind k, const Params *p, TensorRef a, TensorRef b, int n_in) {
  TensorRef in[2] = {a, b};
  int id = graph_add_node(s->g, k, in, n_in, 1, p, NULL, &s->d);
  CHECK_MSG(id >= 0, "%s: %s", op_def(k)->name, s->d.text ? s->d.text : "");
  return (TensorRef){id < 0 ? 0 : id, 0};
}

static TensorRef op2(Side *s, OpKind k, TensorRef a, TensorRef b) { return op(s, k, NULL, a, b, 2); }
static TensorRef op1(Side *s, OpKind k, TensorRef a) { return op(s, k, NULL, a, a, 1); }

static Params with_int(OpKind k, const char *name, int64_t v) {
  Params p;
  params_default(k, &p);
  param_set_int(&p, param_index(k, name), v);
  return p;
}

static TensorRef concat(Side *s, int axis, TensorRef a, TensorRef b) {
  Params p = with_int(OP_CONCAT, "axis", axis);
  return op(s, OP_CONCAT, &p, a, b, 2);
}

static void output(Side *s, TensorRef r) { CHECK(graph_add_output(s->g, r, NULL, &s->d) >= 0); }

static VerifyOutcome decide(Side *src, Side *dst) {
  Prover *p = NULL;
  Diag d;
  diag_init(&d);
  VerifyLimits lim = {.timeout_ms = 5000, .seed = 7};
  VerifyOutcome o = {.result = VERIFY_UNKNOWN};
  CHECK(prover_new(axioms, &lim, &p, &d) == TEQ_OK);
  if (p) CHECK(prover_decide(p, src->g, dst->g, &o, &d) == TEQ_OK);
  prover_free(p);
  diag_fini(&d);
  graph_free(src->g);
  graph_free(dst->g);
  diag_fini(&src->d);
  diag_fini(&dst->d);
  return o;
}

static void expect(Side src, Side dst, VerifyResult want, const char *what) {
  VerifyOutcome o = decide(&src, &dst);
  CHECK_MSG(o.result == want, "%s: %s, expected %s", what, verify_result_name(o.result),
            verify_result_name(want));
  if (want == VERIFY_REFUTED) {
    CHECK_MSG(o.counterexample && strstr(o.counterexample, "output 0"), "%s: counterexample '%s'",
              what, o.counterexample ? o.counterexample : "(none)");
    if (o.counterexample) printf("%s: %s\n", what, o.counterexample);
  } else {
    CHECK(o.counterexample == NULL);
  }
  free(o.counterexample);
}

/* ---- proved ---- */

static const Shape *mat(void) {
  static Shape s[4];
  for (int i = 0; i < 4; i++) s[i] = shape_of(2, i == 0 ? 3 : 4, 4); /* x1 [3,4], w [4,4] */
  return s;
}

static void test_proved(void) {
  /* matmul(matmul(x1, w1), w2) = matmul(x1, matmul(w1, w2)) */
  Side a = side_new(3, mat()), b = side_new(3, mat());
  output(&a, op2(&a, OP_MATMUL, op2(&a, OP_MATMUL, var(0), var(1)), var(2)));
  output(&b, op2(&b, OP_MATMUL, var(0), op2(&b, OP_MATMUL, var(1), var(2))));
  expect(a, b, VERIFY_PROVED, "matmul associativity");

  /* TASO Fig. 2b: split(matmul(x1, concat[1](w1, w2))) = (matmul(x1, w1), matmul(x1, w2)) */
  a = side_new(3, mat()), b = side_new(3, mat());
  TensorRef cat = concat(&a, 1, var(1), var(2));
  TensorRef mm = op2(&a, OP_MATMUL, var(0), cat);
  Params sp;
  params_default(OP_SPLIT, &sp);
  param_set_int(&sp, param_index(OP_SPLIT, "axis"), 1);
  param_set_ints(&sp, param_index(OP_SPLIT, "sizes"), (int64_t[]){4, 4}, 2);
  int id = graph_add_node(a.g, OP_SPLIT, &mm, 1, 2, &sp, NULL, &a.d);
  CHECK(id >= 0);
  output(&a, (TensorRef){id, 0});
  output(&a, (TensorRef){id, 1});
  output(&b, op2(&b, OP_MATMUL, var(0), var(1)));
  output(&b, op2(&b, OP_MATMUL, var(0), var(2)));
  expect(a, b, VERIFY_PROVED, "TASO Fig. 2b");

  /* relu(conv(i1, k1)) = conv[act=relu](i1, k1), 3x3 "same" */
  Shape conv_shapes[2] = {shape_of(4, 2, 4, 4, 5), shape_of(4, 4, 4, 3, 3)};
  a = side_new(2, conv_shapes), b = side_new(2, conv_shapes);
  Params cp;
  params_default(OP_CONV2D, &cp);
  param_set_ints(&cp, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  Params cr = cp;
  param_set_int(&cr, param_index(OP_CONV2D, "act"), ACT_RELU);
  output(&a, op1(&a, OP_RELU, op(&a, OP_CONV2D, &cp, var(0), var(1), 2)));
  output(&b, op(&b, OP_CONV2D, &cr, var(0), var(1), 2));
  expect(a, b, VERIFY_PROVED, "conv+relu fusion");

  /* avgpool 3x3 (pads 1, count_include_pad) = conv[groups=C](i1, const_pool) */
  a = side_new(1, conv_shapes), b = side_new(1, conv_shapes);
  Params pool;
  params_default(OP_AVGPOOL, &pool);
  param_set_ints(&pool, param_index(OP_AVGPOOL, "kernel"), (int64_t[]){3, 3}, 2);
  param_set_ints(&pool, param_index(OP_AVGPOOL, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  param_set_int(&pool, param_index(OP_AVGPOOL, "count_include_pad"), 1);
  output(&a, op(&a, OP_AVGPOOL, &pool, var(0), var(0), 1));
  Params cpool;
  params_default(OP_CONST_POOL, &cpool);
  param_set_int(&cpool, param_index(OP_CONST_POOL, "channels"), 4);
  int k = graph_add_node(b.g, OP_CONST_POOL, NULL, 0, 1, &cpool, NULL, &b.d);
  CHECK(k >= 0);
  Params cg = cp;
  param_set_int(&cg, param_index(OP_CONV2D, "groups"), 4);
  output(&b, op(&b, OP_CONV2D, &cg, var(0), (TensorRef){k, 0}, 2));
  expect(a, b, VERIFY_PROVED, "avgpool as conv with C_pool");
}

/* ---- refuted ---- */

static void test_refuted(void) {
  /* TASO's concat associativity with its size-free split: split_0 of a
   * concat is its first operand, so re-associating the concat would make
   * the first part of (x1 x2) x3 equal to x1. Our split names its sizes, so
   * the split at each concat's seam gives parts of different shapes. */
  Shape xs[3] = {shape_of(2, 3, 4), shape_of(2, 3, 4), shape_of(2, 3, 4)};
  Side a = side_new(3, xs), b = side_new(3, xs);
  Params sp;
  params_default(OP_SPLIT, &sp);
  param_set_int(&sp, param_index(OP_SPLIT, "axis"), 0);
  param_set_ints(&sp, param_index(OP_SPLIT, "sizes"), (int64_t[]){6, 3}, 2);
  TensorRef left = concat(&a, 0, concat(&a, 0, var(0), var(1)), var(2));
  int id = graph_add_node(a.g, OP_SPLIT, &left, 1, 2, &sp, NULL, &a.d);
  output(&a, (TensorRef){id, 0});
  param_set_ints(&sp, param_index(OP_SPLIT, "sizes"), (int64_t[]){3, 6}, 2);
  TensorRef right = concat(&b, 0, var(0), concat(&b, 0, var(1), var(2)));
  id = graph_add_node(b.g, OP_SPLIT, &right, 1, 2, &sp, NULL, &b.d);
  output(&b, (TensorRef){id, 0});
  expect(a, b, VERIFY_REFUTED, "concat associativity under a size-free split");

  /* Concat regrouped across two axes as if it were associative there:
   * [[w1 w2] ; [w3 w4]] is not [[w1 ; w2] [w3 ; w4]]. */
  Shape ws[4] = {shape_of(2, 4, 4), shape_of(2, 4, 4), shape_of(2, 4, 4), shape_of(2, 4, 4)};
  a = side_new(4, ws), b = side_new(4, ws);
  output(&a, concat(&a, 0, concat(&a, 1, var(0), var(1)), concat(&a, 1, var(2), var(3))));
  output(&b, concat(&b, 1, concat(&b, 0, var(0), var(1)), concat(&b, 0, var(2), var(3))));
  expect(a, b, VERIFY_REFUTED, "concat regrouped across axes");

  /* relu(x1 + x2) = relu(x1) + relu(x2) */
  a = side_new(2, xs), b = side_new(2, xs);
  output(&a, op1(&a, OP_RELU, op2(&a, OP_EWADD, var(0), var(1))));
  output(&b, op2(&b, OP_EWADD, op1(&b, OP_RELU, var(0)), op1(&b, OP_RELU, var(1))));
  expect(a, b, VERIFY_REFUTED, "relu over ewadd");

  /* concat[1](conv(x, y), conv(z, w)) = conv[groups=2](concat[1](x, z),
   * concat[0](y, w)) with y of 2 output channels and w of 6: the two
   * groups then split the weight rows 4 + 4, not 2 + 6. */
  Shape gs[4] = {shape_of(4, 1, 4, 5, 5), shape_of(4, 2, 4, 3, 3), shape_of(4, 1, 4, 5, 5),
                 shape_of(4, 6, 4, 3, 3)};
  a = side_new(4, gs), b = side_new(4, gs);
  Params cp;
  params_default(OP_CONV2D, &cp);
  param_set_ints(&cp, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  output(&a, concat(&a, 1, op(&a, OP_CONV2D, &cp, var(0), var(1), 2),
                    op(&a, OP_CONV2D, &cp, var(2), var(3), 2)));
  Params c2 = cp;
  param_set_int(&c2, param_index(OP_CONV2D, "groups"), 2);
  output(&b, op(&b, OP_CONV2D, &c2, concat(&b, 1, var(0), var(2)), concat(&b, 0, var(1), var(3)), 2));
  expect(a, b, VERIFY_REFUTED, "grouped-conv merge at incompatible shapes");
}

/* ---- the whole depth-2 set ---- */

static void test_depth2(void) {
  char db[300];
  snprintf(db, sizeof db, "%s/rules.sqlite", tmpdir);
  GenOptions go = {.depth = 2, .db_path = db, .threads = 2, .seed = 1, .quiet = true};
  GenSummary gs;
  Diag d;
  diag_init(&d);
  CHECK(gen_rules_run(&go, &gs, &d) == TEQ_OK);
  CHECK(gs.stored > 100);
  VerifyOptions vo = {.db_path = db, .axioms_path = axioms_path, .timeout_ms = 10000, .jobs = 2,
                      .seed = 1, .quiet = true};
  VerifySummary vs;
  CHECK(verify_rules_run(&vo, &vs, &d) == TEQ_OK);
  CHECK_EQ_INT(vs.rules, gs.stored);
  CHECK_EQ_INT(vs.decided[VERIFY_PROVED], gs.stored);
  CHECK_EQ_INT(vs.decided[VERIFY_REFUTED], 0);
  CHECK_EQ_INT(vs.decided[VERIFY_UNKNOWN], 0);
  RuleDb *rdb = NULL;
  CHECK(ruledb_open(db, RULEDB_READ, &rdb, &d) == TEQ_OK);
  int64_t n = -1;
  if (rdb) {
    CHECK(ruledb_count_rules(rdb, RULE_PROVED, &n, &d) == TEQ_OK);
    CHECK_EQ_INT(n, gs.stored);
    CHECK(ruledb_integrity_check(rdb, &d) == TEQ_OK);
    ruledb_close(rdb);
  }
  /* A rerun under the same axioms decides nothing again. */
  CHECK(verify_rules_run(&vo, &vs, &d) == TEQ_OK);
  CHECK_EQ_INT(vs.skipped, gs.stored);
  CHECK_EQ_INT(vs.decided[VERIFY_PROVED] + vs.decided[VERIFY_UNKNOWN], 0);
  if (d.n_errors) fprintf(stderr, "%s", d.text);
  diag_fini(&d);
}

/* ---- the axioms file ---- */

static const char decls[] =
  "const RELU = 1\n"
  "op ewadd = ewadd(x, y)\n"
  "op relu = relu(x)\n"
  "op concat = concat[axis](x, y)\n";

/* Parses decls + text; the first error message, or NULL if it parsed. */
static char *parse_error(const char *text) {
  char buf[4096];
  snprintf(buf, sizeof buf, "%s%s", decls, text);
  Diag d;
  diag_init(&d);
  Axioms *ax = NULL;
  int rc = axioms_parse("bad.axioms", buf, strlen(buf), &ax, &d);
  char *msg = rc ? strdup(d.text ? d.text : "") : NULL;
  CHECK(rc == TEQ_OK || rc == TEQ_ERR_INPUT);
  axioms_free(ax);
  diag_fini(&d);
  return msg;
}

static void expect_error(const char *text, const char *where, const char *what) {
  char *msg = parse_error(text);
  CHECK_MSG(msg && strstr(msg, where) && strstr(msg, what), "'%s': got '%s', expected %s ... %s",
            text, msg ? msg : "(parsed)", where, what);
  free(msg);
}

static void test_parse_errors(void) {
  char *ok = parse_error("# why\naxiom comm: forall x y. ewadd(x, y) = ewadd(y, x)\n");
  CHECK_MSG(ok == NULL, "%s", ok);
  free(ok);
  expect_error("# why\naxiom a: forall x. foo(x) = x\n", "bad.axioms:6:20:", "unknown operator");
  expect_error("# why\naxiom a: forall x y. relu(x, y) = x\n", "bad.axioms:6:22:", "wrong arity");
  expect_error("# why\naxiom a: forall x y. ewadd(x, relu(y) = x\n", "bad.axioms:6:", "unbalanced");
  expect_error("# why\naxiom a: forall x. ewadd(x, z) = x\n", "bad.axioms:6:29:", "unbound");
  expect_error("axiom a: forall x. relu(x) = x\n", "bad.axioms:5:1:", "comment");
  expect_error("op bad = nosuchop(x)\n", "bad.axioms:5:10:", "axiom_name");
  expect_error("# why\naxiom a: forall c, x y. concat[c](x, y) = x\n", "bad.axioms:6:", "in {");
}

/* A wrong axiom is found by validation; a true one is not. */
static void test_validation(void) {
  const char *cases[][2] = {
    {"# false: relu is not additive\n"
     "axiom relu_add: forall x y. relu(ewadd(x, y)) = ewadd(relu(x), relu(y))\n", "1"},
    {"# false: concat does not commute\n"
     "axiom concat_comm: forall a in 0..1, x y. concat[a](x, y) = concat[a](y, x)\n", "1"},
    {"# true: relu acts element by element\n"
     "axiom relu_cat: forall a in 0..1, x y. relu(concat[a](x, y)) = concat[a](relu(x), relu(y))\n",
     "0"},
  };
  for (int i = 0; i < 3; i++) {
    char buf[4096];
    snprintf(buf, sizeof buf, "%s%s", decls, cases[i][0]);
    Diag d;
    diag_init(&d);
    Axioms *ax = NULL;
    CHECK(axioms_parse("v.axioms", buf, strlen(buf), &ax, &d) == TEQ_OK);
    FILE *out = tmpfile();
    int n_false = 0;
    if (ax && out) {
      CHECK(axioms_validate(ax, 1, 0.5, out, &n_false) == TEQ_OK);
      CHECK_MSG(n_false == atoi(cases[i][1]), "case %d: %d false", i, n_false);
    }
    if (out) fclose(out);
    axioms_free(ax);
    diag_fini(&d);
  }
}

/* Every operator the registry gives an axiom name is declared. */
static void test_registry_names(void) {
  for (int k = 0; k < OP__COUNT; k++) {
    const char *name = op_def((OpKind)k)->axiom_name;
    if (name) CHECK_MSG(axioms_binds(axioms, name), "%s: axiom_name '%s' not in %s",
                        op_def((OpKind)k)->name, name, axioms_path);
  }
}

int main(void) {
  /* TEQ_AXIOMS, or specs/ops.axioms found from this file's path as the
   * compiler saw it (meson runs tests where it compiled them). */
  static char path[1024];
  axioms_path = getenv("TEQ_AXIOMS");
  if (!axioms_path) {
    const char *self = __FILE__, *tail = strstr(self, "tests/verify/test_verify.c");
    snprintf(path, sizeof path, "%.*sspecs/ops.axioms", tail ? (int)(tail - self) : 0, self);
    axioms_path = path;
  }
  Diag d;
  diag_init(&d);
  if (axioms_load(axioms_path, &axioms, &d) != TEQ_OK) {
    fprintf(stderr, "%s", d.text ? d.text : "cannot load the axioms\n");
    return 1;
  }
  diag_fini(&d);
  if (!mkdtemp(tmpdir)) return 1;
  test_parse_errors();
  test_registry_names();
  test_proved();
  test_refuted();
  test_validation();
  test_depth2();
  axioms_free(axioms);
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
  if (system(cmd)) fprintf(stderr, "could not remove %s\n", tmpdir);
  return check_exit();
}
