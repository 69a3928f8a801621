/* test_linear.c: conv2d, conv3d, conv_transpose, matmul, gemm, enlarge, batchnorm and TASO's
 * constant tensors. Every float32 kernel is checked against a naive double
 * loop written here, on random inputs over many configurations; every Z_p
 * kernel against the float32 kernel on small integers (exact in float),
 * and the Z_p products over the whole field against 128-bit arithmetic;
 * TASO's identities (conv with const_iconv, matmul with const_imm, enlarge)
 * in both modes; and shape inference's error messages. Kernels are called
 * through their registry rows (Op, in tests/tensor_check.h); one test runs
 * conv and matmul through graph_add_node and exec_run as the executor does,
 * and one exports graphs of these operators to ONNX and imports them back. */
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

static double act_ref(int act, double v) {
  if (act == ACT_RELU) return v > 0 ? v : 0;
  if (act == ACT_SIGMOID) return 1.0 / (1.0 + exp(-v));
  if (act == ACT_TANH) return tanh(v);
  if (act == ACT_SILU) return v / (1.0 + exp(-v));
  if (act == ACT_HARD_SWISH) return v * fmin(fmax(v / 6.0 + 0.5, 0.0), 1.0);
  if (act == ACT_RELU6) return fmin(fmax(v, 0.0), 6.0);
  if (act == ACT_HARD_SIGMOID) return fmin(fmax(v / 6.0 + 0.5, 0.0), 1.0);
  if (act == ACT_HARD_SIGMOID_FIFTH) return fmin(fmax(v / 5.0 + 0.5, 0.0), 1.0);
  return v;
}

/* The Z_p map of a fused activation: the stand-alone operator's, written
 * out here (relu, clip's [0, 6] ...) and run through its row, applied to
 * t in place. */
static void act_modp(int act, Tensor *t) {
  static const struct {
    OpKind kind;
    double min, max; /* clip's bounds */
  } as_op[ACT__COUNT] = {
    [ACT_RELU] = {OP_RELU, 0, 0},   [ACT_SIGMOID] = {OP_SIGMOID, 0, 0},
    [ACT_TANH] = {OP_TANH, 0, 0},   [ACT_SILU] = {OP_SILU, 0, 0},
    [ACT_HARD_SWISH] = {OP_HARD_SWISH, 0, 0}, [ACT_RELU6] = {OP_CLIP, 0, 6},
    [ACT_HARD_SIGMOID] = {OP_HARD_SIGMOID, 0, 0},
    [ACT_HARD_SIGMOID_FIFTH] = {OP_HARD_SIGMOID, 0, 0},
  };
  if (act == ACT_NONE) return;
  Op o;
  op_init(&o, as_op[act].kind, 1);
  if (as_op[act].kind == OP_CLIP) {
    op_float(&o, "min", as_op[act].min);
    op_float(&o, "max", as_op[act].max);
  } else if (as_op[act].kind == OP_HARD_SIGMOID) { /* PyTorch's, or ONNX's default */
    op_float(&o, "alpha", act == ACT_HARD_SIGMOID ? (double)(1.0f / 6.0f) : (double)0.2f);
    op_float(&o, "beta", 0.5);
  }
  Diag d;
  diag_init(&d);
  Tensor *y = op_run(&o, &t, true, &d);
  CHECK_MSG(y, "activation %s in Z_p: %s", act_symbols[act], diag_last(&d));
  if (y) memcpy(t->data, y->data, tensor_bytes(t));
  tensor_unref(y);
  diag_fini(&d);
}

static bool standins_ready(void) {
  return op_def(OP_RELU)->modp_standin && op_def(OP_SIGMOID)->modp_standin &&
         op_def(OP_TANH)->modp_standin;
}

/* ---- conv2d ---- */

typedef struct ConvCase {
  int n, c, h, w, m, kh, kw;
  int sh, sw, pt, pl, pb, pr, dh, dw, groups, bias, act;
  int res; /* a residual Z, the output's shape (with a bias) */
} ConvCase;

static const ConvCase conv_cases[] = {
  /* n c  h  w  m kh kw sh sw pt pl pb pr dh dw  g  b  act       res */
  {1, 3, 7, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, ACT_NONE, 0},    /* plain 3x3 same */
  {2, 4, 9, 8, 6, 3, 3, 2, 2, 1, 0, 1, 2, 1, 1, 1, 1, ACT_RELU, 0},    /* stride 2, odd pads */
  {1, 4, 10, 10, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, ACT_NONE, 0},  /* depthwise */
  {3, 6, 11, 9, 6, 5, 3, 2, 2, 2, 1, 2, 1, 2, 2, 6, 1, ACT_RELU, 0},   /* depthwise s2 dilated */
  {2, 5, 12, 7, 5, 3, 3, 1, 2, 0, 1, 0, 1, 1, 1, 5, 0, ACT_TANH, 0},   /* depthwise mixed stride */
  {2, 16, 5, 7, 8, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_RELU, 0},   /* 1x1 without im2col */
  {1, 8, 9, 9, 4, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 1, ACT_NONE, 0},    /* 1x1 stride 2 */
  {1, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 0, ACT_NONE, 0},    /* resnext-style groups */
  {2, 12, 8, 8, 12, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 3, 1, ACT_SIGMOID, 0}, /* groups 3, stride 2 */
  {1, 4, 9, 6, 6, 3, 1, 1, 1, 2, 0, 2, 0, 2, 1, 2, 1, ACT_NONE, 0},    /* 3x1 dilated, groups 2 */
  {1, 3, 5, 13, 2, 5, 3, 1, 3, 2, 1, 2, 1, 1, 1, 1, 1, ACT_NONE, 0},   /* odd sizes */
  {2, 3, 4, 5, 7, 4, 5, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_RELU, 0},    /* kernel = input: 1x1 out */
  {1, 4, 7, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 0, ACT_NONE, 0},    /* depth multiplier 2 */
  {1, 2, 6, 6, 3, 2, 2, 3, 3, 0, 0, 2, 2, 1, 1, 1, 1, ACT_NONE, 0},    /* stride > kernel */
  {1, 3, 8, 8, 5, 3, 3, 1, 1, 0, 0, 0, 0, 3, 3, 1, 0, ACT_TANH, 0},    /* dilation 3 */
  {4, 32, 14, 14, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 32, 1, ACT_RELU, 0}, /* mobilenet-like */
  {1, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 32, 0, ACT_NONE, 0}, /* resnext 32x2 */
  {1, 16, 32, 32, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, ACT_RELU, 0}, /* groups in pixel blocks */
  {2, 3, 13, 17, 3, 3, 5, 3, 3, 0, 2, 2, 1, 1, 2, 3, 1, ACT_RELU, 0},  /* depthwise stride 3 */
  {1, 2, 5, 40, 2, 1, 7, 1, 1, 0, 3, 0, 3, 1, 1, 2, 0, ACT_NONE, 0},   /* depthwise 1x7, wide */
  {1, 3, 9, 41, 3, 3, 3, 1, 2, 1, 1, 1, 1, 1, 1, 3, 1, ACT_RELU, 0},   /* depthwise s2, wide */
  {1, 2, 6, 6, 2, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 2, 1, ACT_SIGMOID, 0}, /* depthwise, no pads */
  /* n c  h  w  m kh kw sh sw pt pl pb pr dh dw  g  b  act       res */
  {2, 6, 7, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_RELU, 1},  /* residual (ResNet) */
  {1, 16, 5, 5, 32, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_RELU, 1}, /* residual, 1x1 */
  {1, 8, 9, 9, 8, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 2, 1, ACT_NONE, 1},  /* residual, groups */
  {2, 4, 6, 8, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, ACT_TANH, 1},  /* residual, depthwise */
  /* the mobile networks' activations */
  {1, 8, 7, 7, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 8, 1, ACT_SILU, 0},       /* EfficientNet dw */
  {2, 6, 5, 5, 12, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_SILU, 0},      /* 1x1 expand */
  {1, 4, 9, 9, 4, 5, 5, 2, 2, 2, 2, 2, 2, 1, 1, 4, 1, ACT_HARD_SWISH, 0}, /* MobileNetV3 dw */
  {1, 5, 6, 6, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, ACT_HARD_SWISH, 0}, /* no bias */
  {1, 6, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 1, ACT_RELU6, 0},      /* MobileNetV2 dw */
  {2, 8, 4, 4, 8, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_RELU6, 1},      /* residual, 1x1 */
  {1, 6, 6, 6, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 3, 1, ACT_SILU, 1},       /* residual, groups */
  {1, 8, 1, 1, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_HARD_SIGMOID, 0}, /* an SE gate */
  /* pads uneven on one side only: the GPU copies the extra into scratch */
  {1, 3, 8, 9, 4, 3, 3, 1, 1, 2, 0, 0, 1, 1, 1, 1, 1, ACT_RELU, 0},      /* extra on top */
  {2, 2, 7, 6, 3, 3, 2, 2, 1, 0, 3, 1, 0, 1, 1, 1, 0, ACT_NONE, 0},      /* extra on the left */
  /* 3x3 stride 1 (Winograd's tiles): odd outputs, one-sided pads, no pads */
  {2, 16, 9, 11, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_RELU, 0},   /* odd, 2 images */
  {1, 12, 8, 7, 8, 3, 3, 1, 1, 0, 2, 1, 0, 1, 1, 1, 1, ACT_NONE, 1},     /* uneven pads, res */
  {1, 8, 6, 5, 16, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, ACT_NONE, 0},     /* no pads: 4x3 out */
  {1, 8, 5, 6, 8, 3, 3, 1, 1, 2, 0, 2, 0, 1, 1, 1, 1, ACT_RELU, 0},      /* pads 2 rows, 0 cols */
  {1, 256, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, ACT_NONE, 0}, /* a long sum (K 2304) */
  {1, 256, 7, 7, 24, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_SIGMOID, 1}, /* 1x1, K 256, res */
  {2, 6, 13, 11, 5, 3, 3, 1, 1, 2, 1, 3, 2, 2, 3, 1, 1, ACT_RELU, 1},    /* dilated (2 3), res */
  {1, 4, 9, 10, 3, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1, 0, ACT_NONE, 0},     /* CSRNet's dilation 2 */
  /* grouped, past one block's tile or one chunk of channels (the tiled way) */
  {1, 4, 40, 37, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, ACT_RELU, 0},    /* 32x8 tiles, edges */
  {1, 256, 7, 7, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, ACT_NONE, 1},   /* 2 chunks, 5+3 oc */
  {2, 3, 45, 50, 6, 5, 3, 2, 1, 2, 1, 3, 2, 2, 1, 3, 1, ACT_TANH, 0},    /* s2 dilated, tiles */
  {1, 512, 5, 5, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, ACT_RELU, 0},    /* 2304 taps a group */
  {3, 4, 6, 7, 5, 3, 3, 1, 1, 1, 0, 1, 2, 1, 1, 1, 1, ACT_RELU, 1},  /* 3 images: passes of 2, 1 */
  /* Paddle's gate (last: the cases before keep their seeds); one input
   * channel keeps 0.2 s + 0.5 off the clamp's zero, where float32's
   * rounding is a large relative error */
  {1, 1, 3, 3, 9, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_HARD_SIGMOID_FIFTH, 0},
};

static int conv_n_in(const ConvCase *k) { return k->res ? 4 : k->bias ? 3 : 2; }

static int conv_out_h(const ConvCase *k) {
  return (k->h + k->pt + k->pb - k->dh * (k->kh - 1) - 1) / k->sh + 1;
}
static int conv_out_w(const ConvCase *k) {
  return (k->w + k->pl + k->pr - k->dw * (k->kw - 1) - 1) / k->sw + 1;
}

static void conv_setup(Op *o, const ConvCase *k) {
  op_init(o, OP_CONV2D, conv_n_in(k));
  op_ints(o, "stride", (int64_t[]){k->sh, k->sw}, 2);
  op_ints(o, "pads", (int64_t[]){k->pt, k->pl, k->pb, k->pr}, 4);
  op_ints(o, "dilation", (int64_t[]){k->dh, k->dw}, 2);
  op_int(o, "groups", k->groups);
  op_int(o, "act", k->act);
}

/* The taps of output (n, m, oy, ox) of case k that fall inside the input:
 * where each reads x and w (flat indices; up to c/groups * kh * kw of
 * them). The naive definition, shared by the float and Z_p references. */
static int conv_taps(const ConvCase *k, int n, int m, int oy, int ox, int *xi, int *wi) {
  int cg = k->c / k->groups, mg = k->m / k->groups, t = 0;
  for (int ci = 0; ci < cg; ci++)
    for (int i = 0; i < k->kh; i++)
      for (int j = 0; j < k->kw; j++) {
        int iy = oy * k->sh - k->pt + i * k->dh, ix = ox * k->sw - k->pl + j * k->dw;
        if (iy < 0 || iy >= k->h || ix < 0 || ix >= k->w) continue;
        int c = (m / mg) * cg + ci;
        xi[t] = ((n * k->c + c) * k->h + iy) * k->w + ix;
        wi[t++] = ((m * cg + ci) * k->kh + i) * k->kw + j;
      }
  return t;
}

/* The naive definition, in double. */
static Tensor *conv_ref(const ConvCase *k, Tensor *const *in) {
  int oh = conv_out_h(k), ow = conv_out_w(k);
  Tensor *y = tensor_new(DT_F32, &(Shape){4, {k->n, k->m, oh, ow}});
  const float *x = in[0]->data, *w = in[1]->data, *b = k->bias ? in[2]->data : NULL;
  const float *z = k->res ? in[3]->data : NULL;
  float *out = y->data;
  size_t taps = (size_t)(k->c / k->groups * k->kh * k->kw);
  int *xi = malloc(taps * sizeof *xi), *wi = malloc(taps * sizeof *wi);
  for (int n = 0; n < k->n; n++)
    for (int m = 0; m < k->m; m++)
      for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++) {
          double s = b ? b[m] : 0;
          if (z) s += z[((n * k->m + m) * oh + oy) * ow + ox];
          for (int t = conv_taps(k, n, m, oy, ox, xi, wi) - 1; t >= 0; t--)
            s += (double)x[xi[t]] * w[wi[t]];
          *out++ = (float)act_ref(k->act, s);
        }
  free(xi), free(wi);
  return y;
}

/* Random inputs of case k; small: integers in -3..3, so every sum the
 * kernels form stays exact. */
static void conv_inputs(const ConvCase *k, Tensor **in, bool small, uint64_t seed) {
  Shape s[4] = {shape_of(4, k->n, k->c, k->h, k->w),
                shape_of(4, k->m, k->c / k->groups, k->kh, k->kw), shape_of(1, k->m),
                shape_of(4, k->n, k->m, conv_out_h(k), conv_out_w(k))};
  in[2] = in[3] = NULL;
  for (int i = 0; i < conv_n_in(k); i++)
    in[i] = small ? random_ints(s[i], 3, seed + (uint64_t)i)
                  : random_f32(s[i], seed + (uint64_t)i);
}

static void test_conv_float_vs_reference(void) {
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof conv_cases / sizeof *conv_cases; ci++) {
    const ConvCase *k = &conv_cases[ci];
    Tensor *in[4];
    conv_inputs(k, in, false, 100 + ci);
    Op o;
    conv_setup(&o, k);
    Tensor *y = op_run(&o, in, false, &d), *r = conv_ref(k, in);
    double e = max_rel_err(y, r);
    CHECK_MSG(y && e < 1e-5, "conv case %zu (%dx%dx%dx%d, %s): error %g %s", ci, k->n, k->c, k->h,
              k->w, act_symbols[k->act], e, diag_last(&d));
    tensor_unref(y);
    tensor_unref(r);
    unref_all(in, conv_n_in(k));
  }
  diag_fini(&d);
}

/* The GPU ways' own arithmetic, run on the host by
 * cuda_kernel_on_host, against the naive definition on every case the
 * way takes: the direct kernel ("teq:direct": grouped convs of at most 2048
 * taps per output, dense ones of at most 64; others are refused), the
 * padding copy, unfolding and epilogue around cuBLAS's products and the
 * products' own arguments ("cublas:gemm": 1x1 convs of stride 1 without
 * pads; "cublas:im2col+gemm": other ungrouped convs; whole, or split S
 * where S divides K, the partials then summed), Winograd's transforms
 * ("teq:winograd": ungrouped 3x3 convs of stride 1, any dilation), and the tiled
 * kernel's staging and sums ("teq:tiled": grouped convs). In a build
 * without CUDA there are no kernels to check. */
static void test_conv_gpu_ways_on_host(void) {
  if (!cuda_kernels_built("the GPU ways' host checks")) return;
  enum { DIRECT, GEMM, IM2COL, WINOGRAD, TILED };
  static const struct {
    const char *name;
    int kind, splits;
  } ways[] = {{"teq:direct", DIRECT, 1},
              {"cublas:gemm", GEMM, 1},
              {"cublas:gemm split 2", GEMM, 2},
              {"cublas:gemm split 8", GEMM, 8},
              {"cublas:im2col+gemm", IM2COL, 1},
              {"cublas:im2col+gemm split 2", IM2COL, 2},
              {"cublas:im2col+gemm split 4", IM2COL, 4},
              {"cublas:im2col+gemm split 8", IM2COL, 8},
              {"teq:winograd", WINOGRAD, 1},
              {"teq:tiled", TILED, 1}};
  Diag d;
  diag_init(&d);
  for (size_t wi = 0; wi < sizeof ways / sizeof *ways; wi++) {
    int taken = 0;
    for (size_t ci = 0; ci < sizeof conv_cases / sizeof *conv_cases; ci++) {
      const ConvCase *k = &conv_cases[ci];
      bool dense = k->groups == 1, one_by_one = k->kh == 1 && k->kw == 1;
      int taps = k->c / k->groups * k->kh * k->kw;
      bool pointwise = dense && one_by_one && k->sh == 1 && k->sw == 1 && k->pt == 0 &&
                       k->pl == 0 && k->pb == 0 && k->pr == 0;
      bool takes;
      switch (ways[wi].kind) {
      case DIRECT: takes = taps <= (dense ? 64 : 2048); break;
      case GEMM: takes = pointwise && taps % ways[wi].splits == 0; break;
      case IM2COL: takes = dense && !one_by_one && taps % ways[wi].splits == 0; break;
      case WINOGRAD: takes = dense && k->kh == 3 && k->kw == 3 && k->sh == 1 && k->sw == 1; break;
      default: takes = !dense;
      }
      const char *way = ways[wi].name;
      Tensor *in[4];
      conv_inputs(k, in, false, 700 + ci);
      Op o;
      conv_setup(&o, k);
      Tensor *y = tensor_new(DT_F32, &(Shape){4, {k->n, k->m, conv_out_h(k), conv_out_w(k)}});
      int rc = cuda_kernel_on_host(way, &o.node, in, y, &d);
      CHECK_MSG(rc == (takes ? TEQ_OK : TEQ_ERR_UNSUPPORTED), "conv case %zu: %s %s: %s", ci,
                way, takes ? "refused" : "took it", diag_last(&d));
      if (rc == TEQ_OK) {
        Tensor *r = conv_ref(k, in);
        double e = max_rel_err(y, r);
        /* A float sum of thousands of taps in one order rounds to some 2e-5
         * of the reference by itself (im2col's product as much as
         * Winograd's products): those cases are held to the 1e-4 that GPU
         * and CPU results are. */
        double tol = taps > 1024 ? 1e-4 : 1e-5;
        CHECK_MSG(e < tol, "conv case %zu: %s on the host, error %g", ci, way, e);
        tensor_unref(r);
        taken++;
      }
      tensor_unref(y);
      unref_all(in, conv_n_in(k));
    }
    CHECK_MSG(taken >= 5, "%s took only %d cases", ways[wi].name, taken);
  }
  diag_fini(&d);
}

/* conv2d's fused max pool (pool = k) in the GPU ways' host replays,
 * against the CPU row: Winograd's transform back keeping each 2x2 tile's
 * max (the partial tiles of odd outputs dropped), and every other way
 * (Winograd's too at pool 3 or dilation 2) writing the full output, then
 * pooled apart. Twice per case: on random floats, within the rounding of
 * the sums' order; and on small integers (every sum exact) with NaNs
 * strewn in the residual, where every element must match, NaN for NaN:
 * the order of a window's comparisons decides which NaNs it keeps. */
static void test_conv_pool_ways_on_host(void) {
  if (!cuda_kernels_built("the GPU ways' pooled host checks")) return;
  static const struct {
    const char *way;
    int pool;
    ConvCase k;
  } cases[] = {
    /* n c  h  w  m kh kw sh sw pt pl pb pr dh dw  g  b  act       res */
    {"teq:winograd", 2, {1, 8, 9, 11, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_RELU, 1}},
    {"teq:winograd", 2, {2, 5, 8, 7, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_NONE, 1}},
    {"teq:winograd", 2, {1, 6, 10, 9, 5, 3, 3, 1, 1, 0, 2, 1, 0, 1, 1, 1, 1, ACT_TANH, 0}},
    {"teq:winograd", 2, {1, 32, 14, 14, 16, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_RELU, 0}},
    {"teq:winograd", 3, {1, 4, 11, 10, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_NONE, 1}},
    {"teq:winograd", 2, {1, 4, 9, 10, 3, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1, 1, ACT_NONE, 1}},
    {"cublas:im2col+gemm", 2, {2, 6, 9, 8, 7, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_NONE, 1}},
    {"cublas:im2col+gemm", 2, {1, 4, 13, 12, 5, 3, 3, 2, 2, 0, 1, 2, 1, 1, 1, 1, 1, ACT_RELU, 0}},
    {"cublas:im2col+gemm split 2", 2,
     {1, 4, 7, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_NONE, 1}},
    {"cublas:gemm", 2, {1, 8, 6, 7, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1, ACT_NONE, 1}},
    {"teq:direct", 2, {1, 3, 9, 9, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, ACT_RELU, 1}},
    {"teq:direct", 3, {1, 4, 10, 10, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 4, 1, ACT_NONE, 1}},
    {"teq:tiled", 2, {2, 8, 9, 11, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 1, ACT_NONE, 1}},
  };
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++)
    for (int exact = 0; exact < 2; exact++) {
      const ConvCase *k = &cases[ci].k;
      const char *way = cases[ci].way;
      int pool = cases[ci].pool;
      Tensor *in[4];
      conv_inputs(k, in, exact, 900 + ci);
      if (exact && k->res)
        for (int64_t i = 0; i < tensor_numel(in[3]); i++)
          if ((uint32_t)(i * 2654435761u) >> 30 == 0) ((float *)in[3]->data)[i] = NAN;
      Op o;
      conv_setup(&o, k);
      op_int(&o, "pool", pool);
      Tensor *want = op_run(&o, in, false, &d);
      Tensor *y = tensor_new(
          DT_F32, &(Shape){4, {k->n, k->m, conv_out_h(k) / pool, conv_out_w(k) / pool}});
      int rc = cuda_kernel_on_host(way, &o.node, in, y, &d);
      double e = max_rel_err(y, want);
      CHECK_MSG(want && rc == TEQ_OK && (exact ? e == 0 : e < 1e-5),
                "pooled conv case %zu (pool %d, %s): %s on the host, error %g: %s", ci, pool,
                exact ? "integers, NaNs in z" : "floats", way, e, diag_last(&d));
      tensor_unref(want);
      tensor_unref(y);
      unref_all(in, conv_n_in(k));
    }
  diag_fini(&d);
}

/* Z_p equals float32 on small integers; with a fused act, Z_p applies the
 * act's stand-in to the plain Z_p conv. */
static void test_conv_modp_vs_float(void) {
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof conv_cases / sizeof *conv_cases; ci++) {
    ConvCase k = conv_cases[ci];
    int act = k.act;
    k.act = ACT_NONE;
    Tensor *in[4], *inm[4];
    conv_inputs(&k, in, true, 200 + ci);
    int n_in = conv_n_in(&k);
    for (int i = 0; i < n_in; i++) inm[i] = f32_to_modp(in[i]);
    Op o;
    conv_setup(&o, &k);
    Tensor *yf = op_run(&o, in, false, &d), *ym = op_run(&o, inm, true, &d);
    Tensor *want = yf ? f32_to_modp(yf) : NULL;
    CHECK_MSG(tensors_identical(ym, want), "conv case %zu: Z_p differs from float32", ci);
    if (act != ACT_NONE && standins_ready() && want) {
      k.act = act;
      conv_setup(&o, &k);
      Tensor *ya = op_run(&o, inm, true, &d);
      act_modp(act, want);
      CHECK_MSG(tensors_identical(ya, want), "conv case %zu: fused act in Z_p", ci);
      tensor_unref(ya);
    }
    unref_all((Tensor *[]){yf, ym, want}, 3);
    unref_all(in, n_in);
    unref_all(inm, n_in);
  }
  diag_fini(&d);
}

/* A conv worked by hand: 1x1x3x3 input 1..9, 2x2 kernel of ones, pads 1 on
 * the top-left only, stride 2, bias 10. */
static void test_conv_by_hand(void) {
  Diag d;
  diag_init(&d);
  Tensor *x = tensor_new(DT_F32, &(Shape){4, {1, 1, 3, 3}});
  Tensor *w = tensor_new(DT_F32, &(Shape){4, {1, 1, 2, 2}});
  Tensor *b = tensor_new(DT_F32, &(Shape){1, {1}});
  for (int i = 0; i < 9; i++) ((float *)x->data)[i] = (float)(i + 1);
  for (int i = 0; i < 4; i++) ((float *)w->data)[i] = 1.0f;
  ((float *)b->data)[0] = 10.0f;
  Op o;
  op_init(&o, OP_CONV2D, 3);
  op_ints(&o, "pads", (int64_t[]){1, 1, 0, 0}, 4);
  op_ints(&o, "stride", (int64_t[]){2, 2}, 2);
  Tensor *y = op_run(&o, (Tensor *[]){x, w, b}, false, &d);
  /* Windows start at (-1,-1), (-1,1), (1,-1), (1,1) of the input. */
  const float want[4] = {10 + 1, 10 + 2 + 3, 10 + 4 + 7, 10 + 5 + 6 + 8 + 9};
  Shape ws = shape_of(4, 1, 1, 2, 2);
  CHECK(y && shape_equal(&y->shape, &ws));
  for (int i = 0; y && i < 4; i++) CHECK_NEAR(((float *)y->data)[i], want[i], 0);
  unref_all((Tensor *[]){x, w, b, y}, 4);
  diag_fini(&d);
}

/* ---- conv3d ---- */

typedef struct Conv3dCase {
  int64_t x[5], w[5]; /* [N, C, D, H, W], [M, C/groups, kd, kh, kw] */
  int64_t stride[3], pads[6], dilation[3], groups;
  bool bias, residual; /* a residual brings a bias */
  int act;
} Conv3dCase;

/* Odd extents; strides, uneven pads, dilation and groups alone and
 * together; two blocks of output positions, the first ending inside an
 * output row (the unfolded block is capped at 64 MB: 1,728 taps leave
 * room for 9,664 of the last case's 12,800 positions). */
static const Conv3dCase conv3d_cases[] = {
  {{1, 3, 4, 5, 6}, {2, 3, 3, 3, 3}, {1, 1, 1}, {0}, {1, 1, 1}, 1, true, false, ACT_NONE},
  {{2, 4, 5, 7, 6}, {6, 2, 3, 2, 3}, {2, 1, 2}, {1, 0, 2, 0, 1, 1}, {1, 2, 1}, 2, true, true,
   ACT_RELU},
  {{1, 3, 3, 9, 8}, {4, 3, 1, 3, 3}, {1, 2, 2}, {0, 1, 1, 0, 1, 1}, {1, 1, 1}, 1, false, false,
   ACT_SIGMOID},
  {{1, 6, 4, 4, 4}, {6, 1, 3, 3, 3}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, {2, 1, 1}, 6, true, true,
   ACT_NONE},
  {{1, 64, 8, 40, 40}, {2, 64, 3, 3, 3}, {1, 1, 1}, {1, 1, 1, 1, 1, 1}, {1, 1, 1}, 1, false, false,
   ACT_NONE},
};

static int conv3d_n_in(const Conv3dCase *k) { return k->residual ? 4 : k->bias ? 3 : 2; }

static void conv3d_setup(Op *o, const Conv3dCase *k) {
  op_init(o, OP_CONV3D, conv3d_n_in(k));
  op_int(o, "act", k->act);
  op_ints(o, "stride", k->stride, 3);
  op_ints(o, "pads", k->pads, 6);
  op_ints(o, "dilation", k->dilation, 3);
  op_int(o, "groups", k->groups);
}

/* The definition, in double: every output sums its group's taps that
 * fall inside the input, then the bias and residual, then the act. */
static Tensor *conv3d_ref(const Conv3dCase *k, Tensor *const *in) {
  int64_t od[3];
  for (int a = 0; a < 3; a++)
    od[a] = (k->x[2 + a] + k->pads[a] + k->pads[3 + a] - k->dilation[a] * (k->w[2 + a] - 1) - 1) /
                k->stride[a] + 1;
  Tensor *y = tensor_new(DT_F32, &(Shape){5, {k->x[0], k->w[0], od[0], od[1], od[2]}});
  const float *x = in[0]->data, *w = in[1]->data;
  int64_t cg = k->x[1] / k->groups, mg = k->w[0] / k->groups, i = 0;
  for (int64_t b = 0; b < k->x[0]; b++)
    for (int64_t m = 0; m < k->w[0]; m++)
      for (int64_t z = 0; z < od[0]; z++)
        for (int64_t r = 0; r < od[1]; r++)
          for (int64_t q = 0; q < od[2]; q++, i++) {
            double acc = k->bias ? ((const float *)in[2]->data)[m] : 0;
            for (int64_t c = 0; c < cg; c++)
              for (int64_t t0 = 0; t0 < k->w[2]; t0++)
                for (int64_t t1 = 0; t1 < k->w[3]; t1++)
                  for (int64_t t2 = 0; t2 < k->w[4]; t2++) {
                    int64_t iz = z * k->stride[0] - k->pads[0] + t0 * k->dilation[0];
                    int64_t iy = r * k->stride[1] - k->pads[1] + t1 * k->dilation[1];
                    int64_t ix = q * k->stride[2] - k->pads[2] + t2 * k->dilation[2];
                    if (iz < 0 || iz >= k->x[2] || iy < 0 || iy >= k->x[3] || ix < 0 ||
                        ix >= k->x[4])
                      continue;
                    int64_t ci = m / mg * cg + c;
                    acc += (double)x[(((b * k->x[1] + ci) * k->x[2] + iz) * k->x[3] + iy) *
                                         k->x[4] + ix] *
                           w[(((m * cg + c) * k->w[2] + t0) * k->w[3] + t1) * k->w[4] + t2];
                  }
            if (k->residual) acc += ((const float *)in[3]->data)[i];
            ((float *)y->data)[i] = (float)act_ref(k->act, acc);
          }
  return y;
}

/* conv3d in float32 against the definition, and without its act in Z_p
 * against float32 on small integers (exact in both). */
static void test_conv3d(void) {
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof conv3d_cases / sizeof *conv3d_cases; ci++) {
    const Conv3dCase *k = &conv3d_cases[ci];
    int64_t od[3];
    for (int a = 0; a < 3; a++)
      od[a] = (k->x[2 + a] + k->pads[a] + k->pads[3 + a] - k->dilation[a] * (k->w[2 + a] - 1) -
               1) / k->stride[a] + 1;
    Shape s[4] = {{5, {k->x[0], k->x[1], k->x[2], k->x[3], k->x[4]}},
                  {5, {k->w[0], k->w[1], k->w[2], k->w[3], k->w[4]}}, {1, {k->w[0]}},
                  {5, {k->x[0], k->w[0], od[0], od[1], od[2]}}};
    int n_in = conv3d_n_in(k);
    Tensor *in[4], *ints[4], *modp[4];
    for (int i = 0; i < n_in; i++) {
      in[i] = random_f32(s[i], 300 + 10 * ci + (uint64_t)i);
      ints[i] = random_ints(s[i], 3, 400 + 10 * ci + (uint64_t)i);
      modp[i] = f32_to_modp(ints[i]);
    }
    Op o;
    conv3d_setup(&o, k);
    Tensor *y = op_run(&o, in, false, &d), *r = conv3d_ref(k, in);
    double e = max_rel_err(y, r);
    /* 1e-4: the last case sums 1,728 products per output in float32 */
    CHECK_MSG(y && e < 1e-4, "conv3d case %zu: error %g %s", ci, e, diag_last(&d));
    Conv3dCase bare = *k;
    bare.act = ACT_NONE;
    conv3d_setup(&o, &bare);
    Tensor *yi = op_run(&o, ints, false, &d), *ym = op_run(&o, modp, true, &d);
    Tensor *want = yi ? f32_to_modp(yi) : NULL;
    CHECK_MSG(tensors_identical(ym, want), "conv3d case %zu: Z_p differs from float32", ci);
    unref_all((Tensor *[]){y, r, yi, ym, want}, 5);
    unref_all(in, n_in);
    unref_all(ints, n_in);
    unref_all(modp, n_in);
  }
  Op o;
  conv3d_setup(&o, &conv3d_cases[0]);
  op_check_error(&o, (Shape[]){{4, {1, 3, 5, 6}}, {5, {2, 3, 3, 3, 3}}, {1, {2}}},
                 "expected [N, C, D, H, W]");
  op_check_error(&o, (Shape[]){{5, {1, 3, 2, 5, 6}}, {5, {2, 3, 3, 3, 3}}, {1, {2}}},
                 "larger than the padded input");
  op_check_error(&o, (Shape[]){{5, {1, 4, 4, 5, 6}}, {5, {2, 3, 3, 3, 3}}, {1, {2}}},
                 "input channels per group");
  diag_fini(&d);
}

/* conv2d(x, const_iconv, same pads) == x, in float32 and Z_p. */
static void test_iconv_identity(void) {
  Diag d;
  diag_init(&d);
  static const int sizes[][2] = {{1, 1}, {3, 3}, {5, 3}, {1, 7}};
  for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
    int kh = sizes[s][0], kw = sizes[s][1];
    Op k;
    op_init(&k, OP_CONST_ICONV, 0);
    op_int(&k, "channels", 5);
    op_int(&k, "kh", kh);
    op_int(&k, "kw", kw);
    Op o;
    op_init(&o, OP_CONV2D, 2);
    op_ints(&o, "pads", (int64_t[]){kh / 2, kw / 2, kh / 2, kw / 2}, 4);
    for (int modp = 0; modp < 2; modp++) {
      Tensor *xf = random_ints(shape_of(4, 2, 5, 6, 7), 3, 300 + s);
      Tensor *x = modp ? f32_to_modp(xf) : tensor_ref(xf);
      Tensor *w = op_run(&k, NULL, modp, &d);
      Tensor *y = op_run(&o, (Tensor *[]){x, w}, modp, &d);
      CHECK_MSG(y && shape_equal(&y->shape, &x->shape) &&
                memcmp(y->data, x->data, tensor_bytes(x)) == 0,
                "iconv %dx%d mode %d: %s", kh, kw, modp, diag_last(&d));
      unref_all((Tensor *[]){xf, x, w, y}, 4);
    }
  }
  diag_fini(&d);
}

/* conv2d(x, enlarge(w 1x1 -> 3x3), pads 1) == conv2d(x, w), both modes. */
static void test_enlarge_identity(void) {
  Diag d;
  diag_init(&d);
  for (int modp = 0; modp < 2; modp++) {
    Tensor *xf = random_ints(shape_of(4, 2, 6, 5, 7), 3, 400),
           *wf = random_ints(shape_of(4, 4, 6, 1, 1), 3, 401);
    Tensor *x = modp ? f32_to_modp(xf) : tensor_ref(xf),
           *w = modp ? f32_to_modp(wf) : tensor_ref(wf);
    Op e, plain, big;
    op_init(&e, OP_ENLARGE, 1);
    op_int(&e, "kh", 3);
    op_int(&e, "kw", 3);
    op_init(&plain, OP_CONV2D, 2);
    op_init(&big, OP_CONV2D, 2);
    op_ints(&big, "pads", (int64_t[]){1, 1, 1, 1}, 4);
    Tensor *w3 = op_run(&e, &w, modp, &d);
    Shape want = shape_of(4, 4, 6, 3, 3);
    CHECK(w3 && shape_equal(&w3->shape, &want));
    Tensor *y1 = op_run(&plain, (Tensor *[]){x, w}, modp, &d);
    Tensor *y3 = op_run(&big, (Tensor *[]){x, w3}, modp, &d);
    if (modp) CHECK_MSG(tensors_identical(y1, y3), "enlarge in Z_p");
    else CHECK_MSG(max_rel_err(y3, y1) == 0, "enlarge in float32: %g", max_rel_err(y3, y1));
    unref_all((Tensor *[]){xf, wf, x, w, w3, y1, y3}, 7);
  }
  /* 3x1 -> 5x3: the old kernel sits at rows 1..3, column 1. */
  Tensor *w = random_f32(shape_of(4, 1, 1, 3, 1), 402);
  Op e;
  op_init(&e, OP_ENLARGE, 1);
  op_int(&e, "kh", 5);
  op_int(&e, "kw", 3);
  Tensor *y = op_run(&e, &w, false, &d);
  const float *a = w->data, *b = y ? y->data : NULL;
  CHECK(b && b[0] == 0 && b[3 + 1] == a[0] && b[6 + 1] == a[1] && b[9 + 1] == a[2] &&
        b[9] == 0 && b[12 + 1] == 0);
  unref_all((Tensor *[]){w, y}, 2);
  diag_fini(&d);
}

/* ---- matmul ---- */

typedef struct MatmulCase {
  Shape a, b;
  int act;
} MatmulCase;

/* Naive ONNX MatMul: promote 1-D operands, broadcast batch dims. */
static Tensor *matmul_ref(const Tensor *ta, const Tensor *tb, const Shape *out, int act) {
  Shape a = ta->shape, b = tb->shape;
  bool a1 = a.ndim == 1, b1 = b.ndim == 1;
  if (a1) a = shape_of(2, 1, (int)a.d[0]);
  if (b1) b = shape_of(2, (int)b.d[0], 1);
  int64_t m = a.d[a.ndim - 2], k = a.d[a.ndim - 1], n = b.d[b.ndim - 1];
  int nb = (a.ndim > b.ndim ? a.ndim : b.ndim) - 2;
  int64_t count = 1, bd[TEQ_MAX_DIMS];
  for (int i = 0; i < nb; i++) {
    int ia = i - (nb - (a.ndim - 2)), ib = i - (nb - (b.ndim - 2));
    int64_t da = ia >= 0 ? a.d[ia] : 1, db = ib >= 0 ? b.d[ib] : 1;
    bd[i] = da > db ? da : db;
    count *= bd[i];
  }
  Tensor *y = tensor_new(DT_F32, out);
  const float *pa = ta->data, *pb = tb->data;
  float *py = y->data;
  for (int64_t t = 0; t < count; t++) {
    int64_t oa = 0, ob = 0, sa = 1, sb = 1, rest = t;
    for (int i = nb - 1; i >= 0; i--) {
      int64_t j = rest % bd[i];
      rest /= bd[i];
      int ia = i - (nb - (a.ndim - 2)), ib = i - (nb - (b.ndim - 2));
      if (ia >= 0) oa += (a.d[ia] == 1 ? 0 : j) * sa, sa *= a.d[ia];
      if (ib >= 0) ob += (b.d[ib] == 1 ? 0 : j) * sb, sb *= b.d[ib];
    }
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) {
        double s = 0;
        for (int64_t q = 0; q < k; q++)
          s += (double)pa[oa * m * k + i * k + q] * pb[ob * k * n + q * n + j];
        *py++ = (float)act_ref(act, s);
      }
  }
  return y;
}

static void test_matmul(void) {
  const MatmulCase cases[] = {
    {shape_of(2, 3, 4), shape_of(2, 4, 5), ACT_NONE},
    {shape_of(1, 4), shape_of(2, 4, 5), ACT_NONE},        /* [5] */
    {shape_of(2, 3, 4), shape_of(1, 4), ACT_RELU},        /* [3] */
    {shape_of(1, 6), shape_of(1, 6), ACT_NONE},           /* [] */
    {shape_of(3, 2, 3, 4), shape_of(2, 4, 5), ACT_NONE},  /* one tall GEMM */
    {shape_of(3, 2, 3, 4), shape_of(3, 1, 4, 5), ACT_SIGMOID},
    {shape_of(4, 2, 1, 3, 4), shape_of(3, 5, 4, 6), ACT_NONE}, /* [2, 5, 3, 6] */
    {shape_of(2, 3, 4), shape_of(3, 2, 4, 5), ACT_TANH},  /* A broadcast */
    {shape_of(3, 1, 3, 4), shape_of(3, 2, 4, 5), ACT_NONE},
    {shape_of(1, 5), shape_of(3, 2, 5, 3), ACT_RELU},     /* [2, 3] */
    {shape_of(3, 2, 3, 5), shape_of(1, 5), ACT_NONE},     /* [2, 3] */
    {shape_of(2, 1, 7), shape_of(2, 7, 1), ACT_NONE},
    {shape_of(2, 33, 65), shape_of(2, 65, 17), ACT_RELU},
    {shape_of(2, 3, 4), shape_of(2, 4, 5), ACT_SILU},
    {shape_of(1, 6), shape_of(3, 2, 6, 3), ACT_HARD_SWISH}, /* [2, 3] */
    {shape_of(3, 2, 3, 4), shape_of(2, 4, 5), ACT_RELU6},
  };
  Diag d;
  diag_init(&d);
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    Op o;
    op_init(&o, OP_MATMUL, 2);
    op_int(&o, "act", cases[c].act);
    Tensor *in[2] = {random_f32(cases[c].a, 500 + c), random_f32(cases[c].b, 600 + c)};
    Tensor *y = op_run(&o, in, false, &d);
    Tensor *r = y ? matmul_ref(in[0], in[1], &y->shape, cases[c].act) : NULL;
    CHECK_MSG(y && max_rel_err(y, r) < 1e-5, "matmul case %zu: %s", c, diag_last(&d));
    unref_all((Tensor *[]){y, r}, 2);
    unref_all(in, 2);
    /* Z_p against float32 on small integers, without the act. */
    op_int(&o, "act", ACT_NONE);
    Tensor *si[2] = {random_ints(cases[c].a, 3, 700 + c), random_ints(cases[c].b, 3, 800 + c)};
    CHECK_MSG(op_modp_agrees(&o, si, 2, &d), "matmul case %zu in Z_p", c);
    unref_all(si, 2);
  }
  Op o;
  op_init(&o, OP_MATMUL, 2);
  Tensor *in[2] = {random_f32(shape_of(3, 2, 3, 4), 900), random_f32(shape_of(2, 4, 5), 901)};
  Tensor *y = op_run(&o, in, false, &d);
  Shape want = shape_of(3, 2, 3, 5);
  CHECK(y && shape_equal(&y->shape, &want));
  unref_all((Tensor *[]){y, in[0], in[1]}, 3);
  diag_fini(&d);
}

/* Residues over all of Z_p (near p - 1, where every fold matters), with
 * rows of zeros, against 128-bit arithmetic: matmul tall and batched, and
 * gemm with every transpose, at widths across the kernel's column bands
 * and heights across its row blocks. */
static Tensor *random_residues(Shape s, uint64_t seed) {
  Tensor *t = tensor_new(DT_MODP, &s);
  uint32_t *q = t->data;
  for (int64_t i = 0; i < tensor_numel(t); i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(seed >> 33) % MODP_P;
    q[i] = i % 7 == 3 ? 0 : i % 5 == 1 ? MODP_P - 1 - r % 4 : r;
  }
  return t;
}

static uint32_t product_ref(const Tensor *a, const Tensor *b, int64_t i, int64_t j, int64_t k,
                            bool ta, bool tb, int64_t m, int64_t n) {
  const uint32_t *pa = a->data, *pb = b->data;
  unsigned __int128 acc = 0;
  for (int64_t t = 0; t < k; t++)
    acc += (unsigned __int128)pa[ta ? t * m + i : i * k + t] * pb[tb ? j * k + t : t * n + j];
  return (uint32_t)(acc % MODP_P);
}

static void test_products_modp_full_range(void) {
  Diag d;
  diag_init(&d);
  /* [1100, 40] x [40, 3] and [600, 17] x [17, 1] with A transposed sum
   * blocks of C's rows at once, a last block short. */
  const int64_t dims[][3] = {{3, 300, 37}, {1, 517, 64},  {5, 1, 29},
                             {2, 257, 1},  {1100, 3, 40}, {600, 1, 17}};
  for (size_t c = 0; c < sizeof dims / sizeof *dims; c++) {
    const int64_t m = dims[c][0], n = dims[c][1], k = dims[c][2];
    for (int form = 0; form < 5; form++) { /* matmul, then gemm with ta, tb from form - 1 */
      bool gemm = form > 0, ta = gemm && (form - 1) & 1, tb = gemm && (form - 1) & 2;
      Op o;
      op_init(&o, gemm ? OP_GEMM : OP_MATMUL, 2);
      if (gemm) op_int(&o, "transA", ta), op_int(&o, "transB", tb);
      Tensor *in[2] = {random_residues(ta ? shape_of(2, k, m) : shape_of(2, m, k), 40 + c),
                       random_residues(tb ? shape_of(2, n, k) : shape_of(2, k, n), 50 + c)};
      Tensor *y = op_run(&o, in, true, &d);
      int64_t wrong = y ? 0 : -1;
      for (int64_t i = 0; y && i < m; i++)
        for (int64_t j = 0; j < n; j++)
          wrong += elem_modp(y, i * n + j) != product_ref(in[0], in[1], i, j, k, ta, tb, m, n);
      CHECK_MSG(wrong == 0, "[%lld,%lld]x[%lld,%lld] %s ta=%d tb=%d in Z_p: %lld wrong (%s)",
                (long long)m, (long long)k, (long long)k, (long long)n, gemm ? "gemm" : "matmul",
                ta, tb, (long long)wrong, y ? "" : diag_last(&d));
      unref_all((Tensor *[]){y, in[0], in[1]}, 3);
    }
  }
  /* Batched: each of 3 entries its own product. */
  Op o;
  op_init(&o, OP_MATMUL, 2);
  Tensor *in[2] = {random_residues(shape_of(3, 3, 4, 33), 60),
                   random_residues(shape_of(3, 3, 33, 270), 61)};
  Tensor *y = op_run(&o, in, true, &d);
  int64_t wrong = y ? 0 : -1;
  for (int64_t e = 0; y && e < 3; e++) {
    Tensor *a = tensor_new(DT_MODP, &(Shape){2, {4, 33}}),
           *b = tensor_new(DT_MODP, &(Shape){2, {33, 270}});
    memcpy(a->data, (uint32_t *)in[0]->data + e * 4 * 33, 4 * 33 * sizeof(uint32_t));
    memcpy(b->data, (uint32_t *)in[1]->data + e * 33 * 270, 33 * 270 * sizeof(uint32_t));
    for (int64_t i = 0; i < 4; i++)
      for (int64_t j = 0; j < 270; j++)
        wrong += elem_modp(y, e * 4 * 270 + i * 270 + j) !=
                 product_ref(a, b, i, j, 33, false, false, 4, 270);
    unref_all((Tensor *[]){a, b}, 2);
  }
  CHECK_MSG(wrong == 0, "batched matmul in Z_p: %lld wrong", (long long)wrong);
  unref_all((Tensor *[]){y, in[0], in[1]}, 3);
  diag_fini(&d);
}

/* conv2d in Z_p (im2col and the same product) on residues over all of
 * Z_p, every case of conv_cases without its activation, against the
 * definition in 128-bit arithmetic. */
static uint32_t conv_ref_modp(const ConvCase *k, Tensor *const *in, int n, int m, int oy, int ox,
                              int *xi, int *wi) {
  const uint32_t *x = in[0]->data, *w = in[1]->data;
  unsigned __int128 s = k->bias ? ((const uint32_t *)in[2]->data)[m] : 0;
  if (k->res)
    s += ((const uint32_t *)in[3]->data)[((n * k->m + m) * conv_out_h(k) + oy) * conv_out_w(k) + ox];
  for (int t = conv_taps(k, n, m, oy, ox, xi, wi) - 1; t >= 0; t--)
    s += (unsigned __int128)x[xi[t]] * w[wi[t]];
  return (uint32_t)(s % MODP_P);
}

static void test_conv_modp_full_range(void) {
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof conv_cases / sizeof *conv_cases; ci++) {
    ConvCase k = conv_cases[ci];
    k.act = ACT_NONE;
    Tensor *in[4] = {random_residues(shape_of(4, k.n, k.c, k.h, k.w), 70 + ci),
                     random_residues(shape_of(4, k.m, k.c / k.groups, k.kh, k.kw), 80 + ci),
                     k.bias ? random_residues(shape_of(1, k.m), 90 + ci) : NULL,
                     k.res ? random_residues(shape_of(4, k.n, k.m, conv_out_h(&k),
                                                     conv_out_w(&k)), 95 + ci)
                           : NULL};
    Op o;
    conv_setup(&o, &k);
    Tensor *y = op_run(&o, in, true, &d);
    int64_t wrong = y ? 0 : -1, e = 0;
    size_t taps = (size_t)(k.c / k.groups * k.kh * k.kw);
    int *xi = malloc(taps * sizeof *xi), *wi = malloc(taps * sizeof *wi);
    for (int n = 0; y && n < k.n; n++)
      for (int m = 0; m < k.m; m++)
        for (int oy = 0; oy < y->shape.d[2]; oy++)
          for (int ox = 0; ox < y->shape.d[3]; ox++)
            wrong += elem_modp(y, e++) != conv_ref_modp(&k, in, n, m, oy, ox, xi, wi);
    free(xi), free(wi);
    CHECK_MSG(wrong == 0, "conv case %zu in Z_p over all residues: %lld wrong (%s)", ci,
              (long long)wrong, y ? "" : diag_last(&d));
    unref_all((Tensor *[]){y, in[0], in[1], in[2], in[3]}, 5);
  }
  diag_fini(&d);
}

/* matmul(x, const_imm) == x in both modes. */
static void test_imm_identity(void) {
  Diag d;
  diag_init(&d);
  for (int modp = 0; modp < 2; modp++) {
    Op k, o;
    op_init(&k, OP_CONST_IMM, 0);
    op_int(&k, "n", 6);
    op_init(&o, OP_MATMUL, 2);
    Tensor *xf = random_ints(shape_of(3, 2, 5, 6), 3, 1000);
    Tensor *x = modp ? f32_to_modp(xf) : tensor_ref(xf);
    Tensor *i = op_run(&k, NULL, modp, &d);
    Tensor *y = op_run(&o, (Tensor *[]){x, i}, modp, &d);
    CHECK_MSG(y && shape_equal(&y->shape, &x->shape) &&
              memcmp(y->data, x->data, tensor_bytes(x)) == 0, "imm identity, mode %d", modp);
    unref_all((Tensor *[]){xf, x, i, y}, 4);
  }
  diag_fini(&d);
}

/* ---- gemm ---- */

static Tensor *gemm_ref(const Tensor *a, const Tensor *b, const Tensor *c, bool ta, bool tb,
                        double alpha, double beta) {
  int64_t m = a->shape.d[ta ? 1 : 0], k = a->shape.d[ta ? 0 : 1], n = b->shape.d[tb ? 0 : 1];
  Tensor *y = tensor_new(DT_F32, &(Shape){2, {m, n}});
  const float *pa = a->data, *pb = b->data, *pc = c ? c->data : NULL;
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      double s = 0;
      for (int64_t q = 0; q < k; q++)
        s += (double)pa[ta ? q * m + i : i * k + q] * pb[tb ? j * k + q : q * n + j];
      double cv = 0;
      if (pc) {
        const Shape *cs = &c->shape;
        int64_t rows = cs->ndim == 2 ? cs->d[0] : 1, cols = cs->ndim >= 1 ? cs->d[cs->ndim - 1] : 1;
        cv = pc[(rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j)];
      }
      ((float *)y->data)[i * n + j] = (float)(alpha * s + beta * cv);
    }
  return y;
}

/* The gemm cases: [4, 6] by [6, 5] in all four layouts, each with no C
 * and with C of every shape that broadcasts to [4, 5]; alpha and beta
 * varied. Case cnt's operator into *o, its operands' shapes into sa, sb
 * and *sc (NULL: no C). */
enum { GEMM_C_SHAPES = 7, GEMM_CASES = 4 * GEMM_C_SHAPES };
static void gemm_case(int cnt, Op *o, Shape *sa, Shape *sb, Shape *sc, bool *has_c) {
  const Shape c_shapes[GEMM_C_SHAPES] = {{-2, {0}}, shape_of(0), shape_of(1, 1), shape_of(1, 5),
                                         shape_of(2, 1, 5), shape_of(2, 4, 1), shape_of(2, 4, 5)};
  int ta = cnt / (2 * GEMM_C_SHAPES), tb = cnt / GEMM_C_SHAPES % 2;
  *sc = c_shapes[cnt % GEMM_C_SHAPES];
  *has_c = sc->ndim != -2; /* -2: no C input */
  op_init(o, OP_GEMM, *has_c ? 3 : 2);
  op_int(o, "transA", ta);
  op_int(o, "transB", tb);
  op_float(o, "alpha", cnt % 3 ? 2.0 : 1.0);
  op_float(o, "beta", cnt % 2 ? -3.0 : 1.0);
  *sa = ta ? shape_of(2, 6, 4) : shape_of(2, 4, 6);
  *sb = tb ? shape_of(2, 5, 6) : shape_of(2, 6, 5);
}

static void test_gemm(void) {
  Diag d;
  diag_init(&d);
  for (int cnt = 0; cnt < GEMM_CASES; cnt++) {
    Op o;
    Shape sa, sb, sc;
    bool has_c;
    gemm_case(cnt, &o, &sa, &sb, &sc, &has_c);
    const Params *p = &o.node.params;
    int ta = (int)param_int(p, param_index(OP_GEMM, "transA"));
    int tb = (int)param_int(p, param_index(OP_GEMM, "transB")), ci = cnt % GEMM_C_SHAPES;
    double alpha = param_float(p, param_index(OP_GEMM, "alpha"));
    double beta = param_float(p, param_index(OP_GEMM, "beta"));
    Tensor *in[3] = {random_f32(sa, cnt), random_f32(sb, cnt + 50),
                     has_c ? random_f32(sc, cnt + 99) : NULL};
    Tensor *y = op_run(&o, in, false, &d);
    Tensor *r = gemm_ref(in[0], in[1], in[2], ta, tb, alpha, beta);
    CHECK_MSG(max_rel_err(y, r) < 1e-5, "gemm ta=%d tb=%d C#%d: %s", ta, tb, ci,
              diag_last(&d));
    unref_all((Tensor *[]){y, r}, 2);
    unref_all(in, has_c ? 3 : 2);
    Tensor *si[3] = {random_ints(sa, 3, cnt + 7), random_ints(sb, 3, cnt + 8),
                     has_c ? random_ints(sc, 3, cnt + 9) : NULL};
    CHECK_MSG(op_modp_agrees(&o, si, has_c ? 3 : 2, &d), "gemm ta=%d tb=%d C#%d in Z_p", ta, tb,
              ci);
    unref_all(si, has_c ? 3 : 2);
  }
  diag_fini(&d);
}

/* gemm with a residual Z [4, 5] (a transformer's x + (h W + b), folded in
 * by graph_fuse_residuals): act(alpha A' B' + beta C + Z) for every layout
 * and C of test_gemm (Z needs C before it), against the reference in
 * float32 and exactly in Z_p; on the host through the GPU's plain way
 * (Z + beta C written first, the product added at beta 1); a Z of another
 * shape refused. */
static void test_gemm_residual(void) {
  Diag d;
  diag_init(&d);
  Shape sz = shape_of(2, 4, 5);
  bool host = cuda_kernels_built("the residual gemm's host check");
  for (int cnt = 0; cnt < GEMM_CASES; cnt++) {
    Op o;
    Shape sa, sb, sc;
    bool has_c;
    gemm_case(cnt, &o, &sa, &sb, &sc, &has_c);
    if (!has_c) continue;
    int act = cnt % 3 == 0 ? ACT_NONE : cnt % 3 == 1 ? ACT_RELU : ACT_TANH;
    o.node.n_in = 4; /* the case's gemm, its residual after C */
    op_int(&o, "act", act);
    const Params *p = &o.node.params;
    int ta = (int)param_int(p, param_index(OP_GEMM, "transA"));
    int tb = (int)param_int(p, param_index(OP_GEMM, "transB"));
    double alpha = param_float(p, param_index(OP_GEMM, "alpha"));
    double beta = param_float(p, param_index(OP_GEMM, "beta"));
    Tensor *in[4] = {random_f32(sa, cnt + 500), random_f32(sb, cnt + 550),
                     random_f32(sc, cnt + 599), random_f32(sz, cnt + 650)};
    Tensor *y = op_run(&o, in, false, &d);
    Tensor *r = gemm_ref(in[0], in[1], in[2], ta, tb, alpha, beta);
    float *rv = r->data;
    const float *z = in[3]->data;
    for (int64_t t = 0; t < 20; t++) rv[t] = (float)act_ref(act, (double)rv[t] + z[t]);
    CHECK_MSG(y && max_rel_err(y, r) < 1e-5, "gemm with a residual, case %d act %d: %s", cnt,
              act, diag_last(&d));
    Tensor *h = tensor_new(DT_F32, &sz);
    if (host) {
      int rc = cuda_kernel_on_host("cublas:gemm", &o.node, in, h, &d);
      CHECK_MSG(rc == TEQ_OK && max_rel_err(h, r) < 1e-5,
                "gemm with a residual, case %d, on the host: %s", cnt, diag_last(&d));
    }
    unref_all((Tensor *[]){y, r, h}, 3);
    unref_all(in, 4);
    if (act == ACT_TANH) continue; /* no Z_p stand-in equals tanh's float */
    Tensor *si[4] = {random_ints(sa, 3, cnt + 7), random_ints(sb, 3, cnt + 8),
                     random_ints(sc, 3, cnt + 9), random_ints(sz, 3, cnt + 10)};
    op_int(&o, "act", ACT_NONE);
    CHECK_MSG(op_modp_agrees(&o, si, 4, &d), "gemm with a residual, case %d, in Z_p", cnt);
    unref_all(si, 4);
  }
  /* Z must have the result's shape: a row of it does not broadcast. */
  Op o;
  op_init(&o, OP_GEMM, 4);
  Tensor *bad[4] = {random_f32(shape_of(2, 4, 6), 1), random_f32(shape_of(2, 6, 5), 2),
                    random_f32(shape_of(1, 5), 3), random_f32(shape_of(2, 1, 5), 4)};
  Diag quiet;
  diag_init(&quiet);
  Tensor *y = op_run(&o, bad, false, &quiet);
  CHECK_MSG(!y && strstr(diag_last(&quiet), "residual Z [1, 5]"),
            "a residual of another shape: %s", diag_last(&quiet));
  tensor_unref(y);
  diag_fini(&quiet);
  unref_all(bad, 4);
  diag_fini(&d);
}

/* gemm's plain GPU way run on the host (cuda_kernel_on_host): C broadcast
 * into the output, cuBLAS's product over it from the description the
 * device passes (transposes, alpha, beta), the fused activation; against
 * the CPU row, every C shape and layout of test_gemm, with and without a
 * relu or a tanh. */
static void test_gemm_plain_on_host(void) {
  if (!cuda_kernels_built("gemm's host check")) return;
  Diag d;
  diag_init(&d);
  for (int cnt = 0; cnt < GEMM_CASES; cnt++) {
    Op o;
    Shape sa, sb, sc, sy = shape_of(2, 4, 5);
    bool has_c;
    gemm_case(cnt, &o, &sa, &sb, &sc, &has_c);
    int act = cnt % 3 == 0 ? ACT_NONE : cnt % 3 == 1 ? ACT_RELU : ACT_TANH;
    op_int(&o, "act", act);
    Tensor *in[3] = {random_f32(sa, cnt + 300), random_f32(sb, cnt + 350),
                     has_c ? random_f32(sc, cnt + 399) : NULL};
    Tensor *want = op_run(&o, in, false, &d), *y = tensor_new(DT_F32, &sy);
    int rc = cuda_kernel_on_host("cublas:gemm", &o.node, in, y, &d);
    double e = want ? max_rel_err(y, want) : 1;
    CHECK_MSG(rc == TEQ_OK && e < 1e-5, "gemm case %d, act %d, on the host: error %g %s", cnt,
              act, e, diag_last(&d));
    unref_all((Tensor *[]){want, y}, 2);
    unref_all(in, has_c ? 3 : 2);
  }
  diag_fini(&d);
}

/* ---- batchnorm ---- */

static void test_batchnorm(void) {
  Diag d;
  diag_init(&d);
  Shape sx = shape_of(4, 2, 3, 4, 5), sc = shape_of(1, 3);
  Tensor *in[5] = {random_f32(sx, 1100), random_f32(sc, 1101), random_f32(sc, 1102),
                   random_f32(sc, 1103), random_f32(sc, 1104)};
  float *var = in[4]->data;
  for (int i = 0; i < 3; i++) var[i] = var[i] * var[i] + 0.1f;
  Op o;
  op_init(&o, OP_BATCHNORM, 5);
  op_float(&o, "epsilon", 1e-3);
  Tensor *y = op_run(&o, in, false, &d);
  Tensor *r = tensor_new(DT_F32, &sx);
  const float *x = in[0]->data, *s = in[1]->data, *b = in[2]->data, *mean = in[3]->data;
  for (int64_t i = 0; i < tensor_numel(r); i++) {
    int c = (int)(i / 20 % 3);
    ((float *)r->data)[i] = (float)(s[c] * (x[i] - mean[c]) / sqrt(var[c] + 1e-3) + b[c]);
  }
  CHECK_MSG(max_rel_err(y, r) < 1e-5, "batchnorm float32: %g", max_rel_err(y, r));
  unref_all((Tensor *[]){y, r}, 2);
  /* Z_p: with scale 0 the output is B; in x it is affine with a slope
   * that the epsilon changes. */
  Tensor *m[5];
  for (int i = 0; i < 5; i++) m[i] = f32_to_modp(in[i]);
  Tensor *y1 = op_run(&o, m, true, &d);
  memset(m[1]->data, 0, tensor_bytes(m[1]));
  Tensor *y0 = op_run(&o, m, true, &d);
  bool is_b = y0 != NULL;
  for (int64_t i = 0; y0 && i < tensor_numel(y0); i++)
    is_b = is_b && ((uint32_t *)y0->data)[i] == ((uint32_t *)m[2]->data)[i / 20 % 3];
  CHECK(is_b);
  tensor_unref(m[1]);
  m[1] = f32_to_modp(in[1]);
  op_float(&o, "epsilon", 1e-5);
  Tensor *y2 = op_run(&o, m, true, &d);
  CHECK(y1 && y2 && !tensors_identical(y1, y2));
  CHECK(op_def(OP_BATCHNORM)->modp_standin && (op_def(OP_BATCHNORM)->flags & OPF_NONLINEAR));
  /* A fused relu is the relu of the plain result, in float32 and in Z_p
   * (relu's stand-in, as conv's fused act). */
  Tensor *plain = op_run(&o, in, false, &d);
  op_int(&o, "act", ACT_RELU);
  Tensor *fused = op_run(&o, in, false, &d), *fused_m = op_run(&o, m, true, &d);
  int64_t bad = 0, negative = 0;
  uint32_t (*relu)(uint32_t) = op_def(OP_RELU)->modp_standin;
  for (int64_t i = 0; plain && fused && fused_m && i < tensor_numel(plain); i++) {
    float v = ((float *)plain->data)[i];
    negative += v < 0;
    bad += ((float *)fused->data)[i] != (v > 0 ? v : 0) ||
           ((uint32_t *)fused_m->data)[i] != relu(((uint32_t *)y2->data)[i]);
  }
  CHECK_MSG(plain && fused && fused_m && bad == 0 && negative > 0,
            "batchnorm with relu: %lld wrong of %lld (%lld negative before)", (long long)bad,
            (long long)shape_numel(&sx), (long long)negative);
  unref_all((Tensor *[]){plain, fused, fused_m}, 3);
  /* The mobile networks' activations likewise, each as its stand-alone
   * operator computes it: to the bit in float32, exactly in Z_p. */
  for (int act = ACT_SILU; act < ACT__COUNT; act++) {
    op_int(&o, "act", ACT_NONE);
    Tensor *p = op_run(&o, in, false, &d), *pm = op_run(&o, m, true, &d);
    op_int(&o, "act", act);
    Tensor *f = op_run(&o, in, false, &d), *fm = op_run(&o, m, true, &d);
    Tensor *want = p ? tensor_new(DT_F32, &p->shape) : NULL;
    Params ap;
    act_op_params(act, &ap);
    Tensor *wm = NULL;
    if (want) {
      CHECK(run_op(act_op_kind(act), &ap, &p, 1, false, &wm, &d) == TEQ_OK);
      if (wm) memcpy(want->data, wm->data, tensor_bytes(want));
      tensor_unref(wm);
      wm = NULL;
    }
    if (pm) CHECK(run_op(act_op_kind(act), &ap, &pm, 1, true, &wm, &d) == TEQ_OK);
    CHECK_MSG(tensors_identical(f, want), "batchnorm with %s: float32", act_symbols[act]);
    CHECK_MSG(tensors_identical(fm, wm), "batchnorm with %s: Z_p", act_symbols[act]);
    unref_all((Tensor *[]){p, pm, f, fm, want, wm}, 6);
  }
  unref_all((Tensor *[]){y0, y1, y2}, 3);
  unref_all(in, 5);
  unref_all(m, 5);
  diag_fini(&d);
}

/* ---- constants ---- */

static void test_constants(void) {
  Diag d;
  diag_init(&d);
  Op o;
  op_init(&o, OP_CONST_ONE, 0);
  op_ints(&o, "shape", (int64_t[]){2, 3, 4}, 3);
  Tensor *f = op_run(&o, NULL, false, &d), *m = op_run(&o, NULL, true, &d);
  Shape want = shape_of(3, 2, 3, 4);
  CHECK(f && m && shape_equal(&f->shape, &want));
  bool ones = f && m;
  for (int i = 0; ones && i < 24; i++)
    ones = ((float *)f->data)[i] == 1.0f && ((uint32_t *)m->data)[i] == 1;
  CHECK(ones);
  unref_all((Tensor *[]){f, m}, 2);
  op_init(&o, OP_CONST_POOL, 0);
  op_int(&o, "channels", 3);
  op_int(&o, "kh", 2);
  op_int(&o, "kw", 3);
  f = op_run(&o, NULL, false, &d);
  m = op_run(&o, NULL, true, &d);
  want = shape_of(4, 3, 1, 2, 3);
  CHECK(f && m && shape_equal(&m->shape, &want));
  CHECK(f && ((float *)f->data)[17] == 1.0f / 6);
  CHECK(m && modp_mul(((uint32_t *)m->data)[5], 6) == 1);
  unref_all((Tensor *[]){f, m}, 2);
  diag_fini(&d);
}

/* ---- shape inference errors ---- */

static void test_conv_errors(void) {
  Op o;
  op_init(&o, OP_CONV2D, 2);
  op_int(&o, "groups", 3);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 64, 8, 8), shape_of(4, 6, 21, 3, 3)},
                 "conv2d: groups=3: input channels 64 not divisible by groups");
  op_int(&o, "groups", 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 64, 8, 8), shape_of(4, 5, 32, 3, 3)},
                 "output channels 5");
  op_check_error(&o, (Shape[]){shape_of(4, 1, 64, 8, 8), shape_of(4, 8, 64, 3, 3)},
                 "has 64 input channels per group");
  op_int(&o, "groups", 1);
  op_check_error(&o, (Shape[]){shape_of(3, 1, 4, 8), shape_of(4, 8, 1, 3, 3)},
                 "input X [1, 4, 8]: expected [N, C, H, W]");
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 2, 8), shape_of(4, 8, 4, 3, 3)},
                 "larger than the padded input 2x8");
  op_ints(&o, "dilation", (int64_t[]){1, 4}, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 8, 8), shape_of(4, 8, 4, 3, 3)},
                 "dilation=(1 4)");
  op_init(&o, OP_CONV2D, 3);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 8, 8), shape_of(4, 8, 4, 3, 3), shape_of(1, 4)},
                 "bias B [4]: expected [8]");
  op_ints(&o, "stride", (int64_t[]){0, 1}, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 8, 8), shape_of(4, 8, 4, 3, 3), shape_of(1, 8)},
                 "stride=0");
  op_init(&o, OP_CONV2D, 4); /* the residual must have the output's shape, [1, 8, 6, 6] */
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 8, 8), shape_of(4, 8, 4, 3, 3), shape_of(1, 8),
                               shape_of(4, 1, 8, 8, 8)},
                 "residual Z [1, 8, 8, 8]: expected the output's shape [1, 8, 6, 6]");
  op_init(&o, OP_ENLARGE, 1);
  op_int(&o, "kh", 3);
  op_int(&o, "kw", 3);
  op_check_error(&o, (Shape[]){shape_of(4, 4, 4, 5, 5)}, "enlarge: kh=3 kw=3: smaller");
  op_check_error(&o, (Shape[]){shape_of(4, 4, 4, 2, 2)}, "cannot be centred");
  op_init(&o, OP_CONST_ICONV, 0);
  op_int(&o, "kh", 2);
  op_check_error(&o, NULL, "const_iconv: kh=2 kw=3: the identity kernel needs odd sizes");
  op_init(&o, OP_BATCHNORM, 5);
  Shape c3 = shape_of(1, 3);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 3, 4, 4), c3, c3, shape_of(1, 4), c3},
                 "batchnorm: mean [4]: expected [3]");
}

static void test_matmul_errors(void) {
  Op o;
  op_init(&o, OP_MATMUL, 2);
  op_check_error(&o, (Shape[]){shape_of(2, 3, 4), shape_of(2, 5, 6)},
                 "matmul: A [3, 4] and B [5, 6]: inner dimensions 4 and 5 differ");
  op_check_error(&o, (Shape[]){shape_of(3, 2, 3, 4), shape_of(3, 3, 4, 5)},
                 "batch dimensions do not broadcast (2 vs 3)");
  op_check_error(&o, (Shape[]){shape_of(0), shape_of(2, 4, 5)}, "rank >= 1");
  /* Batch extents of both operands multiply past int64: refused, not wrapped. */
  int64_t t = INT64_C(1) << 36;
  op_check_error(&o, (Shape[]){shape_make(4, (int64_t[]){t, 1, 1, 1}),
                               shape_make(4, (int64_t[]){1, t, 1, 1})},
                 "multiply past 2^63");
  op_check_error(&o, (Shape[]){shape_make(2, (int64_t[]){INT64_C(1) << 40, INT64_C(1) << 40}),
                               shape_make(2, (int64_t[]){INT64_C(1) << 40, 2})},
                 "multiply past 2^63");
  op_init(&o, OP_GEMM, 3);
  op_int(&o, "transA", 1);
  op_check_error(&o, (Shape[]){shape_of(2, 3, 4), shape_of(2, 4, 5), shape_of(1, 5)},
                 "transA=1 transB=0: A [3, 4] and B [4, 5]: inner dimensions 3 and 4 differ");
  op_int(&o, "transA", 0);
  op_check_error(&o, (Shape[]){shape_of(2, 3, 4), shape_of(2, 4, 5), shape_of(2, 5, 3)},
                 "C [5, 3] does not broadcast to the result [3, 5]");
  op_check_error(&o, (Shape[]){shape_of(1, 4), shape_of(2, 4, 5), shape_of(1, 5)},
                 "both operands must be matrices");
  /* Z_p needs integer alpha and beta. */
  Diag d;
  diag_init(&d);
  op_float(&o, "alpha", 0.5);
  Tensor *in[3] = {tensor_new(DT_MODP, &(Shape){2, {3, 4}}), tensor_new(DT_MODP, &(Shape){2, {4, 5}}),
                   tensor_new(DT_MODP, &(Shape){1, {5}})};
  Tensor *y = op_run(&o, in, true, &d);
  CHECK_MSG(!y && strstr(diag_last(&d), "gemm: alpha=0.5 is not an integer: cannot evaluate in Z_p"),
            "%s", diag_last(&d));
  unref_all(in, 3);
  diag_fini(&d);
}

/* ---- through the graph and the executor ---- */

/* relu(conv(x, W) + b) then matmul with a constant, in both modes. */
static void test_through_executor(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(4, 1, 4, 6, 6);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  int w = graph_add_const(g, "w", random_ints(shape_of(4, 8, 2, 3, 3), 3, 1200), &d);
  int b = graph_add_const(g, "b", random_ints(shape_of(1, 8), 3, 1201), &d);
  int k = graph_add_const(g, "k", random_ints(shape_of(2, 6, 5), 3, 1202), &d);
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_int(&p, param_index(OP_CONV2D, "groups"), 2);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  TensorRef cin[3] = {{x, 0}, {w, 0}, {b, 0}};
  int c = graph_add_node(g, OP_CONV2D, cin, 3, 1, &p, "conv", &d);
  TensorRef min[2] = {{c, 0}, {k, 0}};
  int m = graph_add_node(g, OP_MATMUL, min, 2, 1, NULL, "mm", &d);
  graph_add_output(g, (TensorRef){m, 0}, "y", &d);
  CHECK_MSG(d.n_errors == 0 && graph_check(g, &d) == TEQ_OK, "%s", d.text ? d.text : "");
  Tensor *xf = random_ints(sx, 3, 1203), *xm = f32_to_modp(xf), *yf = NULL, *ym = NULL;
  CHECK_MSG(exec_run(g, EXEC_F32, &xf, &yf, &d) == TEQ_OK, "%s", diag_last(&d));
  CHECK_MSG(exec_run(g, EXEC_MODP, &xm, &ym, &d) == TEQ_OK, "%s", diag_last(&d));
  Shape want = shape_of(4, 1, 8, 6, 5);
  CHECK(yf && shape_equal(&yf->shape, &want));
  Tensor *yfm = yf ? f32_to_modp(yf) : NULL;
  CHECK(tensors_identical(ym, yfm));
  unref_all((Tensor *[]){xf, xm, yf, ym, yfm}, 5);
  graph_free(g);
  diag_fini(&d);
}

/* ---- ONNX export and import ---- */

/* check_graph_round_trip on input x, keeping batchnorm (import would
 * otherwise fold it into a conv). */
static void check_round_trip(Graph *g, Tensor *x, const char *what) {
  Diag d;
  diag_init(&d);
  OnnxImportOptions opts = ONNX_IMPORT_DEFAULTS;
  opts.keep_batchnorm = true;
  CHECK_EQ_INT(check_graph_round_trip(g, &opts, &x, what, NULL, &d), TEQ_OK);
  diag_fini(&d);
}

static int add_op(Graph *g, OpKind kind, const TensorRef *in, int n_in, const Params *p, Diag *d) {
  return graph_add_node(g, kind, in, n_in, 1, p, NULL, d);
}

/* conv (groups, dilation, odd pads, bias, relu) -> batchnorm -> matmul
 * (tanh). */
static void test_onnx_round_trip(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(4, 1, 4, 9, 8);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  int w = graph_add_const(g, "w", random_f32(shape_of(4, 6, 2, 3, 3), 1300), &d);
  int b = graph_add_const(g, "b", random_f32(shape_of(1, 6), 1301), &d);
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_int(&p, param_index(OP_CONV2D, "groups"), 2);
  param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_RELU);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){2, 1, 0, 2}, 4);
  param_set_ints(&p, param_index(OP_CONV2D, "dilation"), (int64_t[]){2, 1}, 2);
  int c = add_op(g, OP_CONV2D, (TensorRef[]){{x, 0}, {w, 0}, {b, 0}}, 3, &p, &d);
  TensorRef bn[5] = {{c, 0}};
  for (int i = 1; i < 5; i++) {
    Tensor *t = random_f32(shape_of(1, 6), 1310 + i);
    for (int j = 0; i == 4 && j < 6; j++) ((float *)t->data)[j] += 2.0f; /* var > 0 */
    bn[i] = (TensorRef){graph_add_const(g, NULL, t, &d), 0};
  }
  int nb = add_op(g, OP_BATCHNORM, bn, 5, NULL, &d);
  int k = graph_add_const(g, "k", random_f32(shape_of(2, 9, 3), 1302), &d);
  params_default(OP_MATMUL, &p);
  param_set_int(&p, param_index(OP_MATMUL, "act"), ACT_TANH);
  int m = add_op(g, OP_MATMUL, (TensorRef[]){{nb, 0}, {k, 0}}, 2, &p, &d);
  graph_add_output(g, (TensorRef){m, 0}, "y", &d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");
  Tensor *xv = random_f32(sx, 1303);
  check_round_trip(g, xv, "conv/batchnorm/matmul");
  tensor_unref(xv);
  graph_free(g);
  diag_fini(&d);
}

/* A gemm with every attribute set and a column bias. */
static void test_onnx_round_trip_gemm(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Params p;
  Shape sa = shape_of(2, 6, 4);
  int a = graph_add_input(g, "a", &sa, DT_F32, &d);
  int bm = graph_add_const(g, "b", random_f32(shape_of(2, 5, 6), 1304), &d);
  int cm = graph_add_const(g, "c", random_f32(shape_of(2, 4, 1), 1305), &d);
  params_default(OP_GEMM, &p);
  param_set_int(&p, param_index(OP_GEMM, "transA"), 1);
  param_set_int(&p, param_index(OP_GEMM, "transB"), 1);
  param_set_float(&p, param_index(OP_GEMM, "alpha"), 0.5);
  param_set_float(&p, param_index(OP_GEMM, "beta"), -2.0);
  int gm = add_op(g, OP_GEMM, (TensorRef[]){{a, 0}, {bm, 0}, {cm, 0}}, 3, &p, &d);
  graph_add_output(g, (TensorRef){gm, 0}, "y", &d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");
  Tensor *xv = random_f32(sa, 1306);
  check_round_trip(g, xv, "gemm");
  tensor_unref(xv);
  graph_free(g);
  diag_fini(&d);
}

/* enlarge exports as a Pad of the kernel: a 1x3 kernel given as a graph
 * input (so import cannot fold it), enlarged to 3x3 and used by a conv. */
static void test_onnx_round_trip_enlarge(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sw = shape_of(4, 4, 3, 1, 3);
  int w = graph_add_input(g, "w", &sw, DT_F32, &d);
  int x = graph_add_const(g, "x", random_f32(shape_of(4, 1, 3, 7, 6), 1307), &d);
  int e = add_op(g, OP_ENLARGE, (TensorRef[]){{w, 0}}, 1, NULL, &d);
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (int64_t[]){1, 1, 1, 1}, 4);
  int c = add_op(g, OP_CONV2D, (TensorRef[]){{x, 0}, {e, 0}}, 2, &p, &d);
  graph_add_output(g, (TensorRef){c, 0}, "y", &d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");
  Tensor *wv = random_f32(sw, 1308);
  check_round_trip(g, wv, "enlarge");
  tensor_unref(wv);
  graph_free(g);
  diag_fini(&d);
}

/* ---- conv_transpose ---- */

typedef struct CtCase {
  int n, c, h, w, m, kh, kw; /* m: output channels in all */
  int sh, sw, pt, pl, pb, pr, dh, dw, groups, oph, opw, bias;
} CtCase;

static const CtCase ct_cases[] = {
  /* n c  h  w  m kh kw sh sw pt pl pb pr dh dw  g oph opw b */
  {1, 1, 3, 3, 2, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0},  /* ONNX's first example */
  {2, 3, 4, 5, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1},  /* stride 2, output_padding */
  {1, 4, 5, 4, 6, 2, 3, 3, 2, 0, 1, 2, 0, 1, 1, 2, 2, 1, 1},  /* groups 2, odd pads */
  {1, 2, 4, 4, 2, 3, 3, 1, 1, 1, 1, 1, 1, 2, 2, 1, 0, 0, 0},  /* dilation 2 */
  {2, 6, 3, 4, 6, 3, 2, 2, 3, 0, 0, 0, 0, 2, 1, 6, 1, 0, 1},  /* depthwise, mixed */
  {1, 8, 6, 6, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 4, 0, 0, 1},  /* 1x1 grouped */
  {1, 3, 7, 2, 5, 4, 4, 2, 1, 3, 2, 1, 0, 1, 2, 1, 1, 0, 0},  /* kernel > input width */
};

static void ct_setup(Op *o, const CtCase *k) {
  op_init(o, OP_CONV_TRANSPOSE, k->bias ? 3 : 2);
  op_ints(o, "stride", (int64_t[]){k->sh, k->sw}, 2);
  op_ints(o, "pads", (int64_t[]){k->pt, k->pl, k->pb, k->pr}, 4);
  op_ints(o, "dilation", (int64_t[]){k->dh, k->dw}, 2);
  op_int(o, "groups", k->groups);
  op_ints(o, "output_padding", (int64_t[]){k->oph, k->opw}, 2);
}

/* The definition: every input pixel scatters x * w over the full output,
 * which the pads then crop; in double. */
static Tensor *ct_ref(const CtCase *k, Tensor *const *in) {
  int fh = k->sh * (k->h - 1) + k->dh * (k->kh - 1) + 1 + k->oph;
  int fw = k->sw * (k->w - 1) + k->dw * (k->kw - 1) + 1 + k->opw;
  int oh = fh - k->pt - k->pb, ow = fw - k->pl - k->pr;
  int cg = k->c / k->groups, mg = k->m / k->groups;
  double *full = calloc((size_t)(k->n * k->m * fh * fw), sizeof *full);
  const float *x = in[0]->data, *w = in[1]->data, *b = k->bias ? in[2]->data : NULL;
  for (int n = 0; n < k->n; n++)
    for (int c = 0; c < k->c; c++)
      for (int mi = 0; mi < mg; mi++) {
        int m = (c / cg) * mg + mi;
        for (int iy = 0; iy < k->h; iy++)
          for (int ix = 0; ix < k->w; ix++)
            for (int i = 0; i < k->kh; i++)
              for (int j = 0; j < k->kw; j++)
                full[((n * k->m + m) * fh + iy * k->sh + i * k->dh) * fw + ix * k->sw + j * k->dw] +=
                    (double)x[((n * k->c + c) * k->h + iy) * k->w + ix] *
                    w[((c * mg + mi) * k->kh + i) * k->kw + j];
      }
  Tensor *y = tensor_new(DT_F32, &(Shape){4, {k->n, k->m, oh, ow}});
  float *out = y->data;
  for (int n = 0; n < k->n; n++)
    for (int m = 0; m < k->m; m++)
      for (int oy = 0; oy < oh; oy++)
        for (int ox = 0; ox < ow; ox++)
          *out++ = (float)(full[((n * k->m + m) * fh + oy + k->pt) * fw + ox + k->pl] +
                           (b ? b[m] : 0));
  free(full);
  return y;
}

static void ct_inputs(const CtCase *k, Tensor **in, bool small, uint64_t seed) {
  Shape s[3] = {shape_of(4, k->n, k->c, k->h, k->w),
                shape_of(4, k->c, k->m / k->groups, k->kh, k->kw), shape_of(1, k->m)};
  in[2] = NULL;
  for (int i = 0; i < (k->bias ? 3 : 2); i++)
    in[i] = small ? random_ints(s[i], 3, seed + (uint64_t)i)
                  : random_f32(s[i], seed + (uint64_t)i);
}

/* Float32 against the scatter definition; Z_p against float32 on small
 * integers. */
static void test_conv_transpose(void) {
  Diag d;
  diag_init(&d);
  for (size_t ci = 0; ci < sizeof ct_cases / sizeof *ct_cases; ci++) {
    const CtCase *k = &ct_cases[ci];
    int n_in = k->bias ? 3 : 2;
    Tensor *in[3], *si[3], *sm[3];
    ct_inputs(k, in, false, 1500 + ci);
    Op o;
    ct_setup(&o, k);
    Tensor *y = op_run(&o, in, false, &d), *r = ct_ref(k, in);
    double e = y ? max_rel_err(y, r) : INFINITY;
    CHECK_MSG(y && e < 1e-5, "conv_transpose case %zu: error %g %s", ci, e, diag_last(&d));
    ct_inputs(k, si, true, 1600 + ci);
    for (int i = 0; i < n_in; i++) sm[i] = f32_to_modp(si[i]);
    Tensor *yf = op_run(&o, si, false, &d), *ym = op_run(&o, sm, true, &d);
    Tensor *want = yf ? f32_to_modp(yf) : NULL;
    CHECK_MSG(want && tensors_identical(ym, want), "conv_transpose case %zu: Z_p differs", ci);
    unref_all((Tensor *[]){y, r, yf, ym, want}, 5);
    unref_all(in, n_in);
    unref_all(si, n_in);
    unref_all(sm, n_in);
  }
  diag_fini(&d);
}

static void test_conv_transpose_errors(void) {
  Op o;
  op_init(&o, OP_CONV_TRANSPOSE, 2);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 5, 5), shape_of(4, 3, 2, 3, 3)},
                 "conv_transpose: weight W [3, 2, 3, 3]: dimension 0 must equal input channels 4");
  op_int(&o, "groups", 3);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 5, 5), shape_of(4, 4, 2, 3, 3)},
                 "groups=3: input channels 4 not divisible by groups");
  op_int(&o, "groups", 1);
  op_ints(&o, "pads", (int64_t[]){4, 0, 3, 0}, 4);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 2, 2), shape_of(4, 4, 2, 3, 3)},
                 "crop the whole 4x4 output");
  op_init(&o, OP_CONV_TRANSPOSE, 3);
  op_check_error(&o, (Shape[]){shape_of(4, 1, 4, 5, 5), shape_of(4, 4, 2, 3, 3), shape_of(1, 4)},
                 "bias B [4]: expected [2]");
  op_check_error(&o, (Shape[]){shape_of(3, 4, 5, 5), shape_of(4, 4, 2, 3, 3), shape_of(1, 2)},
                 "input X [4, 5, 5]: expected [N, C, H, W]");
}

/* Every attribute set, groups and a bias, exported and imported back. */
static void test_onnx_round_trip_conv_transpose(void) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  Shape sx = shape_of(4, 1, 4, 5, 6);
  int x = graph_add_input(g, "x", &sx, DT_F32, &d);
  int w = graph_add_const(g, "w", random_f32(shape_of(4, 4, 3, 3, 2), 1700), &d);
  int b = graph_add_const(g, "b", random_f32(shape_of(1, 6), 1701), &d);
  Params p;
  params_default(OP_CONV_TRANSPOSE, &p);
  param_set_int(&p, param_index(OP_CONV_TRANSPOSE, "groups"), 2);
  param_set_ints(&p, param_index(OP_CONV_TRANSPOSE, "stride"), (int64_t[]){2, 3}, 2);
  param_set_ints(&p, param_index(OP_CONV_TRANSPOSE, "pads"), (int64_t[]){1, 0, 2, 1}, 4);
  param_set_ints(&p, param_index(OP_CONV_TRANSPOSE, "dilation"), (int64_t[]){2, 1}, 2);
  param_set_ints(&p, param_index(OP_CONV_TRANSPOSE, "output_padding"), (int64_t[]){1, 2}, 2);
  int c = add_op(g, OP_CONV_TRANSPOSE, (TensorRef[]){{x, 0}, {w, 0}, {b, 0}}, 3, &p, &d);
  graph_add_output(g, (TensorRef){c, 0}, "y", &d);
  CHECK_MSG(d.n_errors == 0, "%s", d.text ? d.text : "");
  Tensor *xv = random_f32(sx, 1702);
  check_round_trip(g, xv, "conv_transpose");
  tensor_unref(xv);
  graph_free(g);
  diag_fini(&d);
}

static void test_rows(void) {
  static const OpKind mine[] = {OP_CONST_POOL, OP_CONST_ICONV, OP_CONST_IMM, OP_CONST_ONE,
                                OP_MATMUL, OP_GEMM, OP_CONV2D, OP_ENLARGE, OP_BATCHNORM,
                                OP_CONV_TRANSPOSE};
  for (size_t i = 0; i < sizeof mine / sizeof *mine; i++) {
    const OpDef *r = op_def(mine[i]);
    CHECK_MSG(r->kind == mine[i] && r->infer_shape && r->eval_f32 && r->eval_modp &&
              !(r->flags & OPF_OPAQUE), "row %s", r->name);
  }
  CHECK(op_def(OP_CONV2D)->flags & OPF_MULTILINEAR);
  CHECK(op_def(OP_MATMUL)->flags & OPF_MULTILINEAR);
  CHECK(op_def(OP_CONV_TRANSPOSE)->flags & OPF_MULTILINEAR);
  CHECK_EQ_INT(op_by_onnx("ConvTranspose"), OP_CONV_TRANSPOSE);
  CHECK(op_def(OP_CONST_POOL)->flags & OPF_SOURCE);
  CHECK_EQ_INT(op_by_onnx("Conv"), OP_CONV2D);
  CHECK_EQ_INT(op_by_onnx("Gemm"), OP_GEMM);
  CHECK_EQ_INT(op_by_onnx("MatMul"), OP_MATMUL);
  CHECK_EQ_INT(op_by_onnx("BatchNormalization"), OP_BATCHNORM);
  char buf[128];
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_RELU);
  params_format(OP_CONV2D, &p, true, buf, sizeof buf);
  CHECK_MSG(strcmp(buf, "act=relu") == 0, "%s", buf);
}

int main(void) {
  test_rows();
  test_conv_by_hand();
  test_conv3d();
  test_conv_float_vs_reference();
  test_conv_modp_vs_float();
  test_conv_gpu_ways_on_host();
  test_conv_pool_ways_on_host();
  test_iconv_identity();
  test_enlarge_identity();
  test_matmul();
  test_imm_identity();
  test_gemm();
  test_gemm_plain_on_host();
  test_gemm_residual();
  test_products_modp_full_range();
  test_conv_modp_full_range();
  test_batchnorm();
  test_constants();
  test_conv_errors();
  test_matmul_errors();
  test_through_executor();
  test_onnx_round_trip();
  test_onnx_round_trip_gemm();
  test_onnx_round_trip_enlarge();
  test_conv_transpose();
  test_conv_transpose_errors();
  test_onnx_round_trip_conv_transpose();
  return check_exit();
}
