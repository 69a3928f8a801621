/* models.h: internal to tools/models: the Builder through which the
 * build-model command assembles benchmark graphs, and one entry point per
 * model. A Builder keeps the first error and turns every later call into a
 * no-op, so a model reads as straight-line code with one check at the end.
 * Weights are seeded in creation order, which makes a model a pure function
 * of its seed. The command itself (options, the model table) is in
 * build_model.c; each model lives in its own file. */
#ifndef TEQ_TOOLS_MODELS_H
#define TEQ_TOOLS_MODELS_H

#include <stdbool.h>
#include <stdint.h>

#include "runtime/graph.h"

/* Scales for builder_weight_gain. tensor_fill_random is uniform in [-1, 1),
 * variance 1/3: gain sqrt(3) gives weights of variance 1/fan_in, which keeps
 * a linear layer's output variance equal to its input's (LeCun); sqrt(6)
 * also makes up for the half that a following relu zeroes (He). Deep chains
 * without residuals need them: at gain 1 each relu layer divides the mean
 * square by 6, and CSRNet's 17 layers would end near 1e-13. */
#define BUILDER_GAIN_LINEAR 1.7320508075688772
#define BUILDER_GAIN_RELU 2.4494897427831781

/* The graph under construction, the seed of the next weight and the first
 * error (later calls do nothing once one has failed). */
typedef struct Builder {
  Graph *g;
  Diag *d;
  uint64_t seed;
  int rc;
  /* How many times over a model builds its repeated unit (NasRNN's steps,
   * BERT's layers, NasNet-A's normal cells per stage): 1 is the model as
   * published; larger ones make the long graphs on which the search's time
   * is seen to grow with the model (tools/bench/bench_scaling.py). */
  int scale;
} Builder;

/* A convolution: square kernel, "same" padding (dilation * (k - 1) / 2 on
 * each side), optional bias, fused activation and weight gain. */
typedef struct ConvSpec {
  int64_t out_ch;
  int k, stride, dilation, groups;
  int act;       /* ACT_NONE, ACT_RELU, ... */
  bool has_bias;
  double gain;   /* weight scale times 1/sqrt(fan_in) */
} ConvSpec;

/* ---- nodes (each returns input 0, or ref 0, once the builder has failed) ---- */
TensorRef builder_ref(int id);
TensorRef builder_input(Builder *b, const char *name, Shape s);
TensorRef builder_node(Builder *b, OpKind kind, const TensorRef *in, int n_in, const Params *p);
/* A constant of shape s, uniform in [-s, s] with s = gain / sqrt(fan_in). */
TensorRef builder_weight_gain(Builder *b, Shape s, int64_t fan_in, double gain);
TensorRef builder_weight(Builder *b, Shape s, int64_t fan_in);
/* A one-element constant [1] holding v (the scale of smul). */
TensorRef builder_scalar(Builder *b, float v);
TensorRef builder_unary(Builder *b, OpKind kind, TensorRef x);
TensorRef builder_binary(Builder *b, OpKind kind, TensorRef x, TensorRef y);
TensorRef builder_conv(Builder *b, TensorRef x, const ConvSpec *c);
/* x [.., in] times a new weight [in, out] with the given gain. */
TensorRef builder_linear(Builder *b, TensorRef x, int64_t out, double gain);
TensorRef builder_reshape(Builder *b, TensorRef x, const int64_t *dims, int n);
TensorRef builder_transpose(Builder *b, TensorRef x, const int64_t *perm, int n);
TensorRef builder_concat(Builder *b, const TensorRef *xs, int n, int axis);
/* Square k x k pooling (OP_MAXPOOL or OP_AVGPOOL) with pads `pad`. */
TensorRef builder_pool(Builder *b, OpKind kind, TensorRef x, int k, int stride, int pad);
TensorRef builder_softmax(Builder *b, TensorRef x, int axis);
/* Marks x as a graph output; returns b->rc (TEQ_OK if all went well). */
int builder_output(Builder *b, TensorRef x, const char *name);
/* Extent i of x's shape (0 once the builder has failed). */
int64_t builder_dim(const Builder *b, TensorRef x, int i);

/* ---- models: each builds one whole graph into b and returns b->rc ---- */
int bert_build(Builder *b);
int nasrnn_build(Builder *b);
int nasneta_build(Builder *b);
int csrnet_build(Builder *b);

#endif
