/* test_ruledb.c: the rule database on small rules whose text is known by
 * hand: S-expressions, protobuf round trips, damaged and foreign messages,
 * and the SQLite file itself (rules, runs, work units, transactions,
 * reopening, migrating an old schema, refusing files that are not ours).
 * Databases live in a fresh directory under $TMPDIR (or /tmp), removed at
 * the end. */
#include <dirent.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ruledb/ruledb.h"
#include "tests/check.h"

static TensorRef ref(int node) { return (TensorRef){node, 0}; }

static int add2(Graph *g, OpKind k, int a, int b, const Params *p, Diag *d) {
  TensorRef in[2] = {ref(a), ref(b)};
  return graph_add_node(g, k, in, 2, 1, p, NULL, d);
}

/* x1 [2,4], w1 [4,4], w2 [4,4]: the variables of the matmul rules. */
static Graph *matmul_vars(Diag *d) {
  Graph *g = graph_new();
  Shape sx = shape_of(2, 2, 4), sw = shape_of(2, 4, 4);
  graph_add_input(g, "x1", &sx, DT_F32, d);
  graph_add_input(g, "w1", &sw, DT_F32, d);
  graph_add_input(g, "w2", &sw, DT_F32, d);
  return g;
}

/* (matmul (matmul x1 w1) w2) */
static Graph *matmul_left(Diag *d) {
  Graph *g = matmul_vars(d);
  int a = add2(g, OP_MATMUL, 0, 1, NULL, d);
  graph_add_output(g, ref(add2(g, OP_MATMUL, a, 2, NULL, d)), NULL, d);
  return g;
}

/* (matmul x1 (matmul w1 w2)), built in another node order. */
static Graph *matmul_right(Diag *d) {
  Graph *g = matmul_vars(d);
  int a = add2(g, OP_MATMUL, 1, 2, NULL, d);
  graph_add_output(g, ref(add2(g, OP_MATMUL, 0, a, NULL, d)), NULL, d);
  return g;
}

/* split(matmul(x1, concat(w1, w2))) into two outputs. */
static Graph *split_concat(Diag *d) {
  Graph *g = matmul_vars(d);
  Params pc, ps;
  params_default(OP_CONCAT, &pc);
  param_set_int(&pc, param_index(OP_CONCAT, "axis"), 1);
  int c = add2(g, OP_CONCAT, 1, 2, &pc, d);
  int m = add2(g, OP_MATMUL, 0, c, NULL, d);
  params_default(OP_SPLIT, &ps);
  param_set_int(&ps, param_index(OP_SPLIT, "axis"), 1);
  param_set_ints(&ps, param_index(OP_SPLIT, "sizes"), (int64_t[]){4, 4}, 2);
  TensorRef in = ref(m);
  int s = graph_add_node(g, OP_SPLIT, &in, 1, 2, &ps, NULL, d);
  graph_add_output(g, (TensorRef){s, 0}, NULL, d);
  graph_add_output(g, (TensorRef){s, 1}, NULL, d);
  return g;
}

/* (tuple (matmul x1 w1) (matmul x1 w2)) */
static Graph *two_matmuls(Diag *d) {
  Graph *g = matmul_vars(d);
  graph_add_output(g, ref(add2(g, OP_MATMUL, 0, 1, NULL, d)), NULL, d);
  graph_add_output(g, ref(add2(g, OP_MATMUL, 0, 2, NULL, d)), NULL, d);
  return g;
}

/* i1 [1,4,8,8]; the weight w4 [4,4,3,3], or const_pool when pool. */
static Graph *conv(bool pool, Diag *d) {
  Graph *g = graph_new();
  Shape si = shape_of(4, 1, 4, 8, 8), sw = shape_of(4, 4, 4, 3, 3);
  graph_add_input(g, "i1", &si, DT_F32, d);
  int w;
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  if (pool) {
    Params pp;
    params_default(OP_CONST_POOL, &pp);
    param_set_int(&pp, param_index(OP_CONST_POOL, "channels"), 4);
    w = graph_add_node(g, OP_CONST_POOL, NULL, 0, 1, &pp, NULL, d);
    param_set_int(&p, param_index(OP_CONV2D, "groups"), 4);
  } else {
    w = graph_add_input(g, "w4", &sw, DT_F32, d);
    param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_RELU);
  }
  graph_add_output(g, ref(add2(g, OP_CONV2D, 0, w, &p, d)), NULL, d);
  return g;
}

/* (ewadd t1 t1) with t1 = (matmul x1 w1): a node used twice. */
static Graph *shared(Diag *d) {
  Graph *g = matmul_vars(d);
  int m = add2(g, OP_MATMUL, 0, 1, NULL, d);
  graph_add_output(g, ref(add2(g, OP_EWADD, m, m, NULL, d)), NULL, d);
  return g;
}

/* (tuple x1 (relu x1)): an output that is a variable. */
static Graph *var_output(Diag *d) {
  Graph *g = matmul_vars(d);
  TensorRef in = ref(0);
  int r = graph_add_node(g, OP_RELU, &in, 1, 1, NULL, NULL, d);
  graph_add_output(g, ref(0), NULL, d);
  graph_add_output(g, ref(r), NULL, d);
  return g;
}

static void check_text(Graph *g, const char *want) {
  char *got = rule_side_text(g);
  CHECK_MSG(got && strcmp(got, want) == 0, "got  %s\n want %s", got ? got : "NULL", want);
  free(got);
}

static void test_text(void) {
  Diag d;
  diag_init(&d);
  Graph *l = matmul_left(&d), *r = matmul_right(&d), *s = split_concat(&d), *t = two_matmuls(&d);
  Graph *c = conv(false, &d), *p = conv(true, &d), *sh = shared(&d), *v = var_output(&d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  check_text(l, "(matmul (matmul x1 w1) w2)");
  check_text(r, "(matmul x1 (matmul w1 w2))");
  check_text(s, "(let ((t1 (split[axis=1 sizes=(4 4)] (matmul x1 (concat[axis=1] w1 w2))))) "
                "(tuple t1.0 t1.1))");
  check_text(t, "(tuple (matmul x1 w1) (matmul x1 w2))");
  check_text(c, "(conv2d[pads=(1 1 1 1) act=relu] i1 w4)");
  check_text(p, "(conv2d[pads=(1 1 1 1) groups=4] i1 (const_pool[channels=4]))");
  check_text(sh, "(let ((t1 (matmul x1 w1))) (ewadd t1 t1))");
  check_text(v, "(tuple x1 (relu x1))");
  Rule rule = {.src = l, .dst = r};
  char *text = rule_text(&rule);
  CHECK(text && strcmp(text, "(matmul (matmul x1 w1) w2) => (matmul x1 (matmul w1 w2))") == 0);
  free(text);
  CHECK_EQ_INT(rule_side_ops(l), 2);
  CHECK_EQ_INT(rule_side_ops(s), 3);
  CHECK_EQ_INT(rule_side_ops(p), 2); /* const_pool counts */
  Graph *all[] = {l, r, s, t, c, p, sh, v};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) graph_free(all[i]);
  diag_fini(&d);
}

/* encode -> decode gives the same graph: hash, variables, text. */
static void check_round_trip(Graph *g) {
  Diag d;
  diag_init(&d);
  uint8_t *buf = NULL;
  size_t len = 0;
  Graph *back = NULL;
  CHECK_EQ_INT(rule_side_encode(g, &buf, &len, &d), TEQ_OK);
  CHECK_EQ_INT(rule_side_decode(buf, len, &back, &d), TEQ_OK);
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  if (back) {
    CHECK(graph_hash(back, NULL) == graph_hash(g, NULL));
    CHECK_EQ_INT(graph_check(back, &d), TEQ_OK);
    CHECK_EQ_INT(back->n_inputs, g->n_inputs);
    CHECK_EQ_INT(back->n_outputs, g->n_outputs);
    for (int i = 0; i < g->n_inputs && i < back->n_inputs; i++) {
      const Node *a = &g->nodes[g->inputs[i]], *b = &back->nodes[back->inputs[i]];
      CHECK(strcmp(a->name, b->name) == 0);
      CHECK(shape_equal(&a->out[0], &b->out[0]));
      CHECK_EQ_INT(b->dtype, DT_F32);
    }
    char *ta = rule_side_text(g), *tb = rule_side_text(back);
    CHECK(ta && tb && strcmp(ta, tb) == 0);
    free(ta);
    free(tb);
  }
  graph_free(back);
  free(buf);
  diag_fini(&d);
}

static void test_round_trip(void) {
  Diag d;
  diag_init(&d);
  Graph *all[] = {matmul_left(&d), matmul_right(&d), split_concat(&d), two_matmuls(&d),
                  conv(false, &d), conv(true, &d), shared(&d), var_output(&d)};
  CHECK_MSG(d.n_errors == 0, "%s", d.text);
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) {
    check_round_trip(all[i]);
    graph_free(all[i]);
  }
  /* What a rule cannot hold is refused, never stored half-right: a
   * constant with data, an unnamed variable. */
  Graph *k = graph_new();
  Shape s1 = shape_of(1, 4);
  int c = graph_add_const(k, "c", tensor_new(DT_F32, &s1), &d);
  TensorRef in = ref(c);
  graph_add_output(k, ref(graph_add_node(k, OP_RELU, &in, 1, 1, NULL, NULL, &d)), NULL, &d);
  uint8_t *buf = NULL;
  size_t len = 0;
  CHECK_EQ_INT(rule_side_encode(k, &buf, &len, &d), TEQ_ERR_UNSUPPORTED);
  CHECK(buf == NULL);
  graph_free(k);
  k = graph_new();
  graph_add_output(k, ref(graph_add_input(k, NULL, &s1, DT_F32, &d)), NULL, &d);
  CHECK_EQ_INT(rule_side_encode(k, &buf, &len, &d), TEQ_ERR_INPUT);
  CHECK(buf == NULL);
  char *text = rule_side_text(k);
  CHECK(text && strcmp(text, "v1") == 0);
  free(text);
  graph_free(k);
  CHECK_EQ_INT(d.n_errors, 2);
  diag_fini(&d);
}

/* ---- damaged and foreign messages ---- */

/* A few protobuf wire-format writers, so the tests can build messages the
 * encoder never would, without reaching into ruledb's generated code. */
typedef struct Pb {
  uint8_t b[512];
  size_t n;
} Pb;

static void pb_varint(Pb *p, uint64_t v) {
  do {
    p->b[p->n++] = (uint8_t)((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
    v >>= 7;
  } while (v);
}

static void pb_int(Pb *p, int field, int64_t v) {
  pb_varint(p, (uint64_t)field << 3);
  pb_varint(p, (uint64_t)v);
}

static void pb_bytes(Pb *p, int field, const void *s, size_t n) {
  pb_varint(p, (uint64_t)field << 3 | 2);
  pb_varint(p, n);
  memcpy(p->b + p->n, s, n);
  p->n += n;
}

static void pb_str(Pb *p, int field, const char *s) { pb_bytes(p, field, s, strlen(s)); }
static void pb_msg(Pb *p, int field, const Pb *m) { pb_bytes(p, field, m->b, m->n); }

static Pb pb_ref(int node, int out) {
  Pb r = {0};
  pb_int(&r, 1, node);
  pb_int(&r, 2, out);
  return r;
}

/* RuleGraph { inputs: x1 [2,3]; ops: one op; outputs: out }. */
static Pb pb_graph(const Pb *op, Pb out) {
  Pb var = {0}, dims = {0}, g = {0};
  pb_str(&var, 1, "x1");
  pb_varint(&dims, 2);
  pb_varint(&dims, 3);
  pb_bytes(&var, 2, dims.b, dims.n);
  pb_msg(&g, 1, &var);
  if (op) pb_msg(&g, 2, op);
  pb_msg(&g, 3, &out);
  return g;
}

/* Op { kind, n_out, inputs: refs to node in_node (n_in times) }. */
static Pb pb_op(const char *kind, int n_out, int n_in, int in_node) {
  Pb op = {0};
  pb_str(&op, 1, kind);
  pb_int(&op, 2, n_out);
  for (int i = 0; i < n_in; i++) {
    Pb r = pb_ref(in_node, 0);
    pb_msg(&op, 3, &r);
  }
  return op;
}

static int decode_rc(const Pb *p, const char *want_msg) {
  Diag d;
  diag_init(&d);
  Graph *g = NULL;
  int rc = rule_side_decode(p->b, p->n, &g, &d);
  if (want_msg)
    CHECK_MSG(d.text && strstr(d.text, want_msg), "want '%s' in: %s", want_msg,
              d.text ? d.text : "(none)");
  graph_free(g);
  diag_fini(&d);
  return rc;
}

static void test_decode_errors(void) {
  Pb relu = pb_op("relu", 1, 1, 0);
  Pb ok = pb_graph(&relu, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&ok, NULL), TEQ_OK); /* the writers above are right */
  Pb var_only = pb_graph(NULL, pb_ref(0, 0));
  CHECK_EQ_INT(decode_rc(&var_only, NULL), TEQ_OK);

  Pb unknown = pb_op("frobnicate", 1, 1, 0);
  Pb m = pb_graph(&unknown, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "unknown operator 'frobnicate'"), TEQ_ERR_INPUT);
  Pb far = pb_op("relu", 1, 1, 5);
  m = pb_graph(&far, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "missing tensor"), TEQ_ERR_INPUT);
  Pb self = pb_op("relu", 1, 1, 1); /* a cycle through itself */
  m = pb_graph(&self, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, NULL), TEQ_ERR_INPUT);
  Pb arity = pb_op("matmul", 1, 1, 0);
  m = pb_graph(&arity, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "matmul"), TEQ_ERR_INPUT);
  Pb outs = pb_op("relu", 3, 1, 0);
  m = pb_graph(&outs, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, NULL), TEQ_ERR_INPUT);
  Pb input_op = pb_op("input", 1, 0, 0);
  m = pb_graph(&input_op, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, NULL), TEQ_ERR_INPUT);
  m = pb_graph(&relu, pb_ref(1, 3));
  CHECK_EQ_INT(decode_rc(&m, NULL), TEQ_ERR_INPUT);
  m = pb_graph(&relu, pb_ref(-1, 0));
  CHECK_EQ_INT(decode_rc(&m, NULL), TEQ_ERR_INPUT);
  /* Values past int32 are refused, not cut to their low 32 bits (which
   * would make these a valid reference to node 0 and one output). */
  Pb wide = {0}, wide_ref = {0};
  pb_str(&wide, 1, "relu");
  pb_int(&wide, 2, 1);
  pb_int(&wide_ref, 1, (INT64_C(1) << 40) + 0);
  pb_int(&wide_ref, 2, 0);
  pb_msg(&wide, 3, &wide_ref);
  m = pb_graph(&wide, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "reference to node 1099511627776, output 0, is out of range"),
               TEQ_ERR_INPUT);
  Pb wide_out = {0}, in_ref = pb_ref(0, 0);
  pb_str(&wide_out, 1, "relu");
  pb_int(&wide_out, 2, (INT64_C(1) << 32) + 1);
  pb_msg(&wide_out, 3, &in_ref);
  m = pb_graph(&wide_out, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "number of outputs 4294967297 is out of range"), TEQ_ERR_INPUT);
  /* A variable whose extents fit one by one but not as a product. */
  Pb big_var = {0}, big_dims = {0}, big = {0}, out = pb_ref(0, 0);
  pb_str(&big_var, 1, "x1");
  pb_varint(&big_dims, UINT64_C(1) << 40);
  pb_varint(&big_dims, UINT64_C(1) << 40);
  pb_bytes(&big_var, 2, big_dims.b, big_dims.n);
  pb_msg(&big, 1, &big_var);
  pb_msg(&big, 3, &out);
  CHECK_EQ_INT(decode_rc(&big, "input 'x1': shape [1099511627776, 1099511627776] is too large"),
               TEQ_ERR_INPUT);

  /* Parameters: unknown name, wrong type, out of bounds. */
  Pb param = {0}, conc = pb_op("concat", 1, 1, 0);
  pb_str(&param, 1, "color");
  pb_int(&param, 2, 3);
  Pb c = conc;
  pb_msg(&c, 4, &param);
  m = pb_graph(&c, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "unknown parameter 'color'"), TEQ_ERR_INPUT);
  Pb axis = {0};
  pb_str(&axis, 1, "axis");
  Pb ints = {0};
  pb_varint(&ints, 99);
  pb_bytes(&axis, 2, ints.b, ints.n);
  c = conc;
  pb_msg(&c, 4, &axis);
  m = pb_graph(&c, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "axis"), TEQ_ERR_INPUT);
  Pb axis2 = {0};
  pb_str(&axis2, 1, "axis");
  pb_varint(&ints, 1);
  pb_bytes(&axis2, 2, ints.b, ints.n); /* two values for one integer */
  c = conc;
  pb_msg(&c, 4, &axis2);
  m = pb_graph(&c, pb_ref(1, 0));
  CHECK_EQ_INT(decode_rc(&m, "axis"), TEQ_ERR_INPUT);

  /* No outputs; an empty buffer; a duplicate variable name. */
  Pb none = {0};
  CHECK_EQ_INT(decode_rc(&none, "no outputs"), TEQ_ERR_INPUT);
  Pb twice = pb_graph(NULL, pb_ref(0, 0)), var = {0};
  pb_str(&var, 1, "x1");
  pb_msg(&twice, 1, &var);
  CHECK_EQ_INT(decode_rc(&twice, "used twice"), TEQ_ERR_INPUT);

  /* Garbage bytes never crash and are TEQ_ERR_INPUT. */
  Pb junk = {0};
  const uint8_t bytes[] = {0xff, 0xff, 0xff, 0xff, 0x0f, 0x12, 0x34, 0x99};
  memcpy(junk.b, bytes, sizeof bytes);
  junk.n = sizeof bytes;
  CHECK_EQ_INT(decode_rc(&junk, "not a teq.RuleGraph"), TEQ_ERR_INPUT);
  uint64_t x = 0x9e3779b97f4a7c15u;
  for (int trial = 0; trial < 2000; trial++) {
    junk.n = (size_t)(trial % 64) + 1;
    for (size_t i = 0; i < junk.n; i++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      junk.b[i] = (uint8_t)x;
    }
    int rc = decode_rc(&junk, NULL);
    CHECK(rc == TEQ_ERR_INPUT || rc == TEQ_OK);
  }

  /* Every truncation and every single-byte change of a real encoding. */
  Diag d;
  diag_init(&d);
  Graph *g = split_concat(&d);
  uint8_t *buf;
  size_t len;
  CHECK_EQ_INT(rule_side_encode(g, &buf, &len, &d), TEQ_OK);
  for (size_t n = 0; n < len; n++) {
    Pb t = {0};
    if (len > sizeof t.b) break;
    memcpy(t.b, buf, n);
    t.n = n;
    int rc = decode_rc(&t, NULL);
    CHECK(rc == TEQ_ERR_INPUT || rc == TEQ_OK);
    for (int delta = 1; delta < 256; delta += 37) {
      memcpy(t.b, buf, len);
      t.n = len;
      t.b[n] = (uint8_t)(t.b[n] + delta);
      rc = decode_rc(&t, NULL);
      CHECK(rc == TEQ_ERR_INPUT || rc == TEQ_OK);
    }
  }
  /* An operator name this build does not know, in a real message. */
  uint8_t *at = memmem(buf, len, "split", 5);
  CHECK(at != NULL);
  if (at) {
    memcpy(at, "splat", 5);
    Graph *back = NULL;
    CHECK_EQ_INT(rule_side_decode(buf, len, &back, &d), TEQ_ERR_INPUT);
    CHECK(strstr(diag_last(&d), "unknown operator 'splat'") != NULL);
    CHECK(back == NULL);
  }
  free(buf);
  graph_free(g);
  diag_fini(&d);
}

/* ---- the database ---- */

static void remove_tree(const char *dir) {
  DIR *dp = opendir(dir);
  if (!dp) return;
  struct dirent *e;
  char p[4096];
  while ((e = readdir(dp))) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) >= (int)sizeof p) continue;
    struct stat st;
    if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
      chmod(p, 0700);
      remove_tree(p);
    } else {
      unlink(p);
    }
  }
  closedir(dp);
  rmdir(dir);
}

static void path_in(char *out, size_t size, const char *dir, const char *name) {
  int n = snprintf(out, size, "%s/%s", dir, name);
  CHECK(n > 0 && (size_t)n < size);
}

static void sql(const char *path, const char *text) {
  sqlite3 *db = NULL;
  CHECK_EQ_INT(sqlite3_open(path, &db), SQLITE_OK);
  char *err = NULL;
  int rc = sqlite3_exec(db, text, NULL, NULL, &err);
  CHECK_MSG(rc == SQLITE_OK, "%s: %s", text, err ? err : "");
  sqlite3_free(err);
  sqlite3_close(db);
}

static int64_t sql_int(const char *path, const char *query) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  int64_t v = -1;
  if (sqlite3_open(path, &db) == SQLITE_OK &&
      sqlite3_prepare_v2(db, query, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

static char *sql_text(const char *path, const char *query) {
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;
  char *v = NULL;
  if (sqlite3_open(path, &db) == SQLITE_OK &&
      sqlite3_prepare_v2(db, query, -1, &st, NULL) == SQLITE_OK && sqlite3_step(st) == SQLITE_ROW)
    v = strdup((const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
  return v;
}

typedef struct Seen {
  int n;
  int64_t ids[8];
  uint64_t src_hash[8], dst_hash[8];
  char keys[8][16];
  RuleStatus status[8];
  int depth[8];
  int64_t run_id[8];
  int stop_after; /* return 7 after this many calls; 0 never */
} Seen;

static int collect(Rule *r, void *ctx) {
  Seen *s = ctx;
  if (s->n < 8) {
    s->ids[s->n] = r->id;
    s->src_hash[s->n] = graph_hash(r->src, NULL);
    s->dst_hash[s->n] = graph_hash(r->dst, NULL);
    snprintf(s->keys[s->n], sizeof s->keys[0], "%s", r->key);
    s->status[s->n] = r->status;
    s->depth[s->n] = r->depth;
    s->run_id[s->n] = r->run_id;
  }
  s->n++;
  return s->stop_after && s->n >= s->stop_after ? 7 : 0;
}

typedef struct Units {
  int n, units[8];
  size_t lens[8];
  char data[8][8];
} Units;

static int collect_unit(int unit, const void *blob, size_t len, void *ctx) {
  Units *u = ctx;
  if (u->n < 8) {
    u->units[u->n] = unit;
    u->lens[u->n] = len;
    if (len && len < 8) memcpy(u->data[u->n], blob, len);
  }
  u->n++;
  return 0;
}

static int64_t count(RuleDb *db, int status) {
  int64_t n = -1;
  Diag d;
  diag_init(&d);
  CHECK_EQ_INT(ruledb_count_rules(db, status, &n, &d), TEQ_OK);
  diag_fini(&d);
  return n;
}

static void test_runs_and_units(RuleDb *db, Diag *d) {
  RunInfo info = {.command = "gen-rules", .args = "--depth 2", .seed = UINT64_MAX - 3,
                  .version = "0.1.0"};
  int64_t a = 0, b = 0, found = -1;
  CHECK_EQ_INT(ruledb_run_start(db, &info, &a, d), TEQ_OK);
  CHECK_EQ_INT(ruledb_run_start(db, &info, &b, d), TEQ_OK);
  CHECK(a > 0 && b > a);
  CHECK_EQ_INT(ruledb_run_find_unfinished(db, &info, &found, d), TEQ_OK);
  CHECK_EQ_INT(found, b); /* the newest */
  RunInfo other = info;
  other.seed = 1;
  CHECK_EQ_INT(ruledb_run_find_unfinished(db, &other, &found, d), TEQ_OK);
  CHECK_EQ_INT(found, 0);
  CHECK_EQ_INT(ruledb_run_finish(db, b, 1.5, 1234, "{\"pairs\": 3}", d), TEQ_OK);
  CHECK_EQ_INT(ruledb_run_find_unfinished(db, &info, &found, d), TEQ_OK);
  CHECK_EQ_INT(found, a);
  CHECK_EQ_INT(ruledb_run_finish(db, a, 0.25, 99, NULL, d), TEQ_OK);
  CHECK_EQ_INT(ruledb_run_find_unfinished(db, &info, &found, d), TEQ_OK);
  CHECK_EQ_INT(found, 0);
  int nerr = d->n_errors;
  CHECK_EQ_INT(ruledb_run_finish(db, 999, 0, 0, NULL, d), TEQ_ERR_INPUT);
  CHECK_EQ_INT(d->n_errors, nerr + 1);

  CHECK_EQ_INT(ruledb_unit_store(db, a, 3, "abc", 3, d), TEQ_OK);
  CHECK_EQ_INT(ruledb_unit_store(db, a, 1, "x", 1, d), TEQ_OK);
  CHECK_EQ_INT(ruledb_unit_store(db, a, 2, NULL, 0, d), TEQ_OK);
  CHECK_EQ_INT(ruledb_unit_store(db, a, 1, "yy", 2, d), TEQ_OK); /* replaces */
  CHECK_EQ_INT(ruledb_unit_store(db, b, 1, "z", 1, d), TEQ_OK);
  bool done = false;
  CHECK_EQ_INT(ruledb_unit_done(db, a, 2, &done, d), TEQ_OK);
  CHECK(done);
  CHECK_EQ_INT(ruledb_unit_done(db, a, 5, &done, d), TEQ_OK);
  CHECK(!done);
  Units u = {0};
  CHECK_EQ_INT(ruledb_unit_foreach(db, a, collect_unit, &u, d), TEQ_OK);
  CHECK_EQ_INT(u.n, 3);
  CHECK(u.units[0] == 1 && u.units[1] == 2 && u.units[2] == 3);
  CHECK(u.lens[0] == 2 && u.lens[1] == 0 && u.lens[2] == 3);
  CHECK(memcmp(u.data[0], "yy", 2) == 0 && memcmp(u.data[2], "abc", 3) == 0);
  /* A unit of a run that does not exist violates the foreign key. */
  nerr = d->n_errors;
  CHECK(ruledb_unit_store(db, 12345, 0, "q", 1, d) != TEQ_OK);
  CHECK_EQ_INT(d->n_errors, nerr + 1);
  /* Clearing one run's units leaves the other run's. */
  CHECK_EQ_INT(ruledb_unit_clear(db, a, d), TEQ_OK);
  Units none = {0}, other_units = {0};
  CHECK_EQ_INT(ruledb_unit_foreach(db, a, collect_unit, &none, d), TEQ_OK);
  CHECK_EQ_INT(none.n, 0);
  CHECK_EQ_INT(ruledb_unit_foreach(db, b, collect_unit, &other_units, d), TEQ_OK);
  CHECK_EQ_INT(other_units.n, 1);
  CHECK_EQ_INT(ruledb_compact(db, d), TEQ_OK);
}

/* The cost cache: one row per (device, configuration), a new measurement
 * replacing the old. */
static void test_costs(RuleDb *db, const char *path, Diag *d) {
  const char *key = "conv2d [1,8,9,9] [8,8,3,3] {stride=(1 1)}";
  CHECK_EQ_INT(ruledb_cost_store(db, "GPU A", key, 12.5, "cuda-events-median", "cudnn:X", d),
               TEQ_OK);
  CHECK_EQ_INT(ruledb_cost_store(db, "GPU B", key, 20, "cuda-events-median", "-", d), TEQ_OK);
  CHECK_EQ_INT(ruledb_cost_store(db, "GPU A", key, 11, "cuda-events-median", "cublas:gemm", d),
               TEQ_OK);
  CHECK_EQ_INT(sql_int(path, "SELECT count(*) FROM costs"), 2);
  CHECK_EQ_INT(sql_int(path, "SELECT CAST(micros AS INTEGER) FROM costs WHERE device = 'GPU A'"), 11);
  char *algo = sql_text(path, "SELECT algo FROM costs WHERE device = 'GPU A'");
  CHECK(algo && strcmp(algo, "cublas:gemm") == 0);
  free(algo);
}

static void test_database(const char *dir) {
  char path[4096];
  path_in(path, sizeof path, dir, "rules.sqlite");
  Diag d;
  diag_init(&d);
  RuleDb *db = NULL;
  CHECK_EQ_INT(ruledb_open(path, RULEDB_WRITE, &db, &d), TEQ_OK);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");
  if (!db) return;
  CHECK_EQ_INT(sql_int(path, "PRAGMA user_version"), ruledb_schema_version());
  CHECK_EQ_INT(sql_int(path, "PRAGMA application_id"), RULEDB_APPLICATION_ID);
  char *mode = sql_text(path, "PRAGMA journal_mode");
  CHECK(mode && strcmp(mode, "wal") == 0);
  free(mode);

  test_costs(db, path, &d);

  RunInfo info = {.command = "gen-rules", .args = "--depth 3", .seed = 42, .version = "0.1.0"};
  int64_t run = 0;
  CHECK_EQ_INT(ruledb_run_start(db, &info, &run, &d), TEQ_OK);

  Rule r1 = {.src = matmul_left(&d), .dst = matmul_right(&d), .key = strdup("k-assoc"),
             .status = RULE_CANDIDATE, .depth = 2, .run_id = run};
  Rule r2 = {.src = split_concat(&d), .dst = two_matmuls(&d), .key = strdup("k-split"),
             .status = RULE_PROVED, .depth = 3};
  bool inserted = false;
  CHECK_EQ_INT(ruledb_insert_rule(db, &r1, &inserted, &d), TEQ_OK);
  CHECK(inserted);
  CHECK_EQ_INT(ruledb_insert_rule(db, &r1, &inserted, &d), TEQ_OK);
  CHECK(!inserted); /* the same key again */
  CHECK_EQ_INT(ruledb_insert_rule(db, &r2, &inserted, &d), TEQ_OK);
  CHECK(inserted);
  CHECK_EQ_INT(count(db, -1), 2);
  CHECK_EQ_INT(count(db, RULE_CANDIDATE), 1);
  CHECK_EQ_INT(count(db, RULE_PROVED), 1);
  CHECK_EQ_INT(count(db, RULE_REFUTED), 0);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");

  char *text = sql_text(path, "SELECT text FROM rules WHERE key = 'k-assoc'");
  CHECK(text && strcmp(text, "(matmul (matmul x1 w1) w2) => (matmul x1 (matmul w1 w2))") == 0);
  free(text);
  CHECK_EQ_INT(sql_int(path, "SELECT src_ops * 100 + dst_ops * 10 + n_outputs FROM rules "
                             "WHERE key = 'k-split'"), 3 * 100 + 2 * 10 + 2);
  CHECK_EQ_INT(sql_int(path, "SELECT run_id IS NULL FROM rules WHERE key = 'k-split'"), 1);

  Seen s = {0};
  CHECK_EQ_INT(ruledb_foreach_rule(db, -1, collect, &s, &d), TEQ_OK);
  CHECK_EQ_INT(s.n, 2);
  CHECK(s.ids[0] > 0 && s.ids[1] > s.ids[0]);
  CHECK(s.src_hash[0] == graph_hash(r1.src, NULL) && s.dst_hash[0] == graph_hash(r1.dst, NULL));
  CHECK(s.src_hash[1] == graph_hash(r2.src, NULL) && s.dst_hash[1] == graph_hash(r2.dst, NULL));
  CHECK(strcmp(s.keys[0], "k-assoc") == 0 && strcmp(s.keys[1], "k-split") == 0);
  CHECK(s.status[0] == RULE_CANDIDATE && s.status[1] == RULE_PROVED);
  CHECK(s.depth[0] == 2 && s.depth[1] == 3);
  CHECK(s.run_id[0] == run && s.run_id[1] == 0);
  Seen proved = {0};
  CHECK_EQ_INT(ruledb_foreach_rule(db, RULE_PROVED, collect, &proved, &d), TEQ_OK);
  CHECK(proved.n == 1 && strcmp(proved.keys[0], "k-split") == 0);
  Seen stop = {.stop_after = 1};
  CHECK_EQ_INT(ruledb_foreach_rule(db, -1, collect, &stop, &d), 7);
  CHECK_EQ_INT(stop.n, 1);

  /* Explicit transactions: a rollback forgets, a commit keeps. */
  Rule r3 = {.src = shared(&d), .dst = shared(&d), .key = strdup("k-shared"),
             .status = RULE_UNKNOWN, .depth = 2};
  CHECK_EQ_INT(ruledb_begin(db, &d), TEQ_OK);
  CHECK_EQ_INT(ruledb_insert_rule(db, &r3, &inserted, &d), TEQ_OK);
  CHECK_EQ_INT(count(db, -1), 3);
  ruledb_rollback(db);
  CHECK_EQ_INT(count(db, -1), 2);
  CHECK_EQ_INT(ruledb_begin(db, &d), TEQ_OK);
  CHECK_EQ_INT(ruledb_insert_rule(db, &r3, &inserted, &d), TEQ_OK);
  int nerr = d.n_errors;
  CHECK(ruledb_begin(db, &d) != TEQ_OK); /* already open */
  CHECK_EQ_INT(d.n_errors, nerr + 1);
  CHECK_EQ_INT(ruledb_commit(db, &d), TEQ_OK);
  CHECK_EQ_INT(count(db, RULE_UNKNOWN), 1);

  /* Bad rules are refused before anything is written. */
  Rule bad = r1;
  bad.key = NULL;
  nerr = d.n_errors;
  CHECK_EQ_INT(ruledb_insert_rule(db, &bad, &inserted, &d), TEQ_ERR_INPUT);
  bad = r2;
  bad.dst = r1.dst; /* 2 outputs against 1 */
  bad.key = "k-bad";
  CHECK_EQ_INT(ruledb_insert_rule(db, &bad, &inserted, &d), TEQ_ERR_INPUT);
  CHECK_EQ_INT(d.n_errors, nerr + 2);
  CHECK_EQ_INT(count(db, -1), 3);

  test_runs_and_units(db, &d);
  CHECK_EQ_INT(ruledb_integrity_check(db, &d), TEQ_OK);
  CHECK_MSG(d.n_errors == nerr + 4, "%s", d.text ? d.text : "");
  ruledb_close(db);

  /* Reopening keeps everything, for writing and for reading. */
  db = NULL;
  CHECK_EQ_INT(ruledb_open(path, RULEDB_WRITE, &db, &d), TEQ_OK);
  if (db) {
    CHECK_EQ_INT(count(db, -1), 3);
    ruledb_close(db);
  }
  db = NULL;
  CHECK_EQ_INT(ruledb_open(path, RULEDB_READ, &db, &d), TEQ_OK);
  if (db) {
    CHECK_EQ_INT(count(db, -1), 3);
    Seen again = {0};
    CHECK_EQ_INT(ruledb_foreach_rule(db, -1, collect, &again, &d), TEQ_OK);
    CHECK(again.n == 3 && again.src_hash[1] == graph_hash(r2.src, NULL));
    CHECK_EQ_INT(ruledb_integrity_check(db, &d), TEQ_OK);
    Rule r4 = r3;
    r4.key = "k-new";
    nerr = d.n_errors;
    CHECK(ruledb_insert_rule(db, &r4, &inserted, &d) != TEQ_OK); /* read-only */
    CHECK_EQ_INT(d.n_errors, nerr + 1);
    CHECK(strstr(diag_last(&d), path) != NULL);
    ruledb_close(db);
  }

  /* A damaged rule row is reported with its row, not a crash. */
  sql(path, "UPDATE rules SET src = x'ffffffff' WHERE key = 'k-split'");
  db = NULL;
  CHECK_EQ_INT(ruledb_open(path, RULEDB_WRITE, &db, &d), TEQ_OK);
  if (db) {
    Seen broken = {0};
    CHECK_EQ_INT(ruledb_foreach_rule(db, -1, collect, &broken, &d), TEQ_ERR_INPUT);
    CHECK_EQ_INT(broken.n, 1);
    CHECK(strstr(diag_last(&d), "rules row 2, src") != NULL);
    ruledb_close(db);
  }
  rule_fini(&r1);
  rule_fini(&r2);
  rule_fini(&r3);
  diag_fini(&d);
}

/* A file at schema version 1, built by hand, is migrated on open. */
static void test_migration(const char *dir) {
  char path[4096], set[128];
  path_in(path, sizeof path, dir, "old.sqlite");
  CHECK(ruledb_migration_sql(0) == NULL);
  CHECK(ruledb_migration_sql(ruledb_schema_version() + 1) == NULL);
  CHECK(ruledb_schema_version() >= 2);
  sql(path, ruledb_migration_sql(1));
  snprintf(set, sizeof set, "PRAGMA application_id = %d; PRAGMA user_version = 1;",
           RULEDB_APPLICATION_ID);
  sql(path, set);
  sql(path, "INSERT INTO runs (command, args, seed, version, status) "
            "VALUES ('gen-rules', '--depth 1', 5, '0.0.1', 'running')");
  CHECK_EQ_INT(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name = 'costs'"), 0);

  Diag d;
  diag_init(&d);
  RuleDb *db = NULL;
  CHECK_EQ_INT(ruledb_open(path, RULEDB_READ, &db, &d), TEQ_ERR_INPUT);
  CHECK(strstr(diag_last(&d), "needs migration") != NULL);
  CHECK(db == NULL);
  CHECK_EQ_INT(ruledb_open(path, RULEDB_WRITE, &db, &d), TEQ_OK);
  CHECK_EQ_INT(sql_int(path, "PRAGMA user_version"), ruledb_schema_version());
  CHECK_EQ_INT(sql_int(path, "SELECT count(*) FROM sqlite_master WHERE name IN "
                             "('costs', 'verifications')"), 2);
  if (db) {
    RunInfo info = {.command = "gen-rules", .args = "--depth 1", .seed = 5, .version = "0.1.0"};
    int64_t found = 0;
    CHECK_EQ_INT(ruledb_run_find_unfinished(db, &info, &found, &d), TEQ_OK);
    CHECK_EQ_INT(found, 1);
    CHECK_EQ_INT(ruledb_integrity_check(db, &d), TEQ_OK);
    ruledb_close(db);
  }
  diag_fini(&d);
}

static void write_file(const char *path, const char *text) {
  FILE *f = fopen(path, "w");
  CHECK(f != NULL);
  if (!f) return;
  fputs(text, f);
  fclose(f);
}

/* Opens path and expects rc with `want` in the message, and no RuleDb. */
static void expect_refused(const char *path, RuleDbMode mode, int rc, const char *want) {
  Diag d;
  diag_init(&d);
  RuleDb *db = NULL;
  int got = ruledb_open(path, mode, &db, &d);
  CHECK_MSG(got == rc, "%s: rc %d, expected %d (%s)", path, got, rc, d.text ? d.text : "");
  CHECK(db == NULL);
  CHECK_MSG(d.text && strstr(d.text, want) && strstr(d.text, path), "want '%s' and the path in: %s",
            want, d.text ? d.text : "(none)");
  if (db) ruledb_close(db);
  diag_fini(&d);
}

static void test_refusals(const char *dir) {
  char path[4096], set[160];
  const char *text = "This is a text file, not a database.\n"
                     "It is long enough to hold a SQLite header and then some more.\n";
  path_in(path, sizeof path, dir, "notes.txt");
  write_file(path, text);
  expect_refused(path, RULEDB_WRITE, TEQ_ERR_INPUT, "not a SQLite database");
  expect_refused(path, RULEDB_READ, TEQ_ERR_INPUT, "not a SQLite database");
  FILE *f = fopen(path, "r");
  char back[256] = {0};
  if (f) {
    CHECK(fread(back, 1, sizeof back - 1, f) == strlen(text));
    fclose(f);
  }
  CHECK(strcmp(back, text) == 0); /* untouched */
  path_in(path, sizeof path, dir, "tiny.txt");
  write_file(path, "hi");
  expect_refused(path, RULEDB_WRITE, TEQ_ERR_INPUT, "not a SQLite database");

  path_in(path, sizeof path, dir, "foreign.sqlite");
  sql(path, "CREATE TABLE foo (x INTEGER)");
  expect_refused(path, RULEDB_WRITE, TEQ_ERR_INPUT, "not a Teq rule database");
  expect_refused(path, RULEDB_READ, TEQ_ERR_INPUT, "not a Teq rule database");
  CHECK_EQ_INT(sql_int(path, "SELECT count(*) FROM sqlite_master"), 1);

  path_in(path, sizeof path, dir, "claimed.sqlite");
  sql(path, "PRAGMA application_id = 1234");
  expect_refused(path, RULEDB_WRITE, TEQ_ERR_INPUT, "not a Teq rule database");

  path_in(path, sizeof path, dir, "newer.sqlite");
  snprintf(set, sizeof set, "PRAGMA application_id = %d; PRAGMA user_version = 99;",
           RULEDB_APPLICATION_ID);
  sql(path, set);
  expect_refused(path, RULEDB_WRITE, TEQ_ERR_INPUT, "newer Teq");
  expect_refused(path, RULEDB_READ, TEQ_ERR_INPUT, "newer Teq");

  path_in(path, sizeof path, dir, "missing/dir/rules.sqlite");
  expect_refused(path, RULEDB_WRITE, TEQ_ERR_IO, "does not exist");
  expect_refused(path, RULEDB_READ, TEQ_ERR_INPUT, "no such");
  path_in(path, sizeof path, dir, "absent.sqlite");
  expect_refused(path, RULEDB_READ, TEQ_ERR_INPUT, "no such");
  expect_refused(dir, RULEDB_WRITE, TEQ_ERR_INPUT, "is a directory");

  /* An empty file is a new database for writing, nothing for reading. */
  path_in(path, sizeof path, dir, "empty.sqlite");
  write_file(path, "");
  expect_refused(path, RULEDB_READ, TEQ_ERR_INPUT, "not a Teq rule database");
  Diag d;
  diag_init(&d);
  RuleDb *db = NULL;
  CHECK_EQ_INT(ruledb_open(path, RULEDB_WRITE, &db, &d), TEQ_OK);
  ruledb_close(db);
  diag_fini(&d);

  /* Root writes anywhere, so a read-only directory proves nothing there. */
  if (geteuid() != 0) {
    char ro[4096];
    path_in(ro, sizeof ro, dir, "readonly");
    CHECK(mkdir(ro, 0555) == 0);
    path_in(path, sizeof path, ro, "rules.sqlite");
    expect_refused(path, RULEDB_WRITE, TEQ_ERR_IO, "not writable");
  }
}

int main(void) {
  test_text();
  test_round_trip();
  test_decode_errors();
  char dir[4096];
  const char *tmp = getenv("TMPDIR");
  snprintf(dir, sizeof dir, "%s/teq-ruledb-XXXXXX", tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(dir)) {
    perror(dir);
    return 1;
  }
  test_database(dir);
  test_migration(dir);
  test_refusals(dir);
  remove_tree(dir);
  return check_exit();
}
