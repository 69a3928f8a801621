/* test_cuda_layout.c: the GPU kernels of the layout, resize and
 * grid_sample operators (runtime/cuda/layout.cu, resize.cu, sample.cu)
 * against the CPU executor. Covers
 * every row: transpose (2-D to rank 6, the tiled path, the default reverse
 * perm), reshape, concat and split (every axis, 2 and 3 parts, uneven
 * sizes), pad (constant with zero and non-zero value, reflect, edge,
 * negative pads cropping), slice (steps 1, 2, -1, -3, partial ranges),
 * gather (every axis, negative indices, 0-D, 1-D and 2-D indices, rows of
 * 4 and of odd length), depth_to_space (DCR, CRD) and space_to_depth,
 * tile, expand ([C,1,1], scalar, rank growth), each at odd shapes, extent
 * 1 and about 1M elements; int64 data through the copy kernels (gather,
 * concat, transpose, reshape, pad, slice on int64 constants); and resize
 * in both modes under every coordinate transformation and every nearest
 * rounding rule, up and down, by scales and by sizes; grid_sample in both
 * modes under every padding and align_corners; views (split and
 * reshape made pointers into their input, not steps); concats whose
 * producers write them in place (no steps either); and chains of layout
 * operators gathered into one copy of rows (plan_gathers): Swin-T's
 * shifted windows and patch merging at its first stage's sizes. */
#include <stdarg.h>

#include "tests/cuda_check.h"
#include "tests/tensor_check.h"
#include "tests/layout_chain.h"

static CudaDevice *dev;

static Shape dims(int nd, ...) {
  int64_t v[TEQ_MAX_DIMS];
  va_list ap;
  va_start(ap, nd);
  for (int i = 0; i < nd; i++) v[i] = va_arg(ap, int);
  va_end(ap);
  return shape_make(nd, v);
}

static void set_ints(CudaCase *c, const char *name, int k, const int64_t *v) {
  int i = param_index(c->kind, name);
  CHECK_MSG(i >= 0, "no parameter %s", name);
  if (i >= 0) param_set_ints(&c->params, i, v, k);
}

static void set_int(CudaCase *c, const char *name, int64_t v) {
  int i = param_index(c->kind, name);
  CHECK_MSG(i >= 0, "no parameter %s", name);
  if (i >= 0) param_set_int(&c->params, i, v);
}

static void set_float(CudaCase *c, const char *name, double v) {
  int i = param_index(c->kind, name);
  CHECK_MSG(i >= 0, "no parameter %s", name);
  if (i >= 0) param_set_float(&c->params, i, v);
}

/* An int64 tensor of the given shape holding distinct values. */
static Tensor *i64_tensor(Shape s, int64_t mul, int64_t add) {
  Tensor *t = tensor_new(DT_I64, &s);
  int64_t *v = (int64_t *)t->data;
  for (int64_t i = 0; i < tensor_numel(t); i++) v[i] = i * mul + add;
  return t;
}

/* int64 indices from a list. */
static Tensor *indices(Shape s, const int64_t *v) {
  Tensor *t = tensor_new(DT_I64, &s);
  memcpy(t->data, v, (size_t)tensor_numel(t) * sizeof *v);
  return t;
}

static void run(CudaCase *c) { cuda_check_case(dev, c); }

/* ---- transpose ---- */

static void transpose_case(const char *label, Shape x, int k, const int64_t *perm) {
  CudaCase c = cuda_case(label, OP_TRANSPOSE, 1, &x);
  set_ints(&c, "perm", k, perm);
  run(&c);
}

static void test_transpose(void) {
  transpose_case("transpose 1x3x7x5 0231", dims(4, 1, 3, 7, 5), 4, (int64_t[]){0, 2, 3, 1});
  transpose_case("transpose 1x3x7x5 0312", dims(4, 1, 3, 7, 5), 4, (int64_t[]){0, 3, 1, 2});
  transpose_case("transpose 2x5x13x11 3210", dims(4, 2, 5, 13, 11), 4, (int64_t[]){3, 2, 1, 0});
  transpose_case("transpose 2x5x13x11 reverse", dims(4, 2, 5, 13, 11), 0, NULL);
  transpose_case("transpose 2x5x13x11 identity", dims(4, 2, 5, 13, 11), 4,
                 (int64_t[]){0, 1, 2, 3});
  transpose_case("transpose 37x53 10", dims(2, 37, 53), 2, (int64_t[]){1, 0});
  transpose_case("transpose 1x53 10", dims(2, 1, 53), 2, (int64_t[]){1, 0});
  transpose_case("transpose 9 0", dims(1, 9), 1, (int64_t[]){0});
  transpose_case("transpose 2x4x33x64 0213", dims(4, 2, 4, 33, 64), 4, (int64_t[]){0, 2, 1, 3});
  transpose_case("transpose 2x4x33x6 0213", dims(4, 2, 4, 33, 6), 4, (int64_t[]){0, 2, 1, 3});
  transpose_case("transpose 2x3x1x4x5x2 rank6", dims(6, 2, 3, 1, 4, 5, 2), 6,
                 (int64_t[]){5, 3, 1, 0, 2, 4});
  transpose_case("transpose 1x64x128x128 0231 (1M)", dims(4, 1, 64, 128, 128), 4,
                 (int64_t[]){0, 2, 3, 1});
  transpose_case("transpose 1x128x128x64 0312 (1M)", dims(4, 1, 128, 128, 64), 4,
                 (int64_t[]){0, 3, 1, 2});
  transpose_case("transpose 3x1000x333 021 (1M)", dims(3, 3, 1000, 333), 3,
                 (int64_t[]){0, 2, 1});
  transpose_case("transpose 16x8x64x64 0213 (1M)", dims(4, 16, 8, 64, 64), 4,
                 (int64_t[]){0, 2, 1, 3});

  Tensor *t = i64_tensor(dims(3, 3, 5, 7), 3, -40);
  CudaCase c = cuda_case("transpose int64 3x5x7 201", OP_TRANSPOSE, 1, &t->shape);
  c.consts[0] = t;
  set_ints(&c, "perm", 3, (int64_t[]){2, 0, 1});
  run(&c);
  tensor_unref(t);
}

/* ---- reshape ---- */

static void reshape_case(const char *label, Shape x, int k, const int64_t *to) {
  CudaCase c = cuda_case(label, OP_RESHAPE, 1, &x);
  set_ints(&c, "shape", k, to);
  run(&c);
}

static void test_reshape(void) {
  reshape_case("reshape 2x5x13x11 -> 10x143", dims(4, 2, 5, 13, 11), 2, (int64_t[]){10, 143});
  reshape_case("reshape 1x3x7x5 -> 105", dims(4, 1, 3, 7, 5), 1, (int64_t[]){105});
  reshape_case("reshape 1 -> 1x1x1", dims(1, 1), 3, (int64_t[]){1, 1, 1});
  reshape_case("reshape 1x64x128x128 -> 64x16384 (1M)", dims(4, 1, 64, 128, 128), 2,
               (int64_t[]){64, 16384});
  Tensor *t = i64_tensor(dims(2, 4, 6), 5, 1);
  CudaCase c = cuda_case("reshape int64 4x6 -> 2x12", OP_RESHAPE, 1, &t->shape);
  c.consts[0] = t;
  set_ints(&c, "shape", 2, (int64_t[]){2, 12});
  run(&c);
  tensor_unref(t);
}

/* ---- concat and split ---- */

static void concat_case(const char *label, int axis, int k, const Shape *x) {
  CudaCase c = cuda_case(label, OP_CONCAT, k, x);
  set_int(&c, "axis", axis);
  run(&c);
}

static void test_concat(void) {
  concat_case("concat axis0 2x5x13x11 + 3x5x13x11", 0, 2,
              (Shape[]){dims(4, 2, 5, 13, 11), dims(4, 3, 5, 13, 11)});
  concat_case("concat axis1 1x3x7x5 + 1x4x7x5 + 1x1x7x5", 1, 3,
              (Shape[]){dims(4, 1, 3, 7, 5), dims(4, 1, 4, 7, 5), dims(4, 1, 1, 7, 5)});
  concat_case("concat axis1 2x3x7x5 + 2x4x7x5", 1, 2,
              (Shape[]){dims(4, 2, 3, 7, 5), dims(4, 2, 4, 7, 5)});
  concat_case("concat axis2 2x5x13x11 + 2x5x2x11", 2, 2,
              (Shape[]){dims(4, 2, 5, 13, 11), dims(4, 2, 5, 2, 11)});
  concat_case("concat axis3 2x5x13x11 + 2x5x13x1 + 2x5x13x4", 3, 3,
              (Shape[]){dims(4, 2, 5, 13, 11), dims(4, 2, 5, 13, 1), dims(4, 2, 5, 13, 4)});
  concat_case("concat axis1 one input 1x3x7x5", 1, 1, (Shape[]){dims(4, 1, 3, 7, 5)});
  concat_case("concat axis0 vectors 7 + 1 + 9", 0, 3,
              (Shape[]){dims(1, 7), dims(1, 1), dims(1, 9)});
  concat_case("concat axis1 1x32x128x128 x2 (1M)", 1, 2,
              (Shape[]){dims(4, 1, 32, 128, 128), dims(4, 1, 32, 128, 128)});
  concat_case("concat axis2 64x128x64 + 64x128x64 (1M)", 2, 2,
              (Shape[]){dims(3, 64, 128, 64), dims(3, 64, 128, 64)});

  Tensor *a = i64_tensor(dims(2, 3, 2), 1, 0), *b = i64_tensor(dims(2, 3, 5), -2, 9);
  CudaCase c = cuda_case("concat int64 3x2 + 3x5 axis1", OP_CONCAT, 2,
                         (Shape[]){a->shape, b->shape});
  c.consts[0] = a;
  c.consts[1] = b;
  set_int(&c, "axis", 1);
  run(&c);
  tensor_unref(a);
  tensor_unref(b);
}

static void split_case(const char *label, Shape x, int axis, int parts, int k,
                       const int64_t *sizes) {
  CudaCase c = cuda_case(label, OP_SPLIT, 1, &x);
  c.n_out = parts;
  set_int(&c, "axis", axis);
  if (k) set_ints(&c, "sizes", k, sizes);
  run(&c);
}

static void test_split(void) {
  split_case("split axis0 4x5x13x11 equal 2", dims(4, 4, 5, 13, 11), 0, 2, 0, NULL);
  split_case("split axis1 2x9x7x5 3,1,5", dims(4, 2, 9, 7, 5), 1, 3, 3, (int64_t[]){3, 1, 5});
  split_case("split axis2 2x5x13x11 6,7", dims(4, 2, 5, 13, 11), 2, 2, 2, (int64_t[]){6, 7});
  split_case("split axis3 2x5x13x12 equal 3", dims(4, 2, 5, 13, 12), 3, 3, 0, NULL);
  split_case("split axis3 2x5x13x11 1,10", dims(4, 2, 5, 13, 11), 3, 2, 2, (int64_t[]){1, 10});
  split_case("split axis1 one part 1x3x7x5", dims(4, 1, 3, 7, 5), 1, 1, 0, NULL);
  split_case("split axis2 1x64x128x128 equal 2 (1M)", dims(4, 1, 64, 128, 128), 2, 2, 0, NULL);
  split_case("split axis1 1x64x128x128 16,48 (1M)", dims(4, 1, 64, 128, 128), 1, 2, 2,
             (int64_t[]){16, 48});
}

/* ---- pad ---- */

static void pad_case(const char *label, Shape x, int mode, double value, const int64_t *pads) {
  CudaCase c = cuda_case(label, OP_PAD, 1, &x);
  set_ints(&c, "pads", 2 * x.ndim, pads);
  set_int(&c, "mode", mode);
  set_float(&c, "value", value);
  run(&c);
}

static void test_pad(void) {
  enum { CONSTANT, REFLECT, EDGE };
  const int64_t p4[] = {0, 0, 1, 2, 0, 0, 2, 1};
  const int64_t crop[] = {0, 1, -1, 2, 0, -1, 1, -2};
  const char *names[] = {"constant", "reflect", "edge"};
  char label[96];
  for (int m = 0; m < 3; m++) {
    snprintf(label, sizeof label, "pad %s 1x3x7x5 hw", names[m]);
    pad_case(label, dims(4, 1, 3, 7, 5), m, 0, p4);
    snprintf(label, sizeof label, "pad %s 2x5x13x11 crop", names[m]);
    pad_case(label, dims(4, 2, 5, 13, 11), m, 0, crop);
    snprintf(label, sizeof label, "pad %s 9 (3, 4)", names[m]);
    pad_case(label, dims(1, 9), m, 0, (int64_t[]){3, 4});
    snprintf(label, sizeof label, "pad %s 6x5 all sides", names[m]);
    pad_case(label, dims(2, 6, 5), m, 0, (int64_t[]){2, 4, 5, 1});
    snprintf(label, sizeof label, "pad %s 1x64x126x126 (1M)", names[m]);
    pad_case(label, dims(4, 1, 64, 126, 126), m, 0, (int64_t[]){0, 0, 1, 1, 0, 0, 1, 1});
  }
  pad_case("pad constant 1.5 1x3x7x5", dims(4, 1, 3, 7, 5), CONSTANT, 1.5, p4);
  pad_case("pad constant -2 2x5x13x11 crop", dims(4, 2, 5, 13, 11), CONSTANT, -2, crop);
  pad_case("pad edge 1x3x1x5 (extent 1)", dims(4, 1, 3, 1, 5), EDGE, 0,
           (int64_t[]){0, 0, 2, 0, 0, 0, 3, 1});
  pad_case("pad constant 1x1x1x1", dims(4, 1, 1, 1, 1), CONSTANT, 3, (int64_t[]){1, 0, 1, 1, 0, 2, 1, 1});

  Tensor *t = i64_tensor(dims(2, 3, 4), 7, -5);
  CudaCase c = cuda_case("pad int64 constant 3x4 value 9", OP_PAD, 1, &t->shape);
  c.consts[0] = t;
  set_ints(&c, "pads", 4, (int64_t[]){1, 2, 0, 1});
  set_float(&c, "value", 9);
  run(&c);
  c.label = "pad int64 reflect 3x4";
  set_int(&c, "mode", REFLECT);
  set_ints(&c, "pads", 4, (int64_t[]){2, 3, 1, 0});
  run(&c);
  tensor_unref(t);
}

/* ---- slice ---- */

static void slice_case(const char *label, Shape x, const int64_t *starts, const int64_t *ends,
                       const int64_t *steps) {
  CudaCase c = cuda_case(label, OP_SLICE, 1, &x);
  set_ints(&c, "starts", x.ndim, starts);
  set_ints(&c, "ends", x.ndim, ends);
  set_ints(&c, "steps", x.ndim, steps);
  run(&c);
}

static void test_slice(void) {
  slice_case("slice 2x5x13x11 inner ranges", dims(4, 2, 5, 13, 11), (int64_t[]){0, 1, 2, 3},
             (int64_t[]){2, 4, 13, 10}, (int64_t[]){1, 1, 1, 1});
  slice_case("slice 2x5x13x11 steps 2", dims(4, 2, 5, 13, 11), (int64_t[]){0, 0, 1, 0},
             (int64_t[]){2, 5, 13, 11}, (int64_t[]){1, 2, 2, 3});
  slice_case("slice 2x5x13x11 reverse w", dims(4, 2, 5, 13, 11), (int64_t[]){0, 0, 0, 10},
             (int64_t[]){2, 5, 13, -1}, (int64_t[]){1, 1, 1, -1});
  slice_case("slice 2x5x13x11 reverse all step -3", dims(4, 2, 5, 13, 11),
             (int64_t[]){1, 4, 12, 9}, (int64_t[]){-1, -1, 0, 1}, (int64_t[]){-1, -2, -3, -3});
  slice_case("slice 1x3x7x5 one channel", dims(4, 1, 3, 7, 5), (int64_t[]){0, 2, 0, 0},
             (int64_t[]){1, 3, 7, 5}, (int64_t[]){1, 1, 1, 1});
  slice_case("slice 1x3x7x5 last column", dims(4, 1, 3, 7, 5), (int64_t[]){0, 0, 0, 4},
             (int64_t[]){1, 3, 7, 5}, (int64_t[]){1, 1, 1, 1});
  slice_case("slice 1x3x7x5 whole", dims(4, 1, 3, 7, 5), (int64_t[]){0, 0, 0, 0},
             (int64_t[]){1, 3, 7, 5}, (int64_t[]){1, 1, 1, 1});
  slice_case("slice 1x64x130x130 crop (1M)", dims(4, 1, 64, 130, 130), (int64_t[]){0, 0, 1, 1},
             (int64_t[]){1, 64, 129, 129}, (int64_t[]){1, 1, 1, 1});
  slice_case("slice 4x64x128x128 step 2 (1M out)", dims(4, 4, 64, 128, 128),
             (int64_t[]){0, 0, 0, 1}, (int64_t[]){4, 64, 128, 128}, (int64_t[]){1, 1, 2, 2});
  slice_case("slice 3x128x2048 rows 512-1536", dims(3, 3, 128, 2048), (int64_t[]){0, 0, 512},
             (int64_t[]){3, 128, 1536}, (int64_t[]){1, 1, 1});

  Tensor *t = i64_tensor(dims(2, 4, 9), 11, 3);
  CudaCase c = cuda_case("slice int64 4x9 reverse step -2", OP_SLICE, 1, &t->shape);
  c.consts[0] = t;
  set_ints(&c, "starts", 2, (int64_t[]){3, 8});
  set_ints(&c, "ends", 2, (int64_t[]){0, -1});
  set_ints(&c, "steps", 2, (int64_t[]){-1, -2});
  run(&c);
  tensor_unref(t);
}

/* ---- gather ---- */

static void gather_case(const char *label, Shape x, int axis, Shape is, const int64_t *iv) {
  Tensor *idx = indices(is, iv);
  CudaCase c = cuda_case(label, OP_GATHER, 2, (Shape[]){x, is});
  c.consts[1] = idx;
  set_int(&c, "axis", axis);
  run(&c);
  tensor_unref(idx);
}

static void test_gather(void) {
  const int64_t v5[] = {4, 0, -1, 2, -5};
  gather_case("gather axis0 7x5 [5] neg", dims(2, 7, 5), 0, dims(1, 5), v5);
  gather_case("gather axis1 2x5x13x11 [5] neg", dims(4, 2, 5, 13, 11), 1, dims(1, 5), v5);
  gather_case("gather axis2 2x5x13x11 [2x3]", dims(4, 2, 5, 13, 11), 2, dims(2, 2, 3),
              (int64_t[]){12, 0, -13, 5, 5, 7});
  gather_case("gather axis3 2x5x13x11 [5] (last)", dims(4, 2, 5, 13, 11), 3, dims(1, 5), v5);
  gather_case("gather axis1 1x3x7x5 scalar index", dims(4, 1, 3, 7, 5), 1, dims(0),
              (int64_t[]){-2});
  gather_case("gather axis0 1000x64 embedding rows of 4n", dims(2, 1000, 64), 0, dims(2, 3, 7),
              (int64_t[]){999, 0, 1, 500, -1, 17, 3, 3, 3, 42, 77, 123, 640, 2, 9, 8, 7, 6, 5, 4, 1});
  gather_case("gather axis0 1x3 extent 1", dims(2, 1, 3), 0, dims(1, 2), (int64_t[]){0, -1});
  {
    enum { K = 4096 };
    static int64_t big[K];
    for (int i = 0; i < K; i++) big[i] = (i * 7919) % 30000 - 15000;
    gather_case("gather axis0 30000x256 [4096] (1M)", dims(2, 30000, 256), 0, dims(1, K), big);
  }

  Tensor *data = i64_tensor(dims(2, 6, 3), 13, -7);
  Tensor *idx = indices(dims(1, 4), (int64_t[]){5, -6, 2, 2});
  CudaCase c = cuda_case("gather int64 data axis0 6x3", OP_GATHER, 2,
                         (Shape[]){data->shape, idx->shape});
  c.consts[0] = data;
  c.consts[1] = idx;
  run(&c);
  c.label = "gather int64 data axis1 6x3";
  set_int(&c, "axis", 1);
  Tensor *idx2 = indices(dims(1, 4), (int64_t[]){2, -3, 0, 1});
  c.consts[1] = idx2;
  run(&c);
  Tensor *data2 = i64_tensor(dims(2, 5, 4), 3, 100);
  Tensor *idx3 = indices(dims(1, 3), (int64_t[]){4, -5, 2});
  c = cuda_case("gather int64 data axis0 rows of 4", OP_GATHER, 2,
                (Shape[]){data2->shape, idx3->shape});
  c.consts[0] = data2;
  c.consts[1] = idx3;
  run(&c);
  tensor_unref(idx3);
  tensor_unref(data);
  tensor_unref(data2);
  tensor_unref(idx);
  tensor_unref(idx2);
}

/* ---- depth_to_space, space_to_depth ---- */

static void d2s_case(const char *label, Shape x, int b, int mode) {
  CudaCase c = cuda_case(label, OP_DEPTH_TO_SPACE, 1, &x);
  set_int(&c, "blocksize", b);
  set_int(&c, "mode", mode);
  run(&c);
}

static void s2d_case(const char *label, Shape x, int b) {
  CudaCase c = cuda_case(label, OP_SPACE_TO_DEPTH, 1, &x);
  set_int(&c, "blocksize", b);
  run(&c);
}

static void test_blocks(void) {
  for (int mode = 0; mode < 2; mode++) {
    const char *m = mode ? "CRD" : "DCR";
    char label[96];
    snprintf(label, sizeof label, "depth_to_space %s b2 1x12x7x5", m);
    d2s_case(label, dims(4, 1, 12, 7, 5), 2, mode);
    snprintf(label, sizeof label, "depth_to_space %s b3 2x18x13x11", m);
    d2s_case(label, dims(4, 2, 18, 13, 11), 3, mode);
    snprintf(label, sizeof label, "depth_to_space %s b1 1x3x7x5", m);
    d2s_case(label, dims(4, 1, 3, 7, 5), 1, mode);
    snprintf(label, sizeof label, "depth_to_space %s b2 1x4x1x1", m);
    d2s_case(label, dims(4, 1, 4, 1, 1), 2, mode);
    snprintf(label, sizeof label, "depth_to_space %s b2 1x64x128x128 (1M)", m);
    d2s_case(label, dims(4, 1, 64, 128, 128), 2, mode);
  }
  s2d_case("space_to_depth b2 1x3x14x10", dims(4, 1, 3, 14, 10), 2);
  s2d_case("space_to_depth b3 2x5x39x33", dims(4, 2, 5, 39, 33), 3);
  s2d_case("space_to_depth b1 1x3x7x5", dims(4, 1, 3, 7, 5), 1);
  s2d_case("space_to_depth b2 1x1x2x2", dims(4, 1, 1, 2, 2), 2);
  s2d_case("space_to_depth b2 1x16x256x256 (1M)", dims(4, 1, 16, 256, 256), 2);
}

/* ---- tile, expand ---- */

static void tile_case(const char *label, Shape x, const int64_t *reps) {
  CudaCase c = cuda_case(label, OP_TILE, 1, &x);
  set_ints(&c, "repeats", x.ndim, reps);
  run(&c);
}

static void expand_case(const char *label, Shape x, int k, const int64_t *to) {
  CudaCase c = cuda_case(label, OP_EXPAND, 1, &x);
  set_ints(&c, "shape", k, to);
  run(&c);
}

static void test_tile_expand(void) {
  tile_case("tile 1x3x7x5 (1,2,3,1)", dims(4, 1, 3, 7, 5), (int64_t[]){1, 2, 3, 1});
  tile_case("tile 2x5x13x11 (2,1,1,3)", dims(4, 2, 5, 13, 11), (int64_t[]){2, 1, 1, 3});
  tile_case("tile 2x5x13x11 (1,1,1,1)", dims(4, 2, 5, 13, 11), (int64_t[]){1, 1, 1, 1});
  tile_case("tile 7 (5)", dims(1, 7), (int64_t[]){5});
  tile_case("tile 1x1 (4,9)", dims(2, 1, 1), (int64_t[]){4, 9});
  tile_case("tile 1x64x64x64 (1,1,2,2) (1M)", dims(4, 1, 64, 64, 64), (int64_t[]){1, 1, 2, 2});
  tile_case("tile 2x3x4x1x5x1 rank6", dims(6, 2, 3, 4, 1, 5, 1), (int64_t[]){1, 2, 1, 3, 1, 2});

  expand_case("expand [3,1,1] -> 2x3x7x5", dims(3, 3, 1, 1), 4, (int64_t[]){2, 3, 7, 5});
  expand_case("expand [1] -> 2x5x13x11", dims(1, 1), 4, (int64_t[]){2, 5, 13, 11});
  expand_case("expand [11] row -> 2x5x13x11", dims(1, 11), 4, (int64_t[]){2, 5, 13, 11});
  expand_case("expand 3x1 -> 2x3x4", dims(2, 3, 1), 3, (int64_t[]){2, 3, 4});
  expand_case("expand 1x5x1x11 -> 2x5x13x11", dims(4, 1, 5, 1, 11), 4, (int64_t[]){2, 5, 13, 11});
  expand_case("expand 2x5x13x11 -> same", dims(4, 2, 5, 13, 11), 4, (int64_t[]){2, 5, 13, 11});
  expand_case("expand [64,1,1] -> 1x64x128x128 (1M)", dims(3, 64, 1, 1), 4,
              (int64_t[]){1, 64, 128, 128});
  expand_case("expand 1x1x128 -> 8x1024x128 (1M)", dims(3, 1, 1, 128), 3,
              (int64_t[]){8, 1024, 128});
}

/* ---- resize ---- */

static void resize_case(const char *label, Shape x, int mode, int coord, int rule, double sh,
                        double sw, int64_t oh, int64_t ow) {
  CudaCase c = cuda_case(label, OP_RESIZE, 1, &x);
  set_int(&c, "mode", mode);
  set_int(&c, "coord", coord);
  set_int(&c, "nearest_mode", rule);
  set_float(&c, "scale_h", sh);
  set_float(&c, "scale_w", sw);
  set_ints(&c, "sizes", 2, (int64_t[]){oh, ow});
  run(&c);
}

static void test_resize(void) {
  const char *coords[] = {"half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel"};
  const char *rules[] = {"round_prefer_floor", "round_prefer_ceil", "floor", "ceil"};
  char label[128];
  for (int coord = 0; coord < 4; coord++) {
    for (int rule = 0; rule < 4; rule++) {
      snprintf(label, sizeof label, "resize nearest %s %s x2 1x3x7x5", coords[coord], rules[rule]);
      resize_case(label, dims(4, 1, 3, 7, 5), 0, coord, rule, 2, 2, 0, 0);
      snprintf(label, sizeof label, "resize nearest %s %s x1.7,0.6 2x5x13x11", coords[coord],
               rules[rule]);
      resize_case(label, dims(4, 2, 5, 13, 11), 0, coord, rule, 1.7, 0.6, 0, 0);
      snprintf(label, sizeof label, "resize nearest %s %s sizes 9x4 1x3x7x5", coords[coord],
               rules[rule]);
      resize_case(label, dims(4, 1, 3, 7, 5), 0, coord, rule, 9.0 / 7, 4.0 / 5, 9, 4);
    }
    snprintf(label, sizeof label, "resize linear %s x2 1x3x7x5", coords[coord]);
    resize_case(label, dims(4, 1, 3, 7, 5), 1, coord, 0, 2, 2, 0, 0);
    snprintf(label, sizeof label, "resize linear %s x0.5 2x5x13x11", coords[coord]);
    resize_case(label, dims(4, 2, 5, 13, 11), 1, coord, 0, 0.5, 0.5, 0, 0);
    snprintf(label, sizeof label, "resize linear %s x1.7,0.6 2x5x13x11", coords[coord]);
    resize_case(label, dims(4, 2, 5, 13, 11), 1, coord, 0, 1.7, 0.6, 0, 0);
    snprintf(label, sizeof label, "resize linear %s sizes 1x1 1x3x7x5", coords[coord]);
    resize_case(label, dims(4, 1, 3, 7, 5), 1, coord, 0, 1.0 / 7, 1.0 / 5, 1, 1);
    snprintf(label, sizeof label, "resize linear %s x3 1x2x1x1 (extent 1)", coords[coord]);
    resize_case(label, dims(4, 1, 2, 1, 1), 1, coord, 0, 3, 3, 0, 0);
    snprintf(label, sizeof label, "resize linear %s sizes 37x23 1x3x7x5", coords[coord]);
    resize_case(label, dims(4, 1, 3, 7, 5), 1, coord, 0, 37.0 / 7, 23.0 / 5, 37, 23);
  }
  resize_case("resize nearest x2 1x64x64x64 (1M out)", dims(4, 1, 64, 64, 64), 0, 1, 2, 2, 2, 0,
              0);
  resize_case("resize linear x2 1x64x64x64 (1M out)", dims(4, 1, 64, 64, 64), 1, 0, 0, 2, 2, 0, 0);
  resize_case("resize linear x0.5 1x16x512x512 (1M out)", dims(4, 1, 16, 512, 512), 1, 3, 0, 0.5,
              0.5, 0, 0);
}

/* ---- views ----
 * Reshapes and splits cutting whole blocks are pointers into their input
 * (op_view), not steps: a computed value cut into views of views, a view
 * of a graph input, and views read as graph outputs, all as on the CPU,
 * with only the computing nodes left as steps. */

static TensorRef add1(Graph *g, OpKind kind, TensorRef a, const Params *p, Diag *d) {
  Params q;
  if (!p) params_default(kind, &q);
  return (TensorRef){graph_add_node(g, kind, &a, 1, 1, p ? p : &q, NULL, d), 0};
}

/* g, which plans as `steps` steps on the GPU (its views and concats
 * written in place none), against the CPU executor. */
static void check_planned(const Graph *g, uint64_t seed, double tol, int steps, const char *label) {
  Diag d;
  diag_init(&d);
  CHECK_MSG(graph_check(g, &d) == TEQ_OK, "%s graph: %s", label, diag_last(&d));
  double e = cuda_check_graph(dev, g, seed, false, label);
  CHECK_MSG(e <= tol, "%s: error %.3g", label, e);
  CudaPlan *plan = NULL;
  CHECK(cuda_plan_new(dev, g, &plan, &d) == TEQ_OK);
  if (plan) CHECK_MSG(cuda_plan_n_steps(plan) == steps, "%s: %d steps, expected %d", label,
                      cuda_plan_n_steps(plan), steps);
  cuda_plan_free(plan);
  diag_fini(&d);
}

static void test_views(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape xs = dims(2, 1, 1024);
  TensorRef x = {graph_add_input(g, "x", &xs, DT_F32, &d), 0};
  TensorRef r = add1(g, OP_RELU, x, NULL, &d);
  Params sp, rp;
  params_default(OP_SPLIT, &sp);
  param_set_int(&sp, 0, 1);
  int s = graph_add_node(g, OP_SPLIT, &r, 1, 4, &sp, "cut", &d);
  int sx = graph_add_node(g, OP_SPLIT, &x, 1, 2, &sp, "cut_input", &d);
  params_default(OP_RESHAPE, &rp);
  param_set_ints(&rp, 0, (int64_t[]){16, 16}, 2);
  TensorRef q[4];
  for (int k = 0; k < 4; k++) q[k] = add1(g, OP_RESHAPE, (TensorRef){s, k}, &rp, &d);
  TensorRef t = add1(g, OP_TANH, q[0], NULL, &d);
  Params ap;
  params_default(OP_EWADD, &ap);
  int sum = graph_add_node(g, OP_EWADD, (TensorRef[]){q[2], q[3]}, 2, 1, &ap, "sum", &d);
  graph_add_output(g, t, "tanh", &d);
  graph_add_output(g, q[1], "view", &d);
  graph_add_output(g, (TensorRef){sum, 0}, "sum", &d);
  graph_add_output(g, (TensorRef){sx, 1}, "input_view", &d);
  /* relu, tanh and the add; the two splits and four reshapes are views. */
  check_planned(g, 77, 1e-6, 3, "views");
  graph_free(g);

  /* Gathers of one constant index (PyTorch's select of Q, K and V) are
   * views too: relu and tanh are the only steps. */
  g = graph_new();
  Shape ps = dims(2, 3, 64);
  TensorRef px = {graph_add_input(g, "x", &ps, DT_F32, &d), 0};
  TensorRef pr = add1(g, OP_RELU, px, NULL, &d);
  Params gp;
  params_default(OP_GATHER, &gp);
  TensorRef sel[3];
  for (int k = 0; k < 3; k++) {
    Tensor *index = tensor_new(DT_I64, &(Shape){0, {0}});
    ((int64_t *)index->data)[0] = k;
    TensorRef gin[2] = {pr, {graph_add_const(g, NULL, index, &d), 0}};
    sel[k] = (TensorRef){graph_add_node(g, OP_GATHER, gin, 2, 1, &gp, NULL, &d), 0};
  }
  graph_add_output(g, add1(g, OP_TANH, sel[0], NULL, &d), "tanh_q", &d);
  graph_add_output(g, sel[2], "v", &d);
  check_planned(g, 78, 1e-6, 2, "gathers of one index");
  graph_free(g);
  diag_fini(&d);
}

/* Concats whose pieces their producers write in place (graph_node_in_place)
 * are no steps: relu, tanh and sigmoid write into a concat that is itself
 * a piece of another, and a convolution writes its output 1152 bytes into
 * a concat (16-byte, not 256-byte aligned: cuDNN's algorithm is searched
 * for that pointer), and a piece tanh reads too is read where it lives,
 * as a view of a piece and a conv of a piece 1152 bytes in are.
 * A concat with a piece that another concat takes too still copies. */
static void test_concat_in_place(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape xs = dims(4, 1, 8, 6, 6), ws = dims(4, 4, 8, 3, 3);
  TensorRef x = {graph_add_input(g, "x", &xs, DT_F32, &d), 0};
  TensorRef w = {graph_add_input(g, "w", &ws, DT_F32, &d), 0};
  Params cp, kp;
  params_default(OP_CONCAT, &cp);
  param_set_int(&cp, 0, 1);
  params_default(OP_CONV2D, &kp);
  param_set_ints(&kp, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  TensorRef inner_in[2] = {add1(g, OP_RELU, x, NULL, &d), add1(g, OP_TANH, x, NULL, &d)};
  TensorRef inner = {graph_add_node(g, OP_CONCAT, inner_in, 2, 1, &cp, "inner", &d), 0};
  TensorRef outer_in[2] = {inner, add1(g, OP_SIGMOID, x, NULL, &d)};
  TensorRef outer = {graph_add_node(g, OP_CONCAT, outer_in, 2, 1, &cp, "outer", &d), 0};
  TensorRef twice = add1(g, OP_RELU, x, NULL, &d);
  TensorRef shared_in[2] = {twice, add1(g, OP_SIGMOID, x, NULL, &d)};
  TensorRef shared = {graph_add_node(g, OP_CONCAT, shared_in, 2, 1, &cp, "shared", &d), 0};
  TensorRef t = add1(g, OP_TANH, x, NULL, &d);
  TensorRef copy_a_in[2] = {t, add1(g, OP_RELU, x, NULL, &d)};
  TensorRef copy_b_in[2] = {t, add1(g, OP_SIGMOID, x, NULL, &d)};
  TensorRef copy_a = {graph_add_node(g, OP_CONCAT, copy_a_in, 2, 1, &cp, "copy_a", &d), 0};
  TensorRef copy_b = {graph_add_node(g, OP_CONCAT, copy_b_in, 2, 1, &cp, "copy_b", &d), 0};
  TensorRef conv = {graph_add_node(g, OP_CONV2D, (TensorRef[]){x, w}, 2, 1, &kp, "conv", &d), 0};
  TensorRef narrow_in[2] = {add1(g, OP_RELU, x, NULL, &d), conv};
  TensorRef narrow = {graph_add_node(g, OP_CONCAT, narrow_in, 2, 1, &cp, "narrow", &d), 0};
  Params ap;
  params_default(OP_EWADD, &ap);
  TensorRef sum = {graph_add_node(g, OP_EWADD, (TensorRef[]){outer, outer}, 2, 1, &ap, "sum", &d), 0};
  graph_add_output(g, outer, "outer", &d);
  graph_add_output(g, sum, "sum", &d);
  graph_add_output(g, shared, "shared", &d);
  graph_add_output(g, copy_a, "copy_a", &d);
  graph_add_output(g, copy_b, "copy_b", &d);
  graph_add_output(g, add1(g, OP_TANH, twice, NULL, &d), "tanh", &d);
  graph_add_output(g, narrow, "narrow", &d);
  /* A view of a piece, and a conv reading a piece 1152 bytes into its concat. */
  Params rp;
  params_default(OP_RESHAPE, &rp);
  param_set_ints(&rp, 0, (int64_t[]){1, 288}, 2);
  graph_add_output(g, add1(g, OP_RESHAPE, twice, &rp, &d), "piece_view", &d);
  TensorRef conv2_in[2] = {inner_in[1], w};
  graph_add_output(g, (TensorRef){graph_add_node(g, OP_CONV2D, conv2_in, 2, 1, &kp, "conv2", &d), 0},
                   "conv_of_piece", &d);
  /* relu, tanh, sigmoid and the add; relu, sigmoid and tanh; tanh, relu,
   * sigmoid and the two concats that copy; relu and the conv; the conv of
   * a piece (the view of a piece is none). */
  check_planned(g, 79, 1e-5, 15, "concats in place");
  graph_free(g);
  diag_fini(&d);
}

/* ---- grid_sample ---- */

/* Both modes under every padding, with and without align_corners, on
 * grids the harness draws in [-1, 1): positions inside the input and in
 * its outer half pixel; and RAFT's [1, 96, 16, 16] sampled at 16x16. */
static void test_grid_sample(void) {
  static const char *const pads[] = {"zeros", "border", "reflection"};
  char label[128];
  for (int mode = 0; mode < 2; mode++)
    for (int pad = 0; pad < 3; pad++)
      for (int align = 0; align < 2; align++) {
        snprintf(label, sizeof label, "grid_sample %s %s align_corners=%d 2x3x7x5 at 4x6",
                 mode ? "nearest" : "bilinear", pads[pad], align);
        CudaCase c = cuda_case(label, OP_GRID_SAMPLE, 2,
                               (const Shape[]){dims(4, 2, 3, 7, 5), dims(4, 2, 4, 6, 2)});
        set_int(&c, "mode", mode);
        set_int(&c, "padding_mode", pad);
        set_int(&c, "align_corners", align);
        run(&c);
      }
  CudaCase c = cuda_case("grid_sample bilinear zeros align_corners=1 1x96x16x16 at 16x16",
                         OP_GRID_SAMPLE, 2,
                         (const Shape[]){dims(4, 1, 96, 16, 16), dims(4, 1, 16, 16, 2)});
  set_int(&c, "align_corners", 1);
  run(&c);
}

/* Swin-T's first stage: its cyclic shift and window partition (56 x 56
 * pixels of 96 channels, windows of 7, shifted by 3), and its patch
 * merging; each chain one gather between two relus. Rows of 96 floats
 * start on 16 bytes, so they copy as float4s; rows of 30 do not. */
static void test_gathered_chains(void) {
  Chain ch = shifted_windows(56, 7, 96, 3);
  check_planned(ch.g, 91, 0, 3, "Swin-T's shifted windows");
  graph_free(ch.g);
  ch = shifted_windows(14, 7, 30, 3);
  check_planned(ch.g, 92, 0, 3, "shifted windows, rows of 30");
  graph_free(ch.g);
  ch = patch_merging(56, 96);
  check_planned(ch.g, 93, 0, 3, "Swin-T's patch merging");
  graph_free(ch.g);
}

int main(void) {
  dev = cuda_check_open();
  diag_init(&D);
  test_gathered_chains();
  test_views();
  test_concat_in_place();
  test_transpose();
  test_reshape();
  test_concat();
  test_split();
  test_pad();
  test_slice();
  test_gather();
  test_blocks();
  test_tile_expand();
  test_resize();
  test_grid_sample();
  diag_fini(&D);
  cuda_device_close(dev);
  return check_exit();
}
