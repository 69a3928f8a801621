/* test_pool.c: maxpool, avgpool, their 3-D rows and the global pools. Each
 * float32 kernel
 * is checked against a reference written here from the definition (windows
 * in padded coordinates, ceil_mode by counting window starts), on random
 * inputs over many configurations; each Z_p kernel against the same
 * reference in integers; a few results worked by hand (ceil_mode's dropped
 * window, count_include_pad); TASO's identity conv2d(x, const_pool,
 * groups=c) == avgpool(x, count_include_pad=1) in both modes; and shape
 * inference's error messages. Kernels run through their registry rows; one
 * test exports pools to ONNX and imports them back. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/modp.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/cuda_check.h"
#include "tests/tensor_check.h"

/* ---- the reference ---- */

typedef struct PoolCase {
  int max; /* 1 maxpool, 0 avgpool */
  int n, c, h, w, kh, kw, sh, sw, pt, pl, pb, pr, dh, dw, ceil, include_pad;
} PoolCase;

/* Window starts o*s - p0 for o = 0, 1, ...: without ceil_mode while the
 * whole dilated window fits the padded input; with it, while the previous
 * window had not reached the end and the window starts before the end
 * padding. */
static int ref_out_dim(int in, int k, int s, int p0, int p1, int dl, bool ceil_mode) {
  int ext = (k - 1) * dl + 1, span = in + p0 + p1 - ext, o = 0;
  if (ceil_mode)
    while (o == 0 || ((o - 1) * s < span && o * s - p0 < in)) o++;
  else
    while (o * s <= span) o++;
  return o;
}

/* Max, or sum and divisor, of every window, from the definition. */
static void ref_pool(const PoolCase *k, const Tensor *x, bool modp, Tensor *y) {
  int oh = (int)y->shape.d[2], ow = (int)y->shape.d[3];
  for (int p = 0; p < k->n * k->c; p++)
    for (int oy = 0; oy < oh; oy++)
      for (int ox = 0; ox < ow; ox++) {
        double best = -FLT_MAX, sum = 0;
        uint64_t best_m = 0, sum_m = 0;
        int n_in = 0, n_pad = 0;
        for (int i = 0; i < k->kh; i++)
          for (int j = 0; j < k->kw; j++) {
            int iy = oy * k->sh - k->pt + i * k->dh, ix = ox * k->sw - k->pl + j * k->dw;
            n_pad += iy < k->h + k->pb && ix < k->w + k->pr;
            if (iy < 0 || iy >= k->h || ix < 0 || ix >= k->w) continue;
            int64_t at = ((int64_t)p * k->h + iy) * k->w + ix;
            n_in++;
            if (modp) {
              uint32_t v = ((uint32_t *)x->data)[at];
              best_m = v > best_m ? v : best_m;
              sum_m += v;
            } else {
              double v = ((float *)x->data)[at];
              best = v > best ? v : best;
              sum += v;
            }
          }
        int cnt = k->include_pad ? n_pad : n_in;
        int64_t at = ((int64_t)p * oh + oy) * ow + ox;
        if (modp)
          ((uint32_t *)y->data)[at] = k->max ? (uint32_t)best_m
                                             : modp_mul(modp_reduce(sum_m), modp_inv(cnt));
        else
          ((float *)y->data)[at] = (float)(k->max ? best : cnt ? sum / cnt : 0);
      }
}

static void pool_setup(Op *o, const PoolCase *k) {
  op_init(o, k->max ? OP_MAXPOOL : OP_AVGPOOL, 1);
  op_ints(o, "kernel", (int64_t[]){k->kh, k->kw}, 2);
  op_ints(o, "stride", (int64_t[]){k->sh, k->sw}, 2);
  op_ints(o, "pads", (int64_t[]){k->pt, k->pl, k->pb, k->pr}, 4);
  op_int(o, "ceil_mode", k->ceil);
  if (k->max) op_ints(o, "dilation", (int64_t[]){k->dh, k->dw}, 2);
  else op_int(o, "count_include_pad", k->include_pad);
}

static const PoolCase pool_cases[] = {
  /* max n c  h  w kh kw sh sw pt pl pb pr dh dw ceil incl */
  {1, 1, 3, 8, 8, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 0, 0},    /* 2x2 s2 */
  {1, 2, 4, 112, 112, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0, 0}, /* resnet stem */
  {1, 1, 2, 9, 7, 3, 2, 2, 3, 1, 0, 2, 1, 1, 1, 1, 0},    /* ceil, odd pads */
  {1, 1, 2, 4, 4, 2, 2, 2, 2, 0, 0, 1, 1, 1, 1, 1, 0},    /* ceil drops a window */
  {1, 2, 3, 10, 9, 3, 3, 1, 2, 2, 1, 2, 1, 2, 2, 0, 0},   /* dilated */
  {1, 1, 1, 5, 5, 2, 2, 1, 1, 0, 0, 0, 0, 4, 4, 1, 0},    /* dilated, ceil */
  {0, 1, 3, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 1},    /* inception 3x3 s1 p1 */
  {0, 1, 3, 8, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},
  {0, 2, 2, 7, 9, 2, 3, 2, 2, 1, 0, 1, 2, 1, 1, 1, 1},    /* ceil overhang, include pad */
  {0, 2, 2, 7, 9, 2, 3, 2, 2, 1, 0, 1, 2, 1, 1, 1, 0},
  {0, 1, 4, 5, 5, 2, 2, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1},    /* ceil, no pads */
  {0, 3, 2, 6, 11, 5, 4, 3, 1, 2, 3, 2, 0, 1, 1, 0, 0},
  {0, 1, 1, 4, 4, 4, 4, 1, 1, 0, 0, 0, 0, 1, 1, 0, 1},    /* one window */
};

/* Every case against the naive window, in float32 and in Z_p, and the
 * GPU's 2-D pool kernel, its arithmetic run on the host by
 * cuda_kernel_on_host, equal to the CPU row to the bit (it combines the
 * taps in the CPU's order and divides as it does); in a build without
 * CUDA there is no kernel to check. */
static void test_pool_vs_reference(void) {
  bool kernels = cuda_kernels_built("the pool kernel's host check");
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof pool_cases / sizeof *pool_cases; ci++) {
    const PoolCase *k = &pool_cases[ci];
    Op o;
    pool_setup(&o, k);
    Shape sx = shape_of(4, k->n, k->c, k->h, k->w);
    Shape want = shape_of(4, k->n, k->c, ref_out_dim(k->h, k->kh, k->sh, k->pt, k->pb, k->dh, k->ceil),
                          ref_out_dim(k->w, k->kw, k->sw, k->pl, k->pr, k->dw, k->ceil));
    Tensor *x = random_f32(sx, 10 + ci), *y = op_run(&o, &x, false, &d);
    Tensor *r = tensor_new(DT_F32, &want);
    ref_pool(k, x, false, r);
    CHECK_MSG(y && shape_equal(&y->shape, &want) && max_rel_err(y, r) < 1e-6,
              "pool case %zu: error %g %s", ci, max_rel_err(y, r), diag_last(&d));
    if (kernels && y) {
      Tensor *g = tensor_new(DT_F32, &y->shape);
      int rc = g ? cuda_kernel_on_host(NULL, &o.node, &x, g, &d) : TEQ_ERR_NOMEM;
      CHECK_MSG(rc == TEQ_OK && tensors_identical(g, y), "pool case %zu: the GPU kernel on the "
                "host differs from the CPU row %s", ci, diag_last(&d));
      tensor_unref(g);
    }
    /* Z_p on small integers, negatives included: max compares residues. */
    Tensor *xs = random_ints(sx, 3, 20 + ci), *xm = f32_to_modp(xs),
           *ym = op_run(&o, &xm, true, &d);
    Tensor *rm = tensor_new(DT_MODP, &want);
    ref_pool(k, xm, true, rm);
    CHECK_MSG(tensors_identical(ym, rm), "pool case %zu in Z_p", ci);
    unref_all((Tensor *[]){x, y, r, xs, xm, ym, rm}, 7);
  }
  diag_fini(&d);
}

/* ---- 3-D pools ---- */

typedef struct Pool3Case {
  int max, n, c, in[3], k[3], s[3], p[6], dl[3], ceil, include_pad;
} Pool3Case;

static const Pool3Case pool3_cases[] = {
  {1, 1, 2, {4, 7, 6}, {1, 3, 3}, {1, 2, 2}, {0, 1, 1, 0, 1, 1}, {1, 1, 1}, 0, 0}, /* S3D's */
  {1, 2, 3, {5, 6, 7}, {3, 3, 3}, {2, 2, 2}, {1, 1, 1, 1, 1, 1}, {1, 1, 1}, 0, 0},
  {1, 1, 2, {5, 5, 7}, {2, 2, 3}, {2, 2, 2}, {0, 1, 1, 1, 0, 2}, {1, 1, 1}, 1, 0}, /* ceil */
  {1, 1, 1, {7, 6, 6}, {2, 2, 2}, {1, 1, 2}, {1, 0, 0, 0, 1, 1}, {3, 2, 1}, 1, 0}, /* dilated */
  {0, 1, 2, {4, 9, 9}, {2, 7, 7}, {1, 1, 1}, {0}, {1, 1, 1}, 0, 0},               /* S3D's */
  {0, 2, 2, {5, 6, 7}, {3, 3, 2}, {2, 2, 2}, {1, 1, 0, 1, 1, 1}, {1, 1, 1}, 1, 1}, /* overhang */
  {0, 2, 2, {5, 6, 7}, {3, 3, 2}, {2, 2, 2}, {1, 1, 0, 1, 1, 1}, {1, 1, 1}, 1, 0},
  {0, 1, 3, {3, 4, 5}, {3, 3, 3}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1}, 0, 1},
};

/* Max, or sum and divisor, of every window from the definition, in float
 * (double sums) or Z_p; extents by counting window starts (ref_out_dim). */
static Tensor *ref_pool3(const Pool3Case *k, const Tensor *x, bool modp) {
  int o[3];
  for (int a = 0; a < 3; a++)
    o[a] = ref_out_dim(k->in[a], k->k[a], k->s[a], k->p[a], k->p[3 + a], k->dl[a], k->ceil);
  Shape sy = {5, {k->n, k->c, o[0], o[1], o[2]}};
  Tensor *y = tensor_new(modp ? DT_MODP : DT_F32, &sy);
  int64_t at = 0;
  for (int pl = 0; pl < k->n * k->c; pl++)
    for (int z = 0; z < o[0]; z++)
      for (int r = 0; r < o[1]; r++)
        for (int q = 0; q < o[2]; q++, at++) {
          double best = -FLT_MAX, sum = 0;
          uint64_t best_m = 0, sum_m = 0;
          int n_in = 0, n_pad = 0, pos[3] = {z, r, q};
          for (int t0 = 0; t0 < k->k[0]; t0++)
            for (int t1 = 0; t1 < k->k[1]; t1++)
              for (int t2 = 0; t2 < k->k[2]; t2++) {
                int i[3], tap[3] = {t0, t1, t2};
                bool in_pad = true, inside = true;
                for (int a = 0; a < 3; a++) {
                  i[a] = pos[a] * k->s[a] - k->p[a] + tap[a] * k->dl[a];
                  in_pad = in_pad && i[a] < k->in[a] + k->p[3 + a];
                  inside = inside && i[a] >= 0 && i[a] < k->in[a];
                }
                n_pad += in_pad;
                if (!inside) continue;
                n_in++;
                int64_t e = (((int64_t)pl * k->in[0] + i[0]) * k->in[1] + i[1]) * k->in[2] + i[2];
                if (modp) {
                  uint32_t v = ((uint32_t *)x->data)[e];
                  best_m = v > best_m ? v : best_m;
                  sum_m += v;
                } else {
                  double v = ((float *)x->data)[e];
                  best = v > best ? v : best;
                  sum += v;
                }
              }
          int cnt = k->include_pad ? n_pad : n_in;
          if (modp)
            ((uint32_t *)y->data)[at] = k->max ? (uint32_t)best_m
                                               : modp_mul(modp_reduce(sum_m), modp_inv(cnt));
          else
            ((float *)y->data)[at] = (float)(k->max ? best : cnt ? sum / cnt : 0);
        }
  return y;
}

/* maxpool3d and avgpool3d against the definition, in float32 and in Z_p
 * (small integers, negatives included); and what shape inference says of
 * a pad as wide as the window. */
static void test_pool3d(void) {
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof pool3_cases / sizeof *pool3_cases; ci++) {
    const Pool3Case *k = &pool3_cases[ci];
    OpKind kind = k->max ? OP_MAXPOOL3D : OP_AVGPOOL3D;
    Op o;
    op_init(&o, kind, 1);
    op_ints(&o, "kernel", (int64_t[]){k->k[0], k->k[1], k->k[2]}, 3);
    op_ints(&o, "stride", (int64_t[]){k->s[0], k->s[1], k->s[2]}, 3);
    op_ints(&o, "pads", (int64_t[]){k->p[0], k->p[1], k->p[2], k->p[3], k->p[4], k->p[5]}, 6);
    op_int(&o, "ceil_mode", k->ceil);
    if (k->max) op_ints(&o, "dilation", (int64_t[]){k->dl[0], k->dl[1], k->dl[2]}, 3);
    else op_int(&o, "count_include_pad", k->include_pad);
    Shape sx = {5, {k->n, k->c, k->in[0], k->in[1], k->in[2]}};
    Tensor *x = random_f32(sx, 60 + ci), *y = op_run(&o, &x, false, &d);
    Tensor *r = ref_pool3(k, x, false);
    CHECK_MSG(y && r && shape_equal(&y->shape, &r->shape) && max_rel_err(y, r) < 1e-6,
              "pool3d case %zu: error %g %s", ci, max_rel_err(y, r), diag_last(&d));
    Tensor *xs = random_ints(sx, 3, 70 + ci), *xm = f32_to_modp(xs),
           *ym = op_run(&o, &xm, true, &d), *rm = ref_pool3(k, xm, true);
    CHECK_MSG(tensors_identical(ym, rm), "pool3d case %zu in Z_p", ci);
    unref_all((Tensor *[]){x, y, r, xs, xm, ym, rm}, 7);
  }
  Op o;
  op_init(&o, OP_MAXPOOL3D, 1);
  op_ints(&o, "kernel", (int64_t[]){2, 2, 2}, 3);
  op_ints(&o, "pads", (int64_t[]){0, 0, 2, 0, 0, 0}, 6);
  op_check_error(&o, (Shape[]){{5, {1, 1, 4, 4, 4}}}, "smaller than the kernel extent");
  op_check_error(&o, (Shape[]){{4, {1, 1, 4, 4}}}, "expected [N, C, D, H, W]");
  diag_fini(&d);
}

/* ---- by hand ---- */

static void check_values(const Tensor *y, const float *want, int n, const char *what) {
  bool ok = y && tensor_numel(y) == n;
  for (int i = 0; ok && i < n; i++) ok = fabsf(((float *)y->data)[i] - want[i]) < 1e-6f;
  CHECK_MSG(ok, "%s", what);
}

static void test_by_hand(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = iota_from(shape_of(4, 1, 1, 4, 4), 1); /* 1..16 row-major */
  Op o;
  op_init(&o, OP_MAXPOOL, 1);
  op_ints(&o, "kernel", (int64_t[]){2, 2}, 2);
  op_ints(&o, "stride", (int64_t[]){2, 2}, 2);
  Tensor *y = op_run(&o, &x, false, &d);
  check_values(y, (float[]){6, 8, 14, 16}, 4, "maxpool 2x2 s2");
  tensor_unref(y);
  /* ceil_mode with pads (0 0 1 1): a third window would start at row 4,
   * inside the end padding, so it is dropped: still 2x2. */
  op_ints(&o, "pads", (int64_t[]){0, 0, 1, 1}, 4);
  op_int(&o, "ceil_mode", 1);
  y = op_run(&o, &x, false, &d);
  check_values(y, (float[]){6, 8, 14, 16}, 4, "maxpool ceil_mode drops the padding window");
  tensor_unref(y);
  /* 3x3 s1 p1 average at the corner: 1+2+5+6 over 9 with the pads, over 4
   * without. */
  op_init(&o, OP_AVGPOOL, 1);
  op_ints(&o, "kernel", (int64_t[]){3, 3}, 2);
  op_ints(&o, "pads", (int64_t[]){1, 1, 1, 1}, 4);
  y = op_run(&o, &x, false, &d);
  CHECK(y && fabsf(((float *)y->data)[0] - 14.0f / 4) < 1e-6f);
  tensor_unref(y);
  op_int(&o, "count_include_pad", 1);
  y = op_run(&o, &x, false, &d);
  CHECK(y && fabsf(((float *)y->data)[0] - 14.0f / 9) < 1e-6f);
  tensor_unref(y);
  tensor_unref(x);
  /* 5x5, 2x2 s2 ceil: the last row and column of windows overhang the
   * input by one and there is no padding to count, so they divide by 2 (or
   * 1 at the corner) even with count_include_pad. */
  x = iota_from(shape_of(4, 1, 1, 5, 5), 1);
  op_init(&o, OP_AVGPOOL, 1);
  op_ints(&o, "kernel", (int64_t[]){2, 2}, 2);
  op_ints(&o, "stride", (int64_t[]){2, 2}, 2);
  op_int(&o, "ceil_mode", 1);
  op_int(&o, "count_include_pad", 1);
  y = op_run(&o, &x, false, &d);
  check_values(y, (float[]){4, 6, 7.5f, 14, 16, 17.5f, 21.5f, 23.5f, 25}, 9, "avgpool ceil 5x5");
  unref_all((Tensor *[]){x, y}, 2);
  diag_fini(&d);
}

/* Max pooling in Z_p compares residues: -1 is p - 1, the largest. */
static void test_modp_max_is_residue_order(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = tensor_new(DT_MODP, &(Shape){4, {1, 1, 1, 3}});
  uint32_t *p = x->data;
  p[0] = 5, p[1] = modp_from_int(-1), p[2] = 7;
  Op o;
  op_init(&o, OP_GLOBAL_MAXPOOL, 1);
  Tensor *y = op_run(&o, &x, true, &d);
  CHECK(y && ((uint32_t *)y->data)[0] == MODP_P - 1);
  unref_all((Tensor *[]){x, y}, 2);
  diag_fini(&d);
}

/* ---- conv2d(x, const_pool, groups=c) == avgpool(x, count_include_pad=1) ---- */

static void test_const_pool_identity(void) {
  static const int cfg[][8] = {
    /* kh kw sh sw pt pl pb pr */
    {3, 3, 1, 1, 1, 1, 1, 1}, {2, 2, 2, 2, 0, 0, 0, 0}, {3, 3, 2, 2, 1, 1, 1, 1},
    {5, 3, 1, 2, 2, 1, 2, 1}, {3, 3, 1, 1, 0, 0, 0, 0}, {2, 3, 1, 1, 1, 0, 0, 2},
  };
  Diag d;
  diag_init(&d);
  for (size_t i = 0; i < sizeof cfg / sizeof *cfg; i++) {
    const int *k = cfg[i];
    int c = 5;
    Op cp, conv, avg;
    op_init(&cp, OP_CONST_POOL, 0);
    op_int(&cp, "channels", c);
    op_int(&cp, "kh", k[0]);
    op_int(&cp, "kw", k[1]);
    op_init(&conv, OP_CONV2D, 2);
    op_int(&conv, "groups", c);
    op_ints(&conv, "stride", (int64_t[]){k[2], k[3]}, 2);
    op_ints(&conv, "pads", (int64_t[]){k[4], k[5], k[6], k[7]}, 4);
    op_init(&avg, OP_AVGPOOL, 1);
    op_ints(&avg, "kernel", (int64_t[]){k[0], k[1]}, 2);
    op_ints(&avg, "stride", (int64_t[]){k[2], k[3]}, 2);
    op_ints(&avg, "pads", (int64_t[]){k[4], k[5], k[6], k[7]}, 4);
    op_int(&avg, "count_include_pad", 1);
    for (int modp = 0; modp < 2; modp++) {
      Tensor *xf = modp ? random_ints(shape_of(4, 2, c, 9, 8), 3, 30 + i)
                        : random_f32(shape_of(4, 2, c, 9, 8), 40 + i);
      Tensor *x = modp ? f32_to_modp(xf) : tensor_ref(xf);
      Tensor *w = op_run(&cp, NULL, modp, &d);
      Tensor *a = op_run(&conv, (Tensor *[]){x, w}, modp, &d), *b = op_run(&avg, &x, modp, &d);
      if (modp) CHECK_MSG(tensors_identical(a, b), "const_pool identity %zu in Z_p", i);
      else CHECK_MSG(max_rel_err(a, b) < 1e-6, "const_pool identity %zu: %g", i, max_rel_err(a, b));
      unref_all((Tensor *[]){xf, x, w, a, b}, 5);
    }
  }
  diag_fini(&d);
}

/* ---- global pools ---- */

static void test_global(void) {
  static const Shape shapes[] = {{3, {2, 3, 7}}, {4, {2, 4, 5, 6}}, {5, {1, 2, 3, 2, 4}}};
  Diag d;
  diag_init(&d);
  for (size_t s = 0; s < 3; s++)
    for (int is_max = 0; is_max < 2; is_max++) {
      Op o;
      op_init(&o, is_max ? OP_GLOBAL_MAXPOOL : OP_GLOBAL_AVGPOOL, 1);
      Tensor *x = random_f32(shapes[s], 50 + s), *y = op_run(&o, &x, false, &d);
      Tensor *xs = random_ints(shapes[s], 3, 60 + s), *xm = f32_to_modp(xs),
             *ym = op_run(&o, &xm, true, &d);
      int64_t planes = shapes[s].d[0] * shapes[s].d[1], size = tensor_numel(x) / planes;
      bool ok = y && ym && y->shape.ndim == shapes[s].ndim && y->shape.d[1] == shapes[s].d[1] &&
                tensor_numel(y) == planes;
      for (int64_t p = 0; ok && p < planes; p++) {
        const float *xp = (float *)x->data + p * size;
        const uint32_t *mp = (uint32_t *)xm->data + p * size;
        double acc = is_max ? -INFINITY : 0;
        uint64_t accm = 0;
        for (int64_t i = 0; i < size; i++) {
          acc = is_max ? fmax(acc, xp[i]) : acc + xp[i];
          accm = is_max ? (mp[i] > accm ? mp[i] : accm) : accm + mp[i];
        }
        if (!is_max) acc /= (double)size;
        uint32_t wantm = is_max ? (uint32_t)accm : modp_mul(modp_reduce(accm), modp_inv((uint32_t)size));
        ok = fabs(((float *)y->data)[p] - acc) < 1e-6 && ((uint32_t *)ym->data)[p] == wantm;
      }
      CHECK_MSG(ok, "global %s on rank %d", is_max ? "max" : "avg", shapes[s].ndim);
      unref_all((Tensor *[]){x, y, xs, xm, ym}, 5);
    }
  diag_fini(&d);
}

/* ---- errors and rows ---- */

static void test_errors(void) {
  Op o;
  op_init(&o, OP_MAXPOOL, 1);
  op_ints(&o, "kernel", (int64_t[]){3, 3}, 2);
  op_ints(&o, "pads", (int64_t[]){3, 0, 0, 0}, 4);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 2, 8, 8)},
                 "maxpool: pads=(3 0 0 0): each must be >= 0 and smaller than the kernel "
                 "extent 3x3");
  op_ints(&o, "pads", (int64_t[]){0, 0, 0, 0}, 4);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 2, 2, 8)},
                 "kernel=(3 3): larger than the padded input 2x8");
  op_check_error(&o, (Shape[]){shape_of(3, 1, 2, 8)}, "input X [1, 2, 8]: expected [N, C, H, W]");
  op_ints(&o, "dilation", (int64_t[]){4, 1}, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 2, 8, 8)}, "larger than the padded input");
  op_init(&o, OP_AVGPOOL, 1);
  op_ints(&o, "kernel", (int64_t[]){0, 2}, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 2, 8, 8)}, "avgpool: kernel=0");
  op_init(&o, OP_GLOBAL_AVGPOOL, 1);
  op_check_error(&o, (Shape[]){shape_of(2, 3, 4)},
                 "global_avgpool: input X [3, 4]: expected [N, C, spatial...]");
}

/* ---- ONNX export and import ---- */

static int add_pool(Graph *g, OpKind kind, int in, const int64_t *kernel, const int64_t *stride,
                    const int64_t *pads, int ceil_mode, int flag, Diag *d) {
  Params p;
  params_default(kind, &p);
  param_set_ints(&p, param_index(kind, "kernel"), kernel, 2);
  param_set_ints(&p, param_index(kind, "stride"), stride, 2);
  param_set_ints(&p, param_index(kind, "pads"), pads, 4);
  param_set_int(&p, param_index(kind, "ceil_mode"), ceil_mode);
  if (kind == OP_MAXPOOL) param_set_ints(&p, param_index(kind, "dilation"), (int64_t[]){2, 1}, 2);
  else param_set_int(&p, param_index(kind, "count_include_pad"), flag);
  return graph_add_node(g, kind, &(TensorRef){in, 0}, 1, 1, &p, NULL, d);
}

/* maxpool (dilated, ceil_mode) -> avgpool (count_include_pad, ceil_mode)
 * -> global_avgpool, and a global_maxpool beside them: exported, imported
 * back, and run on the same input. */
static void test_onnx_round_trip(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(4, 2, 3, 13, 12);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  int mp = add_pool(g, OP_MAXPOOL, x, (int64_t[]){3, 2}, (int64_t[]){2, 1},
                    (int64_t[]){1, 0, 2, 1}, 1, 0, &d);
  int ap = add_pool(g, OP_AVGPOOL, mp, (int64_t[]){2, 3}, (int64_t[]){2, 2},
                    (int64_t[]){1, 1, 0, 2}, 1, 1, &d);
  int ga = graph_add_node(g, OP_GLOBAL_AVGPOOL, &(TensorRef){ap, 0}, 1, 1, NULL, NULL, &d);
  int gm = graph_add_node(g, OP_GLOBAL_MAXPOOL, &(TensorRef){x, 0}, 1, 1, NULL, NULL, &d);
  graph_add_output(g, (TensorRef){ap, 0}, "pooled", &d);
  graph_add_output(g, (TensorRef){ga, 0}, "mean", &d);
  graph_add_output(g, (TensorRef){gm, 0}, "max", &d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");
  Tensor *xv = random_f32(sx, 70);
  CHECK_EQ_INT(check_graph_round_trip(g, NULL, &xv, "pools", NULL, &d), TEQ_OK);
  tensor_unref(xv);
  graph_free(g);
  diag_fini(&d);
}

static void test_rows(void) {
  static const OpKind mine[] = {OP_MAXPOOL, OP_AVGPOOL, OP_GLOBAL_AVGPOOL, OP_GLOBAL_MAXPOOL};
  for (size_t i = 0; i < 4; i++) {
    const OpDef *r = op_def(mine[i]);
    CHECK_MSG(r->kind == mine[i] && r->infer_shape && r->eval_f32 && r->eval_modp &&
              !(r->flags & (OPF_OPAQUE | OPF_NONLINEAR)), "row %s", r->name);
  }
  CHECK(op_def(OP_AVGPOOL)->flags & OPF_MULTILINEAR);
  CHECK(op_def(OP_GLOBAL_AVGPOOL)->flags & OPF_MULTILINEAR);
  CHECK(!(op_def(OP_MAXPOOL)->flags & OPF_MULTILINEAR));
  CHECK_EQ_INT(op_by_onnx("MaxPool"), OP_MAXPOOL);
  CHECK_EQ_INT(op_by_onnx("AveragePool"), OP_AVGPOOL);
  CHECK_EQ_INT(op_by_onnx("GlobalAveragePool"), OP_GLOBAL_AVGPOOL);
  CHECK_EQ_INT(op_by_onnx("GlobalMaxPool"), OP_GLOBAL_MAXPOOL);
}

int main(void) {
  test_rows();
  test_by_hand();
  test_pool_vs_reference();
  test_pool3d();
  test_modp_max_is_residue_order();
  test_const_pool_identity();
  test_global();
  test_errors();
  test_onnx_round_trip();
  return check_exit();
}
