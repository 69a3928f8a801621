/* pool3d.c: ONNX MaxPool and AveragePool over three spatial axes, the
 * pools of video models (torchvision's S3D): X [N, C, D, H, W] to
 * [N, C, od, oh, ow]. The 2-D rows (pool.c) read every MaxPool and
 * AveragePool and hand one of three spatial axes to these
 * (onnx_in_as_kind).
 * Extents, windows and divisors are pool.c's, one axis more: floor((in +
 * pads - dilated kernel) / stride) + 1, or with ceil_mode the ceiling
 * less a last window that would start in the end padding; a pad narrower
 * than the dilated kernel; an average over the window clipped to the
 * input, or with count_include_pad to the explicit padding. An empty
 * window (only with dilation) gives the lowest float for a max, 0 for an
 * average. The float32 kernel is pool3_at_f32 (family.h) at every output,
 * and the GPU's kernel (runtime/cuda/pool.cu) runs the same function, so
 * the two agree to the bit.
 * Z_p as in pool.c: a max compares residues as integers, an average is
 * the sum times the inverse of the divisor. No rule and no PET mutation
 * knows these rows: the search leaves them as they are. */
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

int pool3_geom(const Node *n, const Shape *x, Pool3Geom *g, Diag *d) {
  const Params *p = &n->params;
  char sx[SHAPE_STR_MAX];
  if (x->ndim != 5)
    return op_error(n, d, "input X %s: expected [N, C, D, H, W]", shape_format(x, sx, sizeof sx));
  for (int i = 0; i < 5; i++)
    if (x->d[i] < 1)
      return op_error(n, d, "input X %s: empty dimension", shape_format(x, sx, sizeof sx));
  g->is_max = n->kind == OP_MAXPOOL3D;
  g->include_pad = !g->is_max && param_int(p, AVG_COUNT_PAD);
  g->planes = x->d[0] * x->d[1];
  bool ceil_mode = param_int(p, POOL_CEIL) != 0;
  for (int a = 0; a < 3; a++) {
    g->in[a] = x->d[2 + a];
    g->k[a] = p->v[POOL_KERNEL].i[a], g->s[a] = p->v[POOL_STRIDE].i[a];
    g->dl[a] = g->is_max ? p->v[POOL_DILATION].i[a] : 1;
    g->p0[a] = p->v[POOL_PADS].i[a], g->p1[a] = p->v[POOL_PADS].i[3 + a];
    int64_t extent = (g->k[a] - 1) * g->dl[a] + 1;
    if (g->p0[a] >= extent || g->p1[a] >= extent)
      return op_error(n, d, "pads on axis %d: each must be smaller than the kernel extent %lld",
                      2 + a, (long long)extent);
    int64_t span = g->in[a] + g->p0[a] + g->p1[a] - extent;
    if (span < 0)
      return op_error(n, d, "kernel=(%lld %lld %lld): larger than the padded input",
                      (long long)g->k[0], (long long)g->k[1], (long long)g->k[2]);
    g->out[a] = (ceil_mode ? span + g->s[a] - 1 : span) / g->s[a] + 1;
    if (ceil_mode && (g->out[a] - 1) * g->s[a] >= g->in[a] + g->p0[a]) g->out[a]--;
  }
  return TEQ_OK;
}

static int pool3d_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  Pool3Geom g = {0};
  int rc = pool3_geom(n, &in[0], &g, d);
  if (rc) return rc;
  out[0] = shape_make(5, (int64_t[]){in[0].d[0], in[0].d[1], g.out[0], g.out[1], g.out[2]});
  return TEQ_OK;
}

/* The Z_p max or average at output position o of plane xp: a max
 * compares residues as integers, an average is the sum times the
 * inverse of the divisor (modp_inv(0) is 0: an empty window averages to
 * 0, as in float). */
static uint32_t pool3_at_modp(const Pool3Geom *g, const uint32_t *xp, const int64_t *o) {
  int64_t at[3], lo[3], hi[3], count = pool3_window(g, o, at, lo, hi);
  uint32_t acc = 0;
  for (int64_t i = lo[0]; i < hi[0]; i++)
    for (int64_t j = lo[1]; j < hi[1]; j++) {
      const uint32_t *row =
          xp + ((at[0] + i * g->dl[0]) * g->in[1] + at[1] + j * g->dl[1]) * g->in[2] + at[2];
      for (int64_t t = lo[2]; t < hi[2]; t++) {
        uint32_t v = row[t * g->dl[2]];
        acc = g->is_max ? (v > acc ? v : acc) : modp_add(acc, v);
      }
    }
  return g->is_max ? acc : modp_mul(acc, modp_inv(modp_from_int(count)));
}

/* Every output of every plane, in float32 or Z_p (elements of 4 bytes
 * either way). */
static int pool3d_eval(const Node *n, Tensor *const *in, Tensor *const *out, bool modp,
                       Diag *d) {
  Pool3Geom g = {0};
  int rc = pool3_geom(n, &in[0]->shape, &g, d);
  if (rc) return rc;
  int64_t vol = g.in[0] * g.in[1] * g.in[2], k = 0;
  for (int64_t pl = 0; pl < g.planes; pl++) {
    int64_t o[3];
    for (o[0] = 0; o[0] < g.out[0]; o[0]++)
      for (o[1] = 0; o[1] < g.out[1]; o[1]++)
        for (o[2] = 0; o[2] < g.out[2]; o[2]++, k++) {
          if (modp)
            ((uint32_t *)out[0]->data)[k] =
                pool3_at_modp(&g, (const uint32_t *)in[0]->data + pl * vol, o);
          else
            ((float *)out[0]->data)[k] = pool3_at_f32(&g, (const float *)in[0]->data + pl * vol, o);
        }
  }
  return TEQ_OK;
}

static int pool3d_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return pool3d_eval(n, in, out, false, d);
}

static int pool3d_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return pool3d_eval(n, in, out, true, d);
}

/* The window (kernel_shape, required, strides, pads, dilations for a max
 * pool; an average pool's only trivial), auto_pad as explicit pads. */
static int pool3d_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const char *op = onnx_in_op_type(v);
  bool is_max = strcmp(op, "MaxPool") == 0;
  if (is_max && !onnx_in_drop_unread_outputs(v, 1))
    return onnx_in_unsupported(v, d, "MaxPool whose Indices output is read is not supported");
  int64_t dl[TEQ_MAX_PARAM_LEN], order = 0;
  int nd = 0;
  /* storage_order orders the Indices output alone, dropped above */
  if (is_max && onnx_in_attr_int(v, "storage_order", &order) && order != 0 && order != 1)
    return onnx_in_error(v, d, "attribute storage_order=%lld: expected 0 or 1",
                         (long long)order);
  if (!is_max && onnx_in_attr_ints(v, "dilations", dl, TEQ_MAX_PARAM_LEN, &nd))
    for (int i = 0; i < nd; i++)
      if (dl[i] != 1)
        return onnx_in_unsupported(v, d, "AveragePool with dilations is not supported");
  if (p->v[POOL_KERNEL].n != 3)
    return onnx_in_error(v, d, "%s over three spatial axes: kernel_shape needs three extents",
                         op);
  int64_t unit[3] = {1, 1, 1};
  return onnx_auto_pads(v, onnx_in_input_shape(v, 0), 3, p->v[POOL_KERNEL].i,
                        p->v[POOL_STRIDE].i, is_max ? p->v[POOL_DILATION].i : unit,
                        p->v[POOL_PADS].i, d);
}

static const OpParam maxpool3d_params[] = {
  POOL_WINDOW_PARAMS_OF(3),
  [POOL_DILATION] = WINDOW_PARAM_DILATION_OF(3),
};

static const OpParam avgpool3d_params[] = {
  POOL_WINDOW_PARAMS_OF(3),
  [AVG_COUNT_PAD] = AVG_PARAM_COUNT_PAD,
};

const OpDef op_def_maxpool3d = {
  .kind = OP_MAXPOOL3D, .name = "maxpool3d", .onnx_op = "MaxPool",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = maxpool3d_params, .n_params = 5,
  .infer_shape = pool3d_infer,
  .eval_f32 = pool3d_eval_f32, .eval_modp = pool3d_eval_modp,
  .eval_cuda = CUDA_EVAL(maxpool3d), .onnx_read = pool3d_onnx_read,
};

const OpDef op_def_avgpool3d = {
  .kind = OP_AVGPOOL3D, .name = "avgpool3d", .onnx_op = "AveragePool",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = avgpool3d_params, .n_params = 5,
  .infer_shape = pool3d_infer,
  .eval_f32 = pool3d_eval_f32, .eval_modp = pool3d_eval_modp,
  .eval_cuda = CUDA_EVAL(avgpool3d), .onnx_read = pool3d_onnx_read,
};
