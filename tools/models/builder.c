/* builder.c: the helpers every model builder in tools/models/ uses: one call
 * per layer (a convolution with its weights, a linear layer, a reshape...)
 * on top of graph_add_node. The first failure is kept in b->rc and every
 * later call returns at once, so builders check once at the end; the
 * graph's own message is already in b->d. Weights draw consecutive seeds
 * from b->seed, so the order of calls fixes every value. */
#include <math.h>

#include "tools/models/models.h"

TensorRef builder_ref(int id) { return (TensorRef){id, 0}; }

/* Records a negative id as the builder's error; node 0 stands in for it. */
static TensorRef checked(Builder *b, int id) {
  if (id < 0) b->rc = id;
  return builder_ref(id < 0 ? 0 : id);
}

TensorRef builder_input(Builder *b, const char *name, Shape s) {
  if (b->rc) return builder_ref(0);
  return checked(b, graph_add_input(b->g, name, &s, DT_F32, b->d));
}

TensorRef builder_node(Builder *b, OpKind kind, const TensorRef *in, int n_in, const Params *p) {
  if (b->rc) return builder_ref(0);
  return checked(b, graph_add_node(b->g, kind, in, n_in, 1, p, NULL, b->d));
}

TensorRef builder_weight_gain(Builder *b, Shape s, int64_t fan_in, double gain) {
  if (b->rc) return builder_ref(0);
  Tensor *t = tensor_new(DT_F32, &s);
  if (!t) {
    b->rc = TEQ_ERR_NOMEM;
    return builder_ref(0);
  }
  tensor_fill_random(t, b->seed++);
  float scale = (float)(gain / sqrt((double)fan_in));
  for (int64_t i = 0; i < tensor_numel(t); i++) ((float *)t->data)[i] *= scale;
  return checked(b, graph_add_const(b->g, NULL, t, b->d));
}

TensorRef builder_weight(Builder *b, Shape s, int64_t fan_in) {
  return builder_weight_gain(b, s, fan_in, 1.0);
}

TensorRef builder_scalar(Builder *b, float v) {
  if (b->rc) return builder_ref(0);
  Shape s = shape_of(1, 1);
  Tensor *t = tensor_new(DT_F32, &s);
  if (!t) {
    b->rc = TEQ_ERR_NOMEM;
    return builder_ref(0);
  }
  ((float *)t->data)[0] = v;
  return checked(b, graph_add_const(b->g, NULL, t, b->d));
}

TensorRef builder_unary(Builder *b, OpKind kind, TensorRef x) {
  return builder_node(b, kind, &x, 1, NULL);
}

TensorRef builder_binary(Builder *b, OpKind kind, TensorRef x, TensorRef y) {
  TensorRef in[2] = {x, y};
  return builder_node(b, kind, in, 2, NULL);
}

int64_t builder_dim(const Builder *b, TensorRef x, int i) {
  return b->rc ? 0 : graph_shape(b->g, x)->d[i];
}

/* Parameters a plain conv leaves at their defaults are not set, so a
 * tiny-cnn conv has the very Params it had before ConvSpec existed. */
static void conv_params(const ConvSpec *c, Params *p) {
  params_default(OP_CONV2D, p);
  int64_t pad = (int64_t)c->dilation * (c->k - 1) / 2;
  int64_t strides[2] = {c->stride, c->stride}, pads[4] = {pad, pad, pad, pad};
  param_set_ints(p, param_index(OP_CONV2D, "stride"), strides, 2);
  param_set_ints(p, param_index(OP_CONV2D, "pads"), pads, 4);
  if (c->dilation != 1) {
    int64_t dil[2] = {c->dilation, c->dilation};
    param_set_ints(p, param_index(OP_CONV2D, "dilation"), dil, 2);
  }
  if (c->groups != 1) param_set_int(p, param_index(OP_CONV2D, "groups"), c->groups);
  param_set_int(p, param_index(OP_CONV2D, "act"), c->act);
}

TensorRef builder_conv(Builder *b, TensorRef x, const ConvSpec *c) {
  if (b->rc) return x;
  int64_t in_per_group = builder_dim(b, x, 1) / c->groups;
  int64_t fan_in = in_per_group * c->k * c->k;
  TensorRef in[3] = {x};
  in[1] = builder_weight_gain(b, shape_of(4, (int)c->out_ch, (int)in_per_group, c->k, c->k),
                              fan_in, c->gain);
  if (c->has_bias) in[2] = builder_weight_gain(b, shape_of(1, (int)c->out_ch), fan_in, c->gain);
  Params p;
  conv_params(c, &p);
  return builder_node(b, OP_CONV2D, in, c->has_bias ? 3 : 2, &p);
}

TensorRef builder_linear(Builder *b, TensorRef x, int64_t out, double gain) {
  if (b->rc) return x;
  const Shape *s = graph_shape(b->g, x);
  int64_t in = s->d[s->ndim - 1];
  TensorRef w = builder_weight_gain(b, shape_of(2, (int)in, (int)out), in, gain);
  return builder_binary(b, OP_MATMUL, x, w);
}

TensorRef builder_reshape(Builder *b, TensorRef x, const int64_t *dims, int n) {
  Params p;
  params_default(OP_RESHAPE, &p);
  param_set_ints(&p, param_index(OP_RESHAPE, "shape"), dims, n);
  return builder_node(b, OP_RESHAPE, &x, 1, &p);
}

TensorRef builder_transpose(Builder *b, TensorRef x, const int64_t *perm, int n) {
  Params p;
  params_default(OP_TRANSPOSE, &p);
  param_set_ints(&p, param_index(OP_TRANSPOSE, "perm"), perm, n);
  return builder_node(b, OP_TRANSPOSE, &x, 1, &p);
}

TensorRef builder_concat(Builder *b, const TensorRef *xs, int n, int axis) {
  Params p;
  params_default(OP_CONCAT, &p);
  param_set_int(&p, param_index(OP_CONCAT, "axis"), axis);
  return builder_node(b, OP_CONCAT, xs, n, &p);
}

TensorRef builder_pool(Builder *b, OpKind kind, TensorRef x, int k, int stride, int pad) {
  Params p;
  params_default(kind, &p);
  int64_t ks[2] = {k, k}, ss[2] = {stride, stride}, ps[4] = {pad, pad, pad, pad};
  param_set_ints(&p, param_index(kind, "kernel"), ks, 2);
  param_set_ints(&p, param_index(kind, "stride"), ss, 2);
  if (pad) param_set_ints(&p, param_index(kind, "pads"), ps, 4);
  return builder_node(b, kind, &x, 1, &p);
}

TensorRef builder_softmax(Builder *b, TensorRef x, int axis) {
  Params p;
  params_default(OP_SOFTMAX, &p);
  param_set_int(&p, param_index(OP_SOFTMAX, "axis"), axis);
  return builder_node(b, OP_SOFTMAX, &x, 1, &p);
}

int builder_output(Builder *b, TensorRef x, const char *name) {
  if (b->rc) return b->rc;
  if (graph_add_output(b->g, x, name, b->d) < 0) b->rc = TEQ_ERR_INPUT;
  return b->rc;
}
