/* elementwise.c: element-wise operators: binary ones with numpy broadcasting
 * (ewadd, ewmul, sub, div, pow, max, min; prelu, whose slope broadcasts to
 * its input's shape and never beyond), the variadic sum and mean (ONNX
 * Sum and Mean: any number of inputs, broadcast together), TASO's scalar
 * multiply, and the unary activations. One kernel serves each group; a
 * row's .family holds its inner loops. Broadcasting first collapses the
 * output into as few dimensions as it can, so the innermost loop is
 * contiguous on each side or repeats one value (same shapes, a scalar, a
 * [C,1,1] bias, a row vector).
 * Z_p: add, sub, neg, smul, sum and mean are exact; each non-linear unary
 * operator evaluates its own fixed polynomial stand-in (given at its row);
 * div, pow, max and min are fixed maps of the residues, prelu a fixed
 * polynomial in x and its slope. Reductions and softmax are in reduce.c,
 * normalizations in norm.c, data movement in layout.c. */
#include <float.h>
#include <math.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

/* ---- shared checks ---- */

/* Kernels see the mode's dtype on every input; an int64 tensor reaching an
 * arithmetic operator (an unfolded shape computation) is refused here
 * rather than read as floats. */
static int check_dtypes(const Node *n, Tensor *const *in, Tensor *const *out, DType want,
                        Diag *d) {
  for (int i = 0; i < n->n_in; i++)
    if (in[i]->dtype != want)
      return op_error(n, d, "input %d is %s, expected %s", i, dtype_name(in[i]->dtype),
                      dtype_name(want));
  if (out[0]->dtype != want)
    return op_error(n, d, "output is %s, expected %s", dtype_name(out[0]->dtype),
                    dtype_name(want));
  return TEQ_OK;
}

/* ---- binary operators with broadcasting ---- */


/* Stride of output dimension i (of rank r) in input s, or 0 if broadcast. */
int64_t bcast_stride(const Shape *s, int r, int i) {
  int k = i - (r - s->ndim);
  if (k < 0 || s->d[k] == 1) return 0;
  int64_t st = 1;
  for (int j = k + 1; j < s->ndim; j++) st *= s->d[j];
  return st;
}

void bcast_plan(const Shape *a, const Shape *b, const Shape *o, BcastPlan *pl) {
  memset(pl, 0, sizeof *pl);
  for (int i = 0; i < o->ndim; i++) {
    if (o->d[i] == 1) continue; /* extent 1: its strides never matter */
    int64_t sa = bcast_stride(a, o->ndim, i), sb = bcast_stride(b, o->ndim, i);
    int k = pl->nd - 1;
    /* Merge into the previous dimension when both inputs walk on evenly. */
    if (k >= 0 && pl->sa[k] == sa * o->d[i] && pl->sb[k] == sb * o->d[i]) {
      pl->dim[k] *= o->d[i];
      pl->sa[k] = sa;
      pl->sb[k] = sb;
      continue;
    }
    pl->dim[pl->nd] = o->d[i];
    pl->sa[pl->nd] = sa;
    pl->sb[pl->nd] = sb;
    pl->nd++;
  }
  if (pl->nd == 0) { /* a single element */
    pl->nd = 1;
    pl->dim[0] = 1;
  }
}

/* o[0..n) = f(a, b) with a and b read at stride 0 or 1. */
typedef void (*BinaryLoop)(const void *a, int64_t sa, const void *b, int64_t sb, void *o,
                           int64_t n);

typedef struct BinaryFamily {
  BinaryLoop f32, modp;
} BinaryFamily;

static void bcast_run(const BcastPlan *pl, const char *a, const char *b, char *o,
                      BinaryLoop loop) {
  const size_t es = 4; /* float32 and Z_p residues alike */
  int in = pl->nd - 1;
  int64_t n = pl->dim[in], outer = 1, idx[TEQ_MAX_DIMS] = {0}, pa = 0, pb = 0;
  for (int i = 0; i < in; i++) outer *= pl->dim[i];
  for (int64_t k = 0; k < outer; k++) {
    loop(a + pa * es, pl->sa[in], b + pb * es, pl->sb[in], o + k * n * es, n);
    for (int i = in - 1; i >= 0; i--) { /* odometer step */
      pa += pl->sa[i];
      pb += pl->sb[i];
      if (++idx[i] < pl->dim[i]) break;
      pa -= pl->sa[i] * pl->dim[i];
      pb -= pl->sb[i] * pl->dim[i];
      idx[i] = 0;
    }
  }
}

/* One loop per (operator, dtype), with the stride cases split outside the
 * element loop so that each inner loop is a plain one the compiler can
 * vectorize. EXPR reads x and y. */
#define BINARY_LOOP(NAME, T, EXPR)                                                     \
  static void NAME(const void *pa, int64_t sa, const void *pb, int64_t sb, void *po,   \
                   int64_t n) {                                                        \
    const T *a = pa, *b = pb;                                                          \
    T *o = po;                                                                         \
    if (sa && sb) {                                                                    \
      for (int64_t i = 0; i < n; i++) { T x = a[i], y = b[i]; o[i] = (EXPR); }        \
    } else if (sa) {                                                                   \
      const T y = b[0];                                                                \
      for (int64_t i = 0; i < n; i++) { T x = a[i]; o[i] = (EXPR); }                  \
    } else if (sb) {                                                                   \
      const T x = a[0];                                                                \
      for (int64_t i = 0; i < n; i++) { T y = b[i]; o[i] = (EXPR); }                  \
    } else {                                                                           \
      const T x = a[0], y = b[0], v = (EXPR);                                          \
      for (int64_t i = 0; i < n; i++) o[i] = v;                                        \
    }                                                                                  \
  }

BINARY_LOOP(add_f32, float, x + y)
BINARY_LOOP(mul_f32, float, x * y)
BINARY_LOOP(sub_f32, float, x - y)
BINARY_LOOP(div_f32, float, x / y)
BINARY_LOOP(pow_f32, float, powf(x, y))
/* Selects rather than fmaxf, which is a libm call that never vectorizes;
 * a NaN on either side comes out as NaN, as in numpy. */
BINARY_LOOP(max_f32, float, x > y || x != x ? x : y)
BINARY_LOOP(min_f32, float, x < y || x != x ? x : y)
/* ONNX's PRelu: x where x >= 0, else the slope y times x; a NaN stays NaN. */
BINARY_LOOP(prelu_f32, float, x >= 0.0f ? x : y * x)
BINARY_LOOP(add_modp, uint32_t, modp_add(x, y))
BINARY_LOOP(mul_modp, uint32_t, modp_mul(x, y))
BINARY_LOOP(sub_modp, uint32_t, modp_sub(x, y))
/* Not linear, but a fixed map: x / 0 is 0 by modp_inv's convention. */
BINARY_LOOP(div_modp, uint32_t, modp_mul(x, modp_inv(y)))
/* The exponent is the residue y itself, read as an integer. */
BINARY_LOOP(pow_modp, uint32_t, modp_pow(x, y))
/* Residues compared as the integers 0..p-1. */
BINARY_LOOP(max_modp, uint32_t, x > y ? x : y)
BINARY_LOOP(min_modp, uint32_t, x < y ? x : y)
/* x^2 + 38 x + 41 + y x: no unary stand-in's cubic, so that a prelu is
 * told apart from any activation, and a polynomial in both operands, as the
 * stand-ins are, so that fingerprints keep Schwartz and Zippel's bound. */
BINARY_LOOP(prelu_modp, uint32_t, modp_add(modp_poly3(x, 0, 1, 38, 41), modp_mul(y, x)))
/* The second operand broadcast, for float32 and residues alike: sum and
 * mean copy their input 0 with it, passed as both operands. */
BINARY_LOOP(take_second, uint32_t, ((void)x, y))

static const BinaryFamily fam_add = {add_f32, add_modp};
static const BinaryFamily fam_mul = {mul_f32, mul_modp};
static const BinaryFamily fam_sub = {sub_f32, sub_modp};
static const BinaryFamily fam_div = {div_f32, div_modp};
static const BinaryFamily fam_pow = {pow_f32, pow_modp};
static const BinaryFamily fam_max = {max_f32, max_modp};
static const BinaryFamily fam_min = {min_f32, min_modp};
static const BinaryFamily fam_prelu = {prelu_f32, prelu_modp};

static int binary_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  if (shape_broadcast(&in[0], &in[1], &out[0], NULL) != TEQ_OK) {
    char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
    return op_error(n, d, "input shapes %s and %s do not broadcast",
                    shape_format(&in[0], sa, sizeof sa), shape_format(&in[1], sb, sizeof sb));
  }
  return TEQ_OK;
}

/* ONNX's Pow may raise a float tensor to an int64 exponent: such a second
 * operand is converted to the mode's element type (exactly, in Z_p). An
 * int64 first operand would make an int64 result, which the float kernels
 * do not compute, so check_dtypes refuses it. */
static Tensor *int64_operand_as(const Tensor *t, DType want) {
  Tensor *c = tensor_new(want, &t->shape);
  if (!c) return NULL;
  const int64_t *src = t->data;
  for (int64_t i = 0; i < tensor_numel(t); i++) {
    if (want == DT_MODP) ((uint32_t *)c->data)[i] = modp_from_int(src[i]);
    else ((float *)c->data)[i] = (float)src[i];
  }
  return c;
}

static int binary_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d,
                       bool modp) {
  DType want = modp ? DT_MODP : DT_F32;
  bool convert = in[1]->dtype == DT_I64 && in[0]->dtype == want;
  Tensor *y = convert ? int64_operand_as(in[1], want) : NULL;
  Tensor *args[2] = {in[0], y ? y : in[1]};
  int rc = check_dtypes(n, args, out, want, d);
  if (!rc && tensor_numel(out[0]) > 0) {
    const BinaryFamily *f = op_def(n->kind)->family;
    BcastPlan pl;
    bcast_plan(&args[0]->shape, &args[1]->shape, &out[0]->shape, &pl);
    bcast_run(&pl, args[0]->data, args[1]->data, out[0]->data, modp ? f->modp : f->f32);
  }
  tensor_unref(y);
  return rc;
}

static int binary_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return binary_eval(n, in, out, d, false);
}

static int binary_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return binary_eval(n, in, out, d, true);
}

/* ONNX Max and Min are variadic; Teq's are binary. One input is itself;
 * more are a chain of binary nodes, ((x0 op x1) op x2) ...: the maximum
 * and the minimum are associative, and so is broadcasting, so the chain's
 * shape is the one all the inputs broadcast to. */
static int binary_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  (void)p;
  int n = onnx_in_n_inputs(v);
  for (int i = 0; i < n; i++)
    if (!onnx_in_has_input(v, i))
      return onnx_in_error(v, d, "input %d of %s is empty", i, onnx_in_op_type(v));
  if (n == 1) onnx_in_as_elementwise(v, OP_IDENTITY);
  if (n > 2) onnx_in_as_chain(v);
  return TEQ_OK;
}

#define BINARY_SIGNATURE                                                             \
  .n_in_min = 2, .n_in_max = 2, .n_out_min = 1, .n_out_max = 1,                      \
  .infer_shape = binary_infer, .eval_f32 = binary_eval_f32, .eval_modp = binary_eval_modp

const OpDef op_def_ewadd = {
  .kind = OP_EWADD, .name = "ewadd", .axiom_name = "ewadd", .onnx_op = "Add",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(ewadd),
  .flags = OPF_ELEMENTWISE | OPF_MULTILINEAR | OPF_COMMUTATIVE | OPF_BROADCAST,
  .neutral_inputs = 3u, .neutral = 0.0,
  .family = &fam_add,
};

const OpDef op_def_ewmul = {
  .kind = OP_EWMUL, .name = "ewmul", .axiom_name = "ewmul", .onnx_op = "Mul",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(ewmul),
  .flags = OPF_ELEMENTWISE | OPF_MULTILINEAR | OPF_COMMUTATIVE | OPF_BROADCAST,
  .neutral_inputs = 3u, .neutral = 1.0,
  .family = &fam_mul,
};

const OpDef op_def_sub = {
  .kind = OP_SUB, .name = "sub", .onnx_op = "Sub",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(sub),
  .flags = OPF_ELEMENTWISE | OPF_MULTILINEAR | OPF_BROADCAST,
  .neutral_inputs = 2u, .neutral = 0.0,
  .family = &fam_sub,
};

const OpDef op_def_div = {
  .kind = OP_DIV, .name = "div", .onnx_op = "Div",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(div),
  .flags = OPF_ELEMENTWISE | OPF_BROADCAST,
  .neutral_inputs = 2u, .neutral = 1.0,
  .family = &fam_div,
};

const OpDef op_def_pow = {
  .kind = OP_POW, .name = "pow", .onnx_op = "Pow",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(pow),
  .flags = OPF_ELEMENTWISE | OPF_BROADCAST,
  .family = &fam_pow,
};

const OpDef op_def_max = {
  .kind = OP_MAX, .name = "max", .onnx_op = "Max",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(max),
  .flags = OPF_ELEMENTWISE | OPF_COMMUTATIVE | OPF_BROADCAST,
  .onnx_read = binary_onnx_read,
  .family = &fam_max,
};

const OpDef op_def_min = {
  .kind = OP_MIN, .name = "min", .onnx_op = "Min",
  BINARY_SIGNATURE, .eval_cuda = CUDA_EVAL(min),
  .flags = OPF_ELEMENTWISE | OPF_COMMUTATIVE | OPF_BROADCAST,
  .onnx_read = binary_onnx_read,
  .family = &fam_min,
};

/* PRelu broadcasts its slope to x's shape (ONNX's unidirectional
 * broadcasting): a slope that would widen the result is refused. */
static int prelu_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int rc = binary_infer(n, in, out, d);
  if (rc) return rc;
  if (!shape_equal(&out[0], &in[0])) {
    char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
    return op_error(n, d, "slope of shape %s does not broadcast to the input's shape %s",
                    shape_format(&in[1], sb, sizeof sb), shape_format(&in[0], sa, sizeof sa));
  }
  return TEQ_OK;
}

const OpDef op_def_prelu = {
  .kind = OP_PRELU, .name = "prelu", .onnx_op = "PRelu",
  .n_in_min = 2, .n_in_max = 2, .n_out_min = 1, .n_out_max = 1,
  .infer_shape = prelu_infer, .eval_f32 = binary_eval_f32, .eval_modp = binary_eval_modp,
  .eval_cuda = CUDA_EVAL(prelu), .flags = OPF_ELEMENTWISE | OPF_BROADCAST,
  .family = &fam_prelu,
};

/* ---- smul: TASO's scalar multiply ---- */

/* The scalar may have any rank up to x's (so that the ONNX Mul it exports
 * as broadcasts to x's shape), but exactly one element. */
static int smul_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char s[SHAPE_STR_MAX];
  if (shape_numel(&in[1]) != 1)
    return op_error(n, d, "input 1 has shape %s: the scale must have one element",
                    shape_format(&in[1], s, sizeof s));
  if (in[1].ndim > in[0].ndim)
    return op_error(n, d, "input 1 has shape %s: rank above input 0's rank %d",
                    shape_format(&in[1], s, sizeof s), in[0].ndim);
  out[0] = in[0];
  return TEQ_OK;
}

static int smul_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d, bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc) return rc;
  BinaryLoop loop = modp ? mul_modp : mul_f32;
  loop(in[0]->data, 1, in[1]->data, 0, out[0]->data, tensor_numel(out[0]));
  return TEQ_OK;
}

static int smul_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return smul_eval(n, in, out, d, false);
}

static int smul_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return smul_eval(n, in, out, d, true);
}

static int smul_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)n; (void)d;
  onnx_out_set_op_type(w, "Mul");
  return TEQ_OK;
}

const OpDef op_def_smul = {
  .kind = OP_SMUL, .name = "smul", .axiom_name = "smul",
  .n_in_min = 2, .n_in_max = 2, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_ELEMENTWISE | OPF_MULTILINEAR,
  .infer_shape = smul_infer, .eval_f32 = smul_eval_f32, .eval_modp = smul_eval_modp,
  .eval_cuda = CUDA_EVAL(smul),
  .neutral_inputs = 2u, .neutral = 1.0,
  .onnx_write = smul_onnx_write,
};

/* ---- unary operators ---- */

/* y[0..n) = f(x[0..n)); p holds the row's parameters (alpha, bounds). */
typedef void (*UnaryLoop)(const float *x, float *y, int64_t n, const Params *p);

typedef struct UnaryFamily {
  UnaryLoop f32;
  uint32_t (*modp)(uint32_t x); /* the stand-in; the exact map for neg */
} UnaryFamily;

/* EXPR reads x and the row's first two float parameters a0 and a1. */
#define UNARY_LOOP(NAME, EXPR)                                                   \
  static void NAME(const float *xs, float *ys, int64_t n, const Params *p) {     \
    const float a0 = (float)p->v[0].f, a1 = (float)p->v[1].f;                    \
    (void)a0; (void)a1;                                                          \
    for (int64_t i = 0; i < n; i++) { float x = xs[i]; ys[i] = (EXPR); }         \
  }

/* Clearing every value whose sign bit is set has no branch to mispredict
 * on mixed signs, even where the compiler does not vectorize; -0 and a
 * negative NaN become 0. */
static inline float relu_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u &= ~(uint32_t)((int32_t)u >> 31);
  memcpy(&x, &u, sizeof x);
  return x;
}
UNARY_LOOP(relu_f32, relu_bits(x))

/* a if c else b, through masks: GCC at -O2 turns a float ?: into a branch,
 * which mispredicts half the time on activations of mixed sign. */
static inline float pick(bool c, float a, float b) {
  uint32_t ua, ub, m = -(uint32_t)c;
  memcpy(&ua, &a, sizeof ua);
  memcpy(&ub, &b, sizeof ub);
  ua = (ua & m) | (ub & ~m);
  memcpy(&a, &ua, sizeof a);
  return a;
}

/* x clamped to [lo, hi]; a NaN stays NaN. */
static inline float clamp(float x, float lo, float hi) {
  x = pick(x < lo, lo, x);
  return pick(x > hi, hi, x);
}

/* e^x with no call and no branch, so that a loop over it vectorizes:
 * glibc's expf is a call per element, 29% of EfficientNet-B0's CPU time
 * in the expf of its Sigmoids. Cephes' method: x = n ln 2 + r with
 * |r| <= ln 2 / 2 (n rounded by the 1.5 * 2^23 trick, which needs no
 * SSE4.1), e^r by its degree-7 polynomial, 2^n written into the exponent
 * bits. Within 2 ulp of e^x on [-87.3, 88.3]; x is clamped there, so the
 * result is between 1.2e-38 and 2.3e38, never 0 or inf. A NaN comes out
 * NaN. */
static inline float exp_clamped(float x) {
  float t = pick(x < -87.33f, -87.33f, pick(x > 88.37f, 88.37f, x));
  t = pick(t == t, t, 0.0f); /* a NaN is computed as 0, put back below */
  const float round = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
  float n = (t * 1.44269504088896341f + round) - round;
  float r = t - n * 0.693359375f + n * 2.12194440e-4f; /* ln 2 in two parts */
  float z = r * r;
  float q = ((((1.9875691500e-4f * r + 1.3981999507e-3f) * r + 8.3334519073e-3f) * r +
              4.1665795894e-2f) * r + 1.6666665459e-1f) * r + 5.0000001201e-1f;
  float e = q * z + r + 1.0f;
  uint32_t bits = (uint32_t)((int32_t)n + 127) << 23;
  float two_n;
  memcpy(&two_n, &bits, sizeof two_n);
  return pick(x == x, e * two_n, x);
}

/* Past the clamp: 1 above (1 + e^-x rounds to 1 there anyway) and 0 below
 * (as 1 / (1 + inf) is with expf). */
static inline float sigmoid_of(float x) {
  return pick(x < -88.37f, 0.0f, 1.0f / (1.0f + exp_clamped(-x)));
}

FLOAT_VECTOR_CLONES
static void sigmoid_f32(const float *xs, float *ys, int64_t n, const Params *p) {
  (void)p;
  for (int64_t i = 0; i < n; i++) ys[i] = sigmoid_of(xs[i]);
}

/* x times the sigmoid row's sigmoid of x, the same float product the
 * Sigmoid and Mul it replaces compute. */
FLOAT_VECTOR_CLONES
static void silu_f32(const float *xs, float *ys, int64_t n, const Params *p) {
  (void)p;
  for (int64_t i = 0; i < n; i++) ys[i] = xs[i] * sigmoid_of(xs[i]);
}
UNARY_LOOP(tanh_f32, tanhf(x))
UNARY_LOOP(exp_f32, expf(x))
UNARY_LOOP(log_f32, logf(x))
UNARY_LOOP(sqrt_f32, sqrtf(x))
UNARY_LOOP(neg_f32, -x)
UNARY_LOOP(abs_f32, fabsf(x))
UNARY_LOOP(reciprocal_f32, 1.0f / x)
UNARY_LOOP(erf_f32, erff(x))
UNARY_LOOP(leaky_relu_f32, pick(x >= 0.0f, x, a0 * x))
UNARY_LOOP(elu_f32, x >= 0.0f ? x : a0 * expm1f(x))
UNARY_LOOP(clip_f32, clamp(x, a0, a1))
/* log(1 + e^x) without overflow for large x. */
UNARY_LOOP(softplus_f32, x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x)))
UNARY_LOOP(hard_sigmoid_f32, clamp(a0 * x + a1, 0.0f, 1.0f))
/* gamma (a1) times x, or alpha (a0) (e^x - 1) for x <= 0. */
UNARY_LOOP(selu_f32, a1 * (x > 0.0f ? x : a0 * expm1f(x)))
UNARY_LOOP(thresholded_relu_f32, pick(x > a0, x, 0.0f))
UNARY_LOOP(hard_swish_f32, x * clamp(x * (1.0f / 6.0f) + 0.5f, 0.0f, 1.0f))
/* max(0, x) + min(0, alpha (e^(x/alpha) - 1)): the second term is <= 0
 * exactly when x <= 0, for either sign of alpha, so one of the two is 0. */
UNARY_LOOP(celu_f32, x > 0.0f ? x : a0 * expm1f(x / a0))
UNARY_LOOP(mish_f32, x * tanhf(x > 0.0f ? x + log1pf(expf(-x)) : log1pf(expf(x))))

/* GELU, x Phi(x): exactly, with erf (approximate "none"), or with tanh
 * (approximate "tanh"), ONNX's two definitions. */
enum { GELU_ERF, GELU_TANH };
static void gelu_f32(const float *xs, float *ys, int64_t n, const Params *p) {
  if (p->v[0].i[0] == GELU_TANH)
    for (int64_t i = 0; i < n; i++) {
      float x = xs[i];
      ys[i] = 0.5f * x * (1.0f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
    }
  else
    for (int64_t i = 0; i < n; i++) {
      float x = xs[i];
      ys[i] = 0.5f * x * (1.0f + erff(x * 0.7071067811865476f));
    }
}

/* The stand-ins, one distinct polynomial per operator. Distinct cubics agree
 * on at most 3 points, so fingerprints tell them apart; the odd and even
 * shapes of tanh, erf and abs are kept only as a mnemonic. */
static uint32_t standin_relu(uint32_t x) { return modp_poly3(x, 0, 1, 1, 1); } /* x(x+1)+1, TASO */
static uint32_t standin_sigmoid(uint32_t x) { return modp_poly3(x, 0, 1, 3, 7); }
static uint32_t standin_tanh(uint32_t x) { return modp_poly3(x, 1, 0, 2, 0); }     /* x^3+2x */
static uint32_t standin_exp(uint32_t x) { return modp_poly3(x, 1, 1, 0, 1); }
static uint32_t standin_log(uint32_t x) { return modp_poly3(x, 0, 1, 5, 11); }
static uint32_t standin_sqrt(uint32_t x) { return modp_poly3(x, 1, 0, 3, 1); }
static uint32_t standin_abs(uint32_t x) { return modp_poly3(x, 0, 1, 0, 1); }      /* x^2+1 */
static uint32_t standin_reciprocal(uint32_t x) { return modp_poly3(x, 1, 4, 0, 2); }
static uint32_t standin_erf(uint32_t x) { return modp_poly3(x, 1, 0, 5, 0); }      /* x^3+5x */
static uint32_t standin_leaky_relu(uint32_t x) { return modp_poly3(x, 0, 1, 7, 13); }
static uint32_t standin_elu(uint32_t x) { return modp_poly3(x, 0, 1, 11, 5); }
static uint32_t standin_clip(uint32_t x) { return modp_poly3(x, 1, 2, 3, 4); }
static uint32_t standin_softplus(uint32_t x) { return modp_poly3(x, 0, 1, 13, 17); }
static uint32_t standin_hard_sigmoid(uint32_t x) { return modp_poly3(x, 1, 6, 0, 1); }
static uint32_t standin_selu(uint32_t x) { return modp_poly3(x, 1, 3, 1, 5); }
static uint32_t standin_thresholded_relu(uint32_t x) { return modp_poly3(x, 0, 1, 23, 29); }
static uint32_t standin_hard_swish(uint32_t x) { return modp_poly3(x, 1, 5, 2, 3); }
static uint32_t standin_celu(uint32_t x) { return modp_poly3(x, 0, 1, 29, 31); }
static uint32_t standin_mish(uint32_t x) { return modp_poly3(x, 1, 7, 1, 2); }
static uint32_t standin_gelu(uint32_t x) { return modp_poly3(x, 1, 2, 7, 3); }
/* x times sigmoid's stand-in: silu and the Sigmoid and Mul it replaces
 * fingerprint alike. */
static uint32_t standin_silu(uint32_t x) { return modp_mul(x, standin_sigmoid(x)); }
static uint32_t exact_neg(uint32_t x) { return modp_neg(x); }

/* A non-linear operator's parameters (leaky_relu's alpha, clip's bounds)
 * must change its Z_p map too, or leaky_relu with alpha 0.1 and 0.2 would
 * fingerprint alike. The map is standin(x) + t x, with t a hash of the
 * parameters that is 0 at the row's defaults, where the kernel therefore
 * equals modp_standin. */
static uint32_t params_tweak(OpKind kind, const Params *p) {
  Params def;
  params_default(kind, &def);
  if (memcmp(&def, p, sizeof def) == 0) return 0;
  uint32_t t = modp_reduce(hash_bytes(0x7477656b, p, sizeof *p));
  return t ? t : 1;
}

void unary_apply_f32(OpKind kind, const Params *p, const float *xs, float *ys, int64_t n) {
  const UnaryFamily *f = op_def(kind)->family;
  f->f32(xs, ys, n, p);
}

void unary_apply_modp(OpKind kind, const Params *p, const uint32_t *xs, uint32_t *ys,
                      int64_t n) {
  const UnaryFamily *f = op_def(kind)->family;
  uint32_t t = params_tweak(kind, p);
  if (!t) {
    for (int64_t i = 0; i < n; i++) ys[i] = f->modp(xs[i]);
    return;
  }
  for (int64_t i = 0; i < n; i++) ys[i] = modp_add(f->modp(xs[i]), modp_mul(t, xs[i]));
}

static int unary_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int rc = check_dtypes(n, in, out, DT_F32, d);
  if (rc) return rc;
  unary_apply_f32(n->kind, &n->params, in[0]->data, out[0]->data, tensor_numel(out[0]));
  return TEQ_OK;
}

static int unary_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int rc = check_dtypes(n, in, out, DT_MODP, d);
  if (rc) return rc;
  unary_apply_modp(n->kind, &n->params, in[0]->data, out[0]->data, tensor_numel(out[0]));
  return TEQ_OK;
}

#define UNARY_FAMILY(op) static const UnaryFamily fam_##op = {op##_f32, standin_##op};
UNARY_FAMILY(relu)
UNARY_FAMILY(sigmoid)
UNARY_FAMILY(tanh)
UNARY_FAMILY(exp)
UNARY_FAMILY(log)
UNARY_FAMILY(sqrt)
UNARY_FAMILY(abs)
UNARY_FAMILY(reciprocal)
UNARY_FAMILY(erf)
UNARY_FAMILY(leaky_relu)
UNARY_FAMILY(elu)
UNARY_FAMILY(clip)
UNARY_FAMILY(softplus)
UNARY_FAMILY(hard_sigmoid)
UNARY_FAMILY(selu)
UNARY_FAMILY(thresholded_relu)
UNARY_FAMILY(hard_swish)
UNARY_FAMILY(celu)
UNARY_FAMILY(mish)
UNARY_FAMILY(gelu)
UNARY_FAMILY(silu)
static const UnaryFamily fam_neg = {neg_f32, exact_neg};

#define UNARY_SIGNATURE                                                         \
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,                 \
  .infer_shape = infer_like_input0, .eval_f32 = unary_eval_f32,                 \
  .eval_modp = unary_eval_modp
#define NONLINEAR_FLAGS (OPF_ELEMENTWISE | OPF_NONLINEAR)

const OpDef op_def_relu = {
  .kind = OP_RELU, .name = "relu", .axiom_name = "relu", .onnx_op = "Relu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(relu), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_relu, .family = &fam_relu,
};

const OpDef op_def_sigmoid = {
  .kind = OP_SIGMOID, .name = "sigmoid", .axiom_name = "sigmoid", .onnx_op = "Sigmoid",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(sigmoid), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_sigmoid, .family = &fam_sigmoid,
};

const OpDef op_def_tanh = {
  .kind = OP_TANH, .name = "tanh", .axiom_name = "tanh", .onnx_op = "Tanh",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(tanh), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_tanh, .family = &fam_tanh,
};

const OpDef op_def_exp = {
  .kind = OP_EXP, .name = "exp", .onnx_op = "Exp",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(exp), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_exp, .family = &fam_exp,
};

const OpDef op_def_log = {
  .kind = OP_LOG, .name = "log", .onnx_op = "Log",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(log), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_log, .family = &fam_log,
};

const OpDef op_def_sqrt = {
  .kind = OP_SQRT, .name = "sqrt", .onnx_op = "Sqrt",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(sqrt), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_sqrt, .family = &fam_sqrt,
};

const OpDef op_def_neg = {
  .kind = OP_NEG, .name = "neg", .onnx_op = "Neg",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(neg), .flags = OPF_ELEMENTWISE | OPF_MULTILINEAR,
  .family = &fam_neg,
};

const OpDef op_def_abs = {
  .kind = OP_ABS, .name = "abs", .onnx_op = "Abs",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(abs), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_abs, .family = &fam_abs,
};

const OpDef op_def_reciprocal = {
  .kind = OP_RECIPROCAL, .name = "reciprocal", .onnx_op = "Reciprocal",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(reciprocal), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_reciprocal, .family = &fam_reciprocal,
};

const OpDef op_def_erf = {
  .kind = OP_ERF, .name = "erf", .onnx_op = "Erf",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(erf), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_erf, .family = &fam_erf,
};

static const OpParam leaky_relu_params[] = {
  {.name = "alpha", .type = PARAM_FLOAT, .fdef = 0.01, .onnx_attr = "alpha"},
};

const OpDef op_def_leaky_relu = {
  .kind = OP_LEAKY_RELU, .name = "leaky_relu", .onnx_op = "LeakyRelu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(leaky_relu), .flags = NONLINEAR_FLAGS,
  .params = leaky_relu_params, .n_params = 1,
  .modp_standin = standin_leaky_relu, .family = &fam_leaky_relu,
};

static const OpParam elu_params[] = {
  {.name = "alpha", .type = PARAM_FLOAT, .fdef = 1.0, .onnx_attr = "alpha"},
};

const OpDef op_def_elu = {
  .kind = OP_ELU, .name = "elu", .onnx_op = "Elu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(elu), .flags = NONLINEAR_FLAGS,
  .params = elu_params, .n_params = 1,
  .modp_standin = standin_elu, .family = &fam_elu,
};

/* ---- clip: bounds are attributes before opset 11, constant inputs after ---- */

enum { CLIP_MIN, CLIP_MAX };

/* Parameters must be finite, so a missing bound is ±FLT_MAX: clipping a
 * float32 to it changes nothing. ONNX's ±inf map to the same. */
static const OpParam clip_params[] = {
  [CLIP_MIN] = {.name = "min", .type = PARAM_FLOAT, .fdef = -FLT_MAX},
  [CLIP_MAX] = {.name = "max", .type = PARAM_FLOAT, .fdef = FLT_MAX},
};

static double clamp_to_float_range(double x) {
  return x < -FLT_MAX ? -FLT_MAX : x > FLT_MAX ? FLT_MAX : x;
}

/* Constant input i (1 = min, 2 = max) of an opset >= 11 Clip, if given. */
static int clip_read_bound(OnnxNodeIn *v, int i, Params *p, Diag *d) {
  if (!onnx_in_has_input(v, i)) return TEQ_OK;
  const char *what = i == 1 ? "min" : "max";
  const Tensor *t = onnx_in_const_input(v, i);
  if (!t) return onnx_in_unsupported(v, d, "input %d (%s) is not a constant", i, what);
  if (tensor_numel(t) != 1)
    return onnx_in_error(v, d, "input %d (%s) has %lld elements, expected 1", i, what,
                         (long long)tensor_numel(t));
  double x = t->dtype == DT_I64 ? (double)((const int64_t *)t->data)[0]
                                : (double)((const float *)t->data)[0];
  if (isnan(x)) return onnx_in_error(v, d, "input %d (%s) is NaN", i, what);
  param_set_float(p, i - 1, clamp_to_float_range(x));
  onnx_in_consume_input(v, i);
  return TEQ_OK;
}

static int clip_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  if (onnx_in_opset(v) < 11) {
    double x;
    if (onnx_in_attr_float(v, "min", &x)) param_set_float(p, CLIP_MIN, clamp_to_float_range(x));
    if (onnx_in_attr_float(v, "max", &x)) param_set_float(p, CLIP_MAX, clamp_to_float_range(x));
    return TEQ_OK;
  }
  int rc = clip_read_bound(v, 1, p, d);
  return rc ? rc : clip_read_bound(v, 2, p, d);
}

static int add_scalar_input(OnnxNodeOut *w, double x, Diag *d) {
  Shape s = shape_of(0);
  Tensor *t = tensor_new(DT_F32, &s);
  if (!t) {
    diag_error(d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  *(float *)t->data = (float)x;
  onnx_out_add_const_input(w, t);
  tensor_unref(t);
  return TEQ_OK;
}

/* Opset 13: bounds as inputs; an absent min before a present max is the
 * empty name. */
static int clip_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  double lo = param_float(&n->params, CLIP_MIN), hi = param_float(&n->params, CLIP_MAX);
  bool has_lo = lo > -FLT_MAX, has_hi = hi < FLT_MAX;
  int rc = TEQ_OK;
  if (has_lo) rc = add_scalar_input(w, lo, d);
  else if (has_hi) onnx_out_add_empty_input(w);
  if (!rc && has_hi) rc = add_scalar_input(w, hi, d);
  return rc;
}

const OpDef op_def_clip = {
  .kind = OP_CLIP, .name = "clip", .onnx_op = "Clip",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(clip), .flags = NONLINEAR_FLAGS,
  .params = clip_params, .n_params = 2,
  .onnx_read = clip_onnx_read, .onnx_write = clip_onnx_write,
  .modp_standin = standin_clip, .family = &fam_clip,
};

const OpDef op_def_softplus = {
  .kind = OP_SOFTPLUS, .name = "softplus", .onnx_op = "Softplus",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(softplus), .flags = NONLINEAR_FLAGS,
  .modp_standin = standin_softplus, .family = &fam_softplus,
};

static const OpParam hard_sigmoid_params[] = {
  {.name = "alpha", .type = PARAM_FLOAT, .fdef = 0.2, .onnx_attr = "alpha"},
  {.name = "beta", .type = PARAM_FLOAT, .fdef = 0.5, .onnx_attr = "beta"},
};

const OpDef op_def_hard_sigmoid = {
  .kind = OP_HARD_SIGMOID, .name = "hard_sigmoid", .onnx_op = "HardSigmoid",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(hard_sigmoid), .flags = NONLINEAR_FLAGS,
  .params = hard_sigmoid_params, .n_params = 2,
  .modp_standin = standin_hard_sigmoid, .family = &fam_hard_sigmoid,
};

/* ONNX float defaults are float32 values; these are their exact doubles. */
static const OpParam selu_params[] = {
  {.name = "alpha", .type = PARAM_FLOAT, .fdef = 1.67326319217681884765625, .onnx_attr = "alpha"},
  {.name = "gamma", .type = PARAM_FLOAT, .fdef = 1.05070102214813232421875, .onnx_attr = "gamma"},
};

const OpDef op_def_selu = {
  .kind = OP_SELU, .name = "selu", .onnx_op = "Selu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(selu), .flags = NONLINEAR_FLAGS,
  .params = selu_params, .n_params = 2,
  .modp_standin = standin_selu, .family = &fam_selu,
};

static const OpParam thresholded_relu_params[] = {
  {.name = "alpha", .type = PARAM_FLOAT, .fdef = 1.0, .onnx_attr = "alpha"},
};

const OpDef op_def_thresholded_relu = {
  .kind = OP_THRESHOLDED_RELU, .name = "thresholded_relu", .onnx_op = "ThresholdedRelu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(thresholded_relu), .flags = NONLINEAR_FLAGS,
  .params = thresholded_relu_params, .n_params = 1,
  .modp_standin = standin_thresholded_relu, .family = &fam_thresholded_relu,
};

/* HardSwish was born at opset 14. Below it, it is written as PyTorch
 * writes it there, x times HardSigmoid(x) with alpha 1/6 and beta 1/2,
 * which import fuses back (passes.c): a model keeps its opset. */
static int hard_swish_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)n, (void)d;
  if (onnx_out_opset(w) >= 14) return TEQ_OK;
  onnx_out_set_op_type(w, "HardSigmoid");
  onnx_out_attr_float(w, "alpha", 1.0 / 6);
  onnx_out_attr_float(w, "beta", 0.5);
  onnx_out_then_binary(w, "Mul", NULL);
  return TEQ_OK;
}

const OpDef op_def_hard_swish = {
  .kind = OP_HARD_SWISH, .name = "hard_swish", .onnx_op = "HardSwish",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(hard_swish), .flags = NONLINEAR_FLAGS,
  .onnx_write = hard_swish_onnx_write,
  .modp_standin = standin_hard_swish, .family = &fam_hard_swish,
};

static const OpParam celu_params[] = {
  {.name = "alpha", .type = PARAM_FLOAT, .fdef = 1.0, .onnx_attr = "alpha"},
};

const OpDef op_def_celu = {
  .kind = OP_CELU, .name = "celu", .onnx_op = "Celu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(celu), .flags = NONLINEAR_FLAGS,
  .params = celu_params, .n_params = 1,
  .modp_standin = standin_celu, .family = &fam_celu,
};

/* SiLU (swish), x sigmoid(x): ONNX has no operator for it before opset 24's
 * Swish, so it is written as PyTorch writes it, Sigmoid then Mul by x, and
 * fused back at import (passes.c), as ONNX Runtime fuses it. One pass over
 * memory where the pair takes three, and it costs what sigmoid costs. */
static int silu_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)n, (void)d;
  onnx_out_set_op_type(w, "Sigmoid");
  onnx_out_then_binary(w, "Mul", NULL);
  return TEQ_OK;
}

const OpDef op_def_silu = {
  .kind = OP_SILU, .name = "silu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(silu), .flags = NONLINEAR_FLAGS,
  .onnx_write = silu_onnx_write, .cost_family = OP_SIGMOID,
  .modp_standin = standin_silu, .family = &fam_silu,
};

const OpDef op_def_mish = {
  .kind = OP_MISH, .name = "mish", .onnx_op = "Mish",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(mish), .flags = NONLINEAR_FLAGS,
  .onnx_opset = 18,
  .modp_standin = standin_mish, .family = &fam_mish,
};

static const char *const gelu_modes[] = {"none", "tanh", NULL};
static const OpParam gelu_params[] = {
  {.name = "approximate", .type = PARAM_INT, .lo = 0, .hi = 1, .symbols = gelu_modes},
};

static int gelu_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const char *mode = "none";
  onnx_in_attr_string(v, "approximate", &mode);
  for (int m = 0; gelu_modes[m]; m++)
    if (strcmp(mode, gelu_modes[m]) == 0) {
      param_set_int(p, 0, m);
      return TEQ_OK;
    }
  return onnx_in_error(v, d, "approximate '%s' is neither 'none' nor 'tanh'", mode);
}

/* family.h: the constants of gelu's, hard swish's and layer_norm's
 * written-out forms. */
Tensor *op_scalar_f32(float v) {
  Shape s = {0};
  Tensor *t = tensor_new(DT_F32, &s);
  if (t) *(float *)t->data = v;
  return t;
}

/* Gelu exists from opset 20 on. Below it, gelu is written out as PyTorch
 * writes it, which ONNX Runtime fuses back: the erf form as
 * x / sqrt 2, Erf, + 1, times x, times 1/2; the tanh form as x^3, times
 * 0.044715, + x, times sqrt(2/pi), Tanh, + 1, times x, times 1/2. A model is
 * never raised to opset 20 for it. */
static int gelu_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  bool tanh_form = param_int(&n->params, 0) == GELU_TANH;
  if (onnx_out_opset(w) >= 20) {
    if (tanh_form) onnx_out_attr_string(w, "approximate", "tanh");
    return TEQ_OK;
  }
  enum { N_CONSTS = 6 };
  Tensor *c[N_CONSTS] = {op_scalar_f32(1.41421356f), op_scalar_f32(1), op_scalar_f32(0.5f),
                         op_scalar_f32(3), op_scalar_f32(0.044715f), op_scalar_f32(0.7978845608f)};
  int rc = TEQ_OK;
  for (int k = 0; k < N_CONSTS; k++)
    if (!c[k]) rc = TEQ_ERR_NOMEM;
  if (rc) {
    op_error(n, d, "out of memory");
  } else if (tanh_form) {
    onnx_out_set_op_type(w, "Pow");
    onnx_out_add_const_input(w, c[3]);
    onnx_out_then_binary(w, "Mul", c[4]);
    onnx_out_then_binary(w, "Add", NULL);
    onnx_out_then_binary(w, "Mul", c[5]);
    onnx_out_then_unary(w, "Tanh");
  } else {
    onnx_out_set_op_type(w, "Div");
    onnx_out_add_const_input(w, c[0]);
    onnx_out_then_unary(w, "Erf");
  }
  if (rc == TEQ_OK) {
    onnx_out_then_binary(w, "Add", c[1]);
    onnx_out_then_binary(w, "Mul", NULL);
    onnx_out_then_binary(w, "Mul", c[2]);
  }
  for (int k = 0; k < N_CONSTS; k++) tensor_unref(c[k]);
  return rc;
}

/* An exporter's GELU written out (passes.c) is fused into it at import. */
const OpDef op_def_gelu = {
  .kind = OP_GELU, .name = "gelu", .onnx_op = "Gelu",
  UNARY_SIGNATURE, .eval_cuda = CUDA_EVAL(gelu), .flags = NONLINEAR_FLAGS,
  .params = gelu_params, .n_params = 1,
  .onnx_read = gelu_onnx_read, .onnx_write = gelu_onnx_write,
  .modp_standin = standin_gelu, .family = &fam_gelu,
};

/* ---- sum and mean: any number of inputs, broadcast together ---- */

static int variadic_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  Shape o = in[0];
  for (int k = 1; k < n->n_in; k++) {
    Shape t;
    if (shape_broadcast(&o, &in[k], &t, NULL) != TEQ_OK) {
      char sa[SHAPE_STR_MAX], sb[SHAPE_STR_MAX];
      return op_error(n, d, "input %d has shape %s, which does not broadcast with %s (inputs "
                      "0..%d)", k, shape_format(&in[k], sb, sizeof sb),
                      shape_format(&o, sa, sizeof sa), k - 1);
    }
    o = t;
  }
  out[0] = o;
  return TEQ_OK;
}

typedef struct VariadicFamily {
  bool is_mean; /* divide the sum by the number of inputs */
} VariadicFamily;

static const VariadicFamily fam_sum = {false}, fam_mean = {true};

/* The output takes input 0 and accumulates the others in turn, each
 * broadcast; a mean then divides by the count (multiplies by its inverse
 * in Z_p). */
static int variadic_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d,
                         bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc || tensor_numel(out[0]) == 0) return rc;
  for (int k = 0; k < n->n_in; k++) {
    const Tensor *acc = k ? out[0] : in[0]; /* input 0 is copied, not added to garbage */
    BcastPlan pl;
    bcast_plan(&acc->shape, &in[k]->shape, &out[0]->shape, &pl);
    bcast_run(&pl, acc->data, in[k]->data, out[0]->data,
              k == 0 ? take_second : modp ? add_modp : add_f32);
  }
  if (!((const VariadicFamily *)op_def(n->kind)->family)->is_mean) return TEQ_OK;
  int64_t count = tensor_numel(out[0]);
  if (modp) {
    uint32_t *y = out[0]->data, inv = modp_inv(modp_from_int(n->n_in));
    for (int64_t i = 0; i < count; i++) y[i] = modp_mul(y[i], inv);
  } else {
    float *y = out[0]->data, k = (float)n->n_in;
    for (int64_t i = 0; i < count; i++) y[i] /= k;
  }
  return TEQ_OK;
}

static int variadic_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return variadic_eval(n, in, out, d, false);
}

static int variadic_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return variadic_eval(n, in, out, d, true);
}

/* With one input each is the identity. Linear like ewadd; not marked
 * commutative, which names exactly two inputs. */
#define VARIADIC_ROW_COMMON                                                     \
  .n_in_min = 1, .n_in_max = -1, .n_out_min = 1, .n_out_max = 1,                \
  .flags = OPF_ELEMENTWISE | OPF_MULTILINEAR | OPF_BROADCAST,                   \
  .infer_shape = variadic_infer, .eval_f32 = variadic_eval_f32,                 \
  .eval_modp = variadic_eval_modp

const OpDef op_def_sum = {
  .kind = OP_SUM, .name = "sum", .onnx_op = "Sum", VARIADIC_ROW_COMMON,
  .eval_cuda = CUDA_EVAL(sum), .family = &fam_sum,
};

const OpDef op_def_mean = {
  .kind = OP_MEAN, .name = "mean", .onnx_op = "Mean", VARIADIC_ROW_COMMON,
  .eval_cuda = CUDA_EVAL(mean), .family = &fam_mean,
};
