/* tensor_check.h: the tensor helpers the C tests share, beside check.h's
 * macros. Seeded random inputs (float32, and small integers exact in both
 * float32 and Z_p), element access, error metrics between tensors, one
 * operator run through its registry row as the executor would, and the
 * ONNX export -> import round trip. Every helper is static inline and
 * counts its CHECKs in the including test's counters. Two metrics stay
 * apart on purpose: close_to and max_rel_err scale by 1 + |want|,
 * max_abs_err does not. References of one operator family stay in its
 * test file. */
#ifndef TEQ_TESTS_TENSOR_CHECK_H
#define TEQ_TESTS_TENSOR_CHECK_H

#include <assert.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/modp.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/check.h"

/* Enough for every operator the tests build (concat of a few, split in 8). */
enum { TEST_MAX_IN = 16, TEST_MAX_OUT = 8 };

/* ---- tensors ---- */

/* Uniform float32 values in [-1, 1) from seed (tensor_fill_random). */
static inline Tensor *random_f32(Shape s, uint64_t seed) {
  Tensor *t = tensor_new(DT_F32, &s);
  tensor_fill_random(t, seed);
  return t;
}

/* random_ints and random_ints_modp: one draw, stored as dt. */
static inline Tensor *random_ints_as(DType dt, Shape s, int k, uint64_t seed) {
  assert(dt == DT_F32 || dt == DT_MODP);
  Tensor *t = tensor_new(dt, &s);
  uint64_t st = seed;
  for (int64_t i = 0; i < tensor_numel(t); i++) {
    int64_t v = (int64_t)(rng_next(&st) % (uint64_t)(2 * k + 1)) - k;
    if (dt == DT_MODP) ((uint32_t *)t->data)[i] = modp_from_int(v);
    else ((float *)t->data)[i] = (float)v;
  }
  return t;
}

/* Integers drawn uniformly from [-k, k] as float32: with small k every sum
 * and product the kernels form stays exact, so Z_p must agree with it. */
static inline Tensor *random_ints(Shape s, int k, uint64_t seed) {
  return random_ints_as(DT_F32, s, k, seed);
}

/* The same integers as random_ints(s, k, seed), as Z_p residues. */
static inline Tensor *random_ints_modp(Shape s, int k, uint64_t seed) {
  return random_ints_as(DT_MODP, s, k, seed);
}

/* from, from + 1, ... as float32: every element identifiable. */
static inline Tensor *iota_from(Shape s, int64_t from) {
  Tensor *t = tensor_new(DT_F32, &s);
  for (int64_t i = 0; i < tensor_numel(t); i++) ((float *)t->data)[i] = (float)(from + i);
  return t;
}

/* A float32 tensor of shape s holding v (numel(s) values). */
static inline Tensor *f32_tensor(Shape s, const float *v) {
  Tensor *t = tensor_new(DT_F32, &s);
  memcpy(t->data, v, (size_t)shape_numel(&s) * sizeof(float));
  return t;
}

/* The Z_p residues of a float32 tensor of integers (others are rounded to
 * the nearest, ties to even). */
static inline Tensor *f32_to_modp(const Tensor *f) {
  Tensor *t = tensor_new(DT_MODP, &f->shape);
  const float *p = f->data;
  uint32_t *q = t->data;
  for (int64_t i = 0; i < tensor_numel(f); i++) q[i] = modp_from_int((int64_t)lrintf(p[i]));
  return t;
}

static inline float elem_f32(const Tensor *t, int64_t i) { return ((const float *)t->data)[i]; }
static inline uint32_t elem_modp(const Tensor *t, int64_t i) {
  return ((const uint32_t *)t->data)[i];
}

/* tensor_unref on each of n (NULLs allowed). */
static inline void unref_all(Tensor **t, int n) {
  for (int i = 0; i < n; i++) tensor_unref(t[i]);
}

/* ---- coordinates ---- */

/* Advances coordinates c over shape s in row-major order; false after the
 * last. */
static inline bool next_coord(const Shape *s, int64_t *c) {
  for (int k = s->ndim - 1; k >= 0; k--) {
    if (++c[k] < s->d[k]) return true;
    c[k] = 0;
  }
  return false;
}

/* Flat index into s of output coordinates c (rank r), numpy broadcasting. */
static inline int64_t broadcast_index(const Shape *s, const int64_t *c, int r) {
  int64_t idx = 0;
  for (int i = 0; i < s->ndim; i++) idx = idx * s->d[i] + (s->d[i] == 1 ? 0 : c[r - s->ndim + i]);
  return idx;
}

/* ---- comparing ---- */

/* got within tol of want relative to 1 + |want|; a NaN matches only a NaN
 * and an infinity only the same infinity. */
static inline bool close_to(double got, double want, double tol) {
  if (isnan(want) || isinf(want)) return isnan(want) ? isnan(got) : got == want;
  return fabs(got - want) <= tol * (1 + fabs(want));
}

/* |x - y|, divided by 1 + |y| when relative: 0 for two NaNs or equal
 * values (infinities included), INFINITY for a NaN or an infinity on one
 * side only. */
static inline double elem_err(double x, double y, bool relative) {
  if (isnan(x) || isnan(y)) return isnan(x) && isnan(y) ? 0 : INFINITY;
  if (x == y) return 0;
  if (isinf(x) || isinf(y)) return INFINITY;
  return relative ? fabs(x - y) / (1.0 + fabs(y)) : fabs(x - y);
}

/* max_rel_err and max_abs_err: the worst elem_err of two tensors. */
static inline double max_err(const Tensor *a, const Tensor *b, bool relative) {
  if (!a || !b || !shape_equal(&a->shape, &b->shape)) return 1e30;
  double worst = 0;
  for (int64_t i = 0; i < tensor_numel(a); i++) {
    double e = elem_err(elem_f32(a, i), elem_f32(b, i), relative);
    if (e > worst) worst = e;
  }
  return worst;
}

/* The largest |a - b| / (1 + |b|) over two float32 tensors, as elem_err
 * counts it; 1e30 if either is missing or the shapes differ. */
static inline double max_rel_err(const Tensor *a, const Tensor *b) { return max_err(a, b, true); }

/* The largest |a - b| over two float32 tensors, as elem_err counts it;
 * 1e30 if either is missing or the shapes differ. */
static inline double max_abs_err(const Tensor *a, const Tensor *b) { return max_err(a, b, false); }

/* Same dtype, shape and bytes: the comparison for Z_p results and for
 * anything that must not change at all. */
static inline bool tensors_identical(const Tensor *a, const Tensor *b) {
  return a && b && a->dtype == b->dtype && shape_equal(&a->shape, &b->shape) &&
         memcmp(a->data, b->data, tensor_bytes(a)) == 0;
}

/* ---- one operator through its registry row ---- */

/* A Node with room for its output shapes, run the way graph_add_node and
 * exec_run would run it. */
typedef struct Op {
  Node node;
  Shape out[TEST_MAX_OUT];
} Op;

/* kind with n_in inputs, one output and the row's default parameters. */
static inline void op_init(Op *o, OpKind kind, int n_in) {
  memset(o, 0, sizeof *o);
  o->node.kind = kind;
  o->node.n_in = n_in;
  o->node.n_out = 1;
  o->node.out = o->out;
  params_default(kind, &o->node.params);
}

static inline void op_ints(Op *o, const char *name, const int64_t *v, int n) {
  int i = param_index(o->node.kind, name);
  CHECK_MSG(i >= 0, "%s has no parameter %s", op_def(o->node.kind)->name, name);
  if (i >= 0) param_set_ints(&o->node.params, i, v, n);
}

static inline void op_int(Op *o, const char *name, int64_t v) { op_ints(o, name, &v, 1); }

static inline void op_float(Op *o, const char *name, double v) {
  int i = param_index(o->node.kind, name);
  CHECK_MSG(i >= 0, "%s has no parameter %s", op_def(o->node.kind)->name, name);
  if (i >= 0) param_set_float(&o->node.params, i, v);
}

/* Checks the parameters and infers the output shapes from the inputs'
 * shapes, as graph_add_node does. */
static inline int op_infer_shapes(Op *o, const Shape *in, Diag *d) {
  int rc = params_check(o->node.kind, &o->node.params, d);
  return rc ? rc : op_def(o->node.kind)->infer_shape(&o->node, in, o->out, d);
}

static inline int op_infer(Op *o, Tensor *const *in, Diag *d) {
  Shape s[TEST_MAX_IN];
  assert(o->node.n_in <= TEST_MAX_IN);
  for (int i = 0; i < o->node.n_in; i++) s[i] = in[i]->shape;
  return op_infer_shapes(o, s, d);
}

/* After op_infer: allocates the n_out outputs with element type dt and
 * runs the kernel of one mode; out[] is set only on success. */
static inline int op_eval(Op *o, Tensor *const *in, bool modp, DType dt, Tensor **out, Diag *d) {
  Tensor *t[TEST_MAX_OUT];
  const OpDef *r = op_def(o->node.kind);
  assert(o->node.n_out <= TEST_MAX_OUT);
  for (int k = 0; k < o->node.n_out; k++) t[k] = tensor_new(dt, &o->out[k]);
  int rc = (modp ? r->eval_modp : r->eval_f32)(&o->node, in, t, d);
  for (int k = 0; k < o->node.n_out; k++) {
    if (rc) tensor_unref(t[k]);
    else out[k] = t[k];
  }
  return rc;
}

/* Infers, allocates in the mode's dtype and runs; NULL on error (the
 * message stays in d). */
static inline Tensor *op_run(Op *o, Tensor *const *in, bool modp, Diag *d) {
  Tensor *y = NULL;
  if (op_infer(o, in, d) == TEQ_OK) op_eval(o, in, modp, modp ? DT_MODP : DT_F32, &y, d);
  return y;
}

/* Whether o computes in Z_p exactly what it computes in float32 on the
 * n inputs si (small integers, so the float32 sums are exact; NULL ones
 * stay absent); false where either run fails. */
static inline bool op_modp_agrees(Op *o, Tensor *const *si, int n, Diag *d) {
  Tensor *mi[TEST_MAX_IN] = {0};
  assert(n <= TEST_MAX_IN);
  for (int i = 0; i < n; i++) mi[i] = si[i] ? f32_to_modp(si[i]) : NULL;
  Tensor *yf = op_run(o, si, false, d), *ym = op_run(o, mi, true, d);
  Tensor *want = yf ? f32_to_modp(yf) : NULL;
  bool same = want && tensors_identical(ym, want);
  tensor_unref(yf), tensor_unref(ym), tensor_unref(want);
  for (int i = 0; i < n; i++) tensor_unref(mi[i]);
  return same;
}

/* The same for kind with parameters p (NULL: the defaults) and one output;
 * returns the code, *out is set only on success. */
static inline int run_op(OpKind kind, const Params *p, Tensor *const *in, int n_in, bool modp,
                         Tensor **out, Diag *d) {
  Op o;
  op_init(&o, kind, n_in);
  if (p) o.node.params = *p;
  int rc = op_infer(&o, in, d);
  return rc ? rc : op_eval(&o, in, modp, modp ? DT_MODP : DT_F32, out, d);
}

/* The row's shape inference alone, without params_check, so a test reaches
 * the row's own checks. */
static inline int infer_op(OpKind kind, const Params *p, const Shape *in, int n_in, int n_out,
                           Shape *out, Diag *d) {
  Node n;
  memset(&n, 0, sizeof n);
  n.kind = kind;
  n.n_in = n_in;
  n.n_out = n_out;
  n.out = out;
  if (p) n.params = *p;
  else params_default(kind, &n.params);
  return op_def(kind)->infer_shape(&n, in, out, d);
}

/* params_check then shape inference on inputs of shapes in must fail with
 * TEQ_ERR_INPUT and a message containing want. */
static inline void check_infer_error(OpKind kind, const Params *p, const Shape *in, int n_in,
                                     int n_out, const char *want) {
  Diag d;
  diag_init(&d);
  Op o;
  op_init(&o, kind, n_in);
  o.node.n_out = n_out;
  if (p) o.node.params = *p;
  CHECK_EQ_INT(op_infer_shapes(&o, in, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), want) != NULL, "want '%s', got '%s'", want, diag_last(&d));
  diag_fini(&d);
}

/* check_infer_error for o as set up, on its n_in inputs. */
static inline void op_check_error(const Op *o, const Shape *in, const char *want) {
  check_infer_error(o->node.kind, &o->node.params, in, o->node.n_in, o->node.n_out, want);
}

/* ---- ONNX: export, import, same results ---- */

/* Exports g to a temporary file, imports it back with o (NULL: the
 * defaults) and runs both in float32 on in[]. When the export succeeds,
 * checks that the rest succeeds and that every output is identical. *h
 * (when h is not NULL) gets the imported graph, else it is freed. Returns
 * the export's code, for rows an export is meant to refuse. */
static inline int check_graph_round_trip(const Graph *g, const OnnxImportOptions *o,
                                         Tensor *const *in, const char *what, Graph **h,
                                         Diag *d) {
  char path[] = "/tmp/teq_test_round_trip_XXXXXX";
  int fd = mkstemp(path);
  CHECK(fd >= 0);
  if (fd >= 0) close(fd);
  Graph *back = NULL;
  Tensor *a[TEST_MAX_OUT] = {0}, *b[TEST_MAX_OUT] = {0};
  int n_out = g->n_outputs;
  assert(n_out <= TEST_MAX_OUT);
  int export_rc = onnx_export_file(g, path, NULL, d), rc = export_rc;
  if (rc == TEQ_OK) rc = onnx_import_file(path, o, &back, NULL, d);
  if (rc == TEQ_OK) rc = exec_run(g, EXEC_F32, in, a, d);
  if (rc == TEQ_OK) rc = exec_run(back, EXEC_F32, in, b, d);
  if (export_rc == TEQ_OK) {
    CHECK_MSG(rc == TEQ_OK, "%s: %s", what, d->text ? d->text : "");
    for (int i = 0; i < n_out; i++)
      CHECK_MSG(rc == TEQ_OK && tensors_identical(a[i], b[i]),
                "%s: output %d of the imported graph differs", what, i);
  }
  unlink(path);
  unref_all(a, n_out);
  unref_all(b, n_out);
  if (h) *h = back;
  else graph_free(back);
  return export_rc;
}

/* One node of kind with parameters p (NULL: the defaults) on float32
 * inputs in[], through check_graph_round_trip; the import must hold that
 * node once, and with the same parameters when same_params (float
 * parameters survive only if exact in float32, ONNX's attribute type).
 * Returns the export's code, or the graph's build error. */
static inline int check_node_round_trip(OpKind kind, const Params *p, Tensor *const *in, int n_in,
                                        bool same_params, Diag *d) {
  Graph *g = graph_new(), *h = NULL;
  TensorRef refs[TEST_MAX_IN];
  char name[16];
  assert(n_in <= TEST_MAX_IN);
  for (int i = 0; i < n_in; i++) {
    snprintf(name, sizeof name, "x%d", i);
    refs[i] = (TensorRef){graph_add_input(g, name, &in[i]->shape, DT_F32, d), 0};
  }
  int id = graph_add_node(g, kind, refs, n_in, 1, p, "node", d);
  int rc = id < 0 ? id : graph_add_output(g, (TensorRef){id, 0}, "y", d);
  if (rc >= 0) rc = check_graph_round_trip(g, NULL, in, op_def(kind)->name, &h, d);
  if (rc == TEQ_OK) {
    Params want;
    if (p) want = *p;
    else params_default(kind, &want);
    int found = 0;
    for (int i = 0; h && i < h->n_nodes; i++)
      found += h->nodes[i].kind == kind &&
               (!same_params || memcmp(&h->nodes[i].params, &want, sizeof want) == 0);
    CHECK_MSG(found == 1, "%s: not imported as itself%s", op_def(kind)->name,
              same_params ? " with the same parameters" : "");
  }
  graph_free(g);
  graph_free(h);
  return rc;
}

#endif
