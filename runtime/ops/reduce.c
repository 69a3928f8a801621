/* reduce.c: operators that combine elements along axes: softmax and
 * log_softmax, and the reductions reduce_{sum, mean, max, min, prod,
 * sum_square, l1, l2, log_sum, log_sum_exp}, and argmax and argmin (int64
 * indices along one axis).
 * The reductions share one walk over the input in memory order. After
 * neighbouring dimensions are merged, the innermost run is either folded
 * into one accumulator (reducing the last axes) or folded element by element
 * into an output row (keeping them), so both run contiguously. A row is a
 * fold (sum of f(x), max, min, product) and a map applied afterwards (mean,
 * sqrt, log); log_sum_exp first finds each output's maximum, which the sum
 * of e^(x - max) subtracts so that exp cannot overflow.
 * Z_p: sum, sum_square and prod are exact, mean is sum * inv(count), max and
 * min compare residues as the integers 0..p-1; l1, l2, log_sum and
 * log_sum_exp put their own polynomial stand-in s where |x|, sqrt or log
 * is. softmax is s(x_i) * inv(sum_j s(x_j)), log_softmax x_i - s(sum_j
 * s(x_j)) (inv(0) = 0 by modp_inv's convention).
 * Element-wise operators are in elementwise.c, pooling in pool.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

#define LIST_MAX 16 /* room for any ONNX axes list */

static int check_dtypes(const Node *n, Tensor *const *in, Tensor *const *out, DType want,
                        Diag *d) {
  if (in[0]->dtype != want || out[0]->dtype != want)
    return op_error(n, d, "input is %s and output %s, expected %s", dtype_name(in[0]->dtype),
                    dtype_name(out[0]->dtype), dtype_name(want));
  return TEQ_OK;
}

static int64_t prod_dims(const Shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s->d[i];
  return p;
}

/* ---- ONNX helpers ---- */

static int onnx_input_rank(OnnxNodeIn *v, const Shape **shape, Diag *d) {
  const Shape *s = onnx_in_input_shape(v, 0);
  if (!s || !shape_is_known(s)) return onnx_in_unsupported(v, d, "input 0 has an unknown shape");
  *shape = s;
  return TEQ_OK;
}

/* The axes list: attribute before opset `since`, constant input 1 from it
 * (then consumed: a parameter, not an edge). */
static int onnx_read_axes(OnnxNodeIn *v, int since, int64_t *axes, int *n, Diag *d) {
  *n = 0;
  if (onnx_in_opset(v) < since) {
    int errors = d ? d->n_errors : 0; /* a too-long list is reported in d */
    onnx_in_attr_ints(v, "axes", axes, LIST_MAX, n);
    return d && d->n_errors > errors ? TEQ_ERR_INPUT : TEQ_OK;
  }
  if (!onnx_in_has_input(v, 1)) return TEQ_OK;
  const Tensor *t = onnx_in_const_input(v, 1);
  if (!t) return onnx_in_unsupported(v, d, "axes (input 1) is computed, not a constant");
  if (t->dtype != DT_I64 || t->shape.ndim > 1 || tensor_numel(t) > LIST_MAX)
    return onnx_in_error(v, d, "axes (input 1) must be a short int64 list");
  *n = (int)tensor_numel(t);
  memcpy(axes, t->data, (size_t)*n * sizeof *axes);
  onnx_in_consume_input(v, 1);
  return TEQ_OK;
}

/* ---- reductions ---- */

static const OpParam reduce_params[] = {
  [RED_AXES] = {.name = "axes", .type = PARAM_INTS, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
  [RED_KEEPDIMS] = {.name = "keepdims", .type = PARAM_INT, .def = 1, .lo = 0, .hi = 1,
                    .onnx_attr = "keepdims"},
};

/* Which dimensions of x are reduced; empty axes means all. */
static int reduce_mask(const Node *n, const Shape *x, bool *mask, Diag *d) {
  const ParamValue *a = &n->params.v[RED_AXES];
  char s[SHAPE_STR_MAX];
  for (int i = 0; i < x->ndim; i++) mask[i] = a->n == 0;
  for (int j = 0; j < a->n; j++) {
    if (a->i[j] >= x->ndim)
      return op_error(n, d, "axes[%d]=%lld: input 0 has shape %s (rank %d)", j,
                      (long long)a->i[j], shape_format(x, s, sizeof s), x->ndim);
    if (mask[a->i[j]])
      return op_error(n, d, "axes[%d]=%lld repeats an axis", j, (long long)a->i[j]);
    mask[a->i[j]] = true;
  }
  return TEQ_OK;
}

static int reduce_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  bool mask[TEQ_MAX_DIMS];
  int rc = reduce_mask(n, &in[0], mask, d);
  if (rc) return rc;
  bool keep = param_int(&n->params, RED_KEEPDIMS);
  int64_t dims[TEQ_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < in[0].ndim; i++)
    if (!mask[i] || keep) dims[k++] = mask[i] ? 1 : in[0].d[i];
  out[0] = shape_make(k, dims);
  return TEQ_OK;
}

/* The input as nd merged dimensions, with each one's stride in the output:
 * 0 along reduced dimensions. The input itself is read in memory order. */
typedef struct ReducePlan {
  int nd;
  int64_t ext[TEQ_MAX_DIMS], ost[TEQ_MAX_DIMS];
} ReducePlan;

static void reduce_plan(const Shape *x, const bool *mask, ReducePlan *pl) {
  Shape kept = *x; /* the output with keepdims: same layout either way */
  int64_t st[TEQ_MAX_DIMS];
  for (int i = 0; i < x->ndim; i++)
    if (mask[i]) kept.d[i] = 1;
  shape_strides(&kept, st);
  memset(pl, 0, sizeof *pl);
  for (int i = 0; i < x->ndim; i++) {
    if (x->d[i] == 1) continue;
    int64_t os = mask[i] ? 0 : st[i];
    int k = pl->nd - 1;
    if (k >= 0 && pl->ost[k] == os * x->d[i]) { /* both reduced, or both kept and adjacent */
      pl->ext[k] *= x->d[i];
      pl->ost[k] = os;
      continue;
    }
    pl->ext[pl->nd] = x->d[i];
    pl->ost[pl->nd++] = os;
  }
  if (pl->nd == 0) {
    pl->nd = 1;
    pl->ext[0] = 1;
  }
}

/* fold_run: *acc = op(*acc, f(x[0..n))); fold_row: acc[j] = op(acc[j], f(x[j])).
 * aux points into a second tensor at acc's position (log_sum_exp's maxima,
 * which f subtracts), or is NULL. */
typedef struct Reducer {
  void (*fold_run)(const void *x, int64_t n, void *acc, const void *aux);
  void (*fold_row)(const void *x, int64_t n, void *acc, const void *aux);
} Reducer;

/* Sums of F(v) over the elements v. A run sums in double, since a long run
 * summed in float32 loses digits, with four partial sums, since one would
 * wait on each addition's latency. */
#define SUM_FOLDS_F32(NAME, F)                                                         \
  static void NAME##_run_f32(const void *px, int64_t n, void *acc, const void *aux) {   \
    const float *x = px;                                                               \
    double s[4] = {0, 0, 0, 0};                                                        \
    int64_t i = 0;                                                                     \
    (void)aux;                                                                         \
    for (; i + 4 <= n; i += 4)                                                         \
      for (int k = 0; k < 4; k++) { double v = x[i + k]; s[k] += (F); }               \
    for (; i < n; i++) { double v = x[i]; s[0] += (F); }                               \
    *(float *)acc += (float)((s[0] + s[1]) + (s[2] + s[3]));                           \
  }                                                                                    \
  static void NAME##_row_f32(const void *px, int64_t n, void *pacc, const void *aux) {  \
    const float *x = px;                                                               \
    float *acc = pacc;                                                                 \
    (void)aux;                                                                         \
    for (int64_t i = 0; i < n; i++) { float v = x[i]; acc[i] += (float)(F); }         \
  }                                                                                    \
  static const Reducer NAME##_f32 = {NAME##_run_f32, NAME##_row_f32};

/* Sums of F(v) in Z_p, F(v) a residue. */
#define SUM_FOLDS_MODP(NAME, F)                                                        \
  static void NAME##_run_modp(const void *px, int64_t n, void *acc, const void *aux) {  \
    const uint32_t *x = px;                                                            \
    uint64_t s = *(uint32_t *)acc;                                                     \
    (void)aux;                                                                         \
    for (int64_t i = 0; i < n; i++) {                                                  \
      uint32_t v = x[i];                                                               \
      s += (F);                                                                        \
      if ((i & 0xffffff) == 0xffffff) s = modp_reduce(s); /* stay far below 2^64 */    \
    }                                                                                  \
    *(uint32_t *)acc = modp_reduce(s);                                                 \
  }                                                                                    \
  static void NAME##_row_modp(const void *px, int64_t n, void *pacc, const void *aux) { \
    const uint32_t *x = px;                                                            \
    uint32_t *acc = pacc;                                                              \
    (void)aux;                                                                         \
    for (int64_t i = 0; i < n; i++) { uint32_t v = x[i]; acc[i] = modp_add(acc[i], (F)); } \
  }                                                                                    \
  static const Reducer NAME##_modp = {NAME##_run_modp, NAME##_row_modp};

/* a = STEP(a, v) over the elements v of type T, with a run's accumulator
 * held in type A (double for a float32 product). */
#define STEP_FOLDS(NAME, T, A, STEP)                                                   \
  static void NAME##_run(const void *px, int64_t n, void *acc, const void *aux) {       \
    const T *x = px;                                                                   \
    A a = *(T *)acc;                                                                   \
    (void)aux;                                                                         \
    for (int64_t i = 0; i < n; i++) a = STEP(a, x[i]);                                 \
    *(T *)acc = (T)a;                                                                  \
  }                                                                                    \
  static void NAME##_row(const void *px, int64_t n, void *pacc, const void *aux) {      \
    const T *x = px;                                                                   \
    T *acc = pacc;                                                                     \
    (void)aux;                                                                         \
    for (int64_t i = 0; i < n; i++) acc[i] = (T)STEP(acc[i], x[i]);                    \
  }                                                                                    \
  static const Reducer NAME = {NAME##_run, NAME##_row};

/* The larger (smaller) of m and x, NaN if either is: a select, where fmaxf
 * would be a libm call that also drops NaNs. */
static inline float max_nan(float m, float x) { return x > m || x != x ? x : m; }
static inline float min_nan(float m, float x) { return x < m || x != x ? x : m; }
static inline double mul_f64(double a, float x) { return a * x; }
/* Z_p residues compared as the integers 0..p-1. */
static inline uint32_t max_u32(uint32_t a, uint32_t x) { return x > a ? x : a; }
static inline uint32_t min_u32(uint32_t a, uint32_t x) { return x < a ? x : a; }

/* Stand-ins of the non-linear reductions, each unlike every other row's:
 * l1 sums s(x), l2 and log_sum take s(sum), log_sum_exp s(sum s(x)). */
static uint32_t standin_reduce_l1(uint32_t x) { return modp_poly3(x, 0, 1, 37, 41); }
static uint32_t standin_reduce_l2(uint32_t x) { return modp_poly3(x, 1, 0, 7, 3); }
static uint32_t standin_reduce_log_sum(uint32_t x) { return modp_poly3(x, 1, 8, 0, 9); }
static uint32_t standin_reduce_log_sum_exp(uint32_t x) { return modp_poly3(x, 1, 2, 9, 1); }

SUM_FOLDS_F32(sum, v)
SUM_FOLDS_F32(abs_sum, fabs(v))
SUM_FOLDS_F32(square_sum, v * v)
STEP_FOLDS(max_f32, float, float, max_nan)
STEP_FOLDS(min_f32, float, float, min_nan)
STEP_FOLDS(prod_f32, float, double, mul_f64)
SUM_FOLDS_MODP(sum, v)
SUM_FOLDS_MODP(square_sum, modp_mul(v, v))
SUM_FOLDS_MODP(l1_sum, standin_reduce_l1(v))
SUM_FOLDS_MODP(lse_sum, standin_reduce_log_sum_exp(v))
STEP_FOLDS(max_modp, uint32_t, uint32_t, max_u32)
STEP_FOLDS(min_modp, uint32_t, uint32_t, min_u32)
STEP_FOLDS(prod_modp, uint32_t, uint32_t, modp_mul)

/* Sums of e^(x - m), m the maximum already found for the output (aux). An
 * infinite or NaN maximum is the result itself, so nothing is added. */
static void exp_sum_run_f32(const void *px, int64_t n, void *acc, const void *aux) {
  const float *x = px;
  float m = *(const float *)aux;
  double s = 0;
  if (!isfinite(m)) return;
  for (int64_t i = 0; i < n; i++) s += expf(x[i] - m);
  *(float *)acc += (float)s;
}

static void exp_sum_row_f32(const void *px, int64_t n, void *pacc, const void *aux) {
  const float *x = px, *m = aux;
  float *acc = pacc;
  for (int64_t i = 0; i < n; i++)
    if (isfinite(m[i])) acc[i] += expf(x[i] - m[i]);
}

static const Reducer exp_sum_f32 = {exp_sum_run_f32, exp_sum_row_f32};

/* Maps applied to every output after the fold; count is the number of
 * elements folded into each, aux as for the fold. */
static void mean_post_f32(float *y, const float *aux, int64_t n, int64_t count) {
  float scale = count ? 1.0f / (float)count : NAN;
  (void)aux;
  for (int64_t i = 0; i < n; i++) y[i] *= scale;
}

static void sqrt_post_f32(float *y, const float *aux, int64_t n, int64_t count) {
  (void)aux; (void)count;
  for (int64_t i = 0; i < n; i++) y[i] = sqrtf(y[i]);
}

static void log_post_f32(float *y, const float *aux, int64_t n, int64_t count) {
  (void)aux; (void)count;
  for (int64_t i = 0; i < n; i++) y[i] = logf(y[i]);
}

/* log sum e^x = m + log sum e^(x - m); an empty reduction is log 0 = -inf. */
static void lse_post_f32(float *y, const float *m, int64_t n, int64_t count) {
  (void)count;
  for (int64_t i = 0; i < n; i++) y[i] = isfinite(m[i]) ? m[i] + logf(y[i]) : m[i];
}

static void mean_post_modp(uint32_t *y, int64_t n, int64_t count) {
  uint32_t inv = modp_inv(modp_from_int(count));
  for (int64_t i = 0; i < n; i++) y[i] = modp_mul(y[i], inv);
}

#define STANDIN_POST_MODP(NAME)                                                  \
  static void NAME##_post_modp(uint32_t *y, int64_t n, int64_t count) {          \
    (void)count;                                                                 \
    for (int64_t i = 0; i < n; i++) y[i] = standin_##NAME(y[i]);                 \
  }
STANDIN_POST_MODP(reduce_l2)
STANDIN_POST_MODP(reduce_log_sum)
STANDIN_POST_MODP(reduce_log_sum_exp)

/* What distinguishes the reduction rows, in their .family: y = post(fold
 * of x), the fold starting at its identity. */
typedef struct ReduceFamily {
  const Reducer *f32, *modp;
  float init_f32;       /* the fold's identity: 0, 1, -inf or +inf */
  uint32_t init_modp;
  void (*post_f32)(float *y, const float *aux, int64_t n, int64_t count); /* or NULL */
  void (*post_modp)(uint32_t *y, int64_t n, int64_t count);               /* or NULL */
  bool max_first;       /* float32 finds each output's maximum into aux first */
  int axes_input_since; /* opset from which ONNX gives axes as input 1 */
  OpKind of_one;        /* the element-wise operator that is the reduction of one element,
                           which a reduction over no axes is (ONNX's noop_with_empty_axes);
                           OP__COUNT where Teq has none (a square) */
} ReduceFamily;

static const ReduceFamily fam_sum = {.f32 = &sum_f32, .modp = &sum_modp, .axes_input_since = 13,
                                     .of_one = OP_IDENTITY};
static const ReduceFamily fam_mean = {.f32 = &sum_f32, .modp = &sum_modp,
                                      .post_f32 = mean_post_f32, .post_modp = mean_post_modp,
                                      .axes_input_since = 18, .of_one = OP_IDENTITY};
static const ReduceFamily fam_max = {.f32 = &max_f32, .modp = &max_modp, .init_f32 = -INFINITY,
                                     .axes_input_since = 18, .of_one = OP_IDENTITY};
static const ReduceFamily fam_min = {.f32 = &min_f32, .modp = &min_modp, .init_f32 = INFINITY,
                                     .init_modp = MODP_P - 1, .axes_input_since = 18,
                                     .of_one = OP_IDENTITY};
static const ReduceFamily fam_prod = {.f32 = &prod_f32, .modp = &prod_modp, .init_f32 = 1,
                                      .init_modp = 1, .axes_input_since = 18,
                                      .of_one = OP_IDENTITY};
static const ReduceFamily fam_sum_square = {.f32 = &square_sum_f32, .modp = &square_sum_modp,
                                            .axes_input_since = 18, .of_one = OP__COUNT};
static const ReduceFamily fam_l1 = {.f32 = &abs_sum_f32, .modp = &l1_sum_modp,
                                    .axes_input_since = 18, .of_one = OP_ABS};
static const ReduceFamily fam_l2 = {.f32 = &square_sum_f32, .modp = &square_sum_modp,
                                    .post_f32 = sqrt_post_f32, .post_modp = reduce_l2_post_modp,
                                    .axes_input_since = 18, .of_one = OP_ABS};
static const ReduceFamily fam_log_sum = {.f32 = &sum_f32, .modp = &sum_modp,
                                         .post_f32 = log_post_f32,
                                         .post_modp = reduce_log_sum_post_modp,
                                         .axes_input_since = 18, .of_one = OP_LOG};
static const ReduceFamily fam_log_sum_exp = {.f32 = &exp_sum_f32, .modp = &lse_sum_modp,
                                             .post_f32 = lse_post_f32,
                                             .post_modp = reduce_log_sum_exp_post_modp,
                                             .max_first = true, .axes_input_since = 18,
                                             .of_one = OP_IDENTITY};

/* Folds all of x into out, which holds the fold's identity. */
static void reduce_walk(const ReducePlan *pl, const char *x, char *out, const char *aux,
                        const Reducer *r) {
  const int64_t es = 4; /* float32 and Z_p residues alike */
  int in = pl->nd - 1;
  int64_t n = pl->ext[in], outer = 1, idx[TEQ_MAX_DIMS] = {0}, po = 0;
  for (int i = 0; i < in; i++) outer *= pl->ext[i];
  for (int64_t k = 0; k < outer; k++) {
    const char *a = aux ? aux + po * es : NULL;
    if (pl->ost[in] == 0) r->fold_run(x + k * n * es, n, out + po * es, a);
    else r->fold_row(x + k * n * es, n, out + po * es, a);
    for (int i = in - 1; i >= 0; i--) { /* odometer step */
      po += pl->ost[i];
      if (++idx[i] < pl->ext[i]) break;
      po -= pl->ost[i] * pl->ext[i];
      idx[i] = 0;
    }
  }
}

/* y = post(fold of x) for n's row. */
static int reduce_run(const Node *n, const Tensor *x, Tensor *y, bool modp, Diag *d) {
  const ReduceFamily *f = op_def(n->kind)->family;
  bool mask[TEQ_MAX_DIMS];
  reduce_mask(n, &x->shape, mask, NULL); /* checked by shape inference */
  int64_t count = 1, ny = tensor_numel(y);
  for (int i = 0; i < x->shape.ndim; i++)
    if (mask[i]) count *= x->shape.d[i];
  for (int64_t i = 0; i < ny; i++) {
    if (modp) ((uint32_t *)y->data)[i] = f->init_modp;
    else ((float *)y->data)[i] = f->init_f32;
  }
  Tensor *aux = NULL;
  if (!modp && f->max_first && !(aux = tensor_new(DT_F32, &y->shape))) {
    op_error(n, d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  for (int64_t i = 0; aux && i < ny; i++) ((float *)aux->data)[i] = -INFINITY;
  if (tensor_numel(x) > 0) {
    ReducePlan pl;
    reduce_plan(&x->shape, mask, &pl);
    if (aux) reduce_walk(&pl, x->data, aux->data, NULL, &max_f32);
    reduce_walk(&pl, x->data, y->data, aux ? aux->data : NULL, modp ? f->modp : f->f32);
  }
  if (modp && f->post_modp) f->post_modp(y->data, ny, count);
  if (!modp && f->post_f32) f->post_f32(y->data, aux ? aux->data : NULL, ny, count);
  tensor_unref(aux);
  return TEQ_OK;
}

static int reduce_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int rc = check_dtypes(n, in, out, DT_F32, d);
  return rc ? rc : reduce_run(n, in[0], out[0], false, d);
}

static int reduce_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int rc = check_dtypes(n, in, out, DT_MODP, d);
  return rc ? rc : reduce_run(n, in[0], out[0], true, d);
}

static int cmp_int64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return (x > y) - (x < y);
}

/* Axes are normalized and sorted, so equal reductions hash alike. */
static int reduce_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = NULL;
  int64_t axes[LIST_MAX], noop = 0;
  int k = 0, r = TEQ_MAX_DIMS;
  /* The op_type names the row, whose family says when axes became an input. */
  const ReduceFamily *f = op_def(op_by_onnx(onnx_in_op_type(v)))->family;
  int rc = onnx_read_axes(v, f->axes_input_since, axes, &k, d);
  if (rc) return rc;
  onnx_in_attr_int(v, "noop_with_empty_axes", &noop);
  /* No axes then means none rather than all: each output element is the
   * reduction of one input element (ONNX Runtime's reading, and the spec's
   * since it was made precise; before, it said "the input tensor"). */
  if (noop && k == 0) {
    if (f->of_one == OP__COUNT)
      return onnx_in_unsupported(v, d, "%s over no axes (noop_with_empty_axes=1), an "
                                 "element-wise square, is not supported", onnx_in_op_type(v));
    onnx_in_as_elementwise(v, f->of_one);
    return TEQ_OK;
  }
  /* The rank is needed only for negative axes; shape inference checks the rest. */
  for (int j = 0; j < k; j++)
    if (axes[j] < 0 && (rc = onnx_input_rank(v, &x, d))) return rc;
  if (x) r = x->ndim;
  for (int j = 0; j < k; j++) {
    if (axes[j] < -r || axes[j] >= r)
      return onnx_in_error(v, d, "axes[%d]=%lld: must be in [%d, %d)", j, (long long)axes[j],
                           -r, r);
    if (axes[j] < 0) axes[j] += r;
  }
  qsort(axes, (size_t)k, sizeof *axes, cmp_int64);
  for (int j = 1; j < k; j++)
    if (axes[j] == axes[j - 1]) return onnx_in_error(v, d, "axis %lld repeats", (long long)axes[j]);
  param_set_ints(p, RED_AXES, axes, k);
  return TEQ_OK;
}

/* Axes are an attribute before the family's axes_input_since (ReduceSum's
 * 13, the others' 18), an input from then on. */
static int reduce_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const ParamValue *a = &n->params.v[RED_AXES];
  const ReduceFamily *f = op_def(n->kind)->family;
  if (a->n == 0) return TEQ_OK;
  if (f->axes_input_since > onnx_out_opset(w)) {
    onnx_out_attr_ints(w, "axes", a->i, a->n);
    return TEQ_OK;
  }
  Shape s = shape_of(1, a->n);
  Tensor *t = tensor_new(DT_I64, &s);
  if (!t) {
    diag_error(d, "out of memory");
    return TEQ_ERR_NOMEM;
  }
  memcpy(t->data, a->i, (size_t)a->n * sizeof a->i[0]);
  onnx_out_add_const_input(w, t);
  tensor_unref(t);
  return TEQ_OK;
}

#define REDUCE_ROW_COMMON                                                       \
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,                 \
  .params = reduce_params, .n_params = 2, .infer_shape = reduce_infer,          \
  .eval_f32 = reduce_eval_f32, .eval_modp = reduce_eval_modp,                   \
  .onnx_read = reduce_onnx_read, .onnx_write = reduce_onnx_write

/* The mean is the sum times a constant, so it is linear as well. */
const OpDef op_def_reduce_mean = {
  .kind = OP_REDUCE_MEAN, .name = "reduce_mean", .onnx_op = "ReduceMean",
  .eval_cuda = CUDA_EVAL(reduce_mean),
  REDUCE_ROW_COMMON, .flags = OPF_MULTILINEAR, .family = &fam_mean,
};

const OpDef op_def_reduce_sum = {
  .kind = OP_REDUCE_SUM, .name = "reduce_sum", .onnx_op = "ReduceSum",
  .eval_cuda = CUDA_EVAL(reduce_sum),
  REDUCE_ROW_COMMON, .flags = OPF_MULTILINEAR, .family = &fam_sum,
};

/* Non-linear, but fixed maps of the residues rather than stand-ins: max and
 * min compare residues as integers, the product and the sum of squares are
 * exact polynomials. */
const OpDef op_def_reduce_max = {
  .kind = OP_REDUCE_MAX, .name = "reduce_max", .onnx_op = "ReduceMax",
  .eval_cuda = CUDA_EVAL(reduce_max),
  REDUCE_ROW_COMMON, .flags = 0, .family = &fam_max,
};

const OpDef op_def_reduce_min = {
  .kind = OP_REDUCE_MIN, .name = "reduce_min", .onnx_op = "ReduceMin",
  .eval_cuda = CUDA_EVAL(reduce_min),
  REDUCE_ROW_COMMON, .flags = 0, .family = &fam_min,
};

const OpDef op_def_reduce_prod = {
  .kind = OP_REDUCE_PROD, .name = "reduce_prod", .onnx_op = "ReduceProd",
  .eval_cuda = CUDA_EVAL(reduce_prod),
  REDUCE_ROW_COMMON, .flags = 0, .family = &fam_prod,
};

const OpDef op_def_reduce_sum_square = {
  .kind = OP_REDUCE_SUM_SQUARE, .name = "reduce_sum_square", .onnx_op = "ReduceSumSquare",
  .eval_cuda = CUDA_EVAL(reduce_sum_square),
  REDUCE_ROW_COMMON, .flags = 0, .family = &fam_sum_square,
};

const OpDef op_def_reduce_l1 = {
  .kind = OP_REDUCE_L1, .name = "reduce_l1", .onnx_op = "ReduceL1",
  .eval_cuda = CUDA_EVAL(reduce_l1),
  REDUCE_ROW_COMMON, .flags = OPF_NONLINEAR, .modp_standin = standin_reduce_l1,
  .family = &fam_l1,
};

const OpDef op_def_reduce_l2 = {
  .kind = OP_REDUCE_L2, .name = "reduce_l2", .onnx_op = "ReduceL2",
  .eval_cuda = CUDA_EVAL(reduce_l2),
  REDUCE_ROW_COMMON, .flags = OPF_NONLINEAR, .modp_standin = standin_reduce_l2,
  .family = &fam_l2,
};

const OpDef op_def_reduce_log_sum = {
  .kind = OP_REDUCE_LOG_SUM, .name = "reduce_log_sum", .onnx_op = "ReduceLogSum",
  .eval_cuda = CUDA_EVAL(reduce_log_sum),
  REDUCE_ROW_COMMON, .flags = OPF_NONLINEAR, .modp_standin = standin_reduce_log_sum,
  .family = &fam_log_sum,
};

const OpDef op_def_reduce_log_sum_exp = {
  .kind = OP_REDUCE_LOG_SUM_EXP, .name = "reduce_log_sum_exp", .onnx_op = "ReduceLogSumExp",
  .eval_cuda = CUDA_EVAL(reduce_log_sum_exp),
  REDUCE_ROW_COMMON, .flags = OPF_NONLINEAR, .modp_standin = standin_reduce_log_sum_exp,
  .family = &fam_log_sum_exp,
};

/* ---- softmax and log_softmax ---- */

static const OpParam softmax_params[] = {
  [SOFTMAX_AXIS] = {.name = "axis", .type = PARAM_INT, .def = 1, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
};

/* The stand-ins s: x^2 + 19x + 23 and x^2 + 31x + 37, unlike every
 * element-wise one. */
static uint32_t standin_softmax(uint32_t x) { return modp_poly3(x, 0, 1, 19, 23); }
static uint32_t standin_log_softmax(uint32_t x) { return modp_poly3(x, 0, 1, 31, 37); }

static int softmax_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t axis = param_int(&n->params, 0);
  char s[SHAPE_STR_MAX];
  if (axis >= in[0].ndim)
    return op_error(n, d, "axis=%lld: input 0 has shape %s (rank %d)", (long long)axis,
                    shape_format(&in[0], s, sizeof s), in[0].ndim);
  out[0] = in[0];
  return TEQ_OK;
}

/* Softmax of the len values x[0], x[st], ..., into y at the same places;
 * the maximum is subtracted first so exp cannot overflow. */
static void softmax_line_f32(const float *x, float *y, int64_t len, int64_t st) {
  float m = -INFINITY;
  for (int64_t i = 0; i < len; i++) m = max_nan(m, x[i * st]);
  double sum = 0;
  for (int64_t i = 0; i < len; i++) {
    y[i * st] = expf(x[i * st] - m);
    sum += y[i * st];
  }
  float inv = (float)(1.0 / sum);
  for (int64_t i = 0; i < len; i++) y[i * st] *= inv;
}

/* log softmax(x)_i = (x_i - m) - log sum_j e^(x_j - m), m the maximum. */
static void log_softmax_line_f32(const float *x, float *y, int64_t len, int64_t st) {
  float m = -INFINITY;
  for (int64_t i = 0; i < len; i++) m = max_nan(m, x[i * st]);
  double sum = 0;
  for (int64_t i = 0; i < len; i++) sum += expf(x[i * st] - m);
  float lse = (float)log(sum);
  for (int64_t i = 0; i < len; i++) y[i * st] = (x[i * st] - m) - lse;
}

/* s(x_i) * inv(sum_j s(x_j)) (inv(0) = 0 by modp_inv's convention). */
static void softmax_line_modp(const uint32_t *x, uint32_t *y, int64_t len, int64_t st) {
  uint32_t sum = 0;
  for (int64_t i = 0; i < len; i++) {
    y[i * st] = standin_softmax(x[i * st]);
    sum = modp_add(sum, y[i * st]);
  }
  uint32_t inv = modp_inv(sum);
  for (int64_t i = 0; i < len; i++) y[i * st] = modp_mul(y[i * st], inv);
}

/* x_i - s(sum_j s(x_j)): the log of a sum subtracted, as in float32. */
static void log_softmax_line_modp(const uint32_t *x, uint32_t *y, int64_t len, int64_t st) {
  uint32_t sum = 0;
  for (int64_t i = 0; i < len; i++) sum = modp_add(sum, standin_log_softmax(x[i * st]));
  uint32_t lse = standin_log_softmax(sum);
  for (int64_t i = 0; i < len; i++) y[i * st] = modp_sub(x[i * st], lse);
}

/* What distinguishes softmax from log_softmax, in their .family. */
typedef struct SoftmaxFamily {
  void (*line_f32)(const float *x, float *y, int64_t len, int64_t st);
  void (*line_modp)(const uint32_t *x, uint32_t *y, int64_t len, int64_t st);
} SoftmaxFamily;

static const SoftmaxFamily fam_softmax = {softmax_line_f32, softmax_line_modp};
static const SoftmaxFamily fam_log_softmax = {log_softmax_line_f32, log_softmax_line_modp};

static int softmax_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d,
                        bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc) return rc;
  const SoftmaxFamily *f = op_def(n->kind)->family;
  const Shape *x = &in[0]->shape;
  int axis = (int)param_int(&n->params, 0);
  int64_t outer = prod_dims(x, 0, axis), len = x->d[axis], inner = prod_dims(x, axis + 1, x->ndim);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * len * inner + i;
      if (modp)
        f->line_modp((const uint32_t *)in[0]->data + base, (uint32_t *)out[0]->data + base, len,
                     inner);
      else
        f->line_f32((const float *)in[0]->data + base, (float *)out[0]->data + base, len, inner);
    }
  return TEQ_OK;
}

static int softmax_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return softmax_eval(n, in, out, d, false);
}

static int softmax_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return softmax_eval(n, in, out, d, true);
}

/* Before opset 13 (Log)Softmax flattened the input to 2-D at axis and
 * normalized over all of x[axis:]; that equals Teq's one-axis form only
 * when the dimensions after axis are all 1. */
static int softmax_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = NULL;
  int rc = onnx_input_rank(v, &x, d);
  if (rc) return rc;
  bool old = onnx_in_opset(v) < 13;
  int64_t axis = old ? 1 : -1;
  onnx_in_attr_int(v, "axis", &axis);
  if (axis < -x->ndim || axis >= x->ndim)
    return onnx_in_error(v, d, "attribute axis=%lld: must be in [%d, %d)", (long long)axis,
                         -x->ndim, x->ndim);
  if (axis < 0) axis += x->ndim;
  if (old && prod_dims(x, (int)axis + 1, x->ndim) != 1)
    return onnx_in_unsupported(v, d, "opset %d %s with axis=%lld normalizes over several "
                               "dimensions", onnx_in_opset(v), onnx_in_op_type(v),
                               (long long)axis);
  param_set_int(p, 0, axis);
  return TEQ_OK;
}

static int softmax_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  onnx_out_attr_int(w, "axis", param_int(&n->params, 0));
  return TEQ_OK;
}

#define SOFTMAX_ROW_COMMON                                                                 \
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,                            \
  .params = softmax_params, .n_params = 1, .flags = OPF_NONLINEAR,                         \
  .infer_shape = softmax_infer, .eval_f32 = softmax_eval_f32, .eval_modp = softmax_eval_modp, \
  .onnx_read = softmax_onnx_read, .onnx_write = softmax_onnx_write

const OpDef op_def_softmax = {
  .kind = OP_SOFTMAX, .name = "softmax", .onnx_op = "Softmax",
  .eval_cuda = CUDA_EVAL(softmax),
  SOFTMAX_ROW_COMMON, .modp_standin = standin_softmax, .family = &fam_softmax,
};

const OpDef op_def_log_softmax = {
  .kind = OP_LOG_SOFTMAX, .name = "log_softmax", .onnx_op = "LogSoftmax",
  .eval_cuda = CUDA_EVAL(log_softmax),
  SOFTMAX_ROW_COMMON, .modp_standin = standin_log_softmax, .family = &fam_log_softmax,
};

/* ---- argmax and argmin ---- */

/* ONNX ArgMax/ArgMin: the int64 index along axis of the largest (smallest)
 * element, the first of equal ones, or the last with select_last_index.
 * NaN is as numpy has it, and as reduce_max/reduce_min (which return NaN
 * when any element is): a NaN beats every number, so the index is that of
 * the first (last) NaN. ONNX Runtime leaves NaN unspecified (Eigen's
 * maxCoeff keeps a leading NaN and skips later ones). Z_p compares residues
 * as the integers 0..p-1, a fixed function like reduce_max's. */

static const OpParam arg_params[] = {
  [ARG_AXIS] = {.name = "axis", .type = PARAM_INT, .def = 0, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
  [ARG_KEEPDIMS] = {.name = "keepdims", .type = PARAM_INT, .def = 1, .lo = 0, .hi = 1,
                    .onnx_attr = "keepdims"},
  [ARG_LAST] = {.name = "select_last_index", .type = PARAM_INT, .def = 0, .lo = 0, .hi = 1,
                .onnx_attr = "select_last_index"},
};

static int arg_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t axis = param_int(&n->params, ARG_AXIS);
  char s[SHAPE_STR_MAX];
  if (axis >= in[0].ndim)
    return op_error(n, d, "axis=%lld: input 0 has shape %s (rank %d)", (long long)axis,
                    shape_format(&in[0], s, sizeof s), in[0].ndim);
  if (in[0].d[axis] == 0)
    return op_error(n, d, "axis=%lld: input 0 has shape %s, no element to select",
                    (long long)axis, shape_format(&in[0], s, sizeof s));
  bool keep = param_int(&n->params, ARG_KEEPDIMS);
  int64_t dims[TEQ_MAX_DIMS];
  int k = 0;
  for (int i = 0; i < in[0].ndim; i++)
    if (i != axis) dims[k++] = in[0].d[i];
    else if (keep) dims[k++] = 1;
  out[0] = shape_make(k, dims);
  return TEQ_OK;
}

/* Whether v replaces the best b so far: v beats b (NaN beats every number),
 * or, with last, equals it (NaN equals NaN). sign -1 turns max into min. */
static inline bool arg_take_f32(float v, float b, int sign, bool last) {
  if (b != b) return last && v != v;
  if (v != v) return true;
  return sign > 0 ? (v > b || (last && v == b)) : (v < b || (last && v == b));
}

static inline bool arg_take_u32(uint32_t v, uint32_t b, int sign, bool last) {
  return sign > 0 ? (v > b || (last && v == b)) : (v < b || (last && v == b));
}

/* argmax is sign +1, argmin -1, in .family. */
static const int fam_argmax = 1, fam_argmin = -1;

static int arg_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d, bool modp) {
  DType want = modp ? DT_MODP : DT_F32;
  if (in[0]->dtype != want || out[0]->dtype != DT_I64)
    return op_error(n, d, "input is %s and output %s, expected %s and int64",
                    dtype_name(in[0]->dtype), dtype_name(out[0]->dtype), dtype_name(want));
  int sign = *(const int *)op_def(n->kind)->family;
  bool last = param_int(&n->params, ARG_LAST);
  const Shape *x = &in[0]->shape;
  int axis = (int)param_int(&n->params, ARG_AXIS);
  int64_t outer = prod_dims(x, 0, axis), len = x->d[axis], inner = prod_dims(x, axis + 1, x->ndim);
  int64_t *y = out[0]->data;
  /* Row by row along axis, so the inner dimensions are read contiguously. */
  for (int64_t o = 0; o < outer; o++) {
    int64_t *yo = y + o * inner;
    for (int64_t i = 0; i < inner; i++) yo[i] = 0;
    if (modp) {
      const uint32_t *xo = (const uint32_t *)in[0]->data + o * len * inner;
      for (int64_t k = 1; k < len; k++)
        for (int64_t i = 0; i < inner; i++)
          if (arg_take_u32(xo[k * inner + i], xo[yo[i] * inner + i], sign, last)) yo[i] = k;
    } else {
      const float *xo = (const float *)in[0]->data + o * len * inner;
      for (int64_t k = 1; k < len; k++)
        for (int64_t i = 0; i < inner; i++)
          if (arg_take_f32(xo[k * inner + i], xo[yo[i] * inner + i], sign, last)) yo[i] = k;
    }
  }
  return TEQ_OK;
}

static int arg_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return arg_eval(n, in, out, d, false);
}

static int arg_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return arg_eval(n, in, out, d, true);
}

/* axis defaults to 0 and may be negative; keepdims and select_last_index
 * (opset 12 on; absent before, so 0) are read generically. */
static int arg_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = NULL;
  int rc = onnx_input_rank(v, &x, d);
  if (rc) return rc;
  int64_t axis = 0;
  onnx_in_attr_int(v, "axis", &axis);
  if (axis < -x->ndim || axis >= x->ndim)
    return onnx_in_error(v, d, "attribute axis=%lld: must be in [%d, %d)", (long long)axis,
                         -x->ndim, x->ndim);
  if (axis < 0) axis += x->ndim;
  param_set_int(p, ARG_AXIS, axis);
  return TEQ_OK;
}

static int arg_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  onnx_out_attr_int(w, "axis", param_int(&n->params, ARG_AXIS));
  return TEQ_OK;
}

#define ARG_ROW_COMMON                                                                     \
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,                            \
  .params = arg_params, .n_params = 3, .flags = OPF_INT64_OUT, .infer_shape = arg_infer,   \
  .eval_f32 = arg_eval_f32, .eval_modp = arg_eval_modp, .onnx_read = arg_onnx_read,        \
  .onnx_write = arg_onnx_write

const OpDef op_def_argmax = {
  .kind = OP_ARGMAX, .name = "argmax", .onnx_op = "ArgMax", ARG_ROW_COMMON,
  .eval_cuda = CUDA_EVAL(argmax),
  .family = &fam_argmax,
};

const OpDef op_def_argmin = {
  .kind = OP_ARGMIN, .name = "argmin", .onnx_op = "ArgMin", ARG_ROW_COMMON,
  .eval_cuda = CUDA_EVAL(argmin),
  .family = &fam_argmin,
};
