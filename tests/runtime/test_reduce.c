/* test_reduce.c: the reduction rows (runtime/ops/reduce.c), called directly
 * through the registry: hand-computed sums, means, maxima and softmaxes;
 * every reduction and axis combination against a reference loop in double,
 * empty inputs included; log_sum_exp on values whose exp overflows; Z_p
 * sums, products and sums of squares against float32 on small integers,
 * the Z_p mean as sum * inv(count), max and min as integer comparisons of
 * residues, and l1, l2, log_sum and log_sum_exp through their stand-ins;
 * softmax and log_softmax against double, and in Z_p as s(x_i) * inv(sum
 * s(x_j)) and x_i - s(sum s(x_j)); an ONNX export and import round trip;
 * the messages of shape inference; and argmax and argmin: ties both ways
 * on every axis, NaN, Z_p against float32, int64 through graph and
 * executor, and the ONNX round trip. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/modp.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/tensor_check.h"

/* ---- harness ---- */

static Params reduce_params(OpKind k, const int64_t *axes, int n, int keepdims) {
  Params p;
  params_default(k, &p);
  param_set_ints(&p, param_index(k, "axes"), axes, n);
  param_set_int(&p, param_index(k, "keepdims"), keepdims);
  return p;
}

/* ---- hand-computed ---- */

static void test_hand(void) {
  Diag d;
  diag_init(&d);
  float v[] = {1, 2, 3, 4, 5, 6}; /* [[1 2 3] [4 5 6]] */
  Tensor *x = f32_tensor(shape_of(2, 2, 3), v), *y = NULL;
  Params p = reduce_params(OP_REDUCE_SUM, (int64_t[]){1}, 1, 0);
  CHECK_EQ_INT(run_op(OP_REDUCE_SUM, &p, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(y && y->shape.ndim == 1 && y->shape.d[0] == 2 && elem_f32(y, 0) == 6 &&
        elem_f32(y, 1) == 15);
  tensor_unref(y);
  p = reduce_params(OP_REDUCE_MEAN, (int64_t[]){0}, 1, 1);
  CHECK_EQ_INT(run_op(OP_REDUCE_MEAN, &p, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(y && y->shape.ndim == 2 && y->shape.d[0] == 1 && y->shape.d[1] == 3);
  CHECK(y && elem_f32(y, 0) == 2.5f && elem_f32(y, 1) == 3.5f && elem_f32(y, 2) == 4.5f);
  tensor_unref(y);
  p = reduce_params(OP_REDUCE_MAX, NULL, 0, 0); /* all axes */
  CHECK_EQ_INT(run_op(OP_REDUCE_MAX, &p, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(y && y->shape.ndim == 0 && elem_f32(y, 0) == 6);
  tensor_unref(y);
  p = reduce_params(OP_REDUCE_SUM, NULL, 0, 1);
  CHECK_EQ_INT(run_op(OP_REDUCE_SUM, &p, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(y && y->shape.ndim == 2 && elem_f32(y, 0) == 21);
  tensor_unref(y);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_hand_softmax(void) {
  Diag d;
  diag_init(&d);
  float v[] = {1, 2, 3, 4, 5, 6}; /* [[1 2 3] [4 5 6]] */
  Tensor *x = f32_tensor(shape_of(2, 2, 3), v), *y = NULL;
  /* softmax([1 2 3]) = e^i / (e + e^2 + e^3). */
  Params ps;
  params_default(OP_SOFTMAX, &ps);
  param_set_int(&ps, 0, 1);
  CHECK_EQ_INT(run_op(OP_SOFTMAX, &ps, &x, 1, false, &y, &d), TEQ_OK);
  double z = exp(1) + exp(2) + exp(3);
  for (int i = 0; y && i < 3; i++) {
    CHECK_NEAR(elem_f32(y, i), exp(i + 1) / z, 1e-6);
    CHECK_NEAR(elem_f32(y, 3 + i), exp(i + 1) / z, 1e-6); /* shift-invariant */
  }
  tensor_unref(y);
  /* Large logits do not overflow. */
  float big[] = {1000, 1000, -1000};
  Tensor *xb = f32_tensor(shape_of(1, 3), big);
  param_set_int(&ps, 0, 0);
  CHECK_EQ_INT(run_op(OP_SOFTMAX, &ps, &xb, 1, false, &y, &d), TEQ_OK);
  CHECK(y && elem_f32(y, 0) == 0.5f && elem_f32(y, 1) == 0.5f && elem_f32(y, 2) == 0.0f);
  tensor_unref(y);
  tensor_unref(xb);
  tensor_unref(x);
  diag_fini(&d);
}

/* ---- every axis combination against a reference ---- */

enum { REF_SUM, REF_MEAN, REF_MAX, REF_MIN, REF_PROD, REF_L1, REF_L2, REF_SUM_SQUARE,
       REF_LOG_SUM, REF_LOG_SUM_EXP };

/* The reduction rows and what each computes, for the reference. */
static const struct {
  OpKind kind;
  int ref;
} reduce_cases[] = {
  {OP_REDUCE_SUM, REF_SUM},       {OP_REDUCE_MEAN, REF_MEAN},
  {OP_REDUCE_MAX, REF_MAX},       {OP_REDUCE_MIN, REF_MIN},
  {OP_REDUCE_PROD, REF_PROD},     {OP_REDUCE_L1, REF_L1},
  {OP_REDUCE_L2, REF_L2},         {OP_REDUCE_SUM_SQUARE, REF_SUM_SQUARE},
  {OP_REDUCE_LOG_SUM, REF_LOG_SUM}, {OP_REDUCE_LOG_SUM_EXP, REF_LOG_SUM_EXP},
};
#define N_REDUCE (int)(sizeof reduce_cases / sizeof *reduce_cases)

static double ref_init(int k) {
  return k == REF_MAX ? -INFINITY : k == REF_MIN ? INFINITY : k == REF_PROD ? 1 : 0;
}

static double ref_fold(int k, double acc, double v) {
  switch (k) {
  case REF_MAX: return fmax(acc, v);
  case REF_MIN: return fmin(acc, v);
  case REF_PROD: return acc * v;
  case REF_L1: return acc + fabs(v);
  case REF_L2: case REF_SUM_SQUARE: return acc + v * v;
  case REF_LOG_SUM_EXP: return acc + exp(v);
  default: return acc + v;
  }
}

static double ref_post(int k, double acc, int64_t count) {
  switch (k) {
  case REF_MEAN: return acc / (double)count;
  case REF_L2: return sqrt(acc);
  case REF_LOG_SUM: case REF_LOG_SUM_EXP: return log(acc);
  default: return acc;
  }
}

/* Reference reduction k of x over mask, into ref (keepdims layout). */
static void reference_reduce(int k, const Tensor *x, const bool *mask, double *ref,
                             int64_t n_out) {
  const Shape *s = &x->shape;
  int64_t c[TEQ_MAX_DIMS] = {0}, count = 1;
  for (int i = 0; i < s->ndim; i++) count *= mask[i] ? s->d[i] : 1;
  for (int64_t j = 0; j < n_out; j++) ref[j] = ref_init(k);
  if (tensor_numel(x) > 0) do {
      int64_t o = 0, i = 0;
      for (int a = 0; a < s->ndim; a++) {
        o = o * (mask[a] ? 1 : s->d[a]) + (mask[a] ? 0 : c[a]);
        i = i * s->d[a] + c[a];
      }
      ref[o] = ref_fold(k, ref[o], elem_f32(x, i));
    } while (next_coord(s, c));
  for (int64_t j = 0; j < n_out; j++) ref[j] = ref_post(k, ref[j], count);
}

static void check_reduce_all_axes(Shape s, uint64_t seed) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(s, seed), *pos = random_f32(s, seed);
  for (int64_t i = 0; i < tensor_numel(pos); i++) /* log_sum needs positive sums */
    ((float *)pos->data)[i] = fabsf(elem_f32(pos, i)) + 0.01f;
  double ref[4096];
  for (int set = 0; set < (1 << s.ndim); set++) {
    int64_t axes[TEQ_MAX_DIMS];
    int n = 0;
    bool mask[TEQ_MAX_DIMS];
    for (int a = 0; a < s.ndim; a++)
      if ((mask[a] = set >> a & 1)) axes[n++] = a;
    if (n == 0)
      for (int a = 0; a < s.ndim; a++) mask[a] = true; /* empty axes: all */
    for (int k = 0; k < N_REDUCE; k++)
      for (int keep = 0; keep < 2; keep++) {
        OpKind kind = reduce_cases[k].kind;
        Tensor *in = reduce_cases[k].ref == REF_LOG_SUM ? pos : x, *y = NULL;
        Params p = reduce_params(kind, axes, n, keep);
        CHECK_EQ_INT(run_op(kind, &p, &in, 1, false, &y, &d), TEQ_OK);
        if (!y) continue;
        int rank = 0;
        for (int a = 0; a < s.ndim; a++) rank += keep || !mask[a];
        CHECK_EQ_INT(y->shape.ndim, rank);
        reference_reduce(reduce_cases[k].ref, in, mask, ref, tensor_numel(y));
        int64_t bad = 0;
        for (int64_t j = 0; j < tensor_numel(y); j++)
          bad += !close_to(elem_f32(y, j), ref[j], 1e-5);
        CHECK_MSG(bad == 0, "%s axes-set %d keepdims %d: %lld wrong", op_def(kind)->name, set,
                  keep, (long long)bad);
        tensor_unref(y);
      }
  }
  tensor_unref(x);
  tensor_unref(pos);
  diag_fini(&d);
}

static void test_reduce_reference(void) {
  check_reduce_all_axes(shape_of(3, 3, 4, 5), 1);
  check_reduce_all_axes(shape_of(4, 2, 3, 1, 4), 2);
  check_reduce_all_axes(shape_of(5, 2, 1, 3, 2, 2), 3);
  check_reduce_all_axes(shape_of(1, 7), 4);
  check_reduce_all_axes(shape_of(2, 3, 0), 5); /* empty: sum 0, max -inf, prod 1, ... */
}

/* A long run sums in double: float32 accumulation would drift here. */
static void test_reduce_precision(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(shape_of(1, 1 << 20), 9), *y = NULL;
  double ref = 0;
  for (int64_t i = 0; i < tensor_numel(x); i++) ref += elem_f32(x, i);
  CHECK_EQ_INT(run_op(OP_REDUCE_SUM, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(y && fabs(elem_f32(y, 0) - ref) < 1e-3);
  tensor_unref(y);
  tensor_unref(x);
  diag_fini(&d);
}

/* log_sum_exp subtracts the maximum first: e^1000 overflows float32 and
 * double alike. Reducing the last axis folds runs, the first folds rows. */
static void test_log_sum_exp_extremes(void) {
  Diag d;
  diag_init(&d);
  float v[] = {1000, 1000, -INFINITY, -INFINITY, INFINITY, 1, NAN, 1};
  Tensor *x = f32_tensor(shape_of(2, 4, 2), v), *y = NULL;
  Params p = reduce_params(OP_REDUCE_LOG_SUM_EXP, (int64_t[]){1}, 1, 0);
  CHECK_EQ_INT(run_op(OP_REDUCE_LOG_SUM_EXP, &p, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(y && close_to(elem_f32(y, 0), 1000 + log(2), 1e-7));
  CHECK(y && elem_f32(y, 1) == -INFINITY && elem_f32(y, 2) == INFINITY && isnan(elem_f32(y, 3)));
  tensor_unref(y);
  Tensor *xt = f32_tensor(shape_of(2, 2, 4), (float[]){1000, -INFINITY, INFINITY, NAN,
                                                       1000, -INFINITY, 1, 1});
  p = reduce_params(OP_REDUCE_LOG_SUM_EXP, (int64_t[]){0}, 1, 1);
  CHECK_EQ_INT(run_op(OP_REDUCE_LOG_SUM_EXP, &p, &xt, 1, false, &y, &d), TEQ_OK);
  CHECK(y && close_to(elem_f32(y, 0), 1000 + log(2), 1e-7));
  CHECK(y && elem_f32(y, 1) == -INFINITY && elem_f32(y, 2) == INFINITY && isnan(elem_f32(y, 3)));
  tensor_unref(y);
  /* ONNX's example: log_sum_exp of [[5, 1], [20, 2]] over axis 1. */
  Tensor *xe = f32_tensor(shape_of(2, 2, 2), (float[]){5, 1, 20, 2});
  p = reduce_params(OP_REDUCE_LOG_SUM_EXP, (int64_t[]){1}, 1, 0);
  CHECK_EQ_INT(run_op(OP_REDUCE_LOG_SUM_EXP, &p, &xe, 1, false, &y, &d), TEQ_OK);
  CHECK(y && close_to(elem_f32(y, 0), log(exp(5) + exp(1)), 1e-7));
  CHECK(y && close_to(elem_f32(y, 1), log(exp(20) + exp(2)), 1e-7));
  tensor_unref(y);
  tensor_unref(xe);
  tensor_unref(xt);
  tensor_unref(x);
  diag_fini(&d);
}

/* ---- Z_p ---- */

static void test_modp_reduce(void) {
  Diag d;
  diag_init(&d);
  Tensor *xf = random_ints(shape_of(4, 2, 3, 4, 5), 1000, 7), *xm = f32_to_modp(xf);
  int64_t sets[][2] = {{1, 2}, {0, 3}, {3, -1}, {0, -1}};
  for (int t = 0; t < 4; t++) {
    int n = sets[t][1] < 0 ? 1 : 2;
    Params p = reduce_params(OP_REDUCE_SUM, sets[t], n, t % 2);
    Tensor *yf = NULL, *ym = NULL, *mm = NULL, *mx = NULL, *mxf = NULL;
    CHECK_EQ_INT(run_op(OP_REDUCE_SUM, &p, &xf, 1, false, &yf, &d), TEQ_OK);
    CHECK_EQ_INT(run_op(OP_REDUCE_SUM, &p, &xm, 1, true, &ym, &d), TEQ_OK);
    Params pm = reduce_params(OP_REDUCE_MEAN, sets[t], n, t % 2);
    CHECK_EQ_INT(run_op(OP_REDUCE_MEAN, &pm, &xm, 1, true, &mm, &d), TEQ_OK);
    Params px = reduce_params(OP_REDUCE_MAX, sets[t], n, t % 2);
    CHECK_EQ_INT(run_op(OP_REDUCE_MAX, &px, &xm, 1, true, &mx, &d), TEQ_OK);
    CHECK_EQ_INT(run_op(OP_REDUCE_MAX, &px, &xf, 1, false, &mxf, &d), TEQ_OK);
    if (!yf || !ym || !mm || !mx || !mxf) break;
    int64_t count = tensor_numel(xf) / tensor_numel(yf);
    uint32_t inv = modp_inv((uint32_t)count);
    for (int64_t j = 0; j < tensor_numel(yf); j++) {
      CHECK_EQ_INT(modp_to_int(elem_modp(ym, j)), (int64_t)elem_f32(yf, j));  /* exact sum */
      CHECK_EQ_INT(elem_modp(mm, j), modp_mul(elem_modp(ym, j), inv)); /* mean = sum / count */
      CHECK_EQ_INT(modp_mul(elem_modp(mm, j), (uint32_t)count), elem_modp(ym, j));
    }
    /* The Z_p max orders residues as integers: every negative value (a
     * residue above p/2) beats every positive one. */
    for (int64_t j = 0; j < tensor_numel(mx); j++) {
      uint32_t r = elem_modp(mx, j);
      if (elem_f32(mxf, j) >= 0) CHECK(modp_to_int(r) < 0 || r == (uint32_t)elem_f32(mxf, j));
    }
    tensor_unref(yf), tensor_unref(ym), tensor_unref(mm), tensor_unref(mx), tensor_unref(mxf);
  }
  tensor_unref(xf);
  tensor_unref(xm);
  diag_fini(&d);
}

static void test_modp_max_hand(void) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(1, 4);
  Tensor *x = tensor_new(DT_MODP, &s), *y = NULL;
  uint32_t v[] = {5, MODP_P - 1, 7, 0};
  memcpy(x->data, v, sizeof v);
  CHECK_EQ_INT(run_op(OP_REDUCE_MAX, NULL, &x, 1, true, &y, &d), TEQ_OK);
  CHECK(y && elem_modp(y, 0) == MODP_P - 1);
  tensor_unref(y);
  tensor_unref(x);
  diag_fini(&d);
}

/* prod and sum_square are exact in Z_p; min orders residues as integers;
 * l1, l2, log_sum and log_sum_exp put their stand-in s where |x|, sqrt and
 * log are: sum s(x), s(sum x^2), s(sum x), s(sum s(x)). */
static void test_modp_new_reductions(void) {
  Diag d;
  diag_init(&d);
  Tensor *xf = random_ints(shape_of(3, 3, 4, 5), 3, 21), *xm = f32_to_modp(xf);
  int64_t axes[] = {1};
  OpKind exact[] = {OP_REDUCE_PROD, OP_REDUCE_SUM_SQUARE};
  for (int k = 0; k < 2; k++) {
    Params p = reduce_params(exact[k], axes, 1, 0);
    Tensor *yf = NULL, *ym = NULL;
    CHECK_EQ_INT(run_op(exact[k], &p, &xf, 1, false, &yf, &d), TEQ_OK);
    CHECK_EQ_INT(run_op(exact[k], &p, &xm, 1, true, &ym, &d), TEQ_OK);
    int64_t bad = 0;
    for (int64_t j = 0; yf && ym && j < tensor_numel(yf); j++)
      bad += modp_to_int(elem_modp(ym, j)) != (int64_t)elem_f32(yf, j);
    CHECK_MSG(yf && ym && bad == 0, "%s: %lld differ", op_def(exact[k])->name, (long long)bad);
    tensor_unref(yf), tensor_unref(ym);
  }
  OpKind mapped[] = {OP_REDUCE_L1, OP_REDUCE_L2, OP_REDUCE_LOG_SUM, OP_REDUCE_LOG_SUM_EXP};
  for (int k = 0; k < 4; k++) {
    uint32_t (*st)(uint32_t) = op_def(mapped[k])->modp_standin;
    CHECK(st && (op_def(mapped[k])->flags & OPF_NONLINEAR));
    Params p = reduce_params(mapped[k], axes, 1, 1);
    Tensor *ym = NULL;
    CHECK_EQ_INT(run_op(mapped[k], &p, &xm, 1, true, &ym, &d), TEQ_OK);
    for (int64_t o = 0; st && ym && o < 3; o++)
      for (int64_t i = 0; i < 5; i++) {
        uint32_t sum = 0, sq = 0, ss = 0;
        for (int64_t j = 0; j < 4; j++) {
          uint32_t v = elem_modp(xm, (o * 4 + j) * 5 + i);
          sum = modp_add(sum, v);
          sq = modp_add(sq, modp_mul(v, v));
          ss = modp_add(ss, st(v));
        }
        uint32_t want[] = {ss, st(sq), st(sum), st(ss)};
        CHECK_EQ_INT(elem_modp(ym, o * 5 + i), want[k]);
      }
    tensor_unref(ym);
  }
  /* min: every negative value (a residue above p/2) loses to every positive one. */
  Shape s = shape_of(1, 4);
  Tensor *x = tensor_new(DT_MODP, &s), *y = NULL;
  memcpy(x->data, (uint32_t[]){5, MODP_P - 1, 7, 3}, 4 * sizeof(uint32_t));
  CHECK_EQ_INT(run_op(OP_REDUCE_MIN, NULL, &x, 1, true, &y, &d), TEQ_OK);
  CHECK(y && elem_modp(y, 0) == 3);
  tensor_unref(y);
  tensor_unref(x);
  tensor_unref(xf);
  tensor_unref(xm);
  diag_fini(&d);
}

/* ---- softmax ---- */

/* kind (softmax or log_softmax) of 8 x along every axis of x [2, 3, 4, 5]
 * against double: softmax within 1e-6 absolutely (its values lie in
 * [0, 1]), log_softmax within 1e-6 relatively. */
static void check_softmax_axes(OpKind kind, uint64_t seed) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(4, 2, 3, 4, 5);
  Tensor *x = random_f32(s, seed);
  for (int64_t i = 0; i < tensor_numel(x); i++) ((float *)x->data)[i] *= 8;
  int64_t st[TEQ_MAX_DIMS];
  shape_strides(&s, st);
  for (int axis = 0; axis < 4; axis++) {
    Params p;
    params_default(kind, &p);
    param_set_int(&p, 0, axis);
    Tensor *y = NULL;
    CHECK_EQ_INT(run_op(kind, &p, &x, 1, false, &y, &d), TEQ_OK);
    if (!y) continue;
    int64_t bad = 0;
    for (int64_t i = 0; i < tensor_numel(x); i++) {
      int64_t pos = i / st[axis] % s.d[axis], base = i - pos * st[axis];
      double z = 0, xi = elem_f32(x, i), yi = elem_f32(y, i);
      for (int64_t j = 0; j < s.d[axis]; j++) z += exp(elem_f32(x, base + j * st[axis]));
      if (kind == OP_LOG_SOFTMAX) bad += !close_to(yi, xi - log(z), 1e-6);
      else bad += fabs(yi - exp(xi) / z) > 1e-6;
    }
    CHECK_MSG(bad == 0, "%s axis %d: %lld wrong", op_def(kind)->name, axis, (long long)bad);
    tensor_unref(y);
  }
  tensor_unref(x);
  diag_fini(&d);
}

static void test_softmax_modp(void) {
  Diag d;
  diag_init(&d);
  uint32_t (*s)(uint32_t) = op_def(OP_SOFTMAX)->modp_standin;
  CHECK(s != NULL && (op_def(OP_SOFTMAX)->flags & OPF_NONLINEAR));
  if (!s) return;
  Shape sh = shape_of(3, 2, 3, 4);
  Tensor *x = tensor_new(DT_MODP, &sh), *y = NULL;
  tensor_fill_random(x, 11);
  Params p;
  params_default(OP_SOFTMAX, &p);
  param_set_int(&p, 0, 1);
  CHECK_EQ_INT(run_op(OP_SOFTMAX, &p, &x, 1, true, &y, &d), TEQ_OK);
  for (int64_t o = 0; y && o < 2; o++)
    for (int64_t i = 0; i < 4; i++) {
      uint32_t sum = 0, total = 0;
      for (int64_t j = 0; j < 3; j++) sum = modp_add(sum, s(elem_modp(x, (o * 3 + j) * 4 + i)));
      for (int64_t j = 0; j < 3; j++) {
        int64_t at_ = (o * 3 + j) * 4 + i;
        CHECK_EQ_INT(elem_modp(y, at_), modp_mul(s(elem_modp(x, at_)), modp_inv(sum)));
        total = modp_add(total, elem_modp(y, at_));
      }
      CHECK_EQ_INT(total, 1); /* the outputs along the axis sum to 1 in Z_p too */
    }
  /* Its stand-in is unlike every other non-linear operator's. */
  for (int k = 0; k < OP__COUNT; k++) {
    uint32_t (*f)(uint32_t) = op_def(k)->modp_standin;
    if (!f || k == OP_SOFTMAX) continue;
    int same = 0;
    for (uint32_t v = 1; v < 50; v++) same += f(v * 7919) == s(v * 7919);
    CHECK_MSG(same <= 3, "%s", op_def(k)->name);
  }
  tensor_unref(y);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_log_softmax(void) {
  Diag d;
  diag_init(&d);
  /* ONNX's large-number case: no overflow, the exact differences remain. */
  Tensor *xb = f32_tensor(shape_of(2, 1, 4), (float[]){10000, 10001, 10002, 10003}), *y = NULL;
  Params p;
  params_default(OP_LOG_SOFTMAX, &p);
  CHECK_EQ_INT(run_op(OP_LOG_SOFTMAX, &p, &xb, 1, false, &y, &d), TEQ_OK);
  double lz = log(1 + exp(1) + exp(2) + exp(3));
  for (int i = 0; y && i < 4; i++) CHECK(close_to(elem_f32(y, i), i - lz, 1e-6));
  tensor_unref(y);
  tensor_unref(xb);
  /* Z_p: x_i - s(sum_j s(x_j)), with a stand-in unlike softmax's. */
  uint32_t (*sf)(uint32_t) = op_def(OP_LOG_SOFTMAX)->modp_standin;
  CHECK(sf && sf != op_def(OP_SOFTMAX)->modp_standin);
  Shape sm = shape_of(2, 3, 4);
  Tensor *xm = tensor_new(DT_MODP, &sm);
  tensor_fill_random(xm, 13);
  param_set_int(&p, 0, 0);
  CHECK_EQ_INT(run_op(OP_LOG_SOFTMAX, &p, &xm, 1, true, &y, &d), TEQ_OK);
  for (int64_t i = 0; sf && y && i < 4; i++) {
    uint32_t sum = 0;
    for (int64_t j = 0; j < 3; j++) sum = modp_add(sum, sf(elem_modp(xm, j * 4 + i)));
    for (int64_t j = 0; j < 3; j++)
      CHECK_EQ_INT(elem_modp(y, j * 4 + i), modp_sub(elem_modp(xm, j * 4 + i), sf(sum)));
  }
  tensor_unref(y);
  tensor_unref(xm);
  diag_fini(&d);
}

/* ---- ONNX: export, import, same results ---- */

/* One node of kind on an input [2, 3, 4] (positive for log_sum) through
 * check_node_round_trip, with the same parameters. */
static void check_round_trip(OpKind kind, const Params *p) {
  Diag d;
  diag_init(&d);
  Tensor *in = random_f32(shape_of(3, 2, 3, 4), 77);
  for (int64_t i = 0; i < tensor_numel(in); i++)
    ((float *)in->data)[i] = fabsf(elem_f32(in, i)) + 0.1f;
  CHECK_EQ_INT(check_node_round_trip(kind, p, &in, 1, true, &d), TEQ_OK);
  tensor_unref(in);
  diag_fini(&d);
}

static void test_onnx_round_trip(void) {
  for (int k = 0; k < N_REDUCE; k++) {
    OpKind kind = reduce_cases[k].kind;
    Params p = reduce_params(kind, (int64_t[]){0, 2}, 2, k % 2);
    check_round_trip(kind, &p);
    p = reduce_params(kind, NULL, 0, 1);
    check_round_trip(kind, &p);
  }
  Params p;
  params_default(OP_LOG_SOFTMAX, &p);
  param_set_int(&p, 0, 2);
  check_round_trip(OP_LOG_SOFTMAX, &p);
  check_round_trip(OP_SOFTMAX, &p);
}

/* ---- shape errors and flags ---- */

static void test_errors(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(shape_of(2, 2, 3), 1), *y = NULL;
  Params p = reduce_params(OP_REDUCE_SUM, (int64_t[]){2}, 1, 1);
  CHECK_EQ_INT(run_op(OP_REDUCE_SUM, &p, &x, 1, false, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "reduce_sum: axes[0]=2: input 0 has shape [2, 3] (rank 2)"),
            "%s", diag_last(&d));
  p = reduce_params(OP_REDUCE_MEAN, (int64_t[]){1, 1}, 2, 1);
  CHECK_EQ_INT(run_op(OP_REDUCE_MEAN, &p, &x, 1, false, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "axes[1]=1 repeats"), "%s", diag_last(&d));
  p = reduce_params(OP_REDUCE_MAX, NULL, 0, 2);
  CHECK_EQ_INT(run_op(OP_REDUCE_MAX, &p, &x, 1, false, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "keepdims=2"), "%s", diag_last(&d));
  params_default(OP_SOFTMAX, &p);
  param_set_int(&p, 0, 2);
  CHECK_EQ_INT(run_op(OP_SOFTMAX, &p, &x, 1, false, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "softmax: axis=2: input 0 has shape [2, 3] (rank 2)"), "%s",
            diag_last(&d));
  /* A Z_p tensor in float mode is refused. */
  Tensor *m = f32_to_modp(x);
  CHECK_EQ_INT(run_op(OP_REDUCE_SUM, NULL, &m, 1, false, &y, &d), TEQ_ERR_INPUT);
  CHECK(y == NULL);
  tensor_unref(m);
  tensor_unref(x);
  diag_fini(&d);
}

static void test_flags(void) {
  CHECK(op_def(OP_REDUCE_SUM)->flags & OPF_MULTILINEAR);
  CHECK(op_def(OP_REDUCE_MEAN)->flags & OPF_MULTILINEAR);
  CHECK(!(op_def(OP_REDUCE_MAX)->flags & (OPF_MULTILINEAR | OPF_NONLINEAR)));
  CHECK(!(op_def(OP_SOFTMAX)->flags & OPF_MULTILINEAR));
  OpKind fixed[] = {OP_REDUCE_MIN, OP_REDUCE_PROD, OP_REDUCE_SUM_SQUARE};
  for (int k = 0; k < 3; k++) CHECK(!(op_def(fixed[k])->flags & (OPF_MULTILINEAR | OPF_NONLINEAR)));
  OpKind mapped[] = {OP_REDUCE_L1, OP_REDUCE_L2, OP_REDUCE_LOG_SUM, OP_REDUCE_LOG_SUM_EXP,
                     OP_LOG_SOFTMAX};
  for (int k = 0; k < 5; k++) CHECK(op_def(mapped[k])->flags & OPF_NONLINEAR);
  CHECK_EQ_INT(op_by_onnx("ReduceLogSumExp"), OP_REDUCE_LOG_SUM_EXP);
  CHECK_EQ_INT(op_by_onnx("ReduceSumSquare"), OP_REDUCE_SUM_SQUARE);
  CHECK_EQ_INT(op_by_onnx("LogSoftmax"), OP_LOG_SOFTMAX);
  CHECK_EQ_INT(op_by_onnx("ReduceSum"), OP_REDUCE_SUM);
  CHECK_EQ_INT(op_by_onnx("Softmax"), OP_SOFTMAX);
  Params p;
  params_default(OP_REDUCE_MEAN, &p);
  CHECK_EQ_INT(param_int(&p, param_index(OP_REDUCE_MEAN, "keepdims")), 1);
  CHECK_EQ_INT(p.v[param_index(OP_REDUCE_MEAN, "axes")].n, 0);
}

/* ---- argmax and argmin ---- */

static Params arg_params(OpKind k, int64_t axis, int keepdims, int last) {
  Params p;
  params_default(k, &p);
  param_set_int(&p, param_index(k, "axis"), axis);
  param_set_int(&p, param_index(k, "keepdims"), keepdims);
  param_set_int(&p, param_index(k, "select_last_index"), last);
  return p;
}

static int64_t elem_i64(const Tensor *t, int64_t i) { return ((const int64_t *)t->data)[i]; }

/* Runs kind on x (float32 or Z_p) and checks the int64 result against want. */
static void check_arg(OpKind kind, const Tensor *x, int64_t axis, int keep, int last,
                      const int64_t *want, int n) {
  Diag d;
  diag_init(&d);
  Params p = arg_params(kind, axis, keep, last);
  Op o;
  op_init(&o, kind, 1);
  o.node.params = p;
  Tensor *y = NULL, *in = (Tensor *)x;
  CHECK_EQ_INT(op_infer(&o, &in, &d), TEQ_OK);
  CHECK_EQ_INT(op_eval(&o, &in, x->dtype == DT_MODP, DT_I64, &y, &d), TEQ_OK);
  CHECK(y && tensor_numel(y) == n);
  for (int i = 0; y && i < n; i++)
    CHECK_MSG(elem_i64(y, i) == want[i], "%s axis %lld last %d: [%d] = %lld, expected %lld",
              op_def(kind)->name, (long long)axis, last, i, (long long)elem_i64(y, i),
              (long long)want[i]);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_arg_hand(void) {
  float v[] = {1, 3, 3, 0, 2, 0}; /* [[1 3 3] [0 2 0]]: ties along both axes */
  Tensor *x = f32_tensor(shape_of(2, 2, 3), v), *m = f32_to_modp(x);
  for (int z = 0; z < 2; z++) {
    const Tensor *t = z ? m : x;
    check_arg(OP_ARGMAX, t, 1, 1, 0, (int64_t[]){1, 1}, 2);
    check_arg(OP_ARGMAX, t, 1, 0, 1, (int64_t[]){2, 1}, 2);
    check_arg(OP_ARGMIN, t, 1, 1, 0, (int64_t[]){0, 0}, 2);
    check_arg(OP_ARGMIN, t, 1, 0, 1, (int64_t[]){0, 2}, 2);
    check_arg(OP_ARGMAX, t, 0, 1, 0, (int64_t[]){0, 0, 0}, 3);
    check_arg(OP_ARGMIN, t, 0, 0, 0, (int64_t[]){1, 1, 1}, 3);
  }
  /* A tie down axis 0: [[2 1] [2 5]]. */
  float w[] = {2, 1, 2, 5};
  Tensor *xw = f32_tensor(shape_of(2, 2, 2), w);
  check_arg(OP_ARGMAX, xw, 0, 1, 0, (int64_t[]){0, 1}, 2);
  check_arg(OP_ARGMAX, xw, 0, 1, 1, (int64_t[]){1, 1}, 2);
  check_arg(OP_ARGMIN, xw, 0, 1, 0, (int64_t[]){0, 0}, 2);
  check_arg(OP_ARGMIN, xw, 0, 1, 1, (int64_t[]){1, 0}, 2);
  /* NaN beats every number, as in numpy: the first (last) NaN. */
  float nv[] = {1, NAN, 5, NAN, -INFINITY};
  Tensor *xn = f32_tensor(shape_of(1, 5), nv);
  check_arg(OP_ARGMAX, xn, 0, 1, 0, (int64_t[]){1}, 1);
  check_arg(OP_ARGMAX, xn, 0, 1, 1, (int64_t[]){3}, 1);
  check_arg(OP_ARGMIN, xn, 0, 0, 0, (int64_t[]){1}, 1);
  float iv[] = {-INFINITY, 2, INFINITY, -INFINITY};
  Tensor *xi = f32_tensor(shape_of(1, 4), iv);
  check_arg(OP_ARGMAX, xi, 0, 1, 0, (int64_t[]){2}, 1);
  check_arg(OP_ARGMIN, xi, 0, 1, 1, (int64_t[]){3}, 1);
  /* Shapes: keepdims keeps a 1, 0 drops the axis. */
  Shape in = shape_of(3, 2, 3, 4), out;
  Params p = arg_params(OP_ARGMAX, 1, 1, 0);
  Diag d;
  diag_init(&d);
  CHECK_EQ_INT(infer_op(OP_ARGMAX, &p, &in, 1, 1, &out, &d), TEQ_OK);
  CHECK(out.ndim == 3 && out.d[0] == 2 && out.d[1] == 1 && out.d[2] == 4);
  p = arg_params(OP_ARGMIN, 2, 0, 0);
  CHECK_EQ_INT(infer_op(OP_ARGMIN, &p, &in, 1, 1, &out, &d), TEQ_OK);
  CHECK(out.ndim == 2 && out.d[0] == 2 && out.d[1] == 3);
  diag_fini(&d);
  tensor_unref(x);
  tensor_unref(m);
  tensor_unref(xw);
  tensor_unref(xn);
  tensor_unref(xi);
}

/* Every axis, keepdims and select_last_index of both rows against a
 * reference loop, on small integers (many ties); Z_p on the same
 * non-negative integers gives the same indices. */
static void test_arg_reference(void) {
  Shape s = shape_of(3, 3, 4, 5);
  Tensor *x = random_ints(s, 3, 41);
  for (int64_t i = 0; i < tensor_numel(x); i++) ((float *)x->data)[i] = fabsf(elem_f32(x, i));
  Tensor *m = f32_to_modp(x);
  int64_t want[64];
  for (int kind = 0; kind < 2; kind++)
    for (int axis = 0; axis < 3; axis++)
      for (int last = 0; last < 2; last++) {
        int64_t outer = 1, inner = 1, len = s.d[axis];
        for (int i = 0; i < axis; i++) outer *= s.d[i];
        for (int i = axis + 1; i < 3; i++) inner *= s.d[i];
        for (int64_t o = 0; o < outer; o++)
          for (int64_t i = 0; i < inner; i++) {
            int64_t best = 0;
            for (int64_t k = 1; k < len; k++) {
              float v = elem_f32(x, (o * len + k) * inner + i);
              float b = elem_f32(x, (o * len + best) * inner + i);
              bool better = kind == 0 ? v > b : v < b;
              if (better || (last && v == b)) best = k;
            }
            want[o * inner + i] = best;
          }
        OpKind k = kind == 0 ? OP_ARGMAX : OP_ARGMIN;
        check_arg(k, x, axis, last, last, want, (int)(outer * inner));
        check_arg(k, m, axis, !last, last, want, (int)(outer * inner));
      }
  tensor_unref(x);
  tensor_unref(m);
}

/* graph_add_node types the output int64 (the float input is no int64
 * arithmetic), exec_run returns int64 in both modes, and the node survives
 * an ONNX export and import with its parameters. */
static void test_arg_graph(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape s = shape_of(2, 3, 4);
  int x = graph_add_input(g, "x", &s, DT_F32, &d);
  Params p = arg_params(OP_ARGMAX, 1, 0, 0);
  int id = graph_add_node(g, OP_ARGMAX, &(TensorRef){x, 0}, 1, 1, &p, "am", &d);
  CHECK(id >= 0);
  CHECK(id >= 0 && g->nodes[id].dtype == DT_I64);
  CHECK(id >= 0 && graph_add_output(g, (TensorRef){id, 0}, "y", &d) >= 0);
  /* Its int64 output cannot feed arithmetic. */
  CHECK_EQ_INT(graph_add_node(g, OP_RELU, &(TensorRef){id, 0}, 1, 1, NULL, "r", &d),
               TEQ_ERR_UNSUPPORTED);
  Tensor *in = iota_from(s, 0), *y = NULL;
  CHECK_EQ_INT(exec_run(g, EXEC_F32, &in, &y, &d), TEQ_OK);
  CHECK(y && y->dtype == DT_I64 && y->shape.ndim == 1 && y->shape.d[0] == 3);
  for (int i = 0; y && i < 3; i++) CHECK(elem_i64(y, i) == 3);
  tensor_unref(y);
  y = NULL;
  Tensor *m = f32_to_modp(in);
  CHECK_EQ_INT(exec_run(g, EXEC_MODP, &m, &y, &d), TEQ_OK);
  CHECK(y && y->dtype == DT_I64 && elem_i64(y, 0) == 3);
  tensor_unref(y);
  tensor_unref(m);
  tensor_unref(in);
  graph_free(g);
  Tensor *r = random_ints(shape_of(3, 2, 3, 4), 2, 9); /* ties */
  for (int kind = 0; kind < 2; kind++)
    for (int axis = 0; axis < 3; axis++) {
      OpKind k = kind ? OP_ARGMIN : OP_ARGMAX;
      p = arg_params(k, axis, axis % 2, (axis + kind) % 2);
      CHECK_EQ_INT(check_node_round_trip(k, &p, &r, 1, true, &d), TEQ_OK);
    }
  CHECK_EQ_INT(check_node_round_trip(OP_ARGMIN, NULL, &r, 1, true, &d), TEQ_OK);
  tensor_unref(r);
  diag_fini(&d);
}

static void test_arg_errors(void) {
  Diag d;
  diag_init(&d);
  Shape in = shape_of(2, 2, 3), out;
  Params p = arg_params(OP_ARGMAX, 2, 1, 0);
  CHECK_EQ_INT(infer_op(OP_ARGMAX, &p, &in, 1, 1, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "argmax: axis=2: input 0 has shape [2, 3] (rank 2)"), "%s",
            diag_last(&d));
  Shape empty = shape_of(2, 0, 3);
  p = arg_params(OP_ARGMIN, 0, 1, 0);
  CHECK_EQ_INT(infer_op(OP_ARGMIN, &p, &empty, 1, 1, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "no element to select"), "%s", diag_last(&d));
  p = arg_params(OP_ARGMIN, 1, 0, 0); /* the empty axis is kept: fine */
  CHECK_EQ_INT(infer_op(OP_ARGMIN, &p, &empty, 1, 1, &out, &d), TEQ_OK);
  CHECK(out.ndim == 1 && out.d[0] == 0);
  diag_fini(&d);
  CHECK_EQ_INT(op_def(OP_ARGMAX)->flags, OPF_INT64_OUT);
  CHECK_EQ_INT(op_def(OP_ARGMIN)->flags, OPF_INT64_OUT);
  CHECK_EQ_INT(op_by_onnx("ArgMax"), OP_ARGMAX);
  CHECK_EQ_INT(op_by_onnx("ArgMin"), OP_ARGMIN);
}

int main(void) {
  test_hand();
  test_hand_softmax();
  test_reduce_reference();
  test_reduce_precision();
  test_log_sum_exp_extremes();
  test_modp_reduce();
  test_modp_max_hand();
  test_modp_new_reductions();
  check_softmax_axes(OP_SOFTMAX, 3);
  test_softmax_modp();
  check_softmax_axes(OP_LOG_SOFTMAX, 5);
  test_log_softmax();
  test_onnx_round_trip();
  test_errors();
  test_flags();
  test_arg_hand();
  test_arg_reference();
  test_arg_graph();
  test_arg_errors();
  return check_exit();
}
