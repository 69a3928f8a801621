/* sample.c: ONNX GridSample (opset 16 on) of a 4-D input: Y [N, C, Ho,
 * Wo] samples X [N, C, H, W] at the positions grid [N, Ho, Wo, 2] holds,
 * (x, y) scaled to [-1, 1] across the input. RAFT's optical flow samples
 * its correlation pyramid with it; spatial transformers warp with it.
 *
 * A position is taken to pixels as ONNX says: with align_corners,
 * -1 and 1 are the centres of the corner pixels, ((g + 1) / 2)(W - 1);
 * without, the corners' outer edges, ((g + 1) W - 1) / 2. Outside the
 * input, padding_mode zeros reads zeros, border clamps the position to
 * the edge pixels, reflection reflects it about the edges (the centres or
 * the outer edges, as align_corners says) and then clamps it. Bilinear
 * mixes the four pixels around the position, each tap outside the input
 * reading 0; nearest rounds it half to even (ONNX's reference and
 * PyTorch). Arithmetic is float32, as in PyTorch and ONNX Runtime:
 * gs_sample in family.h, which the GPU's kernel (runtime/cuda/sample.cu)
 * runs too. Bicubic is refused: the node stays as it is.
 *
 * Z_p: the positions are values of a tensor, which no residue places in
 * the input, so the Z_p kernel refuses. No rule knows the operator. */
#include <string.h>

#include "runtime/ops/family.h"

static const char *const gs_mode_symbols[] = {"bilinear", "nearest", NULL};
static const char *const gs_padding_symbols[] = {"zeros", "border", "reflection", NULL};

static int gs_infer(const Node *n, const Shape *in, Shape *out, Diag *d) {
  char sx[SHAPE_STR_MAX], sg[SHAPE_STR_MAX];
  const Shape *x = &in[0], *g = &in[1];
  if (x->ndim != 4 || g->ndim != 4 || g->d[3] != 2 || g->d[0] != x->d[0])
    return op_error(n, d, "input X %s and grid %s: expected [N, C, H, W] and [N, Ho, Wo, 2]",
                    shape_format(x, sx, sizeof sx), shape_format(g, sg, sizeof sg));
  out[0] = shape_make(4, (int64_t[]){x->d[0], x->d[1], g->d[1], g->d[2]});
  return TEQ_OK;
}

static int gs_eval_f32(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)d;
  const Shape *xs = &in[0]->shape, *gsh = &in[1]->shape;
  int64_t batch = xs->d[0], c = xs->d[1], h = xs->d[2], w = xs->d[3];
  int64_t ho = gsh->d[1], wo = gsh->d[2];
  int mode = (int)param_int(&n->params, GS_MODE);
  int padding = (int)param_int(&n->params, GS_PADDING);
  bool align = param_int(&n->params, GS_ALIGN) != 0;
  const float *x = in[0]->data, *grid = in[1]->data;
  float *y = out[0]->data;
  for (int64_t b = 0; b < batch; b++)
    for (int64_t ch = 0; ch < c; ch++) {
      const float *plane = x + (b * c + ch) * h * w;
      const float *gb = grid + b * ho * wo * 2;
      for (int64_t p = 0; p < ho * wo; p++)
        *y++ = gs_sample(plane, h, w, gb[2 * p], gb[2 * p + 1], mode, padding, align);
    }
  return TEQ_OK;
}

static int gs_eval_modp(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)in, (void)out;
  return op_error(n, d, "the sampling positions are a tensor's values, which no residue "
                  "places in the input: not evaluated in Z_p");
}

/* mode (opset 20 spells bilinear linear; bicubic and cubic are refused),
 * padding_mode and align_corners. */
static int gs_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  const char *s = NULL;
  if (onnx_in_attr_string(v, "mode", &s)) {
    int mode = strcmp(s, "bilinear") == 0 || strcmp(s, "linear") == 0 ? GS_BILINEAR
               : strcmp(s, "nearest") == 0                          ? GS_NEAREST
                                                                    : -1;
    if (mode < 0) return onnx_in_unsupported(v, d, "GridSample with mode=%s is not supported", s);
    param_set_int(p, GS_MODE, mode);
  }
  if (onnx_in_attr_string(v, "padding_mode", &s)) {
    int k = 0;
    while (gs_padding_symbols[k] && strcmp(s, gs_padding_symbols[k]) != 0) k++;
    if (!gs_padding_symbols[k])
      return onnx_in_error(v, d, "padding_mode=%s: expected zeros, border or reflection", s);
    param_set_int(p, GS_PADDING, k);
  }
  const Shape *x = onnx_in_input_shape(v, 0);
  if (x && shape_is_known(x) && x->ndim != 4)
    return onnx_in_unsupported(v, d, "a GridSample of rank %d: only 4-D inputs are taken",
                               x->ndim);
  return TEQ_OK;
}

static int gs_onnx_write(const Node *n, OnnxNodeOut *w, Diag *d) {
  (void)d;
  int mode = (int)param_int(&n->params, GS_MODE);
  onnx_out_attr_string(w, "mode", mode == GS_NEAREST ? "nearest"
                                  : onnx_out_opset(w) >= 20 ? "linear" : "bilinear");
  onnx_out_attr_string(w, "padding_mode",
                       gs_padding_symbols[param_int(&n->params, GS_PADDING)]);
  return TEQ_OK;
}

static const OpParam gs_params[] = {
  [GS_MODE] = {.name = "mode", .type = PARAM_INT, .def = GS_BILINEAR, .lo = GS_BILINEAR,
               .hi = GS_NEAREST, .symbols = gs_mode_symbols},
  [GS_PADDING] = {.name = "padding_mode", .type = PARAM_INT, .def = GS_PAD_ZEROS,
                  .lo = GS_PAD_ZEROS, .hi = GS_PAD_REFLECTION, .symbols = gs_padding_symbols},
  [GS_ALIGN] = {.name = "align_corners", .type = PARAM_INT, .def = 0, .lo = 0, .hi = 1,
                .onnx_attr = "align_corners"},
};

const OpDef op_def_grid_sample = {
  .kind = OP_GRID_SAMPLE, .name = "grid_sample", .onnx_op = "GridSample", .onnx_opset = 16,
  .n_in_min = 2, .n_in_max = 2, .n_out_min = 1, .n_out_max = 1,
  .params = gs_params, .n_params = 3,
  .infer_shape = gs_infer,
  .eval_f32 = gs_eval_f32, .eval_modp = gs_eval_modp, .eval_cuda = CUDA_EVAL(grid_sample),
  .onnx_read = gs_onnx_read, .onnx_write = gs_onnx_write,
};
