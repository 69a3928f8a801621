/* conv.c: 2-D convolution (grouped, strided, padded, dilated, with a bias,
 * a residual and TASO's fused activation), enlarge (a kernel zero-padded to a larger
 * size, centred, so a 1x1 and a 3x3 conv can be merged) and inference
 * batch normalization, and conv_transpose (ONNX ConvTranspose, 2-D).
 *
 * Float32 conv is im2col + a BLAS GEMM per (image, group): the column
 * matrix has one row per (input channel, kernel tap) and one column per
 * output pixel, so W[group] (M/g x C/g*kh*kw) times it is the output block.
 * A 1x1 stride-1 unpadded conv needs no im2col (X is already the column
 * matrix); grouped convs run in pixel blocks small enough for the BLAS to
 * keep in the calling thread; depthwise convs (groups == C == M) use a
 * direct vector loop over a zero-padded copy of each plane, since a GEMM
 * per channel is all overhead. Bias and activation are applied to each
 * block while it is in cache. Z_p is the same im2col with an exact GEMM
 * (modp_gemm), every group and layout alike.
 *
 * conv2d(X, W[, B[, Z]]) = act(conv(X, W) + B + Z): the optional fourth
 * input Z, of the output's shape, is a residual added before the
 * activation (ResNet's shortcut: y = relu(conv(x) + b + x)), so that the
 * addition is made while the output is in cache, or by cuDNN's fused call
 * on the GPU, instead of by two more passes over memory. A node with Z
 * has B (a zero bias where the model had none).
 *
 * conv2d is OPF_MULTILINEAR as an operator: with act == none and no bias
 * it is linear in X and in W separately; a node with a fused act, a bias or
 * a residual is not, and callers that rely on linearity check all three.
 *
 * pool = k (0: none) max-pools that result over k x k windows at stride k,
 * unpadded, rounding the extents down: ONNX's MaxPool with kernel_shape =
 * strides = (k k), which the importer folds in after the activation (VGG's
 * conv, relu, 2x2 pool). Winograd's F(2x2, 3x3) on the GPU computes 2x2
 * tiles of output, so it keeps one value of four and no pool kernel reads
 * the full output back. Z, when present, has the conv's full shape.
 *
 * Pads are ONNX-ordered (top, left, bottom, right); ONNX auto_pad becomes
 * explicit pads at import (onnx_auto_pads, shared with pool.c). A 1-D ONNX
 * Conv over [N, C, L] is imported as this 2-D one over [N, C, 1, L]
 * between reshapes (onnx_window_read, shared with pool.c too). */
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

/* ---- ONNX auto_pad, shared with pool.c, conv3d.c and pool3d.c ---- */

int onnx_auto_pads(OnnxNodeIn *v, const Shape *x, int axes, const int64_t *k, const int64_t *s,
                   const int64_t *dl, int64_t *pads, Diag *d) {
  const char *mode = NULL;
  if (!onnx_in_attr_string(v, "auto_pad", &mode) || strcmp(mode, "NOTSET") == 0) return TEQ_OK;
  if (strcmp(mode, "VALID") == 0) {
    memset(pads, 0, 2 * (size_t)axes * sizeof *pads);
    return TEQ_OK;
  }
  bool lower = strcmp(mode, "SAME_LOWER") == 0;
  if (!lower && strcmp(mode, "SAME_UPPER") != 0)
    return onnx_in_error(v, d, "attribute auto_pad=%s: expected NOTSET, VALID, SAME_UPPER or "
                         "SAME_LOWER", mode);
  if (!x || !shape_is_known(x) || x->ndim != 2 + axes)
    return onnx_in_unsupported(v, d, "auto_pad=%s needs the input's %d-D spatial shape", mode,
                               axes);
  for (int i = 0; i < axes; i++) {
    int64_t in = x->d[2 + i], out = (in + s[i] - 1) / s[i];
    int64_t total = (out - 1) * s[i] + (k[i] - 1) * dl[i] + 1 - in;
    if (total < 0) total = 0;
    pads[i] = lower ? total - total / 2 : total / 2;
    pads[i + axes] = total - pads[i];
  }
  return TEQ_OK;
}

int onnx_window_read(OnnxNodeIn *v, int spatial, OnnxWindow *w, Diag *d) {
  const char *op = onnx_in_op_type(v);
  int64_t k[TEQ_MAX_PARAM_LEN], s[TEQ_MAX_PARAM_LEN] = {1, 1}, dl[TEQ_MAX_PARAM_LEN] = {1, 1};
  int64_t pads[TEQ_MAX_PARAM_LEN] = {0};
  int nk = 0, ns = spatial, nd = spatial, np = 2 * spatial;
  if (spatial != 1 && spatial != 2)
    return onnx_in_unsupported(v, d, "%s with %d spatial dimensions: only 1-D and 2-D are "
                               "supported", op, spatial);
  w->has_k = onnx_in_attr_ints(v, "kernel_shape", k, TEQ_MAX_PARAM_LEN, &nk);
  onnx_in_attr_ints(v, "strides", s, TEQ_MAX_PARAM_LEN, &ns);
  onnx_in_attr_ints(v, "dilations", dl, TEQ_MAX_PARAM_LEN, &nd);
  onnx_in_attr_ints(v, "pads", pads, TEQ_MAX_PARAM_LEN, &np);
  if ((w->has_k && nk != spatial) || ns != spatial || nd != spatial)
    return onnx_in_unsupported(v, d, "%s over %d spatial dimension(s) with kernel_shape, "
                               "strides or dilations of another length", op, spatial);
  if (np != 2 * spatial)
    return onnx_in_error(v, d, "attribute pads has %d values: expected %d for %d spatial "
                         "dimension(s)", np, 2 * spatial, spatial);
  int off = 2 - spatial; /* a 1-D window is the second axis of the 2-D one */
  for (int i = 0; i < 2; i++) w->k[i] = w->s[i] = w->dl[i] = 1;
  for (int i = 0; i < 4; i++) w->pads[i] = 0;
  for (int i = 0; i < spatial; i++) {
    w->k[off + i] = w->has_k ? k[i] : 1;
    w->s[off + i] = s[i];
    w->dl[off + i] = dl[i];
    w->pads[off + i] = pads[i];
    w->pads[2 + off + i] = pads[spatial + i];
  }
  return TEQ_OK;
}

Shape onnx_window_raised(const Shape *s) {
  if (!s) return (Shape){.ndim = SHAPE_UNKNOWN};
  if (s->ndim != 3) return *s;
  Shape r = shape_of(4, 0, 0, 1, 0);
  r.d[0] = s->d[0], r.d[1] = s->d[1], r.d[3] = s->d[2];
  return r;
}

bool window_take_zero_pad(int rank, const int64_t *pads, Params *p, int pads_i) {
  /* pads: N, C, H, W begins, then their ends. */
  if (rank != 4 || pads[0] || pads[1] || pads[4] || pads[5]) return false;
  int64_t grown[4] = {pads[2], pads[3], pads[6], pads[7]};
  for (int i = 0; i < 4; i++) {
    grown[i] += p->v[pads_i].i[i];
    if (grown[i] > SPATIAL_MAX) return false;
  }
  param_set_ints(p, pads_i, grown, 4);
  return true;
}

/* ---- conv2d geometry ---- */

typedef struct ConvGeom {
  int64_t n, c, h, w;     /* input X [N, C, H, W] */
  int64_t m, kh, kw;      /* weight W [M, C/groups, kh, kw] */
  int64_t oh, ow;         /* output [N, M, oh, ow] */
  int64_t sh, sw, dh, dw; /* stride, dilation */
  int64_t pt, pl, pb, pr; /* pads */
  int64_t groups, cg, mg; /* groups; input and output channels per group */
  int64_t pool;           /* the fused max pool's window and stride, 0 for none */
} ConvGeom;

static int conv_params(const Node *n, ConvGeom *g, Diag *d) {
  const Params *p = &n->params;
  g->sh = p->v[CONV_STRIDE].i[0], g->sw = p->v[CONV_STRIDE].i[1];
  g->dh = p->v[CONV_DILATION].i[0], g->dw = p->v[CONV_DILATION].i[1];
  g->pt = p->v[CONV_PADS].i[0], g->pl = p->v[CONV_PADS].i[1];
  g->pb = p->v[CONV_PADS].i[2], g->pr = p->v[CONV_PADS].i[3];
  g->groups = param_int(p, CONV_GROUPS);
  g->pool = param_int(p, CONV_POOL);
  if (g->pool == 1) return op_error(n, d, "pool=1: a pool window is 0 (none) or 2 and more");
  if (g->sh < 1 || g->sw < 1)
    return op_error(n, d, "stride=(%lld %lld): must be >= 1", (long long)g->sh, (long long)g->sw);
  if (g->dh < 1 || g->dw < 1)
    return op_error(n, d, "dilation=(%lld %lld): must be >= 1", (long long)g->dh,
                    (long long)g->dw);
  if (g->pt < 0 || g->pl < 0 || g->pb < 0 || g->pr < 0)
    return op_error(n, d, "pads=(%lld %lld %lld %lld): must be >= 0", (long long)g->pt,
                    (long long)g->pl, (long long)g->pb, (long long)g->pr);
  if (g->groups < 1) return op_error(n, d, "groups=%lld: must be >= 1", (long long)g->groups);
  return TEQ_OK;
}

/* One output extent: (in + pads - dilated kernel) / stride + 1, or -1 if
 * the dilated kernel does not fit in the padded input. */
static int64_t conv_out_dim(int64_t in, int64_t p0, int64_t p1, int64_t k, int64_t dl, int64_t s) {
  int64_t span = in + p0 + p1 - (k - 1) * dl - 1;
  return span < 0 ? -1 : span / s + 1;
}

static int conv_shapes(const Node *n, const Shape *x, const Shape *w, const Shape *b,
                       ConvGeom *g, Diag *d) {
  char sx[SHAPE_STR_MAX], sw[SHAPE_STR_MAX];
  if (x->ndim != 4)
    return op_error(n, d, "input X %s: expected [N, C, H, W]", shape_format(x, sx, sizeof sx));
  if (w->ndim != 4)
    return op_error(n, d, "weight W %s: expected [M, C/groups, kh, kw]",
                    shape_format(w, sw, sizeof sw));
  for (int i = 0; i < 4; i++)
    if (x->d[i] < 1 || w->d[i] < 1)
      return op_error(n, d, "input X %s, weight W %s: empty dimension",
                      shape_format(x, sx, sizeof sx), shape_format(w, sw, sizeof sw));
  g->n = x->d[0], g->c = x->d[1], g->h = x->d[2], g->w = x->d[3];
  g->m = w->d[0], g->kh = w->d[2], g->kw = w->d[3];
  if (g->c % g->groups)
    return op_error(n, d, "groups=%lld: input channels %lld not divisible by groups",
                    (long long)g->groups, (long long)g->c);
  if (g->m % g->groups)
    return op_error(n, d, "groups=%lld: output channels %lld (weight W %s) not divisible by groups",
                    (long long)g->groups, (long long)g->m, shape_format(w, sw, sizeof sw));
  g->cg = g->c / g->groups, g->mg = g->m / g->groups;
  if (w->d[1] != g->cg)
    return op_error(n, d, "groups=%lld: weight W %s has %lld input channels per group, "
                    "input X %s needs %lld", (long long)g->groups, shape_format(w, sw, sizeof sw),
                    (long long)w->d[1], shape_format(x, sx, sizeof sx), (long long)g->cg);
  if (b && (b->ndim != 1 || b->d[0] != g->m))
    return op_error(n, d, "bias B %s: expected [%lld], one per output channel",
                    shape_format(b, sx, sizeof sx), (long long)g->m);
  return TEQ_OK;
}

/* Validates shapes and parameters together; fills g. */
static int conv_geom(const Node *n, const Shape *in, ConvGeom *g, Diag *d) {
  int rc = conv_params(n, g, d);
  if (rc || (rc = conv_shapes(n, &in[0], &in[1], n->n_in > 2 ? &in[2] : NULL, g, d))) return rc;
  g->oh = conv_out_dim(g->h, g->pt, g->pb, g->kh, g->dh, g->sh);
  g->ow = conv_out_dim(g->w, g->pl, g->pr, g->kw, g->dw, g->sw);
  if (g->oh < 1 || g->ow < 1)
    return op_error(n, d, "kernel %lldx%lld with dilation=(%lld %lld) is larger than the padded "
                    "input %lldx%lld", (long long)g->kh, (long long)g->kw, (long long)g->dh,
                    (long long)g->dw, (long long)(g->h + g->pt + g->pb),
                    (long long)(g->w + g->pl + g->pr));
  const Shape *z = n->n_in > 3 ? &in[3] : NULL;
  if (z && (z->ndim != 4 || z->d[0] != g->n || z->d[1] != g->m || z->d[2] != g->oh ||
            z->d[3] != g->ow)) {
    char sz[SHAPE_STR_MAX];
    return op_error(n, d, "residual Z %s: expected the output's shape [%lld, %lld, %lld, %lld]",
                    shape_format(z, sz, sizeof sz), (long long)g->n, (long long)g->m,
                    (long long)g->oh, (long long)g->ow);
  }
  if (g->pool && (g->oh < g->pool || g->ow < g->pool))
    return op_error(n, d, "pool=%lld: larger than the output %lldx%lld", (long long)g->pool,
                    (long long)g->oh, (long long)g->ow);
  return TEQ_OK;
}

static int conv_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  ConvGeom g;
  int rc = conv_geom(n, in, &g, d);
  if (rc) return rc;
  int64_t k = g.pool ? g.pool : 1;
  out[0] = shape_make(4, (int64_t[]){g.n, g.m, g.oh / k, g.ow / k});
  return TEQ_OK;
}

/* Kernels see tensors; geometry is computed from their shapes the same way. */
static int conv_geom_of(const Node *n, Tensor *const *in, ConvGeom *g, Diag *d) {
  Shape s[4];
  for (int i = 0; i < n->n_in && i < 4; i++) s[i] = in[i]->shape;
  return conv_geom(n, s, g, d);
}

/* ---- conv2d, float32 ---- */

/* Pixels per GEMM block. A dense conv runs one GEMM over the whole image
 * (the BLAS blocks for its caches better than we can), unless the column
 * matrix would pass COL_MAX_BYTES. A grouped conv's GEMMs are thin (M/g
 * rows) and many; handing each to the BLAS's threads costs more than it
 * computes, so its blocks stay under the size below which OpenBLAS runs a
 * GEMM in the calling thread (about 2^18 multiply-adds): 1.5-3x faster on
 * resnext layers. */
#define COL_MAX_BYTES (INT64_C(64) << 20)
#define GROUP_GEMM_MACS (INT64_C(1) << 18)

/* Output columns [lo, hi) whose tap at kernel column j (offset off = j *
 * dilation - pad) falls inside an input row of extent w. */
static void valid_cols(int64_t off, int64_t s, int64_t w, int64_t ow, int64_t *lo, int64_t *hi) {
  *lo = off >= 0 ? 0 : (-off + s - 1) / s;
  *hi = w - 1 - off < 0 ? 0 : (w - 1 - off) / s + 1;
  if (*hi > ow) *hi = ow;
  if (*lo > *hi) *lo = *hi;
}

/* The column matrix is built from 4-byte elements, float32 or Z_p
 * residues alike: elements move as bytes (memcpy and memset, which any
 * element type may then read), and 0, the padding, is all zero bits in
 * both. */
enum { ELEM = 4 };
_Static_assert(sizeof(float) == ELEM && sizeof(uint32_t) == ELEM, "4-byte elements");
typedef unsigned char Byte;

/* dst[t] = src[t * s] for t < n elements; strides 1 and 2, the common
 * cases, are spelled out so that they run as block copies or vector code. */
static void copy_strided(Byte *dst, const Byte *src, int64_t s, int64_t n) {
  if (s == 1)
    memcpy(dst, src, (size_t)n * ELEM);
  else if (s == 2)
    for (int64_t t = 0; t < n; t++) memcpy(dst + t * ELEM, src + 2 * t * ELEM, ELEM);
  else
    for (int64_t t = 0; t < n; t++) memcpy(dst + t * ELEM, src + t * s * ELEM, ELEM);
}

/* Row (c, i, j) of the column matrix for output pixels [p0, p0 + np): the
 * input under kernel tap (i, j) of channel plane xc, 0 in the padding. It
 * walks output rows, so there is one division per call, not per row. */
static void im2col_row(const ConvGeom *g, const Byte *xc, int64_t i, int64_t j, int64_t p0,
                       int64_t np, Byte *dst) {
  int64_t off = j * g->dw - g->pl, lo, hi;
  valid_cols(off, g->sw, g->w, g->ow, &lo, &hi);
  for (int64_t oy = p0 / g->ow, ox = p0 % g->ow; np > 0; oy++, ox = 0) {
    int64_t end = g->ow < ox + np ? g->ow : ox + np;
    int64_t iy = oy * g->sh - g->pt + i * g->dh;
    np -= end - ox;
    if (iy < 0 || iy >= g->h) {
      memset(dst, 0, (size_t)(end - ox) * ELEM);
      dst += (end - ox) * ELEM;
      continue;
    }
    const Byte *xr = xc + (iy * g->w + off) * ELEM;
    int64_t a = lo > ox ? lo : ox, b = hi < end ? hi : end; /* the valid part [a, b) */
    if (a > end) a = end; /* a block may end before the row's first valid column */
    if (b < a) b = a;
    memset(dst, 0, (size_t)(a - ox) * ELEM);
    dst += (a - ox) * ELEM;
    copy_strided(dst, xr + a * g->sw * ELEM, g->sw, b - a);
    dst += (b - a) * ELEM;
    memset(dst, 0, (size_t)(end - b) * ELEM);
    dst += (end - b) * ELEM;
  }
}

/* The column matrix of one group for pixels [p0, p0 + np): one row per
 * (channel, kernel tap), np columns. x points at the group's first channel. */
static void im2col(const ConvGeom *g, const void *x, int64_t p0, int64_t np, void *col) {
  for (int64_t c = 0; c < g->cg; c++)
    for (int64_t i = 0; i < g->kh; i++)
      for (int64_t j = 0; j < g->kw; j++)
        im2col_row(g, (const Byte *)x + c * g->h * g->w * ELEM, i, j, p0, np,
                   (Byte *)col + ((c * g->kh + i) * g->kw + j) * np * ELEM);
}

/* Eight floats (and ints) as one value, a GCC/Clang vector extension: the
 * hot loops below keep their accumulators in registers this way, which an
 * array does not guarantee. With the baseline x86-64 target (SSE2) a Float8
 * is two registers; the hot loops also get an AVX2 copy that GCC picks at
 * load time on machines that have it. */
typedef float Float8 __attribute__((vector_size(32)));
typedef int32_t Int8 __attribute__((vector_size(32)));

#if defined(__GNUC__) && __GNUC__ >= 12 && !defined(__clang__) && defined(__x86_64__)
#define HOT_LOOP_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define HOT_LOOP_CLONES
#endif

/* y[0..n) = act(y + b). Relu is written without a branch: on conv outputs
 * the sign is a coin toss, and a mispredicted branch per element costs more
 * than the GEMM. */
HOT_LOOP_CLONES
static void bias_act_f32(float *y, int64_t n, float b, int act) {
  if (act != ACT_RELU) {
    if (b != 0.0f)
      for (int64_t i = 0; i < n; i++) y[i] += b;
    act_apply_f32(act, y, n);
    return;
  }
  int64_t i = 0;
  const Float8 zero = {0};
  for (; i + 8 <= n; i += 8) {
    Float8 v;
    memcpy(&v, y + i, sizeof v);
    v += b;
    v = (Float8)((Int8)v & (v > zero)); /* comparison lanes are all ones or 0 */
    memcpy(y + i, &v, sizeof v);
  }
  for (; i < n; i++) {
    float v = y[i] + b;
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    u &= (u >> 31) - 1u; /* all ones when the sign bit is clear */
    memcpy(&y[i], &u, sizeof u);
  }
}

static bool conv_is_pointwise(const ConvGeom *g) {
  return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->pt == 0 && g->pl == 0 &&
         g->pb == 0 && g->pr == 0;
}

static bool conv_is_depthwise(const ConvGeom *g) {
  return g->groups == g->c && g->groups == g->m;
}

/* What the GEMM path shares across its blocks. */
typedef struct ConvRun {
  const ConvGeom *g;
  const float *w, *b;
  int act;
  int64_t kdim, plane, block; /* GEMM K, output pixels, pixels per block */
  float *col;                 /* kdim x block scratch; NULL for pointwise */
} ConvRun;

/* y[0..n) += z[0..n): a residual, before the bias and activation. */
static void add_residual_f32(float *y, const float *z, int64_t n) {
  for (int64_t i = 0; i < n; i++) y[i] += z[i];
}

/* One image, one group, output pixels [p0, p0 + np): columns, GEMM, then
 * residual, bias and activation while the tile is in cache (zg: the
 * residual's block of this image and group, or NULL). */
static void conv_block_f32(const ConvRun *r, const float *xg, int64_t grp, float *yg,
                           const float *zg, int64_t p0, int64_t np) {
  const ConvGeom *g = r->g;
  const float *cols = xg + p0;
  int64_t ldb = r->plane;
  if (r->col) {
    im2col(g, xg, p0, np, r->col);
    cols = r->col;
    ldb = np;
  }
  blas_sgemm(false, false, g->mg, np, r->kdim, 1.0f, r->w + grp * g->mg * r->kdim, r->kdim, cols,
             ldb, 0.0f, yg + p0, r->plane);
  for (int64_t m = 0; m < g->mg; m++) {
    if (zg) add_residual_f32(yg + m * r->plane + p0, zg + m * r->plane + p0, np);
    bias_act_f32(yg + m * r->plane + p0, np, r->b ? r->b[grp * g->mg + m] : 0.0f, r->act);
  }
}

static int conv_gemm_f32(const Node *n, const ConvGeom *g, const float *x, const float *w,
                         const float *b, const float *z, float *y, Diag *d) {
  ConvRun r = {.g = g, .w = w, .b = b, .act = (int)param_int(&n->params, CONV_ACT)};
  r.kdim = g->cg * g->kh * g->kw;
  r.plane = g->oh * g->ow;
  int64_t per_col = (r.kdim > g->mg ? r.kdim : g->mg) * (int64_t)sizeof(float);
  r.block = g->groups == 1 ? COL_MAX_BYTES / per_col : GROUP_GEMM_MACS / (g->mg * r.kdim);
  r.block = r.block / 16 * 16;
  if (r.block < 64) r.block = 64;
  if (r.block > r.plane) r.block = r.plane;
  if (g->mg > INT_MAX || r.kdim > INT_MAX || r.plane > INT_MAX || g->mg * r.kdim > INT_MAX)
    return op_error(n, d, "GEMM of [%lld, %lld] by [%lld, %lld] is too large for the BLAS",
                    (long long)g->mg, (long long)r.kdim, (long long)r.kdim, (long long)r.plane);
  if (!conv_is_pointwise(g) && !(r.col = malloc((size_t)(r.kdim * r.block) * sizeof *r.col))) {
    op_error(n, d, "out of memory for a [%lld, %lld] column matrix", (long long)r.kdim,
             (long long)r.block);
    return TEQ_ERR_NOMEM;
  }
  for (int64_t img = 0; img < g->n; img++)
    for (int64_t grp = 0; grp < g->groups; grp++) {
      const float *xg = x + (img * g->c + grp * g->cg) * g->h * g->w;
      float *yg = y + (img * g->m + grp * g->mg) * r.plane;
      const float *zg = z ? z + (img * g->m + grp * g->mg) * r.plane : NULL;
      for (int64_t p0 = 0; p0 < r.plane; p0 += r.block)
        conv_block_f32(&r, xg, grp, yg, zg, p0, r.plane - p0 < r.block ? r.plane - p0 : r.block);
    }
  free(r.col);
  return TEQ_OK;
}

/* A depthwise conv works on a zero-padded copy of each input plane, so
 * that every output is an interior one: no bounds checks in the loop. With
 * stride s > 1 each padded row is further split into s phase rows (columns
 * q, q + s, q + 2s, ...), so that the inputs of consecutive outputs under
 * one tap are adjacent again and load as vectors. */
typedef struct Depthwise {
  const ConvGeom *g;
  int64_t hp;       /* padded rows */
  int64_t wq;       /* columns per phase row, 8 of them spare zeros */
  float *pad;       /* hp * s phase rows of wq; the border stays zero */
  int64_t *tap_off; /* kh * kw: where tap (i, j) reads, from an output row's start */
} Depthwise;

/* Writes plane x into the interior of dw->pad (its border is zero from the
 * allocation and never written). Padded column c + pl goes to phase
 * (c + pl) % s, at position (c + pl) / s. */
static void depthwise_fill(const Depthwise *dw, const float *x) {
  const ConvGeom *g = dw->g;
  for (int64_t q = 0; q < g->sw; q++) {
    int64_t c = ((q - g->pl) % g->sw + g->sw) % g->sw; /* first input column of phase q */
    if (c >= g->w) continue;
    int64_t at = (c + g->pl) / g->sw, n = (g->w - c + g->sw - 1) / g->sw;
    for (int64_t r = 0; r < g->h; r++)
      copy_strided((Byte *)(dw->pad + ((r + g->pt) * g->sw + q) * dw->wq + at),
                   (const Byte *)(x + r * g->w + c), g->sw, n);
  }
}

/* One output row: eight outputs at a time, each block summed over every tap
 * in a register. A last block overlapping the one before covers the
 * remainder (outputs are assigned, so computing one twice is harmless); a
 * row narrower than 8 is computed as 8 into a scratch, reading the spare
 * zero columns. */
HOT_LOOP_CLONES
static void depthwise_row(const float *xrow, const int64_t *off, const float *k, int64_t n_taps,
                          int64_t ow, float *yr) {
  float tmp[8];
  float *dst = ow >= 8 ? yr : tmp;
  for (int64_t ox = 0;; ox += 8) {
    if (ow >= 8 && ox > ow - 8) ox = ow - 8;
    Float8 acc = {0};
    for (int64_t t = 0; t < n_taps; t++) {
      Float8 v;
      memcpy(&v, xrow + off[t] + ox, sizeof v);
      acc += k[t] * v;
    }
    memcpy(dst + ox, &acc, sizeof acc);
    if (ox + 8 >= ow) break;
  }
  if (ow < 8) memcpy(yr, tmp, (size_t)ow * sizeof *yr);
}

static int conv_depthwise_f32(const Node *n, const ConvGeom *g, const float *x, const float *w,
                              const float *b, const float *z, float *y, Diag *d) {
  int64_t in_plane = g->h * g->w, out_plane = g->oh * g->ow, taps = g->kh * g->kw;
  int act = (int)param_int(&n->params, CONV_ACT);
  Depthwise dw = {.g = g, .hp = g->h + g->pt + g->pb};
  dw.wq = (g->w + g->pl + g->pr + g->sw - 1) / g->sw + 8;
  dw.pad = calloc((size_t)(dw.hp * g->sw * dw.wq), sizeof *dw.pad);
  dw.tap_off = malloc((size_t)taps * sizeof *dw.tap_off);
  if (!dw.pad || !dw.tap_off) {
    free(dw.pad);
    free(dw.tap_off);
    op_error(n, d, "out of memory for a padded %lldx%lld plane", (long long)dw.hp,
             (long long)(g->sw * dw.wq));
    return TEQ_ERR_NOMEM;
  }
  /* Tap (i, j) of output (oy, ox) reads padded row oy*sh + i*dh, column
   * ox*s + j*dw: phase (j*dw) % s, position ox + (j*dw) / s. */
  for (int64_t i = 0; i < g->kh; i++)
    for (int64_t j = 0; j < g->kw; j++)
      dw.tap_off[i * g->kw + j] =
          (i * g->dh * g->sw + (j * g->dw) % g->sw) * dw.wq + (j * g->dw) / g->sw;
  int64_t row_step = g->sh * g->sw * dw.wq;
  for (int64_t img = 0; img < g->n; img++)
    for (int64_t c = 0; c < g->c; c++) {
      float *yp = y + (img * g->m + c) * out_plane;
      depthwise_fill(&dw, x + (img * g->c + c) * in_plane);
      for (int64_t oy = 0; oy < g->oh; oy++)
        depthwise_row(dw.pad + oy * row_step, dw.tap_off, w + c * taps, taps, g->ow,
                      yp + oy * g->ow);
      if (z) add_residual_f32(yp, z + (img * g->m + c) * out_plane, out_plane);
      bias_act_f32(yp, out_plane, b ? b[c] : 0.0f, act);
    }
  free(dw.pad);
  free(dw.tap_off);
  return TEQ_OK;
}

/* ---- conv2d's fused max pool ---- */

/* One conv's unpooled arithmetic, into y of the full output's shape. */
typedef int (*ConvFull)(const Node *n, const ConvGeom *g, Tensor *const *in, void *y, Diag *d);

/* The pool node n's row names (op_unpooled_twin), as a node whose output
 * has shape *out and type dt, so that its own kernel runs it. */
static int pool_node_of(const Node *n, Shape *out, DType dt, Node *pool, Diag *d) {
  Params unpooled, pool_params;
  OpKind pool_kind;
  if (!op_unpooled_twin(n, &unpooled, &pool_kind, &pool_params))
    return op_error(n, d, "no pool to run");
  *pool = (Node){.kind = pool_kind, .n_in = 1, .n_out = 1, .out = out, .dtype = dt,
                 .params = pool_params, .name = n->name};
  return TEQ_OK;
}

/* A pooled conv: the conv into a tensor of its full shape, then the pool
 * its row names by that pool's own kernel, so that a pooled conv and a
 * conv followed by its MaxPool agree to the bit, NaNs included, in float32
 * and in Z_p alike. */
static int conv_then_pool(const Node *n, const ConvGeom *g, Tensor *const *in, Tensor *out,
                          bool modp, ConvFull full_conv, Diag *d) {
  Node pool;
  int rc = pool_node_of(n, &out->shape, out->dtype, &pool, d);
  if (rc) return rc;
  Shape fs = shape_make(4, (int64_t[]){g->n, g->m, g->oh, g->ow});
  Tensor *full = tensor_new_uninit(out->dtype, &fs);
  if (!full) {
    op_error(n, d, "out of memory for the %lldx%lld output before its pool", (long long)g->oh,
             (long long)g->ow);
    return TEQ_ERR_NOMEM;
  }
  rc = full_conv(n, g, in, full->data, d);
  const OpDef *o = op_def(pool.kind);
  if (rc == TEQ_OK) rc = (modp ? o->eval_modp : o->eval_f32)(&pool, &full, &out, d);
  tensor_unref(full);
  return rc;
}

static int conv_full_f32(const Node *n, const ConvGeom *g, Tensor *const *in, void *y, Diag *d) {
  const float *x = in[0]->data, *w = in[1]->data, *b = n->n_in > 2 ? in[2]->data : NULL;
  const float *z = n->n_in > 3 ? in[3]->data : NULL;
  if (conv_is_depthwise(g)) return conv_depthwise_f32(n, g, x, w, b, z, y, d);
  return conv_gemm_f32(n, g, x, w, b, z, y, d);
}


/* ---- conv2d, Z_p ---- */

/* The float32 path's im2col, in Z_p: each group's output block is its
 * weight rows times the column matrix, through modp_gemm, which folds each
 * product once and sums a band of 256 outputs per weight (and skips a zero
 * weight's pass: the zero-padded kernels of PET's merged convolutions).
 * PET's random tests spend most of their time here; a tap-by-tap loop
 * over output rows, which this replaced, ran vectors as short as a row of
 * a 17x17 map. Blocks bound the column matrix as for float32. */
static int conv_full_modp(const Node *n, const ConvGeom *gp, Tensor *const *in, void *yv,
                          Diag *d) {
  const ConvGeom g = *gp;
  int64_t kdim = g.cg * g.kh * g.kw, plane = g.oh * g.ow;
  int64_t block = COL_MAX_BYTES / ((kdim > 1 ? kdim : 1) * ELEM) / 256 * 256;
  if (block < 256) block = 256;
  if (block > plane) block = plane;
  uint32_t *col = NULL;
  if (!conv_is_pointwise(&g) && !(col = malloc((size_t)(kdim * block) * sizeof *col))) {
    op_error(n, d, "out of memory for a [%lld, %lld] column matrix", (long long)kdim,
             (long long)block);
    return TEQ_ERR_NOMEM;
  }
  const uint32_t *x = in[0]->data, *w = in[1]->data;
  const uint32_t *b = n->n_in > 2 ? in[2]->data : NULL;
  uint32_t *y = yv;
  int64_t total = g.n * g.m * plane;
  for (int64_t img = 0; img < g.n; img++)
    for (int64_t grp = 0; grp < g.groups; grp++) {
      const uint32_t *xg = x + (img * g.c + grp * g.cg) * g.h * g.w;
      const uint32_t *wg = w + grp * g.mg * kdim;
      uint32_t *yg = y + (img * g.m + grp * g.mg) * plane;
      for (int64_t p0 = 0; p0 < plane; p0 += block) {
        int64_t np = plane - p0 < block ? plane - p0 : block;
        if (col) im2col(&g, xg, p0, np, col);
        modp_gemm(g.mg, np, kdim, wg, kdim, 1, col ? col : xg + p0, col ? np : plane, 1, yg + p0,
                  plane);
      }
      for (int64_t m = 0; b && m < g.mg; m++) {
        uint32_t *ym = yg + m * plane;
        for (int64_t k = 0; k < plane; k++) ym[k] = modp_add(ym[k], b[grp * g.mg + m]);
      }
    }
  if (n->n_in > 3) {
    const uint32_t *z = in[3]->data;
    for (int64_t k = 0; k < total; k++) y[k] = modp_add(y[k], z[k]);
  }
  free(col);
  act_apply_modp((int)param_int(&n->params, CONV_ACT), y, total);
  return TEQ_OK;
}

/* conv2d's kernel in float32 (modp false) or Z_p: the conv, then its pool
 * where it has one. */
static int conv_eval(const Node *n, Tensor *const *in, Tensor *const *out, bool modp, Diag *d) {
  ConvGeom g;
  int rc = conv_geom_of(n, in, &g, d);
  if (rc) return rc;
  ConvFull full = modp ? conv_full_modp : conv_full_f32;
  if (g.pool) return conv_then_pool(n, &g, in, out[0], modp, full, d);
  return full(n, &g, in, out[0]->data, d);
}

static int conv_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return conv_eval(n, in, out, false, d);
}

static int conv_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  return conv_eval(n, in, out, true, d);
}

/* The same sums at chosen positions of the full output (before any pool):
 * each is its group's C/g x kh x kw taps that fall inside the input, every
 * product folded once (below 2^32, so a uint64_t holds 2^32 of them) and
 * the sum reduced at the end. */
static void conv_full_modp_at(const Node *n, const ConvGeom *gp, Tensor *const *in,
                              const int64_t *pos, int64_t n_pos, uint32_t *vals) {
  const ConvGeom g = *gp;
  const uint32_t *x = in[0]->data, *w = in[1]->data;
  const uint32_t *b = n->n_in > 2 ? in[2]->data : NULL;
  for (int64_t q = 0; q < n_pos; q++) {
    int64_t f = pos[q], ox = f % g.ow, oy = f / g.ow % g.oh, m = f / (g.ow * g.oh) % g.m,
            img = f / (g.ow * g.oh * g.m);
    int64_t iy0 = oy * g.sh - g.pt, ix0 = ox * g.sw - g.pl, ilo, ihi, jlo, jhi;
    tap_range(iy0, g.kh, g.dh, g.h, &ilo, &ihi);
    tap_range(ix0, g.kw, g.dw, g.w, &jlo, &jhi);
    const uint32_t *xg = x + (img * g.c + m / g.mg * g.cg) * g.h * g.w;
    const uint32_t *wm = w + m * g.cg * g.kh * g.kw;
    uint64_t acc = 0;
    for (int64_t c = 0; c < g.cg; c++)
      for (int64_t i = ilo; i < ihi; i++) {
        const uint32_t *xr = xg + (c * g.h + iy0 + i * g.dh) * g.w + ix0;
        const uint32_t *wr = wm + (c * g.kh + i) * g.kw;
        for (int64_t j = jlo; j < jhi; j++) {
          uint64_t p = (uint64_t)xr[j * g.dw] * wr[j];
          acc += (p & MODP_P) + (p >> 31);
        }
      }
    vals[q] = b ? modp_add(modp_reduce(acc), b[m]) : modp_reduce(acc);
    if (n->n_in > 3) vals[q] = modp_add(vals[q], ((const uint32_t *)in[3]->data)[f]);
  }
  act_apply_modp((int)param_int(&n->params, CONV_ACT), vals, n_pos);
}

/* With a pool, each position's k x k window of the full output is
 * computed and pooled by the pool's own Z_p kernel, run on the window as a
 * [1, 1, k, k] tensor into the position's value as a [1, 1, 1, 1] one
 * (both over the buffers here: nothing allocated per position). */
static int conv_eval_modp_at(const Node *n, Tensor *const *in, const int64_t *pos, int64_t n_pos,
                             uint32_t *vals, Diag *d) {
  ConvGeom g;
  int rc = conv_geom_of(n, in, &g, d);
  if (rc) return rc;
  if (!g.pool) {
    conv_full_modp_at(n, &g, in, pos, n_pos, vals);
    return TEQ_OK;
  }
  int64_t k = g.pool, ph = g.oh / k, pw = g.ow / k;
  Tensor window = {.refs = 1, .dtype = DT_MODP, .shape = shape_make(4, (int64_t[]){1, 1, k, k})};
  Tensor value = {.refs = 1, .dtype = DT_MODP, .shape = shape_make(4, (int64_t[]){1, 1, 1, 1})};
  Tensor *win_in = &window, *value_out = &value;
  Node pool;
  if ((rc = pool_node_of(n, &value.shape, DT_MODP, &pool, d))) return rc;
  int64_t *at = malloc((size_t)(k * k) * sizeof *at);
  uint32_t *win = malloc((size_t)(k * k) * sizeof *win);
  if (!at || !win) {
    free(at), free(win);
    op_error(n, d, "out of memory for a %lldx%lld pool window", (long long)k, (long long)k);
    return TEQ_ERR_NOMEM;
  }
  window.data = win;
  for (int64_t q = 0; q < n_pos && rc == TEQ_OK; q++) {
    int64_t f = pos[q], px = f % pw, py = f / pw % ph, plane = f / (pw * ph);
    for (int64_t i = 0; i < k; i++)
      for (int64_t j = 0; j < k; j++)
        at[i * k + j] = (plane * g.oh + py * k + i) * g.ow + px * k + j;
    conv_full_modp_at(n, &g, in, at, k * k, win);
    value.data = &vals[q];
    rc = op_def(pool.kind)->eval_modp(&pool, &win_in, &value_out, d);
  }
  free(at), free(win);
  return rc;
}

/* ---- conv2d, ONNX ---- */

/* A rank below 3 (two channel or batch dimensions and a spatial one) is a
 * malformed X or W, not a conv of another dimensionality: said as such.
 * shape: the one known, W's when is_w. */
static int conv_rank_error(OnnxNodeIn *v, const char *op, const Shape *shape, bool is_w,
                           Diag *d) {
  if (!shape || shape->ndim >= 3) return TEQ_OK;
  char s[SHAPE_STR_MAX];
  return onnx_in_error(v, d, "%s %s has rank %d: a %s's %s has rank 3 or more",
                       is_w ? "weight W" : "input X", shape_format(shape, s, sizeof s),
                       shape->ndim, op, is_w ? "weight" : "input");
}

/* Conv's window attributes (onnx_window_read), 1-D or 2-D by the rank of
 * W or X or else the length of kernel_shape; kernel_shape must agree with
 * W; auto_pad becomes explicit pads. A 1-D conv is the 2-D one over X and
 * W with a unit axis 2 (onnx_in_as_raised); a 3-D one is conv3d's. */
static int conv_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = onnx_in_input_shape(v, 0), *w = onnx_in_input_shape(v, 1);
  const Shape *known = w && w->ndim >= 0 ? w : x && x->ndim >= 0 ? x : NULL;
  int rc = conv_rank_error(v, "Conv", known, known == w, d);
  if (rc) return rc;
  int64_t ks[TEQ_MAX_PARAM_LEN];
  int nk = 2;
  if (!known) onnx_in_attr_ints(v, "kernel_shape", ks, TEQ_MAX_PARAM_LEN, &nk);
  char sx[SHAPE_STR_MAX], sw[SHAPE_STR_MAX];
  if (x && w && x->ndim >= 0 && w->ndim >= 0 && x->ndim != w->ndim)
    return onnx_in_error(v, d, "input X %s and weight W %s differ in rank",
                         shape_format(x, sx, sizeof sx), shape_format(w, sw, sizeof sw));
  OnnxWindow win;
  int spatial = known ? known->ndim - 2 : nk;
  if (spatial == 3) {
    onnx_in_as_kind(v, OP_CONV3D);
    return TEQ_OK;
  }
  if ((rc = onnx_window_read(v, spatial, &win, d))) return rc;
  if (spatial == 1 && !(x && x->ndim == 3 && w && w->ndim == 3))
    return onnx_in_unsupported(v, d, "a Conv over one spatial axis needs the shapes of X and W");
  Shape x4 = onnx_window_raised(x), w4 = onnx_window_raised(w);
  bool w_known = w && w4.ndim == 4;
  if (win.has_k && w_known && (win.k[0] != w4.d[2] || win.k[1] != w4.d[3])) {
    if (spatial == 1)
      return onnx_in_error(v, d, "attribute kernel_shape=(%lld) does not match weight W %s",
                           (long long)win.k[1], shape_format(w, sw, sizeof sw));
    return onnx_in_error(v, d, "attribute kernel_shape=(%lld %lld) does not match weight W %s",
                         (long long)win.k[0], (long long)win.k[1],
                         shape_format(w, sw, sizeof sw));
  }
  if (!win.has_k && w_known) win.k[0] = w4.d[2], win.k[1] = w4.d[3];
  const char *mode;
  bool same = onnx_in_attr_string(v, "auto_pad", &mode) && strncmp(mode, "SAME", 4) == 0;
  if (same && !win.has_k && !w_known)
    return onnx_in_unsupported(v, d, "auto_pad=%s with a weight of unknown shape", mode);
  rc = onnx_auto_pads(v, x ? &x4 : NULL, 2, win.k, win.s, win.dl, win.pads, d);
  if (rc) return rc;
  param_set_ints(p, CONV_STRIDE, win.s, 2);
  param_set_ints(p, CONV_DILATION, win.dl, 2);
  param_set_ints(p, CONV_PADS, win.pads, 4);
  if (spatial == 1) onnx_in_as_raised(v, 1u << 0 | 1u << 1);
  return TEQ_OK;
}

/* The generic mapping writes strides, pads, dilations and group, defaults
 * included; a residual becomes a following Add, a fused act a node after
 * that. */
static int conv_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  int act = (int)param_int(&n->params, CONV_ACT);
  int64_t pool = param_int(&n->params, CONV_POOL);
  if (n->n_in > 3) onnx_out_then_binary_input(w, "Add", 3);
  if (act != ACT_NONE) onnx_out_then_unary(w, op_def(act_op_kind(act))->onnx_op);
  if (pool) onnx_out_then_window(w, op_def(OP_MAXPOOL)->onnx_op, pool);
  return TEQ_OK;
}

static const OpParam conv_params_rows[] = {
  [CONV_STRIDE] = WINDOW_PARAM_STRIDE,
  [CONV_PADS] = WINDOW_PARAM_PADS,
  [CONV_DILATION] = WINDOW_PARAM_DILATION,
  [CONV_GROUPS] = WINDOW_PARAM_GROUPS(true),
  [CONV_ACT] = PARAM_FUSED_ACT,
  [CONV_POOL] = {.name = "pool", .type = PARAM_INT, .def = 0, .lo = 0, .hi = SPATIAL_MAX,
                 .quiet_default = true},
};

/* A convolution pads with zeros: a Pad of zeros before it is more of its own. */
static bool conv_take_zero_pad(const Node *n, int rank, const int64_t *pads, Params *p) {
  (void)n;
  return window_take_zero_pad(rank, pads, p, CONV_PADS);
}

/* Two flops per multiply-add: every element of the full output (before
 * a pool) sums C/groups x kh x kw products (the weight's last three
 * extents). */
static double conv_flops(const Node *n, const Shape *in) {
  ConvGeom g;
  double full = conv_geom(n, in, &g, NULL) == TEQ_OK ? (double)(g.n * g.m * g.oh * g.ow)
                                                      : (double)shape_numel(&n->out[0]);
  return 2.0 * full * (double)(in[1].d[1] * in[1].d[2] * in[1].d[3]);
}

/* Output pixels above which way 1 (below) halves a conv. The tables
 * measure torchvision's models at 224x224, and up to about that size a
 * conv has measured neighbours enough; below it the halves by rows, each
 * priced with its own halves in turn, priced three to five times the
 * configurations (EfficientNet-B0's search took twice as long) for
 * estimates that rarely moved. */
#define CONV_HALF_ROWS_ABOVE (64 * 64)

/* Half the work, two ways. Way 0: half of the output channels, in W and
 * the bias (one group only: a grouped conv's halves would also split its
 * input). Way 1: half of the output rows (or, with an odd count of rows,
 * of the columns), for any groups: the same conv on input rows that make
 * exactly half as many output rows, its padding as it is. Each half of the
 * real split reads its own rows and a halo and pads one side only, which
 * is the same work. The neighbours that correct the roofline had priced
 * PaddleOCR's depthwise stride-2 conv of a 640x640 page at 88 us, where
 * the same conv of a 448x448 page cost 12. Not with a fused pool, whose
 * windows span the rows. */
static bool conv_half_twin(const Node *n, const Shape *in, int way, Shape *half_in) {
  if (in[0].ndim != 4 || in[1].ndim != 4 || n->out[0].ndim != 4) return false;
  for (int j = 0; j < n->n_in; j++) half_in[j] = in[j];
  if (way == 0) {
    if (param_int(&n->params, CONV_GROUPS) != 1 || in[1].d[0] < 2 || in[1].d[0] % 2) return false;
    half_in[1].d[0] /= 2;
    if (n->n_in > 2 && half_in[2].ndim == 1) half_in[2].d[0] /= 2;
    if (n->n_in > 3 && half_in[3].ndim == 4) half_in[3].d[1] /= 2;
    return true;
  }
  if (way != 1 || n->params.v[CONV_POOL].i[0] ||
      n->out[0].d[2] * n->out[0].d[3] <= CONV_HALF_ROWS_ABOVE)
    return false;
  int axis = n->out[0].d[2] % 2 == 0 ? 0 : n->out[0].d[3] % 2 == 0 ? 1 : -1;
  if (axis < 0) return false;
  const int64_t *stride = n->params.v[CONV_STRIDE].i, *pads = n->params.v[CONV_PADS].i;
  const int64_t *dilation = n->params.v[CONV_DILATION].i;
  int64_t window = dilation[axis] * (in[1].d[2 + axis] - 1) + 1;
  int64_t rows = (n->out[0].d[2 + axis] / 2 - 1) * stride[axis] + window - pads[axis] -
                 pads[axis + 2];
  if (rows < 1) return false;
  half_in[0].d[2 + axis] = rows;
  if (n->n_in > 3 && half_in[3].ndim == 4) half_in[3].d[2 + axis] /= 2;
  return true;
}

/* Dense convolutions only: a grouped conv's 1x1 twin (a per-channel scale,
 * for a depthwise one) is an operator no table holds, whose estimate says
 * less than the conv's own (ShuffleNetV2's depthwise 3x3 convs rose from
 * 2.8 to 10.3 us under their 1x1 twins). */
static bool conv_one_tap_twin(const Node *n, const Shape *in, Params *p, Shape *part_in,
                              int *n_part_in) {
  if (in[0].ndim != 4 || in[1].ndim != 4 || (in[1].d[2] == 1 && in[1].d[3] == 1) ||
      n->params.v[CONV_GROUPS].i[0] != 1 || n->params.v[CONV_POOL].i[0])
    return false;
  const int64_t *s = n->params.v[CONV_STRIDE].i;
  int64_t oh = (in[0].d[2] - 1) / s[0] + 1, ow = (in[0].d[3] - 1) / s[1] + 1;
  if (oh > n->out[0].d[2] || ow > n->out[0].d[3]) return false;
  bool whole = oh == n->out[0].d[2] && ow == n->out[0].d[3];
  *p = n->params;
  param_set_ints(p, CONV_PADS, (const int64_t[]){0, 0, 0, 0}, 4);
  param_set_ints(p, CONV_DILATION, (const int64_t[]){1, 1}, 2);
  if (!whole) param_set_int(p, CONV_ACT, ACT_NONE);
  *n_part_in = whole ? n->n_in : 2;
  for (int j = 0; j < *n_part_in; j++) part_in[j] = in[j];
  part_in[1].d[2] = part_in[1].d[3] = 1;
  return true;
}

const OpDef op_def_conv2d = {
  .kind = OP_CONV2D, .name = "conv2d", .axiom_name = "conv2d", .onnx_op = "Conv",
  .n_in_min = 2, .n_in_max = 4, .n_out_min = 1, .n_out_max = 1,
  .params = conv_params_rows, .n_params = 6,
  .flags = OPF_MULTILINEAR,
  .infer_shape = conv_infer,
  .eval_f32 = conv_eval_f32, .eval_modp = conv_eval_modp, .eval_modp_at = conv_eval_modp_at,
  .eval_cuda = CUDA_EVAL(conv2d), .flops = conv_flops,
  .onnx_read = conv_onnx_read, .onnx_write = conv_onnx_write, .half_twin = conv_half_twin,
  .take_zero_pad = conv_take_zero_pad, .one_tap_twin = conv_one_tap_twin,
  .residual_input = 3, .weight_inputs = 1u << 1 | 1u << 2,
};

/* ---- conv_transpose: ONNX ConvTranspose, 2-D ---- */

/* The adjoint of conv2d: each input pixel (iy, ix) of channel c scatters
 * x * W[c, m, i, j] to output (iy*sh - pt + i*dh, ix*sw - pl + j*dw). W is
 * [C, M/groups, kh, kw]. The full output has extent s*(in-1) + (k-1)*dl + 1
 * + output_padding; pads crop it at both ends. Float32 is a GEMM per
 * (image, group), W_g^T (M/g*kh*kw x C/g) times X_g (C/g x H*W), then
 * col2im: a scatter-add of those columns into the cleared output. Z_p is
 * the same scatter, exact. As conv2d, OPF_MULTILINEAR is the form without
 * a bias input. */

/* Every input element scatters into M/groups x kh x kw outputs. */
static double ct_flops(const Node *n, const Shape *in) {
  (void)n;
  return 2.0 * (double)shape_numel(&in[0]) * (double)(in[1].d[1] * in[1].d[2] * in[1].d[3]);
}

/* conv_transpose geometry, in ConvGeom's fields: (n, c, h, w) the input,
 * m the output channels, (oh, ow) the output; cg, mg per group. */
static int ct_geom(const Node *n, const Shape *in, ConvGeom *g, int64_t op[2], Diag *d) {
  const Params *p = &n->params;
  char sx[SHAPE_STR_MAX], sw[SHAPE_STR_MAX];
  int rc = conv_params(n, g, d);
  if (rc) return rc;
  op[0] = p->v[CT_OUTPAD].i[0], op[1] = p->v[CT_OUTPAD].i[1];
  if (op[0] < 0 || op[1] < 0)
    return op_error(n, d, "output_padding=(%lld %lld): must be >= 0", (long long)op[0],
                    (long long)op[1]);
  const Shape *x = &in[0], *w = &in[1];
  if (x->ndim != 4)
    return op_error(n, d, "input X %s: expected [N, C, H, W]", shape_format(x, sx, sizeof sx));
  if (w->ndim != 4)
    return op_error(n, d, "weight W %s: expected [C, M/groups, kh, kw]",
                    shape_format(w, sw, sizeof sw));
  for (int i = 0; i < 4; i++)
    if (x->d[i] < 1 || w->d[i] < 1)
      return op_error(n, d, "input X %s, weight W %s: empty dimension",
                      shape_format(x, sx, sizeof sx), shape_format(w, sw, sizeof sw));
  g->n = x->d[0], g->c = x->d[1], g->h = x->d[2], g->w = x->d[3];
  g->kh = w->d[2], g->kw = w->d[3];
  if (w->d[0] != g->c)
    return op_error(n, d, "weight W %s: dimension 0 must equal input channels %lld of X %s",
                    shape_format(w, sw, sizeof sw), (long long)g->c,
                    shape_format(x, sx, sizeof sx));
  if (g->c % g->groups)
    return op_error(n, d, "groups=%lld: input channels %lld not divisible by groups",
                    (long long)g->groups, (long long)g->c);
  g->cg = g->c / g->groups, g->mg = w->d[1], g->m = g->mg * g->groups;
  if (n->n_in > 2 && (in[2].ndim != 1 || in[2].d[0] != g->m))
    return op_error(n, d, "bias B %s: expected [%lld], one per output channel",
                    shape_format(&in[2], sx, sizeof sx), (long long)g->m);
  g->oh = g->sh * (g->h - 1) + (g->kh - 1) * g->dh + 1 + op[0] - g->pt - g->pb;
  g->ow = g->sw * (g->w - 1) + (g->kw - 1) * g->dw + 1 + op[1] - g->pl - g->pr;
  if (g->oh < 1 || g->ow < 1)
    return op_error(n, d, "pads=(%lld %lld %lld %lld): crop the whole %lldx%lld output",
                    (long long)g->pt, (long long)g->pl, (long long)g->pb, (long long)g->pr,
                    (long long)(g->oh + g->pt + g->pb), (long long)(g->ow + g->pl + g->pr));
  if (g->oh > SPATIAL_MAX || g->ow > SPATIAL_MAX)
    return op_error(n, d, "output %lldx%lld: larger than %lld", (long long)g->oh,
                    (long long)g->ow, (long long)SPATIAL_MAX);
  return TEQ_OK;
}

static int ct_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  ConvGeom g;
  int64_t op[2];
  int rc = ct_geom(n, in, &g, op, d);
  if (rc) return rc;
  out[0] = shape_make(4, (int64_t[]){g.n, g.m, g.oh, g.ow});
  return TEQ_OK;
}

static int ct_geom_of(const Node *n, Tensor *const *in, ConvGeom *g, Diag *d) {
  Shape s[3];
  int64_t op[2];
  for (int i = 0; i < n->n_in && i < 3; i++) s[i] = in[i]->shape;
  return ct_geom(n, s, g, op, d);
}

/* Scatter-adds column matrix rows (m, i, j) of one group, each H*W input
 * pixels, into the output planes yg (mg of them). */
static void col2im(const ConvGeom *g, const float *col, float *yg) {
  int64_t hw = g->h * g->w;
  for (int64_t m = 0; m < g->mg; m++)
    for (int64_t i = 0; i < g->kh; i++)
      for (int64_t j = 0; j < g->kw; j++) {
        const float *cr = col + ((m * g->kh + i) * g->kw + j) * hw;
        float *yp = yg + m * g->oh * g->ow;
        int64_t xoff = j * g->dw - g->pl;
        for (int64_t iy = 0; iy < g->h; iy++) {
          int64_t oy = iy * g->sh - g->pt + i * g->dh;
          if (oy < 0 || oy >= g->oh) continue;
          float *yr = yp + oy * g->ow;
          const float *cx = cr + iy * g->w;
          for (int64_t ix = 0; ix < g->w; ix++) {
            int64_t ox = ix * g->sw + xoff;
            if (ox >= 0 && ox < g->ow) yr[ox] += cx[ix];
          }
        }
      }
}

static int ct_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  ConvGeom g;
  int rc = ct_geom_of(n, in, &g, d);
  if (rc) return rc;
  const float *x = in[0]->data, *w = in[1]->data, *b = n->n_in > 2 ? in[2]->data : NULL;
  float *y = out[0]->data;
  int64_t rows = g.mg * g.kh * g.kw, hw = g.h * g.w, plane = g.oh * g.ow;
  if (rows > INT_MAX || hw > INT_MAX || g.cg > INT_MAX || rows * hw > (INT64_C(1) << 31))
    return op_error(n, d, "GEMM of [%lld, %lld] by [%lld, %lld] is too large for the BLAS",
                    (long long)rows, (long long)g.cg, (long long)g.cg, (long long)hw);
  float *col = malloc((size_t)(rows * hw) * sizeof *col);
  if (!col) {
    op_error(n, d, "out of memory for a [%lld, %lld] column matrix", (long long)rows,
             (long long)hw);
    return TEQ_ERR_NOMEM;
  }
  memset(y, 0, tensor_bytes(out[0])); /* col2im adds; every element is written */
  for (int64_t img = 0; img < g.n; img++)
    for (int64_t grp = 0; grp < g.groups; grp++) {
      const float *xg = x + (img * g.c + grp * g.cg) * hw;
      const float *wg = w + grp * g.cg * rows;
      blas_sgemm(true, false, rows, hw, g.cg, 1.0f, wg, rows, xg, hw, 0.0f, col, hw);
      col2im(&g, col, y + (img * g.m + grp * g.mg) * plane);
    }
  free(col);
  for (int64_t img = 0; b && img < g.n; img++)
    for (int64_t m = 0; m < g.m; m++) {
      float *yp = y + (img * g.m + m) * plane;
      for (int64_t q = 0; q < plane; q++) yp[q] += b[m];
    }
  return TEQ_OK;
}

static int ct_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  ConvGeom g;
  int rc = ct_geom_of(n, in, &g, d);
  if (rc) return rc;
  const uint32_t *x = in[0]->data, *w = in[1]->data;
  const uint32_t *b = n->n_in > 2 ? in[2]->data : NULL;
  uint32_t *y = out[0]->data;
  int64_t plane = g.oh * g.ow;
  memset(y, 0, tensor_bytes(out[0]));
  for (int64_t img = 0; img < g.n; img++)
    for (int64_t c = 0; c < g.c; c++) {
      const uint32_t *xp = x + (img * g.c + c) * g.h * g.w;
      int64_t grp = c / g.cg;
      for (int64_t mi = 0; mi < g.mg; mi++) {
        const uint32_t *wk = w + (c * g.mg + mi) * g.kh * g.kw;
        uint32_t *yp = y + (img * g.m + grp * g.mg + mi) * plane;
        for (int64_t iy = 0; iy < g.h; iy++)
          for (int64_t ix = 0; ix < g.w; ix++) {
            uint32_t xv = xp[iy * g.w + ix];
            for (int64_t i = 0; i < g.kh; i++) {
              int64_t oy = iy * g.sh - g.pt + i * g.dh;
              if (oy < 0 || oy >= g.oh) continue;
              for (int64_t j = 0; j < g.kw; j++) {
                int64_t ox = ix * g.sw - g.pl + j * g.dw;
                if (ox < 0 || ox >= g.ow) continue;
                uint32_t *o = &yp[oy * g.ow + ox];
                *o = modp_add(*o, modp_mul(xv, wk[i * g.kw + j]));
              }
            }
          }
      }
    }
  for (int64_t img = 0; b && img < g.n; img++)
    for (int64_t m = 0; m < g.m; m++) {
      uint32_t *yp = y + (img * g.m + m) * plane;
      for (int64_t q = 0; q < plane; q++) yp[q] = modp_add(yp[q], b[m]);
    }
  return TEQ_OK;
}

/* The ONNX spec's pads from a wanted output extent: total = s*(in-1) +
 * output_padding + (k-1)*dl + 1 - want, split with the extra pixel at the
 * end for SAME_UPPER and at the beginning otherwise. A negative end pad
 * (an output longer than the scatter reaches) becomes output_padding. */
static int ct_pads_for(OnnxNodeIn *v, bool upper, int i, int64_t in, int64_t k, int64_t s,
                       int64_t dl, int64_t want, int64_t pads[4], int64_t op[2], Diag *d) {
  int64_t total = s * (in - 1) + op[i] + (k - 1) * dl + 1 - want;
  int64_t half = total >= 0 ? total / 2 : -((-total + 1) / 2); /* floor, as the spec's // */
  int64_t p0 = upper ? half : total - half, p1 = total - p0;
  if (p0 < 0)
    return onnx_in_unsupported(v, d, "ConvTranspose output extent %lld needs a negative "
                               "begin pad %lld", (long long)want, (long long)p0);
  if (p1 < 0) op[i] -= p1, p1 = 0;
  pads[i] = p0, pads[i + 2] = p1;
  return TEQ_OK;
}

/* 2-D only; kernel_shape must agree with W; output_shape and auto_pad
 * become explicit pads (and output_padding for an output past the scatter). */
static int ct_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const Shape *x = onnx_in_input_shape(v, 0), *w = onnx_in_input_shape(v, 1);
  const Shape *known = w && w->ndim >= 0 ? w : x && x->ndim >= 0 ? x : NULL;
  int bad = conv_rank_error(v, "ConvTranspose", known, known == w, d);
  if (bad) return bad;
  if (known && known->ndim != 4)
    return onnx_in_unsupported(v, d, "ConvTranspose with %d spatial dimensions: only 2-D is "
                               "supported", known->ndim - 2);
  int64_t ks[TEQ_MAX_PARAM_LEN], os[TEQ_MAX_PARAM_LEN];
  int nk = 0, no = 0;
  bool has_ks = onnx_in_attr_ints(v, "kernel_shape", ks, TEQ_MAX_PARAM_LEN, &nk);
  bool has_os = onnx_in_attr_ints(v, "output_shape", os, TEQ_MAX_PARAM_LEN, &no);
  const ParamValue *pv = p->v;
  if ((has_ks && nk != 2) || pv[CT_STRIDE].n != 2 || pv[CT_DILATION].n != 2 ||
      pv[CT_OUTPAD].n != 2 || pv[CT_PADS].n != 4)
    return onnx_in_unsupported(v, d, "ConvTranspose with kernel_shape, strides, dilations, "
                               "output_padding or pads not of a 2-D form");
  bool w_known = w && w->ndim == 4;
  if (has_ks && w_known && (ks[0] != w->d[2] || ks[1] != w->d[3])) {
    char sw[SHAPE_STR_MAX];
    return onnx_in_error(v, d, "attribute kernel_shape=(%lld %lld) does not match weight W %s",
                         (long long)ks[0], (long long)ks[1], shape_format(w, sw, sizeof sw));
  }
  if (!has_ks && w_known) ks[0] = w->d[2], ks[1] = w->d[3];
  const char *mode = "NOTSET";
  onnx_in_attr_string(v, "auto_pad", &mode);
  bool same = strcmp(mode, "SAME_UPPER") == 0 || strcmp(mode, "SAME_LOWER") == 0;
  if (!same && strcmp(mode, "NOTSET") != 0 && strcmp(mode, "VALID") != 0)
    return onnx_in_error(v, d, "attribute auto_pad=%s: expected NOTSET, VALID, SAME_UPPER or "
                         "SAME_LOWER", mode);
  int64_t pads[4], op[2] = {pv[CT_OUTPAD].i[0], pv[CT_OUTPAD].i[1]};
  memcpy(pads, pv[CT_PADS].i, sizeof pads);
  if (strcmp(mode, "VALID") == 0) memset(pads, 0, sizeof pads);
  if (has_os && no == 4) { /* [N, C, H, W] written out: the spatial part is all */
    os[0] = os[2], os[1] = os[3];
    no = 2;
  }
  if (has_os && no != 2)
    return onnx_in_unsupported(v, d, "ConvTranspose output_shape of length %d: only 2-D", no);
  if (has_os || same) {
    if (!x || x->ndim != 4 || (!has_ks && !w_known))
      return onnx_in_unsupported(v, d, "ConvTranspose %s needs the input's and kernel's "
                                 "shapes", has_os ? "output_shape" : "auto_pad");
    for (int i = 0; i < 2; i++) {
      int64_t want = has_os ? os[i] : x->d[2 + i] * pv[CT_STRIDE].i[i];
      int rc = ct_pads_for(v, strcmp(mode, "SAME_UPPER") == 0, i, x->d[2 + i], ks[i],
                           pv[CT_STRIDE].i[i], pv[CT_DILATION].i[i], want, pads, op, d);
      if (rc) return rc;
    }
  }
  param_set_ints(p, CT_PADS, pads, 4);
  param_set_ints(p, CT_OUTPAD, op, 2);
  return TEQ_OK;
}

static const OpParam ct_params_rows[] = {
  [CT_STRIDE] = WINDOW_PARAM_STRIDE,
  [CT_PADS] = WINDOW_PARAM_PADS,
  [CT_DILATION] = WINDOW_PARAM_DILATION,
  [CT_GROUPS] = WINDOW_PARAM_GROUPS(false),
  [CT_OUTPAD] = {.name = "output_padding", .type = PARAM_INTS, .len = 2, .def = 0, .lo = 0,
                 .hi = SPATIAL_MAX, .onnx_attr = "output_padding"},
};

const OpDef op_def_conv_transpose = {
  .kind = OP_CONV_TRANSPOSE, .name = "conv_transpose", .onnx_op = "ConvTranspose",
  .n_in_min = 2, .n_in_max = 3, .n_out_min = 1, .n_out_max = 1,
  .params = ct_params_rows, .n_params = 5,
  .flags = OPF_MULTILINEAR,
  .infer_shape = ct_infer,
  .eval_f32 = ct_eval_f32, .eval_modp = ct_eval_modp,
  .eval_cuda = CUDA_EVAL(conv_transpose), .flops = ct_flops,
  .onnx_read = ct_onnx_read,
};

/* ---- enlarge(kh, kw): kernel [M, C, h, w] zero-padded to [M, C, kh, kw] ---- */

static int enlarge_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char s[SHAPE_STR_MAX];
  int64_t kh = param_int(&n->params, 0), kw = param_int(&n->params, 1);
  if (in[0].ndim != 4)
    return op_error(n, d, "kernel %s: expected [M, C, h, w]", shape_format(&in[0], s, sizeof s));
  int64_t h = in[0].d[2], w = in[0].d[3];
  if (kh < h || kw < w)
    return op_error(n, d, "kh=%lld kw=%lld: smaller than the kernel %s", (long long)kh,
                    (long long)kw, shape_format(&in[0], s, sizeof s));
  /* Centred means the same padding on both sides. */
  if ((kh - h) % 2 || (kw - w) % 2)
    return op_error(n, d, "kh=%lld kw=%lld: kernel %s cannot be centred (odd difference)",
                    (long long)kh, (long long)kw, shape_format(&in[0], s, sizeof s));
  out[0] = shape_make(4, (int64_t[]){in[0].d[0], in[0].d[1], kh, kw});
  return TEQ_OK;
}

/* Element-size agnostic: the same copy serves float32 and Z_p. */
static int enlarge_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)d;
  const Shape *s = &in[0]->shape;
  int64_t h = s->d[2], w = s->d[3];
  int64_t kh = param_int(&n->params, 0), kw = param_int(&n->params, 1);
  int64_t top = (kh - h) / 2, left = (kw - w) / 2;
  size_t es = dtype_size(in[0]->dtype);
  const char *x = in[0]->data;
  char *y = out[0]->data;
  memset(y, 0, tensor_bytes(out[0])); /* the border; weights are small */
  for (int64_t k = 0; k < s->d[0] * s->d[1]; k++)
    for (int64_t i = 0; i < h; i++)
      memcpy(y + (size_t)((k * kh + top + i) * kw + left) * es, x + (size_t)((k * h + i) * w) * es,
             (size_t)w * es);
  return TEQ_OK;
}

/* Exported as a constant-mode Pad (zeros by default) of the kernel's two
 * spatial dims, the same amount on both sides. */
static int enlarge_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const Shape *k = onnx_out_input_shape(w, 0);
  if (!k || k->ndim != 4) return op_error(n, d, "export needs the kernel's shape");
  int64_t ph = (param_int(&n->params, 0) - k->d[2]) / 2, pw = (param_int(&n->params, 1) - k->d[3]) / 2;
  Shape s = shape_of(1, 8);
  Tensor *pads = tensor_new(DT_I64, &s);
  if (!pads) return TEQ_ERR_NOMEM;
  int64_t *p = pads->data;
  p[2] = p[6] = ph; /* ONNX order: all begins, then all ends */
  p[3] = p[7] = pw;
  onnx_out_set_op_type(w, "Pad");
  onnx_out_add_const_input(w, pads);
  tensor_unref(pads);
  return TEQ_OK;
}

static const OpParam enlarge_params[] = {
  [ENLARGE_KH] = {.name = "kh", .type = PARAM_INT, .def = 3, .lo = 1, .hi = 64},
  [ENLARGE_KW] = {.name = "kw", .type = PARAM_INT, .def = 3, .lo = 1, .hi = 64},
};

const OpDef op_def_enlarge = {
  .kind = OP_ENLARGE, .name = "enlarge", .axiom_name = "enlarge",
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = enlarge_params, .n_params = 2,
  .flags = OPF_WEIGHT_ONLY | OPF_MULTILINEAR | OPF_LAYOUT_ONLY,
  .infer_shape = enlarge_infer,
  .eval_f32 = enlarge_eval, .eval_modp = enlarge_eval,
  .eval_cuda = CUDA_EVAL(enlarge),
  .onnx_write = enlarge_onnx_write,
};

/* ---- batchnorm(epsilon, act): ONNX BatchNormalization, inference form ---- */

/* y = act(scale * (x - mean) / sqrt(var + epsilon) + B), per channel (dim 1).
 * The activation is one the importer fused (a BatchNorm it cannot fold into
 * a conv, DenseNet's after each concat, followed by a relu): one pass over
 * memory instead of two. */

#define BATCHNORM_EPS_DEFAULT 1e-5 /* ONNX's default */

static int batchnorm_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char sx[SHAPE_STR_MAX], sp[SHAPE_STR_MAX];
  static const char *const names[] = {"X", "scale", "B", "mean", "var"};
  if (in[0].ndim < 2)
    return op_error(n, d, "input X %s: expected [N, C, ...]", shape_format(&in[0], sx, sizeof sx));
  for (int i = 1; i < 5; i++)
    if (in[i].ndim != 1 || in[i].d[0] != in[0].d[1])
      return op_error(n, d, "%s %s: expected [%lld] for input X %s", names[i],
                      shape_format(&in[i], sp, sizeof sp), (long long)in[0].d[1],
                      shape_format(&in[0], sx, sizeof sx));
  out[0] = in[0];
  return TEQ_OK;
}

/* Channels, and elements per channel per image, of X. */
static void batchnorm_dims(const Tensor *x, int64_t *n, int64_t *c, int64_t *inner) {
  *n = x->shape.d[0];
  *c = x->shape.d[1];
  *inner = 1;
  for (int i = 2; i < x->shape.ndim; i++) *inner *= x->shape.d[i];
}

static int batchnorm_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)d;
  int64_t nb, c, inner;
  batchnorm_dims(in[0], &nb, &c, &inner);
  const float *x = in[0]->data, *scale = in[1]->data, *bias = in[2]->data;
  const float *mean = in[3]->data, *var = in[4]->data;
  float *y = out[0]->data;
  double eps = param_float(&n->params, 0);
  for (int64_t ch = 0; ch < c; ch++) {
    float a = (float)(scale[ch] / sqrt((double)var[ch] + eps));
    float b = bias[ch] - mean[ch] * a;
    for (int64_t img = 0; img < nb; img++) {
      int64_t base = (img * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++) y[base + i] = x[base + i] * a + b;
    }
  }
  act_apply_f32((int)param_int(&n->params, BATCHNORM_ACT), y, tensor_numel(out[0]));
  return TEQ_OK;
}

/* Z_p stand-in for 1/sqrt(v): 3v^3 + 7v^2 + 11v + 13, chosen to differ
 * from every element-wise stand-in. */
static uint32_t batchnorm_standin(uint32_t v) { return modp_poly3(v, 3, 7, 11, 13); }

static int batchnorm_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)d;
  int64_t nb, c, inner;
  batchnorm_dims(in[0], &nb, &c, &inner);
  const uint32_t *x = in[0]->data, *scale = in[1]->data, *bias = in[2]->data;
  const uint32_t *mean = in[3]->data, *var = in[4]->data;
  uint32_t *y = out[0]->data;
  /* epsilon has no exact residue; its bit pattern stands in for it, so
   * batchnorms that differ only in epsilon fingerprint apart. At the
   * default epsilon the shift is 0 and the kernel uses the stand-in as is. */
  double eps = param_float(&n->params, 0);
  uint64_t bits;
  memcpy(&bits, &eps, sizeof bits);
  uint32_t e = eps == BATCHNORM_EPS_DEFAULT ? 0 : modp_reduce(bits);
  for (int64_t ch = 0; ch < c; ch++) {
    uint32_t a = modp_mul(scale[ch], batchnorm_standin(modp_add(var[ch], e)));
    for (int64_t img = 0; img < nb; img++) {
      int64_t base = (img * c + ch) * inner;
      for (int64_t i = 0; i < inner; i++)
        y[base + i] = modp_add(modp_mul(modp_sub(x[base + i], mean[ch]), a), bias[ch]);
    }
  }
  act_apply_modp((int)param_int(&n->params, BATCHNORM_ACT), y, tensor_numel(out[0]));
  return TEQ_OK;
}

/* Only the inference form: one output, training_mode 0 (opset 14+),
 * spatial 1 (before opset 9). momentum and is_test mean nothing here. */
static int batchnorm_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  (void)p;
  int64_t flag;
  double momentum;
  if (onnx_in_n_outputs(v) > 1)
    return onnx_in_unsupported(v, d, "BatchNormalization with running-statistics outputs "
                               "(training form) is not supported");
  if (onnx_in_attr_int(v, "training_mode", &flag) && flag != 0)
    return onnx_in_unsupported(v, d, "BatchNormalization with training_mode=%lld is not "
                               "supported", (long long)flag);
  if (onnx_in_attr_int(v, "spatial", &flag) && flag != 1)
    return onnx_in_unsupported(v, d, "BatchNormalization with spatial=%lld is not supported",
                               (long long)flag);
  onnx_in_attr_int(v, "is_test", &flag);
  onnx_in_attr_float(v, "momentum", &momentum);
  return TEQ_OK;
}

static const OpParam batchnorm_params[] = {
  [BATCHNORM_EPSILON] = {.name = "epsilon", .type = PARAM_FLOAT, .fdef = BATCHNORM_EPS_DEFAULT, .onnx_attr = "epsilon"},
  [BATCHNORM_ACT] = PARAM_FUSED_ACT,
};

static int batchnorm_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  int act = (int)param_int(&n->params, BATCHNORM_ACT);
  if (act != ACT_NONE) onnx_out_then_unary(w, op_def(act_op_kind(act))->onnx_op);
  return TEQ_OK;
}

const OpDef op_def_batchnorm = {
  .kind = OP_BATCHNORM, .name = "batchnorm", .onnx_op = "BatchNormalization",
  .n_in_min = 5, .n_in_max = 5, .n_out_min = 1, .n_out_max = 1,
  .params = batchnorm_params, .n_params = 2,
  .flags = OPF_NONLINEAR,
  .infer_shape = batchnorm_infer,
  .eval_f32 = batchnorm_eval_f32, .eval_modp = batchnorm_eval_modp,
  .eval_cuda = CUDA_EVAL(batchnorm),
  .modp_standin = batchnorm_standin,
  .onnx_read = batchnorm_onnx_read, .onnx_write = batchnorm_onnx_write,
};
