/* pool.c: 2-D max and average pooling and their global forms (ONNX
 * MaxPool, AveragePool, GlobalMaxPool, GlobalAveragePool). A 1-D ONNX pool
 * over [N, C, L] is imported as the 2-D one over [N, C, 1, L] between
 * reshapes, a 3-D one as pool3d.c's; the global forms take any number of
 * spatial axes.
 *
 * Output extents follow ONNX: floor((in + pads - dilated kernel) / stride)
 * + 1, or with ceil_mode the ceiling, except that a last window starting
 * inside the end padding is dropped (as ONNX Runtime and PyTorch do). A
 * pad must be smaller than the (dilated) kernel, so no window lies wholly
 * in the padding on the side it starts. An average divides by the window
 * clipped to the explicit padding (count_include_pad=1) or to the input
 * (count_include_pad=0); the ceil_mode overhang past the padding never
 * counts.
 *
 * Z_p: average pooling is linear, a sum times the modular inverse of the
 * count, so it is OPF_MULTILINEAR and conv2d with const_pool reproduces it
 * exactly. Max pooling compares residues as integers: a fixed function,
 * not a polynomial, so it has no stand-in and no OPF_NONLINEAR flag;
 * neither flag is set, and PET treats it as a boundary like any operator
 * that is not multilinear. */
#include <float.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"


typedef struct PoolGeom {
  int64_t n, c, h, w;     /* input [N, C, H, W] */
  int64_t kh, kw, oh, ow;
  int64_t sh, sw, dh, dw;
  int64_t pt, pl, pb, pr;
  bool ceil_mode;
} PoolGeom;

static bool is_maxpool(const Node *n) { return n->kind == OP_MAXPOOL; }

static int pool_params(const Node *n, PoolGeom *g, Diag *d) {
  const Params *p = &n->params;
  g->kh = p->v[POOL_KERNEL].i[0], g->kw = p->v[POOL_KERNEL].i[1];
  g->sh = p->v[POOL_STRIDE].i[0], g->sw = p->v[POOL_STRIDE].i[1];
  g->pt = p->v[POOL_PADS].i[0], g->pl = p->v[POOL_PADS].i[1];
  g->pb = p->v[POOL_PADS].i[2], g->pr = p->v[POOL_PADS].i[3];
  g->dh = is_maxpool(n) ? p->v[POOL_DILATION].i[0] : 1;
  g->dw = is_maxpool(n) ? p->v[POOL_DILATION].i[1] : 1;
  g->ceil_mode = param_int(p, POOL_CEIL) != 0;
  if (g->kh < 1 || g->kw < 1)
    return op_error(n, d, "kernel=(%lld %lld): must be >= 1", (long long)g->kh, (long long)g->kw);
  if (g->sh < 1 || g->sw < 1)
    return op_error(n, d, "stride=(%lld %lld): must be >= 1", (long long)g->sh, (long long)g->sw);
  if (g->dh < 1 || g->dw < 1)
    return op_error(n, d, "dilation=(%lld %lld): must be >= 1", (long long)g->dh,
                    (long long)g->dw);
  int64_t eh = (g->kh - 1) * g->dh + 1, ew = (g->kw - 1) * g->dw + 1;
  if (g->pt < 0 || g->pl < 0 || g->pb < 0 || g->pr < 0 || g->pt >= eh || g->pb >= eh ||
      g->pl >= ew || g->pr >= ew)
    return op_error(n, d, "pads=(%lld %lld %lld %lld): each must be >= 0 and smaller than the "
                    "kernel extent %lldx%lld", (long long)g->pt, (long long)g->pl,
                    (long long)g->pb, (long long)g->pr, (long long)eh, (long long)ew);
  return TEQ_OK;
}

/* One output extent, or -1 if the window does not fit the padded input. */
static int64_t pool_out_dim(int64_t in, int64_t p0, int64_t p1, int64_t k, int64_t dl, int64_t s,
                            bool ceil_mode) {
  int64_t span = in + p0 + p1 - (k - 1) * dl - 1;
  if (span < 0) return -1;
  int64_t out = (ceil_mode ? span + s - 1 : span) / s + 1;
  if (ceil_mode && (out - 1) * s >= in + p0) out--; /* starts in the end padding */
  return out;
}

static int pool_geom(const Node *n, const Shape *x, PoolGeom *g, Diag *d) {
  char sx[SHAPE_STR_MAX];
  int rc = pool_params(n, g, d);
  if (rc) return rc;
  if (x->ndim != 4)
    return op_error(n, d, "input X %s: expected [N, C, H, W]", shape_format(x, sx, sizeof sx));
  for (int i = 0; i < 4; i++)
    if (x->d[i] < 1)
      return op_error(n, d, "input X %s: empty dimension", shape_format(x, sx, sizeof sx));
  g->n = x->d[0], g->c = x->d[1], g->h = x->d[2], g->w = x->d[3];
  g->oh = pool_out_dim(g->h, g->pt, g->pb, g->kh, g->dh, g->sh, g->ceil_mode);
  g->ow = pool_out_dim(g->w, g->pl, g->pr, g->kw, g->dw, g->sw, g->ceil_mode);
  if (g->oh < 1 || g->ow < 1)
    return op_error(n, d, "kernel=(%lld %lld): larger than the padded input %lldx%lld",
                    (long long)g->kh, (long long)g->kw, (long long)(g->h + g->pt + g->pb),
                    (long long)(g->w + g->pl + g->pr));
  return TEQ_OK;
}

static int pool_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  PoolGeom g;
  int rc = pool_geom(n, &in[0], &g, d);
  if (rc) return rc;
  out[0] = shape_make(4, (int64_t[]){g.n, g.c, g.oh, g.ow});
  return TEQ_OK;
}

/* The window of output (oy, ox): its first row and column and the taps
 * that land inside the input. */
typedef struct Window {
  int64_t y0, x0, ilo, ihi, jlo, jhi;
} Window;

static Window pool_window(const PoolGeom *g, int64_t oy, int64_t ox) {
  Window win;
  win.y0 = oy * g->sh - g->pt;
  win.x0 = ox * g->sw - g->pl;
  tap_range(win.y0, g->kh, g->dh, g->h, &win.ilo, &win.ihi);
  tap_range(win.x0, g->kw, g->dw, g->w, &win.jlo, &win.jhi);
  return win;
}

/* The divisor of an average window (dilation is 1 for avgpool): clipped to
 * the explicit padding, or to the input without count_include_pad. */
static int64_t avg_count(const PoolGeom *g, const Window *win, bool include_pad) {
  if (!include_pad) return (win->ihi - win->ilo) * (win->jhi - win->jlo);
  int64_t y1 = win->y0 + g->kh, x1 = win->x0 + g->kw;
  if (y1 > g->h + g->pb) y1 = g->h + g->pb;
  if (x1 > g->w + g->pr) x1 = g->w + g->pr;
  return (y1 - win->y0) * (x1 - win->x0);
}

/* ---- float32 and Z_p kernels ---- */

/* Float32 pools are separable: a window's max (or sum) is the max (sum)
 * over its rows of each row's max (sum) over its columns. So each output
 * row first folds its window's input rows into one row, a contiguous pass
 * over whole input rows, then each output reads only kw values of it: kh +
 * kw operations per output instead of kh * kw, and no clipping per window.
 * Each output column's taps, and its divisor's column part, are worked out
 * once per call. */
typedef struct PoolCol {
  int64_t x0, jlo, jhi; /* first input column, taps inside the input */
  int64_t pad_cols;     /* columns inside the explicit padding (avgpool) */
} PoolCol;

static void pool_columns(const PoolGeom *g, PoolCol *cols) {
  for (int64_t ox = 0; ox < g->ow; ox++) {
    PoolCol *c = &cols[ox];
    c->x0 = ox * g->sw - g->pl;
    tap_range(c->x0, g->kw, g->dw, g->w, &c->jlo, &c->jhi);
    int64_t x1 = c->x0 + g->kw;
    c->pad_cols = (x1 < g->w + g->pr ? x1 : g->w + g->pr) - c->x0;
  }
}

/* row[0..w) = max or sum over taps [ilo, ihi) of the window's input rows. */
static void pool_fold_rows(const PoolGeom *g, const float *xp, int64_t y0, int64_t ilo,
                           int64_t ihi, bool is_max, float *row) {
  const float *first = xp + (y0 + ilo * g->dh) * g->w;
  memcpy(row, first, (size_t)g->w * sizeof *row);
  for (int64_t i = ilo + 1; i < ihi; i++) {
    const float *xr = xp + (y0 + i * g->dh) * g->w;
    if (is_max)
      for (int64_t c = 0; c < g->w; c++) row[c] = xr[c] > row[c] ? xr[c] : row[c];
    else
      for (int64_t c = 0; c < g->w; c++) row[c] += xr[c];
  }
}

/* One output row from its folded input row. An empty window (possible
 * only with dilation) gives ONNX Runtime's lowest float, or 0 for an
 * average. rows/pad_rows: the window's rows inside the input / padding. */
static void pool_out_row(const PoolGeom *g, const PoolCol *cols, const float *row, bool is_max,
                         bool include_pad, int64_t rows, int64_t pad_rows, float *y) {
  for (int64_t ox = 0; ox < g->ow; ox++) {
    const PoolCol *c = &cols[ox];
    float acc = is_max ? -FLT_MAX : 0.0f;
    const float *r = row + c->x0;
    for (int64_t j = c->jlo; j < c->jhi; j++) {
      float v = r[j * g->dw];
      acc = is_max ? (v > acc ? v : acc) : acc + v;
    }
    if (!is_max) {
      int64_t cnt = include_pad ? pad_rows * c->pad_cols : rows * (c->jhi - c->jlo);
      acc = cnt ? acc / (float)cnt : 0.0f;
    }
    y[ox] = rows ? acc : is_max ? -FLT_MAX : 0.0f;
  }
}

static int pool_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  PoolGeom g;
  int rc = pool_geom(n, &in[0]->shape, &g, d);
  if (rc) return rc;
  bool is_max = is_maxpool(n), include_pad = !is_max && param_int(&n->params, AVG_COUNT_PAD);
  PoolCol *cols = malloc((size_t)g.ow * sizeof *cols);
  float *row = malloc((size_t)g.w * sizeof *row);
  if (!cols || !row) {
    free(cols);
    free(row);
    return TEQ_ERR_NOMEM;
  }
  pool_columns(&g, cols);
  const float *x = in[0]->data;
  float *y = out[0]->data;
  for (int64_t plane = 0; plane < g.n * g.c; plane++)
    for (int64_t oy = 0; oy < g.oh; oy++) {
      int64_t y0 = oy * g.sh - g.pt, ilo, ihi;
      tap_range(y0, g.kh, g.dh, g.h, &ilo, &ihi);
      int64_t y1 = y0 + g.kh < g.h + g.pb ? y0 + g.kh : g.h + g.pb;
      if (ihi > ilo) pool_fold_rows(&g, x + plane * g.h * g.w, y0, ilo, ihi, is_max, row);
      pool_out_row(&g, cols, row, is_max, include_pad, ihi - ilo, y1 - y0,
                   y + (plane * g.oh + oy) * g.ow);
    }
  free(cols);
  free(row);
  return TEQ_OK;
}

static int pool_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  PoolGeom g;
  int rc = pool_geom(n, &in[0]->shape, &g, d);
  if (rc) return rc;
  bool is_max = is_maxpool(n), include_pad = !is_max && param_int(&n->params, AVG_COUNT_PAD);
  const uint32_t *x = in[0]->data;
  uint32_t *y = out[0]->data;
  /* An inverse costs 60 multiplications; windows have few sizes. */
  uint32_t inv_of[64] = {0};
  bool have_inv[64] = {false};
  for (int64_t plane = 0; plane < g.n * g.c; plane++) {
    const uint32_t *xp = x + plane * g.h * g.w;
    for (int64_t oy = 0; oy < g.oh; oy++)
      for (int64_t ox = 0; ox < g.ow; ox++) {
        Window win = pool_window(&g, oy, ox);
        uint64_t acc = 0; /* a max, or a sum of < 2^33 residues */
        for (int64_t i = win.ilo; i < win.ihi; i++) {
          const uint32_t *xr = xp + (win.y0 + i * g.dh) * g.w + win.x0;
          for (int64_t j = win.jlo; j < win.jhi; j++) {
            uint32_t v = xr[j * g.dw];
            acc = is_max ? (v > acc ? v : acc) : acc + v;
          }
        }
        if (is_max) {
          *y++ = (uint32_t)acc;
          continue;
        }
        /* modp_inv(0) is 0: an empty window averages to 0, as in float. */
        int64_t count = avg_count(&g, &win, include_pad);
        uint32_t inv;
        if (count >= 0 && count < 64) {
          if (!have_inv[count]) inv_of[count] = modp_inv((uint32_t)count), have_inv[count] = true;
          inv = inv_of[count];
        } else {
          inv = modp_inv(modp_from_int(count));
        }
        *y++ = modp_mul(modp_reduce(acc), inv);
      }
  }
  return TEQ_OK;
}

/* ---- ONNX ---- */

/* Shared by MaxPool and AveragePool: the window (onnx_window_read), 1-D or
 * 2-D by the input's rank or else the length of kernel_shape, and auto_pad
 * as pads. A 1-D pool is the 2-D one over X with a unit axis 2
 * (onnx_in_as_raised); a 3-D one is pool3d.c's (onnx_in_as_kind). */
static int pool_onnx_read_window(OnnxNodeIn *v, Params *p, bool dilated, Diag *d) {
  const char *op = onnx_in_op_type(v);
  const Shape *x = onnx_in_input_shape(v, 0);
  char sx[SHAPE_STR_MAX];
  if (x && x->ndim >= 0 && x->ndim < 3)
    return onnx_in_error(v, d, "input X %s has rank %d: a %s's input has rank 3 or more",
                         shape_format(x, sx, sizeof sx), x->ndim, op);
  int64_t k[TEQ_MAX_PARAM_LEN];
  int nk = 0;
  if (!onnx_in_attr_ints(v, "kernel_shape", k, TEQ_MAX_PARAM_LEN, &nk))
    return onnx_in_error(v, d, "%s without the required attribute kernel_shape", op);
  OnnxWindow win;
  int spatial = x && x->ndim >= 0 ? x->ndim - 2 : nk;
  if (spatial == 3) {
    onnx_in_as_kind(v, dilated ? OP_MAXPOOL3D : OP_AVGPOOL3D);
    return TEQ_OK;
  }
  int rc = onnx_window_read(v, spatial, &win, d);
  if (rc) return rc;
  if (spatial == 1 && !(x && x->ndim == 3))
    return onnx_in_unsupported(v, d, "a %s over one spatial axis needs the shape of X", op);
  Shape x4 = onnx_window_raised(x);
  rc = onnx_auto_pads(v, x ? &x4 : NULL, 2, win.k, win.s, win.dl, win.pads, d);
  if (rc) return rc;
  param_set_ints(p, POOL_KERNEL, win.k, 2);
  param_set_ints(p, POOL_STRIDE, win.s, 2);
  param_set_ints(p, POOL_PADS, win.pads, 4);
  if (dilated) param_set_ints(p, POOL_DILATION, win.dl, 2);
  if (spatial == 1) onnx_in_as_raised(v, 1u << 0);
  return TEQ_OK;
}

/* The Indices output is not computed; unread, it is dropped, and with it
 * the one thing storage_order changes (their row- or column-major order). */
static int maxpool_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t order = 0;
  if (!onnx_in_drop_unread_outputs(v, 1))
    return onnx_in_unsupported(v, d, "MaxPool whose Indices output is read is not supported");
  if (onnx_in_attr_int(v, "storage_order", &order) && order != 0 && order != 1)
    return onnx_in_error(v, d, "attribute storage_order=%lld: expected 0 or 1",
                         (long long)order);
  return pool_onnx_read_window(v, p, true, d);
}

/* AveragePool gained dilations in opset 19; only the trivial ones map. */
static int avgpool_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  int64_t dl[TEQ_MAX_PARAM_LEN];
  int nd = 0;
  if (onnx_in_attr_ints(v, "dilations", dl, TEQ_MAX_PARAM_LEN, &nd))
    for (int i = 0; i < nd; i++)
      if (dl[i] != 1)
        return onnx_in_unsupported(v, d, "AveragePool with dilations is not supported");
  return pool_onnx_read_window(v, p, false, d);
}

/* ---- rows ---- */

static const OpParam maxpool_params[] = {
  POOL_WINDOW_PARAMS_OF(2),
  [POOL_DILATION] = WINDOW_PARAM_DILATION,
};

static const OpParam avgpool_params[] = {
  POOL_WINDOW_PARAMS_OF(2),
  [AVG_COUNT_PAD] = AVG_PARAM_COUNT_PAD,
};

/* A 1x1 window at stride 1 (no padding fits it) passes every element
 * through: VGG's adaptive average pool of its 7x7 map to 7x7 is one. */
static bool pool_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                      int64_t *first) {
  (void)in, (void)consts, (void)out;
  const Params *p = &n->params;
  for (int i = 0; i < 2; i++)
    if (p->v[POOL_KERNEL].i[i] != 1 || p->v[POOL_STRIDE].i[i] != 1) return false;
  for (int i = 0; i < 4; i++)
    if (p->v[POOL_PADS].i[i] != 0) return false;
  *first = 0;
  return true;
}

/* Zeros padded around an average pool's input count in its sums and its
 * divisors: its own padding does the same where it counts the padding
 * (count_include_pad), as it must then, and where it has none. With
 * ceil_mode a window may run past the padding, where the two forms'
 * divisors are clipped alike by Teq but by no stated rule elsewhere: left
 * alone. */
static bool avgpool_take_zero_pad(const Node *n, int rank, const int64_t *pads, Params *p) {
  (void)n;
  bool own = false;
  for (int i = 0; i < 4; i++) own |= p->v[POOL_PADS].i[i] != 0;
  if ((own && !param_int(p, AVG_COUNT_PAD)) || param_int(p, POOL_CEIL) ||
      !window_take_zero_pad(rank, pads, p, POOL_PADS))
    return false;
  /* A pool's padding is narrower than its window (pool_params); zeros a
   * whole window wide stay a Pad. Unpadded, the flag means nothing: left
   * as it was, one spelling for the table to find (DenseNet's Pads of no
   * extent before its pools). */
  bool padded = false;
  for (int i = 0; i < 4; i++) {
    int64_t pad = p->v[POOL_PADS].i[i];
    if (pad >= p->v[POOL_KERNEL].i[i % 2]) return false;
    padded |= pad != 0;
  }
  if (padded) param_set_int(p, AVG_COUNT_PAD, 1);
  return true;
}

const OpDef op_def_maxpool = {
  .kind = OP_MAXPOOL, .name = "maxpool", .axiom_name = "maxpool", .onnx_op = "MaxPool",
  .eval_cuda = CUDA_EVAL(maxpool),
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = maxpool_params, .n_params = 5,
  .infer_shape = pool_infer,
  .eval_f32 = pool_eval_f32, .eval_modp = pool_eval_modp,
  .onnx_read = maxpool_onnx_read, .view = pool_view,
};

const OpDef op_def_avgpool = {
  .kind = OP_AVGPOOL, .name = "avgpool", .axiom_name = "avgpool", .onnx_op = "AveragePool",
  .eval_cuda = CUDA_EVAL(avgpool),
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = avgpool_params, .n_params = 5,
  .flags = OPF_MULTILINEAR,
  .infer_shape = pool_infer,
  .eval_f32 = pool_eval_f32, .eval_modp = pool_eval_modp,
  .onnx_read = avgpool_onnx_read, .view = pool_view, .take_zero_pad = avgpool_take_zero_pad,
};

/* ---- global pools: [N, C, d1, ...] -> [N, C, 1, ...] ---- */

static int global_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char sx[SHAPE_STR_MAX];
  if (in[0].ndim < 3)
    return op_error(n, d, "input X %s: expected [N, C, spatial...] with at least one spatial "
                    "dimension", shape_format(&in[0], sx, sizeof sx));
  for (int i = 2; i < in[0].ndim; i++)
    if (in[0].d[i] < 1)
      return op_error(n, d, "input X %s: empty spatial dimension",
                      shape_format(&in[0], sx, sizeof sx));
  out[0] = in[0];
  for (int i = 2; i < in[0].ndim; i++) out[0].d[i] = 1;
  return TEQ_OK;
}

/* Planes (N*C) and elements per plane of the input. */
static void global_dims(const Tensor *x, int64_t *planes, int64_t *size) {
  *planes = x->shape.d[0] * x->shape.d[1];
  *size = 1;
  for (int i = 2; i < x->shape.ndim; i++) *size *= x->shape.d[i];
}

static int global_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)d;
  int64_t planes, size;
  global_dims(in[0], &planes, &size);
  bool is_max = n->kind == OP_GLOBAL_MAXPOOL;
  const float *x = in[0]->data;
  float *y = out[0]->data;
  for (int64_t p = 0; p < planes; p++) {
    const float *xp = x + p * size;
    if (is_max) {
      float m = xp[0];
      for (int64_t i = 1; i < size; i++) m = xp[i] > m ? xp[i] : m;
      y[p] = m;
    } else {
      double s = 0; /* large planes: keep the mean accurate */
      for (int64_t i = 0; i < size; i++) s += xp[i];
      y[p] = (float)(s / (double)size);
    }
  }
  return TEQ_OK;
}

static int global_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)d;
  int64_t planes, size;
  global_dims(in[0], &planes, &size);
  bool is_max = n->kind == OP_GLOBAL_MAXPOOL;
  const uint32_t *x = in[0]->data;
  uint32_t *y = out[0]->data;
  uint32_t inv = modp_inv(modp_from_int(size));
  for (int64_t p = 0; p < planes; p++) {
    const uint32_t *xp = x + p * size;
    uint64_t acc = 0;
    for (int64_t i = 0; i < size; i++) acc = is_max ? (xp[i] > acc ? xp[i] : acc) : acc + xp[i];
    y[p] = is_max ? (uint32_t)acc : modp_mul(modp_reduce(acc), inv);
  }
  return TEQ_OK;
}

/* A plane of one element is its own mean and maximum. */
static bool global_view(const Node *n, const Shape *in, const Tensor *const *consts, int out,
                        int64_t *first) {
  (void)n, (void)consts, (void)out;
  for (int i = 2; i < in[0].ndim; i++)
    if (in[0].d[i] != 1) return false;
  *first = 0;
  return true;
}

const OpDef op_def_global_avgpool = {
  .kind = OP_GLOBAL_AVGPOOL, .name = "global_avgpool", .onnx_op = "GlobalAveragePool",
  .eval_cuda = CUDA_EVAL(global_avgpool),
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_MULTILINEAR,
  .infer_shape = global_infer,
  .eval_f32 = global_eval_f32, .eval_modp = global_eval_modp, .view = global_view,
};

const OpDef op_def_global_maxpool = {
  .kind = OP_GLOBAL_MAXPOOL, .name = "global_maxpool", .onnx_op = "GlobalMaxPool",
  .eval_cuda = CUDA_EVAL(global_maxpool),
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .infer_shape = global_infer,
  .eval_f32 = global_eval_f32, .eval_modp = global_eval_modp, .view = global_view,
};
