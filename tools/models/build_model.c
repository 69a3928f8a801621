/* build_model.c: the `build-model` command, Teq's own model builders.
 * Models that torchvision does not have (TASO's NasRNN is the README main
 * job's built-in model; tiny-cnn is the tests' small one) are built here
 * through the graph API with seeded random weights and written with the
 * runtime's ONNX exporter, so they are deterministic and need nothing
 * beyond Teq itself. This file holds the command, its model table and
 * tiny-cnn; the layer helpers are in builder.c and each benchmark model
 * (TASO's bert, nasrnn, nasneta, and csrnet) in its own file.
 * torchvision's models are exported by tools/models/export_torchvision.py
 * instead.
 *
 *   build-model [--seed S] [--scale K] [--list] NAME OUT.onnx */
#include <stdlib.h>
#include <string.h>

#include "runtime/onnx.h"
#include "tools/models/models.h"

/* tiny-cnn's convolution: bias, "same" padding, no gain (its weights
 * predate the gains; keeping them keeps its output byte-identical). */
static TensorRef conv(Builder *b, TensorRef x, int64_t out_ch, int k, int stride, int act) {
  ConvSpec c = {.out_ch = out_ch, .k = k, .stride = stride, .dilation = 1, .groups = 1,
                .act = act, .has_bias = true, .gain = 1.0};
  return builder_conv(b, x, &c);
}

/* A small residual CNN classifier on 1x3x32x32: conv, residual blocks with
 * fused and separate activations, max pooling, a 1x1 conv, global average
 * pooling, a reshape and a Gemm. It exercises every operator family the
 * optimizer rewrites while running in milliseconds. */
static int build_tiny_cnn(Builder *b) {
  TensorRef h = builder_input(b, "image", shape_of(4, 1, 3, 32, 32));
  h = conv(b, h, 16, 3, 1, ACT_RELU);
  for (int block = 0; block < 2; block++) {
    TensorRef r = conv(b, h, 16, 3, 1, ACT_RELU);
    r = conv(b, r, 16, 3, 1, ACT_NONE);
    h = builder_unary(b, OP_RELU, builder_binary(b, OP_EWADD, h, r));
  }
  h = builder_pool(b, OP_MAXPOOL, h, 2, 2, 0);
  h = conv(b, h, 32, 1, 1, ACT_RELU);
  h = conv(b, h, 32, 3, 2, ACT_RELU);
  h = builder_node(b, OP_GLOBAL_AVGPOOL, &h, 1, NULL);
  h = builder_reshape(b, h, (const int64_t[]){1, 32}, 2);
  TensorRef gin[3] = {h};
  gin[1] = builder_weight(b, shape_of(2, 32, 10), 32);
  gin[2] = builder_weight(b, shape_of(1, 10), 32);
  h = builder_node(b, OP_GEMM, gin, 3, NULL);
  h = builder_unary(b, OP_SOFTMAX, h);
  return builder_output(b, h, "probabilities");
}

/* BERT at scale 64 would hold 24 GB of weights. */
enum { SCALE_MAX = 64 };

typedef struct ModelRow {
  const char *name;
  int (*build)(Builder *b);
  const char *what;
  const char *unit; /* what --scale repeats, or NULL: the model has no such unit */
} ModelRow;

static const ModelRow models[] = {
  {"tiny-cnn", build_tiny_cnn, "residual CNN, 1x3x32x32 -> 10 classes (the tests' small model)",
   NULL},
  {"bert", bert_build, "BERT encoder as in TASO: 8 layers, seq 64, hidden 1024, 16 heads",
   "layers"},
  {"nasrnn", nasrnn_build,
   "NAS-RNN cell as in TASO: 5 steps of 5x[1,512], hidden 512 (the built-in default)", "steps"},
  {"nasneta", nasneta_build, "NasNet-A (mobile, TASO's cells), 1x3x224x224 -> 1000 logits",
   "normal cells"},
  {"csrnet", csrnet_build, "CSRNet: VGG-16 front + dilated back end, 1x3x224x224 -> 1x1x28x28",
   NULL},
};

static int usage(void) {
  fprintf(stderr, "usage: build-model [--seed S] [--scale K] [--list] NAME OUT.onnx\n"
                  "  --scale K  K times the model's repeated unit (--list names it), 1 to %d\n",
          SCALE_MAX);
  return 2;
}

int main(int argc, char **argv) {
  uint64_t seed = 0;
  int scale = 1;
  const char *name = NULL, *out = NULL;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--list") == 0) {
      for (size_t m = 0; m < sizeof models / sizeof *models; m++)
        printf("%-12s %s%s%s%s\n", models[m].name, models[m].what,
               models[m].unit ? " (--scale: " : "", models[m].unit ? models[m].unit : "",
               models[m].unit ? ")" : "");
      return 0;
    } else if (strcmp(argv[i], "--seed") == 0 && i + 1 < argc) {
      char *end;
      seed = strtoull(argv[++i], &end, 10);
      if (*end) return usage();
    } else if (strcmp(argv[i], "--scale") == 0 && i + 1 < argc) {
      char *end;
      long v = strtol(argv[++i], &end, 10);
      if (*end || end == argv[i] || v < 1 || v > SCALE_MAX) {
        fprintf(stderr, "build-model: --scale '%s': expected a whole number from 1 to %d\n",
                argv[i], SCALE_MAX);
        return 2;
      }
      scale = (int)v;
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
  if (scale > 1 && !row->unit) {
    fprintf(stderr, "build-model: %s has no repeated unit to scale (--list shows which do)\n",
            name);
    return 2;
  }
  Diag d;
  diag_init(&d);
  Builder b = {.g = graph_new(), .d = &d, .seed = seed * 1000003u + 1, .scale = scale};
  int rc = b.g ? row->build(&b) : TEQ_ERR_NOMEM;
  if (!rc) rc = onnx_export_file(b.g, out, NULL, &d);
  diag_flush(&d, stderr);
  if (!rc) fprintf(stderr, "build-model: wrote %s (%d operators)\n", out, graph_count_ops(b.g));
  graph_free(b.g);
  diag_fini(&d);
  return teq_exit_status(rc);
}
