/* source.c: the bookkeeping kinds. Graph inputs and constants have no
 * kernel (the executor feeds them), opaque nodes carry an ONNX operator
 * Teq has no semantics for, and identity is the no-op that import removes
 * (ONNX Identity and Dropout, which is the identity at inference). */
#include <math.h>
#include <string.h>

#include "runtime/ops/family.h"

/* Input and constant shapes are set when the node is made; inference keeps
 * them. */
static int infer_keep(const Node *n, const Shape *in, Shape *out, Diag *d) {
  (void)n; (void)in; (void)out; (void)d;
  return TEQ_OK;
}

const OpDef op_def_input = {
  .kind = OP_INPUT, .name = "input",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_SOURCE,
  .infer_shape = infer_keep,
};

const OpDef op_def_const = {
  .kind = OP_CONST, .name = "const",
  .n_in_min = 0, .n_in_max = 0, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_SOURCE,
  .infer_shape = infer_keep,
};

const OpDef op_def_opaque = {
  .kind = OP_OPAQUE, .name = "opaque",
  .n_in_min = 0, .n_in_max = -1, .n_out_min = 1, .n_out_max = 1 << 16,
  .flags = OPF_OPAQUE,
};

static int identity_eval(const Node *n, Tensor *const *in, Tensor *const *out, Diag *d) {
  (void)n; (void)d;
  memcpy(out[0]->data, in[0]->data, tensor_bytes(in[0]));
  return TEQ_OK;
}

static const char *const identity_aliases[] = {"Dropout", NULL};

/* A scalar constant input's value, or NAN if the input is not one. */
static double const_scalar(const OnnxNodeIn *v, int i) {
  const Tensor *t = onnx_in_const_input(v, i);
  if (!t || tensor_numel(t) != 1) return NAN;
  return t->dtype == DT_F32 ? ((const float *)t->data)[0] : (double)((const int64_t *)t->data)[0];
}

/* Dropout is the identity at inference, and in training mode at ratio 0
 * (exporters write that for F.dropout(p=0.0, training=True)); its mask,
 * all true then, may not be read. */
static int identity_onnx_read(OnnxNodeIn *v, Params *p, Diag *d) {
  (void)p;
  if (onnx_in_has_input(v, 2)) {
    double training = const_scalar(v, 2);
    double ratio = onnx_in_has_input(v, 1) ? const_scalar(v, 1) : 0.5;
    if (isnan(training))
      return onnx_in_unsupported(v, d, "Dropout's training_mode is not a constant scalar");
    if (training != 0 && ratio != 0)
      return onnx_in_unsupported(v, d, "Dropout in training mode with a ratio other than 0 is "
                                       "random, not an inference operator");
  }
  if (!onnx_in_drop_unread_outputs(v, 1))
    return onnx_in_unsupported(v, d, "Dropout's mask output is read, which is not supported");
  for (int i = 1; i < onnx_in_n_inputs(v); i++) onnx_in_consume_input(v, i);
  return TEQ_OK;
}

const OpDef op_def_identity = {
  .kind = OP_IDENTITY, .name = "identity", .axiom_name = "id",
  .onnx_op = "Identity", .onnx_aliases = identity_aliases,
  .n_in_min = 1, .n_in_max = 1, .n_out_min = 1, .n_out_max = 1,
  .flags = OPF_NOOP | OPF_ELEMENTWISE | OPF_LAYOUT_ONLY | OPF_MULTILINEAR,
  .infer_shape = infer_like_input0,
  .eval_f32 = identity_eval, .eval_modp = identity_eval, .eval_cuda = CUDA_EVAL(identity),
  .onnx_read = identity_onnx_read,
};
