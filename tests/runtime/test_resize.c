/* test_resize.c: resize (ONNX Resize over H and W) and grid_sample (ONNX
 * GridSample). Resize's nearest under every coordinate transformation and
 * rounding rule against a reference written here from the ONNX formulas;
 * bilinear against the ONNX operator examples; Z_p nearest against float32
 * on integers, and Z_p linear's refusal; shape inference's errors; and the
 * ONNX export -> import round trip with scales and with sizes.
 * grid_sample by hand at pixel centres, edges and outside the input, under
 * each padding and align_corners (ONNX's node tests hold it to the ONNX
 * reference on random grids), its Z_p refusal, shape errors, and the round
 * trip, the opset raised to 16. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/tensor_check.h"

enum { NEAREST, LINEAR };
enum { HALF_PIXEL, ASYMMETRIC, ALIGN_CORNERS, PYTORCH_HALF_PIXEL };

static void resize_setup(Op *o, int mode, int coord, int rule, int64_t oh, int64_t ow, double sh,
                         double sw) {
  op_init(o, OP_RESIZE, 1);
  op_int(o, "mode", mode);
  op_int(o, "coord", coord);
  op_int(o, "nearest_mode", rule);
  op_ints(o, "sizes", (int64_t[]){oh, ow}, 2);
  op_float(o, "scale_h", sh);
  op_float(o, "scale_w", sw);
}

/* The nearest input index of output x, from the ONNX reference's formulas. */
static int64_t nearest_ref(int coord, int rule, int64_t x, double scale, int64_t in, int64_t out) {
  double v, len = in * scale; /* the reference's resized length */
  (void)out;
  if (coord == ASYMMETRIC) v = x / scale;
  else if (coord == ALIGN_CORNERS) v = len == 1 ? 0 : x * (double)(in - 1) / (len - 1);
  else if (coord == PYTORCH_HALF_PIXEL && len <= 1) v = 0;
  else v = (x + 0.5) / scale - 0.5;
  double r;
  if (rule == 2) r = floor(v);
  else if (rule == 3) r = ceil(v);
  else if (v - floor(v) == 0.5) r = rule == 0 ? floor(v) : ceil(v);
  else r = round(v);
  return r < 0 ? 0 : r > in - 1 ? in - 1 : (int64_t)r;
}

/* Every coordinate mode and rounding rule, up and down, by scales and by
 * sizes; float32 against the reference, Z_p against float32. */
static void test_nearest(void) {
  Diag d;
  diag_init(&d);
  static const int64_t dims[][4] = {{2, 3, 4, 5}, {1, 2, 7, 3}, {1, 1, 1, 6}};
  static const double scales[][2] = {{2, 3}, {0.6, 0.75}, {1.5, 0.5}, {3.3, 1.0}};
  for (size_t di = 0; di < 3; di++)
    for (size_t si = 0; si < 4 + 2; si++)
      for (int coord = 0; coord < 4; coord++)
        for (int rule = 0; rule < 4; rule++) {
          const int64_t *s = dims[di];
          bool sized = si >= 4; /* sizes: 2*h+1 x w-1 or 1 x 3w */
          int64_t oh = sized ? (si == 4 ? 2 * s[2] + 1 : 1) : 0;
          int64_t ow = sized ? (si == 4 ? (s[3] > 1 ? s[3] - 1 : 2) : 3 * s[3]) : 0;
          double sh = sized ? (double)oh / s[2] : scales[si][0];
          double sw = sized ? (double)ow / s[3] : scales[si][1];
          if (!sized) oh = (int64_t)floor(s[2] * sh), ow = (int64_t)floor(s[3] * sw);
          if (oh < 1 || ow < 1) continue;
          Op o;
          resize_setup(&o, NEAREST, coord, rule, sized ? oh : 0, sized ? ow : 0, sh, sw);
          Shape xs = shape_of(4, s[0], s[1], s[2], s[3]);
          Tensor *x = iota_from(xs, 0), *xm = f32_to_modp(x);
          Tensor *y = op_run(&o, &x, false, &d), *ym = op_run(&o, &xm, true, &d);
          Shape want = shape_of(4, s[0], s[1], oh, ow);
          bool ok = y && shape_equal(&y->shape, &want);
          for (int64_t pl = 0; ok && pl < s[0] * s[1]; pl++)
            for (int64_t oy = 0; ok && oy < oh; oy++)
              for (int64_t ox = 0; ok && ox < ow; ox++) {
                int64_t iy = nearest_ref(coord, rule, oy, sh, s[2], oh);
                int64_t ix = nearest_ref(coord, rule, ox, sw, s[3], ow);
                ok = elem_f32(y, (pl * oh + oy) * ow + ox) ==
                     (float)((pl * s[2] + iy) * s[3] + ix);
              }
          CHECK_MSG(ok, "nearest dims %zu scales %zu coord %d rule %d: %s", di, si, coord, rule,
                    diag_last(&d));
          Tensor *yfm = y ? f32_to_modp(y) : NULL;
          CHECK_MSG(tensors_identical(ym, yfm), "nearest Z_p dims %zu coord %d", di, coord);
          unref_all((Tensor *[]){x, xm, y, ym, yfm}, 5);
        }
  diag_fini(&d);
}

/* The ONNX operator examples (onnx/backend/test/case/node/resize.py). */
static void check_values(Op *o, Shape xs, const float *xv, Shape ys, const float *want,
                         const char *what) {
  Diag d;
  diag_init(&d);
  Tensor *x = f32_tensor(xs, xv);
  Tensor *y = op_run(o, &x, false, &d);
  bool ok = y && shape_equal(&y->shape, &ys);
  double worst = 0;
  for (int64_t i = 0; ok && i < shape_numel(&ys); i++)
    worst = fmax(worst, fabs(elem_f32(y, i) - want[i]));
  CHECK_MSG(ok && worst < 1e-5, "%s: error %g %s", what, worst, diag_last(&d));
  unref_all((Tensor *[]){x, y}, 2);
  diag_fini(&d);
}

static void test_examples(void) {
  static const float x22[] = {1, 2, 3, 4};
  Op o;
  resize_setup(&o, LINEAR, HALF_PIXEL, 0, 0, 0, 2, 2);
  check_values(&o, shape_of(4, 1, 1, 2, 2), x22, shape_of(4, 1, 1, 4, 4),
               (const float[]){1, 1.25, 1.75, 2, 1.5, 1.75, 2.25, 2.5, 2.5, 2.75, 3.25, 3.5,
                               3, 3.25, 3.75, 4},
               "upsample_scales_linear");
  resize_setup(&o, LINEAR, ALIGN_CORNERS, 0, 0, 0, 2, 2);
  float t = 1.0f / 3, u = 2.0f / 3;
  check_values(&o, shape_of(4, 1, 1, 2, 2), x22, shape_of(4, 1, 1, 4, 4),
               (const float[]){1, 1 + t, 1 + u, 2, 1 + u, 2, 2 + t, 2 + u, 2 + t, 2 + u, 3,
                               3 + t, 3, 3 + t, 3 + u, 4},
               "upsample_scales_linear_align_corners");
  static const float x24[] = {1, 2, 3, 4, 5, 6, 7, 8};
  resize_setup(&o, LINEAR, HALF_PIXEL, 0, 0, 0, 0.6, 0.6);
  check_values(&o, shape_of(4, 1, 1, 2, 4), x24, shape_of(4, 1, 1, 1, 2),
               (const float[]){2.6666665f, 4.3333331f}, "downsample_scales_linear");
  resize_setup(&o, LINEAR, ALIGN_CORNERS, 0, 0, 0, 0.6, 0.6);
  check_values(&o, shape_of(4, 1, 1, 2, 4), x24, shape_of(4, 1, 1, 1, 2),
               (const float[]){1, 3.142857f}, "downsample_scales_linear_align_corners");
  resize_setup(&o, NEAREST, HALF_PIXEL, 0, 0, 0, 0.6, 0.6);
  check_values(&o, shape_of(4, 1, 1, 2, 4), x24, shape_of(4, 1, 1, 1, 2), (const float[]){1, 3},
               "downsample_scales_nearest");
  resize_setup(&o, NEAREST, HALF_PIXEL, 0, 0, 0, 2, 3);
  check_values(&o, shape_of(4, 1, 1, 2, 2), x22, shape_of(4, 1, 1, 4, 6),
               (const float[]){1, 1, 1, 2, 2, 2, 1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4, 3, 3, 3, 4,
                               4, 4},
               "upsample_scales_nearest");
  static const float x44[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  resize_setup(&o, LINEAR, PYTORCH_HALF_PIXEL, 0, 3, 1, 0.75, 0.25);
  check_values(&o, shape_of(4, 1, 1, 4, 4), x44, shape_of(4, 1, 1, 3, 1),
               (const float[]){1.6666666f, 7, 12.333333f},
               "downsample_sizes_linear_pytorch_half_pixel");
}

/* Linear has no exact Z_p form: the kernel refuses, naming the mode. */
static void test_modp_linear_refused(void) {
  Diag d;
  diag_init(&d);
  Op o;
  resize_setup(&o, LINEAR, HALF_PIXEL, 0, 0, 0, 2, 2);
  Tensor *x = random_ints_modp(shape_of(4, 1, 2, 3, 3), 3, 1800);
  Tensor *y = op_run(&o, &x, true, &d);
  CHECK(y == NULL);
  CHECK_MSG(strstr(diag_last(&d), "mode=linear") != NULL, "%s", diag_last(&d));
  unref_all((Tensor *[]){x, y}, 2);
  diag_fini(&d);
}

static void test_errors(void) {
  Op o;
  resize_setup(&o, NEAREST, HALF_PIXEL, 0, 0, 0, 2, 2);
  op_check_error(&o, (Shape[]){shape_of(3, 1, 4, 4)}, "resize: input X [1, 4, 4]: expected");
  resize_setup(&o, NEAREST, HALF_PIXEL, 0, 0, 0, 0.1, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 1, 4, 4)}, "scale_h=0.1");
  resize_setup(&o, NEAREST, HALF_PIXEL, 0, 0, 0, -1, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 1, 4, 4)}, "scale_h=-1: must be > 0");
}

/* An extent by scale is floor(in x scale) in float32, as ONNX's shape
 * inference and ONNX Runtime take it: 5 x 1.4f is 7 there, one short in
 * double (a fuzzer's model then failed to broadcast with the [.., 7, ..]
 * its next node took). */
static void test_extents_in_float32(void) {
  const struct {
    int64_t in;
    float scale;
    int64_t out;
  } cases[] = {{5, 1.4f, 7}, {3, 5.0f / 3, 5}, {3, 7.0f / 3, 7}, {10, 0.7f, 7}, {7, 2.5f, 17}};
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    Op o;
    Diag d;
    diag_init(&d);
    resize_setup(&o, LINEAR, HALF_PIXEL, 0, 0, 0, cases[k].scale, 1);
    CHECK_EQ_INT(op_infer_shapes(&o, (Shape[]){shape_of(4, 1, 1, (int)cases[k].in, 2)}, &d),
                 TEQ_OK);
    CHECK_MSG(o.out[0].d[2] == cases[k].out, "%lld x %.9g: extent %lld, not %lld",
              (long long)cases[k].in, (double)cases[k].scale, (long long)o.out[0].d[2],
              (long long)cases[k].out);
    diag_fini(&d);
  }
}

static void round_trip(int mode, int coord, int rule, int64_t oh, int64_t ow, double sh,
                       double sw, const char *what) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(4, 2, 3, 5, 4);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  Params p;
  params_default(OP_RESIZE, &p);
  param_set_int(&p, param_index(OP_RESIZE, "mode"), mode);
  param_set_int(&p, param_index(OP_RESIZE, "coord"), coord);
  param_set_int(&p, param_index(OP_RESIZE, "nearest_mode"), rule);
  param_set_ints(&p, param_index(OP_RESIZE, "sizes"), (int64_t[]){oh, ow}, 2);
  param_set_float(&p, param_index(OP_RESIZE, "scale_h"), sh);
  param_set_float(&p, param_index(OP_RESIZE, "scale_w"), sw);
  int r = graph_add_node(g, OP_RESIZE, (TensorRef[]){{x, 0}}, 1, 1, &p, "resize", &d);
  graph_add_output(g, (TensorRef){r, 0}, "y", &d);
  CHECK_MSG(d.n_errors == 0, "%s: %s", what, d.text ? d.text : "");
  Tensor *xv = random_f32(sx, 1900);
  CHECK_EQ_INT(check_graph_round_trip(g, NULL, &xv, what, NULL, &d), TEQ_OK);
  tensor_unref(xv);
  graph_free(g);
  diag_fini(&d);
}

static void test_onnx_round_trip(void) {
  round_trip(NEAREST, ASYMMETRIC, 3, 0, 0, 2, 1.5, "nearest by scales");
  round_trip(LINEAR, ALIGN_CORNERS, 0, 7, 3, 1.4, 0.75, "linear by sizes");
  round_trip(LINEAR, PYTORCH_HALF_PIXEL, 0, 0, 0, 0.5, 2.5, "linear by scales");
}

static void test_row(void) {
  const OpDef *r = op_def(OP_RESIZE);
  CHECK(r->infer_shape && r->eval_f32 && r->eval_modp && r->onnx_read && r->onnx_write);
  CHECK(r->flags & OPF_MULTILINEAR);
  CHECK(!(r->flags & (OPF_NONLINEAR | OPF_LAYOUT_ONLY | OPF_ELEMENTWISE)));
  CHECK_EQ_INT(op_by_onnx("Resize"), OP_RESIZE);
  char buf[160];
  Params p;
  params_default(OP_RESIZE, &p);
  param_set_int(&p, param_index(OP_RESIZE, "mode"), LINEAR);
  param_set_int(&p, param_index(OP_RESIZE, "coord"), ALIGN_CORNERS);
  params_format(OP_RESIZE, &p, true, buf, sizeof buf);
  CHECK_MSG(strcmp(buf, "mode=linear coord=align_corners") == 0, "%s", buf);
}

/* ---- grid_sample ---- */

static Tensor *sample(int mode, int padding, int align, Tensor *x, const float *grid, int n_pos,
                      Diag *d) {
  Op o;
  op_init(&o, OP_GRID_SAMPLE, 2);
  op_int(&o, "mode", mode);
  op_int(&o, "padding_mode", padding);
  op_int(&o, "align_corners", align);
  Tensor *g = f32_tensor(shape_of(4, 1, 1, n_pos, 2), grid);
  Tensor *y = op_run(&o, (Tensor *[]){x, g}, false, d);
  tensor_unref(g);
  return y;
}

/* A 2x3 plane 1..6. Positions: the centre of pixel (0, 0) and of (1, 2);
 * halfway between (0, 0) and (0, 1); a quarter pixel left of (0, 0);
 * two columns right of (1, 2). With align_corners, x = -1 is column 0's
 * centre and 1 column 2's; without, their outer edges, so column 0's
 * centre is -2/3. */
static void test_grid_sample(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = iota_from(shape_of(4, 1, 1, 2, 3), 1);
  const float aligned[] = {-1, -1, 1, 1, -0.5f, -1, -1.25f, -1, 3, 1};
  const float edges[] = {-2.0f / 3, -0.5f, 2.0f / 3, 0.5f, -1.0f / 3, -0.5f, -1.0f, -0.5f, 3, 0.5f};
  const struct {
    int mode, padding, align;
    const float *grid;
    float want[5];
  } cases[] = {
    /* bilinear, zeros: -1.25 aligned is column -0.25: 3/4 of pixel 1 */
    {0, 0, 1, aligned, {1, 6, 1.5f, 0.75f, 0}},
    /* border clamps to column 0 and column 2 */
    {0, 1, 1, aligned, {1, 6, 1.5f, 1, 6}},
    /* reflection about the centres: -0.25 -> 0.25, 4 -> 0 */
    {0, 2, 1, aligned, {1, 6, 1.5f, 1.25f, 4}},
    /* nearest rounds half to even: 0.5 -> 0, -0.25 -> 0, 5 -> outside */
    {1, 0, 1, aligned, {1, 6, 1, 1, 0}},
    /* without align_corners: -1 is the left edge, half outside */
    {0, 0, 0, edges, {1, 6, 1.5f, 0.5f, 0}},
    {0, 1, 0, edges, {1, 6, 1.5f, 1, 6}},
    /* reflection about the outer edges: -0.5 stays, clamped to 0; 5.5 ->
     * -0.5, clamped to 0 */
    {0, 2, 0, edges, {1, 6, 1.5f, 1, 4}},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    Tensor *y = sample(cases[k].mode, cases[k].padding, cases[k].align, x, cases[k].grid, 5, &d);
    for (int i = 0; y && i < 5; i++)
      CHECK_MSG(fabsf(((float *)y->data)[i] - cases[k].want[i]) < 1e-6f,
                "grid_sample case %zu position %d: %g, expected %g", k, i,
                (double)((float *)y->data)[i], (double)cases[k].want[i]);
    CHECK_MSG(y, "grid_sample case %zu: %s", k, diag_last(&d));
    tensor_unref(y);
  }
  /* Far and NaN positions read zeros (a NaN x gives bilinear NaN
   * weights, so NaN), or under border padding an edge pixel (a NaN clamps
   * to 0, as fmaxf takes the number); none is cast to an integer out of
   * its range, which C leaves undefined. */
  const float far[] = {NAN, -1, 1e30f, -1, -1e30f, 1e30f};
  for (int mode = 0; mode < 2; mode++) {
    Tensor *zeros = sample(mode, 0, 1, x, far, 3, &d), *border = sample(mode, 1, 1, x, far, 3, &d);
    const float want_border[] = {1, 3, 4}; /* (0, 0), (0, 2) and (1, 0) */
    for (int i = 0; zeros && border && i < 3; i++) {
      float z = ((float *)zeros->data)[i];
      CHECK_MSG(mode == 0 && i == 0 ? isnan(z) : z == 0.0f, "mode %d, far position %d: %g",
                mode, i, (double)z);
      CHECK_MSG(((float *)border->data)[i] == want_border[i], "mode %d, border %d: %g", mode, i,
                (double)((float *)border->data)[i]);
    }
    CHECK(zeros && border);
    unref_all((Tensor *[]){zeros, border}, 2);
  }
  /* Z_p: no residue says where a position is */
  Op o;
  op_init(&o, OP_GRID_SAMPLE, 2);
  Tensor *xm = f32_to_modp(x), *gm = random_ints_modp(shape_of(4, 1, 1, 2, 2), 3, 2000);
  Tensor *ym = op_run(&o, (Tensor *[]){xm, gm}, true, &d);
  CHECK(!ym && strstr(diag_last(&d), "not evaluated in Z_p"));
  op_check_error(&o, (Shape[]){shape_of(4, 1, 1, 2, 3), shape_of(4, 1, 2, 2, 3)},
                 "expected [N, C, H, W] and [N, Ho, Wo, 2]");
  op_check_error(&o, (Shape[]){shape_of(4, 2, 1, 2, 3), shape_of(4, 1, 2, 2, 2)},
                 "expected [N, C, H, W] and [N, Ho, Wo, 2]");
  unref_all((Tensor *[]){x, xm, gm, ym}, 4);
  /* Written at opset 16 at least, read back the same. */
  Graph *g = graph_new();
  Shape sx = shape_of(4, 2, 3, 5, 4);
  Tensor *grid = random_f32(shape_of(4, 2, 3, 6, 2), 2001); /* in [-1, 1) */
  int xi = graph_add_input(g, "x", &sx, DT_F32, &d), gi = graph_add_const(g, "grid", grid, &d);
  Params p;
  params_default(OP_GRID_SAMPLE, &p);
  param_set_int(&p, param_index(OP_GRID_SAMPLE, "padding_mode"), 2);
  param_set_int(&p, param_index(OP_GRID_SAMPLE, "align_corners"), 1);
  int s = graph_add_node(g, OP_GRID_SAMPLE, (TensorRef[]){{xi, 0}, {gi, 0}}, 2, 1, &p, "gs", &d);
  graph_add_output(g, (TensorRef){s, 0}, "y", &d);
  Tensor *xv = random_f32(sx, 2002);
  Graph *h = NULL;
  CHECK_EQ_INT(check_graph_round_trip(g, NULL, &xv, "grid_sample", &h, &d), TEQ_OK);
  CHECK(h && h->nodes[h->outputs[0].node].kind == OP_GRID_SAMPLE &&
        params_hash(0, &h->nodes[h->outputs[0].node].params) == params_hash(0, &p));
  tensor_unref(xv);
  graph_free(g);
  graph_free(h);
  diag_fini(&d);
}

int main(void) {
  test_grid_sample();
  test_extents_in_float32();
  test_row();
  test_nearest();
  test_examples();
  test_modp_linear_refused();
  test_errors();
  test_onnx_round_trip();
  return check_exit();
}
