/* test_norm.c: the normalization rows (runtime/ops/norm.c), called directly
 * through the registry: layer_norm over every axis, with scales and biases
 * of the normalized shape or broadcast to it, instance_norm (ONNX's
 * example) and lrn (odd and even windows) against references in double;
 * the Z_p kernels against their formulas, with parameters changing the
 * map; the messages of shape inference; instance_norm and lrn through an
 * ONNX export and import; and LayerNormalization imported from opset-17
 * models encoded here, including the forms Teq refuses. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/exec.h"
#include "runtime/graph.h"
#include "runtime/modp.h"
#include "runtime/onnx.h"
#include "runtime/ops.h"
#include "tests/tensor_check.h"

static Params layer_norm_params(int64_t axis, double eps) {
  Params p;
  params_default(OP_LAYER_NORM, &p);
  param_set_int(&p, param_index(OP_LAYER_NORM, "axis"), axis);
  param_set_float(&p, param_index(OP_LAYER_NORM, "epsilon"), eps);
  return p;
}

/* ---- layer_norm ---- */

/* Reference: rows of x from axis on, standardized in double, then times
 * scale plus bias (NULL: none), both broadcast to x's shape. */
static void reference_layer_norm(const Tensor *x, const Tensor *scale, const Tensor *bias,
                                 int axis, double eps, double *ref) {
  const Shape *s = &x->shape;
  int64_t len = 1, c[TEQ_MAX_DIMS] = {0};
  for (int k = axis; k < s->ndim; k++) len *= s->d[k];
  for (int64_t r = 0; r < tensor_numel(x) / len; r++) {
    double mean = 0, var = 0;
    for (int64_t j = 0; j < len; j++) mean += elem_f32(x, r * len + j);
    mean /= (double)len;
    for (int64_t j = 0; j < len; j++) var += pow(elem_f32(x, r * len + j) - mean, 2);
    var /= (double)len;
    for (int64_t j = 0; j < len; j++) {
      int64_t i = r * len + j;
      ref[i] = (elem_f32(x, i) - mean) / sqrt(var + eps) *
               elem_f32(scale, broadcast_index(&scale->shape, c, s->ndim));
      if (bias) ref[i] += elem_f32(bias, broadcast_index(&bias->shape, c, s->ndim));
      for (int k = s->ndim - 1; k >= 0 && ++c[k] == s->d[k]; k--) c[k] = 0;
    }
  }
}

static void check_layer_norm(Shape xs, int axis, Shape ss, bool with_bias, double eps) {
  Diag d;
  diag_init(&d);
  Tensor *in[3] = {random_f32(xs, 1), random_f32(ss, 2), with_bias ? random_f32(ss, 3) : NULL};
  for (int64_t i = 0; i < tensor_numel(in[0]); i++) ((float *)in[0]->data)[i] *= 1 + i % 7;
  Tensor *y = NULL;
  Params p = layer_norm_params(axis, eps);
  CHECK_EQ_INT(run_op(OP_LAYER_NORM, &p, in, with_bias ? 3 : 2, false, &y, &d), TEQ_OK);
  double *ref = malloc((size_t)tensor_numel(in[0]) * sizeof *ref);
  reference_layer_norm(in[0], in[1], in[2], axis, eps, ref);
  int64_t bad = 0;
  for (int64_t i = 0; y && i < tensor_numel(y); i++) bad += !close_to(elem_f32(y, i), ref[i], 1e-5);
  CHECK_MSG(y && bad == 0, "layer_norm axis %d: %lld wrong", axis, (long long)bad);
  free(ref);
  for (int i = 0; i < 3; i++) tensor_unref(in[i]);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_layer_norm(void) {
  Shape x3 = shape_of(3, 2, 3, 5), x4 = shape_of(4, 2, 3, 4, 5);
  check_layer_norm(x3, 0, x3, true, 1e-5);
  check_layer_norm(x3, 1, shape_of(2, 3, 5), true, 0.1);
  check_layer_norm(x3, 2, shape_of(1, 5), true, 1e-5);
  check_layer_norm(x3, 2, shape_of(1, 5), false, 1e-5);
  check_layer_norm(x4, 1, shape_of(3, 3, 4, 5), true, 1e-5);
  check_layer_norm(x4, 1, shape_of(2, 1, 5), true, 1e-5);  /* broadcast inside the rows */
  check_layer_norm(x4, 2, shape_of(3, 1, 1, 5), false, 1e-5); /* leading 1s */
  check_layer_norm(x4, 3, shape_of(0), true, 1e-5);        /* one scale for all */
}

/* y - bias = (x - mean) k scale with one k per row, k = s(var + t) from
 * the exact mean and variance and a t that depends on the parameters. */
static void check_one_k_per_row(const Tensor *x, const Tensor *scale, const Tensor *bias,
                                const Tensor *y, int64_t rows, int64_t len) {
  uint32_t inv = modp_inv((uint32_t)len);
  for (int64_t r = 0; r < rows; r++) {
    uint32_t sum = 0;
    for (int64_t j = 0; j < len; j++) sum = modp_add(sum, elem_modp(x, r * len + j));
    uint32_t mean = modp_mul(sum, inv);
    uint32_t k =
        modp_mul(modp_sub(elem_modp(y, r * len), elem_modp(bias, 0)),
                 modp_inv(modp_mul(modp_sub(elem_modp(x, r * len), mean), elem_modp(scale, 0))));
    for (int64_t j = 1; j < len; j++) {
      uint32_t z =
          modp_mul(modp_mul(modp_sub(elem_modp(x, r * len + j), mean), k), elem_modp(scale, j));
      CHECK_EQ_INT(elem_modp(y, r * len + j), modp_add(z, elem_modp(bias, j)));
    }
  }
}

/* Z_p: like float32, shifting a row by a constant changes nothing, since
 * the mean absorbs it and the variance stays; the same parameters give the
 * same map, another epsilon another one. */
static void test_layer_norm_modp(void) {
  Diag d;
  diag_init(&d);
  Shape xs = shape_of(2, 2, 5), ss = shape_of(1, 5);
  Tensor *in[3] = {tensor_new(DT_MODP, &xs), tensor_new(DT_MODP, &ss), tensor_new(DT_MODP, &ss)};
  for (int i = 0; i < 3; i++) tensor_fill_random(in[i], 50 + (uint64_t)i);
  uint32_t *x = in[0]->data;
  for (int j = 0; j < 5; j++) x[5 + j] = modp_add(x[j], 7);
  Tensor *y = NULL, *y2 = NULL, *y3 = NULL;
  Params p = layer_norm_params(1, 1e-5), q = layer_norm_params(1, 1e-3);
  CHECK_EQ_INT(run_op(OP_LAYER_NORM, &p, in, 3, true, &y, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_LAYER_NORM, &p, in, 3, true, &y2, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_LAYER_NORM, &q, in, 3, true, &y3, &d), TEQ_OK);
  if (y && y2 && y3) {
    check_one_k_per_row(in[0], in[1], in[2], y, 2, 5);
    int shifted = 0, same = 0, differ = 0;
    for (int j = 0; j < 5; j++) shifted += elem_modp(y, j) == elem_modp(y, 5 + j);
    for (int i = 0; i < 10; i++)
      same += elem_modp(y, i) == elem_modp(y2, i), differ += elem_modp(y, i) != elem_modp(y3, i);
    CHECK_EQ_INT(shifted, 5);
    CHECK_EQ_INT(same, 10);
    CHECK(differ >= 9);
  }
  for (int i = 0; i < 3; i++) tensor_unref(in[i]);
  tensor_unref(y), tensor_unref(y2), tensor_unref(y3);
  diag_fini(&d);
}

/* ---- instance_norm ---- */

/* ONNX's example: x [1, 2, 1, 3], scale [1, 1.5], bias [0, 1]. */
static void test_instance_norm(void) {
  Diag d;
  diag_init(&d);
  Tensor *in[3] = {f32_tensor(shape_of(4, 1, 2, 1, 3), (float[]){-1, 0, 1, 2, 3, 4}),
                   f32_tensor(shape_of(1, 2), (float[]){1, 1.5f}),
                   f32_tensor(shape_of(1, 2), (float[]){0, 1})};
  Tensor *y = NULL;
  CHECK_EQ_INT(run_op(OP_INSTANCE_NORM, NULL, in, 3, false, &y, &d), TEQ_OK);
  double inv = 1 / sqrt(2.0 / 3 + 1e-5f);
  double want[] = {-inv, 0, inv, 1 - 1.5 * inv, 1, 1 + 1.5 * inv};
  for (int i = 0; y && i < 6; i++) CHECK(close_to(elem_f32(y, i), want[i], 1e-6));
  tensor_unref(y);
  for (int i = 0; i < 3; i++) tensor_unref(in[i]);
  /* Random [2, 3, 4, 5] against the per-plane reference. */
  Shape xs = shape_of(4, 2, 3, 4, 5);
  Tensor *r[3] = {random_f32(xs, 4), random_f32(shape_of(1, 3), 5), random_f32(shape_of(1, 3), 6)};
  Params p;
  params_default(OP_INSTANCE_NORM, &p);
  param_set_float(&p, 0, 0.01);
  CHECK_EQ_INT(run_op(OP_INSTANCE_NORM, &p, r, 3, false, &y, &d), TEQ_OK);
  int64_t bad = 0;
  for (int64_t plane = 0; y && plane < 6; plane++) {
    double mean = 0, var = 0;
    for (int j = 0; j < 20; j++) mean += elem_f32(r[0], plane * 20 + j) / 20.0;
    for (int j = 0; j < 20; j++) var += pow(elem_f32(r[0], plane * 20 + j) - mean, 2) / 20.0;
    for (int j = 0; j < 20; j++) {
      double want1 =
          elem_f32(r[1], plane % 3) * (elem_f32(r[0], plane * 20 + j) - mean) / sqrt(var + 0.01) +
          elem_f32(r[2], plane % 3);
      bad += !close_to(elem_f32(y, plane * 20 + j), want1, 1e-5);
    }
  }
  CHECK_MSG(bad == 0, "instance_norm: %lld wrong", (long long)bad);
  tensor_unref(y);
  /* Z_p: the rows of layer_norm's kernel, with scale and bias per channel:
   * for each plane, the row check with that channel's value spread. */
  Tensor *m[3];
  for (int i = 0; i < 3; i++) {
    m[i] = tensor_new(DT_MODP, &r[i]->shape);
    tensor_fill_random(m[i], 60 + (uint64_t)i);
  }
  y = NULL;
  CHECK_EQ_INT(run_op(OP_INSTANCE_NORM, &p, m, 3, true, &y, &d), TEQ_OK);
  Shape plane = shape_of(1, 20);
  for (int64_t k = 0; y && k < 6; k++) {
    Tensor *xp = tensor_new(DT_MODP, &plane), *yp = tensor_new(DT_MODP, &plane),
           *sp = tensor_new(DT_MODP, &plane), *bp = tensor_new(DT_MODP, &plane);
    for (int j = 0; j < 20; j++) {
      ((uint32_t *)xp->data)[j] = elem_modp(m[0], k * 20 + j);
      ((uint32_t *)yp->data)[j] = elem_modp(y, k * 20 + j);
      ((uint32_t *)sp->data)[j] = elem_modp(m[1], k % 3);
      ((uint32_t *)bp->data)[j] = elem_modp(m[2], k % 3);
    }
    check_one_k_per_row(xp, sp, bp, yp, 1, 20);
    tensor_unref(xp), tensor_unref(yp), tensor_unref(sp), tensor_unref(bp);
  }
  tensor_unref(y);
  for (int i = 0; i < 3; i++) tensor_unref(r[i]), tensor_unref(m[i]);
  diag_fini(&d);
}

/* ---- lrn ---- */

static Params lrn_params(int64_t size, double alpha, double beta, double bias) {
  Params p;
  params_default(OP_LRN, &p);
  param_set_int(&p, param_index(OP_LRN, "size"), size);
  param_set_float(&p, param_index(OP_LRN, "alpha"), alpha);
  param_set_float(&p, param_index(OP_LRN, "beta"), beta);
  param_set_float(&p, param_index(OP_LRN, "bias"), bias);
  return p;
}

/* ONNX's definition: channels max(0, c - floor((size-1)/2)) ..
 * min(C-1, c + ceil((size-1)/2)). */
static void check_lrn(int64_t size, double alpha, double beta, double bias) {
  Diag d;
  diag_init(&d);
  Shape xs = shape_of(4, 2, 5, 3, 4);
  Tensor *x = random_f32(xs, 7), *y = NULL;
  for (int64_t i = 0; i < tensor_numel(x); i++) ((float *)x->data)[i] *= 10;
  Params p = lrn_params(size, alpha, beta, bias);
  CHECK_EQ_INT(run_op(OP_LRN, &p, &x, 1, false, &y, &d), TEQ_OK);
  int64_t bad = 0;
  for (int64_t i = 0; y && i < tensor_numel(x); i++) {
    int64_t c = i / 12 % 5, pos = i % 12, n = i / 60;
    int64_t lo = c - (int64_t)floor((size - 1) / 2.0), hi = c + (int64_t)ceil((size - 1) / 2.0);
    double sq = 0;
    for (int64_t k = lo < 0 ? 0 : lo; k <= (hi > 4 ? 4 : hi); k++)
      sq += pow(elem_f32(x, (n * 5 + k) * 12 + pos), 2);
    bad += !close_to(elem_f32(y, i), elem_f32(x, i) / pow(bias + alpha / (double)size * sq, beta),
                     1e-5);
  }
  CHECK_MSG(bad == 0, "lrn size %lld: %lld wrong", (long long)size, (long long)bad);
  tensor_unref(x);
  tensor_unref(y);
  diag_fini(&d);
}

static void test_lrn(void) {
  check_lrn(3, 1e-4f, 0.75, 1);
  check_lrn(3, 0.02, 0.5, 2); /* strong enough to matter */
  check_lrn(4, 0.05, 0.75, 1); /* even: one more channel above than below */
  check_lrn(1, 0.1, 1, 0.5);
  check_lrn(9, 0.1, 0.6, 1);   /* wider than the channels */
  /* Z_p: x s(window sum of squares + t), t from the parameters. With
   * every channel equal to v and size 3, channels 0 and 3 of 4 see 2 v^2,
   * channels 1 and 2 see 3 v^2. */
  Diag d;
  diag_init(&d);
  Shape xs = shape_of(3, 1, 4, 2);
  Tensor *x = tensor_new(DT_MODP, &xs), *y = NULL, *y2 = NULL;
  for (int c = 0; c < 4; c++) memcpy((uint32_t *)x->data + 2 * c, (uint32_t[]){5, 9}, 8);
  Params p = lrn_params(3, 1e-4f, 0.75, 1), q = lrn_params(3, 2e-4, 0.75, 1);
  CHECK_EQ_INT(run_op(OP_LRN, &p, &x, 1, true, &y, &d), TEQ_OK);
  CHECK_EQ_INT(run_op(OP_LRN, &q, &x, 1, true, &y2, &d), TEQ_OK);
  for (int j = 0; y && y2 && j < 2; j++) {
    CHECK_EQ_INT(elem_modp(y, j), elem_modp(y, 6 + j));
    CHECK_EQ_INT(elem_modp(y, 2 + j), elem_modp(y, 4 + j));
    CHECK(elem_modp(y, j) != elem_modp(y, 2 + j));
    CHECK(elem_modp(y, j) != elem_modp(y2, j)); /* alpha changes the map */
  }
  tensor_unref(x), tensor_unref(y), tensor_unref(y2);
  diag_fini(&d);
}

/* ---- shape errors ---- */

static void test_errors(void) {
  Params p = layer_norm_params(3, 1e-5);
  Shape ln[3] = {shape_of(3, 2, 3, 4), shape_of(1, 4), shape_of(1, 4)};
  check_infer_error(OP_LAYER_NORM, &p, ln, 2, 1,
                    "layer_norm: axis=3: input 0 has shape [2, 3, 4] (rank 3)");
  p = layer_norm_params(2, 1e-5);
  ln[1] = shape_of(2, 3, 4);
  check_infer_error(OP_LAYER_NORM, &p, ln, 2, 1,
                    "axis=2: input 1 (scale) has shape [3, 4], which varies "
                    "along an axis before the normalized ones [2, 3, 4]");
  ln[1] = shape_of(1, 4);
  ln[2] = shape_of(1, 5);
  check_infer_error(OP_LAYER_NORM, &p, ln, 3, 1,
                    "input 2 (bias) has shape [5], which does not broadcast");
  ln[2] = shape_of(4, 1, 1, 1, 4);
  check_infer_error(OP_LAYER_NORM, &p, ln, 3, 1, "does not broadcast to input 0");
  Shape in3[3] = {shape_of(4, 1, 3, 2, 2), shape_of(1, 3), shape_of(1, 2)};
  check_infer_error(OP_INSTANCE_NORM, NULL, in3, 3, 1,
                    "instance_norm: input 2 (bias) has shape [2], "
                    "expected [3] for input 0 [1, 3, 2, 2]");
  in3[0] = shape_of(2, 1, 3);
  check_infer_error(OP_INSTANCE_NORM, NULL, in3, 3, 1, "rank 3 or more");
  check_infer_error(OP_LRN, NULL, in3, 1, 1, "lrn: input 0 has shape [1, 3]: rank 3 or more");
  Params q = lrn_params(0, 1e-4, 0.75, 1);
  check_infer_error(OP_LRN, &q, in3, 1, 1, "lrn: size=0");
  /* A Z_p scale with a float32 input is refused. */
  Diag d;
  diag_init(&d);
  Shape s = shape_of(2, 2, 4);
  Shape s4 = shape_of(1, 4);
  Tensor *x = random_f32(s, 1), *m = tensor_new(DT_MODP, &s4), *y = NULL;
  p = layer_norm_params(1, 1e-5);
  CHECK_EQ_INT(run_op(OP_LAYER_NORM, &p, (Tensor *[]){x, m}, 2, false, &y, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "layer_norm: input 1 is "), "%s", diag_last(&d));
  tensor_unref(x), tensor_unref(m);
  diag_fini(&d);
}

/* ---- ONNX ---- */

static void test_onnx_round_trip(void) {
  Diag d;
  diag_init(&d);
  Tensor *in[3] = {random_f32(shape_of(4, 2, 3, 4, 5), 1), random_f32(shape_of(1, 3), 2),
                   random_f32(shape_of(1, 3), 3)};
  Params p;
  params_default(OP_INSTANCE_NORM, &p);
  param_set_float(&p, 0, 0.25);
  CHECK_EQ_INT(check_node_round_trip(OP_INSTANCE_NORM, &p, in, 3, true, &d), TEQ_OK);
  p = lrn_params(3, 0.015625, 0.5, 2); /* float32 values: ONNX attributes are float32 */
  CHECK_EQ_INT(check_node_round_trip(OP_LRN, &p, in, 1, true, &d), TEQ_OK);
  /* Below opset 17, before LayerNormalization, a layer norm is written out
   * as PyTorch writes it, and import fuses that back: with a constant
   * scale (the only kind the fusion takes), the same node again. */
  Graph *g = graph_new(), *h = NULL;
  int x = graph_add_input(g, "x", &in[0]->shape, DT_F32, &d);
  int s = graph_add_const(g, "scale", random_f32(shape_of(1, 5), 4), &d);
  p = layer_norm_params(3, 0.0078125); /* exact in a float32 attribute */
  int ln = graph_add_node(g, OP_LAYER_NORM, (TensorRef[]){{x, 0}, {s, 0}}, 2, 1, &p, "ln", &d);
  graph_add_output(g, (TensorRef){ln, 0}, "y", &d);
  CHECK_EQ_INT(check_graph_round_trip(g, NULL, in, "layer_norm written out", &h, &d), TEQ_OK);
  int found = 0;
  for (int i = 0; h && i < h->n_nodes; i++)
    found += h->nodes[i].kind == OP_LAYER_NORM && !memcmp(&h->nodes[i].params, &p, sizeof p);
  CHECK_MSG(found == 1 && h->n_nodes == 3, "layer_norm written out: %d fused back, %d nodes",
            found, h ? h->n_nodes : 0);
  graph_free(g);
  graph_free(h);
  for (int i = 0; i < 3; i++) tensor_unref(in[i]);
  diag_fini(&d);
}

/* A few protobuf fields, enough to write a one-node ONNX model here. */
typedef struct Pb {
  uint8_t b[2048];
  size_t n;
} Pb;

static void pb_varint(Pb *w, uint64_t v) {
  for (; v >= 0x80; v >>= 7) w->b[w->n++] = (uint8_t)(v | 0x80);
  w->b[w->n++] = (uint8_t)v;
}

static void pb_int(Pb *w, int field, int64_t v) {
  pb_varint(w, (uint64_t)field << 3);
  pb_varint(w, (uint64_t)v);
}

static void pb_bytes(Pb *w, int field, const void *p, size_t n) {
  pb_varint(w, (uint64_t)field << 3 | 2);
  pb_varint(w, n);
  memcpy(w->b + w->n, p, n);
  w->n += n;
}

static void pb_str(Pb *w, int field, const char *s) { pb_bytes(w, field, s, strlen(s)); }
static void pb_msg(Pb *w, int field, const Pb *m) { pb_bytes(w, field, m->b, m->n); }

/* ValueInfoProto: a float tensor of shape s. */
static void pb_value_info(Pb *w, int field, const char *name, const Shape *s) {
  Pb shape = {.n = 0}, tensor = {.n = 0}, type = {.n = 0}, vi = {.n = 0};
  for (int i = 0; i < s->ndim; i++) {
    Pb dim = {.n = 0};
    pb_int(&dim, 1, s->d[i]);
    pb_msg(&shape, 1, &dim);
  }
  pb_int(&tensor, 1, 1); /* FLOAT */
  pb_msg(&tensor, 2, &shape);
  pb_msg(&type, 1, &tensor);
  pb_str(&vi, 1, name);
  pb_msg(&vi, 2, &type);
  pb_msg(w, field, &vi);
}

/* TensorProto: float initializer of shape s holding v. */
static void pb_initializer(Pb *w, const char *name, const Shape *s, const float *v) {
  Pb t = {.n = 0};
  for (int i = 0; i < s->ndim; i++) pb_int(&t, 1, s->d[i]);
  pb_int(&t, 2, 1);
  pb_bytes(&t, 4, v, (size_t)shape_numel(s) * sizeof *v); /* packed float_data */
  pb_str(&t, 8, name);
  pb_msg(w, 5, &t);
}

static void pb_attr_int(Pb *node, const char *name, int64_t v) {
  Pb a = {.n = 0};
  pb_str(&a, 1, name);
  pb_int(&a, 3, v);
  pb_int(&a, 20, 2); /* INT */
  pb_msg(node, 5, &a);
}

/* An opset-17 model: LayerNormalization of input X [2, 3, 4] with Scale
 * and (if with_bias) B of shape [4] as initializers; attributes axis and
 * stash_type where not INT64_MIN; n_out outputs. */
static size_t layer_norm_model(Pb *m, int64_t axis, int64_t stash, bool with_bias, int n_out,
                               const float *scale, const float *bias) {
  Pb node = {.n = 0}, graph = {.n = 0}, opset = {.n = 0};
  Shape xs = shape_of(3, 2, 3, 4), ss = shape_of(1, 4);
  const char *outs[] = {"Y", "Mean", "InvStdDev"};
  pb_str(&node, 1, "X");
  pb_str(&node, 1, "Scale");
  if (with_bias) pb_str(&node, 1, "B");
  for (int i = 0; i < n_out; i++) pb_str(&node, 2, outs[i]);
  pb_str(&node, 3, "ln");
  pb_str(&node, 4, "LayerNormalization");
  if (axis != INT64_MIN) pb_attr_int(&node, "axis", axis);
  if (stash != INT64_MIN) pb_attr_int(&node, "stash_type", stash);
  pb_msg(&graph, 1, &node);
  pb_str(&graph, 2, "g");
  pb_initializer(&graph, "Scale", &ss, scale);
  if (with_bias) pb_initializer(&graph, "B", &ss, bias);
  pb_value_info(&graph, 11, "X", &xs);
  pb_value_info(&graph, 12, "Y", &xs);
  m->n = 0;
  pb_int(m, 1, 8); /* ir_version */
  pb_msg(m, 7, &graph);
  pb_int(&opset, 2, 17);
  pb_msg(m, 8, &opset);
  return m->n;
}

static void test_layer_norm_import(void) {
  Diag d;
  diag_init(&d);
  static Pb m;
  float scale[] = {1, 1.5f, -2, 0.5f}, bias[] = {0.1f, 0, -0.3f, 2};
  Tensor *x = random_f32(shape_of(3, 2, 3, 4), 9), *sc = f32_tensor(shape_of(1, 4), scale),
         *bi = f32_tensor(shape_of(1, 4), bias);
  double ref[24];
  OnnxImportOptions opts = ONNX_IMPORT_DEFAULTS;
  /* ONNX's default axis -1 and the explicit -1 and 2 are the last axis. */
  int64_t axes[] = {INT64_MIN, -1, 2};
  for (int k = 0; k < 3; k++)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      Graph *g = NULL;
      Tensor *y = NULL;
      size_t len = layer_norm_model(&m, axes[k], k == 2 ? 1 : INT64_MIN, with_bias, 1, scale, bias);
      int rc = onnx_import_buffer(m.b, len, "ln.onnx", &opts, &g, NULL, &d);
      CHECK_MSG(rc == TEQ_OK, "%s", d.text ? d.text : "");
      if (rc == TEQ_OK) rc = exec_run(g, EXEC_F32, &x, &y, &d);
      CHECK_MSG(rc == TEQ_OK, "%s", d.text ? d.text : "");
      int found = 0;
      for (int i = 0; g && i < g->n_nodes; i++)
        found += g->nodes[i].kind == OP_LAYER_NORM && param_int(&g->nodes[i].params, 0) == 2;
      CHECK_EQ_INT(found, 1);
      reference_layer_norm(x, sc, with_bias ? bi : NULL, 2, 1e-5f, ref);
      for (int i = 0; y && i < 24; i++) CHECK(close_to(elem_f32(y, i), ref[i], 1e-5));
      tensor_unref(y);
      graph_free(g);
    }
  /* Refused: the training outputs, and a half-precision stash type. */
  Graph *g = NULL;
  size_t len = layer_norm_model(&m, -1, INT64_MIN, true, 3, scale, bias);
  CHECK_EQ_INT(onnx_import_buffer(m.b, len, "ln3.onnx", &opts, &g, NULL, &d), TEQ_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(diag_last(&d), "ln3.onnx: node 'ln' (LayerNormalization): the Mean and "
                   "InvStdDev outputs are not supported"), "%s", diag_last(&d));
  len = layer_norm_model(&m, -1, 10, true, 1, scale, bias);
  CHECK_EQ_INT(onnx_import_buffer(m.b, len, "ln.onnx", &opts, &g, NULL, &d), TEQ_ERR_UNSUPPORTED);
  CHECK_MSG(strstr(diag_last(&d), "stash_type=10"), "%s", diag_last(&d));
  len = layer_norm_model(&m, 3, INT64_MIN, true, 1, scale, bias);
  CHECK_EQ_INT(onnx_import_buffer(m.b, len, "ln.onnx", &opts, &g, NULL, &d), TEQ_ERR_INPUT);
  CHECK_MSG(strstr(diag_last(&d), "attribute axis=3: must be in [-3, 3)"), "%s", diag_last(&d));
  len = layer_norm_model(&m, 1, INT64_MIN, true, 1, scale, bias); /* fine: [4] broadcasts */
  CHECK_EQ_INT(onnx_import_buffer(m.b, len, "ln.onnx", &opts, &g, NULL, &d), TEQ_OK);
  graph_free(g);
  tensor_unref(x), tensor_unref(sc), tensor_unref(bi);
  diag_fini(&d);
}

static void test_flags(void) {
  OpKind kinds[] = {OP_LAYER_NORM, OP_INSTANCE_NORM, OP_LRN};
  const char *onnx[] = {"LayerNormalization", "InstanceNormalization", "LRN"};
  for (int i = 0; i < 3; i++) {
    CHECK(op_def(kinds[i])->flags & OPF_NONLINEAR);
    CHECK(op_def(kinds[i])->modp_standin != NULL);
    CHECK_EQ_INT(op_by_onnx(onnx[i]), kinds[i]);
  }
  CHECK_EQ_INT(op_def(OP_LAYER_NORM)->n_in_min, 2);
  CHECK_EQ_INT(op_def(OP_LAYER_NORM)->n_in_max, 3);
  Params p;
  params_default(OP_LRN, &p);
  CHECK(param_float(&p, param_index(OP_LRN, "alpha")) == 1e-4f);
  CHECK(param_float(&p, param_index(OP_LRN, "beta")) == 0.75);
}

int main(void) {
  test_layer_norm();
  test_layer_norm_modp();
  test_instance_norm();
  test_lrn();
  test_errors();
  test_onnx_round_trip();
  test_layer_norm_import();
  test_flags();
  return check_exit();
}
