/* norm.c: normalizations computed from the data itself: layer_norm (ONNX
 * LayerNormalization), instance_norm (InstanceNormalization) and lrn (LRN,
 * AlexNet's local response normalization).
 * layer_norm and instance_norm standardize rows -- the trailing axes from
 * `axis` on, or each (n, c) plane -- to zero mean and unit variance, then
 * scale and shift; one routine per mode serves both, with the mean and
 * variance in double. lrn divides each element by a power of the sum of
 * squares over a window of neighbouring channels.
 * Z_p: means, variances and window sums are exact (a mean is sum *
 * inv(count)); each row puts its own polynomial stand-in s where 1/sqrt
 * (lrn: the power) is, applied to the variance (window sum) plus a residue
 * hashed from the parameters, so that rows differing only in epsilon or
 * alpha fingerprint apart. BatchNormalization, which uses stored
 * statistics, is in conv.c. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

/* ---- shared ---- */

/* Every input and the output in the mode's dtype: an int64 tensor is
 * refused rather than read as floats. */
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

static int64_t prod_dims(const Shape *s, int from, int to) {
  int64_t p = 1;
  for (int i = from; i < to; i++) p *= s->d[i];
  return p;
}

static int out_of_memory(const Node *n, Diag *d) {
  op_error(n, d, "out of memory");
  return TEQ_ERR_NOMEM;
}

/* The stand-ins, each unlike every other row's. */
static uint32_t standin_layer_norm(uint32_t x) { return modp_poly3(x, 1, 9, 4, 1); }
static uint32_t standin_instance_norm(uint32_t x) { return modp_poly3(x, 1, 1, 11, 2); }
static uint32_t standin_lrn(uint32_t x) { return modp_poly3(x, 1, 10, 3, 6); }

/* The parameters as a residue, added to the stand-in's argument. */
static uint32_t params_shift(const Node *n) {
  return modp_reduce(hash_bytes(0x6e6f726d, &n->params, sizeof n->params));
}

/* Where a scale or bias is applied: per position in the row (stride 1,
 * layer_norm) or one value per row, repeating every `period` rows
 * (instance_norm's channels). */
typedef struct Affine {
  const void *scale, *bias; /* bias may be NULL */
  int64_t period;           /* 0: per position */
} Affine;

/* Standardizes each of `rows` rows of len values and applies a. */
static void norm_rows_f32(const float *x, float *y, int64_t rows, int64_t len, double eps,
                          const Affine *a) {
  const float *scale = a->scale, *bias = a->bias;
  for (int64_t r = 0; r < rows; r++, x += len, y += len) {
    double s = 0, v = 0;
    for (int64_t j = 0; j < len; j++) s += x[j];
    double mean = s / (double)len;
    for (int64_t j = 0; j < len; j++) v += (x[j] - mean) * (x[j] - mean);
    double inv = 1.0 / sqrt(v / (double)len + eps);
    int64_t at = a->period ? r % a->period : 0, step = a->period ? 0 : 1;
    for (int64_t j = 0; j < len; j++) {
      float z = (float)((x[j] - mean) * inv) * scale[at + j * step];
      y[j] = bias ? z + bias[at + j * step] : z;
    }
  }
}

/* (x - mean) s(var + shift) scale + bias, with the exact mean and variance. */
static void norm_rows_modp(const uint32_t *x, uint32_t *y, int64_t rows, int64_t len,
                           uint32_t (*s)(uint32_t), uint32_t shift, const Affine *a) {
  const uint32_t *scale = a->scale, *bias = a->bias;
  uint32_t inv_len = modp_inv(modp_from_int(len));
  for (int64_t r = 0; r < rows; r++, x += len, y += len) {
    uint32_t sum = 0, var = 0;
    for (int64_t j = 0; j < len; j++) sum = modp_add(sum, x[j]);
    uint32_t mean = modp_mul(sum, inv_len);
    for (int64_t j = 0; j < len; j++) {
      uint32_t t = modp_sub(x[j], mean);
      var = modp_add(var, modp_mul(t, t));
    }
    uint32_t k = s(modp_add(modp_mul(var, inv_len), shift));
    int64_t at = a->period ? r % a->period : 0, step = a->period ? 0 : 1;
    for (int64_t j = 0; j < len; j++) {
      uint32_t z = modp_mul(modp_mul(modp_sub(x[j], mean), k), scale[at + j * step]);
      y[j] = bias ? modp_add(z, bias[at + j * step]) : z;
    }
  }
}

/* ---- layer_norm ---- */

/* axis: the first normalized axis, stored non-negative (ONNX's default -1,
 * the last axis, becomes rank - 1 on import). */
static const OpParam layer_norm_params[] = {
  [LN_AXIS] = {.name = "axis", .type = PARAM_INT, .def = 1, .lo = 0, .hi = TEQ_MAX_DIMS - 1},
  [LN_EPSILON] = {.name = "epsilon", .type = PARAM_FLOAT, .fdef = 1e-5f, .onnx_attr = "epsilon"},
};

/* Why scale or bias shape s cannot apply to input shape x normalized from
 * axis on, or NULL: it must broadcast to x without growing it, and vary only
 * along the normalized axes (Teq keeps one value per position in a row). */
static const char *affine_problem(const Shape *x, const Shape *s, int64_t axis) {
  Shape t;
  if (shape_broadcast(x, s, &t, NULL) != TEQ_OK || !shape_equal(&t, x))
    return "does not broadcast to input 0";
  for (int k = 0; k < s->ndim; k++)
    if (k + x->ndim - s->ndim < axis && s->d[k] != 1)
      return "varies along an axis before the normalized ones";
  return NULL;
}

static int layer_norm_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  int64_t axis = param_int(&n->params, LN_AXIS);
  char s[SHAPE_STR_MAX], t[SHAPE_STR_MAX];
  if (axis >= in[0].ndim)
    return op_error(n, d, "axis=%lld: input 0 has shape %s (rank %d)", (long long)axis,
                    shape_format(&in[0], s, sizeof s), in[0].ndim);
  for (int i = 1; i < n->n_in; i++) {
    const char *why = affine_problem(&in[0], &in[i], axis);
    if (why)
      return op_error(n, d, "axis=%lld: input %d (%s) has shape %s, which %s %s", (long long)axis,
                      i, i == 1 ? "scale" : "bias", shape_format(&in[i], s, sizeof s), why,
                      shape_format(&in[0], t, sizeof t));
  }
  out[0] = in[0];
  return TEQ_OK;
}

/* The 4-byte elements of t (scale or bias, checked by affine_problem)
 * spread over one row of x normalized from axis on: len values. */
static void spread_over_row(const Tensor *t, const Shape *x, int axis, uint32_t *dst) {
  int r = x->ndim, off = r - t->shape.ndim;
  int64_t st[TEQ_MAX_DIMS], c[TEQ_MAX_DIMS] = {0}, len = prod_dims(x, axis, r);
  shape_strides(&t->shape, st);
  const uint32_t *src = t->data;
  for (int64_t j = 0; j < len; j++) {
    int64_t at = 0;
    for (int k = axis; k < r; k++)
      if (k >= off && t->shape.d[k - off] != 1) at += c[k] * st[k - off];
    dst[j] = src[at];
    for (int k = r - 1; k >= axis && ++c[k] == x->d[k]; k--) c[k] = 0;
  }
}

static int layer_norm_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d,
                           bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc || tensor_numel(out[0]) == 0) return rc;
  const Shape *x = &in[0]->shape;
  int axis = (int)param_int(&n->params, LN_AXIS);
  int64_t rows = prod_dims(x, 0, axis), len = prod_dims(x, axis, x->ndim);
  uint32_t *buf = malloc((size_t)(2 * len) * sizeof *buf);
  if (!buf) return out_of_memory(n, d);
  spread_over_row(in[1], x, axis, buf);
  if (n->n_in > 2) spread_over_row(in[2], x, axis, buf + len);
  Affine a = {buf, n->n_in > 2 ? buf + len : NULL, 0};
  if (modp)
    norm_rows_modp(in[0]->data, out[0]->data, rows, len, op_def(n->kind)->modp_standin,
                   params_shift(n), &a);
  else
    norm_rows_f32(in[0]->data, out[0]->data, rows, len, param_float(&n->params, LN_EPSILON), &a);
  free(buf);
  return TEQ_OK;
}

static int layer_norm_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return layer_norm_eval(n, in, out, d, false);
}

static int layer_norm_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return layer_norm_eval(n, in, out, d, true);
}

/* Only Y: the Mean and InvStdDev outputs (for training) are refused. The
 * computation is in float32 or better, so stash_type may be float or
 * double. */
static int layer_norm_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t axis = -1, stash = 1;
  if (onnx_in_n_outputs(v) > 1)
    return onnx_in_unsupported(v, d, "the Mean and InvStdDev outputs are not supported");
  onnx_in_attr_int(v, "stash_type", &stash);
  if (stash != 1 && stash != 11)
    return onnx_in_unsupported(v, d, "stash_type=%lld: only 1 (float) and 11 (double) are "
                               "supported", (long long)stash);
  onnx_in_attr_int(v, "axis", &axis);
  const Shape *x = onnx_in_input_shape(v, 0);
  int r = x && shape_is_known(x) ? x->ndim : -1;
  if (r < 0 && axis < 0)
    return onnx_in_unsupported(v, d, "attribute axis=%lld with input 0 of unknown rank",
                               (long long)axis);
  if (r < 0) r = TEQ_MAX_DIMS; /* the widest range any input could allow */
  if (axis < -r || axis >= r)
    return onnx_in_error(v, d, "attribute axis=%lld: must be in [%d, %d)", (long long)axis, -r, r);
  if (axis < 0) axis += r;
  for (int i = 1; i < 3 && x && shape_is_known(x); i++) {
    const Shape *s = onnx_in_input_shape(v, i);
    const char *why = s ? affine_problem(x, s, axis) : NULL;
    char a[SHAPE_STR_MAX], b[SHAPE_STR_MAX];
    if (why)
      return onnx_in_unsupported(v, d, "input %d has shape %s, which %s %s", i,
                                 shape_format(s, a, sizeof a), why, shape_format(x, b, sizeof b));
  }
  param_set_int(p, LN_AXIS, axis);
  return TEQ_OK;
}

/* LayerNormalization was born at opset 17. Below it, a layer norm is
 * written out as PyTorch writes it there, which import fuses back
 * (passes.c), so a model keeps its opset: with m = ReduceMean(x) and
 * c = x - m over the normalized axes, c / Sqrt(ReduceMean(c^2) + epsilon)
 * * scale + bias. */
static int layer_norm_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  int64_t axis = param_int(&n->params, LN_AXIS);
  if (onnx_out_opset(w) >= 17) {
    onnx_out_attr_int(w, "axis", axis);
    return TEQ_OK;
  }
  const Shape *x = onnx_out_input_shape(w, 0);
  if (!x || !shape_is_known(x)) return op_error(n, d, "input 0 of unknown rank");
  int64_t axes[TEQ_MAX_DIMS];
  int n_axes = 0;
  for (int64_t k = axis; k < x->ndim; k++) axes[n_axes++] = k;
  Tensor *two = op_scalar_f32(2), *eps = op_scalar_f32((float)param_float(&n->params, LN_EPSILON));
  if (!two || !eps) {
    tensor_unref(two);
    tensor_unref(eps);
    return op_error(n, d, "out of memory");
  }
  onnx_out_set_op_type(w, "ReduceMean"); /* the chain's node 0: m */
  onnx_out_drop_attr(w, "epsilon");
  onnx_out_attr_ints(w, "axes", axes, n_axes);
  onnx_out_keep_inputs(w, 1);
  onnx_out_then_operands(w, "Sub", ONNX_OUT_INPUT(0), ONNX_OUT_STEP(0)); /* 1: c */
  onnx_out_then_binary(w, "Pow", two);
  onnx_out_then_unary(w, "ReduceMean");
  onnx_out_then_attr_ints(w, "axes", axes, n_axes);
  onnx_out_then_binary(w, "Add", eps);
  onnx_out_then_unary(w, "Sqrt"); /* 5 */
  onnx_out_then_operands(w, "Div", ONNX_OUT_STEP(1), ONNX_OUT_STEP(5));
  onnx_out_then_operands(w, "Mul", ONNX_OUT_STEP(6), ONNX_OUT_INPUT(1));
  if (n->n_in > 2) onnx_out_then_operands(w, "Add", ONNX_OUT_STEP(7), ONNX_OUT_INPUT(2));
  tensor_unref(two);
  tensor_unref(eps);
  return TEQ_OK;
}

const OpDef op_def_layer_norm = {
  .kind = OP_LAYER_NORM, .name = "layer_norm", .onnx_op = "LayerNormalization",
  .n_in_min = 2, .n_in_max = 3, .n_out_min = 1, .n_out_max = 1,
  .params = layer_norm_params, .n_params = 2,
  .flags = OPF_NONLINEAR,
  .infer_shape = layer_norm_infer,
  .eval_f32 = layer_norm_eval_f32, .eval_modp = layer_norm_eval_modp,
  .eval_cuda = CUDA_EVAL(layer_norm),
  .modp_standin = standin_layer_norm,
  .onnx_read = layer_norm_onnx_read, .onnx_write = layer_norm_onnx_write,
};

/* ---- instance_norm ---- */

static const OpParam instance_norm_params[] = {
  [IN_EPSILON] = {.name = "epsilon", .type = PARAM_FLOAT, .fdef = 1e-5f, .onnx_attr = "epsilon"},
};

/* input [N, C, D1, ...], scale and bias [C]. */
static int instance_norm_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char s[SHAPE_STR_MAX], t[SHAPE_STR_MAX];
  if (in[0].ndim < 3)
    return op_error(n, d, "input 0 has shape %s: rank 3 or more (N, C, D1, ...) expected",
                    shape_format(&in[0], s, sizeof s));
  for (int i = 1; i < 3; i++)
    if (in[i].ndim != 1 || in[i].d[0] != in[0].d[1])
      return op_error(n, d, "input %d (%s) has shape %s, expected [%lld] for input 0 %s", i,
                      i == 1 ? "scale" : "bias", shape_format(&in[i], s, sizeof s),
                      (long long)in[0].d[1], shape_format(&in[0], t, sizeof t));
  out[0] = in[0];
  return TEQ_OK;
}

static int instance_norm_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d,
                              bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc || tensor_numel(out[0]) == 0) return rc;
  const Shape *x = &in[0]->shape;
  int64_t rows = x->d[0] * x->d[1], len = prod_dims(x, 2, x->ndim);
  Affine a = {in[1]->data, in[2]->data, x->d[1]};
  if (modp)
    norm_rows_modp(in[0]->data, out[0]->data, rows, len, op_def(n->kind)->modp_standin,
                   params_shift(n), &a);
  else
    norm_rows_f32(in[0]->data, out[0]->data, rows, len, param_float(&n->params, 0), &a);
  return TEQ_OK;
}

static int instance_norm_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out,
                                  Diag *d) {
  return instance_norm_eval(n, in, out, d, false);
}

static int instance_norm_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out,
                                   Diag *d) {
  return instance_norm_eval(n, in, out, d, true);
}

const OpDef op_def_instance_norm = {
  .kind = OP_INSTANCE_NORM, .name = "instance_norm", .onnx_op = "InstanceNormalization",
  .n_in_min = 3, .n_in_max = 3, .n_out_min = 1, .n_out_max = 1,
  .params = instance_norm_params, .n_params = 1,
  .flags = OPF_NONLINEAR,
  .infer_shape = instance_norm_infer,
  .eval_f32 = instance_norm_eval_f32, .eval_modp = instance_norm_eval_modp,
  .eval_cuda = CUDA_EVAL(instance_norm),
  .modp_standin = standin_instance_norm,
};

/* ---- lrn ---- */

static const OpParam lrn_params[] = {
  [LRN_SIZE] = {.name = "size", .type = PARAM_INT, .def = 1, .lo = 1, .hi = 1 << 20,
                .onnx_attr = "size"},
  [LRN_ALPHA] = {.name = "alpha", .type = PARAM_FLOAT, .fdef = 1e-4f, .onnx_attr = "alpha"},
  [LRN_BETA] = {.name = "beta", .type = PARAM_FLOAT, .fdef = 0.75, .onnx_attr = "beta"},
  [LRN_BIAS] = {.name = "bias", .type = PARAM_FLOAT, .fdef = 1.0, .onnx_attr = "bias"},
};

static int lrn_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char s[SHAPE_STR_MAX];
  if (in[0].ndim < 3)
    return op_error(n, d, "input 0 has shape %s: rank 3 or more (N, C, D1, ...) expected",
                    shape_format(&in[0], s, sizeof s));
  out[0] = in[0];
  return TEQ_OK;
}

/* The channel window of c: c - floor((size-1)/2) .. c + ceil((size-1)/2),
 * clipped to [0, chans). */
static void lrn_window(int64_t c, int64_t size, int64_t chans, int64_t *lo, int64_t *hi) {
  *lo = c - (size - 1) / 2 < 0 ? 0 : c - (size - 1) / 2;
  *hi = c + size / 2 >= chans ? chans - 1 : c + size / 2;
}

/* One image x of chans planes: y = x / (bias + alpha/size sq)^beta, sq the
 * window's sum of squares at the same position, accumulated in double. */
static void lrn_image_f32(const Params *p, const float *x, float *y, int64_t chans, int64_t plane,
                          double *sq) {
  int64_t size = param_int(p, LRN_SIZE), lo, hi;
  double alpha = param_float(p, LRN_ALPHA) / (double)size, beta = param_float(p, LRN_BETA),
         bias = param_float(p, LRN_BIAS);
  for (int64_t c = 0; c < chans; c++) {
    lrn_window(c, size, chans, &lo, &hi);
    memset(sq, 0, (size_t)plane * sizeof *sq);
    for (int64_t k = lo; k <= hi; k++)
      for (int64_t j = 0; j < plane; j++) sq[j] += (double)x[k * plane + j] * x[k * plane + j];
    for (int64_t j = 0; j < plane; j++)
      y[c * plane + j] = (float)(x[c * plane + j] / pow(bias + alpha * sq[j], beta));
  }
}

/* Z_p: y = x s(sq + shift). */
static void lrn_image_modp(const Node *n, const uint32_t *x, uint32_t *y, int64_t chans,
                           int64_t plane, uint32_t *sq) {
  int64_t size = param_int(&n->params, LRN_SIZE), lo, hi;
  uint32_t shift = params_shift(n), (*s)(uint32_t) = op_def(n->kind)->modp_standin;
  for (int64_t c = 0; c < chans; c++) {
    lrn_window(c, size, chans, &lo, &hi);
    memset(sq, 0, (size_t)plane * sizeof *sq);
    for (int64_t k = lo; k <= hi; k++)
      for (int64_t j = 0; j < plane; j++)
        sq[j] = modp_add(sq[j], modp_mul(x[k * plane + j], x[k * plane + j]));
    for (int64_t j = 0; j < plane; j++)
      y[c * plane + j] = modp_mul(x[c * plane + j], s(modp_add(sq[j], shift)));
  }
}

static int lrn_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d, bool modp) {
  int rc = check_dtypes(n, in, out, modp ? DT_MODP : DT_F32, d);
  if (rc || tensor_numel(out[0]) == 0) return rc;
  const Shape *x = &in[0]->shape;
  int64_t chans = x->d[1], plane = prod_dims(x, 2, x->ndim), image = chans * plane;
  void *sq = malloc((size_t)plane * (modp ? sizeof(uint32_t) : sizeof(double)));
  if (!sq) return out_of_memory(n, d);
  for (int64_t b = 0; b < x->d[0]; b++) {
    if (modp)
      lrn_image_modp(n, (const uint32_t *)in[0]->data + b * image,
                     (uint32_t *)out[0]->data + b * image, chans, plane, sq);
    else
      lrn_image_f32(&n->params, (const float *)in[0]->data + b * image,
                    (float *)out[0]->data + b * image, chans, plane, sq);
  }
  free(sq);
  return TEQ_OK;
}

static int lrn_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return lrn_eval(n, in, out, d, false);
}

static int lrn_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return lrn_eval(n, in, out, d, true);
}

static int lrn_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t size;
  (void)p;
  if (!onnx_in_attr_int(v, "size", &size)) return onnx_in_error(v, d, "attribute size is missing");
  return TEQ_OK;
}

const OpDef op_def_lrn = {
  .kind = OP_LRN, .name = "lrn", .onnx_op = "LRN",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = lrn_params, .n_params = 4,
  .flags = OPF_NONLINEAR,
  .infer_shape = lrn_infer, .eval_f32 = lrn_eval_f32, .eval_modp = lrn_eval_modp,
  .eval_cuda = CUDA_EVAL(lrn),
  .modp_standin = standin_lrn,
  .onnx_read = lrn_onnx_read,
};
