/* test_elementwise.c: the element-wise rows (runtime/ops/elementwise.c),
 * called directly through the registry: hand-computed cases, every
 * broadcasting pattern against an index-by-index reference, every unary
 * float kernel against libm in double, the variadic sum and mean against a
 * reference, the Z_p kernels of the linear operators against the float
 * kernels on small integers, the fixed Z_p maps of div, pow, max and min,
 * the stand-ins (all different, parameters included), an ONNX export and
 * import round trip, and the messages of shape inference. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/modp.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/tensor_check.h"

/* ---- hand-computed cases ---- */

static void test_hand(void) {
  Diag d;
  diag_init(&d);
  Shape s23 = shape_of(2, 2, 3), s3 = shape_of(1, 3);
  float av[] = {1, 2, 3, 4, 5, 6}, bv[] = {10, 20, 30};
  Tensor *in[2] = {f32_tensor(s23, av), f32_tensor(s3, bv)}, *y = NULL;
  CHECK_EQ_INT(run_op(OP_EWADD, NULL, in, 2, false, &y, &d), TEQ_OK);
  float add[] = {11, 22, 33, 14, 25, 36};
  for (int i = 0; i < 6; i++) CHECK_NEAR(elem_f32(y, i), add[i], 0);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_SUB, NULL, (Tensor *[]){in[1], in[0]}, 2, false, &y, &d), TEQ_OK);
  float sub[] = {9, 18, 27, 6, 15, 24};
  for (int i = 0; i < 6; i++) CHECK_NEAR(elem_f32(y, i), sub[i], 0);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_DIV, NULL, in, 2, false, &y, &d), TEQ_OK);
  CHECK_NEAR(elem_f32(y, 5), 0.2, 1e-7);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_POW, NULL, (Tensor *[]){in[0], in[0]}, 2, false, &y, &d), TEQ_OK);
  CHECK_NEAR(elem_f32(y, 2), 27, 1e-6);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_MAX, NULL, in, 2, false, &y, &d), TEQ_OK);
  CHECK_NEAR(elem_f32(y, 3), 10, 0);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_MIN, NULL, in, 2, false, &y, &d), TEQ_OK);
  CHECK_NEAR(elem_f32(y, 3), 4, 0);
  tensor_unref(y);
  /* smul by a one-element tensor of rank 1. */
  Shape s1 = shape_of(1, 1);
  float two[] = {2};
  Tensor *sc = f32_tensor(s1, two);
  CHECK_EQ_INT(run_op(OP_SMUL, NULL, (Tensor *[]){in[0], sc}, 2, false, &y, &d), TEQ_OK);
  CHECK(shape_equal(&y->shape, &s23));
  CHECK_NEAR(elem_f32(y, 5), 12, 0);
  tensor_unref(y);
  tensor_unref(sc);
  tensor_unref(in[0]);
  tensor_unref(in[1]);
  diag_fini(&d);
}

/* ---- broadcasting against an index-by-index reference ---- */

static float ref_add(float x, float y) { return x + y; }
static float ref_mul(float x, float y) { return x * y; }
static float ref_sub(float x, float y) { return x - y; }
static float ref_div(float x, float y) { return x / y; }
static float ref_pow(float x, float y) { return (float)pow(x, y); }
static float ref_max(float x, float y) { return x > y ? x : y; }
static float ref_min(float x, float y) { return x < y ? x : y; }

/* Each binary row with its reference, a table rather than a switch over
 * kinds (tests/scripts/test_includes.sh forbids those outside the registry). */
static const struct {
  OpKind kind;
  float (*ref)(float x, float y);
} binary_cases[] = {
  {OP_EWADD, ref_add}, {OP_EWMUL, ref_mul}, {OP_SUB, ref_sub}, {OP_DIV, ref_div},
  {OP_POW, ref_pow},   {OP_MAX, ref_max},   {OP_MIN, ref_min},
};

static void check_broadcast(Shape sa, Shape sb, Shape want, uint64_t seed) {
  Diag d;
  diag_init(&d);
  Tensor *a = random_f32(sa, seed), *b = random_f32(sb, seed + 1);
  /* pow gets a positive base, div a divisor away from 0. */
  for (int64_t i = 0; i < tensor_numel(a); i++)
    ((float *)a->data)[i] = fabsf(elem_f32(a, i)) + 0.5f;
  for (int64_t i = 0; i < tensor_numel(b); i++)
    ((float *)b->data)[i] += elem_f32(b, i) < 0 ? -0.5f : 0.5f;
  for (size_t k = 0; k < sizeof binary_cases / sizeof *binary_cases; k++) {
    Tensor *y = NULL;
    int rc = run_op(binary_cases[k].kind, NULL, (Tensor *[]){a, b}, 2, false, &y, &d);
    CHECK_MSG(rc == TEQ_OK, "%s", diag_last(&d));
    if (rc) continue;
    CHECK(shape_equal(&y->shape, &want));
    int64_t c[TEQ_MAX_DIMS] = {0}, bad = 0;
    for (int64_t i = 0; i < tensor_numel(y); i++) {
      float r = binary_cases[k].ref(elem_f32(a, broadcast_index(&sa, c, want.ndim)),
                                    elem_f32(b, broadcast_index(&sb, c, want.ndim)));
      if (!close_to(elem_f32(y, i), r, 1e-6)) bad++;
      for (int j = want.ndim - 1; j >= 0 && ++c[j] == want.d[j]; j--) c[j] = 0;
    }
    CHECK_MSG(bad == 0, "%s: %lld wrong elements", op_def(binary_cases[k].kind)->name,
              (long long)bad);
    tensor_unref(y);
  }
  tensor_unref(a);
  tensor_unref(b);
  diag_fini(&d);
}

static void test_broadcast(void) {
  Shape nchw = shape_of(4, 2, 3, 4, 5);
  check_broadcast(nchw, nchw, nchw, 1);                                   /* same shape */
  check_broadcast(nchw, shape_of(0), nchw, 2);                            /* scalar */
  check_broadcast(shape_of(0), nchw, nchw, 3);                            /* scalar first */
  check_broadcast(nchw, shape_of(3, 3, 1, 1), nchw, 4);                   /* bias [C,1,1] */
  check_broadcast(shape_of(3, 3, 1, 1), nchw, nchw, 5);
  check_broadcast(nchw, shape_of(1, 5), nchw, 6);                         /* row vector */
  check_broadcast(nchw, shape_of(4, 1, 3, 1, 1), nchw, 7);                /* rank-4 bias */
  check_broadcast(shape_of(4, 2, 1, 4, 1), shape_of(3, 3, 1, 5), nchw, 8); /* both sides */
  check_broadcast(shape_of(2, 4, 1), shape_of(2, 1, 6), shape_of(2, 4, 6), 9);
  check_broadcast(shape_of(1, 1), shape_of(1, 7), shape_of(1, 7), 10);
  check_broadcast(shape_of(2, 0, 3), shape_of(1, 3), shape_of(2, 0, 3), 11); /* empty */
  check_broadcast(shape_of(0), shape_of(0), shape_of(0), 12);
  check_broadcast(shape_of(6, 2, 1, 2, 1, 2, 1), shape_of(6, 1, 2, 1, 2, 1, 2),
                  shape_of(6, 2, 2, 2, 2, 2, 2), 13);
}

/* ---- prelu: a slope broadcast to x's shape, never beyond ---- */

static void check_prelu(Shape sx, Shape ss, uint64_t seed) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(sx, seed), *slope = random_f32(ss, seed + 1), *y = NULL;
  int rc = run_op(OP_PRELU, NULL, (Tensor *[]){x, slope}, 2, false, &y, &d);
  CHECK_MSG(rc == TEQ_OK, "%s", diag_last(&d));
  if (rc == TEQ_OK) {
    CHECK(shape_equal(&y->shape, &sx));
    int64_t c[TEQ_MAX_DIMS] = {0}, bad = 0, negative = 0;
    for (int64_t i = 0; i < tensor_numel(y); i++) {
      float v = elem_f32(x, i), a = elem_f32(slope, broadcast_index(&ss, c, sx.ndim));
      float want = v >= 0 ? v : a * v; /* one product: exact */
      if (elem_f32(y, i) != want) bad++;
      negative += v < 0;
      for (int j = sx.ndim - 1; j >= 0 && ++c[j] == sx.d[j]; j--) c[j] = 0;
    }
    CHECK_MSG(bad == 0 && negative > 0, "prelu: %lld wrong of %lld (%lld negative)",
              (long long)bad, (long long)tensor_numel(y), (long long)negative);
  }
  tensor_unref(x), tensor_unref(slope), tensor_unref(y);
  diag_fini(&d);
}

static void test_prelu(void) {
  check_prelu(shape_of(4, 2, 3, 4, 5), shape_of(3, 3, 1, 1), 40); /* per channel, as exported */
  check_prelu(shape_of(4, 2, 3, 4, 5), shape_of(1, 5), 41);       /* ONNX's broadcast example */
  check_prelu(shape_of(4, 2, 3, 4, 5), shape_of(0), 42);          /* one slope */
  check_prelu(shape_of(2, 7, 9), shape_of(2, 7, 9), 43);          /* a slope per element */
  /* A NaN stays NaN whatever its slope (a slope that would widen x:
   * test_errors). */
  Diag d;
  diag_init(&d);
  Shape one = shape_of(1, 1);
  Tensor *x = tensor_new(DT_F32, &one), *a = tensor_new(DT_F32, &one), *y = NULL;
  *(float *)x->data = NAN, *(float *)a->data = 0.0f;
  CHECK_EQ_INT(run_op(OP_PRELU, NULL, (Tensor *[]){x, a}, 2, false, &y, &d), TEQ_OK);
  CHECK(y && isnan(elem_f32(y, 0)));
  tensor_unref(x), tensor_unref(a), tensor_unref(y);
  diag_fini(&d);
}

/* ---- unary float kernels against libm in double ---- */

static double ref_relu(double x) { return x > 0 ? x : 0; }
static double ref_sigmoid(double x) { return 1 / (1 + exp(-x)); }
static double ref_neg(double x) { return -x; }
static double ref_reciprocal(double x) { return 1 / x; }
static double ref_leaky_relu(double x) { return x >= 0 ? x : 0.1 * x; }
static double ref_elu(double x) { return x >= 0 ? x : 0.7 * (exp(x) - 1); }
static double ref_clip(double x) { return x < -0.3 ? -0.3 : x > 0.6 ? 0.6 : x; }
static double ref_softplus(double x) { return log1p(exp(x)); }
static double ref_hard_sigmoid(double x) { return fmax(0, fmin(1, 0.2 * x + 0.5)); }
static double ref_selu(double x) { return x > 0 ? 3 * x : 3 * (2 * exp(x) - 2); }
static double ref_thresholded_relu(double x) { return x > 0.3 ? x : 0; }
static double ref_hard_swish(double x) { return x * fmax(0, fmin(1, x / 6 + 0.5)); }
/* ONNX's own formula, with alpha 2 and -1.5. */
static double ref_celu(double x) { return fmax(0, x) + fmin(0, 2 * (exp(x / 2) - 1)); }
static double ref_celu_neg(double x) { return fmax(0, x) + fmin(0, -1.5 * (exp(x / -1.5) - 1)); }
static double ref_mish(double x) { return x * tanh(log1p(exp(x))); }
static double ref_gelu(double x) { return 0.5 * x * (1 + erf(x / sqrt(2))); }
static double ref_silu(double x) { return x / (1 + exp(-x)); }

enum { ANY, POSITIVE, NONZERO }; /* the domain test inputs are drawn from */

/* Each unary row with its reference in double, its domain and the float
 * parameters it is tested with (NAN: the row's default). */
static const struct UnaryCase {
  OpKind kind;
  double (*ref)(double x);
  int domain;
  double p0, p1;
} unary_cases[] = {
  {OP_RELU, ref_relu, ANY, NAN, NAN},
  {OP_SIGMOID, ref_sigmoid, ANY, NAN, NAN},
  {OP_TANH, tanh, ANY, NAN, NAN},
  {OP_EXP, exp, ANY, NAN, NAN},
  {OP_LOG, log, POSITIVE, NAN, NAN},
  {OP_SQRT, sqrt, POSITIVE, NAN, NAN},
  {OP_NEG, ref_neg, ANY, NAN, NAN},
  {OP_ABS, fabs, ANY, NAN, NAN},
  {OP_RECIPROCAL, ref_reciprocal, NONZERO, NAN, NAN},
  {OP_ERF, erf, ANY, NAN, NAN},
  {OP_LEAKY_RELU, ref_leaky_relu, ANY, 0.1, NAN},
  {OP_ELU, ref_elu, ANY, 0.7, NAN},
  {OP_CLIP, ref_clip, ANY, -0.3, 0.6},
  {OP_SOFTPLUS, ref_softplus, ANY, NAN, NAN},
  {OP_HARD_SIGMOID, ref_hard_sigmoid, ANY, NAN, NAN},
  {OP_SELU, ref_selu, ANY, 2, 3},
  {OP_THRESHOLDED_RELU, ref_thresholded_relu, ANY, 0.3, NAN},
  {OP_HARD_SWISH, ref_hard_swish, ANY, NAN, NAN},
  {OP_CELU, ref_celu, ANY, 2, NAN},
  {OP_CELU, ref_celu_neg, ANY, -1.5, NAN},
  {OP_MISH, ref_mish, ANY, NAN, NAN},
  {OP_GELU, ref_gelu, ANY, NAN, NAN},
  {OP_SILU, ref_silu, ANY, NAN, NAN},
};
#define N_UNARY (sizeof unary_cases / sizeof *unary_cases)

static void unary_params(const struct UnaryCase *c, Params *p) {
  params_default(c->kind, p);
  if (!isnan(c->p0)) param_set_float(p, 0, c->p0);
  if (!isnan(c->p1)) param_set_float(p, 1, c->p1);
}

/* clip with the tested bounds [-0.3, 0.6]. */
static void clip_params(Params *p) {
  for (size_t u = 0; u < N_UNARY; u++)
    if (unary_cases[u].kind == OP_CLIP) unary_params(&unary_cases[u], p);
}

static void test_unary_f32(void) {
  Diag d;
  diag_init(&d);
  for (size_t u = 0; u < N_UNARY; u++) {
    const struct UnaryCase *c = &unary_cases[u];
    OpKind k = c->kind;
    Tensor *x = random_f32(shape_of(3, 3, 7, 11), 100 + u), *y = NULL;
    float *xv = x->data;
    /* Keep log, sqrt and reciprocal inside their domains; stretch the rest. */
    for (int64_t i = 0; i < tensor_numel(x); i++) {
      if (c->domain == POSITIVE) xv[i] = fabsf(xv[i]) + 0.01f;
      else if (c->domain == NONZERO) xv[i] += xv[i] < 0 ? -0.1f : 0.1f;
      else xv[i] *= 4;
    }
    Params p;
    unary_params(c, &p);
    CHECK_EQ_INT(run_op(k, &p, &x, 1, false, &y, &d), TEQ_OK);
    int64_t bad = 0;
    for (int64_t i = 0; y && i < tensor_numel(y); i++)
      if (!close_to(elem_f32(y, i), (float)c->ref(xv[i]), 2e-6)) bad++;
    CHECK_MSG(y && bad == 0, "%s: %lld wrong elements", op_def(k)->name, (long long)bad);
    tensor_unref(x);
    tensor_unref(y);
  }
  diag_fini(&d);
}

/* gelu's tanh approximation (ONNX's approximate="tanh"), which must differ
 * from the exact one, as the two definitions do (by up to about 5e-4). */
static void test_gelu_tanh(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = random_f32(shape_of(1, 4096), 7), *y = NULL, *exact = NULL;
  float *xv = x->data;
  for (int64_t i = 0; i < 4096; i++) xv[i] *= 5;
  Params p;
  params_default(OP_GELU, &p);
  param_set_int(&p, 0, 1);
  CHECK_EQ_INT(run_op(OP_GELU, &p, &x, 1, false, &y, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_GELU, NULL, &x, 1, false, &exact, &d), TEQ_OK);
  int64_t bad = 0;
  double most = 0;
  for (int64_t i = 0; y && exact && i < 4096; i++) {
    double v = xv[i], r = 0.5 * v * (1 + tanh(sqrt(2 / M_PI) * (v + 0.044715 * v * v * v)));
    if (!close_to(elem_f32(y, i), (float)r, 2e-6)) bad++;
    most = fmax(most, fabs(elem_f32(y, i) - elem_f32(exact, i)));
  }
  CHECK_MSG(y && bad == 0, "gelu tanh: %lld wrong elements", (long long)bad);
  CHECK_MSG(most > 1e-4, "gelu tanh: within %g of the exact gelu everywhere", most);
  tensor_unref(x);
  tensor_unref(y);
  tensor_unref(exact);
  diag_fini(&d);
}

/* Sigmoid's own e^x against libm's in double, densely over every float
 * range it treats differently: within 2 ulp of 1 / (1 + e^-x) where that
 * is a normal float, 0 and 1 past the ends, NaN for NaN. The random
 * arguments of test_unary_f32 stay within [-4, 4]. */
static void test_sigmoid_sweep(void) {
  enum { N = 1 << 18 };
  Diag d;
  diag_init(&d);
  Tensor *x = tensor_new(DT_F32, &(Shape){.ndim = 1, .d = {N}}), *y = NULL;
  float *xv = x->data;
  for (int i = 0; i < N - 4; i++) xv[i] = -100.0f + 200.0f * (float)i / (N - 5);
  xv[N - 4] = NAN, xv[N - 3] = INFINITY, xv[N - 2] = -INFINITY, xv[N - 1] = -0.0f;
  CHECK_EQ_INT(run_op(OP_SIGMOID, NULL, &x, 1, false, &y, &d), TEQ_OK);
  int64_t bad = 0;
  float worst_x = 0;
  for (int i = 0; y && i < N - 4; i++) {
    double want = 1 / (1 + exp(-(double)xv[i])), got = elem_f32(y, i);
    bool ok = want >= FLT_MIN ? fabs(got - want) <= 2 * 1.19e-7 * want : got >= 0 && got < 1e-37;
    if (!ok && !bad++) worst_x = xv[i];
  }
  CHECK_MSG(y && bad == 0, "sigmoid: %lld elements off, the first at x = %g", (long long)bad,
            worst_x);
  CHECK(y && isnan(elem_f32(y, N - 4)) && elem_f32(y, N - 3) == 1.0f &&
        elem_f32(y, N - 2) == 0.0f && elem_f32(y, N - 1) == 0.5f);
  tensor_unref(x);
  tensor_unref(y);
  diag_fini(&d);
}

/* Large arguments: no overflow to inf or NaN where the function is tame. */
static void test_unary_extremes(void) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(1, 4);
  float xv[] = {-100, -20, 20, 100};
  Tensor *x = f32_tensor(s, xv), *y = NULL;
  CHECK_EQ_INT(run_op(OP_SOFTPLUS, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK_NEAR(elem_f32(y, 0), 0, 1e-30);
  CHECK_NEAR(elem_f32(y, 3), 100, 1e-7);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_SIGMOID, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(elem_f32(y, 0) >= 0 && elem_f32(y, 0) < 1e-30 && elem_f32(y, 3) == 1.0f);
  tensor_unref(y);
  /* clip with its default (absent) bounds changes nothing. */
  CHECK_EQ_INT(run_op(OP_CLIP, NULL, &x, 1, false, &y, &d), TEQ_OK);
  for (int i = 0; i < 4; i++) CHECK_NEAR(elem_f32(y, i), xv[i], 0);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_HARD_SIGMOID, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(elem_f32(y, 0) == 0 && elem_f32(y, 3) == 1);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_MISH, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(fabsf(elem_f32(y, 0)) < 1e-30 && elem_f32(y, 3) == 100);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_HARD_SWISH, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK(elem_f32(y, 0) == 0 && elem_f32(y, 3) == 100);
  tensor_unref(y);
  /* selu's defaults are ONNX's float32 constants: -> -alpha gamma at -inf. */
  CHECK_EQ_INT(run_op(OP_SELU, NULL, &x, 1, false, &y, &d), TEQ_OK);
  CHECK_NEAR(elem_f32(y, 0), -1.6732632423543772 * 1.0507009873554805, 1e-6);
  CHECK_NEAR(elem_f32(y, 3), 105.07009873554805, 1e-6);
  tensor_unref(y);
  /* thresholded_relu keeps only values above alpha (1 by default). */
  Tensor *t = f32_tensor(s, (float[]){1, 1.5f, -2, 0.5f});
  CHECK_EQ_INT(run_op(OP_THRESHOLDED_RELU, NULL, &t, 1, false, &y, &d), TEQ_OK);
  CHECK(elem_f32(y, 0) == 0 && elem_f32(y, 1) == 1.5f && elem_f32(y, 2) == 0 &&
        elem_f32(y, 3) == 0);
  tensor_unref(y);
  tensor_unref(t);
  tensor_unref(x);
  /* NaN propagates through max, min and clip; relu(-0) is +0. */
  float nv[] = {NAN, 1, -0.0f, 2};
  Tensor *a = f32_tensor(s, nv), *b = f32_tensor(s, (float[]){1, NAN, 3, -1});
  CHECK_EQ_INT(run_op(OP_MAX, NULL, (Tensor *[]){a, b}, 2, false, &y, &d), TEQ_OK);
  CHECK(isnan(elem_f32(y, 0)) && isnan(elem_f32(y, 1)) && elem_f32(y, 2) == 3 &&
        elem_f32(y, 3) == 2);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_MIN, NULL, (Tensor *[]){a, b}, 2, false, &y, &d), TEQ_OK);
  CHECK(isnan(elem_f32(y, 0)) && isnan(elem_f32(y, 1)) && elem_f32(y, 2) == 0 &&
        elem_f32(y, 3) == -1);
  tensor_unref(y);
  Params p;
  clip_params(&p);
  CHECK_EQ_INT(run_op(OP_CLIP, &p, &a, 1, false, &y, &d), TEQ_OK);
  CHECK(isnan(elem_f32(y, 0)) && elem_f32(y, 1) == 0.6f && elem_f32(y, 2) == 0 &&
        elem_f32(y, 3) == 0.6f);
  tensor_unref(y);
  CHECK_EQ_INT(run_op(OP_RELU, NULL, &a, 1, false, &y, &d), TEQ_OK);
  CHECK(isnan(elem_f32(y, 0)) && elem_f32(y, 1) == 1 && elem_f32(y, 2) == 0 &&
        !signbit(elem_f32(y, 2)));
  tensor_unref(y);
  tensor_unref(a);
  tensor_unref(b);
  diag_fini(&d);
}

/* ---- sum and mean ---- */

/* Sum and mean of three inputs of different shapes against a reference
 * with numpy broadcasting; with one input both are the identity. */
static void test_variadic(void) {
  Diag d;
  diag_init(&d);
  Shape sa = shape_of(3, 2, 1, 4), sb = shape_of(2, 3, 1), sc = shape_of(0), want = shape_of(3, 2, 3, 4);
  Tensor *in[3] = {random_f32(sa, 31), random_f32(sb, 32), random_f32(sc, 33)}, *y = NULL;
  for (int mean = 0; mean < 2; mean++) {
    OpKind k = mean ? OP_MEAN : OP_SUM;
    CHECK_EQ_INT(run_op(k, NULL, in, 3, false, &y, &d), TEQ_OK);
    CHECK(y && shape_equal(&y->shape, &want));
    int64_t c[TEQ_MAX_DIMS] = {0}, bad = 0;
    for (int64_t i = 0; y && i < tensor_numel(y); i++) {
      double r = (double)elem_f32(in[0], broadcast_index(&sa, c, 3)) +
                 elem_f32(in[1], broadcast_index(&sb, c, 3)) + elem_f32(in[2], 0);
      bad += !close_to(elem_f32(y, i), (float)(mean ? r / 3 : r), 1e-6);
      for (int j = 2; j >= 0 && ++c[j] == want.d[j]; j--) c[j] = 0;
    }
    CHECK_MSG(bad == 0, "%s: %lld wrong elements", op_def(k)->name, (long long)bad);
    tensor_unref(y);
    y = NULL;
    CHECK_EQ_INT(run_op(k, NULL, in, 1, false, &y, &d), TEQ_OK);
    for (int64_t i = 0; y && i < tensor_numel(y); i++) CHECK(elem_f32(y, i) == elem_f32(in[0], i));
    tensor_unref(y);
    y = NULL;
  }
  /* Z_p: the sum is exact, the mean is the sum times inv(count). */
  Tensor *f[3] = {random_ints(sa, 50, 34), random_ints(sb, 50, 35), random_ints(sc, 50, 36)};
  Tensor *m[3] = {f32_to_modp(f[0]), f32_to_modp(f[1]), f32_to_modp(f[2])}, *ys = NULL, *ym = NULL,
         *yf = NULL;
  CHECK_EQ_INT(run_op(OP_SUM, NULL, f, 3, false, &yf, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_SUM, NULL, m, 3, true, &ys, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_MEAN, NULL, m, 3, true, &ym, &d), TEQ_OK);
  for (int64_t i = 0; yf && ys && ym && i < tensor_numel(yf); i++) {
    uint32_t sum = ((uint32_t *)ys->data)[i];
    CHECK_EQ_INT(modp_to_int(sum), (int64_t)elem_f32(yf, i));
    CHECK_EQ_INT(modp_mul(((uint32_t *)ym->data)[i], 3), sum);
  }
  for (int i = 0; i < 3; i++) tensor_unref(in[i]), tensor_unref(f[i]), tensor_unref(m[i]);
  tensor_unref(yf), tensor_unref(ys), tensor_unref(ym);
  diag_fini(&d);
}

/* ---- Z_p kernels ---- */

/* Linear operators are exact: Z_p on small integers equals float32. */
static void check_modp_matches(OpKind k, Tensor *const *f, int n_in) {
  Diag d;
  diag_init(&d);
  Tensor *m[2] = {NULL, NULL}, *yf = NULL, *ym = NULL;
  for (int i = 0; i < n_in; i++) m[i] = f32_to_modp(f[i]);
  CHECK_EQ_INT(run_op(k, NULL, f, n_in, false, &yf, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(k, NULL, m, n_in, true, &ym, &d), TEQ_OK);
  int64_t bad = 0;
  for (int64_t i = 0; yf && ym && i < tensor_numel(yf); i++)
    if (modp_to_int(((uint32_t *)ym->data)[i]) != (int64_t)elem_f32(yf, i)) bad++;
  CHECK_MSG(yf && ym && bad == 0, "%s: %lld elements differ", op_def(k)->name, (long long)bad);
  for (int i = 0; i < n_in; i++) tensor_unref(m[i]);
  tensor_unref(yf);
  tensor_unref(ym);
  diag_fini(&d);
}

static void test_modp_linear(void) {
  Tensor *a = random_ints(shape_of(4, 2, 3, 4, 5), 50, 1);
  Tensor *bias = random_ints(shape_of(3, 3, 1, 1), 50, 2);
  Tensor *row = random_ints(shape_of(1, 5), 50, 3);
  Tensor *s = random_ints(shape_of(0), 9, 4);
  OpKind lin[] = {OP_EWADD, OP_SUB, OP_EWMUL};
  for (int k = 0; k < 3; k++) {
    check_modp_matches(lin[k], (Tensor *[]){a, bias}, 2);
    check_modp_matches(lin[k], (Tensor *[]){row, a}, 2);
    check_modp_matches(lin[k], (Tensor *[]){a, a}, 2);
    check_modp_matches(lin[k], (Tensor *[]){s, a}, 2);
  }
  check_modp_matches(OP_NEG, &a, 1);
  check_modp_matches(OP_SMUL, (Tensor *[]){a, s}, 2);
  tensor_unref(a);
  tensor_unref(bias);
  tensor_unref(row);
  tensor_unref(s);
}

static uint32_t run_modp_binary(OpKind k, uint32_t x, uint32_t y) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(0);
  Tensor *a = tensor_new(DT_MODP, &s), *b = tensor_new(DT_MODP, &s), *o = NULL;
  *(uint32_t *)a->data = x;
  *(uint32_t *)b->data = y;
  uint32_t r = 0xffffffffu;
  if (run_op(k, NULL, (Tensor *[]){a, b}, 2, true, &o, &d) == TEQ_OK) r = *(uint32_t *)o->data;
  tensor_unref(a);
  tensor_unref(b);
  tensor_unref(o);
  diag_fini(&d);
  return r;
}

/* The fixed maps of the non-linear binary operators. */
/* ONNX Pow raises floats to int64 exponents; Z_p takes them exactly. */
static void test_int64_exponent(void) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(1, 3);
  Tensor *x = tensor_new(DT_F32, &s), *e = tensor_new(DT_I64, &s), *y = NULL;
  float xv[] = {2, -3, 0.5f};
  int64_t ev[] = {3, 2, -1};
  memcpy(x->data, xv, sizeof xv);
  memcpy(e->data, ev, sizeof ev);
  CHECK_EQ_INT(run_op(OP_POW, NULL, (Tensor *[]){x, e}, 2, false, &y, &d), TEQ_OK);
  CHECK(y && elem_f32(y, 0) == 8 && elem_f32(y, 1) == 9 && elem_f32(y, 2) == 2);
  tensor_unref(y);
  Tensor *xm = f32_to_modp(x);
  ((int64_t *)e->data)[2] = 1;
  CHECK_EQ_INT(run_op(OP_POW, NULL, (Tensor *[]){xm, e}, 2, true, &y, &d), TEQ_OK);
  CHECK(y && ((uint32_t *)y->data)[0] == 8 && ((uint32_t *)y->data)[1] == 9);
  tensor_unref(y);
  tensor_unref(xm);
  tensor_unref(x);
  tensor_unref(e);
  diag_fini(&d);
}

static void test_modp_nonlinear_binary(void) {
  CHECK_EQ_INT(run_modp_binary(OP_DIV, 6, 3), 2);
  CHECK_EQ_INT(modp_mul(run_modp_binary(OP_DIV, 5, 7), 7), 5);
  CHECK_EQ_INT(run_modp_binary(OP_DIV, 5, 0), 0); /* modp_inv(0) = 0 */
  CHECK_EQ_INT(run_modp_binary(OP_POW, 2, 10), 1024);
  CHECK_EQ_INT(run_modp_binary(OP_POW, 3, MODP_P - 1), 1); /* Fermat */
  CHECK_EQ_INT(run_modp_binary(OP_MAX, MODP_P - 1, 1), MODP_P - 1);
  CHECK_EQ_INT(run_modp_binary(OP_MIN, MODP_P - 1, 1), 1);
  CHECK_EQ_INT(run_modp_binary(OP_EWADD, MODP_P - 1, 5), 4);
  CHECK_EQ_INT(run_modp_binary(OP_SUB, 1, 2), MODP_P - 1);
  CHECK_EQ_INT(run_modp_binary(OP_EWMUL, MODP_P - 1, MODP_P - 1), 1);
  CHECK_EQ_INT(run_modp_binary(OP_PRELU, 2, 3), 4 + 76 + 41 + 6); /* x^2 + 38 x + 41 + y x */
}

/* ---- stand-ins ---- */

static uint32_t run_modp_unary(OpKind k, const Params *p, uint32_t x) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(1, 1);
  Tensor *a = tensor_new(DT_MODP, &s), *o = NULL;
  *(uint32_t *)a->data = x;
  uint32_t r = 0xffffffffu;
  if (run_op(k, p, &a, 1, true, &o, &d) == TEQ_OK) r = *(uint32_t *)o->data;
  tensor_unref(a);
  tensor_unref(o);
  diag_fini(&d);
  return r;
}

static void test_standins(void) {
  /* TASO's relu stand-in, exactly. */
  uint32_t (*relu)(uint32_t) = op_def(OP_RELU)->modp_standin;
  CHECK(relu != NULL);
  for (uint32_t x = 0; relu && x < 100; x += 7)
    CHECK_EQ_INT(relu(x), modp_add(modp_mul(x, x + 1), 1));
  CHECK(relu && relu(MODP_P - 1) == 1); /* (-1)(0)+1 */
  /* Every non-linear row has one, no two alike on random points, and the
   * kernel at default parameters is the stand-in. */
  uint64_t st = 42;
  uint32_t pts[64];
  for (int i = 0; i < 64; i++) pts[i] = modp_reduce(rng_next(&st));
  for (int a = 0; a < OP__COUNT; a++) {
    const OpDef *oa = op_def(a);
    if (!(oa->flags & OPF_NONLINEAR)) continue;
    CHECK_MSG(oa->modp_standin != NULL, "%s", oa->name);
    for (int b = 0; b < a && oa->modp_standin; b++) {
      const OpDef *ob = op_def(b);
      if (!ob->modp_standin) continue;
      int same = 0;
      for (int i = 0; i < 64; i++) same += oa->modp_standin(pts[i]) == ob->modp_standin(pts[i]);
      CHECK_MSG(same <= 3, "%s and %s agree on %d of 64 points", oa->name, ob->name, same);
    }
  }
  for (size_t u = 0; u < N_UNARY; u++) {
    OpKind k = unary_cases[u].kind;
    if (!(op_def(k)->flags & OPF_NONLINEAR)) { /* neg: exact */
      CHECK_EQ_INT(run_modp_unary(k, NULL, 5), MODP_P - 5);
      continue;
    }
    for (int i = 0; i < 8; i++)
      CHECK_MSG(run_modp_unary(k, NULL, pts[i]) == op_def(k)->modp_standin(pts[i]), "%s",
                op_def(k)->name);
  }
}

/* Different parameters give different Z_p maps (else rules could equate
 * leaky_relu with alpha 0.1 and 0.2), and equal parameters the same one. */
static void test_standin_params(void) {
  Params a, b;
  params_default(OP_LEAKY_RELU, &a);
  params_default(OP_LEAKY_RELU, &b);
  param_set_float(&a, 0, 0.1);
  param_set_float(&b, 0, 0.2);
  int differ = 0;
  for (uint32_t x = 1; x < 20; x++) {
    differ += run_modp_unary(OP_LEAKY_RELU, &a, x) != run_modp_unary(OP_LEAKY_RELU, &b, x);
    CHECK_EQ_INT(run_modp_unary(OP_LEAKY_RELU, &a, x), run_modp_unary(OP_LEAKY_RELU, &a, x));
  }
  CHECK(differ >= 18);
  Params c;
  clip_params(&c);
  CHECK(run_modp_unary(OP_CLIP, &c, 3) != op_def(OP_CLIP)->modp_standin(3));
}

/* ---- through the graph and the executor ---- */

/* silu is the Sigmoid and Mul it replaces at import, to the bit, in
 * float32 and in Z_p (over the sigmoid sweep's range and past its clamps). */
static void test_silu_is_its_pair(void) {
  enum { N = 1 << 16 };
  Diag d;
  diag_init(&d);
  Tensor *x = tensor_new(DT_F32, &(Shape){.ndim = 1, .d = {N}}), *s = NULL, *xs = NULL,
         *y = NULL;
  float *xv = x->data;
  for (int i = 0; i < N - 3; i++) xv[i] = -100.0f + 200.0f * (float)i / (N - 4);
  xv[N - 3] = INFINITY, xv[N - 2] = -INFINITY, xv[N - 1] = -0.0f;
  CHECK_EQ_INT(run_op(OP_SIGMOID, NULL, &x, 1, false, &s, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_EWMUL, NULL, (Tensor *[]){x, s}, 2, false, &xs, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_SILU, NULL, &x, 1, false, &y, &d), TEQ_OK);
  int64_t bad = 0;
  for (int i = 0; y && xs && i < N; i++) {
    float a = elem_f32(y, i), b = elem_f32(xs, i);
    bad += memcmp(&a, &b, sizeof a) != 0 && !(isnan(a) && isnan(b));
  }
  CHECK_MSG(y && xs && bad == 0, "silu differs from x * sigmoid(x) at %lld elements",
            (long long)bad);
  uint64_t st = 7;
  for (int i = 0; i < 64; i++) {
    uint32_t v = modp_reduce(rng_next(&st));
    CHECK_EQ_INT(run_modp_unary(OP_SILU, NULL, v),
                 modp_mul(v, run_modp_unary(OP_SIGMOID, NULL, v)));
  }
  tensor_unref(x), tensor_unref(s), tensor_unref(xs), tensor_unref(y);
  diag_fini(&d);
}

/* relu(x + bias) with a [C,1,1] constant bias, as import builds it: float32
 * against a reference loop, and Z_p against the relu stand-in of x + b. */
static void test_through_exec(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(4, 2, 3, 4, 4), sb = shape_of(3, 3, 1, 1);
  Tensor *bias = tensor_new(DT_F32, &sb);
  for (int c = 0; c < 3; c++) ((float *)bias->data)[c] = (float)(c - 1);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  int b = graph_add_const(g, "b", bias, &d);
  int add = graph_add_node(g, OP_EWADD, (TensorRef[]){{x, 0}, {b, 0}}, 2, 1, NULL, "add", &d);
  int relu = graph_add_node(g, OP_RELU, (TensorRef[]){{add, 0}}, 1, 1, NULL, "relu", &d);
  CHECK(relu >= 0 && graph_add_output(g, (TensorRef){relu, 0}, "y", &d) >= 0);
  Tensor *xf = random_ints(sx, 3, 5), *xm = f32_to_modp(xf), *y = NULL, *ym = NULL;
  int rc = exec_run(g, EXEC_F32, &xf, &y, &d);
  CHECK_MSG(rc == TEQ_OK, "%s", diag_last(&d));
  int rcm = exec_run(g, EXEC_MODP, &xm, &ym, &d);
  CHECK_MSG(rcm == TEQ_OK, "%s", diag_last(&d));
  uint32_t (*s)(uint32_t) = op_def(OP_RELU)->modp_standin;
  for (int64_t i = 0; !rc && !rcm && i < tensor_numel(xf); i++) {
    float v = elem_f32(xf, i) + (float)(i / 16 % 3 - 1);
    CHECK_EQ_INT(elem_f32(y, i), v > 0 ? v : 0);
    CHECK_EQ_INT(((uint32_t *)ym->data)[i], s(modp_from_int((int64_t)v)));
  }
  tensor_unref(y);
  tensor_unref(ym);
  tensor_unref(xf);
  tensor_unref(xm);
  graph_free(g);
  diag_fini(&d);
}

/* ---- ONNX: export, import, same results ---- */

/* One node of kind on random inputs of the given shapes through
 * check_node_round_trip (parameters may lose float32 precision). */
static int round_trip(OpKind kind, const Params *p, const Shape *shapes, int n_in, Diag *d) {
  Tensor *in[4];
  for (int i = 0; i < n_in; i++) in[i] = random_f32(shapes[i], 40 + (uint64_t)i);
  int rc = check_node_round_trip(kind, p, in, n_in, false, d);
  unref_all(in, n_in);
  return rc;
}

static void test_onnx_round_trip(void) {
  Diag d;
  diag_init(&d);
  Shape s = shape_of(3, 2, 3, 4), shapes[3] = {shape_of(3, 2, 3, 4), shape_of(1, 4), shape_of(2, 3, 1)};
  for (size_t u = 0; u < N_UNARY; u++) {
    OpKind k = unary_cases[u].kind;
    Params p;
    unary_params(&unary_cases[u], &p);
    /* HardSwish (opset 14) and Mish (18) raise the model's opset */
    int rc = round_trip(k, &p, &s, 1, &d);
    CHECK_MSG(rc == TEQ_OK, "%s: %s", op_def(k)->name, diag_last(&d));
  }
  CHECK_EQ_INT(round_trip(OP_SUM, NULL, shapes, 3, &d), TEQ_OK);
  CHECK_EQ_INT(round_trip(OP_MEAN, NULL, shapes, 3, &d), TEQ_OK);
  CHECK_EQ_INT(round_trip(OP_MEAN, NULL, shapes, 1, &d), TEQ_OK);
  diag_fini(&d);
}

/* ---- flags and shape errors ---- */

static void test_flags(void) {
  CHECK(op_def(OP_EWADD)->flags & OPF_COMMUTATIVE);
  CHECK(op_def(OP_EWADD)->flags & OPF_MULTILINEAR);
  CHECK(op_def(OP_EWMUL)->flags & OPF_MULTILINEAR);
  CHECK(!(op_def(OP_SUB)->flags & OPF_COMMUTATIVE));
  CHECK(!(op_def(OP_DIV)->flags & (OPF_MULTILINEAR | OPF_NONLINEAR)));
  CHECK(!(op_def(OP_MAX)->flags & (OPF_MULTILINEAR | OPF_NONLINEAR)));
  CHECK(op_def(OP_NEG)->flags & OPF_MULTILINEAR);
  for (size_t u = 0; u < N_UNARY; u++) CHECK(op_def(unary_cases[u].kind)->flags & OPF_ELEMENTWISE);
  CHECK_EQ_INT(op_by_onnx("LeakyRelu"), OP_LEAKY_RELU);
  CHECK_EQ_INT(op_by_onnx("ThresholdedRelu"), OP_THRESHOLDED_RELU);
  CHECK_EQ_INT(op_by_onnx("Sum"), OP_SUM);
  CHECK_EQ_INT(op_by_onnx("Mean"), OP_MEAN);
  OpKind variadic[] = {OP_SUM, OP_MEAN};
  for (int i = 0; i < 2; i++) {
    const OpDef *o = op_def(variadic[i]);
    CHECK(o->flags & OPF_MULTILINEAR && o->flags & OPF_BROADCAST);
    CHECK(!(o->flags & OPF_COMMUTATIVE)); /* which means exactly two inputs */
    CHECK_EQ_INT(o->n_in_max, -1);
  }
  CHECK_EQ_INT(op_by_onnx("Add"), OP_EWADD);
  CHECK(op_def(OP_SMUL)->onnx_op == NULL && op_def(OP_SMUL)->onnx_write != NULL);
  CHECK(strcmp(op_def(OP_SMUL)->axiom_name, "smul") == 0);
  Params p;
  params_default(OP_CLIP, &p);
  CHECK(param_float(&p, 0) == -FLT_MAX && param_float(&p, 1) == FLT_MAX);
  params_default(OP_HARD_SIGMOID, &p);
  CHECK(param_float(&p, 0) == 0.2 && param_float(&p, 1) == 0.5);
  /* ONNX's float32 defaults, exactly. */
  params_default(OP_SELU, &p);
  CHECK(param_float(&p, 0) == 1.6732632423543772f && param_float(&p, 1) == 1.0507009873554805f);
}

static void test_errors(void) {
  Diag d;
  diag_init(&d);
  Shape out, in[2] = {shape_of(2, 2, 3), shape_of(1, 4)};
  CHECK_EQ_INT(infer_op(OP_EWADD, NULL, in, 2, 1, &out, &d), TEQ_ERR_INPUT);
  const char *m = diag_last(&d);
  CHECK_MSG(strstr(m, "ewadd") && strstr(m, "[2, 3]") && strstr(m, "[4]") && strstr(m, "broadcast"),
            "%s", m);
  in[0] = shape_of(2, 2, 3);
  in[1] = shape_of(1, 2);
  CHECK_EQ_INT(infer_op(OP_SMUL, NULL, in, 2, 1, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "smul: input 1 has shape [2]") != NULL, "%s", diag_last(&d));
  in[0] = shape_of(1, 3);
  in[1] = shape_of(2, 1, 1);
  CHECK_EQ_INT(infer_op(OP_SMUL, NULL, in, 2, 1, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "rank") != NULL, "%s", diag_last(&d));
  Shape three[3] = {shape_of(2, 2, 3), shape_of(1, 3), shape_of(2, 4, 1)};
  CHECK_EQ_INT(infer_op(OP_SUM, NULL, three, 3, 1, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "sum: input 2 has shape [4, 1], which does not broadcast with "
                   "[2, 3] (inputs 0..1)") != NULL, "%s", diag_last(&d));
  /* prelu's slope broadcasts to x's shape, never beyond it. */
  in[0] = shape_of(3, 3, 1, 5);
  in[1] = shape_of(3, 3, 4, 5);
  CHECK_EQ_INT(infer_op(OP_PRELU, NULL, in, 2, 1, &out, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "prelu: slope of shape [3, 4, 5] does not broadcast to the "
                                  "input's shape [3, 1, 5]") != NULL, "%s", diag_last(&d));
  /* An int64 first operand (an int64 result) is refused, not misread. */
  Shape s = shape_of(1, 3);
  Tensor *i64 = tensor_new(DT_I64, &s), *f = tensor_new(DT_F32, &s), *y = NULL;
  CHECK_EQ_INT(run_op(OP_EWADD, NULL, (Tensor *[]){i64, f}, 2, false, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "ewadd: input 0 is int64, expected float32") != NULL, "%s",
            diag_last(&d));
  CHECK_EQ_INT(run_op(OP_RELU, NULL, &f, 1, true, &y, &d), TEQ_ERR_INPUT);
  CHECK(y == NULL);
  /* Non-finite parameters are refused by the parameter check. */
  Params p;
  params_default(OP_LEAKY_RELU, &p);
  param_set_float(&p, 0, INFINITY);
  CHECK_EQ_INT(params_check(OP_LEAKY_RELU, &p, &d), TEQ_ERR_INPUT);
  tensor_unref(i64);
  tensor_unref(f);
  diag_fini(&d);
}

int main(void) {
  test_hand();
  test_broadcast();
  test_prelu();
  test_unary_f32();
  test_unary_extremes();
  test_sigmoid_sweep();
  test_gelu_tanh();
  test_silu_is_its_pair();
  test_variadic();
  test_modp_linear();
  test_modp_nonlinear_binary();
  test_int64_exponent();
  test_standins();
  test_standin_params();
  test_through_exec();
  test_onnx_round_trip();
  test_flags();
  test_errors();
  return check_exit();
}
