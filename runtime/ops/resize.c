/* resize.c: ONNX Resize (opset 11 and later) of a 4-D NCHW tensor over H
 * and W: nearest-neighbour (four rounding rules) or bilinear, under the
 * coordinate transformations half_pixel, pytorch_half_pixel, align_corners
 * and asymmetric; and the older Upsample (opset 9) and Resize of opset
 * 10, which upsample under asymmetric coordinates, rounding down.
 *
 * An output coordinate x maps to x_in = f(x, scale, in, out) in double, as
 * in the ONNX reference; scale is the one given (scales input), or out/in
 * when sizes were given, so a scale whose product is not whole still maps
 * as ONNX does. Nearest rounds x_in and clamps it to the input; linear
 * clamps x_in to [0, in - 1] and mixes its two neighbours.
 *
 * Parameters: the output extent (sizes, 0 meaning floor(in * scale)) and
 * the scales; ONNX's scales and sizes inputs must be constants and become
 * these at import, roi is unused (tf_crop_and_resize is refused).
 *
 * Z_p: nearest moves elements, so it is exact; linear's weights are
 * fractions with no exact residue here, so its Z_p kernel refuses. Both
 * modes are linear in X: the row is OPF_MULTILINEAR. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/modp.h"
#include "runtime/ops/family.h"

static const char *const mode_symbols[] = {"nearest", "linear", NULL};
static const char *const coord_symbols[] = {"half_pixel", "asymmetric", "align_corners",
                                            "pytorch_half_pixel", NULL};
static const char *const nearest_symbols[] = {"round_prefer_floor", "round_prefer_ceil",
                                              "floor", "ceil", NULL};

/* ---- geometry ---- */

static int resize_out_dim(const Node *n, int axis, int64_t in, int64_t *out, Diag *d) {
  const Params *p = &n->params;
  double scale = param_float(p, axis ? RS_SCALE_W : RS_SCALE_H);
  int64_t size = p->v[RS_SIZES].i[axis];
  const char *name = axis ? "scale_w" : "scale_h";
  if (!(scale > 0))
    return op_error(n, d, "%s=%g: must be > 0", name, scale);
  /* In float32, as ONNX's shape inference and ONNX Runtime take it: 5 x
   * 1.4f is 7 there, 6.99999988 in double. */
  *out = size ? size : (int64_t)floorf((float)in * (float)scale);
  if (*out < 1 || *out > SPATIAL_MAX)
    return op_error(n, d, "%s=%g, sizes[%d]=%lld: output extent %lld from input %lld outside "
                    "[1, %lld]", name, scale, axis, (long long)size, (long long)*out,
                    (long long)in, (long long)SPATIAL_MAX);
  return TEQ_OK;
}

static int resize_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char s[SHAPE_STR_MAX];
  if (in[0].ndim != 4)
    return op_error(n, d, "input X %s: expected [N, C, H, W]", shape_format(&in[0], s, sizeof s));
  int64_t oh = 0, ow = 0;
  int rc = resize_out_dim(n, 0, in[0].d[2], &oh, d);
  if (rc || (rc = resize_out_dim(n, 1, in[0].d[3], &ow, d))) return rc;
  out[0] = shape_make(4, (int64_t[]){in[0].d[0], in[0].d[1], oh, ow});
  return TEQ_OK;
}

/* The input coordinate of output coordinate x along one axis. As in the
 * ONNX reference, align_corners and pytorch_half_pixel take the resized
 * length as in * scale, not the whole output extent. */
static double source_coord(int coord, int64_t x, double scale, int64_t in) {
  double len = (double)in * scale;
  switch (coord) {
  case COORD_ASYMMETRIC: return (double)x / scale;
  case COORD_ALIGN_CORNERS: return len == 1 ? 0.0 : (double)x * (double)(in - 1) / (len - 1);
  case COORD_PYTORCH_HALF_PIXEL: return len > 1 ? ((double)x + 0.5) / scale - 0.5 : 0.0;
  default: return ((double)x + 0.5) / scale - 0.5;
  }
}

static int64_t round_nearest(int rule, double v) {
  double f = floor(v);
  switch (rule) {
  case NEAREST_FLOOR: return (int64_t)f;
  case NEAREST_CEIL: return (int64_t)ceil(v);
  case NEAREST_ROUND_PREFER_CEIL: return (int64_t)(v - f >= 0.5 ? f + 1 : f);
  default: return (int64_t)(v - f > 0.5 ? f + 1 : f);
  }
}

/* Per output coordinate of one axis: the two input indices and the weight
 * of the second (nearest: both indices equal, weight 0). */
typedef struct Tap {
  int64_t i0, i1;
  double w1;
} Tap;

static void axis_taps(const Node *n, int axis, int64_t in, int64_t out, Tap *t) {
  const Params *p = &n->params;
  int mode = (int)param_int(p, RS_MODE), coord = (int)param_int(p, RS_COORD);
  int rule = (int)param_int(p, RS_NEAREST);
  double scale = p->v[RS_SIZES].i[axis] ? (double)out / (double)in
                                        : param_float(p, axis ? RS_SCALE_W : RS_SCALE_H);
  for (int64_t x = 0; x < out; x++) {
    double v = source_coord(coord, x, scale, in);
    if (mode == MODE_NEAREST) {
      int64_t i = round_nearest(rule, v);
      i = i < 0 ? 0 : i >= in ? in - 1 : i;
      t[x] = (Tap){i, i, 0.0};
      continue;
    }
    v = v < 0 ? 0 : v > (double)(in - 1) ? (double)(in - 1) : v;
    int64_t i0 = (int64_t)floor(v);
    t[x] = (Tap){i0, i0 + 1 < in ? i0 + 1 : i0, v - (double)i0};
  }
}

/* Shared by both kernels: the taps of both axes, or an error. */
static int resize_taps(const Node *n, const Tensor *x, const Tensor *y, Tap **th, Tap **tw,
                       Diag *d) {
  int64_t h = x->shape.d[2], w = x->shape.d[3], oh = y->shape.d[2], ow = y->shape.d[3];
  *th = malloc((size_t)oh * sizeof **th);
  *tw = malloc((size_t)ow * sizeof **tw);
  if (!*th || !*tw) {
    free(*th);
    free(*tw);
    op_error(n, d, "out of memory for %lld + %lld coordinates", (long long)oh, (long long)ow);
    return TEQ_ERR_NOMEM;
  }
  axis_taps(n, 0, h, oh, *th);
  axis_taps(n, 1, w, ow, *tw);
  return TEQ_OK;
}

static int resize_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  Tap *th, *tw;
  int rc = resize_taps(n, in[0], out[0], &th, &tw, d);
  if (rc) return rc;
  const Shape *s = &in[0]->shape;
  int64_t planes = s->d[0] * s->d[1], h = s->d[2], w = s->d[3];
  int64_t oh = out[0]->shape.d[2], ow = out[0]->shape.d[3];
  const float *x = in[0]->data;
  float *y = out[0]->data;
  for (int64_t pl = 0; pl < planes; pl++) {
    const float *xp = x + pl * h * w;
    for (int64_t oy = 0; oy < oh; oy++) {
      const Tap *a = &th[oy];
      const float *r0 = xp + a->i0 * w, *r1 = xp + a->i1 * w;
      float *yr = y + (pl * oh + oy) * ow;
      for (int64_t ox = 0; ox < ow; ox++) {
        const Tap *b = &tw[ox];
        double top = r0[b->i0] + b->w1 * (r0[b->i1] - r0[b->i0]);
        double bot = r1[b->i0] + b->w1 * (r1[b->i1] - r1[b->i0]);
        yr[ox] = (float)(top + a->w1 * (bot - top));
      }
    }
  }
  free(th);
  free(tw);
  return TEQ_OK;
}

static int resize_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  if (param_int(&n->params, RS_MODE) != MODE_NEAREST)
    return op_error(n, d, "mode=linear: fractional weights have no exact Z_p form; only "
                    "mode=nearest runs in Z_p");
  Tap *th, *tw;
  int rc = resize_taps(n, in[0], out[0], &th, &tw, d);
  if (rc) return rc;
  const Shape *s = &in[0]->shape;
  int64_t planes = s->d[0] * s->d[1], h = s->d[2], w = s->d[3];
  int64_t oh = out[0]->shape.d[2], ow = out[0]->shape.d[3];
  const uint32_t *x = in[0]->data;
  uint32_t *y = out[0]->data;
  for (int64_t pl = 0; pl < planes; pl++)
    for (int64_t oy = 0; oy < oh; oy++) {
      const uint32_t *xr = x + (pl * h + th[oy].i0) * w;
      uint32_t *yr = y + (pl * oh + oy) * ow;
      for (int64_t ox = 0; ox < ow; ox++) yr[ox] = xr[tw[ox].i0];
    }
  free(th);
  free(tw);
  return TEQ_OK;
}

/* ---- ONNX ---- */

/* Index of a string attribute's value in symbols (the default when absent),
 * or an unsupported-value error naming the attribute. */
static int read_symbol(OnnxNodeIn *v, const char *attr, const char *const *symbols,
                       int def, int *out, Diag *d) {
  const char *s;
  *out = def;
  if (!onnx_in_attr_string(v, attr, &s)) return TEQ_OK;
  for (int i = 0; symbols[i]; i++)
    if (strcmp(s, symbols[i]) == 0) {
      *out = i;
      return TEQ_OK;
    }
  return onnx_in_unsupported(v, d, "Resize with %s=%s is not supported", attr, s);
}

/* A constant float32 or int64 input i of 4 values into v[4]; *present is
 * false for an absent or empty input. */
static int read_four(OnnxNodeIn *v, int i, const char *what, double out[4], bool *present,
                     Diag *d) {
  *present = false;
  if (!onnx_in_has_input(v, i)) return TEQ_OK;
  const Tensor *t = onnx_in_const_input(v, i);
  if (!t) return onnx_in_unsupported(v, d, "%s %s (input %d) is computed, not a constant",
                                     onnx_in_op_type(v), what, i);
  if (tensor_numel(t) == 0) {
    onnx_in_consume_input(v, i);
    return TEQ_OK;
  }
  if (tensor_numel(t) != 4)
    return onnx_in_unsupported(v, d, "%s %s (input %d) with %lld values: only 4-D input "
                               "is supported", onnx_in_op_type(v), what, i,
                               (long long)tensor_numel(t));
  for (int k = 0; k < 4; k++)
    out[k] = t->dtype == DT_I64 ? (double)((const int64_t *)t->data)[k]
                                : (double)((const float *)t->data)[k];
  onnx_in_consume_input(v, i);
  *present = true;
  return TEQ_OK;
}

/* Refuses an integer attribute whose value is not `want`. */
static int require_int(OnnxNodeIn *v, const char *attr, int64_t want, Diag *d) {
  int64_t k;
  if (onnx_in_attr_int(v, attr, &k) && k != want)
    return onnx_in_unsupported(v, d, "Resize with %s=%lld is not supported", attr, (long long)k);
  return TEQ_OK;
}

/* Upsample of opset 9 (deprecated at 10) and Resize of opset 10: X and a
 * constant scales input, mode nearest or linear. An output pixel x reads
 * the input at x / scale (asymmetric), the nearest pixel the one below it,
 * as ONNX Runtime computes these forms. Only upsampling is taken: a
 * nearest Resize-10 that shrinks rounds otherwise there. Upsample before
 * opset 9 holds its scales in an attribute, and is refused. */
static int resize_old_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const char *op = onnx_in_op_type(v);
  if (onnx_in_opset(v) < 9)
    return onnx_in_unsupported(v, d, "%s of opset %d: only the opset 9 form (scales an input) "
                               "is supported", op, onnx_in_opset(v));
  int mode, rc;
  double scales[4];
  bool has_scales;
  if ((rc = read_symbol(v, "mode", mode_symbols, MODE_NEAREST, &mode, d))) return rc;
  const Shape *x = onnx_in_input_shape(v, 0);
  if (!x || x->ndim != 4)
    return onnx_in_unsupported(v, d, "%s needs a 4-D input of known shape", op);
  if ((rc = read_four(v, 1, "scales", scales, &has_scales, d))) return rc;
  if (!has_scales) return onnx_in_error(v, d, "%s needs its scales (input 1)", op);
  if (scales[0] != 1 || scales[1] != 1)
    return onnx_in_unsupported(v, d, "%s of the N or C dimension: only H and W", op);
  if (!(scales[2] >= 1 && scales[3] >= 1))
    return onnx_in_unsupported(v, d, "%s by scales (%g %g): only upsampling (scales >= 1) is "
                               "supported in this form", op, scales[2], scales[3]);
  param_set_int(p, RS_MODE, mode);
  param_set_int(p, RS_COORD, COORD_ASYMMETRIC);
  param_set_int(p, RS_NEAREST, NEAREST_FLOOR);
  param_set_float(p, RS_SCALE_H, scales[2]);
  param_set_float(p, RS_SCALE_W, scales[3]);
  return TEQ_OK;
}

static int resize_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  if (onnx_in_opset(v) < 11 || strcmp(onnx_in_op_type(v), "Upsample") == 0)
    return resize_old_read(v, p, d);
  int mode, coord, rule, rc;
  const char *s;
  double a, scales[4] = {1, 1, 1, 1}, sizes[4] = {0};
  bool has_scales, has_sizes;
  if (onnx_in_attr_string(v, "mode", &s) && strcmp(s, "cubic") == 0)
    return onnx_in_unsupported(v, d, "Resize with mode=cubic is not supported");
  if ((rc = read_symbol(v, "mode", mode_symbols, MODE_NEAREST, &mode, d)) ||
      (rc = read_symbol(v, "coordinate_transformation_mode", coord_symbols, COORD_HALF_PIXEL,
                        &coord, d)) ||
      (rc = read_symbol(v, "nearest_mode", nearest_symbols, NEAREST_ROUND_PREFER_FLOOR, &rule,
                        d)) ||
      (rc = require_int(v, "exclude_outside", 0, d)) || (rc = require_int(v, "antialias", 0, d)))
    return rc;
  if (onnx_in_attr_string(v, "keep_aspect_ratio_policy", &s) && strcmp(s, "stretch") != 0)
    return onnx_in_unsupported(v, d, "Resize with keep_aspect_ratio_policy=%s is not "
                               "supported", s);
  int64_t axes[TEQ_MAX_PARAM_LEN];
  int n_axes = 0;
  if (onnx_in_attr_ints(v, "axes", axes, TEQ_MAX_PARAM_LEN, &n_axes))
    return onnx_in_unsupported(v, d, "Resize with an axes attribute is not supported");
  onnx_in_attr_float(v, "cubic_coeff_a", &a);
  onnx_in_attr_float(v, "extrapolation_value", &a);
  const Shape *x = onnx_in_input_shape(v, 0);
  if (!x || x->ndim != 4)
    return onnx_in_unsupported(v, d, "Resize needs a 4-D input of known shape");
  if ((rc = read_four(v, 2, "scales", scales, &has_scales, d)) ||
      (rc = read_four(v, 3, "sizes", sizes, &has_sizes, d)))
    return rc;
  if (has_scales == has_sizes)
    return onnx_in_error(v, d, "Resize needs exactly one of scales and sizes");
  if (onnx_in_has_input(v, 1)) {
    if (!onnx_in_const_input(v, 1))
      return onnx_in_unsupported(v, d, "Resize roi (input 1) is computed, not a constant");
    onnx_in_consume_input(v, 1); /* only tf_crop_and_resize reads it, and that is refused */
  }
  bool nc_same = has_sizes ? sizes[0] == (double)x->d[0] && sizes[1] == (double)x->d[1]
                           : scales[0] == 1 && scales[1] == 1;
  if (!nc_same)
    return onnx_in_unsupported(v, d, "Resize of the N or C dimension: only H and W");
  param_set_int(p, RS_MODE, mode);
  param_set_int(p, RS_COORD, coord);
  param_set_int(p, RS_NEAREST, rule);
  if (has_sizes) {
    for (int i = 2; i < 4; i++)
      if (sizes[i] < 1)
        return onnx_in_error(v, d, "Resize sizes[%d]=%g: must be >= 1", i, sizes[i]);
    param_set_ints(p, RS_SIZES, (int64_t[]){(int64_t)sizes[2], (int64_t)sizes[3]}, 2);
    scales[2] = sizes[2] / (double)x->d[2];
    scales[3] = sizes[3] / (double)x->d[3];
  }
  param_set_float(p, RS_SCALE_H, scales[2]);
  param_set_float(p, RS_SCALE_W, scales[3]);
  return TEQ_OK;
}

/* Opset 13: X, an empty roi, then scales (float32) or sizes (int64) as an
 * initializer; the modes as string attributes. */
static int resize_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  const Params *p = &n->params;
  const Shape *x = onnx_out_input_shape(w, 0);
  if (!x || x->ndim != 4) return op_error(n, d, "export needs the input's 4-D shape");
  onnx_out_attr_string(w, "mode", mode_symbols[param_int(p, RS_MODE)]);
  onnx_out_attr_string(w, "coordinate_transformation_mode", coord_symbols[param_int(p, RS_COORD)]);
  onnx_out_attr_string(w, "nearest_mode", nearest_symbols[param_int(p, RS_NEAREST)]);
  bool sized = p->v[RS_SIZES].i[0] || p->v[RS_SIZES].i[1];
  Shape s = shape_of(1, 4);
  Tensor *t = tensor_new(sized ? DT_I64 : DT_F32, &s);
  if (!t) return TEQ_ERR_NOMEM;
  if (sized) {
    int64_t oh = 0, ow = 0;
    int rc = resize_out_dim(n, 0, x->d[2], &oh, d);
    if (rc || (rc = resize_out_dim(n, 1, x->d[3], &ow, d))) {
      tensor_unref(t);
      return rc;
    }
    memcpy(t->data, (int64_t[]){x->d[0], x->d[1], oh, ow}, 4 * sizeof(int64_t));
  } else {
    float *f = t->data;
    f[0] = f[1] = 1.0f;
    f[2] = (float)param_float(p, RS_SCALE_H);
    f[3] = (float)param_float(p, RS_SCALE_W);
  }
  onnx_out_add_empty_input(w); /* roi */
  if (sized) onnx_out_add_empty_input(w);
  onnx_out_add_const_input(w, t);
  tensor_unref(t);
  return TEQ_OK;
}

static const OpParam resize_params[] = {
  [RS_MODE] = {.name = "mode", .type = PARAM_INT, .def = MODE_NEAREST, .lo = MODE_NEAREST,
               .hi = MODE_LINEAR, .symbols = mode_symbols},
  [RS_COORD] = {.name = "coord", .type = PARAM_INT, .def = COORD_HALF_PIXEL,
                .lo = COORD_HALF_PIXEL, .hi = COORD_PYTORCH_HALF_PIXEL, .symbols = coord_symbols},
  [RS_NEAREST] = {.name = "nearest_mode", .type = PARAM_INT, .def = NEAREST_ROUND_PREFER_FLOOR,
                  .lo = NEAREST_ROUND_PREFER_FLOOR, .hi = NEAREST_CEIL,
                  .symbols = nearest_symbols},
  [RS_SIZES] = {.name = "sizes", .type = PARAM_INTS, .len = 2, .def = 0, .lo = 0,
                .hi = SPATIAL_MAX},
  [RS_SCALE_H] = {.name = "scale_h", .type = PARAM_FLOAT, .fdef = 1.0},
  [RS_SCALE_W] = {.name = "scale_w", .type = PARAM_FLOAT, .fdef = 1.0},
};

static const char *const resize_aliases[] = {"Upsample", NULL};

const OpDef op_def_resize = {
  .kind = OP_RESIZE, .name = "resize", .onnx_op = "Resize", .onnx_aliases = resize_aliases,
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .params = resize_params, .n_params = 6,
  .flags = OPF_MULTILINEAR,
  .infer_shape = resize_infer,
  .eval_f32 = resize_eval_f32, .eval_modp = resize_eval_modp,
  .onnx_read = resize_onnx_read, .onnx_write = resize_onnx_write,
  .eval_cuda = CUDA_EVAL(resize),
};
