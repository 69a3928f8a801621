/* reduce.c: operators that combine elements along axes: softmax, and
 * reduce_mean, reduce_sum, reduce_max.
 * The reductions share one walk over the input in memory order. After
 * neighbouring dimensions are merged, the innermost run is either folded
 * into one accumulator (reducing the last axes) or folded element by element
 * into an output row (keeping them), so both run contiguously.
 * Z_p: sum is exact, mean is sum * inv(count), max compares residues as the
 * integers 0..p-1; softmax is s(x_i) * inv(sum_j s(x_j)) with its own
 * polynomial stand-in s (inv(0) = 0 by modp_inv's convention).
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

enum { RED_AXES, RED_KEEPDIMS };

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

/* fold_run: *acc = op(*acc, x[0..n)); fold_row: acc[j] = op(acc[j], x[j]). */
typedef struct Reducer {
  void (*fold_run)(const void *x, int64_t n, void *acc);
  void (*fold_row)(const void *x, int64_t n, void *acc);
} Reducer;

/* In double, since a long run summed in float32 loses digits; four partial
 * sums, since one would wait on each addition's latency. */
static void sum_run_f32(const void *px, int64_t n, void *acc) {
  const float *x = px;
  double s[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int k = 0; k < 4; k++) s[k] += x[i + k];
  for (; i < n; i++) s[0] += x[i];
  *(float *)acc += (float)((s[0] + s[1]) + (s[2] + s[3]));
}

static void sum_row_f32(const void *px, int64_t n, void *pacc) {
  const float *x = px;
  float *acc = pacc;
  for (int64_t i = 0; i < n; i++) acc[i] += x[i];
}

/* The larger of m and x, NaN if either is: a select, where fmaxf would be
 * a libm call that also drops NaNs. */
static inline float max_nan(float m, float x) { return x > m || x != x ? x : m; }

static void max_run_f32(const void *px, int64_t n, void *acc) {
  const float *x = px;
  float m = *(float *)acc;
  for (int64_t i = 0; i < n; i++) m = max_nan(m, x[i]);
  *(float *)acc = m;
}

static void max_row_f32(const void *px, int64_t n, void *pacc) {
  const float *x = px;
  float *acc = pacc;
  for (int64_t i = 0; i < n; i++) acc[i] = max_nan(acc[i], x[i]);
}

static void sum_run_modp(const void *px, int64_t n, void *acc) {
  const uint32_t *x = px;
  uint64_t s = *(uint32_t *)acc;
  for (int64_t i = 0; i < n; i++) {
    s += x[i];
    if ((i & 0xffffff) == 0xffffff) s = modp_reduce(s); /* stay far below 2^64 */
  }
  *(uint32_t *)acc = modp_reduce(s);
}

static void sum_row_modp(const void *px, int64_t n, void *pacc) {
  const uint32_t *x = px;
  uint32_t *acc = pacc;
  for (int64_t i = 0; i < n; i++) acc[i] = modp_add(acc[i], x[i]);
}

static void max_run_modp(const void *px, int64_t n, void *acc) {
  const uint32_t *x = px;
  uint32_t m = *(uint32_t *)acc;
  for (int64_t i = 0; i < n; i++) m = x[i] > m ? x[i] : m;
  *(uint32_t *)acc = m;
}

static void max_row_modp(const void *px, int64_t n, void *pacc) {
  const uint32_t *x = px;
  uint32_t *acc = pacc;
  for (int64_t i = 0; i < n; i++) acc[i] = x[i] > acc[i] ? x[i] : acc[i];
}

static const Reducer sum_f32 = {sum_run_f32, sum_row_f32};
static const Reducer max_f32 = {max_run_f32, max_row_f32};
static const Reducer sum_modp = {sum_run_modp, sum_row_modp};
static const Reducer max_modp = {max_run_modp, max_row_modp};

/* What distinguishes the three reduction rows, in their .family. */
typedef struct ReduceFamily {
  const Reducer *f32, *modp;
  bool is_max;       /* float32 outputs start at -inf (Z_p residues at 0) */
  bool is_mean;      /* divide by the count afterwards */
  int axes_input_since; /* opset from which ONNX gives axes as input 1 */
} ReduceFamily;

static const ReduceFamily fam_sum = {&sum_f32, &sum_modp, false, false, 13};
static const ReduceFamily fam_mean = {&sum_f32, &sum_modp, false, true, 18};
static const ReduceFamily fam_max = {&max_f32, &max_modp, true, false, 18};

/* Folds all of x into out, which holds the reduction's identity. */
static void reduce_walk(const ReducePlan *pl, const char *x, char *out, const Reducer *r) {
  const int64_t es = 4; /* float32 and Z_p residues alike */
  int in = pl->nd - 1;
  int64_t n = pl->ext[in], outer = 1, idx[TEQ_MAX_DIMS] = {0}, po = 0;
  for (int i = 0; i < in; i++) outer *= pl->ext[i];
  for (int64_t k = 0; k < outer; k++) {
    if (pl->ost[in] == 0) r->fold_run(x + k * n * es, n, out + po * es);
    else r->fold_row(x + k * n * es, n, out + po * es);
    for (int i = in - 1; i >= 0; i--) { /* odometer step */
      po += pl->ost[i];
      if (++idx[i] < pl->ext[i]) break;
      po -= pl->ost[i] * pl->ext[i];
      idx[i] = 0;
    }
  }
}

/* Runs the reduction of n's row; returns the count of elements folded
 * into each output (for the mean). */
static int64_t reduce_run(const Node *n, const Tensor *x, Tensor *y, bool modp) {
  const ReduceFamily *f = op_def(n->kind)->family;
  bool mask[TEQ_MAX_DIMS];
  reduce_mask(n, &x->shape, mask, NULL); /* checked by shape inference */
  int64_t count = 1, ny = tensor_numel(y);
  for (int i = 0; i < x->shape.ndim; i++)
    if (mask[i]) count *= x->shape.d[i];
  if (f->is_max && !modp)
    for (int64_t i = 0; i < ny; i++) ((float *)y->data)[i] = -INFINITY;
  if (tensor_numel(x) == 0) return count;
  ReducePlan pl;
  reduce_plan(&x->shape, mask, &pl);
  reduce_walk(&pl, x->data, y->data, modp ? f->modp : f->f32);
  return count;
}

static bool is_mean(const Node *n) {
  return ((const ReduceFamily *)op_def(n->kind)->family)->is_mean;
}

static int reduce_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int rc = check_dtypes(n, in, out, DT_F32, d);
  if (rc) return rc;
  int64_t count = reduce_run(n, in[0], out[0], false);
  if (is_mean(n)) {
    float *y = out[0]->data, scale = count ? 1.0f / (float)count : NAN;
    for (int64_t i = 0; i < tensor_numel(out[0]); i++) y[i] *= scale;
  }
  return TEQ_OK;
}

static int reduce_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  int rc = check_dtypes(n, in, out, DT_MODP, d);
  if (rc) return rc;
  int64_t count = reduce_run(n, in[0], out[0], true);
  if (is_mean(n)) {
    uint32_t *y = out[0]->data, inv = modp_inv(modp_from_int(count));
    for (int64_t i = 0; i < tensor_numel(out[0]); i++) y[i] = modp_mul(y[i], inv);
  }
  return TEQ_OK;
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
  if (noop && k == 0) return onnx_in_unsupported(v, d, "noop_with_empty_axes=1 without axes");
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

/* Opset 13: ReduceSum's axes are an input, the others' an attribute. */
static int reduce_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const ParamValue *a = &n->params.v[RED_AXES];
  const ReduceFamily *f = op_def(n->kind)->family;
  if (a->n == 0) return TEQ_OK;
  if (f->axes_input_since > 13) {
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
  REDUCE_ROW_COMMON, .flags = OPF_MULTILINEAR, .family = &fam_mean,
};

const OpDef op_def_reduce_sum = {
  .kind = OP_REDUCE_SUM, .name = "reduce_sum", .onnx_op = "ReduceSum",
  REDUCE_ROW_COMMON, .flags = OPF_MULTILINEAR, .family = &fam_sum,
};

/* Non-linear, but a fixed map of the residues rather than a stand-in. */
const OpDef op_def_reduce_max = {
  .kind = OP_REDUCE_MAX, .name = "reduce_max", .onnx_op = "ReduceMax",
  REDUCE_ROW_COMMON, .flags = 0, .family = &fam_max,
};

/* ---- softmax ---- */

static const OpParam softmax_params[] = {
  {.name = "axis", .type = PARAM_INT, .def = 1, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
};

/* The stand-in s: x^2 + 19x + 23, unlike every element-wise one. */
static uint32_t standin_softmax(uint32_t x) {
  return modp_add(modp_mul(x, modp_add(x, 19)), 23);
}

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

static void softmax_line_modp(const uint32_t *x, uint32_t *y, int64_t len, int64_t st) {
  uint32_t sum = 0;
  for (int64_t i = 0; i < len; i++) {
    y[i * st] = standin_softmax(x[i * st]);
    sum = modp_add(sum, y[i * st]);
  }
  uint32_t inv = modp_inv(sum);
  for (int64_t i = 0; i < len; i++) y[i * st] = modp_mul(y[i * st], inv);
}

static int softmax_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d,
                        bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc) return rc;
  const Shape *x = &in[0]->shape;
  int axis = (int)param_int(&n->params, 0);
  int64_t outer = prod_dims(x, 0, axis), len = x->d[axis], inner = prod_dims(x, axis + 1, x->ndim);
  for (int64_t o = 0; o < outer; o++)
    for (int64_t i = 0; i < inner; i++) {
      int64_t base = o * len * inner + i;
      if (modp)
        softmax_line_modp((const uint32_t *)in[0]->data + base, (uint32_t *)out[0]->data + base,
                          len, inner);
      else
        softmax_line_f32((const float *)in[0]->data + base, (float *)out[0]->data + base, len,
                         inner);
    }
  return TEQ_OK;
}

static int softmax_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return softmax_eval(n, in, out, d, false);
}

static int softmax_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return softmax_eval(n, in, out, d, true);
}

/* Before opset 13 Softmax flattened the input to 2-D at axis and normalized
 * over all of x[axis:]; that equals Teq's one-axis softmax only when the
 * dimensions after axis are all 1. */
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
    return onnx_in_unsupported(v, d, "opset %d Softmax with axis=%lld normalizes over several "
                               "dimensions", onnx_in_opset(v), (long long)axis);
  param_set_int(p, 0, axis);
  return TEQ_OK;
}

static int softmax_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  onnx_out_attr_int(w, "axis", param_int(&n->params, 0));
  return TEQ_OK;
}

const OpDef op_def_softmax = {
  .kind = OP_SOFTMAX, .name = "softmax", .onnx_op = "Softmax",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = softmax_params, .n_params = 1,
  .flags = OPF_NONLINEAR,
  .infer_shape = softmax_infer, .eval_f32 = softmax_eval_f32, .eval_modp = softmax_eval_modp,
  .modp_standin = standin_softmax,
  .onnx_read = softmax_onnx_read, .onnx_write = softmax_onnx_write,
};
