/* test_cuda_elementwise.c: the GPU kernels of the element-wise and
 * normalization families (runtime/cuda/elementwise.cu, norm.cu) against the
 * CPU executor, one single-node graph per case.
 *
 * Covered: every binary row (ewadd, ewmul, sub, div, pow, max, min) on same
 * shapes, a scalar on either side, [C,1,1] per-channel, row and column
 * vectors, both sides broadcasting, collapsed plans of 2 to 6 dimensions,
 * long rows (a row per block) at odd and multiple-of-4 lengths, extent-1
 * and empty shapes, ~1M elements; pow with an int64 exponent; max
 * and min with NaNs on either side; smul with scalars of every rank; every
 * unary row at odd, extent-1, empty and ~1M-element shapes (sizes that are
 * and are not multiples of 4), each float parameter at its default and at
 * other values, relu on -0 and NaNs of both signs; sum and mean with 1 to 8
 * inputs broadcast together (input 0 smaller than the output included);
 * layer_norm at every axis, with and without bias, scale and bias that must
 * be spread over the row, short rows (a warp per row) and long ones (a
 * block per row); instance_norm at ranks 3 to 5 and planes of 1 to 16384
 * elements; lrn at odd and even sizes, sizes beyond the channel count, and
 * non-default alpha, beta and bias. */
#include "tests/cuda_check.h"

static CudaDevice *dev;

/* "name [a]x[b] k=v": the label of a case, in a buffer per call. */
static const char *label_of(OpKind kind, int n_in, const Shape *in, const char *extra) {
  static char buf[512];
  int len = snprintf(buf, sizeof buf, "%s", op_def(kind)->name);
  for (int i = 0; i < n_in && len < (int)sizeof buf; i++) {
    char s[SHAPE_STR_MAX];
    len += snprintf(buf + len, sizeof buf - (size_t)len, "%s%s", i ? "," : " ",
                    shape_format(&in[i], s, sizeof s));
  }
  if (extra && len < (int)sizeof buf) snprintf(buf + len, sizeof buf - (size_t)len, " %s", extra);
  return buf;
}

static CudaCase make(OpKind kind, int n_in, const Shape *in, const char *extra) {
  return cuda_case(label_of(kind, n_in, in, extra), kind, n_in, in);
}

static void set_float(CudaCase *c, const char *name, double v) {
  int i = param_index(c->kind, name);
  CHECK_MSG(i >= 0, "%s has no parameter %s", op_def(c->kind)->name, name);
  if (i >= 0) param_set_float(&c->params, i, v);
}

static void set_int(CudaCase *c, const char *name, int64_t v) {
  int i = param_index(c->kind, name);
  CHECK_MSG(i >= 0, "%s has no parameter %s", op_def(c->kind)->name, name);
  if (i >= 0) param_set_int(&c->params, i, v);
}

/* ---- binary ---- */

typedef struct Pair {
  Shape a, b;
} Pair;

static void test_binary(void) {
  const OpKind kinds[] = {OP_EWADD, OP_EWMUL, OP_SUB, OP_DIV, OP_POW, OP_MAX, OP_MIN};
  const Pair pairs[] = {
      {shape_of(4, 1, 3, 7, 5), shape_of(4, 1, 3, 7, 5)},          /* same, odd */
      {shape_of(4, 2, 5, 13, 11), shape_of(4, 2, 5, 13, 11)},
      {shape_of(4, 4, 64, 64, 64), shape_of(4, 4, 64, 64, 64)},    /* 1M, float4 */
      {shape_of(1, 1000003), shape_of(1, 1000003)},                /* 1M, not by 4 */
      {shape_of(4, 2, 5, 13, 11), shape_of(3, 5, 1, 1)},           /* per channel */
      {shape_of(4, 4, 64, 64, 64), shape_of(3, 64, 1, 1)},
      {shape_of(4, 1, 3, 7, 5), shape_of(4, 1, 3, 1, 1)},
      {shape_of(3, 5, 1, 1), shape_of(4, 2, 5, 13, 11)},           /* per channel, left */
      {shape_of(4, 2, 5, 13, 11), shape_of(0)},                    /* scalar */
      {shape_of(0), shape_of(4, 2, 5, 13, 11)},
      {shape_of(4, 4, 64, 64, 64), shape_of(1, 1)},
      {shape_of(4, 2, 5, 13, 11), shape_of(1, 11)},                /* row vector */
      {shape_of(4, 2, 5, 13, 11), shape_of(2, 13, 1)},             /* column */
      {shape_of(4, 2, 1, 13, 1), shape_of(3, 5, 1, 11)},           /* both broadcast */
      {shape_of(2, 7, 1), shape_of(2, 1, 9)},
      {shape_of(5, 2, 3, 4, 5, 6), shape_of(4, 3, 1, 5, 1)},       /* 5 dims collapsed */
      {shape_of(6, 2, 1, 3, 1, 5, 1), shape_of(6, 1, 4, 1, 6, 1, 7)}, /* 6 dims */
      {shape_of(6, 2, 3, 1, 4, 5, 3), shape_of(5, 3, 1, 1, 5, 1)},
      {shape_of(3, 3, 5, 401), shape_of(2, 5, 1)},               /* long rows, odd */
      {shape_of(2, 6, 1001), shape_of(1, 1001)},
      {shape_of(3, 8, 1, 515), shape_of(2, 7, 1)},
      {shape_of(3, 16, 1, 1), shape_of(4, 2, 16, 24, 32)},        /* long rows, float4 */
      {shape_of(4, 2, 1, 4, 512), shape_of(3, 3, 1, 512)},
      {shape_of(4, 1, 1, 1, 1), shape_of(1, 1)},                   /* extent 1 */
      {shape_of(0), shape_of(0)},
      {shape_of(3, 2, 0, 3), shape_of(1, 3)},                      /* empty */
  };
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
    for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
      Shape in[2] = {pairs[p].a, pairs[p].b};
      CudaCase c = make(kinds[k], 2, in, NULL);
      /* pow's base positive; div away from a zero denominator. */
      c.positive = kinds[k] == OP_POW || kinds[k] == OP_DIV;
      cuda_check_case(dev, &c);
    }
}

/* pow and ewadd with an int64 second operand, converted to float32. */
static void test_int64_operand(void) {
  const Shape xs[] = {shape_of(4, 2, 5, 13, 11), shape_of(4, 2, 5, 13, 11),
                      shape_of(4, 2, 5, 13, 11), shape_of(4, 4, 64, 64, 64)};
  const Shape es[] = {shape_of(0), shape_of(1, 11), shape_of(3, 5, 1, 1), shape_of(3, 64, 1, 1)};
  const OpKind kinds[] = {OP_POW, OP_EWADD};
  for (size_t k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
      Tensor *e = tensor_new(DT_I64, &es[i]);
      int64_t *v = e->data;
      for (int64_t j = 0; j < tensor_numel(e); j++) v[j] = j % 7 - 2; /* -2..4 */
      Shape in[2] = {xs[i], es[i]};
      CudaCase c = make(kinds[k], 2, in, "int64 operand");
      c.consts[1] = e;
      c.positive = true;
      cuda_check_case(dev, &c);
      tensor_unref(e);
    }
}

/* A constant of shape s in [-1, 1) with NaN, -NaN, -0 and ±inf sprinkled. */
static Tensor *special_values(Shape s) {
  Tensor *t = tensor_new(DT_F32, &s);
  tensor_fill_random(t, 77);
  float *v = t->data;
  for (int64_t j = 0; j < tensor_numel(t); j++) {
    switch (j % 9) {
    case 1: v[j] = NAN; break;
    case 3: v[j] = -NAN; break;
    case 5: v[j] = -0.0f; break;
    case 7: v[j] = j % 2 ? INFINITY : -INFINITY; break;
    default: break;
    }
  }
  return t;
}

static void test_nan(void) {
  Shape x = shape_of(4, 2, 5, 13, 11), y = shape_of(2, 13, 11);
  const OpKind kinds[] = {OP_MAX, OP_MIN, OP_EWADD};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
    for (int side = 0; side < 2; side++) {
      Shape in[2] = {side ? y : x, side ? x : y};
      Tensor *t = special_values(y);
      CudaCase c = make(kinds[k], 2, in, side ? "NaNs in input 0" : "NaNs in input 1");
      c.consts[side ? 0 : 1] = t;
      cuda_check_case(dev, &c);
      tensor_unref(t);
    }
  /* relu clears the sign bit's values (-0 and -NaN to 0), unlike max(x, 0). */
  const OpKind unary[] = {OP_RELU, OP_LEAKY_RELU, OP_CLIP, OP_ABS, OP_NEG, OP_SIGMOID};
  for (size_t k = 0; k < sizeof unary / sizeof *unary; k++) {
    Shape in[1] = {shape_of(2, 7, 9)};
    Tensor *t = special_values(in[0]);
    CudaCase c = make(unary[k], 1, in, "NaN, -NaN, -0, inf");
    c.consts[0] = t;
    cuda_check_case(dev, &c);
    tensor_unref(t);
  }
}

/* prelu: the slope broadcast to x's shape alone (per channel as models
 * export it, a row, one slope, one per element), and NaNs in x. */
static void test_prelu(void) {
  const Pair pairs[] = {
      {shape_of(4, 2, 5, 13, 11), shape_of(3, 5, 1, 1)},
      {shape_of(4, 4, 64, 64, 64), shape_of(3, 64, 1, 1)},
      {shape_of(4, 2, 5, 13, 11), shape_of(1, 11)},
      {shape_of(4, 2, 5, 13, 11), shape_of(0)},
      {shape_of(1, 1000003), shape_of(1, 1000003)},
  };
  for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
    Shape in[2] = {pairs[p].a, pairs[p].b};
    CudaCase c = make(OP_PRELU, 2, in, NULL);
    cuda_check_case(dev, &c);
  }
  Shape in[2] = {shape_of(2, 7, 9), shape_of(2, 7, 1)};
  Tensor *t = special_values(in[0]);
  CudaCase c = make(OP_PRELU, 2, in, "NaN, -NaN, -0, inf");
  c.consts[0] = t;
  cuda_check_case(dev, &c);
  tensor_unref(t);
}

static void test_smul(void) {
  const Pair pairs[] = {
      {shape_of(4, 2, 5, 13, 11), shape_of(0)},
      {shape_of(4, 2, 5, 13, 11), shape_of(4, 1, 1, 1, 1)},
      {shape_of(4, 4, 64, 64, 64), shape_of(1, 1)},
      {shape_of(4, 1, 3, 7, 5), shape_of(2, 1, 1)},
      {shape_of(1, 1000003), shape_of(1, 1)},
      {shape_of(1, 1), shape_of(0)},
  };
  for (size_t p = 0; p < sizeof pairs / sizeof *pairs; p++) {
    Shape in[2] = {pairs[p].a, pairs[p].b};
    CudaCase c = make(OP_SMUL, 2, in, NULL);
    cuda_check_case(dev, &c);
  }
}

/* ---- unary ---- */

static void test_unary(void) {
  const OpKind kinds[] = {OP_RELU, OP_SIGMOID, OP_TANH, OP_EXP, OP_LOG, OP_SQRT, OP_NEG,
                          OP_ABS, OP_RECIPROCAL, OP_ERF, OP_LEAKY_RELU, OP_ELU, OP_CLIP,
                          OP_SOFTPLUS, OP_HARD_SIGMOID, OP_SELU, OP_THRESHOLDED_RELU,
                          OP_HARD_SWISH, OP_CELU, OP_MISH, OP_GELU, OP_SILU};
  const Shape shapes[] = {shape_of(4, 1, 3, 7, 5), shape_of(4, 2, 5, 13, 11),
                          shape_of(4, 4, 64, 64, 64), shape_of(1, 1000003),
                          shape_of(4, 1, 1, 1, 1), shape_of(0), shape_of(3, 2, 0, 5)};
  for (size_t k = 0; k < sizeof kinds / sizeof *kinds; k++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      CudaCase c = make(kinds[k], 1, &shapes[s], NULL);
      c.positive = kinds[k] == OP_LOG || kinds[k] == OP_SQRT || kinds[k] == OP_RECIPROCAL;
      cuda_check_case(dev, &c);
    }
}

/* Each float parameter away from its default (inputs are in [-1, 1)). */
static void test_unary_params(void) {
  const struct {
    OpKind kind;
    const char *p0, *p1;
    double v0, v1;
  } cases[] = {
      {OP_LEAKY_RELU, "alpha", NULL, 0.2, 0},
      {OP_LEAKY_RELU, "alpha", NULL, -0.5, 0},
      {OP_ELU, "alpha", NULL, 0.5, 0},
      {OP_ELU, "alpha", NULL, 2.0, 0},
      {OP_CLIP, "min", "max", -0.5, 0.5},
      {OP_CLIP, "min", "max", 0.0, 0.3},
      {OP_CLIP, "min", NULL, -0.2, 0},
      {OP_CLIP, "max", NULL, 0.7, 0},
      {OP_HARD_SIGMOID, "alpha", "beta", 0.5, 0.2},
      {OP_HARD_SIGMOID, "alpha", "beta", 3.0, -0.5},
      {OP_SELU, "alpha", "gamma", 1.5, 2.0},
      {OP_THRESHOLDED_RELU, "alpha", NULL, 0.25, 0},
      {OP_THRESHOLDED_RELU, "alpha", NULL, -0.5, 0},
      {OP_CELU, "alpha", NULL, 0.5, 0},
      {OP_CELU, "alpha", NULL, 2.0, 0},
  };
  const Shape shapes[] = {shape_of(4, 2, 5, 13, 11), shape_of(4, 4, 64, 64, 64)};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++)
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
      char extra[96];
      if (cases[k].p1)
        snprintf(extra, sizeof extra, "%s=%g %s=%g", cases[k].p0, cases[k].v0, cases[k].p1,
                 cases[k].v1);
      else
        snprintf(extra, sizeof extra, "%s=%g", cases[k].p0, cases[k].v0);
      CudaCase c = make(cases[k].kind, 1, &shapes[s], extra);
      set_float(&c, cases[k].p0, cases[k].v0);
      if (cases[k].p1) set_float(&c, cases[k].p1, cases[k].v1);
      cuda_check_case(dev, &c);
    }
}

/* ---- sum and mean ---- */

static void test_variadic(void) {
  const struct {
    int n;
    Shape in[8];
  } cases[] = {
      {1, {shape_of(4, 2, 5, 13, 11)}},
      {2, {shape_of(4, 2, 5, 13, 11), shape_of(4, 2, 5, 13, 11)}},
      {2, {shape_of(4, 2, 5, 13, 11), shape_of(3, 5, 1, 1)}},
      {3, {shape_of(3, 5, 1, 1), shape_of(4, 2, 5, 13, 11), shape_of(1, 11)}},
      {4, {shape_of(1, 1), shape_of(2, 13, 11), shape_of(4, 2, 1, 13, 1), shape_of(3, 5, 13, 11)}},
      {3, {shape_of(4, 4, 64, 64, 64), shape_of(4, 4, 64, 64, 64), shape_of(3, 64, 1, 1)}},
      {2, {shape_of(0), shape_of(0)}},
      {2, {shape_of(2, 7, 1), shape_of(2, 1, 9)}},
      {3, {shape_of(4, 2, 1, 4, 512), shape_of(3, 3, 1, 512), shape_of(1, 512)}},
      {8, {shape_of(1, 1), shape_of(2, 13, 11), shape_of(4, 2, 1, 13, 1), shape_of(3, 5, 13, 11),
           shape_of(4, 2, 5, 13, 11), shape_of(0), shape_of(3, 5, 1, 1), shape_of(1, 11)}},
      {5, {shape_of(1, 1000003), shape_of(1, 1000003), shape_of(1, 1), shape_of(1, 1000003),
           shape_of(1, 1000003)}},
  };
  const OpKind kinds[] = {OP_SUM, OP_MEAN};
  for (size_t k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
      CudaCase c = make(kinds[k], cases[i].n, cases[i].in, NULL);
      cuda_check_case(dev, &c);
    }
}

/* ---- normalizations ---- */

static void test_layer_norm(void) {
  const struct {
    int axis, n_in;
    Shape x, scale, bias;
  } cases[] = {
      {3, 3, shape_of(4, 2, 5, 13, 11), shape_of(1, 11), shape_of(1, 11)},
      {2, 3, shape_of(4, 2, 5, 13, 11), shape_of(2, 13, 11), shape_of(2, 13, 11)},
      {1, 3, shape_of(4, 2, 5, 13, 11), shape_of(3, 5, 13, 11), shape_of(4, 1, 5, 13, 11)},
      {0, 3, shape_of(4, 2, 5, 13, 11), shape_of(4, 2, 5, 13, 11), shape_of(4, 2, 5, 13, 11)},
      {2, 2, shape_of(4, 2, 5, 13, 11), shape_of(2, 13, 11), shape_of(0)},     /* no bias */
      {1, 3, shape_of(4, 2, 5, 13, 11), shape_of(3, 5, 1, 11), shape_of(2, 13, 1)}, /* spread */
      {2, 2, shape_of(4, 2, 5, 13, 11), shape_of(0), shape_of(0)},  /* scalar scale: spread */
      {1, 3, shape_of(4, 2, 5, 13, 11), shape_of(1, 1), shape_of(3, 5, 13, 11)},
      {2, 3, shape_of(3, 8, 128, 768), shape_of(1, 768), shape_of(1, 768)},   /* transformer */
      {1, 3, shape_of(2, 4, 3000), shape_of(1, 3000), shape_of(1, 3000)},     /* block per row */
      {1, 3, shape_of(2, 3, 5000), shape_of(1, 5000), shape_of(1, 1)},        /* bias spread */
      {2, 3, shape_of(3, 1, 1, 1), shape_of(1, 1), shape_of(1, 1)},           /* len 1 */
      {1, 3, shape_of(2, 3, 1), shape_of(1, 1), shape_of(1, 1)},
      {1, 3, shape_of(3, 1, 1, 7), shape_of(2, 1, 7), shape_of(1, 7)},
      {1, 3, shape_of(2, 0, 4), shape_of(1, 4), shape_of(1, 4)},              /* empty */
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    Shape in[3] = {cases[i].x, cases[i].scale, cases[i].bias};
    char extra[32];
    snprintf(extra, sizeof extra, "axis=%d", cases[i].axis);
    CudaCase c = make(OP_LAYER_NORM, cases[i].n_in, in, extra);
    set_int(&c, "axis", cases[i].axis);
    cuda_check_case(dev, &c);
  }
  Shape in[3] = {shape_of(4, 2, 5, 13, 11), shape_of(1, 11), shape_of(1, 11)};
  CudaCase c = make(OP_LAYER_NORM, 3, in, "axis=3 epsilon=0.1");
  set_int(&c, "axis", 3);
  set_float(&c, "epsilon", 0.1);
  cuda_check_case(dev, &c);
}

static void test_instance_norm(void) {
  const Shape xs[] = {shape_of(4, 2, 5, 13, 11), shape_of(4, 1, 3, 7, 5), shape_of(3, 2, 3, 17),
                      shape_of(5, 1, 2, 3, 4, 5), shape_of(4, 2, 3, 1, 1),
                      shape_of(4, 2, 4, 64, 64), shape_of(4, 4, 16, 128, 128),
                      shape_of(4, 2, 8, 40, 30), shape_of(4, 0, 3, 2, 2)};
  for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
    Shape in[3] = {xs[i], shape_of(1, xs[i].d[1]), shape_of(1, xs[i].d[1])};
    CudaCase c = make(OP_INSTANCE_NORM, 3, in, NULL);
    cuda_check_case(dev, &c);
  }
  Shape in[3] = {shape_of(4, 2, 5, 13, 11), shape_of(1, 5), shape_of(1, 5)};
  CudaCase c = make(OP_INSTANCE_NORM, 3, in, "epsilon=0.5");
  set_float(&c, "epsilon", 0.5);
  cuda_check_case(dev, &c);
}

static void test_lrn(void) {
  const struct {
    int64_t size;
    double alpha, beta, bias;
  } params[] = {
      {1, 1e-4, 0.75, 1.0}, {3, 1e-4, 0.75, 1.0}, {5, 1e-4, 0.75, 2.0},
      {4, 0.5, 0.75, 1.0},  {5, 2.0, 0.5, 0.5},   {9, 1.0, 1.5, 1.0},
  };
  const Shape xs[] = {shape_of(4, 1, 3, 7, 5), shape_of(4, 2, 5, 13, 11), shape_of(3, 2, 6, 10),
                      shape_of(4, 2, 16, 32, 32), shape_of(4, 4, 64, 64, 64),
                      shape_of(4, 2, 1, 3, 3)};
  for (size_t p = 0; p < sizeof params / sizeof *params; p++)
    for (size_t i = 0; i < sizeof xs / sizeof *xs; i++) {
      if (i == 4 && p % 3) continue; /* the 1M-element shape at a few settings only */
      char extra[96];
      snprintf(extra, sizeof extra, "size=%lld alpha=%g beta=%g bias=%g",
               (long long)params[p].size, params[p].alpha, params[p].beta, params[p].bias);
      CudaCase c = make(OP_LRN, 1, &xs[i], extra);
      set_int(&c, "size", params[p].size);
      set_float(&c, "alpha", params[p].alpha);
      set_float(&c, "beta", params[p].beta);
      set_float(&c, "bias", params[p].bias);
      cuda_check_case(dev, &c);
    }
}

int main(void) {
  dev = cuda_check_open();
  test_binary();
  test_int64_operand();
  test_nan();
  test_smul();
  test_prelu();
  test_unary();
  test_unary_params();
  test_variadic();
  test_layer_norm();
  test_instance_norm();
  test_lrn();
  cuda_device_close(dev);
  return check_exit();
}
