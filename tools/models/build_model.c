/* build_model.c: the `build-model` command, Teq's own model builders.
 * Models that torchvision does not have (and the small built-in model the
 * README's main job runs) are built here through the graph API with seeded
 * random weights and written with the runtime's ONNX exporter, so they are
 * deterministic and need nothing beyond Teq itself. torchvision's models
 * are exported by tools/models/export_torchvision.py instead.
 *
 *   build-model [--seed S] [--list] NAME OUT.onnx */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/graph.h"
#include "runtime/onnx.h"

/* A builder: the graph under construction, the seed of the next weight and
 * the first error (later calls do nothing once one has failed). */
typedef struct Builder {
  Graph *g;
  Diag *d;
  uint64_t seed;
  int rc;
} Builder;

static TensorRef ref(int id) { return (TensorRef){id, 0}; }

static TensorRef add_node(Builder *b, OpKind kind, const TensorRef *in, int n_in, const Params *p) {
  if (b->rc) return ref(0);
  int id = graph_add_node(b->g, kind, in, n_in, 1, p, NULL, b->d);
  if (id < 0) b->rc = id;
  return ref(id < 0 ? 0 : id);
}

/* A weight of the given shape, uniform in [-s, s] with s = 1/sqrt(fan_in)
 * so activations keep their scale through deep models. */
static TensorRef weight(Builder *b, Shape s, int64_t fan_in) {
  if (b->rc) return ref(0);
  Tensor *t = tensor_new(DT_F32, &s);
  if (!t) {
    b->rc = TEQ_ERR_NOMEM;
    return ref(0);
  }
  tensor_fill_random(t, b->seed++);
  float scale = (float)(1.0 / sqrt((double)fan_in));
  for (int64_t i = 0; i < tensor_numel(t); i++) ((float *)t->data)[i] *= scale;
  int id = graph_add_const(b->g, NULL, t, b->d);
  if (id < 0) b->rc = id;
  return ref(id < 0 ? 0 : id);
}

static TensorRef conv(Builder *b, TensorRef x, int64_t out_ch, int k, int stride, int act) {
  if (b->rc) return x;
  int64_t in_ch = graph_shape(b->g, x)->d[1];
  TensorRef in[3] = {x, weight(b, shape_of(4, (int)out_ch, (int)in_ch, k, k), in_ch * k * k),
                     weight(b, shape_of(1, (int)out_ch), in_ch * k * k)};
  Params p;
  params_default(OP_CONV2D, &p);
  int64_t strides[2] = {stride, stride}, pads[4] = {k / 2, k / 2, k / 2, k / 2};
  param_set_ints(&p, param_index(OP_CONV2D, "stride"), strides, 2);
  param_set_ints(&p, param_index(OP_CONV2D, "pads"), pads, 4);
  param_set_int(&p, param_index(OP_CONV2D, "act"), act);
  return add_node(b, OP_CONV2D, in, 3, &p);
}

static TensorRef unary(Builder *b, OpKind kind, TensorRef x) { return add_node(b, kind, &x, 1, NULL); }

static TensorRef binary(Builder *b, OpKind kind, TensorRef x, TensorRef y) {
  TensorRef in[2] = {x, y};
  return add_node(b, kind, in, 2, NULL);
}

/* A small residual CNN classifier on 1x3x32x32: conv, residual blocks with
 * fused and separate activations, max pooling, a 1x1 conv, global average
 * pooling, a reshape and a Gemm. It exercises every operator family the
 * optimizer rewrites while running in milliseconds. */
static int build_tiny_cnn(Builder *b) {
  Shape in = shape_of(4, 1, 3, 32, 32);
  int x = graph_add_input(b->g, "image", &in, DT_F32, b->d);
  if (x < 0) return x;
  TensorRef h = conv(b, ref(x), 16, 3, 1, ACT_RELU);
  for (int block = 0; block < 2; block++) {
    TensorRef r = conv(b, h, 16, 3, 1, ACT_RELU);
    r = conv(b, r, 16, 3, 1, ACT_NONE);
    h = unary(b, OP_RELU, binary(b, OP_EWADD, h, r));
  }
  Params mp;
  params_default(OP_MAXPOOL, &mp);
  int64_t two[2] = {2, 2};
  param_set_ints(&mp, param_index(OP_MAXPOOL, "kernel"), two, 2);
  param_set_ints(&mp, param_index(OP_MAXPOOL, "stride"), two, 2);
  h = add_node(b, OP_MAXPOOL, &h, 1, &mp);
  h = conv(b, h, 32, 1, 1, ACT_RELU);
  h = conv(b, h, 32, 3, 2, ACT_RELU);
  h = add_node(b, OP_GLOBAL_AVGPOOL, &h, 1, NULL);
  Params rp;
  params_default(OP_RESHAPE, &rp);
  int64_t flat[2] = {1, 32};
  param_set_ints(&rp, param_index(OP_RESHAPE, "shape"), flat, 2);
  h = add_node(b, OP_RESHAPE, &h, 1, &rp);
  TensorRef gin[3] = {h, weight(b, shape_of(2, 32, 10), 32), weight(b, shape_of(1, 10), 32)};
  h = add_node(b, OP_GEMM, gin, 3, NULL);
  h = unary(b, OP_SOFTMAX, h);
  if (b->rc) return b->rc;
  return graph_add_output(b->g, h, "probabilities", b->d) < 0 ? TEQ_ERR_INPUT : TEQ_OK;
}

typedef struct ModelRow {
  const char *name;
  int (*build)(Builder *b);
  const char *what;
} ModelRow;

static const ModelRow models[] = {
  {"tiny-cnn", build_tiny_cnn, "residual CNN, 1x3x32x32 -> 10 classes (the built-in default)"},
};

static int usage(void) {
  fprintf(stderr, "usage: build-model [--seed S] [--list] NAME OUT.onnx\n");
  return 2;
}

int main(int argc, char **argv) {
  uint64_t seed = 0;
  const char *name = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--list") == 0) {
      for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        printf("%-12s %s\n", models[m].name, models[m].what);
      return 0;
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      char *end;
      seed = strtoull(argv[++i], &end, 10);
      if (*end) return usage();
    } else if (argv[i][0] == '-') {
      return usage();
    } else if (!name) {
      name = argv[i];
    } else if (!out) {
      out = argv[i];
    } else {
      return usage();
    }
  }
  if (!name || !out) return usage();
  const ModelRow *row = NULL;
  for (size_t m = 0; m < sizeof models / sizeof *models; m++)
    if (strcmp(models[m].name, name) == 0) row = &models[m];
  if (!row) {
    fprintf(stderr, "build-model: unknown model '%s' (--list shows them)\n", name);
    return 2;
  }
  Diag d;
  diag_init(&d);
  Builder b = {.g = graph_new(), .d = &d, .seed = seed * 1000003u + 1};
  int rc = b.g ? row->build(&b) : TEQ_ERR_NOMEM;
  if (!rc) rc = onnx_export_file(b.g, out, &d);
  diag_flush(&d, stderr);
  if (!rc) fprintf(stderr, "build-model: wrote %s (%d operators)\n", out, graph_count_ops(b.g));
  graph_free(b.g);
  diag_fini(&d);
  return teq_exit_status(rc);
}
