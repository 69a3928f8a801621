/* constants.c: TASO's constant tensors (Table 1): C_pool, I_conv, I_matmul
 * and I_ewmul. They take no inputs; their shape comes from parameters, so a
 * rewrite rule can introduce one (avgpool -> conv with const_pool) without
 * a weight in the graph. The invariant each must keep, in float32 and in
 * Z_p alike: conv2d(x, const_pool, groups=c) equals avgpool with
 * count_include_pad=1, conv2d(x, const_iconv) with "same" pads equals x,
 * matmul(x, const_imm) equals x, and ewmul(x, const_one) equals x.
 * There is no ONNX operator for them: export writes the tensor a kernel
 * produces as an initializer (runtime/onnx/export.c). */
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

#define CHANNELS_MAX (INT64_C(1) << 16)
#define KERNEL_MAX 64

/* ---- const_pool(channels, kh, kw): [c, 1, kh, kw] of 1/(kh*kw) ---- */

static const OpParam pool_params[] = {
  {.name = "channels", .type = PARAM_INT, .def = 1, .lo = 1, .hi = CHANNELS_MAX},
  {.name = "kh", .type = PARAM_INT, .def = 3, .lo = 1, .hi = KERNEL_MAX},
  {.name = "kw", .type = PARAM_INT, .def = 3, .lo = 1, .hi = KERNEL_MAX},
};

/* const_pool and const_iconv share parameters: (channels, kh, kw). */
static void kernel_dims(const Node *n, int64_t *c, int64_t *kh, int64_t *kw) {
  *c = param_int(&n->params, 0);
  *kh = param_int(&n->params, 1);
  *kw = param_int(&n->params, 2);
}

static int pool_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)in; (void)d;
  int64_t c, kh, kw;
  kernel_dims(n, &c, &kh, &kw);
  out[0] = shape_make(4, (int64_t[]){c, 1, kh, kw});
  return TEQ_OK;
}

static int pool_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in; (void)d;
  int64_t c, kh, kw;
  kernel_dims(n, &c, &kh, &kw);
  float v = 1.0f / (float)(kh * kw);
  float *y = out[0]->data;
  for (int64_t i = 0; i < c * kh * kw; i++) y[i] = v;
  return TEQ_OK;
}

static int pool_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in; (void)d;
  int64_t c, kh, kw;
  kernel_dims(n, &c, &kh, &kw);
  /* The same inverse avgpool multiplies by, so the two agree exactly. */
  uint32_t v = modp_inv((uint32_t)(kh * kw));
  uint32_t *y = out[0]->data;
  for (int64_t i = 0; i < c * kh * kw; i++) y[i] = v;
  return TEQ_OK;
}

const OpDef op_def_const_pool = {
  .kind = OP_CONST_POOL, .name = "const_pool", .axiom_name = "const_pool",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .params = pool_params, .n_params = 3,
  .flags = OPF_SOURCE,
  .infer_shape = pool_infer,
  .eval_f32 = pool_eval_f32, .eval_modp = pool_eval_modp,
};

/* ---- const_iconv(channels, kh, kw): [c, c, kh, kw] identity kernel ---- */

static int iconv_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)in;
  int64_t c, kh, kw;
  kernel_dims(n, &c, &kh, &kw);
  /* An even kernel has no centre tap, so no "same" conv with it is x. */
  if (kh % 2 == 0 || kw % 2 == 0)
    return op_error(n, d, "kh=%lld kw=%lld: the identity kernel needs odd sizes",
                    (long long)kh, (long long)kw);
  out[0] = shape_make(4, (int64_t[]){c, c, kh, kw});
  return TEQ_OK;
}

/* Writes `one` at the centre of kernel (i, i); the output is zeroed. */
static void iconv_fill(const Node *n, void *data, size_t elem, const void *one) {
  int64_t c, kh, kw;
  kernel_dims(n, &c, &kh, &kw);
  int64_t centre = (kh / 2) * kw + kw / 2;
  for (int64_t i = 0; i < c; i++)
    memcpy((char *)data + (size_t)((i * c + i) * kh * kw + centre) * elem, one, elem);
}

static int iconv_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in; (void)d;
  float one = 1.0f;
  memset(out[0]->data, 0, tensor_bytes(out[0])); /* float outputs come uninitialized */
  iconv_fill(n, out[0]->data, sizeof one, &one);
  return TEQ_OK;
}

static int iconv_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in; (void)d;
  uint32_t one = 1;
  iconv_fill(n, out[0]->data, sizeof one, &one);
  return TEQ_OK;
}

const OpDef op_def_const_iconv = {
  .kind = OP_CONST_ICONV, .name = "const_iconv", .axiom_name = "const_iconv",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .params = pool_params, .n_params = 3,
  .flags = OPF_SOURCE,
  .infer_shape = iconv_infer,
  .eval_f32 = iconv_eval_f32, .eval_modp = iconv_eval_modp,
};

/* ---- const_imm(n): [n, n] identity matrix ---- */

static const OpParam imm_params[] = {
  {.name = "n", .type = PARAM_INT, .def = 1, .lo = 1, .hi = CHANNELS_MAX},
};

static int imm_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)in; (void)d;
  int64_t k = param_int(&n->params, 0);
  out[0] = shape_make(2, (int64_t[]){k, k});
  return TEQ_OK;
}

static int imm_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in; (void)d;
  int64_t k = param_int(&n->params, 0);
  float *y = out[0]->data;
  memset(y, 0, tensor_bytes(out[0])); /* float outputs come uninitialized */
  for (int64_t i = 0; i < k; i++) y[i * k + i] = 1.0f;
  return TEQ_OK;
}

static int imm_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in; (void)d;
  int64_t k = param_int(&n->params, 0);
  uint32_t *y = out[0]->data;
  for (int64_t i = 0; i < k; i++) y[i * k + i] = 1;
  return TEQ_OK;
}

const OpDef op_def_const_imm = {
  .kind = OP_CONST_IMM, .name = "const_imm", .axiom_name = "const_imm",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .params = imm_params, .n_params = 1,
  .flags = OPF_SOURCE,
  .infer_shape = imm_infer,
  .eval_f32 = imm_eval_f32, .eval_modp = imm_eval_modp,
};

/* ---- const_one(shape): all ones, any shape (TASO's I_ewmul) ---- */

static const OpParam one_params[] = {
  /* len 0: from 0 (a scalar) to TEQ_MAX_DIMS extents. */
  {.name = "shape", .type = PARAM_INTS, .len = 0, .def = 1, .lo = 1, .hi = INT64_C(1) << 24},
};

static int one_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)in;
  const ParamValue *v = &n->params.v[0];
  if (v->n < 0 || v->n > TEQ_MAX_DIMS)
    return op_error(n, d, "shape has %d extents: at most %d", (int)v->n, TEQ_MAX_DIMS);
  for (int i = 0; i < v->n; i++)
    if (v->i[i] < 1)
      return op_error(n, d, "shape: extent %d is %lld: must be >= 1", i, (long long)v->i[i]);
  out[0] = shape_make(v->n, v->i);
  return TEQ_OK;
}

static int one_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)n; (void)in; (void)d;
  float *y = out[0]->data;
  for (int64_t i = 0, k = tensor_numel(out[0]); i < k; i++) y[i] = 1.0f;
  return TEQ_OK;
}

static int one_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)n; (void)in; (void)d;
  uint32_t *y = out[0]->data;
  for (int64_t i = 0, k = tensor_numel(out[0]); i < k; i++) y[i] = 1;
  return TEQ_OK;
}

const OpDef op_def_const_one = {
  .kind = OP_CONST_ONE, .name = "const_one", .axiom_name = "const_one",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .params = one_params, .n_params = 1,
  .flags = OPF_SOURCE,
  .infer_shape = one_infer,
  .eval_f32 = one_eval_f32, .eval_modp = one_eval_modp,
};
