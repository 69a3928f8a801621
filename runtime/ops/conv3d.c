/* conv3d.c: ONNX Conv over three spatial axes, the convolution of video
 * models (torchvision's r3d_18, mc3_18, r2plus1d_18): X [N, C, D, H, W]
 * and W [M, C/groups, kd, kh, kw], an optional bias B [M] and residual Z
 * (the output's shape), output act(conv + B + Z) [N, M, od, oh, ow], act
 * a fused activation: import folds a residual Add and an activation into
 * it as it does into conv2d, so a video network's blocks run one kernel
 * each. conv2d's row reads every Conv and hands one of three spatial axes
 * to this row (onnx_in_as_kind).
 * Both CPU kernels unfold the input (im2col over three axes) in blocks of
 * output positions and multiply each group's filters by the block: the
 * BLAS in float32, modp_gemm in Z_p, exact. The GPU's is cuDNN's
 * (runtime/cuda/conv.cu). No rule and no import-time fusion knows a 3-D
 * convolution yet: the search leaves it as it is, and the analytical model
 * prices it by its flops. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

#define COL_MAX_BYTES (INT64_C(64) << 20) /* the unfolded block, at most */

typedef struct Geom3 {
  int64_t n, c, in[3];         /* X [N, C, D, H, W] */
  int64_t m, k[3];             /* W [M, C/groups, kd, kh, kw] */
  int64_t out[3];              /* output [N, M, od, oh, ow] */
  int64_t s[3], dl[3], p0[3], p1[3]; /* strides, dilations, pads before and after */
  int64_t groups, cg, mg;
} Geom3;

static int geom3(const Node *n, const Shape *in, Geom3 *g, Diag *d) {
  const Params *p = &n->params;
  char sx[SHAPE_STR_MAX], sw[SHAPE_STR_MAX];
  const Shape *x = &in[0], *w = &in[1];
  if (x->ndim != 5)
    return op_error(n, d, "input X %s: expected [N, C, D, H, W]", shape_format(x, sx, sizeof sx));
  if (w->ndim != 5)
    return op_error(n, d, "weight W %s: expected [M, C/groups, kd, kh, kw]",
                    shape_format(w, sw, sizeof sw));
  for (int i = 0; i < 5; i++)
    if (x->d[i] < 1 || w->d[i] < 1)
      return op_error(n, d, "input X %s, weight W %s: empty dimension",
                      shape_format(x, sx, sizeof sx), shape_format(w, sw, sizeof sw));
  g->n = x->d[0], g->c = x->d[1], g->m = w->d[0];
  g->groups = param_int(p, C3_GROUPS);
  if (g->c % g->groups || g->m % g->groups)
    return op_error(n, d, "groups=%lld: channels %lld in and %lld out not both divisible",
                    (long long)g->groups, (long long)g->c, (long long)g->m);
  g->cg = g->c / g->groups, g->mg = g->m / g->groups;
  if (w->d[1] != g->cg)
    return op_error(n, d, "groups=%lld: weight W %s has %lld input channels per group, "
                    "input X %s needs %lld", (long long)g->groups, shape_format(w, sw, sizeof sw),
                    (long long)w->d[1], shape_format(x, sx, sizeof sx), (long long)g->cg);
  if (n->n_in > 2 && (in[2].ndim != 1 || in[2].d[0] != g->m))
    return op_error(n, d, "bias B %s: expected [%lld], one per output channel",
                    shape_format(&in[2], sx, sizeof sx), (long long)g->m);
  if (n->n_in > 3 && (in[3].ndim != 5 || in[3].d[0] != g->n || in[3].d[1] != g->m))
    return op_error(n, d, "residual Z %s: expected the output's shape",
                    shape_format(&in[3], sx, sizeof sx));
  for (int a = 0; a < 3; a++) {
    g->in[a] = x->d[2 + a], g->k[a] = w->d[2 + a];
    g->s[a] = p->v[C3_STRIDE].i[a], g->dl[a] = p->v[C3_DILATION].i[a];
    g->p0[a] = p->v[C3_PADS].i[a], g->p1[a] = p->v[C3_PADS].i[3 + a];
    int64_t span = g->in[a] + g->p0[a] + g->p1[a] - (g->k[a] - 1) * g->dl[a] - 1;
    if (span < 0)
      return op_error(n, d, "weight W %s with dilation %lld on axis %d is larger than the "
                      "padded input %s", shape_format(w, sw, sizeof sw), (long long)g->dl[a],
                      2 + a, shape_format(x, sx, sizeof sx));
    g->out[a] = span / g->s[a] + 1;
    if (n->n_in > 3 && in[3].d[2 + a] != g->out[a])
      return op_error(n, d, "residual Z %s: expected the output's shape",
                      shape_format(&in[3], sx, sizeof sx));
  }
  return TEQ_OK;
}

static int conv3d_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  Geom3 g = {0};
  int rc = geom3(n, in, &g, d);
  if (rc) return rc;
  out[0] = shape_make(5, (int64_t[]){g.n, g.m, g.out[0], g.out[1], g.out[2]});
  return TEQ_OK;
}

/* Rows [C/g x kd x kh x kw] by columns: output positions [q0, q0 + nq)
 * of one image's group xg, each row the input its tap reads there (0 in
 * the padding), a run of an output row at a time. Float32 and Z_p
 * elements are both 4 bytes, moved as such. */
static void im2col3(const Geom3 *g, const uint32_t *x, int64_t q0, int64_t nq, uint32_t *col) {
  int64_t ow = g->out[2], plane_out = g->out[1] * ow, vol_in = g->in[0] * g->in[1] * g->in[2];
  for (int64_t ci = 0; ci < g->cg; ci++)
    for (int64_t a = 0; a < g->k[0]; a++)
      for (int64_t b = 0; b < g->k[1]; b++)
        for (int64_t e = 0; e < g->k[2]; e++, col += nq)
          for (int64_t q = 0; q < nq;) {
            int64_t pos = q0 + q, oz = pos / plane_out, oy = pos / ow % g->out[1], ox = pos % ow;
            int64_t run = ow - ox < nq - q ? ow - ox : nq - q;
            int64_t iz = oz * g->s[0] - g->p0[0] + a * g->dl[0],
                    iy = oy * g->s[1] - g->p0[1] + b * g->dl[1];
            uint32_t *dst = col + q;
            if (iz < 0 || iz >= g->in[0] || iy < 0 || iy >= g->in[1]) {
              memset(dst, 0, (size_t)run * sizeof *dst);
            } else {
              const uint32_t *row = x + ci * vol_in + (iz * g->in[1] + iy) * g->in[2];
              int64_t sx = g->s[2], off = e * g->dl[2] - g->p0[2];
              for (int64_t t = 0; t < run; t++) {
                int64_t ix = (ox + t) * sx + off;
                dst[t] = ix >= 0 && ix < g->in[2] ? row[ix] : 0;
              }
            }
            q += run;
          }
}

static int conv3d_eval(const Node *n, Tensor *const *in, Tensor *const *out, bool modp,
                       Diag *d) {
  Shape s[4];
  for (int i = 0; i < n->n_in; i++) s[i] = in[i]->shape;
  Geom3 g = {0};
  int rc = geom3(n, s, &g, d);
  if (rc) return rc;
  const size_t es = sizeof(uint32_t); /* a float32's size too */
  int64_t kdim = g.cg * g.k[0] * g.k[1] * g.k[2];
  int64_t vol = g.out[0] * g.out[1] * g.out[2], vol_in = g.in[0] * g.in[1] * g.in[2];
  int64_t block = COL_MAX_BYTES / (kdim * (int64_t)es) / 64 * 64;
  if (block < 64) block = 64;
  if (block > vol) block = vol;
  if (!modp && (g.mg > INT_MAX || kdim > INT_MAX || vol > INT_MAX || g.mg * kdim > INT_MAX))
    return op_error(n, d, "GEMM of [%lld, %lld] by [%lld, %lld] is too large for the BLAS",
                    (long long)g.mg, (long long)kdim, (long long)kdim, (long long)vol);
  uint32_t *col = malloc((size_t)(kdim * block) * es);
  if (!col) {
    op_error(n, d, "out of memory for a [%lld, %lld] column matrix", (long long)kdim,
             (long long)block);
    return TEQ_ERR_NOMEM;
  }
  const char *x = in[0]->data, *w = in[1]->data;
  char *y = out[0]->data;
  for (int64_t img = 0; img < g.n; img++)
    for (int64_t grp = 0; grp < g.groups; grp++) {
      const char *xg = x + (size_t)((img * g.c + grp * g.cg) * vol_in) * es;
      const char *wg = w + (size_t)(grp * g.mg * kdim) * es;
      char *yg = y + (size_t)((img * g.m + grp * g.mg) * vol) * es;
      for (int64_t q0 = 0; q0 < vol; q0 += block) {
        int64_t nq = vol - q0 < block ? vol - q0 : block;
        im2col3(&g, (const uint32_t *)xg, q0, nq, col);
        if (modp)
          modp_gemm(g.mg, nq, kdim, (const uint32_t *)wg, kdim, 1, col, nq, 1,
                    (uint32_t *)yg + q0, vol);
        else
          blas_sgemm(false, false, g.mg, nq, kdim, 1.0f, (const float *)wg, kdim, (float *)col,
                     nq, 0.0f, (float *)yg + q0, vol);
      }
      for (int64_t m = 0; n->n_in > 2 && m < g.mg; m++) {
        int64_t oc = grp * g.mg + m;
        if (modp) {
          uint32_t *ym = (uint32_t *)yg + m * vol, bias = ((const uint32_t *)in[2]->data)[oc];
          for (int64_t k = 0; k < vol; k++) ym[k] = modp_add(ym[k], bias);
        } else {
          float *ym = (float *)yg + m * vol, bias = ((const float *)in[2]->data)[oc];
          for (int64_t k = 0; k < vol; k++) ym[k] += bias;
        }
      }
    }
  free(col);
  int64_t total = g.n * g.m * vol;
  int act = (int)param_int(&n->params, C3_ACT);
  if (modp) {
    uint32_t *ym = out[0]->data;
    const uint32_t *z = n->n_in > 3 ? in[3]->data : NULL;
    for (int64_t k = 0; z && k < total; k++) ym[k] = modp_add(ym[k], z[k]);
    act_apply_modp(act, ym, total);
  } else {
    float *yf = out[0]->data;
    const float *z = n->n_in > 3 ? in[3]->data : NULL;
    for (int64_t k = 0; z && k < total; k++) yf[k] += z[k];
    act_apply_f32(act, yf, total);
  }
  return TEQ_OK;
}

static int conv3d_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return conv3d_eval(n, in, out, false, d);
}

static int conv3d_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return conv3d_eval(n, in, out, true, d);
}

/* Two flops per multiply-add, C/groups x kd x kh x kw of them per output. */
static double conv3d_flops(const Node *n, const Shape *in) {
  (void)in;
  const Shape *w = &in[1];
  return 2.0 * (double)shape_numel(&n->out[0]) *
         (w->ndim == 5 ? (double)(w->d[1] * w->d[2] * w->d[3] * w->d[4]) : 1.0);
}

/* kernel_shape, if given, must be W's; auto_pad becomes explicit pads. */
static int conv3d_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = onnx_in_input_shape(v, 0), *w = onnx_in_input_shape(v, 1);
  char sw[SHAPE_STR_MAX];
  if (!w) return onnx_in_error(v, d, "weight W (input 1) is missing");
  if (!shape_is_known(w) || w->ndim != 5)
    return onnx_in_unsupported(v, d, "a Conv over three spatial axes needs W's shape");
  int64_t ks[TEQ_MAX_PARAM_LEN];
  int nk = 0;
  if (onnx_in_attr_ints(v, "kernel_shape", ks, TEQ_MAX_PARAM_LEN, &nk) &&
      (nk != 3 || ks[0] != w->d[2] || ks[1] != w->d[3] || ks[2] != w->d[4]))
    return onnx_in_error(v, d, "attribute kernel_shape does not match weight W %s",
                         shape_format(w, sw, sizeof sw));
  int64_t k[3] = {w->d[2], w->d[3], w->d[4]};
  return onnx_auto_pads(v, x, 3, k, p->v[C3_STRIDE].i, p->v[C3_DILATION].i, p->v[C3_PADS].i,
                        d);
}

/* The generic mapping writes strides, pads, dilations and group, defaults
 * included; a residual becomes a following Add, a fused act a node after
 * that. */
static int conv3d_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  int act = (int)param_int(&n->params, C3_ACT);
  if (n->n_in > 3) onnx_out_then_binary_input(w, "Add", 3);
  if (act != ACT_NONE) onnx_out_then_unary(w, op_def(act_op_kind(act))->onnx_op);
  return TEQ_OK;
}

static const OpParam conv3d_params[] = {
  [C3_STRIDE] = WINDOW_PARAM_STRIDE_OF(3),
  [C3_PADS] = WINDOW_PARAM_PADS_OF(3),
  [C3_DILATION] = WINDOW_PARAM_DILATION_OF(3),
  [C3_GROUPS] = WINDOW_PARAM_GROUPS(true),
  [C3_ACT] = PARAM_FUSED_ACT,
};

const OpDef op_def_conv3d = {
  .kind = OP_CONV3D, .name = "conv3d", .onnx_op = "Conv",
  .n_in_min = 2, .n_in_max = 4, .n_out_min = 1, .n_out_max = 1,
  .params = conv3d_params, .n_params = 5,
  .infer_shape = conv3d_infer,
  .eval_f32 = conv3d_eval_f32, .eval_modp = conv3d_eval_modp, .flops = conv3d_flops,
  .eval_cuda = CUDA_EVAL(conv3d),
  .onnx_read = conv3d_onnx_read, .onnx_write = conv3d_onnx_write,
  .residual_input = 3, .weight_inputs = 1u << 1 | 1u << 2,
};
