/* test_cuda_reduce.c: the GPU kernels of the reduce and pool families
 * (runtime/cuda/reduce.cu, pool.cu) against the CPU executor.
 *
 * Reductions: every reduce_* row over all axes (empty list), one inner,
 * one outer, middle and non-adjacent axes, with and without keepdims, at
 * odd shapes, degenerate ones (reduced extent 1, scalar output) and ~1M
 * elements laid out so each kernel path runs (warp or block per output,
 * thread per output, split ranges joined afterwards, several reduced
 * dimensions). Axes are non-negative here: the row's parameter is 0..5
 * and ONNX import normalizes negative ones before they reach a kernel.
 * log_sum gets positive inputs (the log of a sum near 0 would be NaN on
 * one side only).
 * Softmax and log_softmax: every axis of a 4-D input, last-axis rows from
 * 1 to 1M elements (warp per row at each register width, block per row),
 * middle axes (thread per line), attention-like [B, H, S, S], and rows
 * holding NaN, +inf and -inf.
 * argmax and argmin: every axis, keepdims, select_last_index, on random
 * inputs and on inputs full of ties and NaNs, short and long rows (exact
 * int64 comparison).
 * Pools: maxpool and avgpool with kernel, stride, symmetric and asymmetric
 * pads, dilation, ceil_mode and count_include_pad, ~1.6M-element inputs,
 * 1x1 inputs; their 3-D rows; global pools on 3-D to 5-D inputs, small
 * and large planes. */
#include "tests/cuda_check.h"

static CudaDevice *dev;

static const char *kind_name(OpKind k) { return op_def(k)->name; }

static Shape shape4(int64_t a, int64_t b, int64_t c, int64_t d) {
  return shape_make(4, (int64_t[]){a, b, c, d});
}

/* ---- reductions ---- */

static void reduce_case(OpKind kind, Shape x, const int64_t *axes, int n_axes, int keep) {
  char label[160], sx[SHAPE_STR_MAX];
  int len = snprintf(label, sizeof label, "%s %s axes=(", kind_name(kind),
                     shape_format(&x, sx, sizeof sx));
  for (int i = 0; i < n_axes; i++) len += snprintf(label + len, sizeof label - (size_t)len,
                                                   i ? " %lld" : "%lld", (long long)axes[i]);
  snprintf(label + len, sizeof label - (size_t)len, ") keep=%d", keep);
  CudaCase c = cuda_case(label, kind, 1, &x);
  param_set_ints(&c.params, param_index(kind, "axes"), axes, n_axes);
  param_set_int(&c.params, param_index(kind, "keepdims"), keep);
  c.positive = kind == OP_REDUCE_LOG_SUM;
  cuda_check_case(dev, &c);
}

typedef struct AxesCase {
  int n;
  int64_t a[4];
  int keep;
} AxesCase;

static void test_reductions(void) {
  static const OpKind kinds[] = {
    OP_REDUCE_MEAN, OP_REDUCE_SUM, OP_REDUCE_MAX, OP_REDUCE_MIN, OP_REDUCE_PROD,
    OP_REDUCE_SUM_SQUARE, OP_REDUCE_L1, OP_REDUCE_L2, OP_REDUCE_LOG_SUM, OP_REDUCE_LOG_SUM_EXP,
  };
  /* 4-D odd shapes: each axis pattern. */
  static const AxesCase small[] = {
    {0, {0}, 1},       {0, {0}, 0},    {1, {3}, 1},    {1, {3}, 0},    {1, {0}, 1},
    {1, {1}, 0},       {1, {2}, 1},    {2, {0, 2}, 1}, {2, {1, 3}, 0}, {2, {2, 3}, 1},
    {2, {0, 3}, 0},    {3, {0, 1, 3}, 1}, {4, {0, 1, 2, 3}, 0},
  };
  const Shape small_shapes[] = {shape4(1, 3, 7, 5), shape4(2, 5, 13, 11)};
  for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
    OpKind kind = kinds[k];
    for (int s = 0; s < 2; s++)
      for (size_t j = 0; j < sizeof small / sizeof small[0]; j++)
        reduce_case(kind, small_shapes[s], small[j].a, small[j].n, small[j].keep);
    /* Degenerate: reduced extents 1, a scalar output, one element. */
    reduce_case(kind, shape_of(3, 1, 1, 1), (int64_t[]){1}, 1, 1);
    reduce_case(kind, shape_of(3, 3, 1, 4), (int64_t[]){1}, 1, 0);
    reduce_case(kind, shape_of(2, 1, 6), (int64_t[]){0}, 1, 1);
    reduce_case(kind, shape_of(1, 5), (int64_t[]){0}, 1, 0);
    reduce_case(kind, shape_of(2, 4, 1), (int64_t[]){0}, 1, 1);
    reduce_case(kind, shape_of(2, 33, 1), NULL, 0, 0);
    /* ~1M elements, one per kernel path. */
    reduce_case(kind, shape_of(1, 1 << 20), NULL, 0, 0);             /* block, split */
    reduce_case(kind, shape_of(2, 256, 4096), (int64_t[]){1}, 1, 1); /* block per output */
    reduce_case(kind, shape_of(2, 16384, 64), (int64_t[]){1}, 1, 1); /* warp per output */
    reduce_case(kind, shape_of(2, 4096, 256), (int64_t[]){0}, 1, 0); /* thread, split */
    reduce_case(kind, shape_of(3, 64, 128, 128), (int64_t[]){1}, 1, 1);  /* thread */
    reduce_case(kind, shape_of(3, 8, 64, 2048), (int64_t[]){0, 2}, 2, 0); /* two runs */
    reduce_case(kind, shape4(32, 32, 32, 32), (int64_t[]){1, 3}, 2, 1);
    reduce_case(kind, shape4(32, 32, 32, 32), (int64_t[]){0, 2}, 2, 0);
    reduce_case(kind, shape4(4, 256, 32, 32), (int64_t[]){2, 3}, 2, 1); /* global pool */
  }
}

/* ---- softmax and log_softmax ---- */

/* Five rows: ordinary values, one NaN, one +inf, all -inf, some -inf. */
static Tensor *special_tensor(Shape s) {
  Tensor *t = tensor_new(DT_F32, &s);
  tensor_fill_random(t, 7);
  float *v = t->data;
  int64_t len = s.d[1];
  v[1 * len + len / 3] = NAN;
  v[2 * len + len / 2] = INFINITY;
  for (int64_t i = 0; i < len; i++) v[3 * len + i] = -INFINITY;
  for (int64_t i = 0; i < len; i += 3) v[4 * len + i] = -INFINITY;
  v[4 * len] = -INFINITY; /* the first element too: the running maximum starts at -inf */
  return t;
}

static void softmax_case(OpKind kind, Shape x, int axis) {
  char label[160], sx[SHAPE_STR_MAX];
  snprintf(label, sizeof label, "%s %s axis=%d", kind_name(kind), shape_format(&x, sx, sizeof sx),
           axis);
  CudaCase c = cuda_case(label, kind, 1, &x);
  param_set_int(&c.params, param_index(kind, "axis"), axis);
  cuda_check_case(dev, &c);
}

static void test_softmax(void) {
  static const OpKind kinds[] = {OP_SOFTMAX, OP_LOG_SOFTMAX};
  for (int k = 0; k < 2; k++) {
    OpKind kind = kinds[k];
    for (int axis = 0; axis < 4; axis++) {
      softmax_case(kind, shape4(1, 3, 7, 5), axis);
      softmax_case(kind, shape4(2, 5, 13, 11), axis);
    }
    /* Last-axis rows at every register width, the edges of the warp path
     * and the block path. */
    static const int lens[] = {1, 7, 32, 33, 64, 100, 128, 200, 256, 300, 512, 777, 1024, 1025,
                               3000, 8192, 10007};
    for (size_t i = 0; i < sizeof lens / sizeof lens[0]; i++)
      softmax_case(kind, shape_of(2, 13, lens[i]), 1);
    softmax_case(kind, shape4(4, 8, 128, 128), 3); /* attention scores */
    softmax_case(kind, shape4(2, 4, 77, 77), 3);
    softmax_case(kind, shape_of(1, 1 << 20), 0);   /* one row of 1M */
    softmax_case(kind, shape_of(2, 8, 131072), 1);
    softmax_case(kind, shape_of(3, 64, 512, 32), 1); /* lines, ~1M */
    softmax_case(kind, shape_of(3, 2, 1000, 3), 1);
    softmax_case(kind, shape_of(2, 5, 1), 1);        /* extent 1 */
    softmax_case(kind, shape_of(2, 1, 9), 0);
    /* Rows with NaN, +inf, all -inf, some -inf: short (warp), long
     * (block, one pass for maximum and sum), and along axis 0 (lines). */
    static const int special_lens[] = {100, 5000};
    for (int i = 0; i < 2; i++) {
      Shape s = shape_of(2, 5, special_lens[i]);
      Tensor *t = special_tensor(s);
      for (int axis = 0; axis < 2; axis++) {
        char label[96];
        snprintf(label, sizeof label, "%s [5,%d] NaN/inf axis=%d", kind_name(kind),
                 special_lens[i], axis);
        CudaCase c = cuda_case(label, kind, 1, &s);
        param_set_int(&c.params, param_index(kind, "axis"), axis);
        c.consts[0] = t;
        cuda_check_case(dev, &c);
      }
      tensor_unref(t);
    }
  }
}

/* ---- argmax and argmin ---- */

static void arg_case(OpKind kind, Shape x, int axis, int keep, int last, Tensor *konst,
                     const char *what) {
  char label[160], sx[SHAPE_STR_MAX];
  snprintf(label, sizeof label, "%s %s%s axis=%d keep=%d last=%d", kind_name(kind),
           shape_format(&x, sx, sizeof sx), what, axis, keep, last);
  CudaCase c = cuda_case(label, kind, 1, &x);
  param_set_int(&c.params, param_index(kind, "axis"), axis);
  param_set_int(&c.params, param_index(kind, "keepdims"), keep);
  param_set_int(&c.params, param_index(kind, "select_last_index"), last);
  c.consts[0] = konst;
  cuda_check_case(dev, &c);
}

/* Values from {0, 1, 2, 3} (many ties), with NaNs at a few places if nans. */
static Tensor *tie_tensor(Shape s, bool nans) {
  Tensor *t = tensor_new(DT_F32, &s);
  float *v = t->data;
  for (int64_t i = 0; i < tensor_numel(t); i++) {
    v[i] = (float)((i * 7 + i / 13) % 4);
    if (nans && i % 37 == 5) v[i] = NAN;
  }
  return t;
}

static void test_arg(void) {
  static const OpKind kinds[] = {OP_ARGMAX, OP_ARGMIN};
  for (int k = 0; k < 2; k++) {
    OpKind kind = kinds[k];
    for (int last = 0; last < 2; last++) {
      for (int axis = 0; axis < 4; axis++) {
        arg_case(kind, shape4(1, 3, 7, 5), axis, 1, last, NULL, "");
        arg_case(kind, shape4(2, 5, 13, 11), axis, axis & 1, last, NULL, "");
      }
      arg_case(kind, shape_of(2, 16, 1000), 1, 0, last, NULL, "");  /* warp per row */
      arg_case(kind, shape_of(2, 1000, 16), 0, 1, last, NULL, "");  /* lines */
      arg_case(kind, shape_of(2, 8, 31), 1, 1, last, NULL, "");
      arg_case(kind, shape_of(1, 1 << 20), 0, 0, last, NULL, "");   /* one row of 1M */
      arg_case(kind, shape_of(3, 64, 128, 128), 1, 1, last, NULL, "");
      arg_case(kind, shape_of(2, 4, 1), 1, 0, last, NULL, "");      /* extent 1 */
      static const bool nan_modes[] = {false, true};
      for (int m = 0; m < 2; m++) {
        Shape rows = shape_of(2, 6, 100), cols = shape_of(3, 3, 50, 4);
        Shape long_rows = shape_of(2, 3, 8192);
        Tensor *a = tie_tensor(rows, nan_modes[m]), *b = tie_tensor(cols, nan_modes[m]);
        Tensor *c = tie_tensor(long_rows, nan_modes[m]);
        const char *what = nan_modes[m] ? " ties+NaN" : " ties";
        arg_case(kind, rows, 1, 1, last, a, what);
        arg_case(kind, rows, 0, 0, last, a, what);
        arg_case(kind, cols, 1, 1, last, b, what);
        arg_case(kind, long_rows, 1, 0, last, c, what);
        tensor_unref(a);
        tensor_unref(b);
        tensor_unref(c);
      }
    }
  }
}

/* NaN propagates through reduce_max/min and softmax as on the CPU. */
static void test_nan_reductions(void) {
  Shape s = shape_of(2, 6, 100);
  Tensor *t = tie_tensor(s, true);
  static const OpKind kinds[] = {OP_REDUCE_MAX, OP_REDUCE_MIN, OP_REDUCE_LOG_SUM_EXP};
  for (int k = 0; k < 3; k++)
    for (int axis = 0; axis < 2; axis++) {
      char label[96];
      snprintf(label, sizeof label, "%s [6,100] NaN axes=(%d)", kind_name(kinds[k]), axis);
      CudaCase c = cuda_case(label, kinds[k], 1, &s);
      param_set_ints(&c.params, param_index(kinds[k], "axes"), (int64_t[]){axis}, 1);
      c.consts[0] = t;
      cuda_check_case(dev, &c);
    }
  tensor_unref(t);
}

/* ---- pools ---- */

typedef struct PoolCase {
  int64_t k[2], s[2], p[4], dl[2];
  int ceil, count_pad;
} PoolCase;

static void pool_case(OpKind kind, Shape x, const PoolCase *pc) {
  char label[200], sx[SHAPE_STR_MAX];
  snprintf(label, sizeof label,
           "%s %s k=%lldx%lld s=%lldx%lld p=(%lld %lld %lld %lld) dl=%lldx%lld ceil=%d cip=%d",
           kind_name(kind), shape_format(&x, sx, sizeof sx), (long long)pc->k[0],
           (long long)pc->k[1], (long long)pc->s[0], (long long)pc->s[1], (long long)pc->p[0],
           (long long)pc->p[1], (long long)pc->p[2], (long long)pc->p[3], (long long)pc->dl[0],
           (long long)pc->dl[1], pc->ceil, pc->count_pad);
  CudaCase c = cuda_case(label, kind, 1, &x);
  param_set_ints(&c.params, param_index(kind, "kernel"), pc->k, 2);
  param_set_ints(&c.params, param_index(kind, "stride"), pc->s, 2);
  param_set_ints(&c.params, param_index(kind, "pads"), pc->p, 4);
  param_set_int(&c.params, param_index(kind, "ceil_mode"), pc->ceil);
  if (kind == OP_MAXPOOL) param_set_ints(&c.params, param_index(kind, "dilation"), pc->dl, 2);
  else param_set_int(&c.params, param_index(kind, "count_include_pad"), pc->count_pad);
  cuda_check_case(dev, &c);
}

static void test_pools(void) {
  /* Shared by both pools (dilation only for maxpool, count_include_pad only
   * for avgpool). */
  static const PoolCase cases[] = {
    {{3, 3}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 0, 0},
    {{3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 0},
    {{3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, 0},
    {{3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 1},
    {{3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 1, 1},
    {{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, 0},
    {{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, 1},
    {{3, 3}, {2, 2}, {0, 1, 1, 0}, {1, 1}, 1, 1},
    {{3, 3}, {2, 2}, {0, 1, 1, 0}, {1, 1}, 1, 0},
    {{3, 2}, {3, 1}, {2, 1, 2, 0}, {2, 3}, 1, 1},
    {{3, 3}, {1, 1}, {1, 1, 1, 1}, {2, 2}, 0, 0},
    {{1, 1}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 0, 0},
    {{5, 4}, {1, 3}, {2, 0, 1, 3}, {1, 1}, 1, 1},
  };
  static const OpKind kinds[] = {OP_MAXPOOL, OP_AVGPOOL};
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
      pool_case(kinds[k], shape4(1, 3, 7, 5), &cases[i]);
      pool_case(kinds[k], shape4(2, 5, 13, 11), &cases[i]);
    }
    PoolCase one = {{1, 1}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 0, 0};
    pool_case(kinds[k], shape4(1, 1, 1, 1), &one);
    PoolCase whole = {{9, 9}, {1, 1}, {0, 0, 0, 0}, {1, 1}, 0, 0};
    pool_case(kinds[k], shape4(2, 3, 9, 9), &whole);
    PoolCase resnet = {{3, 3}, {2, 2}, {1, 1, 1, 1}, {1, 1}, 0, 1};
    pool_case(kinds[k], shape4(8, 64, 56, 56), &resnet);
    PoolCase halve = {{2, 2}, {2, 2}, {0, 0, 0, 0}, {1, 1}, 1, 0};
    pool_case(kinds[k], shape4(8, 64, 57, 57), &halve);
  }
  static const OpKind globals[] = {OP_GLOBAL_AVGPOOL, OP_GLOBAL_MAXPOOL};
  for (int k = 0; k < 2; k++) {
    const Shape shapes[] = {
      shape4(1, 3, 7, 5), shape4(2, 5, 13, 11), shape4(32, 2048, 7, 7), shape4(1, 4, 512, 512),
      shape4(2, 3, 50, 50), shape4(4, 6, 1, 1), shape_of(3, 2, 3, 17),
      shape_make(5, (int64_t[]){1, 2, 3, 4, 5}), shape4(1, 1, 1, 1),
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
      char label[96], sx[SHAPE_STR_MAX];
      snprintf(label, sizeof label, "%s %s", kind_name(globals[k]),
               shape_format(&shapes[i], sx, sizeof sx));
      CudaCase c = cuda_case(label, globals[k], 1, &shapes[i]);
      cuda_check_case(dev, &c);
    }
  }
}

/* maxpool3d and avgpool3d: S3D's windows, ceil_mode with an overhang
 * past the padding, dilation, count_include_pad, and a 16x56x56 input. */
static void test_pools3d(void) {
  static const struct {
    int64_t k[3], s[3], p[6], dl[3];
    int ceil, count_pad;
  } cases[] = {
    {{1, 3, 3}, {1, 2, 2}, {0, 1, 1, 0, 1, 1}, {1, 1, 1}, 0, 0},
    {{3, 3, 3}, {2, 2, 2}, {1, 1, 1, 1, 1, 1}, {1, 1, 1}, 0, 1},
    {{3, 3, 2}, {2, 2, 2}, {1, 1, 0, 1, 1, 1}, {1, 1, 1}, 1, 1},
    {{2, 2, 2}, {1, 1, 2}, {1, 0, 0, 0, 1, 1}, {3, 2, 1}, 1, 0},
    {{2, 7, 7}, {1, 1, 1}, {0, 0, 0, 0, 0, 0}, {1, 1, 1}, 0, 0},
  };
  static const OpKind kinds[] = {OP_MAXPOOL3D, OP_AVGPOOL3D};
  const Shape shapes[] = {shape_make(5, (int64_t[]){1, 3, 5, 9, 8}),
                          shape_make(5, (int64_t[]){1, 8, 16, 56, 56})};
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
      for (int j = 0; j < 2; j++) {
        char label[96], sx[SHAPE_STR_MAX];
        snprintf(label, sizeof label, "%s %s case %zu", kind_name(kinds[k]),
                 shape_format(&shapes[j], sx, sizeof sx), i);
        CudaCase c = cuda_case(label, kinds[k], 1, &shapes[j]);
        param_set_ints(&c.params, param_index(kinds[k], "kernel"), cases[i].k, 3);
        param_set_ints(&c.params, param_index(kinds[k], "stride"), cases[i].s, 3);
        param_set_ints(&c.params, param_index(kinds[k], "pads"), cases[i].p, 6);
        param_set_int(&c.params, param_index(kinds[k], "ceil_mode"), cases[i].ceil);
        if (kinds[k] == OP_MAXPOOL3D)
          param_set_ints(&c.params, param_index(kinds[k], "dilation"), cases[i].dl, 3);
        else
          param_set_int(&c.params, param_index(kinds[k], "count_include_pad"),
                        cases[i].count_pad);
        cuda_check_case(dev, &c);
      }
}

int main(void) {
  dev = cuda_check_open();
  test_reductions();
  test_nan_reductions();
  test_softmax();
  test_arg();
  test_pools();
  test_pools3d();
  cuda_device_close(dev);
  return check_exit();
}
