/* test_layout.c: the data-movement rows (runtime/ops/layout.c), called
 * directly through the registry: hand-computed cases, each kernel against a
 * coordinate-by-coordinate reference on random data, Z_p against float32 on
 * small integers (these operators are exact in Z_p), int64 data, an ONNX
 * export and import round trip, and the messages of shape inference for
 * bad parameters. */
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/modp.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/tensor_check.h"

/* ---- harness ---- */

/* run_op with n_out outputs, and int64 data kept int64 (outputs int64 when
 * input 0 is, else the mode's dtype) as in the executor's shape
 * computations. out[] is set only on success. */
static int run_layout_op(OpKind kind, const Params *p, Tensor *const *in, int n_in, int n_out,
                         bool modp, Tensor **out, Diag *d) {
  Op o;
  op_init(&o, kind, n_in);
  o.node.n_out = n_out;
  if (p) o.node.params = *p;
  int rc = op_infer(&o, in, d);
  if (rc) return rc;
  o.node.dtype = in[0]->dtype == DT_I64 ? DT_I64 : modp ? DT_MODP : DT_F32;
  return op_eval(&o, in, modp, o.node.dtype, out, d);
}

/* int64 copies get high bits set, so a kernel moving 4 bytes of an 8-byte
 * element shows; 0 stays 0, a pad's fill. */
#define I64_ENCODE(v) ((int64_t)(v) * (((int64_t)1 << 33) + 1))

static Tensor *to_i64(const Tensor *f) {
  Tensor *t = tensor_new(DT_I64, &f->shape);
  for (int64_t i = 0; i < tensor_numel(f); i++)
    ((int64_t *)t->data)[i] = I64_ENCODE(((const float *)f->data)[i]);
  return t;
}

/* Flat index of coordinates c in shape s. */
static int64_t flat(const Shape *s, const int64_t *c) {
  int64_t i = 0;
  for (int k = 0; k < s->ndim; k++) i = i * s->d[k] + c[k];
  return i;
}

/* The same operator in float32, Z_p and int64 must move the same elements:
 * run it on iota data three ways and compare element by element. */
static void check_modes_agree(OpKind kind, const Params *p, Tensor *const *f, int n_in, int n_out) {
  Diag d;
  diag_init(&d);
  Tensor *m[8], *l[8], *yf[8] = {0}, *ym[8] = {0}, *yl[8] = {0};
  for (int i = 0; i < n_in; i++) {
    bool index = f[i]->dtype == DT_I64; /* gather's indices stay int64 */
    m[i] = index ? tensor_ref(f[i]) : f32_to_modp(f[i]);
    l[i] = index ? tensor_ref(f[i]) : to_i64(f[i]);
  }
  CHECK_EQ_INT(run_layout_op(kind, p, f, n_in, n_out, false, yf, &d), TEQ_OK);
  CHECK_EQ_INT(run_layout_op(kind, p, m, n_in, n_out, true, ym, &d), TEQ_OK);
  CHECK_EQ_INT(run_layout_op(kind, p, l, n_in, n_out, false, yl, &d), TEQ_OK);
  for (int k = 0; k < n_out && yf[k] && ym[k] && yl[k]; k++) {
    int64_t bad = 0;
    for (int64_t i = 0; i < tensor_numel(yf[k]); i++) {
      int64_t v = (int64_t)elem_f32(yf[k], i);
      bad += modp_to_int(((uint32_t *)ym[k]->data)[i]) != v;
      bad += ((int64_t *)yl[k]->data)[i] != I64_ENCODE(v);
    }
    CHECK_MSG(bad == 0, "%s output %d: %lld mismatches", op_def(kind)->name, k, (long long)bad);
  }
  for (int i = 0; i < n_in; i++) tensor_unref(m[i]), tensor_unref(l[i]);
  for (int k = 0; k < n_out; k++) tensor_unref(yf[k]), tensor_unref(ym[k]), tensor_unref(yl[k]);
  diag_fini(&d);
}

static Params params_with_ints(OpKind k, const char *name, const int64_t *v, int n) {
  Params p;
  params_default(k, &p);
  param_set_ints(&p, param_index(k, name), v, n);
  return p;
}

/* ---- transpose ---- */

static void check_transpose(Shape s, const int64_t *perm, int np, uint64_t seed) {
  Diag d;
  diag_init(&d);
  Params p = params_with_ints(OP_TRANSPOSE, "perm", perm, np);
  Tensor *x = random_f32(s, seed), *y = NULL;
  CHECK_EQ_INT(run_layout_op(OP_TRANSPOSE, &p, &x, 1, 1, false, &y, &d), TEQ_OK);
  int64_t pm[TEQ_MAX_DIMS], c[TEQ_MAX_DIMS] = {0}, ci[TEQ_MAX_DIMS], bad = 0;
  for (int i = 0; i < s.ndim; i++) pm[i] = np ? perm[i] : s.ndim - 1 - i;
  for (int i = 0; y && i < s.ndim; i++) CHECK_EQ_INT(y->shape.d[i], s.d[pm[i]]);
  if (y && tensor_numel(y) > 0) do {
      for (int i = 0; i < s.ndim; i++) ci[pm[i]] = c[i];
      bad += elem_f32(y, flat(&y->shape, c)) != elem_f32(x, flat(&s, ci));
    } while (next_coord(&y->shape, c));
  CHECK_MSG(y && bad == 0, "transpose: %lld wrong", (long long)bad);
  Tensor *iota = iota_from(s, 0);
  check_modes_agree(OP_TRANSPOSE, &p, &iota, 1, 1);
  tensor_unref(iota);
  tensor_unref(x);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_transpose(void) {
  Diag d;
  diag_init(&d);
  /* [[0 1 2] [3 4 5]] transposed is [[0 3] [1 4] [2 5]]. */
  Tensor *x = iota_from(shape_of(2, 2, 3), 0), *y = NULL;
  CHECK_EQ_INT(run_layout_op(OP_TRANSPOSE, NULL, &x, 1, 1, false, &y, &d), TEQ_OK);
  float want[] = {0, 3, 1, 4, 2, 5};
  for (int i = 0; y && i < 6; i++) CHECK_EQ_INT(elem_f32(y, i), want[i]);
  tensor_unref(x);
  tensor_unref(y);
  check_transpose(shape_of(4, 2, 3, 4, 5), (int64_t[]){0, 2, 3, 1}, 4, 1);
  check_transpose(shape_of(4, 2, 3, 4, 5), (int64_t[]){3, 2, 1, 0}, 4, 2);
  check_transpose(shape_of(4, 2, 3, 4, 5), (int64_t[]){0, 1, 3, 2}, 4, 3);
  check_transpose(shape_of(4, 2, 3, 4, 5), (int64_t[]){1, 0, 2, 3}, 4, 4); /* runs of 20 */
  check_transpose(shape_of(3, 7, 1, 9), NULL, 0, 5);
  check_transpose(shape_of(6, 2, 1, 3, 2, 1, 2), (int64_t[]){5, 3, 1, 0, 2, 4}, 6, 6);
  check_transpose(shape_of(2, 0, 3), (int64_t[]){1, 0}, 2, 7);
  /* Wide enough for square tiles, with partial tiles at both edges. */
  check_transpose(shape_of(2, 70, 45), (int64_t[]){1, 0}, 2, 8);
  check_transpose(shape_of(3, 3, 40, 33), (int64_t[]){0, 2, 1}, 3, 9);
  check_transpose(shape_of(4, 2, 33, 3, 64), (int64_t[]){0, 3, 2, 1}, 4, 10);
  check_transpose(shape_of(3, 64, 2, 32), (int64_t[]){2, 1, 0}, 3, 11);
  diag_fini(&d);
}

/* ---- reshape, concat, split ---- */

static void test_reshape(void) {
  Diag d;
  diag_init(&d);
  Params p = params_with_ints(OP_RESHAPE, "shape", (int64_t[]){6, 4}, 2);
  Tensor *x = random_f32(shape_of(3, 2, 3, 4), 1), *y = NULL;
  CHECK_EQ_INT(run_layout_op(OP_RESHAPE, &p, &x, 1, 1, false, &y, &d), TEQ_OK);
  Shape want = shape_of(2, 6, 4);
  CHECK(y && shape_equal(&y->shape, &want));
  CHECK(y && memcmp(y->data, x->data, 24 * sizeof(float)) == 0);
  tensor_unref(y);
  Tensor *ix = iota_from(x->shape, 0);
  check_modes_agree(OP_RESHAPE, &p, &ix, 1, 1);
  tensor_unref(ix);
  p = params_with_ints(OP_RESHAPE, "shape", NULL, 0); /* one element to a scalar */
  Tensor *one = iota_from(shape_of(3, 1, 1, 1), 0);
  CHECK_EQ_INT(run_layout_op(OP_RESHAPE, &p, &one, 1, 1, false, &y, &d), TEQ_OK);
  CHECK(y && y->shape.ndim == 0);
  tensor_unref(y);
  tensor_unref(one);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_concat_split(void) {
  Diag d;
  diag_init(&d);
  Tensor *a = random_f32(shape_of(3, 2, 1, 4), 1), *b = random_f32(shape_of(3, 2, 3, 4), 2),
         *c = random_f32(shape_of(3, 2, 2, 4), 3), *y = NULL;
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, 0, 1);
  CHECK_EQ_INT(run_layout_op(OP_CONCAT, &p, (Tensor *[]){a, b, c}, 3, 1, false, &y, &d), TEQ_OK);
  Shape want = shape_of(3, 2, 6, 4);
  CHECK(y && shape_equal(&y->shape, &want));
  int64_t co[TEQ_MAX_DIMS] = {0}, bad = 0;
  if (y) do {
      const Tensor *src = co[1] < 1 ? a : co[1] < 4 ? b : c;
      int64_t cs[3] = {co[0], co[1] < 1 ? co[1] : co[1] < 4 ? co[1] - 1 : co[1] - 4, co[2]};
      bad += elem_f32(y, flat(&want, co)) != elem_f32(src, flat(&src->shape, cs));
    } while (next_coord(&want, co));
  CHECK_EQ_INT(bad, 0);
  /* Splitting the result at 1 and 3 and 2 gives the inputs back. */
  Params ps;
  params_default(OP_SPLIT, &ps);
  param_set_int(&ps, 0, 1);
  param_set_ints(&ps, 1, (int64_t[]){1, 3, 2}, 3);
  Tensor *parts[3] = {0};
  CHECK_EQ_INT(run_layout_op(OP_SPLIT, &ps, &y, 1, 3, false, parts, &d), TEQ_OK);
  const Tensor *orig[3] = {a, b, c};
  for (int k = 0; k < 3 && parts[k]; k++) {
    CHECK(shape_equal(&parts[k]->shape, &orig[k]->shape));
    CHECK(memcmp(parts[k]->data, orig[k]->data, tensor_bytes(orig[k])) == 0);
    tensor_unref(parts[k]);
  }
  Tensor *ia = iota_from(a->shape, 100), *ib = iota_from(b->shape, -50),
         *ic = iota_from(c->shape, 7);
  Tensor *iy = iota_from(y->shape, 0);
  check_modes_agree(OP_CONCAT, &p, (Tensor *[]){ia, ib, ic}, 3, 1);
  check_modes_agree(OP_SPLIT, &ps, &iy, 1, 3);
  tensor_unref(ia), tensor_unref(ib), tensor_unref(ic), tensor_unref(iy);
  tensor_unref(y);
  tensor_unref(a);
  tensor_unref(b);
  tensor_unref(c);
  diag_fini(&d);
}

static void test_split_equal(void) {
  Diag d;
  diag_init(&d);
  /* Equal parts by output count, along the first axis. */
  Tensor *y = iota_from(shape_of(3, 2, 6, 4), 0);
  Params ps;
  params_default(OP_SPLIT, &ps);
  Tensor *halves[2] = {0};
  CHECK_EQ_INT(run_layout_op(OP_SPLIT, &ps, &y, 1, 2, false, halves, &d), TEQ_OK);
  for (int k = 0; k < 2 && halves[k]; k++) {
    CHECK_EQ_INT(halves[k]->shape.d[0], 1);
    CHECK(memcmp(halves[k]->data, (float *)y->data + k * 24, 24 * sizeof(float)) == 0);
    tensor_unref(halves[k]);
  }
  /* A single input concatenates to itself. */
  Params p;
  params_default(OP_CONCAT, &p);
  Tensor *y1 = NULL;
  CHECK_EQ_INT(run_layout_op(OP_CONCAT, &p, &y, 1, 1, false, &y1, &d), TEQ_OK);
  CHECK(y1 && memcmp(y1->data, y->data, tensor_bytes(y)) == 0);
  tensor_unref(y1);
  tensor_unref(y);
  diag_fini(&d);
}

/* ---- pad ---- */

static Params pad_params(const int64_t *pads, int n, double value, int mode) {
  Params p = params_with_ints(OP_PAD, "pads", pads, n);
  param_set_float(&p, param_index(OP_PAD, "value"), value);
  param_set_int(&p, param_index(OP_PAD, "mode"), mode);
  return p;
}

static void check_pad_case(const Tensor *x, const Params *p, const float *want, int64_t n) {
  Diag d;
  diag_init(&d);
  Tensor *y = NULL;
  int rc = run_layout_op(OP_PAD, p, (Tensor *const *)&x, 1, 1, false, &y, &d);
  CHECK_MSG(rc == TEQ_OK, "%s", diag_last(&d));
  CHECK(y && tensor_numel(y) == n);
  for (int64_t i = 0; y && i < n; i++)
    CHECK_MSG(elem_f32(y, i) == want[i], "element %lld", (long long)i);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_pad(void) {
  /* x = [[0 1 2] [3 4 5]] */
  Tensor *x = iota_from(shape_of(2, 2, 3), 0);
  Params p = pad_params((int64_t[]){1, 0, 0, 2}, 4, 9, 0);
  float constant[] = {9, 9, 9, 9, 9, 0, 1, 2, 9, 9, 3, 4, 5, 9, 9};
  check_pad_case(x, &p, constant, 15);
  p = pad_params((int64_t[]){1, 2, 1, 1}, 4, 0, 1); /* reflect */
  float reflect[] = {5, 4, 3, 4, 5, 4,   2, 1, 0, 1, 2, 1,   5, 4, 3, 4, 5, 4,
                     2, 1, 0, 1, 2, 1};
  check_pad_case(x, &p, reflect, 24);
  p = pad_params((int64_t[]){0, 2, 1, 1}, 4, 0, 2); /* edge */
  float edge[] = {0, 0, 0, 1, 2, 2,   3, 3, 3, 4, 5, 5,   3, 3, 3, 4, 5, 5};
  check_pad_case(x, &p, edge, 18);
  p = pad_params((int64_t[]){0, -1, 0, 1}, 4, 7, 0); /* crop the first column, pad one */
  float crop[] = {1, 2, 7, 4, 5, 7};
  check_pad_case(x, &p, crop, 6);
  p = pad_params((int64_t[]){-1, 0, 0, -2}, 4, 0, 0);
  float crop2[] = {3};
  check_pad_case(x, &p, crop2, 1);
  for (int mode = 0; mode < 3; mode++) {
    Tensor *big = iota_from(shape_of(4, 2, 3, 4, 5), 0);
    p = pad_params((int64_t[]){0, 1, 2, 3, 1, 2, 3, 0}, 8, 0, mode);
    check_modes_agree(OP_PAD, &p, &big, 1, 1);
    tensor_unref(big);
  }
  /* A non-integer fill has no Z_p value. */
  Diag d;
  diag_init(&d);
  Tensor *m = f32_to_modp(x), *y = NULL;
  p = pad_params((int64_t[]){1, 0, 0, 0}, 4, 0.5, 0);
  CHECK_EQ_INT(run_layout_op(OP_PAD, &p, &m, 1, 1, true, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "value=0.5") != NULL, "%s", diag_last(&d));
  tensor_unref(m);
  tensor_unref(x);
  diag_fini(&d);
}

/* ---- slice ---- */

static Params slice_params(int r, const int64_t *b, const int64_t *e, const int64_t *st) {
  Params p;
  params_default(OP_SLICE, &p);
  param_set_ints(&p, 0, b, r);
  param_set_ints(&p, 1, e, r);
  param_set_ints(&p, 2, st, r);
  return p;
}

static void check_slice(Shape s, const int64_t *b, const int64_t *e, const int64_t *st) {
  Diag d;
  diag_init(&d);
  Params p = slice_params(s.ndim, b, e, st);
  Tensor *x = iota_from(s, 0), *y = NULL;
  int rc = run_layout_op(OP_SLICE, &p, &x, 1, 1, false, &y, &d);
  CHECK_MSG(rc == TEQ_OK, "%s", diag_last(&d));
  int64_t c[TEQ_MAX_DIMS] = {0}, ci[TEQ_MAX_DIMS], bad = 0;
  for (int i = 0; y && i < s.ndim; i++) {
    int64_t n = 0;
    for (int64_t j = b[i]; st[i] > 0 ? j < e[i] : j > e[i]; j += st[i]) n++;
    CHECK_EQ_INT(y->shape.d[i], n);
  }
  if (y && tensor_numel(y) > 0) do {
      for (int i = 0; i < s.ndim; i++) ci[i] = b[i] + c[i] * st[i];
      bad += elem_f32(y, flat(&y->shape, c)) != elem_f32(x, flat(&s, ci));
    } while (next_coord(&y->shape, c));
  CHECK_EQ_INT(bad, 0);
  if (y) check_modes_agree(OP_SLICE, &p, &x, 1, 1);
  tensor_unref(x);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_slice(void) {
  Shape s = shape_of(3, 4, 5, 6);
  check_slice(s, (int64_t[]){1, 0, 0}, (int64_t[]){3, 5, 6}, (int64_t[]){1, 2, 1});
  check_slice(s, (int64_t[]){3, 4, 5}, (int64_t[]){-1, -1, 0}, (int64_t[]){-1, -2, -3});
  check_slice(s, (int64_t[]){0, 1, 2}, (int64_t[]){4, 5, 2}, (int64_t[]){3, 3, 1}); /* empty */
  check_slice(s, (int64_t[]){0, 0, 0}, (int64_t[]){4, 5, 6}, (int64_t[]){1, 1, 1}); /* all */
  check_slice(shape_of(1, 10), (int64_t[]){9}, (int64_t[]){-1}, (int64_t[]){-1});   /* reverse */
}

/* ---- gather ---- */

static void check_gather(Shape s, int axis, Shape is, uint64_t seed) {
  Diag d;
  diag_init(&d);
  Tensor *x = iota_from(s, 0), *idx = tensor_new(DT_I64, &is), *y = NULL;
  int64_t *iv = idx->data, len = s.d[axis];
  uint64_t st = seed;
  for (int64_t j = 0; j < tensor_numel(idx); j++)
    iv[j] = (int64_t)(rng_next(&st) % (uint64_t)(2 * len)) - len;
  Params p;
  params_default(OP_GATHER, &p);
  param_set_int(&p, 0, axis);
  CHECK_EQ_INT(run_layout_op(OP_GATHER, &p, (Tensor *[]){x, idx}, 2, 1, false, &y, &d), TEQ_OK);
  CHECK(y && y->shape.ndim == s.ndim - 1 + is.ndim);
  int64_t c[TEQ_MAX_DIMS] = {0}, ci[TEQ_MAX_DIMS], bad = 0;
  if (y && tensor_numel(y) > 0) do {
      int64_t ii[TEQ_MAX_DIMS], k = 0;
      for (int i = 0; i < axis; i++) ci[i] = c[k++];
      for (int i = 0; i < is.ndim; i++) ii[i] = c[k++];
      int64_t v = iv[flat(&is, ii)];
      ci[axis] = v < 0 ? v + len : v;
      for (int i = axis + 1; i < s.ndim; i++) ci[i] = c[k++];
      bad += elem_f32(y, flat(&y->shape, c)) != elem_f32(x, flat(&s, ci));
    } while (next_coord(&y->shape, c));
  CHECK_EQ_INT(bad, 0);
  check_modes_agree(OP_GATHER, &p, (Tensor *[]){x, idx}, 2, 1);
  tensor_unref(x);
  tensor_unref(idx);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_gather(void) {
  Diag d;
  diag_init(&d);
  /* Rows 2 and -1 (= 2) and 0 of [[0 1] [2 3] [4 5]]. */
  Tensor *x = iota_from(shape_of(2, 3, 2), 0), *y = NULL;
  Shape is = shape_of(1, 3);
  Tensor *idx = tensor_new(DT_I64, &is);
  int64_t iv[] = {2, -1, 0};
  memcpy(idx->data, iv, sizeof iv);
  CHECK_EQ_INT(run_layout_op(OP_GATHER, NULL, (Tensor *[]){x, idx}, 2, 1, false, &y, &d), TEQ_OK);
  float want[] = {4, 5, 4, 5, 0, 1};
  for (int i = 0; y && i < 6; i++) CHECK_EQ_INT(elem_f32(y, i), want[i]);
  tensor_unref(y);
  ((int64_t *)idx->data)[1] = 3; /* out of range: an error, not a wild read */
  CHECK_EQ_INT(run_layout_op(OP_GATHER, NULL, (Tensor *[]){x, idx}, 2, 1, false, &y, &d),
               TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "indices[1]=3 out of range [-3, 3)") != NULL, "%s",
            diag_last(&d));
  tensor_unref(idx);
  tensor_unref(x);
  check_gather(shape_of(3, 4, 5, 6), 0, shape_of(2, 2, 3), 1);
  check_gather(shape_of(3, 4, 5, 6), 1, shape_of(1, 7), 2);
  check_gather(shape_of(3, 4, 5, 6), 2, shape_of(0), 3); /* a scalar index drops the axis */
  check_gather(shape_of(2, 10, 3), 1, shape_of(3, 2, 1, 2), 4);
  diag_fini(&d);
}

/* ---- depth_to_space, space_to_depth ---- */

static Params block_params(OpKind k, int64_t b, int64_t mode) {
  Params p;
  params_default(k, &p);
  param_set_int(&p, param_index(k, "blocksize"), b);
  if (k == OP_DEPTH_TO_SPACE) param_set_int(&p, param_index(k, "mode"), mode);
  return p;
}

/* ONNX's documented examples, computed with its numpy reshape-transpose
 * definitions: x = 0..47 as [1, 8, 2, 3] with blocksize 2 (DCR and CRD),
 * and 0..23 as [1, 1, 4, 6] into depth. */
static void test_block_examples(void) {
  Diag d;
  diag_init(&d);
  static const float dcr[] = {0,  12, 1,  13, 2,  14, 24, 36, 25, 37, 26, 38, 3,  15, 4,  16,
                              5,  17, 27, 39, 28, 40, 29, 41, 6,  18, 7,  19, 8,  20, 30, 42,
                              31, 43, 32, 44, 9,  21, 10, 22, 11, 23, 33, 45, 34, 46, 35, 47};
  static const float crd[] = {0,  6,  1,  7,  2,  8,  12, 18, 13, 19, 14, 20, 3,  9,  4,  10,
                              5,  11, 15, 21, 16, 22, 17, 23, 24, 30, 25, 31, 26, 32, 36, 42,
                              37, 43, 38, 44, 27, 33, 28, 34, 29, 35, 39, 45, 40, 46, 41, 47};
  static const float s2d[] = {0, 2,  4,  12, 14, 16, 1, 3,  5,  13, 15, 17,
                              6, 8, 10, 18, 20, 22, 7, 9, 11, 19, 21, 23};
  Tensor *x = iota_from(shape_of(4, 1, 8, 2, 3), 0), *y[1] = {NULL};
  Shape want = shape_of(4, 1, 2, 4, 6);
  for (int mode = 0; mode < 2; mode++) {
    Params p = block_params(OP_DEPTH_TO_SPACE, 2, mode);
    CHECK_EQ_INT(run_layout_op(OP_DEPTH_TO_SPACE, &p, &x, 1, 1, false, y, &d), TEQ_OK);
    CHECK(y[0] && shape_equal(&y[0]->shape, &want));
    for (int i = 0; y[0] && i < 48; i++) CHECK_EQ_INT(elem_f32(y[0], i), (mode ? crd : dcr)[i]);
    tensor_unref(y[0]);
    y[0] = NULL;
    check_modes_agree(OP_DEPTH_TO_SPACE, &p, &x, 1, 1);
  }
  Tensor *xs = iota_from(shape_of(4, 1, 1, 4, 6), 0);
  Params p = block_params(OP_SPACE_TO_DEPTH, 2, 0);
  Shape ws = shape_of(4, 1, 4, 2, 3);
  CHECK_EQ_INT(run_layout_op(OP_SPACE_TO_DEPTH, &p, &xs, 1, 1, false, y, &d), TEQ_OK);
  CHECK(y[0] && shape_equal(&y[0]->shape, &ws));
  for (int i = 0; y[0] && i < 24; i++) CHECK_EQ_INT(elem_f32(y[0], i), s2d[i]);
  tensor_unref(y[0]);
  check_modes_agree(OP_SPACE_TO_DEPTH, &p, &xs, 1, 1);
  tensor_unref(xs);
  tensor_unref(x);
  diag_fini(&d);
}

/* DCR depth_to_space undoes space_to_depth, on random data and blocksize 3. */
static void test_block_inverse(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(shape_of(4, 2, 5, 6, 9), 8), *a[1] = {NULL}, *b[1] = {NULL};
  Params ps = block_params(OP_SPACE_TO_DEPTH, 3, 0), pd = block_params(OP_DEPTH_TO_SPACE, 3, 0);
  CHECK_EQ_INT(run_layout_op(OP_SPACE_TO_DEPTH, &ps, &x, 1, 1, false, a, &d), TEQ_OK);
  if (a[0]) CHECK_EQ_INT(run_layout_op(OP_DEPTH_TO_SPACE, &pd, a, 1, 1, false, b, &d), TEQ_OK);
  CHECK(b[0] && shape_equal(&b[0]->shape, &x->shape));
  for (int64_t i = 0; b[0] && i < tensor_numel(x); i++) CHECK(elem_f32(b[0], i) == elem_f32(x, i));
  tensor_unref(a[0]), tensor_unref(b[0]), tensor_unref(x);
  diag_fini(&d);
}

/* ---- tile, expand ---- */

static void check_tile(Shape s, const int64_t *r) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(s, 9), *y[1] = {NULL};
  Params p = params_with_ints(OP_TILE, "repeats", r, s.ndim);
  CHECK_EQ_INT(run_layout_op(OP_TILE, &p, &x, 1, 1, false, y, &d), TEQ_OK);
  if (y[0]) {
    const Shape *o = &y[0]->shape;
    for (int k = 0; k < s.ndim; k++) CHECK_EQ_INT(o->d[k], s.d[k] * r[k]);
    int64_t c[TEQ_MAX_DIMS] = {0}, src[TEQ_MAX_DIMS], bad = 0;
    if (tensor_numel(y[0]) > 0) do {
        for (int k = 0; k < s.ndim; k++) src[k] = c[k] % s.d[k];
        bad += elem_f32(y[0], flat(o, c)) != elem_f32(x, flat(&s, src));
      } while (next_coord(o, c));
    CHECK_MSG(bad == 0, "tile: %lld wrong", (long long)bad);
  }
  tensor_unref(y[0]);
  Tensor *xi = iota_from(s, 0);
  check_modes_agree(OP_TILE, &p, &xi, 1, 1);
  tensor_unref(xi);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_tile(void) {
  check_tile(shape_of(2, 2, 2), (int64_t[]){1, 2}); /* ONNX's example */
  check_tile(shape_of(4, 2, 3, 4, 5), (int64_t[]){7, 6, 5, 4});
  check_tile(shape_of(3, 1, 3, 1), (int64_t[]){2, 1, 3});
  check_tile(shape_of(6, 2, 1, 2, 1, 2, 3), (int64_t[]){2, 3, 1, 2, 2, 2}); /* 12 box dims */
  check_tile(shape_of(2, 3, 2), (int64_t[]){0, 2});                         /* empty */
  check_tile(shape_of(0), (int64_t[]){0});                                  /* a scalar */
}

static void check_expand(Shape s, const int64_t *shape, int n, Shape want) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(s, 10), *y[1] = {NULL};
  Params p = params_with_ints(OP_EXPAND, "shape", shape, n);
  CHECK_EQ_INT(run_layout_op(OP_EXPAND, &p, &x, 1, 1, false, y, &d), TEQ_OK);
  CHECK(y[0] && shape_equal(&y[0]->shape, &want));
  if (y[0] && tensor_numel(y[0]) > 0) {
    int64_t c[TEQ_MAX_DIMS] = {0}, src[TEQ_MAX_DIMS], bad = 0;
    do {
      for (int k = 0; k < s.ndim; k++) {
        int64_t ck = c[k + want.ndim - s.ndim];
        src[k] = s.d[k] == 1 ? 0 : ck;
      }
      bad += elem_f32(y[0], flat(&want, c)) != elem_f32(x, flat(&s, src));
    } while (next_coord(&want, c));
    CHECK_MSG(bad == 0, "expand: %lld wrong", (long long)bad);
  }
  tensor_unref(y[0]);
  Tensor *xi = iota_from(s, 0);
  check_modes_agree(OP_EXPAND, &p, &xi, 1, 1);
  tensor_unref(xi);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_expand(void) {
  /* ONNX's examples: [3, 1] to [2, 1, 6] and to [3, 4]. */
  check_expand(shape_of(2, 3, 1), (int64_t[]){2, 1, 6}, 3, shape_of(3, 2, 3, 6));
  check_expand(shape_of(2, 3, 1), (int64_t[]){3, 4}, 2, shape_of(2, 3, 4));
  check_expand(shape_of(2, 3, 4), (int64_t[]){1, 1}, 2, shape_of(2, 3, 4)); /* shape smaller */
  check_expand(shape_of(0), (int64_t[]){2, 3}, 2, shape_of(2, 2, 3));
  check_expand(shape_of(4, 1, 3, 1, 5), (int64_t[]){2, 1, 3, 4, 1}, 5, shape_of(5, 2, 1, 3, 4, 5));
  check_expand(shape_of(2, 1, 3), (int64_t[]){0, 3}, 2, shape_of(2, 0, 3));
}

/* ---- ONNX: export, import, same results ---- */

/* One node of kind on a random input of shape s through
 * check_node_round_trip, with the same parameters. */
static void check_round_trip(OpKind kind, const Params *p, Shape s) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(s, 77);
  CHECK_EQ_INT(check_node_round_trip(kind, p, &x, 1, true, &d), TEQ_OK);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_onnx_round_trip(void) {
  Shape nchw = shape_of(4, 2, 8, 4, 6);
  for (int mode = 0; mode < 2; mode++) {
    Params p = block_params(OP_DEPTH_TO_SPACE, 2, mode);
    check_round_trip(OP_DEPTH_TO_SPACE, &p, nchw);
  }
  Params p = block_params(OP_SPACE_TO_DEPTH, 2, 0);
  check_round_trip(OP_SPACE_TO_DEPTH, &p, nchw);
  p = params_with_ints(OP_TILE, "repeats", (int64_t[]){1, 2, 1, 3}, 4);
  check_round_trip(OP_TILE, &p, nchw);
  p = params_with_ints(OP_EXPAND, "shape", (int64_t[]){3, 2, 8, 4, 6}, 5);
  check_round_trip(OP_EXPAND, &p, nchw);
}

/* ---- shape-inference errors ---- */

static void test_errors(void) {
  Params p = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){1, 0, 2}, 3);
  Shape s2 = shape_of(2, 2, 3), s4 = shape_of(4, 1, 2, 3, 4);
  check_infer_error(OP_TRANSPOSE, &p, &s2, 1, 1,
                    "transpose: perm has 3 entries but input 0 has shape [2, 3]");
  p = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){1, 1}, 2);
  check_infer_error(OP_TRANSPOSE, &p, &s2, 1, 1, "not a permutation");
  p = params_with_ints(OP_RESHAPE, "shape", (int64_t[]){5}, 1);
  check_infer_error(OP_RESHAPE, &p, &s2, 1, 1,
                    "reshape: shape=[5] has 5 elements but input 0 has shape [2, 3] (6)");
  p = params_with_ints(OP_RESHAPE, "shape", (int64_t[]){1, 1, 1, 1, 1, 1, 2, 3}, 8);
  check_infer_error(OP_RESHAPE, &p, &s2, 1, 1, "at most 6");
  params_default(OP_CONCAT, &p);
  param_set_int(&p, 0, 3);
  Shape cat[2] = {shape_of(4, 1, 2, 3, 4), shape_of(2, 1, 2)};
  check_infer_error(OP_CONCAT, &p, cat, 2, 1, "concat: axis=3: input 1 has shape [1, 2] (rank 2)");
  param_set_int(&p, 0, 0);
  cat[1] = shape_of(4, 1, 2, 5, 4);
  check_infer_error(OP_CONCAT, &p, cat, 2, 1,
                    "input 1 has shape [1, 2, 5, 4], input 0 has [1, 2, 3, 4]");
  params_default(OP_SPLIT, &p);
  param_set_int(&p, 0, 2);
  param_set_ints(&p, 1, (int64_t[]){1, 1}, 2);
  check_infer_error(OP_SPLIT, &p, &s4, 1, 2, "split: sizes add up to 2 but axis 2");
  param_set_ints(&p, 1, NULL, 0);
  check_infer_error(OP_SPLIT, &p, &s4, 1, 2, "not divisible into 2 outputs");
  param_set_ints(&p, 1, (int64_t[]){3}, 1);
  check_infer_error(OP_SPLIT, &p, &s4, 1, 2, "sizes has 1 entries for 2 outputs");
  param_set_int(&p, 0, 4);
  check_infer_error(OP_SPLIT, &p, &s4, 1, 1,
                    "split: axis=4: input 0 has shape [1, 2, 3, 4] (rank 4)");
}

static void test_errors_select(void) {
  Params p;
  Shape s2 = shape_of(2, 2, 3);
  Shape s5 = shape_of(5, 1, 1, 1, 1, 1);
  p = pad_params(NULL, 0, 0, 0);
  check_infer_error(OP_PAD, &p, &s5, 1, 1, "rank 5 above 4");
  p = pad_params((int64_t[]){1, 1}, 2, 0, 0);
  check_infer_error(OP_PAD, &p, &s2, 1, 1,
                    "pads has 2 values but input 0 has shape [2, 3] (rank 2, so 4)");
  p = pad_params((int64_t[]){0, 3, 0, 0}, 4, 0, 1);
  check_infer_error(OP_PAD, &p, &s2, 1, 1, "mode=reflect");
  p = pad_params((int64_t[]){0, -2, 0, -2}, 4, 0, 0);
  check_infer_error(OP_PAD, &p, &s2, 1, 1, "crop dimension 1");
  p = pad_params((int64_t[]){0, 0, 0, 0}, 4, 0, 3);
  check_infer_error(OP_PAD, &p, &s2, 1, 1, "mode=3");
  p = slice_params(2, (int64_t[]){0, 0}, (int64_t[]){2, 3}, (int64_t[]){1, 0});
  check_infer_error(OP_SLICE, &p, &s2, 1, 1, "steps[1]=0");
  p = slice_params(1, (int64_t[]){0}, (int64_t[]){2}, (int64_t[]){1});
  check_infer_error(OP_SLICE, &p, &s2, 1, 1, "(rank 2)");
  p = slice_params(2, (int64_t[]){0, 0}, (int64_t[]){2, 4}, (int64_t[]){1, 1});
  check_infer_error(OP_SLICE, &p, &s2, 1, 1, "dimension 1 of extent 3");
  params_default(OP_GATHER, &p);
  param_set_int(&p, 0, 2);
  Shape g[2] = {shape_of(2, 2, 3), shape_of(1, 4)};
  check_infer_error(OP_GATHER, &p, g, 2, 1, "gather: axis=2: input 0 has shape [2, 3] (rank 2)");
  param_set_int(&p, 0, 0);
  g[0] = shape_of(4, 1, 2, 3, 4);
  g[1] = shape_of(4, 1, 1, 1, 1);
  check_infer_error(OP_GATHER, &p, g, 2, 1, "rank 7, above 6");
}

static void test_errors_new(void) {
  Shape s3 = shape_of(3, 8, 2, 3), s4 = shape_of(4, 1, 8, 2, 3);
  Params p = block_params(OP_DEPTH_TO_SPACE, 2, 0);
  check_infer_error(OP_DEPTH_TO_SPACE, &p, &s3, 1, 1,
                    "depth_to_space: input 0 has shape [8, 2, 3]: rank 4 (N, C, H, W) expected");
  p = block_params(OP_DEPTH_TO_SPACE, 3, 1);
  check_infer_error(OP_DEPTH_TO_SPACE, &p, &s4, 1, 1,
                    "blocksize=3: input 0 has shape [1, 8, 2, 3], channels not divisible by 9");
  p = block_params(OP_SPACE_TO_DEPTH, 2, 0);
  check_infer_error(OP_SPACE_TO_DEPTH, &p, &s4, 1, 1, "height and width not divisible");
  p = block_params(OP_DEPTH_TO_SPACE, 0, 0);
  check_infer_error(OP_DEPTH_TO_SPACE, &p, &s4, 1, 1, "blocksize=0");
  p = params_with_ints(OP_TILE, "repeats", (int64_t[]){2, 2}, 2);
  check_infer_error(OP_TILE, &p, &s3, 1, 1,
                    "tile: repeats has 2 entries but input 0 has shape [8, 2, 3] (rank 3)");
  p = params_with_ints(OP_TILE, "repeats", (int64_t[]){1, 1, (int64_t)1 << 39}, 3);
  check_infer_error(OP_TILE, &p, &s3, 1, 1, "grows past 2^40");
  /* Sums and products of extents are bounded before they could overflow. */
  params_default(OP_CONCAT, &p);
  Shape huge[2] = {shape_make(2, (int64_t[]){INT64_C(1) << 62, 1}),
                   shape_make(2, (int64_t[]){INT64_C(1) << 62, 1})};
  check_infer_error(OP_CONCAT, &p, huge, 2, 1, "add up to more than 2^40");
  p = params_with_ints(OP_EXPAND, "shape",
                       (int64_t[]){INT64_C(1) << 31, INT64_C(1) << 31, INT64_C(1) << 31, 8, 2, 3},
                       6);
  check_infer_error(OP_EXPAND, &p, &s3, 1, 1, "shape has more than 2^40 elements");
  p = params_with_ints(OP_EXPAND, "shape", (int64_t[]){4, 3}, 2);
  check_infer_error(OP_EXPAND, &p, &s3, 1, 1,
                    "expand: shape=[4, 3]: input 0 has shape [8, 2, 3], "
                    "which does not broadcast to it");
}

/* Mixed dtypes are refused instead of copied at the wrong element size. */
static void test_dtype_errors(void) {
  Diag d;
  diag_init(&d);
  Tensor *f = iota_from(shape_of(1, 4), 0), *l = to_i64(f), *y[1] = {NULL};
  Params p;
  params_default(OP_CONCAT, &p);
  CHECK_EQ_INT(run_layout_op(OP_CONCAT, &p, (Tensor *[]){f, l}, 2, 1, false, y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "input 1 is int64 but the output is float32") != NULL, "%s",
            diag_last(&d));
  tensor_unref(f);
  tensor_unref(l);
  diag_fini(&d);
}

/* An int64 shape tensor keeps its dtype through layout operators in the
 * executor: transpose then gather, as a folded shape computation does. */
static void test_int64_through_exec(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape s = shape_of(2, 2, 3), si = shape_of(1, 2);
  Tensor *idx = tensor_new(DT_I64, &si);
  ((int64_t *)idx->data)[0] = -1;
  ((int64_t *)idx->data)[1] = 0;
  int x = graph_add_input(g, "x", &s, DT_I64, &d);
  int ic = graph_add_const(g, "idx", idx, &d);
  int t = graph_add_node(g, OP_TRANSPOSE, (TensorRef[]){{x, 0}}, 1, 1, NULL, "t", &d); /* [3,2] */
  int ga = graph_add_node(g, OP_GATHER, (TensorRef[]){{t, 0}, {ic, 0}}, 2, 1, NULL, "g", &d);
  CHECK(ga >= 0 && graph_add_output(g, (TensorRef){ga, 0}, "y", &d) >= 0);
  Tensor *in = tensor_new(DT_I64, &s), *y = NULL;
  for (int i = 0; i < 6; i++) ((int64_t *)in->data)[i] = ((int64_t)1 << 40) + i;
  int rc = exec_run(g, EXEC_F32, &in, &y, &d);
  CHECK_MSG(rc == TEQ_OK, "%s", diag_last(&d));
  /* x^T = [[0 3] [1 4] [2 5]]; rows -1 and 0 are [2 5] and [0 3]. */
  int64_t want[] = {2, 5, 0, 3};
  CHECK(!rc && y->dtype == DT_I64 && tensor_numel(y) == 4);
  for (int i = 0; !rc && i < 4; i++)
    CHECK_EQ_INT(((int64_t *)y->data)[i], ((int64_t)1 << 40) + want[i]);
  tensor_unref(y);
  tensor_unref(in);
  graph_free(g);
  diag_fini(&d);
}

static void test_flags(void) {
  OpKind kinds[] = {OP_TRANSPOSE, OP_RESHAPE, OP_CONCAT, OP_SPLIT, OP_PAD, OP_SLICE, OP_GATHER};
  for (int i = 0; i < 7; i++) {
    CHECK(op_def(kinds[i])->flags & OPF_LAYOUT_ONLY);
    CHECK(op_def(kinds[i])->flags & OPF_MULTILINEAR);
    CHECK(!(op_def(kinds[i])->flags & OPF_NONLINEAR));
  }
  CHECK_EQ_INT(op_by_onnx("Flatten"), OP_RESHAPE);
  CHECK_EQ_INT(op_by_onnx("Unsqueeze"), OP_RESHAPE);
  CHECK_EQ_INT(op_by_onnx("Squeeze"), OP_RESHAPE);
  CHECK_EQ_INT(op_def(OP_CONCAT)->n_in_max, -1);
  CHECK_EQ_INT(op_def(OP_SPLIT)->n_out_max, 8);
  OpKind added[] = {OP_DEPTH_TO_SPACE, OP_SPACE_TO_DEPTH, OP_TILE, OP_EXPAND};
  for (int i = 0; i < 4; i++) {
    CHECK(op_def(added[i])->flags & OPF_LAYOUT_ONLY && op_def(added[i])->flags & OPF_MULTILINEAR);
    CHECK(op_by_onnx(op_def(added[i])->onnx_op) == (int)added[i]);
  }
}
/* ---- views ----
 * op_view's claim checked against the kernel: where it says an output is a
 * run of the input from element `first`, the kernel's output must be
 * exactly those elements; and it must say so in the cases the cost model
 * and the GPU planner rely on, and not where the pieces are strided or
 * would start off the alignment. */

/* index: a constant second input (a gather's), or NULL. */
static void check_view_of(const char *label, OpKind kind, const Params *p, Shape s,
                          Tensor *index, int n_out, bool want) {
  Diag d;
  diag_init(&d);
  Op o;
  int n_in = index ? 2 : 1;
  op_init(&o, kind, n_in);
  o.node.n_out = n_out;
  if (p) o.node.params = *p;
  o.node.dtype = DT_F32;
  int64_t first[8] = {0};
  Shape in[2] = {s, index ? index->shape : s};
  const Tensor *consts[2] = {NULL, index};
  bool view = op_view(&o.node, in, consts, first);
  CHECK_MSG(view == want, "%s: op_view says %d", label, view);
  Tensor *x = iota_from(s, 0), *y[8] = {0};
  CHECK_EQ_INT(run_layout_op(kind, p, (Tensor *[]){x, index}, n_in, n_out, false, y, &d), TEQ_OK);
  for (int j = 0; view && j < n_out && y[j]; j++)
    CHECK_MSG(first[j] + tensor_numel(y[j]) <= tensor_numel(x) &&
                  memcmp(y[j]->data, (float *)x->data + first[j], tensor_bytes(y[j])) == 0,
              "%s: output %d is not the input from element %lld", label, j, (long long)first[j]);
  for (int j = 0; j < n_out; j++) tensor_unref(y[j]);
  tensor_unref(x);
  diag_fini(&d);
}

static void check_view(const char *label, OpKind kind, const Params *p, Shape s, int n_out,
                       bool want) {
  check_view_of(label, kind, p, s, NULL, n_out, want);
}

/* A gather of the one index k (a scalar, or of shape is) along axis. */
static void check_gather_view(const char *label, Shape s, int axis, int64_t k, Shape is,
                              bool want) {
  Params p;
  params_default(OP_GATHER, &p);
  param_set_int(&p, 0, axis);
  Tensor *index = tensor_new(DT_I64, &is);
  ((int64_t *)index->data)[0] = k;
  check_view_of(label, OP_GATHER, &p, s, index, 1, want);
  tensor_unref(index);
}

static void test_views(void) {
  Params p = params_with_ints(OP_RESHAPE, "shape", (int64_t[]){4, 128}, 2);
  check_view("reshape", OP_RESHAPE, &p, shape_of(3, 2, 16, 16), 1, true);

  /* A batch-1 matmul's merged output cut by columns: eight blocks. */
  params_default(OP_SPLIT, &p);
  param_set_int(&p, 0, 1);
  check_view("split [1,4096] into 8", OP_SPLIT, &p, shape_of(2, 1, 4096), 8, true);
  check_view("split [1,96,28,28] axis 1 into 3", OP_SPLIT, &p, shape_of(4, 1, 96, 28, 28), 3,
             true);
  check_view("split [2,128] axis 1 (strided)", OP_SPLIT, &p, shape_of(2, 2, 128), 2, false);
  check_view("split [1,6] (off the alignment)", OP_SPLIT, &p, shape_of(2, 1, 6), 2, false);
  /* 16 bytes (OP_PLACE_ALIGN), not 256: Inception-v3's split of [1,512,17,17]
   * into 160 and 352 channels starts its second piece 184,960 bytes in. */
  param_set_ints(&p, 1, (int64_t[]){4, 8}, 2);
  check_view("split [1,12] into 4,8 (16 bytes)", OP_SPLIT, &p, shape_of(2, 1, 12), 2, true);
  param_set_ints(&p, 1, (int64_t[]){160, 352}, 2);
  check_view("split [1,512,17,17] into 160,352", OP_SPLIT, &p, shape_of(4, 1, 512, 17, 17), 2,
             true);
  param_set_ints(&p, 1, (int64_t[]){2, 6}, 2);
  check_view("split [1,8] into 2,6 (8 bytes)", OP_SPLIT, &p, shape_of(2, 1, 8), 2, false);
  param_set_ints(&p, 1, NULL, 0);
  param_set_int(&p, 0, 0);
  param_set_ints(&p, 1, (int64_t[]){64, 192}, 2);
  check_view("split [256,4] axis 0 64,192", OP_SPLIT, &p, shape_of(2, 256, 4), 2, true);

  p = params_with_ints(OP_SLICE, "starts", (int64_t[]){0, 64, 0}, 3);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), (int64_t[]){1, 128, 8}, 3);
  param_set_ints(&p, param_index(OP_SLICE, "steps"), (int64_t[]){1, 1, 1}, 3);
  check_view("slice whole rows", OP_SLICE, &p, shape_of(3, 1, 256, 8), 1, true);
  check_view("slice rows of item 0 of 2", OP_SLICE, &p, shape_of(3, 2, 256, 8), 1, true);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), (int64_t[]){2, 128, 8}, 3);
  check_view("slice rows of both items (strided)", OP_SLICE, &p, shape_of(3, 2, 256, 8), 1,
             false);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), (int64_t[]){1, 128, 8}, 3);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), (int64_t[]){1, 128, 4}, 3);
  check_view("slice part of each row", OP_SLICE, &p, shape_of(3, 1, 256, 8), 1, false);
  param_set_ints(&p, param_index(OP_SLICE, "starts"), (int64_t[]){0, 127, 0}, 3);
  param_set_ints(&p, param_index(OP_SLICE, "ends"), (int64_t[]){1, 63, 8}, 3);
  param_set_ints(&p, param_index(OP_SLICE, "steps"), (int64_t[]){1, -1, 1}, 3);
  check_view("slice rows reversed", OP_SLICE, &p, shape_of(3, 1, 256, 8), 1, false);

  p = params_with_ints(OP_PAD, "pads", (int64_t[]){0, 0, 0, 0, 0, 0, 0, 0}, 8);
  check_view("pad of zeros", OP_PAD, &p, shape_of(4, 1, 8, 5, 5), 1, true);
  param_set_int(&p, param_index(OP_PAD, "mode"), 1);
  check_view("pad of zeros, reflect", OP_PAD, &p, shape_of(4, 2, 8, 5, 5), 1, true);
  p = params_with_ints(OP_PAD, "pads", (int64_t[]){0, 0, 0, 1, 0, 0, 0, 0}, 8);
  check_view("pad of one column", OP_PAD, &p, shape_of(4, 1, 8, 5, 5), 1, false);

  Params t = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){1, 0}, 2);
  check_view("transpose", OP_TRANSPOSE, &t, shape_of(2, 64, 64), 1, false);
  check_view("transpose [1,512] -> [512,1]", OP_TRANSPOSE, &t, shape_of(2, 1, 512), 1, true);
  t = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){0, 2, 1, 3}, 4);
  check_view("transpose moving extent-1 axes", OP_TRANSPOSE, &t, shape_of(4, 1, 8, 1, 64), 1,
             true);
  t = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){2, 0, 3, 1}, 4);
  check_view("transpose swapping two long axes", OP_TRANSPOSE, &t, shape_of(4, 8, 1, 64, 2), 1,
             false);

  /* Pools whose window is one element: VGG's adaptive pool of 7x7 to 7x7. */
  Params w;
  params_default(OP_AVGPOOL, &w);
  param_set_ints(&w, param_index(OP_AVGPOOL, "kernel"), (int64_t[]){1, 1}, 2);
  param_set_ints(&w, param_index(OP_AVGPOOL, "stride"), (int64_t[]){1, 1}, 2);
  check_view("avgpool 1x1 stride 1", OP_AVGPOOL, &w, shape_of(4, 1, 64, 7, 7), 1, true);
  param_set_int(&w, param_index(OP_AVGPOOL, "ceil_mode"), 1);
  check_view("avgpool 1x1 stride 1 ceil", OP_AVGPOOL, &w, shape_of(4, 2, 8, 5, 3), 1, true);
  param_set_ints(&w, param_index(OP_AVGPOOL, "stride"), (int64_t[]){2, 1}, 2);
  check_view("avgpool 1x1 stride 2", OP_AVGPOOL, &w, shape_of(4, 1, 64, 8, 8), 1, false);
  params_default(OP_MAXPOOL, &w);
  param_set_ints(&w, param_index(OP_MAXPOOL, "kernel"), (int64_t[]){1, 1}, 2);
  param_set_ints(&w, param_index(OP_MAXPOOL, "stride"), (int64_t[]){1, 1}, 2);
  check_view("maxpool 1x1 stride 1", OP_MAXPOOL, &w, shape_of(4, 1, 64, 7, 7), 1, true);
  param_set_ints(&w, param_index(OP_MAXPOOL, "kernel"), (int64_t[]){2, 1}, 2);
  check_view("maxpool 2x1 stride 1", OP_MAXPOOL, &w, shape_of(4, 1, 64, 7, 7), 1, false);
  check_view("global_avgpool of 1x1 planes", OP_GLOBAL_AVGPOOL, NULL, shape_of(4, 1, 512, 1, 1),
             1, true);
  check_view("global_maxpool of 1x1 planes", OP_GLOBAL_MAXPOOL, NULL, shape_of(4, 2, 64, 1, 1),
             1, true);
  check_view("global_avgpool of 2x1 planes", OP_GLOBAL_AVGPOOL, NULL, shape_of(4, 1, 512, 2, 1),
             1, false);

  /* PyTorch's select: Q, K and V of a packed projection, ViT's class token */
  check_gather_view("gather V of [3,64,3,49,32]", shape_of(5, 3, 64, 3, 49, 32), 0, 2,
                    shape_of(0), true);
  check_gather_view("gather index -1 of [3,8,64]", shape_of(3, 3, 8, 64), 0, -1, shape_of(0),
                    true);
  check_gather_view("gather the class token of [1,197,768]", shape_of(3, 1, 197, 768), 1, 0,
                    shape_of(0), true);
  check_gather_view("gather row 1 of [2,8,64] along axis 1 (strided)", shape_of(3, 2, 8, 64), 1,
                    1, shape_of(0), false);
  check_gather_view("gather [1] (the axis kept)", shape_of(3, 3, 8, 64), 0, 1, shape_of(1, 1),
                    true);
  check_gather_view("gather row 1 of [3,3] (off the alignment)", shape_of(2, 3, 3), 0, 1,
                    shape_of(0), false);
}

/* ---- sources ----
 * source_of's answer checked against the kernel at every element: output
 * element f of a transpose of an iota is input element source_of(f). */
static void check_source_of(const char *label, const Params *p, Shape s) {
  Diag d;
  diag_init(&d);
  Op o;
  op_init(&o, OP_TRANSPOSE, 1);
  o.node.params = *p;
  o.node.dtype = DT_F32;
  Tensor *x = iota_from(s, 0), *y = NULL;
  CHECK_EQ_INT(run_layout_op(OP_TRANSPOSE, p, &x, 1, 1, false, &y, &d), TEQ_OK);
  int64_t bad = 0, n = y ? tensor_numel(y) : 0;
  for (int64_t f = 0; f < n; f++) {
    int input = -1;
    int64_t from = op_def(OP_TRANSPOSE)->source_of(&o.node, &s, f, &input);
    bad += input != 0 || from < 0 || from >= n || ((float *)y->data)[f] != (float)from;
  }
  CHECK_MSG(bad == 0, "%s: %lld elements not where source_of says", label, (long long)bad);
  tensor_unref(y);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_source_of(void) {
  Params p = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){1, 3, 0, 2}, 4);
  check_source_of("perm 1,3,0,2", &p, shape_of(4, 3, 4, 5, 6));
  p = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){0, 2, 1}, 3);
  check_source_of("perm 0,2,1", &p, shape_of(3, 2, 7, 5));
  p = params_with_ints(OP_TRANSPOSE, "perm", (int64_t[]){0, 2, 4, 1, 3}, 5);
  check_source_of("space to depth's perm", &p, shape_of(5, 1, 3, 2, 4, 2));
  params_default(OP_TRANSPOSE, &p); /* empty: reversed */
  check_source_of("reversed", &p, shape_of(3, 2, 3, 4));
  check_source_of("rank 1", &p, shape_of(1, 9));
}

int main(void) {
  test_transpose();
  test_reshape();
  test_concat_split();
  test_split_equal();
  test_pad();
  test_slice();
  test_gather();
  test_block_examples();
  test_block_inverse();
  test_tile();
  test_expand();
  test_onnx_round_trip();
  test_errors();
  test_errors_select();
  test_errors_new();
  test_dtype_errors();
  test_int64_through_exec();
  test_flags();
  test_views();
  test_source_of();
  return check_exit();
}
