/* test_cuda_linear.c: the GPU kernels of the linear operators (conv2d,
 * conv3d, conv_transpose, enlarge, batchnorm, matmul, gemm) against the CPU
 * executor, each at odd and degenerate sizes and one large shape: conv2d
 * with stride, asymmetric pads (cuDNN pads symmetrically, so these take the
 * explicit-padding path), groups and depthwise, dilation, bias with every
 * fused act (relu takes cuDNN's fused bias-activation call), 1x1, and a
 * ResNet layer; each cuBLAS way pinned, whole or split along K, the
 * direct kernel pinned on grouped, depthwise and shallow dense convs, and
 * pins the configuration does not offer, and a fused 2x2 or 3x3 max pool
 * (Winograd's tiles keep their max; the other ways pool apart); conv3d
 * with bias, stride, even pads, dilation, groups, a residual and fused
 * acts, and an R3D-18 stem;
 * conv_transpose with stride, output_padding, even pads (cuDNN computes
 * the window) and uneven ones or output_padding past the stride (the full
 * scatter is cropped), groups, dilation, bias; enlarge to square and
 * non-square kernels; batchnorm on 2-D to 4-D inputs and a non-default
 * epsilon; matmul with 2-D, 1-D and broadcast batch operands (one tall
 * GEMM, strided-batched, and loops of either) and fused acts (a relu over
 * one tall GEMM is cuBLASLt's epilogue), the tall product's ways pinned,
 * whole or split along K; gemm (its bias and relu in cuBLASLt's epilogue
 * or not, each pinned) with transposes, alpha and beta, C as a scalar,
 * [1], [N], [M, 1], [1, N] and [M, N], and a residual (cuBLASLt's C, or
 * written first); attention whose transposes
 * the products read and write by strides, BERT's and Swin's windowed one
 * (arrays of pointers). */
#include "tests/cuda_check.h"
#include "tests/tensor_check.h"
#include "tests/attention_graph.h"

#define SHAPES(...) ((const Shape[]){__VA_ARGS__})
#define S(...) shape_of(__VA_ARGS__)

enum { CUDA_CASE_WAY_MAX = 64 }; /* a way's name, as cuda_device_pin_way takes it */

/* ---- conv2d ---- */

typedef struct ConvSpec {
  const char *label;
  Shape x, w;
  bool bias;
  int64_t stride[2], pads[4], dilation[2], groups;
  int act;
  bool residual; /* a fourth input of the full output's shape (with the bias) */
  int64_t pool;  /* the fused max pool's window and stride, 0 for none */
} ConvSpec;

static CudaCase conv_spec_case(ConvSpec s) {
  Shape b = S(1, (int)s.w.d[0]);
  int64_t st[2] = {s.stride[0] ? s.stride[0] : 1, s.stride[1] ? s.stride[1] : 1};
  int64_t dl[2] = {s.dilation[0] ? s.dilation[0] : 1, s.dilation[1] ? s.dilation[1] : 1};
  Shape z = S(4, (int)s.x.d[0], (int)s.w.d[0],
              (int)((s.x.d[2] + s.pads[0] + s.pads[2] - dl[0] * (s.w.d[2] - 1) - 1) / st[0] + 1),
              (int)((s.x.d[3] + s.pads[1] + s.pads[3] - dl[1] * (s.w.d[3] - 1) - 1) / st[1] + 1));
  CudaCase c = cuda_case(s.label, OP_CONV2D, s.residual ? 4 : s.bias ? 3 : 2,
                         SHAPES(s.x, s.w, b, z));
  int64_t one[2] = {1, 1};
  param_set_ints(&c.params, param_index(OP_CONV2D, "stride"), s.stride[0] ? s.stride : one, 2);
  param_set_ints(&c.params, param_index(OP_CONV2D, "pads"), s.pads, 4);
  param_set_ints(&c.params, param_index(OP_CONV2D, "dilation"), s.dilation[0] ? s.dilation : one,
                 2);
  param_set_int(&c.params, param_index(OP_CONV2D, "groups"), s.groups ? s.groups : 1);
  param_set_int(&c.params, param_index(OP_CONV2D, "act"), s.act);
  param_set_int(&c.params, param_index(OP_CONV2D, "pool"), s.pool);
  return c;
}

static void conv_case(CudaDevice *dev, ConvSpec s) {
  CudaCase c = conv_spec_case(s);
  cuda_check_case(dev, &c);
}

static void test_conv2d(CudaDevice *dev) {
  conv_case(dev, (ConvSpec){.label = "conv2d 1x3x7x9 k3 s2 pads(0 1 2 1)", S(4, 1, 3, 7, 9),
                            S(4, 4, 3, 3, 3), .stride = {2, 2}, .pads = {0, 1, 2, 1}});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x3x7x5 k3 pads(2 0 0 1) bias relu", S(4, 1, 3, 7, 5),
                            S(4, 5, 3, 3, 3), true, .pads = {2, 0, 0, 1}, .act = ACT_RELU});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 k3 pads 1", S(4, 2, 5, 13, 11), S(4, 7, 5, 3, 3),
                            .pads = {1, 1, 1, 1}});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x4x13x11 groups=2", S(4, 2, 4, 13, 11), S(4, 6, 2, 3, 3),
                            .pads = {1, 1, 1, 1}, .groups = 2});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x6x9x9 groups=3 s2 pads(1 0 1 2) bias",
                            S(4, 1, 6, 9, 9), S(4, 9, 2, 3, 3), true, .stride = {2, 2},
                            .pads = {1, 0, 1, 2}, .groups = 3});
  conv_case(dev, (ConvSpec){.label = "conv2d depthwise 1x8x15x17", S(4, 1, 8, 15, 17), S(4, 8, 1, 3, 3),
                            .pads = {1, 1, 1, 1}, .groups = 8});
  conv_case(dev, (ConvSpec){.label = "conv2d depthwise 2x32x28x28 s2 bias relu", S(4, 2, 32, 28, 28),
                            S(4, 32, 1, 3, 3), true, .stride = {2, 2}, .pads = {1, 1, 1, 1},
                            .groups = 32, .act = ACT_RELU});
  conv_case(dev, (ConvSpec){.label = "conv2d depthwise 5x5 multiplier 2", S(4, 1, 4, 11, 13),
                            S(4, 8, 1, 5, 5), .pads = {2, 2, 2, 2}, .groups = 4});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x3x17x19 dilation 2", S(4, 1, 3, 17, 19), S(4, 5, 3, 3, 3),
                            .pads = {2, 2, 2, 2}, .dilation = {2, 2}});
  conv_case(dev, (ConvSpec){.label = "conv2d dilation (2 3) stride (1 2)", S(4, 2, 3, 16, 21),
                            S(4, 4, 3, 3, 2), .stride = {1, 2}, .dilation = {2, 3}});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 bias relu", S(4, 2, 5, 13, 11), S(4, 7, 5, 3, 3),
                            true, .pads = {1, 1, 1, 1}, .act = ACT_RELU});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 bias sigmoid", S(4, 2, 5, 13, 11),
                            S(4, 7, 5, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_SIGMOID});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 bias tanh", S(4, 2, 5, 13, 11), S(4, 7, 5, 3, 3),
                            true, .pads = {1, 1, 1, 1}, .act = ACT_TANH});
  /* the mobile networks' activations, applied in the bias pass */
  conv_case(dev, (ConvSpec){.label = "conv2d depthwise 1x32x14x14 bias silu", S(4, 1, 32, 14, 14),
                            S(4, 32, 1, 3, 3), true, .pads = {1, 1, 1, 1}, .groups = 32,
                            .act = ACT_SILU});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x1 1x16x28x28 bias hard_swish", S(4, 1, 16, 28, 28),
                            S(4, 48, 16, 1, 1), true, .act = ACT_HARD_SWISH});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 bias relu6", S(4, 2, 5, 13, 11),
                            S(4, 7, 5, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU6});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x1 1x64x1x1 bias hard_sigmoid (an SE gate)",
                            S(4, 1, 64, 1, 1), S(4, 16, 64, 1, 1), true,
                            .act = ACT_HARD_SIGMOID});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x1 1x40x1x1 bias hard_sigmoid_fifth (Paddle's gate)",
                            S(4, 1, 40, 1, 1), S(4, 10, 40, 1, 1), true,
                            .act = ACT_HARD_SIGMOID_FIFTH});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 silu, no bias", S(4, 2, 5, 13, 11),
                            S(4, 7, 5, 3, 3), .pads = {1, 1, 1, 1}, .act = ACT_SILU});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 bias, no act", S(4, 2, 5, 13, 11),
                            S(4, 7, 5, 3, 3), true, .pads = {1, 1, 1, 1}});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x5x13x11 relu, no bias", S(4, 2, 5, 13, 11),
                            S(4, 7, 5, 3, 3), .pads = {1, 1, 1, 1}, .act = ACT_RELU});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x1 2x16x14x14", S(4, 2, 16, 14, 14), S(4, 32, 16, 1, 1)});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x1 s2 bias relu", S(4, 1, 24, 15, 15), S(4, 8, 24, 1, 1),
                            true, .stride = {2, 2}, .act = ACT_RELU});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x1x1x1 by 1x1x1x1", S(4, 1, 1, 1, 1), S(4, 1, 1, 1, 1)});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x2x1x1 k1 pads(1 0 0 2)", S(4, 1, 2, 1, 1),
                            S(4, 3, 2, 1, 1), true, .pads = {1, 0, 0, 2}});
  conv_case(dev, (ConvSpec){.label = "conv2d kernel = input 1x3x5x5 k5", S(4, 1, 3, 5, 5),
                            S(4, 2, 3, 5, 5)});
  conv_case(dev, (ConvSpec){.label = "conv2d pads 3 > kernel reach", S(4, 1, 2, 4, 4), S(4, 3, 2, 2, 2),
                            .pads = {3, 3, 3, 3}});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x64x56x56 * 64x64x3x3 (ResNet)", S(4, 1, 64, 56, 56),
                            S(4, 64, 64, 3, 3), .pads = {1, 1, 1, 1}});
  conv_case(dev, (ConvSpec){.label = "conv2d 4x64x56x56 * 64x64x3x3 bias relu", S(4, 4, 64, 56, 56),
                            S(4, 64, 64, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x3x224x224 k7 s2 pads 3 (stem)", S(4, 1, 3, 224, 224),
                            S(4, 64, 3, 7, 7), true, .stride = {2, 2}, .pads = {3, 3, 3, 3},
                            .act = ACT_RELU});
}

/* The one-node graph of case c, every input a graph input. */
static Graph *case_graph(const CudaCase *c, Diag *d) {
  Graph *g = graph_new();
  TensorRef refs[CUDA_CASE_MAX_IN];
  for (int i = 0; i < c->n_in; i++) {
    char name[16];
    snprintf(name, sizeof name, "x%d", i);
    refs[i] = (TensorRef){graph_add_input(g, name, &c->in[i], DT_F32, d), 0};
  }
  int id = graph_add_node(g, c->kind, refs, c->n_in, 1, &c->params, "op", d);
  graph_add_output(g, (TensorRef){id, 0}, NULL, d);
  return g;
}

/* The way pinned is the one every step of g's plan ran (n_steps of them),
 * as its step notes report it: a path that never looks at the pin runs as
 * it would unpinned, and the comparison with the CPU passes all the same. */
static void check_graph_ran(CudaDevice *dev, const Graph *g, int n_steps, const char *way,
                            const char *label) {
  Diag d;
  diag_init(&d);
  CudaPlan *plan = NULL;
  int rc = cuda_plan_new(dev, g, &plan, &d);
  CHECK_MSG(rc == TEQ_OK && cuda_plan_n_steps(plan) == n_steps, "%s: %d steps, not %d %s", label,
            rc == TEQ_OK ? cuda_plan_n_steps(plan) : -1, n_steps, d.text ? d.text : "");
  for (int i = 0; rc == TEQ_OK && i < cuda_plan_n_steps(plan); i++) {
    const char *ran = cuda_plan_step_note(plan, i, NULL);
    CHECK_MSG(strcmp(ran, way) == 0, "%s: pinned %s, step %d ran \"%s\"", label, way, i, ran);
  }
  cuda_plan_free(plan);
  diag_fini(&d);
}

static void check_way_ran(CudaDevice *dev, const CudaCase *c, const char *way) {
  Diag d;
  diag_init(&d);
  Graph *g = case_graph(c, &d);
  check_graph_ran(dev, g, 1, way, c->label);
  graph_free(g);
  diag_fini(&d);
}

/* Each cuBLAS way pinned: the search runs only the fastest, so a way that
 * loses on this GPU would otherwise never be checked. The split ones write
 * partial products to scratch (after the padded input and the columns,
 * where those are used) and sum them with the bias and activation. */
static void pinned_conv_case(CudaDevice *dev, const char *way, ConvSpec s) {
  CudaCase c = conv_spec_case(s);
  cuda_device_pin_way(dev, way);
  cuda_check_case(dev, &c);
  check_way_ran(dev, &c, way);
  cuda_device_pin_way(dev, NULL);
}

/* In way[size], the first way case c's search offers that ends in
 * `suffix`, "" if none: read from the list a pin it does not offer gets.
 * Which cuDNN algorithms are offered (cuDNN's two fastest) depends on the
 * GPU, so a test of one names none. */
static void offered_way(CudaDevice *dev, const CudaCase *c, const char *suffix, char *way,
                        size_t size) {
  Diag d;
  diag_init(&d);
  Graph *g = case_graph(c, &d);
  CudaPlan *plan = NULL;
  cuda_device_pin_way(dev, "none");
  CHECK_EQ_INT(cuda_plan_new(dev, g, &plan, &d), TEQ_ERR_UNSUPPORTED);
  cuda_device_pin_way(dev, NULL);
  way[0] = '\0';
  const char *list = d.text ? strstr(d.text, "(offered: ") : NULL;
  for (const char *w = list ? list + strlen("(offered: ") : NULL; w && !way[0];) {
    size_t len = strcspn(w, ",)");
    size_t sl = strlen(suffix);
    if (len >= sl && len < size && strncmp(w + len - sl, suffix, sl) == 0)
      snprintf(way, size, "%.*s", (int)len, w);
    w = w[len] == ',' ? w + len + 2 : NULL;
  }
  CHECK_MSG(way[0], "%s: no way ending in %s offered: %s", c->label, suffix,
            d.text ? d.text : "no message");
  cuda_plan_free(plan);
  graph_free(g);
  diag_fini(&d);
}

/* A pinned way a one-node graph of kind on inputs a and b (default
 * parameters) does not offer fails, naming those it does (one of them
 * `offered`). */
static void check_pin_refused(CudaDevice *dev, OpKind kind, Shape a, Shape b, const char *way,
                              const char *offered) {
  Diag d;
  diag_init(&d);
  Graph *g = graph_new();
  int x = graph_add_input(g, "a", &a, DT_F32, &d), y = graph_add_input(g, "b", &b, DT_F32, &d);
  Params p;
  params_default(kind, &p);
  int id = graph_add_node(g, kind, (TensorRef[]){{x, 0}, {y, 0}}, 2, 1, &p, "op", &d);
  graph_add_output(g, (TensorRef){id, 0}, NULL, &d);
  cuda_device_pin_way(dev, way);
  CudaPlan *plan = NULL;
  CHECK_EQ_INT(cuda_plan_new(dev, g, &plan, &d), TEQ_ERR_UNSUPPORTED);
  /* `offered` is searched in the list only: it is a prefix of the pin,
   * which the message quotes first. */
  const char *list = d.text ? strstr(d.text, "not offered here (offered: ") : NULL;
  CHECK_MSG(list && strstr(list, offered), "pin %s: %s", way, d.text ? d.text : "no message");
  cuda_device_pin_way(dev, NULL);
  cuda_plan_free(plan);
  graph_free(g);
  diag_fini(&d);
}

/* Winograd on constant filters, as a model's plan holds them: each filter
 * is transformed once, in the plan's first run, and kept; the captured
 * replay that cuda_plan_run launches on new values of x reads the kept
 * transforms. Two convs whose filters are of one size keep one each, so a
 * transform kept for the wrong filter shows in the output. */
static void test_winograd_constant_filters(CudaDevice *dev) {
  Diag d;
  diag_init(&d);
  Shape xs = S(4, 2, 32, 13, 15), ws = S(4, 32, 32, 3, 3), bs = S(1, 32);
  Tensor *w1 = tensor_new(DT_F32, &ws), *w2 = tensor_new(DT_F32, &ws), *b = tensor_new(DT_F32, &bs);
  tensor_fill_random(w1, 11), tensor_fill_random(w2, 12), tensor_fill_random(b, 13);
  Graph *g = graph_new();
  int x = graph_add_input(g, "x", &xs, DT_F32, &d);
  int c1 = graph_add_const(g, "w1", w1, &d), c2 = graph_add_const(g, "w2", w2, &d),
      cb = graph_add_const(g, "b", b, &d);
  Params p;
  params_default(OP_CONV2D, &p);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), (const int64_t[]){1, 1, 1, 1}, 4);
  param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_RELU);
  int a = graph_add_node(g, OP_CONV2D, (TensorRef[]){{x, 0}, {c1, 0}, {cb, 0}}, 3, 1, &p, "a", &d);
  param_set_int(&p, param_index(OP_CONV2D, "act"), ACT_NONE);
  int o = graph_add_node(g, OP_CONV2D, (TensorRef[]){{a, 0}, {c2, 0}}, 2, 1, &p, "o", &d);
  graph_add_output(g, (TensorRef){o, 0}, NULL, &d);
  CHECK_MSG(o >= 0, "winograd constant filters: cannot build: %s", d.text ? d.text : "");
  const char *label = "winograd, two constant filters kept";
  cuda_device_pin_way(dev, "teq:winograd");
  if (o >= 0) {
    cuda_check_seeds(dev, g, false, 0, label);
    check_graph_ran(dev, g, 2, "teq:winograd", label);
  }
  cuda_device_pin_way(dev, NULL);
  graph_free(g);
  diag_fini(&d);
}

static void test_conv2d_ways(CudaDevice *dev) {
  pinned_conv_case(dev, "cublas:im2col+gemm",
                   (ConvSpec){.label = "conv2d im2col k3 s2 pads(0 1 2 1) bias tanh",
                              S(4, 1, 3, 7, 9), S(4, 4, 3, 3, 3), true, .stride = {2, 2},
                              .pads = {0, 1, 2, 1}, .act = ACT_TANH});
  pinned_conv_case(dev, "cublas:gemm",
                   (ConvSpec){.label = "conv2d gemm 1x1 2x16x14x14 bias relu",
                              S(4, 2, 16, 14, 14), S(4, 32, 16, 1, 1), true, .act = ACT_RELU});
  pinned_conv_case(dev, "cublas:im2col+gemm split 4",
                   (ConvSpec){.label = "conv2d 1x512x14x14 k3 bias relu (VGG) split 4",
                              S(4, 1, 512, 14, 14), S(4, 512, 512, 3, 3), true,
                              .pads = {1, 1, 1, 1}, .act = ACT_RELU});
  pinned_conv_case(dev, "cublas:im2col+gemm split 2",
                   (ConvSpec){.label = "conv2d 2x64x9x9 k3 pads(0 1 2 1) split 2",
                              S(4, 2, 64, 9, 9), S(4, 96, 64, 3, 3), .pads = {0, 1, 2, 1}});
  pinned_conv_case(dev, "cublas:gemm split 8",
                   (ConvSpec){.label = "conv2d 1x1 1x2048x7x7 bias sigmoid split 8",
                              S(4, 1, 2048, 7, 7), S(4, 512, 2048, 1, 1), true,
                              .act = ACT_SIGMOID});
  pinned_conv_case(dev, "cublas:gemm split 16",
                   (ConvSpec){.label = "conv2d 1x1 1x1024x7x7 relu split 16",
                              S(4, 1, 1024, 7, 7), S(4, 256, 1024, 1, 1), .act = ACT_RELU});
  pinned_conv_case(dev, "cublas:gemm split 4",
                   (ConvSpec){.label = "conv2d 1x1 1x1152x7x7 bias silu split 4",
                              S(4, 1, 1152, 7, 7), S(4, 320, 1152, 1, 1), true,
                              .act = ACT_SILU});
  pinned_conv_case(dev, "cublas:im2col+gemm",
                   (ConvSpec){.label = "conv2d im2col 1x8x9x9 residual bias relu6",
                              S(4, 1, 8, 9, 9), S(4, 8, 8, 3, 3), true, .pads = {1, 1, 1, 1},
                              .act = ACT_RELU6, .residual = true});
  check_pin_refused(dev, OP_CONV2D, S(4, 1, 8, 5, 5), S(4, 4, 8, 3, 3),
                    "cublas:im2col+gemm split 3", "cublas:im2col+gemm");
  /* The direct kernel: grouped and shallow dense convs, uneven pads read
   * in place, every epilogue in its one store. */
  const ConvSpec direct[] = {
    {.label = "direct 1x1024x7x7 g32 bias relu (ResNeXt)", S(4, 1, 1024, 7, 7),
     S(4, 1024, 32, 3, 3), true, .pads = {1, 1, 1, 1}, .groups = 32, .act = ACT_RELU},
    {.label = "direct 2x256x15x13 g32 s2 pads(0 1 2 1) residual", S(4, 2, 256, 15, 13),
     S(4, 256, 8, 3, 3), true, .stride = {2, 2}, .pads = {0, 1, 2, 1}, .groups = 32,
     .residual = true},
    {.label = "direct depthwise 1x32x112x112 bias relu6", S(4, 1, 32, 112, 112),
     S(4, 32, 1, 3, 3), true, .pads = {1, 1, 1, 1}, .groups = 32, .act = ACT_RELU6},
    {.label = "direct depthwise 7x7 s2 dilated bias hard swish", S(4, 1, 96, 19, 23),
     S(4, 96, 1, 7, 7), true, .stride = {2, 2}, .pads = {3, 2, 3, 4}, .dilation = {2, 1},
     .groups = 96, .act = ACT_HARD_SWISH},
    {.label = "direct depth multiplier 2, 3 images, silu", S(4, 3, 24, 9, 9),
     S(4, 48, 1, 5, 5), true, .pads = {2, 2, 2, 2}, .groups = 24, .act = ACT_SILU},
    {.label = "direct dense 1x3x224x224 k3 bias relu (VGG's first)", S(4, 1, 3, 224, 224),
     S(4, 64, 3, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU},
  };
  for (size_t i = 0; i < sizeof direct / sizeof *direct; i++)
    pinned_conv_case(dev, "teq:direct", direct[i]);
  check_pin_refused(dev, OP_CONV2D, S(4, 1, 16, 5, 5), S(4, 4, 16, 3, 3), "teq:direct",
                    "cublas:im2col+gemm");
  /* The tiled kernel on the same grouped cases, and on planes past one
   * block's tile and groups past one chunk of channels. */
  for (size_t i = 0; i < sizeof direct / sizeof *direct; i++)
    if (direct[i].groups > 1) pinned_conv_case(dev, "teq:tiled", direct[i]);
  const ConvSpec tiled[] = {
    {.label = "tiled depthwise 2x96x57x61 bias relu (tiles with edges)", S(4, 2, 96, 57, 61),
     S(4, 96, 1, 3, 3), true, .pads = {1, 1, 1, 1}, .groups = 96, .act = ACT_RELU},
    {.label = "tiled 1x512x14x14 g2 residual (2304 taps, in chunks)", S(4, 1, 512, 14, 14),
     S(4, 64, 256, 3, 3), true, .pads = {1, 1, 1, 1}, .groups = 2, .residual = true},
  };
  for (size_t i = 0; i < sizeof tiled / sizeof *tiled; i++)
    pinned_conv_case(dev, "teq:tiled", tiled[i]);
  check_pin_refused(dev, OP_CONV2D, S(4, 1, 16, 5, 5), S(4, 4, 16, 3, 3), "teq:tiled",
                    "cublas:im2col+gemm");
  /* Winograd's F(2x2, 3x3): ungrouped 3x3 convs of stride 1, odd outputs
   * in partial tiles, uneven pads copied first, dilated tiles (rows a
   * dilation apart), the epilogue in the transform back. */
  const ConvSpec winograd[] = {
    {.label = "winograd 1x512x14x14 residual bias relu (VGG-19's last)", S(4, 1, 512, 14, 14),
     S(4, 512, 512, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU, .residual = true},
    {.label = "winograd 2x64x15x17 pads(0 2 1 0) bias tanh", S(4, 2, 64, 15, 17),
     S(4, 48, 64, 3, 3), true, .pads = {0, 2, 1, 0}, .act = ACT_TANH},
    {.label = "winograd 1x256x56x56 no pads, no bias", S(4, 1, 256, 56, 56),
     S(4, 256, 256, 3, 3)},
    {.label = "winograd 1x128x28x28 dilation 2 bias relu (CSRNet)", S(4, 1, 128, 28, 28),
     S(4, 128, 128, 3, 3), true, .pads = {2, 2, 2, 2}, .dilation = {2, 2}, .act = ACT_RELU},
    {.label = "winograd 2x16x13x11 dilation (3 2) pads(3 1 2 2)", S(4, 2, 16, 13, 11),
     S(4, 24, 16, 3, 3), .pads = {3, 1, 2, 2}, .dilation = {3, 2}},
  };
  for (size_t i = 0; i < sizeof winograd / sizeof *winograd; i++)
    pinned_conv_case(dev, "teq:winograd", winograd[i]);
  check_pin_refused(dev, OP_CONV2D, S(4, 1, 16, 5, 5), S(4, 4, 16, 1, 1), "teq:winograd",
                    "cublas:gemm");
  test_winograd_constant_filters(dev);
  /* A fused 2x2 max pool (VGG's conv, relu, pool): Winograd's transform back
   * keeps each tile's max, partial tiles of an odd output dropped; other
   * ways, and Winograd at pool 3, pool the full output in scratch apart. */
  const ConvSpec pooled[] = {
    {.label = "winograd 1x64x28x28 bias relu pool 2 (VGG)", S(4, 1, 64, 28, 28),
     S(4, 64, 64, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU, .pool = 2},
    {.label = "winograd 2x32x15x13 residual bias pool 2 (odd: partial tiles)",
     S(4, 2, 32, 15, 13), S(4, 24, 32, 3, 3), true, .pads = {1, 1, 1, 1}, .residual = true,
     .pool = 2},
    {.label = "winograd 1x16x17x16 bias relu pool 3 (pooled apart)", S(4, 1, 16, 17, 16),
     S(4, 8, 16, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU, .pool = 3},
  };
  for (size_t i = 0; i < sizeof pooled / sizeof *pooled; i++)
    pinned_conv_case(dev, "teq:winograd", pooled[i]);
  ConvSpec vgg = {.label = "im2col 1x64x28x28 bias relu pool 2 (VGG)", S(4, 1, 64, 28, 28),
                  S(4, 64, 64, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU, .pool = 2};
  pinned_conv_case(dev, "cublas:im2col+gemm", vgg);
  CudaCase vc = conv_spec_case(vgg);
  char pooled_way[CUDA_CASE_WAY_MAX];
  offered_way(dev, &vc, "+bias+relu", pooled_way, sizeof pooled_way);
  vgg.label = "cuDNN's fused call 1x64x28x28 bias relu pool 2 (VGG)";
  if (pooled_way[0]) pinned_conv_case(dev, pooled_way, vgg);
  pinned_conv_case(dev, "cublas:im2col+gemm",
                   (ConvSpec){.label = "im2col 1x8x9x11 k3 s2 pads(0 1 2 1) residual pool 2",
                              S(4, 1, 8, 9, 11), S(4, 6, 8, 3, 3), true, .stride = {2, 2},
                              .pads = {0, 1, 2, 1}, .residual = true, .pool = 2});
  pinned_conv_case(dev, "teq:direct",
                   (ConvSpec){.label = "direct 1x3x224x224 k3 bias relu pool 2 (VGG's first)",
                              S(4, 1, 3, 224, 224), S(4, 64, 3, 3, 3), true,
                              .pads = {1, 1, 1, 1}, .act = ACT_RELU, .pool = 2});
  conv_case(dev, (ConvSpec){.label = "conv2d 1x128x56x56 bias relu pool 2 (each way timed pooled)",
                            S(4, 1, 128, 56, 56), S(4, 128, 128, 3, 3), true,
                            .pads = {1, 1, 1, 1}, .act = ACT_RELU, .pool = 2});
  /* A residual (ResNet's shortcut, folded in at import): cuDNN's fused call
   * adds it as z, the other ways in their epilogue or the partials' sum. */
  conv_case(dev, (ConvSpec){.label = "conv2d 1x64x56x56 residual bias relu", S(4, 1, 64, 56, 56),
                            S(4, 64, 64, 3, 3), true, .pads = {1, 1, 1, 1}, .act = ACT_RELU,
                            .residual = true});
  conv_case(dev, (ConvSpec){.label = "conv2d 2x16x9x9 1x1 residual bias", S(4, 2, 16, 9, 9),
                            S(4, 32, 16, 1, 1), true, .residual = true});
  ConvSpec fused = {.label = "conv2d 1x64x112x112 residual relu (cuDNN's z)",
                    S(4, 1, 64, 112, 112), S(4, 128, 64, 3, 3), true, .pads = {1, 1, 1, 1},
                    .act = ACT_RELU, .residual = true};
  CudaCase fc = conv_spec_case(fused);
  char way[CUDA_CASE_WAY_MAX];
  offered_way(dev, &fc, "+bias+relu", way, sizeof way);
  if (way[0]) pinned_conv_case(dev, way, fused);
  pinned_conv_case(dev, "cublas:im2col+gemm",
                   (ConvSpec){.label = "conv2d residual pads(0 1 2 1) tanh (epilogue)",
                              S(4, 1, 8, 7, 9), S(4, 6, 8, 3, 3), true, .pads = {0, 1, 2, 1},
                              .act = ACT_TANH, .residual = true});
  pinned_conv_case(dev, "cublas:im2col+gemm split 4",
                   (ConvSpec){.label = "conv2d 1x512x14x14 residual relu split 4",
                              S(4, 1, 512, 14, 14), S(4, 512, 512, 3, 3), true,
                              .pads = {1, 1, 1, 1}, .act = ACT_RELU, .residual = true});
}

/* ---- conv_transpose ---- */

typedef struct CtSpec {
  const char *label;
  Shape x, w;
  bool bias;
  int64_t stride[2], pads[4], dilation[2], groups, outpad[2];
} CtSpec;

static void ct_case(CudaDevice *dev, CtSpec s) {
  Shape b = S(1, (int)(s.w.d[1] * (s.groups ? s.groups : 1)));
  CudaCase c = cuda_case(s.label, OP_CONV_TRANSPOSE, s.bias ? 3 : 2, SHAPES(s.x, s.w, b));
  int64_t one[2] = {1, 1};
  param_set_ints(&c.params, param_index(OP_CONV_TRANSPOSE, "stride"),
                 s.stride[0] ? s.stride : one, 2);
  param_set_ints(&c.params, param_index(OP_CONV_TRANSPOSE, "pads"), s.pads, 4);
  param_set_ints(&c.params, param_index(OP_CONV_TRANSPOSE, "dilation"),
                 s.dilation[0] ? s.dilation : one, 2);
  param_set_int(&c.params, param_index(OP_CONV_TRANSPOSE, "groups"), s.groups ? s.groups : 1);
  param_set_ints(&c.params, param_index(OP_CONV_TRANSPOSE, "output_padding"), s.outpad, 2);
  cuda_check_case(dev, &c);
}

static void test_conv_transpose(CudaDevice *dev) {
  ct_case(dev, (CtSpec){.label = "conv_transpose 1x4x7x5 k3 s2", S(4, 1, 4, 7, 5), S(4, 4, 3, 3, 3),
                        .stride = {2, 2}});
  ct_case(dev, (CtSpec){.label = "conv_transpose s2 pads 1 outpad 1 bias", S(4, 2, 4, 7, 5),
                        S(4, 4, 3, 3, 3), true, .stride = {2, 2}, .pads = {1, 1, 1, 1},
                        .outpad = {1, 1}});
  ct_case(dev, (CtSpec){.label = "conv_transpose s2 k4 pads 1 (upsample)", S(4, 1, 16, 14, 14),
                        S(4, 16, 8, 4, 4), true, .stride = {2, 2}, .pads = {1, 1, 1, 1}});
  ct_case(dev, (CtSpec){.label = "conv_transpose s2 pads(0 1 1 0) bias", S(4, 1, 3, 6, 7),
                        S(4, 3, 5, 3, 3), true, .stride = {2, 2}, .pads = {0, 1, 1, 0}});
  ct_case(dev, (CtSpec){.label = "conv_transpose s(2 3) outpad(1 2) pads(1 2 0 1)", S(4, 2, 3, 5, 4),
                        S(4, 3, 2, 3, 4), .stride = {2, 3}, .pads = {1, 2, 0, 1},
                        .outpad = {1, 2}});
  ct_case(dev, (CtSpec){.label = "conv_transpose s1 outpad 2 (past the stride) bias", S(4, 1, 2, 5, 5),
                        S(4, 2, 3, 3, 3), true, .outpad = {2, 2}});
  ct_case(dev, (CtSpec){.label = "conv_transpose groups=2", S(4, 2, 4, 6, 6), S(4, 4, 3, 3, 3),
                        .stride = {2, 2}, .pads = {1, 1, 1, 1}, .groups = 2});
  ct_case(dev, (CtSpec){.label = "conv_transpose depthwise groups=6 bias", S(4, 1, 6, 7, 9),
                        S(4, 6, 1, 3, 3), true, .stride = {2, 2}, .groups = 6});
  ct_case(dev, (CtSpec){.label = "conv_transpose dilation 2 pads 2", S(4, 1, 3, 9, 8), S(4, 3, 4, 3, 3),
                        .pads = {2, 2, 2, 2}, .dilation = {2, 2}});
  ct_case(dev, (CtSpec){.label = "conv_transpose 1x1 kernel", S(4, 2, 5, 3, 7), S(4, 5, 6, 1, 1)});
  ct_case(dev, (CtSpec){.label = "conv_transpose 1x1x1x1", S(4, 1, 1, 1, 1), S(4, 1, 1, 1, 1)});
  ct_case(dev, (CtSpec){.label = "conv_transpose 1x64x64x64 k2 s2 (large)", S(4, 1, 64, 64, 64),
                        S(4, 64, 64, 2, 2), true, .stride = {2, 2}});
}

/* ---- conv3d ---- */

typedef struct Conv3dSpec {
  const char *label;
  Shape x, w;
  bool bias;
  int64_t stride[3], pads[6], dilation[3], groups;
  int act;
  bool residual; /* a fourth input of the output's shape (with the bias) */
} Conv3dSpec;

static void conv3d_case(CudaDevice *dev, Conv3dSpec s) {
  Shape b = S(1, (int)s.w.d[0]), z = {5, {s.x.d[0], s.w.d[0]}};
  for (int a = 0; a < 3; a++) {
    int64_t st = s.stride[a] ? s.stride[a] : 1, dl = s.dilation[a] ? s.dilation[a] : 1;
    z.d[2 + a] = (s.x.d[2 + a] + s.pads[a] + s.pads[3 + a] - dl * (s.w.d[2 + a] - 1) - 1) / st + 1;
  }
  CudaCase c = cuda_case(s.label, OP_CONV3D, s.residual ? 4 : s.bias ? 3 : 2,
                         SHAPES(s.x, s.w, b, z));
  param_set_int(&c.params, param_index(OP_CONV3D, "act"), s.act);
  int64_t one[3] = {1, 1, 1};
  param_set_ints(&c.params, param_index(OP_CONV3D, "stride"), s.stride[0] ? s.stride : one, 3);
  param_set_ints(&c.params, param_index(OP_CONV3D, "pads"), s.pads, 6);
  param_set_ints(&c.params, param_index(OP_CONV3D, "dilation"), s.dilation[0] ? s.dilation : one,
                 3);
  param_set_int(&c.params, param_index(OP_CONV3D, "groups"), s.groups ? s.groups : 1);
  cuda_check_case(dev, &c);
}

static void test_conv3d(CudaDevice *dev) {
  conv3d_case(dev, (Conv3dSpec){.label = "conv3d 1x3x4x9x7 k3 bias", S(5, 1, 3, 4, 9, 7),
                                S(5, 5, 3, 3, 3, 3), true});
  conv3d_case(dev, (Conv3dSpec){.label = "conv3d s(1 2 2) pads 1 dilation(1 2 1)",
                                S(5, 2, 4, 5, 11, 8), S(5, 6, 4, 3, 3, 3), true,
                                .stride = {1, 2, 2}, .pads = {1, 1, 1, 1, 1, 1},
                                .dilation = {1, 2, 1}});
  conv3d_case(dev, (Conv3dSpec){.label = "conv3d groups=2 1x1x1", S(5, 1, 4, 3, 5, 5),
                                S(5, 6, 2, 1, 1, 1), .groups = 2});
  conv3d_case(dev, (Conv3dSpec){.label = "conv3d bias residual relu (R3D-18's block)",
                                S(5, 1, 8, 4, 14, 14), S(5, 8, 8, 3, 3, 3), true,
                                .pads = {1, 1, 1, 1, 1, 1}, .act = ACT_RELU, .residual = true});
  conv3d_case(dev, (Conv3dSpec){.label = "conv3d sigmoid", S(5, 1, 2, 3, 5, 4),
                                S(5, 3, 2, 2, 2, 2), .act = ACT_SIGMOID});
  conv3d_case(dev, (Conv3dSpec){.label = "conv3d R3D-18 stem 1x3x8x112x112 k(3 7 7)",
                                S(5, 1, 3, 8, 112, 112), S(5, 64, 3, 3, 7, 7), false,
                                .stride = {1, 2, 2}, .pads = {1, 3, 3, 1, 3, 3}});
}

/* ---- enlarge ---- */

static void enlarge_case(CudaDevice *dev, const char *label, Shape w, int64_t kh, int64_t kw) {
  CudaCase c = cuda_case(label, OP_ENLARGE, 1, SHAPES(w));
  param_set_int(&c.params, param_index(OP_ENLARGE, "kh"), kh);
  param_set_int(&c.params, param_index(OP_ENLARGE, "kw"), kw);
  cuda_check_case(dev, &c);
}

static void test_enlarge(CudaDevice *dev) {
  enlarge_case(dev, "enlarge 4x3x1x1 to 3x3", S(4, 4, 3, 1, 1), 3, 3);
  enlarge_case(dev, "enlarge 8x4x3x3 to 5x5", S(4, 8, 4, 3, 3), 5, 5);
  enlarge_case(dev, "enlarge 2x3x1x3 to 3x5", S(4, 2, 3, 1, 3), 3, 5);
  enlarge_case(dev, "enlarge 3x3x3x3 to 3x3 (same)", S(4, 3, 3, 3, 3), 3, 3);
  enlarge_case(dev, "enlarge 1x1x1x1 to 7x1", S(4, 1, 1, 1, 1), 7, 1);
  enlarge_case(dev, "enlarge 256x256x1x1 to 3x3 (large)", S(4, 256, 256, 1, 1), 3, 3);
}

/* ---- batchnorm ---- */

static void batchnorm_case(CudaDevice *dev, const char *label, Shape x, double eps, int act) {
  Shape p = S(1, (int)x.d[1]);
  CudaCase c = cuda_case(label, OP_BATCHNORM, 5, SHAPES(x, p, p, p, p));
  if (eps > 0) param_set_float(&c.params, param_index(OP_BATCHNORM, "epsilon"), eps);
  param_set_int(&c.params, param_index(OP_BATCHNORM, "act"), act);
  c.positive = true; /* the variance must be; the rest do not mind */
  cuda_check_case(dev, &c);
}

static void test_batchnorm(CudaDevice *dev) {
  batchnorm_case(dev, "batchnorm 1x3x7x5", S(4, 1, 3, 7, 5), 0, ACT_NONE);
  batchnorm_case(dev, "batchnorm 2x5x13x11 eps 1e-3", S(4, 2, 5, 13, 11), 1e-3, ACT_NONE);
  batchnorm_case(dev, "batchnorm 6x10 (2-D)", S(2, 6, 10), 0, ACT_NONE);
  batchnorm_case(dev, "batchnorm 2x3x17 (3-D)", S(3, 2, 3, 17), 0, ACT_NONE);
  batchnorm_case(dev, "batchnorm 1x1x1x1", S(4, 1, 1, 1, 1), 0, ACT_NONE);
  batchnorm_case(dev, "batchnorm 4x64x56x56 (large)", S(4, 4, 64, 56, 56), 0, ACT_NONE);
  batchnorm_case(dev, "batchnorm 300x300x1x1 (many planes)", S(4, 300, 300, 1, 1), 0, ACT_NONE);
  /* DenseNet's batchnorm + relu after a concat, in the kernel's pass; tanh after it */
  batchnorm_case(dev, "batchnorm 1x256x28x28 relu", S(4, 1, 256, 28, 28), 0, ACT_RELU);
  batchnorm_case(dev, "batchnorm 2x5x13x11 tanh", S(4, 2, 5, 13, 11), 1e-3, ACT_TANH);
  batchnorm_case(dev, "batchnorm 1x40x14x14 silu", S(4, 1, 40, 14, 14), 0, ACT_SILU);
  batchnorm_case(dev, "batchnorm 1x24x9x9 relu6", S(4, 1, 24, 9, 9), 0, ACT_RELU6);
}

/* ---- matmul ---- */

static CudaCase matmul_spec_case(const char *label, Shape a, Shape b, int act) {
  CudaCase c = cuda_case(label, OP_MATMUL, 2, SHAPES(a, b));
  param_set_int(&c.params, param_index(OP_MATMUL, "act"), act);
  return c;
}

static void matmul_case(CudaDevice *dev, const char *label, Shape a, Shape b, int act) {
  CudaCase c = matmul_spec_case(label, a, b, act);
  cuda_check_case(dev, &c);
}

static void test_matmul(CudaDevice *dev) {
  matmul_case(dev, "matmul [7,5]x[5,9]", S(2, 7, 5), S(2, 5, 9), ACT_NONE);
  matmul_case(dev, "matmul [1,1]x[1,1]", S(2, 1, 1), S(2, 1, 1), ACT_NONE);
  matmul_case(dev, "matmul [13,1]x[1,11] (k=1)", S(2, 13, 1), S(2, 1, 11), ACT_NONE);
  matmul_case(dev, "matmul [5]x[5,3] (1-D A)", S(1, 5), S(2, 5, 3), ACT_NONE);
  matmul_case(dev, "matmul [4,5]x[5] (1-D B)", S(2, 4, 5), S(1, 5), ACT_NONE);
  matmul_case(dev, "matmul [5]x[5] (both 1-D)", S(1, 5), S(1, 5), ACT_NONE);
  matmul_case(dev, "matmul [2,3,5,7]x[7,4] (tall)", S(4, 2, 3, 5, 7), S(2, 7, 4), ACT_NONE);
  matmul_case(dev, "matmul [2,3,5,7]x[7] (batched, 1-D B)", S(4, 2, 3, 5, 7), S(1, 7),
              ACT_NONE);
  matmul_case(dev, "matmul [7]x[2,3,7,4] (1-D A, batched B)", S(1, 7), S(4, 2, 3, 7, 4),
              ACT_NONE);
  matmul_case(dev, "matmul [5,7]x[2,3,7,4] (broadcast A)", S(2, 5, 7), S(4, 2, 3, 7, 4),
              ACT_NONE);
  matmul_case(dev, "matmul [2,1,5,7]x[3,7,4]", S(4, 2, 1, 5, 7), S(3, 3, 7, 4), ACT_NONE);
  matmul_case(dev, "matmul [2,3,5,7]x[2,3,7,4]", S(4, 2, 3, 5, 7), S(4, 2, 3, 7, 4), ACT_NONE);
  matmul_case(dev, "matmul [3,1,5,7]x[1,4,7,6]", S(4, 3, 1, 5, 7), S(4, 1, 4, 7, 6), ACT_NONE);
  matmul_case(dev, "matmul [1,4,5,7]x[3,1,7,6]", S(4, 1, 4, 5, 7), S(4, 3, 1, 7, 6), ACT_NONE);
  matmul_case(dev, "matmul [2,1,3,5,7]x[4,1,7,2]", S(5, 2, 1, 3, 5, 7), S(4, 4, 1, 7, 2),
              ACT_NONE);
  matmul_case(dev, "matmul [1,5,7]x[7,4] (batch 1)", S(3, 1, 5, 7), S(2, 7, 4), ACT_NONE);
  /* relu over one tall product is cuBLASLt's epilogue; batched, a second kernel. */
  matmul_case(dev, "matmul [7,5]x[5,9] relu", S(2, 7, 5), S(2, 5, 9), ACT_RELU);
  matmul_case(dev, "matmul [2,3,5,7]x[7,4] relu (tall)", S(4, 2, 3, 5, 7), S(2, 7, 4), ACT_RELU);
  matmul_case(dev, "matmul [64,1024]x[1024,4096] relu (BERT)", S(2, 64, 1024),
              S(2, 1024, 4096), ACT_RELU);
  matmul_case(dev, "matmul [2,3,5,7]x[2,3,7,4] relu (batched)", S(4, 2, 3, 5, 7),
              S(4, 2, 3, 7, 4), ACT_RELU);
  matmul_case(dev, "matmul [2,3,5,7]x[2,3,7,4] sigmoid", S(4, 2, 3, 5, 7), S(4, 2, 3, 7, 4),
              ACT_SIGMOID);
  matmul_case(dev, "matmul [5,7]x[2,3,7,4] tanh", S(2, 5, 7), S(4, 2, 3, 7, 4), ACT_TANH);
  matmul_case(dev, "matmul [5,7]x[7,9] silu", S(2, 5, 7), S(2, 7, 9), ACT_SILU);
  matmul_case(dev, "matmul [3,6]x[6,4] relu6", S(2, 3, 6), S(2, 6, 4), ACT_RELU6);
  matmul_case(dev, "matmul [1000,1000]x[1000,1000] (large)", S(2, 1000, 1000),
              S(2, 1000, 1000), ACT_NONE);
  matmul_case(dev, "matmul [8,128,64]x[8,64,128] (attention)", S(3, 8, 128, 64),
              S(3, 8, 64, 128), ACT_NONE);
}

/* The tall product's ways pinned, as the convolutions' above: whole, and
 * split along K with a relu, no activation and a sigmoid; a pin the
 * product does not offer fails. */
static void pinned_matmul_case(CudaDevice *dev, const char *way, const char *label, Shape a,
                               Shape b, int act) {
  CudaCase c = matmul_spec_case(label, a, b, act);
  cuda_device_pin_way(dev, way);
  cuda_check_case(dev, &c);
  check_way_ran(dev, &c, way);
  cuda_device_pin_way(dev, NULL);
}

static void test_matmul_ways(CudaDevice *dev) {
  pinned_matmul_case(dev, "cublas:gemm", "matmul [7,5]x[5,9] whole", S(2, 7, 5), S(2, 5, 9),
                     ACT_NONE);
  pinned_matmul_case(dev, "cublas:gemm split 4", "matmul [64,1024]x[1024,1024] relu split 4",
                     S(2, 64, 1024), S(2, 1024, 1024), ACT_RELU);
  pinned_matmul_case(dev, "cublas:gemm split 8", "matmul [3,512]x[512,1024] split 8",
                     S(2, 3, 512), S(2, 512, 1024), ACT_NONE);
  pinned_matmul_case(dev, "cublas:gemm split 4", "matmul [2,16,256]x[256,128] sigmoid split 4",
                     S(3, 2, 16, 256), S(2, 256, 128), ACT_SIGMOID);
  check_pin_refused(dev, OP_MATMUL, S(2, 7, 5), S(2, 5, 9), "cublas:gemm split 2" /* K = 5 */,
                    "cublas:gemm");
}

/* ---- gemm ---- */

static CudaCase gemm_spec_case(const char *label, Shape a, Shape b, const Shape *c, int ta,
                               int tb, double alpha, double beta, int act) {
  CudaCase k = cuda_case(label, OP_GEMM, c ? 3 : 2, SHAPES(a, b, c ? *c : a));
  param_set_int(&k.params, param_index(OP_GEMM, "transA"), ta);
  param_set_int(&k.params, param_index(OP_GEMM, "transB"), tb);
  param_set_float(&k.params, param_index(OP_GEMM, "alpha"), alpha);
  param_set_float(&k.params, param_index(OP_GEMM, "beta"), beta);
  param_set_int(&k.params, param_index(OP_GEMM, "act"), act);
  return k;
}

static void gemm_case(CudaDevice *dev, const char *label, Shape a, Shape b, const Shape *c,
                      int ta, int tb, double alpha, double beta) {
  CudaCase k = gemm_spec_case(label, a, b, c, ta, tb, alpha, beta, ACT_NONE);
  cuda_check_case(dev, &k);
}

/* A gemm with a bias C (one value per column) or a fused relu runs either
 * way, each pinned here: cuBLASLt with both in its epilogue, or C copied
 * into the output, cublasSgemm and the relu's pass. */
static void pinned_gemm_case(CudaDevice *dev, const char *way, const char *label, Shape a,
                             Shape b, const Shape *c, int ta, int tb, int act) {
  CudaCase k = gemm_spec_case(label, a, b, c, ta, tb, 1, 1, act);
  cuda_device_pin_way(dev, way);
  cuda_check_case(dev, &k);
  check_way_ran(dev, &k, way);
  cuda_device_pin_way(dev, NULL);
}

/* A gemm with a residual Z (a fourth input, of the result's shape):
 * Swin-T's second MLP layer, [196,1536] x [1536,384] with its bias, and a
 * small one with a relu, each way pinned (cuBLASLt reading Z as its C at
 * beta 1 and writing another output, or Z + C written first and
 * cublasSgemm over it), and one with alpha and beta only the plain way
 * takes. */
static void test_gemm_residual(CudaDevice *dev) {
  const struct {
    const char *way, *label;
    Shape a, b, c;
    int tb, act;
    double alpha, beta;
  } cases[] = {
    {"cublasLt:residual, bias epilogue", "gemm [196,1536]x[1536,384] C [N] Z (Swin-T's MLP)",
     S(2, 196, 1536), S(2, 1536, 384), S(1, 384), 0, ACT_NONE, 1, 1},
    {"cublas:gemm", "gemm [196,1536]x[1536,384] C [N] Z (plain)", S(2, 196, 1536),
     S(2, 1536, 384), S(1, 384), 0, ACT_NONE, 1, 1},
    {"cublasLt:residual, bias+relu epilogue", "gemm [7,5]x[9,5]^T C [N] Z relu", S(2, 7, 5),
     S(2, 9, 5), S(1, 9), 1, ACT_RELU, 1, 1},
    {"cublas:gemm", "gemm [7,5]x[9,5]^T C [N] Z relu (plain)", S(2, 7, 5), S(2, 9, 5), S(1, 9), 1,
     ACT_RELU, 1, 1},
    {NULL, "gemm [7,5]x[5,9] C [M,1] Z alpha 2 beta -3 tanh", S(2, 7, 5), S(2, 5, 9),
     S(2, 7, 1), 0, ACT_TANH, 2, -3},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    Shape y = S(2, cases[i].a.d[0], cases[i].tb ? cases[i].b.d[0] : cases[i].b.d[1]);
    CudaCase k = gemm_spec_case(cases[i].label, cases[i].a, cases[i].b, &cases[i].c, 0,
                                cases[i].tb, cases[i].alpha, cases[i].beta, cases[i].act);
    k.n_in = 4;
    k.in[3] = y;
    if (cases[i].way) cuda_device_pin_way(dev, cases[i].way);
    cuda_check_case(dev, &k);
    if (cases[i].way) {
      check_way_ran(dev, &k, cases[i].way);
      cuda_device_pin_way(dev, NULL);
    }
  }
}

static void test_gemm(CudaDevice *dev) {
  Shape a = S(2, 7, 5), at = S(2, 5, 7), b = S(2, 5, 9), bt = S(2, 9, 5);
  Shape c_n = S(1, 9), c_mn = S(2, 7, 9), c_scalar = S(0), c_1 = S(1, 1), c_m1 = S(2, 7, 1),
        c_1n = S(2, 1, 9);
  gemm_case(dev, "gemm [7,5]x[5,9] no C", a, b, NULL, 0, 0, 1, 1);
  gemm_case(dev, "gemm transA", at, b, NULL, 1, 0, 1, 1);
  gemm_case(dev, "gemm transB", a, bt, NULL, 0, 1, 1, 1);
  gemm_case(dev, "gemm transA transB", at, bt, NULL, 1, 1, 1, 1);
  gemm_case(dev, "gemm C [N]", a, b, &c_n, 0, 0, 1, 1);
  gemm_case(dev, "gemm C [M,N] alpha 0.5 beta 2", a, b, &c_mn, 0, 0, 0.5, 2);
  gemm_case(dev, "gemm C scalar transB alpha -1.5", a, bt, &c_scalar, 0, 1, -1.5, 1);
  gemm_case(dev, "gemm C [1] transA beta 0.25", at, b, &c_1, 1, 0, 1, 0.25);
  gemm_case(dev, "gemm C [M,1] transA transB", at, bt, &c_m1, 1, 1, 2, 3);
  gemm_case(dev, "gemm C [1,N]", a, b, &c_1n, 0, 0, 1, 1);
  gemm_case(dev, "gemm C [M,N] beta 0 (C ignored)", a, b, &c_mn, 0, 0, 1, 0);
  gemm_case(dev, "gemm [1,1]x[1,1] C [1]", S(2, 1, 1), S(2, 1, 1), &c_1, 0, 0, 1, 1);
  Shape big_c = S(1, 1024);
  gemm_case(dev, "gemm [1000,512]x[1024,512]^T C [N] (large)", S(2, 1000, 512), S(2, 1024, 512),
            &big_c, 0, 1, 1, 1);
  /* Fused activations, each way as the device chooses. */
  CudaCase k = gemm_spec_case("gemm C [N] transB relu", a, bt, &c_n, 0, 1, 1, 1, ACT_RELU);
  cuda_check_case(dev, &k);
  k = gemm_spec_case("gemm C [M,N] relu (not a bias)", a, b, &c_mn, 0, 0, 1, 1, ACT_RELU);
  cuda_check_case(dev, &k);
  k = gemm_spec_case("gemm C [N] alpha 2 relu", a, b, &c_n, 0, 0, 2, 1, ACT_RELU);
  cuda_check_case(dev, &k);
  k = gemm_spec_case("gemm transA sigmoid", at, b, NULL, 1, 0, 1, 1, ACT_SIGMOID);
  cuda_check_case(dev, &k);
  /* Pinned: VGG's classifier at batch 1 (a row times B^T, its bias and
   * relu), the transposed layouts, a bias alone and a relu alone. */
  Shape vgg_c = S(1, 1024), row = S(2, 1, 4096), w = S(2, 1024, 4096);
  pinned_gemm_case(dev, "cublasLt:bias+relu epilogue", "gemm [1,4096]x[1024,4096]^T C relu",
                   row, w, &vgg_c, 0, 1, ACT_RELU);
  pinned_gemm_case(dev, "cublas:gemm", "gemm [1,4096]x[1024,4096]^T C relu (plain)", row, w,
                   &vgg_c, 0, 1, ACT_RELU);
  pinned_gemm_case(dev, "cublasLt:bias+relu epilogue", "gemm transA transB C [1,N] relu", at, bt,
                   &c_1n, 1, 1, ACT_RELU);
  pinned_gemm_case(dev, "cublasLt:bias epilogue", "gemm transA C [N]", at, b, &c_n, 1, 0,
                   ACT_NONE);
  pinned_gemm_case(dev, "cublasLt:relu epilogue", "gemm no C relu", a, b, NULL, 0, 0, ACT_RELU);
  test_gemm_residual(dev);
}

/* Attention as BERT's search leaves it: the heads-first transpose, its
 * split and K's keys-last transpose read by the matmuls' strides, the
 * transpose back to tokens written by the values' product; four steps
 * (the three products and the softmax), outputs as the CPU's. With K's
 * transpose also an output, everything before it is a kernel. */
static void test_strided_attention(CudaDevice *dev) {
  diag_init(&D);
  const struct {
    int s, h, w;
    bool relu_k;
    int steps;
  } cases[] = {{64, 16, 64, false, 4}, {197, 12, 64, false, 4}, {10, 2, 4, true, 7}};
  for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
    Attention a = attention(cases[c].s, cases[c].h, cases[c].w, cases[c].relu_k);
    char label[64];
    snprintf(label, sizeof label, "attention s=%d h=%d w=%d%s", cases[c].s, cases[c].h,
             cases[c].w, cases[c].relu_k ? " K read" : "");
    cuda_check_seeds(dev, a.g, false, 1e-4, label);
    CudaPlan *plan = NULL;
    Diag d;
    diag_init(&d);
    int rc = cuda_plan_new(dev, a.g, &plan, &d);
    CHECK_MSG(rc == TEQ_OK && cuda_plan_n_steps(plan) == cases[c].steps, "%s: %d steps, not %d %s",
              label, rc == TEQ_OK ? cuda_plan_n_steps(plan) : -1, cases[c].steps,
              d.text ? d.text : "");
    cuda_plan_free(plan);
    diag_fini(&d);
    graph_free(a.g);
  }
  /* Swin-T's first stage: 64 windows of 49 tokens, 3 heads of 32; its
   * products over arrays of pointers (cublasSgemmBatched). */
  Attention a = windowed_attention(64, 49, 3, 32);
  cuda_check_seeds(dev, a.g, false, 1e-4, "windowed attention 64x49, 3 heads");
  CudaPlan *plan = NULL;
  Diag d;
  diag_init(&d);
  int rc = cuda_plan_new(dev, a.g, &plan, &d);
  CHECK_MSG(rc == TEQ_OK && cuda_plan_n_steps(plan) == 3, "windowed attention: %d steps, not 3 %s",
            rc == TEQ_OK ? cuda_plan_n_steps(plan) : -1, d.text ? d.text : "");
  cuda_plan_free(plan);
  diag_fini(&d);
  graph_free(a.g);
  /* MaxViT-T's first stage: 64 windows of 49 tokens, 2 heads of 32; Q, K
   * and V slices of one product, read through its rows' stride. */
  a = sliced_attention(64, 49, 2, 32);
  cuda_check_seeds(dev, a.g, false, 1e-4, "sliced attention 64x49, 2 heads");
  diag_init(&d);
  rc = cuda_plan_new(dev, a.g, &plan, &d);
  CHECK_MSG(rc == TEQ_OK && cuda_plan_n_steps(plan) == 4, "sliced attention: %d steps, not 4 %s",
            rc == TEQ_OK ? cuda_plan_n_steps(plan) : -1, d.text ? d.text : "");
  cuda_plan_free(plan);
  diag_fini(&d);
  graph_free(a.g);
  diag_fini(&D);
}

int main(void) {
  CudaDevice *dev = cuda_check_open();
  test_strided_attention(dev);
  test_conv2d(dev);
  test_conv2d_ways(dev);
  test_conv3d(dev);
  test_conv_transpose(dev);
  test_enlarge(dev);
  test_batchnorm(dev);
  test_matmul(dev);
  test_matmul_ways(dev);
  test_gemm(dev);
  cuda_device_close(dev);
  return check_exit();
}
